-- status: one row per name ever claimed, or only :name (contract: lease_status).
--
-- A read: runs in autocommit, never waits for writers (WAL). Parameters (named):
--   :name  TEXT, or NULL for every name
-- Result: rows (name TEXT, holder TEXT, fence INTEGER, acquired_at REAL,
-- renewed_at REAL, expires_at REAL, held INTEGER 1 or 0), ordered by name; times
-- are unix seconds (UTC) from SQLite's clock; held means unexpired and not released.
SELECT name, holder, fence, acquired_at, renewed_at, expires_at,
       NOT released AND expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3) AS held
  FROM pylease_leases
 WHERE :name IS NULL OR name = :name
 ORDER BY name;
