"""One table of scenarios, the behaviours of contract section 1, run against every backend.

Each scenario is a list of steps on the internal Backend interface; the same
steps must give the same results on PostgreSQL and on SQLite. A behaviour that
differs between backends is a bug. Expiry is reached with TTLs under a second
and a sleep a little past them; no step measures a duration.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pylease._backend import Backend
from pylease.errors import FenceExhausted, InvalidArgument
from pylease.postgres import PostgresBackend
from pylease.sqlite import SqliteBackend, connect, set_history

LONG = timedelta(seconds=30)
SHORT = timedelta(milliseconds=300)
PAST_SHORT = 0.45  # seconds to sleep for a SHORT lease (or span) to be over
DAY = timedelta(days=1)
LONG_NAME = "n" * 200
TOO_LONG = "n" * 201
MAX_FENCE = 2**63 - 1
MILLISECOND = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Keep:
    """Remember the result (not None) under a label."""

    label: str


@dataclass(frozen=True)
class Same:
    """Equal to the result remembered under a label."""

    label: str


@dataclass(frozen=True)
class Above:
    """Greater than the result remembered under a label."""

    label: str


@dataclass(frozen=True)
class Raises:
    """InvalidArgument with exactly this message (and the parameter it names)."""

    message: str

    @property
    def parameter(self) -> str:
        return self.message.removeprefix("pylease: ").split(" ", 1)[0]


@dataclass(frozen=True)
class Anything:
    """Any result."""


@dataclass(frozen=True)
class Granted:
    """A permit_claim that granted ``count`` slots (which ones is the backend's choice),
    each with ``fence`` when given."""

    count: int
    fence: int | None = None


@dataclass(frozen=True)
class Exhausted:
    """FenceExhausted, naming the lease."""

    name: str


def sleep_past_short() -> tuple[str, float]:
    return ("sleep", PAST_SHORT)


NOTHING_STORED = ("status", (None,), [])

Step = tuple[Any, ...]

# (id, steps). A step is (operation, args, expected) or ("sleep", seconds).
# Operations are the Backend methods, plus "field" (name, attribute): one
# attribute of status(name)[0]; "force" (name, fence): sets a fence behind the
# API's back. status results are compared as (name, holder, fence, held) tuples,
# renew_each results as (name, renewed, expires_at, expires_at - server_time in
# whole milliseconds), history results as (event, holder, fence, previous_holder),
# counters results as (name, grants, takeovers, steals, releases); "setting"
# (value,) sets pylease.history (SQLite: its settings row).
SCENARIOS: list[tuple[str, list[Step]]] = [
    # claim ---------------------------------------------------------------------
    ("claim a new name grants fence 1", [("claim", ("a", LONG, "h1"), 1)]),
    (
        "claim of a held lease is busy and changes nothing",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("field", ("a", "expires_at"), Keep("e")),
            ("claim", ("a", LONG, "h2"), None),
            ("status", ("a",), [("a", "h1", 1, True)]),
            ("field", ("a", "expires_at"), Same("e")),
        ],
    ),
    (
        "claim again by the holder is idempotent: same fence and acquired_at, later expiry",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("field", ("a", "acquired_at"), Keep("t")),
            ("field", ("a", "expires_at"), Keep("e")),
            ("sleep", 0.01),
            ("claim", ("a", DAY, "h1"), 1),
            ("field", ("a", "acquired_at"), Same("t")),
            ("field", ("a", "expires_at"), Above("e")),
        ],
    ),
    (
        "claim again by the holder with a shorter ttl never moves the expiry earlier",
        [
            ("claim", ("a", DAY, "h1"), 1),
            ("field", ("a", "expires_at"), Keep("e")),
            ("claim", ("a", SHORT, "h1"), 1),
            ("field", ("a", "expires_at"), Same("e")),
            ("field", ("a", "ttl"), SHORT),
            sleep_past_short(),
            ("status", ("a",), [("a", "h1", 1, True)]),
            ("claim", ("a", LONG, "h2"), None),
        ],
    ),
    (
        "steal by the holder itself with a shorter ttl never moves the expiry earlier",
        [
            ("claim", ("a", DAY, "h1"), 1),
            ("field", ("a", "expires_at"), Keep("e")),
            ("steal", ("a", SHORT, "h1"), 2),
            ("field", ("a", "expires_at"), Same("e")),
            sleep_past_short(),
            ("status", ("a",), [("a", "h1", 2, True)]),
            ("claim", ("a", LONG, "h2"), None),
        ],
    ),
    (
        "claim by the holder after its own expiry, nobody having taken it, keeps the fence",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("claim", ("a", LONG, "h1"), 1),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "claim after release grants a larger fence, also to the same holder",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1"), True),
            ("claim", ("a", LONG, "h1"), 2),
            ("release", ("a", "h1"), True),
            ("claim", ("a", LONG, "h2"), 3),
        ],
    ),
    (
        "claim after expiry by another holder grants the next fence",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            ("claim", ("a", LONG, "h2"), None),
            sleep_past_short(),
            ("claim", ("a", LONG, "h2"), 2),
            ("status", ("a",), [("a", "h2", 2, True)]),
        ],
    ),
    (
        "fences per name strictly increase through claims, steals and releases",
        [
            ("claim", ("a", LONG, "h1"), Keep("f1")),
            ("claim", ("b", LONG, "h1"), 1),
            ("steal", ("a", LONG, "h2"), Above("f1")),
            ("holds", ("a", "h2", 2), True),
            ("release", ("a", "h2"), True),
            ("claim", ("a", LONG, "h1"), 3),
            ("steal", ("a", LONG, "h1"), 4),
            ("release", ("a", "h1"), True),
            ("steal", ("a", LONG, "h3"), 5),
            ("status", (None,), [("a", "h3", 5, True), ("b", "h1", 1, True)]),
        ],
    ),
    (
        "names are independent",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("claim", ("b", LONG, "h2"), 1),
            ("claim", ("a", LONG, "h2"), None),
            ("claim", ("b", LONG, "h1"), None),
        ],
    ),
    # claim_new: a claim that only starts a new tenure (contract 5.6) -------------
    ("claim_new of a new name grants fence 1", [("claim_new", ("a", LONG, "h1"), 1)]),
    (
        "claim_new of the holder's own live tenure is busy and changes nothing",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("field", ("a", "expires_at"), Keep("e")),
            ("claim_new", ("a", DAY, "h1"), None),
            ("field", ("a", "expires_at"), Same("e")),
            ("counters", ("a",), [("a", 1, 0, 0, 0)]),
            ("claim_new", ("a", LONG, "h2"), None),
        ],
    ),
    (
        "claim_new of the holder's own expired tenure takes it over with a new fence",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("claim_new", ("a", LONG, "h1"), 2),
            ("holds", ("a", "h1", 1), False),
            ("holds", ("a", "h1", 2), True),
            ("counters", ("a",), [("a", 2, 1, 0, 0)]),
            ("history", ("a",), [("taken_over", "h1", 2, "h1")]),
        ],
    ),
    (
        "claim_new after a release or a min_hold grants the next fence, busy while resting",
        [
            ("claim_new", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1", DAY), True),
            ("claim_new", ("a", LONG, "h1"), None),
            ("claim_new", ("b", LONG, "h1"), 1),
            ("release", ("b", "h1"), True),
            ("claim_new", ("b", LONG, "h1"), 2),
        ],
    ),
    # renew ---------------------------------------------------------------------
    (
        "renew by the holder extends the expiry and keeps fence and acquired_at",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("field", ("a", "acquired_at"), Keep("t")),
            ("field", ("a", "expires_at"), Keep("e")),
            ("sleep", 0.01),
            ("renew", ("a", "h1"), True),
            ("field", ("a", "expires_at"), Above("e")),
            ("field", ("a", "acquired_at"), Same("t")),
            ("renew", ("a", "h1", DAY), True),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "renew without ttl reuses the last granted ttl",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            ("renew", ("a", "h1", LONG), True),
            ("renew", ("a", "h1"), True),
            sleep_past_short(),
            ("status", ("a",), [("a", "h1", 1, True)]),
            ("claim", ("a", LONG, "h2"), None),
        ],
    ),
    (
        "renew by another holder or of an unknown name is false",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("renew", ("a", "h2"), False),
            ("renew", ("zz", "h1"), False),
            ("status", (None,), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "renew works past expiry while nobody claimed",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("status", ("a",), [("a", "h1", 1, False)]),
            ("renew", ("a", "h1", LONG), True),
            ("status", ("a",), [("a", "h1", 1, True)]),
            ("holds", ("a", "h1", 1), True),
            ("claim", ("a", LONG, "h2"), None),
        ],
    ),
    (
        "renew is false once another holder claimed after expiry",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("claim", ("a", LONG, "h2"), 2),
            ("renew", ("a", "h1"), False),
            ("status", ("a",), [("a", "h2", 2, True)]),
        ],
    ),
    (
        "renew is false after release",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1"), True),
            ("renew", ("a", "h1"), False),
            ("status", ("a",), [("a", "h1", 1, False)]),
        ],
    ),
    (
        "renew is false after a steal",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("steal", ("a", LONG, "h2"), 2),
            ("renew", ("a", "h1"), False),
        ],
    ),
    # renew_many ----------------------------------------------------------------
    (
        "renew_many answers each element in order",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("claim", ("b", LONG, "h2"), 1),
            ("claim", ("c", LONG, "h1"), 1),
            ("release", ("c", "h1"), True),
            (
                "renew_many",
                (["c", "b", "zz", "a"], ["h1", "h1", "h1", "h1"]),
                [("c", False), ("b", False), ("zz", False), ("a", True)],
            ),
            ("renew_many", (["a", "b"], ["h1", "h2"], DAY), [("a", True), ("b", True)]),
            ("renew_many", ([], []), []),
        ],
    ),
    (
        "renew_many matches each name with the holder at its position",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("claim", ("b", LONG, "h2"), 1),
            (
                "renew_many",
                (["a", "a", "b", "b", "a"], ["h2", "h1", "h1", "h2", "h1"]),
                [("a", False), ("a", True), ("b", False), ("b", True), ("a", True)],
            ),
            ("status", (None,), [("a", "h1", 1, True), ("b", "h2", 1, True)]),
        ],
    ),
    (
        "renew_many extends past expiry, with the last ttl",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("renew_many", (["a"], ["h1"]), [("a", True)]),
            ("status", ("a",), [("a", "h1", 1, True)]),
            ("renew_many", (["a"], ["h1"], LONG), [("a", True)]),
            sleep_past_short(),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    # release -------------------------------------------------------------------
    (
        "release by the holder frees the name at once",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1"), True),
            ("status", ("a",), [("a", "h1", 1, False)]),
            ("holds", ("a", "h1", 1), False),
            ("claim", ("a", LONG, "h2"), 2),
        ],
    ),
    (
        "release never frees somebody else's lease",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h2"), False),
            ("release", ("zz", "h1"), False),
            ("status", (None,), [("a", "h1", 1, True)]),
            ("claim", ("a", LONG, "h2"), None),
        ],
    ),
    (
        "release with a fence frees only that tenure, not the same holder's next one",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1", None, 1), True),
            ("claim", ("a", LONG, "h1"), 2),
            ("release", ("a", "h1", None, 1), False),
            ("status", ("a",), [("a", "h1", 2, True)]),
            ("claim", ("a", LONG, "h2"), None),
            ("release", ("a", "h2", None, 2), False),
            ("release", ("a", "h1", None, 2), True),
            ("counters", ("a",), [("a", 2, 0, 0, 2)]),
            ("claim", ("a", LONG, "h2"), 3),
        ],
    ),
    (
        "release with a fence keeps min_hold and counts an expired tenure nobody took as held",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("release", ("a", "h1", DAY, 1), True),
            ("field", ("a", "state"), "resting"),
            ("claim", ("a", LONG, "h2"), None),
        ],
    ),
    (
        "release: bad fence",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1", None, True), Raises("pylease: fence must be an int, not bool")),
            ("release", ("a", "h1", None, 2**63), Raises("pylease: fence is out of range")),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "release twice: the second is false",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1"), True),
            ("release", ("a", "h1"), False),
        ],
    ),
    (
        "release of an expired lease that nobody took counts as held",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("release", ("a", "h1"), True),
            ("claim", ("a", LONG, "h2"), 2),
        ],
    ),
    (
        "release after another holder took the expired lease is false",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("claim", ("a", LONG, "h2"), 2),
            ("release", ("a", "h1"), False),
            ("status", ("a",), [("a", "h2", 2, True)]),
        ],
    ),
    (
        "release with min_hold keeps the name unavailable until acquired_at + min_hold",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1", SHORT), True),
            ("status", ("a",), [("a", "h1", 1, False)]),
            ("claim", ("a", LONG, "h2"), None),
            ("claim", ("a", LONG, "h1"), None),
            ("renew", ("a", "h1"), False),
            ("holds", ("a", "h1", 1), False),
            sleep_past_short(),
            ("claim", ("a", LONG, "h2"), 2),
        ],
    ),
    (
        "release with a min_hold already served frees at once",
        [
            ("claim", ("a", LONG, "h1"), 1),
            sleep_past_short(),
            ("release", ("a", "h1", SHORT), True),
            ("claim", ("a", LONG, "h2"), 2),
            ("release", ("a", "h2", timedelta(0)), True),
            ("claim", ("a", LONG, "h3"), 3),
        ],
    ),
    # steal ---------------------------------------------------------------------
    (
        "steal by default takes the lease at once, with a new fence",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("steal", ("a", LONG, "h2"), 2),
            ("holds", ("a", "h1", 1), False),
            ("holds", ("a", "h2", 2), True),
            ("release", ("a", "h1"), False),
            ("status", ("a",), [("a", "h2", 2, True)]),
        ],
    ),
    (
        "steal by the current holder still issues a new fence",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("steal", ("a", LONG, "h1"), 2),
            ("holds", ("a", "h1", 1), False),
            ("holds", ("a", "h1", 2), True),
        ],
    ),
    (
        "steal with older_than waits until the holder has not renewed for that long",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("steal", ("a", LONG, "h2", SHORT), None),
            ("status", ("a",), [("a", "h1", 1, True)]),
            sleep_past_short(),
            ("renew", ("a", "h1"), True),
            ("steal", ("a", LONG, "h2", SHORT), None),
            sleep_past_short(),
            ("steal", ("a", LONG, "h2", SHORT), 2),
            ("renew", ("a", "h1"), False),
        ],
    ),
    (
        "steal takes an expired lease whatever older_than",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            sleep_past_short(),
            ("steal", ("a", LONG, "h2", DAY), 2),
        ],
    ),
    (
        "steal takes a lease released with min_hold only unconditionally",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1", LONG), True),
            ("steal", ("a", LONG, "h2", DAY), None),
            ("steal", ("a", LONG, "h2"), 2),
        ],
    ),
    (
        "steal on a name never claimed acts as claim",
        [
            ("steal", ("a", LONG, "h1", DAY), 1),
            ("claim", ("a", LONG, "h2"), None),
            ("holds", ("a", "h1", 1), True),
        ],
    ),
    # holds ---------------------------------------------------------------------
    (
        "holds is true only for this holder with this fence while unexpired",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            ("holds", ("a", "h1", 1), True),
            ("holds", ("a", "h1", 2), False),
            ("holds", ("a", "h2", 1), False),
            ("holds", ("zz", "h1", 1), False),
            sleep_past_short(),
            ("holds", ("a", "h1", 1), False),
        ],
    ),
    # status --------------------------------------------------------------------
    (
        "status lists every name ever claimed, in name order, or one name",
        [
            ("status", (None,), []),
            ("claim", ("b", LONG, "h2"), 1),
            ("claim", ("a", SHORT, "h1"), 1),
            ("claim", ("c", LONG, "h3"), 1),
            ("release", ("c", "h3"), True),
            sleep_past_short(),
            (
                "status",
                (None,),
                [("a", "h1", 1, False), ("b", "h2", 1, True), ("c", "h3", 1, False)],
            ),
            ("status", ("b",), [("b", "h2", 1, True)]),
            ("status", ("zz",), []),
        ],
    ),
    (
        "status times: acquired at the grant, renewed at each renewal",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("field", ("a", "acquired_at"), Keep("t")),
            ("field", ("a", "renewed_at"), Same("t")),
            ("field", ("a", "expires_at"), Above("t")),
            ("sleep", 0.01),
            ("renew", ("a", "h1"), True),
            ("field", ("a", "renewed_at"), Above("t")),
            ("field", ("a", "acquired_at"), Same("t")),
        ],
    ),
    # limits ------------------------------------------------------------------
    (
        "the limits themselves are valid: 200 characters, 366 days",
        [
            ("claim", (LONG_NAME, timedelta(days=366), "h" * 200), 1),
            ("renew", (LONG_NAME, "h" * 200, timedelta(days=366)), True),
            ("holds", (LONG_NAME, "h" * 200, 1), True),
            ("release", (LONG_NAME, "h" * 200, timedelta(days=366)), True),
        ],
    ),
    (
        "names are case-sensitive and any text",
        [
            ("claim", ("Sweep", LONG, "h1"), 1),
            ("claim", ("sweep", LONG, "h1"), 1),
            ("claim", ("réport ✓ 'x'; --", LONG, "hölder"), 1),
            ("holds", ("réport ✓ 'x'; --", "hölder", 1), True),
        ],
    ),
    # bad input: the same InvalidArgument, the same message, nothing changed --------
    ("claim: empty name", [("claim", ("", LONG, "h1"), Raises("pylease: name must not be empty"))]),
    ("claim: NULL name", [("claim", (None, LONG, "h1"), Raises("pylease: name must not be NULL"))]),
    (
        "claim: name too long",
        [("claim", (TOO_LONG, LONG, "h1"), Raises("pylease: name must be at most 200 characters"))],
    ),
    (
        "claim: empty holder",
        [("claim", ("a", LONG, ""), Raises("pylease: holder must not be empty")), NOTHING_STORED],
    ),
    (
        "claim: NULL holder",
        [("claim", ("a", LONG, None), Raises("pylease: holder must not be NULL"))],
    ),
    (
        "claim: holder too long",
        [
            (
                "claim",
                ("a", LONG, TOO_LONG),
                Raises("pylease: holder must be at most 200 characters"),
            ),
            NOTHING_STORED,
        ],
    ),
    (
        "claim: zero ttl",
        [
            ("claim", ("a", timedelta(0), "h1"), Raises("pylease: ttl must be positive")),
            NOTHING_STORED,
        ],
    ),
    (
        "claim: negative ttl",
        [("claim", ("a", -LONG, "h1"), Raises("pylease: ttl must be positive")), NOTHING_STORED],
    ),
    (
        "claim: ttl over 366 days",
        [
            (
                "claim",
                ("a", timedelta(days=366, seconds=1), "h1"),
                Raises("pylease: ttl must be at most 366 days"),
            ),
            NOTHING_STORED,
        ],
    ),
    ("claim: NULL ttl", [("claim", ("a", None, "h1"), Raises("pylease: ttl must not be NULL"))]),
    (
        "claim: the name is checked first, then the ttl, then the holder",
        [
            ("claim", ("", timedelta(0), ""), Raises("pylease: name must not be empty")),
            ("claim", ("a", timedelta(0), ""), Raises("pylease: ttl must be positive")),
            NOTHING_STORED,
        ],
    ),
    (
        "renew: bad arguments raise even when the lease is held, and change nothing",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("field", ("a", "expires_at"), Keep("e")),
            ("renew", ("a", "h1", timedelta(0)), Raises("pylease: ttl must be positive")),
            (
                "renew",
                ("a", "h1", timedelta(days=367)),
                Raises("pylease: ttl must be at most 366 days"),
            ),
            ("renew", ("", "h1"), Raises("pylease: name must not be empty")),
            ("renew", ("a", ""), Raises("pylease: holder must not be empty")),
            ("renew", ("a", None), Raises("pylease: holder must not be NULL")),
            ("field", ("a", "expires_at"), Same("e")),
        ],
    ),
    (
        "renew_many: bad arguments",
        [
            (
                "renew_many",
                (["a", "b"], ["h1"]),
                Raises("pylease: holders must have as many elements as names"),
            ),
            (
                "renew_many",
                (["a", ""], ["h1", "h1"]),
                Raises("pylease: names must hold only non-empty texts of at most 200 characters"),
            ),
            (
                "renew_many",
                (["a", TOO_LONG], ["h1", "h1"]),
                Raises("pylease: names must hold only non-empty texts of at most 200 characters"),
            ),
            (
                "renew_many",
                (["a"], [None]),
                Raises("pylease: holders must hold only non-empty texts of at most 200 characters"),
            ),
            ("renew_many", (["a"], ["h1"], timedelta(0)), Raises("pylease: ttl must be positive")),
        ],
    ),
    (
        "release: bad arguments change nothing",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("release", ("a", "h1", -SHORT), Raises("pylease: min_hold must not be negative")),
            ("release", ("", "h1"), Raises("pylease: name must not be empty")),
            ("release", ("a", ""), Raises("pylease: holder must not be empty")),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "steal: bad arguments change nothing",
        [
            ("claim", ("a", LONG, "h1"), 1),
            (
                "steal",
                ("a", LONG, "h2", -SHORT),
                Raises("pylease: older_than must not be negative"),
            ),
            ("steal", ("a", timedelta(0), "h2"), Raises("pylease: ttl must be positive")),
            ("steal", ("a", LONG, ""), Raises("pylease: holder must not be empty")),
            ("steal", ("", LONG, "h2"), Raises("pylease: name must not be empty")),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "holds and status: bad arguments",
        [
            ("holds", ("a", "h1", None), Raises("pylease: fence must not be NULL")),
            ("holds", ("", "h1", 1), Raises("pylease: name must not be empty")),
            ("holds", ("a", "", 1), Raises("pylease: holder must not be empty")),
            ("status", ("",), Raises("pylease: name must not be empty")),
            ("status", (TOO_LONG,), Raises("pylease: name must be at most 200 characters")),
        ],
    ),
    (
        "wrong types and values no database can store: the same error on both",
        [
            (
                "claim",
                ("a\x00b", LONG, "h1"),
                Raises("pylease: name must not contain NUL characters"),
            ),
            ("claim", (7, LONG, "h1"), Raises("pylease: name must be a str, not int")),
            ("renew_many", (None, ["h1"]), Raises("pylease: names must not be NULL")),
            ("holds", ("a", "h1", 2**63), Raises("pylease: fence is out of range")),
            NOTHING_STORED,
        ],
    ),
    (
        "spans over 366 days are refused like ttls",
        [
            ("claim", ("a", LONG, "h1"), 1),
            (
                "release",
                ("a", "h1", timedelta(days=366, seconds=1)),
                Raises("pylease: min_hold must be at most 366 days"),
            ),
            (
                "steal",
                ("a", LONG, "h2", timedelta(days=400)),
                Raises("pylease: older_than must be at most 366 days"),
            ),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "a ttl in seconds works like a timedelta",
        [
            ("claim", ("a", 30, "h1"), 1),
            ("renew", ("a", "h1", 60.5), True),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    # contract revision 2 -------------------------------------------------------
    (
        "a renewal with a shorter ttl never moves the expiry earlier",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("field", ("a", "expires_at"), Keep("e")),
            ("renew", ("a", "h1", SHORT), True),
            ("field", ("a", "expires_at"), Same("e")),
            ("renew_many", (["a"], ["h1"], SHORT), [("a", True)]),
            ("field", ("a", "expires_at"), Same("e")),
            ("renew", ("a", "h1"), True),
            ("field", ("a", "expires_at"), Same("e")),
            sleep_past_short(),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "renew_each applies each ttl and reports the expiry the server granted",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            ("claim", ("b", LONG, "h1"), 1),
            ("claim", ("c", LONG, "h2"), 1),
            ("field", ("b", "expires_at"), Keep("eb")),
            (
                "renew_each",
                (["a", "b", "c", "d"], ["h1", "h1", "h1", "h1"], [LONG, SHORT, None, None]),
                [
                    ("a", True, Anything(), LONG),
                    ("b", True, Same("eb"), Anything()),
                    ("c", False, None, None),
                    ("d", False, None, None),
                ],
            ),
            ("field", ("a", "expires_at"), Anything()),
            sleep_past_short(),
            ("status", (None,), [("a", "h1", 1, True), ("b", "h1", 1, True), ("c", "h2", 1, True)]),
            ("renew_each", (["a"], ["h1"], [None]), [("a", True, Anything(), LONG)]),
            ("renew_each", ([], [], []), []),
        ],
    ),
    (
        "renew_each refuses bad ttls and lists of unequal length",
        [
            ("claim", ("a", LONG, "h1"), 1),
            (
                "renew_each",
                (["a"], ["h1"], [timedelta(0)]),
                Raises(
                    "pylease: ttls must hold only NULLs or finite, positive ttls"
                    " of at most 366 days"
                ),
            ),
            (
                "renew_each",
                (["a"], ["h1"], []),
                Raises("pylease: ttls must have as many elements as names"),
            ),
            ("renew_each", (["a"], ["h1"], None), Raises("pylease: ttls must not be NULL")),
            ("status", ("a",), [("a", "h1", 1, True)]),
        ],
    ),
    (
        "a name whose fences are exhausted cannot be granted again, and nothing changes",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            ("force", ("a", MAX_FENCE), None),
            sleep_past_short(),
            ("claim", ("a", LONG, "h2"), Exhausted("a")),
            ("steal", ("a", LONG, "h2"), Exhausted("a")),
            ("status", ("a",), [("a", "h1", MAX_FENCE, False)]),
            # Still the holder's (nobody took it): its own claim keeps the last fence.
            ("claim", ("a", LONG, "h1"), MAX_FENCE),
            ("release", ("a", "h1"), True),
            ("claim", ("a", LONG, "h1"), Exhausted("a")),
            ("claim", ("b", LONG, "h1"), 1),
        ],
    ),
]


def history_script(setting: str | None, events: list[tuple[Any, ...]]) -> list[Step]:
    """claim, renew, release, claim, expire and take over, steal, min_hold release."""
    steps: list[Step] = [] if setting is None else [("setting", (setting,), None)]
    return [
        *steps,
        ("claim", ("job", LONG, "h1"), 1),
        ("renew", ("job", "h1"), True),
        ("claim", ("job", LONG, "h1"), 1),
        ("claim", ("job", LONG, "h2"), None),
        ("release", ("job", "h1"), True),
        ("claim", ("job", SHORT, "h2"), 2),
        sleep_past_short(),
        ("claim", ("job", LONG, "h3"), 3),
        ("steal", ("job", LONG, "h4"), 4),
        ("release", ("job", "h4", DAY), True),
        ("field", ("job", "state"), "resting"),
        ("history", (), events),
        ("history", ("job",), events),
        ("history", ("other",), []),
        ("counters", (), [("job", 4, 1, 1, 2)]),
    ]


ALL_EVENTS = [
    ("released", "h4", 4, None),
    ("stolen", "h4", 4, "h3"),
    ("taken_over", "h3", 3, "h2"),
    ("claimed", "h2", 2, "h1"),
    ("released", "h1", 1, None),
    ("claimed", "h1", 1, None),
]
RARE_EVENTS = [e for e in ALL_EVENTS if e[0] in ("taken_over", "stolen")]

SCENARIOS += [
    (
        "each state of status, with the ttl last granted",
        [
            ("claim", ("held", LONG, "h1"), 1),
            ("claim", ("resting", LONG, "h1"), 1),
            ("release", ("resting", "h1", DAY), True),
            ("claim", ("released", LONG, "h1"), 1),
            ("release", ("released", "h1"), True),
            ("claim", ("expired", SHORT, "h1"), 1),
            sleep_past_short(),
            ("field", ("held", "state"), "held"),
            ("field", ("resting", "state"), "resting"),
            ("field", ("released", "state"), "released"),
            ("field", ("expired", "state"), "expired"),
            ("field", ("held", "ttl"), LONG),
            ("field", ("expired", "ttl"), SHORT),
            ("renew", ("held", "h1", DAY), True),
            ("field", ("held", "ttl"), DAY),
            ("claim", ("resting", LONG, "h2"), None),
            ("claim", ("released", LONG, "h2"), 2),
            ("claim", ("expired", LONG, "h2"), 2),
        ],
    ),
    ("history under 'all': every grant and release", history_script("all", ALL_EVENTS)),
    ("history by default: takeovers and steals only", history_script(None, RARE_EVENTS)),
    ("history under 'rare' as by default", history_script("rare", RARE_EVENTS)),
    ("history under 'none': nothing, the same counters", history_script("none", [])),
    (
        "counters: one grant per tenure, a steal of a free name is a claim",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("claim", ("a", LONG, "h1"), 1),
            ("renew_many", (["a"], ["h1"]), [("a", True)]),
            ("release", ("a", "h1"), True),
            ("release", ("a", "h1"), False),
            ("steal", ("a", LONG, "h2"), 2),
            ("steal", ("a", LONG, "h3"), 3),
            ("steal", ("b", LONG, "h3"), 1),
            ("counters", (), [("a", 3, 0, 1, 1), ("b", 1, 0, 0, 0)]),
            ("counters", ("b",), [("b", 1, 0, 0, 0)]),
            ("history", (None, None, 1), [("stolen", "h3", 3, "h2")]),
            ("history", (None, None, 0), Raises("pylease: max_rows must be between 1 and 10000")),
            ("prune_history", (DAY,), 0),
            # SQLite's clock has millisecond steps: an event of this millisecond is not
            # older than 0 yet.
            ("sleep", 0.01),
            ("prune_history", (timedelta(0),), 1),
            ("history", (), []),
            ("counters", ("a",), [("a", 3, 0, 1, 1)]),
        ],
    ),
]


ZERO = timedelta(0)
SCENARIOS += [
    (
        "prune: names idle for the span go, counters with them; a pruned name's next "
        "fence is above every fence it had",
        [
            ("setting", ("all",), None),
            ("claim", ("a", SHORT, "h1"), 1),
            ("force", ("a", 41), None),
            ("claim", ("b", LONG, "h2"), 1),
            ("claim", ("c", LONG, "h2"), Keep("c")),
            ("release", ("c", "h2"), True),
            sleep_past_short(),
            ("prune", (DAY,), 0),
            ("prune", (ZERO,), 2),
            ("status", ("a",), []),
            ("counters", ("a",), []),
            ("status", ("b",), [("b", "h2", 1, True)]),
            # The history stays until prune_history.
            ("history", ("c", None, 1), [("released", "h2", Same("c"), None)]),
            ("claim", ("a", LONG, "h3"), 42),
            ("claim", ("c", LONG, "h3"), Above("c")),
            ("prune", (ZERO,), 0),
        ],
    ),
    (
        "prune: a semaphore goes whole, only once no slot is held, and its next fences "
        "are above every fence its slots had",
        [
            ("permit_claim", ("s", 2, SHORT, "h1"), Granted(1, 1)),
            ("force_slots", ("s", 9), None),
            ("permit_claim", ("t", 2, LONG, "h1"), Granted(1, 1)),
            sleep_past_short(),
            ("prune", (ZERO,), 1),
            ("permits", ("s",), []),
            ("held_by", ("t",), ["h1"]),
            # A pruned semaphore's limit went with it.
            ("permit_claim", ("s", 3, LONG, "h2", 3), Granted(3, 10)),
            ("permit_claim", ("s", 3, LONG, "h3"), {}),
            ("prune", (ZERO,), 0),
        ],
    ),
    (
        "prune: bad spans",
        [
            ("prune", (timedelta(seconds=-1),), Raises("pylease: idle_for must not be negative")),
            ("prune", (timedelta(days=367),), Raises("pylease: idle_for must be at most 366 days")),
        ],
    ),
]

SCENARIOS += [
    (
        "status_page: the names that start with a prefix, taken literally, first ones "
        "first, with how many matched",
        [
            ("claim", ("t_1", LONG, "h1"), 1),
            ("claim", ("t_2", LONG, "h2"), 1),
            ("claim", ("tx3", LONG, "h3"), 1),
            ("claim", ("u_4", LONG, "h4"), 1),
            ("release", ("t_2", "h2"), True),
            ("status_page", ("t_",), [("t_1", "h1", 1, True, 1, 2), ("t_2", "h2", 1, False, 1, 2)]),
            ("status_page", ("t_", 1), [("t_1", "h1", 1, True, 1, 2)]),
            (
                "status_page",
                ("t", 5),
                [
                    ("t_1", "h1", 1, True, 1, 3),
                    ("t_2", "h2", 1, False, 1, 3),
                    ("tx3", "h3", 1, True, 1, 3),
                ],
            ),
            ("status_page", ("", 1), [("t_1", "h1", 1, True, 1, 4)]),
            ("status_page", ("t%",), []),
            ("status_page", ("v",), []),
            ("status_page", ("", 0), Raises("pylease: max_rows must be at least 1")),
            ("status_page", (None,), Raises("pylease: prefix must be a str, not NoneType")),
        ],
    ),
]


# Permits (contract 5.1) --------------------------------------------------------
# Which slots a claim gets is the backend's choice (PostgreSQL starts where a hash of
# the holder points): steps compare how many, and their fences, or who holds them.
SCENARIOS += [
    (
        "permit: claims up to the limit, then busy; a busy claim changes nothing",
        [
            ("permit_claim", ("s", 2, LONG, "h1"), Granted(1, 1)),
            ("permit_claim", ("s", 2, LONG, "h2"), Granted(1, 1)),
            ("held_by", ("s",), ["h1", "h2"]),
            ("permits", ("s",), Keep("before")),
            ("permit_claim", ("s", 2, LONG, "h3"), {}),
            ("permits", ("s",), Same("before")),
            ("counters", ("s",), [("s", 2, 0, 0, 0)]),
        ],
    ),
    (
        "permit: several permits are granted together or not at all",
        [
            ("permit_claim", ("s", 3, LONG, "h1", 2), Granted(2, 1)),
            ("permit_claim", ("s", 3, LONG, "h2", 2), {}),
            ("held_by", ("s",), ["h1", "h1"]),
            ("permit_claim", ("s", 3, LONG, "h2", 1), Granted(1, 1)),
            ("permit_claim", ("s", 3, LONG, "h3", 3), {}),
            ("held_by", ("s",), ["h1", "h1", "h2"]),
        ],
    ),
    (
        "permit: a retried claim gets the same slots and fences, extended, and no more",
        [
            ("permit_claim", ("s", 4, SHORT, "h1", 2), Keep("granted")),
            ("permit_claim", ("s", 4, LONG, "h1", 2), Same("granted")),
            sleep_past_short(),
            ("held_by", ("s",), ["h1", "h1"]),
            ("permit_claim", ("s", 4, LONG, "h1", 2), Same("granted")),
            ("counters", ("s",), [("s", 2, 0, 0, 0)]),
            (
                "permit_claim",
                ("s", 4, LONG, "h1", 1),
                Raises(
                    "pylease: permits must be as many as this holder already holds of this"
                    " semaphore (release them first)"
                ),
            ),
            ("held_by", ("s",), ["h1", "h1"]),
        ],
    ),
    (
        "permit: a name keeps its kind and a semaphore its limit",
        [
            ("permit_claim", ("s", 2, LONG, "h1"), Granted(1, 1)),
            (
                "permit_claim",
                ("s", 3, LONG, "h2"),
                Raises("pylease: max_permits 3 differs from the limit 2 of this semaphore"),
            ),
            ("claim", ("s", LONG, "h2"), Raises("pylease: name is a semaphore, not a lease")),
            ("steal", ("s", LONG, "h2"), Raises("pylease: name is a semaphore, not a lease")),
            (
                "claim_all",
                (["new", "s"], LONG, "h2"),
                Raises("pylease: name is a semaphore, not a lease"),
            ),
            ("status", ("new",), []),
            ("claim", ("l", LONG, "h1"), 1),
            (
                "permit_claim",
                ("l", 2, LONG, "h2"),
                Raises("pylease: name is a lease, not a semaphore"),
            ),
            ("permit_set_max", ("l", 2), Raises("pylease: name is a lease, not a semaphore")),
            ("permit_revoke", ("l", "h1"), Raises("pylease: name is a lease, not a semaphore")),
            (
                "permit_set_max",
                ("nobody", 2),
                Raises("pylease: name is not a semaphore: no permit of it was ever claimed"),
            ),
            ("permits", ("l",), []),
            ("held_by", ("s",), ["h1"]),
            ("status", ("l",), [("l", "h1", 1, True)]),
        ],
    ),
    (
        "permit: renew and release are all or nothing over the holder's slots",
        [
            ("permit_claim", ("s", 2, LONG, "h1", 2), Granted(2, 1)),
            ("permit_renew", ("s", "h1", DAY), True),
            ("permit_renew", ("s", "h1", SHORT), True),
            ("permit_renew", ("s", "h2"), False),
            sleep_past_short(),
            # Never earlier: the day granted above still stands.
            ("held_by", ("s",), ["h1", "h1"]),
            ("permit_release", ("s", "h2"), False),
            ("permit_release", ("s", "h1"), True),
            ("permit_release", ("s", "h1"), False),
            ("permit_renew", ("s", "h1"), False),
            ("permits", ("s",), [("h1", 1, False, "released"), ("h1", 1, False, "released")]),
            ("counters", ("s",), [("s", 2, 0, 0, 2)]),
        ],
    ),
    (
        "permit: a holder that lost one slot renews none, and its release fails",
        [
            ("permit_claim", ("s", 2, SHORT, "h1", 2), Granted(2, 1)),
            sleep_past_short(),
            # Both expired, nobody took them: still the holder's.
            ("permit_renew", ("s", "h1", SHORT), True),
            sleep_past_short(),
            ("permit_claim", ("s", 2, LONG, "h2"), Granted(1, 2)),
            ("permit_renew", ("s", "h1", LONG), False),
            ("held_by", ("s",), ["h2"]),
            ("permit_release", ("s", "h1"), False),
            ("permit_claim", ("s", 2, LONG, "h3"), Granted(1, 2)),
            ("held_by", ("s",), ["h2", "h3"]),
            ("counters", ("s",), [("s", 4, 1, 0, 1)]),
        ],
    ),
    (
        "permit: a slot's fence only grows, through releases, takeovers and revokes",
        [
            ("permit_claim", ("s", 1, LONG, "h1"), {0: 1}),
            ("permit_release", ("s", "h1"), True),
            ("permit_claim", ("s", 1, SHORT, "h2"), {0: 2}),
            sleep_past_short(),
            ("permit_claim", ("s", 1, LONG, "h3"), {0: 3}),
            ("permit_revoke", ("s", "h3"), True),
            ("permit_revoke", ("s", "h3"), False),
            ("permit_claim", ("s", 1, LONG, "h4"), {0: 4}),
            ("permits", ("s",), [("h4", 4, True, "held")]),
            ("counters", ("s",), [("s", 4, 1, 1, 1)]),
        ],
    ),
    (
        "permit: holds is true only for the holder's unexpired slot with that fence",
        [
            ("permit_claim", ("s", 1, SHORT, "h1"), {0: 1}),
            ("permit_holds", ("s", "h1", 1), True),
            ("permit_holds", ("s", "h2", 1), False),
            ("permit_holds", ("s", "h1", 2), False),
            ("permit_holds", ("other", "h1", 1), False),
            sleep_past_short(),
            ("permit_holds", ("s", "h1", 1), False),
            ("permit_claim", ("s", 1, LONG, "h1"), {0: 1}),
            ("permit_holds", ("s", "h1", 1), True),
            ("permit_release", ("s", "h1"), True),
            ("permit_holds", ("s", "h1", 1), False),
        ],
    ),
    (
        "permit: a lowered limit drains: no grant until fewer hold than the new limit",
        [
            ("permit_claim", ("s", 3, LONG, "h1"), Granted(1, 1)),
            ("permit_claim", ("s", 3, LONG, "h2"), Granted(1, 1)),
            ("permit_claim", ("s", 3, LONG, "h3"), Granted(1, 1)),
            ("permit_set_max", ("s", 1), None),
            (
                "permit_claim",
                ("s", 3, LONG, "h4"),
                Raises("pylease: max_permits 3 differs from the limit 1 of this semaphore"),
            ),
            ("permit_claim", ("s", 1, LONG, "h4"), {}),
            ("permit_renew", ("s", "h1"), True),
            ("permit_release", ("s", "h1"), True),
            ("permit_claim", ("s", 1, LONG, "h4"), {}),
            ("permit_release", ("s", "h2"), True),
            ("permit_claim", ("s", 1, LONG, "h4"), {}),
            ("permit_release", ("s", "h3"), True),
            ("permit_claim", ("s", 1, LONG, "h4"), {0: 2}),
            ("permit_claim", ("s", 1, LONG, "h5"), {}),
            ("held_by", ("s",), ["h4"]),
            ("field_permit", ("s", "max_permits"), 1),
        ],
    ),
    (
        "permit: a raised limit grants its new slots",
        [
            ("permit_claim", ("s", 1, LONG, "h1"), {0: 1}),
            ("permit_claim", ("s", 1, LONG, "h2"), {}),
            ("permit_set_max", ("s", 3), None),
            ("permit_claim", ("s", 3, LONG, "h2", 2), Granted(2, 1)),
            ("held_by", ("s",), ["h1", "h2", "h2"]),
        ],
    ),
    (
        "permit: bad arguments change nothing",
        [
            (
                "permit_claim",
                ("s", 0, LONG, "h1"),
                Raises("pylease: max_permits must be at least 1"),
            ),
            (
                "permit_claim",
                ("s", 10001, LONG, "h1"),
                Raises("pylease: max_permits must be at most 10000"),
            ),
            (
                "permit_claim",
                ("s", None, LONG, "h1"),
                Raises("pylease: max_permits must not be NULL"),
            ),
            (
                "permit_claim",
                ("s", 2, LONG, "h1", 3),
                Raises("pylease: permits must be at most max_permits"),
            ),
            (
                "permit_claim",
                ("s", 2, LONG, "h1", 0),
                Raises("pylease: permits must be at least 1"),
            ),
            ("permit_claim", ("s", 2, timedelta(0), "h1"), Raises("pylease: ttl must be positive")),
            ("permit_claim", ("", 2, LONG, "h1"), Raises("pylease: name must not be empty")),
            ("permit_claim", ("s", 2, LONG, ""), Raises("pylease: holder must not be empty")),
            ("permit_renew", ("s", "h1", timedelta(0)), Raises("pylease: ttl must be positive")),
            ("permit_release", ("s", None), Raises("pylease: holder must not be NULL")),
            ("permit_holds", ("s", "h1", None), Raises("pylease: fence must not be NULL")),
            ("permit_set_max", ("s", 0), Raises("pylease: max_permits must be at least 1")),
            ("permit_status", ("",), Raises("pylease: name must not be empty")),
            ("permits", (None,), []),
            NOTHING_STORED,
        ],
    ),
    (
        "permit: a slot whose fences are exhausted cannot be granted again",
        [
            ("permit_claim", ("s", 1, SHORT, "h1"), {0: 1}),
            ("force_slots", ("s", MAX_FENCE), None),
            sleep_past_short(),
            ("permit_claim", ("s", 1, LONG, "h2"), Exhausted("s")),
            ("permits", ("s",), [("h1", MAX_FENCE, False, "expired")]),
            # Still the holder's (nobody took it): its own claim keeps the last fence.
            ("permit_claim", ("s", 1, LONG, "h1"), {0: MAX_FENCE}),
        ],
    ),
    (
        "permit: history records each slot's events; counters sum the slots",
        [
            ("setting", ("all",), None),
            ("permit_claim", ("s", 2, SHORT, "h1", 2), Granted(2, 1)),
            ("permit_release", ("s", "h1"), True),
            ("permit_claim", ("s", 2, SHORT, "h2", 2), Granted(2, 2)),
            sleep_past_short(),
            ("permit_claim", ("s", 2, LONG, "h3", 2), Granted(2, 3)),
            ("permit_revoke", ("s", "h3"), True),
            ("permit_claim", ("s", 2, LONG, "h4", 2), Granted(2, 4)),
            (
                "slot_events",
                ("s",),
                [
                    ("claimed", "h1", 1, None, 0),
                    ("claimed", "h1", 1, None, 1),
                    ("claimed", "h2", 2, "h1", 0),
                    ("claimed", "h2", 2, "h1", 1),
                    ("released", "h1", 1, None, 0),
                    ("released", "h1", 1, None, 1),
                    ("stolen", "h4", 4, "h3", 0),
                    ("stolen", "h4", 4, "h3", 1),
                    ("taken_over", "h3", 3, "h2", 0),
                    ("taken_over", "h3", 3, "h2", 1),
                ],
            ),
            ("counters", (), [("s", 8, 2, 2, 2)]),
            ("setting", ("rare",), None),
            ("permit_release", ("s", "h4"), True),
            ("permit_claim", ("s", 2, LONG, "h5"), Granted(1, 5)),
            ("history", ("s", None, 1), [("stolen", "h4", 4, "h3")]),
        ],
    ),
    # Several names (contract 5.3) ------------------------------------------------
    (
        "claim_all: all or nothing; a busy claim creates and changes nothing",
        [
            ("claim", ("a", LONG, "h1"), 1),
            ("claim_all", (["b", "a", "c"], LONG, "h2"), {}),
            ("status", (None,), [("a", "h1", 1, True)]),
            ("claim_all", (["c", "b"], LONG, "h2"), {"c": 1, "b": 1}),
            ("claim_all", (["b", "c"], LONG, "h2"), {"b": 1, "c": 1}),
            ("claim_all", (["c", "d"], LONG, "h3"), {}),
            ("status", ("d",), []),
            ("release_all", (["c", "b", "d"], "h2"), [("c", True), ("b", True), ("d", False)]),
            ("release_all", (["c"], "h2"), [("c", False)]),
            ("claim_all", (["c", "d", "a"], LONG, "h1"), {"a": 1, "c": 2, "d": 1}),
            (
                "counters",
                (),
                [("a", 1, 0, 0, 0), ("b", 1, 0, 0, 1), ("c", 2, 0, 0, 1), ("d", 1, 0, 0, 0)],
            ),
        ],
    ),
    (
        "claim_all: a holder's own names are extended with their fences",
        [
            ("claim", ("a", DAY, "h1"), 1),
            ("field", ("a", "expires_at"), Keep("e")),
            ("claim_all", (["a", "b"], SHORT, "h1"), {"a": 1, "b": 1}),
            ("field", ("a", "expires_at"), Same("e")),
            ("field", ("a", "ttl"), SHORT),
            ("counters", ("a",), [("a", 1, 0, 0, 0)]),
        ],
    ),
    (
        "claim_all: takes over expired names, counted and recorded as lease_claim does",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            ("claim", ("b", LONG, "h1"), 1),
            ("release", ("b", "h1"), True),
            sleep_past_short(),
            ("claim_all", (["a", "b"], LONG, "h2"), {"a": 2, "b": 2}),
            ("counters", (), [("a", 2, 1, 0, 0), ("b", 2, 0, 0, 1)]),
            ("history", (), [("taken_over", "h2", 2, "h1")]),
            ("status", (None,), [("a", "h2", 2, True), ("b", "h2", 2, True)]),
        ],
    ),
    (
        "claim_all: a name whose fences are exhausted fails the claim, and nothing changes",
        [
            ("claim", ("a", SHORT, "h1"), 1),
            ("force", ("a", MAX_FENCE), None),
            sleep_past_short(),
            ("claim_all", (["b", "a"], LONG, "h2"), Exhausted("a")),
            ("status", (None,), [("a", "h1", MAX_FENCE, False)]),
        ],
    ),
    # New tenures of permits and several names (issue 21): a holder the caller gave ----
    (
        "permit_claim_new of the holder's own live slots is busy and changes nothing",
        [
            ("permit_claim_new", ("s", 3, LONG, "h1", 2), Granted(2, 1)),
            ("permits", ("s",), Keep("p")),
            ("permit_claim_new", ("s", 3, DAY, "h1", 2), {}),
            # Another number of permits is busy too, not a mistake: another process.
            ("permit_claim_new", ("s", 3, DAY, "h1", 1), {}),
            ("permits", ("s",), Same("p")),
            ("counters", ("s",), [("s", 2, 0, 0, 0)]),
            ("permit_claim_new", ("s", 3, LONG, "h2"), Granted(1, 1)),
        ],
    ),
    (
        "permit_claim_new of the holder's expired slots grants new fences and ends the rest",
        [
            ("permit_claim_new", ("s", 3, SHORT, "h1", 2), Granted(2, 1)),
            sleep_past_short(),
            # The slot taken first is taken again (a takeover, with the next fence); the
            # other one is this holder's no more, so its renewal and release are whole.
            ("permit_claim_new", ("s", 3, LONG, "h1", 1), Granted(1, 2)),
            ("held_by", ("s",), ["h1"]),
            ("permit_renew", ("s", "h1"), True),
            ("counters", ("s",), [("s", 3, 1, 0, 0)]),
            ("slot_events", ("s",), [("taken_over", "h1", 2, "h1", Anything())]),
            ("permit_release", ("s", "h1"), True),
            ("held_by", ("s",), []),
        ],
    ),
    (
        "claim_all_new of the holder's own live names is busy and changes nothing",
        [
            ("claim_all_new", (["a", "b"], LONG, "h1"), {"a": 1, "b": 1}),
            ("field", ("a", "expires_at"), Keep("e")),
            ("claim_all_new", (["c", "a"], DAY, "h1"), {}),
            ("field", ("a", "expires_at"), Same("e")),
            ("status", ("c",), []),
            ("claim_all_new", (["c", "d"], LONG, "h1"), {"c": 1, "d": 1}),
        ],
    ),
    (
        "claim_all_new of the holder's own expired names takes them over with new fences",
        [
            ("claim_all_new", (["a", "b"], SHORT, "h1"), {"a": 1, "b": 1}),
            sleep_past_short(),
            ("claim_all_new", (["c", "a"], LONG, "h1"), {"a": 2, "c": 1}),
            ("holds", ("a", "h1", 1), False),
            ("holds", ("a", "h1", 2), True),
            ("counters", ("a",), [("a", 2, 1, 0, 0)]),
            ("history", ("a",), [("taken_over", "h1", 2, "h1")]),
        ],
    ),
    (
        "permit_release naming a tenure: a late release of an earlier one frees nothing",
        [
            ("permit_claim_new", ("s", 2, SHORT, "h1", 2), Granted(2, 1)),
            sleep_past_short(),
            # The same holder's next tenure (another process, or its next block).
            ("permit_claim_new", ("s", 2, LONG, "h1", 2), Granted(2, 2)),
            ("permit_release", ("s", "h1", 0, 1), False),
            ("permit_release", ("s", "h1", 1, 1), False),
            ("held_by", ("s",), ["h1", "h1"]),
            ("permit_claim", ("s", 2, LONG, "h2"), {}),
            # Two takeovers of expired slots, and no release.
            ("counters", ("s",), [("s", 4, 2, 0, 0)]),
        ],
    ),
    (
        "permit_release naming a tenure frees all its slots; a NULL slot and fence any",
        [
            ("permit_claim_new", ("s", 2, LONG, "h1", 2), Granted(2, 1)),
            ("permit_release", ("s", "h1", 1, 2), False),
            ("permit_release", ("s", "h1", 1, 1), True),
            ("held_by", ("s",), []),
            ("permit_release", ("s", "h1", 1, 1), False),
            ("permit_claim_new", ("s", 2, LONG, "h1"), Granted(1, 2)),
            ("permit_release", ("s", "h1", None, 2), True),
            ("permit_claim_new", ("s", 2, LONG, "h1"), Granted(1)),
            ("permit_release", ("s", "h1", None, None), True),
            ("held_by", ("s",), []),
            (
                "permit_release",
                ("s", "h1", "x", 1),
                Raises("pylease: slot must be an int, not str"),
            ),
            (
                "permit_release",
                ("s", "h1", 0, "x"),
                Raises("pylease: fence must be an int, not str"),
            ),
        ],
    ),
    (
        "release_all naming tenures: a late release of an earlier one frees nothing",
        [
            ("claim_all_new", (["a", "b"], SHORT, "h1"), {"a": 1, "b": 1}),
            sleep_past_short(),
            ("claim_all_new", (["b", "a"], LONG, "h1"), {"a": 2, "b": 2}),
            ("release_all", (["a", "b"], "h1", [1, 1]), [("a", False), ("b", False)]),
            ("release_all", (["b", "a"], "h1", [1, 2]), [("b", False), ("a", True)]),
            ("status", (None,), [("a", "h1", 2, False), ("b", "h1", 2, True)]),
            ("claim", ("b", LONG, "h2"), None),
            ("release_all", (["b"], "h1", [None]), [("b", True)]),
            ("claim", ("b", LONG, "h2"), 3),
            (
                "release_all",
                (["a"], "h1", [1, 2]),
                Raises("pylease: fences must have as many elements as names"),
            ),
            (
                "release_all",
                (["a"], "h1", ["x"]),
                Raises("pylease: fences must hold ints (or None)"),
            ),
        ],
    ),
    (
        "claim_all and release_all: bad arguments",
        [
            ("claim_all", ([], LONG, "h1"), Raises("pylease: names must not be empty")),
            (
                "claim_all",
                (["a", "b", "a"], LONG, "h1"),
                Raises("pylease: names must not hold a name twice"),
            ),
            (
                "claim_all",
                ([f"n{i}" for i in range(1001)], LONG, "h1"),
                Raises("pylease: names must hold at most 1000 names"),
            ),
            (
                "claim_all",
                (["a", ""], LONG, "h1"),
                Raises("pylease: names must hold only non-empty texts of at most 200 characters"),
            ),
            ("claim_all", (None, LONG, "h1"), Raises("pylease: names must not be NULL")),
            ("claim_all", (["a"], timedelta(0), "h1"), Raises("pylease: ttl must be positive")),
            ("claim_all", (["a"], LONG, ""), Raises("pylease: holder must not be empty")),
            (
                "release_all",
                (["a", "a"], "h1"),
                Raises("pylease: names must not hold a name twice"),
            ),
            ("release_all", (["a"], None), Raises("pylease: holder must not be NULL")),
            NOTHING_STORED,
        ],
    ),
    # groups (contract 5.5) ---------------------------------------------------------
    (
        "group: a join gets an incarnation; a live member name is refused and changes nothing",
        [
            ("group_join", ("g", "a", LONG), 1),
            ("group_join", ("g", "b", LONG, {"role": "indexer", "n": [1, 2]}), 2),
            ("field_member", ("g", "a", "expires_at"), Keep("e")),
            ("group_join", ("g", "a", DAY), None),
            ("field_member", ("g", "a", "expires_at"), Same("e")),
            (
                "group_members",
                ("g",),
                [("a", 1, None), ("b", 2, {"role": "indexer", "n": [1, 2]})],
            ),
            ("group_members", ("other",), []),
        ],
    ),
    (
        "group: incarnations grow across the group, after a leave and after an expiry",
        [
            ("group_join", ("g", "a", SHORT), 1),
            ("group_join", ("g", "b", LONG), 2),
            sleep_past_short(),
            ("group_members", ("g",), [("b", 2, None)]),
            ("group_join", ("g", "a", LONG, "back"), 3),
            ("group_leave", ("g", "a"), True),
            ("group_join", ("g", "a", LONG), 4),
            ("group_members", ("g",), [("a", 4, None), ("b", 2, None)]),
            ("group_join", ("h", "a", LONG), 1),
        ],
    ),
    (
        "group: a member that joins is live from the database clock, for its ttl",
        [
            ("group_join", ("g", "a", LONG), 1),
            ("field_member", ("g", "a", "joined_at"), Keep("t")),
            ("field_member", ("g", "a", "renewed_at"), Same("t")),
            ("member_span", ("g", "a"), LONG),
        ],
    ),
    (
        "group: renew extends a live member, never earlier, and not once it is gone",
        [
            ("group_join", ("g", "a", DAY), 1),
            ("field_member", ("g", "a", "expires_at"), Keep("e")),
            ("group_renew", ("g", "a", SHORT), True),
            ("field_member", ("g", "a", "expires_at"), Same("e")),
            ("group_renew", ("g", "a", None, 1), True),
            ("group_renew", ("g", "a", LONG, 2), False),
            ("group_renew", ("g", "nobody"), False),
            ("group_renew", ("other", "a"), False),
            ("group_join", ("g", "b", SHORT), 2),
            sleep_past_short(),
            ("group_renew", ("g", "b", LONG), False),
            ("group_members", ("g",), [("a", 1, None)]),
        ],
    ),
    (
        "group: leave is member-matched and incarnation-matched",
        [
            ("group_join", ("g", "a", LONG), 1),
            ("group_join", ("g", "b", LONG), 2),
            ("group_leave", ("g", "b", 1), False),
            ("group_leave", ("g", "nobody"), False),
            ("group_members", ("g",), [("a", 1, None), ("b", 2, None)]),
            ("group_leave", ("g", "b", 2), True),
            ("group_leave", ("g", "b"), False),
            ("group_members", ("g",), [("a", 1, None)]),
            ("group_renew", ("g", "b"), False),
        ],
    ),
    (
        "group: member_holds is true only for the live incarnation",
        [
            ("group_join", ("g", "a", LONG), 1),
            ("member_holds", ("g", "a", 1), True),
            ("member_holds", ("g", "a", 2), False),
            ("member_holds", ("g", "nobody", 1), False),
            ("member_holds", ("other", "a", 1), False),
            ("group_leave", ("g", "a"), True),
            ("member_holds", ("g", "a", 1), False),
            ("group_join", ("g", "a", SHORT), 2),
            ("member_holds", ("g", "a", 1), False),
            ("member_holds", ("g", "a", 2), True),
            sleep_past_short(),
            ("member_holds", ("g", "a", 2), False),
        ],
    ),
    (
        "group: the assignment is the documented one, and a leave moves only its partitions",
        [
            ("group_assignment", ("g", 8), {}),
            ("group_join", ("g", "c", LONG), 1),
            ("group_join", ("g", "b", LONG), 2),
            ("group_join", ("g", "a", LONG), 3),
            (
                "group_assignment",
                ("g", 8),
                {0: "c", 1: "b", 2: "a", 3: "c", 4: "a", 5: "a", 6: "b", 7: "b"},
            ),
            ("group_leave", ("g", "b"), True),
            (
                "group_assignment",
                ("g", 8),
                {0: "c", 1: "c", 2: "a", 3: "c", 4: "a", 5: "a", 6: "a", 7: "c"},
            ),
            ("group_assignment", ("g", 1), {0: "a"}),
            ("group_join", ("u", "é", LONG), 1),
            ("group_join", ("u", "e", LONG), 2),
            ("group_join", ("u", "\U0001f600", LONG), 3),
            ("group_assignment", ("u", 5), {0: "e", 1: "é", 2: "e", 3: "é", 4: "\U0001f600"}),
        ],
    ),
    (
        "group: names of 190 and members of 200 characters; incarnations exhausted",
        [
            ("group_join", ("g" * 190, LONG_NAME, LONG), 1),
            ("member_holds", ("g" * 190, LONG_NAME, 1), True),
            ("group_join", ("g", "x", LONG), 1),
            ("force_group", ("g", MAX_FENCE - 1), None),
            ("group_join", ("g", "a", LONG), MAX_FENCE),
            ("group_join", ("g", "b", LONG), Exhausted("g")),
            ("group_members", ("g",), [("a", MAX_FENCE, None), ("x", 1, None)]),
        ],
    ),
    (
        "group: group_status lists every group ever joined, with its live members",
        [
            ("group_status", (), []),
            ("group_join", ("g", "a", LONG), 1),
            ("group_join", ("g", "b", SHORT), 2),
            ("group_join", ("f", "a", SHORT), 1),
            ("group_status", (), [("f", 1, 1, True), ("g", 2, 2, True)]),
            sleep_past_short(),
            ("group_status", (), [("f", 0, 1, False), ("g", 1, 2, True)]),
            ("group_leave", ("g", "a"), True),
            ("group_status", ("g",), [("g", 0, 2, False)]),
            ("group_status", ("nobody",), []),
            ("group_status", ("",), Raises("pylease: grp must not be empty")),
        ],
    ),
    (
        "group: bad arguments raise, naming the parameter, and store nothing",
        [
            ("group_join", (None, "a", LONG), Raises("pylease: grp must not be NULL")),
            ("group_join", ("", "a", LONG), Raises("pylease: grp must not be empty")),
            (
                "group_join",
                ("g" * 191, "a", LONG),
                Raises("pylease: grp must be at most 190 characters"),
            ),
            ("group_join", ("g", None, LONG), Raises("pylease: member must not be NULL")),
            ("group_join", ("g", "", LONG), Raises("pylease: member must not be empty")),
            (
                "group_join",
                ("g", TOO_LONG, LONG),
                Raises("pylease: member must be at most 200 characters"),
            ),
            ("group_join", ("g", "a", timedelta(0)), Raises("pylease: ttl must be positive")),
            ("group_join", ("g", "a", -LONG), Raises("pylease: ttl must be positive")),
            (
                "group_join",
                ("g", "a", timedelta(days=367)),
                Raises("pylease: ttl must be at most 366 days"),
            ),
            (
                "group_join",
                ("g", "a", LONG, "x" * 8191),
                Raises("pylease: data must be at most 8192 characters as JSON text"),
            ),
            ("group_renew", ("g", "a", timedelta(0)), Raises("pylease: ttl must be positive")),
            ("group_renew", ("", "a"), Raises("pylease: grp must not be empty")),
            ("group_leave", ("g", None), Raises("pylease: member must not be NULL")),
            ("group_members", (None,), Raises("pylease: grp must not be NULL")),
            (
                "member_holds",
                ("g", "a", None),
                Raises("pylease: incarnation must not be NULL"),
            ),
            ("group_assignment", ("g", 0), Raises("pylease: partitions must be at least 1")),
            (
                "group_assignment",
                ("g", 1025),
                Raises("pylease: partitions must be at most 1024"),
            ),
            ("group_assignment", ("g", None), Raises("pylease: partitions must not be NULL")),
            ("group_members", ("g",), []),
            NOTHING_STORED,
        ],
    ),
]


# Readers and writers (contract 5.2) ----------------------------------------------
# A reader's claim answers the epoch: the fence of the name's latest exclusive grant.
SCENARIOS += [
    (
        "shared: readers share a name with epoch 0; status shows it shared, no holder",
        [
            ("claim_shared", ("a", LONG, "r1"), 0),
            ("claim_shared", ("a", LONG, "r2"), 0),
            ("status", ("a",), [("a", None, 0, True)]),
            ("field", ("a", "state"), "shared"),
            ("field", ("a", "shared"), 2),
            ("holders", ("a",), [("a", "r1", "shared", None, 0), ("a", "r2", "shared", None, 0)]),
            ("counters", ("a",), [("a", 0, 0, 0, 0)]),
        ],
    ),
    (
        "shared: a writer is busy while a reader holds, and granted once it left",
        [
            ("claim_shared", ("a", LONG, "r1"), 0),
            ("claim", ("a", LONG, "w"), None),
            ("claim_new", ("a", LONG, "w"), None),
            ("steal", ("a", LONG, "w"), None),
            ("claim_all", (["a", "b"], LONG, "w"), {}),
            ("release", ("a", "r1"), True),
            ("release", ("a", "r1"), False),
            ("field", ("a", "state"), "released"),
            ("claim", ("a", LONG, "w"), 1),
            ("claim_shared", ("a", LONG, "r2"), None),
            ("release", ("a", "w"), True),
            ("claim_shared", ("a", LONG, "r2"), 1),
            ("status", ("a",), [("a", None, 1, True)]),
        ],
    ),
    (
        "shared: a reader is busy while the writer holds, or rests after a min_hold",
        [
            ("claim", ("a", LONG, "w"), 1),
            ("claim_shared", ("a", LONG, "r"), None),
            ("claim_shared", ("a", LONG, "w"), None),
            ("release", ("a", "w", LONG), True),
            ("field", ("a", "state"), "resting"),
            ("claim_shared", ("a", LONG, "r"), None),
            ("holders", (None,), []),
        ],
    ),
    (
        "shared: a reader's claim again keeps its epoch and never moves its expiry earlier",
        [
            ("claim_shared", ("a", DAY, "r"), 0),
            ("field", ("a", "expires_at"), Keep("e")),
            ("field", ("a", "acquired_at"), Keep("t")),
            ("claim_shared", ("a", SHORT, "r"), 0),
            ("field", ("a", "expires_at"), Same("e")),
            ("field", ("a", "acquired_at"), Same("t")),
        ],
    ),
    (
        "shared: a reader renews and holds with its epoch until a writer is granted",
        [
            ("claim_shared", ("a", SHORT, "r"), 0),
            ("renew", ("a", "r"), True),
            ("holds", ("a", "r", 0), True),
            ("holds", ("a", "r", 1), False),
            ("holds", ("a", "x", 0), False),
            sleep_past_short(),
            ("holds", ("a", "r", 0), False),
            ("status", ("a",), [("a", None, 0, False)]),
            ("claim", ("a", LONG, "w"), 1),
            ("renew", ("a", "r"), False),
            ("holds", ("a", "r", 0), False),
            ("release", ("a", "r"), False),
        ],
    ),
    (
        "shared: a writer that died is taken over by a reader; its late renewal fails",
        [
            ("claim", ("a", SHORT, "w"), 1),
            sleep_past_short(),
            ("claim_shared", ("a", LONG, "r"), 1),
            ("renew", ("a", "w"), False),
            ("claim", ("a", LONG, "w"), None),
            ("release", ("a", "w"), False),
            ("counters", ("a",), [("a", 1, 1, 0, 0)]),
            ("history", ("a",), [("taken_over", "r", 1, "w")]),
            ("release", ("a", "r"), True),
            ("claim", ("a", LONG, "w"), 2),
            ("counters", ("a",), [("a", 2, 1, 0, 0)]),
        ],
    ),
    (
        "shared: renew_many and the keeper's renewal take readers",
        [
            ("claim_shared", ("a", LONG, "r"), 0),
            ("claim", ("b", LONG, "r"), 1),
            (
                "renew_many",
                (["a", "a", "b"], ["r", "x", "r"]),
                [("a", True), ("a", False), ("b", True)],
            ),
            (
                "renew_held",
                (
                    ["shared", "lease", "shared", "shared"],
                    ["a", "a", "b", "a"],
                    ["r", "r", "r", "x"],
                    [None, None, None, DAY],
                ),
                Keep("rows"),
            ),
        ],
    ),
    (
        "shared: release of a tenure names the reader's epoch",
        [
            ("claim_shared", ("a", LONG, "r"), 0),
            ("release", ("a", "r", None, 3), False),
            ("field", ("a", "shared"), 1),
            ("release", ("a", "r", None, 0), True),
            ("field", ("a", "shared"), 0),
        ],
    ),
    (
        "shared: history records a reader's claim and release under all only",
        [
            ("claim_shared", ("a", LONG, "r"), 0),
            ("release", ("a", "r"), True),
            ("history", ("a",), []),
            ("setting", ("all",), None),
            ("claim_shared", ("a", LONG, "r"), 0),
            ("claim_shared", ("a", LONG, "r"), 0),
            ("release", ("a", "r"), True),
            ("history", ("a",), [("released", "r", 0, None), ("claimed", "r", 0, None)]),
        ],
    ),
    (
        "shared: a name has one kind; readers' names are leases",
        [
            ("permit_claim", ("s", 2, LONG, "h"), Granted(1, 1)),
            ("claim_shared", ("s", LONG, "r"), Raises("pylease: name is a semaphore, not a lease")),
            ("claim_shared", ("a", LONG, "r"), 0),
            (
                "permit_claim",
                ("a", 2, LONG, "h"),
                Raises("pylease: name is a lease, not a semaphore"),
            ),
            (
                "holders",
                (None,),
                [("a", "r", "shared", None, 0), ("s", "h", "permit", Anything(), 1)],
            ),
        ],
    ),
    (
        "shared: prune keeps a name read within the span; readers of a pruned name come "
        "back at its floor, and its next writer above",
        [
            ("claim", ("w", SHORT, "h1"), 1),
            ("force", ("w", 41), None),
            sleep_past_short(),
            ("claim_shared", ("w", LONG, "r"), 41),  # the writer died: its fence, the epoch
            ("prune", (timedelta(0),), 0),
            ("release", ("w", "r"), True),
            ("prune", (timedelta(0),), 1),
            ("status", ("w",), []),
            ("claim_shared", ("w", LONG, "r"), 41),
            ("status", ("w",), [("w", None, 41, True)]),
            ("release", ("w", "r"), True),
            ("claim", ("w", LONG, "h2"), 42),
        ],
    ),
    (
        "shared: bad input raises naming the parameter, and stores nothing",
        [
            ("claim_shared", ("", LONG, "r"), Raises("pylease: name must not be empty")),
            ("claim_shared", ("a", timedelta(0), "r"), Raises("pylease: ttl must be positive")),
            ("claim_shared", ("a", LONG, ""), Raises("pylease: holder must not be empty")),
            (
                "claim_shared",
                ("a", LONG, TOO_LONG),
                Raises("pylease: holder must be at most 200 characters"),
            ),
            ("holders", ("",), Raises("pylease: name must not be empty")),
            NOTHING_STORED,
        ],
    ),
]


@pytest.fixture(params=["postgres", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The same Backend interface on each backend, over a fresh database."""
    if request.param == "postgres":
        yield PostgresBackend(request.getfixturevalue("conn"))
        return
    conn = connect(tmp_path / "x.sqlite3")
    try:
        yield SqliteBackend(conn)
    finally:
        conn.close()


def _call(backend: Backend, operation: str, args: tuple[Any, ...]) -> Any:
    if operation == "field":
        name, attribute = args
        rows = backend.status(name)
        assert len(rows) == 1, rows
        return getattr(rows[0], attribute)
    if operation == "force":
        name, fence = args
        update = "UPDATE pylease_leases SET fence = {} WHERE name = {}"
        if isinstance(backend, SqliteBackend):
            backend.conn.execute(update.format("?", "?"), (fence, name))
            backend.conn.commit()
        else:
            assert isinstance(backend, PostgresBackend)
            backend.conn.execute(update.format("%s", "%s"), (fence, name))  # type: ignore[arg-type]
        return None
    if operation == "force_slots":
        name, fence = args
        update = "UPDATE pylease_permits SET fence = {} WHERE name = {}"
        if isinstance(backend, SqliteBackend):
            backend.conn.execute(update.format("?", "?"), (fence, name))
            backend.conn.commit()
        else:
            assert isinstance(backend, PostgresBackend)
            backend.conn.execute(update.format("%s", "%s"), (fence, name))  # type: ignore[arg-type]
        return None
    if operation == "slot_events":
        events = backend.history(*args)
        return sorted((e.event, e.holder, e.fence, e.previous_holder, e.slot) for e in events)
    if operation == "permits":
        # The permit_status rows: (holder, fence, held, state) per slot, in slot order.
        rows = backend.permit_status(*args)
        return [(r.holder, r.fence, r.held, r.state) for r in rows]
    if operation == "field_permit":
        name, attribute = args
        return getattr(backend.permit_status(name)[0], attribute)
    if operation == "held_by":
        # Who holds the unexpired slots of a semaphore, sorted: which slot is whose
        # is the backend's choice.
        rows = backend.permit_status(*args)
        return sorted(r.holder for r in rows if r.held)
    if operation in ("permit_claim_new", "claim_all_new"):
        return getattr(backend, operation.removesuffix("_new"))(*args, new=True)
    if operation == "field_member":
        grp, member, attribute = args
        rows = [r for r in backend.group_members(grp) if r.member == member]
        assert len(rows) == 1, rows
        return getattr(rows[0], attribute)
    if operation == "member_span":
        # expires_at - renewed_at of a member, to the millisecond.
        grp, member = args
        [row] = [r for r in backend.group_members(grp) if r.member == member]
        return timedelta(milliseconds=round((row.expires_at - row.renewed_at) / MILLISECOND))
    if operation == "force_group":
        grp, incarnation = args
        _sql(backend, "UPDATE pylease_groups SET incarnation = %s WHERE grp = %s", incarnation, grp)
        return None
    if operation == "setting":
        if isinstance(backend, SqliteBackend):
            set_history(backend.conn, args[0])
        else:
            assert isinstance(backend, PostgresBackend)
            backend.conn.execute("SELECT set_config('pylease.history', %s, false)", args)
        return None
    result = getattr(backend, operation)(*args)
    if operation == "history":
        return [(e.event, e.holder, e.fence, e.previous_holder) for e in result]
    if operation == "counters":
        return [(c.name, c.grants, c.takeovers, c.steals, c.releases) for c in result]
    if operation == "status":
        return [(r.name, r.holder, r.fence, r.held) for r in result]
    if operation == "holders":
        return [(r.name, r.holder, r.mode, r.slot, r.fence) for r in result]
    if operation == "group_members":
        return [(r.member, r.incarnation, r.data) for r in result]
    if operation == "group_status":
        # (group, live members, last incarnation, whether a member is live to expire)
        return [(r.grp, r.members, r.incarnation, r.expires_at is not None) for r in result]
    if operation == "status_page":
        return [(r.name, r.holder, r.fence, r.held, r.grants, r.matching) for r in result]
    if operation == "renew_each":
        return [
            (
                r.name,
                r.renewed,
                r.expires_at,
                None
                if r.expires_at is None or r.server_time is None
                else timedelta(milliseconds=round((r.expires_at - r.server_time) / MILLISECOND)),
            )
            for r in result
        ]
    return result


def _check(result: Any, expected: Any, seen: dict[str, Any]) -> None:
    if isinstance(expected, Anything):
        return
    if isinstance(expected, Granted):
        assert isinstance(result, dict) and len(result) == expected.count, result
        assert all(type(slot) is int and slot >= 0 for slot in result), result
        if expected.fence is not None:
            assert set(result.values()) == {expected.fence}, result
        return
    if isinstance(expected, Keep):
        assert result is not None
        seen[expected.label] = result
    elif isinstance(expected, Same):
        assert result == seen[expected.label]
    elif isinstance(expected, Above):
        assert result > seen[expected.label]
    elif isinstance(expected, list | tuple):
        assert isinstance(result, list | tuple) and len(result) == len(expected), result
        for got, want in zip(result, expected, strict=True):
            _check(got, want, seen)
    elif expected is None or isinstance(expected, bool):
        assert result is expected
    else:
        assert type(result) is type(expected) and result == expected


def _invariants(backend: Backend) -> None:
    for row in backend.status():
        # A name only readers ever claimed has fence 0 and no holder.
        assert row.fence >= 1 or (row.fence == 0 and row.holder is None), row
        assert row.acquired_at <= row.renewed_at <= row.expires_at, row


@pytest.mark.parametrize(
    "steps", [steps for _, steps in SCENARIOS], ids=[title for title, _ in SCENARIOS]
)
def test_scenario(backend: Backend, steps: list[Step]) -> None:
    seen: dict[str, Any] = {}
    for number, step in enumerate(steps, 1):
        if step[0] == "sleep":
            time.sleep(step[1])
            continue
        operation, args, expected = step
        where = f"step {number}: {operation}{args!r}"
        if isinstance(expected, Raises):
            with pytest.raises(InvalidArgument) as info:
                _call(backend, operation, args)
            assert str(info.value) == expected.message, where
            assert info.value.parameter == expected.parameter, where
            continue
        if isinstance(expected, Exhausted):
            with pytest.raises(FenceExhausted) as exhausted:
                _call(backend, operation, args)
            assert repr(expected.name) in str(exhausted.value), where
            assert exhausted.value.name == expected.name, where
            continue
        result = _call(backend, operation, args)
        try:
            _check(result, expected, seen)
        except AssertionError as exc:
            raise AssertionError(f"{where}: got {result!r}, expected {expected!r}") from exc
    _invariants(backend)


def test_scenario_titles_are_unique() -> None:
    titles = [title for title, _ in SCENARIOS]
    assert len(titles) == len(set(titles))


def _sql(backend: Backend, statement: str, *params: Any) -> None:
    """A write behind the API's back (the tests own the database), on either backend."""
    if isinstance(backend, SqliteBackend):
        backend.conn.execute(statement.replace("%s", "?"), params)
        backend.conn.commit()
    else:
        assert isinstance(backend, PostgresBackend)
        backend.conn.execute(statement, params)  # type: ignore[arg-type]


def test_the_keepers_renewal_covers_every_kind_and_one_loss_fails_no_other(
    backend: Backend,
) -> None:
    """renew_held (pylease_renew_held): leases and a holder's slots in one statement,
    each at its own ttl, never earlier; a lost element or one of the other kind is that
    element's False, and the others are renewed."""
    assert backend.claim("a", DAY, "h1") is not None
    assert backend.claim("short", LONG, "h1") is not None
    assert len(backend.permit_claim("sem", 3, DAY, "h1", 2)) == 2
    assert len(backend.permit_claim("sem", 3, DAY, "h2")) == 1
    rows = backend.renew_held(
        ["lease", "permit", "permit", "lease", "permit", "lease"],
        ["a", "sem", "sem", "sem", "a", "short"],
        ["h1", "h1", "nobody", "h1", "h1", "h1"],
        [LONG, LONG, None, None, None, timedelta(seconds=60)],
    )
    assert [(r.name, r.renewed) for r in rows] == [
        ("a", True),
        ("sem", True),
        ("sem", False),
        ("sem", False),  # a lease element of a semaphore's name
        ("a", False),  # a permit element of a lease's name
        ("short", True),
    ]
    for row in rows:
        assert (row.expires_at is None) is (row.server_time is None) is (not row.renewed)
    # Never earlier: a day stays a day; a longer ttl moves the expiry later.
    assert rows[0].expires_at is not None and rows[0].server_time is not None
    assert rows[0].expires_at - rows[0].server_time > timedelta(hours=23)
    assert rows[1].expires_at is not None and rows[1].server_time is not None
    assert rows[1].expires_at - rows[1].server_time > timedelta(hours=23)
    assert rows[5].expires_at is not None and rows[5].server_time is not None
    assert rows[5].expires_at - rows[5].server_time > timedelta(seconds=45)
    # One slot of h1 taken: its renewal is all or nothing, the lease beside it renews.
    before = {r.slot: r.renewed_at for r in backend.permit_status("sem")}
    taken = min(r.slot for r in backend.permit_status("sem") if r.holder == "h1")
    _sql(
        backend,
        "UPDATE pylease_permits SET holder = 'thief' WHERE name = %s AND slot = %s",
        "sem",
        taken,
    )
    rows = backend.renew_held(
        ["permit", "lease", "permit"], ["sem", "a", "sem"], ["h1", "h1", "h2"], [None, None, None]
    )
    assert [r.renewed for r in rows] == [False, True, True]
    after = {r.slot: r for r in backend.permit_status("sem")}
    for slot, row in after.items():
        if row.holder == "h1":
            assert row.renewed_at == before[slot]
    assert backend.renew_held([], [], [], []) == []
    with pytest.raises(InvalidArgument, match="kinds"):
        backend.renew_held(["semaphore"], ["a"], ["h1"], [None])


def test_the_keepers_renewal_takes_members_of_groups_beside_leases(backend: Backend) -> None:
    """renew_held with kind 'member' (0015): a member of a group (name: the group, holder:
    the member, fence: its incarnation) renewed as group_renew does, in the statement
    that renews leases; an earlier incarnation, an expired member and a member of
    another group are that element's False."""
    assert backend.claim("g#0", LONG, "m1") is not None
    first = backend.group_join("g", "m1", SHORT)
    assert first is not None
    assert backend.group_join("g", "gone", SHORT) is not None
    time.sleep(PAST_SHORT)
    again = backend.group_join("g", "m1", SHORT)  # expired: a new incarnation
    assert again is not None and again > first
    rows = backend.renew_held(
        ["lease", "member", "member", "member", "member"],
        ["g#0", "g", "g", "g", "other"],
        ["m1", "m1", "m1", "gone", "m1"],
        [LONG, LONG, LONG, LONG, LONG],
        [None, again, first, None, None],
        [None, None, None, None, None],
    )
    assert [(r.name, r.renewed) for r in rows] == [
        ("g#0", True),
        ("g", True),
        ("g", False),  # an earlier incarnation
        ("g", False),  # expired: it joins again, never renewed
        ("other", False),
    ]
    member = rows[1]
    assert member.expires_at is not None and member.server_time is not None
    assert member.expires_at - member.server_time >= LONG - timedelta(milliseconds=5)
    [row] = [r for r in backend.group_members("g") if r.member == "m1"]
    assert row.incarnation == again
    assert abs((row.expires_at - member.expires_at).total_seconds()) < 0.002
    assert [r.member for r in backend.group_members("g")] == ["m1"]


def test_the_keepers_renewal_renews_only_the_tenure_it_names(backend: Backend) -> None:
    """renew_held with fences (and a permit's slot): a late renewal of an earlier tenure
    of the same holder (sent before it expired and was granted to that holder again)
    renews nothing, on either backend; without fences it renews whatever the holder has."""
    first = backend.claim_new("a", SHORT, "h1")
    (slot, earlier), *_ = backend.permit_claim("s", 2, SHORT, "h1", new=True).items()
    time.sleep(PAST_SHORT)
    # Another process of the same holder: new tenures, new fences.
    second = backend.claim_new("a", LONG, "h1")
    slots = backend.permit_claim("s", 2, LONG, "h1", new=True)
    assert first is not None and second is not None and second > first
    assert slots == {slot: earlier + 1}
    granted = {r.name: r.expires_at for r in backend.status("a")}
    late = backend.renew_held(
        ["lease", "permit"], ["a", "s"], ["h1", "h1"], [DAY, DAY], [first, earlier], [None, slot]
    )
    assert [r.renewed for r in late] == [False, False]
    assert {r.name: r.expires_at for r in backend.status("a")} == granted
    assert all(r.expires_at - r.renewed_at < DAY for r in backend.permit_status("s"))
    now = backend.renew_held(
        ["permit", "lease"],
        ["s", "a"],
        ["h1", "h1"],
        [None, None],
        [earlier + 1, second],
        [slot, None],
    )
    assert [r.renewed for r in now] == [True, True]
    # A permit's tenure is its slot with that slot's fence: another slot's does not match.
    other = 1 - slot
    assert [
        r.renewed
        for r in backend.renew_held(["permit"], ["s"], ["h1"], [None], [earlier + 1], [other])
    ] == [False]
    anyone = backend.renew_held(["lease", "permit"], ["a", "s"], ["h1", "h1"], [None, None])
    assert [r.renewed for r in anyone] == [True, True]
    with pytest.raises(InvalidArgument, match="fences"):
        backend.renew_held(["lease"], ["a"], ["h1"], [None], [1, 2])
    with pytest.raises(InvalidArgument, match="slots"):
        backend.renew_held(["lease"], ["a"], ["h1"], [None], [1], ["x"])


def test_the_keepers_renewal_of_a_reader_names_its_epoch(backend: Backend) -> None:
    """renew_held of kind 'shared' with fences: a reader's tenure is its epoch, so a late
    renewal from before a writer came and went renews nothing once the same reader reads
    again, on either backend; the current epoch (or None) renews the share."""
    first = backend.claim_shared("a", LONG, "r")
    assert first is not None
    assert backend.release("a", "r") is True
    writer = backend.claim("a", LONG, "w")
    assert writer is not None and writer > first
    assert backend.release("a", "w") is True
    assert backend.claim_shared("a", LONG, "r") == writer
    (row,) = backend.status("a")
    late = backend.renew_held(["shared"], ["a"], ["r"], [DAY], [first], [None])
    assert [r.renewed for r in late] == [False]
    assert backend.status("a")[0].expires_at == row.expires_at
    now = backend.renew_held(
        ["shared", "shared"], ["a", "a"], ["r", "r"], [DAY, None], [writer, None], [None, None]
    )
    assert [r.renewed for r in now] == [True, True]
    assert backend.status("a")[0].expires_at > row.expires_at


def test_a_reused_readers_earlier_share_is_never_released_or_renewed_for_a_later_one(
    backend: Backend,
) -> None:
    """A reader's share has an id of its own (PostgreSQL 0019, SQLite 0009): a holder
    reused by a later block (or another process) gets a new share once the earlier one
    expired, and the earlier block's late release or renewal, which names the earlier
    id, touches nothing of it; a writer stays busy beside the later share."""
    first = backend.claim_share("a", SHORT, "r", new=True)
    assert first is not None
    epoch, share = first
    # While the share is live, a new tenure of the same holder is busy.
    assert backend.claim_share("a", LONG, "r", new=True) is None
    deadline = time.monotonic() + 10
    while (later := backend.claim_share("a", LONG, "r", new=True)) is None:
        assert time.monotonic() < deadline, "the first share never expired"
        time.sleep(0.05)
    assert later[0] == epoch and later[1] != share
    # The earlier block's renewal and release, arriving late: nothing of the later share.
    (renewal,) = backend.renew_held(["shared"], ["a"], ["r"], [DAY], [epoch], [share])
    assert not renewal.renewed
    assert backend.release_share("a", "r", epoch, share) is False
    assert [(h.holder, h.mode) for h in backend.holders("a")] == [("r", "shared")]
    assert backend.claim("a", LONG, "w") is None
    # The later block's own renewal and release, naming its share.
    (renewal,) = backend.renew_held(["shared"], ["a"], ["r"], [DAY], [epoch], [later[1]])
    assert renewal.renewed
    assert backend.release_share("a", "r", epoch, later[1]) is True
    assert backend.holders("a") == []
    fence = backend.claim("a", LONG, "w")
    assert fence is not None and fence > epoch


def test_a_readers_claim_again_keeps_its_share_and_a_new_epoch_draws_a_new_one(
    backend: Backend,
) -> None:
    """Without a new tenure (lease_claim_shared's rule), a claim again of the same epoch
    continues the share, as a retried claim whose reply was lost must."""
    first = backend.claim_share("a", LONG, "r")
    assert first is not None
    assert backend.claim_share("a", LONG, "r") == first
    assert backend.claim_shared("a", LONG, "r") == first[0]
    assert backend.release_share("a", "r", first[0], first[1]) is True
    fence = backend.claim("a", LONG, "w")
    assert fence is not None and backend.release("a", "w") is True
    again = backend.claim_share("a", LONG, "r")
    assert again is not None and again[0] == fence and again[1] != first[1]
