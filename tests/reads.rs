//! Reads of the current revision, which the server takes from its applied index in memory
//! (values it lacks by primary key), against the same reads made at the revision they reported
//! once the index has moved past it: both must answer alike, while puts, deletes, expiring
//! leases and compaction run beside them. Without history in memory those later reads take the
//! SQL path, once with room for every value and once with room for a few (so that most values
//! are evicted and read back by primary key); with history they are answered from memory too,
//! once more with room for a few of the values the history replaced.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{TestServer, fields, status};
use etcd_client::{
    Client, CompactionOptions, DeleteOptions, GetOptions, GetResponse, PutOptions, SortOrder,
    SortTarget,
};
use rand::{Rng, SeedableRng};
use tonic::Code;

const KEYS: usize = 40;
const WRITERS: u64 = 3;
const OPS_PER_WRITER: usize = 1000;

fn key(i: usize) -> String {
    format!("d/{i:03}")
}

/// The reads compared: each shape a Range can take that the memory path answers differently.
fn shapes() -> Vec<(&'static str, String, GetOptions)> {
    let prefix = || GetOptions::new().with_prefix();
    vec![
        ("prefix", "d/".into(), prefix()),
        ("prefix, keys only", "d/".into(), prefix().with_keys_only()),
        (
            "prefix, count only",
            "d/".into(),
            prefix().with_count_only(),
        ),
        ("prefix, limit 7", "d/".into(), prefix().with_limit(7)),
        (
            "prefix, by value, limit 6",
            "d/".into(),
            prefix()
                .with_sort(SortTarget::Value, SortOrder::Ascend)
                .with_limit(6),
        ),
        (
            "prefix, keys only, by value",
            "d/".into(),
            prefix()
                .with_keys_only()
                .with_sort(SortTarget::Value, SortOrder::Descend),
        ),
        (
            "prefix, keys only, limit 5",
            "d/".into(),
            prefix().with_keys_only().with_limit(5),
        ),
        (
            "keys only, newest first, limit 4",
            "d/".into(),
            prefix()
                .with_keys_only()
                .with_sort(SortTarget::Mod, SortOrder::Descend)
                .with_limit(4),
        ),
        (
            "range, keys only, created after revision 50",
            key(10),
            GetOptions::new()
                .with_range(key(30))
                .with_keys_only()
                .with_min_create_revision(50),
        ),
        ("one key", key(7), GetOptions::new()),
        (
            "one key, keys only",
            key(8),
            GetOptions::new().with_keys_only(),
        ),
        ("a missing key", "zz".into(), GetOptions::new()),
        ("every key", "\0".into(), GetOptions::new().with_from_key()),
    ]
}

fn summary(r: &GetResponse) -> (Vec<common::Fields>, i64, bool) {
    (fields(r.kvs()), r.count(), r.more())
}

async fn write(mut c: Client, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for step in 0..OPS_PER_WRITER {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let k = key(rng.random_range(0..KEYS));
        let value = format!("{seed}/{step}");
        match rng.random_range(0..20) {
            0..=11 => {
                c.put(k, value, None).await.unwrap();
            }
            12..=13 => {
                // Expires within a second or two: its keys go away by revocation.
                let lease = c.lease_grant(1, None).await.unwrap().id();
                c.put(k, value, Some(PutOptions::new().with_lease(lease)))
                    .await
                    .unwrap();
            }
            14..=17 => {
                c.delete(k, None).await.unwrap();
            }
            _ => {
                let start = rng.random_range(0..KEYS - 3);
                c.delete(
                    key(start),
                    Some(DeleteOptions::new().with_range(key(start + 3))),
                )
                .await
                .unwrap();
            }
        }
    }
}

async fn compact(mut c: Client, stop: Arc<AtomicBool>) {
    let mut compacted = 0;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(150)).await;
        // Twenty revisions behind, and only forward (compacting again to the same revision is
        // refused, as by etcd): on a busy machine the writers may have moved less meanwhile.
        let target = common::current_revision(&mut c).await - 20;
        if target > compacted {
            c.compact(target, Some(CompactionOptions::new().with_physical()))
                .await
                .unwrap();
            compacted = target;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_of_the_current_revision_equal_reads_at_their_revision() {
    compare_reads(None, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_equal_with_most_values_evicted() {
    // Some ten of the forty keys' values ("s/step" and the per-value overhead).
    compare_reads(Some(256), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_at_past_revisions_from_memory_equal_the_reads_of_then() {
    compare_reads(None, 16_384).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_at_past_revisions_equal_with_most_old_values_dropped() {
    // The history's share of the budget holds two or three of the values its changes replaced:
    // the reads at past revisions take the others by primary key.
    compare_reads(Some(256), 16_384).await;
}

/// Compares as the module says; `history` is the changes the index can undo (0: none, so the
/// reads at past revisions are SQL's).
async fn compare_reads(read_cache_bytes: Option<usize>, history: usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |config| {
        if let Some(bytes) = read_cache_bytes {
            config.read_cache_bytes = bytes;
        }
        config.read_history_changes = Some(history);
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for seed in 0..WRITERS {
        writers.push(tokio::spawn(write(
            server.client().await,
            seed,
            stop.clone(),
        )));
    }
    let compactor = tokio::spawn(compact(server.client().await, stop.clone()));

    let mut c = server.client().await;
    let (mut compared, mut compacted) = (0, 0);
    while writers.iter().any(|w| !w.is_finished()) {
        for (what, k, options) in shapes() {
            let now = c.get(k.as_str(), Some(options.clone())).await.unwrap();
            let revision = now.header().expect("a header").revision();
            // The index moves past `revision`, so the read at it is SQL's, or the history's.
            c.put("bump", "", None).await.unwrap();
            let then = match c
                .get(k.as_str(), Some(options.with_revision(revision)))
                .await
            {
                Ok(then) => then,
                Err(e) => {
                    let status = status(e);
                    // Compacted past it meanwhile: nothing to compare.
                    assert_eq!(
                        status.code(),
                        Code::OutOfRange,
                        "{what} at {revision}: {status}"
                    );
                    compacted += 1;
                    continue;
                }
            };
            assert_eq!(
                summary(&now),
                summary(&then),
                "{what}: the current revision ({revision}) and a read at it differ"
            );
            compared += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    compactor.await.unwrap();
    assert!(
        compared > 10 * shapes().len(),
        "too few reads compared ({compared}; {compacted} compacted meanwhile)"
    );

    // Reads of the current revision come from memory (bar one whose missing value was
    // compacted away meanwhile), so the comparison was not SQL against SQL; with history, so
    // do the reads at past revisions (bar those that compaction overtook).
    let (memory, sql) = read_sources(&server).await;
    let share = if history == 0 { 0.9 } else { 1.8 };
    assert!(
        memory >= compared as f64 * share,
        "only {memory} reads came from memory of {compared} compared ({sql} from SQL)"
    );
    if history == 0 {
        assert!(
            sql >= compared as f64 * 0.9,
            "only {sql} reads at past revisions came from SQL of {compared}"
        );
    }
    server.stop().await;
}

/// Range reads answered so far from memory and from SQL, by the server's metrics. Each scrape
/// counts the keys with a read of its own (from memory), which it includes.
async fn read_sources(server: &TestServer) -> (f64, f64) {
    let text = common::metrics_text(server).await;
    let series = |source: &str| -> f64 {
        let prefix = format!("etcdsql_range_reads_total{{source=\"{source}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{prefix}in /metrics"))
    };
    (series("memory"), series("sql"))
}

/// The pages after a list's first are read at its revision: memory answers them while the
/// index has the history back to it, SQL once it has not; either way as etcd does, compaction
/// included.
#[tokio::test]
async fn reads_at_past_revisions_come_from_memory_within_the_history() {
    const HISTORY: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |config| {
        config.read_history_changes = Some(HISTORY);
    })
    .await;
    let mut c = server.client().await;
    for i in 0..10 {
        c.put(key(i), format!("v{i}"), None).await.unwrap();
    }
    let page = || GetOptions::new().with_prefix().with_limit(4);
    let first = c.get("d/", Some(page())).await.unwrap();
    let revision = first.header().expect("a header").revision();
    assert_eq!((first.count(), first.more()), (10, true));

    let (memory, sql) = read_sources(&server).await;
    let again = c
        .get("d/", Some(page().with_revision(revision)))
        .await
        .unwrap();
    assert_eq!(summary(&again), summary(&first));
    assert_eq!(again.header().expect("a header").revision(), revision);
    assert_eq!(read_sources(&server).await, (memory + 2.0, sql));

    // After a change, a delete and a creation the history puts them back, and the header
    // tells the current revision.
    c.put(key(0), "changed", None).await.unwrap();
    c.delete(key(1), None).await.unwrap();
    c.put(key(2) + "a", "new", None).await.unwrap();
    let later = c
        .get("d/", Some(page().with_revision(revision)))
        .await
        .unwrap();
    assert_eq!(summary(&later), summary(&first));
    assert_eq!(later.header().expect("a header").revision(), revision + 3);
    assert_eq!(read_sources(&server).await, (memory + 4.0, sql));

    // Once the index has forgotten the changes since, SQL answers the same.
    for i in 0..HISTORY {
        c.put(key(3), format!("again {i}"), None).await.unwrap();
    }
    let forgotten = c
        .get("d/", Some(page().with_revision(revision)))
        .await
        .unwrap();
    assert_eq!(summary(&forgotten), summary(&first));
    assert_eq!(read_sources(&server).await, (memory + 5.0, sql + 1.0));

    // At a recent revision, a compacted one and a future one: etcd's answers.
    let current = common::current_revision(&mut c).await;
    let now = c.get(key(0), None).await.unwrap();
    assert_eq!(now.kvs()[0].value(), b"changed");
    c.put(key(0), "after", None).await.unwrap();
    c.compact(current, None).await.unwrap();
    let (memory, sql) = read_sources(&server).await;
    let pinned = c
        .get(key(0), Some(GetOptions::new().with_revision(current)))
        .await
        .unwrap();
    assert_eq!(summary(&pinned), summary(&now));
    // The compaction forgot the changes up to its revision, not the one after it.
    assert_eq!(read_sources(&server).await, (memory + 2.0, sql));
    let compacted = status(
        c.get(key(0), Some(GetOptions::new().with_revision(revision)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (compacted.code(), compacted.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    let future = status(
        c.get(key(0), Some(GetOptions::new().with_revision(current + 9)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (future.code(), future.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    server.stop().await;
}

/// A process that starts takes its window of history from the log: a read at a revision from
/// before the restart comes from memory, as before it, with what each changed key was then
/// (version, lease, value) rebuilt from the rows that replaced it.
#[tokio::test]
async fn after_a_restart_reads_at_past_revisions_still_come_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..10 {
        c.put(key(i), format!("v{i}"), None).await.unwrap();
    }
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put(key(0), "leased", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    let compact = common::current_revision(&mut c).await;
    let all = || GetOptions::new().with_prefix();
    let first = c.get("d/", Some(all())).await.unwrap();
    let revision = first.header().expect("a header").revision();
    c.put(key(0), "changed", None).await.unwrap();
    c.delete(key(1), None).await.unwrap();
    c.put(key(2) + "a", "new", None).await.unwrap();
    c.put(key(3), "again", None).await.unwrap();
    c.compact(compact, None).await.unwrap();
    server.stop().await;

    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let (memory, sql) = read_sources(&server).await;
    let again = c
        .get("d/", Some(all().with_revision(revision)))
        .await
        .unwrap();
    assert_eq!(summary(&again), summary(&first));
    assert_eq!(read_sources(&server).await, (memory + 2.0, sql));
    let compacted = status(
        c.get("d/", Some(all().with_revision(compact - 1)))
            .await
            .unwrap_err(),
    );
    assert_eq!(compacted.code(), Code::OutOfRange);
    server.stop().await;
}
