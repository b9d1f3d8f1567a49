"""The keeper's belief arithmetic is the model's.

``model/pylease.pml`` decides what a holder believes: a Ticket's expiry is the send time
of its last successful claim or renewal plus the span the server granted (the later of
those), and ``held.lost`` / ``held.check()`` believe until that expiry minus a margin for
the clock-rate bound: max(MARGIN_PPM of the ttl, MARGIN_FLOOR_MS). The constants are read
from the model file, and the Ticket runs on a clock this test sets.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from pylease import _ticket
from pylease._held import Held
from pylease._ticket import Ticket
from pylease.errors import LeaseLost

MODEL = Path(__file__).resolve().parents[2] / "model" / "pylease.pml"


def constant(name: str) -> int:
    m = re.search(rf"^#define {name}\s+(\d+)", MODEL.read_text(encoding="utf-8"), re.MULTILINE)
    assert m is not None, name
    return int(m.group(1))


RATE_PPM = constant("RATE_PPM")
MARGIN_PPM = constant("MARGIN_PPM")
MARGIN_FLOOR = constant("MARGIN_FLOOR_MS") / 1000


def margin(ttl: float) -> float:
    """The model's belief margin for a lease of ``ttl`` seconds."""
    return max(ttl * MARGIN_PPM / 1_000_000, MARGIN_FLOOR)


class Clock:
    """The keeper's monotonic clock, as the test sets it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(1000.0)
    monkeypatch.setattr(_ticket, "monotonic", fake)
    return fake


def held(ttl: float, sent_at: float) -> Held:
    ticket = Ticket("belief", "me", timedelta(seconds=ttl), sent_at=sent_at)
    return Held("belief", "me", 1, ticket)


def believes(h: Held) -> bool:
    lost = h.lost
    try:
        h.check()
    except LeaseLost:
        assert lost, "held.check() raised while held.lost was False"
        return False
    assert not lost, "held.lost was True while held.check() passed"
    return True


def test_the_model_encodes_the_contracts_clock_assumption() -> None:
    # Contract section 5, "Clocks": rates within 0.1 %, a margin of at least 0.2 % of
    # the ttl and 50 ms; the margin covers the bound twice over.
    assert (RATE_PPM, MARGIN_PPM, MARGIN_FLOOR) == (1000, 2000, 0.05)
    assert MARGIN_PPM >= 2 * RATE_PPM


@pytest.mark.parametrize("ttl", [10.0, 100.0])
def test_a_claim_is_believed_from_its_send_time(clock: Clock, ttl: float) -> None:
    # Sent at 1000, answered later: the belief still counts from the send.
    h = held(ttl, sent_at=1000.0)
    clock.now = 1000.0 + ttl - margin(ttl) - 0.001
    assert believes(h)


@pytest.mark.parametrize("ttl", [10.0, 100.0])
def test_a_claim_is_not_believed_within_the_margin_of_its_expiry(clock: Clock, ttl: float) -> None:
    h = held(ttl, sent_at=1000.0)
    clock.now = 1000.0 + ttl - margin(ttl)
    assert not believes(h)


def test_a_claim_is_not_believed_past_its_send_time_plus_ttl(clock: Clock) -> None:
    h = held(10.0, sent_at=1000.0)
    clock.now = 1010.0
    assert not believes(h)


def test_a_renewal_extends_the_belief_from_its_own_send_time(clock: Clock) -> None:
    ttl = 10.0
    h = held(ttl, sent_at=1000.0)
    # Renewed: sent at 1006, the server granted 9 s from its own now.
    h._ticket.renewed(1006.0, 9.0)
    clock.now = 1006.0 + 9.0 - margin(ttl) - 0.001
    assert believes(h)
    clock.now = 1015.0
    assert not believes(h)


def test_a_renewal_never_moves_the_belief_earlier(clock: Clock) -> None:
    ttl = 10.0
    h = held(ttl, sent_at=1000.0)
    # An answer granting less than the belief already held (sent earlier, a short span).
    h._ticket.renewed(1001.0, 2.0)
    clock.now = 1010.0 - margin(ttl) - 0.001
    assert believes(h)


def test_a_renewal_is_not_believed_within_the_margin_of_its_expiry(clock: Clock) -> None:
    ttl = 10.0
    h = held(ttl, sent_at=1000.0)
    h._ticket.renewed(1006.0, 10.0)
    clock.now = 1016.0 - margin(ttl)
    assert not believes(h)


def test_a_renewal_answer_read_after_the_belief_ended_does_not_revive_it(clock: Clock) -> None:
    ttl = 10.0
    h = held(ttl, sent_at=1000.0)
    # The renewal was sent at 1006; its answer is read at 1011 (the keeper paused), when
    # the belief had ended: that renewal may have renewed a later tenure of this holder.
    clock.now = 1011.0
    assert not believes(h)
    h._ticket.renewed(1006.0, 10.0)
    assert not believes(h)
