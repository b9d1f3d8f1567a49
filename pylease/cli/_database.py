"""Finding the database a command works on, connecting to it, and explaining what is wrong."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pylease import dsn as dsn_mod
from pylease._backend import Backend
from pylease.cli._edge import EXIT_CONFIG, EXIT_USAGE, fail, first_line, is_verbose, say
from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    PyleaseError,
    SchemaMissing,
)

# The database ------------------------------------------------------------------


@dataclass(frozen=True)
class Store:
    """Where the leases are: the URL to connect with (never printed), how to name it in
    messages, and why this one (for ``-v``)."""

    url: str
    shown: str
    sqlite: bool
    source: str
    base_url: str = ""
    schema: str | None = None
    default_file: Path | None = None
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        kind = "the SQLite file" if self.sqlite else "PostgreSQL at"
        if self.source == "default":
            why = f"the embedded default: none of {NO_DSN} is set"
        else:
            why = f"from {self.source}"
        schema = f", schema {self.schema}" if self.schema else ""
        return f"using {kind} {self.shown}{schema} ({why})" + "".join(f"; {n}" for n in self.notes)

    def explain(self, exc: PyleaseError) -> str | None:
        """A better line than the error's own, where this store can tell one."""
        if isinstance(exc, SchemaMissing) and not self.sqlite:
            return not_installed(self, exc)
        return grant_needed(self, exc)


def _schema(explicit: str | None) -> tuple[str | None, str]:
    if explicit:
        return explicit, "--schema"
    value = os.environ.get(dsn_mod.SCHEMA_VAR)
    return (value, dsn_mod.SCHEMA_VAR) if value else (None, "")


def find_store(
    explicit: str | None, schema_option: str | None = None, require_dsn: bool = False
) -> Store:
    """The database of a command: ``--dsn``, ``PYLEASE_DSN``, ``DATABASE_URL``, else the
    embedded default, which is said on stderr (it may be a mistake) unless stderr is a
    terminal, and refused with ``require_dsn``."""
    found = dsn_mod.find(explicit)
    schema, schema_source = _schema(schema_option)
    if found.value is None:
        hints = [v for v in dsn_mod.LIBPQ_HINTS if os.environ.get(v)]
        notes = tuple(dsn_mod.misspelled())
        if hints:
            notes += (
                f"{', '.join(hints)} {'is' if len(hints) == 1 else 'are'} set, but libpq "
                "variables only fill in a postgresql:// URL: PYLEASE_DSN=postgresql:// "
                "uses them",
            )
        if require_dsn:
            raise fail(
                f"no database given ({NO_DSN}) and one is required (--require-dsn or "
                "PYLEASE_REQUIRE_DSN)" + "".join(f"; {n}" for n in notes)
            )
        path = dsn_mod.default_sqlite_path()
        store = Store(
            f"sqlite:///{path}",
            str(path),
            sqlite=True,
            source="default",
            default_file=path,
            notes=notes,
        )
    else:
        url = dsn_mod.normalize(found.value)
        if dsn_mod.is_sqlite(url):
            dsn_mod.check_sqlite(url, found.source)
            store = Store(url, url, sqlite=True, source=found.source)
        else:
            scheme = url.split("://", 1)[0].lower() if "://" in url else None
            if scheme is not None and scheme not in ("postgresql", "postgres"):
                raise ConfigurationError(
                    f"pylease: {found.source} is a {scheme}:// URL; pylease needs "
                    "postgresql://... or sqlite:///path"
                )
            dsn_mod.parse(url, found.source)
            connect = dsn_mod.with_schema(url, schema) if schema else url
            store = Store(
                connect,
                dsn_mod.redact(url),
                sqlite=False,
                source=found.source,
                base_url=url,
                schema=schema,
            )
    if store.sqlite and schema:
        message = f"{schema_source} applies to PostgreSQL only; {store.shown} is SQLite"
        raise fail(message, EXIT_USAGE if schema_source == "--schema" else EXIT_CONFIG)
    if is_verbose():
        say(store.describe())
    elif store.default_file is not None and not _on_terminal(sys.stderr):
        # A cron job or a fleet's service with a lost or misspelled DSN must not run
        # "once per host" on files of their own unnoticed, even with --quiet.
        say(
            f"no database given ({NO_DSN}): using this user's SQLite file "
            f"{store.shown} (--require-dsn makes this an error)"
            + "".join(f"; {n}" for n in store.notes)
        )
    return store


NO_DSN = "--dsn, PYLEASE_DSN, DATABASE_URL"


def _on_terminal(stream: Any) -> bool:
    try:
        return stream is not None and bool(stream.isatty())
    except (OSError, ValueError):
        return False


def sqlite_module() -> Any:
    try:
        sqlite_mod = importlib.import_module("pylease.sqlite")
    except ImportError as exc:
        raise ConfigurationError(
            "pylease: the SQLite backend is not available in this installation; "
            "pass --dsn postgresql://... or set PYLEASE_DSN"
        ) from exc
    return sqlite_mod


@contextlib.contextmanager
def connect(
    store: Store, purpose: str = "pylease", connect_timeout: int = 10
) -> Iterator[tuple[Backend, Any]]:
    """A backend and its connection; closed on exit."""
    if store.sqlite:
        sqlite_mod = sqlite_module()
        conn = sqlite_mod.connect(store.url)
        try:
            yield sqlite_mod.SqliteBackend(conn), conn
        finally:
            conn.close()
        return
    import psycopg

    from pylease.postgres import PostgresBackend

    try:
        # No prepared statements: a pooler in transaction mode may sit in between.
        pg = psycopg.connect(
            store.url,
            autocommit=True,
            prepare_threshold=None,
            connect_timeout=connect_timeout,
            application_name=purpose,
        )
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            f"pylease: cannot connect to {store.shown}: {first_line(exc)}"
        ) from exc
    try:
        yield PostgresBackend(pg), pg
    finally:
        with contextlib.suppress(Exception):
            pg.close()


def server_now(store: Store, conn: Any) -> datetime:
    """The database's clock, which decides every expiry."""
    if not store.sqlite:
        from pylease.postgres import wrap_errors

        with wrap_errors():
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        if row is not None:
            now: datetime = row[0]
            return now
    return datetime.now(UTC)


def server_clock(store: Store) -> datetime:
    """The database's clock, on a connection of its own (for a line after a busy claim)."""
    if store.sqlite:
        return datetime.now(UTC)
    with connect(store, "pylease") as (_backend, conn):
        return server_now(store, conn)


def not_installed(store: Store, exc: SchemaMissing) -> str:
    """Which search_path was looked in, and where pylease is installed instead."""
    try:
        with connect(store, "pylease") as (_backend, conn):
            path = conn.execute("SELECT current_setting('search_path')").fetchone()[0]
            here = conn.execute(
                "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE p.oid = to_regprocedure('lease_claim(text, interval, text)')"
            ).fetchone()
            schemas = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT n.nspname FROM pg_proc p"
                    " JOIN pg_namespace n ON n.oid = p.pronamespace"
                    " WHERE p.proname = 'lease_claim' ORDER BY 1"
                ).fetchall()
            ]
    except Exception:
        return str(exc)
    if here is not None:  # installed, but by an older pylease than this one
        cause = exc.__cause__
        missing = getattr(getattr(cause, "diag", None), "message_primary", None) or str(exc)
        return (
            f"the pylease schema in {here[0]} is older than this pylease ({missing}): "
            "run `pylease migrate --dsn ...` to upgrade it"
        )
    message = f"pylease is not installed in the search_path ({path}) of {store.shown}"
    if schemas:
        listed = ", ".join(schemas)
        first = schemas[0]
        return (
            f"{message}; it is installed in schema {listed}: pass --schema {first} "
            f"(or set PYLEASE_SCHEMA={first}), or run `pylease migrate --dsn ...` to install "
            "it here"
        )
    return f"{message}: run `pylease migrate --dsn ...` (with --schema NAME for another schema)"


_RESTRICTED = {
    "lease_steal": ("steal leases", "lease_steal(text, interval, text, interval)"),
    "lease_prune_history": ("prune the history", "lease_prune_history(interval)"),
    "lease_prune": ("prune names", "lease_prune(interval)"),
    "lease_request_release": (
        "ask a leader to step down",
        "lease_request_release(text, text)",
    ),
}


def grant_needed(store: Store | None, exc: PyleaseError) -> str | None:
    """For a function not executable by PUBLIC: the GRANT an owner runs."""
    from psycopg import errors as pg_errors
    from psycopg import sql as pg_sql

    cause = exc.__cause__
    if store is None or store.sqlite or not isinstance(cause, pg_errors.InsufficientPrivilege):
        return None
    text = str(cause)
    function = next((f for f in _RESTRICTED if f in text), None)
    if function is None:
        return None
    what, signature = _RESTRICTED[function]
    try:
        with connect(store, "pylease") as (_backend, conn):
            row = conn.execute(
                "SELECT current_user, n.nspname FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE p.oid = to_regprocedure(%s)",
                (signature.replace(", ", ","),),
            ).fetchone()
            if row is None:
                return None
            role, where = row
            grant = (
                f"GRANT EXECUTE ON FUNCTION {pg_sql.Identifier(where).as_string(conn)}."
                f"{signature} TO {pg_sql.Identifier(role).as_string(conn)};"
            )
    except Exception:
        return None
    return (
        f"role {role} may not {what} ({function} is not executable by PUBLIC); "
        f"an owner of the schema runs: {grant}"
    )


def where(store: Store) -> str | None:
    """The file to name beside a lease, for this user's own default file."""
    return str(store.default_file) if store.default_file is not None else None
