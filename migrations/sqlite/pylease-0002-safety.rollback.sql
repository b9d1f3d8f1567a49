-- pylease 0002 rollback (SQLite).
DROP TRIGGER pylease_leases_fences_exhausted;
