-- etcd's auth store: each user and role as etcd's own record (authpb.User / authpb.Role,
-- protobuf-encoded), keyed by name. Whether auth is on and the auth revision are meta rows.
-- src/auth reads it all and replaces it whole, guarded by the auth revision.
CREATE TABLE auth_users (
    name   TEXT PRIMARY KEY,
    record BLOB NOT NULL
);

CREATE TABLE auth_roles (
    name   TEXT PRIMARY KEY,
    record BLOB NOT NULL
);

INSERT INTO meta (name, value) VALUES ('auth_enabled', 0), ('auth_revision', 1)
    ON CONFLICT (name) DO NOTHING;
