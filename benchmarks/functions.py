"""Section 9: what each lease function costs beyond a plain UPDATE, and what its parts cost.

The parts are measured by taking them out: the bench builds copies of the installed
lease_claim and lease_release in its own functions (``bench_*``), one without the
timeline floor of the fence (issue 12) and one without the counters and history
events (issue 15), and runs them interleaved with the real ones. Each contender also
reports its backend's CPU (``/proc/<pid>/schedstat``), which the neighbours' load
barely moves, beside the wall time, which it does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks._core import Context, Section, Target, holder_id, unique
from benchmarks._cpu import backend_pid, cpu_seconds
from benchmarks._stats import Contender, clock, fmt_time, interleave, spread_text, summary
from pylease import _checks
from pylease._resources import data_dir

TTL = timedelta(seconds=30)
UPDATE = "UPDATE bench_floor SET n = n + 1 WHERE id = 1"
FLOOR_EXPR = (
    "((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1"
)
HISTORY_READ = "current_setting('pylease.history', true)"
CLAIM_COUNTERS = re.compile(
    r",\s*grants\s*=\s*l\.grants \+ 1,\s*takeovers\s*=\s*l\.takeovers \+ CASE WHEN s_freed"
    r" THEN 0 ELSE 1 END"
)
# lease_claim's three arguments: the body's new_tenure is false for it, its data NULL.
CLAIM_ARGS = (
    "new_tenure boolean, data jsonb)",
    "new_tenure boolean DEFAULT false, data jsonb DEFAULT NULL)",
)
RELEASE_COUNTERS = re.compile(r",\s*releases\s*=\s*l\.releases \+ 1")
# The guards the contract asks of every function, taken out for the "bare" copies: the
# pinned search_path of SECURITY DEFINER, the claim's bounded wait for a fenced
# transaction (lock_timeout and the exception block that makes it busy, and the check for
# a reader that came first), the release's
# NOTIFY and its flush skip (the bench runs without the flush on both sides anyway).
SECURITY = [
    (re.compile(r"\n SECURITY DEFINER"), ""),
    (re.compile(r"\n SET search_path TO [^\n]*"), ""),
]
CLAIM_GUARDS = [
    *SECURITY,
    (re.compile(r"\n SET lock_timeout TO [^\n]*"), ""),
    (
        re.compile(
            r"BEGIN\n"
            # (since 0024, the wait's bound under a statement_timeout and the check of a
            # snapshot older than READ COMMITTED's)
            r"(?:\s+IF current_setting\('statement_timeout'\) <> '0'\n"
            r"\s+OR current_setting\('transaction_isolation'\).*?\n\s+END IF;\n\s+END IF;\n)?"
            r"(\s+UPDATE pylease_leases AS l\n\s+SET fence.*?;\n)"
            # (and, since 0013, the check for readers granted while it waited)
            r".*?\s*EXCEPTION WHEN lock_not_available.*?END;\n",
            flags=re.S,
        ),
        r"\1",
    ),
]
RELEASE_GUARDS = [
    *SECURITY,
    (re.compile(r"ignored := pg_notify\('pylease', \w+\.name\);"), "NULL;"),
    (
        re.compile(
            r"ignored := CASE WHEN pg_current_xact_id_if_assigned\(\) IS NULL\s+"
            r"THEN set_config\('synchronous_commit', 'off', true\) END;"
        ),
        "",
    ),
]

DEFAULT = "cycle, history 'rare' (default)"
ALL = "cycle, history 'all'"
PLAIN = "cycle without counters and events"
NOFLOOR = "cycle without the fence floor"
BARE = "cycle without the contract's guards"
COMMIT = "one-row UPDATE commit"
COMMIT_NF = "one-row UPDATE commit, no WAL flush"
NOOP = "no-op SECURITY DEFINER PL/pgSQL call"
PREV = "cycle, 0003's functions"
ROW_GRANT = "plain UPDATE of a lease row's fence, no flush"
ROW_RELEASE = "plain UPDATE of a lease row's expiry, no flush"
BUSY, BUSY_PREV = "busy claim", "busy claim, 0003's"
EACH, EACH_PREV = "lease_renew_each of 10, no flush", "lease_renew_each of 10, no flush, 0003's"
# Migration 0004 made the functions cheaper; its rollback holds 0003's definitions,
# which the bench installs under its own names to measure before and after in one run.
PREVIOUS = ("pylease-0004-faster.rollback.sql",
            ("lease_claim", "lease_release", "lease_renew_each"))  # fmt: skip


def _definition(conn: psycopg.Connection[Any], signature: str) -> str:
    row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (signature,)).fetchone()
    assert row is not None
    return str(row[0])


def _variant(source: str, function: str, copy: str, edits: list[tuple[Any, str]]) -> str:
    """``source`` renamed to ``copy`` (its parameter labels too), with ``edits`` made.

    Each edit must apply: a copy that silently kept what it was meant to drop would
    make the comparison measure nothing.
    """
    text = re.sub(r"FUNCTION (\S+\.)?" + function + r"\(", f"FUNCTION {copy}(", source, count=1)
    text = text.replace(function + ".", copy + ".")
    for pattern, replacement in edits:
        if isinstance(pattern, str):
            if pattern not in text:
                raise RuntimeError(f"bench: {function} has no {pattern!r} to take out for {copy}")
            text = text.replace(pattern, replacement)
        else:
            text, n = pattern.subn(replacement, text)
            if not n:
                raise RuntimeError(f"bench: {function} has no {pattern.pattern!r} for {copy}")
    return text


def install_variants(conn: psycopg.Connection[Any]) -> None:
    """The bench's copies of lease_claim and lease_release, each with one part taken out.

    lease_claim's body is pylease_claim (migration 0012; lease_claim is an SQL function
    inlined into its caller's statement): its copies take lease_claim's three arguments.
    """
    claim = _definition(conn, "pylease_claim(text, interval, text, boolean, jsonb)")
    release = _definition(conn, "lease_release(text, text, interval)")
    for text in (
        _variant(claim, "pylease_claim", "bench_claim_nofloor", [CLAIM_ARGS, (FLOOR_EXPR, "1")]),
        _variant(
            claim,
            "pylease_claim",
            "bench_claim_plain",
            [CLAIM_ARGS, (CLAIM_COUNTERS, ""), (HISTORY_READ, "NULL::text")],
        ),
        _variant(
            release,
            "lease_release",
            "bench_release_plain",
            [(RELEASE_COUNTERS, ""), (HISTORY_READ, "NULL::text")],
        ),
        _variant(claim, "pylease_claim", "bench_claim_bare", [CLAIM_ARGS, *CLAIM_GUARDS]),
        _variant(release, "lease_release", "bench_release_bare", RELEASE_GUARDS),
    ):
        conn.execute(text)


def install_previous(conn: psycopg.Connection[Any]) -> bool:
    """0003's lease_claim, lease_release, lease_renew_each as bench_prev_*; False if gone."""
    path = data_dir("migrations", "postgres") / PREVIOUS[0]
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    for function in PREVIOUS[1]:
        m = re.search(
            r"CREATE OR REPLACE FUNCTION " + function + r"\(.*?\n\$\$;\n", text, flags=re.S
        )
        if m is None:
            return False
        copy = "bench_prev_" + function.removeprefix("lease_")
        conn.execute(_variant(m.group(0), function, copy, []))
    return True


class CpuMeter:
    """Per-call server CPU of one contender, gathered round by round beside its wall time."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.pid = backend_pid(conn)
        self.rounds: dict[str, list[float]] = {}

    def now(self) -> float | None:
        return cpu_seconds(self.pid)

    def add(self, key: str, seconds: float | None, n: int) -> None:
        if seconds is not None:
            self.rounds.setdefault(key, []).append(seconds / n)


def cycle(
    conn: psycopg.Connection[Any],
    claim_fn: str,
    release_fn: str,
    split: dict[str, list[float]],
    meter: CpuMeter,
    *,
    name: str | None = None,
    data: object = None,
) -> Callable[[int], float]:
    """Claim + release of one name, n times; claim and release timed apart (wall and CPU).

    With ``data``, each claim is the 4-argument one that records it with the grant, sent
    as pylease's Python API sends it: JSON text made once, cast to jsonb by the statement.
    """
    name, holder = name or unique("fn"), holder_id("fn")
    claim_args: tuple[Any, ...] = (name, TTL, holder)
    claim_sql = f"SELECT {claim_fn}(%s, %s, %s)"
    if data is not None:
        claim_args += (_checks.data(data),)
        claim_sql = f"SELECT {claim_fn}(%s, %s, %s, %s::jsonb)"
    release_sql = f"SELECT {release_fn}(%s, %s)"

    def run(n: int) -> float:
        cur = conn.cursor()
        claiming = releasing = 0.0
        cpu_claim = cpu_release = 0.0
        known = True
        for _ in range(n):
            c0 = meter.now()
            t0 = clock()
            cur.execute(claim_sql, claim_args)
            granted = cur.fetchone()
            t1 = clock()
            c1 = meter.now()
            cur.execute(release_sql, (name, holder))
            cur.fetchone()
            t2 = clock()
            c2 = meter.now()
            if granted is None or granted[0] is None:
                raise RuntimeError(f"bench: an uncontended {claim_fn} of {name!r} was refused")
            claiming += t1 - t0
            releasing += t2 - t1
            if c0 is None or c1 is None or c2 is None:
                known = False
            else:
                cpu_claim += c1 - c0
                cpu_release += c2 - c1
        split.setdefault("claim", []).append(claiming / n)
        split.setdefault("release", []).append(releasing / n)
        meter.add("claim", cpu_claim if known else None, n)
        meter.add("release", cpu_release if known else None, n)
        return claiming + releasing  # the CPU readings in between are not the cycle's

    return run


def single(
    conn: psycopg.Connection[Any], statement: str, meter: CpuMeter
) -> Callable[[int], float]:
    def run(n: int) -> float:
        cur = conn.cursor()
        c0 = meter.now()
        start = clock()
        for _ in range(n):
            cur.execute(statement)
        elapsed = clock() - start
        c1 = meter.now()
        meter.add("call", None if c0 is None or c1 is None else c1 - c0, n)
        return elapsed

    return run


def _median(values: list[float]) -> float:
    return float(summary(values)["median"]) if values else float("nan")


def bench_functions(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "functions",
        "9. Lease functions: cost over a plain UPDATE; the fence floor, counters and history",
        header=[
            "contender",
            "claim: median [min..max]",
            "release: median [min..max]",
            "server CPU claim / release",
        ],
    )
    with ctx.connect() as setup:
        install_variants(setup)
        previous = install_previous(setup)
        busy_name = unique("fn-busy")
        setup.execute("SELECT lease_claim(%s, '1 hour', 'bench-owner')", (busy_name,))
        each_names = [f"{busy_name}-{i}" for i in range(10)]
        for n in each_names:
            setup.execute("SELECT lease_claim(%s, '1 hour', 'bench-each')", (n,))
    labels = [DEFAULT, ALL, PLAIN, NOFLOOR, BARE] + ([PREV] if previous else [])
    splits: dict[str, dict[str, list[float]]] = {k: {} for k in labels}
    singles = [COMMIT, COMMIT_NF, ROW_GRANT, ROW_RELEASE, NOOP, BUSY, EACH] + (
        [BUSY_PREV, EACH_PREV] if previous else []
    )
    conns = {k: ctx.connect() for k in (*labels, *singles)}
    try:
        with conns[ALL].cursor() as cur:
            cur.execute("SET pylease.history = 'all'")
        # The claim waits for one flush like the UPDATE commit beside it, and on this
        # shared disk a flush varies by milliseconds: the difference between the two is
        # measured without it on both sides (and the flushed UPDATE is shown for scale).
        for k in conns:
            if k != COMMIT:
                conns[k].execute("SET synchronous_commit = off")
        meters = {k: CpuMeter(c) for k, c in conns.items()}
        functions = {
            DEFAULT: ("lease_claim", "lease_release"),
            ALL: ("lease_claim", "lease_release"),
            PLAIN: ("bench_claim_plain", "bench_release_plain"),
            NOFLOOR: ("bench_claim_nofloor", "lease_release"),
            BARE: ("bench_claim_bare", "bench_release_bare"),
            PREV: ("bench_prev_claim", "bench_prev_release"),
        }
        arrays = (
            "ARRAY[" + ", ".join(f"'{n}'" for n in each_names) + "]::text[], "
            "array_fill('bench-each'::text, ARRAY[10]), array_fill('1 hour'::interval, ARRAY[10])"
        )
        statements = {
            COMMIT: UPDATE,
            COMMIT_NF: UPDATE,
            NOOP: "SELECT bench_noop('x', '1 s', 'y')",
            # What a grant and a release write, as plain statements on the same table: a
            # new fence is a key change (a new index entry each), an expiry is HOT.
            ROW_GRANT: f"UPDATE pylease_leases SET fence = fence + 1 WHERE name = '{busy_name}'",
            ROW_RELEASE: "UPDATE pylease_leases SET expires_at = expires_at + interval '1 s'"
            f" WHERE name = '{busy_name}'",
            BUSY: f"SELECT lease_claim('{busy_name}', '30 s', 'bench-busy')",
            BUSY_PREV: f"SELECT bench_prev_claim('{busy_name}', '30 s', 'bench-busy')",
            EACH: f"SELECT count(*) FROM lease_renew_each({arrays})",
            EACH_PREV: f"SELECT count(*) FROM bench_prev_renew_each({arrays})",
        }
        contenders = [
            Contender(k, cycle(conns[k], *functions[k], splits[k], meters[k]), s.function_ops)
            for k in labels
        ]
        contenders += [
            Contender(k, single(conns[k], statements[k], meters[k]), s.function_ops)
            for k in singles
        ]
        result = interleave(contenders, s.function_rounds)
    finally:
        for c in conns.values():
            c.close()

    def wall(label: str, part: str) -> list[float]:
        return splits[label][part][1:] or splits[label][part]  # drop the warm-up round

    def cpu(label: str, part: str) -> list[float]:
        values = meters[label].rounds.get(part, [])
        return values[1:] or values

    for label in labels:
        cpu_text = (
            f"{fmt_time(_median(cpu(label, 'claim')))} / {fmt_time(_median(cpu(label, 'release')))}"
        )
        section.rows.append(
            [
                label,
                spread_text(summary(wall(label, "claim"))),
                spread_text(summary(wall(label, "release"))),
                cpu_text,
            ]
        )
    for label in singles:
        section.rows.append(
            [label, spread_text(result.summary(label)), "", fmt_time(_median(cpu(label, "call")))]
        )

    commit, commit_nf, noop = (result.median(k) for k in (COMMIT, COMMIT_NF, NOOP))
    claim, release = _median(wall(DEFAULT, "claim")), _median(wall(DEFAULT, "release"))
    cpu_commit_nf, cpu_noop = (_median(cpu(k, "call")) for k in (COMMIT_NF, NOOP))
    cpu_claim, cpu_release = _median(cpu(DEFAULT, "claim")), _median(cpu(DEFAULT, "release"))

    # Paired by round: neighbours in time share the noise.
    def paired(a: list[float], b: list[float]) -> list[float]:
        return [x - y for x, y in zip(a, b, strict=False)]

    commits_nf = result.per_op[COMMIT_NF]
    claim_extra = _median(paired(wall(DEFAULT, "claim"), commits_nf))
    release_extra = _median(paired(wall(DEFAULT, "release"), commits_nf))
    floor_wall = _median(paired(wall(DEFAULT, "claim"), wall(NOFLOOR, "claim")))
    floor_cpu = _median(paired(cpu(DEFAULT, "claim"), cpu(NOFLOOR, "claim")))

    def cycle_rounds(label: str) -> list[float]:
        return [c + r for c, r in zip(wall(label, "claim"), wall(label, "release"), strict=True)]

    plain = cycle_rounds(PLAIN)
    vs_default = [p / d for p, d in zip(plain, cycle_rounds(DEFAULT), strict=True)]
    vs_all = [p / a for p, a in zip(plain, cycle_rounds(ALL), strict=True)]

    if previous:
        before_after = []
        for what, old, new in (
            ("lease_claim (grant)", (PREV, "claim"), (DEFAULT, "claim")),
            ("lease_release", (PREV, "release"), (DEFAULT, "release")),
            ("lease_claim (busy)", (BUSY_PREV, "call"), (BUSY, "call")),
            ("lease_renew_each of 10", (EACH_PREV, "call"), (EACH, "call")),
        ):

            def walls(key: tuple[str, str]) -> list[float]:
                return wall(*key) if key[1] != "call" else result.per_op[key[0]]

            before_after.append(
                [
                    what,
                    fmt_time(_median(walls(old))),
                    fmt_time(_median(walls(new))),
                    fmt_time(_median(paired(walls(new), walls(old)))),
                    f"{fmt_time(_median(cpu(*old)))} / {fmt_time(_median(cpu(*new)))}",
                ]
            )
        section.extra.append(
            {
                "title": "Before and after migration 0004, in the same run (0003's definitions "
                "installed by the bench under its own names)",
                "header": ["function", "0003", "0004", "change (paired)", "server CPU 0003 / 0004"],
                "rows": before_after,
            }
        )

    guards = {
        part: (
            _median(paired(wall(DEFAULT, part), wall(BARE, part))),
            _median(paired(cpu(DEFAULT, part), cpu(BARE, part))),
        )
        for part in ("claim", "release")
    }
    row_grant, row_release = result.median(ROW_GRANT), result.median(ROW_RELEASE)
    cpu_row_grant, cpu_row_release = (_median(cpu(k, "call")) for k in (ROW_GRANT, ROW_RELEASE))
    section.notes.append(
        "Where the difference lies: the same UPDATEs run as plain statements on the lease "
        f"table cost {fmt_time(row_grant)} (a new fence: {fmt_time(cpu_row_grant)} of server "
        f"CPU) and {fmt_time(row_release)} (an expiry: {fmt_time(cpu_row_release)} CPU), "
        f"against {fmt_time(commit_nf)} ({fmt_time(cpu_commit_nf)} CPU) for the narrow floor "
        f"row. So of a claim's {fmt_time(claim - commit_nf)} over the floor, "
        f"{fmt_time(row_grant - commit_nf)} is the lease row itself (its width, its CHECKs, "
        "the grant's second index entry) and the rest the function; of a release's "
        f"{fmt_time(release - commit_nf)}, {fmt_time(row_release - commit_nf)} is the row."
    )
    bare_claim, bare_release = (_median(cpu(BARE, part)) for part in ("claim", "release"))
    section.notes.append(
        "Which cost is left, and why it cannot go. Taking out every guard the contract asks "
        "for (SECURITY DEFINER with its pinned search_path; the claim's lock_timeout and the "
        "exception block that turns a takeover blocked by a fenced transaction into busy; the "
        "release's NOTIFY and its flush skip) saves "
        f"{fmt_time(guards['claim'][0])} a claim ({fmt_time(guards['claim'][1])} of server "
        f"CPU) and {fmt_time(guards['release'][0])} a release "
        f"({fmt_time(guards['release'][1])} CPU), paired by round. What stays without them "
        f"(server CPU: a claim {fmt_time(bare_claim)}, a release {fmt_time(bare_release)}, "
        f"against {fmt_time(cpu_row_grant)} and {fmt_time(cpu_row_release)} for the same "
        "UPDATEs as plain statements) is PL/pgSQL itself: a claim is two statements through "
        "SPI, the read that decides busy without taking a row lock (so that a busy claim "
        "writes nothing) and the UPDATE that is granted only if the row is still as read, "
        "where the yardstick is one statement; each carries its own executor start-up, and "
        "the function's call, checks and result add the rest. Trying the UPDATE first and "
        "reading only when it changed nothing would move the second statement onto the busy "
        "path, the one thousands of contenders take (section 2's target leaves no room for "
        "it), and INSERT ... ON CONFLICT DO UPDATE locks the row even when its WHERE is "
        "false, so a busy claim would take a row lock and write WAL."
    )
    section.targets += [
        Target(
            "9-claim",
            "lease_claim over a one-row UPDATE commit (the flush, the same for both, left out)",
            "claim time - UPDATE commit time, neither flushed (median of paired rounds)",
            goal=40e-6,
            higher_is_better=False,
            unit="us",
            value=claim_extra,
            detail=f"claim {fmt_time(claim)}, UPDATE commit {fmt_time(commit_nf)} "
            f"({fmt_time(commit)} flushed); server CPU {fmt_time(cpu_claim)} vs "
            f"{fmt_time(cpu_commit_nf)}",
        ),
        Target(
            "9-release",
            "lease_release over a one-row UPDATE commit (neither flushed)",
            "release time - unflushed UPDATE commit time (median of paired rounds)",
            goal=45e-6,
            higher_is_better=False,
            unit="us",
            value=release_extra,
            detail=f"release {fmt_time(release)}, UPDATE commit {fmt_time(commit_nf)}; server "
            f"CPU {fmt_time(cpu_release)} vs {fmt_time(cpu_commit_nf)}",
        ),
        Target(
            "9-history-default",
            "Cycle with counters and 'rare' history vs without either",
            "cycle time without / cycle time with (median of paired rounds)",
            goal=0.97,
            higher_is_better=True,
            value=_median(vs_default),
            detail=f"with {fmt_time(_median(cycle_rounds(DEFAULT)))}, without "
            f"{fmt_time(_median(plain))}",
        ),
        Target(
            "9-history-all",
            "Cycle with counters and 'all' history vs without either",
            "cycle time without / cycle time with (median of paired rounds)",
            goal=0.9,
            higher_is_better=True,
            value=_median(vs_all),
            detail=f"with {fmt_time(_median(cycle_rounds(ALL)))}, without "
            f"{fmt_time(_median(plain))}",
        ),
    ]
    section.notes += [
        f"The fence's timeline floor costs {fmt_time(floor_wall)} a grant in wall time and "
        f"{fmt_time(floor_cpu)} of server CPU (claims with it minus the same claims without it, "
        "paired by round; a difference this small is within the rounds' spread, so read its "
        "sign with care).",
        "Every contender but the flushed UPDATE commit ran with synchronous_commit = off: the "
        "flush is the same one for a claim and an UPDATE commit, and on a shared disk its "
        "variation (milliseconds) would drown differences of microseconds. The history "
        "ratios compare the same number of flushes too. "
        f"Server CPU, which the neighbours' load moves much less than wall time: a claim "
        f"{fmt_time(cpu_claim)} against {fmt_time(cpu_commit_nf)} for the UPDATE commit "
        f"({fmt_time(cpu_claim - cpu_commit_nf)} more), a release {fmt_time(cpu_release)} against "
        f"{fmt_time(cpu_commit_nf)} ({fmt_time(cpu_release - cpu_commit_nf)} more). "
        f"A call of a PL/pgSQL function that does nothing, SECURITY DEFINER with its "
        f"search_path pinned, costs {fmt_time(cpu_noop)} of server CPU and {fmt_time(noop)} "
        "of wall time by itself.",
        "What the lease functions do that the UPDATE does not, and why it stays: the pinned "
        "search_path of a SECURITY DEFINER function (the contract's protection against "
        "hijacking; the server sets and restores it on every call), the argument test (one "
        "expression), the read that decides busy without a row lock (the busy path's whole "
        "cost), a grant's second index entry (the fence is a key column so that lease_holds' "
        "FOR KEY SHARE conflicts with every grant and with no renewal), the timeline floor, "
        "the counters, and the release's NOTIFY (the contract's wake-up for waiters, whose "
        "queue is written at commit).",
    ]
    section.data = {
        "per_op_seconds": {k: result.summary(k) for k in result.labels},
        "claim_seconds": {k: summary(wall(k, "claim")) for k in labels},
        "release_seconds": {k: summary(wall(k, "release")) for k in labels},
        "server_cpu_seconds": {
            k: {part: summary(v[1:] or v) for part, v in meters[k].rounds.items()} for k in meters
        },
        "claim_extra_seconds": claim_extra,
        "release_extra_seconds": release_extra,
        "fence_floor_seconds": {"wall": floor_wall, "server_cpu": floor_cpu},
        "history_ratio_rounds": {"default": vs_default, "all": vs_all},
    }
    return section
