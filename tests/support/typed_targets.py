"""Typed uses of the public targets and durations, checked by ``mypy --strict`` in
``make typecheck``.

Not a test module: pytest does not collect it, and nothing here runs. Each accepted
target is passed as its own type; each ``type: ignore[...]`` marks a call that the
signatures must reject (under --strict an ignore that is not needed is itself an
error, so ``Target = object`` or ``Any`` fails the check as surely as a Target that
refused a real target).
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import pylease
from pylease import (
    FOREVER,
    AsyncTarget,
    Duration,
    Target,
    alease,
    current_leader,
    exclusive,
    keep_fresh,
    leader,
    lease,
    run_exclusive,
)

DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def my_helper(target: Target, ttl: Duration = "5m") -> int:
    """An application's own function, typed with pylease's aliases."""
    with lease(target, "job", ttl, wait=FOREVER) as held:
        return held.fence


def sync_targets(
    conn: psycopg.Connection[Any],
    pool: ConnectionPool[psycopg.Connection[Any]],
    lite: sqlite3.Connection,
    session: Session,
) -> None:
    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1/postgres")
    with engine.connect() as sa_conn:
        targets: list[Target] = [conn, pool, DSN, lite, engine, sa_conn, session]
    for target in targets:
        my_helper(target)
        run_exclusive(target, "job", timedelta(seconds=30), lambda: None, wait="1h30m")
        keep_fresh(target, "job", "holder", ttl=60.0)
        leader(target, "scheduler", ttl="15s", wait="forever")
        current_leader(target, "scheduler")

    my_helper(42)  # type: ignore[arg-type]
    my_helper(conn, ttl=[5])  # type: ignore[arg-type]
    lease(DSN, "job", ttl=None)  # type: ignore[arg-type]
    lease(b"postgresql://", "job", 10)  # type: ignore[arg-type]


async def async_targets(
    aconn: psycopg.AsyncConnection[Any],
    apool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
    conn: psycopg.Connection[Any],
    asession: AsyncSession,
) -> None:
    aengine = create_async_engine("postgresql+psycopg://postgres@127.0.0.1/postgres")
    async with aengine.connect() as sa_aconn:
        targets: list[AsyncTarget] = [aconn, apool, DSN, aengine, sa_aconn, asession]
    for target in targets:
        async with alease(target, "job", "5m", wait=pylease.FOREVER, min_hold="1m"):
            pass

    lease(aconn, "job", 10)  # type: ignore[arg-type]
    alease(conn, "job", 10)  # type: ignore[arg-type]


@exclusive(DSN, "report", ttl="10m", wait="30s")
def report() -> int:
    return 1


def broken() -> None:
    exclusive(DSN, "report", ttl=[10])  # type: ignore[call-overload]
    exclusive(42, "report", ttl=10)  # type: ignore[call-overload]
