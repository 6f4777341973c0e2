-- The batch's rows have one home: `etcdsql_insert_rows` inserts them, and both the batch's
-- last statement (`etcdsql_append`, redefined by migration 0009 to call it) and the rows a txn
-- writes before it reads with a Range (which the server used to send as a statement of its own
-- with the same three parts) call it. As in migration 0007, PL/pgSQL plans these statements
-- once per session: each touches rows by key alone.
--
-- Arguments: the new log rows column by column; what each replaced (kv_replaced); each key's
-- newest row (kv_head).
CREATE FUNCTION etcdsql_insert_rows(
    revisions BIGINT[], subs BIGINT[], names BYTEA[], createds BOOLEAN[], deleteds BOOLEAN[],
    create_revisions BIGINT[], prev_revisions BIGINT[], versions BIGINT[], leases BIGINT[],
    vals BYTEA[], old_leases BIGINT[],
    replaced_by BIGINT[], replaced_names BYTEA[], replaced_revisions BIGINT[],
    replaced_deleteds BOOLEAN[],
    head_names BYTEA[], head_revisions BIGINT[], head_deleteds BOOLEAN[]
) RETURNS VOID
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, prev_revision,
                        version, lease, value, old_lease)
        SELECT * FROM unnest(revisions, subs, names, createds, deleteds, create_revisions,
                             prev_revisions, versions, leases, vals, old_leases);
    INSERT INTO kv_replaced (superseded_by, name, revision, deleted)
        SELECT * FROM unnest(replaced_by, replaced_names, replaced_revisions, replaced_deleteds);
    INSERT INTO kv_head (name, revision, deleted)
        SELECT * FROM unnest(head_names, head_revisions, head_deleteds)
        ON CONFLICT (name) DO UPDATE SET revision = excluded.revision, deleted = excluded.deleted;
END
$$;
