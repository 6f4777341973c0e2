-- Leases with their absolute deadline (Unix milliseconds); see migrations/sqlite/0002_leases.sql.
CREATE TABLE leases (
    id         BIGINT PRIMARY KEY,
    ttl        BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE INDEX leases_expires_at ON leases (expires_at);

CREATE INDEX kv_log_lease ON kv_log (lease) WHERE lease <> 0;
