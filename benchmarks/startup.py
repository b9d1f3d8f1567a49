"""Section 11: how long the command takes to start, beyond a bare Python (issue 29).

A shell loop of ``pylease run`` pays for what every command imports: ``--help`` should
cost at most 100 ms over ``python -c pass``, ``run`` on SQLite at most 150 ms. Each
contender is a fresh process, interleaved round by round with the bare Python, so a
neighbour's load lands on both; the value is the median of the paired differences. The
CPU time of each process (user + system) is reported beside the wall time: the load of
the machine moves it less. The modules that cost the most, by ``python -X importtime``,
are listed so that the next lazy import is easy to find.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Sequence

from benchmarks._core import Context, Section, Target
from benchmarks._stats import fmt_time

HELP_GOAL = 100.0  # ms
RUN_GOAL = 150.0
# What a command may import, for scale: the cost of each alone over a bare Python.
YARDSTICKS = ("typer", "asyncio", "psycopg", "pydantic", "yoyo.migrations")


def _env(workdir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYLEASE_DSN", "DATABASE_URL")}
    env["XDG_STATE_HOME"] = os.path.join(workdir, "startup-state")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed wheel has its bytecode
    return env


def _once(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process, start to exit."""
    import time

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu


def _importtime(argv: Sequence[str], env: dict[str, str], top: int = 8) -> list[str]:
    """The ``top`` modules by their own import time, for one run of ``argv``."""
    done = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].strip()))
    # Cumulative, top-level packages: what a lazy import would save.
    tops = [(us, name) for us, name in rows if "." not in name]
    return [f"{name} {us / 1000:.0f} ms" for us, name in sorted(tops, reverse=True)[:top]]


def bench_startup(ctx: Context) -> Section:
    section = Section("startup", "11. Start-up of the command, beyond a bare Python")
    env = _env(ctx.workdir)
    py = sys.executable
    url = f"sqlite:///{os.path.join(ctx.workdir, 'startup.sqlite3')}"
    contenders = {
        "python -c pass": [py, "-c", "pass"],
        "pylease --help": [py, "-m", "pylease", "--help"],
        "pylease run (SQLite)": [
            py,
            "-m",
            "pylease",
            "run",
            "s",
            "--ttl",
            "1m",
            "--dsn",
            url,
            "--",
            "true",
        ],
    }
    if not ctx.smoke:  # smoke: seconds, checking that the code runs
        contenders.update({f"import {m}": [py, "-c", f"import {m}"] for m in YARDSTICKS})
    rounds = 1 if ctx.smoke else 15
    for argv in [] if ctx.smoke else contenders.values():  # warm: bytecode, page cache
        subprocess.run(argv, env=env, capture_output=True, check=False)
    walls: dict[str, list[float]] = {label: [] for label in contenders}
    cpus: dict[str, list[float]] = {label: [] for label in contenders}
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for label in order:
            wall, cpu = _once(contenders[label], env)
            walls[label].append(wall)
            cpus[label].append(cpu)

    def over(label: str, values: dict[str, list[float]]) -> float:
        bare = values["python -c pass"]
        return statistics.median(a - b for a, b in zip(values[label], bare, strict=True))

    section.header = ["process", "wall (median)", "over bare Python", "CPU over bare Python"]
    for label in contenders:
        section.rows.append(
            [
                label,
                fmt_time(statistics.median(walls[label])),
                "-" if label == "python -c pass" else fmt_time(over(label, walls)),
                "-" if label == "python -c pass" else fmt_time(over(label, cpus)),
            ]
        )
    for key, label, goal in (
        ("11-help", "pylease --help", HELP_GOAL),
        ("11-run", "pylease run (SQLite)", RUN_GOAL),
    ):
        section.targets.append(
            Target(
                key,
                f"`{label}` over a bare Python (median of paired rounds)",
                "milliseconds",
                goal,
                higher_is_better=False,
                unit="ms",
                value=over(label, walls) * 1000,
                detail=f"CPU {fmt_time(over(label, cpus))} over bare",
            )
        )
    if not ctx.smoke:
        section.notes.append(
            "largest imports of `pylease run` on SQLite (cumulative, one run): "
            + ", ".join(_importtime(contenders["pylease run (SQLite)"], env))
        )
    section.data = {
        "rounds": rounds,
        "wall_seconds": walls,
        "cpu_seconds": cpus,
        "load_average": list(os.getloadavg()),
    }
    return section
