"""Section 12: permits and several names against the leases they replace.

- A permit's claim + release cycle against a lease's, one connection each, in
  interleaved rounds.
- Worker processes over one semaphore of 4 against the same workers over 4 separate
  leases (each cycle picks one at random): a semaphore must not cost its limit's
  worth of throughput. A busy claim waits for the ``pylease`` notification (at most
  50 ms), as in section 6.
- ``lease_claim_all`` of 10 names against 10 ``lease_claim`` calls in one
  transaction, each followed by its release (timed apart).
"""

from __future__ import annotations

import os
import random
import time
from multiprocessing.connection import Connection as Pipe
from typing import Any

import psycopg

from benchmarks._core import Context, Section, Target, holder_id, unique
from benchmarks._stats import Contender, fmt_rate, fmt_time, interleave, spread_text, summary
from benchmarks.contention import Workers
from benchmarks.sql_level import CLAIM, RELEASE, TTL, sql_cycle

LIMIT = 4
NAMES = 10
PERMIT_CLAIM = "SELECT slot, fence FROM permit_claim(%s, %s, %s, %s)"
PERMIT_RELEASE = "SELECT permit_release(%s, %s)"
CLAIM_ALL = "SELECT name, fence FROM lease_claim_all(%s, %s, %s)"
RELEASE_ALL = "SELECT name, released FROM lease_release_all(%s, %s)"
BUSY_WAIT = 0.05


def permit_cycle(conn: psycopg.Connection[Any], name: str, holder: str) -> Any:
    def run(n: int) -> float:
        cur = conn.cursor()
        start = time.perf_counter()
        for _ in range(n):
            cur.execute(PERMIT_CLAIM, (name, LIMIT, TTL, holder))
            if cur.fetchone() is None:
                raise RuntimeError("bench: an uncontended permit claim was refused")
            cur.execute(PERMIT_RELEASE, (name, holder))
            cur.fetchone()
        return time.perf_counter() - start

    return run


def claim_all(conn: psycopg.Connection[Any], names: list[str], holder: str) -> Any:
    def run(n: int) -> float:
        cur = conn.cursor()
        spent = 0.0
        for _ in range(n):
            start = time.perf_counter()
            cur.execute(CLAIM_ALL, (names, TTL, holder))
            granted = len(cur.fetchall())
            spent += time.perf_counter() - start
            if granted != len(names):
                raise RuntimeError("bench: an uncontended lease_claim_all was refused")
            cur.execute(RELEASE_ALL, (names, holder))
            cur.fetchall()
        return spent

    return run


def claims_in_one_transaction(conn: psycopg.Connection[Any], names: list[str], holder: str) -> Any:
    def run(n: int) -> float:
        cur = conn.cursor()
        spent = 0.0
        for _ in range(n):
            start = time.perf_counter()
            with conn.transaction():
                for name in names:
                    cur.execute(CLAIM, (name, TTL, holder))
                    if cur.fetchone()[0] is None:  # type: ignore[index]
                        raise RuntimeError("bench: an uncontended lease_claim was refused")
            spent += time.perf_counter() - start
            with conn.transaction():
                for name in names:
                    cur.execute(RELEASE, (name, holder))
                    cur.fetchone()
        return spent

    return run


def worker(dsn: str, index: int, pipe: Pipe) -> None:
    """Serve ``(names, seconds, start_at)``: one name is a semaphore of LIMIT, more are leases."""
    conn = psycopg.connect(dsn, autocommit=True, application_name=f"pylease-bench-p{index}")
    holder = f"bench-p{index}-{os.getpid()}"
    cur = conn.cursor()
    rng = random.Random(index)
    pipe.send("ready")
    while (command := pipe.recv()) is not None:
        names, seconds, start_at = command
        conn.execute("LISTEN pylease")
        time.sleep(max(0.0, start_at - time.monotonic()))
        deadline = start_at + seconds
        cycles = busy = 0
        semaphore = names[0] if len(names) == 1 else None
        while time.monotonic() < deadline:
            if semaphore is not None:
                cur.execute(PERMIT_CLAIM, (semaphore, LIMIT, TTL, holder))
                granted = cur.fetchone() is not None
                release, args = PERMIT_RELEASE, (semaphore, holder)
            else:
                name = rng.choice(names)
                cur.execute(CLAIM, (name, TTL, holder))
                granted = cur.fetchone()[0] is not None  # type: ignore[index]
                release, args = RELEASE, (name, holder)
            if not granted:
                busy += 1
                for _ in conn.notifies(timeout=BUSY_WAIT, stop_after=1):
                    pass
                continue
            cur.execute(release, args)
            cur.fetchone()
            cycles += 1
        elapsed = time.monotonic() - start_at
        conn.execute("UNLISTEN *")
        for _ in conn.notifies(timeout=0):
            pass
        pipe.send((cycles, busy, 0, 0, elapsed))
    conn.close()


def bench_permits(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "permits",
        "12. Permits and several names: against the leases they replace",
        header=["contender", "per operation: median [min..max]", "ops/s"],
    )
    names = [f"{unique('all')}-{i:02d}" for i in range(NAMES)]
    with ctx.connect() as lease_conn, ctx.connect() as permit_conn, ctx.connect() as all_conn:
        lease_label, permit_label = "lease cycle", f"permit cycle (semaphore of {LIMIT})"
        all_label, each_label = (
            f"lease_claim_all of {NAMES} names",
            f"{NAMES} lease_claim in one transaction",
        )
        cycles = interleave(
            [
                Contender(
                    lease_label, sql_cycle(lease_conn, unique("pl"), holder_id("l")), s.cycle_ops
                ),
                Contender(
                    permit_label,
                    permit_cycle(permit_conn, unique("pp"), holder_id("p")),
                    s.cycle_ops,
                ),
            ],
            s.rounds,
        )
        several = interleave(
            [
                Contender(all_label, claim_all(all_conn, names, holder_id("a")), s.cycle_ops // 4),
                Contender(
                    each_label,
                    claims_in_one_transaction(all_conn, names, holder_id("e")),
                    s.cycle_ops // 4,
                ),
            ],
            s.rounds,
        )
    for result in (cycles, several):
        for label in result.labels:
            med = result.median(label)
            section.rows.append([label, spread_text(result.summary(label)), f"{1 / med:,.0f}"])
    ratio = summary(cycles.paired_ratios(lease_label, permit_label))
    section.targets.append(
        Target(
            "12-permit-cycle",
            "Permit claim + release vs the lease cycle",
            "lease cycle time / permit cycle time (median of paired rounds)",
            goal=0.8,
            higher_is_better=True,
            value=ratio["median"],
            detail=f"permit {fmt_time(cycles.median(permit_label))}, "
            f"lease {fmt_time(cycles.median(lease_label))}",
        )
    )
    speedup = summary(several.paired_ratios(each_label, all_label))
    section.targets.append(
        Target(
            "12-claim-all",
            f"lease_claim_all of {NAMES} names vs {NAMES} claims in one transaction",
            "time of the separate claims / time of lease_claim_all (median of paired rounds)",
            goal=1.5,
            higher_is_better=True,
            value=speedup["median"],
            detail=f"claim_all {fmt_time(several.median(all_label))}, "
            f"separate {fmt_time(several.median(each_label))}",
        )
    )
    section.data = {
        "per_op_seconds": {k: r.summary(k) for r in (cycles, several) for k in r.labels},
        "semaphore": bench_semaphore(ctx, section),
    }
    return section


def bench_semaphore(ctx: Context, section: Section) -> dict[str, Any]:
    s = ctx.scale
    count = max(s.workers)
    semaphore = [unique("sem")]
    leases = [f"{unique('four')}-{i}" for i in range(LIMIT)]
    rates: dict[str, list[float]] = {"semaphore": [], "leases": []}
    pool = Workers(ctx.dsn, count, target=worker)
    try:
        for r in range(s.contention_rounds):
            order = ["semaphore", "leases"] if r % 2 == 0 else ["leases", "semaphore"]
            for kind in order:
                results = pool.run(
                    count, semaphore if kind == "semaphore" else leases, s.contention_seconds
                )
                elapsed = max(res[4] for res in results)
                rates[kind].append(sum(res[0] for res in results) / elapsed)
    finally:
        pool.close()
    ratios = [a / b for a, b in zip(rates["semaphore"], rates["leases"], strict=True)]
    ratio = summary(ratios)
    sem, four = summary(rates["semaphore"]), summary(rates["leases"])
    section.extra.append(
        {
            "title": f"{count} worker processes: one semaphore of {LIMIT} vs {LIMIT} leases",
            "header": ["over", "cycles/s: median [min..max]"],
            "rows": [
                [
                    f"one semaphore of {LIMIT}",
                    f"{fmt_rate(sem['median'])} [{sem['min']:,.0f}..{sem['max']:,.0f}]",
                ],
                [
                    f"{LIMIT} separate leases",
                    f"{fmt_rate(four['median'])} [{four['min']:,.0f}..{four['max']:,.0f}]",
                ],
            ],
        }
    )
    section.targets.append(
        Target(
            f"12-semaphore-{count}",
            f"{count} workers over one semaphore of {LIMIT} vs over {LIMIT} leases",
            "cycles/s over the semaphore / cycles/s over the leases, paired by round",
            goal=0.8,
            higher_is_better=True,
            value=ratio["median"],
            detail=f"{fmt_rate(sem['median'])} vs {fmt_rate(four['median'])}",
        )
    )
    return {"cycles_per_second": {k: summary(v) for k, v in rates.items()}, "ratio_rounds": ratios}
