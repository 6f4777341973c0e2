//! The PostgreSQL backend: one database shared by any number of etcdsql processes.
//!
//! # One writer at a time, cluster-wide
//! Every write transaction (and every compaction chunk) first takes one transaction-scoped
//! advisory lock ([`WRITER_LOCK`]). So, across all processes, write transactions run one after
//! another: each reads the current revision after the previous one committed, allocates the next
//! revisions, and commits before the next writer may start. Revisions therefore become visible
//! in order, with no gap and no transaction committing "out of order" — the failure that makes
//! kine skip or stall events cannot happen here. Each process still groups its own requests into
//! one transaction per batch, so the lock is taken once per batch, not per request.
//!
//! # Reads
//! Read transactions are `REPEATABLE READ READ ONLY`: one snapshot for the revisions and the
//! rows they return. A read that starts after a write was acknowledged by any process sees it.
//!
//! # Wake-ups
//! A write transaction that moves the current revision also sends `NOTIFY` on
//! [`COMMIT_CHANNEL`]; PostgreSQL delivers it at commit. Each process listens, so its watch hub
//! wakes within milliseconds of another process's commit; polling stays as the fallback.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Postgres, Transaction};
use tokio::sync::watch;

use super::{
    AuthRecords, AuthVersion, Backend, DbSize, LeaseRow, LogRow, PoolOptions, RangeEnd, ReadTxn,
    Result, Revisions, Scan, WriteTxn, decode_row,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The advisory lock key every writer takes ("etcdsql" in ASCII, as a number).
const WRITER_LOCK: i64 = 0x65_7463_6473_716c;
/// The NOTIFY channel that carries committed revisions.
const COMMIT_CHANNEL: &str = "etcdsql_commit";

pub struct PostgresBackend {
    pool: PgPool,
    commits: watch::Receiver<i64>,
    /// Stops the LISTEN task when the backend closes.
    listener: tokio::task::JoinHandle<()>,
}

impl PostgresBackend {
    /// Connects (creating the database if it is missing and the user may), migrates, and starts
    /// listening for other processes' commits.
    ///
    /// # Errors
    /// A malformed URL, an unreachable server, or a failed migration.
    pub async fn open(url: &str, pool: &PoolOptions) -> Result<Self> {
        // Plan every statement for its own parameters. A cached generic plan cannot tell a read
        // at the current revision (a handful of rows replaced since) from one at the first
        // revision (all of them), and picks a scan of every version in the key range: seconds
        // instead of milliseconds at a million keys. Planning costs a fraction of a millisecond.
        let options =
            PgConnectOptions::from_str(url)?.options([("plan_cache_mode", "force_custom_plan")]);
        create_database_if_missing(&options).await?;
        let pool = PgPoolOptions::new()
            .max_connections(pool.max_connections)
            .idle_timeout(Some(pool.idle_timeout))
            .acquire_timeout(pool.connect_timeout)
            .after_connect(|_, _| {
                Box::pin(async {
                    disable_nagle();
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        // Concurrent first starts would race on the migration table; the writer lock orders them.
        {
            let mut conn = pool.acquire().await?;
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(WRITER_LOCK)
                .execute(&mut *conn)
                .await?;
            let migrated = MIGRATOR.run(&mut *conn).await;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(WRITER_LOCK)
                .execute(&mut *conn)
                .await?;
            migrated?;
        }
        let cluster_id = (rand::random::<u64>() >> 1).max(1) as i64;
        sqlx::query(
            "INSERT INTO meta (name, value) VALUES ('cluster_id', $1) ON CONFLICT DO NOTHING",
        )
        .bind(cluster_id)
        .execute(&pool)
        .await?;
        let (tx, commits) = watch::channel(0);
        let listening = listen(&pool).await?;
        let listener = tokio::spawn(listen_for_commits(pool.clone(), tx, listening));
        Ok(Self {
            pool,
            commits,
            listener,
        })
    }
}

/// Turns off Nagle's algorithm on every TCP socket of this process.
///
/// sqlx 0.9.0 opens its TCP connections without `TCP_NODELAY` (sqlx issue #4335, fixed after
/// that release). A statement larger than one TCP segment — a batch insert, or one value over
/// about 1.4 kB on a real network — then waits for the server's delayed ACK: 40 ms on Linux, per
/// statement. sqlx offers no hook to the socket it made, so this runs after each new connection
/// and sets the option on the process's TCP sockets, which it found through `/proc/self/fd`. The
/// option is right for all of them (gRPC and HTTP serving latency-bound requests); non-TCP
/// sockets refuse it, harmlessly.
fn disable_nagle() {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::BorrowedFd;
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
            return;
        };
        for entry in entries.flatten() {
            let is_socket = std::fs::read_link(entry.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
            let fd = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok());
            if let (true, Some(fd)) = (is_socket, fd) {
                // SAFETY: the descriptor was open a moment ago. If another thread closes it
                // first, setsockopt fails with EBADF, or sets TCP_NODELAY on whatever socket
                // reused the number: harmless either way, and nothing is read or written.
                let socket = unsafe { BorrowedFd::borrow_raw(fd) };
                let _ = socket2::SockRef::from(&socket).set_tcp_nodelay(true);
            }
        }
    }
}

/// Connects to the server's `postgres` database and creates the target database if needed.
async fn create_database_if_missing(options: &PgConnectOptions) -> Result<()> {
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(());
    };
    let mut admin = match options.clone().database("postgres").connect().await {
        Ok(conn) => conn,
        // No access to the maintenance database: assume the target exists; connecting to it
        // reports the real problem if not.
        Err(_) => return Ok(()),
    };
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_optional(&mut admin)
        .await?;
    if exists.is_none() {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        let create = format!("CREATE DATABASE {quoted}");
        match sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&mut admin)
            .await
        {
            Ok(_) => tracing::info!(database = %name, "created the database"),
            // Another process created it first.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A connection listening on the commit channel.
async fn listen(pool: &PgPool) -> std::result::Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(COMMIT_CHANNEL).await?;
    Ok(listener)
}

/// Follows NOTIFYs on the commit channel, starting with `listener` (already listening, so no
/// commit after the backend opened is missed); reconnects after outages. After a reconnection it
/// reports the current revision, since NOTIFYs sent while it was away are lost: the watch hub
/// then reads whatever it missed rather than waiting for its next poll.
async fn listen_for_commits(pool: PgPool, commits: watch::Sender<i64>, listener: PgListener) {
    let mut ready = Some(listener);
    loop {
        let listening = async {
            let mut listener = match ready.take() {
                Some(listener) => listener,
                None => {
                    let listener = listen(&pool).await?;
                    let current: i64 = sqlx::query_scalar(
                        "SELECT value FROM meta WHERE name = 'current_revision'",
                    )
                    .fetch_one(&pool)
                    .await?;
                    commits.send_if_modified(|seen| {
                        let newer = current > *seen;
                        *seen = (*seen).max(current);
                        newer
                    });
                    listener
                }
            };
            // `try_recv` rather than `recv`: `recv` reconnects silently, losing the NOTIFYs sent
            // meanwhile; `None` says the connection is gone, so the catch-up above runs.
            while let Some(note) = listener.try_recv().await? {
                if let Ok(revision) = note.payload().parse::<i64>() {
                    commits.send_if_modified(|seen| {
                        let newer = revision > *seen;
                        *seen = (*seen).max(revision);
                        newer
                    });
                }
            }
            Ok::<(), sqlx::Error>(())
        };
        match listening.await {
            Ok(()) => tracing::debug!("commit listener lost its connection; reconnecting"),
            Err(e) => tracing::debug!(error = %e, "commit listener failed; reconnecting"),
        }
        if commits.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// "The row of each key in a range that is visible at revision `$rev`, if it is live": still
/// the key's newest row (the `kv_log_live` index), or replaced after `$rev` (the
/// `kv_log_superseded` index); see the SQLite backend. PostgreSQL wants every parameter used, so
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

macro_rules! row_columns {
    () => {
        "revision, sub, name, created, deleted, create_revision, prev_revision, version, lease, \
         value, old_value, old_lease"
    };
}

/// The statement behind [`ReadTxn::scan`], public so that `benches/scale` can show its plan.
/// Parameters: `$1` start key, then the end key only for [`RangeEnd::Before`], then the
/// revision and the limit (NULL for none).
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

/// The statement behind [`ReadTxn::count`]; parameters as for [`scan_query`], without a limit.
pub fn count_query(end: &RangeEnd) -> &'static str {
    match end {
        RangeEnd::Single => count_sql!("k.name = $1", "$2"),
        RangeEnd::Unbounded => count_sql!("k.name >= $1", "$2"),
        RangeEnd::Before(_) => count_sql!("k.name >= $1 AND k.name < $2", "$3"),
    }
}

fn lease_row((id, ttl, expires_at): (i64, i64, i64)) -> LeaseRow {
    LeaseRow {
        id,
        ttl,
        expires_at,
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    async fn read(&self) -> Result<Box<dyn ReadTxn>> {
        let tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await?;
        Ok(Box::new(PgTxn(tx)))
    }

    /// One statement outside a transaction: it sees every commit made before it began.
    async fn revisions(&self) -> Result<Revisions> {
        meta_revisions(&self.pool).await
    }

    /// One statement outside a transaction: committed rows never change.
    async fn values(&self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>> {
        values_of(&self.pool, rows).await
    }

    async fn write(&self) -> Result<Box<dyn WriteTxn>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(WRITER_LOCK)
            .execute(&mut *tx)
            .await?;
        Ok(Box::new(PgTxn(tx)))
    }

    async fn cluster_id(&self) -> Result<u64> {
        let id: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE name = 'cluster_id'")
            .fetch_one(&self.pool)
            .await?;
        Ok(id as u64)
    }

    async fn size(&self) -> Result<DbSize> {
        let total: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
            .fetch_one(&self.pool)
            .await?;
        // Live tuples' share of the relations, a PostgreSQL stand-in for "in use".
        let in_use: Option<i64> = sqlx::query_scalar(
            "SELECT SUM(pg_total_relation_size(c.oid) * \
                    CASE WHEN s.n_live_tup + s.n_dead_tup = 0 THEN 1.0 \
                         ELSE s.n_live_tup::float8 / (s.n_live_tup + s.n_dead_tup) END)::bigint \
             FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(DbSize {
            total,
            in_use: in_use.unwrap_or(total).min(total),
        })
    }

    async fn compact_window(&self, compact: i64, after: i64, through: i64) -> Result<u64> {
        debug_assert!(through <= compact);
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(WRITER_LOCK)
            .execute(&mut *tx)
            .await?;
        // The rules of the SQLite backend's compaction.
        let superseded =
            sqlx::query("DELETE FROM kv_log WHERE superseded_by >= $1 AND superseded_by < $2")
                .bind(after)
                .bind(through)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        let tombstones =
            sqlx::query("DELETE FROM kv_log WHERE deleted AND revision >= $1 AND revision < $2")
                .bind(after)
                .bind(through)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        sqlx::query("UPDATE meta SET value = GREATEST(value, $1) WHERE name = 'compacted_through'")
            .bind(through)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(superseded + tombstones)
    }

    async fn compacted_through(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT value FROM meta WHERE name = 'compacted_through'")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn alarms(&self) -> Result<Vec<i32>> {
        let names: Vec<String> = sqlx::query_scalar(super::ALARMS_RAISED)
            .fetch_all(&self.pool)
            .await?;
        Ok(super::alarm_numbers(&names))
    }

    async fn set_alarm(&self, alarm: i32, raise: bool) -> Result<bool> {
        let done = sqlx::query(super::set_alarm_statement(raise))
            .bind(super::alarm_name(alarm))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn backup(&self, dest: &std::path::Path) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        super::backup::postgres_to_file(&mut tx, dest).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn restore(&self, source: &std::path::Path) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        // Other instances write only under the writers' lock.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(WRITER_LOCK)
            .execute(&mut *tx)
            .await?;
        super::backup::file_to_postgres(source, &mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn auth(&self) -> Result<AuthRecords> {
        // One snapshot, so the records and the revision belong together.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let records = read_auth!(&mut *tx);
        tx.commit().await?;
        Ok(records)
    }

    async fn auth_version(&self) -> Result<AuthVersion> {
        let rows = sqlx::query_as(super::AUTH_META)
            .fetch_all(&self.pool)
            .await?;
        Ok(AuthVersion::from_meta(rows))
    }

    async fn replace_auth(&self, expected: AuthVersion, next: &AuthRecords) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        // The row locks make instances change the auth store one at a time; the check below
        // then sees what the previous change committed.
        let rows = sqlx::query_as(
            "SELECT name, value FROM meta WHERE name IN ('auth_enabled', 'auth_revision') \
             FOR UPDATE",
        )
        .fetch_all(&mut *tx)
        .await?;
        if AuthVersion::from_meta(rows) != expected {
            return Ok(false);
        }
        write_auth!(&mut *tx, next);
        tx.commit().await?;
        Ok(true)
    }

    async fn defragment(&self) -> Result<()> {
        // A plain VACUUM marks dead rows' space for reuse and takes no lock that blocks reads
        // or writes; VACUUM FULL would return it to the system but lock the table throughout.
        sqlx::query("VACUUM (ANALYZE) kv_log, leases, meta")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn commit_notifications(&self) -> Option<watch::Receiver<i64>> {
        Some(self.commits.clone())
    }

    async fn close(&self) {
        self.listener.abort();
        self.pool.close().await;
    }
}

struct PgTxn(Transaction<'static, Postgres>);

/// The current and compact revisions, as `executor` sees them.
async fn meta_revisions<'e>(executor: impl sqlx::PgExecutor<'e>) -> Result<Revisions> {
    let rows = sqlx::query_as(super::META_REVISIONS)
        .fetch_all(executor)
        .await?;
    Ok(Revisions::from_meta(rows))
}

/// The values of rows `(key, revision)`, as `executor` sees them.
async fn values_of<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    rows: &[(&[u8], i64)],
) -> Result<Vec<Option<Vec<u8>>>> {
    let keys: Vec<Vec<u8>> = rows.iter().map(|(key, _)| key.to_vec()).collect();
    let revisions: Vec<i64> = rows.iter().map(|(_, revision)| *revision).collect();
    let found: Vec<(i64, Vec<u8>)> = sqlx::query_as(
        "SELECT w.i, k.value \
         FROM unnest($1::bytea[], $2::bigint[]) WITH ORDINALITY AS w(name, revision, i) \
         JOIN kv_log AS k ON k.name = w.name AND k.revision = w.revision",
    )
    .bind(keys)
    .bind(revisions)
    .fetch_all(executor)
    .await?;
    let mut values = vec![None; rows.len()];
    for (i, value) in found {
        // ORDINALITY counts from 1.
        if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| values.get_mut(i)) {
            *slot = Some(value);
        }
    }
    Ok(values)
}

impl PgTxn {
    async fn set_meta(&mut self, name: &str, value: i64) -> Result<()> {
        sqlx::query("UPDATE meta SET value = $1 WHERE name = $2")
            .bind(value)
            .bind(name)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl ReadTxn for PgTxn {
    async fn revisions(&mut self) -> Result<Revisions> {
        meta_revisions(&mut *self.0).await
    }

    async fn scan(&mut self, scan: &Scan<'_>) -> Result<Vec<LogRow>> {
        let mut query = sqlx::query(scan_query(scan.end, scan.keys_only)).bind(scan.key);
        if let RangeEnd::Before(end) = scan.end {
            query = query.bind(end.as_slice());
        }
        let rows = query
            .bind(scan.revision)
            .bind(scan.limit)
            .fetch_all(&mut *self.0)
            .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn count(&mut self, key: &[u8], end: &RangeEnd, revision: i64) -> Result<i64> {
        let mut query = sqlx::query_scalar(count_query(end)).bind(key);
        if let RangeEnd::Before(end) = end {
            query = query.bind(end.as_slice());
        }
        Ok(query.bind(revision).fetch_one(&mut *self.0).await?)
    }

    async fn latest(&mut self, key: &[u8]) -> Result<Option<LogRow>> {
        let sql = concat!(
            "SELECT ",
            row_columns!(),
            " FROM kv_log WHERE name = $1 ORDER BY revision DESC LIMIT 1"
        );
        let row = sqlx::query(sql)
            .bind(key)
            .fetch_optional(&mut *self.0)
            .await?;
        row.as_ref().map(decode_row).transpose()
    }

    async fn heads(&mut self) -> Result<Vec<LogRow>> {
        let rows = sqlx::query(
            "SELECT DISTINCT ON (name) revision, sub, name, created, deleted, create_revision, \
             prev_revision, version, lease, ''::bytea, NULL::bytea, old_lease \
             FROM kv_log ORDER BY name, revision DESC",
        )
        .fetch_all(&mut *self.0)
        .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn values_at(&mut self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>> {
        values_of(&mut *self.0, rows).await
    }

    async fn changes(&mut self, after: i64, through: i64) -> Result<Vec<LogRow>> {
        let sql = concat!(
            "SELECT ",
            row_columns!(),
            " FROM kv_log WHERE revision > $1 AND revision <= $2 ORDER BY revision, sub"
        );
        let rows = sqlx::query(sql)
            .bind(after)
            .bind(through)
            .fetch_all(&mut *self.0)
            .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn lease(&mut self, id: i64) -> Result<Option<LeaseRow>> {
        let row: Option<(i64, i64, i64)> =
            sqlx::query_as("SELECT id, ttl, expires_at FROM leases WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *self.0)
                .await?;
        Ok(row.map(lease_row))
    }

    async fn leases(&mut self) -> Result<Vec<LeaseRow>> {
        let rows: Vec<(i64, i64, i64)> =
            sqlx::query_as("SELECT id, ttl, expires_at FROM leases ORDER BY id")
                .fetch_all(&mut *self.0)
                .await?;
        Ok(rows.into_iter().map(lease_row).collect())
    }

    async fn lease_keys(&mut self, id: i64, revision: i64) -> Result<Vec<LogRow>> {
        // As in the SQLite backend: the lease's partial index (`k.lease <> 0` lets PostgreSQL
        // use it), then the one visible row per key.
        let sql = concat!(
            "SELECT ",
            row_columns!(),
            " FROM kv_log AS k WHERE k.lease = $1 AND k.lease <> 0 AND k.revision <= $2 \
              AND (k.superseded_by IS NULL OR k.superseded_by > $2) AND NOT k.deleted \
              ORDER BY k.name"
        );
        let rows = sqlx::query(sql)
            .bind(id)
            .bind(revision)
            .fetch_all(&mut *self.0)
            .await?;
        rows.iter().map(decode_row).collect()
    }

    async fn expired_leases(&mut self, now: i64, limit: i64) -> Result<Vec<LeaseRow>> {
        let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT id, ttl, expires_at FROM leases WHERE expires_at <= $1 \
             ORDER BY expires_at LIMIT $2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *self.0)
        .await?;
        Ok(rows.into_iter().map(lease_row).collect())
    }

    async fn next_expiry(&mut self) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar("SELECT MIN(expires_at) FROM leases")
            .fetch_one(&mut *self.0)
            .await?)
    }
}

#[async_trait]
impl WriteTxn for PgTxn {
    async fn insert_rows(&mut self, rows: &[LogRow]) -> Result<()> {
        // One statement for the whole batch: a round trip to the server per row would cost more
        // than the inserts themselves.
        let sql = concat!(
            "INSERT INTO kv_log (",
            row_columns!(),
            ") SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bytea[], $4::boolean[], \
             $5::boolean[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bytea[], \
             $11::bytea[], $12::bigint[])"
        );
        if rows.is_empty() {
            return Ok(());
        }
        sqlx::query(sql)
            .bind(rows.iter().map(|r| r.revision).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.sub).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.key.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.created).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.deleted).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.create_revision).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.prev_revision).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.version).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.lease).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.value.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.old_value.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.old_lease).collect::<Vec<_>>())
            .execute(&mut *self.0)
            .await?;
        // Then mark the rows these replaced (a row's predecessor may be in this batch).
        let replacing: Vec<&LogRow> = rows.iter().filter(|r| r.prev_revision > 0).collect();
        if !replacing.is_empty() {
            sqlx::query(
                "UPDATE kv_log AS k SET superseded_by = u.revision \
                 FROM unnest($1::bigint[], $2::bytea[], $3::bigint[]) AS u(revision, name, prev) \
                 WHERE k.name = u.name AND k.revision = u.prev",
            )
            .bind(replacing.iter().map(|r| r.revision).collect::<Vec<_>>())
            .bind(replacing.iter().map(|r| r.key.clone()).collect::<Vec<_>>())
            .bind(
                replacing
                    .iter()
                    .map(|r| r.prev_revision)
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *self.0)
            .await?;
        }
        Ok(())
    }

    async fn set_current_revision(&mut self, revision: i64) -> Result<()> {
        self.set_meta("current_revision", revision).await?;
        // Delivered at commit, to every process listening (this one included).
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(COMMIT_CHANNEL)
            .bind(revision.to_string())
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn set_compact_revision(&mut self, revision: i64) -> Result<()> {
        self.set_meta("compact_revision", revision).await
    }

    async fn insert_lease(&mut self, lease: &LeaseRow) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO leases (id, ttl, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(lease.id)
        .bind(lease.ttl)
        .bind(lease.expires_at)
        .execute(&mut *self.0)
        .await?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn set_lease_expiry(&mut self, id: i64, expires_at: i64) -> Result<bool> {
        let updated = sqlx::query("UPDATE leases SET expires_at = $1 WHERE id = $2")
            .bind(expires_at)
            .bind(id)
            .execute(&mut *self.0)
            .await?
            .rows_affected();
        Ok(updated == 1)
    }

    async fn delete_lease(&mut self, id: i64) -> Result<bool> {
        let deleted = sqlx::query("DELETE FROM leases WHERE id = $1")
            .bind(id)
            .execute(&mut *self.0)
            .await?
            .rows_affected();
        Ok(deleted == 1)
    }

    async fn savepoint(&mut self) -> Result<()> {
        sqlx::query("SAVEPOINT request")
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn release_savepoint(&mut self) -> Result<()> {
        sqlx::query("RELEASE SAVEPOINT request")
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        sqlx::query("ROLLBACK TO SAVEPOINT request")
            .execute(&mut *self.0)
            .await?;
        sqlx::query("RELEASE SAVEPOINT request")
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.0.commit().await?;
        Ok(())
    }
}
