"""What the ``pylease`` command shows: tables, the busy line, the spinner, log lines.

The commands (:mod:`pylease.cli`) decide what to do; this module decides how it
reads. Names and holders are data from whoever claimed: everything shown passes
through :func:`printable`, so it never drives the terminal nor hides how two
look-alike holders differ.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import typer

from pylease import durations
from pylease._rows import LeaseRow, PermitRow

PREFIX = "pylease: "
ELLIPSIS = "…"
GAP = "  "
# Below these the table stops shrinking a column and lets the line run long.
MIN_NAME = 12
MIN_HOLDER = 12


def say(message: str) -> None:
    """One line on stderr, with one ``pylease:`` prefix however the message was built."""
    typer.echo(PREFIX + strip_prefix(message), err=True)


def strip_prefix(message: str) -> str:
    """``message`` without ``pylease:`` prefixes, leading or after a colon (chained errors)."""
    text = message.removeprefix(PREFIX)
    return text.replace(": " + PREFIX, ": ")


def printable(text: str) -> str:
    """``text`` with control and invisible characters spelled out (``\\x1b``, ``\\u200b``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def iso(moment: datetime) -> str:
    return aware(moment).isoformat()


def ago(span: timedelta) -> str:
    """``3m ago`` (``now`` under a second), for times in the past."""
    if span < timedelta(seconds=1):
        return "now"
    return f"{durations.spell(span)} ago"


def who(row: LeaseRow) -> str:
    """Who holds a lease: its holder, or how many readers share it."""
    if row.holder is not None:
        return printable(row.holder)
    return f"{row.shared} reader{'' if row.shared == 1 else 's'}"


def row_json(row: LeaseRow) -> dict[str, Any]:
    """One lease for ``status --json``: ISO-8601 times, ``ttl`` in seconds."""
    return {
        "name": row.name,
        "holder": row.holder,
        "fence": row.fence,
        "held": row.held,
        "acquired_at": iso(row.acquired_at),
        "renewed_at": iso(row.renewed_at),
        "expires_at": iso(row.expires_at),
        # Added after the first release: at the end, as lease_status's own columns.
        "state": row.state,
        "ttl": row.ttl.total_seconds(),
        "shared": row.shared,
        "kind": "lease",  # beside semaphores (pylease.cli._permits.semaphore_json)
        # What its holder published with the tenure, and who asked it to step down.
        "data": row.data,
        "release_requested_by": row.release_requested_by,
    }


def busy_line(
    name: str,
    row: LeaseRow | None,
    now: datetime,
    where: str | None = None,
    claimer: str | None = None,
) -> str:
    """Why a claim was refused: who holds the lease, with which fence, until when; and
    when that is the claim's own ``claimer``, that another process uses it."""
    place = f" (in {where})" if where else ""
    if row is None:
        return f"lease {name!r} is busy{place}"
    left = aware(row.expires_at) - now
    by = who(row)
    if row.state == "shared":
        until = durations.relative(left, "the last expires in {}", "expired {} ago")
        return f"lease {name!r} is shared by {by} (epoch {row.fence}, {until}){place}"
    if row.state != "resting" and not row.held:
        return f"lease {name!r} is busy: a writer waits for it, and readers wait behind{place}"
    if row.held:
        until = durations.relative(left, "expires in {}", "expired {} ago")
        line = f"lease {name!r} is held by {by} (fence {row.fence}, {until}){place}"
        if row.holder == claimer:
            line += (
                ": that is this claim's own --holder, which another process uses"
                " (a holder names one claim; give each process its own)"
            )
        return line
    until = durations.relative(left, "claimable in {}", "free {} ago")
    return f"lease {name!r} was released by {by} and rests until its min-hold ({until}){place}"


def taken_line(name: str, row: LeaseRow, event: Any | None, now: datetime) -> str:
    """Who has the lease we lost, and how they got it, as the database recorded it."""
    by = who(row)
    if event is not None and event.fence == row.fence and event.event in ("stolen", "taken_over"):
        when = ago(now - aware(event.at))
        how = "stole it" if event.event == "stolen" else "took it over after its ttl ran out"
        return f"lease {name!r} is now held by {by} (fence {row.fence}), who {how} ({when})"
    return f"lease {name!r} is now held by {by} (fence {row.fence})"


# The status table ---------------------------------------------------------------


@dataclass(frozen=True)
class Cells:
    name: str
    state: str
    holder: str
    fence: str
    age: str
    expires: str
    # Shown with --wide only: the tenure's data, and a step-down request.
    data: str = ""


HEADER = Cells("NAME", "STATE", "HOLDER", "FENCE", "AGE", "EXPIRES", "DATA")


def data_cell(data: object, asked: str | None = None) -> str:
    """A lease's data as compact JSON (``-``: none), and who asked it to step down."""
    shown = "-" if data is None else printable(json.dumps(data, separators=(",", ":")))
    return shown if asked is None else f"{shown} (asked to step down by {printable(asked)})"


class Shown(Protocol):
    """A line of the status table that is not one row of the SQL (a semaphore)."""

    @property
    def name(self) -> str: ...

    def cells(self, now: datetime) -> Cells: ...


def cells(row: LeaseRow | PermitRow | Shown, now: datetime) -> Cells:
    """AGE is how long the state has lasted: held for, or free since; EXPIRES is when
    a held lease runs out, or when a resting one becomes claimable. A semaphore's slot
    is named by its number."""
    if not isinstance(row, LeaseRow | PermitRow):
        return row.cells(now)
    label = str(row.slot) if isinstance(row, PermitRow) else row.name
    state = row.state
    expires = aware(row.expires_at) - now
    if isinstance(row, LeaseRow) and state == "shared":
        state = f"shared by {row.shared}"
    if row.state in ("held", "shared"):
        age = durations.spell(now - aware(row.acquired_at))
        until = durations.relative(expires, "in {}", "{} ago")
    elif state == "resting":
        age = "-"  # the release's own time is not kept
        until = durations.relative(expires, "claimable in {}", "now")
    else:
        age = durations.spell(now - aware(row.expires_at)) if expires <= timedelta(0) else "-"
        until = "-"
    holder = "-" if row.holder is None else printable(row.holder)
    data = ""
    if isinstance(row, LeaseRow):
        data = data_cell(row.data, row.release_requested_by)
    return Cells(printable(label), state, holder, str(row.fence), age, until, data)


def shorten(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters: both ends tell holders apart
    (the host in front, the random part at the back)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    head = width // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def fold(text: str, width: int) -> list[str]:
    """``text`` in lines of ``width``: a name is never cut, only folded."""
    if width <= 0 or len(text) <= width:
        return [text]
    return [text[i : i + width] for i in range(0, len(text), width)]


def table(
    rows: Sequence[LeaseRow | PermitRow | Shown],
    now: datetime,
    width: int | None,
    header: Cells = HEADER,
) -> list[str]:
    """The lines of ``pylease status``; within ``width`` columns unless None (``--wide``).

    The narrow columns keep their size; NAME and HOLDER share the rest. Holders are
    shortened in the middle, names folded onto more lines, never shortened: a name
    is what an operator types next.
    """
    body = [cells(row, now) for row in rows]
    every = [header, *body]

    def widest(get: Callable[[Cells], str]) -> int:
        return max(len(get(c)) for c in every)

    fixed = {
        "state": widest(lambda c: c.state),
        "fence": widest(lambda c: c.fence),
        "age": widest(lambda c: c.age),
        "expires": widest(lambda c: c.expires),
    }
    name_w, holder_w = widest(lambda c: c.name), widest(lambda c: c.holder)
    if width is not None:
        room = width - sum(fixed.values()) - len(GAP) * 5
        if name_w + holder_w > room:
            if room - name_w >= MIN_HOLDER:  # names whole, holders shortened
                holder_w = room - name_w
            else:  # both long: enough of a holder to tell two apart, names folded
                holder_w = min(holder_w, max(room * 2 // 5, MIN_HOLDER))
                name_w = min(name_w, max(room - holder_w, MIN_NAME))
    # --wide shows what holders published, when any did (or was asked to step down).
    data = width is None and any(c.data not in ("", "-") for c in body)
    expires_w = widest(lambda c: c.expires)
    lines = []
    for c in every:
        names = fold(c.name, name_w)
        holder = shorten(c.holder, holder_w)
        first = [
            names[0].ljust(name_w),
            c.state.ljust(fixed["state"]),
            holder.ljust(holder_w),
            c.fence.rjust(fixed["fence"]),
            c.age.rjust(fixed["age"]),
            c.expires.ljust(expires_w) if data else c.expires,
        ]
        if data:
            first.append(c.data or "-")
        lines.append(GAP.join(first).rstrip())
        lines.extend(part.rstrip() for part in names[1:])
    return lines


# History ------------------------------------------------------------------------


def history_lines(events: Sequence[Any], now: datetime, width: int | None) -> list[str]:
    """``pylease history``: newest first, ``3m ago`` with the time itself beside it."""
    head = ("WHEN", "AT", "NAME", "EVENT", "HOLDER", "FENCE", "PREVIOUS")
    body = [
        (
            ago(now - aware(e.at)),
            aware(e.at).astimezone().strftime("%Y-%m-%d %H:%M:%S"),
            printable(e.name),
            e.event,
            printable(e.holder or "-"),
            str(e.fence) if e.fence is not None else "-",
            printable(e.previous_holder or "-"),
        )
        for e in events
    ]
    every = [head, *body]
    sizes = [max(len(r[i]) for r in every) for i in range(len(head))]
    if width is not None:
        fixed = sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[5] + len(GAP) * 6
        share = max((width - fixed) // 2, MIN_HOLDER)
        sizes[4] = min(sizes[4], share)
        sizes[6] = min(sizes[6], share)
    lines = []
    for r in every:
        shown = [
            r[0].ljust(sizes[0]),
            r[1].ljust(sizes[1]),
            r[2].ljust(sizes[2]),
            r[3].ljust(sizes[3]),
            shorten(r[4], sizes[4]).ljust(sizes[4]),
            r[5].rjust(sizes[5]),
            shorten(r[6], sizes[6]),
        ]
        lines.append(GAP.join(shown).rstrip())
    return lines


# Holders ------------------------------------------------------------------------


def holder_json(row: Any, data: object = None) -> dict[str, Any]:
    """One holder for ``holders --json``: ISO-8601 times."""
    return {
        "name": row.name,
        "holder": row.holder,
        "mode": row.mode,
        "slot": row.slot,
        "fence": row.fence,
        "acquired_at": iso(row.acquired_at),
        "renewed_at": iso(row.renewed_at),
        "expires_at": iso(row.expires_at),
        "data": data,
    }


def holders_lines(
    rows: Sequence[Any], data: Sequence[object], now: datetime, width: int | None
) -> list[str]:
    """``pylease holders``: one line per holder; holders shortened to fit, names never;
    with --wide (``width`` None) and data published, the exclusive holders' data last."""
    lines = _holders_table(rows, now, width)
    if width is None and any(d is not None for d in data):
        size = max(len(line) for line in lines)
        cells = ["DATA", *(data_cell(d) for d in data)]
        lines = [f"{line.ljust(size)}{GAP}{cell}" for line, cell in zip(lines, cells, strict=True)]
    return lines


def _holders_table(rows: Sequence[Any], now: datetime, width: int | None) -> list[str]:
    head = ("NAME", "MODE", "SLOT", "FENCE", "AGE", "EXPIRES", "HOLDER")
    body = [
        (
            printable(r.name),
            r.mode,
            "-" if r.slot is None else str(r.slot),
            str(r.fence),
            durations.spell(now - aware(r.acquired_at)),
            durations.relative(aware(r.expires_at) - now, "in {}", "{} ago"),
            printable(r.holder),
        )
        for r in rows
    ]
    every = [head, *body]
    sizes = [max(len(r[i]) for r in every) for i in range(len(head))]
    if width is not None:
        sizes[6] = min(sizes[6], max(width - sum(sizes[:6]) - len(GAP) * 6, MIN_HOLDER))
    right = (2, 3, 4)
    lines = []
    for r in every:
        cols = [
            c.rjust(n) if i in right else c.ljust(n)
            for i, (c, n) in enumerate(zip(r, sizes, strict=True))
        ]
        lines.append(GAP.join([*cols[:6], shorten(r[6], sizes[6])]).rstrip())
    return lines


# Waiting ------------------------------------------------------------------------


@contextlib.contextmanager
def spinner(name: str, quiet: bool) -> Iterator[Callable[[LeaseRow | None], None]]:
    """A spinner on stderr, shown from the first busy claim on, only on a terminal.

    The callback is what :func:`pylease.leasing.acquire` calls after a busy attempt.
    """
    if quiet or not sys.stderr.isatty():
        yield lambda _row: None
        return
    from rich.console import Console
    from rich.status import Status
    from rich.text import Text

    shown: list[Status] = []

    def show(row: LeaseRow | None) -> None:
        by = f": held by {who(row)}" if row is not None and row.held else ""
        text = Text(f"waiting for lease {name!r}{by}")
        if not shown:
            shown.append(Console(stderr=True).status(text))
            shown[0].start()
        shown[0].update(text)

    try:
        yield show
    finally:
        if shown:
            shown[0].stop()


# The library's log, as the command's stderr ----------------------------------------


class StderrLog(logging.Handler):
    """The library's warnings as stderr lines (and everything with ``-v``).

    Records are recognised by their ``pylease_event`` attribute, never by their text:
    a lost lease is left out (``pylease run`` says so itself, with what it does about
    it); a database outage under a held lease is one line when renewals start
    failing, with the moment the lease runs out, and one when they work again.
    """

    def __init__(self, verbose: Callable[[], bool]) -> None:
        super().__init__(logging.DEBUG)
        self._verbose = verbose
        self._lock_episode = threading.Lock()
        self._failing: set[str] = set()

    def failing(self, name: str) -> bool:
        """True while renewals of ``name`` fail (an outage is going on)."""
        with self._lock_episode:
            return name in self._failing

    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, "pylease_event", None)
        if event == "lost":
            return False
        if event in ("renew_failed", "renew_recovered"):
            return True
        return record.levelno >= logging.WARNING or self._verbose()

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "pylease_event", None)
        if event == "renew_failed":
            self._failed(record)
            return
        if event == "renew_recovered":
            self._recovered(record)
            return
        message = record.getMessage()
        if record.exc_info and self._verbose():
            message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        say(message)

    def _failed(self, record: logging.LogRecord) -> None:
        names: list[str] = list(getattr(record, "pylease_names", []))
        with self._lock_episode:
            new = [n for n in names if n not in self._failing]
            self._failing.update(names)
        if not new:
            if self._verbose():
                say(record.getMessage())
            return
        left = float(getattr(record, "pylease_expires_in", 0.0))
        deadline = datetime.now().astimezone() + timedelta(seconds=max(left, 0.0))
        error = getattr(record, "pylease_error", None)
        why = strip_prefix(" ".join(str(error).split())) if error is not None else "error"
        leases = ", ".join(repr(n) for n in new)
        say(
            f"renewing lease {leases} failed ({why}); retrying until it expires at "
            f"{deadline:%H:%M:%S} (in {durations.spell(timedelta(seconds=max(left, 0)))})"
        )

    def _recovered(self, record: logging.LogRecord) -> None:
        names: list[str] = list(getattr(record, "pylease_names", []))
        with self._lock_episode:
            back = [n for n in names if n in self._failing]
            self._failing.difference_update(names)
        if back:
            attempts = getattr(record, "pylease_attempt", 0)
            leases = ", ".join(repr(n) for n in back)
            say(f"renewing lease {leases} works again, after {attempts} failed attempt(s)")


def watch_frames(
    draw: Callable[[], list[str]], wake: Callable[[float], None], tty: bool
) -> Iterator[str]:
    """The frames of ``status --watch``: a new one whenever the drawing changes.

    ``wake(timeout)`` returns early when something happened (a NOTIFY); the drawing
    is looked at again at least every second, since ages and expiries move.
    """
    last: list[str] | None = None
    while True:
        lines = draw()
        if lines != last:
            clear = "\x1b[H\x1b[2J" if tty else ("\n" if last is not None else "")
            stamp = time.strftime("%H:%M:%S")
            yield clear + "\n".join([*lines, f"(watching, {stamp}; Ctrl-C to stop)"])
            last = lines
        wake(1.0)


class Busy:
    """The spinner, and the row that last stood in the way (for the busy line)."""

    def __init__(self, show: Callable[[LeaseRow | None], None]) -> None:
        self.row: LeaseRow | None = None
        self._show = show

    def __call__(self, row: LeaseRow | None) -> None:
        self.row = row
        self._show(row)
