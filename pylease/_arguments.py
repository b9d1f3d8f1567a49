"""The argument checks of the operations that take more than keys and spans (each
operation's method in :mod:`pylease._operations_async` checks the rest with
:mod:`pylease._validate`), run before any SQL on every backend.

Each function returns the argument as the SQL takes it (spans as ``timedelta``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pylease import _validate
from pylease.errors import InvalidArgument

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
