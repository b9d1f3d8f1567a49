-- pylease 0005 rollback (SQLite): rows are never deleted again; the floor is lost.
DROP TRIGGER pylease_permits_floor;
DROP TRIGGER pylease_leases_floor;

CREATE TRIGGER pylease_leases_keep_rows BEFORE DELETE ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: lease rows are never deleted (their fences must not go back)');
END;

CREATE TRIGGER pylease_permits_keep_rows BEFORE DELETE ON pylease_permits
BEGIN
    SELECT RAISE(ABORT, 'pylease: permit rows are never deleted (their fences must not go back)');
END;

DROP TABLE pylease_fence_floor;
