-- claim_all_new: take a new tenure of every lease of :names for :holder, all or
-- nothing (PostgreSQL: lease_claim_all_new).
--
-- As claim_all.sql, except that a tenure of the same holder is never continued: a
-- name :holder holds unexpired is busy (another process uses this holder); an
-- expired one is taken over with a new fence. The Python API and the command line
-- claim so with a holder they were given. Call it as one statement inside BEGIN
-- IMMEDIATE ... COMMIT. Parameters (named):
--   :names        TEXT, a JSON array of 1 to 1000 distinct names (check it yourself)
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
-- Result: one row (name TEXT, fence INTEGER) per name when all were granted; no
-- row while any is unexpired, whoever holds it, or read by unexpired readers of its
-- epoch (a busy claim writes nothing). Errors as in claim_all.sql.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name) AS (SELECT value FROM json_each(:names))
INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at, grants)
SELECT w.name, :holder, f.floor + 1, :ttl_seconds, clock.now, clock.now, clock.now + :ttl_seconds, 1
  FROM wanted AS w, clock, pylease_fence_floor AS f
 WHERE NOT EXISTS (SELECT 1 FROM pylease_leases AS b
                    WHERE b.name IN (SELECT name FROM wanted) AND b.expires_at > clock.now)
   AND NOT EXISTS (SELECT 1 FROM pylease_shared AS s
                     JOIN pylease_leases AS b ON b.name = s.name AND b.fence = s.epoch
                    WHERE s.name IN (SELECT name FROM wanted) AND s.expires_at > clock.now)
    ON CONFLICT (name) DO UPDATE
   SET fence       = CASE WHEN l.fence < 9223372036854775807 THEN l.fence + 1 END,
       acquired_at = excluded.acquired_at,
       holder      = excluded.holder,
       ttl         = excluded.ttl,
       renewed_at  = excluded.renewed_at,
       expires_at  = excluded.expires_at,
       released    = 0,
       -- A new tenure: no data, no step-down request.
       data        = NULL,
       release_requested_by = NULL,
       grants      = l.grants + 1,
       takeovers   = l.takeovers + CASE WHEN NOT l.released THEN 1 ELSE 0 END
 WHERE l.expires_at <= excluded.renewed_at
RETURNING name, fence;
