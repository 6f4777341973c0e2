-- The revision of the newest history fence: set when a process found the database's current
-- revision below one it had served (a failover to a standby that lacked the last commits) and
-- moved the revisions past everything served. 0: never fenced. See src/mvcc/fence.rs.
INSERT INTO meta (name, value) VALUES ('fence_revision', 0);
