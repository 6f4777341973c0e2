//! Prometheus metrics for `/metrics`: etcd's names wherever the meaning is the same, so etcd's
//! dashboards and alerts work unchanged, plus etcdsql's own (`etcdsql_*`) for what etcd does not
//! have — the SQL under the log.
//!
//! # What owns what
//! One [`Metrics`] per server (tests run several servers in one process, so nothing is global).
//! Values come from four places:
//! - **Scrape time**: revisions, database sizes, the number of keys and process figures are read
//!   when `/metrics` is requested ([`Metrics::refresh`]), so they are exact and cost nothing
//!   between scrapes. Counting keys reads the whole key index; that is one query per scrape.
//! - **The gRPC layer** ([`GrpcMetricsLayer`]): go-grpc-prometheus's `grpc_server_*` series
//!   with etcd's labels, for every known etcd method (unknown paths are not counted, so a client
//!   cannot create series at will). A call is *handled* when its response ends: its trailers'
//!   `grpc-status`, or `Canceled` if the client went away first.
//! - **The backend decorator** ([`instrument`]): every call into the database is timed by
//!   operation (`etcdsql_sql_duration_seconds{query=…}`); commits also feed etcd's
//!   `etcd_disk_backend_commit_duration_seconds`; physical compaction counts its runs and rows.
//! - **Hooks** in the API services, the store's writer (batch sizes, commit times) and the
//!   lessor (expiries).
//!
//! # Invariants
//! - Counters only grow; gauges that track live objects (watchers, watch streams) are adjusted by
//!   the difference a stream reports and given back when the stream ends ([`WatchGauges`]), so
//!   they return to zero when every stream has closed.
//! - The output is OpenMetrics text ([`CONTENT_TYPE`]); a counter registered as `x` is exposed
//!   as `x_total`, exactly etcd's sample names.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::backend::RangeEnd;
use crate::lease::ExpiryObserver;
use crate::mvcc::types::{KeyRange, OpResponse, RangeRequest, TxnResponse};
use crate::mvcc::{CommitObserver, ReadStats, Store, WriteStats};

mod grpc;
mod sql;

pub use grpc::GrpcMetricsLayer;
pub use sql::instrument;

/// The media type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Commit times kept for the watch delivery lag: enough for every revision a watcher can still
/// be behind on at any sane write rate before it counts as lagging anyway.
const COMMIT_TIMES: usize = 4096;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    query: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByLabels {
    by: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    server_version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterVersionLabels {
    cluster_version: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The server's metrics; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    /// Fixed once built: every metric is registered in [`Metrics::new`].
    registry: Registry,

    db_total_size: Gauge,
    db_in_use_size: Gauge,
    keys_total: Gauge,
    current_revision: Gauge,
    compact_revision: Gauge,
    range_total: Counter,
    put_total: Counter,
    delete_total: Counter,
    txn_total: Counter,
    range_reads: Family<SourceLabels, Counter>,
    wal_writes: Family<ByLabels, Counter>,
    /// The store's read counts at the last scrape, which `range_reads` has counted.
    reads_seen: Mutex<ReadStats>,
    lost_revisions: Counter,
    /// The store's lost revisions at the last scrape, which `lost_revisions` has counted.
    lost_seen: AtomicU64,
    presumed_batches: Family<OutcomeLabels, Counter>,
    /// The store's write counts at the last scrape, which `presumed_batches` has counted.
    writes_seen: Mutex<WriteStats>,

    watch_streams: Gauge,
    watchers: Gauge,
    slow_watchers: Gauge,
    watch_events: Counter,
    watch_lag: Histogram,
    watch_behind: Gauge<f64, AtomicU64>,
    hub_lag: Gauge,
    /// Since when each watch stream that is behind has been so, by stream; read at scrape time.
    behind_since: Mutex<HashMap<u64, Instant>>,
    next_stream: AtomicU64,
    /// The watch hub's delivered revision, once the hub has started.
    hub_delivered: OnceLock<tokio::sync::watch::Receiver<i64>>,

    lease_granted: Counter,
    lease_revoked: Counter,
    lease_renewed: Counter,
    lease_expired: Counter,

    /// Every gRPC method's series.
    grpc: grpc::Series,

    sql_seconds: HistogramFamily<QueryLabels>,
    sql_errors: Family<QueryLabels, Counter>,
    commit_seconds: Histogram,
    write_batch_size: Histogram,
    compaction_runs: Counter,
    compaction_rows: Counter,

    resident_memory: Gauge,
    open_fds: Gauge,

    /// (current revision after a commit, when it committed), oldest first. A std mutex: held
    /// for a push or a binary search, never across an `.await`.
    commits: Mutex<VecDeque<(i64, Instant)>>,
}

impl Metrics {
    /// Registers every metric; `version` is the emulated etcd version.
    pub fn new(version: &str) -> Self {
        let mut r = Registry::default();

        // Constant: with no election, this member is always the leader.
        let has_leader: Gauge = Gauge::default();
        r.register(
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not (always 1: etcdsql is its own leader)",
            has_leader.clone(),
        );
        has_leader.set(1);
        let is_leader: Gauge = Gauge::default();
        r.register(
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise",
            is_leader.clone(),
        );
        is_leader.set(1);
        let leader_changes: Counter = Counter::default();
        r.register(
            "etcd_server_leader_changes_seen",
            "The number of leader changes seen (always 0: there is no election)",
            leader_changes,
        );
        let server_version = Family::<VersionLabels, Gauge>::default();
        r.register(
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version",
            server_version.clone(),
        );
        server_version
            .get_or_create(&VersionLabels {
                server_version: version.to_owned(),
            })
            .set(1);
        let cluster_version = Family::<ClusterVersionLabels, Gauge>::default();
        r.register(
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            cluster_version.clone(),
        );
        let major_minor: Vec<&str> = version.split('.').take(2).collect();
        cluster_version
            .get_or_create(&ClusterVersionLabels {
                cluster_version: major_minor.join("."),
            })
            .set(1);

        let gauge = |r: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            r.register(name, help, g.clone());
            g
        };
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c: Counter = Counter::default();
            r.register(name, help, c.clone());
            c
        };

        let db_total_size = gauge(
            &mut r,
            "etcd_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes",
        );
        let db_in_use_size = gauge(
            &mut r,
            "etcd_mvcc_db_total_size_in_use_in_bytes",
            "Total size of the underlying database logically in use in bytes",
        );
        let keys_total = gauge(
            &mut r,
            "etcd_debugging_mvcc_keys_total",
            "Total number of keys",
        );
        let current_revision = gauge(
            &mut r,
            "etcd_debugging_mvcc_current_revision",
            "The current revision of store",
        );
        let compact_revision = gauge(
            &mut r,
            "etcd_debugging_mvcc_compact_revision",
            "The revision of the last compaction in store",
        );
        let range_total = counter(&mut r, "etcd_mvcc_range", "Total number of ranges seen.");
        let put_total = counter(&mut r, "etcd_mvcc_put", "Total number of puts seen.");
        let delete_total = counter(
            &mut r,
            "etcd_mvcc_delete",
            "Total number of deletes seen (delete-range operations)",
        );
        let txn_total = counter(
            &mut r,
            "etcd_mvcc_txn",
            "Total number of txns seen (with more than one operation)",
        );

        let watch_streams = gauge(
            &mut r,
            "etcd_debugging_mvcc_watch_stream_total",
            "Total number of watch streams",
        );
        let watchers = gauge(
            &mut r,
            "etcd_debugging_mvcc_watcher_total",
            "Total number of watchers",
        );
        let slow_watchers = gauge(
            &mut r,
            "etcd_debugging_mvcc_slow_watcher_total",
            "Total number of unsynced slow watchers (replaying the log or catching up after a full queue)",
        );
        let watch_events = counter(
            &mut r,
            "etcd_debugging_mvcc_events",
            "Total number of events sent by this member",
        );
        let watch_behind = Gauge::<f64, AtomicU64>::default();
        r.register(
            "etcdsql_watch_stream_behind_seconds",
            "How long the watch stream that has been behind longest has been so: with a watcher replaying the log, or a progress request waiting for the hub (0 when none is)",
            watch_behind.clone(),
        );
        let hub_lag = gauge(
            &mut r,
            "etcdsql_watch_hub_lag_revisions",
            "Committed revisions the watch hub has not yet handed to the watch streams",
        );
        let watch_lag = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        r.register(
            "etcdsql_watch_delivery_lag_seconds",
            "Time from the commit of a revision to its events being handed to a watch stream (revisions committed by this process)",
            watch_lag.clone(),
        );

        let lease_granted = counter(
            &mut r,
            "etcd_debugging_lease_granted",
            "The total number of granted leases",
        );
        let lease_revoked = counter(
            &mut r,
            "etcd_debugging_lease_revoked",
            "The total number of revoked leases (by request or expiry)",
        );
        let lease_renewed = counter(
            &mut r,
            "etcd_debugging_lease_renewed",
            "The number of renewed leases seen by the leader",
        );
        let lease_expired = counter(
            &mut r,
            "etcdsql_lease_expired",
            "Leases revoked because their TTL ran out",
        );

        let grpc = grpc::Series::register(&mut r);

        let sql_seconds: HistogramFamily<QueryLabels> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 16)));
        r.register(
            "etcdsql_sql_duration_seconds",
            "Time spent in each backend database operation, by operation",
            sql_seconds.clone(),
        );
        let range_reads = Family::<SourceLabels, Counter>::default();
        r.register(
            "etcdsql_range_reads",
            "Range reads by where they were answered: from memory alone (source=memory), or with SQL statements (source=sql)",
            range_reads.clone(),
        );
        let wal_writes = Family::<ByLabels, Counter>::default();
        r.register(
            "etcdsql_sqlite_wal_writes",
            "Writes to the SQLite write-ahead log: as SQLite asked for them (by=sqlite, two per page), and as the writer sent them to the file, each commit's pages together (by=file)",
            wal_writes.clone(),
        );
        let presumed_batches = Family::<OutcomeLabels, Counter>::default();
        r.register(
            "etcdsql_write_presumed_batches",
            "Write batches that presumed no other instance had committed since this one's last batch, and wrote in one statement: rightly (outcome=held), or wrongly, and ran again (outcome=rerun)",
            presumed_batches.clone(),
        );
        let lost_revisions = Counter::default();
        r.register(
            "etcdsql_failover_lost_revisions",
            "Revisions this server had served that the database no longer held after a failover (counted by the server that fenced the store past them)",
            lost_revisions.clone(),
        );
        let sql_errors = Family::<QueryLabels, Counter>::default();
        r.register(
            "etcdsql_sql_errors",
            "Backend database operations that failed, by operation",
            sql_errors.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        r.register(
            "etcd_disk_backend_commit_duration_seconds",
            "The latency distributions of commit called by backend",
            commit_seconds.clone(),
        );
        let write_batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        r.register(
            "etcdsql_write_batch_size",
            "Write requests committed together in one database transaction (group commit)",
            write_batch_size.clone(),
        );
        let compaction_runs = counter(
            &mut r,
            "etcdsql_compaction_runs",
            "Physical compaction transactions run (each removes the rows of a window of revisions)",
        );
        let compaction_rows = counter(
            &mut r,
            "etcdsql_compaction_rows_removed",
            "Log rows removed by physical compaction",
        );

        let resident_memory = gauge(
            &mut r,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
        );
        let open_fds = gauge(
            &mut r,
            "process_open_fds",
            "Number of open file descriptors",
        );
        let start_time = gauge(
            &mut r,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
        );
        start_time.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
        );

        Self {
            inner: Arc::new(Inner {
                registry: r,
                db_total_size,
                db_in_use_size,
                keys_total,
                current_revision,
                compact_revision,
                range_total,
                put_total,
                delete_total,
                txn_total,
                range_reads,
                wal_writes,
                reads_seen: Mutex::new(ReadStats::default()),
                lost_revisions,
                lost_seen: AtomicU64::new(0),
                presumed_batches,
                writes_seen: Mutex::new(WriteStats::default()),
                watch_streams,
                watchers,
                slow_watchers,
                watch_events,
                watch_lag,
                watch_behind,
                hub_lag,
                behind_since: Mutex::new(HashMap::new()),
                next_stream: AtomicU64::new(0),
                hub_delivered: OnceLock::new(),
                lease_granted,
                lease_revoked,
                lease_renewed,
                lease_expired,
                grpc,
                sql_seconds,
                sql_errors,
                commit_seconds,
                write_batch_size,
                compaction_runs,
                compaction_rows,
                resident_memory,
                open_fds,
                commits: Mutex::new(VecDeque::with_capacity(COMMIT_TIMES)),
            }),
        }
    }

    /// Reads the values that are cheaper to look up than to track: revisions, sizes, key count,
    /// process figures. A failing database leaves the previous values (and is logged), so the
    /// rest of the scrape still works.
    pub async fn refresh(&self, store: &Store) {
        let m = &self.inner;
        let all_keys = RangeRequest {
            count_only: true,
            ..RangeRequest::of(KeyRange {
                key: vec![0],
                end: RangeEnd::Unbounded,
            })
        };
        let read = async {
            let revisions = store.revisions().await?;
            let size = store.size().await?;
            let keys = store.range(&all_keys).await?;
            Ok::<_, crate::mvcc::Error>((revisions, size, keys))
        };
        match read.await {
            Ok((revisions, size, keys)) => {
                // H is read after the revisions, so the lag is never overstated.
                if let Some(delivered) = m.hub_delivered.get() {
                    let delivered = *delivered.borrow();
                    m.hub_lag.set((revisions.current - delivered).max(0));
                }
                // The revision the key count was taken at.
                m.current_revision.set(keys.revision.max(revisions.current));
                m.compact_revision.set(revisions.compact);
                m.db_total_size.set(size.total);
                m.db_in_use_size.set(size.in_use);
                m.keys_total.set(keys.value.count);
            }
            Err(e) => tracing::warn!(error = %e, "metrics: cannot read the store"),
        }
        let lost = store.lost_revisions();
        let lost_before = m.lost_seen.swap(lost, Ordering::Relaxed);
        m.lost_revisions.inc_by(lost.saturating_sub(lost_before));
        let reads = store.read_stats();
        let seen = std::mem::replace(&mut *lock(&m.reads_seen), reads);
        for (source, now, before) in [
            ("memory", reads.memory, seen.memory),
            ("sql", reads.sql, seen.sql),
        ] {
            m.range_reads
                .get_or_create(&SourceLabels { source })
                .inc_by(now.saturating_sub(before));
        }
        let writes = store.write_stats();
        let seen = std::mem::replace(&mut *lock(&m.writes_seen), writes);
        for (outcome, now, before) in [
            ("held", writes.presumed, seen.presumed),
            ("rerun", writes.reruns, seen.reruns),
        ] {
            m.presumed_batches
                .get_or_create(&OutcomeLabels { outcome })
                .inc_by(now.saturating_sub(before));
        }
        let (asked, sent) = crate::backend::sqlite::wal_writes();
        for (by, now) in [("sqlite", asked), ("file", sent)] {
            let counter = m.wal_writes.get_or_create(&ByLabels { by });
            counter.inc_by(now.saturating_sub(counter.get()));
        }
        let oldest = lock(&m.behind_since).values().min().copied();
        m.watch_behind
            .set(oldest.map_or(0.0, |since| since.elapsed().as_secs_f64()));
        if let Some(rss) = resident_memory_bytes() {
            m.resident_memory.set(rss);
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            m.open_fds
                .set(i64::try_from(fds.count()).unwrap_or(i64::MAX));
        }
    }

    /// Every metric in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }

    /// Counts the operations of a KV request that succeeded, as etcd's mvcc layer does: each
    /// range, put and delete-range, and one txn when a request ran more than one operation.
    pub fn record_ops(&self, ops: OpCounts) {
        let m = &self.inner;
        m.range_total.inc_by(ops.ranges);
        m.put_total.inc_by(ops.puts);
        m.delete_total.inc_by(ops.deletes);
        if ops.ranges + ops.puts + ops.deletes > 1 {
            m.txn_total.inc();
        }
    }

    pub fn lease_granted(&self) {
        self.inner.lease_granted.inc();
    }

    pub fn lease_revoked(&self) {
        self.inner.lease_revoked.inc();
    }

    pub fn lease_renewed(&self) {
        self.inner.lease_renewed.inc();
    }

    /// The lessor's hook: counts leases that ran out (they are revoked, too).
    pub fn expiry_observer(&self) -> ExpiryObserver {
        let metrics = self.clone();
        Arc::new(move |n| {
            let n = n as u64;
            metrics.inner.lease_expired.inc_by(n);
            metrics.inner.lease_revoked.inc_by(n);
        })
    }

    /// The store writer's hook: batch sizes, and when each revision committed (for the watch
    /// delivery lag).
    pub fn commit_observer(&self) -> CommitObserver {
        let metrics = self.clone();
        Box::new(move |requests, current| {
            metrics.inner.write_batch_size.observe(requests as f64);
            let mut commits = lock(&metrics.inner.commits);
            if commits.back().is_none_or(|(last, _)| *last < current) {
                if commits.len() == COMMIT_TIMES {
                    commits.pop_front();
                }
                commits.push_back((current, Instant::now()));
            }
        })
    }

    /// A new watch stream; the returned guard keeps its watcher counts in the gauges.
    pub fn watch_stream(&self) -> WatchGauges {
        self.inner.watch_streams.inc();
        WatchGauges {
            metrics: self.clone(),
            id: self.inner.next_stream.fetch_add(1, Ordering::Relaxed),
            watchers: 0,
            slow: 0,
        }
    }

    /// Where the watch hub's delivered revision is read, for its lag behind the store.
    pub fn watch_hub(&self, delivered: tokio::sync::watch::Receiver<i64>) {
        let _ = self.inner.hub_delivered.set(delivered);
    }

    /// Events handed to a watch stream, the oldest at `revision`.
    pub fn watch_delivered(&self, events: usize, revision: i64) {
        self.inner.watch_events.inc_by(events as u64);
        if let Some(committed) = self.commit_time(revision) {
            let lag = Instant::now().saturating_duration_since(committed);
            self.inner.watch_lag.observe(lag.as_secs_f64());
        }
    }

    /// When `revision` was committed by this process, if it still remembers: the commit whose
    /// range of revisions `(previous, current]` holds it.
    fn commit_time(&self, revision: i64) -> Option<Instant> {
        let commits = lock(&self.inner.commits);
        let at = commits.partition_point(|(current, _)| *current < revision);
        // At 0 the commit that produced `revision` could be older than the oldest remembered.
        if at == 0 {
            return None;
        }
        commits.get(at).map(|(_, when)| *when)
    }

    /// The tower layer that counts gRPC calls.
    pub fn grpc_layer(&self) -> GrpcMetricsLayer {
        GrpcMetricsLayer::new(self.clone())
    }

    fn observe_sql(&self, query: &'static str, elapsed: Duration, failed: bool) {
        let labels = QueryLabels { query };
        self.inner
            .sql_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if failed {
            self.inner.sql_errors.get_or_create(&labels).inc();
        }
    }
}

/// Poisoning only means a panic elsewhere mid-push; the deque is still a valid deque.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `VmRSS` from `/proc/self/status` (Linux), in bytes.
fn resident_memory_bytes() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Operations one KV request ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub ranges: u64,
    pub puts: u64,
    pub deletes: u64,
}

impl OpCounts {
    /// The operations a txn ran: its taken branch, nested txns included.
    pub fn of_txn(txn: &TxnResponse) -> Self {
        let mut counts = Self::default();
        counts.add_txn(txn);
        counts
    }

    fn add_txn(&mut self, txn: &TxnResponse) {
        for response in &txn.responses {
            match response {
                OpResponse::Range(_) => self.ranges += 1,
                OpResponse::Put(_) => self.puts += 1,
                OpResponse::Delete(_) => self.deletes += 1,
                OpResponse::Txn(nested) => self.add_txn(nested),
            }
        }
    }
}

/// A watch stream's share of the watcher gauges; gives it back when dropped.
pub struct WatchGauges {
    metrics: Metrics,
    id: u64,
    watchers: i64,
    slow: i64,
}

impl WatchGauges {
    /// The stream now has `watchers` watchers, `slow` of them not synced.
    pub fn set(&mut self, watchers: usize, slow: usize) {
        let watchers = i64::try_from(watchers).unwrap_or(i64::MAX);
        let slow = i64::try_from(slow).unwrap_or(i64::MAX);
        let m = &self.metrics.inner;
        if watchers != self.watchers {
            m.watchers.inc_by(watchers - self.watchers);
            self.watchers = watchers;
        }
        if slow != self.slow {
            m.slow_watchers.inc_by(slow - self.slow);
            self.slow = slow;
        }
    }

    /// The stream has been behind since `since`, or is not behind (`None`). Called when that
    /// changes, not on every turn of the stream's loop.
    pub fn behind(&mut self, since: Option<Instant>) {
        let mut streams = lock(&self.metrics.inner.behind_since);
        match since {
            Some(since) => streams.insert(self.id, since),
            None => streams.remove(&self.id),
        };
    }
}

impl Drop for WatchGauges {
    fn drop(&mut self) {
        self.set(0, 0);
        self.behind(None);
        self.metrics.inner.watch_streams.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_counted_like_etcd() {
        let metrics = Metrics::new("3.6.16");
        metrics.record_ops(OpCounts {
            puts: 1,
            ..OpCounts::default()
        });
        let nested = TxnResponse {
            succeeded: true,
            responses: vec![OpResponse::Delete(Default::default())],
        };
        let txn = TxnResponse {
            succeeded: true,
            responses: vec![
                OpResponse::Put(Default::default()),
                OpResponse::Range(Default::default()),
                OpResponse::Txn(nested),
            ],
        };
        let counts = OpCounts::of_txn(&txn);
        assert_eq!(
            counts,
            OpCounts {
                ranges: 1,
                puts: 1,
                deletes: 1
            }
        );
        metrics.record_ops(counts);
        let text = metrics.encode();
        assert!(text.contains("etcd_mvcc_put_total 2\n"), "{text}");
        assert!(text.contains("etcd_mvcc_delete_total 1\n"), "{text}");
        assert!(text.contains("etcd_mvcc_txn_total 1\n"), "{text}");
        assert!(
            text.contains("etcd_server_version{server_version=\"3.6.16\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("etcd_cluster_version{cluster_version=\"3.6\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn watcher_gauges_return_to_zero() {
        let metrics = Metrics::new("3.6.16");
        let mut a = metrics.watch_stream();
        let mut b = metrics.watch_stream();
        a.set(3, 1);
        b.set(2, 2);
        a.set(4, 0);
        assert_eq!(metrics.inner.watchers.get(), 6);
        assert_eq!(metrics.inner.slow_watchers.get(), 2);
        assert_eq!(metrics.inner.watch_streams.get(), 2);
        drop(a);
        drop(b);
        assert_eq!(metrics.inner.watchers.get(), 0);
        assert_eq!(metrics.inner.slow_watchers.get(), 0);
        assert_eq!(metrics.inner.watch_streams.get(), 0);
    }

    #[test]
    fn commit_times_are_found_by_revision() {
        let metrics = Metrics::new("3.6.16");
        let observe = metrics.commit_observer();
        observe(1, 5);
        observe(3, 9);
        // Revisions up to 5 may predate what is remembered; 6..=9 came with the second commit.
        assert!(metrics.commit_time(5).is_none());
        assert!(metrics.commit_time(6).is_some());
        assert!(metrics.commit_time(9).is_some());
        assert!(metrics.commit_time(10).is_none());
        let text = metrics.encode();
        assert!(
            text.contains("etcdsql_write_batch_size_count 2\n"),
            "{text}"
        );
        assert!(
            text.contains("etcdsql_write_batch_size_sum 4.0\n"),
            "{text}"
        );
    }
}
