"""The rough edges a newcomer hit with the ``pylease`` command (issue 16), one test each."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import re
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from typer.main import get_command, get_command_name

from pylease import dsn as dsn_mod
from pylease.cli import app
from pylease.cli._app import COMMANDS
from pylease.errors import DatabaseUnavailable
from tests.support.cli import cli, ok, ok_in_a_process


def files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


# steal --help -------------------------------------------------------------------


def test_steal_help_says_holder_is_the_new_holder() -> None:
    text = " ".join(ok("steal", "--help").stdout.split())
    assert "The NEW holder" in text
    assert "current holder's own token only bumps the fence" in text


# The embedded default ---------------------------------------------------------------


def test_status_and_the_busy_line_name_the_default_file(tmp_path: Path) -> None:
    env: dict[str, str | None] = {"XDG_STATE_HOME": str(tmp_path), "HOME": str(tmp_path)}
    path = tmp_path / "pylease" / "leases.sqlite3"
    ok("claim", "job", "--ttl", "1m", "--holder", "me", env=env)
    first = ok("status", env=env).stdout.splitlines()[0]
    assert first == f"leases in {path} (this user's default SQLite file)"
    busy = cli("claim", "job", "--ttl", "1m", "--holder", "you", env=env)
    assert busy.exit_code == 1
    assert busy.stderr.strip().endswith(f"(in {path})")
    # An explicit file is the user's own choice: not repeated back.
    url = f"sqlite:///{path}"
    assert "leases in" not in ok("status", "--dsn", url).stdout
    assert "(in " not in cli("claim", "job", "--ttl", "1m", "--dsn", url).stderr


@pytest.mark.parametrize("home", [None, "", "/nonexistent-pylease-cli", "relative/home"])
def test_no_usable_home_is_refused_and_nothing_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: str | None
) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["claim", "x", "--ttl", "5s"], ["status"], ["migrate"]):
        result = cli(*args, env={"HOME": home, "XDG_STATE_HOME": None})
        assert result.exit_code == 3, result.output
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1
        assert "PYLEASE_DSN" in line and "XDG_STATE_HOME" in line
        assert ("HOME is not set" if not home else f"HOME={home} does not exist") in line
    assert files_under(tmp_path) == []
    assert not Path("/nonexistent-pylease-cli").exists()


def test_an_existing_xdg_state_home_is_used_as_it_is(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    env: dict[str, str | None] = {"HOME": None, "XDG_STATE_HOME": str(state)}
    ok("claim", "x", "--ttl", "1m", "--holder", "me", env=env)
    assert (state / "pylease" / "leases.sqlite3").exists()
    assert state.stat().st_mode & 0o777 == 0o755


# -v: which store, and why --------------------------------------------------------------


def test_verbose_says_which_store_and_why(tmp_path: Path, dsn: str) -> None:
    env: dict[str, str | None] = {"XDG_STATE_HOME": str(tmp_path), "PGHOST": "db.example"}
    path = tmp_path / "pylease" / "leases.sqlite3"
    said = ok("-v", "status", env=env).stderr.splitlines()[0]
    assert said.startswith(f"pylease: using the SQLite file {path} (the embedded default")
    assert "PGHOST is set, but libpq variables only fill in a postgresql:// URL" in said
    assert "PYLEASE_DSN=postgresql://" in said
    assert "PGHOST" not in ok("-v", "status", env={"XDG_STATE_HOME": str(tmp_path)}).stderr

    for env, source in (
        ({"PYLEASE_DSN": dsn}, "from PYLEASE_DSN"),
        ({"DATABASE_URL": dsn}, "from DATABASE_URL"),
    ):
        said = ok("status", "-v", env=env).stderr.splitlines()[0]
        assert said.startswith("pylease: using PostgreSQL at ") and said.endswith(f"({source})")
    said = ok("status", "-v", "--dsn", dsn, env={"PYLEASE_DSN": "sqlite:///x"}).stderr
    assert said.splitlines()[0].endswith("(from --dsn)")
    assert "pylease: using" not in ok("status", "--dsn", dsn).stderr


def test_libpq_variables_are_used_through_an_empty_postgresql_url(dsn: str) -> None:
    params = conninfo_to_dict(dsn)
    env: dict[str, str | None] = {
        "PGHOST": str(params.get("host", "127.0.0.1")),
        "PGPORT": str(params.get("port", "5432")),
        "PGUSER": str(params.get("user", "postgres")),
        "PGDATABASE": str(params["dbname"]),
        "PYLEASE_DSN": "postgresql://",
    }
    ok("claim", "via-env", "--ttl", "1m", "--holder", "a", env=env)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT holder FROM lease_status('via-env')").fetchone() == ("a",)


# --schema on every command ---------------------------------------------------------------


def test_schema_on_every_command(empty_dsn: str) -> None:
    ok("migrate", "--schema", "leases", "--dsn", empty_dsn)
    env: dict[str, str | None] = {"PYLEASE_DSN": empty_dsn}
    s = ("--schema", "leases")
    out = ok("claim", "job", "--ttl", "1m", "--holder", "a", *s, env=env).stdout
    assert out == "a\t1\n"
    ok("renew", "job", "--holder", "a", *s, env=env)
    rows = json.loads(ok("status", "--json", *s, env=env).stdout)
    assert [(r["name"], r["holder"]) for r in rows] == [("job", "a")]
    assert ok("steal", "job", "--ttl", "1m", "--holder", "ops", *s, env=env).stdout == "ops\t2\n"
    ok("release", "job", "--holder", "ops", *s, env=env)
    # PYLEASE_SCHEMA does the same for every command; migrate is idempotent with it.
    env["PYLEASE_SCHEMA"] = "leases"
    assert ok("claim", "job", "--ttl", "1m", "--holder", "b", env=env).stdout == "b\t3\n"
    assert "up to date" in ok("migrate", env=env).stdout
    with psycopg.connect(empty_dsn) as conn:
        conn.execute("SET search_path = leases")
        assert conn.execute("SELECT holder, fence FROM lease_status('job')").fetchone() == (
            "b",
            3,
        )


def test_not_installed_names_the_search_path_and_where_it_is(empty_dsn: str) -> None:
    ok("migrate", "--schema", "leases", "--dsn", empty_dsn)
    result = cli("claim", "job", "--ttl", "1m", "--dsn", empty_dsn)
    assert result.exit_code == 3, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert 'pylease is not installed in the search_path ("$user", public)' in line
    assert "it is installed in schema leases: pass --schema leases" in line
    assert "PYLEASE_SCHEMA=leases" in line
    wrong = cli("status", "--schema", "elsewhere", "--dsn", empty_dsn)
    assert wrong.exit_code == 3
    assert 'search_path ("elsewhere")' in wrong.stderr
    assert "installed in schema leases" in wrong.stderr


def test_an_older_schema_is_told_to_upgrade_though_lease_claim_has_two_signatures(
    empty_dsn: str,
) -> None:
    """With the 4-argument lease_claim (migration 0016) a bare ``to_regproc('lease_claim')``
    finds nothing: the diagnosis names the signature, so a schema that lacks a later
    function is still told it is older, not that pylease is missing."""
    ok("migrate", "--dsn", empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION lease_holders(text)")
    result = cli("holders", "--dsn", empty_dsn)
    assert result.exit_code == 3, result.output
    assert "the pylease schema in public is older than this pylease" in result.stderr
    assert "run `pylease migrate --dsn ...` to upgrade it" in result.stderr


def test_schema_on_sqlite_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    result = cli("status", "--schema", "leases", "--dsn", url)
    assert result.exit_code == 2
    assert "--schema applies to PostgreSQL only" in result.stderr
    result = cli("status", "--dsn", url, env={"PYLEASE_SCHEMA": "leases"})
    assert result.exit_code == 3
    assert "PYLEASE_SCHEMA applies to PostgreSQL only" in result.stderr


# Connection strings ---------------------------------------------------------------------


@pytest.mark.parametrize("source", ["--dsn", "PYLEASE_DSN", "DATABASE_URL"])
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("postgresql://app:s3cret w0rd@db/app", 'unexpected spaces found in "***"'),
        ("host=db password=s3cret w0rd", 'missing "=" after "***"'),
        ("postgresql://app:s3cret@db/app?nonsense=1", 'invalid URI query parameter: "nonsense"'),
        ("postgresql://app:s3cret@[::1/app", "IPv6 host address"),
    ],
)
def test_a_malformed_dsn_says_why_and_where_without_the_password(
    source: str, text: str, reason: str
) -> None:
    if source == "--dsn":
        result = cli("status", "--dsn", text)
    else:
        result = cli("status", env={source: text})
    assert result.exit_code == 3, result.output
    line = result.stderr.strip()
    assert line.startswith(f"pylease: malformed connection string in {source}: ")
    assert reason in line
    assert "s3cret" not in result.output and "w0rd" not in result.output


@pytest.mark.parametrize("url", ["sqlite:/tmp/pylease-cli-x", "sqlite:relative", "sqlite:///"])
def test_a_sqlite_url_without_three_slashes_is_malformed(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["status"], ["claim", "x", "--ttl", "5s"], ["migrate"]):
        result = cli(*args, "--dsn", url)
        assert result.exit_code == 3, result.output
        assert "malformed SQLite URL in --dsn" in result.stderr
        assert "sqlite:////absolute/path" in result.stderr
    assert files_under(tmp_path) == []
    assert not Path("/tmp/pylease-cli-x").exists()


def test_sqlalchemy_urls_are_accepted(dsn: str) -> None:
    params = conninfo_to_dict(dsn)
    url = (
        f"postgresql+psycopg://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}"
        f":{params.get('port', 5432)}/{params['dbname']}"
    )
    assert dsn_mod.normalize(url).startswith("postgresql://")
    assert dsn_mod.normalize("postgres+psycopg2://h/db") == "postgresql://h/db"
    assert dsn_mod.normalize("postgresql://h/db") == "postgresql://h/db"
    ok("claim", "sa", "--ttl", "1m", "--holder", "a", "--dsn", url)
    rows = json.loads(ok("status", "--json", env={"DATABASE_URL": url}).stdout)
    assert [(r["name"], r["holder"]) for r in rows] == [("sa", "a")]


# Help and usage --------------------------------------------------------------------------


def test_help_shows_no_python_types() -> None:
    for command in ("run", "migrate", "claim", "renew", "release", "steal", "status"):
        text = ok(command, "--help").stdout
        assert not re.search(r"<(str|int|list\[str\]|float|bool)>", text), (command, text)
        assert "(10s)" not in text and "(0)" not in text, text
    assert "[default: 10s]" in " ".join(ok("run", "--help").stdout.split())


def test_run_usage_reads_as_a_user_writes_it() -> None:
    usage = ok("run", "--help").stdout.splitlines()[0]
    assert usage == "Usage: pylease run [OPTIONS] NAME [NAME...] -- CMD [ARG...]"
    assert ok("claim", "--help").stdout.splitlines()[0] == "Usage: pylease claim [OPTIONS] NAME"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["claim"], "Missing argument 'NAME'"),
        (["claim", "x", "--ttl", "5x"], "Invalid value for '--ttl'"),
        (["run", "x", "--ttl", "5s"], "Missing argument '-- CMD [ARG...]'"),
        (["nonsense"], "No such command 'nonsense'"),
        (["status", "--frobnicate"], "No such option: --frobnicate"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], says: str) -> None:
    result = cli(*args)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pylease: ") and says in lines[0]
    assert "--help'" in lines[0]


def test_commands_are_listed_run_and_migrate_first() -> None:
    text = ok("--help").stdout
    listed = text.split("Commands:", 1)[1].split("Examples:", 1)[0]
    commands = [line.split()[0] for line in listed.splitlines() if line.strip()]
    assert commands[:2] == ["run", "migrate"]
    for command in ("claim", "renew", "release", "steal", "status", "history", "metrics"):
        assert command in commands


def test_the_listed_summaries_are_the_commands_own() -> None:
    # --help lists the commands from a table, so as to import none of their modules: each
    # summary is the first paragraph of the command's own help, and every command is there.
    for module, _summary in COMMANDS.values():
        importlib.import_module(f"pylease.cli.{module}")
    registered = {
        info.name or get_command_name(getattr(info.callback, "__name__", "")): info
        for info in app.registered_commands
    }
    assert set(registered) == set(COMMANDS)
    group = get_command(app)
    for name, (module, summary) in COMMANDS.items():
        assert getattr(registered[name].callback, "__module__", None) == f"pylease.cli.{module}"
        help_text = inspect.cleandoc(group.commands[name].help or "")
        assert summary == " ".join(help_text.split("\n\n")[0].split()), name


# claim --quiet, --wait forever ----------------------------------------------------------------


def test_claim_quiet_silences_only_the_busy_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    ok("claim", "job", "--ttl", "1m", "--holder", "a", "--dsn", url)
    quiet = cli("claim", "job", "--ttl", "1m", "--quiet", "--dsn", url)
    assert quiet.exit_code == 1
    assert quiet.output == ""
    loud = cli("claim", "job", "--ttl", "1m", "--dsn", url)
    assert loud.exit_code == 1 and "held by a" in loud.stderr
    # Errors are never quiet.
    bad = cli("claim", "job", "--ttl", "1m", "-q", "--dsn", "sqlite:/nope")
    assert bad.exit_code == 3 and "malformed" in bad.stderr
    assert ok("claim", "free", "--ttl", "1m", "-q", "--holder", "q", "--dsn", url).stdout == (
        "q\t1\n"
    )


def test_claim_wait_forever(url: str) -> None:
    ok("claim", "job", "--ttl", "1h", "--holder", "a", "--dsn", url)

    def give_back() -> None:
        time.sleep(1.0)
        ok_in_a_process("release", "job", "--holder", "a", "--dsn", url)

    releaser = threading.Thread(target=give_back)
    releaser.start()
    try:
        got = ok("claim", "job", "--ttl", "1m", "--holder", "b", "--wait", "forever", "--dsn", url)
    finally:
        releaser.join()
    assert got.stdout == "b\t2\n"
    assert cli("claim", "job", "--ttl", "1m", "--wait", "never", "--dsn", url).exit_code == 2


def test_a_conninfo_with_schema_keeps_other_options(dsn: str) -> None:
    with_opts = make_conninfo(dsn, options="-c statement_timeout=5000")
    conninfo = dsn_mod.with_schema(with_opts, "Upper Case")
    options = conninfo_to_dict(conninfo)["options"]
    assert options == '-c statement_timeout=5000 -c search_path="Upper\\ Case"'
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SHOW search_path").fetchone() == ('"Upper Case"',)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("5s",)


# The library's log on the command's stderr -----------------------------------------------


def test_stderr_log_recognises_records_by_attribute_not_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pylease.cli import _render

    log = logging.getLogger("pylease.test-cli-edges")
    log.propagate = False
    log.setLevel(logging.DEBUG)  # as main() sets it for the library
    handler = _render.StderrLog(lambda: False)
    log.addHandler(handler)
    try:
        # The keeper's lost record: left to `pylease run`, which says what it does about it.
        log.warning("lease %r lost: %s", "job", "x", extra={"pylease_event": "lost"})
        # The same words without the attribute are just a warning, shown.
        log.warning("lease %r lost: %s", "job", "x")
        failed = {"pylease_names": ["job"], "pylease_expires_in": 4.0}
        for attempt in (1, 2, 3):
            log.warning(
                "pylease: retry %d",
                attempt,
                extra={
                    **failed,
                    "pylease_event": "renew_failed",
                    "pylease_attempt": attempt,
                    "pylease_error": DatabaseUnavailable("pylease: database unavailable: gone"),
                },
            )
        log.info(
            "back",
            extra={
                "pylease_event": "renew_recovered",
                "pylease_names": ["job"],
                "pylease_attempt": 3,
            },
        )
        log.info("chatter")  # below WARNING without -v
    finally:
        log.removeHandler(handler)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == "pylease: lease 'job' lost: x"
    assert lines[1].startswith(
        "pylease: renewing lease 'job' failed (database unavailable: gone); retrying until it "
        "expires at "
    )
    assert lines[1].endswith("(in 4s)")
    assert lines[2] == "pylease: renewing lease 'job' works again, after 3 failed attempt(s)"
