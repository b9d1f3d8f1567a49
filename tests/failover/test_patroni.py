"""What pylease promises when Patroni fails a cluster over: one etcd, three nodes.

The cluster (tests/support/patroni.py) is built once for the module and checked
healthy before every test. In each scenario a workload runs through the fault:
holders on the multi-host DSN (``target_session_attrs=read-write``) claim names,
two per name so that every release or expiry is contested, make fenced writes
(``lease_holds`` in the same statement) and report their belief to the witness; one
holder per test keeps a long lease through the whole fault, and in synchronous mode two
``run_as_leader`` candidates lead in short terms through it. The verdict is read on
the final leader: no fence issued twice, no fenced write accepted from a stale
holder, no holder that still believed after the lease was granted to another, and in
synchronous mode no acknowledged grant or fenced write lost.

Tests assert outcomes, never durations. The times they print (``-s``) are what
docs/high-availability.md reports.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import (
    DatabaseUnavailable,
    Held,
    LeaseBusy,
    LeaseLost,
    PyleaseError,
    lease,
    run_as_leader,
)
from tests.support.fenced_command import FENCED_WRITE
from tests.support.patroni import BOUND, MAXIMUM_LAG, TTL, Cluster, Node, cluster, wait_until
from tests.support.witness import Witness

ROOT = Path(__file__).resolve().parents[2]
# A liveness bound: the first test also builds the cluster, which a loaded machine
# may take a minute to do. One worker runs the module (make test's parallel workers),
# so the cluster is built once.
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("patroni")]
# Shorter than any unplanned failover here: such a lease is lost, and its holder
# must be told before a contender is granted it on the new primary.
SHORT_TTL = 6.0
# Longer than a failover takes here (about 10-20 s), so its keeper rides it out.
LONG_TTL = 60.0
HOLD = 0.4
# A waiter's wait that outlasts Patroni's leader key by as much again.
WAITER_WAIT = 2.0 * TTL


def say(line: str) -> None:
    # Measurements for docs/high-availability.md: shown with -s, harmless otherwise.
    print(f"patroni: {line}", file=sys.stderr)


def floor(timeline: int) -> int:
    """The first fence a grant on ``timeline`` may take (timeline-floored fences)."""
    return ((timeline - 1) << 40) + 1


@pytest.fixture(scope="module")
def patroni() -> Iterator[Cluster]:
    with cluster(synchronous=True) as made:
        yield made


def _ready(made: Cluster, synchronous: bool) -> Cluster:
    made.heal()
    made.wait_healthy()
    made.set_synchronous(synchronous)
    made.wait_healthy()
    return made


@pytest.fixture
def sync_cluster(patroni: Cluster) -> Iterator[Cluster]:
    yield _ready(patroni, synchronous=True)
    patroni.heal()


@pytest.fixture
def async_cluster(patroni: Cluster) -> Iterator[Cluster]:
    yield _ready(patroni, synchronous=False)
    patroni.heal()


@pytest.fixture
def witness(tmp_path: Path) -> Witness:
    path = tmp_path / "witness.jsonl"
    path.touch(mode=0o666)
    return Witness(path)


# The workload ------------------------------------------------------------------------


@dataclass
class Workload:
    """Holders that contend for names through a fault; see the module docstring."""

    cluster: Cluster
    witness: Witness
    names: list[str]
    keeper: str  # the name whose holder keeps it, as long as it can, until stop
    # A name two run_as_leader candidates campaign for, leading in short terms ("": none).
    elected: str = ""
    grants: list[tuple[str, str, int]] = field(default_factory=list)
    writes: list[tuple[str, str, int, int]] = field(default_factory=list)
    refused: list[tuple[str, str, int]] = field(default_factory=list)
    lost: list[tuple[str, str, int, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    keeper_fences: list[int] = field(default_factory=list)
    # Keeper tenures that lasted until the workload stopped, never lost.
    kept: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._worker, args=(name, f"w{i}"), daemon=True)
            for name in [*self.names, self.keeper]
            for i in range(2)
        ]
        if self.elected:
            self.threads += [
                threading.Thread(target=self._candidate, args=(f"c{i}",), daemon=True)
                for i in range(2)
            ]

    def __enter__(self) -> Workload:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(BOUND)
        assert not any(t.is_alive() for t in self.threads), "a workload thread hangs"

    def _worker(self, name: str, who: str) -> None:
        keeping = name == self.keeper
        ttl = LONG_TTL if keeping else SHORT_TTL
        writer: list[psycopg.Connection[Any]] = []
        try:
            while not self.stop.is_set():
                holder = f"{name}-{who}-{uuid.uuid4().hex[:6]}"
                try:
                    with lease(
                        self.cluster.dsn, name, ttl, holder=holder, wait=2, poll_interval=0.2
                    ) as held:
                        self.witness.grant(name, holder, held.fence)
                        with self.lock:
                            self.grants.append((name, holder, held.fence))
                            if keeping:
                                self.keeper_fences.append(held.fence)
                        until = time.monotonic() + (BOUND * 10 if keeping else HOLD)
                        while time.monotonic() < until and not self.stop.is_set():
                            if not self.witness.sample(held, who=who):
                                break
                            self._write(writer, name, holder, held.fence)
                            self.stop.wait(0.05)
                        if keeping and self.stop.is_set() and self.witness.sample(held, who=who):
                            with self.lock:
                                self.kept.append(held.fence)
                except LeaseLost as exc:
                    with self.lock:
                        self.lost.append((name, holder, 0, exc.reason))
                except LeaseBusy:
                    pass
                except DatabaseUnavailable:
                    self.stop.wait(0.2)  # no primary yet: a failover is under way
                except PyleaseError as exc:
                    with self.lock:
                        self.failures.append(f"{name}: {exc!r}")
                    self.stop.wait(0.2)
        finally:
            for conn in writer:
                conn.close()

    def _candidate(self, who: str) -> None:
        """A leader: run_as_leader, whose work makes fenced writes while its term lasts."""
        name = self.elected
        writer: list[psycopg.Connection[Any]] = []

        def work(term: Held) -> None:
            self.witness.grant(name, term.holder, term.fence)
            with self.lock:
                self.grants.append((name, term.holder, term.fence))
            until = time.monotonic() + 5 * HOLD
            while time.monotonic() < until and not self.stop.is_set():
                if not self.witness.sample(term, who=who):
                    return
                self._write(writer, name, term.holder, term.fence)
                self.stop.wait(0.05)

        try:
            while not self.stop.is_set():
                try:
                    run_as_leader(
                        self.cluster.dsn, name, SHORT_TTL, work, stop=self.stop, poll_interval=0.2
                    )
                except LeaseLost as exc:
                    with self.lock:
                        self.lost.append((name, who, 0, exc.reason))
                except DatabaseUnavailable:
                    self.stop.wait(0.2)  # no primary yet: a failover is under way
                except PyleaseError as exc:
                    with self.lock:
                        self.failures.append(f"{name}: {exc!r}")
                    self.stop.wait(0.2)
        finally:
            for conn in writer:
                conn.close()

    def _write(
        self, writer: list[psycopg.Connection[Any]], name: str, holder: str, fence: int
    ) -> None:
        try:
            if not writer:
                writer.append(psycopg.connect(self.cluster.dsn, autocommit=True))
            row = writer[0].execute(FENCED_WRITE, (name, holder, fence) * 2).fetchone()
        except psycopg.Error:
            # Its outcome is unknown (the reply was lost): neither acknowledged nor refused.
            for conn in writer:
                conn.close()
            writer.clear()
            return
        with self.lock:
            if row is None:
                self.refused.append((name, holder, fence))
            else:
                self.writes.append((name, holder, fence, row[0]))

    def granted_on(self, timeline: int) -> int:
        """How many grants of the churned names took a fence of ``timeline`` or later."""
        with self.lock:
            return sum(1 for n, _h, f in self.grants if n != self.keeper and f >= floor(timeline))

    def elected_on(self, timeline: int) -> bool:
        """Whether a run_as_leader candidate began a term on ``timeline`` or later."""
        with self.lock:
            return any(n == self.elected and f >= floor(timeline) for n, _h, f in self.grants)

    def progress(self) -> int:
        with self.lock:
            return len(self.grants) + len(self.writes)


def verdict(
    final: Node, work: Workload, witness: Witness, *, nothing_lost: bool, also: tuple[str, ...] = ()
) -> None:
    """The promises, checked on the final leader; see the module docstring.

    ``also``: names held outside the workload (whose grants the witness has).
    """
    witness.assert_sound()
    names = [*work.names, work.keeper, *([work.elected] if work.elected else []), *also]
    for name in also:
        for grant in witness.grants(name):
            work.grants.append((name, grant.holder, int(grant.fields["fence"])))
    # No fence issued twice: not to the holders, not in the final leader's history.
    by_fence: dict[tuple[str, int], set[str]] = {}
    for name, holder, fence in work.grants:
        by_fence.setdefault((name, fence), set()).add(holder)
    history = final.query(
        "SELECT h.name, h.holder, h.fence FROM unnest(%s::text[]) AS n(name), "
        "LATERAL lease_history(n.name, NULL, 10000) AS h WHERE h.event <> 'released'",
        (names,),
    )
    for name, holder, fence in history:
        by_fence.setdefault((name, fence), set()).add(holder)
    twice = {key: holders for key, holders in by_fence.items() if len(holders) > 1}
    assert not twice, f"fences issued to more than one holder: {twice}"
    # No stale fenced write: per name, in commit order, fences never go back, and each
    # row's fence is the one its holder was granted.
    rows = final.query(
        "SELECT id, name, holder, fence FROM fenced_writes WHERE name = ANY(%s) ORDER BY id",
        (names,),
    )
    newest: dict[str, int] = {}
    for row_id, name, holder, fence in rows:
        assert fence >= newest.get(name, 0), f"stale write accepted: {row_id} {name} {fence}"
        newest[name] = fence
        assert by_fence.get((name, fence)) in (None, {holder}), (row_id, name, holder, fence)
    if nothing_lost:
        kept = {(n, h, f) for n, h, f in history}
        missing = [g for g in work.grants if g not in kept]
        assert not missing, f"acknowledged grants lost in the failover: {missing}"
        stored = {(n, h, f, i) for i, n, h, f in rows}
        lost_writes = [w for w in work.writes if w not in stored]
        assert not lost_writes, f"acknowledged fenced writes lost: {lost_writes[:10]}"
    assert not work.failures, work.failures


def run_until(what: str, predicate: Any, timeout: float = BOUND) -> None:
    wait_until(predicate, timeout=timeout, what=what, every=0.1)


def names(prefix: str) -> tuple[list[str], str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{prefix}-{tag}-{i}" for i in range(3)], f"{prefix}-{tag}-keeper"


@contextlib.contextmanager
def leaving_lost(block: Any) -> Iterator[Any]:
    """``block``, whose lease the test means to lose: leaving it must raise LeaseLost."""
    with pytest.raises(LeaseLost), block as held:
        yield held


# Synchronous mode ---------------------------------------------------------------------


def test_switchover_loses_nothing_and_the_keepers_keep_their_leases(
    sync_cluster: Cluster, witness: Witness, tmp_path: Path
) -> None:
    old = sync_cluster.wait_leader()
    candidate = next(
        sync_cluster.node(m["name"])
        for m in sync_cluster.members()
        if m.get("role") == "sync_standby"
    )
    timeline = old.timeline()
    churn, keeper = names("switch")
    run_name = f"{keeper}-run"
    stop_file = tmp_path / "stop"
    # `pylease run` holds a lease of its own for a command that makes fenced writes
    # and reports to the witness until told to stop.
    env = {k: v for k, v in os.environ.items() if k not in ("PYLEASE_DSN", "DATABASE_URL")}
    run = subprocess.Popen(
        [sys.executable, "-m", "pylease", "run", run_name, "--ttl", f"{LONG_TTL:g}s",
         "--dsn", sync_cluster.url, "--",
         sys.executable, str(ROOT / "tests" / "support" / "fenced_command.py"),
         str(witness.path), str(stop_file)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with Workload(sync_cluster, witness, churn, keeper, f"{keeper}-leader") as work:
            run_until("the workload to start", lambda: work.progress() > 20 and work.keeper_fences)
            run_until("pylease run to hold", lambda: witness.grants(run_name))
            count = "SELECT count(*) FROM fenced_writes WHERE name = %s"
            run_until("the command to write", lambda: old.query(count, (run_name,))[0][0])
            before = old.query(count, (run_name,))[0][0]
            started = time.monotonic()
            sync_cluster.switchover(candidate)
            new = sync_cluster.wait_leader(other_than=old)
            took = time.monotonic() - started
            assert new is candidate
            assert new.timeline() == timeline + 1
            run_until("grants on the new timeline", lambda: work.granted_on(timeline + 1) >= 3)
            run_until("a term on the new timeline", lambda: work.elected_on(timeline + 1))
            sync_cluster.wait_healthy()
        stop_file.touch()
        out, err = run.communicate(timeout=BOUND)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, (out, err)
    say(f"switchover: {took:.1f}s from the request to a new leader taking writes")
    verdict(new, work, witness, nothing_lost=True, also=(run_name,))
    # The long leases rode it out: the first tenure lasted to the end, never lost.
    assert work.kept[:1] == work.keeper_fences[:1], (work.keeper_fences, work.kept, work.lost)
    assert len(witness.grants(run_name)) == 1
    assert new.query(count, (run_name,))[0][0] > before  # its fence still held on the new primary


def _crash_or_cut(
    made: Cluster, witness: Witness, prefix: str, fault: str
) -> tuple[Node, Node, Workload, float]:
    """Run the workload through ``fault`` on the leader; (old, new leader, work, seconds)."""
    old = made.wait_leader()
    timeline = old.timeline()
    churn, keeper = names(prefix)
    with Workload(made, witness, churn, keeper, f"{keeper}-leader") as work:
        run_until("the workload to start", lambda: work.progress() > 20 and work.keeper_fences)
        started = time.monotonic()
        if fault == "postmaster":
            old.kill_postmaster()
        else:
            made.cut_from_dcs(old)
        # Until it notices, the old leader may still answer as one: wait for the change.
        found: list[Node] = []

        def changed() -> bool:
            found[:] = [made.wait_leader()]
            return found[0].timeline() > timeline

        run_until("a leader on a new timeline", changed)
        new = found[0]
        took = time.monotonic() - started
        run_until("grants on the new timeline", lambda: work.granted_on(new.timeline()) >= 3)
        run_until("a term on the new timeline", lambda: work.elected_on(new.timeline()))
    return old, new, work, took


def test_sigkill_of_the_leaders_postmaster(sync_cluster: Cluster, witness: Witness) -> None:
    old_timeline = sync_cluster.wait_leader().timeline()
    old, new, work, took = _crash_or_cut(sync_cluster, witness, "postmaster", "postmaster")
    assert new.timeline() > old_timeline
    where = "the same node" if new is old else f"{new.name}"
    say(f"postmaster SIGKILL: {took:.1f}s to a leader taking writes again, on {where}")
    verdict(new, work, witness, nothing_lost=True)
    sync_cluster.wait_healthy()


def test_leader_cut_off_from_etcd_demotes_itself(sync_cluster: Cluster, witness: Witness) -> None:
    primaries: list[int] = []
    watching = threading.Event()

    def count_primaries() -> None:
        while not watching.is_set():
            primaries.append(len(sync_cluster.primaries()))
            time.sleep(0.1)

    watcher = threading.Thread(target=count_primaries, daemon=True)
    watcher.start()
    try:
        old, new, work, took = _crash_or_cut(sync_cluster, witness, "cut", "dcs")
    finally:
        watching.set()
        watcher.join(BOUND)
    assert new is not old
    # The old leader stopped taking writes by itself (its relay to etcd is still cut).
    assert not old.is_primary()
    assert max(primaries) == 1, "two primaries at once"
    say(f"leader cut off from etcd: {took:.1f}s until another node took writes")
    verdict(new, work, witness, nothing_lost=True)
    sync_cluster.heal()
    sync_cluster.wait_healthy()


def test_etcd_unreachable_without_failsafe_mode_no_node_takes_writes(
    sync_cluster: Cluster, witness: Witness
) -> None:
    old = sync_cluster.wait_leader()
    churn, keeper = names("etcd-down")
    with Workload(sync_cluster, witness, churn, keeper) as work:
        run_until("the workload to start", lambda: work.progress() > 20 and work.keeper_fences)
        started = time.monotonic()
        sync_cluster.etcd_unreachable()
        # The leader cannot renew its key: it demotes itself rather than risk a second primary.
        run_until("the leader to stop taking writes", lambda: not sync_cluster.primaries())
        demoted = time.monotonic() - started
        at = work.progress()
        sync_cluster.heal()
        new = sync_cluster.wait_leader()
        back = time.monotonic() - started
        run_until("the workload to go on", lambda: work.progress() > at + 20)
    say(f"etcd unreachable, no failsafe_mode: the leader demoted after {demoted:.1f}s; "
        f"{back - demoted:.1f}s from etcd answering again to a leader taking writes "
        f"({'the same node' if new is old else 'another node'})")  # fmt: skip
    verdict(new, work, witness, nothing_lost=True)


def test_etcd_unreachable_with_failsafe_mode_the_leader_goes_on(
    sync_cluster: Cluster, witness: Witness
) -> None:
    sync_cluster.patch_config(failsafe_mode=True)
    try:
        run_until("the failsafe topology in etcd", sync_cluster.failsafe_ready)
        leader = sync_cluster.wait_leader()
        churn, keeper = names("failsafe")
        with Workload(sync_cluster, witness, churn, keeper) as work:
            run_until("the workload to start", lambda: work.progress() > 20 and work.keeper_fences)
            sync_cluster.etcd_unreachable()
            active = lambda: sync_cluster.failsafe_active(leader)  # noqa: E731
            run_until("failsafe mode to keep the leader", active)
            # Past the leader key's expiry: without failsafe mode nobody would lead now.
            run_until("the leader key to expire", lambda: sync_cluster.leader_key() is None)
            at = len(work.grants)
            run_until("grants while etcd is unreachable", lambda: len(work.grants) > at + 10)
            assert sync_cluster.primaries() == [leader]
            assert sync_cluster.failsafe_active(leader)
            say(f"etcd unreachable, failsafe_mode: {leader.name} went on leading, "
                f"{len(work.grants) - at} grants after its leader key expired")  # fmt: skip
        sync_cluster.heal()
    finally:
        sync_cluster.heal()
        sync_cluster.patch_config(failsafe_mode=False)
    verdict(leader, work, witness, nothing_lost=True)
    assert work.kept[:1] == work.keeper_fences[:1], (work.keeper_fences, work.kept, work.lost)
    assert not work.lost


# Asynchronous mode -------------------------------------------------------------------


def test_async_lag_loses_grants_their_holders_are_told_and_fences_stay_unique(
    async_cluster: Cluster, witness: Witness
) -> None:
    old = async_cluster.wait_leader()
    timeline = old.timeline()
    churn, keeper = names("lag")
    lagging = [f"{keeper}-lag-{i}" for i in range(3)]
    told: dict[str, list[LeaseLost]] = {name: [] for name in lagging}
    held_in_lag = []
    with contextlib.ExitStack() as stack, Workload(async_cluster, witness, churn, keeper) as work:
        run_until("the workload to start", lambda: work.progress() > 20 and work.keeper_fences)
        # The grants below reach the old primary only.
        async_cluster.stop_replication_from(old)
        for name in lagging:
            held = stack.enter_context(
                leaving_lost(lease(async_cluster.dsn, name, LONG_TTL, on_lost=told[name].append))
            )
            witness.grant(name, held.holder, held.fence)
            stack.enter_context(witness.watching(held))
            held_in_lag.append(held)
        started = time.monotonic()
        old.kill()
        # Every fence the old primary issued (nothing is granted until a promotion).
        with work.lock:
            issued = max([f for _n, _h, f in work.grants] + [h.fence for h in held_in_lag])
        new = async_cluster.wait_leader(other_than=old)
        took = time.monotonic() - started
        assert new.timeline() > timeline
        # Each lost grant is reported at its holder's first renewal on the new primary.
        for held in held_in_lag:
            run_until(f"{held.name}'s holder to be told", lambda h=held: h.lost)
        # Only then may anyone else have it: contenders on the new primary.
        for held in held_in_lag:
            with pytest.raises(LeaseLost):
                held.check()
            with lease(async_cluster.dsn, held.name, SHORT_TTL, wait=BOUND) as other:
                witness.grant(held.name, other.holder, other.fence)
                assert other.fence >= floor(new.timeline()) > issued
                row = new.query(FENCED_WRITE, (held.name, held.holder, held.fence) * 2)
                assert row == [], "a stale holder's fenced write was accepted"
                assert new.query(FENCED_WRITE, (held.name, other.holder, other.fence) * 2)
        run_until("grants on the new timeline", lambda: work.granted_on(new.timeline()) >= 3)
    say(f"async, node SIGKILL: {took:.1f}s to a new leader taking writes")
    for name in lagging:
        assert len(told[name]) == 1 and "no longer ours" in told[name][0].reason, told[name]
    assert not new.query("SELECT 1 FROM lease_status() WHERE name = ANY(%s) AND fence < %s",
                         (lagging, floor(new.timeline())))  # fmt: skip
    verdict(new, work, witness, nothing_lost=False)
    async_cluster.heal()
    async_cluster.wait_healthy()


def test_a_lag_above_maximum_lag_on_failover_promotes_nobody(
    async_cluster: Cluster, witness: Witness
) -> None:
    old = async_cluster.wait_leader()
    churn, keeper = names("max-lag")
    primaries: list[int] = []
    failed: list[BaseException] = []

    def wait_for_the_keepers_lease() -> None:
        try:
            with lease(async_cluster.dsn, keeper, SHORT_TTL, wait=WAITER_WAIT, poll_interval=0.2):
                pass
        except BaseException as exc:
            failed.append(exc)

    with Workload(async_cluster, witness, churn, keeper) as work:
        run_until("the workload to start", lambda: work.progress() > 20 and work.keeper_fences)
        async_cluster.stop_replication_from(old)
        # More WAL than maximum_lag_on_failover, which no standby receives.
        old.query("CREATE TABLE IF NOT EXISTS ballast AS SELECT repeat('x', 1000) AS b "
                  "FROM generate_series(1, 4000)")  # fmt: skip

        def lagging() -> bool:
            replicas = [m for m in async_cluster.members() if m.get("role") != "leader"]
            return len(replicas) == 2 and all(
                isinstance(m.get("lag"), int) and m["lag"] > MAXIMUM_LAG for m in replicas
            )

        run_until("Patroni to see both standbys lag", lagging)
        # A waiter that reached the primary: from the crash on, it meets no primary.
        waiter = threading.Thread(target=wait_for_the_keepers_lease, daemon=True)
        waiter.start()
        run_until(
            "the waiter to wait",
            lambda: old.query(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'pylease-listen'"
            ),
        )
        old.kill()
        while waiter.is_alive():
            primaries.append(len(async_cluster.primaries()))
            waiter.join(0.2)
        members = async_cluster.members()
        async_cluster.heal()
        new = async_cluster.wait_leader()
        at = work.progress()
        run_until("the workload to go on", lambda: work.progress() > at + 20)
    assert max(primaries) == 0, "a standby that lacked the primary's WAL was promoted"
    assert not [m for m in members if m.get("role") == "leader"], members
    assert len(failed) == 1 and isinstance(failed[0], DatabaseUnavailable), failed
    assert new is old
    say(f"lag above maximum_lag_on_failover: no promotion; the waiter failed with {failed[0]!r}")
    # Nobody was promoted, so the restarted old primary still has everything it acknowledged.
    verdict(new, work, witness, nothing_lost=True)
