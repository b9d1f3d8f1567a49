"""Each operation's arguments, checked before any SQL runs: one check per operation,
used by every backend, so PostgreSQL and SQLite refuse the same inputs the same way.

Each function returns the arguments as the SQL takes them (spans as ``timedelta``).
"""

from __future__ import annotations

from typing import Any

from pylease import _validate


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
