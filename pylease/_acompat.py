"""Threads for asyncio: the pairs the async sources use and their generated twins get.

Every async name here has a sync twin of the name ``tools/async_to_sync.py`` gives
it (``ALock`` -> ``Lock``, ``aspawn`` -> ``spawn``, ...), so one source runs on an
event loop and, generated, on threads.

The async names are made on first use: a program that only runs the sync twins (the
command line on SQLite) never imports asyncio, which alone costs a start-up tens of ms.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

# The keeper's clock: CLOCK_BOOTTIME where it exists, which is monotonic and also
# counts the time the host was suspended (a laptop lid, a paused VM): a lease's ttl
# runs on in the database while the client sleeps, so the client's count must too.
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


#: Seconds on the keeper's clock (CLOCK_BOOTTIME, else CLOCK_MONOTONIC): a partial, so
#: that the several reads of every lease block cost no Python call each.
monotonic: Callable[[], float] = functools.partial(time.clock_gettime, _CLOCK)


# Held across awaits: a connection's one statement at a time.
Lock = threading.Lock
Condition = threading.Condition
Event = threading.Event
# What runs a background loop: a task, or a daemon thread.
Worker = threading.Thread
if TYPE_CHECKING:
    ALock = asyncio.Lock
    ACondition = asyncio.Condition
    AEvent = asyncio.Event
    AWorker = asyncio.Task[None]
    asleep = asyncio.sleep
    ato_thread = asyncio.to_thread
else:
    # asyncio's own, looked up when an async module first imports them.
    _ASYNCIO = {
        "ALock": "Lock",
        "ACondition": "Condition",
        "AEvent": "Event",
        "AWorker": "Task",
        "asleep": "sleep",
        "ato_thread": "to_thread",
    }

    def __getattr__(name: str) -> Any:
        found = _ASYNCIO.get(name)
        if found is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import asyncio

        value = getattr(asyncio, found)
        globals()[name] = value
        return value


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
    import asyncio

    return asyncio.get_running_loop().create_task(fn(*args), name=name)


def spawn(fn: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    """Run ``fn(*args)`` on a daemon thread of its own."""
    thread = threading.Thread(target=fn, args=args, name=name, daemon=True)
    thread.start()
    return thread


sleep = time.sleep


def to_thread(fn: Callable[..., T], *args: Any) -> T:
    """A call a thread may make itself (``asyncio.to_thread`` on the async side)."""
    return fn(*args)


async def alock_within(lock: asyncio.Lock, timeout: float) -> bool:
    """Take ``lock``, waiting at most ``timeout`` seconds; False if it was not taken."""
    if not lock.locked():
        await lock.acquire()  # free: taken at once, without a task to time it
        return True
    import asyncio

    try:
        await asyncio.wait_for(lock.acquire(), timeout)
    except TimeoutError:
        return False
    return True


def lock_within(lock: threading.Lock, timeout: float) -> bool:
    return lock.acquire(timeout=timeout)


async def acondition_wait(cond: asyncio.Condition, timeout: float) -> bool:
    """Wait on ``cond`` (held) up to ``timeout`` seconds; False on timeout."""
    import asyncio

    try:
        await asyncio.wait_for(cond.wait(), timeout)
    except TimeoutError:
        return False
    return True


def condition_wait(cond: threading.Condition, timeout: float) -> bool:
    return cond.wait(timeout)
