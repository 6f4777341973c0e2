//! `etcdsql import --from-kine`: a database shaped as kine writes it (kine's documented SQLite
//! schema: one `kine` table whose ids are revisions, with compaction and gap-filler rows) is
//! imported into the store the run targets; keys, values and revisions read back as kine
//! served them, the history kine kept replays through a watch, kine's bookkeeping rows are gone,
//! leases come back, and `etcdsql check` finds the result consistent.

mod common;

use common::{TestServer, etcdsql_tool, on_postgres, shared_database, test_endpoint};
use etcd_client::{GetOptions, WatchOptions};

/// kine's rows: (id, name, created, deleted, create_revision, prev_revision, lease, value).
type KineRow = (i64, &'static str, i64, i64, i64, i64, i64, &'static str);

/// A history as kine records it. Row 2 (a's first version) was removed by kine's compaction at
/// revision 4, which row 9 records; row 5 fills a gap in kine's ids.
const ROWS: &[KineRow] = &[
    (1, "compact_rev_key", 1, 0, 0, 0, 0, ""),
    (3, "/registry/b", 1, 0, 3, 0, 0, "b1"),
    (4, "/registry/a", 0, 0, 2, 2, 0, "a2"),
    (5, "gap-5", 0, 1, 0, 0, 0, ""),
    (6, "/registry/b", 0, 1, 3, 3, 0, "b1"),
    (7, "/registry/c", 1, 0, 7, 0, 30, "c1"),
    (8, "/registry/b", 1, 0, 8, 6, 0, "b2"),
    (9, "compact_rev_key", 0, 0, 1, 4, 0, ""),
    (10, "/registry/a", 0, 0, 2, 4, 0, "a3"),
];

async fn kine_fixture(path: &std::path::Path) {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    sqlx::query(
        "CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name INTEGER, \
         created INTEGER, deleted INTEGER, create_revision INTEGER, prev_revision INTEGER, \
         lease INTEGER, value BLOB, old_value BLOB)",
    )
    .execute(&pool)
    .await
    .unwrap();
    for &(id, name, created, deleted, create_revision, prev_revision, lease, value) in ROWS {
        sqlx::query(
            "INSERT INTO kine (id, name, created, deleted, create_revision, prev_revision, \
             lease, value, old_value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
        )
        .bind(id)
        .bind(name)
        .bind(created)
        .bind(deleted)
        .bind(create_revision)
        .bind(prev_revision)
        .bind(lease)
        .bind(value.as_bytes())
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
}

/// The same rows in a kine table on the run's database server (kine's MySQL and PostgreSQL
/// schemas), in a database of their own; its endpoint.
async fn kine_fixture_on_server(store: &std::path::Path) -> String {
    let server_db = test_endpoint(store);
    let (server, db) = server_db.rsplit_once('/').unwrap();
    let db = format!("{db}_kine");
    let create = format!("CREATE DATABASE {db}");
    let endpoint = format!("{server}/{db}");
    let (table, insert) = if on_postgres() {
        let admin = sqlx::PgPool::connect(&format!("{server}/postgres"))
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&admin)
            .await
            .unwrap();
        (
            "CREATE TABLE kine (id BIGSERIAL PRIMARY KEY, name VARCHAR(630), created INTEGER, \
             deleted INTEGER, create_revision BIGINT, prev_revision BIGINT, lease INTEGER, \
             value BYTEA, old_value BYTEA)",
            "INSERT INTO kine (id, name, created, deleted, create_revision, prev_revision, \
             lease, value) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
    } else {
        let admin = sqlx::MySqlPool::connect(server).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&admin)
            .await
            .unwrap();
        (
            "CREATE TABLE kine (id BIGINT UNSIGNED AUTO_INCREMENT, \
             name VARCHAR(630) CHARACTER SET ascii, created INTEGER, deleted INTEGER, \
             create_revision BIGINT UNSIGNED, prev_revision BIGINT UNSIGNED, lease INTEGER, \
             value MEDIUMBLOB, old_value MEDIUMBLOB, PRIMARY KEY (id))",
            "INSERT INTO kine (id, name, created, deleted, create_revision, prev_revision, \
             lease, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
    };
    macro_rules! fill {
        ($pool:expr) => {{
            let pool = $pool;
            sqlx::query(table).execute(&pool).await.unwrap();
            for &(id, name, created, deleted, create_revision, prev_revision, lease, value) in ROWS
            {
                sqlx::query(insert)
                    .bind(id)
                    .bind(name)
                    .bind(created as i32)
                    .bind(deleted as i32)
                    .bind(create_revision)
                    .bind(prev_revision)
                    .bind(lease as i32)
                    .bind(value.as_bytes())
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }};
    }
    if on_postgres() {
        fill!(sqlx::PgPool::connect(&endpoint).await.unwrap());
    } else {
        fill!(sqlx::MySqlPool::connect(&endpoint).await.unwrap());
    }
    endpoint
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kine_database_imports_with_its_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let kine = dir.path().join("kine.db");
    kine_fixture(&kine).await;
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    import_and_compare(&format!("sqlite://{}", kine.display()), &store).await;
}

/// kine on the run's own database server as the source (PostgreSQL and MySQL runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kine_database_on_a_server_imports_with_its_revisions() {
    if !shared_database() {
        eprintln!("skipped: needs ETCDSQL_TEST_BACKEND=postgres or mysql");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let source = kine_fixture_on_server(&store).await;
    import_and_compare(&source, &store).await;
}

/// Imports `source` into the store for `store` and reads it back.
async fn import_and_compare(source: &str, store: &std::path::Path) {
    let source = source.to_owned();
    let endpoint = test_endpoint(store);

    let (status, text) = etcdsql_tool(&["--endpoint", &endpoint, "import", "--from-kine", &source]);
    assert_eq!(status, 0, "{text}");
    assert!(
        text.contains("current revision 10, compact revision 4"),
        "{text}"
    );
    let (status, text) = etcdsql_tool(&["check", &endpoint]);
    assert_eq!(status, 0, "{text}");

    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let all = c
        .get("/registry/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(all.header().unwrap().revision(), 10);
    let got: Vec<(String, String, i64, i64, i64)> = all
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.value_str().unwrap().to_owned(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            // a's first row is gone: its versions count from the oldest row kine kept.
            ("/registry/a".into(), "a3".into(), 2, 10, 2),
            ("/registry/b".into(), "b2".into(), 8, 8, 1),
            ("/registry/c".into(), "c1".into(), 7, 7, 1),
        ]
    );
    // No bookkeeping row became a key.
    let everything = c
        .get("", Some(GetOptions::new().with_from_key().with_keys_only()))
        .await
        .unwrap();
    assert_eq!(everything.kvs().len(), 3);
    // Reads at a retained revision answer from the history; older ones are compacted.
    let at5 = c
        .get("/registry/b", Some(GetOptions::new().with_revision(5)))
        .await
        .unwrap();
    assert_eq!(at5.kvs()[0].value(), b"b1");
    let compacted = c
        .get("/registry/b", Some(GetOptions::new().with_revision(3)))
        .await;
    assert!(
        compacted.is_err(),
        "a read below the compact revision fails"
    );
    // A watch from the compact revision replays kine's changes in order, nothing else.
    let mut watch = c
        .watch(
            "/registry/",
            Some(WatchOptions::new().with_prefix().with_start_revision(5)),
        )
        .await
        .unwrap();
    let mut events = Vec::new();
    while events.len() < 4 {
        let message = tokio::time::timeout(std::time::Duration::from_secs(10), watch.message())
            .await
            .expect("events within 10 s")
            .unwrap()
            .unwrap();
        for e in message.events() {
            let kv = e.kv().unwrap();
            events.push((kv.key_str().unwrap().to_owned(), kv.mod_revision()));
        }
    }
    assert_eq!(
        events,
        [
            ("/registry/b".into(), 6),
            ("/registry/c".into(), 7),
            ("/registry/b".into(), 8),
            ("/registry/a".into(), 10),
        ]
    );
    // c's lease (kine's lease id is its TTL) exists and holds c.
    let lease = c.lease_time_to_live(30, None).await.unwrap();
    assert_eq!(lease.granted_ttl(), 30);
    assert!(lease.ttl() > 0 && lease.ttl() <= 30);
    // Writes continue after kine's last revision.
    let put = c.put("/registry/d", "d1", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), 11);
    server.stop().await;

    // A store that holds data is not imported into.
    let (status, text) = etcdsql_tool(&["--endpoint", &endpoint, "import", "--from-kine", &source]);
    assert_ne!(status, 0, "{text}");
    assert!(text.contains("not empty"), "{text}");
}
