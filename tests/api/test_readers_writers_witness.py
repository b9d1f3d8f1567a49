"""Readers and writers under processes (contract 5.2), judged by the belief witness.

Processes take one name again and again, some as readers (``shared=True``), some as
writers, and sample what they believe while they hold it. The verdicts, on believing
spans (a holder that believed at two samples believed in between: a belief only
ends): a writer's span never overlaps anyone else's; readers' spans do overlap (they
really run in parallel). And writer preference, with a stream of readers arriving
every few milliseconds: a waiting writer is kept out no longer than the readers' ttl,
and a waiting writer that died stops keeping readers out once its place in line
expires. The witness also judges them while holders are killed with SIGKILL and their
networks turned into black holes (the permits witness's fleet, hammering a lease), round
after round in `make soak` (tests/soak/test_readers_soak.py).

Half of the readers' blocks take the process's own explicit holder, so one holder is
used by block after block (contract 5.6), and after a SIGKILL by the process started in
its place while the killed one's share may still be live: an earlier block's release or
renewal, late or abandoned with its connection, must never touch a later block's share.
A believing span is therefore one block's (its process, holder and grant), not a
holder's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

from pylease import LeaseBusy, LeaseLost, lease
from tests.api.test_permits_witness import KEPT, Fleet, faults_while_hammering
from tests.support.faultkit import proxy
from tests.support.safety_kit import Db
from tests.support.witness import Witness

NAME = "doc"
RUN_FOR = 6.0
BOUND = 120.0
READER_TTL = 5.0
MOST_READERS = 200  # the stream of readers' threads alive at once
FAULTY_TTL = 1.5  # the permits fleet's black hole lasts 2.5 times this


def reused(writer: bool, rnd: random.Random, seed: int) -> str | None:
    """A reader's holder: half the time this process's own, reused block after block
    (and by the process that replaces it after a SIGKILL); else a new one per block."""
    return f"reader-{seed}" if not writer and rnd.random() < 0.5 else None


def hammer(url: str, witness: Witness, seed: int, writes: float) -> None:
    """Take the name again and again until RUN_FOR is over, a writer with probability
    ``writes``, sampling every belief while it holds it."""
    rnd = random.Random(seed)
    until = time.monotonic() + RUN_FOR
    while time.monotonic() < until:
        writer = rnd.random() < writes
        try:
            with lease(
                url, NAME, ttl=3, shared=not writer, wait=5, holder=reused(writer, rnd, seed)
            ) as held:
                witness.grant(NAME, held.holder, held.fence)
                witness.note("mode", NAME, held.holder, writer=writer)
                end = time.monotonic() + rnd.uniform(0.0, 0.15)
                while witness.sample(held) and time.monotonic() < end:
                    time.sleep(0.005)
        except LeaseBusy:
            continue
        except LeaseLost as exc:
            # A loaded machine may starve a renewal: a loss told is no wrong belief.
            witness.note("lost", NAME, str(exc))


def hammer_faulty(
    url: str, witness: Witness, seed: int, run_for: float, holding: Any, hold_on: Any
) -> None:
    """hammer under the fleet's faults (see tests/api/test_permits_witness.py): a
    writer one time in four; ``holding[seed]`` 1 in a block, KEPT while told to stay in
    it (its network a black hole meanwhile)."""
    from pylease.errors import DatabaseUnavailable

    rnd = random.Random(seed)
    until = time.monotonic() + run_for
    while time.monotonic() < until:
        writer = rnd.random() < 0.25
        holder = reused(writer, rnd, seed)
        try:
            with lease(url, NAME, ttl=FAULTY_TTL, shared=not writer, wait=5, holder=holder) as held:
                witness.grant(NAME, held.holder, held.fence)
                witness.note("mode", NAME, held.holder, writer=writer)
                holding[seed] = 1
                end = time.monotonic() + rnd.uniform(0.0, 0.1)
                while True:
                    witness.sample(held)
                    if hold_on[seed]:
                        holding[seed] = KEPT
                    elif time.monotonic() >= end:
                        break
                    time.sleep(0.005)
        except (LeaseBusy, LeaseLost, DatabaseUnavailable):
            continue
        finally:
            holding[seed] = 0


Block = tuple[int, str, int]  # a block: its process, its holder, the how-manyth grant


def spans(witness: Witness) -> dict[Block, tuple[int, int, bool]]:
    """Per block: its first and last believing sample, and whether it was a writer. A
    process runs one block at a time, so its holder's samples belong to the holder's
    latest grant in that process."""
    grants: dict[tuple[int, str], int] = {}
    writers: set[Block] = set()
    found: dict[Block, list[int]] = {}
    for e in witness.events():
        key = (e.pid, e.holder)
        if e.kind == "grant":
            grants[key] = grants.get(key, 0) + 1
        elif key not in grants:
            continue
        block = (e.pid, e.holder, grants[key])
        if e.kind == "note" and e.fields.get("writer"):
            writers.add(block)
        elif e.kind == "belief" and e.believes:
            span = found.setdefault(block, [e.t, e.t])
            span[0], span[1] = min(span[0], e.t), max(span[1], e.t)
    return {k: (a, b, k in writers) for k, (a, b) in found.items()}


def writes_and_reads(witness: Witness) -> list[bool]:
    """Per grant, in order: whether it was a writer's."""
    return [
        e.fields["writer"] for e in witness.events() if e.kind == "note" and "writer" in e.fields
    ]


def reused_holders(witness: Witness) -> dict[str, int]:
    """The explicit readers' holders granted more than once, and how many times."""
    counts: dict[str, int] = {}
    for g in witness.grants(NAME):
        if g.holder.startswith("reader-"):
            counts[g.holder] = counts.get(g.holder, 0) + 1
    return {h: n for h, n in counts.items() if n > 1}


def writer_overlaps(witness: Witness) -> list[tuple[Block, Block]]:
    """(writer, other) pairs whose believing spans overlap."""
    all_spans = sorted(spans(witness).items(), key=lambda item: item[1][0])
    bad = []
    for i, (one, (_, b1, w1)) in enumerate(all_spans):
        for other, (a2, _, w2) in all_spans[i + 1 :]:
            if a2 > b1:
                break
            if w1 or w2:
                bad.append((one, other))
    return bad


def most_readers_at_once(witness: Witness) -> int:
    edges = sorted(
        [(a, 1) for a, _, w in spans(witness).values() if not w]
        + [(b, -1) for _, b, w in spans(witness).values() if not w]
    )
    most = now = 0
    for _, step in edges:  # an end and a start at one instant: the end first
        now += step
        most = max(most, now)
    return most


def test_a_writer_never_believes_while_anyone_else_does(db: Db, tmp_path: Path) -> None:
    witness = Witness(tmp_path / "witness.jsonl")
    ctx = multiprocessing.get_context("spawn")
    workers = [
        ctx.Process(target=hammer, args=(db.url, witness, i, 0.25), daemon=True) for i in range(6)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(BOUND)
        assert worker.exitcode == 0, worker.exitcode
    # The verdicts had something to judge: writers and readers both came in, many times,
    # and a reader's holder served block after block.
    modes = writes_and_reads(witness)
    assert modes.count(True) >= 3 and modes.count(False) >= 10, witness.story()
    assert reused_holders(witness), witness.story()
    assert writer_overlaps(witness) == [], witness.story()
    # Readers really ran in parallel.
    assert most_readers_at_once(witness) >= 2, witness.story()


def faulty_round(db: Db, witness: Witness) -> int:
    """One run of the fleet under SIGKILL and black holes, judged; its grants' count."""
    seed = random.randrange(2**32)
    witness.note("seed", NAME, seed=seed)
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(proxy(db.url)) for _ in range(4)]
        fleet = Fleet(witness, proxies, hammer_faulty)
        faults_while_hammering(fleet, seed)
        fleet.join()
    modes = writes_and_reads(witness)
    assert modes.count(True) >= 3 and modes.count(False) >= 10, witness.story()
    assert reused_holders(witness), witness.story()
    assert writer_overlaps(witness) == [], witness.story()
    assert fleet.kills >= 1, witness.story()
    return len(witness.grants(NAME))


def test_a_writer_never_believes_beside_anyone_under_sigkill_and_a_black_hole(
    pg: Db, tmp_path: Path
) -> None:
    faulty_round(pg, Witness(tmp_path / "witness.jsonl"))  # the fault proxy: PostgreSQL's


# Writer preference ----------------------------------------------------------------


def stream_of_readers(url: str, witness: Witness, stop: Any) -> None:
    """A reader every few milliseconds until ``stop`` is set, each holding the name for
    50 ms; a reader kept out waits for its turn. The test stops the stream once it saw
    what it needs, not at a time fixed in advance: a loaded machine may take seconds
    to start this process and to grant its first readers."""

    def read() -> None:
        try:
            with lease(url, NAME, ttl=READER_TTL, shared=True, wait=30) as held:
                witness.grant(NAME, held.holder, held.fence)
                time.sleep(0.05)
                witness.sample(held)
        except LeaseBusy:
            witness.note("reader gave up")

    threads: list[threading.Thread] = []
    until = time.monotonic() + BOUND
    while not stop.is_set() and time.monotonic() < until:
        # At most MOST_READERS at once (each lives 50 ms, or waits its turn): a stream
        # that a loaded machine slows never piles up thousands of waiting threads.
        threads = [t for t in threads if t.is_alive()]
        if len(threads) < MOST_READERS:
            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            threads.append(thread)
        time.sleep(0.005)
    for thread in threads:
        thread.join(60)


def test_a_stream_of_readers_keeps_a_waiting_writer_out_no_longer_than_their_ttl(
    db: Db, tmp_path: Path
) -> None:
    witness = Witness(tmp_path / "witness.jsonl")
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    readers = ctx.Process(target=stream_of_readers, args=(db.url, witness, stop), daemon=True)
    readers.start()
    try:
        # The stream is under way: the name has been read, readers overlapping.
        deadline = time.monotonic() + BOUND
        while len(witness.grants(NAME)) < 20:
            assert time.monotonic() < deadline, witness.story()
            time.sleep(0.05)
        asked = time.monotonic()
        with lease(db.url, NAME, ttl=5, wait=30) as held:
            granted = time.monotonic()
            witness.grant(NAME, held.holder, held.fence)
            witness.note("writer", NAME, held.holder, waited=granted - asked)
        assert granted - asked < READER_TTL, witness.story()

        # Readers came in again after the writer, with its fence as their epoch.
        def after_the_writer() -> bool:
            return any(
                g.fields["fence"] == held.fence and g.holder != held.holder
                for g in witness.grants(NAME)
            )

        deadline = time.monotonic() + BOUND
        while not after_the_writer():
            assert time.monotonic() < deadline, witness.story()
            time.sleep(0.05)
    finally:
        stop.set()
        readers.join(BOUND)


def wait_as_writer(url: str, queue_ttl: float) -> None:
    """A writer that waits (for ever) in line; killed by the test."""
    import pylease._waiting

    pylease._waiting.WAITER_TTL = queue_ttl  # its place in line expires soon after death
    with lease(url, NAME, ttl=5, wait="forever"):
        pass


def test_a_dead_waiting_writer_stops_keeping_readers_out(db: Db) -> None:
    ctx = multiprocessing.get_context("spawn")
    with lease(db.url, NAME, ttl=30, shared=True):
        writer = ctx.Process(target=wait_as_writer, args=(db.url, 2.0), daemon=True)
        writer.start()
        # Once the writer waits in line, a new reader is kept out.
        deadline = time.monotonic() + BOUND
        while True:
            try:
                with lease(db.url, NAME, ttl=30, shared=True):
                    pass
            except LeaseBusy:
                break
            assert time.monotonic() < deadline, "the waiting writer never kept a reader out"
            time.sleep(0.1)
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(BOUND)
        killed = time.monotonic()
        # Its place in line expires: readers come in again, without a writer ever in.
        with lease(db.url, NAME, ttl=30, shared=True, wait=60, poll_interval=0.5) as held:
            waited = time.monotonic() - killed
        assert held.fence == 0
        assert waited < 30.0
