"""A typed use of @exclusive, checked by ``mypy --strict`` in ``make typecheck``.

Not a test module: pytest does not collect it. Each ``assert_type`` states what the
decorated function's type must be; each ``type: ignore[...]`` marks a call the
decorator's signature must reject (under --strict an ignore that is not needed is
itself an error, so a decorator that erased the signature fails the check).
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import date
from typing import NoReturn, assert_type

from pylease import exclusive

DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


@exclusive(DSN, "report-{day}", ttl=60)
def report(day: date, *, kind: str = "daily") -> int:
    return day.day


@exclusive(DSN, "report-{day}", ttl=300, busy="raise", min_hold=30)
def report_or_raise(day: date) -> int:
    return day.day


@exclusive(DSN, "sync-{tenant}", ttl=60)
async def sync(tenant: str, retries: int = 3) -> list[str]:
    return [tenant] * retries


@exclusive(DSN, "sync-{tenant}", ttl=60, busy="raise")
async def sync_or_raise(tenant: str) -> list[str]:
    return [tenant]


class Compact:
    """An object whose __call__ is a coroutine function: awaited under the lease."""

    async def __call__(self, table: str) -> int:
        return len(table)


compact = exclusive(DSN, "compact-{table}", ttl=60)(Compact())


def numbers(n: int) -> Generator[int, None, None]:
    yield from range(n)


def refused() -> None:
    # A generator function is refused at decoration: the decorator never returns.
    assert_type(exclusive(DSN, "numbers", ttl=60)(numbers), NoReturn)


async def use() -> None:
    assert_type(report(date.today()), int | None)
    assert_type(report(date.today(), kind="weekly"), int | None)
    assert_type(report_or_raise(date.today()), int)
    assert_type(await sync("acme"), list[str] | None)
    assert_type(await sync("acme", retries=1), list[str] | None)
    assert_type(await sync_or_raise("acme"), list[str])
    assert_type(await compact("events"), int | None)

    report("2026-12-01")  # type: ignore[arg-type]
    report(date.today(), kind=1)  # type: ignore[arg-type]
    report(date.today(), colour="red")  # type: ignore[call-arg]
    report_or_raise()  # type: ignore[call-arg]
    await sync(42)  # type: ignore[arg-type]
    await sync_or_raise("acme", "extra")  # type: ignore[call-arg]
    await compact(7)  # type: ignore[arg-type]
