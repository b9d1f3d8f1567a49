# The source of pylease/membership.py: tools/async_to_sync.py writes it from this file.
"""Membership of a group (contract 5.5): :func:`agroup`, a block during which this process
is a live member, and what watching a group's members takes.

A member is not a lease: ``group_join`` gives it an incarnation (a fence of the group),
the keeper renews it in the one statement that renews everything the process holds (a
ticket of kind ``member``, its incarnation as its fence: ``pylease_renew_held`` from
pylease-0015 on, ``group_renew`` beside it before), and leaving the block sends
``group_leave``. A member whose renewals stop is gone for
the others once its ttl runs out; here it reads as lost from the same moment a lease
would (the keeper's deadline, then the clock-rate margin).

A watch of the members sleeps on the process's one listener (:mod:`pylease._hub_async`):
joins and leaves NOTIFY the group's name; an expiry sends nothing, so a watch also reads
again at the earliest expiry it saw, and on a poll. SQLite has no NOTIFY: it polls.
The twins differ only in how a bell is waited for (an event of the loop, or of threads).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType

from pylease import _checks
from pylease import _hub_async as hub
from pylease._acompat import AEvent, monotonic
from pylease._budget import begin, exit_deadline
from pylease._held import callable_option, default_holder
from pylease._hub_async import AsyncWatcher
from pylease._keeper_async import keeper
from pylease._links_async import AsyncLink, link
from pylease._links_async import check as check_target
from pylease._operations import MemberRow
from pylease._ticket import AsyncTicket, unwatch_held, watch_held
from pylease._types import AsyncTarget, Duration
from pylease.errors import LeaseLost, MemberLive

logger = logging.getLogger("pylease")

# Seconds between reads of the members when nothing wakes a watch first (SQLite: always).
POLL = 1.0
SQLITE_POLL = 0.25
# Read again a moment after an expiry seen, so that the read finds it gone.
AFTER_EXPIRY = 0.02

#: What a member knows of its loss: called with the LeaseLost (name: the group).
MemberLostCallback = Callable[[LeaseLost], object]


class AsyncBell:
    """What wakes a watch: the process's listener, on a notification of the group (or a
    lost listener), or :meth:`ring` from this process; on SQLite only a ring."""

    def __init__(self) -> None:
        self.watcher: AsyncWatcher | None = None
        self._event = AEvent()

    async def listen(self, link_: AsyncLink, grp: str) -> None:
        conninfo = link_.listen_conninfo
        if not link_.sqlite and conninfo is not None and self.watcher is None:
            self.watcher = await hub.watch(conninfo, grp)

    @property
    def poll(self) -> float:
        return POLL if self.watcher is not None else SQLITE_POLL

    def ring(self) -> None:
        """Wake the watch now (thread-safe on the sync side; the loop's own on the async)."""
        if self.watcher is not None:
            hub.ring(self.watcher)
        else:
            self._event.set()

    async def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True when something woke it."""
        if self.watcher is not None:
            return await self.watcher.wait(timeout)
        if True:  # ASYNC
            try:
                await asyncio.wait_for(self._event.wait(), max(timeout, 0.0))
                woken = True
            except TimeoutError:
                woken = False
        else:
            woken = self._event.wait(max(timeout, 0.0))
        self._event.clear()
        return woken

    def close(self) -> None:
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.close()


def own_link(target: object, *, heartbeat_target: object = None) -> AsyncLink:
    """A link that never runs on the caller's connection, only on pylease's own: for work
    done in the background (a group's rebalancer), which may run while the caller's
    connection is inside a transaction of the caller's."""
    link_ = link(target, heartbeat_target=heartbeat_target)
    link_.conn = None
    link_.sqlite_conn = None
    return link_


def until_next_read(rows: Sequence[MemberRow], poll: float) -> float:
    """How long a watch may sleep: until the earliest expiry of ``rows`` (an expiry sends
    no notification), and never past ``poll``. The database's clock against ours: a skew
    only moves this wake-up."""
    pause = poll
    now = datetime.now(UTC)
    for row in rows:
        pause = min(pause, (row.expires_at - now).total_seconds() + AFTER_EXPIRY)
    return max(pause, AFTER_EXPIRY)


def same_members(a: Sequence[MemberRow] | None, b: Sequence[MemberRow]) -> bool:
    """True when both list the same incarnations (a renewal changes none)."""
    if a is None:
        return False
    return [(r.member, r.incarnation) for r in a] == [(r.member, r.incarnation) for r in b]


class AsyncGroup:
    """The context manager :func:`agroup` returns; single use. Inside the block it is the
    membership: ``m.incarnation``, ``m.members()``, ``m.watch()``.

    :ivar group: the group's name.
    :ivar member: this member's name.
    :ivar incarnation: its incarnation (a fence), once joined.
    """

    def __init__(
        self,
        target: object,
        grp: str,
        member: str | None,
        ttl: timedelta,
        data: object,
        *,
        on_lost: MemberLostCallback | None = None,
        heartbeat_target: object = None,
        background: bool = False,
    ) -> None:
        self._target = target
        # Used from a thread (task) of pylease's: never on the caller's connection.
        self._background = background
        self._heartbeat_target = heartbeat_target
        self.group = grp
        self.member = member or default_holder()
        self.ttl = ttl
        self._data = data
        self._on_lost = on_lost
        self.incarnation: int | None = None
        self._link: AsyncLink | None = None
        self._ticket: AsyncTicket | None = None
        self._left = False

    async def __aenter__(self) -> AsyncGroup:
        if self._link is not None or self._left:
            raise RuntimeError("pylease: a group block can be entered once")
        await self.join()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        error = await self.leave()
        if error is not None and exc is None:
            raise error

    async def acquire(self) -> AsyncGroup:
        """Enter the block without ``async with``: a membership held across callbacks."""
        return await self.__aenter__()

    async def release(self) -> None:
        """Leave it as the block does (:class:`LeaseLost` if the membership was lost)."""
        await self.__aexit__(None, None, None)

    async def join(self) -> int:
        """Join the group (again, after a loss: a new incarnation); the incarnation.

        :raises MemberLive: the member name is live (another process's, or not yet expired).
        """
        grp, member, ttl, data = self.group, self.member, self.ttl, self._data
        link_ = self._link
        if link_ is None:
            make = own_link if self._background else link
            link_ = self._link = make(self._target, heartbeat_target=self._heartbeat_target)
        sent_at = monotonic()
        try:
            incarnation = await link_.run(
                lambda b: b.group_join(grp, member, ttl, data), name=grp, retry=True
            )
        except BaseException:
            if self._ticket is None:
                self._link = None
                await link_.close()
            raise
        if incarnation is None:
            if self._ticket is None:
                self._link = None
                await link_.close()
            raise MemberLive(grp, member)
        ticket = AsyncTicket(grp, member, ttl, sent_at=sent_at, on_lost=self._on_lost)
        ticket.kind = "member"
        ticket.fence = incarnation
        old, self._ticket = self._ticket, ticket
        if old is not None:
            unwatch_held(old)
            await keeper().remove(old, link_.renewals)
        self.incarnation = incarnation
        # Once this object is unreachable nobody can leave the group: the keeper stops
        # renewing the member and leaves at once (as for a collected lease's Held).
        ticket.link = link_
        ticket.keeper = keeper()
        watch_held(self, ticket)
        # Renewed with the leases of the process (its partitions' among them) in the
        # keeper's one statement per tick.
        await keeper().add(ticket, link_.renewals)
        return incarnation

    async def leave(self) -> LeaseLost | None:
        """Leave the group; the LeaseLost to raise if membership had been lost meanwhile."""
        link_, ticket = self._link, self._ticket
        if link_ is None or ticket is None or self._left:
            return None
        self._left = True
        ticket.ended = True
        unwatch_held(ticket)
        lost = ticket.error()
        grp, member, incarnation = self.group, self.member, ticket.fence
        budget = begin()
        try:
            await keeper().remove(ticket, link_.renewals)
            if lost is None:
                try:
                    await link_.run_release(
                        lambda b: b.group_leave(grp, member, incarnation), name=grp
                    )
                except Exception as exc:
                    # The member stays live until its expiry: nothing worse.
                    logger.warning("member %r could not leave %r: %s", member, grp, exc)
        finally:
            self._link = None
            try:
                await link_.close()
            finally:
                exit_deadline.reset(budget)
        return lost

    @property
    def lost(self) -> bool:
        """True once this membership is known gone (a renewal found it expired or replaced,
        or its ttl ran out without one), or the block was left."""
        ticket = self._ticket
        return ticket is None or self._left or ticket.error() is not None

    def check(self) -> None:
        """Raise :class:`LeaseLost` if this member is no longer live (a local check)."""
        ticket = self._ticket
        error = None if ticket is None else ticket.error()
        if error is None and (ticket is None or self._left):
            error = LeaseLost(self.group, "the member is not in the group (not joined, or left)")
        if error is not None:
            raise error

    def _running_link(self) -> AsyncLink:
        if self._link is None:
            raise RuntimeError("pylease: the group block is not running")
        return self._link

    async def members(self) -> list[MemberRow]:
        """The live members, ordered by member (one read)."""
        grp = self.group
        return await self._running_link().run(lambda b: b.group_members(grp), name=grp, retry=True)

    async def assignment(self, partitions: int) -> dict[int, str]:
        """Partition -> member, as ``group_assignment`` gives it now (one read)."""
        grp, count = self.group, _checks.partitions(partitions)
        return await self._running_link().run(
            lambda b: b.group_assignment(grp, count), name=grp, retry=True
        )

    async def watch(self) -> AsyncIterator[list[MemberRow]]:
        """Yield the live members now, then again on every change (a join, a leave, an
        expiry); changes between two reads are coalesced."""
        bell = AsyncBell()
        try:
            await bell.listen(self._running_link(), self.group)
            last: list[MemberRow] | None = None
            while True:
                rows = await self.members()
                if not same_members(last, rows):
                    last = rows
                    yield rows
                await bell.wait(until_next_read(rows, bell.poll))
        finally:
            bell.close()

    def __repr__(self) -> str:
        return f"<Group {self.group!r} member={self.member!r} incarnation={self.incarnation}>"


def group_block(
    target: object,
    grp: object,
    member: object,
    ttl: object,
    data: object,
    on_lost: object,
    heartbeat_target: object,
) -> AsyncGroup:
    """:func:`agroup`'s block, every argument checked before any I/O."""
    grp_ = _checks.group(grp)
    member_ = None if member is None else _checks.key("member", member)
    ttl_ = _checks.ttl(ttl)
    _checks.data(data)
    callable_option("on_lost", on_lost)
    check_target(target, heartbeat_target)
    return AsyncGroup(
        target,
        grp_,
        member_,
        ttl_,
        data,
        on_lost=on_lost,  # type: ignore[arg-type]
        heartbeat_target=heartbeat_target,
    )


def agroup(
    target: AsyncTarget,
    grp: str,
    member: str | None = None,
    ttl: Duration = 15,
    data: object = None,
    *,
    on_lost: MemberLostCallback | None = None,
    heartbeat_target: AsyncTarget | None = None,
) -> AsyncGroup:
    """Be a live member of the group ``grp`` while the ``async with`` block runs.

    ::

        async with agroup(aconn, "indexers", ttl=15) as m:
            m.incarnation            # this member's fence: grows with every join
            await m.members()        # the live members, MemberRow each
            async for members in m.watch(): ...

    :param member: this member's name (default: unique per join, host, pid and 128 bits);
        a name live elsewhere is refused.
    :param ttl: how long the member outlives its last renewal (renewed every ttl/3).
    :param data: a JSON value the other members see (at most 8 kB as text).
    :param on_lost: called with a :class:`LeaseLost` once the keeper learns that the
        membership is gone (the others may count this member out from then on).
    :raises MemberLive: the member name is live in the group.
    :raises LeaseLost: the block returned, but the membership was lost meanwhile.
    """
    return group_block(target, grp, member, ttl, data, on_lost, heartbeat_target)
