"""Mistakes a command line invites never run the wrong thing silently (issue 29, item 2).

A forgotten NAME must not turn the command's first word into a lease name; a lost or
misspelled DSN must not quietly give every host a lease file of its own.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import cli, ok


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYLEASE_DSN", "DATABASE_URL", "PYLEASE_REQUIRE_DSN")
    }
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env.update(extra)
    return env


def pylease(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``pylease ARGS`` as cron runs it: no terminal anywhere."""
    return subprocess.run(
        [sys.executable, "-m", "pylease", *args],
        env=_env(tmp_path, **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


# NAME before --, CMD after it --------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "leader"])
def test_a_forgotten_name_is_a_usage_error_that_says_where_it_goes(
    tmp_path: Path, command: str
) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    marker = tmp_path / "ran"
    result = cli(command, "--ttl", "1m", "--dsn", url, "--", "touch", str(marker))
    assert result.exit_code == 2, result.output
    names = "NAME [NAME...]" if command == "run" else "NAME"
    assert result.stderr == (
        f"pylease: NAME goes before '--': pylease {command} {names} [OPTIONS] -- CMD [ARG...] "
        f"(see 'pylease {command} --help')\n"
    )
    assert not marker.exists()
    assert ok("status", "--json", "--dsn", url).stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["run", "leader"])
def test_a_missing_option_is_named_not_taken_for_a_missing_name(
    tmp_path: Path, command: str
) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    result = cli(command, "x", "--dsn", url, "--", "true")
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"pylease: Missing option '--ttl' (see 'pylease {command} --help')\n")


@pytest.mark.parametrize("command", ["run", "leader"])
def test_a_command_without_its_separator_is_a_usage_error(tmp_path: Path, command: str) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    result = cli(command, "--ttl", "1m", "--dsn", url, "echo", "hi")
    assert result.exit_code == 2, result.output
    assert "the command goes after --" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert ok("status", "--json", "--dsn", url).stdout.strip() == "[]"


def test_the_separator_does_not_get_in_the_way_of_help_or_of_a_right_command(
    tmp_path: Path,
) -> None:
    assert "-- CMD [ARG...]" in ok("run", "--ttl", "1m", "--help").stdout
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    done = pylease(tmp_path, "run", "job", "--ttl", "1m", "--dsn", url, "--", "echo", "hi")
    assert (done.returncode, done.stdout, done.stderr) == (0, "hi\n", "")


# The embedded default is said, and can be refused -------------------------------------


def test_the_embedded_default_is_said_even_with_quiet(tmp_path: Path) -> None:
    done = pylease(tmp_path, "run", "job", "--ttl", "1m", "--quiet", "--", "true")
    assert done.returncode == 0, done.stderr
    path = tmp_path / "state" / "pylease" / "leases.sqlite3"
    assert done.stderr == (
        "pylease: no database given (--dsn, PYLEASE_DSN, DATABASE_URL): using this user's "
        f"SQLite file {path} (--require-dsn makes this an error)\n"
    )
    said = cli("status", env={"XDG_STATE_HOME": str(tmp_path / "state")}).stderr
    assert said.startswith("pylease: no database given")


def test_a_misspelled_or_empty_variable_is_named(tmp_path: Path) -> None:
    done = pylease(tmp_path, "status", PYLEASE_DNS="postgresql://db/app", DATABASE_URL="")
    assert done.returncode == 0, done.stderr
    assert "DATABASE_URL is set but empty" in done.stderr
    assert "PYLEASE_DNS is set: did you mean PYLEASE_DSN?" in done.stderr


def test_a_database_given_explicitly_is_not_remarked_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    assert pylease(tmp_path, "status", "--dsn", url).stderr == ""
    assert pylease(tmp_path, "status", PYLEASE_DSN=url).stderr == ""
    assert pylease(tmp_path, "status", DATABASE_URL=url, PYLEASE_REQUIRE_DSN="1").stderr == ""


def test_on_a_terminal_the_default_is_not_remarked_on(tmp_path: Path) -> None:
    # Someone trying pylease at a shell: the default is what they want.
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pylease", "status"],
            env=_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=follower,
        )
        os.close(follower)
        follower = -1
        proc.communicate(timeout=60)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert proc.returncode == 0
    assert b"no database given" not in seen


@pytest.mark.parametrize("how", ["--require-dsn", "PYLEASE_REQUIRE_DSN=1"])
def test_require_dsn_makes_the_fallback_an_error(tmp_path: Path, how: str) -> None:
    flag = [how] if how.startswith("--") else []
    env = {} if flag else {"PYLEASE_REQUIRE_DSN": "1"}
    marker = tmp_path / "ran"
    done = pylease(
        tmp_path, "run", "job", "--ttl", "1m", "-q", *flag, "--", "touch", str(marker), **env
    )
    assert done.returncode == 3
    assert done.stderr == (
        "pylease: no database given (--dsn, PYLEASE_DSN, DATABASE_URL) and one is required "
        "(--require-dsn or PYLEASE_REQUIRE_DSN)\n"
    )
    assert not marker.exists()
    assert not (tmp_path / "state").exists(), "the default file was created all the same"
    for args in (["status"], ["claim", "x", "--ttl", "1m"], ["migrate"]):
        assert pylease(tmp_path, *args, *flag, **env).returncode == 3, args


def test_every_command_that_takes_a_dsn_can_require_one() -> None:
    import typer.main

    from pylease.cli import app

    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        params = {p.name for p in command.params}
        if "dsn" in params:
            assert "require_dsn" in params, f"pylease {name} has --dsn without --require-dsn"
