//! etcdsql behind pgbouncer in session mode, set up as README says (`pool_mode = session`,
//! `ignore_startup_parameters = extra_float_digits`): two instances through one
//! pgbouncer serve reads, writes and watches, and a write on one instance reaches a watcher on
//! the other through NOTIFY, well before the (here raised) poll interval would have.
//!
//! Runs on PostgreSQL runs with `ETCDSQL_TEST_POOLER=1` (test.sh sets it where pgbouncer is
//! installed and the tests run as root, which starting pgbouncer as `postgres` needs).

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use common::{TestServer, on_postgres};
use etcd_client::WatchOptions;
use tokio::time::Instant;

/// A pgbouncer in front of the test server's PostgreSQL, stopped when dropped.
struct Pgbouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Pgbouncer {
    async fn start(postgres_port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = common::free_port();
        let users = dir.path().join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").unwrap();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={postgres_port}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = session\n\
                 ignore_startup_parameters = extra_float_digits\n",
                users.display()
            ),
        )
        .unwrap();
        // pgbouncer refuses to run as root; the folder must be readable by the user it becomes.
        Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir.path())
            .status()
            .expect("chown runs");
        // Its own -u, not runuser: the child must be pgbouncer itself, for Drop to stop it.
        let child = Command::new("pgbouncer")
            .args(["-u", "postgres"])
            .arg(&ini)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("pgbouncer starts");
        let bouncer = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "pgbouncer listens within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bouncer
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_behind_pgbouncer_in_session_mode() {
    if !on_postgres() || std::env::var("ETCDSQL_TEST_POOLER").as_deref() != Ok("1") {
        eprintln!("skipped: needs ETCDSQL_TEST_BACKEND=postgres and ETCDSQL_TEST_POOLER=1");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The database exists before anyone connects: pgbouncer cannot reach a missing one to let
    // etcdsql create it.
    let direct = common::test_endpoint(dir.path());
    let (server_url, database) = direct.rsplit_once('/').expect("a database in the endpoint");
    let admin = sqlx::PgPool::connect(&format!("{server_url}/postgres"))
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE \"{database}\""
    )))
    .execute(&admin)
    .await
    .unwrap();
    let postgres_port: u16 = server_url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the test server's URL");
    let bouncer = Pgbouncer::start(postgres_port).await;
    let endpoint = format!("postgres://postgres@127.0.0.1:{}/{database}", bouncer.port);
    let mut servers = Vec::new();
    for _ in 0..2 {
        let endpoint = endpoint.clone();
        servers.push(
            TestServer::start_with(dir.path(), move |c| {
                c.endpoint = endpoint;
                // Far longer than the bound below: only NOTIFY can be that quick.
                c.watch_poll_interval = Duration::from_secs(60);
            })
            .await,
        );
    }
    let mut writer = servers[0].client().await;
    let mut watcher = servers[1].client().await;
    let mut stream = watcher
        .watch("p/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let created = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("the watch is created within 30 s")
        .expect("the stream")
        .expect("a response");
    assert!(created.created());
    for i in 0..20 {
        let put = writer
            .put(format!("p/{i}"), "v", None)
            .await
            .expect("a put through pgbouncer");
        let revision = put.header().expect("a header").revision();
        let message = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap_or_else(|_| panic!("put {i} did not reach the other instance within 10 s"))
            .expect("the stream")
            .expect("a response");
        let events: Vec<i64> = message
            .events()
            .iter()
            .filter_map(|e| e.kv())
            .map(|kv| kv.mod_revision())
            .collect();
        assert_eq!(events, [revision]);
        let got = watcher.get(format!("p/{i}"), None).await.expect("a read");
        assert_eq!(
            got.kvs().len(),
            1,
            "a read on the other instance sees put {i}"
        );
    }
    for server in servers {
        server.stop().await;
    }
    drop(bouncer);
    // Best effort: test.sh drops every test database at the end anyway.
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    )))
    .execute(&admin)
    .await;
}
