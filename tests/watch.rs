//! The Watch stream protocol (SPEC.md §4) through the `etcd-client` crate, one rule per test.

mod common;

use std::time::Duration;

use common::TestServer;
use etcd_client::{
    Client, EventType, GetOptions, Txn, TxnOp, WatchFilterType, WatchOptions, WatchResponse,
    WatchStream,
};

const WAIT: Duration = Duration::from_secs(10);

async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a watch response in time")
        .expect("the stream is healthy")
        .expect("the stream is open")
}

/// (type, key, mod revision) of each event in a response.
fn events(r: &WatchResponse) -> Vec<(EventType, String, i64)> {
    r.events()
        .iter()
        .map(|e| {
            let kv = e.kv().unwrap();
            (
                e.event_type(),
                kv.key_str().unwrap().to_owned(),
                kv.mod_revision(),
            )
        })
        .collect()
}

/// Reads responses until `want` events have arrived; returns them with the responses.
async fn collect(stream: &mut WatchStream, want: usize) -> Vec<(EventType, String, i64)> {
    let mut out = Vec::new();
    while out.len() < want {
        let r = next(stream).await;
        assert!(!r.canceled(), "unexpected cancel: {r:?}");
        out.extend(events(&r));
    }
    out
}

async fn put(c: &mut Client, key: &str, value: &str) -> i64 {
    c.put(key, value, None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

#[tokio::test]
async fn created_comes_first_with_ids_from_zero() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    put(&mut c, "x", "1").await;
    let mut stream = c.watch("a", None).await.unwrap();
    let created = next(&mut stream).await;
    assert!(created.created() && !created.canceled());
    assert_eq!(created.watch_id(), 0);
    assert_eq!(created.header().unwrap().revision(), 2);
    stream.watch("b", None).await.unwrap();
    let second = next(&mut stream).await;
    assert!(second.created());
    assert_eq!(second.watch_id(), 1);

    put(&mut c, "b", "1").await;
    let event = next(&mut stream).await;
    assert_eq!(event.watch_id(), 1);
    assert_eq!(events(&event), vec![(EventType::Put, "b".into(), 3)]);
    server.stop().await;
}

#[tokio::test]
async fn events_carry_prev_kv_and_deletes_carry_their_revision() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let mut stream = c
        .watch("k", Some(WatchOptions::new().with_prefix().with_prev_key()))
        .await
        .unwrap();
    next(&mut stream).await;
    put(&mut c, "k1", "a").await; // 2
    put(&mut c, "k1", "b").await; // 3
    c.delete("k1", None).await.unwrap(); // 4

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let r = next(&mut stream).await;
        seen.extend(r.events().to_vec());
    }
    let create = &seen[0];
    assert_eq!(create.event_type(), EventType::Put);
    let kv = create.kv().unwrap();
    assert_eq!(
        (kv.create_revision(), kv.mod_revision(), kv.version()),
        (2, 2, 1)
    );
    assert!(
        create.prev_kv().is_none(),
        "a creation has no previous value"
    );

    let update = &seen[1];
    let prev = update.prev_kv().expect("updates carry prev_kv");
    assert_eq!(
        (prev.value(), prev.mod_revision(), prev.version()),
        (&b"a"[..], 2, 1)
    );

    let delete = &seen[2];
    assert_eq!(delete.event_type(), EventType::Delete);
    let kv = delete.kv().unwrap();
    assert_eq!(
        (kv.key(), kv.mod_revision(), kv.version()),
        (&b"k1"[..], 4, 0)
    );
    let prev = delete.prev_kv().expect("deletes carry prev_kv");
    assert_eq!(
        (prev.value(), prev.mod_revision(), prev.version()),
        (&b"b"[..], 3, 2)
    );
    server.stop().await;
}

#[tokio::test]
async fn replay_from_the_past_joins_live_delivery_without_gap_or_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..20 {
        put(&mut c, &format!("r/{i:02}"), "v").await; // revisions 2..=21
    }
    let mut stream = c
        .watch(
            "r/",
            Some(WatchOptions::new().with_prefix().with_start_revision(5)),
        )
        .await
        .unwrap();
    assert!(next(&mut stream).await.created());
    // Writes racing with the replay.
    let mut writer = c.clone();
    let writes = tokio::spawn(async move {
        for i in 20..60 {
            put(&mut writer, &format!("r/{i:02}"), "v").await;
        }
    });
    let got = collect(&mut stream, 57).await;
    writes.await.unwrap();
    let revisions: Vec<i64> = got.iter().map(|(_, _, r)| *r).collect();
    assert_eq!(revisions, (5..62).collect::<Vec<_>>());
    server.stop().await;
}

#[tokio::test]
async fn start_revision_zero_means_from_now_and_future_revisions_wait() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    put(&mut c, "n", "old").await; // 2
    let mut now = c.watch("n", None).await.unwrap();
    next(&mut now).await;
    let mut future = c
        .watch("n", Some(WatchOptions::new().with_start_revision(5)))
        .await
        .unwrap();
    next(&mut future).await;
    put(&mut c, "n", "3").await;
    put(&mut c, "n", "4").await;
    put(&mut c, "n", "5").await;
    let from_now = collect(&mut now, 3).await;
    assert_eq!(
        from_now.iter().map(|e| e.2).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    let from_future = collect(&mut future, 1).await;
    assert_eq!(from_future[0].2, 5);
    server.stop().await;
}

#[tokio::test]
async fn a_compacted_start_revision_is_cancelled_after_created() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..5 {
        put(&mut c, "c", &i.to_string()).await; // 2..=6
    }
    c.compact(4, None).await.unwrap();
    let mut stream = c
        .watch("c", Some(WatchOptions::new().with_start_revision(3)))
        .await
        .unwrap();
    let created = next(&mut stream).await;
    assert!(created.created() && !created.canceled());
    let cancel = next(&mut stream).await;
    assert!(cancel.canceled());
    assert_eq!(cancel.watch_id(), created.watch_id());
    assert_eq!(cancel.compact_revision(), 4);

    // At the compact revision itself, history is still there.
    let mut ok = c
        .watch("c", Some(WatchOptions::new().with_start_revision(4)))
        .await
        .unwrap();
    next(&mut ok).await;
    let got = collect(&mut ok, 3).await;
    assert_eq!(got.iter().map(|e| e.2).collect::<Vec<_>>(), vec![4, 5, 6]);
    server.stop().await;
}

/// (revision, prev_kv as (mod revision, value)) of each event of the next `n` events.
async fn prev_kvs(stream: &mut WatchStream, n: usize) -> Vec<(i64, Option<(i64, String)>)> {
    let mut out = Vec::new();
    while out.len() < n {
        for e in next(stream).await.events() {
            let prev = e
                .prev_kv()
                .map(|kv| (kv.mod_revision(), kv.value_str().unwrap().to_owned()));
            out.push((e.kv().unwrap().mod_revision(), prev));
        }
    }
    out
}

/// etcd reads an event's prev_kv at the revision before the event, and sends the event without
/// it when that read is compacted: an event at the compact revision has none, a later one has
/// it even if the previous version is older than the compact revision. kube-apiserver turns the
/// absence into the 410 of a watch resumed from a compacted revision (TestWatchFromZero). Both
/// hold after physical compaction too.
#[tokio::test]
async fn prev_kv_is_sent_only_where_the_revision_before_the_event_is_not_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..4 {
        put(&mut c, "p", &i.to_string()).await; // 2..=5
    }
    put(&mut c, "x", "x").await; // 6
    put(&mut c, "p", "4").await; // 7
    let physical = || Some(etcd_client::CompactionOptions::new().with_physical());
    c.compact(5, physical()).await.unwrap();
    let from = |rev| Some(WatchOptions::new().with_start_revision(rev).with_prev_key());

    let mut stream = c.watch("p", from(5)).await.unwrap();
    assert_eq!(
        prev_kvs(&mut stream, 2).await,
        vec![(5, None), (7, Some((5, "3".to_owned())))]
    );
    c.compact(6, physical()).await.unwrap();
    let mut stream = c.watch("p", from(6)).await.unwrap();
    assert_eq!(
        prev_kvs(&mut stream, 1).await,
        vec![(7, Some((5, "3".to_owned())))]
    );
    server.stop().await;
}

#[tokio::test]
async fn cancel_is_acknowledged_and_ends_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let mut stream = c.watch("x", None).await.unwrap();
    let id = next(&mut stream).await.watch_id();
    stream.watch("y", None).await.unwrap();
    next(&mut stream).await;
    stream.cancel(id).await.unwrap();
    let cancelled = next(&mut stream).await;
    assert!(cancelled.canceled());
    assert_eq!(cancelled.watch_id(), id);
    put(&mut c, "x", "1").await;
    put(&mut c, "y", "1").await;
    let after = next(&mut stream).await;
    assert_eq!(after.watch_id(), 1, "only the remaining watch sees events");
    assert_eq!(events(&after), vec![(EventType::Put, "y".into(), 3)]);
    server.stop().await;
}

#[tokio::test]
async fn noput_and_nodelete_filters() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let mut deletes = c
        .watch(
            "f",
            Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
        )
        .await
        .unwrap();
    next(&mut deletes).await;
    let mut puts = c
        .watch(
            "f",
            Some(WatchOptions::new().with_filters([WatchFilterType::NoDelete])),
        )
        .await
        .unwrap();
    next(&mut puts).await;
    put(&mut c, "f", "1").await; // 2
    c.delete("f", None).await.unwrap(); // 3
    put(&mut c, "f", "2").await; // 4
    assert_eq!(
        collect(&mut deletes, 1).await,
        vec![(EventType::Delete, "f".into(), 3)]
    );
    let got = collect(&mut puts, 2).await;
    assert_eq!(got.iter().map(|e| e.2).collect::<Vec<_>>(), vec![2, 4]);
    server.stop().await;
}

#[tokio::test]
async fn a_txn_revision_arrives_in_one_response() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let mut stream = c
        .watch("t/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    next(&mut stream).await;
    c.txn(Txn::new().and_then([
        TxnOp::put("t/b", "1", None),
        TxnOp::put("t/a", "1", None),
        TxnOp::put("t/c", "1", None),
    ]))
    .await
    .unwrap();
    let r = next(&mut stream).await;
    // One response, in the order the txn ran its ops.
    assert_eq!(
        events(&r),
        vec![
            (EventType::Put, "t/b".into(), 2),
            (EventType::Put, "t/a".into(), 2),
            (EventType::Put, "t/c".into(), 2),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn progress_request_reports_the_current_revision_after_all_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..300 {
        put(&mut c, &format!("p/{i}"), "v").await; // 2..=301
    }
    // A watcher that must replay 300 revisions, and a progress request right behind it.
    let mut stream = c
        .watch(
            "p/",
            Some(WatchOptions::new().with_prefix().with_start_revision(2)),
        )
        .await
        .unwrap();
    stream.request_progress().await.unwrap();
    let mut last_event = 0;
    let mut events_seen = 0;
    let progress = loop {
        let r = next(&mut stream).await;
        if r.watch_id() == -1 {
            break r.header().unwrap().revision();
        }
        for (_, _, rev) in events(&r) {
            assert!(rev > last_event);
            last_event = rev;
            events_seen += 1;
        }
    };
    assert_eq!(progress, 301, "progress reports the current revision");
    assert_eq!(events_seen, 300, "every event at or below it came first");

    // With no watcher at all, a progress request is still answered.
    let mut empty = c.watch("unused", None).await.unwrap();
    next(&mut empty).await;
    empty.cancel(0).await.unwrap();
    next(&mut empty).await;
    empty.request_progress().await.unwrap();
    let r = next(&mut empty).await;
    assert_eq!((r.watch_id(), r.header().unwrap().revision()), (-1, 301));
    assert!(r.events().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn idle_progress_notify_watchers_get_progress() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |c| {
        c.watch_progress_notify_interval = Duration::from_millis(200);
    })
    .await;
    let mut c = server.client().await;
    put(&mut c, "q", "1").await;
    let mut stream = c
        .watch("q", Some(WatchOptions::new().with_progress_notify()))
        .await
        .unwrap();
    let created = next(&mut stream).await;
    let notify = next(&mut stream).await;
    assert_eq!(notify.watch_id(), created.watch_id());
    assert!(notify.events().is_empty() && !notify.canceled());
    assert_eq!(notify.header().unwrap().revision(), 2);
    server.stop().await;
}

#[tokio::test]
async fn duplicate_ids_and_empty_ranges_are_refused_like_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let mut stream = c
        .watch("a", Some(WatchOptions::new().with_watch_id(7)))
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await.watch_id(), 7);
    stream
        .watch("b", Some(WatchOptions::new().with_watch_id(7)))
        .await
        .unwrap();
    let dup = next(&mut stream).await;
    assert!(dup.created() && dup.canceled());
    assert_eq!(
        dup.cancel_reason(),
        "mvcc: duplicate watch ID provided on the WatchStream"
    );
    stream
        .watch("z", Some(WatchOptions::new().with_range("a")))
        .await
        .unwrap();
    let empty = next(&mut stream).await;
    assert!(empty.created() && empty.canceled());
    assert_eq!(empty.cancel_reason(), "mvcc: watcher range is empty");
    server.stop().await;
}

/// A client that stops reading while thousands of revisions are written: the server neither
/// stalls the writers nor drops events; once the client reads again it gets every event in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_catches_up_without_losing_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let mut slow = c
        .watch(
            "s/",
            Some(WatchOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    next(&mut slow).await;
    let mut fast = c
        .watch("s/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    next(&mut fast).await;
    let total = 3000;
    let value = "x".repeat(512);
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let mut c = c.clone();
            let value = value.clone();
            tokio::spawn(async move {
                for i in 0..total / 4 {
                    c.put(format!("s/{w}/{i}"), value.as_str(), None)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    // The fast watcher keeps up meanwhile: a slow one does not hold others back.
    let fast_events = collect(&mut fast, total).await;
    for w in writers {
        w.await.unwrap();
    }
    let slow_events = collect(&mut slow, total).await;
    let revisions: Vec<i64> = slow_events.iter().map(|e| e.2).collect();
    assert_eq!(revisions, (2..2 + total as i64).collect::<Vec<_>>());
    assert_eq!(fast_events, slow_events);
    let current = c
        .get("s/", Some(GetOptions::new().with_count_only()))
        .await
        .unwrap();
    assert_eq!(current.header().unwrap().revision(), 1 + total as i64);
    server.stop().await;
}

/// The scale the hub is designed for: 10,000 watchers on 100 streams, each watching its own key
/// or a shared prefix. Every watcher gets exactly its events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_watchers_on_a_hundred_streams() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let streams = 100;
    let per_stream = 100;
    let mut handles = Vec::new();
    for s in 0..streams {
        let mut c = c.clone();
        handles.push(tokio::spawn(async move {
            // Watcher 0 of each stream watches the shared prefix; the others one key each.
            let mut stream = c
                .watch("w/", Some(WatchOptions::new().with_prefix()))
                .await
                .unwrap();
            for w in 1..per_stream {
                stream.watch(format!("w/{s}/{w}"), None).await.unwrap();
            }
            for _ in 0..per_stream {
                assert!(next(&mut stream).await.created());
            }
            stream
        }));
    }
    let mut watch_streams = Vec::new();
    for h in handles {
        watch_streams.push(h.await.unwrap());
    }
    // Ten keys of stream 7 and one key in every stream: 109 revisions.
    for w in 1..=10 {
        put(&mut c, &format!("w/7/{w}"), "v").await;
    }
    for s in 0..streams {
        put(&mut c, &format!("w/{s}/50"), "v").await;
    }
    for (s, mut stream) in watch_streams.into_iter().enumerate() {
        let own = if s == 7 { 11 } else { 1 };
        let prefix_events = 10 + streams;
        let mut by_watch: std::collections::BTreeMap<i64, usize> = Default::default();
        while by_watch.values().sum::<usize>() < prefix_events + own {
            let r = next(&mut stream).await;
            *by_watch.entry(r.watch_id()).or_default() += r.events().len();
        }
        assert_eq!(by_watch.get(&0), Some(&prefix_events), "stream {s}");
        assert_eq!(by_watch.get(&50), Some(&1), "stream {s}");
        assert_eq!(by_watch.len(), if s == 7 { 12 } else { 2 }, "stream {s}");
    }
    server.stop().await;
}

/// A revision larger than the request limit reaches a `fragment` watcher in several responses,
/// all but the last marked `fragment`, and a plain watcher in one.
#[tokio::test]
async fn large_revisions_are_fragmented_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |c| c.max_request_bytes = 4096).await;
    let mut c = server.client().await;
    for i in 0..6 {
        put(&mut c, &format!("big/{i}"), &"v".repeat(1500)).await;
    }
    // Both watchers start after the puts, so the only revision they see is the delete below.
    let mut fragmented = c
        .watch(
            "big/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_fragment(),
            ),
        )
        .await
        .unwrap();
    next(&mut fragmented).await;
    let mut whole = c
        .watch(
            "big/",
            Some(WatchOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    next(&mut whole).await;
    // One revision deleting all six keys: with prev_kv, about 9 KiB of events.
    c.delete(
        "big/",
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    let mut parts = Vec::new();
    loop {
        let r = next(&mut fragmented).await;
        parts.push((r.0.fragment, r.events().len()));
        if !r.0.fragment {
            break;
        }
    }
    assert!(parts.len() > 1, "the deletes came in fragments: {parts:?}");
    assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), 6);

    let all = next(&mut whole).await;
    assert_eq!((all.events().len(), all.0.fragment), (6, false));
    server.stop().await;
}
