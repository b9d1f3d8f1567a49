-- permit_set_max: change the limit of semaphore :name to :max_permits, for the
-- claims that start after this commits (contract: permit_set_max). Slots above a
-- lowered limit are not granted again and drain as their holders leave.
--
-- Call it as one statement inside BEGIN IMMEDIATE ... COMMIT. Parameters (named):
--   :name         TEXT, 1 to 200 characters
--   :max_permits  INTEGER, 1 to 10000 (check it yourself)
-- Result: no row. Fails with "pylease: name is not a semaphore ..." or "pylease:
-- name is a lease, not a semaphore" (constraint errors).
INSERT INTO pylease_permit_limits (name, max_permits) VALUES (:name, :max_permits);
