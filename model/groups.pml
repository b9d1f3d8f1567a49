/*
 * Groups and partitions (contract 5.5, issue 27), checked with GROUPS: two member
 * processes of one group share PARTS partitions. Included by pylease.pml in place of
 * its clients, server and properties; the clocks, the margin and the keeper's
 * arithmetic are pylease.pml's, the SQL is sql.pml's lease pieces and sql_groups.pml.
 *
 * GROUPS=1: the processes are members 1 and 2. GROUPS=2: both use member name 1 (a
 * process restarted under its name while the old one is paused or cut off).
 *
 * A process joins (group_join), and while it is a member (as far as it knows) its
 * rebalancer reads the live members and the assignment, claims the partitions the
 * assignment gives its name (lease_claim_new), and revokes those it no longer should
 * own, has lost, or holds while leaving or after its membership was lost: on_revoked
 * first (its work on them stops), then the partition's block ends (its Held reads as
 * lost) and the release goes out (holder and fence). The keeper renews the membership
 * (its incarnation) and every partition held (its fence) in one statement
 * (pylease_renew_held), and declares each lost at its deadline; a membership lost
 * gives every partition up, then joins again. A process leaves (revoke everything,
 * then group_leave). Every request may be delayed, lost, or run after its sender gave
 * up on it; replies may be late or lost; any party may pause. A process awaits one
 * statement at a time (the keeper's and the rebalancer's interleave).
 *
 * Configuration (-D): PARTS (1 or 2), JOINS and JOINS0 (joins per process, process
 * 0's), CLAIMS (partition claims per membership), GKEEPERS (processes that renew),
 * GSLOTS (statements a process may have outstanding), SLOW and TTL as pylease.pml's.
 *
 * Properties: partitions, members, and owned_again (a state to reach). Mutants:
 * MUT_RELEASE_BEFORE_REVOKE, MUT_MEMBER_FROM_ARRIVAL; sql_groups.pml's
 * MUT_JOIN_LIVE_NAME and MUT_PART_CLAIM_CONTINUES.
 */

#if KINDS || READERS || STEPDOWN || HELPER || STEAL || FAILOVER || WRITES || MIN_HOLD || GROUPS > 2
#error "GROUPS is 1 or 2, on one server, without the other primitives' configurations"
#endif

#ifndef JOINS
#define JOINS 1         /* joins a process sends (its first, then after a leave or loss) */
#endif
#ifndef JOINS0
#define JOINS0 JOINS    /* process 0's */
#endif
#define JOINS_OF(c) ((c) == 0 -> JOINS0 : JOINS)
#ifndef CLAIMS
#define CLAIMS 1        /* partition claims a process sends per membership */
#endif
#define GM 2            /* member processes */
#ifndef GKEEPERS
#define GKEEPERS GM     /* processes 0 .. GKEEPERS - 1 renew (the others hold for a ttl) */
#endif
#define GNAMES 2        /* member names 1 and 2 */
#ifndef PARTS
#define PARTS 1         /* partitions: 1, or 2 (0 and 1) */
#endif
#if PARTS > 1
#define TWO(...) __VA_ARGS__    /* what partition 1 adds */
#else
#define TWO(...)
#endif
#define NAME_OF(c) ((c) * (GROUPS == 1) + 1)

/* ---- Ghosts ------------------------------------------------------------------------ */
byte top[PARTS];        /* per partition: the highest fence granted */
byte lastc[PARTS];      /* per partition: the process (+ 1) whose claim was granted last */
bool handed;            /* a partition was granted to a process other than its last */
byte claimer;           /* scratch: the process (+ 1) whose claim the server runs */

#define GRANTED(kind) \
    top[pcur] = MAX2(top[pcur], row.fence); \
    if \
    :: lastc[pcur] != 0 && lastc[pcur] != claimer -> handed = 1 \
    :: else -> skip \
    fi; \
    lastc[pcur] = claimer

#define AGE_CAP 0
#include "sql.pml"
#include "sql_groups.pml"

/* ---- Member processes ---------------------------------------------------------------- */
#define M_OUT     0     /* not a member: may join */
#define M_JOINING 1     /* its join sent */
#define M_IN      2     /* joined (its membership lost once mel runs out) */
#define M_LEAVING 3     /* the block ends: everything is revoked, then the leave */

#define P_NONE     0
#define P_CLAIMING 1
#define P_HELD     2    /* granted (lost once pe runs out) */
#define P_ENDING   3    /* MUT_RELEASE_BEFORE_REVOKE: released, on_revoked not yet run */

#define G_JOIN    1
#define G_CLAIM   2
#define G_RENEW   3
#define G_RELEASE 4
#define G_LEAVE   5
#define NOSLOT    255
#ifndef GSLOTS
#define GSLOTS    1     /* requests a process may have outstanding (sent, not yet run) */
#endif

/* A ticket's time left, in local ticks. At the keeper's deadline (KEEPER_MARGIN, which
   is the belief's margin here) it is lost for good: the keeper declares it, a renewal's
   answer read after it revives nothing, and the model keeps it as 0. A failed renewal
   sets it to 0 too. */
byte ms[GM];            /* the membership's stage */
byte minc[GM];          /* its incarnation */
byte mel[GM];           /* the membership's Ticket.expires - monotonic() */
byte joins[GM];         /* joins sent */
byte tries[GM];         /* partition claims sent by this membership */
bool skipped[GM];       /* the slow clock lost its tick */
byte aw[GM];            /* the request whose reply it waits for, or NOSLOT */
byte awop[GM];          /* ... of which kind */
byte since[GM];         /* local ticks since that request was sent (up to TTL) */
bool rdone[GM];         /* its reply has arrived */
byte rval[GM];          /* the reply: an incarnation or 0; a fence or BUSY; a renewal's
                           bits (0: the member, 1 + p: partition p) */

/* Per process c and partition p, index K(c, p). */
#define K(c, p) ((c) * PARTS + (p))
byte ps[GM * PARTS];    /* the partition's stage */
byte pf[GM * PARTS];    /* the fence it was granted */
byte pe[GM * PARTS];    /* its Ticket.expires - monotonic() */

/* Requests sent and not yet run: slot c * GSLOTS + k belongs to process c. */
byte rop[GM * GSLOTS];
byte rpt[GM * GSLOTS];   /* a claim's or release's partition */
byte rf[GM * GSLOTS];    /* a release's fence; a renewal's or leave's incarnation */
byte rq0[GM * GSLOTS];   /* a renewal's fence of partition 0 (0: not renewed) */
#if PARTS > 1
byte rq1[GM * GSLOTS];   /* ... of partition 1 */
#endif

#if GSLOTS > 1
#define FREE_SLOT(c) (rop[(c) * GSLOTS] == 0 || rop[(c) * GSLOTS + 1] == 0)
#else
#define FREE_SLOT(c) (rop[c] == 0)
#endif
#define READY(c) (aw[c] == NOSLOT && FREE_SLOT(c))

#define IN(c) (ms[c] == M_IN || ms[c] == M_LEAVING)
/* A member as far as it knows: the keeper has not lost the membership. */
#define MEMBER(c) (IN(c) && mel[c] > KEEPER_MARGIN)
/* Believes it is a live member: the membership's Held, as a lease's. */
#define MBELIEVES(c) (IN(c) && mel[c] > MARGIN)
/* Partition p's lease is held and not lost. */
#define HOLDS(c, p) (ps[K(c, p)] == P_HELD && pe[K(c, p)] > KEEPER_MARGIN)
/* Believes it owns partition p: its Held not lost and check() passing; or its work
   still running after the release (the mutant's order). */
#define OWNS(c, p) ((ps[K(c, p)] == P_HELD && pe[K(c, p)] > MARGIN) || ps[K(c, p)] == P_ENDING)
/* Partition p is still to be owned by c: a member, not leaving, and the assignment of
   the live names, as the rebalancer reads it when it decides, gives it to its name
   (what it read may be stale by the time its claim or release runs: the statement
   runs late). */
#define KEEP(c, p) (ms[c] == M_IN && MEMBER(c) && GETS(NAME_OF(c), p))
#define NOTHING_HELD(c) (ps[K(c, 0)] == P_NONE TWO(&& ps[K(c, 1)] == P_NONE))

#ifdef MUT_MEMBER_FROM_ARRIVAL
/* The membership's Ticket counted from the reply's arrival, not the request's sending. */
#define MEXPIRES_IN(c, span) (span)
#else
#define MEXPIRES_IN(c, span) EXPIRES_IN(c, span)
#endif

inline free_slot(i) {
    rop[i] = 0; rpt[i] = 0; rf[i] = 0; rq0[i] = 0; TWO(rq1[i] = 0;)
#if GSLOTS > 1
    /* a process's requests fill its first slots: two orders of the same are one state */
    if
    :: i % GSLOTS == 0 && rop[i + 1] != 0 ->
        rop[i] = rop[i + 1]; rpt[i] = rpt[i + 1]; rf[i] = rf[i + 1];
        rq0[i] = rq0[i + 1]; TWO(rq1[i] = rq1[i + 1]; rq1[i + 1] = 0;)
        rop[i + 1] = 0; rpt[i + 1] = 0; rf[i + 1] = 0; rq0[i + 1] = 0;
        if
        :: aw[i / GSLOTS] == i + 1 -> aw[i / GSLOTS] = i
        :: else -> skip
        fi
    :: else -> skip
    fi
#endif
}

inline gsend(c, op, p, f) {
    if
    :: rop[(c) * GSLOTS] == 0 -> aw[c] = (c) * GSLOTS
    :: else -> aw[c] = (c) * GSLOTS + 1
    fi;
    rop[aw[c]] = op; rpt[aw[c]] = p; rf[aw[c]] = f;
    awop[c] = op; since[c] = 0; rdone[c] = 0; rval[c] = 0
}

inline forget_reply(c) {
    aw[c] = NOSLOT; awop[c] = 0; since[c] = 0; rdone[c] = 0; rval[c] = 0
}

/* The rebalancer claims partition p (a waiter's claim is the same statement). */
#define CLAIM(c, p) \
    :: d_step { KEEP(c, p) && ps[K(c, p)] == P_NONE && tries[c] < CLAIMS && READY(c) -> \
        tries[c]++; ps[K(c, p)] = P_CLAIMING; gsend(c, G_CLAIM, p, 0); \
        printf("member %d: rebalancer sends lease_claim_new(partition %d)\n", c, p) }

/* The rebalancer revokes partition p: no longer assigned, lost, leaving, or the
   membership lost. on_revoked(parts) returns (the work on it stops), then the
   partition's block ends (its Held reads as lost) and its release goes out; its answer
   changes nothing here. */
#ifndef MUT_RELEASE_BEFORE_REVOKE
#define REVOKE(c, p) \
    :: d_step { ps[K(c, p)] == P_HELD && !(HOLDS(c, p) && KEEP(c, p)) && READY(c) -> \
        printf("member %d: on_revoked([%d]), then sends lease_release(partition %d, fence %d)\n", c, p, p, pf[K(c, p)]); \
        gsend(c, G_RELEASE, p, pf[K(c, p)]); forget_reply(c); \
        ps[K(c, p)] = P_NONE; pf[K(c, p)] = 0; pe[K(c, p)] = 0 }
#else
#define REVOKE(c, p) \
    :: d_step { ps[K(c, p)] == P_HELD && !(HOLDS(c, p) && KEEP(c, p)) && READY(c) -> \
        printf("member %d: sends lease_release(partition %d, fence %d), its work still running\n", c, p, pf[K(c, p)]); \
        gsend(c, G_RELEASE, p, pf[K(c, p)]); forget_reply(c); \
        ps[K(c, p)] = P_ENDING } \
    :: d_step { ps[K(c, p)] == P_ENDING -> \
        printf("member %d: on_revoked([%d])\n", c, p); \
        ps[K(c, p)] = P_NONE; pf[K(c, p)] = 0; pe[K(c, p)] = 0 }
#endif

/* The keeper's renewal's answer for partition p (bit 1 + p), held and not lost when it
   was sent (the rebalancer neither claims nor revokes while the keeper waits). */
#define RENEWED_PART(c, p) \
    if \
    :: HOLDS(c, p) && ((rval[c] >> (1 + (p))) & 1) -> \
        pe[K(c, p)] = MAX2(pe[K(c, p)], EXPIRES_IN(c, TTL)) \
    :: ps[K(c, p)] == P_HELD && !(HOLDS(c, p) && ((rval[c] >> (1 + (p))) & 1)) -> pe[K(c, p)] = 0 \
    :: else -> skip \
    fi

/* A partition held and not lost is renewed with its fence. */
#define RENEW_FENCE(c, p) (HOLDS(c, p) -> pf[K(c, p)] : 0)

/* The claim awaited: of partition 0, or 1. */
#if PARTS > 1
#define CLAIMED(c) (ps[K(c, 0)] == P_CLAIMING -> 0 : 1)
#else
#define CLAIMED(c) 0
#endif

/* An awaited statement abandoned: what it was for is given up. */
inline give_up(c) {
    if
    :: awop[c] == G_JOIN -> ms[c] = M_OUT
    :: awop[c] == G_CLAIM -> ps[K(c, CLAIMED(c))] = P_NONE
    :: else -> skip
    fi
}

proctype Member(byte c) {
    byte s;
end:
    do
    /* group_join: the block's, or again once the membership was lost (its partitions
       given up first) or the block left */
    :: d_step { (ms[c] == M_OUT || (IN(c) && !MEMBER(c))) && joins[c] < JOINS_OF(c) && READY(c) && NOTHING_HELD(c) ->
        joins[c]++; ms[c] = M_JOINING; minc[c] = 0; mel[c] = 0; gsend(c, G_JOIN, 0, 0);
        printf("member %d: sends group_join(name %d)\n", c, NAME_OF(c)) }
    :: d_step { awop[c] == G_JOIN && aw[c] != NOSLOT && rdone[c] ->
        if
        :: rval[c] != 0 ->
            ms[c] = M_IN; minc[c] = rval[c]; mel[c] = MEXPIRES_IN(c, TTL); tries[c] = 0;
            printf("member %d: joined, incarnation %d, believes %d ticks\n", c, minc[c], mel[c])
        :: else ->
            ms[c] = M_OUT; printf("member %d: MemberLive: the name is live\n", c)
        fi;
        forget_reply(c) }
    CLAIM(c, 0)
    TWO(CLAIM(c, 1))
    :: d_step { awop[c] == G_CLAIM && aw[c] != NOSLOT && rdone[c] ->
        s = CLAIMED(c);
        if
        :: rval[c] != BUSY ->
            ps[K(c, s)] = P_HELD; pf[K(c, s)] = rval[c]; pe[K(c, s)] = EXPIRES_IN(c, TTL);
            printf("member %d: on_assigned([%d]): fence %d, believes %d ticks\n", c, s, pf[K(c, s)], pe[K(c, s)])
        :: else ->
            ps[K(c, s)] = P_NONE; printf("member %d: partition %d busy\n", c, s)
        fi;
        s = 0; forget_reply(c) }
    /* the keeper's tick: one pylease_renew_held of the membership and its partitions */
    :: d_step { c < GKEEPERS && MEMBER(c) && mel[c] <= RENEW_AT && READY(c) ->
        gsend(c, G_RENEW, 0, minc[c]);
        rq0[aw[c]] = RENEW_FENCE(c, 0); TWO(rq1[aw[c]] = RENEW_FENCE(c, 1);)
        printf("member %d: keeper sends pylease_renew_held(member %d, partition 0's fence %d)\n", c, minc[c], RENEW_FENCE(c, 0)) }
    :: d_step { awop[c] == G_RENEW && aw[c] != NOSLOT && rdone[c] ->
        if
        :: MEMBER(c) && (rval[c] & 1) -> mel[c] = MAX2(mel[c], MEXPIRES_IN(c, TTL))
        :: else -> mel[c] = 0
        fi;
        RENEWED_PART(c, 0);
        TWO(RENEWED_PART(c, 1);)
        printf("member %d: keeper's answer %d: membership believed %d ticks, partition 0 %d\n", c, rval[c], mel[c], pe[K(c, 0)]);
        forget_reply(c) }
    REVOKE(c, 0)
    TWO(REVOKE(c, 1))
    /* the block ends: every partition revoked (above), then group_leave */
    :: d_step { ms[c] == M_IN && MEMBER(c) ->
        ms[c] = M_LEAVING; printf("member %d: the block ends: revokes everything\n", c) }
    :: d_step { ms[c] == M_LEAVING && MEMBER(c) && NOTHING_HELD(c) && READY(c) ->
        gsend(c, G_LEAVE, 0, minc[c]); forget_reply(c);
        printf("member %d: sends group_leave(incarnation %d)\n", c, minc[c]);
        ms[c] = M_OUT; minc[c] = 0; mel[c] = 0 }
    /* a statement whose answer does not come is abandoned: it may run late, or never */
    :: d_step { aw[c] != NOSLOT ->
        printf("member %d: abandons its statement; it may run late\n", c);
        give_up(c); forget_reply(c) }
    :: d_step { aw[c] != NOSLOT ->
        printf("member %d: abandons its statement; it is lost\n", c);
        give_up(c); s = aw[c]; free_slot(s); s = 0; forget_reply(c) }
    od
}

/* ---- The database ------------------------------------------------------------------- */
byte out, granted, bits;
bool ok;

#define ANSWER(i, v) \
    if \
    :: aw[(i) / GSLOTS] == (i) -> rdone[(i) / GSLOTS] = 1; rval[(i) / GSLOTS] = (v) \
    :: else -> skip \
    fi

/* A renewal's partition element: the lease's renewal with its fence, if named. */
#define RENEW_PART(i, p, q) \
    if \
    :: q != 0 -> \
        pload(p); lease_renew(NAME_OF((i) / GSLOTS), TTL, q, ok, granted); pstore(); \
        bits = bits | (ok << (1 + (p))) \
    :: else -> skip \
    fi

inline run_request(i) {
    if
    :: rop[i] == G_JOIN ->
        group_join(NAME_OF(i / GSLOTS), out);
        printf("server: group_join(name %d) = %d\n", NAME_OF(i / GSLOTS), out);
        ANSWER(i, out)
    :: rop[i] == G_CLAIM ->
        claimer = i / GSLOTS + 1;
        pload(rpt[i]); lease_claim_new(NAME_OF(i / GSLOTS), TTL, out); pstore();
        claimer = 0;
        printf("server: lease_claim_new(partition %d, holder %d) = %d\n", rpt[i], NAME_OF(i / GSLOTS), out);
        ANSWER(i, out)
    :: rop[i] == G_RENEW ->
        group_renew(NAME_OF(i / GSLOTS), rf[i], ok);
        bits = ok;
        RENEW_PART(i, 0, rq0[i]);
        TWO(RENEW_PART(i, 1, rq1[i]);)
        printf("server: pylease_renew_held(name %d, member %d, partition 0's fence %d) = %d\n", NAME_OF(i / GSLOTS), rf[i], rq0[i], bits);
        ANSWER(i, bits)
    :: rop[i] == G_RELEASE ->
        pload(rpt[i]); lease_release(NAME_OF(i / GSLOTS), 0, rf[i], ok); pstore();
        printf("server: lease_release(partition %d, holder %d, fence %d) = %d\n", rpt[i], NAME_OF(i / GSLOTS), rf[i], ok);
        ANSWER(i, ok)
    :: rop[i] == G_LEAVE ->
        group_leave(NAME_OF(i / GSLOTS), rf[i]);
        printf("server: group_leave(name %d, incarnation %d)\n", NAME_OF(i / GSLOTS), rf[i]);
        ANSWER(i, 1)
    fi;
    free_slot(i);
    out = 0; granted = 0; ok = 0; bits = 0
}

proctype Server() {
end:
    do
    :: d_step { rop[0] != 0 -> run_request(0) }
    :: d_step { rop[1] != 0 -> run_request(1) }
#if GSLOTS > 1
    :: d_step { rop[2] != 0 -> run_request(2) }
    :: d_step { rop[3] != 0 -> run_request(3) }
#endif
    od
}

/* ---- Time --------------------------------------------------------------------------- */
#define DOWN(x) \
    if \
    :: x > 0 -> x-- \
    :: else -> skip \
    fi

/* A ticket's tick: at the keeper's deadline it is lost, kept as 0. */
#define TICKET_DOWN(x) x = (x > KEEPER_MARGIN + 1 -> x - 1 : 0)

inline mtick(c) {
    if
    :: c < SLOW && !skipped[c] -> skipped[c] = 1
    :: true ->
        TICKET_DOWN(mel[c]);
        TICKET_DOWN(pe[K(c, 0)]);
        TWO(TICKET_DOWN(pe[K(c, 1)]);)
        if
        :: aw[c] != NOSLOT && since[c] < TTL -> since[c]++
        :: else -> skip
        fi
    fi
}

proctype Clock() {
end:
    do
    :: atomic {
        DOWN(ml[0]); DOWN(ml[1]);
        DOWN(tp[0].left); TWO(DOWN(tp[1].left);)
        mtick(0);
        mtick(1);
        printf("tick (members left %d %d; partition 0 left %d)\n", ml[0], ml[1], tp[0].left) }
    od
}

init {
    atomic {
        aw[0] = NOSLOT; aw[1] = NOSLOT;
        run Member(0); run Member(1);
        run Server();
        run Clock()
    }
}

/* ---- Properties --------------------------------------------------------------------- */
/* Partition p: never two processes believing they own it, and no grant of it to
   another while one believes it (a believer's fence is the last granted). */
#define PART_OK(p) (!(OWNS(0, p) && OWNS(1, p)) \
    && (!OWNS(0, p) || pf[K(0, p)] >= top[p]) && (!OWNS(1, p) || pf[K(1, p)] >= top[p]))
/* A process believes it is a member only while the server has its name live with its
   incarnation: so a name live elsewhere was refused, and no belief outlasts the
   server's expiry. */
#define MEMBER_OK(c) (!MBELIEVES(c) || (LIVE(NAME_OF(c)) && mi[NAME_OF(c) - 1] == minc[c]))
/* Partition p is owned by the process the assignment of the live names gives it to. */
#define OWNED_BY_ASSIGNED(p) \
    ((OWNS(0, p) && GETS(NAME_OF(0), p)) || (OWNS(1, p) && GETS(NAME_OF(1), p)))

ltl partitions  { [] (PART_OK(0) TWO(&& PART_OK(1))) }
ltl members     { [] (MEMBER_OK(0) && MEMBER_OK(1)) }
/* Violated when, after a partition went from one process to the other, every
   partition is owned by the process the assignment names: check.sh's `reach` line
   wants that state found (a change is followed by partitions owned again). */
ltl owned_again { [] !(handed && OWNED_BY_ASSIGNED(0) TWO(&& OWNED_BY_ASSIGNED(1))) }
ltl all         { [] (PART_OK(0) TWO(&& PART_OK(1)) && MEMBER_OK(0) && MEMBER_OK(1)) }
