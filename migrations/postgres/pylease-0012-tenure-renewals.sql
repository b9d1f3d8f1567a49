-- pylease 0012: one body per claim, and renewals that name their tenure (issue 21).
-- Keep sql/postgres/schema.sql in step.
--   * pylease_claim(name, ttl, holder, new_tenure): the one body of lease_claim and
--     lease_claim_new (as were, decision for decision), so that later migrations
--     extend one claim. Likewise pylease_permit_claim and pylease_claim_all.
--     lease_claim, lease_claim_new, permit_claim and lease_claim_all become SQL
--     functions whose bodies are parsed at creation (their calls resolved then, so no
--     search_path can stand in for them); a scalar one is inlined into its caller's
--     statement, so the exclusive claim costs what it did.
--   * permit_claim_new and lease_claim_all_new: as lease_claim_new, a claim with a
--     holder the caller gave never continues a tenure of that holder, for permits and
--     several names too: busy while it is live (another process uses the holder), a
--     new tenure with new fences once it expired (the holder's expired slots that the
--     new grant does not take again are freed with it).
--   * Renewals that name their tenure: lease_renew(name, holder, ttl, fence),
--     lease_renew_many(names, holders, ttl, fences) and the keeper's
--     pylease_renew_held(kinds, names, holders, ttls, fences, slots) renew only the
--     tenure the fence names (a permit's: the slot it holds with that fence), so a
--     late renewal of an earlier tenure of the same holder renews nothing. A NULL
--     fence renews whatever tenure the holder has; the signatures of 0001-0009 stay,
--     as calls of these with NULL fences.
-- depends: pylease-0011-groups

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

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
CREATE FUNCTION pylease_claim(name text, ttl interval, holder text, new_tenure boolean)
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
                VALUES (t_now, pylease_claim.name,
                        CASE WHEN s_freed THEN 'claimed' ELSE 'taken_over' END,
                        pylease_claim.holder, granted, s_holder);
                RETURN granted;
            END IF;
        END IF;
    END LOOP;
END
$$;

-- Claim a lease: the fence when granted, NULL when another holder's unexpired
-- lease stands (pylease_claim, continuing the tenure the row still names for this
-- holder). An SQL function with a body parsed when it is created: it is inlined
-- into the caller's statement (nothing is paid for it at run time), and the
-- function it calls was resolved then, so no search_path can stand in for it.
CREATE OR REPLACE FUNCTION lease_claim(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim.name, lease_claim.ttl, lease_claim.holder, false);

-- Claim a new tenure (pylease_claim): as lease_claim, except that a tenure of the
-- same holder is never continued. Unexpired, it is busy: another process uses this
-- holder (the Python API and the command line claim so with a holder they were
-- given, contract 5.6). Expired, it is taken over with a new fence, so that the
-- earlier tenure's fenced writes (lease_holds with its fence) fail from then on.
CREATE OR REPLACE FUNCTION lease_claim_new(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim_new.name, lease_claim_new.ttl, lease_claim_new.holder, true);

-- Renew the tenure with this fence of a lease this holder still holds, also past its
-- expiry if nobody took it: a late renewal of an earlier tenure (sent before the
-- lease expired and was granted to the same holder again) then changes nothing. A
-- NULL fence renews whatever tenure the holder has, as lease_renew(name, holder,
-- ttl). Never earlier: another renewer's shorter ttl must not cut short what the
-- owner was granted. The fence has no DEFAULT: a call with two or three arguments,
-- positional or named, still means the function below alone.
CREATE FUNCTION lease_renew(name text, holder text, ttl interval, fence bigint) RETURNS boolean
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
     WHERE l.name = lease_renew.name AND l.holder = lease_renew.holder AND NOT l.released
       AND (lease_renew.fence IS NULL OR l.fence = lease_renew.fence);
    RETURN FOUND;
END
$$;

-- Renew a lease this holder still holds, whatever its tenure (the function above
-- with a NULL fence; an SQL function inlined into its caller's statement).
CREATE OR REPLACE FUNCTION lease_renew(name text, holder text, ttl interval DEFAULT NULL)
RETURNS boolean
LANGUAGE sql
RETURN lease_renew(lease_renew.name, lease_renew.holder, lease_renew.ttl, NULL::bigint);

-- Renew many leases in one statement: one row per element of names, in order; each
-- only in the tenure fences[i] names (a NULL array or element: whatever tenure the
-- holder has). The elements are checked inside the statement (a bad one aborts it,
-- so nothing changes), and only a failing test calls the check that names it.
CREATE FUNCTION lease_renew_many(names text[], holders text[], ttl interval, fences bigint[])
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
    IF cardinality(lease_renew_many.fences) <> cardinality(lease_renew_many.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
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
    )
    SELECT w.n, r.name IS NOT NULL
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h AND (w.f IS NULL OR r.fence = w.f)
     ORDER BY w.i;
END
$$;

-- Renew many leases in one statement, whatever their tenures (the function above
-- with NULL fences).
CREATE OR REPLACE FUNCTION lease_renew_many(names text[], holders text[], ttl interval DEFAULT NULL)
RETURNS TABLE(name text, renewed boolean)
LANGUAGE sql
BEGIN ATOMIC
    SELECT m.name, m.renewed
      FROM lease_renew_many(lease_renew_many.names, lease_renew_many.holders,
                            lease_renew_many.ttl, NULL::bigint[]) AS m;
END;

-- The keeper's renewal of everything a process holds, whatever its kind, in one
-- statement, each element only in the tenure the keeper knows: per element, in order,
-- whether it was renewed, the expiry granted and the server's clock when it was
-- (NULLs when not). kinds[i] says what element i is: 'lease' renews the lease
-- names[i] of holders[i] while its fence is fences[i]; 'permit' renews every slot of
-- the semaphore names[i] that holders[i] holds, all or nothing as permit_renew does,
-- while it holds slot slots[i] with fence fences[i], and answers the earliest expiry
-- of its slots. A NULL fences or slots (array or element) matches any tenure of the
-- holder. So a late renewal of an earlier tenure (sent before it expired and was
-- granted to the same holder again) renews nothing. Each at its own ttl (NULL: its
-- last one). One element's loss or kind mismatch (a lease element of a semaphore's
-- name) is that element's false, never an error of the others. Lease rows are locked
-- in name order, then slots in (name, slot) order, as by every statement that locks
-- several: two keepers of overlapping sets never deadlock. Internal: the keeper's, not
-- part of the contract.
CREATE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[], ttls interval[],
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
                   WHERE v IS NULL OR v NOT IN ('lease', 'permit'))
    THEN
        RAISE EXCEPTION 'pylease: kinds must hold ''lease'' or ''permit'' for each element of names'
            USING ERRCODE = '22023', COLUMN = 'kinds';
    END IF;
    IF cardinality(pylease_renew_held.fences) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
    ELSIF cardinality(pylease_renew_held.slots) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: slots must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'slots';
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
                ) AS x ON x.i = u.i
     ORDER BY u.i;
END
$$;

-- The keeper's renewal of 0009, whatever the tenures (the function above with NULL
-- fences and slots): a keeper of an earlier pylease still calls it.
CREATE OR REPLACE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[],
                                              ttls interval[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE sql
BEGIN ATOMIC
    SELECT h.name, h.renewed, h.expires_at, h.server_time
      FROM pylease_renew_held(pylease_renew_held.kinds, pylease_renew_held.names,
                              pylease_renew_held.holders, pylease_renew_held.ttls,
                              NULL::bigint[], NULL::integer[]) AS h;
END;

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
CREATE FUNCTION pylease_permit_claim(name text, max_permits integer, ttl interval, holder text,
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
    worn    integer;
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
        SELECT n.kind, n.max_permits INTO s_kind, s_max
          FROM pylease_names AS n WHERE n.name = pylease_permit_claim.name;
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

    -- Still this holder's: a retried claim whose reply was lost gets its slots again;
    -- a new tenure is busy while any of them is unexpired.
    SELECT count(*), count(*) FILTER (WHERE p.expires_at > t_now),
           count(*) = min(p.permits) AND count(*) = max(p.permits)
      INTO mine, live, whole
      FROM pylease_permits AS p
     WHERE p.name = pylease_permit_claim.name AND p.holder = pylease_permit_claim.holder
       AND NOT p.released;
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

    -- Busy: fewer than permits slots free. Reads only.
    IF (SELECT count(*) FROM pylease_permits AS p
         WHERE p.name = pylease_permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
           AND NOT EXISTS (SELECT FROM pylease_permits AS q
                            WHERE q.name = pylease_permit_claim.name AND q.slot >= s_max
                              AND q.slot % s_max = p.slot AND q.expires_at > t_now)
       ) < pylease_permit_claim.permits THEN
        RETURN;
    END IF;

    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    start := ((hashtext(pylease_permit_claim.holder) % s_max) + s_max) % s_max;
    BEGIN
        SELECT array_agg(c.slot) INTO taken FROM (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = pylease_permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
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
        SELECT min(p.slot) INTO worn FROM pylease_permits AS p
         WHERE p.name = pylease_permit_claim.name AND p.slot = ANY (taken)
           AND p.fence = 9223372036854775807;
        IF worn IS NOT NULL THEN
            RAISE EXCEPTION 'pylease: semaphore % has used every fence of slot %: it cannot be granted again',
                quote_literal(pylease_permit_claim.name), worn USING ERRCODE = '54000';
        END IF;
        IF mine > 0 THEN
            -- A new tenure: the holder's expired slots not taken again end with the
            -- earlier one (a slot another transaction keeps locked past lock_timeout,
            -- a renewal or release of the earlier one, makes the claim busy).
            UPDATE pylease_permits AS p SET released = true
             WHERE p.name = pylease_permit_claim.name AND p.holder = pylease_permit_claim.holder
               AND NOT p.released AND p.slot <> ALL (taken);
        END IF;
        -- A fence floored by the timeline, as a lease's. The next grant of a slot freed
        -- by permit_revoke from an unexpired holder is a steal.
        RETURN QUERY
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
        ), recorded AS (
            INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder, slot)
            SELECT t_now, pylease_permit_claim.name, g.event, pylease_permit_claim.holder, g.fence,
                   g.previous, g.slot
              FROM granted AS g
             WHERE history = 'all' OR (coalesce(history, '') IN ('', 'rare') AND g.event <> 'claimed')
        )
        SELECT g.slot, g.fence FROM granted AS g ORDER BY g.slot;
    EXCEPTION WHEN SQLSTATE 'PLBSY' OR lock_not_available OR deadlock_detected THEN
        RETURN;
    END;
END
$$;

-- Claim permits slots of a semaphore (pylease_permit_claim, continuing the slots the
-- holder still holds): an SQL function whose body was parsed when it was created,
-- so no search_path can stand in for the function it calls.
CREATE OR REPLACE FUNCTION permit_claim(name text, max_permits integer, ttl interval,
                                        holder text, permits integer DEFAULT 1)
RETURNS TABLE(slot integer, fence bigint)
LANGUAGE sql
BEGIN ATOMIC
    SELECT c.slot, c.fence
      FROM pylease_permit_claim(permit_claim.name, permit_claim.max_permits, permit_claim.ttl,
                                permit_claim.holder, permit_claim.permits, false) AS c;
END;

-- Claim a new tenure of permits slots (pylease_permit_claim): as permit_claim, except
-- that a holder's slots are never continued: busy while one of them is unexpired
-- (another process uses this holder); expired, they end with the new grant.
CREATE FUNCTION permit_claim_new(name text, max_permits integer, ttl interval, holder text,
                                 permits integer DEFAULT 1)
RETURNS TABLE(slot integer, fence bigint)
LANGUAGE sql
BEGIN ATOMIC
    SELECT c.slot, c.fence
      FROM pylease_permit_claim(permit_claim_new.name, permit_claim_new.max_permits,
                                permit_claim_new.ttl, permit_claim_new.holder,
                                permit_claim_new.permits, true) AS c;
END;

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
CREATE FUNCTION pylease_claim_all(names text[], ttl interval, holder text, new_tenure boolean)
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
                       OR l.holder <> pylease_claim_all.holder)) THEN
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
                           OR l.holder <> pylease_claim_all.holder)) THEN
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

-- Claim every lease of names, all or nothing (pylease_claim_all, extending the names
-- this holder still holds): an SQL function whose body was parsed when it was
-- created, so no search_path can stand in for the function it calls.
CREATE OR REPLACE FUNCTION lease_claim_all(names text[], ttl interval, holder text)
RETURNS TABLE(name text, fence bigint)
LANGUAGE sql
BEGIN ATOMIC
    SELECT c.name, c.fence
      FROM pylease_claim_all(lease_claim_all.names, lease_claim_all.ttl, lease_claim_all.holder,
                             false) AS c;
END;

-- Claim a new tenure of every lease of names, all or nothing (pylease_claim_all): as
-- lease_claim_all, except that no tenure of this holder is continued: busy while it
-- holds one of them unexpired, an expired one taken over with a new fence.
CREATE FUNCTION lease_claim_all_new(names text[], ttl interval, holder text)
RETURNS TABLE(name text, fence bigint)
LANGUAGE sql
BEGIN ATOMIC
    SELECT c.name, c.fence
      FROM pylease_claim_all(lease_claim_all_new.names, lease_claim_all_new.ttl,
                             lease_claim_all_new.holder, true) AS c;
END;

COMMENT ON FUNCTION pylease_claim(text, interval, text, boolean) IS
    'pylease (internal): the one body of lease_claim (new_tenure false) and lease_claim_new (true).';
COMMENT ON FUNCTION lease_renew(text, text, interval, bigint) IS
    'pylease: extend the tenure with this fence (NULL: any) of a lease this holder still holds; false once lost.';
COMMENT ON FUNCTION lease_renew_many(text[], text[], interval, bigint[]) IS
    'pylease: renew many leases in one statement, each in the tenure its fence names (NULL: any); one (name, renewed) row per element, in order.';
COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[], bigint[], integer[]) IS
    'pylease (internal, the keeper''s): renew leases and permits of several holders in one statement, each at its own ttl and in the tenure its fence names.';
COMMENT ON FUNCTION pylease_permit_claim(text, integer, interval, text, integer, boolean) IS
    'pylease (internal): the one body of permit_claim (new_tenure false) and permit_claim_new (true).';
COMMENT ON FUNCTION permit_claim_new(text, integer, interval, text, integer) IS
    'pylease: claim a new tenure of permits slots of a semaphore; no row while this holder''s own slots are live.';
COMMENT ON FUNCTION pylease_claim_all(text[], interval, text, boolean) IS
    'pylease (internal): the one body of lease_claim_all (new_tenure false) and lease_claim_all_new (true).';
COMMENT ON FUNCTION lease_claim_all_new(text[], interval, text) IS
    'pylease: claim a new tenure of every lease of names, all or nothing; no row while any is live, this holder''s own included.';
