"""A semaphore of 2 under processes that hammer it: never 3 believers at once.

Four processes take one permit after another of one semaphore (``max_permits=2``) and,
while each holds one, sample what they believe into the belief witness. Two verdicts:
per slot, the witness's own (nobody believes in a slot after it was granted to
another), and across slots, that no three holders' believing spans overlap (a holder
that believed at two samples believed in between: a belief only ever ends). The model
checks the same two properties exhaustively (docs/model.md: ``belief`` and ``permits``).

The second test breaks the processes while they hammer: a holder is killed with
SIGKILL (its slot is freed by the database's clock, never by a release), or its
network turns into a black hole while its body goes on sampling (the keeper's
renewals hang, the slot expires and is granted to another, and the holder must have
stopped believing by then).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.faultkit import BLACKHOLE, FORWARD, Proxy, proxy
from tests.support.safety_kit import Db
from tests.support.witness import Witness

NAME = "exports"
LIMIT = 2
WORKERS = 4
TTL = 1.5
HOLD = 0.3  # the longest a body holds its permit
RUN_FOR = 6.0
BOUND = 120.0
# Under faults: how long the processes hammer, how often a fault comes, and how long a
# black hole lasts (longer than the ttl, so the slot expires and is granted under it).
FAULTY_RUN_FOR = 24.0
FAULT_EVERY = (0.6, 1.6)
BLACKHOLE_FOR = 2.5 * TTL
FAULTY_HOLD = 0.05  # shorter: more grants in the run
KEPT = 2  # a body told it stays in its block


def hammer(
    url: str,
    witness: Witness,
    seed: int,
    run_for: float = RUN_FOR,
    holding: Any = None,
    hold_on: Any = None,
) -> None:
    """Take permits one after another until ``run_for`` is over, sampling every belief.

    Under faults (``holding`` and ``hold_on``, shared arrays of the test, this process
    at index ``seed``): ``holding[seed]`` is 1 while a permit block runs; asked to by
    ``hold_on[seed]``, the body says KEPT there and stays in its block, sampling, until
    ``hold_on[seed]`` is 0 again (meanwhile its network is a black hole). A claim or
    release that meets the broken network fails, and the next claim follows.
    """
    from pylease import LeaseBusy, permit
    from pylease.errors import DatabaseUnavailable, LeaseLost

    # A holder starved past its ttl (a loaded machine) is told of the loss: in the
    # contract, and what it believed meanwhile is in the witness, which is checked.
    faults: tuple[type[Exception], ...] = (LeaseBusy, LeaseLost)
    if holding is not None:
        faults = (LeaseBusy, LeaseLost, DatabaseUnavailable)
    rnd = random.Random(seed)
    until = time.monotonic() + run_for
    while time.monotonic() < until:
        try:
            with permit(url, NAME, ttl=TTL, max_permits=LIMIT, wait=5) as held:
                (slot, fence), *_ = held.slots.items()
                witness.grant(f"{NAME}#{slot}", held.holder, fence)
                if holding is not None:
                    holding[seed] = 1
                end = time.monotonic() + rnd.uniform(0.0, HOLD if holding is None else FAULTY_HOLD)
                while True:
                    believes = witness.sample(held)
                    witness.record(
                        "belief", f"{NAME}#{slot}", held.holder, believes=believes, who="body"
                    )
                    kept = hold_on is not None and hold_on[seed]
                    if kept:
                        holding[seed] = KEPT
                    elif time.monotonic() >= end:
                        break
                    time.sleep(0.005)
        except faults:
            continue
        finally:
            if holding is not None:
                holding[seed] = 0


def most_believers_at_once(witness: Witness) -> int:
    """How many holders' believing spans (first to last believing sample) overlap."""
    spans: dict[str, list[int]] = {}
    for e in witness.events():
        if e.kind == "belief" and e.name == NAME and e.believes:
            span = spans.setdefault(e.holder, [e.t, e.t])
            span[0], span[1] = min(span[0], e.t), max(span[1], e.t)
    edges = sorted([(a, 1) for a, _ in spans.values()] + [(b, -1) for _, b in spans.values()])
    most = now = 0
    for _, step in edges:  # an end and a start at one instant: the end first
        now += step
        most = max(most, now)
    return most


def test_four_processes_never_more_than_two_believers(db: Db, tmp_path: Path) -> None:
    witness = Witness(tmp_path / "witness.jsonl")
    ctx = multiprocessing.get_context("spawn")
    workers = [
        ctx.Process(target=hammer, args=(db.url, witness, i), daemon=True) for i in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(BOUND)
        assert worker.exitcode == 0, worker.exitcode
    grants = witness.grants()
    assert len(grants) >= 2 * WORKERS, witness.story()
    assert {g.name for g in grants} <= {f"{NAME}#{slot}" for slot in range(LIMIT)}
    witness.assert_sound()
    assert most_believers_at_once(witness) <= LIMIT, witness.story()
    # The verdict had something to judge: the limit was reached.
    assert most_believers_at_once(witness) == LIMIT, witness.story()


# Under faults -------------------------------------------------------------------------


class Fleet:
    """The hammering processes, each through a proxy of its own, and what broke them.

    ``target`` is what each process runs, with ``hammer``'s arguments (readers and
    writers hammer a lease instead: tests/api/test_readers_writers_witness.py)."""

    def __init__(
        self, witness: Witness, proxies: Sequence[Proxy], target: Callable[..., None] | None = None
    ) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.witness, self.proxies = witness, proxies
        self.target = target or hammer
        self.holding = self.ctx.Array("b", len(proxies))
        self.hold_on = self.ctx.Array("b", len(proxies))
        self.until = time.monotonic() + FAULTY_RUN_FOR
        self.workers: list[Any] = [None] * len(proxies)
        self.kills = 0
        for i in range(len(proxies)):
            self.start(i)

    def start(self, i: int) -> None:
        """(Re)start process i, for what is left of the run."""
        left = max(self.until - time.monotonic(), 0.0)
        args = (self.proxies[i].dsn, self.witness, i, left, self.holding, self.hold_on)
        self.workers[i] = self.ctx.Process(target=self.target, args=args, daemon=True)
        self.workers[i].start()

    def holder_index(self, rnd: random.Random) -> int | None:
        """A process in a permit block now, at random (holds are short: watched for)."""
        look_until = time.monotonic() + 2.0
        while time.monotonic() < look_until:
            found = [i for i in range(len(self.proxies)) if self.holding[i] == 1]
            if found:
                return rnd.choice(found)
            time.sleep(0.001)
        return None

    def kill(self, i: int) -> None:
        """SIGKILL process i (seen in its block a moment ago), and start another in its
        place. Its slot is freed by the database's clock alone."""
        worker = self.workers[i]
        self.witness.note("sigkill", NAME, worker=worker.pid)
        worker.kill()
        worker.join(BOUND)
        self.holding[i] = 0
        self.kills += 1
        self.start(i)

    def blackhole(self, i: int) -> bool:
        """Process i's network stops answering while its body stays in its block,
        sampling; False if the body had left its block before it was told."""
        self.hold_on[i] = 1
        told = time.monotonic() + 2.0
        while self.holding[i] == 1 and time.monotonic() < told:
            time.sleep(0.005)
        if self.holding[i] != KEPT:
            self.hold_on[i] = 0
            return False
        self.proxies[i].set(BLACKHOLE)
        self.witness.note("blackhole", NAME, worker=self.workers[i].pid)
        return True

    def heal(self, i: int) -> None:
        self.proxies[i].set(FORWARD)
        self.hold_on[i] = 0
        self.witness.note("healed", NAME, worker=self.workers[i].pid)

    def join(self) -> None:
        for worker in self.workers:
            worker.join(BOUND)
            assert worker.exitcode == 0, worker.exitcode


def outlived(witness: Witness) -> list[str]:
    """The holders that went on sampling, blackholed, after their slot was granted to
    another: the evidence that the verdict judged a belief past a re-grant."""
    events = witness.events()
    windows: list[tuple[int, int, int]] = []  # (worker pid, blackholed at, healed at)
    opened: dict[int, int] = {}
    for e in events:
        what, pid = e.fields.get("what"), int(e.fields.get("worker", 0))
        if what == "blackhole":
            opened[pid] = e.t
        elif what == "healed" and pid in opened:
            windows.append((pid, opened.pop(pid), e.t))
    found = []
    for pid, start, stop in windows:
        granted = [e for e in events if e.kind == "grant" and e.pid == pid and e.t < start]
        if not granted:
            continue
        mine = granted[-1]
        retaken = next(
            (
                e.t
                for e in events
                if e.kind == "grant" and e.name == mine.name and e.holder != mine.holder
                if start < e.t < stop
            ),
            None,
        )
        sampled = (e.t for e in events if e.kind == "belief" and e.holder == mine.holder)
        if retaken is not None and any(t > retaken for t in sampled):
            found.append(mine.holder)
    return found


def faults_while_hammering(fleet: Fleet, seed: int) -> None:
    """Every FAULT_EVERY, SIGKILL a holder or blackhole one, by turns, until the run is
    over. Nothing else breaks during a black hole: the others are to take its slot."""
    rnd = random.Random(seed)
    blackhole_next = True
    while time.monotonic() < fleet.until:
        time.sleep(rnd.uniform(*FAULT_EVERY))
        i = fleet.holder_index(rnd)
        if i is None:
            continue
        if not blackhole_next:
            fleet.kill(i)
        elif fleet.blackhole(i):
            time.sleep(BLACKHOLE_FOR)
            fleet.heal(i)
        else:
            continue
        blackhole_next = not blackhole_next


def faulty_round(db: Db, witness: Witness) -> int:
    """One run of the fleet under faults, judged; the number of grants it made."""
    seed = random.randrange(2**32)
    witness.note("seed", NAME, seed=seed)
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(proxy(db.url)) for _ in range(WORKERS)]
        fleet = Fleet(witness, proxies)
        faults_while_hammering(fleet, seed)
        fleet.join()
    grants = witness.grants()
    assert {g.name for g in grants} <= {f"{NAME}#{slot}" for slot in range(LIMIT)}
    witness.assert_sound()
    assert most_believers_at_once(witness) <= LIMIT, witness.story()
    # The verdict had something to judge: the limit was reached, holders were killed
    # inside their blocks, and a blackholed holder sampled after its slot was retaken.
    assert most_believers_at_once(witness) == LIMIT, witness.story()
    assert len(grants) >= 4 * WORKERS, witness.story()
    assert fleet.kills >= 1, witness.story()
    assert outlived(witness), witness.story()
    return len(grants)


def test_sigkill_and_a_blackholed_network_never_make_more_believers_than_permits(
    pg: Db, tmp_path: Path
) -> None:
    faulty_round(pg, Witness(tmp_path / "witness.jsonl"))
