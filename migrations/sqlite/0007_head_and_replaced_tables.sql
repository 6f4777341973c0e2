-- Writes in revision order. Until now an update rewrote its predecessor row in place to set
-- `superseded_by`, and both kv_log_head and kv_log_superseded were kept in key order, so each
-- write dirtied pages all over the file: about three pages per create and four per update
-- (BENCHMARKS.md, "SQLite writes 1 KiB pages"). SQLite logs and checkpoints whole pages.
--
-- - kv_log is now append-only: a row is written once and deleted only by compaction.
-- - kv_head holds each key's newest row (tombstones included), in key order: what kv_log_head
--   indexed. It is the one structure a write still touches in key order, one small entry.
-- - kv_replaced records which change replaced which row, keyed by the replacing revision, so
--   the writer appends to it in order. A read at an older revision R finds there the rows
--   replaced after R, as it found them in kv_log_superseded; compaction finds there the rows
--   replaced below the compact revision. It carries the replaced row's `deleted` so that
--   neither needs the row to tell a tombstone.
CREATE TABLE kv_head (
    name     BLOB    NOT NULL PRIMARY KEY,
    revision INTEGER NOT NULL,
    deleted  INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE kv_replaced (
    -- The revision of the change that replaced the row.
    superseded_by INTEGER NOT NULL,
    name          BLOB    NOT NULL,
    -- The replaced row's revision and whether it was a tombstone.
    revision      INTEGER NOT NULL,
    deleted       INTEGER NOT NULL,
    PRIMARY KEY (superseded_by, name)
) WITHOUT ROWID;

-- MAX keeps the migration going on a log whose bookkeeping was damaged (two rows of a key
-- marked newest): the newest of them wins, and `etcdsql check` reports what else is off.
INSERT INTO kv_head (name, revision, deleted)
    SELECT name, MAX(revision), deleted FROM kv_log WHERE superseded_by IS NULL GROUP BY name;

INSERT INTO kv_replaced (superseded_by, name, revision, deleted)
    SELECT superseded_by, name, revision, deleted FROM kv_log WHERE superseded_by IS NOT NULL;

DROP INDEX kv_log_head;
DROP INDEX kv_log_superseded;
ALTER TABLE kv_log DROP COLUMN superseded_by;
