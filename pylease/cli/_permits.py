"""Semaphores on the command line (contract 5.1): ``pylease permits NAME``, and what
``run``, ``claim``, ``status`` and ``metrics`` share about them: a semaphore read from
its slots, its line in ``status``, its busy line, the checks of ``--max-permits``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from pylease import durations
from pylease._rows import PermitRow
from pylease.cli import _render
from pylease.cli._app import command
from pylease.cli._database import connect, find_store, server_now
from pylease.cli._edge import EXIT_USAGE, at_edge, fail, key
from pylease.cli._options import (
    DsnOption,
    NameArg,
    RequireDsnOption,
    SchemaOption,
    VerboseOption,
    width,
)


@dataclass(frozen=True)
class Semaphore:
    """A semaphore as ``permit_status`` tells it: its limit and every slot ever used."""

    name: str
    max_permits: int
    slots: tuple[PermitRow, ...]

    @property
    def held(self) -> tuple[PermitRow, ...]:
        """The slots held now (unexpired, not released), the first to expire first."""
        return tuple(sorted((r for r in self.slots if r.held), key=lambda r: r.expires_at))

    @property
    def state(self) -> str:
        """``3/4 held``: what ``status`` shows."""
        return f"{len(self.held)}/{self.max_permits} held"

    def cells(self, now: datetime) -> _render.Cells:
        """Its line in ``status``: ``3/4 held``; its holder when one holder holds every
        permit in use; held since its oldest permit; expiring with its first."""
        held = self.held
        holders = {r.holder for r in held}
        if len(holders) == 1:
            holder = _render.printable(next(iter(holders)))
        else:
            holder = f"{len(holders)} holders" if holders else "-"
        if held:
            age = durations.spell(now - min(_render.aware(r.acquired_at) for r in held))
            until = durations.relative(_render.aware(held[0].expires_at) - now, "in {}", "{} ago")
        else:
            age = until = "-"
        return _render.Cells(_render.printable(self.name), self.state, holder, "-", age, until)


def semaphores(rows: Sequence[PermitRow]) -> list[Semaphore]:
    """``permit_status`` rows (in name and slot order) as one :class:`Semaphore` per name."""
    found: dict[str, list[PermitRow]] = {}
    for row in rows:
        found.setdefault(row.name, []).append(row)
    return [Semaphore(name, slots[0].max_permits, tuple(slots)) for name, slots in found.items()]


def permits_wanted(
    names: Sequence[str],
    max_permits: int | None,
    permits: int | None,
    min_hold: timedelta | None = None,
) -> int | None:
    """How many permits a claim takes (None: NAME is a lease, not a semaphore).

    :raises typer.Exit: a usage error: options that mean nothing together.
    """
    if max_permits is None:
        if permits is not None:
            raise fail(
                "--permits counts permits of a semaphore: give --max-permits too", EXIT_USAGE
            )
        return None
    if len(names) > 1:
        raise fail("--max-permits takes one NAME (a semaphore), not several", EXIT_USAGE)
    if min_hold is not None:
        raise fail("--min-hold is for a lease; permits have none", EXIT_USAGE)
    wanted = 1 if permits is None else permits
    if wanted > max_permits:
        raise fail(f"--permits {wanted} is more than --max-permits {max_permits}", EXIT_USAGE)
    return wanted


# How they read ------------------------------------------------------------------------


def busy_line(
    name: str, rows: Sequence[PermitRow], now: datetime, where: str | None, wanted: int
) -> str:
    """Why a claim of ``wanted`` permits was refused: how many are held, and when the
    first of them expires."""
    place = f" (in {where})" if where else ""
    sem = next(iter(semaphores(rows)), None)
    if sem is None:
        return f"semaphore {name!r} is busy{place}"
    held = sem.held
    want = f", {wanted} wanted" if wanted > 1 else ""
    if not held:
        return f"semaphore {name!r} is busy: {sem.state}{want}{place}"
    left = _render.aware(held[0].expires_at) - now
    until = durations.relative(left, "the first expires in {}", "the first expired {} ago")
    return f"semaphore {name!r} is busy: {sem.state}{want}, {until}{place}"


def slot_taken_line(
    name: str, holder: str, slots: dict[int, int], rows: dict[int, PermitRow]
) -> str | None:
    """Who holds a slot we lost (``rows``: the semaphore's, by slot); None if none does."""
    for slot, fence in slots.items():
        row = rows.get(slot)
        if row is not None and row.held and (row.holder, row.fence) != (holder, fence):
            by = _render.printable(row.holder)
            return f"slot {slot} of semaphore {name!r} is now held by {by} (fence {row.fence})"
    return None


def slot_json(row: PermitRow) -> dict[str, Any]:
    return {
        "slot": row.slot,
        "holder": row.holder,
        "fence": row.fence,
        "held": row.held,
        "state": row.state,
        "acquired_at": _render.iso(row.acquired_at),
        "renewed_at": _render.iso(row.renewed_at),
        "expires_at": _render.iso(row.expires_at),
        "ttl": row.ttl.total_seconds(),
    }


def semaphore_json(sem: Semaphore) -> dict[str, Any]:
    """A semaphore in ``status --json`` and ``permits --json``: ``state`` is ``held``
    while any permit is, else ``free``; ``in_use`` counts the permits held."""
    in_use = len(sem.held)
    return {
        "name": sem.name,
        "kind": "semaphore",
        "max_permits": sem.max_permits or None,  # None: no such semaphore
        "in_use": in_use,
        "held": in_use > 0,
        "state": "held" if in_use else "free",
        "slots": [slot_json(r) for r in sem.slots],
    }


SLOT_HEADER = _render.Cells("SLOT", "STATE", "HOLDER", "FENCE", "AGE", "EXPIRES")


@command()
def permits(
    name: NameArg,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object, its slots in a list.")
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Show holders whole, whatever the terminal's width.")
    ] = False,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Show the slots of the semaphore NAME: who holds each permit, its fence, until when.

    A slot is listed once it was first granted; one above a lowered limit drains as
    its holder leaves. Each slot has its own fence (pass it to permit_holds).

    Example: pylease permits export --json | jq '.in_use'
    """
    with at_edge(verbose) as edge:
        key("name", name)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease permits") as (backend, conn):
            sem = next(iter(semaphores(backend.permit_status(name))), None)
            lease = sem is None and bool(backend.status(name))
            now = server_now(store, conn)
        if as_json:
            typer.echo(json.dumps(semaphore_json(sem or Semaphore(name, 0, ()))))
            return
        if sem is None:
            lease_is = f"{name!r} is a lease, not a semaphore (see pylease status {name})"
            typer.echo(lease_is if lease else f"no semaphore named {name!r}")
            return
        lines = _render.table(sem.slots, now, width(wide), header=SLOT_HEADER)
        typer.echo("\n".join([f"semaphore {name!r}: {sem.state}", *lines]))
