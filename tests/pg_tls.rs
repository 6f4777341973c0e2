//! PostgreSQL over TLS: `sslmode` in the endpoint is honoured — `require` encrypts every
//! connection etcdsql makes, and `verify-full` refuses a server whose certificate the given root
//! did not sign. Runs on PostgreSQL only (ETCDSQL_TEST_BACKEND=postgres), against a server with
//! `ssl = on` (Debian's default, with its snakeoil certificate).

mod common;

use common::{TestServer, on_postgres, test_endpoint};

/// The plain-text endpoint's server has TLS switched on.
async fn server_has_tls(endpoint: &str) -> bool {
    let pool = sqlx::PgPool::connect(endpoint).await.unwrap();
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    ssl == "on"
}

#[tokio::test]
async fn sslmode_require_encrypts_and_verify_full_checks_the_certificate() {
    if !on_postgres() {
        eprintln!("skipped: needs ETCDSQL_TEST_BACKEND=postgres");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plain = test_endpoint(dir.path());
    // The server creates the database; start once in plain text to have one to inspect.
    TestServer::start(dir.path()).await.stop().await;
    if !server_has_tls(&plain).await {
        eprintln!("skipped: the PostgreSQL server has ssl = off");
        return;
    }

    let server = TestServer::start_with(dir.path(), |c| {
        c.endpoint = format!("{plain}?sslmode=require");
    })
    .await;
    let mut client = server.client().await;
    client.put("tls", "yes", None).await.unwrap();
    assert_eq!(
        client.get("tls", None).await.unwrap().kvs()[0].value(),
        b"yes"
    );
    // Every connection the server holds to its database is encrypted.
    let database = plain.rsplit('/').next().unwrap().to_owned();
    let pool = sqlx::PgPool::connect(&plain).await.unwrap();
    let (encrypted, clear): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*) FILTER (WHERE s.ssl), COUNT(*) FILTER (WHERE NOT s.ssl) \
         FROM pg_stat_activity AS a JOIN pg_stat_ssl AS s USING (pid) \
         WHERE a.datname = $1 AND a.pid <> pg_backend_pid()",
    )
    .bind(&database)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert!(encrypted >= 1, "etcdsql's connections use TLS");
    assert_eq!(clear, 0, "no connection of etcdsql's is in clear text");
    server.stop().await;

    // A root that did not sign the server's certificate: the connection is refused, and the
    // error says why rather than hanging.
    let stranger = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let root = dir.path().join("stranger.pem");
    std::fs::write(&root, stranger.cert.pem()).unwrap();
    let mut config = etcdsql::Config::defaults();
    config.listen_client_urls = vec!["http://127.0.0.1:0".into()];
    config.advertise_client_urls = Vec::new();
    config.endpoint = format!("{plain}?sslmode=verify-full&sslrootcert={}", root.display());
    let refused = etcdsql::start(config, tokio_util::sync::CancellationToken::new()).await;
    let err = match refused {
        Ok(_) => panic!("a server certificate from an unknown root was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.to_lowercase().contains("certificate") || err.to_lowercase().contains("tls"),
        "the error names the certificate problem: {err}"
    );
}
