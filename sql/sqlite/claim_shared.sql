-- claim_shared: take a share of lease :name for :ttl_seconds as reader :holder
-- (contract: lease_claim_shared).
--
-- Run its statements in order inside one BEGIN IMMEDIATE ... COMMIT (the last one
-- answers). Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :holder       TEXT, 1 to 200 characters
-- Result: one row (epoch INTEGER: the fence of the name's latest exclusive grant,
-- 0 if none; share INTEGER: the share's id, which release_share.sql and
-- renew_held.sql name, kept by a claim again of the same epoch) when granted; no row while an exclusive holder holds the name (or it
-- rests after a min_hold release), or a writer waits in pylease_waiters (writer
-- preference), unless :holder reads it already (then its share is extended, never
-- earlier). Readers never wait for each other's shares. When the exclusive holder
-- died (its ttl ran out without a release), the first reader marks its row
-- released, so that a late renewal cannot make it hold again beside the readers:
-- a takeover, counted and recorded as one. Bad arguments fail with
-- "pylease: <parameter> must ..."; a semaphore's name with "pylease: name is a
-- semaphore, not a lease".

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
   AND (NOT EXISTS (SELECT 1 FROM pylease_waiters AS w
                     WHERE w.name = :name AND w.expires_at > clock.now)
        OR EXISTS (SELECT 1 FROM pylease_shared AS m
                    WHERE m.name = :name AND m.holder = :holder AND m.epoch = l.fence))
    ON CONFLICT (name, holder) DO UPDATE
   SET acquired_at = CASE WHEN s.epoch = excluded.epoch THEN s.acquired_at
                          ELSE excluded.acquired_at END,
       expires_at  = CASE WHEN s.epoch = excluded.epoch THEN max(s.expires_at, excluded.expires_at)
                          ELSE excluded.expires_at END,
       share       = CASE WHEN s.epoch = excluded.epoch THEN s.share ELSE excluded.share END,
       epoch       = excluded.epoch,
       ttl         = excluded.ttl,
       renewed_at  = excluded.renewed_at
RETURNING epoch, share;
