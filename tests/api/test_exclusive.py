"""@exclusive on plain functions, on a real PostgreSQL; coroutine functions in
test_exclusive_async.py. The typing promise is checked by running mypy on
tests/support/typed_exclusive.py."""

from __future__ import annotations

import functools
import inspect
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import InvalidArgument, LeaseBusy, LeaseLost, SchemaMissing, exclusive, lease
from tests.support.leases import claim, status, steal

Conn = psycopg.Connection[Any]


def held_names(conn: Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM lease_status() WHERE held ORDER BY name")]


@dataclass
class Tenant:
    id: int


def test_the_name_is_formatted_from_the_calls_arguments(dsn: str, conn: Conn) -> None:
    seen: list[list[str]] = []

    @exclusive(dsn, "report-{day}-{tenant.id}-{kind}", ttl=30)
    def report(day: date, tenant: Tenant, kind: str = "daily") -> str:
        seen.append(held_names(conn))
        return f"{day}/{tenant.id}"

    assert report(date(2026, 12, 1), Tenant(7)) == "2026-12-01/7"
    assert report(date(2026, 12, 2), tenant=Tenant(8), kind="weekly") == "2026-12-02/8"
    assert seen == [["report-2026-12-01-7-daily"], ["report-2026-12-02-8-weekly"]]
    assert held_names(conn) == []  # released after each call


def test_a_field_from_kwargs_and_literal_braces(dsn: str, conn: Conn) -> None:
    seen: list[list[str]] = []

    @exclusive(dsn, "{{sync}}-{region}", ttl=30)
    def sync(**options: str) -> None:
        seen.append(held_names(conn))

    sync(region="eu")
    assert seen == [["{sync}-eu"]]


def test_a_field_the_call_cannot_fill_raises_at_call_time_and_claims_nothing(
    dsn: str, conn: Conn
) -> None:
    calls: list[str] = []

    @exclusive(dsn, "sync-{region}", ttl=30)
    def sync(**options: str) -> None:
        calls.append("ran")

    with pytest.raises(InvalidArgument, match="region") as info:
        sync(zone="a")
    assert info.value.parameter == "name"
    with pytest.raises(InvalidArgument, match="cannot be formatted"):

        @exclusive(dsn, "t-{tenant.id}", ttl=30)
        def per_tenant(tenant: object) -> None: ...

        per_tenant(object())
    assert calls == []
    assert conn.execute("SELECT count(*) FROM lease_status()").fetchone() == (0,)


def test_a_field_the_function_has_no_parameter_for_fails_at_decoration(dsn: str) -> None:
    with pytest.raises(InvalidArgument, match="no parameter for"):

        @exclusive(dsn, "report-{day}", ttl=30)
        def report(date: str) -> None: ...

    for bad in ("report-{0}", "report-{}", "report-{day", "report-}"):
        with pytest.raises(InvalidArgument):
            exclusive(dsn, bad, ttl=30)


def test_bad_options_fail_at_decoration() -> None:
    url = "postgresql://postgres@127.0.0.1:1/never-used"
    with pytest.raises(InvalidArgument, match="ttl"):
        exclusive(url, "x", ttl=0)
    with pytest.raises(InvalidArgument, match="busy"):
        exclusive(url, "x", ttl=5, busy="skip")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="hodler"):
        exclusive(url, "x", ttl=5, hodler="me")
    with pytest.raises(TypeError, match="cancel_on_lost"):
        exclusive(url, "x", ttl=5, cancel_on_lost=False)(lambda: None)


def test_busy_returns_none_without_calling(dsn: str, conn: Conn) -> None:
    calls: list[int] = []

    @exclusive(dsn, "sweep", ttl=30)
    def sweep(n: int) -> int:
        calls.append(n)
        return n

    assert claim(conn, "sweep", holder="other") is not None
    assert sweep(1) is None
    conn.execute("SELECT lease_release('sweep', 'other')")
    assert sweep(2) == 2
    assert calls == [2]


def test_busy_raise_raises_lease_busy_naming_the_holder(dsn: str, conn: Conn) -> None:
    @exclusive(dsn, "sweep-{n}", ttl=30, busy="raise")
    def sweep(n: int) -> int:
        return n

    assert claim(conn, "sweep-1", holder="other") is not None
    with pytest.raises(LeaseBusy) as info:
        sweep(1)
    assert info.value.name == "sweep-1" and info.value.holder == "other"
    assert sweep(2) == 2


def test_min_hold_makes_it_at_most_once_per_period(dsn: str) -> None:
    calls: list[float] = []

    @exclusive(dsn, "hourly", ttl=30, min_hold=3)
    def hourly() -> str:
        calls.append(time.monotonic())
        return "done"

    start = time.monotonic()
    assert hourly() == "done"
    while time.monotonic() - start < 2:  # duplicates within the period
        assert hourly() is None
    while hourly() is None:
        assert time.monotonic() - start < 30
        time.sleep(0.1)
    assert len(calls) == 2 and calls[1] - calls[0] >= 3 - 0.5


def test_a_failing_body_raises_and_releases(dsn: str, conn: Conn) -> None:
    @exclusive(dsn, "fails", ttl=30)
    def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fails()
    row = status(conn, "fails")
    assert row is not None and not row["held"]


def test_a_lease_lost_while_the_function_ran_raises_lease_lost(dsn: str, conn: Conn) -> None:
    """The work ran unprotected: that is never reported as a plain return."""

    @exclusive(dsn, "stolen", ttl=30)
    def work() -> str:
        assert steal(conn, "stolen") is not None
        return "done"

    with pytest.raises(LeaseLost) as info:
        work()
    assert info.value.name == "stolen"


def test_a_broken_deployment_raises_never_returns_none(empty_dsn: str) -> None:
    @exclusive(empty_dsn, "sweep", ttl=30)
    def sweep() -> int:
        return 1

    with pytest.raises(SchemaMissing):
        sweep()


def test_one_call_at_a_time_and_a_second_caller_waits_with_wait(dsn: str, conn: Conn) -> None:
    @exclusive(dsn, "slow", ttl=30, wait=20)
    def slow() -> str:
        return "ran"

    with lease(conn, "slow", ttl=30):
        assert exclusive(dsn, "slow", ttl=30)(lambda: "x")() is None
    assert slow() == "ran"


def test_functools_wraps_and_the_signature_is_kept(dsn: str) -> None:
    def report(day: date, *, kind: str = "daily") -> str:
        """Make the report."""
        return kind

    wrapped = exclusive(dsn, "report-{day}", ttl=30)(report)
    assert wrapped.__name__ == "report" and wrapped.__doc__ == "Make the report."
    assert wrapped.__wrapped__ is report  # type: ignore[attr-defined]
    assert inspect.signature(wrapped) == inspect.signature(report)
    assert not inspect.iscoroutinefunction(wrapped)


def test_mypy_strict_accepts_the_typed_sample_and_sees_the_signature(tmp_path: Path) -> None:
    """tests/support/typed_exclusive.py uses assert_type and type: ignore[...] on wrong calls:
    under --strict an unused ignore is an error, so a decorator that lost the
    signature (Any, or (...)) fails this test as surely as one that broke it."""
    sample = Path(__file__).resolve().parents[1] / "support" / "typed_exclusive.py"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(sample)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# Issue 21, item 4: the lease covers the call, so a callable whose work runs after the
# call returned (a generator) would run unprotected: two bodies ran at once.


def test_a_generator_function_is_refused_at_decoration(dsn: str, conn: Conn) -> None:
    def rows(n: int) -> Iterator[int]:
        yield from range(n)

    class Rows:
        def __call__(self, n: int) -> Iterator[int]:
            yield from range(n)

    for fn in (rows, Rows(), functools.partial(rows, 3)):
        with pytest.raises(InvalidArgument, match="generator function") as info:
            exclusive(dsn, "rows", ttl=30)(fn)
        assert info.value.parameter == "fn"
    assert status(conn, "rows") is None  # nothing was claimed


def test_a_plain_function_returning_work_to_do_is_refused_inside_the_lease(
    dsn: str, conn: Conn
) -> None:
    ran: list[list[str]] = []

    def body() -> Iterator[int]:
        ran.append(held_names(conn))
        yield 1

    async def coroutine() -> None:
        ran.append(held_names(conn))

    @exclusive(dsn, "lazy", ttl=30)
    def lazy() -> Iterator[int]:
        return body()

    @exclusive(dsn, "later", ttl=30, busy="raise")
    def later() -> Coroutine[Any, Any, None]:
        return coroutine()

    with pytest.raises(TypeError, match="after the lease is released"):
        lazy()
    with pytest.raises(TypeError, match="after the lease is released"):
        later()  # closed unstarted: no "never awaited" warning either
    assert ran == []
    assert held_names(conn) == []  # both released
