"""Section 13: a group member's tick against the leases it stands for.

A member that owns 64 partitions is renewed, with each partition's lease, by the
keeper's one statement per tick (``pylease_renew_held``: one 'member' element and 64
'lease' elements, each in its tenure). Its floor is one ``lease_renew_many`` of 65
leases, the statement a keeper of 65 plain leases would send. Interleaved rounds on
one connection each.

Rebalance time, in ttls: how long after a member joins, or after a member is killed
(SIGKILL, its membership left to expire), every partition is held by the member the
group's assignment gives it. The members are real ``partitions()`` blocks: two threads
of this process and a child process that is killed.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks._core import Context, Section, Target, unique
from benchmarks._stats import Contender, fmt_time, interleave, spread_text, summary
from pylease import _operations as ops
from pylease import partitions

PARTITIONS = 64
TTL = timedelta(minutes=10)
# Short, so that a killed member's expiry is waited out quickly; a member's keeper
# renews at a third of it.
REBALANCE_TTL = 2.0
# What a rebalance may take before the section fails, in ttls: a liveness bound.
REBALANCE_BOUND = 30
SETTLED = (
    "SELECT count(*) FROM group_assignment(%s, %s) AS a"
    " JOIN LATERAL lease_status(%s || '#' || a.part) AS s ON true"
    " WHERE s.held AND s.holder = a.member"
)
# The keeper's own statement, as it sends it (its arrays in binary), counted.
RENEW_HELD = f"SELECT count(*) FILTER (WHERE renewed) FROM ({ops.RENEW_HELD.postgres}) AS r"
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


def _member(dsn: str, grp: str, member: str, stop: threading.Event | None = None) -> None:
    """A member owning its partitions until ``stop`` (in a child process: until killed)."""
    with partitions(dsn, grp, PARTITIONS, ttl=REBALANCE_TTL, member=member):
        while stop is None:
            time.sleep(1)
        stop.wait()


def _ttls(value: float) -> str:
    return f"{value:.2f}"


def _settled(conn: psycopg.Connection[Any], grp: str, members: int) -> Callable[[], bool]:
    """Whether ``members`` are live and every partition is held by the member the
    assignment gives it."""

    def check() -> bool:
        live = conn.execute("SELECT count(*) FROM group_members(%s)", (grp,)).fetchone()
        if live != (members,):
            return False
        row = conn.execute(SETTLED, (grp, PARTITIONS, grp)).fetchone()
        return row is not None and row[0] == PARTITIONS

    return check


def _until(done: Callable[[], bool], what: str) -> float:
    """Seconds until ``done()``, polled every 10 ms."""
    start = time.perf_counter()
    while not done():
        if time.perf_counter() - start > REBALANCE_BOUND * REBALANCE_TTL:
            raise RuntimeError(f"bench: {what} did not settle within {REBALANCE_BOUND} ttls")
        time.sleep(0.01)
    return time.perf_counter() - start


def rebalances(ctx: Context, rounds: int) -> tuple[list[float], list[float]]:
    """Per round: the time from a join to the settled assignment, and from a member's
    SIGKILL to it, in ttls."""
    joins: list[float] = []
    crashes: list[float] = []
    spawn = multiprocessing.get_context("spawn")
    with ctx.connect() as conn:
        for _ in range(rounds):
            grp = unique("rebalance")
            stop = threading.Event()
            threads = [
                threading.Thread(target=_member, args=(ctx.dsn, grp, m, stop), daemon=True)
                for m in ("a", "b")
            ]
            child = spawn.Process(target=_member, args=(ctx.dsn, grp, "c"), daemon=True)
            try:
                threads[0].start()
                _until(_settled(conn, grp, 1), "the first member")
                threads[1].start()
                joins.append(_until(_settled(conn, grp, 2), "a join") / REBALANCE_TTL)
                child.start()
                _until(_settled(conn, grp, 3), "a third member's join")
                child.kill()
                crashes.append(_until(_settled(conn, grp, 2), "a kill") / REBALANCE_TTL)
            finally:
                if child.is_alive():
                    child.kill()
                stop.set()
                for t in threads:
                    t.join(timeout=REBALANCE_BOUND * REBALANCE_TTL)
    return joins, crashes


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
    joins, crashes = rebalances(ctx, s.rebalances)
    section.extra.append(
        {
            "title": f"Rebalance of {PARTITIONS} partitions, ttl {REBALANCE_TTL:g} s "
            f"({s.rebalances} rounds)",
            "header": ["change", "until settled, in ttls: median [min..max]"],
            "rows": [
                ["a member joins (2 members)", spread_text(summary(joins), _ttls)],
                ["a member is killed (3 to 2)", spread_text(summary(crashes), _ttls)],
            ],
        }
    )
    section.data = {
        "per_op_seconds": {k: result.summary(k) for k in result.labels},
        "rebalance_ttls": {"join": summary(joins), "crash": summary(crashes)},
    }
    return section
