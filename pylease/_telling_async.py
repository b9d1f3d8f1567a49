# The source of pylease/_telling.py: tools/async_to_sync.py writes it from this file.
"""How the owner of a kept lease is told what the keeper learned: its loss (``on_lost``),
a request to step down (``on_release_requested``, contract 5.4).

A callback runs apart, in a task (a thread) of its own, so that a slow or stuck one never
delays a renewal nor the cancellation of a body; a lease block waits for its own
``on_lost`` before it ends (:func:`settle`). Where the twins differ (the ``if True:  #
ASYNC`` blocks): on an event loop a lost lease may cancel the task running its body, a
coroutine callback is awaited and a plain one runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from pylease._acompat import aspawn
from pylease._budget import waiting
from pylease._ticket import AsyncTicket, Ticket
from pylease.errors import LeaseLost

if True:  # ASYNC
    pass
else:
    import threading

logger = logging.getLogger("pylease")

# How long stopping waits for a tick already under way for that lease, and a block's
# end for its own on_lost.
STOP_WAIT = 5.0


async def call_back(
    ticket: Ticket, callback: Callable[[Any], object], arg: object, what: str
) -> None:
    """Run ``callback(arg)`` for ``ticket``; an exception is logged, never raised."""
    try:
        if True:  # ASYNC
            # A plain function may block: on the loop that would stop every renewal.
            coroutine = inspect.iscoroutinefunction(callback)
            outcome = callback(arg) if coroutine else await asyncio.to_thread(callback, arg)
            if inspect.isawaitable(outcome):
                await outcome
        else:
            callback(arg)
    except Exception:
        logger.exception("%s callback for lease %r failed", what, ticket.name)


async def call_on_lost(ticket: Ticket, error: LeaseLost) -> None:
    on_lost, told = ticket.on_lost, LeaseLost(error.name or ticket.name, error.reason)
    assert on_lost is not None  # tell_lost runs it only then
    await call_back(ticket, on_lost, told, "on_lost")


if True:  # ASYNC
    # Callbacks under way: the loop keeps only weak references to its tasks.
    _callbacks: set[asyncio.Task[None]] = set()


def _apart(function: Callable[..., Any], *args: Any, name: str) -> Any:
    """Start ``function(*args)`` in a task (a thread) of its own."""
    if True:  # ASYNC
        task = aspawn(function, *args, name=name)
        _callbacks.add(task)
        task.add_done_callback(_callbacks.discard)
        return task
    else:
        return aspawn(function, *args, name=name)


def tell_lost(ticket: Ticket, error: LeaseLost) -> None:
    """Cancel the body first, then run ``on_lost`` where it cannot delay any renewal."""
    if True:  # ASYNC
        if isinstance(ticket, AsyncTicket) and ticket.task is not None and not ticket.task.done():
            ticket.cancelled_body = True
            ticket.task.cancel(f"pylease: lease {ticket.name!r} was lost")
    if ticket.on_lost is None:
        return
    ticket.callback = _apart(call_on_lost, ticket, error, name="pylease-on-lost")


async def settle(ticket: Ticket) -> None:
    """Let the lease's own ``on_lost`` finish before its block ends (bounded, within
    the block's exit budget).

    The callback runs apart so that it delays no renewal and no cancellation; the
    block that it is about may still wait for it, so it is told before the block ends.
    """
    worker = ticket.callback
    if worker is None:
        return
    if True:  # ASYNC
        if worker is not asyncio.current_task():
            await asyncio.wait({worker}, timeout=waiting(STOP_WAIT))
    else:
        if worker is not threading.current_thread():
            worker.join(waiting(STOP_WAIT))


def tell_release_requested(ticket: Ticket, requested_by: str) -> None:
    """A renewal answered that ``requested_by`` asked the holder to step down: record it
    (``held.release_requested``) and run ``on_release_requested`` apart, once a tenure."""
    if ticket.release_requested_by is not None:
        return
    ticket.release_requested_by = requested_by
    logger.info(
        "lease %r (holder %s, fence %s) was asked to step down by %s",
        ticket.name,
        ticket.holder,
        ticket.fence,
        requested_by,
    )
    callback = ticket.on_release_requested
    held = None if ticket.held is None else ticket.held()
    if callback is not None and held is not None:
        _apart(
            call_back,
            ticket,
            callback,
            held,
            "on_release_requested",
            name="pylease-on-release-requested",
        )
