"""Section 7: one uncontended acquire + release, as each library's users write it.

PostgreSQL and Redis contenders are compared with pylease's raw SQL cycle; the
local-only pair (pylease's SQLite backend and filelock) with each other.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import conninfo

from benchmarks._core import Context, Section, holder_id, unique
from benchmarks._stats import Contender, fmt_rate, interleave
from benchmarks.python_level import python_api
from benchmarks.sql_level import TTL, sql_cycle

Run = Callable[[int], float]

HAND_CLAIM = (
    "UPDATE bench_handlease SET holder = %s, expires_at = now() + %s"
    " WHERE name = %s AND expires_at <= now()"
)
HAND_INSERT = (
    "INSERT INTO bench_handlease (name, holder, expires_at) VALUES (%s, %s, now() + %s)"
    " ON CONFLICT (name) DO NOTHING"
)
HAND_RELEASE = "UPDATE bench_handlease SET expires_at = now() WHERE name = %s AND holder = %s"

# What a granted lock stands on, for the table: speed is bought with some of these.
GUARANTEES = {
    "pylease": "claim flushed to WAL; expiry; fence token",
    "hand": "both writes flushed; expiry; no fence",
    "pals": "held by a session: no expiry, no fence; gone with the connection",
    "redis-py": "in Redis memory; expiry; no fence",
    "redis-lock": "in Redis memory; expiry; no fence",
    "sqlite": "one host; claim in the SQLite journal; expiry; fence token",
    "filelock": "one host; flock held by the process; no expiry",
}


def _timed(step: Callable[[], None]) -> Run:
    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            step()
        return time.perf_counter() - start

    return run


def handwritten(conn: psycopg.Connection[Any]) -> Run:
    """A lease as people write it by hand: UPDATE an expired row, else INSERT one."""
    name, holder = unique("hand"), holder_id("hand")
    cur = conn.cursor()

    def step() -> None:
        cur.execute(HAND_CLAIM, (holder, TTL, name))
        if cur.rowcount == 0:
            cur.execute(HAND_INSERT, (name, holder, TTL))
            if cur.rowcount == 0:
                raise RuntimeError("bench: hand-written lease was busy")
        cur.execute(HAND_RELEASE, (name, holder))

    return _timed(step)


def sqlalchemy_url(dsn: str) -> Any:
    """The psycopg (3) dialect's URL for the same database: pals needs SQLAlchemy."""
    import sqlalchemy as sa

    p = conninfo.conninfo_to_dict(dsn)
    return sa.engine.URL.create(
        "postgresql+psycopg",
        username=p.get("user"),
        password=p.get("password"),
        host=p.get("host"),
        port=int(p["port"]) if p.get("port") else None,
        database=p.get("dbname"),
    )


def pals_cycle(ctx: Context) -> tuple[Run, Callable[[], None]]:
    import pals

    locker = pals.Locker("pylease-bench", sqlalchemy_url(ctx.dsn))
    name = unique("pals")

    def step() -> None:
        lock = locker.lock(name, blocking=False)
        if not lock.acquire():
            raise RuntimeError("bench: pals lock was busy")
        lock.release()

    return _timed(step), locker.engine.dispose


def redis_py_cycle(client: Any) -> Run:
    name = unique("redis-py")

    def step() -> None:
        lock = client.lock(name, timeout=30)
        if not lock.acquire(blocking=False):
            raise RuntimeError("bench: redis-py lock was busy")
        lock.release()

    return _timed(step)


def redis_lock_cycle(client: Any) -> Run:
    import redis_lock

    name = unique("redis-lock")

    def step() -> None:
        lock = redis_lock.Lock(client, name, expire=30)
        if not lock.acquire(blocking=False):
            raise RuntimeError("bench: python-redis-lock was busy")
        lock.release()

    return _timed(step)


def sqlite_backend() -> Any:
    """``pylease.sqlite`` (connect, SqliteBackend), or None while it has not landed."""
    try:
        from pylease import sqlite
    except ImportError:
        return None
    if not hasattr(sqlite, "connect") or not hasattr(sqlite, "SqliteBackend"):
        return None
    return sqlite


def sqlite_cycle(module: Any, path: str) -> tuple[Run, Callable[[], None]]:
    conn = module.connect(path)
    backend = module.SqliteBackend(conn)
    name, holder, ttl = unique("sqlite"), holder_id("sqlite"), timedelta(seconds=30)

    def step() -> None:
        if backend.claim(name, ttl, holder) is None:
            raise RuntimeError("bench: SQLite lease was busy")
        backend.release(name, holder)

    return _timed(step), conn.close


def filelock_cycle(path: str) -> Run:
    from filelock import FileLock

    lock = FileLock(path)

    def step() -> None:
        lock.acquire(blocking=False)
        lock.release()

    return _timed(step)


def bench_peers(ctx: Context) -> Section:
    s = ctx.scale
    section = Section(
        "peers",
        "7. Peers: one uncontended acquire + release, same machine, same run",
        header=["contender", "cycles/s: median [min..max]", "relative", "a granted lock is"],
    )
    # (label, group, guarantee key, run)
    entries: list[tuple[str, str, str, Run]] = []
    closers: list[Callable[[], None]] = []
    pg = ctx.connect()
    closers.append(pg.close)
    entries.append(
        (
            "pylease: SQL cycle",
            "server",
            "pylease",
            sql_cycle(pg, unique("peer"), holder_id("peer")),
        )
    )
    lease = python_api()
    if lease is not None:
        api_conn = ctx.connect()
        closers.append(api_conn.close)
        name = unique("peer-api")

        def api_step() -> None:
            with lease(api_conn, name, ttl=TTL):
                pass

        entries.append(("pylease: `with lease()`", "server", "pylease", _timed(api_step)))
    else:
        section.notes.append("pylease.lease is not available: the Python API row is missing")
    hand = ctx.connect()
    closers.append(hand.close)
    entries.append(("hand-written UPDATE-then-INSERT lease", "server", "hand", handwritten(hand)))
    try:
        run, close = pals_cycle(ctx)
        closers.append(close)
        entries.append(("pals (advisory lock)", "server", "pals", run))
    except ImportError as exc:
        section.notes.append(f"pals is not installed ({exc}); skipped")
    client = ctx.redis()
    if client is not None:
        entries.append(("redis-py Lock", "server", "redis-py", redis_py_cycle(client)))
        try:
            entries.append(("python-redis-lock", "server", "redis-lock", redis_lock_cycle(client)))
        except ImportError:
            section.notes.append("python-redis-lock is not installed; skipped")
    else:
        section.notes.append("Redis is not reachable: the Redis peers were skipped")
    module = sqlite_backend()
    if module is not None:
        run, close = sqlite_cycle(module, os.path.join(ctx.workdir, "bench.sqlite3"))
        closers.append(close)
        entries.append(("pylease: SQLite backend", "local", "sqlite", run))
    else:
        section.notes.append("pylease.sqlite is not available: the SQLite row is missing")
    try:
        entries.append(
            (
                "filelock",
                "local",
                "filelock",
                filelock_cycle(os.path.join(ctx.workdir, "bench.lock")),
            )
        )
    except ImportError:
        section.notes.append("filelock is not installed; skipped")

    try:
        result = interleave(
            [Contender(label, run, s.peer_ops) for label, _, _, run in entries], s.peer_rounds
        )
    finally:
        for close in closers:
            with contextlib.suppress(Exception):
                close()

    bases = {"server": "pylease: SQL cycle", "local": "filelock"}
    section.data = {"cycles_per_second": {}, "groups": {}}
    for label, group, key, _ in entries:
        rates = [1 / v for v in result.per_op[label]]
        med = 1 / result.median(label)
        base_label = bases[group] if bases[group] in result.per_op else label
        rel = med * result.median(base_label)
        section.rows.append(
            [
                label,
                f"{fmt_rate(med)} [{min(rates):,.0f}..{max(rates):,.0f}]",
                f"{rel:.2f}x {'(vs ' + base_label + ')' if base_label != label else '(reference)'}",
                GUARANTEES[key],
            ]
        )
        section.data["cycles_per_second"][label] = {
            "median": med,
            "min": min(rates),
            "max": max(rates),
            "values": rates,
        }
        section.data["groups"][label] = group
    section.notes.append(
        "Server peers are relative to pylease's raw SQL cycle; local peers to filelock. "
        "Redis keeps its locks in memory, so its cycle pays no disk flush at all."
    )
    return section
