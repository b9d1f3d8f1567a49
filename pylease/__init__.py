"""pylease: leases (locks with an expiry) arbitrated by PostgreSQL, with fence tokens."""

from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    PyleaseError,
    SchemaMissing,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DatabaseUnavailable",
    "InvalidArgument",
    "LeaseBusy",
    "LeaseLost",
    "PyleaseError",
    "SchemaMissing",
    "__version__",
]
