-- pylease 0024: the claim and release of a name used only exclusively cost what they
-- did in revision 2, and a permit's cycle less (issues 25, 26 and 24; bench
-- targets 14-revision-3 and 12-permit-cycle). Keep sql/postgres/schema.sql in step.
--   * pylease_leases gains shared_seen: the name's first reader marks the row, once
--     (pylease_claim_shared, holding it FOR KEY SHARE), and an exclusive grant
--     (pylease_claim) looks for live shares and deletes the name's old ones only on a
--     marked row: a name never read skips a probe and a statement per grant. Rows
--     with shares are marked here;
--   * pylease_unshared(name, epoch, at): that probe, called only for a marked row;
--   * the trigger pylease_leases_watched_update tests only NEW.watched, and
--     pylease_tell_watchers tells a change from none: a WHEN comparing the columns
--     was built again by every grant and release of every name;
--   * pylease_permit_claim reads the name and the holder's slots in one statement,
--     tells a slot out of fences from the fence its lock read, and writes history
--     with a statement of its own only when it records something; permit_release too;
--   * the set-returning SQL wrappers (permit_claim, permit_claim_new, lease_claim_all,
--     lease_claim_all_new, lease_release_all, lease_renew_many) are STABLE, so that
--     they are inlined into the caller's statement: a VOLATILE one planned its body
--     again on every call. What they call is VOLATILE, as before.
-- Answers are unchanged.
-- depends: pylease-0023-first-readers

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

ALTER TABLE pylease_leases ADD COLUMN shared_seen boolean NOT NULL DEFAULT false;
-- Under this migration's lock of the table, no reader is between its lock of a row and
-- its commit: every share there is is seen here.
UPDATE pylease_leases AS l SET shared_seen = true
 WHERE EXISTS (SELECT FROM pylease_shared AS s WHERE s.name = l.name);

DROP TRIGGER pylease_leases_watched_update ON pylease_leases;
-- Renewals never call it: they set none of these columns.
CREATE TRIGGER pylease_leases_watched_update AFTER UPDATE OF fence, released, data
    ON pylease_leases
    FOR EACH ROW WHEN (NEW.watched)
    EXECUTE FUNCTION pylease_tell_watchers();

-- The set-returning SQL wrappers are inlined into the caller's statement only when
-- they are not VOLATILE: each call planned its body again. They only read; what they
-- call is VOLATILE and writes with snapshots of its own.
ALTER FUNCTION lease_renew_many(text[], text[], interval) STABLE;
ALTER FUNCTION permit_claim(text, integer, interval, text, integer) STABLE;
ALTER FUNCTION permit_claim_new(text, integer, interval, text, integer) STABLE;
ALTER FUNCTION lease_claim_all(text[], interval, text) STABLE;
ALTER FUNCTION lease_claim_all_new(text[], interval, text) STABLE;
ALTER FUNCTION lease_release_all(text[], text) STABLE;

-- True when no unexpired share of this epoch of the name stands, as the caller's
-- statement sees pylease_shared. A function, not a subquery, so that a statement that
-- calls it only for some rows (pylease_claim's grant, for a name readers claimed) does
-- not set up a scan of pylease_shared each time it runs.
CREATE FUNCTION pylease_unshared(name text, epoch bigint, at timestamptz) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM pylease_shared AS s
                        WHERE s.name = pylease_unshared.name AND s.epoch = pylease_unshared.epoch
                          AND s.expires_at > pylease_unshared.at);
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

-- Tell the watchers of a name that its holder changed: a grant (a new fence), a
-- release, new data. NOTIFY pylease_holders with {"name", "fence", "holder", "event",
-- "acquired_at", "expires_at", "ttl"} (event: granted, released or data; holder NULL
-- when released; ttl in seconds): names, fences and times, never data. Called only for
-- a row marked watched (lease_watch, pylease_mark_watched): an unwatched name's grants
-- and releases call nothing: the trigger runs after the row (a BEFORE trigger would
-- have every grant lock the old row version first) and its WHEN is checked without
-- calling a function. That WHEN tests the mark alone: an update of a marked row that
-- changed none of the columns (a retried claim) is told apart here, since a WHEN that
-- compared them cost every grant and release of every name (its expression is built
-- again by each statement). A row whose watchers all expired is unmarked by its next
-- change, without a NOTIFY.
-- Notifications of one name come in the order of its changes (each is a commit that
-- waited for the previous one's row lock).
CREATE OR REPLACE FUNCTION pylease_tell_watchers() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.fence = NEW.fence AND OLD.released = NEW.released
       AND OLD.data IS NOT DISTINCT FROM NEW.data THEN
        RETURN NULL;
    ELSIF NOT EXISTS (SELECT FROM pylease_watchers AS w
                       WHERE w.name = NEW.name AND w.expires_at > clock_timestamp()) THEN
        UPDATE pylease_leases AS l SET watched = false WHERE l.name = NEW.name AND l.watched;
    ELSE
        PERFORM pg_notify('pylease_holders', json_build_object(
            'name', NEW.name, 'fence', NEW.fence,
            'holder', CASE WHEN NEW.released THEN NULL ELSE NEW.holder END,
            'event', CASE WHEN NEW.released THEN 'released'
                          WHEN TG_OP = 'INSERT' OR OLD.fence <> NEW.fence OR OLD.released
                          THEN 'granted' ELSE 'data' END,
            'acquired_at', NEW.acquired_at, 'expires_at', NEW.expires_at,
            'ttl', extract(epoch FROM NEW.ttl))::text);
    END IF;
    RETURN NULL;
END
$$;

-- The one body of a permit claim, permit_claim's and permit_claim_new's: a (slot,
-- fence) row per slot when granted, no row when fewer are free. The name's first
-- claim makes it a semaphore with this limit; another limit raises 22023.
-- new_tenure false (permit_claim): a holder that still holds its slots gets them
-- again, extended (never earlier). new_tenure true (permit_claim_new): a holder
-- that holds an unexpired slot is busy (another process uses this holder); its
-- expired slots are not continued: the grant takes free slots with new fences, and
-- frees those of its expired slots it did not take again, so that the holder's
-- slots are this tenure's alone. A busy claim is answered by reads alone (no row
-- lock, no WAL). A grant takes free slots starting where a hash of the holder
-- points and skips slots another transaction has locked (a claimer, a holder's
-- fenced transaction), so claimers spread over the free slots instead of queueing
-- for one; it never waits for a row it grants. A slot above a
-- lowered limit keeps the slot below it that it maps onto (slot % limit) busy until
-- it is free: the held slots drain down to the new limit. Internal: executable by
-- PUBLIC, as the SQL functions permit_claim and permit_claim_new call it.
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
    top     bigint;
    worn    integer;
    slots   integer[];
    fences  bigint[];
    events  text[];
    before  text[];
    notable boolean;
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
        -- The name's kind and limit, and the slots this holder still holds: a retried
        -- claim whose reply was lost gets them again; a new tenure is busy while any
        -- of them is unexpired.
        SELECT n.kind, n.max_permits, h.mine, h.live, h.whole
          INTO s_kind, s_max, mine, live, whole
          FROM pylease_names AS n,
               LATERAL (SELECT count(*) AS mine, count(*) FILTER (WHERE p.expires_at > t_now) AS live,
                               count(*) = min(p.permits) AND count(*) = max(p.permits) AS whole
                          FROM pylease_permits AS p
                         WHERE p.name = n.name AND p.holder = pylease_permit_claim.holder
                           AND NOT p.released) AS h
         WHERE n.name = pylease_permit_claim.name;
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
        SELECT array_agg(c.slot), max(c.fence) INTO taken, top FROM (
            SELECT p.slot, p.fence FROM pylease_permits AS p
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
            SELECT array_agg(c.slot), max(c.fence) INTO taken, top FROM (
                SELECT p.slot, p.fence FROM pylease_permits AS p
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
    -- The fences as locked (the rows' latest versions, read by the statement that
    -- locked them).
    IF top = 9223372036854775807 THEN
        SELECT min(p.slot) INTO worn FROM pylease_permits AS p
         WHERE p.name = pylease_permit_claim.name AND p.slot = ANY (taken) AND p.fence = top;
        RAISE EXCEPTION 'pylease: semaphore % has used every fence of slot %: it cannot be granted again',
            quote_literal(pylease_permit_claim.name), worn USING ERRCODE = '54000';
    END IF;
    -- A fence floored by the timeline, as a lease's. The next grant of a slot freed
    -- by permit_revoke from an unexpired holder is a steal. The history is written by
    -- a statement of its own, only when it records something: an insert in this one
    -- would cost every grant the setting up of pylease_events and its indexes.
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
    )
    SELECT array_agg(g.slot ORDER BY g.slot), array_agg(g.fence ORDER BY g.slot),
           array_agg(g.event ORDER BY g.slot), array_agg(g.previous ORDER BY g.slot),
           bool_or(g.event <> 'claimed')
      INTO slots, fences, events, before, notable
      FROM granted AS g;
    IF history = 'all' OR (notable AND coalesce(history, '') IN ('', 'rare')) THEN
        INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder, slot)
        SELECT t_now, pylease_permit_claim.name, e.event, pylease_permit_claim.holder, e.fence,
               e.previous, e.slot
          FROM unnest(slots, fences, events, before) AS e(slot, fence, event, previous)
         WHERE history = 'all' OR e.event <> 'claimed';
    END IF;
    FOR i IN 1 .. coalesce(cardinality(slots), 0) LOOP
        slot := slots[i];
        fence := fences[i];
        RETURN NEXT;
    END LOOP;
END
$$;

-- Give back the tenure of permits that holds slot `slot` with fence `fence`: every slot
-- this holder holds, while it still holds that one (a holder's slots are one tenure,
-- granted together); true when they were all still its own. A late release of an
-- earlier tenure (sent before it expired and a new tenure was granted to the same
-- holder) then frees nothing. A NULL slot or fence matches any (both NULL: as
-- permit_release(name, holder)). The slots are locked first and the tenure is told
-- from the locked rows, as they are once locked. NOTIFY pylease when any was freed;
-- without the WAL flush when the release is the first write of its transaction, as
-- lease_release. Neither slot nor fence has a DEFAULT: a call with two arguments
-- still means permit_release(name, holder) alone.
CREATE OR REPLACE FUNCTION permit_release(name text, holder text, slot integer, fence bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   bigint;
    whole   boolean;
    slots   integer[];
    fences  bigint[];
    history text;
    ignored text;
BEGIN
    IF permit_release.name IS NULL OR permit_release.name = '' OR length(permit_release.name) > 200
       OR permit_release.holder IS NULL OR permit_release.holder = ''
       OR length(permit_release.holder) > 200 OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', permit_release.name);
        PERFORM pylease_check_key('holder', permit_release.holder);
        PERFORM pylease_refuse_standby('permit_release');
    END IF;
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;
    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;

    t_now := clock_timestamp();
    WITH locked AS (
        SELECT p.slot, p.permits, p.fence FROM pylease_permits AS p
         WHERE p.name = permit_release.name AND p.holder = permit_release.holder AND NOT p.released
         ORDER BY p.slot
           FOR NO KEY UPDATE OF p
    ), tenure AS (
        SELECT k.slot FROM locked AS k
         WHERE EXISTS (SELECT FROM locked AS m
                        WHERE (permit_release.slot IS NULL OR m.slot = permit_release.slot)
                          AND (permit_release.fence IS NULL OR m.fence = permit_release.fence))
    ), given AS (
        UPDATE pylease_permits AS p
           SET released   = true,
               expires_at = t_now,
               releases   = p.releases + 1
          FROM tenure AS k
         WHERE p.name = permit_release.name AND p.slot = k.slot
        RETURNING p.slot, p.fence, p.permits
    )
    SELECT count(*), count(*) = min(g.permits) AND count(*) = max(g.permits),
           array_agg(g.slot ORDER BY g.slot), array_agg(g.fence ORDER BY g.slot)
      INTO freed, whole, slots, fences FROM given AS g;
    IF freed = 0 THEN
        RETURN false;
    ELSIF history = 'all' THEN
        -- A statement of its own, only then: in the one above, an insert would cost
        -- every release the setting up of pylease_events and its indexes.
        INSERT INTO pylease_events (at, name, event, holder, fence, slot)
        SELECT t_now, permit_release.name, 'released', permit_release.holder, g.fence, g.slot
          FROM unnest(slots, fences) AS g(slot, fence);
    END IF;
    ignored := pg_notify('pylease', permit_release.name);
    RETURN whole;
END
$$;

COMMENT ON FUNCTION pylease_unshared(text, bigint, timestamptz) IS
    'pylease (internal): true when no unexpired share of this epoch of the name stands.';
REVOKE EXECUTE ON FUNCTION pylease_unshared(text, bigint, timestamptz) FROM PUBLIC;
