-- pylease 0022: the keeper's usual batch, leases and members of groups, is renewed by
-- one statement (issue 27, bench target 13-member-tick). Keep sql/postgres/schema.sql
-- in step.
--   * pylease_renew_held renews a batch's leases and members, and answers every
--     element, in one statement, where it ran one statement per kind and one more to
--     answer from arrays of positions: each cost a tick of 65 elements about a tenth
--     of one lease_renew_many. Readers and semaphores keep their statements, run
--     before it (only when the batch has some), in the order of every statement that
--     locks several rows: leases, then shares, then slots. The kinds are tested as
--     whole arrays, without a query. Answers are unchanged, a lease named twice too.
-- depends: pylease-0021-unwait

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

CREATE OR REPLACE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[], ttls interval[],
                                   fences bigint[], slots integer[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz,
              release_requested_by text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    members boolean;
    o_at    bigint[];
    o_exp   timestamptz[];
    s_at    bigint[];
    s_exp   timestamptz[];
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
    -- Tests of whole arrays that PL/pgSQL evaluates itself, without a query: <@ is
    -- false for an array holding a NULL.
    IF pylease_renew_held.kinds IS NULL
       OR cardinality(pylease_renew_held.kinds) <> cardinality(pylease_renew_held.names)
       OR NOT pylease_renew_held.kinds <@ '{lease,shared,permit,member}'::text[]
    THEN
        RAISE EXCEPTION 'pylease: kinds must hold ''lease'', ''shared'', ''permit'' or ''member'' for each element of names'
            USING ERRCODE = '22023', COLUMN = 'kinds';
    END IF;
    IF cardinality(pylease_renew_held.fences) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
    ELSIF cardinality(pylease_renew_held.slots) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: slots must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'slots';
    END IF;
    members := 'member' = ANY (pylease_renew_held.kinds);

    -- Readers and semaphores, each kind in a statement of its own before the one below,
    -- their answers kept in o_exp (expiries, by position). A batch of leases and members
    -- alone (a keeper's usual one) runs the statement below only.
    IF pylease_renew_held.kinds && '{shared,permit}'::text[] THEN
        -- Every lease row of the batch's leases and readers is locked FOR KEY SHARE, in
        -- name order (as in lease_renew_many), so that an exclusive grant comes either
        -- before a reader's renewal or after it; the batch's own leases are then locked
        -- FOR NO KEY UPDATE, in name order, before any share or slot, as in every
        -- statement that locks several rows (the statement below finds them locked).
        IF 'shared' = ANY (pylease_renew_held.kinds) THEN
            PERFORM FROM pylease_leases AS l
              WHERE l.name IN (SELECT u.n FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names)
                                               AS u(k, n)
                                WHERE u.k IN ('lease', 'shared'))
              ORDER BY l.name
                FOR KEY SHARE;
        END IF;
        IF 'lease' = ANY (pylease_renew_held.kinds) THEN
            PERFORM FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                                pylease_renew_held.holders) WITH ORDINALITY AS u(k, n, h, i)
                    JOIN pylease_leases AS l
                      ON l.name = u.n AND l.holder = u.h
                     AND (pylease_renew_held.fences[u.i] IS NULL OR l.fence = pylease_renew_held.fences[u.i])
              WHERE u.k = 'lease' AND NOT l.released
              ORDER BY l.name
                FOR NO KEY UPDATE OF l;
        END IF;

        -- Readers, as lease_renew: while their epoch is still the name's fence, and is
        -- fences[i], and their share is slots[i] (the share's id: its tenure, 0019).
        IF 'shared' = ANY (pylease_renew_held.kinds) THEN
            WITH wanted AS (
                SELECT u.n, u.h, u.t, pylease_renew_held.fences[u.i] AS f,
                       pylease_renew_held.slots[u.i] AS p, u.i
                  FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                              pylease_renew_held.holders, pylease_renew_held.ttls)
                       WITH ORDINALITY AS u(k, n, h, t, i)
                 WHERE u.k = 'shared'
                   AND CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                              OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                              OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                            THEN pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                                     pylease_renew_held.ttls) IS NULL
                            ELSE true END
            ), renewed AS (
                UPDATE pylease_shared AS s
                   SET ttl        = coalesce(w.t, s.ttl),
                       renewed_at = t_now,
                       expires_at = greatest(s.expires_at, t_now + coalesce(w.t, s.ttl))
                  FROM wanted AS w, pylease_leases AS l
                 WHERE s.name = w.n AND s.holder = w.h AND l.name = w.n AND s.epoch = l.fence
                   AND (w.f IS NULL OR s.epoch = w.f) AND (w.p IS NULL OR s.share = w.p)
                RETURNING s.name, s.holder, s.expires_at
            )
            SELECT array_agg(w.i), array_agg(r.expires_at) INTO o_at, o_exp
              FROM wanted AS w JOIN renewed AS r ON r.name = w.n AND r.holder = w.h;
        END IF;

        -- Semaphores, as permit_renew: a holder's slots are renewed only when they are
        -- all still its own (as many as it was granted together), and only in the tenure
        -- that still holds slots[i] with fences[i].
        IF 'permit' = ANY (pylease_renew_held.kinds) THEN
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
                   AND EXISTS (SELECT FROM pylease_permits AS q
                                WHERE q.name = u.n AND q.holder = u.h AND NOT q.released
                                  AND (pylease_renew_held.fences[u.i] IS NULL
                                       OR q.fence = pylease_renew_held.fences[u.i])
                                  AND (pylease_renew_held.slots[u.i] IS NULL
                                       OR q.slot = pylease_renew_held.slots[u.i]))
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
            SELECT array_agg(w.i), array_agg(r.expires_at) INTO s_at, s_exp
              FROM wanted AS w
              JOIN (SELECT r.name, r.holder, min(r.expires_at) AS expires_at
                      FROM renewed AS r GROUP BY r.name, r.holder) AS r
                ON r.name = w.n AND r.holder = w.h;
            o_at := o_at || s_at;
            o_exp := o_exp || s_exp;
        END IF;
        -- By position, for the statement below: o_exp[i] is element i's expiry.
        o_exp := ARRAY(SELECT o.e
                         FROM unnest(pylease_renew_held.names) WITH ORDINALITY AS u(n, i)
                         LEFT JOIN unnest(o_at, o_exp) AS o(i, e) ON o.i = u.i
                        ORDER BY u.i);
    END IF;

    -- Leases, as lease_renew_each, in their tenures (a lease named twice: at the longest
    -- ttl it was named with), and members of groups, as group_renew: names[i] is the
    -- group, holders[i] the member, fences[i] its incarnation (NULL: whichever is live);
    -- a member past its expiry is not renewed (the others have counted it out, and it
    -- joins again). Then every element's answer, in its place. One statement: each
    -- further one cost a tick of 65 elements about a tenth of lease_renew_many's. No
    -- other statement locks a member and a lease, so the order of those two is free.
    -- FOR NO KEY UPDATE passes the FOR KEY SHARE of a holder's fenced transaction.
    RETURN QUERY
    WITH wanted AS (
        SELECT u.k, u.n, u.h, u.t, pylease_renew_held.fences[u.i] AS f, u.i
          FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                      pylease_renew_held.holders, pylease_renew_held.ttls)
               WITH ORDINALITY AS u(k, n, h, t, i)
         WHERE CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                      OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                    THEN pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                             pylease_renew_held.ttls) IS NULL
                    ELSE true END
    ), locked AS (
        SELECT l.name, w.h, w.t
          FROM wanted AS w JOIN pylease_leases AS l
            ON l.name = w.n AND l.holder = w.h AND (w.f IS NULL OR l.fence = w.f)
         WHERE w.k = 'lease' AND NOT l.released
         ORDER BY l.name
           FOR NO KEY UPDATE OF l
    ), grouped AS (
        SELECT k.name, k.h, max(k.t) AS t FROM locked AS k GROUP BY k.name, k.h
    ), renewed AS (
        UPDATE pylease_leases AS l
           SET ttl        = coalesce(g.t, l.ttl),
               renewed_at = t_now,
               expires_at = greatest(l.expires_at, t_now + coalesce(g.t, l.ttl))
          FROM grouped AS g
         WHERE l.name = g.name AND l.holder = g.h
        RETURNING l.name, l.holder, l.fence, l.expires_at, l.release_requested_by
    ), kept AS (
        UPDATE pylease_members AS m
           SET ttl        = coalesce(w.t, m.ttl),
               renewed_at = t_now,
               expires_at = greatest(m.expires_at, t_now + coalesce(w.t, m.ttl))
          FROM wanted AS w
         WHERE members AND w.k = 'member' AND m.grp = w.n AND m.member = w.h
           AND m.expires_at > t_now AND (w.f IS NULL OR m.incarnation = w.f)
        RETURNING m.grp, m.member, m.incarnation, m.expires_at
    )
    SELECT w.n, x.e IS NOT NULL, x.e, CASE WHEN x.e IS NOT NULL THEN t_now END, r.release_requested_by
      FROM wanted AS w
      LEFT JOIN renewed AS r
        ON w.k = 'lease' AND r.name = w.n AND r.holder = w.h AND (w.f IS NULL OR r.fence = w.f)
      LEFT JOIN kept AS m
        ON w.k = 'member' AND m.grp = w.n AND m.member = w.h AND (w.f IS NULL OR m.incarnation = w.f)
      CROSS JOIN LATERAL (SELECT coalesce(r.expires_at, m.expires_at, o_exp[w.i]) AS e) AS x
     ORDER BY w.i;
END
$$;
