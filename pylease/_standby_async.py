# The source of pylease/_standby.py: tools/async_to_sync.py writes it from this file.
"""What a standby and a watcher of a leader share: reading who leads, sleeping until it is
worth reading again (a release's notification, the leader's expiry, a poll), the
observer that reports each change once, and the stop (an event, or SIGTERM/SIGINT).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from pylease import _checks
from pylease import _hub_async as hub
from pylease._acompat import AEvent, ALock, monotonic
from pylease._held import default_holder
from pylease._hub_async import AsyncWatcher
from pylease._links_async import AsyncLink, link
from pylease._rows import LeaseRow
from pylease._waiting_async import STOP_SLICE, next_pause
from pylease.errors import DatabaseUnavailable, SchemaMissing

logger = logging.getLogger("pylease")

# Seconds between reads of the row when nothing wakes a watcher first (a steal, or a
# grant after a long vacancy, is seen this late at worst).
POLL = 1.0
# SQLite has no NOTIFY: a standby there reads the row this often.
SQLITE_POLL = 0.05
# After a vacancy, a grant usually follows within milliseconds: look again soon.
FIRST_RECHECK = 0.01
# A tracking watcher's lease_watch entry lasts this long; it is refreshed every third.
WATCH_TTL = timedelta(seconds=30)
# How long a tracking watcher waits for the notifications of terms it read in the row
# before it tells the row alone (they reach the listener within milliseconds).
IN_FLIGHT = 0.5
SIGNALS = (signal.SIGTERM, signal.SIGINT)

Callback = Callable[[Any], object]


def _term(name: str, change: dict[str, Any]) -> LeaseRow:
    """The row of a term from its notification (a term already followed by another when
    read): its holder, fence and times; its data is not sent, so None."""
    return LeaseRow(
        name,
        change.get("holder"),
        int(change["fence"]),
        datetime.fromisoformat(change["acquired_at"]),
        datetime.fromisoformat(change["acquired_at"]),
        datetime.fromisoformat(change["expires_at"]),
        True,
        "held",
        timedelta(seconds=float(change["ttl"])),
    )


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
    """Reads the leader's row, and sleeps until it is worth reading again.

    With ``track`` it also hears every change of holder of the name (contract 5.4): the
    name is registered with ``lease_watch`` (refreshed while it watches), so that each
    grant, steal or release of it sends ``NOTIFY pylease_holders``, which the hub keeps
    for it in order; :meth:`changes` turns them into rows. Where LISTEN cannot work
    (SQLite, PgBouncer in transaction mode, a lost listener) it reads the row, and
    changes between two reads are coalesced; it logs that once.
    """

    def __init__(
        self, target: object, name: str, poll_interval: float | None, *, track: bool = False
    ) -> None:
        self.name = name
        self.link: AsyncLink = link(target)
        self.watcher: AsyncWatcher | None = None
        self.poll = poll_interval or (SQLITE_POLL if self.link.sqlite else POLL)
        self._recheck = FIRST_RECHECK
        self.track = track
        self.token = default_holder()
        self.refresh_at = math.inf
        self.fell_back = False
        # The row the last call of changes() read, and the highest fence it told: a
        # notification of a term told already (from the row, before the notification
        # came) is not told again.
        self.last: LeaseRow | None = None
        self.floor = 0
        # The fence of the row read last, held or not: a released or expired row's is
        # its last term's, which may not have been heard yet.
        self.fence = 0
        # Whether a row was read: what came before the first one is not owed to anyone.
        self.primed = False
        # A row ahead of what was heard: its fence, and until when its notifications are
        # waited for; meanwhile the watcher looks again soon.
        self.ahead: tuple[int, float] | None = None
        self.soon = False

    async def listen(self) -> None:
        """Watch the name's releases on the process's hub (PostgreSQL; SQLite polls), and
        with ``track`` its changes of holder."""
        conninfo = self.link.listen_conninfo
        if not self.link.sqlite and conninfo is not None and self.watcher is None:
            self.watcher = await hub.watch(conninfo, self.name, changes=self.track)
            if self.track:
                await self._register()
        elif self.track:
            self._fall_back("it has no LISTEN (SQLite, or a connection pylease may not open)")

    async def _register(self) -> None:
        """``lease_watch`` the name (again before it expires)."""
        name, token = self.name, self.token
        try:
            await self.link.run(lambda b: b.watch(name, token, WATCH_TTL), name=name, retry=True)
        except (SchemaMissing, DatabaseUnavailable) as exc:
            self.refresh_at = monotonic() + WATCH_TTL.total_seconds() / 3
            self._fall_back(f"lease_watch failed: {exc}")
            return
        self.refresh_at = monotonic() + WATCH_TTL.total_seconds() / 3

    def _fall_back(self, why: str) -> None:
        if not self.fell_back:
            self.fell_back = True
            logger.info(
                "watching the leader of %r by reading its row: changes between two"
                " reads may be coalesced (%s)",
                self.name,
                why,
            )

    async def changes(self, last: LeaseRow | None, *, whole: bool = False) -> list[LeaseRow | None]:
        """Every change of leader since ``last``, in order: each one heard (a row made
        from its notification when the row read now is already a later one's), then what
        the row read now shows if that is newer still (an expiry, or what went unheard)."""
        heard: list[dict[str, Any]] = []
        healthy = False
        if self.watcher is not None and self.track:
            heard, missed = self.watcher.take()
            healthy = not missed and self.watcher.listening and self.refresh_at < math.inf
            if not healthy:
                self._fall_back("the listener was lost, or could not LISTEN")
        row = self.last = await self.read()
        if not self.primed:
            self.primed = True
            self.floor = max(self.floor, self.fence)
        out: list[LeaseRow | None] = []
        for change in heard:
            fence = int(change["fence"])
            if change.get("event") == "granted" and fence > self.floor:
                last = row if row is not None and row.fence == fence else _term(self.name, change)
                self.floor = fence
            elif change.get("event") == "released" and last is not None and fence == last.fence:
                last = None
            else:
                continue
            out.append(last)
        self.soon = False
        if not same_leader(last, row):
            early = not whole and healthy
            if self.fence > self.floor and early and self._early(self.fence):
                # Later terms than those heard: their notifications are on their way (the
                # row was read after they committed, before they came), also when the row
                # shows the last of them ended (released or expired): its grant is told
                # before its end. Told from them, in order, shortly; from the row if they
                # never come.
                self.soon = True
                return out
            out.append(row)
        # Told up to the row's term, so a notification of an earlier one is not told
        # after it.
        self.floor = max(self.floor, self.fence)
        return out

    def _early(self, fence: int) -> bool:
        """Whether the notifications of the terms up to ``fence`` may still come."""
        now = monotonic()
        if self.ahead is None or self.ahead[0] != fence:
            self.ahead = (fence, now + IN_FLIGHT)
        return now < self.ahead[1]

    async def settle(self) -> None:
        """A moment for notifications on their way (woken early by one)."""
        if self.watcher is not None:
            await self.watcher.wait(FIRST_RECHECK)

    async def read(self) -> LeaseRow | None:
        name = self.name
        rows = await self.link.run(lambda b: b.status(name), name=name, retry=True)
        self.fence = max((r.fence for r in rows), default=0)
        return leading(rows)

    async def pause(self, row: LeaseRow | None, stop: AsyncStop, deadline: float) -> None:
        """Wait for the next reason to read: a notification, the expiry, a poll, the stop."""
        if monotonic() >= self.refresh_at:
            await self._register()
        left = min(deadline, self.refresh_at) - monotonic()
        if self.soon:
            pause = min(FIRST_RECHECK, left)
        elif row is None:
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
            if self.refresh_at < math.inf:
                name, token = self.name, self.token
                with contextlib.suppress(Exception):  # else its entry expires
                    await self.link.run(lambda b: b.watch(name, token, None), name=name)
        finally:
            await self.link.close()


class AsyncObserver:
    """Calls ``on_new_leader`` once for every change of leader it is shown."""

    def __init__(self, on_new_leader: Callback | None) -> None:
        self.on_new_leader = on_new_leader
        self.last: LeaseRow | None = None
        self.seen = False
        # Whoever catches up (the watching task, a new term's announcement) does so
        # alone, so that the changes are told once each, in order.
        self.lock = ALock()
        # True while a term of this candidate lasts: nothing is told meanwhile.
        self.paused = False

    async def catch_up(
        self, watch: AsyncWatch, *, unless_paused: bool = False, whole: bool = False
    ) -> None:
        """Tell every change of leader the watch heard since the last one told (nothing
        with ``unless_paused`` while a term of this candidate lasts). With ``whole``, up to
        the row read now: the notifications on their way are waited for (bounded), as a
        new term of this candidate is told before ``on_started_leading``."""
        async with self.lock:
            if unless_paused and self.paused:
                return
            limit = monotonic() + IN_FLIGHT
            while True:
                for row in await watch.changes(self.last, whole=whole and monotonic() >= limit):
                    await self.see(row)
                if not (whole and watch.soon):
                    return
                await watch.settle()

    async def see(self, row: LeaseRow | None) -> None:
        if self.seen and same_leader(self.last, row):
            return
        self.seen, self.last = True, row
        await call(self.on_new_leader, row)
