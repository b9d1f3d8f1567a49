"""lease(), run_exclusive() and keep_fresh() on a real PostgreSQL; async twins in
test_lease_async.py."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from pylease import (
    DatabaseUnavailable,
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    Outcome,
    SchemaMissing,
    keep_fresh,
    lease,
    run_exclusive,
)
from pylease.heartbeat import Keeper, keeper
from tests.helpers_lease import (
    DEAD_URL,
    DETECT,
    backends,
    claim,
    function_calls,
    status,
    steal,
    terminate,
    track_functions,
    wait_until,
)

Conn = psycopg.Connection[Any]


def test_heartbeat_holds_a_1s_lease_for_3s(conn: Conn, conn2: Conn) -> None:
    with lease(conn, "sweep", ttl=1) as held:
        assert held.name == "sweep" and isinstance(held.fence, int)
        limit = time.monotonic() + 3
        while time.monotonic() < limit:
            assert claim(conn2, "sweep") is None
            time.sleep(0.2)
        held.check()
        assert not held.lost
        row = status(conn2, "sweep")
        assert row is not None and row["held"] and row["holder"] == held.holder
        assert row["renewed_at"] > row["acquired_at"]
    assert claim(conn2, "sweep") is not None


def test_a_steal_is_detected(conn: Conn, conn2: Conn) -> None:
    told = threading.Event()
    seen: list[LeaseLost] = []

    def on_lost(error: LeaseLost) -> None:
        seen.append(error)
        told.set()

    with pytest.raises(LeaseLost) as raised, lease(conn, "sweep", ttl=0.6, on_lost=on_lost) as held:
        steal(conn2, "sweep")
        assert told.wait(DETECT), "the heartbeat did not notice the steal"
        assert held.lost
        with pytest.raises(LeaseLost):
            held.check()
    assert raised.value.name == "sweep"
    assert seen[0].name == "sweep"
    row = status(conn2, "sweep")
    assert row is not None and row["holder"] == "thief" and row["held"]


def test_the_callers_rollback_keeps_the_renewals(conn: Conn, conn2: Conn) -> None:
    conn.execute("CREATE TABLE work (n int)")
    with lease(conn, "sweep", ttl=0.6) as held:
        first = status(conn2, "sweep")
        assert first is not None
        with conn.transaction():
            conn.execute("INSERT INTO work VALUES (1)")
            assert wait_until(lambda: held._ticket.renewals >= 2)
            # The heartbeat never commits the caller's half-done work.
            assert conn2.execute("SELECT count(*) FROM work").fetchone() == (0,)
            raise psycopg.Rollback
        after = status(conn2, "sweep")
        assert after is not None and after["renewed_at"] > first["renewed_at"] and after["held"]
        held.check()
    assert conn2.execute("SELECT count(*) FROM work").fetchone() == (0,)


def test_the_heartbeat_reconnects_after_its_backend_is_terminated(conn: Conn, conn2: Conn) -> None:
    with lease(conn, "sweep", ttl=1) as held:
        assert wait_until(lambda: backends(conn2, "pylease-heartbeat"))
        pids = backends(conn2, "pylease-heartbeat")
        terminate(conn2, pids)
        assert wait_until(lambda: set(backends(conn2, "pylease-heartbeat")) - set(pids))
        renewals = held._ticket.renewals
        assert wait_until(lambda: held._ticket.renewals > renewals + 1)
        held.check()
        assert claim(conn2, "sweep") is None


def test_body_exception_survives_a_failing_release(conn: Conn, conn2: Conn) -> None:
    with pytest.raises(KeyError) as raised, lease(conn, "sweep", ttl=5):
        conn2.execute("ALTER FUNCTION lease_release(text, text, interval) RENAME TO gone")
        raise KeyError("body")
    assert raised.value.args == ("body",)
    notes = getattr(raised.value, "__notes__", [])
    assert any("releasing lease 'sweep' failed" in n for n in notes), notes


def test_a_failing_release_raises_when_the_body_returned(conn: Conn, conn2: Conn) -> None:
    with pytest.raises(SchemaMissing), lease(conn, "sweep", ttl=5):
        conn2.execute("ALTER FUNCTION lease_release(text, text, interval) RENAME TO gone")


def test_an_unreachable_database_at_release_only_warns(
    dsn: str, conn2: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(dsn, autocommit=True) as mine, lease(mine, "sweep", ttl=5):
        terminate(conn2, [mine.info.backend_pid])
    assert any(
        r.levelno == logging.WARNING and "could not release" in r.getMessage()
        for r in caplog.records
    )
    row = status(conn2, "sweep")
    assert row is not None and row["held"]  # until its expiry


def test_body_exception_notes_a_lost_lease(conn: Conn, conn2: Conn) -> None:
    with pytest.raises(KeyError) as raised, lease(conn, "sweep", ttl=5):
        steal(conn2, "sweep")
        raise KeyError("body")
    assert any("was lost" in n for n in getattr(raised.value, "__notes__", []))


def test_a_lost_release_raises_lease_lost(conn: Conn, conn2: Conn) -> None:
    with pytest.raises(LeaseLost), lease(conn, "sweep", ttl=5, heartbeat=False):
        steal(conn2, "sweep")
    row = status(conn2, "sweep")
    assert row is not None and row["holder"] == "thief" and row["held"]


def test_without_heartbeat_check_raises_once_the_ttl_ran_out(conn: Conn) -> None:
    with pytest.raises(LeaseLost), lease(conn, "sweep", ttl=0.2, heartbeat=False) as held:
        held.check()
        time.sleep(0.3)
        assert held.lost
        with pytest.raises(LeaseLost):
            held.check()


def test_busy_at_once_with_wait_0(conn: Conn, conn2: Conn) -> None:
    claim(conn2, "sweep", holder="them")
    with pytest.raises(LeaseBusy) as raised, lease(conn, "sweep", ttl=5):
        pytest.fail("the body ran")
    assert (raised.value.name, raised.value.holder, raised.value.waited) == ("sweep", "them", 0.0)


def test_busy_after_wait(conn: Conn, conn2: Conn) -> None:
    claim(conn2, "sweep", holder="them")
    with pytest.raises(LeaseBusy) as raised, lease(conn, "sweep", ttl=5, wait=0.4):
        pytest.fail("the body ran")
    assert (raised.value.name, raised.value.holder) == ("sweep", "them")
    assert raised.value.waited >= 0.4


def test_a_waiter_gets_an_expired_lease(conn: Conn, conn2: Conn) -> None:
    claim(conn2, "sweep", holder="them", ttl="300ms")
    with lease(conn, "sweep", ttl=5, wait=DETECT, poll_interval=60) as held:
        assert status(conn2, "sweep")["holder"] == held.holder  # type: ignore[index]


def _wait_in_thread(target: object, name: str, **options: Any) -> tuple[threading.Thread, dict]:
    result: dict[str, Any] = {}
    started = threading.Event()

    def run() -> None:
        started.set()
        t0 = time.monotonic()
        try:
            with lease(target, name, ttl=5, **options) as held:
                result["waited"] = time.monotonic() - t0
                result["fence"] = held.fence
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    return thread, result


def test_a_handover_through_notify(dsn: str, conn: Conn, conn2: Conn) -> None:
    # The holder's ttl and the poll interval are far longer than the bound, so only
    # the release's NOTIFY can wake the waiter in time.
    with lease(conn, "sweep", ttl=120):
        thread, result = _wait_in_thread(dsn, "sweep", wait=60, poll_interval=60)
        assert wait_until(lambda: backends(conn2, "pylease-listen"))
        time.sleep(0.2)
        released_at = time.monotonic()
    thread.join(DETECT)
    assert "fence" in result, result
    assert time.monotonic() - released_at < 2.0


def test_waiting_degrades_to_polling_when_listen_breaks(dsn: str, conn: Conn, conn2: Conn) -> None:
    with lease(conn, "sweep", ttl=120):
        thread, result = _wait_in_thread(dsn, "sweep", wait=30, poll_interval=0.2)
        assert wait_until(lambda: backends(conn2, "pylease-listen"))
        terminate(conn2, backends(conn2, "pylease-listen"))
        time.sleep(0.3)
    thread.join(DETECT)
    assert "fence" in result, result


def test_a_thousand_leases_are_renewed_by_one_statement_per_tick(dsn: str, conn: Conn) -> None:
    track_functions(conn)
    with ExitStack() as stack:
        helds = [stack.enter_context(lease(dsn, f"job-{i}", ttl=0.9)) for i in range(1000)]
        assert wait_until(lambda: all(h._ticket.renewals >= 2 for h in helds), 30)
    # The heartbeat's backend has ended with the last lease, flushing its statistics.
    assert wait_until(lambda: function_calls(conn, "lease_renew_many") > 0)
    calls = function_calls(conn, "lease_renew_many")
    # Every tick renews all the leases still held; the first one taken is released last.
    ticks = max(h._ticket.renewals for h in helds)
    assert 2 <= calls <= ticks + 1, (calls, ticks)
    assert function_calls(conn, "lease_renew") == 0
    assert function_calls(conn, "lease_release") == 1000


def test_errors_pickle(conn: Conn, conn2: Conn) -> None:
    claim(conn2, "sweep", holder="them")
    with pytest.raises(LeaseBusy) as busy, lease(conn, "sweep", ttl=5):
        pass
    copy = pickle.loads(pickle.dumps(busy.value))
    assert (type(copy), copy.name, copy.holder, str(copy)) == (
        LeaseBusy,
        "sweep",
        "them",
        str(busy.value),
    )
    with pytest.raises(LeaseLost) as lost, lease(conn, "other", ttl=5):
        steal(conn2, "other")
    copy = pickle.loads(pickle.dumps(lost.value))
    assert (type(copy), copy.name, copy.reason) == (LeaseLost, "other", lost.value.reason)


def test_run_exclusive_runs_the_work(conn: Conn, conn2: Conn) -> None:
    def work() -> str:
        assert claim(conn2, "sweep") is None
        return "done"

    assert run_exclusive(conn, "sweep", 5, work) == Outcome(True, "done")
    assert claim(conn2, "sweep") is not None


def test_run_exclusive_is_silent_when_busy(
    conn: Conn, conn2: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    claim(conn2, "sweep")
    caplog.set_level(logging.DEBUG, "pylease")
    assert run_exclusive(conn, "sweep", 5, lambda: pytest.fail("ran")) == Outcome(False, None)
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_run_exclusive_raises_on_a_missing_schema(empty_dsn: str) -> None:
    with pytest.raises(SchemaMissing) as raised:
        run_exclusive(empty_dsn, "sweep", 5, lambda: None)
    assert isinstance(raised.value.__cause__, psycopg.Error)


def test_run_exclusive_raises_on_a_dead_server() -> None:
    with pytest.raises(DatabaseUnavailable) as raised:
        run_exclusive(DEAD_URL, "sweep", 5, lambda: None)
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)


def test_run_exclusive_raises_the_works_exception(conn: Conn, conn2: Conn) -> None:
    def work() -> None:
        raise RuntimeError("sweep failed")

    with pytest.raises(RuntimeError, match="sweep failed"):
        run_exclusive(conn, "sweep", 5, work)
    assert claim(conn2, "sweep") is not None


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"holder": ""}, "holder"),
        ({"wait": -1}, "wait"),
        ({"min_hold": -1}, "min_hold"),
        ({"on_lost": "no"}, "on_lost"),
    ],
)
def test_invalid_arguments_raise_before_any_sql(kwargs: dict[str, Any], parameter: str) -> None:
    args: dict[str, Any] = {"name": "sweep", "ttl": 5, **kwargs}
    with pytest.raises(InvalidArgument) as raised:
        lease(DEAD_URL, **args)
    assert isinstance(raised.value, ValueError)
    assert raised.value.parameter == parameter
    with pytest.raises(InvalidArgument):
        run_exclusive(DEAD_URL, work=lambda: None, **args)


def test_a_target_of_the_wrong_kind_is_refused(aconn: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(InvalidArgument, match="alease"), lease(aconn, "sweep", ttl=5):
        pass
    with pytest.raises(InvalidArgument, match="target"), lease(42, "sweep", ttl=5):
        pass


def test_a_pool_target(dsn: str, conn2: Conn) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        with lease(pool, "sweep", ttl=0.6) as held:
            assert wait_until(lambda: held._ticket.renewals >= 2)
            assert claim(conn2, "sweep") is None
            held.check()
        assert claim(conn2, "sweep") is not None


def test_a_url_target(dsn: str, conn2: Conn) -> None:
    with lease(dsn, "sweep", ttl=0.6) as held:
        assert wait_until(lambda: held._ticket.renewals >= 2)
        assert claim(conn2, "sweep") is None
    assert claim(conn2, "sweep") is not None
    assert run_exclusive(dsn, "sweep2", 5, lambda: 7) == Outcome(True, 7)


def test_a_connection_with_another_row_factory(dsn: str, conn2: Conn) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as mine:
        with lease(mine, "sweep", ttl=0.6) as held:
            assert wait_until(lambda: held._ticket.renewals >= 1)
            assert isinstance(held.fence, int)
        assert mine.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_a_claim_from_inside_a_transaction_commits_on_its_own(dsn: str, conn2: Conn) -> None:
    with psycopg.connect(dsn) as mine:  # not autocommit
        mine.execute("SELECT 1")  # the caller's transaction is open
        with lease(mine, "sweep", ttl=5) as held:
            row = status(conn2, "sweep")
            assert row is not None and row["holder"] == held.holder
        # Released while the caller's transaction is still open, outside it.
        assert mine.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert claim(conn2, "sweep") is not None
        mine.rollback()


def test_an_idle_non_autocommit_connection_commits_claim_and_release(dsn: str, conn2: Conn) -> None:
    with psycopg.connect(dsn) as mine:
        with lease(mine, "sweep", ttl=5) as held:
            assert mine.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert status(conn2, "sweep")["holder"] == held.holder  # type: ignore[index]
        assert mine.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert claim(conn2, "sweep") is not None


def test_min_hold_keeps_the_name_after_release(conn: Conn, conn2: Conn) -> None:
    with lease(conn, "sweep", ttl=5, min_hold=60):
        pass
    assert claim(conn2, "sweep") is None
    row = status(conn2, "sweep")
    assert row is not None and not row["held"]  # released, yet not free before min_hold


def test_default_holders_are_unique_per_claim(conn: Conn) -> None:
    with lease(conn, "a", ttl=5) as a, lease(conn, "b", ttl=5) as b:
        assert a.holder != b.holder
        host, pid, token = a.holder.rsplit(":", 2)
        assert len(token) == 32 and int(pid) > 0 and host


def test_stopping_while_ticks_run_never_reports_a_loss(conn: Conn, own_keeper: Keeper) -> None:
    seen: list[LeaseLost] = []
    # Bodies end at every phase of the renewal cycle (ttl/3 = 0.1 s).
    for i in range(20):
        with lease(conn, f"quick-{i}", ttl=0.3, on_lost=seen.append):
            time.sleep(0.05 + (i % 7) * 0.03)
    assert seen == []
    assert keeper().tickets() == []


def test_keep_fresh_renews_somebody_elses_lease(dsn: str, conn: Conn, conn2: Conn) -> None:
    claim(conn2, "sweep", holder="owner", ttl="600ms")
    with keep_fresh(dsn, "sweep", "owner") as held:
        assert held.holder == "owner" and held.fence == 1
        time.sleep(1.5)
        assert claim(conn, "sweep") is None
        held.check()
    # Stopping never releases: the lease stays the owner's until it expires.
    row = status(conn2, "sweep")
    assert row is not None and row["holder"] == "owner" and row["held"]


def test_keep_fresh_of_a_lease_not_held_raises(dsn: str, conn2: Conn) -> None:
    claim(conn2, "sweep", holder="owner")
    with pytest.raises(LeaseLost), keep_fresh(dsn, "sweep", "somebody"):
        pytest.fail("the body ran")


def test_keep_fresh_notices_a_loss(dsn: str, conn2: Conn) -> None:
    claim(conn2, "sweep", holder="owner", ttl="600ms")
    told = threading.Event()
    with (
        pytest.raises(LeaseLost),
        keep_fresh(dsn, "sweep", "owner", on_lost=lambda _e: told.set()) as held,
    ):
        steal(conn2, "sweep")
        assert told.wait(DETECT)
        assert held.lost


def test_a_lease_no_renewal_can_reach_is_lost_before_its_expiry(
    pg_admin_dsn: str, conn: Conn, conn2: Conn
) -> None:
    told = threading.Event()
    dbname = conn.info.dbname
    admin = psycopg.connect(pg_admin_dsn, autocommit=True)
    with (
        pytest.raises(LeaseLost) as raised,
        lease(conn, "sweep", ttl=1, on_lost=lambda _e: told.set()) as held,
    ):
        assert wait_until(lambda: backends(conn2, "pylease-heartbeat"))
        admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
        try:
            terminate(conn2, backends(conn2, "pylease-heartbeat"))
            assert told.wait(DETECT), "the loss was not reported"
            row = status(conn2, "sweep")
            # Reported before the lease really expired: the body had time to stop.
            assert row is not None and row["held"]
            assert held.lost
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
            admin.close()
    assert "no renewal succeeded" in raised.value.reason


def test_heartbeat_target_names_where_renewals_run(dsn: str, conn: Conn, conn2: Conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as dedicated:
        with lease(conn, "a", ttl=0.6, heartbeat_target=dedicated) as held:
            assert wait_until(lambda: held._ticket.renewals >= 2)
        assert not backends(conn2, "pylease-heartbeat")
    with lease(conn, "b", ttl=0.6, heartbeat_target=dsn) as held:
        assert wait_until(lambda: held._ticket.renewals >= 2)
    with (
        pytest.raises(InvalidArgument, match="heartbeat_target"),
        lease(dsn, "c", ttl=1, heartbeat_target=dsn),
    ):
        pass


def test_the_heartbeat_connection_carries_the_password(dsn: str) -> None:
    from pylease.targets import connection_conninfo

    # The test server trusts every connection, but libpq still reports the password.
    with psycopg.connect(dsn, password="s3cret", autocommit=True) as mine:
        assert "s3cret" not in mine.info.dsn
        assert "password=s3cret" in connection_conninfo(mine)


def test_a_pool_target_waits_through_notify(dsn: str, conn: Conn, conn2: Conn) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        with lease(conn, "sweep", ttl=120):
            thread, result = _wait_in_thread(pool, "sweep", wait=60, poll_interval=60)
            assert wait_until(lambda: backends(conn2, "pylease-listen"))
            time.sleep(0.2)
            released_at = time.monotonic()
        thread.join(DETECT)
        assert "fence" in result, result
        assert time.monotonic() - released_at < 2.0


def test_a_schema_named_in_the_connection_string_reaches_the_heartbeat(empty_dsn: str) -> None:
    from pylease.migrate import migrate

    migrate(empty_dsn, "leases", say=lambda _line: None)
    url = psycopg.conninfo.make_conninfo(empty_dsn, options="-c search_path=leases")
    with psycopg.connect(url, autocommit=True) as mine, lease(mine, "sweep", ttl=0.6) as held:
        assert wait_until(lambda: held._ticket.renewals >= 2)
        held.check()


def test_a_body_that_closes_the_connection_is_released_through_the_leases_own(
    dsn: str, conn2: Conn
) -> None:
    with psycopg.connect(dsn, autocommit=True) as mine, lease(mine, "sweep", ttl=5):
        mine.close()
    assert claim(conn2, "sweep") is not None
