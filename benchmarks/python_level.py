"""Sections 3 and 5: the Python API (``pylease.lease``) against the raw SQL it wraps.

Section 5 times handovers between two processes: the parent releases, a waiter
process blocked in a lock library's blocking acquire takes over. Both read
CLOCK_MONOTONIC (``time.monotonic_ns``), so the two stamps compare directly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection as Pipe
from typing import Any

import psycopg

from benchmarks._core import Context, Section, Target, holder_id, unique
from benchmarks._stats import Contender, fmt_time, interleave, percentile, spread_text, summary
from benchmarks.contention import mp_context
from benchmarks.sql_level import CLAIM, RELEASE, TTL, sql_cycle

WAIT = 10.0  # seconds a waiter may block: far longer than any handover
POLL_PERIOD = 0.1  # redis-py Lock's default sleep between attempts
POLLERS = ("poll", "redis-py")


def python_api() -> Callable[..., Any] | None:
    """``pylease.lease``, or None while the Python API has not landed."""
    try:
        import pylease
    except ImportError:
        return None
    return getattr(pylease, "lease", None)


def bench_python(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "python",
        "3. Python: `with lease(...)` (heartbeat on) vs the raw SQL cycle",
        header=["contender", "per cycle: median [min..max]", "cycles/s", "throughput vs raw SQL"],
    )
    lease = python_api()
    target = Target(
        "3-python",
        "Python `with lease()` vs raw SQL cycle",
        "throughput of `with lease()` / throughput of the raw SQL cycle",
        goal=0.8,
        higher_is_better=True,
    )
    section.targets.append(target)
    if lease is None:
        target.note = "pylease.lease is not available in this checkout"
        section.notes.append(target.note)
        return section
    with ctx.connect() as api_conn, ctx.connect() as nohb_conn, ctx.connect() as raw_conn:

        def api(conn: psycopg.Connection[Any], heartbeat: bool) -> Callable[[int], float]:
            name = unique("py")

            def run(n: int) -> float:
                start = time.perf_counter()
                for _ in range(n):
                    with lease(conn, name, ttl=timedelta(seconds=30), heartbeat=heartbeat):
                        pass
                return time.perf_counter() - start

            return run

        raw = "raw SQL cycle"
        with_hb = "with lease(): heartbeat on"
        no_hb = "with lease(heartbeat=False)"
        result = interleave(
            [
                Contender(with_hb, api(api_conn, True), s.python_ops),
                Contender(
                    raw, sql_cycle(raw_conn, unique("pyraw"), holder_id("raw")), s.python_ops
                ),
                Contender(no_hb, api(nohb_conn, False), s.python_ops),
            ],
            s.rounds,
        )
    base = result.median(raw)
    for label in result.labels:
        med = result.median(label)
        section.rows.append(
            [label, spread_text(result.summary(label)), f"{1 / med:,.0f}", f"{base / med:.2f}x"]
        )
    ratios = result.paired_ratios(raw, with_hb)
    target.value = summary(ratios)["median"]
    target.detail = f"lease() {fmt_time(result.median(with_hb))}, raw {fmt_time(base)}"
    section.data = {
        "per_op_seconds": {k: result.summary(k) for k in result.labels},
        "throughput_ratio_rounds": ratios,
    }
    bench_python_async(ctx, section)
    return section


def bench_python_async(ctx: Context, section: Section) -> None:
    """The async API the same way: `async with alease()` vs the raw async SQL cycle.

    One event loop for the whole comparison (an async connection belongs to its
    loop); each round runs its cycles inside it and times them there.
    """
    s = ctx.scale
    target = Target(
        "3-python-async",
        "Python `async with alease()` vs raw async SQL cycle",
        "throughput of `async with alease()` / throughput of the raw async SQL cycle",
        goal=0.8,
        higher_is_better=True,
    )
    section.targets.append(target)
    try:
        from pylease import alease
    except ImportError:
        target.note = "pylease.alease is not available in this checkout"
        section.notes.append(target.note)
        return
    loop = asyncio.new_event_loop()

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            ctx.dsn, autocommit=True, application_name="pylease-bench"
        )

    api_conn, raw_conn = loop.run_until_complete(connect()), loop.run_until_complete(connect())
    try:

        def api(conn: psycopg.AsyncConnection[Any]) -> Callable[[int], float]:
            name = unique("apy")

            async def cycles(n: int) -> float:
                start = time.perf_counter()
                for _ in range(n):
                    async with alease(conn, name, ttl=timedelta(seconds=30)):
                        pass
                return time.perf_counter() - start

            return lambda n: loop.run_until_complete(cycles(n))

        def raw_cycle(conn: psycopg.AsyncConnection[Any]) -> Callable[[int], float]:
            name, holder = unique("apyraw"), holder_id("araw")

            async def cycles(n: int) -> float:
                cur = conn.cursor()
                start = time.perf_counter()
                for _ in range(n):
                    await cur.execute(CLAIM, (name, TTL, holder))
                    if (await cur.fetchone()) is None:
                        raise RuntimeError("bench: the raw async claim was refused")
                    await cur.execute(RELEASE, (name, holder))
                    await cur.fetchone()
                return time.perf_counter() - start

            return lambda n: loop.run_until_complete(cycles(n))

        raw = "raw async SQL cycle"
        with_api = "async with alease(): heartbeat on"
        result = interleave(
            [
                Contender(with_api, api(api_conn), s.python_ops),
                Contender(raw, raw_cycle(raw_conn), s.python_ops),
            ],
            s.rounds,
        )
    finally:
        loop.run_until_complete(api_conn.close())
        loop.run_until_complete(raw_conn.close())
        loop.close()
    base = result.median(raw)
    for label in result.labels:
        med = result.median(label)
        section.rows.append(
            [label, spread_text(result.summary(label)), f"{1 / med:,.0f}", f"{base / med:.2f}x"]
        )
    ratios = result.paired_ratios(raw, with_api)
    target.value = summary(ratios)["median"]
    target.detail = f"alease() {fmt_time(result.median(with_api))}, raw {fmt_time(base)}"
    section.data["async_per_op_seconds"] = {k: result.summary(k) for k in result.labels}
    section.data["async_throughput_ratio_rounds"] = ratios


# Waiters: each runs in the waiter process, blocks until it holds the lock, stamps
# the time, gives the lock back, and returns the stamp.


class LeaseWaiter:
    """``with lease(conn, name, wait=...)``: the Python API's notify-driven waiting."""

    def __init__(self, dsn: str, redis_url: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="pylease-bench-waiter")
        self.lease = python_api()

    def wait(self, name: str) -> int:
        assert self.lease is not None
        with self.lease(self.conn, name, ttl=TTL, wait=WAIT):
            stamp = time.monotonic_ns()
        return stamp


class ListenWaiter:
    """Raw SQL: LISTEN pylease, claim, and on busy sleep until a notification."""

    def __init__(self, dsn: str, redis_url: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="pylease-bench-waiter")
        self.conn.execute("LISTEN pylease")
        self.holder = holder_id("listen")

    def wait(self, name: str) -> int:
        for _ in self.conn.notifies(timeout=0):  # drop stale wake-ups
            pass
        while True:
            fence = self.conn.execute(CLAIM, (name, TTL, self.holder)).fetchone()[0]  # type: ignore[index]
            if fence is not None:
                stamp = time.monotonic_ns()
                self.conn.execute(RELEASE, (name, self.holder))
                return stamp
            for _ in self.conn.notifies(timeout=WAIT, stop_after=1):
                pass


class PollWaiter:
    """Raw SQL: claim, and on busy sleep 100 ms (redis-py Lock's default pace)."""

    def __init__(self, dsn: str, redis_url: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="pylease-bench-waiter")
        self.holder = holder_id("poll")

    def wait(self, name: str) -> int:
        while True:
            fence = self.conn.execute(CLAIM, (name, TTL, self.holder)).fetchone()[0]  # type: ignore[index]
            if fence is not None:
                stamp = time.monotonic_ns()
                self.conn.execute(RELEASE, (name, self.holder))
                return stamp
            time.sleep(POLL_PERIOD)


class RedisPyWaiter:
    """redis-py ``Lock``: SET NX retried every ``sleep`` (0.1 s by default)."""

    def __init__(self, dsn: str, redis_url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(redis_url)

    def wait(self, name: str) -> int:
        lock = self.client.lock(name, timeout=30, sleep=POLL_PERIOD, blocking_timeout=WAIT)
        if not lock.acquire(blocking=True):
            raise RuntimeError("bench: redis-py waiter timed out")
        stamp = time.monotonic_ns()
        lock.release()
        return stamp


class RedisLockWaiter:
    """python-redis-lock: SET NX, and on busy BLPOP on the lock's signal list."""

    def __init__(self, dsn: str, redis_url: str) -> None:
        import redis
        import redis_lock

        self.client = redis.Redis.from_url(redis_url)
        self.redis_lock = redis_lock

    def wait(self, name: str) -> int:
        lock = self.redis_lock.Lock(self.client, name, expire=30)
        if not lock.acquire(blocking=True, timeout=WAIT):
            raise RuntimeError("bench: python-redis-lock waiter timed out")
        stamp = time.monotonic_ns()
        lock.release()
        return stamp


WAITERS: dict[str, type[Any]] = {
    "lease": LeaseWaiter,
    "listen": ListenWaiter,
    "poll": PollWaiter,
    "redis-py": RedisPyWaiter,
    "redis-lock": RedisLockWaiter,
}


def waiter_process(dsn: str, redis_url: str, pipe: Pipe) -> None:
    """Serve ``(kind, name)`` requests: say "waiting", block, send the stamp."""
    waiters: dict[str, Any] = {}
    pipe.send("ready")
    while (request := pipe.recv()) is not None:
        kind, name = request
        try:
            if kind not in waiters:
                waiters[kind] = WAITERS[kind](dsn, redis_url)
            pipe.send("waiting")
            pipe.send(waiters[kind].wait(name))
        except Exception as exc:  # the parent reports it and goes on
            pipe.send(f"error: {type(exc).__name__}: {exc}")


# Releasers: in the parent, take the free lock at once, later give it back.


class SqlReleaser:
    def __init__(self, ctx: Context) -> None:
        self.conn = ctx.connect()
        self.holder = holder_id("releaser")

    def take(self, name: str) -> None:
        deadline = time.monotonic() + 5
        while self.conn.execute(CLAIM, (name, TTL, self.holder)).fetchone()[0] is None:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench: releaser could not claim {name}")
            time.sleep(0.001)

    def give(self, name: str) -> None:
        self.conn.execute(RELEASE, (name, self.holder))

    def close(self) -> None:
        self.conn.close()


class RedisPyReleaser:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.lock: Any = None

    def take(self, name: str) -> None:
        self.lock = self.client.lock(name, timeout=30)
        if not self.lock.acquire(blocking=True, blocking_timeout=5):
            raise RuntimeError(f"bench: releaser could not lock {name}")

    def give(self, name: str) -> None:
        self.lock.release()

    def close(self) -> None:
        pass


class RedisLockReleaser(RedisPyReleaser):
    def take(self, name: str) -> None:
        import redis_lock

        self.lock = redis_lock.Lock(self.client, name, expire=30)
        if not self.lock.acquire(blocking=True, timeout=5):
            raise RuntimeError(f"bench: releaser could not lock {name}")


LABELS = {
    "lease": "pylease `lease(wait=...)` (LISTEN/NOTIFY)",
    "listen": "raw SQL: LISTEN + claim on NOTIFY",
    "poll": "raw SQL: claim polled every 100 ms",
    "redis-py": "redis-py Lock (polls every 100 ms)",
    "redis-lock": "python-redis-lock (BLPOP wake-up)",
}


def bench_handover(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "handover",
        "5. Handover: release until a blocked waiter holds the lease",
        header=["waiter", "handovers", "p50", "p90", "p99", "max"],
    )
    target = Target(
        "5-handover",
        "Handover p50 (`lease(wait=...)`)",
        "median time from release to the waiter holding the lease",
        goal=5.0,
        higher_is_better=False,
        unit="ms",
    )
    ratio_target = Target(
        "5-handover-vs-sql",
        "Handover p50: `lease(wait=...)` vs raw SQL LISTEN + claim",
        "p50 of `lease(wait=...)` / p50 of the raw SQL waiter (LISTEN, claim on the "
        "notification), per round, same run",
        goal=1.2,
        higher_is_better=False,
    )
    # Before the absolute target: that one stays the section's last.
    section.targets += [ratio_target, target]
    kinds: list[str] = []
    if python_api() is not None:
        kinds.append("lease")
    else:
        target.note = "pylease.lease is not available in this checkout; raw SQL waiters only"
        section.notes.append(target.note)
    kinds += ["listen", "poll"]
    client = ctx.redis()
    if client is not None:
        try:
            import redis_lock  # noqa: F401

            kinds += ["redis-py", "redis-lock"]
        except ImportError:
            kinds.append("redis-py")
            section.notes.append("python-redis-lock is not installed; skipped")
    else:
        section.notes.append("Redis is not reachable: the Redis waiters were skipped")

    releasers: dict[str, Any] = {}
    for kind in kinds:
        if kind in ("lease", "listen", "poll"):
            releasers[kind] = SqlReleaser(ctx)
        elif kind == "redis-py":
            releasers[kind] = RedisPyReleaser(client)
        else:
            releasers[kind] = RedisLockReleaser(client)
    names = {kind: unique(f"handover-{kind}") for kind in kinds}
    per_round = {
        k: max(
            1, (s.poll_handovers if k in ("poll", "redis-py") else s.handovers) // s.handover_rounds
        )
        for k in kinds
    }
    latencies: dict[str, list[float]] = {k: [] for k in kinds}
    # The same, by round: the ratio target pairs the two waiters of one round.
    by_round: dict[str, list[list[float]]] = {k: [] for k in kinds}
    errors: dict[str, str] = {}
    # The first handover of each kind sets up its connections: run it, do not count it.
    unrecorded = dict.fromkeys(kinds, 1)
    phase = random.Random(6)

    mp = mp_context()
    ours, theirs = mp.Pipe()
    proc = mp.Process(target=waiter_process, args=(ctx.dsn, ctx.redis_url, theirs), daemon=True)
    proc.start()
    try:
        if not ours.poll(60) or ours.recv() != "ready":
            raise RuntimeError("bench: the waiter process did not start")
        for r in range(s.handover_rounds):
            for kind in kinds if r % 2 == 0 else list(reversed(kinds)):
                if kind in errors:
                    continue
                rel, name = releasers[kind], names[kind]
                by_round[kind].append([])
                for _ in range(per_round[kind] + unrecorded[kind]):
                    rel.take(name)
                    ours.send((kind, name))
                    ready = ours.recv()
                    if ready != "waiting":
                        errors[kind] = str(ready)
                        rel.give(name)
                        break
                    # A poller is released at a random phase of its 100 ms period, so
                    # that its delay samples the whole period, as in real use.
                    time.sleep(s.park + (phase.uniform(0, POLL_PERIOD) if kind in POLLERS else 0))
                    released_at = time.monotonic_ns()
                    rel.give(name)
                    if not ours.poll(WAIT + 5):
                        raise RuntimeError(f"bench: {kind} waiter never took the lease")
                    stamp = ours.recv()
                    if isinstance(stamp, str):
                        errors[kind] = stamp
                        break
                    if unrecorded[kind]:
                        unrecorded[kind] = 0
                        continue
                    latencies[kind].append((stamp - released_at) / 1e9)
                    by_round[kind][-1].append((stamp - released_at) / 1e9)
    finally:
        ours.send(None)
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
        for rel in releasers.values():
            rel.close()

    section.data = {"latency_seconds": {}, "errors": errors}
    for kind in kinds:
        values = latencies[kind]
        if not values:
            section.rows.append([LABELS[kind], "0", "n/a", "n/a", "n/a", errors.get(kind, "")])
            continue
        p = {q: percentile(values, q) for q in (50, 90, 99)}
        section.rows.append(
            [
                LABELS[kind],
                str(len(values)),
                *(fmt_time(p[q]) for q in (50, 90, 99)),
                fmt_time(max(values)),
            ]
        )
        section.data["latency_seconds"][kind] = {
            "label": LABELS[kind],
            "p50": p[50],
            "p90": p[90],
            "p99": p[99],
            "max": max(values),
            "mean": sum(values) / len(values),
            "count": len(values),
            "values": values,
        }
        if kind in errors:
            section.notes.append(f"{LABELS[kind]}: stopped early: {errors[kind]}")
    lead = "lease" if "lease" in section.data["latency_seconds"] else None
    if lead:
        st = section.data["latency_seconds"][lead]
        target.value = st["p50"] * 1e3
        target.detail = f"p50 {fmt_time(st['p50'])}, p99 {fmt_time(st['p99'])} over {st['count']}"
    handover_ratio(section, ratio_target, by_round)
    section.notes.append(
        f"Each waiter was blocked for {s.park * 1e3:.0f} ms before the release (the pollers for "
        f"a further random 0-{POLL_PERIOD * 1e3:.0f} ms, so that releases fall at any phase of "
        "their period: a poller's expected delay is half its period)."
    )
    return section


def handover_ratio(
    section: Section, target: Target, by_round: dict[str, list[list[float]]]
) -> None:
    """Target 5's ratio: the Python waiter's p50 over the raw SQL waiter's, round by round."""
    lat = section.data["latency_seconds"]
    if "lease" not in lat or "listen" not in lat:
        target.note = "needs both the `lease(wait=...)` and the raw LISTEN waiters"
        return
    ratios = [
        percentile(a, 50) / percentile(b, 50)
        for a, b in zip(by_round["lease"], by_round["listen"], strict=True)
        if a and b
    ]
    st = summary(ratios)
    target.value = lat["lease"]["p50"] / lat["listen"]["p50"]
    peer = lat.get("redis-lock")
    target.detail = (
        f"{fmt_time(lat['lease']['p50'])} vs {fmt_time(lat['listen']['p50'])}; per round "
        f"{st['min']:.2f}..{st['max']:.2f} (median {st['median']:.2f}, {st['n']} rounds)"
        + (f"; python-redis-lock {fmt_time(peer['p50'])}" if peer else "")
    )
    section.data["p50_ratio_to_raw_sql"] = target.value
    section.data["p50_ratio_rounds"] = ratios
    extra = lat["lease"]["p50"] - lat["listen"]["p50"]
    verdict = (
        "what is left" if target.verdict == "PASS" else "the cost left, which misses the target"
    )
    section.notes.append(
        f"`lease(wait=...)` against raw SQL LISTEN + claim: {extra * 1e3:+.2f} ms at p50 in this "
        f"run ({target.value:.2f}x). Both pay the release's commit, the notification and one "
        "claim, a durable commit (a WAL flush); "
        f"{verdict} is the Python waiter's, about 0.2-0.3 ms when profiled on a quiet "
        "machine: ~0.05 ms for the process's shared listener to read the notification and "
        "wake the waiting thread, ~0.04 ms for its wait loop to send the claim, ~0.1 ms "
        "inside the claim, whose transaction also takes the process out of the queue of "
        "waiting processes (lease_unwait; it cannot be left for later: the next process "
        "must be first in line before this one's release), and ~0.08 ms from the grant "
        "to the block (its ticket goes to the keeper). Only a claim sent by the listener's "
        "own thread, on the connection the waiting thread owns, would save the first two; "
        "how much it all weighs depends on the WAL flush both pay. "
        + (
            f"python-redis-lock ({fmt_time(peer['p50'])}) flushes nothing to disk per lock: "
            "its handover is a BLPOP wake-up and a SET in memory."
            if peer
            else ""
        )
    )
