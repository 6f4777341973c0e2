//! The MVCC store through its library API, on a real SQLite file: properties that are about how
//! writes are committed rather than what a client sees.

mod common;

use std::sync::Arc;

use common::test_endpoint;
use etcdsql::backend;
use etcdsql::mvcc::types::{KeyRange, PutRequest, RangeRequest};
use etcdsql::mvcc::{Store, StoreOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

async fn open(
    dir: &std::path::Path,
) -> (
    Store,
    CancellationToken,
    TaskTracker,
    Arc<dyn backend::Backend>,
) {
    let backend = backend::open(&test_endpoint(dir), &Default::default())
        .await
        .unwrap();
    let tasks = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let store = Store::start(
        backend.clone(),
        StoreOptions::default(),
        &tasks,
        shutdown.clone(),
    )
    .await
    .unwrap();
    (store, shutdown, tasks, backend)
}

/// Concurrent writers share database transactions: far fewer commits (fsyncs) than requests,
/// yet every request gets its own revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_are_group_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, shutdown, tasks, backend) = open(dir.path()).await;
    let writers = 64;
    let per_writer = 20;
    let mut handles = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for i in 0..per_writer {
                let out = store
                    .put(PutRequest {
                        key: format!("g/{w}/{i}").into_bytes(),
                        value: Some(b"v".to_vec()),
                        lease: Some(0),
                        prev_kv: false,
                    })
                    .await
                    .unwrap();
                revisions.push(out.revision);
            }
            revisions
        }));
    }
    let mut revisions = Vec::new();
    for h in handles {
        revisions.extend(h.await.unwrap());
    }
    revisions.sort_unstable();
    let total = writers * per_writer;
    assert_eq!(revisions, (2..2 + total as i64).collect::<Vec<_>>());

    let stats = store.write_stats();
    assert_eq!(stats.requests, total as u64);
    assert!(
        stats.batches < stats.requests / 2,
        "expected grouped commits, got {stats:?}"
    );

    let all = store
        .range(&RangeRequest::of(KeyRange::from_etcd(
            b"g/".to_vec(),
            b"g0".to_vec(),
        )))
        .await
        .unwrap();
    assert_eq!(all.value.count, total as i64);
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    backend.close().await;
}
