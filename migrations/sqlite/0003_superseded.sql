-- Which change replaced each row: the revision of the key's next row, NULL while the row is the
-- key's newest. A read at revision R then sees exactly the rows with revision <= R that were
-- not yet replaced at R (superseded_by NULL or > R), without looking for each key's newest row.
-- The writer keeps it as it appends: every row it writes replaces the row at its prev_revision.
ALTER TABLE kv_log ADD COLUMN superseded_by INTEGER;

UPDATE kv_log SET superseded_by = (
    SELECT MIN(s.revision) FROM kv_log AS s
    WHERE s.name = kv_log.name AND s.revision > kv_log.revision
);

-- The live keys of the current revision, in key order: the hot path of Range and count. It holds
-- the revision so that a count, and the `revision <= R` test, never touch the table.
CREATE INDEX kv_log_live ON kv_log (name, revision) WHERE superseded_by IS NULL AND deleted = 0;

-- Rows replaced after a revision R: what a read at an older revision sees beside the live
-- index, and what compaction deletes (rows replaced at or below the compact revision). It
-- carries what the read filters on, so counting at an older revision never touches the table.
CREATE INDEX kv_log_superseded ON kv_log (superseded_by, name, revision, deleted)
    WHERE superseded_by IS NOT NULL;
