"""The ``pylease`` command: the contract's section 3, on PostgreSQL or the embedded SQLite file.

Exit codes, for every command: 0 done; 1 busy, not held or lost; 2 usage; 3 database
or configuration error. ``pylease run`` passes its command's code through instead.
Errors are caught here, at the edge, and printed as one line (``-v`` adds the details).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from pylease import __version__, _validate, durations
from pylease import dsn as dsn_mod
from pylease._backend import Backend, LeaseRow
from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    PyleaseError,
)
from pylease.leasing import default_holder

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3

EXAMPLES = """\
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
The database is --dsn, else $PYLEASE_DSN, else $DATABASE_URL, else a SQLite
file in $XDG_STATE_HOME/pylease, created on first use.
Durations: 250ms, 30s, 5m, 1h30m, or plain seconds.
Exit codes: 0 done; 1 busy, not held or lost; 2 usage; 3 database or
configuration error. `pylease run CMD` exits with CMD's code.
"""

app = typer.Typer(
    name="pylease",
    help="Leases (locks with an expiry) arbitrated by PostgreSQL, or a local SQLite file.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_verbose = False


# Options -------------------------------------------------------------------


def _duration(option: str, *, positive: bool = False) -> Callable[[Any], timedelta]:
    def parse(value: Any) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            span = durations.parse(str(value))
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        if positive and span <= timedelta(0):
            raise typer.BadParameter(f"{option} must be positive")
        if option == "--ttl" and span > _validate.MAX_TTL:
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
NameArg = Annotated[
    str, typer.Argument(metavar="NAME", help="The lease's name.", show_default=False)
]
TtlOption = Annotated[
    timedelta,
    typer.Option(
        "--ttl", metavar="DUR", parser=_duration("--ttl", positive=True), help="Lease time."
    ),
]
HolderOption = Annotated[
    str,
    typer.Option("--holder", metavar="H", help="Who holds the lease (as `claim` printed it)."),
]
WaitOption = Annotated[
    timedelta,
    typer.Option(
        "--wait",
        metavar="DUR",
        parser=_duration("--wait"),
        help="Keep trying this long while the lease is busy.",
        show_default="0",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show the details of an error.")
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


def _say(message: str) -> None:
    typer.echo(message if message.startswith("pylease:") else f"pylease: {message}", err=True)


def _fail(message: str, code: int = EXIT_CONFIG) -> typer.Exit:
    _say(message)
    return typer.Exit(code)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


@contextlib.contextmanager
def _edge(verbose: bool) -> Iterator[None]:
    """One line per error, no traceback unless -v; the exit code says what kind."""
    try:
        yield
    except (typer.Exit, typer.Abort, typer.BadParameter):
        raise
    except KeyboardInterrupt:
        raise _fail("interrupted", 130) from None
    except Exception as exc:
        if verbose or _verbose:
            traceback.print_exception(exc, file=sys.stderr)
        if isinstance(exc, InvalidArgument):
            raise _fail(str(exc), EXIT_USAGE) from None
        if isinstance(exc, PyleaseError):
            raise _fail(str(exc), EXIT_CONFIG) from None
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
        return _validate.key(parameter, value)
    except InvalidArgument as exc:
        raise _fail(str(exc), EXIT_USAGE) from None


# The database ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where the leases are: the real URL (never printed) and how to name it in messages."""

    url: str
    shown: str
    sqlite: bool


def _target(explicit: str | None) -> Target:
    url = dsn_mod.from_environment(explicit)
    if url is None:
        sqlite_mod = _sqlite_module()
        path = sqlite_mod.default_path()
        return Target(f"sqlite:///{path}", str(path), sqlite=True)
    if dsn_mod.is_sqlite(url):
        return Target(url, url, sqlite=True)
    scheme = url.split("://", 1)[0].lower() if "://" in url else None
    if scheme is not None and scheme not in ("postgresql", "postgres"):
        source = "--dsn" if explicit else next(v for v in dsn_mod.ENV_VARS if os.environ.get(v))
        raise ConfigurationError(
            f"pylease: {source} is a {scheme}:// URL; pylease needs postgresql://... "
            "or sqlite:///path"
        )
    dsn_mod.parse(url)  # ConfigurationError, without echoing the string, if malformed
    return Target(url, dsn_mod.redact(url), sqlite=False)


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
def _open(target: Target, purpose: str = "pylease") -> Iterator[tuple[Backend, Any]]:
    """A backend and its connection; closed on exit."""
    if target.sqlite:
        sqlite_mod = _sqlite_module()
        conn = sqlite_mod.connect(target.url)
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
            target.url,
            autocommit=True,
            prepare_threshold=None,
            connect_timeout=10,
            application_name=purpose,
        )
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            f"pylease: cannot connect to {target.shown}: {_first_line(exc)}"
        ) from exc
    try:
        yield PostgresBackend(pg), pg
    finally:
        with contextlib.suppress(Exception):
            pg.close()


def _now(target: Target, conn: Any) -> datetime:
    """The database's clock, which decides every expiry."""
    if not target.sqlite:
        from pylease.postgres import wrap_errors

        with wrap_errors():
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        if row is not None:
            now: datetime = row[0]
            return now
    return datetime.now(UTC)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _current(backend: Backend, name: str) -> LeaseRow | None:
    rows = backend.status(name)
    return rows[0] if rows else None


def _claim_waiting(
    backend: Backend,
    conn: Any,
    target: Target,
    name: str,
    ttl: timedelta,
    holder: str,
    wait: timedelta,
    on_busy: Callable[[LeaseRow | None], None] = lambda _row: None,
) -> tuple[int | None, LeaseRow | None]:
    """Claim, retrying for up to ``wait``: woken by NOTIFY on PostgreSQL, by polling on SQLite.

    Returns the fence (None when still busy) and the row that stood in the way.
    """
    deadline = time.monotonic() + wait.total_seconds()
    listening = False
    while True:
        fence = backend.claim(name, ttl, holder)
        if fence is not None:
            return fence, None
        row = _current(backend, name)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, row
        on_busy(row)
        # Woken by a release's NOTIFY; an expiry sends none, so look again at the
        # holder's expiry, and every second in any case.
        pause = min(remaining, 1.0)
        if row is not None:
            until_expiry = (_aware(row.expires_at) - datetime.now(UTC)).total_seconds()
            pause = min(pause, max(until_expiry, 0.1))
        if target.sqlite:
            time.sleep(min(pause, 0.2))
            continue
        if not listening:
            from pylease.postgres import wrap_errors

            with wrap_errors(name):
                conn.execute("LISTEN pylease")
            listening = True
            continue  # claim once more: a release may have come before the LISTEN
        from pylease.postgres import wrap_errors

        with wrap_errors(name):
            for _ in conn.notifies(timeout=pause, stop_after=1):
                pass


def _printable(text: str) -> str:
    """``text`` with control and invisible characters spelled out (``\\x1b``, ``\\u200b``).

    Names and holders come from whoever claimed: shown, they must not drive the
    terminal, nor hide how two look-alike holders differ.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _busy_line(name: str, row: LeaseRow | None, now: datetime) -> str:
    if row is None:
        return f"lease {name!r} is busy"
    if row.held:
        left = durations.relative(_aware(row.expires_at) - now, "expires in {}", "expired {} ago")
        return f"lease {name!r} is held by {_printable(row.holder)} (fence {row.fence}, {left})"
    left = durations.relative(_aware(row.expires_at) - now, "claimable in {}", "free {} ago")
    by = _printable(row.holder)
    return f"lease {name!r} was released by {by} and rests until its min-hold ({left})"


# Commands ----------------------------------------------------------------------


@app.command()
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
    dsn: DsnOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Claim a lease and print HOLDER<tab>FENCE; exit 1 if another holder has it.

    Example: read -r holder fence < <(pylease claim sweep --ttl 5m)
    """
    with _edge(verbose):
        _key("name", name)
        holder = _key("holder", holder) if holder is not None else default_holder()
        target = _target(dsn)
        with _open(target, "pylease claim") as (backend, conn), _spinner(name, False) as show:
            fence, row = _claim_waiting(backend, conn, target, name, ttl, holder, wait, show)
            now = _now(target, conn)
            mine = _current(backend, name) if fence is not None else None
        standing = mine or row
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "name": name,
                        "claimed": fence is not None,
                        "holder": holder,
                        "fence": fence,
                        "expires_at": _iso(mine.expires_at) if mine else None,
                        "held_by": standing.holder if standing else None,
                    }
                )
            )
        if fence is None:
            if not as_json:
                _say(_busy_line(name, row, now))
            raise typer.Exit(EXIT_NO)
        if not as_json:
            typer.echo(f"{holder}\t{fence}")


@app.command()
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
    verbose: VerboseOption = False,
) -> None:
    """Extend a lease this holder still holds; exit 1 if it was released or taken.

    Example: pylease renew sweep --holder "$holder" --ttl 5m
    """
    with _edge(verbose):
        _key("name", name)
        _key("holder", holder)
        with _open(_target(dsn), "pylease renew") as (backend, _conn):
            renewed = backend.renew(name, holder, ttl)
        if not renewed:
            raise _fail(f"lease {name!r} is not held by {holder} any more", EXIT_NO)


@app.command()
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
    verbose: VerboseOption = False,
) -> None:
    """Give a lease back (only this holder's); exit 1 if it was not held by this holder.

    Example: pylease release sweep --holder "$holder"
    """
    with _edge(verbose):
        _key("name", name)
        _key("holder", holder)
        with _open(_target(dsn), "pylease release") as (backend, _conn):
            released = backend.release(name, holder, min_hold)
        if not released:
            raise _fail(f"lease {name!r} was not held by {holder}", EXIT_NO)


@app.command()
def steal(
    name: NameArg,
    ttl: TtlOption,
    holder: HolderOption,
    older_than: Annotated[
        timedelta,
        typer.Option(
            "--older-than",
            metavar="DUR",
            parser=_duration("--older-than"),
            help="Only if its holder last claimed or renewed at least this long ago.",
            show_default="0",
        ),
    ] = timedelta(0),
    dsn: DsnOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Take a lease whatever its state (an operator's break-lock) and print HOLDER<tab>FENCE.

    Exit 1 if its holder renewed more recently than --older-than.

    Example: pylease steal sweep --ttl 5m --holder ops --older-than 10m
    """
    with _edge(verbose):
        _key("name", name)
        _key("holder", holder)
        target = _target(dsn)
        with _open(target, "pylease steal") as (backend, conn):
            fence = backend.steal(name, ttl, holder, older_than)
            row = _current(backend, name) if fence is None else None
            now = _now(target, conn)
        if fence is None:
            renewed = (
                durations.relative(now - _aware(row.renewed_at), "{} ago", "in {}")
                if row
                else "recently"
            )
            raise _fail(
                f"lease {name!r} not stolen: {_printable(row.holder) if row else 'its holder'} "
                f"renewed it {renewed}, less than --older-than",
                EXIT_NO,
            )
        typer.echo(f"{holder}\t{fence}")


def _iso(moment: datetime) -> str:
    return _aware(moment).isoformat()


def _row_json(row: LeaseRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "holder": row.holder,
        "fence": row.fence,
        "held": row.held,
        "acquired_at": _iso(row.acquired_at),
        "renewed_at": _iso(row.renewed_at),
        "expires_at": _iso(row.expires_at),
    }


@app.command()
def status(
    name: Annotated[
        str | None,
        typer.Argument(metavar="[NAME]", help="One lease; default: all.", show_default=False),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of objects with ISO-8601 times.")
    ] = False,
    dsn: DsnOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Show every lease (or one): holder, fence, held or free, and when it expires.

    Example: pylease status --json | jq '.[] | select(.held)'
    """
    with _edge(verbose):
        if name is not None:
            _key("name", name)
        target = _target(dsn)
        with _open(target, "pylease status") as (backend, conn):
            rows = backend.status(name)
            now = _now(target, conn)
        if as_json:
            typer.echo(json.dumps([_row_json(r) for r in rows]))
            return
        if not rows:
            typer.echo(f"no lease named {name!r}" if name else f"no leases yet in {target.shown}")
            return
        _print_table(rows, now)


def _print_table(rows: list[LeaseRow], now: datetime) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("NAME", overflow="fold")
    table.add_column("HOLDER", overflow="fold")
    table.add_column("FENCE", justify="right")
    table.add_column("STATE")
    table.add_column("EXPIRY", no_wrap=True)
    table.add_column("RENEWED", no_wrap=True)
    for row in rows:
        expires = _aware(row.expires_at) - now
        if row.held:
            state, expiry = "held", durations.relative(expires, "expires in {}", "expired {} ago")
        elif expires > timedelta(0):
            state, expiry = "free", durations.relative(expires, "claimable in {}", "")
        else:
            state, expiry = "free", durations.relative(expires, "", "since {} ago")
        renewed = durations.relative(now - _aware(row.renewed_at), "renewed {} ago", "renewed now")
        # Names and holders are data: never rich markup, never terminal control codes.
        name, holder = Text(_printable(row.name)), Text(_printable(row.holder))
        table.add_row(name, holder, str(row.fence), state, expiry, renewed)
    # Piped into a file or a pager, keep one line per lease rather than 80 columns.
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 250)
    with console.capture() as captured:
        console.print(table)
    typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


@app.command()
def migrate(
    dsn: DsnOption = None,
    schema: Annotated[
        str | None,
        typer.Option(
            "--schema",
            metavar="NAME",
            help="PostgreSQL schema to install into.  [default: public]",
            show_default=False,
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Install or upgrade the pylease schema (idempotent; safe to run from two deploys at once).

    Example: pylease migrate --dsn postgresql://app@db/app
    """
    with _edge(verbose):
        target = _target(dsn)
        if target.sqlite:
            if schema is not None:
                raise _fail("--schema applies to PostgreSQL only", EXIT_USAGE)
            path = _sqlite_module().path_of(target.url)
            existed = path.exists()
            with _open(target, "pylease migrate"):
                pass  # connecting creates the file and applies its migrations
            typer.echo(f"pylease: {path} is up to date" if existed else f"pylease: created {path}")
            return
        from pylease.migrate import migrate as run_migrate

        run_migrate(target.url, schema or "public", say=lambda line: typer.echo(f"pylease: {line}"))


# pylease run ---------------------------------------------------------------------


@app.command(
    epilog="Exit codes: the command's own; 128+N when signal N killed it; 127 command not "
    "found; 126 not executable; 75 the lease was lost while it ran; --busy-exit (default 1) "
    "when the lease stayed busy; 2 usage; 3 database or configuration error.",
)
def run(
    name: NameArg,
    cmd: Annotated[
        list[str],
        typer.Argument(metavar="-- CMD [ARG...]", help="The command to run under the lease."),
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
            help="Exit code when busy; cron users pass 0.",
            min=0,
            max=255,
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
            " never later than the lease's local expiry, whatever this says.",
            show_default="10s",
        ),
    ] = timedelta(seconds=10),
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Say nothing when the lease is busy.")
    ] = False,
    dsn: DsnOption = None,
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
    from pylease.errors import LeaseBusy, LeaseLost
    from pylease.leasing import lease

    with _edge(verbose):
        _key("name", name)
        holder = _key("holder", holder) if holder is not None else default_holder()
        target = _target(dsn)
        lost = threading.Event()
        why: list[str] = []

        def on_lost(error: LeaseLost) -> None:  # on the heartbeat's thread
            why.append(str(error))
            lost.set()

        # Our own claim first, with the spinner; then lease() claims it again, which
        # for the holder that has it is idempotent (same fence), and keeps it fresh.
        holding = lease(target.url, name, ttl, holder=holder, on_lost=on_lost, min_hold=min_hold)
        entered = False
        try:
            # From here to the child's start a signal ends pylease cleanly; once the
            # child runs, supervise() passes signals on to it.
            with runner.signals_raise():
                fence, row, now = _run_claim(target, name, ttl, holder, wait, quiet)
                if fence is None:
                    if not quiet:
                        _say(_busy_line(name, row, now))
                    raise typer.Exit(busy_exit)
                try:
                    held = holding.__enter__()
                    fence = held.fence
                    entered = True
                except LeaseBusy:  # it expired and was taken in between
                    if not quiet:
                        _say(_busy_line(name, None, now))
                    raise typer.Exit(busy_exit) from None
                except BaseException:
                    _give_back(target, name, holder)
                    raise
                env = dict(os.environ)
                env.update(
                    PYLEASE_NAME=name,
                    PYLEASE_HOLDER=holder,
                    PYLEASE_FENCE=str(fence),
                    PYLEASE_DSN=target.url,
                )
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
        try:
            holding.__exit__(None, None, None)  # releases, with --min-hold
        except LeaseLost as exc:
            if not outcome.lost:
                _say(f"{exc}; {cmd[0]} ran to its end without it")
                code = runner.LOST
        except PyleaseError as exc:
            _say(f"could not release lease {name!r}, it stays held until it expires: {exc}")
    raise typer.Exit(code)


def _give_back(target: Target, name: str, holder: str) -> None:
    """Release a claim we cannot go on with; best effort: it expires anyway."""
    with contextlib.suppress(Exception), _open(target, "pylease run") as (backend, _conn):
        backend.release(name, holder)


def _run_claim(
    target: Target, name: str, ttl: timedelta, holder: str, wait: timedelta, quiet: bool
) -> tuple[int | None, LeaseRow | None, datetime]:
    """Claim for ``pylease run``; on a terminal, a spinner names the holder while waiting."""
    with _open(target, "pylease run") as (backend, conn), _spinner(name, quiet) as show:
        fence, row = _claim_waiting(backend, conn, target, name, ttl, holder, wait, show)
        return fence, row, _now(target, conn)


@contextlib.contextmanager
def _spinner(name: str, quiet: bool) -> Iterator[Callable[[LeaseRow | None], None]]:
    """A spinner on stderr, shown from the first busy claim on, only on a terminal."""
    if quiet or not sys.stderr.isatty():
        yield lambda _row: None
        return
    from rich.console import Console
    from rich.status import Status
    from rich.text import Text

    shown: list[Status] = []

    def show(row: LeaseRow | None) -> None:
        who = f": held by {_printable(row.holder)}" if row is not None and row.held else ""
        text = Text(f"waiting for lease {name!r}{who}")
        if not shown:
            shown.append(Console(stderr=True).status(text))
            shown[0].start()
        shown[0].update(text)

    try:
        yield show
    finally:
        if shown:
            shown[0].stop()


class _StderrLog(logging.Handler):
    """The library's log, as the command's stderr lines: warnings, and everything with -v.

    A lost lease is left out: ``pylease run`` says so itself, with what it does about it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and not _verbose:
            return False
        return not (record.levelno == logging.WARNING and record.msg == "lease %r lost: %s")

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.exc_info and _verbose:
            message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        _say(message)


def main() -> None:
    """Entry point of the ``pylease`` script (also ``python -m pylease``)."""
    # Here rather than in the app, so that an application embedding it keeps its logging.
    library = logging.getLogger("pylease")
    library.addHandler(_StderrLog())
    library.setLevel(logging.DEBUG)
    app()
