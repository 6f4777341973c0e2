//! Several etcdsql processes over one PostgreSQL or MySQL database (SPEC.md §9): they can all
//! start at once on a database that does not exist yet, reads see writes acknowledged by another
//! instance, watchers on one instance see writes made through another within a poll interval
//! shortened by LISTEN/NOTIFY (PostgreSQL) or a 10 ms poll of the revision (MySQL), and a lease
//! expires exactly once even after the instance that granted it is gone. The watch guarantee
//! checker also runs over three instances there (tests/watch_guarantees.rs). How the instances'
//! writers share the cluster-wide write lock is tested in [`writers`]. On SQLite these tests say
//! so and pass.

#[path = "../common/mod.rs"]
mod common;
mod writers;

use std::time::Duration;

use common::{TestServer, shared_database};
use etcd_client::{GetOptions, PutOptions, WatchOptions};

const WAIT: Duration = Duration::from_secs(15);

fn skip() -> bool {
    if shared_database() {
        return false;
    }
    eprintln!("skipped: several instances need ETCDSQL_TEST_BACKEND=postgres or mysql");
    true
}

/// Every control-plane node starting etcdsql at boot: the first start creates the database and
/// its schema while the others do the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_started_together_on_a_new_database_all_serve() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = tokio::join!(
        TestServer::start(dir.path()),
        TestServer::start(dir.path()),
        TestServer::start(dir.path()),
    );
    let mut clients = Vec::new();
    for server in [&a, &b, &c] {
        clients.push(server.client().await);
    }
    let put = clients[0].put("together", "v", None).await.unwrap();
    for client in &mut clients {
        let got = client.get("together", None).await.unwrap();
        assert_eq!(
            got.kvs()[0].mod_revision(),
            put.header().unwrap().revision()
        );
    }
    for server in [a, b, c] {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_one_instance_see_writes_acknowledged_by_another() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // No polling to lean on: b's hub catches up when notified, or when a read asks it to.
    let slow_poll = |c: &mut etcdsql::Config| c.watch_poll_interval = Duration::from_secs(3600);
    let a = TestServer::start_with(dir.path(), slow_poll).await;
    let b = TestServer::start_with(dir.path(), slow_poll).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    for i in 0..50 {
        let put = ca
            .put(format!("ryw/{i}"), format!("{i}"), None)
            .await
            .unwrap();
        let revision = put.header().unwrap().revision();
        let got = cb.get(format!("ryw/{i}"), None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), format!("{i}").as_bytes());
        assert!(got.header().unwrap().revision() >= revision);
        // Reads that need no value come from b's applied index once it has caught up with the
        // revision b learned from the database: they see the write too.
        let count = cb
            .get(
                "ryw/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap();
        assert_eq!(count.count(), i + 1);
        assert!(count.header().unwrap().revision() >= revision);
        let key = cb
            .get(format!("ryw/{i}"), Some(GetOptions::new().with_keys_only()))
            .await
            .unwrap();
        assert_eq!(key.kvs()[0].mod_revision(), revision);
        // And the other way round, through a txn.
        let txn = etcd_client::Txn::new().and_then([etcd_client::TxnOp::put(
            format!("back/{i}"),
            "x",
            None,
        )]);
        cb.txn(txn).await.unwrap();
        assert_eq!(
            ca.get(format!("back/{i}"), None).await.unwrap().kvs().len(),
            1
        );
    }
    // One revision order for both: 100 writes, revisions 2..=101.
    let all = ca
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(all.header().unwrap().revision(), 101);
    a.stop().await;
    b.stop().await;
}

/// With the poll interval at an hour, only NOTIFY can wake the other instance's hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_see_other_instances_writes_without_polling() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let slow_poll = |c: &mut etcdsql::Config| c.watch_poll_interval = Duration::from_secs(3600);
    let a = TestServer::start_with(dir.path(), slow_poll).await;
    let b = TestServer::start_with(dir.path(), slow_poll).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let mut watch = cb
        .watch("n/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("the watch is created in time")
        .unwrap();
    for i in 0..5 {
        let put = ca.put(format!("n/{i}"), "v", None).await.unwrap();
        let r = tokio::time::timeout(WAIT, watch.message())
            .await
            .expect("the event arrives without waiting for a poll")
            .unwrap()
            .unwrap();
        assert_eq!(
            r.events()[0].kv().unwrap().mod_revision(),
            put.header().unwrap().revision()
        );
    }
    a.stop().await;
    b.stop().await;
}

/// A lease granted on one instance still expires after that instance stops, and exactly once
/// although every instance runs an expiry loop: one deletion revision for its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_expires_exactly_once_after_its_instance_is_gone() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let b = TestServer::start(dir.path()).await;
    let c = TestServer::start(dir.path()).await;
    let mut ca = a.client().await;
    let lease = ca.lease_grant(2, None).await.unwrap().id();
    for i in 0..20 {
        ca.put(
            format!("x/{i}"),
            "v",
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    }
    let before = ca
        .get("x/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    drop(ca);
    a.stop().await;

    let mut cb = b.client().await;
    let started = tokio::time::Instant::now();
    loop {
        let left = cb
            .get(
                "x/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap();
        if left.count() == 0 {
            break;
        }
        assert!(started.elapsed() < WAIT, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give the other instance's expiry loop time to (wrongly) revoke again, then check.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = cb
        .get("x/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(after, before + 1, "one revision deleted all 20 keys, once");
    assert_eq!(cb.leases().await.unwrap().leases().len(), 0);
    b.stop().await;
    c.stop().await;
}

/// Each instance's writer keeps an index of key metadata; writes through another instance must
/// reach it (caught up from the log, or reloaded after a compaction) before its next batch.
/// Compare-and-swap updates alternate between the instances, so a stale index would fail a
/// compare, report a wrong version or a wrong previous value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_see_each_others_changes_to_the_same_keys() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let b = TestServer::start(dir.path()).await;
    let mut clients = [a.client().await, b.client().await];
    let cas = |revision: i64, value: String| {
        etcd_client::Txn::new()
            .when([etcd_client::Compare::mod_revision(
                "cas",
                etcd_client::CompareOp::Equal,
                revision,
            )])
            .and_then([etcd_client::TxnOp::put(
                "cas",
                value,
                Some(PutOptions::new().with_prev_key()),
            )])
    };
    let (mut revision, mut version) = (0, 0);
    for i in 0..20_i64 {
        let client = &mut clients[(i % 2) as usize];
        let out = client.txn(cas(revision, format!("v{i}"))).await.unwrap();
        assert!(out.succeeded(), "update {i} failed its compare");
        revision = out.header().unwrap().revision();
        version += 1;
        let got = client.get("cas", None).await.unwrap();
        let kv = &got.kvs()[0];
        assert_eq!((kv.version(), kv.mod_revision()), (version, revision));
        if i > 0 {
            let prev = match &out.op_responses()[0] {
                etcd_client::TxnOpResponse::Put(put) => put.prev_key().unwrap().value().to_vec(),
                other => panic!("unexpected response {other:?}"),
            };
            assert_eq!(prev, format!("v{}", i - 1).as_bytes());
        }
        // Delete through one instance, re-create through the other: a fresh key again.
        if i % 5 == 4 {
            clients[(i % 2) as usize].delete("cas", None).await.unwrap();
            let created = clients[((i + 1) % 2) as usize]
                .txn(cas(0, "new".into()))
                .await
                .unwrap();
            assert!(
                created.succeeded(),
                "re-create after {i} failed its compare"
            );
            let got = clients[(i % 2) as usize].get("cas", None).await.unwrap();
            let kv = &got.kvs()[0];
            revision = kv.mod_revision();
            assert_eq!((kv.version(), kv.create_revision()), (1, revision));
            // Compacting through one instance moves the other's index behind the compact
            // revision: it must reload rather than catch up.
            clients[(i % 2) as usize]
                .compact(revision, None)
                .await
                .unwrap();
            let out = clients[((i + 1) % 2) as usize]
                .txn(cas(revision, format!("v{i}")))
                .await
                .unwrap();
            assert!(out.succeeded(), "update after compaction {i} failed");
            revision = out.header().unwrap().revision();
            version = 2;
        }
    }
    a.stop().await;
    b.stop().await;
}

/// A lock and an election held through one instance and waited for through another: the waiter
/// learns of the release from the other instance's commit, by notification, not by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_elections_pass_between_instances() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let slow_poll = |c: &mut etcdsql::Config| c.watch_poll_interval = Duration::from_secs(3600);
    let a = TestServer::start_with(dir.path(), slow_poll).await;
    let b = TestServer::start_with(dir.path(), slow_poll).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let first = ca.lease_grant(60, None).await.unwrap().id();
    let second = cb.lease_grant(60, None).await.unwrap().id();

    let held = ca
        .lock(
            "mi-lock",
            Some(etcd_client::LockOptions::new().with_lease(first)),
        )
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let got = cb
            .lock(
                "mi-lock",
                Some(etcd_client::LockOptions::new().with_lease(second)),
            )
            .await
            .unwrap();
        (cb, got)
    });
    // Unlock once the waiter is in line on b.
    let queued = format!("mi-lock/{second:x}");
    common::wait_for_key(&mut ca, queued.as_bytes(), true, WAIT).await;
    ca.unlock(held.key()).await.unwrap();
    let (mut cb, got) = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("the lock passes to b's waiter without polling")
        .unwrap();
    assert_eq!(got.key(), queued.as_bytes());

    // b leads; an observer on a sees b's proclamation.
    let won = cb.campaign("mi-election", "b", second).await.unwrap();
    let mut observer = ca.observe("mi-election").await.unwrap();
    let seen = tokio::time::timeout(WAIT, observer.message())
        .await
        .expect("the observer reports the leader")
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"b");
    let leader = won.leader().unwrap().clone();
    cb.proclaim(
        "b2",
        Some(etcd_client::ProclaimOptions::new().with_leader(leader)),
    )
    .await
    .unwrap();
    let seen = tokio::time::timeout(WAIT, observer.message())
        .await
        .expect("the observer on a sees b's proclamation without polling")
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"b2");
    a.stop().await;
    b.stop().await;
}

/// Users, roles and the auth switch changed through one instance hold on the others within the
/// auth refresh interval (`etcdsql::auth::REFRESH`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_changes_reach_every_instance() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let b = TestServer::start(dir.path()).await;
    let mut ca = a.client().await;
    ca.put("shared", "1", None).await.unwrap();
    ca.user_add("root", "rootpw", None).await.unwrap();
    ca.user_grant_role("root", "root").await.unwrap();
    ca.role_add("reader").await.unwrap();
    ca.role_grant_permission("reader", etcd_client::Permission::read("shared"))
        .await
        .unwrap();
    ca.user_add("alice", "alicepw", None).await.unwrap();
    ca.user_grant_role("alice", "reader").await.unwrap();
    ca.auth_enable().await.unwrap();

    // b turns auth on by itself, then knows alice and her role.
    let mut cb = b.client().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while cb.get("shared", None).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "b still serves anonymous reads {WAIT:?} after auth was enabled on a"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let alice = etcd_client::ConnectOptions::new().with_user("alice", "alicepw");
    let mut alice_b = etcd_client::Client::connect([b.url()], Some(alice))
        .await
        .unwrap();
    alice_b.get("shared", None).await.unwrap();

    // A revocation on a reaches b.
    let root = etcd_client::ConnectOptions::new().with_user("root", "rootpw");
    let mut root_a = etcd_client::Client::connect([a.url()], Some(root))
        .await
        .unwrap();
    root_a.user_revoke_role("alice", "reader").await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while alice_b.get("shared", None).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "b still lets alice read {WAIT:?} after her role was revoked on a"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.stop().await;
    b.stop().await;
}

/// Ends every connection the database has to `endpoint`'s database but the one asking, as an
/// administrator, a restarted pooler or an idle-session timeout would.
async fn end_connections(endpoint: &str) {
    if common::on_postgres() {
        common::execute_sql(
            endpoint,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .await;
    } else {
        let pool = sqlx::MySqlPool::connect(endpoint).await.unwrap();
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM information_schema.processlist \
             WHERE db = DATABASE() AND id <> CONNECTION_ID()",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(
            !ids.is_empty(),
            "the server holds connections to the database"
        );
        for id in ids {
            // A connection may have gone by itself meanwhile.
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(&pool)
                .await;
        }
    }
}

/// A linearizable read asks the database for its revision on a connection the server keeps for
/// that; when the database ends that connection between two reads, the next read still gets
/// its answer (the server takes a new connection) rather than an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_on_when_the_database_ends_the_servers_connections() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut client = server.client().await;
    let put = client.put("ended", "v", None).await.unwrap();
    let revision = put.header().unwrap().revision();
    for round in 0..3 {
        // The read before sets the probe's connection up; the one after must not trip on it.
        assert_eq!(client.get("ended", None).await.unwrap().kvs().len(), 1);
        end_connections(&common::test_endpoint(dir.path())).await;
        let got = client
            .get("ended", None)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the read after the connections ended: {e}"));
        assert_eq!(got.kvs()[0].value(), b"v");
        assert!(got.header().unwrap().revision() >= revision);
    }
    server.stop().await;
}

/// A counter's value on `server`'s `/metrics` (0 if absent).
async fn metric(server: &TestServer, sample: &str) -> f64 {
    common::metrics_text(server)
        .await
        .lines()
        .find_map(|line| line.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}
