"""``pylease run NAME -- CMD``: run a command while holding a lease.

:func:`hold_and_run` is what ``run`` and ``leader`` share once they know how to get
their lease: the wait's spinner and busy line, the child's environment and
supervision, the exit codes, and the release when the command is done.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from pylease import dsn as dsn_mod
from pylease._claims import default_holder
from pylease.cli import _child, _render
from pylease.cli._app import command, stderr_log
from pylease.cli._database import Store, connect, find_store, server_clock, server_now, where
from pylease.cli._edge import at_edge, key, say
from pylease.cli._options import (
    KILL_AFTER,
    CmdArg,
    DsnOption,
    KillAfterOption,
    NameArg,
    OwnHolderOption,
    QuietOption,
    RequireDsnOption,
    SchemaOption,
    TtlOption,
    VerboseOption,
    WaitOption,
    duration,
    lease_options,
)
from pylease.cli._render import Busy
from pylease.errors import LeaseBusy, PyleaseError

if TYPE_CHECKING:
    from pylease._held import Held
    from pylease.errors import LeaseLost
    from pylease.leasing import Lease

# How a command gets its lease: given the loss callback and the busy observer, the
# lease entered (granted, kept fresh) and its Held; LeaseBusy when the wait ran out.
Enter = Callable[[Callable[["LeaseLost"], None], Busy], "tuple[Lease, Held]"]


@command(
    epilog="Exit codes: the command's own; 128+N when signal N killed it; 127 command not "
    "found; 126 not executable; 75 the lease was lost while it ran; --busy-exit (default 1) "
    "when the lease stayed busy; 2 usage; 3 database or configuration error.",
)
def run(
    name: NameArg,
    cmd: CmdArg,
    ttl: TtlOption,
    wait: WaitOption = timedelta(0),
    holder: OwnHolderOption = None,
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
    kill_after: KillAfterOption = KILL_AFTER,
    quiet: QuietOption = False,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
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
    from pylease.leasing import Lease

    with at_edge(verbose) as edge:
        key("name", name)
        holder = key("holder", holder) if holder is not None else default_holder()
        edge.store = store = find_store(dsn, schema, require_dsn)
        opts = lease_options(name, ttl, holder, wait, min_hold)

        def enter(on_lost: Callable[[LeaseLost], None], busy: Busy) -> tuple[Lease, Held]:
            # One claim per attempt, by the library's own wait loop, on the lease that
            # then stays held: no claim of our own first.
            holding = Lease(store.url, opts, on_lost=on_lost, heartbeat_target=None)
            holding.on_busy = busy
            return holding, holding.__enter__()

        code = hold_and_run(
            name, cmd, holder, store, enter, busy_exit=busy_exit, kill_after=kill_after, quiet=quiet
        )
    raise typer.Exit(code)


def hold_and_run(
    name: str,
    cmd: list[str],
    holder: str,
    store: Store,
    enter: Enter,
    *,
    busy_exit: int,
    kill_after: timedelta,
    quiet: bool,
) -> int:
    """Get the lease by ``enter``, run ``cmd`` under it, release it: the exit code.

    :raises typer.Exit: busy (``busy_exit``), or a signal before the command ran.
    """
    from pylease.errors import LeaseLost

    lost = threading.Event()
    why: list[str] = []

    def on_lost(error: LeaseLost) -> None:  # on the keeper's thread
        why.append(str(error))
        lost.set()

    holding: Lease | None = None
    try:
        # From here to the child's start a signal ends pylease cleanly; once the
        # child runs, supervise() passes signals on to it.
        with _child.signals_raise():
            with _render.spinner(name, quiet) as show:
                busy = Busy(show)
                try:
                    holding, held = enter(on_lost, busy)
                except LeaseBusy:
                    if not quiet:
                        say(
                            _render.busy_line(
                                name, busy.row, server_clock(store), where(store), holder
                            )
                        )
                    raise typer.Exit(busy_exit) from None
            fence = held.fence
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
        if holding is not None:
            with contextlib.suppress(Exception):
                holding.__exit__(None, None, None)
        raise typer.Exit(128 + sig.signum) from None
    assert holding is not None  # entered, or busy or a signal ended this already
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
    return code


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
