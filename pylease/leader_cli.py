"""``pylease leader NAME --ttl DUR -- CMD``: campaign until elected, run CMD as ``pylease run``.

A leader command is a ``pylease run`` that waits without a deadline: the same claim
(woken by the release's NOTIFY, or at the holder's expiry), the same child
supervision (environment, signal forwarding, renewals, the stop of CMD before the
lease can go to anyone else, exit codes), and the release (resignation) when CMD
exits. Registered on the ``pylease`` app by :mod:`pylease.cli`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

import typer

from pylease import durations

# Waiting without a deadline: ``run``'s own spelling of it where it has one, else the
# longest wait every layer accepts (366 days).
FOREVER: timedelta = getattr(durations, "FOREVER", timedelta(days=366))

EPILOG = (
    "Exit codes: the command's own; 128+N when signal N killed it; 127 command not found; "
    "126 not executable; 75 the term was lost while it ran; 1 --wait ran out before this "
    "process was elected; 2 usage; 3 database or configuration error."
)


def _wait(value: Any) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    text = str(value).strip().lower()
    if text in ("forever", "inf", "infinity"):
        return None
    try:
        return durations.parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _ttl(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    try:
        span = durations.parse(str(value))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if span <= timedelta(0):
        raise typer.BadParameter("--ttl must be positive")
    return span


def _span(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    try:
        return durations.parse(str(value))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def leader(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The election's name.", show_default=False)
    ],
    cmd: Annotated[
        list[str],
        typer.Argument(metavar="-- CMD [ARG...]", help="The command to run while leading."),
    ],
    ttl: Annotated[
        timedelta,
        typer.Option(
            "--ttl",
            metavar="DUR",
            parser=_ttl,
            help="How long a leader that stopped renewing stays leader.",
        ),
    ],
    holder: Annotated[
        str | None,
        typer.Option(
            "--holder",
            metavar="H",
            help="Who campaigns; default: HOST:PID:RANDOM.",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[
        timedelta | None,
        typer.Option(
            "--wait",
            metavar="DUR",
            parser=_wait,
            help="Give up (exit 1) if not elected within DUR.",
            show_default="forever",
        ),
    ] = None,
    kill_after: Annotated[
        timedelta,
        typer.Option(
            "--kill-after",
            metavar="DUR",
            parser=_span,
            help="After a lost term's SIGTERM, SIGKILL the command this much later.",
            show_default="10s",
        ),
    ] = timedelta(seconds=10),
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Say nothing while waiting to lead.")
    ] = False,
    dsn: Annotated[
        str | None,
        typer.Option(
            "--dsn",
            metavar="URL",
            help="postgresql://... or sqlite:///path; default: $PYLEASE_DSN, else "
            "$DATABASE_URL, else the embedded SQLite file.",
            show_default=False,
        ),
    ] = None,
    schema: Annotated[
        str | None,
        typer.Option(
            "--schema",
            metavar="NAME",
            help="The PostgreSQL schema pylease is installed in; default: $PYLEASE_SCHEMA, "
            "else the search_path.",
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the details of an error.")
    ] = False,
) -> None:
    """Wait until this process leads NAME, run CMD while leading, resign when CMD exits.

    CMD runs as under `pylease run`: it sees PYLEASE_NAME, PYLEASE_HOLDER, PYLEASE_FENCE
    (the term number) and PYLEASE_DSN; SIGINT, SIGTERM and SIGHUP are passed on to it;
    if the term is lost, CMD gets SIGTERM (SIGKILL after --kill-after) and pylease exits
    75. A standby waiting to lead is woken by the leader's resignation at once.

    Example: pylease leader scheduler --ttl 15s -- ./scheduler --serve
    """
    from pylease.cli import run

    options: dict[str, Any] = {}
    if schema is not None:  # only where run takes --schema; it reads $PYLEASE_SCHEMA itself
        options["schema"] = schema
    run(
        name,
        cmd,
        ttl,
        wait=FOREVER if wait is None else wait,
        holder=holder,
        busy_exit=1,
        min_hold=None,
        kill_after=kill_after,
        quiet=quiet,
        dsn=dsn,
        verbose=verbose,
        **options,
    )
