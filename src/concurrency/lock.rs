//! Lock and Unlock: the holder of `<name>` is the key under `<name>/` with the lowest create
//! revision; a caller waits until every key created before its own is gone.

use super::{
    LeaveOnDrop, Recipes, Result, by_create, create_revision_is, get, holder_key, kvs_of,
    prefix_of, put,
};
use crate::mvcc::types::{KeyRange, Op, RangeRequest, SortOrder, TxnRequest};

/// A lock now held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The key that exists while the lock is held.
    pub key: Vec<u8>,
    /// The revision of the read that found the caller first in line.
    pub revision: i64,
}

impl Recipes {
    /// Waits until the caller holds lock `name` through `lease` (0: a new lease).
    ///
    /// # Errors
    /// The lease does not exist or ended while waiting (`SessionExpired`), or the store fails.
    pub async fn lock(&self, name: &[u8], lease: i64) -> Result<Held> {
        let lease = self.session(lease).await?;
        let prefix = prefix_of(name);
        let key = holder_key(&prefix, lease);
        // Queue up (or find the key this lease already queued) and learn the holder, in one txn.
        let owner = || Op::Range(by_create(&prefix, SortOrder::Ascend));
        let queued = self
            .txn(TxnRequest {
                compares: vec![create_revision_is(&key, 0)],
                success: vec![put(&key, b"", lease), owner()],
                failure: vec![get(&key), owner()],
            })
            .await?;
        let mine = if queued.value.succeeded {
            queued.revision
        } else {
            kvs_of(&queued.value, 0)
                .and_then(<[_]>::first)
                .map_or(queued.revision, |kv| kv.create_revision)
        };
        let first = kvs_of(&queued.value, 1).and_then(<[_]>::first);
        if first.is_none_or(|kv| kv.create_revision == mine) {
            return Ok(Held {
                key,
                revision: queued.revision,
            });
        }

        let mut cleanup = LeaveOnDrop::new(self.clone(), key.clone(), None);
        self.wait_deletes(&prefix, mine - 1).await?;
        // The keys before ours are gone; ours must still be there, or our lease ended.
        let ours = self
            .range(RangeRequest::of(KeyRange::single(key.clone())))
            .await?;
        cleanup.disarm();
        if ours.value.kvs.is_empty() {
            return Err(super::Error::SessionExpired);
        }
        Ok(Held {
            key,
            revision: ours.revision,
        })
    }

    /// Releases a lock by deleting its key; returns the revision after.
    ///
    /// # Errors
    /// The store fails.
    pub async fn unlock(&self, key: &[u8]) -> Result<i64> {
        self.delete(key).await
    }
}
