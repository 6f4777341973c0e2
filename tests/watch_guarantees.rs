//! The watch guarantee checker (SPEC.md §4.10): concurrent writers (puts, deletes, multi-key
//! txns, range deletes) and a compaction, against many watchers on overlapping ranges that start
//! at random past (or future) revisions — some slow, some cancelled and resumed from their last
//! revision + 1, with progress requests sprinkled in. Afterwards every watcher's stream must equal
//! the log's events in its range from its start revision: ordered, unique, none missing, a
//! revision never split across responses, and no event at or below a revision already reported
//! by a progress response on its stream.
//!
//! The run is bounded: a fixed number of operations and a deadline on every wait.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use common::{TestServer, current_revision, shared_database};
use etcd_client::{Client, EventType, Txn, TxnOp, WatchOptions, WatchResponse, WatchStream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: usize = 40;
const WRITERS: usize = 3;
const OPS_PER_WRITER: usize = 250;
const STREAMS: usize = 6;
const WATCHERS_PER_STREAM: usize = 5;
const DEADLINE: Duration = Duration::from_secs(60);

fn key(i: usize) -> String {
    format!("g/{i:02}")
}

/// One event as compared: revision, key, type, value, previous value.
type Seen = (i64, String, bool, Vec<u8>, Option<Vec<u8>>);

#[derive(Clone, Debug)]
struct Range {
    key: String,
    end: Option<String>, // None = single key; Some("\0") = from key on
}

impl Range {
    fn contains(&self, k: &str) -> bool {
        match self.end.as_deref() {
            None => k == self.key,
            Some("\0") => k >= self.key.as_str(),
            Some(end) => k >= self.key.as_str() && k < end,
        }
    }

    fn options(&self, start: i64) -> WatchOptions {
        let options = WatchOptions::new()
            .with_start_revision(start)
            .with_prev_key();
        match self.end.as_deref() {
            None => options,
            Some("\0") => options.with_from_key(),
            Some(end) => options.with_range(end),
        }
    }
}

fn random_range(rng: &mut StdRng) -> Range {
    match rng.random_range(0..5) {
        0 => Range {
            key: key(rng.random_range(0..KEYS)),
            end: None,
        },
        1 => Range {
            key: "g/1".into(),
            end: Some("g/2".into()),
        },
        2 => Range {
            key: key(5),
            end: Some(key(25)),
        },
        3 => Range {
            key: key(30),
            end: Some("\0".into()),
        },
        _ => Range {
            key: "g/".into(),
            end: Some("g0".into()),
        },
    }
}

fn seen(r: &WatchResponse) -> Vec<Seen> {
    r.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("events carry a kv");
            (
                kv.mod_revision(),
                kv.key_str().unwrap().to_owned(),
                e.event_type() == EventType::Delete,
                kv.value().to_vec(),
                e.prev_kv().map(|p| p.value().to_vec()),
            )
        })
        .collect()
}

/// A logical watcher: one or more physical watches (resumed after a cancel).
#[derive(Debug)]
struct Logical {
    range: Range,
    start: i64,
    /// Every response with events, in arrival order.
    responses: Vec<Vec<Seen>>,
    /// Cancel and resume after this many responses (0 = never).
    resume_after: usize,
    violations: Vec<String>,
}

impl Logical {
    fn next_start(&self) -> i64 {
        self.responses
            .iter()
            .flatten()
            .map(|e| e.0 + 1)
            .max()
            .unwrap_or(self.start)
    }
}

async fn message(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("watch response before the deadline")
        .expect("healthy stream")
        .expect("open stream")
}

/// Runs one watch stream until a progress response at or above `final_rev` arrives, where
/// `final_rev` is published once the writers are done.
async fn run_stream(
    mut client: Client,
    mut watchers: Vec<Logical>,
    slow: bool,
    seed: u64,
    final_rev: tokio::sync::watch::Receiver<i64>,
) -> Vec<Logical> {
    let mut rng = StdRng::seed_from_u64(seed);
    let first = &watchers[0];
    let mut stream = client
        .watch(
            first.range.key.clone(),
            Some(first.range.options(first.start)),
        )
        .await
        .unwrap();
    // Created responses come back in request order: map them to logical watchers.
    let mut pending: VecDeque<usize> = VecDeque::from([0]);
    for (i, w) in watchers.iter().enumerate().skip(1) {
        stream
            .watch(w.range.key.clone(), Some(w.range.options(w.start)))
            .await
            .unwrap();
        pending.push_back(i);
    }
    let mut ids: BTreeMap<i64, usize> = BTreeMap::new();
    // Watches we asked to cancel: their events may still arrive until the cancel response.
    let mut cancelling: BTreeMap<i64, usize> = BTreeMap::new();
    // Per watch id: the highest progress revision reported since it was created. A watch
    // created after a progress response may legitimately replay older revisions.
    let mut floors: BTreeMap<i64, i64> = BTreeMap::new();
    let mut responses = 0usize;
    let mut last_poke = tokio::time::Instant::now();
    let mut last_response = tokio::time::Instant::now();
    let mut last_progress = 0;
    loop {
        let target = *final_rev.borrow();
        if target > 0 && last_poke.elapsed() > Duration::from_millis(100) {
            stream.request_progress().await.unwrap();
            last_poke = tokio::time::Instant::now();
        }
        let r = match tokio::time::timeout(Duration::from_millis(200), message(&mut stream)).await {
            Ok(r) => r,
            Err(_) => {
                assert!(
                    last_response.elapsed() < DEADLINE,
                    "stream {seed}: no response for {} s while waiting for a progress response \
                     at or above {target} (0: the writers are not done); last progress \
                     {last_progress}, {} creates and {} cancels unanswered",
                    DEADLINE.as_secs(),
                    pending.len(),
                    cancelling.len()
                );
                continue;
            }
        };
        last_response = tokio::time::Instant::now();
        responses += 1;
        if slow {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1..6))).await;
        }
        if rng.random_range(0..40) == 0 {
            stream.request_progress().await.unwrap();
        }
        if r.watch_id() == -1 {
            let revision = r.header().unwrap().revision();
            last_progress = revision;
            for floor in floors.values_mut() {
                *floor = (*floor).max(revision);
            }
            if target > 0 && revision >= target && pending.is_empty() && cancelling.is_empty() {
                break;
            }
            continue;
        }
        if r.created() {
            assert!(!r.canceled(), "unexpected refusal {r:?}");
            let logical = pending
                .pop_front()
                .expect("a created response we asked for");
            ids.insert(r.watch_id(), logical);
            floors.insert(r.watch_id(), 0);
            continue;
        }
        if r.canceled() {
            assert_eq!(
                r.compact_revision(),
                0,
                "watchers start above the compaction"
            );
            let logical = cancelling
                .remove(&r.watch_id())
                .expect("only cancels we asked for");
            ids.remove(&r.watch_id());
            floors.remove(&r.watch_id());
            let w = &watchers[logical];
            stream
                .watch(w.range.key.clone(), Some(w.range.options(w.next_start())))
                .await
                .unwrap();
            pending.push_back(logical);
            continue;
        }
        // After its cancel response, a watch id gets nothing more.
        let Some(&logical) = ids.get(&r.watch_id()) else {
            panic!(
                "events for a cancelled or unknown watch id {}",
                r.watch_id()
            );
        };
        let events = seen(&r);
        let w = &mut watchers[logical];
        let progress_floor = floors.get(&r.watch_id()).copied().unwrap_or(0);
        for e in &events {
            if e.0 <= progress_floor {
                w.violations.push(format!(
                    "event at {} after progress reported {progress_floor}",
                    e.0
                ));
            }
        }
        w.responses.push(events);
        if w.resume_after > 0 && w.responses.len() == w.resume_after {
            stream.cancel(r.watch_id()).await.unwrap();
            cancelling.insert(r.watch_id(), logical);
        }
    }
    assert!(responses > 0);
    watchers
}

async fn writer(mut c: Client, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for n in 0..OPS_PER_WRITER {
        let value = format!("{seed}-{n}");
        match rng.random_range(0..20) {
            0..12 => {
                c.put(key(rng.random_range(0..KEYS)), value, None)
                    .await
                    .unwrap();
            }
            12..15 => {
                c.delete(key(rng.random_range(0..KEYS)), None)
                    .await
                    .unwrap();
            }
            15..18 => {
                let first = rng.random_range(0..KEYS - 3);
                c.txn(Txn::new().and_then([
                    TxnOp::put(key(first), value.clone(), None),
                    TxnOp::put(key(first + 2), value.clone(), None),
                    TxnOp::put(key(first + 3), value, None),
                ]))
                .await
                .unwrap();
            }
            _ => {
                c.delete(
                    "g/1",
                    Some(etcd_client::DeleteOptions::new().with_range("g/15")),
                )
                .await
                .unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watcher_sees_exactly_the_log() {
    let dir = tempfile::tempdir().unwrap();
    // On PostgreSQL and MySQL, three etcdsql processes share the database: writers and watch streams are
    // spread over all of them, and each watcher must still see exactly the one log.
    let instances = if shared_database() { 3 } else { 1 };
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..instances {
        let server = TestServer::start(dir.path()).await;
        clients.push(server.client().await);
        servers.push(server);
    }
    let mut c = clients[0].clone();
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for i in 0..100 {
        c.put(key(i % KEYS), format!("init-{i}"), None)
            .await
            .unwrap();
    }
    let floor = current_revision(&mut c).await;

    let (final_tx, final_rx) = tokio::sync::watch::channel(0);
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let watchers = (0..WATCHERS_PER_STREAM)
            .map(|_| Logical {
                range: random_range(&mut rng),
                // From the floor up to a little into the future.
                start: floor + rng.random_range(0..400),
                responses: Vec::new(),
                resume_after: if rng.random_bool(0.3) {
                    rng.random_range(1..10)
                } else {
                    0
                },
                violations: Vec::new(),
            })
            .collect();
        streams.push(tokio::spawn(run_stream(
            clients[s % instances].clone(),
            watchers,
            s % 2 == 0,
            s as u64,
            final_rx.clone(),
        )));
    }
    let compactor = {
        let mut c = c.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            c.compact(floor, None).await.unwrap();
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(clients[w % instances].clone(), 100 + w as u64)))
        .collect();
    for w in writers {
        tokio::time::timeout(DEADLINE, w)
            .await
            .expect("a writer finished its operations before the deadline")
            .unwrap();
    }
    tokio::time::timeout(DEADLINE, compactor)
        .await
        .expect("the compaction finished before the deadline")
        .unwrap();
    let last = current_revision(&mut c).await;
    final_tx.send(last).unwrap();

    // The log itself, as the reference: every event from the floor to the last revision.
    let mut reference: Vec<Seen> = Vec::new();
    let mut all = c
        .watch(
            "g/",
            Some(
                WatchOptions::new()
                    .with_range("g0")
                    .with_start_revision(floor)
                    .with_prev_key(),
            ),
        )
        .await
        .unwrap();
    while reference.last().map_or(0, |e| e.0) < last {
        let r = message(&mut all).await;
        reference.extend(seen(&r));
    }
    assert!(reference.len() > WRITERS * OPS_PER_WRITER / 2);

    let mut checked = 0;
    for stream in streams {
        for w in tokio::time::timeout(DEADLINE, stream)
            .await
            .expect("a watch stream reached the final revision before the deadline")
            .unwrap()
        {
            assert!(w.violations.is_empty(), "{:?}", w.violations);
            let expected: Vec<Seen> = reference
                .iter()
                .filter(|e| e.0 >= w.start && w.range.contains(&e.1))
                .cloned()
                .collect();
            let got: Vec<Seen> = w.responses.iter().flatten().cloned().collect();
            assert_eq!(
                got.len(),
                expected.len(),
                "watcher {:?} from {}: event count",
                w.range,
                w.start
            );
            assert_eq!(got, expected, "watcher {:?} from {}", w.range, w.start);
            // Atomic: a response holds every event of each revision it touches.
            for response in &w.responses {
                for revision in response.iter().map(|e| e.0) {
                    let here = response.iter().filter(|e| e.0 == revision).count();
                    let all = expected.iter().filter(|e| e.0 == revision).count();
                    assert_eq!(here, all, "revision {revision} split across responses");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, STREAMS * WATCHERS_PER_STREAM);
    for server in servers {
        server.stop().await;
    }
}
