"""What the safety tests share: a database of either kind, and a contender that records grants.

``Db`` hides whether the test runs on PostgreSQL or SQLite: ``url`` is the target
to hand to ``lease()``, ``backend()`` a backend on a connection of the test's own
(a second party's view). ``Contender`` tries to claim a lease from a thread of its
own until it is granted, and records the grant in the witness the moment the claim
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from pylease.postgres import PostgresBackend
from tests.support.witness import Witness

BOUND = 30.0
KINDS = ["postgres", "sqlite"]


class Db:
    """A fresh lease database: PostgreSQL (``dsn``) or a SQLite file (``path``)."""

    def __init__(self, kind: str, *, dsn: str | None = None, path: Path | None = None) -> None:
        self.kind = kind
        self.dsn = dsn
        self.path = path
        self._opened: list[Any] = []
        self._reader: Any = None

    @property
    def url(self) -> str:
        if self.kind == "postgres":
            assert self.dsn is not None
            return self.dsn
        return f"sqlite:///{self.path}"

    def backend(self) -> Any:
        """A backend on a connection of its own, closed at the end of the test."""
        if self.kind == "postgres":
            conn = psycopg.connect(self.dsn or "", autocommit=True)
            self._opened.append(conn)
            return PostgresBackend(conn)
        from pylease.sqlite import SqliteBackend, connect

        sconn = connect(self.path)
        self._opened.append(sconn)
        return SqliteBackend(sconn)

    def holder_of(self, name: str) -> str | None:
        rows = self.backend().status(name)
        return next((r.holder for r in rows if r.held), None)

    def row(self, name: str) -> Any:
        """The lease's ``lease_status`` row, as a second party reads it (one connection)."""
        if self._reader is None:
            self._reader = self.backend()
        rows = self._reader.status(name)
        assert len(rows) == 1, rows
        return rows[0]

    def close(self) -> None:
        for conn in self._opened:
            with contextlib.suppress(Exception):
                conn.close()


@contextlib.contextmanager
def make_db(kind: str, dsn_factory: Callable[[], str], tmp_path: Path) -> Iterator[Db]:
    if kind == "postgres":
        db = Db(kind, dsn=dsn_factory())
    else:
        from pylease.sqlite import connect

        path = tmp_path / "safety.sqlite3"
        connect(path).close()
        db = Db(kind, path=path)
    try:
        yield db
    finally:
        db.close()


class Contender:
    """Claims ``name`` every few milliseconds from a thread until granted (or stopped)."""

    def __init__(
        self,
        witness: Witness,
        backend: Any,
        name: str,
        *,
        holder: str = "contender",
        ttl: timedelta = timedelta(seconds=30),
        every: float = 0.01,
    ) -> None:
        self.witness = witness
        self.backend = backend
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.every = every
        self.fence: int | None = None
        self.granted = threading.Event()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="contender", daemon=True)

    def start(self) -> Contender:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fence = self.backend.claim(self.name, self.ttl, self.holder)
            except Exception as exc:
                self.errors.append(exc)
                fence = None
            if fence is not None:
                self.witness.grant(self.name, self.holder, fence)
                self.fence = fence
                self.granted.set()
                return
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(BOUND)

    def __enter__(self) -> Contender:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def keep_sampling(witness: Witness, held: Any, until: Callable[[], bool], bound: float) -> None:
    """The body's own samples, every 10 ms, until ``until()`` or ``bound`` seconds."""
    limit = time.monotonic() + bound
    while time.monotonic() < limit:
        witness.sample(held)
        if until():
            break
        time.sleep(0.01)
    # A few more, so that a belief held on after the event shows in the record.
    for _ in range(5):
        witness.sample(held)
        time.sleep(0.01)


async def akeep_sampling(
    witness: Witness, held: Any, until: Callable[[], bool], bound: float
) -> None:
    """:func:`keep_sampling` on the event loop, where the keeper of an ``alease`` runs."""
    limit = time.monotonic() + bound
    while time.monotonic() < limit:
        witness.sample(held)
        if until():
            break
        await asyncio.sleep(0.01)
    for _ in range(5):
        witness.sample(held)
        await asyncio.sleep(0.01)


def leave(cm: Any) -> BaseException | None:
    """Leave a lease block with no exception of the body; what the exit raised."""
    try:
        cm.__exit__(None, None, None)
    except BaseException as exc:
        return exc
    return None


async def aleave(cm: Any) -> BaseException | None:
    """:func:`leave` for an ``async with`` block."""
    try:
        await cm.__aexit__(None, None, None)
    except BaseException as exc:
        return exc
    return None
