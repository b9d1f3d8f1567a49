"""The SQLite backend on real files and real processes: races, crashes, broken files.

The semantics are proven by tests/sql/test_conformance.py on both backends; this
module covers what only SQLite has: many processes on one file, the file
itself, where it lives, and the SQL files other languages run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pylease._resources import data_dir
from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    SchemaMissing,
)
from pylease.sqlite import (
    COMPANIONS,
    OPERATIONS,
    AsyncSqliteBackend,
    SqliteBackend,
    check_filesystem,
    connect,
    default_path,
    filesystem_type,
    migrate,
    path_of,
)

LONG = timedelta(seconds=30)
BOUND = 20.0  # seconds: the most any polling loop here may take before the test fails
SQL_DIR = data_dir("sql", "sqlite")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "leases.sqlite3"


@pytest.fixture
def backend(db: Path) -> Iterator[SqliteBackend]:
    conn = connect(db)
    try:
        yield SqliteBackend(conn)
    finally:
        conn.close()


SQLITE_MIGRATIONS = [
    "pylease-0001-leases",
    "pylease-0002-safety",
    "pylease-0003-operations",
    "pylease-0004-permits",
    "pylease-0005-prune",
    "pylease-0006-groups",
    "pylease-0007-shared",
    "pylease-0008-data",
]


def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {BOUND}s waiting for {what}")
        time.sleep(0.02)


# Many processes, one file ------------------------------------------------------

WITNESS = """
CREATE TABLE IF NOT EXISTS witness (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    name   TEXT NOT NULL,
    holder TEXT NOT NULL,
    fence  INTEGER NOT NULL,
    event  TEXT NOT NULL,
    ok     INTEGER NOT NULL,
    ttl    REAL NOT NULL
)
"""
RACE_NAMES = ("alpha", "beta")
RACE_PROCESSES = 8
RACE_TENURES = 4


def _race_worker(path: str, worker: int, start: Any) -> None:
    """Claim either name until RACE_TENURES tenures are done, witnessing each one.

    The witness rows are written under the lease, each in one BEGIN IMMEDIATE
    transaction with the holds() check: exactly a fenced write.
    """
    start.wait(BOUND)
    conn = connect(path, busy_timeout=BOUND)
    backend = SqliteBackend(conn)
    conn.execute(WITNESS)
    rng = random.Random(worker)
    deadline = time.monotonic() + BOUND
    attempt = 0
    done = 0
    while done < RACE_TENURES and time.monotonic() < deadline:
        attempt += 1
        name = rng.choice(RACE_NAMES)
        holder = f"worker{worker}-{attempt}"
        # One tenure in four is abandoned, to be taken over after its expiry.
        abandon = rng.random() < 0.25
        ttl = timedelta(seconds=0.5 if abandon else 30)
        fence = backend.claim(name, ttl, holder)
        if fence is None:
            time.sleep(rng.uniform(0.001, 0.01))
            continue
        for event in ("start", "end"):
            with backend.transaction() as tx:
                ok = backend.holds(name, holder, fence)
                tx.execute(
                    "INSERT INTO witness (name, holder, fence, event, ok, ttl) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (name, holder, fence, event, ok, ttl.total_seconds()),
                )
            if event == "start":
                time.sleep(rng.uniform(0.0, 0.01))
        if not abandon:
            backend.release(name, holder)
        done += 1
    conn.close()


def test_eight_processes_two_names_never_overlap(db: Path) -> None:
    # The file does not exist yet: the processes also race to create and migrate it.
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    workers = [
        context.Process(target=_race_worker, args=(str(db), i, start))
        for i in range(RACE_PROCESSES)
    ]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(BOUND * 2)
    for worker in workers:
        if worker.is_alive():
            worker.kill()
    assert [w.exitcode for w in workers] == [0] * RACE_PROCESSES

    with sqlite3.connect(db) as conn:
        events = conn.execute(
            "SELECT name, holder, fence, event, ok, ttl FROM witness ORDER BY seq"
        ).fetchall()
        fences = dict(conn.execute("SELECT name, fence FROM pylease_leases").fetchall())
    assert len(events) == 2 * RACE_PROCESSES * RACE_TENURES
    for name in RACE_NAMES:
        mine = [e for e in events if e[0] == name]
        started: dict[str, int] = {}  # holder -> index of its witnessed start
        last_fence = 0
        for index, (_, holder, fence, event, ok, _ttl) in enumerate(mine):
            if event == "start" and ok:
                assert fence > last_fence, f"{name}: fence {fence} after {last_fence}"
                last_fence = fence
                started[holder] = index
            if event == "end" and ok:
                begin = started[holder]
                # Between this holder's witnessed start and end, nobody else started.
                others = [e for e in mine[begin + 1 : index] if e[3] == "start" and e[4]]
                assert not others, f"{name}: {others} started inside {holder}'s tenure"
        # Every grant was witnessed: each fence once, none skipped, none reissued.
        granted = sorted(e[2] for e in mine if e[3] == "start")
        assert granted == list(range(1, fences[name] + 1))
    # A 30 s lease is never lost here: nobody may claim it while it is held. A
    # 0.5 s one may be, if its process stalled for longer than that.
    lost = [e for e in events if not e[4] and e[5] > 1]
    assert not lost, f"leases taken while held: {lost}"


HOLDER_SCRIPT = """
import sys, threading, time
from datetime import timedelta
from pylease.sqlite import SqliteBackend, connect

backend = SqliteBackend(connect(sys.argv[1]))
fence = backend.claim("job", timedelta(seconds=0.5), "doomed")
print(fence, flush=True)
while backend.renew("job", "doomed"):
    time.sleep(0.1)
"""


def test_holder_killed_with_sigkill_is_taken_over_after_expiry(
    backend: SqliteBackend, db: Path
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, str(db)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"
        assert backend.claim("job", LONG, "successor") is None
        time.sleep(0.7)  # past its first ttl: the holder's renewals keep it
        assert backend.claim("job", LONG, "successor") is None
        child.send_signal(signal.SIGKILL)
        child.wait(BOUND)
        fences: list[int | None] = []

        def taken() -> bool:
            fences.append(backend.claim("job", LONG, "successor"))
            return fences[-1] is not None

        _wait_for(taken, "the lease of a killed holder to be taken over")
    finally:
        child.kill()
        child.wait(BOUND)
    assert fences[-1] == 2
    [row] = backend.status("job")
    assert (row.holder, row.fence, row.held) == ("successor", 2, True)
    assert not backend.holds("job", "doomed", 1)


# Broken files ------------------------------------------------------------------


def test_a_file_that_is_not_a_database(db: Path) -> None:
    db.write_bytes(b"this is no SQLite file\n" * 200)
    with pytest.raises(
        DatabaseUnavailable, match="not a SQLite database, or it is corrupt"
    ) as info:
        connect(db)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert str(db) in str(info.value)


def test_a_database_with_a_damaged_schema_page(db: Path) -> None:
    connect(db).close()
    data = bytearray(db.read_bytes())
    data[100:4096] = bytes(random.Random(0).randrange(256) for _ in range(3996))
    db.write_bytes(bytes(data))
    with pytest.raises(DatabaseUnavailable, match="corrupt") as info:
        SqliteBackend(connect(db)).status()
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


def _connect_as_nobody(path: str, queue: Any) -> None:
    try:
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        connect(path)
    except Exception as exc:
        queue.put((type(exc).__name__, str(exc)))
    else:
        queue.put(("connected", ""))


def test_a_read_only_file() -> None:
    # Root may write any file; a read-only file is read-only for another user.
    # The directory is writable by all (so only the file is refused), in /tmp
    # since pytest's tmp_path is private to this user.
    directory = Path(tempfile.mkdtemp(prefix="pylease-ro-"))
    try:
        directory.chmod(0o1777)
        db = directory / "leases.sqlite3"
        connect(db).close()
        db.chmod(0o444)
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_connect_as_nobody, args=(str(db), queue))
        child.start()
        child.join(BOUND)
        kind, message = queue.get(timeout=BOUND)
    finally:
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
    assert kind == "ConfigurationError", message
    assert "is read-only" in message and str(db) in message


def test_a_missing_directory_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(ConfigurationError, match="does not exist"):
        connect(missing / "leases.sqlite3")
    with pytest.raises(ConfigurationError, match="does not exist"):
        connect(f"sqlite:///{missing}/leases.sqlite3")
    assert not (tmp_path / "no").exists()


def test_a_directory_instead_of_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is a directory"):
        connect(tmp_path)


LONG_WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode = " + sys.argv[2])
conn.execute("CREATE TABLE IF NOT EXISTS other (x)")
conn.execute("BEGIN " + sys.argv[3])
conn.execute("INSERT INTO other VALUES (1)")
print("locked", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def _long_writer(db: Path, journal: str, mode: str) -> Iterator[None]:
    """Another process holding the write lock (BEGIN IMMEDIATE or EXCLUSIVE) for a minute."""
    child = subprocess.Popen(
        [sys.executable, "-c", LONG_WRITER, str(db), journal, mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        yield
    finally:
        child.kill()
        child.wait(BOUND)


@pytest.mark.parametrize("mode", ["IMMEDIATE", "EXCLUSIVE"])
def test_a_long_writer_gives_a_bounded_clear_error(db: Path, mode: str) -> None:
    connect(db).close()
    conn = connect(db, busy_timeout=0.3)
    backend = SqliteBackend(conn)
    with _long_writer(db, "WAL", mode):
        with pytest.raises(DatabaseUnavailable, match="stayed locked by another writer") as info:
            backend.claim("job", LONG, "me")
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert info.value.name == "job"
        # Readers never wait for the writer (WAL).
        assert backend.status() == []
    assert backend.claim("job", LONG, "me") == 1


def test_a_long_writer_during_the_first_connect(db: Path) -> None:
    # A file in rollback-journal mode, exclusively locked: even reading waits.
    with (
        _long_writer(db, "DELETE", "EXCLUSIVE"),
        pytest.raises(DatabaseUnavailable, match="locked"),
    ):
        connect(db, busy_timeout=0.3)
    assert SqliteBackend(connect(db)).claim("job", LONG, "me") == 1


def test_busy_timeout_must_be_positive(db: Path) -> None:
    for bad in (0, -1, float("inf"), float("nan"), True):
        with pytest.raises(InvalidArgument, match="busy_timeout"):
            connect(db, busy_timeout=bad)


# Where the file lives ----------------------------------------------------------


def test_default_path_follows_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_path() == tmp_path / "state" / "pylease" / "leases.sqlite3"
    assert not (tmp_path / "state").exists()  # computing the path creates nothing


def test_default_path_without_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_path() == tmp_path / ".local" / "state" / "pylease" / "leases.sqlite3"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # the XDG spec ignores it
    assert default_path() == tmp_path / ".local" / "state" / "pylease" / "leases.sqlite3"


def test_default_database_is_created_in_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for location in (None, default_path(), f"sqlite:///{default_path()}"):
        conn = connect(location)
        assert SqliteBackend(conn).claim("job", LONG, "me") == 1
        conn.close()
    for directory in (tmp_path / "state", tmp_path / "state" / "pylease"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert default_path().is_file()


def test_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert path_of("sqlite:///rel/x.db") == Path("rel/x.db")
    assert path_of("sqlite:////abs/x.db") == Path("/abs/x.db")
    assert path_of("sqlite:///with%20space.db") == Path("with space.db")
    assert path_of(tmp_path / "x.db") == tmp_path / "x.db"
    assert path_of("~/x.db") == Path.home() / "x.db"
    conn = connect("sqlite:///here.sqlite3")
    SqliteBackend(conn).claim("job", LONG, "me")
    conn.close()
    assert (tmp_path / "here.sqlite3").is_file()
    for bad in (
        "postgresql://localhost/db",
        "sqlite://host/x.db",
        "sqlite:///",
        "sqlite:x.db",
        "sqlite:///x.db?mode=ro",
        "",
    ):
        with pytest.raises(ConfigurationError):
            connect(bad)


def test_an_in_memory_database(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for location in (":memory:", "sqlite:///:memory:"):
        backend = SqliteBackend(connect(location))
        assert backend.claim("job", LONG, "me") == 1
        assert backend.claim("job", LONG, "you") is None
    assert list(tmp_path.iterdir()) == []


def test_a_relative_path_is_kept_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    conn = connect("sqlite:///rel.sqlite3")
    monkeypatch.chdir("/")
    [(_, _, file)] = conn.execute("PRAGMA database_list").fetchall()
    assert file == str(tmp_path / "rel.sqlite3")
    conn.close()


def test_a_network_filesystem_is_refused(tmp_path: Path) -> None:
    mounts = "\n".join(
        [
            "/dev/vda / ext4 rw,relatime 0 0",
            f"server:/export {tmp_path} nfs4 rw,relatime,vers=4.2 0 0",
            f"//nas/share {tmp_path}/smb cifs rw 0 0",
            f"me@host: {tmp_path}/ssh\\040dir fuse.sshfs rw 0 0",
        ]
    )
    assert filesystem_type(tmp_path / "x.db", mounts) == "nfs4"
    assert filesystem_type(tmp_path / "smb" / "x.db", mounts) == "cifs"
    assert filesystem_type(tmp_path / "ssh dir" / "x.db", mounts) == "fuse.sshfs"
    assert filesystem_type("/elsewhere/x.db", mounts) == "ext4"
    for place in (tmp_path, tmp_path / "smb", tmp_path / "ssh dir"):
        with pytest.raises(ConfigurationError, match="cannot be trusted"):
            check_filesystem(place / "x.db", mounts)
    check_filesystem("/elsewhere/x.db", mounts)
    # This machine's own /proc/mounts: the test directory is local.
    check_filesystem(tmp_path)


# The SQL files -------------------------------------------------------------------


def test_each_operation_is_one_sql_file_that_the_backend_runs() -> None:
    files = {p.stem for p in SQL_DIR.glob("*.sql")} - {"schema"}
    assert files == {*OPERATIONS, *COMPANIONS}
    import pylease.sqlite as module

    for operation in (*OPERATIONS, *COMPANIONS):
        text = (SQL_DIR / f"{operation}.sql").read_text(encoding="utf-8")
        statements = module._sql(operation)
        assert statements and all(statement in text for statement in statements)
        assert sqlite3.complete_statement(text)
        header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
        for parameter in set(re.findall(r"(?<!:):([a-z_]+)", text)):
            assert f":{parameter}" in header, f"{operation}.sql: :{parameter} undocumented"
        assert "Result" in header


def test_sql_files_work_from_plain_sqlite3(db: Path) -> None:
    connect(db).close()
    conn = sqlite3.connect(db, isolation_level=None)

    def run(operation: str, **params: Any) -> list[Any]:
        # As another language would: the file's statements in order, the last answers.
        text = (SQL_DIR / f"{operation}.sql").read_text(encoding="utf-8")
        statements, buffer = [], ""
        for line in text.splitlines(keepends=True):
            buffer += line
            if sqlite3.complete_statement(buffer):
                statements.append(buffer)
                buffer = ""
        if operation in ("holds", "status", "holders"):
            return conn.execute(text, params).fetchall()
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements[:-1]:
            conn.execute(statement, params)
        rows = conn.execute(statements[-1], params).fetchall()
        conn.execute("COMMIT")
        return rows

    assert run("claim", name="job", ttl_seconds=30, holder="a", data=None) == [(1,)]
    assert run("claim", name="job", ttl_seconds=30, holder="b", data=None) == []
    assert run("holds", name="job", holder="a", fence=1) == [(1,)]
    [(fence, _expires)] = run("renew", name="job", holder="a", ttl_seconds=None)
    assert fence == 1
    assert run(
        "renew_many", names=json.dumps(["job", "x"]), holders='["a", "a"]', ttl_seconds=60
    ) == [("job", "a")]
    assert len(run("release", name="job", holder="a", min_hold_seconds=None)) == 1
    assert run("steal", name="job", ttl_seconds=30, holder="c", older_than_seconds=0) == [(2,)]
    [row] = run("status", name=None)
    assert row[:3] == ("job", "c", 2) and row[6] == 1
    assert row[3] <= row[4] < row[5]
    # What plain SQL wrote, the Python backend reads, and the reverse.
    backend = SqliteBackend(connect(db))
    assert backend.holds("job", "c", 2)
    assert backend.claim("other", LONG, "d") == 1
    assert run("holds", name="other", holder="d", fence=1) == [(1,)]
    # The table refuses bad rows from any language, with pylease's messages.
    with pytest.raises(sqlite3.IntegrityError, match="pylease: ttl must be positive"):
        run("claim", name="new", ttl_seconds=0, holder="a", data=None)
    conn.execute("ROLLBACK")
    with pytest.raises(sqlite3.IntegrityError, match="pylease: name must not be empty"):
        run("claim", name="", ttl_seconds=1, holder="a", data=None)
    conn.execute("ROLLBACK")
    assert run("status", name="new") == []
    # A deleted row (as prune.sql deletes) leaves its fence behind as the floor: the
    # name's next first grant starts above it, from any language.
    conn.execute("DELETE FROM pylease_leases")
    assert run("claim", name="job", ttl_seconds=30, holder="e", data=None) == [(3,)]
    # A reader (its epoch: the floor, above which no writer was granted it), and a
    # writer kept out by it that waits in SQLite's queue of its own.
    assert run("claim_shared", name="read", ttl_seconds=30, holder="r") == [(2,)]
    with pytest.raises(sqlite3.IntegrityError, match="pylease: holder must not be empty"):
        run("claim_shared", name="read", ttl_seconds=30, holder="")
    conn.execute("ROLLBACK")
    queued = {"name": "read", "waiter": "w", "ttl_seconds": 30, "holder": "w", "data": None}
    assert run("claim_queued", **queued) == []
    assert run("claim_shared", name="read", ttl_seconds=30, holder="r2") == []
    assert [row[:5] for row in run("holders", name="read")] == [("read", "r", "shared", None, 2)]
    assert run("release", name="read", holder="r", min_hold_seconds=None) == []
    assert run("release_shared", name="read", holder="r", fence=None) == [(1,)]
    assert run("claim_queued", **queued) == [(3,)]
    assert run("status", name="read")[0][:3] == ("read", "w", 3)


def test_schema_sql_matches_the_migrations(tmp_path: Path) -> None:
    def objects(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name LIKE 'pylease%' ORDER BY name"
        ).fetchall()
        # ALTER TABLE ADD COLUMN splices its text in as ", column" after the last one.
        return [(t, n, re.sub(r"\s*([,()])\s*", r"\1", " ".join(s.split()))) for t, n, s in rows]

    migrated = connect(tmp_path / "migrated.sqlite3")
    scratch = sqlite3.connect(tmp_path / "schema.sqlite3")
    scratch.executescript((SQL_DIR / "schema.sql").read_text(encoding="utf-8"))
    assert objects(scratch) == objects(migrated)
    assert objects(migrated)


def test_yoyo_agrees_with_pylease_on_what_is_applied(tmp_path: Path) -> None:
    from yoyo import get_backend, read_migrations

    migrations = read_migrations(str(data_dir("migrations", "sqlite")))
    assert [m.id for m in migrations] == SQLITE_MIGRATIONS

    # Migrated by pylease: yoyo has nothing left to apply, and can roll it back.
    ours = tmp_path / "ours.sqlite3"
    connect(ours).close()
    yoyo = get_backend(f"sqlite:///{ours}")
    with yoyo.lock():
        assert list(yoyo.to_apply(migrations)) == []
        yoyo.rollback_migrations(yoyo.to_rollback(migrations))
    yoyo.connection.close()
    with sqlite3.connect(ours) as conn:
        assert conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'pylease%'"
        ).fetchone() == (0,)

    # Migrated by yoyo: pylease applies nothing more and works on it.
    theirs = tmp_path / "theirs.sqlite3"
    yoyo = get_backend(f"sqlite:///{theirs}")
    with yoyo.lock():
        yoyo.apply_migrations(yoyo.to_apply(migrations))
    yoyo.connection.close()
    conn = connect(theirs)
    assert migrate(conn) == []
    assert SqliteBackend(conn).claim("job", LONG, "me") == 1


# Connections ---------------------------------------------------------------------


def test_a_busy_claim_writes_nothing(backend: SqliteBackend, db: Path) -> None:
    observer = sqlite3.connect(db, isolation_level=None)

    def version() -> int:
        return int(observer.execute("PRAGMA data_version").fetchone()[0])

    assert backend.claim("job", LONG, "a") == 1
    before = version()
    assert backend.claim("job", LONG, "b") is None
    assert backend.steal("job", LONG, "b", older_than=LONG) is None
    assert backend.renew("job", "b") is False
    assert backend.release("job", "b") is False
    assert version() == before
    # The observer does see a write: a new row cannot be written in place unchanged
    # (SQLite skips rewriting a cell whose bytes are equal, so a renewal within the
    # same millisecond is no reliable control).
    assert backend.claim("other", LONG, "a") == 1
    assert version() != before


def test_durability_settings(backend: SqliteBackend) -> None:
    def setting(pragma: str) -> Any:
        return backend.conn.execute(f"PRAGMA {pragma}").fetchone()[0]

    assert setting("journal_mode") == "wal"
    assert setting("synchronous") == 2  # FULL: claims, renewals and steals are flushed
    assert backend.claim("job", LONG, "me") == 1
    assert backend.release("job", "me") is True  # commits with NORMAL, then back to FULL
    assert setting("synchronous") == 2


def test_a_connection_pylease_did_not_open(db: Path) -> None:
    conn = sqlite3.connect(db, check_same_thread=False)  # the module's default transactions
    with pytest.raises(SchemaMissing, match="migrate"):
        SqliteBackend(conn).claim("job", LONG, "me")
    assert migrate(conn) == SQLITE_MIGRATIONS
    backend = SqliteBackend(conn)
    assert backend.claim("job", LONG, "me") == 1
    # Inside the caller's own transaction, an operation joins it.
    conn.execute("CREATE TABLE report (fence INTEGER)")
    conn.execute("BEGIN IMMEDIATE")
    assert backend.holds("job", "me", 1)
    conn.execute("INSERT INTO report VALUES (1)")
    assert backend.release("job", "me") is True
    conn.execute("ROLLBACK")
    assert backend.status("job")[0].held  # the release was rolled back with it
    conn.close()


def test_a_same_thread_connection_is_a_clear_error(db: Path) -> None:
    connect(db).close()
    conn = sqlite3.connect(db)
    backend = AsyncSqliteBackend(conn)
    with pytest.raises(ConfigurationError, match="check_same_thread"):
        asyncio.run(backend.status())
    conn.close()


def test_fenced_write_of_a_stale_holder_never_lands(backend: SqliteBackend) -> None:
    backend.conn.execute("CREATE TABLE report (fence INTEGER)")
    old = backend.claim("job", LONG, "old")
    assert old is not None
    new = backend.steal("job", LONG, "new")
    assert new is not None
    for holder, fence in (("old", old), ("new", new)):
        with backend.transaction() as tx:
            if backend.holds("job", holder, fence):
                tx.execute("INSERT INTO report VALUES (?)", (fence,))
    assert backend.conn.execute("SELECT fence FROM report").fetchall() == [(new,)]


def test_threads_share_one_connection(backend: SqliteBackend) -> None:
    # The heartbeat renews from its own thread while the owner works.
    assert backend.claim("job", LONG, "me") == 1
    errors: list[BaseException] = []
    stop = threading.Event()

    def heartbeat() -> None:
        try:
            while not stop.is_set():
                assert backend.renew_many(["job"], ["me"]) == [("job", True)]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=heartbeat)
    thread.start()
    try:
        for i in range(200):
            assert backend.holds("job", "me", 1)
            assert backend.claim(f"other{i % 7}", LONG, f"me{i}") in (1, None)
            with backend.transaction() as tx:
                tx.execute("SELECT 1").fetchall()
    finally:
        stop.set()
        thread.join(BOUND)
    assert not errors


async def test_async_backend(db: Path) -> None:
    backend = AsyncSqliteBackend(connect(db))
    assert await backend.claim("job", LONG, "a") == 1
    assert await backend.claim("job", LONG, "b") is None
    assert await backend.renew("job", "a", LONG) is True
    assert await backend.renew_many(["job"], ["a"]) == [("job", True)]
    assert await backend.holds("job", "a", 1) is True
    assert await backend.release("job", "a") is True
    assert await backend.steal("job", LONG, "b") == 2
    [row] = await backend.status()
    assert (row.holder, row.fence, row.held) == ("b", 2, True)
    with pytest.raises(InvalidArgument, match="pylease: name must not be empty"):
        await backend.claim("", LONG, "a")
    results = await asyncio.gather(*(backend.claim("many", LONG, f"h{i}") for i in range(8)))
    assert sorted(results, key=lambda r: r is None) == [1] + [None] * 7
