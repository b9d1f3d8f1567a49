"""The commands that show leases (``status``, ``holders``, ``history``, ``metrics``) and
prune them."""

from __future__ import annotations

import json
import sys
import threading
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from pylease._operations import LeaseRow
from pylease.cli import _groups, _render
from pylease.cli._app import command
from pylease.cli._database import Store, connect, find_store, server_now
from pylease.cli._edge import EXIT_CONFIG, EXIT_USAGE, at_edge, fail, first_line, key, say
from pylease.cli._options import (
    DsnOption,
    PrefixOption,
    RequireDsnOption,
    SchemaOption,
    VerboseOption,
    duration,
    width,
)
from pylease.cli._permits import Semaphore, semaphore_json, semaphores


@command()
def status(
    name: Annotated[
        str | None,
        typer.Argument(metavar="[NAME]", help="One lease; default: all.", show_default=False),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of objects with ISO-8601 times.")
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Show holders whole, whatever the terminal's width.")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Redraw as leases change, until Ctrl-C.")
    ] = False,
    prefix: PrefixOption = None,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Show every lease (or one): state, holder, fence, how long, and when it expires.

    STATE is held, resting (released with a min-hold that has not run out), released or
    expired (its holder died or stalled); a semaphore's is how many of its permits are
    held (3/4 held; `pylease permits NAME` lists them). AGE: held for, or free since.
    Groups follow, apart: their live members, the partitions held, when the first
    member expires (`pylease members GROUP` lists them).
    Fits the terminal: holders are shortened in the middle, names never (--wide: whole).

    Example: pylease status --json | jq '.[] | select(.state == "held")'
    """
    with at_edge(verbose) as edge:
        if name is not None:
            key("name", name)
            if prefix is not None:
                raise fail("give NAME or --prefix, not both", EXIT_USAGE)
        if prefix:
            key("prefix", prefix)
        edge.store = store = find_store(dsn, schema, require_dsn)
        if watch:
            if as_json:
                raise fail("--watch draws a table; leave out --json", EXIT_USAGE)
            _watch(store, name, prefix, wide)
            return
        with connect(store, "pylease status") as (backend, conn):
            rows = _rows(backend, name, prefix)
            found = _groups.group_lines(backend, name, prefix)
            now = server_now(store, conn)
        if as_json:
            typer.echo(json.dumps([*(_json(r) for r in rows), *(g.json() for g in found)]))
            return
        typer.echo("\n".join(_status_lines(store, name, prefix, rows, found, now, wide)))


def _rows(backend: Any, name: str | None, prefix: str | None) -> list[LeaseRow | Semaphore]:
    """One name, the names that start with ``prefix``, or all of them: leases and
    semaphores, in name order."""
    leases: list[LeaseRow] = list(backend.status_page(prefix)) if prefix else backend.status(name)
    if name is not None and leases:
        return list(leases)  # a name has one kind
    found = semaphores(backend.permit_status(name))
    if prefix:
        found = [s for s in found if s.name.startswith(prefix)]
    return sorted([*leases, *found], key=lambda r: r.name)


def _json(row: LeaseRow | Semaphore) -> dict[str, Any]:
    return _render.row_json(row) if isinstance(row, LeaseRow) else semaphore_json(row)


def _status_lines(
    store: Store,
    name: str | None,
    prefix: str | None,
    rows: list[LeaseRow | Semaphore],
    found: list[_groups.Group],
    now: datetime,
    wide: bool,
) -> list[str]:
    head = []
    if store.default_file is not None:
        head.append(f"leases in {store.default_file} (this user's default SQLite file)")
    tail = _groups.status_lines(found, now, wide)
    if not rows and tail:
        return [*head, *tail[1:]]
    if not rows:
        if name:
            what = f"no lease named {name!r}"
        elif prefix:
            what = f"no lease whose name starts with {prefix!r}"
        else:
            what = f"no leases yet in {store.shown}"
        return [*head, what]
    return [*head, *_render.table(rows, now, width(wide)), *tail]


def _watch(store: Store, name: str | None, prefix: str | None, wide: bool) -> None:
    """Redraw until Ctrl-C: woken by a release's NOTIFY on PostgreSQL, polling on SQLite."""
    from pylease import _hub

    # The process's one listener; one name's releases, or every name's.
    watcher = None if store.sqlite else _hub.watch(store.url, name)
    stop = threading.Event()

    def wake(timeout: float) -> None:
        if watcher is None:
            stop.wait(timeout)
        else:
            watcher.wait(timeout)

    try:
        with connect(store, "pylease status --watch") as (backend, conn):

            def draw() -> list[str]:
                rows = _rows(backend, name, prefix)
                found = _groups.group_lines(backend, name, prefix)
                now = server_now(store, conn)
                return _status_lines(store, name, prefix, rows, found, now, wide)

            for frame in _render.watch_frames(draw, wake, sys.stdout.isatty()):
                typer.echo(frame)
    except KeyboardInterrupt:
        pass
    finally:
        if watcher is not None:
            watcher.close()


@command()
def holders(
    name: Annotated[
        str | None,
        typer.Argument(metavar="[NAME]", help="One name; default: all.", show_default=False),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of objects with ISO-8601 times.")
    ] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Show holders whole.")] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    require_dsn: RequireDsnOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Show every current holder of every kind: a lease's writer (exclusive), its
    readers (shared; FENCE is a reader's epoch), a semaphore's permits (with SLOT).

    Example: pylease holders reports --json | jq length
    """
    with at_edge(verbose) as edge:
        if name is not None:
            key("name", name)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease holders") as (backend, conn):
            rows = backend.holders(name)
            # lease_holders keeps its shape (contract 5.2): a writer's data is its tenure's
            # in lease_status, matched by fence so that a newer tenure's is never shown.
            tenures = {(s.name, s.fence): s.data for s in backend.status(name)} if rows else {}
            now = server_now(store, conn)
        data = [tenures.get((r.name, r.fence)) if r.mode == "exclusive" else None for r in rows]
        if as_json:
            typer.echo(
                json.dumps([_render.holder_json(r, d) for r, d in zip(rows, data, strict=True)])
            )
        elif not rows:
            typer.echo(
                f"nobody holds {name!r}" if name else f"nobody holds a lease in {store.shown}"
            )
        else:
            typer.echo("\n".join(_render.holders_lines(rows, data, now, width(wide))))


@command()
def history(
    name: Annotated[
        str | None,
        typer.Argument(metavar="[NAME]", help="One lease; default: all.", show_default=False),
    ] = None,
    since: Annotated[
        timedelta | None,
        typer.Option(
            "--since",
            metavar="DUR",
            parser=duration("--since"),
            help="Only events at most this old.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            metavar="N",
            min=1,
            max=10000,
            help="At most N events (1 to 10000).  [default: 100]",
            show_default=False,
        ),
    ] = 100,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of objects with ISO-8601 times.")
    ] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Show holders whole.")] = False,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Show what happened to leases, newest first: takeovers and steals (and, with
    pylease.history = 'all', claims and releases).

    Example: pylease history sweep --since 1d
    """
    with at_edge(verbose) as edge:
        if name is not None:
            key("name", name)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease history") as (backend, conn):
            now = server_now(store, conn)
            # A span back from the database's own now: one clock.
            events = backend.history(name, since, limit)
        if as_json:
            typer.echo(
                json.dumps(
                    [
                        {
                            "at": _render.iso(e.at),
                            "name": e.name,
                            "event": e.event,
                            "holder": e.holder,
                            "fence": e.fence,
                            "previous_holder": e.previous_holder,
                        }
                        for e in events
                    ]
                )
            )
            return
        if not events:
            typer.echo("no events" + (f" for lease {name!r}" if name else ""))
            return
        typer.echo("\n".join(_render.history_lines(events, now, width(wide))))


@command(name="prune")
def prune(
    idle_for: Annotated[
        timedelta,
        typer.Option(
            "--idle-for",
            metavar="DUR",
            parser=duration("--idle-for"),
            help="Delete the names nobody has held for at least this long.",
            show_default=False,
        ),
    ],
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Delete the names nobody has held for a while and print how many.

    Their counters go with them, their history stays until prune-history; a pruned
    name's next grant still gets a fence above every fence it had.

    Example: pylease prune --idle-for 30d
    """
    with at_edge(verbose) as edge:
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease prune") as (backend, _conn):
            removed = backend.prune(idle_for)
        typer.echo(f"removed {removed} name{'' if removed == 1 else 's'}")


@command(name="prune-history")
def prune_history(
    older_than: Annotated[
        timedelta,
        typer.Option(
            "--older-than",
            metavar="DUR",
            parser=duration("--older-than"),
            help="Delete the events older than this.",
            show_default=False,
        ),
    ],
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Delete old history events and print how many; the counters are never pruned.

    Example: pylease prune-history --older-than 90d
    """
    with at_edge(verbose) as edge:
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease prune-history") as (backend, _conn):
            removed = backend.prune_history(older_than)
        typer.echo(f"removed {removed} event{'' if removed == 1 else 's'}")


#: How many names a scrape reports at most, unless --max-names says otherwise: a scrape
#: of this many takes well under a second, far from Prometheus's default 10 s timeout.
MAX_NAMES = 1000


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host.strip("[]") or "0.0.0.0", int(port)


@command()
def metrics(
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Serve /metrics here (e.g. 127.0.0.1:9464) until interrupted.",
            show_default=False,
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option("--once", help="Print the metrics once (node_exporter's textfile collector)."),
    ] = False,
    prefix: PrefixOption = None,
    names: Annotated[
        list[str] | None,
        typer.Option(
            "--names",
            metavar="PATTERN",
            help="Only leases whose name matches (shell-style, e.g. 'sweep-*'); repeatable. "
            "Filtered here, after the database: over many names, give --prefix too.",
            show_default=False,
        ),
    ] = None,
    max_names: Annotated[
        int,
        typer.Option(
            "--max-names",
            metavar="N",
            min=1,
            help="Series for at most N names (the first by name); pylease_names_omitted "
            f"counts the others.  [default: {MAX_NAMES}]",
            show_default=False,
        ),
    ] = MAX_NAMES,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Leases as Prometheus metrics: held, seconds to expiry, fence, held for, and the
    grants, takeovers, steals and releases counters, each labelled with the lease name;
    for a semaphore, the permits in use and its limit, and the same counters; for a
    group, its live members and the partitions each member owns.

    Example: pylease metrics --listen 127.0.0.1:9464 --prefix report-
    """
    with at_edge(verbose) as edge:
        if (listen is None) == (not once):
            raise fail("give one of --listen HOST:PORT and --once", EXIT_USAGE)
        address = _listen_address(listen) if listen is not None else None
        if prefix:
            key("prefix", prefix)
        edge.store = store = find_store(dsn, schema, require_dsn)
        try:
            from pylease.cli import _metrics
        except ImportError:
            raise fail(
                "pylease metrics needs prometheus-client: pip install 'pylease-pg[metrics]'",
                EXIT_CONFIG,
            ) from None

        def read() -> tuple[list[_metrics.Row], int, datetime]:
            with connect(store, "pylease metrics") as (backend, conn):
                # With patterns, every name of the prefix: they filter before the cut.
                rows = backend.status_page(prefix or "", None if names else max_names)
                sems, sems_omitted = _metrics.semaphore_rows(
                    backend, prefix or "", names or (), max_names
                )
                grps, grps_omitted = _metrics.group_rows(
                    backend, prefix or "", names or (), max_names
                )
                now = server_now(store, conn)
            kept, omitted = _metrics.select(rows, names or (), max_names)
            return [*kept, *sems, *grps], omitted + sems_omitted + grps_omitted, now

        if once:
            read()  # an error here is this command's own: loud, exit 3
            typer.echo(_metrics.text(_metrics.LeaseCollector(read)), nl=False)
            return
        assert address is not None
        told: list[str] = []

        def on_error(exc: Exception) -> None:
            line = _render.strip_prefix(first_line(exc))
            if not told or told[-1] != line:
                say(f"reading the leases failed (pylease_up 0): {line}")
            told[:] = [line]

        collector = _metrics.LeaseCollector(read, on_error)

        def ready(host: str, port: int) -> None:
            shown = f"[{host}]" if ":" in host else host
            say(f"serving metrics on http://{shown}:{port}/metrics ({store.shown})")

        try:
            _metrics.serve(collector, address[0], address[1], ready)
        except OSError as exc:
            raise fail(f"cannot listen on {listen}: {exc.strerror or exc}", EXIT_CONFIG) from None
