-- pylease 0005 (SQLite): names that are gone (contract revision 3, section 5.6).
-- Keep sql/sqlite/schema.sql in step (a test compares).
--   * pylease_fence_floor: one row, the highest fence any deleted lease row or
--     slot had (one host needs no buckets: SQLite serializes every write);
--   * rows of leases and slots may be deleted (prune.sql): a delete raises the
--     floor, and a new name's first grant starts above it (claim*.sql, steal.sql,
--     permit_claim.sql), so fences never go back.
-- depends: pylease-0004-permits

CREATE TABLE pylease_fence_floor (
    floor INTEGER NOT NULL CHECK (floor >= 0)
) STRICT;
INSERT INTO pylease_fence_floor (floor) VALUES (0);

DROP TRIGGER pylease_leases_keep_rows;
DROP TRIGGER pylease_permits_keep_rows;

CREATE TRIGGER pylease_leases_floor AFTER DELETE ON pylease_leases
BEGIN
    UPDATE pylease_fence_floor SET floor = max(floor, OLD.fence);
END;

CREATE TRIGGER pylease_permits_floor AFTER DELETE ON pylease_permits
BEGIN
    UPDATE pylease_fence_floor SET floor = max(floor, OLD.fence);
END;
