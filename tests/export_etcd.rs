//! `etcdsql export --to-etcd`: the store's live keys go into an empty real etcd with their
//! values, in the order they were last written, and leases keep their ids and remaining TTLs
//! with their keys attached; an etcd that holds keys is refused. Runs on whichever backend the
//! run targets.

mod common;

use common::{RealEtcd, TestServer, etcdsql_tool, test_endpoint};
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_keys_and_leases_go_into_an_empty_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("/registry/b", "b1", None).await.unwrap();
    c.put("/registry/a", "a1", None).await.unwrap();
    c.put("/registry/gone", "x", None).await.unwrap();
    c.txn(Txn::new().and_then(vec![
        TxnOp::put("/registry/d", "d1", None),
        TxnOp::put("/registry/c", "c1", None),
    ]))
    .await
    .unwrap();
    c.put("/registry/b", "b2", None).await.unwrap();
    c.delete("/registry/gone", None).await.unwrap();
    let lease = c.lease_grant(300, None).await.unwrap().id();
    c.put(
        "/registry/l",
        "held",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let ours = c
        .get("/registry/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    server.stop().await;

    let etcd = RealEtcd::start().await;
    let endpoint = test_endpoint(dir.path());
    let (status, text) = etcdsql_tool(&["--endpoint", &endpoint, "export", "--to-etcd", &etcd.url]);
    assert_eq!(status, 0, "{text}");
    assert!(text.contains("Exported 5 keys and 1 leases"), "{text}");

    let mut theirs = etcd.client().await;
    let copied = theirs
        .get("/registry/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let fields = |kvs: &[etcd_client::KeyValue]| -> Vec<(String, String, i64)> {
        kvs.iter()
            .map(|kv| {
                let key = kv.key_str().unwrap().to_owned();
                (key, kv.value_str().unwrap().to_owned(), kv.lease())
            })
            .collect()
    };
    assert_eq!(fields(copied.kvs()), fields(ours.kvs()));
    // The order of the last writes is kept (etcd's revisions are its own).
    let order = |kvs: &[etcd_client::KeyValue]| -> Vec<String> {
        let mut kvs: Vec<_> = kvs.iter().collect();
        kvs.sort_by_key(|kv| (kv.mod_revision(), kv.key().to_vec()));
        kvs.iter()
            .map(|kv| kv.key_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(order(copied.kvs()), order(ours.kvs()));
    let ttl = theirs.lease_time_to_live(lease, None).await.unwrap();
    assert!(ttl.ttl() > 250 && ttl.ttl() <= 300, "{}", ttl.ttl());

    let (status, text) = etcdsql_tool(&["--endpoint", &endpoint, "export", "--to-etcd", &etcd.url]);
    assert_ne!(status, 0, "{text}");
    assert!(text.contains("holds 5 keys already"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_a_lease_that_ran_out_are_not_exported() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let lease = c.lease_grant(2, None).await.unwrap();
    let ttl = lease.ttl();
    c.put("/registry/kept", "k", None).await.unwrap();
    c.put(
        "/registry/expiring",
        "e",
        Some(PutOptions::new().with_lease(lease.id())),
    )
    .await
    .unwrap();
    // Stopped before the lease runs out, so the store still holds the key and the lease.
    server.stop().await;
    tokio::time::sleep(std::time::Duration::from_secs(ttl as u64 + 1)).await;

    let etcd = RealEtcd::start().await;
    let endpoint = test_endpoint(dir.path());
    let (status, text) = etcdsql_tool(&["--endpoint", &endpoint, "export", "--to-etcd", &etcd.url]);
    assert_eq!(status, 0, "{text}");
    assert!(text.contains("Exported 1 keys and 0 leases"), "{text}");
    let copied = etcd
        .client()
        .await
        .get(
            "/registry/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = copied
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap())
        .collect();
    assert_eq!(keys, ["/registry/kept"]);
}
