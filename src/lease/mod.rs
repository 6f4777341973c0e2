//! Leases: granting, keep-alive, and expiry, on the lease table the store keeps beside the log.
//!
//! # Invariants
//! - A lease is a row with its granted TTL and an absolute deadline (Unix milliseconds). The
//!   deadline, not a countdown, is stored, so a restart neither resets nor extends it.
//! - Every change goes through the store's single writer; revoking a lease (by request or by
//!   expiry) deletes its row and every key attached to it in one revision, each deletion a
//!   normal log entry that watchers see as a DELETE with `prev_kv`.
//! - Expiry is one loop per process, not a timer per lease: it sleeps until the earliest
//!   deadline (at most [`MAX_SLEEP`], so leases granted meanwhile or by other processes are
//!   noticed), then asks the writer to revoke what is due. The writer re-reads the deadlines
//!   inside its exclusive transaction, so a lease kept alive at the last moment survives and
//!   two processes sharing a database never revoke the same lease twice.
//! - Time comes from a [`Clock`], so tests can move it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::LeaseRow;
use crate::mvcc::types::{LeaseOp, LeaseOutcome, Revisioned};
use crate::mvcc::{self, Store};

/// Longest the expiry loop sleeps between looks at the lease table.
pub const MAX_SLEEP: Duration = Duration::from_millis(500);
/// Leases revoked per writer job, so one expiry pass never holds the writer for long.
const EXPIRE_BATCH: i64 = 64;
/// etcd's smallest TTL with its default election timeout (1 s): 1.5 elections, rounded up.
pub const MIN_TTL: i64 = 2;
/// etcd's largest TTL.
pub const MAX_TTL: i64 = 9_000_000_000;

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that moves only when told to.
#[derive(Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now_ms: i64) -> Self {
        Self(AtomicI64::new(now_ms))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(
            i64::try_from(by.as_millis()).unwrap_or(i64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// What LeaseTimeToLive reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseStatus {
    pub granted_ttl: i64,
    /// Whole seconds left; -1 once the deadline has passed.
    pub remaining_ttl: i64,
    pub keys: Vec<Vec<u8>>,
}

/// Told how many leases each expiry pass revoked (the metrics).
pub type ExpiryObserver = Arc<dyn Fn(usize) + Send + Sync>;

#[derive(Clone)]
pub struct Lessor {
    store: Store,
    clock: Arc<dyn Clock>,
    on_expiry: Option<ExpiryObserver>,
}

impl Lessor {
    pub fn new(store: Store, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            clock,
            on_expiry: None,
        }
    }

    /// Reports every lease revoked because its deadline passed to `observer`.
    pub fn observe_expiries(mut self, observer: ExpiryObserver) -> Self {
        self.on_expiry = Some(observer);
        self
    }

    /// Starts the expiry loop on `tasks`; it stops when `shutdown` fires.
    pub fn start_expiry(&self, tasks: &TaskTracker, shutdown: CancellationToken) {
        tasks.spawn(run_expiry(self.clone(), shutdown));
    }

    /// Grants a lease: `id` 0 lets the server choose. TTLs below etcd's minimum are raised to
    /// it. Returns the lease as granted.
    ///
    /// # Errors
    /// `LeaseExists` if the id is taken.
    pub async fn grant(&self, id: i64, ttl: i64) -> mvcc::Result<Revisioned<LeaseRow>> {
        let ttl = ttl.max(MIN_TTL);
        loop {
            let chosen = if id == 0 {
                // Positive and non-zero, like etcd's ids.
                (rand::random::<u64>() >> 1).max(1) as i64
            } else {
                id
            };
            let lease = LeaseRow {
                id: chosen,
                ttl,
                expires_at: self.clock.now_ms().saturating_add(ttl.saturating_mul(1000)),
            };
            match self.store.lease(LeaseOp::Grant(lease)).await {
                Ok(out) => {
                    return Ok(Revisioned {
                        revision: out.revision,
                        value: lease,
                    });
                }
                // A random id that collided: draw again.
                Err(mvcc::Error::LeaseExists) if id == 0 => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Revokes a lease and deletes its keys; returns the revision after the deletions.
    ///
    /// # Errors
    /// `LeaseNotFound` for an unknown lease.
    pub async fn revoke(&self, id: i64) -> mvcc::Result<i64> {
        Ok(self.store.lease(LeaseOp::Revoke(id)).await?.revision)
    }

    /// Renews a lease to its granted TTL; `None` if it does not exist or has run out.
    ///
    /// # Errors
    /// The store fails.
    pub async fn keep_alive(&self, id: i64) -> mvcc::Result<Revisioned<Option<i64>>> {
        let now = self.clock.now_ms();
        let out = self.store.lease(LeaseOp::KeepAlive { id, now }).await?;
        let ttl = match out.value {
            LeaseOutcome::KeptAlive(ttl) => ttl,
            _ => None,
        };
        Ok(Revisioned {
            revision: out.revision,
            value: ttl,
        })
    }

    /// A lease's granted and remaining TTL, and its keys if asked; `None` if unknown.
    ///
    /// # Errors
    /// The store fails.
    pub async fn time_to_live(
        &self,
        id: i64,
        with_keys: bool,
    ) -> mvcc::Result<Revisioned<Option<LeaseStatus>>> {
        let out = self.store.read_lease(id, with_keys).await?;
        let now = self.clock.now_ms();
        let value = out.value.map(|(lease, keys)| LeaseStatus {
            granted_ttl: lease.ttl,
            remaining_ttl: remaining_seconds(lease.expires_at, now),
            keys,
        });
        Ok(Revisioned {
            revision: out.revision,
            value,
        })
    }

    /// The ids of every lease.
    ///
    /// # Errors
    /// The store fails.
    pub async fn leases(&self) -> mvcc::Result<Revisioned<Vec<i64>>> {
        let out = self.store.leases().await?;
        Ok(Revisioned {
            revision: out.revision,
            value: out.value.into_iter().map(|l| l.id).collect(),
        })
    }

    /// Revokes every lease whose deadline has passed; returns how many.
    ///
    /// # Errors
    /// The store fails.
    pub async fn expire_due(&self) -> mvcc::Result<usize> {
        let mut total = 0;
        loop {
            let now = self.clock.now_ms();
            let out = self
                .store
                .lease(LeaseOp::Expire {
                    now,
                    limit: EXPIRE_BATCH,
                })
                .await?;
            let LeaseOutcome::Expired(n) = out.value else {
                return Ok(total);
            };
            total += n;
            if let (Some(observe), true) = (&self.on_expiry, n > 0) {
                observe(n);
            }
            if (n as i64) < EXPIRE_BATCH {
                return Ok(total);
            }
        }
    }

    /// How long the expiry loop may sleep before the next deadline.
    async fn until_next_expiry(&self) -> mvcc::Result<Duration> {
        let next = self.store.next_lease_expiry().await?;
        Ok(sleep_until(next, self.clock.now_ms()))
    }
}

/// Whole seconds left before `expires_at`, or -1 once it has passed.
fn remaining_seconds(expires_at: i64, now: i64) -> i64 {
    if expires_at <= now {
        -1
    } else {
        (expires_at - now) / 1000
    }
}

/// How long to sleep before looking again, given the earliest deadline.
fn sleep_until(next: Option<i64>, now: i64) -> Duration {
    match next {
        Some(deadline) if deadline <= now => Duration::ZERO,
        Some(deadline) => Duration::from_millis((deadline - now) as u64).min(MAX_SLEEP),
        None => MAX_SLEEP,
    }
}

async fn run_expiry(lessor: Lessor, shutdown: CancellationToken) {
    loop {
        let wait = match lessor.until_next_expiry().await {
            Ok(wait) if wait.is_zero() => match lessor.expire_due().await {
                Ok(n) => {
                    if n > 0 {
                        tracing::debug!(expired = n, "leases expired");
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease expiry failed; retrying");
                    MAX_SLEEP
                }
            },
            Ok(wait) => wait,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read lease deadlines; retrying");
                MAX_SLEEP
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_ttl_counts_down_to_minus_one() {
        assert_eq!(remaining_seconds(10_000, 0), 10);
        assert_eq!(remaining_seconds(10_000, 500), 9);
        assert_eq!(remaining_seconds(10_000, 9_999), 0);
        assert_eq!(remaining_seconds(10_000, 10_000), -1);
        assert_eq!(remaining_seconds(10_000, 20_000), -1);
    }

    #[test]
    fn the_loop_sleeps_until_the_next_deadline_but_not_longer_than_max() {
        assert_eq!(sleep_until(None, 0), MAX_SLEEP);
        assert_eq!(sleep_until(Some(100), 0), Duration::from_millis(100));
        assert_eq!(sleep_until(Some(60_000), 0), MAX_SLEEP);
        assert_eq!(sleep_until(Some(5), 10), Duration::ZERO);
    }
}
