-- Undo pylease 0006: the 0005 definitions of lease_claim, lease_steal, lease_wait
-- and lease_unwait; no fenced lease_release, no index on the waiters' expiry.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION lease_release(text, text, interval, bigint);
DROP INDEX pylease_waiters_expires_at;

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

-- Take a lease whatever its state, when its holder last claimed or renewed at
-- least older_than ago; on a free name, a claim. The new fence, or NULL. As in
-- lease_claim, the row is replaced only if it is still as read.
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

-- Queue a waiter for a lease name, or refresh its expiry: true when it is the head
-- (the first unexpired waiter), which alone claims again on a release. The expired
-- waiters of the name are removed.
CREATE OR REPLACE FUNCTION lease_wait(name text, waiter text, ttl interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    PERFORM pylease_check_key('name', lease_wait.name);
    PERFORM pylease_check_key('waiter', lease_wait.waiter);
    PERFORM pylease_check_ttl('ttl', lease_wait.ttl);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_wait');
    END IF;
    -- A queue entry lost in a crash is harmless (its waiter queues again when it
    -- refreshes): no flush, while this transaction has written nothing else.
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    DELETE FROM pylease_waiters AS w
     WHERE w.name = lease_wait.name AND w.expires_at <= now_;
    INSERT INTO pylease_waiters AS w (name, waiter, expires_at)
    VALUES (lease_wait.name, lease_wait.waiter, now_ + lease_wait.ttl)
    ON CONFLICT ON CONSTRAINT pylease_waiters_name_waiter_key
    DO UPDATE SET expires_at = excluded.expires_at;
    RETURN (SELECT w.waiter FROM pylease_waiters AS w
             WHERE w.name = lease_wait.name ORDER BY w.id LIMIT 1) = lease_wait.waiter;
END
$$;

-- Take a waiter out of the queue of a lease name: true if it was queued. When it
-- was the head, the new head is woken: NOTIFY pylease_waiters with the payload
-- {"name": ..., "waiter": ..., "claim": ...}; claim is true unless the waiter
-- leaves with the lease (granted), whose release will notify pylease as always.
CREATE OR REPLACE FUNCTION lease_unwait(name text, waiter text, granted boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    head text;
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
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF head = lease_unwait.waiter THEN
        SELECT w.waiter INTO head FROM pylease_waiters AS w
         WHERE w.name = lease_unwait.name AND w.expires_at > now_ ORDER BY w.id LIMIT 1;
        IF head IS NOT NULL THEN
            PERFORM pg_notify('pylease_waiters',
                              json_build_object('name', lease_unwait.name, 'waiter', head,
                                                'claim', NOT coalesce(granted, false))::text);
        END IF;
    END IF;
    RETURN true;
END
$$;
