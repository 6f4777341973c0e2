//! The writer's key index: the current metadata of every key, in memory.
//!
//! The writer evaluates compares and does a Put's bookkeeping (does the key exist, its create
//! revision, version, lease, the revision its newest row has) against this index instead of
//! asking SQL, so that a typical request costs no SQL statement of its own: its row is buffered
//! and inserted with the rest of its batch. Values are not kept here; they stay in the database.
//!
//! # What it holds
//! For every key whose newest row is still in the log: that row's revision (`mod_revision`,
//! which is also the next row's `prev_revision`), create revision, version, lease, and whether
//! it is a tombstone. The index is complete: a key it does not hold has no row in the log, and
//! so is absent. Tombstones stay until physical compaction removes their rows
//! ([`KeyIndex::prune_tombstones`]), so a key re-created after a deletion still names the
//! tombstone as its previous row, exactly as the log does.
//!
//! # Coherence
//! - The index describes the log as of [`KeyIndex::revision`]. The writer compares that with the
//!   database's current revision each time it opens a write transaction; if another process
//!   (PostgreSQL) committed meanwhile, the writer applies the rows of the missing revisions, or
//!   reloads the index if compaction may have removed some of them.
//! - Changes made while a batch runs are undoable: [`KeyIndex::apply`] records what it replaced,
//!   [`KeyIndex::rollback`] restores the state of a [`Mark`] (a failed request, or a batch that
//!   did not commit), and [`KeyIndex::commit`] forgets the record once the database committed.
//!
//! # Two structures
//! Most of what the writer asks is about one key (a Put's bookkeeping, a compare, the
//! prefetch of a batch's old values), and an update changes only a key's metadata: those go to
//! a hash table, one probe each. (With a B-tree alone the index took 3.5% of a create's server
//! CPU and 4.8% of an update's, `perf`, 100,000 of each; with the table an update costs 3 to 5%
//! less server CPU.) Only ranges need the keys in order: a txn's Range, a DeleteRange or a
//! compare over a range. Kubernetes sends none of those to the writer, and keeping an ordered
//! set in step cost each create a search of it, each comparison following a pointer to a key
//! elsewhere on the heap (2.5% of a create's server CPU, `perf`). So the ordered set is built
//! from the table at the first range the writer meets, and kept in step from then on. Both then
//! hold the same keys, and each key's bytes are allocated once. That first range holds the
//! writer up while the set is built: about 30 ms at 100,000 keys and half a second at a million,
//! once per process (and after a reload). Every start used to pay it.
//!
//! # Leases
//! Each lease's live keys are kept too, in key order ([`KeyIndex::leased`]), so a revocation
//! finds the keys to delete without asking SQL (whose answer needed the batch's rows inserted
//! first). A key is there exactly while its newest row is live and names the lease; `apply`,
//! `rollback` and `forget` keep that in step with the metadata.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, OnceLock};

use crate::backend::{LogRow, RangeEnd};

use super::leased::LeasedKeys;
use super::types::{KeyRange, KeyValue};

/// What the index knows about one key: its newest row, without the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyMeta {
    /// Revision of the newest row (a tombstone's own revision for a deleted key).
    pub mod_revision: i64,
    pub create_revision: i64,
    /// Version after the newest put; for a tombstone, the version the key had when deleted.
    pub version: i64,
    pub lease: i64,
    pub deleted: bool,
}

impl KeyMeta {
    pub fn of(row: &LogRow) -> Self {
        Self {
            mod_revision: row.revision,
            create_revision: row.create_revision,
            version: row.version,
            lease: row.lease,
            deleted: row.deleted,
        }
    }

    /// The version `row` replaced, as the row itself records it: none when the row created its
    /// key (a deletion never does); otherwise the version its `prev_revision` names, of the same generation, one version
    /// lower for a put (a deletion's row keeps the version the key had), with `old_lease`.
    pub fn replaced_by(row: &LogRow) -> Option<Self> {
        (row.deleted || !row.created).then(|| Self {
            mod_revision: row.prev_revision,
            create_revision: row.create_revision,
            version: if row.deleted {
                row.version
            } else {
                row.version - 1
            },
            lease: row.old_lease,
            deleted: false,
        })
    }

    /// The key as a client sees it, with `value` filled in by the caller if needed.
    pub fn to_kv(self, key: &[u8], value: Vec<u8>) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            value,
            lease: self.lease,
        }
    }
}

/// A point [`KeyIndex::rollback`] returns to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    undo: usize,
    tombstones: usize,
}

#[derive(Default)]
pub(crate) struct KeyIndex {
    /// Every key's metadata. std's SipHash: keys come from clients, so the hash must not be one
    /// they can make collide.
    keys: HashMap<Arc<[u8]>, KeyMeta>,
    /// The same keys, in order, once a range needed them (see the module's documentation).
    order: OnceLock<BTreeSet<Arc<[u8]>>>,
    /// Each lease's live keys; a lease with none has no entry.
    leased: LeasedKeys,
    /// The log revision the committed part of the index describes.
    revision: i64,
    /// Tombstones in revision order, so pruning after physical compaction takes them from the
    /// front instead of walking every key. An entry whose key has since been written again is
    /// stale and skipped when pruned.
    tombstones: VecDeque<(i64, Arc<[u8]>)>,
    /// What each uncommitted `apply` replaced, newest last.
    undo: Vec<(Arc<[u8]>, Option<KeyMeta>)>,
    /// Set when the index was found to disagree with the log: it must be loaded afresh.
    stale: bool,
    /// How many times the writer loaded the index afresh after its first load, so that what
    /// it remembers beside the index (cached values) can be dropped with it.
    reloads: u64,
    /// How many times the index took in rows this writer did not write ([`KeyIndex::catch_up`]).
    catch_ups: u64,
}

impl KeyIndex {
    /// Builds the index from the newest row of every key (values are not read) as of `revision`.
    pub fn load(heads: impl IntoIterator<Item = LogRow>, revision: i64) -> Self {
        let mut index = Self {
            revision,
            ..Self::default()
        };
        for row in heads {
            let key: Arc<[u8]> = Arc::from(row.key.as_slice());
            if row.deleted {
                index.tombstones.push_back((row.revision, key.clone()));
            }
            let meta = KeyMeta::of(&row);
            index.leased.attach(&key, &meta);
            index.keys.insert(key, meta);
        }
        index.tombstones.make_contiguous().sort_unstable();
        index
    }

    /// Replaces the index with one loaded afresh, counting the reload.
    pub fn reload(&mut self, heads: impl IntoIterator<Item = LogRow>, revision: i64) {
        let (reloads, catch_ups) = (self.reloads + 1, self.catch_ups);
        *self = Self::load(heads, revision);
        self.reloads = reloads;
        self.catch_ups = catch_ups;
    }

    pub fn reloads(&self) -> u64 {
        self.reloads
    }

    /// Takes in committed rows this writer did not write (another process's, or those of a
    /// batch whose commit failed yet landed), through `revision`, counting it.
    pub fn catch_up(&mut self, rows: &[LogRow], revision: i64) {
        for row in rows {
            self.apply(row);
        }
        self.commit(revision);
        self.catch_ups += 1;
    }

    pub fn catch_ups(&self) -> u64 {
        self.catch_ups
    }

    /// The revision the index describes (uncommitted changes aside).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Marks the index as not to be trusted: the writer reloads it before the next batch.
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    pub fn needs_reload(&self) -> bool {
        self.stale
    }

    /// The newest row of `key`, tombstone or not.
    pub fn get(&self, key: &[u8]) -> Option<&KeyMeta> {
        self.keys.get(key)
    }

    /// The key if it exists (its newest row is not a tombstone).
    pub fn live(&self, key: &[u8]) -> Option<&KeyMeta> {
        self.get(key).filter(|meta| !meta.deleted)
    }

    /// The live keys attached to `lease`, in key order.
    pub fn leased(&self, lease: i64) -> impl Iterator<Item = (&[u8], &KeyMeta)> + '_ {
        self.leased.keys(lease).filter_map(|key| {
            let meta = self.keys.get(key)?;
            Some((&**key, meta))
        })
    }

    /// Sets `key`'s metadata, keeping its lease entry in step; what it replaced.
    fn set(&mut self, key: Arc<[u8]>, meta: KeyMeta) -> Option<KeyMeta> {
        let replaced = self.keys.insert(key.clone(), meta);
        if let Some(old) = &replaced {
            self.leased.detach(&key, old);
        }
        self.leased.attach(&key, &meta);
        replaced
    }

    /// The existing keys of a range, in key order.
    pub fn live_range<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> Box<dyn Iterator<Item = (&'a [u8], &'a KeyMeta)> + 'a> {
        let keys: Box<dyn Iterator<Item = &'a [u8]> + 'a> = match (&range.end, range.bounds()) {
            (RangeEnd::Single, _) => Box::new(std::iter::once(range.key.as_slice())),
            (_, Some(bounds)) => Box::new(self.order().range::<[u8], _>(bounds).map(|k| &**k)),
            (_, None) => Box::new(std::iter::empty()),
        };
        Box::new(keys.filter_map(|key| {
            let (key, meta) = self.keys.get_key_value(key)?;
            (!meta.deleted).then_some((&**key, meta))
        }))
    }

    /// The keys in order, built at the first call.
    fn order(&self) -> &BTreeSet<Arc<[u8]>> {
        // Collecting sorts the keys and builds the set in bulk, not by a search per key.
        self.order
            .get_or_init(|| self.keys.keys().cloned().collect())
    }

    /// Records a row written (or found written by another process) as its key's newest.
    pub fn apply(&mut self, row: &LogRow) {
        let meta = KeyMeta::of(row);
        let (key, replaced) = match self.keys.get_key_value(row.key.as_slice()) {
            // An existing key keeps its entry's key; only the metadata changes.
            Some((key, _)) => {
                let key = key.clone();
                (key.clone(), self.set(key, meta))
            }
            None => {
                let key: Arc<[u8]> = Arc::from(row.key.as_slice());
                self.set(key.clone(), meta);
                if let Some(order) = self.order.get_mut() {
                    order.insert(key.clone());
                }
                (key, None)
            }
        };
        if row.deleted {
            self.tombstones.push_back((row.revision, key.clone()));
        }
        self.undo.push((key, replaced));
    }

    /// Forgets `key` in both structures.
    fn forget(&mut self, key: &[u8]) {
        if let Some(meta) = self.keys.remove(key) {
            self.leased.detach(key, &meta);
        }
        if let Some(order) = self.order.get_mut() {
            order.remove(key);
        }
    }

    pub fn mark(&self) -> Mark {
        Mark {
            undo: self.undo.len(),
            tombstones: self.tombstones.len(),
        }
    }

    /// Undoes every `apply` since `mark`.
    pub fn rollback(&mut self, mark: Mark) {
        while self.undo.len() > mark.undo {
            let Some((key, replaced)) = self.undo.pop() else {
                break;
            };
            match replaced {
                Some(meta) => {
                    self.set(key, meta);
                }
                None => self.forget(&key),
            }
        }
        self.tombstones.truncate(mark.tombstones);
    }

    /// Makes every change so far permanent: the database committed them as `revision`.
    pub fn commit(&mut self, revision: i64) {
        self.undo.clear();
        self.revision = revision;
    }

    /// Forgets tombstones below `compacted`, whose rows physical compaction has removed: the log
    /// no longer knows those keys, so neither does the index. Only between batches (marks would
    /// no longer point at the right tombstones).
    pub fn prune_tombstones(&mut self, compacted: i64) {
        debug_assert!(self.undo.is_empty(), "pruning inside a batch");
        while let Some((revision, _)) = self.tombstones.front() {
            if *revision >= compacted {
                break;
            }
            let Some((revision, key)) = self.tombstones.pop_front() else {
                break;
            };
            // Stale entries (the key was written again since) leave the key alone.
            if self
                .keys
                .get(&key)
                .is_some_and(|meta| meta.deleted && meta.mod_revision == revision)
            {
                self.forget(&key);
            }
        }
    }

    /// How many keys the index holds, tombstones included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        if let Some(order) = self.order.get() {
            assert_eq!(
                order.len(),
                self.keys.len(),
                "both structures hold the same keys"
            );
        }
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: i64, create: i64, version: i64) -> LogRow {
        LogRow {
            revision,
            sub: 0,
            key: key.as_bytes().to_vec(),
            created: version == 1,
            deleted: false,
            create_revision: create,
            prev_revision: 0,
            version,
            lease: 0,
            value: Vec::new(),
            old_value: None,
            old_lease: 0,
        }
    }

    fn tombstone(key: &str, revision: i64) -> LogRow {
        LogRow {
            deleted: true,
            ..put(key, revision, 1, 1)
        }
    }

    fn keys(index: &KeyIndex, range: &KeyRange) -> Vec<String> {
        index
            .live_range(range)
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    #[test]
    fn load_keeps_tombstones_but_not_as_live() {
        let index = KeyIndex::load([put("a", 2, 2, 1), tombstone("b", 4)], 4);
        assert_eq!(index.revision(), 4);
        assert_eq!(index.live(b"a").map(|m| m.mod_revision), Some(2));
        assert!(index.live(b"b").is_none());
        assert_eq!(index.get(b"b").map(|m| m.mod_revision), Some(4));
        assert!(index.get(b"c").is_none());
    }

    #[test]
    fn ranges_skip_tombstones_and_stay_in_key_order() {
        let index = KeyIndex::load(
            [
                put("a", 2, 2, 1),
                tombstone("b", 3),
                put("c", 4, 4, 1),
                put("d", 5, 5, 1),
            ],
            5,
        );
        let all = KeyRange::from_etcd(b"a".to_vec(), vec![0]);
        assert_eq!(keys(&index, &all), ["a", "c", "d"]);
        let some = KeyRange::from_etcd(b"b".to_vec(), b"d".to_vec());
        assert_eq!(keys(&index, &some), ["c"]);
        assert_eq!(
            keys(&index, &KeyRange::single(b"b".to_vec())),
            Vec::<String>::new()
        );
        assert_eq!(keys(&index, &KeyRange::single(b"d".to_vec())), ["d"]);
        // A reversed range is empty rather than a panic.
        let reversed = KeyRange::from_etcd(b"d".to_vec(), b"a".to_vec());
        assert_eq!(keys(&index, &reversed), Vec::<String>::new());
    }

    #[test]
    fn rollback_restores_what_a_mark_saw() {
        let mut index = KeyIndex::load([put("a", 2, 2, 1)], 2);
        let batch = index.mark();
        index.apply(&put("a", 3, 2, 2));
        let request = index.mark();
        index.apply(&tombstone("a", 4));
        index.apply(&put("b", 4, 4, 1));
        index.rollback(request);
        assert_eq!(index.live(b"a").map(|m| m.version), Some(2));
        assert!(index.get(b"b").is_none());
        index.rollback(batch);
        assert_eq!(index.live(b"a").map(|m| m.mod_revision), Some(2));
        assert_eq!(index.revision(), 2);
        assert_eq!(index.len(), 1);
        // A key created and rolled back is gone from ranges too.
        let all = KeyRange::from_etcd(b"a".to_vec(), vec![0]);
        assert_eq!(keys(&index, &all), ["a"]);
    }

    /// The ordered set is built at the first range; from then on writes, rollbacks and prunes
    /// must keep it in step with the table.
    #[test]
    fn ranges_after_the_first_follow_later_writes() {
        let mut index = KeyIndex::load([put("b", 2, 2, 1)], 2);
        let all = KeyRange::from_etcd(b"a".to_vec(), vec![0]);
        index.apply(&put("c", 3, 3, 1));
        assert_eq!(keys(&index, &all), ["b", "c"]);
        index.commit(3);
        let mark = index.mark();
        index.apply(&put("a", 4, 4, 1));
        index.apply(&put("d", 4, 4, 1));
        assert_eq!(keys(&index, &all), ["a", "b", "c", "d"]);
        index.rollback(mark);
        assert_eq!(keys(&index, &all), ["b", "c"]);
        index.apply(&tombstone("b", 5));
        index.commit(5);
        index.prune_tombstones(6);
        assert_eq!(keys(&index, &all), ["c"]);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn commit_keeps_changes_and_moves_the_revision() {
        let mut index = KeyIndex::default();
        let mark = index.mark();
        index.apply(&put("a", 2, 2, 1));
        index.commit(2);
        // A rollback to a mark from before the commit has nothing left to undo.
        index.rollback(mark);
        assert_eq!(index.live(b"a").map(|m| m.mod_revision), Some(2));
        assert_eq!(index.revision(), 2);
    }

    #[test]
    fn pruning_forgets_only_compacted_tombstones() {
        let mut index = KeyIndex::load([tombstone("a", 3), tombstone("b", 6)], 6);
        index.apply(&tombstone("c", 7));
        // "d" is written again: its tombstone entry is stale and must not remove it.
        index.apply(&tombstone("d", 8));
        index.apply(&put("d", 9, 9, 1));
        index.commit(9);
        index.prune_tombstones(7);
        assert!(index.get(b"a").is_none());
        assert!(index.get(b"b").is_none());
        assert!(index.get(b"c").is_some());
        index.prune_tombstones(100);
        assert!(index.get(b"c").is_none());
        assert_eq!(index.live(b"d").map(|m| m.mod_revision), Some(9));
        assert_eq!(index.len(), 1);
    }

    fn with_lease(row: LogRow, lease: i64) -> LogRow {
        LogRow { lease, ..row }
    }

    fn leased(index: &KeyIndex, lease: i64) -> Vec<(String, i64)> {
        index
            .leased(lease)
            .map(|(k, m)| (String::from_utf8_lossy(k).into_owned(), m.mod_revision))
            .collect()
    }

    #[test]
    fn each_lease_lists_its_live_keys_through_writes_and_rollbacks() {
        let mut index = KeyIndex::load(
            [
                with_lease(put("b", 2, 2, 1), 7),
                with_lease(put("a", 3, 3, 1), 7),
                with_lease(tombstone("c", 4), 7),
                put("d", 5, 5, 1),
            ],
            5,
        );
        assert_eq!(leased(&index, 7), [("a".into(), 3), ("b".into(), 2)]);
        assert!(leased(&index, 8).is_empty());

        let mark = index.mark();
        // Kept on the same lease, moved to another, deleted, attached, created with a lease.
        index.apply(&with_lease(put("a", 6, 3, 2), 7));
        index.apply(&with_lease(put("b", 6, 2, 2), 8));
        index.apply(&with_lease(tombstone("a", 7), 7));
        index.apply(&with_lease(put("d", 8, 5, 2), 8));
        index.apply(&with_lease(put("e", 8, 8, 1), 8));
        assert!(leased(&index, 7).is_empty());
        assert!(
            index.leased.keys(7).next().is_none(),
            "an empty lease keeps no entry"
        );
        assert_eq!(
            leased(&index, 8),
            [("b".into(), 6), ("d".into(), 8), ("e".into(), 8)]
        );

        index.rollback(mark);
        assert_eq!(leased(&index, 7), [("a".into(), 3), ("b".into(), 2)]);
        assert!(leased(&index, 8).is_empty());

        // A tombstone pruned after compaction had no lease entry to take.
        index.apply(&with_lease(tombstone("b", 9), 7));
        index.commit(9);
        index.prune_tombstones(100);
        assert_eq!(leased(&index, 7), [("a".into(), 3)]);
        assert_eq!(index.leased.leases(), 1);
    }

    #[test]
    fn a_rolled_back_tombstone_is_not_pruned_later() {
        let mut index = KeyIndex::load([put("a", 2, 2, 1)], 2);
        let mark = index.mark();
        index.apply(&tombstone("a", 3));
        index.rollback(mark);
        index.prune_tombstones(100);
        assert_eq!(index.live(b"a").map(|m| m.mod_revision), Some(2));
    }
}
