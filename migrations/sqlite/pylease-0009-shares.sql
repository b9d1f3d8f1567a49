-- pylease 0009 (SQLite): a reader's share has an id of its own (issue 25; contract
-- 5.2 and 5.6), as PostgreSQL's 0018. Keep sql/sqlite/schema.sql in step.
--   * pylease_shared gains share, taken from pylease_share_ids by every new share (a
--     claim again of the same share keeps it);
--   * claim_shared.sql answers it beside the epoch; claim_shared_new.sql (a holder
--     the caller chose) is busy while that holder's share is live, else a new share;
--     release_share.sql gives back only the share it names; renew_held.sql renews a
--     'shared' element only while its share's id is the element's slot;
-- so that a reused holder's earlier block, releasing or renewing late, never touches
-- a later block's share.
-- depends: pylease-0008-data

ALTER TABLE pylease_shared ADD COLUMN share INTEGER NOT NULL DEFAULT 0;

CREATE TABLE pylease_share_ids (
    id INTEGER NOT NULL CHECK (id BETWEEN 1 AND 2147483647)
) STRICT;

-- The shares there are: an id each, and the next one above them.
UPDATE pylease_shared SET share = (rowid - 1) % 2147483647 + 1;
INSERT INTO pylease_share_ids (id) SELECT coalesce(max(share), 0) % 2147483647 + 1 FROM pylease_shared;

CREATE TRIGGER pylease_shared_share_drawn AFTER INSERT ON pylease_shared
BEGIN
    UPDATE pylease_share_ids SET id = id % 2147483647 + 1;
END;

CREATE TRIGGER pylease_shared_share_redrawn AFTER UPDATE OF share ON pylease_shared
WHEN NEW.share IS NOT OLD.share
BEGIN
    UPDATE pylease_share_ids SET id = id % 2147483647 + 1;
END;
