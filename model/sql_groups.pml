/*
 * pylease's SQL of groups (contract 5.5) as the server runs it: the members of one
 * group (pylease_groups' last incarnation, a row per member name of pylease_members)
 * and the partitions' leases "<grp>#<p>", ordinary fenced leases whose holder is the
 * member's name.
 *
 * A member row is live while `ml` (expires_at - now) is positive; a leave sets it to
 * 0, as an expiry does. A partition's row is a lease row (sql.pml's Row), brought into
 * sql.pml's `row` by pload(p) and put back by pstore(), so that the lease's renewal
 * (named by its fence) and release (holder and fence) decide as for a lease. The
 * partition's claim is lease_claim_new (the Python API claims for the member's name, a
 * holder the caller chose: contract 5.6), written here: busy while the row is
 * unexpired, whoever's, its holder's own tenure too.
 *
 * Included by groups.pml after sql.pml. Mutants (-D): MUT_JOIN_LIVE_NAME (group_join
 * without its test of a live name), MUT_PART_CLAIM_CONTINUES (a partition claimed with
 * lease_claim: a live tenure of the same name is continued, with its fence).
 */

/* The includer defines GNAMES (member names 1 .. GNAMES, index name - 1) and PARTS
   (partitions 0 .. PARTS - 1). */
byte ginc;                  /* pylease_groups.incarnation: the last one issued */
byte mi[GNAMES];            /* pylease_members.incarnation of each name (0: no row) */
byte ml[GNAMES];            /* its expires_at - now while positive (0: gone) */
Row tp[PARTS];              /* the partitions' lease rows */
byte pcur;                  /* the partition loaded into `row` */

#define LIVE(n) (ml[(n) - 1] > 0)

inline pload(p) {
    pcur = p;
    row.exists = tp[p].exists; row.released = tp[p].released; row.holder = tp[p].holder;
    row.fence = tp[p].fence; row.age = 0; row.left = tp[p].left; row.ttl = tp[p].ttl
}

inline pstore() {
    tp[pcur].exists = row.exists; tp[pcur].released = row.released;
    tp[pcur].holder = row.holder; tp[pcur].fence = row.fence; tp[pcur].left = row.left;
    tp[pcur].ttl = row.ttl;
    row.exists = 0; row.released = 0; row.holder = 0; row.fence = 0; row.age = 0;
    row.left = 0; row.ttl = 0; pcur = 0
}

/* group_join(grp, member, ttl): a new incarnation, above every one the group issued,
   or 0 (NULL) while the name is live: a join is not idempotent, a name is one
   incarnation at a time. (The deletion of gone rows changes nothing here: a gone row
   is one whose ml is 0.) */
inline group_join(n, out) {
    if
#ifndef MUT_JOIN_LIVE_NAME
    :: LIVE(n) -> out = 0
#endif
    :: else ->
        ginc = MAX2(ginc + 1, FLOOR);
        mi[(n) - 1] = ginc; ml[(n) - 1] = TTL;
        out = ginc
    fi
}

/* pylease_renew_held's member element (group_renew with the incarnation): a live
   member of that incarnation, extended never earlier. A member past its expiry is not
   renewed (the others counted it out): it joins again. */
inline group_renew(n, inc, ok) {
    ok = (LIVE(n) && mi[(n) - 1] == (inc));
    if
    :: ok -> ml[(n) - 1] = MAX2(ml[(n) - 1], TTL)
    :: else -> skip
    fi
}

/* group_leave(grp, member, incarnation): expires_at = now, while live with it. */
inline group_leave(n, inc) {
    if
    :: LIVE(n) && mi[(n) - 1] == (inc) -> ml[(n) - 1] = 0
    :: else -> skip
    fi
}

/* lease_claim_new(name, ttl, holder) on the loaded row: busy while unexpired (its
   holder's own tenure too: another process may use the name); else a new tenure with
   the next fence. MUT_PART_CLAIM_CONTINUES: lease_claim, which continues a live
   tenure of the same holder with its fence. */
inline lease_claim_new(h, t, out) {
    if
    :: !row.exists ->
        row.exists = 1;
        row.fence = FLOOR;
        new_tenure(h, t, KIND_CLAIM);
        out = row.fence
#ifdef MUT_PART_CLAIM_CONTINUES
    :: row.exists && row.left > 0 && !row.released && row.holder == (h) ->
        row.ttl = t; RECLAIM_EXPIRY(t); out = row.fence
    :: row.exists && row.left > 0 && (row.released || row.holder != (h)) -> out = BUSY
#else
    :: row.exists && row.left > 0 -> out = BUSY
#endif
    :: row.exists && row.left == 0 ->
        row.fence = NEXT_FENCE;
        new_tenure(h, t, KIND_CLAIM);
        out = row.fence
    fi
}

/* group_assignment(grp, PARTS): whether member name n gets partition p, a pure
   function of the live names. The model's: with both names live, partition 0 to name
   1 and partition 1 to name 2; with one, both to it. (The real one is bounded-load
   rendezvous hashing: any pure function of the live set decides the same about
   safety.) */
#define GETS(n, p) (LIVE(n) && (!LIVE(3 - (n)) || (p) == (n) - 1))
