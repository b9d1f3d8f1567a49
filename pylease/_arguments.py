"""Each operation's arguments, checked before any SQL runs: one check per operation,
used by every backend, so PostgreSQL and SQLite refuse the same inputs the same way.

Each function returns the arguments as the SQL takes them (spans as ``timedelta``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pylease import _validate
from pylease.errors import InvalidArgument

MAX_HISTORY_ROWS = 10_000


def claim(name: object, ttl: object, holder: object) -> tuple[Any, ...]:
    return (_validate.key("name", name), _validate.ttl(ttl), _validate.key("holder", holder))


def renew(name: object, holder: object, ttl: object) -> tuple[Any, ...]:
    span = None if ttl is None else _validate.ttl(ttl)
    return (_validate.key("name", name), _validate.key("holder", holder), span)


def renew_many(names: object, holders: object, ttl: object) -> tuple[Any, ...]:
    span = None if ttl is None else _validate.ttl(ttl)
    return (*_validate.key_lists(names, holders), span)


def release(name: object, holder: object, min_hold: object) -> tuple[Any, ...]:
    span = None if min_hold is None else _validate.span("min_hold", min_hold)
    return (_validate.key("name", name), _validate.key("holder", holder), span)


def steal(name: object, ttl: object, holder: object, older_than: object) -> tuple[Any, ...]:
    return (
        _validate.key("name", name),
        _validate.ttl(ttl),
        _validate.key("holder", holder),
        _validate.span("older_than", older_than),
    )


def holds(name: object, holder: object, fence: object) -> tuple[Any, ...]:
    return (_validate.key("name", name), _validate.key("holder", holder), _validate.fence(fence))


def status(name: object) -> tuple[Any, ...]:
    return (None if name is None else _validate.key("name", name),)


def renew_each(names: object, holders: object, ttls: object) -> tuple[Any, ...]:
    name_list, holder_list = _validate.key_lists(names, holders)
    return (name_list, holder_list, ttl_list(ttls, len(name_list)))


def history(name: object, since_: object, max_rows_: object) -> tuple[Any, ...]:
    return (
        None if name is None else _validate.key("name", name),
        since(since_),
        max_rows(max_rows_),
    )


def prune_history(older_than: object) -> tuple[Any, ...]:
    return (_validate.span("older_than", older_than),)


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
            result.append(_validate.ttl(value, "ttls"))
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
    return _validate.span("since", value)
