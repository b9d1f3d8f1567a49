-- holds: is lease :name unexpired and held by :holder with :fence? (contract:
-- lease_holds).
--
-- To fence a write, run this and the write in one BEGIN IMMEDIATE ...
-- COMMIT transaction: SQLite's write lock then keeps every takeover out until
-- the write is committed (the equivalent of PostgreSQL's FOR SHARE), and a
-- stale holder's write is skipped. Alone, it may run in autocommit.
-- Parameters (named):
--   :name    TEXT
--   :holder  TEXT
--   :fence   INTEGER
-- Result: one row (holds INTEGER, 1 or 0).
SELECT EXISTS (
    SELECT 1
      FROM pylease_leases
     WHERE name = :name AND holder = :holder AND fence = :fence AND NOT released
       AND expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
) AS holds;
