"""What a holder may believe (CONTRACT section 2) when other processes are involved.

The sync-only tests of issue 10's defects (the rest, written once for both APIs, are
in test_belief_async.py and the test_belief.py generated from it): a child forked
while the keeper's thread has a renewal in flight, and the command ``pylease run``
runs, killed by the local expiry. The belief witness (tests/support/witness.py) is
the record, as there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pylease import lease
from tests.support import faultkit
from tests.support.faultkit import BLACKHOLE, DELAY, Fork, proxy
from tests.support.safety_kit import Contender, Db
from tests.support.witness import Witness

BOUND = 30.0


@pytest.fixture
def w(tmp_path: Path) -> Witness:
    return Witness(tmp_path / "witness.jsonl")


# 2. Fork --------------------------------------------------------------------------


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
