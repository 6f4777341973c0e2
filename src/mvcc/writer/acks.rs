//! The acknowledger: answers the writer's batches in order, each once it is durable, and
//! publishes what they committed (revisions, the watch hub's rows) before the answers go out.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};

use super::batch::{Answer, Committed};
use super::{MAX_BATCH, WriteJob, WriterSignals};
use crate::backend::Backend;
use crate::mvcc::types::{LeaseOutcome, Revisioned, TxnResponse};
use crate::mvcc::{Error, Result, WriteCounters};

/// A batch the writer has run, on its way to its replies.
pub(in crate::mvcc) struct Committing {
    /// Requests the batch held.
    pub(super) received: usize,
    pub(super) result: BatchResult,
    pub(super) outcomes: Vec<Outcome>,
}

/// Answers the writer's batches in order, each once it is durable: one
/// [`Backend::sync`] covers every batch committed before it, so batches that queued up
/// while the last one was syncing share the next.
pub(in crate::mvcc) async fn run_acknowledger(
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
pub(super) enum Outcome {
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

impl Outcome {
    /// A job with its answer.
    pub(super) fn new((job, answer): (WriteJob, Answer)) -> Self {
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
    pub(super) fn failed(job: WriteJob) -> Self {
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
pub(super) type BatchResult = std::result::Result<Committed, Error>;
