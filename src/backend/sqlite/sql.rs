//! SQLite's SQL: the shared statements, with the index hints and range queries SQLite's planner
//! needs (its own estimates would walk every old version of a key range).

use std::borrow::Cow;
use std::sync::LazyLock;

use crate::backend::core::{
    Arg, Bookkeeping, Sql, Stmt, Syntax, end_key, insert_chunks, push_tuples, values_chunks,
};
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

/// "The key and revision of each key in a range whose row visible at revision ?3 is live."
/// `$range` selects the keys of `x` (`?1` start, `?2` end). A visible row has `revision <= R`
/// and was not yet replaced at R: either it is still the key's newest row (`kv_head`, whose
/// tombstones the test on `deleted` drops) or it was replaced after R (`kv_replaced`, a
/// handful of rows when R is recent; its primary key starts with the replacing revision). Each
/// branch is one range of one table, so neither looks at older versions, nor at the log.
macro_rules! visible_branches {
    ($columns:expr, $range:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM kv_head AS x WHERE ",
            $range,
            " AND x.deleted = 0 AND x.revision <= ?3 UNION ALL SELECT ",
            $columns,
            " FROM kv_replaced AS x WHERE x.superseded_by > ?3 AND ",
            $range,
            " AND x.revision <= ?3 AND x.deleted = 0"
        )
    };
}

/// Joins a scan's `x` (a `kv_head` or `kv_replaced` entry) to its row, found by its revision
/// in the primary key.
macro_rules! row_join {
    () => {
        " CROSS JOIN kv_log AS k ON k.revision = x.revision AND k.name = x.name"
    };
}

/// "The row of the key `?1` that is visible at revision ?3, if it is live." It starts at the
/// key's newest row (`kv_head`) and walks back along `prev_revision`, each step one lookup of a
/// revision in the primary key, to the first row at or below R. At the current revision that
/// is the newest row itself; an older R walks back over the versions written since. Nothing on
/// the way can have been compacted: those rows were replaced after R.
macro_rules! single_key {
    ($columns:expr, $tail:literal) => {
        concat!(
            "WITH RECURSIVE chain(revision, prev) AS (\
                 SELECT h.revision, k.prev_revision FROM kv_head AS h CROSS JOIN kv_log AS k \
                 ON k.revision = h.revision AND k.name = h.name WHERE h.name = ?1 \
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

/// The log's columns up to the lease, of the row `k`, its key taken from `$name`. A scan takes
/// it from the entry the row was found by (`x.name`), which is what it is ordered by.
macro_rules! row_columns {
    ($name:literal) => {
        concat!(
            "k.revision, k.sub, ",
            $name,
            " AS name, k.created, k.deleted, k.create_revision, k.prev_revision, k.version, \
             k.lease"
        )
    };
}

/// What a scan returns of a row: the log's columns with `$value` for the value (`k.value`, or
/// an empty blob for keys-only scans), and neither old value nor old lease (a read answers with
/// neither), so large blobs and the overflow pages they spill onto stay on disk when unneeded.
macro_rules! scan_columns {
    ($name:literal, $value:literal) => {
        concat!(row_columns!($name), ", ", $value, " AS value, NULL, 0")
    };
}

/// A scan in key order, at most `?4` rows. The branches find the keys and revisions, and only
/// the rows within the limit are then looked up in the log: the branch of rows replaced since
/// an older revision must be sorted before the limit applies, and looking up each of its rows
/// first would read the values of every version written since. The limit is `?4 + 0`, not
/// `?4`: SQLite plans a compound SELECT's bare `LIMIT ?` for the value bound, so it would
/// re-parse and re-plan the statement on every execution (a third of a point read's CPU); an
/// expression is evaluated at run time instead.
macro_rules! scan_sql {
    ($value:literal, $range:literal) => {
        concat!(
            "SELECT ",
            scan_columns!("x.name", $value),
            " FROM (",
            visible_branches!("x.name AS name, x.revision AS revision", $range),
            " ORDER BY name LIMIT ?4 + 0) AS x",
            row_join!(),
            " ORDER BY x.name"
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

pub static SQL: LazyLock<Sql> = LazyLock::new(|| Sql {
    latest: Cow::Borrowed(concat!(
        "SELECT ",
        row_columns!("k.name"),
        ", k.value, k.old_value, k.old_lease FROM kv_head AS x",
        row_join!(),
        " WHERE x.name = ?"
    )),
    // No old lease (a watch's concern, not the index's): it is stored after the value, so for
    // a row whose value spills onto an overflow page, reading it would read that page too.
    heads: Cow::Borrowed(concat!(
        "SELECT ",
        scan_columns!("k.name", "x''"),
        " FROM kv_head AS x",
        row_join!()
    )),
    // The row is visible at the revision when it is the key's newest or was replaced after it.
    lease_keys: Cow::Borrowed(concat!(
        "SELECT ",
        crate::log_columns!(),
        " FROM kv_log AS k WHERE k.lease = ?1 AND k.lease <> 0 AND k.revision <= ?2 \
          AND NOT k.deleted AND (\
            EXISTS (SELECT 1 FROM kv_head AS h WHERE h.name = k.name AND h.revision = k.revision) \
            OR EXISTS (SELECT 1 FROM kv_replaced AS r WHERE r.superseded_by > ?3 \
                       AND r.name = k.name AND r.revision = k.revision)) \
          ORDER BY k.name"
    )),
    // The rows replaced in the window, each found by its revision in the primary key.
    compact_superseded: Cow::Borrowed(
        "DELETE FROM kv_log WHERE rowid IN (SELECT k.rowid FROM kv_replaced AS r \
         CROSS JOIN kv_log AS k ON k.revision = r.revision AND k.name = r.name \
         WHERE r.superseded_by >= ?1 AND r.superseded_by < ?2)",
    ),
    forget_replaced: Some(Cow::Borrowed(
        "DELETE FROM kv_replaced WHERE superseded_by >= ? AND superseded_by < ?",
    )),
    // Before the tombstones go: they are found in the log by revision, then in kv_head by key.
    forget_tombstones: Some(Cow::Borrowed(
        "DELETE FROM kv_head WHERE name IN (SELECT name FROM kv_log \
         WHERE deleted AND revision >= ?1 AND revision < ?2) \
         AND deleted AND revision >= ?1 AND revision < ?2",
    )),
    bookkeeping: Bookkeeping::Tables,
    ..Sql::common(&SYNTAX, scan, count, insert_rows, values_at)
});

/// The statement behind [`crate::backend::ReadTxn::scan`], public so that `benches/scale` can
/// show its plan. Parameters: `?1` start key, `?2` end key (ignored unless the end is a key),
/// `?3` revision, `?4` limit (-1 for none).
pub fn scan_query(end: &RangeEnd, keys_only: bool) -> &'static str {
    match (end, keys_only) {
        (RangeEnd::Single, false) => {
            single_key!(scan_columns!("k.name", "k.value"), " LIMIT ?4 + 0")
        }
        (RangeEnd::Single, true) => single_key!(scan_columns!("k.name", "x''"), " LIMIT ?4 + 0"),
        (RangeEnd::Unbounded, false) => scan_sql!("k.value", "x.name >= ?1"),
        (RangeEnd::Unbounded, true) => scan_sql!("x''", "x.name >= ?1"),
        (RangeEnd::Before(_), false) => scan_sql!("k.value", "x.name >= ?1 AND x.name < ?2"),
        (RangeEnd::Before(_), true) => scan_sql!("x''", "x.name >= ?1 AND x.name < ?2"),
    }
}

/// The statement behind [`crate::backend::ReadTxn::count`]; parameters as for [`scan_query`],
/// without a limit.
pub fn count_query(end: &RangeEnd) -> &'static str {
    match end {
        RangeEnd::Single => concat!("SELECT COUNT(*) FROM (", single_key!("1", ""), ")"),
        RangeEnd::Unbounded => count_sql!("x.name >= ?1"),
        RangeEnd::Before(_) => count_sql!("x.name >= ?1 AND x.name < ?2"),
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
    insert_chunks(rows, INSERT_CHUNK, usize::MAX, |chunk| {
        let mut statements = Vec::with_capacity(2);
        // A row that follows one replaces it. The replaced row was a tombstone exactly when
        // this one created the key again.
        let replacing: Vec<&LogRow> = chunk.iter().filter(|r| r.prev_revision > 0).collect();
        if !replacing.is_empty() {
            let mut sql = String::from(
                "INSERT INTO kv_replaced (superseded_by, name, revision, deleted) VALUES ",
            );
            push_tuples(&mut sql, replacing.len(), "(?, ?, ?, ?)");
            let mut stmt = Stmt::new(sql);
            for row in replacing {
                stmt = stmt
                    .int(row.revision)
                    .bytes(&row.key)
                    .int(row.prev_revision)
                    .arg(Arg::Bool(row.created));
            }
            statements.push(stmt);
        }
        // In row order, so that a key written twice in the chunk ends at its later row.
        let mut sql = String::from("INSERT INTO kv_head (name, revision, deleted) VALUES ");
        push_tuples(&mut sql, chunk.len(), "(?, ?, ?)");
        sql.push_str(
            " ON CONFLICT (name) DO UPDATE SET revision = excluded.revision, \
             deleted = excluded.deleted",
        );
        let mut stmt = Stmt::new(sql);
        for row in chunk {
            stmt = stmt
                .bytes(&row.key)
                .int(row.revision)
                .arg(Arg::Bool(row.deleted));
        }
        statements.push(stmt);
        statements
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
