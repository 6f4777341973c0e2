//! Each lease's live keys, in key order: what a revocation deletes and what TimeToLive lists,
//! kept beside a key index so that neither asks SQL.
//!
//! # Invariant
//! A key is under a lease exactly while its index's entry for it is live and names that lease;
//! the index calls [`LeasedKeys::attach`] and [`LeasedKeys::detach`] wherever it changes an
//! entry. A lease with no keys has no entry, so the map's size follows the leases in use.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::index::KeyMeta;

#[derive(Default)]
pub(crate) struct LeasedKeys(HashMap<i64, BTreeSet<Arc<[u8]>>>);

impl LeasedKeys {
    /// Records `key` under its lease, if `meta` is live with one.
    pub fn attach(&mut self, key: &Arc<[u8]>, meta: &KeyMeta) {
        if !meta.deleted && meta.lease != 0 {
            self.0.entry(meta.lease).or_default().insert(key.clone());
        }
    }

    /// Takes `key` from under its lease, if `meta` had it there.
    pub fn detach(&mut self, key: &[u8], meta: &KeyMeta) {
        if meta.deleted || meta.lease == 0 {
            return;
        }
        if let Some(keys) = self.0.get_mut(&meta.lease) {
            keys.remove(key);
            if keys.is_empty() {
                self.0.remove(&meta.lease);
            }
        }
    }

    /// The keys under `lease`, in key order.
    pub fn keys(&self, lease: i64) -> impl Iterator<Item = &Arc<[u8]>> + '_ {
        self.0.get(&lease).into_iter().flatten()
    }

    /// How many leases have keys.
    #[cfg(test)]
    pub fn leases(&self) -> usize {
        self.0.len()
    }
}
