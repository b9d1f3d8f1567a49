-- pylease 0004: cheaper lease functions (issue 13, item 4). Keep
-- sql/postgres/schema.sql in step. Same signatures, same promises (a busy claim
-- still takes no row lock and writes no WAL, a release still skips the flush,
-- fences, counters and history as in 0003); fewer steps on the hot paths:
--   * the standby test joins the argument test (one expression, not two);
--   * lease_claim decides "busy" in the read itself, and reads the history
--     setting in the UPDATE that grants;
--   * lease_release calls set_config and pg_notify as expressions, not PERFORM
--     (which starts the executor for each), and reads the setting in its UPDATE;
--   * lease_renew_many and lease_renew_each check their elements inside the
--     statement instead of in three queries of their own before it.
-- depends: pylease-0003-operations

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Claim a lease: the fence when granted, NULL when another holder's unexpired
-- lease stands. A busy lease is answered by one read (no row lock, no WAL) that
-- also decides "busy", so the busy path is three steps.
-- A grant updates the row only if it is still as read (fence, released), so
-- that the exhaustion check and the history see exactly the row they replace;
-- otherwise somebody else changed it meanwhile and the claim looks again.
CREATE OR REPLACE FUNCTION lease_claim(name text, ttl interval, holder text) RETURNS bigint
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
    -- One cheap test in the common case (the standby's too); the checks that
    -- raise run only when it fails.
    IF lease_claim.name IS NULL OR lease_claim.name = '' OR length(lease_claim.name) > 200
       OR lease_claim.ttl IS NULL OR NOT isfinite(lease_claim.ttl)
       OR lease_claim.ttl <= interval '0' OR lease_claim.ttl > interval '366 days'
       OR lease_claim.holder IS NULL OR lease_claim.holder = '' OR length(lease_claim.holder) > 200
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', lease_claim.name);
        PERFORM pylease_check_ttl('ttl', lease_claim.ttl);
        PERFORM pylease_check_key('holder', lease_claim.holder);
        PERFORM pylease_refuse_standby('lease_claim');
    END IF;

    LOOP
        -- Busy: unexpired (or resting after a min_hold release) and not ours.
        SELECT l.holder, l.fence, l.released,
               l.expires_at > t_now AND (l.released OR l.holder <> lease_claim.holder)
          INTO s_holder, s_fence, s_freed, s_busy
          FROM pylease_leases AS l
         WHERE l.name = lease_claim.name;
        IF s_busy THEN
            RETURN NULL;
        ELSIF s_fence IS NULL THEN
            -- A first claim of the name; a conflict means another claimer created it first.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, grants)
            VALUES (lease_claim.name, lease_claim.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    lease_claim.ttl, t_now, t_now, t_now + lease_claim.ttl, 1)
            ON CONFLICT DO NOTHING  -- the name (or its (name, fence) key) exists: another claimer won
            RETURNING l.fence, current_setting('pylease.history', true) INTO granted, history;
            IF history IS NULL OR history IN ('', 'rare', 'none') THEN
                RETURN granted;
            ELSIF history = 'all' THEN
                INSERT INTO pylease_events (at, name, event, holder, fence)
                VALUES (t_now, lease_claim.name, 'claimed', lease_claim.holder, granted);
                RETURN granted;
            END IF;
            PERFORM pylease_refuse_history(history);
        ELSIF NOT s_freed AND s_holder = lease_claim.holder THEN
            -- Still ours: a retried claim whose reply was lost keeps its fence
            -- instead of looking busy.
            UPDATE pylease_leases AS l
               SET ttl        = lease_claim.ttl,
                   renewed_at = t_now,
                   expires_at = t_now + lease_claim.ttl
             WHERE l.name = lease_claim.name AND l.fence = s_fence
               AND l.holder = lease_claim.holder AND NOT l.released
            RETURNING l.fence INTO granted;
            IF granted IS NOT NULL THEN
                RETURN granted;
            END IF;
        ELSIF s_fence = 9223372036854775807 THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(lease_claim.name), s_fence USING ERRCODE = '54000';
        ELSE
            -- Free (released, or expired: a takeover). The fence is floored by the
            -- timeline WAL is written on, so a promoted standby never reissues the
            -- old primary's fences. The setting is read by the same statement.
            BEGIN
                UPDATE pylease_leases AS l
                   SET fence       = greatest(s_fence + 1,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                       acquired_at = t_now,
                       holder      = lease_claim.holder,
                       ttl         = lease_claim.ttl,
                       renewed_at  = t_now,
                       expires_at  = t_now + lease_claim.ttl,
                       released    = false,
                       grants      = l.grants + 1,
                       takeovers   = l.takeovers + CASE WHEN s_freed THEN 0 ELSE 1 END
                 WHERE l.name = lease_claim.name AND l.fence = s_fence AND l.released = s_freed
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
                VALUES (t_now, lease_claim.name,
                        CASE WHEN s_freed THEN 'claimed' ELSE 'taken_over' END,
                        lease_claim.holder, granted, s_holder);
                RETURN granted;
            END IF;
        END IF;
    END LOOP;
END
$$;

-- Give a lease back, only if this holder still holds it. Without the WAL flush
-- when the release is the first write of its transaction: a release lost in a
-- crash only keeps the lease until its expiry. Every step on the common path is
-- an expression PL/pgSQL evaluates itself (an assignment, not PERFORM, which
-- would start the executor for each call of set_config and pg_notify).
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

-- Renew many leases in one statement: one row per element of names, in order.
-- The elements are checked inside the statement (a bad one aborts it, so
-- nothing changes), and only a failing test calls the check that names it.
CREATE OR REPLACE FUNCTION lease_renew_many(names text[], holders text[], ttl interval DEFAULT NULL)
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

    -- Rows are locked in name order, so two renewers of overlapping sets (an
    -- owner and a keep_fresh helper) cannot deadlock. FOR NO KEY UPDATE passes
    -- the FOR KEY SHARE of a holder's fenced transaction.
    RETURN QUERY
    WITH wanted AS (
        SELECT u.n, u.h, u.i
          FROM unnest(lease_renew_many.names, lease_renew_many.holders) WITH ORDINALITY AS u(n, h, i)
         WHERE CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                    THEN pylease_check_batch(lease_renew_many.names, lease_renew_many.holders, NULL) IS NULL
                    ELSE true END
    ), locked AS (
        SELECT l.name
          FROM wanted AS w JOIN pylease_leases AS l ON l.name = w.n AND l.holder = w.h
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
        RETURNING l.name, l.holder
    )
    SELECT w.n, r.name IS NOT NULL
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h
     ORDER BY w.i;
END
$$;

-- Renew many leases in one statement, each with its own ttl (NULL: its last
-- one): per element of names, in order, whether it was renewed, the expiry
-- granted and the server's clock when it was (NULLs when not renewed). A
-- client's local expiry is its send time + (expires_at - server_time). As in
-- lease_renew_many, the elements are checked inside the statement.
CREATE OR REPLACE FUNCTION lease_renew_each(names text[], holders text[], ttls interval[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF lease_renew_each.ttls IS NULL THEN
        RAISE EXCEPTION 'pylease: ttls must not be NULL' USING ERRCODE = '22023', COLUMN = 'ttls';
    END IF;
    IF lease_renew_each.names IS NULL OR lease_renew_each.holders IS NULL
       OR cardinality(lease_renew_each.names) <> cardinality(lease_renew_each.holders)
       OR cardinality(lease_renew_each.ttls) <> cardinality(lease_renew_each.names)
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_batch(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls);
        PERFORM pylease_refuse_standby('lease_renew_each');
    END IF;

    RETURN QUERY
    WITH wanted AS (
        SELECT u.n, u.h, u.t, u.i
          FROM unnest(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls)
               WITH ORDINALITY AS u(n, h, t, i)
         WHERE CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                      OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                    THEN pylease_check_batch(lease_renew_each.names, lease_renew_each.holders,
                                             lease_renew_each.ttls) IS NULL
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
    SELECT w.n, r.name IS NOT NULL, r.expires_at, CASE WHEN r.name IS NOT NULL THEN t_now END
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h
     ORDER BY w.i;
END
$$;

-- A steal with older_than '0' (the default, an operator's break-lock) is unconditional,
-- also when a renewal commits while it waits for the row.
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
               expires_at  = t_now + lease_steal.ttl,
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
