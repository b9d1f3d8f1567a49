"""The ``pylease`` command."""

from __future__ import annotations

from typing import Annotated

import typer

from pylease import __version__
from pylease import dsn as dsn_mod
from pylease.errors import PyleaseError

app = typer.Typer(
    name="pylease",
    help="Leases (locks with an expiry) arbitrated by PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

EXIT_CONFIG = 3

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="Database URL; default: $PYLEASE_DSN, else $DATABASE_URL.",
        show_default=False,
    ),
]


def _fail(message: str, code: int = EXIT_CONFIG) -> typer.Exit:
    typer.echo(message if message.startswith("pylease:") else f"pylease: {message}", err=True)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pylease {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Leases (locks with an expiry) arbitrated by PostgreSQL."""


@app.command()
def migrate(
    dsn: DsnOption = None,
    schema: Annotated[str, typer.Option("--schema", help="Schema to install into.")] = "public",
) -> None:
    """Install or upgrade the pylease schema (idempotent; safe to run from two deploys at once).

    Example: pylease migrate --dsn postgresql://app@db/app
    """
    from pylease.migrate import migrate as run_migrate

    url = dsn_mod.from_environment(dsn)
    if url is None:
        raise _fail("no database given: pass --dsn or set PYLEASE_DSN or DATABASE_URL")
    try:
        run_migrate(url, schema, say=lambda line: typer.echo(f"pylease: {line}"))
    except PyleaseError as exc:
        raise _fail(str(exc)) from None


def main() -> None:
    """Entry point of the ``pylease`` script."""
    app()
