# The source of pylease/partitioning.py: tools/async_to_sync.py writes it from this file.
"""Partitions of a group (contract 5.5): :func:`apartitions`, a block during which this
process is a member of the group and owns the partitions assigned to it.

Owning a partition is holding the lease ``"<grp>#<part>"``, an ordinary fenced lease
whose holder is the member's name: it is claimed through the one wait engine (a lease
block of :mod:`pylease.leasing_async`, its attempt a lease's claim), kept fresh by the
one keeper, and released holder- and fence-matched. ``group_assignment`` only says
which member *should* own a partition; the lease decides who does, so while members
disagree about who is live, two of them never both believe they own a partition.

One rebalancer (a task; in the sync twin a thread) per block reads the members and
the assignment whenever the group changes (the process's one listener wakes it on a
join or a leave; an expiry, which sends nothing, at the earliest expiry it read), and
whenever one of its partitions is granted or lost. It revokes what is no longer this
member's (``on_revoked`` first, then the release), and claims what is: at once when
free, else by a waiter of the wait engine per partition, stopped as soon as the
partition is no longer this member's. A membership lost (a stalled process, a network
partition) joins again, with a new incarnation. Callbacks run on the rebalancer, one at
a time. The twins differ in how the rebalancer and the waiters are run and joined.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from types import TracebackType
from typing import Any

from pylease import _checks
from pylease._acompat import AMutex, AWorker, aspawn
from pylease._held import Held, callable_option
from pylease._links_async import AsyncLink
from pylease._links_async import check as check_target
from pylease._standby_async import call
from pylease._ticket import AsyncTicket
from pylease._types import AsyncTarget, Duration
from pylease._waiting_async import WaitStopped
from pylease.errors import LeaseBusy, LeaseLost, MemberLive, PyleaseError
from pylease.leasing_async import AsyncLease, block_options
from pylease.membership_async import AsyncBell, AsyncGroup, own_link, until_next_read

logger = logging.getLogger("pylease")

# After a failed step (the database unreachable, a join refused), the next one comes
# this much later at first, doubling up to a poll.
FIRST_RETRY = 0.05
# How long leaving the block waits for the rebalancer and the waiters to stop.
STOP_WAIT = 5.0

#: ``on_assigned(parts)`` and ``on_revoked(parts)``: sorted lists of partitions.
PartsCallback = Callable[[list[int]], object]


class _PartLease(AsyncLease):
    """A partition's lease block, claimed and released by the rebalancer and the waiters,
    threads (tasks) that come and go, on pylease's own connection: so the rule against a
    nested block of a name held under another holder (meant for a body that would wait
    for itself) does not apply, nor is one kept or taken back for a caller's transaction."""

    _adoptable = False
    _exclusive = False

    def _make_link(self) -> AsyncLink:
        # Claimed and released in the background: never on the caller's connection.
        return own_link(self._target, heartbeat_target=self._heartbeat_target)

    async def _defer(self, link_: AsyncLink, ticket: AsyncTicket, exc: object) -> bool:
        # Released at once, whatever the caller's connection is doing: a revoked
        # partition held until the caller's transaction ends would hold up the group.
        # A fenced write still open there holds off the next owner's claim by its lock.
        return False


class _Stop:
    """Set when a waiter's partition is no longer this member's, or the block ends."""

    def __init__(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


class AsyncPartitions:
    """The context manager :func:`apartitions` returns; single use. Inside the block:
    ``p.owned``, ``p.fence(part)``, ``p.held(part)``, and the membership ``p.member``.
    """

    def __init__(
        self,
        target: object,
        membership: AsyncGroup,
        count: int,
        *,
        on_assigned: PartsCallback | None,
        on_revoked: PartsCallback | None,
        heartbeat_target: object,
    ) -> None:
        self._target = target
        self._heartbeat_target = heartbeat_target
        self.member = membership
        self.group = membership.group
        self.partitions = count
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._held: dict[int, tuple[AsyncLease, Held]] = {}
        # Partitions waited for, and what stops each waiter; grants they made that the
        # rebalancer has not taken in yet. Guarded by the mutex (the waiters' threads).
        self._waiting: dict[int, tuple[_Stop, AWorker | None]] = {}
        self._granted: list[tuple[int, AsyncLease, Held, _Stop]] = []
        self._mutex = AMutex()
        self._bell = AsyncBell()
        self._closing = False
        self._worker: AWorker | None = None
        self._entered = False
        self._backoff = FIRST_RETRY

    # What the block shows --------------------------------------------------------

    @property
    def owned(self) -> list[int]:
        """The partitions whose leases this member holds now, sorted (lost ones are out
        at once, before the rebalancer has revoked them)."""
        return sorted(part for part, (_cm, held) in dict(self._held).items() if not held.lost)

    def held(self, part: int) -> Held:
        """The :class:`Held` of an owned partition's lease (``lost``, ``check()``, ...).

        :raises LeaseLost: this member does not own ``part`` now.
        """
        found = dict(self._held).get(part)
        if found is None or found[1].lost:
            raise LeaseLost(self._name(part), "this member does not own the partition")
        return found[1]

    def fence(self, part: int) -> int:
        """The fence of an owned partition's lease: pass it to ``lease_holds(
        '<grp>#<part>', member, fence)`` in the writes fenced by the partition.

        :raises LeaseLost: this member does not own ``part`` now.
        """
        return self.held(part).fence

    @property
    def holder(self) -> str:
        """The holder of this member's partition leases: the member's name."""
        return self.member.member

    def _name(self, part: int) -> str:
        return f"{self.group}#{part}"

    # The block ----------------------------------------------------------------------

    async def acquire(self) -> AsyncPartitions:
        """Enter the block without ``async with``: partitions held across callbacks."""
        return await self.__aenter__()

    async def release(self) -> None:
        """Leave it as the block does: revoke every partition, release, leave the group."""
        await self.__aexit__(None, None, None)

    async def __aenter__(self) -> AsyncPartitions:
        if self._entered:
            raise RuntimeError("pylease: a partitions block can be entered once")
        self._entered = True
        self.member._on_lost = self._lost
        await self.member.join()
        try:
            await self._bell.listen(self.member._running_link(), self.group)
            await self._step()
        except BaseException:
            await self._close()
            raise
        self._worker = aspawn(self._run, name="pylease-partitions")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        self._closing = True
        self._bell.ring()
        worker, self._worker = self._worker, None
        try:
            if worker is not None:
                await _join(worker)
            with self._mutex:
                waiting = list(self._waiting.values())
                for stop, _w in waiting:
                    stop.flag = True
            for _stop, waiter in waiting:
                if waiter is not None:
                    await _join(waiter)
            await self._take_in()
            await self._revoke(sorted(self._held))
        finally:
            self._bell.close()
            await self.member.leave()

    # The rebalancer ----------------------------------------------------------------

    async def _lost(self, error: LeaseLost) -> None:
        """A partition's lease, or the membership, was lost: look now."""
        self._bell.ring()

    async def _run(self) -> None:
        pause = 0.0
        while not self._closing:
            await self._bell.wait(pause)
            if self._closing:
                return
            try:
                pause = await self._step()
                self._backoff = FIRST_RETRY
            except Exception as exc:
                pause = self._backoff
                self._backoff = min(self._backoff * 2, self._bell.poll)
                if not isinstance(exc, (PyleaseError, MemberLive)):
                    logger.exception("rebalancing group %r failed", self.group)
                else:
                    logger.info("rebalancing group %r failed: %s", self.group, exc)

    async def _step(self) -> float:
        """One look: take in grants and losses, join again if the membership was lost,
        revoke and claim by the assignment; how long until the next look is due."""
        await self._take_in()
        lost = sorted(part for part, (_cm, held) in self._held.items() if held.lost)
        if lost:
            await self._revoke(lost)
        member = self.member
        if member.lost and not self._closing:
            # The others count this member out: give every partition up before joining
            # again (a join refused now, its old incarnation not yet expired there, is
            # tried again at the next look).
            with self._mutex:
                for stop, _w in self._waiting.values():
                    stop.flag = True
            await self._revoke(sorted(self._held))
            await member.join()
        grp, count = self.group, self.partitions

        async def read(b: Any) -> tuple[Any, dict[int, str]]:
            return await b.group_members(grp), await b.group_assignment(grp, count)

        rows, assignment = await member._running_link().run(read, name=grp, retry=True)
        mine = {part for part, who in assignment.items() if who == member.member}
        if member.lost:
            mine = set()
        gone = sorted(set(self._held) - mine)
        if gone:
            await self._revoke(gone)
        with self._mutex:
            for part, (stop, _w) in self._waiting.items():
                if part not in mine:
                    stop.flag = True
            taken = set(self._held) | set(self._waiting) | {g[0] for g in self._granted}
            wanted = sorted(mine - taken)
        await self._claim(wanted)
        return until_next_read(rows, self._bell.poll)

    async def _take_in(self) -> None:
        """Hold the partitions the waiters were granted; give back at once, unnoticed,
        those no longer wanted (``on_assigned`` was never called for them)."""
        with self._mutex:
            granted, self._granted = self._granted, []
        fresh = []
        for part, cm, held, stop in granted:
            if stop.flag or self._closing:
                await _release(cm, self._name(part))
            else:
                self._held[part] = (cm, held)
                fresh.append(part)
        if fresh:
            await self._call(self._on_assigned, sorted(fresh), "on_assigned")

    async def _claim(self, parts: list[int]) -> None:
        """Claim each partition at once; a busy one gets a waiter of its own."""
        fresh = []
        for part in parts:
            if self._closing:
                break
            cm = self._lease(part, 0)
            try:
                held = await cm.acquire()
            except LeaseBusy:
                stop = _Stop()
                with self._mutex:
                    self._waiting[part] = (stop, None)
                waiter = aspawn(self._wait_for, part, stop, name="pylease-partition")
                with self._mutex:
                    if part in self._waiting:
                        self._waiting[part] = (stop, waiter)
                continue
            self._held[part] = (cm, held)
            fresh.append(part)
        if fresh:
            await self._call(self._on_assigned, fresh, "on_assigned")

    async def _wait_for(self, part: int, stop: _Stop) -> None:
        """A waiter: claim ``part`` through the wait engine until granted or stopped."""
        cm = self._lease(part, math.inf)
        cm.stop = stop
        held: Held | None = None
        try:
            held = await cm.acquire()
        except WaitStopped:
            pass
        except Exception as exc:
            logger.info("waiting for partition %r failed: %s", self._name(part), exc)
        finally:
            # In one step, so the rebalancer never sees the partition neither waited
            # for nor granted while its lease is live.
            with self._mutex:
                if self._waiting.get(part, (None,))[0] is stop:
                    del self._waiting[part]
                if held is not None:
                    self._granted.append((part, cm, held, stop))
            self._bell.ring()

    def _lease(self, part: int, wait: float) -> AsyncLease:
        opts = block_options(
            self._target,
            self._heartbeat_target,
            self._name(part),
            self.member.ttl,
            holder=self.member.member,
            wait=wait,
            heartbeat=True,
            on_lost=self._lost,
            min_hold=None,
            poll_interval=None,
        )
        return _PartLease(
            self._target, opts, on_lost=self._lost, heartbeat_target=self._heartbeat_target
        )

    async def _revoke(self, parts: list[int]) -> None:
        """``on_revoked(parts)``, then give their leases back."""
        if not parts:
            return
        await self._call(self._on_revoked, parts, "on_revoked")
        for part in parts:
            cm, _held = self._held.pop(part)
            await _release(cm, self._name(part))

    async def _call(self, callback: PartsCallback | None, parts: list[int], what: str) -> None:
        try:
            await call(callback, parts)
        except Exception:
            logger.exception("%s of group %r failed", what, self.group)

    def __repr__(self) -> str:
        return f"<Partitions {self.group!r} member={self.member.member!r} owned={self.owned}>"


async def _release(cm: AsyncLease, name: str) -> None:
    """Leave a partition's lease block; a lease lost meanwhile, or a release that failed
    (the lease then frees itself at its expiry), is no news here."""
    try:
        await cm.release()
    except LeaseLost:
        pass
    except Exception as exc:
        logger.warning("releasing partition %r failed: %s", name, exc)


if True:  # ASYNC

    async def _join(worker: asyncio.Task[None]) -> None:
        await asyncio.wait({worker}, timeout=STOP_WAIT)

else:

    def _join(worker: Any) -> None:
        worker.join(STOP_WAIT)


def apartitions(
    target: AsyncTarget,
    grp: str,
    partitions: int,
    ttl: Duration = 15,
    on_assigned: PartsCallback | None = None,
    on_revoked: PartsCallback | None = None,
    *,
    member: str | None = None,
    data: object = None,
    heartbeat_target: AsyncTarget | None = None,
) -> AsyncPartitions:
    """Be a member of ``grp`` and own the partitions of ``0 .. partitions - 1`` that the
    group's assignment gives this member, while the ``async with`` block runs.

    ::

        async with apartitions(aconn, "indexers", 64, ttl=15) as p:
            for part in p.owned:
                fence = p.fence(part)   # lease_holds('indexers#<part>', p.holder, fence)

    :param ttl: of the membership and of every partition's lease.
    :param on_assigned: called with the sorted partitions just granted to this member.
    :param on_revoked: called with the sorted partitions this member gives up (or lost),
        before their leases are released: stop working on them when it returns.
    :param member: this member's name (default: unique); it is the holder of the
        partitions' leases.
    :param data: a JSON value the other members see.
    :raises MemberLive: the member name is live in the group.
    """
    count = _checks.partitions(partitions)
    ttl_ = _checks.ttl(ttl)
    callable_option("on_assigned", on_assigned)
    callable_option("on_revoked", on_revoked)
    check_target(target, heartbeat_target)
    grp_ = _checks.group(grp)
    membership = AsyncGroup(
        target,
        grp_,
        None if member is None else _checks.key("member", member),
        ttl_,
        _valid_data(data),
        heartbeat_target=heartbeat_target,
        background=True,
    )
    return AsyncPartitions(
        target,
        membership,
        count,
        on_assigned=on_assigned,
        on_revoked=on_revoked,
        heartbeat_target=heartbeat_target,
    )


def _valid_data(data: object) -> object:
    _checks.data(data)
    return data
