"""``pylease run`` stops the whole command, however it forks, and no signal orphans it.

The commands here are what operators write: a shell script that starts work in the
background, a wrapper that waits for its child. Their grandchildren must be stopped
before anyone else can be granted the lease; a log rotation's SIGUSR1 must reach the
command, not kill pylease (issue 21, items 1 and 2).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli.test_run import finish, pylease, start, status, wait_for
from tests.leader.test_leader_cli import standing_by

# A shell that starts work in the background and says so; then waits for it, or exits.
TREE = 'sleep 300 & echo $! > "$0"; echo ready >> "$1"; {}'

TRAPS = r"""
import signal, sys, time
out = sys.argv[1]
def on(signum, frame):
    with open(out, "a") as f:
        f.write(signal.Signals(signum).name + "\n")
    if signum == signal.SIGALRM:
        sys.exit(0)
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM):
    signal.signal(s, on)
with open(out, "a") as f:
    f.write("ready\n")
time.sleep(60)
"""


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped yet has stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def grandchild(pidfile: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError("the command never started its background work")


@pytest.fixture
def started() -> list[subprocess.Popen[str]]:
    return []


@pytest.mark.parametrize("stop", ["SIGTERM to pylease", "a stolen lease"])
def test_a_stop_reaches_the_commands_grandchildren(
    url: str, tmp_path: Path, started: list[subprocess.Popen[str]], stop: str
) -> None:
    pidfile, out = tmp_path / "gpid", tmp_path / "out"
    script = TREE.format("wait")
    proc = start(
        started, "run", "job", "--ttl", "5s", "--dsn", url, "--",
        "sh", "-c", script, str(pidfile), str(out),
    )  # fmt: skip
    try:
        wait_for(out, "ready", proc)
        pid = grandchild(pidfile)
        if stop == "a stolen lease":
            stolen = pylease("steal", "job", "--ttl", "1m", "--holder", "operator", "--dsn", url)
            assert stolen.returncode == 0, stolen.stderr
        else:
            proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
        assert code in (75, 128 + signal.SIGTERM), err
        assert not alive(pid), "the background work outlived pylease run"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_what_the_command_left_running_is_stopped_before_the_release(
    url: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    pidfile, out = tmp_path / "gpid", tmp_path / "out"
    script = TREE.format("exit 0")
    proc = start(
        started, "run", "job", "--ttl", "30s", "--kill-after", "2s", "--dsn", url, "--",
        "sh", "-c", script, str(pidfile), str(out),
    )  # fmt: skip
    wait_for(out, "ready", proc)
    pid = grandchild(pidfile)
    # Another party claims as soon as the name is free, and looks at that moment.
    seen: list[bool] = []

    def contender() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = pylease("claim", "job", "--ttl", "1m", "--holder", "next", "--dsn", url)
            if got.returncode == 0:
                seen.append(alive(pid))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=contender)
    thread.start()
    code, err = finish(proc)
    thread.join(90)
    assert code == 0, err
    assert seen == [False], "the lease was free while the command's background work ran"


def test_other_signals_reach_the_command_and_do_not_kill_run(
    url: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    script, out = tmp_path / "traps.py", tmp_path / "out"
    script.write_text(TRAPS)
    proc = start(
        started, "run", "job", "--ttl", "5s", "--dsn", url, "--",
        sys.executable, str(script), str(out),
    )  # fmt: skip
    wait_for(out, "ready", proc)
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        proc.send_signal(signum)
        wait_for(out, signal.Signals(signum).name, proc)
    proc.send_signal(signal.SIGALRM)  # the command exits 0 on this one
    code, err = finish(proc)
    assert code == 0, err
    assert status(url, "job")["held"] is False


# The command's shell and its background work, with both pids in the pidfile.
SHELL_AND_WORK = 'sleep 300 & echo "$$ $!" > "$0"; echo ready >> "$1"; wait'


def pids(pidfile: Path) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        words = pidfile.read_text().split() if pidfile.exists() else []
        if len(words) == 2:
            return [int(w) for w in words]
        time.sleep(0.02)
    raise AssertionError("the command never started its background work")


def watchdogs_of(pid: int) -> list[int]:
    """The pids of processes still running ``pylease.cli._watchdog`` for ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = any(a.endswith(b"_watchdog.py") for a in argv) and str(pid).encode() in argv
        if ours and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("command", ["run", "leader"])
def test_a_sigkilled_pylease_takes_its_commands_group_with_it(
    url: str, tmp_path: Path, started: list[subprocess.Popen[str]], command: str
) -> None:
    # The OOM killer's SIGKILL: pylease runs no code, yet nothing of the command remains.
    pidfile, out = tmp_path / "pids", tmp_path / "out"
    proc = start(
        started, command, "job", "--ttl", "1m", "--dsn", url, "--",
        "sh", "-c", SHELL_AND_WORK, str(pidfile), str(out),
    )  # fmt: skip
    wait_for(out, "ready", proc)
    command_pids = pids(pidfile)
    proc.kill()
    proc.wait(timeout=30)
    try:
        assert gone_within(command_pids, 60) == [], "the command outlived a SIGKILLed pylease"
        assert gone_within(watchdogs_of(proc.pid), 30) == [], "the watchdog outlived its work"
    finally:
        for pid in command_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_watchdog_ends_with_pylease(url: str, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylease", "run", "job", "--ttl", "1m", "--dsn", url, "--",
         "sh", "-c", "sleep 0.5"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert watchdogs_of(proc.pid) == []
    assert err == ""


# A grandchild that stamps CLOCK_MONOTONIC (one clock for every process of the machine)
# into a file every 2 ms and ignores SIGTERM: only the SIGKILL after --kill-after stops
# it. Each stamp is taken while it runs, so a stamp later than another process's proves
# it ran then.
STAMPER = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while True:
    os.write(fd, b"%d\n" % time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    time.sleep(0.002)
"""
# The standby's command: its first act is its stamp, on the same clock.
FIRST_STAMP = (
    "import sys, time\n"
    "with open(sys.argv[1], 'a') as f:\n"
    "    f.write('%d\\n' % time.clock_gettime_ns(time.CLOCK_MONOTONIC))\n"
)
# The command's shell starts the stamper in the background, says its pid, and waits.
STAMPING_TREE = '"$0" "$1" "$2" & echo $! > "$3"; wait'
# Long enough that a loaded machine never loses the lease on the way (a loss stops the
# command before it is asked to), short enough that a request is learnt within 3 s.
STEP_TTL = "9s"


def stamps(path: Path) -> list[int]:
    text = path.read_text() if path.exists() else ""
    return [int(line) for line in text[: text.rfind("\n") + 1].split()]


@pytest.mark.parametrize("command", ["run", "leader"])
@pytest.mark.parametrize("stop", ["request-release", "SIGTERM"])
def test_the_grandchild_stops_before_the_standby_is_granted(
    url: str, tmp_path: Path, started: list[subprocess.Popen[str]], command: str, stop: str
) -> None:
    stamper, stamped = tmp_path / "stamper.py", tmp_path / "stamps"
    pidfile, first = tmp_path / "gpid", tmp_path / "standby"
    stamper.write_text(STAMPER)
    holder = start(
        started, command, "job", "--ttl", STEP_TTL, "--kill-after", "1s", "--dsn", url, "--",
        "sh", "-c", STAMPING_TREE, sys.executable, str(stamper), str(stamped), str(pidfile),
    )  # fmt: skip
    pid = grandchild(pidfile)
    deadline = time.monotonic() + 30
    while not stamps(stamped):
        assert time.monotonic() < deadline and holder.poll() is None, "the stamper never ran"
        time.sleep(0.02)
    waits = ["--wait", "1m"] if command == "run" else []
    standby = start(
        started, command, "job", "--ttl", STEP_TTL, *waits, "--dsn", url, "--",
        sys.executable, "-I", "-S", "-c", FIRST_STAMP, str(first),
    )  # fmt: skip
    standing_by(url, "job", standby)
    asked_at = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    if stop == "SIGTERM":
        holder.send_signal(signal.SIGTERM)
    else:
        asked = pylease("request-release", "job", "--dsn", url)
        assert asked.returncode == 0, asked.stderr
    code, err = finish(holder)
    standby_code, standby_err = finish(standby)
    assert standby_code == 0, standby_err
    [granted] = stamps(first)
    last = max(stamps(stamped))
    assert last > asked_at, f"the grandchild was gone before it was asked to stop: {err}"
    assert last < granted, (
        f"the grandchild ran {(last - granted) / 1e6:.1f} ms into the standby's term: {err}"
    )
    assert not alive(pid), f"the grandchild outlived its pylease: {err}"
    # The shell died of the SIGTERM (128+15), or pylease stepped down (76); either way
    # only SIGKILL stopped the grandchild.
    assert code == (76 if stop == "request-release" else 128 + signal.SIGTERM), err
    assert "sending them SIGKILL" in err, err


def test_a_group_whose_processes_were_killed_is_not_running_though_not_yet_reaped() -> None:
    """The release after a SIGKILL waits for the group on this: a zombie has stopped writing,
    while ``killpg(pgid, 0)`` still finds it."""
    from pylease.cli._watchdog import group_alive, group_running

    proc = subprocess.Popen(["sleep", "300"], process_group=0)
    try:
        assert group_running(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not alive(proc.pid), "SIGKILL did not end the process"
        assert group_alive(proc.pid), "the zombie is still in its group until it is reaped"
        assert not group_running(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not group_running(proc.pid)
