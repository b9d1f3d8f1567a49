# The source of pylease/leasing.py: tools/async_to_sync.py writes it from this file.
"""The Python API: :func:`alease` and :func:`arun_exclusive` (:func:`akeep_fresh` is in
:mod:`pylease.renewing_async`).

Every operation is one statement that commits on its own; the database decides
every race. While the body runs, the keeper (:mod:`pylease._keeper_async`) renews
the lease on a connection of its own.

Where the two twins differ, on purpose (the
``if True:  # ASYNC`` blocks): on an event loop, when the lease is lost, the task
running the body is cancelled (``cancel_on_lost``) and the block then ends with
:class:`LeaseLost` instead of ``CancelledError``. A thread cannot be stopped safely,
so a sync body that must not outlive its lease calls :meth:`Held.check` between
steps, or passes ``on_lost`` to be told at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from pylease import _caller_tx, _claims
from pylease._acompat import monotonic
from pylease._attempts_async import Attempt, Share, lease_attempt
from pylease._budget import FLOOR, begin, exit_deadline, spare
from pylease._caller_tx import Deferred
from pylease._held import (
    RELEASE_FOUND_LOST,
    AsyncHeld,
    Options,
    finish,
    options,
)
from pylease._held import Held as Held
from pylease._held import Outcome as Outcome
from pylease._held import default_holder as default_holder
from pylease._keeper_async import NOT_OURS, AsyncKeeper, keeper
from pylease._links_async import AsyncLink, link
from pylease._links_async import check as check_target
from pylease._log import text as error_text
from pylease._telling_async import settle, tell_lost
from pylease._tenure_async import loss_cause, release, renew_leases
from pylease._ticket import AsyncTicket, inherited, notify_lost, unwatch_held, watch_held
from pylease._types import AsyncTarget, Duration, Wait
from pylease._waiting_async import Stop, acquire_with
from pylease.errors import InvalidArgument, LeaseBusy, LeaseLost

T = TypeVar("T")

# on_lost: a plain function, or on an event loop a coroutine function too.
AsyncLostCallback = Callable[[LeaseLost], object]


async def _tell_late_loss(ticket: AsyncTicket) -> None:
    """Tell ``on_lost`` of a loss the keeper never told (the body saw the expiry first,
    or only the release found it): every loss reaches it, once, before the block ends."""
    error = ticket.error()
    reason = error.reason if error is not None else RELEASE_FOUND_LOST
    told = notify_lost(ticket, reason)
    if told is not None:
        tell_lost(ticket, told)
        await settle(ticket)


class AsyncLease:
    """The context manager :func:`alease` returns; single use.

    Permits and several names (:mod:`pylease.permits_async`) are blocks of this kind
    too: they change what is claimed and held (the methods ``_names``, ``_attempt``,
    ``_made`` and ``_loss_cause``), and the rest is this: the wait, the keeper, the
    release of the tenure (:func:`pylease._tenure_async.release`, by the ticket's kind).
    """

    # A later block of the name in the caller's transaction may take a deferred lease
    # back; permits, several names and shares are kept for the transaction, never
    # taken back.
    _adoptable = True
    _exclusive = True  # a nested block of the name is refused at once (contract 5.6)

    def __init__(
        self,
        target: object,
        opts: Options,
        *,
        on_lost: AsyncLostCallback | None,
        heartbeat_target: object,
    ) -> None:
        self._target = target
        self._opts = opts
        self._on_lost = on_lost
        self._heartbeat_target = heartbeat_target
        self._link: AsyncLink | None = None
        self._ticket: AsyncTicket | None = None
        self._held: Held | None = None
        self.want_holder = True
        self.on_busy: Callable[[Any], object] | None = None  # see acquire_with()
        self.stop: Stop | None = None  # see acquire_with()
        if True:  # ASYNC
            self._cancelling = 0

    async def acquire(self) -> Held:
        """Enter the block without ``async with``: a lease held across callbacks."""
        return await self.__aenter__()

    async def release(self) -> None:
        """Leave it as the block does (:class:`LeaseLost` if the lease was lost)."""
        await self.__aexit__(None, None, None)

    async def __aenter__(self) -> Held:
        if self._link is not None or self._ticket is not None:
            raise RuntimeError("pylease: an alease() context manager can be entered once")
        opts = self._opts
        keeper_ = keeper()
        # Nothing is kept for a caller's transaction at most entries: asked first.
        if keeper_.deferring() and await self._adopt(keeper_):
            assert self._held is not None
            return self._held
        holder = opts.holder or default_holder()
        names = self._names()
        self._link = link_ = self._make_link()
        try:
            # Before any I/O: one holder names one claim (a second live lease of this name
            # with this holder would share the fence and be released under the first);
            # nested in a block of the name on that database: refused (a reader may be
            # held twice in a process, under two holders).
            exclusive = self._exclusive and not opts.shared
            _claims.enter_all(names, holder, link_.source.key if exclusive else None)
        except BaseException:
            self._link = None
            await link_.close()
            raise
        try:
            grant, sent_at = await acquire_with(
                link_,
                self._attempt(holder),
                opts,
                want_holder=self.want_holder,
                on_busy=self.on_busy,
                stop=self.stop,
            )
        except BaseException:
            self._link = None
            _claims.leave_all(names, holder)
            await link_.close()
            raise
        ticket = AsyncTicket(opts.name, holder, opts.ttl, sent_at=sent_at, on_lost=self._on_lost)
        held = self._made(ticket, grant)
        ticket.on_release_requested = opts.on_release_requested
        if True:  # ASYNC
            if opts.cancel_on_lost:
                ticket.task = asyncio.current_task()
                if ticket.task is not None:
                    self._cancelling = ticket.task.cancelling()
        self._ticket = ticket
        # Once neither this context manager nor the Held is reachable (the Held is
        # reachable from here), nobody can leave the block: the keeper stops renewing
        # and releases at once (issue 10, defect 8; issue 21, item 15).
        ticket.link = link_
        ticket.keeper = keeper_
        self._held = held  # so the Held is collected only once this is too
        watch_held(held, ticket)
        if opts.heartbeat:
            await keeper_.add(ticket, link_.renewals)
        return held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        link_, ticket = self._link, self._ticket
        assert link_ is not None and ticket is not None
        self._link = None
        if inherited(ticket):
            # A forked child holds none of its parent's leases: no I/O on the inherited
            # connections, no release, no lock (one may have been held at the fork),
            # and the child's own exception goes on unchanged.
            return
        # Before the release goes out: once it commits, another may be granted the lease.
        ticket.ended = True
        unwatch_held(ticket)
        self._held = None
        if True:  # ASYNC
            ticket.task = None  # no cancellation from here on
            outside_cancel = False
        # From here on, every step draws on one budget (contract section 2: the block
        # ends within 10 s of its body, whatever each step meets).
        budget = begin()
        try:
            if await self._defer(link_, ticket, exc):
                return  # released later; the body's exception, if any, goes on as it is
            try:
                if self._opts.heartbeat:
                    await ticket.keeper.remove(ticket, link_.renewals)
                    if ticket.callback is not None:
                        await settle(ticket)
                if True:  # ASYNC
                    if ticket.cancelled_body:
                        exc, outside_cancel = await self._absorb_our_cancel(ticket, exc)
                released, trouble = await release(link_, ticket, self._opts.min_hold)
                lost = released is False or ticket.error() is not None
                cause = await self._after_loss(link_, ticket, trouble) if lost else None
            finally:
                _claims.leave_all(ticket.names or (ticket.name,), ticket.holder)
                await link_.close()
        finally:
            exit_deadline.reset(budget)
        if True:  # ASYNC
            if outside_cancel and exc is None:
                raise asyncio.CancelledError
            if ticket.cancelled_body and isinstance(exc, asyncio.CancelledError):
                # The body was cancelled because the lease was lost: that loss is the story.
                error = ticket.error() or LeaseLost(ticket.name, "its body was cancelled")
                if cause is not None:
                    error = LeaseLost(ticket.name, f"{cause} ({error.reason})")
                if trouble is not None:
                    error.add_note(
                        f"pylease: releasing lease {ticket.name!r} failed too: "
                        + error_text(trouble)
                    )
                raise error from exc
        finish(ticket, exc, released, trouble, cause)

    async def _after_loss(
        self, link_: AsyncLink, ticket: AsyncTicket, trouble: Exception | None
    ) -> str | None:
        """What the database says of a loss (None: nothing better than the ticket),
        once ``on_lost`` has been told of it."""
        cause = None
        if trouble is None and spare(FLOOR):
            cause = await self._loss_cause(link_, ticket)
        await _tell_late_loss(ticket)
        return cause

    def _make_link(self) -> AsyncLink:
        """This block's way to its database."""
        return link(self._target, heartbeat_target=self._heartbeat_target)

    def _names(self) -> tuple[str, ...]:
        """The names this block claims, for the claims of this process."""
        return (self._opts.name,)

    def _attempt(self, holder: str) -> Attempt[Any]:
        """What this block's claim tries, as the wait engine runs it."""
        return lease_attempt(self._opts, holder)

    def _made(self, ticket: AsyncTicket, grant: Any) -> Held:
        """The Held of a grant (a reader's: its epoch as the fence), and what its ticket
        keeps (a reader's: its share's id as the slot, which its renewals and its
        release name)."""
        if isinstance(grant, Share):
            ticket.kind = "shared"
            ticket.slot = grant.share
            grant = grant.epoch
        ticket.fence = grant
        return AsyncHeld(self._opts.name, ticket.holder, grant, ticket)

    def _owner(self) -> object:
        """The caller's transaction that may take a deferred lease of this block back."""
        adoptable = self._adoptable and not self._opts.shared
        return _caller_tx.owner(self._target) if adoptable else None

    async def _loss_cause(self, link_: AsyncLink, ticket: AsyncTicket) -> str | None:
        return await loss_cause(link_, ticket)

    async def _defer(self, link_: AsyncLink, ticket: AsyncTicket, exc: object) -> bool:
        """If the block ends inside the caller's open transaction, keep the lease
        (renewed) until that transaction ends, and only then release it (issue 21,
        item 3): True. False when there is none, or the lease turns out lost: the
        block then ends as any block does.
        """
        watch = _caller_tx.watch(self._target)
        if watch is None or ticket.error() is not None:
            return False
        if exc is None and not link_.sqlite:
            # The verdict a release would give, while the caller can still roll back:
            # one renewal, on pylease's own connection. (On SQLite the caller's open
            # transaction may hold the one write lock: its local belief answers.)
            sent_at = monotonic()
            try:
                rows = await renew_leases(link_.renewals, [ticket], name=ticket.name)
            except Exception:
                rows = None  # not known: the keeper goes on, and tells a loss loudly
            if rows is not None:
                if not rows[0][1]:
                    notify_lost(ticket, NOT_OURS)
                    return False
                ticket.renewed(sent_at, rows[0][2], rows[0][3])
        min_hold, owner = self._opts.min_hold, self._owner()
        await keeper().defer(Deferred(ticket, link_.renewals, watch, min_hold, link_, owner=owner))
        return True

    async def _adopt(self, keeper_: AsyncKeeper) -> bool:
        """Continue the tenure of an earlier block of this name that ended in the
        caller's transaction still open (or just ended) on the same connection: held
        since, it could not be granted again before that transaction ends."""
        owner = self._owner()
        if owner is None:
            return False
        entry = await keeper_.adopt(self._opts.name, self._opts.holder, owner)
        if entry is None:
            return False
        self._link = entry.link
        self._ticket = ticket = entry.ticket
        fence = ticket.fence
        assert fence is not None
        ticket.ended = False
        ticket.on_lost = self._on_lost
        if True:  # ASYNC
            if self._opts.cancel_on_lost:
                ticket.task = asyncio.current_task()
                if ticket.task is not None:
                    self._cancelling = ticket.task.cancelling()
        ticket.generation += 1  # the earlier block's Held stays ended
        self._held = held = AsyncHeld(ticket.name, ticket.holder, fence, ticket)
        ticket.on_release_requested = self._opts.on_release_requested
        watch_held(held, ticket)
        return True

    if True:  # ASYNC

        async def _absorb_our_cancel(
            self, ticket: AsyncTicket, exc: BaseException | None
        ) -> tuple[BaseException | None, bool]:
            """Take back the cancellation this lease requested, leaving any other one be.

            Returns the block's exception and whether somebody else cancelled the task too.
            """
            if not ticket.cancelled_body:
                return exc, False
            task = asyncio.current_task()
            assert task is not None
            if not isinstance(exc, asyncio.CancelledError):
                # The body swallowed the cancellation, or it is still pending: if so, it
                # lands here rather than in the release.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
            if task.uncancel() > self._cancelling:
                ticket.cancelled_body = False
                return exc, True
            return exc, False


def block_options(
    target: object,
    heartbeat_target: object,
    name: object,
    ttl: object,
    *,
    cancel_on_lost: object = False,
    **rest: Any,
) -> Options:
    """Every argument of a lease block (a lease's, permits', several names'), checked
    before any I/O: ``ValueError`` subclasses."""
    opts = options(name, ttl, cancel_on_lost=cancel_on_lost, **rest)
    check_target(target, heartbeat_target)
    return opts


if True:  # ASYNC

    def alease(
        target: AsyncTarget,
        name: str,
        ttl: Duration,
        *,
        holder: str | None = None,
        wait: Wait = 0,
        heartbeat: bool = True,
        on_lost: AsyncLostCallback | None = None,
        min_hold: Duration | None = None,
        heartbeat_target: AsyncTarget | None = None,
        poll_interval: Duration | None = None,
        cancel_on_lost: bool = True,
        shared: bool = False,
        data: object = None,
        on_release_requested: Callable[[AsyncHeld], object] | None = None,
    ) -> AsyncLease:
        """Hold the lease ``name`` while the ``async with`` block runs.

        ::

            async with alease(aconn, "sweep", ttl=300) as held:
                ...

        The arguments are those of :func:`pylease.lease`, with async targets (a psycopg
        ``AsyncConnection``, an ``AsyncConnectionPool``, a URL, a ``sqlite3.Connection``).
        ``on_lost`` may be a plain function or a coroutine function.

        :param cancel_on_lost: when the lease is lost, cancel the task running the block
            (default True); the block then raises :class:`LeaseLost`.
        :param shared: hold a reader's share, as :func:`pylease.lease`.
        :param data: published with the grant, as :func:`pylease.lease`.
        :param on_release_requested: as :func:`pylease.lease`; a plain function or a
            coroutine function.
        :raises LeaseBusy: the lease is held by another holder (after ``wait``).
        :raises LeaseLost: the lease was lost while the block ran.
        """
        # What block_options does, without its keyword dictionaries: every block pays.
        opts = options(
            name,
            ttl,
            holder=holder,
            wait=wait,
            heartbeat=heartbeat,
            on_lost=on_lost,
            min_hold=min_hold,
            poll_interval=poll_interval,
            cancel_on_lost=cancel_on_lost,
            shared=shared,
            data=data,
            on_release_requested=on_release_requested,
        )
        check_target(target, heartbeat_target)
        return AsyncLease(target, opts, on_lost=on_lost, heartbeat_target=heartbeat_target)

    async def arun_exclusive(
        target: AsyncTarget,
        name: str,
        ttl: Duration,
        work: Callable[[], Awaitable[T]],
        *,
        holder: str | None = None,
        wait: Wait = 0,
        heartbeat: bool = True,
        on_lost: AsyncLostCallback | None = None,
        min_hold: Duration | None = None,
        heartbeat_target: AsyncTarget | None = None,
        poll_interval: Duration | None = None,
        cancel_on_lost: bool = True,
    ) -> Outcome[T]:
        """Await ``work()`` under the lease ``name``: the twin of :func:`pylease.run_exclusive`.

        A busy lease is silent (``Outcome(False, None)``); every other failure raises.
        """
        if not callable(work):
            raise InvalidArgument("pylease: work must be callable", parameter="work")
        cm = alease(
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
            cancel_on_lost=cancel_on_lost,
        )
        return await run_in(cm, work)

else:

    def alease(
        target: AsyncTarget,
        name: str,
        ttl: Duration,
        *,
        holder: str | None = None,
        wait: Wait = 0,
        heartbeat: bool = True,
        on_lost: AsyncLostCallback | None = None,
        min_hold: Duration | None = None,
        heartbeat_target: AsyncTarget | None = None,
        poll_interval: Duration | None = None,
        shared: bool = False,
        data: object = None,
        on_release_requested: Callable[[AsyncHeld], object] | None = None,
    ) -> AsyncLease:
        """Hold the lease ``name`` while the ``with`` block runs.

        ::

            with lease(conn, "sweep", ttl=timedelta(minutes=5)) as held:
                ...  # held.name, held.holder, held.fence; held.check() between steps

        :param target: a psycopg ``Connection``, a psycopg_pool ``ConnectionPool``, a URL
            (``postgresql://...``, ``sqlite:///path``) or a ``sqlite3.Connection``.
        :param ttl: how long the lease outlives its last renewal: a timedelta, seconds, or
            a duration string (``"5m"``, ``"1h30m"``, ``"250ms"``).
        :param holder: the holder token; default unique per claim (host, pid, 128 bits).
        :param wait: how long to keep trying when the lease is busy (default: not at all);
            :data:`pylease.FOREVER` (``math.inf``, ``"forever"``): without a deadline.
        :param heartbeat: renew every ttl/3 while the block runs (default True).
        :param on_lost: called with the :class:`LeaseLost` once the heartbeat learns the
            lease is gone; runs on the keeper thread.
        :param min_hold: on release, keep the name unavailable until claim time + min_hold.
        :param heartbeat_target: for a ``Connection`` target, where renewals run instead
            of a second connection opened like it: a URL, a pool or a dedicated connection.
        :param poll_interval: seconds between retries while waiting when no notification
            comes (default 5 s while LISTENing, 0.5 s without; SQLite polls at 5-50 ms).
        :param shared: hold a reader's share: readers hold the name together, a writer
            (``shared=False``) alone; ``held.fence`` is then the epoch, the fence of the
            name's latest exclusive grant (contract 5.2).
        :param data: a JSON value published with the grant (where a leader listens, its
            version): ``lease_status``'s ``data``, ``LeaseBusy.data`` for a claimer that
            finds it held; at most 8,192 characters as JSON text. ``held.set_data``
            replaces it; the next tenure starts without it.
        :param on_release_requested: called with the Held once a renewal learns that
            somebody asked this holder to step down (``pylease request-release``), on a
            thread of its own; ``held.release_requested`` turns true then too.
        :raises LeaseBusy: the lease is held by another holder (after ``wait``).
        :raises LeaseLost: the block returned, but the lease was lost meanwhile.
        """
        # What block_options does, without its keyword dictionaries: every block pays.
        opts = options(
            name,
            ttl,
            holder=holder,
            wait=wait,
            heartbeat=heartbeat,
            on_lost=on_lost,
            min_hold=min_hold,
            poll_interval=poll_interval,
            shared=shared,
            data=data,
            on_release_requested=on_release_requested,
        )
        check_target(target, heartbeat_target)
        return AsyncLease(target, opts, on_lost=on_lost, heartbeat_target=heartbeat_target)

    async def arun_exclusive(
        target: AsyncTarget,
        name: str,
        ttl: Duration,
        work: Callable[[], Awaitable[T]],
        *,
        holder: str | None = None,
        wait: Wait = 0,
        heartbeat: bool = True,
        on_lost: AsyncLostCallback | None = None,
        min_hold: Duration | None = None,
        heartbeat_target: AsyncTarget | None = None,
        poll_interval: Duration | None = None,
    ) -> Outcome[T]:
        """Run ``work()`` under the lease ``name``, for scheduled sweeps.

        A busy lease is silent: ``Outcome(ran=False, result=None)``. Every other failure
        raises (a missing schema, an unreachable database, the work's own exception, a
        lease lost while the work ran), so a broken deployment never looks like a healthy
        one that is merely losing races. Use :func:`lease` when the work needs the fence.
        """
        if not callable(work):
            raise InvalidArgument("pylease: work must be callable", parameter="work")
        cm = alease(
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
        return await run_in(cm, work)


async def run_in(cm: AsyncLease, work: Callable[[], Awaitable[T]]) -> Outcome[T]:
    """Run ``work()`` inside the block ``cm`` (a lease's, permits', several names');
    a busy claim is ``Outcome(False, None)``."""
    cm.want_holder = False  # a busy lease is silent here: no need to ask who holds it
    try:
        await cm.__aenter__()
    except LeaseBusy:
        return Outcome(False, None)
    try:
        result = await work()
    except BaseException as exc:
        await cm.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    await cm.__aexit__(None, None, None)
    return Outcome(True, result)
