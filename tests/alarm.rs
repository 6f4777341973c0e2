//! Alarms through a real client: the space quota raises NOSPACE, which refuses writes that add
//! data (and nothing else) until it is disarmed, survives a restart and reaches every instance
//! of one database; CORRUPT, raised through the API, refuses every write and fails `/readyz`.
//! The same NOSPACE story is checked against etcd 3.5 by the conformance scenario
//! `alarm_nospace`.

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, shared_database, status};
use etcd_client::{AlarmAction, AlarmType, Client};
use tonic::Code;

/// A server whose quota leaves 1 MiB above what its empty database takes (a new PostgreSQL
/// database takes several).
async fn start_with_room(dir: &std::path::Path) -> (TestServer, i64) {
    let probe = TestServer::start(dir).await;
    let empty = probe
        .client()
        .await
        .maintenance_client()
        .status()
        .await
        .unwrap()
        .db_size();
    probe.stop().await;
    let quota = empty + (1 << 20);
    let server = TestServer::start_with(dir, |c| c.quota_backend_bytes = quota).await;
    (server, quota)
}

async fn raised(c: &mut Client) -> Vec<AlarmType> {
    let resp = c
        .maintenance_client()
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap();
    resp.alarms().iter().map(|a| a.alarm()).collect()
}

async fn put_fails_with(c: &mut Client, code: Code, message: &str) {
    let err = status(c.put("small", "1", None).await.unwrap_err());
    assert_eq!((err.code(), err.message()), (code, message));
}

const NOSPACE: &str = "etcdserver: mvcc: database space exceeded";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_refuses_writes_that_add_data_until_disarmed() {
    let dir = tempfile::tempdir().unwrap();
    let (server, quota) = start_with_room(dir.path()).await;
    let mut c = server.client().await;
    c.put("a", "1", None).await.unwrap();
    c.put("b", "2", None).await.unwrap();
    assert!(raised(&mut c).await.is_empty());

    let big = vec![b'x'; 1_200_000];
    let err = status(c.put("big", big, None).await.unwrap_err());
    assert_eq!(
        (err.code(), err.message()),
        (Code::ResourceExhausted, NOSPACE)
    );
    assert_eq!(raised(&mut c).await, vec![AlarmType::Nospace]);
    put_fails_with(&mut c, Code::ResourceExhausted, NOSPACE).await;
    let grant = status(c.lease_grant(10, None).await.unwrap_err());
    assert_eq!(grant.message(), NOSPACE);
    // Reads, deletes and compaction go on: they are how an operator makes room.
    assert_eq!(c.get("a", None).await.unwrap().kvs()[0].value(), b"1");
    assert_eq!(c.delete("b", None).await.unwrap().deleted(), 1);
    let current = common::current_revision(&mut c).await;
    c.compact(current, None).await.unwrap();
    let status = c.maintenance_client().status().await.unwrap();
    assert_eq!(status.errors().len(), 1, "{:?}", status.errors());

    // The alarm is the database's: a restart keeps it.
    server.stop().await;
    let server = TestServer::start_with(dir.path(), |c| c.quota_backend_bytes = quota).await;
    let mut c = server.client().await;
    assert_eq!(raised(&mut c).await, vec![AlarmType::Nospace]);
    put_fails_with(&mut c, Code::ResourceExhausted, NOSPACE).await;

    let disarmed = c
        .maintenance_client()
        .alarm(AlarmAction::Deactivate, AlarmType::Nospace, None)
        .await
        .unwrap();
    assert_eq!(disarmed.alarms().len(), 1);
    assert!(raised(&mut c).await.is_empty());
    c.put("small", "1", None).await.unwrap();
    // Disarming what is not raised changes nothing and says so.
    let again = c
        .maintenance_client()
        .alarm(AlarmAction::Deactivate, AlarmType::Nospace, None)
        .await
        .unwrap();
    assert!(again.alarms().is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_refuses_every_write_and_fails_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("a", "1", None).await.unwrap();
    c.maintenance_client()
        .alarm(AlarmAction::Activate, AlarmType::Corrupt, None)
        .await
        .unwrap();
    put_fails_with(&mut c, Code::DataLoss, "etcdserver: corrupt cluster").await;
    let delete = status(c.delete("a", None).await.unwrap_err());
    assert_eq!(delete.code(), Code::DataLoss);
    let ready = reqwest::get(format!("{}/readyz?verbose", server.url()))
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let body = ready.text().await.unwrap();
    assert!(
        body.contains("[-]data_corruption failed: alarm activated: CORRUPT\n")
            && body.ends_with("readyz check failed\n"),
        "{body}"
    );
    let health = reqwest::get(format!("{}/health", server.url()))
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 503);
    assert_eq!(
        health.text().await.unwrap(),
        "{\"health\":\"false\",\"reason\":\"ALARM CORRUPT\"}\n"
    );
    c.maintenance_client()
        .alarm(AlarmAction::Deactivate, AlarmType::Corrupt, None)
        .await
        .unwrap();
    c.put("a", "2", None).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alarm_raised_on_one_instance_reaches_the_others() {
    if !shared_database() {
        eprintln!("skipped: several instances need ETCDSQL_TEST_BACKEND=postgres or mysql");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let b = TestServer::start(dir.path()).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    ca.maintenance_client()
        .alarm(AlarmAction::Activate, AlarmType::Nospace, None)
        .await
        .unwrap();
    // b reads the alarms again every second.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match cb.put("k", "v", None).await {
            Err(e) => {
                assert_eq!(status(e).message(), NOSPACE);
                break;
            }
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(_) => panic!("instance b still writes 15 s after a raised NOSPACE"),
        }
    }
    cb.maintenance_client()
        .alarm(AlarmAction::Deactivate, AlarmType::Nospace, None)
        .await
        .unwrap();
    cb.put("k", "v", None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while ca.put("k", "w", None).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "instance a still refuses writes 15 s after b disarmed NOSPACE"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.stop().await;
    b.stop().await;
}
