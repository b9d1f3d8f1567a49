"""Readers and writers under processes (contract 5.2), judged by the belief witness.

Processes take one name again and again, some as readers (``shared=True``), some as
writers, and sample what they believe while they hold it. The verdicts, on believing
spans (a holder that believed at two samples believed in between: a belief only
ends): a writer's span never overlaps anyone else's; readers' spans do overlap (they
really run in parallel). And writer preference, with a stream of readers arriving
every few milliseconds: a waiting writer is kept out no longer than the readers' ttl,
and a waiting writer that died stops keeping readers out once its place in line
expires. The witness also judges them while holders are killed with SIGKILL and their
networks turned into black holes (the permits witness's fleet, hammering a lease).
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


def hammer(url: str, witness: Witness, seed: int, writes: float) -> None:
    """Take the name again and again until RUN_FOR is over, a writer with probability
    ``writes``, sampling every belief while it holds it."""
    rnd = random.Random(seed)
    until = time.monotonic() + RUN_FOR
    while time.monotonic() < until:
        writer = rnd.random() < writes
        try:
            with lease(url, NAME, ttl=3, shared=not writer, wait=5) as held:
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
        try:
            with lease(url, NAME, ttl=FAULTY_TTL, shared=not writer, wait=5) as held:
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


def spans(witness: Witness) -> dict[str, tuple[int, int, bool]]:
    """Per holder: its first and last believing sample, and whether it was a writer."""
    writers = {e.holder for e in witness.events() if e.kind == "note" and e.fields.get("writer")}
    found: dict[str, list[int]] = {}
    for e in witness.events():
        if e.kind == "belief" and e.believes:
            span = found.setdefault(e.holder, [e.t, e.t])
            span[0], span[1] = min(span[0], e.t), max(span[1], e.t)
    return {h: (a, b, h in writers) for h, (a, b) in found.items()}


def writer_overlaps(witness: Witness) -> list[tuple[str, str]]:
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
    modes = [e.fields["writer"] for e in witness.events() if e.kind == "note"]
    # The verdicts had something to judge: writers and readers both came in, many times.
    assert modes.count(True) >= 3 and modes.count(False) >= 10, witness.story()
    assert writer_overlaps(witness) == [], witness.story()
    # Readers really ran in parallel.
    assert most_readers_at_once(witness) >= 2, witness.story()


def test_a_writer_never_believes_beside_anyone_under_sigkill_and_a_black_hole(
    pg: Db, tmp_path: Path
) -> None:
    db = pg  # the fault proxy stands between a process and PostgreSQL alone
    witness = Witness(tmp_path / "witness.jsonl")
    seed = random.randrange(2**32)
    witness.note("seed", NAME, seed=seed)
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(proxy(db.url)) for _ in range(4)]
        fleet = Fleet(witness, proxies, hammer_faulty)
        faults_while_hammering(fleet, seed)
        fleet.join()
    modes = [
        e.fields["writer"] for e in witness.events() if e.kind == "note" and "writer" in e.fields
    ]
    assert modes.count(True) >= 3 and modes.count(False) >= 10, witness.story()
    assert writer_overlaps(witness) == [], witness.story()
    assert fleet.kills >= 1, witness.story()


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
