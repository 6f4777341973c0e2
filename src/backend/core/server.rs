//! Sessions on a database server's pool (PostgreSQL, MySQL): the pool's settings, a
//! transaction, or one connection running single statements. A server dialect only says how it
//! binds arguments.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::{PoolConnection, PoolConnectionMetadata};
use sqlx::{AssertSqlSafe, Connection, Database, Transaction};

use super::{Arg, Columns, Session, Sql, Stmt};
use crate::backend::Result;

/// What a server dialect adds to its sqlx driver: its statements and how it binds an [`Arg`].
pub trait ServerDialect: Database {
    fn sql() -> &'static Sql;
    /// # Errors
    /// An argument the dialect cannot take or the driver cannot encode.
    fn bind(args: &mut Self::Arguments, arg: Arg<'_>) -> Result<()>;
    /// Rows a statement changed (the driver's result types share no trait for it).
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

/// A pooled connection idle for this long is pinged before it is handed out.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A server pool's settings. sqlx pings every connection it hands out by default: a round trip
/// before every transaction and every single statement (on PostgreSQL five round trips per write
/// batch instead of four, two per linearizable read's revision probe instead of one). A
/// connection back from use a moment ago was just checked: sqlx pings every connection it takes
/// back and drops a broken one. One that sat idle may have been closed by the server or a proxy
/// meanwhile: it is pinged, and a dead one is dropped for another.
pub fn pool_options<DB: Database>(
    settings: &crate::backend::PoolOptions,
) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(settings.max_connections)
        .idle_timeout(Some(settings.idle_timeout))
        .acquire_timeout(settings.connect_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn: &mut DB::Connection, meta: PoolConnectionMetadata| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

/// A transaction, or a pooled connection running single statements (autocommit).
pub enum ServerSession<DB: Database> {
    Tx(Transaction<'static, DB>),
    Single(PoolConnection<DB>),
}

impl<DB: Database> ServerSession<DB> {
    fn conn(&mut self) -> &mut DB::Connection {
        match self {
            ServerSession::Tx(tx) => tx,
            ServerSession::Single(conn) => conn,
        }
    }
}

/// A statement's text and its arguments bound by `bind`. Text borrowed from a static [`Sql`]
/// stays static, so the connection prepares it once and caches it.
///
/// # Errors
/// An argument `bind` refuses.
pub fn bound<A: Default>(
    stmt: Stmt<'_>,
    bind: impl Fn(&mut A, Arg<'_>) -> Result<()>,
) -> Result<(AssertSqlSafe<std::borrow::Cow<'static, str>>, A)> {
    let mut args = A::default();
    for arg in stmt.args {
        bind(&mut args, arg)?;
    }
    Ok((AssertSqlSafe(stmt.sql), args))
}

#[async_trait]
impl<DB> Session for ServerSession<DB>
where
    DB: ServerDialect,
    DB::Row: Columns + Send,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    type Row = DB::Row;

    fn sql(&self) -> &'static Sql {
        DB::sql()
    }

    async fn fetch(&mut self, stmt: Stmt<'_>) -> Result<Vec<DB::Row>> {
        let (sql, args) = bound(stmt, DB::bind)?;
        Ok(sqlx::query_with(sql, args).fetch_all(self.conn()).await?)
    }

    async fn execute(&mut self, stmt: Stmt<'_>) -> Result<u64> {
        let (sql, args) = bound(stmt, DB::bind)?;
        let done = sqlx::query_with(sql, args).execute(self.conn()).await?;
        Ok(DB::rows_affected(&done))
    }

    async fn commit(self) -> Result<()> {
        if let ServerSession::Tx(tx) = self {
            tx.commit().await?;
        }
        Ok(())
    }
}
