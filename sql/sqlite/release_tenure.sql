-- release_tenure: give back the tenure of lease :name with fence :fence, only if
-- :holder still holds it (an expired lease that nobody took counts as held), so
-- that a late release of an earlier tenure changes nothing once the same holder
-- holds the name again (contract: lease_release with a fence). Otherwise as
-- release.sql: with :min_hold_seconds, the name stays unavailable until
-- acquired_at + :min_hold_seconds.
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. A release lost in
-- a crash only keeps the lease until its expiry, so it may commit with
-- PRAGMA synchronous = NORMAL. Parameters (named):
--   :name              TEXT, 1 to 200 characters
--   :holder            TEXT, 1 to 200 characters
--   :min_hold_seconds  REAL or NULL; when given, from 0 to 31622400 (366 days; check it yourself)
--   :fence             INTEGER, the fence the tenure was granted
-- Result: one row (expires_at REAL unix seconds: when the name is free) when
-- given back; no row when this holder did not hold it with this fence. SQLite has
-- no NOTIFY: waiters poll.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_leases
   SET released   = 1,
       expires_at = CASE WHEN :min_hold_seconds IS NULL THEN (SELECT now FROM clock)
                         ELSE max((SELECT now FROM clock), acquired_at + :min_hold_seconds) END,
       releases   = releases + 1
 WHERE name = :name AND holder = :holder AND fence = :fence AND NOT released
RETURNING expires_at;
