"""The ``pylease`` command in-process: parsing, durations, exit codes, output; both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pylease import __version__, durations
from pylease import dsn as dsn_mod
from tests.support.cli import cli, ok, ok_in_a_process

# Durations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30),
        ("5m", 300),
        ("1h30m", 5400),
        ("2m30s", 150),
        ("1d", 86400),
        ("90", 90),
        ("0.5", 0.5),
        ("1.5s", 1.5),
        ("0", 0),
        (" 5M ", 300),
    ],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert durations.parse(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "s", "5x", "-5s", "5m1h", "5s5s", "1h 30m", "abc", "inf"])
def test_durations_reject(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        durations.parse(text)


@pytest.mark.parametrize(
    ("seconds", "spelled"),
    [(0.25, "250ms"), (3, "3s"), (252, "4m12s"), (3600, "1h"), (3660, "1h1m"), (90061, "1d1h")],
)
def test_durations_spell(seconds: float, spelled: str) -> None:
    assert durations.spell(timedelta(seconds=seconds)) == spelled


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["claim", "x", "--ttl", "5x"], "--ttl"),
        (["claim", "x", "--ttl", "0"], "--ttl"),
        (["claim", "x", "--ttl", "5s", "--wait", "soon"], "--wait"),
        (["renew", "x", "--holder", "h", "--ttl", "1y"], "--ttl"),
        (["release", "x", "--holder", "h", "--min-hold", "-1"], "--min-hold"),
        (["steal", "x", "--ttl", "5s", "--holder", "h", "--older-than", "1h1h"], "--older-than"),
        (["run", "x", "--ttl", "5s", "--kill-after", "x", "--", "true"], "--kill-after"),
    ],
)
def test_a_bad_duration_is_a_usage_error_naming_the_option(args: list[str], option: str) -> None:
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert option in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["claim", "x"],
        ["claim", "--ttl", "5s"],
        ["renew", "x"],
        ["steal", "x", "--ttl", "5s"],
        ["run", "x", "--ttl", "5s"],
        ["run", "x", "--ttl", "5s", "--busy-exit", "300", "--", "true"],
        ["nonsense"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert cli(*args).exit_code == 2


def test_an_empty_or_overlong_name_is_a_usage_error(url: str) -> None:
    result = cli("claim", "", "--ttl", "5s", "--dsn", url)
    assert result.exit_code == 2
    assert result.output.strip() == "pylease: name must not be empty"
    result = cli("renew", "x" * 201, "--holder", "h", "--dsn", url)
    assert result.exit_code == 2
    assert "at most 200" in result.output


def test_version_and_help() -> None:
    assert ok("--version").output.strip() == f"pylease {__version__}"
    help_text = ok("--help").output
    assert "Examples:" in help_text
    for command in ("claim", "renew", "release", "steal", "status", "run", "migrate"):
        assert command in help_text
    assert "--install-completion" in help_text
    assert "75" in ok("run", "--help").output


# Commands on both backends -------------------------------------------------------


def test_claim_prints_holder_and_fence(url: str) -> None:
    out = ok("claim", "sweep", "--ttl", "1m", "--dsn", url).stdout
    holder, fence = out.rstrip("\n").split("\t")
    assert fence == "1"
    host, pid, token = holder.split(":")
    assert host and pid.isdigit() and len(token) == 32

    busy = cli("claim", "sweep", "--ttl", "1m", "--dsn", url)
    assert busy.exit_code == 1
    assert busy.stdout == ""
    assert f"held by {holder}" in busy.stderr

    # A claim with the holder that holds it is busy too, and says why: another process
    # may use the same holder (contract 5.6). `renew` tells whether it is still ours.
    again = cli("claim", "sweep", "--ttl", "1m", "--holder", holder, "--dsn", url)
    assert again.exit_code == 1
    assert "this claim's own --holder" in again.stderr
    ok("renew", "sweep", "--holder", holder, "--dsn", url)


def test_claim_json(url: str) -> None:
    granted = json.loads(
        ok("claim", "sweep", "--ttl", "1m", "--holder", "a", "--json", "--dsn", url).stdout
    )
    assert granted["claimed"] is True
    assert granted["holder"] == "a" and granted["held_by"] == "a"
    assert granted["fence"] == 1 and granted["name"] == "sweep"
    assert datetime.fromisoformat(granted["expires_at"]).tzinfo is not None

    result = cli("claim", "sweep", "--ttl", "1m", "--holder", "b", "--json", "--dsn", url)
    assert result.exit_code == 1
    busy = json.loads(result.stdout)
    assert busy == {
        "name": "sweep",
        "claimed": False,
        "holder": "b",
        "fence": None,
        "expires_at": None,
        "held_by": "a",
        "shared": False,
    }


def test_renew_release_steal(url: str) -> None:
    ok("claim", "sweep", "--ttl", "1m", "--holder", "a", "--dsn", url)
    ok("renew", "sweep", "--holder", "a", "--ttl", "2m", "--dsn", url)
    ok("renew", "sweep", "--holder", "a", "--dsn", url)

    not_ours = cli("renew", "sweep", "--holder", "b", "--dsn", url)
    assert not_ours.exit_code == 1
    assert "not held by b" in not_ours.stderr
    assert cli("release", "sweep", "--holder", "b", "--dsn", url).exit_code == 1

    recent = cli(
        "steal", "sweep", "--ttl", "1m", "--holder", "ops", "--older-than", "1h", "--dsn", url
    )
    assert recent.exit_code == 1
    assert "not stolen" in recent.stderr

    stolen = ok("steal", "sweep", "--ttl", "1m", "--holder", "ops", "--dsn", url)
    assert stolen.stdout == "ops\t2\n"
    assert cli("renew", "sweep", "--holder", "a", "--dsn", url).exit_code == 1

    ok("release", "sweep", "--holder", "ops", "--dsn", url)
    assert cli("release", "sweep", "--holder", "ops", "--dsn", url).exit_code == 1
    assert ok("claim", "sweep", "--ttl", "1m", "--holder", "c", "--dsn", url).stdout == "c\t3\n"


def test_release_min_hold_keeps_the_name_busy(url: str) -> None:
    ok("claim", "daily", "--ttl", "1m", "--holder", "a", "--dsn", url)
    ok("release", "daily", "--holder", "a", "--min-hold", "1h", "--dsn", url)
    result = cli("claim", "daily", "--ttl", "1m", "--holder", "b", "--dsn", url)
    assert result.exit_code == 1
    assert "min-hold" in result.stderr


def test_status_json(url: str) -> None:
    assert json.loads(ok("status", "--json", "--dsn", url).stdout) == []
    ok("claim", "a-lease", "--ttl", "1m", "--holder", "h1", "--dsn", url)
    ok("claim", "b-lease", "--ttl", "1m", "--holder", "h2", "--dsn", url)
    ok("release", "b-lease", "--holder", "h2", "--dsn", url)

    rows = json.loads(ok("status", "--json", "--dsn", url).stdout)
    assert [r["name"] for r in rows] == ["a-lease", "b-lease"]
    keys = [
        *("name", "holder", "fence", "held", "acquired_at", "renewed_at", "expires_at"),
        *("state", "ttl", "shared", "kind"),  # added later at the end
        *("data", "release_requested_by"),
    ]
    assert all(list(r) == keys for r in rows)
    assert {r["kind"] for r in rows} == {"lease"}
    assert rows[0]["held"] is True and rows[1]["held"] is False
    assert rows[0]["state"] == "held" and rows[0]["ttl"] == 60
    assert rows[0]["holder"] == "h1" and rows[0]["fence"] == 1
    for key in ("acquired_at", "renewed_at", "expires_at"):
        assert datetime.fromisoformat(rows[0][key]).tzinfo is not None
    expires = datetime.fromisoformat(rows[0]["expires_at"])
    acquired = datetime.fromisoformat(rows[0]["acquired_at"])
    assert expires - acquired == timedelta(minutes=1)

    one = json.loads(ok("status", "a-lease", "--json", "--dsn", url).stdout)
    assert one == rows[:1]
    assert json.loads(ok("status", "nothing", "--json", "--dsn", url).stdout) == []


def test_status_table(url: str) -> None:
    assert "no leases" in ok("status", "--dsn", url).stdout
    ok("claim", "report", "--ttl", "5m", "--holder", "worker-1", "--dsn", url)
    ok("claim", "sweep", "--ttl", "5m", "--holder", "worker-2", "--dsn", url)
    ok("release", "sweep", "--holder", "worker-2", "--dsn", url)

    lines = ok("status", "--dsn", url).stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "HOLDER", "FENCE", "AGE", "EXPIRES"]
    report = lines[1].split()
    assert report[:4] == ["report", "held", "worker-1", "1"]
    assert report[-2:][0] == "in" and report[-1].startswith("4m5")
    sweep = lines[2].split()
    assert sweep[0] == "sweep" and sweep[2:4] == ["worker-2", "1"]
    assert sweep[1] == "released"
    assert sweep[-1] == "-"

    assert "no lease named 'other'" in ok("status", "other", "--dsn", url).stdout


def test_claim_wait_takes_over_an_expired_lease(url: str) -> None:
    ok("claim", "sweep", "--ttl", "300ms", "--holder", "a", "--dsn", url)
    result = ok("claim", "sweep", "--ttl", "1m", "--holder", "b", "--wait", "20s", "--dsn", url)
    assert result.stdout == "b\t2\n"


def test_claim_wait_wakes_on_a_release(url: str) -> None:
    ok("claim", "sweep", "--ttl", "1h", "--holder", "a", "--dsn", url)

    def give_back() -> None:
        time.sleep(0.5)
        ok_in_a_process("release", "sweep", "--holder", "a", "--dsn", url)

    releaser = threading.Thread(target=give_back)
    releaser.start()
    try:
        result = ok("claim", "sweep", "--ttl", "1m", "--holder", "b", "--wait", "30s", "--dsn", url)
    finally:
        releaser.join()
    assert result.stdout == "b\t2\n"


def test_claim_wait_gives_up_busy(url: str) -> None:
    ok("claim", "sweep", "--ttl", "1h", "--holder", "a", "--dsn", url)
    result = cli("claim", "sweep", "--ttl", "1m", "--holder", "b", "--wait", "300ms", "--dsn", url)
    assert result.exit_code == 1
    assert "held by a" in result.stderr


def test_dsn_comes_from_the_environment(dsn: str) -> None:
    ok("claim", "env", "--ttl", "1m", "--holder", "a", env={"PYLEASE_DSN": dsn})
    assert (
        cli("claim", "env", "--ttl", "1m", "--holder", "b", env={"DATABASE_URL": dsn}).exit_code
        == 1
    )
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT holder FROM lease_status('env')").fetchone()
    assert row == ("a",)


# The embedded default --------------------------------------------------------------


def test_embedded_default_is_created_on_first_use(tmp_path: Path) -> None:
    env: dict[str, str | None] = {"XDG_STATE_HOME": str(tmp_path / "state")}
    ok("claim", "local", "--ttl", "1m", "--holder", "me", env=env)
    path = tmp_path / "state" / "pylease" / "leases.sqlite3"
    assert path.exists()
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    rows = json.loads(ok("status", "--json", env=env).stdout)
    assert [(r["name"], r["holder"], r["held"]) for r in rows] == [("local", "me", True)]
    assert str(path) in ok("migrate", env=env).stdout


def test_migrate_on_sqlite(tmp_path: Path) -> None:
    target = tmp_path / "fresh.sqlite3"
    ok("migrate", "--dsn", f"sqlite:///{target}")
    assert target.exists()
    ok("migrate", "--dsn", f"sqlite:///{target}")
    result = cli("migrate", "--dsn", f"sqlite:///{target}", "--schema", "x")
    assert result.exit_code == 2


# Errors ----------------------------------------------------------------------------


def test_missing_schema_says_to_migrate(empty_dsn: str) -> None:
    for args in (
        ["claim", "x", "--ttl", "5s"],
        ["renew", "x", "--holder", "h"],
        ["release", "x", "--holder", "h"],
        ["steal", "x", "--ttl", "5s", "--holder", "h"],
        ["status"],
    ):
        result = cli(*args, "--dsn", empty_dsn)
        assert result.exit_code == 3, result.output
        assert "run `pylease migrate --dsn ...`" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.output


def test_verbose_shows_the_details(empty_dsn: str) -> None:
    for args in (["-v", "status", "--dsn", empty_dsn], ["status", "-v", "--dsn", empty_dsn]):
        result = cli(*args)
        assert result.exit_code == 3
        assert "Traceback" in result.stderr
        assert "UndefinedFunction" in result.stderr


def test_unreachable_database_never_shows_the_password() -> None:
    url = "postgresql://someone:s3cret-pw@127.0.0.1:1/nowhere"
    for args in (["status"], ["claim", "x", "--ttl", "5s"], ["migrate"]):
        result = cli(*args, "--dsn", url)
        assert result.exit_code == 3, result.output
        assert "s3cret-pw" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1


def test_another_databases_url_is_a_configuration_error() -> None:
    result = cli("status", env={"DATABASE_URL": "mysql://app:pw@db/app"})
    assert result.exit_code == 3
    assert result.stderr == (
        "pylease: DATABASE_URL is a mysql:// URL; pylease needs postgresql://... "
        "or sqlite:///path\n"
    )


def test_malformed_dsn_is_a_configuration_error() -> None:
    result = cli("status", "--dsn", "host=x port=oops ==== secret")
    assert result.exit_code == 3
    assert "secret" not in result.output


def test_migrate_on_postgres(empty_dsn: str) -> None:
    assert "applied pylease-0001" in ok("migrate", "--dsn", empty_dsn).stdout
    assert "up to date" in ok("migrate", "--dsn", empty_dsn).stdout
    ok("claim", "x", "--ttl", "5s", "--dsn", empty_dsn)


def test_steal_without_privilege_is_loud(dsn: str) -> None:
    role = f"pylease_cli_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        params = dsn_mod.parse(dsn)
        params["user"] = role
        params.pop("password", None)
        app_dsn = make_conninfo("", **params)
        ok("claim", "x", "--ttl", "1m", "--holder", "a", "--dsn", app_dsn)
        result = cli("steal", "x", "--ttl", "1m", "--holder", "b", "--dsn", app_dsn)
        assert result.exit_code == 3, result.output
        assert len(result.stderr.strip().splitlines()) == 1
        assert f"role {role} may not steal leases" in result.stderr
        grant = result.stderr.split("runs: ", 1)[1].strip()
        assert grant == (
            'GRANT EXECUTE ON FUNCTION "public".lease_steal(text, interval, text, interval) '
            f'TO "{role}";'
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(grant.encode())  # what the owner is told to run works as told
        assert ok("steal", "x", "--ttl", "1m", "--holder", "b", "--dsn", app_dsn).stdout == "b\t2\n"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_shell_completion() -> None:
    pylease = Path(sys.executable).parent / "pylease"
    # The script as `pylease --show-completion` prints it in bash, asked for by name:
    # the option itself guesses the shell from the parent process (sh, under make).
    source = {**os.environ, "_PYLEASE_COMPLETE": "source_bash"}
    script = subprocess.run(
        [str(pylease)], env=source, capture_output=True, text=True, timeout=60
    ).stdout
    assert "complete -o default -F _pylease_completion pylease" in script
    for words, cword, expected in (
        ("pylease st", "1", ["steal", "status"]),
        ("pylease run x --bu", "3", ["--busy-exit"]),
    ):
        env = {"_PYLEASE_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword}
        done = subprocess.run(
            [str(pylease)], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
        )
        assert done.stdout.split() == expected, done.stderr
