-- counters: per name ever claimed, or only :name, how many grants (every new
-- tenure), takeovers (after an expiry without a release), steals (from an
-- unexpired holder) and releases there were (contract: lease_counters); a
-- semaphore's are the sums over its slots.
--
-- A read: runs in autocommit. Parameters (named):
--   :name  TEXT, or NULL for every name
-- Result: rows (name TEXT, grants INTEGER, takeovers INTEGER, steals INTEGER,
-- releases INTEGER), ordered by name.
SELECT name, grants, takeovers, steals, releases
  FROM pylease_leases
 WHERE :name IS NULL OR name = :name
UNION ALL
SELECT name, sum(grants), sum(takeovers), sum(steals), sum(releases)
  FROM pylease_permits
 WHERE :name IS NULL OR name = :name
 GROUP BY name
 ORDER BY name;
