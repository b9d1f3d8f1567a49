"""Five member processes share 64 partitions through joins, graceful leaves, SIGKILL and
SIGSTOP, and a member whose network turns into a black hole: never two believing owners
of a partition, and every partition owned again, by the member the assignment gives it
to, within two ttls of each change.

Each member process runs ``partitions()`` and, every SAMPLE seconds, samples into the
belief witness what it believes of every partition it owned at the last look (so a
process resumed after SIGSTOP samples the partitions it held before, and must not
believe in them once they were granted to another). A grant is recorded when the body
first sees the partition's new Held: after its claim returned, before any sample of it.
The test process changes the membership and, after each change, reads the database
until every partition's lease is held by the member ``group_assignment`` names, among
the members it expects to be live.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from tests.support.faultkit import BLACKHOLE, FORWARD, proxy
from tests.support.safety_kit import Db
from tests.support.witness import Witness, now_ns

GRP = "queue"
PARTS = 64
MEMBERS = 5
TTL = 3.0
SAMPLE = 0.1
ROUNDS = 3
STOPPED_FOR = 1.5 * TTL
# Every partition is owned again within two ttls of a change (contract 5.5: a dead
# member's partitions within one ttl of its expiry, itself within a ttl of its last
# renewal).
SETTLE = 2 * TTL
STARTUP = 60.0  # a process's start on a loaded machine: a liveness bound
BOUND = 30.0


def member(url: str, witness: Witness, name: str, stop: Any) -> None:
    """A member process: own partitions and sample the beliefs, until ``stop``."""
    from pylease import LeaseLost, partitions

    with partitions(url, GRP, PARTS, ttl=TTL, member=name) as p:
        seen: dict[int, Any] = {}
        while not stop.is_set():
            for part in p.owned:
                try:
                    held = p.held(part)
                except LeaseLost:
                    continue
                if seen.get(part) is not held:
                    # Seen here only once its claim returned: the grant came before.
                    witness.grant(f"{GRP}#{part}", name, held.fence)
                    seen[part] = held
            for part, held in list(seen.items()):
                if not witness.sample(held, who=name):
                    del seen[part]
            time.sleep(SAMPLE)
    witness.note("left", GRP, name)


class Fleet:
    """The member processes, by name, and what the test expects to be live."""

    def __init__(self, url: str, witness: Witness) -> None:
        self.url, self.witness = url, witness
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: dict[str, tuple[Any, Any]] = {}
        self.alive: set[str] = set()
        self.made = 0
        self.changes = 0

    def start(self, url: str | None = None) -> str:
        """Start a member process (through ``url``, the database's by default)."""
        self.made += 1
        name = f"w{self.made}"
        stop = self.ctx.Event()
        proc = self.ctx.Process(
            target=member, args=(url or self.url, self.witness, name, stop), daemon=True
        )
        proc.start()
        self.procs[name] = (proc, stop)
        self.alive.add(name)
        return name

    def leave(self, name: str) -> None:
        proc, stop = self.procs.pop(name)
        stop.set()
        proc.join(BOUND)
        assert proc.exitcode == 0, proc.exitcode
        self.alive.discard(name)

    def signal(self, name: str, signum: int) -> None:
        proc, _stop = self.procs[name]
        self.witness.note(signal.Signals(signum).name, GRP, name, worker=proc.pid)
        os.kill(proc.pid, signum)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        proc, _stop = self.procs.pop(name)
        proc.join(BOUND)
        self.alive.discard(name)

    def close(self) -> None:
        for _proc, stop in self.procs.values():
            stop.set()
        for proc, _stop in self.procs.values():
            proc.join(BOUND)
            if proc.exitcode is None:
                proc.kill()


def converged(other: Any, alive: set[str]) -> bool:
    """The expected members are live, and each partition's lease is held by the member
    the assignment gives it to."""
    if {r.member for r in other.group_members(GRP)} != alive:
        return False
    assignment = other.group_assignment(GRP, PARTS)
    held = {r.name: r.holder for r in other.status(None) if r.state == "held"}
    return len(assignment) == PARTS and all(
        held.get(f"{GRP}#{part}") == who for part, who in assignment.items()
    )


def settle(other: Any, fleet: Fleet, what: str, since: float, bound: float = SETTLE) -> None:
    """Wait until converged; the change (at ``since``) must settle within ``bound``."""
    fleet.changes += 1
    limit = since + max(bound, BOUND)
    while not converged(other, fleet.alive):
        assert time.monotonic() < limit, f"{what}: never settled\n{fleet.witness.story()}"
        time.sleep(0.05)
    took = time.monotonic() - since
    fleet.witness.note("settled", GRP, change=what, took=took)
    assert took <= bound, f"{what}: settled after {took:.1f}s > {bound:.1f}s"


def joined(other: Any, name: str) -> float:
    """When ``name`` was first seen live (its process started slowly: not the change)."""
    limit = time.monotonic() + STARTUP
    while name not in {r.member for r in other.group_members(GRP)}:
        assert time.monotonic() < limit, f"{name} never joined"
        time.sleep(0.02)
    return time.monotonic()


def test_members_come_and_go_and_never_two_believe_they_own_a_partition(
    pg: Db, tmp_path: Path
) -> None:
    witness = Witness(tmp_path / "witness.jsonl")
    other = pg.backend()
    rnd = random.Random()
    fleet = Fleet(pg.url, witness)
    try:
        names = [fleet.start() for _ in range(MEMBERS)]
        for name in names:
            joined(other, name)
        fleet.changes += MEMBERS
        settle(other, fleet, "first joins", time.monotonic(), BOUND)
        for _ in range(ROUNDS):
            name = rnd.choice(sorted(fleet.alive))
            fleet.leave(name)
            settle(other, fleet, f"{name} left", time.monotonic())

            name = fleet.start()
            settle(other, fleet, f"{name} joined", joined(other, name))

            name = rnd.choice(sorted(fleet.alive))
            killed_at = time.monotonic()
            fleet.kill(name)
            settle(other, fleet, f"{name} killed", killed_at)

            name = fleet.start()
            settle(other, fleet, f"{name} joined", joined(other, name))

            name = rnd.choice(sorted(fleet.alive))
            stopped_at = time.monotonic()
            fleet.signal(name, signal.SIGSTOP)
            fleet.alive.discard(name)
            settle(other, fleet, f"{name} stopped", stopped_at)
            time.sleep(max(stopped_at + STOPPED_FOR - time.monotonic(), 0.0))
            fleet.signal(name, signal.SIGCONT)
            fleet.alive.add(name)
            settle(other, fleet, f"{name} resumed", time.monotonic())
    finally:
        fleet.close()
    assert fleet.changes >= 20
    witness.assert_sound()
    events = witness.events()
    grants = [e for e in events if e.kind == "grant"]
    assert len({e.name for e in grants}) == PARTS, witness.story()
    # The verdict judged something: resumed members sampled partitions granted to
    # another meanwhile, and did not believe in them.
    stale = [e for e in events if e.kind == "belief" and not e.believes]
    assert stale, witness.story()


def sampled_as_lost(witness: Witness, name: str, parts: set[str], since: int) -> bool:
    """``name`` sampled each of ``parts`` as not believed, after ``since``."""
    seen = {
        e.name
        for e in witness.events()
        if e.kind == "belief" and e.holder == name and e.t > since and not e.believes
    }
    return parts <= seen


def test_a_blackholed_member_stops_believing_before_its_partitions_are_retaken(
    pg: Db, tmp_path: Path
) -> None:
    """Three members, one of them through a proxy that turns into a black hole: its
    renewals go unanswered while it runs on, sampling. The others own its partitions
    within two ttls, and it believed in none of them once another was granted it."""
    witness = Witness(tmp_path / "witness.jsonl")
    other = pg.backend()
    fleet = Fleet(pg.url, witness)
    with proxy(pg.url) as cut:
        try:
            names = [fleet.start(), fleet.start(), fleet.start(cut.dsn)]
            victim = names[-1]
            for name in names:
                joined(other, name)
            settle(other, fleet, "first joins", time.monotonic(), BOUND)
            held = {r.name for r in other.status(None) if r.state == "held" and r.holder == victim}
            assert held, "the assignment gave the blackholed member nothing"

            cut_at, since = time.monotonic(), now_ns()
            cut.set(BLACKHOLE)
            witness.note("blackhole", GRP, victim)
            fleet.alive.discard(victim)
            settle(other, fleet, f"{victim} blackholed", cut_at)
            # Its body runs on: each partition it held is sampled as lost before the
            # network heals (a liveness bound: a loaded machine starves a process).
            limit = time.monotonic() + BOUND
            while not sampled_as_lost(witness, victim, held, since):
                assert time.monotonic() < limit, witness.story()
                time.sleep(0.05)
            healed = now_ns()
            cut.set(FORWARD)
            witness.note("healed", GRP, victim)
            fleet.alive.add(victim)
            settle(other, fleet, f"{victim} healed", joined(other, victim))
        finally:
            fleet.close()
    witness.assert_sound()
    events = witness.events()
    for part in sorted(held):
        retaken = min(
            (
                e.t
                for e in events
                if e.kind == "grant" and e.name == part and e.holder != victim and e.t > since
            ),
            default=None,
        )
        assert retaken is not None, f"{part} was never granted to another\n{witness.story()}"
        believed = [
            e.t
            for e in events
            if e.kind == "belief"
            and e.name == part
            and e.holder == victim
            and e.believes
            and since < e.t < healed
        ]
        assert all(t < retaken for t in believed), (
            f"{victim} believed in {part} once retaken\n{witness.story()}"
        )
