-- Undo pylease 0016: no data on leases, no step-down requests, no watchers; the
-- functions as 0013 left them. Every lease's data and request is lost.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DO $views$
DECLARE
    views text;
BEGIN
    SELECT string_agg(DISTINCT r.ev_class::regclass::text, ', ') INTO views
      FROM pg_depend AS d JOIN pg_rewrite AS r ON r.oid = d.objid
     WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_proc'::regclass
       AND d.refobjid = 'lease_status(text)'::regprocedure;
    IF views IS NOT NULL THEN
        RAISE EXCEPTION 'pylease 0016 rollback: lease_status loses the columns data and release_requested_by, so it is created again; drop the views on it first (%), then create them again after the rollback', views
            USING ERRCODE = '2BP01';
    END IF;
END
$views$;

SELECT set_config('pylease.status_acl', coalesce(p.proacl::text, ''), false)
  FROM pg_proc AS p WHERE p.oid = 'lease_status(text)'::regprocedure;

DROP TRIGGER pylease_leases_watched_insert ON pylease_leases;
DROP TRIGGER pylease_leases_watched_update ON pylease_leases;
DROP TRIGGER pylease_leases_watched_mark ON pylease_leases;
DROP FUNCTION pylease_tell_watchers();
DROP FUNCTION pylease_mark_watched();
DROP FUNCTION lease_watch(text, text, interval);
DROP FUNCTION lease_unwatch(text, text);
DROP TABLE pylease_watchers;
DROP FUNCTION lease_request_release(text, text);
DROP FUNCTION lease_set_data(text, text, jsonb);
DROP FUNCTION lease_set_data(text, text, jsonb, bigint);
DROP FUNCTION lease_claim(text, interval, text, jsonb);
DROP FUNCTION lease_claim_new(text, interval, text, jsonb);

CREATE FUNCTION pylease_claim(name text, ttl interval, holder text, new_tenure boolean)
RETURNS bigint
-- A takeover waits at most lock_timeout for a holder's open fenced transaction
-- (lease_holds locks the row FOR KEY SHARE), then counts as busy.
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now    timestamptz := clock_timestamp();
    granted  bigint;
    s_holder text;
    s_fence  bigint;
    s_freed  boolean;
    s_busy   boolean;
    history  text;
BEGIN
    -- One cheap test in the common case (a read-only transaction's too, as on a
    -- standby); the checks that raise run only when it fails.
    IF pylease_claim.name IS NULL OR pylease_claim.name = '' OR length(pylease_claim.name) > 200
       OR pylease_claim.ttl IS NULL OR NOT isfinite(pylease_claim.ttl)
       OR pylease_claim.ttl <= interval '0' OR pylease_claim.ttl > interval '366 days'
       OR pylease_claim.holder IS NULL OR pylease_claim.holder = ''
       OR length(pylease_claim.holder) > 200 OR pylease_claim.new_tenure IS NULL
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', pylease_claim.name);
        PERFORM pylease_check_ttl('ttl', pylease_claim.ttl);
        PERFORM pylease_check_key('holder', pylease_claim.holder);
        IF pylease_claim.new_tenure IS NULL THEN
            RAISE EXCEPTION 'pylease: new_tenure must not be NULL'
                USING ERRCODE = '22023', COLUMN = 'new_tenure';
        END IF;
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby(CASE WHEN pylease_claim.new_tenure
                                                THEN 'lease_claim_new' ELSE 'lease_claim' END);
        END IF;
        -- Even a busy answer would be wrong here: nothing could ever be granted.
        PERFORM pylease_refuse_read_only(CASE WHEN pylease_claim.new_tenure
                                              THEN 'lease_claim_new' ELSE 'lease_claim' END);
    END IF;

    LOOP
        -- Busy: unexpired (or resting after a min_hold release) and not ours; for a
        -- new tenure, whoever holds it.
        SELECT l.holder, l.fence, l.released,
               l.expires_at > t_now
               AND (pylease_claim.new_tenure OR l.released OR l.holder <> pylease_claim.holder)
          INTO s_holder, s_fence, s_freed, s_busy
          FROM pylease_leases AS l
         WHERE l.name = pylease_claim.name;
        IF s_busy THEN
            RETURN NULL;
        ELSIF s_fence IS NULL THEN
            -- A first claim of the name; a conflict means another claimer created it first.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, grants)
            VALUES (pylease_claim.name, pylease_claim.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    pylease_claim.ttl, t_now, t_now, t_now + pylease_claim.ttl, 1)
            ON CONFLICT DO NOTHING  -- the name (or its (name, fence) key) exists: another claimer won
            RETURNING l.fence, current_setting('pylease.history', true) INTO granted, history;
            IF history IS NULL OR history IN ('', 'rare', 'none') THEN
                RETURN granted;
            ELSIF history = 'all' THEN
                INSERT INTO pylease_events (at, name, event, holder, fence)
                VALUES (t_now, pylease_claim.name, 'claimed', pylease_claim.holder, granted);
                RETURN granted;
            END IF;
            PERFORM pylease_refuse_history(history);
        ELSIF NOT s_freed AND s_holder = pylease_claim.holder AND NOT pylease_claim.new_tenure THEN
            -- Still ours: a retried claim whose reply was lost keeps its fence
            -- instead of looking busy. Never earlier, as a renewal: another session
            -- of this holder must not cut short what the owner was granted.
            UPDATE pylease_leases AS l
               SET ttl        = pylease_claim.ttl,
                   renewed_at = t_now,
                   expires_at = greatest(l.expires_at, t_now + pylease_claim.ttl)
             WHERE l.name = pylease_claim.name AND l.fence = s_fence
               AND l.holder = pylease_claim.holder AND NOT l.released
            RETURNING l.fence INTO granted;
            IF granted IS NOT NULL THEN
                RETURN granted;
            END IF;
        ELSIF s_fence = 9223372036854775807 THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(pylease_claim.name), s_fence USING ERRCODE = '54000';
        ELSE
            -- Free (released, or expired: a takeover). The fence is floored by the
            -- timeline WAL is written on, so a promoted standby never reissues the
            -- old primary's fences. The setting is read by the same statement.
            -- A statement_timeout (a role's, a database's) shorter than this wait
            -- would cancel the claim, an error, before the wait counts as busy: the
            -- wait takes at most half of the statement's time.
            IF current_setting('statement_timeout') <> '0' THEN
                PERFORM set_config('lock_timeout', least(2000, greatest(1, (500 * extract(epoch
                    FROM current_setting('statement_timeout')::interval))::bigint))::text, true);
            END IF;
            BEGIN
                UPDATE pylease_leases AS l
                   SET fence       = greatest(s_fence + 1,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                       acquired_at = t_now,
                       holder      = pylease_claim.holder,
                       ttl         = pylease_claim.ttl,
                       renewed_at  = t_now,
                       expires_at  = t_now + pylease_claim.ttl,
                       released    = false,
                       grants      = l.grants + 1,
                       takeovers   = l.takeovers + CASE WHEN s_freed THEN 0 ELSE 1 END
                 WHERE l.name = pylease_claim.name AND l.fence = s_fence AND l.released = s_freed
                   AND l.expires_at <= t_now
                   -- Free of readers too (unexpired shares of its epoch).
                   AND NOT EXISTS (SELECT FROM pylease_shared AS s
                                    WHERE s.name = pylease_claim.name AND s.epoch = s_fence
                                      AND s.expires_at > t_now)
                RETURNING l.fence, current_setting('pylease.history', true) INTO granted, history;
                IF granted IS NULL THEN
                    -- Read by readers: busy, and nothing was written. (Otherwise the row
                    -- changed since it was read: look again.)
                    IF EXISTS (SELECT FROM pylease_shared AS s
                                WHERE s.name = pylease_claim.name AND s.epoch = s_fence
                                  AND s.expires_at > t_now) THEN
                        RETURN NULL;
                    END IF;
                ELSE
                    -- A reader granted while the update waited for its row lock is seen
                    -- only now, by a statement of its own: then busy after all. The rows
                    -- of the name's readers go (they hold no longer once the fence moved).
                    WITH gone AS (
                        DELETE FROM pylease_shared AS s WHERE s.name = pylease_claim.name
                        RETURNING s.epoch = s_fence AND s.expires_at > t_now AS live
                    )
                    SELECT coalesce(bool_or(g.live), false) INTO s_busy FROM gone AS g;
                    IF s_busy THEN
                        RAISE EXCEPTION USING ERRCODE = 'PLBSY';
                    END IF;
                END IF;
            EXCEPTION WHEN lock_not_available OR SQLSTATE 'PLBSY' THEN
                -- The previous holder's fenced transaction is still open, or a reader
                -- came first: not ours yet.
                RETURN NULL;
            END;
            IF granted IS NOT NULL THEN
                -- The default records only takeovers: a claim after a release writes nothing more.
                IF history IS NULL OR history IN ('', 'rare') THEN
                    IF s_freed THEN
                        RETURN granted;
                    END IF;
                ELSIF history = 'none' THEN
                    RETURN granted;
                ELSIF history <> 'all' THEN
                    PERFORM pylease_refuse_history(history);
                END IF;
                INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
                VALUES (t_now, pylease_claim.name,
                        CASE WHEN s_freed THEN 'claimed' ELSE 'taken_over' END,
                        pylease_claim.holder, granted, s_holder);
                RETURN granted;
            END IF;
        END IF;
    END LOOP;
END
$$;


CREATE OR REPLACE FUNCTION lease_claim(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim.name, lease_claim.ttl, lease_claim.holder, false);

CREATE OR REPLACE FUNCTION lease_claim_new(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim_new.name, lease_claim_new.ttl, lease_claim_new.holder, true);

DROP FUNCTION pylease_claim(text, interval, text, boolean, jsonb);

COMMENT ON FUNCTION pylease_claim(text, interval, text, boolean) IS
    'pylease (internal): the one body of lease_claim (new_tenure false) and lease_claim_new (true).';

CREATE OR REPLACE FUNCTION pylease_claim_all(names text[], ttl interval, holder text, new_tenure boolean)
RETURNS TABLE(name text, fence bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now    timestamptz := clock_timestamp();
    created  text[];
    worn     text;
    history  text;
BEGIN
    PERFORM pylease_check_names('names', pylease_claim_all.names);
    IF pylease_claim_all.ttl IS NULL OR NOT isfinite(pylease_claim_all.ttl)
       OR pylease_claim_all.ttl <= interval '0' OR pylease_claim_all.ttl > interval '366 days'
       OR pylease_claim_all.holder IS NULL OR pylease_claim_all.holder = ''
       OR length(pylease_claim_all.holder) > 200 OR pylease_claim_all.new_tenure IS NULL
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_ttl('ttl', pylease_claim_all.ttl);
        PERFORM pylease_check_key('holder', pylease_claim_all.holder);
        IF pylease_claim_all.new_tenure IS NULL THEN
            RAISE EXCEPTION 'pylease: new_tenure must not be NULL'
                USING ERRCODE = '22023', COLUMN = 'new_tenure';
        END IF;
        PERFORM pylease_refuse_standby(CASE WHEN pylease_claim_all.new_tenure
                                            THEN 'lease_claim_all_new' ELSE 'lease_claim_all' END);
    END IF;

    IF EXISTS (SELECT FROM pylease_leases AS l
                WHERE l.name = ANY (pylease_claim_all.names) AND l.expires_at > t_now
                  AND (pylease_claim_all.new_tenure OR l.released
                       OR l.holder <> pylease_claim_all.holder))
       OR EXISTS (SELECT FROM pylease_leases AS l
                    JOIN pylease_shared AS s ON s.name = l.name AND s.epoch = l.fence
                   WHERE l.name = ANY (pylease_claim_all.names) AND s.expires_at > t_now) THEN
        RETURN;
    END IF;

    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    BEGIN
        -- New names first (an insert waits for another transaction's insert of the
        -- same name), then every row: each step in name order.
        WITH made AS (
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, grants)
            SELECT u.n, pylease_claim_all.holder,
                   ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                   pylease_claim_all.ttl, t_now, t_now, t_now + pylease_claim_all.ttl, 1
              FROM unnest(pylease_claim_all.names) AS u(n)
             WHERE NOT EXISTS (SELECT FROM pylease_leases AS x WHERE x.name = u.n)
             ORDER BY u.n
            ON CONFLICT DO NOTHING
            RETURNING l.name, l.fence
        ), recorded AS (
            INSERT INTO pylease_events (at, name, event, holder, fence)
            SELECT t_now, m.name, 'claimed', pylease_claim_all.holder, m.fence
              FROM made AS m WHERE history = 'all'
        )
        SELECT coalesce(array_agg(m.name), '{}') INTO created FROM made AS m;

        PERFORM FROM pylease_leases AS l
          WHERE l.name = ANY (pylease_claim_all.names)
          ORDER BY l.name
            FOR UPDATE;
        -- Locked: what is read now stays so until this transaction ends. (The names
        -- this claim created are its own.)
        IF EXISTS (SELECT FROM pylease_leases AS l
                    WHERE l.name = ANY (pylease_claim_all.names) AND l.name <> ALL (created)
                      AND l.expires_at > t_now
                      AND (pylease_claim_all.new_tenure OR l.released
                           OR l.holder <> pylease_claim_all.holder))
           OR EXISTS (SELECT FROM pylease_leases AS l
                        JOIN pylease_shared AS s ON s.name = l.name AND s.epoch = l.fence
                       WHERE l.name = ANY (pylease_claim_all.names) AND s.expires_at > t_now) THEN
            RAISE EXCEPTION USING ERRCODE = 'PLBSY';
        END IF;
        SELECT min(l.name) INTO worn FROM pylease_leases AS l
         WHERE l.name = ANY (pylease_claim_all.names) AND l.fence = 9223372036854775807
           AND (pylease_claim_all.new_tenure OR l.released
                OR l.holder <> pylease_claim_all.holder);
        IF worn IS NOT NULL THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(worn), 9223372036854775807 USING ERRCODE = '54000';
        END IF;

        WITH old AS (
            SELECT l.name, l.holder, l.released,
                   NOT pylease_claim_all.new_tenure AND NOT l.released
                   AND l.holder = pylease_claim_all.holder AS own
              FROM pylease_leases AS l
             WHERE l.name = ANY (pylease_claim_all.names) AND l.name <> ALL (created)
        ), granted AS (
            UPDATE pylease_leases AS l
               SET fence       = CASE WHEN o.own THEN l.fence ELSE greatest(l.fence + 1,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1) END,
                   acquired_at = CASE WHEN o.own THEN l.acquired_at ELSE t_now END,
                   holder      = pylease_claim_all.holder,
                   ttl         = pylease_claim_all.ttl,
                   renewed_at  = t_now,
                   expires_at  = CASE WHEN o.own THEN greatest(l.expires_at, t_now + pylease_claim_all.ttl)
                                      ELSE t_now + pylease_claim_all.ttl END,
                   released    = false,
                   grants      = l.grants + CASE WHEN o.own THEN 0 ELSE 1 END,
                   takeovers   = l.takeovers + CASE WHEN o.own OR o.released THEN 0 ELSE 1 END
              FROM old AS o
             WHERE l.name = o.name
            RETURNING l.name, l.fence, o.own, o.released, o.holder AS previous
        )
        INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
        SELECT t_now, g.name, CASE WHEN g.released THEN 'claimed' ELSE 'taken_over' END,
               pylease_claim_all.holder, g.fence, g.previous
          FROM granted AS g
         WHERE NOT g.own
           AND (history = 'all' OR (coalesce(history, '') IN ('', 'rare') AND NOT g.released));
    EXCEPTION WHEN SQLSTATE 'PLBSY' OR lock_not_available OR deadlock_detected THEN
        RETURN;
    END;

    RETURN QUERY
    SELECT u.n, l.fence
      FROM unnest(pylease_claim_all.names) WITH ORDINALITY AS u(n, i)
      JOIN pylease_leases AS l ON l.name = u.n
     ORDER BY u.i;
END
$$;

CREATE OR REPLACE FUNCTION lease_steal(name text, ttl interval, holder text, older_than interval DEFAULT '0')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now     timestamptz := clock_timestamp();
    granted   bigint;
    s_holder  text;
    s_fence   bigint;
    s_renewed timestamptz;
    s_expires timestamptz;
    s_freed   boolean;
    s_read    boolean;
    kind      text;
    history   text;
BEGIN
    PERFORM pylease_check_key('name', lease_steal.name);
    PERFORM pylease_check_ttl('ttl', lease_steal.ttl);
    PERFORM pylease_check_key('holder', lease_steal.holder);
    PERFORM pylease_check_span('older_than', lease_steal.older_than);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_steal');
    END IF;

    LOOP
        SELECT l.holder, l.fence, l.renewed_at, l.expires_at, l.released,
               EXISTS (SELECT FROM pylease_shared AS s
                        WHERE s.name = l.name AND s.epoch = l.fence AND s.expires_at > t_now)
          INTO s_holder, s_fence, s_renewed, s_expires, s_freed, s_read
          FROM pylease_leases AS l
         WHERE l.name = lease_steal.name;
        IF NOT FOUND THEN
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, grants)
            VALUES (lease_steal.name, lease_steal.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    lease_steal.ttl, t_now, t_now, t_now + lease_steal.ttl, 1)
            ON CONFLICT DO NOTHING  -- the name (or its (name, fence) key) exists: another claimer won
            RETURNING l.fence INTO granted;
            kind := 'claimed';
            EXIT;
        END IF;
        -- Never from readers: a steal breaks a writer's lease only.
        IF s_read THEN
            RETURN NULL;
        END IF;
        -- older_than '0' is unconditional: a renewal that commits while the steal waits
        -- for the row (renewed_at later than t_now) must not make it give up.
        IF lease_steal.older_than > interval '0'
           AND s_renewed > t_now - lease_steal.older_than AND s_expires > t_now THEN
            RETURN NULL;
        ELSIF s_fence = 9223372036854775807 THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(lease_steal.name), s_fence USING ERRCODE = '54000';
        END IF;
        -- From an unexpired holder a steal; of a free or expired name what a claim is.
        kind := CASE WHEN s_freed THEN 'claimed' WHEN s_expires <= t_now THEN 'taken_over'
                     ELSE 'stolen' END;

        BEGIN
            UPDATE pylease_leases AS l
               SET fence       = greatest(s_fence + 1,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                   holder      = lease_steal.holder,
                   ttl         = lease_steal.ttl,
                   acquired_at = t_now,
                   renewed_at  = t_now,
                   expires_at  = CASE WHEN NOT s_freed AND s_holder = lease_steal.holder
                                      THEN greatest(l.expires_at, t_now + lease_steal.ttl)
                                      ELSE t_now + lease_steal.ttl END,
                   released    = false,
                   grants      = l.grants + 1,
                   takeovers   = l.takeovers + CASE WHEN kind = 'taken_over' THEN 1 ELSE 0 END,
                   steals      = l.steals + CASE WHEN kind = 'stolen' THEN 1 ELSE 0 END
             WHERE l.name = lease_steal.name AND l.fence = s_fence AND l.released = s_freed
               AND l.expires_at = s_expires
               AND (lease_steal.older_than = interval '0'
                    OR l.renewed_at <= t_now - lease_steal.older_than OR l.expires_at <= t_now)
            RETURNING l.fence INTO granted;
            -- As in lease_claim: a reader granted while the update waited is seen now.
            IF granted IS NOT NULL THEN
                WITH gone AS (
                    DELETE FROM pylease_shared AS s WHERE s.name = lease_steal.name
                    RETURNING s.epoch = s_fence AND s.expires_at > t_now AS live
                )
                SELECT coalesce(bool_or(g.live), false) INTO s_read FROM gone AS g;
                IF s_read THEN
                    RAISE EXCEPTION USING ERRCODE = 'PLBSY';
                END IF;
            END IF;
        EXCEPTION WHEN SQLSTATE 'PLBSY' THEN
            RETURN NULL;
        END;
        EXIT WHEN granted IS NOT NULL;
    END LOOP;

    IF granted IS NOT NULL THEN
        history := current_setting('pylease.history', true);
        IF history = 'all' OR (kind <> 'claimed' AND coalesce(history, '') IN ('', 'rare')) THEN
            INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
            VALUES (t_now, lease_steal.name, kind, lease_steal.holder, granted, s_holder);
        ELSIF history NOT IN ('', 'rare', 'all', 'none') THEN
            PERFORM pylease_refuse_history(history);
        END IF;
    END IF;
    RETURN granted;
END
$$;

DROP FUNCTION pylease_renew_held(text[], text[], text[], interval[]);
DROP FUNCTION pylease_renew_held(text[], text[], text[], interval[], bigint[], integer[]);
CREATE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[], ttls interval[],
                                   fences bigint[], slots integer[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
    l_at  bigint[];
    l_exp timestamptz[];
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
            SELECT l.name, w.h, w.t
              FROM wanted AS w JOIN pylease_leases AS l
                ON l.name = w.n AND l.holder = w.h AND (w.f IS NULL OR l.fence = w.f)
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
            RETURNING l.name, l.holder, l.fence, l.expires_at
        )
        SELECT array_agg(w.i), array_agg(r.expires_at) INTO l_at, l_exp
          FROM wanted AS w
          JOIN renewed AS r ON r.name = w.n AND r.holder = w.h AND (w.f IS NULL OR r.fence = w.f);
    END IF;

    -- Readers, as lease_renew: while their epoch is still the name's fence, and is
    -- fences[i] (a reader's tenure is its epoch).
    IF 'shared' = ANY (pylease_renew_held.kinds) THEN
        WITH wanted AS (
            SELECT u.n, u.h, u.t, pylease_renew_held.fences[u.i] AS f, u.i
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
               AND (w.f IS NULL OR s.epoch = w.f)
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
    SELECT u.n, x.e IS NOT NULL, x.e, CASE WHEN x.e IS NOT NULL THEN t_now END
      FROM unnest(pylease_renew_held.names) WITH ORDINALITY AS u(n, i)
      LEFT JOIN (SELECT a.i, a.e FROM unnest(coalesce(l_at, '{}'), coalesce(l_exp, '{}')) AS a(i, e)
                 UNION ALL
                 SELECT b.i, b.e FROM unnest(coalesce(p_at, '{}'), coalesce(p_exp, '{}')) AS b(i, e)
                 UNION ALL
                 SELECT c.i, c.e FROM unnest(coalesce(s_at, '{}'), coalesce(s_exp, '{}')) AS c(i, e)
                 UNION ALL
                 SELECT d.i, d.e FROM unnest(coalesce(m_at, '{}'), coalesce(m_exp, '{}')) AS d(i, e)
                ) AS x ON x.i = u.i
     ORDER BY u.i;
END
$$;

-- The keeper's renewal of 0009, whatever the tenures (the function above with NULL
-- fences and slots): a keeper of an earlier pylease still calls it.
CREATE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[],
                                              ttls interval[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE sql
BEGIN ATOMIC
    SELECT h.name, h.renewed, h.expires_at, h.server_time
      FROM pylease_renew_held(pylease_renew_held.kinds, pylease_renew_held.names,
                              pylease_renew_held.holders, pylease_renew_held.ttls,
                              NULL::bigint[], NULL::integer[]) AS h;
END;

COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[]) IS
    'pylease (internal, the keeper''s): renew leases and permits of several holders in one statement, each at its own ttl.';
COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[], bigint[], integer[]) IS
    'pylease (internal, the keeper''s): renew leases, readers'' shares, permits and members of groups of several holders in one statement, each at its own ttl and in the tenure its fence names (a reader''s: its epoch; a member''s: its incarnation).';

DROP FUNCTION lease_status(text);
CREATE FUNCTION lease_status(name text DEFAULT NULL)
RETURNS TABLE(name text, holder text, fence bigint, acquired_at timestamptz,
              renewed_at timestamptz, expires_at timestamptz, held boolean,
              state text, ttl interval, shared integer)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT l.name,
           CASE WHEN r.n > 0 THEN NULL ELSE l.holder END,
           l.fence,
           CASE WHEN r.n > 0 THEN r.acquired_at ELSE l.acquired_at END,
           CASE WHEN r.n > 0 THEN r.renewed_at ELSE l.renewed_at END,
           CASE WHEN r.n > 0 THEN r.expires_at ELSE l.expires_at END,
           r.n > 0 OR (NOT l.released AND l.expires_at > c.now),
           CASE WHEN r.n > 0 THEN 'shared'
                WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
                WHEN l.released THEN 'released' ELSE 'expired' END,
           CASE WHEN r.n > 0 THEN r.ttl ELSE l.ttl END,
           r.n::integer
      FROM pylease_leases AS l
     CROSS JOIN (SELECT clock_timestamp() AS now) AS c
     CROSS JOIN LATERAL (
           SELECT count(*) AS n, min(s.acquired_at) AS acquired_at,
                  max(s.renewed_at) AS renewed_at, max(s.expires_at) AS expires_at,
                  max(s.ttl) AS ttl
             FROM pylease_shared AS s
            WHERE s.name = l.name AND s.epoch = l.fence AND s.expires_at > c.now) AS r
     WHERE $1 IS NULL OR l.name = $1
     ORDER BY l.name;
$$;

COMMENT ON FUNCTION lease_status(text) IS
    'pylease: one row per lease name (all when name is NULL); held means unexpired and not released; state is held, shared, resting, released or expired; shared counts the readers.';

-- lease_status keeps the grants it had (none recorded: the defaults, as created).
DO $grants$
DECLARE
    f     text;
    kept  text;
    entry record;
BEGIN
    FOREACH f IN ARRAY ARRAY['status'] LOOP
        kept := current_setting('pylease.' || f || '_acl');
        PERFORM set_config('pylease.' || f || '_acl', '', false);
        CONTINUE WHEN kept = '';
        EXECUTE format('REVOKE ALL ON FUNCTION lease_%s(text) FROM PUBLIC', f);
        FOR entry IN
            SELECT a.grantee, a.is_grantable FROM aclexplode(kept::aclitem[]) AS a
             WHERE a.privilege_type = 'EXECUTE'
               AND a.grantee <> (SELECT p.proowner FROM pg_proc AS p
                                  WHERE p.oid = format('lease_%s(text)', f)::regprocedure)
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease_%s(text) TO %s%s', f,
                           CASE WHEN entry.grantee = 0 THEN 'PUBLIC' ELSE entry.grantee::regrole::text END,
                           CASE WHEN entry.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END
$grants$;

ALTER TABLE pylease_leases DROP COLUMN watched;
ALTER TABLE pylease_leases DROP COLUMN release_requested_by;
ALTER TABLE pylease_leases DROP COLUMN data;
