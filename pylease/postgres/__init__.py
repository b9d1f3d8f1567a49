"""The PostgreSQL backend: each operation is one call of a ``lease_*`` SQL function.

:class:`PostgresBackend` runs the operations on a psycopg ``Connection``,
:class:`AsyncPostgresBackend` on an ``AsyncConnection``; driver errors become pylease's
in one place, :func:`wrap_errors`.
"""

from pylease.postgres._backend import PostgresBackend
from pylease.postgres._backend_async import AsyncPostgresBackend
from pylease.postgres._errors import MISSING_SCHEMA_HINT, wrap_errors

__all__ = ["MISSING_SCHEMA_HINT", "AsyncPostgresBackend", "PostgresBackend", "wrap_errors"]
