//! The integrity check (`etcdsql check`): the rules the log's bookkeeping keeps, each asked of
//! the database as one query over one snapshot, and every violation found put in words.
//!
//! The rules (see `crate::backend` for why each exists):
//! - the counters: every row at or below the current revision; the compact revision at or below
//!   it; physical compaction no further than the compact revision;
//! - one row per key and revision;
//! - each key has exactly one newest row (`superseded_by` NULL, or its `kv_head` entry), and it
//!   is the key's newest;
//! - what says a row was replaced names a row of the same key whose `prev_revision` names it
//!   back; every other row is recorded as replaced;
//! - where the log alone keeps it, each row's `prev_revision` names the key's row just before
//!   it, or nothing when the key has no earlier row;
//! - a row that created its key has `create_revision` = its revision and version 1, and follows
//!   nothing or a deletion; a later put has its predecessor's version plus one;
//! - a live key's lease exists.
//!
//! The statements are the same in every dialect but for where the dialect keeps its
//! [`Bookkeeping`]: they use no placeholders and only SQL that SQLite, PostgreSQL and MySQL
//! share.

use super::{Bookkeeping, Columns, Session, Stmt};
use crate::backend::Result;

/// Violations listed per rule, at most this many (the count says how many in all).
const SAMPLES: usize = 10;

/// What a check found wrong; empty when the store is consistent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Rows, keys and revisions the check looked at, for the summary line.
    pub rows: i64,
    pub current_revision: i64,
    pub compact_revision: i64,
    pub leases: i64,
    /// One sentence per violation.
    pub problems: Vec<String>,
}

/// A rule: a query answering one row per violation, and how to say each in words.
struct Rule {
    sql: &'static str,
    say: fn(&dyn RowText) -> String,
}

/// A result row's columns as text, whatever their type.
trait RowText {
    fn col(&self, i: usize) -> String;
}

impl<R: Columns> RowText for R {
    fn col(&self, i: usize) -> String {
        if let Ok(n) = self.int(i) {
            return n.to_string();
        }
        if let Ok(Some(n)) = self.opt_int(i) {
            return n.to_string();
        }
        match self.bytes(i) {
            Ok(bytes) => format!("{:?}", String::from_utf8_lossy(&bytes)),
            Err(_) => "NULL".into(),
        }
    }
}

const RULES: &[Rule] = &[
    Rule {
        sql: "SELECT k.name, k.revision FROM kv_log AS k \
              WHERE k.revision > (SELECT value FROM meta WHERE name = 'current_revision')",
        say: |r| {
            format!(
                "key {} has a row at revision {}, above the current revision",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT c.value, r.value FROM meta AS c CROSS JOIN meta AS r \
              WHERE c.name = 'compact_revision' AND r.name = 'current_revision' \
              AND c.value > r.value",
        say: |r| {
            format!(
                "the compact revision {} is above the current revision {}",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT t.value, c.value FROM meta AS t CROSS JOIN meta AS c \
              WHERE t.name = 'compacted_through' AND c.name = 'compact_revision' \
              AND t.value > c.value",
        say: |r| {
            format!(
                "rows were removed through revision {}, past the compact revision {}",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT name, revision, COUNT(*) FROM kv_log GROUP BY name, revision \
              HAVING COUNT(*) > 1",
        say: |r| {
            format!(
                "key {} has {} rows at revision {}",
                r.col(0),
                r.col(2),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT k.name, k.revision, k.create_revision, k.version FROM kv_log AS k \
              WHERE k.created AND (k.create_revision <> k.revision OR k.version <> 1)",
        say: |r| {
            format!(
                "key {}: the row creating it at revision {} has create_revision {} and \
                 version {} (expected its own revision and 1)",
                r.col(0),
                r.col(1),
                r.col(2),
                r.col(3)
            )
        },
    },
    Rule {
        sql: "SELECT k.name, k.revision, p.revision FROM kv_log AS k \
              JOIN kv_log AS p ON p.name = k.name AND p.revision = k.prev_revision \
              WHERE k.created AND NOT p.deleted",
        say: |r| {
            format!(
                "key {}: the row at revision {} creates the key, but it was live at revision {}",
                r.col(0),
                r.col(1),
                r.col(2)
            )
        },
    },
    Rule {
        sql: "SELECT k.name, k.revision, k.version, p.version FROM kv_log AS k \
              JOIN kv_log AS p ON p.name = k.name AND p.revision = k.prev_revision \
              WHERE NOT k.created AND NOT k.deleted AND NOT p.deleted \
              AND k.version <> p.version + 1",
        say: |r| {
            format!(
                "key {}: version {} at revision {} does not follow version {} before it",
                r.col(0),
                r.col(2),
                r.col(1),
                r.col(3)
            )
        },
    },
];

/// The bookkeeping kept in the rows ([`Bookkeeping::InRow`]).
const IN_ROW_RULES: &[Rule] = &[
    Rule {
        sql: "SELECT name, COUNT(*) FROM kv_log WHERE superseded_by IS NULL GROUP BY name \
              HAVING COUNT(*) > 1",
        say: |r| {
            format!(
                "key {} has {} rows marked newest (superseded_by NULL); it must have one",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT k.name, MAX(k.revision) FROM kv_log AS k WHERE NOT EXISTS \
              (SELECT 1 FROM kv_log AS h WHERE h.name = k.name AND h.superseded_by IS NULL) \
              GROUP BY k.name",
        say: |r| {
            format!(
                "key {} has no row marked newest (its newest is at revision {})",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT h.name, h.revision, MAX(n.revision) FROM kv_log AS h \
              JOIN kv_log AS n ON n.name = h.name AND n.revision > h.revision \
              WHERE h.superseded_by IS NULL GROUP BY h.name, h.revision",
        say: |r| {
            format!(
                "key {}: the row marked newest is at revision {}, but it has a row at {}",
                r.col(0),
                r.col(1),
                r.col(2)
            )
        },
    },
    Rule {
        sql: "SELECT k.name, k.revision, k.superseded_by FROM kv_log AS k \
              LEFT JOIN kv_log AS s ON s.name = k.name AND s.revision = k.superseded_by \
              WHERE k.superseded_by IS NOT NULL \
              AND (s.revision IS NULL OR s.prev_revision <> k.revision)",
        say: |r| {
            format!(
                "key {}: the row at revision {} says revision {} replaced it, but no row of \
                 the key there follows it",
                r.col(0),
                r.col(1),
                r.col(2)
            )
        },
    },
    Rule {
        sql: "SELECT h.name, h.lease FROM kv_log AS h \
              LEFT JOIN leases AS l ON l.id = h.lease \
              WHERE h.superseded_by IS NULL AND NOT h.deleted AND h.lease <> 0 \
              AND l.id IS NULL",
        say: missing_lease,
    },
];

/// The bookkeeping kept in tables of its own ([`Bookkeeping::Tables`]). A `kv_replaced` entry
/// may outlive its row when that row was a tombstone: compaction removes tombstones below the
/// compact revision whatever replaced them, and such an entry is never read as live.
const TABLES_RULES: &[Rule] = &[
    Rule {
        sql: "SELECT k.name, MAX(k.revision) FROM kv_log AS k WHERE NOT EXISTS \
              (SELECT 1 FROM kv_head AS h WHERE h.name = k.name) GROUP BY k.name",
        say: |r| {
            format!(
                "key {} has no entry in kv_head (its newest row is at revision {})",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT h.name, h.revision FROM kv_head AS h LEFT JOIN kv_log AS k \
              ON k.revision = h.revision AND k.name = h.name \
              WHERE k.revision IS NULL OR k.deleted <> h.deleted",
        say: |r| {
            format!(
                "key {}: kv_head names revision {}, where the key has no such row",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT h.name, h.revision, MAX(n.revision) FROM kv_head AS h \
              JOIN kv_log AS n ON n.name = h.name AND n.revision > h.revision \
              GROUP BY h.name, h.revision",
        say: |r| {
            format!(
                "key {}: kv_head names revision {} as its newest, but it has a row at {}",
                r.col(0),
                r.col(1),
                r.col(2)
            )
        },
    },
    Rule {
        sql: "SELECT k.name, k.revision FROM kv_log AS k WHERE NOT EXISTS \
              (SELECT 1 FROM kv_head AS h WHERE h.name = k.name AND h.revision = k.revision) \
              AND NOT EXISTS (SELECT 1 FROM kv_replaced AS r \
              WHERE r.name = k.name AND r.revision = k.revision)",
        say: |r| {
            format!(
                "key {}: the row at revision {} is neither the newest nor recorded as replaced",
                r.col(0),
                r.col(1)
            )
        },
    },
    Rule {
        sql: "SELECT r.name, r.revision, r.superseded_by FROM kv_replaced AS r \
              LEFT JOIN kv_log AS s ON s.revision = r.superseded_by AND s.name = r.name \
              LEFT JOIN kv_log AS k ON k.revision = r.revision AND k.name = r.name \
              WHERE s.revision IS NULL OR s.prev_revision <> r.revision \
              OR (k.revision IS NULL AND NOT r.deleted) OR k.deleted <> r.deleted",
        say: |r| {
            format!(
                "key {}: the row at revision {} is recorded as replaced at revision {}, but no \
                 row of the key there follows it",
                r.col(0),
                r.col(1),
                r.col(2)
            )
        },
    },
    Rule {
        sql: "SELECT h.name, k.lease FROM kv_head AS h \
              JOIN kv_log AS k ON k.revision = h.revision AND k.name = h.name \
              LEFT JOIN leases AS l ON l.id = k.lease \
              WHERE NOT h.deleted AND k.lease <> 0 AND l.id IS NULL",
        say: missing_lease,
    },
];

/// The bookkeeping in `prev_revision` alone ([`Bookkeeping::LogOnly`]). A predecessor may be
/// missing: compaction removed it.
const LOG_ONLY_RULES: &[Rule] = &[
    Rule {
        sql: "SELECT k.name, k.revision, k.prev_revision, MAX(n.revision) FROM kv_log AS k \
              JOIN kv_log AS n ON n.name = k.name AND n.revision < k.revision \
              AND n.revision > k.prev_revision GROUP BY k.name, k.revision, k.prev_revision",
        say: |r| {
            format!(
                "key {}: the row at revision {} follows revision {}, but the key has a row at \
                 {} between them",
                r.col(0),
                r.col(1),
                r.col(2),
                r.col(3)
            )
        },
    },
    // Compaction removes a row only once a change below the revisions it has compacted
    // through replaced it, or a tombstone (whose successor, if any, created the key again).
    Rule {
        sql: "SELECT k.name, k.revision, k.prev_revision FROM kv_log AS k \
              WHERE k.prev_revision > 0 AND NOT k.created \
              AND k.revision >= (SELECT value FROM meta WHERE name = 'compacted_through') \
              AND NOT EXISTS (SELECT 1 FROM kv_log AS p \
              WHERE p.revision = k.prev_revision AND p.name = k.name)",
        say: |r| {
            format!(
                "key {}: the row at revision {} follows revision {}, where the key has no row",
                r.col(0),
                r.col(1),
                r.col(2)
            )
        },
    },
    // Each key's newest row by one grouping of the log (SQLite takes the bare columns from
    // the row with the largest revision), not a search of each leased row's later history.
    Rule {
        sql: "SELECT name, lease FROM (SELECT name, MAX(revision) AS revision, lease, deleted \
              FROM kv_log GROUP BY name) \
              WHERE NOT deleted AND lease <> 0 AND lease NOT IN (SELECT id FROM leases)",
        say: missing_lease,
    },
];

/// How every layout's lease rule says what it found: (key, lease).
fn missing_lease(r: &dyn RowText) -> String {
    format!(
        "key {} is attached to lease {}, which does not exist",
        r.col(0),
        r.col(1)
    )
}

/// Runs every rule in `session` (one snapshot).
pub async fn run<S: Session>(session: &mut S) -> Result<Report> {
    let mut report = Report::default();
    let counts = session
        .fetch(Stmt::new(
            "SELECT (SELECT COUNT(*) FROM kv_log), (SELECT COUNT(*) FROM leases), \
             (SELECT value FROM meta WHERE name = 'current_revision'), \
             (SELECT value FROM meta WHERE name = 'compact_revision')",
        ))
        .await?;
    if let Some(row) = counts.first() {
        report.rows = row.int(0)?;
        report.leases = row.int(1)?;
        report.current_revision = row.int(2)?;
        report.compact_revision = row.int(3)?;
    }
    let bookkeeping = match session.sql().bookkeeping {
        Bookkeeping::InRow => IN_ROW_RULES,
        Bookkeeping::Tables => TABLES_RULES,
        Bookkeeping::LogOnly => LOG_ONLY_RULES,
    };
    for rule in RULES.iter().chain(bookkeeping) {
        let rows = session.fetch(Stmt::new(rule.sql)).await?;
        for row in rows.iter().take(SAMPLES) {
            report.problems.push((rule.say)(row));
        }
        if rows.len() > SAMPLES {
            report
                .problems
                .push(format!("… and {} more like the last", rows.len() - SAMPLES));
        }
    }
    Ok(report)
}
