-- pylease 0003 (SQLite): counters, history and its setting (contract revision 2,
-- section 1). Keep sql/sqlite/schema.sql in step (a test compares).
--   * counters on the lease row (grants, takeovers, steals, releases), kept by
--     the statements of claim.sql, steal.sql and release.sql themselves; they
--     count from this migration on;
--   * pylease_events, the history, written by the triggers below in the same
--     transaction as the grant or release;
--   * the setting: SQLite has no custom GUCs, so it is the row named 'history'
--     of the table pylease_settings, for every connection to the file:
--       INSERT OR REPLACE INTO pylease_settings (name, value) VALUES ('history', 'all');
--     'rare' (the default, also when the row is missing or empty) records
--     taken_over and stolen, 'all' also claimed and released, 'none' nothing.
--     From Python: pylease.sqlite.set_history(conn, 'all').
-- depends: pylease-0002-safety

ALTER TABLE pylease_leases ADD COLUMN grants INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pylease_leases ADD COLUMN takeovers INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pylease_leases ADD COLUMN steals INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pylease_leases ADD COLUMN releases INTEGER NOT NULL DEFAULT 0;

-- What happened to each lease; rows are only ever added (and pruned). The
-- indexes serve history.sql (all names, one name) and prune_history.sql.
CREATE TABLE pylease_events (
    id              INTEGER PRIMARY KEY,
    at              REAL    NOT NULL,
    name            TEXT    NOT NULL,
    event           TEXT    NOT NULL CHECK (event IN ('claimed', 'taken_over', 'stolen', 'released')),
    holder          TEXT    NOT NULL,
    fence           INTEGER NOT NULL,
    previous_holder TEXT
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

-- A first claim (or a steal of a new name): 'claimed', under 'all' only.
CREATE TRIGGER pylease_history_created AFTER INSERT ON pylease_leases
WHEN (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
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

CREATE TRIGGER pylease_history_released AFTER UPDATE OF released ON pylease_leases
WHEN NEW.released AND NOT OLD.released
 AND (SELECT value FROM pylease_settings WHERE name = 'history') = 'all'
BEGIN
    INSERT INTO pylease_events (at, name, event, holder, fence)
    VALUES (round((julianday('now') - 2440587.5) * 86400.0, 3), NEW.name, 'released',
            NEW.holder, NEW.fence);
END;
