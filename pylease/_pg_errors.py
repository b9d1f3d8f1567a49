"""How the PostgreSQL driver's errors become pylease's: in one place, :func:`wrap_errors`,
for both backends of :mod:`pylease.postgres`, the sources and the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors

from pylease.errors import (
    DatabaseUnavailable,
    FenceExhausted,
    InvalidArgument,
    PyleaseError,
    ReadOnlyServer,
    SchemaMissing,
)

MISSING_SCHEMA_HINT = "the pylease schema is not installed here: run `pylease migrate --dsn ...`"


def bad_parameter(exc: pg_errors.InvalidParameterValue) -> str:
    """The parameter a 22023 names: the error's COLUMN field, set by ``RAISE ... USING
    COLUMN``; before the SQL set it, the first word of the message (``pylease: ttl ...``)."""
    column = exc.diag.column_name
    if column:
        return column
    message = exc.diag.message_primary or str(exc)
    return message.removeprefix("pylease: ").split(" ", 1)[0]


@contextmanager
def wrap_errors(name: str | None = None) -> Iterator[None]:
    """Map driver errors to pylease errors, keeping the driver error as ``__cause__``."""
    try:
        yield
    except pg_errors.InvalidParameterValue as exc:
        message = exc.diag.message_primary or str(exc)
        raise InvalidArgument(message, parameter=bad_parameter(exc), name=name) from exc
    except pg_errors.ProgramLimitExceeded as exc:
        raise FenceExhausted(exc.diag.message_primary or one_line(exc), name=name) from exc
    except (pg_errors.UndefinedFunction, pg_errors.UndefinedTable) as exc:
        raise SchemaMissing(
            f"pylease: {MISSING_SCHEMA_HINT} ({exc.diag.message_primary})", name=name
        ) from exc
    except pg_errors.ReadOnlySqlTransaction as exc:
        # A standby (the SQL refuses there with this SQLSTATE too): during a failover this
        # is transient, so it is a DatabaseUnavailable that the keeper retries.
        raise ReadOnlyServer(
            f"pylease: {ReadOnlyServer.__doc__} ({exc.diag.message_primary})", name=name
        ) from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"pylease: database unavailable: {one_line(exc)}", name=name
        ) from exc
    except psycopg.Error as exc:
        raise PyleaseError(f"pylease: {type(exc).__name__}: {one_line(exc)}", name=name) from exc


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
