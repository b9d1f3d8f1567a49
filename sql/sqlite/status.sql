-- status: one row per name ever claimed, or only :name (contract: lease_status).
--
-- A read: runs in autocommit, never waits for writers (WAL). Parameters (named):
--   :name  TEXT, or NULL for every name
-- Result: rows (name TEXT, holder TEXT, fence INTEGER, acquired_at REAL,
-- renewed_at REAL, expires_at REAL, held INTEGER 1 or 0, state TEXT, ttl REAL
-- seconds, shared INTEGER, data TEXT (JSON), release_requested_by TEXT), ordered by name; times are unix seconds (UTC) from
-- SQLite's clock; held means unexpired and not released; state is held, shared
-- (held by readers: no holder, the epoch as fence, the readers' times), resting
-- (released, not claimable before its min_hold ran out), released or expired;
-- shared counts the readers (unexpired shares of the name's epoch); data is the
-- exclusive holder's tenure's (a released lease's last; NULL while readers hold it),
-- release_requested_by its step-down request while the tenure lasts.
SELECT l.name, CASE WHEN r.n > 0 THEN NULL ELSE l.holder END AS holder, l.fence,
       CASE WHEN r.n > 0 THEN r.acquired_at ELSE l.acquired_at END AS acquired_at,
       CASE WHEN r.n > 0 THEN r.renewed_at ELSE l.renewed_at END AS renewed_at,
       CASE WHEN r.n > 0 THEN r.expires_at ELSE l.expires_at END AS expires_at,
       coalesce(r.n > 0, 0) OR (NOT l.released AND l.expires_at > c.now) AS held,
       CASE WHEN r.n > 0 THEN 'shared'
            WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
            WHEN l.released THEN 'released' ELSE 'expired' END AS state,
       CASE WHEN r.n > 0 THEN r.ttl ELSE l.ttl END AS ttl,
       coalesce(r.n, 0) AS shared,
       CASE WHEN r.n > 0 THEN NULL ELSE l.data END AS data,
       CASE WHEN r.n > 0 OR l.released THEN NULL ELSE l.release_requested_by END
           AS release_requested_by
  FROM pylease_leases AS l
  JOIN (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3) AS now) AS c
  LEFT JOIN (SELECT s.name, count(*) AS n, min(s.acquired_at) AS acquired_at,
                    max(s.renewed_at) AS renewed_at, max(s.expires_at) AS expires_at,
                    max(s.ttl) AS ttl
               FROM pylease_shared AS s
               JOIN pylease_leases AS k ON k.name = s.name AND k.fence = s.epoch
              WHERE (:name IS NULL OR s.name = :name)
                AND s.expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
              GROUP BY s.name) AS r ON r.name = l.name
 WHERE :name IS NULL OR l.name = :name
 ORDER BY l.name;
