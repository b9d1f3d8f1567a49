"""The rows the SQL operations answer with (:mod:`pylease._operations` declares the
operations): one frozen dataclass per kind of row, its fields in the SQL's column order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NewType

#: A JSON value as it was stored (a lease's or a member's data): PostgreSQL's jsonb,
#: SQLite's JSON text.
Json = NewType("Json", object)


@dataclass(frozen=True)
class LeaseRow:
    """One row of ``lease_status``."""

    name: str
    #: None while only readers hold the name (``state`` ``shared``), and for a name only
    #: readers ever claimed.
    holder: str | None
    #: The fence of the name's latest exclusive grant: while readers hold it, their epoch.
    fence: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    held: bool
    #: ``held``, ``shared`` (held by readers), ``resting`` (released, not claimable until
    #: its min_hold ran out), ``released`` or ``expired`` (its ttl ran out without a release).
    state: str
    #: The ttl last granted or renewed with.
    ttl: timedelta
    #: How many readers hold it (unexpired shares of its epoch).
    shared: int = 0
    #: The JSON value the holder published with its tenure (``lease(..., data=...)``,
    #: ``held.set_data``); None: none. A new tenure starts without the last one's.
    data: Json = Json(None)
    #: Who asked the holder to step down (``lease_request_release``), while its tenure
    #: lasts; None: nobody.
    release_requested_by: str | None = None


@dataclass(frozen=True)
class Renewal:
    """One row of ``lease_renew_each``: the expiry the server granted, and its clock then.

    ``expires_at`` and ``server_time`` are None when the lease was not renewed.
    """

    name: str
    renewed: bool
    expires_at: datetime | None
    server_time: datetime | None
    #: The keeper's renewal (``pylease_renew_held``) of a lease: who asked its holder to
    #: step down, if anybody did in this tenure.
    release_requested_by: str | None = None


@dataclass(frozen=True)
class CounterRow:
    """One row of ``lease_counters``: how many of each event a name has seen."""

    name: str
    grants: int
    takeovers: int
    steals: int
    releases: int


@dataclass(frozen=True)
class PageRow(LeaseRow):
    """One name of a page of names (``status --prefix``, ``metrics``): its ``lease_status``
    and ``lease_counters`` rows, and how many names the page was taken from."""

    # Defaults only because LeaseRow's last field has one: the rows give every field.
    grants: int = 0
    takeovers: int = 0
    steals: int = 0
    releases: int = 0
    #: How many names start with the page's prefix, on this page or after it.
    matching: int = 0


@dataclass(frozen=True)
class LeaseEvent:
    """One row of ``lease_history``: ``claimed``, ``taken_over``, ``stolen`` or ``released``."""

    at: datetime
    name: str
    event: str
    holder: str
    fence: int
    previous_holder: str | None
    #: The slot of a semaphore's event; None for a lease.
    slot: int | None = None


@dataclass(frozen=True)
class HolderRow:
    """One row of ``lease_holders``: one current holder of a name."""

    name: str
    holder: str
    #: ``exclusive``, ``shared`` (a reader) or ``permit``.
    mode: str
    #: A permit's slot; None for the other modes.
    slot: int | None
    #: The fence of the grant; a reader's epoch.
    fence: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class PermitRow:
    """One row of ``permit_status``: one slot of a semaphore."""

    name: str
    max_permits: int
    slot: int
    holder: str
    fence: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    held: bool
    #: ``held``, ``released`` or ``expired`` (its ttl ran out without a release).
    state: str
    ttl: timedelta


@dataclass(frozen=True)
class MemberRow:
    """One row of ``group_members``: a live member of a group."""

    member: str
    #: Its incarnation: a fence, larger than any the group issued before it.
    incarnation: int
    joined_at: datetime
    renewed_at: datetime
    expires_at: datetime
    #: The JSON value it joined with (None: none).
    data: Json


@dataclass(frozen=True)
class GroupRow:
    """One row of ``group_status``: a group ever joined."""

    grp: str
    #: How many of its members are live now.
    members: int
    #: The last incarnation it issued.
    incarnation: int
    #: The earliest expiry of a live member (None: none is live).
    expires_at: datetime | None
