"""Section 8: leader election. How long a service is leaderless when its leader stops.

Candidates are processes of their own running ``run_as_leader`` with a 2 s ttl. The
parent signals the leader (SIGTERM: it resigns, then exits; SIGKILL: it just dies)
and the standby stamps CLOCK_MONOTONIC when ``on_started_leading`` runs; the parent
stamped the same clock before the signal. Two standbys wait at every handover, and a
replacement for the old leader starts meanwhile, so no start-up is timed.

Also measured, for the choice ``watch_leader`` rests on (a grant does not NOTIFY):
how late a watcher sees a grant after a vacancy and a steal, and what a NOTIFY in
every granting claim would cost that claim.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._core import Context, Section, Target, unique
from benchmarks._stats import fmt_time, percentile

TTL = 2.0
SIGTERM_HANDOVERS = 50
SIGKILL_HANDOVERS = 10
WATCHES = 6  # grants watched, of each kind
NOTIFY_CYCLES = 100  # claim+release cycles per client and round, with and without NOTIFY
# client-go's leaderelection defaults, for scale (LeaseDuration, RenewDeadline, RetryPeriod).
CLIENT_GO = (15.0, 10.0, 2.0)

CANDIDATE = r"""
import os, sys, time
from pylease import run_as_leader

dsn, name, ttl, out = sys.argv[1:5]
pid = os.getpid()
holder = f"cand-{pid}"

def note(line):
    with open(out, "a") as f:
        f.write(line + "\n")

def started(term):
    note(f"lead {pid} {term.fence} {time.monotonic_ns()}")

def new(info):
    if info is not None and info.holder != holder:
        note(f"standby {pid} {info.fence}")

def work(term):
    while not term.lost:
        time.sleep(0.05)

run_as_leader(dsn, name, float(ttl), work, holder=holder,
              on_started_leading=started, on_new_leader=new)
"""


class Candidates:
    """Candidate processes for one name, and what they wrote."""

    def __init__(self, dsn: str, name: str, ttl: float, workdir: str) -> None:
        self.dsn, self.name, self.ttl = dsn, name, ttl
        self.dir = Path(tempfile.mkdtemp(prefix="leader-", dir=workdir))
        self.script = self.dir / "candidate.py"
        self.script.write_text(CANDIDATE)
        self.out = self.dir / "events.txt"
        self.out.touch()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, str(self.script), self.dsn, self.name, repr(self.ttl), str(self.out)],
            stdin=subprocess.DEVNULL,
        )
        self.procs[proc.pid] = proc

    def events(self) -> list[list[str]]:
        return [line.split() for line in self.out.read_text().splitlines()]

    def wait_ready(self, above: int, deadline: float = 60.0) -> tuple[int, int]:
        """Wait for a leader above fence ``above`` and two standbys seeing it: (pid, fence)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            events = self.events()
            leads = [e for e in events if e[0] == "lead" and int(e[2]) > above]
            if leads:
                pid, fence = int(leads[-1][1]), int(leads[-1][2])
                standbys = {int(e[1]) for e in events if e[0] == "standby" and int(e[2]) == fence}
                alive = {p for p, proc in self.procs.items() if proc.poll() is None}
                if len((standbys & alive) - {pid}) >= 2:
                    return pid, fence
            time.sleep(0.01)
        raise RuntimeError("bench: candidates did not get ready in time")

    def lead_at(self, fence: int, deadline: float = 60.0) -> float:
        """The monotonic time (s) at which the first term above ``fence`` began."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            leads = [e for e in self.events() if e[0] == "lead" and int(e[2]) > fence]
            if leads:
                return int(leads[0][3]) / 1e9
            time.sleep(0.005)
        raise RuntimeError("bench: no standby took over in time")

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


def failovers(ctx: Context, plan: list[tuple[int, int]], ttl: float) -> dict[int, list[float]]:
    """Seconds from the signal to a standby leading, per signal, as many times as planned."""
    cands = Candidates(ctx.dsn, unique("leader-failover"), ttl, ctx.workdir)
    times: dict[int, list[float]] = {}
    try:
        for _ in range(4):  # a leader, two standbys, and one more starting
            cands.start()
        last = 0
        for signum, count in plan:
            for _ in range(count):
                pid, last = cands.wait_ready(last)
                # A leader renews every ttl/3: kill it at a random point of that cycle,
                # as a crash would, so its term has 2/3 to all of a ttl left.
                time.sleep(random.uniform(0, ttl / 3))
                sent = time.monotonic()
                os.kill(pid, signum)
                times.setdefault(signum, []).append(cands.lead_at(last) - sent)
                cands.procs.pop(pid).wait(timeout=30)
                cands.start()
    finally:
        cands.stop()
    return times


def watch_latency(ctx: Context, count: int) -> dict[str, list[float]]:
    """How late ``watch_leader`` yields a grant: after a vacancy, and a steal."""
    from pylease import watch_leader

    name = unique("leader-watch")
    seen: list[tuple[str, float]] = []
    cond = threading.Condition()

    def watch() -> None:
        for info in watch_leader(ctx.dsn, name):
            with cond:
                seen.append((info.holder if info else "", time.monotonic()))
                cond.notify_all()
            if info is not None and info.holder == "done":
                return

    def until(holder: str) -> float:
        with cond:
            assert cond.wait_for(lambda: any(h == holder for h, _ in seen), 30), holder
            return next(t for h, t in seen if h == holder)

    result: dict[str, list[float]] = {"grant after a vacancy": [], "steal": []}
    watcher = threading.Thread(target=watch, daemon=True)
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        watcher.start()
        until("")
        for i in range(count):
            holder = f"v{i}"
            conn.execute("SELECT lease_release(%s, %s)", (name, f"s{i - 1}"))
            time.sleep(0.05)  # the watcher has seen nobody lead; a standby claims
            sent = time.monotonic()
            conn.execute("SELECT lease_claim(%s, '1 min', %s)", (name, holder))
            result["grant after a vacancy"].append(until(holder) - sent)
            time.sleep(0.05)
            sent = time.monotonic()
            conn.execute("SELECT lease_steal(%s, '1 min', %s)", (name, f"s{i}"))
            result["steal"].append(until(f"s{i}") - sent)
        conn.execute("SELECT lease_steal(%s, '1 min', 'done')", (name,))
    watcher.join(30)
    return result


PLAIN_CLAIM = "SELECT lease_claim(%(name)s, '1 min', 'h')"
NOTIFYING_CLAIM = "SELECT lease_claim(%(name)s, '1 min', 'h'), pg_notify('pylease', %(name)s)"


def _cycles(
    conn: psycopg.Connection[Any], name: str, claim: str, n: int, go: threading.Barrier
) -> None:
    go.wait()
    for _ in range(n):
        conn.execute(claim, {"name": name})
        conn.execute("SELECT lease_release(%s, 'h')", (name,))


def notify_cost(ctx: Context, cycles: int, workers: int, flush: bool) -> dict[str, float]:
    """Claim + release cycles per second, with and without a NOTIFY in the granting claim.

    ``workers`` clients cycle names of their own at once (a NOTIFY makes every notifying
    commit of the cluster take one global lock in turn). Without ``flush``, the
    sessions skip the WAL flush, so that the NOTIFY's own cost is not lost in the
    fsync's noise. Median of interleaved rounds.
    """
    rates: dict[str, list[float]] = {"plain": [], "notify": []}
    conns = [psycopg.connect(ctx.dsn, autocommit=True) for _ in range(workers)]
    try:
        for c in conns:
            c.execute("SET synchronous_commit = " + ("on" if flush else "off"))
        for round_ in range(6):
            kind = ("plain", "notify")[round_ % 2]
            claim = PLAIN_CLAIM if kind == "plain" else NOTIFYING_CLAIM
            go = threading.Barrier(workers + 1)
            threads = [
                threading.Thread(target=_cycles, args=(c, unique("leader-nfy"), claim, cycles, go))
                for c in conns
            ]
            for t in threads:
                t.start()
            go.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            rates[kind].append(workers * cycles / (time.perf_counter() - t0))
    finally:
        for c in conns:
            c.close()
    return {kind: statistics.median(values) for kind, values in rates.items()}


def bench_leader(ctx: Context) -> Section:
    ttl = 0.5 if ctx.smoke else TTL
    full = (SIGTERM_HANDOVERS, SIGKILL_HANDOVERS, WATCHES, NOTIFY_CYCLES)
    terms, kills, watches, cycles = (1, 1, 1, 10) if ctx.smoke else full
    section = Section(
        "leader",
        f"8. Leader election: failover with a {ttl:g} s ttl (run_as_leader, two standbys)",
        header=["leader", "handovers", "p50", "p90", "max", "p50 / ttl"],
    )
    sigterm = Target(
        "8-failover-sigterm",
        "Failover after SIGTERM (p50, multiple of the ttl)",
        "median time from the leader's SIGTERM to a standby leading, over the ttl",
        goal=0.05,
        higher_is_better=False,
    )
    sigkill = Target(
        "8-failover-sigkill",
        "Failover after SIGKILL (p50, multiple of the ttl)",
        "median time from the leader's SIGKILL to a standby leading, over the ttl",
        goal=1.05,
        higher_is_better=False,
    )
    section.targets += [sigterm, sigkill]
    data: dict[str, Any] = {"ttl": ttl}
    measured = failovers(ctx, [(signal.SIGTERM, terms), (signal.SIGKILL, kills)], ttl)
    for label, signum, target in (
        ("SIGTERM (resigns)", signal.SIGTERM, sigterm),
        ("SIGKILL (dies)", signal.SIGKILL, sigkill),
    ):
        times = measured[signum]
        p50 = percentile(times, 50)
        target.value = p50 / ttl
        target.detail = f"p50 {fmt_time(p50)} over {len(times)}"
        data[signal.Signals(signum).name] = times
        section.rows.append([
            label, str(len(times)), fmt_time(p50), fmt_time(percentile(times, 90)),
            fmt_time(max(times)), f"{p50 / ttl:.3f}x",
        ])  # fmt: skip
    lease, renew, retry = CLIENT_GO
    section.extra.append(
        {
            "title": "client-go leaderelection defaults, for scale (not measured here)",
            "header": ["leader", "standby leads after", "as a multiple of its lease"],
            "rows": [
                ["SIGTERM, ReleaseOnCancel", f"its next retry: up to {retry:g} s (jittered)",
                 f"up to {retry / lease:.2f}x"],
                ["SIGTERM, default (no release)", f"the lease: {lease:g} s + up to {retry:g} s",
                 f"{lease / lease:.2f}x to {(lease + retry) / lease:.2f}x"],
                ["SIGKILL", f"the lease: {lease:g} s + up to {retry:g} s",
                 f"{lease / lease:.2f}x to {(lease + retry) / lease:.2f}x"],
                ["(renew deadline)", f"a leader gives up after {renew:g} s without renewing", ""],
            ],
        }
    )  # fmt: skip
    seen = watch_latency(ctx, watches)
    section.extra.append(
        {
            "title": "watch_leader: from a grant's commit to the watcher yielding it",
            "header": ["grant", "n", "p50", "max"],
            "rows": [
                [kind, str(len(v)), fmt_time(percentile(v, 50)), fmt_time(max(v))]
                for kind, v in seen.items()
            ],
        }
    )
    cost = {(n, True): notify_cost(ctx, cycles, n, True) for n in (1, 4)}
    section.extra.append(
        {
            "title": "What a NOTIFY in every granting claim would cost (claim + release cycles)",
            "header": ["clients", "WAL flush", "lease_claim", "+ pg_notify", "change"],
            "rows": [
                [str(n), "on" if flush else "off", f"{c['plain']:.0f}/s",
                 f"{c['notify']:.0f}/s", f"{(c['notify'] / c['plain'] - 1) * 100:+.0f}%"]
                for (n, flush), c in cost.items()
            ],
        }
    )  # fmt: skip
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        reads = []
        for _ in range(20 if ctx.smoke else 300):
            t0 = time.perf_counter()
            conn.execute("SELECT * FROM lease_status(%s)", ("leader-watch-cost",)).fetchall()
            reads.append(time.perf_counter() - t0)
    data["status_read"] = percentile(reads, 50)
    section.notes.append(
        f"What a watcher costs instead: one lease_status read (p50 {fmt_time(data['status_read'])}"
        ") per poll_interval (1 s), per notification, and at the leader's expiry."
    )
    section.notes.append(
        "A SIGKILLed leader's term runs out between 2/3 of a ttl and a whole ttl after its "
        "last renewal (it renews every ttl/3); the standby wakes at the expiry it read."
    )
    data.update(watch=seen, notify={f"{n} clients, flush {f}": c for (n, f), c in cost.items()})
    section.data = data
    return section
