from typing import Any

import psycopg


def test_claim_returns_a_fence(conn: psycopg.Connection[Any]) -> None:
    fence = conn.execute("SELECT lease_claim('sweep', interval '5 min', 'me')").fetchone()
    assert fence == (1,)
