-- release: give lease :name back, only if :holder still holds it (an expired
-- lease that nobody took counts as held). With :min_hold_seconds, the name
-- stays unavailable until acquired_at + :min_hold_seconds (contract: lease_release).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. A release lost in
-- a crash only keeps the lease until its expiry, so it may commit with
-- PRAGMA synchronous = NORMAL. Parameters (named):
--   :name              TEXT, 1 to 200 characters
--   :holder            TEXT, 1 to 200 characters
--   :min_hold_seconds  REAL or NULL; when given, from 0 to 31622400 (366 days; check it yourself)
-- Result: one row (expires_at REAL unix seconds: when the name is free) when
-- given back; no row when this holder did not hold it. SQLite has no NOTIFY:
-- waiters poll.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_leases
   SET released   = 1,
       expires_at = CASE WHEN :min_hold_seconds IS NULL THEN (SELECT now FROM clock)
                         ELSE max((SELECT now FROM clock), acquired_at + :min_hold_seconds) END,
       releases   = releases + 1
 WHERE name = :name AND holder = :holder AND NOT released
RETURNING expires_at;
