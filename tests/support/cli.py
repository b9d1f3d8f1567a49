"""The ``pylease`` command run in-process, as the CLI tests call it."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from pylease.cli import app

runner = CliRunner()

#: The environment variables that would point a command at a database, or change how
#: a URL is read: unset, so that a test says where the database is.
NO_DSN: dict[str, str | None] = {
    "PYLEASE_DSN": None,
    "DATABASE_URL": None,
    "PYLEASE_SCHEMA": None,
    "PGHOST": None,
    "PGSERVICE": None,
}


def cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """``pylease ARGS...``, with only ``env`` beside an environment that names no database."""
    return runner.invoke(app, list(args), env={**NO_DSN, **(env or {})})


def ok(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """:func:`cli`, which must exit 0."""
    result = cli(*args, env=env)
    assert result.exit_code == 0, result.output
    return result
