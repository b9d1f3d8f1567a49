-- pylease 0017: a permit claim of one slot, by a holder that holds none, runs without
-- a subtransaction (issue 24, bench target 12-permit-cycle). Keep
-- sql/postgres/schema.sql in step.
--   * pylease_permit_claim: such a claim locks one free slot with SKIP LOCKED, or none
--     and is busy, so it has no locks to give back and no exception block; it also
--     skips the separate count of free slots, which the lock's query answers. Claims
--     of several slots, and new tenures that end a holder's earlier slots, keep the
--     subtransaction. Redefined from 0012's definition; answers are unchanged.
-- depends: pylease-0016-data

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

CREATE OR REPLACE FUNCTION pylease_permit_claim(name text, max_permits integer, ttl interval, holder text,
                                     permits integer, new_tenure boolean)
RETURNS TABLE(slot integer, fence bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    s_kind  text;
    s_max   integer;
    mine    integer;
    live    integer;
    whole   boolean;
    start   integer;
    taken   integer[];
    worn    integer;
    history text;
BEGIN
    IF pylease_permit_claim.name IS NULL OR pylease_permit_claim.name = ''
       OR length(pylease_permit_claim.name) > 200
       OR pylease_permit_claim.max_permits IS NULL OR pylease_permit_claim.max_permits < 1
       OR pylease_permit_claim.max_permits > 10000
       OR pylease_permit_claim.ttl IS NULL OR NOT isfinite(pylease_permit_claim.ttl)
       OR pylease_permit_claim.ttl <= interval '0' OR pylease_permit_claim.ttl > interval '366 days'
       OR pylease_permit_claim.holder IS NULL OR pylease_permit_claim.holder = ''
       OR length(pylease_permit_claim.holder) > 200
       OR pylease_permit_claim.permits IS NULL OR pylease_permit_claim.permits < 1
       OR pylease_permit_claim.permits > pylease_permit_claim.max_permits
       OR pylease_permit_claim.new_tenure IS NULL OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', pylease_permit_claim.name);
        PERFORM pylease_check_count('max_permits', pylease_permit_claim.max_permits, 10000, '10000');
        PERFORM pylease_check_ttl('ttl', pylease_permit_claim.ttl);
        PERFORM pylease_check_key('holder', pylease_permit_claim.holder);
        PERFORM pylease_check_count('permits', pylease_permit_claim.permits,
                                    pylease_permit_claim.max_permits, 'max_permits');
        IF pylease_permit_claim.new_tenure IS NULL THEN
            RAISE EXCEPTION 'pylease: new_tenure must not be NULL'
                USING ERRCODE = '22023', COLUMN = 'new_tenure';
        END IF;
        PERFORM pylease_refuse_standby(CASE WHEN pylease_permit_claim.new_tenure
                                            THEN 'permit_claim_new' ELSE 'permit_claim' END);
    END IF;

    LOOP
        SELECT n.kind, n.max_permits INTO s_kind, s_max
          FROM pylease_names AS n WHERE n.name = pylease_permit_claim.name;
        EXIT WHEN FOUND;
        -- The first claim: the name becomes a semaphore, with a row per slot. A
        -- conflict means another first claim (of either kind) committed it first.
        INSERT INTO pylease_names AS n (name, kind, max_permits)
        VALUES (pylease_permit_claim.name, 'semaphore', pylease_permit_claim.max_permits)
        ON CONFLICT (name) DO NOTHING;
        IF FOUND THEN
            INSERT INTO pylease_permits AS p (name, slot)
            SELECT pylease_permit_claim.name, s.i
              FROM generate_series(0, pylease_permit_claim.max_permits - 1) AS s(i);
        END IF;
    END LOOP;
    IF s_kind <> 'semaphore' THEN
        RAISE EXCEPTION 'pylease: name is a lease, not a semaphore'
            USING ERRCODE = '22023', COLUMN = 'name';
    ELSIF s_max <> pylease_permit_claim.max_permits THEN
        RAISE EXCEPTION 'pylease: max_permits % differs from the limit % of this semaphore',
            pylease_permit_claim.max_permits, s_max USING ERRCODE = '22023', COLUMN = 'max_permits';
    END IF;

    -- Still this holder's: a retried claim whose reply was lost gets its slots again;
    -- a new tenure is busy while any of them is unexpired.
    SELECT count(*), count(*) FILTER (WHERE p.expires_at > t_now),
           count(*) = min(p.permits) AND count(*) = max(p.permits)
      INTO mine, live, whole
      FROM pylease_permits AS p
     WHERE p.name = pylease_permit_claim.name AND p.holder = pylease_permit_claim.holder
       AND NOT p.released;
    IF pylease_permit_claim.new_tenure THEN
        IF live > 0 THEN
            RETURN;
        END IF;
    ELSIF mine > 0 THEN
        IF mine <> pylease_permit_claim.permits OR NOT whole THEN
            RAISE EXCEPTION 'pylease: permits must be as many as this holder already holds of this semaphore (release them first)'
                USING ERRCODE = '22023', COLUMN = 'permits';
        END IF;
        -- Locked in slot order, as by every statement that locks several slots; a slot
        -- taken meanwhile drops out, and then nothing is extended.
        RETURN QUERY
        WITH locked AS (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = pylease_permit_claim.name AND p.holder = pylease_permit_claim.holder
               AND NOT p.released
             ORDER BY p.slot
               FOR NO KEY UPDATE OF p
        ), extended AS (
            UPDATE pylease_permits AS p
               SET ttl        = pylease_permit_claim.ttl,
                   renewed_at = t_now,
                   expires_at = greatest(p.expires_at, t_now + pylease_permit_claim.ttl)
              FROM locked AS k
             WHERE p.name = pylease_permit_claim.name AND p.slot = k.slot
               AND (SELECT count(*) FROM locked) = pylease_permit_claim.permits
            RETURNING p.slot, p.fence
        )
        SELECT e.slot, e.fence FROM extended AS e ORDER BY e.slot;
        RETURN;
    END IF;

    start := ((hashtext(pylease_permit_claim.holder) % s_max) + s_max) % s_max;
    IF pylease_permit_claim.permits = 1 AND mine = 0 THEN
        -- One slot for a holder that has none: it is free and locked here, or the
        -- claim is busy having locked nothing (no write, nothing to give back), so no
        -- subtransaction is needed: it would cost the claim a sixth of its time.
        SELECT array_agg(c.slot) INTO taken FROM (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = pylease_permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
               AND NOT EXISTS (SELECT FROM pylease_permits AS q
                                WHERE q.name = pylease_permit_claim.name AND q.slot >= s_max
                                  AND q.slot % s_max = p.slot AND q.expires_at > t_now)
             ORDER BY (p.slot - start + s_max) % s_max
             LIMIT 1
               FOR UPDATE OF p SKIP LOCKED) AS c;
        IF taken IS NULL THEN
            RETURN;
        END IF;
    ELSE
        -- Busy: fewer than permits slots free. Reads only.
        IF (SELECT count(*) FROM pylease_permits AS p
             WHERE p.name = pylease_permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
               AND NOT EXISTS (SELECT FROM pylease_permits AS q
                                WHERE q.name = pylease_permit_claim.name AND q.slot >= s_max
                                  AND q.slot % s_max = p.slot AND q.expires_at > t_now)
           ) < pylease_permit_claim.permits THEN
            RETURN;
        END IF;
        -- Several slots, or a new tenure that ends the holder's earlier one: locks taken
        -- before the claim turns out busy are given back with the subtransaction.
        BEGIN
            SELECT array_agg(c.slot) INTO taken FROM (
                SELECT p.slot FROM pylease_permits AS p
                 WHERE p.name = pylease_permit_claim.name AND p.slot < s_max
                   AND p.expires_at <= t_now
                   AND NOT EXISTS (SELECT FROM pylease_permits AS q
                                    WHERE q.name = pylease_permit_claim.name AND q.slot >= s_max
                                      AND q.slot % s_max = p.slot AND q.expires_at > t_now)
                 ORDER BY (p.slot - start + s_max) % s_max
                 LIMIT pylease_permit_claim.permits
                   FOR UPDATE OF p SKIP LOCKED) AS c;
            IF coalesce(cardinality(taken), 0) < pylease_permit_claim.permits THEN
                -- Other claimers took the slots meanwhile: give back the ones locked here.
                RAISE EXCEPTION USING ERRCODE = 'PLBSY';
            END IF;
            IF mine > 0 THEN
                -- A new tenure: the holder's expired slots not taken again end with the
                -- earlier one (a slot another transaction keeps locked past lock_timeout,
                -- a renewal or release of the earlier one, makes the claim busy).
                UPDATE pylease_permits AS p SET released = true
                 WHERE p.name = pylease_permit_claim.name
                   AND p.holder = pylease_permit_claim.holder
                   AND NOT p.released AND p.slot <> ALL (taken);
            END IF;
        EXCEPTION WHEN SQLSTATE 'PLBSY' OR lock_not_available OR deadlock_detected THEN
            RETURN;
        END;
    END IF;
    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    SELECT min(p.slot) INTO worn FROM pylease_permits AS p
     WHERE p.name = pylease_permit_claim.name AND p.slot = ANY (taken)
       AND p.fence = 9223372036854775807;
    IF worn IS NOT NULL THEN
        RAISE EXCEPTION 'pylease: semaphore % has used every fence of slot %: it cannot be granted again',
            quote_literal(pylease_permit_claim.name), worn USING ERRCODE = '54000';
    END IF;
    -- A fence floored by the timeline, as a lease's. The next grant of a slot freed
    -- by permit_revoke from an unexpired holder is a steal.
    RETURN QUERY
    WITH old AS (
        SELECT p.slot, p.holder, p.fence, p.released, p.revoked FROM pylease_permits AS p
         WHERE p.name = pylease_permit_claim.name AND p.slot = ANY (taken)
    ), granted AS (
        UPDATE pylease_permits AS p
           SET fence       = greatest(p.fence + 1,
                ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
               holder      = pylease_permit_claim.holder,
               permits     = pylease_permit_claim.permits,
               ttl         = pylease_permit_claim.ttl,
               acquired_at = t_now,
               renewed_at  = t_now,
               expires_at  = t_now + pylease_permit_claim.ttl,
               released    = false,
               revoked     = false,
               grants      = p.grants + 1,
               takeovers   = p.takeovers + CASE WHEN o.fence > 0 AND NOT o.released THEN 1 ELSE 0 END,
               steals      = p.steals + CASE WHEN o.revoked THEN 1 ELSE 0 END
          FROM old AS o
         WHERE p.name = pylease_permit_claim.name AND p.slot = o.slot
        RETURNING p.slot, p.fence,
                  CASE WHEN o.revoked THEN 'stolen' WHEN o.fence = 0 OR o.released THEN 'claimed'
                       ELSE 'taken_over' END AS event,
                  CASE WHEN o.fence > 0 THEN o.holder END AS previous
    ), recorded AS (
        INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder, slot)
        SELECT t_now, pylease_permit_claim.name, g.event, pylease_permit_claim.holder, g.fence,
               g.previous, g.slot
          FROM granted AS g
         WHERE history = 'all' OR (coalesce(history, '') IN ('', 'rare') AND g.event <> 'claimed')
    )
    SELECT g.slot, g.fence FROM granted AS g ORDER BY g.slot;
END
$$;
