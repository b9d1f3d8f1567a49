"""One etcd and three Patroni nodes on loopback, to fail over the way users' clusters do.

Debian's ``patroni`` (3.0) and ``etcd`` (3.4), installed by scripts/test-deps.sh, run
as the ``postgres`` user (when the tests run as root) under one temp folder (in
/dev/shm when it has room, as tests/replication.py does), every port a free one on
127.0.0.1. Timings are test-sized: Patroni's ``ttl`` 10 s, ``loop_wait`` 1 s,
``retry_timeout`` 3 s; an unplanned failover then takes seconds, not a minute.

Two relays per node (tests/faultkit.py's TCP proxy) put the faults where a network
would: each node reaches etcd only through its own relay (``use_proxies``, so Patroni
never finds etcd's real address), and the standbys stream from a node through that
node's replication relay (its ``connect_address``). Black-holing a relay keeps TCP up
while nothing answers: a node cut off from etcd, or a primary whose standbys receive
nothing more (a replication lag). Clients connect to the nodes' own ports directly.

Every process is started and stopped by its pid; what a test leaves running (a node
it killed and restarted, a postmaster Patroni started) is found again by scanning
/proc for processes under the cluster's folder, so nothing outlives the module, also
when a test fails or pytest is interrupted (``atexit``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from pylease.migrate import migrate
from tests.support.faultkit import BLACKHOLE, FORWARD, Proxy
from tests.support.pgserver import free_port
from tests.support.replication import BINDIR, _as_postgres, _chown, _scratch

PATRONI = "/usr/bin/patroni"
ETCD = "/usr/bin/etcd"
# Liveness bounds only: nothing here measures speed. A loaded 2-core machine can take
# tens of seconds to bring a node back (pg_rewind, a new base backup).
BOUND = 90.0
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 3
# The most WAL a standby may lack and still be promoted (Patroni's default is 1 MB).
MAXIMUM_LAG = 1 << 20
NODES = ("node1", "node2", "node3")
FENCED_TABLE = """
CREATE TABLE IF NOT EXISTS fenced_writes (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    holder text NOT NULL,
    fence bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_bases: set[Path] = set()


def wait_until(
    predicate: Callable[[], object], timeout: float = BOUND, what: str = "it", every: float = 0.1
) -> None:
    """Poll ``predicate`` until it is truthy; AssertionError after ``timeout`` seconds.

    Every poll here is a REST call or a connection: ten a second, not fifty, on a
    machine the cluster already keeps busy.
    """
    limit = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psycopg.Error, OSError):
            if predicate():
                return
        if time.monotonic() > limit:
            raise AssertionError(f"gave up after {timeout:g}s waiting for {what}")
        time.sleep(every)


def _http(url: str, method: str = "GET", body: Any = None, timeout: float = 3.0) -> Any:
    """JSON of one REST call; raises OSError (urllib's errors are OSErrors) when it fails."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        # Patroni answers 503 with a JSON body (e.g. GET /leader on a replica).
        text = exc.read().decode()
        if method != "GET":
            raise OSError(f"{method} {url}: {exc.code} {text}") from exc
    try:
        return json.loads(text)
    except ValueError:
        return text


def _pids_under(base: Path) -> set[int]:
    """Every process whose command line names ``base``, and their descendants."""
    needle = str(base).encode()
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                found.add(pid)
            stat = (entry / "stat").read_text()
            parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    found.discard(os.getpid())
    return found


def _kill_pids(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_everything_under(base: Path) -> None:
    """SIGKILL every process of the cluster under ``base``, until none is left."""
    limit = time.monotonic() + 10
    while (pids := _pids_under(base)) and time.monotonic() < limit:
        _kill_pids(pids)
        time.sleep(0.05)


def _reap(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(10)


class Etcd:
    """One etcd member, on loopback ports, its data under ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.peer_port = free_port()
        self.data = base / "etcd"
        self.log = base / "etcd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        # Every address is given: etcd's defaults listen on localhost:2379/2380, which
        # another etcd (or another test run) may hold.
        command = [ETCD, "--name", "etcd1", "--data-dir", str(self.data),
                   "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new",
                   "--initial-cluster-token", self.base.name,
                   "--logger", "zap", "--log-level", "warn"]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command, cwd=self.base, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, **_as_postgres(),
            )  # fmt: skip
        wait_until(self.healthy, timeout=BOUND, what="etcd to answer")

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"etcd exited:\n{_tail(self.log)}")
        try:
            return bool(_http(f"{self.url}/health").get("health") == "true")
        except OSError:
            return False

    def stop(self) -> None:
        _reap(self.proc)


class Node:
    """One Patroni node: its PostgreSQL port, REST port, and its two relays."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.dir = cluster.base / name
        self.data = self.dir / "data"
        self.port = free_port()
        self.rest_port = free_port()
        self.log = self.dir / "patroni.log"
        self.config = self.dir / "patroni.yml"
        # The node's only way to etcd, and its standbys' only way to it.
        self.dcs_relay = Proxy(f"host=127.0.0.1 port={cluster.etcd.port}")
        self.replication_relay = Proxy(f"host=127.0.0.1 port={self.port}")
        self.proc: subprocess.Popen[bytes] | None = None

    # Configuration -------------------------------------------------------------------

    def write_config(self) -> None:
        self.dir.mkdir(mode=0o700, exist_ok=True)
        _chown(self.dir)
        dcs = {
            "ttl": TTL,
            "loop_wait": LOOP_WAIT,
            "retry_timeout": RETRY_TIMEOUT,
            "maximum_lag_on_failover": MAXIMUM_LAG,
            "synchronous_mode": self.cluster.synchronous,
            "failsafe_mode": False,
            "check_timeline": True,
            "postgresql": {
                "use_pg_rewind": True,
                "use_slots": True,
                # fsync=off is safe here for the reason tests/replication.py gives:
                # a SIGKILL kills processes, never the kernel's page cache.
                "parameters": {
                    "fsync": "off",
                    "full_page_writes": "on",
                    "wal_keep_size": "128MB",
                    "max_connections": 60,
                    "shared_buffers": "16MB",
                    "wal_receiver_status_interval": "1s",
                    "wal_retrieve_retry_interval": "200ms",
                    "synchronous_commit": "on",
                    # In the data directory, not /dev/shm: a SIGKILLed server's segments
                    # go away with the cluster's folder.
                    "dynamic_shared_memory_type": "mmap",
                },
            },
        }
        config = {
            "scope": self.cluster.scope,
            "namespace": "/pylease-tests/",
            "name": self.name,
            "log": {"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
            "restapi": {
                "listen": f"127.0.0.1:{self.rest_port}",
                "connect_address": f"127.0.0.1:{self.rest_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.dcs_relay.port}"], "use_proxies": True},
            "bootstrap": {
                "dcs": dcs,
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.replication_relay.port}",
                "data_dir": str(self.data),
                "bin_dir": str(BINDIR),
                "pgpass": str(self.dir / "pgpass"),
                "pg_hba": [
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.dir)},
                # A node whose timeline diverged beyond pg_rewind is rebuilt, not left out.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "watchdog": {"mode": "off"},
        }
        # JSON is YAML: no YAML writer needed here.
        self.config.write_text(json.dumps(config, indent=2))
        _chown(self.config)

    # Processes -----------------------------------------------------------------------

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [PATRONI, str(self.config)], cwd=self.dir, stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, start_new_session=True,
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": str(self.dir)},
                **_as_postgres(),
            )  # fmt: skip

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None

    def kill_postmaster(self) -> int:
        """SIGKILL this node's postmaster (Patroni stays up); its pid."""
        pid = self.postmaster_pid()
        assert pid is not None, f"{self.name} has no postmaster"
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill(self) -> None:
        """SIGKILL Patroni and every PostgreSQL process of the node, as a power cut would."""
        _reap(self.proc)
        self.proc = None
        kill_everything_under(self.dir)

    # What it says --------------------------------------------------------------------

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def is_primary(self) -> bool:
        try:
            return not self.query("SELECT pg_is_in_recovery()")[0][0]
        except psycopg.Error:
            return False

    def timeline(self) -> int:
        name = self.query("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]
        return int(name[:8], 16)

    def logtext(self) -> str:
        return _tail(self.log)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Cluster:
    """etcd, three Patroni nodes and their relays; see the module docstring."""

    def __init__(self, synchronous: bool = True) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="patroni-", dir=_scratch()))
        _bases.add(self.base)
        os.chmod(self.base, 0o755)
        _chown(self.base)
        self.scope = f"pylease-{uuid.uuid4().hex[:8]}"
        self.synchronous = synchronous
        self.etcd = Etcd(self.base)
        self.nodes: list[Node] = []

    # Lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.etcd.start()
        self.nodes = [Node(self, name) for name in NODES]
        for node in self.nodes:
            node.write_config()
        # The first bootstraps alone, so it is the one that runs initdb; the others
        # then copy it with a base backup.
        self.nodes[0].start()
        wait_until(self.nodes[0].is_primary, timeout=BOUND, what="node1 to bootstrap")
        for node in self.nodes[1:]:
            node.start()
        migrate(self.nodes[0].url, say=lambda _line: None)
        self.nodes[0].query(FENCED_TABLE)
        # Every grant in lease_history: "no acknowledged grant lost" is read from it.
        self.nodes[0].query("ALTER DATABASE postgres SET pylease.history = 'all'")
        self.wait_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            node.dcs_relay.close()
            node.replication_relay.close()
            node.kill()
        self.etcd.stop()
        kill_everything_under(self.base)
        shutil.rmtree(self.base, ignore_errors=True)
        _bases.discard(self.base)

    # Addresses -----------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """Every node, libpq picking the one that takes writes."""
        hosts = ",".join("127.0.0.1" for _ in self.nodes)
        ports = ",".join(str(node.port) for node in self.nodes)
        return (
            f"host={hosts} port={ports} user=postgres dbname=postgres "
            "target_session_attrs=read-write connect_timeout=2"
        )

    @property
    def url(self) -> str:
        """The same as :attr:`dsn`, as a URL (for ``pylease run --dsn``)."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write&connect_timeout=2"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    # What Patroni says ---------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """GET /cluster from the first node that answers; [] when none does."""
        for node in self.nodes:
            if not node.running():
                continue
            with contextlib.suppress(OSError):
                answer = _http(f"{node.rest}/cluster")
                if isinstance(answer, dict):
                    return list(answer.get("members", []))
        return []

    def leader(self) -> Node | None:
        """The node Patroni names leader and whose PostgreSQL takes writes, if any."""
        names = [m["name"] for m in self.members() if m.get("role") == "leader"]
        if len(names) != 1:
            return None
        node = self.node(names[0])
        return node if node.is_primary() else None

    def wait_leader(self, other_than: Node | None = None, timeout: float = BOUND) -> Node:
        found: list[Node] = []

        def ready() -> bool:
            node = self.leader()
            if node is None or node is other_than:
                return False
            found[:] = [node]
            return True

        wait_until(ready, timeout=timeout, what="a leader that takes writes")
        return found[0]

    def primaries(self) -> list[Node]:
        """Every node whose PostgreSQL takes writes now (more than one: a split brain)."""
        return [node for node in self.nodes if node.is_primary()]

    def config(self) -> dict[str, Any]:
        for node in self.nodes:
            with contextlib.suppress(OSError):
                answer = _http(f"{node.rest}/config")
                if isinstance(answer, dict):
                    return answer
        raise AssertionError("no node answers GET /config")

    def patch_config(self, **settings: Any) -> None:
        """Change the cluster-wide (DCS) configuration, as ``patronictl edit-config`` would."""
        leader = self.wait_leader()
        _http(f"{leader.rest}/config", "PATCH", settings)
        wait_until(
            lambda: all(self.config().get(k) == v for k, v in settings.items()),
            timeout=BOUND,
            what=f"the cluster's configuration to read {settings}",
        )

    def switchover(self, candidate: Node) -> None:
        leader = self.wait_leader()
        _http(
            f"{leader.rest}/switchover",
            "POST",
            {"leader": leader.name, "candidate": candidate.name},
            timeout=BOUND,
        )

    # Health --------------------------------------------------------------------------

    def health(self) -> str | None:
        """None when healthy, else what is wrong.

        Healthy: etcd answers; every relay forwards; three Patroni processes run; one
        leader takes writes and two standbys stream from it on its timeline; in
        synchronous mode Patroni names one of them the synchronous standby and the
        leader's PostgreSQL has it as such.
        """
        if not self.etcd.healthy():
            return "etcd does not answer"
        for node in self.nodes:
            if node.dcs_relay.mode != FORWARD or node.replication_relay.mode != FORWARD:
                return f"a relay of {node.name} is not forwarding"
            if not node.running():
                return f"{node.name}'s Patroni is not running"
        members = self.members()
        if len(members) != len(self.nodes):
            return f"Patroni lists {len(members)} members: {members}"
        leader = self.leader()
        if leader is None:
            return f"no leader that takes writes: {members}"
        try:
            rows = leader.query(
                "SELECT application_name, sync_state FROM pg_stat_replication "
                "WHERE state = 'streaming'"
            )
        except psycopg.Error as exc:
            return f"the leader does not answer: {exc}"
        streaming = {name: state for name, state in rows}
        standbys = {node.name for node in self.nodes if node is not leader}
        if set(streaming) != standbys:
            return f"streaming to the leader {leader.name}: {streaming}, want {standbys}"
        timeline = leader.timeline()
        for member in members:
            if member["name"] != leader.name and member.get("timeline") != timeline:
                return f"{member['name']} is not on the leader's timeline {timeline}: {members}"
        roles = {m["name"]: m.get("role") for m in members}
        if self.synchronous:
            sync = [name for name, role in roles.items() if role == "sync_standby"]
            if len(sync) != 1 or streaming.get(sync[0]) != "sync":
                return f"no synchronous standby: roles {roles}, sync states {streaming}"
        elif "sync" in streaming.values() or "sync_standby" in roles.values():
            return f"a synchronous standby in asynchronous mode: {roles}, {streaming}"
        return None

    def wait_healthy(self, timeout: float = BOUND) -> None:
        why: list[str | None] = [None]

        def healthy() -> bool:
            why[0] = self.health()
            return why[0] is None

        try:
            wait_until(healthy, timeout=timeout, what="the cluster to be healthy")
        except AssertionError as exc:
            logs = "\n".join(f"--- {n.name}\n{n.logtext()}" for n in self.nodes)
            raise AssertionError(f"{exc}: {why[0]}\n{logs}") from None

    def heal(self) -> None:
        """Undo what a test broke: relays forward again, a killed node runs again."""
        for node in self.nodes:
            node.dcs_relay.set(FORWARD)
            node.replication_relay.set(FORWARD)
        for node in self.nodes:
            if not node.running():
                node.start()

    def leader_key(self) -> str | None:
        """Who etcd itself names leader (read past the relays); None once the key expired."""
        key = base64.b64encode(f"/pylease-tests/{self.scope}/leader".encode()).decode()
        answer = _http(f"{self.etcd.url}/v3/kv/range", "POST", {"key": key})
        kvs = answer.get("kvs") or []
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

    def failsafe_ready(self) -> bool:
        """Failsafe mode is on and the leader has written every member into /failsafe."""
        leader = self.leader()
        if leader is None or not self.config().get("failsafe_mode"):
            return False
        topology = _http(f"{leader.rest}/failsafe")
        return isinstance(topology, dict) and set(topology) == {n.name for n in self.nodes}

    def failsafe_active(self, node: Node) -> bool:
        """``node`` runs as leader without etcd, by failsafe mode."""
        return bool(_http(f"{node.rest}/patroni").get("failsafe_mode_is_active"))

    def set_synchronous(self, synchronous: bool) -> None:
        if self.config().get("synchronous_mode") != synchronous:
            self.patch_config(synchronous_mode=synchronous)
        self.synchronous = synchronous

    # Faults --------------------------------------------------------------------------

    def cut_from_dcs(self, node: Node) -> None:
        node.dcs_relay.set(BLACKHOLE)

    def etcd_unreachable(self) -> None:
        for node in self.nodes:
            node.dcs_relay.set(BLACKHOLE)

    def stop_replication_from(self, node: Node) -> None:
        """The standbys receive nothing more from ``node``: from now on they lag."""
        node.replication_relay.set(BLACKHOLE)


@contextlib.contextmanager
def cluster(synchronous: bool = True) -> Iterator[Cluster]:
    made = Cluster(synchronous)
    try:
        made.start()
        yield made
    finally:
        made.stop()


def _kill_leftovers() -> None:
    # Last resort, should the test process end without the fixture's teardown.
    for base in list(_bases):
        kill_everything_under(base)
        shutil.rmtree(base, ignore_errors=True)


atexit.register(_kill_leftovers)
