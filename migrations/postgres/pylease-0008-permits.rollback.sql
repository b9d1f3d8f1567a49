-- Undo pylease 0008: no permits, no claims of several names, no kind per name; the
-- 0003 definitions of lease_counters and lease_history. Every semaphore, and the
-- slot of every history event, is lost.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION lease_release_all(text[], text);
DROP FUNCTION lease_claim_all(text[], interval, text);
DROP FUNCTION permit_revoke(text, text);
DROP FUNCTION permit_set_max(text, integer);
DROP FUNCTION permit_status(text);
DROP FUNCTION permit_holds(text, text, bigint);
DROP FUNCTION permit_release(text, text);
DROP FUNCTION permit_renew(text, text, interval);
DROP FUNCTION permit_claim(text, integer, interval, text, integer);
DROP TRIGGER pylease_leases_register ON pylease_leases;
DROP FUNCTION pylease_register_lease();
DROP FUNCTION pylease_check_names(text, text[]);
DROP FUNCTION pylease_check_count(text, integer, integer, text);

-- Per name, how many grants (every new tenure), takeovers (after an expiry
-- without a release), steals (from an unexpired holder) and releases there were.
CREATE OR REPLACE FUNCTION lease_counters(name text DEFAULT NULL)
RETURNS TABLE(name text, grants bigint, takeovers bigint, steals bigint, releases bigint)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT l.name, l.grants, l.takeovers, l.steals, l.releases
      FROM pylease_leases AS l
     WHERE $1 IS NULL OR l.name = $1
     ORDER BY l.name;
$$;

DROP FUNCTION lease_history(text, timestamptz, integer);
DROP FUNCTION pylease_history_rows(text, timestamptz, integer);

-- lease_history's rows, one query per case, so that each one uses its index.
CREATE FUNCTION pylease_history_rows(lease text, since timestamptz, max_rows integer)
RETURNS TABLE(at timestamptz, name text, event text, holder text, fence bigint, previous_holder text)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'pylease: max_rows must be between 1 and 10000'
            USING ERRCODE = '22023', COLUMN = 'max_rows';
    END IF;
    IF lease IS NULL THEN
        RETURN QUERY
        SELECT e.at, e.name, e.event, e.holder, e.fence, e.previous_holder
          FROM pylease_events AS e
         WHERE e.at >= coalesce(pylease_history_rows.since, '-infinity')
         ORDER BY e.at DESC, e.id DESC
         LIMIT pylease_history_rows.max_rows;
    ELSE
        PERFORM pylease_check_key('name', lease);
        RETURN QUERY
        SELECT e.at, e.name, e.event, e.holder, e.fence, e.previous_holder
          FROM pylease_events AS e
         WHERE e.name = lease AND e.at >= coalesce(pylease_history_rows.since, '-infinity')
         ORDER BY e.at DESC, e.id DESC
         LIMIT pylease_history_rows.max_rows;
    END IF;
END
$$;

-- Events newest first (ties: the later recorded first), of one name or all,
-- since a moment (inclusive), at most max_rows (1 to 10000).
CREATE FUNCTION lease_history(name text DEFAULT NULL, since timestamptz DEFAULT NULL,
                              max_rows integer DEFAULT 100)
RETURNS TABLE(at timestamptz, name text, event text, holder text, fence bigint, previous_holder text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT * FROM pylease_history_rows($1, $2, $3);
$$;

COMMENT ON FUNCTION lease_counters(text) IS
    'pylease: per lease name, how many grants, takeovers, steals and releases there were.';
COMMENT ON FUNCTION lease_history(text, timestamptz, integer) IS
    'pylease: recorded events (pylease.history), newest first, since a moment, at most max_rows.';
REVOKE EXECUTE ON FUNCTION pylease_history_rows(text, timestamptz, integer) FROM PUBLIC;

ALTER TABLE pylease_events DROP COLUMN slot;
DROP TABLE pylease_permits;
DROP TABLE pylease_names;
