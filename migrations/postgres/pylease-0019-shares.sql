-- pylease 0019: a reader's share has an identity of its own (issue 25; contract 5.2
-- and 5.6). Keep sql/postgres/schema.sql in step.
--   * pylease_shared gains share, an id drawn from the sequence pylease_share_ids by
--     every new share (a retried claim of the same share keeps it);
--   * pylease_claim_shared(name, ttl, holder, new_tenure): (epoch, share) when granted;
--     new_tenure (a holder the caller chose) is busy while that holder's share is live,
--     else it starts a new share. lease_claim_shared is this with new_tenure false;
--   * pylease_release_share(name, holder, epoch, share): gives back that share only;
--   * pylease_renew_held renews a 'shared' element only while its share's id is
--     slots[i] (NULL: any);
-- so that a reused holder's earlier block, releasing or renewing late, never touches a
-- later block's share. Public signatures are unchanged. It follows pylease-0018-renew-held
-- (the same number, given to two changes made at once), whose pylease_renew_held it
-- redefines with the share's test.
-- depends: pylease-0018-renew-held

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

CREATE SEQUENCE pylease_share_ids AS integer CYCLE;
ALTER TABLE pylease_shared ADD COLUMN share integer NOT NULL DEFAULT nextval('pylease_share_ids');

-- The one body of a reader's claim, lease_claim_shared's and the Python API's: (the
-- epoch, the share's id) when granted (the epoch: the fence of the name's latest
-- exclusive grant, 0 if none), NULLs when an exclusive holder holds the name or a writer
-- waits in the queue of waiting processes. A busy claim is answered by one read (no row
-- lock, no WAL). A grant locks the lease row FOR KEY SHARE and writes only the reader's
-- own row, so readers never wait for each other. new_tenure false (lease_claim_shared):
-- a claim again by a reader of this epoch continues its share (its id, never an earlier
-- expiry: a retried claim whose reply was lost). new_tenure true (for a holder the
-- caller chose): busy while this holder's share of the epoch is unexpired (another
-- process, or an earlier block whose release is still on its way, uses this holder);
-- else a new share with an id of its own, which that earlier block's late release or
-- renewal does not name. Internal, not part of the contract.
CREATE FUNCTION pylease_claim_shared(name text, ttl interval, holder text, new_tenure boolean,
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

-- Claim a share of a lease (a reader), as pylease_claim_shared continuing a share of
-- this holder: the epoch when granted, NULL when busy (an SQL function inlined into
-- its caller's statement).
CREATE OR REPLACE FUNCTION lease_claim_shared(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN (SELECT c.epoch FROM pylease_claim_shared(lease_claim_shared.name, lease_claim_shared.ttl,
                                                 lease_claim_shared.holder, false) AS c);

-- A reader's release, for lease_release once no exclusive tenure of the holder was
-- found, and for pylease_release_share: its share (of this epoch, and with this id,
-- when given) is deleted; true when it was still its own (no exclusive grant since its
-- epoch). NOTIFY pylease when it was the last reader, or while a writer waits.
CREATE FUNCTION pylease_release_shared(lease text, reader text, epoch bigint, share integer)
RETURNS boolean
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
       AND (pylease_release_shared.share IS NULL OR s.share = pylease_release_shared.share)
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

-- As above, whatever the share's id (lease_release's).
CREATE OR REPLACE FUNCTION pylease_release_shared(lease text, reader text, epoch bigint) RETURNS boolean
LANGUAGE sql
RETURN pylease_release_shared(lease, reader, epoch, NULL::integer);

-- Give back one share (a reader's tenure), named by its epoch and its id, as
-- pylease_claim_shared answered them: a late release of an earlier share of the same
-- holder then deletes nothing of a later one. True when it was still its own. Commits
-- without waiting for the WAL flush, as lease_release. Internal, not part of the
-- contract.
CREATE FUNCTION pylease_release_share(name text, holder text, epoch bigint, share integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    ignored text;
BEGIN
    IF pylease_release_share.name IS NULL OR pylease_release_share.name = ''
       OR length(pylease_release_share.name) > 200
       OR pylease_release_share.holder IS NULL OR pylease_release_share.holder = ''
       OR length(pylease_release_share.holder) > 200
       OR pylease_release_share.epoch IS NULL OR pylease_release_share.share IS NULL
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', pylease_release_share.name);
        PERFORM pylease_check_key('holder', pylease_release_share.holder);
        IF pylease_release_share.epoch IS NULL THEN
            RAISE EXCEPTION 'pylease: epoch must not be NULL' USING ERRCODE = '22023', COLUMN = 'epoch';
        ELSIF pylease_release_share.share IS NULL THEN
            RAISE EXCEPTION 'pylease: share must not be NULL' USING ERRCODE = '22023', COLUMN = 'share';
        END IF;
        PERFORM pylease_refuse_standby('lease_release');
    END IF;
    -- As lease_release: no flush while this transaction has written nothing.
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;
    RETURN pylease_release_shared(pylease_release_share.name, pylease_release_share.holder,
                                  pylease_release_share.epoch, pylease_release_share.share);
END
$$;

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



COMMENT ON FUNCTION pylease_claim_shared(text, interval, text, boolean) IS
    'pylease (internal): claim a share of a lease (a reader); (epoch, share id) when granted, NULLs when busy; new_tenure: busy while this holder''s share is live, else a new share.';
COMMENT ON FUNCTION pylease_release_share(text, text, bigint, integer) IS
    'pylease (internal): give back the share with this epoch and id of a reader; true when it was still its own.';
COMMENT ON FUNCTION lease_claim_shared(text, interval, text) IS
    'pylease: claim a share of a lease (a reader); the epoch when granted, NULL while an exclusive holder holds it or a writer waits.';

REVOKE EXECUTE ON FUNCTION pylease_release_shared(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_release_shared(text, text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON SEQUENCE pylease_share_ids FROM PUBLIC;
