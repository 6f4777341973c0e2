//! Starts a real etcdsql (real SQLite file, real gRPC port on 127.0.0.1) for a test, and stops
//! it through the same shutdown path production uses.
//!
//! Every test that starts a server is bounded: each wait in a test has its own deadline and
//! message, and behind them each server carries a [`Watchdog`] that ends the test process with
//! the test's name if the server is still up after [`TEST_LIMIT`], so a wait someone forgot to
//! bound fails the run instead of using up CI's time.

#![allow(dead_code)]

pub mod pki;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use etcd_client::Client;
use etcdsql::{Config, Running};
use tokio_util::sync::CancellationToken;

/// Longest a test may keep a server running: ten times what the slowest test needs on a
/// contended machine.
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

/// Ends the test process, naming `what`, unless dropped within the limit.
pub struct Watchdog {
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    pub fn new(what: String, limit: Duration) -> Self {
        let (disarm, disarmed) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = disarmed.recv_timeout(limit) {
                // Straight to stderr: the test harness would swallow eprintln's captured output.
                let _ = writeln!(
                    std::io::stderr(),
                    "{what} is still running after {} s: some wait in it has no bound; \
                     ending the test process",
                    limit.as_secs()
                );
                std::process::exit(101);
            }
        });
        Self { _disarm: disarm }
    }
}

pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub db_dir: PathBuf,
    shutdown: CancellationToken,
    running: Option<Running>,
    _watchdog: Watchdog,
}

impl TestServer {
    /// A server on a fresh database in `dir`.
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, |_| {}).await
    }

    /// A server on the database in `dir` (created if missing), with `tweak` applied to the
    /// default configuration.
    pub async fn start_with(dir: &Path, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::defaults();
        config.listen_client_urls = vec!["http://127.0.0.1:0".into()];
        config.advertise_client_urls = Vec::new();
        config.endpoint = test_endpoint(dir);
        config.shutdown_grace_seconds = 2;
        tweak(&mut config);
        // RUST_LOG shows the server's log while debugging a test (stderr, uncaptured).
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .try_init();
        }
        // Tests start their servers from the test's own thread, which bears its name.
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        let watchdog = Watchdog::new(format!("test {test:?}"), TEST_LIMIT);
        let shutdown = CancellationToken::new();
        let running = etcdsql::start(config, shutdown.clone())
            .await
            .expect("server starts");
        Self {
            addr: running.local_addrs[0],
            db_dir: dir.to_path_buf(),
            shutdown,
            running: Some(running),
            _watchdog: watchdog,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> Client {
        Client::connect([self.url()], None)
            .await
            .expect("client connects")
    }

    /// Graceful shutdown; returns once the database is closed.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(running) = self.running.take() {
            tokio::time::timeout(Duration::from_secs(30), running.wait())
                .await
                .expect("the server stops within 30 s");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The gRPC status inside a client error.
pub fn status(err: etcd_client::Error) -> tonic::Status {
    match err {
        etcd_client::Error::GRpcStatus(status) => status,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// A key-value's fields: key, create and mod revision, version, value, lease.
pub type Fields = (Vec<u8>, i64, i64, i64, Vec<u8>, i64);

/// Every field of each key-value, for comparing results (the client's type has no `==`).
pub fn fields(kvs: &[etcd_client::KeyValue]) -> Vec<Fields> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.value().to_vec(),
                kv.lease(),
            )
        })
        .collect()
}

/// The store's current revision, as a read's header reports it.
pub async fn current_revision(c: &mut Client) -> i64 {
    let read = c.get("any", None).await.expect("a read succeeds");
    read.header().expect("a header").revision()
}

/// Polls until `key` exists (`present`) or is gone, failing the test after `bound`.
pub async fn wait_for_key(c: &mut Client, key: &[u8], present: bool, bound: Duration) {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let found = !c.get(key, None).await.expect("get").kvs().is_empty();
        if found == present {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} {} after {bound:?}",
            String::from_utf8_lossy(key),
            if present {
                "never appeared"
            } else {
                "still exists"
            }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A port on 127.0.0.1 that was free a moment ago (the kernel's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The newest PostgreSQL version with Debian clusters on this machine (`/etc/postgresql/*`).
pub fn postgres_version() -> String {
    std::fs::read_dir("/etc/postgresql")
        .expect("a Debian PostgreSQL installation")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .expect("a PostgreSQL version")
}

/// Whether this test run targets PostgreSQL (`ETCDSQL_TEST_BACKEND=postgres`).
pub fn on_postgres() -> bool {
    std::env::var("ETCDSQL_TEST_BACKEND").as_deref() == Ok("postgres")
}

/// Whether this test run targets MySQL or MariaDB (`ETCDSQL_TEST_BACKEND=mysql`).
pub fn on_mysql() -> bool {
    std::env::var("ETCDSQL_TEST_BACKEND").as_deref() == Ok("mysql")
}

/// Whether the run targets a database server that several etcdsql processes can share
/// (PostgreSQL or MySQL), rather than a SQLite file.
pub fn shared_database() -> bool {
    on_postgres() || on_mysql()
}

/// The database a test uses, the same for the same `dir` (so restarts find their data): a SQLite
/// file in `dir`, or on a database server a database named after `dir`, which the server
/// creates. `ETCDSQL_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432`) and
/// `ETCDSQL_TEST_MYSQL` (default `mysql://root@127.0.0.1:3306`) name the servers; test.sh drops
/// the `etcdsql_test_*` databases before and after a run.
pub fn test_endpoint(dir: &Path) -> String {
    let server = if on_postgres() {
        std::env::var("ETCDSQL_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
    } else if on_mysql() {
        std::env::var("ETCDSQL_TEST_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
    } else {
        return format!("sqlite://{}", dir.join("state.db").display());
    };
    // FNV-1a of the path: stable and short enough for a database name.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in dir.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{server}/etcdsql_test_{hash:016x}")
}

/// What `server`'s `/metrics` shows now.
pub async fn metrics_text(server: &TestServer) -> String {
    reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Runs `sql` (no parameters, the same in every dialect) straight on the database.
pub async fn execute_sql(endpoint: &str, sql: &str) {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    if on_postgres() {
        let pool = sqlx::PgPool::connect(endpoint).await.unwrap();
        sqlx::query(sql).execute(&pool).await.unwrap();
    } else if on_mysql() {
        let pool = sqlx::MySqlPool::connect(endpoint).await.unwrap();
        sqlx::query(sql).execute(&pool).await.unwrap();
    } else {
        let pool = sqlx::SqlitePool::connect(endpoint).await.unwrap();
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
}

/// How many rows the log table holds, read straight from the database.
pub async fn log_rows(endpoint: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM kv_log";
    if on_postgres() {
        let pool = sqlx::PgPool::connect(endpoint).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap()
    } else if on_mysql() {
        let pool = sqlx::MySqlPool::connect(endpoint).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap()
    } else {
        let pool = sqlx::SqlitePool::connect(endpoint).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap()
    }
}

/// Where a test that states etcd's behaviour runs: a fresh etcdsql, or — when
/// `ETCDSQL_REFERENCE_ENDPOINT` names one (test.sh starts real etcd for it) — a real etcd, so
/// the same assertions are checked against etcd itself. Tests run this way share the reference
/// server: they keep to keys under their own [`Target::prefix`].
pub struct Target {
    server: Option<TestServer>,
    url: String,
    prefix: String,
}

impl Target {
    pub async fn start(dir: &Path) -> Self {
        let test = std::thread::current()
            .name()
            .unwrap_or("test")
            .replace("::", ".");
        // Unique per run, so reruns against one reference server never meet old keys.
        let prefix = format!("{test}.{:x}/", rand_suffix());
        if let Ok(url) = std::env::var("ETCDSQL_REFERENCE_ENDPOINT") {
            return Self {
                server: None,
                url,
                prefix,
            };
        }
        let server = TestServer::start(dir).await;
        Self {
            url: server.url(),
            server: Some(server),
            prefix,
        }
    }

    /// Whether the assertions run against real etcd.
    pub fn is_reference(&self) -> bool {
        self.server.is_none()
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// `name` under this test's own prefix.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub async fn client(&self) -> Client {
        Client::connect([self.url.clone()], None)
            .await
            .expect("client connects")
    }

    pub async fn stop(self) {
        if let Some(server) = self.server {
            server.stop().await;
        }
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// One unary gRPC call with etcdsql's own protobuf types, with `token` in the `token` metadata
/// as etcd's clients send it: for what a client library hides (which token goes with a call).
pub async fn raw_call<Req, Resp>(
    url: &str,
    path: &'static str,
    request: Req,
    token: Option<&str>,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .expect("a valid URL")
        .connect()
        .await
        .expect("connects");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("the channel is ready");
    let mut request = tonic::Request::new(request);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("token", token.parse().expect("a token is ASCII"));
    }
    grpc.unary(
        request,
        path.parse().expect("a valid path"),
        tonic_prost::ProstCodec::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// A real etcd for a test, on two free loopback ports and a data folder of its own: `etcd` from
/// `ETCDSQL_ETCD_BIN`, else from `PATH` (test.sh installs Debian's). Killed on drop.
pub struct RealEtcd {
    pub url: String,
    child: std::process::Child,
    _dir: tempfile::TempDir,
    options: Option<etcd_client::ConnectOptions>,
}

impl RealEtcd {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// With `pki`, clients must come over TLS with a certificate from its CA ("client").
    pub async fn start_with(pki: Option<&pki::Pki>) -> Self {
        let bin = std::env::var("ETCDSQL_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let (scheme, tls_args, options) = match pki {
            None => ("http", Vec::new(), None),
            Some(pki) => {
                let file = |name: &str| pki.path(name).display().to_string();
                let args = vec![
                    "--cert-file".to_owned(),
                    file("server.crt"),
                    "--key-file".into(),
                    file("server.key"),
                    "--trusted-ca-file".into(),
                    file("ca.crt"),
                    "--client-cert-auth".into(),
                ];
                let tls = etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(pki.read("ca.crt")))
                    .identity(etcd_client::Identity::from_pem(
                        pki.read("client.crt"),
                        pki.read("client.key"),
                    ));
                (
                    "https",
                    args,
                    Some(etcd_client::ConnectOptions::new().with_tls(tls)),
                )
            }
        };
        // Ports the kernel picks, released for etcd; a start that loses one to another process
        // is tried again on new ones.
        for _ in 0..5 {
            let (client, peer) = (free_port(), free_port());
            if client == peer {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let url = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = std::process::Command::new(&bin)
                .args(["--name", "reference", "--data-dir"])
                .arg(dir.path().join("data"))
                .args([
                    "--listen-client-urls",
                    &url,
                    "--advertise-client-urls",
                    &url,
                ])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("reference={peer_url}")])
                .args(&tls_args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {bin} (test.sh installs etcd): {e}"));
            let mut etcd = Self {
                url,
                child,
                _dir: dir,
                options: options.clone(),
            };
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while tokio::time::Instant::now() < deadline {
                if etcd.child.try_wait().ok().flatten().is_some() {
                    break;
                }
                let options = etcd
                    .options
                    .clone()
                    .unwrap_or_default()
                    .with_connect_timeout(Duration::from_secs(1))
                    .with_timeout(Duration::from_secs(2));
                if let Ok(mut c) = Client::connect([etcd.url.clone()], Some(options)).await
                    && c.get("health-probe", None).await.is_ok()
                {
                    return etcd;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = etcd.child.kill();
            let _ = etcd.child.wait();
        }
        panic!("{bin} did not start and answer within 30 s in 5 tries");
    }

    pub async fn client(&self) -> Client {
        Client::connect([self.url.clone()], self.options.clone())
            .await
            .expect("client connects to etcd")
    }
}

impl Drop for RealEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `etcdsql` binary: `ETCDSQL_BIN` (test.sh sets it), else the one cargo built.
pub fn etcdsql_bin() -> String {
    std::env::var("ETCDSQL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_etcdsql").to_owned())
}

/// Runs the `etcdsql` binary with `args` (a tool command): its exit status and everything it
/// printed.
pub fn etcdsql_tool(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(etcdsql_bin())
        .args(["--log-level", "error"])
        .args(args)
        .output()
        .expect("etcdsql runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}
