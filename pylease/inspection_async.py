"""Who holds what, for any name, read in one statement: :func:`astatus` and :func:`alocked`.

The reads users of other lock libraries reach for (``lock.locked()``), beside
:func:`~pylease.acurrent_leader`, which reads one election. They hold nothing and
wait for nothing: a link is made for the read and closed after it.
"""

from __future__ import annotations

from pylease import _checks
from pylease._links_async import check as check_target
from pylease._links_async import link
from pylease._rows import LeaseRow
from pylease._types import AsyncTarget


async def astatus(target: AsyncTarget, name: str | None = None) -> list[LeaseRow]:
    """The ``lease_status`` rows of ``name``, or of every name ever claimed (None).

    Each row says who holds the name, with which fence, until when, and its ``state``
    (``held``, ``resting``, ``released`` or ``expired``), on the database's clock.

    :raises SchemaMissing: pylease is not installed there (run ``pylease migrate``).
    :raises DatabaseUnavailable: the database could not be reached.
    """
    key = None if name is None else _checks.key("name", name)
    check_target(target)
    link_ = link(target)
    try:
        rows: list[LeaseRow] = await link_.run(lambda b: b.status(key), name=key, retry=True)
    finally:
        await link_.close()
    return rows


async def alocked(target: AsyncTarget, name: str) -> bool:
    """Whether ``name`` is held now, by anyone (this process included): one read.

    A snapshot: the answer may be stale as soon as it arrives; to act on a free
    name, claim it (``alease(..., wait=0)``) rather than ask first.
    """
    return any(row.held for row in await astatus(target, _checks.key("name", name)))
