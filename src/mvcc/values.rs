//! The cache of recently written rows: the writer's source of old values, and the readers'
//! source of single-key gets at the current revision.
//!
//! A Put or Delete records the value it replaces (the watch's `prev_kv`), and a txn's Range
//! answers with values; without this cache each batch asks the database for them in a query of
//! its own before it can write. Keys that are written again soon after (Kubernetes updates the
//! same objects over and over) find their value here instead. The same entries answer a get of
//! such a key without SQL when this process is the database's only writer.
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
//!   miss, never a wrong answer. A reader at published revision R trusts an entry only if its
//!   revision is at or below R: a newer entry is not yet durable and says nothing of R.
//! - Memory is bounded: keys and values together stay within the budget; the entries written
//!   longest ago are dropped first. Dropping an entry is always safe: it only makes a miss.

use std::collections::VecDeque;
use std::sync::Arc;

use dashmap::DashMap;

use crate::backend::LogRow;

use super::types::KeyValue;

/// Bytes counted for an entry beyond its key and value (map slot, queue slot, allocations).
const ENTRY_OVERHEAD: usize = 96;

/// A committed row, as much of it as a Range answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cached {
    revision: i64,
    create_revision: i64,
    version: i64,
    lease: i64,
    value: Vec<u8>,
}

type Entries = DashMap<Arc<[u8]>, Cached>;

/// The writer's side: fills the entries and keeps them within the budget.
pub(crate) struct ValueCache {
    entries: Arc<Entries>,
    /// Keys in the order they were written, with the revision written; an item whose revision
    /// is no longer its key's entry is stale and skipped.
    order: VecDeque<(Arc<[u8]>, i64)>,
    bytes: usize,
    budget: usize,
}

/// Whether `key`'s entry is the row written at `revision` (an item of the write order that is
/// not stale).
fn holds(entries: &Entries, key: &[u8], revision: i64) -> bool {
    entries.get(key).is_some_and(|e| e.revision == revision)
}

/// The readers' side: lookups only.
#[derive(Clone)]
pub(crate) struct RecentRows {
    entries: Arc<Entries>,
}

impl RecentRows {
    /// The key's newest row if it is cached and visible at `revision` (the published one).
    pub(crate) fn newest(&self, key: &[u8], revision: i64) -> Option<KeyValue> {
        let entry = self.entries.get(key)?;
        (entry.revision <= revision).then(|| KeyValue {
            key: key.to_vec(),
            create_revision: entry.create_revision,
            mod_revision: entry.revision,
            version: entry.version,
            value: entry.value.clone(),
            lease: entry.lease,
        })
    }
}

impl ValueCache {
    /// A cache of at most `budget` bytes; 0 caches nothing.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            entries: Arc::new(DashMap::new()),
            order: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    /// A handle for readers, sharing this cache's entries.
    pub(crate) fn readers(&self) -> RecentRows {
        RecentRows {
            entries: self.entries.clone(),
        }
    }

    /// The value of row `(key, revision)`, if cached.
    pub(crate) fn get(&self, key: &[u8], revision: i64) -> Option<Vec<u8>> {
        let entry = self.entries.get(key)?;
        (entry.revision == revision).then(|| entry.value.clone())
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
                    create_revision: row.create_revision,
                    version: row.version,
                    lease: row.lease,
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
        if let Some((key, entry)) = self.entries.remove(key) {
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
    fn readers_see_a_key_newest_row_only_at_or_after_its_revision() {
        let mut cache = ValueCache::new(1 << 20);
        let readers = cache.readers();
        let mut row = put("a", 5, "v5");
        row.create_revision = 3;
        row.version = 2;
        row.lease = 9;
        cache.record(&[row]);
        assert_eq!(readers.newest(b"a", 4), None);
        let kv = readers.newest(b"a", 5).unwrap();
        assert_eq!(
            (kv.create_revision, kv.mod_revision, kv.version, kv.lease),
            (3, 5, 2, 9)
        );
        assert_eq!((kv.key, kv.value), (b"a".to_vec(), b"v5".to_vec()));
        assert!(readers.newest(b"a", 7).is_some());
        let mut tombstone = put("a", 6, "");
        tombstone.deleted = true;
        cache.record(&[tombstone]);
        assert_eq!(readers.newest(b"a", 7), None);
        cache.record(&[put("b", 8, "v8")]);
        cache.clear();
        assert_eq!(readers.newest(b"b", 8), None);
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
    fn rewriting_one_key_does_not_grow_the_queue_without_bound() {
        let mut cache = ValueCache::new(1 << 20);
        for revision in 1..10_000 {
            cache.record(&[put("hot", revision, "v")]);
        }
        assert_eq!(cache.len(), 1);
        assert!(cache.order.len() <= 2 + 1024);
    }
}
