//! The SQLite backend: one database file in WAL mode.
//!
//! Writers share exactly one connection, behind a mutex, so "one write transaction at a time"
//! holds inside this process without relying on SQLite's busy handler; readers use their own
//! read-only connections and, thanks to WAL, never block the writer or wait for it.
//!
//! Durability: the writer's connection runs with `synchronous=NORMAL`, so its COMMIT appends the
//! transaction to the WAL without waiting for the disk, and [`Backend::sync`] then fsyncs the WAL
//! file, which makes every commit before it survive power loss. The MVCC layer acknowledges a
//! batch only after such a sync, and meanwhile runs the next batch: the disk's latency overlaps
//! the next batch's work instead of adding to it. (With `synchronous=FULL` the fsync would happen
//! inside COMMIT, with the writer connection idle.) A crash before the sync loses only
//! unacknowledged commits, and SQLite's WAL recovery drops a torn tail by its checksums.
//! Checkpoints keep their own order safe: they fsync the WAL before copying from it and the
//! database file after.
//!
//! Checkpoints (copying the WAL back into the database file, and fsyncing it) run on their own
//! connection in the background, never inside a commit: SQLite's automatic checkpoint would make
//! whichever write crossed the threshold wait for a whole checkpoint, the slowest step on a large
//! database. A passive checkpoint never blocks the writer or readers; the WAL is reused from its
//! start once a checkpoint has caught up.
//!
//! One etcdsql process owns the file: a second process writing the same file would be serialised
//! by SQLite but its commits would not wake this process's watchers. Use PostgreSQL for several.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::SqliteArguments;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Arguments, Connection, Row};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

use super::{
    AuthRecords, AuthVersion, Backend, DbSize, Error, LeaseRow, LogRow, RangeEnd, ReadTxn, Result,
    Revisions, Scan, WriteTxn, decode_row,
};

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Rows per multi-row INSERT: 11 parameters each stays under SQLite's oldest limit of 999
/// parameters per statement.
const INSERT_CHUNK: usize = 64;
/// `(key, revision)` pairs per `values_at` statement (two parameters each).
const VALUES_CHUNK: usize = 256;

/// Columns of [`LogRow`] in the order `decode_row` reads them (a macro so that queries stay
/// string literals).
macro_rules! row_columns {
    () => {
        "revision, sub, name, created, deleted, create_revision, prev_revision, version, lease, \
         value, old_value, old_lease"
    };
}

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

/// What a scan returns of a row: [`row_columns!`] with `$value` for the value (`k.value`, or an
/// empty blob for keys-only scans) and no old value, so large blobs stay on disk when unneeded.
macro_rules! scan_columns {
    ($value:literal) => {
        concat!(
            "k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, \
             k.prev_revision, k.version, k.lease, ",
            $value,
            " AS value, NULL, k.old_lease"
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

/// The statement behind [`ReadTxn::scan`], public so that `benches/scale` can show its plan.
/// Parameters: `?1` start key, `?2` end key (ignored unless the end is a key), `?3` revision,
/// `?4` limit (-1 for none).
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

/// The statement behind [`ReadTxn::count`]; parameters as for [`scan_query`], without a limit.
pub fn count_query(end: &RangeEnd) -> &'static str {
    match end {
        RangeEnd::Single => concat!("SELECT COUNT(*) FROM (", single_key!("1", ""), ")"),
        RangeEnd::Unbounded => count_sql!("k.name >= ?1"),
        RangeEnd::Before(_) => count_sql!("k.name >= ?1 AND k.name < ?2"),
    }
}

pub struct SqliteBackend {
    /// The single writer's connection (write batches and compaction chunks take turns on it).
    /// Held outside a pool because a pool hands it back through a spawned task that pings it,
    /// a round trip to sqlx's worker thread: about a millisecond per batch under load, with
    /// the writer idle meanwhile. `None` once closed.
    writer: Arc<Mutex<Option<WriterConn>>>,
    readers: Arc<Readers>,
    /// The background checkpoints' own connection, and their task (stopped on close).
    checkpointer: SqlitePool,
    checkpoints: tokio::task::JoinHandle<()>,
    /// The WAL file, for [`Backend::sync`]: fsync makes the file durable whichever descriptor
    /// wrote it. SQLite keeps the file (never deleting or replacing it) while connections are
    /// open, and this backend keeps its connections open until it closes.
    wal: Arc<std::fs::File>,
}

/// How often the background task checkpoints the WAL.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// Checkpoints the WAL every [`CHECKPOINT_INTERVAL`] until aborted.
async fn run_checkpoints(pool: SqlitePool) {
    loop {
        tokio::time::sleep(CHECKPOINT_INTERVAL).await;
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&pool)
            .await
        {
            tracing::warn!(error = %e, "WAL checkpoint failed; retrying");
        }
    }
}

struct WriterConn {
    conn: SqliteConnection,
    /// A write transaction was opened and not committed (dropped, or its COMMIT failed): it
    /// must be rolled back before the next one begins.
    open: bool,
}

/// The read-only connections, kept here rather than in an sqlx pool for the reason the writer's
/// is: a pool pings a connection when it hands it out and again when it takes it back, two round
/// trips to the connection's worker thread that cost more than a point read itself.
struct Readers {
    idle: std::sync::Mutex<Vec<ReaderConn>>,
    /// One permit per connection that may exist; closed when the backend closes.
    permits: Arc<Semaphore>,
    options: SqliteConnectOptions,
}

struct ReaderConn {
    conn: SqliteConnection,
    /// A read transaction was begun on it and not yet rolled back.
    open: bool,
}

/// A reader connection on loan; it goes back to the idle list when dropped, after its read
/// transaction (if any) is rolled back: an idle connection must not pin an old snapshot, which
/// would keep checkpoints from recycling the WAL.
struct ReaderLoan {
    conn: Option<ReaderConn>,
    readers: Arc<Readers>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Readers {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<ReaderConn>> {
        // The list is only pushed to and popped from: a panic elsewhere cannot leave it torn.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An idle connection, or a new one while fewer than the limit exist.
    async fn loan(self: &Arc<Self>) -> Result<ReaderLoan> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self.idle().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => ReaderConn {
                conn: SqliteConnection::connect_with(&self.options).await?,
                open: false,
            },
        };
        Ok(ReaderLoan {
            conn: Some(conn),
            readers: self.clone(),
            permit: Some(permit),
        })
    }

    async fn close(&self) {
        self.permits.close();
        let idle = std::mem::take(&mut *self.idle());
        for reader in idle {
            let _ = reader.conn.close().await;
        }
    }
}

impl ReaderLoan {
    fn conn(&mut self) -> &mut ReaderConn {
        self.conn
            .as_mut()
            .expect("a loan holds its connection until dropped")
    }
}

impl Drop for ReaderLoan {
    fn drop(&mut self) {
        let (Some(mut reader), Some(permit)) = (self.conn.take(), self.permit.take()) else {
            return;
        };
        if self.readers.permits.is_closed() {
            return;
        }
        if !reader.open {
            self.readers.idle().push(reader);
            return;
        }
        // The rollback is a round trip to the connection's worker thread: off the reader's path.
        // Without a runtime (shutting down) the connection is just closed.
        let readers = self.readers.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if sqlx::query("ROLLBACK")
                    .execute(&mut reader.conn)
                    .await
                    .is_ok()
                {
                    reader.open = false;
                    readers.idle().push(reader);
                }
                drop(permit);
            });
        }
    }
}

impl SqliteBackend {
    /// Opens (creating if needed) the database file at `path` and migrates it.
    ///
    /// # Errors
    /// The folder cannot be created, the file cannot be opened, or a migration fails.
    pub async fn open(path: &str) -> Result<Self> {
        if let Some(dir) = Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        let base = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .pragma("cache_size", "-32768")
            .pragma("temp_store", "memory");
        let mut writer = SqliteConnection::connect_with(
            &base
                .clone()
                .synchronous(SqliteSynchronous::Normal)
                .pragma("wal_autocheckpoint", "0"),
        )
        .await?;
        MIGRATOR.run(&mut writer).await?;
        let cluster_id = rand::random::<u64>() >> 1 | 1;
        sqlx::query("INSERT OR IGNORE INTO meta (name, value) VALUES ('cluster_id', ?)")
            .bind(cluster_id as i64)
            .execute(&mut writer)
            .await?;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let readers = Arc::new(Readers {
            idle: std::sync::Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new((cores * 2).max(4))),
            options: base.clone().read_only(true),
        });
        let checkpointer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(base.pragma("wal_autocheckpoint", "0"))
            .await?;
        // SQLite created the WAL file when the writer switched the database to WAL mode; it
        // names the database file as it resolved it.
        let file: String =
            sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                .fetch_one(&mut writer)
                .await?;
        let wal_path = format!("{file}-wal");
        let wal = std::fs::File::open(&wal_path).map_err(|source| Error::OpenWal {
            path: wal_path,
            source,
        })?;
        let checkpoints = tokio::spawn(run_checkpoints(checkpointer.clone()));
        Ok(Self {
            writer: Arc::new(Mutex::new(Some(WriterConn {
                conn: writer,
                open: false,
            }))),
            readers,
            checkpointer,
            checkpoints,
            wal: Arc::new(wal),
        })
    }

    /// The writer's connection, any transaction it left open rolled back. Holding it keeps
    /// every other write waiting.
    async fn idle_writer(&self) -> Result<OwnedMappedMutexGuard<Option<WriterConn>, WriterConn>> {
        let writer = self.writer.clone().lock_owned().await;
        let Ok(mut conn) = OwnedMutexGuard::try_map(writer, Option::as_mut) else {
            return Err(sqlx::Error::PoolClosed.into());
        };
        if conn.open {
            // Fails only if SQLite already ended that transaction itself; if the connection is
            // broken, the next statement says so.
            let _ = sqlx::query("ROLLBACK").execute(&mut conn.conn).await;
            conn.open = false;
        }
        Ok(conn)
    }

    /// Waits for the writer connection and opens a write transaction on it.
    async fn begin_write(&self) -> Result<SqliteTxn> {
        let mut conn = self.idle_writer().await?;
        // IMMEDIATE takes SQLite's write lock at the start rather than at the first write, so
        // the current revision read at the start cannot be overtaken by another writer. It is
        // sent with the first statement; `open` from now on, as that may fail halfway.
        let mut pending = Pending::default();
        pending.push("BEGIN IMMEDIATE");
        conn.open = true;
        Ok(SqliteTxn {
            conn: Conn::Write(conn),
            pending,
        })
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn read(&self) -> Result<Box<dyn ReadTxn>> {
        let mut loan = self.readers.loan().await?;
        let reader = loan.conn();
        // Marked open first: if this future is dropped during BEGIN, the rollback still runs.
        reader.open = true;
        sqlx::query("BEGIN").execute(&mut reader.conn).await?;
        Ok(Box::new(SqliteTxn::read(loan)))
    }

    /// Every statement runs on its own (autocommit), seeing the newest commit when it starts.
    async fn read_unpinned(&self) -> Result<Box<dyn ReadTxn>> {
        Ok(Box::new(SqliteTxn::read(self.readers.loan().await?)))
    }

    fn sole_writer(&self) -> bool {
        true
    }

    async fn sync(&self) -> Result<()> {
        let wal = self.wal.clone();
        tokio::task::spawn_blocking(move || wal.sync_data())
            .await
            .map_err(|e| Error::Sync(std::io::Error::other(e)))?
            .map_err(Error::Sync)
    }

    async fn write(&self) -> Result<Box<dyn WriteTxn>> {
        Ok(Box::new(self.begin_write().await?))
    }

    async fn cluster_id(&self) -> Result<u64> {
        let mut loan = self.readers.loan().await?;
        let id: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE name = 'cluster_id'")
            .fetch_one(&mut loan.conn().conn)
            .await?;
        Ok(id as u64)
    }

    async fn size(&self) -> Result<DbSize> {
        let mut loan = self.readers.loan().await?;
        let conn = &mut loan.conn().conn;
        let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&mut *conn)
            .await?;
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&mut *conn)
            .await?;
        let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
            .fetch_one(&mut *conn)
            .await?;
        Ok(DbSize {
            total: pages * page_size,
            in_use: (pages - free) * page_size,
        })
    }

    async fn compact_window(&self, compact: i64, after: i64, through: i64) -> Result<u64> {
        debug_assert!(through <= compact);
        let mut tx = self.begin_write().await?;
        tx.send_pending().await?;
        // Rows replaced by a change in [after, through): no read at or above the compact
        // revision can see them, since their successor is below it. A row replaced at the
        // compact revision itself stays until the next compaction: a watch from the compact
        // revision reports that change, with this row as its prev_kv (rows carry no old value).
        let superseded =
            sqlx::query("DELETE FROM kv_log WHERE superseded_by >= ?1 AND superseded_by < ?2")
                .bind(after)
                .bind(through)
                .execute(tx.conn())
                .await?
                .rows_affected();
        // Tombstones below the compact revision: a key that is absent needs no row to say so.
        // The windows [after, through) tile [previous compact, compact) exactly; a tombstone at
        // the compact revision itself stays, as a watch from that revision must report it.
        let tombstones = sqlx::query(
            "DELETE FROM kv_log WHERE deleted = 1 AND revision >= ?1 AND revision < ?2",
        )
        .bind(after)
        .bind(through)
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.pending
            .push("UPDATE meta SET value = MAX(value, ?) WHERE name = 'compacted_through'");
        tx.pending.bind(through);
        tx.commit_write().await?;
        Ok(superseded + tombstones)
    }

    async fn compacted_through(&self) -> Result<i64> {
        let mut loan = self.readers.loan().await?;
        Ok(
            sqlx::query_scalar("SELECT value FROM meta WHERE name = 'compacted_through'")
                .fetch_one(&mut loan.conn().conn)
                .await?,
        )
    }

    async fn defragment(&self) -> Result<()> {
        // On the writer's connection, holding its lock: writes wait for the lock rather than
        // for SQLite's busy timeout, which a large file's rebuild could outlast. Readers go on
        // from the WAL meanwhile.
        let mut conn = self.idle_writer().await?;
        sqlx::query("VACUUM").execute(&mut conn.conn).await?;
        // The rebuilt file went through the WAL: copy it back and empty the WAL now rather
        // than leave a WAL the size of the database behind.
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn.conn)
            .await?;
        Ok(())
    }

    async fn alarms(&self) -> Result<Vec<i32>> {
        let mut loan = self.readers.loan().await?;
        let names: Vec<String> = sqlx::query_scalar(super::ALARMS_RAISED)
            .fetch_all(&mut loan.conn().conn)
            .await?;
        Ok(super::alarm_numbers(&names))
    }

    async fn set_alarm(&self, alarm: i32, raise: bool) -> Result<bool> {
        let mut conn = self.idle_writer().await?;
        let done = sqlx::query(super::set_alarm_statement(raise))
            .bind(super::alarm_name(alarm))
            .execute(&mut conn.conn)
            .await?;
        drop(conn);
        self.sync().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn backup(&self, dest: &Path) -> Result<()> {
        // One read snapshot, written as a compact new database; writes go on meanwhile.
        let mut loan = self.readers.loan().await?;
        sqlx::query("VACUUM INTO $1")
            .bind(dest.display().to_string())
            .execute(&mut loan.conn().conn)
            .await?;
        Ok(())
    }

    async fn restore(&self, source: &Path) -> Result<()> {
        let mut conn = self.idle_writer().await?;
        let mut tx = conn.conn.begin().await?;
        super::backup::file_to_sqlite(source, &mut tx).await?;
        tx.commit().await?;
        drop(conn);
        self.sync().await
    }

    async fn auth(&self) -> Result<AuthRecords> {
        let mut loan = self.readers.loan().await?;
        let mut tx = loan.conn().conn.begin().await?;
        let records = read_auth!(&mut *tx);
        tx.commit().await?;
        Ok(records)
    }

    async fn auth_version(&self) -> Result<AuthVersion> {
        let mut loan = self.readers.loan().await?;
        let rows = sqlx::query_as(super::AUTH_META)
            .fetch_all(&mut loan.conn().conn)
            .await?;
        Ok(AuthVersion::from_meta(rows))
    }

    async fn replace_auth(&self, expected: AuthVersion, next: &AuthRecords) -> Result<bool> {
        let mut conn = self.idle_writer().await?;
        let mut tx = conn.conn.begin().await?;
        let rows = sqlx::query_as(super::AUTH_META).fetch_all(&mut *tx).await?;
        if AuthVersion::from_meta(rows) != expected {
            return Ok(false);
        }
        write_auth!(&mut *tx, next);
        tx.commit().await?;
        drop(conn);
        self.sync().await?;
        Ok(true)
    }

    async fn close(&self) {
        self.checkpoints.abort();
        self.checkpointer.close().await;
        self.readers.close().await;
        // Waits for the batch at hand; a transaction left open is rolled back by closing.
        if let Some(writer) = self.writer.lock().await.take() {
            let _ = writer.conn.close().await;
        }
    }
}

/// A read transaction, or the write transaction: they share their queries.
///
/// The write transaction sends what it can in as few round trips as possible: each statement is
/// a trip to the connection's worker thread, and under load each trip waits for that thread to
/// be scheduled, which costs more than SQLite's own work. So its BEGIN and every statement whose
/// result is not needed (inserts, meta updates, savepoints) wait in `pending` and go with the
/// next statement that must answer, or with the COMMIT: a batch of creates is then one trip, a
/// batch of updates two. Statements in `pending` use only anonymous `?` parameters, so that a
/// statement after them may number its own from where theirs end.
struct SqliteTxn {
    conn: Conn,
    pending: Pending,
}

#[derive(Default)]
struct Pending {
    sql: String,
    args: SqliteArguments,
}

impl Pending {
    fn push(&mut self, sql: &str) {
        self.sql.push_str(sql);
        self.sql.push_str(";\n");
    }

    /// Adds a parameter: only values that always encode (integers, blobs, text) are bound here.
    fn bind<'q, T: sqlx::Encode<'q, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>>(&mut self, value: T) {
        self.args
            .add(value)
            .expect("integers, blobs and text always encode for SQLite");
    }
}

enum Conn {
    Read(ReaderLoan),
    Write(OwnedMappedMutexGuard<Option<WriterConn>, WriterConn>),
}

impl SqliteTxn {
    fn read(loan: ReaderLoan) -> Self {
        SqliteTxn {
            conn: Conn::Read(loan),
            pending: Pending::default(),
        }
    }

    fn conn(&mut self) -> &mut SqliteConnection {
        match &mut self.conn {
            Conn::Read(loan) => &mut loan.conn().conn,
            Conn::Write(writer) => &mut writer.conn,
        }
    }

    /// Sends the statements waiting in `pending`.
    async fn send_pending(&mut self) -> Result<()> {
        if self.pending.sql.is_empty() {
            return Ok(());
        }
        let Pending { sql, args } = std::mem::take(&mut self.pending);
        sqlx::query_with(sqlx::AssertSqlSafe(sql), args)
            .execute(self.conn())
            .await?;
        Ok(())
    }

    /// The connection, once every pending statement has run: for a statement whose answer
    /// depends on them.
    async fn ready(&mut self) -> Result<&mut SqliteConnection> {
        self.send_pending().await?;
        Ok(self.conn())
    }

    /// Commits the write transaction, with whatever is pending, in one trip; a read
    /// transaction just ends.
    async fn commit_write(mut self) -> Result<()> {
        if matches!(self.conn, Conn::Read(_)) {
            return Ok(());
        }
        self.pending.push("COMMIT");
        self.send_pending().await?;
        if let Conn::Write(writer) = &mut self.conn {
            writer.open = false;
        }
        Ok(())
    }

    fn set_meta(&mut self, name: &'static str, value: i64) {
        self.pending
            .push("UPDATE meta SET value = ? WHERE name = ?");
        self.pending.bind(value);
        self.pending.bind(name);
    }
}

fn end_key(end: &RangeEnd) -> &[u8] {
    match end {
        RangeEnd::Before(end) => end,
        RangeEnd::Single | RangeEnd::Unbounded => &[],
    }
}

#[async_trait]
impl ReadTxn for SqliteTxn {
    async fn revisions(&mut self) -> Result<Revisions> {
        let rows = sqlx::query_as(super::META_REVISIONS)
            .fetch_all(self.ready().await?)
            .await?;
        Ok(Revisions::from_meta(rows))
    }

    async fn scan(&mut self, scan: &Scan<'_>) -> Result<Vec<LogRow>> {
        let rows = sqlx::query(scan_query(scan.end, scan.keys_only))
            .bind(scan.key)
            .bind(end_key(scan.end))
            .bind(scan.revision)
            .bind(scan.limit.unwrap_or(-1))
            .fetch_all(self.ready().await?)
            .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn count(&mut self, key: &[u8], end: &RangeEnd, revision: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(count_query(end))
            .bind(key)
            .bind(end_key(end))
            .bind(revision)
            .fetch_one(self.ready().await?)
            .await?)
    }

    async fn latest(&mut self, key: &[u8]) -> Result<Option<LogRow>> {
        let sql = concat!(
            "SELECT ",
            row_columns!(),
            " FROM kv_log INDEXED BY kv_log_head WHERE name = ?1 AND superseded_by IS NULL"
        );
        let row = sqlx::query(sql)
            .bind(key)
            .fetch_optional(self.ready().await?)
            .await?;
        row.as_ref().map(decode_row).transpose()
    }

    async fn heads(&mut self) -> Result<Vec<LogRow>> {
        let rows = sqlx::query(
            "SELECT revision, sub, name, created, deleted, create_revision, prev_revision, \
             version, lease, x'', NULL, old_lease FROM kv_log INDEXED BY kv_log_head \
             WHERE superseded_by IS NULL",
        )
        .fetch_all(self.ready().await?)
        .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn values_at(&mut self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut values = vec![None; rows.len()];
        for (chunk_no, chunk) in rows.chunks(VALUES_CHUNK).enumerate() {
            // Goes with what is pending (the batch's BEGIN, typically): one trip for both.
            let mut pending = std::mem::take(&mut self.pending);
            let sql = &mut pending.sql;
            // CROSS JOIN keeps the wanted rows as the outer loop, so each is one lookup of a
            // revision in the primary key.
            sql.push_str("WITH w(i, n, r) AS (VALUES ");
            for i in 0..chunk.len() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!("({i}, ?, ?)"));
            }
            sql.push_str(
                ") SELECT w.i, k.value FROM w CROSS JOIN kv_log AS k \
                 ON k.name = w.n AND k.revision = w.r",
            );
            for (key, revision) in chunk {
                pending.bind(*key);
                pending.bind(*revision);
            }
            let query = sqlx::query_with(sqlx::AssertSqlSafe(pending.sql), pending.args);
            for row in query.fetch_all(self.conn()).await? {
                let i: i64 = row.try_get(0)?;
                let value: Vec<u8> = row.try_get(1)?;
                if let Some(slot) = usize::try_from(i)
                    .ok()
                    .and_then(|i| values.get_mut(chunk_no * VALUES_CHUNK + i))
                {
                    *slot = Some(value);
                }
            }
        }
        Ok(values)
    }

    async fn changes(&mut self, after: i64, through: i64) -> Result<Vec<LogRow>> {
        // The old value is the predecessor row's (rows written before migration 0004 carry
        // their own as well); compaction keeps it for every change at or above the compact
        // revision, the changes a watch can ask for.
        let sql = "SELECT k.revision, k.sub, k.name, k.created, k.deleted, k.create_revision, \
             k.prev_revision, k.version, k.lease, k.value, \
             CASE WHEN k.created = 0 THEN COALESCE(p.value, k.old_value) END, k.old_lease \
             FROM kv_log AS k LEFT JOIN kv_log AS p \
             ON k.created = 0 AND p.revision = k.prev_revision AND p.name = k.name \
             WHERE k.revision > ?1 AND k.revision <= ?2 ORDER BY k.revision, k.sub";
        let rows = sqlx::query(sql)
            .bind(after)
            .bind(through)
            .fetch_all(self.ready().await?)
            .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn lease(&mut self, id: i64) -> Result<Option<LeaseRow>> {
        let row: Option<(i64, i64, i64)> =
            sqlx::query_as("SELECT id, ttl, expires_at FROM leases WHERE id = ?1")
                .bind(id)
                .fetch_optional(self.ready().await?)
                .await?;
        Ok(row.map(lease_row))
    }

    async fn leases(&mut self) -> Result<Vec<LeaseRow>> {
        let rows: Vec<(i64, i64, i64)> =
            sqlx::query_as("SELECT id, ttl, expires_at FROM leases ORDER BY id")
                .fetch_all(self.ready().await?)
                .await?;
        Ok(rows.into_iter().map(lease_row).collect())
    }

    async fn lease_keys(&mut self, id: i64, revision: i64) -> Result<Vec<LogRow>> {
        // A lease holds few keys: its partial index finds every row that ever carried it, and
        // the visibility test keeps the one row per key that is live at the revision.
        // `k.lease != 0` lets SQLite use that index.
        let sql = concat!(
            "SELECT ",
            row_columns!(),
            " FROM kv_log AS k WHERE k.lease = ?1 AND k.lease != 0 AND k.revision <= ?2 \
              AND (k.superseded_by IS NULL OR k.superseded_by > ?2) AND k.deleted = 0 \
              ORDER BY k.name"
        );
        let rows = sqlx::query(sql)
            .bind(id)
            .bind(revision)
            .fetch_all(self.ready().await?)
            .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn expired_leases(&mut self, now: i64, limit: i64) -> Result<Vec<LeaseRow>> {
        let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT id, ttl, expires_at FROM leases WHERE expires_at <= ?1 \
             ORDER BY expires_at LIMIT ?2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(self.ready().await?)
        .await?;
        Ok(rows.into_iter().map(lease_row).collect())
    }

    async fn next_expiry(&mut self) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar("SELECT MIN(expires_at) FROM leases")
            .fetch_one(self.ready().await?)
            .await?)
    }
}

fn lease_row((id, ttl, expires_at): (i64, i64, i64)) -> LeaseRow {
    LeaseRow {
        id,
        ttl,
        expires_at,
    }
}

/// Appends `count` copies of `tuple`, comma-separated: the rows of a multi-row statement.
fn push_tuples(sql: &mut String, count: usize, tuple: &str) {
    for i in 0..count {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(tuple);
    }
}

#[async_trait]
impl WriteTxn for SqliteTxn {
    async fn insert_rows(&mut self, rows: &[LogRow]) -> Result<()> {
        // Each statement is a round trip to sqlx's SQLite worker thread, which costs more than
        // SQLite inserting the row: one multi-row INSERT per chunk, waiting in `pending` for the
        // next statement that answers, or the COMMIT.
        for chunk in rows.chunks(INSERT_CHUNK) {
            // No old_value: readers take it from the predecessor row (see `changes`).
            let mut sql = String::from(
                "INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
                 prev_revision, version, lease, value, old_lease) VALUES ",
            );
            push_tuples(&mut sql, chunk.len(), "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
            self.pending.push(&sql);
            for row in chunk {
                let pending = &mut self.pending;
                pending.bind(row.revision);
                pending.bind(row.sub);
                pending.bind(&row.key);
                pending.bind(row.created);
                pending.bind(row.deleted);
                pending.bind(row.create_revision);
                pending.bind(row.prev_revision);
                pending.bind(row.version);
                pending.bind(row.lease);
                pending.bind(&row.value);
                pending.bind(row.old_lease);
            }
            // Mark the rows these replaced (after the insert: a row's predecessor may be an
            // earlier row of the same chunk).
            let replacing: Vec<&LogRow> = chunk.iter().filter(|r| r.prev_revision > 0).collect();
            if replacing.is_empty() {
                continue;
            }
            let mut sql = String::from("UPDATE kv_log SET superseded_by = v.column1 FROM (VALUES ");
            push_tuples(&mut sql, replacing.len(), "(?, ?, ?)");
            // The unary `+` keeps SQLite from indexing the VALUES list and scanning the whole
            // log against it: the list is the outer loop, each row a primary-key lookup.
            sql.push_str(") AS v WHERE kv_log.name = +v.column2 AND kv_log.revision = +v.column3");
            self.pending.push(&sql);
            for row in replacing {
                self.pending.bind(row.revision);
                self.pending.bind(&row.key);
                self.pending.bind(row.prev_revision);
            }
        }
        Ok(())
    }

    async fn set_current_revision(&mut self, revision: i64) -> Result<()> {
        self.set_meta("current_revision", revision);
        Ok(())
    }

    async fn set_compact_revision(&mut self, revision: i64) -> Result<()> {
        self.set_meta("compact_revision", revision);
        Ok(())
    }

    async fn insert_lease(&mut self, lease: &LeaseRow) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO leases (id, ttl, expires_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(lease.id)
        .bind(lease.ttl)
        .bind(lease.expires_at)
        .execute(self.ready().await?)
        .await?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn set_lease_expiry(&mut self, id: i64, expires_at: i64) -> Result<bool> {
        let updated = sqlx::query("UPDATE leases SET expires_at = ?1 WHERE id = ?2")
            .bind(expires_at)
            .bind(id)
            .execute(self.ready().await?)
            .await?
            .rows_affected();
        Ok(updated == 1)
    }

    async fn delete_lease(&mut self, id: i64) -> Result<bool> {
        let deleted = sqlx::query("DELETE FROM leases WHERE id = ?1")
            .bind(id)
            .execute(self.ready().await?)
            .await?
            .rows_affected();
        Ok(deleted == 1)
    }

    async fn savepoint(&mut self) -> Result<()> {
        self.pending.push("SAVEPOINT request");
        Ok(())
    }

    async fn release_savepoint(&mut self) -> Result<()> {
        self.pending.push("RELEASE request");
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        // ROLLBACK TO keeps the savepoint open; release it so the next request starts clean.
        self.pending.push("ROLLBACK TO request");
        self.pending.push("RELEASE request");
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.commit_write().await
    }
}
