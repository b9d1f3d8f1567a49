"""What the fault tests start and break: a restartable PostgreSQL, PgBouncer, holder processes.

Everything listens on loopback only and runs as the ``postgres`` user when the
tests run as root (PostgreSQL and PgBouncer both refuse root). Every wait here is
bounded; the bounds are generous, since the tests check behaviour, not durations.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from tests.pgserver import _free_port, _pg_bindir

ROOT = Path(__file__).resolve().parent.parent
HOLDER = Path(__file__).resolve().parent / "fault_holder.py"
BOUND = 30.0


def _as_postgres() -> dict[str, Any]:
    """subprocess keyword arguments that run a server as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("postgres")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(path, user.pw_uid, user.pw_gid)


def answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def wait_until(predicate: Any, timeout: float = BOUND, what: str = "a condition") -> None:
    limit = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > limit:
            raise AssertionError(f"gave up after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Server:
    """A throwaway PostgreSQL of our own, on a free loopback port, that tests may stop."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="pylease-fault-pg-"))
        os.chmod(self.base, 0o755)
        _give_to_postgres(self.base)
        self.data = self.base / "data"
        self.log = self.base / "postgresql.log"
        self.port = _free_port()
        self.bindir = _pg_bindir()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
            cwd=self.base,
            **_as_postgres(),
        )

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} -c fsync=off"
            " -c max_connections=50"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        wait_until(lambda: answers(self.dsn), what="the throwaway server to answer")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def server() -> Iterator[Server]:
    srv = Server()
    try:
        srv.init()
        srv.start()
        yield srv
    finally:
        srv.cleanup()


# PgBouncer ---------------------------------------------------------------------


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (str(p) for p in (Path("/usr/sbin/pgbouncer"),) if p.exists()), None
    )


class Bouncer:
    """PgBouncer in transaction mode in front of a server, on a free loopback port."""

    def __init__(self, upstream: str) -> None:
        params = psycopg.conninfo.conninfo_to_dict(upstream)
        self.host = str(params.get("host") or "127.0.0.1")
        self.upstream_port = int(params.get("port") or 5432)
        self.user = str(params.get("user") or "postgres")
        self.password = str(params.get("password") or "")
        self.port = _free_port()
        self.base = Path(tempfile.mkdtemp(prefix="pylease-pgbouncer-"))
        os.chmod(self.base, 0o755)
        _give_to_postgres(self.base)
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def via(self, direct: str) -> str:
        """The DSN of the same database, reached through PgBouncer."""
        dbname = psycopg.conninfo.conninfo_to_dict(direct).get("dbname") or "postgres"
        return self.url(str(dbname))

    def start(self, singles: dict[str, str]) -> None:
        """Start; ``singles`` maps alias -> database served by ONE server connection."""
        upstream = f"host={self.host} port={self.upstream_port} user={self.user}"
        if self.password:
            upstream += f" password={self.password}"
        lines = ["[databases]"]
        lines += [f"{alias} = {upstream} dbname={db} pool_size=1" for alias, db in singles.items()]
        lines.append(f"* = {upstream}")
        lines += [
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.base / 'userlist.txt'}",
            "pool_mode = transaction",
            "default_pool_size = 20",
            "max_client_conn = 500",
            "max_db_connections = 40",
            "server_reset_query =",
            "ignore_startup_parameters = extra_float_digits,options",
            f"logfile = {self.base / 'pgbouncer.log'}",
            f"pidfile = {self.base / 'pgbouncer.pid'}",
            "server_login_retry = 1",
        ]
        ini = self.base / "pgbouncer.ini"
        ini.write_text("\n".join(lines) + "\n")
        (self.base / "userlist.txt").write_text(f'"{self.user}" ""\n')
        for path in (ini, self.base / "userlist.txt"):
            _give_to_postgres(path)
        binary = pgbouncer_binary()
        assert binary, "pgbouncer is not installed: make test installs it (scripts/test-deps.sh)"
        self._command = [binary, str(ini)]
        self._launch()

    def _launch(self) -> None:
        self.proc = subprocess.Popen(
            self._command,
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **_as_postgres(),
        )
        wait_until(
            lambda: (
                self.proc is None or self.proc.poll() is not None or answers(self.url("postgres"))
            ),
            what="pgbouncer to answer",
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited: {self.logtext()}")

    def kill(self) -> None:
        """Stop PgBouncer at once (SIGKILL): every client and server connection drops."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def relaunch(self) -> None:
        """Start it again with the same configuration, on the same port."""
        self._launch()

    def logtext(self) -> str:
        try:
            return (self.base / "pgbouncer.log").read_text()
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)


# Holder processes ----------------------------------------------------------------


class Proc:
    """A process of tests/fault_holder.py whose JSON lines are read by a thread."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, str(HOLDER), *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._err.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "noise", "line": line}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def wait_for(self, event: str, timeout: float = BOUND, count: int = 1) -> dict[str, Any]:
        """The ``count``-th event of this kind, once it came."""
        limit = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [e for e in self.events if e.get("event") == event]
                if len(found) >= count:
                    return found[count - 1]
                left = limit - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no {event!r} event (#{count}) from the holder within {timeout}s;"
                        f" events: {self.events[-10:]}; stderr: {self.stderr[-2000:]}"
                    )
                self._cond.wait(min(left, 0.1))

    def seen(self, event: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e.get("event") == event]

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(BOUND)
        self._reader.join(5)


@contextlib.contextmanager
def holders() -> Iterator[list[Proc]]:
    """A list to start holder processes into; every one is killed at the end."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.close()
