"""Section 15: readers of one name against holders of as many separate names (issue 25).

Worker processes cycle a claim and its release as fast as they can, one connection
each, in interleaved rounds of three configurations:

- every worker a reader of one name, through the contract's SQL
  (``lease_claim_shared``, then ``lease_release`` naming the epoch);
- every worker a reader of one name, as the Python API sends it
  (``pylease_claim_shared`` for a new share, then ``pylease_release_share``);
- every worker the exclusive holder of a name of its own (``lease_claim``, then
  ``lease_release`` naming the fence): the throughput readers that never wait for each
  other should come close to.

No writer comes, so no claim is busy; a busy answer is counted, not waited for.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection as Pipe

import psycopg

from benchmarks._core import Context, Section, Target, unique
from benchmarks._stats import fmt_rate, summary
from benchmarks.contention import Workers
from benchmarks.sql_level import TTL

READERS = 8
SHARED = "contract"  # lease_claim_shared + lease_release(..., epoch)
SHARE = "python"  # pylease_claim_shared(new share) + pylease_release_share
EXCLUSIVE = "exclusive"  # lease_claim + lease_release(..., fence) on a name of its own
LABELS = {
    SHARED: "{n} readers of one name (lease_claim_shared + lease_release)",
    SHARE: "{n} readers of one name, as the Python API (pylease_claim_shared + "
    "pylease_release_share)",
    EXCLUSIVE: "{n} holders of {n} separate names (lease_claim + lease_release)",
}
STATEMENTS = {
    SHARED: ("SELECT lease_claim_shared(%s, %s, %s)", "SELECT lease_release(%s, %s, NULL, %s)"),
    SHARE: (
        "SELECT epoch, share FROM pylease_claim_shared(%s, %s, %s, true)",
        "SELECT pylease_release_share(%s, %s, %s, %s)",
    ),
    EXCLUSIVE: ("SELECT lease_claim(%s, %s, %s)", "SELECT lease_release(%s, %s, NULL, %s)"),
}


def worker(dsn: str, index: int, pipe: Pipe) -> None:
    """Serve ``([kind, *names], seconds, start_at)``: cycle on ``names[index % len(names)]``."""
    conn = psycopg.connect(dsn, autocommit=True, application_name=f"pylease-bench-r{index}")
    holder = f"bench-r{index}-{os.getpid()}"
    cur = conn.cursor()
    pipe.send("ready")
    while (command := pipe.recv()) is not None:
        (kind, *names), seconds, start_at = command
        name = names[index % len(names)]
        claim, release = STATEMENTS[kind]
        time.sleep(max(0.0, start_at - time.monotonic()))
        deadline = start_at + seconds
        cycles = busy = 0
        while time.monotonic() < deadline:
            cur.execute(claim, (name, TTL, holder))
            row = cur.fetchone()
            if row is None or row[0] is None:
                busy += 1
                continue
            cur.execute(release, (name, holder, *row))
            cur.fetchone()
            cycles += 1
        pipe.send((cycles, busy, 0, 0, time.monotonic() - start_at))
    conn.close()


def bench_readers(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "readers",
        f"15. Readers: {READERS} readers of one name vs {READERS} holders of "
        f"{READERS} separate names",
        header=["configuration", "cycles/s: median [min..max]", "busy claims"],
    )
    count = min(READERS, max(s.workers))
    one = [unique("read")]
    separate = [f"{unique('own')}-{i}" for i in range(count)]
    kinds = [SHARED, SHARE, EXCLUSIVE]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    busy: dict[str, int] = dict.fromkeys(kinds, 0)
    pool = Workers(ctx.dsn, count, target=worker)
    try:
        for r in range(s.contention_rounds):
            for kind in kinds if r % 2 == 0 else list(reversed(kinds)):
                names = separate if kind == EXCLUSIVE else one
                results = pool.run(count, [kind, *names], s.contention_seconds)
                elapsed = max(res[4] for res in results)
                rates[kind].append(sum(res[0] for res in results) / elapsed)
                busy[kind] += sum(res[1] for res in results)
    finally:
        pool.close()
    stats = {k: summary(v) for k, v in rates.items()}
    for kind in kinds:
        st = stats[kind]
        section.rows.append(
            [
                LABELS[kind].format(n=count),
                f"{fmt_rate(st['median'])} [{st['min']:,.0f}..{st['max']:,.0f}]",
                f"{busy[kind]}",
            ]
        )
    for kind, key, what in (
        (SHARED, f"15-readers-{count}", "the contract's SQL"),
        (SHARE, f"15-readers-{count}-python", "the Python API's statements"),
    ):
        ratio = summary([a / b for a, b in zip(rates[kind], rates[EXCLUSIVE], strict=True)])
        section.targets.append(
            Target(
                key,
                f"{count} readers of one name vs {count} holders of {count} separate names "
                f"({what})",
                "cycles/s of the readers / cycles/s of the separate holders, paired by round",
                goal=0.8,
                higher_is_better=True,
                value=ratio["median"],
                detail=f"{fmt_rate(stats[kind]['median'])} vs "
                f"{fmt_rate(stats[EXCLUSIVE]['median'])}",
            )
        )
    section.notes.append(
        "No writer comes, so every claim is granted. The readers lock their name's one "
        "row FOR KEY SHARE together (a MultiXact while two claims are in flight) and each "
        "insert and delete a row of their own; the separate holders update a row each. "
        "Every claim commits with a WAL flush, which on a small machine bounds both."
    )
    section.data = {
        "workers": count,
        "cycles_per_second": stats,
        "rounds": rates,
        "busy_claims": busy,
    }
    return section
