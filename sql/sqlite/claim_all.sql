-- claim_all: claim every lease of :names for :holder, all or nothing (contract:
-- lease_claim_all).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT, so that the
-- decision is taken under SQLite's write lock. Parameters (named):
--   :names        TEXT, a JSON array of 1 to 1000 distinct names (check it yourself)
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
-- Result: one row (name TEXT, fence INTEGER) per name when all were granted; no
-- row when any is busy, by a holder or by readers (a busy claim writes nothing). Names the holder still holds
-- are extended, with their fences, as by claim.sql; counters and history as there.
-- A semaphore's name fails with "pylease: name is a semaphore, not a lease", a name
-- whose fences are exhausted with "pylease: fences exhausted ..." (constraint
-- errors), and nothing is granted.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name) AS (SELECT value FROM json_each(:names))
INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at, grants)
SELECT w.name, :holder, f.floor + 1, :ttl_seconds, clock.now, clock.now, clock.now + :ttl_seconds, 1
  FROM wanted AS w, clock, pylease_fence_floor AS f
 WHERE NOT EXISTS (SELECT 1 FROM pylease_leases AS b
                    WHERE b.name IN (SELECT name FROM wanted) AND b.expires_at > clock.now
                      AND (b.released OR b.holder <> :holder))
   AND NOT EXISTS (SELECT 1 FROM pylease_shared AS s
                     JOIN pylease_leases AS b ON b.name = s.name AND b.fence = s.epoch
                    WHERE s.name IN (SELECT name FROM wanted) AND s.expires_at > clock.now)
    ON CONFLICT (name) DO UPDATE
   SET fence       = CASE WHEN l.holder = excluded.holder AND NOT l.released THEN l.fence
                          WHEN l.fence < 9223372036854775807 THEN l.fence + 1 END,
       acquired_at = CASE WHEN l.holder = excluded.holder AND NOT l.released
                          THEN l.acquired_at ELSE excluded.acquired_at END,
       holder      = excluded.holder,
       ttl         = excluded.ttl,
       renewed_at  = excluded.renewed_at,
       expires_at  = CASE WHEN l.holder = excluded.holder AND NOT l.released
                          THEN max(l.expires_at, excluded.expires_at)
                          ELSE excluded.expires_at END,
       released    = 0,
       -- A new tenure has no data and no step-down request; a continued one keeps its own.
       data        = CASE WHEN l.holder = excluded.holder AND NOT l.released THEN l.data END,
       release_requested_by = CASE WHEN l.holder = excluded.holder AND NOT l.released
                                   THEN l.release_requested_by END,
       grants      = l.grants + CASE WHEN l.holder = excluded.holder AND NOT l.released
                                     THEN 0 ELSE 1 END,
       takeovers   = l.takeovers + CASE WHEN l.holder <> excluded.holder AND NOT l.released
                                        THEN 1 ELSE 0 END
 WHERE l.expires_at <= excluded.renewed_at
    OR (l.holder = excluded.holder AND NOT l.released)
RETURNING name, fence;
