"""The watchdog of ``pylease run`` and ``pylease leader``: their command's group dies with them.

Linux's parent-death signal (``PR_SET_PDEATHSIG``) reaches one process, not a process
group, and a ``pylease run`` killed by SIGKILL (the OOM killer) runs no code of its
own. So :mod:`pylease.cli._child` starts this small process (a script of the standard
library only, run as ``python -I -S``: no site, no pylease import) before the command,
and tells it on a pipe:

``group PGID KILL_AFTER``
    the command's process group, and the grace between SIGTERM and SIGKILL;
``until T``
    the lease's local expiry on the keeper's clock (CLOCK_BOOTTIME where it
    exists): SIGKILL comes no later, as it would from ``pylease run`` itself.

The pipe's write end lives in pylease only, so the kernel closes it when pylease dies,
however it dies: end of file means pylease is gone, and the group gets SIGTERM, then
SIGKILL after KILL_AFTER or at T, whichever comes first. The watchdog outlives
neither: pylease kills it once the command's group is gone, it exits once it has
stopped the group, and once the group is gone (checked every second) while pylease
still runs. SIGINT, SIGTERM and SIGHUP do not stop it: they are pylease's to handle.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
CHECK = 1.0  # how often the group is looked at while pylease runs
POLL = 0.05


def clock() -> float:
    """Seconds on the keeper's clock, which the ``until`` lines are on."""
    return time.clock_gettime(CLOCK)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_running(pgid: int) -> bool:
    """Whether a process of the group can still run: one that is not a zombie.

    A process killed by SIGKILL is counted until the kernel has made it a zombie, which
    ``killpg(pgid, 0)`` cannot tell apart from a live one. Without ``/proc`` this is
    :func:`group_alive`.
    """
    if not group_alive(pgid):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited while we looked
        # After the command's name in parentheses: state, ppid, pgrp, ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _signal(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop(pgid: int, kill_after: float, until: float | None, owner: int) -> None:
    """SIGTERM to the group, then SIGKILL after ``kill_after`` or at ``until``."""
    if not group_alive(pgid):
        return
    sys.stderr.write(
        f"pylease: pylease (pid {owner}) died while its command ran; "
        f"stopping the command's process group {pgid}\n"
    )
    sys.stderr.flush()
    end = clock() + kill_after
    if until is not None:
        end = min(end, until)
    if end > clock():
        _signal(pgid, signal.SIGTERM)
    while group_alive(pgid) and clock() < end:
        time.sleep(POLL)
    if group_alive(pgid):
        _signal(pgid, signal.SIGKILL)


def watch(owner: int) -> None:
    """Read pylease's lines on stdin until the end of the group or pylease's death."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    pgid: int | None = None
    kill_after = 0.0
    until: float | None = None
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], CHECK)
        if not ready:
            if pgid is not None and not group_alive(pgid):
                return
            continue
        chunk = os.read(fd, 4096)
        if not chunk:  # pylease is gone, however it died
            if pgid is not None:
                stop(pgid, kill_after, until, owner)
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            word, *args = line.decode().split() or [""]
            if word == "group":
                pgid, kill_after = int(args[0]), float(args[1])
            elif word == "until":
                until = float(args[0])


if __name__ == "__main__":
    watch(int(sys.argv[1]))
