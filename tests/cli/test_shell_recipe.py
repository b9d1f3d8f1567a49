"""The shell recipe of docs/command-line.md, run as the real script the page gives.

Claim, work, renew in the background, release: when the database stops answering,
``pylease renew`` fails with exit 3 (or hangs), and the script must stop the work before
the lease's ttl runs out on the server, as ``pylease run`` does. A contender polls the
database directly; the work writes the time on the monotonic clock the test reads too, so
"stopped before the contender was granted" is one comparison (issue 21, item 6).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.docs.test_docs import parse
from tests.support.faultkit import BLACKHOLE, DROP, proxy, wait_until

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "command-line.md"
NAME = "nightly-export"

# The page's times, shortened: renew every 3 s, stop the work 6 s before the 12 s ttl.
SETTINGS = {"ttl": 12, "every": 3, "margin": 6}

# The work: a shell that starts a child writing the monotonic time, as a real export
# would start pg_dump; stopping the work must stop the child too.
EXPORT = """#!/bin/sh
"$BEAT_PYTHON" -c '
import sys, time
with open(sys.argv[1], "a") as f:
    while True:
        f.write(f"{time.monotonic()}\\n")
        f.flush()
        time.sleep(0.05)
' "$BEATS" &
echo $! > "$BEATS.pid"
wait
"""


def recipe() -> str:
    """The page's script, with shorter times."""
    blocks = [b for b in parse(PAGE).blocks if b.directives.get("file") == "export-under-lease.sh"]
    assert len(blocks) == 1, "docs/command-line.md no longer saves export-under-lease.sh"
    text = blocks[0].text
    for key, value in SETTINGS.items():
        text, count = re.subn(rf"^{key}=\d+", f"{key}={value}", text, flags=re.MULTILINE)
        assert count == 1, f"the recipe has no single '{key}=' line"
    return text


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid`` (the script's, since it started one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def beats(path: Path) -> list[float]:
    if not path.exists():
        return []
    return [float(line) for line in path.read_text().splitlines() if line.strip()]


def renewed(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT renewed_at > acquired_at FROM lease_status(%s)", (NAME,)).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("fault", [BLACKHOLE, DROP])
def test_the_recipe_stops_the_work_before_the_lease_can_be_granted_elsewhere(
    dsn: str, tmp_path: Path, fault: str
) -> None:
    script = tmp_path / "export-under-lease.sh"
    script.write_text(recipe())
    export = tmp_path / "export.sh"
    export.write_text(EXPORT)
    script.chmod(0o755)
    export.chmod(0o755)
    record = tmp_path / "beats"
    with proxy(dsn) as px, psycopg.connect(dsn, autocommit=True) as conn:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PYLEASE_", "PG"))},
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYLEASE_DSN": px.dsn,
            "BEAT_PYTHON": sys.executable,
            "BEATS": str(record),
        }
        proc = subprocess.Popen(
            [str(script)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            wait_until(lambda: beats(record), what="the work to start")
            wait_until(lambda: renewed(conn), what="a renewal through the proxy")
            assert proc.poll() is None, proc.communicate()
            px.set(fault)
            asked = 0.0
            limit = time.monotonic() + 90
            while time.monotonic() < limit:
                asked = time.monotonic()
                row = conn.execute(
                    "SELECT lease_claim(%s, interval '1 minute', 'contender')", (NAME,)
                ).fetchone()
                if row and row[0] is not None:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the contender was never granted the lease")
            time.sleep(1)  # twenty beats' time: a work still running has written since
            last = beats(record)[-1]
            assert last < asked, (
                f"the work still ran {last - asked:.2f} s after the contender's granted claim"
            )
            _out, err = proc.communicate(timeout=90)
            assert proc.returncode == 75, err
            assert "not renewed in time; stopping the export" in err
            child = int((tmp_path / "beats.pid").read_text())
            assert not alive(child), "the work's child outlived the script"
            assert session_members(proc.pid) == [], "the script left processes behind"
        finally:
            for pid in session_members(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.communicate(timeout=30)
