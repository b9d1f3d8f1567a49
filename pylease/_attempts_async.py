# The source of pylease/_attempts.py: tools/async_to_sync.py writes it from this file.
"""What the wait engine tries: an :class:`Attempt`, one primitive's claim.

A lease's (:class:`LeaseClaim`), a reader's (:class:`SharedClaim`), permits'
(:class:`PermitClaim`) and several names' (:class:`ClaimAll`): each says how to claim
once, how to claim as a waiter (in one statement where the SQL has one), and what stands
in the way when busy. What sets them apart for the engine: whether a grant may leave
more to grant (``passes_on``), whether a busy one waits on the name in the way
(``follows``), and whether the waiting process takes a place in the queue of waiting
processes (``queues``: writers do, readers do not). With ``new``,
each claims a new tenure (``lease_claim_new``, ``permit_claim_new``,
``lease_claim_all_new``, ``pylease_claim_shared`` with ``new_tenure``), for a holder the
caller chose: another process that uses the holder is busy, never joined (contract 5.6).
The engine that runs them is :mod:`pylease._waiting_async`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, NamedTuple, Protocol, TypeVar

from pylease._backend_async import AsyncBackend
from pylease._held import Options
from pylease._rows import LeaseRow, PermitRow
from pylease.errors import SchemaMissing

#: What a granted attempt gives: a fence (a lease), slot -> fence (permits), name ->
#: fence (several names).
G_co = TypeVar("G_co", covariant=True)


class Attempt(Protocol[G_co]):
    """What a wait tries: one primitive's claim, as the engine calls it."""

    #: The name whose releases (NOTIFY payloads) wake this wait.
    name: str
    #: Who claims, and for how long: what the log of a grant says.
    holder: str
    ttl: timedelta
    #: A grant may leave more to grant (permits): the next waiter claims at once.
    passes_on: bool
    #: A busy attempt always reads what stood in the way, and the wait moves to its
    #: name (several names: ``name`` becomes the first name in the way).
    follows: bool
    #: The waiting process takes a place in the queue of waiting processes (a writer's
    #: claim; a reader's does not: that queue is what holds new readers off).
    queues: bool

    async def claim(self, b: AsyncBackend) -> G_co | None:
        """A plain attempt: the grant, or None when busy."""

    async def claim_waiting(
        self, b: AsyncBackend, *, status: bool, queued_as: str | None
    ) -> tuple[G_co | None, list[Any] | None]:
        """A waiter's attempt in one statement where the SQL has one: (grant, None), or
        (None, the status rows when ``status``, else None)."""

    async def status(self, b: AsyncBackend) -> list[Any]:
        """What stands in the way: status rows (``held``, ``holder``, ``expires_at``),
        the first held one the earliest to free."""


class LeaseClaim:
    """The attempt of a lease: ``lease_claim(name, ttl, holder)``; with ``new``,
    ``lease_claim_new``, for a holder the caller chose (see
    :data:`pylease._operations.CLAIM_NEW`)."""

    passes_on = False
    follows = False
    queues = True

    def __init__(
        self, name: str, ttl: timedelta, holder: str, *, new: bool = False, data: object = None
    ) -> None:
        self.name, self.ttl, self.holder, self.new = name, ttl, holder, new
        # What the grant records (contract 5.4): a JSON value, None for none.
        self.data = data

    async def claim(self, b: AsyncBackend) -> int | None:
        if self.new:
            return await b.claim_new(self.name, self.ttl, self.holder, self.data)
        return await b.claim(self.name, self.ttl, self.holder, self.data)

    async def claim_waiting(
        self, b: AsyncBackend, *, status: bool, queued_as: str | None
    ) -> tuple[int | None, list[LeaseRow] | None]:
        return await b.claim_waiting(
            self.name,
            self.ttl,
            self.holder,
            status=status,
            queued_as=queued_as,
            new=self.new,
            data=self.data,
        )

    async def status(self, b: AsyncBackend) -> list[LeaseRow]:
        return await b.status(self.name)


class PermitClaim:
    """The attempt of permits: ``permit_claim(name, max_permits, ttl, holder, permits)``;
    with ``new``, ``permit_claim_new``, for a holder the caller chose (as :class:`LeaseClaim`).

    No one-statement waiting form: a waiter's attempt is the plain claim, and the
    status a second statement when asked for (the busy claim still writes nothing).
    """

    passes_on = True
    follows = False
    queues = True

    def __init__(
        self,
        name: str,
        max_permits: int,
        ttl: timedelta,
        holder: str,
        permits: int,
        *,
        new: bool = False,
    ) -> None:
        self.name, self.ttl, self.holder, self.new = name, ttl, holder, new
        self.max_permits, self.permits = max_permits, permits

    async def claim(self, b: AsyncBackend) -> dict[int, int] | None:
        slots = await b.permit_claim(
            self.name, self.max_permits, self.ttl, self.holder, self.permits, new=self.new
        )
        return slots or None

    async def claim_waiting(
        self, b: AsyncBackend, *, status: bool, queued_as: str | None
    ) -> tuple[dict[int, int] | None, list[Any] | None]:
        slots = await self.claim(b)
        if slots is not None or not status:
            return slots, None
        return None, await self.status(b)

    async def status(self, b: AsyncBackend) -> list[PermitRow]:
        """The held slots, the first to expire first: a waiter wakes at that expiry."""
        rows = await b.permit_status(self.name)
        return sorted((r for r in rows if r.held), key=lambda r: r.expires_at)


class ClaimAll:
    """The attempt of several names at once: ``lease_claim_all(names, ttl, holder)``; with
    ``new``, ``lease_claim_all_new``, for a holder the caller chose (as :class:`LeaseClaim`).

    It waits on the first name in the way, in name order (``name``), holding none of
    them meanwhile; no one-statement waiting form, as :class:`PermitClaim`.
    """

    passes_on = False
    follows = True
    queues = True

    def __init__(
        self, names: Sequence[str], ttl: timedelta, holder: str, *, new: bool = False
    ) -> None:
        self.names = list(names)
        self.order = sorted(self.names)
        self.name, self.ttl, self.holder, self.new = self.order[0], ttl, holder, new

    async def claim(self, b: AsyncBackend) -> dict[str, int] | None:
        fences = await b.claim_all(self.names, self.ttl, self.holder, new=self.new)
        return fences or None

    async def claim_waiting(
        self, b: AsyncBackend, *, status: bool, queued_as: str | None
    ) -> tuple[dict[str, int] | None, list[Any] | None]:
        fences = await self.claim(b)
        if fences is not None:
            return fences, None
        return None, await self.status(b)

    async def status(self, b: AsyncBackend) -> list[LeaseRow]:
        """The status of the first name held by another holder, in name order (the wait
        then follows it); none when every name is free by now."""
        for name in self.order:
            rows = await b.status(name)
            if any(r.held and (self.new or r.holder != self.holder) for r in rows):
                self.name = name
                return rows
        return []


class Share(NamedTuple):
    """A reader's grant: its epoch (the fence it is logged with, ``held.fence``) and the
    share's id, which its renewals and its release name (None on a schema before
    pylease-0019, where a reader's tenure is its epoch alone)."""

    epoch: int
    share: int | None


class SharedClaim:
    """The attempt of a reader: ``pylease_claim_shared(name, ttl, holder, new)``, whose
    grant is a :class:`Share` (contract 5.2: ``lease_claim_shared`` answers the epoch
    alone); with ``new``, a new share for a holder the caller chose, busy while that
    holder's share is live (as :class:`LeaseClaim`), so that two blocks of one holder
    never believe in one share that either one's release deletes.

    A reader's grant lets the next reader in too: it passes the turn on, so the waiting
    readers of a process all come in when a writer leaves, one claim each; the chain
    stops at the first busy claim (a writer in line). Readers take no place in the
    queue of waiting processes: it is the writers' line, that keeps new readers out
    (writer preference). No one-statement waiting form, as :class:`PermitClaim`.
    """

    passes_on = True
    follows = False
    queues = False

    def __init__(self, name: str, ttl: timedelta, holder: str, *, new: bool = False) -> None:
        self.name, self.ttl, self.holder, self.new = name, ttl, holder, new

    async def claim(self, b: AsyncBackend) -> Share | None:
        try:
            grant = await b.claim_share(self.name, self.ttl, self.holder, new=self.new)
        except SchemaMissing:
            # A schema before pylease-0019 (a missing schema fails here again): the
            # share is named by its epoch alone.
            epoch = await b.claim_shared(self.name, self.ttl, self.holder)
            return None if epoch is None else Share(epoch, None)
        return None if grant is None else Share(*grant)

    async def claim_waiting(
        self, b: AsyncBackend, *, status: bool, queued_as: str | None
    ) -> tuple[Share | None, list[LeaseRow] | None]:
        share = await self.claim(b)
        if share is not None or not status:
            return share, None
        return None, await self.status(b)

    async def status(self, b: AsyncBackend) -> list[LeaseRow]:
        return await b.status(self.name)


def fence_of(grant: object) -> int:
    """The fence a grant is logged with: a lease's, a reader's epoch, or the first of
    several."""
    if type(grant) is int:
        return grant  # a lease's, the common case: before the ABC check of Mapping
    if isinstance(grant, Share):
        return grant.epoch
    if isinstance(grant, Mapping):
        return int(next(iter(grant.values())))
    assert isinstance(grant, int)
    return grant


def lease_attempt(opts: Options, holder: str) -> LeaseClaim | SharedClaim:
    """The attempt of a lease of ``opts`` claimed by ``holder``: a reader's share with
    ``opts.shared``."""
    # A holder the caller chose may be another process's too: claim a new tenure.
    if opts.shared:
        return SharedClaim(opts.name, opts.ttl, holder, new=opts.holder is not None)
    return LeaseClaim(opts.name, opts.ttl, holder, new=opts.holder is not None, data=opts.data)
