"""Interleaved rounds, medians and spreads: the measuring discipline every section shares."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A contender runs ``n`` operations and returns the seconds they took. It times
# itself, so that its set-up and checks stay out of the measurement.
Run = Callable[[int], float]


@dataclass
class Contender:
    label: str
    run: Run
    ops: int  # operations per round


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles and extremes of one contender's per-round values."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return {"n": 0}
    if n >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {
        "n": n,
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": q1,
        "q3": q3,
        "values": list(values),
    }


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), nearest rank, as latency reports usually mean it."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, round(p / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Interleaved:
    """Per-operation seconds of each contender, one value per round."""

    labels: list[str]
    per_op: dict[str, list[float]] = field(default_factory=dict)

    def median(self, label: str) -> float:
        return statistics.median(self.per_op[label])

    def paired_ratios(self, numerator: str, denominator: str) -> list[float]:
        """Round by round ``numerator / denominator``: neighbours in time share the noise."""
        return [
            a / b for a, b in zip(self.per_op[numerator], self.per_op[denominator], strict=True)
        ]

    def summary(self, label: str) -> dict[str, Any]:
        return summary(self.per_op[label])


def interleave(contenders: Sequence[Contender], rounds: int, warmup: int = 1) -> Interleaved:
    """Run A B C, then C B A, ... for ``rounds`` rounds after ``warmup`` unrecorded ones.

    Reversing the order every round keeps any drift (a checkpoint, autovacuum, a
    neighbour's build) from always landing on the same contender.
    """
    result = Interleaved(labels=[c.label for c in contenders])
    for c in contenders:
        result.per_op[c.label] = []
    for r in range(warmup + rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for c in order:
            seconds = c.run(c.ops)
            if r >= warmup:
                result.per_op[c.label].append(seconds / c.ops)
    return result


def clock() -> float:
    return time.perf_counter()


def fmt_time(seconds: float) -> str:
    """A duration with a unit a reader takes in at a glance."""
    if seconds != seconds:  # NaN
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_rate(per_second: float) -> str:
    if per_second >= 100:
        return f"{per_second:,.0f}/s"
    return f"{per_second:.1f}/s"


def spread_text(s: dict[str, Any], fmt: Callable[[float], str] = fmt_time) -> str:
    """``median [min..max]`` for a summary."""
    if not s.get("n"):
        return "n/a"
    return f"{fmt(s['median'])} [{fmt(s['min'])}..{fmt(s['max'])}]"
