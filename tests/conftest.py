"""The test harness: a real PostgreSQL server, and a fresh database for every test.

The server is found in this order: ``PYLEASE_TEST_DSN``; a server answering on
127.0.0.1:5432 as user ``postgres``; else a throwaway server started with
pytest-postgresql's ``postgresql_proc`` from the installed binaries (as the
``postgres`` user when the tests run as root, since PostgreSQL refuses root).
Every test database is cloned from a template migrated once per session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pylease import _keeper
from pylease import dsn as dsn_mod
from pylease.migrate import migrate
from tests import pgserver


@pytest.fixture(scope="session")
def pg_admin_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A DSN to the server's maintenance database, as a role that may create databases."""
    with pgserver.find_or_start(request) as admin:
        yield admin


def _with_dbname(base: str, dbname: str) -> str:
    params = dsn_mod.parse(base)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)


def _create_db(admin: str, dbname: str, template: str | None = None) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname))
        if template:
            query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(query)
    return _with_dbname(admin, dbname)


def _drop_db(admin: str, dbname: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
        )


@pytest.fixture(scope="session")
def pg_template(pg_admin_dsn: str) -> Iterator[str]:
    """The name of a database with the schema migrated into it, to clone per test."""
    name = f"pylease_tmpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = _create_db(pg_admin_dsn, name)
    migrate(url, say=lambda _line: None)
    yield name
    _drop_db(pg_admin_dsn, name)


@pytest.fixture
def fresh_db(pg_admin_dsn: str) -> Iterator[Callable[..., str]]:
    """A factory: ``fresh_db()`` an empty database, ``fresh_db(template)`` a clone; its DSN.

    The databases are dropped after the test.
    """
    created: list[str] = []

    def make(template: str | None = None) -> str:
        name = f"pylease_t_{uuid.uuid4().hex[:12]}"
        created.append(name)
        return _create_db(pg_admin_dsn, name, template)

    yield make
    for name in created:
        _drop_db(pg_admin_dsn, name)


@pytest.fixture
def empty_dsn(fresh_db: Any) -> str:
    """A DSN to a fresh database without the pylease schema."""
    url: str = fresh_db()
    return url


@pytest.fixture
def dsn(fresh_db: Any, pg_template: str) -> str:
    """A DSN to a fresh database with the pylease schema installed."""
    url: str = fresh_db(pg_template)
    return url


@pytest.fixture(scope="module")
def module_conn(pg_admin_dsn: str, pg_template: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to one schema-installed database shared by a module.

    For many cheap tests that each leave the database as they found it.
    """
    name = f"pylease_m_{uuid.uuid4().hex[:12]}"
    url = _create_db(pg_admin_dsn, name, pg_template)
    try:
        with psycopg.connect(url, autocommit=True) as c:
            yield c
    finally:
        _drop_db(pg_admin_dsn, name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def conn2(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A second autocommit connection to the same database, for scripted races."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def connect(dsn: str) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """Opens more connections to the test's database (autocommit unless told); closes them."""
    opened: list[psycopg.Connection[Any]] = []

    def make(autocommit: bool = True) -> psycopg.Connection[Any]:
        c = psycopg.connect(dsn, autocommit=autocommit)
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.close()


@pytest.fixture
async def aconn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An async autocommit connection to the test's database."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def own_keeper(monkeypatch: pytest.MonkeyPatch) -> _keeper.Keeper:
    """A keeper of this test's own, so leases other tests left behind cannot show in it."""
    fresh = _keeper.Keeper()
    monkeypatch.setattr(_keeper, "_keeper", fresh)
    return fresh
