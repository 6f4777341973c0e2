-- Which row replaced which moves out of the rows, as it did for SQLite in its migration 0007
-- (see there for what each table answers). Until now an update rewrote the row it replaced to
-- set `superseded_by`: PostgreSQL writes a new version of the whole row for that, 1 KiB value
-- included, and since `superseded_by` is indexed it also added entries to every index of the
-- log (no HOT update). Now the log is insert-only, and each write adds one small row to
-- kv_replaced and updates one small row of kv_head, whose one index (the key) never changes,
-- so that update is HOT: its new version stays on the same page and no index is touched.
-- Room on each page for those new versions: kv_head is updated far more than it grows.
CREATE TABLE kv_head (
    name     BYTEA   NOT NULL PRIMARY KEY,
    revision BIGINT  NOT NULL,
    deleted  BOOLEAN NOT NULL
) WITH (fillfactor = 70);

CREATE TABLE kv_replaced (
    -- The revision of the change that replaced the row.
    superseded_by BIGINT  NOT NULL,
    name          BYTEA   NOT NULL,
    -- The replaced row's revision and whether it was a tombstone.
    revision      BIGINT  NOT NULL,
    deleted       BOOLEAN NOT NULL,
    -- A read at an older revision finds its entries in the index alone: the table is only
    -- appended to, so its pages are soon all-visible.
    PRIMARY KEY (superseded_by, name) INCLUDE (revision, deleted)
);

-- DISTINCT ON keeps the migration going on a log whose bookkeeping was damaged (two rows of a
-- key marked newest): the newest of them wins, and `etcdsql check` reports what else is off.
INSERT INTO kv_head (name, revision, deleted)
    SELECT DISTINCT ON (name) name, revision, deleted FROM kv_log
    WHERE superseded_by IS NULL ORDER BY name, revision DESC;

INSERT INTO kv_replaced (superseded_by, name, revision, deleted)
    SELECT superseded_by, name, revision, deleted FROM kv_log WHERE superseded_by IS NOT NULL;

DROP INDEX kv_log_live;
DROP INDEX kv_log_superseded;
ALTER TABLE kv_log DROP COLUMN superseded_by;
