-- group_renew: extend member :member of group :grp to the later of its expiry and
-- now + :ttl_seconds (now + its last ttl when NULL), while it is live; with
-- :incarnation, only that incarnation (contract: group_renew).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :grp          TEXT
--   :member       TEXT
--   :ttl_seconds  REAL or NULL; when given, more than 0 and at most 31622400
--   :incarnation  INTEGER or NULL (whichever incarnation is live)
-- Result: one row (incarnation INTEGER) when renewed; no row once the member left
-- or expired (unlike a lease, a member past its expiry is not renewed: it joins
-- again).
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_members
   SET ttl        = coalesce(:ttl_seconds, ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(:ttl_seconds, ttl))
 WHERE grp = :grp AND member = :member AND expires_at > (SELECT now FROM clock)
   AND (:incarnation IS NULL OR incarnation = :incarnation)
RETURNING incarnation;
