//! The watch hub: fans each new revision out, in order, to the watch streams whose watchers
//! cover its keys. This process's writer hands it each committed batch's rows directly, before
//! the batch's replies go out, so a watcher usually hears of a change no later than its writer;
//! ahead of them, the other processes' commits the batch's transaction read as it began, where
//! the backend reads them then (PostgreSQL). Whatever part of a hand-over H has already passed
//! is dropped.
//! One tailer per process reads the revision log for everything else: other processes' commits
//! (woken by PostgreSQL's LISTEN/NOTIFY where the backend can push them, and every poll interval
//! regardless) and any batch the hub could not take directly because it was not yet caught up.
//!
//! # Invariants
//! - **Delivered revision.** `delivered` (H) only grows. Every change with a revision ≤ H has
//!   been offered to every stream that had a synced watcher covering its key when it was
//!   published; batches reach a stream's queue before H moves past them. Both publishers (the
//!   writer's hand-over and the tailer) publish `(after, through]` only if H is still `after`,
//!   checked under the registry lock, so revisions are published once each and in order.
//!   H is announced to waiting streams ([`Hub::delivered_changes`]) under that same lock, so
//!   what streams read through [`Hub::delivered`] is never behind what [`Subscription::join`]
//!   checks against once a publish has returned, and never moves backward.
//! - **Synced watchers.** A watcher is *synced* when it sits in the range index and so receives
//!   every later batch that concerns it. It may join only if it has already seen every change
//!   up to H (its `next_rev` ≤ H + 1); [`Subscription::join`] checks that under the registry
//!   lock, so nothing can be published between the check and the insertion. Joining with a
//!   `next_rev` *beyond* H + 1 is also fine (start "from now" or a future revision): the stream
//!   drops events below `next_rev`.
//! - **The seam.** A watcher that starts in the past (or fell behind) reads the log itself from
//!   its `next_rev` up to H, then tries to join; if H moved meanwhile it reads again. Since live
//!   events are filtered by `revision ≥ next_rev` and a batch is never split, the replay and the
//!   live stream meet with no gap and no duplicate.
//! - **Slow streams never block the tailer.** Each stream has a bounded queue
//!   ([`STREAM_QUEUE`] batches). If a queue is full, the hub removes all of that stream's
//!   watchers from the index and raises its lag signal instead of waiting; the stream finishes
//!   the batches it has, then catches up from the log and joins again. Memory per stream is
//!   therefore bounded by its queue (shared, reference-counted batches) plus one catch-up chunk.
//! - **One applied stream.** The store's applied index ([`mvcc::Applied`]) takes in each batch
//!   in the same publish, under the registry lock, after the H check: reads served from memory
//!   and watches see the same revisions in the same order, and the index is at H whenever the
//!   lock is free.
//! - **Fences.** When the log was fenced past H (a failover lost revisions this or another
//!   process served; [`mvcc`]'s fence), the tailer moves H forward to the database's current
//!   revision in one step under the registry lock, reloads the applied index there, and takes
//!   every watcher off the index as if its stream had fallen behind: each then catches up from
//!   the log, finds its next revision below the compact revision, and is cancelled. No event of
//!   the shorter history is ever delivered after one of the longer.
//! - **Routing.** Single-key watchers are found by hash lookup; range watchers through a
//!   B-tree ordered by range start, so an event is tested only against ranges that start at or
//!   before its key, never against every watcher.

mod follow;

pub use follow::RangeFollower;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::{Backend, CommitNotice, LogRow, RangeEnd, Revisions};
use crate::mvcc::types::{KeyRange, KeyValue};
use crate::mvcc::{self, KeyMeta, Store};

/// Batches a stream may have queued before it is switched to catch-up from the log.
pub const STREAM_QUEUE: usize = 256;
/// Most revisions the tailer, or a catching-up stream, reads in one query.
pub const READ_CHUNK: i64 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change as a watcher sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// For a delete: only the key and the deletion's revision, as etcd reports it.
    pub kv: KeyValue,
    /// The key before this change; `None` when the change created it.
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }

    pub fn from_row(row: LogRow) -> Self {
        // A change that replaced a version but has no old value could only come from a log
        // whose compaction removed that version (compaction keeps it for every change a watch
        // can replay): no prev_kv then, as etcd, rather than an empty one.
        let prev = KeyMeta::replaced_by(&row)
            .and_then(|meta| Some(meta.to_kv(&row.key, row.old_value.clone()?)));
        if row.deleted {
            Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: row.key,
                    mod_revision: row.revision,
                    ..KeyValue::default()
                },
                prev_kv: prev,
            }
        } else {
            Event {
                kind: EventKind::Put,
                kv: KeyValue::from_row(row),
                prev_kv: prev,
            }
        }
    }
}

/// The changes of consecutive revisions, in order; revisions are never split across batches.
#[derive(Debug)]
pub struct Batch {
    /// The last revision this batch covers (it may have had no change a stream cares about).
    pub through: i64,
    pub events: Vec<Event>,
}

#[derive(Clone)]
pub struct Hub {
    inner: Arc<HubInner>,
}

struct HubInner {
    /// Held only to update the index or hand batches to queues; nothing awaits under it.
    registry: Mutex<Registry>,
    /// H, for streams that wait for progress.
    delivered: watch::Sender<i64>,
    next_stream: AtomicU64,
    backend: Arc<dyn Backend>,
    /// The store's applied index, which takes in each batch as it is published, under the
    /// registry lock (so in the hub's order); `None` for a hub that does not feed it.
    applied: Option<mvcc::Applied>,
    /// Runs once at the end of the next publish, after the registry lock is released: lets a
    /// test stop one publisher there while another publishes.
    #[cfg(test)]
    pause_after_publish: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

struct Registry {
    delivered: i64,
    streams: HashMap<u64, StreamSlot>,
    index: RangeIndex,
}

struct StreamSlot {
    queue: mpsc::Sender<Arc<Batch>>,
    lag: Arc<LagSignal>,
    /// The stream's synced watchers, to take them out of the index.
    watchers: HashMap<i64, KeyRange>,
}

#[derive(Default)]
struct LagSignal {
    lagged: AtomicBool,
    notify: Notify,
}

/// A watcher in the index: (stream, watch id).
type Member = (u64, i64);

#[derive(Default)]
struct RangeIndex {
    keys: HashMap<Vec<u8>, Vec<Member>>,
    ranges: BTreeMap<Vec<u8>, Vec<(RangeEnd, Member)>>,
}

impl RangeIndex {
    fn insert(&mut self, range: &KeyRange, member: Member) {
        match &range.end {
            RangeEnd::Single => self.keys.entry(range.key.clone()).or_default().push(member),
            end => self
                .ranges
                .entry(range.key.clone())
                .or_default()
                .push((end.clone(), member)),
        }
    }

    fn remove(&mut self, range: &KeyRange, member: Member) {
        match &range.end {
            RangeEnd::Single => {
                if let Some(members) = self.keys.get_mut(&range.key) {
                    members.retain(|m| *m != member);
                    if members.is_empty() {
                        self.keys.remove(&range.key);
                    }
                }
            }
            _ => {
                if let Some(members) = self.ranges.get_mut(&range.key) {
                    members.retain(|(_, m)| *m != member);
                    if members.is_empty() {
                        self.ranges.remove(&range.key);
                    }
                }
            }
        }
    }

    /// Adds the streams with a watcher covering `key` to `out`.
    fn streams_for(&self, key: &[u8], out: &mut HashSet<u64>) {
        if let Some(members) = self.keys.get(key) {
            out.extend(members.iter().map(|(stream, _)| *stream));
        }
        let starting_before = self
            .ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)));
        for (_, members) in starting_before {
            for (end, (stream, _)) in members {
                let covers = match end {
                    RangeEnd::Unbounded => true,
                    RangeEnd::Before(end) => key < end.as_slice(),
                    RangeEnd::Single => false,
                };
                if covers {
                    out.insert(*stream);
                }
            }
        }
    }
}

impl Hub {
    /// Starts the tailer. It reads from the store's current revision on, woken by the store's
    /// commits and, for writes by other processes, every `poll_interval`.
    ///
    /// # Errors
    /// The database cannot be read.
    pub async fn start(
        store: &Store,
        poll_interval: Duration,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> mvcc::Result<Self> {
        // The hub and the store's applied index take in the same revisions, from the same
        // start: the index's.
        let applied = store.applied().clone();
        let hub = Hub::new(
            store.backend().clone(),
            applied.revision(),
            Some(applied.clone()),
        );
        let direct = hub.clone();
        // A store serves one hub; should a second one start, it relies on its tailer alone
        // and leaves the applied index to the first.
        let first = store.feed_changes(Box::new(move |after, through, rows| {
            direct.take_over(after, through, rows);
        }));
        let hub = if first {
            applied.feed();
            hub
        } else {
            Hub::new(
                store.backend().clone(),
                store.revisions().await?.current,
                None,
            )
        };
        tasks.spawn(run_tailer(
            hub.clone(),
            store.clone(),
            Wakeups {
                commits: store.committed(),
                remote_commits: store.backend().commit_notifications(),
                reads: store.catch_up_requests(),
                landing: store.landing(),
            },
            poll_interval,
            shutdown,
        ));
        Ok(hub)
    }

    /// A hub that has delivered everything up to `start`, with no tailer; it feeds `applied`,
    /// which must be at `start` too.
    fn new(backend: Arc<dyn Backend>, start: i64, applied: Option<mvcc::Applied>) -> Self {
        let (delivered, _) = watch::channel(start);
        Hub {
            inner: Arc::new(HubInner {
                registry: Mutex::new(Registry {
                    delivered: start,
                    streams: HashMap::new(),
                    index: RangeIndex::default(),
                }),
                delivered,
                next_stream: AtomicU64::new(0),
                backend,
                applied,
                #[cfg(test)]
                pause_after_publish: Mutex::new(None),
            }),
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves the registry consistent (every update is a
        // single insert or remove), so a poisoned lock is still usable.
        self.inner
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// H: every change up to this revision has been handed to the streams.
    pub fn delivered(&self) -> i64 {
        *self.inner.delivered.borrow()
    }

    /// Registers a new watch stream, with no watcher yet. The receiver yields the batches for
    /// the stream's synced watchers, in revision order.
    pub fn subscribe(&self) -> (Subscription, mpsc::Receiver<Arc<Batch>>) {
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        let (queue, batches) = mpsc::channel(STREAM_QUEUE);
        let lag = Arc::new(LagSignal::default());
        self.registry().streams.insert(
            id,
            StreamSlot {
                queue,
                lag: lag.clone(),
                watchers: HashMap::new(),
            },
        );
        let subscription = Subscription {
            hub: self.clone(),
            id,
            lag,
        };
        (subscription, batches)
    }

    /// A receiver that changes whenever H moves.
    pub fn delivered_changes(&self) -> watch::Receiver<i64> {
        self.inner.delivered.subscribe()
    }

    /// Reads the changes in `(after, through]` and the store's revisions from one snapshot.
    ///
    /// # Errors
    /// The database cannot be read.
    pub async fn read_changes(
        &self,
        after: i64,
        through: i64,
    ) -> mvcc::Result<(Revisions, Vec<Event>)> {
        let (revisions, rows) = self.inner.backend.read_changes(after, through).await?;
        Ok((revisions, rows.into_iter().map(Event::from_row).collect()))
    }

    /// Publishes what the writer handed over, the rows of `(after, through]`, as far as H has
    /// not reached them yet. If H is below `after` nothing is published: the tailer reads the
    /// gap, and these rows with it.
    fn take_over(&self, after: i64, through: i64, rows: Vec<LogRow>) {
        let delivered = self.delivered();
        if delivered < after || delivered >= through {
            return;
        }
        let events = rows
            .into_iter()
            .filter(|row| row.revision > delivered)
            .map(Event::from_row)
            .collect();
        // Refused if the tailer moved H meanwhile; it then has these rows too.
        self.publish(delivered, through, events);
    }

    /// Hands the changes in `(after, through]` to the interested streams and moves H to
    /// `through`, if H is `after`; otherwise does nothing and returns `false`.
    fn publish(&self, after: i64, through: i64, events: Vec<Event>) -> bool {
        let mut registry = self.registry();
        if registry.delivered != after {
            return false;
        }
        if let Some(applied) = &self.inner.applied {
            // Never refused: the index takes in exactly what the hub publishes.
            applied.apply(
                after,
                through,
                events
                    .iter()
                    .map(|event| (&event.kv, event.kind == EventKind::Delete)),
            );
        }
        let batch = Arc::new(Batch { through, events });
        let mut interested = HashSet::new();
        for event in &batch.events {
            registry.index.streams_for(&event.kv.key, &mut interested);
        }
        for stream in interested {
            let Some(slot) = registry.streams.get(&stream) else {
                continue;
            };
            match slot.queue.try_send(batch.clone()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    let watchers = std::mem::take(
                        &mut registry
                            .streams
                            .get_mut(&stream)
                            .expect("the stream was just found")
                            .watchers,
                    );
                    for (watch, range) in &watchers {
                        registry.index.remove(range, (stream, *watch));
                    }
                    if let Some(slot) = registry.streams.get(&stream) {
                        slot.lag.lagged.store(true, Ordering::Release);
                        slot.lag.notify.notify_one();
                    }
                    tracing::debug!(stream, "watch stream fell behind; it will catch up");
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    Registry::drop_stream(&mut registry, stream);
                }
            }
        }
        registry.delivered = through;
        // Under the lock: two publishers that each move H must also announce it in that
        // order, or the later announcement could be overwritten by the earlier one.
        self.inner.delivered.send_replace(through);
        drop(registry);
        #[cfg(test)]
        {
            let pause = self
                .inner
                .pause_after_publish
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(pause) = pause {
                pause();
            }
        }
        true
    }

    /// Starts over at the database's current revision, past a history fence H has not
    /// reached: the applied index is reloaded from the log, and every watcher is taken off the
    /// index as if its stream had fallen behind, so that it catches up from the log, finds its
    /// next revision compacted, and is cancelled (see [`crate::mvcc`]'s fence).
    ///
    /// # Errors
    /// The database cannot be read.
    async fn reset(&self) -> mvcc::Result<()> {
        let mut tx = self.inner.backend.read().await?;
        let revisions = tx.revisions().await?;
        let heads = tx.heads().await?;
        drop(tx);
        let mut registry = self.registry();
        let old = registry.delivered;
        if old >= revisions.fence {
            return Ok(());
        }
        if let Some(applied) = &self.inner.applied {
            applied.reset(&heads, revisions.current);
        }
        registry.index = RangeIndex::default();
        for slot in registry.streams.values_mut() {
            slot.watchers.clear();
            slot.lag.lagged.store(true, Ordering::Release);
            slot.lag.notify.notify_one();
        }
        registry.delivered = revisions.current;
        self.inner.delivered.send_replace(revisions.current);
        drop(registry);
        tracing::warn!(
            delivered = old,
            fence = revisions.fence,
            current = revisions.current,
            "the log was fenced past what this process delivered; memory reloaded, watchers cancelled"
        );
        Ok(())
    }
}

impl Registry {
    fn drop_stream(&mut self, stream: u64) {
        if let Some(slot) = self.streams.remove(&stream) {
            for (watch, range) in &slot.watchers {
                self.index.remove(range, (stream, *watch));
            }
        }
    }
}

/// One watch stream's link to the hub. Dropping it unregisters every watcher of the stream.
pub struct Subscription {
    hub: Hub,
    id: u64,
    lag: Arc<LagSignal>,
}

impl Subscription {
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// Makes a watcher synced if it has seen everything up to H, i.e. `next_rev ≤ H + 1`;
    /// otherwise returns H, up to which it must read the log first.
    ///
    /// # Errors
    /// `Err(H)` when the hub is ahead of the watcher.
    pub fn join(&self, watch: i64, range: &KeyRange, next_rev: i64) -> Result<(), i64> {
        let mut registry = self.hub.registry();
        if next_rev <= registry.delivered {
            return Err(registry.delivered);
        }
        let Some(slot) = registry.streams.get_mut(&self.id) else {
            return Err(registry.delivered);
        };
        if slot.lag.lagged.load(Ordering::Acquire) {
            // The stream must drain and catch up first; joining now could open a gap.
            return Err(registry.delivered);
        }
        slot.watchers.insert(watch, range.clone());
        registry.index.insert(range, (self.id, watch));
        Ok(())
    }

    /// Takes a watcher out of the index (it is cancelled, or its stream fell behind).
    pub fn leave(&self, watch: i64) {
        let mut registry = self.hub.registry();
        if let Some(range) = registry
            .streams
            .get_mut(&self.id)
            .and_then(|slot| slot.watchers.remove(&watch))
        {
            registry.index.remove(&range, (self.id, watch));
        }
    }

    /// Whether the hub dropped this stream's watchers because its queue was full.
    pub fn lagged(&self) -> bool {
        self.lag.lagged.load(Ordering::Acquire)
    }

    /// Waits until the hub drops this stream's watchers (returns at once if it did since the
    /// last wait).
    pub async fn lag_signalled(&self) {
        self.lag.notify.notified().await;
    }

    /// Declares the lag handled: the stream has drained its queue and will catch up.
    pub fn clear_lag(&self) {
        self.lag.lagged.store(false, Ordering::Release);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.registry().drop_stream(self.id);
    }
}

/// Follows the log: after each local commit at once, and every `poll_interval` regardless.
/// What wakes the tailer besides its poll interval.
struct Wakeups {
    /// This process's commits.
    commits: watch::Receiver<i64>,
    /// Other processes' commits, where the database can push them.
    remote_commits: Option<watch::Receiver<CommitNotice>>,
    /// Reads waiting for the applied index to reach a revision.
    reads: watch::Receiver<i64>,
    /// What the writer's batch in flight will commit ([`Store::landing`]).
    landing: watch::Receiver<i64>,
}

async fn run_tailer(
    hub: Hub,
    store: Store,
    wakeups: Wakeups,
    poll_interval: Duration,
    shutdown: CancellationToken,
) {
    let Wakeups {
        mut commits,
        mut remote_commits,
        mut reads,
        mut landing,
    } = wakeups;
    // The newest revision the database announced that the hub has neither read nor been
    // handed, nor the writer committed: held while the writer's batch in flight may be it.
    let mut announced = 0;
    let mut retry = Duration::from_millis(50);
    let mut resumed = remote_commits.as_ref().map_or(0, |rx| rx.borrow().resumed);
    let mut read = true;
    // Skipped wake-ups do not put the next poll off.
    let mut next_poll = tokio::time::Instant::now();
    loop {
        if read {
            match tail_once(&hub, &store).await {
                Ok(()) => {
                    retry = Duration::from_millis(50);
                    next_poll = tokio::time::Instant::now() + poll_interval;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watch hub cannot read the log; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(retry) => {}
                        () = shutdown.cancelled() => return,
                    }
                    retry = (retry * 2).min(Duration::from_secs(2));
                    continue;
                }
            }
        }
        // Commits by other processes wake the hub too when the database can say so; if that
        // channel closes, polling carries on alone.
        let remote = async {
            let Some(rx) = remote_commits.as_mut() else {
                return std::future::pending().await;
            };
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            *rx.borrow_and_update()
        };
        // A wake-up for a revision the hub has already published needs no read of the log: this
        // process's own commits are handed over directly and then announced twice (by the
        // writer, and by the database's notification), and on PostgreSQL each read is a
        // transaction of its own. The database's notification of this process's own commit
        // often comes before the writer learns that it committed: a notification up to the
        // revision the writer's batch in flight moves to waits for that batch, and leads to a
        // read only if the batch failed. Whatever the batch lands, the writer's announcement
        // wakes the hub, and leads to a read if the hand-over could not publish (other
        // processes' commits came first). Notifications that were re-established always lead
        // to a read, as does every poll: they are how a failover's shorter history is found.
        let unexplained = |announced: i64, landing: i64| {
            announced > hub.delivered().max(store.landed()).max(landing)
        };
        read = tokio::select! {
            changed = commits.changed() => {
                if changed.is_err() {
                    return;
                }
                *commits.borrow_and_update() > hub.delivered()
            }
            changed = reads.changed() => {
                if changed.is_err() {
                    return;
                }
                *reads.borrow_and_update() > hub.delivered()
            }
            notice = remote => {
                let again = notice.resumed != resumed;
                resumed = notice.resumed;
                announced = announced.max(notice.revision);
                again || unexplained(announced, *landing.borrow())
            }
            changed = landing.changed(), if announced > 0 => {
                if changed.is_err() {
                    return;
                }
                unexplained(announced, *landing.borrow_and_update())
            }
            () = tokio::time::sleep_until(next_poll) => true,
            () = shutdown.cancelled() => return,
        };
        if read || !unexplained(announced, 0) {
            announced = 0;
        }
    }
}

/// Publishes everything committed after H that the writer did not hand over. First, if the
/// database lost revisions this process served, fences the store past them, and if the log
/// was fenced past H, starts over there (see [`crate::mvcc`]'s fence).
async fn tail_once(hub: &Hub, store: &Store) -> mvcc::Result<()> {
    loop {
        // Taken before the database is asked: it holds everything served until then, unless a
        // failover lost it; this process may commit more meanwhile.
        let served = store.high_water().max(hub.delivered());
        let revisions = store.revisions().await?;
        if revisions.current < served {
            store.fence(served).await?;
            continue;
        }
        if revisions.fence > hub.delivered() {
            hub.reset().await?;
            continue;
        }
        let current = revisions.current;
        let mut delivered = hub.delivered();
        if current <= delivered {
            return Ok(());
        }
        // Whether to ask the database again: a snapshot held something newer, or the writer
        // handed over part of the range meanwhile.
        let mut again = false;
        while delivered < current {
            let through = (delivered + READ_CHUNK).min(current);
            let (seen, events) = hub.read_changes(delivered, through).await?;
            again |= seen.current > current;
            if !hub.publish(delivered, through, events) {
                // Go on from where H is now.
                again = true;
                break;
            }
            delivered = through;
        }
        // Otherwise a later commit wakes the follower by itself (its notification, the writer's
        // hand-over, or the next poll).
        if !again {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(key: &str, end: &str) -> KeyRange {
        KeyRange::from_etcd(key.as_bytes().to_vec(), end.as_bytes().to_vec())
    }

    fn streams(index: &RangeIndex, key: &str) -> Vec<u64> {
        let mut out = HashSet::new();
        index.streams_for(key.as_bytes(), &mut out);
        let mut out: Vec<_> = out.into_iter().collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn index_routes_by_key_and_range() {
        let mut index = RangeIndex::default();
        index.insert(&range("a", ""), (1, 0));
        index.insert(&range("a/", "a0"), (2, 0));
        index.insert(&range("b", "\0"), (3, 0));
        index.insert(&range("a/x", "a/y"), (4, 0));
        assert_eq!(streams(&index, "a"), vec![1]);
        assert_eq!(streams(&index, "a/x1"), vec![2, 4]);
        assert_eq!(streams(&index, "a/z"), vec![2]);
        assert_eq!(streams(&index, "a0"), Vec::<u64>::new());
        assert_eq!(streams(&index, "zz"), vec![3]);
        index.remove(&range("a/", "a0"), (2, 0));
        assert_eq!(streams(&index, "a/x1"), vec![4]);
        index.remove(&range("a", ""), (1, 0));
        assert!(index.keys.is_empty());
    }

    fn row(revision: i64, deleted: bool, created: bool) -> LogRow {
        LogRow {
            revision,
            sub: 0,
            key: b"k".to_vec(),
            created,
            deleted,
            create_revision: 2,
            prev_revision: revision - 1,
            version: 3,
            lease: 0,
            value: if deleted { vec![] } else { b"new".to_vec() },
            old_value: (!created).then(|| b"old".to_vec()),
            old_lease: 7,
        }
    }

    fn put_event(key: &str, revision: i64) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: key.as_bytes().to_vec(),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
                value: b"v".to_vec(),
                lease: 0,
            },
            prev_kv: None,
        }
    }

    /// A hub at revision 1 over a fresh SQLite file in `dir`, with no tailer.
    async fn test_hub(dir: &std::path::Path) -> Hub {
        let endpoint = format!("sqlite://{}", dir.join("state.db").display());
        let backend = crate::backend::open(&endpoint, &Default::default())
            .await
            .unwrap();
        Hub::new(backend, 1, None)
    }

    #[tokio::test]
    async fn a_full_queue_takes_the_stream_off_the_hub_until_it_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let hub = test_hub(dir.path()).await;
        let (sub, mut batches) = hub.subscribe();
        let (other, mut other_batches) = hub.subscribe();
        let all = range("k", "\0");
        sub.join(0, &all, 2).unwrap();
        other.join(0, &all, 2).unwrap();
        // A watcher that has not seen up to H may not join.
        assert_eq!(sub.join(1, &all, 1), Err(1));

        let overflow = 2 + STREAM_QUEUE as i64;
        for revision in 2..=overflow {
            assert!(hub.publish(revision - 1, revision, vec![put_event("k", revision)]));
            // The other stream keeps reading: the slow one does not hold it back.
            assert_eq!(other_batches.recv().await.unwrap().through, revision);
        }
        assert!(sub.lagged());
        assert!(!other.lagged());
        assert_eq!(hub.delivered(), overflow);
        // Nothing more is queued for the lagging stream, and it cannot rejoin yet.
        assert!(hub.publish(overflow, overflow + 1, vec![put_event("k", overflow + 1)]));
        // A publisher that is not caught up (here, out of order) changes nothing.
        assert!(!hub.publish(
            overflow - 1,
            overflow + 1,
            vec![put_event("k", overflow + 1)]
        ));
        assert_eq!(hub.delivered(), overflow + 1);
        assert_eq!(batches.len(), STREAM_QUEUE);
        assert_eq!(sub.join(0, &all, overflow + 2), Err(overflow + 1));

        // It drains its queue (revisions 2..=257, in order), reads the rest from the log,
        // then rejoins and receives live batches again.
        let mut last = 1;
        while let Ok(batch) = batches.try_recv() {
            assert_eq!(batch.through, last + 1);
            last = batch.through;
        }
        assert_eq!(last, overflow - 1);
        sub.clear_lag();
        sub.join(0, &all, overflow + 2).unwrap();
        assert!(hub.publish(
            overflow + 1,
            overflow + 2,
            vec![put_event("k", overflow + 2)]
        ));
        assert_eq!(batches.recv().await.unwrap().through, overflow + 2);

        // Dropping a subscription removes its watchers from the index.
        drop(sub);
        assert!(hub.publish(
            overflow + 2,
            overflow + 3,
            vec![put_event("k", overflow + 3)]
        ));
        assert!(hub.registry().index.ranges.values().all(|m| m.len() == 1));
    }

    /// Issue 14: the writer's hand-over and the tailer publish from different tasks. If one
    /// of them announced H after releasing the registry lock, a second publish could slip in
    /// between and its newer H be overwritten by the first one's older value: streams then saw
    /// H behind the registry, so catch-up could neither read (nothing below H) nor join (the
    /// registry was ahead), and progress requests waited for an H that had already passed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_publishers_announce_the_newest_revision() {
        let dir = tempfile::tempdir().unwrap();
        let hub = test_hub(dir.path()).await;
        let mut announced = hub.delivered_changes();
        let (paused_tx, paused) = std::sync::mpsc::channel();
        let (resume, resumed) = std::sync::mpsc::channel::<()>();
        *hub.inner.pause_after_publish.lock().unwrap() = Some(Box::new(move || {
            let _ = paused_tx.send(());
            let _ = resumed.recv_timeout(Duration::from_secs(10));
        }));
        // The first publisher stops right after its publish released the lock...
        let first = {
            let hub = hub.clone();
            std::thread::spawn(move || hub.publish(1, 2, vec![put_event("k", 2)]))
        };
        paused
            .recv_timeout(Duration::from_secs(10))
            .expect("the first publisher reaches its pause");
        // ...while the second publishes the next revision.
        assert!(hub.publish(2, 3, vec![put_event("k", 3)]));
        resume.send(()).unwrap();
        assert!(first.join().unwrap());

        assert_eq!(hub.delivered(), 3, "H as announced to streams");
        assert_eq!(*announced.borrow_and_update(), 3);
        // A watcher that has seen everything up to H joins; one that has not is told to read
        // up to the same H the stream sees.
        let (sub, _batches) = hub.subscribe();
        let all = range("k", "\0");
        assert_eq!(sub.join(0, &all, 3), Err(hub.delivered()));
        assert_eq!(sub.join(1, &all, hub.delivered() + 1), Ok(()));
    }

    #[test]
    fn events_rebuild_prev_kv_from_the_row() {
        let update = Event::from_row(row(5, false, false));
        assert_eq!(update.kind, EventKind::Put);
        assert_eq!(update.kv.version, 3);
        let prev = update.prev_kv.unwrap();
        assert_eq!(
            (prev.mod_revision, prev.version, prev.value, prev.lease),
            (4, 2, b"old".to_vec(), 7)
        );

        let create = Event::from_row(row(2, false, true));
        assert!(create.prev_kv.is_none());

        let delete = Event::from_row(row(6, true, false));
        assert_eq!(delete.kind, EventKind::Delete);
        assert_eq!(
            (
                delete.kv.mod_revision,
                delete.kv.version,
                delete.kv.create_revision
            ),
            (6, 0, 0)
        );
        let prev = delete.prev_kv.unwrap();
        assert_eq!(
            (prev.mod_revision, prev.version, prev.value),
            (5, 3, b"old".to_vec())
        );
    }
}
