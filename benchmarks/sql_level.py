"""Sections 1, 2 and 4: the SQL API on one connection, against plain-SQL floors.

Statements are sent the way a driver sends them: psycopg's extended protocol,
parameters bound, prepared after a few executions (as pylease's own backend does).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from benchmarks._core import Context, Section, Target, holder_id, unique
from benchmarks._stats import Contender, clock, fmt_time, interleave, spread_text, summary

CLAIM = "SELECT lease_claim(%s, %s, %s)"
RELEASE = "SELECT lease_release(%s, %s)"
RENEW = "SELECT lease_renew(%s, %s)"
RENEW_MANY = "SELECT name, renewed FROM lease_renew_many(%s, %s)"
FLOOR_UPDATE = "UPDATE bench_floor SET n = n + 1 WHERE id = 1"
TTL = timedelta(seconds=30)
NOOP_LABEL = "no-op SECURITY DEFINER PL/pgSQL call"


def sql_cycle(
    conn: psycopg.Connection[Any],
    name: str,
    holder: str,
    split: dict[str, list[float]] | None = None,
) -> Any:
    """A contender: claim + release of one name on one connection, n times.

    With ``split``, the claims' and the releases' own times are added to it, per round.
    """

    def run(n: int) -> float:
        cur = conn.cursor()
        refused = 0
        claiming = 0.0
        start = clock()
        for _ in range(n):
            t0 = clock()
            cur.execute(CLAIM, (name, TTL, holder))
            if cur.fetchone()[0] is None:  # type: ignore[index]
                refused += 1
            claiming += clock() - t0
            cur.execute(RELEASE, (name, holder))
            cur.fetchone()
        elapsed = clock() - start
        if refused:
            raise RuntimeError(f"bench: {refused} uncontended claims of {name!r} were refused")
        if split is not None:
            split.setdefault("claim", []).append(claiming / n)
            split.setdefault("release", []).append((elapsed - claiming) / n)
        return elapsed

    return run


def bench_cycle(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "cycle",
        "1. Cycle: lease_claim + lease_release vs two single-row UPDATE commits",
        header=["contender", "per cycle: median [min..max]", "cycles/s", "vs floor"],
    )
    split: dict[str, list[float]] = {}
    with ctx.connect() as lease_conn, ctx.connect() as floor_conn, ctx.connect() as nf_conn:
        nf_conn.execute("SET synchronous_commit = off")

        def floor(conn: psycopg.Connection[Any]) -> Any:
            def run(n: int) -> float:
                cur = conn.cursor()
                start = clock()
                for _ in range(n):
                    cur.execute(FLOOR_UPDATE)
                    cur.execute(FLOOR_UPDATE)
                return clock() - start

            return run

        contenders = [
            Contender(
                "pylease cycle",
                sql_cycle(lease_conn, unique("cycle"), holder_id("c"), split),
                s.cycle_ops,
            ),
            Contender("floor: 2 UPDATE commits", floor(floor_conn), s.cycle_ops),
            Contender("2 UPDATE commits, no WAL flush", floor(nf_conn), s.cycle_ops),
        ]
        result = interleave(contenders, s.rounds)

    floor_label, cycle_label, nf_label = (
        contenders[1].label,
        contenders[0].label,
        contenders[2].label,
    )
    speedups = result.paired_ratios(floor_label, cycle_label)
    floor_med, cycle_med, nf_med = (result.median(x) for x in (floor_label, cycle_label, nf_label))
    for label in result.labels:
        med = result.median(label)
        section.rows.append(
            [
                label,
                spread_text(result.summary(label)),
                f"{1 / med:,.0f}",
                f"{floor_med / med:.2f}x",
            ]
        )
    flush = max(0.0, (floor_med - nf_med) / 2)
    # The warm-up round is in split too: drop it.
    claim_med, release_med = (
        summary(split[k][1:] or split[k])["median"] for k in ("claim", "release")
    )
    section.notes.append(
        f"Within the cycle, lease_claim took {fmt_time(claim_med)} (it waits for the flush) and "
        f"lease_release {fmt_time(release_med)} (it does not); one UPDATE commit took "
        f"{fmt_time(floor_med / 2)} with its flush and {fmt_time(nf_med / 2)} without. So each "
        f"lease function costs about {fmt_time(claim_med - floor_med / 2)} (claim) and "
        f"{fmt_time(release_med - nf_med / 2)} (release) more than a plain one-row UPDATE."
    )
    section.notes.append(
        f"In this run one WAL flush cost about {fmt_time(flush)} and a round trip with a "
        f"one-row UPDATE about {fmt_time(nf_med / 2)}. The floor pays two flushes; the cycle pays "
        "one (the claim's), since the release commits without waiting for the flush. The best "
        f"a cycle of two statements can do here is about {floor_med / (nf_med + flush):.2f}x."
    )
    # floor(F) = nf + 2F and cycle(F) = (cycle - flush) + F: the flush cost F at which
    # the cycle would reach the goal, with the statements costing what they did here.
    unflushed = cycle_med - flush
    needed = max(0.0, (1.2 * unflushed - nf_med) / 0.8)
    section.notes.append(
        f"With these statement costs the cycle reaches 1.2x the floor where one WAL flush costs "
        f"at least {fmt_time(needed)}; here it cost {fmt_time(flush)}."
    )
    section.notes.append(
        f"Issue 13's compass for the cycle is 1.25x the floor; this run: "
        f"{floor_med / cycle_med:.2f}x. Section 9 splits what each function costs beyond "
        "a plain UPDATE."
    )
    section.data["flush_needed_for_goal_seconds"] = needed
    section.targets.append(
        Target(
            "1-cycle",
            "Cycle vs two UPDATE commits",
            "floor time / cycle time (median of paired rounds)",
            goal=1.2,
            higher_is_better=True,
            value=summary(speedups)["median"],
            detail=f"cycle {fmt_time(cycle_med)}, floor {fmt_time(floor_med)}",
        )
    )
    section.data |= {
        "per_op_seconds": {k: result.summary(k) for k in result.labels},
        "speedup_rounds": speedups,
        "wal_flush_seconds": flush,
        "claim_seconds": claim_med,
        "release_seconds": release_med,
    }
    return section


def bench_busy(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "busy",
        "2. Busy claim vs SELECT 1",
        header=["contender", "per call: median [min..max]", "vs SELECT 1"],
    )
    name = unique("busy")
    with ctx.connect() as owner, ctx.connect() as conn:
        if (
            owner.execute(CLAIM, (name, timedelta(hours=1), holder_id("owner"))).fetchone()[0]
            is None
        ):  # type: ignore[index]
            raise RuntimeError("bench: could not claim the busy lease")
        holder = holder_id("busy")

        def busy(n: int) -> float:
            cur = conn.cursor()
            granted = 0
            start = clock()
            for _ in range(n):
                cur.execute(CLAIM, (name, TTL, holder))
                if cur.fetchone()[0] is not None:  # type: ignore[index]
                    granted += 1
            elapsed = clock() - start
            if granted:
                raise RuntimeError("bench: a busy claim was granted")
            return elapsed

        def select1(n: int) -> float:
            cur = conn.cursor()
            start = clock()
            for _ in range(n):
                cur.execute("SELECT 1")
                cur.fetchone()
            return clock() - start

        def noop(n: int) -> float:
            cur = conn.cursor()
            start = clock()
            for _ in range(n):
                cur.execute("SELECT bench_noop(%s, %s, %s)", (name, TTL, holder))
                cur.fetchone()
            return clock() - start

        result = interleave(
            [
                Contender("busy lease_claim", busy, s.busy_ops),
                Contender("SELECT 1", select1, s.busy_ops),
                Contender(NOOP_LABEL, noop, s.busy_ops),
            ],
            s.rounds,
        )
    ratios = result.paired_ratios("busy lease_claim", "SELECT 1")
    base = result.median("SELECT 1")
    for label in result.labels:
        section.rows.append(
            [label, spread_text(result.summary(label)), f"{result.median(label) / base:.2f}x"]
        )
    noop_ratio = result.median(NOOP_LABEL) / base
    section.notes.append(
        f"A PL/pgSQL function that does nothing, SECURITY DEFINER with its search_path pinned "
        f"(as every lease_* function must be), already costs {noop_ratio:.2f}x SELECT 1 here: "
        f"the call itself is {fmt_time(result.median(NOOP_LABEL) - base)} of the "
        f"{fmt_time(result.median('busy lease_claim') - base)} a busy claim adds to the round trip."
    )
    section.targets.append(
        Target(
            "2-busy",
            "Busy claim vs SELECT 1",
            "busy claim time / SELECT 1 time (median of paired rounds)",
            goal=1.3,
            higher_is_better=False,
            value=summary(ratios)["median"],
            detail=f"busy {fmt_time(result.median('busy lease_claim'))}, SELECT 1 {fmt_time(base)}",
        )
    )
    section.data = {
        "per_op_seconds": {k: result.summary(k) for k in result.labels},
        "ratio_rounds": ratios,
    }
    return section


def claim_many(conn: psycopg.Connection[Any], prefix: str, count: int, holder: str) -> list[str]:
    """Claim ``count`` names in one statement (set-up, not measured)."""
    names = [f"{prefix}-{i:05d}" for i in range(count)]
    row = conn.execute(
        "SELECT count(*) FROM unnest(%s::text[]) AS n"
        " WHERE lease_claim(n, '1 hour', %s) IS NOT NULL",
        (names, holder),
    ).fetchone()
    if row is None or row[0] != count:
        raise RuntimeError(f"bench: claimed {row} of {count} leases")
    return names


def bench_heartbeat(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "heartbeat",
        "4. Heartbeat: one lease_renew_many vs one lease_renew per lease; cost per tick",
        header=["contender", "renewing the leases: median [min..max]", "vs renew_many"],
    )
    holder = holder_id("hb")
    largest = max((*s.tick_sizes, s.renew_leases))
    with ctx.connect() as conn:
        names = claim_many(conn, unique("hb"), largest, holder)
        batch = names[: s.renew_leases]
        holders = [holder] * len(batch)

        def renew_many(n: int) -> float:
            cur = conn.cursor()
            start = clock()
            for _ in range(n):
                cur.execute(RENEW_MANY, (batch, holders))
                rows = cur.fetchall()
            elapsed = clock() - start
            if not all(r[1] for r in rows):
                raise RuntimeError("bench: renew_many lost a lease")
            return elapsed

        def renew_each(n: int) -> float:
            cur = conn.cursor()
            lost = 0
            start = clock()
            for _ in range(n):
                for name in batch:
                    cur.execute(RENEW, (name, holder))
                    if not cur.fetchone()[0]:  # type: ignore[index]
                        lost += 1
            elapsed = clock() - start
            if lost:
                raise RuntimeError("bench: lease_renew lost a lease")
            return elapsed

        many_label = f"1 lease_renew_many of {len(batch):,}"
        each_label = f"{len(batch):,} lease_renew calls"
        result = interleave(
            [Contender(many_label, renew_many, 1), Contender(each_label, renew_each, 1)],
            s.renew_rounds,
        )
        speedups = result.paired_ratios(each_label, many_label)
        base = result.median(many_label)
        for label in result.labels:
            section.rows.append(
                [label, spread_text(result.summary(label)), f"{result.median(label) / base:.1f}x"]
            )
        section.targets.append(
            Target(
                "4-heartbeat",
                f"renew_many of {len(batch):,} vs {len(batch):,} lease_renew",
                "time of the single calls / time of renew_many (median of paired rounds)",
                goal=20,
                higher_is_better=True,
                value=summary(speedups)["median"],
                detail=(
                    f"renew_many {fmt_time(base)}, one by one {fmt_time(result.median(each_label))}"
                ),
            )
        )

        # The cost of one heartbeat tick as the number of held leases grows.
        def tick(size: int) -> Any:
            subset, subset_holders = names[:size], [holder] * size

            def run(n: int) -> float:
                cur = conn.cursor()
                start = clock()
                for _ in range(n):
                    cur.execute(RENEW_MANY, (subset, subset_holders))
                    cur.fetchall()
                return clock() - start

            return run

        ticks = interleave(
            [Contender(f"{size}", tick(size), max(1, 200 // size)) for size in s.tick_sizes],
            s.rounds,
        )
    section.data |= {
        "per_op_seconds": {k: result.summary(k) for k in result.labels},
        "speedup_rounds": speedups,
        "tick_seconds": {k: ticks.summary(k) for k in ticks.labels},
    }
    tick_rows = []
    for size in s.tick_sizes:
        t = ticks.summary(str(size))
        tick_rows.append([f"{size:,}", spread_text(t), fmt_time(t["median"] / size)])
    section.extra.append(
        {
            "title": "Cost of one heartbeat tick (one lease_renew_many) by leases held",
            "header": ["held leases", "one tick: median [min..max]", "per lease"],
            "rows": tick_rows,
        }
    )
    return section
