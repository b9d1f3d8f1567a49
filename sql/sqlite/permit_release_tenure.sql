-- permit_release_tenure: free every slot of semaphore :name that :holder still holds,
-- only while it holds slot :slot with fence :fence (a holder's slots are one tenure,
-- granted together), so that a late release of an earlier tenure frees nothing once
-- the same holder holds slots of the name again (contract: permit_release with a slot
-- and a fence). A NULL :slot or :fence matches any. A file of its own, so that
-- permit_release.sql keeps the parameters other languages bind.
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. A release lost in
-- a crash only keeps the slots until their expiry, so it may commit with
-- PRAGMA synchronous = NORMAL. Parameters (named):
--   :name    TEXT, 1 to 200 characters
--   :holder  TEXT, 1 to 200 characters
--   :slot    INTEGER or NULL, the slot the tenure was granted
--   :fence   INTEGER or NULL, that slot's fence
-- Result: as permit_release.sql: one row (permits INTEGER) per slot freed; no row when
-- the holder held none in that tenure. SQLite has no NOTIFY: waiters poll.
UPDATE pylease_permits
   SET released   = 1,
       expires_at = round((julianday('now') - 2440587.5) * 86400.0, 3),
       releases   = releases + 1
 WHERE name = :name AND holder = :holder AND NOT released
   -- Uncorrelated: decided once, before any slot is freed.
   AND EXISTS (SELECT 1 FROM pylease_permits AS m
                WHERE m.name = :name AND m.holder = :holder AND NOT m.released
                  AND (:slot IS NULL OR m.slot = :slot)
                  AND (:fence IS NULL OR m.fence = :fence))
RETURNING permits;
