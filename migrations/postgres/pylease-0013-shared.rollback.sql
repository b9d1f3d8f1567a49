-- Undo pylease 0013: no readers; the functions as 0012 left them. Every share is lost, and the names that only
-- readers ever claimed (no holder) are forgotten.

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
        RAISE EXCEPTION 'pylease 0013 rollback: lease_status loses the column shared, so it is created again; drop the views on it first (%), then create them again after the rollback', views
            USING ERRCODE = '2BP01';
    END IF;
END
$views$;

SELECT set_config('pylease.status_acl', coalesce(p.proacl::text, ''), false)
  FROM pg_proc AS p WHERE p.oid = 'lease_status(text)'::regprocedure;

DROP FUNCTION lease_holders(text);
DROP FUNCTION lease_claim_shared(text, interval, text);

CREATE OR REPLACE FUNCTION pylease_claim(name text, ttl interval, holder text, new_tenure boolean)
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
                RETURNING l.fence, current_setting('pylease.history', true) INTO granted, history;
            EXCEPTION WHEN lock_not_available THEN
                -- The previous holder's fenced transaction is still open: not ours yet.
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
        SELECT l.holder, l.fence, l.renewed_at, l.expires_at, l.released
          INTO s_holder, s_fence, s_renewed, s_expires, s_freed
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
        EXIT WHEN FOUND;
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
                       OR l.holder <> pylease_claim_all.holder)) THEN
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
                           OR l.holder <> pylease_claim_all.holder)) THEN
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

CREATE OR REPLACE FUNCTION lease_renew(name text, holder text, ttl interval, fence bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF lease_renew.name IS NULL OR lease_renew.name = '' OR length(lease_renew.name) > 200
       OR lease_renew.holder IS NULL OR lease_renew.holder = '' OR length(lease_renew.holder) > 200
       OR NOT isfinite(lease_renew.ttl)
       OR lease_renew.ttl <= interval '0' OR lease_renew.ttl > interval '366 days'
    THEN
        PERFORM pylease_check_key('name', lease_renew.name);
        PERFORM pylease_check_key('holder', lease_renew.holder);
        IF lease_renew.ttl IS NOT NULL THEN
            PERFORM pylease_check_ttl('ttl', lease_renew.ttl);
        END IF;
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_renew');
    END IF;

    UPDATE pylease_leases AS l
       SET ttl        = coalesce(lease_renew.ttl, l.ttl),
           renewed_at = t_now,
           expires_at = greatest(l.expires_at, t_now + coalesce(lease_renew.ttl, l.ttl))
     WHERE l.name = lease_renew.name AND l.holder = lease_renew.holder AND NOT l.released
       AND (lease_renew.fence IS NULL OR l.fence = lease_renew.fence);
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION lease_renew_many(names text[], holders text[], ttl interval, fences bigint[])
RETURNS TABLE(name text, renewed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF lease_renew_many.names IS NULL OR lease_renew_many.holders IS NULL
       OR cardinality(lease_renew_many.names) <> cardinality(lease_renew_many.holders)
       OR NOT isfinite(lease_renew_many.ttl) OR lease_renew_many.ttl <= interval '0'
       OR lease_renew_many.ttl > interval '366 days'
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_batch(lease_renew_many.names, lease_renew_many.holders, NULL);
        IF lease_renew_many.ttl IS NOT NULL THEN
            PERFORM pylease_check_ttl('ttl', lease_renew_many.ttl);
        END IF;
        PERFORM pylease_refuse_standby('lease_renew_many');
    END IF;
    IF cardinality(lease_renew_many.fences) <> cardinality(lease_renew_many.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
    END IF;

    -- Rows are locked in name order, so two renewers of overlapping sets (an
    -- owner and a keep_fresh helper) cannot deadlock. FOR NO KEY UPDATE passes
    -- the FOR KEY SHARE of a holder's fenced transaction.
    RETURN QUERY
    WITH wanted AS (
        SELECT u.n, u.h, lease_renew_many.fences[u.i] AS f, u.i
          FROM unnest(lease_renew_many.names, lease_renew_many.holders) WITH ORDINALITY AS u(n, h, i)
         WHERE CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                    THEN pylease_check_batch(lease_renew_many.names, lease_renew_many.holders, NULL) IS NULL
                    ELSE true END
    ), locked AS (
        SELECT l.name
          FROM wanted AS w JOIN pylease_leases AS l
            ON l.name = w.n AND l.holder = w.h AND (w.f IS NULL OR l.fence = w.f)
         WHERE NOT l.released
         ORDER BY l.name
           FOR NO KEY UPDATE OF l
    ), renewed AS (
        UPDATE pylease_leases AS l
           SET ttl        = coalesce(lease_renew_many.ttl, l.ttl),
               renewed_at = t_now,
               expires_at = greatest(l.expires_at, t_now + coalesce(lease_renew_many.ttl, l.ttl))
          FROM locked AS k
         WHERE l.name = k.name
        RETURNING l.name, l.holder, l.fence
    )
    SELECT w.n, r.name IS NOT NULL
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h AND (w.f IS NULL OR r.fence = w.f)
     ORDER BY w.i;
END
$$;

CREATE OR REPLACE FUNCTION lease_release(name text, holder text, min_hold interval DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   bigint;
    notify  boolean;
    history text;
    ignored text;
BEGIN
    IF lease_release.name IS NULL OR lease_release.name = '' OR length(lease_release.name) > 200
       OR lease_release.holder IS NULL OR lease_release.holder = ''
       OR length(lease_release.holder) > 200
       OR NOT isfinite(lease_release.min_hold) OR lease_release.min_hold < interval '0'
       OR lease_release.min_hold > interval '366 days'
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', lease_release.name);
        PERFORM pylease_check_key('holder', lease_release.holder);
        IF lease_release.min_hold IS NOT NULL THEN
            PERFORM pylease_check_span('min_hold', lease_release.min_hold);
        END IF;
        PERFORM pylease_refuse_standby('lease_release');
    END IF;

    -- Give up the flush only while this transaction has written nothing (as in
    -- autocommit), so a caller's earlier writes in the same transaction keep their
    -- durability; one who writes after releasing runs SET LOCAL synchronous_commit
    -- = on. (transaction_timestamp() = statement_timestamp() cannot tell: drivers'
    -- extended protocol makes them differ even in autocommit.)
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;

    t_now := clock_timestamp();
    UPDATE pylease_leases AS l
       SET released   = true,
           expires_at = CASE WHEN lease_release.min_hold IS NULL THEN t_now
                             ELSE greatest(t_now, l.acquired_at + lease_release.min_hold) END,
           releases   = l.releases + 1
     WHERE l.name = lease_release.name AND l.holder = lease_release.holder AND NOT l.released
    RETURNING l.fence, l.expires_at <= t_now, current_setting('pylease.history', true)
         INTO freed, notify, history;
    IF freed IS NULL THEN
        RETURN false;
    ELSIF history IS NULL OR history IN ('', 'rare', 'none') THEN
        NULL;
    ELSIF history = 'all' THEN
        INSERT INTO pylease_events (at, name, event, holder, fence)
        VALUES (t_now, lease_release.name, 'released', lease_release.holder, freed);
    ELSE
        PERFORM pylease_refuse_history(history);
    END IF;
    IF notify THEN
        ignored := pg_notify('pylease', lease_release.name);
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION lease_release(name text, holder text, min_hold interval, fence bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   bigint;
    notify  boolean;
    history text;
    ignored text;
BEGIN
    IF lease_release.name IS NULL OR lease_release.name = '' OR length(lease_release.name) > 200
       OR lease_release.holder IS NULL OR lease_release.holder = ''
       OR length(lease_release.holder) > 200
       OR NOT isfinite(lease_release.min_hold) OR lease_release.min_hold < interval '0'
       OR lease_release.min_hold > interval '366 days'
       OR lease_release.fence IS NULL OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', lease_release.name);
        PERFORM pylease_check_key('holder', lease_release.holder);
        IF lease_release.min_hold IS NOT NULL THEN
            PERFORM pylease_check_span('min_hold', lease_release.min_hold);
        END IF;
        IF lease_release.fence IS NULL THEN
            RAISE EXCEPTION 'pylease: fence must not be NULL' USING ERRCODE = '22023', COLUMN = 'fence';
        END IF;
        PERFORM pylease_refuse_standby('lease_release');
    END IF;

    -- As in the function above: no flush while this transaction has written nothing.
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;

    t_now := clock_timestamp();
    UPDATE pylease_leases AS l
       SET released   = true,
           expires_at = CASE WHEN lease_release.min_hold IS NULL THEN t_now
                             ELSE greatest(t_now, l.acquired_at + lease_release.min_hold) END,
           releases   = l.releases + 1
     WHERE l.name = lease_release.name AND l.holder = lease_release.holder
       AND l.fence = lease_release.fence AND NOT l.released
    RETURNING l.fence, l.expires_at <= t_now, current_setting('pylease.history', true)
         INTO freed, notify, history;
    IF freed IS NULL THEN
        RETURN false;
    ELSIF history IS NULL OR history IN ('', 'rare', 'none') THEN
        NULL;
    ELSIF history = 'all' THEN
        INSERT INTO pylease_events (at, name, event, holder, fence)
        VALUES (t_now, lease_release.name, 'released', lease_release.holder, freed);
    ELSE
        PERFORM pylease_refuse_history(history);
    END IF;
    IF notify THEN
        ignored := pg_notify('pylease', lease_release.name);
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION lease_holds(name text, holder text, fence bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    IF lease_holds.name IS NULL OR lease_holds.name = '' OR length(lease_holds.name) > 200
       OR lease_holds.holder IS NULL OR lease_holds.holder = '' OR length(lease_holds.holder) > 200
       OR lease_holds.fence IS NULL
    THEN
        PERFORM pylease_check_key('name', lease_holds.name);
        PERFORM pylease_check_key('holder', lease_holds.holder);
        RAISE EXCEPTION 'pylease: fence must not be NULL' USING ERRCODE = '22023', COLUMN = 'fence';
    END IF;

    PERFORM FROM pylease_leases AS l
      WHERE l.name = lease_holds.name AND l.holder = lease_holds.holder
        AND l.fence = lease_holds.fence AND NOT l.released
        AND l.expires_at > clock_timestamp()
        FOR KEY SHARE;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[], ttls interval[],
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
    IF cardinality(pylease_renew_held.fences) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
    ELSIF cardinality(pylease_renew_held.slots) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: slots must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'slots';
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

CREATE OR REPLACE FUNCTION lease_unwait(name text, waiter text, granted boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    head text;
    queued boolean;
BEGIN
    PERFORM pylease_check_key('name', lease_unwait.name);
    PERFORM pylease_check_key('waiter', lease_unwait.waiter);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_unwait');
    END IF;
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT w.waiter INTO head FROM pylease_waiters AS w
     WHERE w.name = lease_unwait.name AND w.expires_at > now_ ORDER BY w.id LIMIT 1;
    DELETE FROM pylease_waiters AS w
     WHERE w.name = lease_unwait.name AND w.waiter = lease_unwait.waiter;
    queued := FOUND;
    IF queued AND head = lease_unwait.waiter THEN
        SELECT w.waiter INTO head FROM pylease_waiters AS w
         WHERE w.name = lease_unwait.name AND w.expires_at > now_ ORDER BY w.id LIMIT 1;
        IF head IS NOT NULL THEN
            PERFORM pg_notify('pylease_waiters',
                              json_build_object('name', lease_unwait.name, 'waiter', head,
                                                'claim', NOT coalesce(granted, false))::text);
        END IF;
    END IF;
    -- Last, as in lease_wait.
    DELETE FROM pylease_waiters AS w
     WHERE w.id IN (SELECT x.id FROM pylease_waiters AS x WHERE x.expires_at <= now_
                     ORDER BY x.expires_at LIMIT 16 FOR UPDATE SKIP LOCKED);
    RETURN queued;
END
$$;

DROP FUNCTION pylease_release_shared(text, text, bigint);

CREATE OR REPLACE FUNCTION pylease_register_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.fence := greatest(NEW.fence, pylease_fence_floor(NEW.name) + 1);
    INSERT INTO pylease_names AS n (name, kind) VALUES (NEW.name, 'lease')
    ON CONFLICT (name) DO NOTHING;
    IF NOT FOUND AND EXISTS (SELECT FROM pylease_names AS n
                              WHERE n.name = NEW.name AND n.kind <> 'lease') THEN
        RAISE EXCEPTION 'pylease: name is a semaphore, not a lease'
            USING ERRCODE = '22023', COLUMN = 'name';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION lease_prune(idle_for interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cutoff  timestamptz;
    buckets integer[];
    leases  bigint;
    sems    bigint;
BEGIN
    PERFORM pylease_check_span('idle_for', lease_prune.idle_for);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_prune');
    END IF;
    cutoff := clock_timestamp() - lease_prune.idle_for;

    SELECT array_agg(c.b ORDER BY c.b) INTO buckets
      FROM (SELECT DISTINCT hashtext(i.name) & 1023 AS b
              FROM (SELECT l.name FROM pylease_leases AS l WHERE l.expires_at <= cutoff
                    UNION ALL
                    SELECT p.name FROM pylease_permits AS p
                     GROUP BY p.name HAVING max(p.expires_at) <= cutoff) AS i) AS c
     WHERE pg_try_advisory_xact_lock(1886153829, c.b);
    IF buckets IS NULL THEN
        RETURN 0;
    END IF;

    WITH gone AS (
        SELECT l.name, l.fence FROM pylease_leases AS l
         WHERE l.expires_at <= cutoff AND (hashtext(l.name) & 1023) = ANY (buckets)
           FOR UPDATE SKIP LOCKED
    ), floors AS (
        INSERT INTO pylease_fence_floors AS fl (bucket, floor)
        SELECT hashtext(g.name) & 1023, max(g.fence) FROM gone AS g GROUP BY 1
        ON CONFLICT (bucket) DO UPDATE SET floor = greatest(fl.floor, excluded.floor)
    ), deleted AS (
        DELETE FROM pylease_leases AS l USING gone AS g WHERE l.name = g.name
        RETURNING l.name
    ), unnamed AS (
        DELETE FROM pylease_names AS n USING deleted AS d WHERE n.name = d.name
    )
    SELECT count(*) INTO leases FROM deleted;

    -- A semaphore goes only whole: every slot idle, and every slot locked here.
    WITH idle AS (
        SELECT p.name, count(*) AS slots FROM pylease_permits AS p
         WHERE (hashtext(p.name) & 1023) = ANY (buckets)
         GROUP BY p.name HAVING max(p.expires_at) <= cutoff
    ), locked AS (
        SELECT p.name, p.fence FROM pylease_permits AS p
         WHERE p.name IN (SELECT i.name FROM idle AS i) AND p.expires_at <= cutoff
         ORDER BY p.name, p.slot
           FOR UPDATE SKIP LOCKED
    ), whole AS (
        SELECT k.name, max(k.fence) AS fence FROM locked AS k JOIN idle AS i USING (name)
         GROUP BY k.name, i.slots HAVING count(*) = i.slots
    ), floors AS (
        INSERT INTO pylease_fence_floors AS fl (bucket, floor)
        SELECT hashtext(w.name) & 1023, max(w.fence) FROM whole AS w WHERE w.fence > 0 GROUP BY 1
        ON CONFLICT (bucket) DO UPDATE SET floor = greatest(fl.floor, excluded.floor)
    ), slots AS (
        DELETE FROM pylease_permits AS p USING whole AS w WHERE p.name = w.name
    ), deleted AS (
        DELETE FROM pylease_names AS n USING whole AS w WHERE n.name = w.name
        RETURNING n.name
    )
    SELECT count(*) INTO sems FROM deleted;
    RETURN leases + sems;
END
$$;

DROP FUNCTION lease_status(text);
CREATE FUNCTION lease_status(name text DEFAULT NULL)
RETURNS TABLE(name text, holder text, fence bigint, acquired_at timestamptz,
              renewed_at timestamptz, expires_at timestamptz, held boolean,
              state text, ttl interval)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT l.name, l.holder, l.fence, l.acquired_at, l.renewed_at, l.expires_at,
           NOT l.released AND l.expires_at > c.now,
           CASE WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
                WHEN l.released THEN 'released' ELSE 'expired' END,
           l.ttl
      FROM pylease_leases AS l, (SELECT clock_timestamp() AS now) AS c
     WHERE $1 IS NULL OR l.name = $1
     ORDER BY l.name;
$$;

COMMENT ON FUNCTION lease_status(text) IS
    'pylease: one row per lease name (all when name is NULL); held means unexpired and not released; state is held, resting, released or expired.';
COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[], bigint[], integer[]) IS
    'pylease (internal, the keeper''s): renew leases and permits of several holders in one statement, each at its own ttl and in the tenure its fence names.';

DO $grants$
DECLARE
    kept  text := current_setting('pylease.status_acl');
    entry record;
BEGIN
    PERFORM set_config('pylease.status_acl', '', false);
    IF kept = '' THEN
        RETURN;
    END IF;
    REVOKE ALL ON FUNCTION lease_status(text) FROM PUBLIC;
    FOR entry IN
        SELECT a.grantee, a.is_grantable FROM aclexplode(kept::aclitem[]) AS a
         WHERE a.privilege_type = 'EXECUTE'
           AND a.grantee <> (SELECT p.proowner FROM pg_proc AS p
                              WHERE p.oid = 'lease_status(text)'::regprocedure)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION lease_status(text) TO %s%s',
                       CASE WHEN entry.grantee = 0 THEN 'PUBLIC' ELSE entry.grantee::regrole::text END,
                       CASE WHEN entry.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$grants$;

DROP TABLE pylease_shared;

DELETE FROM pylease_leases AS l WHERE l.holder IS NULL;
DELETE FROM pylease_names AS n
 WHERE n.kind = 'lease' AND NOT EXISTS (SELECT FROM pylease_leases AS l WHERE l.name = n.name);
ALTER TABLE pylease_leases DROP CONSTRAINT pylease_leases_unclaimed;
ALTER TABLE pylease_leases DROP CONSTRAINT pylease_leases_fence_check;
ALTER TABLE pylease_leases ADD CONSTRAINT pylease_leases_fence_check CHECK (fence > 0);
ALTER TABLE pylease_leases ALTER COLUMN holder SET NOT NULL;
