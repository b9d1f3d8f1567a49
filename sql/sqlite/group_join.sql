-- group_join: join group :grp as :member for :ttl_seconds, with :data (contract:
-- group_join).
--
-- Four statements: run them all, in order, inside one BEGIN IMMEDIATE ... COMMIT,
-- with the same named parameters. Parameters (named):
--   :grp          TEXT, 1 to 190 characters
--   :member       TEXT, 1 to 200 characters
--   :ttl_seconds  REAL, more than 0 and at most 31622400 (366 days)
--   :data         TEXT (JSON) or NULL; at most 8192 characters
-- A join is not idempotent: a member name is one incarnation at a time. A granted
-- join gets an incarnation above every one the group issued, and deletes the rows
-- of the group's gone members.
-- Result of the last: one row (incarnation INTEGER) when joined; no row when that
-- member name is live (a busy join writes nothing). Bad arguments fail with
-- "pylease: <parameter> must ..." (constraint error). SQLite has no NOTIFY:
-- watchers poll.
INSERT OR IGNORE INTO pylease_groups (grp) VALUES (:grp);

WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
INSERT INTO pylease_members AS m (grp, member, incarnation, ttl, joined_at, renewed_at,
                                  expires_at, data)
SELECT g.grp, :member,
       CASE WHEN g.incarnation < 9223372036854775807 THEN g.incarnation + 1 END,
       :ttl_seconds, clock.now, clock.now, clock.now + :ttl_seconds, json(:data)
  FROM clock, pylease_groups AS g
 WHERE g.grp = :grp
    ON CONFLICT (grp, member) DO UPDATE
   SET incarnation = excluded.incarnation,
       ttl         = excluded.ttl,
       joined_at   = excluded.joined_at,
       renewed_at  = excluded.renewed_at,
       expires_at  = excluded.expires_at,
       data        = excluded.data
 WHERE m.expires_at <= excluded.joined_at;

-- Joined just now: the member's incarnation is above the group's last one.
WITH clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3))
DELETE FROM pylease_members
 WHERE grp = :grp AND member <> :member AND expires_at <= (SELECT now FROM clock)
   AND (SELECT m.incarnation > g.incarnation
          FROM pylease_members AS m JOIN pylease_groups AS g ON g.grp = m.grp
         WHERE m.grp = :grp AND m.member = :member);

UPDATE pylease_groups
   SET incarnation = m.incarnation
  FROM pylease_members AS m
 WHERE pylease_groups.grp = :grp AND m.grp = :grp AND m.member = :member
   AND m.incarnation > pylease_groups.incarnation
RETURNING incarnation;
