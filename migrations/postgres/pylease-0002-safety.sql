-- pylease 0002: safety and failover (contract revision 2). Keep
-- sql/postgres/schema.sql in step.
--   * a renewal never moves an expiry earlier: greatest(current, now + ttl);
--   * lease_renew_each: per-lease ttls, the expiry granted and the server's clock;
--   * a holder's open fenced transaction (lease_holds) never makes a renewal wait:
--     the fence is a key column (unique index on (name, fence)), lease_holds takes
--     FOR KEY SHARE, so every grant (a key update: the fence changes) waits for the
--     fenced transaction while renewals and releases (no key change) pass;
--   * fences are floored at ((timeline - 1) << 40) + 1, so a promoted standby never
--     reissues a fence of the old primary; exhausted fences raise 54000;
--   * a standby refuses claim, renew, steal and release with a clear error;
--   * 22023 errors name their parameter in the error's COLUMN field.
-- depends: pylease-0001-leases

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- The cost, measured: a grant is no longer a HOT update (one more index entry
-- per grant), renewals and releases still are. The alternative, renewing row by
-- row around a FOR SHARE lock, would leave the fenced lease's own renewal
-- waiting and make the keeper's one statement many.
CREATE UNIQUE INDEX pylease_leases_fence ON pylease_leases (name, fence);
-- Argument checks -------------------------------------------------------------

-- Raises 22023 unless a name or holder is a non-empty text of at most 200 characters.
CREATE OR REPLACE FUNCTION pylease_check_key(parameter text, value text) RETURNS void
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
CREATE OR REPLACE FUNCTION pylease_check_ttl(parameter text, value interval) RETURNS void
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
CREATE OR REPLACE FUNCTION pylease_check_span(parameter text, value interval) RETURNS void
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

-- Functions -------------------------------------------------------------------

-- Claim a lease: the fence when granted, NULL when another holder's unexpired
-- lease stands. A busy lease is answered by one read: no row lock, no WAL.
-- A grant updates the row only if it is still as read (fence, released), so
-- that the exhaustion check and the history see exactly the row they replace;
-- otherwise somebody else changed it meanwhile and the claim looks again.
CREATE OR REPLACE FUNCTION lease_claim(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now     timestamptz := clock_timestamp();
    granted   bigint;
    s_holder  text;
    s_fence   bigint;
    s_expires timestamptz;
    s_freed   boolean;
BEGIN
    -- One cheap test in the common case; the checks that raise run only when it fails.
    IF lease_claim.name IS NULL OR lease_claim.name = '' OR length(lease_claim.name) > 200
       OR lease_claim.ttl IS NULL OR NOT isfinite(lease_claim.ttl)
       OR lease_claim.ttl <= interval '0' OR lease_claim.ttl > interval '366 days'
       OR lease_claim.holder IS NULL OR lease_claim.holder = '' OR length(lease_claim.holder) > 200
    THEN
        PERFORM pylease_check_key('name', lease_claim.name);
        PERFORM pylease_check_ttl('ttl', lease_claim.ttl);
        PERFORM pylease_check_key('holder', lease_claim.holder);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_claim');
    END IF;

    LOOP
        SELECT l.holder, l.fence, l.expires_at, l.released
          INTO s_holder, s_fence, s_expires, s_freed
          FROM pylease_leases AS l
         WHERE l.name = lease_claim.name;
        IF NOT FOUND THEN
            -- A first claim of the name; a conflict means another claimer created it first.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at)
            VALUES (lease_claim.name, lease_claim.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    lease_claim.ttl, t_now, t_now, t_now + lease_claim.ttl)
            ON CONFLICT (name) DO NOTHING
            RETURNING l.fence INTO granted;
            RETURN granted;
        END IF;

        IF s_holder = lease_claim.holder AND NOT s_freed THEN
            -- Still ours: a retried claim whose reply was lost keeps its fence
            -- instead of looking busy.
            UPDATE pylease_leases AS l
               SET ttl        = lease_claim.ttl,
                   renewed_at = t_now,
                   expires_at = t_now + lease_claim.ttl
             WHERE l.name = lease_claim.name AND l.fence = s_fence
               AND l.holder = lease_claim.holder AND NOT l.released
            RETURNING l.fence INTO granted;
        ELSIF s_expires > t_now THEN
            RETURN NULL;
        ELSIF s_fence = 9223372036854775807 THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(lease_claim.name), s_fence USING ERRCODE = '54000';
        ELSE
            -- Free (released or expired). The fence is floored by the timeline WAL is
            -- written on, so a promoted standby never reissues the old primary's fences.
            UPDATE pylease_leases AS l
               SET fence       = greatest(s_fence + 1,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                   acquired_at = t_now,
                   holder      = lease_claim.holder,
                   ttl         = lease_claim.ttl,
                   renewed_at  = t_now,
                   expires_at  = t_now + lease_claim.ttl,
                   released    = false
             WHERE l.name = lease_claim.name AND l.fence = s_fence AND l.released = s_freed
               AND l.expires_at <= t_now
            RETURNING l.fence INTO granted;
        END IF;
        IF FOUND THEN
            RETURN granted;
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
CREATE OR REPLACE FUNCTION lease_renew_many(names text[], holders text[], ttl interval DEFAULT NULL)
RETURNS TABLE(name text, renewed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    PERFORM pylease_check_batch(lease_renew_many.names, lease_renew_many.holders, NULL);
    IF lease_renew_many.ttl IS NOT NULL THEN
        PERFORM pylease_check_ttl('ttl', lease_renew_many.ttl);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_renew_many');
    END IF;

    -- Rows are locked in name order, so two renewers of overlapping sets (an
    -- owner and a keep_fresh helper) cannot deadlock. FOR NO KEY UPDATE passes
    -- the FOR KEY SHARE of a holder's fenced transaction.
    RETURN QUERY
    WITH wanted AS (
        SELECT u.n, u.h, u.i
          FROM unnest(lease_renew_many.names, lease_renew_many.holders) WITH ORDINALITY AS u(n, h, i)
    ), locked AS (
        SELECT l.name
          FROM pylease_leases AS l
         WHERE (l.name, l.holder) IN (SELECT w.n, w.h FROM wanted AS w) AND NOT l.released
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
-- client's local expiry is its send time + (expires_at - server_time).
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
    PERFORM pylease_check_batch(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_renew_each');
    END IF;

    RETURN QUERY
    WITH wanted AS (
        SELECT u.n, u.h, u.t, u.i
          FROM unnest(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls)
               WITH ORDINALITY AS u(n, h, t, i)
    ), locked AS (
        SELECT l.name
          FROM pylease_leases AS l
         WHERE (l.name, l.holder) IN (SELECT w.n, w.h FROM wanted AS w) AND NOT l.released
         ORDER BY l.name
           FOR NO KEY UPDATE OF l
    ), renewed AS (
        UPDATE pylease_leases AS l
           SET ttl        = coalesce(w.t, l.ttl),
               renewed_at = t_now,
               expires_at = greatest(l.expires_at, t_now + coalesce(w.t, l.ttl))
          FROM locked AS k, wanted AS w
         WHERE l.name = k.name AND w.n = l.name AND w.h = l.holder
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
-- crash only keeps the lease until its expiry.
CREATE OR REPLACE FUNCTION lease_release(name text, holder text, min_hold interval DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now    timestamptz := clock_timestamp();
    freed_at timestamptz;
BEGIN
    IF lease_release.name IS NULL OR lease_release.name = '' OR length(lease_release.name) > 200
       OR lease_release.holder IS NULL OR lease_release.holder = ''
       OR length(lease_release.holder) > 200
       OR NOT isfinite(lease_release.min_hold) OR lease_release.min_hold < interval '0'
       OR lease_release.min_hold > interval '366 days'
    THEN
        PERFORM pylease_check_key('name', lease_release.name);
        PERFORM pylease_check_key('holder', lease_release.holder);
        IF lease_release.min_hold IS NOT NULL THEN
            PERFORM pylease_check_span('min_hold', lease_release.min_hold);
        END IF;
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_release');
    END IF;

    -- Give up the flush only while this transaction has written nothing (as in
    -- autocommit), so a caller's earlier writes in the same transaction keep their
    -- durability; one who writes after releasing runs SET LOCAL synchronous_commit
    -- = on. (transaction_timestamp() = statement_timestamp() cannot tell: drivers'
    -- extended protocol makes them differ even in autocommit.)
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    UPDATE pylease_leases AS l
       SET released   = true,
           expires_at = CASE WHEN lease_release.min_hold IS NULL THEN t_now
                             ELSE greatest(t_now, l.acquired_at + lease_release.min_hold) END
     WHERE l.name = lease_release.name AND l.holder = lease_release.holder AND NOT l.released
    RETURNING l.expires_at INTO freed_at;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF freed_at <= t_now THEN
        PERFORM pg_notify('pylease', lease_release.name);
    END IF;
    RETURN true;
END
$$;

-- Take a lease whatever its state, when its holder last claimed or renewed at
-- least older_than ago; on a free name, a claim. The new fence, or NULL. As in
-- lease_claim, the row is replaced only if it is still as read.
CREATE OR REPLACE FUNCTION lease_steal(name text, ttl interval, holder text, older_than interval DEFAULT '0')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now     timestamptz := clock_timestamp();
    granted   bigint;
    s_fence   bigint;
    s_renewed timestamptz;
    s_expires timestamptz;
    s_freed   boolean;
BEGIN
    PERFORM pylease_check_key('name', lease_steal.name);
    PERFORM pylease_check_ttl('ttl', lease_steal.ttl);
    PERFORM pylease_check_key('holder', lease_steal.holder);
    PERFORM pylease_check_span('older_than', lease_steal.older_than);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_steal');
    END IF;

    LOOP
        SELECT l.fence, l.renewed_at, l.expires_at, l.released
          INTO s_fence, s_renewed, s_expires, s_freed
          FROM pylease_leases AS l
         WHERE l.name = lease_steal.name;
        IF NOT FOUND THEN
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at)
            VALUES (lease_steal.name, lease_steal.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    lease_steal.ttl, t_now, t_now, t_now + lease_steal.ttl)
            ON CONFLICT (name) DO NOTHING
            RETURNING l.fence INTO granted;
            RETURN granted;
        END IF;
        IF s_renewed > t_now - lease_steal.older_than AND s_expires > t_now THEN
            RETURN NULL;
        ELSIF s_fence = 9223372036854775807 THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(lease_steal.name), s_fence USING ERRCODE = '54000';
        END IF;

        UPDATE pylease_leases AS l
           SET fence       = greatest(s_fence + 1,
                ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
               holder      = lease_steal.holder,
               ttl         = lease_steal.ttl,
               acquired_at = t_now,
               renewed_at  = t_now,
               expires_at  = t_now + lease_steal.ttl,
               released    = false
         WHERE l.name = lease_steal.name AND l.fence = s_fence AND l.released = s_freed
           AND l.expires_at = s_expires
           AND (l.renewed_at <= t_now - lease_steal.older_than OR l.expires_at <= t_now)
        RETURNING l.fence INTO granted;
        IF FOUND THEN
            RETURN granted;
        END IF;
    END LOOP;
END
$$;

-- True iff this holder holds the unexpired lease with this fence. Locks the row
-- FOR KEY SHARE: every grant changes the fence, a key column, so a fenced write
-- in the caller's transaction and any takeover are serialized, while renewals
-- and releases (no key change) never wait for it.
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
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION lease_renew(text, text, interval) IS
    'pylease: extend a lease this holder still holds to the later of its expiry and now + ttl (the last ttl when NULL); false once lost.';
COMMENT ON FUNCTION lease_renew_each(text[], text[], interval[]) IS
    'pylease: renew many leases in one statement with a ttl each; per element, in order: renewed, the expiry granted, the server''s clock.';
COMMENT ON FUNCTION lease_holds(text, text, bigint) IS
    'pylease: true iff the unexpired lease is held by this holder with this fence; locks the row FOR KEY SHARE against every grant.';

REVOKE EXECUTE ON FUNCTION pylease_check_batch(text[], text[], interval[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_standby(text) FROM PUBLIC;
