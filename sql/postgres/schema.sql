-- pylease: the current PostgreSQL schema, as every migration of
-- migrations/postgres/ leaves it. Readable definition; install with
-- `pylease migrate`, which records the migrations. A test proves the two agree.
--
-- psql -v ON_ERROR_STOP=1 -f sql/postgres/schema.sql  (installs into current_schema())
BEGIN;
-- Pin every function's search_path to the schema this runs in (plus pg_temp,
-- last), so that objects in a caller's schema can never stand in for ours.
DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Tables ----------------------------------------------------------------------

-- One row per name ever claimed. Rows are never deleted, so the fence of a name
-- can only grow. Only `name` is indexed and fillfactor leaves room on the page,
-- so claims and renewals are HOT updates.
CREATE TABLE pylease_leases (
    name        text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    holder      text        NOT NULL CHECK (length(holder) BETWEEN 1 AND 200),
    fence       bigint      NOT NULL CHECK (fence > 0),
    ttl         interval    NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    released    boolean     NOT NULL DEFAULT false,
    grants      bigint      NOT NULL DEFAULT 0,
    takeovers   bigint      NOT NULL DEFAULT 0,
    steals      bigint      NOT NULL DEFAULT 0,
    releases    bigint      NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

COMMENT ON TABLE pylease_leases IS
    'pylease: one row per lease name; written only through the lease_* functions.';

-- The cost, measured: a grant is no longer a HOT update (one more index entry
-- per grant), renewals and releases still are. The alternative, renewing row by
-- row around a FOR SHARE lock, would leave the fenced lease's own renewal
-- waiting and make the keeper's one statement many.
CREATE UNIQUE INDEX pylease_leases_fence ON pylease_leases (name, fence);
-- What happened to each lease, newest last; rows are only ever added (and pruned).
-- The two indexes serve lease_history's two queries (all names, one name) and
-- lease_prune_history.
CREATE TABLE pylease_events (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL,
    name            text        NOT NULL,
    event           text        NOT NULL
                    CHECK (event IN ('claimed', 'taken_over', 'stolen', 'released')),
    holder          text        NOT NULL,
    fence           bigint      NOT NULL,
    previous_holder text
);
CREATE INDEX pylease_events_at ON pylease_events (at, id);
CREATE INDEX pylease_events_name_at ON pylease_events (name, at, id);

COMMENT ON TABLE pylease_events IS
    'pylease: lease history (pylease.history = rare | all | none); written only through the lease_* functions.';

-- Argument checks -------------------------------------------------------------

-- Raises 22023 unless a name or holder is a non-empty text of at most 200 characters.
CREATE FUNCTION pylease_check_key(parameter text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value = '' THEN
        RAISE EXCEPTION 'pylease: % must not be empty', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF length(value) > 200 THEN
        RAISE EXCEPTION 'pylease: % must be at most 200 characters', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- Raises 22023 unless a ttl is finite, positive and at most 366 days.
CREATE FUNCTION pylease_check_ttl(parameter text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF NOT isfinite(value) THEN
        RAISE EXCEPTION 'pylease: % must be finite', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value <= interval '0' THEN
        RAISE EXCEPTION 'pylease: % must be positive', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value > interval '366 days' THEN
        RAISE EXCEPTION 'pylease: % must be at most 366 days', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- Raises 22023 unless a span (older_than, min_hold) is finite, not negative and
-- at most 366 days (beyond that, now +/- the span could leave timestamptz's range).
CREATE FUNCTION pylease_check_span(parameter text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF NOT isfinite(value) THEN
        RAISE EXCEPTION 'pylease: % must be finite', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value < interval '0' THEN
        RAISE EXCEPTION 'pylease: % must not be negative', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value > interval '366 days' THEN
        RAISE EXCEPTION 'pylease: % must be at most 366 days', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- Raises 22023 unless a batch's arrays are given, as long as each other, with
-- valid names, holders and (NULL or valid) ttls.
CREATE FUNCTION pylease_check_batch(names text[], holders text[], ttls interval[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF names IS NULL THEN
        RAISE EXCEPTION 'pylease: names must not be NULL' USING ERRCODE = '22023', COLUMN = 'names';
    ELSIF holders IS NULL THEN
        RAISE EXCEPTION 'pylease: holders must not be NULL'
            USING ERRCODE = '22023', COLUMN = 'holders';
    ELSIF cardinality(names) <> cardinality(holders) THEN
        RAISE EXCEPTION 'pylease: holders must have as many elements as names'
            USING ERRCODE = '22023', COLUMN = 'holders';
    ELSIF EXISTS (SELECT FROM unnest(names) AS u(v) WHERE v IS NULL OR v = '' OR length(v) > 200) THEN
        RAISE EXCEPTION 'pylease: names must hold only non-empty texts of at most 200 characters'
            USING ERRCODE = '22023', COLUMN = 'names';
    ELSIF EXISTS (SELECT FROM unnest(holders) AS u(v) WHERE v IS NULL OR v = '' OR length(v) > 200) THEN
        RAISE EXCEPTION 'pylease: holders must hold only non-empty texts of at most 200 characters'
            USING ERRCODE = '22023', COLUMN = 'holders';
    END IF;
    IF ttls IS NOT NULL THEN
        IF cardinality(ttls) <> cardinality(names) THEN
            RAISE EXCEPTION 'pylease: ttls must have as many elements as names'
                USING ERRCODE = '22023', COLUMN = 'ttls';
        ELSIF EXISTS (SELECT FROM unnest(ttls) AS u(v)
                       WHERE NOT isfinite(v) OR v <= interval '0' OR v > interval '366 days') THEN
            RAISE EXCEPTION 'pylease: ttls must hold only NULLs or finite, positive ttls of at most 366 days'
                USING ERRCODE = '22023', COLUMN = 'ttls';
        END IF;
    END IF;
END
$$;

-- Raises 25006 naming the operation: a standby answers reads, so a claim there
-- would otherwise look busy, and a write would fail with a bare driver error.
CREATE FUNCTION pylease_refuse_standby(operation text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'pylease: % needs the primary: this server is a read-only standby', operation
        USING ERRCODE = '25006',
              HINT = 'Connect to the primary, e.g. with target_session_attrs=read-write in the connection string.';
END
$$;

-- Raises 25006 for a grant in a read-only transaction on a server that is not a
-- standby (default_transaction_read_only set for a role or database): an error
-- that says so, never a busy answer nor "connect to the primary".
CREATE FUNCTION pylease_refuse_read_only(operation text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'pylease: % needs a read-write transaction, and this one is read-only', operation
        USING ERRCODE = '25006',
              HINT = 'default_transaction_read_only is on for this role, database or session: turn it off for the role pylease connects as (ALTER ROLE ... SET default_transaction_read_only = off).';
END
$$;

-- Raises 22023 for a pylease.history setting that is not rare, all, none or empty.
CREATE FUNCTION pylease_refuse_history(setting text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'pylease: pylease.history must be rare, all or none, not %', quote_literal(setting)
        USING ERRCODE = '22023', COLUMN = 'pylease.history';
END
$$;

-- Functions -------------------------------------------------------------------

-- Claim a lease: the fence when granted, NULL when another holder's unexpired
-- lease stands. A busy lease is answered by one read (no row lock, no WAL) that
-- also decides "busy", so the busy path is three steps.
-- A grant updates the row only if it is still as read (fence, released), so
-- that the exhaustion check and the history see exactly the row they replace;
-- otherwise somebody else changed it meanwhile and the claim looks again.
CREATE FUNCTION lease_claim(name text, ttl interval, holder text) RETURNS bigint
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
CREATE FUNCTION lease_claim_new(name text, ttl interval, holder text) RETURNS bigint
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
CREATE FUNCTION lease_renew(name text, holder text, ttl interval DEFAULT NULL) RETURNS boolean
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
CREATE FUNCTION lease_renew_many(names text[], holders text[], ttl interval DEFAULT NULL)
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

-- Renew many leases in one statement, each with its own ttl (NULL: its last
-- one): per element of names, in order, whether it was renewed, the expiry
-- granted and the server's clock when it was (NULLs when not renewed). A
-- client's local expiry is its send time + (expires_at - server_time). As in
-- lease_renew_many, the elements are checked inside the statement.
CREATE FUNCTION lease_renew_each(names text[], holders text[], ttls interval[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF lease_renew_each.ttls IS NULL THEN
        RAISE EXCEPTION 'pylease: ttls must not be NULL' USING ERRCODE = '22023', COLUMN = 'ttls';
    END IF;
    IF lease_renew_each.names IS NULL OR lease_renew_each.holders IS NULL
       OR cardinality(lease_renew_each.names) <> cardinality(lease_renew_each.holders)
       OR cardinality(lease_renew_each.ttls) <> cardinality(lease_renew_each.names)
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_batch(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls);
        PERFORM pylease_refuse_standby('lease_renew_each');
    END IF;

    RETURN QUERY
    WITH wanted AS (
        SELECT u.n, u.h, u.t, u.i
          FROM unnest(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls)
               WITH ORDINALITY AS u(n, h, t, i)
         WHERE CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                      OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                    THEN pylease_check_batch(lease_renew_each.names, lease_renew_each.holders,
                                             lease_renew_each.ttls) IS NULL
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
    SELECT w.n, r.name IS NOT NULL, r.expires_at, CASE WHEN r.name IS NOT NULL THEN t_now END
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h
     ORDER BY w.i;
END
$$;

-- Give a lease back, only if this holder still holds it. Without the WAL flush
-- when the release is the first write of its transaction: a release lost in a
-- crash only keeps the lease until its expiry. Every step on the common path is
-- an expression PL/pgSQL evaluates itself (an assignment, not PERFORM, which
-- would start the executor for each call of set_config and pg_notify).
CREATE FUNCTION lease_release(name text, holder text, min_hold interval DEFAULT NULL) RETURNS boolean
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

-- Take a lease whatever its state, when its holder last claimed or renewed at
-- least older_than ago; on a free name, a claim. The new fence, or NULL. As in
-- lease_claim, the row is replaced only if it is still as read. From the holder the
-- row names, the expiry never moves earlier: the earlier tenure's owner may still
-- believe what it was granted.
CREATE FUNCTION lease_steal(name text, ttl interval, holder text, older_than interval DEFAULT '0')
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

-- True iff this holder holds the unexpired lease with this fence. Locks the row
-- FOR KEY SHARE: every grant changes the fence, a key column, so a fenced write
-- in the caller's transaction and any takeover are serialized, while renewals
-- and releases (no key change) never wait for it.
CREATE FUNCTION lease_holds(name text, holder text, fence bigint) RETURNS boolean
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
    RETURN FOUND;
END
$$;

-- One row per name ever claimed (all names when name is NULL); held means
-- unexpired and not released; state tells held, resting (released, not yet
-- claimable: min_hold), released and expired apart. SQL, not PL/pgSQL: only SQL
-- lets the argument and the output column share the name "name".
CREATE FUNCTION lease_status(name text DEFAULT NULL)
RETURNS TABLE(name text, holder text, fence bigint, acquired_at timestamptz,
              renewed_at timestamptz, expires_at timestamptz, held boolean,
              state text, ttl interval)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT l.name, l.holder, l.fence, l.acquired_at, l.renewed_at, l.expires_at,
           NOT l.released AND l.expires_at > c.now,
           CASE WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
                WHEN l.released THEN 'released' ELSE 'expired' END,
           l.ttl
      FROM pylease_leases AS l, (SELECT clock_timestamp() AS now) AS c
     WHERE $1 IS NULL OR l.name = $1
     ORDER BY l.name;
$$;

-- Per name, how many grants (every new tenure), takeovers (after an expiry
-- without a release), steals (from an unexpired holder) and releases there were.
CREATE FUNCTION lease_counters(name text DEFAULT NULL)
RETURNS TABLE(name text, grants bigint, takeovers bigint, steals bigint, releases bigint)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT l.name, l.grants, l.takeovers, l.steals, l.releases
      FROM pylease_leases AS l
     WHERE $1 IS NULL OR l.name = $1
     ORDER BY l.name;
$$;

-- lease_history's rows, one query per case, so that each one uses its index.
CREATE FUNCTION pylease_history_rows(lease text, since timestamptz, max_rows integer)
RETURNS TABLE(at timestamptz, name text, event text, holder text, fence bigint, previous_holder text)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'pylease: max_rows must be between 1 and 10000'
            USING ERRCODE = '22023', COLUMN = 'max_rows';
    END IF;
    IF lease IS NULL THEN
        RETURN QUERY
        SELECT e.at, e.name, e.event, e.holder, e.fence, e.previous_holder
          FROM pylease_events AS e
         WHERE e.at >= coalesce(pylease_history_rows.since, '-infinity')
         ORDER BY e.at DESC, e.id DESC
         LIMIT pylease_history_rows.max_rows;
    ELSE
        PERFORM pylease_check_key('name', lease);
        RETURN QUERY
        SELECT e.at, e.name, e.event, e.holder, e.fence, e.previous_holder
          FROM pylease_events AS e
         WHERE e.name = lease AND e.at >= coalesce(pylease_history_rows.since, '-infinity')
         ORDER BY e.at DESC, e.id DESC
         LIMIT pylease_history_rows.max_rows;
    END IF;
END
$$;

-- Events newest first (ties: the later recorded first), of one name or all,
-- since a moment (inclusive), at most max_rows (1 to 10000).
CREATE FUNCTION lease_history(name text DEFAULT NULL, since timestamptz DEFAULT NULL,
                              max_rows integer DEFAULT 100)
RETURNS TABLE(at timestamptz, name text, event text, holder text, fence bigint, previous_holder text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT * FROM pylease_history_rows($1, $2, $3);
$$;

-- Delete the events older than older_than; how many were deleted.
CREATE FUNCTION lease_prune_history(older_than interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    deleted bigint;
BEGIN
    PERFORM pylease_check_span('older_than', lease_prune_history.older_than);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_prune_history');
    END IF;
    DELETE FROM pylease_events AS e
     WHERE e.at < clock_timestamp() - lease_prune_history.older_than;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

COMMENT ON FUNCTION lease_claim(text, interval, text) IS
    'pylease: claim a lease; returns the fence when granted, NULL when another holder''s unexpired lease stands.';
COMMENT ON FUNCTION lease_claim_new(text, interval, text) IS
    'pylease: claim a new tenure; the fence when granted, NULL while anyone''s unexpired lease stands, this holder''s own included.';
COMMENT ON FUNCTION lease_renew(text, text, interval) IS
    'pylease: extend a lease this holder still holds to the later of its expiry and now + ttl (the last ttl when NULL); false once lost.';
COMMENT ON FUNCTION lease_renew_many(text[], text[], interval) IS
    'pylease: renew many leases in one statement; one (name, renewed) row per element, in order.';
COMMENT ON FUNCTION lease_renew_each(text[], text[], interval[]) IS
    'pylease: renew many leases in one statement with a ttl each; per element, in order: renewed, the expiry granted, the server''s clock.';
COMMENT ON FUNCTION lease_release(text, text, interval) IS
    'pylease: give back a lease this holder still holds (free again at acquired_at + min_hold at the earliest); NOTIFY pylease when freed.';
COMMENT ON FUNCTION lease_release(text, text, interval, bigint) IS
    'pylease: give back the tenure with this fence if this holder still holds it; as lease_release(name, holder, min_hold) otherwise.';
COMMENT ON FUNCTION lease_steal(text, interval, text, interval) IS
    'pylease: take a lease whatever its state when its holder last renewed at least older_than ago; the new fence or NULL.';
COMMENT ON FUNCTION lease_holds(text, text, bigint) IS
    'pylease: true iff the unexpired lease is held by this holder with this fence; locks the row FOR KEY SHARE against every grant.';
COMMENT ON FUNCTION lease_status(text) IS
    'pylease: one row per lease name (all when name is NULL); held means unexpired and not released; state is held, resting, released or expired.';
COMMENT ON FUNCTION lease_counters(text) IS
    'pylease: per lease name, how many grants, takeovers, steals and releases there were.';
COMMENT ON FUNCTION lease_history(text, timestamptz, integer) IS
    'pylease: recorded events (pylease.history), newest first, since a moment, at most max_rows.';
COMMENT ON FUNCTION lease_prune_history(interval) IS
    'pylease: delete the events older than older_than; returns how many.';

-- The queue of waiting processes ----------------------------------------------

-- One row per waiting process and lease name, in arrival order (id). A row
-- outlives its waiter only until expires_at, which the waiter refreshes: a waiter
-- that vanished is skipped, and liveness never rests on session state (so
-- PgBouncer's transaction mode is fine).
CREATE TABLE pylease_waiters (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL,
    waiter     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    UNIQUE (name, waiter)
);
CREATE INDEX pylease_waiters_name_id ON pylease_waiters (name, id);
-- For the sweep of expired entries (of names nobody waits on any more) that
-- lease_wait and lease_unwait end with.
CREATE INDEX pylease_waiters_expires_at ON pylease_waiters (expires_at);

COMMENT ON TABLE pylease_waiters IS
    'pylease: processes waiting for a lease, in arrival order; written only through lease_wait and lease_unwait.';

-- Queue a waiter for a lease name, or refresh its expiry: true when it is the head
-- (the first unexpired waiter), which alone claims again on a release. The expired
-- waiters of the name are removed, and a few expired ones of any name.
CREATE FUNCTION lease_wait(name text, waiter text, ttl interval) RETURNS boolean
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
CREATE FUNCTION lease_unwait(name text, waiter text, granted boolean DEFAULT false)
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

COMMENT ON FUNCTION lease_wait(text, text, interval) IS
    'pylease: queue a waiting process for a lease name (or refresh its expiry); true when it is the head.';
COMMENT ON FUNCTION lease_unwait(text, text, boolean) IS
    'pylease: take a waiting process out of the queue; wakes the new head with NOTIFY pylease_waiters.';

REVOKE ALL ON TABLE pylease_waiters FROM PUBLIC;

-- Privileges ------------------------------------------------------------------

REVOKE ALL ON TABLE pylease_leases FROM PUBLIC;
REVOKE ALL ON TABLE pylease_events FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_key(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_ttl(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_span(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_batch(text[], text[], interval[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_standby(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_read_only(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_history(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_history_rows(text, timestamptz, integer) FROM PUBLIC;
-- Stealing breaks somebody's lease: an operator grants it to the roles that may.
REVOKE EXECUTE ON FUNCTION lease_steal(text, interval, text, interval) FROM PUBLIC;
-- Pruning destroys the record: an operator grants it to the roles that may.
REVOKE EXECUTE ON FUNCTION lease_prune_history(interval) FROM PUBLIC;

COMMIT;
