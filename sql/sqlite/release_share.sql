-- release_share: give back the share of lease :name that reader :holder holds, of
-- epoch :epoch and with the id :share, as claim_shared.sql or claim_shared_new.sql
-- answered them (the PostgreSQL function is pylease_release_share): a late release
-- of an earlier share of the same holder then deletes nothing of a later one.
-- Parameters (named):
--   :name    TEXT
--   :holder  TEXT
--   :epoch   INTEGER
--   :share   INTEGER
-- Result: one row (ours INTEGER: 1 when the share was still its own, no exclusive
-- grant since its epoch; 0 when it was not) when it was given back; no row when
-- :holder held no such share. A release records 'released' under 'all'.
INSERT INTO pylease_events (at, name, event, holder, fence)
SELECT round((julianday('now') - 2440587.5) * 86400.0, 3), s.name, 'released', s.holder, s.epoch
  FROM pylease_shared AS s
  JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch
 WHERE s.name = :name AND s.holder = :holder AND s.epoch = :epoch AND s.share = :share
   AND (SELECT value FROM pylease_settings WHERE name = 'history') = 'all';

DELETE FROM pylease_shared
 WHERE name = :name AND holder = :holder AND epoch = :epoch AND share = :share
RETURNING epoch = (SELECT l.fence FROM pylease_leases AS l WHERE l.name = :name);
