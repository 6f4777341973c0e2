-- Leases live next to the log so that a lease, and how long it has left, survive a restart.
CREATE TABLE leases (
    id         INTEGER PRIMARY KEY,
    -- The TTL granted, in seconds (what keep-alives renew to).
    ttl        INTEGER NOT NULL,
    -- When the lease runs out, in Unix milliseconds: an absolute deadline, so a restart does
    -- not restart the countdown.
    expires_at INTEGER NOT NULL
);

-- The expiry loop asks for the leases that ran out first.
CREATE INDEX leases_expires_at ON leases (expires_at);

-- Revoking a lease finds the keys attached to it. Only rows with a lease are indexed.
CREATE INDEX kv_log_lease ON kv_log (lease) WHERE lease != 0;
