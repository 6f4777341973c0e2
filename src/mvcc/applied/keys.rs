//! The live keys of the applied index: their entries in a slab, found by a hash table for
//! lookups of one key and by an order-statistic B-tree for order and ranks.
//!
//! # Why three structures
//! A get is the commonest read. In the B-tree alone it costs a binary search per level, and each
//! comparison follows a pointer to a key somewhere else on the heap: about twenty cache misses
//! at 100,000 keys, an eighth of a get's CPU time. The hash table finds a key with one or two.
//! A list page walks the B-tree; each key there carries its entry's slot, so the walk reads
//! entries straight from the slab instead of hashing every key to find it in the table (a
//! random probe per key, the larger part of a page's walk).
//!
//! # Invariants
//! - The B-tree and the table hold the same keys, each naming the same slot; each key's bytes
//!   are allocated once (an `Arc<[u8]>` in both).
//! - A slot holds an entry exactly while a key names it; free slots are on the free list and
//!   reused before the slab grows. Entries live only in the slab, so an entry changes in one
//!   place.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use wabi_tree::OSBTreeSet;

use super::Entry;
use super::ordered_key::OrderedKey;

/// A key in the B-tree with its entry's slot. It compares by key alone, its inline head first.
#[derive(Clone)]
struct Slotted {
    key: OrderedKey,
    slot: u32,
}

impl PartialEq for Slotted {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Slotted {}

impl PartialOrd for Slotted {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Slotted {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

impl Borrow<[u8]> for Slotted {
    fn borrow(&self) -> &[u8] {
        self.key.bytes()
    }
}

pub(super) struct Keys {
    /// Key order and ranks; a range's count is two rank lookups.
    order: OSBTreeSet<Slotted>,
    /// Every key's slot. std's SipHash: keys come from clients, so the hash must not be one
    /// they can make collide.
    slots: HashMap<Arc<[u8]>, u32>,
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
}

/// The keys of a range with their entries, in key order.
pub(super) type Walk<'a> = Box<dyn Iterator<Item = (&'a [u8], &'a Entry)> + 'a>;

/// The entry in `slot`, which a key names.
fn occupied(entries: &[Option<Entry>], slot: u32) -> &Entry {
    entries[slot as usize]
        .as_ref()
        .expect("a slot a key names holds its entry")
}

impl Keys {
    pub fn new() -> Self {
        Self {
            order: OSBTreeSet::new(),
            slots: HashMap::new(),
            entries: Vec::new(),
            free: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.slots
            .get(key)
            .map(|&slot| occupied(&self.entries, slot))
    }

    pub fn get_key_value(&self, key: &[u8]) -> Option<(&[u8], &Entry)> {
        self.slots
            .get_key_value(key)
            .map(|(k, &slot)| (&**k, occupied(&self.entries, slot)))
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let slot = *self.slots.get(key)?;
        self.entries[slot as usize].as_mut()
    }

    /// `key` as the index holds it (to share its bytes) and its entry.
    pub fn shared_mut(&mut self, key: &[u8]) -> Option<(Arc<[u8]>, &mut Entry)> {
        let (held, &slot) = self.slots.get_key_value(key)?;
        Some((held.clone(), self.entries[slot as usize].as_mut()?))
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.slots.contains_key(key)
    }

    /// Sets `key`'s entry; returns the key as the index holds it (so that others can share its
    /// bytes) and the entry it replaces.
    pub fn insert(&mut self, key: &[u8], entry: Entry) -> (Arc<[u8]>, Option<Entry>) {
        if let Some((held, &slot)) = self.slots.get_key_value(key) {
            return (held.clone(), self.entries[slot as usize].replace(entry));
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.entries[slot as usize] = Some(entry);
                slot
            }
            None => {
                let slot = u32::try_from(self.entries.len())
                    .expect("fewer than 2^32 live keys in one index");
                self.entries.push(Some(entry));
                slot
            }
        };
        let key: Arc<[u8]> = Arc::from(key);
        self.order.insert(Slotted {
            key: OrderedKey::new(key.clone()),
            slot,
        });
        self.slots.insert(key.clone(), slot);
        (key, None)
    }

    /// Removes `key`; returns the key's bytes as the index held them, and its entry.
    pub fn remove(&mut self, key: &[u8]) -> Option<(Arc<[u8]>, Entry)> {
        let (held, slot) = self.slots.remove_entry(key)?;
        self.order.remove(key);
        self.free.push(slot);
        let entry = self.entries[slot as usize].take()?;
        Some((held, entry))
    }

    /// The keys within `bounds`, with their entries, in key order.
    pub fn range<'a>(&'a self, bounds: (Bound<&'a [u8]>, Bound<&'a [u8]>)) -> Walk<'a> {
        let entries = &self.entries;
        Box::new(
            self.order
                .range::<[u8], _>(bounds)
                .map(move |item| (item.key.bytes(), occupied(entries, item.slot))),
        )
    }

    /// Calls `visit` on the keys after `from`, in key order, with their entries, until it
    /// returns `false`.
    pub fn walk_mut(
        &mut self,
        from: Bound<&[u8]>,
        mut visit: impl FnMut(&[u8], &mut Entry) -> bool,
    ) {
        let Keys { order, entries, .. } = self;
        for item in order.range::<[u8], _>((from, Bound::Unbounded)) {
            if let Some(entry) = entries[item.slot as usize].as_mut()
                && !visit(item.key.bytes(), entry)
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
            Some(first) => self.order.rank_of(first.key.bytes()).unwrap_or(self.len()),
            None => self.len(),
        }
    }
}
