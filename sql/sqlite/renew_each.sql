-- renew_each: renew many leases in one statement, each for the holder at the
-- same position with the ttl at the same position (contract: lease_renew_each).
-- Never earlier: each expiry becomes the later of the current one and now + ttl.
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :names    TEXT, a JSON array of names, e.g. '["sweep", "report"]'
--   :holders  TEXT, a JSON array of holders, as long as :names
--   :ttls     TEXT, a JSON array of ttls in seconds (or null: that lease's last
--             ttl), as long as :names
-- Result: one row (name TEXT, holder TEXT, expires_at REAL, renewed_at REAL:
-- the clock when renewed, unix seconds) per lease renewed; an element of :names
-- with no row was not renewed (released, or taken by someone else).
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name, holder, ttl) AS (
    SELECT n.value, h.value, t.value
      FROM json_each(:names) AS n
      JOIN json_each(:holders) AS h ON h.key = n.key
      JOIN json_each(:ttls) AS t ON t.key = n.key
)
UPDATE pylease_leases
   SET ttl        = coalesce((SELECT w.ttl FROM wanted AS w
                               WHERE w.name = pylease_leases.name
                                 AND w.holder = pylease_leases.holder), ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(
                        (SELECT w.ttl FROM wanted AS w
                          WHERE w.name = pylease_leases.name
                            AND w.holder = pylease_leases.holder), ttl))
 WHERE NOT released AND (name, holder) IN (SELECT name, holder FROM wanted)
RETURNING name, holder, expires_at, renewed_at;
