# The source of tests/api/test_groups.py: tools/async_to_sync.py writes it from this file.
"""agroup() and apartitions() (contract 5.5) on PostgreSQL and SQLite.

test_groups.py, for group() and partitions(), is generated from this file. The other
party (another member, a crashed one, someone who makes a member leave) acts through a
backend on a connection of its own.
"""

from __future__ import annotations

import gc
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pylease import InvalidArgument, LeaseLost, MemberLive, agroup, alease, apartitions
from pylease._acompat import asleep, monotonic
from tests.support.leases import DETECT, afunction_calls, asleep_until, atrack_functions
from tests.support.safety_kit import Db

GRP = "indexers"
ROOT = Path(__file__).resolve().parents[2]
HOUR = timedelta(hours=1)
# Liveness bounds of a loaded machine, never speeds.
BOUND = 30.0


async def enter_once(cm: Any) -> None:
    """Enter and leave a block that should raise on entry."""
    async with cm:
        pass


async def test_a_member_joins_is_listed_and_leaves(db: Db) -> None:
    other = db.backend()
    async with agroup(db.url, GRP, ttl=30, data={"addr": "10.0.0.7"}) as m:
        assert m.incarnation is not None and m.incarnation >= 1
        rows = await m.members()
        assert [(r.member, r.incarnation, r.data) for r in rows] == [
            (m.member, m.incarnation, {"addr": "10.0.0.7"})
        ]
        assert other.member_holds(GRP, m.member, m.incarnation)
        assert not m.lost
        m.check()
        first = m.incarnation
    assert m.lost
    assert other.group_members(GRP) == []
    async with agroup(db.url, GRP, member=m.member, ttl=30) as again:
        # A rejoined name is told apart: a new incarnation.
        assert again.incarnation is not None and again.incarnation > first
        assert not other.member_holds(GRP, m.member, first)


async def test_a_member_name_live_elsewhere_is_refused(db: Db) -> None:
    other = db.backend()
    assert other.group_join(GRP, "w1", HOUR) is not None
    with pytest.raises(MemberLive) as refused:
        await enter_once(agroup(db.url, GRP, member="w1", ttl=30))
    assert refused.value.name == GRP
    assert "'w1'" in str(refused.value)
    assert [r.member for r in other.group_members(GRP)] == ["w1"]


async def test_bad_arguments_raise_before_any_io(db: Db) -> None:
    with pytest.raises(InvalidArgument) as bad:
        agroup(db.url, "g" * 191)
    assert bad.value.parameter == "grp"
    for count in (0, 1025, "64"):
        with pytest.raises(InvalidArgument) as bad:
            apartitions(db.url, GRP, count)  # type: ignore[arg-type]
        assert bad.value.parameter == "partitions"
    with pytest.raises(InvalidArgument):
        apartitions(db.url, GRP, 4, ttl=0)
    with pytest.raises(InvalidArgument):
        apartitions(db.url, GRP, 4, on_revoked="no")  # type: ignore[arg-type]


async def test_the_watch_sees_joins_leaves_and_expiries(db: Db) -> None:
    other = db.backend()
    async with agroup(db.url, GRP, member="a", ttl=30) as m:
        watch = m.watch()
        assert [r.member for r in await watch.__anext__()] == ["a"]
        assert other.group_join(GRP, "b", HOUR) is not None
        assert [r.member for r in await watch.__anext__()] == ["a", "b"]
        assert other.group_leave(GRP, "b")
        assert [r.member for r in await watch.__anext__()] == ["a"]
        # An expiry sends no notification: the watch reads again at the expiry it saw.
        assert other.group_join(GRP, "c", timedelta(seconds=1)) is not None
        assert [r.member for r in await watch.__anext__()] == ["a", "c"]
        started = monotonic()
        assert [r.member for r in await watch.__anext__()] == ["a"]
        assert monotonic() - started < BOUND
        await watch.aclose()


async def test_a_member_made_to_leave_is_lost_and_the_block_says_so(db: Db) -> None:
    other = db.backend()
    with pytest.raises(LeaseLost) as lost:
        async with agroup(db.url, GRP, ttl=1.5) as m:
            assert other.group_leave(GRP, m.member)
            assert await asleep_until(lambda: m.lost, DETECT)
            with pytest.raises(LeaseLost):
                m.check()
    assert lost.value.name == GRP


async def test_a_lone_member_owns_every_partition_each_with_a_fence(db: Db) -> None:
    other = db.backend()
    assigned: list[list[int]] = []
    async with apartitions(db.url, GRP, 8, ttl=30, on_assigned=assigned.append) as p:
        assert p.owned == list(range(8))
        assert assigned == [list(range(8))]
        for part in p.owned:
            assert other.holds(f"{GRP}#{part}", p.holder, p.fence(part))
        assert p.held(3).name == f"{GRP}#3"
    assert not any(r.held for part in range(8) for r in other.status(f"{GRP}#{part}"))
    with pytest.raises(LeaseLost):
        p.fence(0)


async def test_partitions_are_shared_and_revoked_before_release(db: Db) -> None:
    other = db.backend()
    seen_held: list[bool] = []

    def revoked(parts: list[int]) -> None:
        # Called before the release: the leases are still this member's.
        seen_held.extend(other.holds(f"{GRP}#{x}", a.holder, a.fence(x)) for x in parts)

    async with apartitions(db.url, GRP, 16, ttl=30, member="a", on_revoked=revoked) as a:
        async with apartitions(db.url, GRP, 16, ttl=30, member="b") as b:

            def shared() -> bool:
                return sorted(a.owned + b.owned) == list(range(16)) and len(b.owned) == 8

            assert await asleep_until(shared, BOUND), (a.owned, b.owned)
            assert set(a.owned).isdisjoint(b.owned)
            assignment = other.group_assignment(GRP, 16)
            assert {x for x, who in assignment.items() if who == "b"} == set(b.owned)
        assert await asleep_until(lambda: a.owned == list(range(16)), BOUND), a.owned
    assert seen_held and all(seen_held)
    assert len(seen_held) == 8 + 16  # to b, then at the end


async def test_a_dead_members_partitions_are_taken_over(db: Db) -> None:
    """A member that crashed (its member row and its partitions' leases are left to
    expire) is counted out at its expiry, and its partitions are taken over."""
    other = db.backend()
    ttl = timedelta(seconds=2)
    assert other.group_join(GRP, "dead", ttl) is not None
    taken = {x for x, who in other.group_assignment(GRP, 8).items() if who == "dead"}
    for part in taken:
        assert other.claim(f"{GRP}#{part}", ttl, "dead") is not None
    async with apartitions(db.url, GRP, 8, ttl=30, member="alive") as p:
        assert await asleep_until(lambda: p.owned == list(range(8)), BOUND), p.owned
        for part in taken:
            fence = p.fence(part)
            assert other.holds(f"{GRP}#{part}", "alive", fence)


async def test_partitions_never_claim_inside_the_callers_transaction(aconn: Any, dsn: str) -> None:
    """The rebalancer works in the background: on pylease's own connection, never on the
    caller's, which may be inside a transaction of the caller's meanwhile."""
    await aconn.execute("BEGIN")
    await aconn.execute("SELECT 1")
    async with apartitions(aconn, GRP, 8, ttl=30, member="a") as a:
        assert a.owned == list(range(8))
        async with apartitions(dsn, GRP, 8, ttl=30, member="b") as b:
            assert await asleep_until(lambda: len(b.owned) == 4, BOUND), b.owned
            await aconn.execute("ROLLBACK")
            assert await asleep_until(lambda: len(a.owned) == 4, BOUND), a.owned
            rows = {
                r[0]: r[1]
                for r in await (
                    await aconn.execute(
                        "SELECT name, holder FROM lease_status() WHERE state = 'held'"
                    )
                ).fetchall()
            }
            assert rows == {f"{GRP}#{x}": "a" for x in a.owned} | {
                f"{GRP}#{x}": "b" for x in b.owned
            }


async def test_a_member_and_its_partitions_are_renewed_by_one_statement_per_tick(
    aconn: Any, dsn: str
) -> None:
    """The keeper renews the member in the statement that renews its partitions' leases
    (pylease_renew_held, kind 'member'): never by a group_renew of its own."""
    await atrack_functions(aconn)
    ttl = 1.5
    async with apartitions(dsn, GRP, 8, ttl=ttl, member="a") as p:
        await asleep(3 * ttl)
        assert not p.member.lost
        assert p.owned == list(range(8))
        cur = await aconn.execute("SELECT member FROM group_members(%s)", (GRP,))
        assert await cur.fetchall() == [("a",)]
        assert await afunction_calls(aconn, "pylease_renew_held") >= 2
        assert await afunction_calls(aconn, "group_renew") == 0


async def test_a_member_counted_out_gives_its_partitions_up_and_joins_again(db: Db) -> None:
    """Made to leave behind its back (as an expiry would, for the others), a member is
    lost: its partitions are revoked and released, and it joins again with a new
    incarnation and owns what the assignment gives it then."""
    other = db.backend()
    revoked: list[list[int]] = []
    async with apartitions(db.url, GRP, 4, ttl=1.5, member="a", on_revoked=revoked.append) as p:
        first = p.member.incarnation
        assert first is not None
        assert other.group_leave(GRP, "a")

        def back() -> bool:
            again = p.member.incarnation
            return again is not None and again > first and p.owned == [0, 1, 2, 3]

        assert await asleep_until(back, BOUND), (p.member.incarnation, p.owned)
        assert revoked == [[0, 1, 2, 3]]
        assert [r.member for r in other.group_members(GRP)] == ["a"]


async def test_on_a_schema_before_0015_members_are_renewed_beside_the_statement(
    aconn: Any, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before migration 0015 the keeper's statement knows no members: the keeper renews
    them by group_renew beside it (and says so once), and the leases still renew."""
    # Back to 0014: 0015's rollback and those of every later migration, latest first.
    later = sorted((ROOT / "migrations" / "postgres").glob("pylease-*.rollback.sql"))
    for undo in reversed([u for u in later if u.name >= "pylease-0015"]):
        await aconn.execute(undo.read_text(encoding="utf-8"))
    ttl = 1.5
    async with agroup(dsn, GRP, member="a", ttl=ttl) as m, alease(dsn, "beside", ttl=ttl) as held:
        await asleep(3 * ttl)
        assert not m.lost
        assert not held.lost
    assert "renews members of groups apart from leases" in caplog.text


async def test_a_collected_group_block_leaves_the_group(db: Db, caplog: Any) -> None:
    """A group entered without ``async with`` and then dropped can no longer be left by
    anyone: the keeper stops renewing the member and leaves for it, long before its ttl."""
    other = db.backend()
    cm = agroup(db.url, GRP, member="dropped", ttl=HOUR)
    await cm.acquire()
    assert [r.member for r in other.group_members(GRP)] == ["dropped"]
    del cm
    gc.collect()
    limit = monotonic() + BOUND
    while other.group_members(GRP):
        assert monotonic() < limit, f"the member was not left within {BOUND}s"
        await asleep(0.05)
    assert "abandoned" in caplog.text
