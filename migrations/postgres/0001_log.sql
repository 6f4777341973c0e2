-- The revision log (see migrations/sqlite/0001_log.sql for the meaning of each column): one row
-- per change of one key at one revision. BYTEA compares byte-wise, as etcd orders keys.
CREATE TABLE kv_log (
    revision        BIGINT  NOT NULL,
    sub             BIGINT  NOT NULL,
    name            BYTEA   NOT NULL,
    created         BOOLEAN NOT NULL,
    deleted         BOOLEAN NOT NULL,
    create_revision BIGINT  NOT NULL,
    prev_revision   BIGINT  NOT NULL,
    version         BIGINT  NOT NULL,
    lease           BIGINT  NOT NULL,
    value           BYTEA   NOT NULL,
    old_value       BYTEA,
    old_lease       BIGINT  NOT NULL,
    PRIMARY KEY (revision, sub)
);

CREATE UNIQUE INDEX kv_log_name_revision ON kv_log (name, revision);

CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);

INSERT INTO meta (name, value) VALUES
    ('current_revision', 1),
    ('compact_revision', 0),
    ('compacted_through', 0);
