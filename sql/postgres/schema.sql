-- pylease: the current PostgreSQL schema, as every migration of
-- migrations/postgres/ leaves it. Readable definition; install with
-- `pylease migrate`, which records the migrations. A test proves the two agree.
--
-- psql -v ON_ERROR_STOP=1 -f sql/postgres/schema.sql  (installs into current_schema())
BEGIN;
-- Pin every function's search_path to the schema this runs in (plus pg_temp,
-- last), so that objects in a caller's schema can never stand in for ours.
DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Tables ----------------------------------------------------------------------

-- One row per name claimed and not pruned. A pruned name's next first grant starts
-- above its bucket's pylease_fence_floors, so the fence of a name can only grow.
-- Fillfactor leaves room on the page, so renewals and releases are HOT updates. A name
-- first claimed by a reader has a row without a holder, released, for readers to lock;
-- its fence is its bucket's floor (0 for a name never pruned): no writer was granted it.
-- The lease, permit and share tables have no CHECK constraint: the functions, their
-- only writers, check every name and holder they store, and PostgreSQL reads and
-- prepares a table's CHECK expressions again for every statement that writes a row
-- (measured: this table's four cost a claim + release cycle a tenth of its time).
CREATE TABLE pylease_leases (
    name        text        PRIMARY KEY,
    holder      text,
    fence       bigint      NOT NULL,
    ttl         interval    NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    released    boolean     NOT NULL DEFAULT false,
    grants      bigint      NOT NULL DEFAULT 0,
    takeovers   bigint      NOT NULL DEFAULT 0,
    steals      bigint      NOT NULL DEFAULT 0,
    releases    bigint      NOT NULL DEFAULT 0,
    -- The tenure's: replaced by every new grant (NULL unless the grant gives some).
    data        jsonb,
    -- A step-down request (lease_request_release), until the tenure ends.
    release_requested_by text,
    -- Somebody watches the name (lease_watch): its changes notify (pylease_tell_watchers).
    watched     boolean     NOT NULL DEFAULT false,
    -- pylease_share_ids as it stood when this tenure was granted: a reader of the
    -- tenure draws a later one, so a grant that finds the sequence still there knows
    -- no reader came since (pylease_claim). NULL on a row a reader made.
    share_mark  bigint
) WITH (fillfactor = 50);

COMMENT ON TABLE pylease_leases IS
    'pylease: one row per lease name; written only through the lease_* functions.';

-- The fence is a key column, so that lease_holds' FOR KEY SHARE conflicts with every
-- grant and with no renewal. The cost, measured: a grant is not a HOT update (one more
-- index entry per grant), renewals and releases are. The alternative, renewing row by
-- row around a FOR SHARE lock, would leave the fenced lease's own renewal
-- waiting and make the keeper's one statement many.
CREATE UNIQUE INDEX pylease_leases_fence ON pylease_leases (name, fence);
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
    previous_holder text,
    slot            integer
);
CREATE INDEX pylease_events_at ON pylease_events (at, id);
CREATE INDEX pylease_events_name_at ON pylease_events (name, at, id);

COMMENT ON TABLE pylease_events IS
    'pylease: lease history (pylease.history = rare | all | none); written only through the lease_* functions.';

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

-- One row per slot of a semaphore, 0 to the highest limit it ever had, made when the
-- limit is (so that a claim never inserts a slot, and never waits for another
-- claimer's insert). A slot never granted has fence 0 and no holder. permits is
-- how many slots its holder was granted together: a holder whose slots number
-- fewer lost one. As for leases, the fence is a key column (pylease_permits_fence),
-- so permit_holds' FOR KEY SHARE conflicts with every grant and with nothing else.
CREATE TABLE pylease_permits (
    name        text        NOT NULL,
    slot        integer     NOT NULL,
    holder      text,
    fence       bigint      NOT NULL DEFAULT 0,
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

-- Per bucket of names (hashtext(name) & 1023), the highest fence a pruned name of
-- the bucket ever had. Only lease_prune raises it; a row exists once a name of its
-- bucket was pruned.
CREATE TABLE pylease_fence_floors (
    bucket integer PRIMARY KEY CHECK (bucket BETWEEN 0 AND 1023),
    floor  bigint  NOT NULL CHECK (floor > 0)
);

COMMENT ON TABLE pylease_fence_floors IS
    'pylease: per bucket of names, the highest fence a pruned name had; written only by lease_prune.';

-- The ids of readers' shares: each new share draws one, so that a release or a
-- renewal of an earlier share of the same holder (a reused holder) names another id.
-- An integer, as the keeper's slots element that carries it; it cycles, and an id
-- comes back only after 2^31 shares more (and a share is named by its epoch too).
CREATE SEQUENCE pylease_share_ids AS integer CYCLE;

-- One row per reader of a lease name: it holds while its epoch is still the name's
-- fence (no exclusive grant since) and it is unexpired; share is its tenure's id. A
-- release deletes the row; an exclusive grant deletes the rows of the name (their
-- readers are over), and a reader's release a few expired ones.
CREATE TABLE pylease_shared (
    name        text        NOT NULL,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    ttl         interval    NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    share       integer     NOT NULL DEFAULT nextval('pylease_share_ids'),
    PRIMARY KEY (name, holder)
) WITH (fillfactor = 50);

COMMENT ON TABLE pylease_shared IS
    'pylease: the readers (shared holders) of lease names; written only through the lease_* functions.';

-- Argument checks -------------------------------------------------------------

-- Raises 22023 unless a name or holder is a non-empty text of at most 200 characters.
CREATE FUNCTION pylease_check_key(parameter text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value = '' THEN
        RAISE EXCEPTION 'pylease: % must not be empty', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF length(value) > 200 THEN
        RAISE EXCEPTION 'pylease: % must be at most 200 characters', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- Raises 22023 unless a ttl is finite, positive and at most 366 days.
CREATE FUNCTION pylease_check_ttl(parameter text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF NOT isfinite(value) THEN
        RAISE EXCEPTION 'pylease: % must be finite', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value <= interval '0' THEN
        RAISE EXCEPTION 'pylease: % must be positive', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value > interval '366 days' THEN
        RAISE EXCEPTION 'pylease: % must be at most 366 days', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- Raises 22023 unless a span (older_than, min_hold) is finite, not negative and
-- at most 366 days (beyond that, now +/- the span could leave timestamptz's range).
CREATE FUNCTION pylease_check_span(parameter text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: % must not be NULL', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF NOT isfinite(value) THEN
        RAISE EXCEPTION 'pylease: % must be finite', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value < interval '0' THEN
        RAISE EXCEPTION 'pylease: % must not be negative', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    ELSIF value > interval '366 days' THEN
        RAISE EXCEPTION 'pylease: % must be at most 366 days', parameter
            USING ERRCODE = '22023', COLUMN = parameter;
    END IF;
END
$$;

-- Raises 22023 unless a batch's arrays are given, as long as each other, with
-- valid names, holders and (NULL or valid) ttls.
CREATE FUNCTION pylease_check_batch(names text[], holders text[], ttls interval[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF names IS NULL THEN
        RAISE EXCEPTION 'pylease: names must not be NULL' USING ERRCODE = '22023', COLUMN = 'names';
    ELSIF holders IS NULL THEN
        RAISE EXCEPTION 'pylease: holders must not be NULL'
            USING ERRCODE = '22023', COLUMN = 'holders';
    ELSIF cardinality(names) <> cardinality(holders) THEN
        RAISE EXCEPTION 'pylease: holders must have as many elements as names'
            USING ERRCODE = '22023', COLUMN = 'holders';
    ELSIF EXISTS (SELECT FROM unnest(names) AS u(v) WHERE v IS NULL OR v = '' OR length(v) > 200) THEN
        RAISE EXCEPTION 'pylease: names must hold only non-empty texts of at most 200 characters'
            USING ERRCODE = '22023', COLUMN = 'names';
    ELSIF EXISTS (SELECT FROM unnest(holders) AS u(v) WHERE v IS NULL OR v = '' OR length(v) > 200) THEN
        RAISE EXCEPTION 'pylease: holders must hold only non-empty texts of at most 200 characters'
            USING ERRCODE = '22023', COLUMN = 'holders';
    END IF;
    IF ttls IS NOT NULL THEN
        IF cardinality(ttls) <> cardinality(names) THEN
            RAISE EXCEPTION 'pylease: ttls must have as many elements as names'
                USING ERRCODE = '22023', COLUMN = 'ttls';
        ELSIF EXISTS (SELECT FROM unnest(ttls) AS u(v)
                       WHERE NOT isfinite(v) OR v <= interval '0' OR v > interval '366 days') THEN
            RAISE EXCEPTION 'pylease: ttls must hold only NULLs or finite, positive ttls of at most 366 days'
                USING ERRCODE = '22023', COLUMN = 'ttls';
        END IF;
    END IF;
END
$$;

-- Raises 25006 naming the operation: a standby answers reads, so a claim there
-- would otherwise look busy, and a write would fail with a bare driver error.
CREATE FUNCTION pylease_refuse_standby(operation text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'pylease: % needs the primary: this server is a read-only standby', operation
        USING ERRCODE = '25006',
              HINT = 'Connect to the primary, e.g. with target_session_attrs=read-write in the connection string.';
END
$$;

-- Raises 25006 for a grant in a read-only transaction on a server that is not a
-- standby (default_transaction_read_only set for a role or database): an error
-- that says so, never a busy answer nor "connect to the primary".
CREATE FUNCTION pylease_refuse_read_only(operation text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'pylease: % needs a read-write transaction, and this one is read-only', operation
        USING ERRCODE = '25006',
              HINT = 'default_transaction_read_only is on for this role, database or session: turn it off for the role pylease connects as (ALTER ROLE ... SET default_transaction_read_only = off).';
END
$$;

-- Raises 22023 for a pylease.history setting that is not rare, all, none or empty.
CREATE FUNCTION pylease_refuse_history(setting text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'pylease: pylease.history must be rare, all or none, not %', quote_literal(setting)
        USING ERRCODE = '22023', COLUMN = 'pylease.history';
END
$$;

-- For an exclusive grant in a transaction that is not READ COMMITTED, whose snapshot
-- may predate readers (a shared claim writes only its own row, which such a snapshot
-- does not see): takes the names' reader-writer locks (in name order), so that no
-- reader comes in any more, then raises 40001 when a transaction the snapshot does not
-- see has locked one of their lease rows since its last update (a reader's claim locks
-- it FOR KEY SHARE; the lock stays in the row version, as xmax, a single locker's or a
-- multixact's). Conservative: a fenced transaction (lease_holds) counts too, and a
-- value that may be either kind of xmax is read as both. But a grant that came first
-- is no reader: an xmax that is its update makes PostgreSQL's own 40001 ("concurrent
-- update") instead, which the grants answer as busy, the race lost.
CREATE FUNCTION pylease_refuse_unseen_readers(operation text, names text[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    snap    pg_snapshot := pg_current_snapshot();
    top     bigint := pg_snapshot_xmax(snap)::text::bigint;
    own     bigint := pg_current_xact_id_if_assigned()::text::bigint;
    locked  text;
    locker  xid;
    lockers bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(1886155383, hashtext(u.n))
       FROM (SELECT DISTINCT n FROM unnest(pylease_refuse_unseen_readers.names) AS n ORDER BY n) AS u;
    FOR locked, locker IN
        SELECT l.name, l.xmax FROM pylease_leases AS l
         WHERE l.name = ANY (pylease_refuse_unseen_readers.names) AND l.xmax <> '0'::xid
    LOOP
        lockers := ARRAY[locker::text::bigint];
        BEGIN
            lockers := lockers || ARRAY(SELECT m.xid::text::bigint
                                          FROM pg_get_multixact_members(locker) AS m);
        EXCEPTION WHEN OTHERS THEN
            NULL;  -- no multixact has this number: a single locker's xid
        END;
        -- Each 32-bit xid in the epoch that puts it within 2^31 of the snapshot's xmax.
        IF EXISTS (SELECT FROM unnest(lockers) AS u(x),
                          LATERAL (SELECT (top & ~4294967295) + u.x
                                          - CASE WHEN (top & ~4294967295) + u.x > top + 2147483648
                                                 THEN 4294967296 ELSE 0 END AS x8) AS f
                    WHERE f.x8 >= 3 AND f.x8 IS DISTINCT FROM own
                      AND NOT pg_visible_in_snapshot(f.x8::text::xid8, snap)) THEN
            -- A grant (a new fence, a key column) conflicts with this lock: it waits for
            -- one in progress, and fails with 40001 once one committed since the snapshot.
            -- A reader's lock, a fenced transaction's, or a renewal let it through.
            PERFORM FROM pylease_leases AS l WHERE l.name = locked FOR KEY SHARE;
            RAISE EXCEPTION 'pylease: % of % under % isolation: a reader may have come after this transaction''s snapshot, which cannot see it',
                operation, quote_literal(locked), current_setting('transaction_isolation')
                USING ERRCODE = '40001',
                      HINT = 'Grant it in a READ COMMITTED transaction (pylease''s Python API runs the claim again in one).';
        END IF;
    END LOOP;
END
$$;

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

-- A new lease row registers its name as a lease, or finds it a semaphore and
-- raises. The insert into pylease_names waits for another transaction's insert of
-- the same name, so a first lease grant and a first permit grant of one name never
-- both commit. It starts above every fence a pruned name of its bucket had; a
-- reader's row (no holder) at that floor.
CREATE FUNCTION pylease_register_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- A reader's row (no holder: no writer was granted it) takes the floor itself as
    -- its fence, the epoch of its readers; the next writer's grant goes above it.
    NEW.fence := greatest(NEW.fence, pylease_fence_floor(NEW.name)
                                     + CASE WHEN NEW.holder IS NULL THEN 0 ELSE 1 END);
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

-- Functions -------------------------------------------------------------------

-- True when no unexpired share of this epoch of the name stands, as the caller's
-- statement sees pylease_shared. A function, not a subquery, so that a statement that
-- calls it only for some rows (pylease_claim's grant, for a name readers claimed) does
-- not set up a scan of pylease_shared each time it runs.
CREATE FUNCTION pylease_unshared(name text, epoch bigint, at timestamptz) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM pylease_shared AS s
                        WHERE s.name = pylease_unshared.name AND s.epoch = pylease_unshared.epoch
                          AND s.expires_at > pylease_unshared.at);
END
$$;

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
CREATE FUNCTION pylease_claim(name text, ttl interval, holder text, new_tenure boolean,
                              data jsonb)
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
    s_mark   bigint;
    s_seq    bigint;
    s_last   bigint;
    history  text;
    failure  text;
BEGIN
    -- One cheap test in the common case (a read-only transaction's too, as on a
    -- standby); the checks that raise run only when it fails.
    IF pylease_claim.name IS NULL OR pylease_claim.name = '' OR length(pylease_claim.name) > 200
       OR pylease_claim.ttl IS NULL OR NOT isfinite(pylease_claim.ttl)
       OR pylease_claim.ttl <= interval '0' OR pylease_claim.ttl > interval '366 days'
       OR pylease_claim.holder IS NULL OR pylease_claim.holder = ''
       OR length(pylease_claim.holder) > 200 OR pylease_claim.new_tenure IS NULL
       -- Data as text is at most 6 characters a byte of jsonb (an escaped control
       -- character): only larger data pays for the text.
       OR (pg_column_size(pylease_claim.data) > 1024 AND length(pylease_claim.data::text) > 8192)
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', pylease_claim.name);
        PERFORM pylease_check_ttl('ttl', pylease_claim.ttl);
        PERFORM pylease_check_key('holder', pylease_claim.holder);
        PERFORM pylease_check_data(pylease_claim.data);
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
               AND (pylease_claim.new_tenure OR l.released OR l.holder <> pylease_claim.holder),
               l.share_mark, pg_sequence_last_value('pylease_share_ids')
          INTO s_holder, s_fence, s_freed, s_busy, s_mark, s_seq
          FROM pylease_leases AS l
         WHERE l.name = pylease_claim.name;
        IF s_busy THEN
            RETURN NULL;
        ELSIF s_fence IS NULL THEN
            -- A first claim of the name; a conflict means another claimer created it first.
            -- Not READ COMMITTED, a row made since the snapshot is a conflict PostgreSQL
            -- cannot serialize (40001): another claimer won there too.
            BEGIN
                INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                                 expires_at, grants, data, share_mark)
                VALUES (pylease_claim.name, pylease_claim.holder,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                        pylease_claim.ttl, t_now, t_now, t_now + pylease_claim.ttl, 1, pylease_claim.data,
                        pg_sequence_last_value('pylease_share_ids'))
                ON CONFLICT DO NOTHING  -- the name (or its (name, fence) key) exists: another claimer won
                RETURNING l.fence, current_setting('pylease.history', true) INTO granted, history;
            EXCEPTION WHEN serialization_failure THEN
                RETURN NULL;
            END;
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
                   expires_at = greatest(l.expires_at, t_now + pylease_claim.ttl),
                   -- The tenure's data, unless this claim gives some (a retried
                   -- claim gives what the lost one gave).
                   data       = coalesce(pylease_claim.data, l.data)
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
            -- Readers: each share draws a later pylease_share_ids than the grant of its
            -- epoch recorded in share_mark (the reader draws once it holds the row FOR
            -- KEY SHARE, so after that grant committed). The sequence as read above (it
            -- is not transactional) equal to the mark: no reader came since, and the
            -- grant looks for none; otherwise it looks, before it writes (a busy answer
            -- writes nothing), and once more after its update took the row, in a
            -- statement of its own, which sees every reader whose row lock the update
            -- waited for. (The sequence cycles: it comes back to a mark only after 2^31
            -- shares, all drawn between two grants of one name.)
            BEGIN
                IF current_setting('statement_timeout') <> '0'
                   OR current_setting('transaction_isolation') <> 'read committed' THEN
                    -- A statement_timeout (a role's, a database's) shorter than this wait
                    -- would cancel the claim, an error, before the wait counts as busy:
                    -- the wait takes at most half of the statement's time.
                    IF current_setting('statement_timeout') <> '0' THEN
                        PERFORM set_config('lock_timeout', least(2000, greatest(1, (500 * extract(epoch
                            FROM current_setting('statement_timeout')::interval))::bigint))::text, true);
                    END IF;
                    -- Not READ COMMITTED: the snapshot may predate a reader that committed
                    -- since.
                    IF current_setting('transaction_isolation') <> 'read committed' THEN
                        PERFORM pylease_refuse_unseen_readers(CASE WHEN pylease_claim.new_tenure
                            THEN 'lease_claim_new' ELSE 'lease_claim' END, ARRAY[pylease_claim.name]);
                    END IF;
                END IF;
                UPDATE pylease_leases AS l
                   SET fence       = greatest(s_fence + 1,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                       acquired_at = t_now,
                       holder      = pylease_claim.holder,
                       ttl         = pylease_claim.ttl,
                       renewed_at  = t_now,
                       expires_at  = t_now + pylease_claim.ttl,
                       released    = false,
                       -- A new tenure: its own data (NULL unless given), no request.
                       data        = pylease_claim.data,
                       release_requested_by = NULL,
                       grants      = l.grants + 1,
                       takeovers   = l.takeovers + CASE WHEN s_freed THEN 0 ELSE 1 END,
                       share_mark  = s_seq
                 WHERE l.name = pylease_claim.name AND l.fence = s_fence AND l.released = s_freed
                   AND l.expires_at <= t_now
                   AND (l.share_mark IS NOT DISTINCT FROM s_seq
                        OR pylease_unshared(pylease_claim.name, s_fence, t_now))
                RETURNING l.fence, pg_sequence_last_value('pylease_share_ids'),
                          current_setting('pylease.history', true)
                     INTO granted, s_last, history;
                IF granted IS NULL THEN
                    -- Read by readers: busy, and nothing was written. (Otherwise the row
                    -- changed since it was read: look again.)
                    IF s_mark IS DISTINCT FROM s_seq
                       AND NOT pylease_unshared(pylease_claim.name, s_fence, t_now) THEN
                        RETURN NULL;
                    END IF;
                ELSIF s_last IS DISTINCT FROM s_mark THEN
                    -- The name's shares go (their readers hold no longer once the fence
                    -- moved), and a reader granted, or renewed, while the update waited for
                    -- the row is seen now: then busy after all.
                    WITH gone AS (
                        DELETE FROM pylease_shared AS s WHERE s.name = pylease_claim.name
                        RETURNING s.epoch = s_fence AND s.expires_at > t_now AS live
                    )
                    SELECT coalesce(bool_or(g.live), false) INTO s_busy FROM gone AS g;
                    IF s_busy THEN
                        RAISE EXCEPTION USING ERRCODE = 'PLBSY';
                    END IF;
                END IF;
            EXCEPTION WHEN lock_not_available OR deadlock_detected OR SQLSTATE 'PLBSY' THEN
                -- The previous holder's fenced transaction is still open, or a reader
                -- came first: not ours yet. (A deadlock: a transaction of a name's
                -- readers that a grant not READ COMMITTED waits for, waiting in turn.)
                RETURN NULL;
            WHEN serialization_failure THEN
                -- Not READ COMMITTED: PostgreSQL's 40001 says the row changed since the
                -- snapshot, a grant came first; the race is lost, as in READ COMMITTED.
                -- pylease's own (a reader the snapshot cannot see) stands.
                GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
                IF failure LIKE 'pylease:%' THEN
                    RAISE;
                END IF;
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
CREATE FUNCTION lease_claim(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim.name, lease_claim.ttl, lease_claim.holder, false, NULL::jsonb);

-- Claim a lease (as lease_claim), recording data with the grant: at most 8192
-- characters as JSON text, else 22023. Beside it, lease_claim has two signatures: a
-- reference without one (to_regproc('lease_claim'), COMMENT ON FUNCTION lease_claim)
-- is ambiguous.
CREATE FUNCTION lease_claim(name text, ttl interval, holder text, data jsonb) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim.name, lease_claim.ttl, lease_claim.holder, false, lease_claim.data);

-- Claim a new tenure (pylease_claim): as lease_claim, except that a tenure of the
-- same holder is never continued. Unexpired, it is busy: another process uses this
-- holder (the Python API and the command line claim so with a holder they were
-- given, contract 5.6). Expired, it is taken over with a new fence, so that the
-- earlier tenure's fenced writes (lease_holds with its fence) fail from then on.
CREATE FUNCTION lease_claim_new(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim_new.name, lease_claim_new.ttl, lease_claim_new.holder, true,
                     NULL::jsonb);

-- Claim a new tenure (as lease_claim_new), recording data with the grant.
CREATE FUNCTION lease_claim_new(name text, ttl interval, holder text, data jsonb) RETURNS bigint
LANGUAGE sql
RETURN pylease_claim(lease_claim_new.name, lease_claim_new.ttl, lease_claim_new.holder, true,
                     lease_claim_new.data);

-- Renew the tenure with this fence of a lease this holder still holds, also past its
-- expiry if nobody took it: a late renewal of an earlier tenure (sent before the
-- lease expired and was granted to the same holder again) then changes nothing. A
-- NULL fence renews whatever tenure the holder has, as lease_renew(name, holder,
-- ttl). Never earlier: another renewer's shorter ttl must not cut short what the
-- owner was granted. A reader (no exclusive tenure matched) renews its share while
-- its epoch is still the name's fence and is the fence given (its tenure). The fence
-- has no DEFAULT: a call with two or three arguments, positional or named, still
-- means the function below alone.
CREATE FUNCTION lease_renew(name text, holder text, ttl interval, fence bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    l_fence bigint;
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
    IF FOUND THEN
        RETURN true;
    END IF;
    -- A reader: its row, while its epoch is still the name's fence (and is the fence
    -- given: a reader's tenure is its epoch). The lease row is locked FOR KEY SHARE
    -- first, so that an exclusive grant comes either before this renewal (the epoch no
    -- longer matches) or after it (and sees the reader).
    IF NOT EXISTS (SELECT FROM pylease_shared AS s
                    WHERE s.name = lease_renew.name AND s.holder = lease_renew.holder) THEN
        RETURN false;
    END IF;
    SELECT l.fence INTO l_fence FROM pylease_leases AS l WHERE l.name = lease_renew.name
       FOR KEY SHARE;
    UPDATE pylease_shared AS s
       SET ttl        = coalesce(lease_renew.ttl, s.ttl),
           renewed_at = t_now,
           expires_at = greatest(s.expires_at, t_now + coalesce(lease_renew.ttl, s.ttl))
     WHERE s.name = lease_renew.name AND s.holder = lease_renew.holder AND s.epoch = l_fence
       AND (lease_renew.fence IS NULL OR s.epoch = lease_renew.fence);
    RETURN FOUND;
END
$$;

-- Renew a lease this holder still holds, whatever its tenure (the function above
-- with a NULL fence; an SQL function inlined into its caller's statement).
CREATE FUNCTION lease_renew(name text, holder text, ttl interval DEFAULT NULL)
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
    t_now   timestamptz := clock_timestamp();
    readers boolean := false;
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

    -- Readers among them (a row in pylease_shared): every lease row of the batch is
    -- first locked FOR KEY SHARE, in name order, so that an exclusive grant comes
    -- either before a reader's renewal or after it (as in lease_renew), and the locks
    -- below are taken in name order still.
    IF EXISTS (SELECT FROM unnest(lease_renew_many.names, lease_renew_many.holders) AS u(n, h)
                 JOIN pylease_shared AS s ON s.name = u.n AND s.holder = u.h) THEN
        PERFORM FROM pylease_leases AS l
          WHERE l.name = ANY (lease_renew_many.names)
          ORDER BY l.name
            FOR KEY SHARE;
        readers := true;
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
    ), shared AS (
        UPDATE pylease_shared AS s
           SET ttl        = coalesce(lease_renew_many.ttl, s.ttl),
               renewed_at = t_now,
               expires_at = greatest(s.expires_at, t_now + coalesce(lease_renew_many.ttl, s.ttl))
          FROM wanted AS w, pylease_leases AS l
         WHERE readers AND s.name = w.n AND s.holder = w.h AND l.name = w.n AND s.epoch = l.fence
           AND (w.f IS NULL OR s.epoch = w.f)
        RETURNING s.name, s.holder
    )
    SELECT w.n, r.name IS NOT NULL OR x.name IS NOT NULL
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h AND (w.f IS NULL OR r.fence = w.f)
      LEFT JOIN shared AS x ON x.name = w.n AND x.holder = w.h
     ORDER BY w.i;
END
$$;

-- Renew many leases in one statement, whatever their tenures (the function above
-- with NULL fences).
CREATE FUNCTION lease_renew_many(names text[], holders text[], ttl interval DEFAULT NULL)
RETURNS TABLE(name text, renewed boolean)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT m.name, m.renewed
      FROM lease_renew_many(lease_renew_many.names, lease_renew_many.holders,
                            lease_renew_many.ttl, NULL::bigint[]) AS m;
END;

-- Renew many leases in one statement, each with its own ttl (NULL: its last
-- one): per element of names, in order, whether it was renewed, the expiry
-- granted and the server's clock when it was (NULLs when not renewed). A
-- client's local expiry is its send time + (expires_at - server_time). As in
-- lease_renew_many, the elements are checked inside the statement.
CREATE FUNCTION lease_renew_each(names text[], holders text[], ttls interval[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF lease_renew_each.ttls IS NULL THEN
        RAISE EXCEPTION 'pylease: ttls must not be NULL' USING ERRCODE = '22023', COLUMN = 'ttls';
    END IF;
    IF lease_renew_each.names IS NULL OR lease_renew_each.holders IS NULL
       OR cardinality(lease_renew_each.names) <> cardinality(lease_renew_each.holders)
       OR cardinality(lease_renew_each.ttls) <> cardinality(lease_renew_each.names)
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_batch(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls);
        PERFORM pylease_refuse_standby('lease_renew_each');
    END IF;

    RETURN QUERY
    WITH wanted AS (
        SELECT u.n, u.h, u.t, u.i
          FROM unnest(lease_renew_each.names, lease_renew_each.holders, lease_renew_each.ttls)
               WITH ORDINALITY AS u(n, h, t, i)
         WHERE CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                      OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                    THEN pylease_check_batch(lease_renew_each.names, lease_renew_each.holders,
                                             lease_renew_each.ttls) IS NULL
                    ELSE true END
    ), locked AS (
        SELECT l.name, w.h, w.t
          FROM wanted AS w JOIN pylease_leases AS l ON l.name = w.n AND l.holder = w.h
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
        RETURNING l.name, l.holder, l.expires_at
    )
    SELECT w.n, r.name IS NOT NULL, r.expires_at, CASE WHEN r.name IS NOT NULL THEN t_now END
      FROM wanted AS w
      LEFT JOIN renewed AS r ON r.name = w.n AND r.holder = w.h
     ORDER BY w.i;
END
$$;

-- Give a lease back, only if this holder still holds it. Without the WAL flush
-- when the release is the first write of its transaction: a release lost in a
-- crash only keeps the lease until its expiry. Every step on the common path is
-- an expression PL/pgSQL evaluates itself (an assignment, not PERFORM, which
-- would start the executor for each call of set_config and pg_notify).
CREATE FUNCTION lease_release(name text, holder text, min_hold interval DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   bigint;
    notify  boolean;
    history text;
    ignored text;
BEGIN
    IF lease_release.name IS NULL OR lease_release.name = '' OR length(lease_release.name) > 200
       OR lease_release.holder IS NULL OR lease_release.holder = ''
       OR length(lease_release.holder) > 200
       OR NOT isfinite(lease_release.min_hold) OR lease_release.min_hold < interval '0'
       OR lease_release.min_hold > interval '366 days'
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', lease_release.name);
        PERFORM pylease_check_key('holder', lease_release.holder);
        IF lease_release.min_hold IS NOT NULL THEN
            PERFORM pylease_check_span('min_hold', lease_release.min_hold);
        END IF;
        PERFORM pylease_refuse_standby('lease_release');
    END IF;

    -- Give up the flush only while this transaction has written nothing (as in
    -- autocommit), so a caller's earlier writes in the same transaction keep their
    -- durability; one who writes after releasing runs SET LOCAL synchronous_commit
    -- = on. (transaction_timestamp() = statement_timestamp() cannot tell: drivers'
    -- extended protocol makes them differ even in autocommit.)
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;

    t_now := clock_timestamp();
    UPDATE pylease_leases AS l
       SET released   = true,
           expires_at = CASE WHEN lease_release.min_hold IS NULL THEN t_now
                             ELSE greatest(t_now, l.acquired_at + lease_release.min_hold) END,
           releases   = l.releases + 1
     WHERE l.name = lease_release.name AND l.holder = lease_release.holder AND NOT l.released
    RETURNING l.fence, l.expires_at <= t_now, current_setting('pylease.history', true)
         INTO freed, notify, history;
    IF freed IS NULL THEN
        RETURN pylease_release_shared(lease_release.name, lease_release.holder, NULL);
    ELSIF history IS NULL OR history IN ('', 'rare', 'none') THEN
        NULL;
    ELSIF history = 'all' THEN
        INSERT INTO pylease_events (at, name, event, holder, fence)
        VALUES (t_now, lease_release.name, 'released', lease_release.holder, freed);
    ELSE
        PERFORM pylease_refuse_history(history);
    END IF;
    IF notify THEN
        ignored := pg_notify('pylease', lease_release.name);
    END IF;
    RETURN true;
END
$$;

-- Give back one tenure: as above, only if this holder still holds the lease and
-- with this fence, so that a late release of an earlier tenure changes nothing once
-- the same holder holds the name again. The fence has no DEFAULT: a call with two or
-- three arguments, positional or named, still means the function above alone.
CREATE FUNCTION lease_release(name text, holder text, min_hold interval, fence bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    freed   bigint;
    notify  boolean;
    history text;
    ignored text;
    s_fence bigint;
    s_rest  boolean[];
    s_queue boolean;
BEGIN
    IF lease_release.name IS NULL OR lease_release.name = '' OR length(lease_release.name) > 200
       OR lease_release.holder IS NULL OR lease_release.holder = ''
       OR length(lease_release.holder) > 200
       OR NOT isfinite(lease_release.min_hold) OR lease_release.min_hold < interval '0'
       OR lease_release.min_hold > interval '366 days'
       OR lease_release.fence IS NULL OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', lease_release.name);
        PERFORM pylease_check_key('holder', lease_release.holder);
        IF lease_release.min_hold IS NOT NULL THEN
            PERFORM pylease_check_span('min_hold', lease_release.min_hold);
        END IF;
        IF lease_release.fence IS NULL THEN
            RAISE EXCEPTION 'pylease: fence must not be NULL' USING ERRCODE = '22023', COLUMN = 'fence';
        END IF;
        PERFORM pylease_refuse_standby('lease_release');
    END IF;

    -- As in the function above: no flush while this transaction has written nothing.
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;

    t_now := clock_timestamp();
    UPDATE pylease_leases AS l
       SET released   = true,
           expires_at = CASE WHEN lease_release.min_hold IS NULL THEN t_now
                             ELSE greatest(t_now, l.acquired_at + lease_release.min_hold) END,
           releases   = l.releases + 1
     WHERE l.name = lease_release.name AND l.holder = lease_release.holder
       AND l.fence = lease_release.fence AND NOT l.released
    RETURNING l.fence, l.expires_at <= t_now, current_setting('pylease.history', true)
         INTO freed, notify, history;
    IF freed IS NULL THEN
        -- No exclusive tenure: a reader's release, as pylease_release_shared (of this
        -- epoch), without the call.
        DELETE FROM pylease_shared AS s
         WHERE s.name = lease_release.name AND s.holder = lease_release.holder
           AND s.epoch = lease_release.fence
        RETURNING (SELECT l.fence FROM pylease_leases AS l WHERE l.name = lease_release.name),
                  (SELECT ARRAY[bool_or(x.epoch = s.epoch AND x.expires_at > t_now),
                                bool_or(x.expires_at <= t_now)]
                     FROM pylease_shared AS x
                    WHERE x.name = lease_release.name AND x.holder <> lease_release.holder),
                  EXISTS (SELECT FROM pylease_waiters AS w
                           WHERE w.name = lease_release.name AND w.expires_at > t_now),
                  current_setting('pylease.history', true)
             INTO s_fence, s_rest, s_queue, history;
        IF NOT FOUND OR s_fence IS DISTINCT FROM lease_release.fence THEN
            RETURN false;
        ELSIF history = 'all' THEN
            INSERT INTO pylease_events (at, name, event, holder, fence)
            VALUES (t_now, lease_release.name, 'released', lease_release.holder, lease_release.fence);
        ELSIF history IS NOT NULL AND history NOT IN ('', 'rare', 'none') THEN
            PERFORM pylease_refuse_history(history);
        END IF;
        IF s_rest[1] IS NOT TRUE OR s_queue THEN
            ignored := pg_notify('pylease', lease_release.name);
        END IF;
        IF s_rest[2] THEN
            DELETE FROM pylease_shared AS s
             WHERE s.name = lease_release.name
               AND s.holder IN (SELECT x.holder FROM pylease_shared AS x
                                 WHERE x.name = lease_release.name AND x.expires_at <= t_now
                                 LIMIT 16 FOR UPDATE SKIP LOCKED);
        END IF;
        RETURN true;
    ELSIF history IS NULL OR history IN ('', 'rare', 'none') THEN
        NULL;
    ELSIF history = 'all' THEN
        INSERT INTO pylease_events (at, name, event, holder, fence)
        VALUES (t_now, lease_release.name, 'released', lease_release.holder, freed);
    ELSE
        PERFORM pylease_refuse_history(history);
    END IF;
    IF notify THEN
        ignored := pg_notify('pylease', lease_release.name);
    END IF;
    RETURN true;
END
$$;

-- Take a lease whatever its state, when its holder last claimed or renewed at
-- least older_than ago; on a free name, a claim. The new fence, or NULL. As in
-- lease_claim, the row is replaced only if it is still as read. From the holder the
-- row names, the expiry never moves earlier: the earlier tenure's owner may still
-- believe what it was granted.
CREATE FUNCTION lease_steal(name text, ttl interval, holder text, older_than interval DEFAULT '0')
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
    s_read    boolean;
    kind      text;
    history   text;
    failure   text;
BEGIN
    PERFORM pylease_check_key('name', lease_steal.name);
    PERFORM pylease_check_ttl('ttl', lease_steal.ttl);
    PERFORM pylease_check_key('holder', lease_steal.holder);
    PERFORM pylease_check_span('older_than', lease_steal.older_than);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_steal');
    END IF;

    -- Not READ COMMITTED, PostgreSQL's 40001 says the row changed since the snapshot:
    -- another grant came first, a race lost as in READ COMMITTED. pylease's own (a
    -- reader the snapshot cannot see) stands.
    BEGIN
        LOOP
            SELECT l.holder, l.fence, l.renewed_at, l.expires_at, l.released,
                   EXISTS (SELECT FROM pylease_shared AS s
                            WHERE s.name = l.name AND s.epoch = l.fence AND s.expires_at > t_now)
              INTO s_holder, s_fence, s_renewed, s_expires, s_freed, s_read
              FROM pylease_leases AS l
             WHERE l.name = lease_steal.name;
            IF NOT FOUND THEN
                INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                                 expires_at, grants)
                VALUES (lease_steal.name, lease_steal.holder,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1,
                        lease_steal.ttl, t_now, t_now, t_now + lease_steal.ttl, 1)
                ON CONFLICT DO NOTHING  -- the name (or its (name, fence) key) exists: another claimer won
                RETURNING l.fence INTO granted;
                kind := 'claimed';
                EXIT;
            END IF;
            -- Never from readers: a steal breaks a writer's lease only.
            IF s_read THEN
                RETURN NULL;
            END IF;
            -- older_than '0' is unconditional: a renewal that commits while the steal waits
            -- for the row (renewed_at later than t_now) must not make it give up.
            IF lease_steal.older_than > interval '0'
               AND s_renewed > t_now - lease_steal.older_than AND s_expires > t_now THEN
                RETURN NULL;
            ELSIF s_fence = 9223372036854775807 THEN
                RAISE EXCEPTION 'pylease: lease % has used every fence (%): it cannot be granted again',
                    quote_literal(lease_steal.name), s_fence USING ERRCODE = '54000';
            END IF;
            -- From an unexpired holder a steal; of a free or expired name what a claim is.
            kind := CASE WHEN s_freed THEN 'claimed' WHEN s_expires <= t_now THEN 'taken_over'
                         ELSE 'stolen' END;

            IF current_setting('transaction_isolation') <> 'read committed' THEN
                PERFORM pylease_refuse_unseen_readers('lease_steal', ARRAY[lease_steal.name]);
            END IF;
            BEGIN
                UPDATE pylease_leases AS l
                   SET fence       = greatest(s_fence + 1,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                       holder      = lease_steal.holder,
                       ttl         = lease_steal.ttl,
                       acquired_at = t_now,
                       renewed_at  = t_now,
                       expires_at  = CASE WHEN NOT s_freed AND s_holder = lease_steal.holder
                                          THEN greatest(l.expires_at, t_now + lease_steal.ttl)
                                          ELSE t_now + lease_steal.ttl END,
                       released    = false,
                       data        = NULL,
                       release_requested_by = NULL,
                       grants      = l.grants + 1,
                       takeovers   = l.takeovers + CASE WHEN kind = 'taken_over' THEN 1 ELSE 0 END,
                       steals      = l.steals + CASE WHEN kind = 'stolen' THEN 1 ELSE 0 END
                 WHERE l.name = lease_steal.name AND l.fence = s_fence AND l.released = s_freed
                   AND l.expires_at = s_expires
                   AND (lease_steal.older_than = interval '0'
                        OR l.renewed_at <= t_now - lease_steal.older_than OR l.expires_at <= t_now)
                RETURNING l.fence INTO granted;
                -- As in lease_claim: a reader granted while the update waited is seen now.
                IF granted IS NOT NULL THEN
                    WITH gone AS (
                        DELETE FROM pylease_shared AS s WHERE s.name = lease_steal.name
                        RETURNING s.epoch = s_fence AND s.expires_at > t_now AS live
                    )
                    SELECT coalesce(bool_or(g.live), false) INTO s_read FROM gone AS g;
                    IF s_read THEN
                        RAISE EXCEPTION USING ERRCODE = 'PLBSY';
                    END IF;
                END IF;
            EXCEPTION WHEN SQLSTATE 'PLBSY' THEN
                RETURN NULL;
            END;
            EXIT WHEN granted IS NOT NULL;
        END LOOP;
    EXCEPTION WHEN serialization_failure THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        IF failure LIKE 'pylease:%' THEN
            RAISE;
        END IF;
        RETURN NULL;
    END;

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

-- True iff this holder holds the unexpired lease with this fence. Locks the row
-- FOR KEY SHARE: every grant changes the fence, a key column, so a fenced write
-- in the caller's transaction and any takeover are serialized, while renewals
-- and releases (no key change) never wait for it.
CREATE FUNCTION lease_holds(name text, holder text, fence bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    IF lease_holds.name IS NULL OR lease_holds.name = '' OR length(lease_holds.name) > 200
       OR lease_holds.holder IS NULL OR lease_holds.holder = '' OR length(lease_holds.holder) > 200
       OR lease_holds.fence IS NULL
    THEN
        PERFORM pylease_check_key('name', lease_holds.name);
        PERFORM pylease_check_key('holder', lease_holds.holder);
        RAISE EXCEPTION 'pylease: fence must not be NULL' USING ERRCODE = '22023', COLUMN = 'fence';
    END IF;

    PERFORM FROM pylease_leases AS l
      WHERE l.name = lease_holds.name AND l.holder = lease_holds.holder
        AND l.fence = lease_holds.fence AND NOT l.released
        AND l.expires_at > clock_timestamp()
        FOR KEY SHARE;
    IF FOUND THEN
        RETURN true;
    END IF;
    -- A reader (fence: its epoch): its unexpired row, while the epoch is still the
    -- name's fence. The row is locked as for the exclusive holder, so a fenced write
    -- and an exclusive grant are serialized in the same way.
    PERFORM FROM pylease_leases AS l
      WHERE l.name = lease_holds.name AND l.fence = lease_holds.fence
        AND EXISTS (SELECT FROM pylease_shared AS s
                     WHERE s.name = l.name AND s.holder = lease_holds.holder
                       AND s.epoch = l.fence AND s.expires_at > clock_timestamp())
        FOR KEY SHARE;
    RETURN FOUND;
END
$$;

-- One row per name ever claimed (all names when name is NULL); held means
-- unexpired and not released; state tells held, resting (released, not yet
-- claimable: min_hold), released and expired apart. SQL, not PL/pgSQL: only SQL
-- lets the argument and the output column share the name "name".
CREATE FUNCTION lease_status(name text DEFAULT NULL)
RETURNS TABLE(name text, holder text, fence bigint, acquired_at timestamptz,
              renewed_at timestamptz, expires_at timestamptz, held boolean,
              state text, ttl interval, shared integer, data jsonb,
              release_requested_by text)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    SELECT l.name,
           CASE WHEN r.n > 0 THEN NULL ELSE l.holder END,
           l.fence,
           CASE WHEN r.n > 0 THEN r.acquired_at ELSE l.acquired_at END,
           CASE WHEN r.n > 0 THEN r.renewed_at ELSE l.renewed_at END,
           CASE WHEN r.n > 0 THEN r.expires_at ELSE l.expires_at END,
           r.n > 0 OR (NOT l.released AND l.expires_at > c.now),
           CASE WHEN r.n > 0 THEN 'shared'
                WHEN l.expires_at > c.now THEN CASE WHEN l.released THEN 'resting' ELSE 'held' END
                WHEN l.released THEN 'released' ELSE 'expired' END,
           CASE WHEN r.n > 0 THEN r.ttl ELSE l.ttl END,
           r.n::integer,
           -- A tenure's: the exclusive holder's data (a released lease's last), and a
           -- step-down request while the tenure lasts.
           CASE WHEN r.n > 0 THEN NULL ELSE l.data END,
           CASE WHEN r.n > 0 OR l.released THEN NULL ELSE l.release_requested_by END
      FROM pylease_leases AS l
     CROSS JOIN (SELECT clock_timestamp() AS now) AS c
     CROSS JOIN LATERAL (
           SELECT count(*) AS n, min(s.acquired_at) AS acquired_at,
                  max(s.renewed_at) AS renewed_at, max(s.expires_at) AS expires_at,
                  max(s.ttl) AS ttl
             FROM pylease_shared AS s
            WHERE s.name = l.name AND s.epoch = l.fence AND s.expires_at > c.now) AS r
     WHERE $1 IS NULL OR l.name = $1
     ORDER BY l.name;
$$;

-- Per name, how many grants (every new tenure), takeovers (after an expiry
-- without a release), steals (from an unexpired holder) and releases there were;
-- a semaphore's are the sums over its slots.
CREATE FUNCTION lease_counters(name text DEFAULT NULL)
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

-- Delete the names (leases and semaphores) that nobody has held for at least
-- idle_for, with their counters; their history stays. How many were deleted. A name
-- read within idle_for stays. Fences never go back: a pruned name's bucket floor is
-- raised to its fence first, in the same transaction, under the bucket's lock. Prune
-- never waits: a bucket in a first grant's hands, a row locked by a claimer, a reader
-- or a fenced transaction is skipped this time.
CREATE FUNCTION lease_prune(idle_for interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cutoff  timestamptz;
    buckets integer[];
    idle    text[];
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

    -- Locked in a statement of their own: a reader whose claim committed before the
    -- lock (it holds the row FOR KEY SHARE until then) is seen by the next statement,
    -- and one that comes after waits for this transaction.
    SELECT array_agg(k.name) INTO idle FROM (
        SELECT l.name FROM pylease_leases AS l
         WHERE l.expires_at <= cutoff AND (hashtext(l.name) & 1023) = ANY (buckets)
           FOR UPDATE SKIP LOCKED) AS k;
    -- A name read within idle_for stays; a name only readers claimed (fence 0) raises
    -- no floor.
    WITH gone AS (
        SELECT l.name, l.fence FROM pylease_leases AS l
         WHERE l.name = ANY (idle)
           AND NOT EXISTS (SELECT FROM pylease_shared AS s
                            WHERE s.name = l.name AND s.expires_at > cutoff)
    ), floors AS (
        INSERT INTO pylease_fence_floors AS fl (bucket, floor)
        SELECT hashtext(g.name) & 1023, max(g.fence) FROM gone AS g WHERE g.fence > 0 GROUP BY 1
        ON CONFLICT (bucket) DO UPDATE SET floor = greatest(fl.floor, excluded.floor)
    ), deleted AS (
        DELETE FROM pylease_leases AS l USING gone AS g WHERE l.name = g.name
        RETURNING l.name
    ), unnamed AS (
        DELETE FROM pylease_names AS n USING deleted AS d WHERE n.name = d.name
    ), shares AS (
        DELETE FROM pylease_shared AS s USING deleted AS d WHERE s.name = d.name
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

COMMENT ON FUNCTION lease_claim(text, interval, text) IS
    'pylease: claim a lease; returns the fence when granted, NULL when another holder''s unexpired lease stands.';
COMMENT ON FUNCTION lease_claim_new(text, interval, text) IS
    'pylease: claim a new tenure; the fence when granted, NULL while anyone''s unexpired lease stands, this holder''s own included.';
COMMENT ON FUNCTION pylease_claim(text, interval, text, boolean, jsonb) IS
    'pylease (internal): the one body of lease_claim (new_tenure false) and lease_claim_new (true), with data or without (NULL).';
COMMENT ON FUNCTION lease_claim(text, interval, text, jsonb) IS
    'pylease: claim a lease, recording data with the grant; the fence when granted, NULL when another holder''s unexpired lease stands.';
COMMENT ON FUNCTION lease_claim_new(text, interval, text, jsonb) IS
    'pylease: claim a new tenure, recording data with the grant; the fence when granted, NULL while anyone''s unexpired lease stands.';
COMMENT ON FUNCTION lease_renew(text, text, interval) IS
    'pylease: extend a lease this holder still holds to the later of its expiry and now + ttl (the last ttl when NULL); false once lost.';
COMMENT ON FUNCTION lease_renew(text, text, interval, bigint) IS
    'pylease: extend the tenure with this fence (NULL: any) of a lease this holder still holds; false once lost.';
COMMENT ON FUNCTION lease_renew_many(text[], text[], interval) IS
    'pylease: renew many leases in one statement; one (name, renewed) row per element, in order.';
COMMENT ON FUNCTION lease_renew_many(text[], text[], interval, bigint[]) IS
    'pylease: renew many leases in one statement, each in the tenure its fence names (NULL: any); one (name, renewed) row per element, in order.';
COMMENT ON FUNCTION lease_renew_each(text[], text[], interval[]) IS
    'pylease: renew many leases in one statement with a ttl each; per element, in order: renewed, the expiry granted, the server''s clock.';
COMMENT ON FUNCTION lease_release(text, text, interval) IS
    'pylease: give back a lease this holder still holds (free again at acquired_at + min_hold at the earliest); NOTIFY pylease when freed.';
COMMENT ON FUNCTION lease_release(text, text, interval, bigint) IS
    'pylease: give back the tenure with this fence if this holder still holds it; as lease_release(name, holder, min_hold) otherwise.';
COMMENT ON FUNCTION lease_steal(text, interval, text, interval) IS
    'pylease: take a lease whatever its state when its holder last renewed at least older_than ago; the new fence or NULL.';
COMMENT ON FUNCTION lease_holds(text, text, bigint) IS
    'pylease: true iff the unexpired lease is held by this holder with this fence; locks the row FOR KEY SHARE against every grant.';
COMMENT ON FUNCTION lease_status(text) IS
    'pylease: one row per lease name (all when name is NULL); held means unexpired and not released; state is held, shared, resting, released or expired; shared counts the readers; data and release_requested_by are the tenure''s.';
COMMENT ON FUNCTION lease_counters(text) IS
    'pylease: per name (leases and semaphores), how many grants, takeovers, steals and releases there were.';
COMMENT ON FUNCTION lease_history(text, timestamptz, integer) IS
    'pylease: recorded events (pylease.history), newest first, since a moment, at most max_rows.';
COMMENT ON FUNCTION lease_prune_history(interval) IS
    'pylease: delete the events older than older_than; returns how many.';

-- The queue of waiting processes ----------------------------------------------

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
-- For the sweep of expired entries (of names nobody waits on any more) that
-- lease_wait and an ungranted lease_unwait end with.
CREATE INDEX pylease_waiters_expires_at ON pylease_waiters (expires_at);

COMMENT ON TABLE pylease_waiters IS
    'pylease: processes waiting for a lease, in arrival order; written only through lease_wait and lease_unwait.';

-- Queue a waiter for a lease name, or refresh its expiry: true when it is the head
-- (the first unexpired waiter), which alone claims again on a release. The expired
-- waiters of the name are removed, and a few expired ones of any name.
CREATE FUNCTION lease_wait(name text, waiter text, ttl interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    head text;
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
    -- An entry committed while the insert waited for a row may have expired since.
    SELECT w.waiter INTO head FROM pylease_waiters AS w
     WHERE w.name = lease_wait.name AND w.expires_at > now_ ORDER BY w.id LIMIT 1;
    -- Last: the sweep waits for no row, and nothing after it waits while it holds some
    -- (so two calls never wait for each other's).
    DELETE FROM pylease_waiters AS w
     WHERE w.id IN (SELECT x.id FROM pylease_waiters AS x WHERE x.expires_at <= now_
                     ORDER BY x.expires_at LIMIT 16 FOR UPDATE SKIP LOCKED);
    RETURN head = lease_wait.waiter;
END
$$;

-- Take a waiter out of the queue of a lease name: true if it was queued. When it
-- was the head, the new head is woken: NOTIFY pylease_waiters with the payload
-- {"name": ..., "waiter": ..., "claim": ...}; claim is true unless the waiter
-- leaves with the lease (granted), whose release will notify pylease as always.
-- Unless granted, a few expired entries of any name are removed, as by lease_wait.
CREATE FUNCTION lease_unwait(name text, waiter text, granted boolean DEFAULT false)
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

COMMENT ON FUNCTION lease_wait(text, text, interval) IS
    'pylease: queue a waiting process for a lease name (or refresh its expiry); true when it is the head.';
COMMENT ON FUNCTION lease_unwait(text, text, boolean) IS
    'pylease: take a waiting process out of the queue; wakes the new head with NOTIFY pylease_waiters.';

REVOKE ALL ON TABLE pylease_waiters FROM PUBLIC;

-- Permits ---------------------------------------------------------------------

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

    start := ((hashtext(pylease_permit_claim.holder) % s_max) + s_max) % s_max;
    IF pylease_permit_claim.permits = 1 AND mine = 0 THEN
        -- One slot for a holder that has none: it is free and locked here, or the
        -- claim is busy having locked nothing (no write, nothing to give back), so no
        -- subtransaction is needed: it would cost the claim a sixth of its time.
        SELECT array_agg(c.slot) INTO taken FROM (
            SELECT p.slot FROM pylease_permits AS p
             WHERE p.name = pylease_permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
               AND NOT EXISTS (SELECT FROM pylease_permits AS q
                                WHERE q.name = pylease_permit_claim.name AND q.slot >= s_max
                                  AND q.slot % s_max = p.slot AND q.expires_at > t_now)
             ORDER BY (p.slot - start + s_max) % s_max
             LIMIT 1
               FOR UPDATE OF p SKIP LOCKED) AS c;
        IF taken IS NULL THEN
            RETURN;
        END IF;
    ELSE
        -- Busy: fewer than permits slots free. Reads only.
        IF (SELECT count(*) FROM pylease_permits AS p
             WHERE p.name = pylease_permit_claim.name AND p.slot < s_max AND p.expires_at <= t_now
               AND NOT EXISTS (SELECT FROM pylease_permits AS q
                                WHERE q.name = pylease_permit_claim.name AND q.slot >= s_max
                                  AND q.slot % s_max = p.slot AND q.expires_at > t_now)
           ) < pylease_permit_claim.permits THEN
            RETURN;
        END IF;
        -- Several slots, or a new tenure that ends the holder's earlier one: locks taken
        -- before the claim turns out busy are given back with the subtransaction.
        BEGIN
            SELECT array_agg(c.slot) INTO taken FROM (
                SELECT p.slot FROM pylease_permits AS p
                 WHERE p.name = pylease_permit_claim.name AND p.slot < s_max
                   AND p.expires_at <= t_now
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
            IF mine > 0 THEN
                -- A new tenure: the holder's expired slots not taken again end with the
                -- earlier one (a slot another transaction keeps locked past lock_timeout,
                -- a renewal or release of the earlier one, makes the claim busy).
                UPDATE pylease_permits AS p SET released = true
                 WHERE p.name = pylease_permit_claim.name
                   AND p.holder = pylease_permit_claim.holder
                   AND NOT p.released AND p.slot <> ALL (taken);
            END IF;
        EXCEPTION WHEN SQLSTATE 'PLBSY' OR lock_not_available OR deadlock_detected THEN
            RETURN;
        END;
    END IF;
    history := current_setting('pylease.history', true);
    IF history NOT IN ('', 'rare', 'all', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    SELECT min(p.slot) INTO worn FROM pylease_permits AS p
     WHERE p.name = pylease_permit_claim.name AND p.slot = ANY (taken)
       AND p.fence = 9223372036854775807;
    IF worn IS NOT NULL THEN
        RAISE EXCEPTION 'pylease: semaphore % has used every fence of slot %: it cannot be granted again',
            quote_literal(pylease_permit_claim.name), worn USING ERRCODE = '54000';
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
END
$$;

-- Claim permits slots of a semaphore (pylease_permit_claim, continuing the slots the
-- holder still holds): an SQL function whose body was parsed when it was created,
-- so no search_path can stand in for the function it calls. STABLE, as every
-- set-returning wrapper here, so that it is inlined into the caller's statement: a
-- VOLATILE one never is, and each call planned its body again (about a sixth of a
-- permit claim's server time). It only reads; the function it calls is VOLATILE, and writes
-- with snapshots of its own.
CREATE FUNCTION permit_claim(name text, max_permits integer, ttl interval,
                                        holder text, permits integer DEFAULT 1)
RETURNS TABLE(slot integer, fence bigint)
LANGUAGE sql STABLE
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
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT c.slot, c.fence
      FROM pylease_permit_claim(permit_claim_new.name, permit_claim_new.max_permits,
                                permit_claim_new.ttl, permit_claim_new.holder,
                                permit_claim_new.permits, true) AS c;
END;

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

-- Give back the tenure of permits that holds slot `slot` with fence `fence`: every slot
-- this holder holds, while it still holds that one (a holder's slots are one tenure,
-- granted together); true when they were all still its own. A late release of an
-- earlier tenure (sent before it expired and a new tenure was granted to the same
-- holder) then frees nothing. A NULL slot or fence matches any (both NULL: as
-- permit_release(name, holder)). The slots are locked first and the tenure is told
-- from the locked rows, as they are once locked. NOTIFY pylease when any was freed;
-- without the WAL flush when the release is the first write of its transaction, as
-- lease_release. Neither slot nor fence has a DEFAULT: a call with two arguments
-- still means permit_release(name, holder) alone.
CREATE FUNCTION permit_release(name text, holder text, slot integer, fence bigint)
RETURNS boolean
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
        SELECT p.slot, p.permits, p.fence FROM pylease_permits AS p
         WHERE p.name = permit_release.name AND p.holder = permit_release.holder AND NOT p.released
         ORDER BY p.slot
           FOR NO KEY UPDATE OF p
    ), tenure AS (
        SELECT k.slot, k.permits FROM locked AS k
         WHERE EXISTS (SELECT FROM locked AS m
                        WHERE (permit_release.slot IS NULL OR m.slot = permit_release.slot)
                          AND (permit_release.fence IS NULL OR m.fence = permit_release.fence))
    ), given AS (
        UPDATE pylease_permits AS p
           SET released   = true,
               expires_at = t_now,
               releases   = p.releases + 1
          FROM tenure AS k
         WHERE p.name = permit_release.name AND p.slot = k.slot
        RETURNING p.slot, p.fence
    ), recorded AS (
        INSERT INTO pylease_events (at, name, event, holder, fence, slot)
        SELECT t_now, permit_release.name, 'released', permit_release.holder, g.fence, g.slot
          FROM given AS g
         WHERE history = 'all'
    )
    SELECT count(*), count(*) = min(k.permits) AND count(*) = max(k.permits)
      INTO freed, whole FROM tenure AS k;
    IF freed = 0 THEN
        RETURN false;
    END IF;
    ignored := pg_notify('pylease', permit_release.name);
    RETURN whole;
END
$$;

-- Give back every slot this holder holds, whatever its tenure (the function above
-- with a NULL slot and fence; an SQL function inlined into its caller's statement).
CREATE OR REPLACE FUNCTION permit_release(name text, holder text) RETURNS boolean
LANGUAGE sql
RETURN permit_release(permit_release.name, permit_release.holder, NULL::integer, NULL::bigint);

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
    failure  text;
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
                       OR l.holder <> pylease_claim_all.holder))
       OR EXISTS (SELECT FROM pylease_leases AS l
                    JOIN pylease_shared AS s ON s.name = l.name AND s.epoch = l.fence
                   WHERE l.name = ANY (pylease_claim_all.names) AND s.expires_at > t_now) THEN
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

        IF current_setting('transaction_isolation') <> 'read committed' THEN
            PERFORM pylease_refuse_unseen_readers(CASE WHEN pylease_claim_all.new_tenure
                THEN 'lease_claim_all_new' ELSE 'lease_claim_all' END, pylease_claim_all.names);
        END IF;
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
                           OR l.holder <> pylease_claim_all.holder))
           OR EXISTS (SELECT FROM pylease_leases AS l
                        JOIN pylease_shared AS s ON s.name = l.name AND s.epoch = l.fence
                       WHERE l.name = ANY (pylease_claim_all.names) AND s.expires_at > t_now) THEN
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
                   data        = CASE WHEN o.own THEN l.data END,
                   release_requested_by = CASE WHEN o.own THEN l.release_requested_by END,
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
    WHEN serialization_failure THEN
        -- As in pylease_claim: a grant that came since the snapshot is a race lost.
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        IF failure LIKE 'pylease:%' THEN
            RAISE;
        END IF;
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
CREATE FUNCTION lease_claim_all(names text[], ttl interval, holder text)
RETURNS TABLE(name text, fence bigint)
LANGUAGE sql STABLE
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
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT c.name, c.fence
      FROM pylease_claim_all(lease_claim_all_new.names, lease_claim_all_new.ttl,
                             lease_claim_all_new.holder, true) AS c;
END;

-- Give back every lease of names that this holder still holds, each only in the
-- tenure fences[i] names (a NULL array or element: whatever tenure the holder has):
-- one (name, released) row per name, in the order of names. So a late release of an
-- earlier tenure of the same holder frees nothing. Rows are locked in name order, and
-- the fence is matched on the locked row. NOTIFY pylease for each name freed; without
-- the WAL flush when this is the first write of its transaction, as lease_release.
-- fences has no DEFAULT: a call with two arguments still means the function below.
CREATE FUNCTION lease_release_all(names text[], holder text, fences bigint[])
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
    IF cardinality(lease_release_all.fences) <> cardinality(lease_release_all.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
    END IF;
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
        SELECT l.name
          FROM unnest(lease_release_all.names) WITH ORDINALITY AS u(n, i)
          JOIN pylease_leases AS l ON l.name = u.n
         WHERE l.holder = lease_release_all.holder AND NOT l.released
           AND (lease_release_all.fences[u.i] IS NULL OR l.fence = lease_release_all.fences[u.i])
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

-- Give back every lease of names that this holder still holds, whatever its tenures
-- (the function above with NULL fences).
CREATE OR REPLACE FUNCTION lease_release_all(names text[], holder text)
RETURNS TABLE(name text, released boolean)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT r.name, r.released
      FROM lease_release_all(lease_release_all.names, lease_release_all.holder,
                             NULL::bigint[]) AS r;
END;
COMMENT ON FUNCTION permit_claim(text, integer, interval, text, integer) IS
    'pylease: claim permits slots of a semaphore of max_permits; a (slot, fence) row per slot when granted, no row when busy.';
COMMENT ON FUNCTION pylease_permit_claim(text, integer, interval, text, integer, boolean) IS
    'pylease (internal): the one body of permit_claim (new_tenure false) and permit_claim_new (true).';
COMMENT ON FUNCTION permit_claim_new(text, integer, interval, text, integer) IS
    'pylease: claim a new tenure of permits slots of a semaphore; no row while this holder''s own slots are live.';
COMMENT ON FUNCTION permit_renew(text, text, interval) IS
    'pylease: extend every slot this holder holds, all or nothing; false once any is lost.';
COMMENT ON FUNCTION permit_release(text, text) IS
    'pylease: free every slot this holder holds; true when they were all still its own. NOTIFY pylease when freed.';
COMMENT ON FUNCTION permit_release(text, text, integer, bigint) IS
    'pylease: free every slot this holder holds while it holds this slot with this fence; true when they were all still its own. NOTIFY pylease when freed.';
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
COMMENT ON FUNCTION pylease_claim_all(text[], interval, text, boolean) IS
    'pylease (internal): the one body of lease_claim_all (new_tenure false) and lease_claim_all_new (true).';
COMMENT ON FUNCTION lease_claim_all_new(text[], interval, text) IS
    'pylease: claim a new tenure of every lease of names, all or nothing; no row while any is live, this holder''s own included.';
COMMENT ON FUNCTION lease_release_all(text[], text) IS
    'pylease: give back every lease of names this holder still holds; a (name, released) row per name.';
COMMENT ON FUNCTION lease_release_all(text[], text, bigint[]) IS
    'pylease: give back every lease of names this holder still holds in the tenure fences[i] names; a (name, released) row per name.';

-- The keeper --------------------------------------------------------------------

-- The keeper's renewal of everything a process holds, whatever its kind, in one
-- statement, each element only in the tenure the keeper knows: per element, in order,
-- whether it was renewed, the expiry granted and the server's clock when it was
-- (NULLs when not). kinds[i] says what element i is: 'lease' renews the lease
-- names[i] of holders[i] while its fence is fences[i]; 'permit' renews every slot of
-- the semaphore names[i] that holders[i] holds, all or nothing as permit_renew does,
-- while it holds slot slots[i] with fence fences[i], and answers the earliest expiry
-- of its slots; 'shared' renews the share of the reader holders[i] of the lease
-- names[i] while its epoch is still the name's fence and is fences[i], and its share's
-- id is slots[i] (a reader's tenure: 0019); 'member' renews the member holders[i] of the group names[i], as
-- group_renew does, while it is live with the incarnation fences[i] (0015). A NULL
-- fences or slots (array or element) matches any tenure of the holder. So a late renewal of an earlier tenure (sent before it expired and was
-- granted to the same holder again) renews nothing. Each at its own ttl (NULL: its
-- last one). One element's loss or kind mismatch (a lease element of a semaphore's
-- name) is that element's false, never an error of the others. Lease rows are locked
-- in name order, then slots in (name, slot) order, as by every statement that locks
-- several: two keepers of overlapping sets never deadlock. A batch of leases and
-- members alone is one statement (0022). Internal: the keeper's, not part of the
-- contract.
CREATE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[], ttls interval[],
                                   fences bigint[], slots integer[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz,
              release_requested_by text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    members boolean;
    o_at    bigint[];
    o_exp   timestamptz[];
    s_at    bigint[];
    s_exp   timestamptz[];
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
    -- Tests of whole arrays that PL/pgSQL evaluates itself, without a query: <@ is
    -- false for an array holding a NULL.
    IF pylease_renew_held.kinds IS NULL
       OR cardinality(pylease_renew_held.kinds) <> cardinality(pylease_renew_held.names)
       OR NOT pylease_renew_held.kinds <@ '{lease,shared,permit,member}'::text[]
    THEN
        RAISE EXCEPTION 'pylease: kinds must hold ''lease'', ''shared'', ''permit'' or ''member'' for each element of names'
            USING ERRCODE = '22023', COLUMN = 'kinds';
    END IF;
    IF cardinality(pylease_renew_held.fences) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: fences must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'fences';
    ELSIF cardinality(pylease_renew_held.slots) <> cardinality(pylease_renew_held.names) THEN
        RAISE EXCEPTION 'pylease: slots must have one element (or NULL) per element of names'
            USING ERRCODE = '22023', COLUMN = 'slots';
    END IF;
    members := 'member' = ANY (pylease_renew_held.kinds);

    -- Readers and semaphores, each kind in a statement of its own before the one below,
    -- their answers kept in o_exp (expiries, by position). A batch of leases and members
    -- alone (a keeper's usual one) runs the statement below only.
    IF pylease_renew_held.kinds && '{shared,permit}'::text[] THEN
        -- Every lease row of the batch's leases and readers is locked FOR KEY SHARE, in
        -- name order (as in lease_renew_many), so that an exclusive grant comes either
        -- before a reader's renewal or after it; the batch's own leases are then locked
        -- FOR NO KEY UPDATE, in name order, before any share or slot, as in every
        -- statement that locks several rows (the statement below finds them locked).
        IF 'shared' = ANY (pylease_renew_held.kinds) THEN
            PERFORM FROM pylease_leases AS l
              WHERE l.name IN (SELECT u.n FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names)
                                               AS u(k, n)
                                WHERE u.k IN ('lease', 'shared'))
              ORDER BY l.name
                FOR KEY SHARE;
        END IF;
        IF 'lease' = ANY (pylease_renew_held.kinds) THEN
            PERFORM FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                                pylease_renew_held.holders) WITH ORDINALITY AS u(k, n, h, i)
                    JOIN pylease_leases AS l
                      ON l.name = u.n AND l.holder = u.h
                     AND (pylease_renew_held.fences[u.i] IS NULL OR l.fence = pylease_renew_held.fences[u.i])
              WHERE u.k = 'lease' AND NOT l.released
              ORDER BY l.name
                FOR NO KEY UPDATE OF l;
        END IF;

        -- Readers, as lease_renew: while their epoch is still the name's fence, and is
        -- fences[i], and their share is slots[i] (the share's id: its tenure, 0019).
        IF 'shared' = ANY (pylease_renew_held.kinds) THEN
            WITH wanted AS (
                SELECT u.n, u.h, u.t, pylease_renew_held.fences[u.i] AS f,
                       pylease_renew_held.slots[u.i] AS p, u.i
                  FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                              pylease_renew_held.holders, pylease_renew_held.ttls)
                       WITH ORDINALITY AS u(k, n, h, t, i)
                 WHERE u.k = 'shared'
                   AND CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                              OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                              OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                            THEN pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                                     pylease_renew_held.ttls) IS NULL
                            ELSE true END
            ), renewed AS (
                UPDATE pylease_shared AS s
                   SET ttl        = coalesce(w.t, s.ttl),
                       renewed_at = t_now,
                       expires_at = greatest(s.expires_at, t_now + coalesce(w.t, s.ttl))
                  FROM wanted AS w, pylease_leases AS l
                 WHERE s.name = w.n AND s.holder = w.h AND l.name = w.n AND s.epoch = l.fence
                   AND (w.f IS NULL OR s.epoch = w.f) AND (w.p IS NULL OR s.share = w.p)
                RETURNING s.name, s.holder, s.expires_at
            )
            SELECT array_agg(w.i), array_agg(r.expires_at) INTO o_at, o_exp
              FROM wanted AS w JOIN renewed AS r ON r.name = w.n AND r.holder = w.h;
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
            SELECT array_agg(w.i), array_agg(r.expires_at) INTO s_at, s_exp
              FROM wanted AS w
              JOIN (SELECT r.name, r.holder, min(r.expires_at) AS expires_at
                      FROM renewed AS r GROUP BY r.name, r.holder) AS r
                ON r.name = w.n AND r.holder = w.h;
            o_at := o_at || s_at;
            o_exp := o_exp || s_exp;
        END IF;
        -- By position, for the statement below: o_exp[i] is element i's expiry.
        o_exp := ARRAY(SELECT o.e
                         FROM unnest(pylease_renew_held.names) WITH ORDINALITY AS u(n, i)
                         LEFT JOIN unnest(o_at, o_exp) AS o(i, e) ON o.i = u.i
                        ORDER BY u.i);
    END IF;

    -- Leases, as lease_renew_each, in their tenures (a lease named twice: at the longest
    -- ttl it was named with), and members of groups, as group_renew: names[i] is the
    -- group, holders[i] the member, fences[i] its incarnation (NULL: whichever is live);
    -- a member past its expiry is not renewed (the others have counted it out, and it
    -- joins again). Then every element's answer, in its place. One statement: each
    -- further one cost a tick of 65 elements about a tenth of lease_renew_many's. No
    -- other statement locks a member and a lease, so the order of those two is free.
    -- FOR NO KEY UPDATE passes the FOR KEY SHARE of a holder's fenced transaction.
    RETURN QUERY
    WITH wanted AS (
        SELECT u.k, u.n, u.h, u.t, pylease_renew_held.fences[u.i] AS f, u.i
          FROM unnest(pylease_renew_held.kinds, pylease_renew_held.names,
                      pylease_renew_held.holders, pylease_renew_held.ttls)
               WITH ORDINALITY AS u(k, n, h, t, i)
         WHERE CASE WHEN u.n IS NULL OR u.n = '' OR length(u.n) > 200
                      OR u.h IS NULL OR u.h = '' OR length(u.h) > 200
                      OR NOT isfinite(u.t) OR u.t <= interval '0' OR u.t > interval '366 days'
                    THEN pylease_check_batch(pylease_renew_held.names, pylease_renew_held.holders,
                                             pylease_renew_held.ttls) IS NULL
                    ELSE true END
    ), locked AS (
        SELECT l.name, w.h, w.t
          FROM wanted AS w JOIN pylease_leases AS l
            ON l.name = w.n AND l.holder = w.h AND (w.f IS NULL OR l.fence = w.f)
         WHERE w.k = 'lease' AND NOT l.released
         ORDER BY l.name
           FOR NO KEY UPDATE OF l
    ), grouped AS (
        SELECT k.name, k.h, max(k.t) AS t FROM locked AS k GROUP BY k.name, k.h
    ), renewed AS (
        UPDATE pylease_leases AS l
           SET ttl        = coalesce(g.t, l.ttl),
               renewed_at = t_now,
               expires_at = greatest(l.expires_at, t_now + coalesce(g.t, l.ttl))
          FROM grouped AS g
         WHERE l.name = g.name AND l.holder = g.h
        RETURNING l.name, l.holder, l.fence, l.expires_at, l.release_requested_by
    ), kept AS (
        UPDATE pylease_members AS m
           SET ttl        = coalesce(w.t, m.ttl),
               renewed_at = t_now,
               expires_at = greatest(m.expires_at, t_now + coalesce(w.t, m.ttl))
          FROM wanted AS w
         WHERE members AND w.k = 'member' AND m.grp = w.n AND m.member = w.h
           AND m.expires_at > t_now AND (w.f IS NULL OR m.incarnation = w.f)
        RETURNING m.grp, m.member, m.incarnation, m.expires_at
    )
    SELECT w.n, x.e IS NOT NULL, x.e, CASE WHEN x.e IS NOT NULL THEN t_now END, r.release_requested_by
      FROM wanted AS w
      LEFT JOIN renewed AS r
        ON w.k = 'lease' AND r.name = w.n AND r.holder = w.h AND (w.f IS NULL OR r.fence = w.f)
      LEFT JOIN kept AS m
        ON w.k = 'member' AND m.grp = w.n AND m.member = w.h AND (w.f IS NULL OR m.incarnation = w.f)
      CROSS JOIN LATERAL (SELECT coalesce(r.expires_at, m.expires_at, o_exp[w.i]) AS e) AS x
     ORDER BY w.i;
END
$$;

-- The keeper's renewal of 0009, whatever the tenures (the function above with NULL
-- fences and slots): a keeper of an earlier pylease still calls it.
CREATE FUNCTION pylease_renew_held(kinds text[], names text[], holders text[],
                                              ttls interval[])
RETURNS TABLE(name text, renewed boolean, expires_at timestamptz, server_time timestamptz)
LANGUAGE sql
BEGIN ATOMIC
    SELECT h.name, h.renewed, h.expires_at, h.server_time
      FROM pylease_renew_held(pylease_renew_held.kinds, pylease_renew_held.names,
                              pylease_renew_held.holders, pylease_renew_held.ttls,
                              NULL::bigint[], NULL::integer[]) AS h;
END;

COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[]) IS
    'pylease (internal, the keeper''s): renew leases and permits of several holders in one statement, each at its own ttl.';
COMMENT ON FUNCTION pylease_renew_held(text[], text[], text[], interval[], bigint[], integer[]) IS
    'pylease (internal, the keeper''s): renew leases, readers'' shares, permits and members of groups of several holders in one statement, each at its own ttl and in the tenure its fence names (a reader''s: its epoch; a member''s: its incarnation); a lease''s step-down request.';

-- Readers ---------------------------------------------------------------------

-- The one body of a reader's claim, lease_claim_shared's and the Python API's: (the
-- epoch, the share's id) when granted (the epoch: the fence of the name's latest
-- exclusive grant, 0 if none), NULLs when an exclusive holder holds the name or a writer
-- waits in the queue of waiting processes. A busy claim is answered by one read (no row
-- lock, no WAL). A grant locks the lease row FOR KEY SHARE and the name's reader-writer
-- lock shared, and writes only the reader's own row, so readers never wait for each
-- other (only a reader that finds an exclusive holder dead marks the row released,
-- the takeover it is). new_tenure false (lease_claim_shared):
-- a claim again by a reader of this epoch continues its share (its id, never an earlier
-- expiry: a retried claim whose reply was lost). new_tenure true (for a holder the
-- caller chose): busy while this holder's share of the epoch is unexpired (another
-- process, or an earlier block whose release is still on its way, uses this holder);
-- else a new share with an id of its own, which that earlier block's late release or
-- renewal does not name. Internal, not part of the contract.
CREATE FUNCTION pylease_claim_shared(name text, ttl interval, holder text, new_tenure boolean,
                                     OUT epoch bigint, OUT share integer)
-- Waits at most lock_timeout for an exclusive grant under way (or the exclusive
-- holder's renewal), then counts as busy.
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now     timestamptz := clock_timestamp();
    s_holder  text;
    s_fence   bigint;
    s_freed   boolean;
    s_expires timestamptz;
    s_mine    boolean;
    s_queued  boolean;
    s_share   integer;
    s_lock    text;
    history   text;
BEGIN
    IF pylease_claim_shared.name IS NULL OR pylease_claim_shared.name = ''
       OR length(pylease_claim_shared.name) > 200
       OR pylease_claim_shared.ttl IS NULL OR NOT isfinite(pylease_claim_shared.ttl)
       OR pylease_claim_shared.ttl <= interval '0' OR pylease_claim_shared.ttl > interval '366 days'
       OR pylease_claim_shared.holder IS NULL OR pylease_claim_shared.holder = ''
       OR length(pylease_claim_shared.holder) > 200 OR pylease_claim_shared.new_tenure IS NULL
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_key('name', pylease_claim_shared.name);
        PERFORM pylease_check_ttl('ttl', pylease_claim_shared.ttl);
        PERFORM pylease_check_key('holder', pylease_claim_shared.holder);
        IF pylease_claim_shared.new_tenure IS NULL THEN
            RAISE EXCEPTION 'pylease: new_tenure must not be NULL'
                USING ERRCODE = '22023', COLUMN = 'new_tenure';
        END IF;
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby('lease_claim_shared');
        END IF;
        PERFORM pylease_refuse_read_only('lease_claim_shared');
    END IF;

    LOOP
        -- Busy, decided by one read (no row lock, no WAL): an exclusive holder whose
        -- lease is unexpired (or resting after a min_hold release), or a writer
        -- waiting in the queue of waiting processes (writer preference), unless this
        -- holder reads the name already (a retried claim); for a new tenure, this
        -- holder's unexpired share of the epoch too. A row that no writer was ever
        -- granted (no holder) holds nothing: it expires at the start of the first
        -- claim that made it, which may come after this claim's start.
        SELECT l.holder, l.fence, l.released, l.expires_at,
               EXISTS (SELECT FROM pylease_shared AS s
                        WHERE s.name = l.name AND s.holder = pylease_claim_shared.holder
                          AND s.epoch = l.fence
                          AND (NOT pylease_claim_shared.new_tenure OR s.expires_at > t_now)),
               EXISTS (SELECT FROM pylease_waiters AS w
                        WHERE w.name = l.name AND w.expires_at > t_now)
          INTO s_holder, s_fence, s_freed, s_expires, s_mine, s_queued
          FROM pylease_leases AS l
         WHERE l.name = pylease_claim_shared.name;
        IF NOT FOUND THEN
            -- The name's first claim: a row for readers to lock (no holder; its fence
            -- the floor, pylease_register_lease); a conflict: another first claim made it.
            INSERT INTO pylease_leases AS l (name, holder, fence, ttl, acquired_at, renewed_at,
                                             expires_at, released)
            VALUES (pylease_claim_shared.name, NULL, 0, pylease_claim_shared.ttl, t_now, t_now,
                    t_now, true)
            ON CONFLICT DO NOTHING;
            CONTINUE;
        ELSIF (s_holder IS NOT NULL AND s_expires > t_now) OR (s_queued AND NOT s_mine)
              OR (s_mine AND pylease_claim_shared.new_tenure) THEN
            RETURN;
        END IF;

        IF current_setting('statement_timeout') <> '0' THEN
            PERFORM set_config('lock_timeout', least(2000, greatest(1, (500 * extract(epoch
                FROM current_setting('statement_timeout')::interval))::bigint))::text, true);
        END IF;
        BEGIN
            -- Shared, so readers never wait for each other: an exclusive grant whose
            -- snapshot may be older than this claim (not READ COMMITTED) takes it alone
            -- before it looks at the row's lockers (pylease_refuse_unseen_readers).
            -- (READ COMMITTED grants need no such lock: this claim draws its share's id
            -- after it locked the row, and a grant that finds a later id than the one
            -- it recorded looks again once it holds the row, pylease_claim.)
            s_lock := pg_advisory_xact_lock_shared(1886155383, hashtext(pylease_claim_shared.name));
            -- Locked FOR KEY SHARE, the row stays as read here until this transaction
            -- ends: no exclusive grant (it changes the fence, a key column) and no prune
            -- comes between.
            SELECT l.holder, l.fence, l.released, l.expires_at
              INTO s_holder, s_fence, s_freed, s_expires
              FROM pylease_leases AS l
             WHERE l.name = pylease_claim_shared.name
               FOR KEY SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'PLAGN';  -- pruned meanwhile
            ELSIF s_holder IS NOT NULL AND s_expires > t_now THEN
                RAISE EXCEPTION USING ERRCODE = 'PLBSY';
            ELSIF NOT s_freed THEN
                -- The exclusive holder died (its ttl ran out without a release): the row
                -- is marked released, so that its late renewal cannot make it hold again
                -- beside this reader. The one write of a reader to the row, counted and
                -- recorded as the takeover it is; a renewal that came first wins.
                UPDATE pylease_leases AS l
                   SET released  = true,
                       takeovers = l.takeovers + 1
                 WHERE l.name = pylease_claim_shared.name AND l.fence = s_fence
                   AND NOT l.released AND l.expires_at <= t_now;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'PLAGN';
                END IF;
                history := current_setting('pylease.history', true);
                IF history IS NULL OR history IN ('', 'rare', 'all') THEN
                    INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
                    VALUES (t_now, pylease_claim_shared.name, 'taken_over',
                            pylease_claim_shared.holder, s_fence, s_holder);
                ELSIF history <> 'none' THEN
                    PERFORM pylease_refuse_history(history);
                END IF;
            END IF;
            -- A retried claim of this epoch keeps its share (its id and acquired_at)
            -- and never moves its expiry earlier; a row of an earlier epoch is a share
            -- that was lost, and a new tenure's is a new share (the id the insert drew).
            -- A new tenure's claim that meets this holder's unexpired share of the epoch
            -- (another claim of it committed meanwhile) changes nothing and is busy.
            INSERT INTO pylease_shared AS s (name, holder, epoch, ttl, acquired_at, renewed_at,
                                             expires_at)
            VALUES (pylease_claim_shared.name, pylease_claim_shared.holder, s_fence,
                    pylease_claim_shared.ttl, t_now, t_now, t_now + pylease_claim_shared.ttl)
            ON CONFLICT (name, holder) DO UPDATE
               SET acquired_at = CASE WHEN s.epoch = excluded.epoch AND NOT pylease_claim_shared.new_tenure
                                      THEN s.acquired_at ELSE excluded.acquired_at END,
                   expires_at  = CASE WHEN s.epoch = excluded.epoch AND NOT pylease_claim_shared.new_tenure
                                      THEN greatest(s.expires_at, excluded.expires_at)
                                      ELSE excluded.expires_at END,
                   share       = CASE WHEN s.epoch = excluded.epoch AND NOT pylease_claim_shared.new_tenure
                                      THEN s.share ELSE excluded.share END,
                   epoch       = excluded.epoch,
                   ttl         = excluded.ttl,
                   renewed_at  = excluded.renewed_at
             WHERE NOT (pylease_claim_shared.new_tenure AND s.epoch = excluded.epoch
                        AND s.expires_at > t_now)
            RETURNING s.share INTO s_share;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'PLBSY';
            END IF;
        EXCEPTION
            WHEN lock_not_available OR SQLSTATE 'PLBSY' THEN
                RETURN;
            WHEN SQLSTATE 'PLAGN' THEN
                CONTINUE;  -- the row changed since it was read: decide again
        END;
        IF NOT s_mine THEN
            history := current_setting('pylease.history', true);
            IF history = 'all' THEN
                INSERT INTO pylease_events (at, name, event, holder, fence)
                VALUES (t_now, pylease_claim_shared.name, 'claimed', pylease_claim_shared.holder,
                        s_fence);
            ELSIF history IS NOT NULL AND history NOT IN ('', 'rare', 'none') THEN
                PERFORM pylease_refuse_history(history);
            END IF;
        END IF;
        epoch := s_fence;
        share := s_share;
        RETURN;
    END LOOP;
END
$$;

-- Claim a share of a lease (a reader), as pylease_claim_shared continuing a share of
-- this holder: the epoch when granted, NULL when busy (an SQL function inlined into
-- its caller's statement: a field of the call, not a subquery, which PostgreSQL never
-- inlines and planned again on every call).
CREATE FUNCTION lease_claim_shared(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE sql
RETURN (pylease_claim_shared(lease_claim_shared.name, lease_claim_shared.ttl,
                             lease_claim_shared.holder, false)).epoch;

-- A reader's release, for lease_release once no exclusive tenure of the holder was
-- found, and for pylease_release_share: its share (of this epoch, and with this id,
-- when given) is deleted; true when it was still its own (no exclusive grant since its
-- epoch). NOTIFY pylease when it was the last reader, or while a writer waits. One
-- statement deletes the share and reads what the rest decides on (the name's fence,
-- the other readers, the queue), as its snapshot had them before the delete; the
-- 4-argument lease_release does the same itself (it saves a call here, whose pinned
-- search_path is set and restored on every call).
CREATE FUNCTION pylease_release_shared(lease text, reader text, epoch bigint, share integer)
RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    t_now   timestamptz := clock_timestamp();
    s_epoch bigint;
    s_fence bigint;
    s_rest  boolean[];
    s_queue boolean;
    history text;
    ignored text;
BEGIN
    DELETE FROM pylease_shared AS s
     WHERE s.name = lease AND s.holder = reader
       AND (pylease_release_shared.epoch IS NULL OR s.epoch = pylease_release_shared.epoch)
       AND (pylease_release_shared.share IS NULL OR s.share = pylease_release_shared.share)
    RETURNING s.epoch,
              (SELECT l.fence FROM pylease_leases AS l WHERE l.name = lease),
              -- Another unexpired reader of this epoch remains; expired shares remain.
              (SELECT ARRAY[bool_or(x.epoch = s.epoch AND x.expires_at > t_now),
                            bool_or(x.expires_at <= t_now)]
                 FROM pylease_shared AS x WHERE x.name = lease AND x.holder <> reader),
              EXISTS (SELECT FROM pylease_waiters AS w WHERE w.name = lease AND w.expires_at > t_now),
              current_setting('pylease.history', true)
         INTO s_epoch, s_fence, s_rest, s_queue, history;
    IF NOT FOUND OR s_epoch IS DISTINCT FROM s_fence THEN
        RETURN false;  -- none, or a writer was granted since: the share was no longer its own
    ELSIF history = 'all' THEN
        INSERT INTO pylease_events (at, name, event, holder, fence)
        VALUES (t_now, lease, 'released', reader, s_epoch);
    ELSIF history IS NOT NULL AND history NOT IN ('', 'rare', 'none') THEN
        PERFORM pylease_refuse_history(history);
    END IF;
    -- The last reader wakes the waiters; while a writer waits (no reader comes in
    -- meanwhile), every reader that leaves does, since two readers leaving at once
    -- may each see the other still there.
    IF s_rest[1] IS NOT TRUE OR s_queue THEN
        ignored := pg_notify('pylease', lease);
    END IF;
    -- A few expired shares of the name (readers that died) go; none is waited for.
    IF s_rest[2] THEN
        DELETE FROM pylease_shared AS s
         WHERE s.name = lease
           AND s.holder IN (SELECT x.holder FROM pylease_shared AS x
                             WHERE x.name = lease AND x.expires_at <= t_now
                             LIMIT 16 FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN true;
END
$$;

-- As above, whatever the share's id (lease_release's).
CREATE FUNCTION pylease_release_shared(lease text, reader text, epoch bigint) RETURNS boolean
LANGUAGE sql
RETURN pylease_release_shared(lease, reader, epoch, NULL::integer);

-- Give back one share (a reader's tenure), named by its epoch and its id, as
-- pylease_claim_shared answered them: a late release of an earlier share of the same
-- holder then deletes nothing of a later one. True when it was still its own. Commits
-- without waiting for the WAL flush, as lease_release. Internal, not part of the
-- contract.
CREATE FUNCTION pylease_release_share(name text, holder text, epoch bigint, share integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    ignored text;
BEGIN
    IF pylease_release_share.name IS NULL OR pylease_release_share.name = ''
       OR length(pylease_release_share.name) > 200
       OR pylease_release_share.holder IS NULL OR pylease_release_share.holder = ''
       OR length(pylease_release_share.holder) > 200
       OR pylease_release_share.epoch IS NULL OR pylease_release_share.share IS NULL
       OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_key('name', pylease_release_share.name);
        PERFORM pylease_check_key('holder', pylease_release_share.holder);
        IF pylease_release_share.epoch IS NULL THEN
            RAISE EXCEPTION 'pylease: epoch must not be NULL' USING ERRCODE = '22023', COLUMN = 'epoch';
        ELSIF pylease_release_share.share IS NULL THEN
            RAISE EXCEPTION 'pylease: share must not be NULL' USING ERRCODE = '22023', COLUMN = 'share';
        END IF;
        PERFORM pylease_refuse_standby('lease_release');
    END IF;
    -- As lease_release: no flush while this transaction has written nothing.
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;
    RETURN pylease_release_shared(pylease_release_share.name, pylease_release_share.holder,
                                  pylease_release_share.epoch, pylease_release_share.share);
END
$$;

-- Every current holder of every kind: the exclusive holder, the readers, the
-- holders of a semaphore's slots.
CREATE FUNCTION lease_holders(name text DEFAULT NULL)
RETURNS TABLE(name text, holder text, mode text, slot integer, fence bigint,
              acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_key('name', $1) WHERE $1 IS NOT NULL;
    WITH c AS (SELECT clock_timestamp() AS now)
    SELECT h.name, h.holder, h.mode, h.slot, h.fence, h.acquired_at, h.renewed_at, h.expires_at
      FROM (SELECT l.name, l.holder, 'exclusive' AS mode, NULL::integer AS slot, l.fence,
                   l.acquired_at, l.renewed_at, l.expires_at
              FROM pylease_leases AS l, c
             WHERE ($1 IS NULL OR l.name = $1) AND NOT l.released AND l.expires_at > c.now
            UNION ALL
            SELECT s.name, s.holder, 'shared', NULL, s.epoch, s.acquired_at, s.renewed_at,
                   s.expires_at
              FROM pylease_shared AS s
              JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch, c
             WHERE ($1 IS NULL OR s.name = $1) AND s.expires_at > c.now
            UNION ALL
            SELECT p.name, p.holder, 'permit', p.slot, p.fence, p.acquired_at, p.renewed_at,
                   p.expires_at
              FROM pylease_permits AS p, c
             WHERE ($1 IS NULL OR p.name = $1) AND NOT p.released AND p.expires_at > c.now
           ) AS h
     ORDER BY h.name, h.mode, h.slot, h.holder;
$$;

COMMENT ON FUNCTION pylease_claim_shared(text, interval, text, boolean) IS
    'pylease (internal): claim a share of a lease (a reader); (epoch, share id) when granted, NULLs when busy; new_tenure: busy while this holder''s share is live, else a new share.';
COMMENT ON FUNCTION pylease_release_share(text, text, bigint, integer) IS
    'pylease (internal): give back the share with this epoch and id of a reader; true when it was still its own.';
COMMENT ON FUNCTION lease_claim_shared(text, interval, text) IS
    'pylease: claim a share of a lease (a reader); the epoch when granted, NULL while an exclusive holder holds it or a writer waits.';
COMMENT ON FUNCTION lease_holders(text) IS
    'pylease: every current holder of every kind (exclusive, shared, permit), of one name or all.';

-- Data and step-down requests ---------------------------------------------------

-- Replace the data of the tenure with this fence (NULL: whichever tenure) of a lease
-- this holder still holds, also past its expiry if nobody took it (as lease_renew):
-- true when it did. Watchers of the name are told (pylease_tell_watchers).
CREATE FUNCTION lease_set_data(name text, holder text, data jsonb, fence bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    PERFORM pylease_check_key('name', lease_set_data.name);
    PERFORM pylease_check_key('holder', lease_set_data.holder);
    PERFORM pylease_check_data(lease_set_data.data);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_set_data');
    END IF;
    -- FOR NO KEY UPDATE (data is no key): passes a holder's fenced transaction.
    UPDATE pylease_leases AS l
       SET data = lease_set_data.data
     WHERE l.name = lease_set_data.name AND l.holder = lease_set_data.holder AND NOT l.released
       AND (lease_set_data.fence IS NULL OR l.fence = lease_set_data.fence);
    RETURN FOUND;
END
$$;

-- Replace the data of a lease this holder still holds, whatever its tenure (the
-- function above with a NULL fence).
CREATE FUNCTION lease_set_data(name text, holder text, data jsonb) RETURNS boolean
LANGUAGE sql
RETURN lease_set_data(lease_set_data.name, lease_set_data.holder, lease_set_data.data, NULL::bigint);

-- Ask the holder of a lease to step down: true when the lease is held (unexpired, not
-- released), and then its holder's keeper is told at its next renewal
-- (pylease_renew_held's release_requested_by). The request belongs to the tenure: it
-- stays until the tenure ends, so a renewal whose reply was lost loses nothing; the
-- first requester's name is kept. Not executable by PUBLIC (an operator's).
CREATE FUNCTION lease_request_release(name text, requested_by text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    PERFORM pylease_check_key('name', lease_request_release.name);
    PERFORM pylease_check_key('requested_by', lease_request_release.requested_by);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_request_release');
    END IF;
    UPDATE pylease_leases AS l
       SET release_requested_by = coalesce(l.release_requested_by,
                                           lease_request_release.requested_by)
     WHERE l.name = lease_request_release.name AND NOT l.released
       AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END
$$;

-- Watchers ----------------------------------------------------------------------

-- The names somebody watches, one row per watcher, while it refreshes its expiry
-- (lease_watch): a grant tells watchers only of these names, so that a name nobody
-- watches costs its grants one probe of this table's key.
CREATE TABLE pylease_watchers (
    name       text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    watcher    text        NOT NULL CHECK (length(watcher) BETWEEN 1 AND 200),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, watcher)
);

COMMENT ON TABLE pylease_watchers IS
    'pylease: the names watched for changes of holder; written only through lease_watch and lease_unwatch.';


-- Watch a lease name for changes of holder, or refresh the watch: true when it was
-- not watched by this watcher (a new entry, or one that had expired). While the entry
-- is unexpired, every grant, release and change of data of the name sends NOTIFY
-- pylease_holders (pylease_tell_watchers). A watcher refreshes it well within its
-- ttl; one that vanished stops costing anything once it expired. A few expired
-- entries of any name are removed.
CREATE FUNCTION lease_watch(name text, watcher text, ttl interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    was  timestamptz;
BEGIN
    PERFORM pylease_check_key('name', lease_watch.name);
    PERFORM pylease_check_key('watcher', lease_watch.watcher);
    PERFORM pylease_check_ttl('ttl', lease_watch.ttl);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_watch');
    END IF;
    -- An entry lost in a crash is harmless (its watcher registers again when it
    -- refreshes, and reads the status then): no flush.
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT w.expires_at INTO was FROM pylease_watchers AS w
     WHERE w.name = lease_watch.name AND w.watcher = lease_watch.watcher;
    INSERT INTO pylease_watchers AS w (name, watcher, expires_at)
    VALUES (lease_watch.name, lease_watch.watcher, now_ + lease_watch.ttl)
    ON CONFLICT ON CONSTRAINT pylease_watchers_pkey DO UPDATE SET expires_at = excluded.expires_at;
    -- The lease row says it is watched, so that its changes call the trigger (a row made
    -- later is marked by pylease_mark_watched).
    UPDATE pylease_leases AS l SET watched = true
     WHERE l.name = lease_watch.name AND NOT l.watched;
    DELETE FROM pylease_watchers AS w
     WHERE (w.name, w.watcher) IN (SELECT x.name, x.watcher FROM pylease_watchers AS x
                                    WHERE x.expires_at <= now_
                                    LIMIT 16 FOR UPDATE SKIP LOCKED);
    RETURN was IS NULL OR was <= now_;
END
$$;

-- Stop watching a lease name: true if this watcher watched it.
CREATE FUNCTION lease_unwatch(name text, watcher text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pylease_check_key('name', lease_unwatch.name);
    PERFORM pylease_check_key('watcher', lease_unwatch.watcher);
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('lease_unwatch');
    END IF;
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    DELETE FROM pylease_watchers AS w
     WHERE w.name = lease_unwatch.name AND w.watcher = lease_unwatch.watcher;
    RETURN FOUND;
END
$$;

-- Tell the watchers of a name that its holder changed: a grant (a new fence), a
-- release, new data. NOTIFY pylease_holders with {"name", "fence", "holder", "event",
-- "acquired_at", "expires_at", "ttl"} (event: granted, released or data; holder NULL
-- when released; ttl in seconds): names, fences and times, never data. Called only for
-- a row marked watched (lease_watch, pylease_mark_watched): an unwatched name's grants
-- and releases call nothing: the trigger runs after the row (a BEFORE trigger would
-- have every grant lock the old row version first) and its WHEN is checked without
-- calling a function. That WHEN tests the mark alone: an update of a marked row that
-- changed none of the columns (a retried claim) is told apart here, since a WHEN that
-- compared them cost every grant and release of every name (its expression is built
-- again by each statement). A row whose watchers all expired is unmarked by its next
-- change, without a NOTIFY.
-- Notifications of one name come in the order of its changes (each is a commit that
-- waited for the previous one's row lock).
CREATE FUNCTION pylease_tell_watchers() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.fence = NEW.fence AND OLD.released = NEW.released
       AND OLD.data IS NOT DISTINCT FROM NEW.data THEN
        RETURN NULL;
    ELSIF NOT EXISTS (SELECT FROM pylease_watchers AS w
                       WHERE w.name = NEW.name AND w.expires_at > clock_timestamp()) THEN
        UPDATE pylease_leases AS l SET watched = false WHERE l.name = NEW.name AND l.watched;
    ELSE
        PERFORM pg_notify('pylease_holders', json_build_object(
            'name', NEW.name, 'fence', NEW.fence,
            'holder', CASE WHEN NEW.released THEN NULL ELSE NEW.holder END,
            'event', CASE WHEN NEW.released THEN 'released'
                          WHEN TG_OP = 'INSERT' OR OLD.fence <> NEW.fence OR OLD.released
                          THEN 'granted' ELSE 'data' END,
            'acquired_at', NEW.acquired_at, 'expires_at', NEW.expires_at,
            'ttl', extract(epoch FROM NEW.ttl))::text);
    END IF;
    RETURN NULL;
END
$$;

-- A new row (a name's first grant, or a reader's row) is watched when somebody watches
-- its name already: one probe of pylease_watchers' key, once per name.
CREATE FUNCTION pylease_mark_watched() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.watched := EXISTS (SELECT FROM pylease_watchers AS w
                            WHERE w.name = NEW.name AND w.expires_at > clock_timestamp());
    RETURN NEW;
END
$$;

CREATE TRIGGER pylease_leases_watched_mark BEFORE INSERT ON pylease_leases
    FOR EACH ROW EXECUTE FUNCTION pylease_mark_watched();
-- A first grant, once the row is in (a claim that lost the insert to another fires
-- nothing); a reader's row (no holder) is no change of holder.
CREATE TRIGGER pylease_leases_watched_insert AFTER INSERT ON pylease_leases
    FOR EACH ROW WHEN (NEW.watched AND NEW.holder IS NOT NULL)
    EXECUTE FUNCTION pylease_tell_watchers();
-- Renewals never call it: they set none of these columns.
CREATE TRIGGER pylease_leases_watched_update AFTER UPDATE OF fence, released, data
    ON pylease_leases
    FOR EACH ROW WHEN (NEW.watched)
    EXECUTE FUNCTION pylease_tell_watchers();

COMMENT ON FUNCTION lease_set_data(text, text, jsonb, bigint) IS
    'pylease: replace the data of the tenure with this fence (NULL: any) of a lease this holder still holds; false once lost.';
COMMENT ON FUNCTION lease_set_data(text, text, jsonb) IS
    'pylease: replace the data of a lease this holder still holds; false once lost.';
COMMENT ON FUNCTION lease_request_release(text, text) IS
    'pylease: ask the holder of a held lease to step down; its keeper learns of it at its next renewal.';
COMMENT ON FUNCTION lease_watch(text, text, interval) IS
    'pylease: watch a lease name for changes of holder (NOTIFY pylease_holders), or refresh the watch, until now + ttl.';
COMMENT ON FUNCTION lease_unwatch(text, text) IS
    'pylease: stop watching a lease name.';

-- Groups ----------------------------------------------------------------------

-- One row per group ever joined: the last incarnation it issued. Joins of a group
-- take turns on this row. A group name leaves room in a lease name for "#<part>".
CREATE TABLE pylease_groups (
    grp         text   PRIMARY KEY CHECK (length(grp) BETWEEN 1 AND 190),
    incarnation bigint NOT NULL DEFAULT 0 CHECK (incarnation >= 0)
);

COMMENT ON TABLE pylease_groups IS
    'pylease: one row per group, with the last incarnation it issued; written only through the group_* functions.';

-- One row per member name of a group. A member is live while expires_at is ahead
-- (a leave sets it to the moment of the leave). As for leases, the incarnation is a
-- key column (pylease_members_incarnation), so member_holds' FOR KEY SHARE conflicts
-- with a new join of the name, and renewals are HOT updates.
CREATE TABLE pylease_members (
    grp         text        NOT NULL,
    member      text        NOT NULL CHECK (length(member) BETWEEN 1 AND 200),
    incarnation bigint      NOT NULL CHECK (incarnation > 0),
    ttl         interval    NOT NULL,
    joined_at   timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    data        jsonb,
    PRIMARY KEY (grp, member)
) WITH (fillfactor = 50);
CREATE UNIQUE INDEX pylease_members_incarnation ON pylease_members (grp, member, incarnation);

COMMENT ON TABLE pylease_members IS
    'pylease: one row per member of a group; written only through the group_* functions.';

-- Raises 22023 unless a group name is a non-empty text of at most 190 characters.
CREATE FUNCTION pylease_check_group(value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: grp must not be NULL' USING ERRCODE = '22023', COLUMN = 'grp';
    ELSIF value = '' THEN
        RAISE EXCEPTION 'pylease: grp must not be empty' USING ERRCODE = '22023', COLUMN = 'grp';
    ELSIF length(value) > 190 THEN
        RAISE EXCEPTION 'pylease: grp must be at most 190 characters'
            USING ERRCODE = '22023', COLUMN = 'grp';
    END IF;
END
$$;

-- Raises 22023 unless a member's data is at most 8192 characters as JSON text.
CREATE FUNCTION pylease_check_data(value jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF length(value::text) > 8192 THEN
        RAISE EXCEPTION 'pylease: data must be at most 8192 characters as JSON text'
            USING ERRCODE = '22023', COLUMN = 'data';
    END IF;
END
$$;

-- Join a group as member: its incarnation, larger than any the group issued (and
-- floored by the timeline, as a fence), or NULL when that member name is live (a
-- join is not idempotent: a name is one incarnation at a time). A busy join is
-- answered by one read (no row lock, no WAL). Joins of one group take turns on the
-- group's row, without a bound; the name's previous incarnation, if a fenced
-- transaction (member_holds) still holds it, is waited for at most lock_timeout, and
-- then the join is busy. A join deletes the rows of the group's gone members and
-- sends NOTIFY pylease with the group's name.
CREATE FUNCTION group_join(grp text, member text, ttl interval, data jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    s_last  bigint;
    granted bigint;
BEGIN
    IF group_join.grp IS NULL OR group_join.grp = '' OR length(group_join.grp) > 190
       OR group_join.member IS NULL OR group_join.member = '' OR length(group_join.member) > 200
       OR group_join.ttl IS NULL OR NOT isfinite(group_join.ttl)
       OR group_join.ttl <= interval '0' OR group_join.ttl > interval '366 days'
       OR length(group_join.data::text) > 8192
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_group(group_join.grp);
        PERFORM pylease_check_key('member', group_join.member);
        PERFORM pylease_check_ttl('ttl', group_join.ttl);
        PERFORM pylease_check_data(group_join.data);
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby('group_join');
        END IF;
        PERFORM pylease_refuse_read_only('group_join');
    END IF;

    IF EXISTS (SELECT FROM pylease_members AS m
                WHERE m.grp = group_join.grp AND m.member = group_join.member
                  AND m.expires_at > t_now) THEN
        RETURN NULL;
    END IF;

    -- Another join of the group commits in a moment (unless a caller keeps its
    -- transaction open): wait for it, never call the group busy.
    PERFORM set_config('lock_timeout', '0', true);
    LOOP
        SELECT g.incarnation INTO s_last FROM pylease_groups AS g
         WHERE g.grp = group_join.grp
           FOR NO KEY UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO pylease_groups AS g (grp) VALUES (group_join.grp) ON CONFLICT DO NOTHING;
    END LOOP;
    IF s_last = 9223372036854775807 THEN
        RAISE EXCEPTION 'pylease: group % has used every incarnation (%): nobody can join it again',
            quote_literal(group_join.grp), s_last USING ERRCODE = '54000';
    END IF;

    PERFORM set_config('lock_timeout', '2s', true);
    BEGIN
        -- The name's row, when it has one, is gone (left or expired) unless another
        -- join of it committed since the read above: then nothing changes.
        WITH made AS (
            INSERT INTO pylease_members AS m (grp, member, incarnation, ttl, joined_at,
                                              renewed_at, expires_at, data)
            VALUES (group_join.grp, group_join.member,
                    greatest(s_last + 1,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                    group_join.ttl, t_now, t_now, t_now + group_join.ttl, group_join.data)
            ON CONFLICT (grp, member) DO UPDATE
               SET incarnation = excluded.incarnation,
                   ttl         = excluded.ttl,
                   joined_at   = excluded.joined_at,
                   renewed_at  = excluded.renewed_at,
                   expires_at  = excluded.expires_at,
                   data        = excluded.data
             WHERE m.expires_at <= excluded.joined_at
            RETURNING m.incarnation
        )
        UPDATE pylease_groups AS g SET incarnation = k.incarnation
          FROM made AS k
         WHERE g.grp = group_join.grp
        RETURNING k.incarnation INTO granted;
    EXCEPTION WHEN lock_not_available THEN
        -- The previous incarnation's fenced transaction is still open: not ours yet.
        RETURN NULL;
    END;
    IF granted IS NULL THEN
        RETURN NULL;
    END IF;

    -- The gone members' rows; a row a fenced transaction holds is left for later.
    DELETE FROM pylease_members AS m
     WHERE m.grp = group_join.grp
       AND m.member IN (SELECT d.member FROM pylease_members AS d
                         WHERE d.grp = group_join.grp AND d.expires_at <= t_now
                           FOR UPDATE SKIP LOCKED);
    PERFORM pg_notify('pylease', group_join.grp);
    RETURN granted;
END
$$;

-- Renew a live member, never earlier: true when it was live (and the incarnation
-- given, if not NULL, is its). Unlike a lease, a member past its expiry is not
-- renewed: the others have seen it leave, and it must join again.
CREATE FUNCTION group_renew(grp text, member text, ttl interval, incarnation bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF group_renew.grp IS NULL OR group_renew.grp = '' OR length(group_renew.grp) > 190
       OR group_renew.member IS NULL OR group_renew.member = ''
       OR length(group_renew.member) > 200
       OR NOT isfinite(group_renew.ttl)
       OR group_renew.ttl <= interval '0' OR group_renew.ttl > interval '366 days'
    THEN
        PERFORM pylease_check_group(group_renew.grp);
        PERFORM pylease_check_key('member', group_renew.member);
        IF group_renew.ttl IS NOT NULL THEN
            PERFORM pylease_check_ttl('ttl', group_renew.ttl);
        END IF;
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('group_renew');
    END IF;

    UPDATE pylease_members AS m
       SET ttl        = coalesce(group_renew.ttl, m.ttl),
           renewed_at = t_now,
           expires_at = greatest(m.expires_at, t_now + coalesce(group_renew.ttl, m.ttl))
     WHERE m.grp = group_renew.grp AND m.member = group_renew.member AND m.expires_at > t_now
       AND (group_renew.incarnation IS NULL OR m.incarnation = group_renew.incarnation);
    RETURN FOUND;
END
$$;

-- Renew a live member, whichever incarnation it is.
CREATE FUNCTION group_renew(grp text, member text, ttl interval DEFAULT NULL) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT group_renew($1, $2, $3, NULL::bigint);
$$;

-- Leave a group: true when the member was live (and the incarnation given, if not
-- NULL, is its); then NOTIFY pylease with the group's name. The row stays, gone,
-- until the group's next join. Without the WAL flush when this is the first write
-- of its transaction, as lease_release: a leave lost in a crash only keeps the
-- member until its expiry.
CREATE FUNCTION group_leave(grp text, member text, incarnation bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    ignored text;
BEGIN
    IF group_leave.grp IS NULL OR group_leave.grp = '' OR length(group_leave.grp) > 190
       OR group_leave.member IS NULL OR group_leave.member = ''
       OR length(group_leave.member) > 200 OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_group(group_leave.grp);
        PERFORM pylease_check_key('member', group_leave.member);
        PERFORM pylease_refuse_standby('group_leave');
    END IF;
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;

    t_now := clock_timestamp();
    UPDATE pylease_members AS m
       SET expires_at = t_now
     WHERE m.grp = group_leave.grp AND m.member = group_leave.member AND m.expires_at > t_now
       AND (group_leave.incarnation IS NULL OR m.incarnation = group_leave.incarnation);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    ignored := pg_notify('pylease', group_leave.grp);
    RETURN true;
END
$$;

-- Leave a group, whichever incarnation the member is.
CREATE FUNCTION group_leave(grp text, member text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT group_leave($1, $2, NULL::bigint);
$$;

-- The live members of a group, ordered by member (by their bytes, as SQLite orders).
CREATE FUNCTION group_members(grp text)
RETURNS TABLE(member text, incarnation bigint, joined_at timestamptz, renewed_at timestamptz,
              expires_at timestamptz, data jsonb)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_group($1);
    SELECT m.member, m.incarnation, m.joined_at, m.renewed_at, m.expires_at, m.data
      FROM pylease_members AS m
     WHERE m.grp = $1 AND m.expires_at > clock_timestamp()
     ORDER BY m.member COLLATE "C";
$$;

-- True iff the member is live with this incarnation. Locks its row FOR KEY SHARE:
-- a new join of the name changes the incarnation, a key column, so a write fenced by
-- membership in the caller's transaction and that join are serialized, while
-- renewals and leaves never wait for it.
CREATE FUNCTION member_holds(grp text, member text, incarnation bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    IF member_holds.grp IS NULL OR member_holds.grp = '' OR length(member_holds.grp) > 190
       OR member_holds.member IS NULL OR member_holds.member = ''
       OR length(member_holds.member) > 200 OR member_holds.incarnation IS NULL
    THEN
        PERFORM pylease_check_group(member_holds.grp);
        PERFORM pylease_check_key('member', member_holds.member);
        RAISE EXCEPTION 'pylease: incarnation must not be NULL'
            USING ERRCODE = '22023', COLUMN = 'incarnation';
    END IF;

    PERFORM FROM pylease_members AS m
      WHERE m.grp = member_holds.grp AND m.member = member_holds.member
        AND m.incarnation = member_holds.incarnation AND m.expires_at > clock_timestamp()
        FOR KEY SHARE;
    RETURN FOUND;
END
$$;

-- The assignment of partitions 0 .. partitions - 1 (1 to 1024) to members, a pure
-- function of the set of members: bounded-load rendezvous hashing. Every member gets
-- floor(partitions / n) or ceil(partitions / n) of the n members' partitions.
--   member_hash(m)  = FNV-1a, 32 bits, of m's UTF-8 bytes: h = 2166136261, then per
--                     byte h = ((h XOR byte) * 16777619) mod 2^32;
--   score(m, p)     = FNV-1a continued from member_hash(m) over the 4 bytes of p,
--                     big-endian, then mixed: h ^= h >> 16; h = h * 0x21f0aaad mod 2^32;
--                     h ^= h >> 15; h = h * 0x735a2d97 mod 2^32; h ^= h >> 15;
--   with q, r = partitions div n, partitions mod n, the pairs (m, p) are taken in the
--   order of score descending, then m's UTF-8 bytes, then p: p goes to m when p has
--   no member yet and m has fewer than q partitions, or q while fewer than r members
--   have q + 1.
-- Every product stays below 2^63, so SQLite's 64-bit integers compute the same.
CREATE FUNCTION pylease_assignment(members text[], partitions integer)
RETURNS TABLE(part integer, member text)
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    sorted text[];
    hashes bigint[];
    owner  integer[];
    load   integer[];
    n      integer;
    q      integer;
    r      integer;
    extra  integer := 0;
    placed integer := 0;
    bytes  bytea;
    h      bigint;
    pair   record;
BEGIN
    SELECT array_agg(u.m ORDER BY convert_to(u.m, 'UTF8')) INTO sorted
      FROM (SELECT DISTINCT v FROM unnest(pylease_assignment.members) AS x(v) WHERE v IS NOT NULL)
           AS u(m);
    n := coalesce(cardinality(sorted), 0);
    IF n = 0 OR pylease_assignment.partitions IS NULL OR pylease_assignment.partitions < 1 THEN
        RETURN;
    END IF;
    hashes := array_fill(0::bigint, ARRAY[n]);
    FOR i IN 1 .. n LOOP
        bytes := convert_to(sorted[i], 'UTF8');
        h := 2166136261;
        FOR j IN 0 .. length(bytes) - 1 LOOP
            h := ((h # get_byte(bytes, j)) * 16777619) & 4294967295;
        END LOOP;
        hashes[i] := h;
    END LOOP;
    q := pylease_assignment.partitions / n;
    r := pylease_assignment.partitions % n;
    owner := array_fill(0, ARRAY[pylease_assignment.partitions]);
    load := array_fill(0, ARRAY[n]);

    -- OFFSET 0 keeps a step whose value is used twice from being copied into the
    -- next: planning the copies of copies took longer than the whole assignment.
    FOR pair IN
        SELECT s.p, s.i FROM (
            SELECT p.p, m.i::integer AS i, x5.h AS score
              FROM unnest(hashes) WITH ORDINALITY AS m(h, i)
             CROSS JOIN generate_series(0, pylease_assignment.partitions - 1) AS p(p)
             CROSS JOIN LATERAL (SELECT ((m.h # ((p.p >> 24) & 255)) * 16777619) & 4294967295 AS h) AS f1
             CROSS JOIN LATERAL (SELECT ((f1.h # ((p.p >> 16) & 255)) * 16777619) & 4294967295 AS h) AS f2
             CROSS JOIN LATERAL (SELECT ((f2.h # ((p.p >> 8) & 255)) * 16777619) & 4294967295 AS h) AS f3
             CROSS JOIN LATERAL (SELECT ((f3.h # (p.p & 255)) * 16777619) & 4294967295 AS h OFFSET 0) AS f4
             CROSS JOIN LATERAL (SELECT f4.h # (f4.h >> 16) AS h OFFSET 0) AS x1
             CROSS JOIN LATERAL (SELECT (x1.h * 569420461) & 4294967295 AS h) AS x2
             CROSS JOIN LATERAL (SELECT x2.h # (x2.h >> 15) AS h OFFSET 0) AS x3
             CROSS JOIN LATERAL (SELECT (x3.h * 1935289751) & 4294967295 AS h) AS x4
             CROSS JOIN LATERAL (SELECT x4.h # (x4.h >> 15) AS h) AS x5
        ) AS s
         ORDER BY s.score DESC, s.i, s.p
    LOOP
        IF owner[pair.p + 1] = 0
           AND load[pair.i] < q + (CASE WHEN extra < r THEN 1 ELSE 0 END)
        THEN
            IF load[pair.i] = q THEN
                extra := extra + 1;
            END IF;
            load[pair.i] := load[pair.i] + 1;
            owner[pair.p + 1] := pair.i;
            placed := placed + 1;
            EXIT WHEN placed = pylease_assignment.partitions;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT (o.p - 1)::integer, sorted[o.i] FROM unnest(owner) WITH ORDINALITY AS o(i, p)
     ORDER BY o.p;
END
$$;

-- The assignment of partitions 0 .. partitions - 1 (1 to 1024) to the live members
-- (see pylease_assignment); no row when there is none.
CREATE FUNCTION group_assignment(grp text, partitions integer)
RETURNS TABLE(part integer, member text)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_group($1);
    SELECT pylease_check_count('partitions', $2, 1024, '1024');
    SELECT a.part, a.member
      FROM pylease_assignment(ARRAY(SELECT m.member FROM pylease_members AS m
                                     WHERE m.grp = $1 AND m.expires_at > clock_timestamp()),
                              $2) AS a;
$$;

COMMENT ON FUNCTION group_join(text, text, interval, jsonb) IS
    'pylease: join a group; the member''s incarnation, or NULL when that member name is live. NOTIFY pylease with the group.';
COMMENT ON FUNCTION group_renew(text, text, interval, bigint) IS
    'pylease: extend a live member (of this incarnation, unless NULL), never earlier; false once it is gone.';
COMMENT ON FUNCTION group_renew(text, text, interval) IS
    'pylease: extend a live member, never earlier; false once it is gone.';
COMMENT ON FUNCTION group_leave(text, text, bigint) IS
    'pylease: leave a group (this incarnation, unless NULL); true if the member was live. NOTIFY pylease with the group.';
COMMENT ON FUNCTION group_leave(text, text) IS
    'pylease: leave a group; true if the member was live. NOTIFY pylease with the group.';
COMMENT ON FUNCTION group_members(text) IS
    'pylease: the live members of a group, ordered by member.';
COMMENT ON FUNCTION member_holds(text, text, bigint) IS
    'pylease: true iff the member is live with this incarnation; locks it FOR KEY SHARE against a new join of the name.';
COMMENT ON FUNCTION group_assignment(text, integer) IS
    'pylease: the assignment of partitions 0 .. partitions - 1 to the live members (bounded-load rendezvous hashing).';
COMMENT ON FUNCTION pylease_assignment(text[], integer) IS
    'pylease (internal): the assignment of partitions to a set of members, as group_assignment gives it.';

-- Every group ever joined (all when grp is NULL), ordered by name (by its bytes, as
-- SQLite orders): its live members, the last incarnation it issued, and the earliest
-- expiry of a live member (NULL when none is live).
CREATE FUNCTION group_status(grp text DEFAULT NULL)
RETURNS TABLE(grp text, members integer, incarnation bigint, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_group($1) WHERE $1 IS NOT NULL;
    SELECT g.grp, count(m.member)::integer, g.incarnation, min(m.expires_at)
      FROM pylease_groups AS g
      LEFT JOIN pylease_members AS m ON m.grp = g.grp AND m.expires_at > clock_timestamp()
     WHERE $1 IS NULL OR g.grp = $1
     GROUP BY g.grp, g.incarnation
     ORDER BY g.grp COLLATE "C";
$$;

COMMENT ON FUNCTION group_status(text) IS
    'pylease: every group ever joined (or one): live members, the last incarnation issued, the earliest expiry of a live member.';

-- Privileges ------------------------------------------------------------------

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

COMMENT ON FUNCTION lease_prune(interval) IS
    'pylease: delete the names (leases and semaphores) nobody has held for at least idle_for, with their counters; returns how many. Fences never go back.';
COMMENT ON FUNCTION pylease_fence_floor(text) IS
    'pylease (internal): the highest fence a pruned name of this name''s bucket had, read under the bucket''s shared lock.';
COMMENT ON FUNCTION pylease_unshared(text, bigint, timestamptz) IS
    'pylease (internal): true when no unexpired share of this epoch of the name stands.';


REVOKE ALL ON TABLE pylease_leases FROM PUBLIC;
REVOKE ALL ON TABLE pylease_events FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_key(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_ttl(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_span(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_batch(text[], text[], interval[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_standby(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_read_only(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_history(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_refuse_unseen_readers(text, text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_history_rows(text, timestamptz, integer) FROM PUBLIC;
-- Stealing breaks somebody's lease: an operator grants it to the roles that may.
REVOKE EXECUTE ON FUNCTION lease_steal(text, interval, text, interval) FROM PUBLIC;
-- Pruning destroys the record: an operator grants it to the roles that may.
REVOKE EXECUTE ON FUNCTION lease_prune_history(interval) FROM PUBLIC;

REVOKE ALL ON TABLE pylease_names FROM PUBLIC;
REVOKE ALL ON TABLE pylease_permits FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_count(text, integer, integer, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_names(text, text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_register_lease() FROM PUBLIC;
-- Changing a limit and breaking a holder's permits are an operator's: granted to the
-- roles that may.
REVOKE EXECUTE ON FUNCTION permit_set_max(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION permit_revoke(text, text) FROM PUBLIC;
-- Pruning names is an operator's.
REVOKE ALL ON TABLE pylease_fence_floors FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_fence_floor(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_floor_slot() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease_prune(interval) FROM PUBLIC;
-- Groups.
REVOKE ALL ON TABLE pylease_groups FROM PUBLIC;
REVOKE ALL ON TABLE pylease_members FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_group(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_data(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_assignment(text[], integer) FROM PUBLIC;

REVOKE ALL ON TABLE pylease_shared FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_release_shared(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_release_shared(text, text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON SEQUENCE pylease_share_ids FROM PUBLIC;

-- Data, step-down requests, watchers. Stepping a leader down is an operator's:
-- granted to the roles that may.
REVOKE ALL ON TABLE pylease_watchers FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease_request_release(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_tell_watchers() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_mark_watched() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_unshared(text, bigint, timestamptz) FROM PUBLIC;

COMMIT;
