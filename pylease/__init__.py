"""pylease: leases (locks with an expiry) arbitrated by PostgreSQL, with fence tokens."""

from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    MigrationError,
    PyleaseError,
    SchemaMissing,
)
from pylease.leader import current_leader, leader, run_as_leader, watch_leader
from pylease.leader_async import acurrent_leader, aleader, arun_as_leader, awatch_leader
from pylease.leasing import Held, Outcome, keep_fresh, lease, run_exclusive
from pylease.leasing_async import akeep_fresh, alease, arun_exclusive

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DatabaseUnavailable",
    "Held",
    "InvalidArgument",
    "LeaseBusy",
    "LeaseLost",
    "MigrationError",
    "Outcome",
    "PyleaseError",
    "SchemaMissing",
    "__version__",
    "acurrent_leader",
    "akeep_fresh",
    "aleader",
    "alease",
    "arun_as_leader",
    "arun_exclusive",
    "awatch_leader",
    "current_leader",
    "keep_fresh",
    "leader",
    "lease",
    "run_as_leader",
    "run_exclusive",
    "watch_leader",
]
