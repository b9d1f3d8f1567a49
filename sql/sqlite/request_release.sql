-- request_release: ask the holder of lease :name to step down (PostgreSQL:
-- lease_request_release); its keeper learns of it at its next renewal
-- (renew_held.sql). The request belongs to the tenure: it stays until the tenure
-- ends; the first requester's name is kept.
--
-- Call it inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :name          TEXT, 1 to 200 characters
--   :requested_by  TEXT, 1 to 200 characters
-- Result: one row (1) when the lease is held (unexpired, not released), none otherwise.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_leases
   SET release_requested_by = coalesce(release_requested_by, :requested_by)
 WHERE name = :name AND NOT released AND expires_at > (SELECT now FROM clock)
RETURNING 1;
