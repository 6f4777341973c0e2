//! TLS, client certificates and Unix sockets, end to end: the etcd-client crate, etcdctl 3.4
//! with `--cacert --cert --key`, kubeadm's `/version` check over HTTPS, refusal of clients
//! without a trusted certificate, and start-up errors. Certificates are generated per test
//! with rcgen; nothing is committed.

mod common;

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::pki::Pki;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use etcdsql::{Config, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, pki_types};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// Certificates

impl Pki {
    /// etcd-client TLS options: trusts the CA, and presents `identity` ("client",
    /// "stranger") if given.
    fn client_tls(&self, identity: Option<&str>) -> ConnectOptions {
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(self.read("ca.crt")));
        if let Some(name) = identity {
            tls = tls.identity(Identity::from_pem(
                self.read(&format!("{name}.crt")),
                self.read(&format!("{name}.key")),
            ));
        }
        ConnectOptions::new().with_tls(tls)
    }

    /// An HTTPS client like kubeadm's preflight: trusts the CA, presents `identity` if given.
    fn https(&self, identity: Option<&str>) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(&self.read("ca.crt")).unwrap());
        if let Some(name) = identity {
            let mut pem = self.read(&format!("{name}.crt"));
            pem.extend(self.read(&format!("{name}.key")));
            builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        builder.build().unwrap()
    }

    /// A raw rustls client configuration, for handshake-level checks.
    fn rustls_client(
        &self,
        identity: Option<&str>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        use pki_types::pem::PemObject;
        let mut roots = RootCertStore::empty();
        roots
            .add(pki_types::CertificateDer::from_pem_file(self.path("ca.crt")).unwrap())
            .unwrap();
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots);
        let mut config = match identity {
            Some(name) => builder
                .with_client_auth_cert(
                    vec![
                        pki_types::CertificateDer::from_pem_file(self.path(&format!("{name}.crt")))
                            .unwrap(),
                    ],
                    pki_types::PrivateKeyDer::from_pem_file(self.path(&format!("{name}.key")))
                        .unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

// ---------------------------------------------------------------------------------------------
// Servers

struct Server {
    running: Option<Running>,
    shutdown: CancellationToken,
    _db: tempfile::TempDir,
}

impl Server {
    /// A server on `urls`, with TLS from `pki` (client certificates required unless `tweak`
    /// says otherwise).
    async fn start(pki: &Pki, urls: &[&str], tweak: impl FnOnce(&mut Config)) -> Self {
        let db = tempfile::tempdir().unwrap();
        let mut config = Config::defaults();
        config.listen_client_urls = urls.iter().map(|u| (*u).to_owned()).collect();
        config.endpoint = format!("sqlite://{}", db.path().join("state.db").display());
        config.shutdown_grace_seconds = 2;
        config.cert_file = Some(pki.path("server.crt"));
        config.key_file = Some(pki.path("server.key"));
        config.trusted_ca_file = Some(pki.path("ca.crt"));
        config.client_cert_auth = true;
        tweak(&mut config);
        let shutdown = CancellationToken::new();
        let running = etcdsql::start(config, shutdown.clone())
            .await
            .expect("server starts");
        Self {
            running: Some(running),
            shutdown,
            _db: db,
        }
    }

    fn url(&self) -> String {
        self.running.as_ref().unwrap().client_urls[0].clone()
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.running.as_ref().unwrap().local_addrs[0]
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(running) = self.running.take() {
            running.wait().await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Connects over TLS and asks for `/version` over HTTP/1.1 on the same connection; returns the
/// response text, or the error that ended the handshake or the exchange.
async fn raw_version(
    addr: std::net::SocketAddr,
    config: Arc<ClientConfig>,
) -> io::Result<(Option<Vec<u8>>, String)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    tls.write_all(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await?;
    Ok((alpn, String::from_utf8_lossy(&response).into_owned()))
}

/// The series of a scrape, for checking that a refused client never reached a handler.
async fn put_calls_started(pki: &Pki, url: &str) -> f64 {
    let text = pki
        .https(Some("client"))
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("grpc_server_started_total{")
                && l.contains("grpc_service=\"etcdserverpb.KV\"")
                && l.contains("grpc_method=\"Put\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn mtls_through_the_etcd_client_crate() {
    let pki = Pki::new();
    let server = Server::start(&pki, &["https://127.0.0.1:0"], |_| {}).await;
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let mut c = Client::connect([server.url()], Some(pki.client_tls(Some("client"))))
        .await
        .unwrap();
    c.put("/registry/a", "1", None).await.unwrap();
    let got = c.get("/registry/a", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1");

    let mut events = c.watch("/registry/b", None).await.unwrap();
    // The watch starts "from now" once created: write only after the created response.
    assert!(events.message().await.unwrap().unwrap().created());
    c.put("/registry/b", "2", None).await.unwrap();
    let event = loop {
        let response = events.message().await.unwrap().unwrap();
        if !response.events().is_empty() {
            break response;
        }
    };
    assert_eq!(event.events()[0].kv().unwrap().value(), b"2");

    let status = c.status().await.unwrap();
    assert_eq!(status.version(), "3.6.16");
    // Clients are told to use the TLS URL.
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members()[0].client_urls(), [server.url()]);
    server.stop().await;
}

#[tokio::test]
async fn tls_without_client_certificates_when_no_ca_is_trusted() {
    let pki = Pki::new();
    let server = Server::start(&pki, &["https://127.0.0.1:0"], |c| {
        c.trusted_ca_file = None;
        c.client_cert_auth = false;
    })
    .await;
    let mut c = Client::connect([server.url()], Some(pki.client_tls(None)))
        .await
        .unwrap();
    c.put("k", "v", None).await.unwrap();
    // Plain HTTP to the TLS port gets nowhere.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/version", server.addr()))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    server.stop().await;
}

#[tokio::test]
async fn clients_without_a_trusted_certificate_are_refused_at_the_handshake() {
    let pki = Pki::new();
    let server = Server::start(&pki, &["https://127.0.0.1:0"], |_| {}).await;
    let tls13 = &[&rustls::version::TLS13][..];
    let tls12 = &[&rustls::version::TLS12][..];

    for (identity, versions) in [
        (None, tls13),
        (None, tls12),
        (Some("stranger"), tls13),
        (Some("stranger"), tls12),
    ] {
        // At the TLS level: the server's alert ends the connection before any HTTP.
        let outcome = raw_version(server.addr(), pki.rustls_client(identity, versions)).await;
        match outcome {
            Err(e) => {
                let message = e.to_string();
                eprintln!("{identity:?} over {versions:?} refused: {message}");
                // CertificateRequired without a certificate, UnknownCA with the stranger's.
                assert!(message.contains("fatal alert"), "{identity:?}: {message}");
            }
            Ok((_, response)) => panic!("{identity:?} was answered: {response:?}"),
        }

        // kubeadm-style HTTPS.
        let https = pki
            .https(identity)
            .get(format!("{}/version", server.url()))
            .send()
            .await;
        assert!(https.is_err(), "{identity:?}: {https:?}");

        // gRPC through the etcd-client crate, on a channel that does not retry.
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pki.read("ca.crt")));
        if let Some(name) = identity {
            tls = tls.identity(Identity::from_pem(
                pki.read(&format!("{name}.crt")),
                pki.read(&format!("{name}.key")),
            ));
        }
        let endpoint = tonic::transport::Endpoint::from_shared(server.url())
            .unwrap()
            .tls_config(tls)
            .unwrap();
        if let Ok(channel) = endpoint.connect().await {
            let mut c = Client::from_channel(etcd_client::Channel::Tonic(channel), None)
                .await
                .unwrap();
            let put = tokio::time::timeout(Duration::from_secs(30), c.put("k", "v", None)).await;
            assert!(!matches!(put, Ok(Ok(_))), "{identity:?} could write");
        }
    }

    // None of those reached a handler; a client with a trusted certificate still works.
    assert_eq!(put_calls_started(&pki, &server.url()).await, 0.0);
    let mut c = Client::connect([server.url()], Some(pki.client_tls(Some("client"))))
        .await
        .unwrap();
    c.put("k", "v", None).await.unwrap();
    assert_eq!(put_calls_started(&pki, &server.url()).await, 1.0);
    server.stop().await;
}

/// kubeadm's external-etcd preflight: `GET /version` over HTTPS with the API server's etcd
/// client certificate, and a version at or above its minimum.
#[tokio::test]
async fn version_over_https_with_a_client_certificate_as_kubeadm_checks() {
    let pki = Pki::new();
    let server = Server::start(&pki, &["https://127.0.0.1:0"], |_| {}).await;
    let https = pki.https(Some("client"));
    let version: serde_json::Value = https
        .get(format!("{}/version", server.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        version,
        serde_json::json!({"etcdserver": "3.6.16", "etcdcluster": "3.6.0"})
    );
    let health = https
        .get(format!("{}/health", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let metrics = https
        .get(format!("{}/metrics", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(
        metrics
            .text()
            .await
            .unwrap()
            .contains("etcd_server_has_leader 1"),
        "metrics are served on the TLS port"
    );
    server.stop().await;
}

#[tokio::test]
async fn tls_versions_and_alpn() {
    let pki = Pki::new();
    let server = Server::start(&pki, &["https://127.0.0.1:0"], |_| {}).await;
    // TLS 1.2 is accepted; ALPN picks h2 when the client offers it (grpc-go insists).
    let (alpn, response) = raw_version(
        server.addr(),
        pki.rustls_client(Some("client"), &[&rustls::version::TLS12]),
    )
    .await
    .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    // The HTTP/1.1 request still works: the server detects the protocol from the bytes.
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    server.stop().await;

    let strict = Server::start(&pki, &["https://127.0.0.1:0"], |c| {
        c.tls_min_version = etcdsql::tls::MinVersion::Tls13;
    })
    .await;
    let tls12 = raw_version(
        strict.addr(),
        pki.rustls_client(Some("client"), &[&rustls::version::TLS12]),
    )
    .await;
    assert!(tls12.is_err(), "{tls12:?}");
    let (_, response) = raw_version(
        strict.addr(),
        pki.rustls_client(Some("client"), &[&rustls::version::TLS13]),
    )
    .await
    .unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    strict.stop().await;
}

/// Runs etcdctl (v3 API) with only loopback traffic and no inherited configuration.
fn etcdctl(args: &[&str]) -> Option<std::process::Output> {
    let mut command = Command::new("etcdctl");
    for (key, _) in std::env::vars() {
        if key.starts_with("ETCDCTL_") || key.to_lowercase().ends_with("_proxy") {
            command.env_remove(key);
        }
    }
    command
        .env("ETCDCTL_API", "3")
        .args(["--dial-timeout=3s", "--command-timeout=10s"])
        .args(args);
    match command.output() {
        Ok(output) => Some(output),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => panic!("cannot run etcdctl: {e}"),
    }
}

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn etcdctl_with_cacert_cert_and_key() {
    let pki = Pki::new();
    let server = Server::start(&pki, &["https://127.0.0.1:0"], |_| {}).await;
    let endpoints = format!("--endpoints={}", server.url());
    let ca = pki.path("ca.crt");
    let cert = pki.path("client.crt");
    let key = pki.path("client.key");
    let tls = [
        endpoints.as_str(),
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    let run = |args: &[&str]| {
        let all: Vec<&str> = tls.iter().chain(args).copied().collect();
        tokio::task::block_in_place(|| etcdctl(&all))
    };
    let Some(put) = run(&["put", "/registry/x", "y"]) else {
        eprintln!("SKIPPED: etcdctl is not installed (Debian package etcd-client)");
        return;
    };
    assert!(put.status.success(), "{}", text(&put));
    let get = run(&["get", "/registry/x"]).unwrap();
    assert!(get.status.success(), "{}", text(&get));
    assert_eq!(String::from_utf8_lossy(&get.stdout), "/registry/x\ny\n");
    // `endpoint status` sends a URL-valued :authority: the repair runs behind TLS.
    let status = run(&["endpoint", "status"]).unwrap();
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("3.6.16"), "{}", text(&status));
    let health = run(&["endpoint", "health"]).unwrap();
    assert!(health.status.success(), "{}", text(&health));

    // Without a client certificate etcdctl gets nowhere.
    let refused = tokio::task::block_in_place(|| {
        etcdctl(&[
            endpoints.as_str(),
            "--cacert",
            ca.to_str().unwrap(),
            "put",
            "/registry/x",
            "z",
        ])
    })
    .unwrap();
    assert!(!refused.status.success(), "{}", text(&refused));
    server.stop().await;
}

/// A gRPC channel to a Unix socket.
async fn unix_channel(path: PathBuf) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn unix_sockets_plain_and_tls() {
    let pki = Pki::new();
    let sockets = tempfile::tempdir().unwrap();
    let plain = sockets.path().join("etcdsql.sock");
    let secure = sockets.path().join("etcdsqls.sock");
    let urls = [
        format!("unix://{}", plain.display()),
        format!("unixs://{}", secure.display()),
    ];
    let server = Server::start(&pki, &[urls[0].as_str(), urls[1].as_str()], |_| {}).await;
    assert_eq!(server.running.as_ref().unwrap().client_urls, urls);

    // gRPC through the etcd-client crate.
    let channel = unix_channel(plain.clone()).await;
    let mut c = Client::from_channel(etcd_client::Channel::Tonic(channel), None)
        .await
        .unwrap();
    c.put("over", "unix", None).await.unwrap();
    assert_eq!(c.get("over", None).await.unwrap().kvs()[0].value(), b"unix");

    // HTTP on the same socket.
    let mut stream = tokio::net::UnixStream::connect(&plain).await.unwrap();
    stream
        .write_all(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"etcdserver\":\"3.6.16\""), "{response}");

    // TLS over a Unix socket, client certificate required.
    for (identity, answered) in [(Some("client"), true), (None, false)] {
        let stream = tokio::net::UnixStream::connect(&secure).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(
            pki.rustls_client(identity, &[&rustls::version::TLS13]),
        );
        let name = pki_types::ServerName::try_from("localhost").unwrap();
        let outcome = async {
            let mut tls = connector.connect(name, stream).await?;
            tls.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await?;
            let mut response = Vec::new();
            tls.read_to_end(&mut response).await?;
            Ok::<_, io::Error>(String::from_utf8_lossy(&response).into_owned())
        }
        .await;
        match (answered, outcome) {
            (true, Ok(response)) => assert!(response.starts_with("HTTP/1.1 200"), "{response}"),
            (false, Err(_)) => {}
            (_, other) => panic!("{identity:?}: {other:?}"),
        }
    }

    // etcdctl 3.4 on a Unix socket (it sends the socket path as :authority).
    let endpoint = format!("--endpoints={}", urls[0]);
    match tokio::task::block_in_place(|| etcdctl(&[endpoint.as_str(), "get", "over"])) {
        Some(get) => {
            assert!(get.status.success(), "{}", text(&get));
            assert_eq!(String::from_utf8_lossy(&get.stdout), "over\nunix\n");
        }
        None => eprintln!("SKIPPED the etcdctl part: etcdctl is not installed"),
    }

    server.stop().await;
    assert!(!plain.exists(), "the socket file is removed at shutdown");
    assert!(!secure.exists(), "the socket file is removed at shutdown");
}

#[tokio::test]
async fn start_up_errors_name_the_file() {
    let pki = Pki::new();
    let start = |tweak: Box<dyn FnOnce(&mut Config)>| {
        let pki_cert = pki.path("server.crt");
        let pki_key = pki.path("server.key");
        let pki_ca = pki.path("ca.crt");
        async move {
            let db = tempfile::tempdir().unwrap();
            let mut config = Config::defaults();
            config.listen_client_urls = vec!["https://127.0.0.1:0".into()];
            config.endpoint = format!("sqlite://{}", db.path().join("state.db").display());
            config.cert_file = Some(pki_cert);
            config.key_file = Some(pki_key);
            config.trusted_ca_file = Some(pki_ca);
            tweak(&mut config);
            match etcdsql::start(config, CancellationToken::new()).await {
                Ok(_) => panic!("started"),
                Err(e) => e.to_string(),
            }
        }
    };
    let missing = pki.path("nope.crt");
    let m = missing.clone();
    let err = start(Box::new(move |c| c.cert_file = Some(m))).await;
    eprintln!("{err}");
    assert!(err.contains(missing.to_str().unwrap()), "{err}");

    // The other CA's key does not belong to the server certificate.
    let wrong_key = pki.path("stranger.key");
    let k = wrong_key.clone();
    let err = start(Box::new(move |c| c.key_file = Some(k))).await;
    eprintln!("{err}");
    assert!(
        err.contains("stranger.key") && err.contains("server.crt"),
        "{err}"
    );

    // A key where the CA should be.
    let k = pki.path("client.key");
    let err = start(Box::new(move |c| c.trusted_ca_file = Some(k))).await;
    eprintln!("{err}");
    assert!(err.contains("client.key"), "{err}");

    let err = start(Box::new(|c| {
        c.cert_file = None;
        c.key_file = None;
        c.trusted_ca_file = None;
    }))
    .await;
    assert!(
        err.contains("https://127.0.0.1:0") && err.contains("--cert-file"),
        "{err}"
    );

    let err = start(Box::new(|c| {
        c.trusted_ca_file = None;
        c.client_cert_auth = true;
    }))
    .await;
    assert!(err.contains("--trusted-ca-file"), "{err}");

    // The binary prints the same and exits non-zero.
    let output = Command::new(env!("CARGO_BIN_EXE_etcdsql"))
        .args(["--listen-client-urls", "https://127.0.0.1:0"])
        .arg("--cert-file")
        .arg(&missing)
        .arg("--key-file")
        .arg(pki.path("server.key"))
        .arg("--endpoint")
        .arg(format!("sqlite://{}", pki.path("db/state.db").display()))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(missing.to_str().unwrap()), "{stderr}");
}

#[test]
fn help_documents_every_flag_and_never_prints_the_dsn_password() {
    use clap::CommandFactory;
    let output = Command::new(env!("CARGO_BIN_EXE_etcdsql"))
        .arg("--help")
        .env(
            "ETCDSQL_ENDPOINT",
            "postgres://etcd:s3cret-pw@db.example/etcd",
        )
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(!help.contains("s3cret-pw"), "{help}");
    for arg in Config::command().get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        assert!(
            help.contains(&format!("--{long}")),
            "--{long} missing:\n{help}"
        );
        assert!(arg.get_help().is_some(), "--{long} has no help text");
    }
    for flag in [
        "--cert-file",
        "--key-file",
        "--trusted-ca-file",
        "--client-cert-auth",
        "--tls-min-version",
        "--listen-metrics-urls",
    ] {
        assert!(help.contains(flag), "{flag} missing");
    }
}

#[test]
fn client_cert_auth_accepts_etcds_spellings() {
    use clap::Parser;
    let parse = |args: &[&str]| {
        let mut all = vec!["etcdsql"];
        all.extend_from_slice(args);
        Config::try_parse_from(all).map(|c| c.client_cert_auth)
    };
    assert!(!parse(&[]).unwrap());
    assert!(parse(&["--client-cert-auth"]).unwrap());
    assert!(parse(&["--client-cert-auth=true"]).unwrap());
    assert!(!parse(&["--client-cert-auth=false"]).unwrap());
    // A following argument is never taken as the flag's value.
    assert!(parse(&["--client-cert-auth", "false"]).is_err());
}

/// With `--client-cert-auth` and auth on, a client that sends no token is the user its
/// certificate's CommonName names, with that user's permissions (etcd's rule).
#[tokio::test]
async fn client_certificates_name_the_user_when_auth_is_on() {
    let pki = Pki::new();
    let server = Server::start(&pki, &["https://127.0.0.1:0"], |_| {}).await;
    let mut c = Client::connect([server.url()], Some(pki.client_tls(Some("client"))))
        .await
        .unwrap();
    c.user_add("root", "rootpw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("registry").await.unwrap();
    c.role_grant_permission(
        "registry",
        etcd_client::Permission::read_write("/registry/").with_prefix(),
    )
    .await
    .unwrap();
    // The certificate's CommonName, as kubeadm issues it to kube-apiserver.
    c.user_add(
        "kube-apiserver-etcd-client",
        "",
        Some(etcd_client::UserAddOptions::new().with_no_pwd()),
    )
    .await
    .unwrap();
    c.user_grant_role("kube-apiserver-etcd-client", "registry")
        .await
        .unwrap();
    c.auth_enable().await.unwrap();

    c.put("/registry/pods/a", "1", None).await.unwrap();
    let denied = c.put("elsewhere", "1", None).await.unwrap_err();
    let etcd_client::Error::GRpcStatus(denied) = denied else {
        panic!("a gRPC status: {denied:?}");
    };
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    // A token wins over the certificate.
    let mut root = Client::connect(
        [server.url()],
        Some(pki.client_tls(Some("client")).with_user("root", "rootpw")),
    )
    .await
    .unwrap();
    root.put("elsewhere", "1", None).await.unwrap();
    server.stop().await;
}
