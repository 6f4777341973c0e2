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
//! Before it takes the jobs, the writer lets the requests that are ready to run join them
//! ([`gather`]). Tokio runs a task woken by another next on the same thread (its "LIFO slot"),
//! so the first request to arrive can wake the writer ahead of the requests decoded in the same
//! pass; with 64 clients a batch held about 13 writes. The writer first yields for a few passes
//! of the runtime, so that those queue up too: batches of about 18 on SQLite (30 on
//! PostgreSQL), and 5 to 6% less server CPU per write (7 to 11% on PostgreSQL, its backend
//! included; BENCHMARKS.md). It does so only when writes come concurrently (this batch or the
//! last held more than one): a lone client's write would wait for nobody.
//!
//! A batch that takes the cluster-wide writers' lock as it begins (a shared database, when it
//! cannot presume the revisions: see below) may wait there while other processes write, longer
//! than it takes to run. The requests that queue up meanwhile join it once it holds the lock
//! ([`take_waiting`]), so that each turn of the lock writes what waited for it, rather than what
//! had arrived before the wait (three instances on PostgreSQL: batches twice as large, and 1.5
//! times the writes per second).
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
//!   and index changes are dropped. Only a txn that reads with a Range at an older revision
//!   after writing must put its own rows into the database first, and it does so under a
//!   savepoint.
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

use super::index::KeyIndex;
use super::txn::{Batch, TxnExec};
use super::types::{LeaseOp, LeaseOutcome, Revisioned, TxnRequest, TxnResponse};
use super::{Applied, Error, Published, Result, WriteCounters};
use crate::backend::{Backend, LogRow, Opening, Revisions};
use gather::{TakeWaiting, gather, take_waiting};

mod gather;

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
        mut index,
        applied,
        landed,
        landing,
        stats,
    } = memory;
    let sole_writer = backend.sole_writer();
    // Whether the index is known to match the database: then a sole writer need not read the
    // revisions at the start of a batch. A failed batch may have committed after all (a lost
    // connection while committing), so the next one asks the database.
    let mut trusted = true;
    // Whether the last batch found no commit of other processes (see `Begin::Presumed`).
    let mut unshared = false;
    let mut compact = start.compact;
    let checked = backend.checked_key_bytes();
    let mut incoming = Vec::with_capacity(MAX_BATCH);
    let mut backlog = VecDeque::with_capacity(MAX_BATCH);
    // Other processes' commits, as the applied index takes them in.
    let mut others = applied.subscribe();
    // Requests in the last batch: more than one says that clients write concurrently.
    let mut last_batch = 0;
    loop {
        if backlog.is_empty() {
            let received = tokio::select! {
                biased;
                n = queue.recv_many(&mut incoming, MAX_BATCH) => n,
                () = shutdown.cancelled() => 0,
                Ok(()) = others.changed(), if !sole_writer => {
                    if applied.revision() - index.revision() >= IDLE_CATCH_UP
                        && let Err(e) = catch_up_idle(backend.as_ref(), &mut index).await
                    {
                        // The next batch catches up under the lock instead.
                        tracing::debug!(error = %e, "the idle writer's catch-up failed");
                    }
                    continue;
                }
            };
            if received == 0 {
                break;
            }
            backlog.extend(incoming.drain(..));
            // A lone client's write has no company to wait for: it would only pay for the
            // passes (0.19 ms per write at the median, measured with one client).
            if backlog.len() > 1 || last_batch > 1 {
                gather(&mut queue, &mut backlog).await;
            }
        }
        // A txn with a key the database may refuse runs alone: a refusal fails it only.
        let alone = |job: &WriteJob| checked.is_some_and(|limit| job.longest_put_key() > limit);
        let received = match backlog.iter().position(alone) {
            Some(0) => 1,
            Some(first) => first,
            None => backlog.len(),
        };
        let compacted = *compacted.borrow();
        let own = Revisions {
            current: index.revision(),
            compact,
            ..Revisions::default()
        };
        let begin = if sole_writer && trusted {
            Begin::Known(own)
        } else if unshared && applied.revision() <= index.revision() {
            Begin::Presumed(own)
        } else {
            Begin::Read
        };
        let seen = (index.reloads(), index.catch_ups());
        let served = index.revision().max(applied.revision());
        let mut jobs: Vec<WriteJob> = backlog.drain(..received).collect();
        // Requests behind one that must run alone stay behind it, and one that runs alone
        // runs alone.
        let mut waiting = |jobs: &mut Vec<WriteJob>| {
            if backlog.is_empty() && !jobs.iter().any(alone) {
                take_waiting(&mut queue, jobs, &mut backlog, alone);
            }
        };
        let memory = (&mut index, &applied, &landing);
        let batch = (&mut jobs, &mut waiting as TakeWaiting<'_>);
        let mut result =
            apply_batch(backend.as_ref(), memory, (begin, served), compacted, batch).await;
        let moved = |e: &Error| matches!(e, Error::Backend(e) if e.is_moved());
        if matches!(begin, Begin::Presumed(_)) && result.as_ref().is_err_and(moved) {
            // Nothing was written; the batch runs again, after what the others committed.
            tracing::debug!(
                "another process committed before the presumed batch; running it again"
            );
            stats.reruns.fetch_add(1, Ordering::Relaxed);
            let memory = (&mut index, &applied, &landing);
            let again = (Begin::Read, served);
            let batch = (&mut jobs, &mut waiting as TakeWaiting<'_>);
            result = apply_batch(backend.as_ref(), memory, again, compacted, batch).await;
        } else if matches!((begin, &result), (Begin::Presumed(_), Ok(_))) {
            stats.presumed.fetch_add(1, Ordering::Relaxed);
        }
        let received = jobs.len();
        last_batch = received;
        let result = match (result, checked) {
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
        trusted = result.is_ok();
        // This process looks like the database's only writer while its batches find nothing
        // committed by others: the next batch presumes so.
        unshared = trusted && (index.reloads(), index.catch_ups()) == seen;
        if let Ok(committed) = &result {
            landed.fetch_max(committed.current, Ordering::SeqCst);
            compact = committed.compact.unwrap_or(compact);
        }
        // After `landed`, which tells the watch hub whether the batch it waited for landed.
        landing.send_if_modified(|landing| std::mem::take(landing) != 0);
        let committing = Committing {
            received,
            result,
            outcomes,
        };
        if acks.send(committing).await.is_err() {
            break;
        }
    }
    // Requests still queued at shutdown were never acknowledged: dropping them tells callers.
    queue.close();
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
    /// The store's applied index, whose revision readers and watchers may have been shown.
    pub(super) applied: Applied,
    /// The newest revision the writer has committed, set as soon as the database says so.
    pub(super) landed: Arc<AtomicI64>,
    /// See [`super::Store::landing`].
    pub(super) landing: watch::Sender<i64>,
    /// Where the writer counts its presumed batches.
    pub(super) stats: Arc<WriteCounters>,
}

/// A batch the writer has run, on its way to its replies.
pub(super) struct Committing {
    /// Requests the batch held.
    received: usize,
    result: BatchResult,
    outcomes: Vec<Outcome>,
}

/// Answers the writer's batches in order, each once it is durable: one
/// [`Backend::sync`] covers every batch committed before it, so batches that queued up
/// while the last one was syncing share the next.
pub(super) async fn run_acknowledger(
    backend: Arc<dyn Backend>,
    mut batches: mpsc::Receiver<Committing>,
    signals: WriterSignals,
    stats: Arc<WriteCounters>,
) {
    let WriterSignals {
        compact_target,
        committed,
        published,
    } = signals;
    let mut ready = Vec::new();
    while batches.recv_many(&mut ready, MAX_BATCH).await > 0 {
        if ready.iter().any(|batch| batch.result.is_ok())
            && let Err(e) = backend.sync().await
        {
            // As etcd and PostgreSQL do: after a failed fsync nothing tells which writes
            // reached the disk, so no answer can be trusted; the restart recovers what did.
            tracing::error!(error = %e, "making commits durable failed; stopping");
            std::process::abort();
        }
        for batch in ready.drain(..) {
            let Committing {
                received,
                mut result,
                outcomes,
            } = batch;
            if let Ok(outcome) = &mut result {
                // Everything a reply promises is published before the replies go out: the
                // revisions for snapshot-free reads, the commit for the watch hub.
                if let Some(compact) = outcome.compact {
                    published.compact.store(compact, Ordering::SeqCst);
                }
                published.current.store(outcome.current, Ordering::SeqCst);
                // Observers before the watch hub, which may look up this commit's time.
                if let Some(observe) = stats.observer.get() {
                    observe(received, outcome.current);
                }
                if let Some(sink) = stats.changes.get() {
                    if let Some(others) = outcome.others.take() {
                        sink(others.after, others.through, others.changes);
                    }
                    if outcome.current > outcome.before {
                        sink(
                            outcome.before,
                            outcome.current,
                            std::mem::take(&mut outcome.rows),
                        );
                    }
                }
                committed.send_if_modified(|current| {
                    let moved = outcome.current > *current;
                    *current = (*current).max(outcome.current);
                    moved
                });
            }
            if let Err(e) = &result {
                tracing::warn!(error = %e, requests = outcomes.len(), "write batch failed");
            }
            for outcome in outcomes {
                outcome.send(&result);
            }
            if let Ok(outcome) = result {
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.requests.fetch_add(received as u64, Ordering::Relaxed);
                if let Some(compact) = outcome.compact {
                    compact_target.send_replace(compact);
                }
            }
        }
    }
}

/// What one job of a batch will be answered, once the batch has committed.
enum Outcome {
    Txn(
        oneshot::Sender<Result<Revisioned<TxnResponse>>>,
        Result<Revisioned<TxnResponse>>,
    ),
    Compact(oneshot::Sender<Result<i64>>, Result<i64>),
    Lease(
        oneshot::Sender<Result<Revisioned<LeaseOutcome>>>,
        Result<Revisioned<LeaseOutcome>>,
    ),
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

impl Outcome {
    /// A job with its answer.
    fn new((job, answer): (WriteJob, Answer)) -> Self {
        match (job, answer) {
            (WriteJob::Txn { reply, .. }, Answer::Txn(answer)) => Outcome::Txn(reply, answer),
            (WriteJob::Compact { reply, .. }, Answer::Compact(answer)) => {
                Outcome::Compact(reply, answer)
            }
            (WriteJob::Lease { reply, .. }, Answer::Lease(answer)) => Outcome::Lease(reply, answer),
            // Each job is answered in its own kind; this cannot happen.
            (job, _) => Outcome::failed(job),
        }
    }

    /// An outcome for a job whose batch failed; replaced by the batch's error when sent.
    fn failed(job: WriteJob) -> Self {
        match job {
            WriteJob::Txn { reply, .. } => Outcome::Txn(reply, Err(Error::ShuttingDown)),
            WriteJob::Compact { reply, .. } => Outcome::Compact(reply, Err(Error::ShuttingDown)),
            WriteJob::Lease { reply, .. } => Outcome::Lease(reply, Err(Error::ShuttingDown)),
        }
    }

    /// Sends the job's own answer if its batch committed, else the batch's failure.
    fn send(self, batch: &BatchResult) {
        fn answer<T>(reply: oneshot::Sender<Result<T>>, answer: Result<T>, batch: &BatchResult) {
            let answer = match batch {
                Ok(_) => answer,
                Err(e) => Err(e.clone()),
            };
            // A caller that gave up waiting is no reason to stop answering the others.
            let _ = reply.send(answer);
        }
        match self {
            Outcome::Txn(reply, a) => answer(reply, a, batch),
            Outcome::Compact(reply, a) => answer(reply, a, batch),
            Outcome::Lease(reply, a) => answer(reply, a, batch),
        }
    }
}

/// What a committed batch changed, or why the batch did not commit.
type BatchResult = std::result::Result<Committed, Error>;

#[derive(Debug)]
struct Committed {
    /// The current revision before the batch.
    before: i64,
    /// The current revision after the batch.
    current: i64,
    /// The new compact revision, if the batch moved it.
    compact: Option<i64>,
    /// The rows of the revisions `(before, current]`, in order.
    rows: Vec<LogRow>,
    /// What other processes committed before the batch, as its transaction read it when it
    /// began ([`Backend::write_from`]): handed to the watch hub ahead of the batch's own rows,
    /// which the hub can then take in at once instead of reading all of them from the log.
    others: Option<Opening>,
}

/// How a batch's transaction learns the database's revisions.
#[derive(Clone, Copy, Debug)]
enum Begin {
    /// They are known: this process is the only writer, and its last batch committed.
    Known(Revisions),
    /// They are presumed: this process looked like the only writer in its last batch. The
    /// backend checks as the batch writes, and fails it with `Moved` if another process
    /// committed meanwhile ([`Backend::write_presuming`]); the batch then runs again.
    Presumed(Revisions),
    /// They are read as the transaction begins.
    Read,
}

/// What one job of a batch answers, if the batch commits.
enum Answer {
    Txn(Result<Revisioned<TxnResponse>>),
    Compact(Result<i64>),
    Lease(Result<Revisioned<LeaseOutcome>>),
}

/// Applies the jobs in one transaction and commits it; on success, each job's answer in order.
/// The key index follows the database: after `Ok` it holds the batch's changes, after `Err`
/// none of them. The batch writes nothing if the database is below `served`, the highest
/// revision this process has committed or shown ([`super::fence`]). `landing` is told the
/// revision the batch moves to before it writes its last rows.
async fn apply_batch(
    backend: &dyn Backend,
    (index, applied, landing): (&mut KeyIndex, &Applied, &watch::Sender<i64>),
    (begin, served): (Begin, i64),
    compacted: i64,
    (jobs, waiting): (&mut Vec<WriteJob>, TakeWaiting<'_>),
) -> std::result::Result<(Committed, Vec<Answer>), Error> {
    // A backend that cannot presume reads the revisions instead.
    let presumed = match begin {
        Begin::Presumed(presumed) => backend
            .write_presuming(presumed.current)
            .await?
            .map(|tx| (tx, presumed)),
        Begin::Known(_) | Begin::Read => None,
    };
    let (tx, opening, known) = match (begin, presumed) {
        (_, Some((tx, presumed))) => (tx, None, Some(presumed)),
        (Begin::Known(known), None) => (backend.write().await?, None, Some(known)),
        (Begin::Presumed(_) | Begin::Read, None) => {
            let (tx, opening) = backend.write_from(index.revision()).await?;
            waiting(jobs);
            (tx, opening, None)
        }
    };
    let jobs: &[WriteJob] = jobs;
    let mut batch = Batch::new(tx, index, applied);
    // Where the batch's own changes to the index begin (after bringing it up to date).
    let mut batch_mark = None;
    let mut others = None;
    let mut answers = Vec::with_capacity(jobs.len());
    let step: BatchResult = async {
        let start = match (known, &opening) {
            (Some(known), _) => known,
            (None, Some(opening)) => opening.revisions,
            (None, None) => batch.tx.revisions().await?,
        };
        if start.current < served {
            return Err(Error::Rewound {
                database: start.current,
                served,
            });
        }
        others = batch.sync_index(start, compacted, opening).await?;
        batch_mark = Some(batch.index.mark());
        let txns = jobs.iter().filter_map(|job| match job {
            WriteJob::Txn { req, .. } => Some(req),
            WriteJob::Compact { .. } | WriteJob::Lease { .. } => None,
        });
        batch.prefetch(txns).await?;
        let (mut current, mut compact) = (start.current, start.compact);
        let mut compact_moved = None;
        for job in jobs {
            let answer = match job {
                WriteJob::Txn { req, .. } => {
                    batch.begin_request();
                    let mut exec = TxnExec::new(&mut batch, current, compact);
                    let answer = exec.run(req).await;
                    let wrote = exec.wrote();
                    Answer::Txn(match answer {
                        Ok(value) => {
                            batch.end_request(false).await?;
                            if wrote {
                                current += 1;
                            }
                            Ok(Revisioned {
                                revision: current,
                                value,
                            })
                        }
                        Err(e) if e.fails_batch() => return Err(e),
                        Err(e) => {
                            batch.end_request(true).await?;
                            Err(e)
                        }
                    })
                }
                WriteJob::Lease { op, .. } => {
                    batch.begin_request();
                    let before = current;
                    Answer::Lease(
                        match apply_lease(&mut batch, op, &mut current, compact).await {
                            Ok(value) => {
                                batch.end_request(false).await?;
                                Ok(Revisioned {
                                    revision: current,
                                    value,
                                })
                            }
                            Err(e) if e.fails_batch() => return Err(e),
                            Err(e) => {
                                batch.end_request(true).await?;
                                current = before;
                                Err(e)
                            }
                        },
                    )
                }
                WriteJob::Compact { revision, .. } => Answer::Compact(if *revision <= compact {
                    Err(Error::Compacted)
                } else if *revision > current {
                    Err(Error::FutureRevision)
                } else {
                    batch.tx.set_compact_revision(*revision).await?;
                    compact = *revision;
                    compact_moved = Some(*revision);
                    Ok(current)
                }),
            };
            answers.push(answer);
        }
        if current != start.current {
            landing.send_replace(current);
        }
        batch
            .finish((current != start.current).then_some((start.current, current)))
            .await?;
        Ok(Committed {
            before: start.current,
            current,
            compact: compact_moved,
            rows: Vec::new(),
            others: None,
        })
    }
    .await;
    let (tx, rows) = batch.into_parts();
    let step = step.map(|committed| Committed {
        rows,
        others,
        ..committed
    });
    let committed = match step {
        Ok(committed) => tx.commit().await.map(|()| committed).map_err(Error::from),
        Err(e) => Err(e),
    };
    match &committed {
        Ok(committed) => index.commit(committed.current),
        // Had the commit gone through after all (a connection lost while committing), the next
        // batch finds the database ahead of the index and catches up.
        Err(_) => {
            if let Some(mark) = batch_mark {
                index.rollback(mark);
            }
        }
    }
    committed.map(|committed| (committed, answers))
}

/// Applies one lease change inside the writer's transaction; moves `current` past every
/// revision it wrote (an expiry pass may write several). Every error other than the backend's
/// is found before anything is written.
async fn apply_lease(
    batch: &mut Batch<'_>,
    op: &LeaseOp,
    current: &mut i64,
    compact: i64,
) -> Result<LeaseOutcome> {
    match op {
        LeaseOp::Grant(lease) => {
            if batch.tx.insert_lease(lease).await? {
                batch.lease_changed(lease.id, true);
                Ok(LeaseOutcome::Granted)
            } else {
                Err(Error::LeaseExists)
            }
        }
        LeaseOp::KeepAlive { id, now } => match batch.tx.lease(*id).await? {
            Some(lease) if lease.expires_at > *now => {
                batch
                    .tx
                    .set_lease_expiry(*id, now + lease.ttl * 1000)
                    .await?;
                Ok(LeaseOutcome::KeptAlive(Some(lease.ttl)))
            }
            // Unknown, or run out and about to be revoked: too late to keep alive.
            _ => Ok(LeaseOutcome::KeptAlive(None)),
        },
        LeaseOp::Revoke(id) => {
            revoke(batch, *id, current, compact).await?;
            Ok(LeaseOutcome::Revoked)
        }
        LeaseOp::Expire { now, limit } => {
            let due = batch.tx.expired_leases(*now, *limit).await?;
            let mut revoked = 0;
            for lease in &due {
                match revoke(batch, lease.id, current, compact).await {
                    Ok(()) => revoked += 1,
                    // Gone already (it was just listed, so this cannot happen): nothing to do,
                    // and no reason to undo the revocations before it.
                    Err(Error::LeaseNotFound) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(LeaseOutcome::Expired(revoked))
        }
    }
}

/// Revokes one lease in its own revision (none if it had no keys).
async fn revoke(batch: &mut Batch<'_>, id: i64, current: &mut i64, compact: i64) -> Result<()> {
    let mut exec = TxnExec::new(batch, *current, compact);
    exec.revoke(id).await?;
    if exec.wrote() {
        *current += 1;
    }
    Ok(())
}
