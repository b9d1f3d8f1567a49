-- group_status: every group ever joined, or group :grp (contract: group_status, 0015).
--
-- A read: runs in autocommit. Parameters (named):
--   :grp  TEXT, or NULL for every group
-- Result: rows (grp TEXT, members INTEGER live, incarnation INTEGER the last issued,
-- expires_at REAL the earliest expiry of a live member or NULL), ordered by grp;
-- times are unix seconds (UTC) from SQLite's clock.
SELECT g.grp, count(m.member), g.incarnation, min(m.expires_at)
  FROM pylease_groups AS g
  LEFT JOIN pylease_members AS m
    ON m.grp = g.grp AND m.expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
 WHERE :grp IS NULL OR g.grp = :grp
 GROUP BY g.grp, g.incarnation
 ORDER BY g.grp;
