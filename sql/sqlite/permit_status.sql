-- permit_status: one row per slot ever granted, of semaphore :name or of every
-- semaphore (contract: permit_status).
--
-- A read: runs in autocommit. Parameters (named):
--   :name  TEXT, or NULL for every semaphore
-- Result: rows (name TEXT, max_permits INTEGER, slot INTEGER, holder TEXT, fence
-- INTEGER, acquired_at REAL, renewed_at REAL, expires_at REAL, held INTEGER 1 or
-- 0, state TEXT, ttl REAL seconds), ordered by name and slot; times are unix
-- seconds (UTC) from SQLite's clock; held means unexpired and not released; state
-- is held, released or expired.
SELECT p.name, n.max_permits, p.slot, p.holder, p.fence, p.acquired_at, p.renewed_at,
       p.expires_at, NOT p.released AND p.expires_at > c.now AS held,
       CASE WHEN p.released THEN 'released' WHEN p.expires_at > c.now THEN 'held'
            ELSE 'expired' END AS state,
       p.ttl
  FROM pylease_permits AS p
  JOIN pylease_names AS n ON n.name = p.name,
       (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3) AS now) AS c
 WHERE (:name IS NULL OR p.name = :name) AND p.fence > 0
 ORDER BY p.name, p.slot;
