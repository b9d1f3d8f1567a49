-- renew_many: renew many leases in one statement, each for the holder at the
-- same position (contract: lease_renew_many). Never earlier, as renew.sql.
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
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
 WHERE NOT released AND (name, holder) IN (SELECT name, holder FROM wanted)
RETURNING name, holder;
