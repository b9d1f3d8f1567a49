"""Section 14: data on a lease, the cost of revision 3, and stepping down (issue 26).

- The claim + release cycle of one name with 200 bytes of data given to
  ``lease_claim`` (JSON text cast to jsonb, as the Python API sends it) against the
  same cycle without data, and the cycle on a name nobody
  watches against the same cycle on the revision-2 schema: migrations 0001 to 0007,
  installed by the bench in a schema of its own in the same database and called by
  their qualified names. So the second ratio is what all of revision 3 (every later
  migration) costs a name used only exclusively, never read, watched or given data:
  the target of the readers-and-writers issue (25) too. A cycle on a watched name is
  shown beside them. All four run interleaved, one connection each, and report their
  backend's CPU beside the wall time (section 9's ``cycle``).
- The time from ``lease_request_release`` to the first work of the next leader: two
  ``run_as_leader`` candidates take turns, the one that stepped down waiting behind
  the other, and each request lands at a random point of the leader's renewal interval.
"""

from __future__ import annotations

import json
import random
import threading
import time
from math import nan
from typing import Any

import psycopg
from psycopg import sql

from benchmarks._core import Context, Section, Target, unique
from benchmarks._stats import Contender, fmt_time, interleave, percentile, spread_text, summary
from benchmarks.functions import CpuMeter, _median, cycle
from pylease import Held, run_as_leader
from pylease._resources import data_dir

# What `pylease run` records (command, host, pid, user), padded to 200 bytes as text.
DATA_BYTES = 200
_RECORD = {"command": "", "host": "worker-7.example.internal", "pid": 48213, "user": "deploy"}
DATA = _RECORD | {
    "command": "/usr/bin/python -m app.jobs"
    + "x" * (DATA_BYTES - len(json.dumps(_RECORD)) - len("/usr/bin/python -m app.jobs"))
}
assert len(json.dumps(DATA)) == DATA_BYTES

# The last migration of revision 2; the bench installs it and those before it.
REVISION_2 = "pylease-0007-edges"
REVISION_2_SCHEMA = "bench_revision_2"

PLAIN = "cycle, no data, name nobody watches"
WITH_DATA = f"cycle, {DATA_BYTES} bytes of data"
REV2 = "cycle, revision 2's schema (0001-0007)"
WATCHED = "cycle, no data, watched name"

# The step-down: a leader's ttl (its renewal interval is a third of it), the pause that
# lets the candidate that stepped down campaign again (so a standby waits), and how
# long a handover may take before the section gives up.
STEP_TTL = 1.5
SETTLE = 0.2
HANDOVER_LIMIT = 10.0


def install_revision_2(conn: psycopg.Connection[Any]) -> str:
    """Migrations 0001 to 0007 in a schema of their own, made anew each run; returns the
    last migration there is, the one the installed schema is at."""
    folder = data_dir("migrations", "postgres")
    every = sorted(p for p in folder.glob("pylease-*.sql") if not p.name.endswith(".rollback.sql"))
    files = [p for p in every if p.stem <= REVISION_2]
    if not files or files[-1].stem != REVISION_2:
        raise RuntimeError(f"bench: no migration {REVISION_2} in {folder}")
    schema = sql.Identifier(REVISION_2_SCHEMA)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
    for path in files:
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(schema))
            conn.execute(path.read_text(encoding="utf-8"))
    return every[-1].stem


def bench_data(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "data",
        "14. Data on a lease: the cycle with data, against revision 2, and stepping down",
        header=[
            "contender",
            "per cycle: median [min..max]",
            "claim / release",
            "server CPU claim / release",
        ],
    )
    watched = unique("watched")
    with ctx.connect() as setup:
        latest = install_revision_2(setup)
        setup.execute("SELECT lease_watch(%s, 'bench-watcher', '1 hour')", (watched,))
    qualified = f"{REVISION_2_SCHEMA}.lease_claim", f"{REVISION_2_SCHEMA}.lease_release"
    # In this order the cycle without data runs next to both of its comparisons, round
    # after round (interleave reverses the order every other round).
    how: dict[str, tuple[tuple[str, str], dict[str, Any]]] = {
        WITH_DATA: (("lease_claim", "lease_release"), {"data": DATA}),
        PLAIN: (("lease_claim", "lease_release"), {}),
        REV2: (qualified, {}),
        WATCHED: (("lease_claim", "lease_release"), {"name": watched}),
    }
    splits: dict[str, dict[str, list[float]]] = {k: {} for k in how}
    conns = {k: ctx.connect() for k in how}
    try:
        # The claim's WAL flush is the same one on every side, and on a shared disk its
        # variation (milliseconds) drowns differences of microseconds: as in section 9,
        # the cycles are compared without it.
        for c in conns.values():
            c.execute("SET synchronous_commit = off")
        meters = {k: CpuMeter(c) for k, c in conns.items()}
        result = interleave(
            [
                Contender(k, cycle(conns[k], *fns, splits[k], meters[k], **kw), s.function_ops)
                for k, (fns, kw) in how.items()
            ],
            2 * s.function_rounds,  # short rounds, many of them: pairs that share the load
        )
    finally:
        for c in conns.values():
            c.close()

    def median(values: list[float]) -> float:
        return _median(values[1:] or values)  # the warm-up round left out

    def cpu_cycle(label: str) -> float:
        """Server CPU of one cycle (the warm-up round left out)."""
        return sum(median(meters[label].rounds.get(part, [])) for part in ("claim", "release"))

    for label in result.labels:
        split, cpu = splits[label], meters[label].rounds
        section.rows.append(
            [
                label,
                spread_text(result.summary(label)),
                f"{fmt_time(median(split['claim']))} / {fmt_time(median(split['release']))}",
                f"{fmt_time(median(cpu.get('claim', [])))} / "
                f"{fmt_time(median(cpu.get('release', [])))}"
                if cpu
                else "n/a",
            ]
        )

    def ratio_target(key: str, title: str, base: str, other: str, measure: str) -> Target:
        """``base``'s cycle time over ``other``'s, round by round; the goal is 0.95x."""
        ratio = summary(result.paired_ratios(base, other))
        return Target(
            key,
            title,
            f"{measure} (median of paired rounds)",
            goal=0.95,
            higher_is_better=True,
            value=ratio["median"],
            detail=f"{fmt_time(result.median(other))} vs {fmt_time(result.median(base))}; "
            f"server CPU {fmt_time(cpu_cycle(other))} vs {fmt_time(cpu_cycle(base))}",
        )

    data_target = ratio_target(
        "14-data",
        f"Cycle with {DATA_BYTES} bytes of data vs without",
        PLAIN,
        WITH_DATA,
        "cycle time without data / cycle time with it",
    )
    revision_target = ratio_target(
        "14-revision-3",
        "Cycle on a name nobody watches, no data, vs revision 2's schema "
        "(all of revision 3; issue 25's target too)",
        REV2,
        PLAIN,
        "revision 2's cycle time / this schema's",
    )
    section.targets += [data_target, revision_target]
    watched_ratio = summary(result.paired_ratios(PLAIN, WATCHED))
    section.notes.append(
        f"Revision 2's schema is migrations 0001 to 0007 in the schema {REVISION_2_SCHEMA} of "
        f"this database, so the ratio covers every migration since, up to {latest} (with "
        "0012's one claim body of issue 21). Every contender ran with synchronous_commit = "
        "off: a user's claim also waits for one WAL flush, the same on every side, which "
        "would bring each ratio closer to 1. The server CPU column is the part the "
        "neighbours' load moves least. "
        f"A watched name's cycle (NOTIFY pylease_holders on its grant and release) took "
        f"{1 / watched_ratio['median']:.2f}x the unwatched one's."
    )
    section.data = {
        "per_op_seconds": {k: result.summary(k) for k in result.labels},
        "claim_seconds": {k: summary(v["claim"][1:]) for k, v in splits.items()},
        "release_seconds": {k: summary(v["release"][1:]) for k, v in splits.items()},
        "server_cpu_seconds": {
            k: {part: summary(v[1:] or v) for part, v in m.rounds.items()}
            for k, m in meters.items()
        },
        "ratio_rounds": {
            "data": result.paired_ratios(PLAIN, WITH_DATA),
            "revision_2": result.paired_ratios(REV2, PLAIN),
            "watched": watched_ratio["values"],
        },
        "data_bytes": DATA_BYTES,
        "stepdown": bench_stepdown(ctx, section),
    }
    return section


class Terms:
    """The terms the candidates began, in order: (fence, when its work began, who), and
    when each term's work saw that it was asked to step down."""

    def __init__(self) -> None:
        self.began: list[tuple[int, float, str]] = []
        self.asked: dict[int, float] = {}
        self.changed = threading.Condition()
        self.failures: list[BaseException] = []

    def add(self, fence: int, who: str) -> None:
        with self.changed:
            self.began.append((fence, time.monotonic(), who))
            self.changed.notify_all()

    def after(self, fence: int, timeout: float) -> tuple[int, float, str] | None:
        """The first term with a fence above ``fence``, once one began."""

        def found() -> tuple[int, float, str] | None:
            return next((t for t in self.began if t[0] > fence), None)

        with self.changed:
            self.changed.wait_for(lambda: found() is not None or bool(self.failures), timeout)
            return found()


def candidate(ctx: Context, name: str, who: str, terms: Terms, stop: threading.Event) -> None:
    def work(term: Held) -> None:
        terms.add(term.fence, who)
        # The work a leader does until asked to step down; 2 ms between looks at it.
        while not (term.release_requested or term.lost or stop.is_set()):
            stop.wait(0.002)
        if term.release_requested:
            terms.asked.setdefault(term.fence, time.monotonic())

    try:
        run_as_leader(ctx.dsn, name, STEP_TTL, work, stop=stop)
    except BaseException as exc:
        with terms.changed:
            terms.failures.append(exc)
            terms.changed.notify_all()


def bench_stepdown(ctx: Context, section: Section) -> dict[str, Any]:
    interval = STEP_TTL / 3
    name, terms, stop = unique("stepdown"), Terms(), threading.Event()
    rng = random.Random(26)
    threads = [
        threading.Thread(
            target=candidate, args=(ctx, name, who, terms, stop), name=f"bench-{who}", daemon=True
        )
        for who in ("a", "b")
    ]
    latencies: list[float] = []
    learnt: list[float] = []  # from the request to the leader's work seeing it
    by_standby = 0
    for t in threads:
        t.start()
    try:
        with ctx.connect() as conn:
            current = terms.after(0, HANDOVER_LIMIT)
            for _ in range(ctx.scale.stepdowns):
                if current is None:
                    break
                time.sleep(SETTLE + rng.uniform(0, interval))
                asked = time.monotonic()
                row = conn.execute("SELECT lease_request_release(%s, 'bench')", (name,)).fetchone()
                if row is None or not row[0]:
                    raise RuntimeError("bench: lease_request_release found no leader")
                nxt = terms.after(current[0], HANDOVER_LIMIT)
                if nxt is None:
                    break
                latencies.append(nxt[1] - asked)
                if current[0] in terms.asked:
                    learnt.append(terms.asked[current[0]] - asked)
                by_standby += nxt[2] != current[2]
                current = nxt
    finally:
        stop.set()
        for t in threads:
            t.join(HANDOVER_LIMIT)
    if terms.failures:
        raise RuntimeError(f"bench: a candidate failed: {terms.failures[0]!r}")
    if len(latencies) < ctx.scale.stepdowns:
        raise RuntimeError(
            f"bench: {len(latencies)} of {ctx.scale.stepdowns} step-downs reached a new "
            f"leader within {HANDOVER_LIMIT:g} s"
        )
    p50, p90 = percentile(latencies, 50), percentile(latencies, 90)

    def spread(what: str, values: list[float]) -> list[str]:
        return [what] + [
            f"{fmt_time(v)} ({v / interval:.2f} intervals)"
            for v in (percentile(values, 50), percentile(values, 90), max(values, default=nan))
        ]

    section.extra.append(
        {
            "title": f"From lease_request_release, {len(latencies)} step-downs (ttl "
            f"{STEP_TTL:g} s, renewal interval {fmt_time(interval)}; {by_standby} taken over "
            "by the standby)",
            "header": ["until", "p50", "p90", "max"],
            "rows": [
                spread("the leader's work sees term.release_requested", learnt),
                spread("the next leader's work begins", latencies),
            ],
        }
    )
    section.targets.append(
        Target(
            "14-stepdown",
            "lease_request_release to the new leader's first work, in renewal intervals",
            "p50 of (first work of the next term - request) / renewal interval (ttl/3)",
            goal=2,
            higher_is_better=False,
            value=p50 / interval,
            detail=f"p50 {fmt_time(p50)}, p90 {fmt_time(p90)}, interval {fmt_time(interval)}, "
            f"{len(latencies)} step-downs",
        )
    )
    section.notes.append(
        "The step-down: two run_as_leader candidates in threads of this process (sharing its "
        "keeper and its listener); the leader's work looks at term.release_requested every "
        "2 ms and returns once it is set, the standby takes over, and the one that stepped "
        "down campaigns again behind it. A request waits for the leader's next renewal, so "
        "the time is spread over one renewal interval."
    )
    return {
        "ttl_seconds": STEP_TTL,
        "interval_seconds": interval,
        "latency_seconds": summary(latencies),
        "learnt_seconds": summary(learnt),
        "p50_seconds": p50,
        "p90_seconds": p90,
        "taken_over_by_standby": by_standby,
    }
