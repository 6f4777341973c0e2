//! PostgreSQL's SQL: the shared statements with numbered placeholders, its range queries, and
//! whole batches passed as arrays (`unnest`), one statement per batch.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use crate::backend::core::{Arg, Sql, Stmt, Syntax, changes_query};
use crate::backend::{LogRow, RangeEnd, Scan};

/// The NOTIFY channel that carries committed revisions (a macro so the statement below can
/// name it as a literal).
macro_rules! commit_channel {
    () => {
        "etcdsql_commit"
    };
}
pub const COMMIT_CHANNEL: &str = commit_channel!();

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

pub static SQL: LazyLock<Sql> = LazyLock::new(|| Sql {
    // The live index holds no tombstones: the key's newest row by its (name, revision) index.
    latest: Cow::Borrowed(concat!(
        "SELECT ",
        crate::log_columns!(),
        " FROM kv_log WHERE name = $1 ORDER BY revision DESC LIMIT 1"
    )),
    append: Some(append),
    ..Sql::common(&SYNTAX, scan, count, insert_rows, values_at)
});

/// "The row of each key in a range that is visible at revision `$rev`, if it is live": still
/// the key's newest row (the `kv_log_live` index), or replaced after `$rev` (the
/// `kv_log_superseded` index); see the SQLite dialect. PostgreSQL wants every parameter used, so
/// each range shape numbers its own: `$1` is the start key, then the end key if there is one,
/// then the revision (and the limit).
macro_rules! visible_branches {
    ($columns:expr, $range:literal, $rev:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM kv_log AS k WHERE ",
            $range,
            " AND k.superseded_by IS NULL AND NOT k.deleted AND k.revision <= ",
            $rev,
            " UNION ALL SELECT ",
            $columns,
            " FROM kv_log AS k WHERE ",
            $range,
            " AND k.superseded_by > ",
            $rev,
            " AND k.revision <= ",
            $rev,
            " AND NOT k.deleted"
        )
    };
}

/// The columns of a scan, `$value` being `k.value` or an empty value for keys-only scans.
macro_rules! scan_columns {
    ($value:literal) => {
        concat!(
            "k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, \
             k.prev_revision, k.version, k.lease, ",
            $value,
            " AS value, NULL::bytea AS old_value, k.old_lease"
        )
    };
}

/// A scan in key order, at most `$limit` rows. Each branch is ordered and limited on its own: the
/// live branch then walks its index for just `$limit` keys, where a plan for the union as a whole
/// may sort every live key of the range (a seq scan of the table at a million keys).
macro_rules! scan_sql {
    ($value:literal, $range:literal, $rev:literal, $limit:literal) => {
        concat!(
            "(SELECT ",
            scan_columns!($value),
            " FROM kv_log AS k WHERE ",
            $range,
            " AND k.superseded_by IS NULL AND NOT k.deleted AND k.revision <= ",
            $rev,
            " ORDER BY k.name LIMIT ",
            $limit,
            ") UNION ALL (SELECT ",
            scan_columns!($value),
            " FROM kv_log AS k WHERE ",
            $range,
            " AND k.superseded_by > ",
            $rev,
            " AND k.revision <= ",
            $rev,
            " AND NOT k.deleted ORDER BY k.name LIMIT ",
            $limit,
            ") ORDER BY name LIMIT ",
            $limit
        )
    };
}

macro_rules! count_sql {
    ($range:literal, $rev:literal) => {
        concat!(
            "SELECT COALESCE(SUM(n), 0)::bigint FROM (",
            visible_branches!("COUNT(*) AS n", $range, $rev),
            ") AS counts"
        )
    };
}

/// The statement behind [`crate::backend::ReadTxn::scan`], public so that `benches/scale` can
/// show its plan. Parameters: `$1` start key, then the end key only for [`RangeEnd::Before`],
/// then the revision and the limit (NULL for none).
pub fn scan_query(end: &RangeEnd, keys_only: bool) -> &'static str {
    match (end, keys_only) {
        (RangeEnd::Single, false) => scan_sql!("k.value", "k.name = $1", "$2", "$3"),
        (RangeEnd::Single, true) => scan_sql!("''::bytea", "k.name = $1", "$2", "$3"),
        (RangeEnd::Unbounded, false) => scan_sql!("k.value", "k.name >= $1", "$2", "$3"),
        (RangeEnd::Unbounded, true) => scan_sql!("''::bytea", "k.name >= $1", "$2", "$3"),
        (RangeEnd::Before(_), false) => {
            scan_sql!("k.value", "k.name >= $1 AND k.name < $2", "$3", "$4")
        }
        (RangeEnd::Before(_), true) => {
            scan_sql!("''::bytea", "k.name >= $1 AND k.name < $2", "$3", "$4")
        }
    }
}

/// The statement behind [`crate::backend::ReadTxn::count`]; parameters as for [`scan_query`],
/// without a limit.
pub fn count_query(end: &RangeEnd) -> &'static str {
    match end {
        RangeEnd::Single => count_sql!("k.name = $1", "$2"),
        RangeEnd::Unbounded => count_sql!("k.name >= $1", "$2"),
        RangeEnd::Before(_) => count_sql!("k.name >= $1 AND k.name < $2", "$3"),
    }
}

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

/// The INSERT of a batch's rows, each given as an array per column, `superseded_by` included.
macro_rules! insert_unnest {
    () => {
        "INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
         prev_revision, version, lease, value, old_lease, superseded_by) \
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bytea[], $4::boolean[], \
         $5::boolean[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bytea[], \
         $11::bigint[], $12::bigint[])"
    };
}

/// The rest of [`insert_rows`]' statement: an UPDATE marking the older rows the new ones
/// replace, given as arrays (empty when none).
macro_rules! mark_replaced {
    () => {
        "UPDATE kv_log AS k SET superseded_by = u.revision \
         FROM unnest($13::bigint[], $14::bytea[], $15::bigint[]) AS u(revision, name, prev) \
         WHERE k.name = u.name AND k.revision = u.prev"
    };
}

/// A batch's rows in one statement, one round trip: the INSERT, and an UPDATE marking the older
/// rows the new ones replace. The parts of one statement do not see each other's rows, so a
/// row replaced by another row of the same call is inserted already marked, and the UPDATE
/// names only rows written before.
fn insert_rows(rows: &[LogRow]) -> Vec<Stmt<'_>> {
    let sql = concat!(
        "WITH inserted AS (",
        insert_unnest!(),
        ") ",
        mark_replaced!()
    );
    vec![rows_stmt(sql, rows)]
}

/// [`insert_rows`], the new current revision and its NOTIFY, all in one statement.
fn append(rows: &[LogRow], current: i64) -> Vec<Stmt<'_>> {
    let sql = concat!(
        "WITH inserted AS (",
        insert_unnest!(),
        "), replaced AS (",
        mark_replaced!(),
        "), moved AS (UPDATE meta SET value = $16 WHERE name = 'current_revision') \
         SELECT pg_notify('",
        commit_channel!(),
        "', $16::text)"
    );
    vec![rows_stmt(sql, rows).int(current)]
}

/// `sql` with the parameters `$1`..`$15` of [`insert_unnest`] and [`mark_replaced`] for `rows`.
fn rows_stmt<'a>(sql: &'static str, rows: &'a [LogRow]) -> Stmt<'a> {
    let successors: HashMap<(&[u8], i64), i64> = rows
        .iter()
        .filter(|r| r.prev_revision > 0)
        .map(|r| ((r.key.as_slice(), r.prev_revision), r.revision))
        .collect();
    let here: HashSet<(&[u8], i64)> = rows
        .iter()
        .map(|r| (r.key.as_slice(), r.revision))
        .collect();
    let replacing: Vec<&LogRow> = rows
        .iter()
        .filter(|r| r.prev_revision > 0 && !here.contains(&(r.key.as_slice(), r.prev_revision)))
        .collect();
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
        .arg(Arg::OptInts(column(rows, |r| {
            successors.get(&(r.key.as_slice(), r.revision)).copied()
        })))
        .arg(Arg::Ints(replacing.iter().map(|r| r.revision).collect()))
        .arg(Arg::Blobs(
            replacing.iter().map(|&r| r.key.as_slice()).collect(),
        ))
        .arg(Arg::Ints(
            replacing.iter().map(|r| r.prev_revision).collect(),
        ))
}

/// The most revisions of changes a write transaction's [`opening`] reads: enough for what
/// other instances commit between two of this one's batches, and a bound on the answer when the
/// writer has been idle (the batch reads the rest metadata only).
pub const OPENING_CHANGES: i64 = 1024;

/// A write transaction's first round trip, as one simple query (which takes no parameters, so
/// `lock` and `after` are spelled out): BEGIN and the writers' lock; then, seeing every commit of
/// the writers before, the revisions and the changes of up to [`OPENING_CHANGES`] revisions
/// after `after`, as [`Sql::changes`] reads them (values and old values included).
pub fn opening(lock: i64, after: i64) -> String {
    format!(
        "BEGIN; SELECT pg_advisory_xact_lock({lock}); {revisions}; {changes}",
        revisions = SQL.revisions,
        changes = changes_query(
            &after.to_string(),
            &after.saturating_add(OPENING_CHANGES).to_string()
        ),
    )
}

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
