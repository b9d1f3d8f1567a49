-- permit_claim_new: take a new tenure of :permits slots of semaphore :name, whose
-- limit is :max_permits, for :holder (PostgreSQL: permit_claim_new).
--
-- As permit_claim.sql, except that the holder's slots are never continued: while
-- one of them is unexpired the claim is busy (another process uses this holder);
-- expired, they end with the grant (those it does not take again are freed, not
-- counted as releases). The Python API and the command line claim so with a holder
-- they were given. Three statements: run them in order inside one BEGIN IMMEDIATE
-- ... COMMIT, with the same named parameters. Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :max_permits  INTEGER, 1 to 10000 (check it yourself)
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
--   :permits      INTEGER, 1 to :max_permits (check it yourself)
-- The first statement checks the call and makes the semaphore on its first claim, as
-- in permit_claim.sql (the holder is left out of the check: its slots are not
-- continued, so their number does not matter). Result of the last: one row (slot
-- INTEGER, fence INTEGER) per slot when granted; no row when fewer than :permits
-- slots are free or a slot of :holder is unexpired (a busy claim writes nothing).
INSERT INTO pylease_permit_claims (name, max_permits, holder, permits)
VALUES (:name, :max_permits, NULL, :permits);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
lim(n) AS (SELECT max_permits FROM pylease_names WHERE name = :name),
free(slot) AS (
    SELECT p.slot
      FROM pylease_permits AS p, clock, lim
     WHERE p.name = :name AND p.slot < lim.n AND p.expires_at <= clock.now
       AND NOT EXISTS (SELECT 1 FROM pylease_permits AS q
                        WHERE q.name = :name AND q.slot >= lim.n AND q.slot % lim.n = p.slot
                          AND q.expires_at > clock.now)
     ORDER BY p.slot
     LIMIT :permits
)
UPDATE pylease_permits
   SET released = 1
 WHERE name = :name AND holder = :holder AND NOT released
   AND slot NOT IN (SELECT slot FROM free)
   AND (SELECT count(*) FROM free) = :permits
   AND NOT EXISTS (SELECT 1 FROM pylease_permits AS o, clock
                    WHERE o.name = :name AND o.holder = :holder AND NOT o.released
                      AND o.expires_at > clock.now);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
lim(n) AS (SELECT max_permits FROM pylease_names WHERE name = :name),
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
    SELECT slot FROM free
     WHERE (SELECT count(*) FROM free) = :permits
       AND NOT EXISTS (SELECT 1 FROM pylease_permits AS o, clock
                        WHERE o.name = :name AND o.holder = :holder AND NOT o.released
                          AND o.expires_at > clock.now)
)
UPDATE pylease_permits
   SET fence       = CASE WHEN fence < 9223372036854775807 THEN fence + 1 END,
       acquired_at = (SELECT now FROM clock),
       holder      = :holder,
       permits     = :permits,
       ttl         = :ttl_seconds,
       renewed_at  = (SELECT now FROM clock),
       expires_at  = (SELECT now FROM clock) + :ttl_seconds,
       released    = 0,
       revoked     = 0,
       grants      = grants + 1,
       takeovers   = takeovers + CASE WHEN fence > 0 AND NOT released THEN 1 ELSE 0 END,
       steals      = steals + revoked
 WHERE name = :name AND slot IN (SELECT slot FROM chosen)
RETURNING slot, fence;
