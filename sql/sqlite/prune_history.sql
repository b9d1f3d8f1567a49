-- prune_history: delete the events older than :older_than_seconds (contract:
-- lease_prune_history).
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :older_than_seconds  REAL, from 0 to 31622400 (366 days; check it yourself)
-- Result: one row (id INTEGER) per event deleted.
DELETE FROM pylease_events
 WHERE at < round((julianday('now') - 2440587.5) * 86400.0, 3) - :older_than_seconds
RETURNING id;
