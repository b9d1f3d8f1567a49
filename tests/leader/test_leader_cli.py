"""``pylease leader NAME --ttl DUR -- CMD``: the cases of ``pylease run``, on both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

CHILD = r"""
import json, os, signal, sys, time
from tests.support.cli import NO_DSN, cli, ok
mode, out = sys.argv[1], sys.argv[2]

def note(text):
    with open(out, "a") as f:
        f.write(text + "\n")

if mode == "env":
    note(json.dumps({k: v for k, v in os.environ.items() if k.startswith("PYLEASE_")}))
    sys.exit(0)
if mode == "exit":
    sys.exit(int(sys.argv[3]))
if mode == "turn":
    note(f"start {os.environ['PYLEASE_FENCE']}")
    time.sleep(float(sys.argv[3]))
    note(f"end {os.environ['PYLEASE_FENCE']}")
    sys.exit(0)
if mode == "trap":
    def on(signum, frame):
        note(signal.Signals(signum).name)
        sys.exit(100 + signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on)
note("ready")
time.sleep(60)
note("not stopped")
"""


@pytest.fixture
def child(tmp_path: Path) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script)]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out.txt"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYLEASE_DSN", "DATABASE_URL")}


def pylease(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pylease", *args],
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(procs: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylease", *args],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    return proc


def lines(out: Path) -> list[str]:
    return out.read_text().splitlines() if out.exists() else []


def wait_for(out: Path, line: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while line not in lines(out):
        if proc.poll() is not None:
            raise AssertionError(f"pylease exited {proc.returncode}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"no {line!r} in {out}"
        time.sleep(0.02)


def catches(pid: int, signum: int) -> bool:
    """True when process ``pid`` has a handler of its own for ``signum`` (SigCgt)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def has_open(pid: int, path: Path) -> bool:
    """True when process ``pid`` has ``path`` open."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if Path(os.readlink(fd)) == path:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


def queued(dsn: str, name: str) -> int:
    """How many processes wait in the queue of waiting processes for ``name``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pylease_waiters WHERE name = %s AND expires_at > now()",
            (name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def standing_by(url: str, name: str, proc: subprocess.Popen[str]) -> None:
    """Wait for the evidence that ``proc`` stands by for ``name``, never for a fixed time.

    Its SIGTERM handler is pylease's (set before its first claim, so a SIGTERM from now
    on is pylease's to answer, not Python's default death); on PostgreSQL it also has a
    row in the queue of waiting processes, which only a busy claim writes; on SQLite,
    which keeps no trace of a waiter, it has the database file open.
    """
    deadline = time.monotonic() + 30

    def there() -> bool:
        try:
            if not catches(proc.pid, signal.SIGTERM):
                return False
            if url.startswith("sqlite:///"):
                return has_open(proc.pid, Path(url.removeprefix("sqlite:///")))
        except OSError:
            return False  # it exited meanwhile: the poll below says how
        return queued(url, name) == 1

    while not there():
        if proc.poll() is not None:
            raise AssertionError(f"pylease exited {proc.returncode}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"{proc.args} did not stand by within 30 s"
        time.sleep(0.02)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def status(url: str, name: str) -> dict[str, object]:
    result = pylease("status", name, "--json", "--dsn", url)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)
    assert len(rows) == 1
    return rows[0]


# Exit codes ------------------------------------------------------------------------


def test_exit_code_passes_through_and_it_resigns(url: str, child: list[str], out: Path) -> None:
    result = pylease("leader", "sched", "--ttl", "5s", "--dsn", url, "--",
                     *child, "exit", str(out), "7")  # fmt: skip
    assert result.returncode == 7, result.stderr
    assert result.stderr == ""
    assert status(url, "sched")["held"] is False  # resigned, not left to expire


def test_command_not_found_is_127_and_not_executable_is_126(url: str, tmp_path: Path) -> None:
    result = pylease("leader", "sched", "--ttl", "5s", "--dsn", url, "--", "no-such-command-xyz")
    assert result.returncode == 127
    assert "no-such-command-xyz: command not found" in result.stderr
    plain = tmp_path / "not-executable.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    result = pylease("leader", "sched", "--ttl", "5s", "--dsn", url, "--", str(plain))
    assert result.returncode == 126
    assert status(url, "sched")["held"] is False


def test_a_signal_death_is_128_plus_n(url: str) -> None:
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = pylease("leader", "sched", "--ttl", "5s", "--dsn", url, "--",
                     sys.executable, "-c", kill_self)  # fmt: skip
    assert result.returncode == 128 + signal.SIGKILL


def test_the_child_sees_its_term(url: str, child: list[str], out: Path) -> None:
    result = pylease("leader", "sched", "--ttl", "5s", "--holder", "web1", "--dsn", url, "--",
                     *child, "env", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    row = status(url, "sched")
    assert json.loads(out.read_text()) == {
        "PYLEASE_NAME": "sched",
        "PYLEASE_HOLDER": "web1",
        "PYLEASE_FENCE": str(row["fence"]),
        "PYLEASE_DSN": url,
    }


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    assert pylease("leader", "sched", "--dsn", url, "--", "true").returncode == 2
    assert pylease("leader", "sched", "--ttl", "0s", "--dsn", url, "--", "true").returncode == 2
    assert pylease("leader", "sched", "--ttl", "1s", "--wait", "x", "--dsn", url).returncode == 2


# Waiting to lead ----------------------------------------------------------------------


def test_it_waits_without_a_deadline_until_the_leader_resigns(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    held = pylease("claim", "sched", "--ttl", "10m", "--holder", "other", "--dsn", url)
    assert held.returncode == 0, held.stderr
    proc = start(started, "leader", "sched", "--ttl", "5s", "--dsn", url, "--",
                 *child, "turn", str(out), "0")  # fmt: skip
    standing_by(url, "sched", proc)
    if url.startswith("sqlite:///"):
        time.sleep(0.5)  # SQLite keeps no trace of a busy claim: a few of its polls' time
    assert proc.poll() is None and lines(out) == []
    released = pylease("release", "sched", "--holder", "other", "--dsn", url)
    assert released.returncode == 0, released.stderr
    code, err = finish(proc)
    assert code == 0, err
    assert lines(out) == ["start 2", "end 2"]


def test_wait_runs_out_exits_1_without_running(url: str, tmp_path: Path) -> None:
    held = pylease("claim", "sched", "--ttl", "1m", "--holder", "other", "--dsn", url)
    assert held.returncode == 0, held.stderr
    marker = tmp_path / "ran"
    result = pylease("leader", "sched", "--ttl", "5s", "--wait", "300ms", "--dsn", url, "--",
                     "touch", str(marker))  # fmt: skip
    assert result.returncode == 1
    assert "held by other" in result.stderr
    assert not marker.exists()


def test_a_standby_leads_when_the_leader_exits(
    url: str, child: list[str], tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "turns.txt"
    first = start(started, "leader", "sched", "--ttl", "30s", "--dsn", url, "--",
                  *child, "turn", str(out), "1")  # fmt: skip
    wait_for(out, "start 1", first)
    second = start(started, "leader", "sched", "--ttl", "30s", "--dsn", url, "--",
                   *child, "turn", str(out), "0")  # fmt: skip
    assert finish(first)[0] == 0
    assert finish(second)[0] == 0
    # The second led only after the first resigned, and not after its 30 s ttl.
    assert lines(out) == ["start 1", "end 1", "start 2", "end 2"]


def test_sigterm_while_standing_by_exits_without_running(
    url: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    held = pylease("claim", "sched", "--ttl", "1m", "--holder", "other", "--dsn", url)
    assert held.returncode == 0, held.stderr
    marker = tmp_path / "ran"
    proc = start(started, "leader", "sched", "--ttl", "5s", "--dsn", url, "--",
                 "touch", str(marker))  # fmt: skip
    standing_by(url, "sched", proc)
    proc.terminate()
    code, _err = finish(proc)
    assert code == 128 + signal.SIGTERM
    assert not marker.exists()
    assert status(url, "sched")["holder"] == "other"


# Signals and lost terms -------------------------------------------------------------


def test_sigterm_is_forwarded_and_it_resigns(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    # The forwarding is run's own (test_cli_run.py tries every signal); SIGTERM is the
    # shutdown of a service manager, so the standby must not wait for the ttl after it.
    signum = signal.SIGTERM
    proc = start(started, "leader", "sched", "--ttl", "5s", "--dsn", url, "--",
                 *child, "trap", str(out))  # fmt: skip
    wait_for(out, "ready", proc)
    proc.send_signal(signum)
    code, err = finish(proc)
    assert code == 100 + signum, err
    assert lines(out) == ["ready", signal.Signals(signum).name]
    assert status(url, "sched")["held"] is False


def test_a_stolen_term_stops_the_child_and_exits_75(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = start(started, "leader", "sched", "--ttl", "6s", "--dsn", url, "--",
                 *child, "trap", str(out))  # fmt: skip
    wait_for(out, "ready", proc)
    stolen = pylease("steal", "sched", "--ttl", "1m", "--holder", "operator", "--dsn", url)
    assert stolen.returncode == 0, stolen.stderr
    code, err = finish(proc)
    assert code == 75, err
    assert "lease 'sched' was lost" in err
    assert lines(out) == ["ready", "SIGTERM"]
    row = status(url, "sched")
    assert (row["holder"], row["held"]) == ("operator", True)
