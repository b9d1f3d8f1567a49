-- permit_holds: does :holder hold an unexpired slot of semaphore :name with
-- :fence? (contract: permit_holds).
--
-- To fence a write, run this and the write in one BEGIN IMMEDIATE ... COMMIT
-- transaction: SQLite's write lock then keeps every grant out until the write is
-- committed. Alone, it may run in autocommit. Parameters (named):
--   :name    TEXT
--   :holder  TEXT
--   :fence   INTEGER
-- Result: one row (holds INTEGER, 1 or 0).
SELECT EXISTS (
    SELECT 1
      FROM pylease_permits
     WHERE name = :name AND holder = :holder AND fence = :fence AND NOT released
       AND expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
) AS holds;
