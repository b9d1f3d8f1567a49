/*
 * The decision table: every row state x operation x argument class, decided by the
 * SQL inlines of sql.pml, printed one line each (spin -T decisions.pml).
 * `make model-check` fails unless the output equals decisions.tsv, and
 * tests/model/test_decisions.py replays decisions.tsv against PostgreSQL and SQLite.
 *
 * Times are ticks; the table runs at NOW = 10. Holders: "me" (the caller), "other".
 * The caller's fence argument is 5 (its tenure's), 4 (an earlier tenure's).
 */

#define STEPDOWN 1   /* lease_request_release (migration 0016) */
#include "sql.pml"

#define ME     1
#define OTHER  2
#define LONG   6
#define SHORT  2
#define LONGER 9
#define MIN_HOLD 6

#define NOW 10   /* the table's moment, in ticks */
#define N_STATES 9
#define N_OPS    14

byte out, acq, granted;
bool ok;

inline put_row(h, f, rel, a, e) {
    row.exists = 1; row.holder = h; row.fence = f; row.released = rel;
    row.age = NOW - a; row.ttl = LONG;
    if
    :: e > NOW -> row.left = e - NOW
    :: else -> row.left = 0
    fi
}

/* The row states, as tests/model/test_decisions.py writes them into pylease_leases. */
inline setup(s) {
    row.exists = 0; row.holder = 0; row.fence = 0; row.released = 0;
    row.age = 0; row.left = 0; row.ttl = 0;
    keylock = 0; req = 0; reqf = 0;
    if
    :: s == 0 -> printf("free")
    :: s == 1 -> printf("held_by_caller");  put_row(ME, 5, 0, 7, 13)
    :: s == 2 -> printf("held_by_other");   put_row(OTHER, 5, 0, 7, 13)
    :: s == 3 -> printf("expired_caller");  put_row(ME, 5, 0, 1, 7)
    :: s == 4 -> printf("expired_other");   put_row(OTHER, 5, 0, 1, 7)
    :: s == 5 -> printf("released");        put_row(ME, 5, 1, 1, 8)
    :: s == 6 -> printf("resting");         put_row(ME, 5, 1, 4, 14)
    :: s == 7 -> printf("stolen");          put_row(OTHER, 6, 0, 8, 14)
    :: s == 8 -> printf("exhausted");       put_row(OTHER, FENCE_MAX, 0, 1, 7)
    fi
}

inline say_fence(f) {
    if
    :: f == BUSY -> printf("NULL")
    :: f == EXHAUSTED -> printf("54000")
    :: f == FENCE_MAX -> printf("MAX")
    :: else -> printf("%d", f)
    fi
}

inline say_bool(b) {
    if
    :: b -> printf("t")
    :: else -> printf("f")
    fi
}

inline apply(o) {
    if
    :: o == 0  -> printf("\tclaim(me,ttl=6)\t");        lease_claim(ME, LONG, out, acq); say_fence(out)
    :: o == 1  -> printf("\tclaim(me,ttl=2)\t");        lease_claim(ME, SHORT, out, acq); say_fence(out)
    :: o == 2  -> printf("\trenew(me)\t");              lease_renew(ME, 0, 0, ok, granted); say_bool(ok)
    :: o == 3  -> printf("\trenew(me,ttl=2)\t");        lease_renew(ME, SHORT, 0, ok, granted); say_bool(ok)
    :: o == 4  -> printf("\trenew(me,ttl=9)\t");        lease_renew(ME, LONGER, 0, ok, granted); say_bool(ok)
    :: o == 5  -> printf("\trelease(me)\t");            lease_release(ME, 0, 0, ok); say_bool(ok)
    :: o == 6  -> printf("\trelease(me,min_hold=6)\t"); lease_release(ME, MIN_HOLD, 0, ok); say_bool(ok)
    :: o == 7  -> printf("\trelease(me,fence=5)\t");    lease_release(ME, 0, 5, ok); say_bool(ok)
    :: o == 8  -> printf("\trelease(me,fence=4)\t");    lease_release(ME, 0, 4, ok); say_bool(ok)
    :: o == 9  -> printf("\tsteal(me,ttl=6)\t");        lease_steal(ME, LONG, out); say_fence(out)
    :: o == 10 -> printf("\tholds(me,fence=5)\t");      lease_holds(ME, 5, ok); say_bool(ok)
    :: o == 11 -> printf("\trenew(me,fence=5)\t");      lease_renew(ME, 0, 5, ok, granted); say_bool(ok)
    :: o == 12 -> printf("\trenew(me,fence=4)\t");      lease_renew(ME, 0, 4, ok, granted); say_bool(ok)
    :: o == 13 -> printf("\trequest_release(me)\t");    lease_request_release(ok); say_bool(ok)
    fi
}

/* After the operation: holder, fence, lease_status's state, and expires_at - now in
   ticks when later than now, else 0. */
inline say_row() {
    if
    :: !row.exists -> printf("\t-\t-\t-\t-\n")
    :: row.exists ->
        if
        :: row.holder == ME -> printf("\tme\t")
        :: else -> printf("\tother\t")
        fi;
        out = row.fence;
        say_fence(out);
        if
        :: row.left > 0 && row.released -> printf("\tresting")
        :: row.left > 0 && !row.released -> printf("\theld")
        :: row.left == 0 && row.released -> printf("\treleased")
        :: row.left == 0 && !row.released -> printf("\texpired")
        fi;
        printf("\t%d\n", row.left)
    fi
}

init {
    byte s, o;
    printf("state\toperation\tresult\tholder\tfence\tstate_after\texpires_after\n");
    s = 0;
    do
    :: s < N_STATES ->
        o = 0;
        do
        :: o < N_OPS -> setup(s); apply(o); say_row(); o++
        :: else -> break
        od;
        s++
    :: else -> break
    od
}
