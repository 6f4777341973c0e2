//! A watcher for the server's own waits (Lock and Election wait for keys to go): one key range,
//! from a revision on, as one ordered stream of events.
//!
//! It keeps the hub's seam rule (see [`crate::watch`]) exactly as a Watch stream does: it reads
//! the log from its next revision up to what the hub has delivered, then joins the hub; live
//! events below its next revision are dropped, so replay and live stream meet with no gap and
//! no duplicate. If its queue overflows it drains what was queued and catches up the same way.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Batch, Event, Hub, READ_CHUNK, Subscription};
use crate::mvcc::types::KeyRange;
use crate::mvcc::{self};

/// The only watcher of its subscription, so its id never matters.
const WATCH_ID: i64 = 0;

/// The changes to one key range from a start revision on.
pub struct RangeFollower {
    sub: Subscription,
    batches: mpsc::Receiver<Arc<Batch>>,
    range: KeyRange,
    /// Every change below this revision has been returned (or queued in `pending`).
    next_rev: i64,
    synced: bool,
    /// Events read but not returned yet, each with the revision its answer reports.
    pending: VecDeque<(Event, i64)>,
}

impl Hub {
    /// Follows `range` from revision `from` (inclusive) on.
    pub fn follow(&self, range: KeyRange, from: i64) -> RangeFollower {
        let (sub, batches) = self.subscribe();
        RangeFollower {
            sub,
            batches,
            range,
            next_rev: from.max(1),
            synced: false,
            pending: VecDeque::new(),
        }
    }
}

impl RangeFollower {
    /// The next change to the range, in revision order, with the revision a watch response
    /// carrying it reports (the last revision read with it).
    ///
    /// # Errors
    /// `Compacted` when the changes from the start revision are no longer in the log; the
    /// database cannot be read.
    pub async fn next(&mut self) -> mvcc::Result<(Event, i64)> {
        loop {
            if let Some(next) = self.pending.pop_front() {
                return Ok(next);
            }
            if self.sub.lagged() {
                while let Ok(batch) = self.batches.try_recv() {
                    self.take(&batch.events, batch.through);
                }
                self.synced = false;
                self.sub.clear_lag();
                continue;
            }
            if !self.synced {
                match self.sub.join(WATCH_ID, &self.range, self.next_rev) {
                    Ok(()) => self.synced = true,
                    Err(delivered) => self.catch_up(delivered).await?,
                }
                continue;
            }
            tokio::select! {
                batch = self.batches.recv() => match batch {
                    Some(batch) => self.take(&batch.events, batch.through),
                    // The hub dropped this stream: only possible while it shuts down.
                    None => return Err(mvcc::Error::ShuttingDown),
                },
                () = self.sub.lag_signalled() => {}
            }
        }
    }

    /// Reads one chunk of the log after `next_rev`, up to `delivered` at most.
    async fn catch_up(&mut self, delivered: i64) -> mvcc::Result<()> {
        let through = (self.next_rev - 1 + READ_CHUNK).min(delivered);
        let (revisions, events) = self
            .sub
            .hub()
            .read_changes(self.next_rev - 1, through)
            .await?;
        if self.next_rev < revisions.compact {
            return Err(mvcc::Error::Compacted);
        }
        self.take(&events, through);
        Ok(())
    }

    fn take(&mut self, events: &[Event], through: i64) {
        for event in events {
            if event.revision() >= self.next_rev && self.range.contains(&event.kv.key) {
                self.pending.push_back((event.clone(), through));
            }
        }
        self.next_rev = self.next_rev.max(through + 1);
    }
}
