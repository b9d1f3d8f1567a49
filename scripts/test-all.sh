#!/usr/bin/env bash
# `make test` after `make deps venv`: pytest in the foreground, its output as it comes;
# the other checks (model-check, lint, typecheck, docs) beside it, each into a log.
# The suite mostly waits (on the server, on the processes it starts, on timers), so the
# checks cost it little wall time; they run niced, so that their CPU (the model check's
# is minutes) goes to the tests first. A check that fails says so at once, on one line;
# every check's output follows pytest's, then one line per check, and the exit status
# is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
logs=build/test-logs
rm -rf "$logs"
mkdir -p "$logs"
# The tests' server: $PYLEASE_TEST_DSN when given, else one of the suite's own
# (scripts/suite-server.sh says why), stopped however this script ends.
if [ -z "${PYLEASE_TEST_DSN:-}" ]; then
    server_dir=$(mktemp -d "${TMPDIR:-/tmp}/pylease-suite-pg.XXXXXX")
    trap 'scripts/suite-server.sh stop "$server_dir"' EXIT
    PYLEASE_TEST_DSN=$(scripts/suite-server.sh start "$server_dir") || {
        echo "make test: could not start the suite's PostgreSQL server" >&2
        exit 1
    }
    export PYLEASE_TEST_DSN
fi

checks=(model-check lint typecheck docs)
pids=()
for check in "${checks[@]}"; do
    (
        start=$(date +%s)
        rc=0
        nice -n 10 "$make" --no-print-directory "$check" > "$logs/$check.log" 2>&1 || rc=$?
        echo "$rc $(($(date +%s) - start))" > "$logs/$check.rc"
        if [ "$rc" -ne 0 ]; then
            echo "make test: $check FAILED (exit $rc); its output follows pytest's" >&2
        fi
    ) &
    pids+=($!)
done

start=$(date +%s)
pytest_rc=0
"$make" --no-print-directory pytest || pytest_rc=$?
# The checks ran niced so that pytest came first; with pytest done, nice only hands
# their CPU to whatever else runs on the machine (under `stress --cpu 2` the model
# check got a twentieth of a core). Raising a priority needs root; otherwise they
# stay niced.
tree() { local child; for child in $(pgrep -P "$1"); do echo "$child"; tree "$child"; done; }
for pid in "${pids[@]}"; do
    renice -n 0 -p $(tree "$pid") > /dev/null 2>&1 || true
done
summary=("pytest: $([ "$pytest_rc" -eq 0 ] && echo passed || echo "FAILED (exit $pytest_rc)") in $(($(date +%s) - start))s")

failed=$((pytest_rc != 0))
for i in "${!checks[@]}"; do
    check=${checks[$i]}
    wait "${pids[$i]}"
    read -r rc took < "$logs/$check.rc" || { rc=1; took=?; }
    echo "== make $check: exit $rc in ${took}s"
    cat "$logs/$check.log"
    if [ "$rc" -eq 0 ]; then
        summary+=("$check: passed in ${took}s")
    else
        summary+=("$check: FAILED (exit $rc) in ${took}s")
        failed=1
    fi
done

echo "== make test"
printf '  %s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
    echo "make test: FAILED" >&2
    exit 1
fi
