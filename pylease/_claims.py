"""The claims live in this process, by name and holder (one holder names one claim), and the
default holder that makes each claim its own.

Two live leases of the same name with the same holder would both believe they hold
it, with the same fence, and the first to leave would release it under the other
(issue 10, defect 10). Shared by the sync and async APIs, and so by every thread and
event loop of the process; a forked child starts with none (it holds none of its
parent's leases).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Hashable

from pylease.errors import InvalidArgument, LeaseBusy

_lock = threading.Lock()
# name -> holder -> (database, thread or task) of an exclusive claim there, else None.
_live: dict[str, dict[str, tuple[Hashable, tuple[str, int]] | None]] = {}


def _caller() -> tuple[str, int]:
    """The task running this (on an event loop), else the thread."""
    asyncio = sys.modules.get("asyncio")  # no task can run where asyncio was never loaded
    # No running loop, no task: asked without the RuntimeError current_task() raises.
    if asyncio is not None and asyncio._get_running_loop() is not None:
        task = asyncio.current_task()
        if task is not None:
            return ("task", id(task))
    return ("thread", threading.get_ident())


def enter_all(names: tuple[str, ...], holder: str, database: Hashable | None = None) -> None:
    """Record the claims of ``names`` (one claim of several names) by ``holder``, all or
    none; with ``database``, as exclusive claims of the calling thread or task there.

    :raises InvalidArgument: the same holder already has a live lease of one of the
        names here.
    :raises LeaseBusy: the same thread or task holds one of ``names`` on ``database``
        under another holder: this claim, nested in that block, would wait for itself.
    """
    mark = None if database is None else (database, _caller())
    with _lock:
        for name in names:
            claims = _live.get(name)
            if not claims:
                continue
            if holder in claims:
                raise InvalidArgument(
                    f"pylease: holder {holder!r} already has a live lease {name!r} in this"
                    " process: a holder names one claim (use a holder of its own for each"
                    " claim, or keep_fresh to renew a live lease)",
                    parameter="holder",
                    name=name,
                )
            if mark is not None:
                for other, by in claims.items():
                    if by == mark:
                        raise LeaseBusy(name, holder=other, here=True)
        for name in names:
            _live.setdefault(name, {})[holder] = mark


def disown(names: tuple[str, ...], holder: str) -> None:
    """The block of these claims is gone (its Held was collected): a claim of the names
    is no longer nested in it, though the lease stays recorded until it is given back.

    A finalizer's: it may run on a thread that holds the lock, so it never waits for it;
    replacing the value of a present key is atomic without it.
    """
    for name in names:
        claims = _live.get(name)
        if claims is not None and holder in claims:
            claims[holder] = None


def leave_all(names: tuple[str, ...], holder: str) -> None:
    """Forget the claims; nothing for one that was not recorded."""
    with _lock:
        for name in names:
            claims = _live.get(name)
            if claims is not None:
                claims.pop(holder, None)
                if not claims:
                    del _live[name]


def _after_fork() -> None:
    global _lock, _live, _holder_prefix
    # The lock may have been held by another thread at the fork: a new one.
    _lock = threading.Lock()
    _live = {}
    _holder_prefix = None  # a holder names the child's pid


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


_holder_prefix: str | None = None


def default_holder() -> str:
    """``host:pid:<128 random bits>``: unique per claim, readable by humans."""
    global _holder_prefix
    if _holder_prefix is None:
        # The host name and pid are asked once per process (forgotten at a fork): each
        # is a system call per claim.
        pid = os.getpid()
        _holder_prefix = f"{socket.gethostname()}:{pid}:"
    # What secrets.token_hex(16) returns, without importing secrets (hmac, OpenSSL).
    return _holder_prefix + os.urandom(16).hex()
