"""Server CPU of one connection's backend, read from /proc when the server runs here.

Wall times on a shared machine carry the neighbours' load; the CPU a backend spent
does much less, so each section reports both. ``/proc/<pid>/schedstat`` counts
nanoseconds on the CPU (``/proc/<pid>/stat`` only clock ticks of 10 ms).
"""

from __future__ import annotations

from typing import Any

import psycopg


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def cpu_seconds(pid: int) -> float | None:
    """Seconds on the CPU of process ``pid`` so far; None when it is not on this machine."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / 100
        except (OSError, ValueError, IndexError):
            return None


def server_is_local(conn: psycopg.Connection[Any]) -> bool:
    """True when the backend of ``conn`` is a process this machine can read."""
    return cpu_seconds(backend_pid(conn)) is not None
