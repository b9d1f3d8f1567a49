"""A command for ``pylease run`` that makes fenced writes and tells the witness it acts.

    python tests/support/fenced_command.py WITNESS STOP_FILE

It reads its lease from PYLEASE_NAME, PYLEASE_HOLDER, PYLEASE_FENCE and PYLEASE_DSN,
records the grant, then every 50 ms records that it acts and writes one row into
``fenced_writes`` guarded by ``lease_holds``, until STOP_FILE exists (exit 0) or
``pylease run`` stops it (its lease was lost).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg

from tests.support.witness import Witness

FENCED_WRITE = (
    "INSERT INTO fenced_writes (name, holder, fence) SELECT %s, %s, %s "
    "WHERE lease_holds(%s, %s, %s) RETURNING id"
)


def main(witness_path: str, stop_file: str) -> None:
    witness = Witness(witness_path)
    name, holder = os.environ["PYLEASE_NAME"], os.environ["PYLEASE_HOLDER"]
    fence = int(os.environ["PYLEASE_FENCE"])
    dsn = os.environ["PYLEASE_DSN"]
    witness.grant(name, holder, fence)
    conn: psycopg.Connection[tuple[object, ...]] | None = None
    while not os.path.exists(stop_file):
        witness.acting(name, holder)
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True, connect_timeout=2)
            conn.execute(FENCED_WRITE, (name, holder, fence) * 2)
        except psycopg.Error:
            conn = None  # a failover under way: the next write reconnects
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
