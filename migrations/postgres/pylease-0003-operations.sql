-- pylease 0003: operations (contract revision 2). Keep sql/postgres/schema.sql in step.
--   * lease_status gains trailing columns state and ttl. Its return type changes,
--     so it is dropped and created again, keeping its comment and its grants. A
--     view of yours on lease_status must be dropped before this migration and
--     created again after it: the migration stops, naming the views, if one exists.
--   * counters on the lease row (grants, takeovers, steals, releases), kept by the
--     same UPDATE that grants, steals or releases; lease_counters reads them. They
--     count from this migration on (earlier grants are not known).
--   * pylease_events, an append-only history, written in the same transaction as
--     the event when the pylease.history setting asks for it: 'rare' (the default,
--     also when unset or empty) records taken_over and stolen, 'all' also claimed
--     and released, 'none' nothing. Renewals, idempotent re-claims and busy claims
--     never record anything. lease_history reads it; lease_prune_history (not
--     executable by PUBLIC) deletes old events.
-- depends: pylease-0002-safety

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
        RAISE EXCEPTION 'pylease 0003: lease_status gains the columns state and ttl, so it is created again; drop the views on it first (%), then create them again after migrating', views
            USING ERRCODE = '2BP01';
    END IF;
END
$views$;

-- The grants of lease_status, to give back to the function created again (in a
-- setting of this session, reset at the end: a temporary table would need TEMP).
SELECT set_config('pylease.status_acl', coalesce(p.proacl::text, ''), false)
  FROM pg_proc AS p WHERE p.oid = 'lease_status(text)'::regprocedure;

-- Tables ----------------------------------------------------------------------

ALTER TABLE pylease_leases
    ADD COLUMN grants    bigint NOT NULL DEFAULT 0,
    ADD COLUMN takeovers bigint NOT NULL DEFAULT 0,
    ADD COLUMN steals    bigint NOT NULL DEFAULT 0,
    ADD COLUMN releases  bigint NOT NULL DEFAULT 0;

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
    history   text;
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
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, grants)
            VALUES (lease_claim.name, lease_claim.holder,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                    lease_claim.ttl, t_now, t_now, t_now + lease_claim.ttl, 1)
            ON CONFLICT (name) DO NOTHING
            RETURNING l.fence INTO granted;
            IF FOUND THEN
                history := current_setting('pylease.history', true);
                IF history = 'all' THEN
                    INSERT INTO pylease_events (at, name, event, holder, fence)
                    VALUES (t_now, lease_claim.name, 'claimed', lease_claim.holder, granted);
                ELSIF history NOT IN ('', 'rare', 'none') THEN
                    PERFORM pylease_refuse_history(history);
                END IF;
            END IF;
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
            IF FOUND THEN
                RETURN granted;
            END IF;
        ELSIF s_expires > t_now THEN
            RETURN NULL;
        ELSIF s_fence = 9223372036854775807 THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(lease_claim.name), s_fence USING ERRCODE = '54000';
        ELSE
            -- Free (released, or expired: a takeover). The fence is floored by the
            -- timeline WAL is written on, so a promoted standby never reissues the
            -- old primary's fences.
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
            RETURNING l.fence INTO granted;
            IF FOUND THEN
                history := current_setting('pylease.history', true);
                IF history = 'all' OR (NOT s_freed AND coalesce(history, '') IN ('', 'rare')) THEN
                    INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
                    VALUES (t_now, lease_claim.name,
                            CASE WHEN s_freed THEN 'claimed' ELSE 'taken_over' END,
                            lease_claim.holder, granted, s_holder);
                ELSIF history NOT IN ('', 'rare', 'all', 'none') THEN
                    PERFORM pylease_refuse_history(history);
                END IF;
                RETURN granted;
            END IF;
        END IF;
    END LOOP;
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
    freed    bigint;
    history  text;
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
                             ELSE greatest(t_now, l.acquired_at + lease_release.min_hold) END,
           releases   = l.releases + 1
     WHERE l.name = lease_release.name AND l.holder = lease_release.holder AND NOT l.released
    RETURNING l.expires_at, l.fence INTO freed_at, freed;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    history := current_setting('pylease.history', true);
    IF history = 'all' THEN
        INSERT INTO pylease_events (at, name, event, holder, fence)
        VALUES (t_now, lease_release.name, 'released', lease_release.holder, freed);
    ELSIF history NOT IN ('', 'rare', 'none') THEN
        PERFORM pylease_refuse_history(history);
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
            ON CONFLICT (name) DO NOTHING
            RETURNING l.fence INTO granted;
            kind := 'claimed';
            EXIT;
        END IF;
        IF s_renewed > t_now - lease_steal.older_than AND s_expires > t_now THEN
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
               expires_at  = t_now + lease_steal.ttl,
               released    = false,
               grants      = l.grants + 1,
               takeovers   = l.takeovers + CASE WHEN kind = 'taken_over' THEN 1 ELSE 0 END,
               steals      = l.steals + CASE WHEN kind = 'stolen' THEN 1 ELSE 0 END
         WHERE l.name = lease_steal.name AND l.fence = s_fence AND l.released = s_freed
           AND l.expires_at = s_expires
           AND (l.renewed_at <= t_now - lease_steal.older_than OR l.expires_at <= t_now)
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

DROP FUNCTION lease_status(text);

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

COMMENT ON FUNCTION lease_status(text) IS
    'pylease: one row per lease name (all when name is NULL); held means unexpired and not released; state is held, resting, released or expired.';
COMMENT ON FUNCTION lease_counters(text) IS
    'pylease: per lease name, how many grants, takeovers, steals and releases there were.';
COMMENT ON FUNCTION lease_history(text, timestamptz, integer) IS
    'pylease: recorded events (pylease.history), newest first, since a moment, at most max_rows.';
COMMENT ON FUNCTION lease_prune_history(interval) IS
    'pylease: delete the events older than older_than; returns how many.';

-- Privileges ------------------------------------------------------------------

REVOKE ALL ON TABLE pylease_events FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_history(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_history_rows(text, timestamptz, integer) FROM PUBLIC;
-- Pruning destroys the record: an operator grants it to the roles that may.
REVOKE EXECUTE ON FUNCTION lease_prune_history(interval) FROM PUBLIC;

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
