"""A reader's share has an identity of its own (migration 0019; issue 25, contract 5.2
and 5.6), scripted on two PostgreSQL sessions.

Each session is a block of one explicit holder: the earlier one's statements (its
release, its renewal) are held back and run after the later block was granted its
share, as a statement of an abandoned connection runs late on the server. They name
the earlier share's id, so they touch nothing of the later one, and a writer stays
busy beside it (docs/model.md, "A reused explicit holder of a reader").
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest

from tests.sql.test_races import (
    HOUR,
    SHORT,
    Connect,
    background,
    blocking_conn,
    one,
    wait_blocked,
)
from tests.sql.test_readers_writers import wait_share_expired

__all__ = ["background"]  # a fixture, used by name

Conn = psycopg.Connection[Any]
Submit = Callable[..., Future[Any]]

CLAIM = "SELECT lease_claim('doc', %s, %s)"
NEW_SHARE = "SELECT epoch, share FROM pylease_claim_shared('doc', %s, %s, true)"
RELEASE = "SELECT pylease_release_share('doc', %s, %s, %s)"
RENEW = (
    "SELECT renewed FROM pylease_renew_held(ARRAY['shared'], ARRAY['doc'], ARRAY[%s],"
    " ARRAY['1 hour']::interval[], ARRAY[%s]::bigint[], ARRAY[%s]::integer[])"
)


def share_of(conn: Conn, holder: str) -> tuple[int, int, Any] | None:
    row = conn.execute(
        "SELECT epoch, share, expires_at FROM pylease_shared WHERE name = 'doc' AND holder = %s",
        (holder,),
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def grant(conn: Conn, ttl: Any, holder: str) -> tuple[int, int]:
    row = conn.execute(NEW_SHARE, (ttl, holder)).fetchone()
    assert row is not None and row[0] is not None, "the share was not granted"
    return int(row[0]), int(row[1])


def test_an_earlier_blocks_late_release_leaves_the_later_blocks_share(
    conn: Conn, connect: Connect
) -> None:
    earlier, later = connect(), connect()
    epoch, first = grant(earlier, SHORT, "r")
    # The earlier block's share expires (its release is on its way, not yet run); the
    # same holder's later block, on another session, is granted a new share.
    wait_share_expired(conn, "r")
    again, second = grant(later, HOUR, "r")
    assert again == epoch and second != first
    # The earlier block's release runs now: it names the earlier share, and frees nothing.
    assert one(earlier, RELEASE, ("r", epoch, first)) is False
    assert share_of(conn, "r") is not None
    assert one(conn, CLAIM, (HOUR, "w")) is None  # no writer beside the believing reader
    # The later block's own release gives its share back, and the writer comes in.
    assert one(later, RELEASE, ("r", epoch, second)) is True
    assert one(conn, CLAIM, (HOUR, "w")) is not None


def test_an_earlier_blocks_late_renewal_leaves_the_later_blocks_share(
    conn: Conn, connect: Connect
) -> None:
    earlier, later = connect(), connect()
    epoch, first = grant(earlier, SHORT, "r")
    wait_share_expired(conn, "r")
    _, second = grant(later, SHORT, "r")
    before = share_of(conn, "r")
    # A renewal of the earlier share, arriving late, renews nothing of the later one...
    assert one(earlier, RENEW, ("r", epoch, first)) is False
    assert share_of(conn, "r") == before
    # ... and the later block's keeper, naming its own, does.
    assert one(later, RENEW, ("r", epoch, second)) is True
    after = share_of(conn, "r")
    assert after is not None and before is not None and after[2] > before[2]


def test_a_release_by_epoch_alone_would_delete_the_later_share(conn: Conn) -> None:
    """What the share's id closes: lease_release(name, holder, min_hold, epoch), the
    contract's release of a tenure, names a reader's tenure by its epoch, which the
    later share has too (the SPIN mutant readers-release-by-epoch)."""
    epoch, _ = grant(conn, SHORT, "r")
    wait_share_expired(conn, "r")
    grant(conn, HOUR, "r")
    assert one(conn, "SELECT lease_release('doc', 'r', NULL, %s)", (epoch,)) is True
    assert share_of(conn, "r") is None


def test_a_new_share_of_a_holder_whose_share_is_live_is_busy_also_when_claimed_at_once(
    conn: Conn, connect: Connect, background: Submit
) -> None:
    """Two processes with one explicit holder claim at once: the second waits for the
    first's insert of the share, then finds it live, and is busy: it never replaces the
    share the first believes in."""
    first, second = connect(), blocking_conn(connect)
    one(first, "SELECT lease_claim_shared('doc', %s, 'x')", (HOUR,))  # the name's row
    with first.transaction():
        epoch, share = grant(first, HOUR, "r")
        claim = background(lambda: second.execute(NEW_SHARE, (HOUR, "r")).fetchone())
        wait_blocked(conn, second)
        assert not claim.done()
    assert claim.result(timeout=30) == (None, None)
    assert share_of(conn, "r") is not None
    assert share_of(conn, "r")[:2] == (epoch, share)  # type: ignore[index]
    # While it is live, the same holder is busy; the public claim continues it.
    assert second.execute(NEW_SHARE, (HOUR, "r")).fetchone() == (None, None)
    assert one(second, "SELECT lease_claim_shared('doc', %s, 'r')", (HOUR,)) == epoch
    assert share_of(conn, "r")[:2] == (epoch, share)  # type: ignore[index]


def test_a_new_share_after_a_writer_draws_a_new_id_and_the_old_release_is_false(
    conn: Conn,
) -> None:
    epoch, first = grant(conn, HOUR, "r")
    assert one(conn, RELEASE, ("r", epoch, first)) is True
    fence = one(conn, CLAIM, (HOUR, "w"))
    assert one(conn, "SELECT lease_release('doc', 'w')") is True
    again, second = grant(conn, HOUR, "r")
    assert again == fence and second != first
    assert one(conn, RELEASE, ("r", epoch, first)) is False
    assert one(conn, RELEASE, ("r", again, second)) is True


# -- what a reader's release does beside deleting its share (0024) --------------------

RELEASES = {
    "lease_release with the epoch": "SELECT lease_release('doc', %(h)s, NULL, %(epoch)s)",
    "lease_release": "SELECT lease_release('doc', %(h)s)",
    "pylease_release_share": "SELECT pylease_release_share('doc', %(h)s, %(epoch)s, %(share)s)",
}


def release(conn: Conn, how: str, holder: str, epoch: int, share: int) -> Any:
    return one(conn, RELEASES[how], {"h": holder, "epoch": epoch, "share": share})


@pytest.mark.parametrize("how", list(RELEASES))
def test_a_readers_release_records_it_and_clears_dead_readers_shares(
    conn: Conn, conn2: Conn, how: str
) -> None:
    assert one(conn, CLAIM, (HOUR, "old")) == 1
    assert one(conn, "SELECT lease_release('doc', 'old')") is True
    epoch, share = grant(conn, HOUR, "r")
    for dead in ("d1", "d2"):
        grant(conn, HOUR, dead)
    conn.execute(
        "UPDATE pylease_shared SET expires_at = clock_timestamp() - interval '1 second'"
        " WHERE holder IN ('d1', 'd2')"
    )
    conn.execute("SET pylease.history = 'all'")
    conn2.execute("LISTEN pylease")
    assert release(conn, how, "r", epoch, share) is True
    # The dead readers' shares went with it; the last reader told the waiters.
    assert one(conn, "SELECT count(*) FROM pylease_shared WHERE name = 'doc'") == 0
    assert [n.payload for n in conn2.notifies(timeout=5, stop_after=1)] == ["doc"]
    assert conn.execute(
        "SELECT event, holder, fence FROM pylease_events WHERE name = 'doc'"
        " ORDER BY id DESC LIMIT 1"
    ).fetchall() == [("released", "r", epoch)]
    # Once more is not its own any longer.
    assert release(conn, how, "r", epoch, share) is False


@pytest.mark.parametrize("how", list(RELEASES))
def test_a_reader_that_leaves_beside_another_tells_no_one_unless_a_writer_waits(
    conn: Conn, conn2: Conn, how: str
) -> None:
    epoch, share = grant(conn, HOUR, "r1")
    grant(conn, HOUR, "r2")
    conn2.execute("LISTEN pylease")
    assert release(conn, how, "r1", epoch, share) is True
    assert list(conn2.notifies(timeout=0.5)) == []
    # A writer in the queue: every reader that leaves tells it.
    assert one(conn, "SELECT lease_wait('doc', 'w', '1 hour')") is True
    r2 = one(conn, "SELECT share FROM pylease_shared WHERE holder = 'r2'")
    assert release(conn, how, "r2", epoch, r2) is True
    assert [n.payload for n in conn2.notifies(timeout=5, stop_after=1)] == ["doc"]
