//! Maintenance.Snapshot and restoring what it streams: a snapshot taken while the server serves
//! restores into an empty store (SQLite, and the backend under test) with the same keys,
//! revisions, leases and users; a damaged snapshot and a store that is not empty are refused.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{TestServer, etcdsql_tool, fields, test_endpoint};
use etcd_client::{Client, GetOptions, PutOptions};
use sha2::{Digest, Sha256};

/// Everything a client can see of a store.
async fn contents(c: &mut Client) -> (i64, Vec<common::Fields>, Vec<String>, Vec<(i64, i64)>) {
    let all = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    let users = c.user_list().await.unwrap().users().to_vec();
    let mut leases = Vec::new();
    for lease in c.leases().await.unwrap().leases() {
        let ttl = c.lease_time_to_live(lease.id(), None).await.unwrap();
        leases.push((lease.id(), ttl.granted_ttl()));
    }
    (
        all.header().unwrap().revision(),
        fields(all.kvs()),
        users,
        leases,
    )
}

async fn open(endpoint: &str) -> Arc<dyn etcdsql::backend::Backend> {
    etcdsql::backend::open(endpoint, &etcdsql::backend::PoolOptions::default())
        .await
        .unwrap()
}

/// Streams a snapshot through the client and writes it to `file`; returns its bytes.
async fn save(c: &mut Client, file: &Path) -> Vec<u8> {
    let mut stream = c.maintenance_client().snapshot().await.unwrap();
    let mut blobs = Vec::new();
    while let Some(part) = stream.message().await.unwrap() {
        blobs.push(part.blob().to_vec());
    }
    let checksum = blobs.pop().expect("a checksum message");
    let database: Vec<u8> = blobs.concat();
    assert_eq!(checksum[..], Sha256::digest(&database)[..]);
    assert!(database.starts_with(b"SQLite format 3\0"));
    let mut bytes = database;
    bytes.extend_from_slice(&checksum);
    std::fs::write(file, &bytes).unwrap();
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_into_an_empty_store_with_everything_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..50 {
        c.put(format!("k/{i:02}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    for i in 0..10 {
        c.put(format!("k/{i:02}"), "again", None).await.unwrap();
    }
    c.delete("k/49", None).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("leased", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    c.user_add("someone", "pw", None).await.unwrap();
    c.compact(20, None).await.unwrap();
    let before = contents(&mut c).await;

    let file = dir.path().join("snapshot.db");
    let bytes = save(&mut c, &file).await;
    assert_eq!(
        bytes.len() % 512,
        32,
        "whole pages and a SHA-256, as etcd's"
    );
    // Writes after the snapshot are not in it.
    c.put("later", "1", None).await.unwrap();
    server.stop().await;

    // Into the backend under test, and always into a SQLite file too.
    let restored_dir = tempfile::tempdir().unwrap();
    let sqlite_dir = tempfile::tempdir().unwrap();
    for target in [restored_dir.path(), sqlite_dir.path()] {
        let endpoint = if target == sqlite_dir.path() {
            format!("sqlite://{}", target.join("state.db").display())
        } else {
            test_endpoint(target)
        };
        let backend = open(&endpoint).await;
        etcdsql::snapshot::restore(&backend, &file).await.unwrap();
        // Once restored, the store is not empty any more.
        let again = etcdsql::snapshot::restore(&backend, &file)
            .await
            .unwrap_err();
        assert!(again.to_string().contains("not empty"), "{again}");
        backend.close().await;
        // What records which row replaced which was rebuilt consistently with the rows.
        let (status, text) = etcdsql_tool(&["check", &endpoint]);
        assert_eq!(status, 0, "{endpoint}: {text}");
    }
    for target in [restored_dir.path(), sqlite_dir.path()] {
        let server = if target == sqlite_dir.path() {
            TestServer::start_with(target, |c| {
                c.endpoint = format!("sqlite://{}", target.join("state.db").display());
            })
            .await
        } else {
            TestServer::start(target).await
        };
        let mut c = server.client().await;
        assert_eq!(contents(&mut c).await, before);
        // The history before the compaction is gone there too; after it, it is there.
        assert!(
            c.get("k/00", Some(GetOptions::new().with_revision(10)))
                .await
                .is_err()
        );
        let old = c
            .get("k/00", Some(GetOptions::new().with_revision(45)))
            .await
            .unwrap();
        assert_eq!(old.kvs()[0].value(), b"v0");
        // New writes continue the revisions.
        let put = c.put("after", "1", None).await.unwrap();
        assert_eq!(put.header().unwrap().revision(), before.0 + 1);
        server.stop().await;
    }
}

#[tokio::test]
async fn a_damaged_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("k", "v", None).await.unwrap();
    let file = dir.path().join("snapshot.db");
    let mut bytes = save(&mut c, &file).await;
    server.stop().await;
    bytes[100] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let target = tempfile::tempdir().unwrap();
    let backend = open(&format!(
        "sqlite://{}",
        target.path().join("s.db").display()
    ))
    .await;
    let refused = etcdsql::snapshot::restore(&backend, &file)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("checksum"), "{refused}");
    backend.close().await;
}
