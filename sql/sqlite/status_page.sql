-- status_page: the names that start with :prefix, in name order, at most :max_rows
-- of them: each one's status and counters, and how many names start with :prefix.
--
-- A read: runs in autocommit. Parameters (named):
--   :prefix    TEXT; '' for every name
--   :max_rows  INTEGER, or NULL for every matching name
-- Result: rows (name TEXT, holder TEXT, fence INTEGER, acquired_at REAL,
-- renewed_at REAL, expires_at REAL, held INTEGER 1 or 0, state TEXT, ttl REAL
-- seconds, shared INTEGER, data TEXT, release_requested_by TEXT, grants INTEGER, takeovers INTEGER, steals INTEGER,
-- releases INTEGER, matching INTEGER), ordered by name; the columns of
-- status.sql, then those of counters.sql, then the number of names that start
-- with :prefix (also those after the :max_rows returned).
SELECT l.name, CASE WHEN r.n > 0 THEN NULL ELSE l.holder END AS holder, l.fence,
       CASE WHEN r.n > 0 THEN r.acquired_at ELSE l.acquired_at END AS acquired_at,
       CASE WHEN r.n > 0 THEN r.renewed_at ELSE l.renewed_at END AS renewed_at,
       CASE WHEN r.n > 0 THEN r.expires_at ELSE l.expires_at END AS expires_at,
       coalesce(r.n > 0, 0) OR (NOT l.released AND l.expires_at > c.now) AS held,
       CASE WHEN r.n > 0 THEN 'shared'
            WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
            WHEN l.released THEN 'released' ELSE 'expired' END AS state,
       CASE WHEN r.n > 0 THEN r.ttl ELSE l.ttl END AS ttl,
       coalesce(r.n, 0) AS shared,
       CASE WHEN r.n > 0 THEN NULL ELSE l.data END AS data,
       CASE WHEN r.n > 0 OR l.released THEN NULL ELSE l.release_requested_by END
           AS release_requested_by,
       l.grants, l.takeovers, l.steals, l.releases,
       (SELECT count(*) FROM pylease_leases AS m
         WHERE substr(m.name, 1, length(:prefix)) = :prefix) AS matching
  FROM pylease_leases AS l
  JOIN (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3) AS now) AS c
  LEFT JOIN (SELECT s.name, count(*) AS n, min(s.acquired_at) AS acquired_at,
                    max(s.renewed_at) AS renewed_at, max(s.expires_at) AS expires_at,
                    max(s.ttl) AS ttl
               FROM pylease_shared AS s
               JOIN pylease_leases AS k ON k.name = s.name AND k.fence = s.epoch
              WHERE s.expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
              GROUP BY s.name) AS r ON r.name = l.name
 WHERE substr(l.name, 1, length(:prefix)) = :prefix
 ORDER BY l.name
 LIMIT coalesce(:max_rows, -1);
