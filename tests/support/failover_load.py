"""How many acknowledged grants a failover loses under load, per replication mode.

The numbers in docs/high-availability.md come from this script (not a test: it
measures). Each run starts a fresh primary and standby (tests/support/replication.py), lets
4 workers steal among 50 names for 2 s, crashes the primary, promotes the standby
and counts the acknowledged grants the new primary lacks, and the names whose next
grant there reissued a fence of the old primary::

    .venv/bin/python -m tests.support.failover_load async-cut async sync
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

from pylease.postgres import PostgresBackend
from tests.support.replication import Pair, Template

HOUR = timedelta(hours=1)
WORKERS = 4
NAMES = 50
SECONDS = 2.0
RUNS = 3


def load(pair: Pair, cut: bool) -> tuple[list[tuple[str, str, int]], float]:
    """Steal under load, then crash and promote: the grants acknowledged, the failover's seconds."""
    acked: list[tuple[str, str, int]] = []
    stop = threading.Event()

    def work(worker: int) -> None:
        conn = psycopg.connect(pair.primary.url, autocommit=True)
        pg = PostgresBackend(conn)
        i = 0
        try:
            while not stop.is_set():
                name, holder = f"n{(i * WORKERS + worker) % NAMES}", f"w{worker}-{i}"
                fence = pg.steal(name, HOUR, holder)
                if fence is not None:
                    acked.append((name, holder, fence))
                i += 1
        except Exception:  # the crash ends every worker
            pass

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    for thread in threads:
        thread.start()
    if cut:
        time.sleep(SECONDS / 2)
        pair.cut()  # the last second's grants never reach the standby
        time.sleep(SECONDS / 2)
    else:
        time.sleep(SECONDS)
    started = time.monotonic()
    pair.crash_primary()
    stop.set()
    for thread in threads:
        thread.join()
    pair.promote()
    return acked, time.monotonic() - started


def measure(template: Template, mode: str) -> str:
    cut = mode == "async-cut"
    with template.pair("async" if cut else mode) as pair:
        acked, took = load(pair, cut)
        rows: dict[str, Any] = {
            r[0]: r[2] for r in pair.standby.query("SELECT name, holder, fence FROM lease_status()")
        }
        lost = [a for a in acked if rows.get(a[0], 0) < a[2]]
        highest: dict[str, int] = {}
        for name, _holder, fence in acked:
            highest[name] = max(highest.get(name, 0), fence)
        with psycopg.connect(pair.standby.url, autocommit=True) as conn:
            pg = PostgresBackend(conn)
            new = {name: pg.steal(name, HOUR, "new") for name in highest}
        reused = [n for n in highest if (new[n] or 0) <= highest[n]]
        return (
            f"{mode}: {len(lost)} of {len(acked)} acknowledged grants lost; "
            f"{len(reused)} of {len(highest)} names reissued a fence; "
            f"crash to promoted {took:.2f}s; timeline {pair.standby.timeline()}"
        )


def main(modes: list[str]) -> None:
    template = Template()
    try:
        template.build()
        for mode in modes or ["async-cut", "async", "sync"]:
            for _ in range(RUNS):
                print(measure(template, mode), flush=True)
    finally:
        template.remove()


if __name__ == "__main__":
    main(sys.argv[1:])
