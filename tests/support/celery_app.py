"""The Celery app of tests/integrations/test_celery.py: the documented once-per-schedule pattern.

Everything comes from the environment the test gives the worker: the database
(``INTEG_CELERY_DSN``), the Redis broker and a key prefix and queue of this test run's
own (``INTEG_CELERY_BROKER``, ``INTEG_CELERY_PREFIX``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from celery import Celery
from celery.signals import beat_init, task_postrun, worker_ready

from pylease import exclusive

DSN = os.environ["INTEG_CELERY_DSN"]
PREFIX = os.environ["INTEG_CELERY_PREFIX"]

app = Celery("integ", broker=os.environ["INTEG_CELERY_BROKER"])
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX + ":"},
    task_default_queue=PREFIX,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

# The pattern: the period is 4 s, and min_hold (3 s) keeps the name unavailable after
# the run ends, so every duplicate of this slot's message (a second beat, a redelivery)
# finds it busy, while the next slot's finds it free.
MIN_HOLD = 3.0


@app.task(name="integ.digest")
@exclusive(DSN, "digest", ttl=60, min_hold=MIN_HOLD)
def digest(slot: int) -> int:
    time.sleep(1)  # long enough for the other worker process to meet the lease busy
    return slot


def _witness(statement: str, args: tuple[Any, ...]) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(statement, args)


@task_postrun.connect
def _delivered(task: Any = None, args: Any = None, retval: Any = None, **_kw: Any) -> None:
    """Every message, whether it ran the work (retval is the slot) or found the lease busy."""
    if task is not None and task.name == "integ.digest":
        _witness(
            "INSERT INTO integ_deliveries (slot, ran, pid) VALUES (%s, %s, %s)",
            (args[0], retval is not None, os.getpid()),
        )


@worker_ready.connect
def _ready(**_kw: Any) -> None:
    _witness("INSERT INTO integ_ready (pid) VALUES (%s)", (os.getpid(),))


@beat_init.connect
def _beat_started(**_kw: Any) -> None:
    """A beat started: with `pylease leader`, only ever one at a time."""
    _witness("INSERT INTO integ_beats (pid, ppid) VALUES (%s, %s)", (os.getpid(), os.getppid()))
