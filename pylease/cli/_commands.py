"""The commands of one operation each: ``migrate``, ``claim``, ``renew``, ``release``, ``steal``."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Annotated

import typer

from pylease import durations
from pylease._claims import default_holder
from pylease._operations import LeaseRow
from pylease.cli import _render
from pylease.cli._app import command
from pylease.cli._database import (
    connect,
    find_store,
    server_clock,
    server_now,
    sqlite_module,
    where,
)
from pylease.cli._edge import EXIT_NO, at_edge, fail, key, say
from pylease.cli._options import (
    DsnOption,
    HolderOption,
    JsonOption,
    NameArg,
    RequireDsnOption,
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
)


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

    Example: read -r holder fence < <(pylease claim sweep --ttl 5m)
    """
    from pylease._links import link
    from pylease._waiting import acquire

    with at_edge(verbose) as edge:
        key("name", name)
        holder = key("holder", holder) if holder is not None else default_holder()
        edge.store = store = find_store(dsn, schema, require_dsn)
        opts = lease_options(name, ttl, holder, wait)
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
                    }
                )
            )
        if fence is None:
            if not as_json and not quiet:
                say(_render.busy_line(name, busy.row, server_clock(store), where(store), holder))
            raise typer.Exit(EXIT_NO)
        if not as_json:
            typer.echo(f"{holder}\t{fence}")


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
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Extend a lease this holder still holds; exit 1 if it was released or taken.

    Example: pylease renew sweep --holder "$holder" --ttl 5m
    """
    with at_edge(verbose) as edge:
        key("name", name)
        key("holder", holder)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease renew") as (backend, _conn):
            renewed = backend.renew(name, holder, ttl)
        if not renewed:
            raise fail(f"lease {name!r} is not held by {holder} any more", EXIT_NO)


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
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Give a lease back (only this holder's); exit 1 if it was not held by this holder.

    Example: pylease release sweep --holder "$holder"
    """
    with at_edge(verbose) as edge:
        key("name", name)
        key("holder", holder)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease release") as (backend, _conn):
            released = backend.release(name, holder, min_hold)
        if not released:
            raise fail(f"lease {name!r} was not held by {holder}", EXIT_NO)


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
                f"{_render.printable(row.holder) if row else 'its holder'} "
                f"renewed it {renewed}, less than --older-than",
                EXIT_NO,
            )
        typer.echo(f"{holder}\t{fence}")
