-- member_holds: is :member a live member of group :grp with :incarnation?
-- (contract: member_holds).
--
-- To fence a write by membership, run this and the write in one BEGIN IMMEDIATE ...
-- COMMIT transaction: SQLite's write lock then keeps every join out until the write
-- is committed. Alone, it may run in autocommit. Parameters (named):
--   :grp          TEXT
--   :member       TEXT
--   :incarnation  INTEGER
-- Result: one row (holds INTEGER, 1 or 0).
SELECT EXISTS (
    SELECT 1
      FROM pylease_members
     WHERE grp = :grp AND member = :member AND incarnation = :incarnation
       AND expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
) AS holds;
