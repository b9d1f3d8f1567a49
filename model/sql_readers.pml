/*
 * pylease's SQL of readers and writers (migrations 0013 and 0019, contract 5.2) on one
 * lease name: the lease row (sql.pml's `row`) and the readers' table, pylease_shared, as
 * the server runs it. Readers are clients 0..READERS-1, holders 1..READERS: share k is
 * holder k+1's.
 *
 * A reader's epoch is the fence of the name's latest exclusive grant (0 if none). A
 * reader holds while its share is unexpired and its epoch is still the name's fence. A
 * writer (sql.pml's lease_claim) is granted only when the row is free and no unexpired
 * share of its epoch remains (READERS_LIVE, defined here before sql.pml is read), and
 * its grant deletes the name's shares (DROP_SHARES). Each share has an id of its own
 * (0019), drawn when it is made; the readers' holders are explicit, so their claims
 * are pylease_claim_shared's new tenures, and their renewals and releases name the
 * share's epoch and id. Each call is one statement and runs atomically; the FOR KEY
 * SHARE lock a reader's claim and renewal take on the lease row only orders them
 * against an exclusive grant, which atomic statements already are.
 *
 * Not modelled: the queue of waiting processes (writer preference keeps new readers out
 * while a writer waits: a liveness matter; a reader granted while a writer waits is a
 * state the model reaches without it), a reader's release deleting a few expired shares
 * of others (it frees nothing that holds), lease_claim_shared's continuing claim (the
 * Python API claims a reader's explicit holder as a new tenure), history and counters.
 *
 * Included by pylease.pml after sql.pml, with READERS set. Mutants (-D):
 * MUT_WRITER_IGNORES_READERS, MUT_READER_IGNORES_WRITER, MUT_READER_RENEW_NO_EPOCH,
 * MUT_READER_NO_TAKEOVER, MUT_READER_RELEASE_BY_EPOCH;
 * MUT_HOLDS_NOLOCK (sql.pml's) drops a reader's lease_holds lock too.
 */

bool shx[READERS];      /* the share of holder k+1 exists */
byte shep[READERS];     /* its epoch */
byte shl[READERS];      /* expires_at - now while positive, as a row's `left` */
byte shid[READERS];     /* its id (0019): each new share draws the next */
byte nshare;            /* the last id drawn (pylease_share_ids) */

#define SH(h) ((h) - 1)

/* LIVE_SHARE(k), READERS_LIVE and DROP_SHARES are pylease.pml's, defined before
   sql.pml is read. */

/* A claim that grants answers the epoch + 1, as the model's BUSY is 0 (an epoch may be
   0: the fence of a name no writer was granted). */
#define EPOCH_ANSWER(e) ((e) + 1)

/* pylease_claim_shared(name, ttl, holder, new_tenure => true): the epoch (EPOCH_ANSWER)
   and the share's id, or BUSY. Busy while the lease row is unexpired: an exclusive
   holder holds it (or it rests after a min_hold release); and while this holder's own
   share of the epoch is unexpired (another process, or an earlier block whose release
   is on its way, uses the holder). A dead writer's expired row is marked released (its
   late renewal cannot make it hold again beside the reader); the share is a new one,
   with a new id, replacing this holder's expired row if any. A name's first claim by a
   reader makes the row, without a holder, released, fence 0. */
inline lease_claim_shared(h, t, out, sid) {
    sid = 0;
    if
#ifndef MUT_READER_IGNORES_WRITER
    :: row.exists && row.left > 0 -> out = BUSY   /* one read, no lock, no WAL */
#endif
    :: row.exists && LIVE_SHARE(SH(h)) -> out = BUSY   /* this holder's share is live */
    :: else ->
        if
        :: !row.exists ->
            row.exists = 1; row.released = 1; row.holder = 0; row.fence = 0;
            row.age = 0; row.left = 0; row.ttl = t
        :: else -> skip
        fi;
#ifndef MUT_READER_NO_TAKEOVER
        if
        :: !row.released && row.left == 0 -> row.released = 1  /* the takeover of a dead writer */
        :: else -> skip
        fi;
#endif
        nshare++;
        shx[SH(h)] = 1; shep[SH(h)] = row.fence; shl[SH(h)] = t; shid[SH(h)] = nshare;
        sid = nshare;
        out = EPOCH_ANSWER(row.fence)
    fi
}

/* pylease_renew_held's 'shared' element, naming its epoch and its share's id (slots[i]):
   the holder's share, while its epoch is still the name's fence and is the epoch named,
   and its id the one named, extended never earlier (an expired share of the current
   epoch too: no writer was granted since). MUT_READER_RENEW_NO_EPOCH: the share of the
   holder, whatever its epoch and id (the renewal before 0012). */
inline lease_renew_shared(h, t, e, s, ok, granted) {
    if
#ifdef MUT_READER_RENEW_NO_EPOCH
    :: shx[SH(h)] ->
#else
    :: shx[SH(h)] && shep[SH(h)] == row.fence && shep[SH(h)] == e && shid[SH(h)] == s ->
#endif
        shl[SH(h)] = MAX2(shl[SH(h)], t);
        ok = 1;
        granted = shl[SH(h)]
    :: else ->
        ok = 0;
        granted = 0
    fi
}

/* pylease_release_share(name, holder, epoch, share): deletes its share of that epoch
   with that id; true while it held. MUT_READER_RELEASE_BY_EPOCH: whatever the id, as
   lease_release(name, holder, NULL, epoch) does, and as the Python API released before
   0019: a late release of an earlier block deletes the later block's share. */
inline lease_release_shared(h, e, s, ok) {
    if
#ifdef MUT_READER_RELEASE_BY_EPOCH
    :: shx[SH(h)] && shep[SH(h)] == e ->
#else
    :: shx[SH(h)] && shep[SH(h)] == e && shid[SH(h)] == s ->
#endif
        ok = (shep[SH(h)] == row.fence);
        shx[SH(h)] = 0; shep[SH(h)] = 0; shl[SH(h)] = 0; shid[SH(h)] = 0
    :: else -> ok = 0
    fi
}

/* lease_holds(name, holder, epoch) of a reader: its share holds, of that epoch; the
   lease row is locked FOR KEY SHARE as for the exclusive holder, so that an exclusive
   grant waits for the fenced transaction. */
inline lease_holds_shared(h, e, ok) {
    ok = (row.exists && row.fence == e && LIVE_SHARE(SH(h)));
#ifndef MUT_HOLDS_NOLOCK
    if
    :: ok -> keylock++
    :: else -> skip
    fi
#endif
}
