-- pylease 0006 rollback (SQLite): no groups (every group and member is lost).
DROP TRIGGER pylease_members_update_check;
DROP TRIGGER pylease_members_insert_check;
DROP TABLE pylease_members;
DROP TRIGGER pylease_groups_insert_check;
DROP TABLE pylease_groups;
