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
from collections.abc import Callable, Iterator
from typing import Any

from pylease.errors import DatabaseUnavailable


class Abandoned(DatabaseUnavailable):
    """A statement ran past its bound and its connection was abandoned.

    It may have reached the server: whoever retries it must be safe to run twice.
    """


class Abandon:
    """Shuts ``conn``'s socket down when fired, unless disarmed first."""

    def __init__(self, conn: Any) -> None:
        try:
            self._fd: int | None = int(conn.pgconn.socket)
        except Exception:  # a connection already broken has no socket to shut
            self._fd = None
        self._lock = threading.Lock()
        self._armed = True
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            if not self._armed or self._fd is None:
                return
            self._armed = False
            self.fired = True
            # On a duplicate: shutdown() acts on the socket itself, and the driver
            # keeps its own descriptor to close as usual.
            try:
                dup = socket.socket(fileno=os.dup(self._fd))
            except OSError:
                return
            with contextlib.suppress(OSError):
                dup.shutdown(socket.SHUT_RDWR)
            dup.close()

    def disarm(self) -> None:
        with self._lock:
            self._armed = False


class _Timers:
    """One daemon thread for every statement's bound: a thread per statement would cost
    more than a statement on a local server."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # (when, order, [fn or None once cancelled]): cancelled entries are dropped when
        # they come up, at most a bound later.
        self._heap: list[tuple[float, int, list[Callable[[], None] | None]]] = []
        self._order = itertools.count()
        self._pid = 0

    def start(self, seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
        entry: list[Callable[[], None] | None] = [fn]
        when = time.monotonic() + seconds
        with self._cond:
            if self._pid != os.getpid():
                # First use, or a forked child: the parent's thread is not here.
                self._heap = []
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="pylease-bounds", daemon=True).start()
            first = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._order), entry))
            if first:
                self._cond.notify()

        def cancel() -> None:
            entry[0] = None

        return cancel

    def _run(self) -> None:
        pid = os.getpid()
        while True:
            with self._cond:
                while True:
                    if self._pid != pid:
                        return  # a forked child's copy of a thread that is not there
                    while self._heap and self._heap[0][2][0] is None:
                        heapq.heappop(self._heap)
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        fn = heapq.heappop(self._heap)[2][0]
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            if fn is not None:
                with contextlib.suppress(Exception):
                    fn()


_timers = _Timers()


def _after_fork() -> None:
    # The parent's lock may have been held at the fork, and its thread is not here.
    global _timers
    _timers = _Timers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def start_timer(seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn`` on a daemon thread in ``seconds``; returns what cancels it."""
    return _timers.start(seconds, fn)


# How long one statement pylease runs may take before its connection is abandoned: with
# the connect timeout, what bounds the release after a renewal hung, so a block ends
# within 10 s of its body.
STATEMENT_BOUND = 3.0


@contextlib.contextmanager
def bounded(conn: Any, seconds: float = STATEMENT_BOUND) -> Iterator[None]:
    """Abandon ``conn`` (shut its socket down) if the block runs past ``seconds``.

    Every statement pylease runs is bounded so, on whoever's connection it runs: its own,
    a pool's, a dedicated one or the caller's (a connection that stopped answering that
    long is broken either way; a pool replaces it). The failure is then
    :class:`Abandoned`: the statement may have reached the server. The timer is a thread
    for the async side too: it fires even while a callback blocks the event loop.
    """
    abandon = Abandon(conn)
    cancel = start_timer(seconds, abandon.fire)
    try:
        yield
    except DatabaseUnavailable as exc:
        if abandon.fired:
            raise Abandoned(
                f"pylease: database unavailable: no answer within {seconds:g}s, so the"
                " connection was abandoned",
                name=exc.name,
            ) from exc
        raise
    finally:
        abandon.disarm()
        cancel()
