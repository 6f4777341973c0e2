//! `/metrics`: etcd's metric names (so etcd dashboards and alerts work) and etcdsql's own, parsed
//! from a real scrape, with values that move when traffic happens.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{TestServer, current_revision};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};

/// Longest a test polls for a value that moves asynchronously (lease expiry, stream teardown).
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One scrape, parsed from the OpenMetrics / Prometheus text format.
#[derive(Debug)]
struct Scrape {
    samples: Vec<Sample>,
    /// Metric families announced by `# TYPE` lines, with their type.
    types: BTreeMap<String, String>,
}

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("series value");
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("value in {line:?}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("closing brace");
                    let labels = body
                        .split("\",")
                        .filter(|pair| !pair.is_empty())
                        .map(|pair| {
                            let (key, value) = pair.split_once("=\"").expect("label");
                            (key.to_owned(), value.trim_end_matches('"').to_owned())
                        })
                        .collect();
                    (name, labels)
                }
                None => (series, BTreeMap::new()),
            };
            samples.push(Sample {
                name: name.to_owned(),
                labels,
                value,
            });
        }
        Self { samples, types }
    }

    /// The sum of the samples named `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The one sample named `name` with `labels`; fails if there is none.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        assert!(!found.is_empty(), "no {name}{labels:?} in the scrape");
        found.iter().map(|s| s.value).sum()
    }

    fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

async fn scrape_url(url: &str) -> (String, Scrape) {
    let response = reqwest::get(format!("{url}/metrics")).await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.unwrap();
    (content_type, Scrape::parse(&text))
}

async fn scrape(server: &TestServer) -> Scrape {
    scrape_url(&server.url()).await.1
}

/// Scrapes until `done` holds, at most [`DEADLINE`].
async fn scrape_until(server: &TestServer, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let give_up = tokio::time::Instant::now() + DEADLINE;
    loop {
        let s = scrape(server).await;
        if done(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "metrics never reached the expected state: {:?}",
            s.samples
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads `n` events from a watch stream, each response within [`DEADLINE`].
async fn read_events(watch: &mut etcd_client::WatchStream, n: usize) {
    let mut seen = 0;
    while seen < n {
        let response = tokio::time::timeout(DEADLINE, watch.message())
            .await
            .expect("a watch response in time")
            .unwrap()
            .expect("the stream stays open");
        seen += response.events().len();
    }
    assert_eq!(seen, n, "exactly the events written");
}

const KV: (&str, &str) = ("grpc_service", "etcdserverpb.KV");
const UNARY: (&str, &str) = ("grpc_type", "unary");

#[tokio::test]
async fn etcd_names_are_exposed_and_move_with_traffic() {
    let dir = tempfile::tempdir().unwrap();
    // No history in memory: reads of older revisions go to SQL, whose timings are checked.
    let server =
        TestServer::start_with(dir.path(), |config| config.read_history_changes = Some(0)).await;
    let (content_type, before) = scrape_url(&server.url()).await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    // Present before any traffic.
    for name in [
        "etcd_server_has_leader",
        "etcd_mvcc_db_total_size_in_bytes",
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "etcd_debugging_mvcc_keys_total",
        "etcd_debugging_mvcc_current_revision",
        "etcd_debugging_mvcc_compact_revision",
        "etcd_mvcc_put_total",
        "etcd_mvcc_delete_total",
        "etcd_mvcc_range_total",
        "etcd_mvcc_txn_total",
        "etcd_debugging_mvcc_watcher_total",
        "etcd_debugging_mvcc_slow_watcher_total",
        "etcd_debugging_mvcc_watch_stream_total",
        "etcd_debugging_lease_granted_total",
        "etcdsql_lease_expired_total",
        "etcdsql_compaction_runs_total",
        "etcdsql_compaction_rows_removed_total",
        "etcdsql_write_batch_size_count",
        "etcdsql_watch_delivery_lag_seconds_count",
        "etcd_disk_backend_commit_duration_seconds_count",
        "process_resident_memory_bytes",
    ] {
        assert!(before.has(name), "{name} missing before traffic");
    }
    assert_eq!(before.get("etcd_server_has_leader", &[]), 1.0);
    assert_eq!(
        before.get("etcd_server_version", &[("server_version", "3.6.16")]),
        1.0
    );
    assert!(before.get("etcd_mvcc_db_total_size_in_bytes", &[]) > 0.0);
    assert_eq!(before.types["etcd_debugging_mvcc_keys_total"], "gauge");

    let mut c = server.client().await;
    // Four Put RPCs, a DeleteRange, and a Txn of two puts.
    for (key, value) in [("a", "1"), ("a", "2"), ("b", "1"), ("gone", "1")] {
        c.put(key, value, None).await.unwrap();
    }
    c.delete("gone", None).await.unwrap();
    let txn = Txn::new()
        .when([Compare::version("a", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("d", "1", None), TxnOp::put("e", "1", None)]);
    assert!(c.txn(txn).await.unwrap().succeeded());

    // A watch that receives one event.
    let mut watch = c
        .watch("w", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    // The watch starts "from now" only once created: write after that, not before.
    let created = tokio::time::timeout(DEADLINE, watch.message())
        .await
        .expect("the created response in time")
        .unwrap()
        .unwrap();
    assert!(created.created());
    c.put("w1", "x", None).await.unwrap();
    loop {
        let response = tokio::time::timeout(DEADLINE, watch.message())
            .await
            .expect("a watch response in time")
            .unwrap()
            .unwrap();
        if !response.events().is_empty() {
            break;
        }
    }
    // The delivery lag is measured for revisions this process committed, when the hub sees the
    // commit's time; a hub woken by another path (PostgreSQL's NOTIFY) can get there first, so
    // write until one delivery is measured (bounded).
    let mut extra = 0;
    while scrape(&server)
        .await
        .get("etcdsql_watch_delivery_lag_seconds_count", &[])
        < 1.0
    {
        extra += 1;
        assert!(extra <= 20, "no watch delivery lag was ever measured");
        c.put(format!("w{extra}x"), "x", None).await.unwrap();
        loop {
            let response = tokio::time::timeout(DEADLINE, watch.message())
                .await
                .expect("a watch response in time")
                .unwrap()
                .unwrap();
            if !response.events().is_empty() {
                break;
            }
        }
    }
    let watching = scrape(&server).await;
    assert_eq!(watching.get("etcd_debugging_mvcc_watcher_total", &[]), 1.0);
    assert_eq!(
        watching.get("etcd_debugging_mvcc_watch_stream_total", &[]),
        1.0
    );
    assert!(watching.get("etcd_debugging_mvcc_events_total", &[]) >= 1.0);
    assert!(watching.get("etcdsql_watch_delivery_lag_seconds_count", &[]) >= 1.0);
    assert_eq!(
        watching.get(
            "grpc_server_started_total",
            &[
                ("grpc_service", "etcdserverpb.Watch"),
                ("grpc_method", "Watch"),
                ("grpc_type", "bidi_stream"),
            ],
        ),
        1.0
    );

    // Compaction that removes the superseded version of `a`.
    let compact_at = current_revision(&mut c).await;
    c.compact(
        compact_at,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    // A read below the compact revision fails with OutOfRange.
    let compacted = c.get("a", Some(GetOptions::new().with_revision(1))).await;
    assert!(compacted.is_err());

    // A lease that runs out, taking its key with it.
    let lease = c.lease_grant(2, None).await.unwrap().id();
    c.put("leased", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    let expired = scrape_until(&server, |s| {
        s.get("etcdsql_lease_expired_total", &[]) >= 1.0
    })
    .await;
    assert!(expired.get("etcd_debugging_lease_revoked_total", &[]) >= 1.0);
    assert_eq!(expired.get("etcd_debugging_lease_granted_total", &[]), 1.0);

    let revision = current_revision(&mut c).await;
    let keys = c
        .get(
            "\0",
            Some(GetOptions::new().with_from_key().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    // The same count and keys at an older revision: these count and scan rows in SQL.
    let earlier = c
        .get(
            "\0",
            Some(
                GetOptions::new()
                    .with_from_key()
                    .with_count_only()
                    .with_revision(revision - 1),
            ),
        )
        .await
        .unwrap();
    assert!(earlier.count() >= 1);
    let earlier_keys = c
        .get(
            "\0",
            Some(
                GetOptions::new()
                    .with_from_key()
                    .with_revision(revision - 1),
            ),
        )
        .await
        .unwrap();
    assert_eq!(earlier_keys.count(), earlier.count());
    let after = scrape(&server).await;
    let moved = |name: &str| after.get(name, &[]) - before.get(name, &[]);

    // a, a, b, gone, w1, leased, and the extra watch writes.
    let put_rpcs = 6.0 + f64::from(extra);
    assert_eq!(moved("etcd_mvcc_put_total"), put_rpcs + 2.0);
    assert_eq!(moved("etcd_mvcc_delete_total"), 1.0);
    assert_eq!(moved("etcd_mvcc_txn_total"), 1.0);
    assert!(moved("etcd_mvcc_range_total") >= 2.0);
    assert_eq!(
        after.get("etcd_debugging_mvcc_keys_total", &[]),
        keys as f64
    );
    assert_eq!(
        after.get("etcd_debugging_mvcc_current_revision", &[]),
        revision as f64
    );
    assert_eq!(
        after.get("etcd_debugging_mvcc_compact_revision", &[]),
        compact_at as f64
    );
    assert!(after.get("etcd_mvcc_db_total_size_in_use_in_bytes", &[]) > 0.0);

    // gRPC counters, with etcd's labels.
    assert_eq!(after.types["grpc_server_handling_seconds"], "histogram");
    assert_eq!(after.types["grpc_server_handled"], "counter");
    let put = [KV, UNARY, ("grpc_method", "Put")];
    assert_eq!(after.get("grpc_server_started_total", &put), put_rpcs);
    assert_eq!(
        after.get(
            "grpc_server_handled_total",
            &[KV, UNARY, ("grpc_method", "Put"), ("grpc_code", "OK")]
        ),
        put_rpcs
    );
    assert_eq!(
        after.get("grpc_server_handling_seconds_count", &put),
        put_rpcs
    );
    assert_eq!(
        after.get(
            "grpc_server_handled_total",
            &[KV, ("grpc_method", "Range"), ("grpc_code", "OutOfRange")]
        ),
        1.0
    );
    assert_eq!(
        after.get(
            "grpc_server_handled_total",
            &[KV, ("grpc_method", "Txn"), ("grpc_code", "OK")]
        ),
        1.0
    );
    assert!(
        after.sum(
            "grpc_server_handling_seconds_bucket",
            &[KV, ("grpc_method", "Put"), ("le", "+Inf")]
        ) >= put_rpcs
    );

    // etcdsql's own.
    let memory_reads = after.get("etcdsql_range_reads_total", &[("source", "memory")]);
    let sql_reads = after.get("etcdsql_range_reads_total", &[("source", "sql")]);
    assert!(sql_reads >= 1.0, "no read went to SQL");
    // Count-only reads of the current revision come from memory.
    assert!(memory_reads >= 1.0, "no read came from memory");
    for query in [
        "scan",
        "count",
        "append",
        "commit",
        "begin_write",
        "compact_window",
    ] {
        assert!(
            after.get("etcdsql_sql_duration_seconds_count", &[("query", query)]) >= 1.0,
            "no {query} timings"
        );
    }
    assert!(moved("etcd_disk_backend_commit_duration_seconds_count") >= put_rpcs);
    let batches = moved("etcdsql_write_batch_size_count");
    assert!(batches >= 1.0);
    assert!(moved("etcdsql_write_batch_size_sum") >= batches);
    assert!(moved("etcdsql_compaction_runs_total") >= 1.0);
    assert!(moved("etcdsql_compaction_rows_removed_total") >= 1.0);

    // The Grafana dashboard only uses series that exist.
    for name in dashboard_metrics() {
        // Series that appear only once something failed.
        let on_failure_only = ["etcdsql_sql_errors_total"];
        assert!(
            after.has(&name) || on_failure_only.contains(&name.as_str()),
            "docs/grafana-dashboard.json uses {name}, which /metrics does not expose"
        );
    }

    // Closing the watch gives its watcher back, and the call is counted as handled.
    drop(watch);
    let closed = scrape_until(&server, |s| {
        s.get("etcd_debugging_mvcc_watcher_total", &[]) == 0.0
            && s.get("etcd_debugging_mvcc_watch_stream_total", &[]) == 0.0
            && s.sum("grpc_server_handled_total", &[("grpc_method", "Watch")]) >= 1.0
    })
    .await;
    assert_eq!(
        closed.get("etcd_debugging_mvcc_slow_watcher_total", &[]),
        0.0
    );
    server.stop().await;
}

#[tokio::test]
async fn a_watch_from_the_past_counts_as_slow_until_it_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..20 {
        c.put(format!("k{i}"), "v", None).await.unwrap();
    }
    let mut watch = c
        .watch(
            "k",
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await
        .unwrap();
    read_events(&mut watch, 20).await;
    // Replayed from the log, then joined the hub: one watcher, none slow.
    let s = scrape_until(&server, |s| {
        s.get("etcd_debugging_mvcc_slow_watcher_total", &[]) == 0.0
    })
    .await;
    assert_eq!(s.get("etcd_debugging_mvcc_watcher_total", &[]), 1.0);
    assert!(s.get("etcd_debugging_mvcc_events_total", &[]) >= 20.0);
    assert!(
        s.get(
            "etcdsql_sql_duration_seconds_count",
            &[("query", "changes")]
        ) >= 1.0,
        "the replay read the log"
    );
    drop(watch);
    server.stop().await;
}

/// A stream whose client stops reading while it replays the log stays behind, and the scrape
/// says for how long; once the client reads everything it is no longer behind. The hub itself
/// keeps up with the store throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stream_that_stays_behind_is_measured() {
    // More than the client's flow-control window (2 MiB) holds, at one event per response.
    const EVENTS: usize = 4000;
    let dir = tempfile::tempdir().unwrap();
    // Small requests, so that every event of the replay is a fragment of its own: far more
    // responses than the stream's queue and the connection's flow-control window hold.
    let server = TestServer::start_with(dir.path(), |c| c.max_request_bytes = 1024).await;
    let mut c = server.client().await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let mut c = c.clone();
            tokio::spawn(async move {
                for i in (w..EVENTS).step_by(8) {
                    c.put(format!("b/{i:05}"), "v".repeat(900), None)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let s = scrape(&server).await;
    assert_eq!(s.get("etcdsql_watch_stream_behind_seconds", &[]), 0.0);
    assert_eq!(s.get("etcdsql_watch_hub_lag_revisions", &[]), 0.0);

    let mut watch = c
        .watch(
            "b/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(1)
                    .with_fragment(),
            ),
        )
        .await
        .unwrap();
    // Not reading: the replay blocks once the queues are full, with the watcher unsynced.
    let first = scrape_until(&server, |s| {
        s.get("etcdsql_watch_stream_behind_seconds", &[]) > 0.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = scrape(&server).await;
    assert!(
        later.get("etcdsql_watch_stream_behind_seconds", &[])
            > first.get("etcdsql_watch_stream_behind_seconds", &[]),
        "the time behind grows while the stream stays behind"
    );
    assert_eq!(
        later.get("etcd_debugging_mvcc_slow_watcher_total", &[]),
        1.0
    );
    assert_eq!(later.get("etcdsql_watch_hub_lag_revisions", &[]), 0.0);

    read_events(&mut watch, EVENTS).await;
    scrape_until(&server, |s| {
        s.get("etcdsql_watch_stream_behind_seconds", &[]) == 0.0
            && s.get("etcd_debugging_mvcc_slow_watcher_total", &[]) == 0.0
    })
    .await;
    drop(watch);
    server.stop().await;
}

#[tokio::test]
async fn the_metrics_listener_serves_only_metrics_and_health() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = etcdsql::Config::defaults();
    config.listen_client_urls = vec!["http://127.0.0.1:0".into()];
    config.listen_metrics_urls = vec!["http://127.0.0.1:0".into()];
    config.endpoint = common::test_endpoint(dir.path());
    config.shutdown_grace_seconds = 2;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = etcdsql::start(config, shutdown.clone()).await.unwrap();
    let client_url = running.client_urls[0].clone();
    let metrics_url = running.metrics_urls[0].clone();
    assert!(
        metrics_url.starts_with("http://127.0.0.1:"),
        "{metrics_url}"
    );
    assert_ne!(metrics_url, client_url);

    let mut c = etcd_client::Client::connect([client_url], None)
        .await
        .unwrap();
    c.put("k", "v", None).await.unwrap();
    let (_, s) = scrape_url(&metrics_url).await;
    assert_eq!(
        s.get(
            "grpc_server_started_total",
            &[KV, UNARY, ("grpc_method", "Put")]
        ),
        1.0
    );
    let health = reqwest::get(format!("{metrics_url}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    let version = reqwest::get(format!("{metrics_url}/version"))
        .await
        .unwrap();
    assert_eq!(version.status(), 404);
    shutdown.cancel();
    running.wait().await;
}

/// Every metric name the Grafana dashboard's queries use.
fn dashboard_metrics() -> std::collections::BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() > 10, "the dashboard has queries");
    let mut names = std::collections::BTreeSet::new();
    for expr in exprs {
        for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if ["etcd_", "etcdsql_", "grpc_server_", "process_"]
                .iter()
                .any(|prefix| token.starts_with(prefix))
            {
                names.insert(token.to_owned());
            }
        }
    }
    names
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// On SQLite, a commit's WAL pages reach the file in one write: SQLite writes each page with
/// two calls (its frame header, then the page), and every commit here changes at least three
/// pages (the log, the key's head entry, the current revision). Other tests of this binary may
/// write at the same time; their commits are gathered the same way, so the ratio holds.
#[tokio::test]
async fn sqlite_wal_pages_reach_the_file_together() {
    if common::on_postgres() || common::on_mysql() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let before = scrape(&server).await;
    for i in 0..50 {
        c.put(format!("wal/{i}"), vec![b'v'; 3000], None)
            .await
            .unwrap();
    }
    let after = scrape(&server).await;
    let moved = |by| {
        after.get("etcdsql_sqlite_wal_writes_total", &[("by", by)])
            - before.get("etcdsql_sqlite_wal_writes_total", &[("by", by)])
    };
    let (asked, sent) = (moved("sqlite"), moved("file"));
    assert!(sent >= 1.0, "the commits reached the file: {sent} writes");
    assert!(
        asked >= 4.0 * sent,
        "SQLite's {asked} writes went out as {sent}, not one per commit"
    );
    // One commit far larger than one write to the file may be (SQLite's own layer takes less
    // than 128 KiB per call): about a thousand pages.
    let large: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    c.put("wal/large", large.clone(), None).await.unwrap();
    // What was written reads back, through the readers' own connections and after a restart.
    let got = c.get("wal/49", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), vec![b'v'; 3000].as_slice());
    server.stop().await;
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let all = c
        .get(
            "wal/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(all.count(), 51);
    let got = c.get("wal/large", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), large.as_slice());
    server.stop().await;
}
