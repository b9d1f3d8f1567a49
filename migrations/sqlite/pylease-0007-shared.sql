-- pylease 0007 (SQLite): readers and writers (contract revision 3, section 5.2).
-- Keep sql/sqlite/schema.sql in step (a test compares).
--   * pylease_leases is rebuilt so that a name first claimed by a reader has a row
--     without a holder (released), its fence the floor (0 in a file that never
--     pruned): the epoch of its readers. Its triggers are made again, as they were,
--     except that the checks let that row through, and that a release records
--     'released' only when it counts one (a reader marking a dead writer's lease
--     released does not);
--   * pylease_shared: one row per reader of a lease name, with its epoch (the
--     name's fence when it was granted); an exclusive grant (the fence moves)
--     deletes the rows of the name, whose readers hold no longer;
--   * pylease_waiters: SQLite's own queue of waiting writers (writer preference);
--     claim_queued.sql puts a writer kept out by readers in it, for 2 seconds at a
--     time, refreshed while it waits;
--   * the view pylease_shared_claims: inserting into it checks a reader's claim and
--     makes the name's row on its first use; it stores nothing.
-- depends: pylease-0006-groups

-- Rebuilt through a copy (ALTER TABLE ... RENAME would attach the temp schema to
-- every connection that migrates).
CREATE TABLE pylease_leases_before_0007 AS SELECT * FROM pylease_leases;
DROP TABLE pylease_leases;

-- One row per name ever claimed. Rows are never deleted, so the fence of a name
-- can only grow. The counters are kept by claim.sql, steal.sql and release.sql.
-- A name first claimed by a reader has a row without a holder, released.
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
    CHECK (holder IS NOT NULL OR released)
) STRICT;

INSERT INTO pylease_leases (name, holder, fence, ttl, acquired_at, renewed_at, expires_at,
                            released, grants, takeovers, steals, releases)
SELECT name, holder, fence, ttl, acquired_at, renewed_at, expires_at, released, grants,
       takeovers, steals, releases
  FROM pylease_leases_before_0007;

DROP TABLE pylease_leases_before_0007;

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

-- A deleted row (a pruned name) raises the floor its next first grant starts above.
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

-- A new lease row registers its name, or finds it a semaphore's and fails.
CREATE TRIGGER pylease_leases_register AFTER INSERT ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: name is a semaphore, not a lease')
     WHERE EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name AND kind <> 'lease');
    INSERT OR IGNORE INTO pylease_names (name, kind) VALUES (NEW.name, 'lease');
END;

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
