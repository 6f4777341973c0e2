//! MySQL's and MariaDB's SQL: the shared statements with `INSERT IGNORE` and locking reads, and
//! range queries over the one index MySQL can use for both kinds of visible row.
//!
//! MySQL has no partial indexes. `kv_log_superseded (superseded_by, name, revision, deleted)`
//! serves both branches of a read at revision R: its NULL prefix holds each key's newest row in
//! key order (the live branch reads it in order, no sort, stopping at the limit), and its range
//! `superseded_by > R` holds the few rows replaced since R. So no list sorts a temporary table
//! the size of the keyspace (kine#651): the final ORDER BY merges at most twice the limit.
//! One key at a revision is the newest row at or below it, by `kv_log_name_revision`.

use std::sync::LazyLock;

use crate::backend::core::{Sql, Stmt, Syntax, insert_chunks, mark_superseded, values_chunks};
use crate::backend::{LogRow, RangeEnd, Scan};

const SYNTAX: Syntax = Syntax {
    numbered: false,
    // INSERT IGNORE also demotes some errors to warnings; it is used only where the sole
    // possible conflict is the key (integer columns, fixed names).
    insert_ignore: ("INSERT IGNORE INTO", ""),
    lock_rows: " FOR UPDATE",
    set_current_revision_and_notify: None,
    empty_bytes: "x''",
    null_bytes: "NULL",
};

pub static SQL: LazyLock<Sql> =
    LazyLock::new(|| Sql::common(&SYNTAX, scan, count, insert_rows, values_at));

/// Value bytes per multi-row INSERT, well under MariaDB's default `max_allowed_packet` (16 MiB).
const INSERT_BYTES: usize = 4 << 20;
/// Rows per multi-row INSERT at most.
const INSERT_ROWS: usize = 256;
/// `(key, revision)` pairs per `values_at` statement.
const VALUES_CHUNK: usize = 256;
/// "No limit": MySQL's LIMIT takes only a number.
const NO_LIMIT: i64 = i64::MAX;

/// The columns of a scan, `{value}` being `k.value` or an empty value for keys-only scans.
fn scan_columns(value: &str) -> String {
    format!(
        "k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, k.prev_revision, \
         k.version, k.lease, {value} AS value, NULL AS old_value, k.old_lease"
    )
}

/// Each key's newest row at or below the revision, if live; parameters: key, revision.
fn single_key(columns: &str) -> String {
    format!(
        "SELECT {columns} FROM (SELECT * FROM kv_log FORCE INDEX (kv_log_name_revision) \
         WHERE name = ? AND revision <= ? ORDER BY revision DESC LIMIT 1) AS k \
         WHERE NOT k.deleted"
    )
}

/// The key range's condition and how many parameters it takes.
fn range(end: &RangeEnd) -> &'static str {
    match end {
        RangeEnd::Single => "k.name = ?",
        RangeEnd::Unbounded => "k.name >= ?",
        RangeEnd::Before(_) => "k.name >= ? AND k.name < ?",
    }
}

/// Parameters: the range, revision, limit; the range, revision, revision, limit; limit.
fn scan_text(end: &RangeEnd, keys_only: bool) -> String {
    let columns = scan_columns(if keys_only { "x''" } else { "k.value" });
    if matches!(end, RangeEnd::Single) {
        return format!("{} LIMIT ?", single_key(&columns));
    }
    let range = range(end);
    format!(
        "(SELECT {columns} FROM kv_log AS k FORCE INDEX (kv_log_superseded) \
          WHERE {range} AND k.superseded_by IS NULL AND NOT k.deleted AND k.revision <= ? \
          ORDER BY k.name LIMIT ?) \
         UNION ALL \
         (SELECT {columns} FROM kv_log AS k FORCE INDEX (kv_log_superseded) \
          WHERE {range} AND k.superseded_by > ? AND k.revision <= ? AND NOT k.deleted \
          ORDER BY k.name LIMIT ?) \
         ORDER BY name LIMIT ?"
    )
}

/// Parameters: the range, revision; the range, revision, revision.
fn count_text(end: &RangeEnd) -> String {
    if matches!(end, RangeEnd::Single) {
        return format!("SELECT COUNT(*) FROM ({}) AS one", single_key("1"));
    }
    let range = range(end);
    format!(
        "SELECT CAST(COALESCE(SUM(n), 0) AS SIGNED) FROM (\
         SELECT COUNT(*) AS n FROM kv_log AS k FORCE INDEX (kv_log_superseded) \
         WHERE {range} AND k.superseded_by IS NULL AND NOT k.deleted AND k.revision <= ? \
         UNION ALL \
         SELECT COUNT(*) FROM kv_log AS k FORCE INDEX (kv_log_superseded) \
         WHERE {range} AND k.superseded_by > ? AND k.revision <= ? AND NOT k.deleted) AS counts"
    )
}

const SHAPES: [RangeEnd; 3] = [
    RangeEnd::Single,
    RangeEnd::Unbounded,
    RangeEnd::Before(Vec::new()),
];

fn shape(end: &RangeEnd) -> usize {
    match end {
        RangeEnd::Single => 0,
        RangeEnd::Unbounded => 1,
        RangeEnd::Before(_) => 2,
    }
}

/// The range statements, written once: `[shape][keys_only]` and `[shape]`.
static SCANS: LazyLock<[[String; 2]; 3]> =
    LazyLock::new(|| SHAPES.map(|end| [scan_text(&end, false), scan_text(&end, true)]));
static COUNTS: LazyLock<[String; 3]> = LazyLock::new(|| SHAPES.map(|end| count_text(&end)));

/// The statement behind [`crate::backend::ReadTxn::scan`], public so that `benches/scale` can
/// show its plan.
pub fn scan_query(end: &RangeEnd, keys_only: bool) -> &'static str {
    &SCANS[shape(end)][usize::from(keys_only)]
}

/// The statement behind [`crate::backend::ReadTxn::count`].
pub fn count_query(end: &RangeEnd) -> &'static str {
    &COUNTS[shape(end)]
}

/// The range's keys as the statement's range condition takes them.
fn bind_range<'a>(stmt: Stmt<'a>, key: &'a [u8], end: &'a RangeEnd) -> Stmt<'a> {
    match end {
        RangeEnd::Before(end) => stmt.bytes(key).bytes(end),
        RangeEnd::Single | RangeEnd::Unbounded => stmt.bytes(key),
    }
}

fn scan<'a>(scan: &Scan<'a>) -> Stmt<'a> {
    let limit = scan.limit.unwrap_or(NO_LIMIT);
    let stmt = Stmt::new(scan_query(scan.end, scan.keys_only));
    if matches!(scan.end, RangeEnd::Single) {
        return stmt.bytes(scan.key).int(scan.revision).int(limit);
    }
    let live = bind_range(stmt, scan.key, scan.end)
        .int(scan.revision)
        .int(limit);
    bind_range(live, scan.key, scan.end)
        .int(scan.revision)
        .int(scan.revision)
        .int(limit)
        .int(limit)
}

fn count<'a>(key: &'a [u8], end: &'a RangeEnd, revision: i64) -> Stmt<'a> {
    let stmt = Stmt::new(count_query(end));
    if matches!(end, RangeEnd::Single) {
        return stmt.bytes(key).int(revision);
    }
    let live = bind_range(stmt, key, end).int(revision);
    bind_range(live, key, end).int(revision).int(revision)
}

/// A derived table of `count` rows of `columns` placeholders, named `names` (MySQL 5.7 has no
/// VALUES table constructor; MariaDB's and MySQL 8's differ).
fn rows_table(count: usize, names: &[&str]) -> String {
    let first: Vec<String> = names.iter().map(|n| format!("? AS {n}")).collect();
    let mut sql = format!("SELECT {}", first.join(", "));
    let rest = format!(" UNION ALL SELECT {}", vec!["?"; names.len()].join(", "));
    for _ in 1..count {
        sql.push_str(&rest);
    }
    sql
}

fn insert_rows(rows: &[LogRow]) -> Vec<Stmt<'_>> {
    insert_chunks(rows, INSERT_ROWS, INSERT_BYTES, |chunk| {
        Vec::from_iter(mark_superseded(chunk, |count| {
            format!(
                "UPDATE kv_log AS k JOIN ({}) AS u ON k.name = u.name AND k.revision = u.prev \
                 SET k.superseded_by = u.revision",
                rows_table(count, &["revision", "name", "prev"])
            )
        }))
    })
}

fn values_at<'a>(rows: &[(&'a [u8], i64)]) -> Vec<Stmt<'a>> {
    values_chunks(rows, VALUES_CHUNK, |first, count| {
        let rows: Vec<String> = (first..first + count)
            .map(|i| {
                if i == first {
                    format!("SELECT {i} AS i, ? AS n, ? AS r")
                } else {
                    format!("SELECT {i}, ?, ?")
                }
            })
            .collect();
        // The wanted rows first, each one lookup in kv_log_name_revision.
        format!(
            "SELECT w.i, k.value FROM ({}) AS w STRAIGHT_JOIN kv_log AS k \
             ON k.name = w.n AND k.revision = w.r",
            rows.join(" UNION ALL ")
        )
    })
}
