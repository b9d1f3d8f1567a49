"""What the sync and async lease APIs share: the :class:`Held` lease, the
:class:`Outcome` of a run, argument checks, the waiter's pacing, and how a lease
block ends (:func:`finish`).

Shared by :mod:`pylease.leasing` and :mod:`pylease.leasing_async`; nothing here
does I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, NamedTuple, TypeVar

from pylease import _checks, _log
from pylease._acompat import monotonic
from pylease._claims import default_holder as default_holder
from pylease._rows import LeaseEvent, LeaseRow
from pylease._ticket import Ticket
from pylease.errors import DatabaseUnavailable, InvalidArgument, LeaseLost

T = TypeVar("T")

logger = logging.getLogger("pylease")


class Outcome(NamedTuple, Generic[T]):
    """What :func:`~pylease.run_exclusive` did: ``ran`` is False when the lease was busy."""

    ran: bool
    result: T | None


def _read(method: str, name: str, holder: str, fence: int) -> Callable[[Any], Any]:
    """A statement for a link's ``run``: the backend's ``method`` (``holds``, ...)."""
    return lambda b: getattr(b, method)(name, holder, fence)


class Held:
    """A lease this process holds (or, from :func:`~pylease.keep_fresh`, keeps fresh).

    :ivar name: the lease's name.
    :ivar holder: the holder token it was claimed with.
    :ivar fence: the fence token: pass it to ``lease_holds()`` in fenced writes.
    """

    def __init__(self, name: str, holder: str, fence: int, ticket: Ticket) -> None:
        self.name = name
        self.holder = holder
        self.fence = fence
        self._ticket = ticket
        self._generation = ticket.generation

    @property
    def lost(self) -> bool:
        """True once the lease is known to be no longer ours, or its ttl ran out, or
        its block was left (the lease was given back)."""
        return self._ended() or self._ticket.error() is not None

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is no longer ours.

        A local check, no round trip: it reports what the heartbeat learned, a lease
        whose ttl ran out without a renewal, and a block that was left.
        """
        error = self._ticket.error()
        if error is None and self._ended():
            error = LeaseLost(self.name, "its block has ended: the lease was given back")
        if error is not None:
            raise error

    @property
    def expires_at(self) -> datetime:
        """When the lease expires, as the server last granted it: from the answer to its
        latest renewal, on the server's clock; until the first, the claim's ttl from the
        moment the claim was sent, on this host's clock (an earlier time than the
        server's, but for a clock skew between them)."""
        ticket = self._ticket
        if ticket.server_expires is not None:
            return ticket.server_expires
        return datetime.fromtimestamp(ticket.expires + ticket.wall_offset, UTC)

    @property
    def remaining(self) -> float:
        """Seconds left by this host's clock: how long this holder may still believe it
        holds the lease, never more than the server allows; 0 once it is lost."""
        if self.lost:
            return 0.0
        return max(0.0, self._ticket.believed_until - monotonic())

    def owned(self) -> bool:
        """Whether the database still names this holder and fence, unexpired: a round
        trip (``lease_holds()``), where :attr:`lost` and :meth:`check` are local. False,
        without asking, once the lease is known lost or its block has ended.

        :raises DatabaseUnavailable: the database could not be asked.
        """
        if self.lost:
            return False
        link = self._ticket.link
        return all(link.run(check, name=name, retry=True) for name, check in self._holds())

    def _holds(self) -> list[tuple[str, Callable[[Any], Any]]]:
        """The reads that say whether it is still ours: (name, statement) pairs."""
        return [(self.name, _read("holds", self.name, self.holder, self.fence))]

    @property
    def release_requested(self) -> bool:
        """True once a renewal learned that somebody asked this holder to step down
        (``lease_request_release``): within one renewal interval of the request. Local:
        finish the work, and leave the block."""
        return self._ticket.release_requested_by is not None

    @property
    def release_requested_by(self) -> str | None:
        """Who asked this holder to step down (None: nobody, as far as it knows)."""
        return self._ticket.release_requested_by

    def set_data(self, data: object) -> None:
        """Replace the data published with this tenure (``lease_status``'s ``data``): a
        round trip; watchers of the name are told.

        :param data: a JSON value, at most 8,192 characters as JSON text; None: none.
        :raises InvalidArgument: data that is not JSON or too long, or a lease of another
            kind than an exclusive one.
        :raises LeaseLost: the lease is no longer ours.
        """
        link, statement = self._ticket.link, self._set_data(data)
        if not link.run(statement, name=self.name, retry=True):
            raise self._not_ours()

    def _set_data(self, data: object) -> Callable[[Any], Any]:
        if self._ticket.kind != "lease" or self._ticket.names:
            raise InvalidArgument(
                "pylease: data is published by an exclusive lease's holder", parameter="data"
            )
        _checks.data(data)
        self.check()
        fence = self.fence
        return lambda b: b.set_data(self.name, self.holder, data, fence)

    def _not_ours(self) -> LeaseLost:
        return LeaseLost(self.name, "setting its data found it no longer ours")

    def _ended(self) -> bool:
        return self._ticket.ended or self._ticket.generation != self._generation

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held"
        return f"<Held {self.name!r} fence={self.fence} holder={self.holder!r} {state}>"


class AsyncHeld(Held):
    """A lease held through the async API: as :class:`Held`, and :meth:`owned` is awaited."""

    async def owned(self) -> bool:  # type: ignore[override]
        """Whether the database still names this holder and fence, unexpired: a round
        trip (``lease_holds()``); False, without asking, once the lease is known lost.

        :raises DatabaseUnavailable: the database could not be asked.
        """
        if self.lost:
            return False
        link = self._ticket.link
        for name, check in self._holds():
            if not await link.run(check, name=name, retry=True):
                return False
        return True

    async def set_data(self, data: object) -> None:  # type: ignore[override]
        """As :meth:`Held.set_data`, awaited."""
        link, statement = self._ticket.link, self._set_data(data)
        if not await link.run(statement, name=self.name, retry=True):
            raise self._not_ours()


class PermitsHeld(Held):
    """Permits of a semaphore this process holds (contract 5.1).

    :ivar slots: slot -> fence of every slot granted, in slot order: pass a slot's
        fence to ``permit_holds()`` in fenced writes.
    :ivar fence: the first slot's fence.
    """

    def __init__(self, name: str, holder: str, slots: dict[int, int], ticket: Ticket) -> None:
        self.slots = dict(sorted(slots.items()))
        super().__init__(name, holder, next(iter(self.slots.values())), ticket)

    def _holds(self) -> list[tuple[str, Callable[[Any], Any]]]:
        name, holder = self.name, self.holder
        return [(name, _read("permit_holds", name, holder, f)) for f in self.slots.values()]

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held"
        return f"<PermitsHeld {self.name!r} slots={self.slots} holder={self.holder!r} {state}>"


class AsyncPermitsHeld(PermitsHeld, AsyncHeld):
    """Permits held through the async API: :meth:`owned` is awaited."""


class NamesHeld(Held):
    """Several leases this process holds together, claimed all at once (contract 5.3).

    :ivar names: the names, in the order they were asked for; ``name`` is the first.
    :ivar fences: name -> fence of each, in that order: pass one to ``lease_holds()``.
    :ivar fence: the first name's fence.
    """

    def __init__(
        self, names: tuple[str, ...], holder: str, fences: dict[str, int], ticket: Ticket
    ) -> None:
        self.names = names
        self.fences = {name: fences[name] for name in names}
        super().__init__(names[0], holder, self.fences[names[0]], ticket)

    def _holds(self) -> list[tuple[str, Callable[[Any], Any]]]:
        return [(n, _read("holds", n, self.holder, f)) for n, f in self.fences.items()]

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held"
        return f"<NamesHeld fences={self.fences} holder={self.holder!r} {state}>"


class AsyncNamesHeld(NamesHeld, AsyncHeld):
    """Several leases held through the async API: :meth:`owned` is awaited."""


def callable_option(parameter: str, value: object) -> None:
    if value is not None and not callable(value):
        raise InvalidArgument(f"pylease: {parameter} must be callable", parameter=parameter)


def bool_option(parameter: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"pylease: {parameter} must be True or False", parameter=parameter)


class Options(NamedTuple):
    """The validated arguments of a lease."""

    name: str
    ttl: timedelta
    holder: str | None
    wait: float  # seconds; math.inf: no deadline
    heartbeat: bool
    min_hold: timedelta | None
    poll_interval: float | None
    # On an event loop: cancel the task running the body when the lease is lost.
    cancel_on_lost: bool = False
    # A reader's share (contract 5.2) rather than the exclusive lease.
    shared: bool = False
    # The tenure's data, a JSON value (checked; contract 5.4), and what to call when the
    # holder is asked to step down.
    data: object = None
    on_release_requested: Callable[[Any], object] | None = None


def options(
    name: object,
    ttl: object,
    *,
    holder: object,
    wait: object,
    heartbeat: object,
    on_lost: object,
    min_hold: object,
    poll_interval: object,
    shared: object = False,
    data: object = None,
    on_release_requested: object = None,
    cancel_on_lost: object = False,
) -> Options:
    """Check every argument before any SQL runs (ValueError subclasses)."""
    name = _checks.key("name", name)
    ttl_ = _checks.ttl(ttl)
    if holder is not None:
        holder = _checks.key("holder", holder)
    wait_ = _checks.wait(wait)
    min_hold_ = None if min_hold is None else _checks.span("min_hold", min_hold)
    poll = None
    if poll_interval is not None:
        poll = _checks.ttl(poll_interval, "poll_interval").total_seconds()
    # Each check called only when its argument is not the usual one: every block pays.
    if on_lost is not None:
        callable_option("on_lost", on_lost)
    if on_release_requested is not None:
        callable_option("on_release_requested", on_release_requested)
    if heartbeat is not True:
        bool_option("heartbeat", heartbeat)
    if shared is not False:
        bool_option("shared", shared)
    if cancel_on_lost is not True and cancel_on_lost is not False:
        bool_option("cancel_on_lost", cancel_on_lost)
    if data is not None and _checks.data(data) is not None and shared:
        raise InvalidArgument(
            "pylease: data is published by the exclusive holder: a reader has none"
            " (leave data out with shared=True)",
            parameter="data",
        )
    if shared and min_hold_ is not None:
        raise InvalidArgument(
            "pylease: min_hold keeps a name from the next writer: a reader gives its share"
            " back at once (leave min_hold out with shared=True)",
            parameter="min_hold",
        )
    return Options(
        name,
        ttl_,
        holder,
        wait_,
        bool(heartbeat),
        min_hold_,
        poll,
        cancel_on_lost=bool(cancel_on_lost),
        shared=bool(shared),
        data=data,
        on_release_requested=on_release_requested,  # type: ignore[arg-type]
    )


def keep_fresh_options(
    name: object, holder: object, ttl: object, on_lost: object
) -> tuple[str, str, timedelta | None]:
    """The checked arguments of ``keep_fresh``: name, holder, ttl (None: the one in force)."""
    name_ = _checks.key("name", name)
    holder_ = _checks.key("holder", holder)
    ttl_ = None if ttl is None else _checks.ttl(ttl)
    callable_option("on_lost", on_lost)
    return name_, holder_, ttl_


def current_holder(rows: list[Any]) -> tuple[str | None, datetime | None]:
    """The holder and expiry of a standing lease from ``status()`` rows."""
    for row in rows:
        if row.held:
            return row.holder, row.expires_at
    return None, None


def clear_at(rows: list[Any]) -> datetime:
    """When the way is clear, for a claim found busy whose ``status()`` rows show no
    holder: a resting lease's end; otherwise now (the status, read after the claim, saw
    the lease expire or be released meanwhile)."""
    now = datetime.now(UTC)
    return max((row.expires_at for row in rows if row.expires_at is not None), default=now)


def current_data(rows: list[Any]) -> object:
    """What the holder of a standing lease published, from ``status()`` rows."""
    return next((getattr(row, "data", None) for row in rows if row.held), None)


RELEASE_FOUND_LOST = "the release found it no longer ours (expired and taken, or stolen)"


def finish(
    ticket: Ticket,
    exc: BaseException | None,
    released: bool | None,
    trouble: Exception | None,
    cause: str | None = None,
) -> None:
    """Decide how a lease block ends, once the lease was given back (or not).

    A body's own exception always stands, with any lease trouble as a note; a body
    that returned while the lease was lost raises LeaseLost, since the work ran
    unprotected; an unreachable database at release is only logged, the expiry
    frees the lease.
    """
    lost = ticket.error()
    if lost is None and released is False:
        lost = LeaseLost(ticket.name, RELEASE_FOUND_LOST)
    if lost is not None and cause is not None:
        lost = LeaseLost(ticket.name, f"{cause} ({lost.reason})")
    if exc is not None:
        if trouble is not None:
            why = _log.text(trouble)
            exc.add_note(f"pylease: releasing lease {ticket.name!r} failed too: {why}")
        elif lost is not None and not (isinstance(exc, LeaseLost) and exc.name == ticket.name):
            exc.add_note(f"pylease: {lost}")
        return
    if lost is not None:
        raise lost from trouble
    if isinstance(trouble, DatabaseUnavailable):
        _log.release_failed(ticket.name, ticket.holder, ticket.fence, trouble)
        return
    if trouble is not None:
        raise trouble


def describe_loss(ticket: Ticket, row: LeaseRow | None, event: LeaseEvent | None) -> str | None:
    """How the database says a lost lease changed hands, from its status row and its
    newest history event; None when it does not know better than the ticket."""
    if row is None:
        return None
    if ticket.kind == "shared":
        return _share_lost(ticket, row)
    same = row.holder == ticket.holder
    if same and row.fence == ticket.fence:
        if row.held:
            return None
        if row.state == "expired":
            return "its ttl ran out before a renewal reached the database"
        # Released, yet not by this block: by someone else using the same holder.
        return f"it was released by another user of its holder {row.holder!r}"
    how = "claimed"
    if event is not None and event.fence == row.fence and event.holder == row.holder:
        how = {"stolen": "stolen", "taken_over": "taken over after its ttl ran out"}.get(
            event.event, "claimed"
        )
    if same:
        return f"{how} with fence {row.fence} by another user of its holder {row.holder!r}"
    return f"{how} by {row.holder!r} with fence {row.fence}"


def _share_lost(ticket: Ticket, row: LeaseRow) -> str | None:
    """How a reader lost its share: a writer granted since its epoch, or its expiry."""
    if row.fence != ticket.fence:
        by = f" ({row.holder!r})" if row.state == "held" else ""
        return f"a writer was granted it since its epoch, with fence {row.fence}{by}"
    if row.held and row.shared > 0:
        return "its share expired before a renewal reached the database"
    return "its share expired, or was given back by another user of its holder"


def end_keep_fresh(ticket: Ticket, exc: BaseException | None) -> None:
    """How a ``keep_fresh`` block ends: a lease lost meanwhile is raised, or noted on
    the body's own exception."""
    lost = ticket.error()
    if lost is None:
        return
    if exc is None:
        raise lost
    if not (isinstance(exc, LeaseLost) and exc.name == ticket.name):
        exc.add_note(f"pylease: {lost}")
