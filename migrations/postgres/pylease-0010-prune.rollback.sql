-- Undo pylease 0010: names are never pruned again; the floors are forgotten.

DO $pin$
BEGIN
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

DROP FUNCTION lease_prune(interval);
DROP TRIGGER pylease_permits_floor ON pylease_permits;
DROP FUNCTION pylease_floor_slot();

CREATE OR REPLACE FUNCTION pylease_register_lease() RETURNS trigger
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

DROP FUNCTION pylease_fence_floor(text);
DROP TABLE pylease_fence_floors;
