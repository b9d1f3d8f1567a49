"""The belief witness: did anybody act on a lease after it was granted to another?

Every party of a test (threads, asyncio tasks, forked children, other processes)
appends what it saw to one file, one JSON line per event, stamped with
CLOCK_MONOTONIC, which is one clock for the whole machine on Linux (processes
started under libfaketime keep it: see ``tests.support.faultkit.FakeClock``). Two kinds
of events matter:

- ``belief``: a holder sampled ``held.lost`` and ``held.check()``; it *believes*
  when ``lost`` was False and ``check()`` passed (or, for a command run by
  ``pylease run``, simply that it was still running and writing);
- ``grant``: a claimer was granted the lease; stamped when the claim *returned*,
  so the grant certainly happened before that instant.

The verdict fails on any belief of another holder stamped after a grant: at that
moment somebody else held the lease while this one still thought it did. Stamping
the grant late and the belief as its look begins keeps the verdict free of false
alarms (a holder stopped between its look and a later stamp would be judged at its
resumption); a test makes its holder keep sampling after the grant so the verdict has
evidence.

Each line is written with one ``write()`` on a file opened ``O_APPEND``, so lines
from many writers never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLOCK = time.CLOCK_MONOTONIC
SAMPLE_EVERY = 0.01


def now_ns() -> int:
    """The witness clock: the same in every process of the machine."""
    return time.clock_gettime_ns(CLOCK)


@dataclass(frozen=True)
class Event:
    t: int
    kind: str
    name: str
    holder: str
    pid: int
    fields: dict[str, Any]

    @property
    def believes(self) -> bool:
        return bool(self.fields.get("believes"))


class Violation(AssertionError):
    """A holder believed it held a lease after the lease was granted to another."""


class Witness:
    """An append-only record of beliefs and grants, shared by every party of a test.

    Pickles as its path, so a forked child or another process (``Witness(path)``)
    writes to the same record.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._fd_pid = -1

    def __reduce__(self) -> tuple[Any, ...]:
        return (Witness, (str(self.path),))

    def _write(self, record: dict[str, Any]) -> None:
        if self._fd is None or self._fd_pid != os.getpid():
            # A forked child opens its own descriptor: same file, same O_APPEND.
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            self._fd_pid = os.getpid()
        line = json.dumps(record, default=str) + "\n"
        os.write(self._fd, line.encode())

    def record(
        self, kind: str, name: str, holder: str, *, at: int | None = None, **fields: Any
    ) -> None:
        """Append one event, stamped now or ``at`` (a :func:`now_ns` reading)."""
        t = now_ns() if at is None else at
        self._write(
            {"t": t, "kind": kind, "name": name, "holder": holder, "pid": os.getpid()} | fields
        )

    # What holders and claimers report --------------------------------------------

    def sample(self, held: Any, who: str = "body") -> bool:
        """Record what ``held`` believes now (``lost`` and ``check()``); return it.

        Stamped before the look: a process stopped (SIGSTOP, a starved scheduler) between
        its look and a later stamp would be judged at its resumption, for a belief that
        held when it looked.
        """
        at = now_ns()
        lost = bool(held.lost)
        try:
            held.check()
            checked = True
        except Exception:
            checked = False
        believes = not lost and checked
        self.record(
            "belief",
            held.name,
            held.holder,
            at=at,
            believes=believes,
            lost=lost,
            check=checked,
            who=who,
        )
        return believes

    def acting(self, name: str, holder: str, who: str = "command") -> None:
        """Record that ``holder`` is acting on ``name`` now (it believes it holds it)."""
        self.record("belief", name, holder, believes=True, who=who)

    def grant(self, name: str, holder: str, fence: int | None = None) -> None:
        """Record, right after a claim returned, that ``holder`` was granted ``name``."""
        self.record("grant", name, holder, fence=fence)

    def note(self, what: str, name: str = "", holder: str = "", **fields: Any) -> None:
        """Record anything else worth seeing in a failure's story (ends, detections...)."""
        self.record("note", name, holder, what=what, **fields)

    @contextlib.contextmanager
    def watching(self, held: Any, every: float = SAMPLE_EVERY) -> Iterator[None]:
        """Sample ``held`` from a thread while the block runs (usable under asyncio too)."""
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                self.sample(held, who="watcher")
                stop.wait(every)

        thread = threading.Thread(target=run, name="witness-watcher", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
            self.sample(held, who="watcher-end")

    @contextlib.asynccontextmanager
    async def awatching(self, held: Any, every: float = SAMPLE_EVERY) -> AsyncIterator[None]:
        """Sample ``held`` from a task of the running loop while the block runs."""

        async def run() -> None:
            while True:
                self.sample(held, who="task")
                await asyncio.sleep(every)

        task = asyncio.get_running_loop().create_task(run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # The verdict -----------------------------------------------------------------

    def events(self) -> list[Event]:
        if not self.path.exists():
            return []
        out = []
        text = self.path.read_text()
        # A reader can see a writer's line half copied in; only whole lines are records.
        for line in text[: text.rfind("\n") + 1].splitlines():
            if not line.strip():
                continue
            raw = json.loads(line)
            t, kind, name, holder, pid = (
                raw.pop(k) for k in ("t", "kind", "name", "holder", "pid")
            )
            out.append(Event(t, kind, name, holder, pid, raw))
        out.sort(key=lambda e: e.t)
        return out

    def grants(self, name: str | None = None) -> list[Event]:
        return [e for e in self.events() if e.kind == "grant" and name in (None, e.name)]

    def violations(self) -> list[tuple[Event, Event]]:
        """(grant, belief) pairs: a belief of another holder stamped after the grant.

        A later grant back to the believer (it claimed again) ends the window.
        """
        events = self.events()
        found = []
        for i, grant in enumerate(events):
            if grant.kind != "grant":
                continue
            for later in events[i + 1 :]:
                if later.name != grant.name:
                    continue
                if later.kind == "grant" and later.holder != grant.holder:
                    break
                if later.kind == "belief" and later.holder != grant.holder and later.believes:
                    found.append((grant, later))
                    break
        return found

    def story(self, limit: int = 60) -> str:
        """The record, relative to its first event, for a failure message."""
        events = self.events()
        if not events:
            return "(no events)"
        t0 = events[0].t
        lines = []
        # Beliefs come a hundred a second: keep the changes, every grant and note.
        last: dict[tuple[str, str], bool] = {}
        for e in events:
            if e.kind == "belief":
                key = (e.name, e.holder)
                if last.get(key) == e.believes:
                    continue
                last[key] = e.believes
            at = (e.t - t0) / 1e9
            lines.append(f"{at:9.3f}s pid {e.pid} {e.kind:6} {e.name!r} {e.holder!r} {e.fields}")
        return "\n".join(lines[-limit:])

    def assert_sound(self) -> None:
        """Fail on any grant to another while an earlier holder still believed."""
        bad = self.violations()
        if bad:
            grant, belief = bad[0]
            raise Violation(
                f"lease {grant.name!r} was granted to {grant.holder!r} while {belief.holder!r}"
                f" still believed it held it ({(belief.t - grant.t) / 1e6:.1f} ms later,"
                f" sampled by {belief.fields.get('who')}):\n{self.story()}"
            )

    def assert_evidence(self, name: str, holder: str) -> None:
        """``holder`` sampled its belief after the last grant of ``name`` to another.

        Without a sample after the grant, a sound verdict proves nothing.
        """
        events = self.events()
        grants = [e for e in events if e.kind == "grant" and e.name == name and e.holder != holder]
        assert grants, f"no grant of {name!r} to anybody but {holder!r}:\n{self.story()}"
        after = [
            e
            for e in events
            if e.kind == "belief" and e.holder == holder and e.name == name and e.t > grants[-1].t
        ]
        assert after, f"{holder!r} never sampled after the grant:\n{self.story()}"


@contextlib.contextmanager
def witness(tmp_path: Path) -> Iterator[Witness]:
    """A fresh witness in ``tmp_path``."""
    yield Witness(tmp_path / "witness.jsonl")
