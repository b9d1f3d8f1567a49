# The source of tests/api/test_lock_api.py: tools/async_to_sync.py writes it from this file.
"""What users of redis-py's, python-redis-lock's and filelock's locks reach for (issue 29,
item 4; contract 5.6): the expiry and the time left, a round-trip ``owned()``, a lease
held outside a block, ``status``/``locked`` for any name, and a nested lease of a name
its own block holds refused at once.

test_lock_api.py, for the sync API, is generated from this file. Another party acts
through the command line (``pylease steal``), as an operator would.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import pylease
from pylease import FOREVER, LeaseBusy, LeaseLost, alease, apermit
from pylease._acompat import asleep
from tests.support.cli import ok
from tests.support.leases import ajoin_workers, asleep_until, astart_worker


def steal(url: str, name: str) -> None:
    ok("steal", name, "--ttl", "1m", "--holder", "thief", "--dsn", url)


async def test_held_tells_its_expiry_and_its_time_left(url: str) -> None:
    before = datetime.now(UTC)
    async with alease(url, "job", ttl=3) as held:
        row = (await pylease.astatus(url, "job"))[0]
        assert before + timedelta(seconds=2) < held.expires_at <= row.expires_at
        assert 0 < held.remaining <= 3
        first = held.expires_at
        # The keeper renews every ttl/3: then the expiry is the one the server granted.
        assert await asleep_until(lambda: held.expires_at > first)
        row = (await pylease.astatus(url, "job"))[0]
        assert first < held.expires_at <= row.expires_at
        assert 0 < held.remaining <= 3
    assert held.remaining == 0


async def test_owned_asks_the_database(url: str) -> None:
    with pytest.raises(LeaseLost, match="'job'"):
        async with alease(url, "job", ttl=30) as held:
            assert await held.owned() is True
            steal(url, "job")
            # Asked, the database says so at once, before any renewal could tell.
            assert await held.owned() is False
    assert held.lost is True


async def test_owned_is_false_without_asking_once_the_block_ended(url: str) -> None:
    async with alease(url, "job", ttl=30) as held:
        pass
    assert await held.owned() is False


async def test_acquire_and_release_hold_a_lease_outside_a_block(url: str) -> None:
    lock = alease(url, "job", ttl=30)
    held = await lock.acquire()
    assert await pylease.alocked(url, "job") is True
    assert await held.owned() is True
    with pytest.raises(LeaseBusy):
        async with alease(url, "job", ttl=30, holder="someone-else"):
            pass
    await lock.release()
    assert await pylease.alocked(url, "job") is False
    assert held.lost is True
    with pytest.raises(RuntimeError, match="entered once"):
        await lock.acquire()


async def test_release_after_a_loss_raises_lease_lost(url: str) -> None:
    lock = alease(url, "job", ttl=30)
    held = await lock.acquire()
    steal(url, "job")
    with pytest.raises(LeaseLost, match="'job'"):
        await lock.release()
    assert held.lost is True
    row = (await pylease.astatus(url, "job"))[0]
    assert (row.holder, row.held) == ("thief", True)


async def test_status_and_locked_for_any_name(url: str) -> None:
    assert await pylease.astatus(url) == []
    assert await pylease.alocked(url, "job") is False
    async with alease(url, "job", ttl=30, holder="worker-1") as held, alease(url, "other", ttl=30):
        rows = await pylease.astatus(url)
        assert [(r.name, r.holder, r.fence, r.state) for r in rows if r.name == "job"] == [
            ("job", "worker-1", held.fence, "held")
        ]
        assert {r.name for r in rows} == {"job", "other"}
        assert await pylease.alocked(url, "job") is True
    assert await pylease.alocked(url, "job") is False
    assert [r.state for r in await pylease.astatus(url, "job")] == ["released"]
    with pytest.raises(ValueError):
        await pylease.alocked(url, "")


async def test_a_nested_lease_of_a_name_its_block_holds_is_refused_at_once(url: str) -> None:
    async with alease(url, "job", ttl=30, holder="outer") as held:
        # Without a deadline, only a refusal can end this wait: it would wait for itself.
        with pytest.raises(LeaseBusy, match="held by this process already") as refused:
            await alease(url, "job", ttl=30, wait=FOREVER).acquire()
        assert refused.value.holder == "outer"
        assert held.lost is False
        assert await held.owned() is True


async def test_the_same_name_on_another_database_is_another_lease(url: str, tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    async with alease(url, "job", ttl=30) as here, alease(other, "job", ttl=30) as there:
        assert (here.fence, there.fence) == (1, 1)


async def test_other_workers_of_the_process_still_wait_their_turn(url: str) -> None:
    got: list[int] = []

    async def worker() -> None:
        async with alease(url, "job", ttl=30, wait=60) as held:
            got.append(held.fence)

    async with alease(url, "job", ttl=30) as held:
        waiting = astart_worker(worker)
        await asleep(0.3)
        assert got == []
    await ajoin_workers([waiting], 60)
    assert got == [held.fence + 1]


async def test_permits_of_one_name_may_be_held_twice_in_one_block(url: str) -> None:
    async with (
        apermit(url, "pool", max_permits=2, ttl=30) as first,
        apermit(url, "pool", max_permits=2, ttl=30) as second,
    ):
        assert set(first.slots) | set(second.slots) == {0, 1}
        assert await second.owned() is True
