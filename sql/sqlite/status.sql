-- status: one row per name ever claimed, or only :name (contract: lease_status).
--
-- A read: runs in autocommit, never waits for writers (WAL). Parameters (named):
--   :name  TEXT, or NULL for every name
-- Result: rows (name TEXT, holder TEXT, fence INTEGER, acquired_at REAL,
-- renewed_at REAL, expires_at REAL, held INTEGER 1 or 0, state TEXT, ttl REAL
-- seconds), ordered by name; times are unix seconds (UTC) from SQLite's clock;
-- held means unexpired and not released; state is held, resting (released, not
-- claimable before its min_hold ran out), released or expired.
SELECT l.name, l.holder, l.fence, l.acquired_at, l.renewed_at, l.expires_at,
       NOT l.released AND l.expires_at > c.now AS held,
       CASE WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
            WHEN l.released THEN 'released' ELSE 'expired' END AS state,
       l.ttl
  FROM pylease_leases AS l, (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3) AS now) AS c
 WHERE :name IS NULL OR l.name = :name
 ORDER BY l.name;
