"""APScheduler 3.x: one job on several schedulers (as on several hosts), wrapped in
@exclusive, runs once per fire time."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg

# Installed by the dev extra (`make test`): a missing one fails, never skips.
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from pylease import exclusive

INTERVAL = 2.0
FIRES = 4
SCHEDULERS = 3


def test_several_schedulers_run_the_job_once_per_fire_time(dsn: str) -> None:
    runs: list[tuple[str, datetime]] = []
    skipped: list[str] = []

    # min_hold below the interval: a scheduler that fires a little late still finds
    # this fire time's run holding the name, the next fire time finds it free.
    @exclusive(dsn, "nightly-export", ttl=60, min_hold=INTERVAL * 0.75)
    def export(scheduler: str) -> str:
        runs.append((scheduler, datetime.now(UTC)))
        return scheduler

    def job(scheduler: str) -> None:
        if export(scheduler) is None:
            skipped.append(scheduler)

    start = datetime.now(UTC) + timedelta(seconds=1)
    schedulers = []
    for n in range(SCHEDULERS):
        scheduler = BackgroundScheduler(timezone=UTC)
        scheduler.add_job(
            job,
            IntervalTrigger(seconds=INTERVAL, start_date=start, timezone=UTC),
            args=[f"scheduler-{n}"],
            misfire_grace_time=None,
        )
        schedulers.append(scheduler)
    for scheduler in schedulers:
        scheduler.start()
    try:
        deadline = time.monotonic() + FIRES * INTERVAL + 30
        while len(runs) + len(skipped) < FIRES * SCHEDULERS:
            assert time.monotonic() < deadline, (runs, skipped)
            time.sleep(0.05)
    finally:
        for scheduler in schedulers:
            scheduler.shutdown(wait=True)
    fire_times = Counter(round((at - start).total_seconds() / INTERVAL) for _s, at in runs)
    assert sorted(fire_times) == list(range(len(fire_times))) and len(fire_times) >= FIRES
    assert set(fire_times.values()) == {1}, f"runs per fire time: {fire_times}"
    assert len(skipped) >= (SCHEDULERS - 1) * FIRES  # the others did fire, and skipped
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT fence FROM pylease_leases WHERE name = 'nightly-export'")
        assert row.fetchone() == (len(runs),)
