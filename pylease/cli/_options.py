"""The options the commands share, and their one parser of durations (``250ms``, ``forever``)."""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

import typer

from pylease import _checks, durations

# Options -------------------------------------------------------------------


def duration(
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
RequireDsnOption = Annotated[
    bool,
    typer.Option(
        "--require-dsn",
        envvar="PYLEASE_REQUIRE_DSN",
        help="Fail (exit 3) rather than use the embedded SQLite file when no database is "
        "given (--dsn, $PYLEASE_DSN, $DATABASE_URL); also PYLEASE_REQUIRE_DSN=1.",
        show_envvar=False,
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
        parser=duration("--ttl", positive=True),
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
        parser=duration("--wait", forever=True),
        help="Keep trying this long while the lease is busy (forever: no deadline).  [default: 0]",
        show_default=False,
    ),
]
PrefixOption = Annotated[
    str | None,
    typer.Option(
        "--prefix",
        metavar="P",
        help="Only leases whose name starts with P (filtered by the database).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
SharedOption = Annotated[
    bool,
    typer.Option(
        "--shared",
        help="Take a reader's share: readers hold the name together, a writer alone;"
        " a waiting writer keeps new readers out.",
    ),
]

# Permits of a semaphore (contract 5.1): the option that says a name is one.
MAX_PERMITS = 10000


def max_permits_option(help: str) -> Any:
    return typer.Option(
        "--max-permits",
        metavar="N",
        min=1,
        max=MAX_PERMITS,
        help=help,
        show_default=False,
    )


ClaimMaxPermitsOption = Annotated[
    int | None,
    max_permits_option(
        "NAME is a semaphore: hold one of its N permits (at most N held at once, by "
        "everyone; 1 to 10000), as `consul lock -n`."
    ),
]
KeptMaxPermitsOption = Annotated[
    int | None,
    max_permits_option("NAME is a semaphore of N permits: its holder's permits, all of them."),
]
PermitsOption = Annotated[
    int | None,
    typer.Option(
        "--permits",
        metavar="K",
        min=1,
        max=MAX_PERMITS,
        help="With --max-permits: hold K permits, granted together or not at all.  [default: 1]",
        show_default=False,
    ),
]

# What `run` and `leader` share: both run a command under a lease they claim.
CmdArg = Annotated[
    list[str],
    typer.Argument(
        metavar="-- CMD [ARG...]",
        help="The command to run while the lease is held.",
        show_default=False,
    ),
]
OwnHolderOption = Annotated[
    str | None,
    typer.Option(
        "--holder",
        metavar="H",
        help="Who claims; default: HOST:PID:RANDOM.",
        show_default=False,
    ),
]
KillAfterOption = Annotated[
    timedelta,
    typer.Option(
        "--kill-after",
        metavar="DUR",
        parser=duration("--kill-after"),
        help="After a lost lease's SIGTERM, SIGKILL the command this much later;"
        " never later than the lease's local expiry, whatever this says.  [default: 10s]",
        show_default=False,
    ),
]
KILL_AFTER = timedelta(seconds=10)
DataOption = Annotated[
    str | None,
    typer.Option(
        "--data",
        metavar="JSON",
        help="What to publish with the lease (lease_status's data), as JSON; default: "
        '{"command", "host", "pid", "user"} of this run; null: nothing.',
        show_default=False,
    ),
]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="Say nothing while the lease is busy.")
]
VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="Say which database is used and why; show an error's details."
    ),
]


def seconds(wait: timedelta) -> float:
    return math.inf if wait == durations.FOREVER else wait.total_seconds()


def lease_options(
    name: str,
    ttl: timedelta,
    holder: str,
    wait: timedelta,
    min_hold: timedelta | None = None,
    *,
    shared: bool = False,
    data: object = None,
) -> Any:
    from pylease._held import options

    return options(
        name,
        ttl,
        holder=holder,
        wait=seconds(wait),
        heartbeat=True,
        on_lost=None,
        min_hold=min_hold,
        poll_interval=None,
        shared=shared,
        data=data,
    )


def run_data(text: str | None, cmd: list[str]) -> object:
    """What ``run`` and ``leader`` publish with their lease: ``--data`` parsed (a usage
    error unless it is JSON), else who runs what where."""
    import getpass
    import json
    import shlex
    import socket

    if text is not None:
        try:
            return json.loads(text)
        except ValueError as exc:
            from pylease.cli._edge import EXIT_USAGE, fail

            raise fail(f"--data must be JSON: {exc}", EXIT_USAGE) from None
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container): the data says what it can
        user = str(os.getuid())
    return {
        "command": shlex.join(cmd),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "user": user,
    }


def width(wide: bool) -> int | None:
    """The terminal's width (``COLUMNS`` first); None (no limit) for --wide or a pipe."""
    if wide:
        return None
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None
