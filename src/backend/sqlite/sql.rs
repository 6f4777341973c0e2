//! SQLite's SQL: the shared statements, with what keeping the log alone changes
//! ([`Bookkeeping::LogOnly`]): each key's newest row is found from the log itself (a page of it
//! at a time at start; grouped by key up to a revision for the reads by key the in-memory index
//! cannot answer), and compaction finds the rows a change replaced through its `prev_revision`.

use std::borrow::Cow;
use std::sync::LazyLock;

use crate::backend::core::{Bookkeeping, Sql, Stmt, Syntax, end_key, insert_chunks, values_chunks};
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

/// Rows per multi-row INSERT: 11 parameters each stays under SQLite's oldest limit of 999
/// parameters per statement.
const INSERT_CHUNK: usize = 64;
/// `(key, revision)` pairs per `values_at` statement (two parameters each).
const VALUES_CHUNK: usize = 256;

/// "The newest row at or below revision ?3 of each key in a range, if it is live", as `x`
/// (`name`, `revision`), in key order. `$range` selects the keys of `k` (`?1` start, `?2` end).
/// Nothing but the log records which row is newest, so this reads every row of the range up
/// to R: the in-memory index answers reads by key, and this is for when it cannot. The bare
/// `deleted` is that of the row with the largest revision (SQLite's rule for a single MAX).
macro_rules! visible {
    ($range:literal) => {
        concat!(
            "(SELECT name, revision FROM (SELECT k.name AS name, MAX(k.revision) AS revision, \
             k.deleted AS deleted FROM kv_log AS k WHERE ",
            $range,
            " AND k.revision <= ?3 GROUP BY k.name) WHERE deleted = 0) AS x"
        )
    };
}

/// Joins a scan's `x` (a key and a revision) to its row, found by its revision in the primary
/// key.
macro_rules! row_join {
    () => {
        " CROSS JOIN kv_log AS k ON k.revision = x.revision AND k.name = x.name"
    };
}

/// "The row of the key `?1` that is visible at revision ?3, if it is live": the log read
/// backwards from R to the key's first row there, so a key written recently is found soon.
macro_rules! single_key {
    ($columns:expr, $tail:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM (SELECT * FROM kv_log WHERE name = ?1 AND revision <= ?3 \
             ORDER BY revision DESC, sub DESC LIMIT 1) AS k WHERE k.deleted = 0",
            $tail
        )
    };
}

/// The log's columns up to the lease, of the row `k`.
macro_rules! row_columns {
    () => {
        "k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, k.prev_revision, \
         k.version, k.lease"
    };
}

/// What a scan returns of a row: the log's columns with `$value` for the value (`k.value`, or
/// an empty blob for keys-only scans), and neither old value nor old lease (a read answers with
/// neither), so large blobs and the overflow pages they spill onto stay on disk when unneeded.
macro_rules! scan_columns {
    ($value:literal) => {
        concat!(row_columns!(), ", ", $value, " AS value, NULL, 0")
    };
}

/// A scan in key order, at most `?4` rows, each looked up in the log only once it is within
/// the limit. The limit is `?4 + 0`, not `?4`: SQLite plans a bare `LIMIT ?` for the value
/// bound, so it would re-parse and re-plan the statement on every execution; an expression is
/// evaluated at run time instead.
macro_rules! scan_sql {
    ($value:literal, $range:literal) => {
        concat!(
            "SELECT ",
            scan_columns!($value),
            " FROM ",
            visible!($range),
            row_join!(),
            " ORDER BY x.name LIMIT ?4 + 0"
        )
    };
}

macro_rules! count_sql {
    ($range:literal) => {
        concat!("SELECT COUNT(*) FROM ", visible!($range))
    };
}

pub static SQL: LazyLock<Sql> = LazyLock::new(|| Sql {
    latest: Cow::Borrowed(concat!(
        "SELECT ",
        row_columns!(),
        ", k.value, k.old_value, k.old_lease FROM kv_log AS k WHERE k.name = ? \
         ORDER BY k.revision DESC, k.sub DESC LIMIT 1"
    )),
    // A page of the log in its order (see `Bookkeeping::LogOnly`), without values, and with
    // the old lease only above the first parameter (the window of history needs it): it is
    // stored after the value, so for a row whose value spills onto overflow pages, reading it
    // reads those pages too, and SQLite reads a column only when the CASE needs it.
    heads: Cow::Borrowed(concat!(
        "SELECT ",
        row_columns!(),
        ", x'' AS value, NULL, CASE WHEN k.revision > ? THEN k.old_lease ELSE 0 END \
          FROM kv_log AS k WHERE (k.revision, k.sub) > (?, ?) \
          ORDER BY k.revision, k.sub LIMIT ?"
    )),
    // The rows that ever carried the lease (its partial index) name the keys; each key's row
    // visible at the revision is then its newest up to there, found by one scan of the log.
    lease_keys: Cow::Borrowed(concat!(
        "SELECT ",
        row_columns!(),
        ", k.value, k.old_value, k.old_lease FROM (SELECT name, MAX(revision) AS revision FROM kv_log \
           WHERE revision <= ?2 AND name IN (SELECT name FROM kv_log \
             WHERE lease = ?1 AND lease <> 0 AND revision <= ?2) \
           GROUP BY name) AS x",
        row_join!(),
        " WHERE k.lease = ?1 AND NOT k.deleted AND k.revision <= ?3 ORDER BY k.name"
    )),
    // The rows replaced in the window: each replacing row names its predecessor, found by its
    // revision in the primary key.
    compact_superseded: Cow::Borrowed(
        "DELETE FROM kv_log WHERE rowid IN (SELECT k.rowid FROM kv_log AS s \
         CROSS JOIN kv_log AS k ON k.revision = s.prev_revision AND k.name = s.name \
         WHERE s.revision >= ?1 AND s.revision < ?2 AND s.prev_revision > 0)",
    ),
    bookkeeping: Bookkeeping::LogOnly,
    ..Sql::common(&SYNTAX, scan, count, insert_rows, values_at)
});

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
    // The rows say what they replace (`prev_revision`): nothing else is written.
    insert_chunks(rows, INSERT_CHUNK, usize::MAX, |_| Vec::new())
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
