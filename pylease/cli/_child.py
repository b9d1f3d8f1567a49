"""The child process of ``pylease run``: start it, pass signals on, stop it when the lease is lost.

Exit codes follow the shell's: the child's own code; 128+N when a signal N killed
it; 127 when the command does not exist; 126 when it cannot be executed.

A command must not outlive the lease it runs under: once the lease is lost it gets
SIGTERM, and SIGKILL ``--kill-after`` later but never later than the lease's local
expiry (the moment the last successful claim or renewal was sent, plus the ttl, less
the clock-rate margin: no later than the server's expiry). The local expiry is watched
on its own, so a keeper that is late to declare the loss still cannot let the command
run past it.

"The command" is its whole process group: the child starts a group of its own, every
stop goes to the group, and when the child exits, what it left running in the group (a
shell script's background work) is stopped the same way before the lease is released.
A process that leaves the group itself (``setsid``, a daemon) is outside this promise.
The group dies with pylease too, even a pylease killed by SIGKILL: a small watchdog
(:mod:`pylease.cli._watchdog`) stops it then.
On a terminal, the child's group takes the foreground while it runs, so an interactive
command keeps the keyboard (and Ctrl-C reaches it directly).

SIGINT, SIGTERM and SIGHUP before the child starts end pylease (it releases); the
other signals a service manager or a log rotation sends (SIGUSR1, SIGUSR2, SIGQUIT,
SIGALRM, SIGWINCH) never kill pylease: they are passed on to the command's group, or,
before it starts, once it has.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pylease.cli._watchdog import group_alive, group_running

ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PASSED_ON = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM, signal.SIGWINCH)
FORWARDED = ENDING + PASSED_ON
NOT_FOUND = 127
NOT_EXECUTABLE = 126
LOST = 75  # EX_TEMPFAIL: somebody else has the lease now; try again later
# Asked to step down (lease_request_release): the command was stopped as for a loss and
# the lease given back, for another to take it.
STEPPED_DOWN = 76
POLL = 0.1
KILLED_WAIT = 1.0
KILLED_POLL = 0.005

Say = Callable[[str], None]


class Signalled(BaseException):
    """A forwarded signal arrived while no child was running yet."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@dataclass(frozen=True)
class Outcome:
    """How the child ended: the exit code to pass on, and whether the lease was lost."""

    code: int
    lost: bool


def time_left(held: Any) -> Callable[[], float]:
    """Seconds until ``held``'s local expiry (negative once past it), as a function.

    The local expiry moves on with every renewal; it is read afresh on every call.
    """
    from pylease._acompat import monotonic  # the keeper's clock, which expiries are on

    ticket = held._ticket
    return lambda: float(ticket.believed_until) - monotonic()


def exit_code(returncode: int) -> int:
    """A Popen return code as a shell reports it: a death by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


# Signals of PASSED_ON that came before the child started, to pass on once it has.
_early: list[int] = []


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While waiting for the lease, SIGINT, SIGTERM and SIGHUP raise :class:`Signalled`;
    the signals of PASSED_ON are kept for the command."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        if signum in ENDING:
            raise Signalled(signum)
        _early.append(signum)

    _early.clear()
    with _handlers(handler):
        yield


@contextlib.contextmanager
def _handlers(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _terminal() -> int | None:
    """The descriptor of our controlling terminal when our group has its foreground."""
    for stream in (sys.stdin, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                fd = stream.fileno()
                return fd if os.tcgetpgrp(fd) == os.getpgrp() else None
        except (OSError, ValueError):
            continue
    return None


@contextlib.contextmanager
def _foreground(pgid: int) -> Iterator[None]:
    """Give the terminal's foreground to the child's group while it runs, then take it back."""
    fd = _terminal()
    if fd is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    # A background group that changes the foreground gets SIGTTOU: not while we do.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgid)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to the child's whole process group (it leads one of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)


def supervise(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    lost: threading.Event,
    kill_after: float,
    say: Say,
    why_lost: Callable[[], str],
    remaining: Callable[[], float] | None = None,
) -> Outcome:
    """Run ``argv`` until it exits; stop it (SIGTERM, then SIGKILL) once ``lost`` is set.

    :param remaining: seconds left until the lease's local expiry (see :func:`time_left`):
        SIGKILL comes no later than that, whatever ``kill_after`` says.
    """
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)  # arrived while the child was being started
        else:
            _signal_group(child, signum)

    pending.extend(_early)
    _early.clear()
    with _handlers(forward), _Watchdog() as watchdog:
        try:
            # A group of its own: a stop reaches the command's children too.
            child = subprocess.Popen(list(argv), env=dict(env), process_group=0)
        except FileNotFoundError:
            say(f"{argv[0]}: command not found")
            return Outcome(NOT_FOUND, lost=False)
        except PermissionError:
            say(f"{argv[0]}: permission denied")
            return Outcome(NOT_EXECUTABLE, lost=False)
        except OSError as exc:
            say(f"{argv[0]}: cannot execute: {exc.strerror or exc}")
            return Outcome(NOT_EXECUTABLE, lost=False)
        watchdog.guard(child.pid, kill_after)
        if remaining is not None:
            remaining = watchdog.told(remaining)
        with _foreground(child.pid):
            for signum in pending:
                forward(signum, None)
            outcome = _watch(
                child,
                argv,
                lost=lost,
                kill_after=kill_after,
                say=say,
                why_lost=why_lost,
                remaining=remaining,
            )
        _stop_leftovers(child.pid, argv, kill_after=kill_after, say=say, remaining=remaining)
        return outcome


class _Watchdog:
    """The process that stops the command's group if pylease dies (:mod:`._watchdog`).

    Started before the command, so that no moment of the command's life is unguarded
    but the one between its start and :meth:`guard`; killed on the way out only once the
    group is gone, so that an exception that leaves the command running leaves it to the
    watchdog. Killed, not told to exit and waited for: after a short command it may
    still be starting (a Python start-up), which ``pylease run`` in a shell loop would
    wait for every time.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._until: float | None = None

    def __enter__(self) -> _Watchdog:
        script = os.path.join(os.path.dirname(__file__), "_watchdog.py")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", script, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
            )
        except OSError:
            self._proc = None  # no watchdog: the command is guarded as before, while we live
        return self

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):  # it left: the group is gone
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()

    def guard(self, pgid: int, kill_after: float) -> None:
        self._pgid = pgid
        self._send(f"group {pgid} {kill_after!r}")

    def told(self, remaining: Callable[[], float]) -> Callable[[], float]:
        """``remaining``, which also tells the watchdog each new local expiry it reads."""
        from pylease._acompat import monotonic  # the keeper's clock, as the watchdog's

        def read() -> float:
            left = remaining()
            until = monotonic() + left
            if self._until is None or abs(until - self._until) > 0.01:
                self._until = until
                self._send(f"until {until!r}")
            return left

        return read

    def __exit__(self, *exc_info: object) -> None:
        proc = self._proc
        if proc is None:
            return
        gone = self._pgid is None or not group_alive(self._pgid)
        if gone:
            proc.kill()  # nothing is left for it to guard
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()  # if the group runs on, the watchdog stops it now
        if gone:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def _stop_leftovers(
    pgid: int,
    argv: Sequence[str],
    *,
    kill_after: float,
    say: Say,
    remaining: Callable[[], float] | None,
) -> None:
    """Stop what the command left running in its group (SIGTERM, then SIGKILL after
    ``kill_after`` or at the local expiry), before the lease is released."""
    if not group_running(pgid):
        return
    say(f"{argv[0]} exited, leaving processes of its group running; sending them SIGTERM")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    end = time.monotonic() + kill_after
    while group_running(pgid):
        left = end - time.monotonic()
        if remaining is not None:
            left = min(left, remaining())
        if left <= 0:
            say(f"processes of {argv[0]}'s group still running; sending them SIGKILL")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            _await_killed(pgid)
            return
        time.sleep(min(POLL, left))


def _await_killed(pgid: int) -> None:
    """Return once SIGKILL has ended every process of the group, or after ``KILLED_WAIT``.

    A pending SIGKILL ends a process only when the kernel next runs it, and a process in
    uninterruptible sleep (disk or NFS I/O) finishes that first: the release waits for it,
    so that the next holder is not granted while the command still writes. The bound
    keeps a process stuck in the kernel from holding the release past the lease's expiry
    by much; the lease is then lost anyway.
    """
    end = time.monotonic() + KILLED_WAIT
    while group_running(pgid) and time.monotonic() < end:
        time.sleep(KILLED_POLL)


def _watch(
    child: subprocess.Popen[bytes],
    argv: Sequence[str],
    *,
    lost: threading.Event,
    kill_after: float,
    say: Say,
    why_lost: Callable[[], str],
    remaining: Callable[[], float] | None = None,
) -> Outcome:
    """Wait for the child, polling ``lost``; SIGTERM it once lost, SIGKILL after ``kill_after``
    or at the lease's local expiry, whichever comes first."""
    terminated_at: float | None = None
    killed = False
    while True:
        left = remaining() if remaining is not None and not killed else None
        if left is not None and left <= 0:
            # Past the local expiry somebody else may hold the lease: no grace period.
            if terminated_at is None:
                say(
                    f"{why_lost()}; its ttl ran out: sending SIGKILL to {argv[0]} (pid {child.pid})"
                )
                terminated_at = time.monotonic()
            else:
                say(f"{argv[0]} still running at the lease's expiry; sending SIGKILL")
            _signal_group(child, signal.SIGKILL)
            killed = True
            left = None
        try:
            # Wake at the expiry itself rather than up to a poll later.
            returncode = child.wait(timeout=POLL if left is None else max(min(POLL, left), 0.001))
            break
        except subprocess.TimeoutExpired:
            pass
        past_expiry = remaining is not None and not killed and remaining() <= 0
        if past_expiry:
            continue  # SIGKILL at the top of the loop: no SIGTERM past the expiry
        if lost.is_set() and terminated_at is None:
            say(f"{why_lost()}; sending SIGTERM to {argv[0]} (pid {child.pid}) and its group")
            _signal_group(child, signal.SIGTERM)
            terminated_at = time.monotonic()
        elif (
            terminated_at is not None
            and not killed
            and time.monotonic() - terminated_at >= kill_after
        ):
            say(f"{argv[0]} still running {kill_after:g}s after SIGTERM; sending SIGKILL")
            _signal_group(child, signal.SIGKILL)
            killed = True
    if terminated_at is not None:
        return Outcome(LOST, lost=True)
    return Outcome(exit_code(returncode), lost=False)
