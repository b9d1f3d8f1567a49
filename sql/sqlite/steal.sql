-- steal: take lease :name whatever its state, when its holder last claimed or
-- renewed at least :older_than_seconds ago (or it has expired); on a name never
-- claimed, a claim (contract: lease_steal).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :name                TEXT, 1 to 200 characters
--   :ttl_seconds         REAL, more than 0 and at most 31622400 (366 days)
--   :holder              TEXT, 1 to 200 characters
--   :older_than_seconds  REAL, from 0 to 31622400 (0: steal unconditionally)
-- Result: one row (fence INTEGER, always a new one) when taken; no row when the
-- holder renewed more recently than :older_than_seconds ago, or while unexpired
-- readers of its epoch hold it (a steal breaks a writer's lease only). Taken from the holder
-- the row names (not released), the expiry never moves earlier: the earlier
-- tenure's owner may still believe what it was granted.
-- A name whose fences are exhausted (2^63-1) fails with "pylease: fences exhausted ...".
-- Bad arguments fail with "pylease: <parameter> must ..." (constraint error);
-- check 0 <= :older_than_seconds <= 31622400 (366 days) yourself.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at, grants)
SELECT :name, :holder, f.floor + 1, :ttl_seconds, clock.now, clock.now, clock.now + :ttl_seconds, 1
  FROM clock, pylease_fence_floor AS f
 WHERE true
    ON CONFLICT (name) DO UPDATE
   SET fence       = CASE WHEN l.fence < 9223372036854775807 THEN l.fence + 1 END,
       holder      = excluded.holder,
       ttl         = excluded.ttl,
       acquired_at = excluded.acquired_at,
       renewed_at  = excluded.renewed_at,
       expires_at  = CASE WHEN l.holder = excluded.holder AND NOT l.released
                          THEN max(l.expires_at, excluded.expires_at)
                          ELSE excluded.expires_at END,
       released    = 0,
       -- A new tenure: no data, no step-down request.
       data        = NULL,
       release_requested_by = NULL,
       grants      = l.grants + 1,
       takeovers   = l.takeovers + CASE WHEN NOT l.released AND l.expires_at <= excluded.renewed_at
                                        THEN 1 ELSE 0 END,
       steals      = l.steals + CASE WHEN NOT l.released AND l.expires_at > excluded.renewed_at
                                     THEN 1 ELSE 0 END
 WHERE (l.renewed_at <= excluded.renewed_at - :older_than_seconds
        OR l.expires_at <= excluded.renewed_at)
   AND NOT EXISTS (SELECT 1 FROM pylease_shared AS s
                    WHERE s.name = l.name AND s.epoch = l.fence AND s.expires_at > excluded.renewed_at)
RETURNING fence;
