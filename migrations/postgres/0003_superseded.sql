-- The revision of the change that replaced each row (NULL for a key's newest row); see
-- migrations/sqlite/0003_superseded.sql for how reads and compaction use it.
ALTER TABLE kv_log ADD COLUMN superseded_by BIGINT;

UPDATE kv_log AS k SET superseded_by = s.next
FROM (
    SELECT revision, name, LEAD(revision) OVER (PARTITION BY name ORDER BY revision) AS next
    FROM kv_log
) AS s
WHERE s.name = k.name AND s.revision = k.revision AND s.next IS NOT NULL;

CREATE INDEX kv_log_live ON kv_log (name, revision) WHERE superseded_by IS NULL AND NOT deleted;

CREATE INDEX kv_log_superseded ON kv_log (superseded_by) INCLUDE (name, revision, deleted)
    WHERE superseded_by IS NOT NULL;
