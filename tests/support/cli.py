"""The ``pylease`` command run in-process, as the CLI tests call it."""

from __future__ import annotations

import os
import subprocess
import sys

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


def ok_in_a_process(*args: str) -> None:
    """``pylease ARGS...`` in a process of its own, which must exit 0.

    For a command run while another runs in-process (a thread that releases what a
    waiting claim waits for): the runner swaps this process's stdout for each command
    it runs, so two at once would write into each other's output.
    """
    env = {k: v for k, v in os.environ.items() if k not in NO_DSN}
    done = subprocess.run(
        [sys.executable, "-m", "pylease", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
