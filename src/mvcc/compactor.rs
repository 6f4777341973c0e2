//! Physical compaction: deletes, in the background, the rows a compaction made invisible.
//!
//! `Compact(C)` records C as the compact revision in the writer's transaction; from then on
//! reads and watches below C answer "compacted". A background task then deletes, in small
//! transactions, rows that no read at or above C can see: rows superseded by a change below C,
//! and tombstones below C. A row superseded at C itself stays until the next compaction, as the
//! prev_kv of a change a watch from C reports. Deleting them never changes what a read at C or
//! later returns, so it may lag behind.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;

/// Revisions per physical-compaction transaction: small enough that the writer waits only
/// milliseconds for one.
const COMPACTION_CHUNK: i64 = 250;
/// The least pause between two compaction chunks.
const COMPACTION_REST: std::time::Duration = std::time::Duration::from_millis(1);

/// Deletes what compaction made invisible, a chunk of revisions per transaction.
pub(super) async fn run_compactor(
    backend: Arc<dyn Backend>,
    mut target: watch::Receiver<i64>,
    compacted: watch::Sender<i64>,
    shutdown: CancellationToken,
) {
    let mut done = *compacted.borrow();
    loop {
        let goal = *target.borrow_and_update();
        while done < goal && !shutdown.is_cancelled() {
            let through = (done + COMPACTION_CHUNK).min(goal);
            let started = std::time::Instant::now();
            match backend.compact_window(goal, done, through).await {
                Ok(removed) => {
                    tracing::debug!(through, removed, "compacted");
                    done = through;
                    compacted.send_replace(done);
                    // Each chunk holds the writer's lock. Rest as long as the chunk took, so a
                    // writer waiting for the lock gets it before the next chunk (a pool may hand
                    // a just-released connection straight back to the task that released it):
                    // writers wait for one chunk at most, and compaction still runs far faster
                    // than writes can supersede rows.
                    if done < goal {
                        tokio::select! {
                            () = tokio::time::sleep(started.elapsed().max(COMPACTION_REST)) => {}
                            () = shutdown.cancelled() => return,
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "compaction failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        () = shutdown.cancelled() => return,
                    }
                }
            }
        }
        tokio::select! {
            changed = target.changed() => if changed.is_err() { return },
            () = shutdown.cancelled() => return,
        }
    }
}
