-- renew_many: renew many leases in one statement, each for the holder at the
-- same position (contract: lease_renew_many). Never earlier, as renew.sql.
--
-- Readers' shares are renewed as in renew.sql.
--
-- Run its statements in order inside one BEGIN IMMEDIATE ... COMMIT (the last one
-- answers: under the write lock, what it reads is what the first two renewed).
-- Parameters (named):
--   :names        TEXT, a JSON array of names, e.g. '["sweep", "report"]'
--   :holders      TEXT, a JSON array of holders, as long as :names
--   :ttl_seconds  REAL or NULL (each lease's last granted ttl)
-- Result: one row (name TEXT, holder TEXT) per lease renewed; an element of
-- :names with no row was not renewed (released, or taken by someone else).
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name, holder) AS (
    SELECT n.value, h.value
      FROM json_each(:names) AS n
      JOIN json_each(:holders) AS h ON h.key = n.key
)
UPDATE pylease_leases
   SET ttl        = coalesce(:ttl_seconds, ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(:ttl_seconds, ttl))
 WHERE NOT released AND (name, holder) IN (SELECT name, holder FROM wanted);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name, holder) AS (
    SELECT n.value, h.value
      FROM json_each(:names) AS n
      JOIN json_each(:holders) AS h ON h.key = n.key
)
UPDATE pylease_shared
   SET ttl        = coalesce(:ttl_seconds, ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(:ttl_seconds, ttl))
 WHERE (name, holder) IN (SELECT name, holder FROM wanted)
   AND epoch = (SELECT l.fence FROM pylease_leases AS l WHERE l.name = pylease_shared.name);

WITH wanted(name, holder) AS (
    SELECT n.value, h.value
      FROM json_each(:names) AS n
      JOIN json_each(:holders) AS h ON h.key = n.key
)
SELECT l.name, l.holder FROM pylease_leases AS l
 WHERE NOT l.released AND (l.name, l.holder) IN (SELECT name, holder FROM wanted)
UNION
SELECT s.name, s.holder FROM pylease_shared AS s
  JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch
 WHERE (s.name, s.holder) IN (SELECT name, holder FROM wanted);
