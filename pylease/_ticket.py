"""A kept lease as the keeper sees it: the :class:`Ticket`, and how its loss is told.

Shared by the sync and async keepers (:mod:`pylease.heartbeat`,
:mod:`pylease.heartbeat_async`) and the lease blocks that hand them their tickets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pylease import _log
from pylease.errors import LeaseLost

logger = logging.getLogger("pylease")

MAX_MARGIN = 10.0

LostCallback = Callable[[LeaseLost], object]


def margin(ttl: float) -> float:
    """How long before its expiry a lease that could not be renewed counts as lost."""
    return min(ttl / 6, MAX_MARGIN)


class Ticket:
    """One lease kept fresh, and what is known about it.

    ``expires`` is a monotonic-clock lower bound of the lease's expiry: the moment
    the last successful claim or renewal was *sent*, plus the ttl.
    """

    # For the log records (pylease._log): the fence it was granted, and how many of
    # its renewals have been logged.
    fence: int | None = None
    logged_renewals = 0

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


class AsyncTicket(Ticket):
    """A ticket whose loss may also cancel the task running the body (``cancel_on_lost``)."""

    task: asyncio.Task[Any] | None = None
    cancelled_body = False


def notify_lost(ticket: Ticket, reason: str) -> LeaseLost | None:
    """Mark ``ticket`` lost and log it; the error if this was news."""
    error = ticket.mark_lost(reason)
    if error is not None:
        _log.lost(ticket.name, ticket.holder, ticket.fence, reason)
    return error
