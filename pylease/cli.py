"""The ``pylease`` command: the contract's section 3, on PostgreSQL or the embedded SQLite file.

Exit codes, for every command: 0 done; 1 busy, not held or lost; 2 usage; 3 database
or configuration error. ``pylease run`` passes its command's code through instead.
Errors are caught here, at the edge, and printed as one line (``-v`` adds the details).
What the output looks like is :mod:`pylease.render`'s business.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import shutil
import signal
import sqlite3
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from pylease import __version__, _checks, durations, render
from pylease import dsn as dsn_mod
from pylease._backend import Backend
from pylease._operations import LeaseRow
from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    LeaseBusy,
    PyleaseError,
    SchemaMissing,
)
from pylease.leasing import default_holder

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3

EXAMPLES = f"""\
\b
Examples:
  pylease migrate --dsn postgresql://app@db/app     # at deploy
  pylease run report --ttl 10m --busy-exit 0 -- ./report.sh   # in cron
  pylease claim sweep --ttl 5m --wait 30s           # prints HOLDER<tab>FENCE
  pylease renew sweep --holder "$holder" --ttl 5m
  pylease release sweep --holder "$holder"
  pylease status                                    # who holds what
  pylease steal sweep --ttl 5m --holder ops --older-than 10m   # break a lock

\b
The database is --dsn, else $PYLEASE_DSN, else $DATABASE_URL, else this user's
SQLite file in $XDG_STATE_HOME/pylease (~/.local/state/pylease), created on first
use. PGHOST and the other libpq variables only fill in a postgresql:// URL:
PYLEASE_DSN=postgresql:// uses them. One file for the host:
PYLEASE_DSN={dsn_mod.HOST_WIDE}
-v says which database a command used, and why.
Durations: 250ms, 30s, 5m, 1h30m, or plain seconds; --wait also takes forever.
Exit codes: 0 done; 1 busy, not held or lost; 2 usage; 3 database or
configuration error. `pylease run CMD` exits with CMD's code.
"""

_verbose = False


# Help and usage that read as the README promises ----------------------------------


# Click's UsageError, whether typer vendors click or depends on it.
_UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)


def _usage_error_in_one_line(error: Any, ctx: Any) -> None:
    """Click prints usage, a hint and the error on four lines; a script wants one."""
    if type(error).__name__ == "NoArgsIsHelpError":
        return
    where = ctx.command_path if ctx is not None else "pylease"
    message = error.format_message().rstrip(".")

    def show(file: Any = None) -> None:
        typer.echo(f"pylease: {message} (see '{where} --help')", err=True)

    error.show = show


def _no_type(ctx: Any) -> str | None:
    return None


def _pieces(shown: str) -> Callable[[Any], list[str]]:
    return lambda ctx: [shown]


class _Command(TyperCommand):
    """Help without Python types (``NAME <str>``) and a usage line a user would write."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument):
                shown = param.metavar or param.name or ""
                param.display_type_rich = _no_type  # type: ignore[method-assign]
                param.get_usage_pieces = _pieces(shown)  # type: ignore[method-assign,assignment]

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _UsageError as error:
            _usage_error_in_one_line(error, getattr(error, "ctx", None))
            raise


class _Group(TyperGroup):
    """Commands in the order a newcomer needs them; one-line usage errors."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _UsageError as error:
            _usage_error_in_one_line(error, getattr(error, "ctx", None))
            raise

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as error:
            _usage_error_in_one_line(error, ctx)
            raise


app = typer.Typer(
    name="pylease",
    cls=_Group,
    help="Leases (locks with an expiry) arbitrated by PostgreSQL, or a local SQLite file.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _command(**kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return app.command(cls=_Command, **kwargs)


# Options -------------------------------------------------------------------


def _duration(
    option: str, *, positive: bool = False, forever: bool = False
) -> Callable[[Any], timedelta]:
    def parse(value: Any) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            span = durations.parse(str(value), forever=forever)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        if span == durations.FOREVER:
            return span
        if positive and span <= timedelta(0):
            raise typer.BadParameter(f"{option} must be positive")
        if span > _checks.MAX_TTL:
            raise typer.BadParameter(f"{option} must be at most 366 days")
        return span

    return parse


DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        metavar="URL",
        help="postgresql://... or sqlite:///path; default: $PYLEASE_DSN, else $DATABASE_URL, "
        "else the embedded SQLite file.",
        show_default=False,
    ),
]
SchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        metavar="NAME",
        help="The PostgreSQL schema pylease is installed in; default: $PYLEASE_SCHEMA, "
        "else the search_path.",
        show_default=False,
    ),
]
NameArg = Annotated[
    str, typer.Argument(metavar="NAME", help="The lease's name.", show_default=False)
]
TtlOption = Annotated[
    timedelta,
    typer.Option(
        "--ttl",
        metavar="DUR",
        parser=_duration("--ttl", positive=True),
        help="Lease time.",
        show_default=False,
    ),
]
HolderOption = Annotated[
    str,
    typer.Option(
        "--holder",
        metavar="H",
        help="The holder, as `claim` printed it.",
        show_default=False,
    ),
]
WaitOption = Annotated[
    timedelta,
    typer.Option(
        "--wait",
        metavar="DUR",
        parser=_duration("--wait", forever=True),
        help="Keep trying this long while the lease is busy (forever: no deadline).  [default: 0]",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="Say which database is used and why; show an error's details."
    ),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pylease {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
    verbose: VerboseOption = False,
) -> None:
    """Leases (locks with an expiry) arbitrated by PostgreSQL, or a local SQLite file."""
    global _verbose
    _verbose = verbose


# Errors, at the edge ---------------------------------------------------------


_say = render.say


def _fail(message: str, code: int = EXIT_CONFIG) -> typer.Exit:
    _say(message)
    return typer.Exit(code)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


@dataclass
class _Edge:
    """What the edge knows about the command, to explain a failure well."""

    store: Store | None = None


@contextlib.contextmanager
def _edge(verbose: bool) -> Iterator[_Edge]:
    """One line per error, no traceback unless -v; the exit code says what kind."""
    global _verbose
    _verbose = _verbose or verbose
    edge = _Edge()
    try:
        yield edge
    except (typer.Exit, typer.Abort, typer.BadParameter):
        raise
    except KeyboardInterrupt:
        raise _fail("interrupted", 130) from None
    except Exception as exc:
        if _verbose:
            traceback.print_exception(exc, file=sys.stderr)
        if isinstance(exc, InvalidArgument):
            raise _fail(str(exc), EXIT_USAGE) from None
        if isinstance(exc, SchemaMissing) and edge.store is not None and not edge.store.sqlite:
            raise _fail(_not_installed(edge.store, exc), EXIT_CONFIG) from None
        if isinstance(exc, PyleaseError):
            grant = _grant_needed(edge.store, exc)
            raise _fail(grant or str(exc), EXIT_CONFIG) from None
        if isinstance(exc, sqlite3.Error):
            raise _fail(f"SQLite error: {_first_line(exc)}", EXIT_CONFIG) from None
        if isinstance(exc, OSError):
            raise _fail(_first_line(exc), EXIT_CONFIG) from None
        raise _fail(
            f"unexpected {type(exc).__name__}: {_first_line(exc)} (rerun with -v for details)",
            EXIT_CONFIG,
        ) from None


def _key(parameter: str, value: str) -> str:
    try:
        return _checks.key(parameter, value)
    except InvalidArgument as exc:
        raise _fail(str(exc), EXIT_USAGE) from None


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
            why = "the embedded default: none of --dsn, PYLEASE_DSN, DATABASE_URL is set"
        else:
            why = f"from {self.source}"
        schema = f", schema {self.schema}" if self.schema else ""
        return f"using {kind} {self.shown}{schema} ({why})" + "".join(f"; {n}" for n in self.notes)


def _schema(explicit: str | None) -> tuple[str | None, str]:
    if explicit:
        return explicit, "--schema"
    value = os.environ.get(dsn_mod.SCHEMA_VAR)
    return (value, dsn_mod.SCHEMA_VAR) if value else (None, "")


def _store(explicit: str | None, schema_option: str | None = None) -> Store:
    found = dsn_mod.find(explicit)
    schema, schema_source = _schema(schema_option)
    if found.value is None:
        path = dsn_mod.default_sqlite_path()
        hints = [v for v in dsn_mod.LIBPQ_HINTS if os.environ.get(v)]
        notes: tuple[str, ...] = ()
        if hints:
            notes = (
                f"{', '.join(hints)} {'is' if len(hints) == 1 else 'are'} set, but libpq "
                "variables only fill in a postgresql:// URL: PYLEASE_DSN=postgresql:// "
                "uses them",
            )
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
        raise _fail(message, EXIT_USAGE if schema_source == "--schema" else EXIT_CONFIG)
    if _verbose:
        _say(store.describe())
    return store


def _sqlite_module() -> Any:
    try:
        sqlite_mod = importlib.import_module("pylease.sqlite")
    except ImportError as exc:
        raise ConfigurationError(
            "pylease: the SQLite backend is not available in this installation; "
            "pass --dsn postgresql://... or set PYLEASE_DSN"
        ) from exc
    return sqlite_mod


@contextlib.contextmanager
def _open(
    store: Store, purpose: str = "pylease", connect_timeout: int = 10
) -> Iterator[tuple[Backend, Any]]:
    """A backend and its connection; closed on exit."""
    if store.sqlite:
        sqlite_mod = _sqlite_module()
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
            f"pylease: cannot connect to {store.shown}: {_first_line(exc)}"
        ) from exc
    try:
        yield PostgresBackend(pg), pg
    finally:
        with contextlib.suppress(Exception):
            pg.close()


def _now(store: Store, conn: Any) -> datetime:
    """The database's clock, which decides every expiry."""
    if not store.sqlite:
        from pylease.postgres import wrap_errors

        with wrap_errors():
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        if row is not None:
            now: datetime = row[0]
            return now
    return datetime.now(UTC)


def _clock(store: Store) -> datetime:
    """The database's clock, on a connection of its own (for a line after a busy claim)."""
    if store.sqlite:
        return datetime.now(UTC)
    with _open(store, "pylease") as (_backend, conn):
        return _now(store, conn)


def _not_installed(store: Store, exc: SchemaMissing) -> str:
    """Which search_path was looked in, and where pylease is installed instead."""
    try:
        with _open(store, "pylease") as (_backend, conn):
            path = conn.execute("SELECT current_setting('search_path')").fetchone()[0]
            here = conn.execute(
                "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE p.oid = to_regproc('lease_claim')"
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
}


def _grant_needed(store: Store | None, exc: PyleaseError) -> str | None:
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
        with _open(store, "pylease") as (_backend, conn):
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


def _where(store: Store) -> str | None:
    """The file to name beside a lease, for this user's own default file."""
    return str(store.default_file) if store.default_file is not None else None


def _seconds(wait: timedelta) -> float:
    return math.inf if wait == durations.FOREVER else wait.total_seconds()


def _options(
    name: str, ttl: timedelta, holder: str, wait: timedelta, min_hold: timedelta | None = None
) -> Any:
    from pylease._held import options

    opts = options(
        name,
        ttl,
        holder=holder,
        wait=0,
        heartbeat=True,
        on_lost=None,
        min_hold=min_hold,
        poll_interval=None,
    )
    # _validate caps a wait at 366 days; ``--wait forever`` has no deadline at all.
    return opts._replace(wait=_seconds(wait))


class _Busy:
    """The spinner, and the row that last stood in the way (for the busy line)."""

    def __init__(self, show: Callable[[LeaseRow | None], None]) -> None:
        self.row: LeaseRow | None = None
        self._show = show

    def __call__(self, row: LeaseRow | None) -> None:
        self.row = row
        self._show(row)


def _width(wide: bool) -> int | None:
    """The terminal's width (``COLUMNS`` first); None (no limit) for --wide or a pipe."""
    if wide:
        return None
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


# Commands, in the order a newcomer needs them ------------------------------------


@_command(
    epilog="Exit codes: the command's own; 128+N when signal N killed it; 127 command not "
    "found; 126 not executable; 75 the lease was lost while it ran; --busy-exit (default 1) "
    "when the lease stayed busy; 2 usage; 3 database or configuration error.",
)
def run(
    name: NameArg,
    cmd: Annotated[
        list[str],
        typer.Argument(
            metavar="-- CMD [ARG...]",
            help="The command to run under the lease.",
            show_default=False,
        ),
    ],
    ttl: TtlOption,
    wait: WaitOption = timedelta(0),
    holder: Annotated[
        str | None,
        typer.Option(
            "--holder",
            metavar="H",
            help="Who claims; default: HOST:PID:RANDOM.",
            show_default=False,
        ),
    ] = None,
    busy_exit: Annotated[
        int,
        typer.Option(
            "--busy-exit",
            metavar="N",
            help="Exit code when busy (0 to 255); cron users pass 0.  [default: 1]",
            min=0,
            max=255,
            show_default=False,
        ),
    ] = 1,
    min_hold: Annotated[
        timedelta | None,
        typer.Option(
            "--min-hold",
            metavar="DUR",
            parser=_duration("--min-hold"),
            help="Passed to the release: at most one run per period.",
            show_default=False,
        ),
    ] = None,
    kill_after: Annotated[
        timedelta,
        typer.Option(
            "--kill-after",
            metavar="DUR",
            parser=_duration("--kill-after"),
            help="After a lost lease's SIGTERM, SIGKILL the command this much later;"
            " never later than the lease's local expiry, whatever this says.  [default: 10s]",
            show_default=False,
        ),
    ] = timedelta(seconds=10),
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Say nothing when the lease is busy.")
    ] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run CMD while holding the lease NAME, renewing it; skip CMD when the lease is busy.

    CMD sees PYLEASE_NAME, PYLEASE_HOLDER, PYLEASE_FENCE and PYLEASE_DSN. SIGINT, SIGTERM
    and SIGHUP are passed on to it. If the lease is lost, CMD gets SIGTERM, then SIGKILL
    after --kill-after or at the lease's local expiry, whichever comes first, and pylease
    exits 75.

    Example: pylease run nightly-report --ttl 10m --busy-exit 0 -- ./report.sh --full
    """
    from pylease import runner
    from pylease.errors import LeaseLost
    from pylease.leasing import Lease

    with _edge(verbose) as edge:
        _key("name", name)
        holder = _key("holder", holder) if holder is not None else default_holder()
        edge.store = store = _store(dsn, schema)
        lost = threading.Event()
        why: list[str] = []

        def on_lost(error: LeaseLost) -> None:  # on the heartbeat's thread
            why.append(str(error))
            lost.set()

        opts = _options(name, ttl, holder, wait, min_hold)
        # One claim per attempt, by the library's own wait loop, on the lease that
        # then stays held: no claim of our own first.
        holding = Lease(store.url, opts, on_lost=on_lost, heartbeat_target=None)
        entered = False
        try:
            # From here to the child's start a signal ends pylease cleanly; once the
            # child runs, supervise() passes signals on to it.
            with runner.signals_raise():
                with render.spinner(name, quiet) as show:
                    busy = holding.on_busy = _Busy(show)
                    try:
                        held = holding.__enter__()
                        fence = held.fence
                        entered = True
                    except LeaseBusy:
                        if not quiet:
                            _say(render.busy_line(name, busy.row, _clock(store), _where(store)))
                        raise typer.Exit(busy_exit) from None
                env = dict(os.environ)
                env.update(
                    PYLEASE_NAME=name,
                    PYLEASE_HOLDER=holder,
                    PYLEASE_FENCE=str(fence),
                    PYLEASE_DSN=store.url,
                )
                if store.schema:
                    env[dsn_mod.SCHEMA_VAR] = store.schema
                outcome = runner.supervise(
                    cmd,
                    env,
                    lost=lost,
                    kill_after=kill_after.total_seconds(),
                    say=_say,
                    why_lost=lambda: why[0] if why else f"lease {name!r} was lost",
                    remaining=runner.time_left(held),
                )
        except runner.Signalled as sig:
            if entered:
                with contextlib.suppress(Exception):
                    holding.__exit__(None, None, None)
            raise typer.Exit(128 + sig.signum) from None
        code = runner.LOST if outcome.lost else outcome.code
        if outcome.lost and not _log.failing(name):
            # The command is stopped already: now there is time to ask who has the lease.
            taken = _taken_by(store, name, holder, fence)
            if taken:
                _say(taken)
        try:
            holding.__exit__(None, None, None)  # releases, with --min-hold
        except LeaseLost as exc:
            if not outcome.lost:
                _say(f"{exc}; {cmd[0]} ran to its end without it")
                code = runner.LOST
        except PyleaseError as exc:
            _say(f"could not release lease {name!r}, it stays held until it expires: {exc}")
    raise typer.Exit(code)


def _taken_by(store: Store, name: str, holder: str, fence: int) -> str | None:
    """Who holds the lease we lost, and how they got it; None if that cannot be told."""
    try:
        with _open(store, "pylease run", connect_timeout=3) as (backend, conn):
            row = next(iter(backend.status(name)), None)
            if row is None or (row.holder == holder and row.fence == fence) or not row.held:
                return None
            events = backend.history(name, None, 1)
            return render.taken_line(name, row, events[0] if events else None, _now(store, conn))
    except Exception:
        return None  # the loss was said already; this is only its detail


@_command()
def migrate(
    dsn: DsnOption = None,
    schema: Annotated[
        str | None,
        typer.Option(
            "--schema",
            metavar="NAME",
            help="PostgreSQL schema to install into; default: $PYLEASE_SCHEMA, else public.",
            show_default=False,
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Install or upgrade the pylease schema (idempotent; safe to run from two deploys at once).

    Example: pylease migrate --dsn postgresql://app@db/app
    """
    with _edge(verbose) as edge:
        edge.store = store = _store(dsn, schema)
        if store.sqlite:
            path = _sqlite_module().path_of(store.url)
            existed = path.exists()
            with _open(store, "pylease migrate"):
                pass  # connecting creates the file and applies its migrations
            typer.echo(f"pylease: {path} is up to date" if existed else f"pylease: created {path}")
            return
        from pylease.migrate import migrate as run_migrate

        run_migrate(
            store.base_url,
            store.schema or "public",
            say=lambda line: typer.echo(f"pylease: {render.strip_prefix(line)}"),
        )


@_command()
def claim(
    name: NameArg,
    ttl: TtlOption,
    holder: Annotated[
        str | None,
        typer.Option(
            "--holder",
            metavar="H",
            help="Who claims; default: HOST:PID:RANDOM, printed for the script to keep.",
            show_default=False,
        ),
    ] = None,
    wait: WaitOption = timedelta(0),
    as_json: JsonOption = False,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="No busy line on stderr (the exit code still says)."),
    ] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Claim a lease and print HOLDER<tab>FENCE; exit 1 if another holder has it.

    Example: read -r holder fence < <(pylease claim sweep --ttl 5m)
    """
    from pylease._links import link
    from pylease.leasing import acquire

    with _edge(verbose) as edge:
        _key("name", name)
        holder = _key("holder", holder) if holder is not None else default_holder()
        edge.store = store = _store(dsn, schema)
        opts = _options(name, ttl, holder, wait)
        fence: int | None = None
        mine: LeaseRow | None = None
        link_ = link(store.url)
        try:
            with render.spinner(name, quiet or as_json) as show:
                busy = _Busy(show)
                try:
                    fence, _sent = acquire(link_, opts, holder, want_holder=True, on_busy=busy)
                except LeaseBusy:
                    fence = None
            if fence is not None:
                rows = link_.run(lambda b: b.status(name), name=name)
                mine = next(iter(rows), None)
        finally:
            link_.close()
        standing = mine or busy.row
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "name": name,
                        "claimed": fence is not None,
                        "holder": holder,
                        "fence": fence,
                        "expires_at": render.iso(mine.expires_at) if mine else None,
                        "held_by": standing.holder if standing else None,
                    }
                )
            )
        if fence is None:
            if not as_json and not quiet:
                _say(render.busy_line(name, busy.row, _clock(store), _where(store)))
            raise typer.Exit(EXIT_NO)
        if not as_json:
            typer.echo(f"{holder}\t{fence}")


@_command()
def renew(
    name: NameArg,
    holder: HolderOption,
    ttl: Annotated[
        timedelta | None,
        typer.Option(
            "--ttl",
            metavar="DUR",
            parser=_duration("--ttl", positive=True),
            help="New lease time; default: the last one granted.",
            show_default=False,
        ),
    ] = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Extend a lease this holder still holds; exit 1 if it was released or taken.

    Example: pylease renew sweep --holder "$holder" --ttl 5m
    """
    with _edge(verbose) as edge:
        _key("name", name)
        _key("holder", holder)
        edge.store = store = _store(dsn, schema)
        with _open(store, "pylease renew") as (backend, _conn):
            renewed = backend.renew(name, holder, ttl)
        if not renewed:
            raise _fail(f"lease {name!r} is not held by {holder} any more", EXIT_NO)


@_command()
def release(
    name: NameArg,
    holder: HolderOption,
    min_hold: Annotated[
        timedelta | None,
        typer.Option(
            "--min-hold",
            metavar="DUR",
            parser=_duration("--min-hold"),
            help="Keep the name unavailable until this long after the claim.",
            show_default=False,
        ),
    ] = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Give a lease back (only this holder's); exit 1 if it was not held by this holder.

    Example: pylease release sweep --holder "$holder"
    """
    with _edge(verbose) as edge:
        _key("name", name)
        _key("holder", holder)
        edge.store = store = _store(dsn, schema)
        with _open(store, "pylease release") as (backend, _conn):
            released = backend.release(name, holder, min_hold)
        if not released:
            raise _fail(f"lease {name!r} was not held by {holder}", EXIT_NO)


@_command()
def steal(
    name: NameArg,
    ttl: TtlOption,
    holder: Annotated[
        str,
        typer.Option(
            "--holder",
            metavar="H",
            help="The NEW holder: who takes the lease (e.g. ops). A steal with the current "
            "holder's own token only bumps the fence: it stops nothing.",
            show_default=False,
        ),
    ],
    older_than: Annotated[
        timedelta,
        typer.Option(
            "--older-than",
            metavar="DUR",
            parser=_duration("--older-than"),
            help="Only if its holder last claimed or renewed at least this long ago.  [default: 0]",
            show_default=False,
        ),
    ] = timedelta(0),
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Take a lease whatever its state (an operator's break-lock) and print HOLDER<tab>FENCE.

    Exit 1 if its holder renewed more recently than --older-than. The lease's holder
    learns at its next renewal that the lease is lost (pylease run stops its command).

    Example: pylease steal sweep --ttl 5m --holder ops --older-than 10m
    """
    with _edge(verbose) as edge:
        _key("name", name)
        _key("holder", holder)
        edge.store = store = _store(dsn, schema)
        with _open(store, "pylease steal") as (backend, conn):
            fence = backend.steal(name, ttl, holder, older_than)
            row = next(iter(backend.status(name)), None) if fence is None else None
            now = _now(store, conn)
        if fence is None:
            renewed = (
                durations.relative(now - render.aware(row.renewed_at), "{} ago", "in {}")
                if row
                else "recently"
            )
            raise _fail(
                f"lease {name!r} not stolen: "
                f"{render.printable(row.holder) if row else 'its holder'} "
                f"renewed it {renewed}, less than --older-than",
                EXIT_NO,
            )
        typer.echo(f"{holder}\t{fence}")


@_command()
def status(
    name: Annotated[
        str | None,
        typer.Argument(metavar="[NAME]", help="One lease; default: all.", show_default=False),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of objects with ISO-8601 times.")
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Show holders whole, whatever the terminal's width.")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Redraw as leases change, until Ctrl-C.")
    ] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Show every lease (or one): state, holder, fence, how long, and when it expires.

    STATE is held, resting (released with a min-hold that has not run out), released or
    expired (its holder died or stalled). AGE: held for, or free since. Fits the
    terminal: holders are shortened in the middle, names never (--wide: whole).

    Example: pylease status --json | jq '.[] | select(.state == "held")'
    """
    with _edge(verbose) as edge:
        if name is not None:
            _key("name", name)
        edge.store = store = _store(dsn, schema)
        if watch:
            if as_json:
                raise _fail("--watch draws a table; leave out --json", EXIT_USAGE)
            _watch(store, name, wide)
            return
        with _open(store, "pylease status") as (backend, conn):
            rows = backend.status(name)
            now = _now(store, conn)
        if as_json:
            typer.echo(json.dumps([render.row_json(r) for r in rows]))
            return
        typer.echo("\n".join(_status_lines(store, name, rows, now, wide)))


def _status_lines(
    store: Store, name: str | None, rows: list[LeaseRow], now: datetime, wide: bool
) -> list[str]:
    head = []
    if store.default_file is not None:
        head.append(f"leases in {store.default_file} (this user's default SQLite file)")
    if not rows:
        what = f"no lease named {name!r}" if name else f"no leases yet in {store.shown}"
        return [*head, what]
    return [*head, *render.table(rows, now, _width(wide))]


def _watch(store: Store, name: str | None, wide: bool) -> None:
    """Redraw until Ctrl-C: woken by a release's NOTIFY on PostgreSQL, polling on SQLite."""
    from pylease._links import Listener

    listener = None if store.sqlite else Listener.open(store.url, name or "")
    stop = threading.Event()

    def wake(timeout: float) -> None:
        conn = listener.conn if listener is not None else None
        if conn is None:
            stop.wait(timeout)
            return
        for _ in conn.notifies(timeout=timeout, stop_after=1):
            pass

    try:
        with _open(store, "pylease status --watch") as (backend, conn):

            def draw() -> list[str]:
                return _status_lines(store, name, backend.status(name), _now(store, conn), wide)

            for frame in render.watch_frames(draw, wake, sys.stdout.isatty()):
                typer.echo(frame)
    except KeyboardInterrupt:
        pass
    finally:
        if listener is not None:
            listener.close()


@_command()
def history(
    name: Annotated[
        str | None,
        typer.Argument(metavar="[NAME]", help="One lease; default: all.", show_default=False),
    ] = None,
    since: Annotated[
        timedelta | None,
        typer.Option(
            "--since",
            metavar="DUR",
            parser=_duration("--since"),
            help="Only events at most this old.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            metavar="N",
            min=1,
            max=10000,
            help="At most N events (1 to 10000).  [default: 100]",
            show_default=False,
        ),
    ] = 100,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of objects with ISO-8601 times.")
    ] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Show holders whole.")] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Show what happened to leases, newest first: takeovers and steals (and, with
    pylease.history = 'all', claims and releases).

    Example: pylease history sweep --since 1d
    """
    with _edge(verbose) as edge:
        if name is not None:
            _key("name", name)
        edge.store = store = _store(dsn, schema)
        with _open(store, "pylease history") as (backend, conn):
            now = _now(store, conn)
            # A span back from the database's own now: one clock.
            events = backend.history(name, since, limit)
        if as_json:
            typer.echo(
                json.dumps(
                    [
                        {
                            "at": render.iso(e.at),
                            "name": e.name,
                            "event": e.event,
                            "holder": e.holder,
                            "fence": e.fence,
                            "previous_holder": e.previous_holder,
                        }
                        for e in events
                    ]
                )
            )
            return
        if not events:
            typer.echo("no events" + (f" for lease {name!r}" if name else ""))
            return
        typer.echo("\n".join(render.history_lines(events, now, _width(wide))))


@_command(name="prune-history")
def prune_history(
    older_than: Annotated[
        timedelta,
        typer.Option(
            "--older-than",
            metavar="DUR",
            parser=_duration("--older-than"),
            help="Delete the events older than this.",
            show_default=False,
        ),
    ],
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Delete old history events and print how many; the counters are never pruned.

    Example: pylease prune-history --older-than 90d
    """
    with _edge(verbose) as edge:
        edge.store = store = _store(dsn, schema)
        with _open(store, "pylease prune-history") as (backend, _conn):
            removed = backend.prune_history(older_than)
        typer.echo(f"removed {removed} event{'' if removed == 1 else 's'}")


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host.strip("[]") or "0.0.0.0", int(port)


@_command()
def metrics(
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Serve /metrics here (e.g. 127.0.0.1:9464) until interrupted.",
            show_default=False,
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option("--once", help="Print the metrics once (node_exporter's textfile collector)."),
    ] = False,
    names: Annotated[
        list[str] | None,
        typer.Option(
            "--names",
            metavar="PATTERN",
            help="Only leases whose name matches (shell-style, e.g. 'sweep-*'); repeatable.",
            show_default=False,
        ),
    ] = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Leases as Prometheus metrics: held, seconds to expiry, fence, held for, and the
    grants, takeovers, steals and releases counters, each labelled with the lease name.

    Example: pylease metrics --listen 127.0.0.1:9464
    """
    with _edge(verbose) as edge:
        if (listen is None) == (not once):
            raise _fail("give one of --listen HOST:PORT and --once", EXIT_USAGE)
        address = _listen_address(listen) if listen is not None else None
        edge.store = store = _store(dsn, schema)
        try:
            from pylease import metrics as metrics_mod
        except ImportError:
            raise _fail(
                "pylease metrics needs prometheus-client: pip install 'pylease[metrics]'",
                EXIT_CONFIG,
            ) from None

        def read() -> tuple[list[LeaseRow], list[Any], datetime]:
            with _open(store, "pylease metrics") as (backend, conn):
                rows = backend.status(None)
                counters = backend.counters(None)
                return rows, counters, _now(store, conn)

        if once:
            read()  # an error here is this command's own: loud, exit 3
            typer.echo(metrics_mod.text(metrics_mod.LeaseCollector(read, names or ())), nl=False)
            return
        assert address is not None
        told: list[str] = []

        def on_error(exc: Exception) -> None:
            line = render.strip_prefix(_first_line(exc))
            if not told or told[-1] != line:
                _say(f"reading the leases failed (pylease_up 0): {line}")
            told[:] = [line]

        collector = metrics_mod.LeaseCollector(read, names or (), on_error)

        def ready(host: str, port: int) -> None:
            shown = f"[{host}]" if ":" in host else host
            _say(f"serving metrics on http://{shown}:{port}/metrics ({store.shown})")

        signal.signal(signal.SIGTERM, _interrupt)
        try:
            metrics_mod.serve(collector, address[0], address[1], ready)
        except KeyboardInterrupt:
            return
        except OSError as exc:
            raise _fail(f"cannot listen on {listen}: {exc.strerror or exc}", EXIT_CONFIG) from None


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt  # a service manager's stop: end as Ctrl-C does, exit 0


# The library's log as stderr lines; attached by main(), not at import.
_log = render.StderrLog(lambda: _verbose)


def main() -> None:
    """Entry point of the ``pylease`` script (also ``python -m pylease``)."""
    # Here rather than in the app, so that an application embedding it keeps its logging.
    library = logging.getLogger("pylease")
    library.addHandler(_log)
    library.setLevel(logging.DEBUG)
    app()


# `pylease leader` is leader election's (pylease/leader_cli.py), on `run` above.
from pylease import leader_cli  # noqa: E402

app.command(name="leader", epilog=leader_cli.EPILOG)(leader_cli.leader)
