-- pylease 0001 rollback: drops the SQL API and the lease table, with every lease in it.
DROP FUNCTION lease_status(text);
DROP FUNCTION lease_holds(text, text, bigint);
DROP FUNCTION lease_steal(text, interval, text, interval);
DROP FUNCTION lease_release(text, text, interval);
DROP FUNCTION lease_renew_many(text[], text[], interval);
DROP FUNCTION lease_renew(text, text, interval);
DROP FUNCTION lease_claim(text, interval, text);
DROP FUNCTION pylease_check_span(text, interval);
DROP FUNCTION pylease_check_ttl(text, interval);
DROP FUNCTION pylease_check_key(text, text);
DROP TABLE pylease_leases;
