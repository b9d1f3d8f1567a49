-- Undo pylease 0009 (SQLite): readers' shares without an id of their own.

DROP TRIGGER pylease_shared_share_redrawn;
DROP TRIGGER pylease_shared_share_drawn;
DROP TABLE pylease_share_ids;
ALTER TABLE pylease_shared DROP COLUMN share;
