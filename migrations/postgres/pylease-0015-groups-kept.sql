-- pylease 0015: groups as operators and the keeper see them (issue 27). Keep
-- sql/postgres/schema.sql in step.
--   * group_status(grp): every group ever joined (or one), with how many members are
--     live, the last incarnation it issued and the earliest expiry of a live member:
--     what `pylease status` and `pylease metrics` list apart from leases.
-- depends: pylease-0013-shared

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Every group ever joined (all when grp is NULL), ordered by name (by its bytes, as
-- SQLite orders): its live members, the last incarnation it issued, and the earliest
-- expiry of a live member (NULL when none is live).
CREATE FUNCTION group_status(grp text DEFAULT NULL)
RETURNS TABLE(grp text, members integer, incarnation bigint, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_group($1) WHERE $1 IS NOT NULL;
    SELECT g.grp, count(m.member)::integer, g.incarnation, min(m.expires_at)
      FROM pylease_groups AS g
      LEFT JOIN pylease_members AS m ON m.grp = g.grp AND m.expires_at > clock_timestamp()
     WHERE $1 IS NULL OR g.grp = $1
     GROUP BY g.grp, g.incarnation
     ORDER BY g.grp COLLATE "C";
$$;

COMMENT ON FUNCTION group_status(text) IS
    'pylease: every group ever joined (or one): live members, the last incarnation issued, the earliest expiry of a live member.';
