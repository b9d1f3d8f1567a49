"""Eight processes hammer two names; a witness table shows the database kept order.

Each grant records its tenure with fenced writes (``... WHERE lease_holds(...)``):
a start row when granted, an end stamp when done. Some workers overrun their TTL
without renewing, so their late writes are stale and must not land. Tenure
bounds come from the database's clock, the only clock the leases use.
"""

from __future__ import annotations

import itertools
import multiprocessing
import random
import time
from datetime import timedelta
from typing import Any, NamedTuple

import psycopg

NAMES = ("alpha", "beta")
WORKERS = 8
HAMMER_SECONDS = 3.0

START = (
    "INSERT INTO witness (name, holder, fence, started_at)"
    " SELECT %(name)s, %(holder)s, %(fence)s, clock_timestamp()"
    " WHERE lease_holds(%(name)s, %(holder)s, %(fence)s)"
)
END = (
    "UPDATE witness SET ended_at = clock_timestamp()"
    " WHERE name = %(name)s AND fence = %(fence)s AND lease_holds(%(name)s, %(holder)s, %(fence)s)"
)
LATE = (
    "INSERT INTO witness (name, holder, fence, started_at, late)"
    " SELECT %(name)s, %(holder)s, %(fence)s, clock_timestamp(), true"
    " WHERE lease_holds(%(name)s, %(holder)s, %(fence)s)"
)


class Tenure(NamedTuple):
    name: str
    holder: str
    fence: int
    granted_at: Any  # the database's clock right after the grant, in its statement
    overran: bool  # slept past its TTL without renewing
    start_landed: bool
    end_landed: bool
    late_landed: bool  # a write after its own release
    released: bool  # its release found it still its own


def worker(dsn: str, index: int, barrier: Any, results: Any) -> None:
    """Claim, write fenced, hold (sometimes too long), write fenced, release; repeat."""
    rng = random.Random(index)
    tenures: list[Tenure] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait(timeout=60)
        stop = time.monotonic() + HAMMER_SECONDS
        seq = 0
        while time.monotonic() < stop:
            seq += 1
            # Two workers first overrun a lease of their own, which expires with
            # nobody taking it; a stale write there is refused by expiry alone.
            solo = index < 2 and not tenures
            name = f"solo-{index}" if solo else rng.choice(NAMES)
            holder = f"w{index}-{seq}"
            ttl = rng.uniform(0.3, 0.5)
            row = conn.execute(
                "SELECT lease_claim(%s, %s, %s), clock_timestamp()",
                (name, timedelta(seconds=ttl), holder),
            ).fetchone()
            assert row is not None
            fence, granted_at = row
            if fence is None:
                time.sleep(rng.uniform(0.005, 0.03))
                continue
            args = {"name": name, "holder": holder, "fence": fence}
            start_landed = conn.execute(START, args).rowcount == 1
            # A fifth of the contended tenures overrun too: taken over, or not.
            overran = solo or rng.random() < 0.2
            if overran:
                time.sleep(ttl + rng.uniform(0.05, 0.15))
            elif rng.random() < 0.5:
                time.sleep(ttl * 0.5)
                conn.execute("SELECT lease_renew(%s, %s)", (name, holder))
                time.sleep(ttl * rng.uniform(0.2, 0.5))
            else:
                time.sleep(rng.uniform(0.0, ttl * 0.6))
            end_landed = conn.execute(END, args).rowcount == 1
            released = conn.execute("SELECT lease_release(%s, %s)", (name, holder)).fetchone() == (
                True,
            )
            late_landed = conn.execute(LATE, args).rowcount == 1
            tenures.append(
                Tenure(
                    name,
                    holder,
                    fence,
                    granted_at,
                    overran,
                    start_landed,
                    end_landed,
                    late_landed,
                    released,
                )
            )
    results.put(tenures)


def test_eight_processes_two_names(conn: psycopg.Connection[Any], dsn: str) -> None:
    conn.execute(
        "CREATE TABLE witness (name text, holder text, fence bigint,"
        " started_at timestamptz, ended_at timestamptz, late boolean NOT NULL DEFAULT false)"
    )
    # Every grant and release is recorded, to count against the workers' own record.
    conn.execute(f"ALTER DATABASE \"{conn.info.dbname}\" SET pylease.history = 'all'")  # type: ignore[arg-type]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(dsn, i, barrier, results), daemon=True)
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    try:
        tenures = [t for _ in procs for t in results.get(timeout=90)]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    # Fences strictly increase per name in grant order, and each is granted once.
    for name in NAMES:
        grants = sorted((t for t in tenures if t.name == name), key=lambda t: t.granted_at)
        fences = [t.fence for t in grants]
        assert len(grants) >= 3, f"too few grants of {name!r} to prove anything: {fences}"
        assert fences == sorted(set(fences)), f"{name}: {fences}"
        assert conn.execute("SELECT fence FROM lease_status(%s)", (name,)).fetchone() == (
            fences[-1],
        )

    # No stale fenced write lands: not after an overrun, not after a release.
    overruns = [t for t in tenures if t.overran]
    assert sorted(t.name for t in overruns if t.name.startswith("solo-")) == ["solo-0", "solo-1"]
    assert [t for t in overruns if t.end_landed] == []
    assert [t for t in tenures if t.late_landed] == []
    assert conn.execute("SELECT count(*) FROM witness WHERE late").fetchone() == (0,)

    # What landed is what the workers saw land, and nothing else.
    rows = conn.execute(
        "SELECT name, holder, fence, started_at, ended_at FROM witness ORDER BY started_at"
    ).fetchall()
    landed = {(t.name, t.holder, t.fence) for t in tenures if t.start_landed}
    assert {(r[0], r[1], r[2]) for r in rows} == landed
    assert len(rows) == len(landed)
    ended = {(t.name, t.fence) for t in tenures if t.end_landed}
    assert {(r[0], r[2]) for r in rows if r[4] is not None} == ended

    # No two tenures of a name overlap: each ends before the next one starts.
    for name in NAMES:
        spans = [(r[2], r[3], r[4] or r[3]) for r in rows if r[0] == name]
        assert len(spans) >= 2, f"too few tenures of {name!r} landed"
        for (fence, start, end), (next_fence, next_start, _) in itertools.pairwise(spans):
            assert start <= end
            assert fence < next_fence, f"{name}: fence {next_fence} started after {fence}"
            assert end < next_start, f"{name}: tenure {fence} overlaps tenure {next_fence}"

    # The counters and the history tell the same story as the workers: one grant
    # per tenure, one release per release that found the lease its own.
    for name in {t.name for t in tenures}:
        mine = [t for t in tenures if t.name == name]
        ((grants, takeovers, steals, releases),) = conn.execute(
            "SELECT grants, takeovers, steals, releases FROM lease_counters(%s)", (name,)
        ).fetchall()
        assert (grants, steals) == (len(mine), 0), name
        assert releases == sum(t.released for t in mine), name
        events = conn.execute(
            "SELECT event, holder, fence FROM lease_history(%s, NULL, 10000)", (name,)
        ).fetchall()
        granted = sorted((h, f) for e, h, f in events if e in ("claimed", "taken_over"))
        assert granted == sorted((t.holder, t.fence) for t in mine), name
        assert takeovers == sum(e == "taken_over" for e, _, _ in events), name
        assert releases == sum(e == "released" for e, _, _ in events), name
