//! The history fence: what the store does when the database's history is shorter than what
//! this process has served. That happens after a failover to a standby that lacked the last
//! commits (asynchronous replication): the revisions past the standby's are gone, and new
//! writes would otherwise reuse their numbers for other changes, so that a client holding one
//! of them (kube-apiserver's resourceVersion) would silently miss or repeat events.
//!
//! # Invariants
//! - **Nothing reuses a revision that was served.** The writer never writes while the
//!   database's current revision is below the highest this process has committed or taken in
//!   ([`super::Error::Rewound`]), and a read never answers from memory when the database is below it.
//!   The process that finds the history shorter (its watch hub's tailer, [`Store::fence`])
//!   moves the current and compact revisions to the highest it served plus [`FENCE_GAP`] and
//!   records that revision as the fence, in one write transaction under the writers' lock; new
//!   writes follow it.
//! - **Everyone relists.** A process whose hub has not yet delivered the fence revision drops
//!   what its memory holds, reloads it from the log at the database's current revision, and
//!   makes every watcher catch up from the log ([`crate::watch`]), where it finds its revision
//!   compacted: watchers are cancelled with the compact revision, which kube-apiserver and etcd
//!   clients answer by relisting.
//! - **The gap covers the other processes.** They follow the same log milliseconds apart, so
//!   none has served [`FENCE_GAP`] revisions beyond the one that fences.

use super::{Result, Store};
use crate::backend::Revisions;

/// How far past the highest revision it served a fencing process moves the store: far more
/// revisions than any instance commits in the time another one takes to notice a commit (at
/// ten thousand writes a second, over a minute and a half).
pub const FENCE_GAP: i64 = 1_000_000;

impl Store {
    /// The highest revision this process has committed or taken into its applied index (and
    /// so may have answered or sent to a watcher).
    pub fn high_water(&self) -> i64 {
        self.inner
            .applied
            .revision()
            .max(*self.inner.committed.borrow())
    }

    /// Moves the store past `served` if the database's current revision is still below it:
    /// the revisions in between were lost. Returns the new revisions if this call fenced.
    ///
    /// # Errors
    /// The database cannot be written.
    pub async fn fence(&self, served: i64) -> Result<Option<Revisions>> {
        let backend = &self.inner.backend;
        let mut tx = backend.write().await?;
        let found = tx.revisions().await?;
        if found.current >= served {
            // Another process fenced first, or the log caught up: nothing to do here.
            return Ok(None);
        }
        let fence = served + FENCE_GAP;
        tx.set_current_revision(fence).await?;
        tx.set_compact_revision(fence).await?;
        tx.set_fence_revision(fence).await?;
        tx.commit().await?;
        backend.sync().await?;
        let lost = served - found.current;
        self.inner
            .lost_revisions
            .fetch_add(lost as u64, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            lost_from = found.current + 1,
            lost_through = served,
            continues_at = fence + 1,
            "the database lacks revisions {}..={served} that this process served (a failover to \
             a standby that had not received them?); they are lost. The store continues after \
             revision {fence}, every watch is cancelled as compacted, and clients relist",
            found.current + 1
        );
        Ok(Some(Revisions {
            current: fence,
            compact: fence,
            fence,
        }))
    }

    /// Revisions this process had served that a failover lost (each counted once, by the
    /// process that fenced).
    pub fn lost_revisions(&self) -> u64 {
        self.inner
            .lost_revisions
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}
