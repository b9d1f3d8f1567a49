"""The asynchronous Python API: :func:`alease`, :func:`arun_exclusive`, :func:`akeep_fresh`.

The twin of :mod:`pylease.leasing`. One difference an event loop allows: when the
lease is lost, the task running the body is cancelled (``cancel_on_lost``), and the
block then ends with :class:`LeaseLost` instead of ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from pylease import _validate
from pylease._backend import AsyncBackend
from pylease.errors import InvalidArgument, LeaseBusy, LeaseLost
from pylease.heartbeat_async import AsyncTicket, keeper
from pylease.leasing import (
    POLL_LISTENING,
    POLL_NOT_LISTENING,
    SQLITE_FIRST_POLL,
    SQLITE_MAX_POLL,
    Held,
    Options,
    Outcome,
    callable_option,
    current_holder,
    default_holder,
    finish,
    next_pause,
    options,
)
from pylease.targets import ListenerLost
from pylease.targets_async import AsyncLink, AsyncListener, link
from pylease.targets_async import check as check_target

T = TypeVar("T")

AsyncLostCallback = Callable[[LeaseLost], object]


async def acquire(
    link_: AsyncLink, opts: Options, holder: str, *, want_holder: bool
) -> tuple[int, float]:
    """Claim the lease, waiting as allowed (see :func:`pylease.leasing.acquire`)."""
    name, ttl = opts.name, opts.ttl

    async def claim(b: AsyncBackend) -> int | None:
        return await b.claim(name, ttl, holder)

    async def status(b: AsyncBackend) -> list[Any]:
        return await b.status(name)

    start = sent_at = time.monotonic()
    fence = await link_.run(claim, name=name, retry=True)
    if fence is not None:
        return fence, sent_at
    if opts.wait <= 0:
        current = current_holder(await link_.run(status, name=name))[0] if want_holder else None
        raise LeaseBusy(name, holder=current, waited=0.0)

    deadline = start + opts.wait
    listener: AsyncListener | None = None if link_.sqlite else await link_.listen(name)
    backoff = SQLITE_FIRST_POLL if link_.sqlite else 0.01
    try:
        while True:
            sent_at = time.monotonic()
            fence = await link_.run(claim, name=name, retry=True)
            if fence is not None:
                return fence, sent_at
            current, expires_at = current_holder(await link_.run(status, name=name))
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
                await asyncio.sleep(pause)
                continue
            try:
                await listener.wait(name, pause)
            except ListenerLost:
                listener = None
    finally:
        if listener is not None:
            await listener.close()


class AsyncLease:
    """The async context manager :func:`alease` returns; single use."""

    def __init__(
        self,
        target: object,
        opts: Options,
        *,
        on_lost: AsyncLostCallback | None,
        heartbeat_target: object,
        cancel_on_lost: bool,
    ) -> None:
        self._target = target
        self._opts = opts
        self._on_lost = on_lost
        self._heartbeat_target = heartbeat_target
        self._cancel_on_lost = cancel_on_lost
        self._link: AsyncLink | None = None
        self._ticket: AsyncTicket | None = None
        self._cancelling = 0
        self.want_holder = True

    async def __aenter__(self) -> Held:
        if self._link is not None or self._ticket is not None:
            raise RuntimeError("pylease: an alease() context manager can be entered once")
        opts = self._opts
        self._link = link_ = link(self._target, heartbeat_target=self._heartbeat_target)
        holder = opts.holder or default_holder()
        try:
            fence, sent_at = await acquire(link_, opts, holder, want_holder=self.want_holder)
        except BaseException:
            self._link = None
            await link_.close()
            raise
        ticket = AsyncTicket(opts.name, holder, opts.ttl, sent_at=sent_at, on_lost=self._on_lost)
        if self._cancel_on_lost:
            ticket.task = asyncio.current_task()
            if ticket.task is not None:
                self._cancelling = ticket.task.cancelling()
        self._ticket = ticket
        if opts.heartbeat:
            keeper().add(ticket, link_.source)
        return Held(opts.name, holder, fence, ticket)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        link_, ticket = self._link, self._ticket
        assert link_ is not None and ticket is not None
        self._link = None
        released: bool | None = None
        trouble: Exception | None = None
        ticket.task = None  # no cancellation from here on
        outside_cancel = False
        try:
            if self._opts.heartbeat:
                await keeper().remove(ticket, link_.source)
            exc, outside_cancel = await self._absorb_our_cancel(ticket, exc)
            name, holder, min_hold = ticket.name, ticket.holder, self._opts.min_hold
            try:
                released = await link_.run_release(
                    lambda b: b.release(name, holder, min_hold), name=name
                )
            except Exception as err:
                trouble = err
        finally:
            await link_.close()
        if outside_cancel and exc is None:
            raise asyncio.CancelledError
        if ticket.cancelled_body and isinstance(exc, asyncio.CancelledError):
            # The body was cancelled because the lease was lost: that loss is the story.
            error = ticket.error() or LeaseLost(ticket.name, "its body was cancelled")
            if trouble is not None:
                error.add_note(f"pylease: releasing lease {ticket.name!r} failed too: {trouble}")
            raise error from exc
        finish(ticket, exc, released, trouble)

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


def alease(
    target: object,
    name: str,
    ttl: timedelta | float,
    *,
    holder: str | None = None,
    wait: timedelta | float = 0,
    heartbeat: bool = True,
    on_lost: AsyncLostCallback | None = None,
    min_hold: timedelta | float | None = None,
    heartbeat_target: object = None,
    poll_interval: float | None = None,
    cancel_on_lost: bool = True,
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
    :raises LeaseBusy: the lease is held by another holder (after ``wait``).
    :raises LeaseLost: the lease was lost while the block ran.
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
    if not isinstance(cancel_on_lost, bool):
        raise InvalidArgument(
            "pylease: cancel_on_lost must be True or False", parameter="cancel_on_lost"
        )
    check_target(target, heartbeat_target)
    return AsyncLease(
        target,
        opts,
        on_lost=on_lost,
        heartbeat_target=heartbeat_target,
        cancel_on_lost=cancel_on_lost,
    )


async def arun_exclusive(
    target: object,
    name: str,
    ttl: timedelta | float,
    work: Callable[[], Awaitable[T]],
    *,
    holder: str | None = None,
    wait: timedelta | float = 0,
    heartbeat: bool = True,
    on_lost: AsyncLostCallback | None = None,
    min_hold: timedelta | float | None = None,
    heartbeat_target: object = None,
    poll_interval: float | None = None,
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


class AsyncKeepFresh:
    """The async context manager :func:`akeep_fresh` returns; single use."""

    def __init__(
        self,
        target: object,
        name: str,
        holder: str,
        ttl: timedelta | None,
        on_lost: AsyncLostCallback | None,
    ) -> None:
        self._target = target
        self._name = name
        self._holder = holder
        self._ttl = ttl
        self._on_lost = on_lost
        self._link: AsyncLink | None = None
        self._ticket: AsyncTicket | None = None

    async def __aenter__(self) -> Held:
        if self._ticket is not None:
            raise RuntimeError("pylease: an akeep_fresh() context manager can be entered once")
        name, holder, ttl = self._name, self._holder, self._ttl
        self._link = link_ = link(self._target)
        try:
            sent_at = time.monotonic()
            renewed = await link_.run(lambda b: b.renew(name, holder, ttl), name=name, retry=True)
            rows = await link_.run(lambda b: b.status(name), name=name)
            row = next((r for r in rows if r.holder == holder), None)
            if not renewed or row is None:
                raise LeaseLost(name, f"it is not held by {holder!r}")
        except BaseException:
            self._link = None
            await link_.close()
            raise
        ticket = AsyncTicket(
            name, holder, ttl or (row.expires_at - row.renewed_at), sent_at=sent_at
        )
        ticket.on_lost = self._on_lost  # never cancels: the body is the helper's own work
        self._ticket = ticket
        keeper().add(ticket, link_.source)
        return Held(name, holder, row.fence, ticket)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        link_, ticket = self._link, self._ticket
        assert link_ is not None and ticket is not None
        self._link = None
        try:
            await keeper().remove(ticket, link_.source)
        finally:
            await link_.close()
        lost = ticket.error()
        if lost is None:
            return
        if exc is None:
            raise lost
        if not (isinstance(exc, LeaseLost) and exc.name == ticket.name):
            exc.add_note(f"pylease: {lost}")


def akeep_fresh(
    target: object,
    name: str,
    holder: str,
    *,
    ttl: timedelta | float | None = None,
    on_lost: AsyncLostCallback | None = None,
) -> AsyncKeepFresh:
    """Keep somebody else's lease fresh while the ``async with`` block runs.

    The twin of :func:`pylease.keep_fresh`; it never releases and never cancels.
    """
    name = _validate.key("name", name)
    holder = _validate.key("holder", holder)
    ttl_ = None if ttl is None else _validate.ttl(ttl)
    callable_option("on_lost", on_lost)
    check_target(target)
    return AsyncKeepFresh(target, name, holder, ttl_, on_lost)
