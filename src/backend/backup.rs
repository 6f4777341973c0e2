//! Backups: etcdsql's whole logical content — the revision log, leases, the meta counters and
//! the auth store — as a SQLite database with etcdsql's own SQLite schema. A backup of either
//! backend therefore restores into either backend, and a backup is itself a data store that
//! `sqlite://` can open.
//!
//! # Invariants
//! - A backup is one consistent state: SQLite copies itself with `VACUUM INTO` (one read
//!   snapshot); PostgreSQL and MySQL are read in one repeatable-read transaction.
//! - A restore writes into an empty store only (no log rows, no leases, no users or roles), in
//!   one transaction: it either fully happens or not at all. Raised alarms are not restored.

use std::path::Path;
use std::str::FromStr;

use std::borrow::Cow;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, MySql, Postgres, QueryBuilder, Sqlite};

use super::core::number_placeholders;
use super::{Copied, Error, Result};

/// Rows per multi-row INSERT (13 parameters each: under SQLite's oldest limit of 999).
const CHUNK: usize = 64;
/// Log rows read per query.
const READ_CHUNK: i64 = 4096;

#[derive(sqlx::FromRow)]
struct LogRecord {
    revision: i64,
    sub: i64,
    name: Vec<u8>,
    created: bool,
    deleted: bool,
    create_revision: i64,
    prev_revision: i64,
    version: i64,
    lease: i64,
    value: Vec<u8>,
    old_value: Option<Vec<u8>>,
    old_lease: i64,
    superseded_by: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct LeaseRecord {
    id: i64,
    ttl: i64,
    expires_at: i64,
}

#[derive(sqlx::FromRow)]
struct NamedValue {
    name: String,
    value: i64,
}

#[derive(sqlx::FromRow)]
struct NamedRecord {
    name: String,
    record: Vec<u8>,
}

/// The log as MySQL keeps it, replacements in the rows.
const SELECT_LOG: &str = "SELECT revision, sub, name, created, deleted, create_revision, \
     prev_revision, version, lease, value, old_value, old_lease, superseded_by FROM kv_log \
     WHERE (revision, sub) > (?, ?) ORDER BY revision, sub LIMIT ?";
/// The log as SQLite keeps it, each row with the revision that replaced it from
/// `temp.successor` ([`INDEX_SUCCESSORS`]).
const SELECT_LOG_SQLITE: &str = "SELECT k.revision, k.sub, k.name, k.created, k.deleted, \
     k.create_revision, k.prev_revision, k.version, k.lease, k.value, k.old_value, k.old_lease, \
     s.superseded_by FROM kv_log AS k \
     LEFT JOIN temp.successor AS s ON s.revision = k.revision AND s.name = k.name \
     WHERE (k.revision, k.sub) > (?, ?) ORDER BY k.revision, k.sub LIMIT ?";
/// The log as PostgreSQL keeps it, each row with the revision that replaced it: the key's next
/// row, found by the (name, revision) index. `kv_replaced` says the same, but is keyed by the
/// replacing revision, and a temporary table as SQLite's source uses cannot be created in the
/// read-only snapshot.
const SELECT_LOG_POSTGRES: &str = "SELECT k.revision, k.sub, k.name, k.created, k.deleted, \
     k.create_revision, k.prev_revision, k.version, k.lease, k.value, k.old_value, k.old_lease, \
     (SELECT s.revision FROM kv_log AS s WHERE s.name = k.name AND s.revision > k.revision \
      ORDER BY s.revision LIMIT 1) AS superseded_by FROM kv_log AS k \
     WHERE (k.revision, k.sub) > (?, ?) ORDER BY k.revision, k.sub LIMIT ?";
/// SQLite keeps the log alone: each row names the row it replaced (`prev_revision`). Those
/// names turned around, in the log's order, let each chunk of the log find its rows'
/// successors by key. A temporary table: the source file is left as it is.
const INDEX_SUCCESSORS: [&str; 2] = [
    "CREATE TEMP TABLE successor (revision INTEGER NOT NULL, name BLOB NOT NULL, \
     superseded_by INTEGER NOT NULL, PRIMARY KEY (revision, name)) WITHOUT ROWID",
    "INSERT INTO temp.successor (revision, name, superseded_by) \
     SELECT prev_revision, name, revision FROM kv_log WHERE prev_revision > 0",
];
const INSERT_LOG: &str = "INSERT INTO kv_log (revision, sub, name, created, deleted, \
     create_revision, prev_revision, version, lease, value, old_value, old_lease, superseded_by) ";
const INSERT_LOG_WITHOUT_SUPERSEDED: &str = "INSERT INTO kv_log (revision, sub, name, created, deleted, \
     create_revision, prev_revision, version, lease, value, old_value, old_lease) ";
const INSERT_HEADS: &str = "INSERT INTO kv_head (name, revision, deleted) ";
const INSERT_REPLACED: &str = "INSERT INTO kv_replaced (superseded_by, name, revision, deleted) ";
const SELECT_LEASES: &str = "SELECT id, ttl, expires_at FROM leases ORDER BY id";
const INSERT_LEASES: &str = "INSERT INTO leases (id, ttl, expires_at) ";
/// Alarms describe the old store's disk, not the data: they stay behind.
const SELECT_META: &str =
    "SELECT name, value FROM meta WHERE name NOT LIKE 'alarm:%' ORDER BY name";
const UPSERT_META: &str = "INSERT INTO meta (name, value) VALUES (?, ?) \
     ON CONFLICT (name) DO UPDATE SET value = excluded.value";
const UPSERT_META_MYSQL: &str =
    "INSERT INTO meta (name, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value)";
/// The auth tables: (read, write).
const AUTH_TABLES: [(&str, &str); 2] = [
    (
        "SELECT name, record FROM auth_users ORDER BY name",
        "INSERT INTO auth_users (name, record) VALUES (?, ?)",
    ),
    (
        "SELECT name, record FROM auth_roles ORDER BY name",
        "INSERT INTO auth_roles (name, record) VALUES (?, ?)",
    ),
];
/// What makes a store not empty.
const CONTENT: &str = "SELECT (SELECT COUNT(*) FROM kv_log) + (SELECT COUNT(*) FROM leases) \
     + (SELECT COUNT(*) FROM auth_users) + (SELECT COUNT(*) FROM auth_roles)";

/// Opens (creating) the SQLite database at `path` with etcdsql's schema, migrated, as a pool of
/// one connection (the migrator takes a pool where it could not take a connection inside the
/// backends' `Send` futures).
pub(super) async fn open_file(path: &Path) -> Result<SqlitePool> {
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    super::sqlite::MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Fails with `NotEmpty` unless the store on `$conn` holds nothing yet.
macro_rules! ensure_empty {
    ($conn:expr) => {{
        let (rows,): (i64,) = sqlx::query_as(CONTENT).fetch_one(&mut *$conn).await?;
        if rows != 0 {
            return Err(Error::NotEmpty);
        }
    }};
}

/// The statements here as PostgreSQL numbers its placeholders.
fn numbered(sql: &'static str) -> AssertSqlSafe<Cow<'static, str>> {
    AssertSqlSafe(Cow::Owned(number_placeholders(sql)))
}

/// The statements here as SQLite and MySQL take them.
fn anonymous(sql: &'static str) -> AssertSqlSafe<Cow<'static, str>> {
    AssertSqlSafe(Cow::Borrowed(sql))
}

/// How the target records which row replaced which ([`crate::backend::core::Bookkeeping`]):
/// `in_row` (`superseded_by`, MySQL), `tables` (`kv_head` and `kv_replaced`, PostgreSQL) or
/// `log_only` (the rows' `prev_revision` alone, SQLite): the log's INSERT, and what follows
/// each chunk of it.
macro_rules! insert_log {
    (in_row) => {
        INSERT_LOG
    };
    ($layout:tt) => {
        INSERT_LOG_WITHOUT_SUPERSEDED
    };
}

macro_rules! superseded_column {
    (in_row, $row:expr, $r:expr) => {
        $row.push_bind($r.superseded_by);
    };
    ($layout:tt, $row:expr, $r:expr) => {};
}

macro_rules! bookkeeping {
    (tables, $db:ty, $chunk:expr, $to:expr) => {
        table_bookkeeping!($db, $chunk, $to)
    };
    ($layout:tt, $db:ty, $chunk:expr, $to:expr) => {};
}

/// One typed copy loop per direction: `$from_sql` and `$to_sql` spell the statements for the
/// source and the target, `$select_log` reads the source's log, `$layout` is the target's
/// (see [`insert_log`]), and `$upsert` is the target's upsert of a meta row.
macro_rules! copy_all {
    (
        $from:expr, $from_sql:expr, $select_log:expr,
        $to:expr, $to_db:ty, $to_sql:expr, $layout:tt, $upsert:expr, $copied:expr
    ) => {{
        let (from, to) = ($from, $to);
        let mut after = (0_i64, -1_i64);
        let mut copied_rows = 0_u64;
        loop {
            let rows: Vec<LogRecord> = sqlx::query_as($from_sql($select_log))
                .bind(after.0)
                .bind(after.1)
                .bind(READ_CHUNK)
                .fetch_all(&mut *from)
                .await?;
            let Some(last) = rows.last() else { break };
            after = (last.revision, last.sub);
            for chunk in rows.chunks(CHUNK) {
                let mut insert = QueryBuilder::<$to_db>::new(insert_log!($layout));
                insert.push_values(chunk, |mut row, r| {
                    row.push_bind(r.revision)
                        .push_bind(r.sub)
                        .push_bind(&r.name)
                        .push_bind(r.created)
                        .push_bind(r.deleted)
                        .push_bind(r.create_revision)
                        .push_bind(r.prev_revision)
                        .push_bind(r.version)
                        .push_bind(r.lease)
                        .push_bind(&r.value)
                        .push_bind(&r.old_value)
                        .push_bind(r.old_lease);
                    superseded_column!($layout, row, r);
                });
                insert.build().execute(&mut *to).await?;
                bookkeeping!($layout, $to_db, chunk, &mut *to);
            }
            copied_rows += rows.len() as u64;
            $copied(copied_rows);
        }
        let leases: Vec<LeaseRecord> = sqlx::query_as(SELECT_LEASES).fetch_all(&mut *from).await?;
        for chunk in leases.chunks(CHUNK) {
            let mut insert = QueryBuilder::<$to_db>::new(INSERT_LEASES);
            insert.push_values(chunk, |mut row, l| {
                row.push_bind(l.id).push_bind(l.ttl).push_bind(l.expires_at);
            });
            insert.build().execute(&mut *to).await?;
        }
        let meta: Vec<NamedValue> = sqlx::query_as(SELECT_META).fetch_all(&mut *from).await?;
        for m in &meta {
            sqlx::query($to_sql($upsert))
                .bind(&m.name)
                .bind(m.value)
                .execute(&mut *to)
                .await?;
        }
        for (read, write) in AUTH_TABLES {
            let records: Vec<NamedRecord> = sqlx::query_as(read).fetch_all(&mut *from).await?;
            for r in &records {
                sqlx::query($to_sql(write))
                    .bind(&r.name)
                    .bind(&r.record)
                    .execute(&mut *to)
                    .await?;
            }
        }
    }};
}

/// Writes the bookkeeping tables of the database `$db` on `$to` for `$chunk`, rows of a log
/// that says in each row what replaced it: the rows nothing replaced go to `kv_head`, the
/// others to `kv_replaced`.
macro_rules! table_bookkeeping {
    ($db:ty, $chunk:expr, $to:expr) => {{
        let (heads, replaced): (Vec<&LogRecord>, Vec<&LogRecord>) =
            $chunk.iter().partition(|r| r.superseded_by.is_none());
        if !heads.is_empty() {
            let mut insert = QueryBuilder::<$db>::new(INSERT_HEADS);
            insert.push_values(heads, |mut row, r| {
                row.push_bind(&r.name)
                    .push_bind(r.revision)
                    .push_bind(r.deleted);
            });
            insert.build().execute(&mut *$to).await?;
        }
        if !replaced.is_empty() {
            let mut insert = QueryBuilder::<$db>::new(INSERT_REPLACED);
            insert.push_values(replaced, |mut row, r| {
                row.push_bind(r.superseded_by)
                    .push_bind(&r.name)
                    .push_bind(r.revision)
                    .push_bind(r.deleted);
            });
            insert.build().execute(&mut *$to).await?;
        }
    }};
}

/// Copies the store read through `$snapshot` (statements spelled by `$spell`, its log read by
/// `$select_log`) into a new SQLite file at `$dest`.
macro_rules! store_to_file {
    ($snapshot:expr, $spell:expr, $select_log:expr, $dest:expr) => {{
        let pool = open_file($dest).await?;
        let mut file = pool.acquire().await?;
        sqlx::query("BEGIN").execute(&mut *file).await?;
        copy_all!(
            $snapshot,
            $spell,
            $select_log,
            &mut *file,
            Sqlite,
            anonymous,
            log_only,
            UPSERT_META,
            |_| {}
        );
        sqlx::query("COMMIT").execute(&mut *file).await?;
        drop(file);
        pool.close().await;
        Ok(())
    }};
}

/// Copies the backup at `$source` into the empty store on `$target` (a transaction of database
/// `$db`, statements spelled by `$spell`, meta rows written by `$upsert`).
macro_rules! file_to_store {
    (
        $source:expr, $target:expr, $db:ty, $spell:expr, $layout:tt, $upsert:expr,
        $copied:expr
    ) => {{
        ensure_empty!($target);
        let pool = open_file($source).await?;
        let mut file = pool.acquire().await?;
        for sql in INDEX_SUCCESSORS {
            sqlx::query(sql).execute(&mut *file).await?;
        }
        copy_all!(
            &mut *file,
            anonymous,
            SELECT_LOG_SQLITE,
            &mut *$target,
            $db,
            $spell,
            $layout,
            $upsert,
            $copied
        );
        drop(file);
        pool.close().await;
        Ok(())
    }};
}

/// Copies a PostgreSQL store, read in `snapshot` (a repeatable-read transaction), into a new
/// SQLite file at `dest`.
pub(super) async fn postgres_to_file(snapshot: &mut sqlx::PgConnection, dest: &Path) -> Result<()> {
    store_to_file!(&mut *snapshot, numbered, SELECT_LOG_POSTGRES, dest)
}

/// Copies a MySQL store, read in `snapshot` (a consistent-snapshot transaction), into a new
/// SQLite file at `dest`.
pub(super) async fn mysql_to_file(snapshot: &mut sqlx::MySqlConnection, dest: &Path) -> Result<()> {
    store_to_file!(&mut *snapshot, anonymous, SELECT_LOG, dest)
}

/// Copies the backup at `source` into the PostgreSQL store `target` (a transaction), which
/// must be empty.
pub(super) async fn file_to_postgres(
    source: &Path,
    target: &mut sqlx::PgConnection,
    copied: Copied<'_>,
) -> Result<()> {
    file_to_store!(
        source,
        target,
        Postgres,
        numbered,
        tables,
        UPSERT_META,
        copied
    )
}

/// Copies the backup at `source` into the SQLite store on `target` (a transaction), which must
/// be empty.
pub(super) async fn file_to_sqlite(
    source: &Path,
    target: &mut SqliteConnection,
    copied: Copied<'_>,
) -> Result<()> {
    file_to_store!(
        source,
        target,
        Sqlite,
        anonymous,
        log_only,
        UPSERT_META,
        copied
    )
}

/// Copies the backup at `source` into the MySQL store `target` (a transaction), which must be
/// empty.
pub(super) async fn file_to_mysql(
    source: &Path,
    target: &mut sqlx::MySqlConnection,
    copied: Copied<'_>,
) -> Result<()> {
    file_to_store!(
        source,
        target,
        MySql,
        anonymous,
        in_row,
        UPSERT_META_MYSQL,
        copied
    )
}
