# The source of pylease/_waiting.py: tools/async_to_sync.py writes it from this file.
"""The wait engine: how anything that waits for a grant waits.

A wait takes an :class:`Attempt` (a claim of one lease, of permits of a semaphore, of
several names at once) and tries it until it is granted or the wait's deadline
passes. A busy first attempt queues the waiter on the process's listener for the
database (:mod:`pylease._hub_async`), which LISTENs before the waiter tries again (a
release between the two is not missed). The first waiter of
a name in the process (the *head*) tries again on every notification naming it, on
the poll interval and at the holder's expiry; the others wait their turn.

Across processes, a release still wakes one claim per waiting process unless the
schema has the queue of waiting processes (migration 0005): then the head of each
process queues its process in ``pylease_waiters`` (:func:`join_queue`), and only the
process at the head of that queue claims on a release; leaving it wakes the next
process with ``NOTIFY pylease_waiters``. The others claim only on their poll
interval, the safety net for a queued process that vanished (its row expires, since
it is refreshed only while its process waits).

A waiter's attempts after its first are one statement each: granted, the process
leaves the queue of waiting processes in the claim's own transaction (a round trip
less between the release and the block); busy, the same statement reads the status row
that stood in the way (the holder's expiry, which paces the waiter). A busy claim
still writes nothing, and its commit never waits for a WAL flush. A head called by a
notification (which most likely gets the lease), or that claimed in vain less than
STATUS_FRESH ago, leaves the status out (lease_status, an SQL function
planned at every call, costs several busy claims of server time, and a busy name's
head claims again at every release); it reads it again once that is over, or once the
expiry it knows is past.

Once the database has answered, an unreachable or read-only server (a failover) is
retried with backoff until the wait's deadline, not raised at once. Behind a pooler
in transaction mode, where LISTEN succeeds but nothing is ever delivered, the heads'
expiry-aware polling is what finds a free lease. SQLite has no NOTIFY: its waiters
poll, with short sleeps that grow.

Permits and several names wait here too, as attempts. A permit's release NOTIFYs the
semaphore's name once, however many slots it freed, and a grant of one slot may leave
others free: a permit waiter that is granted passes its turn on (``passes_on``), so
the next waiter of its process, and the next process in the queue of waiting
processes, claims at once; the chain stops at the first busy claim, so each freed slot
wakes one waiter. A waiter for several names holds none of them while it waits: it
waits on the name that stood in the way (``follows``), the first busy one in name
order, and moves to the next one in the way when that is released.

Readers (contract 5.2) wait here too. A reader's grant passes the turn on, like a
permit's, so the readers of a process all come in when a writer leaves; readers take
no place in the queue of waiting processes, which is the writers' line and holds new
readers off while a writer waits (writer preference). SQLite keeps a line of its own:
there a waiting writer's claims put it in line while readers keep it out. The
attempts themselves are in :mod:`pylease._attempts_async`.
"""

from __future__ import annotations

import enum
import inspect
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from pylease import _hub_async as hub
from pylease._acompat import asleep, monotonic
from pylease._attempts_async import Attempt, LeaseClaim, fence_of, lease_attempt
from pylease._backend_async import AsyncBackend
from pylease._held import Options, clear_at, current_data, current_holder
from pylease._hub_async import WAITER_TTL, AsyncWaiter
from pylease._links_async import AsyncLink
from pylease._log import claimed as log_claimed
from pylease.errors import DatabaseUnavailable, LeaseBusy, PyleaseError, SchemaMissing

logger = logging.getLogger("pylease")

# Seconds between attempts while waiting, when no notification arrives first.
POLL_LISTENING = 5.0
POLL_NOT_LISTENING = 0.5
# SQLite has no NOTIFY: short sleeps that grow, so a handover is quick but cheap.
SQLITE_FIRST_POLL = 0.005
SQLITE_MAX_POLL = 0.05
JITTER = 0.2
# A waiter that meets an unreachable or read-only server (a failover) tries again
# after this pause (jittered), doubling up to MAX_OUTAGE, until its wait's deadline.
FIRST_OUTAGE = 0.05
MAX_OUTAGE = 1.0
# The longest sleep of a waiter that is not first in line of its process.
NAP = 60.0
# A head's busy claim reads the status with it at most this often (see the docstring).
STATUS_FRESH = 1.0
# A process behind another in the queue of waiting processes claims a release it heard
# this long after it (jittered), in case the process ahead died: that one claims at once.
BEHIND_GRACE = 0.2
# A wait that can be stopped looks at its stop this often.
STOP_SLICE = 0.2


class Stop(Protocol):
    """What ends a wait early besides a grant and its deadline (a leader's campaign's stop)."""

    def is_set(self) -> bool: ...


class WaitStopped(Exception):
    """The wait's stop was set before it was granted."""


#: What a granted attempt gives: a fence (a lease), slot -> fence (permits), name ->
#: fence (several names).
G = TypeVar("G")


def next_pause(
    expires_at: datetime | None, poll: float, deadline_in: float, backoff: float
) -> float:
    """How long to sleep before the next attempt: jittered, never past the expiry.

    An expiry sends no notification, so the waiter wakes for it. ``expires_at`` is
    the database's clock and ``datetime.now`` ours: skew only moves this wake-up.
    """
    pause = poll * random.uniform(1 - JITTER, 1 + JITTER)
    if expires_at is not None:
        until = (expires_at - datetime.now(UTC)).total_seconds()
        # Past the expiry by our clock but still busy: skew, or a renewal raced us.
        until = until + random.uniform(0.005, 0.03) if until > 0 else backoff
        pause = min(pause, until)
    return max(min(pause, deadline_in), 0.0)


def status_due(read_at: float, expires_at: datetime | None) -> bool:
    """Whether a head's claim should read the status, last read at ``read_at``
    (monotonic) and then showing the name in the way until ``expires_at`` (a holder's
    expiry, a rest's end; None: never read)."""
    if expires_at is None or monotonic() - read_at >= STATUS_FRESH:
        return True
    return expires_at <= datetime.now(UTC)


async def join_queue(link_: AsyncLink, waiter: AsyncWaiter) -> None:
    """Queue the head's process in the queue of waiting processes, or refresh its row."""
    name, token = waiter.name, waiter.hub.token
    if not waiter.hub.db_queue:
        return
    ttl = timedelta(seconds=WAITER_TTL)
    try:
        first = await link_.run(lambda b: b.wait(name, token, ttl), name=name, retry=True)
    except SchemaMissing:
        # Before migration 0005: every waiting process claims on a release.
        logger.info("no queue of waiting processes in this schema (migration 0005)")
        waiter.hub.db_queue = False
        return
    hub.joined(waiter, first, monotonic() + WAITER_TTL / 3)


async def leave_queue(link_: AsyncLink, waiter: AsyncWaiter, *, granted: bool) -> None:
    """Take the process out of the queue of waiting processes, waking the next one."""
    if waiter.db_head is None or waiter.left:
        return
    name, token = waiter.name, waiter.hub.token
    waiter.db_head = None
    try:
        await link_.run(lambda b: b.unwait(name, token, granted), name=name)
    except PyleaseError as exc:
        # Its row expires by itself: the next process only waits a little longer.
        logger.info("could not leave the queue of waiters of %r: %s", name, exc)


class _Turn(enum.Enum):
    """What one attempt of the loop came to, when it was not a grant."""

    #: Busy (or not this process's turn): on to the deadline and the pause.
    BUSY = "busy"
    #: Back to the top of the loop at once (an outage's pause, a new place in line).
    AGAIN = "again"


class AsyncWait(Generic[G]):
    """One wait for a grant, in steps: the loop of :func:`acquire`."""

    def __init__(
        self,
        link_: AsyncLink,
        attempt: Attempt[G],
        opts: Options,
        *,
        want_holder: bool,
        on_busy: Callable[[Any], object] | None,
        stop: Stop | None = None,
    ) -> None:
        self.link, self.attempt, self.opts = link_, attempt, opts
        self.want_holder, self.on_busy, self.stop = want_holder, on_busy, stop
        self.start = self.sent_at = monotonic()
        self.deadline = self.start + opts.wait
        self.waiter: AsyncWaiter | None = None
        self.retry = True
        self.granted = False
        self.backoff = SQLITE_FIRST_POLL if link_.sqlite else 0.01
        self.outage = FIRST_OUTAGE
        self.current: str | None = None
        self.current_data: object = None
        self.expires_at: datetime | None = None
        # When the head last read the status; whether its last busy claim left it out.
        self.status_at = float("-inf")
        self.skipped = False

    async def run(self) -> tuple[G, float]:
        """(grant, monotonic time its claim was sent); raises LeaseBusy at the deadline."""
        name = self.attempt.name
        conninfo = None if self.link.sqlite or self.opts.wait <= 0 else self.link.listen_conninfo
        seen = None if conninfo is None else hub.mark(conninfo)
        fence = await self.link.run(self.attempt.claim, name=name, retry=True)
        if fence is not None:
            return self._granted(fence)
        if self.opts.wait <= 0:
            await self.busy_at_once()
        free = False
        if self.attempt.follows:
            # Wait on the name in the way from the start (the mark was taken before the
            # claim, so a release meanwhile is not missed).
            rows = await self.link.run(self.attempt.status, name=name)
            self._saw(rows)
            free = not rows
        if conninfo is not None:
            self.waiter, self.retry = await hub.enter(conninfo, self.attempt.name, seen)
            self.retry = self.retry or free
        try:
            while True:
                if self.stop is not None and self.stop.is_set():
                    raise WaitStopped(name)
                turn = await self._turn()
                if not isinstance(turn, _Turn):
                    return self._granted(turn)
                if self.attempt.follows:
                    await self._follow()
                if turn is _Turn.BUSY and not self._past_deadline():
                    await self._pause()
        finally:
            if self.waiter is not None:
                # A grant that may leave more to grant passes the turn on, as a wait
                # that gives up does: the next waiter claims at once.
                done = self.granted and not self.attempt.passes_on
                await leave_queue(self.link, self.waiter, granted=done)
                hub.leave(self.waiter, granted=done)

    def _granted(self, grant: G) -> tuple[G, float]:
        self.granted = True
        waited = self.sent_at - self.start
        attempt = self.attempt
        fence = fence_of(grant)
        log_claimed(attempt.name, attempt.holder, fence, attempt.ttl.total_seconds(), waited)
        return grant, self.sent_at

    async def _follow(self) -> None:
        """Wait on the name now in the way (several names), claiming once more there: a
        release of it may have come before this waiter was in its queue."""
        waiter = self.waiter
        if waiter is None or waiter.name == self.attempt.name:
            return
        self.waiter = None
        await leave_queue(self.link, waiter, granted=False)
        hub.leave(waiter, granted=False)
        self.waiter, _ = await hub.enter(waiter.hub.conninfo, self.attempt.name, None)
        self.retry = True

    async def busy_at_once(self) -> NoReturn:
        """A wait of 0 that met a busy lease: LeaseBusy, naming the holder if asked."""
        holding, data = None, None
        if self.want_holder or self.on_busy is not None:
            rows = await self.link.run(self.attempt.status, name=self.attempt.name)
            holding, data = current_holder(rows)[0], current_data(rows)
            await self._report(rows)
        raise LeaseBusy(
            self.attempt.name, holder=holding, waited=0.0, claimer=self.attempt.holder, data=data
        )

    async def _turn(self) -> G | _Turn:
        """Queue the process and attempt, as due; an outage is ridden out here."""
        waiter = self.waiter
        head = waiter is None or waiter.head
        # The head speaks for its process in the queue of waiting processes.
        join = waiter is not None and head and waiter.join_due and self.attempt.queues
        if not (join or self.retry):
            return _Turn.BUSY
        try:
            if join:
                assert waiter is not None
                joined = waiter.db_head is None
                await join_queue(self.link, waiter)
                if joined and waiter.behind:
                    # Another process is first in line: its claim, not ours.
                    self.retry = False
            if not self.retry:
                return _Turn.AGAIN
            fence = await self._attempt(head)
        except DatabaseUnavailable:
            # A failover, a restart: the wait rides it out until its deadline.
            # (A SQLite file locked past its busy timeout is no failover.)
            if self.link.sqlite or monotonic() + self.outage >= self.deadline:
                raise
            await asleep(self.outage * random.uniform(1 - JITTER, 1 + JITTER))
            self.outage = min(self.outage * 2, MAX_OUTAGE)
            return _Turn.AGAIN
        self.outage = FIRST_OUTAGE
        return _Turn.BUSY if fence is None else fence

    async def _attempt(self, head: bool) -> G | None:
        """One attempt; busy, it reads what stands in the way when that is due."""
        waiter, name = self.waiter, self.attempt.name
        self.sent_at = monotonic()
        # A head called to claim (a release heard) most likely gets the lease: its claim
        # leaves the status out, whose planning alone would lengthen the handover.
        due = not (waiter is not None and waiter.called) and status_due(
            self.status_at, self.expires_at
        )
        look = (
            self.attempt.follows
            or self.on_busy is not None
            or (self.want_holder and self.sent_at >= self.deadline)
            or (head and (waiter is None or due))
        )
        self.skipped = head and not look
        rows: list[Any] | None = None
        if waiter is None and self.link.sqlite:
            fence, rows = await self._claim_in_line()
        elif waiter is None:
            fence = await self.link.run(self.attempt.claim, name=name, retry=True)
        else:
            waiter.release_heard = None
            fence, rows = await self._claim_waiting(waiter, look)
        if fence is not None:
            return fence
        if not look and self.want_holder and monotonic() >= self.deadline:
            look = True  # the claim ended past the deadline: name the holder now
        if look:
            if rows is None:
                rows = await self.link.run(self.attempt.status, name=name)
            self._saw(rows)
            self.current_data = current_data(rows)
            await self._report(rows)
        return None

    def _saw(self, rows: list[Any]) -> None:
        """Take in the status read after a busy claim."""
        self.current, self.expires_at = current_holder(rows)
        if self.expires_at is None:
            # Nobody holds it as the status saw it, later than the claim: the holder's
            # expiry came in between (or a release), or it rests after a release. A
            # pause until then, not a poll: the next claim is due at once, or at the rest's end.
            self.expires_at = clear_at(rows)
        self.status_at = self.sent_at

    async def _report(self, rows: list[Any]) -> None:
        """Show ``on_busy`` the row that stood in the way (None if it vanished)."""
        if self.on_busy is None:
            return
        row = rows[0] if rows else None
        if True:  # ASYNC
            result = self.on_busy(row)
            if inspect.isawaitable(result):
                await result
        else:
            self.on_busy(row)

    async def _claim_waiting(
        self, waiter: AsyncWaiter, look: bool
    ) -> tuple[G | None, list[Any] | None]:
        """A waiter's attempt in one statement (see the module's docstring)."""
        queued_as = None if waiter.db_head is None else waiter.hub.token

        async def attempt(b: AsyncBackend) -> tuple[G | None, list[Any] | None]:
            return await self.attempt.claim_waiting(b, status=look, queued_as=queued_as)

        grant, rows = await self.link.run(attempt, name=self.attempt.name, retry=True)
        if grant is not None and queued_as is not None and isinstance(self.attempt, LeaseClaim):
            waiter.left = True  # the claim's own statement left the queue (lease_unwait)
        return grant, rows

    async def _claim_in_line(self) -> tuple[G | None, list[Any] | None]:
        """A waiter's attempt on SQLite, which keeps a queue of its own: a writer kept
        out by readers is in line while it claims again (contract 5.2)."""
        attempt = self.attempt

        async def claim(b: AsyncBackend) -> tuple[G | None, list[Any] | None]:
            return await attempt.claim_waiting(b, status=False, queued_as=attempt.holder)

        return await self.link.run(claim, name=attempt.name, retry=True)

    def _past_deadline(self) -> bool:
        """True when one last attempt is due; raises LeaseBusy after it."""
        now = monotonic()
        if now < self.deadline:
            return False
        if not self.retry:
            self.retry = True  # one last claim before giving up
            return True
        raise LeaseBusy(
            self.attempt.name,
            holder=self.current,
            waited=now - self.start,
            claimer=self.attempt.holder,
            data=self.current_data,
        )

    async def _pause(self) -> None:
        """Sleep until the next attempt is due: a notification, the holder's expiry, a poll."""
        waiter, now = self.waiter, monotonic()
        if waiter is not None and not waiter.head:
            # Not first in line: the head claims for this process; wait our turn
            # (in naps: a wait may have no deadline).
            self.retry = await waiter.sleep(self._sliced(min(self.deadline - now, NAP)))
            if self.retry and not waiter.head and monotonic() < self.deadline:
                self.retry = False  # only a nap ended
            return
        pause = self._sliced(self._pause_length(now))
        if waiter is None:
            await asleep(pause)
            self.retry = True
            return
        waiter.patience = BEHIND_GRACE * (1 + JITTER)
        self.retry = await waiter.sleep(pause)
        if self.retry and not waiter.called and waiter.ahead_alive(BEHIND_GRACE * (1 - JITTER)):
            # The sleep ran out, but a release was heard within the grace since: the
            # process ahead claims it (see AsyncWaiter.heard).
            self.retry = False

    def _sliced(self, pause: float) -> float:
        """A pause short enough to notice the stop, when there is one."""
        return pause if self.stop is None else min(pause, STOP_SLICE)

    def _pause_length(self, now: float) -> float:
        waiter, poll_interval = self.waiter, self.opts.poll_interval
        if self.link.sqlite:
            poll = poll_interval or self.backoff
            self.backoff = min(self.backoff * 1.5, SQLITE_MAX_POLL)
        else:
            listening = waiter is not None and waiter.listening
            poll = poll_interval or (POLL_LISTENING if listening else POLL_NOT_LISTENING)
            self.backoff = min(self.backoff * 2, 1.0)
        # A process behind another in the queue of waiting processes polls, in case
        # that process vanished; the one first in line wakes at the holder's expiry.
        behind = waiter is not None and waiter.behind
        expires_at = None if behind else self.expires_at
        pause = next_pause(expires_at, poll, self.deadline - now, self.backoff)
        heard = None if waiter is None or not behind else waiter.release_heard
        if heard is not None:
            grace = BEHIND_GRACE * random.uniform(1 - JITTER, 1 + JITTER)
            pause = min(pause, max(heard + grace - now, 0.0))
        if waiter is not None and waiter.db_head is not None:
            pause = min(pause, max(waiter.refresh_at - now, 0.0))
        if self.skipped or self.status_at == float("-inf"):
            # The holder may have changed since the status was read (or it was never
            # read): read it STATUS_FRESH after the last read, so that a holder that
            # died is met at its expiry. Past that (a head called by releases it lost),
            # within STATUS_FRESH from now: a claim of its own at once would add a
            # round trip to every lost release, and releases still coming mean that
            # no holder died.
            until = self.status_at + STATUS_FRESH - now
            if until <= 0:
                until = STATUS_FRESH * random.uniform(1 - JITTER, 1 + JITTER)
            pause = min(pause, until)
        return pause


async def acquire(
    link_: AsyncLink,
    opts: Options,
    holder: str,
    *,
    want_holder: bool,
    on_busy: Callable[[Any], object] | None = None,
    stop: Stop | None = None,
) -> tuple[int, float]:
    """Claim the lease, waiting as allowed: (fence, monotonic time the claim was sent).

    :raises LeaseBusy: the wait ran out.
    :raises WaitStopped: ``stop`` was set first.
    """
    attempt = lease_attempt(opts, holder)
    grant, sent_at = await acquire_with(
        link_, attempt, opts, want_holder=want_holder, on_busy=on_busy, stop=stop
    )
    return fence_of(grant), sent_at


async def acquire_with(
    link_: AsyncLink,
    attempt: Attempt[G],
    opts: Options,
    *,
    want_holder: bool = True,
    on_busy: Callable[[Any], object] | None = None,
    stop: Stop | None = None,
) -> tuple[G, float]:
    """Run ``attempt`` (a lease's, permits', several names'), waiting as ``opts``
    allow: (grant, monotonic time its claim was sent).

    ``on_busy(row)`` is called (and awaited, if it returns an awaitable) after every
    busy attempt that read the status row that stood in the way (None if it vanished),
    the last one before LeaseBusy included; with ``on_busy`` every attempt reads it.

    :raises LeaseBusy: the wait ran out.
    :raises WaitStopped: ``stop`` was set first.
    """
    if opts.wait > 0:
        wait = AsyncWait(link_, attempt, opts, want_holder=want_holder, on_busy=on_busy, stop=stop)
        return await wait.run()
    # No wait: one claim, as AsyncWait.run starts, without its state unless it is busy.
    sent_at = monotonic()
    grant = await link_.run(attempt.claim, name=attempt.name, retry=True)
    if grant is None:
        wait = AsyncWait(link_, attempt, opts, want_holder=want_holder, on_busy=on_busy, stop=stop)
        wait.start = wait.sent_at = sent_at
        await wait.busy_at_once()
    log_claimed(attempt.name, attempt.holder, fence_of(grant), attempt.ttl.total_seconds(), 0.0)
    return grant, sent_at
