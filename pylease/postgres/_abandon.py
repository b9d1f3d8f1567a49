"""Abandoning a connection whose statement runs too long: its socket is shut down.

Never a query cancel: a cancel that lands while a COMMIT waits for a synchronous
standby makes PostgreSQL report success for a commit the standby may not have.
Shutting the socket down makes the waiting statement fail at once (the connection
is then broken and discarded), whether the server is stuck, stopped, or behind a
proxy that accepts bytes and never answers. Used by the sync and async twins.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from typing import Any

from pylease._budget import FLOOR, exit_deadline
from pylease.errors import DatabaseUnavailable


class Abandoned(DatabaseUnavailable):
    """A statement ran past its bound and its connection was abandoned.

    It may have reached the server: whoever retries it must be safe to run twice.
    """


class _Timers:
    """One daemon thread for every statement's bound: a thread per statement would cost
    more than a statement on a local server."""

    def __init__(self) -> None:
        # A plain lock under the condition: a push takes it without Condition's calls.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # (when, order, bound): a bound disarmed before its time is dropped when it comes
        # up, at most a bound later.
        self._heap: list[tuple[float, int, bounded]] = []
        self._order = itertools.count()
        # A forked child makes timers of its own (_after_fork): its thread starts there.
        self._started = False

    def push(self, seconds: float, bound: bounded) -> None:
        """Fire ``bound`` in ``seconds`` unless it is disarmed first."""
        when = time.monotonic() + seconds
        with self._lock:
            if not self._started:
                self._heap = []
                self._started = True
                threading.Thread(target=self._run, name="pylease-bounds", daemon=True).start()
            heap = self._heap
            first = not heap or when < heap[0][0]
            heapq.heappush(heap, (when, next(self._order), bound))
            if first:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if _timers is not self:
                        return  # a forked child's copy of a thread that is not there
                    while self._heap and not self._heap[0][2].armed:
                        heapq.heappop(self._heap)
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        bound = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            with contextlib.suppress(Exception):
                bound.fire()


_timers = _Timers()


def _after_fork() -> None:
    # The parent's locks may have been held at the fork, and its thread is not here.
    global _timers, _arming
    _timers = _Timers()
    _arming = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


# How long one statement pylease runs may take before its connection is abandoned: with
# the connect timeout, what bounds the release after a renewal hung, so a block ends
# within 10 s of its body.
STATEMENT_BOUND = 3.0


# Disarms a bound before its block ends and fires one on the timers' thread, never both
# at once: one lock for every bound, held only for either.
_arming = threading.Lock()


class bounded:
    """Abandon ``conn`` (shut its socket down) if the block runs past ``seconds``.

    Every statement pylease runs is bounded so, on whoever's connection it runs: its own,
    a pool's, a dedicated one or the caller's (a connection that stopped answering that
    long is broken either way; a pool replaces it). Inside a block's exit it ends by the
    exit's deadline (:mod:`pylease._budget`), given at least its ``FLOOR``. The failure
    is then :class:`Abandoned`: the statement may have reached the server. The timer is a thread
    for the async side too: it fires even while a callback blocks the event loop. A
    class rather than a generator: it wraps every statement, and each call costs.
    """

    __slots__ = ("_conn", "_seconds", "armed", "fired")

    def __init__(self, conn: Any, seconds: float = STATEMENT_BOUND) -> None:
        deadline = exit_deadline.get()  # inline: every statement pays for this
        if deadline is not None:
            seconds = min(seconds, max(deadline - time.monotonic(), FLOOR))
        self._conn, self._seconds = conn, seconds
        self.armed = self.fired = False

    def __enter__(self) -> None:
        self.armed = True
        _timers.push(self._seconds, self)

    def __exit__(self, typ: object, exc: BaseException | None, tb: object) -> None:
        with _arming:
            self.armed = False
        if exc is not None and self.fired and isinstance(exc, DatabaseUnavailable):
            raise Abandoned(
                f"pylease: database unavailable: no answer within {self._seconds:g}s, so"
                " the connection was abandoned",
                name=exc.name,
            ) from exc

    def fire(self) -> None:
        """Shut the socket down, unless the block ended first."""
        with _arming:
            if not self.armed:
                return
            # The statement still runs, so the connection's socket is the one it runs on
            # (a connection already broken has none to shut).
            try:
                fd = int(self._conn.pgconn.socket)
            except Exception:
                return
            self.armed = False
            self.fired = True
            # On a duplicate: shutdown() acts on the socket itself, and the driver
            # keeps its own descriptor to close as usual.
            try:
                dup = socket.socket(fileno=os.dup(fd))
            except OSError:
                return
            with contextlib.suppress(OSError):
                dup.shutdown(socket.SHUT_RDWR)
            dup.close()
