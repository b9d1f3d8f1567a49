-- Undo pylease 0025: the CHECK constraints of pylease_leases, pylease_permits and
-- pylease_shared again, and lease_unwait sweeping on every call.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

ALTER TABLE pylease_leases
    ADD CONSTRAINT pylease_leases_name_check CHECK (length(name) BETWEEN 1 AND 200),
    ADD CONSTRAINT pylease_leases_holder_check CHECK (length(holder) BETWEEN 1 AND 200),
    ADD CONSTRAINT pylease_leases_fence_check CHECK (fence >= 0),
    ADD CONSTRAINT pylease_leases_unclaimed CHECK (holder IS NOT NULL OR released);
ALTER TABLE pylease_permits
    ADD CONSTRAINT pylease_permits_slot_check CHECK (slot BETWEEN 0 AND 9999),
    ADD CONSTRAINT pylease_permits_holder_check CHECK (length(holder) BETWEEN 1 AND 200),
    ADD CONSTRAINT pylease_permits_fence_check CHECK (fence >= 0);
ALTER TABLE pylease_shared
    ADD CONSTRAINT pylease_shared_holder_check CHECK (length(holder) BETWEEN 1 AND 200),
    ADD CONSTRAINT pylease_shared_epoch_check CHECK (epoch >= 0);

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
    -- Last, as in lease_wait.
    DELETE FROM pylease_waiters AS w
     WHERE w.id IN (SELECT x.id FROM pylease_waiters AS x WHERE x.expires_at <= now_
                     ORDER BY x.expires_at LIMIT 16 FOR UPDATE SKIP LOCKED);
    RETURN heads IS NOT NULL;
END
$$;
