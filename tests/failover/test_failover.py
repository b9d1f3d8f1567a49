"""What pylease promises across a failover: a primary crashes and its standby is promoted.

Every test gets its own primary and standby (tests/support/replication.py), in one of the
modes the promises depend on: synchronous replication, where an acknowledged grant
survives the failover, and asynchronous replication, where grants in the lag are
lost and only timeline-floored fences keep a fence from being issued twice.
No test measures speed; waits are "eventually", with generous bounds.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner, Result

from pylease import DatabaseUnavailable, LeaseLost, ReadOnlyServer, alease, lease
from pylease.cli import app
from pylease.postgres import PostgresBackend
from tests.support.replication import BOUND, Pair, Template, wait_until

# One worker runs the module (make test's parallel workers): the template is built once.
pytestmark = pytest.mark.xdist_group("failover")

HOUR = timedelta(hours=1)
# Longer than a failover takes here (well under a second, seconds on a loaded machine),
# so a keeper that reconnects in time keeps its lease.
KEEPER_TTL = timedelta(seconds=12)
NO_DSN: dict[str, str | None] = {"PYLEASE_DSN": None, "DATABASE_URL": None}


@pytest.fixture(scope="session")
def failover_template() -> Iterator[Template]:
    template = Template()
    try:
        template.build()
        yield template
    finally:
        template.remove()


@pytest.fixture
def sync_pair(failover_template: Template) -> Iterator[Pair]:
    with failover_template.pair("sync") as pair:
        yield pair


@pytest.fixture
def async_pair(failover_template: Template) -> Iterator[Pair]:
    with failover_template.pair("async") as pair:
        yield pair


def backend(url: str) -> tuple[psycopg.Connection[Any], PostgresBackend]:
    conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
    return conn, PostgresBackend(conn)


def rows_by_name(url: str) -> dict[str, tuple[str, int]]:
    conn, pg = backend(url)
    with conn:
        return {row.name: (row.holder, row.fence) for row in pg.status()}


def server_now(url: str) -> datetime:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        now: datetime = row[0]
        return now


def renewed_since(url: str, name: str, moment: datetime) -> bool:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(
            "SELECT renewed_at > %s FROM lease_status(%s)", (moment, name)
        ).fetchone()
        return bool(row and row[0])


def say(line: str) -> None:
    # Measurements for docs/high-availability.md: shown with -s, harmless otherwise.
    print(f"failover: {line}", file=sys.stderr)


# Synchronous replication ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "remote_apply"])
def test_sync_grants_survive_with_their_fences(failover_template: Template, mode: str) -> None:
    with failover_template.pair(mode) as pair:
        conn, pg = backend(pair.primary.url)
        with conn:
            granted: dict[str, tuple[str, int]] = {}
            for i in range(20):
                fence = pg.claim(f"job-{i}", HOUR, "old")
                assert fence is not None
                granted[f"job-{i}"] = ("old", fence)
            for i in range(0, 20, 4):  # a second tenure for some, so fences differ
                fence = pg.steal(f"job-{i}", HOUR, "thief")
                assert fence is not None
                granted[f"job-{i}"] = ("thief", fence)
        took = pair.failover()
        say(f"{mode}: crash + promotion took {took:.2f}s")

        assert rows_by_name(pair.standby.url) == granted
        conn, pg = backend(pair.standby.url)
        with conn:
            for name, (_holder, fence) in granted.items():
                assert pg.claim(name, HOUR, "newcomer") is None, name  # still busy
                new = pg.steal(name, HOUR, "newcomer")
                assert new is not None and new > fence, (name, fence, new)


def test_keeper_on_a_multi_host_dsn_keeps_its_lease_through_a_failover(sync_pair: Pair) -> None:
    lost: list[LeaseLost] = []
    with lease(sync_pair.dsn, "keeper", KEEPER_TTL, on_lost=lost.append) as held:
        fence = held.fence
        assert rows_by_name(sync_pair.primary.url)["keeper"] == (held.holder, fence)
        took = sync_pair.failover()
        promoted_at = server_now(sync_pair.standby.url)
        # Eventually: a renewal reaches the new primary through the second host.
        wait_until(
            lambda: renewed_since(sync_pair.standby.url, "keeper", promoted_at),
            timeout=BOUND,
            what="the keeper to renew on the new primary",
        )
        assert not held.lost, held
        held.check()
        assert lost == []
        assert held.fence == fence
        say(f"sync keeper: crash + promotion took {took:.2f}s, the lease was kept")
    assert rows_by_name(sync_pair.standby.url)["keeper"][1] == fence


async def test_async_keeper_on_a_multi_host_dsn_keeps_its_lease_through_a_failover(
    sync_pair: Pair,
) -> None:
    lost: list[LeaseLost] = []
    async with alease(sync_pair.dsn, "keeper", KEEPER_TTL, on_lost=lost.append) as held:
        fence = held.fence
        # The pair's own calls block: run them off the loop, so the keeper task runs.
        await asyncio.to_thread(sync_pair.failover)
        promoted_at = await asyncio.to_thread(server_now, sync_pair.standby.url)
        await asyncio.to_thread(
            wait_until,
            lambda: renewed_since(sync_pair.standby.url, "keeper", promoted_at),
            BOUND,
            "the async keeper to renew on the new primary",
        )
        assert not held.lost, held
        held.check()
        assert lost == []
    assert rows_by_name(sync_pair.standby.url)["keeper"][1] == fence


def test_a_renewal_that_meets_a_standby_is_retried_until_it_meets_the_primary(
    sync_pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    # No target_session_attrs: after the crash the keeper reconnects to the standby
    # while it is still one, as a client of a failover that is not over yet would.
    dsn = sync_pair.dsn.replace("target_session_attrs=read-write", "target_session_attrs=any")
    lost: list[LeaseLost] = []
    with lease(dsn, "keeper", KEEPER_TTL, on_lost=lost.append) as held:
        sync_pair.crash_primary()
        wait_until(
            lambda: "target_session_attrs=read-write" in caplog.text,
            what="a renewal to meet the standby and fail with ReadOnlyServer",
        )
        sync_pair.promote()
        promoted_at = server_now(sync_pair.standby.url)
        wait_until(
            lambda: renewed_since(sync_pair.standby.url, "keeper", promoted_at),
            what="the keeper to renew once the standby was promoted",
        )
        assert not held.lost, held
        assert lost == []
        held.check()


def test_a_lost_release_frees_the_lease_by_expiry_with_a_higher_fence(sync_pair: Pair) -> None:
    conn, pg = backend(sync_pair.primary.url)
    with conn:
        fence = pg.claim("job", timedelta(seconds=3), "first")
        assert fence is not None
        # The commit waited for the standby's flush, not its replay.
        wait_until(sync_pair.caught_up, what="the standby to replay the claim")
        # A release does not wait for the standby (losing it is harmless): with the
        # walreceiver cut it commits on the primary alone, and the failover drops it.
        sync_pair.cut()
        assert pg.release("job", "first") is True
    sync_pair.failover()

    assert rows_by_name(sync_pair.standby.url)["job"] == ("first", fence)  # the release: lost
    with lease(sync_pair.dsn, "job", timedelta(seconds=30), wait=BOUND) as held:
        assert held.fence > fence


def test_a_waiter_on_a_multi_host_dsn_rides_out_a_failover(sync_pair: Pair) -> None:
    conn, pg = backend(sync_pair.primary.url)
    with conn:
        fence = pg.claim("job", timedelta(seconds=3), "gone")  # a holder that died
        assert fence is not None
    got: list[Any] = []

    def wait() -> None:
        try:
            with lease(sync_pair.dsn, "job", 30, wait=BOUND, poll_interval=0.1) as held:
                got.append(held.fence)
        except Exception as exc:
            got.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    wait_until(
        lambda: sync_pair.primary.query(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'pylease-listen'"
        ),
        what="the waiter to listen",
    )
    sync_pair.crash_primary()
    # No primary for a moment, as while a failover is detected: the waiter tries meanwhile.
    time.sleep(1.0)
    sync_pair.promote()
    waiter.join(BOUND)
    assert not waiter.is_alive()
    if isinstance(got[0], Exception):
        raise got[0]
    assert got[0] > fence


# The cancelled wait: the one hole of synchronous replication ------------------------


def _cancel_during_sync_wait(
    pair: Pair, statement: Any, how: str = "pg_cancel_backend"
) -> tuple[Any, list[Any]]:
    """Run ``statement(conn)`` on the primary with the walreceiver cut, cancel its
    commit's wait for the standby, and return what it returned (or raised) and the
    notices the server sent."""
    conn = psycopg.connect(pair.primary.url, autocommit=True)
    notices: list[Any] = []
    # A Diagnostic is only readable inside the handler: its result is freed after it.
    conn.add_notice_handler(
        lambda d: notices.append(
            (d.severity_nonlocalized, d.sqlstate, d.message_primary, d.message_detail)
        )
    )
    pid = conn.info.backend_pid
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(statement(conn))
        except Exception as exc:
            outcome.append(exc)

    pair.cut()
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        wait_until(
            lambda: pair.primary.query(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'",
                (pid,),
            ),
            what="the commit to wait for the standby",
        )
        pair.primary.query(f"SELECT {how}(%s)", (pid,))
        worker.join(BOUND)
        assert not worker.is_alive()
    finally:
        conn.close()
    return outcome[0], notices


def test_a_cancelled_sync_wait_reports_success_with_a_warning_and_the_grant_is_lost(
    sync_pair: Pair,
) -> None:
    fence, notices = _cancel_during_sync_wait(
        sync_pair,
        lambda conn: conn.execute("SELECT lease_claim('hole', '1 hour', 'first')").fetchone()[0],
    )
    # PostgreSQL's answer to the cancel: the grant, committed on the primary alone.
    assert fence == 1
    warnings = [n for n in notices if n[0] == "WARNING"]
    assert len(warnings) == 1, notices
    _severity, sqlstate, message, detail = warnings[0]
    say(f"cancelled wait: WARNING {sqlstate} {message} / {detail}")
    assert "synchronous replication" in message

    sync_pair.failover()
    assert "hole" not in rows_by_name(sync_pair.standby.url)  # acknowledged, and lost
    conn, pg = backend(sync_pair.standby.url)
    with conn:
        again = pg.claim("hole", HOUR, "second")
    assert again is not None  # granted to a second holder while the first believes it holds
    say(f"cancelled wait: fence {fence} acknowledged, lost; the next holder got fence {again}")


@pytest.mark.parametrize("op", ["renew", "renew_many", "renew_each", "claim", "steal"])
def test_a_cancelled_sync_wait_is_a_failed_write_in_pylease(sync_pair: Pair, op: str) -> None:
    conn, pg = backend(sync_pair.primary.url)
    with conn:
        assert pg.claim("job", HOUR, "first") is not None
    calls = {
        "renew": lambda b: b.renew("job", "first", HOUR),
        "renew_many": lambda b: b.renew_many(["job"], ["first"], HOUR),
        "renew_each": lambda b: b.renew_each(["job"], ["first"], [HOUR]),
        "claim": lambda b: b.claim("job", HOUR, "first"),
        "steal": lambda b: b.steal("job", HOUR, "second"),
    }
    result, _notices = _cancel_during_sync_wait(
        sync_pair, lambda conn: calls[op](PostgresBackend(conn))
    )
    # Never success: the keeper retries a renewal that raises, until the lease's deadline.
    assert isinstance(result, DatabaseUnavailable), result
    assert "synchronous" in str(result)


def test_a_terminated_sync_wait_is_an_error_not_a_success(sync_pair: Pair) -> None:
    result, _notices = _cancel_during_sync_wait(
        sync_pair,
        lambda conn: PostgresBackend(conn).claim("job", HOUR, "first"),
        how="pg_terminate_backend",
    )
    assert isinstance(result, DatabaseUnavailable), result


# Asynchronous replication -------------------------------------------------------------


def _grants_in_the_lag(pair: Pair, names: list[str]) -> tuple[list[int], dict[str, Any]]:
    """Claim every name, cut the walreceiver, then hand each name on three times and
    claim as many new names: every fence the primary acknowledged, and the last grant
    of each name."""
    issued: list[int] = []
    last: dict[str, Any] = {}
    conn, pg = backend(pair.primary.url)
    with conn:
        for name in names:
            fence = pg.claim(name, HOUR, "old-0")
            assert fence is not None
            issued.append(fence)
        wait_until(pair.caught_up, what="the standby to catch up")
        pair.cut()
        for tenure in range(1, 4):
            for name in names:
                fence = pg.steal(name, HOUR, f"old-{tenure}")
                assert fence is not None
                issued.append(fence)
                last[name] = (f"old-{tenure}", fence)
        for name in names:
            fence = pg.claim(f"{name}-lag", HOUR, "old-lag")
            assert fence is not None
            issued.append(fence)
            last[f"{name}-lag"] = ("old-lag", fence)
    return issued, last


def test_async_no_fence_is_issued_twice_after_a_failover(async_pair: Pair) -> None:
    names = [f"name-{i:02d}" for i in range(40)]
    issued, last = _grants_in_the_lag(async_pair, names)
    took = async_pair.failover()

    survived = rows_by_name(async_pair.standby.url)
    lost = [n for n, grant in last.items() if survived.get(n) != grant]
    say(f"async: {len(lost)} of {len(last)} last grants in the lag lost "
        f"({len(issued)} grants acknowledged in all), failover {took:.2f}s, "
        f"timeline {async_pair.standby.timeline()}")  # fmt: skip
    assert lost  # the lag was real: the test would prove nothing otherwise

    conn, pg = backend(async_pair.standby.url)
    with conn:
        new = [pg.steal(n, HOUR, "new") for n in names]
        new += [pg.claim(f"{n}-lag", HOUR, "new") for n in names]
        new += [pg.claim(f"{n}-fresh", HOUR, "new") for n in names]
    assert None not in new
    assert min(f for f in new if f is not None) > max(issued)


def test_async_failover_tells_the_old_holder_it_lost(async_pair: Pair) -> None:
    async_pair.cut()  # the grant below never reaches the standby
    lost: list[LeaseLost] = []
    # Leaving a block whose lease was lost raises: the work ran unprotected.
    with (
        pytest.raises(LeaseLost),
        lease(async_pair.dsn, "keeper", KEEPER_TTL, on_lost=lost.append) as held,
    ):
        assert "keeper" in rows_by_name(async_pair.primary.url)
        async_pair.failover()
        # The new primary has no row for it: its first renewal there says so.
        wait_until(lambda: held.lost, what="the keeper to report the lease lost")
        with pytest.raises(LeaseLost):
            held.check()
        # on_lost runs after the loss is visible to the block, on a thread of its own.
        wait_until(lambda: lost, what="on_lost to be called")
        assert len(lost) == 1 and "no longer ours" in lost[0].reason, lost
    assert "keeper" not in rows_by_name(async_pair.standby.url)


# A standby refuses ---------------------------------------------------------------------


def _primary_grant(pair: Pair) -> None:
    conn, pg = backend(pair.primary.url)
    with conn:
        assert pg.claim("held", HOUR, "owner") == 1
    wait_until(pair.caught_up, what="the standby to catch up")


def test_a_standby_refuses_writes_with_a_clear_error(sync_pair: Pair) -> None:
    _primary_grant(sync_pair)
    conn, pg = backend(sync_pair.standby.url)
    with conn:
        for call in (
            lambda: pg.claim("fresh", HOUR, "someone"),
            lambda: pg.renew("held", "owner", HOUR),
            lambda: pg.renew_many(["held"], ["owner"], HOUR),
            lambda: pg.steal("held", HOUR, "someone"),
            lambda: pg.release("held", "owner"),
        ):
            with pytest.raises(ReadOnlyServer, match="target_session_attrs=read-write") as err:
                call()
            assert isinstance(err.value, DatabaseUnavailable)
            assert isinstance(err.value.__cause__, psycopg.Error)
        assert rows_by_name(sync_pair.standby.url)["held"] == ("owner", 1)


def test_a_standby_refuses_a_busy_claim_too(sync_pair: Pair) -> None:
    # A busy claim writes nothing, so only the SQL's own check can refuse it there.
    _primary_grant(sync_pair)
    conn, pg = backend(sync_pair.standby.url)
    with conn, pytest.raises(ReadOnlyServer, match="target_session_attrs=read-write"):
        pg.claim("held", HOUR, "someone")


# The command line ---------------------------------------------------------------------

runner = CliRunner()


def cli(*args: str) -> Result:
    return runner.invoke(app, list(args), env=dict(NO_DSN))


def test_cli_takes_multi_host_strings_across_a_failover(sync_pair: Pair, tmp_path: Path) -> None:
    url, kv = sync_pair.multihost_url, sync_pair.dsn
    done = cli("claim", "job", "--ttl", "10m", "--holder", "h1", "--dsn", kv)
    assert done.exit_code == 0, done.output
    marker = tmp_path / "ran"
    done = cli("run", "work", "--ttl", "1m", "--dsn", url, "--",
               sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ok')")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert marker.read_text() == "ok"

    sync_pair.failover()
    for dsn in (url, kv):
        done = cli("status", "--json", "--dsn", dsn)
        assert done.exit_code == 0, done.output
        assert '"h1"' in done.output and '"job"' in done.output
    done = cli("claim", "job", "--ttl", "10m", "--holder", "h2", "--dsn", url)
    assert done.exit_code == 1, done.output  # busy on the new primary: the grant survived


def test_cli_on_a_standby_exits_3_saying_to_connect_to_the_primary(sync_pair: Pair) -> None:
    done = cli("claim", "fresh", "--ttl", "1m", "--dsn", sync_pair.standby.url)
    assert done.exit_code == 3, done.output
    assert "target_session_attrs=read-write" in done.output
    assert len(done.output.strip().splitlines()) == 1, done.output


def test_the_kit_leaves_no_server_behind(failover_template: Template) -> None:
    with failover_template.pair("async") as pair:
        nodes = (pair.primary, pair.standby)
        assert all(node.answers() for node in nodes)
        base = pair.base
    assert not base.exists()
    assert not any(node.answers() for node in nodes)
