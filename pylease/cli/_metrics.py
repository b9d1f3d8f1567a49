"""``pylease metrics``: the leases as Prometheus metrics, through ``prometheus-client``.

Read only through the lease functions (``lease_status``, ``lease_counters``,
``permit_status``), so a role that may only EXECUTE them can run it. Every series is
labelled ``name``: one series per lease name and metric, so names made per tenant or
per job multiply them. A scrape is bounded: at most ``--max-names`` names (the first in
name order), after ``--prefix`` (filtered by the database) and ``--names`` (shell-style
patterns, filtered here); ``pylease_names_omitted`` says how many matching names were
left out. Semaphores and groups are cut the same way, apart from leases: ``--max-names``
of each at most. A group's series are labelled ``group`` (its members) and ``member``
(the partitions each owns, read from the leases ``<grp>#<part>``).
"""

from __future__ import annotations

import fnmatch
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pylease._rows import PageRow


@dataclass(frozen=True)
class SemaphoreRow:
    """A semaphore's series: its permits in use, its limit, and its counters (the sums
    over its slots, as ``lease_counters`` gives them)."""

    name: str
    max_permits: int
    in_use: int
    grants: int
    takeovers: int
    steals: int
    releases: int


@dataclass(frozen=True)
class GroupSeries:
    """A group's series: its live members, and the partitions each member owns (holds
    the lease ``<grp>#<part>`` of), a member that owns none included."""

    group: str
    members: int
    owned: dict[str, int]


Row = PageRow | SemaphoreRow | GroupSeries
# (the rows to report, how many matching names were left out, the database's clock);
# raises when the database cannot answer.
Reader = Callable[[], tuple[list[Row], int, datetime]]
OnError = Callable[[Exception], None]

GAUGES = (
    ("pylease_lease_held", "1 while the lease is held (unexpired, not released), else 0."),
    (
        "pylease_lease_expires_in_seconds",
        "Seconds until a held lease expires (0 when not held).",
    ),
    ("pylease_lease_fence", "The lease's fence token: grows with every new grant."),
    (
        "pylease_lease_held_for_seconds",
        "Seconds since the current holder was granted the lease (0 when not held).",
    ),
)
PERMITS = (
    ("pylease_permits_in_use", "Permits of the semaphore held now (unexpired, not released)."),
    ("pylease_permits_max", "The semaphore's limit: at most this many permits held at once."),
)
GROUPS = (
    ("pylease_group_members", "Live members of the group."),
    (
        "pylease_group_partitions_owned",
        "Partitions of the group whose lease the member holds (label member).",
    ),
)
COUNTERS = (
    ("pylease_grants", "New tenures: claims, takeovers and steals alike."),
    (
        "pylease_takeovers",
        "Claims after the previous holder's ttl ran out without a release "
        "(a holder died or stalled).",
    ),
    ("pylease_steals", "Steals from a holder whose lease was unexpired."),
    ("pylease_releases", "Releases."),
)


def wanted(names: Sequence[str]) -> Callable[[str], bool]:
    """A filter for lease names: every name when ``names`` is empty."""
    if not names:
        return lambda _name: True
    return lambda name: any(fnmatch.fnmatchcase(name, pattern) for pattern in names)


def select(rows: list[PageRow], names: Sequence[str], max_names: int) -> tuple[list[PageRow], int]:
    """The rows to report, and how many matching names are left out of them.

    ``rows`` is the database's page: cut at ``max_names`` already when there are no
    ``names`` patterns (its ``matching`` counts the names it was cut from), else every
    name of the prefix, which the patterns filter here before the cut.
    """
    if names:
        keep = wanted(names)
        rows = [row for row in rows if keep(row.name)]
        return rows[:max_names], max(len(rows) - max_names, 0)
    matching = rows[0].matching if rows else 0
    return rows[:max_names], matching - min(len(rows), max_names)


def semaphore_rows(
    backend: Any, prefix: str, names: Sequence[str], max_names: int
) -> tuple[list[SemaphoreRow], int]:
    """The semaphores to report (at most ``max_names``, the first by name), and how
    many matching ones are left out of them."""
    from pylease.cli._permits import semaphores

    keep = wanted(names)
    found = [
        s for s in semaphores(backend.permit_status()) if s.name.startswith(prefix) and keep(s.name)
    ]
    kept = found[:max_names]
    counters = {c.name: c for c in backend.counters()} if kept else {}
    rows = []
    for sem in kept:
        c = counters.get(sem.name)
        events = (c.grants, c.takeovers, c.steals, c.releases) if c else (0, 0, 0, 0)
        rows.append(SemaphoreRow(sem.name, sem.max_permits, len(sem.held), *events))
    return rows, len(found) - len(kept)


def group_rows(
    backend: Any, prefix: str, names: Sequence[str], max_names: int
) -> tuple[list[GroupSeries], int]:
    """The groups to report (at most ``max_names``, the first by name), and how many
    matching ones are left out of them."""
    from pylease.cli._groups import groups, owned

    keep = wanted(names)
    found = [g for g in groups(backend, None, prefix) if keep(g.grp)]
    kept = found[:max_names]
    rows = []
    for g in kept:
        live = {m.member: 0 for m in backend.group_members(g.grp)}
        for holder, parts in owned(backend, g.grp).items():
            live[holder] = len(parts)
        rows.append(GroupSeries(g.grp, g.members, live))
    return rows, len(found) - len(kept)


class LeaseCollector(Collector):
    """Reads the leases at every scrape; ``pylease_up`` says whether that worked."""

    def __init__(self, read: Reader, on_error: OnError | None = None):
        self._read = read
        self._on_error = on_error

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("pylease_up", "1 if pylease could read the leases, else 0.")
        try:
            rows, omitted, now = self._read()
        except Exception as exc:
            if self._on_error is not None:
                self._on_error(exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        left_out = GaugeMetricFamily(
            "pylease_names_omitted",
            "Lease names that matched but were left out of the per-name series "
            "(more than --max-names; narrow with --prefix, or raise --max-names).",
        )
        left_out.add_metric([], omitted)
        yield left_out
        leases = [row for row in rows if isinstance(row, PageRow)]
        yield from self._gauges(leases, now)
        yield from self._permits([row for row in rows if isinstance(row, SemaphoreRow)])
        yield from self._groups([row for row in rows if isinstance(row, GroupSeries)])
        yield from self._counters([row for row in rows if not isinstance(row, GroupSeries)])

    @staticmethod
    def _groups(rows: Iterable[GroupSeries]) -> Iterator[Metric]:
        (key, doc), (owned_key, owned_doc) = GROUPS
        members = GaugeMetricFamily(key, doc, labels=["group"])
        owned = GaugeMetricFamily(owned_key, owned_doc, labels=["group", "member"])
        for row in rows:
            members.add_metric([row.group], row.members)
            for member, count in sorted(row.owned.items()):
                owned.add_metric([row.group, member], count)
        yield members
        yield owned

    @staticmethod
    def _permits(rows: Iterable[SemaphoreRow]) -> Iterator[Metric]:
        in_use, limit = (GaugeMetricFamily(key, doc, labels=["name"]) for key, doc in PERMITS)
        for row in rows:
            in_use.add_metric([row.name], row.in_use)
            limit.add_metric([row.name], row.max_permits)
        yield in_use
        yield limit

    @staticmethod
    def _gauges(rows: Iterable[PageRow], now: datetime) -> Iterator[Metric]:
        families = {key: GaugeMetricFamily(key, doc, labels=["name"]) for key, doc in GAUGES}
        for row in rows:
            held = row.held
            left = max(row.expires_at - now, timedelta(0)) if held else timedelta(0)
            held_for = max(now - row.acquired_at, timedelta(0)) if held else timedelta(0)
            families["pylease_lease_held"].add_metric([row.name], 1 if held else 0)
            families["pylease_lease_expires_in_seconds"].add_metric(
                [row.name], left.total_seconds()
            )
            families["pylease_lease_fence"].add_metric([row.name], row.fence)
            families["pylease_lease_held_for_seconds"].add_metric(
                [row.name], held_for.total_seconds()
            )
        yield from families.values()

    @staticmethod
    def _counters(rows: Iterable[PageRow | SemaphoreRow]) -> Iterator[Metric]:
        families = {key: CounterMetricFamily(key, doc, labels=["name"]) for key, doc in COUNTERS}
        for row in rows:
            families["pylease_grants"].add_metric([row.name], row.grants)
            families["pylease_takeovers"].add_metric([row.name], row.takeovers)
            families["pylease_steals"].add_metric([row.name], row.steals)
            families["pylease_releases"].add_metric([row.name], row.releases)
        yield from families.values()


def registry_for(collector: Collector) -> Any:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def text(collector: Collector) -> str:
    """The Prometheus text format, once (for node_exporter's textfile collector)."""
    from prometheus_client import generate_latest

    return generate_latest(registry_for(collector)).decode()


def serve(collector: Collector, host: str, port: int, ready: Callable[[str, int], None]) -> None:
    """Serve ``/metrics`` on ``host:port`` until SIGINT or SIGTERM; ``ready`` gets the bound port.

    A signal ends the loop between requests: an exception raised wherever the signal
    lands (inside a scrape's read, holding a lock) could leave the process unable to exit.
    """
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape would drown what matters on stderr

    class Server(WSGIServer):
        allow_reuse_address = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    app = make_wsgi_app(registry_for(collector))
    with make_server(host, port, app, server_class=Server, handler_class=Quiet) as server:

        def stop(_signum: int, _frame: Any) -> None:
            # shutdown() waits for the loop, which runs in this thread: ask from another.
            threading.Thread(target=server.shutdown, daemon=True).start()

        for ending in (signal.SIGINT, signal.SIGTERM):
            signal.signal(ending, stop)
        ready(host, server.server_port)
        server.serve_forever()
