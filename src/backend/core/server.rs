//! Sessions on a database server's pool (PostgreSQL, MySQL): the pool's settings, a
//! transaction, or one connection running single statements. A server dialect only says how it
//! binds arguments.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::pool::{Pool, PoolConnection, PoolConnectionMetadata};
use sqlx::{AssertSqlSafe, Connection, Database, Transaction};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard, watch};

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

/// A transaction, or a connection running single statements (autocommit): a pooled one or
/// the [`KeptConnection`].
pub enum ServerSession<DB: Database> {
    Tx(Transaction<'static, DB>),
    Begun(Begun<DB>),
    Single(PoolConnection<DB>),
    Kept(OwnedMappedMutexGuard<Slot<DB>, Kept<DB>>),
    Presumed(Presumed<DB>),
}

/// A write transaction not begun yet, for a writer that presumes the current revision
/// ([`crate::backend::Backend::write_presuming`]). The first statement that needs the
/// transaction begins it, and a batch's append that comes first runs as a transaction of its
/// own; either checks the presumption under the writers' lock.
pub struct Presumed<DB: Database> {
    /// Not open until [`Stage::Begun`].
    tx: Begun<DB>,
    stage: Stage,
    /// The current revision presumed.
    current: i64,
    /// A simple query that begins the transaction, takes the writers' lock and then reads the
    /// revisions ([`Sql::revisions`]), whose rows are the only ones with two columns.
    begin: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Nothing sent yet.
    Waiting,
    /// The transaction is open, and the presumption held.
    Begun,
    /// The append ran as a transaction of its own and committed.
    Written,
}

impl<DB: Database> Presumed<DB> {
    pub fn new(conn: PoolConnection<DB>, current: i64, begin: &'static str) -> Self {
        Self {
            tx: Begun { conn, open: false },
            stage: Stage::Waiting,
            current,
            begin,
        }
    }

    /// An error unless the database's revisions, as `rows` hold them, are the presumed ones.
    fn check<'a, R: Columns + 'a>(&self, rows: impl IntoIterator<Item = &'a R>) -> Result<()> {
        match super::decode_revisions(rows)?.current {
            current if current == self.current => Ok(()),
            _ => Err(crate::backend::Error::Moved {
                presumed: self.current,
            }),
        }
    }
}

impl<DB> Presumed<DB>
where
    DB: ServerDialect,
    DB::Row: Columns,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    /// Begins the transaction, unless that was done.
    async fn begin(&mut self) -> Result<()> {
        if self.stage != Stage::Waiting {
            return Ok(());
        }
        // From here a failure leaves the transaction's state unknown: the connection is closed.
        self.tx.open = true;
        let rows = sqlx::raw_sql(AssertSqlSafe(self.begin))
            .fetch_all(self.tx.conn())
            .await?;
        self.check(rows.iter().filter(|row| sqlx::Row::len(*row) == 2))?;
        self.stage = Stage::Begun;
        Ok(())
    }

    async fn commit(mut self) -> Result<()> {
        match self.stage {
            Stage::Begun => self.tx.commit().await,
            Stage::Written => Ok(()),
            // Nothing was written, but what the writer answered rests on the presumption:
            // it holds if the revisions, read after the answers were made, still say so.
            Stage::Waiting => {
                let (sql, args) = bound(Stmt::new(&*DB::sql().revisions), DB::bind)?;
                let rows = sqlx::query_with(sql, args)
                    .fetch_all(self.tx.conn())
                    .await?;
                self.check(&rows)
            }
        }
    }
}

/// A transaction begun by hand on a pooled connection, so that its BEGIN travels with its first
/// statements in one round trip: sqlx's own `begin` sends BEGIN alone and waits for the answer.
/// Dropped before it commits (a failure, or a caller that gave up), its connection is closed
/// rather than given back to the pool: the server rolls the transaction back, and no other
/// session inherits it.
pub struct Begun<DB: Database> {
    conn: PoolConnection<DB>,
    /// Whether the transaction may still be open on the connection.
    open: bool,
}

impl<DB: Database> Begun<DB> {
    /// `conn`, whose next statement is to begin the transaction.
    pub fn new(conn: PoolConnection<DB>) -> Self {
        Self { conn, open: true }
    }

    pub fn conn(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }

    /// The statements that began the transaction also ended it: the connection goes back to
    /// the pool.
    pub fn ended(mut self) {
        self.open = false;
    }

    async fn commit(mut self) -> Result<()>
    where
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        sqlx::raw_sql("COMMIT").execute(&mut *self.conn).await?;
        self.open = false;
        Ok(())
    }
}

impl<DB: Database> Drop for Begun<DB> {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

impl<DB: Database> ServerSession<DB> {
    /// The connection, for one statement; [`ServerSession::settled`] tells when it finished.
    fn conn(&mut self) -> &mut DB::Connection {
        match self {
            ServerSession::Tx(tx) => tx,
            ServerSession::Begun(begun) => begun.conn(),
            ServerSession::Single(conn) => conn,
            ServerSession::Kept(kept) => {
                kept.unsettled = true;
                &mut kept.conn
            }
            ServerSession::Presumed(presumed) => presumed.tx.conn(),
        }
    }

    /// Begins a presumed transaction that a statement now needs.
    async fn begin_presumed(&mut self) -> Result<()>
    where
        DB: ServerDialect,
        DB::Row: Columns,
        DB::Arguments: sqlx::IntoArguments<DB>,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        match self {
            ServerSession::Presumed(presumed) => presumed.begin().await,
            _ => Ok(()),
        }
    }

    fn settled(&mut self) {
        if let ServerSession::Kept(kept) = self {
            kept.unsettled = false;
            kept.used = Instant::now();
        }
    }
}

/// One connection kept out of the pool for a job that runs one statement at a time, over and
/// over: the revision probe behind every linearizable read. A pooled connection costs that job a
/// second round trip per statement, because sqlx pings every connection it takes back (there is
/// no setting against it); a kept one is never given back.
///
/// It follows the pool: when `pools` announces a new one (a failover moved the primary), the
/// kept connection is dropped and the next one comes from the new pool. A connection idle for
/// [`PING_AFTER_IDLE`] is pinged first, as the pool would, and one whose last statement did
/// not finish cleanly (it failed, or its caller was cancelled mid-answer) is replaced.
pub struct KeptConnection<DB: Database> {
    slot: Arc<Mutex<Slot<DB>>>,
}

/// What [`KeptConnection`] guards: the pools it follows and the connection it keeps.
pub struct Slot<DB: Database> {
    pools: watch::Receiver<Pool<DB>>,
    live: Option<Kept<DB>>,
}

/// The kept connection, on loan to one [`ServerSession`] at a time.
pub struct Kept<DB: Database> {
    conn: DB::Connection,
    used: Instant,
    /// A statement began on it and has not finished cleanly.
    unsettled: bool,
}

/// A connection taken out of `pool` that answers a ping. The pool checks only connections idle
/// for [`PING_AFTER_IDLE`]; but a kept connection is replaced after a failure, often because the
/// server ended its connections (a restart, an administrator), which leaves every idle one in
/// the pool dead too. Each connection that fails is dropped, and the pool discards it.
async fn answering<DB: Database>(pool: &Pool<DB>) -> Result<DB::Connection> {
    let mut attempts = pool.size() + 1;
    loop {
        let mut conn = pool.acquire().await?;
        match conn.ping().await {
            Ok(()) => return Ok(conn.detach()),
            Err(e) if attempts <= 1 => return Err(e.into()),
            Err(_) => attempts -= 1,
        }
    }
}

impl<DB: Database> KeptConnection<DB> {
    pub fn new(pools: watch::Receiver<Pool<DB>>) -> Self {
        Self {
            slot: Arc::new(Mutex::new(Slot { pools, live: None })),
        }
    }

    /// For a backend whose pool is never replaced.
    pub fn fixed(pool: Pool<DB>) -> Self {
        Self::new(watch::channel(pool).1)
    }

    /// A session on the kept connection; waits while another has it.
    ///
    /// # Errors
    /// No connection could be had from the pool.
    pub async fn session(&self) -> Result<ServerSession<DB>> {
        let mut slot = self.slot.clone().lock_owned().await;
        // A closed sender means the backend is closing: the pool it left is closed too, and
        // acquiring from it below says so.
        if slot.pools.has_changed().unwrap_or(false) {
            slot.pools.borrow_and_update();
            slot.live = None;
        }
        if let Some(kept) = &mut slot.live
            && (kept.unsettled
                || (kept.used.elapsed() >= PING_AFTER_IDLE && kept.conn.ping().await.is_err()))
        {
            slot.live = None;
        }
        if slot.live.is_none() {
            let pool = slot.pools.borrow().clone();
            slot.live = Some(Kept {
                conn: answering(&pool).await?,
                used: Instant::now(),
                unsettled: false,
            });
        }
        let kept = OwnedMutexGuard::try_map(slot, |slot| slot.live.as_mut())
            .map_err(|_| sqlx::Error::PoolClosed)?;
        Ok(ServerSession::Kept(kept))
    }

    /// Closes the kept connection, once the pool is closed (which keeps another from being
    /// made): the pool's closing does not reach a connection it gave away.
    pub async fn close(&self) {
        if let Some(kept) = self.slot.lock().await.live.take() {
            // A connection that cannot say goodbye is dropped all the same.
            let _ = kept.conn.close().await;
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
        self.begin_presumed().await?;
        let (sql, args) = bound(stmt, DB::bind)?;
        let rows = sqlx::query_with(sql, args).fetch_all(self.conn()).await?;
        self.settled();
        Ok(rows)
    }

    async fn execute(&mut self, stmt: Stmt<'_>) -> Result<u64> {
        self.begin_presumed().await?;
        let (sql, args) = bound(stmt, DB::bind)?;
        let done = sqlx::query_with(sql, args).execute(self.conn()).await?;
        self.settled();
        Ok(DB::rows_affected(&done))
    }

    fn presumed_ahead(&self) -> Option<i64> {
        match self {
            ServerSession::Presumed(presumed) if presumed.stage == Stage::Waiting => {
                Some(presumed.current)
            }
            _ => None,
        }
    }

    async fn fetch_ahead(&mut self, stmt: Stmt<'_>) -> Result<Vec<DB::Row>> {
        match self {
            ServerSession::Presumed(presumed) if presumed.stage == Stage::Waiting => {
                let (sql, args) = bound(stmt, DB::bind)?;
                Ok(sqlx::query_with(sql, args)
                    .fetch_all(presumed.tx.conn())
                    .await?)
            }
            _ => self.fetch(stmt).await,
        }
    }

    async fn append(&mut self, stmt: Stmt<'_>, before: i64) -> Result<()> {
        // Before a presumed transaction begins, the statement is the whole transaction: it
        // runs on its own, as a read ahead does, and commits as it returns.
        let alone = self.presumed_ahead().is_some();
        let rows = self.fetch_ahead(stmt).await?;
        if let (true, ServerSession::Presumed(presumed)) = (alone, &mut *self) {
            presumed.stage = Stage::Written;
        }
        super::appended(&rows, before)
    }

    async fn commit(self) -> Result<()> {
        match self {
            ServerSession::Tx(tx) => Ok(tx.commit().await?),
            ServerSession::Begun(begun) => begun.commit().await,
            ServerSession::Presumed(presumed) => presumed.commit().await,
            ServerSession::Single(_) | ServerSession::Kept(_) => Ok(()),
        }
    }
}
