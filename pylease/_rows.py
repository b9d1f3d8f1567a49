"""What backends answer with: the rows of the SQL API, shared by every backend."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


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
