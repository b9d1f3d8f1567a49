"""``pylease migrate``: in process, as a subprocess, from an installed wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import pylease.migrate
from pylease import dsn as dsn_mod
from pylease._resources import data_dir
from pylease.cli import app

ROOT = Path(__file__).resolve().parents[2]
IDS = [
    "pylease-0001-leases",
    "pylease-0002-safety",
    "pylease-0003-operations",
    "pylease-0004-faster",
    "pylease-0005-waiters",
    "pylease-0006-tenures",
    "pylease-0007-edges",
    "pylease-0008-permits",
    "pylease-0009-keeper",
    "pylease-0010-prune",
    "pylease-0011-groups",
    "pylease-0012-tenure-renewals",
    "pylease-0013-shared",
    "pylease-0014-fenced-releases",
    "pylease-0015-groups-kept",
    "pylease-0016-data",
    "pylease-0017-permit-claim",
    "pylease-0018-renew-held",
    "pylease-0019-shares",
    "pylease-0020-first-readers",
    "pylease-0021-unwait",
    "pylease-0022-renew-held-statement",
    "pylease-0023-lean-paths",
    "pylease-0024-readers-write-no-lease-row",
    "pylease-0025-unchecked-rows",
    "pylease-0026-serializable-races",
]
APPLIED = [f"pylease: applied {i}" for i in IDS]
UNREACHABLE = "postgresql://postgres:secret@127.0.0.1:1/nowhere"


def cli(*args: str, env: dict[str, str | None] | None = None) -> Any:
    environment: dict[str, str | None] = {"PYLEASE_DSN": None, "DATABASE_URL": None}
    environment.update(env or {})
    return CliRunner().invoke(app, list(args), env=environment)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYLEASE_DSN", "DATABASE_URL")}
    env.update(extra)
    return env


def command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pylease", *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=120,
        check=False,
    )


def applied(url: str, schema: str = "public") -> list[str]:
    """The migration ids yoyo recorded in ``schema``; [] if it has no yoyo tables."""
    with psycopg.connect(url) as c:
        if c.execute("SELECT to_regclass(%s)", (f'"{schema}"._yoyo_migration',)).fetchone() == (
            None,
        ):
            return []
        query = sql.SQL("SELECT migration_id FROM {}._yoyo_migration ORDER BY 1").format(
            sql.Identifier(schema)
        )
        return [r[0] for r in c.execute(query)]


def apply_count(url: str) -> int:
    """How many times a migration was applied, by yoyo's log."""
    with psycopg.connect(url) as c:
        row = c.execute(
            "SELECT count(*) FROM _yoyo_log WHERE migration_id = 'pylease-0001-leases'"
            " AND operation = 'apply'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def claims(url: str, schema: str = "public") -> Any:
    with psycopg.connect(url, autocommit=True) as c:
        query = sql.SQL("SELECT {}.lease_claim('sweep', interval '1 hour', 'me')").format(
            sql.Identifier(schema)
        )
        row = c.execute(query).fetchone()
    assert row is not None
    return row[0]


# -- in process ---------------------------------------------------------------


def test_migrate_applies_once_and_then_is_up_to_date(empty_dsn: str) -> None:
    first = cli("migrate", "--dsn", empty_dsn)
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines() == APPLIED
    assert claims(empty_dsn) == 1

    second = cli("migrate", "--dsn", empty_dsn)
    assert second.exit_code == 0, second.output
    assert "applied pylease" not in second.output
    assert second.stdout.splitlines() == [
        f"pylease: schema 'public' is up to date ({len(IDS)} migrations applied)"
    ]
    assert apply_count(empty_dsn) == 1
    assert claims(empty_dsn) == 1  # the lease survived the second run


def test_migrate_prints_nothing_a_migration_selects(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yoyo import read_migrations

    for f in data_dir("migrations", "postgres").glob("*.sql"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "pylease-9999-select.sql").write_text(
        "-- depends: pylease-0001-leases\nSELECT 'row-from-a-migration' AS leaked;\n"
    )
    (tmp_path / "pylease-9999-select.rollback.sql").write_text("SELECT 1;\n")
    monkeypatch.setattr(
        pylease.migrate, "_postgres_migrations", lambda: read_migrations(str(tmp_path))
    )
    result = cli("migrate", "--dsn", empty_dsn)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [*APPLIED, "pylease: applied pylease-9999-select"]
    assert applied(empty_dsn) == [*IDS, "pylease-9999-select"]


@pytest.mark.parametrize("schema", ["leases", "tenant one"])
def test_migrate_into_a_schema_pins_its_search_path(dsn: str, schema: str) -> None:
    result = cli("migrate", "--dsn", dsn, "--schema", schema)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == APPLIED
    with psycopg.connect(dsn) as c:
        quoted = c.execute("SELECT quote_ident(%s)", (schema,)).fetchone()[0]  # type: ignore[index]
        configs = c.execute(
            "SELECT DISTINCT proconfig[1:1] FROM pg_proc WHERE pronamespace = %s::regnamespace"
            " AND prosqlbody IS NULL",
            (quoted,),
        ).fetchall()
        # The SQL functions (0012) call this schema's functions, resolved when created.
        called = c.execute(
            "SELECT DISTINCT r.pronamespace::regnamespace::text FROM pg_proc AS p"
            " JOIN pg_depend AS d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid"
            " JOIN pg_proc AS r ON d.refclassid = 'pg_proc'::regclass AND r.oid = d.refobjid"
            " WHERE p.pronamespace = %s::regnamespace AND p.prosqlbody IS NOT NULL",
            (quoted,),
        ).fetchall()
        tables = c.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace"
            " AND relkind = 'r' ORDER BY 1",
            (quoted,),
        ).fetchall()
    assert configs == [([f"search_path={quoted}, pg_temp"],)]
    assert called == [(quoted,)]
    assert [t[0] for t in tables] == [
        "_pylease_yoyo_lock",
        "_yoyo_log",
        "_yoyo_migration",
        "_yoyo_version",
        "pylease_events",
        "pylease_fence_floors",
        "pylease_groups",
        "pylease_leases",
        "pylease_members",
        "pylease_names",
        "pylease_permits",
        "pylease_shared",
        "pylease_waiters",
        "pylease_watchers",
    ]
    # Independent of the copy in public that the test database already has.
    assert claims(dsn, schema) == 1
    assert claims(dsn) == 1
    again = cli("migrate", "--dsn", dsn, "--schema", schema)
    assert again.exit_code == 0, again.output
    assert f"schema {schema!r} is up to date" in again.stdout


def test_dsn_comes_from_the_option_then_pylease_dsn_then_database_url(fresh_db: Any) -> None:
    a, b, c = fresh_db(), fresh_db(), fresh_db()
    result = cli("migrate", env={"PYLEASE_DSN": a, "DATABASE_URL": b})
    assert result.exit_code == 0, result.output
    assert (applied(a), applied(b)) == (IDS, [])

    result = cli("migrate", env={"DATABASE_URL": b})
    assert result.exit_code == 0, result.output
    assert applied(b) == IDS

    result = cli("migrate", "--dsn", c, env={"PYLEASE_DSN": a, "DATABASE_URL": b})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == APPLIED
    assert applied(c) == IDS


def test_a_stale_yoyo_lock_is_taken_over_and_reported(empty_dsn: str) -> None:
    assert cli("migrate", "--dsn", empty_dsn).exit_code == 0
    pylease.migrate.rollback(empty_dsn, say=lambda _line: None)
    # What a migrator killed inside yoyo's lock leaves behind.
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("INSERT INTO _pylease_yoyo_lock (locked, ctime, pid) VALUES (1, now(), 4242424)")
    result = cli("migrate", "--dsn", empty_dsn)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + len(APPLIED), lines
    assert lines[0].startswith("pylease: took over a stale migration lock left by pid 4242424")
    assert lines[1:] == APPLIED
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT count(*) FROM _pylease_yoyo_lock").fetchone() == (0,)
    assert claims(empty_dsn) == 1


def test_an_unreachable_server_exits_3_in_one_line_without_the_password() -> None:
    for args, env in (
        (("--dsn", UNREACHABLE), {}),
        ((), {"PYLEASE_DSN": UNREACHABLE}),
        (("--dsn", "host=127.0.0.1 port=1 user=postgres password=secret dbname=x"), {}),
    ):
        result = cli("migrate", *args, env=env)
        assert result.exit_code == 3, result.output
        assert result.stdout == ""
        lines = result.output.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("pylease: ")
        assert "secret" not in result.output


@pytest.fixture
def weak_role(pg_admin_dsn: str) -> Iterator[str]:
    """A LOGIN role that may connect but not create anything."""
    role = f"pylease_weak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_lacking_privileges_exits_3_in_one_line(empty_dsn: str, weak_role: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        # PostgreSQL 15 and later revoke CREATE on public already; older ones do not.
        c.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        c.execute(
            sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(
                sql.Identifier(dsn_mod.parse(empty_dsn)["dbname"])
            )
        )
    params = dsn_mod.parse(empty_dsn)
    params["user"] = weak_role
    url = psycopg.conninfo.make_conninfo(**params)
    for schema in ("public", "leases"):
        result = cli("migrate", "--dsn", url, "--schema", schema)
        assert result.exit_code == 3, result.output
        lines = result.output.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("pylease: ")
        assert "privilege" in lines[0] or "permission" in lines[0], lines[0]
    assert applied(empty_dsn) == []


def test_a_role_owning_its_schema_migrates_without_create_on_the_database(
    empty_dsn: str, weak_role: str
) -> None:
    """CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema exists."""
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(
            sql.Identifier(dsn_mod.parse(empty_dsn)["dbname"])
        ))  # fmt: skip
        c.execute(sql.SQL("CREATE SCHEMA app AUTHORIZATION {}").format(sql.Identifier(weak_role)))
    params = dsn_mod.parse(empty_dsn)
    params["user"] = weak_role
    url = psycopg.conninfo.make_conninfo(**params)
    try:
        result = cli("migrate", "--dsn", url, "--schema", "app")
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == APPLIED
        assert claims(url, "app") == 1
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as c:
            c.execute("DROP SCHEMA app CASCADE")


# -- as a command -------------------------------------------------------------


def test_python_dash_m_pylease_migrate(empty_dsn: str) -> None:
    done = command("migrate", "--dsn", empty_dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == APPLIED
    script = Path(sys.executable).parent / "pylease"
    again = subprocess.run(
        [str(script), "migrate"],
        capture_output=True,
        text=True,
        env=clean_env(DATABASE_URL=empty_dsn),
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout


def test_the_command_exits_3_without_the_password() -> None:
    done = command("migrate", env=clean_env(PYLEASE_DSN=UNREACHABLE))
    assert done.returncode == 3
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "secret" not in done.stderr


@pytest.mark.parametrize("schema", ["public", "fresh"])
def test_two_migrators_at_once_apply_exactly_once(empty_dsn: str, schema: str) -> None:
    args = [sys.executable, "-m", "pylease", "migrate", "--dsn", empty_dsn, "--schema", schema]
    procs = [
        subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    applied_by = [out for out, _err in outputs if out.splitlines() == APPLIED]
    assert len(applied_by) == 1, outputs
    assert applied(empty_dsn, schema) == IDS
    assert claims(empty_dsn, schema) == 1


# -- from a wheel -------------------------------------------------------------


def test_an_installed_wheel_migrates_from_anywhere(empty_dsn: str, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    [wheel] = dist.glob("pylease_pg-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pylease/sql/postgres/schema.sql" in names
    assert "pylease/migrations/postgres/pylease-0001-leases.sql" in names
    assert "pylease/migrations/postgres/pylease-0001-leases.rollback.sql" in names

    # A venv of its own; its dependencies come from ours, but pylease from the wheel.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    ours = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    # A path line, not a site dir: our editable install's .pth is not processed there.
    Path(site, "deps-from-the-test-venv.pth").write_text(ours + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env()
    env.pop("PYTHONPATH", None)
    where = subprocess.run(
        [str(python), "-c", "import pylease; print(pylease.__file__)"],
        cwd=elsewhere, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(venv), where

    done = subprocess.run(
        [str(venv / "bin" / "pylease"), "migrate", "--dsn", empty_dsn],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == APPLIED

    calls = {
        "SELECT lease_claim('sweep', '1 hour', 'me')": "1",
        "SELECT lease_renew('sweep', 'me')": "t",
        "SELECT * FROM lease_renew_many('{sweep}', '{me}', '10 minutes')": "sweep|t",
        "SELECT lease_holds('sweep', 'me', 1)": "t",
        "SELECT name, holder, fence, held FROM lease_status()": "sweep|me|1|t",
        "SELECT lease_steal('sweep', '1 hour', 'operator', '0')": "2",
        "SELECT lease_release('sweep', 'operator', NULL)": "t",
        "SELECT name, fence, held FROM lease_status('sweep')": "sweep|2|f",
    }
    psql = shutil.which("psql")
    assert psql is not None, "psql is needed to check the installed schema"
    for query, expected in calls.items():
        out = subprocess.run(
            [psql, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", empty_dsn, "-c", query],
            cwd=elsewhere, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 0, (query, out.stderr)
        assert out.stdout.strip() == expected, query


def _migrate_to(url: str, last: str) -> None:
    """Apply the pylease migrations up to and including ``last``, as an older release did."""
    migrations = pylease.migrate._postgres_migrations()
    with pylease.migrate._backend(url, "public") as backend:
        backend.init_database()
        wanted = backend.to_apply(migrations).filter(lambda m: m.id <= last)
        with backend.lock():
            backend.apply_migrations(wanted)


def _rollback_one(url: str, migration_id: str) -> None:
    migrations = pylease.migrate._postgres_migrations()
    with pylease.migrate._backend(url, "public") as backend, backend.lock():
        backend.rollback_migrations(migrations.filter(lambda m: m.id == migration_id))


@pytest.mark.parametrize("index", range(1, len(IDS)))
def test_each_new_migration_rolls_back_to_the_catalog_before_it_and_reapplies(
    fresh_db: Any, index: int
) -> None:
    from tests.sql.test_schema import catalog

    before: str = fresh_db()
    _migrate_to(before, IDS[index - 1])
    target: str = fresh_db()
    _migrate_to(target, IDS[index])
    with psycopg.connect(target, autocommit=True) as c:
        c.execute("SELECT lease_claim('sweep', '1 hour', 'me')")
    _rollback_one(target, IDS[index])
    assert applied(target) == IDS[:index]
    assert catalog(target) == catalog(before)
    with psycopg.connect(target, autocommit=True) as c:
        assert c.execute("SELECT lease_claim('sweep', '1 hour', 'me')").fetchone() == (1,)
    _migrate_to(target, IDS[index])
    assert applied(target) == IDS[: index + 1]
    with psycopg.connect(target, autocommit=True) as c:
        assert c.execute("SELECT lease_claim('sweep', '1 hour', 'you')").fetchone() == (None,)


def test_0003_keeps_the_grants_of_lease_status(fresh_db: Any) -> None:
    url: str = fresh_db()
    _migrate_to(url, "pylease-0002-safety")
    role = f"pylease_reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        c.execute("REVOKE EXECUTE ON FUNCTION lease_status(text) FROM PUBLIC")
        c.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION lease_status(text) TO {} WITH GRANT OPTION").format(
                sql.Identifier(role)
            )
        )
        c.execute("COMMENT ON FUNCTION lease_status(text) IS 'ours'")
    try:
        _migrate_to(url, "pylease-0003-operations")
        with psycopg.connect(url, autocommit=True) as c:
            may = c.execute(
                "SELECT has_function_privilege('public', 'lease_status(text)', 'EXECUTE'),"
                " has_function_privilege(%s, 'lease_status(text)', 'EXECUTE WITH GRANT OPTION')",
                (role,),
            ).fetchone()
            assert may == (False, True)
            assert c.execute("SELECT state FROM lease_status()").fetchall() == []
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_0003_names_a_view_on_lease_status_that_must_be_recreated(fresh_db: Any) -> None:
    url: str = fresh_db()
    _migrate_to(url, "pylease-0002-safety")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE VIEW my_leases AS SELECT name, held FROM lease_status()")
    with pytest.raises(psycopg.errors.DependentObjectsStillExist, match="my_leases"):
        _migrate_to(url, "pylease-0003-operations")
    assert applied(url) == IDS[:2]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DROP VIEW my_leases")
    _migrate_to(url, "pylease-0003-operations")
    assert applied(url) == IDS[:3]


# A schema installed with `psql -f sql/postgres/schema.sql` (issue 16) ----------------


def _forget_yoyo(url: str) -> None:
    """What a schema.sql install of that version looks like: the objects, no records."""
    with psycopg.connect(url, autocommit=True) as c:
        for table in ("_yoyo_migration", "_yoyo_log", "_yoyo_version", "_pylease_yoyo_lock"):
            c.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def test_migrate_takes_over_a_schema_sql_install(empty_dsn: str) -> None:
    from tests.sql.test_schema import catalog

    script = (data_dir("sql", "postgres") / "schema.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(script)  # type: ignore[call-overload]
        assert c.execute("SELECT lease_claim('kept', '1 hour', 'me')").fetchone() == (1,)
    before = catalog(empty_dsn)
    said: list[str] = []
    assert pylease.migrate.migrate(empty_dsn, say=said.append) == []
    assert said[0] == (
        f"schema 'public' was installed from schema.sql at {IDS[-1]}: "
        f"recorded {len(IDS)} migrations as applied"
    )
    assert applied(empty_dsn) == IDS
    assert catalog(empty_dsn) == before
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT holder, fence FROM lease_status('kept')").fetchone() == ("me", 1)
        # No probe schema is left behind.
        assert c.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pylease_probe%'"
        ).fetchone() == (0,)
    assert pylease.migrate.migrate(empty_dsn, say=quiet_say) == []


def quiet_say(_line: str) -> None:
    pass


def test_migrate_takes_over_an_older_schema_sql_install_and_upgrades_it(fresh_db: Any) -> None:
    url: str = fresh_db()
    _migrate_to(url, IDS[-2])
    _forget_yoyo(url)
    said: list[str] = []
    assert pylease.migrate.migrate(url, say=said.append) == [IDS[-1]]
    assert said[0].endswith(f"at {IDS[-2]}: recorded {len(IDS) - 1} migrations as applied")
    assert applied(url) == IDS


def test_migrate_refuses_pylease_objects_that_match_no_version(empty_dsn: str) -> None:
    script = (data_dir("sql", "postgres") / "schema.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(script)  # type: ignore[call-overload]
        c.execute("ALTER TABLE pylease_leases ADD COLUMN mine text")
    with pytest.raises(pylease.migrate.MigrationError, match="match no released version"):
        pylease.migrate.migrate(empty_dsn, say=quiet_say)
    assert applied(empty_dsn) == []
