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
    shared: Arc<Shared>,
}

struct Shared {
    /// How many probes have begun.
    begun: AtomicU64,
    /// Held while a probe runs; released before its answer is announced, so a read woken by
    /// the announcement that needs a later probe can always start one.
    running: Arc<Mutex<()>>,
    /// The newest finished probe: its number and what it found.
    finished: watch::Sender<(u64, Result<Revisions>)>,
}

impl RevisionProbe {
    pub fn new() -> Self {
        let (finished, _) = watch::channel((0, Err(Error::ShuttingDown)));
        Self {
            shared: Arc::new(Shared {
                begun: AtomicU64::new(0),
                running: Arc::new(Mutex::new(())),
                finished,
            }),
        }
    }

    /// The database's revisions as of some moment after this call began.
    pub async fn revisions(&self, backend: &Arc<dyn Backend>) -> Result<Revisions> {
        self.run(|| {
            let backend = backend.clone();
            async move { backend.revisions().await }
        })
        .await
    }

    /// [`RevisionProbe::revisions`], asking with `query` when a probe must begin.
    async fn run<F, Q>(&self, query: Q) -> Result<Revisions>
    where
        Q: Fn() -> F,
        F: Future<Output = crate::backend::Result<Revisions>> + Send + 'static,
    {
        let shared = &self.shared;
        let arrived = shared.begun.load(Ordering::SeqCst);
        let mut finished = shared.finished.subscribe();
        loop {
            {
                let (number, result) = &*finished.borrow_and_update();
                if *number > arrived {
                    return result.clone();
                }
            }
            // No probe runs: start one. It runs on its own task, so that a read cancelled
            // meanwhile (its client gave up) never leaves the others waiting for an answer.
            if let Ok(running) = shared.running.clone().try_lock_owned() {
                // Numbered before it asks: any read that arrives from now on waits for a later one.
                let number = shared.begun.fetch_add(1, Ordering::SeqCst) + 1;
                let shared = shared.clone();
                let asking = query();
                tokio::spawn(async move {
                    let result = asking.await.map_err(Error::from);
                    drop(running);
                    shared
                        .finished
                        .send_modify(|finished| *finished = (number, result));
                });
            }
            // Wait for the running probe (this read's, or one that may have begun before this
            // read arrived), then take its answer or start the next.
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
        let in_flight = probe.shared.running.lock().await;
        let number = probe.shared.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let reads: Vec<_> = (0..32)
            .map(|_| {
                let (probe, backend) = (probe.clone(), backend.clone());
                tokio::spawn(async move { probe.revisions(&backend).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // It ends as every probe does: the lock first, then its answer, stale on purpose (a
        // read that took it would report revision 42).
        drop(in_flight);
        probe.shared.finished.send_modify(|finished| {
            *finished = (
                number,
                Ok(Revisions {
                    current: 42,
                    compact: 0,
                    fence: 0,
                }),
            );
        });
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
        let later = probe.shared.begun.load(Ordering::SeqCst) - number;
        assert!(
            (1..16).contains(&later),
            "32 waiting reads ran {later} probes of their own"
        );
    }

    /// Reads that keep arriving while probes run all get their answers: every probe, once its
    /// lock is released, wakes the reads waiting for a later one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_arriving_all_the_time_all_get_answers() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let backend = sqlite(dir.path()).await;
        let probe = Arc::new(RevisionProbe::new());
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (probe, backend) = (probe.clone(), backend.clone());
                tokio::spawn(async move {
                    for _ in 0..300 {
                        probe.revisions(&backend).await.expect("a probe succeeds");
                    }
                })
            })
            .collect();
        let all = async {
            for reader in readers {
                reader.await.expect("the reader runs");
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(60), all)
            .await
            .expect("reads waited for an answer no probe was going to give");
    }

    /// A read whose client gives up while its probe runs leaves no one waiting: the probe runs
    /// on and answers the reads that arrived after it began, or lets them start the next.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_read_does_not_strand_the_others() {
        let probe = Arc::new(RevisionProbe::new());
        let asked = Arc::new(AtomicU64::new(0));
        let slow = |asked: Arc<AtomicU64>| {
            move || {
                let asked = asked.clone();
                async move {
                    let n = asked.fetch_add(1, Ordering::SeqCst) as i64;
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    Ok(Revisions {
                        current: 10 + n,
                        compact: 0,
                        fence: 0,
                    })
                }
            }
        };
        let first = {
            let (probe, query) = (probe.clone(), slow(asked.clone()));
            tokio::spawn(async move { probe.run(query).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let second = {
            let (probe, query) = (probe.clone(), slow(asked.clone()));
            tokio::spawn(async move { probe.run(query).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        first.abort();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), second)
            .await
            .expect("the second read was left waiting")
            .expect("the read runs")
            .expect("a probe succeeds");
        // The first probe began before the second read arrived: it ran a probe of its own.
        assert_eq!(answer.current, 11);
    }
}
