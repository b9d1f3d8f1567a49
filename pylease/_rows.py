"""What backends answer with: the rows of the SQL API, shared by every backend."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class LeaseRow:
    """One row of ``lease_status``."""

    name: str
    holder: str
    fence: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    held: bool
