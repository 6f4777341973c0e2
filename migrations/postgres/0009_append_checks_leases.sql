-- The batch's function also checks the leases its rows are attached to. A writer that presumes
-- the current revision reads those leases before it takes the writers' lock (reading them
-- inside its transaction held the lock through one more round trip per lease), so under the
-- lock the function makes sure each still exists: another instance may have revoked one
-- meanwhile, and a revocation of a lease with no keys moves no revision. If one is gone, or the
-- revision moved, it writes nothing and returns no row, and the batch runs again.
--
-- Arguments: those of etcdsql_append (migrations 0007 and 0008), then the leases, each once.
CREATE FUNCTION etcdsql_append(
    revisions BIGINT[], subs BIGINT[], names BYTEA[], createds BOOLEAN[], deleteds BOOLEAN[],
    create_revisions BIGINT[], prev_revisions BIGINT[], versions BIGINT[], leases BIGINT[],
    vals BYTEA[], old_leases BIGINT[],
    replaced_by BIGINT[], replaced_names BYTEA[], replaced_revisions BIGINT[],
    replaced_deleteds BOOLEAN[],
    head_names BYTEA[], head_revisions BIGINT[], head_deleteds BOOLEAN[],
    new_current BIGINT, presumed BIGINT, attached_leases BIGINT[]
) RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    moved BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(28556942883647852);
    IF cardinality(attached_leases) > 0
       AND (SELECT count(*) FROM leases WHERE id = ANY(attached_leases))
           < cardinality(attached_leases) THEN
        RETURN;
    END IF;
    UPDATE meta SET value = new_current
        WHERE name = 'current_revision' AND value = presumed
        RETURNING value INTO moved;
    IF moved IS NULL THEN
        RETURN;
    END IF;
    PERFORM etcdsql_insert_rows(revisions, subs, names, createds, deleteds, create_revisions,
                                prev_revisions, versions, leases, vals, old_leases,
                                replaced_by, replaced_names, replaced_revisions,
                                replaced_deleteds, head_names, head_revisions, head_deleteds);
    PERFORM pg_notify('etcdsql_commit', moved::text);
    RETURN NEXT moved;
END
$$;

-- The earlier form, for instances of the previous release beside this one: no leases to check.
CREATE OR REPLACE FUNCTION etcdsql_append(
    revisions BIGINT[], subs BIGINT[], names BYTEA[], createds BOOLEAN[], deleteds BOOLEAN[],
    create_revisions BIGINT[], prev_revisions BIGINT[], versions BIGINT[], leases BIGINT[],
    vals BYTEA[], old_leases BIGINT[],
    replaced_by BIGINT[], replaced_names BYTEA[], replaced_revisions BIGINT[],
    replaced_deleteds BOOLEAN[],
    head_names BYTEA[], head_revisions BIGINT[], head_deleteds BOOLEAN[],
    new_current BIGINT, presumed BIGINT
) RETURNS SETOF BIGINT
LANGUAGE sql
AS $$
    SELECT * FROM etcdsql_append(revisions, subs, names, createds, deleteds, create_revisions,
                                 prev_revisions, versions, leases, vals, old_leases,
                                 replaced_by, replaced_names, replaced_revisions,
                                 replaced_deleteds, head_names, head_revisions, head_deleteds,
                                 new_current, presumed, '{}'::BIGINT[])
$$;
