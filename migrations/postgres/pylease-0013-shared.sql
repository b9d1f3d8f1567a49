-- pylease 0013: readers and writers (contract revision 3, section 5.2; issue 25).
-- Keep sql/postgres/schema.sql in step.
--   * pylease_shared: one row per reader (shared holder) of a lease name, with its
--     epoch (the fence of the name's latest exclusive grant). Readers never update
--     the name's lease row: they lock it FOR KEY SHARE, which conflicts with every
--     exclusive grant (a grant changes the fence, a key column) and with nothing else.
--   * pylease_leases: a name whose first claim is shared gets a row without a holder
--     (released), so that a reader always has a row to lock; its fence is the floor
--     of the name's bucket (pylease_register_lease), 0 for a name never pruned, the
--     epoch of its readers. lease_prune keeps a name read within idle_for.
--   * lease_claim_shared and lease_holders; lease_status gains the trailing column
--     shared and the state 'shared'. Its return type changes, so it is dropped and
--     created again, keeping its grants; a view of yours on it must be dropped before
--     this migration and created again after it (the migration stops, naming them).
--   * The claim bodies of 0012 (pylease_claim, so lease_claim and lease_claim_new;
--     pylease_claim_all, so lease_claim_all and lease_claim_all_new) and lease_steal
--     refuse a name while unexpired readers of its epoch remain. lease_renew,
--     lease_renew_many, lease_release, lease_holds and pylease_renew_held (kind
--     'shared') take readers as they take the exclusive holder; a renewal that names
--     its tenure names a reader's by its epoch. lease_unwait wakes readers when the
--     last waiting writer leaves without the lease.
-- depends: pylease-0012-tenure-renewals

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
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
        RAISE EXCEPTION 'pylease 0013: lease_status gains the column shared, so it is created again; drop the views on it first (%), then create them again after migrating', views
            USING ERRCODE = '2BP01';
    END IF;
END
$views$;

-- The grants of lease_status, to give back to the function created again (in a
-- setting of this session, reset at the end: a temporary table would need TEMP).
SELECT set_config('pylease.status_acl', coalesce(p.proacl::text, ''), false)
  FROM pg_proc AS p WHERE p.oid = 'lease_status(text)'::regprocedure;

-- Tables ----------------------------------------------------------------------

-- A name first claimed by a reader has a row without a holder, released; its fence
-- is its bucket's floor (0 for a name never pruned).
ALTER TABLE pylease_leases ALTER COLUMN holder DROP NOT NULL;
ALTER TABLE pylease_leases DROP CONSTRAINT pylease_leases_fence_check;
ALTER TABLE pylease_leases ADD CONSTRAINT pylease_leases_fence_check CHECK (fence >= 0);
ALTER TABLE pylease_leases ADD CONSTRAINT pylease_leases_unclaimed
    CHECK (holder IS NOT NULL OR released);

-- One row per reader of a lease name: it holds while its epoch is still the name's
-- fence (no exclusive grant since) and it is unexpired. A release deletes the row;
-- an exclusive grant deletes the rows of the name (their readers are over), and a
-- reader's release a few expired ones.
CREATE TABLE pylease_shared (
    name        text        NOT NULL,
    holder      text        NOT NULL CHECK (length(holder) BETWEEN 1 AND 200),
    epoch       bigint      NOT NULL CHECK (epoch >= 0),
    ttl         interval    NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (name, holder)
) WITH (fillfactor = 50);

COMMENT ON TABLE pylease_shared IS
    'pylease: the readers (shared holders) of lease names; written only through the lease_* functions.';

REVOKE ALL ON TABLE pylease_shared FROM PUBLIC;

-- Readers ---------------------------------------------------------------------

-- Claim a share of a lease (a reader): the epoch when granted (the fence of the
-- name's latest exclusive grant, 0 if none), NULL when an exclusive holder holds the
-- name or a writer waits in the queue of waiting processes. A busy claim is answered
-- by one read (no row lock, no WAL). A grant locks the lease row FOR KEY SHARE and
-- writes only the reader's own row, so readers never wait for each other; a claim
-- again by a reader of this epoch extends its share (never earlier).
CREATE FUNCTION lease_claim_shared(name text, ttl interval, holder text) RETURNS bigint
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
    history   text;
BEGIN
    IF lease_claim_shared.name IS NULL OR lease_claim_shared.name = ''
       OR length(lease_claim_shared.name) > 200
       OR lease_claim_shared.ttl IS NULL OR NOT isfinite(lease_claim_shared.ttl)
       OR lease_claim_shared.ttl <= interval '0' OR lease_claim_shared.ttl > interval '366 days'
       OR lease_claim_shared.holder IS NULL OR lease_claim_shared.holder = ''
       OR length(lease_claim_shared.holder) > 200
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', lease_claim_shared.name);
        PERFORM pylease_check_ttl('ttl', lease_claim_shared.ttl);
        PERFORM pylease_check_key('holder', lease_claim_shared.holder);
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby('lease_claim_shared');
        END IF;
        PERFORM pylease_refuse_read_only('lease_claim_shared');
    END IF;

    LOOP
        -- Busy, decided by one read (no row lock, no WAL): an exclusive holder whose
        -- lease is unexpired (or resting after a min_hold release), or a writer
        -- waiting in the queue of waiting processes (writer preference), unless this
        -- holder reads the name already (a retried claim).
        SELECT l.holder, l.fence, l.released, l.expires_at,
               EXISTS (SELECT FROM pylease_shared AS s
                        WHERE s.name = l.name AND s.holder = lease_claim_shared.holder
                          AND s.epoch = l.fence),
               EXISTS (SELECT FROM pylease_waiters AS w
                        WHERE w.name = l.name AND w.expires_at > t_now)
          INTO s_holder, s_fence, s_freed, s_expires, s_mine, s_queued
          FROM pylease_leases AS l
         WHERE l.name = lease_claim_shared.name;
        IF NOT FOUND THEN
            -- The name's first claim: a row for readers to lock (no holder; its fence
            -- the floor, pylease_register_lease); a conflict: another first claim made it.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, released)
            VALUES (lease_claim_shared.name, NULL, 0, lease_claim_shared.ttl, t_now, t_now, t_now,
                    true)
            ON CONFLICT DO NOTHING;
            CONTINUE;
        ELSIF s_expires > t_now OR (s_queued AND NOT s_mine) THEN
            RETURN NULL;
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
             WHERE l.name = lease_claim_shared.name
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
                 WHERE l.name = lease_claim_shared.name AND l.fence = s_fence AND NOT l.released
                   AND l.expires_at <= t_now;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'PLAGN';
                END IF;
                history := current_setting('pylease.history', true);
                IF history IS NULL OR history IN ('', 'rare', 'all') THEN
                    INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
                    VALUES (t_now, lease_claim_shared.name, 'taken_over', lease_claim_shared.holder,
                            s_fence, s_holder);
                ELSIF history <> 'none' THEN
                    PERFORM pylease_refuse_history(history);
                END IF;
            END IF;
            -- A retried claim of this epoch keeps its acquired_at and never moves its
            -- expiry earlier; a row of an earlier epoch is a share that was lost.
            INSERT INTO pylease_shared AS s (name, holder, epoch, ttl, acquired_at, renewed_at,
                                             expires_at)
            VALUES (lease_claim_shared.name, lease_claim_shared.holder, s_fence,
                    lease_claim_shared.ttl, t_now, t_now, t_now + lease_claim_shared.ttl)
            ON CONFLICT (name, holder) DO UPDATE
               SET acquired_at = CASE WHEN s.epoch = excluded.epoch THEN s.acquired_at
                                      ELSE excluded.acquired_at END,
                   expires_at  = CASE WHEN s.epoch = excluded.epoch
                                      THEN greatest(s.expires_at, excluded.expires_at)
                                      ELSE excluded.expires_at END,
                   epoch       = excluded.epoch,
                   ttl         = excluded.ttl,
                   renewed_at  = excluded.renewed_at;
        EXCEPTION
            WHEN lock_not_available OR SQLSTATE 'PLBSY' THEN
                RETURN NULL;
            WHEN SQLSTATE 'PLAGN' THEN
                CONTINUE;  -- the row changed since it was read: decide again
        END;
        IF NOT s_mine THEN
            history := current_setting('pylease.history', true);
            IF history = 'all' THEN
                INSERT INTO pylease_events (at, name, event, holder, fence)
                VALUES (t_now, lease_claim_shared.name, 'claimed', lease_claim_shared.holder,
                        s_fence);
            ELSIF history IS NOT NULL AND history NOT IN ('', 'rare', 'none') THEN
                PERFORM pylease_refuse_history(history);
            END IF;
        END IF;
        RETURN s_fence;
    END LOOP;
END
$$;

-- A reader's release, for lease_release once no exclusive tenure of the holder was
-- found: its share (of this epoch, when given) is deleted; true when it was still
-- its own (no exclusive grant since its epoch). NOTIFY pylease when it was the last
-- reader, or while a writer waits.
CREATE FUNCTION pylease_release_shared(lease text, reader text, epoch bigint) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    t_now   timestamptz := clock_timestamp();
    s_epoch bigint;
    s_fence bigint;
    history text;
BEGIN
    DELETE FROM pylease_shared AS s
     WHERE s.name = lease AND s.holder = reader
       AND (pylease_release_shared.epoch IS NULL OR s.epoch = pylease_release_shared.epoch)
    RETURNING s.epoch INTO s_epoch;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT l.fence INTO s_fence FROM pylease_leases AS l WHERE l.name = lease;
    IF s_epoch IS DISTINCT FROM s_fence THEN
        RETURN false;  -- a writer was granted since: the share was no longer its own
    END IF;
    history := current_setting('pylease.history', true);
    IF history = 'all' THEN
        INSERT INTO pylease_events (at, name, event, holder, fence)
        VALUES (t_now, lease, 'released', reader, s_epoch);
    ELSIF history IS NOT NULL AND history NOT IN ('', 'rare', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    -- The last reader wakes the waiters; while a writer waits (no reader comes in
    -- meanwhile), every reader that leaves does, since two readers leaving at once
    -- may each see the other still there.
    IF NOT EXISTS (SELECT FROM pylease_shared AS s
                    WHERE s.name = lease AND s.epoch = s_fence AND s.expires_at > t_now)
       OR EXISTS (SELECT FROM pylease_waiters AS w WHERE w.name = lease AND w.expires_at > t_now)
    THEN
        PERFORM pg_notify('pylease', lease);
    END IF;
    -- A few expired shares of the name (readers that died) go; none is waited for.
    DELETE FROM pylease_shared AS s
     WHERE s.name = lease
       AND s.holder IN (SELECT x.holder FROM pylease_shared AS x
                         WHERE x.name = lease AND x.expires_at <= t_now
                         LIMIT 16 FOR UPDATE SKIP LOCKED);
    RETURN true;
END
$$;

-- A new lease row registers its name as a lease (or raises: it is a semaphore's),
-- and starts above every fence a pruned name of its bucket had; a reader's row (no
-- holder) at that floor.
CREATE OR REPLACE FUNCTION pylease_register_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- A reader's row (no holder: no writer was granted it) takes the floor itself as
    -- its fence, the epoch of its readers; the next writer's grant goes above it.
    NEW.fence := greatest(NEW.fence, pylease_fence_floor(NEW.name)
                                     + CASE WHEN NEW.holder IS NULL THEN 0 ELSE 1 END);
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

-- Delete the names (leases and semaphores) that nobody has held for at least
-- idle_for, with their counters; their history stays. How many were deleted. A name
-- read within idle_for stays. Fences never go back: a pruned name's bucket floor is
-- raised to its fence first, in the same transaction, under the bucket's lock. Prune
-- never waits: a bucket in a first grant's hands, a row locked by a claimer, a reader
-- or a fenced transaction is skipped this time.
CREATE OR REPLACE FUNCTION lease_prune(idle_for interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cutoff  timestamptz;
    buckets integer[];
    idle    text[];
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

    -- Locked in a statement of their own: a reader whose claim committed before the
    -- lock (it holds the row FOR KEY SHARE until then) is seen by the next statement,
    -- and one that comes after waits for this transaction.
    SELECT array_agg(k.name) INTO idle FROM (
        SELECT l.name FROM pylease_leases AS l
         WHERE l.expires_at <= cutoff AND (hashtext(l.name) & 1023) = ANY (buckets)
           FOR UPDATE SKIP LOCKED) AS k;
    -- A name read within idle_for stays; a name only readers claimed (fence 0) raises
    -- no floor.
    WITH gone AS (
        SELECT l.name, l.fence FROM pylease_leases AS l
         WHERE l.name = ANY (idle)
           AND NOT EXISTS (SELECT FROM pylease_shared AS s
                            WHERE s.name = l.name AND s.expires_at > cutoff)
    ), floors AS (
        INSERT INTO pylease_fence_floors AS fl (bucket, floor)
        SELECT hashtext(g.name) & 1023, max(g.fence) FROM gone AS g WHERE g.fence > 0 GROUP BY 1
        ON CONFLICT (bucket) DO UPDATE SET floor = greatest(fl.floor, excluded.floor)
    ), deleted AS (
        DELETE FROM pylease_leases AS l USING gone AS g WHERE l.name = g.name
        RETURNING l.name
    ), unnamed AS (
        DELETE FROM pylease_names AS n USING deleted AS d WHERE n.name = d.name
    ), shares AS (
        DELETE FROM pylease_shared AS s USING deleted AS d WHERE s.name = d.name
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

-- Writers refuse readers ------------------------------------------------------

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

-- Readers renew, release and fence as the exclusive holder does ---------------

CREATE OR REPLACE FUNCTION lease_renew(name text, holder text, ttl interval, fence bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    l_fence bigint;
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
    IF FOUND THEN
        RETURN true;
    END IF;
    -- A reader: its row, while its epoch is still the name's fence (and is the fence
    -- given: a reader's tenure is its epoch). The lease row is locked FOR KEY SHARE
    -- first, so that an exclusive grant comes either before this renewal (the epoch no
    -- longer matches) or after it (and sees the reader).
    IF NOT EXISTS (SELECT FROM pylease_shared AS s
                    WHERE s.name = lease_renew.name AND s.holder = lease_renew.holder) THEN
        RETURN false;
    END IF;
    SELECT l.fence INTO l_fence FROM pylease_leases AS l WHERE l.name = lease_renew.name
       FOR KEY SHARE;
    UPDATE pylease_shared AS s
       SET ttl        = coalesce(lease_renew.ttl, s.ttl),
           renewed_at = t_now,
           expires_at = greatest(s.expires_at, t_now + coalesce(lease_renew.ttl, s.ttl))
     WHERE s.name = lease_renew.name AND s.holder = lease_renew.holder AND s.epoch = l_fence
       AND (lease_renew.fence IS NULL OR s.epoch = lease_renew.fence);
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION lease_renew_many(names text[], holders text[], ttl interval, fences bigint[])
RETURNS TABLE(name text, renewed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    readers boolean := false;
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

    -- Readers among them (a row in pylease_shared): every lease row of the batch is
    -- first locked FOR KEY SHARE, in name order, so that an exclusive grant comes
    -- either before a reader's renewal or after it (as in lease_renew), and the locks
    -- below are taken in name order still.
    IF EXISTS (SELECT FROM unnest(lease_renew_many.names, lease_renew_many.holders) AS u(n, h)
                 JOIN pylease_shared AS s ON s.name = u.n AND s.holder = u.h) THEN
        PERFORM FROM pylease_leases AS l
          WHERE l.name = ANY (lease_renew_many.names)
          ORDER BY l.name
            FOR KEY SHARE;
        readers := true;
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
    ), shared AS (
        UPDATE pylease_shared AS s
           SET ttl        = coalesce(lease_renew_many.ttl, s.ttl),
               renewed_at = t_now,
               expires_at = greatest(s.expires_at, t_now + coalesce(lease_renew_many.ttl, s.ttl))
          FROM wanted AS w, pylease_leases AS l
         WHERE readers AND s.name = w.n AND s.holder = w.h AND l.name = w.n AND s.epoch = l.fence
           AND (w.f IS NULL OR s.epoch = w.f)
        RETURNING s.name, s.holder
    )
    SELECT w.n, r.name IS NOT NULL OR x.name IS NOT NULL
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h AND (w.f IS NULL OR r.fence = w.f)
      LEFT JOIN shared AS x ON x.name = w.n AND x.holder = w.h
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
        RETURN pylease_release_shared(lease_release.name, lease_release.holder, NULL);
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
        RETURN pylease_release_shared(lease_release.name, lease_release.holder, lease_release.fence);
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
    IF FOUND THEN
        RETURN true;
    END IF;
    -- A reader (fence: its epoch): its unexpired row, while the epoch is still the
    -- name's fence. The row is locked as for the exclusive holder, so a fenced write
    -- and an exclusive grant are serialized in the same way.
    PERFORM FROM pylease_leases AS l
      WHERE l.name = lease_holds.name AND l.fence = lease_holds.fence
        AND EXISTS (SELECT FROM pylease_shared AS s
                     WHERE s.name = l.name AND s.holder = lease_holds.holder
                       AND s.epoch = l.fence AND s.expires_at > clock_timestamp())
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
    s_at  bigint[];
    s_exp timestamptz[];
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
                   WHERE v IS NULL OR v NOT IN ('lease', 'shared', 'permit'))
    THEN
        RAISE EXCEPTION 'pylease: kinds must hold ''lease'', ''shared'' or ''permit'' for each element of names'
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

    RETURN QUERY
    SELECT u.n, x.e IS NOT NULL, x.e, CASE WHEN x.e IS NOT NULL THEN t_now END
      FROM unnest(pylease_renew_held.names) WITH ORDINALITY AS u(n, i)
      LEFT JOIN (SELECT a.i, a.e FROM unnest(coalesce(l_at, '{}'), coalesce(l_exp, '{}')) AS a(i, e)
                 UNION ALL
                 SELECT b.i, b.e FROM unnest(coalesce(p_at, '{}'), coalesce(p_exp, '{}')) AS b(i, e)
                 UNION ALL
                 SELECT c.i, c.e FROM unnest(coalesce(s_at, '{}'), coalesce(s_exp, '{}')) AS c(i, e)
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
        ELSIF NOT coalesce(granted, false) THEN
            -- The last waiting writer left without the lease: the readers it held off
            -- (writer preference) may claim now.
            PERFORM pg_notify('pylease', lease_unwait.name);
        END IF;
    END IF;
    -- Last, as in lease_wait.
    DELETE FROM pylease_waiters AS w
     WHERE w.id IN (SELECT x.id FROM pylease_waiters AS x WHERE x.expires_at <= now_
                     ORDER BY x.expires_at LIMIT 16 FOR UPDATE SKIP LOCKED);
    RETURN queued;
END
$$;

-- Status ------------------------------------------------------------------------

-- lease_status gains the trailing column shared (unexpired readers of the epoch);
-- a name only readers hold has state 'shared', no holder, the epoch as fence.
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

-- Every current holder of every kind: the exclusive holder, the readers, the
-- holders of a semaphore's slots.
CREATE FUNCTION lease_holders(name text DEFAULT NULL)
RETURNS TABLE(name text, holder text, mode text, slot integer, fence bigint,
              acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    WITH c AS (SELECT clock_timestamp() AS now)
    SELECT h.name, h.holder, h.mode, h.slot, h.fence, h.acquired_at, h.renewed_at, h.expires_at
      FROM (SELECT l.name, l.holder, 'exclusive' AS mode, NULL::integer AS slot, l.fence,
                   l.acquired_at, l.renewed_at, l.expires_at
              FROM pylease_leases AS l, c
             WHERE ($1 IS NULL OR l.name = $1) AND NOT l.released AND l.expires_at > c.now
            UNION ALL
            SELECT s.name, s.holder, 'shared', NULL, s.epoch, s.acquired_at, s.renewed_at,
                   s.expires_at
              FROM pylease_shared AS s
              JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch, c
             WHERE ($1 IS NULL OR s.name = $1) AND s.expires_at > c.now
            UNION ALL
            SELECT p.name, p.holder, 'permit', p.slot, p.fence, p.acquired_at, p.renewed_at,
                   p.expires_at
              FROM pylease_permits AS p, c
             WHERE ($1 IS NULL OR p.name = $1) AND NOT p.released AND p.expires_at > c.now
           ) AS h
     ORDER BY h.name, h.mode, h.slot, h.holder;
$$;

COMMENT ON FUNCTION lease_claim_shared(text, interval, text) IS
    'pylease: claim a share of a lease (a reader); the epoch when granted, NULL while an exclusive holder holds it or a writer waits.';
COMMENT ON FUNCTION lease_holders(text) IS
    'pylease: every current holder of every kind (exclusive, shared, permit), of one name or all.';
COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[], bigint[], integer[]) IS
    'pylease (internal, the keeper''s): renew leases, readers'' shares and permits of several holders in one statement, each at its own ttl and in the tenure its fence names (a reader''s: its epoch).';
COMMENT ON FUNCTION lease_status(text) IS
    'pylease: one row per lease name (all when name is NULL); held means unexpired and not released; state is held, shared, resting, released or expired; shared counts the readers.';

REVOKE EXECUTE ON FUNCTION pylease_release_shared(text, text, bigint) FROM PUBLIC;

-- lease_status keeps the grants it had (none recorded: the defaults, as created).
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
