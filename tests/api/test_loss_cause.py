"""A lost lease says what the database knows of it: stolen, or taken over after its
ttl ran out, by whom and with which fence (issue 16)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import LeaseLost, alease, lease
from pylease.sqlite import SqliteBackend, connect


def test_a_steal_is_named_with_the_thief_and_its_fence(dsn: str, conn: Any) -> None:
    with pytest.raises(LeaseLost) as lost, lease(dsn, "cause", ttl=30, heartbeat=False) as held:
        conn.execute("SELECT lease_steal('cause', '1 minute', 'operator')")
    assert f"stolen by 'operator' with fence {held.fence + 1}" in str(lost.value)


def test_a_takeover_after_the_ttl_is_named(dsn: str, conn: Any) -> None:
    with pytest.raises(LeaseLost) as lost, lease(dsn, "cause", ttl=1, heartbeat=False) as held:
        time.sleep(1.2)
        conn.execute("SELECT lease_claim('cause', '1 minute', 'next')")
    message = str(lost.value)
    assert f"taken over after its ttl ran out by 'next' with fence {held.fence + 1}" in message


def test_sqlite_names_the_steal_too(tmp_path: Path) -> None:
    path = tmp_path / "leases.sqlite3"
    with pytest.raises(LeaseLost) as lost, lease(f"sqlite:///{path}", "cause", ttl=30) as held:
        other = connect(str(path))
        SqliteBackend(other).steal("cause", timedelta(minutes=1), "op")
        other.close()
    assert f"stolen by 'op' with fence {held.fence + 1}" in str(lost.value)


async def test_async_names_the_steal(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(LeaseLost) as lost:
        async with alease(dsn, "cause", ttl=30, heartbeat=False) as held:
            conn.execute("SELECT lease_steal('cause', '1 minute', 'operator')")
    assert f"stolen by 'operator' with fence {held.fence + 1}" in str(lost.value)
