"""A semaphore of 2 under processes that hammer it: never 3 believers at once.

Four processes take one permit after another of one semaphore (``max_permits=2``) and,
while each holds one, sample what they believe into the belief witness. Two verdicts:
per slot, the witness's own (nobody believes in a slot after it was granted to
another), and across slots, that no three holders' believing spans overlap (a holder
that believed at two samples believed in between: a belief only ever ends).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from pathlib import Path

from tests.support.safety_kit import Db
from tests.support.witness import Witness

NAME = "exports"
LIMIT = 2
WORKERS = 4
RUN_FOR = 6.0
BOUND = 120.0


def hammer(url: str, witness: Witness, seed: int) -> None:
    """Take permits one after another until RUN_FOR is over, sampling every belief."""
    from pylease import LeaseBusy, permit

    rnd = random.Random(seed)
    until = time.monotonic() + RUN_FOR
    while time.monotonic() < until:
        try:
            with permit(url, NAME, ttl=1.5, max_permits=LIMIT, wait=5) as held:
                (slot, fence), *_ = held.slots.items()
                witness.grant(f"{NAME}#{slot}", held.holder, fence)
                end = time.monotonic() + rnd.uniform(0.0, 0.3)
                while True:
                    believes = witness.sample(held)
                    witness.record("belief", f"{NAME}#{slot}", held.holder, believes=believes)
                    if time.monotonic() >= end:
                        break
                    time.sleep(0.005)
        except LeaseBusy:
            continue


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
