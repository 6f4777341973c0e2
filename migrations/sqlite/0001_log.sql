-- The revision log: one row per change of one key at one revision (kine's idea, extended with
-- etcd's sub-revisions so a multi-key txn shares one revision). The current state of every key
-- is its newest row; compaction deletes rows that no read at or above the compact revision can see.
CREATE TABLE kv_log (
    -- The etcd revision of the change; every change of one txn shares it.
    revision        INTEGER NOT NULL,
    -- Order of the change inside its revision (etcd's sub-revision), so watchers see a txn's
    -- events in the order its ops ran.
    sub             INTEGER NOT NULL,
    -- The key, compared byte-wise (SQLite compares BLOBs with memcmp).
    name            BLOB    NOT NULL,
    -- 1 when this change created the key (it had no live version before).
    created         INTEGER NOT NULL,
    -- 1 when this change deleted the key (a tombstone).
    deleted         INTEGER NOT NULL,
    create_revision INTEGER NOT NULL,
    -- Revision of this key's previous row, 0 if none: compaction finds superseded rows with it.
    prev_revision   INTEGER NOT NULL,
    -- The key's version after a put; for a tombstone, the version the key had when deleted
    -- (etcd reports 0 for the deletion itself), so the row alone rebuilds the watch's prev_kv.
    version         INTEGER NOT NULL,
    lease           INTEGER NOT NULL,
    value           BLOB    NOT NULL,
    -- The value and lease the key had before this change (NULL/0 when it was absent), so a
    -- watch event carries prev_kv without a second lookup, even for rows whose predecessor has
    -- been compacted away.
    old_value       BLOB,
    old_lease       INTEGER NOT NULL,
    PRIMARY KEY (revision, sub)
);

-- Range reads ("newest row per key at revision R") and single-key lookups.
CREATE UNIQUE INDEX kv_log_name_revision ON kv_log (name, revision);

-- Scalar state that must move atomically with the log.
CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);

-- A new store starts at revision 1, like etcd.
INSERT INTO meta (name, value) VALUES
    ('current_revision', 1),
    ('compact_revision', 0),
    ('compacted_through', 0);
