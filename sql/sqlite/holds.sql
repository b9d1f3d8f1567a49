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
-- A reader holds with its epoch as :fence while its share is unexpired and the
-- epoch is still the name's fence (no exclusive grant since).
-- Result: one row (holds INTEGER, 1 or 0).
SELECT EXISTS (
    SELECT 1
      FROM pylease_leases
     WHERE name = :name AND holder = :holder AND fence = :fence AND NOT released
       AND expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
) OR EXISTS (
    SELECT 1
      FROM pylease_shared AS s
      JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch
     WHERE s.name = :name AND s.holder = :holder AND s.epoch = :fence
       AND s.expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
) AS holds;
