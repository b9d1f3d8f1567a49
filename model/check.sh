#!/usr/bin/env bash
# Check the model: the decision table, every configuration (each must pass), every
# mutant (each must fail), every known gap, if any (each must still show). Needs only
# spin and a C compiler.
#
#   model/check.sh         the CI set (`make model-check`)
#   model/check.sh deep    the deeper set (`make model-check-deep`)
#
# For each configuration and mutant it prints the verifier's own verdict line
# ("State-vector ..., depth reached N, errors: E") with the states stored and the time.
set -euo pipefail
cd "$(dirname "$0")"
set_name=${1:-ci}

for tool in spin "${CC:-gcc}"; do
    command -v "$tool" >/dev/null || { echo "model-check: $tool is missing (scripts/test-deps.sh installs it)" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/pylease-model.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=0

# The decision table is the model's: decisions.tsv must be what decisions.pml prints.
cp ./*.pml "$work/"
(cd "$work" && spin -T decisions.pml | grep -v 'process.* created') > "$work/decisions.out"
if diff -u decisions.tsv "$work/decisions.out" > "$work/decisions.diff"; then
    echo "decisions: decisions.tsv is the model's table ($(($(wc -l < decisions.tsv) - 1)) rows)"
else
    echo "decisions: FAIL: decisions.tsv differs from the model's table:"
    cat "$work/decisions.diff"
    failed=1
fi

# verify KIND NAME LTL DEFINES...: KIND pass (errors: 0, search complete), fail (a mutant:
# errors >= 1), gap (the code as it is, which the model shows unsafe, errors >= 1,
# documented in docs/model.md; it becomes a pass configuration once the code is fixed,
# as the reused explicit holder of permits and names did with migration 0014), or reach
# (a state the configurations must be able to reach, so that a property had something
# to judge: LTL says it never happens, and the search must find a run to it).
run_one() {
    local kind=$1 name=$2 ltl=$3
    shift 3
    # -O1, not -O2: pan.c compiles in half the time, and its searches run as fast.
    local dir="$work/$name" flags="-DSAFETY $STORE" note="" optimize=-O1
    [ "$STORE" = "-DHC4" ] && note=" [hash-compacted]"
    mkdir "$dir"
    cp ./*.pml "$dir/"
    # A mutant's shortest counterexample: breadth first. Its search is small: compiled
    # unoptimised, which takes a third of the time and costs the search less than that.
    [ "$kind" != pass ] && flags="-DSAFETY -DBFS" && optimize=-O0
    (cd "$dir" && spin -a "$@" pylease.pml > spin.out 2>&1) || { echo "$name: FAIL: spin -a"; cat "$dir/spin.out"; touch "$work/failed"; return; }
    (cd "$dir" && "${CC:-gcc}" $optimize -w $flags -DMEMLIM=$MEMLIM -o pan pan.c) || { echo "$name: FAIL: gcc"; touch "$work/failed"; return; }
    local start end out verdict stored
    start=$(date +%s.%N)
    out=$(cd "$dir" && ./pan -m100000 -N "$ltl" 2>&1) || true
    end=$(date +%s.%N)
    verdict=$(grep -m1 'errors:' <<< "$out" || echo "no verdict")
    stored=$(grep -m1 'states, stored' <<< "$out" | awk '{print $1}')
    local took
    took=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    if [ "$kind" = pass ]; then
        if grep -q 'errors: 0' <<< "$verdict" && ! grep -q 'Search not completed\|max search depth too small\|out of memory' <<< "$out"; then
            echo "config $name [$ltl] $*:$note $verdict; $stored states; ${took}s"
        else
            echo "config $name [$ltl] $*: FAIL: $verdict; $stored states; ${took}s"
            grep -m3 'pan:\|Search not completed\|max search depth\|memory' <<< "$out" || true
            touch "$work/failed"
        fi
    else
        local steps
        # The counterexample replayed: its length in the model's named transitions.
        steps=$(cd "$dir" && spin -t -T "$@" pylease.pml 2>/dev/null | grep -cE '^(client [0-9]+|member [0-9]+|server|helper|operator): |^tick ' || true)
        local what=mutant found=caught run="counterexample"
        [ "$kind" = gap ] && what=gap && found="unsafe as known"
        [ "$kind" = reach ] && what=reach && found=reachable && run="a run"
        if grep -q 'errors: [1-9]' <<< "$verdict"; then
            echo "$what $name [$ltl] $*: $found, $run of $steps steps; $verdict; ${took}s"
        else
            echo "$what $name [$ltl] $*: FAIL: no $run found; $verdict; ${took}s"
            touch "$work/failed"
        fi
    fi
}

# verify KIND NAME LTL DEFINES...: run_one in the background, MODEL_JOBS (default 2) at
# once: the searches are independent, and beside `make test`'s pytest two of them use
# what CPU the tests leave. Their lines are printed in the order of the verify lines.
jobs_max=${MODEL_JOBS:-2}
order=()
verify() {
    order+=("$2")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n || true
    done
    run_one "$@" > "$work/$2.result" 2>&1 &
}

start_all=$(date +%s)
# Each search stays under MEMLIM megabytes (two run at once). The CI set stores every
# state exactly and uncompressed: -DCOLLAPSE saved these state vectors too little memory
# (10-25 %) for the time it cost (up to twice the search's). The deep set's larger
# spaces are stored hash-compacted (-DHC4), which may miss a state with a small
# probability.
MEMLIM=3072
STORE=""
if [ "$set_name" = deep ]; then
    STORE="-DHC4"
    verify pass three-slow     all    -DNC=3 -DSLOW=1 -DTRIES=1
    verify pass fresh-holders  all    -DEXPLICIT=0 -DBLOCKS=2 -DTRIES=1 -DSLOW=0
    verify pass slow-helper    all    -DSLOW=1 -DHELPER=1 -DBLOCKS0=2
    verify pass steal-writes   all    -DSLOW=0 -DSTEAL=1 -DWRITES=1
    verify pass sync-writes    all    -DSLOW=0 -DFAILOVER=1 -DWRITES=1
    verify pass sync-reuse     all    -DSLOW=0 -DFAILOVER=1 -DBLOCKS0=2 -DTRIES=1
    verify pass async-writes   fences -DSLOW=0 -DFAILOVER=2 -DWRITES=1 -DTRIES=1
    verify pass both-blocks    all    -DSLOW=1 -DBLOCKS=2 -DTRIES=1
    verify pass ttl6           all    -DSLOW=1 -DTTL=6 -DHELPER=1
    verify pass permits-writes all    -DSLOW=0 -DPERMITS=2 -DWRITES=1
    verify pass permits-slow   all    -DSLOW=1 -DPERMITS=2
    verify pass permits-kept3  all    -DSLOW=0 -DPERMITS=2 -DNC=3 -DTRIES=1 -DKEEPERS=1
    verify pass names-retries  all    -DSLOW=0 -DNAMES=1
    verify pass permits-reused2 all   -DSLOW=0 -DPERMITS=2 -DBLOCKS0=2
    verify pass readers-two-kept  all -DSLOW=0 -DREADERS=2 -DNC=3 -DTRIES=1
    verify pass readers-two-writes all -DSLOW=0 -DREADERS=2 -DNC=3 -DTRIES=1 -DKEEPERS=1 -DWRITES=1
    verify pass readers-writers-kept all -DSLOW=0 -DREADERS=1 -DNC=3 -DTRIES=1
    verify pass readers-slow-writes all -DSLOW=1 -DREADERS=1 -DWRITES=1
    verify pass readers-writer-blocks all -DSLOW=1 -DREADERS=1 -DBLOCKS=2 -DBLOCKS0=1
    verify pass readers-two-slow  all -DSLOW=1 -DREADERS=2 -DNC=3 -DTRIES=1 -DKEEPERS=1
    verify pass readers-two-retries all -DSLOW=0 -DREADERS=2 -DNC=3 -DKEEPERS=1
    verify pass stepdown-kept     all    -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2
    verify pass stepdown-slow     all    -DSLOW=1 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1
    verify pass stepdown-writes   all    -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DWRITES=1 -DKEEPERS=1
    verify pass stepdown-steal    all    -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DKEEPERS=1 -DSTEAL=1
    verify pass groups-kept       all    -DSLOW=0 -DGROUPS=1
    verify pass groups-late       all    -DSLOW=0 -DGROUPS=1 -DGKEEPERS=1 -DGSLOTS=2
    verify pass groups-slow       all    -DSLOW=1 -DGROUPS=1 -DGKEEPERS=1
    verify pass groups-two-parts  all    -DSLOW=0 -DGROUPS=1 -DGKEEPERS=1 -DPARTS=2
    verify pass groups-rejoin     all    -DSLOW=0 -DGROUPS=1 -DGKEEPERS=1 -DJOINS0=2
else
    # One configuration per feature: a clean model, then each feature on its own.
    verify pass base           all    -DSLOW=0
    verify pass slow-clock     all    -DSLOW=1
    verify pass helper         all    -DSLOW=0 -DHELPER=1
    verify pass fenced-writes  all    -DSLOW=0 -DWRITES=1
    verify pass holder-reuse   all    -DSLOW=0 -DBLOCKS0=2
    verify pass min-hold       all    -DSLOW=0 -DMIN_HOLD=2
    verify pass steal          all    -DSLOW=0 -DSTEAL=1
    verify pass sync-failover  all    -DSLOW=0 -DFAILOVER=1
    # A lost grant is outside the promise (assumption 2): fences only.
    verify pass async-failover fences -DSLOW=0 -DFAILOVER=2 -DTRIES=1
    verify pass three-clients  all    -DNC=3 -DSLOW=0 -DTRIES=1
    # Permits: a semaphore of 2; three clients, two of which hold for one ttl (heartbeat
    # off), so that more believers than permits is a state the search can reach.
    verify pass permits        all    -DSLOW=0 -DPERMITS=2
    verify pass permits-three  all    -DSLOW=0 -DPERMITS=2 -DNC=3 -DTRIES=1 -DKEEPERS=0
    # Several names: two claims of both in opposite orders; a claim of both against one of B.
    verify pass names-opposite all    -DSLOW=0 -DNAMES=1 -DTRIES=1
    verify pass names-single   all    -DSLOW=0 -DNAMES=2
    # An explicit holder reused by a later block (or by another process): a new tenure
    # once the earlier one expired, whose late release names it and frees nothing of
    # the later one (issue 24; docs/model.md, "A reused explicit holder").
    verify pass permits-reused-holder all -DSLOW=0 -DPERMITS=1 -DBLOCKS0=2
    verify pass names-reused-holder   all -DSLOW=0 -DNAMES=2 -DBLOCKS0=2
    # Readers and writers (issue 25): client 0 reads, the others write; with two
    # readers, reader 1 and the writer hold for one ttl (heartbeat off).
    verify pass readers          all    -DSLOW=0 -DREADERS=1
    verify pass readers-slow     all    -DSLOW=1 -DREADERS=1
    verify pass readers-writes   all    -DSLOW=0 -DREADERS=1 -DWRITES=1
    verify pass readers-min-hold all    -DSLOW=0 -DREADERS=1 -DMIN_HOLD=2
    verify pass readers-two      all    -DSLOW=0 -DREADERS=2 -DNC=3 -DTRIES=1 -DKEEPERS=1
    verify pass readers-writers  all    -DSLOW=0 -DREADERS=1 -DNC=3 -DTRIES=1 -DKEEPERS=2
    # A reader's explicit holder reused by a later block (or another process): a new
    # share once the earlier one expired, with an id of its own that the earlier
    # block's late release and renewal do not name (migration 0018).
    verify pass readers-reused-holder all -DSLOW=0 -DREADERS=1 -DBLOCKS0=2
    # Step-down requests (issue 26, contract 5.4): an operator asks whoever holds; client
    # 0's keeper is told by a renewal, it stops its work, releases, and claims again with
    # its holder; client 1, without a keeper (one ttl), is the other candidate.
    verify pass stepdown         all    -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DKEEPERS=1
    # Groups and partitions (issue 27, contract 5.5): two member processes, one
    # partition; member 1 holds for one ttl (no keeper). With one name, both processes
    # use it (a restart while the old process is paused or cut off) and both renew.
    verify pass groups           all    -DSLOW=0 -DGROUPS=1 -DGKEEPERS=1
    verify pass groups-one-name  all    -DSLOW=0 -DGROUPS=2
fi

# Every property has a seeded bug that must be caught (issue 21 items 5, 17, 18 among them).
verify fail belief-from-arrival  belief     -DSLOW=0 -DMUT_BELIEF_FROM_ARRIVAL
verify fail renew-earlier        belief     -DSLOW=0 -DHELPER=1 -DMUT_RENEW_EARLIER
verify fail reclaim-earlier      belief     -DSLOW=0 -DHELPER=1 -DMUT_RECLAIM_EARLIER
verify fail no-drift-margin      belief     -DSLOW=1 -DMUT_NO_DRIFT_MARGIN
verify fail release-any-holder   belief     -DSLOW=0 -DBLOCKS0=2 -DMUT_RELEASE_ANY_HOLDER
verify fail release-no-fence     belief     -DSLOW=0 -DBLOCKS0=2 -DMUT_RELEASE_NO_FENCE
# A late renewal's answer: either rule alone keeps the promise (the answer revives no
# belief; the renewal names its tenure), so only both removed are caught.
verify fail late-answer-revives  belief     -DSLOW=0 -DMUT_LATE_ANSWER_REVIVES -DMUT_RENEW_NO_FENCE
verify fail holds-without-lock   fenced     -DSLOW=0 -DWRITES=1 -DMUT_HOLDS_NOLOCK
verify fail no-timeline-floor    fence_once -DSLOW=0 -DFAILOVER=2 -DMUT_NO_TIMELINE_FLOOR
# Permits and several names (issue 24).
verify fail permit-take-held       permits        -DSLOW=0 -DPERMITS=2 -DNC=3 -DTRIES=1 -DKEEPERS=0 -DMUT_PERMIT_TAKE_HELD
verify fail permit-release-resets  fence_grows    -DSLOW=0 -DPERMITS=2 -DMUT_PERMIT_RELEASE_RESETS
verify fail claim-all-no-recheck   all_or_nothing -DSLOW=0 -DNAMES=2 -DMUT_CLAIM_ALL_NO_RECHECK
verify fail claim-all-one-by-one   all_or_nothing -DSLOW=0 -DNAMES=2 -DMUT_CLAIM_ALL_ONE_BY_ONE
verify fail claim-all-caller-order no_deadlock    -DSLOW=0 -DNAMES=1 -DMUT_CLAIM_ALL_CALLER_ORDER
# The releases before 0014, matched on the holder alone: a late release of an earlier
# tenure of a reused holder frees the later one under its believer.
verify fail permit-release-holder-only belief     -DSLOW=0 -DPERMITS=1 -DBLOCKS0=2 -DMUT_RELEASE_HOLDER_ONLY
verify fail release-all-holder-only    belief     -DSLOW=0 -DNAMES=2 -DBLOCKS0=2 -DMUT_RELEASE_HOLDER_ONLY
# Readers and writers (issue 25). Two readers believe at once: a state the search reaches.
verify reach readers-overlap readers_overlap -DSLOW=0 -DREADERS=2 -DNC=3 -DTRIES=1 -DKEEPERS=1
verify fail writer-ignores-readers     rw_exclusion -DSLOW=0 -DREADERS=1 -DMUT_WRITER_IGNORES_READERS
verify fail reader-ignores-writer      rw_exclusion -DSLOW=0 -DREADERS=1 -DMUT_READER_IGNORES_WRITER
verify fail reader-no-takeover         rw_exclusion -DSLOW=0 -DREADERS=1 -DMUT_READER_NO_TAKEOVER
verify fail reader-belief-from-arrival rw_exclusion -DSLOW=0 -DREADERS=1 -DMUT_BELIEF_FROM_ARRIVAL
# As late-answer-revives: either rule alone keeps the promise (the answer revives no
# belief; the renewal names its epoch), so only both removed are caught.
verify fail reader-renew-no-epoch      belief       -DSLOW=0 -DREADERS=1 -DMUT_LATE_ANSWER_REVIVES -DMUT_READER_RENEW_NO_EPOCH
verify fail reader-holds-without-lock  epoch_fenced -DSLOW=0 -DREADERS=1 -DWRITES=1 -DMUT_HOLDS_NOLOCK
# The release before 0019, by epoch alone: a late release of a reused reader's holder
# deletes the later block's share under its believer (docs/model.md, "A reused explicit
# holder of a reader").
verify fail readers-release-by-epoch   rw_exclusion -DSLOW=0 -DREADERS=1 -DBLOCKS0=2 -DMUT_READER_RELEASE_BY_EPOCH
# Step-down requests (issue 26). A holder that stepped down believes again, in a new
# term: a state the search reaches (new_term had a second term to judge).
verify reach stepdown-leads-again      leads_again  -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DKEEPERS=1
verify fail release-before-stop        belief       -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DKEEPERS=1 -DMUT_RELEASE_BEFORE_STOP
verify fail request-cleared-on-answer  request_kept -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DKEEPERS=1 -DMUT_REQUEST_CLEARED_ON_ANSWER
verify fail reclaim-released           new_term     -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DKEEPERS=1 -DMUT_RECLAIM_RELEASED
verify fail request-outlives-tenure    new_term     -DSLOW=0 -DSTEPDOWN=1 -DBLOCKS0=2 -DTRIES=1 -DKEEPERS=1 -DMUT_REQUEST_OUTLIVES_TENURE

# Groups (issue 27). A partition handed from one process to the other and every
# partition owned by the member the assignment names: a state the search reaches.
verify reach groups-owned-again         owned_again -DSLOW=0 -DGROUPS=1 -DGKEEPERS=1
verify fail revoke-after-release        partitions  -DSLOW=0 -DGROUPS=1 -DGKEEPERS=1 -DMUT_RELEASE_BEFORE_REVOKE
verify fail partition-claim-continues   partitions  -DSLOW=0 -DGROUPS=2 -DGKEEPERS=0 -DMUT_PART_CLAIM_CONTINUES
verify fail member-belief-from-arrival  members     -DSLOW=0 -DGROUPS=1 -DGKEEPERS=1 -DMUT_MEMBER_FROM_ARRIVAL
verify fail join-live-name              members     -DSLOW=0 -DGROUPS=2 -DMUT_JOIN_LIVE_NAME

wait
for name in "${order[@]}"; do
    cat "$work/$name.result"
done
[ -e "$work/failed" ] && failed=1
echo "model-check ($set_name): done in $(( $(date +%s) - start_all ))s"
if [ "$failed" -ne 0 ]; then
    echo "model-check: FAILED" >&2
    exit 1
fi
