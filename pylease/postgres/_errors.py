"""How the PostgreSQL driver's errors become pylease's: in one place, :func:`wrap_errors`,
for both backends of :mod:`pylease.postgres`, the sources and the CLI.
"""

from __future__ import annotations

from types import TracebackType

import psycopg
from psycopg import errors as pg_errors

from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    FenceExhausted,
    InvalidArgument,
    PyleaseError,
    ReadOnlyServer,
    SchemaMissing,
)

MISSING_SCHEMA_HINT = (
    "the pylease schema is not installed here, or is older than this pylease:"
    " run `pylease migrate --dsn ...`"
)


def bad_parameter(exc: pg_errors.InvalidParameterValue) -> str:
    """The parameter a 22023 names: the error's COLUMN field, set by ``RAISE ... USING
    COLUMN``; before the SQL set it, the first word of the message (``pylease: ttl ...``)."""
    column = exc.diag.column_name
    if column:
        return column
    message = exc.diag.message_primary or str(exc)
    return message.removeprefix("pylease: ").split(" ", 1)[0]


def translate(exc: psycopg.Error, name: str | None = None) -> PyleaseError:
    """The pylease error a driver error stands for."""
    if isinstance(exc, pg_errors.InvalidParameterValue):
        message = exc.diag.message_primary or str(exc)
        return InvalidArgument(message, parameter=bad_parameter(exc), name=name)
    if isinstance(exc, pg_errors.ProgramLimitExceeded):
        return FenceExhausted(exc.diag.message_primary or one_line(exc), name=name)
    # InvalidSchemaName: the schema a lease's statements name was dropped meanwhile;
    # UndefinedFunction and UndefinedColumn: also a schema older than what is called or
    # read (lease_claim with data, lease_status's shared).
    if isinstance(
        exc,
        pg_errors.UndefinedFunction
        | pg_errors.UndefinedTable
        | pg_errors.InvalidSchemaName
        | pg_errors.UndefinedColumn,
    ):
        return SchemaMissing(
            f"pylease: {MISSING_SCHEMA_HINT} ({exc.diag.message_primary})", name=name
        )
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction) and "standby" not in str(exc):
        # A primary whose role or database makes transactions read-only: no busy answer
        # and no "connect to the primary", but what to change.
        return ConfigurationError(
            f"pylease: {exc.diag.message_primary}: default_transaction_read_only is on for"
            " the role pylease connects as, its database or the session; pylease's"
            " statements write (turn it off for that role: ALTER ROLE ... SET"
            " default_transaction_read_only = off)",
            name=name,
        )
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        # A standby (the SQL refuses there with this SQLSTATE too): during a failover this
        # is transient, so it is a DatabaseUnavailable that the keeper retries.
        return ReadOnlyServer(
            f"pylease: {ReadOnlyServer.__doc__} ({exc.diag.message_primary})", name=name
        )
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(f"pylease: database unavailable: {one_line(exc)}", name=name)
    return PyleaseError(f"pylease: {type(exc).__name__}: {one_line(exc)}", name=name)


class wrap_errors:  # lower case: it reads as a function, ``with wrap_errors(name):``
    """Map driver errors to pylease errors, keeping the driver error as ``__cause__``.

    A class, not a generator: it wraps every statement, and entering a generator-based
    context manager costs several calls more on each lease's hot path.
    """

    __slots__ = ("name",)

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, psycopg.Error):
            raise translate(exc, self.name) from exc


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
