-- pylease 0010: names that are gone (contract revision 3, section 5.6; issue 29).
-- Keep sql/postgres/schema.sql in step.
--   * pylease_fence_floors: per bucket of names, the highest fence any pruned name
--     of the bucket had, so that a pruned name's next grant starts above it;
--   * pylease_fence_floor(name): that floor, read under the bucket's shared lock;
--   * a new lease row, and a semaphore slot's first grant, start above the floor;
--   * lease_prune(idle_for): deletes the names nobody has held for idle_for.
-- depends: pylease-0009-keeper

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Per bucket of names (hashtext(name) & 1023), the highest fence a pruned name of
-- the bucket ever had. Only lease_prune raises it; a row exists once a name of its
-- bucket was pruned.
CREATE TABLE pylease_fence_floors (
    bucket integer PRIMARY KEY CHECK (bucket BETWEEN 0 AND 1023),
    floor  bigint  NOT NULL CHECK (floor > 0)
);

COMMENT ON TABLE pylease_fence_floors IS
    'pylease: per bucket of names, the highest fence a pruned name had; written only by lease_prune.';

-- The floor of a name's bucket, for a first grant. The bucket's shared advisory lock
-- (transaction-scoped, so no session state) makes the grant wait for a lease_prune
-- that holds the bucket, and then read the floor that prune raised. Without it, an
-- insert whose claim looked before the name's row was made (by another claimer)
-- could read the floor, wait on that row's key while a prune deletes it, and then
-- be stored with the fence the pruned row had.
CREATE FUNCTION pylease_fence_floor(name text) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    b integer := hashtext(pylease_fence_floor.name) & 1023;
    f bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1886153829, b);  -- 1886153829: 'plse'
    SELECT fl.floor INTO f FROM pylease_fence_floors AS fl WHERE fl.bucket = b;
    RETURN coalesce(f, 0);
END
$$;

-- A new lease row registers its name as a lease (or raises: it is a semaphore's),
-- and starts above every fence a pruned name of its bucket had.
CREATE OR REPLACE FUNCTION pylease_register_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.fence := greatest(NEW.fence, pylease_fence_floor(NEW.name) + 1);
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

-- A slot's first grant (its fence leaves 0) starts above the floor as well; later
-- grants never call the trigger (its WHEN is checked without calling a function).
CREATE FUNCTION pylease_floor_slot() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.fence := greatest(NEW.fence, pylease_fence_floor(NEW.name) + 1);
    RETURN NEW;
END
$$;

CREATE TRIGGER pylease_permits_floor BEFORE UPDATE OF fence ON pylease_permits
    FOR EACH ROW WHEN (OLD.fence = 0 AND NEW.fence > 0)
    EXECUTE FUNCTION pylease_floor_slot();

-- Delete the names (leases and semaphores) that nobody has held for at least
-- idle_for, with their counters; their history stays. How many were deleted.
-- Fences never go back: a pruned name's bucket floor is raised to its fence first,
-- in the same transaction, under the bucket's lock. Prune never waits: a bucket in
-- a first grant's hands, a row locked by a claimer or by a fenced transaction is
-- skipped this time.
CREATE FUNCTION lease_prune(idle_for interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cutoff  timestamptz;
    buckets integer[];
    leases  bigint;
    sems    bigint;
BEGIN
    PERFORM pylease_check_span('idle_for', lease_prune.idle_for);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_prune');
    END IF;
    cutoff := clock_timestamp() - lease_prune.idle_for;

    SELECT array_agg(c.b ORDER BY c.b) INTO buckets
      FROM (SELECT DISTINCT hashtext(i.name) & 1023 AS b
              FROM (SELECT l.name FROM pylease_leases AS l WHERE l.expires_at <= cutoff
                    UNION ALL
                    SELECT p.name FROM pylease_permits AS p
                     GROUP BY p.name HAVING max(p.expires_at) <= cutoff) AS i) AS c
     WHERE pg_try_advisory_xact_lock(1886153829, c.b);
    IF buckets IS NULL THEN
        RETURN 0;
    END IF;

    WITH gone AS (
        SELECT l.name, l.fence FROM pylease_leases AS l
         WHERE l.expires_at <= cutoff AND (hashtext(l.name) & 1023) = ANY (buckets)
           FOR UPDATE SKIP LOCKED
    ), floors AS (
        INSERT INTO pylease_fence_floors AS fl (bucket, floor)
        SELECT hashtext(g.name) & 1023, max(g.fence) FROM gone AS g GROUP BY 1
        ON CONFLICT (bucket) DO UPDATE SET floor = greatest(fl.floor, excluded.floor)
    ), deleted AS (
        DELETE FROM pylease_leases AS l USING gone AS g WHERE l.name = g.name
        RETURNING l.name
    ), unnamed AS (
        DELETE FROM pylease_names AS n USING deleted AS d WHERE n.name = d.name
    )
    SELECT count(*) INTO leases FROM deleted;

    -- A semaphore goes only whole: every slot idle, and every slot locked here.
    WITH idle AS (
        SELECT p.name, count(*) AS slots FROM pylease_permits AS p
         WHERE (hashtext(p.name) & 1023) = ANY (buckets)
         GROUP BY p.name HAVING max(p.expires_at) <= cutoff
    ), locked AS (
        SELECT p.name, p.fence FROM pylease_permits AS p
         WHERE p.name IN (SELECT i.name FROM idle AS i) AND p.expires_at <= cutoff
         ORDER BY p.name, p.slot
           FOR UPDATE SKIP LOCKED
    ), whole AS (
        SELECT k.name, max(k.fence) AS fence FROM locked AS k JOIN idle AS i USING (name)
         GROUP BY k.name, i.slots HAVING count(*) = i.slots
    ), floors AS (
        INSERT INTO pylease_fence_floors AS fl (bucket, floor)
        SELECT hashtext(w.name) & 1023, max(w.fence) FROM whole AS w WHERE w.fence > 0 GROUP BY 1
        ON CONFLICT (bucket) DO UPDATE SET floor = greatest(fl.floor, excluded.floor)
    ), slots AS (
        DELETE FROM pylease_permits AS p USING whole AS w WHERE p.name = w.name
    ), deleted AS (
        DELETE FROM pylease_names AS n USING whole AS w WHERE n.name = w.name
        RETURNING n.name
    )
    SELECT count(*) INTO sems FROM deleted;
    RETURN leases + sems;
END
$$;

COMMENT ON FUNCTION lease_prune(interval) IS
    'pylease: delete the names (leases and semaphores) nobody has held for at least idle_for, with their counters; returns how many. Fences never go back.';
COMMENT ON FUNCTION pylease_fence_floor(text) IS
    'pylease (internal): the highest fence a pruned name of this name''s bucket had, read under the bucket''s shared lock.';

REVOKE ALL ON TABLE pylease_fence_floors FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_fence_floor(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_floor_slot() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease_prune(interval) FROM PUBLIC;
