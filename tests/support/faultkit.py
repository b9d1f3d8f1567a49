"""What the fault tests start and break: a restartable PostgreSQL, PgBouncer, holder processes,
a TCP proxy that delays, drops or blackholes, forked children, and stepped clocks.

Everything listens on loopback only and runs as the ``postgres`` user when the
tests run as root (PostgreSQL and PgBouncer both refuse root). Every wait here is
bounded; the bounds are generous, since the tests check behaviour, not durations.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.support.pgserver import _pg_bindir, free_port

ROOT = Path(__file__).resolve().parents[2]
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

    def __init__(self, env: dict[str, str] | None = None) -> None:
        # ``env``: extra environment of the server processes (e.g. a FakeClock's).
        self.env = env or {}
        self.base = Path(tempfile.mkdtemp(prefix="pylease-fault-pg-"))
        os.chmod(self.base, 0o755)
        _give_to_postgres(self.base)
        self.data = self.base / "data"
        self.log = self.base / "postgresql.log"
        self.port = free_port()
        self.bindir = _pg_bindir()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, env: dict[str, str] | None = None) -> None:
        subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
            cwd=self.base,
            env={**os.environ, **(env or {})},
            **_as_postgres(),
        )

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} -c fsync=off"
            " -c max_connections=50"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "start",
            env=self.env,
        )
        wait_until(lambda: answers(self.dsn), what="the throwaway server to answer")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def server(env: dict[str, str] | None = None) -> Iterator[Server]:
    srv = Server(env)
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
        self.port = free_port()
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
    """A process of tests/support/fault_holder.py whose JSON lines are read by a thread."""

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


# A TCP proxy that can break the network on demand ------------------------------

FORWARD = "forward"
DELAY = "delay"
BLACKHOLE = "blackhole"
DROP = "drop"
# The first 8 bytes of a PostgreSQL CancelRequest: its length (16) and its code.
CANCEL_REQUEST = (16).to_bytes(4, "big") + (80877102).to_bytes(4, "big")
# The codes of SSLRequest and GSSENCRequest.
ENCRYPTION_REQUESTS = ((80877103).to_bytes(4, "big"), (80877104).to_bytes(4, "big"))


class Pipe:
    """One proxied connection; its mode may change while it is open.

    ``forward`` passes bytes on; ``delay`` passes them on ``delay`` seconds late;
    ``blackhole`` keeps reading (the kernel ACKs) and never passes anything on in
    either direction, so TCP stays up while nothing answers; ``drop`` resets both
    ends (SO_LINGER 0: an RST, not a FIN).
    """

    def __init__(self, client: socket.socket, upstream: tuple[str, int], mode: str, delay: float):
        self.client = client
        self.upstream = upstream
        self.mode = mode
        self.delay = delay
        self.sent_up = 0
        self.sent_down = 0
        self.first_bytes = b""
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faultkit-pipe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set(self, mode: str, delay: float | None = None) -> None:
        if delay is not None:
            self.delay = delay
        self.mode = mode

    @property
    def is_cancel(self) -> bool:
        return self.first_bytes[:8] == CANCEL_REQUEST

    def _opening(self) -> bytes:
        """The client's first packet header, answering SSL and GSS requests with "N".

        libpq asks for encryption before its startup or cancel packet; refusing it
        here, as a server without SSL does, lets the proxy see which one follows
        (so a query cancel is counted even when nothing would ever answer it).
        """
        self.client.settimeout(10)
        head = b""
        while True:
            while len(head) < 8:
                chunk = self.client.recv(8 - len(head))
                if not chunk:
                    raise OSError("client went away")
                head += chunk
            if head[4:8] in ENCRYPTION_REQUESTS:
                self.client.sendall(b"N")
                head = b""
                continue
            self.client.settimeout(None)
            return head

    def _run(self) -> None:
        try:
            self.first_bytes = head = self._opening()
            server = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            self._reset(self.client)
            self.closed.set()
            return
        server.settimeout(None)
        pending: list[tuple[float, socket.socket, bytes]] = []
        if self.mode != BLACKHOLE:
            pending.append((time.monotonic(), server, head))
        try:
            while self.mode != DROP:
                # A short select timeout, so a mode change takes effect at once.
                readable, _, _ = select.select([self.client, server], [], [], 0.02)
                now = time.monotonic()
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if self.mode == BLACKHOLE:
                        continue  # read, so the kernel keeps ACKing; never answered
                    other = server if sock is self.client else self.client
                    due = now + (self.delay if self.mode == DELAY else 0.0)
                    pending.append((due, other, data))
                while pending and pending[0][0] <= time.monotonic() and self.mode != BLACKHOLE:
                    _due, other, data = pending.pop(0)
                    other.sendall(data)
                    if other is server:
                        self.sent_up += len(data)
                    else:
                        self.sent_down += len(data)
        except OSError:
            pass
        finally:
            if self.mode == DROP:
                self._reset(self.client)
                self._reset(server)
            else:
                self.client.close()
                server.close()
            self.closed.set()

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()


class Proxy:
    """A loopback TCP proxy in front of ``upstream``, for network faults in tests.

    ``set(mode)`` changes every open connection and those to come; ``pipes`` lists
    each connection made so far, so a test can break one alone. Connections that
    open with a PostgreSQL CancelRequest are counted in ``cancels``.
    """

    def __init__(self, upstream_dsn: str) -> None:
        params = psycopg.conninfo.conninfo_to_dict(upstream_dsn)
        self._params = params
        self.upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self.mode = FORWARD
        self.delay = 0.0
        self.pipes: list[Pipe] = []
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name="faultkit-proxy", daemon=True)
        self._thread.start()

    @property
    def dsn(self) -> str:
        """The upstream DSN, reached through this proxy."""
        params = {**self._params, "host": "127.0.0.1", "port": str(self.port)}
        return psycopg.conninfo.make_conninfo("", **params)

    def set(self, mode: str, delay: float | None = None) -> None:
        with self._lock:
            self.mode = mode
            if delay is not None:
                self.delay = delay
            for pipe in self.pipes:
                pipe.set(mode, delay)

    @property
    def cancels(self) -> int:
        with self._lock:
            return sum(1 for p in self.pipes if p.is_cancel)

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            with self._lock:
                pipe = Pipe(client, self.upstream, self.mode, self.delay)
                self.pipes.append(pipe)
            if pipe.mode == DROP:
                Pipe._reset(client)
                pipe.closed.set()
                continue
            pipe.start()

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.set(DROP)


@contextlib.contextmanager
def proxy(upstream_dsn: str) -> Iterator[Proxy]:
    """A :class:`Proxy` in front of ``upstream_dsn``; every connection is reset at the end."""
    p = Proxy(upstream_dsn)
    try:
        yield p
    finally:
        p.close()


# Fork ----------------------------------------------------------------------------


@dataclass
class ChildResult:
    """How a forked child ended: exit code (or -signal), what it printed, what escaped."""

    status: int
    output: str
    escaped: str | None

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines()


class Fork:
    """Fork at a point of a test, and let the child leave whatever blocks it is in.

    ::

        fork = Fork()
        with fork.guard():             # the child ends here, whatever escaped
            with lease(...) as held:
                if fork.fork():        # True in the child
                    sys.exit(0)        # the child leaves the block
        result = fork.wait()           # in the parent: ChildResult

    In the child, stdout and stderr go to a pipe the parent reads; what escapes
    :meth:`guard` is reported by its type name, and the child exits with a
    SystemExit's code, 1 for any other exception, 0 when nothing escaped.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.in_child = False
        self._read_fd: int | None = None

    def fork(self) -> bool:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.in_child = True
            os.close(read_fd)
            os.dup2(write_fd, 1)
            os.dup2(write_fd, 2)
            os.close(write_fd)
            return True
        os.close(write_fd)
        self.pid = pid
        self._read_fd = read_fd
        return False

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            if not self.in_child:
                raise
            self._child_exit(exc)
        if self.in_child:
            self._child_exit(None)

    def _child_exit(self, exc: BaseException | None) -> None:
        # Straight to the file descriptors: sys.stdout may be pytest's capture.
        code = 0
        escaped = "none" if exc is None else type(exc).__name__
        try:
            if isinstance(exc, SystemExit):
                code = exc.code if isinstance(exc.code, int) else 1
            elif exc is not None:
                import traceback

                os.write(2, "".join(traceback.format_exception(exc)).encode())
                code = 1
            os.write(1, f"faultkit-escaped:{escaped}\n".encode())
        finally:
            os._exit(code)

    def wait(self, timeout: float = BOUND) -> ChildResult:
        """The child's end; a child still running after ``timeout`` is killed and reported."""
        assert self.pid is not None and self._read_fd is not None
        chunks: list[bytes] = []
        limit = time.monotonic() + timeout
        status: int | None = None
        while True:
            readable, _, _ = select.select([self._read_fd], [], [], 0.05)
            if readable:
                data = os.read(self._read_fd, 65536)
                if data:
                    chunks.append(data)
                    continue
                break
            if time.monotonic() > limit:
                os.kill(self.pid, signal.SIGKILL)
                chunks.append(b"\nfaultkit: child killed after the timeout (a deadlock?)\n")
                break
        os.close(self._read_fd)
        _pid, raw = os.waitpid(self.pid, 0)
        status = os.waitstatus_to_exitcode(raw)
        output = b"".join(chunks).decode(errors="replace")
        escaped = None
        for line in output.splitlines():
            if line.startswith("faultkit-escaped:"):
                escaped = line.split(":", 1)[1]
        return ChildResult(status, output, escaped)


# Clocks: libfaketime -----------------------------------------------------------

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def libfaketime() -> Path:
    """The libfaketime library; .ci/run installs it (apt-get install faketime libfaketime)."""
    found = next(
        (
            p
            for p in (LIBFAKETIME, *Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
            if p.exists()
        ),
        None,
    )
    assert found is not None, "libfaketime is not installed: apt-get install faketime libfaketime"
    return found


class FakeClock:
    """A wall clock for child processes that a test can step while they run.

    The offset lives in a file libfaketime rereads (``FAKETIME_TIMESTAMP_FILE``,
    cache of ``FAKETIME_CACHE_DURATION`` seconds). CLOCK_MONOTONIC and
    CLOCK_BOOTTIME are left alone (``FAKETIME_DONT_FAKE_MONOTONIC``): only the
    wall clock steps, as with an NTP step or a wrong manual setting, and the
    belief witness keeps its one system-wide clock.
    """

    def __init__(self, offset: float = 0.0, base: Path | None = None) -> None:
        self.base = base or Path(tempfile.mkdtemp(prefix="safety-faketime-"))
        os.chmod(self.base, 0o755)
        self.file = self.base / "faketime.rc"
        self.step_to(offset)

    def step_to(self, offset: float) -> None:
        """Put the fake clock ``offset`` seconds ahead of the real one (atomically)."""
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(f"{offset:+.3f}s\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.file)

    def env(self) -> dict[str, str]:
        """Environment variables that put a child process on this clock."""
        return {
            "LD_PRELOAD": str(libfaketime()),
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_DONT_RESET": "1",
        }

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def fake_clock(offset: float = 0.0) -> Iterator[FakeClock]:
    clock = FakeClock(offset)
    try:
        yield clock
    finally:
        clock.cleanup()


def python_under(clock: FakeClock, code: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``python -c code args`` with its wall clock on ``clock``."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, **clock.env(), **kwargs.pop("env", {})},
        text=True,
        **kwargs,
    )
