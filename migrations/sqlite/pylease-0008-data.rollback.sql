-- pylease 0008 rollback (SQLite): no data on leases, no step-down requests. Every
-- lease's data and request is lost.
DROP TRIGGER pylease_leases_data_update_check;
DROP TRIGGER pylease_leases_data_insert_check;
ALTER TABLE pylease_leases DROP COLUMN release_requested_by;
ALTER TABLE pylease_leases DROP COLUMN data;
