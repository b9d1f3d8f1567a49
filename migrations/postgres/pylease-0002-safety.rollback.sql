-- Undo pylease 0002: the 0001 definitions again. Fences issued meanwhile stay.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION lease_renew_each(text[], text[], interval[]);
DROP INDEX pylease_leases_fence;

-- Raises 22023 unless a name or holder is a non-empty text of at most 200 characters.
CREATE OR REPLACE FUNCTION pylease_check_key(parameter text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter USING ERRCODE = '22023';
    ELSIF value = '' THEN
        RAISE EXCEPTION 'pylease: % must not be empty', parameter USING ERRCODE = '22023';
    ELSIF length(value) > 200 THEN
        RAISE EXCEPTION 'pylease: % must be at most 200 characters', parameter USING ERRCODE = '22023';
    END IF;
END
$$;

-- Raises 22023 unless a ttl is finite, positive and at most 366 days.
CREATE OR REPLACE FUNCTION pylease_check_ttl(parameter text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter USING ERRCODE = '22023';
    ELSIF NOT isfinite(value) THEN
        RAISE EXCEPTION 'pylease: % must be finite', parameter USING ERRCODE = '22023';
    ELSIF value <= interval '0' THEN
        RAISE EXCEPTION 'pylease: % must be positive', parameter USING ERRCODE = '22023';
    ELSIF value > interval '366 days' THEN
        RAISE EXCEPTION 'pylease: % must be at most 366 days', parameter USING ERRCODE = '22023';
    END IF;
END
$$;

-- Raises 22023 unless a span (older_than, min_hold) is finite, not negative and
-- at most 366 days (beyond that, now +/- the span could leave timestamptz's range).
CREATE OR REPLACE FUNCTION pylease_check_span(parameter text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter USING ERRCODE = '22023';
    ELSIF NOT isfinite(value) THEN
        RAISE EXCEPTION 'pylease: % must be finite', parameter USING ERRCODE = '22023';
    ELSIF value < interval '0' THEN
        RAISE EXCEPTION 'pylease: % must not be negative', parameter USING ERRCODE = '22023';
    ELSIF value > interval '366 days' THEN
        RAISE EXCEPTION 'pylease: % must be at most 366 days', parameter USING ERRCODE = '22023';
    END IF;
END
$$;

-- Claim a lease: the fence when granted, NULL when another holder's unexpired
-- lease stands. A busy lease is answered by one read: no row lock, no WAL.
CREATE OR REPLACE FUNCTION lease_claim(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now     timestamptz := clock_timestamp();
    granted   bigint;
    s_holder  text;
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

    SELECT l.holder, l.expires_at, l.released INTO s_holder, s_expires, s_freed
      FROM pylease_leases AS l
     WHERE l.name = lease_claim.name;
    IF FOUND THEN
        IF s_expires > t_now AND (s_holder <> lease_claim.holder OR s_freed) THEN
            RETURN NULL;
        END IF;
        -- Free (released or expired), or still ours: a retried claim whose reply was
        -- lost keeps its fence instead of looking busy. The WHERE decides the race
        -- with other claimers; NULL when one of them got there since the read.
        UPDATE pylease_leases AS l
           SET fence       = CASE WHEN l.holder = lease_claim.holder AND NOT l.released
                                  THEN l.fence ELSE l.fence + 1 END,
               acquired_at = CASE WHEN l.holder = lease_claim.holder AND NOT l.released
                                  THEN l.acquired_at ELSE t_now END,
               holder      = lease_claim.holder,
               ttl         = lease_claim.ttl,
               renewed_at  = t_now,
               expires_at  = t_now + lease_claim.ttl,
               released    = false
         WHERE l.name = lease_claim.name
           AND (l.expires_at <= t_now OR (l.holder = lease_claim.holder AND NOT l.released))
        RETURNING l.fence INTO granted;
        RETURN granted;
    END IF;

    -- A first claim of the name; a conflict means another claimer created it first.
    INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at)
    VALUES (lease_claim.name, lease_claim.holder, 1, lease_claim.ttl, t_now, t_now, t_now + lease_claim.ttl)
    ON CONFLICT (name) DO NOTHING
    RETURNING l.fence INTO granted;
    RETURN granted;
END
$$;

-- Renew a lease this holder still holds, also past its expiry if nobody took it.
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

    UPDATE pylease_leases AS l
       SET ttl        = coalesce(lease_renew.ttl, l.ttl),
           renewed_at = t_now,
           expires_at = t_now + coalesce(lease_renew.ttl, l.ttl)
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
    IF lease_renew_many.names IS NULL THEN
        RAISE EXCEPTION 'pylease: names must not be NULL' USING ERRCODE = '22023';
    ELSIF lease_renew_many.holders IS NULL THEN
        RAISE EXCEPTION 'pylease: holders must not be NULL' USING ERRCODE = '22023';
    ELSIF cardinality(lease_renew_many.names) <> cardinality(lease_renew_many.holders) THEN
        RAISE EXCEPTION 'pylease: holders must have as many elements as names' USING ERRCODE = '22023';
    ELSIF EXISTS (SELECT FROM unnest(lease_renew_many.names) AS u(v)
                   WHERE v IS NULL OR v = '' OR length(v) > 200) THEN
        RAISE EXCEPTION 'pylease: names must hold only non-empty texts of at most 200 characters'
            USING ERRCODE = '22023';
    ELSIF EXISTS (SELECT FROM unnest(lease_renew_many.holders) AS u(v)
                   WHERE v IS NULL OR v = '' OR length(v) > 200) THEN
        RAISE EXCEPTION 'pylease: holders must hold only non-empty texts of at most 200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF lease_renew_many.ttl IS NOT NULL THEN
        PERFORM pylease_check_ttl('ttl', lease_renew_many.ttl);
    END IF;

    -- Rows are locked in name order, so two renewers of overlapping sets (an
    -- owner and a keep_fresh helper) cannot deadlock.
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
               expires_at = t_now + coalesce(lease_renew_many.ttl, l.ttl)
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
-- least older_than ago; on a free name, a claim. The new fence, or NULL.
CREATE OR REPLACE FUNCTION lease_steal(name text, ttl interval, holder text, older_than interval DEFAULT '0')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    granted bigint;
BEGIN
    PERFORM pylease_check_key('name', lease_steal.name);
    PERFORM pylease_check_ttl('ttl', lease_steal.ttl);
    PERFORM pylease_check_key('holder', lease_steal.holder);
    PERFORM pylease_check_span('older_than', lease_steal.older_than);

    UPDATE pylease_leases AS l
       SET fence       = l.fence + 1,
           holder      = lease_steal.holder,
           ttl         = lease_steal.ttl,
           acquired_at = t_now,
           renewed_at  = t_now,
           expires_at  = t_now + lease_steal.ttl,
           released    = false
     WHERE l.name = lease_steal.name
       AND (l.renewed_at <= t_now - lease_steal.older_than OR l.expires_at <= t_now)
    RETURNING l.fence INTO granted;
    IF FOUND THEN
        RETURN granted;
    END IF;

    INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at, expires_at)
    VALUES (lease_steal.name, lease_steal.holder, 1, lease_steal.ttl, t_now, t_now, t_now + lease_steal.ttl)
    ON CONFLICT (name) DO NOTHING
    RETURNING l.fence INTO granted;
    RETURN granted;
END
$$;

-- True iff this holder holds the unexpired lease with this fence. Locks the row
-- FOR SHARE, so a fenced write in the caller's transaction and any takeover
-- are serialized.
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
        RAISE EXCEPTION 'pylease: fence must not be NULL' USING ERRCODE = '22023';
    END IF;

    PERFORM FROM pylease_leases AS l
      WHERE l.name = lease_holds.name AND l.holder = lease_holds.holder
        AND l.fence = lease_holds.fence AND NOT l.released
        AND l.expires_at > clock_timestamp()
        FOR SHARE;
    RETURN FOUND;
END
$$;

DROP FUNCTION pylease_check_batch(text[], text[], interval[]);
DROP FUNCTION pylease_refuse_standby(text);

COMMENT ON FUNCTION lease_renew(text, text, interval) IS
    'pylease: extend a lease this holder still holds to now + ttl (the last ttl when NULL); false once lost.';
COMMENT ON FUNCTION lease_holds(text, text, bigint) IS
    'pylease: true iff the unexpired lease is held by this holder with this fence; locks the row FOR SHARE.';
