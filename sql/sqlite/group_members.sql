-- group_members: the live members of group :grp (contract: group_members).
--
-- A read: runs in autocommit. Parameters (named):
--   :grp  TEXT
-- Result: rows (member TEXT, incarnation INTEGER, joined_at REAL, renewed_at REAL,
-- expires_at REAL, data TEXT JSON or NULL), ordered by member; times are unix
-- seconds (UTC) from SQLite's clock.
SELECT member, incarnation, joined_at, renewed_at, expires_at, data
  FROM pylease_members
 WHERE grp = :grp AND expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
 ORDER BY member;
