"""pylease: leases (locks with an expiry) arbitrated by PostgreSQL, with fence tokens."""

from pylease._types import FOREVER, AsyncTarget, Duration, Target, Wait
from pylease.decorators import exclusive
from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    FenceExhausted,
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    MigrationError,
    PyleaseError,
    ReadOnlyServer,
    SchemaMissing,
)
from pylease.leadership import current_leader, leader, run_as_leader, watch_leader
from pylease.leadership_async import acurrent_leader, aleader, arun_as_leader, awatch_leader
from pylease.leasing import Held, Outcome, keep_fresh, lease, run_exclusive
from pylease.leasing_async import akeep_fresh, alease, arun_exclusive
from pylease.schema import schema_sql

__version__ = "0.1.0"

__all__ = [
    "FOREVER",
    "AsyncTarget",
    "ConfigurationError",
    "DatabaseUnavailable",
    "Duration",
    "FenceExhausted",
    "Held",
    "InvalidArgument",
    "LeaseBusy",
    "LeaseLost",
    "MigrationError",
    "Outcome",
    "PyleaseError",
    "ReadOnlyServer",
    "SchemaMissing",
    "Target",
    "Wait",
    "__version__",
    "acurrent_leader",
    "akeep_fresh",
    "aleader",
    "alease",
    "arun_as_leader",
    "arun_exclusive",
    "awatch_leader",
    "current_leader",
    "exclusive",
    "keep_fresh",
    "leader",
    "lease",
    "run_as_leader",
    "run_exclusive",
    "schema_sql",
    "watch_leader",
]
