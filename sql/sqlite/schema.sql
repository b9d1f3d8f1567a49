-- pylease: the current SQLite schema, as every migration of migrations/sqlite/
-- leaves it. Readable definition; pylease.sqlite.connect() installs it through
-- the migrations, which it records as yoyo does. A test proves the two agree.
-- To read, not to install: a file made from it would lack the migration records.
-- Times are unix seconds (REAL, millisecond resolution) from SQLite's own clock.

-- Tables ----------------------------------------------------------------------

-- One row per name claimed and not pruned. A pruned name's next first grant starts
-- above pylease_fence_floor, so the fence of a name can only grow. The counters
-- are kept by claim.sql, steal.sql and release.sql. A name first claimed by a reader
-- has a row without a holder, released; its fence is the floor (0 for a file that
-- never pruned): no writer was granted it. data is the tenure's JSON text, replaced
-- by every new grant (NULL unless it gives some); release_requested_by a step-down
-- request (request_release.sql), until the tenure ends.
CREATE TABLE pylease_leases (
    name        TEXT    NOT NULL PRIMARY KEY,
    holder      TEXT,
    fence       INTEGER NOT NULL CHECK (fence >= 0),
    ttl         REAL    NOT NULL,
    acquired_at REAL    NOT NULL,
    renewed_at  REAL    NOT NULL,
    expires_at  REAL    NOT NULL,
    released    INTEGER NOT NULL DEFAULT 0 CHECK (released IN (0, 1)),
    grants      INTEGER NOT NULL DEFAULT 0,
    takeovers   INTEGER NOT NULL DEFAULT 0,
    steals      INTEGER NOT NULL DEFAULT 0,
    releases    INTEGER NOT NULL DEFAULT 0,
    data        TEXT,
    release_requested_by TEXT,
    CHECK (holder IS NOT NULL OR released)
) STRICT;

-- Checks ----------------------------------------------------------------------

-- A row that a caller in any language writes is checked with the messages of
-- the PostgreSQL API (in its order: name, ttl, holder), so that bad input is
-- never stored. Lookups with a bad name simply find nothing: callers validate.
CREATE TRIGGER pylease_leases_insert_check BEFORE INSERT ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: name must not be NULL') WHERE NEW.name IS NULL;
    SELECT RAISE(ABORT, 'pylease: name must not be empty') WHERE NEW.name = '';
    SELECT RAISE(ABORT, 'pylease: name must be at most 200 characters') WHERE length(NEW.name) > 200;
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: holder must not be NULL') WHERE NEW.holder IS NULL AND NOT NEW.released;
    SELECT RAISE(ABORT, 'pylease: holder must not be empty') WHERE NEW.holder = '';
    SELECT RAISE(ABORT, 'pylease: holder must be at most 200 characters') WHERE length(NEW.holder) > 200;
END;

CREATE TRIGGER pylease_leases_update_check BEFORE UPDATE ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: holder must not be NULL') WHERE NEW.holder IS NULL AND NOT NEW.released;
    SELECT RAISE(ABORT, 'pylease: holder must not be empty') WHERE NEW.holder = '';
    SELECT RAISE(ABORT, 'pylease: holder must be at most 200 characters') WHERE length(NEW.holder) > 200;
    SELECT RAISE(ABORT, 'pylease: a fence never goes back') WHERE NEW.fence < OLD.fence;
    SELECT RAISE(ABORT, 'pylease: a lease keeps its name') WHERE NEW.name IS NOT OLD.name;
END;

-- The highest fence any deleted lease row or slot had (prune.sql deletes the
-- names nobody held for a while): a new name's first grant starts above it, so
-- that fences never go back. One row; one host needs no buckets of names.
CREATE TABLE pylease_fence_floor (
    floor INTEGER NOT NULL CHECK (floor >= 0)
) STRICT;

CREATE TRIGGER pylease_leases_floor AFTER DELETE ON pylease_leases
BEGIN
    UPDATE pylease_fence_floor SET floor = max(floor, OLD.fence);
END;

-- A grant past the last fence (claim.sql and steal.sql compute NULL there) fails
-- before the row changes.
CREATE TRIGGER pylease_leases_fences_exhausted BEFORE UPDATE OF fence ON pylease_leases
WHEN NEW.fence IS NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this lease has used every fence (2^63-1)');
END;

-- What happened to each lease; rows are only ever added (and pruned). The
-- indexes serve history.sql (all names, one name) and prune_history.sql.
CREATE TABLE pylease_events (
    id              INTEGER PRIMARY KEY,
    at              REAL    NOT NULL,
    name            TEXT    NOT NULL,
    event           TEXT    NOT NULL CHECK (event IN ('claimed', 'taken_over', 'stolen', 'released')),
    holder          TEXT    NOT NULL,
    fence           INTEGER NOT NULL,
    previous_holder TEXT,
    slot            INTEGER
) STRICT;
CREATE INDEX pylease_events_at ON pylease_events (at);
CREATE INDEX pylease_events_name_at ON pylease_events (name, at);

CREATE TRIGGER pylease_events_append_only BEFORE UPDATE ON pylease_events
BEGIN
    SELECT RAISE(ABORT, 'pylease: history events are never changed');
END;

-- Settings of the whole file: 'history' (rare | all | none).
CREATE TABLE pylease_settings (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL,
    CHECK (name <> 'history' OR value IN ('', 'rare', 'all', 'none'))
) STRICT;

-- A first claim (or a steal of a new name): 'claimed', under 'all' only. A reader's
-- first claim of a name records its share instead (pylease_shared_history_claimed).
CREATE TRIGGER pylease_history_created AFTER INSERT ON pylease_leases
WHEN NEW.fence > 0 AND (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence)
    VALUES (NEW.acquired_at, NEW.name, 'claimed', NEW.holder, NEW.fence);
END;

-- A new tenure (the fence moved): claimed after a release, taken_over after an
-- expiry without one, stolen from an unexpired holder.
CREATE TRIGGER pylease_history_granted AFTER UPDATE OF fence ON pylease_leases
WHEN NEW.fence IS NOT OLD.fence
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
    SELECT NEW.acquired_at, NEW.name, k.kind, NEW.holder, NEW.fence, OLD.holder
      FROM (SELECT CASE WHEN OLD.released THEN 'claimed'
                        WHEN OLD.expires_at <= NEW.acquired_at THEN 'taken_over'
                        ELSE 'stolen' END AS kind) AS k,
           (SELECT coalesce((SELECT value FROM pylease_settings WHERE name = 'history'), '')
                   AS mode) AS s
     WHERE s.mode = 'all' OR (s.mode IN ('', 'rare') AND k.kind <> 'claimed');
END;

-- A release by the holder (which counts one); not a reader taking over from a
-- holder that died (claim_shared.sql records that).
CREATE TRIGGER pylease_history_released AFTER UPDATE OF released ON pylease_leases
WHEN NEW.released AND NOT OLD.released AND NEW.releases > OLD.releases
 AND (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence)
    VALUES (round((julianday('now') - 2440587.5) * 86400.0, 3), NEW.name, 'released',
            NEW.holder, NEW.fence);
END;

-- Kinds and permits ----------------------------------------------------------

-- One row per name ever granted: its kind, and a semaphore's limit.
CREATE TABLE pylease_names (
    name        TEXT    NOT NULL PRIMARY KEY,
    kind        TEXT    NOT NULL CHECK (kind IN ('lease', 'semaphore')),
    max_permits INTEGER CHECK (max_permits BETWEEN 1 AND 10000),
    CHECK ((kind = 'semaphore') = (max_permits IS NOT NULL))
) STRICT;

-- A new lease row registers its name, or finds it a semaphore's and fails.
CREATE TRIGGER pylease_leases_register AFTER INSERT ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: name is a semaphore, not a lease')
     WHERE EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name AND kind <> 'lease');
    INSERT OR IGNORE INTO pylease_names (name, kind) VALUES (NEW.name, 'lease');
END;

-- One row per slot of a semaphore. permits is how many slots its holder was
-- granted together; revoked: freed by permit_revoke from an unexpired holder, so
-- that its next grant is a steal. Rows go only with their name (prune.sql).
CREATE TABLE pylease_permits (
    name        TEXT    NOT NULL,
    slot        INTEGER NOT NULL CHECK (slot BETWEEN 0 AND 9999),
    holder      TEXT,
    fence       INTEGER NOT NULL DEFAULT 0 CHECK (fence >= 0),
    permits     INTEGER NOT NULL DEFAULT 0,
    ttl         REAL,
    acquired_at REAL,
    renewed_at  REAL,
    expires_at  REAL    NOT NULL DEFAULT 0,
    released    INTEGER NOT NULL DEFAULT 0 CHECK (released IN (0, 1)),
    revoked     INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1)),
    grants      INTEGER NOT NULL DEFAULT 0,
    takeovers   INTEGER NOT NULL DEFAULT 0,
    steals      INTEGER NOT NULL DEFAULT 0,
    releases    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, slot)
) STRICT;
CREATE INDEX pylease_permits_holder ON pylease_permits (name, holder);

CREATE TRIGGER pylease_permits_update_check BEFORE UPDATE ON pylease_permits
BEGIN
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: holder must not be empty') WHERE NEW.holder = '';
    SELECT RAISE(ABORT, 'pylease: holder must be at most 200 characters') WHERE length(NEW.holder) > 200;
    SELECT RAISE(ABORT, 'pylease: a fence never goes back') WHERE NEW.fence < OLD.fence;
    SELECT RAISE(ABORT, 'pylease: a slot keeps its name and number')
     WHERE NEW.name IS NOT OLD.name OR NEW.slot IS NOT OLD.slot;
END;

CREATE TRIGGER pylease_permits_floor AFTER DELETE ON pylease_permits
BEGIN
    UPDATE pylease_fence_floor SET floor = max(floor, OLD.fence);
END;

-- A grant past the last fence (permit_claim.sql computes NULL there) fails before
-- the row changes.
CREATE TRIGGER pylease_permits_fences_exhausted BEFORE UPDATE OF fence ON pylease_permits
WHEN NEW.fence IS NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this slot has used every fence (2^63-1)');
END;

-- A new tenure of a slot: claimed (a slot never granted, or released), taken_over
-- (expired without a release), stolen (freed by permit_revoke from an unexpired
-- holder).
CREATE TRIGGER pylease_permits_history_granted AFTER UPDATE OF fence ON pylease_permits
WHEN NEW.fence IS NOT OLD.fence
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder, slot)
    SELECT NEW.acquired_at, NEW.name, k.kind, NEW.holder, NEW.fence,
           CASE WHEN OLD.fence > 0 THEN OLD.holder END, NEW.slot
      FROM (SELECT CASE WHEN OLD.revoked THEN 'stolen'
                        WHEN OLD.fence = 0 OR OLD.released THEN 'claimed'
                        ELSE 'taken_over' END AS kind) AS k,
           (SELECT coalesce((SELECT value FROM pylease_settings WHERE name = 'history'), '')
                   AS mode) AS s
     WHERE s.mode = 'all' OR (s.mode IN ('', 'rare') AND k.kind <> 'claimed');
END;

-- A release by the holder (which counts one), not a revoke.
CREATE TRIGGER pylease_permits_history_released AFTER UPDATE OF released ON pylease_permits
WHEN NEW.released AND NOT OLD.released AND NEW.releases > OLD.releases
 AND (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence, slot)
    VALUES (NEW.expires_at, NEW.name, 'released', NEW.holder, NEW.fence, NEW.slot);
END;

-- permit_claim.sql's checks: inserting (name, max_permits, holder, permits) fails
-- for a lease's name, another limit, or a holder that holds another number of the
-- semaphore's permits; makes a new semaphore with its slots; stores nothing.
CREATE VIEW pylease_permit_claims (name, max_permits, holder, permits) AS
    SELECT NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER pylease_permit_claims_check INSTEAD OF INSERT ON pylease_permit_claims
BEGIN
    SELECT RAISE(ABORT, 'pylease: name is a lease, not a semaphore')
     WHERE EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name AND kind = 'lease');
    SELECT RAISE(ABORT, 'pylease: max_permits differs from the limit of this semaphore')
     WHERE EXISTS (SELECT 1 FROM pylease_names
                    WHERE name = NEW.name AND max_permits IS NOT NEW.max_permits);
    SELECT RAISE(ABORT, 'pylease: permits must be as many as this holder already holds of this semaphore (release them first)')
     WHERE (SELECT count(*) FROM pylease_permits
             WHERE name = NEW.name AND holder = NEW.holder AND NOT released) NOT IN (0, NEW.permits)
        OR EXISTS (SELECT 1 FROM pylease_permits
                    WHERE name = NEW.name AND holder = NEW.holder AND NOT released
                      AND permits <> NEW.permits);
    INSERT INTO pylease_names (name, kind, max_permits)
    SELECT NEW.name, 'semaphore', NEW.max_permits
     WHERE NOT EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name);
    -- Slots 0 to max_permits - 1: the keys of a JSON array of max_permits zeros.
    INSERT INTO pylease_permits (name, slot)
    SELECT NEW.name, j.key
      FROM json_each('[' || rtrim(replace(hex(zeroblob(NEW.max_permits)), '00', '0,'), ',') || ']') AS j
     WHERE NOT EXISTS (SELECT 1 FROM pylease_permits WHERE name = NEW.name);
END;

-- permit_set_max.sql: inserting (name, max_permits) sets the limit of a semaphore
-- (and makes the slots of a raised one); stores nothing.
CREATE VIEW pylease_permit_limits (name, max_permits) AS SELECT NULL, NULL WHERE 0;

CREATE TRIGGER pylease_permit_limits_set INSTEAD OF INSERT ON pylease_permit_limits
BEGIN
    SELECT RAISE(ABORT, 'pylease: name is not a semaphore: no permit of it was ever claimed')
     WHERE NOT EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name);
    SELECT RAISE(ABORT, 'pylease: name is a lease, not a semaphore')
     WHERE EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name AND kind = 'lease');
    UPDATE pylease_names SET max_permits = NEW.max_permits WHERE name = NEW.name;
    INSERT OR IGNORE INTO pylease_permits (name, slot)
    SELECT NEW.name, j.key
      FROM json_each('[' || rtrim(replace(hex(zeroblob(NEW.max_permits)), '00', '0,'), ',') || ']') AS j;
END;

-- permit_revoke.sql's check: inserting a name fails for a lease's; stores nothing.
CREATE VIEW pylease_semaphore_names (name) AS SELECT NULL WHERE 0;

CREATE TRIGGER pylease_semaphore_names_check INSTEAD OF INSERT ON pylease_semaphore_names
BEGIN
    SELECT RAISE(ABORT, 'pylease: name is a lease, not a semaphore')
     WHERE EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name AND kind = 'lease');
END;

-- Readers and writers ----------------------------------------------------------

-- One row per reader of a lease name: it holds while its epoch is still the name's
-- fence and it is unexpired. A release deletes it.
CREATE TABLE pylease_shared (
    name        TEXT    NOT NULL,
    holder      TEXT    NOT NULL,
    epoch       INTEGER NOT NULL CHECK (epoch >= 0),
    ttl         REAL    NOT NULL,
    acquired_at REAL    NOT NULL,
    renewed_at  REAL    NOT NULL,
    expires_at  REAL    NOT NULL,
    PRIMARY KEY (name, holder)
) STRICT;

CREATE TRIGGER pylease_shared_update_check BEFORE UPDATE ON pylease_shared
BEGIN
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
END;

-- An exclusive grant (the fence moved) ends the name's readers.
CREATE TRIGGER pylease_leases_readers_over AFTER UPDATE OF fence ON pylease_leases
WHEN NEW.fence IS NOT OLD.fence
BEGIN
    DELETE FROM pylease_shared WHERE name = NEW.name;
END;

-- A reader's share: 'claimed', under 'all' only (its release: release_shared.sql).
CREATE TRIGGER pylease_shared_history_claimed AFTER INSERT ON pylease_shared
WHEN (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence)
    VALUES (NEW.acquired_at, NEW.name, 'claimed', NEW.holder, NEW.epoch);
END;

-- Writers waiting while readers hold a name, until expires_at: while one waits, no
-- new reader is let in (writer preference).
CREATE TABLE pylease_waiters (
    name       TEXT NOT NULL,
    waiter     TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (name, waiter)
) STRICT;

-- claim_shared.sql's checks: inserting (name, ttl, holder) fails with the messages
-- of the PostgreSQL API (and for a semaphore's name), makes the name's row on its
-- first use (no holder, released, at the floor); stores nothing.
CREATE VIEW pylease_shared_claims (name, ttl, holder) AS SELECT NULL, NULL, NULL WHERE 0;

CREATE TRIGGER pylease_shared_claims_check INSTEAD OF INSERT ON pylease_shared_claims
BEGIN
    -- The lease table's checks (name, then ttl) run even when the row exists.
    INSERT INTO pylease_leases (name, holder, fence, ttl, acquired_at, renewed_at, expires_at,
                                released)
    SELECT NEW.name, NULL, f.floor, NEW.ttl, c.now, c.now, c.now, 1
      FROM (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3) AS now) AS c,
           pylease_fence_floor AS f
     WHERE true
        ON CONFLICT (name) DO NOTHING;
    SELECT RAISE(ABORT, 'pylease: holder must not be NULL') WHERE NEW.holder IS NULL;
    SELECT RAISE(ABORT, 'pylease: holder must not be empty') WHERE NEW.holder = '';
    SELECT RAISE(ABORT, 'pylease: holder must be at most 200 characters') WHERE length(NEW.holder) > 200;
END;

-- Groups ----------------------------------------------------------------------

-- One row per group ever joined, with the last incarnation it issued, so that
-- incarnations never go back though members' rows are deleted (a gone member's row
-- stays until the group's next join deletes it).
CREATE TABLE pylease_groups (
    grp         TEXT    NOT NULL PRIMARY KEY,
    incarnation INTEGER NOT NULL DEFAULT 0 CHECK (incarnation >= 0)
) STRICT;

CREATE TRIGGER pylease_groups_insert_check BEFORE INSERT ON pylease_groups
BEGIN
    SELECT RAISE(ABORT, 'pylease: grp must not be NULL') WHERE NEW.grp IS NULL;
    SELECT RAISE(ABORT, 'pylease: grp must not be empty') WHERE NEW.grp = '';
    SELECT RAISE(ABORT, 'pylease: grp must be at most 190 characters') WHERE length(NEW.grp) > 190;
END;

-- A member is live while expires_at is ahead (a leave sets it to the moment of the
-- leave). data is JSON text.
CREATE TABLE pylease_members (
    grp         TEXT    NOT NULL,
    member      TEXT    NOT NULL,
    incarnation INTEGER NOT NULL CHECK (incarnation > 0),
    ttl         REAL    NOT NULL,
    joined_at   REAL    NOT NULL,
    renewed_at  REAL    NOT NULL,
    expires_at  REAL    NOT NULL,
    data        TEXT,
    PRIMARY KEY (grp, member)
) STRICT;

-- Checked for every join, also one that finds the member live (its row is proposed).
-- A group past its last incarnation (group_join.sql computes NULL there) fails.
CREATE TRIGGER pylease_members_insert_check BEFORE INSERT ON pylease_members
BEGIN
    SELECT RAISE(ABORT, 'pylease: member must not be NULL') WHERE NEW.member IS NULL;
    SELECT RAISE(ABORT, 'pylease: member must not be empty') WHERE NEW.member = '';
    SELECT RAISE(ABORT, 'pylease: member must be at most 200 characters') WHERE length(NEW.member) > 200;
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this group has used every incarnation (2^63-1)')
     WHERE NEW.incarnation IS NULL;
END;

CREATE TRIGGER pylease_members_update_check BEFORE UPDATE ON pylease_members
BEGIN
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this group has used every incarnation (2^63-1)')
     WHERE NEW.incarnation IS NULL;
    SELECT RAISE(ABORT, 'pylease: an incarnation never goes back') WHERE NEW.incarnation < OLD.incarnation;
    SELECT RAISE(ABORT, 'pylease: a member keeps its group and name')
     WHERE NEW.grp IS NOT OLD.grp OR NEW.member IS NOT OLD.member;
END;

-- Data on a lease ---------------------------------------------------------------

CREATE TRIGGER pylease_leases_data_insert_check BEFORE INSERT ON pylease_leases
WHEN NEW.data IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
END;

CREATE TRIGGER pylease_leases_data_update_check BEFORE UPDATE OF data ON pylease_leases
WHEN NEW.data IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
END;
