-- release_shared: give back the share of lease :name that reader :holder holds, of
-- epoch :fence (NULL: whatever epoch), whatever its id (release_share.sql names it); release.sql and release_tenure.sql give back
-- the exclusive holder's lease, and a reader's when they find none (contract:
-- lease_release). Run it in the same BEGIN IMMEDIATE ... COMMIT as release.sql
-- (or release_tenure.sql) when that returned no row. Parameters (named):
--   :name    TEXT
--   :holder  TEXT
--   :fence   INTEGER or NULL
-- Result: one row (ours INTEGER: 1 when the share was still its own, no exclusive
-- grant since its epoch; 0 when it was not) when a share was given back; no row
-- when :holder held none. A release records 'released' under 'all'.
INSERT INTO pylease_events (at, name, event, holder, fence)
SELECT round((julianday('now') - 2440587.5) * 86400.0, 3), s.name, 'released', s.holder, s.epoch
  FROM pylease_shared AS s
  JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch
 WHERE s.name = :name AND s.holder = :holder AND (:fence IS NULL OR s.epoch = :fence)
   AND (SELECT value FROM pylease_settings WHERE name = 'history') = 'all';

DELETE FROM pylease_shared
 WHERE name = :name AND holder = :holder AND (:fence IS NULL OR epoch = :fence)
RETURNING epoch = (SELECT l.fence FROM pylease_leases AS l WHERE l.name = :name);
