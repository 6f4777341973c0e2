-- A write batch's rows go in through one function instead of one statement of five parts.
-- Every session plans each statement afresh for its own parameters (a range read needs that),
-- and planning the batch's statement took about a seventh of PostgreSQL's CPU per batch
-- (`perf`, 100,000 creates). The function's statements touch rows by key alone (inserts, an
-- upsert on the key, the one current revision), so one plan fits every batch: PL/pgSQL keeps
-- it for the session.
--
-- Arguments: the new log rows column by column; what each replaced (kv_replaced); each key's
-- newest row (kv_head); the new current revision, and the one the batch presumes. Under the
-- writers' lock (taken again if the caller's transaction holds it already), the batch writes
-- only if the current revision is still the presumed one, and then returns the new one and
-- sends the commit notification; otherwise it writes nothing and returns no row.
CREATE FUNCTION etcdsql_append(
    revisions BIGINT[], subs BIGINT[], names BYTEA[], createds BOOLEAN[], deleteds BOOLEAN[],
    create_revisions BIGINT[], prev_revisions BIGINT[], versions BIGINT[], leases BIGINT[],
    vals BYTEA[], old_leases BIGINT[],
    replaced_by BIGINT[], replaced_names BYTEA[], replaced_revisions BIGINT[],
    replaced_deleteds BOOLEAN[],
    head_names BYTEA[], head_revisions BIGINT[], head_deleteds BOOLEAN[],
    new_current BIGINT, presumed BIGINT
) RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    moved BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(28556942883647852);
    UPDATE meta SET value = new_current
        WHERE name = 'current_revision' AND value = presumed
        RETURNING value INTO moved;
    IF moved IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, prev_revision,
                        version, lease, value, old_lease)
        SELECT * FROM unnest(revisions, subs, names, createds, deleteds, create_revisions,
                             prev_revisions, versions, leases, vals, old_leases);
    INSERT INTO kv_replaced (superseded_by, name, revision, deleted)
        SELECT * FROM unnest(replaced_by, replaced_names, replaced_revisions, replaced_deleteds);
    INSERT INTO kv_head (name, revision, deleted)
        SELECT * FROM unnest(head_names, head_revisions, head_deleteds)
        ON CONFLICT (name) DO UPDATE SET revision = excluded.revision, deleted = excluded.deleted;
    PERFORM pg_notify('etcdsql_commit', moved::text);
    RETURN NEXT moved;
END
$$;
