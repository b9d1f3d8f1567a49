-- permit_revoke: an operator's break-lock: free every slot of semaphore :name
-- that :holder holds (contract: permit_revoke). The next grant of a slot freed
-- from an unexpired holder counts and records a steal.
--
-- Two statements: run both, in order, inside one BEGIN IMMEDIATE ... COMMIT,
-- with the same named parameters. Parameters (named):
--   :name    TEXT, 1 to 200 characters
--   :holder  TEXT, 1 to 200 characters
-- The first fails with "pylease: name is a lease, not a semaphore" (a constraint
-- error). Result of the second: one row (fence INTEGER) per slot freed.
INSERT INTO pylease_semaphore_names (name) VALUES (:name);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_permits
   SET released   = 1,
       revoked    = expires_at > (SELECT now FROM clock),
       expires_at = (SELECT now FROM clock)
 WHERE name = :name AND holder = :holder AND NOT released
RETURNING fence;
