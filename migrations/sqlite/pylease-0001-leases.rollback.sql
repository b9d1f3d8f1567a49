-- pylease 0001 rollback (SQLite): drops the lease table, with every lease in it.
DROP TRIGGER pylease_leases_keep_rows;
DROP TRIGGER pylease_leases_update_check;
DROP TRIGGER pylease_leases_insert_check;
DROP TABLE pylease_leases;
