//! The MySQL / MariaDB backend: one InnoDB database shared by any number of etcdsql processes.
//!
//! # One writer at a time, cluster-wide: a locked row
//! Every write transaction (and compaction chunk, alarm and auth change) begins by locking the
//! `current_revision` row of `meta` (`SELECT … FOR UPDATE`) and holds it to its commit. So, across
//! all processes, write transactions run one after another, each reading the current revision
//! after the previous one committed: revisions become visible in order with no gap, and no
//! transaction commits "out of order" (kine#676, where auto-increment ids commit out of order
//! and watchers skip events, cannot happen). A row lock rather than `GET_LOCK`: a row lock is
//! part of the transaction, released by its commit or rollback however the transaction ends,
//! where a `GET_LOCK` belongs to the connection and outlives a failed transaction on a pooled
//! connection; and Galera replicates row locks' effects (as certification conflicts) but not
//! `GET_LOCK` at all.
//!
//! # Reads
//! Read transactions are `REPEATABLE READ` with a consistent snapshot taken at their start.
//! Write transactions run `READ COMMITTED`: under the lock nothing else commits, and each
//! statement sees everything committed before the lock was taken.
//!
//! # Wake-ups
//! MySQL has no LISTEN/NOTIFY. Each process reads the `current_revision` row every
//! [`POLL_INTERVAL`] (one primary-key lookup) and wakes its watch hub when it moved: other
//! processes' commits reach watchers within that interval plus the hub's read.

mod sql;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlArguments, MySqlConnectOptions, MySqlPool, MySqlQueryResult};
use sqlx::{ConnectOptions, Transaction};
use tokio::sync::watch;

pub use sql::{count_query, scan_query};

use super::core::{
    Arg, Connector, KeptConnection, ServerDialect, ServerSession, Sql, bind_scalar, pool_options,
};

/// A session on the MySQL pool.
pub type MysqlSession = ServerSession<sqlx::MySql>;
use super::{CommitNotice, Copied, DbSize, Error, PoolOptions, Result};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/mysql");

/// How often each process looks for other processes' commits.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Takes the writers' lock; the first statement of every write transaction.
const WRITER_LOCK: &str = "SELECT value FROM meta WHERE name = 'current_revision' FOR UPDATE";
/// Migrations of concurrent first starts are ordered by a named lock (no table exists yet).
const MIGRATION_LOCK: &str = "etcdsql_migrate";

pub struct Mysql {
    pool: MySqlPool,
    /// The revision probe's connection, kept out of the pool.
    probe: KeptConnection<sqlx::MySql>,
    commits: watch::Receiver<CommitNotice>,
    /// Stops the polling task when the backend closes.
    poller: tokio::task::JoinHandle<()>,
}

/// kine's endpoint (`mysql://user:pass@tcp(host:port)/db?tls=…`, Go's DSN inside a URL) as the
/// URL the driver reads; other endpoints unchanged except `mariadb://`, which is `mysql://`.
pub fn normalize_endpoint(endpoint: &str) -> String {
    let endpoint = match endpoint.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => endpoint.to_owned(),
    };
    let Some(rest) = endpoint.strip_prefix("mysql://") else {
        return endpoint;
    };
    let (userinfo, address) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let (host, tail, socket) = if let Some(inner) = address.strip_prefix("tcp(") {
        match inner.split_once(')') {
            Some((host, tail)) => (host.to_owned(), tail, None),
            None => return endpoint,
        }
    } else if let Some(inner) = address.strip_prefix("unix(") {
        match inner.split_once(')') {
            Some((path, tail)) => ("localhost".to_owned(), tail, Some(path.to_owned())),
            None => return endpoint,
        }
    } else {
        return endpoint;
    };
    let host = if host.is_empty() {
        "127.0.0.1:3306".to_owned()
    } else {
        host
    };
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let mut params: Vec<String> = Vec::new();
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        // Go's driver: tls=true verifies the server, skip-verify only encrypts.
        match (key, value) {
            ("tls", "true") => params.push("ssl-mode=VERIFY_IDENTITY".into()),
            ("tls", "skip-verify" | "preferred") => params.push("ssl-mode=REQUIRED".into()),
            ("tls", "false") => params.push("ssl-mode=DISABLED".into()),
            _ => params.push(pair.to_owned()),
        }
    }
    if let Some(socket) = socket {
        params.push(format!("socket={socket}"));
    }
    let query = if params.is_empty() {
        String::new()
    } else {
        format!("?{}", params.join("&"))
    };
    format!("mysql://{userinfo}{host}{path}{query}")
}

impl Mysql {
    /// Connects (creating the database if it is missing and the user may), migrates, and starts
    /// following other processes' commits.
    ///
    /// # Errors
    /// A malformed URL, an unreachable server, or a failed migration.
    pub async fn open(endpoint: &str, pool: &PoolOptions) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(&normalize_endpoint(endpoint))?;
        create_database_if_missing(&options).await?;
        let pool = pool_options::<sqlx::MySql>(pool)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    // Reads rely on snapshots whatever the server's default isolation is.
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        {
            let mut conn = pool.acquire().await?;
            let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
                .bind(MIGRATION_LOCK)
                .fetch_one(&mut *conn)
                .await?;
            if locked != Some(1) {
                return Err(Error::Sql(sqlx::Error::Protocol(
                    "timed out waiting for another instance's migration".into(),
                )));
            }
            let migrated = MIGRATOR.run(&mut *conn).await;
            sqlx::query("SELECT RELEASE_LOCK(?)")
                .bind(MIGRATION_LOCK)
                .execute(&mut *conn)
                .await?;
            migrated?;
        }
        let cluster_id = (rand::random::<u64>() >> 1).max(1) as i64;
        sqlx::query(&*sql::SQL.insert_cluster_id)
            .bind(cluster_id)
            .execute(&pool)
            .await?;
        let (tx, commits) = watch::channel(CommitNotice::default());
        let poller = tokio::spawn(poll_commits(pool.clone(), tx));
        Ok(Self {
            probe: KeptConnection::fixed(pool.clone()),
            pool,
            commits,
            poller,
        })
    }

    /// A read-only transaction on one snapshot, taken at its start (every connection's
    /// sessions are REPEATABLE READ, see `open`).
    async fn read_tx(&self) -> Result<Transaction<'static, sqlx::MySql>> {
        let conn = self.pool.acquire().await?;
        let begin = "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY";
        Ok(Transaction::begin(conn, Some(sqlx::SqlSafeStr::into_sql_str(begin))).await?)
    }

    /// A READ COMMITTED transaction holding the writers' lock. (SET TRANSACTION sets the level
    /// of the next transaction only; the connection's later ones are REPEATABLE READ again.)
    async fn write_tx(&self) -> Result<Transaction<'static, sqlx::MySql>> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await?;
        let begin = sqlx::SqlSafeStr::into_sql_str("START TRANSACTION");
        let mut tx = Transaction::begin(conn, Some(begin)).await?;
        sqlx::query(WRITER_LOCK).fetch_all(&mut *tx).await?;
        Ok(tx)
    }
}

/// Connects without a database and creates the target database if needed.
async fn create_database_if_missing(options: &MySqlConnectOptions) -> Result<()> {
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(());
    };
    let quoted = format!("`{}`", name.replace('`', "``"));
    let mut admin = match options.clone().database("").connect().await {
        Ok(conn) => conn,
        // Connecting to the database itself reports the real problem, if there is one.
        Err(_) => return Ok(()),
    };
    let create = format!("CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4");
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&mut admin)
        .await
    {
        tracing::debug!(error = %e, database = %name, "could not create the database");
    }
    Ok(())
}

/// Reads the current revision every [`POLL_INTERVAL`] and reports each increase, until the
/// backend closes; errors (an outage) are retried after a pause.
async fn poll_commits(pool: MySqlPool, commits: watch::Sender<CommitNotice>) {
    loop {
        let current: std::result::Result<i64, sqlx::Error> =
            sqlx::query_scalar("SELECT value FROM meta WHERE name = 'current_revision'")
                .fetch_one(&pool)
                .await;
        match current {
            Ok(current) => {
                // A poll misses nothing, so it never counts as resumed.
                commits.send_if_modified(|seen| {
                    let newer = current > seen.revision;
                    seen.revision = seen.revision.max(current);
                    newer
                });
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "commit poll failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        if commits.is_closed() {
            return;
        }
    }
}

#[async_trait]
impl Connector for Mysql {
    type Session = MysqlSession;

    async fn read(&self) -> Result<MysqlSession> {
        Ok(MysqlSession::Tx(self.read_tx().await?))
    }

    /// Statements outside a transaction (autocommit): each sees every commit made before it.
    async fn read_unpinned(&self) -> Result<MysqlSession> {
        Ok(MysqlSession::Single(self.pool.acquire().await?))
    }

    async fn write(&self) -> Result<MysqlSession> {
        Ok(MysqlSession::Tx(self.write_tx().await?))
    }

    async fn probe(&self) -> Result<MysqlSession> {
        self.probe.session().await
    }

    /// The width of `kv_log.name` (see the migration).
    fn max_key_bytes(&self) -> Option<usize> {
        Some(3000)
    }

    async fn size(&self) -> Result<DbSize> {
        let (total, free): (i64, i64) = sqlx::query_as(
            "SELECT CAST(COALESCE(SUM(data_length + index_length + data_free), 0) AS SIGNED), \
                    CAST(COALESCE(SUM(data_free), 0) AS SIGNED) \
             FROM information_schema.tables WHERE table_schema = DATABASE()",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(DbSize {
            total,
            in_use: total - free,
        })
    }

    async fn defragment(&self) -> Result<()> {
        // InnoDB rebuilds each table online: reads and writes go on meanwhile.
        sqlx::query("OPTIMIZE TABLE kv_log, leases")
            .fetch_all(&self.pool)
            .await?;
        Ok(())
    }

    async fn backup(&self, dest: &std::path::Path) -> Result<()> {
        let mut tx = self.read_tx().await?;
        super::backup::mysql_to_file(&mut tx, dest).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn restore(&self, source: &std::path::Path, copied: Copied<'_>) -> Result<()> {
        let mut tx = self.write_tx().await?;
        super::backup::file_to_mysql(source, &mut tx, copied).await?;
        tx.commit().await?;
        Ok(())
    }

    fn commit_notifications(&self) -> Option<watch::Receiver<CommitNotice>> {
        Some(self.commits.clone())
    }

    async fn close(&self) {
        self.poller.abort();
        self.pool.close().await;
        self.probe.close().await;
    }
}

impl ServerDialect for sqlx::MySql {
    fn sql() -> &'static Sql {
        &sql::SQL
    }

    fn bind(args: &mut MySqlArguments, arg: Arg<'_>) -> Result<()> {
        bind_scalar(args, arg)
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_endpoint;

    #[test]
    fn kine_endpoints_become_urls() {
        assert_eq!(
            normalize_endpoint("mysql://root:pw@tcp(127.0.0.1:3306)/kine"),
            "mysql://root:pw@127.0.0.1:3306/kine"
        );
        assert_eq!(
            normalize_endpoint("mysql://u@tcp(db:3307)/k?tls=true&charset=utf8mb4"),
            "mysql://u@db:3307/k?ssl-mode=VERIFY_IDENTITY&charset=utf8mb4"
        );
        assert_eq!(
            normalize_endpoint("mysql://u@unix(/run/mysqld/mysqld.sock)/k"),
            "mysql://u@localhost/k?socket=/run/mysqld/mysqld.sock"
        );
        assert_eq!(
            normalize_endpoint("mariadb://root@127.0.0.1:3306/db"),
            "mysql://root@127.0.0.1:3306/db"
        );
        assert_eq!(
            normalize_endpoint("mysql://root@127.0.0.1/db?ssl-mode=REQUIRED"),
            "mysql://root@127.0.0.1/db?ssl-mode=REQUIRED"
        );
    }
}
