-- permit_claim: claim :permits slots of semaphore :name, whose limit is
-- :max_permits, for :holder (contract: permit_claim).
--
-- Two statements: run both, in order, inside one BEGIN IMMEDIATE ... COMMIT,
-- with the same named parameters. Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :max_permits  INTEGER, 1 to 10000 (check it yourself)
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
--   :permits      INTEGER, 1 to :max_permits (check it yourself)
-- The first statement checks the call and makes the semaphore on its first claim:
-- it fails with "pylease: name is a lease, not a semaphore", "pylease:
-- max_permits differs from the limit of this semaphore", or "pylease: permits
-- must be as many as this holder already holds ..." (constraint errors).
-- Result of the second: one row (slot INTEGER, fence INTEGER) per slot when
-- granted; no row when fewer than :permits slots are free (a busy claim writes
-- nothing). A holder that still holds its slots gets them again, extended (never
-- earlier). A slot is free when its expiry passed (released or not); a slot at
-- or above the limit (left by a lowered one) keeps the slot below it that it maps
-- onto (slot % limit) busy until it is free. The lowest free slots are taken.
-- A slot whose fences are exhausted (2^63-1) fails with "pylease: fences exhausted ...".
INSERT INTO pylease_permit_claims (name, max_permits, holder, permits)
VALUES (:name, :max_permits, :holder, :permits);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
lim(n) AS (SELECT max_permits FROM pylease_names WHERE name = :name),
mine(slot) AS (
    SELECT slot FROM pylease_permits WHERE name = :name AND holder = :holder AND NOT released
),
free(slot) AS (
    SELECT p.slot
      FROM pylease_permits AS p, clock, lim
     WHERE p.name = :name AND p.slot < lim.n AND p.expires_at <= clock.now
       AND NOT EXISTS (SELECT 1 FROM pylease_permits AS q
                        WHERE q.name = :name AND q.slot >= lim.n AND q.slot % lim.n = p.slot
                          AND q.expires_at > clock.now)
     ORDER BY p.slot
     LIMIT :permits
),
chosen(slot) AS (
    SELECT slot FROM mine
    UNION ALL
    SELECT slot FROM free
     WHERE NOT EXISTS (SELECT 1 FROM mine) AND (SELECT count(*) FROM free) = :permits
)
UPDATE pylease_permits
   SET fence       = CASE WHEN holder IS :holder AND NOT released THEN fence
                          WHEN fence = 0 THEN (SELECT floor + 1 FROM pylease_fence_floor)
                          WHEN fence < 9223372036854775807 THEN fence + 1 END,
       acquired_at = CASE WHEN holder IS :holder AND NOT released THEN acquired_at
                          ELSE (SELECT now FROM clock) END,
       holder      = :holder,
       permits     = :permits,
       ttl         = :ttl_seconds,
       renewed_at  = (SELECT now FROM clock),
       expires_at  = CASE WHEN holder IS :holder AND NOT released
                          THEN max(expires_at, (SELECT now FROM clock) + :ttl_seconds)
                          ELSE (SELECT now FROM clock) + :ttl_seconds END,
       released    = 0,
       revoked     = 0,
       grants      = grants + CASE WHEN holder IS :holder AND NOT released THEN 0 ELSE 1 END,
       takeovers   = takeovers + CASE WHEN holder IS NOT :holder AND fence > 0 AND NOT released
                                      THEN 1 ELSE 0 END,
       steals      = steals + revoked
 WHERE name = :name AND slot IN (SELECT slot FROM chosen)
RETURNING slot, fence;
