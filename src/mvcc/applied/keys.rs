//! The live keys of the applied index: a hash table for lookups of one key and an
//! order-statistic B-tree for order and ranks, sharing each key's bytes.
//!
//! # Why two structures
//! A get is the commonest read. In the B-tree alone it costs a binary search per level, and each
//! comparison follows a pointer to a key somewhere else on the heap: about twenty cache misses
//! at 100,000 keys, an eighth of a get's CPU time. The hash table finds a key with one or two.
//! Ranges, counts and the clock sweep walk the B-tree and take each key's entry from the table.
//!
//! # Invariants
//! - The B-tree and the table hold the same keys; each key's bytes are allocated once (an
//!   `Arc<[u8]>` in both).
//! - Entries live only in the table, so an entry changes in one place.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use wabi_tree::OSBTreeSet;

use super::Entry;

pub(super) struct Keys {
    /// Key order and ranks; a range's count is two rank lookups.
    order: OSBTreeSet<Arc<[u8]>>,
    /// Every key's entry. std's SipHash: keys come from clients, so the hash must not be one
    /// they can make collide.
    entries: HashMap<Arc<[u8]>, Entry>,
}

/// The keys of a range with their entries, in key order.
pub(super) type Walk<'a> = Box<dyn Iterator<Item = (&'a [u8], &'a Entry)> + 'a>;

impl Keys {
    pub fn new() -> Self {
        Self {
            order: OSBTreeSet::new(),
            entries: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(key)
    }

    pub fn get_key_value(&self, key: &[u8]) -> Option<(&[u8], &Entry)> {
        self.entries.get_key_value(key).map(|(k, e)| (&**k, e))
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.entries.get_mut(key)
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.entries.contains_key(key)
    }

    /// Sets `key`'s entry; returns the one it replaces.
    pub fn insert(&mut self, key: &[u8], entry: Entry) -> Option<Entry> {
        if let Some(slot) = self.entries.get_mut(key) {
            return Some(std::mem::replace(slot, entry));
        }
        let key: Arc<[u8]> = Arc::from(key);
        self.order.insert(key.clone());
        self.entries.insert(key, entry);
        None
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.order.remove(key);
        Some(entry)
    }

    /// The keys within `bounds`, with their entries, in key order.
    pub fn range<'a>(&'a self, bounds: (Bound<&'a [u8]>, Bound<&'a [u8]>)) -> Walk<'a> {
        Box::new(self.order.range::<[u8], _>(bounds).map(|key| {
            let entry = self
                .entries
                .get(&**key)
                .expect("the B-tree and the table hold the same keys");
            (&**key, entry)
        }))
    }

    /// Calls `visit` on the keys after `from`, in key order, with their entries, until it
    /// returns `false`.
    pub fn walk_mut(
        &mut self,
        from: Bound<&[u8]>,
        mut visit: impl FnMut(&[u8], &mut Entry) -> bool,
    ) {
        let Keys { order, entries } = self;
        for key in order.range::<[u8], _>((from, Bound::Unbounded)) {
            if let Some(entry) = entries.get_mut(&**key)
                && !visit(key, entry)
            {
                return;
            }
        }
    }

    /// How many keys sort before `bound`.
    pub fn rank(&self, bound: &[u8]) -> usize {
        match self
            .order
            .range::<[u8], _>((Bound::Included(bound), Bound::Unbounded))
            .next()
        {
            Some(first) => self.order.rank_of(&**first).unwrap_or(self.len()),
            None => self.len(),
        }
    }
}

impl FromIterator<(Vec<u8>, Entry)> for Keys {
    fn from_iter<I: IntoIterator<Item = (Vec<u8>, Entry)>>(items: I) -> Self {
        let mut keys = Keys::new();
        for (key, entry) in items {
            keys.insert(&key, entry);
        }
        keys
    }
}
