"""``pylease run NAME -- CMD``: run a command while holding a lease."""

from __future__ import annotations

import contextlib
import os
import threading
from datetime import timedelta
from typing import Annotated

import typer

from pylease import dsn as dsn_mod
from pylease._claims import default_holder
from pylease.cli import _child, _render
from pylease.cli._app import command, stderr_log
from pylease.cli._database import Store, connect, find_store, server_clock, server_now, where
from pylease.cli._edge import at_edge, key, say
from pylease.cli._options import (
    DsnOption,
    NameArg,
    SchemaOption,
    TtlOption,
    VerboseOption,
    WaitOption,
    duration,
    lease_options,
)
from pylease.cli._render import Busy
from pylease.errors import (
    LeaseBusy,
    PyleaseError,
)

# Commands, in the order a newcomer needs them ------------------------------------


@command(
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
            parser=duration("--min-hold"),
            help="Passed to the release: at most one run per period.",
            show_default=False,
        ),
    ] = None,
    kill_after: Annotated[
        timedelta,
        typer.Option(
            "--kill-after",
            metavar="DUR",
            parser=duration("--kill-after"),
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
    from pylease.errors import LeaseLost
    from pylease.leasing import Lease

    with at_edge(verbose) as edge:
        key("name", name)
        holder = key("holder", holder) if holder is not None else default_holder()
        edge.store = store = find_store(dsn, schema)
        lost = threading.Event()
        why: list[str] = []

        def on_lost(error: LeaseLost) -> None:  # on the heartbeat's thread
            why.append(str(error))
            lost.set()

        opts = lease_options(name, ttl, holder, wait, min_hold)
        # One claim per attempt, by the library's own wait loop, on the lease that
        # then stays held: no claim of our own first.
        holding = Lease(store.url, opts, on_lost=on_lost, heartbeat_target=None)
        entered = False
        try:
            # From here to the child's start a signal ends pylease cleanly; once the
            # child runs, supervise() passes signals on to it.
            with _child.signals_raise():
                with _render.spinner(name, quiet) as show:
                    busy = holding.on_busy = Busy(show)
                    try:
                        held = holding.__enter__()
                        fence = held.fence
                        entered = True
                    except LeaseBusy:
                        if not quiet:
                            say(
                                _render.busy_line(
                                    name, busy.row, server_clock(store), where(store), holder
                                )
                            )
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
                outcome = _child.supervise(
                    cmd,
                    env,
                    lost=lost,
                    kill_after=kill_after.total_seconds(),
                    say=say,
                    why_lost=lambda: why[0] if why else f"lease {name!r} was lost",
                    remaining=_child.time_left(held),
                )
        except _child.Signalled as sig:
            if entered:
                with contextlib.suppress(Exception):
                    holding.__exit__(None, None, None)
            raise typer.Exit(128 + sig.signum) from None
        code = _child.LOST if outcome.lost else outcome.code
        if outcome.lost and not stderr_log.failing(name):
            # The command is stopped already: now there is time to ask who has the lease.
            taken = _taken_by(store, name, holder, fence)
            if taken:
                say(taken)
        try:
            holding.__exit__(None, None, None)  # releases, with --min-hold
        except LeaseLost as exc:
            if not outcome.lost:
                say(f"{exc}; {cmd[0]} ran to its end without it")
                code = _child.LOST
        except PyleaseError as exc:
            say(f"could not release lease {name!r}, it stays held until it expires: {exc}")
    raise typer.Exit(code)


def _taken_by(store: Store, name: str, holder: str, fence: int) -> str | None:
    """Who holds the lease we lost, and how they got it; None if that cannot be told."""
    try:
        with connect(store, "pylease run", connect_timeout=3) as (backend, conn):
            row = next(iter(backend.status(name)), None)
            if row is None or (row.holder == holder and row.fence == fence) or not row.held:
                return None
            events = backend.history(name, None, 1)
            return _render.taken_line(
                name, row, events[0] if events else None, server_now(store, conn)
            )
    except Exception:
        return None  # the loss was said already; this is only its detail
