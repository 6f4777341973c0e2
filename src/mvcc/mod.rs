//! MVCC: etcd's revision semantics on top of a backend's log (no gRPC, no SQL).
//!
//! # Revisions
//! The store's revision starts at 1 and grows by exactly one for each txn that changes
//! something; all changes of one txn share it. Revisions are allocated only by the single
//! writer task, inside the backend's exclusive write transaction, so they are gapless and
//! become visible in order: a reader sees either all of a revision or none of it. The one
//! jump is a history fence ([`fence`]): after a failover that lost revisions, the store moves
//! past everything served so that no revision number is used twice.
//!
//! # Writes
//! Every write goes to one writer task, which runs it in a batch of writes that commit together
//! and answers it once the batch is durable ([`writer`]).
//!
//! # Reads
//! Range reads run on the backend's read snapshots, concurrently with the writer. They see every
//! acknowledged write because replies follow commits.
//!
//! When this process is the database's only writer (SQLite), the current and compact revisions
//! are published in memory once each commit is durable and before its replies, so a read needs no
//! snapshot: it takes the published current revision R (every acknowledged write is at or
//! below it) and reads the rows visible at R with single statements, each of which sees at
//! least R. Rows visible at R never change afterwards; only compaction past R could delete
//! some, and the compact revision is published before the compactor is told of it, so a read
//! that finds the compact revision still at or below R once it is done read intact rows.
//!
//! A read of the current revision is answered from the applied index ([`applied`]), which the
//! watch hub feeds with every revision it publishes, in order. The read waits until the index
//! has reached R, then answers at the index's revision A ≥ R: A is durable and at or below the
//! published revision, so no later read can see less. Keys, metadata and counts come from
//! memory; values too, where the index holds them within its budget, and the rest are read by
//! primary key, `(key, mod_revision)`, in one statement per read. Should compaction have removed
//! such a row meanwhile, the read falls back to SQL at the current revision. A read at a given
//! revision P waits until the index has reached P too, and is answered from it if the index
//! still has the history back to P (it undoes the changes after P); reads of older revisions
//! use SQL alone. On a shared database (PostgreSQL) a read first learns the cluster's current
//! and compact revisions with one round trip that concurrent reads share ([`probe`]), then
//! waits for the index to reach the revision it reads.
//!
//! # Compaction
//! `Compact(C)` makes reads below C answer "compacted"; a background task deletes what no read
//! at or above C can see ([`compactor`]).

pub mod alarm;
mod applied;
mod compactor;
pub mod compare;
mod fence;
mod hash;
mod index;
mod leased;
mod probe;
mod read;
mod txn;
pub mod types;
mod writer;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::{self, Backend, DbSize, LeaseRow, LogRow, ReadTxn, Revisions};
pub use applied::Applied;
use compactor::run_compactor;
use index::KeyIndex;
pub(crate) use index::KeyMeta;
use probe::RevisionProbe;
use types::{
    DeleteRequest, DeleteResponse, LeaseOp, LeaseOutcome, Op, OpResponse, PutRequest, PutResponse,
    Revisioned, TxnRequest, TxnResponse,
};
use writer::{MAX_BATCH, WriteJob, WriterMemory, WriterSignals, run_acknowledger, run_writer};

use alarm::{Alarms, Cost};
pub use fence::FENCE_GAP;
pub use hash::KvHash;

/// Cloneable so that one failed batch can answer each of its requests with the same error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    #[error("mvcc: required revision is a future revision")]
    FutureRevision,
    /// A Put with `ignore_value` or `ignore_lease` on a key that does not exist.
    #[error("key not found")]
    KeyNotFound,
    #[error("requested lease not found")]
    LeaseNotFound,
    #[error("lease already exists")]
    LeaseExists,
    /// A Put's key is longer than the database's indexes can hold (etcd itself has no such
    /// limit below its request size).
    #[error("key is too long for this data store (at most {max} bytes)")]
    KeyTooLong { max: usize },
    #[error(transparent)]
    Backend(Arc<backend::Error>),
    /// The writer's key index named a row the log does not hold. The batch fails and the
    /// index is reloaded before the next one; seeing this means a bug, or a database changed
    /// behind etcdsql's back.
    #[error("the key index is out of step with the log at {key:?}@{revision}; reloading it")]
    IndexOutOfSync { key: String, revision: i64 },
    #[error("the store is shutting down")]
    ShuttingDown,
    /// The database's current revision is below one this process has served: it lost
    /// commits in a failover ([`fence`]). Refused until the store is fenced past them.
    #[error(
        "the database's history ends at revision {database}, before revision {served} that was \
         served; waiting for the store to move past the lost revisions"
    )]
    Rewound { database: i64, served: i64 },
    /// NOSPACE is raised ([`alarm`]).
    #[error("mvcc: database space exceeded")]
    NoSpace,
    /// CORRUPT is raised.
    #[error("corrupt cluster")]
    Corrupt,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Whether the error fails the whole batch rather than only the request that met it.
    fn fails_batch(&self) -> bool {
        matches!(self, Error::Backend(_) | Error::IndexOutOfSync { .. })
    }
}

impl From<backend::Error> for Error {
    fn from(e: backend::Error) -> Self {
        Error::Backend(Arc::new(e))
    }
}

/// The revision a read at `requested` (0 = current) sees, or why it cannot.
pub(crate) fn resolve_read_revision(requested: i64, current: i64, compact: i64) -> Result<i64> {
    if requested > current {
        return Err(Error::FutureRevision);
    }
    let revision = if requested <= 0 { current } else { requested };
    if revision < compact {
        return Err(Error::Compacted);
    }
    Ok(revision)
}

/// The window of history where the database keeps the log alone: reads by key at any
/// revision since the compaction should come from memory, and Kubernetes' compaction every five
/// minutes leaves fewer changes than this below about 3,500 writes/s. About 100 MiB at most.
pub const LOG_ALONE_HISTORY: usize = 1 << 20;
/// The window where the database also finds each key's rows at a revision by key.
pub const SHARED_HISTORY: usize = 16_384;

/// How a store uses memory.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// The most bytes of values the applied index holds for reads; 0 holds none, and every
    /// read with values reads them by primary key.
    pub read_cache_bytes: usize,
    /// How many recent changes the applied index can undo, to answer reads at revisions it has
    /// passed (it forgets those this process compacts past sooner); 0 sends every such read to
    /// SQL. `None`: [`LOG_ALONE_HISTORY`] where the backend is the sole writer (SQLite, which
    /// keeps the log alone and so reads by key slowly), [`SHARED_HISTORY`] elsewhere.
    pub read_history_changes: Option<usize>,
    /// etcd's `--quota-backend-bytes`: 0 is etcd's default (2 GiB), negative is none.
    pub quota_backend_bytes: i64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            read_cache_bytes: 256 << 20,
            read_history_changes: None,
            quota_backend_bytes: 0,
        }
    }
}

/// A handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    /// The writer task's queue. Bounded so a flood of writes waits instead of growing memory.
    writes: mpsc::Sender<WriteJob>,
    /// Revision up to which rows have been physically compacted, for `Compact(physical)`.
    compacted: watch::Receiver<i64>,
    /// The newest committed revision, so the watch hub wakes at once after a local commit.
    committed: watch::Receiver<i64>,
    /// The newest revision the writer has committed, moved before the batch is synced and
    /// handed to the watch hub (see [`Store::landed`]).
    landed: Arc<AtomicI64>,
    /// The revision the writer's batch in flight moves the database to, once it has
    /// written its rows (0: none); see [`Store::landing`].
    landing: watch::Receiver<i64>,
    stats: Arc<WriteCounters>,
    /// Set when the backend says this process is its only writer: `published` is then the
    /// database's state, and reads use it instead of a snapshot.
    sole_writer: bool,
    published: Arc<Published>,
    /// Every live key, with values within a budget, as of the revisions the watch hub has taken
    /// in ([`applied`]).
    applied: Applied,
    /// The alarms and the space quota, checked before writes are queued.
    alarms: Arc<Alarms>,
    /// Where the database is shared: the round trips that tell reads the cluster's revision.
    probe: RevisionProbe,
    /// The newest revision a read waits for the applied index to reach, so that the watch hub's
    /// tailer reads the log at once instead of at its next wake-up.
    catch_up: watch::Sender<i64>,
    /// Range reads answered without SQL, and with it.
    reads_from_memory: AtomicU64,
    reads_from_sql: AtomicU64,
    /// Revisions lost in failovers that this process fenced ([`fence`]).
    lost_revisions: AtomicU64,
}

/// The revisions as of the last durable commit, stored before that commit's replies are sent.
struct Published {
    current: AtomicI64,
    compact: AtomicI64,
}

impl Published {
    fn revisions(&self) -> Revisions {
        Revisions {
            current: self.current.load(Ordering::SeqCst),
            compact: self.compact.load(Ordering::SeqCst),
            fence: 0,
        }
    }
}

/// Hands back to the system the memory that the start-up load used and freed (the rows the
/// indexes were built from, several times the indexes' size): glibc would keep it mapped, and
/// the process's resident memory would never come down to what it holds. The etcdsql binary
/// allocates with mimalloc (src/main.rs), which returns freed pages by itself and leaves glibc's
/// heaps nearly empty; this serves programs that embed the library on glibc's malloc (the
/// benches and tests).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only returns free pages of the heaps to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Counts kept by the writer, so group commit can be observed (tests, metrics).
#[derive(Default)]
struct WriteCounters {
    batches: AtomicU64,
    requests: AtomicU64,
    /// Batches that presumed the database was where this writer left it, and were right.
    presumed: AtomicU64,
    /// Batches that presumed so wrongly (another process had committed) and ran again.
    reruns: AtomicU64,
    /// Told about every committed batch; a `OnceLock` so the writer reads it without a lock.
    observer: OnceLock<CommitObserver>,
    /// Handed every committed batch's rows (the watch hub).
    changes: OnceLock<ChangeSink>,
}

/// Called after each committed batch, once it is durable, with the number of requests the batch
/// held and the current revision after it. It runs on the task that sends the writer's replies:
/// it must be quick and must not block.
pub type CommitObserver = Box<dyn Fn(usize, i64) + Send + Sync>;

/// Called after each committed batch that changed something, once it is durable and before its
/// replies are sent, with the revision before the batch, the revision after it and the rows of
/// the revisions in between, in order; ahead of those, the same for the other processes'
/// commits the batch's transaction read when it began, if it read them. It runs on the task
/// that sends the writer's replies: it must be quick and must not block.
pub type ChangeSink = Box<dyn Fn(i64, i64, Vec<LogRow>) + Send + Sync>;

/// How many Range reads were answered from memory alone, and how many needed SQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    pub memory: u64,
    pub sql: u64,
}

/// How many write requests the writer has committed, in how many database transactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    pub batches: u64,
    pub requests: u64,
    /// Batches that presumed the database's revision and were right (PostgreSQL; see
    /// `writer`'s presumed batches).
    pub presumed: u64,
    /// Batches that presumed it wrongly and ran again.
    pub reruns: u64,
}

impl Store {
    /// Starts the writer and compactor tasks on `tracker`; they stop when `shutdown` fires,
    /// after finishing the batch at hand.
    ///
    /// # Errors
    /// The backend cannot be read.
    pub async fn start(
        backend: Arc<dyn Backend>,
        options: StoreOptions,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Self> {
        let (writes, queue) = mpsc::channel(4 * MAX_BATCH);
        let history = options
            .read_history_changes
            .unwrap_or(if backend.sole_writer() {
                LOG_ALONE_HISTORY
            } else {
                SHARED_HISTORY
            });
        let (start, index, applied) = {
            let mut snapshot = backend.read().await?;
            let start = snapshot.revisions().await?;
            // The window of history starts full: the changes since the compact revision, as many
            // as it holds (each revision has one change or more, so this many revisions back
            // hold at least that many changes).
            let window = i64::try_from(history).unwrap_or(i64::MAX);
            let after = start.compact.max(start.current.saturating_sub(window));
            let (heads, since) = snapshot.heads_and_changes(after, start.current).await?;
            let applied = Applied::load(&heads, start.current, options.read_cache_bytes, history);
            if after < start.current {
                applied.remember_since(after, &since);
            }
            drop(since);
            (start, KeyIndex::load(heads, start.current), applied)
        };
        release_freed_memory();
        let alarms = Arc::new(Alarms::load(backend.as_ref(), options.quota_backend_bytes).await?);
        tracker.spawn(
            alarms
                .clone()
                .run_refresh(backend.clone(), shutdown.clone()),
        );
        let compact_revision = start.compact;
        let (committed_tx, committed) = watch::channel(start.current);
        let landed = Arc::new(AtomicI64::new(start.current));
        let (landing_tx, landing) = watch::channel(0);
        let (compact_target, target_rx) = watch::channel(compact_revision);
        let done = backend.compacted_through().await?;
        let (compacted_tx, compacted) = watch::channel(done);
        let stats = Arc::new(WriteCounters::default());
        let sole_writer = backend.sole_writer();
        let published = Arc::new(Published {
            current: AtomicI64::new(start.current),
            compact: AtomicI64::new(start.compact),
        });
        let (acks, committing) = mpsc::channel(1);
        tracker.spawn(run_writer(
            backend.clone(),
            WriterMemory {
                index,
                applied: applied.clone(),
                landed: landed.clone(),
                landing: landing_tx,
                stats: stats.clone(),
            },
            start,
            queue,
            compacted.clone(),
            acks,
            shutdown.clone(),
        ));
        tracker.spawn(run_acknowledger(
            backend.clone(),
            committing,
            WriterSignals {
                compact_target,
                committed: committed_tx,
                published: published.clone(),
            },
            stats.clone(),
        ));
        tracker.spawn(run_compactor(
            backend.clone(),
            target_rx,
            compacted_tx,
            shutdown,
        ));
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                writes,
                compacted,
                committed,
                landed,
                landing,
                stats,
                sole_writer,
                published,
                applied,
                probe: RevisionProbe::new(),
                alarms,
                catch_up: watch::channel(start.current).0,
                reads_from_memory: AtomicU64::new(0),
                reads_from_sql: AtomicU64::new(0),
                lost_revisions: AtomicU64::new(0),
            }),
        })
    }

    /// The applied index, for the watch hub to feed with every revision it takes in.
    pub fn applied(&self) -> &Applied {
        &self.inner.applied
    }

    /// Revisions that reads wait for the applied index to reach: the watch hub's tailer should
    /// read the log up to them now.
    pub fn catch_up_requests(&self) -> watch::Receiver<i64> {
        self.inner.catch_up.subscribe()
    }

    /// The newest revision committed by this process's writer; changes after every commit.
    pub fn committed(&self) -> watch::Receiver<i64> {
        self.inner.committed.clone()
    }

    /// The newest revision this process's writer has committed, set as soon as its commit
    /// returns: [`Store::committed`] moves to it later, once the batch is synced (SQLite) and
    /// handed to the watch hub. A notification of a commit at or below it needs no read of the log, since that
    /// move wakes the hub anyway.
    pub fn landed(&self) -> i64 {
        self.inner.landed.load(Ordering::SeqCst)
    }

    /// The revision the writer's batch in flight takes the database to, set once the batch
    /// has run its requests and before it writes its last rows, and back to 0 once the batch
    /// has landed ([`Store::landed`]) or failed. The database's notification of that commit
    /// may come before the writer learns it committed: up to this revision a notification
    /// is likely this process's own, and whether it was is known when this moves.
    pub fn landing(&self) -> watch::Receiver<i64> {
        self.inner.landing.clone()
    }

    /// The backend, for readers that need more than the store offers (the watch hub).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Committed write batches and the requests they held.
    pub fn write_stats(&self) -> WriteStats {
        WriteStats {
            batches: self.inner.stats.batches.load(Ordering::Relaxed),
            requests: self.inner.stats.requests.load(Ordering::Relaxed),
            presumed: self.inner.stats.presumed.load(Ordering::Relaxed),
            reruns: self.inner.stats.reruns.load(Ordering::Relaxed),
        }
    }

    /// Range reads so far, by where they were answered from.
    pub fn read_stats(&self) -> ReadStats {
        ReadStats {
            memory: self.inner.reads_from_memory.load(Ordering::Relaxed),
            sql: self.inner.reads_from_sql.load(Ordering::Relaxed),
        }
    }

    /// Installs the observer of committed batches (the metrics). Returns `false`, and keeps the
    /// earlier one, if an observer was already installed.
    pub fn observe_commits(&self, observer: CommitObserver) -> bool {
        self.inner.stats.observer.set(observer).is_ok()
    }

    /// Installs the receiver of committed rows (the watch hub). Returns `false`, and keeps the
    /// earlier one, if one was already installed.
    pub fn feed_changes(&self, sink: ChangeSink) -> bool {
        self.inner.stats.changes.set(sink).is_ok()
    }

    /// The current and compact revisions.
    ///
    /// # Errors
    /// The backend is unreachable.
    pub async fn revisions(&self) -> Result<Revisions> {
        if self.inner.sole_writer {
            return Ok(self.inner.published.revisions());
        }
        Ok(self.inner.backend.read().await?.revisions().await?)
    }

    /// The alarms raised, in etcd's numbers ([`alarm`]).
    pub fn alarms(&self) -> Vec<i32> {
        self.inner.alarms.raised()
    }

    /// Raises or clears an alarm for every instance of the database; whether that changed
    /// anything.
    ///
    /// # Errors
    /// The backend fails.
    pub async fn set_alarm(&self, alarm: i32, raise: bool) -> Result<bool> {
        self.inner
            .alarms
            .set(self.inner.backend.as_ref(), alarm, raise)
            .await
    }

    /// The revision of what this process holds, read without asking the database whether a
    /// newer one exists (etcd's serializable read): the applied index's when it serves reads,
    /// else the database's.
    ///
    /// # Errors
    /// The applied index does not serve reads and the backend is unreachable.
    pub async fn read_locally(&self) -> Result<i64> {
        let applied = &self.inner.applied;
        if applied.serving() {
            return Ok(applied.view().revision());
        }
        Ok(self.revisions().await?.current)
    }

    /// # Errors
    /// The backend is unreachable.
    pub async fn size(&self) -> Result<DbSize> {
        Ok(self.inner.backend.size().await?)
    }

    /// Runs a txn; the revision is the one it wrote at, or the current one if it wrote nothing.
    ///
    /// # Errors
    /// A Put's `ignore_*` names a missing key, a Range names a compacted or future revision,
    /// an alarm refuses the txn (`NoSpace`, `Corrupt`), or the backend fails (then nothing of
    /// the txn was written).
    pub async fn txn(&self, req: TxnRequest) -> Result<Revisioned<TxnResponse>> {
        if let Some(max) = self.inner.backend.max_key_bytes()
            && req.longest_put_key() > max
        {
            return Err(Error::KeyTooLong { max });
        }
        self.inner
            .alarms
            .admit(self.inner.backend.as_ref(), Cost::Txn(&req))
            .await?;
        let (reply, answer) = oneshot::channel();
        self.submit(WriteJob::Txn { req, reply }).await?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }

    /// # Errors
    /// As [`Store::txn`].
    pub async fn put(&self, req: PutRequest) -> Result<Revisioned<PutResponse>> {
        let out = self.single_op(Op::Put(req)).await?;
        match out.value {
            OpResponse::Put(put) => Ok(Revisioned {
                revision: out.revision,
                value: put,
            }),
            _ => unreachable!("a put op answers with a put response"),
        }
    }

    /// # Errors
    /// As [`Store::txn`].
    pub async fn delete(&self, req: DeleteRequest) -> Result<Revisioned<DeleteResponse>> {
        let out = self.single_op(Op::Delete(req)).await?;
        match out.value {
            OpResponse::Delete(delete) => Ok(Revisioned {
                revision: out.revision,
                value: delete,
            }),
            _ => unreachable!("a delete op answers with a delete response"),
        }
    }

    async fn single_op(&self, op: Op) -> Result<Revisioned<OpResponse>> {
        let out = self
            .txn(TxnRequest {
                compares: Vec::new(),
                success: vec![op],
                failure: Vec::new(),
            })
            .await?;
        let response = out.value.responses.into_iter().next();
        Ok(Revisioned {
            revision: out.revision,
            value: response.ok_or(Error::ShuttingDown)?,
        })
    }

    /// Compacts the log at `revision`; with `physical`, waits until the superseded rows are gone.
    /// Returns the current revision.
    ///
    /// # Errors
    /// `Compacted` if `revision` is not above the compact revision, `FutureRevision` if it is
    /// above the current one.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<i64> {
        let (reply, answer) = oneshot::channel();
        self.submit(WriteJob::Compact { revision, reply }).await?;
        let current = answer.await.map_err(|_| Error::ShuttingDown)??;
        let applied = self.inner.applied.clone();
        tokio::task::spawn_blocking(move || applied.forget_through(revision))
            .await
            .map_err(|_| Error::ShuttingDown)?;
        if physical {
            let mut compacted = self.inner.compacted.clone();
            compacted
                .wait_for(|done| *done >= revision)
                .await
                .map_err(|_| Error::ShuttingDown)?;
        }
        Ok(current)
    }

    /// Applies a change to the lease table (and, for revocation and expiry, deletes the
    /// attached keys); the revision is the one the deletions took, or the current one.
    ///
    /// # Errors
    /// `LeaseExists` on a grant with a taken id, `LeaseNotFound` on revoking an unknown lease,
    /// or the backend fails.
    pub async fn lease(&self, op: LeaseOp) -> Result<Revisioned<LeaseOutcome>> {
        if matches!(op, LeaseOp::Grant(_)) {
            self.inner
                .alarms
                .admit(self.inner.backend.as_ref(), Cost::LeaseGrant)
                .await?;
        }
        let (reply, answer) = oneshot::channel();
        self.submit(WriteJob::Lease { op, reply }).await?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }

    /// A lease and, if asked, the keys attached to it now.
    ///
    /// # Errors
    /// The backend is unreachable.
    pub async fn read_lease(
        &self,
        id: i64,
        with_keys: bool,
    ) -> Result<Revisioned<Option<(LeaseRow, Vec<Vec<u8>>)>>> {
        let mut tx = self.inner.backend.read().await?;
        let revision = self.snapshot_revision(tx.as_mut()).await?;
        let Some(lease) = tx.lease(id).await? else {
            return Ok(Revisioned {
                revision,
                value: None,
            });
        };
        let keys = if !with_keys {
            Vec::new()
        } else if let Some(keys) = self.leased_from_memory(id, revision).await {
            keys
        } else {
            let rows = tx.lease_keys(id, revision).await?;
            rows.into_iter().map(|row| row.key).collect()
        };
        Ok(Revisioned {
            revision,
            value: Some((lease, keys)),
        })
    }

    /// Every lease, by id.
    ///
    /// # Errors
    /// The backend is unreachable.
    pub async fn leases(&self) -> Result<Revisioned<Vec<LeaseRow>>> {
        let mut tx = self.inner.backend.read().await?;
        let revision = self.snapshot_revision(tx.as_mut()).await?;
        let value = tx.leases().await?;
        Ok(Revisioned { revision, value })
    }

    /// The revision a read on snapshot `tx` reports: the snapshot's own, or for a sole writer
    /// the published one, since the snapshot may hold a commit that is not yet durable.
    async fn snapshot_revision(&self, tx: &mut dyn ReadTxn) -> Result<i64> {
        if self.inner.sole_writer {
            return Ok(self.inner.published.current.load(Ordering::SeqCst));
        }
        Ok(tx.revisions().await?.current)
    }

    /// The earliest lease deadline (Unix milliseconds), if any lease exists.
    ///
    /// # Errors
    /// The backend is unreachable.
    pub async fn next_lease_expiry(&self) -> Result<Option<i64>> {
        Ok(self.inner.backend.read().await?.next_expiry().await?)
    }

    async fn submit(&self, job: WriteJob) -> Result<()> {
        self.inner
            .writes
            .send(job)
            .await
            .map_err(|_| Error::ShuttingDown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_revision_rules() {
        // 0 and negatives read the current revision.
        assert_eq!(resolve_read_revision(0, 10, 0).unwrap(), 10);
        assert_eq!(resolve_read_revision(-3, 10, 0).unwrap(), 10);
        assert_eq!(resolve_read_revision(7, 10, 5).unwrap(), 7);
        // The compact revision itself is still readable; below it is not.
        assert_eq!(resolve_read_revision(5, 10, 5).unwrap(), 5);
        assert!(matches!(
            resolve_read_revision(4, 10, 5),
            Err(Error::Compacted)
        ));
        assert!(matches!(
            resolve_read_revision(11, 10, 5),
            Err(Error::FutureRevision)
        ));
    }
}
