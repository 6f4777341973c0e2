//! Storage backends: the only code in etcdsql that speaks SQL.
//!
//! A backend stores the revision log (one [`LogRow`] per change of one key) and a little scalar
//! state (current and compact revision, cluster id). It knows nothing of etcd's API: the MVCC
//! layer above decides what to write; a backend only answers these questions and applies rows.
//!
//! Invariants every backend keeps:
//! - A [`ReadTxn`] is a consistent snapshot: the revisions it reports and the rows it returns
//!   come from one committed state.
//! - A [`WriteTxn`] is exclusive: while it is open no other writer commits, so the revision it
//!   reads as current is the one it will extend. Nothing it wrote is visible before `commit`.
//! - Keys compare byte-wise, in every query and index.
//! - A row's `prev_revision` names the key's row before it. PostgreSQL and MySQL also record
//!   which later row replaced each row, when [`WriteTxn::insert_rows`] writes a row that names
//!   it: in the replaced row (`superseded_by`, MySQL) or, so that the log stays append-only, in
//!   tables of their own (PostgreSQL: `kv_head` holds each key's newest row, `kv_replaced` the
//!   replacements by the revision that made them), so that their reads at a revision never
//!   search a key's history: a read at the current revision walks the newest rows in key
//!   order, a read at an older revision adds the few rows replaced since, and the cost of both
//!   grows with the rows returned, not with the history kept. Other instances on the same
//!   database read that way.
//! - SQLite keeps the log alone, keyed by revision, so a write touches nothing in key order.
//!   Its one process reads by key from its in-memory index (built at start from the log in
//!   revision order, [`ReadTxn::heads`]); its SQL reads by key read the log up to the
//!   revision, for the reads that index cannot answer. Compaction finds the rows a change
//!   replaced through that change's `prev_revision`.

use async_trait::async_trait;

/// One change of one key at one revision: a row of the log table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRow {
    pub revision: i64,
    /// Position of the change inside its revision (etcd's sub-revision).
    pub sub: i64,
    pub key: Vec<u8>,
    pub created: bool,
    pub deleted: bool,
    pub create_revision: i64,
    pub prev_revision: i64,
    /// Version after a put; for a tombstone, the version the key had when it was deleted.
    pub version: i64,
    pub lease: i64,
    pub value: Vec<u8>,
    /// Value before this change, `None` when the key was absent.
    pub old_value: Option<Vec<u8>>,
    pub old_lease: i64,
}

/// Hears how many rows a long copy has written so far.
pub type Copied<'a> = &'a (dyn Fn(u64) + Send + Sync);

/// A lease as stored: its granted TTL and absolute deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub id: i64,
    /// Granted TTL in seconds; a keep-alive renews the lease to this.
    pub ttl: i64,
    /// Deadline in Unix milliseconds.
    pub expires_at: i64,
}

/// Where a key range ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeEnd {
    /// Only the start key itself.
    Single,
    /// Every key at or after the start key (etcd's `range_end = "\0"`).
    Unbounded,
    /// Keys before this one (exclusive).
    Before(Vec<u8>),
}

/// A scan of the live keys in a range as of one revision.
#[derive(Clone, Debug)]
pub struct Scan<'a> {
    pub key: &'a [u8],
    pub end: &'a RangeEnd,
    pub revision: i64,
    /// At most this many rows; `None` for all.
    pub limit: Option<i64>,
    /// Leave `value` empty (the caller only wants keys).
    pub keys_only: bool,
}

/// The store's revision counters, read together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Revisions {
    pub current: i64,
    pub compact: i64,
    /// The revision of the newest history fence (0: none): see [`crate::mvcc`]'s fence.
    pub fence: i64,
}

/// What a write transaction read in the round trip that began it ([`Backend::write_from`]).
#[derive(Debug)]
pub struct Opening {
    /// The revisions, read under the writers' lock.
    pub revisions: Revisions,
    /// The rows of revisions `(after, through]` as [`ReadTxn::changes`] reads them: what other
    /// processes committed since the revision the caller named.
    pub changes: Vec<LogRow>,
    pub after: i64,
    /// At `revisions.current`, or below it when more was committed than one opening reads.
    pub through: i64,
}

/// What a database's commit notifications say ([`Backend::commit_notifications`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitNotice {
    /// The newest revision announced (by any process, this one included).
    pub revision: i64,
    /// How many times the notifications were re-established after being lost. Whatever was
    /// committed meanwhile went unannounced, and the database may even have moved to a server
    /// with a shorter history, so a change here means "look", whatever `revision` says.
    pub resumed: u64,
}

/// etcd's auth store as the database keeps it: the records are authpb protobuf, which only
/// `crate::auth` reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthRecords {
    pub enabled: bool,
    pub revision: i64,
    /// (name, encoded `authpb.User`), by name.
    pub users: Vec<(String, Vec<u8>)>,
    /// (name, encoded `authpb.Role`), by name.
    pub roles: Vec<(String, Vec<u8>)>,
}

/// Which state of the auth store a copy is of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthVersion {
    pub enabled: bool,
    pub revision: i64,
}

impl AuthRecords {
    pub fn version(&self) -> AuthVersion {
        AuthVersion {
            enabled: self.enabled,
            revision: self.revision,
        }
    }
}

impl AuthVersion {
    /// The version from the rows `(name, value)` of `auth_enabled` and `auth_revision`.
    fn from_meta(rows: Vec<(String, i64)>) -> Self {
        AuthRecords::default().with_meta(rows).version()
    }
}

mod backup;
pub mod core;
pub mod kine;
pub mod log_file;

pub use core::check::Report as CheckReport;
pub mod mysql;
pub mod postgres;
pub mod sqlite;

impl AuthRecords {
    /// The flags from the rows `(name, value)` of `auth_enabled` and `auth_revision` (both
    /// exist from the migration on).
    fn with_meta(mut self, rows: Vec<(String, i64)>) -> Self {
        for (name, value) in rows {
            match name.as_str() {
                "auth_enabled" => self.enabled = value != 0,
                _ => self.revision = value,
            }
        }
        self
    }
}

/// Sizes reported by Maintenance.Status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DbSize {
    pub total: i64,
    pub in_use: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "unsupported endpoint {0:?}: expected sqlite://PATH, postgres://USER@HOST/DB or mysql://USER@HOST/DB"
    )]
    UnsupportedEndpoint(String),
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("no PostgreSQL host of the endpoint can be used: {0}")]
    NoPrimary(String),
    #[error("cannot create the database folder {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open the write-ahead log {path}: {source}")]
    OpenWal {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open the database file {path}: {source}")]
    OpenDatabase {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot register SQLite's file layer for the writer (SQLite result code {0})")]
    Vfs(std::ffi::c_int),
    #[error("cannot make the write-ahead log durable: {0}")]
    Sync(std::io::Error),
    #[error("the data store is not empty: a backup restores only into an empty one")]
    NotEmpty,
    /// A write transaction found the database past the revision its writer presumed (see
    /// [`Backend::write_presuming`]): another process committed meanwhile. Nothing was written.
    #[error("the database is past revision {presumed}: another process committed meanwhile")]
    Moved { presumed: i64 },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// See [`Error::Moved`].
    pub fn is_moved(&self) -> bool {
        matches!(self, Error::Moved { .. })
    }

    /// The database refused a row as too large for its index (PostgreSQL's
    /// `program_limit_exceeded`), which a shorter or more compressible key avoids.
    pub fn is_key_too_large(&self) -> bool {
        match self {
            Error::Sql(sqlx::Error::Database(e)) => e.code().as_deref() == Some("54000"),
            _ => false,
        }
    }
}

/// A database holding the log.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Opens a consistent read snapshot.
    async fn read(&self) -> Result<Box<dyn ReadTxn>>;
    /// Opens a reader whose statements each see the newest commit as they start, with no
    /// snapshot shared between them: cheaper than [`Backend::read`] where a backend can skip
    /// beginning a transaction. Only for reads pinned to a revision the caller knows to be
    /// committed, whose rows therefore cannot change under them (except by compaction, which
    /// the caller must rule out); `revisions` on it is not consistent with its other answers.
    async fn read_unpinned(&self) -> Result<Box<dyn ReadTxn>> {
        self.read().await
    }
    /// The current and compact revisions as of the newest commit, in one round trip where the
    /// backend can answer outside a transaction.
    async fn revisions(&self) -> Result<Revisions> {
        self.read().await?.revisions().await
    }
    /// The values of committed rows `(key, revision)`, `None` for a row not in the log
    /// (compacted away), in one round trip where the backend can answer outside a transaction.
    async fn values(&self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>> {
        self.read_unpinned().await?.values_at(rows).await
    }
    /// Whether this process is the database's only writer, so that what its own writer
    /// committed is exactly the database's state (SQLite: one process owns the file).
    fn sole_writer(&self) -> bool {
        false
    }
    /// The longest key the database can hold, if it has a fixed limit (MySQL's key column;
    /// PostgreSQL's index entries are bounded after compression, so no length says it, and
    /// SQLite has none).
    fn max_key_bytes(&self) -> Option<usize> {
        None
    }
    /// Keys longer than this may be refused only when written (PostgreSQL's index entries are
    /// bounded after compression, so only the database can tell): the writer runs a txn
    /// with such a key in a batch of its own, so that a refusal fails it alone
    /// ([`Error::is_key_too_large`]).
    fn checked_key_bytes(&self) -> Option<usize> {
        None
    }
    /// The revisions and [`ReadTxn::changes`] in `(after, through]`, from one snapshot: what the
    /// watch hub reads of other processes' commits, in one round trip where the backend can.
    async fn read_changes(&self, after: i64, through: i64) -> Result<(Revisions, Vec<LogRow>)>;
    /// Opens the one write transaction; waits while another is open.
    async fn write(&self) -> Result<Box<dyn WriteTxn>>;
    /// A write transaction for a writer that presumes the database's current revision is
    /// `current`, as its own last commit left it: until a statement needs the transaction, none
    /// is begun, and a batch's rows and revision ([`WriteTxn::append`]) then go in one
    /// statement that takes the writers' lock, checks the presumption and writes, committing as
    /// it returns (one round trip where an open transaction takes three). Whatever begins the
    /// transaction, and a commit with nothing appended, checks it too. A wrong presumption
    /// fails with [`Error::Moved`], having written nothing; `None`: the backend cannot presume.
    async fn write_presuming(&self, _current: i64) -> Result<Option<Box<dyn WriteTxn>>> {
        Ok(None)
    }
    /// Opens the write transaction as [`Backend::write`] does and, where the backend can, reads
    /// in the same round trip what a writer whose key index is at revision `after` reads first:
    /// the revisions and the changes since `after`. `None`: the caller reads them itself.
    async fn write_from(&self, after: i64) -> Result<(Box<dyn WriteTxn>, Option<Opening>)>;
    /// The cluster id, chosen once when the database was created.
    async fn cluster_id(&self) -> Result<u64>;
    async fn size(&self) -> Result<DbSize>;
    /// Physically removes rows that compaction to `compact` made invisible and that a change with
    /// a revision in `(after, through]` superseded; see `mvcc::compactor` for the rule.
    /// Records `through` as done. Returns the number of rows removed.
    async fn compact_window(&self, compact: i64, after: i64, through: i64) -> Result<u64>;
    /// The revision up to which physical compaction has finished.
    async fn compacted_through(&self) -> Result<i64>;
    /// Gives the space of deleted rows back to the system, as etcd's defragment does. SQLite
    /// rebuilds its file, holding writes off meanwhile; PostgreSQL vacuums the tables beside
    /// ongoing writes.
    async fn defragment(&self) -> Result<()>;
    /// The alarms raised (etcd's alarm type numbers), shared by every process on the database.
    async fn alarms(&self) -> Result<Vec<i32>>;
    /// Raises or clears an alarm; whether that changed anything.
    async fn set_alarm(&self, alarm: i32, raise: bool) -> Result<bool>;
    /// Writes a consistent copy of the whole store to a new SQLite file at `dest` (see
    /// `backup.rs`), while the store keeps serving.
    async fn backup(&self, dest: &std::path::Path) -> Result<()>;
    /// Copies the backup at `source` into this store, which must be empty, in one transaction;
    /// `copied` hears how many log rows are in after each chunk.
    async fn restore(&self, source: &std::path::Path, copied: Copied<'_>) -> Result<()>;
    /// The whole auth store.
    async fn auth(&self) -> Result<AuthRecords>;
    /// Whether auth is on, and the auth revision: enough to learn cheaply whether another
    /// instance changed the store (turning auth on leaves the revision alone).
    async fn auth_version(&self) -> Result<AuthVersion>;
    /// Replaces the auth store with `next`, durably, if it is still at `expected`; returns
    /// whether it did. Instances on one database change it one at a time.
    async fn replace_auth(&self, expected: AuthVersion, next: &AuthRecords) -> Result<bool>;
    /// Checks the log's bookkeeping in one snapshot (see `core::check`).
    async fn check(&self) -> Result<CheckReport>;
    /// Makes every write transaction committed so far durable. A backend whose commit is durable
    /// by itself (PostgreSQL) has nothing to do; SQLite's commit only writes, and this fsyncs.
    async fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// Wake-ups for commits made by other processes sharing the database, if the database can
    /// push them (PostgreSQL's LISTEN/NOTIFY); `None` means the watch hub must poll.
    fn commit_notifications(&self) -> Option<tokio::sync::watch::Receiver<CommitNotice>> {
        None
    }
    async fn close(&self);
}

/// [`ReadTxn::heads_and_changes`] as two reads.
pub(crate) async fn heads_then_changes<T: ReadTxn + ?Sized>(
    tx: &mut T,
    after: i64,
    through: i64,
) -> Result<(Vec<LogRow>, Vec<LogRow>)> {
    let heads = tx.heads().await?;
    let since = match after < through {
        true => tx.change_keys(after, through).await?,
        false => Vec::new(),
    };
    Ok((heads, since))
}

/// Queries against one consistent state.
#[async_trait]
pub trait ReadTxn: Send {
    async fn revisions(&mut self) -> Result<Revisions>;
    /// Live (not deleted) keys of the range as of `scan.revision`, in key order.
    async fn scan(&mut self, scan: &Scan<'_>) -> Result<Vec<LogRow>>;
    /// How many live keys the range holds as of `revision`.
    async fn count(&mut self, key: &[u8], end: &RangeEnd, revision: i64) -> Result<i64>;
    /// The newest row of `key`, tombstone or not.
    async fn latest(&mut self, key: &[u8]) -> Result<Option<LogRow>>;
    /// The newest row of every key in the log, tombstones included, in no particular order;
    /// `value` and `old_value` are left empty (the writer's key index needs only the rest).
    async fn heads(&mut self) -> Result<Vec<LogRow>>;
    /// The values of the rows `(key, revision)`, in the order asked; `None` where there is no
    /// such row. One round trip for many keys, so the writer fetches a batch's old values at once.
    async fn values_at(&mut self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>>;
    /// Every change with a revision in `(after, through]`, in revision and sub-revision order,
    /// `old_value` included (the watch hub's prev_kv).
    async fn changes(&mut self, after: i64, through: i64) -> Result<Vec<LogRow>>;
    /// [`ReadTxn::changes`] without `value` and `old_value` (left empty): what the writer's key
    /// index takes in of other processes' commits, at a fraction of the bytes.
    async fn change_keys(&mut self, after: i64, through: i64) -> Result<Vec<LogRow>>;
    /// [`ReadTxn::heads`], and [`ReadTxn::change_keys`] of `(after, through]` (none if that is
    /// empty): one read of the log where a backend finds its heads by reading all of it.
    async fn heads_and_changes(
        &mut self,
        after: i64,
        through: i64,
    ) -> Result<(Vec<LogRow>, Vec<LogRow>)> {
        heads_then_changes(self, after, through).await
    }
    async fn lease(&mut self, id: i64) -> Result<Option<LeaseRow>>;
    async fn leases(&mut self) -> Result<Vec<LeaseRow>>;
    /// The live keys attached to lease `id` (not 0) as of `revision`, in key order.
    async fn lease_keys(&mut self, id: i64, revision: i64) -> Result<Vec<LogRow>>;
    /// Leases whose deadline is at or before `now`, earliest first, at most `limit`.
    async fn expired_leases(&mut self, now: i64, limit: i64) -> Result<Vec<LeaseRow>>;
    /// The earliest lease deadline, if any lease exists.
    async fn next_expiry(&mut self) -> Result<Option<i64>>;
}

/// The exclusive write transaction. Dropping it without `commit` rolls everything back.
#[async_trait]
pub trait WriteTxn: ReadTxn {
    /// Appends rows, in order, in as few statements as the database allows; each marks the
    /// key's row at its `prev_revision` (if not 0) as replaced by it, so `prev_revision` must name
    /// the key's newest row (which may be an earlier row of the same call).
    async fn insert_rows(&mut self, rows: &[LogRow]) -> Result<()>;
    async fn set_current_revision(&mut self, revision: i64) -> Result<()>;
    /// [`ReadTxn::values_at`] of rows the writer's key index names as current. A transaction not
    /// yet begun ([`Backend::write_presuming`]) reads them without beginning, outside the
    /// writers' lock (the rows cannot change, and its append finds any newer row of their keys
    /// another process wrote), and fails with [`Error::Moved`] if one is missing.
    async fn values_ahead(&mut self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>>;
    /// Which of the leases `ids` exist. A transaction not yet begun
    /// ([`Backend::write_presuming`]) reads them without beginning, outside the writers' lock:
    /// its [`WriteTxn::append`] checks those the batch relied on again.
    async fn leases_ahead(&mut self, ids: &[i64]) -> Result<Vec<i64>>;
    /// [`WriteTxn::insert_rows`], then [`WriteTxn::set_current_revision`]: a batch's last
    /// writes, which a backend may send in fewer round trips together, and may check that the
    /// current revision is still `before`, the batch's first, and that the leases its rows were
    /// attached to (`leases`, read by [`WriteTxn::leases_ahead`]) still exist. A transaction not
    /// yet begun ([`Backend::write_presuming`]) writes and commits here; its `commit` then ends
    /// it.
    async fn append(
        &mut self,
        rows: &[LogRow],
        _before: i64,
        current: i64,
        _leases: &[i64],
    ) -> Result<()> {
        self.insert_rows(rows).await?;
        self.set_current_revision(current).await
    }
    async fn set_compact_revision(&mut self, revision: i64) -> Result<()>;
    async fn set_fence_revision(&mut self, revision: i64) -> Result<()>;
    /// Stores a new lease; `false` if its id is taken.
    async fn insert_lease(&mut self, lease: &LeaseRow) -> Result<bool>;
    /// Moves a lease's deadline; `false` if it does not exist.
    async fn set_lease_expiry(&mut self, id: i64, expires_at: i64) -> Result<bool>;
    /// `false` if it did not exist.
    async fn delete_lease(&mut self, id: i64) -> Result<bool>;
    /// Marks a point that `rollback_to_savepoint` returns to; nested savepoints are not needed.
    async fn savepoint(&mut self) -> Result<()>;
    async fn release_savepoint(&mut self) -> Result<()>;
    async fn rollback_to_savepoint(&mut self) -> Result<()>;
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// Connection pool settings for backends that have a server (PostgreSQL, MySQL).
#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub max_connections: u32,
    pub idle_timeout: std::time::Duration,
    pub connect_timeout: std::time::Duration,
    /// SQLite only: the WAL size past which the writer starts the WAL over.
    pub sqlite_wal_restart_bytes: i64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            idle_timeout: std::time::Duration::from_secs(300),
            connect_timeout: std::time::Duration::from_secs(5),
            sqlite_wal_restart_bytes: sqlite::DEFAULT_WAL_RESTART_BYTES,
        }
    }
}

/// The endpoint with any password replaced, for logs.
pub fn redact(endpoint: &str) -> String {
    match (endpoint.find("://"), endpoint.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &endpoint[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &endpoint[..scheme + 3],
                    &userinfo[..colon],
                    &endpoint[at..]
                ),
                None => endpoint.to_owned(),
            }
        }
        _ => endpoint.to_owned(),
    }
}

/// Opens the backend an endpoint URL names.
///
/// # Errors
/// An unknown scheme, an unreachable database, or a failed migration.
pub async fn open(endpoint: &str, pool: &PoolOptions) -> Result<std::sync::Arc<dyn Backend>> {
    use core::SqlBackend;
    if let Some(path) = endpoint.strip_prefix("sqlite://") {
        Ok(std::sync::Arc::new(SqlBackend(
            sqlite::Sqlite::open(path, pool.sqlite_wal_restart_bytes).await?,
        )))
    } else if endpoint.starts_with("postgres://") || endpoint.starts_with("postgresql://") {
        Ok(std::sync::Arc::new(SqlBackend(
            postgres::Postgres::open(endpoint, pool).await?,
        )))
    } else if endpoint.starts_with("mysql://") || endpoint.starts_with("mariadb://") {
        Ok(std::sync::Arc::new(SqlBackend(
            mysql::Mysql::open(endpoint, pool).await?,
        )))
    } else {
        Err(Error::UnsupportedEndpoint(redact(endpoint)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://user:secret@host/db"),
            "postgres://user:***@host/db"
        );
        assert_eq!(redact("sqlite://./db/state.db"), "sqlite://./db/state.db");
    }
}
