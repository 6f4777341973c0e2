//! A SQLite database written by an earlier schema keeps working after the server migrates it:
//! rows written before migration 0004 carry their old value and were indexed by name, rows
//! written after carry neither. Reads at old revisions and watches with prev_kv see both kinds.
//! Migration 0007 moves which row replaced which out of the rows into tables of their own;
//! compaction and `etcdsql check` then work on what it moved. PostgreSQL's migration 0006 does
//! the same for a PostgreSQL database. SQLite's migration 0008 drops those tables again: the
//! log alone says it, and a database the previous release had moved to them keeps working.
//! A database keeps the page size it was created with (4 KiB before), while new ones get 1 KiB.

mod common;

use std::time::Duration;

use common::{TestServer, etcdsql_tool, log_rows, on_postgres, shared_database, test_endpoint};
use etcd_client::{CompactionOptions, EventType, GetOptions, WatchOptions, WatchStream};

/// (type, key, value, prev value) of every event until `want` have arrived.
async fn events(stream: &mut WatchStream, want: usize) -> Vec<(EventType, String, String, String)> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut out = Vec::new();
    while out.len() < want {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("a watch response in time")
            .unwrap()
            .expect("the stream is open");
        for e in r.events() {
            let kv = e.kv().unwrap();
            let prev = e.prev_kv().map_or(String::from("-"), |p| text(p.value()));
            out.push((e.event_type(), text(kv.key()), text(kv.value()), prev));
        }
    }
    out
}

/// Migrates the store on `$pool` with the older migrations in `$old`, writes [`OLD_ROWS`] as
/// `$select` gives them, and makes their last revision current, as the older release would have.
macro_rules! old_store {
    ($pool:expr, $old:expr, $select:expr) => {{
        sqlx::migrate::Migrator::new($old.as_path())
            .await
            .unwrap()
            .run(&$pool)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
             prev_revision, version, lease, value, old_value, old_lease, superseded_by) {}",
            $select
        )))
        .execute(&$pool)
        .await
        .unwrap();
        sqlx::query("UPDATE meta SET value = 5 WHERE name = 'current_revision'")
            .execute(&$pool)
            .await
            .unwrap();
        $pool.close().await;
    }};
}

/// SQLite's migrations up to 0006, when every row recorded its replacement in place
/// (`superseded_by`).
const SQLITE_TO_0006: [&str; 6] = [
    "0001_log.sql",
    "0002_leases.sql",
    "0003_superseded.sql",
    "0004_heads.sql",
    "0005_auth.sql",
    "0006_fence.sql",
];

#[tokio::test]
async fn a_database_from_before_migration_0004_reads_and_watches_as_written() {
    // Rows then carried their old value and were indexed by name.
    sqlite_reads_and_watches_as_written(&SQLITE_TO_0006[..3], &[]).await;
}

#[tokio::test]
async fn a_database_from_before_migration_0007_reads_and_watches_as_written() {
    sqlite_reads_and_watches_as_written(&SQLITE_TO_0006, &[]).await;
}

#[tokio::test]
async fn a_database_from_before_migration_0008_reads_and_watches_as_written() {
    // The previous release: its start moved the replacements into kv_head and kv_replaced.
    sqlite_reads_and_watches_as_written(&SQLITE_TO_0006, &["0007_head_and_replaced_tables.sql"])
        .await;
}

#[tokio::test]
async fn a_postgres_database_from_before_migration_0006_reads_and_watches_as_written() {
    if !on_postgres() {
        return;
    }
    // The previous release: every row recorded its replacement in place (`superseded_by`).
    let dir = tempfile::tempdir().unwrap();
    let url = test_endpoint(dir.path());
    <sqlx::Postgres as sqlx::migrate::MigrateDatabase>::create_database(&url)
        .await
        .unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let old = older_migrations(
        dir.path(),
        "postgres",
        &[
            "0001_log.sql",
            "0002_leases.sql",
            "0003_superseded.sql",
            "0004_auth.sql",
            "0005_fence.sql",
        ],
    );
    // The rows typed as PostgreSQL's log has them.
    old_store!(
        pool,
        old,
        format!(
            "SELECT column1, 0, convert_to(column2, 'UTF8'), column3::int::boolean, \
             column4::int::boolean, column5, column6, column7, 0, convert_to(column8, 'UTF8'), \
             convert_to(column9, 'UTF8'), 0, column10 FROM (VALUES {OLD_ROWS}) AS v"
        )
    );
    reads_and_watches_as_written(dir.path(), &url).await;
}

/// Revisions 2..=5 as an older release wrote them: put a=a1, put a=a2, delete a, put b=b1.
/// Each tuple: revision, key, created, deleted, create revision, previous revision, version,
/// value, old value, and the revision that replaced the row.
const OLD_ROWS: &str = "\
    (2, '/u/a', 1, 0, 2, 0, 1, 'a1', NULL, 3), \
    (3, '/u/a', 0, 0, 2, 2, 2, 'a2', 'a1', 4), \
    (4, '/u/a', 0, 1, 2, 3, 2, '', 'a2', NULL), \
    (5, '/u/b', 1, 0, 5, 0, 1, 'b1', NULL, NULL)";

/// A folder in `dir` holding the named migrations of `backend`, as an older release had them.
fn older_migrations(dir: &std::path::Path, backend: &str, names: &[&str]) -> std::path::PathBuf {
    let old = dir.join("migrations");
    std::fs::create_dir(&old).unwrap();
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
    for name in names {
        std::fs::copy(from.join(name), old.join(name)).unwrap();
    }
    old
}

/// A SQLite database as the server left it after `migrations`, applied by sqlx so that the
/// server recognises them, with rows as that server wrote them, and then migrated by `then`
/// as a later release did on its start: see [`reads_and_watches_as_written`]. It also keeps
/// its page size.
async fn sqlite_reads_and_watches_as_written(migrations: &[&str], then: &[&str]) {
    if shared_database() {
        return; // MySQL's schema did not change this way; PostgreSQL has its own test.
    }
    let dir = tempfile::tempdir().unwrap();
    let old = older_migrations(dir.path(), "sqlite", migrations);
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("state.db").display()
    );
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    // Keys and values are blobs.
    old_store!(
        pool,
        old,
        format!(
            "SELECT column1, 0, CAST(column2 AS BLOB), column3, column4, column5, column6, \
             column7, 0, CAST(column8 AS BLOB), CAST(column9 AS BLOB), 0, column10 FROM (VALUES \
             {OLD_ROWS})"
        )
    );
    if !then.is_empty() {
        let later_dir = dir.path().join("later");
        std::fs::create_dir(&later_dir).unwrap();
        let later = older_migrations(&later_dir, "sqlite", &[migrations, then].concat());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::migrate::Migrator::new(later.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
    reads_and_watches_as_written(dir.path(), &url).await;
    assert_eq!(
        page_size(&url).await,
        4096,
        "the old database keeps its pages"
    );
}

/// The store at `url` (in `dir`), holding [`OLD_ROWS`] as an older release wrote them, reads
/// and watches as written once the server has migrated it, compacts, and passes
/// `etcdsql check`.
async fn reads_and_watches_as_written(dir: &std::path::Path, url: &str) {
    let server = TestServer::start(dir).await;
    let mut c = server.client().await;
    let value_at = |revision| GetOptions::new().with_revision(revision);
    for (revision, want) in [(2, Some("a1")), (3, Some("a2")), (4, None), (5, None)] {
        let got = c.get("/u/a", Some(value_at(revision))).await.unwrap();
        let value = got
            .kvs()
            .first()
            .map(|kv| kv.value_str().unwrap().to_owned());
        assert_eq!(value.as_deref(), want, "/u/a at revision {revision}");
    }
    // Written after the migration: no old value of its own.
    c.put("/u/b", "b2", None).await.unwrap();
    c.put("/u/a", "a3", None).await.unwrap();
    let b = c.get("/u/b", Some(value_at(5))).await.unwrap();
    assert_eq!(b.kvs()[0].value(), b"b1");

    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(2)
        .with_prev_key();
    let mut stream = c.watch("/u/", Some(options)).await.unwrap();
    let owned =
        |(t, k, v, p): (EventType, &str, &str, &str)| (t, k.to_owned(), v.to_owned(), p.to_owned());
    let want: Vec<_> = [
        (EventType::Put, "/u/a", "a1", "-"),
        (EventType::Put, "/u/a", "a2", "a1"),
        (EventType::Delete, "/u/a", "", "a2"),
        (EventType::Put, "/u/b", "b1", "-"),
        (EventType::Put, "/u/b", "b2", "b1"),
        // Re-created after its deletion: no previous version.
        (EventType::Put, "/u/a", "a3", "-"),
    ]
    .into_iter()
    .map(owned)
    .collect();
    assert_eq!(events(&mut stream, want.len()).await, want);
    // A range at each old revision (from the window of history the start read from the log).
    for (revision, want) in [
        (2, vec!["a1"]),
        (4, vec![]),
        (5, vec!["b1"]),
        (6, vec!["b2"]),
    ] {
        let got = c
            .get("/u/", Some(value_at(revision).with_prefix()))
            .await
            .unwrap();
        let values: Vec<&str> = got.kvs().iter().map(|kv| kv.value_str().unwrap()).collect();
        assert_eq!(values, want, "/u/ at revision {revision}");
    }
    // Compaction removes the migrated rows it should, and the store stays consistent.
    let current = c
        .put("/u/c", "c1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    c.compact(current, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let got = c
        .get("/u/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let values: Vec<&str> = got.kvs().iter().map(|kv| kv.value_str().unwrap()).collect();
    assert_eq!(values, ["a3", "b2", "c1"]);
    server.stop().await;
    let (status, text) = etcdsql_tool(&["check", url]);
    assert_eq!(status, 0, "{text}");
    assert_eq!(log_rows(url).await, 3, "only each key's newest row is left");
}

async fn page_size(url: &str) -> i64 {
    let pool = sqlx::SqlitePool::connect(url).await.unwrap();
    let size = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    size
}

#[tokio::test]
async fn a_new_database_has_small_pages_and_keeps_values_larger_than_one() {
    if shared_database() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Values from empty to many pages long, each byte pattern distinct, so that a value read
    // from the wrong overflow page shows.
    let values: Vec<Vec<u8>> = [0usize, 1, 900, 1024, 1500, 4096, 10_000, 200_000]
        .iter()
        .enumerate()
        .map(|(i, &len)| (0..len).map(|j| (j * 31 + i * 7) as u8).collect())
        .collect();
    // Each value overwritten by a longer one, so the first versions are rows a later row
    // replaced.
    let later: Vec<Vec<u8>> = values
        .iter()
        .enumerate()
        .map(|(i, value)| [value.as_slice(), &[i as u8]].concat())
        .collect();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for versions in [&values, &later] {
        for (i, value) in versions.iter().enumerate() {
            c.put(format!("/p/{i}"), value.clone(), None).await.unwrap();
        }
    }
    server.stop().await;
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    assert_eq!(page_size(&url).await, 1024);

    // After a restart every version comes from the file, the first ones at their revision.
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let first = c.get("/p/0", None).await.unwrap().kvs()[0].create_revision();
    for (i, value) in values.iter().enumerate() {
        let now = c.get(format!("/p/{i}"), None).await.unwrap();
        assert_eq!(now.kvs()[0].value(), later[i].as_slice(), "/p/{i} now");
        let then = GetOptions::new().with_revision(first + i as i64);
        let old = c.get(format!("/p/{i}"), Some(then)).await.unwrap();
        assert_eq!(
            old.kvs()[0].value(),
            value.as_slice(),
            "/p/{i} as first written"
        );
    }
    server.stop().await;
}
