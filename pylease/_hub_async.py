# The source of pylease/_hub.py: tools/async_to_sync.py writes it from this file.
"""The listener: one LISTEN connection per database, shared by every waiter of the process.

A release sends ``NOTIFY pylease, '<name>'``. Rather than a LISTEN connection per
waiting lease (30 waiting threads held 30 connections, and every release woke them
all into a claim), the waiters of a process (on an event loop: of that loop) share
one :class:`AsyncHub` per database: a connection LISTENing on ``pylease`` and
``pylease_waiters``, and a reader that hands each notification to the waiters of that
name only.

Within a process the waiters of one name queue in arrival order and only the first of
them (the *head*) is woken to claim on a notification; the next one takes its place
when it leaves, with the lease (it waits for the next notification) or without it (it
claims at once). ``pylease_waiters`` notifications name the process now first in the
queue of waiting processes (:mod:`pylease._waiting_async`), which wakes its head.

When the listener's connection is lost, every head is woken to claim once and polls
until the reader has LISTENed again (with backoff); a release missed meanwhile is found
by that claim.

A hub exists only for a PostgreSQL target, so the driver is imported where a hub
connects: a lease on SQLite, which polls, never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from pylease._acompat import AEvent, ALock, AMutex, AWorker, asleep, aspawn, monotonic
from pylease._held import default_holder

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("pylease")

# An idle listener stays open this long for the next wait: a worker that cycles
# through a busy lease would otherwise connect once per wait.
LINGER = 2.0
# How often the reader, between notifications, looks whether it is still needed.
TICK = 0.25
# Backoff between attempts to LISTEN again after the connection was lost.
FIRST_RELISTEN = 0.05
MAX_RELISTEN = 5.0
# A process's row in the queue of waiting processes expires this long after it was
# last refreshed; it is refreshed every third of that while the process waits.
WAITER_TTL = 30.0
QUEUE_CHANNEL = "pylease_waiters"
# Changes of holder of the names watched with lease_watch (migration 0016): a JSON object
# per change, {"name", "fence", "holder", "event", ...}, in the order of their commits.
HOLDERS_CHANNEL = "pylease_holders"

# Guards every hub's queues and state: changed without awaiting in between.
_mutex = AMutex()

# What a waiter saw before its first claim: (hub, its listen epoch, notifications heard).
Mark = tuple[object, int, int]


class AsyncWaiter:
    """One waiting lease's place in the queue of its name."""

    def __init__(self, hub: AsyncHub, name: str) -> None:
        self.hub = hub
        self.name = name
        self._event = AEvent()
        # Set with the event when the waiter should claim (a release, a lost
        # listener), left unset when it only became the head.
        self._retry = False
        # For the head: its process's place in the queue of waiting processes. None:
        # not queued there; False: queued behind another process; True: first.
        self.db_head: bool | None = None
        self.refresh_at = 0.0
        # True once a granted claim took the process out of that queue (see claim()).
        self.left = False
        # When a release of its name was heard while another process was ahead of this
        # one in that queue (monotonic): that process claims it, unless it died.
        self.release_heard: float | None = None
        # True when its last sleep ended on a call to claim (a release, its turn), not
        # on the sleep's timeout.
        self.called = False
        # When its current sleep ends (monotonic; 0: not asleep), and how long after a
        # release heard while behind it may sleep on without being woken (see heard()).
        self.sleeping_until = 0.0
        self.patience = 0.0

    @property
    def head(self) -> bool:
        """True while this waiter is the first of its name in this process."""
        with _mutex:
            queue = self.hub.queues.get(self.name)
            return queue is not None and queue[0] is self

    @property
    def listening(self) -> bool:
        """True while the shared listener is LISTENing."""
        return self.hub.conn is not None

    @property
    def join_due(self) -> bool:
        """True when the head should queue its process, or refresh its row."""
        return self.hub.db_queue and (self.db_head is None or monotonic() >= self.refresh_at)

    @property
    def behind(self) -> bool:
        """True while another process is ahead of this one in the queue of waiting
        processes, and the listener would tell when that changes."""
        return self.db_head is False and self.hub.conn is not None

    def wake(self, retry: bool) -> None:
        """Called with the mutex held."""
        self._retry = self._retry or retry
        self._event.set()

    def heard(self) -> None:
        """Called with the mutex held: a release of its name was heard while another
        process is ahead of this one in the queue of waiting processes."""
        self.release_heard = now = monotonic()
        # Asleep until at most its patience after this release, it looks at release_heard
        # when it wakes: woken now it would only sleep again, a thread switch per release
        # for every process behind while the name changes hands between the others.
        if not 0.0 < self.sleeping_until <= now + self.patience:
            self.wake(retry=False)

    def ahead_alive(self, grace: float) -> bool:
        """True while another process is ahead of this one in the queue of waiting
        processes and a release of the name was heard within ``grace``: that process is
        alive, and claims it."""
        heard = self.release_heard
        return self.behind and heard is not None and monotonic() - heard < grace

    async def sleep(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True when the waiter should claim again."""
        self.sleeping_until = monotonic() + max(timeout, 0.0)
        try:
            woken = await _wait(self._event, timeout)
        finally:
            self.sleeping_until = 0.0
        with _mutex:
            self._event.clear()
            retry, self._retry = self._retry, False
        self.called = woken and retry
        return retry or not woken


class AsyncWatcher:
    """A subscriber told of every release of one name (of any name: ``name`` None).

    Watchers are not waiters: they claim nothing and keep no place in a queue, so the
    rule that only a name's head claims for its process stays the waiters'. A leader
    standby, ``watch_leader`` and ``status --watch`` watch.
    """

    def __init__(self, hub: AsyncHub, name: str | None, changes: bool = False) -> None:
        self.hub = hub
        self.name = name
        self._event = AEvent()
        # With ``changes``: every change of holder heard for the name, in order (the
        # payloads of pylease_holders), until taken; and the listen epoch they belong to
        # (a new LISTEN may have missed some).
        self.changes: deque[dict[str, Any]] | None = deque() if changes else None
        self.epoch = hub.epoch

    def take(self) -> tuple[list[dict[str, Any]], bool]:
        """The changes heard since the last call, in order, and whether some may have
        gone unheard since (the listener was lost, or never LISTENed)."""
        with _mutex:
            changes = list(self.changes or ())
            if self.changes is not None:
                self.changes.clear()
            missed = self.epoch != self.hub.epoch or self.hub.conn is None
            self.epoch = self.hub.epoch
        return changes, missed

    @property
    def listening(self) -> bool:
        """True while the shared listener is LISTENing (else: poll)."""
        return self.hub.conn is not None

    def wake(self) -> None:
        """Called with the mutex held."""
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True when a release (or a lost listener,
        after which a release may have gone unheard) woke it."""
        woken = await _wait(self._event, timeout)
        with _mutex:
            self._event.clear()
        return woken

    def close(self) -> None:
        """Stop watching; the hub closes once nobody waits or watches."""
        hub = self.hub
        with _mutex:
            watchers = hub.watchers.get(self.name)
            if watchers is None or self not in watchers:
                return
            watchers.remove(self)
            if not watchers:
                del hub.watchers[self.name]
            if not hub.queues and not hub.watchers:
                hub.idle_since = monotonic()


class AsyncHub:
    """The LISTEN connection to one database, and the waiters and watchers it wakes."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.queues: dict[str, deque[AsyncWaiter]] = {}
        self.watchers: dict[str | None, list[AsyncWatcher]] = {}
        self.conn: psycopg.AsyncConnection[Any] | None = None
        # Bumped at every LISTEN, and at every notification heard: a waiter compares
        # them with what it saw before its first claim.
        self.epoch = 0
        self.heard = 0
        self.closing = False
        self.worker: AWorker | None = None
        self.idle_since = monotonic()
        self._open_lock = ALock()
        # This process in the queue of waiting processes; False once the schema is
        # found to lack it (before migration 0005).
        self.token = default_holder()
        self.db_queue = True

    async def start(self) -> None:
        """LISTEN now (once), so that no release after this call goes unheard."""
        import psycopg

        async with self._open_lock:
            if self.worker is not None:
                return
            try:
                conn = await self._open()
            except psycopg.Error as exc:
                logger.info("cannot LISTEN, waiters poll until it works: %s", exc)
            else:
                # The waiters queued meanwhile claim after this (see enter()).
                self._listening(conn, wake=False)
            self.worker = aspawn(self._run, name="pylease-listen")

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        import psycopg

        from pylease.postgres._conninfo import CHANNEL, LISTEN_APP, own_conninfo

        conn = await psycopg.AsyncConnection.connect(
            own_conninfo(self.conninfo, LISTEN_APP), autocommit=True, prepare_threshold=None
        )
        try:
            await conn.execute("LISTEN " + CHANNEL)
            await conn.execute("LISTEN " + QUEUE_CHANNEL)
            await conn.execute("LISTEN " + HOLDERS_CHANNEL)
        except BaseException:
            await conn.close()
            raise
        return conn

    def _listening(self, conn: psycopg.AsyncConnection[Any], *, wake: bool = True) -> None:
        with _mutex:
            self.conn = conn
            self.epoch += 1
            if wake:
                # A release may have gone unheard while nobody listened.
                self._wake_heads()

    def _wake_heads(self) -> None:
        """Called with the mutex held: a release may have gone unheard."""
        for queue in self.queues.values():
            queue[0].wake(retry=True)
        for watchers in self.watchers.values():
            for watcher in watchers:
                watcher.wake()

    def _dispatch(self, channel: str, payload: str) -> None:
        with _mutex:
            if channel == HOLDERS_CHANNEL:
                self._changed(payload)
                return
            self.heard += 1
            if channel == QUEUE_CHANNEL:
                # {"name": ..., "waiter": ..., "claim": ...}: the process now first
                # in line, and whether to claim at once (the one before left without
                # the lease) or on the next release (it left with it; notifications
                # come in commit order, so that release's comes after this one).
                try:
                    turn = json.loads(payload)
                    name, waiter, claim = str(turn["name"]), turn["waiter"], bool(turn["claim"])
                except (ValueError, KeyError, TypeError):
                    return
                queue = self.queues.get(name)
                if waiter == self.token and queue:
                    queue[0].db_head = True
                    queue[0].wake(retry=claim)
                return
            for watcher in (*self.watchers.get(payload, ()), *self.watchers.get(None, ())):
                watcher.wake()
            queue = self.queues.get(payload)
            if not queue:
                return
            if queue[0].db_head is not False:
                queue[0].wake(retry=True)
            else:
                # Behind another process in the queue of waiting processes: this release
                # is the one ahead's, but the head here claims after a grace in case
                # that process died (its entry lasts until it expires).
                queue[0].heard()

    def _changed(self, payload: str) -> None:
        """Called with the mutex held: a change of holder of a watched name."""
        try:
            change = json.loads(payload)
            name = str(change["name"])
        except (ValueError, KeyError, TypeError):
            return
        for watcher in self.watchers.get(name, ()):
            if watcher.changes is not None:
                watcher.changes.append(change)
                watcher.wake()

    def _done(self) -> bool:
        """True (and the hub leaves the registry) once nobody waited or watched for LINGER
        seconds."""
        with _mutex:
            if self.queues or self.watchers or monotonic() - self.idle_since < LINGER:
                return False
            self.closing = True
            hubs = _hubs()
            if hubs.get(self.conninfo) is self:
                del hubs[self.conninfo]
            return True

    async def _run(self) -> None:
        import psycopg

        backoff = FIRST_RELISTEN
        try:
            while not self._done():
                conn = self.conn
                if conn is None:
                    await asleep(backoff * random.uniform(0.8, 1.2))
                    if self._done():
                        return
                    try:
                        conn = await self._open()
                    except psycopg.Error as exc:
                        logger.info("cannot LISTEN again yet: %s", exc)
                        backoff = min(backoff * 2, MAX_RELISTEN)
                        continue
                    backoff = FIRST_RELISTEN
                    self._listening(conn)
                    continue
                try:
                    async for notify in conn.notifies(timeout=TICK):
                        self._dispatch(notify.channel, notify.payload)
                except psycopg.Error as exc:
                    logger.info("the LISTEN connection was lost, waiters poll: %s", exc)
                    with _mutex:
                        self.conn = None
                        self._wake_heads()
                    await _close(conn)
        finally:
            with _mutex:
                conn, self.conn = self.conn, None
            if conn is not None:
                await _close(conn)


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    import psycopg

    # Closing a broken connection: nothing is left to tell.
    with contextlib.suppress(psycopg.Error):
        await conn.close()


def joined(waiter: AsyncWaiter, first: bool, refresh_at: float) -> None:
    """The process of ``waiter`` is queued in the queue of waiting processes (first in
    line, or not), and refreshes its entry at ``refresh_at``."""
    with _mutex:
        # A NOTIFY naming this process may have come while the answer was on its way.
        waiter.db_head = bool(first) or bool(waiter.db_head)
        waiter.refresh_at = refresh_at


def mark(conninfo: str) -> Mark | None:
    """What a waiter sees before its first claim (None: nobody listens yet)."""
    with _mutex:
        hub = _hubs().get(conninfo)
        if hub is None or hub.conn is None:
            return None
        return hub, hub.epoch, hub.heard


def _hub(conninfo: str) -> AsyncHub:
    """The hub of ``conninfo`` in this process (event loop), made if there is none.

    Called with the mutex held, so that a hub found is not closing before its new
    waiter or watcher is in.
    """
    hubs = _hubs()
    hub = hubs.get(conninfo)
    if hub is None or hub.closing:
        hub = hubs[conninfo] = AsyncHub(conninfo)
    return hub


async def enter(conninfo: str, name: str, seen: Mark | None) -> tuple[AsyncWaiter, bool]:
    """Queue a waiter for ``name``, LISTENing first if nobody does yet.

    Returns the waiter and whether it must claim at once: only a head that may have
    missed a release since ``seen`` (taken before its first, busy claim) must.
    """
    with _mutex:
        hub = _hub(conninfo)
        waiter = AsyncWaiter(hub, name)
        queue = hub.queues.setdefault(name, deque())
        queue.append(waiter)
    if hub.worker is None:
        await hub.start()
    with _mutex:
        head = hub.queues[name][0] is waiter
        unchanged = seen == (hub, hub.epoch, hub.heard) and hub.conn is not None
    return waiter, head and not unchanged


async def watch(conninfo: str, name: str | None, *, changes: bool = False) -> AsyncWatcher:
    """Watch the releases of ``name`` (of every name: None), LISTENing first if nobody
    does yet; with ``changes``, keep every change of holder heard for it too (the name
    must be registered with ``lease_watch`` for the database to send them).
    :meth:`AsyncWatcher.close` ends it."""
    with _mutex:
        hub = _hub(conninfo)
        watcher = AsyncWatcher(hub, name, changes)
        hub.watchers.setdefault(name, []).append(watcher)
    if hub.worker is None:
        await hub.start()
    with _mutex:
        watcher.epoch = hub.epoch  # what it hears from now on is what it takes
    return watcher


def ring(watcher: AsyncWatcher) -> None:
    """Wake ``watcher`` from this process, as a notification of its name would (a
    change of its own state worth a look: a group's partition granted or lost)."""
    with _mutex:
        watcher.wake()


def leave(waiter: AsyncWaiter, *, granted: bool) -> None:
    """Take ``waiter`` out of its queue; the next one becomes the head.

    The next claims at once unless ``waiter`` leaves with the lease (then only the
    next release can free it).
    """
    hub = waiter.hub
    with _mutex:
        queue = hub.queues.get(waiter.name)
        if queue is None or waiter not in queue:
            return
        was_head = queue[0] is waiter
        queue.remove(waiter)
        if not queue:
            del hub.queues[waiter.name]
            if not hub.queues:
                hub.idle_since = monotonic()
        elif was_head:
            queue[0].wake(retry=not granted)


def waiters(name: str | None = None) -> int:
    """How many leases of this process (event loop) wait now, for ``name`` or any."""
    with _mutex:
        return sum(
            len(queue)
            for hub in _hubs().values()
            for key, queue in hub.queues.items()
            if name is None or key == name
        )


if True:  # ASYNC
    _registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncHub]] = (
        weakref.WeakKeyDictionary()
    )

    def _hubs() -> dict[str, AsyncHub]:
        """The hubs of the running event loop, by conninfo."""
        loop = asyncio.get_running_loop()
        found = _registries.get(loop)
        if found is None:
            found = _registries[loop] = {}
        return found

    async def _wait(event: asyncio.Event, timeout: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), max(timeout, 0.0))
        except TimeoutError:
            return False
        return True

else:
    _registry: dict[str, AsyncHub] = {}

    def _hubs() -> dict[str, AsyncHub]:
        """The hubs of this process, by conninfo."""
        return _registry

    def _wait(event: AEvent, timeout: float) -> bool:
        return event.wait(max(timeout, 0.0))

    def _after_fork() -> None:
        # A forked child has no reader thread: its waiters start a hub of their own
        # (and the mutex may have been held by a thread the child does not have).
        global _registry, _mutex
        _registry = {}
        _mutex = AMutex()

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork)
