//! One batch of the writer: its requests run one after another in one database transaction,
//! on the key index and the values in memory; the batch's rows go to the database at its end.

use super::{WriteJob, WriterMemory};
use crate::backend::{Backend, LogRow, Opening, Revisions, WriteTxn};
use crate::mvcc::index::Mark;
use crate::mvcc::txn::{Batch, TxnExec};
use crate::mvcc::types::{LeaseOp, LeaseOutcome, Revisioned, TxnResponse};
use crate::mvcc::{Error, Result};

#[derive(Debug)]
pub(super) struct Committed {
    /// The current revision before the batch.
    pub(super) before: i64,
    /// The current revision after the batch.
    pub(super) current: i64,
    /// The new compact revision, if the batch moved it.
    pub(super) compact: Option<i64>,
    /// The rows of the revisions `(before, current]`, in order.
    pub(super) rows: Vec<LogRow>,
    /// What other processes committed before the batch, as its transaction read it when it
    /// began ([`Backend::write_from`]): handed to the watch hub ahead of the batch's own rows,
    /// which the hub can then take in at once instead of reading all of them from the log.
    pub(super) others: Option<Opening>,
}

/// How a batch's transaction learns the database's revisions.
#[derive(Clone, Copy, Debug)]
pub(super) enum Begin {
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
pub(super) enum Answer {
    Txn(Result<Revisioned<TxnResponse>>),
    Compact(Result<i64>),
    Lease(Result<Revisioned<LeaseOutcome>>),
}

/// Applies the jobs in one transaction and commits it; on success, each job's answer in order.
/// The key index follows the database: after `Ok` it holds the batch's changes, after `Err`
/// none of them.
pub(super) async fn apply_batch(
    backend: &dyn Backend,
    memory: &mut WriterMemory,
    begin: (Begin, i64),
    compacted: i64,
    jobs: &[WriteJob],
) -> std::result::Result<(Committed, Vec<Answer>), Error> {
    let Ran {
        tx,
        committed,
        answers,
        mark,
    } = run_batch(backend, memory, begin, compacted, jobs).await?;
    match tx.commit().await {
        Ok(()) => {
            memory.index.commit(committed.current);
            Ok((committed, answers))
        }
        // Had the commit gone through after all (a connection lost while committing), the next
        // batch finds the database ahead of the index and catches up.
        Err(e) => {
            memory.index.rollback(mark);
            Err(e.into())
        }
    }
}

/// A batch that ran its requests and wrote its rows, its transaction not yet committed.
pub(super) struct Ran {
    pub(super) tx: Box<dyn WriteTxn>,
    pub(super) committed: Committed,
    pub(super) answers: Vec<Answer>,
    /// The index before the batch's own changes.
    pub(super) mark: Mark,
}

/// Applies the jobs in one transaction, up to its commit. After `Ok` the key index holds the
/// batch's changes, after `Err` none of them. The batch writes nothing if the database is below
/// `served`, the highest revision this process has committed or shown ([`super::fence`]).
/// `landing` is told the revision the batch moves to before it writes its last rows.
pub(super) async fn run_batch(
    backend: &dyn Backend,
    memory: &mut WriterMemory,
    (begin, served): (Begin, i64),
    compacted: i64,
    jobs: &[WriteJob],
) -> std::result::Result<Ran, Error> {
    let WriterMemory {
        index,
        values,
        landing,
        ..
    } = memory;
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
            (tx, opening, None)
        }
    };
    let mut batch = Batch::new(tx, index, values);
    // Where the batch's own changes to the index begin (after bringing it up to date).
    let mut batch_mark = None;
    let mut others = None;
    let mut answers = Vec::with_capacity(jobs.len());
    let step: Result<(Committed, Mark)> = async {
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
        let mark = batch.index.mark();
        batch_mark = Some(mark);
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
        let committed = Committed {
            before: start.current,
            current,
            compact: compact_moved,
            rows: Vec::new(),
            others: None,
        };
        Ok((committed, mark))
    }
    .await;
    let (tx, rows) = batch.into_parts();
    match step {
        Ok((committed, mark)) => Ok(Ran {
            tx,
            committed: Committed {
                rows,
                others,
                ..committed
            },
            answers,
            mark,
        }),
        Err(e) => {
            if let Some(mark) = batch_mark {
                index.rollback(mark);
            }
            Err(e)
        }
    }
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
