-- Undo pylease 0021: lease_unwait as pylease-0013-shared defined it.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

CREATE OR REPLACE FUNCTION lease_unwait(name text, waiter text, granted boolean DEFAULT false)
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
    RETURN queued;
END
$$;
