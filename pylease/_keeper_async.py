# The source of pylease/_keeper.py: tools/async_to_sync.py writes it from this file.
"""The keeper: it keeps every lease of its event loop (the sync one: of its process) fresh.

The keeper of an event loop is one task; the sync one, in :mod:`pylease._keeper`,
is a daemon thread.

Leases are grouped by the source their renewals run on (one per database) and by
the operation that renews them; each tick renews a whole group with ONE statement
(:func:`pylease._tenure_async.renew_leases`: every lease, permit and claim of
several names of the process on that database), however many it holds; a renewable
thing with an operation of its own is a group of its own, not a second keeper. A
group ticks every third of its shortest ttl. A failed tick (connection dropped,
server restarting) is retried with backoff until a lease's expiry minus a safety
margin; a lease that no renewal could keep by then, or that a
renewal answers false for, is lost: its ticket records why, the task running its body
is cancelled (async, ``cancel_on_lost``), and only then its ``on_lost`` callback runs,
in a task (a thread) of its own, so a slow or stuck callback never delays a renewal.
A lease whose ``Held`` was collected while its block was never left is abandoned: no
longer renewed, and released on pylease's own connection at once. A lease whose block
ended inside the caller's open transaction is still renewed, and released once that
transaction has ended (:mod:`pylease._caller_tx`).

Where the two keepers differ, on purpose (the ``if True:  # ASYNC`` blocks): on an event
loop a renewal that hangs is abandoned at the earliest deadline of its batch (a thread
cannot be interrupted, so there it runs on a thread of its own per tick), a lost lease may
cancel the task running its body, an ``on_lost`` coroutine is awaited and a plain
``on_lost`` runs on a worker thread; the thread keeper lingers a moment after its last
lease, and a forked child starts with a keeper of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Hashable, Sequence
from datetime import datetime
from typing import Any

from pylease import _claims
from pylease._acompat import ACondition, AWorker, acondition_wait, asleep, aspawn, monotonic
from pylease._backend_async import AsyncReleaseOp
from pylease._budget import exit_deadline, waiting
from pylease._caller_tx import GIVE_BACK_WAIT, TX_POLL, WAKE_WAIT, Deferred, take_ended
from pylease._links_async import AsyncSource
from pylease._log import last_error as error_text
from pylease._log import renew_failed, tick_settled
from pylease._telling_async import STOP_WAIT, tell_lost, tell_release_requested
from pylease._tenure_async import give_back, renew_leases
from pylease._ticket import LostCallback as LostCallback
from pylease._ticket import Ticket, notify_lost
from pylease._ticket import margin as margin

if True:  # ASYNC
    pass
else:
    import os
    import sys
    import threading

logger = logging.getLogger("pylease")

FIRST_BACKOFF = 0.05
# How long the keeper thread outlives its last lease, waiting for the next one: a
# loop of short leases would otherwise start a thread for every one of them.
LINGER = 1.0
if True:  # ASYNC
    # A task is cheap to start again: the keeper ends with its last lease.
    LINGER = 0.0

# How a group renews its tickets: one statement for the whole batch, run through the
# group's source (retried once on a stale connection, a pool's connection waited for
# no longer than a statement), answering (name, renewed) per ticket, in order.
# An operation may add, after those two, the seconds the server granted from its own
# clock and that clock (``datetime``), or None for both.
AsyncRenewOp = Callable[[AsyncSource, Sequence[Ticket]], Awaitable[list[tuple[Any, ...]]]]

NOT_OURS = "a renewal found it no longer ours (released, expired and taken, or stolen)"
# How much further the database's clock may advance between two renewals than ours
# did before the keeper takes it for a step (NTP slews far less than this).
STEP_TOLERANCE = 0.5


class _Group:
    """The tickets renewed through one source by one operation, and when next."""

    def __init__(self, source: AsyncSource, renew: AsyncRenewOp) -> None:
        self.source = source
        self.renew = renew
        self.tickets: list[Ticket] = []
        self.next_at = float("inf")
        self.failures = 0
        self.last_error: BaseException | None = None
        self.busy = False
        # (when the last renewal that read it was sent, on our clock; the database's
        # clock it read), to notice the database's clock stepping forward.
        self.clock: tuple[float, datetime] | None = None

    def due(self, now: float) -> list[Ticket]:
        """The tickets to renew in a tick at ``now``: each one due before the group's
        next tick would come, so a lease is renewed a little early rather than by a
        statement of its own, and one of a long ttl is not renewed at a short one's pace
        (leases of one ttl are all renewed by every tick, as they always were)."""
        horizon = now + min(t.interval for t in self.tickets)
        return [t for t in self.tickets if t.due <= horizon]

    def next_due(self) -> float:
        return min(t.due for t in self.tickets)

    def stepped(self, sent_at: float, received_at: float, server_time: datetime) -> float:
        """How far the database's clock jumped ahead of ours since the last renewal (0: not).

        Between the two readings at most ``received_at - previous sent_at`` passed on
        our clock; the database's clock advancing more than that (and the tolerance)
        stepped, and expired our leases early by as much.
        """
        previous, self.clock = self.clock, (sent_at, server_time)
        if previous is None:
            return 0.0
        server_delta = (server_time - previous[1]).total_seconds()
        jump = server_delta - (received_at - previous[0])
        return jump if jump > STEP_TOLERANCE else 0.0


# A ticket with its group; a group with the tickets its tick renews.
_Entry = tuple[_Group, Ticket]
_Batch = tuple[_Group, list[Ticket]]


class AsyncKeeper:
    """Keeps the tickets of one event loop (the sync one: of the process) fresh.

    One worker schedules; each tick's statement runs in a worker of its own, so a
    renewal that hangs (a network partition) cannot keep the keeper from declaring a
    lease lost at its deadline, nor one database from delaying another.
    """

    def __init__(self) -> None:
        self._cond = ACondition()
        self._groups: dict[Hashable, _Group] = {}
        self._inflight: set[Ticket] = set()
        # Leases released later: appended from any thread (a finalizer), taken by _step.
        self._deferred: list[Deferred] = []
        # Those whose release is under way (see adopt).
        self._releasing: set[Deferred] = set()
        self._task: AWorker | None = None
        if True:  # ASYNC
            # What starts the task when the first renewal is due (see add).
            self._timer: asyncio.TimerHandle | None = None
            self._timer_at = 0.0
            self._loop = asyncio.get_running_loop()
        self._idle_since: float | None = None
        # When the keeper's current sleep ends (0: it is not sleeping).
        self._sleeping_until = 0.0

    async def add(
        self, ticket: Ticket, source: AsyncSource, renew: AsyncRenewOp = renew_leases
    ) -> None:
        """Start renewing ``ticket`` through ``source`` with ``renew``."""
        if True:  # ASYNC
            # Nothing in _add awaits: while no task holds the condition, taking it would
            # change nothing on one event loop (and costs every block).
            if not self._cond.locked():
                if self._add(ticket, source, renew):
                    async with self._cond:
                        self._cond.notify_all()
                return
        async with self._cond:
            if self._add(ticket, source, renew):
                self._cond.notify_all()

    def _add(self, ticket: Ticket, source: AsyncSource, renew: AsyncRenewOp) -> bool:
        """Put ``ticket`` in its group (the condition held, or idle on an event loop);
        True when the keeper, asleep, must be woken for it."""
        key = (source.key, renew)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(source, renew)
        # The source in use now: a group kept through a tick may still hold one
        # that the registry has closed since.
        group.source = source
        group.tickets.append(ticket)
        ticket.keeper = self
        ticket.kept = True
        group.next_at = min(group.next_at, ticket.due)
        idle = self._task is None
        if True:  # ASYNC
            # A task cancelled from outside (its loop shutting down) is gone too.
            idle = self._task is None or self._task.done()
        if idle:
            if True:  # ASYNC
                # Until its first renewal is due a lease needs no task: a timer
                # stands in, so a loop of short leases starts no task per lease.
                self._start_at(group.next_at)
            else:
                self._task = aspawn(self._run, name="pylease-heartbeat")
            return False
        # Wake the keeper only when it would sleep past this lease's first tick:
        # a wake-up per lease costs a thread handoff in a loop of short leases.
        return bool(self._sleeping_until) and group.next_at < self._sleeping_until

    async def remove(
        self, ticket: Ticket, source: AsyncSource, renew: AsyncRenewOp = renew_leases
    ) -> None:
        """Stop renewing ``ticket``; a tick under way for it finishes first (bounded)."""
        if True:  # ASYNC
            # As in add: nothing to wait for, and no task holds the condition.
            if ticket not in self._inflight and not self._cond.locked():
                self._remove(ticket, source, renew)
                return
        async with self._cond:
            self._remove(ticket, source, renew)
            # A tick that already sent this renewal is answered before the release
            # goes out, so its answer cannot be taken for a loss after the release
            # (within a block's exit, only while its budget allows: the answer of a
            # ticket out of its group is ignored anyway).
            if ticket not in self._inflight:
                return
            limit = monotonic() + waiting(STOP_WAIT)
            while ticket in self._inflight:
                left = limit - monotonic()
                if left <= 0:
                    break
                await acondition_wait(self._cond, left)

    def _remove(self, ticket: Ticket, source: AsyncSource, renew: AsyncRenewOp) -> None:
        """Take ``ticket`` out of its group (the condition held, or idle on an event loop)."""
        group = self._groups.get((source.key, renew))
        ticket.kept = False
        if group is not None and ticket in group.tickets:
            group.tickets.remove(ticket)
            if not group.tickets:
                # Kept for the next lease of its source (a loop of short leases
                # builds no group per lease); the next round drops it if unused.
                group.next_at = float("inf")

    async def defer(self, entry: Deferred) -> None:
        """Release its lease (kept renewed meanwhile, if it is) once its watch says the
        caller's transaction has ended; then close its link."""
        self._deferred.append(entry)
        self._wake()

    def deferring(self) -> bool:
        """Whether a lease is kept (or being released) for a caller's transaction: else
        :meth:`adopt` has nothing to give."""
        return bool(self._deferred or self._releasing)

    async def adopt(self, name: str, holder: str | None, owner: object) -> Deferred | None:
        """Take back a deferred lease of ``name`` kept for ``owner``'s transaction, for a
        new block there (see AsyncLease._adopt); None after any release under way."""
        if not self._deferred and not self._releasing:
            return None  # every block's entry asks: no lock for the common answer
        async with self._cond:
            limit = monotonic() + STOP_WAIT
            while True:
                for entry in self._deferred:
                    if entry.matches(name, holder, owner):
                        self._deferred.remove(entry)
                        return entry
                releasing = any(e.owner is owner and e.ticket.name == name for e in self._releasing)
                if not releasing or monotonic() >= limit:
                    return None
                await acondition_wait(self._cond, limit - monotonic())

    def abandon(self, ticket: Ticket) -> None:
        """Its Held was collected inside its block: release it now. A finalizer's, on any
        thread: it waits for the release only on a caller's thread (sync), and bounded."""
        ticket.abandoned = True
        if not ticket.kept and ticket.link is not None:
            self._deferred.append(Deferred(ticket, ticket.link.renewals, None, None, ticket.link))
        if True:  # ASYNC
            with contextlib.suppress(RuntimeError):  # a closed loop: the expiry frees it
                self._loop.call_soon_threadsafe(self._wake)
        else:
            here = threading.current_thread().name
            # The keeper's own threads must not wait for themselves.
            if self._wake() and not here.startswith("pylease-") and not sys.is_finalizing():
                ticket.given_back.wait(GIVE_BACK_WAIT)

    def _wake(self) -> bool:
        """Make the keeper look at its leases now; False if it could not be told."""
        if True:  # ASYNC
            if self._task is None or self._task.done():
                self._start_at(monotonic())
            else:
                aspawn(self._notify, name="pylease-wake")
        else:
            if not self._cond.acquire(timeout=WAKE_WAIT):
                return False  # it finds the lease at its next tick
            try:
                if self._task is None:
                    self._task = aspawn(self._run, name="pylease-heartbeat")
                else:
                    self._cond.notify_all()
            finally:
                self._cond.release()
        return True

    if True:  # ASYNC

        async def _notify(self) -> None:
            async with self._cond:
                self._cond.notify_all()

        def _start_at(self, when: float) -> None:
            """Start the keeper's task at ``when`` (keeper clock), unless due earlier.

            The timer is left to fire when its leases end first (the task then finds
            nothing to do and ends): a loop of short leases sets one per ttl / 3.
            """
            if self._timer is not None:
                if self._timer_at <= when:
                    return
                self._timer.cancel()
            self._timer_at = when
            delay = max(when - monotonic(), 0.0)
            self._timer = asyncio.get_running_loop().call_later(delay, self._start)

        def _start(self) -> None:
            self._timer = None
            if self._task is None or self._task.done():
                self._task = aspawn(self._run, name="pylease-heartbeat")

    def tickets(self) -> list[Ticket]:
        """Every ticket kept now."""
        if True:  # ASYNC
            return [t for g in self._groups.values() for t in g.tickets]
        else:
            with self._cond:
                return [t for g in self._groups.values() for t in g.tickets]

    async def _run(self) -> None:
        # Started from a block's exit (a deferred release wakes it), a task inherits that
        # exit's budget: the keeper's statements keep their own bounds.
        exit_deadline.set(None)
        while True:
            try:
                if not await self._step():
                    return
            except Exception:
                # A bug here must not silently stop every renewal of the process.
                logger.exception("keeper tick failed")
                await asleep(FIRST_BACKOFF)

    async def _sleep(self, seconds: float) -> None:
        """Wait on the condition (held), saying until when, for :meth:`add`."""
        self._sleeping_until = monotonic() + seconds
        try:
            await acondition_wait(self._cond, seconds)
        finally:
            self._sleeping_until = 0.0

    async def _step(self) -> bool:
        """One round: lose the overdue, start the due ticks, or sleep; False when done."""
        async with self._cond:
            now = monotonic()
            abandoned, overdue, due = self._sort(now)
            ended = take_ended(self._deferred)
            self._releasing.update(entry for entry, _verdict in ended)
            done = not any(g.tickets for g in self._groups.values()) and not self._deferred
            quiet = not (overdue or due or abandoned or ended)
            if done:
                if quiet and await self._linger(now):
                    return True
                # Decided with the condition held: a lease added from now on starts
                # another worker.
                self._idle_since = None
                self._task = None
            else:
                self._idle_since = None
                if quiet:
                    await self._sleep(max(self._wake_at(now) - now, 0.001))
                    return True
        for group, batch in due:
            aspawn(self._tick, group, batch, name="pylease-renew")
        for group, ticket in overdue:
            why = f"no renewal succeeded before its expiry (last error: {error_text(group)})"
            error = notify_lost(ticket, why)
            if error is not None:
                tell_lost(ticket, error)
        for group, ticket in abandoned:
            entry = Deferred(ticket, group.source, None, None, ticket.link, renew=group.renew)
            aspawn(self._give_back, entry, True, name="pylease-abandoned")
        for entry, verdict in ended:
            aspawn(self._give_back, entry, verdict, name="pylease-deferred")
        return not done

    def _sort(self, now: float) -> tuple[list[_Entry], list[_Entry], list[_Batch]]:
        """Take the abandoned and the overdue tickets out, and mark the due groups busy.

        Called with the condition held.
        """
        abandoned = [(g, t) for g in self._groups.values() for t in g.tickets if t.abandoned]
        for group, ticket in abandoned:
            group.tickets.remove(ticket)
        overdue = [(g, t) for g in self._groups.values() for t in g.tickets if t.deadline <= now]
        for group, ticket in overdue:
            group.tickets.remove(ticket)
        due = []
        for key, group in list(self._groups.items()):
            if not group.tickets:
                # A group whose tick is under way stays, so that a lease added
                # meanwhile does not start a second tick beside a hung one.
                if not group.busy:
                    del self._groups[key]
            elif group.next_at <= now and not group.busy:
                group.busy = True
                batch = group.due(now) or list(group.tickets)
                due.append((group, batch))
                self._inflight.update(batch)
        return abandoned, overdue, due

    async def _linger(self, now: float) -> bool:
        """With nothing to keep: wait LINGER for the next lease; False once it is over."""
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < LINGER:
            await self._sleep(LINGER - (now - self._idle_since))
            return True
        return False

    def _wake_at(self, now: float) -> float:
        """When the next tick is due, a deadline comes, or a deferred lease is looked at."""
        groups = self._groups.values()
        ticks = min((g.next_at for g in groups if not g.busy), default=now + 1)
        if self._deferred:
            ticks = min(ticks, now + TX_POLL)
        return min(ticks, min((t.deadline for g in groups for t in g.tickets), default=ticks))

    async def _give_back(self, entry: Deferred, verdict: bool) -> None:
        """Release a lease on pylease's own connection, where that is safe: an abandoned
        one, or a deferred one whose caller's transaction ended (``verdict`` True;
        False: it ended unknowably, so the lease is left to expire)."""
        ticket: Ticket = entry.ticket
        source: AsyncSource = entry.source
        name = ticket.name

        async def run(op: AsyncReleaseOp, again: AsyncReleaseOp | None) -> bool:
            # The source, never the caller's connection: that one may be in use.
            return await source.run(op, name=name, urgent=True)

        try:
            # Out of its group; its renewal under way, if any, is answered first.
            await self.remove(ticket, source, entry.renew or renew_leases)
            if entry.before_release(verdict):
                ours = await give_back(run, ticket, entry.min_hold)
                entry.after_release(ours)
        except Exception as exc:
            logger.warning("could not release lease %r: %s", name, exc)
        finally:
            _claims.leave_all(ticket.names or (name,), ticket.holder)
            if entry.link is not None:
                await entry.link.close()
            if ticket.given_back is not None:
                ticket.given_back.set()
            async with self._cond:
                self._releasing.discard(entry)
                self._cond.notify_all()

    async def _tick(self, group: _Group, batch: list[Ticket]) -> None:
        lost: list[tuple[Ticket, str]] = []
        try:
            lost = await self._renew(group, batch)
        finally:
            async with self._cond:
                group.busy = False
                tick_settled(group, batch)
                key = (group.source.key, group.renew)
                if not group.tickets and self._groups.get(key) is group:
                    del self._groups[key]
                self._inflight.difference_update(batch)
                self._cond.notify_all()
        # Only now: a callback that ends a lease must not wait for this very tick.
        for ticket, why in lost:
            error = notify_lost(ticket, why)
            if error is not None:
                tell_lost(ticket, error)

    async def _renew(self, group: _Group, batch: list[Ticket]) -> list[tuple[Ticket, str]]:
        """Renew ``batch`` in one statement; the tickets found lost, and why."""
        sent_at = monotonic()
        try:
            # Never cancelled (a cancel could report a commit the standby may not have):
            # a statement that hangs is bounded by its source, which abandons the
            # connection, and the keeper declares the loss at the deadline meanwhile.
            rows = await group.renew(group.source, batch)
        except Exception as exc:
            group.failures += 1
            group.last_error = exc
            backoff = min(
                FIRST_BACKOFF * 2 ** (group.failures - 1), min(t.interval for t in batch) / 2
            )
            # One warning per outage, at its first failure: the retries are DEBUG.
            renew_failed(group, batch, backoff, exc, monotonic())
            async with self._cond:
                group.next_at = monotonic() + backoff * random.uniform(0.8, 1.2)
            return []
        received_at = monotonic()
        group.failures = 0
        group.last_error = None
        lost: list[tuple[Ticket, str]] = []
        server_time = next((row[3] for row in rows if len(row) > 3 and row[3] is not None), None)
        jump = 0.0 if server_time is None else group.stepped(sent_at, received_at, server_time)
        why = NOT_OURS
        if jump:
            # Outside the clock assumption: the database expired our leases early, and
            # may have granted them already. Told at once, since it cannot be prevented.
            why = (
                f"the database's clock jumped {jump:.1f}s ahead of ours since the last"
                " renewal, so its expiry came early and it may have been granted to another"
            )
        async with self._cond:
            for ticket, row in zip(batch, rows, strict=True):
                renewed = bool(row[1])
                granted = row[2] if len(row) > 2 else None
                server_time = row[3] if len(row) > 3 else None
                if ticket not in group.tickets:
                    continue  # stopped meanwhile: its answer no longer matters
                if renewed and not jump:
                    ticket.renewed(sent_at, granted, server_time)
                    if len(row) > 4 and row[4] is not None:
                        tell_release_requested(ticket, row[4])
                else:
                    group.tickets.remove(ticket)
                    lost.append((ticket, why))
            if group.tickets:
                group.next_at = group.next_due()
        return lost


if True:  # ASYNC
    _keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncKeeper] = (
        weakref.WeakKeyDictionary()
    )

    # The last loop asked about and its keeper: a block asks several times.
    _last: tuple[weakref.ref[asyncio.AbstractEventLoop], AsyncKeeper] | None = None

    def keeper() -> AsyncKeeper:
        """The keeper of the running event loop."""
        global _last
        loop = asyncio.get_running_loop()
        last = _last
        if last is not None and last[0]() is loop:
            return last[1]
        found = _keepers.get(loop)
        if found is None:
            found = _keepers[loop] = AsyncKeeper()
        _last = (weakref.ref(loop), found)
        return found

else:
    _keeper = AsyncKeeper()

    def keeper() -> AsyncKeeper:
        """The keeper of this process."""
        return _keeper

    def _after_fork() -> None:
        # A forked child holds none of its parent's leases, and has no keeper thread.
        global _keeper
        _keeper = AsyncKeeper()
        from pylease import _links

        _links.reset_registry()

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork)
