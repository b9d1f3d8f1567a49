"""Leader election on a lease row: :func:`aleader`, :func:`arun_as_leader`, who leads now.

A leader is the holder of one lease; its term is the :class:`~pylease.Held` of that
lease, the term number its fence. Nothing here is a second lease machine: a term is an
:func:`~pylease.alease` (claimed, kept fresh by the process's keeper, released), and a
standby is a waiter of the wait engine (:mod:`pylease._waiting_async`), woken by the
release through the process's hub and at the holder's expiry, one statement an attempt.

How a change of leader is seen (``awatch_leader``; ``on_new_leader`` also after each
busy attempt of a candidate, from the row that stood in the way): a release
sends ``NOTIFY pylease`` (the SQL API does that already), so a resignation wakes
every watcher at once; a new grant sends nothing, so that a claim stays one cheap
statement. A watcher therefore reads the row (one ``lease_status`` call) when
notified, at the leader's expiry, every ``poll_interval`` (a steal), and, after it saw
nobody lead, again and again at 10 ms, 20 ms, 40 ms, ... (a standby usually takes over
within milliseconds of a release). ``docs/leader-election.md`` has the numbers.

Where the two twins differ (the ``if True:  # ASYNC`` blocks): on an event loop the
work runs in a task that the stop cancels; in a thread a signal interrupts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import TracebackType
from typing import Any

from pylease import _checks
from pylease._acompat import AEvent, ALock, aspawn, monotonic
from pylease._held import Held, callable_option, default_holder
from pylease._links_async import check as check_target
from pylease._links_async import link
from pylease._rows import LeaseRow
from pylease._standby_async import (
    AsyncObserver,
    AsyncStop,
    AsyncWatch,
    Callback,
    Shutdown,
    call,
    leading,
    poll_seconds,
    same_leader,
    wait_seconds,
)
from pylease._types import AsyncTarget, Duration, Wait
from pylease._waiting_async import WaitStopped
from pylease.errors import InvalidArgument, LeaseLost
from pylease.leasing_async import AsyncLease, alease

if True:  # ASYNC
    pass
else:
    import threading

logger = logging.getLogger("pylease")


class Campaign:
    """The validated arguments of one candidate."""

    def __init__(
        self,
        target: AsyncTarget,
        name: str,
        ttl: object,
        *,
        holder: str | None,
        wait: object,
        on_lost: Callback | None,
        heartbeat_target: AsyncTarget | None,
        poll_interval: object,
        cancel_on_lost: bool,
        data: object = None,
        on_release_requested: Callback | None = None,
    ) -> None:
        self.target = target
        self.name = _checks.key("name", name)
        self.ttl = _checks.ttl(ttl)
        self.holder = None if holder is None else _checks.key("holder", holder)
        self.wait = wait_seconds(wait)
        self.poll_interval = poll_seconds(poll_interval)
        callable_option("on_lost", on_lost)
        self.on_lost = on_lost
        self.heartbeat_target = heartbeat_target
        if not isinstance(cancel_on_lost, bool):
            raise InvalidArgument(
                "pylease: cancel_on_lost must be True or False", parameter="cancel_on_lost"
            )
        self.cancel_on_lost = cancel_on_lost
        _checks.data(data)
        callable_option("on_release_requested", on_release_requested)
        self.data, self.on_release_requested = data, on_release_requested
        check_target(target, heartbeat_target)

    def term(self) -> AsyncLease:
        """A term's lease, which waits for the name through the wait engine."""
        wait = self.wait
        if True:  # ASYNC
            cm = alease(
                self.target,
                self.name,
                self.ttl,
                holder=self.holder or default_holder(),
                wait=wait,
                on_lost=self.on_lost,
                heartbeat_target=self.heartbeat_target,
                poll_interval=self.poll_interval,
                cancel_on_lost=self.cancel_on_lost,
                data=self.data,
                on_release_requested=self.on_release_requested,
            )
        else:
            cm = alease(
                self.target,
                self.name,
                self.ttl,
                holder=self.holder or default_holder(),
                wait=wait,
                on_lost=self.on_lost,
                heartbeat_target=self.heartbeat_target,
                poll_interval=self.poll_interval,
                data=self.data,
                on_release_requested=self.on_release_requested,
            )
        return cm

    async def run(
        self,
        stop: AsyncStop,
        observer: AsyncObserver | None = None,
        watch: AsyncWatch | None = None,
    ) -> tuple[AsyncLease, Held] | None:
        """Campaign until elected (the term's lease, entered), or None once ``stop`` is set.

        A candidate is a waiter of the wait engine like any other (one statement per
        attempt, woken by the hub); once elected, the observer is told every change of
        leader it has not told yet, this term last (without a watch: shown the row that
        stood in the way after each busy attempt).

        :raises LeaseBusy: ``wait`` ran out before this candidate was elected.
        """
        if stop.is_set():
            return None
        cm = self.term()
        cm.stop = stop
        if observer is not None and watch is None:
            # Without a watch of its own (pylease leader's spinner), the observer is shown
            # the row that stood in the way after each busy attempt.

            async def seen(row: LeaseRow | None) -> None:
                await observer.see(None if row is None else leading([row]))

            cm.on_busy = seen
        try:
            won = cm, await cm.__aenter__()
        except WaitStopped:
            return None
        if observer is not None and watch is not None:
            await _announce(won, observer, watch)
        return won


async def _announce(
    won: tuple[AsyncLease, Held], observer: AsyncObserver, watch: AsyncWatch
) -> None:
    """Tell the observer every change up to this new term's; resign it if that fails (a
    callback raised). From here until the term ends the observer is quiet: a leader
    knows it leads, and what happens meanwhile is told once it stopped leading."""
    cm = won[0]
    try:
        await observer.catch_up(watch, whole=True)
        observer.paused = True
    except BaseException as exc:
        await cm.__aexit__(type(exc), exc, exc.__traceback__)
        raise


class AsyncLeader:
    """The context manager :func:`aleader` returns; single use."""

    def __init__(self, campaign: Campaign) -> None:
        self._campaign = campaign
        self._cm: AsyncLease | None = None
        self._used = False

    async def __aenter__(self) -> Held:
        if self._used:
            raise RuntimeError("pylease: aleader() gives a context manager to enter once")
        self._used = True
        won = await self._campaign.run(AsyncStop(None))
        assert won is not None  # only a stop ends a campaign without a term
        self._cm, term = won
        return term

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cm, self._cm = self._cm, None
        assert cm is not None
        await cm.__aexit__(exc_type, exc, tb)


if True:  # ASYNC

    def aleader(
        target: AsyncTarget,
        name: str,
        ttl: Duration,
        *,
        holder: str | None = None,
        wait: Wait | None = None,
        on_lost: Callback | None = None,
        heartbeat_target: AsyncTarget | None = None,
        poll_interval: Duration | None = None,
        cancel_on_lost: bool = True,
        data: object = None,
        on_release_requested: Callback | None = None,
    ) -> AsyncLeader:
        """Lead while the ``async with`` block runs: wait until elected, resign on leaving.

        ::

            async with aleader(target, "scheduler", ttl=15) as term:
                ...  # term.fence is the term number; term.lost, term.check()

        :param target: as for :func:`pylease.alease`.
        :param ttl: how long a leader that stopped renewing stays leader.
        :param holder: this candidate's holder token; default unique per term.
        :param wait: how long to campaign; default (None, ``math.inf``, ``"forever"``): no
            deadline.
        :param on_lost: called with the :class:`LeaseLost` when the term is lost.
        :param poll_interval: seconds between reads of the row when no notification comes
            (default 1 s; SQLite 50 ms).
        :param data: a JSON value published with the term (where the leader listens, its
            version): ``current_leader(...).data``, ``LeaseBusy.data``.
        :param on_release_requested: called with the term once a renewal learns that
            somebody asked this leader to step down (``term.release_requested`` turns
            true then too); leaving the block resigns.
        :param cancel_on_lost: cancel the block's task when the term is lost (default True).
        :raises LeaseBusy: ``wait`` ran out before this candidate was elected.
        :raises LeaseLost: the term was lost while the block ran.
        """
        return AsyncLeader(
            Campaign(
                target,
                name,
                ttl,
                holder=holder,
                wait=wait,
                on_lost=on_lost,
                heartbeat_target=heartbeat_target,
                poll_interval=poll_interval,
                cancel_on_lost=cancel_on_lost,
                data=data,
                on_release_requested=on_release_requested,
            )
        )

else:

    def aleader(
        target: AsyncTarget,
        name: str,
        ttl: Duration,
        *,
        holder: str | None = None,
        wait: Wait | None = None,
        on_lost: Callback | None = None,
        heartbeat_target: AsyncTarget | None = None,
        poll_interval: Duration | None = None,
        data: object = None,
        on_release_requested: Callback | None = None,
    ) -> AsyncLeader:
        """Lead while the ``async with`` block runs: wait until elected, resign on leaving.

        ::

            async with aleader(target, "scheduler", ttl=15) as term:
                ...  # term.fence is the term number; term.lost, term.check()

        :param target: as for :func:`pylease.alease`.
        :param ttl: how long a leader that stopped renewing stays leader.
        :param holder: this candidate's holder token; default unique per term.
        :param wait: how long to campaign; default (None, ``math.inf``, ``"forever"``): no
            deadline.
        :param on_lost: called with the :class:`LeaseLost` when the term is lost.
        :param poll_interval: seconds between reads of the row when no notification comes
            (default 1 s; SQLite 50 ms).
        :param data: a JSON value published with the term (where the leader listens, its
            version): ``current_leader(...).data``, ``LeaseBusy.data``.
        :param on_release_requested: called with the term once a renewal learns that
            somebody asked this leader to step down (``term.release_requested`` turns
            true then too); leaving the block resigns.
        :raises LeaseBusy: ``wait`` ran out before this candidate was elected.
        :raises LeaseLost: the block returned, but the term was lost meanwhile (a body that
            must not outlive its term checks ``term.lost`` or calls ``term.check()``).
        """
        return AsyncLeader(
            Campaign(
                target,
                name,
                ttl,
                holder=holder,
                wait=wait,
                on_lost=on_lost,
                heartbeat_target=heartbeat_target,
                poll_interval=poll_interval,
                cancel_on_lost=True,
                data=data,
                on_release_requested=on_release_requested,
            )
        )


async def arun_as_leader(
    target: AsyncTarget,
    name: str,
    ttl: Duration,
    work: Callable[[Held], Awaitable[object]],
    *,
    on_started_leading: Callback | None = None,
    on_stopped_leading: Callback | None = None,
    on_new_leader: Callback | None = None,
    stop: AEvent | None = None,
    holder: str | None = None,
    heartbeat_target: AsyncTarget | None = None,
    poll_interval: Duration | None = None,
    data: object = None,
) -> None:
    """Campaign, lead by running ``work(term)``, and campaign again, until ``stop`` is set.

    A term ends when ``work`` returns (this candidate resigns and campaigns again, so the
    next term has a larger fence), when it is lost, or when ``stop`` is set or SIGTERM or
    SIGINT arrives (the term is resigned, then the signal acts as it would have: the
    handlers, installed in the main thread, are put back first). A coroutine ``work`` is
    cancelled by a lost term, a stop or a signal; a plain one is interrupted by a signal
    (raised into it, as Ctrl-C is) and otherwise checks ``term.lost`` and returns.

    A leader asked to step down (``lease_request_release``, ``pylease request-release``)
    learns it from its next renewal: ``term.release_requested`` turns true, for ``work``
    to finish and return. The term then ends as any that returns, except that this
    candidate campaigns again only behind the candidates already waiting: a standby takes
    over first, and with none, this one leads again, with a new fence.

    The callbacks come in this order:
    ``on_new_leader(info)`` for every change of leader (``info`` is the ``LeaseRow``, or
    None when nobody leads; on PostgreSQL every change, in order, as
    :func:`awatch_leader` sees them), then ``on_started_leading(term)`` when the change
    is this candidate's term, ``on_stopped_leading(term)`` after its resignation or loss.
    While a term lasts ``on_new_leader`` is quiet; what changed meanwhile (a steal) is
    told after ``on_stopped_leading``.

    :param data: a JSON value published with every term, as for :func:`aleader`.

    :raises Exception: whatever ``work`` raised, after resigning and
        ``on_stopped_leading``: a crashing leader is never silently re-elected.
    """
    if not callable(work):
        raise InvalidArgument("pylease: work must be callable", parameter="work")
    for parameter, value in (
        ("on_started_leading", on_started_leading),
        ("on_stopped_leading", on_stopped_leading),
        ("on_new_leader", on_new_leader),
    ):
        callable_option(parameter, value)
    campaign = Campaign(
        target,
        name,
        ttl,
        holder=holder,
        wait=None,
        on_lost=None,
        heartbeat_target=heartbeat_target,
        poll_interval=poll_interval,
        cancel_on_lost=True,
        data=data,
    )
    stopping = AsyncStop(stop)
    observer = None if on_new_leader is None else AsyncObserver(on_new_leader)
    stopping.install()
    try:
        watch = AsyncWatch(target, campaign.name, campaign.poll_interval, track=True)
        watching = None if observer is None else await _start_watching(watch, observer)
        try:
            while not stopping.is_set():
                won = await campaign.run(stopping, observer, watch)
                if won is None:
                    break
                cm, term = won
                await _lead(cm, term, work, on_started_leading, on_stopped_leading, stopping)
                if observer is not None:
                    observer.paused = False
                    await observer.catch_up(watch)
                if term.release_requested and not stopping.is_set():
                    await _stand_back(watch, observer, term, stopping)
        finally:
            if watching is not None:
                await watching.stop()
            await watch.close()
    except Shutdown:
        pass
    finally:
        stopping.restore()


# How long a leader that stepped down lets the candidates already waiting take over
# before it campaigns again: one of them is woken by the release at once.
STAND_BACK = 1.0


async def _stand_back(
    watch: AsyncWatch, observer: AsyncObserver | None, term: Held, stopping: AsyncStop
) -> None:
    """After a term that was asked to step down: wait until another term starts, or until
    STAND_BACK has passed with none (then no candidate was waiting)."""
    deadline = monotonic() + STAND_BACK
    while monotonic() < deadline and not stopping.is_set():
        if True:  # ASYNC
            lock = observer.lock if observer is not None else ALock()
            async with lock:
                row = await watch.read()
        else:
            lock = observer.lock if observer is not None else threading.Lock()
            with lock:
                row = watch.read()
        if row is not None and row.fence > term.fence:
            return
        await stopping.wait(min(0.02, max(deadline - monotonic(), 0.0)), watch.watcher)


class _Watching:
    """The task (thread) that tells ``on_new_leader`` of changes while no term lasts here."""

    def __init__(self, watch: AsyncWatch, observer: AsyncObserver) -> None:
        self.watch, self.observer = watch, observer
        self.done = AsyncStop(AEvent())
        self.worker: Any = None

    async def run(self) -> None:
        watch, observer = self.watch, self.observer
        while not self.done.is_set():
            try:
                await observer.catch_up(watch, unless_paused=True)
                await watch.pause(watch.last, self.done, math.inf)
            except Exception:
                # A failing callback or read must not end the watching: it is told, and
                # the next change is told as it comes.
                logger.exception("on_new_leader for %r failed", watch.name)
                await self.done.wait(watch.poll, None)

    async def stop(self) -> None:
        assert self.done.event is not None
        self.done.event.set()
        if True:  # ASYNC
            await asyncio.wait([self.worker])
        else:
            self.worker.join()


async def _start_watching(watch: AsyncWatch, observer: AsyncObserver) -> _Watching:
    """Listen for the name's changes, tell the current leader, and keep telling."""
    await watch.listen()
    await observer.catch_up(watch)
    watching = _Watching(watch, observer)
    watching.worker = aspawn(watching.run, name="pylease-watch-leader")
    return watching


async def _lead(
    cm: AsyncLease,
    term: Held,
    work: Callable[[Held], Awaitable[object]],
    on_started_leading: Callback | None,
    on_stopped_leading: Callback | None,
    stopping: AsyncStop,
) -> None:
    """One term: run ``work`` under it, resign, and tell; LeaseLost of this term is quiet."""
    try:
        try:
            await call(on_started_leading, term)
            await _work_until_stopped(work, term, stopping)
        except BaseException as exc:
            await cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await cm.__aexit__(None, None, None)
    except LeaseLost as exc:
        await call(on_stopped_leading, term)
        if exc.name != term.name or not term.lost:
            raise  # some other lease of the work's own: its failure, not our term's
        return
    except Shutdown:
        await call(on_stopped_leading, term)
        return
    except BaseException:
        await call(on_stopped_leading, term)
        raise
    await call(on_stopped_leading, term)


async def _work_until_stopped(
    work: Callable[[Held], Awaitable[object]], term: Held, stopping: AsyncStop
) -> None:
    """Run ``work(term)`` until it returns, or until the stop comes first.

    On an event loop the work runs in a task of its own, cancelled by the stop; the
    term's own loss cancels the task running this (the lease's rule), and with it the
    work's. In a thread, SIGTERM or SIGINT interrupts it (:class:`Shutdown`).
    """
    if True:  # ASYNC
        task = asyncio.ensure_future(work(term))
        stopper = asyncio.ensure_future(stopping.wait(math.inf, None))
        try:
            await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopper
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([task])
        if task.cancelled():
            raise Shutdown(stopping.signum or signal.SIGTERM)
        task.result()
    else:
        stopping.interruptible = True
        try:
            if stopping.is_set():
                raise Shutdown(stopping.signum or signal.SIGTERM)
            work(term)
        finally:
            stopping.interruptible = False


async def acurrent_leader(target: AsyncTarget, name: str) -> LeaseRow | None:
    """The current leader's row (holder, fence, acquired_at, expires_at, ...), or None.

    One read of ``lease_status``; None unless the lease's state is ``held``.
    """
    name = _checks.key("name", name)
    check_target(target)
    link_ = link(target)
    try:
        rows = await link_.run(lambda b: b.status(name), name=name, retry=True)
    finally:
        await link_.close()
    return leading(rows)


async def awatch_leader(
    target: AsyncTarget, name: str, *, poll_interval: Duration | None = None
) -> AsyncGenerator[LeaseRow | None, None]:
    """Yield the current leader (or None), then again on every change of leader.

    On PostgreSQL every change (a grant, a steal, a takeover after a crash, a
    resignation) is yielded, in order, none skipped, within moments of its commit: the
    name is watched (``lease_watch``), so each change sends a notification to the
    process's listener. A leader's expiry without a release sends nothing: the row is
    read at the expiry it shows, and every ``poll_interval`` (default 1 s; SQLite 50 ms).
    Where LISTEN cannot work (SQLite, PgBouncer in transaction mode) or across a
    reconnect, changes between two reads are coalesced, and the log says so once. A
    change already followed by another when it is read is yielded as its notification
    tells it: holder, fence and times, without its data.
    """
    name = _checks.key("name", name)
    poll = poll_seconds(poll_interval)
    check_target(target)
    watch = AsyncWatch(target, name, poll, track=True)
    stop = AsyncStop(None)
    try:
        await watch.listen()
        last = await watch.read()
        watch.floor, watch.primed = watch.fence, True
        yield last
        while True:
            await watch.pause(last, stop, math.inf)
            for row in await watch.changes(last):
                last = row
                yield row
            # The fresh row of the same term, renewed or not: the next wake-up is its
            # expiry, not the first one seen (long past for a leader that renews).
            if same_leader(last, watch.last):
                last = watch.last
    finally:
        await watch.close()
