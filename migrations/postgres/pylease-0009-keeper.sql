-- pylease 0009: the keeper renews everything a process holds, whatever its kind,
-- in one statement per tick (contract revision 3, section 5, "the keeper across
-- kinds"; issue 24). Keep sql/postgres/schema.sql in step.
--   * pylease_renew_held(kinds, names, holders, ttls): leases as lease_renew_each,
--     a holder's slots of a semaphore as permit_renew, each at its own ttl. Internal:
--     not part of the contract, executable by PUBLIC since the keeper runs as the
--     application's role.
-- depends: pylease-0008-permits

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- The keeper's renewal of everything a process holds, whatever its kind, in one
-- statement: per element, in order, whether it was renewed, the expiry granted and
-- the server's clock when it was (NULLs when not). kinds[i] says what element i is:
-- 'lease' renews the lease names[i] of holders[i] as lease_renew_each does; 'permit'
-- renews every slot of the semaphore names[i] that holders[i] holds, all or nothing
-- as permit_renew does, and answers the earliest expiry of its slots. Each at its own
-- ttl (NULL: its last one). One element's loss or kind mismatch (a lease element of a
-- semaphore's name) is that element's false, never an error of the others. Lease rows
-- are locked in name order, then slots in (name, slot) order, as by every statement
-- that locks several: two keepers of overlapping sets never deadlock. Internal: the
-- keeper's, not part of the contract.
CREATE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[], ttls interval[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
    l_at  bigint[];
    l_exp timestamptz[];
    p_at  bigint[];
    p_exp timestamptz[];
BEGIN
    IF pylease_renew_held.ttls IS NULL THEN
        RAISE EXCEPTION 'pylease: ttls must not be NULL' USING ERRCODE = '22023', COLUMN = 'ttls';
    END IF;
    IF pylease_renew_held.names IS NULL OR pylease_renew_held.holders IS NULL
       OR cardinality(pylease_renew_held.names) <> cardinality(pylease_renew_held.holders)
       OR cardinality(pylease_renew_held.ttls) <> cardinality(pylease_renew_held.names)
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                    pylease_renew_held.ttls);
        PERFORM pylease_refuse_standby('pylease_renew_held');
    END IF;
    IF pylease_renew_held.kinds IS NULL
       OR cardinality(pylease_renew_held.kinds) <> cardinality(pylease_renew_held.names)
       OR EXISTS (SELECT FROM unnest(pylease_renew_held.kinds) AS u(v)
                   WHERE v IS NULL OR v NOT IN ('lease', 'permit'))
    THEN
        RAISE EXCEPTION 'pylease: kinds must hold ''lease'' or ''permit'' for each element of names'
            USING ERRCODE = '22023', COLUMN = 'kinds';
    END IF;

    -- Leases, as lease_renew_each. FOR NO KEY UPDATE passes the FOR KEY SHARE of a
    -- holder's fenced transaction.
    WITH wanted AS (
        SELECT u.n, u.h, u.t, u.i
          FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                      pylease_renew_held.holders, pylease_renew_held.ttls)
               WITH ORDINALITY AS u(k, n, h, t, i)
         WHERE u.k = 'lease'
           AND CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                      OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                    THEN pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                             pylease_renew_held.ttls) IS NULL
                    ELSE true END
    ), locked AS (
        SELECT l.name, w.h, w.t
          FROM wanted AS w JOIN pylease_leases AS l ON l.name = w.n AND l.holder = w.h
         WHERE NOT l.released
         ORDER BY l.name
           FOR NO KEY UPDATE OF l
    ), renewed AS (
        UPDATE pylease_leases AS l
           SET ttl        = coalesce(k.t, l.ttl),
               renewed_at = t_now,
               expires_at = greatest(l.expires_at, t_now + coalesce(k.t, l.ttl))
          FROM locked AS k
         WHERE l.name = k.name AND l.holder = k.h
        RETURNING l.name, l.holder, l.expires_at
    )
    SELECT array_agg(w.i), array_agg(r.expires_at) INTO l_at, l_exp
      FROM wanted AS w JOIN renewed AS r ON r.name = w.n AND r.holder = w.h;

    -- Semaphores, as permit_renew: a holder's slots are renewed only when they are
    -- all still its own (as many as it was granted together).
    WITH wanted AS (
        SELECT u.n, u.h, u.t, u.i
          FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                      pylease_renew_held.holders, pylease_renew_held.ttls)
               WITH ORDINALITY AS u(k, n, h, t, i)
         WHERE u.k = 'permit'
           AND CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                      OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                    THEN pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                             pylease_renew_held.ttls) IS NULL
                    ELSE true END
    ), locked AS (
        SELECT p.name, p.slot, p.permits, w.h, w.t
          FROM wanted AS w JOIN pylease_permits AS p ON p.name = w.n AND p.holder = w.h
         WHERE NOT p.released
         ORDER BY p.name, p.slot
           FOR NO KEY UPDATE OF p
    ), whole AS (
        SELECT k.name, k.h FROM (SELECT DISTINCT k.name, k.slot, k.permits, k.h FROM locked AS k) AS k
         GROUP BY k.name, k.h
        HAVING count(*) = min(k.permits) AND count(*) = max(k.permits)
    ), renewed AS (
        UPDATE pylease_permits AS p
           SET ttl        = coalesce(k.t, p.ttl),
               renewed_at = t_now,
               expires_at = greatest(p.expires_at, t_now + coalesce(k.t, p.ttl))
          FROM locked AS k JOIN whole AS o ON o.name = k.name AND o.h = k.h
         WHERE p.name = k.name AND p.slot = k.slot
        RETURNING p.name, p.holder, p.expires_at
    )
    SELECT array_agg(w.i), array_agg(r.expires_at) INTO p_at, p_exp
      FROM wanted AS w
      JOIN (SELECT r.name, r.holder, min(r.expires_at) AS expires_at
              FROM renewed AS r GROUP BY r.name, r.holder) AS r
        ON r.name = w.n AND r.holder = w.h;

    RETURN QUERY
    SELECT u.n, x.e IS NOT NULL, x.e, CASE WHEN x.e IS NOT NULL THEN t_now END
      FROM unnest(pylease_renew_held.names) WITH ORDINALITY AS u(n, i)
      LEFT JOIN (SELECT a.i, a.e FROM unnest(coalesce(l_at, '{}'), coalesce(l_exp, '{}')) AS a(i, e)
                 UNION ALL
                 SELECT b.i, b.e FROM unnest(coalesce(p_at, '{}'), coalesce(p_exp, '{}')) AS b(i, e)
                ) AS x ON x.i = u.i
     ORDER BY u.i;
END
$$;

COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[]) IS
    'pylease (internal, the keeper''s): renew leases and permits of several holders in one statement, each at its own ttl.';
