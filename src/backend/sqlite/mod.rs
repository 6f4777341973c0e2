//! The SQLite backend: one database file in WAL mode.
//!
//! Writers share exactly one connection, behind a mutex, so "one write transaction at a time"
//! holds inside this process without relying on SQLite's busy handler; readers use their own
//! read-only connections and, thanks to WAL, never block the writer or wait for it.
//!
//! Durability: the writer's connection runs with `synchronous=NORMAL`, so its COMMIT appends the
//! transaction to the WAL without waiting for the disk, and [`crate::backend::Backend::sync`] then fsyncs the WAL
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
//! Under a steady write load a background checkpoint never catches up: by the time it has
//! copied the frames it saw, the writer has appended more, and SQLite starts the WAL over only
//! when a write begins with every frame copied. The WAL then grew for as long as the load
//! lasted (390 MB in 200,000 writes), and every growing write paid for new file blocks, which
//! the file system zeroes and journals. So once the WAL passes a bound
//! ([`DEFAULT_WAL_RESTART_BYTES`] unless configured), the writer itself checkpoints between two
//! batches: with no write in between, it copies the few frames the last background pass left
//! and the next batch starts the WAL over, in the file's existing blocks. That checkpoint holds
//! writes up for one fsync of the database file, which under a heavy write load took up to
//! 80 ms (`benches/scale`, compacting 4,000,000 rows while updating): with a 32 MiB bound the
//! WAL restarted every few seconds there and the slowest `begin_write` took up to 102 ms,
//! against up to 26 ms with the default bound, which makes restarts rare. Since SQLite fsyncs
//! the database file only after a checkpoint that copied the whole WAL, which no background
//! pass does while writes go on, that one fsync also carried every page copied since the last
//! restart; so before asking for a restart the background task fsyncs the file itself and runs
//! passes back to back until little is left ([`catch_up`]). The writer's checkpoint then
//! copies and fsyncs a few hundred pages.
//!
//! One etcdsql process owns the file: a second process writing the same file would be serialised
//! by SQLite but its commits would not wake this process's watchers. Use PostgreSQL for several.

mod raw;
mod sql;
mod vfs;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

pub use sql::{count_query, scan_query};
pub use vfs::wal_writes;

use super::core::{Arg, Connector, Session, Sql, Stmt, bind_scalar, bound};
use super::{Copied, DbSize, Error, LogRow, Result};

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

pub struct Sqlite {
    /// The single writer's connection (write batches and compaction chunks take turns on it).
    /// Held outside a pool because a pool hands it back through a spawned task that pings it,
    /// a round trip to sqlx's worker thread: about a millisecond per batch under load, with
    /// the writer idle meanwhile. `None` once closed.
    writer: Arc<Mutex<Option<WriterConn>>>,
    readers: Arc<Readers>,
    /// The background checkpoints' own connection, and their task (stopped on close).
    checkpointer: SqlitePool,
    checkpoints: tokio::task::JoinHandle<()>,
    /// The WAL file, for [`crate::backend::Backend::sync`]: fsync makes the file durable whichever descriptor
    /// wrote it. SQLite keeps the file (never deleting or replacing it) while connections are
    /// open, and this backend keeps its connections open until it closes.
    wal: Arc<std::fs::File>,
    /// Set by the background checkpoints when the WAL has grown past its bound;
    /// the next write batch checkpoints first.
    wal_restart_due: Arc<AtomicBool>,
}

/// The page size of a database this backend creates. SQLite writes whole pages: a commit appends
/// each page it changed to the WAL, and a checkpoint copies it once more into the database file.
/// A write batch's keys are scattered over the keyspace, so each one changes its own page of the
/// key-ordered index, and an update also the page of the row it replaces: at 4 KiB, SQLite's
/// default, those pages were most of the 9 KiB a create and the 14 KiB an update wrote
/// (BENCHMARKS.md counts them). With 1 KiB pages each write costs about half the bytes; rows
/// larger than a page continue on overflow pages, appended in revision order like the rows, and
/// an update's rewrite of the row it replaces takes more (smaller) frames, a little more CPU. A
/// database created with another page size keeps it: SQLite cannot change it in WAL mode.
const PAGE_SIZE: u32 = 1024;

/// The writer connection's page cache, in KiB (SQLite's negative `cache_size`), smaller than the
/// readers'. When SQLite splits a B-tree page it renumbers the new pages into ascending order,
/// parking one for a moment at the page number past its lock byte (1 GiB into the file); the
/// commit then drops cached pages beyond the end of the database, and since that number lies far
/// beyond it, SQLite walks the cache's whole hash table, one slot per cached page. `kv_head`
/// (until migration 0008) took a batch's keys at scattered places, so nearly every batch split a
/// page and paid that walk: at 32 MiB it was a fifth of the writer thread's CPU (`perf`, 100,000
/// creates). The writer's hot pages are the tails of the log, its primary key and the lease
/// index, which fit well within this; pages it misses come from the operating system's cache.
const WRITER_CACHE_KIB: i64 = 8192;

/// How often the background task checkpoints the WAL.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// The WAL size past which, by default, the writer checkpoints between batches so that the WAL
/// starts over (see the module documentation). Each such checkpoint holds writes up for one
/// fsync of the database file and the copy of at most [`CHECKPOINT_INTERVAL`]'s worth of
/// frames; a larger bound makes them rarer and the WAL file larger. About what etcd keeps in
/// its own WAL files (five segments of 64 MB).
pub const DEFAULT_WAL_RESTART_BYTES: i64 = 256 * 1024 * 1024;

/// Bytes of WAL per database page: the page and its frame header.
const WAL_FRAME_HEADER: i64 = 24;

/// What a passive checkpoint reports.
struct Checkpointed {
    /// Another connection's lock stopped it early.
    busy: bool,
    /// Frames in the WAL.
    frames: i64,
    /// Frames copied to the database file, by this checkpoint or earlier ones.
    copied: i64,
}

/// Copies what it can of the WAL into the database file without waiting for any lock.
async fn checkpoint_passive<'c>(
    conn: impl sqlx::SqliteExecutor<'c>,
) -> std::result::Result<Checkpointed, sqlx::Error> {
    let (busy, frames, copied) =
        sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(conn)
            .await?;
    Ok(Checkpointed {
        busy: busy != 0,
        frames,
        copied,
    })
}

/// Checkpoints the WAL every [`CHECKPOINT_INTERVAL`] until aborted, and asks the writer for a
/// restart once the WAL holds `restart_frames` frames, after catching up ([`catch_up`]).
async fn run_checkpoints(
    pool: SqlitePool,
    db: Arc<std::fs::File>,
    restart_due: Arc<AtomicBool>,
    restart_frames: i64,
) {
    loop {
        tokio::time::sleep(CHECKPOINT_INTERVAL).await;
        match checkpoint_passive(&pool).await {
            Ok(done) if done.frames >= restart_frames => {
                catch_up(&pool, &db, done).await;
                restart_due.store(true, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "WAL checkpoint failed; retrying"),
        }
    }
}

/// Frames the writer may be left to copy when it starts the WAL over (see [`catch_up`]).
const RESTART_TAIL_FRAMES: i64 = 256;
/// Passes [`catch_up`] runs at most: it stops early when a reader's snapshot holds it back or
/// the writer appends as fast as it copies.
const CATCH_UP_PASSES: usize = 8;

/// Readies the WAL for the writer's restart, so that the writer's checkpoint, which holds every
/// write up, has little left to do: fsyncs the database file, then runs another pass, and again,
/// until a pass copies at most [`RESTART_TAIL_FRAMES`] frames (what was appended during the
/// sync and the pass, so about what the writer will be left with).
///
/// SQLite fsyncs the database file only after a checkpoint that copied every frame the WAL
/// holds, which a background pass under a steady write load never does: the writer appends
/// while it copies. So the pages copied since the last restart stayed dirty in the operating
/// system's cache (unless its writeback came first) until the writer's checkpoint fsynced them
/// all at once: 22 to 55 ms at 12,000 updates/s, every few seconds, and no write meanwhile.
/// They are synced here, off the writer's path, and only here: a sync after every pass would
/// write hot pages (the log's tail, rewritten by each batch) to the disk each time, which the
/// cache otherwise merges (2.6 against 1.8 times etcd's disk bytes per update, measured with
/// `kv_head`).
///
/// A failed fsync stops the process, as a failed sync of the WAL does: Linux may forget the
/// failure once reported, and SQLite's own fsync of the file would then succeed with pages lost.
async fn catch_up(pool: &SqlitePool, db: &Arc<std::fs::File>, mut done: Checkpointed) {
    for _ in 0..CATCH_UP_PASSES {
        // A reader's snapshot holds the copy back: the next passes could not do better.
        if done.busy {
            return;
        }
        let file = db.clone();
        match tokio::task::spawn_blocking(move || file.sync_data()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "making the database file durable failed; stopping");
                std::process::abort();
            }
            // Not run (the runtime is shutting down): nothing was lost, SQLite's own fsync
            // still comes.
            Err(e) => {
                tracing::warn!(error = %e, "the database file's sync did not run");
                return;
            }
        }
        let before = done.copied;
        done = match checkpoint_passive(pool).await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %e, "WAL checkpoint failed; the writer restarts the WAL");
                return;
            }
        };
        // Fewer than before: the WAL started over meanwhile.
        if done.copied - before <= RESTART_TAIL_FRAMES {
            return;
        }
    }
}

/// Copies what the WAL holds beyond the database on the writer's connection, outside any
/// transaction: nothing can be appended meanwhile, so it catches up, and the next write
/// transaction starts the WAL over (unless a reader still reads frames from it; the next
/// background pass then asks again). A failure costs only the restart.
async fn restart_wal(conn: &mut SqliteConnection) {
    match checkpoint_passive(&mut *conn).await {
        Ok(done) => tracing::debug!(
            busy = done.busy,
            frames = done.frames,
            copied = done.copied,
            "writer checkpointed the WAL's tail"
        ),
        Err(e) => tracing::warn!(error = %e, "writer's WAL checkpoint failed"),
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
    /// How many permits `permits` started with.
    limit: u32,
    options: SqliteConnectOptions,
}

/// How long closing waits for reader loans still out (a read in flight, a rollback on its way
/// back to the idle list).
const CLOSE_WAIT: Duration = Duration::from_secs(5);

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
        // Every connection must be closed here rather than dropped as the process exits: SQLite
        // folds the WAL back into the database file only when its last connection closes. So
        // the loans still out come home first; a rollback on its way back holds its permit.
        let home = tokio::time::timeout(CLOSE_WAIT, self.permits.acquire_many(self.limit)).await;
        if home.is_err() {
            tracing::warn!(
                "a read still holds a SQLite connection at shutdown; not waiting longer"
            );
        }
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

impl Sqlite {
    /// Opens (creating if needed) the database file at `path` and migrates it; the writer
    /// starts the WAL over once it holds `wal_restart_bytes`.
    ///
    /// # Errors
    /// The folder cannot be created, the file cannot be opened, or a migration fails.
    pub async fn open(path: &str, wal_restart_bytes: i64) -> Result<Self> {
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
            .page_size(PAGE_SIZE)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .pragma("cache_size", "-32768")
            .pragma("temp_store", "memory");
        // The writer's WAL writes go through the layer that sends a commit in one write.
        vfs::register().map_err(Error::Vfs)?;
        let mut writer = SqliteConnection::connect_with(
            &base
                .clone()
                .vfs(vfs::NAME)
                .synchronous(SqliteSynchronous::Normal)
                .pragma("cache_size", format!("-{WRITER_CACHE_KIB}"))
                .pragma("wal_autocheckpoint", "0"),
        )
        .await?;
        MIGRATOR.run(&mut writer).await?;
        let cluster_id = rand::random::<u64>() >> 1 | 1;
        sqlx::query(&*sql::SQL.insert_cluster_id)
            .bind(cluster_id as i64)
            .execute(&mut writer)
            .await?;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let limit = (cores * 2).max(4);
        let readers = Arc::new(Readers {
            idle: std::sync::Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(limit)),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
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
        let db = std::fs::File::open(&file).map_err(|source| Error::OpenDatabase {
            path: file.clone(),
            source,
        })?;
        let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&mut writer)
            .await?;
        let restart_frames = wal_restart_bytes / (page_size + WAL_FRAME_HEADER);
        let wal_restart_due = Arc::new(AtomicBool::new(false));
        let checkpoints = tokio::spawn(run_checkpoints(
            checkpointer.clone(),
            Arc::new(db),
            wal_restart_due.clone(),
            restart_frames,
        ));
        Ok(Self {
            writer: Arc::new(Mutex::new(Some(WriterConn {
                conn: writer,
                open: false,
            }))),
            readers,
            checkpointer,
            checkpoints,
            wal: Arc::new(wal),
            wal_restart_due,
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
        if self.wal_restart_due.swap(false, Ordering::Relaxed) {
            restart_wal(&mut conn.conn).await;
        }
        // IMMEDIATE takes SQLite's write lock at the start rather than at the first write, so
        // the current revision read at the start cannot be overtaken by another writer. It is
        // sent with the first statement; `open` from now on, as that may fail halfway.
        let mut pending = Pending::default();
        pending.push("BEGIN IMMEDIATE", Vec::new())?;
        conn.open = true;
        Ok(SqliteTxn {
            conn: Conn::Write(conn),
            pending,
        })
    }
}

#[async_trait]
impl Connector for Sqlite {
    type Session = SqliteTxn;

    async fn read(&self) -> Result<SqliteTxn> {
        let mut loan = self.readers.loan().await?;
        let reader = loan.conn();
        // Marked open first: if this future is dropped during BEGIN, the rollback still runs.
        reader.open = true;
        sqlx::query("BEGIN").execute(&mut reader.conn).await?;
        Ok(SqliteTxn::read(loan))
    }

    /// Every statement runs on its own (autocommit), seeing the newest commit when it starts.
    async fn read_unpinned(&self) -> Result<SqliteTxn> {
        Ok(SqliteTxn::read(self.readers.loan().await?))
    }

    async fn write(&self) -> Result<SqliteTxn> {
        self.begin_write().await
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

    async fn backup(&self, dest: &Path) -> Result<()> {
        // One read snapshot, written as a compact new database; writes go on meanwhile.
        let mut loan = self.readers.loan().await?;
        sqlx::query("VACUUM INTO $1")
            .bind(dest.display().to_string())
            .execute(&mut loan.conn().conn)
            .await?;
        Ok(())
    }

    async fn restore(&self, source: &Path, copied: Copied<'_>) -> Result<()> {
        let mut conn = self.idle_writer().await?;
        let mut tx = conn.conn.begin().await?;
        super::backup::file_to_sqlite(source, &mut tx, copied).await?;
        tx.commit().await?;
        Ok(())
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

/// A read transaction, or the write transaction.
///
/// The write transaction sends what it can in as few round trips as possible: each statement is
/// a trip to the connection's worker thread, and under load each trip waits for that thread to
/// be scheduled, which costs more than SQLite's own work. So its BEGIN and every queued
/// statement (inserts, meta updates, savepoints) wait in `pending` and go with the next
/// statement that must answer, or with the COMMIT: a batch of creates is then one trip, a batch
/// of updates two.
pub struct SqliteTxn {
    conn: Conn,
    pending: Pending,
}

#[derive(Default)]
struct Pending {
    sql: String,
    args: SqliteArguments,
}

impl Pending {
    fn push(&mut self, sql: &str, args: Vec<Arg<'_>>) -> Result<()> {
        self.sql.push_str(sql);
        self.sql.push_str(";\n");
        for arg in args {
            bind_scalar(&mut self.args, arg)?;
        }
        Ok(())
    }
}

/// Whether `sql` names its parameters by number (`?1`): then it cannot follow other statements
/// in one trip, whose anonymous parameters would shift its numbers.
fn numbered_parameters(sql: &str) -> bool {
    sql.as_bytes()
        .windows(2)
        .any(|w| w[0] == b'?' && w[1].is_ascii_digit())
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
}

#[async_trait]
impl Session for SqliteTxn {
    type Row = SqliteRow;

    fn sql(&self) -> &'static Sql {
        &sql::SQL
    }

    async fn fetch(&mut self, stmt: Stmt<'_>) -> Result<Vec<SqliteRow>> {
        if !self.pending.sql.is_empty() && !numbered_parameters(&stmt.sql) {
            // Goes with what is pending (the batch's BEGIN, typically): one trip for all. The
            // pending statements return no rows.
            let mut pending = std::mem::take(&mut self.pending);
            pending.push(&stmt.sql, stmt.args)?;
            let query = sqlx::query_with(sqlx::AssertSqlSafe(pending.sql), pending.args);
            return Ok(query.fetch_all(self.conn()).await?);
        }
        self.send_pending().await?;
        let (sql, args) = bound(stmt, bind_scalar::<SqliteArguments>)?;
        Ok(sqlx::query_with(sql, args).fetch_all(self.conn()).await?)
    }

    async fn fetch_log_rows(&mut self, stmt: Stmt<'_>) -> Result<Vec<LogRow>> {
        self.send_pending().await?;
        raw::log_rows(self.conn(), &stmt).await
    }

    async fn execute(&mut self, stmt: Stmt<'_>) -> Result<u64> {
        // Apart from what is pending, so the count is this statement's alone.
        self.send_pending().await?;
        let (sql, args) = bound(stmt, bind_scalar::<SqliteArguments>)?;
        let done = sqlx::query_with(sql, args).execute(self.conn()).await?;
        Ok(done.rows_affected())
    }

    async fn queue(&mut self, stmt: Stmt<'_>) -> Result<()> {
        self.pending.push(&stmt.sql, stmt.args)
    }

    /// Commits the write transaction, with whatever is pending, in one trip; a read
    /// transaction just ends (its loan rolls it back).
    async fn commit(mut self) -> Result<()> {
        if matches!(self.conn, Conn::Read(_)) {
            return Ok(());
        }
        self.pending.push("COMMIT", Vec::new())?;
        self.send_pending().await?;
        if let Conn::Write(writer) = &mut self.conn {
            writer.open = false;
        }
        Ok(())
    }
}
