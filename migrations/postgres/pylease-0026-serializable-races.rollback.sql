-- Undo pylease 0026: pylease_refuse_unseen_readers, pylease_claim, lease_steal and
-- pylease_claim_all as pylease-0025-unchecked-rows left them.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- For an exclusive grant in a transaction that is not READ COMMITTED, whose snapshot
-- may predate readers (a shared claim writes only its own row, which such a snapshot
-- does not see): takes the names' reader-writer locks (in name order), so that no
-- reader comes in any more, then raises 40001 when a transaction the snapshot does not
-- see has locked one of their lease rows since its last update (a reader's claim locks
-- it FOR KEY SHARE; the lock stays in the row version, as xmax, a single locker's or a
-- multixact's). Conservative: a fenced transaction (lease_holds) counts too, and a
-- value that may be either kind of xmax is read as both.
CREATE OR REPLACE FUNCTION pylease_refuse_unseen_readers(operation text, names text[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    snap    pg_snapshot := pg_current_snapshot();
    top     bigint := pg_snapshot_xmax(snap)::text::bigint;
    own     bigint := pg_current_xact_id_if_assigned()::text::bigint;
    locked  text;
    locker  xid;
    lockers bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(1886155383, hashtext(u.n))
       FROM (SELECT DISTINCT n FROM unnest(pylease_refuse_unseen_readers.names) AS n ORDER BY n) AS u;
    FOR locked, locker IN
        SELECT l.name, l.xmax FROM pylease_leases AS l
         WHERE l.name = ANY (pylease_refuse_unseen_readers.names) AND l.xmax <> '0'::xid
    LOOP
        lockers := ARRAY[locker::text::bigint];
        BEGIN
            lockers := lockers || ARRAY(SELECT m.xid::text::bigint
                                          FROM pg_get_multixact_members(locker) AS m);
        EXCEPTION WHEN OTHERS THEN
            NULL;  -- no multixact has this number: a single locker's xid
        END;
        -- Each 32-bit xid in the epoch that puts it within 2^31 of the snapshot's xmax.
        IF EXISTS (SELECT FROM unnest(lockers) AS u(x),
                          LATERAL (SELECT (top & ~4294967295) + u.x
                                          - CASE WHEN (top & ~4294967295) + u.x > top + 2147483648
                                                 THEN 4294967296 ELSE 0 END AS x8) AS f
                    WHERE f.x8 >= 3 AND f.x8 IS DISTINCT FROM own
                      AND NOT pg_visible_in_snapshot(f.x8::text::xid8, snap)) THEN
            RAISE EXCEPTION 'pylease: % of % under % isolation: a reader may have come after this transaction''s snapshot, which cannot see it',
                operation, quote_literal(locked), current_setting('transaction_isolation')
                USING ERRCODE = '40001',
                      HINT = 'Grant it in a READ COMMITTED transaction (pylease''s Python API runs the claim again in one).';
        END IF;
    END LOOP;
END
$$;

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
    s_mark   bigint;
    s_seq    bigint;
    s_last   bigint;
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
               AND (pylease_claim.new_tenure OR l.released OR l.holder <> pylease_claim.holder),
               l.share_mark, pg_sequence_last_value('pylease_share_ids')
          INTO s_holder, s_fence, s_freed, s_busy, s_mark, s_seq
          FROM pylease_leases AS l
         WHERE l.name = pylease_claim.name;
        IF s_busy THEN
            RETURN NULL;
        ELSIF s_fence IS NULL THEN
            -- A first claim of the name; a conflict means another claimer created it first.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, grants, data, share_mark)
            VALUES (pylease_claim.name, pylease_claim.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    pylease_claim.ttl, t_now, t_now, t_now + pylease_claim.ttl, 1, pylease_claim.data,
                    pg_sequence_last_value('pylease_share_ids'))
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
            -- Readers: each share draws a later pylease_share_ids than the grant of its
            -- epoch recorded in share_mark (the reader draws once it holds the row FOR
            -- KEY SHARE, so after that grant committed). The sequence as read above (it
            -- is not transactional) equal to the mark: no reader came since, and the
            -- grant looks for none; otherwise it looks, before it writes (a busy answer
            -- writes nothing), and once more after its update took the row, in a
            -- statement of its own, which sees every reader whose row lock the update
            -- waited for. (The sequence cycles: it comes back to a mark only after 2^31
            -- shares, all drawn between two grants of one name.)
            BEGIN
                IF current_setting('statement_timeout') <> '0'
                   OR current_setting('transaction_isolation') <> 'read committed' THEN
                    -- A statement_timeout (a role's, a database's) shorter than this wait
                    -- would cancel the claim, an error, before the wait counts as busy:
                    -- the wait takes at most half of the statement's time.
                    IF current_setting('statement_timeout') <> '0' THEN
                        PERFORM set_config('lock_timeout', least(2000, greatest(1, (500 * extract(epoch
                            FROM current_setting('statement_timeout')::interval))::bigint))::text, true);
                    END IF;
                    -- Not READ COMMITTED: the snapshot may predate a reader that committed
                    -- since.
                    IF current_setting('transaction_isolation') <> 'read committed' THEN
                        PERFORM pylease_refuse_unseen_readers(CASE WHEN pylease_claim.new_tenure
                            THEN 'lease_claim_new' ELSE 'lease_claim' END, ARRAY[pylease_claim.name]);
                    END IF;
                END IF;
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
                       takeovers   = l.takeovers + CASE WHEN s_freed THEN 0 ELSE 1 END,
                       share_mark  = s_seq
                 WHERE l.name = pylease_claim.name AND l.fence = s_fence AND l.released = s_freed
                   AND l.expires_at <= t_now
                   AND (l.share_mark IS NOT DISTINCT FROM s_seq
                        OR pylease_unshared(pylease_claim.name, s_fence, t_now))
                RETURNING l.fence, pg_sequence_last_value('pylease_share_ids'),
                          current_setting('pylease.history', true)
                     INTO granted, s_last, history;
                IF granted IS NULL THEN
                    -- Read by readers: busy, and nothing was written. (Otherwise the row
                    -- changed since it was read: look again.)
                    IF s_mark IS DISTINCT FROM s_seq
                       AND NOT pylease_unshared(pylease_claim.name, s_fence, t_now) THEN
                        RETURN NULL;
                    END IF;
                ELSIF s_last IS DISTINCT FROM s_mark THEN
                    -- The name's shares go (their readers hold no longer once the fence
                    -- moved), and a reader granted, or renewed, while the update waited for
                    -- the row is seen now: then busy after all.
                    WITH gone AS (
                        DELETE FROM pylease_shared AS s WHERE s.name = pylease_claim.name
                        RETURNING s.epoch = s_fence AND s.expires_at > t_now AS live
                    )
                    SELECT coalesce(bool_or(g.live), false) INTO s_busy FROM gone AS g;
                    IF s_busy THEN
                        RAISE EXCEPTION USING ERRCODE = 'PLBSY';
                    END IF;
                END IF;
            EXCEPTION WHEN lock_not_available OR deadlock_detected OR SQLSTATE 'PLBSY' THEN
                -- The previous holder's fenced transaction is still open, or a reader
                -- came first: not ours yet. (A deadlock: a transaction of a name's
                -- readers that a grant not READ COMMITTED waits for, waiting in turn.)
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

        IF current_setting('transaction_isolation') <> 'read committed' THEN
            PERFORM pylease_refuse_unseen_readers('lease_steal', ARRAY[lease_steal.name]);
        END IF;
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

        IF current_setting('transaction_isolation') <> 'read committed' THEN
            PERFORM pylease_refuse_unseen_readers(CASE WHEN pylease_claim_all.new_tenure
                THEN 'lease_claim_all_new' ELSE 'lease_claim_all' END, pylease_claim_all.names);
        END IF;
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
