-- history: recorded events, newest first (ties: the later recorded first), of
-- :name or of every name (contract: lease_history). What is recorded is set by
-- the row 'history' of pylease_settings (rare | all | none; see the migration).
--
-- A read: runs in autocommit. Parameters (named):
--   :name           TEXT, or NULL for every name
--   :since          REAL unix seconds or NULL: only events at or after it
--   :since_seconds  REAL or NULL: only events at most this long ago (SQLite's clock)
--   :max_rows       INTEGER, 1 to 10000 (check it yourself)
-- Result: rows (at REAL unix seconds, name TEXT, event TEXT, holder TEXT,
-- fence INTEGER, previous_holder TEXT or NULL, slot INTEGER: a semaphore's slot,
-- NULL for a lease).
SELECT at, name, event, holder, fence, previous_holder, slot
  FROM pylease_events
 WHERE (:name IS NULL OR name = :name)
   AND at >= coalesce(:since,
                      round((julianday('now') - 2440587.5) * 86400.0, 3) - :since_seconds,
                      -9e999)
 ORDER BY at DESC, id DESC
 LIMIT :max_rows;
