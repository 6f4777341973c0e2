-- etcdsql's schema for MySQL and MariaDB, in one step (the other backends reached it in several;
-- migrations/sqlite explains each column). InnoDB: row locks and consistent snapshots are what
-- the backend's ordering and reads rest on.
--
-- Keys are VARBINARY, compared byte-wise as etcd orders them. 3000 bytes is what fits InnoDB's
-- 3072-byte limit on an index entry beside the other columns of kv_log_superseded.
CREATE TABLE kv_log (
    revision        BIGINT          NOT NULL,
    sub             BIGINT          NOT NULL,
    name            VARBINARY(3000) NOT NULL,
    created         BOOLEAN         NOT NULL,
    deleted         BOOLEAN         NOT NULL,
    create_revision BIGINT          NOT NULL,
    prev_revision   BIGINT          NOT NULL,
    version         BIGINT          NOT NULL,
    lease           BIGINT          NOT NULL,
    value           LONGBLOB        NOT NULL,
    -- Left NULL: a watch's prev_kv comes from the predecessor row (backups of other backends
    -- may carry it).
    old_value       LONGBLOB,
    old_lease       BIGINT          NOT NULL,
    -- The revision of the change that replaced the row, NULL while it is the key's newest.
    superseded_by   BIGINT,
    PRIMARY KEY (revision, sub),
    -- One key at a revision, the writer's lookups, and a watch's prev_kv.
    UNIQUE KEY kv_log_name_revision (name, revision),
    -- With no partial indexes, one index serves both kinds of visible row: its NULL prefix is
    -- every key's newest row in key order, the rest the rows replaced after a revision.
    KEY kv_log_superseded (superseded_by, name, revision, deleted),
    KEY kv_log_lease (lease)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

CREATE TABLE meta (
    name  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    value BIGINT NOT NULL
) ENGINE = InnoDB;

INSERT INTO meta (name, value) VALUES
    ('current_revision', 1),
    ('compact_revision', 0),
    ('compacted_through', 0),
    ('auth_enabled', 0),
    ('auth_revision', 1);

CREATE TABLE leases (
    id         BIGINT NOT NULL PRIMARY KEY,
    ttl        BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    KEY leases_expires_at (expires_at)
) ENGINE = InnoDB;

-- Names compare as their UTF-8 bytes, as etcd orders them.
CREATE TABLE auth_users (
    name   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    record LONGBLOB NOT NULL
) ENGINE = InnoDB;

CREATE TABLE auth_roles (
    name   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    record LONGBLOB NOT NULL
) ENGINE = InnoDB;
