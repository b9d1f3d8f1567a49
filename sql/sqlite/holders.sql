-- holders: every current holder of every kind, of :name or of every name
-- (contract: lease_holders).
--
-- A read: runs in autocommit. Parameters (named):
--   :name  TEXT, or NULL for every name
-- Result: rows (name TEXT, holder TEXT, mode TEXT, slot INTEGER, fence INTEGER,
-- acquired_at REAL, renewed_at REAL, expires_at REAL), ordered by name, mode,
-- slot and holder; mode is exclusive (the lease's holder), shared (a reader;
-- fence is its epoch) or permit (a semaphore's slot); slot is NULL but for permits.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
SELECT h.name, h.holder, h.mode, h.slot, h.fence, h.acquired_at, h.renewed_at, h.expires_at
  FROM (SELECT l.name, l.holder, 'exclusive' AS mode, NULL AS slot, l.fence, l.acquired_at,
               l.renewed_at, l.expires_at
          FROM pylease_leases AS l, clock
         WHERE (:name IS NULL OR l.name = :name) AND NOT l.released AND l.expires_at > clock.now
        UNION ALL
        SELECT s.name, s.holder, 'shared', NULL, s.epoch, s.acquired_at, s.renewed_at,
               s.expires_at
          FROM pylease_shared AS s
          JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch, clock
         WHERE (:name IS NULL OR s.name = :name) AND s.expires_at > clock.now
        UNION ALL
        SELECT p.name, p.holder, 'permit', p.slot, p.fence, p.acquired_at, p.renewed_at,
               p.expires_at
          FROM pylease_permits AS p, clock
         WHERE (:name IS NULL OR p.name = :name) AND NOT p.released AND p.expires_at > clock.now
       ) AS h
 ORDER BY h.name, h.mode, h.slot, h.holder;
