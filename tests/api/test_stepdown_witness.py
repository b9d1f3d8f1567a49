"""Leaders asked to step down while stopped or cut off (contract 5.4), judged by the
belief witness: never two believers, and the requested one stops first.

Three candidate processes run ``run_as_leader`` on one name, each through a fault proxy
of its own. While a term lasts, its work samples what it believes into the witness
(stamped before it looks: a process stopped between its look and its stamp would be
judged at its resumption) and returns once ``term.release_requested`` turns true, so
that ``run_as_leader`` resigns and a standby takes over. The test asks the leader of
the moment to step down (``lease_request_release``, what ``pylease request-release``
calls), in rounds of four kinds:

- ``plain``: nothing broken; the keeper learns the request at its next renewal;
- ``stop-short``: the leader is SIGSTOPped, asked, and resumed well within its ttl;
  it learns the request (or, starved past its ttl, is lost) once it runs again;
- ``stop-long``: SIGSTOPped, asked, resumed only after a standby was granted by the
  expiry: the resumed work must not believe, and the request, which belonged to the
  tenure that ended, reaches nobody else;
- ``blackhole``: its network stops answering, then it is asked: the request never
  reaches it, its lease expires, and it must have stopped believing by the grant.

Verdicts: no belief of a term after another term's grant (the witness's own), no two
terms' believing spans overlap, each requested term's last belief precedes the next
grant, each request is followed by another term's grant within two ttls, and only a
requested term is ever told it was asked (by its round's requester). A term that lost
its lease goes on sampling until another term was granted, so that the rounds that
end by the expiry leave a sample after the grant for the verdict to judge.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.faultkit import BLACKHOLE, FORWARD, Proxy, proxy
from tests.support.safety_kit import Db
from tests.support.witness import Event, Witness, now_ns

NAME = "scheduler"
CANDIDATES = 3
TTL = 2.0
SAMPLE = 0.01
STOP_SHORT = TTL / 5  # resumed with most of the ttl left: the request is learnt
LINGER = 3 * TTL  # a lost term samples until another was granted, at most this long
HANDOVER = 2 * TTL  # a request to another term's grant: "within a couple of ttls"
KINDS = ("plain", "stop-short", "stop-long", "blackhole")
CYCLES = 2
STARTUP = 60.0  # a process's start on a loaded machine: a liveness bound
BOUND = 30.0


def look(witness: Witness, term: Any, key: str) -> tuple[bool, bool]:
    """Sample what ``term`` believes, stamped before the look: (believes, asked)."""
    from pylease import LeaseLost

    at = now_ns()
    lost = bool(term.lost)
    try:
        term.check()
        checked = True
    except LeaseLost:
        checked = False
    by = term.release_requested_by
    believes = not lost and checked
    witness.record("belief", NAME, key, at=at, believes=believes, asked=by is not None, by=by)
    return believes, by is not None


def candidate(url: str, witness: Witness, i: int, leading: Any, latest: Any) -> None:
    """Campaign for ever; while leading, sample until asked to step down (then return,
    and ``run_as_leader`` resigns) or lost (then sample on until another was granted).

    ``leading[i]`` is the fence of this process's term while its work runs, else 0;
    ``latest`` the largest fence any work began with."""
    from pylease import run_as_leader
    from pylease.errors import PyleaseError

    def work(term: Any) -> None:
        key = f"{term.holder}@{term.fence}"
        witness.grant(NAME, key, term.fence)  # the claim returned before the work began
        with latest.get_lock():
            latest.value = max(latest.value, term.fence)
        leading[i] = term.fence
        try:
            while True:
                believes, asked = look(witness, term, key)
                if asked:
                    return
                if not believes:
                    break
                time.sleep(SAMPLE)
            until = time.monotonic() + LINGER
            while latest.value <= term.fence and time.monotonic() < until:
                look(witness, term, key)
                time.sleep(SAMPLE)
            look(witness, term, key)
        finally:
            leading[i] = 0

    while True:
        try:
            run_as_leader(url, NAME, TTL, work)
        except PyleaseError as exc:
            # A campaign through a healed black hole may fail: campaign again.
            witness.note("error", NAME, str(i), error=repr(exc))
            time.sleep(0.1)


@dataclass
class Round:
    kind: str
    by: str
    key: str  # the requested term's witness key: holder@fence
    fence: int
    asked_at: int  # now_ns() just before the request was sent


class Fleet:
    """The candidate processes, each through its own proxy, and the rounds played."""

    def __init__(self, witness: Witness, proxies: list[Proxy]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.witness, self.proxies = witness, proxies
        self.leading = ctx.Array("q", len(proxies))
        self.latest = ctx.Value("q", 0)
        self.procs = [
            ctx.Process(
                target=candidate,
                args=(p.dsn, witness, i, self.leading, self.latest),
                daemon=True,
            )
            for i, p in enumerate(proxies)
        ]
        for proc in self.procs:
            proc.start()

    def leader(self, other: Any, above: int, bound: float) -> tuple[int, int]:
        """(index, fence) of the process whose work runs the term the database names
        now, above ``above``: a term lost on the way (a starved keeper) is not asked."""
        limit = time.monotonic() + bound
        while True:
            row = next((r for r in other.status(NAME) if r.held), None)
            fences = list(self.leading[:])
            if row is not None and row.fence > above and row.fence in fences:
                return fences.index(row.fence), int(row.fence)
            assert time.monotonic() < limit, f"no term above {above}:\n{self.witness.story()}"
            time.sleep(0.01)

    def granted_after(self, fence: int) -> Event:
        """The first grant of a term above ``fence`` (waited for)."""
        limit = time.monotonic() + BOUND
        while self.latest.value <= fence:
            assert time.monotonic() < limit, f"nobody after {fence}:\n{self.witness.story()}"
            time.sleep(0.005)
        return next(g for g in self.witness.grants(NAME) if int(g.fields["fence"]) > fence)

    def sampled_after(self, key: str, t: int) -> None:
        """Wait until the term ``key`` sampled after ``t``: the verdict's evidence."""
        limit = time.monotonic() + BOUND
        while not any(e.holder == key and e.kind == "belief" and e.t > t for e in self.events()):
            assert time.monotonic() < limit, f"{key} never sampled again:\n{self.witness.story()}"
            time.sleep(0.05)

    def events(self) -> list[Event]:
        return self.witness.events()

    def signal(self, i: int, signum: int) -> None:
        pid = self.procs[i].pid
        assert pid is not None
        self.witness.note(signal.Signals(signum).name, NAME, worker=pid)
        os.kill(pid, signum)

    def play(self, other: Any, kind: str, number: int, i: int, fence: int) -> Round:
        """Ask the term ``fence`` (process ``i``) to step down under the fault ``kind``."""
        key = next(e.holder for e in self.witness.grants(NAME) if e.fields["fence"] == fence)
        by = f"round-{number}-{kind}"
        if kind.startswith("stop"):
            self.signal(i, signal.SIGSTOP)
        elif kind == "blackhole":
            self.proxies[i].set(BLACKHOLE)
            self.witness.note("blackhole", NAME, key)
        asked_at = now_ns()
        self.witness.note("request", NAME, key, by=by)
        assert other.request_release(NAME, by), f"{by}: the lease was not held"
        if kind == "stop-short":
            time.sleep(STOP_SHORT)
            self.signal(i, signal.SIGCONT)
        grant = self.granted_after(fence)
        if kind == "stop-long":
            self.signal(i, signal.SIGCONT)
            self.sampled_after(key, grant.t)
        elif kind == "blackhole":
            self.sampled_after(key, grant.t)
            self.proxies[i].set(FORWARD)
            self.witness.note("healed", NAME, key)
        return Round(kind, by, key, fence, asked_at)

    def close(self) -> None:
        for proc in self.procs:
            if proc.pid is not None and proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            proc.join(BOUND)


def believing_spans(events: list[Event]) -> dict[str, tuple[int, int]]:
    """Per term: its first and last believing sample (a belief only ever ends)."""
    spans: dict[str, list[int]] = {}
    for e in events:
        if e.kind == "belief" and e.believes:
            span = spans.setdefault(e.holder, [e.t, e.t])
            span[0], span[1] = min(span[0], e.t), max(span[1], e.t)
    return {key: (a, b) for key, (a, b) in spans.items()}


def overlapping(events: list[Event]) -> list[tuple[str, str]]:
    """Pairs of terms whose believing spans overlap: two believers at one moment."""
    ordered = sorted(believing_spans(events).items(), key=lambda item: item[1][0])
    return [
        (one, two)
        for n, (one, (_, end)) in enumerate(ordered)
        for two, (start, _) in ordered[n + 1 :]
        if start <= end
    ]


def judge(witness: Witness, rounds: list[Round]) -> None:
    events = witness.events()
    story = witness.story()
    witness.assert_sound()
    assert overlapping(events) == [], story
    grants = [e for e in events if e.kind == "grant"]
    for r in rounds:
        mine = [e for e in events if e.kind == "belief" and e.holder == r.key]
        believed = [e.t for e in mine if e.believes]
        nxt = next(g for g in grants if int(g.fields["fence"]) > r.fence)
        # The requested term stopped believing before anybody else was granted.
        assert believed and max(believed) < nxt.t, f"{r}\n{story}"
        took = (nxt.t - r.asked_at) / 1e9
        assert took <= HANDOVER, f"{r.by}: the next term came {took:.1f}s after the request"
        asked = [e for e in mine if e.fields.get("asked")]
        assert all(e.fields["by"] == r.by for e in asked), f"{r}\n{story}"
        if r.kind == "plain":
            # Told of the request, unless starved past its ttl (told of the loss then).
            lost = any(not e.believes for e in mine)
            assert asked or lost, f"{r.by}: the leader never learnt the request\n{story}"
        if r.kind in ("stop-long", "blackhole"):
            # Judged past the grant: it sampled after it, and did not believe.
            after = [e for e in mine if e.t > nxt.t]
            assert after and not any(e.believes for e in after), f"{r}\n{story}"
    # A request belongs to its tenure: nobody else is ever told of it.
    requested = {r.key for r in rounds}
    told = {e.holder for e in events if e.kind == "belief" and e.fields.get("asked")}
    assert told <= requested, f"told but never asked: {told - requested}\n{story}"
    # Leaders learnt their requests, one resumed well within its ttl among them (one
    # of each is enough: starved past its ttl, a leader is lost instead, soundly).
    for kind in ("plain", "stop-short"):
        keys = {r.key for r in rounds if r.kind == kind}
        assert told & keys, f"no {kind} round's leader learnt its request\n{story}"


def test_leaders_asked_to_step_down_while_stopped_or_cut_off_never_overlap(
    pg: Db, tmp_path: Path
) -> None:
    witness = Witness(tmp_path / "witness.jsonl")
    other = pg.backend()
    rnd = random.Random()
    rounds: list[Round] = []
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(proxy(pg.url)) for _ in range(CANDIDATES)]
        fleet = Fleet(witness, proxies)
        stack.callback(fleet.close)
        fence = 0
        for number, kind in enumerate(KINDS * CYCLES):
            i, fence = fleet.leader(other, fence, STARTUP if number == 0 else BOUND)
            time.sleep(rnd.uniform(0.02, 0.2))  # it believed for a while
            i, fence = fleet.leader(other, fence - 1, BOUND)  # it, unless it was lost
            rounds.append(fleet.play(other, kind, number, i, fence))
    judge(witness, rounds)
