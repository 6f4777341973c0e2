//! The backend core: everything the SQL backends share, written once.
//!
//! A dialect is two things: its SQL text (a [`Sql`], in the dialect's `sql.rs`) and its
//! connection code (a [`Connector`] handing out [`Session`]s, in its `mod.rs`). The core turns
//! them into a [`Backend`]: it owns the order and meaning of every statement (reads, appends,
//! leases, savepoints, compaction, alarms, the auth store) and decodes every row; a dialect
//! decides only how a statement reaches its database and what the statement says.
//!
//! Invariants the core relies on, which every connector keeps:
//! - A write session is exclusive cluster-wide from its first statement to its commit (the
//!   dialect's lock: a mutex, an advisory lock, a locked row), so the revision it reads as
//!   current is the one it extends.
//! - A read session is one snapshot (except `read_unpinned`, see [`Backend::read_unpinned`]).
//! - A session that is dropped without `commit` leaves nothing behind.
//! - Statements queued with [`Session::queue`] run, in order, before the next statement that
//!   answers, and before the commit.

pub mod check;
mod server;
mod statements;
mod txn;

use std::borrow::Cow;
use std::path::Path;

use async_trait::async_trait;

pub use server::{
    Begun, KeptConnection, Presumed, ServerDialect, ServerSession, bound, pool_options,
};
pub use statements::{
    Bookkeeping, Sql, Syntax, changes_query, insert_chunks, mark_superseded, number_placeholders,
    push_tuples, values_chunks,
};

use super::{
    AuthRecords, AuthVersion, Backend, Copied, DbSize, LeaseRow, LogRow, Opening, RangeEnd,
    ReadTxn, Result, Revisions, WriteTxn,
};

/// One value bound to a statement. Dialects bind the scalar ones the same way
/// ([`bind_scalar`]); arrays exist only where a dialect's SQL takes them (PostgreSQL's
/// `unnest`).
#[derive(Clone, Debug)]
pub enum Arg<'a> {
    Int(i64),
    OptInt(Option<i64>),
    Bool(bool),
    Bytes(&'a [u8]),
    Text(Cow<'a, str>),
    Ints(Vec<i64>),
    Bools(Vec<bool>),
    Blobs(Vec<&'a [u8]>),
}

/// A statement and its arguments, in the order its placeholders take them.
#[derive(Clone, Debug)]
pub struct Stmt<'a> {
    pub sql: Cow<'static, str>,
    pub args: Vec<Arg<'a>>,
}

impl<'a> Stmt<'a> {
    pub fn new(sql: impl Into<Cow<'static, str>>) -> Self {
        Stmt {
            sql: sql.into(),
            args: Vec::new(),
        }
    }

    pub fn int(mut self, value: i64) -> Self {
        self.args.push(Arg::Int(value));
        self
    }

    pub fn bytes(mut self, value: &'a [u8]) -> Self {
        self.args.push(Arg::Bytes(value));
        self
    }

    pub fn text(mut self, value: impl Into<Cow<'a, str>>) -> Self {
        self.args.push(Arg::Text(value.into()));
        self
    }

    pub fn arg(mut self, arg: Arg<'a>) -> Self {
        self.args.push(arg);
        self
    }
}

/// Binds a scalar [`Arg`] to any dialect's arguments; an array is an error (a dialect that
/// takes arrays binds them before calling this).
///
/// # Errors
/// An array argument, or a value the driver cannot encode.
pub fn bind_scalar<A>(args: &mut A, arg: Arg<'_>) -> Result<()>
where
    A: sqlx::Arguments,
    for<'t> i64: sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
    for<'t> Option<i64>: sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
    for<'t> bool: sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
    for<'t> &'t [u8]: sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
    for<'t> &'t str: sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
{
    let added = match arg {
        Arg::Int(v) => args.add(v),
        Arg::OptInt(v) => args.add(v),
        Arg::Bool(v) => args.add(v),
        Arg::Bytes(v) => args.add(v),
        Arg::Text(v) => args.add(v.as_ref()),
        Arg::Ints(_) | Arg::Bools(_) | Arg::Blobs(_) => {
            return Err(
                sqlx::Error::Protocol("this dialect takes no array arguments".into()).into(),
            );
        }
    };
    added.map_err(|e| sqlx::Error::Encode(e).into())
}

/// Typed access to the columns of a result row, for any dialect's row type.
pub trait Columns {
    fn int(&self, i: usize) -> Result<i64>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>>;
    fn flag(&self, i: usize) -> Result<bool>;
    fn bytes(&self, i: usize) -> Result<Vec<u8>>;
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>>;
    fn text(&self, i: usize) -> Result<String>;
}

impl<R> Columns for R
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn int(&self, i: usize) -> Result<i64> {
        Ok(self.try_get(i)?)
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        Ok(self.try_get(i)?)
    }
    fn flag(&self, i: usize) -> Result<bool> {
        Ok(self.try_get(i)?)
    }
    fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        Ok(self.try_get(i)?)
    }
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        Ok(self.try_get(i)?)
    }
    fn text(&self, i: usize) -> Result<String> {
        Ok(self.try_get(i)?)
    }
}

/// Reads a [`LogRow`] from a row whose columns are in the log table's order.
pub fn decode_row(row: &impl Columns) -> Result<LogRow> {
    Ok(LogRow {
        revision: row.int(0)?,
        sub: row.int(1)?,
        key: row.bytes(2)?,
        created: row.flag(3)?,
        deleted: row.flag(4)?,
        create_revision: row.int(5)?,
        prev_revision: row.int(6)?,
        version: row.int(7)?,
        lease: row.int(8)?,
        value: row.bytes(9)?,
        old_value: row.opt_bytes(10)?,
        old_lease: row.int(11)?,
    })
}

/// Reads [`Revisions`] from the rows of [`Sql::revisions`] (name, value).
pub fn decode_revisions<'a, R: Columns + 'a>(
    rows: impl IntoIterator<Item = &'a R>,
) -> Result<Revisions> {
    let mut revisions = Revisions {
        current: 1,
        ..Revisions::default()
    };
    for row in rows {
        match row.text(0)?.as_str() {
            "current_revision" => revisions.current = row.int(1)?,
            "compact_revision" => revisions.compact = row.int(1)?,
            _ => revisions.fence = row.int(1)?,
        }
    }
    Ok(revisions)
}

/// What a [`Session::append`] statement's `rows` say: whether it wrote, or found the database's
/// current revision other than `before` (or a lease of the batch's rows gone).
fn appended<R>(rows: &[R], before: i64) -> Result<()> {
    match rows.is_empty() {
        true => Err(crate::backend::Error::Moved { presumed: before }),
        false => Ok(()),
    }
}

/// One connection's worth of statements: a transaction, or single statements outside one.
#[async_trait]
pub trait Session: Send + 'static {
    type Row: Columns + Send;
    /// The dialect's statements.
    fn sql(&self) -> &'static Sql;
    /// Runs a statement and returns its rows.
    async fn fetch(&mut self, stmt: Stmt<'_>) -> Result<Vec<Self::Row>>;
    /// Runs a statement whose columns are the log's ([`decode_row`]) and returns its rows.
    async fn fetch_log_rows(&mut self, stmt: Stmt<'_>) -> Result<Vec<LogRow>> {
        self.fetch(stmt).await?.iter().map(decode_row).collect()
    }
    /// Runs a statement and returns how many rows it changed (or matched, for an UPDATE).
    async fn execute(&mut self, stmt: Stmt<'_>) -> Result<u64>;
    /// Runs a read whose answer the batch's append checks again under the writers' lock: a
    /// presumed transaction not begun yet runs it on its own rather than beginning (and so
    /// taking the lock) for it.
    async fn fetch_ahead(&mut self, stmt: Stmt<'_>) -> Result<Vec<Self::Row>> {
        self.fetch(stmt).await
    }
    /// The revision presumed, while [`Session::fetch_ahead`] reads outside the writers' lock.
    fn presumed_ahead(&self) -> Option<i64> {
        None
    }
    /// Runs a statement whose answer nobody needs; a dialect may hold it back to go with the
    /// next statement or the commit, in one round trip.
    async fn queue(&mut self, stmt: Stmt<'_>) -> Result<()> {
        self.execute(stmt).await.map(drop)
    }
    /// Runs a batch's [`Sql::append`] statement, which returns a row when it wrote and none
    /// when the database's current revision was not `before`, the batch's first (or a lease
    /// the batch's rows are attached to is gone).
    async fn append(&mut self, stmt: Stmt<'_>, before: i64) -> Result<()> {
        appended(&self.fetch(stmt).await?, before)
    }
    /// Commits a transaction; a session outside a transaction just ends.
    async fn commit(self) -> Result<()>;
}

/// How a dialect reaches its database: the sessions the core runs its statements on, and what
/// only the database's own tools can do.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    type Session: Session;
    /// A read-only snapshot transaction.
    async fn read(&self) -> Result<Self::Session>;
    /// Statements that each see the newest commit (see [`Backend::read_unpinned`]).
    async fn read_unpinned(&self) -> Result<Self::Session>;
    /// The exclusive write transaction (its lock already taken).
    async fn write(&self) -> Result<Self::Session>;
    /// See [`Backend::read_changes`]; by default a snapshot's statements one by one.
    async fn read_changes(&self, after: i64, through: i64) -> Result<(Revisions, Vec<LogRow>)> {
        let mut tx = SqlTxn(self.read().await?);
        let revisions = tx.revisions().await?;
        Ok((revisions, tx.changes(after, through).await?))
    }
    /// See [`Backend::write_from`].
    async fn write_from(&self, _after: i64) -> Result<(Self::Session, Option<Opening>)> {
        Ok((self.write().await?, None))
    }
    /// See [`Backend::write_presuming`].
    async fn write_presuming(&self, _current: i64) -> Result<Option<Self::Session>> {
        Ok(None)
    }
    /// A session like `read_unpinned`'s for [`Backend::revisions`], which the revision probe
    /// calls one at a time and as often as reads come.
    async fn probe(&self) -> Result<Self::Session> {
        self.read_unpinned().await
    }
    /// See [`Backend::sole_writer`].
    fn sole_writer(&self) -> bool {
        false
    }
    /// See [`Backend::max_key_bytes`].
    fn max_key_bytes(&self) -> Option<usize> {
        None
    }
    /// See [`Backend::checked_key_bytes`].
    fn checked_key_bytes(&self) -> Option<usize> {
        None
    }
    /// See [`Backend::sync`].
    async fn sync(&self) -> Result<()> {
        Ok(())
    }
    async fn size(&self) -> Result<DbSize>;
    async fn defragment(&self) -> Result<()>;
    async fn backup(&self, dest: &Path) -> Result<()>;
    async fn restore(&self, source: &Path, copied: Copied<'_>) -> Result<()>;
    fn commit_notifications(
        &self,
    ) -> Option<tokio::sync::watch::Receiver<crate::backend::CommitNotice>> {
        None
    }
    async fn close(&self);
}

/// A [`Backend`] over a dialect's connector.
pub struct SqlBackend<C>(pub C);

/// The one implementation of the backend's transactions.
struct SqlTxn<S>(S);

#[async_trait]
impl<C: Connector> Backend for SqlBackend<C> {
    async fn read(&self) -> Result<Box<dyn ReadTxn>> {
        Ok(Box::new(SqlTxn(self.0.read().await?)))
    }

    async fn read_unpinned(&self) -> Result<Box<dyn ReadTxn>> {
        Ok(Box::new(SqlTxn(self.0.read_unpinned().await?)))
    }

    async fn revisions(&self) -> Result<Revisions> {
        // Once more on failure: the server may have ended the probe's connection (a restart,
        // an idle timeout, an administrator) since its last use, and the retry takes a new one;
        // a database that is really down fails the retry too. The first try is a statement of
        // its own because its session holds the probe's connection, which a `match` on it would
        // keep to the end, deadlocking the retry.
        let first = SqlTxn(self.0.probe().await?).revisions().await;
        match first {
            Ok(revisions) => Ok(revisions),
            Err(e) => {
                tracing::debug!(error = %e, "the revision probe failed; retrying once");
                SqlTxn(self.0.probe().await?).revisions().await
            }
        }
    }

    async fn values(&self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>> {
        SqlTxn(self.0.read_unpinned().await?).values_at(rows).await
    }

    fn sole_writer(&self) -> bool {
        self.0.sole_writer()
    }

    fn max_key_bytes(&self) -> Option<usize> {
        self.0.max_key_bytes()
    }

    fn checked_key_bytes(&self) -> Option<usize> {
        self.0.checked_key_bytes()
    }

    async fn write(&self) -> Result<Box<dyn WriteTxn>> {
        Ok(Box::new(SqlTxn(self.0.write().await?)))
    }

    async fn read_changes(&self, after: i64, through: i64) -> Result<(Revisions, Vec<LogRow>)> {
        self.0.read_changes(after, through).await
    }

    async fn write_from(&self, after: i64) -> Result<(Box<dyn WriteTxn>, Option<Opening>)> {
        let (session, opening) = self.0.write_from(after).await?;
        Ok((Box::new(SqlTxn(session)), opening))
    }

    async fn write_presuming(&self, current: i64) -> Result<Option<Box<dyn WriteTxn>>> {
        let session = self.0.write_presuming(current).await?;
        Ok(session.map(|session| Box::new(SqlTxn(session)) as Box<dyn WriteTxn>))
    }

    async fn cluster_id(&self) -> Result<u64> {
        let id = scalar(&mut self.0.read_unpinned().await?, |sql| &sql.cluster_id).await?;
        Ok(id as u64)
    }

    async fn size(&self) -> Result<DbSize> {
        self.0.size().await
    }

    async fn compact_window(&self, compact: i64, after: i64, through: i64) -> Result<u64> {
        debug_assert!(through <= compact);
        let mut tx = self.0.write().await?;
        let sql = tx.sql();
        // Rows replaced by a change in [after, through): no read at or above the compact
        // revision can see them, since their successor is below it. A row replaced at the
        // compact revision itself stays until the next compaction: a watch from the compact
        // revision reports that change, with this row as its prev_kv.
        let superseded = tx
            .execute(Stmt::new(&*sql.compact_superseded).int(after).int(through))
            .await?;
        if let Some(forget) = &sql.forget_replaced {
            tx.execute(Stmt::new(&**forget).int(after).int(through))
                .await?;
        }
        // Tombstones below the compact revision: a key that is absent needs no row to say so.
        // The windows [after, through) tile [previous compact, compact) exactly; a tombstone at
        // the compact revision itself stays, as a watch from that revision must report it.
        if let Some(forget) = &sql.forget_tombstones {
            tx.execute(Stmt::new(&**forget).int(after).int(through))
                .await?;
        }
        let tombstones = tx
            .execute(Stmt::new(&*sql.compact_tombstones).int(after).int(through))
            .await?;
        tx.queue(
            Stmt::new(&*sql.raise_compacted_through)
                .int(through)
                .int(through),
        )
        .await?;
        tx.commit().await?;
        Ok(superseded + tombstones)
    }

    async fn compacted_through(&self) -> Result<i64> {
        scalar(&mut self.0.read_unpinned().await?, |sql| {
            &sql.compacted_through
        })
        .await
    }

    async fn defragment(&self) -> Result<()> {
        self.0.defragment().await
    }

    async fn alarms(&self) -> Result<Vec<i32>> {
        let mut session = self.0.read_unpinned().await?;
        let rows = session
            .fetch(Stmt::new(&*session.sql().alarms_raised))
            .await?;
        let mut alarms = Vec::with_capacity(rows.len());
        for row in rows {
            if let Some(alarm) = row
                .text(0)?
                .strip_prefix("alarm:")
                .and_then(|n| n.parse().ok())
            {
                alarms.push(alarm);
            }
        }
        alarms.sort_unstable();
        Ok(alarms)
    }

    async fn set_alarm(&self, alarm: i32, raise: bool) -> Result<bool> {
        let name = format!("alarm:{alarm}");
        let mut tx = self.0.write().await?;
        let sql = tx.sql();
        if raise {
            tx.execute(Stmt::new(&*sql.insert_alarm).text(name.as_str()))
                .await?;
        }
        let update = if raise {
            &sql.raise_alarm
        } else {
            &sql.clear_alarm
        };
        let changed = tx.execute(Stmt::new(&**update).text(name.as_str())).await?;
        tx.commit().await?;
        self.0.sync().await?;
        Ok(changed > 0)
    }

    async fn backup(&self, dest: &Path) -> Result<()> {
        self.0.backup(dest).await
    }

    async fn restore(&self, source: &Path, copied: Copied<'_>) -> Result<()> {
        self.0.restore(source, copied).await?;
        self.0.sync().await
    }

    async fn auth(&self) -> Result<AuthRecords> {
        // One snapshot, so the records and the revision belong together.
        let mut tx = self.0.read().await?;
        let sql = tx.sql();
        let meta = tx.fetch(Stmt::new(&*sql.auth_meta)).await?;
        let records = AuthRecords {
            users: named_records(tx.fetch(Stmt::new(&*sql.auth_users)).await?)?,
            roles: named_records(tx.fetch(Stmt::new(&*sql.auth_roles)).await?)?,
            ..AuthRecords::default()
        }
        .with_meta(named_values(meta)?);
        tx.commit().await?;
        Ok(records)
    }

    async fn auth_version(&self) -> Result<AuthVersion> {
        let mut session = self.0.read_unpinned().await?;
        let rows = session.fetch(Stmt::new(&*session.sql().auth_meta)).await?;
        Ok(AuthVersion::from_meta(named_values(rows)?))
    }

    async fn replace_auth(&self, expected: AuthVersion, next: &AuthRecords) -> Result<bool> {
        let mut tx = self.0.write().await?;
        let sql = tx.sql();
        let rows = tx.fetch(Stmt::new(&*sql.auth_meta_locked)).await?;
        if AuthVersion::from_meta(named_values(rows)?) != expected {
            return Ok(false);
        }
        tx.queue(Stmt::new(&*sql.delete_auth_users)).await?;
        tx.queue(Stmt::new(&*sql.delete_auth_roles)).await?;
        for (statement, records) in [
            (&sql.insert_auth_user, &next.users),
            (&sql.insert_auth_role, &next.roles),
        ] {
            for (name, record) in records {
                tx.queue(Stmt::new(&**statement).text(name.as_str()).bytes(record))
                    .await?;
            }
        }
        for (name, value) in [
            ("auth_enabled", i64::from(next.enabled)),
            ("auth_revision", next.revision),
        ] {
            tx.queue(Stmt::new(&*sql.set_meta).int(value).text(name))
                .await?;
        }
        tx.commit().await?;
        self.0.sync().await?;
        Ok(true)
    }

    async fn sync(&self) -> Result<()> {
        self.0.sync().await
    }

    async fn check(&self) -> Result<check::Report> {
        let mut tx = self.0.read().await?;
        let report = check::run(&mut tx).await?;
        tx.commit().await?;
        Ok(report)
    }

    fn commit_notifications(
        &self,
    ) -> Option<tokio::sync::watch::Receiver<crate::backend::CommitNotice>> {
        self.0.commit_notifications()
    }

    async fn close(&self) {
        self.0.close().await;
    }
}

/// The one integer a statement of the dialect's [`Sql`] answers.
async fn scalar<S: Session>(
    session: &mut S,
    statement: fn(&Sql) -> &Cow<'static, str>,
) -> Result<i64> {
    let sql = statement(session.sql());
    let rows = session.fetch(Stmt::new(sql.clone())).await?;
    match rows.first() {
        Some(row) => row.int(0),
        None => Err(sqlx::Error::RowNotFound.into()),
    }
}

fn named_values<R: Columns>(rows: Vec<R>) -> Result<Vec<(String, i64)>> {
    rows.iter().map(|r| Ok((r.text(0)?, r.int(1)?))).collect()
}

fn named_records<R: Columns>(rows: Vec<R>) -> Result<Vec<(String, Vec<u8>)>> {
    rows.iter().map(|r| Ok((r.text(0)?, r.bytes(1)?))).collect()
}

fn lease_rows<R: Columns>(rows: Vec<R>) -> Result<Vec<LeaseRow>> {
    rows.iter()
        .map(|r| {
            Ok(LeaseRow {
                id: r.int(0)?,
                ttl: r.int(1)?,
                expires_at: r.int(2)?,
            })
        })
        .collect()
}

/// The end key of a range, empty when there is none (dialects bind it regardless, or not).
pub fn end_key(end: &RangeEnd) -> &[u8] {
    match end {
        RangeEnd::Before(end) => end,
        RangeEnd::Single | RangeEnd::Unbounded => &[],
    }
}
