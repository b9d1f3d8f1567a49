#!/usr/bin/env python
"""What one lease cycle costs the client, counted rather than timed.

``make bench`` times whole cycles against the raw SQL cycle, and on a shared machine
a throughput ratio moves by several hundredths from run to run: more than most
changes of the client's own work. This counts that work instead, the same in every
run, so a change to the lease path can be judged on its own:

- machine instructions per cycle of the client process (``valgrind --tool=callgrind``,
  the difference between a run of ``--cycles`` more cycles and one without them);
- with ``--by-function``, Python bytecodes per cycle and function (``sys.settrace``),
  the largest first: where pylease's share goes.

Contenders: ``alease`` (``async with alease(conn, ...)``), ``raw-async`` (the two
statements of bench section 3, from ``benchmarks.sql_level``, on one async cursor),
``lease`` and ``raw`` (their sync twins). The database is the DSN's; run
``pylease migrate`` there first.

Usage::

    python tools/client_cost.py --dsn postgresql://postgres@127.0.0.1:5432/db
    python tools/client_cost.py --dsn ... --by-function alease
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import re
import subprocess
import sys
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = ("raw-async", "alease", "raw", "lease")
WARM = 300  # cycles before counting: prepared statements, caches, the keeper's timer


ASYNC = ("alease", "raw-async")


def _async_cycles(dsn: str, contender: str) -> Callable[[int], Awaitable[None]]:
    """A coroutine function running ``n`` cycles of an async contender on one connection
    (made at its first call: a connection belongs to the loop it was made in)."""
    import psycopg

    import pylease
    from benchmarks.sql_level import CLAIM, RELEASE, TTL

    name = f"client-cost-{contender}"
    conns: list[psycopg.AsyncConnection[Any]] = []

    async def run(n: int) -> None:
        if not conns:
            conns.append(await psycopg.AsyncConnection.connect(dsn, autocommit=True))
        conn = conns[0]
        if contender == "alease":
            for _ in range(n):
                async with pylease.alease(conn, name, ttl=TTL):
                    pass
            return
        cur = conn.cursor()
        for _ in range(n):
            await cur.execute(CLAIM, (name, TTL, "client-cost"))
            await cur.fetchone()
            await cur.execute(RELEASE, (name, "client-cost"))
            await cur.fetchone()

    return run


def _sync_cycles(dsn: str, contender: str) -> Callable[[int], None]:
    """As :func:`_async_cycles`, for a sync contender."""
    import psycopg

    import pylease
    from benchmarks.sql_level import CLAIM, RELEASE, TTL

    name = f"client-cost-{contender}"
    conn = psycopg.connect(dsn, autocommit=True)

    def run(n: int) -> None:
        if contender == "lease":
            for _ in range(n):
                with pylease.lease(conn, name, ttl=TTL):
                    pass
            return
        cur = conn.cursor()
        for _ in range(n):
            cur.execute(CLAIM, (name, TTL, "client-cost"))
            cur.fetchone()
            cur.execute(RELEASE, (name, "client-cost"))
            cur.fetchone()

    return run


def _run(dsn: str, contender: str, warm: int, counted: int, around: Any) -> None:
    """``warm`` cycles, then ``counted`` cycles inside the context manager ``around``."""
    if contender in ASYNC:
        arun = _async_cycles(dsn, contender)

        async def both() -> None:
            await arun(warm)
            with around:
                await arun(counted)

        asyncio.run(both())
        return
    run = _sync_cycles(dsn, contender)
    run(warm)
    with around:
        run(counted)


def cycle_in_process(dsn: str, contender: str, cycles: int) -> None:
    """Run WARM + ``cycles`` cycles here (what callgrind counts)."""
    _run(dsn, contender, WARM, cycles, contextlib.nullcontext())


def instructions(dsn: str, contender: str, cycles: int) -> int:
    """Instructions the client process executes for ``cycles`` cycles, start-up excluded."""

    def counted(n: int) -> int:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                str(Path(__file__).resolve()),
                "--dsn",
                dsn,
                "--in-process",
                contender,
                "--cycles",
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            raise SystemExit(f"no count from valgrind:\n{out.stderr[-2000:]}")
        return int(found.group(1))

    return (counted(cycles) - counted(0)) // cycles


def by_function(dsn: str, contender: str, cycles: int, top: int) -> None:
    """Print bytecodes per cycle by package, then the ``top`` functions."""
    counts: collections.Counter[tuple[str, int, str]] = collections.Counter()

    def tracer(frame: types.FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
        return tracer

    class Traced:
        def __enter__(self) -> None:
            sys.settrace(tracer)

        def __exit__(self, *exc: object) -> None:
            sys.settrace(None)

    _run(dsn, contender, WARM, cycles, Traced())

    def package(filename: str) -> str:
        for part in ("pylease", "psycopg", "asyncio", "selectors"):
            if f"/{part}" in filename:
                return part
        return Path(filename).name

    packages: collections.Counter[str] = collections.Counter()
    for (filename, _line, _name), n in counts.items():
        packages[package(filename)] += n
    total = sum(packages.values()) / cycles
    print(f"{contender}: {total:,.0f} bytecodes per cycle")
    for name, n in packages.most_common():
        print(f"  {n / cycles:8,.0f}  {name}")
    for (filename, line, name), n in counts.most_common(top):
        where = f"{package(filename)}/{Path(filename).name}:{line}"
        print(f"  {n / cycles:8.1f}  {where} {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--by-function", choices=CONTENDERS)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--in-process", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.in_process:
        cycle_in_process(args.dsn, args.in_process, args.cycles)
        return 0
    if args.by_function:
        by_function(args.dsn, args.by_function, args.cycles, args.top)
        return 0
    counted = {c: instructions(args.dsn, c, args.cycles) for c in CONTENDERS}
    for raw, api in (("raw-async", "alease"), ("raw", "lease")):
        extra = counted[api] - counted[raw]
        print(
            f"{api}: {counted[api]:,} instructions per cycle, {raw}: {counted[raw]:,};"
            f" pylease's own: {extra:,} ({counted[api] / counted[raw]:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
