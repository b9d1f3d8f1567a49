-- Undo pylease 0003: the 0002 definitions of claim, release and steal, the 0001
-- lease_status (its grants kept), and no counters or history (both are lost).

DO $pin$
BEGIN
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
        RAISE EXCEPTION 'pylease 0003 rollback: lease_status loses the columns state and ttl, so it is created again; drop the views on it first (%), then create them again after the rollback', views
            USING ERRCODE = '2BP01';
    END IF;
END
$views$;

SELECT set_config('pylease.status_acl', coalesce(p.proacl::text, ''), false)
  FROM pg_proc AS p WHERE p.oid = 'lease_status(text)'::regprocedure;

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

DROP FUNCTION lease_prune_history(interval);
DROP FUNCTION lease_history(text, timestamptz, integer);
DROP FUNCTION pylease_history_rows(text, timestamptz, integer);
DROP FUNCTION lease_counters(text);
DROP FUNCTION pylease_refuse_history(text);
DROP FUNCTION lease_status(text);

-- One row per name ever claimed (all names when name is NULL); held means
-- unexpired and not released. SQL, not PL/pgSQL: only SQL lets the argument
-- and the output column share the name "name".
CREATE FUNCTION lease_status(name text DEFAULT NULL)
RETURNS TABLE(name text, holder text, fence bigint, acquired_at timestamptz,
              renewed_at timestamptz, expires_at timestamptz, held boolean)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT l.name, l.holder, l.fence, l.acquired_at, l.renewed_at, l.expires_at,
           NOT l.released AND l.expires_at > clock_timestamp()
      FROM pylease_leases AS l
     WHERE $1 IS NULL OR l.name = $1
     ORDER BY l.name;
$$;

COMMENT ON FUNCTION lease_status(text) IS
    'pylease: one row per lease name (all when name is NULL); held means unexpired and not released.';

DROP TABLE pylease_events;
ALTER TABLE pylease_leases
    DROP COLUMN grants,
    DROP COLUMN takeovers,
    DROP COLUMN steals,
    DROP COLUMN releases;

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
