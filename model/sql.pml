/*
 * pylease's SQL functions on one lease row, as the server runs them.
 *
 * Each inline is one call of the function it is named after (sql/postgres/schema.sql;
 * sql/sqlite/<operation>.sql decides the same way under SQLite's write lock). A call is
 * one statement, so it runs atomically: the includer wraps it in atomic { }.
 *
 * Included by pylease.pml (the protocol) and decisions.pml (the decision table that
 * tests/model/test_decisions.py replays against both backends). An includer may define
 * GRANTED(kind) before including this file: it runs at every new tenure; and, with
 * readers (sql_readers.pml), READERS_LIVE and DROP_SHARES.
 *
 * With STEPDOWN (migration 0016, contract 5.4): the row's release_requested_by, set by
 * lease_request_release and answered by the keeper's renewal.
 *
 * Mutants (-D): MUT_RENEW_EARLIER, MUT_RECLAIM_EARLIER (issue 21 item 5),
 * MUT_NO_TIMELINE_FLOOR, MUT_RELEASE_ANY_HOLDER, MUT_RELEASE_NO_FENCE (item 17),
 * MUT_HOLDS_NOLOCK; with STEPDOWN, MUT_REQUEST_CLEARED_ON_ANSWER,
 * MUT_REQUEST_OUTLIVES_TENURE, MUT_RECLAIM_RELEASED.
 */

#define BUSY        0    /* lease_claim / lease_steal answered NULL */
#define FENCE_MAX   250  /* stands for 2^63-1, the last fence */
#define EXHAUSTED   251  /* SQLSTATE 54000: the name has used every fence */
#define TL_SPAN     16   /* stands for 2^40: timeline T grants fences from (T-1)*TL_SPAN + 1 */

#define KIND_CLAIM  1    /* claimed or taken over (lease_claim, or a steal of a free name) */
#define KIND_STOLEN 2    /* lease_steal from an unexpired holder */

#define MAX2(a, b)  ((a) > (b) -> (a) : (b))

#ifndef GRANTED
#define GRANTED(kind) skip
#endif
/* With readers (sql_readers.pml): unexpired shares of the name's epoch keep a takeover
   out, and an exclusive grant deletes the name's shares. Without them, nothing. */
#ifndef READERS_LIVE
#define READERS_LIVE 0
#endif
#ifndef DROP_SHARES
#define DROP_SHARES skip
#endif

/* The row of pylease_leases for the one name. Times are kept relative to the
   database's clock, which never steps (assumption 1), so that the state space is
   finite without bounding time: left = expires_at - now while positive (0: expired,
   or released and claimable), age = now - acquired_at (up to AGE_CAP; only min_hold
   reads it). renewed_at and the counters are left out: no decision modelled reads
   them (older_than is always '0'). */
typedef Row {
    bool exists;
    bool released;
    byte holder;
    byte fence;
    byte age;
    byte left;
    byte ttl
};

#ifndef AGE_CAP
#define AGE_CAP 15
#endif

Row row;
#if STEPDOWN
/* release_requested_by is set: the tenure's step-down request. It belongs to the
   tenure: only a new tenure clears it (a release leaves it, and nothing reads it
   after). Kept beside the row, not in it, so that the decision table's rows stay as
   they are. */
bool req;
byte reqf;          /* ghost: the fence of the tenure asked to step down (0: none yet) */
#ifdef MUT_REQUEST_OUTLIVES_TENURE
#define NEW_TENURE_REQ skip     /* the grant's UPDATE without release_requested_by = NULL */
#else
#define NEW_TENURE_REQ req = 0
#endif
#else
#define NEW_TENURE_REQ skip
#endif
byte timeline = 1;  /* the primary's timeline; a failover adds one */
byte keylock;       /* open fenced transactions: lease_holds' FOR KEY SHARE locks */

#ifdef MUT_NO_TIMELINE_FLOOR
#define FLOOR 1
#else
/* ((pg_walfile_name(...)'s timeline - 1) << 40) + 1 */
#define FLOOR ((timeline - 1) * TL_SPAN + 1)
#endif
/* greatest(s_fence + 1, floor) */
#define NEXT_FENCE MAX2(row.fence + 1, FLOOR)

#ifdef MUT_RECLAIM_EARLIER
#define RECLAIM_EXPIRY(t) row.left = (t)
#else
/* Contract revision 2's never-earlier rule, for an idempotent claim too (item 5). */
#define RECLAIM_EXPIRY(t) row.left = MAX2(row.left, (t))
#endif

#ifdef MUT_RENEW_EARLIER
#define RENEW_EXPIRY row.left = row.ttl
#else
/* expires_at = greatest(l.expires_at, t_now + coalesce(ttl, l.ttl)) */
#define RENEW_EXPIRY row.left = MAX2(row.left, row.ttl)
#endif

#if defined(MUT_RELEASE_ANY_HOLDER)
#define RELEASE_MATCH(h, f) (1)
#elif defined(MUT_RELEASE_NO_FENCE)
#define RELEASE_MATCH(h, f) (row.holder == (h))
#else
/* lease_release(name, holder, min_hold, fence): holder AND fence (contract 5.6);
   f == 0 is the three-argument form, matched on the holder only. */
#define RELEASE_MATCH(h, f) (row.holder == (h) && ((f) == 0 || row.fence == (f)))
#endif

/* A new tenure for holder h with ttl t (claim's INSERT or takeover UPDATE, steal's UPDATE). */
inline new_tenure(h, t, kind) {
    row.holder = h;
    row.released = 0;
    row.age = 0;
    row.ttl = t;
    row.left = t;
    NEW_TENURE_REQ;
    GRANTED(kind)
}

#ifdef MUT_RECLAIM_RELEASED
/* The claim's "still ours" test without NOT s_freed: a released tenure of the holder
   is taken up again, with its fence. */
#define NOT_OURS(h) (row.holder != (h))
#else
#define NOT_OURS(h) (row.released || row.holder != (h))
#endif

/* lease_claim(name, ttl, holder): the fence, BUSY, or EXHAUSTED; acq: the tenure's
   acquired_at's age (now - acquired_at). */
inline lease_claim(h, t, out, acq) {
    if
    :: !row.exists ->
        row.exists = 1;
        row.fence = FLOOR;
        new_tenure(h, t, KIND_CLAIM);
        out = row.fence
    :: row.exists && row.left > 0 && (NOT_OURS(h)) ->
        out = BUSY                           /* busy: one read, no lock, no WAL */
    :: row.exists && !(NOT_OURS(h)) ->
        row.ttl = t;                         /* still ours: idempotent, same fence */
        RECLAIM_EXPIRY(t);
#ifdef MUT_RECLAIM_RELEASED
        row.released = 0;
#endif
        out = row.fence
    :: row.exists && row.left == 0 && (NOT_OURS(h)) ->
        if
        :: row.fence == FENCE_MAX -> out = EXHAUSTED
        :: row.fence != FENCE_MAX && keylock > 0 ->
            out = BUSY                       /* lock_timeout behind a fenced transaction */
        :: row.fence != FENCE_MAX && keylock == 0 && READERS_LIVE ->
            out = BUSY                       /* read by readers (sql_readers.pml) */
        :: row.fence != FENCE_MAX && keylock == 0 && !READERS_LIVE ->
            row.fence = NEXT_FENCE;          /* free: released, or a takeover */
            DROP_SHARES;                     /* its readers are over */
            new_tenure(h, t, KIND_CLAIM);
            out = row.fence
        fi
    fi;
    acq = row.age
}

/* pylease_renew_held / lease_renew(name, holder, ttl[, fence]) for one lease: ok, and
   the span the server granted from its own clock (expires_at - server_time); t == 0 is
   a NULL ttl, f == 0 a NULL fence (any tenure of the holder; a renewal that names its
   tenure renews only that one, migration 0012). */
inline lease_renew(h, t, f, ok, granted) {
    if
    :: row.exists && row.holder == h && !row.released && (f == 0 || row.fence == f) ->
        if
        :: t != 0 -> row.ttl = t
        :: else -> skip
        fi;
        RENEW_EXPIRY;
        ok = 1;
        granted = row.left
    :: else ->
        ok = 0;
        granted = 0
    fi
}

#if STEPDOWN
/* lease_request_release(name, requested_by): true while the lease is held (unexpired,
   not released); the first request of the tenure is kept (coalesce). */
inline lease_request_release(ok) {
    if
    :: row.exists && !row.released && row.left > 0 ->
        req = 1; reqf = row.fence;
        ok = 1
    :: else -> ok = 0
    fi
}

/* pylease_renew_held's release_requested_by of a lease renewed (ok): the tenure's
   request, which stays set until the tenure ends, so that a lost reply loses nothing.
   MUT_REQUEST_CLEARED_ON_ANSWER: cleared once answered. */
inline renew_answers_request(ok, asked) {
    asked = (ok && req);
#ifdef MUT_REQUEST_CLEARED_ON_ANSWER
    if
    :: asked -> req = 0
    :: else -> skip
    fi
#endif
}
#endif

/* lease_release(name, holder, min_hold[, fence]); mh == 0 is a NULL min_hold. */
inline lease_release(h, mh, f, ok) {
    if
    :: row.exists && !row.released && RELEASE_MATCH(h, f) ->
        row.released = 1;
        if
        :: mh == 0 -> row.left = 0
        :: mh != 0 && mh > row.age -> row.left = mh - row.age   /* resting */
        :: mh != 0 && mh <= row.age -> row.left = 0
        fi;
        ok = 1
    :: else -> ok = 0
    fi
}

/* lease_steal(name, ttl, holder, older_than => '0'): the new fence, or EXHAUSTED. The
   includer runs it only while keylock == 0: the UPDATE waits for a fenced transaction. */
inline lease_steal(h, t, out) {
    if
    :: !row.exists ->
        row.exists = 1;
        row.fence = FLOOR;
        new_tenure(h, t, KIND_CLAIM);
        out = row.fence
    :: row.exists && row.fence == FENCE_MAX -> out = EXHAUSTED
    :: row.exists && row.fence != FENCE_MAX ->
        row.fence = NEXT_FENCE;
        if
        :: row.released || row.left == 0 -> new_tenure(h, t, KIND_CLAIM)
        :: else -> new_tenure(h, t, KIND_STOLEN)
        fi;
        out = row.fence
    fi
}

/* lease_holds(name, holder, fence): true iff unexpired, unreleased, this holder and
   fence; it locks the row FOR KEY SHARE, which every grant (a key change) waits for,
   until the caller's transaction ends. */
inline lease_holds(h, f, ok) {
    ok = (row.exists && row.holder == h && row.fence == f && !row.released
          && row.left > 0);
#ifndef MUT_HOLDS_NOLOCK
    if
    :: ok -> keylock++
    :: else -> skip
    fi
#endif
}
