# The source of pylease/_backend.py: tools/async_to_sync.py writes it from this file.
"""The operations every backend offers: the SQL API of the contract, one method each.

The PostgreSQL backend calls the SQL functions; the SQLite backend runs the
same semantics from ``sql/sqlite/``. One conformance suite runs against both.
:mod:`pylease._backend` exports both protocols and the rows they answer with.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from pylease._rows import CounterRow as CounterRow
from pylease._rows import LeaseEvent as LeaseEvent
from pylease._rows import LeaseRow as LeaseRow
from pylease._rows import Renewal as Renewal

# sync: from pylease._backend_async import AsyncBackend as AsyncBackend


class AsyncBackend(Protocol):
    """Lease operations; arguments are checked by the caller's layer too."""

    async def claim(self, name: str, ttl: timedelta, holder: str) -> int | None: ...

    async def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool: ...

    async def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]: ...

    async def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]: ...

    async def release(self, name: str, holder: str, min_hold: timedelta | None = None) -> bool: ...

    async def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None: ...

    async def holds(self, name: str, holder: str, fence: int) -> bool: ...

    async def status(self, name: str | None = None) -> list[LeaseRow]: ...

    async def counters(self, name: str | None = None) -> list[CounterRow]: ...

    async def history(
        self,
        name: str | None = None,
        since: datetime | timedelta | None = None,
        max_rows: int = 100,
    ) -> list[LeaseEvent]: ...

    async def prune_history(self, older_than: timedelta) -> int: ...
