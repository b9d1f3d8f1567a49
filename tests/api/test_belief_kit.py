"""The kit of the belief tests must be able to fail: the witness, the fork, the fault
proxy and the fake clock of tests/support, tried on their own (the tests that use
them are in test_belief_async.py, test_belief.py and test_belief_processes.py)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pylease import LeaseLost
from tests.support import faultkit
from tests.support.faultkit import BLACKHOLE, DROP, Fork, proxy
from tests.support.safety_kit import Db
from tests.support.witness import Witness

BOUND = 30.0


@pytest.fixture
def w(tmp_path: Path) -> Witness:
    return Witness(tmp_path / "witness.jsonl")


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
