"""``python -m benchmarks``: run every section, print PASS or MISS per target, write results.

python -m benchmarks --fresh            # what `make bench` runs
python -m benchmarks --only cycle,busy  # some sections, against an existing database
python -m benchmarks --smoke --out /tmp/bench  # seconds; exercises the code, not the machine
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from benchmarks import report
from benchmarks._core import FULL, SMOKE, Context, Section, Target
from benchmarks._db import install_bench_schema, machine, recreate
from benchmarks.contention import bench_contention
from benchmarks.data import bench_data
from benchmarks.fleet import bench_fleet
from benchmarks.functions import bench_functions
from benchmarks.groups import bench_groups
from benchmarks.peers import bench_peers
from benchmarks.permits import bench_permits
from benchmarks.python_level import bench_handover, bench_python
from benchmarks.readers import bench_readers
from benchmarks.sql_level import bench_busy, bench_cycle, bench_heartbeat
from benchmarks.startup import bench_startup

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/pylease_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

SECTIONS: dict[str, Callable[[Context], Section]] = {
    "cycle": bench_cycle,
    "busy": bench_busy,
    "python": bench_python,
    "heartbeat": bench_heartbeat,
    "handover": bench_handover,
    "contention": bench_contention,
    "peers": bench_peers,
    "leader": __import__("benchmarks.leader", fromlist=["_"]).bench_leader,
    "functions": bench_functions,
    "fleet": bench_fleet,
    "startup": bench_startup,
    "permits": bench_permits,
    "groups": bench_groups,
    "data": bench_data,
    "readers": bench_readers,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("PYLEASE_BENCH_DSN", DEFAULT_DSN),
        help="database to measure in (env PYLEASE_BENCH_DSN; default %(default)s)",
    )
    p.add_argument(
        "--redis",
        default=os.environ.get("PYLEASE_BENCH_REDIS", DEFAULT_REDIS),
        help="Redis for the Redis peers (env PYLEASE_BENCH_REDIS; default %(default)s)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="drop, create and migrate the database first (named pylease_bench* or *_bench)",
    )
    p.add_argument("--only", default="", help=f"comma-separated sections of: {', '.join(SECTIONS)}")
    p.add_argument(
        "--smoke", action="store_true", help="tiny samples: checks that everything runs, in seconds"
    )
    p.add_argument(
        "--out",
        default=RESULTS,
        help="where latest.json, latest.md and throughput.png go (default %(default)s)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="run the sections under pyinstrument and print where the time went",
    )
    return p.parse_args(argv)


@contextlib.contextmanager
def profiled(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        print(profiler.output_text(unicode=True, color=False, show_all=False))


def print_section(section: Section) -> None:
    print(f"\n{section.title}  ({section.seconds:.1f} s)")
    if section.rows:
        for line in report._md_table(section.header, section.rows):
            print("  " + line)
    for extra in section.extra:
        print(f"  {extra['title']}:")
        for line in report._md_table(extra["header"], extra["rows"]):
            print("  " + line)
    for note in section.notes:
        print(f"  note: {note}")
    for t in section.targets:
        print(f"  {t.verdict}: {t.title}: {t.value_text()} (goal {t.goal_text()}) {t.detail}")


def failed_section(key: str, exc: BaseException) -> Section:
    section = Section(key, f"{key}: FAILED")
    section.notes.append(f"failed: {type(exc).__name__}: {exc}")
    return section


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    selected = [k.strip() for k in args.only.split(",") if k.strip()] or list(SECTIONS)
    unknown = [k for k in selected if k not in SECTIONS]
    if unknown:
        print(
            f"benchmarks: unknown section(s) {', '.join(unknown)}; pick from {', '.join(SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    say: Callable[[str], None] = print
    if args.fresh:
        say(f"recreating {args.dsn} and migrating it")
        recreate(args.dsn, say)
    try:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            install_bench_schema(conn)
    except psycopg.OperationalError as exc:
        print(f"benchmarks: cannot reach {args.dsn}: {exc}", file=sys.stderr)
        return 3
    os.makedirs(args.out, exist_ok=True)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="pylease-bench-") as workdir:
        ctx = Context(args.dsn, SMOKE if args.smoke else FULL, args.redis, workdir, say, args.smoke)
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            info = machine(conn, ctx.redis())
        say(f"pylease benchmarks: {report.machine_line(info)}")
        sections: list[Section] = []
        with profiled(args.profile):
            for key in selected:
                t0 = time.perf_counter()
                try:
                    section = SECTIONS[key](ctx)
                except Exception as exc:
                    traceback.print_exc()
                    section = failed_section(key, exc)
                    failures += 1
                section.seconds = time.perf_counter() - t0
                sections.append(section)
                print_section(section)

    targets: list[Target] = [t for s in sections for t in s.targets]
    results: dict[str, Any] = {
        "machine": info,
        "smoke": args.smoke,
        "seconds": time.perf_counter() - started,
        "load_average_at_end": list(os.getloadavg()),
        "scale": {k: v for k, v in vars(ctx.scale).items()},
        "targets": [t.as_json() for t in targets],
        "sections": {s.key: s.as_json() for s in sections},
    }
    plot_path = os.path.join(args.out, "throughput.png")
    problem = report.plot(plot_path, sections, info)
    if problem:
        say(f"note: {problem}")
    report.write_json(os.path.join(args.out, "latest.json"), results)
    report.write_markdown(
        os.path.join(args.out, "latest.md"),
        report.markdown(results, sections, None if problem else "throughput.png"),
    )
    print("\nTargets:")
    for line in report.targets_table(targets):
        print("  " + line)
    print(
        f"\nwrote {args.out}/latest.json, latest.md"
        f"{'' if problem else ', throughput.png'} in {results['seconds']:.0f} s"
    )
    return 1 if failures else 0
