"""Durations on the command line: ``250ms``, ``30s``, ``5m``, ``1h30m`` or plain seconds.

Parsing and the short spelling used back in messages ("expires in 4m12s").
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_ORDER = ["d", "h", "m", "s", "ms"]
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
_PLAIN = re.compile(r"\d+(?:\.\d+)?|\.\d+")

HINT = "use e.g. 250ms, 30s, 5m, 1h30m, or plain seconds"
# ``--wait forever``: no deadline. timedelta.max stands for it where a span is expected.
FOREVER = timedelta.max
FOREVER_WORDS = ("forever",)


def parse(text: str, *, forever: bool = False) -> timedelta:
    """A duration from its command-line spelling.

    Units are ``d``, ``h``, ``m``, ``s`` and ``ms``, largest first, each at most
    once (``1h30m``, ``2m30s``); a plain number is seconds (``90``, ``0.25``).
    With ``forever``, the word ``forever`` gives :data:`FOREVER` (a wait without a
    deadline).

    :raises ValueError: the text is not a duration; the message says what is.
    """
    spelled = text.strip().lower()
    if forever and spelled in FOREVER_WORDS:
        return FOREVER
    if _PLAIN.fullmatch(spelled):
        return _finite(text, float(spelled))
    pos = 0
    total = 0.0
    last = -1
    for part in _PART.finditer(spelled):
        if part.start() != pos:
            break
        rank = _ORDER.index(part.group(2))
        if rank <= last:
            raise ValueError(f"{text!r} is not a duration: units must go largest first, once each")
        last = rank
        total += float(part.group(1)) * _UNITS[part.group(2)]
        pos = part.end()
    if pos == 0 or pos != len(spelled):
        raise ValueError(f"{text!r} is not a duration ({HINT})")
    return _finite(text, total)


def _finite(text: str, seconds: float) -> timedelta:
    if not math.isfinite(seconds) or seconds > timedelta.max.total_seconds() / 2:
        raise ValueError(f"{text!r} is too long a duration")
    return timedelta(seconds=seconds)


def spell(span: timedelta) -> str:
    """A short spelling of a span, to two units: ``250ms``, ``3s``, ``4m12s``, ``3d4h``."""
    seconds = abs(span.total_seconds())
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    while parts and parts[0][0] == 0:
        parts.pop(0)
    shown = parts[:2]
    while len(shown) > 1 and shown[-1][0] == 0:
        shown.pop()
    return "".join(f"{n}{unit}" for n, unit in shown)


def relative(span: timedelta, future: str, past: str) -> str:
    """``future``/``past`` with ``{}`` filled by the spelled span: "expires in 4m12s"."""
    return (future if span >= timedelta(0) else past).format(spell(span))
