"""Finding a PostgreSQL server for the tests, or starting a throwaway one."""

from __future__ import annotations

import contextlib
import os
import pwd
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
    port = _free_port()
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
    explicit = os.environ.get("PYLEASE_TEST_DSN")
    if explicit:
        yield explicit
        return
    # PYLEASE_TEST_THROWAWAY=1 skips the local server, to exercise the fallback.
    if os.environ.get("PYLEASE_TEST_THROWAWAY") != "1" and _answers(LOCAL):
        yield LOCAL
        return
    with _throwaway(request) as dsn:
        yield dsn
