"""``pylease leader NAME --ttl DUR -- CMD``: campaign until elected, run CMD as ``pylease run``.

A leader command is a ``pylease run`` that waits without a deadline: the same claim
(woken by the release's NOTIFY, or at the holder's expiry), the same child
supervision (environment, signal forwarding, renewals, the stop of CMD before the
lease can go to anyone else, exit codes), and the release (resignation) when CMD
exits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from pylease import durations
from pylease.cli._app import command
from pylease.cli._options import DsnOption, SchemaOption, VerboseOption, duration
from pylease.cli._run import run

EPILOG = (
    "Exit codes: the command's own; 128+N when signal N killed it; 127 command not found; "
    "126 not executable; 75 the term was lost while it ran; 1 --wait ran out before this "
    "process was elected; 2 usage; 3 database or configuration error."
)


@command(name="leader", epilog=EPILOG)
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
            parser=duration("--ttl", positive=True),
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
        timedelta,
        typer.Option(
            "--wait",
            metavar="DUR",
            parser=duration("--wait", forever=True),
            help="Give up (exit 1) if not elected within DUR.",
            show_default="forever",
        ),
    ] = durations.FOREVER,
    kill_after: Annotated[
        timedelta,
        typer.Option(
            "--kill-after",
            metavar="DUR",
            parser=duration("--kill-after"),
            help="After a lost term's SIGTERM, SIGKILL the command this much later.",
            show_default="10s",
        ),
    ] = timedelta(seconds=10),
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Say nothing while waiting to lead.")
    ] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Wait until this process leads NAME, run CMD while leading, resign when CMD exits.

    CMD runs as under `pylease run`: it sees PYLEASE_NAME, PYLEASE_HOLDER, PYLEASE_FENCE
    (the term number) and PYLEASE_DSN; SIGINT, SIGTERM and SIGHUP are passed on to it;
    if the term is lost, CMD gets SIGTERM (SIGKILL after --kill-after) and pylease exits
    75. A standby waiting to lead is woken by the leader's resignation at once.

    Example: pylease leader scheduler --ttl 15s -- ./scheduler --serve
    """
    run(
        name,
        cmd,
        ttl,
        wait=wait,
        holder=holder,
        busy_exit=1,
        min_hold=None,
        kill_after=kill_after,
        quiet=quiet,
        dsn=dsn,
        schema=schema,
        verbose=verbose,
    )
