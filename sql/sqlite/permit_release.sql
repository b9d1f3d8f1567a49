-- permit_release: free every slot of semaphore :name that :holder still holds
-- (contract: permit_release).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. A release lost in
-- a crash only keeps the slots until their expiry, so it may commit with
-- PRAGMA synchronous = NORMAL. Parameters (named):
--   :name    TEXT, 1 to 200 characters
--   :holder  TEXT, 1 to 200 characters
-- Result: one row (permits INTEGER: how many slots the holder was granted) per
-- slot freed. The holder's slots were all still its own when there are rows and
-- each one's permits equals the number of rows; no row: it held none. SQLite has
-- no NOTIFY: waiters poll.
UPDATE pylease_permits
   SET released   = 1,
       expires_at = round((julianday('now') - 2440587.5) * 86400.0, 3),
       releases   = releases + 1
 WHERE name = :name AND holder = :holder AND NOT released
RETURNING permits;
