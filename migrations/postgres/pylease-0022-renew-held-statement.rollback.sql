-- Undo pylease 0022: pylease_renew_held as pylease-0019-shares defined it.

DO $pin$
BEGIN
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
    t_now timestamptz := clock_timestamp();
    l_at  bigint[];
    l_exp timestamptz[];
    l_req text[];
    p_at  bigint[];
    p_exp timestamptz[];
    s_at  bigint[];
    s_exp timestamptz[];
    m_at  bigint[];
    m_exp timestamptz[];
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
                   WHERE v IS NULL OR v NOT IN ('lease', 'shared', 'permit', 'member'))
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

    -- Readers among them: every lease row of the batch is first locked FOR KEY SHARE,
    -- in name order (as in lease_renew_many), so that an exclusive grant comes either
    -- before a reader's renewal or after it, and the locks below keep name order.
    IF 'shared' = ANY (pylease_renew_held.kinds) THEN
        PERFORM FROM pylease_leases AS l
          WHERE l.name IN (SELECT u.n FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names)
                                           AS u(k, n)
                            WHERE u.k IN ('lease', 'shared'))
          ORDER BY l.name
            FOR KEY SHARE;
    END IF;

    -- Leases, as lease_renew_each, in their tenures. FOR NO KEY UPDATE passes the FOR
    -- KEY SHARE of a holder's fenced transaction.
    IF 'lease' = ANY (pylease_renew_held.kinds) THEN
        WITH wanted AS (
            SELECT u.n, u.h, u.t, pylease_renew_held.fences[u.i] AS f, u.i
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
            SELECT l.name, w.h, w.t, w.i
              FROM wanted AS w JOIN pylease_leases AS l
                ON l.name = w.n AND l.holder = w.h AND (w.f IS NULL OR l.fence = w.f)
             WHERE NOT l.released
             ORDER BY l.name
               FOR NO KEY UPDATE OF l
        ), grouped AS (
            -- The positions of each row's elements (one, unless the batch names a lease
            -- twice) ride through the update: no join of the batch with what was
            -- renewed, which the planner, misled by the batch's filtered estimate,
            -- made a nested loop over every pair of elements.
            SELECT k.name, k.h, max(k.t) AS t, array_agg(k.i) AS at
              FROM locked AS k GROUP BY k.name, k.h
        ), renewed AS (
            UPDATE pylease_leases AS l
               SET ttl        = coalesce(g.t, l.ttl),
                   renewed_at = t_now,
                   expires_at = greatest(l.expires_at, t_now + coalesce(g.t, l.ttl))
              FROM grouped AS g
             WHERE l.name = g.name AND l.holder = g.h
            RETURNING g.at, l.expires_at, l.release_requested_by
        )
        SELECT array_agg(x.i), array_agg(r.expires_at), array_agg(r.release_requested_by)
          INTO l_at, l_exp, l_req
          FROM renewed AS r CROSS JOIN LATERAL unnest(r.at) AS x(i);
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
        SELECT array_agg(w.i), array_agg(r.expires_at) INTO s_at, s_exp
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
        SELECT array_agg(w.i), array_agg(r.expires_at) INTO p_at, p_exp
          FROM wanted AS w
          JOIN (SELECT r.name, r.holder, min(r.expires_at) AS expires_at
                  FROM renewed AS r GROUP BY r.name, r.holder) AS r
            ON r.name = w.n AND r.holder = w.h;
    END IF;

    -- Members of groups, as group_renew: names[i] is the group, holders[i] the member,
    -- fences[i] its incarnation (NULL: whichever is live). A member past its expiry is
    -- not renewed: the others have counted it out, and it joins again.
    IF 'member' = ANY (pylease_renew_held.kinds) THEN
        WITH wanted AS (
            SELECT u.n, u.h, u.t, pylease_renew_held.fences[u.i] AS f, u.i
              FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                          pylease_renew_held.holders, pylease_renew_held.ttls)
                   WITH ORDINALITY AS u(k, n, h, t, i)
             WHERE u.k = 'member'
               AND CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                          OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                          OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                        THEN pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                                 pylease_renew_held.ttls) IS NULL
                        ELSE true END
        ), renewed AS (
            UPDATE pylease_members AS m
               SET ttl        = coalesce(w.t, m.ttl),
                   renewed_at = t_now,
                   expires_at = greatest(m.expires_at, t_now + coalesce(w.t, m.ttl))
              FROM wanted AS w
             WHERE m.grp = w.n AND m.member = w.h AND m.expires_at > t_now
               AND (w.f IS NULL OR m.incarnation = w.f)
            RETURNING m.grp, m.member, m.incarnation, m.expires_at
        )
        SELECT array_agg(w.i), array_agg(r.expires_at) INTO m_at, m_exp
          FROM wanted AS w
          JOIN renewed AS r ON r.grp = w.n AND r.member = w.h
                           AND (w.f IS NULL OR r.incarnation = w.f);
    END IF;

    RETURN QUERY
    SELECT u.n, x.e IS NOT NULL, x.e, CASE WHEN x.e IS NOT NULL THEN t_now END, x.r
      FROM unnest(pylease_renew_held.names) WITH ORDINALITY AS u(n, i)
      LEFT JOIN (SELECT a.i, a.e, a.r
                   FROM unnest(coalesce(l_at, '{}'), coalesce(l_exp, '{}'), coalesce(l_req, '{}'))
                        AS a(i, e, r)
                 UNION ALL
                 SELECT b.i, b.e, NULL FROM unnest(coalesce(p_at, '{}'), coalesce(p_exp, '{}')) AS b(i, e)
                 UNION ALL
                 SELECT c.i, c.e, NULL FROM unnest(coalesce(s_at, '{}'), coalesce(s_exp, '{}')) AS c(i, e)
                 UNION ALL
                 SELECT d.i, d.e, NULL FROM unnest(coalesce(m_at, '{}'), coalesce(m_exp, '{}')) AS d(i, e)
                ) AS x ON x.i = u.i
     ORDER BY u.i;
END
$$;
