-- The batch's function learns two things.
--
-- It checks the leases the batch's rows are attached to. A writer that presumes the current
-- revision reads those leases before it takes the writers' lock (reading them inside its
-- transaction held the lock through one more round trip per lease), so under the lock the
-- function makes sure each still exists: another instance may have revoked one meanwhile, and
-- a revocation of a lease with no keys moves no revision.
--
-- And it rebases a batch past other instances' commits (src/mvcc/rebase.rs). Given the keys the
-- batch looked at, when the current revision moved past the presumed one but none of those
-- keys changed since, the batch's rows and answers hold after those commits too: the function
-- writes the rows renumbered by how far the revision moved, rather than refusing them. It does
-- not rebase past a compaction (which may have removed a tombstone it would have to see) or a
-- fence. Nor does it write at all below `served`, the newest revision this instance has shown
-- (a failover to a server that lacks it: the writer then fences the store).
--
-- It writes nothing and returns no row when it does neither; otherwise it returns the revision
-- it moved the database to.
CREATE FUNCTION etcdsql_shift(revisions BIGINT[], after BIGINT, moved_by BIGINT) RETURNS BIGINT[]
LANGUAGE sql IMMUTABLE
AS $$
    SELECT COALESCE(array_agg(CASE WHEN r > after THEN r + moved_by ELSE r END ORDER BY i), '{}')
    FROM unnest(revisions) WITH ORDINALITY AS t(r, i)
$$;

CREATE FUNCTION etcdsql_append(
    revisions BIGINT[], subs BIGINT[], names BYTEA[], createds BOOLEAN[], deleteds BOOLEAN[],
    create_revisions BIGINT[], prev_revisions BIGINT[], versions BIGINT[], leases BIGINT[],
    vals BYTEA[], old_leases BIGINT[],
    replaced_by BIGINT[], replaced_names BYTEA[], replaced_revisions BIGINT[],
    replaced_deleteds BOOLEAN[],
    head_names BYTEA[], head_revisions BIGINT[], head_deleteds BOOLEAN[],
    new_current BIGINT, presumed BIGINT, attached_leases BIGINT[], looked_at BYTEA[],
    served BIGINT
) RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    now_at BIGINT;
    moved_by BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(28556942883647852);
    IF cardinality(attached_leases) > 0
       AND (SELECT count(*) FROM leases WHERE id = ANY(attached_leases))
           < cardinality(attached_leases) THEN
        RETURN;
    END IF;
    SELECT value INTO now_at FROM meta WHERE name = 'current_revision';
    IF now_at < served THEN
        RETURN;
    END IF;
    moved_by := now_at - presumed;
    IF moved_by <> 0 THEN
        IF looked_at IS NULL OR moved_by < 0
           OR EXISTS (SELECT 1 FROM meta WHERE name IN ('compact_revision', 'fence_revision')
                      AND value > presumed)
           OR EXISTS (SELECT 1 FROM kv_head WHERE name = ANY(looked_at) AND revision > presumed)
        THEN
            RETURN;
        END IF;
        revisions := etcdsql_shift(revisions, presumed, moved_by);
        create_revisions := etcdsql_shift(create_revisions, presumed, moved_by);
        prev_revisions := etcdsql_shift(prev_revisions, presumed, moved_by);
        replaced_by := etcdsql_shift(replaced_by, presumed, moved_by);
        replaced_revisions := etcdsql_shift(replaced_revisions, presumed, moved_by);
        head_revisions := etcdsql_shift(head_revisions, presumed, moved_by);
        new_current := new_current + moved_by;
    END IF;
    UPDATE meta SET value = new_current WHERE name = 'current_revision';
    PERFORM etcdsql_insert_rows(revisions, subs, names, createds, deleteds, create_revisions,
                                prev_revisions, versions, leases, vals, old_leases,
                                replaced_by, replaced_names, replaced_revisions,
                                replaced_deleteds, head_names, head_revisions, head_deleteds);
    PERFORM pg_notify('etcdsql_commit', new_current::text);
    RETURN NEXT new_current;
END
$$;

-- The earlier form, for instances of the previous release beside this one: no leases to check,
-- and no rebasing.
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
                                 new_current, presumed, '{}'::BIGINT[], NULL::BYTEA[], presumed)
$$;
