-- prune: delete the names nobody has held for :idle_for_seconds, leases and
-- semaphores, with their counters (contract: lease_prune). Their history stays.
--
-- Call it as these statements inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :idle_for_seconds  REAL, from 0 to 31622400 (366 days; check it yourself)
-- A deleted row raises pylease_fence_floor (a trigger), above which a pruned name's
-- next first grant starts, so fences never go back. A name read within
-- :idle_for_seconds stays; the readers' rows of a name deleted go with it.
-- Result of the last: one row (name TEXT) per name deleted.
DELETE FROM pylease_permits
 WHERE name IN (SELECT name FROM pylease_permits GROUP BY name
                HAVING max(expires_at) <= round((julianday('now') - 2440587.5) * 86400.0, 3)
                                          - :idle_for_seconds);

DELETE FROM pylease_leases
 WHERE expires_at <= round((julianday('now') - 2440587.5) * 86400.0, 3) - :idle_for_seconds
   AND name NOT IN (SELECT name FROM pylease_shared
                     WHERE expires_at > round((julianday('now') - 2440587.5) * 86400.0, 3)
                                        - :idle_for_seconds);

DELETE FROM pylease_shared WHERE name NOT IN (SELECT name FROM pylease_leases);

DELETE FROM pylease_names
 WHERE name NOT IN (SELECT name FROM pylease_leases)
   AND name NOT IN (SELECT name FROM pylease_permits)
RETURNING name;
