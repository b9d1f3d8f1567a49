-- set_data: replace the data of the lease :name that :holder still holds
-- (PostgreSQL: lease_set_data), in the tenure :fence (NULL: whichever), also past
-- its expiry if nobody took it, as renew.sql.
--
-- Call it inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :name    TEXT, 1 to 200 characters
--   :holder  TEXT, 1 to 200 characters
--   :data    TEXT (JSON) or NULL; at most 8192 characters
--   :fence   INTEGER or NULL
-- Result: one row (1) when it was still this holder's, none otherwise.
UPDATE pylease_leases
   SET data = json(:data)
 WHERE name = :name AND holder = :holder AND NOT released
   AND (:fence IS NULL OR fence = :fence)
RETURNING 1;
