-- Undo pylease 0011: no groups. Every group and member is lost (partition leases,
-- ordinary leases, stay).

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION group_assignment(text, integer);
DROP FUNCTION pylease_assignment(text[], integer);
DROP FUNCTION member_holds(text, text, bigint);
DROP FUNCTION group_members(text);
DROP FUNCTION group_leave(text, text);
DROP FUNCTION group_leave(text, text, bigint);
DROP FUNCTION group_renew(text, text, interval);
DROP FUNCTION group_renew(text, text, interval, bigint);
DROP FUNCTION group_join(text, text, interval, jsonb);
DROP FUNCTION pylease_check_data(jsonb);
DROP FUNCTION pylease_check_group(text);
DROP TABLE pylease_members;
DROP TABLE pylease_groups;
