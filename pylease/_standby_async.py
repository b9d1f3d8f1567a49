# The source of pylease/_standby.py: tools/async_to_sync.py writes it from this file.
"""What a standby and a watcher of a leader share: reading who leads, sleeping until it is
worth reading again (a release's notification, the leader's expiry, a poll), the
observer that reports each change once, and the stop (an event, or SIGTERM/SIGINT).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from pylease import _checks
from pylease import _hub_async as hub
from pylease._acompat import AEvent, monotonic
from pylease._hub_async import AsyncWatcher
from pylease._links_async import AsyncLink, link
from pylease._operations import LeaseRow
from pylease._waiting_async import STOP_SLICE, next_pause

# Seconds between reads of the row when nothing wakes a watcher first (a steal, or a
# grant after a long vacancy, is seen this late at worst).
POLL = 1.0
# SQLite has no NOTIFY: a standby there reads the row this often.
SQLITE_POLL = 0.05
# After a vacancy, a grant usually follows within milliseconds: look again soon.
FIRST_RECHECK = 0.01
SIGNALS = (signal.SIGTERM, signal.SIGINT)

Callback = Callable[[Any], object]


def leading(rows: list[LeaseRow]) -> LeaseRow | None:
    """The row of a lease whose state is ``held``, from ``status()`` rows; else None."""
    for row in rows:
        state = getattr(row, "state", None)
        if row.held if state is None else state == "held":
            return row
    return None


def same_leader(a: LeaseRow | None, b: LeaseRow | None) -> bool:
    """True when both name one term (holder and fence); a renewal changes neither."""
    if a is None or b is None:
        return a is b
    return (a.holder, a.fence) == (b.holder, b.fence)


def wait_seconds(wait: object) -> float:
    """``wait`` as seconds; None, ``math.inf`` and ``"forever"`` wait without a deadline.

    A string is a duration as the CLI spells it (``"30s"``, ``"5m"``).
    """
    return math.inf if wait is None else _checks.wait(wait)


def poll_seconds(poll_interval: object) -> float | None:
    if poll_interval is None:
        return None
    return _checks.ttl(poll_interval, "poll_interval").total_seconds()


async def call(callback: Callback | None, argument: object) -> None:
    """Call a callback that may be a plain function or a coroutine function."""
    if callback is None:
        return
    if True:  # ASYNC
        result = callback(argument)
        if inspect.isawaitable(result):
            await result
    else:
        callback(argument)


class AsyncStop:
    """What ends a campaign: the caller's ``stop`` event, or a signal (main thread only)."""

    def __init__(self, event: AEvent | None) -> None:
        self.event = event
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        if True:  # ASYNC
            self._own = AEvent()
            self._loop: asyncio.AbstractEventLoop | None = None
        else:
            self.interruptible = False

    def is_set(self) -> bool:
        if self.signum is not None:
            return True
        return self.event is not None and self.event.is_set()

    def install(self) -> None:
        """In the main thread, SIGTERM and SIGINT end the campaign instead of the process."""
        if threading.current_thread() is not threading.main_thread():
            return
        if True:  # ASYNC
            self._loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back; then let the signal that stopped us act on them."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            # None: a handler set outside Python, which cannot be put back from here.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if self.signum is not None and previous:
            # Resigned: now the process does what it would have done (exit, by default).
            signal.raise_signal(self.signum)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        first = self.signum is None
        self.signum = signum
        if True:  # ASYNC
            if first and self._loop is not None:
                self._loop.call_soon_threadsafe(self._own.set)
        else:
            if first and self.interruptible:
                raise Shutdown(signum)

    async def wait(self, timeout: float, watcher: AsyncWatcher | None) -> None:
        """Sleep up to ``timeout``: woken early by a release the watcher sees, or the stop."""
        if True:  # ASYNC
            waits: list[Awaitable[Any]] = [self._own.wait()]
            if self.event is not None:
                waits.append(self.event.wait())
            if watcher is not None:
                waits.append(watcher.wait(timeout))
            tasks = [asyncio.ensure_future(w) for w in waits]
            bound = None if math.isinf(timeout) else timeout
            try:
                await asyncio.wait(tasks, timeout=bound, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        else:
            end = monotonic() + timeout
            self.interruptible = True
            try:
                while not self.is_set():
                    left = end - monotonic()
                    if left <= 0:
                        return
                    step = left if self.event is None else min(left, STOP_SLICE)
                    if watcher is None:
                        time.sleep(step)
                    elif watcher.wait(step):
                        return
            finally:
                self.interruptible = False


class Shutdown(BaseException):
    """SIGTERM or SIGINT arrived while a sync campaign or work was interruptible."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class AsyncWatch:
    """Reads the leader's row, and sleeps until it is worth reading again."""

    def __init__(self, target: object, name: str, poll_interval: float | None) -> None:
        self.name = name
        self.link: AsyncLink = link(target)
        self.watcher: AsyncWatcher | None = None
        self.poll = poll_interval or (SQLITE_POLL if self.link.sqlite else POLL)
        self._recheck = FIRST_RECHECK

    async def listen(self) -> None:
        """Watch the name's releases on the process's hub (PostgreSQL; SQLite polls)."""
        conninfo = self.link.listen_conninfo
        if not self.link.sqlite and conninfo is not None and self.watcher is None:
            self.watcher = await hub.watch(conninfo, self.name)

    async def read(self) -> LeaseRow | None:
        name = self.name
        rows = await self.link.run(lambda b: b.status(name), name=name, retry=True)
        return leading(rows)

    async def pause(self, row: LeaseRow | None, stop: AsyncStop, deadline: float) -> None:
        """Wait for the next reason to read: a notification, the expiry, a poll, the stop."""
        left = deadline - monotonic()
        if row is None:
            pause = min(self._recheck, self.poll, left)
            self._recheck = min(self._recheck * 2, self.poll)
        else:
            self._recheck = FIRST_RECHECK
            pause = next_pause(row.expires_at, self.poll, left, FIRST_RECHECK)
        await stop.wait(max(pause, 0.0), self.watcher)

    async def close(self) -> None:
        watcher, self.watcher = self.watcher, None
        try:
            if watcher is not None:
                watcher.close()
        finally:
            await self.link.close()


class AsyncObserver:
    """Calls ``on_new_leader`` once for every change of leader it is shown."""

    def __init__(self, on_new_leader: Callback | None) -> None:
        self.on_new_leader = on_new_leader
        self.last: LeaseRow | None = None
        self.seen = False

    async def see(self, row: LeaseRow | None) -> None:
        if self.seen and same_leader(self.last, row):
            return
        self.seen, self.last = True, row
        await call(self.on_new_leader, row)
