"""The commands of one operation each: ``migrate``, ``claim``, ``renew``, ``release``, ``steal``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from pylease import durations
from pylease._claims import default_holder
from pylease._rows import LeaseRow
from pylease.cli import _render
from pylease.cli._app import command
from pylease.cli._database import (
    Store,
    connect,
    find_store,
    server_clock,
    server_now,
    sqlite_module,
    where,
)
from pylease.cli._edge import EXIT_NO, EXIT_USAGE, at_edge, fail, key, say
from pylease.cli._options import (
    ClaimMaxPermitsOption,
    DsnOption,
    HolderOption,
    JsonOption,
    KeptMaxPermitsOption,
    NameArg,
    PermitsOption,
    RequireDsnOption,
    SchemaOption,
    SharedOption,
    TtlOption,
    VerboseOption,
    WaitOption,
    duration,
    lease_options,
)
from pylease.cli._permits import busy_line as permits_busy_line
from pylease.cli._permits import permits_wanted
from pylease.cli._render import Busy
from pylease.errors import (
    LeaseBusy,
)

if TYPE_CHECKING:
    from pylease._held import Options


@command()
def migrate(
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
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
    with at_edge(verbose) as edge:
        edge.store = store = find_store(dsn, schema, require_dsn)
        if store.sqlite:
            path = sqlite_module().path_of(store.url)
            existed = path.exists()
            with connect(store, "pylease migrate"):
                pass  # connecting creates the file and applies its migrations
            typer.echo(f"pylease: {path} is up to date" if existed else f"pylease: created {path}")
            return
        from pylease.migrate import migrate as run_migrate

        run_migrate(
            store.base_url,
            store.schema or "public",
            say=lambda line: typer.echo(f"pylease: {_render.strip_prefix(line)}"),
        )


@command()
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
    max_permits: ClaimMaxPermitsOption = None,
    permits: PermitsOption = None,
    shared: SharedOption = False,
    as_json: JsonOption = False,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="No busy line on stderr (the exit code still says)."),
    ] = False,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Claim a lease and print HOLDER<tab>FENCE; exit 1 if another holder has it.

    With --max-permits N, NAME is a semaphore: claim one of its N permits (--permits K:
    K of them) and print HOLDER and each slot's fence, tab-separated, in slot order.
    With --shared, a reader's share: FENCE is then the epoch (the fence of the latest
    writer), and the reader renews and releases with its HOLDER as a writer does.

    Example: read -r holder fence < <(pylease claim sweep --ttl 5m)
    """
    with at_edge(verbose) as edge:
        key("name", name)
        count = permits_wanted([name], max_permits, permits)
        holder = key("holder", holder) if holder is not None else default_holder()
        edge.store = store = find_store(dsn, schema, require_dsn)
        if shared and count is not None:
            raise fail("a reader's share is of a lease: leave out --max-permits", EXIT_USAGE)
        opts = lease_options(name, ttl, holder, wait, shared=shared)
        if count is not None:
            assert max_permits is not None
            _claim_permits(store, opts, max_permits, count, as_json=as_json, quiet=quiet)
            return
        _claim_lease(store, opts, as_json=as_json, quiet=quiet)


def _claim_lease(store: Store, opts: Options, *, as_json: bool, quiet: bool) -> None:
    from pylease._links import link
    from pylease._waiting import acquire

    name, holder = opts.name, opts.holder
    assert holder is not None
    fence: int | None = None
    mine: LeaseRow | None = None
    link_ = link(store.url)
    try:
        with _render.spinner(name, quiet or as_json) as show:
            busy = Busy(show)
            try:
                fence, _sent = acquire(link_, opts, holder, want_holder=True, on_busy=busy)
            except LeaseBusy:
                fence = None
        if fence is not None:
            rows = link_.run(lambda b: b.status(name), name=name)
            mine = next(iter(rows), None)
            if opts.shared and mine is not None:
                # The name's expiry is the last reader's: this reader's own is its row's.
                shares = link_.run(lambda b: b.holders(name), name=name)
                own = next((h for h in shares if h.holder == holder), None)
                if own is not None:
                    mine = dataclasses.replace(mine, expires_at=own.expires_at)
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
                    "expires_at": _render.iso(mine.expires_at) if mine else None,
                    "held_by": standing.holder if standing else None,
                    "shared": opts.shared,
                }
            )
        )
    if fence is None:
        if not as_json and not quiet:
            say(_render.busy_line(name, busy.row, server_clock(store), where(store), holder))
        raise typer.Exit(EXIT_NO)
    if not as_json:
        typer.echo(f"{holder}\t{fence}")


def _claim_permits(
    store: Store, opts: Options, max_permits: int, count: int, *, as_json: bool, quiet: bool
) -> None:
    """``claim --max-permits``: the slots granted, or the semaphore's busy line."""
    from pylease._attempts import PermitClaim
    from pylease._links import link
    from pylease._waiting import acquire_with

    name, holder = opts.name, opts.holder
    assert holder is not None
    slots: dict[int, int] = {}
    link_ = link(store.url)
    try:
        with _render.spinner(name, quiet or as_json) as show:
            # A new tenure, as a lease's claim here: another process's live slots of
            # a given holder are busy, never joined.
            attempt = PermitClaim(name, max_permits, opts.ttl, holder, count, new=True)
            with contextlib.suppress(LeaseBusy):
                slots, _sent = acquire_with(link_, attempt, opts, on_busy=Busy(show))
        rows = link_.run(lambda b: b.permit_status(name), name=name)
    finally:
        link_.close()
    if as_json:
        mine = [r for r in rows if r.slot in slots and r.holder == holder]
        typer.echo(
            json.dumps(
                {
                    "name": name,
                    "claimed": bool(slots),
                    "holder": holder,
                    "fence": next(iter(slots.values()), None),
                    "slots": {str(slot): fence for slot, fence in sorted(slots.items())},
                    "max_permits": max_permits,
                    "expires_at": _render.iso(min(r.expires_at for r in mine)) if mine else None,
                }
            )
        )
    if not slots:
        if not as_json and not quiet:
            say(permits_busy_line(name, rows, server_clock(store), where(store), count))
        raise typer.Exit(EXIT_NO)
    if not as_json:
        typer.echo("\t".join([holder, *(str(fence) for _, fence in sorted(slots.items()))]))


@command()
def renew(
    name: NameArg,
    holder: HolderOption,
    ttl: Annotated[
        timedelta | None,
        typer.Option(
            "--ttl",
            metavar="DUR",
            parser=duration("--ttl", positive=True),
            help="New lease time; default: the last one granted.",
            show_default=False,
        ),
    ] = None,
    max_permits: KeptMaxPermitsOption = None,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Extend a lease this holder still holds; exit 1 if it was released or taken.

    With --max-permits, NAME is a semaphore: every permit the holder holds is extended,
    or none (exit 1 once any was lost).

    Example: pylease renew sweep --holder "$holder" --ttl 5m
    """
    with at_edge(verbose) as edge:
        key("name", name)
        key("holder", holder)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease renew") as (backend, _conn):
            if max_permits is None:
                renewed = backend.renew(name, holder, ttl)
            else:
                renewed = backend.permit_renew(name, holder, ttl)
        if not renewed:
            if max_permits is None:
                raise fail(f"lease {name!r} is not held by {holder} any more", EXIT_NO)
            raise fail(f"semaphore {name!r}: {holder} holds none of its permits any more", EXIT_NO)


@command()
def release(
    name: NameArg,
    holder: HolderOption,
    min_hold: Annotated[
        timedelta | None,
        typer.Option(
            "--min-hold",
            metavar="DUR",
            parser=duration("--min-hold"),
            help="Keep the name unavailable until this long after the claim.",
            show_default=False,
        ),
    ] = None,
    max_permits: KeptMaxPermitsOption = None,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Give a lease back (only this holder's); exit 1 if it was not held by this holder.

    With --max-permits, NAME is a semaphore: every permit the holder holds is given
    back (exit 1 if any was no longer its own).

    Example: pylease release sweep --holder "$holder"
    """
    with at_edge(verbose) as edge:
        key("name", name)
        key("holder", holder)
        permits_wanted([name], max_permits, None, min_hold)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease release") as (backend, _conn):
            if max_permits is None:
                released = backend.release(name, holder, min_hold)
            else:
                released = backend.permit_release(name, holder)
        if not released:
            if max_permits is None:
                raise fail(f"lease {name!r} was not held by {holder}", EXIT_NO)
            raise fail(f"semaphore {name!r}: {holder} did not hold its permits", EXIT_NO)


@command()
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
            parser=duration("--older-than"),
            help="Only if its holder last claimed or renewed at least this long ago.  [default: 0]",
            show_default=False,
        ),
    ] = timedelta(0),
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Take a lease whatever its state (an operator's break-lock) and print HOLDER<tab>FENCE.

    Exit 1 if its holder renewed more recently than --older-than. The lease's holder
    learns at its next renewal that the lease is lost (pylease run stops its command).

    Example: pylease steal sweep --ttl 5m --holder ops --older-than 10m
    """
    with at_edge(verbose) as edge:
        key("name", name)
        key("holder", holder)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease steal") as (backend, conn):
            fence = backend.steal(name, ttl, holder, older_than)
            row = next(iter(backend.status(name)), None) if fence is None else None
            now = server_now(store, conn)
        if fence is None:
            renewed = (
                durations.relative(now - _render.aware(row.renewed_at), "{} ago", "in {}")
                if row
                else "recently"
            )
            raise fail(
                f"lease {name!r} not stolen: "
                f"{_render.who(row) if row else 'its holder'} "
                f"renewed it {renewed}, less than --older-than",
                EXIT_NO,
            )
        typer.echo(f"{holder}\t{fence}")


@command(name="request-release")
def request_release(
    name: NameArg,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            metavar="WHO",
            help="Who asks, as the holder will be told (default: user@host).",
            show_default=False,
        ),
    ] = None,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Ask the holder of a lease to step down; exit 1 if the lease is not held.

    The holder's keeper learns of it at its next renewal (within a third of the ttl):
    `pylease run` and `pylease leader` then stop their command as for a loss, release,
    and exit 76, so that a waiting standby takes over at once; a program told by
    `on_release_requested` (or `held.release_requested`) leaves when its work allows.
    Not executable by PUBLIC in SQL: an owner grants lease_request_release.

    Example: pylease request-release scheduler --by deploy-2.5
    """
    with at_edge(verbose) as edge:
        key("name", name)
        who = key("by", by if by is not None else _asker())
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease request-release") as (backend, _conn):
            asked = backend.request_release(name, who)
        if not asked:
            raise fail(f"lease {name!r} is not held: nobody to ask", EXIT_NO)
        say(f"asked the holder of lease {name!r} to step down (as {who})")


def _asker() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container)
        user = f"uid-{os.getuid()}"
    return f"{user}@{socket.gethostname()}"
