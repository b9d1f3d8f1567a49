"""Threads for asyncio: the pairs the async sources use and their generated twins get.

Every async name here has a sync twin of the name ``tools/async_to_sync.py`` gives
it (``ALock`` -> ``Lock``, ``aspawn`` -> ``spawn``, ...), so one source runs on an
event loop and, generated, on threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

# The keeper's clock: CLOCK_BOOTTIME where it exists, which is monotonic and also
# counts the time the host was suspended (a laptop lid, a paused VM): a lease's ttl
# runs on in the database while the client sleeps, so the client's count must too.
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def monotonic() -> float:
    """Seconds on the keeper's clock (CLOCK_BOOTTIME, else CLOCK_MONOTONIC)."""
    return time.clock_gettime(_CLOCK)


# Held across awaits: a connection's one statement at a time.
ALock = asyncio.Lock
Lock = threading.Lock
ACondition = asyncio.Condition
Condition = threading.Condition
AEvent = asyncio.Event
Event = threading.Event
# What runs a background loop: a task, or a daemon thread.
AWorker = asyncio.Task[None]
Worker = threading.Thread
# Guards state changed without awaiting in between: on one event loop nothing else
# runs meanwhile, so only threads need a lock.
Mutex = threading.Lock


class AMutex:
    """Nothing to guard on one event loop; a ``with`` block like :data:`Mutex`'s."""

    def __enter__(self) -> None:
        pass

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


def aspawn(
    fn: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str
) -> asyncio.Task[None]:
    """Run ``fn(*args)`` in a task of its own on the running loop."""
    return asyncio.get_running_loop().create_task(fn(*args), name=name)


def spawn(fn: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    """Run ``fn(*args)`` on a daemon thread of its own."""
    thread = threading.Thread(target=fn, args=args, name=name, daemon=True)
    thread.start()
    return thread


asleep = asyncio.sleep
sleep = time.sleep
ato_thread = asyncio.to_thread


def to_thread(fn: Callable[..., T], *args: Any) -> T:
    """A call a thread may make itself (``asyncio.to_thread`` on the async side)."""
    return fn(*args)


async def alock_within(lock: asyncio.Lock, timeout: float) -> bool:
    """Take ``lock``, waiting at most ``timeout`` seconds; False if it was not taken."""
    if not lock.locked():
        await lock.acquire()  # free: taken at once, without a task to time it
        return True
    try:
        await asyncio.wait_for(lock.acquire(), timeout)
    except TimeoutError:
        return False
    return True


def lock_within(lock: threading.Lock, timeout: float) -> bool:
    return lock.acquire(timeout=timeout)


async def acondition_wait(cond: asyncio.Condition, timeout: float) -> bool:
    """Wait on ``cond`` (held) up to ``timeout`` seconds; False on timeout."""
    try:
        await asyncio.wait_for(cond.wait(), timeout)
    except TimeoutError:
        return False
    return True


def condition_wait(cond: threading.Condition, timeout: float) -> bool:
    return cond.wait(timeout)
