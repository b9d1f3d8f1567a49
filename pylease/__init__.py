"""pylease: leases (locks with an expiry) arbitrated by PostgreSQL, with fence tokens.

The public names are imported on first use, so that ``import pylease`` (and the
command line, which needs few of them) does not load asyncio or the database driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    FenceExhausted,
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    MemberLive,
    MigrationError,
    PyleaseError,
    ReadOnlyServer,
    SchemaMissing,
)

if TYPE_CHECKING:
    from pylease._held import AsyncHeld, Held
    from pylease._operations import LeaseRow, MemberRow
    from pylease._types import FOREVER, AsyncTarget, Duration, Target, Wait
    from pylease.decorators import exclusive
    from pylease.inspection import locked, status
    from pylease.inspection_async import alocked, astatus
    from pylease.leadership import current_leader, leader, run_as_leader, watch_leader
    from pylease.leadership_async import (
        acurrent_leader,
        aleader,
        arun_as_leader,
        awatch_leader,
    )
    from pylease.leasing import Lease, Outcome, lease, run_exclusive
    from pylease.leasing_async import AsyncLease, alease, arun_exclusive
    from pylease.membership import Group, group
    from pylease.membership_async import AsyncGroup, agroup
    from pylease.partitioning import Partitions, partitions
    from pylease.partitioning_async import AsyncPartitions, apartitions
    from pylease.permits import leases, permit
    from pylease.permits_async import aleases, apermit
    from pylease.renewing import keep_fresh
    from pylease.renewing_async import akeep_fresh
    from pylease.schema import schema_sql

__version__ = "0.1.0"

# Where each lazily imported public name lives.
_HOMES = {
    "FOREVER": "pylease._types",
    "AsyncTarget": "pylease._types",
    "Duration": "pylease._types",
    "Target": "pylease._types",
    "Wait": "pylease._types",
    "exclusive": "pylease.decorators",
    "current_leader": "pylease.leadership",
    "leader": "pylease.leadership",
    "run_as_leader": "pylease.leadership",
    "watch_leader": "pylease.leadership",
    "acurrent_leader": "pylease.leadership_async",
    "aleader": "pylease.leadership_async",
    "arun_as_leader": "pylease.leadership_async",
    "awatch_leader": "pylease.leadership_async",
    "AsyncHeld": "pylease._held",
    "Held": "pylease._held",
    "LeaseRow": "pylease._operations",
    "MemberRow": "pylease._operations",
    "Group": "pylease.membership",
    "group": "pylease.membership",
    "AsyncGroup": "pylease.membership_async",
    "agroup": "pylease.membership_async",
    "Partitions": "pylease.partitioning",
    "partitions": "pylease.partitioning",
    "AsyncPartitions": "pylease.partitioning_async",
    "apartitions": "pylease.partitioning_async",
    "locked": "pylease.inspection",
    "status": "pylease.inspection",
    "alocked": "pylease.inspection_async",
    "astatus": "pylease.inspection_async",
    "Lease": "pylease.leasing",
    "AsyncLease": "pylease.leasing_async",
    "Outcome": "pylease.leasing",
    "keep_fresh": "pylease.renewing",
    "lease": "pylease.leasing",
    "run_exclusive": "pylease.leasing",
    "akeep_fresh": "pylease.renewing_async",
    "alease": "pylease.leasing_async",
    "arun_exclusive": "pylease.leasing_async",
    "leases": "pylease.permits",
    "permit": "pylease.permits",
    "aleases": "pylease.permits_async",
    "apermit": "pylease.permits_async",
    "schema_sql": "pylease.schema",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pylease' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "FOREVER",
    "AsyncGroup",
    "AsyncHeld",
    "AsyncLease",
    "AsyncPartitions",
    "AsyncTarget",
    "ConfigurationError",
    "DatabaseUnavailable",
    "Duration",
    "FenceExhausted",
    "Group",
    "Held",
    "InvalidArgument",
    "Lease",
    "LeaseBusy",
    "LeaseLost",
    "LeaseRow",
    "MemberLive",
    "MemberRow",
    "MigrationError",
    "Outcome",
    "Partitions",
    "PyleaseError",
    "ReadOnlyServer",
    "SchemaMissing",
    "Target",
    "Wait",
    "__version__",
    "acurrent_leader",
    "agroup",
    "akeep_fresh",
    "aleader",
    "alease",
    "aleases",
    "alocked",
    "apartitions",
    "apermit",
    "arun_as_leader",
    "arun_exclusive",
    "astatus",
    "awatch_leader",
    "current_leader",
    "exclusive",
    "group",
    "keep_fresh",
    "leader",
    "lease",
    "leases",
    "locked",
    "partitions",
    "permit",
    "run_as_leader",
    "run_exclusive",
    "schema_sql",
    "status",
    "watch_leader",
]
