-- Undo pylease 0012: each claim has its own body again, and renewals match the
-- holder alone. The functions 0012 turned into SQL functions get their bodies of
-- 0007-0009 back (so that nothing depends on what 0012 added), then what 0012
-- added is dropped.

DO $pin$
BEGIN
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
    -- One cheap test in the common case (a read-only transaction's too, as on a
    -- standby); the checks that raise run only when it fails.
    IF lease_claim.name IS NULL OR lease_claim.name = '' OR length(lease_claim.name) > 200
       OR lease_claim.ttl IS NULL OR NOT isfinite(lease_claim.ttl)
       OR lease_claim.ttl <= interval '0' OR lease_claim.ttl > interval '366 days'
       OR lease_claim.holder IS NULL OR lease_claim.holder = '' OR length(lease_claim.holder) > 200
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', lease_claim.name);
        PERFORM pylease_check_ttl('ttl', lease_claim.ttl);
        PERFORM pylease_check_key('holder', lease_claim.holder);
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby('lease_claim');
        END IF;
        -- Even a busy answer would be wrong here: nothing could ever be granted.
        PERFORM pylease_refuse_read_only('lease_claim');
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

-- Claim a new tenure: as lease_claim, except that a tenure of the same holder
-- is never continued. Unexpired, it is busy: another process uses this holder
-- (the Python API and the command line claim so with a holder they were given,
-- contract 5.6). Expired, it is taken over with a new fence, so that the earlier
-- tenure's fenced writes (lease_holds with its fence) fail from then on.
CREATE OR REPLACE FUNCTION lease_claim_new(name text, ttl interval, holder text) RETURNS bigint
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
    IF lease_claim_new.name IS NULL OR lease_claim_new.name = '' OR length(lease_claim_new.name) > 200
       OR lease_claim_new.ttl IS NULL OR NOT isfinite(lease_claim_new.ttl)
       OR lease_claim_new.ttl <= interval '0' OR lease_claim_new.ttl > interval '366 days'
       OR lease_claim_new.holder IS NULL OR lease_claim_new.holder = ''
       OR length(lease_claim_new.holder) > 200
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', lease_claim_new.name);
        PERFORM pylease_check_ttl('ttl', lease_claim_new.ttl);
        PERFORM pylease_check_key('holder', lease_claim_new.holder);
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby('lease_claim_new');
        END IF;
        -- Even a busy answer would be wrong here: nothing could ever be granted.
        PERFORM pylease_refuse_read_only('lease_claim_new');
    END IF;

    LOOP
        -- Busy: unexpired (or resting after a min_hold release), whoever holds it.
        SELECT l.holder, l.fence, l.released, l.expires_at > t_now
          INTO s_holder, s_fence, s_freed, s_busy
          FROM pylease_leases AS l
         WHERE l.name = lease_claim_new.name;
        IF s_busy THEN
            RETURN NULL;
        ELSIF s_fence IS NULL THEN
            -- A first claim of the name; a conflict means another claimer created it first.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, grants)
            VALUES (lease_claim_new.name, lease_claim_new.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    lease_claim_new.ttl, t_now, t_now, t_now + lease_claim_new.ttl, 1)
            ON CONFLICT DO NOTHING  -- the name (or its (name, fence) key) exists: another claimer won
            RETURNING l.fence, current_setting('pylease.history', true) INTO granted, history;
            IF history IS NULL OR history IN ('', 'rare', 'none') THEN
                RETURN granted;
            ELSIF history = 'all' THEN
                INSERT INTO pylease_events (at, name, event, holder, fence)
                VALUES (t_now, lease_claim_new.name, 'claimed', lease_claim_new.holder, granted);
                RETURN granted;
            END IF;
            PERFORM pylease_refuse_history(history);
        ELSIF s_fence = 9223372036854775807 THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(lease_claim_new.name), s_fence USING ERRCODE = '54000';
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
                       holder      = lease_claim_new.holder,
                       ttl         = lease_claim_new.ttl,
                       renewed_at  = t_now,
                       expires_at  = t_now + lease_claim_new.ttl,
                       released    = false,
                       grants      = l.grants + 1,
                       takeovers   = l.takeovers + CASE WHEN s_freed THEN 0 ELSE 1 END
                 WHERE l.name = lease_claim_new.name AND l.fence = s_fence AND l.released = s_freed
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
                VALUES (t_now, lease_claim_new.name,
                        CASE WHEN s_freed THEN 'claimed' ELSE 'taken_over' END,
                        lease_claim_new.holder, granted, s_holder);
                RETURN granted;
            END IF;
        END IF;
    END LOOP;
END
$$;

-- Renew a lease this holder still holds, also past its expiry if nobody took it.
-- Never earlier: another renewer's shorter ttl must not cut short what the owner
-- was granted.
CREATE OR REPLACE FUNCTION lease_renew(name text, holder text, ttl interval DEFAULT NULL) RETURNS boolean
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
     WHERE l.name = lease_renew.name AND l.holder = lease_renew.holder AND NOT l.released;
    RETURN FOUND;
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

-- Claim permits slots of a semaphore of max_permits: one (slot, fence) row per slot
-- when granted, no row when fewer are free. The name's first claim makes it a
-- semaphore with this limit; another limit raises 22023. A holder that still holds
-- its slots gets them again, extended (never earlier). A busy claim is answered by
-- reads alone (no row lock, no WAL). A grant takes free slots starting where a hash
-- of the holder points and skips slots another transaction has locked (a claimer, a
-- holder's fenced transaction), so claimers spread over the free slots instead of
-- queueing for one; it never waits for a row, so it cannot deadlock. A slot above a
-- lowered limit keeps the slot below it that it maps onto (slot % limit) busy
-- until it is free: the held slots drain down to the new limit.
CREATE OR REPLACE FUNCTION permit_claim(name text, max_permits integer, ttl interval, holder text,
                             permits integer DEFAULT 1)
RETURNS TABLE(slot integer, fence bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    s_kind  text;
    s_max   integer;
    mine    integer;
    whole   boolean;
    start   integer;
    taken   integer[];
    worn    integer;
    history text;
BEGIN
    IF permit_claim.name IS NULL OR permit_claim.name = '' OR length(permit_claim.name) > 200
       OR permit_claim.max_permits IS NULL OR permit_claim.max_permits < 1
       OR permit_claim.max_permits > 10000
       OR permit_claim.ttl IS NULL OR NOT isfinite(permit_claim.ttl)
       OR permit_claim.ttl <= interval '0' OR permit_claim.ttl > interval '366 days'
       OR permit_claim.holder IS NULL OR permit_claim.holder = '' OR length(permit_claim.holder) > 200
       OR permit_claim.permits IS NULL OR permit_claim.permits < 1
       OR permit_claim.permits > permit_claim.max_permits
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', permit_claim.name);
        PERFORM pylease_check_count('max_permits', permit_claim.max_permits, 10000, '10000');
        PERFORM pylease_check_ttl('ttl', permit_claim.ttl);
        PERFORM pylease_check_key('holder', permit_claim.holder);
        PERFORM pylease_check_count('permits', permit_claim.permits, permit_claim.max_permits,
                                    'max_permits');
        PERFORM pylease_refuse_standby('permit_claim');
    END IF;

    LOOP
        SELECT n.kind, n.max_permits INTO s_kind, s_max
          FROM pylease_names AS n WHERE n.name = permit_claim.name;
        EXIT WHEN FOUND;
        -- The first claim: the name becomes a semaphore, with a row per slot. A
        -- conflict means another first claim (of either kind) committed it first.
        INSERT INTO pylease_names AS n (name, kind, max_permits)
        VALUES (permit_claim.name, 'semaphore', permit_claim.max_permits)
        ON CONFLICT (name) DO NOTHING;
        IF FOUND THEN
            INSERT INTO pylease_permits AS p (name, slot)
            SELECT permit_claim.name, s.i FROM generate_series(0, permit_claim.max_permits - 1) AS s(i);
        END IF;
    END LOOP;
    IF s_kind <> 'semaphore' THEN
        RAISE EXCEPTION 'pylease: name is a lease, not a semaphore'
            USING ERRCODE = '22023', COLUMN = 'name';
    ELSIF s_max <> permit_claim.max_permits THEN
        RAISE EXCEPTION 'pylease: max_permits % differs from the limit % of this semaphore',
            permit_claim.max_permits, s_max USING ERRCODE = '22023', COLUMN = 'max_permits';
    END IF;

    -- Still this holder's: a retried claim whose reply was lost gets its slots again.
    SELECT count(*), count(*) = min(p.permits) AND count(*) = max(p.permits)
      INTO mine, whole
      FROM pylease_permits AS p
     WHERE p.name = permit_claim.name AND p.holder = permit_claim.holder AND NOT p.released;
    IF mine > 0 THEN
        IF mine <> permit_claim.permits OR NOT whole THEN
            RAISE EXCEPTION 'pylease: permits must be as many as this holder already holds of this semaphore (release them first)'
                USING ERRCODE = '22023', COLUMN = 'permits';
        END IF;
        -- Locked in slot order, as by every statement that locks several slots; a slot
        -- taken meanwhile drops out, and then nothing is extended.
        RETURN QUERY
        WITH locked AS (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = permit_claim.name AND p.holder = permit_claim.holder AND NOT p.released
             ORDER BY p.slot
               FOR NO KEY UPDATE OF p
        ), extended AS (
            UPDATE pylease_permits AS p
               SET ttl        = permit_claim.ttl,
                   renewed_at = t_now,
                   expires_at = greatest(p.expires_at, t_now + permit_claim.ttl)
              FROM locked AS k
             WHERE p.name = permit_claim.name AND p.slot = k.slot
               AND (SELECT count(*) FROM locked) = permit_claim.permits
            RETURNING p.slot, p.fence
        )
        SELECT e.slot, e.fence FROM extended AS e ORDER BY e.slot;
        RETURN;
    END IF;

    -- Busy: fewer than permits slots free. Reads only.
    IF (SELECT count(*) FROM pylease_permits AS p
         WHERE p.name = permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
           AND NOT EXISTS (SELECT FROM pylease_permits AS q
                            WHERE q.name = permit_claim.name AND q.slot >= s_max
                              AND q.slot % s_max = p.slot AND q.expires_at > t_now)
       ) < permit_claim.permits THEN
        RETURN;
    END IF;

    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    start := ((hashtext(permit_claim.holder) % s_max) + s_max) % s_max;
    BEGIN
        SELECT array_agg(c.slot) INTO taken FROM (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
               AND NOT EXISTS (SELECT FROM pylease_permits AS q
                                WHERE q.name = permit_claim.name AND q.slot >= s_max
                                  AND q.slot % s_max = p.slot AND q.expires_at > t_now)
             ORDER BY (p.slot - start + s_max) % s_max
             LIMIT permit_claim.permits
               FOR UPDATE OF p SKIP LOCKED) AS c;
        IF coalesce(cardinality(taken), 0) < permit_claim.permits THEN
            -- Other claimers took the slots meanwhile: give back the ones locked here.
            RAISE EXCEPTION USING ERRCODE = 'PLBSY';
        END IF;
        SELECT min(p.slot) INTO worn FROM pylease_permits AS p
         WHERE p.name = permit_claim.name AND p.slot = ANY (taken)
           AND p.fence = 9223372036854775807;
        IF worn IS NOT NULL THEN
            RAISE EXCEPTION 'pylease: semaphore % has used every fence of slot %: it cannot be granted again',
                quote_literal(permit_claim.name), worn USING ERRCODE = '54000';
        END IF;
        -- A fence floored by the timeline, as a lease's. The next grant of a slot freed
        -- by permit_revoke from an unexpired holder is a steal.
        RETURN QUERY
        WITH old AS (
            SELECT p.slot, p.holder, p.fence, p.released, p.revoked FROM pylease_permits AS p
             WHERE p.name = permit_claim.name AND p.slot = ANY (taken)
        ), granted AS (
            UPDATE pylease_permits AS p
               SET fence       = greatest(p.fence + 1,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                   holder      = permit_claim.holder,
                   permits     = permit_claim.permits,
                   ttl         = permit_claim.ttl,
                   acquired_at = t_now,
                   renewed_at  = t_now,
                   expires_at  = t_now + permit_claim.ttl,
                   released    = false,
                   revoked     = false,
                   grants      = p.grants + 1,
                   takeovers   = p.takeovers + CASE WHEN o.fence > 0 AND NOT o.released THEN 1 ELSE 0 END,
                   steals      = p.steals + CASE WHEN o.revoked THEN 1 ELSE 0 END
              FROM old AS o
             WHERE p.name = permit_claim.name AND p.slot = o.slot
            RETURNING p.slot, p.fence,
                      CASE WHEN o.revoked THEN 'stolen' WHEN o.fence = 0 OR o.released THEN 'claimed'
                           ELSE 'taken_over' END AS event,
                      CASE WHEN o.fence > 0 THEN o.holder END AS previous
        ), recorded AS (
            INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder, slot)
            SELECT t_now, permit_claim.name, g.event, permit_claim.holder, g.fence, g.previous, g.slot
              FROM granted AS g
             WHERE history = 'all' OR (coalesce(history, '') IN ('', 'rare') AND g.event <> 'claimed')
        )
        SELECT g.slot, g.fence FROM granted AS g ORDER BY g.slot;
    EXCEPTION WHEN SQLSTATE 'PLBSY' THEN
        RETURN;
    END;
END
$$;

-- Claim every lease of names for holder, all or nothing: one (name, fence) row per
-- name, in the order of names, when all were granted; no row when any is busy.
-- Names this holder still holds are extended with their fences, as by lease_claim.
-- A busy claim is answered by one read (no row lock, no WAL). A grant creates the
-- new names, in name order, then locks every row, in name order, so that two claims
-- of overlapping names never deadlock and no other caller sees a subset granted; a
-- row still locked after lock_timeout (a holder's open fenced transaction) counts
-- as busy, as for lease_claim.
CREATE OR REPLACE FUNCTION lease_claim_all(names text[], ttl interval, holder text)
RETURNS TABLE(name text, fence bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now    timestamptz := clock_timestamp();
    created  text[];
    worn     text;
    history  text;
BEGIN
    PERFORM pylease_check_names('names', lease_claim_all.names);
    IF lease_claim_all.ttl IS NULL OR NOT isfinite(lease_claim_all.ttl)
       OR lease_claim_all.ttl <= interval '0' OR lease_claim_all.ttl > interval '366 days'
       OR lease_claim_all.holder IS NULL OR lease_claim_all.holder = ''
       OR length(lease_claim_all.holder) > 200 OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_ttl('ttl', lease_claim_all.ttl);
        PERFORM pylease_check_key('holder', lease_claim_all.holder);
        PERFORM pylease_refuse_standby('lease_claim_all');
    END IF;

    IF EXISTS (SELECT FROM pylease_leases AS l
                WHERE l.name = ANY (lease_claim_all.names) AND l.expires_at > t_now
                  AND (l.released OR l.holder <> lease_claim_all.holder)) THEN
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
            SELECT u.n, lease_claim_all.holder,
                   ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                   lease_claim_all.ttl, t_now, t_now, t_now + lease_claim_all.ttl, 1
              FROM unnest(lease_claim_all.names) AS u(n)
             WHERE NOT EXISTS (SELECT FROM pylease_leases AS x WHERE x.name = u.n)
             ORDER BY u.n
            ON CONFLICT DO NOTHING
            RETURNING l.name, l.fence
        ), recorded AS (
            INSERT INTO pylease_events (at, name, event, holder, fence)
            SELECT t_now, m.name, 'claimed', lease_claim_all.holder, m.fence
              FROM made AS m WHERE history = 'all'
        )
        SELECT coalesce(array_agg(m.name), '{}') INTO created FROM made AS m;

        PERFORM FROM pylease_leases AS l
          WHERE l.name = ANY (lease_claim_all.names)
          ORDER BY l.name
            FOR UPDATE;
        -- Locked: what is read now stays so until this transaction ends.
        IF EXISTS (SELECT FROM pylease_leases AS l
                    WHERE l.name = ANY (lease_claim_all.names) AND l.expires_at > t_now
                      AND (l.released OR l.holder <> lease_claim_all.holder)) THEN
            RAISE EXCEPTION USING ERRCODE = 'PLBSY';
        END IF;
        SELECT min(l.name) INTO worn FROM pylease_leases AS l
         WHERE l.name = ANY (lease_claim_all.names) AND l.fence = 9223372036854775807
           AND (l.released OR l.holder <> lease_claim_all.holder);
        IF worn IS NOT NULL THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(worn), 9223372036854775807 USING ERRCODE = '54000';
        END IF;

        WITH old AS (
            SELECT l.name, l.holder, l.released,
                   NOT l.released AND l.holder = lease_claim_all.holder AS own
              FROM pylease_leases AS l
             WHERE l.name = ANY (lease_claim_all.names) AND l.name <> ALL (created)
        ), granted AS (
            UPDATE pylease_leases AS l
               SET fence       = CASE WHEN o.own THEN l.fence ELSE greatest(l.fence + 1,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1) END,
                   acquired_at = CASE WHEN o.own THEN l.acquired_at ELSE t_now END,
                   holder      = lease_claim_all.holder,
                   ttl         = lease_claim_all.ttl,
                   renewed_at  = t_now,
                   expires_at  = CASE WHEN o.own THEN greatest(l.expires_at, t_now + lease_claim_all.ttl)
                                      ELSE t_now + lease_claim_all.ttl END,
                   released    = false,
                   grants      = l.grants + CASE WHEN o.own THEN 0 ELSE 1 END,
                   takeovers   = l.takeovers + CASE WHEN o.own OR o.released THEN 0 ELSE 1 END
              FROM old AS o
             WHERE l.name = o.name
            RETURNING l.name, l.fence, o.own, o.released, o.holder AS previous
        )
        INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
        SELECT t_now, g.name, CASE WHEN g.released THEN 'claimed' ELSE 'taken_over' END,
               lease_claim_all.holder, g.fence, g.previous
          FROM granted AS g
         WHERE NOT g.own
           AND (history = 'all' OR (coalesce(history, '') IN ('', 'rare') AND NOT g.released));
    EXCEPTION WHEN SQLSTATE 'PLBSY' OR lock_not_available OR deadlock_detected THEN
        RETURN;
    END;

    RETURN QUERY
    SELECT u.n, l.fence
      FROM unnest(lease_claim_all.names) WITH ORDINALITY AS u(n, i)
      JOIN pylease_leases AS l ON l.name = u.n
     ORDER BY u.i;
END
$$;

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
CREATE OR REPLACE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[], ttls interval[])
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

DROP FUNCTION lease_claim_all_new(text[], interval, text);
DROP FUNCTION pylease_claim_all(text[], interval, text, boolean);
DROP FUNCTION permit_claim_new(text, integer, interval, text, integer);
DROP FUNCTION pylease_permit_claim(text, integer, interval, text, integer, boolean);
DROP FUNCTION pylease_renew_held(text[], text[], text[], interval[], bigint[], integer[]);
DROP FUNCTION lease_renew_many(text[], text[], interval, bigint[]);
DROP FUNCTION lease_renew(text, text, interval, bigint);
DROP FUNCTION pylease_claim(text, interval, text, boolean);
