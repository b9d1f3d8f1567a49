-- Undo pylease 0009: the keeper renews each kind with its own function again.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION pylease_renew_held(text[], text[], text[], interval[]);
