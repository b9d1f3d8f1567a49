"""Candidates in processes of their own, and a witness of what each believed.

Each candidate runs ``run_as_leader`` (or ``arun_as_leader``) in its main thread. While
it leads, its work samples ``term.lost`` every few milliseconds and appends one line per
sample to a shared file: its pid, the term's fence, and a CLOCK_MONOTONIC reading
taken *before* the sample (so at that moment it did believe it led). CLOCK_MONOTONIC
is one clock for every process of the host, so the witness can put every belief on
one time line and check that no two terms ever overlap.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

CANDIDATE = r"""
import asyncio, os, sys, time
from pylease import arun_as_leader, current_leader, run_as_leader

dsn, name, ttl, witness, control, mode = sys.argv[1:7]
pid = os.getpid()
resign = os.path.join(control, f"resign-{pid}")
asked = []

def note(line):
    with open(witness, "a") as f:
        f.write(line + "\n")

def believes(term):
    at = time.monotonic()
    if term.lost:
        return False
    note(f"{pid} {term.fence} {at!r}")
    return True

def told_to_resign():
    if os.path.exists(resign):
        os.unlink(resign)
        asked.append(True)
        return True
    return False

def work(term):
    while believes(term) and not told_to_resign():
        time.sleep(0.005)

async def awork(term):
    while believes(term) and not told_to_resign():
        await asyncio.sleep(0.005)

def stopped(term):
    # After a resignation asked for, stand back until a standby took over (the test
    # checks the handover; how fast a loaded machine makes it is not its business).
    if asked:
        asked.clear()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = current_leader(dsn, name)
            if now is not None and now.fence > term.fence:
                break
            time.sleep(0.05)

async def astopped(term):
    stopped(term)

holder = f"cand-{pid}"
note(f"{pid} ready")
if mode == "sync":
    run_as_leader(dsn, name, float(ttl), work, holder=holder, on_stopped_leading=stopped)
else:
    asyncio.run(
        arun_as_leader(dsn, name, float(ttl), awork, holder=holder, on_stopped_leading=astopped)
    )
"""


@dataclass(frozen=True)
class Term:
    pid: int
    fence: int
    start: float
    end: float


def terms(witness: Path) -> list[Term]:
    """Every term the witness saw, in the order they began."""
    seen: dict[int, list[Any]] = {}
    for line in witness.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        pid, fence, at = int(parts[0]), int(parts[1]), float(parts[2])
        entry = seen.setdefault(fence, [pid, at, at])
        assert entry[0] == pid, f"fence {fence} believed by two processes: {entry[0]} and {pid}"
        entry[1], entry[2] = min(entry[1], at), max(entry[2], at)
    found = [Term(pid, fence, start, end) for fence, (pid, start, end) in seen.items()]
    return sorted(found, key=lambda t: t.start)


def check_witness(witness: Path) -> list[Term]:
    """At every moment at most one process believed it led, and terms grew."""
    found = terms(witness)
    for before, after in itertools.pairwise(found):
        assert before.end < after.start, f"two leaders at once: {before} and {after}"
        assert before.fence < after.fence, f"a term number went back: {before} then {after}"
    return found


@dataclass
class Election:
    """Candidates for one name, started and stopped by a test."""

    dsn: str
    name: str
    ttl: float
    tmp: Path
    mode: str

    def __post_init__(self) -> None:
        self.script = self.tmp / "candidate.py"
        self.script.write_text(CANDIDATE)
        self.witness = self.tmp / "witness.txt"
        self.witness.touch()
        self.control = self.tmp / "control"
        self.control.mkdir(exist_ok=True)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> int:
        proc = subprocess.Popen(
            [sys.executable, str(self.script), self.dsn, self.name, repr(self.ttl),
             str(self.witness), str(self.control), self.mode],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.procs[proc.pid] = proc
        return proc.pid

    def leader(self, conn: psycopg.Connection[Any], *, above: int = 0) -> tuple[int, Any]:
        """Wait until a candidate leads with a fence above ``above``: (pid, status row)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT holder, fence, acquired_at, expires_at FROM lease_status(%s) WHERE held",
                (self.name,),
            ).fetchone()
            if row is not None and row[1] > above and row[0].startswith("cand-"):
                return int(row[0].removeprefix("cand-")), row
            for proc in self.procs.values():
                assert proc.poll() is None or proc.returncode in (-signal.SIGTERM, -9), proc.args
            time.sleep(0.01)
        raise AssertionError(f"no new leader above fence {above} within 30 s")

    def believed(self, fence: int) -> None:
        """Wait until the term ``fence`` was believed at least once, then a little longer."""
        deadline = time.monotonic() + 30
        while not any(
            line.split()[1:2] == [str(fence)] for line in self.witness.read_text().splitlines()
        ):
            assert time.monotonic() < deadline, f"term {fence} never believed it led"
            time.sleep(0.01)
        time.sleep(random.uniform(0.02, 0.2))

    def resign(self, pid: int) -> None:
        (self.control / f"resign-{pid}").touch()

    def signal(self, pid: int, signum: int) -> int:
        """Send ``signum`` and wait for the process to end; its return code."""
        proc = self.procs.pop(pid)
        os.kill(pid, signum)
        return proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def campaign_rounds(
    conn: psycopg.Connection[Any], election: Election, candidates: int, rounds: int
) -> Iterator[str]:
    """Run ``rounds`` handovers (resign, SIGTERM, SIGKILL in turn) among ``candidates``.

    Yields each round's action once its handover was checked.
    """
    for _ in range(candidates):
        election.start()
    fence = 0
    actions = ["resign", "sigterm", "sigkill"]
    for number in range(rounds):
        action = actions[number % len(actions)]
        pid, row = election.leader(conn, above=fence)
        fence = row[1]
        election.believed(fence)
        if action == "resign":
            election.resign(pid)
        elif action == "sigterm":
            # Read just before the signal: the expiry the standby must not wait for.
            row = election.leader(conn, above=fence - 1)[1]
            code = election.signal(pid, signal.SIGTERM)
            assert code == -signal.SIGTERM, f"SIGTERM'd leader exited {code}"
            election.start()
        else:
            code = election.signal(pid, signal.SIGKILL)
            assert code == -signal.SIGKILL
            election.start()
        new_pid, new_row = election.leader(conn, above=fence)
        assert new_row[1] > fence
        if action in ("resign", "sigterm"):
            assert new_pid != pid, f"round {number}: {action} did not hand over"
            # Handed over by the release, not by the expiry.
            assert new_row[2] < row[3], f"round {number}: the standby waited for the ttl"
        else:
            assert new_row[2] >= row[3]  # a killed leader's term ran out first
        fence = new_row[1] - 1  # the next round starts from this leader
        yield action
