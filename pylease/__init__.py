"""pylease: leases (locks with an expiry) arbitrated by PostgreSQL, with fence tokens."""

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
from pylease.leasing import Held, Outcome, keep_fresh, lease, run_exclusive
from pylease.leasing_async import akeep_fresh, alease, arun_exclusive

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DatabaseUnavailable",
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
    "__version__",
    "akeep_fresh",
    "alease",
    "arun_exclusive",
    "keep_fresh",
    "lease",
    "run_exclusive",
]
