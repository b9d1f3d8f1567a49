"""Groups on the command line (contract 5.5): ``pylease members GROUP``, and what ``status``
and ``metrics`` share about groups: the groups ever joined (``group_status``), listed apart
from leases, and how many partitions each member owns.

A partition is owned by holding the lease ``<grp>#<part>``, whose holder is the member's
name; the partitions a member owns are read from those leases.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import typer

from pylease import durations
from pylease._checks import MAX_GROUP_LENGTH
from pylease._operations import GroupRow, MemberRow
from pylease.cli import _render
from pylease.cli._app import command
from pylease.cli._database import connect, find_store, server_now
from pylease.cli._edge import at_edge, key
from pylease.cli._options import DsnOption, RequireDsnOption, SchemaOption, VerboseOption, width
from pylease.errors import SchemaMissing

GROUP_HEADER = _render.Cells("GROUP", "MEMBERS", "PARTITIONS", "INCARNATION", "", "EXPIRES")
MEMBER_HEADER = _render.Cells("MEMBER", "PARTITIONS", "DATA", "INCARNATION", "AGE", "EXPIRES")


def owned(backend: Any, grp: str) -> dict[str, list[int]]:
    """The partitions of ``grp`` whose leases are held now, by holder (a member's name)."""
    found: dict[str, list[int]] = {}
    head = f"{grp}#"
    for row in backend.status_page(head, None):
        part = row.name[len(head) :]
        if row.held and part.isdigit() and str(int(part)) == part:
            found.setdefault(row.holder, []).append(int(part))
    return found


def groups(backend: Any, name: str | None = None, prefix: str | None = None) -> list[GroupRow]:
    """The groups ever joined (``name``'s alone; those whose name starts with ``prefix``);
    none on a schema before pylease-0015 (groups are listed from it on)."""
    if name is not None and len(name) > MAX_GROUP_LENGTH:
        return []  # a lease's name, longer than any group's
    try:
        rows: list[GroupRow] = backend.group_status(name)
    except SchemaMissing:
        return []
    return [r for r in rows if not prefix or r.grp.startswith(prefix)]


@dataclass(frozen=True)
class Group:
    """A group's line in ``status``: its live members, the partitions held, when its
    first member expires."""

    row: GroupRow
    partitions: int

    @property
    def name(self) -> str:
        return self.row.grp

    def cells(self, now: datetime) -> _render.Cells:
        row = self.row
        expires = "-"
        if row.expires_at is not None:
            expires = durations.relative(_render.aware(row.expires_at) - now, "in {}", "{} ago")
        parts = str(self.partitions) if self.partitions else "-"
        return _render.Cells(
            _render.printable(row.grp), str(row.members), parts, str(row.incarnation), "", expires
        )

    def json(self) -> dict[str, Any]:
        row = self.row
        return {
            "name": row.grp,
            "kind": "group",
            "members": row.members,
            "partitions_held": self.partitions,
            "incarnation": row.incarnation,
            "expires_at": None if row.expires_at is None else _render.iso(row.expires_at),
        }


def group_lines(backend: Any, name: str | None, prefix: str | None) -> list[Group]:
    """The groups of ``status``, with the partitions held of each."""
    return [
        Group(row, sum(len(p) for p in owned(backend, row.grp).values()))
        for row in groups(backend, name, prefix)
    ]


def status_lines(found: Sequence[Group], now: datetime, wide: bool) -> list[str]:
    """The groups' table under the leases' in ``status`` (nothing without groups)."""
    if not found:
        return []
    return ["", *_render.table(found, now, width(wide), header=GROUP_HEADER)]


@dataclass(frozen=True)
class Member:
    """A member's line in ``members``."""

    row: MemberRow
    parts: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.row.member

    def cells(self, now: datetime) -> _render.Cells:
        row = self.row
        data = "-" if row.data is None else json.dumps(row.data, ensure_ascii=False)
        age = durations.spell(now - _render.aware(row.joined_at))
        until = durations.relative(_render.aware(row.expires_at) - now, "in {}", "{} ago")
        parts = str(len(self.parts)) if self.parts else "-"
        return _render.Cells(
            _render.printable(row.member), parts, _render.printable(data), str(row.incarnation),
            age, until,
        )  # fmt: skip

    def json(self) -> dict[str, Any]:
        row = self.row
        return {
            "member": row.member,
            "incarnation": row.incarnation,
            "joined_at": _render.iso(row.joined_at),
            "renewed_at": _render.iso(row.renewed_at),
            "expires_at": _render.iso(row.expires_at),
            "data": row.data,
            "partitions": list(self.parts),
        }


@command()
def members(
    grp: Annotated[str, typer.Argument(metavar="GROUP", help="The group.", show_default=False)],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object, its members in a list.")
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Show data whole, whatever the terminal's width.")
    ] = False,
    dsn: DsnOption = None,
    require_dsn: RequireDsnOption = False,
    schema: SchemaOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Show the live members of GROUP: incarnation, data, how long since they joined,
    when they expire, and how many of the group's partitions each owns (the leases
    GROUP#N it holds).

    Example: pylease members indexers --json | jq '.members[].member'
    """
    with at_edge(verbose) as edge:
        key("grp", grp)
        edge.store = store = find_store(dsn, schema, require_dsn)
        with connect(store, "pylease members") as (backend, conn):
            rows = backend.group_members(grp)
            held = owned(backend, grp)
            now = server_now(store, conn)
        found = [Member(r, tuple(sorted(held.get(r.member, ())))) for r in rows]
        if as_json:
            doc = {"group": grp, "kind": "group", "members": [m.json() for m in found]}
            typer.echo(json.dumps(doc))
            return
        if not found:
            typer.echo(f"no live member in group {grp!r}")
            return
        count = f"{len(found)} member" + ("s" if len(found) != 1 else "")
        lines = _render.table(found, now, width(wide), header=MEMBER_HEADER)
        typer.echo("\n".join([f"group {grp!r}: {count}", *lines]))
