"""Celery: a task that must run once per schedule slot, on a real worker pool of two
processes with the Redis broker, whatever the number of copies of its message
(two beats, redeliveries). The app is tests/support/celery_app.py."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Installed by the dev extra (`make test`): a missing one fails, never skips.
import celery  # noqa: F401
import psycopg
import pytest
import redis  # noqa: F401

REDIS = ("127.0.0.1", 6379)
ROOT = Path(__file__).resolve().parents[2]
COPIES = 6  # messages per slot
SLOTS = 3

Conn = psycopg.Connection[Any]


def _redis_up() -> bool:
    try:
        with socket.create_connection(REDIS, timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="module")
def redis_server() -> Iterator[str]:
    """The machine's Redis on 127.0.0.1:6379, started here if it is not running."""
    started = None
    if not _redis_up():
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (apt-get install redis-server)"
        started = subprocess.Popen(
            [
                binary,
                "--port",
                str(REDIS[1]),
                "--bind",
                REDIS[0],
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not _redis_up():
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
    yield f"redis://{REDIS[0]}:{REDIS[1]}/0"
    if started is not None:
        started.terminate()
        started.wait(10)


def wait_for(conn: Conn, query: str, want: Any, what: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while (got := conn.execute(query).fetchone()) != want:
        assert time.monotonic() < deadline, f"{what}: {got} after {within}s"
        time.sleep(0.1)


@pytest.fixture
def worker(dsn: str, conn: Conn, redis_server: str) -> Iterator[Any]:
    conn.execute("CREATE TABLE integ_deliveries (slot int, ran boolean, pid int)")
    conn.execute("CREATE TABLE integ_ready (pid int)")
    prefix = f"integ-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "INTEG_CELERY_DSN": dsn,
        "INTEG_CELERY_BROKER": redis_server,
        "INTEG_CELERY_PREFIX": prefix,
    }
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "tests.support.celery_app", "worker",
            "--pool=prefork", "--concurrency=2", "--loglevel=WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"{prefix}@%h",
        ],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(conn, "SELECT count(*) FROM integ_ready", (1,), "worker not ready", within=60)
        saved = {k: os.environ.get(k) for k in env if k.startswith("INTEG_CELERY_")}
        os.environ.update({k: env[k] for k in saved})
        import importlib

        from tests.support import celery_app

        # Read the environment anew: a module imported by an earlier test has another DSN.
        yield importlib.reload(celery_app)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if "Traceback" in (out or ""):
            print(out)
        import redis

        client = redis.Redis.from_url(redis_server)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)


def test_a_burst_of_one_scheduled_task_runs_once_per_slot(worker: Any, conn: Conn) -> None:
    for slot in range(SLOTS):
        # The next slot comes when the name is free again, as the next tick of a
        # schedule whose period is longer than min_hold would.
        wait_for(
            conn,
            "SELECT coalesce(bool_and(expires_at <= clock_timestamp()), true)"
            " FROM pylease_leases WHERE name = 'digest'",
            (True,),
            "the lease never became free",
        )
        for _copy in range(COPIES):
            worker.digest.delay(slot)
        wait_for(
            conn,
            f"SELECT count(*) FROM integ_deliveries WHERE slot = {slot}",
            (COPIES,),
            f"slot {slot}: not every copy was delivered",
        )
    rows = conn.execute(
        "SELECT slot, count(*) FILTER (WHERE ran), count(*) FROM integ_deliveries"
        " GROUP BY slot ORDER BY slot"
    ).fetchall()
    assert rows == [(slot, 1, COPIES) for slot in range(SLOTS)]
    pids = conn.execute("SELECT count(DISTINCT pid) FROM integ_deliveries").fetchone()
    assert pids == (2,), "both worker processes took messages"
    fences = conn.execute("SELECT fence FROM pylease_leases WHERE name = 'digest'").fetchone()
    assert fences == (SLOTS,)  # one grant per slot, no more


def test_beat_under_pylease_leader_runs_on_one_host_at_a_time(
    dsn: str, conn: Conn, redis_server: str, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE integ_beats (pid int, ppid int, at timestamptz DEFAULT now())")
    prefix = f"integ-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "INTEG_CELERY_DSN": dsn,
        "INTEG_CELERY_BROKER": redis_server,
        "INTEG_CELERY_PREFIX": prefix,
    }
    hosts = [
        subprocess.Popen(
            [
                str(Path(sys.executable).with_name("pylease")),
                "leader",
                "integ-beat",
                "--ttl",
                "5s",
                "--quiet",
                "--dsn",
                dsn,
                "--",
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.support.celery_app",
                "beat",
                "--loglevel=WARNING",
                "-s",
                str(tmp_path / f"schedule-{n}"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(2)
    ]
    try:
        wait_for(conn, "SELECT count(*) FROM integ_beats", (1,), "no beat started", within=60)
        time.sleep(3)  # the standby does not start a second beat meanwhile
        assert conn.execute("SELECT count(*) FROM integ_beats").fetchone() == (1,)
        first = conn.execute("SELECT ppid FROM integ_beats").fetchone()
        assert first is not None
        leader = next(h for h in hosts if h.pid == first[0])
        leader.send_signal(signal.SIGTERM)  # a deploy stops this host: beat stops, it resigns
        leader.wait(30)
        wait_for(conn, "SELECT count(*) FROM integ_beats", (2,), "the standby never took over")
        rows = conn.execute("SELECT ppid FROM integ_beats ORDER BY at").fetchall()
        standby = next(h for h in hosts if h is not leader)
        assert [r[0] for r in rows] == [leader.pid, standby.pid]
        assert standby.poll() is None  # the new leader runs beat
    finally:
        for host in hosts:
            if host.poll() is None:
                host.send_signal(signal.SIGTERM)
        for host in hosts:
            try:
                host.wait(30)
            except subprocess.TimeoutExpired:
                host.kill()
                host.wait()
