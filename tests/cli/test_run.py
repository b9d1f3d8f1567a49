"""``pylease run`` as operators run it: real processes, real signals, on both backends."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from pylease import dsn as dsn_mod

# The lease of a test about exit codes, signals or the child's environment: longer
# than any stall of a loaded machine, so that it is never lost on the way (a lost
# lease changes the exit code to 75).
TTL = "1m"
# The lease of a test of a loss: short, so the test is quick, yet long enough that the
# child, sent SIGTERM at the loss, ends before the lease's expiry (then SIGKILL, and a
# line of its own) on a loaded machine: the keeper renews every ttl / 3 and reports a
# loss ttl / 6 before the expiry.
LOSS_TTL = "15s"

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
if mode == "sleep":
    time.sleep(float(sys.argv[3]))
    sys.exit(0)
if mode == "trap":
    def on(signum, frame):
        note(signal.Signals(signum).name)
        sys.exit(100 + signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYLEASE_DSN", "DATABASE_URL")}
    env.update(extra or {})
    return env


def pylease(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pylease", *args],
        env=_env(env),
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


def start(
    procs: list[subprocess.Popen[str]], *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylease", *args],
        env=_env(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    return proc


def wait_for(out: Path, line: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if out.exists() and line in out.read_text().splitlines():
            return
        if proc.poll() is not None:
            raise AssertionError(f"pylease exited {proc.returncode}: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"no {line!r} in {out}")


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


def test_exit_code_passes_through_and_the_lease_is_released(
    url: str, child: list[str], out: Path
) -> None:
    result = pylease("run", "job", "--ttl", TTL, "--dsn", url, "--", *child, "exit", str(out), "7")
    assert result.returncode == 7, result.stderr
    assert result.stderr == ""
    assert status(url, "job")["held"] is False
    assert pylease("run", "job", "--ttl", TTL, "--dsn", url, "--", "true").returncode == 0


def test_command_not_found_is_127_and_not_executable_is_126(url: str, tmp_path: Path) -> None:
    result = pylease("run", "job", "--ttl", TTL, "--dsn", url, "--", "no-such-command-xyz")
    assert result.returncode == 127
    assert result.stderr == "pylease: no-such-command-xyz: command not found\n"
    assert status(url, "job")["held"] is False

    plain = tmp_path / "not-executable.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    result = pylease("run", "job", "--ttl", TTL, "--dsn", url, "--", str(plain))
    assert result.returncode == 126
    assert "permission denied" in result.stderr


def test_a_signal_death_is_128_plus_n(url: str) -> None:
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = pylease(
        "run", "job", "--ttl", TTL, "--dsn", url, "--", sys.executable, "-c", kill_self
    )
    assert result.returncode == 128 + signal.SIGKILL


def test_the_child_sees_the_lease(url: str, child: list[str], out: Path) -> None:
    result = pylease(
        "run", "env-job", "--ttl", TTL, "--holder", "cron@web1", "--dsn", url, "--",
        *child, "env", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    row = status(url, "env-job")
    assert seen == {
        "PYLEASE_NAME": "env-job",
        "PYLEASE_HOLDER": "cron@web1",
        "PYLEASE_FENCE": str(row["fence"]),
        "PYLEASE_DSN": url,
    }


def test_a_reader_sees_its_epoch_never_a_fence(url: str, child: list[str], out: Path) -> None:
    # A writer came and went: a reader's epoch is that writer's fence.
    pylease("claim", "shared-job", "--ttl", "1m", "--holder", "w", "--dsn", url)
    pylease("release", "shared-job", "--holder", "w", "--dsn", url)
    result = pylease(
        "run", "shared-job", "--ttl", "1s", "--shared", "--holder", "r", "--dsn", url, "--",
        *child, "env", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen == {
        "PYLEASE_NAME": "shared-job",
        "PYLEASE_HOLDER": "r",
        "PYLEASE_EPOCH": "1",
        "PYLEASE_DSN": url,
    }


def test_the_child_sees_the_embedded_default(tmp_path: Path, child: list[str], out: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    result = pylease("run", "local", "--ttl", TTL, "--", *child, "env", str(out), env=env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen["PYLEASE_DSN"].startswith("sqlite:")
    assert seen["PYLEASE_DSN"].endswith(str(tmp_path / "state" / "pylease" / "leases.sqlite3"))
    _host, pid, token = seen["PYLEASE_HOLDER"].split(":")
    assert pid.isdigit() and len(token) == 32
    assert seen["PYLEASE_FENCE"] == "1"


# Busy ----------------------------------------------------------------------------------


def test_busy_exit(url: str, tmp_path: Path) -> None:
    held = pylease("claim", "job", "--ttl", "1m", "--holder", "other", "--dsn", url)
    assert held.returncode == 0, held.stderr
    marker = tmp_path / "ran"
    cmd = ["--", "touch", str(marker)]

    result = pylease("run", "job", "--ttl", "1s", "--dsn", url, *cmd)
    assert result.returncode == 1
    assert result.stderr.startswith("pylease: lease 'job' is held by other")
    assert len(result.stderr.splitlines()) == 1

    result = pylease("run", "job", "--ttl", "1s", "--busy-exit", "0", "--dsn", url, *cmd)
    assert result.returncode == 0
    assert "held by other" in result.stderr

    result = pylease("run", "job", "--ttl", "1s", "--busy-exit", "42", "-q", "--dsn", url, *cmd)
    assert (result.returncode, result.stderr) == (42, "")

    result = pylease("run", "job", "--ttl", "1s", "--wait", "300ms", "--dsn", url, *cmd)
    assert result.returncode == 1
    assert not marker.exists()


def test_wait_runs_once_the_holder_is_gone(url: str, tmp_path: Path) -> None:
    held = pylease("claim", "job", "--ttl", "500ms", "--holder", "other", "--dsn", url)
    assert held.returncode == 0, held.stderr
    marker = tmp_path / "ran"
    result = pylease(
        "run", "job", "--ttl", TTL, "--wait", "30s", "--dsn", url, "--", "touch", str(marker)
    )
    assert result.returncode == 0, result.stderr
    assert marker.exists()


def test_min_hold_allows_one_run_per_period(url: str) -> None:
    first = pylease("run", "daily", "--ttl", TTL, "--min-hold", "1h", "--dsn", url, "--", "true")
    assert first.returncode == 0, first.stderr
    second = pylease("run", "daily", "--ttl", TTL, "--busy-exit", "9", "--dsn", url, "--", "true")
    assert second.returncode == 9


# Signals and lost leases -------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]], signum: int
) -> None:
    proc = start(started, "run", "job", "--ttl", TTL, "--dsn", url, "--", *child, "trap", str(out))
    wait_for(out, "ready", proc)
    proc.send_signal(signum)
    code, err = finish(proc)
    assert code == 100 + signum, err
    assert out.read_text().splitlines() == ["ready", signal.Signals(signum).name]
    assert status(url, "job")["held"] is False


def test_a_child_killed_by_a_forwarded_sigterm_gives_143(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = start(started, "run", "job", "--ttl", TTL, "--dsn", url, "--", *child, "wait", str(out))
    wait_for(out, "ready", proc)
    proc.terminate()
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert status(url, "job")["held"] is False


def test_a_stolen_lease_stops_the_child_and_exits_75(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = start(
        started, "run", "job", "--ttl", LOSS_TTL, "--dsn", url, "--", *child, "trap", str(out)
    )
    wait_for(out, "ready", proc)
    stolen = pylease("steal", "job", "--ttl", "1m", "--holder", "operator", "--dsn", url)
    assert stolen.returncode == 0, stolen.stderr
    code, err = finish(proc)
    assert code == 75, err
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert "lease 'job' was lost" in lines[0]
    # The database knows who has it now, and how: said once the command is stopped.
    assert re.fullmatch(
        r"pylease: lease 'job' is now held by operator \(fence 2\), "
        r"who stole it \((now|\d+m?s ago)\)",
        lines[1],
    ), lines
    assert out.read_text().splitlines() == ["ready", "SIGTERM"]
    row = status(url, "job")
    assert (row["holder"], row["held"]) == ("operator", True)


def test_a_lease_taken_over_says_by_whom_and_how(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = start(
        started, "run", "job", "--ttl", LOSS_TTL, "--dsn", url, "--", *child, "trap", str(out)
    )
    wait_for(out, "ready", proc)
    proc.send_signal(signal.SIGSTOP)  # the supervisor only: its lease runs out
    try:
        taken = pylease(
            "claim", "job", "--ttl", "1m", "--holder", "next", "--wait", "30s", "--dsn", url
        )
        assert taken.returncode == 0, taken.stderr
    finally:
        proc.send_signal(signal.SIGCONT)
    code, err = finish(proc)
    assert code == 75, err
    lines = err.splitlines()
    assert "lease 'job' was lost" in lines[0]
    assert lines[-1].startswith(
        "pylease: lease 'job' is now held by next (fence 2), who took it over after its ttl ran out"
    ), lines


def test_a_child_ignoring_sigterm_is_killed_after_kill_after(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = start(
        started, "run", "job", "--ttl", LOSS_TTL, "--kill-after", "300ms", "--dsn", url, "--",
        *child, "stubborn", str(out),
    )  # fmt: skip
    wait_for(out, "ready", proc)
    assert pylease("steal", "job", "--ttl", "1m", "--holder", "op", "--dsn", url).returncode == 0
    code, err = finish(proc)
    assert code == 75, err
    assert "SIGKILL" in err
    assert out.read_text().splitlines() == ["ready"]


def test_two_runs_at_once_one_runs_one_is_busy(
    url: str, child: list[str], tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    outs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    procs = [
        start(
            started, "run", "race", "--ttl", TTL, "--dsn", url, "--", *child, "sleep", str(o), "3"
        )
        for o in outs
    ]
    assert sorted(finish(p)[0] for p in procs) == [0, 1]


def test_two_runs_with_one_holder_one_runs_the_other_is_busy_saying_why(
    url: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    # `pylease run --holder $(hostname)` in two places (issue 21, item 10): the second
    # claim used to re-claim the first one's live tenure, and both commands ran.
    holder = socket.gethostname()
    first = start(
        started, "run", "race", "--ttl", "5s", "--holder", holder, "--dsn", url,
        "--", *child, "trap", str(out),
    )  # fmt: skip
    wait_for(out, "ready", first)
    second = pylease(
        "run", "race", "--ttl", "5s", "--holder", holder, "--dsn", url,
        "--", *child, "env", str(out),
    )  # fmt: skip
    assert second.returncode == 1, second.stderr
    assert f"is held by {holder}" in second.stderr
    assert "this claim's own --holder, which another process uses" in second.stderr
    claimed = pylease("claim", "race", "--ttl", "5s", "--holder", holder, "--dsn", url)
    assert claimed.returncode == 1
    assert "another process uses" in claimed.stderr
    first.send_signal(signal.SIGTERM)
    assert finish(first)[0] == 100 + signal.SIGTERM
    assert "PYLEASE" not in out.read_text()  # the second command never ran


def test_a_spinner_names_the_holder_while_waiting_on_a_terminal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    # Held until the spinner was seen, however long pylease takes to start: a holder
    # whose ttl ran out first would leave nothing to wait for, hence no spinner.
    held = pylease("claim", "job", "--ttl", "10m", "--holder", "someone-else", "--dsn", url)
    assert held.returncode == 0, held.stderr
    wanted = b"waiting for lease 'job': held by someone-else"
    leader, follower = os.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pylease",
            "run",
            "job",
            "--ttl",
            "30s",
            "--wait",
            "30s",
            "--dsn",
            url,
            "--",
            "true",
        ],
        env=_env({"TERM": "xterm-256color", "COLUMNS": "120"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    shown = b""
    release: subprocess.Popen[str] | None = None
    try:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            shown += chunk
            if release is None and wanted in shown:
                # Released from another process while this loop keeps the terminal
                # drained, so the spinner never blocks on a full terminal.
                release = subprocess.Popen(
                    [sys.executable, "-m", "pylease", "release", "job",
                     "--holder", "someone-else", "--dsn", url],
                    env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
    finally:
        os.close(leader)
        code = proc.wait(timeout=60)
    assert release is not None, f"no spinner naming the holder on the terminal: {shown!r}"
    _, release_err = release.communicate(timeout=60)
    assert release.returncode == 0, release_err
    assert code == 0, shown  # it ran once the holder released, within its --wait


class Proxy:
    """A TCP relay to PostgreSQL that can be cut, as a network partition would."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = self._connect()
            except OSError:
                return
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _connect(self) -> socket.socket:
        host, port = self.upstream
        if not host.startswith("/"):
            return socket.create_connection(self.upstream)
        server = socket.socket(socket.AF_UNIX)  # a libpq socket directory
        server.connect(f"{host}/.s.PGSQL.{port}")
        return server

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone would not.
        for sock in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_an_unreachable_database_stops_the_child_and_exits_75(
    dsn: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    params = dsn_mod.parse(dsn)
    proxy = Proxy(params.get("host", "127.0.0.1"), int(params.get("port", "5432")))
    params.update(host="127.0.0.1", port=str(proxy.port))
    via_proxy = make_conninfo("", **params)
    # A ttl long enough that the child's trap ends it well before the local expiry,
    # even on a loaded machine: a SIGKILL at the expiry would add a line of its own.
    proc = start(
        started, "run", "job", "--ttl", LOSS_TTL, "--dsn", via_proxy, "--", *child, "trap", str(out)
    )
    try:
        wait_for(out, "ready", proc)
    finally:
        proxy.cut()
    code, err = finish(proc)
    assert code == 75, err
    assert "lease 'job' was lost" in err
    assert out.read_text().splitlines() == ["ready", "SIGTERM"]
    # One line when renewals start failing, with the deadline; one at the loss.
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("pylease: renewing lease 'job' failed (database unavailable: ")
    assert re.search(r"retrying until it expires at \d\d:\d\d:\d\d \(in \d+m?s\)$", lines[0])
    assert lines[1].startswith("pylease: lease 'job' was lost")
    assert "pylease: pylease" not in err and err.count("pylease:") == 2


class Switch(Proxy):
    """A relay that can be cut and then restored: an outage the lease outlives."""

    down = False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            server = self._connect()
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def drop(self) -> None:
        self.down = True
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.sockets = []


def test_an_outage_the_lease_outlives_is_one_line_then_one_at_recovery(
    dsn: str, child: list[str], out: Path, started: list[subprocess.Popen[str]]
) -> None:
    params = dsn_mod.parse(dsn)
    switch = Switch(params.get("host", "127.0.0.1"), int(params.get("port", "5432")))
    params.update(host="127.0.0.1", port=str(switch.port))
    via = make_conninfo("", **params)
    proc = start(started, "run", "job", "--ttl", "9s", "--dsn", via, "--", *child, "trap", str(out))
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()

    def said(text: str) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(text in line for line in lines):
                return True
            time.sleep(0.05)
        return False

    try:
        wait_for(out, "ready", proc)
        switch.drop()
        assert said("renewing lease 'job' failed"), lines
        switch.down = False
        assert said("renewing lease 'job' works again"), lines
        proc.send_signal(signal.SIGTERM)
        code, _ = finish(proc)  # and the release goes through
        reader.join(10)
    finally:
        switch.cut()
    assert code == 100 + signal.SIGTERM, lines
    assert len(lines) == 2, lines
    assert "retrying until it expires at" in lines[0]
    assert re.fullmatch(
        r"pylease: renewing lease 'job' works again, after \d+ failed attempt\(s\)\n", lines[1]
    ), lines
    assert out.read_text().splitlines() == ["ready", "SIGTERM"]


def test_run_wait_forever(url: str, tmp_path: Path, started: list[subprocess.Popen[str]]) -> None:
    assert pylease("claim", "job", "--ttl", "1h", "--holder", "a", "--dsn", url).returncode == 0
    mark = tmp_path / "ran"
    proc = start(
        started, "run", "job", "--ttl", "1m", "--wait", "forever", "--dsn", url,
        "--", sys.executable, "-c", f"open({str(mark)!r}, 'w').close()",
    )  # fmt: skip
    time.sleep(1.0)
    assert proc.poll() is None and not mark.exists()
    assert pylease("release", "job", "--holder", "a", "--dsn", url).returncode == 0
    code, err = finish(proc)
    assert code == 0, err
    assert mark.exists()
