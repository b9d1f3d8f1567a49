-- pylease 0006: a tenure's expiry and its release (issue 21, items 5, 14 and 17).
-- Keep sql/postgres/schema.sql in step.
--   * lease_claim by the holder the row still names (the idempotent re-claim), and
--     lease_steal by that holder, never move the expiry earlier: the later of the
--     current one and now + ttl, as a renewal (the row's ttl is still updated).
--   * lease_release(name, holder, min_hold, fence): releases only the tenure with
--     that fence (contract 5.6). No DEFAULT on fence, so that every call with two or
--     three arguments still resolves to lease_release(text, text, interval) alone.
--   * pylease_waiters: an expired entry is never the head, and lease_wait and
--     lease_unwait each end by removing a few expired entries of any name (those of
--     names nobody waits on any more stayed forever), with an index to find them.
-- depends: pylease-0005-waiters

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
            -- instead of looking busy. Never earlier, as a renewal: another session
            -- of this holder must not cut short what the owner was granted.
            UPDATE pylease_leases AS l
               SET ttl        = lease_claim.ttl,
                   renewed_at = t_now,
                   expires_at = greatest(l.expires_at, t_now + lease_claim.ttl)
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
-- lease_claim, the row is replaced only if it is still as read. From the holder the
-- row names, the expiry never moves earlier: the earlier tenure's owner may still
-- believe what it was granted.
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

-- Give back one tenure: as above, only if this holder still holds the lease and
-- with this fence, so that a late release of an earlier tenure changes nothing once
-- the same holder holds the name again. The fence has no DEFAULT: a call with two or
-- three arguments, positional or named, still means the function above alone.
CREATE FUNCTION lease_release(name text, holder text, min_hold interval, fence bigint)
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

COMMENT ON FUNCTION lease_release(text, text, interval, bigint) IS
    'pylease: give back the tenure with this fence if this holder still holds it; as lease_release(name, holder, min_hold) otherwise.';

-- For the sweep of expired entries (of names nobody waits on any more) that
-- lease_wait and lease_unwait end with.
CREATE INDEX pylease_waiters_expires_at ON pylease_waiters (expires_at);

-- Queue a waiter for a lease name, or refresh its expiry: true when it is the head
-- (the first unexpired waiter), which alone claims again on a release. The expired
-- waiters of the name are removed, and a few expired ones of any name.
CREATE OR REPLACE FUNCTION lease_wait(name text, waiter text, ttl interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    head text;
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
    -- An entry committed while the insert waited for a row may have expired since.
    SELECT w.waiter INTO head FROM pylease_waiters AS w
     WHERE w.name = lease_wait.name AND w.expires_at > now_ ORDER BY w.id LIMIT 1;
    -- Last: the sweep waits for no row, and nothing after it waits while it holds some
    -- (so two calls never wait for each other's).
    DELETE FROM pylease_waiters AS w
     WHERE w.id IN (SELECT x.id FROM pylease_waiters AS x WHERE x.expires_at <= now_
                     ORDER BY x.expires_at LIMIT 16 FOR UPDATE SKIP LOCKED);
    RETURN head = lease_wait.waiter;
END
$$;

-- Take a waiter out of the queue of a lease name: true if it was queued. When it
-- was the head, the new head is woken: NOTIFY pylease_waiters with the payload
-- {"name": ..., "waiter": ..., "claim": ...}; claim is true unless the waiter
-- leaves with the lease (granted), whose release will notify pylease as always.
-- A few expired entries of any name are removed, as by lease_wait.
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
