/*
 * pylease's lease protocol, one name, checked exhaustively with SPIN; with PERMITS, the
 * permits of one semaphore; with NAMES, claims of two names (sql_permits.pml); with
 * READERS, readers and writers of the one name (sql_readers.pml).
 *
 * Parties: NC clients, each running BLOCKS lease blocks (claim, body, release) with a
 * keeper that renews; the database (one primary, optionally one failover to a standby);
 * optionally a helper that renews or re-claims with client 0's holder and a shorter ttl
 * (keep_fresh(ttl=...), `pylease claim --holder $PYLEASE_HOLDER`), and an operator's
 * steal. Every request may be delayed, lost, or executed late after its sender gave up
 * on it; every reply may be delayed or lost; any party may pause for any time. Each
 * transition is named after the SQL function or keeper step it stands for.
 *
 * Properties (one line each, at the end): belief, fenced, fence_once; with PERMITS,
 * permits and fence_grows; with NAMES, all_or_nothing, no_deadlock and fence_grows;
 * with READERS, rw_exclusion, epoch_fenced, and readers_overlap (a state to reach);
 * with STEPDOWN, request_kept, new_term, and leads_again (a state to reach); with
 * GROUPS, members of a group and their partitions (groups.pml, in place of the
 * clients): partitions, members, and owned_again (a state to reach).
 * Configuration and mutants are -D macros; see check.sh and docs/model.md. Mutants
 * here: MUT_BELIEF_FROM_ARRIVAL, MUT_NO_DRIFT_MARGIN (issue 21 item 18),
 * MUT_LATE_ANSWER_REVIVES with MUT_RENEW_NO_FENCE, MUT_RELEASE_NO_FENCE (item 17, with
 * sql.pml's), MUT_RELEASE_BEFORE_STOP (STEPDOWN); the SQL's are listed in sql.pml and
 * sql_permits.pml.
 */

/* ---- Configuration (override with -D) ------------------------------------------- */
#ifndef NC
#define NC 2            /* clients */
#endif
#ifndef BLOCKS
#define BLOCKS 1        /* lease blocks per client, one after the other */
#endif
#ifndef EXPLICIT
#define EXPLICIT 1      /* 1: a client reuses one explicit holder for every block;
                           0: a fresh default holder per block */
#endif
#ifndef BLOCKS0
#define BLOCKS0 BLOCKS  /* client 0's blocks (the one that may reuse its holder) */
#endif
#ifndef TTL
#define TTL 4           /* the lease's ttl, in ticks */
#endif
#ifndef SHORT_TTL
#define SHORT_TTL 1     /* the helper's shorter ttl */
#endif
#ifndef TRIES
#define TRIES 2         /* claims a block sends (the first, then retries) */
#endif
#ifndef WRITES
#define WRITES 0        /* 1: each block may do one fenced write */
#endif
#ifndef MIN_HOLD
#define MIN_HOLD 0      /* the release's min_hold (0: NULL) */
#endif
#ifndef SLOW
#define SLOW 1          /* clients 0..SLOW-1 have a slow clock */
#endif
#ifndef KEEPERS
#define KEEPERS NC      /* clients 0..KEEPERS-1 renew (the others: heartbeat=False) */
#endif
#ifndef HELPER
#define HELPER 0        /* helper calls (renew or claim with client 0's holder, SHORT_TTL) */
#endif
#ifndef STEAL
#define STEAL 0         /* operator steals (older_than => '0') */
#endif
#ifndef FAILOVER
#define FAILOVER 0      /* 0: one server; 1: synchronous standby; 2: asynchronous standby */
#endif
#ifndef PERMITS
#define PERMITS 0       /* N > 0: the clients take permits of one semaphore of N slots */
#endif
#ifndef NAMES
#define NAMES 0         /* the clients claim names A and B: 1, clients 0 and 1 claim both
                           (lease_claim_all) in opposite orders; 2, client 0 claims both,
                           client 1 B alone and client 2 (NC 3) A alone */
#endif
#ifndef READERS
#define READERS 0       /* N > 0: clients 0..N-1 are readers (lease(..., shared=True)),
                           the others writers, of the one name (sql_readers.pml) */
#endif
#ifndef STEPDOWN
#define STEPDOWN 0      /* N > 0: an operator's lease_request_release calls (contract 5.4):
                           the holder asked is told by its keeper's renewal, stops its work,
                           then releases */
#endif
#ifndef GROUPS
#define GROUPS 0        /* 1: two member processes of one group share two partitions
                           (groups.pml); 2: the same, both under one member name */
#endif
#define SLOTS 2         /* requests a client may have outstanding (sent, not yet run) */
#define KINDS (PERMITS > 0 || NAMES > 0)
#if READERS && (KINDS || HELPER || STEAL || FAILOVER || !EXPLICIT || READERS > 2 || READERS >= NC)
#error "READERS is 1 or 2 readers beside at least one writer, explicit holders, without helper, steal, failover, permits, names"
#endif
#if KINDS && (HELPER || STEAL || FAILOVER || MIN_HOLD || !EXPLICIT)
#error "PERMITS and NAMES model explicit holders without helper, steal, failover, min_hold"
#endif
#if STEPDOWN && (KINDS || READERS || FAILOVER || HELPER)
#error "STEPDOWN is a lease's, on one server, without helper"
#endif
#if PERMITS && NAMES
#error "PERMITS and NAMES are configurations of their own"
#endif
#if NAMES && WRITES
#error "NAMES models no fenced writes (lease_holds per name is the lease's)"
#endif
#if NAMES == 1 && NC != 2
#error "NAMES 1 is two clients"
#endif

/* ---- Clocks (contract section 5, "Clocks") --------------------------------------- */
/* The assumption in real units: the client's monotonic clock and the server's clock run
   at rates within RATE_PPM; a holder's belief keeps max(MARGIN_PPM of the ttl,
   MARGIN_FLOOR_MS). tests/model/test_belief.py reads these three lines. */
#define RATE_PPM        1000
#define MARGIN_PPM      2000
#define MARGIN_FLOOR_MS 50
/* Scaled to ticks: a slow clock loses at most one tick in any DRIFT_WINDOW server ticks
   (a rate bound of 1/DRIFT_WINDOW), and the margin is MARGIN_PPM / RATE_PPM times that
   bound times the ttl, in ticks: 2 x (1/8) x 4 = 1. Bound and margin are scaled by the
   same factor, and the safety condition (margin >= rate bound x span believed) is
   scale-free. The 50 ms floor only makes the margin larger: the model checks the
   smaller, proportional one. A fast clock only shortens beliefs: not modelled. */
#define DRIFT_WINDOW (2 * TTL)
#ifdef MUT_NO_DRIFT_MARGIN
#define MARGIN 0
#else
#define MARGIN (MARGIN_PPM * TTL / RATE_PPM / DRIFT_WINDOW)
#endif

/* ---- The keeper's arithmetic (clients and members alike) ------------------------- */
/* Ticket.expires = sent_at + granted, as local ticks from now: the keeper counts from
   when it SENT the request (Ticket(sent_at=...), Ticket.renewed(sent_at, granted)). */
#ifdef MUT_BELIEF_FROM_ARRIVAL
#define EXPIRES_IN(c, span) (span)
#else
#define EXPIRES_IN(c, span) ((span) > since[c] -> (span) - since[c] : 0)
#endif

/* The keeper's own margin, margin(ttl) = min(ttl / 6, 10 s), in ticks: it renews only
   before expires - margin, and declares the loss there. */
#ifndef KEEPER_MARGIN
#define KEEPER_MARGIN 1
#endif
/* It renews every ttl / 3 (sooner after a failed tick: backoff): never while more than
   two thirds of the ttl are left. */
#define RENEW_AT (TTL - TTL / 3)

#if GROUPS
/* Groups and partitions: members, their server and clock, and their properties. */
#include "groups.pml"
#else
/* ---- Ghosts for the properties ---------------------------------------------------- */
int  issued;        /* bit f: fence f was given to some tenure (across failovers) */
bool reissued;      /* some fence was given to a second tenure */
byte top_claim;     /* highest fence granted by a claim (or a steal of a free name) */
byte steal_top;     /* fence of the last steal from an unexpired holder */
bool stale_write;   /* a fenced write committed after a later grant */

#define GRANTED(kind) \
    assert(row.fence < 31); \
    if \
    :: (issued >> row.fence) & 1 -> reissued = 1 \
    :: else -> issued = issued | (1 << row.fence) \
    fi; \
    if \
    :: kind == KIND_STOLEN -> steal_top = row.fence \
    :: else -> top_claim = MAX2(top_claim, row.fence) \
    fi

#if KINDS
/* Permits and names: a fence only grows, per slot or name (`cur`: the row granted). */
#undef GRANTED
bool regress;       /* a slot or name was granted a fence not above its last one */
bool deadlock;      /* claims of several names waited for each other's row locks */
bool partial;       /* a claim of several names granted some of them, not all */
#define GRANTED(kind) \
    if \
    :: row.fence <= top[cur] -> regress = 1 \
    :: else -> top[cur] = row.fence \
    fi
#endif

#define AGE_CAP MIN_HOLD    /* only min_hold reads a tenure's age */
#if READERS
/* sql_readers.pml's share k holds: unexpired, of the name's current epoch. sql.pml's
   takeover is busy while one does, and an exclusive grant deletes every share. */
#define LIVE_SHARE(k) (shx[k] && shep[k] == row.fence && shl[k] > 0)
#ifdef MUT_WRITER_IGNORES_READERS
#define READERS_LIVE 0      /* the takeover's test of unexpired shares left out */
#elif READERS > 1
#define READERS_LIVE (LIVE_SHARE(0) || LIVE_SHARE(1))
#else
#define READERS_LIVE LIVE_SHARE(0)
#endif
#if READERS > 1
#define DROP_SHARES shx[0] = 0; shep[0] = 0; shl[0] = 0; shid[0] = 0; shx[1] = 0; shep[1] = 0; shl[1] = 0; shid[1] = 0
#else
#define DROP_SHARES shx[0] = 0; shep[0] = 0; shl[0] = 0; shid[0] = 0
#endif
bool stale_epoch;   /* a reader's fenced write committed after a writer was granted */
#endif
#include "sql.pml"
#if READERS
#include "sql_readers.pml"
#endif
/* Client c is a reader (lease(..., shared=True)): its fence is its epoch. */
#define READER(c) ((c) < READERS)
#if KINDS
#include "sql_permits.pml"
byte top[NR];       /* per slot or name: the highest fence granted */
#endif

/* ---- The standby (FAILOVER) ------------------------------------------------------- */
Row sb;             /* the standby's copy of the row */
inline replicate() {
    sb.exists = row.exists; sb.released = row.released; sb.holder = row.holder;
    sb.fence = row.fence; sb.age = row.age; sb.left = row.left;
    sb.ttl = row.ttl
}
/* A commit that waits for the standby (claim, renew, steal, a fenced write): with
   synchronous replication it is on the standby before anyone sees it or is answered
   (PostgreSQL releases the commit's visibility after the standby's ack). A release
   commits without waiting (synchronous_commit = off): it may be lost. */
#if FAILOVER == 1
#define SYNC_COMMIT replicate()
#else
#define SYNC_COMMIT skip
#endif

/* ---- Clients ---------------------------------------------------------------------- */
#define IDLE      0
#define CLAIMING  1
#define HELD      2
#define DONE      3
#define ENDING    4     /* MUT_RELEASE_BEFORE_STOP: released, its work still running */

#define OP_CLAIM   1
#define OP_RENEW   2
#define OP_RELEASE 3
#define NOSLOT     255

byte st[NC];        /* the block's stage */
byte blk[NC];       /* blocks done */
byte hid[NC];       /* the holder of this block */
byte fen[NC];       /* the fence it was granted */
byte el[NC];        /* Ticket.expires - monotonic(): local ticks to the ticket's expiry */
bool lost[NC];      /* Ticket.lost: the keeper learned it is no longer ours */
bool skipped[NC];   /* the slow clock lost its tick */
byte aw[NC];        /* the request whose reply the client waits for, or NOSLOT */
byte since[NC];     /* local ticks since that request was sent (up to TTL) */
bool rdone[NC];     /* its reply has arrived */
byte rval[NC];      /* the reply: a fence, BUSY, EXHAUSTED; or renewed/released */
byte rgr[NC];       /* the reply to a renewal: the span granted (expires_at - server_time) */
byte pre[NC];       /* ghost: this holder's unreleased tenure when the block first asked */
bool txn[NC];       /* a fenced transaction is open (lease_holds passed) */
bool txl[NC];       /* ... and holds the row's FOR KEY SHARE lock */
byte txf[NC];       /* ... with this fence */
bool wrote[NC];     /* this block did its fenced write (or does none) */
byte tries[NC];     /* claims this block sent */
#if !READERS
#define SHARE_OF(c) 0
#endif
#if PERMITS
byte sl[NC];        /* the slot it was granted */
byte rsl[NC];       /* the reply to a claim: the slot */
byte txs[NC];       /* the slot of its open fenced transaction */
#define CLEAR_EXTRA(c) rsl[c] = 0
#elif NAMES
byte fb[NC];        /* a claim of both names: the fence of B (fen: of A) */
byte rvb[NC];       /* the reply to it: the fence of B */
#define CLEAR_EXTRA(c) rvb[c] = 0
#elif READERS
byte shr[NC];       /* a reader's share's id, as its claim answered it (0019) */
byte rsh[NC];       /* the reply to a reader's claim: the share's id */
#define CLEAR_EXTRA(c) rsh[c] = 0
#define SHARE_OF(c) shr[c]
#elif STEPDOWN
bool rrq[NC];       /* the reply to a renewal: release_requested_by is set */
bool rdue[NC];      /* ghost: ... and that renewal ran on a tenure asked to step down */
#define CLEAR_EXTRA(c) rrq[c] = 0; rdue[c] = 0
#else
#define CLEAR_EXTRA(c) skip
#endif
#if STEPDOWN
bool told[NC];      /* held.release_requested: a renewal answered a step-down request */
bool stopped[NC];   /* told, the holder stopped its work (pylease run: CMD stopped) */
byte sdf[NC];       /* ghost: the fence of the last tenure it stepped down from */
bool missed;        /* a renewal accepted after the request, and the holder not told */
bool refence;       /* a holder that stepped down was granted a fence not above it */
bool spurious;      /* a holder told of a request made of another tenure */
/* Kept only where a later block may claim again: a state fewer otherwise. */
#define STEPPED_DOWN(c) \
    if \
    :: ((c) == 0 && blk[c] + 1 < BLOCKS0) || ((c) > 0 && blk[c] + 1 < BLOCKS) -> sdf[c] = fen[c] \
    :: else -> skip \
    fi
#endif

#if NAMES
/* What each client claims: bit 0 name A, bit 1 name B; a claim of both is
   lease_claim_all, in the order A, B, or (REV) B, A. */
#if NAMES == 1
#define WANT(c) 3
#define REV(c)  ((c) == 1)
#else
#define WANT(c) (3 * ((c) == 0) + 2 * ((c) == 1) + ((c) == 2))
#define REV(c)  0
#endif
#define WANTS(c, r) ((WANT(c) >> (r)) & 1)
#endif

/* Requests sent and not yet run by the server: slot c*SLOTS+k belongs to client c. */
byte rop[NC * SLOTS];
byte rh[NC * SLOTS];
byte rf[NC * SLOTS];
#if KINDS
/* A renewal's or release's second piece of its tenure (0 with a fence 0, and for a
   claim): a permit's slot, or the fence of B of a claim of both names. */
byte rx[NC * SLOTS];
#if PERMITS
#define EXTRA(c, f) ((f) == 0 -> 0 : sl[c])
#else
#define EXTRA(c, f) ((f) == 0 -> 0 : fb[c])
#endif
#define SET_EXTRA(i, v) rx[i] = (v)
#define MOVE_EXTRA(i) rx[i] = rx[(i) + 1]; rx[(i) + 1] = 0
#elif READERS
/* A reader's renewal and release name its share's id beside its epoch (0019). */
byte rx[NC * SLOTS];
#define EXTRA(c, f) (st[c] == HELD -> shr[c] : 0)
#define SET_EXTRA(i, v) rx[i] = (v)
#define MOVE_EXTRA(i) rx[i] = rx[(i) + 1]; rx[(i) + 1] = 0
#else
#define EXTRA(c, f) 0
#define SET_EXTRA(i, v) skip
#define MOVE_EXTRA(i) skip
#endif
#if NAMES
/* lease_claim_all runs in steps: its read (rph 0), then one row lock at a time (rph 1 +
   the rows it has locked), then the recheck and grant (rph 3). lk[r]: the request
   (index + 1) that holds row r's FOR UPDATE lock until its statement ends. */
byte rph[NC * SLOTS];
byte gave[NC * SLOTS];  /* ghost: the rows (bit 0 A, bit 1 B) its statement granted */
byte lk[NR];
inline unlock(i) {
    if
    :: lk[0] == (i) + 1 -> lk[0] = 0
    :: else -> skip
    fi;
    if
    :: lk[1] == (i) + 1 -> lk[1] = 0
    :: else -> skip
    fi;
    rph[i] = 0; gave[i] = 0
}
#endif

#define FREE_SLOT(c) (rop[(c) * SLOTS] == 0 || rop[(c) * SLOTS + 1] == 0)

/* Held.lost is False and Held.check() passes: not lost, block not left, and the local
   clock before the belief deadline, Ticket.expires - margin (issue 21 item 18). */
#if STEPDOWN
/* A holder that stepped down believes no longer once its work stopped (its tenure is
   still its own until the release); ENDING is a release sent while the work runs. */
#define BELIEVES(c) (((st[c] == HELD && !lost[c]) || st[c] == ENDING) && el[c] > MARGIN && !stopped[c])
#else
#define BELIEVES(c) (st[c] == HELD && !lost[c] && el[c] > MARGIN)
#endif


/* A renewal's answer read once the belief has ended (the keeper paused past the expiry)
   must not revive it: that renewal may have renewed a LATER tenure of the same holder
   (a late claim of this block, granted after another holder's tenure), so a revived
   belief would follow a grant to another. FINDING of this model: Ticket.renewed()
   extends whatever the time; the model assumes the rule, MUT_LATE_ANSWER_REVIVES is
   the code as it is (docs/model.md). */
#ifdef MUT_LATE_ANSWER_REVIVES
#define LATE_ANSWER(c) 0
#else
#define LATE_ANSWER(c) (el[c] <= MARGIN)
#endif

/* The keeper's renewal names its tenure (migration 0012): a renewal of one tenure
   never renews a later tenure of the same holder, so its answer cannot revive a belief
   either. Each of the two rules alone keeps the promise; MUT_RENEW_NO_FENCE is the
   renewal before 0012 (the holder alone), caught only together with
   MUT_LATE_ANSWER_REVIVES. */
#ifdef MUT_RENEW_NO_FENCE
#define RENEW_FENCE(c) 0
#else
#define RENEW_FENCE(c) fen[c]
#endif

#if defined(MUT_RELEASE_NO_FENCE) || KINDS
/* Permits and several names are claimed by permit_claim_new and lease_claim_all_new,
   busy while the holder's own tenure is unexpired (sql_permits.pml): nothing is left
   to refuse. */
#define REFUSED(c) 0
#else
/* Contract 5.6: a claim that finds its explicit holder's tenure granted before it asked
   (an earlier block's, whose release may still be on its way) is refused as busy. The
   model knows that tenure from the row when the block first asked (a ghost); how the
   code tells is the code's. A retried claim of this block keeps its own tenure. */
#define REFUSED(c) (EXPLICIT && pre[c] != 0 && rval[c] == pre[c])
#endif

/* A slot is freed; a client's requests always fill its first slots, so that two orders
   of the same requests are one state. */
inline free_slot(i) {
    rop[i] = 0; rh[i] = 0; rf[i] = 0; SET_EXTRA(i, 0);
#if NAMES
    unlock(i);              /* its statement ended, or its connection died */
#endif
    if
    :: i % SLOTS == 0 && rop[i + 1] != 0 ->
        rop[i] = rop[i + 1]; rh[i] = rh[i + 1]; rf[i] = rf[i + 1];
        rop[i + 1] = 0; rh[i + 1] = 0; rf[i + 1] = 0; MOVE_EXTRA(i);
#if NAMES
        rph[i] = rph[i + 1]; rph[i + 1] = 0; gave[i] = gave[i + 1]; gave[i + 1] = 0;
        if
        :: lk[0] == i + 2 -> lk[0] = i + 1
        :: else -> skip
        fi;
        if
        :: lk[1] == i + 2 -> lk[1] = i + 1
        :: else -> skip
        fi;
#endif
        if
        :: aw[i / SLOTS] == i + 1 -> aw[i / SLOTS] = i
        :: else -> skip
        fi
    :: else -> skip
    fi
}

inline send(c, op, f) {
    if
    :: rop[c * SLOTS] == 0 -> aw[c] = c * SLOTS
    :: else -> aw[c] = c * SLOTS + 1
    fi;
    rop[aw[c]] = op; rh[aw[c]] = hid[c]; rf[aw[c]] = f; SET_EXTRA(aw[c], EXTRA(c, f));
    since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0; CLEAR_EXTRA(c)
}

/* What the block leaves behind is forgotten, so that states that differ only there
   are one. */
inline next_block(c) {
    aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0;
    fen[c] = 0; el[c] = 0; lost[c] = 0; pre[c] = 0; tries[c] = 0; wrote[c] = 0;
#if PERMITS
    sl[c] = 0;
#elif NAMES
    fb[c] = 0;
#elif READERS
    shr[c] = 0;
#elif STEPDOWN
    told[c] = 0; stopped[c] = 0;
#endif
    blk[c]++;
    if
    :: (c == 0 && blk[c] < BLOCKS0) || (c > 0 && blk[c] < BLOCKS) -> st[c] = IDLE
    :: else -> st[c] = DONE
    fi
}

/* What a client's story says: the Python calls of each kind */
#if PERMITS
#define SAYS_CLAIM "client %d: permit() sends permit_claim (holder %d)\n"
#define SAYS_CLAIM_AGAIN "client %d: acquire() sends permit_claim again\n"
#define SAYS_GRANT "client %d: acquire() granted slot %d fence %d, believes %d ticks\n"
#define GRANT_ARGS(c) sl[c], fen[c]
#define SAYS_RENEW "client %d: keeper sends pylease_renew_held (permit)\n"
#define SAYS_RELEASE "client %d: block ends, sends permit_release (fence %d)\n"
#elif NAMES
#define SAYS_CLAIM "client %d: leases() sends its claim (holder %d)\n"
#define SAYS_CLAIM_AGAIN "client %d: acquire() sends its claim again\n"
#define SAYS_GRANT "client %d: acquire() granted fences %d %d, believes %d ticks\n"
#define GRANT_ARGS(c) fen[c], fb[c]
#define SAYS_RENEW "client %d: keeper sends pylease_renew_held (names)\n"
#define SAYS_RELEASE "client %d: block ends, sends its release (fence %d)\n"
#else
#define SAYS_CLAIM "client %d: lease() sends lease_claim (holder %d)\n"
#define SAYS_CLAIM_AGAIN "client %d: acquire() sends lease_claim again\n"
#define SAYS_GRANT "client %d: acquire() granted fence %d, believes %d ticks\n"
#define GRANT_ARGS(c) fen[c]
#define SAYS_RENEW "client %d: keeper sends pylease_renew_held (its fence)\n"
#define SAYS_RELEASE "client %d: block ends, sends lease_release(fence %d)\n"
#endif

proctype Client(byte c) {
    byte s;
end:
    do
    /* lease(): the block's first claim (lease_claim) */
    :: d_step { st[c] == IDLE && FREE_SLOT(c) ->
        if
        :: EXPLICIT -> hid[c] = c + 1
        :: else -> hid[c] = 1 + c + NC * blk[c]
        fi;
#if KINDS
        pre[c] = 0;
#else
        if
        :: EXPLICIT && row.exists && !row.released && row.holder == hid[c] -> pre[c] = row.fence
        :: else -> pre[c] = 0
        fi;
#endif
        st[c] = CLAIMING; wrote[c] = !WRITES; tries[c] = 1;
        send(c, OP_CLAIM, 0);
        if
        :: READER(c) -> printf("client %d: lease(shared=True) sends pylease_claim_shared (holder %d)\n", c, hid[c])
        :: else -> printf(SAYS_CLAIM, c, hid[c])
        fi }
    /* acquire(): the claim's reply; a grant starts the Ticket at the claim's send time */
    :: d_step { st[c] == CLAIMING && aw[c] != NOSLOT && rdone[c] ->
        if
        :: rval[c] != BUSY && rval[c] != EXHAUSTED && !REFUSED(c) ->
            st[c] = HELD; fen[c] = rval[c]; lost[c] = 0;
#if READERS
            if
            :: READER(c) -> fen[c] = rval[c] - 1; shr[c] = rsh[c]   /* the epoch (EPOCH_ANSWER), the share */
            :: else -> skip
            fi;
#endif
#if PERMITS
            sl[c] = rsl[c];
#elif NAMES
            fb[c] = rvb[c];
#endif
            el[c] = EXPIRES_IN(c, TTL);
            pre[c] = 0; tries[c] = 0;
#if STEPDOWN
            if
            :: sdf[c] != 0 && fen[c] <= sdf[c] -> refence = 1
            :: else -> skip
            fi;
#endif
            if
            :: READER(c) -> printf("client %d: acquire() granted epoch %d share %d, believes %d ticks\n", c, fen[c], SHARE_OF(c), el[c])
            :: else -> printf(SAYS_GRANT, c, GRANT_ARGS(c), el[c])
            fi
        :: else -> printf("client %d: acquire() busy (%d)\n", c, rval[c])
        fi;
        aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; CLEAR_EXTRA(c) }
    /* acquire(): claim again (waiting, or retrying a claim whose reply was lost) */
    :: d_step { st[c] == CLAIMING && aw[c] == NOSLOT && tries[c] < TRIES && FREE_SLOT(c) ->
        tries[c]++; send(c, OP_CLAIM, 0);
        printf(SAYS_CLAIM_AGAIN, c) }
    /* acquire(): the wait is over: LeaseBusy */
    :: d_step { st[c] == CLAIMING && aw[c] == NOSLOT ->
        next_block(c); printf("client %d: acquire() gives up: LeaseBusy\n", c) }
    /* keeper _renew(): one tick sends pylease_renew_held with the lease's own ttl and
       the fence of its tenure (permits and names: see sql_permits.pml) */
    :: d_step { c < KEEPERS && st[c] == HELD && !lost[c] && el[c] <= RENEW_AT && el[c] > KEEPER_MARGIN &&
                aw[c] == NOSLOT && FREE_SLOT(c) ->
        send(c, OP_RENEW, RENEW_FENCE(c));
        if
        :: READER(c) -> printf("client %d: keeper sends pylease_renew_held (shared, its epoch and share)\n", c)
        :: else -> printf(SAYS_RENEW, c)
        fi }
    /* keeper _renew(): the answer; Ticket.renewed(sent_at, granted) or the loss */
    :: d_step { st[c] == HELD && aw[c] != NOSLOT && rdone[c] ->
        if
        :: rval[c] && !lost[c] && !LATE_ANSWER(c) ->
            el[c] = MAX2(el[c], EXPIRES_IN(c, rgr[c]));
            printf("client %d: keeper renewed: believes %d ticks\n", c, el[c]);
#if STEPDOWN
            /* tell_release_requested(): held.release_requested, on_release_requested */
            if
            :: rrq[c] && !told[c] ->
                told[c] = 1; printf("client %d: keeper: asked to step down\n", c)
            :: else -> skip
            fi;
            if
            :: rdue[c] && !told[c] -> missed = 1
            :: else -> skip
            fi;
            if
            :: rrq[c] && reqf != fen[c] -> spurious = 1
            :: else -> skip
            fi;
#endif
            skip
        :: else -> lost[c] = 1; el[c] = 0; printf("client %d: keeper: lost\n", c)
        fi;
        aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0; CLEAR_EXTRA(c) }
    /* keeper _step(): a ticket past its deadline (expires - margin(ttl)) is lost for
       good, whenever the keeper gets to run */
    :: d_step { st[c] == HELD && !lost[c] && el[c] <= KEEPER_MARGIN ->
        lost[c] = 1; el[c] = 0; printf("client %d: keeper: past its deadline, lost\n", c) }
    /* body: a fenced write, `UPDATE ... WHERE lease_holds(name, holder, fence)`, opens */
    :: d_step { st[c] == HELD && !txn[c] && !wrote[c] ->
        wrote[c] = 1;
#if PERMITS
        permit_holds(hid[c], fen[c], sl[c], txn[c]);
        printf("client %d: fenced write: permit_holds(slot %d, fence %d) = %d\n", c, sl[c], fen[c], txn[c]);
        if
        :: txn[c] -> txf[c] = fen[c]; txs[c] = sl[c]; txl[c] = (kl[sl[c]] > 0)
        :: else -> skip                              /* the stale write is rejected */
        fi }
#else
        if
#if READERS
        :: READER(c) ->
            lease_holds_shared(hid[c], fen[c], txn[c]);
            printf("client %d: fenced write: lease_holds(epoch %d) = %d\n", c, fen[c], txn[c])
#endif
        :: else ->
            lease_holds(hid[c], fen[c], txn[c]);
            printf("client %d: fenced write: lease_holds(fence %d) = %d\n", c, fen[c], txn[c])
        fi;
        if
        :: txn[c] -> txf[c] = fen[c]; txl[c] = (keylock > 0)
        :: else -> skip                              /* the stale write is rejected */
        fi }
#endif
    /* body: the fenced transaction commits, whenever the client gets to it */
#if PERMITS
    :: d_step { txn[c] ->
        if
        :: tab[txs[c]].fence != txf[c] -> stale_write = 1
        :: else -> skip
        fi;
        if
        :: txl[c] -> kl[txs[c]]--
        :: else -> skip
        fi;
        printf("client %d: fenced write commits (slot %d, fence %d, slot's %d)\n", c, txs[c], txf[c], tab[txs[c]].fence);
        txn[c] = 0; txl[c] = 0; txf[c] = 0; txs[c] = 0 }
#else
    :: d_step { txn[c] ->
        if
#if READERS
        :: row.fence != txf[c] && READER(c) -> stale_epoch = 1
#endif
        :: row.fence != txf[c] && !READER(c) -> stale_write = 1
        :: else -> skip
        fi;
        if
        :: txl[c] -> keylock--
        :: else -> skip
        fi;
        printf("client %d: fenced write commits (fence %d, row's %d)\n", c, txf[c], row.fence);
        txn[c] = 0; txl[c] = 0; txf[c] = 0;
        SYNC_COMMIT }
#endif
#if STEPDOWN
#ifndef MUT_RELEASE_BEFORE_STOP
    /* told to step down: `pylease run` stops CMD as for a loss (SIGTERM, SIGKILL after
       --kill-after) and waits for it; run_as_leader's work returns. The work ends here;
       the tenure is still its own (the keeper renews on) until the block ends below. */
    :: d_step { st[c] == HELD && told[c] && !stopped[c] ->
        stopped[c] = 1; STEPPED_DOWN(c);
        printf("client %d: steps down: its work stops (fence %d)\n", c, fen[c]) }
#else
    /* the release sent while the work still runs, which stops after */
    :: d_step { st[c] == HELD && told[c] && !stopped[c] && aw[c] == NOSLOT && FREE_SLOT(c) ->
        send(c, OP_RELEASE, fen[c]); aw[c] = NOSLOT; since[c] = 0; STEPPED_DOWN(c); st[c] = ENDING;
        printf("client %d: steps down: sends lease_release(fence %d), its work still running\n", c, fen[c]) }
    :: d_step { st[c] == ENDING ->
        printf("client %d: its work stops\n", c); next_block(c) }
#endif
#endif
    /* the block ends: keeper.remove() (the tick under way answered or abandoned), then
       lease_release(name, holder, min_hold, fence); from here Held reads as lost. Its
       answer changes nothing the model tracks: the block may end before it arrives,
       and the statement may still run late, or never. */
    :: d_step { st[c] == HELD && aw[c] == NOSLOT && FREE_SLOT(c) ->
        send(c, OP_RELEASE, fen[c]);
        if
        :: READER(c) -> printf("client %d: block ends, sends pylease_release_share(epoch %d, share %d)\n", c, fen[c], SHARE_OF(c))
        :: else -> printf(SAYS_RELEASE, c, fen[c])
        fi;
        next_block(c) }
    /* a statement whose answer does not come is abandoned (the source drops the
       connection): it may still run on the server later, or never (it was lost) */
    :: d_step { aw[c] != NOSLOT ->
        printf("client %d: abandons its statement; it may run late\n", c);
        aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0; CLEAR_EXTRA(c) }
    :: d_step { aw[c] != NOSLOT ->
        printf("client %d: abandons its statement; it is lost\n", c);
        s = aw[c]; free_slot(s); s = 0; aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0; CLEAR_EXTRA(c) }
    od
}

/* ---- The database ----------------------------------------------------------------- */
byte out, acq, granted;
bool ok;
byte steals, helps;
#if STEPDOWN
bool asked;         /* scratch: a renewal's release_requested_by */
byte asks;          /* the operator's requests made */
#endif

/* The reply to request i goes back only if its sender still waits for it. */
#define ANSWER(i, v) \
    if \
    :: aw[(i) / SLOTS] == (i) -> rdone[(i) / SLOTS] = 1; rval[(i) / SLOTS] = (v) \
    :: else -> skip \
    fi

#if PERMITS
byte slot_out;
/* The server runs request i (of client i / SLOTS), now. */
inline run_request(i) {
    if
    :: rop[i] == OP_CLAIM ->
        permit_claim(rh[i], TTL, out, slot_out);
        printf("server: permit_claim(holder %d) = slot %d fence %d\n", rh[i], slot_out, out);
        ANSWER(i, out);
        if
        :: aw[i / SLOTS] == i -> rsl[i / SLOTS] = slot_out
        :: else -> skip
        fi
    :: rop[i] == OP_RENEW ->
        permit_renew(rh[i], TTL, rf[i], rx[i], ok, granted);
        printf("server: pylease_renew_held(permit, holder %d, slot %d, fence %d) = %d, granted %d\n", rh[i], rx[i], rf[i], ok, granted);
        ANSWER(i, ok);
        if
        :: aw[i / SLOTS] == i -> rgr[i / SLOTS] = granted
        :: else -> skip
        fi
    :: rop[i] == OP_RELEASE ->
        permit_release(rh[i], rf[i], rx[i]);
        printf("server: permit_release(holder %d, slot %d, fence %d)\n", rh[i], rx[i], rf[i]);
        ANSWER(i, 1)
    fi;
    free_slot(i);
    out = 0; granted = 0; ok = 0; slot_out = 0
}
#define SERVE(i) \
    :: d_step { rop[i] != 0 -> run_request(i) }
#elif NAMES
byte outb;
#define CLIENT_OF(i) ((i) / SLOTS)
#define ALL_OF(i) (WANT(CLIENT_OF(i)) == 3)
/* The rows a request of client c touches: 1 A, 2 B, 3 both */
#define ROWS_OF(i) WANT(CLIENT_OF(i))
/* The fences a renewal or release of request i names: A's, B's (0: none) */
#define FENCE_A(i) (rf[i] * (ROWS_OF(i) != 2))
#define FENCE_B(i) (rx[i] * (ROWS_OF(i) == 3) + rf[i] * (ROWS_OF(i) == 2))
/* Request i's k-th row lock: in name order (A, then B) */
#ifdef MUT_CLAIM_ALL_CALLER_ORDER
#define LOCK_ROW(i, k) (REV(CLIENT_OF(i)) -> 1 - (k) : (k))   /* the caller's order */
#else
#define LOCK_ROW(i, k) (k)
#endif
#define NEXT_ROW(i) LOCK_ROW(i, rph[i] - 1)
#define LOCKING(i) (rop[i] == OP_CLAIM && ALL_OF(i) && (rph[i] == 1 || rph[i] == 2))
/* Row r is locked by a statement other than request i's */
#define LOCKED_FOR(i, r) (lk[r] != 0 && lk[r] != (i) + 1)
/* A one-statement request may run: the rows it writes are not locked by another
   (it would wait for them; a claim that waits past lock_timeout is busy, below) */
#define FREE_FOR(i) (!(((ROWS_OF(i) & 1) && LOCKED_FOR(i, 0)) || ((ROWS_OF(i) & 2) && LOCKED_FOR(i, 1))))
byte waiter;        /* scratch: whose lock request i waits for */

/* The server runs the one-statement request i (of client i / SLOTS), now. */
inline run_request(i) {
    if
    :: rop[i] == OP_CLAIM ->            /* a single name: lease_claim */
        load(ROWS_OF(i) - 1); lease_claim(rh[i], TTL, out, racq); store(); racq = 0;
        printf("server: lease_claim(holder %d, name %d) = %d\n", rh[i], ROWS_OF(i) - 1, out);
        ANSWER(i, out)
    :: rop[i] == OP_RENEW ->
        renew_names(rh[i], ROWS_OF(i), TTL, FENCE_A(i), FENCE_B(i), ok, granted);
        printf("server: pylease_renew_held(holder %d, names %d, fences %d %d) = %d, granted %d\n", rh[i], ROWS_OF(i), FENCE_A(i), FENCE_B(i), ok, granted);
        ANSWER(i, ok);
        if
        :: aw[i / SLOTS] == i -> rgr[i / SLOTS] = granted
        :: else -> skip
        fi
    :: rop[i] == OP_RELEASE && ALL_OF(i) ->
        release_names(rh[i], 3, FENCE_A(i), FENCE_B(i));
        printf("server: lease_release_all(holder %d, fences %d %d)\n", rh[i], FENCE_A(i), FENCE_B(i));
        ANSWER(i, 1)
    :: rop[i] == OP_RELEASE && !ALL_OF(i) ->
        release_names(rh[i], ROWS_OF(i), FENCE_A(i), FENCE_B(i));
        printf("server: lease_release(holder %d, name %d, fence %d)\n", rh[i], ROWS_OF(i) - 1, rf[i]);
        ANSWER(i, 1)
    fi;
    free_slot(i);
    out = 0; granted = 0; ok = 0
}

/* A lease_claim_all statement ends with answer v: all or nothing, it granted both
   names (a grant) or none (busy). */
#define CLAIM_ALL_ENDS(i, v) \
    if \
    :: (v == BUSY && gave[i] != 0) || (v != BUSY && gave[i] != 3) -> partial = 1 \
    :: else -> skip \
    fi; \
    ANSWER(i, v)

/* lease_claim_all, step 1: the read. A name in the way: busy, nothing written. */
inline claim_all_read(i) {
    if
    :: IN_WAY(0, rh[i]) || IN_WAY(1, rh[i]) ->
        printf("server: lease_claim_all(holder %d) busy (read)\n", rh[i]);
        CLAIM_ALL_ENDS(i, BUSY); free_slot(i)
    :: else ->
        printf("server: lease_claim_all(holder %d) locks its rows\n", rh[i]);
        rph[i] = 1
    fi
}

/* Step 2: the next row's lock (a new name: its insert's key lock). */
inline claim_all_lock(i) {
    printf("server: lease_claim_all(holder %d) locks name %d\n", rh[i], NEXT_ROW(i));
    lk[NEXT_ROW(i)] = i + 1;
#ifdef MUT_CLAIM_ALL_ONE_BY_ONE
    /* each name decided and granted as it is locked (its own subtransaction), the
       grants before a busy one kept */
    if
    :: IN_WAY(NEXT_ROW(i), rh[i]) ->
        printf("server: lease_claim_all(holder %d) busy at name %d\n", rh[i], NEXT_ROW(i));
        CLAIM_ALL_ENDS(i, BUSY); free_slot(i)
    :: else ->
        load(NEXT_ROW(i)); claim_all_name(rh[i], TTL); store();
        gave[i] = gave[i] | (1 << NEXT_ROW(i));
        rph[i]++
    fi
#else
    rph[i]++
#endif
}

/* Step 2, the row locked by another statement: after lock_timeout, or at once when
   the deadlock detector finds a cycle, the statement answers busy and rolls back. */
inline claim_all_wait_over(i) {
    waiter = lk[NEXT_ROW(i)] - 1;
    if
    :: LOCKING(waiter) && lk[NEXT_ROW(waiter)] == i + 1 ->
        deadlock = 1;
        printf("server: lease_claim_all(holder %d) DEADLOCK with holder %d\n", rh[i], rh[waiter])
    :: else ->
        printf("server: lease_claim_all(holder %d) lock_timeout at name %d\n", rh[i], NEXT_ROW(i))
    fi;
    waiter = 0;
    CLAIM_ALL_ENDS(i, BUSY); free_slot(i)
}

/* Step 3: every row locked: the recheck and the grant; the locks end with it. */
inline claim_all_done(i) {
#ifdef MUT_CLAIM_ALL_ONE_BY_ONE
    out = tab[0].fence; outb = tab[1].fence;
#else
    claim_all_grant(rh[i], TTL, out, outb);
    if
    :: out != BUSY -> gave[i] = 3
    :: else -> skip
    fi;
#endif
    printf("server: lease_claim_all(holder %d) = A %d, B %d\n", rh[i], out, outb);
    CLAIM_ALL_ENDS(i, out);
    if
    :: aw[i / SLOTS] == i -> rvb[i / SLOTS] = outb
    :: else -> skip
    fi;
    free_slot(i);
    out = 0; outb = 0
}

#define SERVE(i) \
    :: d_step { rop[i] != 0 && !(rop[i] == OP_CLAIM && ALL_OF(i)) && FREE_FOR(i) -> run_request(i) } \
    :: d_step { rop[i] == OP_CLAIM && !ALL_OF(i) && !FREE_FOR(i) -> \
        printf("server: lease_claim(holder %d) lock_timeout\n", rh[i]); ANSWER(i, BUSY); free_slot(i) } \
    :: d_step { rop[i] == OP_CLAIM && ALL_OF(i) && rph[i] == 0 -> claim_all_read(i) } \
    :: d_step { LOCKING(i) && !LOCKED_FOR(i, NEXT_ROW(i)) -> claim_all_lock(i) } \
    :: d_step { LOCKING(i) && LOCKED_FOR(i, NEXT_ROW(i)) -> claim_all_wait_over(i) } \
    :: d_step { rop[i] == OP_CLAIM && ALL_OF(i) && rph[i] == 3 -> claim_all_done(i) }
#else
/* The server runs request i (of client i / SLOTS), now; the reply goes back only if its
   sender still waits for it. */
inline run_request(i) {
    if
#if READERS
    /* a reader's: pylease_claim_shared, and the renewal and release of its share, which
       name its epoch and its id (sql_readers.pml) */
    :: rop[i] == OP_CLAIM && READER(i / SLOTS) ->
        lease_claim_shared(rh[i], TTL, out, acq);
        printf("server: pylease_claim_shared(holder %d) = %d share %d (epoch + 1; row: fence %d left %d)\n", rh[i], out, acq, row.fence, row.left);
        ANSWER(i, out);
        if
        :: aw[i / SLOTS] == i -> rsh[i / SLOTS] = acq
        :: else -> skip
        fi;
        acq = 0
    :: rop[i] == OP_RENEW && READER(i / SLOTS) ->
        lease_renew_shared(rh[i], TTL, rf[i], rx[i], ok, granted);
        printf("server: pylease_renew_held(shared, holder %d, epoch %d, share %d) = %d, granted %d\n", rh[i], rf[i], rx[i], ok, granted);
        ANSWER(i, ok);
        if
        :: aw[i / SLOTS] == i -> rgr[i / SLOTS] = granted
        :: else -> skip
        fi
    :: rop[i] == OP_RELEASE && READER(i / SLOTS) ->
        lease_release_shared(rh[i], rf[i], rx[i], ok);
        printf("server: pylease_release_share(holder %d, epoch %d, share %d) = %d\n", rh[i], rf[i], rx[i], ok);
        ANSWER(i, ok)
#endif
    :: rop[i] == OP_CLAIM && !READER(i / SLOTS) ->
        lease_claim(rh[i], TTL, out, acq); SYNC_COMMIT;
        printf("server: lease_claim(holder %d) = %d (row: holder %d fence %d left %d)\n", rh[i], out, row.holder, row.fence, row.left);
        if
        :: aw[i / SLOTS] == i -> rdone[i / SLOTS] = 1; rval[i / SLOTS] = out
        :: else -> skip
        fi
    :: rop[i] == OP_RENEW && !READER(i / SLOTS) ->
        lease_renew(rh[i], TTL, rf[i], ok, granted); SYNC_COMMIT;
#if STEPDOWN
        renew_answers_request(ok, asked);
        printf("server: pylease_renew_held(holder %d, fence %d) = %d, granted %d, release requested %d\n", rh[i], rf[i], ok, granted, asked);
        if
        :: aw[i / SLOTS] == i ->
            rrq[i / SLOTS] = asked; rdue[i / SLOTS] = (ok && reqf == row.fence)
        :: else -> skip
        fi;
        asked = 0;
#else
        printf("server: pylease_renew_held(holder %d, fence %d) = %d, granted %d\n", rh[i], rf[i], ok, granted);
#endif
        if
        :: aw[i / SLOTS] == i -> rdone[i / SLOTS] = 1; rval[i / SLOTS] = ok; rgr[i / SLOTS] = granted
        :: else -> skip
        fi
    :: rop[i] == OP_RELEASE && !READER(i / SLOTS) ->
        lease_release(rh[i], MIN_HOLD, rf[i], ok);
        printf("server: lease_release(holder %d, fence %d) = %d\n", rh[i], rf[i], ok);
        if
        :: aw[i / SLOTS] == i -> rdone[i / SLOTS] = 1; rval[i / SLOTS] = ok
        :: else -> skip
        fi
    fi;
    free_slot(i);
    out = 0; acq = 0; granted = 0; ok = 0
}

#define SERVE(i) \
    :: d_step { rop[i] != 0 -> run_request(i) }
#endif

proctype Server() {
end:
    do
    SERVE(0)
    SERVE(1)
    SERVE(2)
    SERVE(3)
#if NC > 2
    SERVE(4)
    SERVE(5)
#endif
#if FAILOVER > 0
    /* WAL reaches the standby (asynchronous: everything; synchronous: releases) */
    :: d_step { timeline == 1 -> replicate(); printf("server: WAL reaches the standby\n") }
    /* failover: the standby is promoted on a new timeline; the old primary is fenced
       off (what it did not ship is lost, its connections and open transactions die);
       the new primary's clock agrees with the old one's (assumption 1) */
    :: d_step { timeline == 1 ->
        timeline = 2; printf("server: failover to the standby, timeline 2\n");
        row.exists = sb.exists; row.released = sb.released; row.holder = sb.holder;
        row.fence = sb.fence; row.age = sb.age; row.left = sb.left;
        row.ttl = sb.ttl;
        rop[0] = 0; rop[1] = 0; rop[2] = 0; rop[3] = 0;
#if NC > 2
        rop[4] = 0; rop[5] = 0;
#endif
        keylock = 0;
        txn[0] = 0; txl[0] = 0; txn[1] = 0; txl[1] = 0;
#if NC > 2
        txn[2] = 0; txl[2] = 0;
#endif
        skip }
#endif
#if STEAL > 0
    /* an operator's lease_steal(name, ttl, holder) (waits for a fenced transaction) */
    :: d_step { steals < STEAL && keylock == 0 ->
        steals++; lease_steal(200, TTL, out); SYNC_COMMIT;
        printf("operator: lease_steal = %d\n", out); out = 0 }
#endif
#if STEPDOWN > 0
    /* an operator's lease_request_release(name, requested_by) (`pylease request-release`),
       while the lease is held: one that finds it free (false) changes nothing */
    :: d_step { asks < STEPDOWN && row.exists && !row.released && row.left > 0 ->
        asks++; lease_request_release(ok);
        printf("operator: lease_request_release = %d (row: holder %d fence %d)\n", ok, row.holder, row.fence); ok = 0 }
#endif
#if HELPER > 0
    /* keep_fresh(target, name, holder, ttl=short) / `pylease renew --ttl` */
    :: d_step { helps < HELPER ->
        helps++; lease_renew(1, SHORT_TTL, 0, ok, granted); SYNC_COMMIT;
        printf("helper: lease_renew(holder 1, short ttl) = %d\n", ok); ok = 0; granted = 0 }
    /* `pylease claim NAME --holder $PYLEASE_HOLDER --ttl short` inside `pylease run` */
    :: d_step { helps < HELPER ->
        helps++; lease_claim(1, SHORT_TTL, out, acq); SYNC_COMMIT;
        printf("helper: lease_claim(holder 1, short ttl) = %d\n", out); out = 0; acq = 0 }
#endif
    od
}

/* ---- Time ------------------------------------------------------------------------- */
/* One tick of a client's monotonic clock; a slow clock may lose one. The rate bound
   allows one lost tick per DRIFT_WINDOW (twice the ttl), so no belief span (at most a
   ttl) sees two: the model lets a slow clock lose one tick in the whole run, which
   covers every span while keeping no countdown in the state. */
inline tick(c) {
    if
    :: c < SLOW && !skipped[c] -> skipped[c] = 1
    :: true ->
        if
        :: el[c] > 0 -> el[c]--
        :: else -> skip
        fi;
        if
        :: aw[c] != NOSLOT && since[c] < TTL -> since[c]++
        :: else -> skip
        fi
    fi
}

/* One tick of the database's clock: expiries come nearer on the primary and the standby
   alike (one clock, assumption 1). Time is unbounded: every time the model keeps is
   relative and saturates, so the state space is finite. */
proctype Clock() {
#if KINDS
    byte r;
#endif
end:
    do
    :: atomic {
#if KINDS
        /* every slot or name; no min_hold, so no age */
        r = 0;
        do
        :: r < NR ->
            if
            :: tab[r].left > 0 -> tab[r].left--
            :: else -> skip
            fi;
            r++
        :: else -> r = 0; break
        od;
#endif
        if
        :: row.left > 0 -> row.left--
        :: else -> skip
        fi;
#if READERS
        if
        :: shl[0] > 0 -> shl[0]--
        :: else -> skip
        fi;
#if READERS > 1
        if
        :: shl[1] > 0 -> shl[1]--
        :: else -> skip
        fi;
#endif
#endif
        if
        :: row.exists && row.age < AGE_CAP -> row.age++
        :: else -> skip
        fi;
#if FAILOVER > 0
        if
        :: sb.left > 0 -> sb.left--
        :: else -> skip
        fi;
        if
        :: sb.exists && sb.age < AGE_CAP -> sb.age++
        :: else -> skip
        fi;
#endif
        tick(0);
        tick(1);
#if NC > 2
        tick(2);
#endif
#if KINDS
        printf("tick (rows left %d %d; client 0 believes %d ticks, client 1 %d)\n", tab[0].left, tab[NR - 1].left, el[0], el[1]) }
#else
        printf("tick (row left %d; client 0 believes %d ticks, client 1 %d)\n", row.left, el[0], el[1]) }
#endif
    od
}

init {
    atomic {
        byte c = 0;
        do
        :: c < NC -> aw[c] = NOSLOT; run Client(c); c++
        :: else -> break
        od;
        run Server();
        run Clock()
    }
}

/* ---- Properties ------------------------------------------------------------------- */
#if PERMITS
/* A believer is wronged by a later grant of its slot. */
#define UNWRONGED(c) (!BELIEVES(c) || fen[c] >= top[sl[c]])
#elif NAMES
/* A believer is wronged by a later grant of any of its names: of both (fen, fb) or of
   its one name r (fen). Spelled out per client: SPIN's LTL formulas are short. */
#define UNWRONGED_BOTH(c) (!BELIEVES(c) || (fen[c] >= top[0] && fb[c] >= top[1]))
#define UNWRONGED_ONE(c, r) (!BELIEVES(c) || fen[c] >= top[r])
#else
/* A believer is wronged by a later claim grant; not by a steal, which breaks a tenure
   by design (its next renewal reports the loss), nor by what follows a steal. */
#define UNWRONGED(c) (!BELIEVES(c) || fen[c] >= top_claim || steal_top > fen[c])
#endif
#if NAMES == 1
#define NOBODY_WRONGED (UNWRONGED_BOTH(0) && UNWRONGED_BOTH(1))
#elif NAMES && NC > 2
#define NOBODY_WRONGED (UNWRONGED_BOTH(0) && UNWRONGED_ONE(1, 1) && UNWRONGED_ONE(2, 0))
#elif NAMES
#define NOBODY_WRONGED (UNWRONGED_BOTH(0) && UNWRONGED_ONE(1, 1))
#elif NC > 2
#define NOBODY_WRONGED (UNWRONGED(0) && UNWRONGED(1) && UNWRONGED(2))
#else
#define NOBODY_WRONGED (UNWRONGED(0) && UNWRONGED(1))
#endif

#if PERMITS || READERS
#if NC > 2
#define BELIEVERS (BELIEVES(0) + BELIEVES(1) + BELIEVES(2))
#else
#define BELIEVERS (BELIEVES(0) + BELIEVES(1))
#endif
#endif

#if READERS
/* A writer believes beside nobody: no other writer, no reader. (A reader wronged by a
   writer granted after its epoch, who believes no longer, is `belief`'s: a reader's
   fence is its epoch, and a later exclusive grant is a grant to another tenure.) */
#define WB(c) (BELIEVES(c) && !READER(c))
#if NC > 2
#define WRITER_BELIEVES (WB(0) || WB(1) || WB(2))
#else
#define WRITER_BELIEVES (WB(0) || WB(1))
#endif
#define RW_EXCLUSION (!WRITER_BELIEVES || BELIEVERS <= 1)
#endif

#if NAMES
/* A claim of both names never believes one of them while another client believes it
   (every pair that shares a name: client 0 shares one with each other, clients 1 and
   2 of NAMES 2 claim different ones), and no lease_claim_all grants a subset
   (partial). Renewal is per name (contract 5.3: a late lease_renew_each may renew A of
   a tenure that lost B): not a grant. */
#define SHARE(i, j) (BELIEVES(i) && BELIEVES(j))
#if NC > 2
#define ALL_OR_NOTHING (!SHARE(0, 1) && !SHARE(0, 2) && !partial)
#else
#define ALL_OR_NOTHING (!SHARE(0, 1) && !partial)
#endif
#endif

/* No other grant while a holder believes (within assumption 2: not with FAILOVER 2);
   of a permit: of its slot; of several names: of any of them. */
ltl belief     { [] NOBODY_WRONGED }
/* A stale fenced write never commits after a later grant. */
ltl fenced     { [] !stale_write }
#if PERMITS
/* Never more believers than permits. */
ltl permits        { [] (BELIEVERS <= PERMITS) }
/* A slot's fence only grows. */
ltl fence_grows    { [] !regress }
/* What one search of a configuration checks: all of them at once. */
ltl all            { [] (NOBODY_WRONGED && BELIEVERS <= PERMITS && !regress && !stale_write) }
#elif NAMES
/* A claim of several names is all or nothing: never two believers of one name, never
   a claim of both names holding one while another holds the other. */
ltl all_or_nothing { [] ALL_OR_NOTHING }
/* Claims of several names never wait for each other's row locks in a cycle. */
ltl no_deadlock    { [] !deadlock }
/* A name's fence only grows. */
ltl fence_grows    { [] !regress }
ltl all            { [] (NOBODY_WRONGED && ALL_OR_NOTHING && !deadlock && !regress) }
#elif READERS
ltl fence_once     { [] !reissued }
/* Never a believing writer beside another believing holder, reader or writer. */
ltl rw_exclusion   { [] RW_EXCLUSION }
/* A reader's fenced write (lease_holds with its epoch) never commits after a writer
   was granted. */
ltl epoch_fenced   { [] !stale_epoch }
#if READERS > 1
/* Violated when two readers believe at once: check.sh's `reach` line wants that state
   found (the readers run in parallel, and rw_exclusion had overlaps to judge). */
ltl readers_overlap { [] !(BELIEVES(0) && BELIEVES(1)) }
#endif
ltl all            { [] (NOBODY_WRONGED && RW_EXCLUSION && !stale_write && !stale_epoch && !reissued) }
#else
/* No fence is issued twice, across a failover too. */
ltl fence_once { [] !reissued }
/* What one search of a configuration checks: the three at once, or (FAILOVER 2, where
   a lost grant is outside the promise) the two about fences. */
#if STEPDOWN
/* A step-down request is never lost: a renewal of the tenure asked, run after the
   request, tells the holder when its answer is accepted (a lost reply loses nothing:
   the next renewal answers it again). */
ltl request_kept { [] !missed }
/* A holder that stepped down and leads again has a new tenure: a fence above the one
   it stepped down from, and no request of an earlier tenure. */
ltl new_term   { [] !(refence || spurious) }
/* Violated when client 0 believes again after stepping down: check.sh's `reach` line
   wants that state found (new_term had a second term to judge). */
ltl leads_again { [] !(sdf[0] != 0 && BELIEVES(0)) }
ltl all        { [] (NOBODY_WRONGED && !stale_write && !reissued && !missed && !refence && !spurious) }
#else
ltl all        { [] (NOBODY_WRONGED && !stale_write && !reissued) }
#endif
ltl fences     { [] (!stale_write && !reissued) }
#endif
#endif /* GROUPS */
