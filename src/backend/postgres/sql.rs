//! PostgreSQL's SQL: the shared statements with numbered placeholders, its range queries, and
//! whole batches passed as arrays (`unnest`), one statement per batch.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;

use crate::backend::core::{Arg, Bookkeeping, Sql, Stmt, Syntax, changes_query};
use crate::backend::{LogRow, RangeEnd, Scan};

/// The NOTIFY channel that carries committed revisions (a macro so the statement below can
/// name it as a literal).
macro_rules! commit_channel {
    () => {
        "etcdsql_commit"
    };
}
pub const COMMIT_CHANNEL: &str = commit_channel!();

/// The writers' advisory lock key ([`super::WRITER_LOCK`]) spelled out, for the statements
/// that take the lock.
macro_rules! writer_lock {
    () => {
        "28556942883647852"
    };
}

/// A write transaction's start: BEGIN and the writers' lock go as one simple query, one round
/// trip rather than two (the lock's key spelled out, as a simple query takes no parameters).
/// The lock is taken before any statement reads: in READ COMMITTED each later statement's
/// snapshot then holds every commit of the writers before.
pub const BEGIN_LOCKED: &str = concat!("BEGIN; SELECT pg_advisory_xact_lock(", writer_lock!(), ")");

const SYNTAX: Syntax = Syntax {
    numbered: true,
    insert_ignore: ("INSERT INTO", " ON CONFLICT DO NOTHING"),
    lock_rows: " FOR UPDATE",
    // One round trip rather than two. The notification is delivered at commit, to every
    // process listening (this one included).
    set_current_revision_and_notify: Some(concat!(
        "WITH m AS (UPDATE meta SET value = ? WHERE name = 'current_revision') \
         SELECT pg_notify('",
        commit_channel!(),
        "', ?::text)"
    )),
    empty_bytes: "''::bytea",
    null_bytes: "NULL::bytea",
};

/// The log's columns of the row `k` up to the lease, in [`crate::log_columns`]' order.
macro_rules! row_columns {
    () => {
        "k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, k.prev_revision, \
         k.version, k.lease"
    };
}

/// Joins the entry `x` (of `kv_head` or `kv_replaced`) to its row in the log.
macro_rules! row_join {
    () => {
        " JOIN kv_log AS k ON k.name = x.name AND k.revision = x.revision"
    };
}

/// What a scan returns of a row: `$value` for the value (`k.value`, or an empty value for
/// keys-only scans), and no old value or old lease (a read answers with neither).
macro_rules! scan_columns {
    ($value:literal) => {
        concat!(
            row_columns!(),
            ", ",
            $value,
            " AS value, NULL::bytea, 0::bigint"
        )
    };
}

/// "The key and revision of each key in a range whose row visible at revision `$rev` is live":
/// still the key's newest row (`kv_head`, whose tombstones the test on `deleted` drops), or
/// replaced after `$rev` (`kv_replaced`, whose primary key starts with the replacing revision:
/// a handful of entries when `$rev` is recent). PostgreSQL wants every parameter used, so each
/// range shape numbers its own: `$1` is the start key, then the end key if there is one, then
/// the revision (and the limit). `$tail` ends each branch (its order and limit).
macro_rules! visible_branches {
    ($columns:expr, $range:literal, $rev:literal, $tail:expr) => {
        concat!(
            "(SELECT ",
            $columns,
            " FROM kv_head AS x WHERE ",
            $range,
            " AND NOT x.deleted AND x.revision <= ",
            $rev,
            $tail,
            ") UNION ALL (SELECT ",
            $columns,
            " FROM kv_replaced AS x WHERE x.superseded_by > ",
            $rev,
            " AND ",
            $range,
            " AND x.revision <= ",
            $rev,
            " AND NOT x.deleted",
            $tail,
            ")"
        )
    };
}

/// A scan in key order, at most `$limit` rows (NULL: all). Each branch is ordered and limited
/// on its own, so the head branch walks its index for just `$limit` keys, where a plan for the
/// union as a whole may sort every key of the range; only the rows within the limit are then
/// looked up in the log.
macro_rules! scan_sql {
    ($value:literal, $range:literal, $rev:literal, $limit:literal) => {
        concat!(
            "SELECT ",
            scan_columns!($value),
            " FROM (",
            visible_branches!(
                "x.name, x.revision",
                $range,
                $rev,
                concat!(" ORDER BY x.name LIMIT ", $limit)
            ),
            " ORDER BY name LIMIT ",
            $limit,
            ") AS x",
            row_join!(),
            " ORDER BY x.name"
        )
    };
}

/// One key at revision `$2`: its newest row at or below `$2`, by the (name, revision) index,
/// if that row is not a tombstone. Rows above `$2` and older versions are not looked at; the
/// row found cannot have been compacted, since it was replaced (if at all) after `$2`.
macro_rules! single_key_sql {
    ($columns:expr, $tail:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM (SELECT * FROM kv_log WHERE name = $1 AND revision <= $2 \
             ORDER BY revision DESC LIMIT 1) AS k WHERE NOT k.deleted",
            $tail
        )
    };
}

macro_rules! count_sql {
    ($range:literal, $rev:literal) => {
        concat!(
            "SELECT COALESCE(SUM(n), 0)::bigint FROM (",
            visible_branches!("COUNT(*) AS n", $range, $rev, ""),
            ") AS counts"
        )
    };
}

/// The statement behind [`crate::backend::ReadTxn::scan`], public so that `benches/scale` can
/// show its plan. Parameters: `$1` start key, then the end key only for [`RangeEnd::Before`],
/// then the revision and the limit (NULL for none).
pub fn scan_query(end: &RangeEnd, keys_only: bool) -> &'static str {
    match (end, keys_only) {
        (RangeEnd::Single, false) => single_key_sql!(scan_columns!("k.value"), " LIMIT $3"),
        (RangeEnd::Single, true) => single_key_sql!(scan_columns!("''::bytea"), " LIMIT $3"),
        (RangeEnd::Unbounded, false) => scan_sql!("k.value", "x.name >= $1", "$2", "$3"),
        (RangeEnd::Unbounded, true) => scan_sql!("''::bytea", "x.name >= $1", "$2", "$3"),
        (RangeEnd::Before(_), false) => {
            scan_sql!("k.value", "x.name >= $1 AND x.name < $2", "$3", "$4")
        }
        (RangeEnd::Before(_), true) => {
            scan_sql!("''::bytea", "x.name >= $1 AND x.name < $2", "$3", "$4")
        }
    }
}

/// The statement behind [`crate::backend::ReadTxn::count`]; parameters as for [`scan_query`],
/// without a limit.
pub fn count_query(end: &RangeEnd) -> &'static str {
    match end {
        RangeEnd::Single => single_key_sql!("COUNT(*)", ""),
        RangeEnd::Unbounded => count_sql!("x.name >= $1", "$2"),
        RangeEnd::Before(_) => count_sql!("x.name >= $1 AND x.name < $2", "$3"),
    }
}

pub static SQL: LazyLock<Sql> = LazyLock::new(|| Sql {
    // The key's newest row by its (name, revision) index; a tombstone answers too.
    latest: Cow::Borrowed(concat!(
        "SELECT ",
        crate::log_columns!(),
        " FROM kv_log WHERE name = $1 ORDER BY revision DESC LIMIT 1"
    )),
    // No value: the writer's key index keeps none.
    heads: Cow::Borrowed(concat!(
        "SELECT ",
        row_columns!(),
        ", ''::bytea, NULL::bytea, k.old_lease FROM kv_head AS x",
        row_join!()
    )),
    // The row is visible at the revision when it is the key's newest or was replaced after it.
    lease_keys: Cow::Borrowed(concat!(
        "SELECT ",
        crate::log_columns!(),
        " FROM kv_log AS k WHERE k.lease = $1 AND k.lease <> 0 AND k.revision <= $2 \
          AND NOT k.deleted AND (\
            EXISTS (SELECT 1 FROM kv_head AS h WHERE h.name = k.name AND h.revision = k.revision) \
            OR EXISTS (SELECT 1 FROM kv_replaced AS r WHERE r.superseded_by > $3 \
                       AND r.name = k.name AND r.revision = k.revision)) \
          ORDER BY k.name"
    )),
    // The rows replaced in the window, each found by its key and revision.
    compact_superseded: Cow::Borrowed(
        "DELETE FROM kv_log AS k USING kv_replaced AS r \
         WHERE r.superseded_by >= $1 AND r.superseded_by < $2 \
         AND k.name = r.name AND k.revision = r.revision",
    ),
    forget_replaced: Some(Cow::Borrowed(
        "DELETE FROM kv_replaced WHERE superseded_by >= $1 AND superseded_by < $2",
    )),
    // Before the tombstones go: they are found in the log by revision, then in kv_head by key.
    forget_tombstones: Some(Cow::Borrowed(
        "DELETE FROM kv_head WHERE name IN (SELECT name FROM kv_log \
         WHERE deleted AND revision >= $1 AND revision < $2) \
         AND deleted AND revision >= $1 AND revision < $2",
    )),
    bookkeeping: Bookkeeping::Tables,
    append: Some(append),
    ..Sql::common(&SYNTAX, scan, count, insert_rows, values_at)
});

/// The start key, and the end key only where the statement has a place for it.
fn range<'a>(sql: &'static str, key: &'a [u8], end: &'a RangeEnd) -> Stmt<'a> {
    let stmt = Stmt::new(sql).bytes(key);
    match end {
        RangeEnd::Before(end) => stmt.bytes(end),
        RangeEnd::Single | RangeEnd::Unbounded => stmt,
    }
}

fn scan<'a>(scan: &Scan<'a>) -> Stmt<'a> {
    range(scan_query(scan.end, scan.keys_only), scan.key, scan.end)
        .int(scan.revision)
        .arg(Arg::OptInt(scan.limit))
}

fn count<'a>(key: &'a [u8], end: &'a RangeEnd, revision: i64) -> Stmt<'a> {
    range(count_query(end), key, end).int(revision)
}

fn column<'a, T>(rows: &'a [LogRow], f: impl Fn(&'a LogRow) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

/// A batch's rows in one statement, one round trip, each part taking its rows as one array per
/// column: the log's new rows; what each replaced (`kv_replaced`); and each key's newest row
/// (`kv_head`). For the rows a txn writes before it reads; a batch's last rows go through
/// [`append`]. Both call migration 0008's function, the one place that inserts rows.
fn insert_rows(rows: &[LogRow]) -> Vec<Stmt<'_>> {
    let sql = "SELECT etcdsql_insert_rows($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
               $13, $14, $15, $16, $17, $18)";
    vec![rows_stmt(sql, rows)]
}

/// [`insert_rows`], the new current revision and its NOTIFY, all in one statement, which can
/// be a transaction of its own: migration 0009's function, which takes the writers' lock and
/// writes only if the current revision is still `$20`, the one the batch began at, and every
/// lease of `$21` still exists, and returns a row only if it wrote. A function because PL/pgSQL
/// keeps one plan for its statements, where this session's own statements are planned afresh at
/// each call (see migration 0007).
fn append<'a>(rows: &'a [LogRow], before: i64, current: i64, leases: &'a [i64]) -> Vec<Stmt<'a>> {
    let sql = "SELECT * FROM etcdsql_append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
               $13, $14, $15, $16, $17, $18, $19, $20, $21)";
    vec![
        rows_stmt(sql, rows)
            .int(current)
            .int(before)
            .arg(Arg::Ints(leases.to_vec())),
    ]
}

/// `sql` with the parameters `$1`..`$18` of [`insert_rows`] (and of [`append`]'s function)
/// for `rows`.
fn rows_stmt<'a>(sql: &'static str, rows: &'a [LogRow]) -> Stmt<'a> {
    // A row that follows one replaces it; the replaced row was a tombstone exactly when this
    // one created the key again.
    let replacing: Vec<&LogRow> = rows.iter().filter(|r| r.prev_revision > 0).collect();
    // One entry per key, its last row's: an upsert may not change a row twice.
    let mut last: HashMap<&[u8], &LogRow> = HashMap::with_capacity(rows.len());
    for row in rows {
        last.insert(row.key.as_slice(), row);
    }
    let heads: Vec<&LogRow> = last.into_values().collect();
    Stmt::new(sql)
        .arg(Arg::Ints(column(rows, |r| r.revision)))
        .arg(Arg::Ints(column(rows, |r| r.sub)))
        .arg(Arg::Blobs(column(rows, |r| r.key.as_slice())))
        .arg(Arg::Bools(column(rows, |r| r.created)))
        .arg(Arg::Bools(column(rows, |r| r.deleted)))
        .arg(Arg::Ints(column(rows, |r| r.create_revision)))
        .arg(Arg::Ints(column(rows, |r| r.prev_revision)))
        .arg(Arg::Ints(column(rows, |r| r.version)))
        .arg(Arg::Ints(column(rows, |r| r.lease)))
        .arg(Arg::Blobs(column(rows, |r| r.value.as_slice())))
        .arg(Arg::Ints(column(rows, |r| r.old_lease)))
        .arg(Arg::Ints(replacing.iter().map(|r| r.revision).collect()))
        .arg(Arg::Blobs(
            replacing.iter().map(|r| r.key.as_slice()).collect(),
        ))
        .arg(Arg::Ints(
            replacing.iter().map(|r| r.prev_revision).collect(),
        ))
        .arg(Arg::Bools(replacing.iter().map(|r| r.created).collect()))
        .arg(Arg::Blobs(heads.iter().map(|r| r.key.as_slice()).collect()))
        .arg(Arg::Ints(heads.iter().map(|r| r.revision).collect()))
        .arg(Arg::Bools(heads.iter().map(|r| r.deleted).collect()))
}

/// The most revisions of changes a write transaction's [`opening`] reads: enough for what
/// other instances commit between two of this one's batches, and a bound on the answer when the
/// writer has been idle (the batch reads the rest metadata only).
pub const OPENING_CHANGES: i64 = 1024;

/// A write transaction's first round trip, as one simple query (which takes no parameters, so
/// `after` is spelled out): [`BEGIN_LOCKED`]; then, seeing every commit of the writers before,
/// the revisions and the changes of up to [`OPENING_CHANGES`] revisions after `after`, as
/// [`Sql::changes`] reads them (values and old values included).
pub fn opening(after: i64) -> String {
    format!(
        "{}; {changes}",
        *BEGIN_CHECKED,
        changes = changes_query(
            &after.to_string(),
            &after.saturating_add(OPENING_CHANGES).to_string()
        ),
    )
}

/// [`BEGIN_LOCKED`], then the revisions: how a presumed write transaction begins, and checks
/// what it presumed.
pub static BEGIN_CHECKED: LazyLock<String> =
    LazyLock::new(|| format!("{BEGIN_LOCKED}; {}", SQL.revisions));

fn values_at<'a>(rows: &[(&'a [u8], i64)]) -> Vec<Stmt<'a>> {
    // ORDINALITY counts from 1.
    vec![
        Stmt::new(
            "SELECT w.i - 1, k.value \
             FROM unnest($1::bytea[], $2::bigint[]) WITH ORDINALITY AS w(name, revision, i) \
             JOIN kv_log AS k ON k.name = w.name AND k.revision = w.revision",
        )
        .arg(Arg::Blobs(rows.iter().map(|(key, _)| *key).collect()))
        .arg(Arg::Ints(
            rows.iter().map(|(_, revision)| *revision).collect(),
        )),
    ]
}
