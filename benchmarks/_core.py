"""What every section shares: the run's scale, its context, targets and results."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg


@dataclass(frozen=True)
class Scale:
    """How much each section measures; ``FULL`` fits ``make bench`` in under five minutes."""

    rounds: int = 9  # interleaved rounds per comparison (medians over these)
    cycle_ops: int = 200  # claim+release cycles per round
    busy_ops: int = 1000  # busy claims per round
    python_ops: int = (
        600  # `with lease()` cycles per round: a few slow flushes must not decide a round
    )
    renew_leases: int = 1000  # leases renewed one by one vs in one renew_many
    renew_rounds: int = 5
    tick_sizes: tuple[int, ...] = (1, 100, 1000, 10000)
    handovers: int = 200  # for the notify-driven waiters
    poll_handovers: int = 60  # for the 100 ms pollers (each costs 50 ms on average)
    handover_rounds: int = 10
    park: float = 0.02  # seconds a waiter is left blocked before the release
    workers: tuple[int, ...] = (1, 2, 4, 8, 16)
    names: tuple[int, ...] = (1, 64)
    contention_seconds: float = 1.5
    contention_rounds: int = 3
    api_rounds: int = 5  # section 6's Python API part: 1 worker vs the most, interleaved
    peer_ops: int = 200
    peer_rounds: int = 7
    function_ops: int = 50  # section 9: short rounds, so that paired neighbours share the load
    function_rounds: int = 25
    stepdowns: int = 20  # section 14: lease_request_release to a standby's first work
    rebalances: int = 3  # section 13: a join and a crash of a member, each timed


FULL = Scale()
SMOKE = Scale(
    rounds=2,
    cycle_ops=5,
    busy_ops=10,
    python_ops=3,
    renew_leases=20,
    renew_rounds=2,
    tick_sizes=(1, 20),
    handovers=2,
    poll_handovers=1,
    handover_rounds=1,
    park=0.005,
    workers=(1, 2),
    names=(1, 4),
    contention_seconds=0.2,
    contention_rounds=1,
    api_rounds=1,
    peer_ops=3,
    peer_rounds=2,
    function_ops=5,
    function_rounds=2,
    stepdowns=1,
    rebalances=1,
)


UNITS = {"x": "x", "ms": " ms", "count": "", "us": " µs"}  # "us": values in seconds


@dataclass
class Target:
    """One target of the issue, and how this run fared against it."""

    key: str
    title: str
    measure: str  # what the value is, in words
    goal: float
    higher_is_better: bool
    unit: str = "x"  # "x" for ratios, "ms" for latencies, "count" for events
    value: float | None = None
    detail: str = ""
    note: str = ""  # why there is no value, or what to read into it

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "N/A"
        ok = self.value >= self.goal if self.higher_is_better else self.value <= self.goal
        return "PASS" if ok else "MISS"

    def goal_text(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        if self.unit == "count":
            return f"= {self.goal:g}" if self.goal == 0 else f"{sign} {self.goal:g}"
        if self.unit == "us":
            return f"{sign} {self.goal * 1e6:g} µs"
        return f"{sign} {self.goal:g}{UNITS[self.unit]}"

    def value_text(self) -> str:
        if self.value is None:
            return "n/a"
        if self.unit == "count":
            return f"{self.value:.0f}"
        if self.unit == "us":
            return f"{self.value * 1e6:.0f} µs"
        return f"{self.value:.2f}{UNITS[self.unit]}"

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "measure": self.measure,
            "goal": self.goal,
            "goal_text": self.goal_text(),
            "unit": self.unit,
            "value": self.value,
            "verdict": self.verdict,
            "detail": self.detail,
            "note": self.note,
        }


@dataclass
class Section:
    """One numbered benchmark of the issue: a table for people, data for machines."""

    key: str
    title: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    extra: list[dict[str, Any]] = field(default_factory=list)  # further tables: title, header, rows
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "seconds": round(self.seconds, 2),
            "table": {"header": self.header, "rows": self.rows},
            "extra_tables": self.extra,
            "targets": [t.as_json() for t in self.targets],
            "notes": self.notes,
            "data": self.data,
        }


@dataclass
class Context:
    dsn: str
    scale: Scale
    redis_url: str
    workdir: str  # for the SQLite file and the file locks
    say: Callable[[str], None] = print
    smoke: bool = False

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """An autocommit connection, the way a lease is normally taken."""
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("application_name", "pylease-bench")
        return psycopg.connect(self.dsn, **kwargs)

    def redis(self) -> Any:
        """A Redis client, or None (after saying why) when Redis or redis-py is absent."""
        try:
            import redis
        except ImportError:
            self.say("  note: redis-py is not installed (pip install -e '.[bench]'); skipped")
            return None
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        try:
            client.ping()
        except redis.RedisError as exc:
            self.say(f"  note: no Redis at {self.redis_url} ({exc}); Redis peers skipped")
            return None
        return client


def unique(prefix: str) -> str:
    """A name no earlier run used, so sections never see each other's rows."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def holder_id(role: str) -> str:
    return f"bench-{role}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
