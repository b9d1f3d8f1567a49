"""Abandoning a connection whose statement runs too long: its socket is shut down.

Never a query cancel: a cancel that lands while a COMMIT waits for a synchronous
standby makes PostgreSQL report success for a commit the standby may not have.
Shutting the socket down makes the waiting statement fail at once (the connection
is then broken and discarded), whether the server is stuck, stopped, or behind a
proxy that accepts bytes and never answers. Used by the sync and async twins.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any


class Abandon:
    """Shuts ``conn``'s socket down when fired, unless disarmed first."""

    def __init__(self, conn: Any) -> None:
        try:
            self._fd: int | None = int(conn.pgconn.socket)
        except Exception:  # a connection already broken has no socket to shut
            self._fd = None
        self._lock = threading.Lock()
        self._armed = True

    def fire(self) -> None:
        with self._lock:
            if not self._armed or self._fd is None:
                return
            self._armed = False
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


def start_timer(seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn`` on a daemon thread in ``seconds``; returns what cancels it."""
    timer = threading.Timer(seconds, fn)
    timer.daemon = True
    timer.start()
    return timer.cancel
