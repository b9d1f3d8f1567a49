-- permit_renew: extend every slot of semaphore :name that :holder holds, all or
-- nothing, to the later of its expiry and now + :ttl_seconds (now + its last ttl
-- when NULL); also past the expiry, if nobody took it (contract: permit_renew).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :holder       TEXT, 1 to 200 characters
--   :ttl_seconds  REAL or NULL; when given, more than 0 and at most 31622400
-- Result: one row (fence INTEGER) per slot renewed; no row (nothing changed) once
-- any of the holder's slots was released or taken by someone else.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
mine(n, lo, hi) AS (
    SELECT count(*), min(permits), max(permits) FROM pylease_permits
     WHERE name = :name AND holder = :holder AND NOT released
)
UPDATE pylease_permits
   SET ttl        = coalesce(:ttl_seconds, ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(:ttl_seconds, ttl))
 WHERE name = :name AND holder = :holder AND NOT released
   AND (SELECT n = lo AND n = hi FROM mine)
RETURNING fence;
