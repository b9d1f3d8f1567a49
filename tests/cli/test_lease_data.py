"""The command line's side of contract 5.4: ``run`` and ``leader`` publish who runs what
as their lease's data, ``status --wide``/``--json`` and ``holders`` show it, and
``pylease request-release`` makes a ``run`` or ``leader`` stop its command as for a
loss, release, and exit 76, so that a standby takes over at once.
"""

from __future__ import annotations

import getpass
import json
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_run import CHILD, finish, pylease, start, status, wait_for
from tests.support.cli import cli, ok

STEPPED_DOWN = 76


@pytest.fixture
def child(tmp_path: Path) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script)]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("dsn")
        return dsn
    return f"sqlite:///{tmp_path / 'leases.sqlite3'}"


def test_run_publishes_who_runs_what_and_status_shows_it(
    url: str, child: list[str], tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "out.txt"
    proc = start(
        started, "run", "nightly", "--ttl", "30s", "--dsn", url, "--", *child, "x", str(out)
    )
    wait_for(out, "ready", proc)
    data = status(url, "nightly")["data"]
    assert isinstance(data, dict)
    assert data == {
        "command": shlex.join([*child, "x", str(out)]),
        "host": socket.gethostname(),
        "pid": proc.pid,
        "user": getpass.getuser(),
    }
    wide = ok("status", "--wide", "--dsn", url).stdout
    assert "DATA" in wide.splitlines()[0] and f'"pid":{proc.pid}' in wide
    holders = ok("holders", "nightly", "--wide", "--dsn", url).stdout
    assert "DATA" in holders.splitlines()[0] and f'"pid":{proc.pid}' in holders
    [holder] = json.loads(ok("holders", "nightly", "--json", "--dsn", url).stdout)
    assert holder["data"] == data
    # The narrow table keeps to 80 columns: no data there.
    assert "DATA" not in ok("status", "--dsn", url, env={"COLUMNS": "80"}).stdout
    proc.kill()


def test_run_publishes_what_data_says(url: str, child: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    done = pylease(
        "run", "job", "--ttl", "30s", "--data", '{"v": 2}', "--dsn", url, "--", *child, "env",
        str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert status(url, "job")["data"] == {"v": 2}  # a released lease shows its last data
    bad = pylease("run", "job", "--ttl", "30s", "--data", "{nope", "--dsn", url, "--", "true")
    assert bad.returncode == 2
    assert "--data must be JSON" in bad.stderr


def test_request_release_of_a_free_lease_exits_1(url: str) -> None:
    result = cli("request-release", "nobody-holds-this", "--dsn", url)
    assert result.exit_code == 1
    assert "is not held" in result.stderr


def test_a_run_asked_to_step_down_stops_releases_and_exits_76(
    url: str, child: list[str], tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "out.txt"
    proc = start(
        started, "run", "deploy", "--ttl", "6s", "--dsn", url, "--", *child, "trap", str(out)
    )
    wait_for(out, "ready", proc)
    asked = ok("request-release", "deploy", "--by", "release-2.5", "--dsn", url)
    assert "asked the holder of lease 'deploy' to step down (as release-2.5)" in asked.stderr
    code, err = finish(proc)
    assert code == STEPPED_DOWN, err
    assert "release-2.5 asked lease 'deploy' to step down; sending SIGTERM" in err
    assert out.read_text().splitlines() == ["ready", "SIGTERM"]
    row = status(url, "deploy")
    assert (row["state"], row["release_requested_by"]) == ("released", None)


def test_a_leader_asked_to_step_down_hands_over_to_the_standby(
    url: str, child: list[str], tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    a = start(
        started, "leader", "scheduler", "--ttl", "6s", "--holder", "a", "--dsn", url,
        "--", *child, "trap", str(first),
    )  # fmt: skip
    wait_for(first, "ready", a)
    b = start(
        started, "leader", "scheduler", "--ttl", "6s", "--holder", "b", "--dsn", url,
        "--", *child, "trap", str(second),
    )  # fmt: skip
    ok("request-release", "scheduler", "--dsn", url)
    code, err = finish(a)
    assert code == STEPPED_DOWN, err
    wait_for(second, "ready", b)
    row = status(url, "scheduler")
    assert (row["holder"], row["fence"], row["release_requested_by"]) == ("b", 2, None)
    assert isinstance(row["data"], dict) and row["data"]["pid"] == b.pid
