"""What a holder may believe (CONTRACT section 2), tried from outside, sync API.

One test per defect of issue 10, each reproducing it as the issue tells it. The
belief witness (tests/support/witness.py) records, on the machine's one monotonic clock,
every grant to a contender and every belief the holder sampled (``held.lost`` and
``held.check()``); a test fails on any belief of the first holder stamped after
a grant to another. No test asserts a duration: the order of events is the
assertion, and the few liveness bounds are generous.

A defect whose fix is still pending is marked ``xfail(strict=True)``: the test
fails today, as it must, and the mark comes off with the fix.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import InvalidArgument, LeaseLost, PyleaseError, errors, keep_fresh, lease
from tests.support import faultkit
from tests.support.faultkit import BLACKHOLE, DELAY, DROP, Fork, proxy
from tests.support.safety_kit import KINDS, Contender, Db, keep_sampling, make_db
from tests.support.witness import Witness

BOUND = 30.0
MAX_FENCE = 2**63 - 1


@pytest.fixture
def w(tmp_path: Path) -> Witness:
    return Witness(tmp_path / "witness.jsonl")


@pytest.fixture(params=KINDS)
def db(
    request: pytest.FixtureRequest, fresh_db: Any, pg_template: str, tmp_path: Path
) -> Iterator[Db]:
    with make_db(request.param, lambda: fresh_db(pg_template), tmp_path) as made:
        yield made


@pytest.fixture
def pg(fresh_db: Any, pg_template: str, tmp_path: Path) -> Iterator[Db]:
    with make_db("postgres", lambda: fresh_db(pg_template), tmp_path) as made:
        yield made


def pending(defect: int, what: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"defect {defect}: {what}")


def leave(cm: Any) -> BaseException | None:
    """Leave a lease block with no exception of the body; what the exit raised."""
    try:
        cm.__exit__(None, None, None)
    except BaseException as exc:
        return exc
    return None


# 1. A shortened ttl ---------------------------------------------------------------


# The owner renews every 1 s; past its claim's 3 s, a renewal with the row's 0.5 s
# ttl would leave the server's expiry 0.5 s short of each next renewal, so a contender
# trying until two renewals past the claim's ttl would be granted the lease.
OWNER_TTL = 3.0
SHORT_TTL = 0.5
TRIED_FOR = OWNER_TTL + 2 * OWNER_TTL / 3


def shorten_with_keep_fresh(url: str, held: Any) -> None:
    """A helper keeps the owner's lease fresh with a shorter ttl, and stops at once.

    Its entry renewal puts its ttl in force. A helper whose own 0.5 s ran out before
    its exit (a loaded machine) says so with LeaseLost, as it must: its business,
    not the owner's, whose lease is what this test tries.
    """
    helper = keep_fresh(url, "kf", held.holder, ttl=SHORT_TTL)
    helper.__enter__()  # raises if the owner's lease were not held
    ended = leave(helper)
    assert ended is None or isinstance(ended, LeaseLost), ended


@pytest.mark.parametrize("via", ["keep_fresh", "lease_renew"])
def test_1_an_owner_sees_a_ttl_shortened_by_another_renewer(db: Db, w: Witness, via: str) -> None:
    claimed = time.monotonic()
    cm = lease(db.url, "kf", ttl=OWNER_TTL)
    held = cm.__enter__()
    try:
        w.sample(held)
        if via == "keep_fresh":
            shorten_with_keep_fresh(db.url, held)
        else:
            assert db.backend().renew("kf", held.holder, timedelta(seconds=SHORT_TTL))
        shortened = db.row("kf")
        # The owner's next renewal puts its own ttl back in force.
        faultkit.wait_until(
            lambda: db.row("kf").renewed_at > shortened.renewed_at, what="the owner's renewal"
        )
        assert db.row("kf").ttl == timedelta(seconds=OWNER_TTL), db.row("kf")
        with Contender(w, db.backend(), "kf") as contender:
            left = claimed + TRIED_FOR - time.monotonic()
            # At least two renewals' time, however late a loaded machine got here.
            keep_sampling(w, held, contender.granted.is_set, bound=max(left, 2 * OWNER_TTL / 3))
    finally:
        leave(cm)
    w.assert_sound()
    assert not contender.granted.is_set(), w.story()


# 2. Fork --------------------------------------------------------------------------


def test_2_a_forked_child_leaving_the_block_releases_nothing(db: Db, w: Witness) -> None:
    fork = Fork()
    with fork.guard(), lease(db.url, "fork", ttl=3) as held:
        if fork.fork():
            sys.exit(0)  # the child leaves the parent's block
        result = fork.wait(15)
        with Contender(w, db.backend(), "fork") as contender:
            keep_sampling(w, held, contender.granted.is_set, bound=1.5)
        w.assert_sound()
        assert result.escaped == "SystemExit" and result.status == 0, result.output
        assert db.holder_of("fork") == held.holder, w.story()
        held.check()


def renewal_in_flight() -> bool:
    return any(t.name.startswith("pylease-renew") for t in threading.enumerate())


def test_2_a_child_forked_during_a_renewal_leaves_without_deadlock(
    pg: Db, w: Witness, own_keeper: Any
) -> None:
    with proxy(pg.dsn or "") as p:
        fork = Fork()
        with fork.guard(), lease(p.dsn, "forklock", ttl=3) as held:
            # Every renewal now takes longer than the renewal interval to come back: one
            # is in flight, holding the renewal connection's lock, when the fork happens.
            p.set(DELAY, delay=0.6)
            faultkit.wait_until(renewal_in_flight, what="a renewal in flight")
            if fork.fork():
                raise ValueError("the child's own error")
            result = fork.wait(timeout=15)
            p.set(faultkit.FORWARD, delay=0.0)
            assert result.escaped == "ValueError", result.output
            assert pg.holder_of("forklock") == held.holder
            held.check()


# 3. pylease run --------------------------------------------------------------------

IGNORES_SIGTERM = """
import os, signal, sys, time
from tests.support.witness import Witness
signal.signal(signal.SIGTERM, signal.SIG_IGN)
w = Witness(sys.argv[1])
while True:
    w.acting(os.environ["PYLEASE_NAME"], os.environ["PYLEASE_HOLDER"])
    time.sleep(0.01)
"""


def test_3_pylease_run_kills_the_command_by_the_local_expiry(pg: Db, w: Witness) -> None:
    with proxy(pg.dsn or "") as p:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pylease",
                "run",
                "cmdlease",
                "--ttl",
                "3s",
                "--kill-after",
                "5s",
                "--dsn",
                p.dsn,
                "--",
                sys.executable,
                "-c",
                IGNORES_SIGTERM,
                str(w.path),
            ],
            cwd=faultkit.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            faultkit.wait_until(
                lambda: any(e.kind == "belief" for e in w.events()), what="the command to start"
            )
            p.set(BLACKHOLE)  # the network stops answering; TCP stays up
            with Contender(w, pg.backend(), "cmdlease") as contender:
                assert contender.granted.wait(BOUND), w.story()
                # Long enough for a command still running to show in the record.
                time.sleep(1.0)
            w.assert_sound()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            run.wait(BOUND)
            for pid in {e.pid for e in w.events() if e.kind == "belief"}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_3_pylease_run_help_says_sigkill_comes_by_the_expiry() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pylease", "run", "--help"],
        cwd=faultkit.ROOT,
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"},
    )
    text = " ".join(out.stdout.split())
    assert "SIGKILL" in text and "expiry" in text, text


# 4. A renewal in the caller's transaction -------------------------------------------


def test_4_the_lease_connection_as_heartbeat_target_is_refused(pg: Db) -> None:
    conn = psycopg.connect(pg.dsn or "")
    try:
        conn.execute("CREATE TABLE work (x int)")
        conn.commit()
        conn.execute("INSERT INTO work VALUES (1)")  # the caller's open transaction
        with (
            contextlib.suppress(LeaseLost),
            pytest.raises(InvalidArgument),
            lease(conn, "hb", ttl=1.5, heartbeat_target=conn),
        ):
            time.sleep(1.2)  # a few renewals' time
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM work").fetchone() == (0,)
    finally:
        conn.close()


def test_4_no_renewal_runs_on_a_heartbeat_connection_that_is_not_idle(pg: Db) -> None:
    own = psycopg.connect(pg.dsn or "", autocommit=True)
    dedicated = psycopg.connect(pg.dsn or "")
    try:
        own.execute("CREATE TABLE work (x int)")
        with contextlib.suppress(LeaseLost), lease(own, "hb2", ttl=1.5, heartbeat_target=dedicated):
            # Somebody opens a transaction on the connection dedicated to renewals.
            dedicated.execute("INSERT INTO work VALUES (1)")
            time.sleep(1.2)
        dedicated.rollback()
        assert own.execute("SELECT count(*) FROM work").fetchone() == (0,)
    finally:
        own.close()
        dedicated.close()


# 5. A database that stops answering while TCP stays up -----------------------------


def test_5_leaving_the_block_is_bounded_when_the_database_stops_answering(
    pg: Db, w: Witness, own_keeper: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pylease")
    with proxy(pg.dsn or "") as p:
        cm = lease(p.dsn, "stuck", ttl=2)
        held = cm.__enter__()
        p.set(BLACKHOLE)
        with Contender(w, pg.backend(), "stuck") as contender:
            keep_sampling(w, held, lambda: held.lost and contender.granted.is_set(), bound=BOUND)
        assert held.lost, w.story()
        w.note("body-end", "stuck", held.holder)
        outcome: list[BaseException | None] = []
        exiting = threading.Thread(target=lambda: outcome.append(leave(cm)), daemon=True)
        exiting.start()
        # The contract allows 10 s; the bound here is a generous liveness bound.
        exiting.join(25)
        left = not exiting.is_alive()
        p.set(DROP)  # unblocks a hung exit, so the test ends either way
        exiting.join(BOUND)
    w.assert_sound()
    assert left, "leaving the block hung with the database silent"
    assert isinstance(outcome[0], LeaseLost), outcome
    assert p.cancels == 0, "a query cancel was sent"


# 6. A slow on_lost -----------------------------------------------------------------

# Longer than b's 2 s ttl by a renewal interval and more: had the callback held up
# the keeper, b would run out while it ran, and the contender would be granted b.
SLOW_ON_LOST = 3.5


def test_6_a_slow_on_lost_does_not_stall_other_leases(pg: Db, w: Witness, own_keeper: Any) -> None:
    slow_done = threading.Event()

    def slow(_error: LeaseLost) -> None:
        time.sleep(SLOW_ON_LOST)
        slow_done.set()

    with proxy(pg.dsn or "") as p:
        cm_a = lease(p.dsn, "a", ttl=2, on_lost=slow)
        a = cm_a.__enter__()
        try:
            with lease(pg.dsn or "", "b", ttl=2) as b:
                p.set(BLACKHOLE)
                with Contender(w, pg.backend(), "b") as contender:
                    keep_sampling(w, b, slow_done.is_set, bound=BOUND)
                w.assert_sound()
                assert a.lost
                assert not contender.granted.is_set(), w.story()
                assert not b.lost
        finally:
            p.set(DROP)
            leave(cm_a)


# 7. A fenced transaction ------------------------------------------------------------


def test_7_a_fenced_transaction_does_not_make_other_leases_lose(pg: Db, w: Witness) -> None:
    owner = psycopg.connect(pg.dsn or "", autocommit=True)
    fencer = psycopg.connect(pg.dsn or "")
    try:
        with lease(owner, "fen", ttl=2) as fen, lease(owner, "other", ttl=2) as other:
            fencer.execute(
                "SELECT lease_holds(%s, %s, %s)", ("fen", fen.holder, fen.fence)
            )  # the fenced transaction stays open
            with Contender(w, pg.backend(), "other") as contender:
                keep_sampling(w, other, lambda: False, bound=2.6)  # past other's ttl
            fencer.commit()
            w.assert_sound()
            assert not other.lost, "a fenced transaction on 'fen' made 'other' lose"
            assert not contender.granted.is_set()
    finally:
        fencer.close()
        owner.close()


# 8. An abandoned lease --------------------------------------------------------------


def test_8_an_abandoned_lease_stops_being_renewed(db: Db, w: Witness, own_keeper: Any) -> None:
    cm = lease(db.url, "abandoned", ttl=1.5)
    cm.__enter__()
    del cm
    gc.collect()
    with Contender(w, db.backend(), "abandoned") as contender:
        granted = contender.granted.wait(10)
    assert granted, "an abandoned lease was still renewed 10 s after it was collected"


# 9. Clock steps --------------------------------------------------------------------

# select() rather than time.sleep(): under libfaketime 0.9.10, the clock_nanosleep with
# an absolute CLOCK_MONOTONIC deadline that time.sleep() uses fails with EINVAL once
# the wall clock was stepped.
HOLD_AND_REPORT = """
import select, sys
from pylease import lease
from tests.support.witness import Witness
url, name, ttl, path = sys.argv[1:5]
w = Witness(path)
with lease(url, name, ttl=float(ttl)) as held:
    w.note("held", name, held.holder)
    while w.sample(held):
        select.select([], [], [], 0.02)
    w.note("detected", name, held.holder, reason=str(held._ticket.error()))
    select.select([], [], [], 3600)
"""


def detected(w: Witness) -> bool:
    return any(e.kind == "note" and e.fields.get("what") == "detected" for e in w.events())


def noted(w: Witness, what: str) -> bool:
    return any(e.kind == "note" and e.fields.get("what") == what for e in w.events())


def test_9_sqlite_a_holder_whose_clock_steps_forward_learns_it_lost(
    tmp_path: Path, w: Witness
) -> None:
    from pylease.sqlite import connect

    path = tmp_path / "clock.sqlite3"
    connect(path).close()
    with faultkit.fake_clock(0) as clock:
        holder = faultkit.python_under(
            clock, HOLD_AND_REPORT, f"sqlite:///{path}", "clk", "1.5", str(w.path)
        )
        try:
            faultkit.wait_until(lambda: noted(w, "held"), what="the holder to hold")
            time.sleep(1.0)  # a renewal or two on the true clock
            clock.step_to(120)
            w.note("stepped", "clk")
            faultkit.wait_until(
                lambda: detected(w), timeout=10, what="the holder to report the step as a loss"
            )
        finally:
            holder.kill()
            holder.wait(BOUND)


def test_9_sqlite_a_contender_whose_clock_runs_ahead_is_reported_at_the_next_renewal(
    tmp_path: Path, w: Witness
) -> None:
    from pylease.sqlite import connect

    path = tmp_path / "ahead.sqlite3"
    connect(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_REPORT, f"sqlite:///{path}", "ahead", "3", str(w.path)],
        cwd=faultkit.ROOT,
    )
    try:
        faultkit.wait_until(lambda: noted(w, "held"), what="the holder to hold")
        with faultkit.fake_clock(120) as clock:
            grab = (
                "import sys; from datetime import timedelta\n"
                "from pylease.sqlite import SqliteBackend, connect\n"
                "from tests.support.witness import Witness\n"
                "backend = SqliteBackend(connect(sys.argv[1]))\n"
                "fence = backend.claim('ahead', timedelta(seconds=60), 'early')\n"
                "assert fence is not None, 'the contender ahead was not granted the lease'\n"
                "Witness(sys.argv[2]).grant('ahead', 'early', fence)\n"
            )
            contender = faultkit.python_under(clock, grab, str(path), str(w.path))
            assert contender.wait(BOUND) == 0
        # Outside the clock assumption the grant cannot be prevented, only reported.
        faultkit.wait_until(lambda: detected(w), timeout=10, what="the next renewal to report it")
        grant = w.grants("ahead")[0]
        found = next(e for e in w.events() if e.fields.get("what") == "detected")
        assert found.t > grant.t
    finally:
        holder.kill()
        holder.wait(BOUND)


def server_ahead(dsn: str) -> float:
    """How far the server's clock is ahead of ours, in seconds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
    assert row is not None
    return float(row[0]) - time.time()


def test_9_postgres_a_server_clock_step_is_reported_at_the_next_renewal(
    tmp_path: Path, w: Witness
) -> None:
    from pylease.migrate import migrate

    with faultkit.fake_clock(0) as clock, faultkit.server(env=clock.env()) as srv:
        migrate(srv.dsn, say=lambda _line: None)
        cm = lease(srv.dsn, "srvclk", ttl=1.5)
        held = cm.__enter__()
        try:
            time.sleep(1.0)
            assert w.sample(held)
            clock.step_to(120)
            w.note("stepped", "srvclk")
            faultkit.wait_until(lambda: server_ahead(srv.dsn) > 100, what="the server's step")
            # libfaketime rereads its file within a second; the next renewals follow.
            keep_sampling(w, held, lambda: held.lost, bound=10)
            assert held.lost, "a server clock 120 s ahead went unnoticed:\n" + w.story()
        finally:
            leave(cm)


# 10. One holder, two claims ----------------------------------------------------------


def test_10_the_same_explicit_holder_twice_in_one_process_is_refused(db: Db, w: Witness) -> None:
    first_cm = lease(db.url, "dup", ttl=3, holder="worker-1")
    first_cm.__enter__()
    second: list[Any] = []
    errors_: list[BaseException] = []

    def claim_again() -> None:
        try:
            cm = lease(db.url, "dup", ttl=3, holder="worker-1")
            second.append((cm, cm.__enter__()))
        except BaseException as exc:
            errors_.append(exc)

    thread = threading.Thread(target=claim_again)
    thread.start()
    thread.join(BOUND)
    try:
        if second:
            # Today both are inside with fence 1; the first to leave releases it.
            leave(first_cm)
            with Contender(w, db.backend(), "dup") as contender:
                keep_sampling(w, second[0][1], contender.granted.is_set, bound=3)
            leave(second[0][0])
            w.assert_sound()
        assert errors_ and isinstance(errors_[0], InvalidArgument), errors_
    finally:
        leave(first_cm)


def test_10_keep_fresh_of_a_live_lease_is_fine(db: Db) -> None:
    with lease(db.url, "kept", ttl=3) as held, keep_fresh(db.url, "kept", held.holder):
        held.check()


def test_10_different_names_may_share_a_holder(db: Db) -> None:
    with lease(db.url, "n1", ttl=3, holder="h"), lease(db.url, "n2", ttl=3, holder="h") as h2:
        h2.check()


# 11. Fence exhaustion ------------------------------------------------------------------


def exhaust(db: Db, name: str) -> None:
    """A lease whose fence is at 2^63-1, expired, held by somebody gone."""
    backend = db.backend()
    assert backend.claim(name, timedelta(seconds=1), "old") is not None
    if db.kind == "postgres":
        backend.conn.execute(
            "UPDATE pylease_leases SET fence = %s, expires_at = now() - interval '1 min'"
            " WHERE name = %s",
            (MAX_FENCE, name),
        )
    else:
        backend.conn.execute(
            "UPDATE pylease_leases SET fence = ?, expires_at = expires_at - 60 WHERE name = ?",
            (MAX_FENCE, name),
        )


def test_11_a_claim_at_the_last_fence_raises_fence_exhausted(db: Db) -> None:
    exhaust(db, "fx")
    fence_exhausted = getattr(errors, "FenceExhausted", None)
    assert fence_exhausted is not None, "pylease.errors has no FenceExhausted"
    assert issubclass(fence_exhausted, PyleaseError)
    with pytest.raises(fence_exhausted, match="fx"):
        lease(db.url, "fx", ttl=5).__enter__()
    rows = db.backend().status("fx")
    assert [(r.holder, r.fence) for r in rows] == [("old", MAX_FENCE)]


def test_11_sql_lease_claim_at_the_last_fence_raises_54000(pg: Db) -> None:
    exhaust(pg, "fx")
    with psycopg.connect(pg.dsn or "", autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT lease_claim('fx', '5s', 'new')")
        assert caught.value.sqlstate == "54000", caught.value
        assert "fx" in (caught.value.diag.message_primary or "")


# Helpers' own tests: the kit must be able to fail --------------------------------------


def test_the_witness_catches_a_belief_after_a_grant(w: Witness) -> None:
    class Believer:
        name, holder, lost = "x", "a", False

        def check(self) -> None:
            pass

    w.sample(Believer())
    w.grant("x", "b", 2)
    w.sample(Believer())
    with pytest.raises(AssertionError):
        w.assert_sound()


def test_the_witness_accepts_a_loss_known_before_the_grant(w: Witness) -> None:
    class Knows:
        name, holder, lost = "x", "a", True

        def check(self) -> None:
            raise LeaseLost("x")

    w.acting("x", "a")
    w.sample(Knows())
    w.grant("x", "b", 2)
    w.sample(Knows())
    w.assert_sound()


def test_a_forked_child_can_write_to_the_witness(w: Witness) -> None:
    fork = Fork()
    with fork.guard():
        if fork.fork():
            w.grant("x", "child", 1)
            sys.exit(3)
    result = fork.wait()
    assert (result.status, result.escaped) == (3, "SystemExit")
    assert [e.holder for e in w.grants()] == ["child"]


def test_the_proxy_forwards_then_blackholes_then_drops(pg: Db) -> None:
    with proxy(pg.dsn or "") as p:
        conn = psycopg.connect(p.dsn, autocommit=True)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        p.set(BLACKHOLE)
        answered = threading.Event()

        def ask() -> None:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT 2")
                answered.set()

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        asker.join(1.0)
        assert asker.is_alive() and not answered.is_set()  # TCP up, nothing answers
        p.set(DROP)
        asker.join(BOUND)
        assert not answered.is_set()
        assert conn.broken or conn.closed
        assert p.cancels == 0


def test_the_fake_clock_steps_a_child_wall_clock_but_not_its_monotonic_clock() -> None:
    probe = "import time; print(time.time(), time.monotonic(), flush=True)"
    with faultkit.fake_clock(0) as clock:
        first = faultkit.python_under(clock, probe, stdout=subprocess.PIPE)
        out1, _ = first.communicate(timeout=BOUND)
        clock.step_to(3600)
        time.sleep(1.1)  # FAKETIME_CACHE_DURATION
        second = faultkit.python_under(clock, probe, stdout=subprocess.PIPE)
        out2, _ = second.communicate(timeout=BOUND)
    wall1, mono1 = map(float, out1.split())
    wall2, mono2 = map(float, out2.split())
    assert wall2 - wall1 > 3000
    assert 0 < mono2 - mono1 < 600
