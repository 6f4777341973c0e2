//! One batch's run: its jobs applied to the key index and the write transaction, up to the
//! statement that ends it. The index then holds the batch's changes, to be kept or undone once
//! the batch lands; a run that fails leaves none of them.

use crate::backend::{InFlight, LogRow, Opening, Presumption, Revisions, WriteTxn};
use crate::mvcc::index::Mark;
use crate::mvcc::txn::{Batch, TxnExec};
use crate::mvcc::types::{LeaseOp, LeaseOutcome, Revisioned, TxnResponse};
use crate::mvcc::{Error, Result};

use super::{WriteJob, Writer};

/// What a committed batch changed, or why the batch did not commit.
pub(super) type BatchResult = std::result::Result<Committed, Error>;

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
    /// began ([`crate::backend::Backend::write_from`]): handed to the watch hub ahead of the batch's own rows,
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
    /// committed meanwhile ([`crate::backend::Backend::write_presuming`]); the batch then runs again.
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

/// A batch run against the key index, whose last statement and commit are still to go.
pub(super) struct Ran {
    pub(super) tx: Box<dyn WriteTxn>,
    /// Every row the batch wrote, in order.
    pub(super) rows: Vec<LogRow>,
    /// How many of `rows` are in the transaction already.
    pub(super) flushed: usize,
    /// The revisions the batch moves the current revision from and to, if it wrote.
    pub(super) moved: Option<(i64, i64)>,
    /// What the batch will have changed once it commits; its rows still in `rows`.
    pub(super) committed: Committed,
    pub(super) answers: Vec<Answer>,
    /// Where the batch's changes to the key index begin.
    pub(super) mark: Mark,
    /// The batch's name, if its transaction presumed ([`Presumption::batch`]).
    pub(super) name: Option<i64>,
    /// Whether it followed a batch in flight.
    pub(super) follows: bool,
}

impl Ran {
    /// Whether the batch can go out while the writer runs the next one: it presumed, so the
    /// statement that writes its rows checks where the database is by itself and commits it,
    /// and a batch after it can check for its name. One that moved the compact revision does
    /// not: the next batch's view of compaction would rest on it.
    pub(super) fn can_fly(&self) -> bool {
        self.name.is_some() && self.moved.is_some() && self.committed.compact.is_none()
    }
}

impl Writer {
    /// Runs the jobs in one transaction up to its last statement; each job's answer in order,
    /// given only if the batch commits. The batch writes nothing if the database is below
    /// `served`, the highest revision this process has committed or shown
    /// ([`crate::mvcc::fence`]). The watch hub's `landing` is told the revision the batch moves
    /// to. `after`: the batch in flight that this one follows, whose changes the key index
    /// holds already (not yet committed); this one presumes the database is where that one
    /// leaves it.
    pub(super) async fn run(
        &mut self,
        begin: Begin,
        after: Option<InFlight>,
        served: i64,
        compacted: i64,
        jobs: &[WriteJob],
    ) -> Result<Ran> {
        let follows = after.is_some();
        // A backend that cannot presume reads the revisions instead.
        let presumed = match begin {
            Begin::Presumed(presumed) => {
                let name = self.next_name;
                self.next_name = self.next_name.wrapping_add(1);
                let presumption = Presumption {
                    current: presumed.current,
                    batch: name,
                    after,
                };
                self.backend
                    .write_presuming(&presumption)
                    .await?
                    .map(|tx| (tx, presumed, name))
            }
            Begin::Known(_) | Begin::Read => None,
        };
        let index = &mut self.index;
        let (tx, opening, known, name) = match (begin, presumed) {
            (_, Some((tx, presumed, name))) => (tx, None, Some(presumed), Some(name)),
            (Begin::Known(known), None) => (self.backend.write().await?, None, Some(known), None),
            (Begin::Presumed(_) | Begin::Read, None) => {
                let (tx, opening) = self.backend.write_from(index.revision()).await?;
                (tx, opening, None, None)
            }
        };
        let landing = &self.landing;
        let mut batch = Batch::new(tx, index, &self.values);
        // Where the batch's own changes to the index begin (after bringing it up to date).
        let mut batch_mark = None;
        let mut others = None;
        let mut answers = Vec::with_capacity(jobs.len());
        let step = async {
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
            // A batch that follows one in flight finds the index where that one leaves it.
            if !follows {
                others = batch.sync_index(start, compacted, opening).await?;
            }
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
                    WriteJob::Compact { revision, .. } => {
                        Answer::Compact(if *revision <= compact {
                            Err(Error::Compacted)
                        } else if *revision > current {
                            Err(Error::FutureRevision)
                        } else {
                            batch.tx.set_compact_revision(*revision).await?;
                            compact = *revision;
                            compact_moved = Some(*revision);
                            Ok(current)
                        })
                    }
                };
                answers.push(answer);
            }
            let moved = (current != start.current).then_some((start.current, current));
            if moved.is_some() {
                landing.send_replace(current);
            }
            let committed = Committed {
                before: start.current,
                current,
                compact: compact_moved,
                rows: Vec::new(),
                others: None,
            };
            Ok((committed, moved, mark))
        }
        .await;
        let (tx, rows, flushed) = batch.into_parts();
        match step {
            Ok((committed, moved, mark)) => Ok(Ran {
                tx,
                rows,
                flushed,
                moved,
                committed: Committed {
                    others,
                    ..committed
                },
                answers,
                mark,
                name,
                follows,
            }),
            Err(e) => {
                if let Some(mark) = batch_mark {
                    self.index.rollback(mark);
                }
                Err(e)
            }
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
