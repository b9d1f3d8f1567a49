-- release_all_tenure: give back every lease of :names that :holder still holds (an
-- expired lease that nobody took counts as held), each only in the tenure the fence
-- of the same place in :fences names, so that a late release of an earlier tenure
-- frees nothing once the same holder holds the names again (contract:
-- lease_release_all with fences). A NULL fence matches any tenure of the holder. A
-- file of its own, so that release_all.sql keeps the parameters other languages bind.
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT; it may commit with
-- PRAGMA synchronous = NORMAL, as release.sql. Parameters (named):
--   :names   TEXT, a JSON array of 1 to 1000 distinct names (check it yourself)
--   :holder  TEXT, 1 to 200 characters
--   :fences  TEXT, a JSON array of as many fences (INTEGER or null) as :names
-- Result: one row (name TEXT) per lease given back; a name of :names with no row
-- was not held by :holder in that tenure. SQLite has no NOTIFY: waiters poll.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
     wanted(n, f) AS (SELECT n.value, f.value
                        FROM json_each(:names) AS n JOIN json_each(:fences) AS f ON f.key = n.key)
UPDATE pylease_leases
   SET released   = 1,
       expires_at = (SELECT now FROM clock),
       releases   = releases + 1
 WHERE holder = :holder AND NOT released
   AND EXISTS (SELECT 1 FROM wanted AS w
                WHERE w.n = pylease_leases.name AND (w.f IS NULL OR w.f = pylease_leases.fence))
RETURNING name;
