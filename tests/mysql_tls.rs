//! MySQL over TLS: `ssl-mode` in the endpoint is honoured — `REQUIRED` encrypts every connection
//! etcdsql makes, and `VERIFY_CA` refuses a server whose certificate the given CA did not sign.
//! The machine's MariaDB has TLS off, so this test starts a private `mariadbd` with a
//! certificate made here, in a temporary folder on a free port, and stops it at the end. Runs
//! on MySQL runs only (ETCDSQL_TEST_BACKEND=mysql) where MariaDB's server binaries exist.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{TestServer, on_mysql};

/// A private MariaDB server, killed when dropped.
struct Mariadb {
    child: Child,
    port: u16,
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mariadb {
    /// Initialises a data directory under `dir` and starts a server on it with TLS on, its
    /// certificate and key at `cert` and `key`; waits (bounded) until it answers.
    fn start(dir: &Path, cert: &Path, key: &Path) -> Self {
        let data = dir.join("data");
        let installed = Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .arg(format!("--datadir={}", data.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("mariadb-install-db runs");
        assert!(installed.success(), "mariadb-install-db failed");
        let port = common::free_port();
        let child = Command::new("/usr/sbin/mariadbd")
            .args([
                "--no-defaults",
                "--user=root",
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
            ])
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--ssl-cert={}", cert.display()))
            .arg(format!("--ssl-key={}", key.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd starts");
        let server = Mariadb { child, port };
        for _ in 0..300 {
            let ping = Command::new("mariadb-admin")
                .args(["--protocol=tcp", "-h127.0.0.1", "-uroot", "ping"])
                .arg(format!("-P{port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if ping.is_ok_and(|s| s.success()) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the private MariaDB did not answer within 30 s");
    }

    fn sql(&self, sql: &str) {
        let status = Command::new("mariadb")
            .args(["--protocol=tcp", "-h127.0.0.1", "-uroot", "-e", sql])
            .arg(format!("-P{}", self.port))
            .status()
            .expect("mariadb runs");
        assert!(status.success(), "{sql} failed");
    }
}

#[tokio::test]
async fn ssl_mode_required_encrypts_and_verify_ca_checks_the_certificate() {
    let tools = ["/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db"];
    if !on_mysql() || !tools.iter().all(|t| Path::new(t).exists()) {
        eprintln!("skipped: needs ETCDSQL_TEST_BACKEND=mysql and MariaDB's server binaries");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let issued =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    std::fs::write(&cert, issued.cert.pem()).unwrap();
    std::fs::write(&key, issued.signing_key.serialize_pem()).unwrap();
    let mariadb = Mariadb::start(dir.path(), &cert, &key);
    // A user the server lets in over TLS only: if any connection of etcdsql's were in clear
    // text, it would be refused and etcdsql would not serve.
    mariadb.sql(
        "CREATE USER 'etcdsql'@'127.0.0.1' REQUIRE SSL; \
         GRANT ALL ON *.* TO 'etcdsql'@'127.0.0.1'",
    );
    let base = format!("mysql://etcdsql@127.0.0.1:{}/etcdsql_tls", mariadb.port);

    let server = TestServer::start_with(dir.path(), |c| {
        c.endpoint = format!("{base}?ssl-mode=REQUIRED");
    })
    .await;
    let mut client = server.client().await;
    client.put("tls", "yes", None).await.unwrap();
    assert_eq!(
        client.get("tls", None).await.unwrap().kvs()[0].value(),
        b"yes"
    );
    server.stop().await;

    // In clear text the same user is refused: the check above means something.
    let mut config = etcdsql::Config::defaults();
    config.listen_client_urls = vec!["http://127.0.0.1:0".into()];
    config.advertise_client_urls = Vec::new();
    config.endpoint = format!("{base}?ssl-mode=DISABLED");
    assert!(
        etcdsql::start(config.clone(), tokio_util::sync::CancellationToken::new())
            .await
            .is_err(),
        "a clear-text connection was let in"
    );

    // A CA that did not sign the server's certificate: refused, with the reason.
    let stranger = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let ca = dir.path().join("stranger.pem");
    std::fs::write(&ca, stranger.cert.pem()).unwrap();
    config.endpoint = format!("{base}?ssl-mode=VERIFY_CA&ssl-ca={}", ca.display());
    let err = match etcdsql::start(config, tokio_util::sync::CancellationToken::new()).await {
        Ok(_) => panic!("a server certificate from an unknown CA was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.to_lowercase().contains("certificate") || err.to_lowercase().contains("tls"),
        "the error names the certificate problem: {err}"
    );
    drop(mariadb);
}
