"""The synchronous Python API: :func:`lease`, :func:`run_exclusive` and :func:`keep_fresh`.

Every operation is one statement that commits on its own; the database decides
every race. While the body runs, the process's keeper (:mod:`pylease.heartbeat`)
renews the lease on a connection of its own. A thread cannot be stopped safely,
so a body that must not outlive its lease calls :meth:`Held.check` between steps,
or passes ``on_lost`` to be told at once.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Generic, NamedTuple, TypeVar

from pylease import _validate
from pylease._backend import Backend
from pylease.errors import DatabaseUnavailable, InvalidArgument, LeaseBusy, LeaseLost
from pylease.heartbeat import LostCallback, Ticket, keeper
from pylease.targets import Link, Listener, ListenerLost, link
from pylease.targets import check as check_target

T = TypeVar("T")

logger = logging.getLogger("pylease")

# Seconds between attempts while waiting, when no notification arrives first.
POLL_LISTENING = 5.0
POLL_NOT_LISTENING = 0.5
# SQLite has no NOTIFY: short sleeps that grow, so a handover is quick but cheap.
SQLITE_FIRST_POLL = 0.005
SQLITE_MAX_POLL = 0.05
JITTER = 0.2


def default_holder() -> str:
    """``host:pid:<128 random bits>``: unique per claim, readable by humans."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(16)}"


class Outcome(NamedTuple, Generic[T]):
    """What :func:`run_exclusive` did: ``ran`` is False when the lease was busy."""

    ran: bool
    result: T | None


class Held:
    """A lease this process holds (or, from :func:`keep_fresh`, keeps fresh).

    :ivar name: the lease's name.
    :ivar holder: the holder token it was claimed with.
    :ivar fence: the fence token: pass it to ``lease_holds()`` in fenced writes.
    """

    def __init__(self, name: str, holder: str, fence: int, ticket: Ticket) -> None:
        self.name = name
        self.holder = holder
        self.fence = fence
        self._ticket = ticket

    @property
    def lost(self) -> bool:
        """True once the lease is known to be no longer ours, or its ttl ran out."""
        return self._ticket.error() is not None

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is no longer ours.

        A local check, no round trip: it reports what the heartbeat learned, and a
        lease whose ttl ran out without a renewal.
        """
        error = self._ticket.error()
        if error is not None:
            raise error

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held"
        return f"<Held {self.name!r} fence={self.fence} holder={self.holder!r} {state}>"


def _seconds_option(parameter: str, value: object) -> float:
    return _validate.span(parameter, value).total_seconds()


def callable_option(parameter: str, value: object) -> None:
    if value is not None and not callable(value):
        raise InvalidArgument(f"pylease: {parameter} must be callable", parameter=parameter)


class Options(NamedTuple):
    """The validated arguments of a lease."""

    name: str
    ttl: timedelta
    holder: str | None
    wait: float
    heartbeat: bool
    min_hold: timedelta | None
    poll_interval: float | None


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
) -> Options:
    """Check every argument before any SQL runs (ValueError subclasses)."""
    name = _validate.key("name", name)
    ttl_ = _validate.ttl(ttl)
    if holder is not None:
        holder = _validate.key("holder", holder)
    wait_ = _seconds_option("wait", wait)
    min_hold_ = None if min_hold is None else _validate.span("min_hold", min_hold)
    poll = None
    if poll_interval is not None:
        poll = _validate.ttl(poll_interval, "poll_interval").total_seconds()
    callable_option("on_lost", on_lost)
    if not isinstance(heartbeat, bool):
        raise InvalidArgument("pylease: heartbeat must be True or False", parameter="heartbeat")
    return Options(name, ttl_, holder, wait_, heartbeat, min_hold_, poll)


def current_holder(rows: list[Any]) -> tuple[str | None, datetime | None]:
    """The holder and expiry of a standing lease from ``status()`` rows."""
    for row in rows:
        if row.held:
            return row.holder, row.expires_at
    return None, None


def next_pause(
    expires_at: datetime | None, poll: float, deadline_in: float, backoff: float
) -> float:
    """How long to sleep before the next attempt: jittered, never past the expiry.

    An expiry sends no notification, so the waiter wakes for it. ``expires_at`` is
    the database's clock and ``datetime.now`` ours: skew only moves this wake-up.
    """
    pause = poll * random.uniform(1 - JITTER, 1 + JITTER)
    if expires_at is not None:
        until = (expires_at - datetime.now(UTC)).total_seconds()
        # Past the expiry by our clock but still busy: skew, or a renewal raced us.
        until = until + random.uniform(0.005, 0.03) if until > 0 else backoff
        pause = min(pause, until)
    return max(min(pause, deadline_in), 0.0)


def acquire(
    link_: Link,
    opts: Options,
    holder: str,
    *,
    want_holder: bool,
    on_busy: Callable[[Any], None] | None = None,
) -> tuple[int, float]:
    """Claim the lease, waiting as allowed: (fence, monotonic time the claim was sent).

    With ``wait``, a busy first attempt starts a LISTEN, then tries again at once (a
    release between the two attempts is not missed), then retries on every
    notification naming this lease, on the poll interval, and at the holder's expiry.
    ``on_busy(row)`` is called after every busy attempt with the ``status()`` row that
    stood in the way (None if it vanished), the last one before LeaseBusy included.
    """
    name, ttl = opts.name, opts.ttl

    def claim(b: Backend) -> int | None:
        return b.claim(name, ttl, holder)

    def status(b: Backend) -> list[Any]:
        return b.status(name)

    start = sent_at = time.monotonic()
    fence = link_.run(claim, name=name, retry=True)
    if fence is not None:
        return fence, sent_at
    if opts.wait <= 0:
        current = None
        if want_holder or on_busy is not None:
            rows = link_.run(status, name=name)
            current = current_holder(rows)[0]
            if on_busy is not None:
                on_busy(rows[0] if rows else None)
        raise LeaseBusy(name, holder=current, waited=0.0)

    deadline = start + opts.wait
    listener: Listener | None = None if link_.sqlite else link_.listen(name)
    backoff = SQLITE_FIRST_POLL if link_.sqlite else 0.01
    try:
        while True:
            sent_at = time.monotonic()
            fence = link_.run(claim, name=name, retry=True)
            if fence is not None:
                return fence, sent_at
            rows = link_.run(status, name=name)
            current, expires_at = current_holder(rows)
            if on_busy is not None:
                on_busy(rows[0] if rows else None)
            now = time.monotonic()
            if now >= deadline:
                raise LeaseBusy(name, holder=current, waited=now - start)
            if link_.sqlite:
                poll = opts.poll_interval or backoff
                backoff = min(backoff * 1.5, SQLITE_MAX_POLL)
            else:
                poll = opts.poll_interval or (
                    POLL_LISTENING if listener is not None else POLL_NOT_LISTENING
                )
                backoff = min(backoff * 2, 1.0)
            pause = next_pause(expires_at, poll, deadline - now, backoff)
            if listener is None:
                time.sleep(pause)
                continue
            try:
                listener.wait(name, pause)
            except ListenerLost:
                listener = None
    finally:
        if listener is not None:
            listener.close()


class Lease:
    """The context manager :func:`lease` returns; single use."""

    def __init__(
        self,
        target: object,
        opts: Options,
        *,
        on_lost: LostCallback | None,
        heartbeat_target: object,
    ) -> None:
        self._target = target
        self._opts = opts
        self._on_lost = on_lost
        self._heartbeat_target = heartbeat_target
        self._link: Link | None = None
        self._held: Held | None = None
        self._ticket: Ticket | None = None
        self.want_holder = True
        self.on_busy: Callable[[Any], None] | None = None  # see acquire()

    def __enter__(self) -> Held:
        if self._link is not None or self._held is not None:
            raise RuntimeError("pylease: a lease() context manager can be entered once")
        opts = self._opts
        self._link = link_ = link(self._target, heartbeat_target=self._heartbeat_target)
        holder = opts.holder or default_holder()
        try:
            fence, sent_at = acquire(
                link_, opts, holder, want_holder=self.want_holder, on_busy=self.on_busy
            )
        except BaseException:
            self._link = None
            link_.close()
            raise
        ticket = Ticket(opts.name, holder, opts.ttl, sent_at=sent_at, on_lost=self._on_lost)
        self._ticket = ticket
        self._held = Held(opts.name, holder, fence, ticket)
        if opts.heartbeat:
            keeper().add(ticket, link_.source)
        return self._held

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        link_, ticket = self._link, self._ticket
        assert link_ is not None and ticket is not None
        self._link = None
        try:
            if self._opts.heartbeat:
                keeper().remove(ticket, link_.source)
            released, trouble = release(link_, ticket, self._opts.min_hold)
        finally:
            link_.close()
        finish(ticket, exc, released, trouble)


def release(
    link_: Link, ticket: Ticket, min_hold: timedelta | None
) -> tuple[bool | None, Exception | None]:
    """Give the lease back: (was it still ours, None if unknown; what went wrong)."""
    name, holder = ticket.name, ticket.holder
    try:
        return link_.run_release(lambda b: b.release(name, holder, min_hold), name=name), None
    except Exception as exc:
        return None, exc


def finish(
    ticket: Ticket,
    exc: BaseException | None,
    released: bool | None,
    trouble: Exception | None,
) -> None:
    """Decide how a lease block ends, once the lease was given back (or not).

    A body's own exception always stands, with any lease trouble as a note; a body
    that returned while the lease was lost raises LeaseLost, since the work ran
    unprotected; an unreachable database at release is only logged, the expiry
    frees the lease.
    """
    lost = ticket.error()
    if lost is None and released is False:
        lost = LeaseLost(
            ticket.name, "the release found it no longer ours (expired and taken, or stolen)"
        )
    if exc is not None:
        if trouble is not None:
            exc.add_note(f"pylease: releasing lease {ticket.name!r} failed too: {trouble}")
        elif lost is not None and not (isinstance(exc, LeaseLost) and exc.name == ticket.name):
            exc.add_note(f"pylease: {lost}")
        return
    if lost is not None:
        raise lost from trouble
    if isinstance(trouble, DatabaseUnavailable):
        logger.warning(
            "pylease: could not release lease %r, it stays held until it expires: %s",
            ticket.name,
            trouble,
        )
        return
    if trouble is not None:
        raise trouble


def lease(
    target: object,
    name: str,
    ttl: timedelta | float,
    *,
    holder: str | None = None,
    wait: timedelta | float = 0,
    heartbeat: bool = True,
    on_lost: LostCallback | None = None,
    min_hold: timedelta | float | None = None,
    heartbeat_target: object = None,
    poll_interval: float | None = None,
) -> Lease:
    """Hold the lease ``name`` while the ``with`` block runs.

    ::

        with lease(conn, "sweep", ttl=timedelta(minutes=5)) as held:
            ...  # held.name, held.holder, held.fence; held.check() between steps

    :param target: a psycopg ``Connection``, a psycopg_pool ``ConnectionPool``, a URL
        (``postgresql://...``, ``sqlite:///path``) or a ``sqlite3.Connection``.
    :param ttl: how long the lease outlives its last renewal (timedelta or seconds).
    :param holder: the holder token; default unique per claim (host, pid, 128 bits).
    :param wait: how long to keep trying when the lease is busy (default: not at all).
    :param heartbeat: renew every ttl/3 while the block runs (default True).
    :param on_lost: called with the :class:`LeaseLost` once the heartbeat learns the
        lease is gone; runs on the keeper thread.
    :param min_hold: on release, keep the name unavailable until claim time + min_hold.
    :param heartbeat_target: for a ``Connection`` target, where renewals run instead
        of a second connection opened like it: a URL, a pool or a dedicated connection.
    :param poll_interval: seconds between retries while waiting when no notification
        comes (default 5 s while LISTENing, 0.5 s without; SQLite polls at 5-50 ms).
    :raises LeaseBusy: the lease is held by another holder (after ``wait``).
    :raises LeaseLost: the block returned, but the lease was lost meanwhile.
    """
    opts = options(
        name,
        ttl,
        holder=holder,
        wait=wait,
        heartbeat=heartbeat,
        on_lost=on_lost,
        min_hold=min_hold,
        poll_interval=poll_interval,
    )
    check_target(target, heartbeat_target)
    return Lease(target, opts, on_lost=on_lost, heartbeat_target=heartbeat_target)


def run_exclusive(
    target: object,
    name: str,
    ttl: timedelta | float,
    work: Callable[[], T],
    *,
    holder: str | None = None,
    wait: timedelta | float = 0,
    heartbeat: bool = True,
    on_lost: LostCallback | None = None,
    min_hold: timedelta | float | None = None,
    heartbeat_target: object = None,
    poll_interval: float | None = None,
) -> Outcome[T]:
    """Run ``work()`` under the lease ``name``, for scheduled sweeps.

    A busy lease is silent: ``Outcome(ran=False, result=None)``. Every other failure
    raises (a missing schema, an unreachable database, the work's own exception, a
    lease lost while the work ran), so a broken deployment never looks like a healthy
    one that is merely losing races. Use :func:`lease` when the work needs the fence.
    """
    if not callable(work):
        raise InvalidArgument("pylease: work must be callable", parameter="work")
    cm = lease(
        target,
        name,
        ttl,
        holder=holder,
        wait=wait,
        heartbeat=heartbeat,
        on_lost=on_lost,
        min_hold=min_hold,
        heartbeat_target=heartbeat_target,
        poll_interval=poll_interval,
    )
    cm.want_holder = False  # a busy lease is silent here: no need to ask who holds it
    try:
        cm.__enter__()
    except LeaseBusy:
        return Outcome(False, None)
    with ExitStack() as stack:
        stack.push(cm)
        result = work()
    return Outcome(True, result)


class KeepFresh:
    """The context manager :func:`keep_fresh` returns; single use."""

    def __init__(
        self,
        target: object,
        name: str,
        holder: str,
        ttl: timedelta | None,
        on_lost: LostCallback | None,
    ) -> None:
        self._target = target
        self._name = name
        self._holder = holder
        self._ttl = ttl
        self._on_lost = on_lost
        self._link: Link | None = None
        self._ticket: Ticket | None = None

    def __enter__(self) -> Held:
        if self._ticket is not None:
            raise RuntimeError("pylease: a keep_fresh() context manager can be entered once")
        name, holder = self._name, self._holder
        self._link = link_ = link(self._target)
        try:
            sent_at = time.monotonic()
            renewed = link_.run(lambda b: b.renew(name, holder, self._ttl), name=name, retry=True)
            rows = link_.run(lambda b: b.status(name), name=name)
            row = next((r for r in rows if r.holder == holder), None)
            if not renewed or row is None:
                raise LeaseLost(name, f"it is not held by {holder!r}")
        except BaseException:
            self._link = None
            link_.close()
            raise
        # The row's own clock gives the ttl now in force: expires_at - renewed_at.
        ttl = self._ttl or (row.expires_at - row.renewed_at)
        self._ticket = ticket = Ticket(name, holder, ttl, sent_at=sent_at, on_lost=self._on_lost)
        keeper().add(ticket, link_.source)
        return Held(name, holder, row.fence, ticket)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        link_, ticket = self._link, self._ticket
        assert link_ is not None and ticket is not None
        self._link = None
        try:
            keeper().remove(ticket, link_.source)
        finally:
            link_.close()
        lost = ticket.error()
        if lost is None:
            return
        if exc is None:
            raise lost
        if not (isinstance(exc, LeaseLost) and exc.name == ticket.name):
            exc.add_note(f"pylease: {lost}")


def keep_fresh(
    target: object,
    name: str,
    holder: str,
    *,
    ttl: timedelta | float | None = None,
    on_lost: LostCallback | None = None,
) -> KeepFresh:
    """Keep somebody else's lease fresh while the ``with`` block runs; never release it.

    For a helper process handed the holder token (e.g. through ``PYLEASE_HOLDER``),
    so the lease outlives an owner that died without cleaning up only as long as
    the helper works. It renews at once (``LeaseLost`` if the lease is not that
    holder's), then every ttl/3 with the process's keeper. Release stays the owner's.

    :param ttl: the ttl each renewal grants; default: the one in force.
    :raises LeaseLost: at entry if the lease is not held by ``holder``; at exit if it
        was lost meanwhile.
    """
    name = _validate.key("name", name)
    holder = _validate.key("holder", holder)
    ttl_ = None if ttl is None else _validate.ttl(ttl)
    callable_option("on_lost", on_lost)
    check_target(target)
    return KeepFresh(target, name, holder, ttl_, on_lost)
