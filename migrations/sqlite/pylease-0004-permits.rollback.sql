-- pylease 0004 rollback (SQLite): no permits and no kind per name (all lost).
DROP TRIGGER pylease_semaphore_names_check;
DROP VIEW pylease_semaphore_names;
DROP TRIGGER pylease_permit_limits_set;
DROP VIEW pylease_permit_limits;
DROP TRIGGER pylease_permit_claims_check;
DROP VIEW pylease_permit_claims;
DROP TRIGGER pylease_permits_history_released;
DROP TRIGGER pylease_permits_history_granted;
ALTER TABLE pylease_events DROP COLUMN slot;
DROP TRIGGER pylease_permits_fences_exhausted;
DROP TRIGGER pylease_permits_keep_rows;
DROP TRIGGER pylease_permits_update_check;
DROP TABLE pylease_permits;
DROP TRIGGER pylease_leases_register;
DROP TABLE pylease_names;
