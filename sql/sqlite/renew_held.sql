-- renew_held: the keeper's renewal of everything a process holds, whatever its
-- kind, each element at its own ttl and only in the tenure the keeper knows
-- (internal; the PostgreSQL function is pylease_renew_held). An element of kind
-- 'lease' renews the lease as renew_each.sql, while its fence is the element's; one
-- of kind 'permit' renews every slot of the semaphore that its holder holds, all or
-- nothing, as permit_renew.sql, while the holder holds the element's slot with the
-- element's fence; one of kind 'shared' renews a reader's share, as renew.sql,
-- while its epoch is still the name's fence and is the element's fence (a reader's
-- tenure is its epoch); one of kind 'member' renews the member (the element's
-- holder) of the group (its name) as group_renew.sql, while it is live with the
-- incarnation that is the element's fence. A null fence or slot: whatever tenure
-- the holder has. Never
-- earlier. A lost element (a late renewal of an earlier tenure of the same holder
-- included), or one of the other kind, is that element's "not renewed", never an
-- error.
--
-- Run its five statements in order inside one BEGIN IMMEDIATE ... COMMIT (the
-- last one answers; under the write lock, what it reads is what the first four
-- renewed: a renewal changes no holder, fence or incarnation). Parameters (named):
--   :kinds    TEXT, a JSON array of 'lease', 'shared', 'permit' or 'member', as long
--             as :names
--   :names    TEXT, a JSON array of names, e.g. '["sweep", "exports"]'
--   :holders  TEXT, a JSON array of holders, as long as :names
--   :ttls     TEXT, a JSON array of ttls in seconds (or null: the last ttl), as
--             long as :names
--   :fences   TEXT, a JSON array of fences (or null; a reader's: its epoch; a
--             member's: its incarnation), as long as :names
--   :slots    TEXT, a JSON array of slots (or null; a permit's), as long as :names
-- Result: one row per element of :names, in order: (name TEXT, renewed INTEGER,
-- expires_at REAL, server_time REAL, unix seconds; both NULL when not renewed;
-- release_requested_by TEXT, a renewed lease's step-down request, else NULL); a
-- semaphore's expires_at is the earliest of its holder's slots.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name, holder, ttl, fence) AS (
    SELECT n.value, h.value, t.value, f.value
      FROM json_each(:names) AS n
      JOIN json_each(:kinds) AS k ON k.key = n.key
      JOIN json_each(:holders) AS h ON h.key = n.key
      JOIN json_each(:ttls) AS t ON t.key = n.key
      JOIN json_each(:fences) AS f ON f.key = n.key
     WHERE k.value = 'lease'
)
UPDATE pylease_leases
   SET ttl        = coalesce((SELECT w.ttl FROM wanted AS w
                               WHERE w.name = pylease_leases.name
                                 AND w.holder = pylease_leases.holder), ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(
                        (SELECT w.ttl FROM wanted AS w
                          WHERE w.name = pylease_leases.name
                            AND w.holder = pylease_leases.holder), ttl))
 WHERE NOT released
   AND EXISTS (SELECT 1 FROM wanted AS w
                WHERE w.name = pylease_leases.name AND w.holder = pylease_leases.holder
                  AND (w.fence IS NULL OR w.fence = pylease_leases.fence));

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name, holder, ttl) AS (
    SELECT n.value, h.value, t.value
      FROM json_each(:names) AS n
      JOIN json_each(:kinds) AS k ON k.key = n.key
      JOIN json_each(:holders) AS h ON h.key = n.key
      JOIN json_each(:ttls) AS t ON t.key = n.key
      JOIN json_each(:fences) AS f ON f.key = n.key
      JOIN json_each(:slots) AS s ON s.key = n.key
     WHERE k.value = 'permit'
       AND EXISTS (SELECT 1 FROM pylease_permits AS q
                    WHERE q.name = n.value AND q.holder = h.value AND NOT q.released
                      AND (f.value IS NULL OR q.fence = f.value)
                      AND (s.value IS NULL OR q.slot = s.value))
),
whole(name, holder) AS (
    SELECT p.name, p.holder FROM pylease_permits AS p
     WHERE NOT p.released AND (p.name, p.holder) IN (SELECT name, holder FROM wanted)
     GROUP BY p.name, p.holder
    HAVING count(*) = min(p.permits) AND count(*) = max(p.permits)
)
UPDATE pylease_permits
   SET ttl        = coalesce((SELECT w.ttl FROM wanted AS w
                               WHERE w.name = pylease_permits.name
                                 AND w.holder = pylease_permits.holder), ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(
                        (SELECT w.ttl FROM wanted AS w
                          WHERE w.name = pylease_permits.name
                            AND w.holder = pylease_permits.holder), ttl))
 WHERE NOT released AND (name, holder) IN (SELECT name, holder FROM whole);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(name, holder, ttl, fence) AS (
    SELECT n.value, h.value, t.value, f.value
      FROM json_each(:names) AS n
      JOIN json_each(:kinds) AS k ON k.key = n.key
      JOIN json_each(:holders) AS h ON h.key = n.key
      JOIN json_each(:ttls) AS t ON t.key = n.key
      JOIN json_each(:fences) AS f ON f.key = n.key
     WHERE k.value = 'shared'
)
UPDATE pylease_shared
   SET ttl        = coalesce((SELECT w.ttl FROM wanted AS w
                               WHERE w.name = pylease_shared.name
                                 AND w.holder = pylease_shared.holder), ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(
                        (SELECT w.ttl FROM wanted AS w
                          WHERE w.name = pylease_shared.name
                            AND w.holder = pylease_shared.holder), ttl))
 WHERE epoch = (SELECT l.fence FROM pylease_leases AS l WHERE l.name = pylease_shared.name)
   AND EXISTS (SELECT 1 FROM wanted AS w
                WHERE w.name = pylease_shared.name AND w.holder = pylease_shared.holder
                  AND (w.fence IS NULL OR w.fence = pylease_shared.epoch));

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
wanted(grp, member, ttl, incarnation) AS (
    SELECT n.value, h.value, t.value, f.value
      FROM json_each(:names) AS n
      JOIN json_each(:kinds) AS k ON k.key = n.key
      JOIN json_each(:holders) AS h ON h.key = n.key
      JOIN json_each(:ttls) AS t ON t.key = n.key
      JOIN json_each(:fences) AS f ON f.key = n.key
     WHERE k.value = 'member'
)
UPDATE pylease_members
   SET ttl        = coalesce((SELECT w.ttl FROM wanted AS w
                               WHERE w.grp = pylease_members.grp
                                 AND w.member = pylease_members.member), ttl),
       renewed_at = (SELECT now FROM clock),
       expires_at = max(expires_at, (SELECT now FROM clock) + coalesce(
                        (SELECT w.ttl FROM wanted AS w
                          WHERE w.grp = pylease_members.grp
                            AND w.member = pylease_members.member), ttl))
 WHERE expires_at > (SELECT now FROM clock)
   AND EXISTS (SELECT 1 FROM wanted AS w
                WHERE w.grp = pylease_members.grp AND w.member = pylease_members.member
                  AND (w.incarnation IS NULL OR w.incarnation = pylease_members.incarnation));

WITH wanted(i, kind, name, holder, fence, slot) AS (
    SELECT n.key, k.value, n.value, h.value, f.value, s.value
      FROM json_each(:names) AS n
      JOIN json_each(:kinds) AS k ON k.key = n.key
      JOIN json_each(:holders) AS h ON h.key = n.key
      JOIN json_each(:fences) AS f ON f.key = n.key
      JOIN json_each(:slots) AS s ON s.key = n.key
),
found(i, expires_at, server_time, release_requested_by) AS (
    SELECT w.i, l.expires_at, l.renewed_at, l.release_requested_by
      FROM wanted AS w
      JOIN pylease_leases AS l ON l.name = w.name AND l.holder = w.holder AND NOT l.released
                              AND (w.fence IS NULL OR l.fence = w.fence)
     WHERE w.kind = 'lease'
    UNION ALL
    SELECT w.i, s.expires_at, s.renewed_at, NULL
      FROM wanted AS w
      JOIN pylease_shared AS s ON s.name = w.name AND s.holder = w.holder
                              AND (w.fence IS NULL OR s.epoch = w.fence)
      JOIN pylease_leases AS l ON l.name = s.name AND l.fence = s.epoch
     WHERE w.kind = 'shared'
    UNION ALL
    SELECT w.i, min(p.expires_at), max(p.renewed_at), NULL
      FROM wanted AS w
      JOIN pylease_permits AS p ON p.name = w.name AND p.holder = w.holder AND NOT p.released
     WHERE w.kind = 'permit'
       AND EXISTS (SELECT 1 FROM pylease_permits AS q
                    WHERE q.name = w.name AND q.holder = w.holder AND NOT q.released
                      AND (w.fence IS NULL OR q.fence = w.fence)
                      AND (w.slot IS NULL OR q.slot = w.slot))
     GROUP BY w.i
    HAVING count(*) = min(p.permits) AND count(*) = max(p.permits)
    UNION ALL
    SELECT w.i, m.expires_at, m.renewed_at, NULL
      FROM wanted AS w
      JOIN pylease_members AS m ON m.grp = w.name AND m.member = w.holder
                               AND (w.fence IS NULL OR m.incarnation = w.fence)
     WHERE w.kind = 'member'
       AND m.expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
)
SELECT w.name, f.i IS NOT NULL, f.expires_at, f.server_time, f.release_requested_by
  FROM wanted AS w LEFT JOIN found AS f ON f.i = w.i
 ORDER BY w.i;
