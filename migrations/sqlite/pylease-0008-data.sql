-- pylease 0008 (SQLite): data on a lease and leaders that step down when asked
-- (contract revision 3, section 5.4). Keep sql/sqlite/schema.sql in step.
--   * pylease_leases gains data (JSON text, the tenure's: every new grant replaces
--     it, NULL unless the grant gives some; at most 8192 characters) and
--     release_requested_by (a step-down request, until the tenure ends);
--   * set_data.sql and request_release.sql; renew_held.sql answers a lease's request.
-- SQLite has no NOTIFY: its watchers read the status (contract 5.4 lets them
-- coalesce where LISTEN cannot work).
-- depends: pylease-0007-shared

ALTER TABLE pylease_leases ADD COLUMN data TEXT;
ALTER TABLE pylease_leases ADD COLUMN release_requested_by TEXT;

CREATE TRIGGER pylease_leases_data_insert_check BEFORE INSERT ON pylease_leases
WHEN NEW.data IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
END;

CREATE TRIGGER pylease_leases_data_update_check BEFORE UPDATE OF data ON pylease_leases
WHEN NEW.data IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
END;
