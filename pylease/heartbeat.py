"""The keeper: one background thread that keeps every lease of the process fresh.

Leases are grouped by the :class:`~pylease.targets.Source` their renewals run on (one
per database); each tick renews a whole group with ONE ``lease_renew_many``
statement, however many leases it holds. A group ticks every third of its shortest
ttl. A failed tick (connection dropped, server restarting) is retried with backoff
until a lease's expiry minus a safety margin; a lease that no renewal could keep by
then, or that a renewal answers false for, is lost: its :class:`Ticket` records
why, and its ``on_lost`` callback runs (on the keeper thread: keep it short).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pylease.errors import LeaseLost
from pylease.targets import Source

logger = logging.getLogger("pylease")

FIRST_BACKOFF = 0.05
MAX_MARGIN = 10.0
# How long the keeper thread outlives its last lease, waiting for the next one.
LINGER = 1.0
# How long stopping waits for a tick already under way for that lease.
STOP_WAIT = 5.0

LostCallback = Callable[[LeaseLost], object]


def margin(ttl: float) -> float:
    """How long before its expiry a lease that could not be renewed counts as lost."""
    return min(ttl / 6, MAX_MARGIN)


class Ticket:
    """One lease kept fresh, and what is known about it.

    ``expires`` is a monotonic-clock lower bound of the lease's expiry: the moment
    the last successful claim or renewal was *sent*, plus the ttl.
    """

    def __init__(
        self,
        name: str,
        holder: str,
        ttl: timedelta,
        *,
        sent_at: float,
        on_lost: Callable[[LeaseLost], Any] | None = None,
    ) -> None:
        self.name = name
        self.holder = holder
        self.ttl = ttl.total_seconds()
        self.on_lost = on_lost
        self.expires = sent_at + self.ttl
        self.lost: LeaseLost | None = None
        self.renewals = 0

    @property
    def deadline(self) -> float:
        return self.expires - margin(self.ttl)

    @property
    def interval(self) -> float:
        return self.ttl / 3

    def renewed(self, sent_at: float) -> None:
        self.expires = max(self.expires, sent_at + self.ttl)
        self.renewals += 1

    def __repr__(self) -> str:
        state = "lost" if self.lost is not None else "kept"
        return f"<Ticket {self.name!r} holder={self.holder!r} ttl={self.ttl:g}s {state}>"

    def mark_lost(self, reason: str) -> LeaseLost | None:
        """Record the loss; the error the first time, None if it was known already."""
        if self.lost is not None:
            return None
        self.lost = LeaseLost(self.name, reason)
        return self.lost

    def error(self) -> LeaseLost | None:
        """A fresh LeaseLost if the lease is lost or past its expiry, else None."""
        if self.lost is not None:
            return LeaseLost(self.name, self.lost.reason)
        if time.monotonic() >= self.expires:
            return LeaseLost(self.name, "its ttl ran out without a renewal")
        return None


def notify_lost(ticket: Ticket, reason: str) -> LeaseLost | None:
    """Mark ``ticket`` lost and log it; the error if this was news."""
    error = ticket.mark_lost(reason)
    if error is not None:
        logger.warning(
            "lease %r lost: %s",
            ticket.name,
            reason,
            extra={"pylease_event": "lost", "pylease_name": ticket.name, "pylease_reason": reason},
        )
    return error


def call_on_lost(ticket: Ticket, error: LeaseLost) -> None:
    if ticket.on_lost is None:
        return
    try:
        ticket.on_lost(LeaseLost(error.name or ticket.name, error.reason))
    except Exception:
        logger.exception("on_lost callback for lease %r failed", ticket.name)


class _Group:
    """The tickets renewed through one source, and when to renew them next."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.tickets: list[Ticket] = []
        self.next_at = float("inf")
        self.failures = 0
        self.last_error: BaseException | None = None
        self.busy = False

    def interval(self) -> float:
        return min(t.interval for t in self.tickets)


class Keeper:
    """Keeps the tickets of this process fresh from one daemon thread.

    The thread schedules; each tick's statement runs on a short-lived thread of its
    own, so a renewal that hangs (a network partition) cannot keep the keeper from
    declaring a lease lost at its deadline, nor one database from delaying another.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._groups: dict[Any, _Group] = {}
        self._inflight: set[Ticket] = set()
        self._thread: threading.Thread | None = None
        self._idle_since: float | None = None
        # When the keeper thread's current sleep ends (0: it is not sleeping).
        self._sleeping_until = 0.0

    def add(self, ticket: Ticket, source: Source) -> None:
        with self._cond:
            group = self._groups.get(source.key)
            if group is None:
                group = self._groups[source.key] = _Group(source)
            # The source in use now: a group kept through a tick may still hold one
            # that the registry has closed since.
            group.source = source
            group.tickets.append(ticket)
            group.next_at = min(group.next_at, time.monotonic() + ticket.interval)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pylease-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._sleeping_until and group.next_at < self._sleeping_until:
                # Wake the keeper only when it would sleep past this lease's first tick:
                # a wake-up per lease costs a GIL handoff in a loop of short leases.
                self._cond.notify_all()

    def remove(self, ticket: Ticket, source: Source) -> None:
        """Stop renewing ``ticket``; a tick under way for it finishes first (bounded)."""
        with self._cond:
            group = self._groups.get(source.key)
            if group is not None and ticket in group.tickets:
                group.tickets.remove(ticket)
                if not group.tickets and not group.busy:
                    del self._groups[source.key]
            # A tick that already sent this renewal is answered before the release
            # goes out, so its answer cannot be taken for a loss after the release.
            limit = time.monotonic() + STOP_WAIT
            while ticket in self._inflight:
                left = limit - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)

    def tickets(self) -> list[Ticket]:
        with self._cond:
            return [t for g in self._groups.values() for t in g.tickets]

    def _run(self) -> None:
        while True:
            try:
                if not self._step():
                    return
            except Exception:
                # A bug here must not silently stop every renewal of the process.
                logger.exception("keeper tick failed")
                time.sleep(FIRST_BACKOFF)

    def _sleep(self, seconds: float) -> None:
        """Wait on the condition (its lock held), saying until when, for :meth:`add`."""
        self._sleeping_until = time.monotonic() + seconds
        try:
            self._cond.wait(seconds)
        finally:
            self._sleeping_until = 0.0

    def _step(self) -> bool:
        """One round: lose the overdue, start the due ticks, or sleep; False when done."""
        with self._cond:
            now = time.monotonic()
            overdue = [
                (g, t) for g in self._groups.values() for t in g.tickets if t.deadline <= now
            ]
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
                    due.append((group, list(group.tickets)))
                    self._inflight.update(group.tickets)
            done = not any(g.tickets for g in self._groups.values())
            if not done:
                self._idle_since = None
            elif not overdue and not due:
                # Linger a moment before ending: a loop of short leases would
                # otherwise start a thread for every one of them.
                if self._idle_since is None:
                    self._idle_since = now
                if now - self._idle_since < LINGER:
                    self._sleep(LINGER - (now - self._idle_since))
                    return True
            if done:
                self._idle_since = None
                self._thread = None
            elif not overdue and not due:
                wake = min(
                    min((g.next_at for g in self._groups.values() if not g.busy), default=now + 1),
                    min(t.deadline for g in self._groups.values() for t in g.tickets),
                )
                self._sleep(max(wake - now, 0.001))
                return True
        for group, ticket in overdue:
            why = f"no renewal succeeded before its expiry (last error: {group.last_error})"
            error = notify_lost(ticket, why)
            if error is not None:
                call_on_lost(ticket, error)
        for group, batch in due:
            threading.Thread(
                target=self._tick, args=(group, batch), name="pylease-renew", daemon=True
            ).start()
        return not done

    def _tick(self, group: _Group, batch: list[Ticket]) -> None:
        lost: list[Ticket] = []
        try:
            lost = self._renew(group, batch)
        finally:
            with self._cond:
                group.busy = False
                key = group.source.key
                if not group.tickets and self._groups.get(key) is group:
                    del self._groups[key]
                self._inflight.difference_update(batch)
                self._cond.notify_all()
        # Only now: a callback that ends a lease must not wait for this very tick.
        for ticket in lost:
            why = "a renewal found it no longer ours (released, expired and taken, or stolen)"
            error = notify_lost(ticket, why)
            if error is not None:
                call_on_lost(ticket, error)

    def _renew(self, group: _Group, batch: list[Ticket]) -> list[Ticket]:
        """Renew ``batch`` in one statement; the tickets found lost."""
        sent_at = time.monotonic()
        try:
            rows = group.source.run(
                lambda b: b.renew_many([t.name for t in batch], [t.holder for t in batch]),
                retry=True,
            )
        except Exception as exc:
            group.failures += 1
            group.last_error = exc
            backoff = min(FIRST_BACKOFF * 2 ** (group.failures - 1), group_interval(batch) / 2)
            logger.warning(
                "renewing %d lease(s) through %s failed (attempt %d), retrying in %.2fs: %s",
                len(batch),
                group.source.label,
                group.failures,
                backoff,
                exc,
                extra={
                    "pylease_event": "renew_failed",
                    "pylease_names": [t.name for t in batch],
                    "pylease_attempt": group.failures,
                    "pylease_expires_in": min(t.expires for t in batch) - time.monotonic(),
                    "pylease_error": exc,
                },
            )
            with self._cond:
                group.next_at = time.monotonic() + backoff * random.uniform(0.8, 1.2)
            return []
        if group.failures:
            logger.info(
                "renewing %d lease(s) through %s works again after %d failed attempt(s)",
                len(batch),
                group.source.label,
                group.failures,
                extra={
                    "pylease_event": "renew_recovered",
                    "pylease_names": [t.name for t in batch],
                    "pylease_attempt": group.failures,
                },
            )
        group.failures = 0
        group.last_error = None
        lost: list[Ticket] = []
        with self._cond:
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


def group_interval(batch: list[Ticket]) -> float:
    return min(t.interval for t in batch)


_keeper = Keeper()


def keeper() -> Keeper:
    """The keeper of this process."""
    return _keeper


def _after_fork() -> None:
    # A forked child holds none of its parent's leases, and has no keeper thread.
    global _keeper
    _keeper = Keeper()
    from pylease import targets

    targets.registry.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
