# The source of pylease/permits.py: tools/async_to_sync.py writes it from this file.
"""Permits and several names at once: :func:`apermit` and :func:`aleases` (contract 5.1, 5.3).

Both are lease blocks (:class:`~pylease.leasing_async.AsyncLease`) that claim, hold and
release something else: the claim is an attempt of the one wait engine
(:class:`~pylease._waiting_async.PermitClaim`, :class:`~pylease._waiting_async.ClaimAll`),
the keeper renews them in the statement that renews every lease of the process
(``pylease_renew_held``), and the release is holder-matched: ``permit_release`` frees
the holder's slots, ``lease_release_all`` its names. Neither release takes a fence
(the SQL has none): a holder names one claim, and the default holder is unique per
claim. A release that finds any slot or name no longer ours fails the work, as for
a lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pylease import _checks
from pylease._backend_async import AsyncBackend
from pylease._held import (
    AsyncNamesHeld,
    AsyncPermitsHeld,
    Held,
    Options,
    bool_option,
    options,
)
from pylease._links_async import AsyncLink
from pylease._links_async import check as check_target
from pylease._ticket import AsyncTicket
from pylease._types import AsyncTarget, Duration, Wait
from pylease._waiting_async import ClaimAll, PermitClaim, acquire_with
from pylease.errors import InvalidArgument
from pylease.leasing_async import AsyncLease, AsyncLostCallback


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

    async def _claim(self, link_: AsyncLink, holder: str) -> tuple[Any, float]:
        opts = self._opts
        attempt = PermitClaim(opts.name, self._max_permits, opts.ttl, holder, self._permits)
        return await acquire_with(link_, attempt, opts, want_holder=self.want_holder)

    def _made(self, ticket: AsyncTicket, grant: Any) -> Held:
        ticket.kind = "permit"
        held = AsyncPermitsHeld(self._opts.name, ticket.holder, grant, ticket)
        ticket.fence = held.fence
        self._slots = held.slots
        return held

    async def _loss_cause(self, link_: AsyncLink, ticket: AsyncTicket) -> str | None:
        """Which of our slots the database gave to whom; None if it cannot say."""
        name, slots = ticket.name, self._slots

        async def look(b: AsyncBackend) -> str | None:
            rows = {r.slot: r for r in await b.permit_status(name)}
            mine = [(slot, rows[slot]) for slot in slots if slot in rows]
            for slot, row in mine:
                if row.holder != ticket.holder or row.fence != slots[slot]:
                    return f"slot {slot} granted to {row.holder!r} with fence {row.fence}"
            # The release freed the slots still ours: only an expired one tells more.
            for slot, row in mine:
                if row.state == "expired":
                    return f"slot {slot}: its ttl ran out before a renewal reached the database"
            return None

        try:
            return await link_.run(look, name=name)
        except Exception:
            return None  # the loss is the story; its detail is a courtesy


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

    async def _claim(self, link_: AsyncLink, holder: str) -> tuple[Any, float]:
        attempt = ClaimAll(self._all, self._opts.ttl, holder)
        return await acquire_with(link_, attempt, self._opts, want_holder=self.want_holder)

    def _made(self, ticket: AsyncTicket, grant: Any) -> Held:
        ticket.names = self._all
        held = AsyncNamesHeld(self._all, ticket.holder, grant, ticket)
        ticket.fence = held.fence
        self._fences = held.fences
        return held

    async def _loss_cause(self, link_: AsyncLink, ticket: AsyncTicket) -> str | None:
        """Which of our names the database gave to whom; None if it cannot say."""
        fences = self._fences

        async def look(b: AsyncBackend) -> str | None:
            mine = []
            for name, fence in fences.items():
                rows = await b.status(name)
                if not rows:
                    continue
                row = rows[0]
                if row.holder != ticket.holder or row.fence != fence:
                    return f"{name!r} claimed by {row.holder!r} with fence {row.fence}"
                mine.append(row)
            # The release freed the names still ours: only an expired one tells more.
            for row in mine:
                if row.state == "expired":
                    return f"{row.name!r}: its ttl ran out before a renewal reached the database"
            return None

        try:
            return await link_.run(look, name=ticket.name)
        except Exception:
            return None


def _permit_options(
    name: object, ttl: object, max_permits: object, permits: object, **rest: Any
) -> tuple[Options, int, int]:
    limit = _checks.max_permits(max_permits)
    count = _checks.count("permits", permits, limit, "max_permits")
    return options(name, ttl, min_hold=None, **rest), limit, count


def _names(names: object) -> tuple[str, ...]:
    if isinstance(names, str):
        raise InvalidArgument(
            "pylease: names must be a sequence of names, not one str", parameter="names"
        )
    return tuple(_checks.names(names))


if True:  # ASYNC

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
        cancel_on_lost: bool = True,
    ) -> AsyncPermit:
        """Hold ``permits`` of the semaphore ``name`` (at most ``max_permits`` held at
        once, by everyone) while the ``async with`` block runs.

        ::

            async with apermit(aconn, "export", max_permits=4, ttl=60) as held:
                held.slots  # slot -> fence

        The other arguments are those of :func:`alease`.

        :raises LeaseBusy: fewer than ``permits`` slots were free (after ``wait``).
        :raises LeaseLost: a slot was lost while the block ran.
        """
        opts, limit, count = _permit_options(
            name,
            ttl,
            max_permits,
            permits,
            holder=holder,
            wait=wait,
            heartbeat=heartbeat,
            on_lost=on_lost,
            poll_interval=poll_interval,
        )
        bool_option("cancel_on_lost", cancel_on_lost)
        check_target(target, heartbeat_target)
        return AsyncPermit(
            target,
            opts._replace(cancel_on_lost=cancel_on_lost),
            max_permits=limit,
            permits=count,
            on_lost=on_lost,
            heartbeat_target=heartbeat_target,
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
        cancel_on_lost: bool = True,
    ) -> AsyncNames:
        """Hold every lease of ``names`` while the ``async with`` block runs: all of them
        granted at once, or none; a waiter holds none of them while it waits.

        ::

            async with aleases(aconn, ["acct-17", "acct-42"], ttl=30) as held:
                held.fences  # name -> fence

        The other arguments are those of :func:`alease`.

        :raises LeaseBusy: one of the names was held by another holder (after ``wait``).
        :raises LeaseLost: one of them was lost while the block ran.
        """
        all_names = _names(names)
        opts = options(
            all_names[0],
            ttl,
            holder=holder,
            wait=wait,
            heartbeat=heartbeat,
            on_lost=on_lost,
            min_hold=None,
            poll_interval=poll_interval,
        )
        bool_option("cancel_on_lost", cancel_on_lost)
        check_target(target, heartbeat_target)
        return AsyncNames(
            target,
            opts._replace(cancel_on_lost=cancel_on_lost),
            all_names,
            on_lost=on_lost,
            heartbeat_target=heartbeat_target,
        )

else:

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
    ) -> AsyncPermit:
        """Hold ``permits`` of the semaphore ``name`` (at most ``max_permits`` held at
        once, by everyone) while the ``with`` block runs.

        ::

            with permit(conn, "export", max_permits=4, ttl=60) as held:
                held.slots  # slot -> fence

        The other arguments are those of :func:`lease`; a body that must not outlive
        its permits calls ``held.check()`` between steps, or passes ``on_lost``.

        :raises LeaseBusy: fewer than ``permits`` slots were free (after ``wait``).
        :raises LeaseLost: the block returned, but a slot was lost meanwhile.
        """
        opts, limit, count = _permit_options(
            name,
            ttl,
            max_permits,
            permits,
            holder=holder,
            wait=wait,
            heartbeat=heartbeat,
            on_lost=on_lost,
            poll_interval=poll_interval,
        )
        check_target(target, heartbeat_target)
        return AsyncPermit(
            target,
            opts,
            max_permits=limit,
            permits=count,
            on_lost=on_lost,
            heartbeat_target=heartbeat_target,
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
    ) -> AsyncNames:
        """Hold every lease of ``names`` while the ``with`` block runs: all of them
        granted at once, or none; a waiter holds none of them while it waits.

        ::

            with leases(conn, ["acct-17", "acct-42"], ttl=30) as held:
                held.fences  # name -> fence

        The other arguments are those of :func:`lease`.

        :raises LeaseBusy: one of the names was held by another holder (after ``wait``).
        :raises LeaseLost: the block returned, but one of them was lost meanwhile.
        """
        all_names = _names(names)
        opts = options(
            all_names[0],
            ttl,
            holder=holder,
            wait=wait,
            heartbeat=heartbeat,
            on_lost=on_lost,
            min_hold=None,
            poll_interval=poll_interval,
        )
        check_target(target, heartbeat_target)
        return AsyncNames(
            target, opts, all_names, on_lost=on_lost, heartbeat_target=heartbeat_target
        )
