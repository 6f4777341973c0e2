//! Alarms and the space quota, as etcd keeps them.
//!
//! - **NOSPACE.** A write that would take the database past `--quota-backend-bytes` (its size
//!   plus etcd's estimate of the write's cost) raises NOSPACE and fails. While NOSPACE is raised,
//!   every request that would add data (a Put, a txn with a Put in either branch, a lease grant)
//!   fails with `etcdserver: mvcc: database space exceeded`; reads, deletes and compaction go
//!   on, so an operator can make room, defragment, and disarm the alarm.
//! - **CORRUPT** (raised only through the Alarm API here): every write fails with
//!   `etcdserver: corrupt cluster`.
//!
//! # Invariants
//! - The database holds the alarms (`meta` rows), so they survive restarts and every instance of
//!   one database sees the same ones. Each process keeps a copy, refreshed with the database's
//!   size every [`REFRESH`], and at once when it raises or clears an alarm itself.
//! - The quota is checked against the size as last refreshed: a burst of writes within one
//!   refresh can overshoot it by what it wrote meanwhile, never by more.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::types::{Op, TxnRequest};
use super::{Error, Result};
use crate::backend::Backend;

/// etcd's alarm types, by their protobuf numbers.
pub const NOSPACE: i32 = 1;
pub const CORRUPT: i32 = 2;

/// etcd's quota when none is given (`--quota-backend-bytes` 0): 2 GiB.
pub const DEFAULT_QUOTA_BYTES: i64 = 2 << 30;
/// etcd's estimate of what storing a key costs beyond its bytes, and a lease.
const KV_OVERHEAD: i64 = 256;
const LEASE_OVERHEAD: i64 = 64;
/// How often the database's size and alarms are read again.
const REFRESH: Duration = Duration::from_secs(1);

/// What a write request would add, as etcd's quota counts it.
pub enum Cost<'a> {
    Txn(&'a TxnRequest),
    LeaseGrant,
}

impl Cost<'_> {
    fn bytes(&self) -> i64 {
        match self {
            // The larger branch: only one of them runs. Puts count; deletes and reads free space
            // or take none.
            Cost::Txn(txn) => {
                let branch = |ops: &[Op]| -> i64 {
                    ops.iter()
                        .map(|op| match op {
                            Op::Put(put) => {
                                let value = put.value.as_ref().map_or(0, Vec::len);
                                KV_OVERHEAD + (put.key.len() + value) as i64
                            }
                            _ => 0,
                        })
                        .sum()
                };
                branch(&txn.success).max(branch(&txn.failure))
            }
            Cost::LeaseGrant => LEASE_OVERHEAD,
        }
    }
}

pub(crate) struct Alarms {
    /// `None`: no quota (a negative `--quota-backend-bytes`).
    quota: Option<i64>,
    /// The database's size in bytes, as last read.
    size: AtomicI64,
    /// The alarms raised, in etcd's numbers, ascending.
    raised: Mutex<Vec<i32>>,
}

impl Alarms {
    /// The alarms as the database holds them; `quota_bytes` as etcd takes its flag (0: the
    /// default, negative: none).
    pub async fn load(backend: &dyn Backend, quota_bytes: i64) -> Result<Self> {
        let quota = match quota_bytes {
            0 => Some(DEFAULT_QUOTA_BYTES),
            q if q < 0 => None,
            q => Some(q),
        };
        let alarms = Self {
            quota,
            size: AtomicI64::new(0),
            raised: Mutex::new(Vec::new()),
        };
        alarms.refresh(backend).await?;
        Ok(alarms)
    }

    async fn refresh(&self, backend: &dyn Backend) -> Result<()> {
        // Without a quota the size is never compared: no need to measure it.
        if self.quota.is_some() {
            let size = backend.size().await?.total;
            self.size.store(size, Ordering::Relaxed);
        }
        let raised = backend.alarms().await?;
        *self.lock() = raised;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<i32>> {
        self.raised
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn raised(&self) -> Vec<i32> {
        self.lock().clone()
    }

    /// Whether a request that costs `cost` may go ahead; raises NOSPACE (in the database, for
    /// every instance) when it would take the database past the quota.
    pub async fn admit(&self, backend: &dyn Backend, cost: Cost<'_>) -> Result<()> {
        // Every write passes here: look at the alarms in place rather than copy them.
        let (corrupt, nospace) = {
            let raised = self.lock();
            (raised.contains(&CORRUPT), raised.contains(&NOSPACE))
        };
        if corrupt {
            return Err(Error::Corrupt);
        }
        let bytes = cost.bytes();
        if bytes == 0 {
            return Ok(());
        }
        if nospace {
            return Err(Error::NoSpace);
        }
        let Some(quota) = self.quota else {
            return Ok(());
        };
        if self.size.load(Ordering::Relaxed) + bytes < quota {
            return Ok(());
        }
        tracing::warn!(
            quota,
            size = self.size.load(Ordering::Relaxed),
            "the database reached --quota-backend-bytes: NOSPACE raised, writes refused until it is disarmed"
        );
        self.set(backend, NOSPACE, true).await?;
        Err(Error::NoSpace)
    }

    /// Raises or clears an alarm; whether that changed anything.
    pub async fn set(&self, backend: &dyn Backend, alarm: i32, raise: bool) -> Result<bool> {
        let changed = backend.set_alarm(alarm, raise).await?;
        self.refresh(backend).await?;
        Ok(changed)
    }

    /// Reads the size and the alarms again every [`REFRESH`] until `shutdown`.
    pub async fn run_refresh(
        self: Arc<Self>,
        backend: Arc<dyn Backend>,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(REFRESH) => {}
                () = shutdown.cancelled() => return,
            }
            if let Err(e) = self.refresh(backend.as_ref()).await {
                tracing::debug!(error = %e, "cannot read the alarms and the database size");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::types::{DeleteRequest, KeyRange, PutRequest};

    #[test]
    fn a_txn_costs_its_larger_branch_of_puts() {
        let put = |k: &str, v: usize| {
            Op::Put(PutRequest {
                key: k.into(),
                value: Some(vec![0; v]),
                lease: None,
                prev_kv: false,
            })
        };
        let txn = TxnRequest {
            compares: Vec::new(),
            success: vec![put("a", 10), put("bb", 20)],
            failure: vec![
                put("c", 1000),
                Op::Delete(DeleteRequest {
                    range: KeyRange::single(b"d".to_vec()),
                    prev_kv: false,
                }),
            ],
        };
        assert_eq!(Cost::Txn(&txn).bytes(), 256 + 1 + 1000);
        let success_larger = TxnRequest {
            failure: Vec::new(),
            ..txn
        };
        assert_eq!(
            Cost::Txn(&success_larger).bytes(),
            256 + 1 + 10 + 256 + 2 + 20
        );
        let reads_only = TxnRequest {
            compares: Vec::new(),
            success: Vec::new(),
            failure: Vec::new(),
        };
        assert_eq!(Cost::Txn(&reads_only).bytes(), 0);
        assert_eq!(Cost::LeaseGrant.bytes(), 64);
    }
}
