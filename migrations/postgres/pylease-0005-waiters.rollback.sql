-- Undo pylease 0005: no queue of waiting processes (waiters then all claim on a
-- release, as before 0005).

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION lease_unwait(text, text, boolean);
DROP FUNCTION lease_wait(text, text, interval);
DROP TABLE pylease_waiters;
