# The source of pylease/_tenure.py: tools/async_to_sync.py writes it from this file.
"""What a kept tenure does on the wire, whatever its kind: its renewal, its release, and
what the database says became of it once it was lost.

A tenure is a lease, a holder's permits of a semaphore (a ticket of kind ``permit``),
several names claimed together (a ticket with ``names``), or a member of a group (a
ticket of kind ``member``: name the group, holder the member, fence its incarnation).
The keeper renews every kind of a process with one statement per tick
(:func:`renew_leases`), each only in the tenure its ticket holds (its fence), and a
block, or
the keeper for a collected or deferred one, gives it back with :func:`give_back`.
Shared by :mod:`pylease._keeper_async`, :mod:`pylease.leasing_async` and
:mod:`pylease.permits_async`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from pylease._backend_async import AsyncBackend, AsyncReleaseOp
from pylease._held import describe_loss
from pylease._links_async import AsyncLink, AsyncSource
from pylease._log import released as log_released
from pylease._operations import Renewal
from pylease._ticket import Ticket
from pylease.errors import InvalidArgument, SchemaMissing

logger = logging.getLogger("pylease")

Run = Callable[[AsyncReleaseOp, AsyncReleaseOp | None], Awaitable[bool]]


async def renew_leases(
    source: AsyncSource, batch: Sequence[Ticket], *, name: str | None = None
) -> list[tuple[Any, ...]]:
    """The renewal of everything a process holds, whatever its kind, through ``source``
    in one statement (``pylease_renew_held``; permits: a holder's slots together), each
    with its own ttl and only in the tenure its ticket holds: a lease's fence, a permit's
    first slot and that slot's fence. A ticket of several names is one element per
    name, renewed only when all of them are. Retried once on a stale connection; a
    pool's connection is waited for no longer than a statement may take.

    On a schema before pylease-0012 the renewal matches the holder alone, as it did
    there, until the process ends (its log says so once).

    Each row, one per ticket: (name, renewed, seconds granted by the server from its
    own clock, that clock, who asked its holder to step down), the last three None when
    not renewed (the last: when nobody asked).
    """
    fenced = source.key not in _unfenced
    apart = source.key in _members_apart
    requests = source.key not in _no_requests

    async def renew(b: AsyncBackend) -> list[Any]:
        return await _renew(b, batch, fenced, apart, requests)

    try:
        rows = await source.run(renew, name=name, retry=True, urgent=True)
    except SchemaMissing as exc:
        if requests and type(exc.__cause__).__name__ == "UndefinedColumn":
            # A schema before pylease-0016: its renewal answers no step-down request.
            _no_requests.add(source.key)
            return await renew_leases(source, batch, name=name)
        if not fenced:
            raise
        _unfenced.add(source.key)
        logger.warning(
            "this schema renews by holder alone (run `pylease migrate`: from"
            " pylease-0012 on, a renewal names its tenure); so it does until this process ends"
        )
        fenced = False
        rows = await source.run(renew, name=name, retry=True, urgent=True)
    except InvalidArgument as exc:
        # A schema before pylease-0015 knows no members in the keeper's renewal.
        if apart or exc.parameter != "kinds" or all(t.kind != "member" for t in batch):
            raise
        _members_apart.add(source.key)
        logger.warning(
            "this schema renews members of groups apart from leases (run `pylease"
            " migrate`: from pylease-0015 on, in the same statement); so it does until this"
            " process ends"
        )
        apart = True
        rows = await source.run(renew, name=name, retry=True, urgent=True)
    return _answers(batch, rows)


# Sources whose schema predates pylease-0012 (no renewal that names its tenure), and
# those whose schema predates pylease-0015 (no members in the keeper's renewal).
_unfenced: set[Hashable] = set()
_members_apart: set[Hashable] = set()
# Sources whose schema predates pylease-0016 (no step-down request in the renewal).
_no_requests: set[Hashable] = set()


async def _renew(
    b: AsyncBackend,
    batch: Sequence[Ticket],
    fenced: bool,
    apart: bool = False,
    requests: bool = True,
) -> list[Any]:
    """The statement of :func:`renew_leases`: one Renewal per element, in order. With
    ``apart``, members are renewed by ``group_renew`` each, after that statement."""
    if apart or not fenced:
        members = [t for t in batch if t.kind == "member"]
        if members:
            others = [t for t in batch if t.kind != "member"]
            rows = iter(await _renew(b, others, fenced, False, requests) if others else [])
            kept = {}
            for t in members:
                ok = await b.group_renew(t.name, t.holder, t.renew_ttl, t.fence)
                kept[id(t)] = Renewal(t.name, ok, None, None)
            return [
                kept[id(t)] if t.kind == "member" else next(rows)
                for t in batch
                for _ in t.names or (t.name,)
            ]
    kinds: list[str] = []
    names: list[str] = []
    holders: list[str] = []
    ttls: list[timedelta | None] = []
    fences: list[int | None] = []
    for t in batch:
        for name in t.names or (t.name,):
            kinds.append(t.kind)
            names.append(name)
            holders.append(t.holder)
            ttls.append(t.renew_ttl)
            fences.append(t.fence if t.fences is None else t.fences[name])
    if fenced:
        slots = [t.slot for t in batch for _ in t.names or (t.name,)]
        return await b.renew_held(kinds, names, holders, ttls, fences, slots, requests=requests)
    if all(kind == "lease" for kind in kinds):
        return await b.renew_each(names, holders, ttls)
    return await b.renew_held_any(kinds, names, holders, ttls)


def _answers(batch: Sequence[Ticket], rows: Sequence[Any]) -> list[tuple[Any, ...]]:
    """One answer per ticket from one Renewal per element (several names: each)."""
    owner = [i for i, t in enumerate(batch) for _ in t.names or (t.name,)]
    out: list[tuple[Any, ...]] = [(t.name, True, None, None, None) for t in batch]
    for i, r in zip(owner, rows, strict=True):
        name, renewed, granted, clock, asked = out[i]
        if not renewed:
            continue
        if r.renewed and r.expires_at is not None and r.server_time is not None:
            seconds = (r.expires_at - r.server_time).total_seconds()
            granted = seconds if granted is None else min(granted, seconds)
            asked = asked or getattr(r, "release_requested_by", None)
            out[i] = (name, True, granted, clock or r.server_time, asked)
        elif not r.renewed:
            out[i] = (name, False, None, None, None)
    return out


async def give_back(run: Run, ticket: Ticket, min_hold: timedelta | None) -> bool:
    """Release the tenure of ``ticket`` through ``run`` (a link's or a source's), only
    that tenure, so that a late release of an earlier one frees nothing: a lease's (with
    ``min_hold``), a reader's share (its epoch and its id), a holder's slots of a
    semaphore, or several names. True when all of it was still ours."""
    if ticket.names:
        fences = ticket.fences or {}
        return await _release_names(run, ticket.names, ticket.holder, fences)
    if ticket.kind == "permit":
        return await _release_permits(run, ticket.name, ticket.holder, ticket.slot, ticket.fence)
    if ticket.kind == "member":
        return await _leave_group(run, ticket.name, ticket.holder, ticket.fence)
    if ticket.kind == "shared" and ticket.slot is not None and ticket.fence is not None:
        return await _release_share(run, ticket.name, ticket.holder, ticket.fence, ticket.slot)
    return await _release_lease(run, ticket.name, ticket.holder, min_hold, ticket.fence)


async def _release_lease(
    run: Run, name: str, holder: str, min_hold: timedelta | None, fence: int | None
) -> bool:
    """A lease's tenure. A schema before pylease-0006 has no such release, so there it
    releases whatever tenure the holder has, in a statement of its own (as it does when
    the fence is not known), which is never sent twice."""

    async def tenure(b: AsyncBackend) -> bool:
        return await b.release(name, holder, min_hold, fence)

    async def tenure_again(b: AsyncBackend) -> bool:
        if await b.release(name, holder, min_hold, fence):
            return True
        # The attempt that failed may have reached the server and released it: the row
        # then still names this tenure, given back (nobody else releases a holder's).
        rows = await b.status(name)
        return any(
            r.holder == holder and r.fence == fence and r.state in ("released", "resting")
            for r in rows
        )

    async def any_tenure(b: AsyncBackend) -> bool:
        return await b.release(name, holder, min_hold)

    if fence is None:
        return await run(any_tenure, None)
    try:
        return await run(tenure, tenure_again)
    except SchemaMissing:
        # A schema missing altogether fails here again.
        return await run(any_tenure, None)


async def _release_share(run: Run, name: str, holder: str, epoch: int, share: int) -> bool:
    """A reader's share, named by its epoch and its id (0019): a late release of this
    block frees nothing of a later share of the same holder (a later block, or another
    process with this explicit holder). On a schema before pylease-0019, the share of
    the holder with that epoch, as before."""

    async def tenure(b: AsyncBackend) -> bool:
        return await b.release_share(name, holder, epoch, share)

    async def tenure_again(b: AsyncBackend) -> bool:
        if await b.release_share(name, holder, epoch, share):
            return True
        # The attempt that failed may have deleted it: it was ours if no writer was
        # granted since its epoch, and no share of this holder has that id now.
        rows = await b.status(name)
        mine = [h for h in await b.holders(name) if h.holder == holder and h.mode == "shared"]
        return any(r.fence == epoch for r in rows) and not mine

    try:
        return await run(tenure, tenure_again)
    except SchemaMissing:
        return await _release_lease(run, name, holder, None, epoch)


async def _leave_group(run: Run, grp: str, member: str, incarnation: int | None) -> bool:
    """A member's incarnation (a group block that can no longer be left: collected)."""

    async def leave(b: AsyncBackend) -> bool:
        return await b.group_leave(grp, member, incarnation)

    return await run(leave, None)


async def _release_permits(
    run: Run, name: str, holder: str, slot: int | None, fence: int | None
) -> bool:
    """A holder's slots of a semaphore, while it holds ``slot`` with ``fence``: True
    when they were all still its own. On a schema before pylease-0014, whatever tenure
    the holder has (its log says so once)."""

    async def tenure(b: AsyncBackend) -> bool:
        return await b.permit_release(name, holder, slot, fence)

    async def tenure_again(b: AsyncBackend) -> bool:
        if await b.permit_release(name, holder, slot, fence):
            return True
        # The attempt that failed may have released them: the slot still names this
        # tenure, given back (nobody else releases a holder's).
        return any(
            r.slot == slot and r.holder == holder and r.fence == fence and r.state == "released"
            for r in await b.permit_status(name)
        )

    async def any_tenure(b: AsyncBackend) -> bool:
        return await b.permit_release(name, holder)

    if slot is None or fence is None:
        return await run(any_tenure, None)
    try:
        return await run(tenure, tenure_again)
    except SchemaMissing:
        _by_holder_alone()
        return await run(any_tenure, None)


async def _release_names(
    run: Run, names: Sequence[str], holder: str, fences: Mapping[str, int]
) -> bool:
    """Several names, each in the tenure its fence names: True when every one of them
    was still ours. On a schema before pylease-0014, whatever tenure the holder has
    (its log says so once)."""
    fence_list = [fences.get(name) for name in names]

    async def tenure(b: AsyncBackend) -> bool:
        return all(released for _, released in await b.release_all(names, holder, fence_list))

    async def tenure_again(b: AsyncBackend) -> bool:
        answers = await b.release_all(names, holder, fence_list)
        for name, released in answers:
            if released:
                continue
            # The attempt that failed may have released it: the row still names this
            # tenure, given back (nobody else releases a holder's).
            rows = await b.status(name)
            if not any(
                r.holder == holder and r.fence == fences.get(name) and r.state == "released"
                for r in rows
            ):
                return False
        return True

    async def any_tenure(b: AsyncBackend) -> bool:
        return all(released for _, released in await b.release_all(names, holder))

    try:
        return await run(tenure, tenure_again)
    except SchemaMissing:
        _by_holder_alone()
        return await run(any_tenure, None)


def _by_holder_alone() -> None:
    """A schema before pylease-0014 releases permits and several names by holder alone:
    said once per process, as the keeper says it of renewals."""
    global _told_unfenced
    if _told_unfenced:
        return
    _told_unfenced = True
    logger.warning(
        "this schema releases permits and several names by holder alone (run"
        " `pylease migrate`: from pylease-0014 on, a release names its tenure)"
    )


_told_unfenced = False


async def release(
    link_: AsyncLink, ticket: Ticket, min_hold: timedelta | None
) -> tuple[bool | None, Exception | None]:
    """Give the tenure back: (was it still ours, None if unknown; what went wrong)."""
    name, holder = ticket.name, ticket.holder

    async def run(op: AsyncReleaseOp, again: AsyncReleaseOp | None) -> bool:
        return await link_.run_release(op, name=name, again=again)

    try:
        ours = await give_back(run, ticket, min_hold)
    except Exception as exc:
        return None, exc
    log_released(name, holder, ticket.fence, ours)
    return ours, None


async def loss_cause(link_: AsyncLink, ticket: Ticket) -> str | None:
    """What the database says became of a lease we lost; None if it cannot say.

    Asked only once the block is over and the lease was lost, so it costs nothing
    on the way and never delays the loss being known.
    """
    name = ticket.name

    async def look(b: AsyncBackend) -> str | None:
        rows = await b.status(name)
        events = await b.history(name, None, 1)
        return describe_loss(ticket, rows[0] if rows else None, events[0] if events else None)

    try:
        return await link_.run(look, name=name, urgent=True)
    except Exception:
        return None  # the loss is the story; its detail is a courtesy


#: One part of a tenure of several (a slot, a name): how a message names it, its status
#: row now (None when the database has none), and the fence this tenure was granted.
Part = tuple[str, Any, int]


async def parts_loss_cause(
    link_: AsyncLink, ticket: Ticket, parts: Callable[[AsyncBackend], Awaitable[list[Part]]]
) -> str | None:
    """What the database says became of a tenure of several parts we lost (permits,
    several names): the first part granted to another holder, else the first whose ttl
    ran out; None if it cannot say. Asked as :func:`loss_cause` is."""

    async def look(b: AsyncBackend) -> str | None:
        mine = []
        for label, row, fence in await parts(b):
            if row is None:
                continue
            if row.holder != ticket.holder or row.fence != fence:
                return f"{label} granted to {row.holder!r} with fence {row.fence}"
            mine.append((label, row))
        # The release freed the parts still ours: only an expired one tells more.
        for label, row in mine:
            if row.state == "expired":
                return f"{label}: its ttl ran out before a renewal reached the database"
        return None

    try:
        return await link_.run(look, name=ticket.name, urgent=True)
    except Exception:
        return None  # the loss is the story; its detail is a courtesy
