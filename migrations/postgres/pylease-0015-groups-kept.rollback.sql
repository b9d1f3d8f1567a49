-- Undo pylease 0015.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION group_status(text);
