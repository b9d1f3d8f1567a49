# The source of pylease/_backend.py: tools/async_to_sync.py writes it from this file.
"""The operations every backend offers, the SQL API of the contract: one method each.

Each method checks the arguments before any SQL runs (the SQL checks them again) and
calls the backend's ``_call`` with the operation's declaration
(:mod:`pylease._operations`). Both backends inherit these methods
(``AsyncPostgresBackend``, ``AsyncSqliteBackend``, and their generated sync twins), so
PostgreSQL and SQLite refuse the same inputs the same way; :class:`AsyncBackend` is the
protocol of both.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pylease import _checks
from pylease import _operations as ops
from pylease._operations import Operation
from pylease._rows import (
    CounterRow,
    GroupRow,
    HolderRow,
    LeaseEvent,
    LeaseRow,
    MemberRow,
    PageRow,
    PermitRow,
    Renewal,
)
from pylease.errors import FenceExhausted


def _key(name: object) -> str | None:
    return None if name is None else _checks.key("name", name)


def _worn(message: str) -> str | None:
    """The lease an exhausted claim of several names names: ``lease 'x' has used ...``."""
    found = re.search(r"lease '((?:[^']|'')*)' has used every fence", message)
    return None if found is None else found.group(1).replace("''", "'")


def _span(parameter: str, value: object) -> timedelta | None:
    return None if value is None else _checks.span(parameter, value)


def _claim(name: str, ttl: timedelta, holder: str) -> tuple[str, timedelta, str]:
    return _checks.key("name", name), _checks.ttl(ttl), _checks.key("holder", holder)


def _incarnation(value: object) -> int | None:
    return None if value is None else _checks.fence(value, "incarnation")


class AsyncBackend:
    """Lease operations; arguments are checked by the caller's layer too."""

    async def _call(self, op: Operation, params: tuple[Any, ...], name: str | None) -> Any:
        """Run ``op`` with its checked parameters; errors name the lease ``name``."""
        raise NotImplementedError

    def in_schema(self, schema: str) -> AsyncBackend:
        """This backend, its statements naming ``schema`` (a backend without schemas: itself)."""
        return self

    async def installed_schema(self) -> str | None:
        """The schema whose ``lease_claim`` this connection's ``search_path`` finds (None:
        none, or a backend without schemas)."""
        return None

    async def claim(
        self, name: str, ttl: timedelta, holder: str, data: object = None
    ) -> int | None:
        """``lease_claim``, recording ``data`` (a JSON value; None: none) with a grant."""
        params = (*_claim(name, ttl, holder), _checks.data(data))
        result: int | None = await self._call(ops.CLAIM, params, name)
        return result

    async def claim_new(
        self, name: str, ttl: timedelta, holder: str, data: object = None
    ) -> int | None:
        """Claim a new tenure (``lease_claim_new``): a live tenure of ``holder`` itself is
        busy (another process uses this holder), an expired one gets a new fence."""
        params = (*_claim(name, ttl, holder), _checks.data(data))
        result: int | None = await self._call(ops.CLAIM_NEW, params, name)
        return result

    async def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        span = None if ttl is None else _checks.ttl(ttl)
        params = (_checks.key("name", name), _checks.key("holder", holder), span)
        return bool(await self._call(ops.RENEW, params, name))

    async def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]:
        span = None if ttl is None else _checks.ttl(ttl)
        params = (*_checks.key_lists(names, holders), span)
        result: list[tuple[str, bool]] = await self._call(ops.RENEW_MANY, params, None)
        return result

    async def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]:
        """Renew each lease with its own ttl (None: its last one), in one statement.

        :raises InvalidArgument: bad names, holders or ttls, or lists of unequal length.
        """
        name_list, holder_list = _checks.key_lists(names, holders)
        params = (name_list, holder_list, _checks.ttl_list(ttls, len(name_list)))
        result: list[Renewal] = await self._call(ops.RENEW_EACH, params, None)
        return result

    async def renew_held(
        self,
        kinds: Sequence[str],
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
        fences: Sequence[int | None] | None = None,
        slots: Sequence[int | None] | None = None,
        *,
        requests: bool = True,
    ) -> list[Renewal]:
        """The keeper's renewal across kinds, in one statement: element i is a lease
        (``kinds[i] == "lease"``), a reader's share of one (``"shared"``) or a holder's
        slots of a semaphore (``"permit"``), renewed with its own ttl (None: its last one),
        only in the tenure ``fences[i]`` names (a reader's: its epoch; a permit's: the one
        that holds slot ``slots[i]`` with that fence; None: any tenure of the holder); one
        Renewal per element, in order.

        :raises InvalidArgument: bad kinds, names, holders, ttls, fences or slots, or lists
            of unequal length.
        """
        name_list, holder_list = _checks.key_lists(names, holders)
        count = len(name_list)
        params = (
            _checks.kinds(kinds, count),
            name_list,
            holder_list,
            _checks.ttl_list(ttls, count),
            _checks.tenure_list("fences", fences, count),
            _checks.tenure_list("slots", slots, count),
        )
        op = ops.RENEW_HELD if requests else ops.RENEW_HELD_NO_REQUESTS
        result: list[Renewal] = await self._call(op, params, None)
        return result

    async def renew_held_any(
        self,
        kinds: Sequence[str],
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]:
        """:meth:`renew_held` whatever the tenures, as a schema before pylease-0012 has it
        (PostgreSQL only: the keeper's, until the schema is migrated)."""
        name_list, holder_list = _checks.key_lists(names, holders)
        count = len(name_list)
        kind_list = _checks.kinds(kinds, count)
        params = (kind_list, name_list, holder_list, _checks.ttl_list(ttls, count))
        result: list[Renewal] = await self._call(ops.RENEW_HELD_ANY, params, None)
        return result

    async def release(
        self,
        name: str,
        holder: str,
        min_hold: timedelta | None = None,
        fence: int | None = None,
    ) -> bool:
        """Give the lease back if ``holder`` still holds it: with ``fence``, only that
        tenure (None: whatever tenure the holder has)."""
        params = (
            _checks.key("name", name),
            _checks.key("holder", holder),
            _span("min_hold", min_hold),
        )
        if fence is None:
            return bool(await self._call(ops.RELEASE, params, name))
        return bool(await self._call(ops.RELEASE_TENURE, (*params, _checks.fence(fence)), name))

    async def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None:
        params = (
            _checks.key("name", name),
            _checks.ttl(ttl),
            _checks.key("holder", holder),
            _checks.span("older_than", older_than),
        )
        result: int | None = await self._call(ops.STEAL, params, name)
        return result

    async def holds(self, name: str, holder: str, fence: int) -> bool:
        params = (
            _checks.key("name", name),
            _checks.key("holder", holder),
            _checks.fence(fence),
        )
        return bool(await self._call(ops.HOLDS, params, name))

    async def status(self, name: str | None = None) -> list[LeaseRow]:
        """``lease_status``: per name (all when None), who holds it and until when."""
        result: list[LeaseRow] = await self._call(ops.STATUS, (_key(name),), name)
        return result

    async def counters(self, name: str | None = None) -> list[CounterRow]:
        """``lease_counters``: per name (all when None), grants, takeovers, steals, releases."""
        result: list[CounterRow] = await self._call(ops.COUNTERS, (_key(name),), name)
        return result

    async def status_page(self, prefix: str = "", max_rows: int | None = None) -> list[PageRow]:
        """The names that start with ``prefix``, in name order, at most ``max_rows`` of
        them (None: all): each one's ``lease_status`` and ``lease_counters`` rows, and how
        many names start with ``prefix`` (``matching``, the same on every row).

        :raises InvalidArgument: a prefix that is not a str, or max_rows not an int >= 1.
        """
        start, size = _checks.prefix(prefix), _checks.page_size(max_rows)
        result: list[PageRow] = await self._call(ops.STATUS_PAGE, (start, start, size), None)
        return result

    async def history(
        self,
        name: str | None = None,
        since: datetime | timedelta | None = None,
        max_rows: int = 100,
    ) -> list[LeaseEvent]:
        """``lease_history``: recorded events, newest first.

        :param since: an aware datetime, or a span back from the database's now.
        :raises InvalidArgument: a bad name, since, or max_rows outside 1..10,000.
        """
        after = _checks.since(since)
        params = (
            _key(name),
            after if isinstance(after, datetime) else None,
            after if isinstance(after, timedelta) else None,
            _checks.max_rows(max_rows),
        )
        result: list[LeaseEvent] = await self._call(ops.HISTORY, params, name)
        return result

    async def prune_history(self, older_than: timedelta) -> int:
        """``lease_prune_history``: delete the events older than ``older_than``; how many.

        :raises PyleaseError: the role may not prune (not executable by PUBLIC).
        """
        params = (_checks.span("older_than", older_than),)
        return int(await self._call(ops.PRUNE_HISTORY, params, None))

    async def prune(self, idle_for: timedelta) -> int:
        """``lease_prune``: delete the names nobody has held for ``idle_for``; how many.

        Their counters go with them, their history stays; a pruned name's next grant
        still gets a fence above every fence it had.

        :raises PyleaseError: the role may not prune (not executable by PUBLIC).
        """
        params = (_checks.span("idle_for", idle_for),)
        return int(await self._call(ops.PRUNE, params, None))

    # Permits (contract 5.1)

    async def permit_claim(
        self,
        name: str,
        max_permits: int,
        ttl: timedelta,
        holder: str,
        permits: int = 1,
        *,
        new: bool = False,
    ) -> dict[int, int]:
        """``permit_claim``: slot -> fence of the ``permits`` slots granted; empty when busy.

        :param new: claim a new tenure (``permit_claim_new``): slots of ``holder`` that are
            still live make it busy (another process uses this holder); expired ones are
            not continued.
        :raises InvalidArgument: bad arguments, another limit than the semaphore's, a lease
            of that name, or a holder that holds another number of its permits.
        """
        limit = _checks.max_permits(max_permits)
        params = (
            _checks.key("name", name),
            limit,
            _checks.ttl(ttl),
            _checks.key("holder", holder),
            _checks.count("permits", permits, limit, "max_permits"),
        )
        rows = await self._call(ops.PERMIT_CLAIM_NEW if new else ops.PERMIT_CLAIM, params, name)
        return {slot: fence for slot, fence in rows}

    async def permit_renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        """``permit_renew``: True when every slot of ``holder`` was still its own, and all
        were extended; False changes nothing."""
        span = None if ttl is None else _checks.ttl(ttl)
        params = (_checks.key("name", name), _checks.key("holder", holder), span)
        return bool(await self._call(ops.PERMIT_RENEW, params, name))

    async def permit_release(
        self, name: str, holder: str, slot: int | None = None, fence: int | None = None
    ) -> bool:
        """``permit_release``: True when the slots of ``holder`` were all still its own.
        With ``slot`` and ``fence``, only the tenure that holds that slot with that fence
        (None: any), so that a late release of an earlier tenure frees nothing."""
        params = (_checks.key("name", name), _checks.key("holder", holder))
        if slot is None and fence is None:
            return bool(await self._call(ops.PERMIT_RELEASE, params, name))
        tenure = (
            None if slot is None else _checks.slot(slot),
            None if fence is None else _checks.fence(fence),
        )
        return bool(await self._call(ops.PERMIT_RELEASE_TENURE, (*params, *tenure), name))

    async def permit_holds(self, name: str, holder: str, fence: int) -> bool:
        params = (
            _checks.key("name", name),
            _checks.key("holder", holder),
            _checks.fence(fence),
        )
        return bool(await self._call(ops.PERMIT_HOLDS, params, name))

    async def permit_status(self, name: str | None = None) -> list[PermitRow]:
        """``permit_status``: one row per slot ever granted (every semaphore when None)."""
        result: list[PermitRow] = await self._call(ops.PERMIT_STATUS, (_key(name),), name)
        return result

    async def permit_set_max(self, name: str, max_permits: int) -> None:
        """``permit_set_max``: change a semaphore's limit.

        :raises PyleaseError: the role may not (not executable by PUBLIC).
        """
        params = (_checks.key("name", name), _checks.max_permits(max_permits))
        await self._call(ops.PERMIT_SET_MAX, params, name)

    async def permit_revoke(self, name: str, holder: str) -> bool:
        """``permit_revoke``: free every slot of ``holder``; True if it held any.

        :raises PyleaseError: the role may not (not executable by PUBLIC).
        """
        params = (_checks.key("name", name), _checks.key("holder", holder))
        return bool(await self._call(ops.PERMIT_REVOKE, params, name))

    # Several names (contract 5.3)

    async def claim_all(
        self, names: Sequence[str], ttl: timedelta, holder: str, *, new: bool = False
    ) -> dict[str, int]:
        """``lease_claim_all``: name -> fence of every name when all were granted; empty
        when any is busy. With ``new``, a new tenure (``lease_claim_all_new``): a name
        ``holder`` holds unexpired is busy, an expired one gets a new fence."""
        params = (_checks.names(names), _checks.ttl(ttl), _checks.key("holder", holder))
        try:
            rows = await self._call(ops.CLAIM_ALL_NEW if new else ops.CLAIM_ALL, params, None)
        except FenceExhausted as exc:
            worn = _worn(str(exc))
            if exc.name is not None or worn is None:
                raise
            raise FenceExhausted(str(exc), name=worn) from exc.__cause__
        return {name: fence for name, fence in rows}

    async def release_all(
        self,
        names: Sequence[str],
        holder: str,
        fences: Sequence[int | None] | None = None,
    ) -> list[tuple[str, bool]]:
        """``lease_release_all``: (name, released) per name, in order. With ``fences``,
        each name only in the tenure its fence names (None: any), so that a late release
        of an earlier tenure frees nothing."""
        name_list = _checks.names(names)
        params = (name_list, _checks.key("holder", holder))
        if fences is None:
            result: list[tuple[str, bool]] = await self._call(ops.RELEASE_ALL, params, None)
            return result
        fence_list = _checks.tenure_list("fences", fences, len(name_list))
        result = await self._call(ops.RELEASE_ALL_TENURE, (*params, fence_list), None)
        return result

    # Readers and writers (contract 5.2)

    async def claim_shared(self, name: str, ttl: timedelta, holder: str) -> int | None:
        """``lease_claim_shared``: the epoch when granted (the fence of the name's latest
        exclusive grant, 0 if none); None while a writer holds the name or waits for it."""
        params = (_checks.key("name", name), _checks.ttl(ttl), _checks.key("holder", holder))
        result: int | None = await self._call(ops.CLAIM_SHARED, params, name)
        return result

    async def claim_share(
        self, name: str, ttl: timedelta, holder: str, *, new: bool = False
    ) -> tuple[int, int] | None:
        """A reader's claim answering (epoch, the share's id) when granted, None when busy
        (``pylease_claim_shared``, 0019). ``new``: a new share, busy while ``holder``'s
        own share is live (another process, or an earlier block, uses this holder)."""
        params = (_checks.key("name", name), _checks.ttl(ttl), _checks.key("holder", holder))
        rows = await self._call(ops.CLAIM_SHARE_NEW if new else ops.CLAIM_SHARE, params, name)
        if not rows or rows[0][0] is None:
            return None
        return int(rows[0][0]), int(rows[0][1])

    async def release_share(self, name: str, holder: str, epoch: int, share: int) -> bool:
        """Give back the share ``share`` of epoch ``epoch`` of the reader ``holder``
        (``pylease_release_share``, 0019): True when it was still its own. A late release
        of an earlier share of the same holder frees nothing of a later one."""
        params = (
            _checks.key("name", name),
            _checks.key("holder", holder),
            _checks.fence(epoch, "epoch"),
            _checks.fence(share, "share"),
        )
        return bool(await self._call(ops.RELEASE_SHARE, params, name))

    async def holders(self, name: str | None = None) -> list[HolderRow]:
        """``lease_holders``: every current holder of every kind (all names when None)."""
        result: list[HolderRow] = await self._call(ops.HOLDERS, (_key(name),), name)
        return result

    # Data on a lease, and leaders that step down when asked (contract 5.4)

    async def set_data(self, name: str, holder: str, data: object, fence: int | None) -> bool:
        """``lease_set_data``: replace the data of ``holder``'s tenure ``fence`` (None:
        whichever it has); False once the lease is no longer its own."""
        tenure = None if fence is None else _checks.fence(fence)
        params = (
            _checks.key("name", name),
            _checks.key("holder", holder),
            _checks.data(data),
            tenure,
        )
        return bool(await self._call(ops.SET_DATA, params, name))

    async def request_release(self, name: str, requested_by: str) -> bool:
        """``lease_request_release``: True when the lease is held; its holder's keeper
        learns of the request at its next renewal.

        :raises PyleaseError: the role may not (not executable by PUBLIC).
        """
        params = (_checks.key("name", name), _checks.key("requested_by", requested_by))
        return bool(await self._call(ops.REQUEST_RELEASE, params, name))

    # Groups (contract 5.5)

    async def group_join(
        self, grp: str, member: str, ttl: timedelta, data: object = None
    ) -> int | None:
        """``group_join``: the member's incarnation; None when that member name is live.

        :param data: a JSON value published with the member (None: none).
        """
        params = (
            _checks.group(grp),
            _checks.key("member", member),
            _checks.ttl(ttl),
            _checks.data(data),
        )
        result: int | None = await self._call(ops.GROUP_JOIN, params, grp)
        return result

    async def group_renew(
        self,
        grp: str,
        member: str,
        ttl: timedelta | None = None,
        incarnation: int | None = None,
    ) -> bool:
        """``group_renew``: True when the member was live (of ``incarnation``, unless
        None), and is extended, never earlier."""
        span = None if ttl is None else _checks.ttl(ttl)
        params = (
            _checks.group(grp),
            _checks.key("member", member),
            span,
            _incarnation(incarnation),
        )
        return bool(await self._call(ops.GROUP_RENEW, params, grp))

    async def group_leave(self, grp: str, member: str, incarnation: int | None = None) -> bool:
        """``group_leave``: True when the member was live (of ``incarnation``, unless None)."""
        params = (_checks.group(grp), _checks.key("member", member), _incarnation(incarnation))
        return bool(await self._call(ops.GROUP_LEAVE, params, grp))

    async def group_members(self, grp: str) -> list[MemberRow]:
        """``group_members``: the live members, ordered by member."""
        result: list[MemberRow] = await self._call(ops.GROUP_MEMBERS, (_checks.group(grp),), grp)
        return result

    async def member_holds(self, grp: str, member: str, incarnation: int) -> bool:
        params = (
            _checks.group(grp),
            _checks.key("member", member),
            _checks.fence(incarnation, "incarnation"),
        )
        return bool(await self._call(ops.MEMBER_HOLDS, params, grp))

    async def group_assignment(self, grp: str, partitions: int) -> dict[int, str]:
        """``group_assignment``: partition -> member, for partitions 0 .. partitions - 1;
        empty when the group has no live member."""
        params = (_checks.group(grp), _checks.partitions(partitions))
        rows = await self._call(ops.GROUP_ASSIGNMENT, params, grp)
        return {part: member for part, member in rows}

    async def group_status(self, grp: str | None = None) -> list[GroupRow]:
        """``group_status``: every group ever joined (or ``grp``), by name."""
        params = (None if grp is None else _checks.group(grp),)
        result: list[GroupRow] = await self._call(ops.GROUP_STATUS, params, grp)
        return result

    # Waiting (PostgreSQL): the engine of pylease._waiting_async calls these.

    async def claim_waiting(
        self,
        name: str,
        ttl: timedelta,
        holder: str,
        *,
        status: bool,
        queued_as: str | None,
        new: bool = False,
        data: object = None,
    ) -> tuple[int | None, list[LeaseRow] | None]:
        """A waiter's claim, in one statement: (fence, None) when granted, else (None,
        the status rows when ``status``, else None).

        :param queued_as: the process's token in the queue of waiting processes, which a
            grant leaves in the claim's own transaction; None when not queued there.
        :param new: claim a new tenure, as :meth:`claim_new`.
        :param data: the tenure's data, a JSON value (None: none).
        """
        claim: tuple[object, ...] = (name, ttl, holder, _checks.data(data), name)
        claim = claim if status else claim[:4]
        if queued_as is not None:
            op = ops.CLAIM_QUEUED_LOOKING if status else ops.CLAIM_QUEUED
            claim = (name, queued_as, *claim)
        else:
            op = ops.CLAIM_WAITING_LOOKING if status else ops.CLAIM_WAITING
        if new:
            op = ops.NEW_TENURE[op.name]
        rows = await self._call(op, claim, name)
        fence: int | None = rows[0][0] if rows else None
        if fence is not None or not status:
            return fence, None
        row = rows[0]
        return None, [] if row[3] is None else [LeaseRow(*row[3:])]

    async def wait(self, name: str, waiter: str, ttl: timedelta) -> bool:
        """``lease_wait``: queue a waiting process (or refresh its entry); True when first."""
        return bool(await self._call(ops.WAIT, (name, waiter, ttl), name))

    async def unwait(self, name: str, waiter: str, granted: bool) -> None:
        """``lease_unwait``: leave the queue of waiting processes, waking the next one."""
        await self._call(ops.UNWAIT, (name, waiter, granted), name)

    async def watch(self, name: str, watcher: str, ttl: timedelta | None) -> bool:
        """``lease_watch`` until now + ``ttl`` (True: it was not watched by ``watcher``), or
        with None ``lease_unwatch``."""
        if ttl is None:
            return bool(await self._call(ops.UNWATCH, (name, watcher), name))
        return bool(await self._call(ops.WATCH, (name, watcher, ttl), name))


# How a release runs: the statement, and what to run instead when it runs again (None:
# it may not). See AsyncLink.run_release.
AsyncReleaseOp = Callable[[AsyncBackend], Awaitable[bool]]
