-- claim_shared_new: take a new share of lease :name for :ttl_seconds as reader
-- :holder, a holder the caller chose (the Python API's and the command line's; the
-- PostgreSQL function is pylease_claim_shared with new_tenure true), as
-- claim_shared.sql but: busy while :holder's own share of the epoch is unexpired
-- (another process, or an earlier block whose release is still on its way, uses
-- this holder), and never let in past a waiting writer for being a reader already;
-- otherwise a new share, with an id of its own, replaces any earlier row of
-- :holder, so that a late release or renewal of that earlier share (which names
-- its id) touches nothing of this one.
--
-- Run its statements in order inside one BEGIN IMMEDIATE ... COMMIT (the last one
-- answers). Parameters (named): as claim_shared.sql.
-- Result: one row (epoch INTEGER, share INTEGER) when granted; no row when busy.

-- The checks, and the name's row on its first use.
INSERT INTO pylease_shared_claims (name, ttl, holder) VALUES (:name, :ttl_seconds, :holder);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
UPDATE pylease_leases
   SET released  = 1,
       takeovers = takeovers + 1
 WHERE name = :name AND NOT released AND expires_at <= (SELECT now FROM clock)
   AND NOT EXISTS (SELECT 1 FROM pylease_waiters AS w, clock
                    WHERE w.name = :name AND w.expires_at > clock.now);

-- The takeover just made (changes(): the statement before), as lease_claim records one.
INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder)
SELECT round((julianday('now') - 2440587.5) * 86400.0, 3), l.name, 'taken_over', :holder,
       l.fence, l.holder
  FROM pylease_leases AS l
 WHERE changes() > 0 AND l.name = :name
   AND coalesce((SELECT value FROM pylease_settings WHERE name = 'history'), '')
       IN ('', 'rare', 'all');

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
INSERT INTO pylease_shared AS s (name, holder, epoch, ttl, acquired_at, renewed_at, expires_at,
                                 share)
SELECT :name, :holder, l.fence, :ttl_seconds, clock.now, clock.now, clock.now + :ttl_seconds,
       (SELECT id FROM pylease_share_ids)
  FROM pylease_leases AS l, clock
 WHERE l.name = :name AND l.released AND l.expires_at <= clock.now
   AND NOT EXISTS (SELECT 1 FROM pylease_waiters AS w
                    WHERE w.name = :name AND w.expires_at > clock.now)
   AND NOT EXISTS (SELECT 1 FROM pylease_shared AS m
                    WHERE m.name = :name AND m.holder = :holder AND m.epoch = l.fence
                      AND m.expires_at > clock.now)
    ON CONFLICT (name, holder) DO UPDATE
   SET acquired_at = excluded.acquired_at,
       expires_at  = excluded.expires_at,
       share       = excluded.share,
       epoch       = excluded.epoch,
       ttl         = excluded.ttl,
       renewed_at  = excluded.renewed_at
RETURNING epoch, share;
