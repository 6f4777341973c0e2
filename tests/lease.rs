//! Leases: expiry logic on a controlled clock through the library, and the Lease API end to end
//! through the `etcd-client` crate with short real TTLs (SPEC.md §5).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, status, test_endpoint};
use etcd_client::{EventType, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions};
use etcdsql::backend;
use etcdsql::lease::{Lessor, ManualClock};
use etcdsql::mvcc::types::{KeyRange, PutRequest, RangeRequest};
use etcdsql::mvcc::{Store, StoreOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(15);

fn put(key: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: Some(b"v".to_vec()),
        lease: Some(lease),
        prev_kv: false,
    }
}

async fn count(store: &Store, prefix: &str) -> i64 {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let mut req = RangeRequest::of(KeyRange::from_etcd(prefix.as_bytes().to_vec(), end));
    req.count_only = true;
    store.range(&req).await.unwrap().value.count
}

/// Expiry on a clock the test moves: nothing expires early, everything expires on time, a
/// keep-alive moves the deadline, a key moved to another lease stays, and 1,000 keys on one
/// lease go in one revision.
#[tokio::test]
async fn expiry_follows_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend::open(&test_endpoint(dir.path()), &Default::default())
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
    let clock = Arc::new(ManualClock::new(1_000_000));
    let lessor = Lessor::new(store.clone(), clock.clone());

    let events = lessor.grant(0, 10).await.unwrap().value;
    let master = lessor.grant(0, 15).await.unwrap().value;
    let other = lessor.grant(77, 100).await.unwrap().value;
    assert_ne!(events.id, 0);
    for i in 0..1000 {
        store
            .put(put(&format!("ev/{i:04}"), events.id))
            .await
            .unwrap();
    }
    store.put(put("master/a", master.id)).await.unwrap();
    // Rewritten under another lease: the first lease no longer owns it.
    store.put(put("ev/moved", events.id)).await.unwrap();
    store.put(put("ev/moved", other.id)).await.unwrap();
    let before = store.revisions().await.unwrap().current;

    clock.advance(Duration::from_millis(9_999));
    assert_eq!(lessor.expire_due().await.unwrap(), 0);
    assert_eq!(count(&store, "ev/").await, 1001);
    // Keep the master lease alive at 9.999 s: it now runs to 24.999 s.
    assert_eq!(lessor.keep_alive(master.id).await.unwrap().value, Some(15));

    clock.advance(Duration::from_millis(1));
    assert_eq!(lessor.expire_due().await.unwrap(), 1);
    assert_eq!(count(&store, "ev/").await, 1, "only the moved key is left");
    let after = store.revisions().await.unwrap().current;
    assert_eq!(after, before + 1, "1,000 deletions, one revision");
    let status = lessor.time_to_live(events.id, false).await.unwrap().value;
    assert!(status.is_none(), "an expired lease is gone");
    assert_eq!(lessor.keep_alive(events.id).await.unwrap().value, None);

    clock.advance(Duration::from_millis(14_998)); // 24.998 s
    assert_eq!(lessor.expire_due().await.unwrap(), 0);
    let status = lessor
        .time_to_live(master.id, true)
        .await
        .unwrap()
        .value
        .unwrap();
    assert_eq!(
        (status.granted_ttl, status.remaining_ttl, status.keys),
        (15, 0, vec![b"master/a".to_vec()])
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(lessor.expire_due().await.unwrap(), 1);
    assert_eq!(count(&store, "master/").await, 0);

    // Thousands of leases due at once are all revoked, one revision each.
    let leases = 2000;
    let grants: Vec<_> = (0..leases)
        .map(|_| {
            let (lessor, store) = (lessor.clone(), store.clone());
            tokio::spawn(async move {
                let lease = lessor.grant(0, 5).await.unwrap().value;
                store
                    .put(put(&format!("many/{}", lease.id), lease.id))
                    .await
                    .unwrap();
            })
        })
        .collect();
    for grant in grants {
        grant.await.unwrap();
    }
    let before = store.revisions().await.unwrap().current;
    clock.advance(Duration::from_secs(5));
    assert_eq!(lessor.expire_due().await.unwrap(), leases);
    assert_eq!(count(&store, "many/").await, 0);
    assert_eq!(
        store.revisions().await.unwrap().current,
        before + leases as i64
    );
    assert_eq!(lessor.leases().await.unwrap().value, vec![other.id]);

    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    backend.close().await;
}

#[tokio::test]
async fn grant_ids_ttls_and_errors_follow_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;

    let chosen = c.lease_grant(60, None).await.unwrap();
    assert!(chosen.id() > 0);
    assert_eq!(chosen.ttl(), 60);
    let mine = c
        .lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .unwrap();
    assert_eq!((mine.id(), mine.ttl()), (0x1234, 30));
    let taken = status(
        c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1234)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (taken.code(), taken.message()),
        (Code::FailedPrecondition, "etcdserver: lease already exists")
    );
    // Below etcd's minimum, the TTL is raised to it.
    assert_eq!(c.lease_grant(1, None).await.unwrap().ttl(), 2);
    let huge = status(c.lease_grant(9_000_000_001, None).await.unwrap_err());
    assert_eq!(
        (huge.code(), huge.message()),
        (Code::OutOfRange, "etcdserver: too large lease TTL")
    );

    let mut listed: Vec<i64> = c
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    listed.sort_unstable();
    assert!(listed.contains(&0x1234) && listed.contains(&chosen.id()));
    assert_eq!(listed.len(), 3);

    // A put naming an unknown lease fails and writes nothing.
    let unknown = status(
        c.put("k", "v", Some(PutOptions::new().with_lease(999)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (unknown.code(), unknown.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );
    let nothing = c.get("k", None).await.unwrap();
    assert!(nothing.kvs().is_empty());
    assert_eq!(nothing.header().unwrap().revision(), 1);

    let ttl = c
        .lease_time_to_live(999, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!((ttl.ttl(), ttl.granted_ttl()), (-1, 0));
    let revoke = status(c.lease_revoke(999).await.unwrap_err());
    assert_eq!(revoke.code(), Code::NotFound);
    server.stop().await;
}

/// Revokes `lease` while watching `prefix` from `start` with prev_kv: the revision the
/// revocation took, and each event it caused as (type, revision, and the previous key, value and
/// lease).
async fn revoke_watched(
    c: &mut etcd_client::Client,
    lease: i64,
    prefix: &str,
    start: i64,
) -> (i64, Vec<(EventType, i64, Vec<u8>, Vec<u8>, i64)>) {
    let options = etcd_client::WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(start);
    let mut watch = c.watch(prefix, Some(options)).await.unwrap();
    watch.message().await.unwrap();
    let revoked = c.lease_revoke(lease).await.unwrap();
    let r = tokio::time::timeout(WAIT, watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let events = r
        .events()
        .iter()
        .map(|e| {
            let prev = e.prev_kv().unwrap();
            (
                e.event_type(),
                e.kv().unwrap().mod_revision(),
                prev.key().to_vec(),
                prev.value().to_vec(),
                prev.lease(),
            )
        })
        .collect();
    (revoked.header().unwrap().revision(), events)
}

#[tokio::test]
async fn revoke_deletes_attached_keys_in_one_revision_with_delete_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("r/a", "1", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap(); // 2
    c.put("r/b", "2", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap(); // 3
    c.put("r/c", "3", None).await.unwrap(); // 4
    let ttl = c
        .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.keys(), [b"r/a".to_vec(), b"r/b".to_vec()]);
    assert_eq!(ttl.granted_ttl(), 600);
    assert!(ttl.ttl() > 590 && ttl.ttl() <= 600);

    let (revoked, deletes) = revoke_watched(&mut c, lease, "r/", 5).await;
    assert_eq!(revoked, 5);
    let deletes: Vec<_> = deletes
        .into_iter()
        .map(|(event, revision, key, _, lease)| (event, revision, key, lease))
        .collect();
    assert_eq!(
        deletes,
        vec![
            (EventType::Delete, 5, b"r/a".to_vec(), lease),
            (EventType::Delete, 5, b"r/b".to_vec(), lease),
        ]
    );
    let left = c
        .get("r/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(left.kvs().len(), 1);
    server.stop().await;
}

/// A revocation deletes the keys the lease holds at that moment: not a key moved to another
/// lease or deleted since, and a key attached or created again later is; each deletion's
/// prev_kv is the value it ended.
#[tokio::test]
async fn revoke_deletes_the_keys_the_lease_holds_now() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let first = c.lease_grant(600, None).await.unwrap().id();
    let second = c.lease_grant(600, None).await.unwrap().id();
    let with = |lease| Some(PutOptions::new().with_lease(lease));
    c.put("h/a", "a1", with(first)).await.unwrap();
    c.put("h/b", "b1", with(first)).await.unwrap();
    c.put("h/c", "c1", with(first)).await.unwrap();
    c.put("h/c", "c2", with(second)).await.unwrap();
    c.put("h/d", "d1", None).await.unwrap();
    c.put("h/d", "d2", with(first)).await.unwrap();
    c.put("h/e", "e1", with(first)).await.unwrap();
    c.delete("h/e", None).await.unwrap();
    c.delete("h/b", None).await.unwrap();
    c.put("h/b", "b2", with(first)).await.unwrap();
    let revision = c
        .put("h/a", "a2", with(first))
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();

    // TimeToLive lists the same keys the revocation is about to delete, in key order.
    let ttl = c
        .lease_time_to_live(first, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(
        ttl.keys(),
        [b"h/a".to_vec(), b"h/b".to_vec(), b"h/d".to_vec()]
    );

    let (_, deletes) = revoke_watched(&mut c, first, "h/", revision + 1).await;
    let deletes: Vec<_> = deletes
        .into_iter()
        .map(|(event, revision, key, value, _)| {
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
            (event, revision, text(key), text(value))
        })
        .collect();
    let deleted = |key: &str, value: &str| {
        (
            EventType::Delete,
            revision + 1,
            key.to_string(),
            value.to_string(),
        )
    };
    assert_eq!(
        deletes,
        [
            deleted("h/a", "a2"),
            deleted("h/b", "b2"),
            deleted("h/d", "d2")
        ]
    );
    let left = c
        .get("h/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let left: Vec<_> = left.kvs().iter().map(|kv| kv.key().to_vec()).collect();
    assert_eq!(left, [b"h/c".to_vec()]);
    let ttl = c
        .lease_time_to_live(second, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.keys(), [b"h/c".to_vec()]);
    // A restarted server knows each lease's keys from the log.
    server.stop().await;
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let ttl = c
        .lease_time_to_live(second, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.keys(), [b"h/c".to_vec()]);
    server.stop().await;
}

#[tokio::test]
async fn keep_alive_answers_every_request_and_unknown_leases_with_zero() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let lease = c.lease_grant(20, None).await.unwrap().id();
    let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.unwrap();
    for _ in 0..3 {
        keeper.keep_alive().await.unwrap();
        let r = tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((r.id(), r.ttl()), (lease, 20));
    }
    // The client sends a first keep-alive and reads etcd's answer for an unknown lease, TTL 0,
    // as "lease not found".
    match c.lease_keep_alive(4242).await {
        Err(etcd_client::Error::LeaseKeepAliveError(message)) => {
            assert_eq!(message, "lease not found");
        }
        other => panic!("expected the unknown lease to be refused, got {other:?}"),
    }
    server.stop().await;
}

/// Real time: a 2 s lease runs out, its keys vanish, and watchers see DELETE events with the
/// deleted values; a lease kept alive meanwhile survives.
#[tokio::test]
async fn leases_expire_on_time_and_keep_alive_extends_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let short = c.lease_grant(2, None).await.unwrap().id();
    let kept = c.lease_grant(2, None).await.unwrap().id();
    c.put("e/short", "gone", Some(PutOptions::new().with_lease(short)))
        .await
        .unwrap();
    c.put("e/kept", "stays", Some(PutOptions::new().with_lease(kept)))
        .await
        .unwrap();
    let mut watch = c
        .watch(
            "e/short",
            Some(etcd_client::WatchOptions::new().with_prev_key()),
        )
        .await
        .unwrap();
    watch.message().await.unwrap();
    let (mut keeper, mut answers) = c.lease_keep_alive(kept).await.unwrap();
    // Expiry also happens under write load.
    let load = {
        let mut c = c.clone();
        tokio::spawn(async move {
            for i in 0..100_000u64 {
                if c.put(format!("load/{}", i % 100), "x", None).await.is_err() {
                    return;
                }
            }
        })
    };

    let started = tokio::time::Instant::now();
    let event = loop {
        keeper.keep_alive().await.unwrap();
        answers.message().await.unwrap().unwrap();
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(500), watch.message()).await {
            break r.unwrap().unwrap();
        }
        assert!(started.elapsed() < WAIT, "the short lease never expired");
    };
    let e = &event.events()[0];
    assert_eq!(e.event_type(), EventType::Delete);
    assert_eq!(e.prev_kv().unwrap().value(), b"gone");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "not before its TTL"
    );
    assert!(c.get("e/short", None).await.unwrap().kvs().is_empty());
    let still = c.get("e/kept", None).await.unwrap();
    assert_eq!(still.kvs()[0].value(), b"stays");
    assert_eq!(c.lease_time_to_live(short, None).await.unwrap().ttl(), -1);
    load.abort();
    server.stop().await;
}

/// A lease's deadline is stored, not its countdown: time spent while the server is down counts.
#[tokio::test]
async fn a_restart_keeps_the_remaining_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let lease = c.lease_grant(4, None).await.unwrap().id();
    c.put("d/k", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    server.stop().await;
    tokio::time::sleep(Duration::from_millis(2100)).await;

    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 4);
    assert!(ttl.ttl() <= 1, "about 2 s were left, got {}", ttl.ttl());
    let started = tokio::time::Instant::now();
    while !c.get("d/k", None).await.unwrap().kvs().is_empty() {
        assert!(
            started.elapsed() < WAIT,
            "the lease never expired after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "it did not start over"
    );
    server.stop().await;
}
