-- pylease 0003 rollback (SQLite): no counters, history or settings (all lost).
DROP TRIGGER pylease_history_released;
DROP TRIGGER pylease_history_granted;
DROP TRIGGER pylease_history_created;
DROP TABLE pylease_settings;
DROP TRIGGER pylease_events_append_only;
DROP TABLE pylease_events;
ALTER TABLE pylease_leases DROP COLUMN releases;
ALTER TABLE pylease_leases DROP COLUMN steals;
ALTER TABLE pylease_leases DROP COLUMN takeovers;
ALTER TABLE pylease_leases DROP COLUMN grants;
