-- claim_new: take a new tenure of lease :name for :ttl_seconds as :holder
-- (PostgreSQL: lease_claim_new).
--
-- As claim.sql, except that a tenure of the same holder is never continued:
-- unexpired, it is busy (another process uses this holder); expired, it is
-- taken over with a new fence. The Python API and the command line claim so
-- with a holder they were given. Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
--   :data         TEXT (JSON) or NULL: the tenure's data, at most 8192 characters
-- Result: one row (fence INTEGER) when granted; no row while anyone's unexpired
-- lease stands, or unexpired readers of its epoch hold it (a busy claim writes
-- nothing).
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at, grants,
                                 data)
SELECT :name, :holder, f.floor + 1, :ttl_seconds, clock.now, clock.now, clock.now + :ttl_seconds, 1,
       json(:data)
  FROM clock, pylease_fence_floor AS f
 WHERE true
    ON CONFLICT (name) DO UPDATE
   SET fence       = CASE WHEN l.fence < 9223372036854775807 THEN l.fence + 1 END,
       acquired_at = excluded.acquired_at,
       holder      = excluded.holder,
       ttl         = excluded.ttl,
       renewed_at  = excluded.renewed_at,
       expires_at  = excluded.expires_at,
       released    = 0,
       -- A new tenure: its own data (NULL unless given), no step-down request.
       data        = excluded.data,
       release_requested_by = NULL,
       grants      = l.grants + 1,
       takeovers   = l.takeovers + CASE WHEN NOT l.released THEN 1 ELSE 0 END
 WHERE l.expires_at <= excluded.renewed_at
   AND NOT EXISTS (SELECT 1 FROM pylease_shared AS s
                    WHERE s.name = l.name AND s.epoch = l.fence AND s.expires_at > excluded.renewed_at)
RETURNING fence;
