//! The revision probe: how a process that shares its database learns the cluster's current
//! revision for a linearizable read, with one round trip shared by every read waiting for one
//! (etcd batches its ReadIndex the same way).
//!
//! # Invariant
//! A read is answered with the result of a probe that *began after the read arrived*, so the
//! revision it gets covers every write acknowledged before the read: probes are numbered as they
//! begin, a read notes the number of the last one begun when it arrives, and it takes only the
//! answer of a later one. At most one probe runs at a time; reads that arrive meanwhile wait for
//! it to end and share the next one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Mutex, watch};

use crate::backend::{Backend, Revisions};

use super::{Error, Result};

pub(crate) struct RevisionProbe {
    /// How many probes have begun.
    begun: AtomicU64,
    /// Held by the read running the current probe.
    running: Mutex<()>,
    /// The newest finished probe: its number and what it found.
    finished: watch::Sender<(u64, Result<Revisions>)>,
}

impl RevisionProbe {
    pub fn new() -> Self {
        let (finished, _) = watch::channel((0, Err(Error::ShuttingDown)));
        Self {
            begun: AtomicU64::new(0),
            running: Mutex::new(()),
            finished,
        }
    }

    /// The database's revisions as of some moment after this call began.
    pub async fn revisions(&self, backend: &Arc<dyn Backend>) -> Result<Revisions> {
        let arrived = self.begun.load(Ordering::SeqCst);
        let mut finished = self.finished.subscribe();
        loop {
            {
                let (number, result) = &*finished.borrow_and_update();
                if *number > arrived {
                    return result.clone();
                }
            }
            if let Ok(_running) = self.running.try_lock() {
                // Numbered before it asks: any read that arrives from now on waits for a later one.
                let number = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
                let result = backend.revisions().await.map_err(Error::from);
                self.finished
                    .send_modify(|finished| *finished = (number, result.clone()));
                return result;
            }
            // Another read's probe is running, which may have begun before this read arrived:
            // wait for it, then share or run the next.
            if finished.changed().await.is_err() {
                return Err(Error::ShuttingDown);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend;

    async fn sqlite(dir: &std::path::Path) -> Arc<dyn Backend> {
        let endpoint = format!("sqlite://{}", dir.join("state.db").display());
        backend::open(&endpoint, &Default::default())
            .await
            .expect("the backend opens")
    }

    /// Reads that arrive while a probe runs do not take its answer (it may have begun before
    /// them), and then share one later probe instead of running one each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_take_only_probes_begun_after_them_and_share_them() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let backend = sqlite(dir.path()).await;
        let probe = Arc::new(RevisionProbe::new());
        // A probe in flight, begun before any of the reads below.
        let in_flight = probe.running.lock().await;
        let number = probe.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let reads: Vec<_> = (0..32)
            .map(|_| {
                let (probe, backend) = (probe.clone(), backend.clone());
                tokio::spawn(async move { probe.revisions(&backend).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // Its answer is stale on purpose: a read that took it would report revision 42.
        probe.finished.send_modify(|finished| {
            *finished = (
                number,
                Ok(Revisions {
                    current: 42,
                    compact: 0,
                }),
            );
        });
        drop(in_flight);
        for read in reads {
            let revisions = read
                .await
                .expect("the read runs")
                .expect("a probe succeeds");
            assert_eq!(
                revisions.current, 1,
                "a read took the answer of an earlier probe"
            );
        }
        let later = probe.begun.load(Ordering::SeqCst) - number;
        assert!(
            (1..16).contains(&later),
            "32 waiting reads ran {later} probes of their own"
        );
    }
}
