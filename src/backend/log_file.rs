//! A store written row by row into a backup-format file, for the importers: each source hands
//! over its changes in revision order with what it knows of them (key, value, lease, version,
//! create revision), and the file derives what the log keeps beside them — each row's
//! predecessor and the lease the key had before.
//!
//! Invariants: rows arrive in revision order per key (a key's rows never go back in time);
//! every row is written once; the file is one SQLite transaction, so a failed import leaves no
//! half-written file that `restore` would accept.

use std::collections::HashMap;
use std::path::Path;

use sqlx::pool::PoolConnection;
use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::{LeaseRow, Result};

/// Rows per multi-row INSERT (13 parameters each, under SQLite's oldest limit of 999).
const CHUNK: usize = 64;

/// What an import did, for its report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Rows of the log written.
    pub rows: u64,
    /// Keys live at the current revision.
    pub keys: u64,
    pub leases: u64,
    pub current_revision: i64,
    pub compact_revision: i64,
}

/// One change of one key, as an importer's source describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub revision: i64,
    /// Position inside the revision (etcd's sub-revision).
    pub sub: i64,
    pub key: Vec<u8>,
    /// This change created the key (it had no live version before).
    pub created: bool,
    pub deleted: bool,
    pub create_revision: i64,
    /// Version after a put; for a deletion, the version the key had.
    pub version: i64,
    pub lease: i64,
    pub value: Vec<u8>,
}

/// What the file knows of a key from its rows so far.
#[derive(Clone, Copy, Debug)]
pub struct Head {
    pub revision: i64,
    pub sub: i64,
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
    pub deleted: bool,
}

/// A row waiting for its INSERT.
struct Pending {
    change: Change,
    prev_revision: i64,
    old_lease: i64,
}

/// The file being written; [`LogFile::finish`] commits it.
pub struct LogFile {
    pool: SqlitePool,
    conn: PoolConnection<Sqlite>,
    heads: HashMap<Vec<u8>, Head>,
    pending: Vec<Pending>,
    rows: u64,
}

impl LogFile {
    /// Creates the file at `path` with etcdsql's schema and opens its transaction.
    ///
    /// # Errors
    /// The file cannot be created.
    pub async fn create(path: &Path) -> Result<Self> {
        let pool = super::backup::open_file(path).await?;
        let mut conn = pool.acquire().await?;
        sqlx::query("BEGIN").execute(&mut *conn).await?;
        Ok(Self {
            pool,
            conn,
            heads: HashMap::new(),
            pending: Vec::with_capacity(CHUNK),
            rows: 0,
        })
    }

    /// What the rows so far say of `key`.
    pub fn head(&self, key: &[u8]) -> Option<Head> {
        self.heads.get(key).copied()
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Adds the next change of its key.
    ///
    /// # Errors
    /// The file cannot be written.
    pub async fn push(&mut self, change: Change) -> Result<()> {
        let before = self.heads.insert(
            change.key.clone(),
            Head {
                revision: change.revision,
                sub: change.sub,
                create_revision: change.create_revision,
                version: change.version,
                lease: change.lease,
                deleted: change.deleted,
            },
        );
        self.pending.push(Pending {
            prev_revision: before.map_or(0, |h| h.revision),
            old_lease: before.filter(|h| !h.deleted).map_or(0, |h| h.lease),
            change,
        });
        self.rows += 1;
        if self.pending.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut insert = QueryBuilder::<Sqlite>::new(
            "INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
             prev_revision, version, lease, value, old_value, old_lease) ",
        );
        insert.push_values(&self.pending, |mut out, row| {
            let c = &row.change;
            out.push_bind(c.revision)
                .push_bind(c.sub)
                .push_bind(c.key.as_slice())
                .push_bind(c.created)
                .push_bind(c.deleted)
                .push_bind(c.create_revision)
                .push_bind(row.prev_revision)
                .push_bind(c.version)
                .push_bind(c.lease)
                .push_bind(c.value.as_slice())
                .push_bind(None::<Vec<u8>>)
                .push_bind(row.old_lease);
        });
        insert.build().execute(&mut *self.conn).await?;
        self.pending.clear();
        Ok(())
    }

    /// Live keys (their newest row is not a deletion) and the leases they name.
    pub fn live(&self) -> impl Iterator<Item = (&[u8], &Head)> {
        self.heads
            .iter()
            .filter(|(_, h)| !h.deleted)
            .map(|(k, h)| (k.as_slice(), h))
    }

    /// Writes the leases and the counters and commits the file.
    ///
    /// # Errors
    /// The file cannot be written.
    pub async fn finish(mut self, leases: &[LeaseRow], current: i64, compact: i64) -> Result<()> {
        self.flush().await?;
        for lease in leases {
            sqlx::query("INSERT INTO leases (id, ttl, expires_at) VALUES (?1, ?2, ?3)")
                .bind(lease.id)
                .bind(lease.ttl)
                .bind(lease.expires_at)
                .execute(&mut *self.conn)
                .await?;
        }
        for (name, value) in [
            ("current_revision", current.max(1)),
            ("compact_revision", compact),
        ] {
            sqlx::query("UPDATE meta SET value = ?1 WHERE name = ?2")
                .bind(value)
                .bind(name)
                .execute(&mut *self.conn)
                .await?;
        }
        sqlx::query("COMMIT").execute(&mut *self.conn).await?;
        drop(self.conn);
        self.pool.close().await;
        Ok(())
    }
}
