"""Section 13: a group member's tick against the leases it stands for.

A member that owns 64 partitions is renewed, with each partition's lease, by the
keeper's one statement per tick (``pylease_renew_held``: one 'member' element and 64
'lease' elements, each in its tenure). Its floor is one ``lease_renew_many`` of 65
leases, the statement a keeper of 65 plain leases would send. Interleaved rounds on
one connection each.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks._core import Context, Section, Target, unique
from benchmarks._stats import Contender, fmt_time, interleave, spread_text, summary

PARTITIONS = 64
TTL = timedelta(minutes=10)
RENEW_HELD = (
    "SELECT count(*) FILTER (WHERE renewed) FROM pylease_renew_held("
    "%s::text[], %s::text[], %s::text[], %s::interval[], %s::bigint[], %s::integer[])"
)
RENEW_MANY = "SELECT count(*) FILTER (WHERE renewed) FROM lease_renew_many(%s, %s, %s, %s)"


def _claim(conn: psycopg.Connection[Any], name: str, holder: str) -> int:
    row = conn.execute("SELECT lease_claim(%s, %s, %s)", (name, TTL, holder)).fetchone()
    if row is None or row[0] is None:
        raise RuntimeError(f"bench: could not claim {name}")
    return int(row[0])


def member_tick(conn: psycopg.Connection[Any]) -> Any:
    group, member = unique("grp"), "member-1"
    row = conn.execute("SELECT group_join(%s, %s, %s)", (group, member, TTL)).fetchone()
    if row is None or row[0] is None:
        raise RuntimeError("bench: could not join the group")
    names = [group] + [f"{group}#{p}" for p in range(PARTITIONS)]
    fences = [int(row[0])] + [_claim(conn, n, member) for n in names[1:]]
    params = (
        ["member"] + ["lease"] * PARTITIONS,
        names,
        [member] * len(names),
        [TTL] * len(names),
        fences,
        [None] * len(names),
    )

    def run(n: int) -> float:
        cur = conn.cursor()
        start = time.perf_counter()
        for _ in range(n):
            cur.execute(RENEW_HELD, params)
            if cur.fetchone() != (len(names),):
                raise RuntimeError("bench: the member's tick renewed less than all it holds")
        return time.perf_counter() - start

    return run


def leases_tick(conn: psycopg.Connection[Any]) -> Any:
    holder = "holder-1"
    names = [f"{unique('many')}-{i}" for i in range(PARTITIONS + 1)]
    fences = [_claim(conn, n, holder) for n in names]
    params = (names, [holder] * len(names), TTL, fences)

    def run(n: int) -> float:
        cur = conn.cursor()
        start = time.perf_counter()
        for _ in range(n):
            cur.execute(RENEW_MANY, params)
            if cur.fetchone() != (len(names),):
                raise RuntimeError("bench: lease_renew_many renewed less than all")
        return time.perf_counter() - start

    return run


def bench_groups(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "groups",
        f"13. Groups: a member's tick with {PARTITIONS} partitions vs lease_renew_many of "
        f"{PARTITIONS + 1} leases",
        header=["contender", "per tick: median [min..max]", "ticks/s"],
    )
    member_label = f"member + {PARTITIONS} partitions (pylease_renew_held)"
    floor_label = f"lease_renew_many of {PARTITIONS + 1} leases"
    ops = max(1, s.cycle_ops // 4)
    with ctx.connect() as member_conn, ctx.connect() as floor_conn:
        result = interleave(
            [
                Contender(member_label, member_tick(member_conn), ops),
                Contender(floor_label, leases_tick(floor_conn), ops),
            ],
            s.rounds,
        )
    for label in result.labels:
        med = result.median(label)
        section.rows.append([label, spread_text(result.summary(label)), f"{1 / med:,.0f}"])
    ratio = summary(result.paired_ratios(member_label, floor_label))
    section.targets.append(
        Target(
            "13-member-tick",
            f"A member's tick with {PARTITIONS} partitions vs one lease_renew_many",
            "member tick time / lease_renew_many time (median of paired rounds)",
            goal=1.1,
            higher_is_better=False,
            value=ratio["median"],
            detail=f"member {fmt_time(result.median(member_label))}, "
            f"renew_many {fmt_time(result.median(floor_label))}",
        )
    )
    section.notes.append(
        "Rebalance time after a join and after a crash (issue 27) is not measured here yet; "
        "tests/api/test_groups_witness.py bounds it at two ttls."
    )
    section.data = {"per_op_seconds": {k: result.summary(k) for k in result.labels}}
    return section
