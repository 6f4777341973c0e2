//! SQLite's SQL: the shared statements, with the index hints and range queries SQLite's planner
//! needs (its own estimates would walk every old version of a key range).

use std::borrow::Cow;
use std::sync::LazyLock;

use crate::backend::core::{Sql, Stmt, Syntax, end_key, insert_chunks, push_tuples, values_chunks};
use crate::backend::{LogRow, RangeEnd, Scan};

const SYNTAX: Syntax = Syntax {
    numbered: false,
    insert_ignore: ("INSERT INTO", " ON CONFLICT DO NOTHING"),
    // The write session holds the one writer connection: nothing else can change a row.
    lock_rows: "",
    set_current_revision_and_notify: None,
    empty_bytes: "x''",
    null_bytes: "NULL",
};

pub static SQL: LazyLock<Sql> = LazyLock::new(|| Sql {
    latest: Cow::Borrowed(concat!(
        "SELECT ",
        crate::log_columns!(),
        " FROM kv_log INDEXED BY kv_log_head WHERE name = ? AND superseded_by IS NULL"
    )),
    // No old lease (a watch's concern, not the index's): it is stored after the value, so for
    // a row whose value spills onto an overflow page, reading it would read that page too.
    heads: Cow::Borrowed(
        "SELECT revision, sub, name, created, deleted, create_revision, prev_revision, \
         version, lease, x'', NULL, 0 FROM kv_log INDEXED BY kv_log_head \
         WHERE superseded_by IS NULL",
    ),
    ..Sql::common(&SYNTAX, scan, count, insert_rows, values_at)
});

/// Rows per multi-row INSERT: 11 parameters each stays under SQLite's oldest limit of 999
/// parameters per statement.
const INSERT_CHUNK: usize = 64;
/// `(key, revision)` pairs per `values_at` statement (two parameters each).
const VALUES_CHUNK: usize = 256;

/// "The row of each key in a range that is visible at revision ?3, if it is live." `$range`
/// selects the keys (`?1` start, `?2` end). A visible row has `revision <= R` and was not yet
/// replaced at R: either it is still the key's newest row (the `kv_log_head` index, whose
/// tombstones the test on `deleted` drops without reading the table) or it was replaced after R
/// (the `kv_log_superseded` index, a handful of rows when R is recent; SQLite's own estimates
/// would walk every old version in the key range instead). Each branch is one index range, so
/// neither looks at older versions.
macro_rules! visible_branches {
    ($columns:expr, $range:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM kv_log AS k INDEXED BY kv_log_head WHERE ",
            $range,
            " AND k.superseded_by IS NULL AND k.deleted = 0 AND k.revision <= ?3 \
             UNION ALL SELECT ",
            $columns,
            " FROM kv_log AS k INDEXED BY kv_log_superseded WHERE ",
            $range,
            " AND k.superseded_by > ?3 AND k.revision <= ?3 AND k.deleted = 0"
        )
    };
}

/// "The row of the key `?1` that is visible at revision ?3, if it is live." It starts at the
/// key's newest row (`kv_log_head`) and walks back along `prev_revision`, each step one lookup
/// of a revision in the primary key, to the first row at or below R. At the current revision
/// that is the newest row itself; an older R walks back over the versions written since.
/// Nothing on the way can have been compacted: those rows were replaced after R.
macro_rules! single_key {
    ($columns:expr, $tail:literal) => {
        concat!(
            "WITH RECURSIVE chain(revision, prev) AS (\
                 SELECT revision, prev_revision FROM kv_log INDEXED BY kv_log_head \
                 WHERE name = ?1 AND superseded_by IS NULL \
               UNION ALL \
                 SELECT k.revision, k.prev_revision FROM chain CROSS JOIN kv_log AS k \
                 WHERE chain.revision > ?3 AND k.revision = chain.prev AND k.name = ?1\
             ) SELECT ",
            $columns,
            " FROM chain CROSS JOIN kv_log AS k WHERE chain.revision <= ?3 \
             AND k.revision = chain.revision AND k.name = ?1 AND k.deleted = 0",
            $tail
        )
    };
}

/// What a scan returns of a row: the log's columns with `$value` for the value (`k.value`, or
/// an empty blob for keys-only scans), and neither old value nor old lease (a read answers with
/// neither), so large blobs and the overflow pages they spill onto stay on disk when unneeded.
macro_rules! scan_columns {
    ($value:literal) => {
        concat!(
            "k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, \
             k.prev_revision, k.version, k.lease, ",
            $value,
            " AS value, NULL, 0"
        )
    };
}

/// A scan in key order, at most `?4` rows. The limit is `?4 + 0`, not `?4`: SQLite plans a
/// compound SELECT's bare `LIMIT ?` for the value bound, so it would re-parse and re-plan the
/// statement on every execution (a third of a point read's CPU); an expression is evaluated at
/// run time instead.
macro_rules! scan_sql {
    ($value:literal, $range:literal) => {
        concat!(
            visible_branches!(scan_columns!($value), $range),
            " ORDER BY name LIMIT ?4 + 0"
        )
    };
}

macro_rules! count_sql {
    ($range:literal) => {
        concat!(
            "SELECT COALESCE(SUM(n), 0) FROM (",
            visible_branches!("COUNT(*) AS n", $range),
            ")"
        )
    };
}

/// The statement behind [`crate::backend::ReadTxn::scan`], public so that `benches/scale` can
/// show its plan. Parameters: `?1` start key, `?2` end key (ignored unless the end is a key),
/// `?3` revision, `?4` limit (-1 for none).
pub fn scan_query(end: &RangeEnd, keys_only: bool) -> &'static str {
    match (end, keys_only) {
        (RangeEnd::Single, false) => single_key!(scan_columns!("k.value"), " LIMIT ?4 + 0"),
        (RangeEnd::Single, true) => single_key!(scan_columns!("x''"), " LIMIT ?4 + 0"),
        (RangeEnd::Unbounded, false) => scan_sql!("k.value", "k.name >= ?1"),
        (RangeEnd::Unbounded, true) => scan_sql!("x''", "k.name >= ?1"),
        (RangeEnd::Before(_), false) => scan_sql!("k.value", "k.name >= ?1 AND k.name < ?2"),
        (RangeEnd::Before(_), true) => scan_sql!("x''", "k.name >= ?1 AND k.name < ?2"),
    }
}

/// The statement behind [`crate::backend::ReadTxn::count`]; parameters as for [`scan_query`],
/// without a limit.
pub fn count_query(end: &RangeEnd) -> &'static str {
    match end {
        RangeEnd::Single => concat!("SELECT COUNT(*) FROM (", single_key!("1", ""), ")"),
        RangeEnd::Unbounded => count_sql!("k.name >= ?1"),
        RangeEnd::Before(_) => count_sql!("k.name >= ?1 AND k.name < ?2"),
    }
}

fn scan<'a>(scan: &Scan<'a>) -> Stmt<'a> {
    Stmt::new(scan_query(scan.end, scan.keys_only))
        .bytes(scan.key)
        .bytes(end_key(scan.end))
        .int(scan.revision)
        .int(scan.limit.unwrap_or(-1))
}

fn count<'a>(key: &'a [u8], end: &'a RangeEnd, revision: i64) -> Stmt<'a> {
    Stmt::new(count_query(end))
        .bytes(key)
        .bytes(end_key(end))
        .int(revision)
}

fn insert_rows(rows: &[LogRow]) -> Vec<Stmt<'_>> {
    insert_chunks(rows, INSERT_CHUNK, usize::MAX, |count| {
        let mut sql = String::from("UPDATE kv_log SET superseded_by = v.column1 FROM (VALUES ");
        push_tuples(&mut sql, count, "(?, ?, ?)");
        // The unary `+` keeps SQLite from indexing the VALUES list and scanning the whole
        // log against it: the list is the outer loop, each row a primary-key lookup.
        sql.push_str(") AS v WHERE kv_log.name = +v.column2 AND kv_log.revision = +v.column3");
        sql
    })
}

fn values_at<'a>(rows: &[(&'a [u8], i64)]) -> Vec<Stmt<'a>> {
    values_chunks(rows, VALUES_CHUNK, |first, count| {
        // CROSS JOIN keeps the wanted rows as the outer loop, so each is one lookup of a
        // revision in the primary key.
        let rows: Vec<String> = (first..first + count)
            .map(|i| format!("({i}, ?, ?)"))
            .collect();
        format!(
            "WITH w(i, n, r) AS (VALUES {}) SELECT w.i, k.value FROM w CROSS JOIN kv_log AS k \
             ON k.name = w.n AND k.revision = w.r",
            rows.join(",")
        )
    })
}
