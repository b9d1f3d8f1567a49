-- pylease 0005: a queue of waiting processes, so that a release wakes one of them
-- into a claim, not all (issue 13). Keep sql/postgres/schema.sql in step.
--   * pylease_waiters: one row per waiting process and lease name, in arrival
--     order, each with an expiry its waiter refreshes.
--   * lease_wait(name, waiter, ttl) queues or refreshes a waiter and says whether
--     it is the head; lease_unwait(name, waiter, granted) takes it out and wakes the new head
--     with NOTIFY pylease_waiters.
--   Claims and releases are unchanged (a busy claim writes nothing, a release still
--   sends NOTIFY pylease): only a waiter writes here.
-- depends: pylease-0004-faster

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- One row per waiting process and lease name, in arrival order (id). A row
-- outlives its waiter only until expires_at, which the waiter refreshes: a waiter
-- that vanished is skipped, and liveness never rests on session state (so
-- PgBouncer's transaction mode is fine).
CREATE TABLE pylease_waiters (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL,
    waiter     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    UNIQUE (name, waiter)
);
CREATE INDEX pylease_waiters_name_id ON pylease_waiters (name, id);

COMMENT ON TABLE pylease_waiters IS
    'pylease: processes waiting for a lease, in arrival order; written only through lease_wait and lease_unwait.';

-- Queue a waiter for a lease name, or refresh its expiry: true when it is the head
-- (the first unexpired waiter), which alone claims again on a release. The expired
-- waiters of the name are removed.
CREATE FUNCTION lease_wait(name text, waiter text, ttl interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    PERFORM pylease_check_key('name', lease_wait.name);
    PERFORM pylease_check_key('waiter', lease_wait.waiter);
    PERFORM pylease_check_ttl('ttl', lease_wait.ttl);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_wait');
    END IF;
    -- A queue entry lost in a crash is harmless (its waiter queues again when it
    -- refreshes): no flush, while this transaction has written nothing else.
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    DELETE FROM pylease_waiters AS w
     WHERE w.name = lease_wait.name AND w.expires_at <= now_;
    INSERT INTO pylease_waiters AS w (name, waiter, expires_at)
    VALUES (lease_wait.name, lease_wait.waiter, now_ + lease_wait.ttl)
    ON CONFLICT ON CONSTRAINT pylease_waiters_name_waiter_key
    DO UPDATE SET expires_at = excluded.expires_at;
    RETURN (SELECT w.waiter FROM pylease_waiters AS w
             WHERE w.name = lease_wait.name ORDER BY w.id LIMIT 1) = lease_wait.waiter;
END
$$;

-- Take a waiter out of the queue of a lease name: true if it was queued. When it
-- was the head, the new head is woken: NOTIFY pylease_waiters with the payload
-- {"name": ..., "waiter": ..., "claim": ...}; claim is true unless the waiter
-- leaves with the lease (granted), whose release will notify pylease as always.
CREATE FUNCTION lease_unwait(name text, waiter text, granted boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    head text;
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
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF head = lease_unwait.waiter THEN
        SELECT w.waiter INTO head FROM pylease_waiters AS w
         WHERE w.name = lease_unwait.name AND w.expires_at > now_ ORDER BY w.id LIMIT 1;
        IF head IS NOT NULL THEN
            PERFORM pg_notify('pylease_waiters',
                              json_build_object('name', lease_unwait.name, 'waiter', head,
                                                'claim', NOT coalesce(granted, false))::text);
        END IF;
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease_wait(text, text, interval) IS
    'pylease: queue a waiting process for a lease name (or refresh its expiry); true when it is the head.';
COMMENT ON FUNCTION lease_unwait(text, text, boolean) IS
    'pylease: take a waiting process out of the queue; wakes the new head with NOTIFY pylease_waiters.';

REVOKE ALL ON TABLE pylease_waiters FROM PUBLIC;
