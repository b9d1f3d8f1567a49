-- group_leave: member :member leaves group :grp; with :incarnation, only that
-- incarnation (contract: group_leave).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. A leave lost in a
-- crash only keeps the member until its expiry, so it may commit with PRAGMA
-- synchronous = NORMAL. Parameters (named):
--   :grp          TEXT
--   :member       TEXT
--   :incarnation  INTEGER or NULL (whichever incarnation is live)
-- Result: one row (incarnation INTEGER) when the member was live and is now gone;
-- no row otherwise. The row stays, gone, until the group's next join.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_members
   SET expires_at = (SELECT now FROM clock)
 WHERE grp = :grp AND member = :member AND expires_at > (SELECT now FROM clock)
   AND (:incarnation IS NULL OR incarnation = :incarnation)
RETURNING incarnation;
