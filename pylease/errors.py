"""The errors pylease raises: one root, each carrying the lease name, each picklable."""

from __future__ import annotations

from typing import Any


class PyleaseError(Exception):
    """Something went wrong with a lease."""

    def __init__(self, message: str | None = None, *, name: str | None = None) -> None:
        self.name = name
        super().__init__(message or (self.__doc__ or "").strip())

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only state does not survive the default BaseException pickling.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[PyleaseError], args: tuple[Any, ...], state: dict[str, Any]) -> PyleaseError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class InvalidArgument(PyleaseError, ValueError):
    """An argument is not a valid name, holder, duration or fence."""

    def __init__(self, message: str, *, parameter: str, name: str | None = None) -> None:
        self.parameter = parameter
        super().__init__(message, name=name)


class LeaseBusy(PyleaseError):
    """Another holder's unexpired lease stands.

    :ivar holder: who holds it, when it was read (None: not read).
    :ivar data: what that holder published with its tenure (contract 5.4), e.g. where
        the leader listens; None: nothing, or not read.
    """

    def __init__(
        self,
        name: str,
        *,
        holder: str | None = None,
        waited: float = 0.0,
        claimer: str | None = None,
        here: bool = False,
        data: object = None,
    ) -> None:
        self.holder = holder
        self.waited = waited
        self.data = data
        by = f" by {holder}" if holder else ""
        after = f" after waiting {waited:.3f}s" if waited else ""
        why = ""
        if here:
            by = " by this process already" + (f" (holder {holder})" if holder else "")
            why = ", in a block this one is nested in: a wait would wait for itself"
        elif holder is not None and holder == claimer:
            why = (
                ", the holder this claim was given: another process uses the same holder"
                " (a holder names one claim; give each process its own)"
            )
        super().__init__(f"lease {name!r} is held{by}{why}{after}", name=name)


class MemberLive(LeaseBusy):
    """That member name is live in the group: a member is one incarnation at a time."""

    def __init__(self, grp: str, member: str) -> None:
        super().__init__(grp, holder=member)
        self.member = member
        self.args = (
            f"member {member!r} of group {grp!r} is live elsewhere (a member name is one"
            " incarnation at a time: give each process a name of its own, or none)",
        )


class LeaseLost(PyleaseError):
    """The lease is no longer ours: released, expired and taken, or stolen."""

    def __init__(self, name: str, reason: str = "") -> None:
        self.reason = reason
        detail = f": {reason}" if reason else ""
        super().__init__(f"lease {name!r} was lost{detail}", name=name)


class SchemaMissing(PyleaseError):
    """The pylease schema is not installed in this database: run `pylease migrate`."""


class MigrationError(PyleaseError):
    """The schema could not be migrated."""


class ConfigurationError(PyleaseError):
    """pylease cannot work with the configuration it was given."""


class DatabaseUnavailable(PyleaseError):
    """The database could not be reached."""


class ReadOnlyServer(DatabaseUnavailable):
    """Read-only server (a standby): connect to the primary (target_session_attrs=read-write)."""


class FenceExhausted(PyleaseError):
    """The lease's fence tokens are exhausted (2^63-1): no further grant is possible."""
