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
//! the revision as well.
//!
//! # Pipelined batches
//! A presumed batch that writes is committed by its one statement. The writer sends it, and
//! runs the next batch on the key index as that statement will leave it while the database
//! works: a [`Flight`]. The next batch presumes the database is where the one in flight leaves
//! it, and its own statement checks that the current revision carries that batch's name
//! besides ([`crate::backend::Presumption`]): it waits for the writers' lock behind the batch in
//! flight, and writes only if that batch committed. Whatever else of it needs the database
//! waits for that batch's answer. Batches are still answered in order: the writer settles the
//! one in flight (keeps its changes to the index, or undoes them) before the next. If the one
//! in flight failed, the changes of the batch built on it are undone with its own, and that
//! batch runs again from the start once its statement has written nothing; had it written
//! after all, the one before committed too, despite its answer: both are then answered with
//! that failure, and the next batch reads what they wrote from the database, as after any
//! commit whose answer was lost. The value cache takes in a batch's rows as it goes out, and is
//! emptied if it fails.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use tokio::task::JoinHandle;

use super::index::{KeyIndex, Mark};
use super::txn::finish;
use super::types::{LeaseOp, LeaseOutcome, Revisioned, TxnRequest, TxnResponse};
use super::values::ValueCache;
use super::{Applied, Error, Published, Result, WriteCounters};
use crate::backend::{Backend, InFlight, LogRow, Revisions, WriteTxn};

mod ack;
mod batch;

use ack::Outcome;
pub(super) use ack::{Committing, run_acknowledger};
use batch::{Answer, Begin, Committed, Ran};

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
    let WriterMemory {
        index,
        values,
        applied,
        landed,
        landing,
        stats,
    } = memory;
    // Other processes' commits, as the applied index takes them in.
    let mut others = applied.subscribe();
    let mut w = Writer {
        sole_writer: backend.sole_writer(),
        checked: backend.checked_key_bytes(),
        backend,
        index,
        values,
        applied,
        landed,
        landing,
        stats,
        acks,
        trusted: true,
        unshared: false,
        compact: start.compact,
        next_name: rand::random(),
        stopped: false,
    };
    let mut incoming = Vec::with_capacity(MAX_BATCH);
    let mut backlog = VecDeque::with_capacity(MAX_BATCH);
    let mut flight: Option<Flight> = None;
    while !w.stopped {
        if backlog.is_empty() {
            let wake = tokio::select! {
                biased;
                landed = landing_of(&mut flight) => Wake::Landed(landed),
                n = queue.recv_many(&mut incoming, MAX_BATCH) => Wake::Jobs(n),
                () = shutdown.cancelled() => Wake::Jobs(0),
                Ok(()) = others.changed(), if !w.sole_writer && flight.is_none() => Wake::Others,
            };
            match wake {
                Wake::Jobs(0) => break,
                Wake::Jobs(_) => backlog.extend(incoming.drain(..)),
                Wake::Landed(landed) => {
                    if let Some(done) = flight.take() {
                        let compacted = *compacted.borrow();
                        // A failure was answered inside; nothing was built on it.
                        let _ = w.settle(done, landed, None, compacted).await;
                    }
                    continue;
                }
                Wake::Others => {
                    if w.applied.revision() - w.index.revision() >= IDLE_CATCH_UP
                        && let Err(e) = catch_up_idle(w.backend.as_ref(), &mut w.index).await
                    {
                        // The next batch catches up under the lock instead.
                        tracing::debug!(error = %e, "the idle writer's catch-up failed");
                    }
                    continue;
                }
            }
        }
        // A txn with a key the database may refuse runs alone: a refusal fails it only.
        let alone = |job: &WriteJob| w.checked.is_some_and(|limit| job.longest_put_key() > limit);
        let received = match backlog.iter().position(alone) {
            Some(0) => 1,
            Some(first) => first,
            None => backlog.len(),
        };
        let compacted = *compacted.borrow();
        // Another process's commit, seen while a batch is in flight: that batch lands first,
        // and the next reads where the database is.
        if w.applied.revision() > w.index.revision()
            && let Some(mut done) = flight.take()
        {
            let landed = done.landed().await;
            let _ = w.settle(done, landed, None, compacted).await;
        }
        let begin = match &flight {
            Some(prev) => Begin::Presumed(Revisions {
                current: prev.committed.current,
                compact: w.compact,
                ..Revisions::default()
            }),
            None => w.begin(),
        };
        let jobs = Jobs {
            jobs: backlog.drain(..received).collect(),
            received,
            seen: w.epoch(),
        };
        let served = w.index.revision().max(w.applied.revision());
        let after = flight.as_ref().map(Flight::follower);
        let ran = w.run(begin, after, served, compacted, &jobs.jobs).await;
        match (ran, flight.take()) {
            (Ok(next), prev) if next.can_fly() => {
                let mut next = w.launch(next, jobs);
                // Lets the task send the batch before anything else of the writer's: a new task
                // waits behind the one that spawned it, and the batch after this one would
                // otherwise reach the database first and find it not where it presumed.
                tokio::task::yield_now().await;
                if let Some(mut prev) = prev {
                    let landed = prev.landed().await;
                    let settled = w
                        .settle(prev, landed, Some(&mut next.mark), compacted)
                        .await;
                    if let Err(failed) = settled {
                        w.strand(next, failed, compacted).await;
                        continue;
                    }
                }
                flight = Some(next);
            }
            (mut ran, prev) => {
                if let Some(mut prev) = prev {
                    let landed = prev.landed().await;
                    let later = ran.as_mut().ok().map(|ran| &mut ran.mark);
                    if w.settle(prev, landed, later, compacted).await.is_err() {
                        // The batch rests on one that failed, and has sent nothing that writes
                        // yet: it runs again from the start.
                        ran = Err(Error::from(crate::backend::Error::Moved {
                            presumed: served,
                        }));
                    }
                }
                let presumed = matches!(begin, Begin::Presumed(_));
                let result = w
                    .conclude(ran, presumed, served, compacted, &jobs.jobs)
                    .await;
                w.complete(jobs, result, Landing::Inline).await;
            }
        }
    }
    // The batch in flight is answered before the writer stops.
    if let Some(mut done) = flight.take() {
        let landed = done.landed().await;
        let compacted = *compacted.borrow();
        let _ = w.settle(done, landed, None, compacted).await;
    }
    // Requests still queued at shutdown were never acknowledged: dropping them tells callers.
    queue.close();
}

/// Why the waiting writer woke up.
enum Wake {
    /// Requests arrived (0: the writer stops).
    Jobs(usize),
    /// The batch in flight landed.
    Landed(Landed),
    /// The applied index took in other processes' commits.
    Others,
}

/// What a flight's task answers: whether the batch committed, and its rows back.
type Landed = (Result<()>, Vec<LogRow>);

/// The answer of the batch in flight; without one, never.
async fn landing_of(flight: &mut Option<Flight>) -> Landed {
    match flight {
        Some(flight) => flight.landed().await,
        None => std::future::pending().await,
    }
}

/// A batch's requests.
struct Jobs {
    jobs: Vec<WriteJob>,
    /// How many requests the batch holds.
    received: usize,
    /// The index's reloads and catch-ups before the batch ran ([`Writer::epoch`]).
    seen: (u64, u64),
}

/// A presumed batch whose last statement, which commits it, is on its way to the database while
/// the writer runs the next batch (see "Pipelined batches").
struct Flight {
    jobs: Jobs,
    answers: Vec<Answer>,
    committed: Committed,
    /// Where the batch's changes to the key index begin.
    mark: Mark,
    /// The batch's name, and whether it committed once it knows: for a batch that follows it.
    name: i64,
    outcome: watch::Receiver<Option<bool>>,
    task: JoinHandle<Landed>,
}

impl Flight {
    async fn landed(&mut self) -> Landed {
        match (&mut self.task).await {
            Ok(landed) => landed,
            // Only a runtime that is going away cancels the task.
            Err(_) => (Err(Error::ShuttingDown), Vec::new()),
        }
    }

    /// What a batch that follows it presumes on.
    fn follower(&self) -> InFlight {
        InFlight {
            batch: self.name,
            outcome: self.outcome.clone(),
        }
    }
}

/// How a batch landed, which tells what its completion has left to do: take its rows into the
/// value cache (which took a flight's as it went out), and end what the watch hub waits for
/// ([`super::Store::landing`]), unless a batch built on it is still to land.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Landing {
    Inline,
    Flew,
    /// It flew, and a batch built on it is still to land.
    FlewUnder,
}

/// Writes a batch's last rows and commits it.
async fn commit_batch(
    mut tx: Box<dyn WriteTxn>,
    rows: Vec<LogRow>,
    flushed: usize,
    moved: Option<(i64, i64)>,
) -> Landed {
    let result = match finish(tx.as_mut(), &rows[flushed..], moved).await {
        Ok(()) => tx.commit().await.map_err(Error::from),
        Err(e) => Err(e),
    };
    (result, rows)
}

/// The writer's state from batch to batch.
struct Writer {
    backend: Arc<dyn Backend>,
    sole_writer: bool,
    /// See [`Backend::checked_key_bytes`].
    checked: Option<usize>,
    index: KeyIndex,
    values: ValueCache,
    applied: Applied,
    landed: Arc<AtomicI64>,
    landing: watch::Sender<i64>,
    stats: Arc<WriteCounters>,
    acks: mpsc::Sender<Committing>,
    /// Whether the index is known to match the database: then a sole writer need not read the
    /// revisions at the start of a batch. A failed batch may have committed after all (a lost
    /// connection while committing), so the next one asks the database.
    trusted: bool,
    /// Whether the last batch found no commit of other processes (see `Begin::Presumed`).
    unshared: bool,
    compact: i64,
    /// The name of the next presumed batch: random at start, so that no other writer's
    /// batches carry it, then counting up.
    next_name: i64,
    /// The acknowledger is gone: the process is stopping.
    stopped: bool,
}

impl Writer {
    /// How a batch with none in flight begins.
    fn begin(&self) -> Begin {
        let own = Revisions {
            current: self.index.revision(),
            compact: self.compact,
            ..Revisions::default()
        };
        if self.sole_writer && self.trusted {
            Begin::Known(own)
        } else if self.unshared && self.applied.revision() <= self.index.revision() {
            Begin::Presumed(own)
        } else {
            Begin::Read
        }
    }

    /// Counts that move when the key index takes in what this writer did not write.
    fn epoch(&self) -> (u64, u64) {
        (self.index.reloads(), self.index.catch_ups())
    }

    /// Lands a batch that ran, or reports why it did not run; one that presumed wrongly runs
    /// again from the start, reading the revisions first.
    async fn conclude(
        &mut self,
        ran: Result<Ran>,
        presumed: bool,
        served: i64,
        compacted: i64,
        jobs: &[WriteJob],
    ) -> Result<(Committed, Vec<Answer>)> {
        let result = match ran {
            Ok(ran) => self.land(ran).await,
            Err(e) => Err(e),
        };
        match result {
            Err(e) if presumed && is_moved(&e) => {
                // Nothing was written; the batch runs again, after what the others committed.
                tracing::debug!(
                    "another process committed before the presumed batch; running it again"
                );
                self.stats.reruns.fetch_add(1, Ordering::Relaxed);
                match self.run(Begin::Read, None, served, compacted, jobs).await {
                    Ok(ran) => self.land(ran).await,
                    Err(e) => Err(e),
                }
            }
            Ok(done) => {
                if presumed {
                    self.stats.presumed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(done)
            }
            Err(e) => Err(e),
        }
    }

    /// Commits a batch that ran, and keeps its changes to the key index, or undoes them.
    async fn land(&mut self, ran: Ran) -> Result<(Committed, Vec<Answer>)> {
        let Ran {
            tx,
            rows,
            flushed,
            moved,
            committed,
            answers,
            mark,
            ..
        } = ran;
        match commit_batch(tx, rows, flushed, moved).await {
            (Ok(()), rows) => {
                self.index.commit(committed.current);
                Ok((Committed { rows, ..committed }, answers))
            }
            // Had the commit gone through after all (a connection lost while committing), the
            // next batch finds the database ahead of the index and catches up.
            (Err(e), _) => {
                self.index.rollback(mark);
                Err(e)
            }
        }
    }

    /// Sends a batch that ran on its way: a task writes its last rows and commits it.
    fn launch(&mut self, ran: Ran, jobs: Jobs) -> Flight {
        let Ran {
            tx,
            rows,
            flushed,
            moved,
            committed,
            answers,
            mark,
            name,
            follows,
        } = ran;
        // The batches built on it look its values up before it lands; a failure empties the
        // cache.
        self.values.record(&rows);
        if follows {
            self.stats.pipelined.fetch_add(1, Ordering::Relaxed);
        }
        let (tell, outcome) = watch::channel(None);
        let task = tokio::spawn(async move {
            let landed = commit_batch(tx, rows, flushed, moved).await;
            // At once: the batch after it may be waiting for it inside its own transaction.
            tell.send_replace(Some(landed.0.is_ok()));
            landed
        });
        Flight {
            jobs,
            answers,
            committed,
            mark,
            name: name.unwrap_or_default(),
            outcome,
            task,
        }
    }

    /// Answers a batch in flight once it landed: keeps its changes to the key index (those of
    /// `later`, a batch built on it, stay undoable), or undoes them, and runs its jobs again if
    /// it found another process's commits. `Err`: it did not land (its jobs are answered all
    /// the same), so the batch built on it must not land either.
    async fn settle(
        &mut self,
        flight: Flight,
        (result, rows): Landed,
        later: Option<&mut Mark>,
        compacted: i64,
    ) -> std::result::Result<(), Error> {
        let Flight {
            jobs,
            answers,
            committed,
            mark,
            ..
        } = flight;
        let landing = match later {
            Some(_) => Landing::FlewUnder,
            None => Landing::Flew,
        };
        match result {
            Ok(()) => {
                match later {
                    Some(later) => *later = self.index.commit_before(*later, committed.current),
                    None => self.index.commit(committed.current),
                }
                self.stats.presumed.fetch_add(1, Ordering::Relaxed);
                let done = Ok((Committed { rows, ..committed }, answers));
                self.complete(jobs, done, landing).await;
                Ok(())
            }
            Err(e) => {
                // Undoes the changes of a batch built on it too.
                self.index.rollback(mark);
                self.values.clear();
                let served = self.index.revision().max(self.applied.revision());
                let again = self
                    .conclude(Err(e.clone()), true, served, compacted, &jobs.jobs)
                    .await;
                if let Ok((committed, _)) = &again {
                    self.values.record(&committed.rows);
                }
                self.complete(jobs, again, landing).await;
                Err(e)
            }
        }
    }

    /// Answers a batch in flight built on one that failed (`failed`); its changes to the key
    /// index are gone with that one's. Its statement writes nothing then, and it runs again. If
    /// it wrote all the same, the batch before it committed too: its jobs get that batch's
    /// answer, and the next batch reads what both wrote from the database.
    async fn strand(&mut self, mut flight: Flight, failed: Error, compacted: i64) {
        let (result, _) = flight.landed().await;
        let served = self.index.revision().max(self.applied.revision());
        let result = match result {
            Err(e) if is_moved(&e) => {
                self.conclude(Err(e), true, served, compacted, &flight.jobs.jobs)
                    .await
            }
            Ok(()) => Err(failed),
            Err(e) => Err(e),
        };
        self.complete(flight.jobs, result, Landing::Inline).await;
    }

    /// Hands a batch to the acknowledger, after the bookkeeping its outcome asks for.
    async fn complete(
        &mut self,
        jobs: Jobs,
        result: Result<(Committed, Vec<Answer>)>,
        landing: Landing,
    ) {
        let Jobs {
            jobs,
            received,
            seen,
        } = jobs;
        let result = match (result, self.checked) {
            (Err(Error::Backend(e)), Some(max)) if e.is_key_too_large() => {
                Err(Error::KeyTooLong { max })
            }
            (result, _) => result,
        };
        let (result, outcomes) = match result {
            Ok((committed, answers)) => {
                let outcomes = jobs.into_iter().zip(answers).map(Outcome::new).collect();
                (Ok(committed), outcomes)
            }
            Err(e) => (Err(e), jobs.into_iter().map(Outcome::failed).collect()),
        };
        self.trusted = result.is_ok();
        // This process looks like the database's only writer while its batches find nothing
        // committed by others: the next batch presumes so.
        self.unshared = self.trusted && self.epoch() == seen;
        // After a reload the database may not be the one the cached rows came from. Rows taken
        // in from elsewhere leave entries behind that are no longer their keys' newest: the
        // writer's lookups name revisions and miss them, but readers (sole writer only) would not.
        if self.index.reloads() != seen.0 || (self.sole_writer && self.index.catch_ups() != seen.1)
        {
            self.values.clear();
        }
        if let Ok(committed) = &result {
            self.landed.fetch_max(committed.current, Ordering::SeqCst);
            if landing == Landing::Inline {
                self.values.record(&committed.rows);
            }
            self.compact = committed.compact.unwrap_or(self.compact);
        }
        // After `landed`, which tells the watch hub whether the batch it waited for landed.
        if landing != Landing::FlewUnder {
            self.landing
                .send_if_modified(|landing| std::mem::take(landing) != 0);
        }
        let committing = Committing {
            received,
            result,
            outcomes,
        };
        if self.acks.send(committing).await.is_err() {
            self.stopped = true;
        }
    }
}

/// Whether a batch failed only because the database was not where it presumed.
fn is_moved(e: &Error) -> bool {
    matches!(e, Error::Backend(e) if e.is_moved())
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
