-- renew: extend lease :name that :holder still holds to now + :ttl_seconds, or
-- now + the last granted ttl when :ttl_seconds is NULL; also past its expiry
-- if nobody claimed it since (contract: lease_renew). Never earlier: the expiry
-- becomes the later of the current one and now + ttl; the ttl is stored anyway.
--
-- A reader's share is renewed as the lease of its exclusive holder, while its epoch
-- is still the name's fence (no exclusive grant since).
--
-- Run its statements in order inside one BEGIN IMMEDIATE ... COMMIT (the last one
-- answers: under the write lock, what it reads is what the first two renewed).
-- Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :holder       TEXT, 1 to 200 characters
--   :ttl_seconds  REAL or NULL; when given, more than 0 and at most 31622400
-- Result: one row (fence INTEGER, expires_at REAL unix seconds; a reader's fence is
-- its epoch) when renewed; no row once the lease was released, or claimed or
-- stolen by anyone else.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_leases
   SET ttl        = coalesce(:ttl_seconds, ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(:ttl_seconds, ttl))
 WHERE name = :name AND holder = :holder AND NOT released;

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_shared
   SET ttl        = coalesce(:ttl_seconds, ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(:ttl_seconds, ttl))
 WHERE name = :name AND holder = :holder
   AND epoch = (SELECT l.fence FROM pylease_leases AS l WHERE l.name = :name);

SELECT l.fence, l.expires_at FROM pylease_leases AS l
 WHERE l.name = :name AND l.holder = :holder AND NOT l.released
UNION ALL
SELECT s.epoch, s.expires_at FROM pylease_shared AS s
  JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch
 WHERE s.name = :name AND s.holder = :holder;
