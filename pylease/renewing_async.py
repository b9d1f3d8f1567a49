# The source of pylease/renewing.py: tools/async_to_sync.py writes it from this file.
"""Renewing somebody else's lease: :func:`akeep_fresh`, for a helper handed the holder.

The lease is kept by the keeper as a lease block's is (:mod:`pylease._keeper_async`),
renewed with the ttl it was given or the one in force, and never released here:
release stays the owner's. A reader's share is renewed as a writer's lease is.
"""

from __future__ import annotations

from datetime import timedelta
from types import TracebackType

from pylease._acompat import monotonic
from pylease._budget import begin, exit_deadline
from pylease._held import AsyncHeld, Held, end_keep_fresh, keep_fresh_options
from pylease._keeper_async import keeper
from pylease._links_async import AsyncLink, link
from pylease._links_async import check as check_target
from pylease._telling_async import settle
from pylease._ticket import AsyncTicket, inherited
from pylease._types import AsyncTarget, Duration
from pylease.errors import LeaseLost
from pylease.leasing_async import AsyncLostCallback


class AsyncKeepFresh:
    """The context manager :func:`akeep_fresh` returns; single use."""

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
            sent_at = monotonic()
            renewed = await link_.run(lambda b: b.renew(name, holder, ttl), name=name, retry=True)
            # The exclusive holder, or a reader: who holds it now, by lease_holders.
            rows = await link_.run(lambda b: b.holders(name), name=name)
            row = next((r for r in rows if r.holder == holder and r.mode != "permit"), None)
            if not renewed or row is None:
                raise LeaseLost(name, f"it is not held by {holder!r}")
        except BaseException:
            self._link = None
            await link_.close()
            raise
        # The row's own clock gives the ttl now in force: expires_at - renewed_at.
        # Never cancels: the body is the helper's own work.
        ticket = AsyncTicket(
            name,
            holder,
            ttl or (row.expires_at - row.renewed_at),
            sent_at=sent_at,
            on_lost=self._on_lost,
        )
        ticket.fence = row.fence
        if row.mode == "shared":
            ticket.kind = "shared"
        # Renews with the ttl it was given, or the one in force (None): never the
        # owner's ttl taken from the row, which the owner may change.
        ticket.renew_ttl = ttl
        ticket.link = link_
        self._ticket = ticket
        await keeper().add(ticket, link_.renewals)
        return AsyncHeld(name, holder, row.fence, ticket)

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
            return  # a forked child's: nothing of it is the child's (see AsyncLease)
        budget = begin()  # one exit budget, as a lease block's
        try:
            await keeper().remove(ticket, link_.renewals)
            await settle(ticket)
        finally:
            await link_.close()
            exit_deadline.reset(budget)
        end_keep_fresh(ticket, exc)


def akeep_fresh(
    target: AsyncTarget,
    name: str,
    holder: str,
    *,
    ttl: Duration | None = None,
    on_lost: AsyncLostCallback | None = None,
) -> AsyncKeepFresh:
    """Keep somebody else's lease fresh while the ``async with`` block runs; never release it.

    For a helper process handed the holder token (e.g. through ``PYLEASE_HOLDER``),
    so the lease outlives an owner that died without cleaning up only as long as
    the helper works. It renews at once (``LeaseLost`` if the lease is not that
    holder's), then every ttl/3 with the keeper. Release stays the owner's; it never
    cancels the body.

    :param ttl: the ttl each renewal grants; default: the one in force.
    :raises LeaseLost: at entry if the lease is not held by ``holder``; at exit if it
        was lost meanwhile.
    """
    name_, holder_, ttl_ = keep_fresh_options(name, holder, ttl, on_lost)
    check_target(target)
    return AsyncKeepFresh(target, name_, holder_, ttl_, on_lost)
