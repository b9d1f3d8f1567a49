"""The async keeper: one task per event loop that keeps every async lease fresh.

The twin of :mod:`pylease.heartbeat`, with two differences an event loop allows: a
renewal that hangs is abandoned at the earliest deadline of its batch, and a lost
lease can cancel the task running its body (``alease(..., cancel_on_lost=True)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
import weakref
from typing import Any

from pylease.errors import LeaseLost
from pylease.heartbeat import FIRST_BACKOFF, STOP_WAIT, Ticket, notify_lost
from pylease.targets_async import AsyncSource

logger = logging.getLogger("pylease")

# The shortest time a renewal is given before it counts as failed.
MIN_RENEW_TIME = 0.05


class AsyncTicket(Ticket):
    """A ticket whose loss may also cancel the task running the body."""

    task: asyncio.Task[Any] | None = None
    cancelled_body = False


async def call_on_lost(ticket: Ticket, error: LeaseLost) -> None:
    if ticket.on_lost is not None:
        try:
            outcome = ticket.on_lost(LeaseLost(error.name or ticket.name, error.reason))
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            logger.exception("on_lost callback for lease %r failed", ticket.name)
    if isinstance(ticket, AsyncTicket) and ticket.task is not None and not ticket.task.done():
        ticket.cancelled_body = True
        ticket.task.cancel(f"pylease: lease {ticket.name!r} was lost")


class _Group:
    def __init__(self, source: AsyncSource) -> None:
        self.source = source
        self.tickets: list[Ticket] = []
        self.next_at = float("inf")
        self.failures = 0
        self.last_error: BaseException | None = None
        self.busy = False

    def interval(self) -> float:
        return min(t.interval for t in self.tickets)


class AsyncKeeper:
    """Keeps the tickets of one event loop fresh from one task.

    The task schedules; each tick's statement runs in a task of its own, so a
    renewal that hangs cannot hold up the verdict on any lease.
    """

    def __init__(self) -> None:
        self._groups: dict[Any, _Group] = {}
        self._inflight: set[Ticket] = set()
        self._changed = asyncio.Event()
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ticks: set[asyncio.Task[None]] = set()

    def add(self, ticket: Ticket, source: AsyncSource) -> None:
        group = self._groups.get(source.key)
        if group is None:
            group = self._groups[source.key] = _Group(source)
        # The source in use now: a group kept through a tick may still hold one
        # that the registry has closed since.
        group.source = source
        group.tickets.append(ticket)
        group.next_at = min(group.next_at, time.monotonic() + ticket.interval)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="pylease-heartbeat"
            )
        self._changed.set()

    async def remove(self, ticket: Ticket, source: AsyncSource) -> None:
        """Stop renewing ``ticket``; a tick under way for it finishes first (bounded)."""
        group = self._groups.get(source.key)
        if group is not None and ticket in group.tickets:
            group.tickets.remove(ticket)
            if not group.tickets and not group.busy:
                del self._groups[source.key]
        limit = time.monotonic() + STOP_WAIT
        while ticket in self._inflight and time.monotonic() < limit:
            self._settled.clear()
            try:
                await asyncio.wait_for(self._settled.wait(), limit - time.monotonic())
            except TimeoutError:
                break
        self._changed.set()

    def tickets(self) -> list[Ticket]:
        return [t for g in self._groups.values() for t in g.tickets]

    async def _run(self) -> None:
        # Checked and left without an await in between, so a ticket added by add()
        # is either seen here or finds this task done and starts another.
        while any(g.tickets for g in self._groups.values()):
            try:
                await self._step()
            except Exception:
                logger.exception("async keeper tick failed")
                await asyncio.sleep(FIRST_BACKOFF)

    async def _step(self) -> None:
        now = time.monotonic()
        overdue = [(g, t) for g in self._groups.values() for t in g.tickets if t.deadline <= now]
        for group, ticket in overdue:
            group.tickets.remove(ticket)
        due = []
        for key, group in list(self._groups.items()):
            if not group.tickets:
                if not group.busy:
                    del self._groups[key]
            elif group.next_at <= now and not group.busy:
                group.busy = True
                due.append((group, list(group.tickets)))
                self._inflight.update(group.tickets)
        for group, batch in due:
            task = asyncio.get_running_loop().create_task(
                self._tick(group, batch), name="pylease-renew"
            )
            self._ticks.add(task)
            task.add_done_callback(self._ticks.discard)
        for group, ticket in overdue:
            why = f"no renewal succeeded before its expiry (last error: {group.last_error})"
            error = notify_lost(ticket, why)
            if error is not None:
                await call_on_lost(ticket, error)
        if overdue or not any(g.tickets for g in self._groups.values()):
            return
        wake = min(
            min((g.next_at for g in self._groups.values() if not g.busy), default=now + 1),
            min(t.deadline for g in self._groups.values() for t in g.tickets),
        )
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(wake - time.monotonic(), 0.001))

    async def _tick(self, group: _Group, batch: list[Ticket]) -> None:
        lost: list[Ticket] = []
        try:
            lost = await self._renew(group, batch)
        finally:
            group.busy = False
            key = group.source.key
            if not group.tickets and self._groups.get(key) is group:
                del self._groups[key]
            self._inflight.difference_update(batch)
            self._settled.set()
            self._changed.set()
        # Only now: a callback that ends a lease must not wait for this very tick.
        for ticket in lost:
            why = "a renewal found it no longer ours (released, expired and taken, or stolen)"
            error = notify_lost(ticket, why)
            if error is not None:
                await call_on_lost(ticket, error)

    async def _renew(self, group: _Group, batch: list[Ticket]) -> list[Ticket]:
        """Renew ``batch`` in one statement; the tickets found lost."""
        sent_at = time.monotonic()
        names, holders = [t.name for t in batch], [t.holder for t in batch]
        # A renewal that hangs past the batch's earliest deadline is abandoned, so
        # the loss is reported while it can still matter.
        budget = max(min(t.deadline for t in batch) - sent_at, MIN_RENEW_TIME)
        try:
            rows = await asyncio.wait_for(
                group.source.run(lambda b: b.renew_many(names, holders), retry=True), budget
            )
        except Exception as exc:
            group.failures += 1
            group.last_error = exc
            backoff = min(
                FIRST_BACKOFF * 2 ** (group.failures - 1), min(t.interval for t in batch) / 2
            )
            logger.warning(
                "renewing %d lease(s) through %s failed (attempt %d), retrying in %.2fs: %s",
                len(batch),
                group.source.label,
                group.failures,
                backoff,
                exc if str(exc) else type(exc).__name__,
            )
            group.next_at = time.monotonic() + backoff * random.uniform(0.8, 1.2)
            return []
        group.failures = 0
        group.last_error = None
        lost: list[Ticket] = []
        for ticket, (_name, renewed) in zip(batch, rows, strict=True):
            if ticket not in group.tickets:
                continue  # stopped meanwhile: its answer no longer matters
            if renewed:
                ticket.renewed(sent_at)
            else:
                group.tickets.remove(ticket)
                lost.append(ticket)
        if group.tickets:
            group.next_at = sent_at + group.interval()
        return lost


_keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncKeeper] = (
    weakref.WeakKeyDictionary()
)


def keeper() -> AsyncKeeper:
    """The keeper of the running event loop."""
    loop = asyncio.get_running_loop()
    found = _keepers.get(loop)
    if found is None:
        found = _keepers[loop] = AsyncKeeper()
    return found
