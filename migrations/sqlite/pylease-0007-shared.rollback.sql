-- pylease 0007 rollback (SQLite): no readers. Every share is lost, and the names
-- that only readers ever claimed (no holder) are forgotten.
DROP TRIGGER pylease_shared_claims_check;
DROP VIEW pylease_shared_claims;
DROP TABLE pylease_waiters;
DROP TRIGGER pylease_shared_history_claimed;
DROP TRIGGER pylease_leases_readers_over;
DROP TRIGGER pylease_shared_update_check;
DROP TABLE pylease_shared;

CREATE TABLE pylease_leases_after_0007 AS SELECT * FROM pylease_leases;
DROP TABLE pylease_leases;

CREATE TABLE pylease_leases (
    name        TEXT    NOT NULL PRIMARY KEY,
    holder      TEXT    NOT NULL,
    fence       INTEGER NOT NULL CHECK (fence > 0),
    ttl         REAL    NOT NULL,
    acquired_at REAL    NOT NULL,
    renewed_at  REAL    NOT NULL,
    expires_at  REAL    NOT NULL,
    released    INTEGER NOT NULL DEFAULT 0 CHECK (released IN (0, 1)),
    grants      INTEGER NOT NULL DEFAULT 0,
    takeovers   INTEGER NOT NULL DEFAULT 0,
    steals      INTEGER NOT NULL DEFAULT 0,
    releases    INTEGER NOT NULL DEFAULT 0
) STRICT;

INSERT INTO pylease_leases (name, holder, fence, ttl, acquired_at, renewed_at, expires_at,
                            released, grants, takeovers, steals, releases)
SELECT name, holder, fence, ttl, acquired_at, renewed_at, expires_at, released, grants,
       takeovers, steals, releases
  FROM pylease_leases_after_0007
 WHERE holder IS NOT NULL;

DELETE FROM pylease_names
 WHERE kind = 'lease' AND name NOT IN (SELECT name FROM pylease_leases);

DROP TABLE pylease_leases_after_0007;

CREATE TRIGGER pylease_leases_insert_check BEFORE INSERT ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: name must not be NULL') WHERE NEW.name IS NULL;
    SELECT RAISE(ABORT, 'pylease: name must not be empty') WHERE NEW.name = '';
    SELECT RAISE(ABORT, 'pylease: name must be at most 200 characters') WHERE length(NEW.name) > 200;
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: holder must not be NULL') WHERE NEW.holder IS NULL;
    SELECT RAISE(ABORT, 'pylease: holder must not be empty') WHERE NEW.holder = '';
    SELECT RAISE(ABORT, 'pylease: holder must be at most 200 characters') WHERE length(NEW.holder) > 200;
END;

CREATE TRIGGER pylease_leases_update_check BEFORE UPDATE ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: holder must not be NULL') WHERE NEW.holder IS NULL;
    SELECT RAISE(ABORT, 'pylease: holder must not be empty') WHERE NEW.holder = '';
    SELECT RAISE(ABORT, 'pylease: holder must be at most 200 characters') WHERE length(NEW.holder) > 200;
    SELECT RAISE(ABORT, 'pylease: a fence never goes back') WHERE NEW.fence < OLD.fence;
    SELECT RAISE(ABORT, 'pylease: a lease keeps its name') WHERE NEW.name IS NOT OLD.name;
END;

CREATE TRIGGER pylease_leases_floor AFTER DELETE ON pylease_leases
BEGIN
    UPDATE pylease_fence_floor SET floor = max(floor, OLD.fence);
END;

CREATE TRIGGER pylease_leases_fences_exhausted BEFORE UPDATE OF fence ON pylease_leases
WHEN NEW.fence IS NULL
BEGIN
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this lease has used every fence (2^63-1)');
END;

CREATE TRIGGER pylease_history_created AFTER INSERT ON pylease_leases
WHEN (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence)
    VALUES (NEW.acquired_at, NEW.name, 'claimed', NEW.holder, NEW.fence);
END;

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

CREATE TRIGGER pylease_history_released AFTER UPDATE OF released ON pylease_leases
WHEN NEW.released AND NOT OLD.released
 AND (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence)
    VALUES (round((julianday('now') - 2440587.5) * 86400.0, 3), NEW.name, 'released',
            NEW.holder, NEW.fence);
END;

CREATE TRIGGER pylease_leases_register AFTER INSERT ON pylease_leases
BEGIN
    SELECT RAISE(ABORT, 'pylease: name is a semaphore, not a lease')
     WHERE EXISTS (SELECT 1 FROM pylease_names WHERE name = NEW.name AND kind <> 'lease');
    INSERT OR IGNORE INTO pylease_names (name, kind) VALUES (NEW.name, 'lease');
END;
