"""Section 10: a fleet against one server (issue 13 item 5).

Renewals: holders x 10 leases, one lease_renew_each (then lease_renew_many) per holder
per tick, sent from a few processes, each with one connection, paced to the tick. The
server CPU is what those backends spent (``/proc/<pid>/schedstat``) per second of wall
time and per lease renewed; the latency is each renewal statement's round trip.

Waiters: threads of one process waiting with ``lease(..., wait=...)``, one per name:
the connections the process opened to the server, and lease_claim calls per grant
(``track_functions`` on the waiters' connections, read from pg_stat_user_functions).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import timedelta
from multiprocessing.connection import Connection as Pipe
from typing import Any

import psycopg
from psycopg import conninfo

from benchmarks._core import Context, Section, Target, holder_id, unique
from benchmarks._cpu import cpu_seconds
from benchmarks._stats import fmt_time, percentile
from benchmarks.contention import mp_context

LEASES_PER_HOLDER = 10
TTL = timedelta(seconds=60)
EACH = "SELECT count(*) FILTER (WHERE renewed) FROM lease_renew_each(%s, %s, %s)"
MANY = "SELECT count(*) FILTER (WHERE renewed) FROM lease_renew_many(%s, %s)"
TARGET_LEASES = 100_000  # issue 13: 10,000 holders x 10 leases
TARGET_TICK = 10.0  # seconds between a holder's renewals there
APP = "pylease-bench-waiters"


def renewer(dsn: str, holders: list[tuple[str, list[str]]], pipe: Pipe) -> None:
    """Renew each holder's leases once per tick, spread over the tick; report latencies."""
    conn = psycopg.connect(dsn, autocommit=True, application_name="pylease-bench-fleet")
    cur = conn.cursor()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    pipe.send(pid)
    while True:
        command = pipe.recv()
        if command is None:
            break
        statement, tick, seconds, start_at = command
        many = statement == "many"
        sql = MANY if many else EACH
        latencies: list[float] = []
        renewed = behind = 0
        slot = tick / max(1, len(holders))
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.monotonic()
        k = 0
        while True:
            due = t0 + k * slot
            if due - t0 >= seconds:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            elif wait < -tick:
                behind += 1
            holder, names = holders[k % len(holders)]
            params: tuple[Any, ...]
            if many:
                params = (names, [holder] * len(names))
            else:
                params = (names, [holder] * len(names), [TTL] * len(names))
            s0 = time.perf_counter()
            cur.execute(sql, params)
            row = cur.fetchone()
            latencies.append(time.perf_counter() - s0)
            renewed += int(row[0]) if row else 0
            k += 1
        pipe.send((latencies, renewed, time.monotonic() - t0, behind))
    conn.close()


def bench_fleet(ctx: Context) -> Section:
    section = Section(
        "fleet",
        "10. Fleet: many holders renewing against one server; many waiters in one process",
        header=[
            "statement",
            "holders x leases",
            "renewals/s",
            "server CPU",
            "per lease renewed",
            "renew p50 / p99",
        ],
    )
    holders_n = 40 if ctx.smoke else 1000
    procs_n = 2 if ctx.smoke else 4
    tick = 1.0 if ctx.smoke else 2.0
    seconds = 1.0 if ctx.smoke else 6.0
    prefix = unique("fleet")
    holders = [
        (holder_id(f"f{i}"), [f"{prefix}-{i:05d}-{j}" for j in range(LEASES_PER_HOLDER)])
        for i in range(holders_n)
    ]
    with ctx.connect() as conn:
        names = [n for _, ns in holders for n in ns]
        owners = [h for h, ns in holders for _ in ns]
        row = conn.execute(
            "SELECT count(*) FROM unnest(%s::text[], %s::text[]) AS u(n, h)"
            " WHERE lease_claim(u.n, '1 hour', u.h) IS NOT NULL",
            (names, owners),
        ).fetchone()
        if row is None or row[0] != len(names):
            raise RuntimeError(f"bench: claimed {row} of {len(names)} fleet leases")
    mp = mp_context()
    workers = []
    for p in range(procs_n):
        mine, theirs = mp.Pipe()
        proc = mp.Process(target=renewer, args=(ctx.dsn, holders[p::procs_n], theirs), daemon=True)
        proc.start()
        workers.append((proc, mine))
    try:
        pids = [pipe.recv() for _, pipe in workers]
        results: dict[str, dict[str, Any]] = {}
        for statement in ("each", "many"):
            start_at = time.time() + 0.5
            before = [cpu_seconds(pid) for pid in pids]
            for _, pipe in workers:
                pipe.send((statement, tick, seconds, start_at))
            replies = [pipe.recv() for _, pipe in workers]
            after = [cpu_seconds(pid) for pid in pids]
            wall = max(r[2] for r in replies)
            latencies = [x for r in replies for x in r[0]]
            renewed = sum(r[1] for r in replies)
            cpu: float | None = None
            if all(x is not None for x in (*before, *after)):
                cpu = sum(float(a or 0) - float(b or 0) for a, b in zip(after, before, strict=True))
            results[statement] = {
                "wall_seconds": wall,
                "calls": len(latencies),
                "renewed": renewed,
                "expected_renewals": int(holders_n * LEASES_PER_HOLDER * seconds / tick),
                "server_cpu_seconds": cpu,
                "p50": percentile(latencies, 50),
                "p99": percentile(latencies, 99),
                "late_calls": sum(r[3] for r in replies),
            }
    finally:
        for proc, pipe in workers:
            with contextlib.suppress(OSError):
                pipe.send(None)
            proc.join(timeout=10)
    for statement, r in results.items():
        cpu = r["server_cpu_seconds"]
        rate = r["renewed"] / r["wall_seconds"]
        per_lease = cpu / r["renewed"] if cpu is not None and r["renewed"] else None
        r["server_cpu_share_of_a_core"] = cpu / r["wall_seconds"] if cpu is not None else None
        r["server_cpu_per_lease_seconds"] = per_lease
        section.rows.append(
            [
                f"lease_renew_{statement}",
                f"{holders_n:,} x {LEASES_PER_HOLDER}",
                f"{rate:,.0f}",
                "n/a" if cpu is None else f"{cpu / r['wall_seconds']:.1%} of a core",
                "n/a" if per_lease is None else fmt_time(per_lease),
                f"{fmt_time(r['p50'])} / {fmt_time(r['p99'])}",
            ]
        )
    each = results["each"]
    target_rate = TARGET_LEASES / TARGET_TICK
    per_lease = each["server_cpu_per_lease_seconds"]
    section.notes.append(
        f"Scale run: {holders_n:,} holders x {LEASES_PER_HOLDER} leases "
        f"({holders_n * LEASES_PER_HOLDER:,} held), one renewal statement per holder every "
        f"{tick:g} s from {procs_n} processes for {seconds:g} s per statement: "
        f"{holders_n * LEASES_PER_HOLDER / tick:,.0f} renewals/s asked, "
        f"{each['renewed'] / each['wall_seconds']:,.0f}/s done with lease_renew_each "
        f"({each['late_calls']} calls more than a tick late). The target fleet, "
        f"{TARGET_LEASES:,} leases renewed every {TARGET_TICK:g} s, asks "
        f"{target_rate:,.0f} renewals/s"
        + (
            f": at the CPU per lease measured here that is {per_lease * target_rate:.0%} of one "
            "core (linear extrapolation: each renewal is an index lookup and a HOT update, so "
            "its cost barely depends on how many rows the table holds; the latency does not "
            "extrapolate, it was measured at this run's rate on this shared machine)."
            if per_lease is not None
            else "; the server's CPU could not be read here (the server is not local)."
        )
    )
    section.notes.append(
        "Server CPU counts the renewing backends only (their statements, commits and WAL "
        "inserts), not the WAL writer's or the checkpointer's share, nor the clients."
    )
    section.targets += [
        Target(
            "10-fleet-cpu",
            "Fleet: server CPU per lease renewed (lease_renew_each)",
            "renewing backends' CPU / leases renewed, at this run's scale",
            goal=35e-6,
            higher_is_better=False,
            unit="us",
            value=per_lease,
            detail=f"{holders_n * LEASES_PER_HOLDER:,} leases; extrapolated to "
            f"{TARGET_LEASES:,}: "
            + ("n/a" if per_lease is None else f"{per_lease * target_rate:.0%} of one core"),
            note="" if per_lease is not None else "the server is not on this machine",
        ),
        Target(
            "10-fleet-p99",
            "Fleet: renew p99 (lease_renew_each of 10 leases)",
            "99th percentile of the renewal statement's round trip",
            goal=5.0,
            higher_is_better=False,
            unit="ms",
            value=each["p99"] * 1e3,
            detail=f"p50 {fmt_time(each['p50'])}, p99 {fmt_time(each['p99'])} over "
            f"{each['calls']:,} calls at {each['renewed'] / each['wall_seconds']:,.0f} renewals/s",
        ),
    ]
    section.data = {"renewals": results, "holders": holders_n, "processes": procs_n,
                    "tick_seconds": tick}  # fmt: skip
    waiters(ctx, section)
    channels(ctx, section)
    return section


def _connections(conn: psycopg.Connection[Any], since: Any) -> int:
    """Backends of this database opened since ``since``, but the monitor's own."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        " AND backend_start >= %s AND application_name <> 'pylease-bench-owner'",
        (since,),
    ).fetchone()
    return int(row[0]) if row else 0


def _claims(conn: psycopg.Connection[Any]) -> int:
    """lease_claim calls so far: its body's, pylease_claim (lease_claim is inlined)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'pylease_claim'"
    ).fetchone()
    return int(row[0]) if row else 0


def _wait_round(ctx: Context, threads: int, names_n: int) -> dict[str, Any]:
    """``threads`` waiters over ``names_n`` names, all busy, then released one by one."""
    from pylease import lease

    params = conninfo.conninfo_to_dict(ctx.dsn)
    params["application_name"] = APP
    params["options"] = "-c track_functions=all"
    url = conninfo.make_conninfo("", **params)
    prefix = unique("wait")
    names = [f"{prefix}-{i:04d}" for i in range(names_n)]
    owner = holder_id("owner")
    granted: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    with ctx.connect(application_name="pylease-bench-owner") as own, ctx.connect() as monitor:
        for n in names:
            own.execute("SELECT lease_claim(%s, '1 hour', %s)", (n, owner))
        since = monitor.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        claims_before = _claims(monitor)

        def wait(name: str) -> None:
            try:
                with lease(url, name, ttl=30, wait=60, heartbeat=False), lock:
                    granted.append(time.monotonic())
            except BaseException as exc:  # reported below, loudly
                with lock:
                    failures.append(exc)

        pool = [
            threading.Thread(target=wait, args=(names[i % names_n],), daemon=True)
            for i in range(threads)
        ]
        for t in pool:
            t.start()
        # Every waiter has tried once and is waiting when the count stops growing.
        peak, stable, deadline = 0, 0, time.monotonic() + 20
        while stable < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
            now = _connections(monitor, since)
            stable = stable + 1 if now == peak and now > 0 else 0
            peak = max(peak, now)
        for n in names:
            own.execute("SELECT lease_release(%s, %s)", (n, owner))
        for t in pool:
            t.join(timeout=90)
        peak = max(peak, _connections(monitor, since))
        # The waiters' counts reach the statistics when their backends end or go idle.
        time.sleep(1.2)
        claims = _claims(monitor) - claims_before
    if failures:
        raise RuntimeError(f"bench: {len(failures)} waiters failed: {failures[0]!r}")
    return {"threads": threads, "names": names_n, "connections": peak,
            "claims": claims, "grants": len(granted),
            "claims_per_grant": claims / max(1, len(granted))}  # fmt: skip


def waiters(ctx: Context, section: Section) -> None:
    # A probe first: today's waiter opens a connection of its own per waiting thread,
    # and 200 of them would take most of a default server's 100 connections, which
    # this machine shares. The full 200 run when the probe shows a shared listener.
    probe = _wait_round(ctx, 10, 10)
    shared = probe["connections"] <= 3
    many = 200 if shared and not ctx.smoke else (10 if ctx.smoke else 20)
    spread = probe if many == 10 else _wait_round(ctx, many, many)
    crowd = 30 if shared and not ctx.smoke else 10
    one_name = _wait_round(ctx, crowd, 1)
    rows = [
        [f"{r['threads']} threads, {r['names']} name(s)", str(r["connections"]),
         f"{r['claims']:,}", str(r["grants"]), f"{r['claims_per_grant']:.1f}"]
        for r in (spread, one_name)
    ]  # fmt: skip
    section.extra.append(
        {
            "title": "Waiting threads in one process (lease(..., wait=...), heartbeat off)",
            "header": [
                "waiters",
                "connections opened",
                "lease_claim calls",
                "grants",
                "claims per grant",
            ],
            "rows": rows,
        }
    )
    if not shared:
        section.notes.append(
            f"The waiters opened {probe['connections']} connections for 10 threads (one per "
            "waiting thread and its claims), so the 200-thread run was scaled down to "
            f"{many} threads over {many} names and 30 threads on one name to {crowd}: 200 "
            "such waiters would need about "
            f"{round(probe['connections'] / 10 * 200)} connections, beyond the server's "
            "max_connections on this shared machine. The section runs the full numbers once "
            "the waiters of a process share one listener."
        )
    section.targets += [
        Target(
            "10-waiter-connections",
            f"Connections of {spread['threads']} waiting threads in one process",
            "backends the process opened while its threads waited (target for 200)",
            goal=2,
            higher_is_better=False,
            unit="count",
            value=spread["connections"],
            detail=f"{spread['threads']} threads over {spread['names']} names",
        ),
        Target(
            "10-claims-per-grant",
            f"Claims per grant, {one_name['threads']} threads waiting on one name",
            "lease_claim calls / grants (target for 30 threads)",
            goal=2.5,
            higher_is_better=False,
            unit="x",
            value=one_name["claims_per_grant"],
            detail=f"{one_name['claims']:,} claims for {one_name['grants']} grants",
        ),
    ]
    section.data["waiters"] = {"probe": probe, "spread": spread, "one_name": one_name}


# Per-name channels (issue 13 item 3, "optional, measure first"): what a listener pays
# for the releases of names it does not wait for, against what a second NOTIFY per
# release would cost every release.

SECOND_NOTIFY = "ignored := pg_notify('pylease', {fn}.name);"


def listening_waiter(dsn: str, name: str, pipe: Pipe) -> None:
    """Wait for ``name`` (held by the parent) through pylease's shared listener."""
    from pylease import LeaseBusy, lease

    pipe.send("started")
    with contextlib.suppress(LeaseBusy), lease(dsn, name, ttl=30, wait=120, heartbeat=False):
        pass
    pipe.send("done")


def _process_cpu(pid: int) -> float:
    """Seconds on the CPU of every thread of process ``pid`` (the listener's thread too)."""
    total = 0.0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            path = f"/proc/{pid}/task/{task}/schedstat"
            with contextlib.suppress(OSError, ValueError, IndexError), open(path) as f:
                total += int(f.read().split()[0]) / 1e9
    return total


def _release_variant(conn: psycopg.Connection[Any]) -> None:
    """bench_release_two: lease_release sending a second NOTIFY on a channel of its name's."""
    row = conn.execute(
        "SELECT pg_get_functiondef('lease_release(text, text, interval)'::regprocedure)"
    ).fetchone()
    assert row is not None
    text = str(row[0])
    notify = SECOND_NOTIFY.format(fn="lease_release")
    if notify not in text:
        raise RuntimeError("bench: lease_release sends no NOTIFY to add a second one beside")
    text = text.replace(
        notify,
        notify + " ignored := pg_notify('pylease_' || left(md5(lease_release.name), 12), '');",
    )
    text = text.replace("FUNCTION public.lease_release(", "FUNCTION bench_release_two(", 1)
    text = text.replace("FUNCTION lease_release(", "FUNCTION bench_release_two(", 1)
    text = text.replace("lease_release.", "bench_release_two.")
    if "bench_release_two(" not in text:
        raise RuntimeError("bench: could not copy lease_release")
    conn.execute(text)


def channels(ctx: Context, section: Section) -> None:
    from benchmarks._stats import Contender, interleave

    n = 200 if ctx.smoke else 2000
    with ctx.connect() as setup:
        _release_variant(setup)
    # The release side: the same cycle with one NOTIFY and with two (no flush on either
    # side: the flush is the same for both and its noise would hide the difference).
    conns = [ctx.connect() for _ in range(2)]
    try:
        for c in conns:
            c.execute("SET synchronous_commit = off")

        def cycles(conn: psycopg.Connection[Any], release_fn: str) -> Any:
            name, holder = unique("chan"), holder_id("chan")

            def run(k: int) -> float:
                cur = conn.cursor()
                start = time.perf_counter()
                for _ in range(k):
                    cur.execute("SELECT lease_claim(%s, %s, %s)", (name, TTL, holder))
                    cur.execute(f"SELECT {release_fn}(%s, %s)", (name, holder))
                return time.perf_counter() - start

            return run

        one, two = "release with NOTIFY pylease", "release with a second, per-name NOTIFY"
        result = interleave(
            [
                Contender(one, cycles(conns[0], "lease_release"), max(50, n // 10)),
                Contender(two, cycles(conns[1], "bench_release_two"), max(50, n // 10)),
            ],
            ctx.scale.rounds,
        )
    finally:
        for c in conns:
            c.close()
    extra_release = result.median(two) - result.median(one)
    # The listening side: a process waiting for one name while other names are released.
    mp = mp_context()
    held = unique("chan-held")
    with ctx.connect() as owner, ctx.connect() as other:
        owner.execute("SELECT lease_claim(%s, '1 hour', 'bench-chan-owner')", (held,))
        mine, theirs = mp.Pipe()
        proc = mp.Process(target=listening_waiter, args=(ctx.dsn, held, theirs), daemon=True)
        proc.start()
        try:
            mine.recv()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                row = other.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                    " AND query LIKE 'LISTEN%%'",
                    ("pylease-listen",),
                ).fetchone()
                if row and row[0]:
                    break
                time.sleep(0.05)
            time.sleep(0.3)
            pid = proc.pid
            assert pid is not None
            idle_start, t0 = _process_cpu(pid), time.monotonic()
            time.sleep(1.0)
            idle_rate = (_process_cpu(pid) - idle_start) / (time.monotonic() - t0)
            name = unique("chan-other")
            cpu0, t1 = _process_cpu(pid), time.monotonic()
            for _ in range(n):
                other.execute("SELECT lease_claim(%s, '30 s', 'bench-chan')", (name,))
                other.execute("SELECT lease_release(%s, 'bench-chan')", (name,))
            time.sleep(0.3)  # the last notifications reach the listener
            busy = _process_cpu(pid) - cpu0 - idle_rate * (time.monotonic() - t1)
        finally:
            owner.execute("SELECT lease_release(%s, 'bench-chan-owner')", (held,))
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    per_notification = max(busy, 0.0) / n
    # A difference of a few µs on cycles of hundreds is within the rounds' noise.
    if extra_release > 0:
        notify_cost = fmt_time(extra_release) + " here"
    else:
        notify_cost = f"too small to tell from the noise here: {fmt_time(extra_release)}"
    section.extra.append(
        {
            "title": "Per-name channels (issue 13 item 3): measured, not adopted",
            "header": ["cost", "measured"],
            "rows": [
                ["a listening process, per release of a name it does not wait for (its CPU)",
                 fmt_time(per_notification)],
                ["a release cycle with one NOTIFY (no flush)", fmt_time(result.median(one))],
                ["the same with a second, per-name NOTIFY", fmt_time(result.median(two))],
                ["a second NOTIFY, per release (every release pays it)",
                 fmt_time(extra_release)],
            ],
        }
    )  # fmt: skip
    section.notes.append(
        "Per-name channels were measured, not built. A process waiting through pylease's "
        f"shared listener spends {fmt_time(per_notification)} of CPU on each release of a "
        "name it does not wait for (its listener wakes, reads the notification and drops "
        "it; no waiter wakes and no claim is sent, so the server pays nothing for it): at "
        f"1,000 such releases a second, {per_notification * 1000 * 100:.1f}% of one core per "
        "waiting process. A channel per name would spare that, and would cost every release "
        f"a second NOTIFY ({notify_cost}, on the server every process "
        "shares, since the contract's NOTIFY pylease stays), plus a LISTEN on the shared "
        "listener for each name a process starts waiting for, which must be in force before "
        "the waiter's next claim (else a release in between is missed until the safety "
        "poll), so it lies on the path of every first wait. It pays where many processes "
        "wait while other names are released at high rates; the waits this bench measures "
        "are not that case, so the one channel stays."
    )
    section.data["channels"] = {
        "per_foreign_notification_seconds": per_notification,
        "release_cycle_seconds": {"one_notify": result.median(one), "two": result.median(two)},
        "second_notify_seconds": extra_release,
    }
