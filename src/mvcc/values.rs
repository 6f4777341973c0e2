//! The cache of recently written rows: the writer's source of old values.
//!
//! A Put or Delete records the value it replaces (the watch's `prev_kv`), and a txn's Range
//! answers with values; without this cache each batch asks the database for them in a query of
//! its own before it can write. Keys that are written again soon after (Kubernetes updates the
//! same objects over and over) find their value here instead. (Readers have their own values,
//! in the applied index: these run ahead of what is durable.) What the cache lacks is looked up
//! in the applied index before the database: its budget is larger (a key set whose values
//! exceed this cache's budget is rewritten without a query when it fits there), and a value it
//! holds for the wanted row is that row's.
//!
//! # Invariants
//! - An entry `key → row at revision r` is exactly the committed row `(key, r)`: entries come
//!   only from committed rows ([`ValueCache::record`]), never from a batch still running, so a
//!   rolled-back write is never cached.
//! - Entries follow commits in order: recording a batch replaces or removes the entry of every
//!   key it wrote, before the batch is handed on to be published. So an entry is the key's
//!   newest row as of the last recorded commit, which is at or after the published revision.
//! - The writer's lookups name the revision they want (the key index's newest row), so an entry
//!   that is no longer the key's newest row (a write failed after the index was reloaded) is a
//!   miss, never a wrong answer. The applied index is asked by the same `(key, revision)`, and
//!   holds a key's value only for the row its metadata names, so it answers the same or not at
//!   all.
//! - Memory is bounded: keys and values together stay within the budget; the entries written
//!   longest ago are dropped first. Dropping an entry is always safe: it only makes a miss.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::applied::Applied;
use crate::backend::LogRow;

/// Bytes counted for an entry beyond its key and value (map slot, queue slot, allocations).
const ENTRY_OVERHEAD: usize = 96;

/// A committed row's value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cached {
    revision: i64,
    value: Vec<u8>,
}

type Entries = HashMap<Arc<[u8]>, Cached>;

/// The writer's cache: fills the entries and keeps them within the budget.
pub(crate) struct ValueCache {
    entries: Entries,
    /// Keys in the order they were written, with the revision written; an item whose revision
    /// is no longer its key's entry is stale and skipped.
    order: VecDeque<(Arc<[u8]>, i64)>,
    bytes: usize,
    budget: usize,
    /// Asked for the rows the cache lacks.
    applied: Option<Applied>,
}

/// Whether `key`'s entry is the row written at `revision` (an item of the write order that is
/// not stale).
fn holds(entries: &Entries, key: &[u8], revision: i64) -> bool {
    entries.get(key).is_some_and(|e| e.revision == revision)
}

impl ValueCache {
    /// A cache of at most `budget` bytes; 0 caches nothing.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            budget,
            applied: None,
        }
    }

    /// The cache, asking `applied` for what it lacks.
    pub(crate) fn backed_by(self, applied: Applied) -> Self {
        Self {
            applied: Some(applied),
            ..self
        }
    }

    /// The value of row `(key, revision)`, if cached here or held by the applied index.
    pub(crate) fn get(&self, key: &[u8], revision: i64) -> Option<Vec<u8>> {
        match self.entries.get(key) {
            Some(entry) if entry.revision == revision => Some(entry.value.clone()),
            _ => self.applied.as_ref()?.value_at(key, revision),
        }
    }

    /// Forgets every entry (the database may not be the one they came from).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.bytes = 0;
    }

    /// Takes in the rows of a committed batch, in revision order.
    pub(crate) fn record(&mut self, rows: &[LogRow]) {
        for row in rows {
            self.remove(&row.key);
            if row.deleted {
                continue;
            }
            let size = Self::size(&row.key, &row.value);
            if size > self.budget {
                continue;
            }
            let key: Arc<[u8]> = Arc::from(row.key.as_slice());
            self.entries.insert(
                key.clone(),
                Cached {
                    revision: row.revision,
                    value: row.value.clone(),
                },
            );
            self.order.push_back((key, row.revision));
            self.bytes += size;
        }
        while self.bytes > self.budget {
            let Some((key, revision)) = self.order.pop_front() else {
                break;
            };
            if holds(&self.entries, &key, revision) {
                self.remove(&key);
            }
        }
        // Rewrites leave stale items in `order`; drop them before they outnumber the entries.
        if self.order.len() > 2 * self.entries.len() + 1024 {
            let entries = &self.entries;
            self.order
                .retain(|(key, revision)| holds(entries, key, *revision));
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some((key, entry)) = self.entries.remove_entry(key) {
            self.bytes -= Self::size(&key, &entry.value);
        }
    }

    fn size(key: &[u8], value: &[u8]) -> usize {
        key.len() + value.len() + ENTRY_OVERHEAD
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: i64, value: &str) -> LogRow {
        LogRow {
            revision,
            sub: 0,
            key: key.as_bytes().to_vec(),
            created: false,
            deleted: false,
            create_revision: 1,
            prev_revision: 0,
            version: 1,
            lease: 0,
            value: value.as_bytes().to_vec(),
            old_value: None,
            old_lease: 0,
        }
    }

    #[test]
    fn answers_only_for_the_revision_cached() {
        let mut cache = ValueCache::new(1 << 20);
        cache.record(&[put("a", 2, "v2")]);
        assert_eq!(cache.get(b"a", 2), Some(b"v2".to_vec()));
        assert_eq!(cache.get(b"a", 1), None);
        cache.record(&[put("a", 3, "v3")]);
        assert_eq!(cache.get(b"a", 2), None);
        assert_eq!(cache.get(b"a", 3), Some(b"v3".to_vec()));
        let mut tombstone = put("a", 4, "");
        tombstone.deleted = true;
        cache.record(&[tombstone]);
        assert_eq!(cache.get(b"a", 3), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn stays_within_its_budget_dropping_the_oldest_writes() {
        let entry = ValueCache::size(b"k00", b"0123456789");
        let mut cache = ValueCache::new(3 * entry);
        for (revision, key) in ["k00", "k01", "k02", "k03"].iter().enumerate() {
            cache.record(&[put(key, revision as i64 + 1, "0123456789")]);
        }
        assert!(cache.bytes <= 3 * entry);
        assert_eq!(cache.get(b"k00", 1), None);
        assert!(cache.get(b"k03", 4).is_some());
        // Rewriting a key makes it the newest: k02 goes first now, not k01.
        cache.record(&[put("k01", 5, "0123456789"), put("k04", 6, "0123456789")]);
        assert_eq!(cache.get(b"k02", 3), None);
        assert!(cache.get(b"k01", 5).is_some());
        assert!(cache.get(b"k04", 6).is_some());
        assert_eq!(cache.bytes, 3 * entry);
    }

    #[test]
    fn a_miss_is_answered_by_the_applied_index_for_the_same_row_only() {
        let applied = Applied::load(&[], 1, 1 << 20, 100);
        let kv = crate::mvcc::types::KeyValue::from_row(put("a", 2, "v2"));
        assert!(applied.apply(1, 2, [(&kv, false)]));
        // Nothing cached here: the index's value of the row the writer names.
        let cache = ValueCache::new(0).backed_by(applied.clone());
        assert_eq!(cache.get(b"a", 2), Some(b"v2".to_vec()));
        // Another revision of the key, or a key the index lacks: a miss, never a wrong value.
        assert_eq!(cache.get(b"a", 3), None);
        assert_eq!(cache.get(b"b", 2), None);
        // An entry of its own wins, and a stale one falls through to the index.
        let mut cache = ValueCache::new(1 << 20).backed_by(applied.clone());
        cache.record(&[put("a", 1, "v1")]);
        assert_eq!(cache.get(b"a", 1), Some(b"v1".to_vec()));
        assert_eq!(cache.get(b"a", 2), Some(b"v2".to_vec()));
    }

    #[test]
    fn rewriting_one_key_does_not_grow_the_queue_without_bound() {
        let mut cache = ValueCache::new(1 << 20);
        for revision in 1..10_000 {
            cache.record(&[put("hot", revision, "v")]);
        }
        assert_eq!(cache.len(), 1);
        assert!(cache.order.len() <= 2 + 1024);
    }
}
