"""``pylease leader NAME --ttl DUR -- CMD``: campaign until elected, run CMD while leading.

The campaign is the leadership module's (:class:`pylease.leadership.Campaign`): a
standby is a waiter of the wait engine, woken by the leader's resignation through the
process's hub, or at the leader's expiry. Once elected, CMD runs as under
``pylease run`` (:func:`pylease.cli._run.hold_and_run`: environment, signals passed
on, the stop of CMD before the term can go to anyone else, exit codes), and the term
is resigned when CMD exits.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from pylease import durations
from pylease._claims import default_holder
from pylease.cli._app import command, command_of
from pylease.cli._database import find_store
from pylease.cli._edge import at_edge, key
from pylease.cli._options import (
    KILL_AFTER,
    DataOption,
    DsnOption,
    KillAfterOption,
    OwnHolderOption,
    QuietOption,
    RequireDsnOption,
    SchemaOption,
    VerboseOption,
    duration,
    run_data,
    seconds,
)
from pylease.cli._render import Busy
from pylease.cli._run import hold_and_run

if TYPE_CHECKING:
    from pylease._held import Held
    from pylease._rows import LeaseRow
    from pylease.errors import LeaseLost
    from pylease.leasing import Lease

EPILOG = (
    "Exit codes: the command's own; 128+N when signal N killed it; 127 command not found; "
    "126 not executable; 75 the term was lost while it ran; 76 it was asked to step down "
    "(pylease request-release); 1 --wait ran out before this "
    "process was elected; 2 usage; 3 database or configuration error."
)


@command(name="leader", names_then_command=True, epilog=EPILOG)
def leader(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The election's name.", show_default=False)
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
    holder: OwnHolderOption = None,
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
    kill_after: KillAfterOption = KILL_AFTER,
    data: DataOption = None,
    quiet: QuietOption = False,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Wait until this process leads NAME, run CMD while leading, resign when CMD exits.

    CMD runs as under `pylease run`: it sees PYLEASE_NAME, PYLEASE_HOLDER, PYLEASE_FENCE
    (the term number) and PYLEASE_DSN; SIGINT, SIGTERM and SIGHUP are passed on to it;
    if the term is lost, CMD gets SIGTERM (SIGKILL after --kill-after) and pylease exits
    75. A standby waiting to lead is woken by the leader's resignation at once. The term
    carries {"command", "host", "pid", "user"} as its data (--data JSON: what you give),
    for `pylease status --wide` and the standbys; asked to step down (`pylease
    request-release NAME`), CMD is stopped as for a loss, the term resigned, and pylease
    exits 76, so that a rolling deploy hands over without waiting for the ttl.

    Example: pylease leader scheduler --ttl 15s -- ./scheduler --serve
    """
    from pylease._standby import Observer, Stop
    from pylease.leadership import Campaign

    class Standby(Observer):
        """Shows the spinner every busy attempt's row: the busy line tells its expiry."""

        def __init__(self, busy: Busy) -> None:
            super().__init__(busy)
            self.busy = busy

        def see(self, row: LeaseRow | None) -> None:
            self.busy(row)

    with at_edge(verbose) as edge:
        cmd = command_of(ctx)
        key("name", name)
        holder = key("holder", holder) if holder is not None else default_holder()
        published = run_data(data, cmd)
        edge.store = store = find_store(dsn, schema, require_dsn)

        def enter(
            on_lost: Callable[[LeaseLost], None], busy: Busy, asked: Callable[[Held], None]
        ) -> tuple[Lease, Held]:
            campaign = Campaign(
                store.url,
                name,
                ttl,
                holder=holder,
                wait=seconds(wait),
                on_lost=on_lost,
                heartbeat_target=None,
                poll_interval=None,
                cancel_on_lost=True,
                data=published,
                on_release_requested=asked,
            )
            # Nothing sets this stop: SIGINT, SIGTERM and SIGHUP end the campaign by
            # raising (hold_and_run's handlers), as they end run's wait.
            won = campaign.run(Stop(None), Standby(busy))
            assert won is not None
            return won

        code = hold_and_run(
            name, cmd, holder, store, enter, busy_exit=1, kill_after=kill_after, quiet=quiet
        )
    raise typer.Exit(code)
