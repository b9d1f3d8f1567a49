-- Undo pylease 0020: pylease_claim_shared as pylease-0019-shares defined it.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

CREATE OR REPLACE FUNCTION pylease_claim_shared(name text, ttl interval, holder text, new_tenure boolean,
                                     OUT epoch bigint, OUT share integer)
-- Waits at most lock_timeout for the lease row (an exclusive grant under way, or the
-- exclusive holder's renewal), then counts as busy.
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now     timestamptz := clock_timestamp();
    s_holder  text;
    s_fence   bigint;
    s_freed   boolean;
    s_expires timestamptz;
    s_mine    boolean;
    s_queued  boolean;
    s_share   integer;
    history   text;
BEGIN
    IF pylease_claim_shared.name IS NULL OR pylease_claim_shared.name = ''
       OR length(pylease_claim_shared.name) > 200
       OR pylease_claim_shared.ttl IS NULL OR NOT isfinite(pylease_claim_shared.ttl)
       OR pylease_claim_shared.ttl <= interval '0' OR pylease_claim_shared.ttl > interval '366 days'
       OR pylease_claim_shared.holder IS NULL OR pylease_claim_shared.holder = ''
       OR length(pylease_claim_shared.holder) > 200 OR pylease_claim_shared.new_tenure IS NULL
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', pylease_claim_shared.name);
        PERFORM pylease_check_ttl('ttl', pylease_claim_shared.ttl);
        PERFORM pylease_check_key('holder', pylease_claim_shared.holder);
        IF pylease_claim_shared.new_tenure IS NULL THEN
            RAISE EXCEPTION 'pylease: new_tenure must not be NULL'
                USING ERRCODE = '22023', COLUMN = 'new_tenure';
        END IF;
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby('lease_claim_shared');
        END IF;
        PERFORM pylease_refuse_read_only('lease_claim_shared');
    END IF;

    LOOP
        -- Busy, decided by one read (no row lock, no WAL): an exclusive holder whose
        -- lease is unexpired (or resting after a min_hold release), or a writer
        -- waiting in the queue of waiting processes (writer preference), unless this
        -- holder reads the name already (a retried claim); for a new tenure, this
        -- holder's unexpired share of the epoch too.
        SELECT l.holder, l.fence, l.released, l.expires_at,
               EXISTS (SELECT FROM pylease_shared AS s
                        WHERE s.name = l.name AND s.holder = pylease_claim_shared.holder
                          AND s.epoch = l.fence
                          AND (NOT pylease_claim_shared.new_tenure OR s.expires_at > t_now)),
               EXISTS (SELECT FROM pylease_waiters AS w
                        WHERE w.name = l.name AND w.expires_at > t_now)
          INTO s_holder, s_fence, s_freed, s_expires, s_mine, s_queued
          FROM pylease_leases AS l
         WHERE l.name = pylease_claim_shared.name;
        IF NOT FOUND THEN
            -- The name's first claim: a row for readers to lock (no holder; its fence
            -- the floor, pylease_register_lease); a conflict: another first claim made it.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, released)
            VALUES (pylease_claim_shared.name, NULL, 0, pylease_claim_shared.ttl, t_now, t_now,
                    t_now, true)
            ON CONFLICT DO NOTHING;
            CONTINUE;
        ELSIF s_expires > t_now OR (s_queued AND NOT s_mine)
              OR (s_mine AND pylease_claim_shared.new_tenure) THEN
            RETURN;
        END IF;

        IF current_setting('statement_timeout') <> '0' THEN
            PERFORM set_config('lock_timeout', least(2000, greatest(1, (500 * extract(epoch
                FROM current_setting('statement_timeout')::interval))::bigint))::text, true);
        END IF;
        BEGIN
            -- Locked FOR KEY SHARE, the row stays as read here until this transaction
            -- ends: no exclusive grant (it changes the fence, a key column) comes
            -- between, and the one that waits for this lock sees this reader.
            SELECT l.holder, l.fence, l.released, l.expires_at
              INTO s_holder, s_fence, s_freed, s_expires
              FROM pylease_leases AS l
             WHERE l.name = pylease_claim_shared.name
               FOR KEY SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'PLAGN';  -- pruned meanwhile
            ELSIF s_expires > t_now THEN
                RAISE EXCEPTION USING ERRCODE = 'PLBSY';
            ELSIF NOT s_freed THEN
                -- The exclusive holder died (its ttl ran out without a release): the row
                -- is marked released, so that its late renewal cannot make it hold again
                -- beside this reader. The one write of a reader to the row, counted and
                -- recorded as the takeover it is; a renewal that came first wins.
                UPDATE pylease_leases AS l
                   SET released  = true,
                       takeovers = l.takeovers + 1
                 WHERE l.name = pylease_claim_shared.name AND l.fence = s_fence
                   AND NOT l.released AND l.expires_at <= t_now;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'PLAGN';
                END IF;
                history := current_setting('pylease.history', true);
                IF history IS NULL OR history IN ('', 'rare', 'all') THEN
                    INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
                    VALUES (t_now, pylease_claim_shared.name, 'taken_over',
                            pylease_claim_shared.holder, s_fence, s_holder);
                ELSIF history <> 'none' THEN
                    PERFORM pylease_refuse_history(history);
                END IF;
            END IF;
            -- A retried claim of this epoch keeps its share (its id and acquired_at)
            -- and never moves its expiry earlier; a row of an earlier epoch is a share
            -- that was lost, and a new tenure's is a new share (the id the insert drew).
            -- A new tenure's claim that meets this holder's unexpired share of the epoch
            -- (another claim of it committed meanwhile) changes nothing and is busy.
            INSERT INTO pylease_shared AS s (name, holder, epoch, ttl, acquired_at, renewed_at,
                                             expires_at)
            VALUES (pylease_claim_shared.name, pylease_claim_shared.holder, s_fence,
                    pylease_claim_shared.ttl, t_now, t_now, t_now + pylease_claim_shared.ttl)
            ON CONFLICT (name, holder) DO UPDATE
               SET acquired_at = CASE WHEN s.epoch = excluded.epoch AND NOT pylease_claim_shared.new_tenure
                                      THEN s.acquired_at ELSE excluded.acquired_at END,
                   expires_at  = CASE WHEN s.epoch = excluded.epoch AND NOT pylease_claim_shared.new_tenure
                                      THEN greatest(s.expires_at, excluded.expires_at)
                                      ELSE excluded.expires_at END,
                   share       = CASE WHEN s.epoch = excluded.epoch AND NOT pylease_claim_shared.new_tenure
                                      THEN s.share ELSE excluded.share END,
                   epoch       = excluded.epoch,
                   ttl         = excluded.ttl,
                   renewed_at  = excluded.renewed_at
             WHERE NOT (pylease_claim_shared.new_tenure AND s.epoch = excluded.epoch
                        AND s.expires_at > t_now)
            RETURNING s.share INTO s_share;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'PLBSY';
            END IF;
        EXCEPTION
            WHEN lock_not_available OR SQLSTATE 'PLBSY' THEN
                RETURN;
            WHEN SQLSTATE 'PLAGN' THEN
                CONTINUE;  -- the row changed since it was read: decide again
        END;
        IF NOT s_mine THEN
            history := current_setting('pylease.history', true);
            IF history = 'all' THEN
                INSERT INTO pylease_events (at, name, event, holder, fence)
                VALUES (t_now, pylease_claim_shared.name, 'claimed', pylease_claim_shared.holder,
                        s_fence);
            ELSIF history IS NOT NULL AND history NOT IN ('', 'rare', 'none') THEN
                PERFORM pylease_refuse_history(history);
            END IF;
        END IF;
        epoch := s_fence;
        share := s_share;
        RETURN;
    END LOOP;
END
$$;
