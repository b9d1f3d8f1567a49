-- claim: take lease :name for :ttl_seconds as :holder (contract: lease_claim).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT, so that the
-- decision is taken under SQLite's write lock; keep nothing else in that
-- transaction. Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
--   :data         TEXT (JSON) or NULL: the tenure's data, at most 8192 characters
-- A new tenure counts a grant (and a takeover after an expiry without release),
-- and is recorded in pylease_events by triggers as pylease_settings asks.
-- Result: one row (fence INTEGER) when granted; no row when another holder's
-- unexpired lease stands, or unexpired readers of its epoch hold it (a busy claim
-- writes nothing). A grant ends the name's readers (pylease_leases_readers_over). Claiming again as the
-- holder the row still names (not released) extends it and keeps the fence; as a
-- renewal, never earlier: the expiry becomes the later of the current one and now
-- + ttl (the ttl is stored anyway).
-- Bad arguments fail with "pylease: <parameter> must ..." (constraint error); a
-- name whose fences are exhausted (2^63-1) with "pylease: fences exhausted ...".
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at, grants,
                                 data)
SELECT :name, :holder, f.floor + 1, :ttl_seconds, clock.now, clock.now, clock.now + :ttl_seconds, 1,
       json(:data)
  FROM clock, pylease_fence_floor AS f
 WHERE true
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
       -- A continued tenure keeps its data unless the claim gives some; a new one has
       -- its own (NULL unless given) and no step-down request.
       data        = CASE WHEN l.holder = excluded.holder AND NOT l.released
                          THEN coalesce(excluded.data, l.data) ELSE excluded.data END,
       release_requested_by = CASE WHEN l.holder = excluded.holder AND NOT l.released
                                   THEN l.release_requested_by END,
       grants      = l.grants + CASE WHEN l.holder = excluded.holder AND NOT l.released
                                     THEN 0 ELSE 1 END,
       takeovers   = l.takeovers + CASE WHEN l.holder <> excluded.holder AND NOT l.released
                                        THEN 1 ELSE 0 END
 WHERE (l.expires_at <= excluded.renewed_at OR (l.holder = excluded.holder AND NOT l.released))
   AND NOT EXISTS (SELECT 1 FROM pylease_shared AS s
                    WHERE s.name = l.name AND s.epoch = l.fence AND s.expires_at > excluded.renewed_at)
RETURNING fence;
