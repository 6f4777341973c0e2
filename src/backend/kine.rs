//! Reading a kine database (SQLite, PostgreSQL or MySQL) into etcdsql's backup format, so that
//! `etcdsql import --from-kine` can restore it into any backend with revisions preserved.
//!
//! kine keeps one table, `kine`, where each row's `id` is its revision. What it does not keep,
//! this derives while reading the rows in revision order:
//! - bookkeeping rows are left out: `compact_rev_key` (its largest `prev_revision` is the compact
//!   revision) and the `gap-N` rows kine writes to fill holes in its ids;
//! - versions (kine stores none): 1 when a row creates its key, one more per later put, and a
//!   deletion keeps the version the key had. A key whose older rows kine compacted away counts
//!   from its oldest row still there.
//! - which row replaced which, each row's predecessor and its lease;
//! - leases: kine's lease id is the lease's TTL in seconds, and kine keeps no grant time, so each
//!   lease a live key names is restored with its full TTL from the moment of the import.
//!
//! The current revision is kine's largest id (bookkeeping rows included), so revisions stay
//! monotonic for clients that remember them.
//!
//! Invariants: the source is only read; the file written is a complete etcdsql store in the
//! backup format (`backup.rs`), which `Backend::restore` then copies into an empty store in one
//! transaction.

use std::collections::BTreeSet;
use std::path::Path;
use std::str::FromStr;

use sqlx::{ConnectOptions, Connection, Row};

use super::log_file::{Change, Imported, LogFile};
use super::{Error, LeaseRow, Result};

/// kine's name for its compaction bookkeeping rows.
const COMPACT_KEY: &[u8] = b"compact_rev_key";
/// Rows read per query.
const CHUNK: i64 = 5000;

/// One row of kine's table, as every dialect's query returns it.
struct KineRow {
    id: i64,
    name: Vec<u8>,
    /// kine's own flag: trusted only where the key's earlier rows are gone.
    created: bool,
    deleted: bool,
    create_revision: i64,
    lease: i64,
    value: Vec<u8>,
}

/// A connection to the kine database, whichever dialect it speaks.
enum Source {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
    Mysql(sqlx::MySqlConnection),
}

impl Source {
    async fn open(endpoint: &str) -> Result<Self> {
        if let Some(path) = endpoint.strip_prefix("sqlite://") {
            let options =
                sqlx::sqlite::SqliteConnectOptions::from_str(&format!("sqlite://{path}"))?
                    .read_only(true);
            Ok(Source::Sqlite(options.connect().await?))
        } else if endpoint.starts_with("postgres://") || endpoint.starts_with("postgresql://") {
            Ok(Source::Postgres(
                sqlx::PgConnection::connect(endpoint).await?,
            ))
        } else if endpoint.starts_with("mysql://") || endpoint.starts_with("mariadb://") {
            let url = super::mysql::normalize_endpoint(endpoint);
            Ok(Source::Mysql(sqlx::MySqlConnection::connect(&url).await?))
        } else {
            Err(Error::UnsupportedEndpoint(super::redact(endpoint)))
        }
    }

    /// kine's rows with ids after `after`, in id order, at most [`CHUNK`].
    async fn rows(&mut self, after: i64) -> Result<Vec<KineRow>> {
        macro_rules! fetch {
            ($conn:expr, $sql:literal) => {{
                let rows = sqlx::query($sql)
                    .bind(after)
                    .bind(CHUNK)
                    .fetch_all($conn)
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok(KineRow {
                            id: r.try_get(0)?,
                            name: r.try_get(1)?,
                            created: r.try_get::<i64, _>(2)? != 0,
                            deleted: r.try_get::<i64, _>(3)? != 0,
                            create_revision: r.try_get(4)?,
                            lease: r.try_get(5)?,
                            value: r.try_get(6)?,
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, sqlx::Error>>()?
            }};
        }
        // kine declares its columns differently per database (SQLite's `name` is even an
        // INTEGER column holding text): each query casts to one shape.
        Ok(match self {
            Source::Sqlite(conn) => fetch!(
                &mut *conn,
                "SELECT id, CAST(name AS BLOB), COALESCE(created, 0), COALESCE(deleted, 0), \
                 COALESCE(create_revision, 0), COALESCE(lease, 0), COALESCE(value, X'') \
                 FROM kine WHERE id > ?1 ORDER BY id LIMIT ?2"
            ),
            Source::Postgres(conn) => fetch!(
                &mut *conn,
                "SELECT id::bigint, convert_to(name, 'UTF8'), COALESCE(created, 0)::bigint, \
                 COALESCE(deleted, 0)::bigint, \
                 COALESCE(create_revision, 0)::bigint, \
                 COALESCE(lease, 0)::bigint, COALESCE(value, ''::bytea) \
                 FROM kine WHERE id > $1 ORDER BY id LIMIT $2"
            ),
            Source::Mysql(conn) => fetch!(
                &mut *conn,
                "SELECT CAST(id AS SIGNED), CAST(name AS BINARY), \
                 CAST(COALESCE(created, 0) AS SIGNED), CAST(COALESCE(deleted, 0) AS SIGNED), \
                 CAST(COALESCE(create_revision, 0) AS SIGNED), \
                 CAST(COALESCE(lease, 0) AS SIGNED), COALESCE(value, X'') \
                 FROM kine WHERE id > ? ORDER BY id LIMIT ?"
            ),
        })
    }

    /// How many of kine's rows are changes of keys (bookkeeping rows left out).
    async fn changes(&mut self) -> Result<u64> {
        let sql = "SELECT COUNT(*) FROM kine \
                   WHERE name <> 'compact_rev_key' AND name NOT LIKE 'gap-%'";
        let count: i64 = match self {
            Source::Sqlite(conn) => sqlx::query_scalar(sql).fetch_one(conn).await?,
            Source::Postgres(conn) => sqlx::query_scalar(sql).fetch_one(conn).await?,
            Source::Mysql(conn) => sqlx::query_scalar(sql).fetch_one(conn).await?,
        };
        Ok(count.max(0) as u64)
    }

    /// The compact revision kine recorded (0 if it never compacted).
    async fn compact_revision(&mut self) -> Result<i64> {
        let sql = "SELECT COALESCE(MAX(prev_revision), 0) FROM kine WHERE name = 'compact_rev_key'";
        Ok(match self {
            Source::Sqlite(conn) => sqlx::query_scalar(sql).fetch_one(conn).await?,
            Source::Postgres(conn) => {
                sqlx::query_scalar::<_, i64>(
                    "SELECT COALESCE(MAX(prev_revision), 0)::bigint FROM kine \
                     WHERE name = 'compact_rev_key'",
                )
                .fetch_one(conn)
                .await?
            }
            Source::Mysql(conn) => {
                sqlx::query_scalar::<_, i64>(
                    "SELECT CAST(COALESCE(MAX(prev_revision), 0) AS SIGNED) FROM kine \
                     WHERE name = 'compact_rev_key'",
                )
                .fetch_one(conn)
                .await?
            }
        })
    }
}

/// Whether a row is kine's bookkeeping rather than a key's change.
fn bookkeeping(name: &[u8]) -> bool {
    name == COMPACT_KEY || name.starts_with(b"gap-")
}

/// Reads every row of the kine database at `endpoint` and writes the store they describe to a
/// new etcdsql backup file at `dest`; `progress` hears, after each chunk read, how many rows
/// are written and how many there are in all.
///
/// # Errors
/// The source cannot be read (or has no `kine` table), or the file cannot be written.
pub async fn to_file(
    endpoint: &str,
    dest: &Path,
    now_ms: i64,
    mut progress: impl FnMut(u64, u64),
) -> Result<Imported> {
    let mut source = Source::open(endpoint).await?;
    let total = source.changes().await?;
    let compact = source.compact_revision().await?;
    let mut file = LogFile::create(dest).await?;
    let mut current = 0;
    let mut after = 0;
    loop {
        let rows = source.rows(after).await?;
        let Some(last) = rows.last() else { break };
        after = last.id;
        current = current.max(last.id);
        for row in rows.into_iter().filter(|r| !bookkeeping(&r.name)) {
            let before = file.head(&row.name);
            let live_before = before.filter(|h| !h.deleted);
            // A key's first row still there may follow rows kine compacted away: then kine's
            // own flag says whether it created the key.
            let created = !row.deleted
                && match before {
                    Some(_) => live_before.is_none(),
                    None => row.created,
                };
            let version = match (created, live_before) {
                (true, _) | (false, None) => 1,
                (false, Some(h)) if row.deleted => h.version,
                (false, Some(h)) => h.version + 1,
            };
            let create_revision = match live_before {
                _ if created => row.id,
                Some(h) => h.create_revision,
                None if row.create_revision > 0 => row.create_revision,
                None => row.id,
            };
            file.push(Change {
                revision: row.id,
                sub: 0,
                key: row.name,
                created,
                deleted: row.deleted,
                create_revision,
                version,
                lease: row.lease,
                value: row.value,
            })
            .await?;
        }
        progress(file.rows(), total.max(file.rows()));
    }
    let mut imported = Imported {
        rows: file.rows(),
        current_revision: current,
        compact_revision: compact.min(current),
        ..Imported::default()
    };
    let mut ttls = BTreeSet::new();
    for (_, head) in file.live() {
        imported.keys += 1;
        if head.lease > 0 {
            ttls.insert(head.lease);
        }
    }
    let leases: Vec<LeaseRow> = ttls
        .into_iter()
        .map(|ttl| LeaseRow {
            id: ttl,
            ttl,
            expires_at: now_ms.saturating_add(ttl.saturating_mul(1000)),
        })
        .collect();
    imported.leases = leases.len() as u64;
    file.finish(&leases, current, imported.compact_revision)
        .await?;
    Ok(imported)
}
