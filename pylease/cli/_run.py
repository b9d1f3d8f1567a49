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

from pylease import _checks
from pylease import dsn as dsn_mod
from pylease._claims import default_holder
from pylease.cli import _child, _render
from pylease.cli._app import command, command_of, stderr_log
from pylease.cli._database import Store, connect, find_store, server_clock, server_now, where
from pylease.cli._edge import EXIT_USAGE, at_edge, fail, key, say
from pylease.cli._options import (
    KILL_AFTER,
    ClaimMaxPermitsOption,
    DataOption,
    DsnOption,
    KillAfterOption,
    OwnHolderOption,
    PermitsOption,
    QuietOption,
    RequireDsnOption,
    SchemaOption,
    SharedOption,
    TtlOption,
    VerboseOption,
    WaitOption,
    duration,
    lease_options,
    run_data,
)
from pylease.cli._permits import busy_line as permits_busy_line
from pylease.cli._permits import permits_wanted, slot_taken_line
from pylease.cli._render import Busy
from pylease.errors import LeaseBusy, PyleaseError

if TYPE_CHECKING:
    from pylease._held import Held
    from pylease.errors import LeaseLost
    from pylease.leasing import Lease

# How a command gets its lease: given the loss callback and the busy observer, the
# lease entered (granted, kept fresh) and its Held; LeaseBusy when the wait ran out.
# How a command gets its lease: with what to call when it is lost, the spinner, and what
# to call when its holder is asked to step down.
Enter = Callable[
    [Callable[["LeaseLost"], None], Busy, Callable[["Held"], None]], "tuple[Lease, Held]"
]


@command(
    names_then_command=True,
    epilog="Exit codes: the command's own; 128+N when signal N killed it; 127 command not "
    "found; 126 not executable; 75 the lease was lost while it ran; 76 it was asked to step "
    "down (pylease request-release); --busy-exit (default 1) "
    "when the lease stayed busy; 2 usage; 3 database or configuration error.",
)
def run(
    ctx: typer.Context,
    names: Annotated[
        list[str],
        typer.Argument(
            metavar="NAME [NAME...]",
            help="The lease's name; several: all of them, granted at once or not at all.",
            show_default=False,
        ),
    ],
    ttl: TtlOption,
    wait: WaitOption = timedelta(0),
    holder: OwnHolderOption = None,
    max_permits: ClaimMaxPermitsOption = None,
    permits: PermitsOption = None,
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
    shared: SharedOption = False,
    data: DataOption = None,
    quiet: QuietOption = False,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run CMD while holding the lease NAME, renewing it; skip CMD when the lease is busy.

    CMD sees PYLEASE_NAME, PYLEASE_HOLDER, PYLEASE_FENCE and PYLEASE_DSN (with --shared,
    as a reader: PYLEASE_EPOCH instead of PYLEASE_FENCE, since a reader's epoch is the
    last writer's fence and a store that checks fences must not take it for one). SIGINT, SIGTERM
    and SIGHUP are passed on to it. If the lease is lost, CMD gets SIGTERM, then SIGKILL
    after --kill-after or at the lease's local expiry, whichever comes first, and pylease
    exits 75. The lease carries {"command", "host", "pid", "user"} as its data (--data
    JSON: what you give); asked to step down (`pylease request-release NAME`), CMD is
    stopped as for a loss, the lease released, and pylease exits 76.

    Several NAMEs are claimed all at once or not at all, and waited for holding none of
    them; CMD also sees PYLEASE_FENCES (name=fence pairs, separated by spaces), and
    PYLEASE_NAME and PYLEASE_FENCE are the first NAME's. With --max-permits N, NAME is a
    semaphore: CMD runs while it holds one of its N permits (--permits K: K of them),
    and also sees PYLEASE_SLOTS (slot=fence pairs); PYLEASE_FENCE is its first slot's.

    Examples: pylease run nightly-report --ttl 10m --busy-exit 0 -- ./report.sh --full
    pylease run export --max-permits 4 --ttl 1m --wait 10m -- ./export.sh
    pylease run acct-17 acct-42 --ttl 30s -- ./transfer.sh 17 42
    """
    from pylease.leasing import Lease
    from pylease.permits import leases, permit

    with at_edge(verbose) as edge:
        cmd = command_of(ctx)
        names = [key("name", name) for name in names]
        if len(names) > 1:
            _checks.names(names)  # a name given twice is a usage error, before any I/O
        count = permits_wanted(names, max_permits, permits, min_hold)
        if len(names) > 1 and min_hold is not None:
            raise fail("--min-hold is for one lease, not for several names", EXIT_USAGE)
        holder = key("holder", holder) if holder is not None else default_holder()
        edge.store = store = find_store(dsn, schema, require_dsn)
        if shared and (len(names) > 1 or count is not None):
            raise fail("--shared takes one lease: not several names, not --max-permits", EXIT_USAGE)
        # A lease's data: its holder's (readers, permits and several names have none).
        one = len(names) == 1 and count is None and not shared
        published = run_data(data, cmd) if one else None
        opts = lease_options(names[0], ttl, holder, wait, min_hold, shared=shared, data=published)

        def enter(
            on_lost: Callable[[LeaseLost], None], busy: Busy, asked: Callable[[Held], None]
        ) -> tuple[Lease, Held]:
            # One claim per attempt, by the library's own wait loop, on the lease that
            # then stays held: no claim of our own first.
            holding: Lease
            if count is not None:
                assert max_permits is not None
                holding = permit(
                    store.url, names[0], ttl, max_permits=max_permits, permits=count,
                    holder=holder, wait=opts.wait, on_lost=on_lost,
                )  # fmt: skip
            elif len(names) > 1:
                holding = leases(
                    store.url, names, ttl, holder=holder, wait=opts.wait, on_lost=on_lost
                )
            else:
                opts_ = opts._replace(on_release_requested=asked if one else None)
                holding = Lease(store.url, opts_, on_lost=on_lost, heartbeat_target=None)
            holding.on_busy = busy
            return holding, holding.__enter__()

        def busy_says(busy: Busy) -> str:
            if count is not None:
                with connect(store, "pylease run") as (backend, conn):
                    rows = backend.permit_status(names[0])
                    now = server_now(store, conn)
                return permits_busy_line(names[0], rows, now, where(store), count)
            row = busy.row
            name = row.name if row is not None else names[0]
            return _render.busy_line(name, row, server_clock(store), where(store), holder)

        code = hold_and_run(
            names[0],
            cmd,
            holder,
            store,
            enter,
            busy_exit=busy_exit,
            kill_after=kill_after,
            quiet=quiet,
            busy_says=busy_says,
            shared=shared,
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
    busy_says: Callable[[Busy], str] | None = None,
    shared: bool = False,
) -> int:
    """Get the lease by ``enter``, run ``cmd`` under it, release it: the exit code.

    ``busy_says(busy)`` is the line that tells why the lease stayed busy (default: who
    holds the lease ``name``).

    :raises typer.Exit: busy (``busy_exit``), or a signal before the command ran.
    """
    from pylease.errors import LeaseLost

    lost = threading.Event()
    asked = threading.Event()
    why: list[str] = []

    def on_lost(error: LeaseLost) -> None:  # on the keeper's thread
        why.append(str(error))
        lost.set()

    def on_release_requested(held: Held) -> None:  # on a thread of its own
        # Stopped as for a loss (SIGTERM, SIGKILL after --kill-after, before the lease's
        # expiry), but the lease is still ours: it is given back after.
        why.append(f"{held.release_requested_by} asked lease {name!r} to step down")
        asked.set()
        lost.set()

    holding: Lease | None = None
    try:
        # From here to the child's start a signal ends pylease cleanly; once the
        # child runs, supervise() passes signals on to it.
        with _child.signals_raise():
            with _render.spinner(name, quiet) as show:
                busy = Busy(show)
                try:
                    holding, held = enter(on_lost, busy, on_release_requested)
                except LeaseBusy:
                    if not quiet:
                        if busy_says is not None:
                            say(busy_says(busy))
                        else:
                            now = server_clock(store)
                            say(_render.busy_line(name, busy.row, now, where(store), holder))
                    raise typer.Exit(busy_exit) from None
            env = dict(os.environ)
            env.update(_environment(held, store, shared=shared))
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
    stepped_down = outcome.lost and asked.is_set() and not held.lost
    if stepped_down:
        code = _child.STEPPED_DOWN
    elif outcome.lost and not stderr_log.failing(name):
        # The command is stopped already: now there is time to ask who has the lease.
        taken = _taken_by(store, held)
        if taken:
            say(taken)
    try:
        holding.__exit__(None, None, None)  # releases, with --min-hold
    except LeaseLost as exc:
        if stepped_down:
            say(f"{exc}, while {cmd[0]} stopped")
            code = _child.LOST
        elif not outcome.lost:
            say(f"{exc}; {cmd[0]} ran to its end without it")
            code = _child.LOST
    except PyleaseError as exc:
        say(f"could not release lease {name!r}, it stays held until it expires: {exc}")
    return code


def _environment(held: Held, store: Store, *, shared: bool = False) -> dict[str, str]:
    """What CMD is told of what it runs under (several names: the first one's name and
    fence, and every fence; permits: the first slot's fence, and every slot's; a reader:
    its epoch, never as a fence)."""
    from pylease._held import NamesHeld, PermitsHeld

    env = {
        "PYLEASE_NAME": held.name,
        "PYLEASE_HOLDER": held.holder,
        "PYLEASE_EPOCH" if shared else "PYLEASE_FENCE": str(held.fence),
        "PYLEASE_DSN": store.url,
    }
    if isinstance(held, NamesHeld):
        env["PYLEASE_FENCES"] = " ".join(f"{n}={f}" for n, f in held.fences.items())
    if isinstance(held, PermitsHeld):
        env["PYLEASE_SLOTS"] = " ".join(f"{s}={f}" for s, f in held.slots.items())
    if store.schema:
        env[dsn_mod.SCHEMA_VAR] = store.schema
    return env


def _taken_by(store: Store, held: Held) -> str | None:
    """Who holds what we lost, and how they got it; None if that cannot be told."""
    from pylease._held import NamesHeld, PermitsHeld

    try:
        with connect(store, "pylease run", connect_timeout=3) as (backend, conn):
            now = server_now(store, conn)
            if isinstance(held, PermitsHeld):
                rows = {r.slot: r for r in backend.permit_status(held.name)}
                return slot_taken_line(held.name, held.holder, held.slots, rows)
            fences = held.fences if isinstance(held, NamesHeld) else {held.name: held.fence}
            for name, fence in fences.items():
                row = next(iter(backend.status(name)), None)
                if row is None or (row.holder == held.holder and row.fence == fence):
                    continue
                if row.held:
                    events = backend.history(name, None, 1)
                    return _render.taken_line(name, row, events[0] if events else None, now)
            return None
    except Exception:
        return None  # the loss was said already; this is only its detail
