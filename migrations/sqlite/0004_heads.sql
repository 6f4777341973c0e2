-- Fewer pages per write. An update used to touch four places in key order: the new row's entry
-- in kv_log_name_revision and in kv_log_live, the predecessor's entry in kv_log_live, and the
-- predecessor row itself (superseded_by). SQLite logs and checkpoints whole pages, so each of
-- those cost a page in the WAL and another in the database file.
--
-- - kv_log_name_revision goes: a row is found by its revision through the primary key (every
--   lookup by (name, revision) knows the revision), and a key's newest row through kv_log_head.
-- - kv_log_live becomes kv_log_head, which keeps tombstones too (they are few: compaction
--   removes them), so a key's newest row is always in it: what the writer's key index loads,
--   and where a read of one key at an older revision starts to walk back its prev_revision.
-- - From here on old_value is left NULL: a watch's prev_kv comes from the predecessor row
--   (prev_revision), which compaction keeps as long as a watch can ask for the change. Rows
--   written before keep theirs. Without the old value a row is half as wide, and rows of 1 KiB
--   values pack three to a page instead of one.
DROP INDEX kv_log_name_revision;
DROP INDEX kv_log_live;
CREATE INDEX kv_log_head ON kv_log (name, revision, deleted) WHERE superseded_by IS NULL;
