"""The operations every backend offers: the SQL API of the contract, one method each.

The PostgreSQL backend calls the SQL functions; the SQLite backend runs the
same semantics from ``sql/sqlite/``. One conformance suite runs against both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol


@dataclass(frozen=True)
class LeaseRow:
    """One row of ``lease_status``."""

    name: str
    holder: str
    fence: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    held: bool
    #: ``held``, ``resting`` (released, not claimable until its min_hold ran out),
    #: ``released`` or ``expired`` (its ttl ran out without a release).
    state: str
    #: The ttl last granted or renewed with.
    ttl: timedelta


@dataclass(frozen=True)
class Renewal:
    """One row of ``lease_renew_each``: the expiry the server granted, and its clock then.

    ``expires_at`` and ``server_time`` are None when the lease was not renewed.
    """

    name: str
    renewed: bool
    expires_at: datetime | None
    server_time: datetime | None


@dataclass(frozen=True)
class CounterRow:
    """One row of ``lease_counters``: how many of each event a name has seen."""

    name: str
    grants: int
    takeovers: int
    steals: int
    releases: int


@dataclass(frozen=True)
class LeaseEvent:
    """One row of ``lease_history``: ``claimed``, ``taken_over``, ``stolen`` or ``released``."""

    at: datetime
    name: str
    event: str
    holder: str
    fence: int
    previous_holder: str | None


class Backend(Protocol):
    """Synchronous lease operations; arguments are validated by the caller's layer too."""

    def claim(self, name: str, ttl: timedelta, holder: str) -> int | None: ...

    def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool: ...

    def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]: ...

    def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]: ...

    def release(self, name: str, holder: str, min_hold: timedelta | None = None) -> bool: ...

    def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None: ...

    def holds(self, name: str, holder: str, fence: int) -> bool: ...

    def status(self, name: str | None = None) -> list[LeaseRow]: ...

    def counters(self, name: str | None = None) -> list[CounterRow]: ...

    def history(
        self,
        name: str | None = None,
        since: datetime | timedelta | None = None,
        max_rows: int = 100,
    ) -> list[LeaseEvent]: ...

    def prune_history(self, older_than: timedelta) -> int: ...


class AsyncBackend(Protocol):
    """The same operations, awaitable."""

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
