"""Faults: PgBouncer in transaction mode between the clients and PostgreSQL.

Debian's pgbouncer is started here, as the ``postgres`` user on a free loopback
port, with its ini and userlist in a temporary directory. Through it run:

- the SQL contract suite (tests/sql/test_contract.py), with this module's
  ``dsn``, ``conn`` and ``conn2`` fixtures pointing through PgBouncer;
- the Python API tests (tests/api/test_lease.py, tests/api/test_lease_async.py), likewise;
- the SQL tests of permits and several names (tests/sql/test_permits_and_several_names.py);

except the few that need one server session for several statements by design
(LISTEN, terminating a client's own backend, per-session statistics), listed
below with the reason. Then the evidence for the design: the same pooler breaks
``pg_try_advisory_lock``, the usual PostgreSQL lock, while the lease row is
indifferent to which server connection a statement lands on.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest

import pylease  # its permit and leases: test_contract has fixtures of those names
from pylease import LeaseBusy, lease, run_exclusive
from tests.api import test_lease, test_lease_async
from tests.sql import test_contract as test_sql_contract
from tests.sql import test_permits_and_several_names as test_sql_permits
from tests.support.faultkit import Bouncer, wait_until

Conn = psycopg.Connection[Any]

SINGLE = "pylease_single_server_conn"
# One worker runs the module (make test's parallel workers), so there is one PgBouncer:
# each keeps up to 20 idle server connections to every test database it served, and
# one per worker took the shared server past its max_connections.
pytestmark = pytest.mark.xdist_group("pgbouncer")

# Tests that cannot pass through a transaction-mode pooler, by the pooler's design.
SESSION_BOUND = {
    # LISTEN binds a server session; PgBouncer hands it to other clients.
    "test_a_freeing_release_notifies_with_the_name": "LISTEN",
    "test_no_notification_unless_the_release_frees_the_name": "LISTEN",
    "test_a_handover_through_notify": "LISTEN (waiters fall back to polling)",
    "test_waiting_degrades_to_polling_when_listen_breaks": "terminates a LISTEN backend",
    # They terminate the backend of a client connection: behind a pooler that is
    # a server connection other clients share, not the client's own.
    "test_the_heartbeat_reconnects_after_its_backend_is_terminated": "terminates a backend",
    "test_an_unreachable_database_at_release_only_warns": "terminates a backend",
    "test_a_lease_no_renewal_can_reach_is_lost_before_its_expiry": "terminates a backend",
    "test_a_pool_target_waits_through_notify": "LISTEN (waiters fall back to polling)",
    # Counts function calls per backend with track_functions, set per database
    # session; the pooler's server connections were opened before it was set.
    "test_a_thousand_leases_are_renewed_by_one_statement_per_tick": "per-session statistics",
    # They watch a client's backend wait for a row lock (pg_stat_activity): behind the
    # pooler a client has no backend of its own between statements.
    "test_a_renewal_of_an_expired_slot_waits_for_the_claim_taking_it_then_fails": "a backend",
    "test_claim_all_of_new_names_waits_for_the_other_claim_then_is_busy": "a backend",
    "test_claim_all_of_free_names_waits_for_the_other_claim_then_is_busy": "a backend",
    "test_a_claimer_waiting_on_a_rolled_back_claim_all_gets_every_name": "a backend",
    # ALTER DATABASE ... SET reaches sessions opened after it; the pooler's were not.
    "test_per_slot_fences_only_grow_under_contention": "a database setting per session",
}


@pytest.fixture(scope="module")
def bouncer(pg_admin_dsn: str) -> Iterator[Bouncer]:
    admin_db = psycopg.conninfo.conninfo_to_dict(pg_admin_dsn).get("dbname") or "postgres"
    b = Bouncer(pg_admin_dsn)
    b.start({SINGLE: str(admin_db)})
    try:
        yield b
    finally:
        b.stop()


def one(conn: Conn, query: Any, params: Any = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _connect(url: str, autocommit: bool = True) -> Conn:
    # Server-side prepared statements cannot cross transactions behind PgBouncer
    # 1.18; pylease's own connections never prepare, and neither do the tests' here.
    return psycopg.connect(url, autocommit=autocommit, prepare_threshold=None)


@pytest.fixture
def direct_dsn(fresh_db: Any, pg_template: str) -> str:
    url: str = fresh_db(pg_template)
    return url


@pytest.fixture
def dsn(direct_dsn: str, bouncer: Bouncer) -> str:
    """The test's fresh database, reached through PgBouncer in transaction mode."""
    return bouncer.via(direct_dsn)


@pytest.fixture
def conn(dsn: str) -> Iterator[Conn]:
    with _connect(dsn) as c:
        yield c


@pytest.fixture
def conn2(dsn: str) -> Iterator[Conn]:
    with _connect(dsn) as c:
        yield c


@pytest.fixture
def connect(dsn: str) -> Iterator[Callable[..., Conn]]:
    opened: list[Conn] = []

    def make(autocommit: bool = True) -> Conn:
        c = _connect(dsn, autocommit)
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.close()


@pytest.fixture
async def aconn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=None
    ) as c:
        yield c


@pytest.fixture
async def aconn2(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The adopted async tests' second connection, without prepared statements too (a
    statement prepared on one server session is unknown on the next one)."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=None
    ) as c:
        yield c


@pytest.fixture(scope="module")
def module_conn(bouncer: Bouncer, pg_admin_dsn: str, pg_template: str) -> Iterator[Conn]:
    name = f"pylease_m_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Identifier(pg_template)
            )
        )
    try:
        with _connect(bouncer.url(name)) as c:
            yield c
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(name)
                )
            )


def _is_fixture(obj: object) -> bool:
    return type(obj).__name__ == "FixtureFunctionDefinition" or hasattr(
        obj, "_pytestfixturefunction"
    )


def _adopt(module: Any, prefix: str) -> None:
    """Collect a module's tests here, with its own fixtures unless this module has them."""
    for attr in dir(module):
        obj = getattr(module, attr)
        if attr.startswith("test_") and attr not in SESSION_BOUND and callable(obj):
            globals()[f"test_{prefix}_{attr.removeprefix('test_')}"] = obj
        elif _is_fixture(obj) and attr not in globals():
            globals()[attr] = obj


_adopt(test_sql_contract, "contract")
_adopt(test_lease, "api")
_adopt(test_lease_async, "async_api")
_adopt(test_sql_permits, "permits")


def test_the_adopted_suites_really_run_through_pgbouncer(
    dsn: str, direct_dsn: str, conn: Conn, bouncer: Bouncer
) -> None:
    assert conn.info.port == bouncer.port != psycopg.conninfo.conninfo_to_dict(direct_dsn)["port"]

    # In transaction mode a client has no server session of its own: another
    # client's transaction takes the session it just used, and its next statement
    # runs on another one.
    def pid(c: Conn) -> int:
        return int(one(c, "SELECT pg_backend_pid()"))

    with _connect(dsn) as other:
        first = pid(conn)
        with other.transaction():
            assert pid(other) == first
            assert pid(conn) != first
    adopted = [n for n in globals() if n.startswith(("test_contract_", "test_api_"))]
    assert len(adopted) > 60, adopted


def test_a_waiter_behind_pgbouncer_acquires_by_polling(dsn: str, conn: Conn) -> None:
    """LISTEN cannot work through a transaction-mode pooler: waiters fall back to polling."""
    with lease(dsn, "sweep", ttl=300) as first:
        got: dict[str, Any] = {}

        def wait() -> None:
            with lease(dsn, "sweep", ttl=30, wait=60, poll_interval=0.5) as held:
                got["fence"] = held.fence

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(1.0)
        assert not got
    waiter.join(30)
    assert got.get("fence", 0) > first.fence


def test_permits_and_several_names_behind_pgbouncer(dsn: str) -> None:
    """A semaphore of 2 and a claim of two names, each statement on whichever server
    connection the pooler picks: the third permit waits (polling) until one is given
    back, and a claim of both names is busy while one of them is held."""
    with (
        pylease.permit(dsn, "export", ttl=300, max_permits=2) as a,
        pylease.permit(dsn, "export", ttl=300, max_permits=2) as b,
    ):
        assert set(a.slots) | set(b.slots) == {0, 1}
        with pytest.raises(LeaseBusy), pylease.permit(dsn, "export", ttl=30, max_permits=2):
            pass
        got: dict[str, Any] = {}

        def wait() -> None:
            with pylease.permit(
                dsn, "export", ttl=30, max_permits=2, wait=60, poll_interval=0.5
            ) as c:
                got["slots"] = c.slots

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(1.0)
        assert not got
    waiter.join(30)
    assert not waiter.is_alive()
    assert got["slots"].keys() <= {0, 1}
    with (
        lease(dsn, "from", ttl=300),
        pytest.raises(LeaseBusy),
        pylease.leases(dsn, ["from", "to"], ttl=30),
    ):
        pass
    with pylease.leases(dsn, ["from", "to"], ttl=30) as both:
        assert set(both.fences) == {"from", "to"}


# The evidence: advisory locks behind a transaction-mode pooler -------------------


def test_pg_try_advisory_lock_is_granted_twice_behind_pgbouncer(
    bouncer: Bouncer, pg_admin_dsn: str
) -> None:
    """Two clients both 'hold' one advisory lock, and the lock outlives its client.

    In transaction mode each statement may run on any server connection; a
    session-level advisory lock belongs to the server connection, not the client.
    With one server connection (as under load, when clients outnumber it), the
    second client's try_lock runs on the session that already holds the lock, and
    advisory locks are re-entrant within a session: both are told yes.
    """
    key = uuid.uuid4().int % 2**62
    url = bouncer.url(SINGLE)
    with _connect(url) as a, _connect(url) as b:
        assert a.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
        assert b.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
        # Both believe they hold it: mutual exclusion is gone.
    # Both clients are gone, yet the lock is still held, by a pooled server
    # connection nobody will unlock it from: an orphan until PgBouncer recycles it.
    with _connect(pg_admin_dsn) as c:
        granted = c.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND ((classid::bigint << 32) | objid::bigint) = %s AND granted",
            (key,),
        ).fetchone()
    assert granted == (1,)


def test_the_lease_row_excludes_behind_the_same_single_server_connection(
    bouncer: Bouncer, fresh_db: Any, pg_template: str
) -> None:
    """Where advisory locks failed, leases hold: the row, not the session, is the lock."""
    direct: str = fresh_db(pg_template)
    # One server connection for every client: the worst case of the test above.
    single = Bouncer(direct)
    dbname = psycopg.conninfo.conninfo_to_dict(direct)["dbname"]
    single.start({"one": str(dbname)})
    try:
        url = single.url("one")
        with _connect(url) as a, _connect(url) as b:
            with lease(a, "sweep", ttl=30, heartbeat_target=url) as held:
                with pytest.raises(LeaseBusy), lease(b, "sweep", ttl=30, heartbeat_target=url):
                    pytest.fail("granted twice")
                assert run_exclusive(url, "sweep", 30, lambda: "ran") == (False, None)
                assert b.execute(
                    "SELECT lease_holds('sweep', %s, %s)", (held.holder, held.fence)
                ).fetchone() == (True,)
            # Given back on release, whoever's server connection ran it.
            assert run_exclusive(url, "sweep", 30, lambda: "ran") == (True, "ran")
    finally:
        single.stop()


def test_a_holder_rides_out_a_pgbouncer_restart(
    direct_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The pooler itself dies and comes back: the heartbeat reconnects through it."""
    caplog.set_level(logging.WARNING, logger="pylease")
    own = Bouncer(direct_dsn)
    own.start({})
    try:
        url = own.via(direct_dsn)
        lost: list[Any] = []
        with lease(url, "sweep", ttl=6, on_lost=lost.append) as held:
            renewals = held._ticket.renewals
            wait_until(lambda: held._ticket.renewals > renewals, what="a renewal")
            own.kill()
            wait_until(
                lambda: any("renewing" in r.getMessage() for r in caplog.records),
                what="a failed renewal",
            )
            own.relaunch()
            after = held._ticket.renewals
            wait_until(lambda: held._ticket.renewals > after, what="a renewal through the new one")
            held.check()
            with _connect(direct_dsn) as c:
                row = c.execute("SELECT holder, fence, held FROM lease_status('sweep')").fetchone()
            assert row == (held.holder, held.fence, True)
        assert lost == []
    finally:
        own.stop()
