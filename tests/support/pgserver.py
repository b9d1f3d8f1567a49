"""Finding a PostgreSQL server for the tests, or starting a throwaway one."""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

LOCAL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _pg_bindir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    if not versions:
        raise RuntimeError("no PostgreSQL binaries found (pg_ctl); install postgresql")
    return versions[0]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nobody listens on now, for a server a test starts.

    Picked at random below the kernel's ephemeral range, where no connection's local
    port and no bind to port 0 lands between this pick and the server's own bind: a
    port from bind(0) is free only until another process (a parallel worker, its
    servers and clients) is handed it.
    """
    low = _ephemeral_low()
    if low > 11000:
        for _ in range(200):
            port = random.randint(10000, low - 1)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        found: int = sock.getsockname()[1]
        return found


@contextlib.contextmanager
def _throwaway(request: pytest.FixtureRequest) -> Iterator[str]:
    """Start a server with pytest-postgresql's executor; as `postgres` when we are root."""
    from pytest_postgresql.executors.proc import PostgreSQLExecutor

    pg_ctl = str(_pg_bindir() / "pg_ctl")
    base = Path(tempfile.mkdtemp(prefix="pylease-pg-"))
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: run pg_ctl (initdb, start, status, stop)
        # as postgres through a wrapper; the data directory's parent is postgres's.
        # Checked with: PYLEASE_TEST_THROWAWAY=1 pytest tests/sql/test_contract.py
        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        wrapper = base / "pg_ctl"
        wrapper.write_text(f'#!/bin/sh\nexec runuser -u postgres -- "{pg_ctl}" "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.chmod(base, 0o755)
        pg_ctl = str(wrapper)
    datadir = base / "data"
    port = free_port()
    executor = PostgreSQLExecutor(
        executable=pg_ctl,
        host="127.0.0.1",
        port=port,
        datadir=str(datadir),
        unixsocketdir=str(base),
        logfile=str(base / "postgresql.log"),
        startparams="-w",
        dbname="postgres",
        user="postgres",
        password="",
    )
    executor.start()
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        executor.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def find_or_start(request: pytest.FixtureRequest) -> Iterator[str]:
    """Yield an admin DSN: $PYLEASE_TEST_DSN, the local server, or a throwaway one."""
    explicit = os.environ.get("PYLEASE_TEST_DSN") or os.environ.get("TESTS_SERVER_DSN")
    if explicit:
        yield explicit
        return
    # PYLEASE_TEST_THROWAWAY=1 skips the local server, to exercise the fallback.
    if os.environ.get("PYLEASE_TEST_THROWAWAY") != "1" and _answers(LOCAL):
        yield LOCAL
        return
    with _throwaway(request) as dsn:
        yield dsn
