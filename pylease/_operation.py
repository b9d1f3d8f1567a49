"""What an SQL operation is to a backend: a statement on each database, and a rule for
its answer.

The operations themselves are declared in :mod:`pylease._operations_async`, each
beside the method that checks its arguments; a backend runs any of them by its one
``_call`` (PostgreSQL: the statement; SQLite: ``sql/sqlite/<name>.sql``), so a new
plain operation needs no code in either backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, LiteralString


class Kind(enum.Enum):
    """What an operation does to the database, which decides how it commits."""

    #: Reads only: autocommit on SQLite.
    READ = "read"
    #: A grant or a renewal: it counts only once durable (PostgreSQL: refused when the
    #: commit came with a synchronous-replication WARNING; SQLite: ``synchronous = FULL``).
    GRANT = "grant"
    #: A write whose loss in a crash is harmless (a release keeps the lease until its
    #: expiry, a prune keeps old events): SQLite commits it with ``synchronous = NORMAL``.
    WRITE = "write"


class Answer(enum.Enum):
    """How an operation's rows become its answer, when it is not a row class."""

    #: The first value of the first row, or None without one (claim: a fence, or None: busy).
    VALUE = "value"
    #: True when a row came back and its first value is true.
    FLAG = "flag"
    #: How many (PostgreSQL: the one value returned; SQLite: one row per thing affected).
    COUNT = "count"


READ, GRANT, WRITE = Kind.READ, Kind.GRANT, Kind.WRITE
VALUE, FLAG, COUNT = Answer.VALUE, Answer.FLAG, Answer.COUNT


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of the SQL API, as every backend runs it."""

    #: The operation's name: its method, and its SQLite file ``sql/sqlite/<name>.sql``.
    name: str
    kind: Kind
    #: One call of its ``lease_*`` function, with positional parameters.
    postgres: LiteralString
    #: The SQLite file's named parameters, in the order of the positional ones; a
    #: ``timedelta`` is passed as seconds, a ``datetime`` as unix seconds, a list as JSON.
    sqlite: tuple[str, ...]
    #: An :class:`Answer`, ``tuple`` (the rows as they are) or a row class, one per row
    #: (SQLite's unix seconds and seconds become the class's datetimes and timedeltas).
    answer: Answer | type[Any]
