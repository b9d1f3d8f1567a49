-- pylease 0006 (SQLite): groups (contract revision 3, section 5.5). Keep
-- sql/sqlite/schema.sql in step (a test compares).
--   * pylease_groups: one row per group ever joined, with the last incarnation it
--     issued, so that incarnations never go back though members' rows are deleted;
--   * pylease_members: one row per member name of a group, live or gone (a gone
--     member's row stays until the group's next join deletes it). Rows are checked
--     with the messages of the PostgreSQL API.
-- depends: pylease-0005-prune

CREATE TABLE pylease_groups (
    grp         TEXT    NOT NULL PRIMARY KEY,
    incarnation INTEGER NOT NULL DEFAULT 0 CHECK (incarnation >= 0)
) STRICT;

CREATE TRIGGER pylease_groups_insert_check BEFORE INSERT ON pylease_groups
BEGIN
    SELECT RAISE(ABORT, 'pylease: grp must not be NULL') WHERE NEW.grp IS NULL;
    SELECT RAISE(ABORT, 'pylease: grp must not be empty') WHERE NEW.grp = '';
    SELECT RAISE(ABORT, 'pylease: grp must be at most 190 characters') WHERE length(NEW.grp) > 190;
END;

-- A member is live while expires_at is ahead (a leave sets it to the moment of the
-- leave). data is JSON text.
CREATE TABLE pylease_members (
    grp         TEXT    NOT NULL,
    member      TEXT    NOT NULL,
    incarnation INTEGER NOT NULL CHECK (incarnation > 0),
    ttl         REAL    NOT NULL,
    joined_at   REAL    NOT NULL,
    renewed_at  REAL    NOT NULL,
    expires_at  REAL    NOT NULL,
    data        TEXT,
    PRIMARY KEY (grp, member)
) STRICT;

-- Checked for every join, also one that finds the member live (its row is proposed).
-- A group past its last incarnation (group_join.sql computes NULL there) fails.
CREATE TRIGGER pylease_members_insert_check BEFORE INSERT ON pylease_members
BEGIN
    SELECT RAISE(ABORT, 'pylease: member must not be NULL') WHERE NEW.member IS NULL;
    SELECT RAISE(ABORT, 'pylease: member must not be empty') WHERE NEW.member = '';
    SELECT RAISE(ABORT, 'pylease: member must be at most 200 characters') WHERE length(NEW.member) > 200;
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this group has used every incarnation (2^63-1)')
     WHERE NEW.incarnation IS NULL;
END;

CREATE TRIGGER pylease_members_update_check BEFORE UPDATE ON pylease_members
BEGIN
    SELECT RAISE(ABORT, 'pylease: ttl must not be NULL') WHERE NEW.ttl IS NULL;
    SELECT RAISE(ABORT, 'pylease: ttl must be finite') WHERE abs(NEW.ttl) = 9e999;
    SELECT RAISE(ABORT, 'pylease: ttl must be positive') WHERE NEW.ttl <= 0;
    SELECT RAISE(ABORT, 'pylease: ttl must be at most 366 days') WHERE NEW.ttl > 31622400;
    SELECT RAISE(ABORT, 'pylease: data must be at most 8192 characters as JSON text')
     WHERE length(NEW.data) > 8192;
    SELECT RAISE(ABORT, 'pylease: fences exhausted: this group has used every incarnation (2^63-1)')
     WHERE NEW.incarnation IS NULL;
    SELECT RAISE(ABORT, 'pylease: an incarnation never goes back') WHERE NEW.incarnation < OLD.incarnation;
    SELECT RAISE(ABORT, 'pylease: a member keeps its group and name')
     WHERE NEW.grp IS NOT OLD.grp OR NEW.member IS NOT OLD.member;
END;
