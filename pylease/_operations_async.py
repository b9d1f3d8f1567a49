# The source of pylease/_operations.py: tools/async_to_sync.py writes it from this file.
"""The operations every backend offers, the SQL API of the contract: each declared once.

An operation is a declaration (its statement on each database and the rule for its
answer, an :class:`~pylease._operation.Operation`) and one method of
:class:`AsyncOperations`, which checks the arguments before any SQL runs and calls the
backend's ``_call``. Both backends inherit these methods (``AsyncPostgresBackend``,
``AsyncSqliteBackend``, and their generated sync twins), so PostgreSQL and SQLite
refuse the same inputs the same way; the backend protocol is this class
(:mod:`pylease._backend_async`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pylease import _arguments, _validate
from pylease._operation import COUNT, FLAG, GRANT, READ, VALUE, WRITE, Operation
from pylease._rows import CounterRow, LeaseEvent, LeaseRow, Renewal

CLAIM = Operation(
    "claim", GRANT, "SELECT lease_claim(%s, %s, %s)", ("name", "ttl_seconds", "holder"), VALUE
)
RENEW = Operation(
    "renew", GRANT, "SELECT lease_renew(%s, %s, %s)", ("name", "holder", "ttl_seconds"), FLAG
)
RENEW_MANY = Operation(
    "renew_many",
    GRANT,
    "SELECT name, renewed FROM lease_renew_many(%s, %s, %s)",
    ("names", "holders", "ttl_seconds"),
    tuple,
)
RENEW_EACH = Operation(
    "renew_each",
    GRANT,
    "SELECT name, renewed, expires_at, server_time"
    " FROM lease_renew_each(%s::text[], %s::text[], %s::interval[])",
    ("names", "holders", "ttls"),
    Renewal,
)
RELEASE = Operation(
    "release",
    WRITE,
    "SELECT lease_release(%s, %s, %s)",
    ("name", "holder", "min_hold_seconds"),
    FLAG,
)
# The release of one tenure (contract 5.6): a late release of an earlier tenure then
# changes nothing once the same holder holds the name again. A file of its own on
# SQLite, so that release.sql keeps the parameters other languages bind.
RELEASE_TENURE = Operation(
    "release_tenure",
    WRITE,
    "SELECT lease_release(%s, %s, %s, %s)",
    ("name", "holder", "min_hold_seconds", "fence"),
    FLAG,
)
STEAL = Operation(
    "steal",
    GRANT,
    "SELECT lease_steal(%s, %s, %s, %s)",
    ("name", "ttl_seconds", "holder", "older_than_seconds"),
    VALUE,
)
HOLDS = Operation(
    "holds", READ, "SELECT lease_holds(%s, %s, %s)", ("name", "holder", "fence"), FLAG
)
STATUS = Operation(
    "status",
    READ,
    "SELECT name, holder, fence, acquired_at, renewed_at, expires_at, held, state, ttl"
    " FROM lease_status(%s)",
    ("name",),
    LeaseRow,
)
COUNTERS = Operation(
    "counters",
    READ,
    "SELECT name, grants, takeovers, steals, releases FROM lease_counters(%s)",
    ("name",),
    CounterRow,
)
# since is a time or a span back from now, never both; a span is taken by the
# database's clock, like every other time.
HISTORY = Operation(
    "history",
    READ,
    "SELECT at, name, event, holder, fence, previous_holder FROM lease_history("
    "%s, coalesce(%s::timestamptz, clock_timestamp() - %s::interval), %s)",
    ("name", "since", "since_seconds", "max_rows"),
    LeaseEvent,
)
PRUNE_HISTORY = Operation(
    "prune_history",
    WRITE,
    "SELECT lease_prune_history(%s)",
    ("older_than_seconds",),
    COUNT,
)

#: Every operation, in the order of the contract.
OPERATIONS = (
    CLAIM,
    RENEW,
    RENEW_MANY,
    RENEW_EACH,
    RELEASE,
    RELEASE_TENURE,
    STEAL,
    HOLDS,
    STATUS,
    COUNTERS,
    HISTORY,
    PRUNE_HISTORY,
)


def _key(name: object) -> str | None:
    return None if name is None else _validate.key("name", name)


def _span(parameter: str, value: object) -> timedelta | None:
    return None if value is None else _validate.span(parameter, value)


class AsyncOperations:
    """Lease operations; arguments are checked by the caller's layer too."""

    async def _call(self, op: Operation, params: tuple[Any, ...], name: str | None) -> Any:
        """Run ``op`` with its checked parameters; errors name the lease ``name``."""
        raise NotImplementedError

    async def claim(self, name: str, ttl: timedelta, holder: str) -> int | None:
        params = (_validate.key("name", name), _validate.ttl(ttl), _validate.key("holder", holder))
        result: int | None = await self._call(CLAIM, params, name)
        return result

    async def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        span = None if ttl is None else _validate.ttl(ttl)
        params = (_validate.key("name", name), _validate.key("holder", holder), span)
        return bool(await self._call(RENEW, params, name))

    async def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]:
        span = None if ttl is None else _validate.ttl(ttl)
        params = (*_validate.key_lists(names, holders), span)
        result: list[tuple[str, bool]] = await self._call(RENEW_MANY, params, None)
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
        name_list, holder_list = _validate.key_lists(names, holders)
        params = (name_list, holder_list, _arguments.ttl_list(ttls, len(name_list)))
        result: list[Renewal] = await self._call(RENEW_EACH, params, None)
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
            _validate.key("name", name),
            _validate.key("holder", holder),
            _span("min_hold", min_hold),
        )
        if fence is None:
            return bool(await self._call(RELEASE, params, name))
        return bool(await self._call(RELEASE_TENURE, (*params, _validate.fence(fence)), name))

    async def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None:
        params = (
            _validate.key("name", name),
            _validate.ttl(ttl),
            _validate.key("holder", holder),
            _validate.span("older_than", older_than),
        )
        result: int | None = await self._call(STEAL, params, name)
        return result

    async def holds(self, name: str, holder: str, fence: int) -> bool:
        params = (
            _validate.key("name", name),
            _validate.key("holder", holder),
            _validate.fence(fence),
        )
        return bool(await self._call(HOLDS, params, name))

    async def status(self, name: str | None = None) -> list[LeaseRow]:
        """``lease_status``: per name (all when None), who holds it and until when."""
        result: list[LeaseRow] = await self._call(STATUS, (_key(name),), name)
        return result

    async def counters(self, name: str | None = None) -> list[CounterRow]:
        """``lease_counters``: per name (all when None), grants, takeovers, steals, releases."""
        result: list[CounterRow] = await self._call(COUNTERS, (_key(name),), name)
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
        after = _arguments.since(since)
        params = (
            _key(name),
            after if isinstance(after, datetime) else None,
            after if isinstance(after, timedelta) else None,
            _arguments.max_rows(max_rows),
        )
        result: list[LeaseEvent] = await self._call(HISTORY, params, name)
        return result

    async def prune_history(self, older_than: timedelta) -> int:
        """``lease_prune_history``: delete the events older than ``older_than``; how many.

        :raises PyleaseError: the role may not prune (not executable by PUBLIC).
        """
        params = (_validate.span("older_than", older_than),)
        return int(await self._call(PRUNE_HISTORY, params, None))
