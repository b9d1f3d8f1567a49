# The source of tests/api/test_exclusive.py: tools/async_to_sync.py writes it from this file.
"""@exclusive on a real PostgreSQL, on coroutine functions (test_exclusive_async.py, the
source) and on plain functions (test_exclusive.py, generated from it). The typing
promise is checked by `make typecheck`, which runs mypy on tests/support/typed_exclusive.py."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from datetime import date
from typing import Any

import pytest

from pylease import InvalidArgument, LeaseBusy, LeaseLost, SchemaMissing, alease, exclusive
from pylease._acompat import AEvent, asleep
from tests.support.leases import (
    AConn,
    aclaim,
    ajoin_workers,
    asleep_until,
    astart_worker,
    astatus,
    asteal,
)

BOUND = 60.0


async def held_names(aconn: AConn) -> list[str]:
    cur = await aconn.execute("SELECT name FROM lease_status() WHERE held ORDER BY name")
    return [r[0] for r in await cur.fetchall()]


@dataclass
class Tenant:
    id: int


async def test_the_name_is_formatted_from_the_calls_arguments(dsn: str, aconn: AConn) -> None:
    seen: list[list[str]] = []

    @exclusive(dsn, "report-{day}-{tenant.id}-{kind}", ttl=30)
    async def report(day: date, tenant: Tenant, kind: str = "daily") -> str:
        seen.append(await held_names(aconn))
        return f"{day}/{tenant.id}"

    assert await report(date(2026, 12, 1), Tenant(7)) == "2026-12-01/7"
    assert await report(date(2026, 12, 2), tenant=Tenant(8), kind="weekly") == "2026-12-02/8"
    assert seen == [["report-2026-12-01-7-daily"], ["report-2026-12-02-8-weekly"]]
    assert await held_names(aconn) == []  # released after each call


async def test_a_field_from_kwargs_and_literal_braces(dsn: str, aconn: AConn) -> None:
    seen: list[list[str]] = []

    @exclusive(dsn, "{{sync}}-{region}", ttl=30)
    async def sync(**options: str) -> None:
        seen.append(await held_names(aconn))

    await sync(region="eu")
    assert seen == [["{sync}-eu"]]


async def test_a_field_the_call_cannot_fill_raises_at_call_time_and_claims_nothing(
    dsn: str, aconn: AConn
) -> None:
    calls: list[str] = []

    @exclusive(dsn, "sync-{region}", ttl=30)
    async def sync(**options: str) -> None:
        calls.append("ran")

    with pytest.raises(InvalidArgument, match="region") as info:
        await sync(zone="a")
    assert info.value.parameter == "name"
    with pytest.raises(InvalidArgument, match="cannot be formatted"):

        @exclusive(dsn, "t-{tenant.id}", ttl=30)
        async def per_tenant(tenant: object) -> None: ...

        await per_tenant(object())
    assert calls == []
    cur = await aconn.execute("SELECT count(*) FROM lease_status()")
    assert await cur.fetchone() == (0,)


def test_a_field_the_function_has_no_parameter_for_fails_at_decoration(dsn: str) -> None:
    with pytest.raises(InvalidArgument, match="no parameter for"):

        @exclusive(dsn, "report-{day}", ttl=30)
        async def report(date: str) -> None: ...

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
    if True:  # ASYNC
        pass  # a coroutine function takes cancel_on_lost (test_wraps_keeps_a_coroutine_function)
    else:
        with pytest.raises(TypeError, match="cancel_on_lost"):
            exclusive(url, "x", ttl=5, cancel_on_lost=False)(lambda: None)


async def test_a_connection_target(aconn: AConn, aconn2: AConn) -> None:
    @exclusive(aconn, "on-conn", ttl=30)
    async def work() -> list[str]:
        return await held_names(aconn2)

    assert await work() == ["on-conn"]


async def test_busy_returns_none_without_calling(dsn: str, aconn: AConn) -> None:
    calls: list[int] = []

    @exclusive(dsn, "sweep", ttl=30)
    async def sweep(n: int) -> int:
        calls.append(n)
        return n

    assert await aclaim(aconn, "sweep", holder="other") is not None
    assert await sweep(1) is None
    await aconn.execute("SELECT lease_release('sweep', 'other')")
    assert await sweep(2) == 2
    assert calls == [2]


async def test_busy_raise_raises_lease_busy_naming_the_holder(dsn: str, aconn: AConn) -> None:
    @exclusive(dsn, "sweep-{n}", ttl=30, busy="raise")
    async def sweep(n: int) -> int:
        return n

    assert await aclaim(aconn, "sweep-1", holder="other") is not None
    with pytest.raises(LeaseBusy) as info:
        await sweep(1)
    assert info.value.name == "sweep-1" and info.value.holder == "other"
    assert await sweep(2) == 2


async def test_busy_returns_none_and_busy_raise_raises(dsn: str, aconn: AConn) -> None:
    calls: list[str] = []

    @exclusive(dsn, "sweep", ttl=30)
    async def sweep() -> str:
        calls.append("quiet")
        return "ran"

    @exclusive(dsn, "sweep", ttl=30, busy="raise")
    async def loud() -> str:
        calls.append("loud")
        return "ran"

    assert await aclaim(aconn, "sweep", holder="other") is not None
    assert await sweep() is None
    with pytest.raises(LeaseBusy) as info:
        await loud()
    assert info.value.holder == "other"
    assert calls == []
    await aconn.execute("SELECT lease_release('sweep', 'other')")
    assert await sweep() == "ran" and await loud() == "ran"


async def test_concurrent_calls_run_once(dsn: str) -> None:
    started = AEvent()
    finish = AEvent()

    @exclusive(dsn, "once", ttl=30)
    async def once() -> str:
        started.set()
        await finish.wait()
        return "ran"

    results: list[str | None] = []

    async def call() -> None:
        results.append(await once())

    first = astart_worker(call)
    try:
        assert await asleep_until(started.is_set, BOUND)
        await call()
        await call()
    finally:
        finish.set()
    await ajoin_workers([first])
    assert results == [None, None, "ran"]


async def held_permits(aconn: AConn) -> list[tuple[str, int]]:
    cur = await aconn.execute("SELECT name, slot FROM permit_status() WHERE held ORDER BY 1, 2")
    return [(r[0], r[1]) for r in await cur.fetchall()]


async def test_max_permits_caps_concurrent_calls_per_key(dsn: str, aconn: AConn) -> None:
    """Two calls per tenant at once, whatever the other tenants do; a third is busy."""
    entered = {1: AEvent(), 2: AEvent()}
    finish = AEvent()
    running: list[int] = []

    @exclusive(dsn, "export-{tenant_id}", ttl=30, max_permits=2)
    async def export(tenant_id: int) -> str:
        running.append(tenant_id)
        if running.count(tenant_id) == 2:
            entered[tenant_id].set()
        await finish.wait()
        return f"exported {tenant_id}"

    results: list[str | None] = []

    async def call(tenant_id: int) -> None:
        results.append(await export(tenant_id))

    workers = [astart_worker(call, 1), astart_worker(call, 1)]
    try:
        assert await asleep_until(entered[1].is_set, BOUND)
        assert await export(1) is None  # a third call for tenant 1: the cap is reached
        workers += [astart_worker(call, 2), astart_worker(call, 2)]
        assert await asleep_until(entered[2].is_set, BOUND)  # another tenant's cap is its own
        assert await held_permits(aconn) == [
            ("export-1", 0), ("export-1", 1), ("export-2", 0), ("export-2", 1),
        ]  # fmt: skip
    finally:
        finish.set()
    await ajoin_workers(workers)
    assert sorted(results, key=str) == ["exported 1"] * 2 + ["exported 2"] * 2
    assert sorted(running) == [1, 1, 2, 2]
    assert await held_permits(aconn) == []  # every permit given back


async def test_max_permits_busy_raise_and_wait(dsn: str, aconn: AConn) -> None:
    await aconn.execute("SELECT permit_claim('cap', 1, interval '1 hour', 'other')")

    @exclusive(dsn, "cap", ttl=30, max_permits=1, busy="raise")
    async def capped() -> str:
        return "ran"

    with pytest.raises(LeaseBusy) as busy:
        await capped()
    assert busy.value.name == "cap" and busy.value.holder == "other"

    @exclusive(dsn, "cap", ttl=30, max_permits=1, wait=BOUND)
    async def waiting() -> str:
        return "ran"

    async def release_soon() -> None:
        await asleep(0.3)
        await aconn.execute("SELECT permit_release('cap', 'other')")

    freeing = astart_worker(release_soon)
    assert await waiting() == "ran"
    await ajoin_workers([freeing])


def test_max_permits_options_fail_at_decoration() -> None:
    url = "postgresql://postgres@127.0.0.1:1/never-used"
    with pytest.raises(InvalidArgument, match="max_permits"):
        exclusive(url, "x", ttl=5, max_permits=0)
    with pytest.raises(InvalidArgument, match="permits"):
        exclusive(url, "x", ttl=5, max_permits=2, permits=3)
    with pytest.raises(TypeError, match="min_hold"):
        exclusive(url, "x", ttl=5, max_permits=2, min_hold=60)
    with pytest.raises(TypeError, match="permits"):
        exclusive(url, "x", ttl=5, permits=2)  # a number of permits, of no semaphore


async def test_min_hold_makes_it_at_most_once_per_period(dsn: str) -> None:
    calls: list[float] = []

    @exclusive(dsn, "hourly", ttl=30, min_hold=3)
    async def hourly() -> str:
        calls.append(time.monotonic())
        return "done"

    start = time.monotonic()
    assert await hourly() == "done"
    while time.monotonic() - start < 2:  # duplicates within the period
        assert await hourly() is None
    while await hourly() is None:
        assert time.monotonic() - start < 30
        await asleep(0.1)
    assert len(calls) == 2 and calls[1] - calls[0] >= 3 - 0.5


async def test_a_failing_body_raises_and_releases(dsn: str, aconn: AConn) -> None:
    @exclusive(dsn, "fails", ttl=30)
    async def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fails()
    row = await astatus(aconn, "fails")
    assert row is not None and not row["held"]


async def test_a_lease_lost_while_the_function_ran_raises_lease_lost(
    dsn: str, aconn: AConn
) -> None:
    """The work ran unprotected: that is never reported as a plain return."""

    @exclusive(dsn, "stolen", ttl=30)
    async def work() -> str:
        assert await asteal(aconn, "stolen") is not None
        return "done"

    with pytest.raises(LeaseLost) as info:
        await work()
    assert info.value.name == "stolen"


async def test_a_broken_deployment_raises_never_returns_none(empty_dsn: str) -> None:
    @exclusive(empty_dsn, "sweep", ttl=30)
    async def sweep() -> int:
        return 1

    with pytest.raises(SchemaMissing):
        await sweep()


async def test_failures_raise(dsn: str, empty_dsn: str, aconn: AConn) -> None:
    @exclusive(dsn, "fails", ttl=30)
    async def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fails()
    row = await astatus(aconn, "fails")
    assert row is not None and not row["held"]

    @exclusive(empty_dsn, "sweep", ttl=30)
    async def unmigrated() -> None: ...

    with pytest.raises(SchemaMissing):
        await unmigrated()

    @exclusive(dsn, "sync-{region}", ttl=30)
    async def sync(**options: str) -> None: ...

    with pytest.raises(InvalidArgument, match="region"):
        await sync(zone="a")


async def test_one_call_at_a_time_and_a_second_caller_waits_with_wait(
    dsn: str, aconn: AConn
) -> None:
    @exclusive(dsn, "slow", ttl=30, wait=20)
    async def slow() -> str:
        return "ran"

    async def other() -> str:
        return "x"

    async with alease(aconn, "slow", ttl=30):
        assert await exclusive(dsn, "slow", ttl=30)(other)() is None
    assert await slow() == "ran"


def test_functools_wraps_and_the_signature_is_kept(dsn: str) -> None:
    async def report(day: date, *, kind: str = "daily") -> str:
        """Make the report."""
        return kind

    wrapped = exclusive(dsn, "report-{day}", ttl=30)(report)
    assert wrapped.__name__ == "report" and wrapped.__doc__ == "Make the report."
    assert wrapped.__wrapped__ is report  # type: ignore[attr-defined]
    assert inspect.signature(wrapped) == inspect.signature(report)
    if True:  # ASYNC
        assert inspect.iscoroutinefunction(wrapped)
    else:
        assert not inspect.iscoroutinefunction(wrapped)


if True:  # ASYNC

    async def test_wraps_keeps_a_coroutine_function(dsn: str) -> None:
        async def job(n: int, *, label: str = "x") -> int:
            """The job."""
            return n

        wrapped = exclusive(dsn, "job-{n}", ttl=30, cancel_on_lost=False)(job)
        assert inspect.iscoroutinefunction(wrapped)
        assert wrapped.__name__ == "job" and wrapped.__doc__ == "The job."
        assert inspect.signature(wrapped) == inspect.signature(job)
        assert await wrapped(5) == 5


# Issue 21, item 4: the lease covers the call and its await. Work that runs after the
# call returned (a generator's body runs while the caller iterates) ran unprotected,
# two bodies at once: such callables are refused; an object whose __call__ is a
# coroutine function is awaited under the lease.


async def test_a_generator_function_is_refused_at_decoration(dsn: str, aconn: AConn) -> None:
    async def rows(n: int) -> AsyncIterator[int]:
        yield n

    class Rows:
        async def __call__(self, n: int) -> AsyncIterator[int]:
            yield n

    for fn in (rows, Rows(), functools.partial(rows, 3)):
        with pytest.raises(InvalidArgument, match="generator function") as info:
            exclusive(dsn, "rows", ttl=30)(fn)
        assert info.value.parameter == "fn"
    assert await astatus(aconn, "rows") is None  # nothing was claimed


async def test_an_object_whose_call_is_the_work_runs_it_under_the_lease(
    dsn: str, aconn: AConn
) -> None:
    seen: list[list[str]] = []
    started = AEvent()
    finish = AEvent()

    class Sync:
        async def __call__(self, tenant: str) -> str:
            seen.append(await held_names(aconn))
            started.set()
            await finish.wait()
            return tenant

    sync = exclusive(dsn, "sync-{tenant}", ttl=30)(Sync())
    if True:  # ASYNC
        assert inspect.iscoroutinefunction(sync)
    results: list[str | None] = []

    async def call() -> None:
        results.append(await sync("acme"))

    first = astart_worker(call)
    try:
        assert await asleep_until(started.is_set, BOUND)
        # Held while the first body runs: the others are busy, their bodies never start.
        assert await sync("acme") is None and await sync(tenant="acme") is None
    finally:
        finish.set()
    await ajoin_workers([first])
    assert results == ["acme"] and seen == [["sync-acme"]]
    assert await held_names(aconn) == []


if True:  # ASYNC
    pass
else:

    async def test_a_function_returning_work_to_do_is_refused_inside_the_lease(
        dsn: str, aconn: AConn
    ) -> None:
        ran: list[list[str]] = []

        async def body() -> AsyncIterator[int]:
            ran.append(await held_names(aconn))
            yield 1

        @exclusive(dsn, "lazy", ttl=30)
        async def lazy() -> AsyncIterator[int]:
            return body()

        @exclusive(dsn, "later", ttl=30, busy="raise")
        async def later() -> Coroutine[Any, Any, None]:
            return asyncio.sleep(0)  # a coroutine the decorated function does not await

        with pytest.raises(TypeError, match="after the lease is released"):
            await lazy()
        with pytest.raises(TypeError, match="after the lease is released"):
            await later()  # closed unstarted: no "never awaited" warning either
        assert ran == []
        assert await held_names(aconn) == []  # both released
