# The source of pylease/_backend.py: tools/async_to_sync.py writes it from this file.
"""The operations every backend offers: the SQL API of the contract, one method each.

The protocol is the class both backends inherit their methods from,
:class:`~pylease._operations_async.AsyncOperations`, where each operation is declared
once. The PostgreSQL backend calls the SQL functions; the SQLite backend runs the
same semantics from ``sql/sqlite/``. One conformance suite runs against both.
:mod:`pylease._backend` exports both protocols and the rows they answer with.
"""

from __future__ import annotations

from typing import TypeAlias

from pylease._operations_async import AsyncOperations
from pylease._rows import CounterRow as CounterRow
from pylease._rows import LeaseEvent as LeaseEvent
from pylease._rows import LeaseRow as LeaseRow
from pylease._rows import Renewal as Renewal

# sync: from pylease._backend_async import AsyncBackend as AsyncBackend

#: Lease operations; arguments are checked by the caller's layer too.
AsyncBackend: TypeAlias = AsyncOperations
