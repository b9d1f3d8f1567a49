-- pylease 0002 (SQLite): a name whose fences are exhausted (2^63-1) cannot be
-- granted again. Keep sql/sqlite/schema.sql in step (a test compares).
-- claim.sql and steal.sql compute no fence (NULL) past the last one; this
-- trigger turns that into the error, before the row changes. (The other
-- changes of contract revision 2, renewals that never move an expiry earlier
-- and renew_each.sql, are statements of sql/sqlite/, not schema.)
-- depends: pylease-0001-leases

CREATE TRIGGER pylease_leases_fences_exhausted BEFORE UPDATE OF fence ON pylease_leases
WHEN NEW.fence IS NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this lease has used every fence (2^63-1)');
END;
