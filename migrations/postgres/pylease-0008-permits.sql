-- pylease 0008: permits and several names in one claim (contract revision 3,
-- sections 5.1 and 5.3; issue 24). Keep sql/postgres/schema.sql in step.
--   * pylease_names: the kind of every name granted (a lease or a semaphore), set by
--     its first grant, and a semaphore's limit. A new lease row registers its name
--     through a trigger, so no released function changes for it.
--   * pylease_permits: one row per slot of a semaphore, each with its own fence and
--     counters; permit_claim, permit_renew, permit_release, permit_holds,
--     permit_status, permit_set_max and permit_revoke.
--   * lease_claim_all and lease_release_all: several lease names in one statement.
--   * pylease_events gains slot (NULL for leases), so lease_history gains a trailing
--     column slot; lease_counters sums a semaphore's slots.
-- depends: pylease-0006-tenures

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Tables ----------------------------------------------------------------------

-- One row per name ever granted: its kind, and a semaphore's limit. A name keeps
-- the kind of its first grant; a claim of the other kind raises 22023.
CREATE TABLE pylease_names (
    name        text    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    kind        text    NOT NULL CHECK (kind IN ('lease', 'semaphore')),
    max_permits integer CHECK (max_permits BETWEEN 1 AND 10000),
    CHECK ((kind = 'semaphore') = (max_permits IS NOT NULL))
);

COMMENT ON TABLE pylease_names IS
    'pylease: the kind of every name granted (lease or semaphore) and a semaphore''s limit; written only through the lease_* and permit_* functions.';

INSERT INTO pylease_names (name, kind) SELECT l.name, 'lease' FROM pylease_leases AS l;

-- One row per slot of a semaphore, 0 to the highest limit it ever had, made when the
-- limit is (so that a claim never inserts a slot, and never waits for another
-- claimer's insert). A slot never granted has fence 0 and no holder. permits is
-- how many slots its holder was granted together: a holder whose slots number
-- fewer lost one. As for leases, the fence is a key column (pylease_permits_fence),
-- so permit_holds' FOR KEY SHARE conflicts with every grant and with nothing else.
CREATE TABLE pylease_permits (
    name        text        NOT NULL,
    slot        integer     NOT NULL CHECK (slot BETWEEN 0 AND 9999),
    holder      text        CHECK (length(holder) BETWEEN 1 AND 200),
    fence       bigint      NOT NULL DEFAULT 0 CHECK (fence >= 0),
    permits     integer     NOT NULL DEFAULT 0,
    ttl         interval,
    acquired_at timestamptz,
    renewed_at  timestamptz,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    released    boolean     NOT NULL DEFAULT false,
    -- Freed by permit_revoke from an unexpired holder: its next grant is a steal.
    revoked     boolean     NOT NULL DEFAULT false,
    grants      bigint      NOT NULL DEFAULT 0,
    takeovers   bigint      NOT NULL DEFAULT 0,
    steals      bigint      NOT NULL DEFAULT 0,
    releases    bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (name, slot)
) WITH (fillfactor = 50);
CREATE UNIQUE INDEX pylease_permits_fence ON pylease_permits (name, slot, fence);
CREATE INDEX pylease_permits_holder ON pylease_permits (name, holder);

COMMENT ON TABLE pylease_permits IS
    'pylease: one row per slot of a semaphore; written only through the permit_* functions.';

ALTER TABLE pylease_events ADD COLUMN slot integer;

-- Checks ----------------------------------------------------------------------

-- Raises 22023 unless a count (max_permits, permits) is from 1 to most; most_name
-- names the bound in the message.
CREATE FUNCTION pylease_check_count(parameter text, value integer, most integer, most_name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value < 1 THEN
        RAISE EXCEPTION 'pylease: % must be at least 1', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value > most THEN
        RAISE EXCEPTION 'pylease: % must be at most %', parameter, most_name
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- Raises 22023 unless names holds 1 to 1000 distinct valid names.
CREATE FUNCTION pylease_check_names(parameter text, names text[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF names IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF cardinality(names) = 0 THEN
        RAISE EXCEPTION 'pylease: % must not be empty', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF cardinality(names) > 1000 THEN
        RAISE EXCEPTION 'pylease: % must hold at most 1000 names', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF EXISTS (SELECT FROM unnest(names) AS u(v) WHERE v IS NULL OR v = '' OR length(v) > 200) THEN
        RAISE EXCEPTION 'pylease: % must hold only non-empty texts of at most 200 characters', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF (SELECT count(DISTINCT v) FROM unnest(names) AS u(v)) <> cardinality(names) THEN
        RAISE EXCEPTION 'pylease: % must not hold a name twice', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- A new lease row registers its name as a lease, or finds it a semaphore and
-- raises. The insert into pylease_names waits for another transaction's insert of
-- the same name, so a first lease grant and a first permit grant of one name never
-- both commit.
CREATE FUNCTION pylease_register_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO pylease_names AS n (name, kind) VALUES (NEW.name, 'lease')
    ON CONFLICT (name) DO NOTHING;
    IF NOT FOUND AND EXISTS (SELECT FROM pylease_names AS n
                              WHERE n.name = NEW.name AND n.kind <> 'lease') THEN
        RAISE EXCEPTION 'pylease: name is a semaphore, not a lease'
            USING ERRCODE = '22023', COLUMN = 'name';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER pylease_leases_register BEFORE INSERT ON pylease_leases
    FOR EACH ROW EXECUTE FUNCTION pylease_register_lease();

-- Permits ---------------------------------------------------------------------

-- Claim permits slots of a semaphore of max_permits: one (slot, fence) row per slot
-- when granted, no row when fewer are free. The name's first claim makes it a
-- semaphore with this limit; another limit raises 22023. A holder that still holds
-- its slots gets them again, extended (never earlier). A busy claim is answered by
-- reads alone (no row lock, no WAL). A grant takes free slots starting where a hash
-- of the holder points and skips slots another transaction has locked (a claimer, a
-- holder's fenced transaction), so claimers spread over the free slots instead of
-- queueing for one; it never waits for a row, so it cannot deadlock. A slot above a
-- lowered limit keeps the slot below it that it maps onto (slot % limit) busy
-- until it is free: the held slots drain down to the new limit.
CREATE FUNCTION permit_claim(name text, max_permits integer, ttl interval, holder text,
                             permits integer DEFAULT 1)
RETURNS TABLE(slot integer, fence bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    s_kind  text;
    s_max   integer;
    mine    integer;
    whole   boolean;
    start   integer;
    taken   integer[];
    worn    integer;
    history text;
BEGIN
    IF permit_claim.name IS NULL OR permit_claim.name = '' OR length(permit_claim.name) > 200
       OR permit_claim.max_permits IS NULL OR permit_claim.max_permits < 1
       OR permit_claim.max_permits > 10000
       OR permit_claim.ttl IS NULL OR NOT isfinite(permit_claim.ttl)
       OR permit_claim.ttl <= interval '0' OR permit_claim.ttl > interval '366 days'
       OR permit_claim.holder IS NULL OR permit_claim.holder = '' OR length(permit_claim.holder) > 200
       OR permit_claim.permits IS NULL OR permit_claim.permits < 1
       OR permit_claim.permits > permit_claim.max_permits
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', permit_claim.name);
        PERFORM pylease_check_count('max_permits', permit_claim.max_permits, 10000, '10000');
        PERFORM pylease_check_ttl('ttl', permit_claim.ttl);
        PERFORM pylease_check_key('holder', permit_claim.holder);
        PERFORM pylease_check_count('permits', permit_claim.permits, permit_claim.max_permits,
                                    'max_permits');
        PERFORM pylease_refuse_standby('permit_claim');
    END IF;

    LOOP
        SELECT n.kind, n.max_permits INTO s_kind, s_max
          FROM pylease_names AS n WHERE n.name = permit_claim.name;
        EXIT WHEN FOUND;
        -- The first claim: the name becomes a semaphore, with a row per slot. A
        -- conflict means another first claim (of either kind) committed it first.
        INSERT INTO pylease_names AS n (name, kind, max_permits)
        VALUES (permit_claim.name, 'semaphore', permit_claim.max_permits)
        ON CONFLICT (name) DO NOTHING;
        IF FOUND THEN
            INSERT INTO pylease_permits AS p (name, slot)
            SELECT permit_claim.name, s.i FROM generate_series(0, permit_claim.max_permits - 1) AS s(i);
        END IF;
    END LOOP;
    IF s_kind <> 'semaphore' THEN
        RAISE EXCEPTION 'pylease: name is a lease, not a semaphore'
            USING ERRCODE = '22023', COLUMN = 'name';
    ELSIF s_max <> permit_claim.max_permits THEN
        RAISE EXCEPTION 'pylease: max_permits % differs from the limit % of this semaphore',
            permit_claim.max_permits, s_max USING ERRCODE = '22023', COLUMN = 'max_permits';
    END IF;

    -- Still this holder's: a retried claim whose reply was lost gets its slots again.
    SELECT count(*), count(*) = min(p.permits) AND count(*) = max(p.permits)
      INTO mine, whole
      FROM pylease_permits AS p
     WHERE p.name = permit_claim.name AND p.holder = permit_claim.holder AND NOT p.released;
    IF mine > 0 THEN
        IF mine <> permit_claim.permits OR NOT whole THEN
            RAISE EXCEPTION 'pylease: permits must be as many as this holder already holds of this semaphore (release them first)'
                USING ERRCODE = '22023', COLUMN = 'permits';
        END IF;
        -- Locked in slot order, as by every statement that locks several slots; a slot
        -- taken meanwhile drops out, and then nothing is extended.
        RETURN QUERY
        WITH locked AS (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = permit_claim.name AND p.holder = permit_claim.holder AND NOT p.released
             ORDER BY p.slot
               FOR NO KEY UPDATE OF p
        ), extended AS (
            UPDATE pylease_permits AS p
               SET ttl        = permit_claim.ttl,
                   renewed_at = t_now,
                   expires_at = greatest(p.expires_at, t_now + permit_claim.ttl)
              FROM locked AS k
             WHERE p.name = permit_claim.name AND p.slot = k.slot
               AND (SELECT count(*) FROM locked) = permit_claim.permits
            RETURNING p.slot, p.fence
        )
        SELECT e.slot, e.fence FROM extended AS e ORDER BY e.slot;
        RETURN;
    END IF;

    -- Busy: fewer than permits slots free. Reads only.
    IF (SELECT count(*) FROM pylease_permits AS p
         WHERE p.name = permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
           AND NOT EXISTS (SELECT FROM pylease_permits AS q
                            WHERE q.name = permit_claim.name AND q.slot >= s_max
                              AND q.slot % s_max = p.slot AND q.expires_at > t_now)
       ) < permit_claim.permits THEN
        RETURN;
    END IF;

    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    start := ((hashtext(permit_claim.holder) % s_max) + s_max) % s_max;
    BEGIN
        SELECT array_agg(c.slot) INTO taken FROM (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
               AND NOT EXISTS (SELECT FROM pylease_permits AS q
                                WHERE q.name = permit_claim.name AND q.slot >= s_max
                                  AND q.slot % s_max = p.slot AND q.expires_at > t_now)
             ORDER BY (p.slot - start + s_max) % s_max
             LIMIT permit_claim.permits
               FOR UPDATE OF p SKIP LOCKED) AS c;
        IF coalesce(cardinality(taken), 0) < permit_claim.permits THEN
            -- Other claimers took the slots meanwhile: give back the ones locked here.
            RAISE EXCEPTION USING ERRCODE = 'PLBSY';
        END IF;
        SELECT min(p.slot) INTO worn FROM pylease_permits AS p
         WHERE p.name = permit_claim.name AND p.slot = ANY (taken)
           AND p.fence = 9223372036854775807;
        IF worn IS NOT NULL THEN
            RAISE EXCEPTION 'pylease: semaphore % has used every fence of slot %: it cannot be granted again',
                quote_literal(permit_claim.name), worn USING ERRCODE = '54000';
        END IF;
        -- A fence floored by the timeline, as a lease's. The next grant of a slot freed
        -- by permit_revoke from an unexpired holder is a steal.
        RETURN QUERY
        WITH old AS (
            SELECT p.slot, p.holder, p.fence, p.released, p.revoked FROM pylease_permits AS p
             WHERE p.name = permit_claim.name AND p.slot = ANY (taken)
        ), granted AS (
            UPDATE pylease_permits AS p
               SET fence       = greatest(p.fence + 1,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                   holder      = permit_claim.holder,
                   permits     = permit_claim.permits,
                   ttl         = permit_claim.ttl,
                   acquired_at = t_now,
                   renewed_at  = t_now,
                   expires_at  = t_now + permit_claim.ttl,
                   released    = false,
                   revoked     = false,
                   grants      = p.grants + 1,
                   takeovers   = p.takeovers + CASE WHEN o.fence > 0 AND NOT o.released THEN 1 ELSE 0 END,
                   steals      = p.steals + CASE WHEN o.revoked THEN 1 ELSE 0 END
              FROM old AS o
             WHERE p.name = permit_claim.name AND p.slot = o.slot
            RETURNING p.slot, p.fence,
                      CASE WHEN o.revoked THEN 'stolen' WHEN o.fence = 0 OR o.released THEN 'claimed'
                           ELSE 'taken_over' END AS event,
                      CASE WHEN o.fence > 0 THEN o.holder END AS previous
        ), recorded AS (
            INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder, slot)
            SELECT t_now, permit_claim.name, g.event, permit_claim.holder, g.fence, g.previous, g.slot
              FROM granted AS g
             WHERE history = 'all' OR (coalesce(history, '') IN ('', 'rare') AND g.event <> 'claimed')
        )
        SELECT g.slot, g.fence FROM granted AS g ORDER BY g.slot;
    EXCEPTION WHEN SQLSTATE 'PLBSY' THEN
        RETURN;
    END;
END
$$;

-- Renew every slot this holder holds, all or nothing: true when each is still its
-- own (also past its expiry, if nobody took it) and then each is extended, never
-- earlier; false changes nothing.
CREATE FUNCTION permit_renew(name text, holder text, ttl interval DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    renewed bigint;
BEGIN
    IF permit_renew.name IS NULL OR permit_renew.name = '' OR length(permit_renew.name) > 200
       OR permit_renew.holder IS NULL OR permit_renew.holder = '' OR length(permit_renew.holder) > 200
       OR NOT isfinite(permit_renew.ttl)
       OR permit_renew.ttl <= interval '0' OR permit_renew.ttl > interval '366 days'
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', permit_renew.name);
        PERFORM pylease_check_key('holder', permit_renew.holder);
        IF permit_renew.ttl IS NOT NULL THEN
            PERFORM pylease_check_ttl('ttl', permit_renew.ttl);
        END IF;
        PERFORM pylease_refuse_standby('permit_renew');
    END IF;

    -- FOR NO KEY UPDATE passes the FOR KEY SHARE of a holder's fenced transaction.
    WITH locked AS (
        SELECT p.slot, p.permits FROM pylease_permits AS p
         WHERE p.name = permit_renew.name AND p.holder = permit_renew.holder AND NOT p.released
         ORDER BY p.slot
           FOR NO KEY UPDATE OF p
    ), whole AS (
        SELECT count(*) = min(k.permits) AND count(*) = max(k.permits) AS ok FROM locked AS k
    ), extended AS (
        UPDATE pylease_permits AS p
           SET ttl        = coalesce(permit_renew.ttl, p.ttl),
               renewed_at = t_now,
               expires_at = greatest(p.expires_at, t_now + coalesce(permit_renew.ttl, p.ttl))
          FROM locked AS k, whole AS w
         WHERE p.name = permit_renew.name AND p.slot = k.slot AND w.ok
        RETURNING p.slot
    )
    SELECT count(*) INTO renewed FROM extended;
    RETURN renewed > 0;
END
$$;

-- Give back every slot this holder holds: true when they were all still its own.
-- The ones still its own are freed either way. NOTIFY pylease when any was freed.
-- Without the WAL flush when the release is the first write of its transaction,
-- as lease_release.
CREATE FUNCTION permit_release(name text, holder text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   bigint;
    whole   boolean;
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
        SELECT p.slot, p.permits FROM pylease_permits AS p
         WHERE p.name = permit_release.name AND p.holder = permit_release.holder AND NOT p.released
         ORDER BY p.slot
           FOR NO KEY UPDATE OF p
    ), given AS (
        UPDATE pylease_permits AS p
           SET released   = true,
               expires_at = t_now,
               releases   = p.releases + 1
          FROM locked AS k
         WHERE p.name = permit_release.name AND p.slot = k.slot
        RETURNING p.slot, p.fence
    ), recorded AS (
        INSERT INTO pylease_events (at, name, event, holder, fence, slot)
        SELECT t_now, permit_release.name, 'released', permit_release.holder, g.fence, g.slot
          FROM given AS g
         WHERE history = 'all'
    )
    SELECT count(*), count(*) = min(k.permits) AND count(*) = max(k.permits)
      INTO freed, whole FROM locked AS k;
    IF freed = 0 THEN
        RETURN false;
    END IF;
    ignored := pg_notify('pylease', permit_release.name);
    RETURN whole;
END
$$;

-- True iff this holder holds an unexpired slot with this fence. Locks it FOR KEY
-- SHARE: every grant changes the fence, a key column, so a fenced write in the
-- caller's transaction and any grant of the slot are serialized (a claimer skips
-- the slot meanwhile), while renewals and releases never wait for it.
CREATE FUNCTION permit_holds(name text, holder text, fence bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    IF permit_holds.name IS NULL OR permit_holds.name = '' OR length(permit_holds.name) > 200
       OR permit_holds.holder IS NULL OR permit_holds.holder = '' OR length(permit_holds.holder) > 200
       OR permit_holds.fence IS NULL
    THEN
        PERFORM pylease_check_key('name', permit_holds.name);
        PERFORM pylease_check_key('holder', permit_holds.holder);
        RAISE EXCEPTION 'pylease: fence must not be NULL' USING ERRCODE = '22023', COLUMN = 'fence';
    END IF;

    PERFORM FROM pylease_permits AS p
      WHERE p.name = permit_holds.name AND p.holder = permit_holds.holder
        AND p.fence = permit_holds.fence AND NOT p.released
        AND p.expires_at > clock_timestamp()
      ORDER BY p.slot
        FOR KEY SHARE;
    RETURN FOUND;
END
$$;

-- One row per slot ever granted, of one semaphore or all, ordered by name and slot;
-- held means unexpired and not released; state is held, released or expired.
CREATE FUNCTION permit_status(name text DEFAULT NULL)
RETURNS TABLE(name text, max_permits integer, slot integer, holder text, fence bigint,
              acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz,
              held boolean, state text, ttl interval)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT p.name, n.max_permits, p.slot, p.holder, p.fence, p.acquired_at, p.renewed_at,
           p.expires_at, NOT p.released AND p.expires_at > c.now,
           CASE WHEN p.released THEN 'released' WHEN p.expires_at > c.now THEN 'held'
                ELSE 'expired' END,
           p.ttl
      FROM pylease_permits AS p
      JOIN pylease_names AS n ON n.name = p.name,
           (SELECT clock_timestamp() AS now) AS c
     WHERE ($1 IS NULL OR p.name = $1) AND p.fence > 0
     ORDER BY p.name, p.slot;
$$;

-- Change a semaphore's limit, for the claims that start after this commits. Slots
-- above a lowered limit are not granted again and drain as their holders leave; a
-- raised limit gets its new slots, and waiters are woken.
CREATE FUNCTION permit_set_max(name text, max_permits integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    s_kind text;
    s_max  integer;
BEGIN
    PERFORM pylease_check_key('name', permit_set_max.name);
    PERFORM pylease_check_count('max_permits', permit_set_max.max_permits, 10000, '10000');
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('permit_set_max');
    END IF;

    SELECT n.kind, n.max_permits INTO s_kind, s_max
      FROM pylease_names AS n WHERE n.name = permit_set_max.name
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pylease: name is not a semaphore: no permit of it was ever claimed'
            USING ERRCODE = '22023', COLUMN = 'name';
    ELSIF s_kind <> 'semaphore' THEN
        RAISE EXCEPTION 'pylease: name is a lease, not a semaphore'
            USING ERRCODE = '22023', COLUMN = 'name';
    END IF;
    UPDATE pylease_names AS n SET max_permits = permit_set_max.max_permits
     WHERE n.name = permit_set_max.name;
    INSERT INTO pylease_permits AS p (name, slot)
    SELECT permit_set_max.name, s.i FROM generate_series(0, permit_set_max.max_permits - 1) AS s(i)
    ON CONFLICT DO NOTHING;
    IF permit_set_max.max_permits > s_max THEN
        PERFORM pg_notify('pylease', permit_set_max.name);
    END IF;
END
$$;

-- An operator's break-lock: free every slot this holder holds; true if it held any.
-- The next grant of a slot freed from an unexpired holder counts and records a steal
-- (previous_holder: the holder revoked).
CREATE FUNCTION permit_revoke(name text, holder text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
    freed bigint;
BEGIN
    PERFORM pylease_check_key('name', permit_revoke.name);
    PERFORM pylease_check_key('holder', permit_revoke.holder);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('permit_revoke');
    END IF;

    WITH locked AS (
        SELECT p.slot FROM pylease_permits AS p
         WHERE p.name = permit_revoke.name AND p.holder = permit_revoke.holder AND NOT p.released
         ORDER BY p.slot
           FOR NO KEY UPDATE OF p
    ), freed AS (
        UPDATE pylease_permits AS p
           SET released   = true,
               revoked    = p.expires_at > t_now,
               expires_at = t_now
          FROM locked AS k
         WHERE p.name = permit_revoke.name AND p.slot = k.slot
        RETURNING p.slot
    )
    SELECT count(*) INTO freed FROM freed;
    IF freed > 0 THEN
        PERFORM pg_notify('pylease', permit_revoke.name);
        RETURN true;
    ELSIF EXISTS (SELECT FROM pylease_names AS n
                   WHERE n.name = permit_revoke.name AND n.kind = 'lease') THEN
        RAISE EXCEPTION 'pylease: name is a lease, not a semaphore'
            USING ERRCODE = '22023', COLUMN = 'name';
    END IF;
    RETURN false;
END
$$;

-- Several names at once -------------------------------------------------------

-- Claim every lease of names for holder, all or nothing: one (name, fence) row per
-- name, in the order of names, when all were granted; no row when any is busy.
-- Names this holder still holds are extended with their fences, as by lease_claim.
-- A busy claim is answered by one read (no row lock, no WAL). A grant creates the
-- new names, in name order, then locks every row, in name order, so that two claims
-- of overlapping names never deadlock and no other caller sees a subset granted; a
-- row still locked after lock_timeout (a holder's open fenced transaction) counts
-- as busy, as for lease_claim.
CREATE FUNCTION lease_claim_all(names text[], ttl interval, holder text)
RETURNS TABLE(name text, fence bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now    timestamptz := clock_timestamp();
    created  text[];
    worn     text;
    history  text;
BEGIN
    PERFORM pylease_check_names('names', lease_claim_all.names);
    IF lease_claim_all.ttl IS NULL OR NOT isfinite(lease_claim_all.ttl)
       OR lease_claim_all.ttl <= interval '0' OR lease_claim_all.ttl > interval '366 days'
       OR lease_claim_all.holder IS NULL OR lease_claim_all.holder = ''
       OR length(lease_claim_all.holder) > 200 OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_ttl('ttl', lease_claim_all.ttl);
        PERFORM pylease_check_key('holder', lease_claim_all.holder);
        PERFORM pylease_refuse_standby('lease_claim_all');
    END IF;

    IF EXISTS (SELECT FROM pylease_leases AS l
                WHERE l.name = ANY (lease_claim_all.names) AND l.expires_at > t_now
                  AND (l.released OR l.holder <> lease_claim_all.holder)) THEN
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
            SELECT u.n, lease_claim_all.holder,
                   ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                   lease_claim_all.ttl, t_now, t_now, t_now + lease_claim_all.ttl, 1
              FROM unnest(lease_claim_all.names) AS u(n)
             WHERE NOT EXISTS (SELECT FROM pylease_leases AS x WHERE x.name = u.n)
             ORDER BY u.n
            ON CONFLICT DO NOTHING
            RETURNING l.name, l.fence
        ), recorded AS (
            INSERT INTO pylease_events (at, name, event, holder, fence)
            SELECT t_now, m.name, 'claimed', lease_claim_all.holder, m.fence
              FROM made AS m WHERE history = 'all'
        )
        SELECT coalesce(array_agg(m.name), '{}') INTO created FROM made AS m;

        PERFORM FROM pylease_leases AS l
          WHERE l.name = ANY (lease_claim_all.names)
          ORDER BY l.name
            FOR UPDATE;
        -- Locked: what is read now stays so until this transaction ends.
        IF EXISTS (SELECT FROM pylease_leases AS l
                    WHERE l.name = ANY (lease_claim_all.names) AND l.expires_at > t_now
                      AND (l.released OR l.holder <> lease_claim_all.holder)) THEN
            RAISE EXCEPTION USING ERRCODE = 'PLBSY';
        END IF;
        SELECT min(l.name) INTO worn FROM pylease_leases AS l
         WHERE l.name = ANY (lease_claim_all.names) AND l.fence = 9223372036854775807
           AND (l.released OR l.holder <> lease_claim_all.holder);
        IF worn IS NOT NULL THEN
            RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                quote_literal(worn), 9223372036854775807 USING ERRCODE = '54000';
        END IF;

        WITH old AS (
            SELECT l.name, l.holder, l.released,
                   NOT l.released AND l.holder = lease_claim_all.holder AS own
              FROM pylease_leases AS l
             WHERE l.name = ANY (lease_claim_all.names) AND l.name <> ALL (created)
        ), granted AS (
            UPDATE pylease_leases AS l
               SET fence       = CASE WHEN o.own THEN l.fence ELSE greatest(l.fence + 1,
                    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1) END,
                   acquired_at = CASE WHEN o.own THEN l.acquired_at ELSE t_now END,
                   holder      = lease_claim_all.holder,
                   ttl         = lease_claim_all.ttl,
                   renewed_at  = t_now,
                   expires_at  = CASE WHEN o.own THEN greatest(l.expires_at, t_now + lease_claim_all.ttl)
                                      ELSE t_now + lease_claim_all.ttl END,
                   released    = false,
                   grants      = l.grants + CASE WHEN o.own THEN 0 ELSE 1 END,
                   takeovers   = l.takeovers + CASE WHEN o.own OR o.released THEN 0 ELSE 1 END
              FROM old AS o
             WHERE l.name = o.name
            RETURNING l.name, l.fence, o.own, o.released, o.holder AS previous
        )
        INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
        SELECT t_now, g.name, CASE WHEN g.released THEN 'claimed' ELSE 'taken_over' END,
               lease_claim_all.holder, g.fence, g.previous
          FROM granted AS g
         WHERE NOT g.own
           AND (history = 'all' OR (coalesce(history, '') IN ('', 'rare') AND NOT g.released));
    EXCEPTION WHEN SQLSTATE 'PLBSY' OR lock_not_available OR deadlock_detected THEN
        RETURN;
    END;

    RETURN QUERY
    SELECT u.n, l.fence
      FROM unnest(lease_claim_all.names) WITH ORDINALITY AS u(n, i)
      JOIN pylease_leases AS l ON l.name = u.n
     ORDER BY u.i;
END
$$;

-- Give back every lease of names that this holder still holds: one (name, released)
-- row per name, in the order of names. Rows are locked in name order. NOTIFY pylease
-- for each name freed; without the WAL flush when this is the first write of its
-- transaction, as lease_release.
CREATE FUNCTION lease_release_all(names text[], holder text)
RETURNS TABLE(name text, released boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   text[];
    history text;
    ignored text;
BEGIN
    PERFORM pylease_check_names('names', lease_release_all.names);
    PERFORM pylease_check_key('holder', lease_release_all.holder);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_release_all');
    END IF;
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;
    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;

    t_now := clock_timestamp();
    WITH locked AS (
        SELECT l.name FROM pylease_leases AS l
         WHERE l.name = ANY (lease_release_all.names) AND l.holder = lease_release_all.holder
           AND NOT l.released
         ORDER BY l.name
           FOR NO KEY UPDATE OF l
    ), given AS (
        UPDATE pylease_leases AS l
           SET released   = true,
               expires_at = t_now,
               releases   = l.releases + 1
          FROM locked AS k
         WHERE l.name = k.name
        RETURNING l.name, l.fence
    ), recorded AS (
        INSERT INTO pylease_events (at, name, event, holder, fence)
        SELECT t_now, g.name, 'released', lease_release_all.holder, g.fence
          FROM given AS g WHERE history = 'all'
    )
    SELECT coalesce(array_agg(g.name), '{}') INTO freed FROM given AS g;
    PERFORM pg_notify('pylease', f.n) FROM unnest(freed) AS f(n);

    RETURN QUERY
    SELECT u.n, u.n = ANY (freed)
      FROM unnest(lease_release_all.names) WITH ORDINALITY AS u(n, i)
     ORDER BY u.i;
END
$$;

-- Counters and history cover semaphores ------------------------------------------

-- Per name, how many grants (every new tenure), takeovers (after an expiry
-- without a release), steals (from an unexpired holder) and releases there were;
-- a semaphore's are the sums over its slots.
CREATE OR REPLACE FUNCTION lease_counters(name text DEFAULT NULL)
RETURNS TABLE(name text, grants bigint, takeovers bigint, steals bigint, releases bigint)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT c.name, c.grants, c.takeovers, c.steals, c.releases FROM (
        SELECT l.name, l.grants, l.takeovers, l.steals, l.releases
          FROM pylease_leases AS l
         WHERE $1 IS NULL OR l.name = $1
        UNION ALL
        SELECT p.name, sum(p.grants)::bigint, sum(p.takeovers)::bigint, sum(p.steals)::bigint,
               sum(p.releases)::bigint
          FROM pylease_permits AS p
         WHERE $1 IS NULL OR p.name = $1
         GROUP BY p.name
    ) AS c
     ORDER BY c.name;
$$;

DROP FUNCTION lease_history(text, timestamptz, integer);
DROP FUNCTION pylease_history_rows(text, timestamptz, integer);

-- lease_history's rows, one query per case, so that each one uses its index.
CREATE FUNCTION pylease_history_rows(lease text, since timestamptz, max_rows integer)
RETURNS TABLE(at timestamptz, name text, event text, holder text, fence bigint,
              previous_holder text, slot integer)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'pylease: max_rows must be between 1 and 10000'
            USING ERRCODE = '22023', COLUMN = 'max_rows';
    END IF;
    IF lease IS NULL THEN
        RETURN QUERY
        SELECT e.at, e.name, e.event, e.holder, e.fence, e.previous_holder, e.slot
          FROM pylease_events AS e
         WHERE e.at >= coalesce(pylease_history_rows.since, '-infinity')
         ORDER BY e.at DESC, e.id DESC
         LIMIT pylease_history_rows.max_rows;
    ELSE
        PERFORM pylease_check_key('name', lease);
        RETURN QUERY
        SELECT e.at, e.name, e.event, e.holder, e.fence, e.previous_holder, e.slot
          FROM pylease_events AS e
         WHERE e.name = lease AND e.at >= coalesce(pylease_history_rows.since, '-infinity')
         ORDER BY e.at DESC, e.id DESC
         LIMIT pylease_history_rows.max_rows;
    END IF;
END
$$;

-- Events newest first (ties: the later recorded first), of one name or all,
-- since a moment (inclusive), at most max_rows (1 to 10000); slot is a semaphore's
-- slot, NULL for a lease.
CREATE FUNCTION lease_history(name text DEFAULT NULL, since timestamptz DEFAULT NULL,
                              max_rows integer DEFAULT 100)
RETURNS TABLE(at timestamptz, name text, event text, holder text, fence bigint,
              previous_holder text, slot integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT * FROM pylease_history_rows($1, $2, $3);
$$;

COMMENT ON FUNCTION lease_history(text, timestamptz, integer) IS
    'pylease: recorded events (pylease.history), newest first, since a moment, at most max_rows.';
COMMENT ON FUNCTION lease_counters(text) IS
    'pylease: per name (leases and semaphores), how many grants, takeovers, steals and releases there were.';
COMMENT ON FUNCTION permit_claim(text, integer, interval, text, integer) IS
    'pylease: claim permits slots of a semaphore of max_permits; a (slot, fence) row per slot when granted, no row when busy.';
COMMENT ON FUNCTION permit_renew(text, text, interval) IS
    'pylease: extend every slot this holder holds, all or nothing; false once any is lost.';
COMMENT ON FUNCTION permit_release(text, text) IS
    'pylease: free every slot this holder holds; true when they were all still its own. NOTIFY pylease when freed.';
COMMENT ON FUNCTION permit_holds(text, text, bigint) IS
    'pylease: true iff this holder holds an unexpired slot with this fence; locks it FOR KEY SHARE against every grant.';
COMMENT ON FUNCTION permit_status(text) IS
    'pylease: one row per slot ever granted (all semaphores when name is NULL), with the limit; state is held, released or expired.';
COMMENT ON FUNCTION permit_set_max(text, integer) IS
    'pylease: change a semaphore''s limit; slots above a lowered limit drain as their holders leave.';
COMMENT ON FUNCTION permit_revoke(text, text) IS
    'pylease: free every slot this holder holds (an operator''s break-lock); true if it held any.';
COMMENT ON FUNCTION lease_claim_all(text[], interval, text) IS
    'pylease: claim every lease of names, all or nothing; a (name, fence) row per name when granted, no row when any is busy.';
COMMENT ON FUNCTION lease_release_all(text[], text) IS
    'pylease: give back every lease of names this holder still holds; a (name, released) row per name.';

-- Privileges ------------------------------------------------------------------

REVOKE ALL ON TABLE pylease_names FROM PUBLIC;
REVOKE ALL ON TABLE pylease_permits FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_count(text, integer, integer, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_names(text, text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_register_lease() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_history_rows(text, timestamptz, integer) FROM PUBLIC;
-- Changing a limit and breaking a holder's permits are an operator's: granted to the
-- roles that may.
REVOKE EXECUTE ON FUNCTION permit_set_max(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION permit_revoke(text, text) FROM PUBLIC;
