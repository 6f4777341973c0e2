//! The statements of the backend core, and the few ways dialects spell them differently.
//!
//! Shared statements are written once, with anonymous `?` placeholders each bound once, in the
//! SQL that SQLite, PostgreSQL and MySQL/MariaDB all accept; [`Sql::common`] rewrites them into
//! a dialect's [`Syntax`]. A dialect then replaces what its planner needs said differently
//! (index hints, its own range queries, multi-row statements) in its own `sql.rs`.

use std::borrow::Cow;

use super::Stmt;
use crate::backend::{LogRow, RangeEnd, Scan};

/// What differs between dialects in the shared statements.
#[derive(Clone, Copy, Debug)]
pub struct Syntax {
    /// Placeholders are `$1`, `$2`, … (PostgreSQL) rather than `?`.
    pub numbered: bool,
    /// An INSERT that skips rows whose key exists: (before the table, after the values).
    pub insert_ignore: (&'static str, &'static str),
    /// Appended to a SELECT that must lock the rows it reads until commit ("" where the write
    /// session is exclusive anyway).
    pub lock_rows: &'static str,
    /// Sets the current revision and, in the same statement, wakes other processes with it
    /// (PostgreSQL's NOTIFY): the revision is bound twice. `None`: the plain update, and no
    /// notification.
    pub set_current_revision_and_notify: Option<&'static str>,
    /// An empty byte string, and a NULL one, typed as the log's byte columns are.
    pub empty_bytes: &'static str,
    pub null_bytes: &'static str,
}

/// Where a dialect records which row replaced which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bookkeeping {
    /// In the replaced row itself (`superseded_by`, NULL while the row is its key's newest),
    /// with indexes over it: MySQL.
    InRow,
    /// In tables of their own that the writer only appends to or upserts (`kv_head`, each
    /// key's newest row; `kv_replaced`, keyed by the replacing revision), so the log itself is
    /// append-only: PostgreSQL, which would otherwise write a new version of the replaced row,
    /// value and index entries included, and whose other instances read by key from SQL.
    Tables,
    /// Nowhere but in each row's `prev_revision` (the row it replaced): the log is all there
    /// is, keyed by revision, and a write touches no structure in key order. Each key's newest
    /// row is found by reading the log in revision order ([`Sql::heads`] pages through it), and
    /// reads by key at a revision are the in-memory index's to answer; SQL's are full scans,
    /// for when it cannot. SQLite, whose one process holds that index.
    LogOnly,
}

/// Builds the statements answering `(i, value)` for the wanted rows `(key, revision)` that
/// exist, `i` counting from the first row of the slice.
pub type ValuesAt = for<'a> fn(&[(&'a [u8], i64)]) -> Vec<Stmt<'a>>;

/// Builds the statements that append rows and move the current revision from the first integer
/// to the second. Each takes the writers' lock, writes only if the current revision is the
/// first and every lease of the list (those the rows are attached to) exists, and returns a row
/// exactly when it wrote: so it can also run as a transaction of its own, for a writer that
/// presumes the current revision ([`crate::backend::Backend::write_presuming`]) and read the
/// leases outside the lock.
pub type Append = for<'a> fn(&'a [LogRow], i64, i64, &'a [i64]) -> Vec<Stmt<'a>>;

/// A dialect's statements. Text fields are complete statements; function fields build the
/// statements whose shape depends on their arguments.
pub struct Sql {
    pub revisions: Cow<'static, str>,
    pub cluster_id: Cow<'static, str>,
    /// Records a cluster id, unless the store has one.
    pub insert_cluster_id: Cow<'static, str>,
    pub set_meta: Cow<'static, str>,
    pub compacted_through: Cow<'static, str>,
    /// Raises `compacted_through` to the argument (bound twice), never lowers it.
    pub raise_compacted_through: Cow<'static, str>,
    pub compact_superseded: Cow<'static, str>,
    /// Run after `compact_superseded`, with the same window: drops what recorded the
    /// replacements it compacted, where that is kept apart from the rows.
    pub forget_replaced: Option<Cow<'static, str>>,
    /// Run before `compact_tombstones`, with the same window: drops the tombstones it will
    /// remove from wherever else a key's newest row is kept.
    pub forget_tombstones: Option<Cow<'static, str>>,
    pub compact_tombstones: Cow<'static, str>,
    pub bookkeeping: Bookkeeping,

    pub latest: Cow<'static, str>,
    /// Each key's newest row. With [`Bookkeeping::LogOnly`], a page of the log instead: its
    /// rows after `(revision, sub)` (the second and third integers) in log order, at most the
    /// fourth many, their old lease only if their revision is above the first; the core keeps
    /// each key's newest.
    pub heads: Cow<'static, str>,
    pub changes: Cow<'static, str>,
    pub change_keys: Cow<'static, str>,
    pub lease_keys: Cow<'static, str>,

    pub lease: Cow<'static, str>,
    pub leases: Cow<'static, str>,
    pub expired_leases: Cow<'static, str>,
    pub next_expiry: Cow<'static, str>,
    pub insert_lease: Cow<'static, str>,
    pub set_lease_expiry: Cow<'static, str>,
    pub delete_lease: Cow<'static, str>,

    pub savepoint: Cow<'static, str>,
    pub release_savepoint: Cow<'static, str>,
    pub rollback_to_savepoint: Cow<'static, str>,
    /// Sets the current revision (see [`Syntax::set_current_revision_and_notify`]).
    pub set_current_revision: Cow<'static, str>,
    /// `set_current_revision` notifies, and takes the revision a second time.
    pub notifies: bool,

    pub alarms_raised: Cow<'static, str>,
    /// Adds an alarm's row, cleared, unless it exists; `raise_alarm` then raises it.
    pub insert_alarm: Cow<'static, str>,
    pub raise_alarm: Cow<'static, str>,
    pub clear_alarm: Cow<'static, str>,

    pub auth_meta: Cow<'static, str>,
    /// `auth_meta`, locking the rows against other instances' changes until commit.
    pub auth_meta_locked: Cow<'static, str>,
    pub auth_users: Cow<'static, str>,
    pub auth_roles: Cow<'static, str>,
    pub delete_auth_users: Cow<'static, str>,
    pub delete_auth_roles: Cow<'static, str>,
    pub insert_auth_user: Cow<'static, str>,
    pub insert_auth_role: Cow<'static, str>,

    /// Live keys of a range at a revision, in key order ([`crate::backend::ReadTxn::scan`]).
    pub scan: for<'a> fn(&Scan<'a>) -> Stmt<'a>,
    /// How many live keys a range holds at a revision: one integer.
    pub count: for<'a> fn(&'a [u8], &'a RangeEnd, i64) -> Stmt<'a>,
    /// Appends rows and marks the rows they replace, in order.
    pub insert_rows: for<'a> fn(&'a [LogRow]) -> Vec<Stmt<'a>>,
    /// `insert_rows` and `set_current_revision` in fewer statements, where the dialect can.
    pub append: Option<Append>,
    pub values_at: ValuesAt,
}

/// The log table's columns in [`super::decode_row`]'s order (a macro so statements stay
/// literals).
#[macro_export]
#[doc(hidden)]
macro_rules! log_columns {
    () => {
        "revision, sub, name, created, deleted, create_revision, prev_revision, version, lease, \
         value, old_value, old_lease"
    };
}

/// [`Sql::changes`], with the bounds of `(after, through]` spelled as given: placeholders, or
/// numbers where a statement can take no parameters.
pub fn changes_query(after: &str, through: &str) -> String {
    format!(
        "SELECT k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, \
         k.prev_revision, k.version, k.lease, k.value, \
         CASE WHEN NOT k.created THEN COALESCE((SELECT p.value FROM kv_log AS p \
         WHERE p.revision = k.prev_revision AND p.name = k.name), k.old_value) END, \
         k.old_lease \
         FROM kv_log AS k WHERE k.revision > {after} AND k.revision <= {through} \
         ORDER BY k.revision, k.sub"
    )
}

impl Sql {
    /// The shared statements in `syntax`; the dialect-shaped builders come from the dialect.
    pub fn common(
        syntax: &Syntax,
        scan: for<'a> fn(&Scan<'a>) -> Stmt<'a>,
        count: for<'a> fn(&'a [u8], &'a RangeEnd, i64) -> Stmt<'a>,
        insert_rows: for<'a> fn(&'a [LogRow]) -> Vec<Stmt<'a>>,
        values_at: ValuesAt,
    ) -> Self {
        let s = |sql: &'static str| syntax.spell(sql);
        let (ignore, ignore_tail) = syntax.insert_ignore;
        let insert_ignore =
            |rest: &str| syntax.spell_owned(format!("{ignore} {rest}{ignore_tail}"));
        let auth_meta =
            "SELECT name, value FROM meta WHERE name IN ('auth_enabled', 'auth_revision')";
        // The log's columns with the value and old value left empty: what the writer's key
        // index reads (`heads`, `change_keys`).
        let key_columns = format!(
            "revision, sub, name, created, deleted, create_revision, prev_revision, version, \
             lease, {}, {}, old_lease",
            syntax.empty_bytes, syntax.null_bytes
        );
        Sql {
            revisions: s(
                "SELECT name, value FROM meta WHERE name IN ('current_revision', 'compact_revision', 'fence_revision')",
            ),
            cluster_id: s("SELECT value FROM meta WHERE name = 'cluster_id'"),
            insert_cluster_id: insert_ignore("meta (name, value) VALUES ('cluster_id', ?)"),
            set_meta: s("UPDATE meta SET value = ? WHERE name = ?"),
            compacted_through: s("SELECT value FROM meta WHERE name = 'compacted_through'"),
            raise_compacted_through: s(
                "UPDATE meta SET value = CASE WHEN value < ? THEN ? ELSE value END \
                 WHERE name = 'compacted_through'",
            ),
            compact_superseded: s(
                "DELETE FROM kv_log WHERE superseded_by >= ? AND superseded_by < ?",
            ),
            forget_replaced: None,
            forget_tombstones: None,
            compact_tombstones: s(
                "DELETE FROM kv_log WHERE deleted AND revision >= ? AND revision < ?",
            ),
            bookkeeping: Bookkeeping::InRow,
            latest: s(concat!(
                "SELECT ",
                log_columns!(),
                " FROM kv_log WHERE name = ? AND superseded_by IS NULL"
            )),
            heads: syntax.spell_owned(format!(
                "SELECT {key_columns} FROM kv_log WHERE superseded_by IS NULL"
            )),
            // The old value is the predecessor row's (rows written by older releases carry
            // their own as well); compaction keeps it for every change at or above the compact
            // revision, the changes a watch can ask for.
            // The old value is a correlated subquery rather than a join so that it stays one
            // lookup by key per row whatever the planner thinks of the range: before the log
            // was analyzed, PostgreSQL planned the join as a parallel hash join over the whole
            // log (half a second for a range of twenty revisions).
            changes: syntax.spell_owned(changes_query("?", "?")),
            change_keys: syntax.spell_owned(format!(
                "SELECT {key_columns} FROM kv_log \
                 WHERE revision > ? AND revision <= ? ORDER BY revision, sub"
            )),
            // A lease holds few keys: its partial index finds every row that ever carried it
            // (`k.lease <> 0` lets the planner use it), and the visibility test keeps the one
            // row per key that is live at the revision.
            lease_keys: s(concat!(
                "SELECT ",
                log_columns!(),
                " FROM kv_log AS k WHERE k.lease = ? AND k.lease <> 0 AND k.revision <= ? \
                  AND (k.superseded_by IS NULL OR k.superseded_by > ?) AND NOT k.deleted \
                  ORDER BY k.name"
            )),
            lease: s("SELECT id, ttl, expires_at FROM leases WHERE id = ?"),
            leases: s("SELECT id, ttl, expires_at FROM leases ORDER BY id"),
            expired_leases: s(
                "SELECT id, ttl, expires_at FROM leases WHERE expires_at <= ? \
                 ORDER BY expires_at LIMIT ?",
            ),
            next_expiry: s("SELECT MIN(expires_at) FROM leases"),
            insert_lease: insert_ignore("leases (id, ttl, expires_at) VALUES (?, ?, ?)"),
            set_lease_expiry: s("UPDATE leases SET expires_at = ? WHERE id = ?"),
            delete_lease: s("DELETE FROM leases WHERE id = ?"),
            savepoint: s("SAVEPOINT request"),
            release_savepoint: s("RELEASE SAVEPOINT request"),
            rollback_to_savepoint: s("ROLLBACK TO SAVEPOINT request"),
            set_current_revision: s(syntax
                .set_current_revision_and_notify
                .unwrap_or("UPDATE meta SET value = ? WHERE name = 'current_revision'")),
            notifies: syntax.set_current_revision_and_notify.is_some(),
            alarms_raised: s("SELECT name FROM meta WHERE name LIKE 'alarm:%' AND value = 1"),
            insert_alarm: insert_ignore("meta (name, value) VALUES (?, 0)"),
            raise_alarm: s("UPDATE meta SET value = 1 WHERE name = ? AND value = 0"),
            clear_alarm: s("UPDATE meta SET value = 0 WHERE name = ? AND value = 1"),
            auth_meta: s(auth_meta),
            auth_meta_locked: syntax.spell_owned(format!("{auth_meta}{}", syntax.lock_rows)),
            auth_users: s("SELECT name, record FROM auth_users ORDER BY name"),
            auth_roles: s("SELECT name, record FROM auth_roles ORDER BY name"),
            delete_auth_users: s("DELETE FROM auth_users"),
            delete_auth_roles: s("DELETE FROM auth_roles"),
            insert_auth_user: s("INSERT INTO auth_users (name, record) VALUES (?, ?)"),
            insert_auth_role: s("INSERT INTO auth_roles (name, record) VALUES (?, ?)"),
            scan,
            count,
            insert_rows,
            append: None,
            values_at,
        }
    }
}

impl Syntax {
    /// `sql` (written with `?` placeholders) in this syntax.
    pub fn spell(&self, sql: &'static str) -> Cow<'static, str> {
        if self.numbered {
            Cow::Owned(number_placeholders(sql))
        } else {
            Cow::Borrowed(sql)
        }
    }

    fn spell_owned(&self, sql: String) -> Cow<'static, str> {
        if self.numbered {
            Cow::Owned(number_placeholders(&sql))
        } else {
            Cow::Owned(sql)
        }
    }
}

/// `?` placeholders as `$1`, `$2`, …: the statements written here hold no `?` anywhere else.
pub fn number_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// The columns a multi-row INSERT of log rows writes (no old value: readers take it from the
/// predecessor row, see `changes`).
const INSERT_COLUMNS: &str = "INSERT INTO kv_log (revision, sub, name, created, deleted, \
     create_revision, prev_revision, version, lease, value, old_lease) VALUES ";

/// Appends `rows` for dialects that take many rows as VALUES tuples (SQLite, MySQL): in chunks
/// of at most `max_rows` rows and about `max_bytes` of keys and values, each a multi-row INSERT
/// followed by the statements `bookkeeping` gives for the chunk: what records which rows the
/// chunk's rows replaced (after the insert: a row's predecessor may be an earlier row of the
/// same chunk).
pub fn insert_chunks<'a>(
    rows: &'a [LogRow],
    max_rows: usize,
    max_bytes: usize,
    bookkeeping: impl Fn(&'a [LogRow]) -> Vec<Stmt<'a>>,
) -> Vec<Stmt<'a>> {
    let mut statements = Vec::new();
    let mut rest = rows;
    while !rest.is_empty() {
        let mut take = 0;
        let mut bytes = 0;
        while take < rest.len() && take < max_rows && (take == 0 || bytes < max_bytes) {
            bytes += rest[take].key.len() + rest[take].value.len();
            take += 1;
        }
        let (chunk, after) = rest.split_at(take);
        rest = after;
        statements.push(insert_values(chunk));
        statements.extend(bookkeeping(chunk));
    }
    statements
}

/// The statement that sets `superseded_by` on the rows `chunk` replaces, for dialects that
/// keep it in the row: `update(n)` is its text for `n` replacing rows, each taking (its
/// revision, its key, the revision it replaces). None when no row replaces one.
pub fn mark_superseded<'a>(
    chunk: &'a [LogRow],
    update: impl Fn(usize) -> String,
) -> Option<Stmt<'a>> {
    let replacing: Vec<&LogRow> = chunk.iter().filter(|r| r.prev_revision > 0).collect();
    if replacing.is_empty() {
        return None;
    }
    let mut stmt = Stmt::new(update(replacing.len()));
    for row in replacing {
        stmt = stmt
            .int(row.revision)
            .bytes(&row.key)
            .int(row.prev_revision);
    }
    Some(stmt)
}

/// A multi-row INSERT of `rows` with `?` placeholders.
fn insert_values(rows: &[LogRow]) -> Stmt<'_> {
    let mut sql = String::from(INSERT_COLUMNS);
    push_tuples(&mut sql, rows.len(), "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    let mut stmt = Stmt::new(sql);
    for row in rows {
        stmt = stmt
            .int(row.revision)
            .int(row.sub)
            .bytes(&row.key)
            .arg(super::Arg::Bool(row.created))
            .arg(super::Arg::Bool(row.deleted))
            .int(row.create_revision)
            .int(row.prev_revision)
            .int(row.version)
            .int(row.lease)
            .bytes(&row.value)
            .int(row.old_lease);
    }
    stmt
}

/// The statements of a [`ValuesAt`] for dialects that list the wanted rows in the statement:
/// chunks of at most `chunk` rows, `text(first, count)` giving the SQL for rows `first..` of
/// the whole slice, each row taking its key and revision as two placeholders, in order.
pub fn values_chunks<'a>(
    rows: &[(&'a [u8], i64)],
    chunk: usize,
    text: impl Fn(usize, usize) -> String,
) -> Vec<Stmt<'a>> {
    let mut statements = Vec::new();
    for (chunk_no, rows) in rows.chunks(chunk).enumerate() {
        let mut stmt = Stmt::new(text(chunk_no * chunk, rows.len()));
        for (key, revision) in rows {
            stmt = stmt.bytes(key).int(*revision);
        }
        statements.push(stmt);
    }
    statements
}

/// Appends `count` copies of `tuple`, comma-separated: the rows of a multi-row statement.
pub fn push_tuples(sql: &mut String, count: usize, tuple: &str) {
    for i in 0..count {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(tuple);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_order() {
        assert_eq!(
            number_placeholders("UPDATE t SET a = ? WHERE b = ? AND c < ?"),
            "UPDATE t SET a = $1 WHERE b = $2 AND c < $3"
        );
        assert_eq!(number_placeholders("SELECT 1"), "SELECT 1");
    }
}
