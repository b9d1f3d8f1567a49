# The source of pylease/permits.py: tools/async_to_sync.py writes it from this file.
"""Permits and several names at once: :func:`apermit` and :func:`aleases` (contract 5.1, 5.3).

Both are lease blocks (:class:`~pylease.leasing_async.AsyncLease`) that claim, hold and
release something else: the claim is an attempt of the one wait engine
(:class:`~pylease._attempts_async.PermitClaim`, :class:`~pylease._attempts_async.ClaimAll`),
the keeper renews them in the statement that renews every lease of the process
(``pylease_renew_held``, naming the tenure: a slot and its fence, each name's fence),
and the release names the tenure too: ``permit_release`` with the slot and its fence
frees the holder's slots, ``lease_release_all`` with each name's fence its names, so
that a late release of an earlier block with the same holder frees nothing of a later
one (migration 0014). A holder the caller gave claims a new tenure
(``permit_claim_new``, ``lease_claim_all_new``), as a lease's does: another process's
live tenure under it is busy, never joined. A release
that finds any slot or name no longer ours fails the work, as for a lease. The twins
differ as :mod:`pylease.leasing_async`'s do: only on an event loop is the block's task
cancelled when a permit or a name is lost (``cancel_on_lost``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pylease import _checks
from pylease._attempts_async import ClaimAll, PermitClaim
from pylease._backend_async import AsyncBackend
from pylease._held import AsyncNamesHeld, AsyncPermitsHeld, Held, Options
from pylease._links_async import AsyncLink
from pylease._tenure_async import Part, parts_loss_cause
from pylease._ticket import AsyncTicket
from pylease._types import AsyncTarget, Duration, Wait
from pylease.errors import InvalidArgument
from pylease.leasing_async import AsyncLease, AsyncLostCallback, block_options


class AsyncPermit(AsyncLease):
    """The context manager :func:`apermit` returns; single use."""

    _adoptable = False
    _exclusive = False  # one process may hold permits of a name under two holders

    def __init__(
        self,
        target: object,
        opts: Options,
        *,
        max_permits: int,
        permits: int,
        on_lost: AsyncLostCallback | None,
        heartbeat_target: object,
    ) -> None:
        super().__init__(target, opts, on_lost=on_lost, heartbeat_target=heartbeat_target)
        self._max_permits, self._permits = max_permits, permits
        self._slots: dict[int, int] = {}

    def _attempt(self, holder: str) -> PermitClaim:
        opts = self._opts
        # A holder the caller chose may be another process's too: claim a new tenure.
        return PermitClaim(
            opts.name, self._max_permits, opts.ttl, holder, self._permits, new=bool(opts.holder)
        )

    def _made(self, ticket: AsyncTicket, grant: Any) -> Held:
        ticket.kind = "permit"
        held = AsyncPermitsHeld(self._opts.name, ticket.holder, grant, ticket)
        ticket.fence, ticket.slot = held.fence, next(iter(held.slots))
        self._slots = held.slots
        return held

    async def _loss_cause(self, link_: AsyncLink, ticket: AsyncTicket) -> str | None:
        """Which of our slots the database gave to whom; None if it cannot say."""
        name, slots = ticket.name, self._slots

        async def parts(b: AsyncBackend) -> list[Part]:
            rows = {r.slot: r for r in await b.permit_status(name)}
            return [(f"slot {slot}", rows.get(slot), fence) for slot, fence in slots.items()]

        return await parts_loss_cause(link_, ticket, parts)


class AsyncNames(AsyncLease):
    """The context manager :func:`aleases` returns; single use."""

    _adoptable = False

    def __init__(
        self,
        target: object,
        opts: Options,
        names: tuple[str, ...],
        *,
        on_lost: AsyncLostCallback | None,
        heartbeat_target: object,
    ) -> None:
        super().__init__(target, opts, on_lost=on_lost, heartbeat_target=heartbeat_target)
        self._all = names
        self._fences: dict[str, int] = {}

    def _names(self) -> tuple[str, ...]:
        return self._all

    def _attempt(self, holder: str) -> ClaimAll:
        return ClaimAll(self._all, self._opts.ttl, holder, new=bool(self._opts.holder))

    def _made(self, ticket: AsyncTicket, grant: Any) -> Held:
        ticket.names = self._all
        held = AsyncNamesHeld(self._all, ticket.holder, grant, ticket)
        ticket.fence, ticket.fences = held.fence, held.fences
        self._fences = held.fences
        return held

    async def _loss_cause(self, link_: AsyncLink, ticket: AsyncTicket) -> str | None:
        """Which of our names the database gave to whom; None if it cannot say."""
        fences = self._fences

        async def parts(b: AsyncBackend) -> list[Part]:
            found: list[Part] = []
            for name, fence in fences.items():
                rows = await b.status(name)
                found.append((repr(name), rows[0] if rows else None, fence))
            return found

        return await parts_loss_cause(link_, ticket, parts)


def _permit(
    target: object,
    name: object,
    ttl: object,
    max_permits: object,
    permits: object,
    on_lost: AsyncLostCallback | None,
    heartbeat_target: object,
    **rest: Any,
) -> AsyncPermit:
    """:func:`apermit`'s block, every argument checked before any I/O."""
    limit = _checks.max_permits(max_permits)
    count = _checks.count("permits", permits, limit, "max_permits")
    opts = block_options(
        target, heartbeat_target, name, ttl, on_lost=on_lost, min_hold=None, **rest
    )
    return AsyncPermit(
        target,
        opts,
        max_permits=limit,
        permits=count,
        on_lost=on_lost,
        heartbeat_target=heartbeat_target,
    )


def _leases(
    target: object,
    names: object,
    ttl: object,
    on_lost: AsyncLostCallback | None,
    heartbeat_target: object,
    **rest: Any,
) -> AsyncNames:
    """:func:`aleases`' block, every argument checked before any I/O."""
    if isinstance(names, str):
        raise InvalidArgument(
            "pylease: names must be a sequence of names, not one str", parameter="names"
        )
    all_names = tuple(_checks.names(names))
    opts = block_options(
        target, heartbeat_target, all_names[0], ttl, on_lost=on_lost, min_hold=None, **rest
    )
    return AsyncNames(target, opts, all_names, on_lost=on_lost, heartbeat_target=heartbeat_target)


def apermit(
    target: AsyncTarget,
    name: str,
    ttl: Duration,
    *,
    max_permits: int,
    permits: int = 1,
    holder: str | None = None,
    wait: Wait = 0,
    heartbeat: bool = True,
    on_lost: AsyncLostCallback | None = None,
    heartbeat_target: AsyncTarget | None = None,
    poll_interval: Duration | None = None,
    cancel_on_lost: bool = True,  # ASYNC
) -> AsyncPermit:
    """Hold ``permits`` of the semaphore ``name`` (at most ``max_permits`` held at
    once, by everyone) while the ``async with`` block runs.

    ::

        async with apermit(aconn, "export", max_permits=4, ttl=60) as held:
            held.slots  # slot -> fence

    The other arguments are those of :func:`alease`, and a lost permit ends the block
    as a lost lease does.

    :raises LeaseBusy: fewer than ``permits`` slots were free (after ``wait``).
    :raises LeaseLost: a slot was lost while the block ran.
    """
    return _permit(
        target,
        name,
        ttl,
        max_permits,
        permits,
        on_lost,
        heartbeat_target,
        holder=holder,
        wait=wait,
        heartbeat=heartbeat,
        poll_interval=poll_interval,
        cancel_on_lost=cancel_on_lost,  # ASYNC
    )


def aleases(
    target: AsyncTarget,
    names: Sequence[str],
    ttl: Duration,
    *,
    holder: str | None = None,
    wait: Wait = 0,
    heartbeat: bool = True,
    on_lost: AsyncLostCallback | None = None,
    heartbeat_target: AsyncTarget | None = None,
    poll_interval: Duration | None = None,
    cancel_on_lost: bool = True,  # ASYNC
) -> AsyncNames:
    """Hold every lease of ``names`` while the ``async with`` block runs: all of them
    granted at once, or none; a waiter holds none of them while it waits.

    ::

        async with aleases(aconn, ["acct-17", "acct-42"], ttl=30) as held:
            held.fences  # name -> fence

    The other arguments are those of :func:`alease`, and a lost name ends the block
    as a lost lease does.

    :raises LeaseBusy: one of the names was held by another holder (after ``wait``).
    :raises LeaseLost: one of them was lost while the block ran.
    """
    return _leases(
        target,
        names,
        ttl,
        on_lost,
        heartbeat_target,
        holder=holder,
        wait=wait,
        heartbeat=heartbeat,
        poll_interval=poll_interval,
        cancel_on_lost=cancel_on_lost,  # ASYNC
    )
