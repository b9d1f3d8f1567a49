-- release_all: give back every lease of :names that :holder still holds (an
-- expired lease that nobody took counts as held) (contract: lease_release_all).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT; it may commit with
-- PRAGMA synchronous = NORMAL, as release.sql. Parameters (named):
--   :names   TEXT, a JSON array of 1 to 1000 distinct names (check it yourself)
--   :holder  TEXT, 1 to 200 characters
-- Result: one row (name TEXT) per lease given back; a name of :names with no row
-- was not held by :holder. SQLite has no NOTIFY: waiters poll.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_leases
   SET released   = 1,
       expires_at = (SELECT now FROM clock),
       releases   = releases + 1
 WHERE name IN (SELECT value FROM json_each(:names)) AND holder = :holder AND NOT released
RETURNING name;
