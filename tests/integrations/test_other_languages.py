"""Other languages share the leases: psql scripts and a Node.js program beside Python.

tests/interop/ holds what a team would write in those languages with nothing but
the SQL API: claim.psql, write.psql and release.psql for psql, and lease.js on the
npm package ``pg`` (installed here into tests/interop/node_modules, once). They
run against the same database as the Python clients, and each honours the
others' leases and fences. A machine without node fails them: `make test` installs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from pylease import LeaseBusy, keep_fresh, lease

Conn = psycopg.Connection[Any]

INTEROP = Path(__file__).resolve().parents[1] / "interop"
BOUND = 60.0
WRITES = (
    "CREATE TABLE writes (seq bigserial PRIMARY KEY, holder text NOT NULL,"
    " fence bigint NOT NULL, client text NOT NULL)"
)


@pytest.fixture(scope="session")
def node() -> str:
    """The node binary, with the npm package ``pg`` installed beside lease.js."""
    found = shutil.which("node")
    # `make test` installs Node.js (scripts/test-deps.sh): without it the set-up is
    # broken, and the Node.js half must fail loudly rather than quietly not run.
    assert found, "node is absent: run scripts/test-deps.sh (apt-get install nodejs npm)"
    npm = shutil.which("npm")
    assert npm, "node is installed without npm: install npm (apt-get install npm)"
    # One installer at a time (parallel sessions); a later run reuses node_modules.
    with open(INTEROP / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (INTEROP / "node_modules" / "pg" / "package.json").exists():
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=INTEROP,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"npm install pg failed: {done.stderr}"
    return found


def url(dsn: str) -> str:
    """A postgresql:// URL for a conninfo, as node's pg expects one."""
    p = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = quote(str(p.get("user") or ""), safe="")
    if p.get("password"):
        auth += ":" + quote(str(p["password"]), safe="")
    host = f"{p.get('host') or '127.0.0.1'}:{p.get('port') or 5432}"
    return f"postgresql://{auth}@{host}/{quote(str(p.get('dbname') or ''), safe='')}"


def node_run(node: str, dsn: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [node, str(INTEROP / "lease.js"), url(dsn), *args],
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def psql(dsn: str, script: str, **variables: object) -> str:
    command = ["psql", "-X", "-q", "-t", "-A", "-d", dsn, "-f", str(INTEROP / script)]
    for key, value in variables.items():
        command += ["-v", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def fence_of(value: Any) -> int:
    return int(value)


def test_psql_node_and_python_honour_each_others_leases_and_fences(
    dsn: str, conn: Conn, node: str
) -> None:
    conn.execute(WRITES)

    # Python holds: neither psql nor node gets it, and both are told who has it.
    with lease(dsn, "report", ttl=30) as py:
        assert node_run(node, dsn, "claim", "report", "30 seconds", "node-1") == {"fence": None}
        assert psql(dsn, "claim.psql", name="report", ttl="30 seconds", holder="psql-1") == (
            f"busy {py.holder}"
        )
        assert node_run(node, dsn, "status", "report")["holder"] == py.holder
        # Python's token works from any language; anybody else's is rejected.
        assert psql(dsn, "write.psql", name="report", holder=py.holder, fence=py.fence) == "written"
        assert node_run(node, dsn, "write", "report", "node-1", str(py.fence)) == {"written": False}
        assert node_run(node, dsn, "release", "report", "node-1") == {"released": False}
        assert node_run(node, dsn, "renew", "report", "node-1") == {"renewed": False}

    # Node takes over with a larger fence; Python and psql are refused.
    node_fence = fence_of(node_run(node, dsn, "claim", "report", "30 seconds", "node-1")["fence"])
    assert node_fence > py.fence
    with pytest.raises(LeaseBusy) as busy, lease(dsn, "report", ttl=30):
        pytest.fail("granted while node holds it")
    assert busy.value.holder == "node-1"
    assert psql(dsn, "claim.psql", name="report", ttl="30 seconds", holder="psql-1") == (
        "busy node-1"
    )
    # Python's stale token no longer writes; node's does.
    assert psql(dsn, "write.psql", name="report", holder=py.holder, fence=py.fence) == "rejected"
    assert node_run(node, dsn, "write", "report", "node-1", str(node_fence)) == {"written": True}
    assert node_run(node, dsn, "holds", "report", "node-1", str(node_fence)) == {"holds": True}
    assert node_run(node, dsn, "release", "report", "node-1") == {"released": True}

    # psql claims and writes; a Python helper keeps psql's lease fresh; node is stale.
    out = psql(dsn, "claim.psql", name="report", ttl="2 seconds", holder="psql-1").splitlines()
    assert out[0].startswith("granted ") and out[1] == "written", out
    psql_fence = int(out[0].split()[1])
    assert psql_fence > node_fence
    with keep_fresh(dsn, "report", "psql-1", ttl=2) as kept:
        assert kept.fence == psql_fence
        time.sleep(3)  # past psql's 2 s ttl: only the Python helper's renewals keep it
        assert node_run(node, dsn, "claim", "report", "30 seconds", "node-1") == {"fence": None}
    assert node_run(node, dsn, "write", "report", "node-1", str(node_fence)) == {"written": False}
    assert psql(dsn, "release.psql", name="report", holder="psql-1") == "released"
    assert psql(dsn, "release.psql", name="report", holder="psql-1") == "not held"

    rows = conn.execute("SELECT client, holder, fence FROM writes ORDER BY seq").fetchall()
    assert rows == [
        ("psql", py.holder, py.fence),
        ("node", "node-1", node_fence),
        ("psql", "psql-1", psql_fence),
    ]


def test_a_python_waiter_wakes_on_a_release_from_node(dsn: str, conn: Conn, node: str) -> None:
    holder = subprocess.Popen(
        [node, str(INTEROP / "lease.js"), url(dsn), "hold", "sweep", "300", "node-1", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        held = json.loads(holder.stdout.readline())
        assert held["event"] == "held", held
        got: dict[str, Any] = {}

        def wait() -> None:
            # Neither the 300 s ttl nor the 60 s poll: only node's NOTIFY can wake it.
            with lease(dsn, "sweep", ttl=30, wait=BOUND, poll_interval=BOUND) as mine:
                got["fence"] = mine.fence
                got["at"] = time.monotonic()

        waiter = threading.Thread(target=wait)
        waiter.start()
        events = [json.loads(line) for line in holder.stdout]
        waiter.join(BOUND)
        assert not waiter.is_alive()
        assert events[-1] == {"event": "released", "ok": True}, events
        assert all(e["ok"] for e in events if e["event"] == "renewed")
        assert got["fence"] > fence_of(held["fence"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            holder.kill()
        holder.wait(BOUND)


def test_psql_and_python_share_leases_without_node(dsn: str, conn: Conn) -> None:
    """The psql half needs no node: it runs wherever the tests do."""
    conn.execute(WRITES)
    with lease(dsn, "nightly", ttl=30) as py:
        assert psql(dsn, "claim.psql", name="nightly", ttl="1 hour", holder="psql-1") == (
            f"busy {py.holder}"
        )
    out = psql(dsn, "claim.psql", name="nightly", ttl="1 hour", holder="psql-1").splitlines()
    assert out[0].startswith("granted ") and out[1] == "written", out
    psql_fence = int(out[0].split()[1])
    assert psql_fence > py.fence
    assert psql(dsn, "write.psql", name="nightly", holder=py.holder, fence=py.fence) == "rejected"
    got: dict[str, Any] = {}

    def wait() -> None:
        # Neither the hour-long ttl nor the poll interval: psql's NOTIFY wakes it.
        with lease(dsn, "nightly", ttl=30, wait=BOUND, poll_interval=BOUND) as mine:
            got["fence"] = mine.fence

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for_listener(conn)
    assert psql(dsn, "release.psql", name="nightly", holder="psql-1") == "released"
    waiter.join(BOUND)
    assert not waiter.is_alive()
    assert got["fence"] > psql_fence
    rows = conn.execute("SELECT client, holder, fence FROM writes ORDER BY seq").fetchall()
    assert rows == [("psql", "psql-1", psql_fence)]


def wait_for_listener(conn: Conn) -> None:
    limit = time.monotonic() + BOUND
    while not conn.execute(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'pylease-listen'"
        " AND datname = current_database()"
    ).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < limit, "the waiter never listened"
        time.sleep(0.02)


def test_node_refuses_bad_input_like_python(dsn: str, conn: Conn, node: str) -> None:
    bad = subprocess.run(
        [node, str(INTEROP / "lease.js"), url(dsn), "claim", "", "30 seconds", "node-1"],
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    assert bad.returncode == 2 and "name must not be empty" in bad.stderr, bad
    assert conn.execute("SELECT count(*) FROM pylease_leases").fetchone() == (0,)


def test_psql_refuses_bad_input_like_python(dsn: str, conn: Conn) -> None:
    done = subprocess.run(
        [
            *("psql", "-X", "-q", "-t", "-A", "-d", dsn, "-f", str(INTEROP / "claim.psql")),
            *("-v", "name=x", "-v", "ttl=-1 second", "-v", "holder=psql-1"),
        ],
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    assert done.returncode == 3 and "ttl must be positive" in done.stderr, done
    assert conn.execute("SELECT count(*) FROM pylease_leases").fetchone() == (0,)
