"""The exit budget: how long leaving a lease block may take, all its steps together.

The contract (section 2): with a database that stops answering, a block ends at most
10 s after its body. Leaving it waits for the keeper's renewal already under way, for
the lease's own ``on_lost``, then releases (a connect, a statement, perhaps a second
attempt) and asks what became of a lost lease. Each step is bounded alone; together
they were not. So the steps of one exit draw on one budget, :data:`EXIT_BUDGET`:

- the waits (the renewal under way, ``on_lost``) end :data:`RELEASE_SHARE` before its
  deadline, which they leave to the release;
- every wait for a connection (a source's lock, a pool, a connect) and every
  statement's bound (:class:`pylease.postgres._abandon.bounded`) ends by the deadline,
  a statement being given at least :data:`FLOOR` (shorter, a slow but healthy
  connection of the caller's would be abandoned for nothing);
- what is optional (the release's second attempt, the cause of a loss) is skipped
  once too little is left.

The budget is a context variable, set by the exit around those steps only: the keeper's
renewals (another thread, another task) keep their own bounds.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token

from pylease.errors import DatabaseUnavailable

#: What leaving a block may take, of the contract's 10 s: the rest is room for a
#: statement's FLOOR past the deadline and for a loaded machine.
EXIT_BUDGET = 8.0
#: What the waits leave for the release: a connect and a statement.
RELEASE_SHARE = 4.0
#: The shortest bound a statement is given, even past the deadline.
FLOOR = 1.0
#: libpq's (and psycopg's) shortest connect timeout: a connect needs this much.
CONNECT_FLOOR = 2

#: The monotonic deadline of the exit under way in this context (None: none).
#: :class:`pylease.postgres._abandon.bounded` reads it for every statement.
exit_deadline: ContextVar[float | None] = ContextVar("pylease_exit_deadline", default=None)


def begin(seconds: float = EXIT_BUDGET) -> Token[float | None]:
    """Start an exit's budget of ``seconds`` from now in this context; the caller resets
    :data:`exit_deadline` with the token once the exit is over (every block's exit pays
    for this: no context manager)."""
    return exit_deadline.set(time.monotonic() + seconds)


def left() -> float | None:
    """Seconds left of the exit under way (never negative); None outside an exit."""
    deadline = exit_deadline.get()
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def waiting(seconds: float) -> float:
    """How long a wait an exit need not have (a renewal under way, ``on_lost``) may take."""
    remaining = left()
    return seconds if remaining is None else min(seconds, max(remaining - RELEASE_SHARE, 0.0))


def bound(seconds: float) -> float:
    """A statement's bound: ``seconds``, or less to end by the exit's deadline."""
    deadline = exit_deadline.get()
    if deadline is None:
        return seconds
    return min(seconds, max(deadline - time.monotonic(), FLOOR))


def wait_bound(seconds: float | None) -> float | None:
    """How long to wait for a connection (a lock, a pool): ``seconds`` (None: as long as
    it takes), or less to end by the exit's deadline."""
    remaining = left()
    if remaining is None:
        return seconds
    return remaining if seconds is None else min(seconds, remaining)


def spare(seconds: float) -> bool:
    """Whether an optional step that may take ``seconds`` still fits (outside an exit: yes)."""
    remaining = left()
    return remaining is None or remaining >= seconds


def connect_timeout(name: str | None, usual: int) -> int | None:
    """The connect timeout within the exit under way, at most ``usual`` (None: outside
    an exit, the conninfo's own).

    :raises DatabaseUnavailable: too little is left for a connect.
    """
    remaining = left()
    if remaining is None:
        return None
    if remaining < CONNECT_FLOOR:
        raise spent(name, "to connect")
    return min(int(remaining), usual)


def spent(name: str | None, what: str) -> DatabaseUnavailable:
    """The error of an exit whose budget ran out before ``what`` could be done."""
    return DatabaseUnavailable(
        f"pylease: database unavailable: leaving the block had no time left {what}"
        f" (it may take {EXIT_BUDGET:g}s in all)",
        name=name,
    )
