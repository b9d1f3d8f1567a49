"""The child process of ``pylease run``: start it, pass signals on, stop it when the lease is lost.

Exit codes follow the shell's: the child's own code; 128+N when a signal N killed
it; 127 when the command does not exist; 126 when it cannot be executed.

A command must not outlive the lease it runs under: once the lease is lost it gets
SIGTERM, and SIGKILL ``--kill-after`` later but never later than the lease's local
expiry (the moment the last successful claim or renewal was sent, plus the ttl,
which comes no later than the server's expiry). The local expiry is watched on its
own, so a keeper that is late to declare the loss still cannot let the command run
past it.
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

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NOT_FOUND = 127
NOT_EXECUTABLE = 126
LOST = 75  # EX_TEMPFAIL: somebody else has the lease now; try again later
POLL = 0.1

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
    return lambda: float(ticket.expires) - monotonic()


def exit_code(returncode: int) -> int:
    """A Popen return code as a shell reports it: a death by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While waiting for the lease, SIGINT, SIGTERM and SIGHUP raise :class:`Signalled`."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise Signalled(signum)

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


def _from_terminal(signum: int) -> bool:
    """True when a terminal's Ctrl-C just sent this SIGINT to our whole process group.

    The child is in our process group, so it already has its own copy; a second
    one would look like an impatient user pressing Ctrl-C twice.
    """
    if signum != signal.SIGINT:
        return False
    for stream in (sys.stdin, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError):
            continue
    return False


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
        elif not _from_terminal(signum):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    with _handlers(forward):
        try:
            child = subprocess.Popen(list(argv), env=dict(env))
        except FileNotFoundError:
            say(f"{argv[0]}: command not found")
            return Outcome(NOT_FOUND, lost=False)
        except PermissionError:
            say(f"{argv[0]}: permission denied")
            return Outcome(NOT_EXECUTABLE, lost=False)
        except OSError as exc:
            say(f"{argv[0]}: cannot execute: {exc.strerror or exc}")
            return Outcome(NOT_EXECUTABLE, lost=False)
        for signum in pending:
            forward(signum, None)
        return _watch(
            child,
            argv,
            lost=lost,
            kill_after=kill_after,
            say=say,
            why_lost=why_lost,
            remaining=remaining,
        )


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
            with contextlib.suppress(ProcessLookupError):
                child.kill()
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
            say(f"{why_lost()}; sending SIGTERM to {argv[0]} (pid {child.pid})")
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
            terminated_at = time.monotonic()
        elif (
            terminated_at is not None
            and not killed
            and time.monotonic() - terminated_at >= kill_after
        ):
            say(f"{argv[0]} still running {kill_after:g}s after SIGTERM; sending SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            killed = True
    if terminated_at is not None:
        return Outcome(LOST, lost=True)
    return Outcome(exit_code(returncode), lost=False)
