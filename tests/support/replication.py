"""A PostgreSQL primary and a streaming standby, built from the installed binaries, to fail over.

The pair is built once per session as a template (``initdb``, ``pg_basebackup -R``,
pylease migrated into the primary, the standby caught up) and copied for every test
(two ``cp -a`` and two starts: about a second), so a test may crash, promote and cut
what it likes. Everything listens on 127.0.0.1 only, on free ports, runs as the
``postgres`` user when the tests run as root, and lives under a temp dir prefixed
``failover-`` (in /dev/shm when it has room); every server started here is stopped
again, also when a test fails.

The walreceiver is cut by emptying the standby's ``primary_conninfo`` and reloading
(PostgreSQL 13+ restarts the walreceiver on that reload): the standby keeps what it
has and receives nothing more until it is restored, exactly a replication lag.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from pylease.migrate import migrate
from tests.support.pgserver import free_port


def _bindir() -> Path:
    """PYLEASE_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin, else pg_ctl's on PATH."""
    explicit = os.environ.get("PYLEASE_PG_BINDIR")
    if explicit:
        return Path(explicit)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
    )
    if versions:
        return versions[0]
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    raise RuntimeError("no PostgreSQL binaries: install postgresql or set PYLEASE_PG_BINDIR")


BINDIR = _bindir()
PREFIX = "failover-"
# Liveness bounds only: the machine is shared, nothing here measures speed.
BOUND = 60.0
STANDBY_NAME = "standby1"
SLOT = "failover_standby1"

# Settings of both servers (the standby copies the primary's postgresql.conf).
# fsync=off is safe here: `pg_ctl stop -m immediate` kills the server, not the
# kernel, whose page cache keeps every write; it only spares the shared disk.
BASE_CONF = """
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
wal_level = replica
max_wal_senders = 4
max_replication_slots = 4
hot_standby = on
fsync = off
full_page_writes = on
shared_buffers = 16MB
max_connections = 40
wal_keep_size = 64MB
wal_receiver_status_interval = 1s
wal_retrieve_retry_interval = 200ms
log_min_messages = warning
log_line_prefix = '%m [%p] '
"""

_started: set[Path] = set()


def _scratch() -> str | None:
    """Where data directories go: memory (tmpfs) when there is room, else the temp dir.

    Copying the pair is most of a test's setup, and on a shared disk it is slow.
    """
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        if shutil.disk_usage(shm).free > 2 << 30 and os.access(shm, os.W_OK):
            return str(shm)
    return None


def _as_postgres() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("postgres")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(path, user.pw_uid, user.pw_gid)


def _run(*args: str, timeout: float = BOUND) -> str:
    done = subprocess.run(
        [str(BINDIR / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **_as_postgres(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def url(port: int, dbname: str = "postgres") -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{dbname}"


def wait_until(predicate: Callable[[], object], timeout: float = BOUND, what: str = "it") -> None:
    """Poll ``predicate`` until it is truthy; AssertionError after ``timeout`` seconds."""
    limit = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except psycopg.Error:
            pass
        if time.monotonic() > limit:
            raise AssertionError(f"gave up after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def query(port: int, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of one statement on a fresh autocommit connection to the server on ``port``."""
    with psycopg.connect(url(port), autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(sql, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def answers(port: int) -> bool:
    try:
        query(port, "SELECT 1")
    except psycopg.Error:
        return False
    return True


class Node:
    """One server of the pair: its data directory, port and log."""

    def __init__(self, data: Path, port: int, role: str) -> None:
        self.data = data
        self.port = port
        self.role = role
        self.log = data.parent / f"{role}.log"

    @property
    def url(self) -> str:
        return url(self.port)

    def start(self) -> None:
        _started.add(self.data)
        _run("pg_ctl", "start", "-w", "-t", str(int(BOUND)), "-D", str(self.data),
             "-l", str(self.log), "-o", f"-p {self.port}")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        _run("pg_ctl", "stop", "-w", "-t", str(int(BOUND)), "-D", str(self.data), "-m", mode)
        _started.discard(self.data)

    def crash(self) -> None:
        """Kill the server as a power cut would its processes (``-m immediate``)."""
        self.stop("immediate")

    def kill(self) -> None:
        """Stop it whatever state it is in: for teardown; never raises."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        pidfile = self.data / "postmaster.pid"
        with contextlib.suppress(Exception):
            pid = int(pidfile.read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        _started.discard(self.data)

    def set_auto_conf(self, text: str) -> None:
        # Written in place, so it stays the postgres user's file.
        (self.data / "postgresql.auto.conf").write_text(text)

    def reload(self) -> None:
        _run("pg_ctl", "reload", "-D", str(self.data))

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return query(self.port, sql, params)

    def answers(self) -> bool:
        return answers(self.port)

    def in_recovery(self) -> bool:
        return bool(self.query("SELECT pg_is_in_recovery()")[0][0])

    def timeline(self) -> int:
        """The timeline WAL is written on now (a standby: the one it replays)."""
        if self.in_recovery():
            rows = self.query("SELECT received_tli FROM pg_stat_wal_receiver")
            if rows and rows[0][0]:
                return int(rows[0][0])
            return int(self.query("SELECT timeline_id FROM pg_control_checkpoint()")[0][0])
        # Not pg_control_checkpoint(): right after a promotion it still names the old one.
        name = self.query("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]
        return int(name[:8], 16)

    def logtext(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class Pair:
    """A primary and its standby, copied from the template; see the module docstring."""

    def __init__(self, base: Path, mode: str) -> None:
        self.base = base
        self.mode = mode
        self.primary = Node(base / "primary", free_port(), "primary")
        self.standby = Node(base / "standby", free_port(), "standby")
        self.cut_now = False

    # Configuration ------------------------------------------------------------

    def _primary_conf(self) -> str:
        if self.mode == "async":
            return "synchronous_standby_names = ''\n"
        commit = "remote_apply" if self.mode == "remote_apply" else "on"
        return f"synchronous_standby_names = '*'\nsynchronous_commit = {commit}\n"

    def _standby_conf(self, connected: bool) -> str:
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user=postgres "
            f"application_name={STANDBY_NAME} connect_timeout=2"
            if connected
            else ""
        )
        # No synchronous_standby_names: once promoted it has no standby to wait for.
        return f"primary_conninfo = '{conninfo}'\nprimary_slot_name = '{SLOT}'\n"

    @property
    def dsn(self) -> str:
        """A multi-host key=value string that always finds whichever is the primary."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
            "user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2"
        )

    @property
    def multihost_url(self) -> str:
        """The same as :attr:`dsn`, as a URL."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            "/postgres?target_session_attrs=read-write&connect_timeout=2"
        )

    # Operations ------------------------------------------------------------------

    def start(self) -> None:
        self.primary.set_auto_conf(self._primary_conf())
        self.standby.set_auto_conf(self._standby_conf(connected=True))
        self.primary.start()
        self.standby.start()
        self.wait_streaming()

    def streaming(self) -> bool:
        rows = self.primary.query(
            "SELECT sync_state, replay_lsn = pg_current_wal_lsn() FROM pg_stat_replication "
            "WHERE application_name = %s AND state = 'streaming'",
            (STANDBY_NAME,),
        )
        if not rows:
            return False
        want = "async" if self.mode == "async" else "sync"
        return bool(rows[0][0] == want)

    def wait_streaming(self) -> None:
        wait_until(self.streaming, what="the standby to stream from the primary")

    def caught_up(self) -> bool:
        """The standby has replayed everything the primary has written so far."""
        lsn = self.primary.query("SELECT pg_current_wal_lsn()")[0][0]
        replayed = self.standby.query("SELECT pg_last_wal_replay_lsn()")[0][0]
        return bool(self.standby.query("SELECT %s::pg_lsn >= %s::pg_lsn", (replayed, lsn))[0][0])

    def cut(self) -> None:
        """Stop the standby's walreceiver: from now on the standby lags."""
        self.standby.set_auto_conf(self._standby_conf(connected=False))
        self.standby.reload()
        self.cut_now = True
        wait_until(
            lambda: not self.standby.query("SELECT 1 FROM pg_stat_wal_receiver"),
            what="the walreceiver to stop",
        )

    def restore(self) -> None:
        """Let the standby stream again (it catches up from the slot)."""
        self.standby.set_auto_conf(self._standby_conf(connected=True))
        self.standby.reload()
        self.cut_now = False
        self.wait_streaming()

    def crash_primary(self) -> None:
        self.primary.crash()

    def promote(self) -> float:
        """Promote the standby, waiting until it takes writes; the seconds that took."""
        started = time.monotonic()
        _run("pg_ctl", "promote", "-w", "-t", str(int(BOUND)), "-D", str(self.standby.data))
        wait_until(lambda: not self.standby.in_recovery(), what="the standby to leave recovery")
        return time.monotonic() - started

    def failover(self) -> float:
        """Crash the primary and promote the standby; the seconds from crash to promoted."""
        started = time.monotonic()
        self.crash_primary()
        self.promote()
        return time.monotonic() - started

    def stop(self) -> None:
        self.standby.kill()
        self.primary.kill()


class Template:
    """The pair's data directories, built once and copied per test."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix=PREFIX + "template-", dir=_scratch()))
        os.chmod(self.base, 0o755)
        _chown(self.base)
        self.build_seconds = 0.0

    def build(self) -> None:
        started = time.monotonic()
        primary = Node(self.base / "primary", free_port(), "primary")
        standby = Node(self.base / "standby", free_port(), "standby")
        _run("initdb", "-D", str(primary.data), "-U", "postgres", "-A", "trust",
             "--no-sync", "--wal-segsize=1", "-E", "UTF8", "--locale=C")  # fmt: skip
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write(BASE_CONF)
        primary.start()
        try:
            migrate(primary.url, say=lambda _line: None)
            _run("pg_basebackup", "-D", str(standby.data), "-h", "127.0.0.1",
                 "-p", str(primary.port), "-U", "postgres", "-R", "-X", "stream",
                 "-C", "-S", SLOT, "-c", "fast", "--no-sync")  # fmt: skip
            pair = Pair(self.base, "async")
            pair.primary, pair.standby = primary, standby
            standby.set_auto_conf(pair._standby_conf(connected=True))
            standby.start()
            wait_until(pair.caught_up, what="the template's standby to catch up")
            # The primary first: its walsender hands the shutdown checkpoint to the
            # standby, so both copies start from the same point.
            primary.stop()
            standby.stop()
        finally:
            standby.kill()
            primary.kill()
        for leftover in ("primary.log", "standby.log"):
            (self.base / leftover).unlink(missing_ok=True)
        self.build_seconds = time.monotonic() - started

    @contextlib.contextmanager
    def pair(self, mode: str = "sync") -> Iterator[Pair]:
        """A started copy of the pair: ``sync``, ``remote_apply`` or ``async``."""
        base = Path(tempfile.mkdtemp(prefix=PREFIX + "pair-", dir=_scratch()))
        try:
            os.chmod(base, 0o755)
            _chown(base)
            subprocess.run(
                ["cp", "-a", str(self.base / "primary"), str(self.base / "standby"), str(base)],
                check=True,
                timeout=BOUND,
            )
            pair = Pair(base, mode)
            try:
                pair.start()
                yield pair
            finally:
                pair.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def _kill_leftovers() -> None:
    # Last resort, should a test process end without its fixtures' teardown.
    for data in list(_started):
        Node(data, 0, "leftover").kill()


atexit.register(_kill_leftovers)
