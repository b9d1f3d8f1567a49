/*
 * pylease's lease protocol, one name, checked exhaustively with SPIN.
 *
 * Parties: NC clients, each running BLOCKS lease blocks (claim, body, release) with a
 * keeper that renews; the database (one primary, optionally one failover to a standby);
 * optionally a helper that renews or re-claims with client 0's holder and a shorter ttl
 * (keep_fresh(ttl=...), `pylease claim --holder $PYLEASE_HOLDER`), and an operator's
 * steal. Every request may be delayed, lost, or executed late after its sender gave up
 * on it; every reply may be delayed or lost; any party may pause for any time. Each
 * transition is named after the SQL function or keeper step it stands for.
 *
 * Properties (one line each, at the end): belief, fenced, fence_once.
 * Configuration and mutants are -D macros; see check.sh and docs/model.md. Mutants
 * here: MUT_BELIEF_FROM_ARRIVAL, MUT_NO_DRIFT_MARGIN (issue 21 item 18),
 * MUT_LATE_ANSWER_REVIVES, MUT_RELEASE_NO_FENCE (item 17, with sql.pml's); the SQL's
 * are listed in sql.pml.
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
#ifndef HELPER
#define HELPER 0        /* helper calls (renew or claim with client 0's holder, SHORT_TTL) */
#endif
#ifndef STEAL
#define STEAL 0         /* operator steals (older_than => '0') */
#endif
#ifndef FAILOVER
#define FAILOVER 0      /* 0: one server; 1: synchronous standby; 2: asynchronous standby */
#endif
#define SLOTS 2         /* requests a client may have outstanding (sent, not yet run) */

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

#define AGE_CAP MIN_HOLD    /* only min_hold reads a tenure's age */
#include "sql.pml"

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

/* Requests sent and not yet run by the server: slot c*SLOTS+k belongs to client c. */
byte rop[NC * SLOTS];
byte rh[NC * SLOTS];
byte rf[NC * SLOTS];

#define FREE_SLOT(c) (rop[(c) * SLOTS] == 0 || rop[(c) * SLOTS + 1] == 0)

/* Held.lost is False and Held.check() passes: not lost, block not left, and the local
   clock before the belief deadline, Ticket.expires - margin (issue 21 item 18). */
#define BELIEVES(c) (st[c] == HELD && !lost[c] && el[c] > MARGIN)

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

#ifdef MUT_RELEASE_NO_FENCE
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
    rop[i] = 0; rh[i] = 0; rf[i] = 0;
    if
    :: i % SLOTS == 0 && rop[i + 1] != 0 ->
        rop[i] = rop[i + 1]; rh[i] = rh[i + 1]; rf[i] = rf[i + 1];
        rop[i + 1] = 0; rh[i + 1] = 0; rf[i + 1] = 0;
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
    rop[aw[c]] = op; rh[aw[c]] = hid[c]; rf[aw[c]] = f;
    since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0
}

/* What the block leaves behind is forgotten, so that states that differ only there
   are one. */
inline next_block(c) {
    aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0;
    fen[c] = 0; el[c] = 0; lost[c] = 0; pre[c] = 0; tries[c] = 0; wrote[c] = 0;
    blk[c]++;
    if
    :: (c == 0 && blk[c] < BLOCKS0) || (c > 0 && blk[c] < BLOCKS) -> st[c] = IDLE
    :: else -> st[c] = DONE
    fi
}

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
        if
        :: EXPLICIT && row.exists && !row.released && row.holder == hid[c] -> pre[c] = row.fence
        :: else -> pre[c] = 0
        fi;
        st[c] = CLAIMING; wrote[c] = !WRITES; tries[c] = 1;
        send(c, OP_CLAIM, 0);
        printf("client %d: lease() sends lease_claim (holder %d)\n", c, hid[c]) }
    /* acquire(): the claim's reply; a grant starts the Ticket at the claim's send time */
    :: d_step { st[c] == CLAIMING && aw[c] != NOSLOT && rdone[c] ->
        if
        :: rval[c] != BUSY && rval[c] != EXHAUSTED && !REFUSED(c) ->
            st[c] = HELD; fen[c] = rval[c]; lost[c] = 0;
            el[c] = EXPIRES_IN(c, TTL);
            pre[c] = 0; tries[c] = 0;
            printf("client %d: acquire() granted fence %d, believes %d ticks\n", c, fen[c], el[c])
        :: else -> printf("client %d: acquire() busy (%d)\n", c, rval[c])
        fi;
        aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0 }
    /* acquire(): claim again (waiting, or retrying a claim whose reply was lost) */
    :: d_step { st[c] == CLAIMING && aw[c] == NOSLOT && tries[c] < TRIES && FREE_SLOT(c) ->
        tries[c]++; send(c, OP_CLAIM, 0);
        printf("client %d: acquire() sends lease_claim again\n", c) }
    /* acquire(): the wait is over: LeaseBusy */
    :: d_step { st[c] == CLAIMING && aw[c] == NOSLOT ->
        next_block(c); printf("client %d: acquire() gives up: LeaseBusy\n", c) }
    /* keeper _renew(): one tick sends lease_renew_each with the lease's own ttl */
    :: d_step { st[c] == HELD && !lost[c] && el[c] <= RENEW_AT && el[c] > KEEPER_MARGIN &&
                aw[c] == NOSLOT && FREE_SLOT(c) ->
        send(c, OP_RENEW, 0);
        printf("client %d: keeper sends lease_renew_each\n", c) }
    /* keeper _renew(): the answer; Ticket.renewed(sent_at, granted) or the loss */
    :: d_step { st[c] == HELD && aw[c] != NOSLOT && rdone[c] ->
        if
        :: rval[c] && !lost[c] && !LATE_ANSWER(c) ->
            el[c] = MAX2(el[c], EXPIRES_IN(c, rgr[c]));
            printf("client %d: keeper renewed: believes %d ticks\n", c, el[c])
        :: else -> lost[c] = 1; el[c] = 0; printf("client %d: keeper: lost\n", c)
        fi;
        aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0 }
    /* keeper _step(): a ticket past its deadline (expires - margin(ttl)) is lost for
       good, whenever the keeper gets to run */
    :: d_step { st[c] == HELD && !lost[c] && el[c] <= KEEPER_MARGIN ->
        lost[c] = 1; el[c] = 0; printf("client %d: keeper: past its deadline, lost\n", c) }
    /* body: a fenced write, `UPDATE ... WHERE lease_holds(name, holder, fence)`, opens */
    :: d_step { st[c] == HELD && !txn[c] && !wrote[c] ->
        wrote[c] = 1;
        lease_holds(hid[c], fen[c], txn[c]);
        printf("client %d: fenced write: lease_holds(fence %d) = %d\n", c, fen[c], txn[c]);
        if
        :: txn[c] -> txf[c] = fen[c]; txl[c] = (keylock > 0)
        :: else -> skip                              /* the stale write is rejected */
        fi }
    /* body: the fenced transaction commits, whenever the client gets to it */
    :: d_step { txn[c] ->
        if
        :: row.fence != txf[c] -> stale_write = 1
        :: else -> skip
        fi;
        if
        :: txl[c] -> keylock--
        :: else -> skip
        fi;
        printf("client %d: fenced write commits (fence %d, row's %d)\n", c, txf[c], row.fence);
        txn[c] = 0; txl[c] = 0; txf[c] = 0;
        SYNC_COMMIT }
    /* the block ends: keeper.remove() (the tick under way answered or abandoned), then
       lease_release(name, holder, min_hold, fence); from here Held reads as lost. Its
       answer changes nothing the model tracks: the block may end before it arrives,
       and the statement may still run late, or never. */
    :: d_step { st[c] == HELD && aw[c] == NOSLOT && FREE_SLOT(c) ->
        send(c, OP_RELEASE, fen[c]);
        printf("client %d: block ends, sends lease_release(fence %d)\n", c, fen[c]);
        next_block(c) }
    /* a statement whose answer does not come is abandoned (the source drops the
       connection): it may still run on the server later, or never (it was lost) */
    :: d_step { aw[c] != NOSLOT ->
        printf("client %d: abandons its statement; it may run late\n", c);
        aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0 }
    :: d_step { aw[c] != NOSLOT ->
        printf("client %d: abandons its statement; it is lost\n", c);
        s = aw[c]; free_slot(s); s = 0; aw[c] = NOSLOT; since[c] = 0; rdone[c] = 0; rval[c] = 0; rgr[c] = 0 }
    od
}

/* ---- The database ----------------------------------------------------------------- */
byte out, acq, granted;
bool ok;
byte steals, helps;

/* The server runs request i (of client i / SLOTS), now; the reply goes back only if its
   sender still waits for it. */
inline run_request(i) {
    if
    :: rop[i] == OP_CLAIM ->
        lease_claim(rh[i], TTL, out, acq); SYNC_COMMIT;
        printf("server: lease_claim(holder %d) = %d (row: holder %d fence %d left %d)\n", rh[i], out, row.holder, row.fence, row.left);
        if
        :: aw[i / SLOTS] == i -> rdone[i / SLOTS] = 1; rval[i / SLOTS] = out
        :: else -> skip
        fi
    :: rop[i] == OP_RENEW ->
        lease_renew(rh[i], TTL, ok, granted); SYNC_COMMIT;
        printf("server: lease_renew_each(holder %d) = %d, granted %d\n", rh[i], ok, granted);
        if
        :: aw[i / SLOTS] == i -> rdone[i / SLOTS] = 1; rval[i / SLOTS] = ok; rgr[i / SLOTS] = granted
        :: else -> skip
        fi
    :: rop[i] == OP_RELEASE ->
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
#if HELPER > 0
    /* keep_fresh(target, name, holder, ttl=short) / `pylease renew --ttl` */
    :: d_step { helps < HELPER ->
        helps++; lease_renew(1, SHORT_TTL, ok, granted); SYNC_COMMIT;
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
end:
    do
    :: atomic {
        if
        :: row.left > 0 -> row.left--
        :: else -> skip
        fi;
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
        printf("tick (row left %d; client 0 believes %d ticks, client 1 %d)\n", row.left, el[0], el[1]) }
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
/* A believer is wronged by a later claim grant; not by a steal, which breaks a tenure
   by design (its next renewal reports the loss), nor by what follows a steal. */
#define UNWRONGED(c) (!BELIEVES(c) || fen[c] >= top_claim || steal_top > fen[c])
#if NC > 2
#define NOBODY_WRONGED (UNWRONGED(0) && UNWRONGED(1) && UNWRONGED(2))
#else
#define NOBODY_WRONGED (UNWRONGED(0) && UNWRONGED(1))
#endif

/* No other grant while a holder believes (within assumption 2: not with FAILOVER 2). */
ltl belief     { [] NOBODY_WRONGED }
/* A stale fenced write never commits after a later grant. */
ltl fenced     { [] !stale_write }
/* No fence is issued twice, across a failover too. */
ltl fence_once { [] !reissued }
/* What one search of a configuration checks: the three at once, or (FAILOVER 2, where
   a lost grant is outside the promise) the two about fences. */
ltl all        { [] (NOBODY_WRONGED && !stale_write && !reissued) }
ltl fences     { [] (!stale_write && !reissued) }

/* Where later primitives go (docs/model.md, "Adding a primitive"):
   ltl shared_exclusive { [] ... }   a shared holder never overlaps an exclusive one
   ltl permits          { [] ... }   never more believers than permits
   ltl partitions       { [] ... }   never two believing owners of a partition */
