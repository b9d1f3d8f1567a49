-- status_page: the names that start with :prefix, in name order, at most :max_rows
-- of them: each one's status and counters, and how many names start with :prefix.
--
-- A read: runs in autocommit. Parameters (named):
--   :prefix    TEXT; '' for every name
--   :max_rows  INTEGER, or NULL for every matching name
-- Result: rows (name TEXT, holder TEXT, fence INTEGER, acquired_at REAL,
-- renewed_at REAL, expires_at REAL, held INTEGER 1 or 0, state TEXT, ttl REAL
-- seconds, grants INTEGER, takeovers INTEGER, steals INTEGER, releases INTEGER,
-- matching INTEGER), ordered by name; the columns of status.sql, then those of
-- counters.sql, then the number of names that start with :prefix (also those
-- after the :max_rows returned).
SELECT l.name, l.holder, l.fence, l.acquired_at, l.renewed_at, l.expires_at,
       NOT l.released AND l.expires_at > c.now AS held,
       CASE WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
            WHEN l.released THEN 'released' ELSE 'expired' END AS state,
       l.ttl, l.grants, l.takeovers, l.steals, l.releases,
       (SELECT count(*) FROM pylease_leases AS m
         WHERE substr(m.name, 1, length(:prefix)) = :prefix) AS matching
  FROM pylease_leases AS l, (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3) AS now) AS c
 WHERE substr(l.name, 1, length(:prefix)) = :prefix
 ORDER BY l.name
 LIMIT coalesce(:max_rows, -1);
