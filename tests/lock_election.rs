//! etcd's Lock and Election services through the `etcd-client` crate, as etcd answers them.
//! test.sh runs this file a second time against real etcd 3.5 (`ETCDSQL_REFERENCE_ENDPOINT`),
//! so every expectation here is etcd's own behaviour.

mod common;

use std::time::Duration;

use common::{Target, status, wait_for_key};
use etcd_client::{Client, LeaderKey, LockOptions, ProclaimOptions, ResignOptions};
use tonic::Code;

/// Long enough for any request on a busy machine; a wait past it is a failure, not a hang.
const BOUND: Duration = Duration::from_secs(20);
/// How long a request that must keep waiting is given to (wrongly) return.
const STILL_WAITING: Duration = Duration::from_millis(500);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {BOUND:?}"))
}

async fn grant(c: &mut Client, ttl: i64) -> i64 {
    within("grant", c.lease_grant(ttl, None))
        .await
        .expect("grant")
        .id()
}

fn holder(name: &str, lease: i64) -> Vec<u8> {
    format!("{name}/{lease:x}").into_bytes()
}

async fn lock(c: &mut Client, name: &str, lease: i64) -> etcd_client::LockResponse {
    within(
        "lock",
        c.lock(name, Some(LockOptions::new().with_lease(lease))),
    )
    .await
    .expect("lock")
}

/// A target, a client on it, a name under the test's prefix and two leases.
async fn setup(dir: &std::path::Path, name: &str) -> (Target, Client, String, i64, i64) {
    let target = Target::start(dir).await;
    let mut c = target.client().await;
    let name = target.key(name);
    let first = grant(&mut c, 60).await;
    let second = grant(&mut c, 60).await;
    (target, c, name, first, second)
}

/// Starts `name`'s lock for `lease` on a client of its own.
fn lock_in_background(
    client: Client,
    name: &str,
    lease: i64,
) -> tokio::task::JoinHandle<etcd_client::LockResponse> {
    let (mut client, name) = (client, name.to_owned());
    tokio::spawn(async move { lock(&mut client, &name, lease).await })
}

#[tokio::test]
async fn lock_is_held_until_unlocked_then_passes_to_the_next_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let (target, mut c, name, first, second) = setup(dir.path(), "lock").await;

    let held = lock(&mut c, &name, first).await;
    assert_eq!(held.key(), holder(&name, first));
    let got = c.get(held.key(), None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!(kv.lease(), first);
    assert_eq!(kv.value(), b"");
    // Uncontended, the answer's header is the txn that queued the key.
    assert_eq!(held.header().unwrap().revision(), kv.create_revision());

    // The same lease locks again at once: it is the same holding.
    let again = lock(&mut c, &name, first).await;
    assert_eq!(again.key(), held.key());

    let mut waiter = lock_in_background(target.client().await, &name, second);
    assert!(
        tokio::time::timeout(STILL_WAITING, &mut waiter)
            .await
            .is_err(),
        "a second lease got the lock while the first held it"
    );
    // The waiter is in line with its own key.
    let queued = c.get(holder(&name, second), None).await.unwrap();
    assert_eq!(queued.kvs().len(), 1);

    let unlocked = within("unlock", c.unlock(held.key())).await.unwrap();
    let got = within("the waiter", waiter).await.unwrap();
    assert_eq!(got.key(), holder(&name, second));
    // Contended, the header is the read that found the waiter first in line.
    assert!(got.header().unwrap().revision() >= unlocked.header().unwrap().revision());
    target.stop().await;
}

#[tokio::test]
async fn a_revoked_lease_releases_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (target, mut c, name, first, second) = setup(dir.path(), "lock").await;
    lock(&mut c, &name, first).await;

    let waiter = lock_in_background(target.client().await, &name, second);
    within("revoke", c.lease_revoke(first)).await.unwrap();
    let got = within("the waiter", waiter).await.unwrap();
    assert_eq!(got.key(), holder(&name, second));
    target.stop().await;
}

#[tokio::test]
async fn a_waiter_that_gives_up_leaves_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let (target, mut c, name, first, second) = setup(dir.path(), "lock").await;
    let held = lock(&mut c, &name, first).await;

    let waiter = lock_in_background(target.client().await, &name, second);
    // Once it is in line, cancel its request.
    wait_for_key(&mut c, &holder(&name, second), true, BOUND).await;
    waiter.abort();
    wait_for_key(&mut c, &holder(&name, second), false, BOUND).await;
    // The holder is untouched.
    assert_eq!(c.get(held.key(), None).await.unwrap().kvs().len(), 1);
    target.stop().await;
}

#[tokio::test]
async fn lock_errors_are_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let mut c = target.client().await;
    let name = target.key("lock");

    let missing = within(
        "lock",
        c.lock(
            name.as_str(),
            Some(LockOptions::new().with_lease(0x7e57_0001)),
        ),
    )
    .await
    .expect_err("a lease that does not exist");
    let missing = status(missing);
    // etcd's server takes locks through its own client, which hands on the error by message.
    assert_eq!(missing.code(), Code::Unknown);
    assert_eq!(missing.message(), "etcdserver: requested lease not found");
    // Nothing was queued.
    let left = c
        .get(
            name.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(left.kvs().is_empty());

    // Unlocking a key nobody holds is fine: it deletes nothing.
    let before = common::current_revision(&mut c).await;
    let unlocked = within("unlock", c.unlock(holder(&name, 1))).await.unwrap();
    assert_eq!(unlocked.header().unwrap().revision(), before);
    target.stop().await;
}

#[tokio::test]
async fn a_lock_without_a_lease_gets_a_sixty_second_one() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let mut c = target.client().await;
    let name = target.key("lock");
    let held = within("lock", c.lock(name.as_str(), None)).await.unwrap();
    let got = c.get(held.key(), None).await.unwrap();
    let lease = got.kvs()[0].lease();
    assert_ne!(lease, 0);
    assert_eq!(held.key(), holder(&name, lease));
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 60);
    c.lease_revoke(lease).await.unwrap();
    target.stop().await;
}

/// Eight clients take turns on one lock to increment a counter by read-then-write: with mutual
/// exclusion no increment is lost.
#[tokio::test]
async fn the_lock_excludes_under_contention() {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let name = target.key("lock");
    let counter = target.key("counter");
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = target.client().await;
        let (name, counter) = (name.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let lease = grant(&mut c, 60).await;
            for _ in 0..ROUNDS {
                let held = lock(&mut c, &name, lease).await;
                let got = c.get(counter.as_str(), None).await.unwrap();
                let n: usize = got
                    .kvs()
                    .first()
                    .map_or(0, |kv| kv.value_str().unwrap().parse().unwrap());
                // Give another client every chance to slip in, were the lock not exclusive.
                tokio::task::yield_now().await;
                c.put(counter.as_str(), (n + 1).to_string(), None)
                    .await
                    .unwrap();
                within("unlock", c.unlock(held.key())).await.unwrap();
            }
            c.lease_revoke(lease).await.unwrap();
        }));
    }
    for task in tasks {
        within("a client's rounds", task).await.unwrap();
    }
    let mut c = target.client().await;
    let got = c.get(counter.as_str(), None).await.unwrap();
    assert_eq!(
        got.kvs()[0].value_str().unwrap(),
        (CLIENTS * ROUNDS).to_string()
    );
    target.stop().await;
}

#[tokio::test]
async fn election_passes_leadership_in_order_and_observers_see_each_value() {
    let dir = tempfile::tempdir().unwrap();
    let (target, mut c, name, first, second) = setup(dir.path(), "election").await;

    let won = within("campaign", c.campaign(name.as_str(), "a", first))
        .await
        .unwrap();
    let leader = won.leader().unwrap().clone();
    assert_eq!(leader.name(), name.as_bytes());
    assert_eq!(leader.key(), holder(&name, first));
    assert_eq!(leader.lease(), first);
    assert_eq!(leader.rev(), won.header().unwrap().revision());

    let now = within("leader", c.leader(name.as_str())).await.unwrap();
    let kv = now.kv().unwrap();
    assert_eq!(kv.key(), leader.key());
    assert_eq!(kv.value(), b"a");
    assert_eq!(kv.create_revision(), leader.rev());

    let mut observer = within("observe", c.observe(name.as_str())).await.unwrap();
    let seen = within("the first observation", observer.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"a");

    let mut rival_client = target.client().await;
    let rival_name = name.clone();
    let mut rival = tokio::spawn(async move {
        within(
            "campaign",
            rival_client.campaign(rival_name.as_str(), "b", second),
        )
        .await
        .unwrap()
    });
    assert!(
        tokio::time::timeout(STILL_WAITING, &mut rival)
            .await
            .is_err(),
        "a second candidate won while the first led"
    );

    let proclaimed = within(
        "proclaim",
        c.proclaim(
            "a2",
            Some(ProclaimOptions::new().with_leader(leader.clone())),
        ),
    )
    .await
    .unwrap();
    let seen = within("the proclamation", observer.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"a2");
    assert_eq!(
        seen.header().unwrap().revision(),
        proclaimed.header().unwrap().revision()
    );

    within(
        "resign",
        c.resign(Some(ResignOptions::new().with_leader(leader.clone()))),
    )
    .await
    .unwrap();
    let rival = within("the rival", rival).await.unwrap();
    assert_eq!(rival.leader().unwrap().key(), holder(&name, second));
    let seen = within("the new leader", observer.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"b");
    assert_eq!(seen.kv().unwrap().key(), holder(&name, second));

    // The old leadership is gone: proclaiming with it fails.
    let stale = within(
        "proclaim",
        c.proclaim("late", Some(ProclaimOptions::new().with_leader(leader))),
    )
    .await
    .expect_err("no longer the leader");
    let stale = status(stale);
    assert_eq!(stale.code(), Code::Unknown);
    assert_eq!(stale.message(), "election: not leader");
    target.stop().await;
}

#[tokio::test]
async fn campaigning_again_with_the_same_lease_keeps_the_place_and_takes_the_new_value() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let mut c = target.client().await;
    let name = target.key("election");
    let lease = grant(&mut c, 60).await;
    let first = within("campaign", c.campaign(name.as_str(), "one", lease))
        .await
        .unwrap();
    let again = within("campaign", c.campaign(name.as_str(), "two", lease))
        .await
        .unwrap();
    assert_eq!(again.leader().unwrap().rev(), first.leader().unwrap().rev());
    let now = c.leader(name.as_str()).await.unwrap();
    assert_eq!(now.kv().unwrap().value(), b"two");
    // The answer reports the revision of the campaign's own txn, before the new value.
    assert!(again.header().unwrap().revision() < now.kv().unwrap().mod_revision());
    target.stop().await;
}

#[tokio::test]
async fn election_errors_are_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let mut c = target.client().await;
    let name = target.key("election");

    let none = status(
        within("leader", c.leader(name.as_str()))
            .await
            .expect_err("nobody campaigns"),
    );
    assert_eq!(none.code(), Code::Unknown);
    assert_eq!(none.message(), "election: no leader");

    for missing in [
        within("proclaim", c.proclaim("v", None)).await.map(drop),
        within("resign", c.resign(None)).await.map(drop),
    ] {
        let missing = status(missing.expect_err("no leader key"));
        assert_eq!(missing.code(), Code::Unknown);
        assert_eq!(missing.message(), "\"leader\" field must be provided");
    }

    // Resigning a leadership that is not held changes nothing and succeeds.
    let lease = grant(&mut c, 60).await;
    let before = common::current_revision(&mut c).await;
    let gone = LeaderKey::new()
        .with_name(name.as_str())
        .with_key(holder(&name, lease))
        .with_rev(1)
        .with_lease(lease);
    let resigned = within(
        "resign",
        c.resign(Some(ResignOptions::new().with_leader(gone))),
    )
    .await
    .unwrap();
    assert_eq!(resigned.header().unwrap().revision(), before);

    let missing = status(
        within("campaign", c.campaign(name.as_str(), "v", 0x7e57_0002))
            .await
            .expect_err("a lease that does not exist"),
    );
    assert_eq!(missing.code(), Code::Unknown);
    assert_eq!(missing.message(), "etcdserver: requested lease not found");
    target.stop().await;
}

/// An observer of an election nobody leads yet reports the first candidate once it puts its
/// key, then follows leaders as they change.
#[tokio::test]
async fn observing_an_empty_election_waits_for_its_first_leader() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let mut c = target.client().await;
    let name = target.key("election");
    // etcd sends an Observe stream's headers only with its first message, so the client's
    // call itself waits for the first leader.
    let mut observer_client = target.client().await;
    let observed = name.clone();
    let observer = tokio::spawn(async move {
        let mut stream = within("observe", observer_client.observe(observed.as_str()))
            .await
            .unwrap();
        within("the first leader", stream.message())
            .await
            .unwrap()
            .unwrap()
    });
    let lease = grant(&mut c, 60).await;
    let won = within("campaign", c.campaign(name.as_str(), "first", lease))
        .await
        .unwrap();
    let seen = within("the observer", observer).await.unwrap();
    let kv = seen.kv().unwrap();
    assert_eq!(kv.key(), won.leader().unwrap().key());
    assert_eq!(kv.value(), b"first");
    assert!(seen.header().unwrap().revision() >= kv.mod_revision());
    c.lease_revoke(lease).await.unwrap();
    target.stop().await;
}
