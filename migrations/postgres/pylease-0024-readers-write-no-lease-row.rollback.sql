-- Undo pylease 0024: pylease_leases.shared_seen (marked for every name with shares)
-- again, and no share_mark; pylease_claim and pylease_claim_shared as
-- pylease-0023-lean-paths left them, and the readers' release (pylease_release_shared and
-- the 4-argument lease_release) and lease_claim_shared too; lease_steal and
-- pylease_claim_all without pylease_refuse_unseen_readers, which goes.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

ALTER TABLE pylease_leases DROP COLUMN share_mark;
ALTER TABLE pylease_leases ADD COLUMN shared_seen boolean NOT NULL DEFAULT false;
UPDATE pylease_leases AS l SET shared_seen = true
 WHERE EXISTS (SELECT FROM pylease_shared AS s WHERE s.name = l.name);

-- The one body of a lease claim, lease_claim's and lease_claim_new's: the fence
-- when granted, NULL when busy. new_tenure false (lease_claim): busy while another
-- holder's unexpired lease stands; the holder the row still names continues its
-- tenure (a retried claim whose reply was lost keeps its fence). new_tenure true
-- (lease_claim_new): busy while anyone's unexpired lease stands, this holder's own
-- included (another process uses this holder); an expired tenure of this holder is
-- taken over with a new fence, so that its fenced writes fail from then on.
-- A busy lease is answered by one read (no row lock, no WAL) that also decides
-- "busy", so the busy path is three steps. A grant updates the row only if it is
-- still as read (fence, released), so that the exhaustion check and the history see
-- exactly the row they replace; otherwise somebody else changed it meanwhile and the
-- claim looks again. Internal: executable by PUBLIC, since lease_claim and
-- lease_claim_new are SQL functions inlined into their callers' statements.
CREATE OR REPLACE FUNCTION pylease_claim(name text, ttl interval, holder text, new_tenure boolean,
                              data jsonb)
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
    s_read   boolean;
    history  text;
BEGIN
    -- One cheap test in the common case (a read-only transaction's too, as on a
    -- standby); the checks that raise run only when it fails.
    IF pylease_claim.name IS NULL OR pylease_claim.name = '' OR length(pylease_claim.name) > 200
       OR pylease_claim.ttl IS NULL OR NOT isfinite(pylease_claim.ttl)
       OR pylease_claim.ttl <= interval '0' OR pylease_claim.ttl > interval '366 days'
       OR pylease_claim.holder IS NULL OR pylease_claim.holder = ''
       OR length(pylease_claim.holder) > 200 OR pylease_claim.new_tenure IS NULL
       -- Data as text is at most 6 characters a byte of jsonb (an escaped control
       -- character): only larger data pays for the text.
       OR (pg_column_size(pylease_claim.data) > 1024 AND length(pylease_claim.data::text) > 8192)
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', pylease_claim.name);
        PERFORM pylease_check_ttl('ttl', pylease_claim.ttl);
        PERFORM pylease_check_key('holder', pylease_claim.holder);
        PERFORM pylease_check_data(pylease_claim.data);
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
                                             expires_at, grants, data)
            VALUES (pylease_claim.name, pylease_claim.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    pylease_claim.ttl, t_now, t_now, t_now + pylease_claim.ttl, 1, pylease_claim.data)
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
                   expires_at = greatest(l.expires_at, t_now + pylease_claim.ttl),
                   -- The tenure's data, unless this claim gives some (a retried
                   -- claim gives what the lost one gave).
                   data       = coalesce(pylease_claim.data, l.data)
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
                       -- A new tenure: its own data (NULL unless given), no request.
                       data        = pylease_claim.data,
                       release_requested_by = NULL,
                       grants      = l.grants + 1,
                       takeovers   = l.takeovers + CASE WHEN s_freed THEN 0 ELSE 1 END
                 WHERE l.name = pylease_claim.name AND l.fence = s_fence AND l.released = s_freed
                   AND l.expires_at <= t_now
                   -- Free of readers too, once a reader was ever granted the name: one
                   -- never read has no shares to look for.
                   AND (NOT l.shared_seen OR pylease_unshared(pylease_claim.name, s_fence, t_now))
                RETURNING l.fence, l.shared_seen, current_setting('pylease.history', true)
                     INTO granted, s_read, history;
                IF granted IS NULL THEN
                    -- Read by readers: busy, and nothing was written. (Otherwise the row
                    -- changed since it was read: look again.)
                    IF EXISTS (SELECT FROM pylease_shared AS s
                                WHERE s.name = pylease_claim.name AND s.epoch = s_fence
                                  AND s.expires_at > t_now) THEN
                        RETURN NULL;
                    END IF;
                ELSIF s_read THEN
                    -- A reader granted while the update waited for its row lock is seen
                    -- only now, by a statement of its own: then busy after all. The rows
                    -- of the name's readers go (they hold no longer once the fence moved).
                    -- A name never read skips this: its first reader marks the row
                    -- (shared_seen) while it holds it FOR KEY SHARE, so a grant after that
                    -- reader sees the mark in the row version it replaces.
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

-- The one body of a reader's claim, lease_claim_shared's and the Python API's: (the
-- epoch, the share's id) when granted (the epoch: the fence of the name's latest
-- exclusive grant, 0 if none), NULLs when an exclusive holder holds the name or a writer
-- waits in the queue of waiting processes. A busy claim is answered by one read (no row
-- lock, no WAL). A grant locks the lease row FOR KEY SHARE and writes only the reader's
-- own row (the name's first reader also marks the lease row shared_seen, once), so
-- readers never wait for each other but for that mark. new_tenure false (lease_claim_shared):
-- a claim again by a reader of this epoch continues its share (its id, never an earlier
-- expiry: a retried claim whose reply was lost). new_tenure true (for a holder the
-- caller chose): busy while this holder's share of the epoch is unexpired (another
-- process, or an earlier block whose release is still on its way, uses this holder);
-- else a new share with an id of its own, which that earlier block's late release or
-- renewal does not name. Internal, not part of the contract.
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
    s_seen    boolean;
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
        -- holder's unexpired share of the epoch too. A row that no writer was ever
        -- granted (no holder) holds nothing: it expires at the start of the first
        -- claim that made it, which may come after this claim's start.
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
                                             expires_at, released, shared_seen)
            VALUES (pylease_claim_shared.name, NULL, 0, pylease_claim_shared.ttl, t_now, t_now,
                    t_now, true, true)
            ON CONFLICT DO NOTHING;
            CONTINUE;
        ELSIF (s_holder IS NOT NULL AND s_expires > t_now) OR (s_queued AND NOT s_mine)
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
            SELECT l.holder, l.fence, l.released, l.expires_at, l.shared_seen
              INTO s_holder, s_fence, s_freed, s_expires, s_seen
              FROM pylease_leases AS l
             WHERE l.name = pylease_claim_shared.name
               FOR KEY SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'PLAGN';  -- pruned meanwhile
            ELSIF s_holder IS NOT NULL AND s_expires > t_now THEN
                RAISE EXCEPTION USING ERRCODE = 'PLBSY';
            ELSIF NOT s_freed THEN
                -- The exclusive holder died (its ttl ran out without a release): the row
                -- is marked released, so that its late renewal cannot make it hold again
                -- beside this reader. The one write of a reader to the row, counted and
                -- recorded as the takeover it is; a renewal that came first wins.
                UPDATE pylease_leases AS l
                   SET released    = true,
                       takeovers   = l.takeovers + 1,
                       shared_seen = true
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
            ELSIF NOT s_seen THEN
                -- The name's first reader marks the row, once: exclusive grants look for
                -- shares only on a marked row (pylease_claim). A first reader at the same
                -- time waits for this mark's commit, the only wait between readers.
                UPDATE pylease_leases AS l SET shared_seen = true
                 WHERE l.name = pylease_claim_shared.name AND NOT l.shared_seen;
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

-- A reader's release, for lease_release once no exclusive tenure of the holder was
-- found, and for pylease_release_share: its share (of this epoch, and with this id,
-- when given) is deleted; true when it was still its own (no exclusive grant since its
-- epoch). NOTIFY pylease when it was the last reader, or while a writer waits.
CREATE OR REPLACE FUNCTION pylease_release_shared(lease text, reader text, epoch bigint, share integer)
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

-- Give back one tenure: as above, only if this holder still holds the lease and
-- with this fence, so that a late release of an earlier tenure changes nothing once
-- the same holder holds the name again. The fence has no DEFAULT: a call with two or
-- three arguments, positional or named, still means the function above alone.
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

-- Claim a share of a lease (a reader), as pylease_claim_shared continuing a share of
-- this holder: the epoch when granted, NULL when busy (an SQL function inlined into
-- its caller's statement).
CREATE OR REPLACE FUNCTION lease_claim_shared(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN (SELECT c.epoch FROM pylease_claim_shared(lease_claim_shared.name, lease_claim_shared.ttl,
                                                 lease_claim_shared.holder, false) AS c);


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
                   data        = NULL,
                   release_requested_by = NULL,
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

-- The one body of a claim of several names, lease_claim_all's and
-- lease_claim_all_new's: one (name, fence) row per name, in the order of names, when
-- all were granted; no row when any is busy. new_tenure false (lease_claim_all):
-- names this holder still holds are extended with their fences, as by lease_claim.
-- new_tenure true (lease_claim_all_new): a name this holder holds unexpired is busy
-- (another process uses this holder), an expired one is taken over with a new fence,
-- as by lease_claim_new. A busy claim is answered by one read (no row lock, no WAL).
-- A grant creates the new names, in name order, then locks every row, in name order,
-- so that two claims of overlapping names never deadlock and no other caller sees a
-- subset granted; a row still locked after lock_timeout (a holder's open fenced
-- transaction) counts as busy, as for lease_claim. Internal: executable by PUBLIC, as
-- the SQL functions lease_claim_all and lease_claim_all_new call it.
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
                   data        = CASE WHEN o.own THEN l.data END,
                   release_requested_by = CASE WHEN o.own THEN l.release_requested_by END,
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

DROP FUNCTION pylease_refuse_unseen_readers(text, text[]);
