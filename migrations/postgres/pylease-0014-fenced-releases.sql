-- pylease 0014: releases of permits and of several names that name their tenure
-- (issue 24), as a lease's release does since 0006. Keep sql/postgres/schema.sql in step.
--   * permit_release(name, holder, slot, fence) frees the holder's slots only while it
--     holds that slot with that fence; lease_release_all(names, holder, fences) frees
--     each name only in the tenure its fence names. So a late release of an earlier
--     tenure of a holder the caller reuses (sent before it expired, run after the same
--     holder was granted a new tenure) frees nothing, and nobody is granted what the
--     later tenure's holder believes it holds.
--   * permit_release(name, holder) and lease_release_all(names, holder) stay, as calls
--     of these with NULL tenures (SQL functions whose bodies are parsed at creation,
--     as 0012's).
-- depends: pylease-0013-shared

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Give back the tenure of permits that holds slot `slot` with fence `fence`: every slot
-- this holder holds, while it still holds that one (a holder's slots are one tenure,
-- granted together); true when they were all still its own. A late release of an
-- earlier tenure (sent before it expired and a new tenure was granted to the same
-- holder) then frees nothing. A NULL slot or fence matches any (both NULL: as
-- permit_release(name, holder)). The slots are locked first and the tenure is told
-- from the locked rows, as they are once locked. NOTIFY pylease when any was freed;
-- without the WAL flush when the release is the first write of its transaction, as
-- lease_release. Neither slot nor fence has a DEFAULT: a call with two arguments
-- still means permit_release(name, holder) alone.
CREATE FUNCTION permit_release(name text, holder text, slot integer, fence bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   bigint;
    whole   boolean;
    history text;
    ignored text;
BEGIN
    IF permit_release.name IS NULL OR permit_release.name = '' OR length(permit_release.name) > 200
       OR permit_release.holder IS NULL OR permit_release.holder = ''
       OR length(permit_release.holder) > 200 OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', permit_release.name);
        PERFORM pylease_check_key('holder', permit_release.holder);
        PERFORM pylease_refuse_standby('permit_release');
    END IF;
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;
    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;

    t_now := clock_timestamp();
    WITH locked AS (
        SELECT p.slot, p.permits, p.fence FROM pylease_permits AS p
         WHERE p.name = permit_release.name AND p.holder = permit_release.holder AND NOT p.released
         ORDER BY p.slot
           FOR NO KEY UPDATE OF p
    ), tenure AS (
        SELECT k.slot, k.permits FROM locked AS k
         WHERE EXISTS (SELECT FROM locked AS m
                        WHERE (permit_release.slot IS NULL OR m.slot = permit_release.slot)
                          AND (permit_release.fence IS NULL OR m.fence = permit_release.fence))
    ), given AS (
        UPDATE pylease_permits AS p
           SET released   = true,
               expires_at = t_now,
               releases   = p.releases + 1
          FROM tenure AS k
         WHERE p.name = permit_release.name AND p.slot = k.slot
        RETURNING p.slot, p.fence
    ), recorded AS (
        INSERT INTO pylease_events (at, name, event, holder, fence, slot)
        SELECT t_now, permit_release.name, 'released', permit_release.holder, g.fence, g.slot
          FROM given AS g
         WHERE history = 'all'
    )
    SELECT count(*), count(*) = min(k.permits) AND count(*) = max(k.permits)
      INTO freed, whole FROM tenure AS k;
    IF freed = 0 THEN
        RETURN false;
    END IF;
    ignored := pg_notify('pylease', permit_release.name);
    RETURN whole;
END
$$;

-- Give back every slot this holder holds, whatever its tenure (the function above
-- with a NULL slot and fence; an SQL function inlined into its caller's statement).
CREATE OR REPLACE FUNCTION permit_release(name text, holder text) RETURNS boolean
LANGUAGE sql
RETURN permit_release(permit_release.name, permit_release.holder, NULL::integer, NULL::bigint);

-- Give back every lease of names that this holder still holds, each only in the
-- tenure fences[i] names (a NULL array or element: whatever tenure the holder has):
-- one (name, released) row per name, in the order of names. So a late release of an
-- earlier tenure of the same holder frees nothing. Rows are locked in name order, and
-- the fence is matched on the locked row. NOTIFY pylease for each name freed; without
-- the WAL flush when this is the first write of its transaction, as lease_release.
-- fences has no DEFAULT: a call with two arguments still means the function below.
CREATE FUNCTION lease_release_all(names text[], holder text, fences bigint[])
RETURNS TABLE(name text, released boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   text[];
    history text;
    ignored text;
BEGIN
    PERFORM pylease_check_names('names', lease_release_all.names);
    PERFORM pylease_check_key('holder', lease_release_all.holder);
    IF cardinality(lease_release_all.fences) <> cardinality(lease_release_all.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_release_all');
    END IF;
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;
    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;

    t_now := clock_timestamp();
    WITH locked AS (
        SELECT l.name
          FROM unnest(lease_release_all.names) WITH ORDINALITY AS u(n, i)
          JOIN pylease_leases AS l ON l.name = u.n
         WHERE l.holder = lease_release_all.holder AND NOT l.released
           AND (lease_release_all.fences[u.i] IS NULL OR l.fence = lease_release_all.fences[u.i])
         ORDER BY l.name
           FOR NO KEY UPDATE OF l
    ), given AS (
        UPDATE pylease_leases AS l
           SET released   = true,
               expires_at = t_now,
               releases   = l.releases + 1
          FROM locked AS k
         WHERE l.name = k.name
        RETURNING l.name, l.fence
    ), recorded AS (
        INSERT INTO pylease_events (at, name, event, holder, fence)
        SELECT t_now, g.name, 'released', lease_release_all.holder, g.fence
          FROM given AS g WHERE history = 'all'
    )
    SELECT coalesce(array_agg(g.name), '{}') INTO freed FROM given AS g;
    PERFORM pg_notify('pylease', f.n) FROM unnest(freed) AS f(n);

    RETURN QUERY
    SELECT u.n, u.n = ANY (freed)
      FROM unnest(lease_release_all.names) WITH ORDINALITY AS u(n, i)
     ORDER BY u.i;
END
$$;

-- Give back every lease of names that this holder still holds, whatever its tenures
-- (the function above with NULL fences).
CREATE OR REPLACE FUNCTION lease_release_all(names text[], holder text)
RETURNS TABLE(name text, released boolean)
LANGUAGE sql
BEGIN ATOMIC
    SELECT r.name, r.released
      FROM lease_release_all(lease_release_all.names, lease_release_all.holder,
                             NULL::bigint[]) AS r;
END;

COMMENT ON FUNCTION permit_release(text, text, integer, bigint) IS
    'pylease: free every slot this holder holds while it holds this slot with this fence; true when they were all still its own. NOTIFY pylease when freed.';
COMMENT ON FUNCTION lease_release_all(text[], text, bigint[]) IS
    'pylease: give back every lease of names this holder still holds in the tenure fences[i] names; a (name, released) row per name.';
