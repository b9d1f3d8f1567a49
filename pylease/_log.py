"""pylease's log records: what a lease's life looks like on the ``pylease`` logger.

Every record carries structured fields (``extra``), so a handler can recognise it
without reading its words: ``pylease_event``, and where they apply ``pylease_name``,
``pylease_holder``, ``pylease_fence``. The events:

- ``claimed``, ``renewed``, ``released`` (DEBUG): one per claim, per renewal of each
  lease, per release (``pylease_released``: whether it was still ours);
- ``renew_failed``: a renewal through one database failed. The first failure of an
  episode is a WARNING (and the first of each other kind of error in it, such as a
  standby's refusal after a connection error), the retries that follow are DEBUG,
  never a warning each (``pylease_names``, ``pylease_attempt``, ``pylease_expires_in``,
  ``pylease_error``);
- ``renew_recovered`` (WARNING): renewals work again; it closes the episode, as a
  ``lost`` record does when no renewal could keep a lease;
- ``lost`` (WARNING, ``pylease_reason``), ``release_failed`` (WARNING).

Messages never start with "pylease:" (the logger's name says it, and a handler that
prints ``%(name)s: %(message)s`` must not say it twice), and the text of an error
quoted in one loses its own prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("pylease")

PREFIX = "pylease: "


def text(exc: BaseException | None) -> str:
    """An error as one line for a log message, without pylease's own prefix."""
    if exc is None:
        return "none"
    message = " ".join(str(exc).split()) or type(exc).__name__
    while message.startswith(PREFIX):
        message = message[len(PREFIX) :]
    return message


def last_error(group: Any) -> str:
    """The last error of a keeper's group, for the reason of a loss."""
    return text(group.last_error)


def fields(event: str, name: str, holder: str, fence: int | None, **more: Any) -> dict[str, Any]:
    """The ``extra`` of a record about one lease."""
    extra = {
        "pylease_event": event,
        "pylease_name": name,
        "pylease_holder": holder,
        "pylease_fence": fence,
    }
    extra.update({f"pylease_{key}": value for key, value in more.items()})
    return extra


def claimed(name: str, holder: str, fence: int, ttl: float, waited: float) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "claimed lease %r (fence %d, ttl %gs) as %s",
            name,
            fence,
            ttl,
            holder,
            extra=fields("claimed", name, holder, fence, ttl=ttl, waited=waited),
        )


def released(name: str, holder: str, fence: int | None, ours: bool) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "released lease %r (fence %s)"
            if ours
            else "lease %r (fence %s) was no longer ours at its release",
            name,
            fence,
            extra=fields("released", name, holder, fence, released=ours),
        )


def release_failed(name: str, holder: str, fence: int | None, exc: BaseException) -> None:
    logger.warning(
        "could not release lease %r, it stays held until it expires: %s",
        name,
        text(exc),
        extra=fields("release_failed", name, holder, fence, error=exc),
    )


def lost(name: str, holder: str, fence: int | None, reason: str) -> None:
    # The message's format is what older handlers (pylease's CLI before 0.2) matched.
    logger.warning(
        "lease %r lost: %s", name, reason, extra=fields("lost", name, holder, fence, reason=reason)
    )


def renew_failed(
    group: Any, batch: Sequence[Any], backoff: float, exc: BaseException, now: float
) -> None:
    """A failed renewal of ``batch`` through ``group.source``: a WARNING only at the
    first failure of an episode (``group.outage`` counts its failed attempts), or when
    the failure becomes one of another kind (the server answers now, but as a standby);
    every other retry is DEBUG."""
    attempt = getattr(group, "outage", 0) + 1
    kinds: set[type[BaseException]] = getattr(group, "outage_kinds", set())
    first, new_kind = attempt == 1, type(exc) not in kinds
    group.outage, group.outage_kinds = attempt, {type(exc)} if first else kinds | {type(exc)}
    level = logging.WARNING if first or new_kind else logging.DEBUG
    if not logger.isEnabledFor(level):
        return
    expires_in = min(t.expires for t in batch) - now
    if first:
        message = "renewing %d lease(s) through %s failed (attempt %d), retrying in %.2fs"
    elif new_kind:
        message = "renewing %d lease(s) through %s still fails (attempt %d), retrying in %.2fs"
    else:
        message = "renewing %d lease(s) through %s failed again (attempt %d), retrying in %.2fs"
    logger.log(
        level,
        message + " while it can (expires in %.1fs): %s",
        len(batch),
        group.source.label,
        attempt,
        backoff,
        expires_in,
        text(exc),
        extra={
            "pylease_event": "renew_failed",
            "pylease_names": [t.name for t in batch],
            "pylease_holders": [t.holder for t in batch],
            "pylease_attempt": attempt,
            "pylease_expires_in": expires_in,
            "pylease_error": exc,
        },
    )


def tick_settled(group: Any, batch: Sequence[Any]) -> None:
    """After a tick: DEBUG ``renewed`` for each lease it renewed, and the end of an
    outage episode if renewals work again. Called with the keeper's condition held."""
    kept = []
    for ticket in batch:
        if ticket.renewals > getattr(ticket, "logged_renewals", 0):
            ticket.logged_renewals = ticket.renewals
            kept.append(ticket)
    if not kept:
        return
    attempts = getattr(group, "outage", 0)
    if attempts:
        group.outage, group.outage_kinds = 0, set()
        logger.warning(
            "renewing %d lease(s) through %s works again, after %d failed attempt(s)",
            len(kept),
            group.source.label,
            attempts,
            extra={
                "pylease_event": "renew_recovered",
                "pylease_names": [t.name for t in kept],
                "pylease_holders": [t.holder for t in kept],
                "pylease_attempt": attempts,
            },
        )
    if logger.isEnabledFor(logging.DEBUG):
        for ticket in kept:
            logger.debug(
                "renewed lease %r (fence %s) for %gs",
                ticket.name,
                ticket.fence,
                ticket.ttl,
                extra=fields("renewed", ticket.name, ticket.holder, ticket.fence, ttl=ticket.ttl),
            )
