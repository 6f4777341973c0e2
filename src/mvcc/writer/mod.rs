//! The single writer and its acknowledger: every write of this process goes through them.
//!
//! # Group commit
//! Every write (Put, DeleteRange, Txn, Compact, lease changes) is sent to the writer task. It
//! takes all jobs waiting in its queue (up to [`MAX_BATCH`]), runs them one after another in one
//! database transaction, and commits once. Replies go out only once the commit is durable, so an
//! acknowledged write is never lost, and a batch costs one fsync however many requests it holds.
//! Conflicts cannot arise: each request sees the effects of the ones before it, exactly as if
//! they had run one at a time. A txn with a key the database may refuse only when it writes it
//! ([`Backend::checked_key_bytes`]) runs in a batch of its own, so the refusal
//! (`KeyTooLong`) is its alone.
//!
//! Where the backend's commit returns before it is durable (SQLite: it writes the log and leaves
//! the fsync to [`Backend::sync`]), the writer does not wait for the disk: it hands the batch to
//! the acknowledger and runs the next batch while the previous one syncs. The acknowledger
//! answers batches strictly in order, and only after a sync that began after their commit; until
//! then no reader of the log learns of them (reads use the published revision, the watch hub is
//! handed rows only then). The lease table has no revisions: a lease read may see a grant or
//! revocation up to one sync before it is answered.
//!
//! A sole writer (SQLite) also runs each batch while the one before commits: most of a batch is
//! work in memory (the key index, the values, the answers), and the commit (SQLite inserting the
//! rows and appending the pages to the WAL) runs on the connection's own thread. So the batch in
//! flight commits in a task of its own, and the next batch runs on the index as that one left
//! it ([`super::index::KeyIndex::advance`]); whatever it reads from SQL, its transaction reads
//! after the commit, since the connection is taken in order
//! ([`crate::backend::WriteTxn::take_turn`]). Its own commit starts only once the one before
//! has landed, and then the acknowledger has that one: commits and answers stay in order. If
//! the commit in flight fails, the batch run on it is undone with it (its changes to the index
//! are later than the flight's mark), its requests run again, and the index and the cached
//! values are read afresh, as after any failed batch.
//!
//! # The writer's key index
//! The writer keeps the metadata of every key's newest row in memory ([`super::index`]), so compares
//! and a Put's bookkeeping need no SQL; new rows are buffered and inserted together, and the old
//! values a batch's Puts need are fetched in one query. A typical batch is therefore a fixed
//! handful of statements (begin, revisions, old values, insert, current revision, commit)
//! rather than several per request; where the backend can, the begin, the revisions and the
//! changes other processes committed come in one round trip, values and old values included
//! ([`Backend::write_from`]): the batch needs no query for the old values those changes left,
//! and the watch hub is handed them ahead of the batch's own rows. The invariants above still
//! hold:
//! - A failed request changes nothing: every error it can meet (a missing key for `ignore_*`, an
//!   unknown lease, a compacted Range) is found before it writes to the database, and its rows
//!   and index changes are dropped. Only a txn that reads with a Range after writing must put
//!   its own rows into the database first, and it does so under a savepoint.
//! - Each request sees the earlier ones: they updated the index and the batch's values at once,
//!   and buffered rows are inserted before any SQL read of the log inside the batch.
//! - The index matches the committed log: a batch's changes to it are undone unless the batch
//!   commits, and at the start of each batch, inside the write transaction, the writer checks
//!   that the database's current revision is the index's; rows another process committed
//!   (PostgreSQL) are applied to the index, or it is reloaded if compaction may have removed
//!   some of them. A writer with nothing to do takes other processes' commits in ahead of that,
//!   from a read snapshot, so a batch under the cluster-wide lock reads only the few since.
//!
//! # Presumed batches
//! On a shared database (PostgreSQL) the check above is a round trip under the cluster-wide
//! lock, and most of the time it finds nothing: one instance takes the writes, or the only one
//! runs. So after a batch that found no other process's commit, and while the applied index has
//! seen none either, the next batch presumes the database is where this writer left it
//! ([`Backend::write_presuming`]): it runs against the index as it is, and its rows go in one
//! statement that takes the lock, checks the presumption and writes, as a transaction of its
//! own. If another process committed meanwhile, that statement writes nothing, the batch's
//! index changes are undone as for any failed batch, and the batch runs again from the start,
//! reading the revisions first; its requests never see the failed run. The answers of a batch
//! that wrote nothing (compares that failed) rest on the presumption too, so its commit checks
//! the revision as well. The leases its Puts attach rows to, and the old values it needs, are
//! read before the lock too ([`crate::backend::WriteTxn::leases_ahead`],
//! [`crate::backend::WriteTxn::values_ahead`]), and the statement checks that the leases still
//! exist: a revocation with no keys moves no revision. (Values cannot change: a newer row of
//! their key moved the revision.)

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

mod acks;
mod batch;

pub(super) use acks::{Committing, run_acknowledger};

use acks::{BatchResult, Outcome};
use batch::{Begin, Committed, Ran, apply_batch, run_batch};

use super::index::{KeyIndex, Mark};
use super::types::{LeaseOp, LeaseOutcome, Revisioned, TxnRequest, TxnResponse};
use super::values::ValueCache;
use super::{Applied, Error, Published, Result, WriteCounters};
use crate::backend::{Backend, Revisions};

/// Most write requests one database transaction holds.
pub(super) const MAX_BATCH: usize = 512;

/// A write waiting for the writer, with where its answer goes.
pub(super) enum WriteJob {
    Txn {
        req: TxnRequest,
        reply: oneshot::Sender<Result<Revisioned<TxnResponse>>>,
    },
    Compact {
        revision: i64,
        reply: oneshot::Sender<Result<i64>>,
    },
    Lease {
        op: LeaseOp,
        reply: oneshot::Sender<Result<Revisioned<LeaseOutcome>>>,
    },
}

/// What the acknowledger tells the compactor, the watch hub and readers.
pub(super) struct WriterSignals {
    /// Tells the compactor the compact revision a batch set.
    pub(super) compact_target: watch::Sender<i64>,
    /// The newest committed revision, for the watch hub.
    pub(super) committed: watch::Sender<i64>,
    /// The revisions, for readers that need no snapshot.
    pub(super) published: Arc<Published>,
}

/// The single writer: drains the queue in batches, one database transaction per batch, and
/// hands each batch to [`run_acknowledger`], which answers it once it is durable. The writer
/// goes on with the next batch meanwhile; the channel between them holds one batch, so it is
/// never more than a couple of batches ahead of durability.
pub(super) async fn run_writer(
    backend: Arc<dyn Backend>,
    memory: WriterMemory,
    start: Revisions,
    mut queue: mpsc::Receiver<WriteJob>,
    compacted: watch::Receiver<i64>,
    acks: mpsc::Sender<Committing>,
    shutdown: CancellationToken,
) {
    let sole_writer = backend.sole_writer();
    let mut writer = Writer {
        backend,
        memory,
        acks,
        trusted: true,
        unshared: false,
        compact: start.compact,
        flight: None,
    };
    let checked = writer.backend.checked_key_bytes();
    let mut incoming = Vec::with_capacity(MAX_BATCH);
    let mut backlog = VecDeque::with_capacity(MAX_BATCH);
    // Other processes' commits, as the applied index takes them in.
    let mut others = writer.memory.applied.subscribe();
    loop {
        if backlog.is_empty() {
            let next = tokio::select! {
                biased;
                landed = Flight::landed(&mut writer.flight) => Next::Landed(landed),
                n = queue.recv_many(&mut incoming, MAX_BATCH) => {
                    if n == 0 { Next::Stop } else { Next::Jobs }
                }
                () = shutdown.cancelled() => Next::Stop,
                Ok(()) = others.changed(), if !sole_writer => Next::Others,
            };
            match next {
                Next::Jobs => backlog.extend(incoming.drain(..)),
                Next::Landed(landed) => {
                    if writer.land(landed).await.is_err() {
                        break;
                    }
                    continue;
                }
                Next::Others => {
                    let index = &mut writer.memory.index;
                    if writer.memory.applied.revision() - index.revision() >= IDLE_CATCH_UP
                        && let Err(e) = catch_up_idle(writer.backend.as_ref(), index).await
                    {
                        // The next batch catches up under the lock instead.
                        tracing::debug!(error = %e, "the idle writer's catch-up failed");
                    }
                    continue;
                }
                Next::Stop => break,
            }
        }
        // A txn with a key the database may refuse runs alone: a refusal fails it only.
        let alone = |job: &WriteJob| checked.is_some_and(|limit| job.longest_put_key() > limit);
        let received = match backlog.iter().position(alone) {
            Some(0) => 1,
            Some(first) => first,
            None => backlog.len(),
        };
        let jobs: Vec<WriteJob> = backlog.drain(..received).collect();
        let compacted = *compacted.borrow();
        let sent = if sole_writer {
            writer.pipelined(jobs, compacted, &mut backlog).await
        } else {
            writer.one_by_one(jobs, compacted).await
        };
        if sent.is_err() {
            break;
        }
    }
    // The batch still committing is answered; requests still queued at shutdown were never
    // acknowledged: dropping them tells callers.
    if let Some(flight) = writer.flight.as_mut() {
        let landed = (&mut flight.done).await.unwrap_or(Err(Error::ShuttingDown));
        let _ = writer.land(landed).await;
    }
    queue.close();
}

/// What the idle writer wakes up for.
enum Next {
    /// Requests arrived.
    Jobs,
    /// The batch in flight committed, or failed to.
    Landed(Result<()>),
    /// Other processes committed.
    Others,
    Stop,
}

/// The acknowledger is gone (shutting down).
struct AcksClosed;

/// The writer's state between batches.
struct Writer {
    backend: Arc<dyn Backend>,
    memory: WriterMemory,
    acks: mpsc::Sender<Committing>,
    /// Whether the index is known to match the database: then a sole writer need not read the
    /// revisions at the start of a batch. A failed batch may have committed after all (a lost
    /// connection while committing), so the next one asks the database.
    trusted: bool,
    /// Whether the last batch found no commit of other processes (see `Begin::Presumed`).
    unshared: bool,
    /// The compact revision as of the last batch run.
    compact: i64,
    /// A sole writer's batch whose commit is under way (see [`Writer::pipelined`]).
    flight: Option<Flight>,
}

/// A batch that ran to its end and whose commit runs in a task of its own.
struct Flight {
    /// The commit's result.
    done: oneshot::Receiver<Result<()>>,
    /// Requests the batch held.
    received: usize,
    committed: Committed,
    outcomes: Vec<Outcome>,
    /// The index before the batch and after it.
    before: Mark,
    after: Mark,
    /// The compact revision before the batch.
    compact: i64,
}

impl Flight {
    /// Waits for the flight's commit to end; never, if there is no flight.
    async fn landed(flight: &mut Option<Flight>) -> Result<()> {
        match flight {
            // The task ends only by sending, unless the runtime is shutting down.
            Some(flight) => (&mut flight.done).await.unwrap_or(Err(Error::ShuttingDown)),
            None => std::future::pending().await,
        }
    }
}

impl Writer {
    /// Runs a batch and commits it before the next (backends shared with other processes, where
    /// each batch may first have to take in what they committed).
    async fn one_by_one(
        &mut self,
        jobs: Vec<WriteJob>,
        compacted: i64,
    ) -> std::result::Result<(), AcksClosed> {
        let backend = self.backend.as_ref();
        let memory = &mut self.memory;
        let own = Revisions {
            current: memory.index.revision(),
            compact: self.compact,
            ..Revisions::default()
        };
        let begin = if self.unshared && memory.applied.revision() <= memory.index.revision() {
            Begin::Presumed(own)
        } else {
            Begin::Read
        };
        let seen = (memory.index.reloads(), memory.index.catch_ups());
        let served = memory.index.revision().max(memory.applied.revision());
        let mut result = apply_batch(backend, memory, (begin, served), compacted, &jobs).await;
        let moved = |e: &Error| matches!(e, Error::Backend(e) if e.is_moved());
        if matches!(begin, Begin::Presumed(_)) && result.as_ref().is_err_and(moved) {
            // Nothing was written; the batch runs again, after what the others committed.
            tracing::debug!(
                "another process committed before the presumed batch; running it again"
            );
            memory.stats.reruns.fetch_add(1, Ordering::Relaxed);
            let again = (Begin::Read, served);
            result = apply_batch(backend, memory, again, compacted, &jobs).await;
        } else if matches!((begin, &result), (Begin::Presumed(_), Ok(_))) {
            memory.stats.presumed.fetch_add(1, Ordering::Relaxed);
        }
        let result = too_long(backend, result);
        let (result, outcomes) = match result {
            Ok((committed, answers)) => {
                let outcomes: Vec<Outcome> =
                    jobs.into_iter().zip(answers).map(Outcome::new).collect();
                (Ok(committed), outcomes)
            }
            Err(e) => (Err(e), jobs.into_iter().map(Outcome::failed).collect()),
        };
        self.trusted = result.is_ok();
        // This process looks like the database's only writer while its batches find nothing
        // committed by others: the next batch presumes so.
        let index = &memory.index;
        self.unshared = self.trusted && (index.reloads(), index.catch_ups()) == seen;
        self.forget_values_after(seen);
        if let Ok(committed) = &result {
            self.memory
                .landed
                .fetch_max(committed.current, Ordering::SeqCst);
            self.memory.values.record(&committed.rows);
            self.compact = committed.compact.unwrap_or(self.compact);
        }
        self.landed_through(i64::MAX);
        self.send(outcomes.len(), result, outcomes).await
    }

    /// Runs a batch while the one before it commits (a sole writer: nothing but this process
    /// moves the database). The batch runs in memory on the index as the batch in flight left
    /// it, and waits for that commit only where it must read SQL; its own commit starts once
    /// that one is known to have landed, so commits stay in order. If the batch in flight
    /// fails, this one (built on it) is undone with it and runs again.
    async fn pipelined(
        &mut self,
        jobs: Vec<WriteJob>,
        compacted: i64,
        backlog: &mut VecDeque<WriteJob>,
    ) -> std::result::Result<(), AcksClosed> {
        let memory = &mut self.memory;
        let own = Revisions {
            current: memory.index.revision(),
            compact: self.compact,
            ..Revisions::default()
        };
        // A flight is sent only while trusted, and a failed one leaves no flight.
        let begin = if self.trusted {
            Begin::Known(own)
        } else {
            Begin::Read
        };
        let seen = (memory.index.reloads(), memory.index.catch_ups());
        let served = memory.index.revision().max(memory.applied.revision());
        let ran = run_batch(
            self.backend.as_ref(),
            memory,
            (begin, served),
            compacted,
            &jobs,
        )
        .await;
        if let Some(flight) = self.flight.as_mut() {
            let landed = (&mut flight.done).await.unwrap_or(Err(Error::ShuttingDown));
            let failed = landed.is_err();
            self.land(landed).await?;
            if failed {
                // Its index changes went with the flight's; the transaction rolls back.
                drop(ran);
                for job in jobs.into_iter().rev() {
                    backlog.push_front(job);
                }
                return Ok(());
            }
        }
        let ran = match ran {
            Ok(mut ran) => match ran.tx.take_turn().await {
                Ok(()) => Ok(ran),
                Err(e) => {
                    self.memory.index.rollback(ran.mark);
                    Err(e.into())
                }
            },
            Err(e) => Err(e),
        };
        self.forget_values_after(seen);
        let ran = match too_long(self.backend.as_ref(), ran) {
            Ok(ran) => ran,
            Err(e) => {
                self.trusted = false;
                self.landed_through(i64::MAX);
                let outcomes: Vec<Outcome> = jobs.into_iter().map(Outcome::failed).collect();
                return self.send(outcomes.len(), Err(e), outcomes).await;
            }
        };
        let Ran {
            tx,
            committed,
            answers,
            mark,
        } = ran;
        // Trusted as the flight commits; if it fails, no longer.
        self.trusted = true;
        let index = &mut self.memory.index;
        index.advance(committed.current);
        // The next batch may want the values this one wrote; if the commit fails, they go.
        self.memory.values.record(&committed.rows);
        let compact = self.compact;
        self.compact = committed.compact.unwrap_or(compact);
        let (sender, done) = oneshot::channel();
        tokio::spawn(async move {
            let _ = sender.send(tx.commit().await.map_err(Error::from));
        });
        self.flight = Some(Flight {
            done,
            received: jobs.len(),
            committed,
            outcomes: jobs.into_iter().zip(answers).map(Outcome::new).collect(),
            before: mark,
            after: index.mark(),
            compact,
        });
        Ok(())
    }

    /// Takes the flight's result: settles its changes and hands it to the acknowledger, or
    /// undoes them (and those of any batch run on them) and fails its requests.
    async fn land(&mut self, landed: Result<()>) -> std::result::Result<(), AcksClosed> {
        let Some(flight) = self.flight.take() else {
            return Ok(());
        };
        let Flight {
            received,
            committed,
            outcomes,
            before,
            after,
            compact,
            ..
        } = flight;
        let memory = &mut self.memory;
        let result = match landed {
            Ok(()) => {
                memory.index.settle(after);
                memory.landed.fetch_max(committed.current, Ordering::SeqCst);
                Ok(committed)
            }
            Err(e) => {
                // The database may not hold what the index and the cached values say: a lost
                // connection may even have committed. Both are read afresh.
                memory.index.rollback(before);
                memory.index.invalidate();
                memory.values.clear();
                self.compact = compact;
                self.trusted = false;
                Err(e)
            }
        };
        let through = result.as_ref().map_or(i64::MAX, |c| c.current);
        self.landed_through(through);
        self.send(received, result, outcomes).await
    }

    /// After a reload the database may not be the one the cached rows came from. Rows taken in
    /// from elsewhere leave entries behind that are no longer their keys' newest: the writer's
    /// lookups name revisions and miss them, but readers (sole writer only) would not.
    fn forget_values_after(&mut self, (reloads, catch_ups): (u64, u64)) {
        let index = &self.memory.index;
        let sole_writer = self.backend.sole_writer();
        if index.reloads() != reloads || (sole_writer && index.catch_ups() != catch_ups) {
            self.memory.values.clear();
        }
    }

    /// The batch the watch hub may wait for ([`super::Store::landing`]) has landed or failed,
    /// if it moves the database to `through` or below.
    fn landed_through(&self, through: i64) {
        self.memory.landing.send_if_modified(|landing| {
            let done = *landing != 0 && *landing <= through;
            if done {
                *landing = 0;
            }
            done
        });
    }

    async fn send(
        &self,
        received: usize,
        result: BatchResult,
        outcomes: Vec<Outcome>,
    ) -> std::result::Result<(), AcksClosed> {
        let committing = Committing {
            received,
            result,
            outcomes,
        };
        self.acks.send(committing).await.map_err(|_| AcksClosed)
    }
}

/// A refusal of a key longer than the database takes, as the request's own error.
fn too_long<T>(backend: &dyn Backend, result: Result<T>) -> Result<T> {
    match (result, backend.checked_key_bytes()) {
        (Err(Error::Backend(e)), Some(max)) if e.is_key_too_large() => {
            Err(Error::KeyTooLong { max })
        }
        (result, _) => result,
    }
}

/// How many revisions other processes may commit before an idle writer takes them into its key
/// index (see [`catch_up_idle`]).
const IDLE_CATCH_UP: i64 = 256;

/// Takes what other processes committed since the key index's revision into the index, outside
/// the writers' lock, while this writer has nothing to do. Its next batch would do the same under
/// the lock, holding every instance's writes up meanwhile: after a while with no writes here and
/// many elsewhere, a batch would read tens of thousands of rows first (seconds, measured with
/// three instances). What is left for the batch is what was committed since.
async fn catch_up_idle(backend: &dyn Backend, index: &mut KeyIndex) -> Result<()> {
    let mut tx = backend.read().await?;
    let now = tx.revisions().await?;
    let known = index.revision();
    // A reload (behind a compaction, or a database that went backwards) stays the batch's: it
    // decides under the lock.
    if index.needs_reload() || now.current <= known || now.compact > known {
        return Ok(());
    }
    let rows = tx.change_keys(known, now.current).await?;
    index.catch_up(&rows, now.current);
    Ok(())
}

/// What the writer keeps in memory beside the database.
pub(super) struct WriterMemory {
    pub(super) index: KeyIndex,
    pub(super) values: ValueCache,
    /// The store's applied index, whose revision readers and watchers may have been shown.
    pub(super) applied: Applied,
    /// The newest revision the writer has committed, set as soon as the database says so.
    pub(super) landed: Arc<AtomicI64>,
    /// See [`super::Store::landing`].
    pub(super) landing: watch::Sender<i64>,
    /// Where the writer counts its presumed batches.
    pub(super) stats: Arc<WriteCounters>,
}

impl WriteJob {
    /// The longest key the job puts (0 for what puts none).
    fn longest_put_key(&self) -> usize {
        match self {
            WriteJob::Txn { req, .. } => req.longest_put_key(),
            WriteJob::Compact { .. } | WriteJob::Lease { .. } => 0,
        }
    }
}
