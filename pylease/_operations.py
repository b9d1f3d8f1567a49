"""The SQL operations, declared once: what each runs on each database, and its answer rows.

An operation is a declaration here (its statement on each database and the rule for
its answer, an :class:`Operation`) and one method of
:class:`~pylease._backend_async.AsyncBackend`, which checks the arguments before any
SQL runs and calls the backend's ``_call``: PostgreSQL runs the statement, SQLite
``sql/sqlite/<name>.sql``, so a new plain operation needs no code in either backend.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, LiteralString

# The rows the operations answer with, declared in their own module.
from pylease._rows import CounterRow as CounterRow
from pylease._rows import GroupRow as GroupRow
from pylease._rows import HolderRow as HolderRow
from pylease._rows import Json as Json
from pylease._rows import LeaseEvent as LeaseEvent
from pylease._rows import LeaseRow as LeaseRow
from pylease._rows import MemberRow as MemberRow
from pylease._rows import PageRow as PageRow
from pylease._rows import PermitRow as PermitRow
from pylease._rows import Renewal as Renewal


class Kind(enum.Enum):
    """What an operation does to the database, which decides how it commits."""

    #: Reads only: autocommit on SQLite.
    READ = "read"
    #: A grant or a renewal: it counts only once durable (PostgreSQL: refused when the
    #: commit came with a synchronous-replication WARNING; SQLite: ``synchronous = FULL``).
    GRANT = "grant"
    #: A write whose loss in a crash is harmless (a release keeps the lease until its
    #: expiry, a prune keeps old events): SQLite commits it with ``synchronous = NORMAL``.
    WRITE = "write"


class Answer(enum.Enum):
    """How an operation's rows become its answer, when it is not a row class."""

    #: The first value of the first row, or None without one (claim: a fence, or None: busy).
    VALUE = "value"
    #: True when a row came back and its first value is true.
    FLAG = "flag"
    #: How many (PostgreSQL: the one value returned; SQLite: one row per thing affected).
    COUNT = "count"


READ, GRANT, WRITE = Kind.READ, Kind.GRANT, Kind.WRITE
VALUE, FLAG, COUNT = Answer.VALUE, Answer.FLAG, Answer.COUNT


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of the SQL API, as every backend runs it."""

    #: The operation's name: its method, and its SQLite file ``sql/sqlite/<name>.sql``.
    name: str
    kind: Kind
    #: One call of its ``lease_*`` function, with positional parameters.
    postgres: LiteralString
    #: The SQLite file's named parameters, in the order of the positional ones; a
    #: ``timedelta`` is passed as seconds, a ``datetime`` as unix seconds, a list as JSON.
    sqlite: tuple[str, ...]
    #: An :class:`Answer`, ``tuple`` (the rows as they are) or a row class, one per row
    #: (SQLite's unix seconds and seconds become the class's datetimes and timedeltas).
    answer: Answer | type[Any]


# The operations ----------------------------------------------------------------------

# With the tenure's data (migration 0016; NULL: none), which the 4-argument overload takes.
CLAIM = Operation(
    "claim",
    GRANT,
    "SELECT lease_claim(%s, %s, %s, %s::jsonb)",
    ("name", "ttl_seconds", "holder", "data"),
    VALUE,
)


# A claim that only starts a new tenure (migration 0007; of permits and several names,
# 0012): the Python API and the command line claim so with a holder they were given, so
# that another process using the same holder is busy, never joined (contract 5.6). A
# default holder is unique to its claim: there the plain claim lets a retry whose first
# answer was lost find its own grant.
_CLAIMS = re.compile(r"\b(lease_claim|lease_claim_all|permit_claim)\(")


def new_tenure(op: Operation) -> Operation:
    """``op`` with ``lease_claim_new`` for ``lease_claim`` (``lease_claim_all_new``,
    ``permit_claim_new``); its SQLite file ``<name>_new``."""
    postgres = _CLAIMS.sub(r"\1_new(", op.postgres)
    return Operation(op.name + "_new", op.kind, postgres, op.sqlite, op.answer)


def of_tenure(op: Operation, casts: LiteralString, params: tuple[str, ...]) -> Operation:
    """``op`` freeing only the tenure ``params`` name (0014); SQLite: ``<name>_tenure``."""
    postgres = op.postgres[:-1] + ", " + casts + ")"
    return Operation(op.name + "_tenure", op.kind, postgres, op.sqlite + params, op.answer)


CLAIM_NEW = new_tenure(CLAIM)
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
    "SELECT name, holder, fence, acquired_at, renewed_at, expires_at, held, state, ttl, shared,"
    " data, release_requested_by FROM lease_status(%s)",
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
# The names that start with a prefix, first ones first: lease_status and lease_counters
# whole (a SECURITY DEFINER function is never inlined, so no filter here can use an
# index), filtered, joined, and cut after max_rows (NULL: all); the count is taken
# before the cut, so that what was left out can be told.
STATUS_PAGE = Operation(
    "status_page",
    READ,
    "SELECT s.name, s.holder, s.fence, s.acquired_at, s.renewed_at, s.expires_at, s.held,"
    " s.state, s.ttl, s.shared, s.data, s.release_requested_by, c.grants, c.takeovers, c.steals,"
    " c.releases, count(*) OVER ()"
    " FROM lease_status() AS s JOIN lease_counters() AS c ON c.name = s.name"
    " WHERE starts_with(s.name, %s) AND starts_with(c.name, %s)"
    " ORDER BY s.name LIMIT %s",
    ("prefix", "prefix", "max_rows"),
    PageRow,
)
# since is a time or a span back from now, never both; a span is taken by the
# database's clock, like every other time.
HISTORY = Operation(
    "history",
    READ,
    "SELECT at, name, event, holder, fence, previous_holder, slot FROM lease_history("
    "%s, coalesce(%s::timestamptz, clock_timestamp() - %s::interval), %s)",
    ("name", "since", "since_seconds", "max_rows"),
    LeaseEvent,
)
PRUNE_HISTORY = Operation(
    "prune_history", WRITE, "SELECT lease_prune_history(%s)", ("older_than_seconds",), COUNT
)
PRUNE = Operation("prune", WRITE, "SELECT lease_prune(%s)", ("idle_for_seconds",), COUNT)


# Permits (contract 5.1): a semaphore whose slots are fenced leases.
PERMIT_CLAIM = Operation(
    "permit_claim",
    GRANT,
    "SELECT slot, fence FROM permit_claim(%s, %s::integer, %s, %s, %s::integer)",
    ("name", "max_permits", "ttl_seconds", "holder", "permits"),
    tuple,
)
PERMIT_CLAIM_NEW = new_tenure(PERMIT_CLAIM)
PERMIT_RENEW = Operation(
    "permit_renew",
    GRANT,
    "SELECT permit_renew(%s, %s, %s)",
    ("name", "holder", "ttl_seconds"),
    FLAG,
)
PERMIT_RELEASE = Operation(
    "permit_release", WRITE, "SELECT permit_release(%s, %s)", ("name", "holder"), FLAG
)
PERMIT_RELEASE_TENURE = of_tenure(PERMIT_RELEASE, "%s::integer, %s::bigint", ("slot", "fence"))
PERMIT_HOLDS = Operation(
    "permit_holds",
    READ,
    "SELECT permit_holds(%s, %s, %s)",
    ("name", "holder", "fence"),
    FLAG,
)
PERMIT_STATUS = Operation(
    "permit_status",
    READ,
    "SELECT name, max_permits, slot, holder, fence, acquired_at, renewed_at, expires_at, held,"
    " state, ttl FROM permit_status(%s)",
    ("name",),
    PermitRow,
)
# A lowered limit lost in a crash would grant past it: as durable as a grant.
PERMIT_SET_MAX = Operation(
    "permit_set_max",
    GRANT,
    "SELECT permit_set_max(%s, %s::integer)",
    ("name", "max_permits"),
    VALUE,
)
PERMIT_REVOKE = Operation(
    "permit_revoke", WRITE, "SELECT permit_revoke(%s, %s)", ("name", "holder"), FLAG
)

# Several names in one claim (contract 5.3).
CLAIM_ALL = Operation(
    "claim_all",
    GRANT,
    "SELECT name, fence FROM lease_claim_all(%s::text[], %s, %s)",
    ("names", "ttl_seconds", "holder"),
    tuple,
)
CLAIM_ALL_NEW = new_tenure(CLAIM_ALL)
RELEASE_ALL = Operation(
    "release_all",
    WRITE,
    "SELECT name, released FROM lease_release_all(%s::text[], %s)",
    ("names", "holder"),
    tuple,
)
RELEASE_ALL_TENURE = of_tenure(RELEASE_ALL, "%s::bigint[]", ("fences",))

# Readers and writers (contract 5.2): a reader's claim, and every holder of every kind.
CLAIM_SHARED = Operation(
    "claim_shared",
    GRANT,
    "SELECT lease_claim_shared(%s, %s, %s)",
    ("name", "ttl_seconds", "holder"),
    VALUE,
)
# A reader's claim as the Python API and the command line make it (migration 0019;
# SQLite 0009): the epoch and the share's id, which the release and the keeper's
# renewal name, so that a reused holder's earlier block never touches a later share.
# PostgreSQL answers one row, NULLs when busy; SQLite no row. With a holder the caller
# chose, a new share (``_new``): busy while that holder's share is live (contract 5.6).
CLAIM_SHARE = Operation(
    "claim_shared",
    GRANT,
    "SELECT epoch, share FROM pylease_claim_shared(%s, %s, %s, false)",
    ("name", "ttl_seconds", "holder"),
    tuple,
)
CLAIM_SHARE_NEW = Operation(
    "claim_shared_new",
    GRANT,
    "SELECT epoch, share FROM pylease_claim_shared(%s, %s, %s, true)",
    ("name", "ttl_seconds", "holder"),
    tuple,
)
RELEASE_SHARE = Operation(
    "release_share",
    WRITE,
    "SELECT pylease_release_share(%s, %s, %s, %s::integer)",
    ("name", "holder", "epoch", "share"),
    FLAG,
)
HOLDERS = Operation(
    "holders",
    READ,
    "SELECT name, holder, mode, slot, fence, acquired_at, renewed_at, expires_at"
    " FROM lease_holders(%s)",
    ("name",),
    HolderRow,
)

# Data on a lease, and leaders that step down when asked (contract 5.4). Data is set in
# the tenure its fence names (NULL: whichever the holder has).
SET_DATA = Operation(
    "set_data",
    WRITE,
    "SELECT lease_set_data(%s, %s, %s::jsonb, %s::bigint)",
    ("name", "holder", "data", "fence"),
    FLAG,
)
REQUEST_RELEASE = Operation(
    "request_release",
    WRITE,
    "SELECT lease_request_release(%s, %s)",
    ("name", "requested_by"),
    FLAG,
)

# Groups (contract 5.5): members, and the assignment of partitions to them. A renewal
# and a leave name the incarnation they mean (NULL: whichever is live).
GROUP_JOIN = Operation(
    "group_join",
    GRANT,
    "SELECT group_join(%s, %s, %s, %s::jsonb)",
    ("grp", "member", "ttl_seconds", "data"),
    VALUE,
)
GROUP_RENEW = Operation(
    "group_renew",
    GRANT,
    "SELECT group_renew(%s, %s, %s, %s::bigint)",
    ("grp", "member", "ttl_seconds", "incarnation"),
    FLAG,
)
GROUP_LEAVE = Operation(
    "group_leave",
    WRITE,
    "SELECT group_leave(%s, %s, %s::bigint)",
    ("grp", "member", "incarnation"),
    FLAG,
)
GROUP_MEMBERS = Operation(
    "group_members",
    READ,
    "SELECT member, incarnation, joined_at, renewed_at, expires_at, data FROM group_members(%s)",
    ("grp",),
    MemberRow,
)
MEMBER_HOLDS = Operation(
    "member_holds",
    READ,
    "SELECT member_holds(%s, %s, %s)",
    ("grp", "member", "incarnation"),
    FLAG,
)
GROUP_ASSIGNMENT = Operation(
    "group_assignment",
    READ,
    "SELECT part, member FROM group_assignment(%s, %s::integer)",
    ("grp", "partitions"),
    tuple,
)
# 0015: the groups ever joined, for operators (status, metrics).
GROUP_STATUS = Operation(
    "group_status",
    READ,
    "SELECT grp, members, incarnation, expires_at FROM group_status(%s)",
    ("grp",),
    GroupRow,
)

# The keeper's renewal across kinds (contract 5, "the keeper across kinds"): internal,
# not in the contract. One statement renews the leases, the shares of readers and the
# semaphore slots of a process, each element at its own ttl.
# Each element only in the tenure the keeper knows (migration 0012): a lease's fence, a
# reader's epoch (migration 0013); a permit's slot and that slot's fence. None: whatever
# tenure the holder has. Its arrays go in binary (%b): psycopg writes a list as text at
# about twice binary's cost per element, and the server reads binary faster, so a tick of
# 65 elements, six arrays, costs some 100 µs less (bench 13-member-tick).
RENEW_HELD = Operation(
    "renew_held",
    GRANT,
    "SELECT name, renewed, expires_at, server_time, release_requested_by FROM pylease_renew_held("
    "%b::text[], %b::text[], %b::text[], %b::interval[], %b::bigint[], %b::integer[])",
    ("kinds", "names", "holders", "ttls", "fences", "slots"),
    Renewal,
)
#: The same on a schema before pylease-0016, whose renewal answers no step-down request.
RENEW_HELD_NO_REQUESTS = Operation(
    "renew_held",
    GRANT,
    "SELECT name, renewed, expires_at, server_time FROM pylease_renew_held("
    "%b::text[], %b::text[], %b::text[], %b::interval[], %b::bigint[], %b::integer[])",
    ("kinds", "names", "holders", "ttls", "fences", "slots"),
    Renewal,
)

#: Every operation, in the order of the contract.
OPERATIONS = (
    CLAIM,
    CLAIM_NEW,
    RENEW,
    RENEW_MANY,
    RENEW_EACH,
    RELEASE,
    RELEASE_TENURE,
    STEAL,
    HOLDS,
    STATUS,
    COUNTERS,
    STATUS_PAGE,
    HISTORY,
    PRUNE_HISTORY,
    PRUNE,
    PERMIT_CLAIM,
    PERMIT_CLAIM_NEW,
    PERMIT_RENEW,
    PERMIT_RELEASE,
    PERMIT_RELEASE_TENURE,
    PERMIT_HOLDS,
    PERMIT_STATUS,
    PERMIT_SET_MAX,
    PERMIT_REVOKE,
    CLAIM_ALL,
    CLAIM_ALL_NEW,
    RELEASE_ALL,
    RELEASE_ALL_TENURE,
    CLAIM_SHARED,
    CLAIM_SHARE_NEW,
    RELEASE_SHARE,
    HOLDERS,
    SET_DATA,
    REQUEST_RELEASE,
    GROUP_JOIN,
    GROUP_RENEW,
    GROUP_LEAVE,
    GROUP_MEMBERS,
    MEMBER_HOLDS,
    GROUP_ASSIGNMENT,
    GROUP_STATUS,
    RENEW_HELD,
)

# The keeper's renewal on a schema before migration 0012, whatever the tenures: until it
# is migrated (PostgreSQL; the SQLite files are always this version's).
RENEW_HELD_ANY = Operation(
    "renew_held_any",
    GRANT,
    "SELECT name, renewed, expires_at, server_time FROM pylease_renew_held("
    "%b::text[], %b::text[], %b::text[], %b::interval[])",
    (),
    Renewal,
)


# Waiting (PostgreSQL only: SQLite has no NOTIFY, and its waiters poll) ---------------

#: The queue of waiting processes (migration 0005): ``lease_wait`` queues a process, or
#: refreshes its entry, and says whether it is first in line; ``lease_unwait`` takes it
#: out and wakes the next process.
WAIT = Operation("wait", WRITE, "SELECT lease_wait(%s, %s, %s)", (), VALUE)
UNWAIT = Operation("unwait", WRITE, "SELECT lease_unwait(%s, %s, %s)", (), VALUE)
#: The names watched for changes of holder (migration 0016): ``lease_watch`` registers a
#: watcher (or refreshes it) until now + ttl, so that grants of the name send NOTIFY
#: pylease_holders; ``lease_unwatch`` takes it out.
WATCH = Operation("watch", WRITE, "SELECT lease_watch(%s, %s, %s)", (), VALUE)
UNWATCH = Operation("unwatch", WRITE, "SELECT lease_unwatch(%s, %s)", (), VALUE)

# A waiter's claim is one statement: the claim, and only when it is busy and the wait
# asks for it, the status row that stood in the way. OFFSET 0 keeps each subquery whole:
# lease_claim runs once, and lease_status behind a one-time filter, only when busy. A
# claim that does not look is sent without the status's join: planning and running it
# costs a handover about a tenth of a millisecond (issue 22, bench target 5).
_STATUS_COLUMNS: LiteralString = (
    "s.name, s.holder, s.fence, s.acquired_at, s.renewed_at, s.expires_at, s.held, s.state,"
    " s.ttl, s.shared, s.data, s.release_requested_by"
)
_CLAIMED: LiteralString = " FROM (SELECT lease_claim(%s, %s, %s, %s::jsonb) AS fence OFFSET 0) AS c"
# A busy claim that met the winner's claim on the lease's row waited for it, then
# locked the row's new version to recheck it: its transaction has an xid, and its
# commit would wait for a WAL flush while the winner's fenced writes (lease_holds)
# wait for its lock. Busy, it granted nothing: its commit need not be durable.
_BUSY_NO_FLUSH: LiteralString = (
    "CASE WHEN c.fence IS NULL THEN set_config('synchronous_commit', 'off', true) END"
)
_STATUS: LiteralString = (
    " LEFT JOIN LATERAL (SELECT * FROM lease_status(%s) WHERE c.fence IS NULL OFFSET 0)"
    " AS s ON true"
)
# For a process queued in pylease_waiters: on a grant it leaves the queue there and
# then, waking the next process.
_UNWAIT: LiteralString = "CASE WHEN c.fence IS NOT NULL THEN lease_unwait(%s, %s, true) END"

#: A waiter's claim: ``(fence, ...)``.
CLAIM_WAITING = Operation(
    "claim_waiting", GRANT, "SELECT c.fence, NULL, " + _BUSY_NO_FLUSH + _CLAIMED, (), tuple
)
#: The same, reading the status row that stood in the way when busy:
#: ``(fence, NULL, NULL, *status row)``.
CLAIM_WAITING_LOOKING = Operation(
    "claim_waiting_looking",
    GRANT,
    "SELECT c.fence, NULL, " + _BUSY_NO_FLUSH + ", " + _STATUS_COLUMNS + _CLAIMED + _STATUS,
    (),
    tuple,
)
#: A waiter's claim for a process queued in pylease_waiters. SQLite runs it too
#: (claim_queued.sql), for a writer waiting with SQLite's queue of its own (contract
#: 5.2): its row, when granted, or none.
CLAIM_QUEUED = Operation(
    "claim_queued",
    GRANT,
    "SELECT c.fence, " + _UNWAIT + ", " + _BUSY_NO_FLUSH + _CLAIMED,
    ("name", "waiter", "name", "ttl_seconds", "holder", "data"),
    tuple,
)
#: The same, reading the status row when busy.
CLAIM_QUEUED_LOOKING = Operation(
    "claim_queued_looking",
    GRANT,
    "SELECT c.fence, "
    + _UNWAIT
    + ", "
    + _BUSY_NO_FLUSH
    + ", "
    + _STATUS_COLUMNS
    + _CLAIMED
    + _STATUS,
    (),
    tuple,
)

#: The waiters' claims of a new tenure (see CLAIM_NEW), by the plain claim's name.
NEW_TENURE = {
    op.name: new_tenure(op)
    for op in (CLAIM_WAITING, CLAIM_WAITING_LOOKING, CLAIM_QUEUED, CLAIM_QUEUED_LOOKING)
}

#: The operations of waiters, which only the PostgreSQL backend runs.
WAITING = (
    WAIT,
    UNWAIT,
    WATCH,
    UNWATCH,
    CLAIM_WAITING,
    CLAIM_WAITING_LOOKING,
    CLAIM_QUEUED,
    CLAIM_QUEUED_LOOKING,
    *NEW_TENURE.values(),
)


# A claim without data is sent as the 3-argument lease_claim (lease_claim_new), which
# every schema has: this pylease keeps claiming on a schema not yet migrated to 0016,
# and only a claim that gives data needs the 4-argument overload.
_WITH_DATA = re.compile(r"\b(lease_claim(?:_new)?)\(%s, %s, %s, %s::jsonb\)")


def _dataless(op: Operation) -> tuple[Operation, int]:
    """``op`` without its data parameter, and that parameter's position."""
    found = _WITH_DATA.search(op.postgres)
    assert found is not None, op.name
    at = op.postgres.count("%s", 0, found.start()) + 3
    postgres = _WITH_DATA.sub(r"\1(%s, %s, %s)", op.postgres)
    return Operation(op.name, op.kind, postgres, op.sqlite, op.answer), at


#: PostgreSQL: each claim's operation for a claim without data (its data parameter is
#: None), by the operation's name, with the position of the parameter it drops.
DATALESS = {
    op.name: _dataless(op)
    for op in (
        CLAIM,
        CLAIM_NEW,
        CLAIM_WAITING,
        CLAIM_WAITING_LOOKING,
        CLAIM_QUEUED,
        CLAIM_QUEUED_LOOKING,
        *NEW_TENURE.values(),
    )
}
