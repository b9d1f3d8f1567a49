/*
 * pylease's SQL of permits and several names (migrations 0008, 0009, 0012, 0014) on a table of
 * rows, as the server runs it: the slots of one semaphore (PERMITS), or two lease
 * names, A (row 0) and B (row 1) (NAMES).
 *
 * A function decides one row at a time in sql.pml's `row`: load(r) brings row r there,
 * sql.pml's pieces decide (a new tenure, its fence, an extension never earlier, a
 * holder-matched renewal, release and lease_holds are the lease's), store() puts it
 * back. A call is one statement and runs atomically, except lease_claim_all, whose
 * locks are taken one row at a time (pylease.pml runs its steps): that is where
 * claims of several names could deadlock or grant a subset.
 *
 * Included by pylease.pml after sql.pml, with PERMITS or NAMES set. Mutants (-D):
 * MUT_PERMIT_TAKE_HELD, MUT_PERMIT_RELEASE_RESETS, MUT_CLAIM_ALL_NO_RECHECK,
 * MUT_CLAIM_ALL_ONE_BY_ONE, MUT_CLAIM_ALL_CALLER_ORDER, MUT_RELEASE_HOLDER_ONLY.
 *
 * A holder the caller chose claims a new tenure (permit_claim_new, lease_claim_all_new,
 * migration 0012), as a lease's (lease_claim_new): busy while any of it is unexpired,
 * new fences after. CLAIM_CONTINUES (-D) is the claim before 0012, which continued it.
 * The keeper's renewal names the tenure (0012: a permit's slot and its fence, each
 * name's fence), and so does the release (0014: permit_release with the slot and its
 * fence, lease_release_all with each name's fence); a fence 0 in a request is the
 * NULL of the earlier signatures, matched on the holder alone.
 */

#if PERMITS
#define NR PERMITS      /* a semaphore of PERMITS slots, max_permits => PERMITS */
#else
#define NR 2            /* names A and B */
#endif

Row tab[NR];
byte kl[NR];            /* per row: open fenced transactions (permit_holds' FOR KEY SHARE) */
byte cur;               /* the row loaded into `row` */
byte ri, rk, rn;        /* scratch of a statement's loops (0 between statements) */
byte racq;              /* scratch: lease_claim's acquired_at, unread here */
byte rq;                /* scratch: the fence a statement names for the row it decides;
                           permit_claim's: the holder's expired slot + 1 */

inline load(r) {
    cur = r;
    row.exists = tab[r].exists; row.released = tab[r].released; row.holder = tab[r].holder;
    row.fence = tab[r].fence; row.age = tab[r].age; row.left = tab[r].left;
    row.ttl = tab[r].ttl; keylock = kl[r]
}

/* `row` back to row cur, and cleared, so that it is no part of the state between
   statements. */
inline store() {
    tab[cur].exists = row.exists; tab[cur].released = row.released;
    tab[cur].holder = row.holder; tab[cur].fence = row.fence; tab[cur].age = row.age;
    tab[cur].left = row.left; tab[cur].ttl = row.ttl; kl[cur] = keylock;
    row.exists = 0; row.released = 0; row.holder = 0; row.fence = 0; row.age = 0;
    row.left = 0; row.ttl = 0; keylock = 0; cur = 0
}

/* A tenure of holder h, not released: unexpired or not (renewals and a holder's own
   claim find it until it is taken). */
#define HOLDS_ROW(r, h) (tab[r].exists && tab[r].holder == (h) && !tab[r].released)
/* Free for a new grant: expires_at <= now (released, expired, or never granted). */
#define FREE_ROW(r) (tab[r].left == 0)

/* ---- Permits (0008: permit_claim, permit_renew, permit_release, permit_holds) ---- */

#ifdef MUT_PERMIT_TAKE_HELD
/* The grant's SELECT ... FOR UPDATE SKIP LOCKED without `expires_at <= t_now`: it
   takes the slot the holder's hash points at, held or not, once the (correct) busy
   test saw one free. */
#define TAKEABLE(r) (kl[r] == 0)
#else
/* A free slot that no other transaction has locked (SKIP LOCKED: a holder's open
   permit_holds transaction keeps its slot out of every grant). */
#define TAKEABLE(r) (FREE_ROW(r) && kl[r] == 0)
#endif

/* permit_claim_new(name, NR, ttl, holder, permits => 1): the fence, BUSY or EXHAUSTED,
   and the slot granted. The model's claims take one permit each. The holder's expired
   slot is not continued: the grant takes free slots as any claim does (its own among
   them, unless a fenced transaction has it locked) and frees it if not taken again. */
inline permit_claim(h, t, out, sl) {
    out = BUSY; sl = 0;
    ri = 0;
    do
    :: ri < NR && !HOLDS_ROW(ri, h) -> ri++
    :: else -> break
    od;
    if
#ifndef CLAIM_CONTINUES
    :: ri < NR && tab[ri].left > 0 -> skip   /* this holder's, unexpired: busy */
#else
    :: ri < NR ->
        /* still this holder's (a retried claim): its slot again, extended never earlier */
        load(ri);
        row.ttl = t; RECLAIM_EXPIRY(t); out = row.fence;
        store(); sl = ri
#endif
    :: else ->
        /* none of this holder's, or (a new tenure) its slot expired: a grant of free
           slots, its expired one among them (remembered in rq, slot + 1) */
        rq = (ri < NR -> ri + 1 : 0);
        /* busy: no slot free. Reads only. */
        rn = 0; ri = 0;
        do
        :: ri < NR -> rn = rn + FREE_ROW(ri); ri++
        :: else -> break
        od;
        /* a grant: the first slot TAKEABLE from where the holder's hash points */
        rk = 0; ri = h % NR;
        do
        :: rn > 0 && rk < NR && !TAKEABLE(ri) -> rk++; ri = (ri + 1) % NR
        :: else -> break
        od;
        if
        :: rn > 0 && rk < NR ->
            load(ri);
            if
            :: row.fence == FENCE_MAX -> out = EXHAUSTED
            :: else ->
                row.exists = 1; row.fence = NEXT_FENCE;   /* timeline-floored, per slot */
                new_tenure(h, t, KIND_CLAIM);
                out = row.fence
            fi;
            store(); sl = ri;
            /* the holder's expired slot, not taken again (a fenced transaction of the
               earlier tenure has it locked: skipped), is freed with the grant; its
               fence stays */
            if
            :: out != EXHAUSTED && rq != 0 && rq - 1 != ri -> tab[rq - 1].released = 1
            :: else -> skip
            fi
        :: else -> skip        /* busy, or every free slot locked by another: busy */
        fi
    fi;
    ri = 0; rk = 0; rn = 0; rq = 0
}

/* pylease_renew_held's permit element (holder h, while it holds slot s with fence f; f
   0: any tenure, as permit_renew(name, holder, ttl)): all or nothing, every slot of
   the holder (as many as it was granted together: one) is extended, never earlier;
   granted: the earliest expiry's span. */
inline permit_renew(h, t, f, s, ok, granted) {
    rn = 0; ri = 0;
    do
    :: ri < NR -> rn = rn + HOLDS_ROW(ri, h); ri++
    :: else -> break
    od;
    ok = (rn == 1 && (f == 0 || (HOLDS_ROW(s, h) && tab[s].fence == f))); granted = 0;
    ri = 0;
    do
    :: ok && ri < NR && HOLDS_ROW(ri, h) ->
        load(ri); lease_renew(h, t, 0, rk, rn); store();
        granted = (granted == 0 -> rn : (rn < granted -> rn : granted)); ri++
    :: ok && ri < NR && !HOLDS_ROW(ri, h) -> ri++
    :: else -> break
    od;
    ri = 0; rk = 0; rn = 0
}

/* permit_release(name, holder, slot, fence) (0014): every slot of the holder, while it
   holds slot s with fence f (f 0: any tenure, as permit_release(name, holder)); the
   slots are this tenure's, so each is released as its own. MUT_RELEASE_HOLDER_ONLY:
   the release before 0014, matched on the holder alone. */
#ifdef MUT_RELEASE_HOLDER_ONLY
#define RELEASE_TENURE(f) 0
#else
#define RELEASE_TENURE(f) (f)
#endif
inline permit_release(h, f, s) {
    rk = (RELEASE_TENURE(f) == 0 || (HOLDS_ROW(s, h) && tab[s].fence == f));
    ri = 0;
    do
    :: rk && ri < NR ->
        load(ri); lease_release(h, 0, 0, rn);
#ifdef MUT_PERMIT_RELEASE_RESETS
        /* the slot back to its default (holder NULL, fence 0), as a slot never granted */
        if
        :: rn -> row.holder = 0; row.fence = 0
        :: else -> skip
        fi;
#endif
        store(); ri++
    :: else -> break
    od;
    ri = 0; rk = 0; rn = 0
}

/* permit_holds(name, holder, fence) on the holder's slot s: lease_holds' decision and
   its FOR KEY SHARE lock, which every grant of the slot waits for (skips). */
inline permit_holds(h, f, s, ok) {
    load(s); lease_holds(h, f, ok); store()
}

/* ---- Several names (0008: lease_claim_all, lease_release_all; 0009: renewal) ---- */

#ifdef CLAIM_CONTINUES
/* A name in the way of holder h: unexpired, and released (resting) or another's. */
#define IN_WAY(r, h) (tab[r].exists && tab[r].left > 0 && (tab[r].released || tab[r].holder != (h)))
#else
/* A name in the way of a new tenure of holder h: unexpired, whoever's, its own too
   (another process uses this holder). */
#define IN_WAY(r, h) (tab[r].exists && tab[r].left > 0)
#endif

/* lease_claim_all_new's grant of the locked row in `row`: a new name, or a new tenure,
   fence floored (CLAIM_CONTINUES: one still this holder's is extended with its fence,
   as lease_claim). The UPDATE itself has no condition: the recheck under the locks
   decides. */
inline claim_all_name(h, t) {
    if
    :: !row.exists -> row.exists = 1; row.fence = FLOOR; new_tenure(h, t, KIND_CLAIM)
#ifdef CLAIM_CONTINUES
    :: row.exists && !row.released && row.holder == h -> row.ttl = t; RECLAIM_EXPIRY(t)
    :: row.exists && (row.released || row.holder != h) ->
#else
    :: row.exists ->
#endif
        row.fence = NEXT_FENCE; new_tenure(h, t, KIND_CLAIM)
    fi
}

/* lease_claim_all's last step, every row locked: recheck (a name in the way is busy,
   and the statement rolls back), then grant every name. outa, outb: the fences of A
   and B, or BUSY. (Fences do not run out in the model's runs.) */
inline claim_all_grant(h, t, outa, outb) {
#ifdef MUT_CLAIM_ALL_NO_RECHECK
    if
    :: false -> skip
#else
    if
    :: IN_WAY(0, h) || IN_WAY(1, h) -> outa = BUSY; outb = BUSY
#endif
    :: else ->
        load(0); claim_all_name(h, t); outa = row.fence; store();
        load(1); claim_all_name(h, t); outb = row.fence; store()
    fi
}

/* pylease_renew_held over names (the keeper's renewal of a tenure of several names):
   each name renewed on its own, in the tenure its fence names (fa: A's, fb: B's; 0:
   any); the tenure is kept only when all were, for the earliest span granted.
   `which`: 1 A, 2 B, 3 both. */
inline renew_names(h, which, t, fa, fb, ok, granted) {
    ok = 1; granted = 0; ri = 0;
    do
    :: ri < NR && ((which >> ri) & 1) ->
        if
        :: ri == 0 -> rq = fa
        :: else -> rq = fb
        fi;
        load(ri); lease_renew(h, t, rq, rk, rn); store();
        ok = ok && rk;
        granted = (granted == 0 -> rn : (rn < granted -> rn : granted)); ri++
    :: ri < NR && !((which >> ri) & 1) -> ri++
    :: else -> break
    od;
    if
    :: !ok -> granted = 0
    :: else -> skip
    fi;
    ri = 0; rk = 0; rn = 0; rq = 0
}

/* lease_release_all(names, holder, fences) (which = 3, 0014: each name in the tenure
   its fence names, fa A's and fb B's; MUT_RELEASE_HOLDER_ONLY: the release before
   0014, matched on the holder alone), or one name's lease_release(name, holder, NULL,
   fence). */
inline release_names(h, which, fa, fb) {
    ri = 0;
    do
    :: ri < NR && ((which >> ri) & 1) ->
        if
        :: ri == 0 -> rq = fa
        :: else -> rq = fb
        fi;
#ifdef MUT_RELEASE_HOLDER_ONLY
        if
        :: which == 3 -> rq = 0
        :: else -> skip
        fi;
#endif
        load(ri); lease_release(h, 0, rq, rk); store(); ri++
    :: ri < NR && !((which >> ri) & 1) -> ri++
    :: else -> break
    od;
    ri = 0; rk = 0; rq = 0
}
