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
//! # Round trips under the lock
//! Every round trip a write transaction makes while it holds the lock holds up every instance's
//! writes. A batch's first round trip begins, takes the lock, and reads the revisions and what
//! other instances committed since the writer last looked, values and old values included
//! ([`Connector::write_from`]): the writer's key index and the batch's old values need nothing
//! more, and the watch hub is handed those rows rather than reading them again. Then one
//! statement carries the batch's rows, and the COMMIT ends it. (Writing the rows out as literals,
//! to send them with the COMMIT in one simple query, was measured: PostgreSQL's parsing of the
//! hex cost more than the round trip saved, 28-35% of one instance's throughput.)
//!
//! A writer that found no other instance's commits in its last batch presumes there are none
//! ([`crate::backend::Backend::write_presuming`]): its next batch's rows go in one statement
//! outside any transaction, which takes the lock, moves the current revision only if it is
//! still the presumed one, writes the rows only if it moved, and commits as it returns. One
//! round trip holds the lock instead of three. That statement calls a PL/pgSQL function
//! (migrations 0007 to 0009), which plans its statements once per session: this backend's
//! sessions plan their own statements afresh at every call (see `SESSION_SETTINGS`), and
//! planning the batch's statement cost about a seventh of PostgreSQL's CPU. The batch reads the
//! leases its Puts attach rows to before it takes the lock
//! ([`crate::backend::WriteTxn::leases_ahead`]; read inside the transaction, each held the lock
//! one round trip longer), and the function checks under the lock that they still exist: a
//! lease revoked meanwhile fails the append as a moved revision does. The old values it needs
//! are read before the lock as well ([`crate::backend::WriteTxn::values_ahead`]).
//!
//! # Reads
//! Read transactions are `REPEATABLE READ READ ONLY`: one snapshot for the revisions and the
//! rows they return. A read that starts after a write was acknowledged by any process sees it.
//!
//! # Wake-ups
//! A write transaction that moves the current revision also sends `NOTIFY` on
//! [`COMMIT_CHANNEL`]; PostgreSQL delivers it at commit. Each process listens, so its watch hub
//! wakes within milliseconds of another process's commit; polling stays as the fallback (and
//! the only way, with a warning, if a NOTIFY sent at start never reaches this process's LISTEN).
//!
//! # Failover
//! The endpoint may name several hosts; the backend writes to the one that accepts writes and
//! moves its pool and its LISTEN to the new primary after a failover ([`primary`]). What it
//! does when the new primary lacks revisions already served is the store's history fence
//! (`crate::mvcc`).

mod primary;
#[macro_use]
mod sql;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgListener, PgPool, PgQueryResult};
use sqlx::{Arguments, AssertSqlSafe, ConnectOptions, Row, Transaction};
use tokio::sync::watch;

use primary::{Endpoint, SessionAttrs};
use sql::{BEGIN_LOCKED, COMMIT_CHANNEL};
pub use sql::{count_query, scan_query};

use super::core::{
    Arg, Begun, Connector, KeptConnection, Presumed, ServerDialect, ServerSession, Sql,
    bind_scalar, changes_query, decode_revisions, decode_row, pool_options,
};

/// A session on the PostgreSQL pool.
pub type PgSession = ServerSession<sqlx::Postgres>;
use super::{CommitNotice, Copied, DbSize, LogRow, Opening, PoolOptions, Result, Revisions};

/// Keys up to this length always fit PostgreSQL's index entries, compressed or not.
pub const CHECKED_KEY_BYTES: usize = 2600;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The advisory lock key every writer takes ("etcdsql" in ASCII, as a number).
const WRITER_LOCK: i64 = 0x65_7463_6473_716c;
/// Every pool connection's settings, sent once it connects (as SET statements rather than
/// startup options, which pgbouncer drops):
/// - Plan every statement for its own parameters. A cached generic plan cannot tell a read at
///   the current revision (a handful of rows replaced since) from one at the first revision
///   (all of them), and picks a scan of every version in the key range: seconds instead of
///   milliseconds at a million keys. Planning costs a fraction of a millisecond.
/// - No JIT compilation and no parallel workers. Every statement here touches a handful of
///   rows, but before the first ANALYZE (and whenever a range is misestimated) the planner can
///   cost a read of twenty revisions past JIT's threshold: the tailer's reads then took 50 to
///   600 ms each, most of it compiling and starting workers, and a write load on three
///   instances fell to tens of requests per second.
const SESSION_SETTINGS: &str = "SET plan_cache_mode = force_custom_plan; SET jit = off; \
     SET max_parallel_workers_per_gather = 0";

pub struct Postgres {
    /// The pool of the primary in use; replaced when a failover moves the primary
    /// ([`primary`]).
    pools: watch::Receiver<PgPool>,
    /// The revision probe's connection, kept out of the pool.
    probe: KeptConnection<sqlx::Postgres>,
    /// With a single host nothing replaces the pool; its sender lives here so that the
    /// channel stays open (with several, the task that follows the primary holds it).
    _single_pool: Option<watch::Sender<PgPool>>,
    /// Other processes' commits, unless NOTIFYs do not reach this process.
    commits: Option<watch::Receiver<CommitNotice>>,
    /// The LISTEN task and, with several hosts, the task that follows the primary; stopped
    /// when the backend closes.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Postgres {
    /// Connects to the endpoint's primary (creating the database if it is missing and the user
    /// may), migrates, and starts listening for other processes' commits.
    ///
    /// # Errors
    /// A malformed URL, no reachable (writable) server, or a failed migration.
    pub async fn open(url: &str, pool: &PoolOptions) -> Result<Self> {
        let endpoint = Endpoint::parse(url)?;
        let primary = endpoint.find(pool.connect_timeout).await?;
        let options = endpoint.hosts[primary].options.clone();
        create_database_if_missing(&options).await?;
        let settings = pool.clone();
        let read_write = endpoint.attrs == SessionAttrs::ReadWrite;
        let db_ports: std::sync::Arc<[u16]> = endpoint
            .hosts
            .iter()
            .map(|h| h.options.get_port())
            .collect();
        let new_pool = move |options: PgConnectOptions| {
            let db_ports = db_ports.clone();
            pool_options::<sqlx::Postgres>(&settings)
                .after_connect(move |conn, _| {
                    let db_ports = db_ports.clone();
                    Box::pin(async move {
                        tune_sockets(&db_ports);
                        sqlx::raw_sql(SESSION_SETTINGS).execute(&mut *conn).await?;
                        if read_write {
                            primary::accepts_writes(conn)
                                .await
                                .map_err(|why| sqlx::Error::Configuration(why.into()))?;
                        }
                        Ok(())
                    })
                })
                .connect_lazy_with(options)
        };
        let first = new_pool(options);
        // Concurrent first starts would race on the migration table; the writer lock orders them.
        {
            let mut conn = first.acquire().await?;
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
        sqlx::query(&*sql::SQL.insert_cluster_id)
            .bind(cluster_id)
            .execute(&first)
            .await?;
        let (pool_tx, pools) = watch::channel(first.clone());
        let mut tasks = Vec::new();
        let single_pool = if endpoint.hosts.len() > 1 {
            tasks.push(tokio::spawn(primary::follow_primary(
                endpoint,
                primary,
                pool_tx,
                new_pool,
                pool.connect_timeout,
            )));
            None
        } else {
            Some(pool_tx)
        };
        let mut listening = listen(&first).await?;
        let commits = if notifications_arrive(&first, &mut listening).await? {
            let (tx, commits) = watch::channel(CommitNotice::default());
            tasks.push(tokio::spawn(listen_for_commits(
                pools.clone(),
                tx,
                listening,
            )));
            Some(commits)
        } else {
            tracing::warn!(
                "a NOTIFY sent to this database never reached this process's LISTEN (a \
                 connection pooler in transaction mode?): other instances' writes reach this \
                 one's watchers and reads only at each --watch-poll-interval"
            );
            None
        };
        Ok(Self {
            probe: KeptConnection::new(pools.clone()),
            pools,
            _single_pool: single_pool,
            commits,
            tasks,
        })
    }

    /// The pool of the primary in use.
    fn pool(&self) -> PgPool {
        self.pools.borrow().clone()
    }
}

/// How long a connection to the database may leave data unacknowledged, or idle without
/// answering keepalives, before the kernel drops it.
const DB_SOCKET_TIMEOUT: Duration = Duration::from_secs(15);

/// Turns off Nagle's algorithm on every TCP socket of this process, and bounds how long a
/// connection to the database (a socket whose peer port is one of `db_ports`) can hang.
///
/// sqlx 0.9.0 opens its TCP connections without `TCP_NODELAY` (sqlx issue #4335, fixed after
/// that release). A statement larger than one TCP segment — a batch insert, or one value over
/// about 1.4 kB on a real network — then waits for the server's delayed ACK: 40 ms on Linux, per
/// statement. sqlx offers no hook to the socket it made, so this runs after each new connection
/// and sets the option on the process's TCP sockets, which it found through `/proc/self/fd`. The
/// option is right for all of them (gRPC and HTTP serving latency-bound requests); non-TCP
/// sockets refuse it, harmlessly.
///
/// A primary that vanishes without closing its connections (a host or network failure sends
/// no reset, unlike a crash) would leave a statement, and the writer with it, waiting until the
/// kernel gives up retransmitting, about 15 minutes later. Keepalives and a user timeout
/// ([`DB_SOCKET_TIMEOUT`]) end such a connection within seconds, so the request fails and the
/// next one goes to the new primary.
fn tune_sockets(db_ports: &[u16]) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::BorrowedFd;
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
            return;
        };
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(DB_SOCKET_TIMEOUT / 3)
            .with_interval(DB_SOCKET_TIMEOUT / 6)
            .with_retries(3);
        for entry in entries.flatten() {
            let is_socket = std::fs::read_link(entry.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
            let fd = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok());
            if let (true, Some(fd)) = (is_socket, fd) {
                // SAFETY: the descriptor was open a moment ago. If another thread closes it
                // first, setsockopt fails with EBADF, or sets these options on whatever socket
                // reused the number: harmless either way, and nothing is read or written.
                let socket = unsafe { BorrowedFd::borrow_raw(fd) };
                let socket = socket2::SockRef::from(&socket);
                let _ = socket.set_tcp_nodelay(true);
                let to_database = socket
                    .peer_addr()
                    .ok()
                    .and_then(|peer| peer.as_socket())
                    .is_some_and(|peer| db_ports.contains(&peer.port()));
                if to_database {
                    let _ = socket.set_tcp_keepalive(&keepalive);
                    let _ = socket.set_tcp_user_timeout(Some(DB_SOCKET_TIMEOUT));
                }
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
            // Another process created it first: before this one looked (duplicate_database), or
            // at the same moment (a unique violation in the catalog).
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
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

/// Whether a NOTIFY sent through the pool reaches `listener`, within a few seconds. Behind a
/// connection pooler in transaction mode the LISTEN and the NOTIFY run on whatever server
/// connections the pooler picks, and notifications are lost.
async fn notifications_arrive(pool: &PgPool, listener: &mut PgListener) -> Result<bool> {
    let token = format!("probe-{}", rand::random::<u64>());
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(COMMIT_CHANNEL)
        .bind(&token)
        .execute(pool)
        .await?;
    let heard = async {
        while let Some(note) = listener.try_recv().await? {
            if note.payload() == token {
                return Ok(true);
            }
        }
        Ok::<bool, sqlx::Error>(false)
    };
    Ok(tokio::time::timeout(Duration::from_secs(5), heard)
        .await
        .unwrap_or(Ok(false))?)
}

/// Follows NOTIFYs on the commit channel, starting with `listener` (already listening, so no
/// commit after the backend opened is missed); reconnects after outages, and to the new
/// primary when the pool changes. After a reconnection it wakes the watch hub, since NOTIFYs
/// sent while it was away are lost: the hub then reads whatever it missed (or finds the history
/// shorter than it served) rather than waiting for its next poll.
async fn listen_for_commits(
    mut pools: watch::Receiver<PgPool>,
    commits: watch::Sender<CommitNotice>,
    listener: PgListener,
) {
    let mut ready = Some(listener);
    loop {
        let pool = pools.borrow_and_update().clone();
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
                    // Wakes the hub even if the revision is not newer: after a failover it
                    // may be lower, which the hub must hear of to fence the store.
                    commits.send_modify(|seen| {
                        seen.revision = seen.revision.max(current);
                        seen.resumed += 1;
                    });
                    listener
                }
            };
            // `try_recv` rather than `recv`: `recv` reconnects silently, losing the NOTIFYs sent
            // meanwhile; `None` says the connection is gone, so the catch-up above runs.
            while let Some(note) = listener.try_recv().await? {
                if let Ok(revision) = note.payload().parse::<i64>() {
                    commits.send_if_modified(|seen| {
                        let newer = revision > seen.revision;
                        seen.revision = seen.revision.max(revision);
                        newer
                    });
                }
            }
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            result = listening => match result {
                Ok(()) => tracing::debug!("commit listener lost its connection; reconnecting"),
                Err(e) => tracing::debug!(error = %e, "commit listener failed; reconnecting"),
            },
            changed = pools.changed() => {
                if changed.is_err() {
                    return;
                }
                tracing::debug!("the primary moved; listening there");
                continue;
            }
        }
        if commits.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Postgres {
    /// A repeatable-read, read-only transaction: one snapshot.
    async fn read_tx(&self) -> Result<Transaction<'static, sqlx::Postgres>> {
        Ok(self
            .pool()
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await?)
    }

    /// A transaction holding the writers' lock.
    async fn write_tx(&self) -> Result<Transaction<'static, sqlx::Postgres>> {
        Ok(self.pool().begin_with(BEGIN_LOCKED).await?)
    }

    /// Runs `query`, a simple query that begins a transaction and reads the revisions and the
    /// log's changes ([`Sql::revisions`], [`Sql::changes`]), on a pooled connection.
    async fn begin_with_reads(
        &self,
        query: String,
    ) -> Result<(Begun<sqlx::Postgres>, Revisions, Vec<LogRow>)> {
        let mut begun = Begun::new(self.pool().acquire().await?);
        let rows = sqlx::raw_sql(AssertSqlSafe(query))
            .fetch_all(begun.conn())
            .await?;
        // The statements' rows tell apart by shape: the revisions' name and value, the
        // changes' log columns, and any other statement's (the writers' lock) one column.
        let (mut revisions, mut changes) = (Vec::new(), Vec::new());
        for row in &rows {
            match row.len() {
                2 => revisions.push(row),
                1 => {}
                _ => changes.push(decode_row(row)?),
            }
        }
        Ok((begun, decode_revisions(revisions)?, changes))
    }
}

#[async_trait]
impl Connector for Postgres {
    type Session = PgSession;

    async fn read(&self) -> Result<PgSession> {
        Ok(PgSession::Tx(self.read_tx().await?))
    }

    /// Statements outside a transaction: each sees every commit made before it began.
    async fn read_unpinned(&self) -> Result<PgSession> {
        Ok(PgSession::Single(self.pool().acquire().await?))
    }

    async fn write(&self) -> Result<PgSession> {
        Ok(PgSession::Tx(self.write_tx().await?))
    }

    /// One round trip where the snapshot's begin, the revisions, the changes and the end would
    /// take four: the watch hub's read of what other instances committed, after each of their
    /// commits.
    async fn read_changes(&self, after: i64, through: i64) -> Result<(Revisions, Vec<LogRow>)> {
        let query = format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {}; {}; COMMIT",
            sql::SQL.revisions,
            changes_query(&after.to_string(), &through.to_string())
        );
        let (begun, revisions, changes) = self.begin_with_reads(query).await?;
        begun.ended();
        Ok((revisions, changes))
    }

    /// One round trip where a begin, the revisions and the changes since `after` would take
    /// three, all of them under the writers' lock: the lock is held for the round trip that
    /// takes it and the ones that write, no more.
    async fn write_from(&self, after: i64) -> Result<(PgSession, Option<Opening>)> {
        let query = sql::opening(after);
        let (begun, revisions, changes) = self.begin_with_reads(query).await?;
        let opening = Opening {
            revisions,
            changes,
            after,
            through: revisions
                .current
                .min(after.saturating_add(sql::OPENING_CHANGES)),
        };
        Ok((PgSession::Begun(begun), Some(opening)))
    }

    /// Takes a connection only: [`crate::backend::Backend::write_presuming`] says what runs
    /// on it.
    async fn write_presuming(&self, current: i64) -> Result<Option<PgSession>> {
        let conn = self.pool().acquire().await?;
        let presumed = Presumed::new(conn, current, sql::BEGIN_CHECKED.as_str());
        Ok(Some(PgSession::Presumed(presumed)))
    }

    async fn probe(&self) -> Result<PgSession> {
        self.probe.session().await
    }

    async fn size(&self) -> Result<DbSize> {
        let total: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
            .fetch_one(&self.pool())
            .await?;
        // Live tuples' share of the relations, a PostgreSQL stand-in for "in use".
        let in_use: Option<i64> = sqlx::query_scalar(
            "SELECT SUM(pg_total_relation_size(c.oid) * \
                    CASE WHEN s.n_live_tup + s.n_dead_tup = 0 THEN 1.0 \
                         ELSE s.n_live_tup::float8 / (s.n_live_tup + s.n_dead_tup) END)::bigint \
             FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid",
        )
        .fetch_one(&self.pool())
        .await?;
        Ok(DbSize {
            total,
            in_use: in_use.unwrap_or(total).min(total),
        })
    }

    async fn defragment(&self) -> Result<()> {
        // A plain VACUUM marks dead rows' space for reuse and takes no lock that blocks reads
        // or writes; VACUUM FULL would return it to the system but lock the table throughout.
        sqlx::query("VACUUM (ANALYZE) kv_log, kv_head, kv_replaced, leases, meta")
            .execute(&self.pool())
            .await?;
        Ok(())
    }

    async fn backup(&self, dest: &std::path::Path) -> Result<()> {
        let mut tx = self.read_tx().await?;
        super::backup::postgres_to_file(&mut tx, dest).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn restore(&self, source: &std::path::Path, copied: Copied<'_>) -> Result<()> {
        let mut tx = self.write_tx().await?;
        super::backup::file_to_postgres(source, &mut tx, copied).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A B-tree entry holds at most 2,704 bytes (a third of a page) once compressed; keys up
    /// to this length always fit beside the index's other columns, longer ones only if they
    /// compress.
    fn checked_key_bytes(&self) -> Option<usize> {
        Some(CHECKED_KEY_BYTES)
    }

    fn commit_notifications(&self) -> Option<watch::Receiver<CommitNotice>> {
        self.commits.clone()
    }

    async fn close(&self) {
        for task in &self.tasks {
            task.abort();
        }
        self.pool().close().await;
        self.probe.close().await;
    }
}

impl ServerDialect for sqlx::Postgres {
    fn sql() -> &'static Sql {
        &sql::SQL
    }

    /// Binds PostgreSQL's arrays here and every scalar as all dialects do.
    fn bind(args: &mut PgArguments, arg: Arg<'_>) -> Result<()> {
        let added = match arg {
            Arg::Ints(v) => args.add(v),
            Arg::Bools(v) => args.add(v),
            Arg::Blobs(v) => args.add(v),
            scalar => return bind_scalar(args, scalar),
        };
        added.map_err(|e| sqlx::Error::Encode(e).into())
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_transaction_takes_the_writers_lock() {
        let key = BEGIN_LOCKED
            .strip_prefix("BEGIN; SELECT pg_advisory_xact_lock(")
            .and_then(|rest| rest.strip_suffix(')'));
        assert_eq!(key, Some(WRITER_LOCK.to_string().as_str()));
        assert_eq!(writer_lock!(), WRITER_LOCK.to_string());
    }

    /// The batch's function (migration 0009; 0007 before it) takes the same lock and
    /// notifies on the same channel as every other writer.
    #[test]
    fn the_append_function_takes_the_writers_lock_and_notifies() {
        let migration = include_str!("../../../migrations/postgres/0009_append_checks_leases.sql");
        let lock = format!("PERFORM pg_advisory_xact_lock({WRITER_LOCK});");
        assert!(
            migration.contains(&lock),
            "the function does not take {lock}"
        );
        let notify = format!("PERFORM pg_notify('{COMMIT_CHANNEL}', moved::text);");
        assert!(
            migration.contains(&notify),
            "the function does not send {notify}"
        );
    }
}
