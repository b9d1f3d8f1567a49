-- Undo pylease 0014: permit_release(name, holder) and lease_release_all(names, holder)
-- get their bodies of 0008 back (so that nothing depends on what 0014 added), then the
-- releases that name their tenure are dropped.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Give back every slot this holder holds: true when they were all still its own.
-- The ones still its own are freed either way. NOTIFY pylease when any was freed.
-- Without the WAL flush when the release is the first write of its transaction,
-- as lease_release.
CREATE OR REPLACE FUNCTION permit_release(name text, holder text) RETURNS boolean
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
        SELECT p.slot, p.permits FROM pylease_permits AS p
         WHERE p.name = permit_release.name AND p.holder = permit_release.holder AND NOT p.released
         ORDER BY p.slot
           FOR NO KEY UPDATE OF p
    ), given AS (
        UPDATE pylease_permits AS p
           SET released   = true,
               expires_at = t_now,
               releases   = p.releases + 1
          FROM locked AS k
         WHERE p.name = permit_release.name AND p.slot = k.slot
        RETURNING p.slot, p.fence
    ), recorded AS (
        INSERT INTO pylease_events (at, name, event, holder, fence, slot)
        SELECT t_now, permit_release.name, 'released', permit_release.holder, g.fence, g.slot
          FROM given AS g
         WHERE history = 'all'
    )
    SELECT count(*), count(*) = min(k.permits) AND count(*) = max(k.permits)
      INTO freed, whole FROM locked AS k;
    IF freed = 0 THEN
        RETURN false;
    END IF;
    ignored := pg_notify('pylease', permit_release.name);
    RETURN whole;
END
$$;

-- Give back every lease of names that this holder still holds: one (name, released)
-- row per name, in the order of names. Rows are locked in name order. NOTIFY pylease
-- for each name freed; without the WAL flush when this is the first write of its
-- transaction, as lease_release.
CREATE OR REPLACE FUNCTION lease_release_all(names text[], holder text)
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
        SELECT l.name FROM pylease_leases AS l
         WHERE l.name = ANY (lease_release_all.names) AND l.holder = lease_release_all.holder
           AND NOT l.released
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


DROP FUNCTION lease_release_all(text[], text, bigint[]);
DROP FUNCTION permit_release(text, text, integer, bigint);
