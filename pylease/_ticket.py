"""A kept lease as the keeper sees it: the :class:`Ticket`, and how its loss is told.

Shared by the sync and async keepers (:mod:`pylease._keeper`,
:mod:`pylease._keeper_async`) and the lease blocks that hand them their tickets.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pylease import _claims, _log
from pylease._acompat import monotonic
from pylease.errors import LeaseLost

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger("pylease")

MAX_MARGIN = 10.0
# Contract section 5, "Clocks": the rates of the client's monotonic clock and of the
# server's clock differ by at most 0.1 %; what a holder believes ends this far before
# the expiry it computed, twice the bound of the ttl and at least 50 ms (model/).
DRIFT = 0.002
DRIFT_FLOOR = 0.05

LostCallback = Callable[[LeaseLost], object]

# This process's id, kept by a fork handler: every block's entry and exit compares a
# ticket's with it, and os.getpid() is a system call.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def drift_margin(ttl: float) -> float:
    """How long before its computed expiry a holder stops believing (clock-rate bound)."""
    return max(ttl * DRIFT, DRIFT_FLOOR)


def margin(ttl: float) -> float:
    """How long before its expiry a lease that could not be renewed counts as lost."""
    return min(ttl / 6, MAX_MARGIN)


class Ticket:
    """One lease kept fresh, and what is known about it.

    ``expires`` is a lower bound of the lease's expiry on the keeper's clock
    (:func:`pylease._acompat.monotonic`): the moment the last successful claim or
    renewal was *sent*, plus the time the server granted it (the claim's ttl; for a
    renewal, its granted expiry minus the server's clock at that moment). The keeper
    renews with ``renew_ttl`` (the lease's own ttl; for ``keep_fresh``, the one it was
    given, or None for the one in force), so another renewer's shorter ttl can never
    make the server's expiry earlier than the one believed here.

    A ticket belongs to the process that claimed it: in a forked child it reads as
    lost, and the child's lease block does nothing with it. ``abandoned`` is set when
    its :class:`~pylease.Held` was collected while the block was never left; the
    keeper then stops renewing it and releases it at once through ``link``'s source,
    pylease's own way to the database.
    """

    # For the log records (pylease._log): the fence it was granted, and how many of
    # its renewals have been logged.
    fence: int | None = None
    logged_renewals = 0
    # Set once its lease block is left: from then on the lease may be another's, so
    # its Held reads as lost (the ticket's own error() still tells the block's story).
    ended = False
    # The keeper that keeps it (or would release it once collected), whether that
    # keeper renews it now, and what a finalizer waiting for its release waits on.
    keeper: Any = None
    kept = False
    given_back: Any = None
    # Bumped when a later block in the caller's transaction takes the lease back.
    generation = 0
    # What the keeper renews: a lease ("lease"), a reader's share of one ("shared", its
    # epoch as ``fence``), or a holder's slots of a semaphore ("permit"); a claim of
    # several names renews each of ``names`` (lost when any is).
    kind = "lease"
    names: tuple[str, ...] = ()
    # The tenure its renewals name, beside ``fence``: several names' fence of each name;
    # a permit's first slot, whose fence ``fence`` is.
    fences: Mapping[str, int] | None = None
    slot: int | None = None
    # The expiry the server granted at the latest renewal, on its clock (Held.expires_at).
    server_expires: datetime | None = None
    # Who asked the holder to step down, as a renewal answered (contract 5.4), and what
    # to call then with the lease's Held (a weak reference: a Held collected inside its
    # block is how the keeper learns to give it back).
    release_requested_by: str | None = None
    on_release_requested: Callable[[Any], object] | None = None
    held: Callable[[], Any] | None = None

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
        # What belief keeps back from the expiry (believed_until): the ttl never changes.
        self.drift = drift_margin(self.ttl)
        # This host's wall clock less the keeper's, once: expires as a time of day.
        self.wall_offset = time.time() - monotonic()
        # When its next renewal is due: each lease at the pace of its own ttl.
        self.due = sent_at + self.ttl / 3  # its interval
        self.renew_ttl: timedelta | None = ttl
        self.lost: LeaseLost | None = None
        self.renewals = 0
        self.pid = _pid
        self.abandoned = False
        # The task or thread running its on_lost, once it was told.
        self.callback: Any = None
        self.link: Any = None

    @property
    def deadline(self) -> float:
        return self.expires - margin(self.ttl)

    @property
    def interval(self) -> float:
        return self.ttl / 3

    @property
    def believed_until(self) -> float:
        """Until when (keeper's clock) a holder may believe it holds: the expiry less the
        clock-rate margin, since our clock may run slower than the server's."""
        return self.expires - self.drift

    def renewed(
        self, sent_at: float, granted: float | None = None, server_time: datetime | None = None
    ) -> None:
        """A renewal sent at ``sent_at`` succeeded; ``granted``: the seconds the server
        gave it from its own now, ``server_time`` (None: the ttl, not known).

        An answer read after the belief had ended revives nothing: the holder may have
        been granted the name again since (another tenure, the same holder), and a
        renewal of that tenure says nothing about this one.
        """
        if monotonic() >= self.believed_until:
            return
        self.expires = max(self.expires, sent_at + (self.ttl if granted is None else granted))
        self.due = sent_at + self.interval
        self.renewals += 1
        if granted is not None and server_time is not None:
            until = server_time + timedelta(seconds=granted)
            if self.server_expires is None or until > self.server_expires:
                self.server_expires = until

    def __repr__(self) -> str:
        state = "lost" if self.lost is not None else "kept"
        return f"<Ticket {self.name!r} holder={self.holder!r} ttl={self.ttl:g}s {state}>"

    def mark_lost(self, reason: str) -> LeaseLost | None:
        """Record the loss; the error the first time, None if it was known already."""
        if self.lost is not None:
            return None
        self.lost = LeaseLost(self.name, reason)
        # The process no longer holds it: a claim of the name in its block is no longer
        # one that would wait for itself (contract 5.6 is about a lease held here).
        _claims.disown(self.names or (self.name,), self.holder)
        return self.lost

    def error(self) -> LeaseLost | None:
        """A fresh LeaseLost if the lease is lost or past its expiry, else None."""
        if self.lost is not None:
            return LeaseLost(self.name, self.lost.reason)
        if self.pid != _pid:
            return LeaseLost(self.name, f"it is held by the parent process (pid {self.pid})")
        # believed_until, without the property's call: every block's exit asks.
        if monotonic() >= self.expires - self.drift:
            return LeaseLost(self.name, "its ttl ran out without a renewal")
        return None


class AsyncTicket(Ticket):
    """A ticket whose loss may also cancel the task running the body (``cancel_on_lost``)."""

    task: asyncio.Task[Any] | None = None
    cancelled_body = False


def inherited(ticket: Ticket) -> bool:
    """True in a forked child for a ticket of its parent's."""
    return ticket.pid != _pid


def abandon(ticket: Ticket) -> None:
    """The lease's Held was collected inside its block: its keeper stops renewing it and
    releases it now (see the keepers' ``abandon``).

    A finalizer: it may run on any thread, in the middle of anything.
    """
    _claims.disown(ticket.names or (ticket.name,), ticket.holder)
    if ticket.keeper is None or inherited(ticket):
        ticket.abandoned = True
        return
    ticket.given_back = threading.Event()  # set by the keeper once it was given back
    ticket.keeper.abandon(ticket)


# The blocks' watches of their Helds, by the weak reference's id: a weak reference calls
# back only while it lives, so it must outlive what it watches (see watch_held).
_watched: dict[int, weakref.ref[Any]] = {}
_exiting = False


def _at_exit() -> None:
    global _exiting
    _exiting = True


atexit.register(_at_exit)


def watch_held(held: object, ticket: Ticket) -> None:
    """Give the tenure back (:func:`abandon`) once ``held`` (a lease's Held, a group's
    member) is collected inside its block, until :func:`unwatch_held`; ``ticket.held``
    refers to it meanwhile.

    Never at exit: a daemon thread may still be inside its block then, and a release
    would let another holder in under it (the expiry frees the lease). A weak
    reference's callback rather than ``weakref.finalize``: every block pays for it.
    """
    ref = weakref.ref(held, functools.partial(_collected, ticket))
    _watched[id(ref)] = ref
    ticket.held = ref


def unwatch_held(ticket: Ticket) -> None:
    """The block has ended: collecting its Held gives nothing back."""
    ref = ticket.held
    if ref is not None:
        _watched.pop(id(ref), None)


def _collected(ticket: Ticket, ref: weakref.ref[Any]) -> None:
    if _watched.pop(id(ref), None) is not None and not _exiting:
        abandon(ticket)


def notify_lost(ticket: Ticket, reason: str) -> LeaseLost | None:
    """Mark ``ticket`` lost and log it; the error if this was news."""
    error = ticket.mark_lost(reason)
    if error is not None:
        _log.lost(ticket.name, ticket.holder, ticket.fence, reason)
    return error
