"""Argument checks, run before any SQL on every backend, with the same messages as the SQL checks.

Durations are a ``timedelta``, seconds, or the command line's spelling (``"5m"``,
``"1h30m"``, ``"250ms"``: :func:`pylease.durations.parse`); a wait may also be
without a deadline (:data:`FOREVER`). The checks of the operations that take more
than keys and spans (``renew_each``'s ttls, ``history``'s since and max_rows) return
the argument as the SQL takes it (spans as ``timedelta``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pylease import durations
from pylease.errors import InvalidArgument

MAX_KEY_LENGTH = 200
MAX_TTL = timedelta(days=366)
# Past this, now + span leaves the range of the databases' timestamps.
_MAX_SPAN = MAX_TTL * 1000
_MAX_SPAN_SECONDS = _MAX_SPAN.total_seconds()
_ZERO = timedelta(0)

# A wait without a deadline: ``wait=FOREVER`` (also ``math.inf`` or ``"forever"``).
FOREVER = math.inf


def key(parameter: str, value: object) -> str:
    """A name or holder: a non-empty str of at most 200 characters, without NUL."""
    if (
        isinstance(value, str)
        and 0 < len(value) <= MAX_KEY_LENGTH
        and value.isascii()
        and "\x00" not in value
    ):
        return value  # the common case, checked on every claim and release
    if value is None:
        raise InvalidArgument(f"pylease: {parameter} must not be NULL", parameter=parameter)
    if not isinstance(value, str):
        raise InvalidArgument(
            f"pylease: {parameter} must be a str, not {type(value).__name__}", parameter=parameter
        )
    if value == "":
        raise InvalidArgument(f"pylease: {parameter} must not be empty", parameter=parameter)
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidArgument(
            f"pylease: {parameter} must be at most {MAX_KEY_LENGTH} characters",
            parameter=parameter,
        )
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL; refuse it on every backend alike.
        raise InvalidArgument(
            f"pylease: {parameter} must not contain NUL characters", parameter=parameter
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates, e.g. from undecodable bytes in argv: no database stores them.
            raise InvalidArgument(
                f"pylease: {parameter} must be valid Unicode (no lone surrogates)",
                parameter=parameter,
            ) from None
    return value


def _seconds(parameter: str, value: object) -> timedelta:
    if value is None:
        raise InvalidArgument(f"pylease: {parameter} must not be NULL", parameter=parameter)
    if isinstance(value, str):
        try:
            value = durations.parse(value)
        except ValueError as exc:
            raise InvalidArgument(f"pylease: {parameter}: {exc}", parameter=parameter) from None
    if isinstance(value, timedelta):
        if abs(value) > _MAX_SPAN:
            raise InvalidArgument(f"pylease: {parameter} is out of range", parameter=parameter)
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(
            f"pylease: {parameter} must be a timedelta, seconds or a duration string "
            f"like '5m', not {type(value).__name__}",
            parameter=parameter,
        )
    if not math.isfinite(value):
        raise InvalidArgument(f"pylease: {parameter} must be finite", parameter=parameter)
    if abs(value) > _MAX_SPAN_SECONDS:
        raise InvalidArgument(f"pylease: {parameter} is out of range", parameter=parameter)
    return timedelta(seconds=value)


def ttl(value: object, parameter: str = "ttl") -> timedelta:
    """A ttl: positive, at most 366 days; a timedelta or seconds."""
    if type(value) is timedelta and _ZERO < value <= MAX_TTL:
        return value
    span = _seconds(parameter, value)
    if span <= timedelta(0):
        raise InvalidArgument(f"pylease: {parameter} must be positive", parameter=parameter)
    if span > MAX_TTL:
        raise InvalidArgument(f"pylease: {parameter} must be at most 366 days", parameter=parameter)
    return span


def span(parameter: str, value: object) -> timedelta:
    """older_than, min_hold or a wait: not negative, at most 366 days; a timedelta or seconds."""
    result = _seconds(parameter, value)
    if result < timedelta(0):
        raise InvalidArgument(f"pylease: {parameter} must not be negative", parameter=parameter)
    if result > MAX_TTL:
        raise InvalidArgument(f"pylease: {parameter} must be at most 366 days", parameter=parameter)
    return result


def wait(value: object, parameter: str = "wait") -> float:
    """A wait in seconds: a span as :func:`span` takes it, or ``math.inf`` for no deadline.

    ``math.inf`` (:data:`FOREVER`), ``"forever"`` and ``timedelta.max`` wait without one.
    """
    if type(value) is int and value == 0:
        return 0.0  # the default: no wait
    if value == timedelta.max:
        return math.inf
    if isinstance(value, float) and value == math.inf:
        return math.inf
    if isinstance(value, str) and value.strip().lower() == "forever":
        return math.inf
    return span(parameter, value).total_seconds()


def fence(value: object, parameter: str = "fence") -> int:
    """A fence token (or a member's incarnation): an int that fits a bigint."""
    if value is None:
        raise InvalidArgument(f"pylease: {parameter} must not be NULL", parameter=parameter)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"pylease: {parameter} must be an int, not {type(value).__name__}",
            parameter=parameter,
        )
    if not -(2**63) <= value < 2**63:
        raise InvalidArgument(f"pylease: {parameter} is out of range", parameter=parameter)
    return value


def slot(value: object, parameter: str = "slot") -> int:
    """A slot of a semaphore: an int that fits an integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"pylease: {parameter} must be an int, not {type(value).__name__}",
            parameter=parameter,
        )
    if not -(2**31) <= value < 2**31:
        raise InvalidArgument(f"pylease: {parameter} is out of range", parameter=parameter)
    return value


def key_lists(names: object, holders: object) -> tuple[list[str], list[str]]:
    """The names and holders of ``renew_many``: sequences of keys, of equal length."""
    name_list = _sequence("names", names)
    holder_list = _sequence("holders", holders)
    if len(name_list) != len(holder_list):
        raise InvalidArgument(
            "pylease: holders must have as many elements as names", parameter="holders"
        )
    _all_keys("names", name_list)
    _all_keys("holders", holder_list)
    return name_list, holder_list


def _sequence(parameter: str, values: object) -> list[Any]:
    if values is None:
        raise InvalidArgument(f"pylease: {parameter} must not be NULL", parameter=parameter)
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidArgument(
            f"pylease: {parameter} must be a sequence of str, not {type(values).__name__}",
            parameter=parameter,
        )
    return list(values)


def _all_keys(parameter: str, values: list[Any]) -> None:
    for value in values:
        try:
            key(parameter, value)
        except InvalidArgument:
            raise InvalidArgument(
                f"pylease: {parameter} must hold only non-empty texts of at most "
                f"{MAX_KEY_LENGTH} characters",
                parameter=parameter,
            ) from None


MAX_HISTORY_ROWS = 10_000


def ttl_list(ttls: object, count: int) -> list[timedelta | None]:
    """The ttls of ``renew_each``: one per name, each a ttl or None (the lease's last one)."""
    if ttls is None:
        raise InvalidArgument("pylease: ttls must not be NULL", parameter="ttls")
    if isinstance(ttls, str | bytes) or not isinstance(ttls, Sequence):
        raise InvalidArgument(
            f"pylease: ttls must be a sequence, not {type(ttls).__name__}", parameter="ttls"
        )
    if len(ttls) != count:
        raise InvalidArgument("pylease: ttls must have as many elements as names", parameter="ttls")
    result: list[timedelta | None] = []
    for value in ttls:
        if value is None:
            result.append(None)
            continue
        try:
            result.append(ttl(value, "ttls"))
        except InvalidArgument:
            raise InvalidArgument(
                "pylease: ttls must hold only NULLs or finite, positive ttls of at most 366 days",
                parameter="ttls",
            ) from None
    return result


def max_rows(value: object) -> int:
    """``history``'s ``max_rows``: an int from 1 to 10,000."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"pylease: max_rows must be an int, not {type(value).__name__}", parameter="max_rows"
        )
    if not 1 <= value <= MAX_HISTORY_ROWS:
        raise InvalidArgument(
            f"pylease: max_rows must be between 1 and {MAX_HISTORY_ROWS}", parameter="max_rows"
        )
    return value


def prefix(value: object) -> str:
    """A prefix of names: a str that a name could start with ("" for every name)."""
    if value == "":
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(
            f"pylease: prefix must be a str, not {type(value).__name__}", parameter="prefix"
        )
    return key("prefix", value)


def page_size(value: object) -> int | None:
    """How many names a page holds at most: an int >= 1, or None for all of them."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"pylease: max_rows must be an int, not {type(value).__name__}", parameter="max_rows"
        )
    if value < 1:
        raise InvalidArgument("pylease: max_rows must be at least 1", parameter="max_rows")
    return value


def since(value: object) -> datetime | timedelta | None:
    """``history``'s ``since``: None, an aware datetime, or a span back from now."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidArgument(
                "pylease: since must be an aware datetime (with a timezone)", parameter="since"
            )
        return value
    return span("since", value)


MAX_PERMITS = 10_000
MAX_NAMES = 1_000


def count(parameter: str, value: object, most: int, most_name: str) -> int:
    """``max_permits`` or ``permits``: an int from 1 to ``most`` (named ``most_name``)."""
    if type(value) is int and 1 <= value <= most:
        return value
    if value is None:
        raise InvalidArgument(f"pylease: {parameter} must not be NULL", parameter=parameter)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"pylease: {parameter} must be an int, not {type(value).__name__}",
            parameter=parameter,
        )
    if value < 1:
        raise InvalidArgument(f"pylease: {parameter} must be at least 1", parameter=parameter)
    raise InvalidArgument(f"pylease: {parameter} must be at most {most_name}", parameter=parameter)


def max_permits(value: object) -> int:
    """A semaphore's limit: an int from 1 to 10,000."""
    return count("max_permits", value, MAX_PERMITS, str(MAX_PERMITS))


def names(values: object) -> list[str]:
    """The names of ``claim_all``/``release_all``: 1 to 1,000 distinct names."""
    result = _sequence("names", values)
    if not result:
        raise InvalidArgument("pylease: names must not be empty", parameter="names")
    if len(result) > MAX_NAMES:
        raise InvalidArgument(
            f"pylease: names must hold at most {MAX_NAMES} names", parameter="names"
        )
    _all_keys("names", result)
    if len(set(result)) != len(result):
        raise InvalidArgument("pylease: names must not hold a name twice", parameter="names")
    return result


KINDS = ("lease", "shared", "permit", "member")


def kinds(values: object, length: int) -> list[str]:
    """The kinds of the keeper's renewal: ``"lease"``, ``"shared"``, ``"permit"`` or
    ``"member"`` per element."""
    result = _sequence("kinds", values)
    if len(result) != length or any(v not in KINDS for v in result):
        raise InvalidArgument(
            "pylease: kinds must hold 'lease', 'shared', 'permit' or 'member' for each element"
            " of names",
            parameter="kinds",
        )
    return result


def tenure_list(parameter: str, values: object, length: int) -> list[int | None]:
    """The fences (or slots) of the keeper's renewal: one int or None (any tenure) per
    element of names; None for all of them."""
    if values is None:
        return [None] * length
    result = _sequence(parameter, values)
    if len(result) != length:
        raise InvalidArgument(
            f"pylease: {parameter} must have as many elements as names", parameter=parameter
        )
    for value in result:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63
        ):
            raise InvalidArgument(
                f"pylease: {parameter} must hold ints (or None)", parameter=parameter
            )
    return result


MAX_GROUP_LENGTH = 190
MAX_PARTITIONS = 1024
MAX_DATA_LENGTH = 8192


def group(value: object) -> str:
    """A group's name: a key of at most 190 characters, so that ``"<grp>#<part>"``, the
    name of a partition's lease, is a key too."""
    if isinstance(value, str) and len(value) > MAX_GROUP_LENGTH:
        raise InvalidArgument(
            f"pylease: grp must be at most {MAX_GROUP_LENGTH} characters", parameter="grp"
        )
    return key("grp", value)


def partitions(value: object) -> int:
    """A group's number of partitions: an int from 1 to 1,024."""
    return count("partitions", value, MAX_PARTITIONS, str(MAX_PARTITIONS))


def data(value: object) -> str | None:
    """A member's data as JSON text (None: no data): at most 8,192 characters of it."""
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"pylease: data must be JSON: {exc}", parameter="data") from None
    if len(text) > MAX_DATA_LENGTH:
        raise InvalidArgument(
            f"pylease: data must be at most {MAX_DATA_LENGTH} characters as JSON text",
            parameter="data",
        )
    return text
