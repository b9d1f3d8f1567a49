"""SQLAlchemy engines and connections as lease targets, and schema_sql() the way an
Alembic migration runs it, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from typing import Any

# Installed by the dev extra (`make test`): a missing one fails, never skips.
import greenlet  # noqa: F401 (sqlalchemy's asyncio support needs it)
import psycopg
import pytest
import sqlalchemy as sa
import sqlalchemy.ext.asyncio as sa_async
from sqlalchemy import text

from pylease import FOREVER, InvalidArgument, alease, exclusive, lease, run_exclusive, schema_sql
from pylease import dsn as dsn_mod
from pylease.migrate import migrate
from pylease.schema import migration_ids
from tests.support.leases import status, wait_until

Conn = psycopg.Connection[Any]


class Rollback(Exception):
    """Raised to roll back the caller's transaction."""


def sa_url(dsn: str, password: str | None = None) -> Any:
    params = dsn_mod.parse(dsn)
    return sa.URL.create(
        "postgresql+psycopg",
        username=params.get("user"),
        password=password,
        host=params.get("host"),
        port=int(params["port"]) if "port" in params else None,
        database=params["dbname"],
    )


@pytest.fixture
def engine(dsn: str) -> Iterator[Any]:
    eng = sa.create_engine(sa_url(dsn))
    yield eng
    eng.dispose()


@pytest.fixture
async def aengine(dsn: str) -> AsyncIterator[Any]:
    eng = sa_async.create_async_engine(sa_url(dsn))
    yield eng
    await eng.dispose()


def test_an_engine_is_a_target(engine: Any, conn: Conn) -> None:
    with lease(engine, "sweep", ttl=30) as held:
        row = status(conn, "sweep")
        assert row is not None and row["held"] and row["holder"] == held.holder
    row = status(conn, "sweep")
    assert row is not None and not row["held"]
    assert run_exclusive(engine, "sweep", 30, lambda: "ran").result == "ran"


@pytest.mark.parametrize("statement_first", [True, False], ids=["after-a-statement", "at-once"])
def test_a_claim_inside_begin_survives_its_rollback(
    engine: Any, conn: Conn, statement_first: bool
) -> None:
    conn.execute("CREATE TABLE integ_work (n int)")
    with ExitStack() as stack:
        with pytest.raises(Rollback), engine.begin() as sa_conn:
            if statement_first:
                sa_conn.execute(text("INSERT INTO integ_work VALUES (1)"))
            held = stack.enter_context(lease(sa_conn, "in-tx", ttl=30))
            sa_conn.execute(text("INSERT INTO integ_work VALUES (2)"))
            raise Rollback
        assert conn.execute("SELECT count(*) FROM integ_work").fetchone() == (0,)
        row = status(conn, "in-tx")
        assert row is not None and row["held"] and row["holder"] == held.holder
        assert row["fence"] == held.fence
    row = status(conn, "in-tx")
    assert row is not None and not row["held"]


def test_the_heartbeat_runs_on_its_own_connection(engine: Any, conn: Conn) -> None:
    """The caller's connection is busy for 3 s (pg_sleep inside its transaction), longer
    than the 1 s ttl: only renewals on another connection keep the lease."""
    with engine.connect() as sa_conn:
        sa_conn.execute(text("SELECT 1"))
        with lease(sa_conn, "busy-caller", ttl=1) as held:
            sa_conn.execute(text("SELECT pg_sleep(3)"))
            held.check()
            row = status(conn, "busy-caller")
            assert row is not None and row["held"] and row["holder"] == held.holder
            assert row["renewed_at"] > row["acquired_at"]
            apps = [
                r[0]
                for r in conn.execute(
                    "SELECT application_name FROM pg_stat_activity"
                    " WHERE datname = current_database()"
                )
            ]
            assert "pylease-heartbeat" in apps
        sa_conn.rollback()


def test_an_engine_as_the_heartbeat_target_of_a_connection(engine: Any, conn: Conn) -> None:
    with engine.connect() as sa_conn:
        with lease(sa_conn, "renewed-via-engine", ttl=1, heartbeat_target=engine) as held:
            sa_conn.execute(text("SELECT pg_sleep(2)"))
            held.check()
        sa_conn.rollback()
        # Released once the transaction the block ended in has ended (issue 21, item 3).
        assert wait_until(lambda: not (status(conn, "renewed-via-engine") or {}).get("held"))
    row = status(conn, "renewed-via-engine")
    assert row is not None and row["renewed_at"] > row["acquired_at"]


def test_a_session_is_a_target_through_its_engine(engine: Any, conn: Conn) -> None:
    from sqlalchemy.orm import Session

    conn.execute("CREATE TABLE integ_work (n int)")
    with Session(engine) as session:
        session.execute(text("INSERT INTO integ_work VALUES (1)"))
        with lease(session, "from-a-session", ttl=30) as held:
            session.rollback()
            row = status(conn, "from-a-session")
            assert row is not None and row["held"] and row["holder"] == held.holder
    assert conn.execute("SELECT count(*) FROM integ_work").fetchone() == (0,)


async def test_an_async_session_is_a_target(aengine: Any, conn: Conn) -> None:
    async with sa_async.AsyncSession(aengine) as session:
        await session.execute(text("SELECT 1"))
        async with alease(session, "from-an-async-session", ttl=30) as held:
            row = status(conn, "from-an-async-session")
            assert row is not None and row["held"] and row["holder"] == held.holder


def test_sqlalchemy_urls_are_targets(dsn: str, conn: Conn) -> None:
    url = sa_url(dsn).render_as_string(hide_password=False)
    assert url.startswith("postgresql+psycopg://")
    assert run_exclusive(url, "by-url", 30, lambda: status(conn, "by-url")).result["held"]


def test_what_pylease_cannot_use_is_refused_without_echoing_secrets() -> None:
    with pytest.raises(InvalidArgument, match="postgresql\\+psycopg") as info:
        lease("postgresql+asyncpg://me:s3cret@127.0.0.1/db", "x", ttl=5)
    assert "s3cret" not in str(info.value)
    sqlite_engine = sa.create_engine("sqlite://")
    with pytest.raises(InvalidArgument, match="sqlite"):
        lease(sqlite_engine, "x", ttl=5)
    with pytest.raises(InvalidArgument, match="MetaData"):
        lease(sa.MetaData(), "x", ttl=5)


def test_exclusive_with_an_engine(engine: Any, conn: Conn) -> None:
    @exclusive(engine, "nightly-{tenant}", ttl=30)
    def nightly(tenant: str) -> bool:
        row = status(conn, f"nightly-{tenant}")
        return row is not None and bool(row["held"])

    assert nightly("acme") is True


async def test_an_async_engine_is_a_target(aengine: Any, conn: Conn) -> None:
    async with alease(aengine, "async-sweep", ttl=30) as held:
        row = status(conn, "async-sweep")
        assert row is not None and row["held"] and row["holder"] == held.holder


@pytest.mark.parametrize("statement_first", [True, False], ids=["after-a-statement", "at-once"])
async def test_an_async_claim_inside_begin_survives_its_rollback(
    aengine: Any, conn: Conn, statement_first: bool
) -> None:
    conn.execute("CREATE TABLE integ_work (n int)")
    cm = None
    with pytest.raises(Rollback):
        async with aengine.begin() as sa_conn:
            if statement_first:
                await sa_conn.execute(text("INSERT INTO integ_work VALUES (1)"))
            cm = alease(sa_conn, "async-in-tx", ttl=30)
            held = await cm.__aenter__()
            await sa_conn.execute(text("INSERT INTO integ_work VALUES (2)"))
            raise Rollback
    assert cm is not None
    try:
        assert conn.execute("SELECT count(*) FROM integ_work").fetchone() == (0,)
        row = status(conn, "async-in-tx")
        assert row is not None and row["held"] and row["holder"] == held.holder
    finally:
        await cm.__aexit__(None, None, None)
    row = status(conn, "async-in-tx")
    assert row is not None and not row["held"]


async def test_an_async_connection_keeps_its_lease_while_busy(aengine: Any, conn: Conn) -> None:
    async with aengine.connect() as sa_conn:
        await sa_conn.execute(text("SELECT 1"))
        async with alease(sa_conn, "async-busy", ttl=1) as held:
            await sa_conn.execute(text("SELECT pg_sleep(3)"))
            held.check()
            row = status(conn, "async-busy")
            assert row is not None and row["renewed_at"] > row["acquired_at"]


def test_sync_and_async_mismatches_say_which_api(aengine: Any, engine: Any) -> None:
    with engine.connect() as sa_conn, pytest.raises(InvalidArgument, match="use lease"):
        sa_conn.execute(text("SELECT 1"))
        alease(sa_conn, "x", ttl=5)


# Alembic: schema_sql() run by op.execute(), i.e. text() inside the migration's transaction


CATALOG = """
    WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = %(schema)s)
    SELECT 'f', p.proname, pg_get_function_identity_arguments(p.oid),
           regexp_replace(pg_get_functiondef(p.oid), 'search_path TO [^\\n]*', ''),
           p.prosecdef::text, p.proacl::text
      FROM pg_proc AS p WHERE p.pronamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT 'c', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
           a.attnotnull::text, c.relacl::text
      FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
     WHERE c.relnamespace = (SELECT oid FROM ns) AND a.attnum > 0 AND NOT a.attisdropped
       AND c.relname NOT LIKE '\\_%%'
     ORDER BY 1, 2, 3"""


def catalog(url: str, schema: str) -> list[Any]:
    with psycopg.connect(url) as c:
        return c.execute(CATALOG, {"schema": schema}).fetchall()


@pytest.mark.parametrize("schema", ["public", "integ app"])
def test_schema_sql_installs_what_migrate_installs(fresh_db: Any, schema: str) -> None:
    by_migrate, by_alembic = fresh_db(), fresh_db()
    migrate(by_migrate, schema, say=lambda _line: None)
    eng = sa.create_engine(sa_url(by_alembic))
    try:
        with eng.begin() as sa_conn:
            before = sa_conn.execute(text("SHOW search_path")).scalar()
            sa_conn.execute(text(schema_sql(schema)))
            assert sa_conn.execute(text("SHOW search_path")).scalar() == before
    finally:
        eng.dispose()
    installed = catalog(by_alembic, schema)
    assert len(installed) > 15 and installed == catalog(by_migrate, schema)
    with psycopg.connect(by_alembic, autocommit=True) as c:
        assert c.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE '%%yoyo%%'"
        ).fetchone() == (0,), "yoyo's bookkeeping is not used"
        c.execute(psycopg.sql.SQL("SET search_path = {}").format(psycopg.sql.Identifier(schema)))
        with lease(c, "installed-by-alembic", ttl=30) as held:
            assert held.fence >= 1


def test_schema_sql_after_each_migration_upgrades_to_what_migrate_installs(
    fresh_db: Any,
) -> None:
    """An Alembic project that installed pylease at migration k, upgraded with
    schema_sql(after=k), has what `pylease migrate` installs. (With one migration
    released there is no upgrade yet; each later one adds a case.)"""
    from pylease._resources import data_dir

    by_migrate = fresh_db()
    migrate(by_migrate, "public", say=lambda _line: None)
    ids = migration_ids()
    for k, installed in enumerate(ids[:-1]):
        url = fresh_db()
        eng = sa.create_engine(sa_url(url))
        try:
            with eng.begin() as sa_conn:  # the project's first revision, at migration k
                sa_conn.execute(text("SET LOCAL search_path = public, pg_temp"))
                for earlier in ids[: k + 1]:
                    path = data_dir("migrations", "postgres") / f"{earlier}.sql"
                    sa_conn.execute(text(path.read_text()))
            with eng.begin() as sa_conn:  # the upgrade revision
                sa_conn.execute(text(schema_sql(after=installed)))
        finally:
            eng.dispose()
        assert catalog(url, "public") == catalog(by_migrate, "public"), installed


def test_schema_sql_for_upgrades_and_bad_arguments() -> None:
    ids = migration_ids()
    assert ids[0] == "pylease-0001-leases" and ids == sorted(ids)
    latest = schema_sql(after=ids[-1])
    assert "up to date" in latest and "CREATE" not in latest
    if len(ids) > 1:
        assert "CREATE" in schema_sql(after=ids[0])
    with pytest.raises(InvalidArgument, match="after"):
        schema_sql(after="0001")
    for bad in ("", "x$pylease$y", "s" * 64):
        with pytest.raises(InvalidArgument):
            schema_sql(bad)


ALEMBIC_ENV = """
from alembic import context
from sqlalchemy import create_engine

engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

# The revision docs/integrations.md shows, and one after it that fails: Alembic's
# transaction then rolls back both (PostgreSQL DDL is transactional).
ALEMBIC_REVISIONS = {
    "a1_install_pylease.py": """
from alembic import op

import pylease

revision = "a1"
down_revision = None


def upgrade() -> None:
    op.execute(pylease.schema_sql())
""",
    "a2_broken.py": """
from alembic import op

revision = "a2"
down_revision = "a1"


def upgrade() -> None:
    op.execute("SELECT no_such_function()")
""",
}


def test_an_alembic_revision_installs_pylease(empty_dsn: str, tmp_path: Any) -> None:
    import alembic.command as alembic_command
    from alembic.config import Config

    (tmp_path / "env.py").write_text(ALEMBIC_ENV)
    versions = tmp_path / "versions"
    versions.mkdir()
    for name, text_ in ALEMBIC_REVISIONS.items():
        (versions / name).write_text(text_)
    config = Config()
    config.set_main_option("script_location", str(tmp_path))
    config.set_main_option(
        "sqlalchemy.url", sa_url(empty_dsn).render_as_string(hide_password=False)
    )
    with pytest.raises(sa.exc.ProgrammingError, match="no_such_function"):
        alembic_command.upgrade(config, "head")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT to_regclass('pylease_leases')").fetchone() == (None,)
    (versions / "a2_broken.py").unlink()
    alembic_command.upgrade(config, "head")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchone() == ("a1",)
        assert c.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE '%%yoyo%%'"
        ).fetchone() == (0,)
        with lease(c, "installed-by-alembic", ttl=30) as held:
            assert held.fence == 1


# A block that ends inside the caller's transaction (issue 21, item 3) -------------------

JOBS = 4


def _counter(conn: Conn) -> None:
    conn.execute("CREATE TABLE counter (n int)")
    conn.execute("INSERT INTO counter VALUES (0)")


def _threads(job: Any) -> None:
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            job()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded) for _ in range(JOBS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


@pytest.mark.parametrize("through", ["connection", "session"])
def test_read_modify_write_jobs_in_sqlalchemy_transactions_count_every_job(
    engine: Any, conn: Conn, through: str
) -> None:
    """Each job reads and writes the counter under the lease, in a transaction that
    commits a moment after the block: the next holder must read what it wrote."""
    from sqlalchemy.orm import Session

    _counter(conn)

    def body(target: Any, run: Any) -> None:
        with lease(target, "counter", ttl=60, wait=FOREVER):
            n = run(text("SELECT n FROM counter")).scalar_one()
            run(text("UPDATE counter SET n = :n"), {"n": n + 1})
        time.sleep(0.2)  # more of the transaction's work, after the block

    def job() -> None:
        if through == "connection":
            with engine.begin() as sa_conn:
                body(sa_conn, sa_conn.execute)
        else:
            with Session(engine) as session, session.begin():
                body(session, session.execute)

    _threads(job)
    assert conn.execute("SELECT n FROM counter").fetchone() == (JOBS,)


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_a_session_lease_is_held_until_the_session_transaction_ends(
    engine: Any, conn: Conn, end: str
) -> None:
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        session.execute(text("SELECT 1"))
        with lease(session, "in-session", ttl=60) as held:
            pass
        time.sleep(0.3)
        row = status(conn, "in-session")
        assert row is not None and row["held"] and row["holder"] == held.holder
        session.commit() if end == "commit" else session.rollback()
        assert wait_until(lambda: not (status(conn, "in-session") or {}).get("held"))


async def test_an_async_session_lease_is_held_until_its_transaction_commits(
    aengine: Any, conn: Conn
) -> None:
    async with sa_async.AsyncSession(aengine) as session:
        await session.execute(text("SELECT 1"))
        async with alease(session, "in-async-session", ttl=60) as held:
            pass
        await asyncio.sleep(0.3)
        row = status(conn, "in-async-session")
        assert row is not None and row["held"] and row["holder"] == held.holder
        await session.commit()
        limit = time.monotonic() + 10
        while (status(conn, "in-async-session") or {}).get("held") and time.monotonic() < limit:
            await asyncio.sleep(0.02)
        assert not (status(conn, "in-async-session") or {}).get("held")


async def test_an_async_connection_lease_is_held_until_its_transaction_commits(
    aengine: Any, conn: Conn
) -> None:
    async with aengine.connect() as sa_conn:
        await sa_conn.execute(text("SELECT 1"))
        async with alease(sa_conn, "in-async-tx", ttl=60) as held:
            pass
        await asyncio.sleep(0.3)
        row = status(conn, "in-async-tx")
        assert row is not None and row["held"] and row["holder"] == held.holder
        await sa_conn.commit()
        limit = time.monotonic() + 10
        while (status(conn, "in-async-tx") or {}).get("held") and time.monotonic() < limit:
            await asyncio.sleep(0.02)
        assert not (status(conn, "in-async-tx") or {}).get("held")
