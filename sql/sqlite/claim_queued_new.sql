-- claim_queued_new: claim_new.sql for a writer that waits, with writer preference on SQLite
-- (contract 5.2: "SQLite keeps a queue of its own"; PostgreSQL's waiters queue with
-- lease_wait). A waiter kept out by readers puts :waiter in pylease_waiters for 2
-- seconds (refreshed when it claims again, at most once a second): meanwhile no new
-- reader is let in. Granted, it leaves the queue.
--
-- Run its statements in order inside one BEGIN IMMEDIATE ... COMMIT (the last one
-- answers, as claim_new.sql). Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :waiter       TEXT, who waits: the claim's holder will do
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
--   :data         TEXT (JSON) or NULL: the tenure's data, at most 8192 characters
-- Result: as claim_new.sql.

-- Expired entries of the name go, and the waiter's own when this claim is granted.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
DELETE FROM pylease_waiters
 WHERE name = :name
   AND (expires_at <= (SELECT now FROM clock)
        OR (waiter = :waiter
            AND NOT EXISTS (SELECT 1 FROM pylease_leases AS l, clock
                             WHERE l.name = :name
                               AND (l.expires_at > clock.now
                                    OR EXISTS (SELECT 1 FROM pylease_shared AS s
                                                WHERE s.name = l.name AND s.epoch = l.fence
                                                  AND s.expires_at > clock.now)))));

-- Kept out by readers: in line (or still in line).
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
INSERT INTO pylease_waiters (name, waiter, expires_at)
SELECT :name, :waiter, clock.now + 2.0
  FROM clock
 WHERE EXISTS (SELECT 1 FROM pylease_leases AS l
                WHERE l.name = :name
                  AND EXISTS (SELECT 1 FROM pylease_shared AS s
                               WHERE s.name = l.name AND s.epoch = l.fence
                                 AND s.expires_at > clock.now))
    ON CONFLICT (name, waiter) DO UPDATE
   SET expires_at = excluded.expires_at
 WHERE pylease_waiters.expires_at < excluded.expires_at - 1.0;

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
