-- etcd's auth store; see migrations/sqlite/0005_auth.sql.
CREATE TABLE auth_users (
    name   TEXT PRIMARY KEY,
    record BYTEA NOT NULL
);

CREATE TABLE auth_roles (
    name   TEXT PRIMARY KEY,
    record BYTEA NOT NULL
);

INSERT INTO meta (name, value) VALUES ('auth_enabled', 0), ('auth_revision', 1)
    ON CONFLICT (name) DO NOTHING;
