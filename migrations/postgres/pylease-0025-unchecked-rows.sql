-- pylease 0025: the lease, permit and share tables lose their CHECK constraints, and a
-- granted lease_unwait no longer sweeps the queue (issues 26 and 22; bench targets
-- 14-revision-3 and 5). Keep sql/postgres/schema.sql in step.
--   * PostgreSQL reads and prepares a table's CHECK expressions again for every
--     statement that writes a row of it: pylease_leases' four (name and holder
--     lengths, fence >= 0, a holder unless released) cost a claim + release cycle a
--     tenth of its time, more than all the rest of revision 3. The functions, the
--     tables' only writers, check every name and holder they store; the fences and
--     holders they compute keep the rest. pylease_permits and pylease_shared lose
--     theirs for the same reason;
--   * lease_unwait(..., granted => true) leaves the sweep of expired entries to
--     lease_wait (which runs it on every call) and to an ungranted unwait: a waiter
--     that was just granted the lease waited for it before its claim's reply came.
-- Answers are unchanged.
-- depends: pylease-0024-readers-write-no-lease-row

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

ALTER TABLE pylease_leases
    DROP CONSTRAINT pylease_leases_name_check,
    DROP CONSTRAINT pylease_leases_holder_check,
    DROP CONSTRAINT pylease_leases_fence_check,
    DROP CONSTRAINT pylease_leases_unclaimed;
ALTER TABLE pylease_permits
    DROP CONSTRAINT pylease_permits_slot_check,
    DROP CONSTRAINT pylease_permits_holder_check,
    DROP CONSTRAINT pylease_permits_fence_check;
ALTER TABLE pylease_shared
    DROP CONSTRAINT pylease_shared_holder_check,
    DROP CONSTRAINT pylease_shared_epoch_check;

-- Take a waiter out of the queue of a lease name: true if it was queued. When it
-- was the head, the new head is woken: NOTIFY pylease_waiters with the payload
-- {"name": ..., "waiter": ..., "claim": ...}; claim is true unless the waiter
-- leaves with the lease (granted), whose release will notify pylease as always.
-- Unless granted, a few expired entries of any name are removed, as by lease_wait.
CREATE OR REPLACE FUNCTION lease_unwait(name text, waiter text, granted boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    heads text[];
BEGIN
    -- The checks' functions are called only to raise: each call sets a search_path.
    IF lease_unwait.name IS NULL OR lease_unwait.name = '' OR length(lease_unwait.name) > 200 THEN
        PERFORM pylease_check_key('name', lease_unwait.name);
    END IF;
    IF lease_unwait.waiter IS NULL OR lease_unwait.waiter = ''
       OR length(lease_unwait.waiter) > 200 THEN
        PERFORM pylease_check_key('waiter', lease_unwait.waiter);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_unwait');
    END IF;
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- The first two unexpired entries as the entry is removed: when it was the first
    -- (the head), the second is the new head.
    DELETE FROM pylease_waiters AS w
     WHERE w.name = lease_unwait.name AND w.waiter = lease_unwait.waiter
    RETURNING ARRAY(SELECT x.waiter FROM pylease_waiters AS x
                     WHERE x.name = w.name AND x.expires_at > now_ ORDER BY x.id LIMIT 2)
    INTO heads;
    -- No entry: heads is NULL (ARRAY() itself is never NULL).
    IF heads[1] = lease_unwait.waiter THEN
        IF heads[2] IS NOT NULL THEN
            PERFORM pg_notify('pylease_waiters',
                              json_build_object('name', lease_unwait.name, 'waiter', heads[2],
                                                'claim', NOT coalesce(granted, false))::text);
        ELSIF NOT coalesce(granted, false) THEN
            -- The last waiting writer left without the lease: the readers it held off
            -- (writer preference) may claim now.
            PERFORM pg_notify('pylease', lease_unwait.name);
        END IF;
    END IF;
    -- Last, as in lease_wait; not on a grant, whose waiter holds the lease now and
    -- whose next holder waits for this statement: lease_wait sweeps as often.
    IF NOT coalesce(granted, false) THEN
        DELETE FROM pylease_waiters AS w
         WHERE w.id IN (SELECT x.id FROM pylease_waiters AS x WHERE x.expires_at <= now_
                         ORDER BY x.expires_at LIMIT 16 FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN heads IS NOT NULL;
END
$$;
