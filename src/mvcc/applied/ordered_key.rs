//! A key as the applied index's ordered set holds it: its first bytes copied inline beside the
//! shared allocation that holds all of them.
//!
//! Inserting into an ordered set compares the new key with about twenty others on the way
//! down, and each of those keys' bytes lives elsewhere on the heap: once the set outgrows the
//! caches, each comparison waits for memory. Midway through 300,000 creates, the applied
//! index's ordered insert took 8% of the server's CPU (`perf`), more than half of it in `memcmp`
//! reaching those keys. With the head inline, a comparison between keys whose first [`HEAD`]
//! bytes differ stays within the set's own node: the insert fell to 3.5%, and a create costs 4%
//! less server CPU over 100,000 creates (BENCHMARKS.md). The writer's index, a B-tree with small
//! nodes, gained nothing measurable from it, and keeps plain keys: the head costs memory (40
//! bytes a key, more with the nodes' slack).
//!
//! # Invariant
//! The order is exactly that of the keys' bytes (`[u8]`'s order), so a lookup of the set by a
//! borrowed `[u8]` (the set's entries borrow as their key's bytes) finds what an insert placed. Heads are the keys' first bytes padded with zeros; the
//! first position where two heads differ decides, and agrees with the keys' own order there:
//! either both keys have a byte at that position, or the key that ends before it is a prefix of
//! the other (a zero of padding is below any byte but an actual zero, which pads the same). Equal
//! heads say nothing, and the whole keys are compared.

use std::cmp::Ordering;
use std::sync::Arc;

/// Bytes of each key kept inline: enough to get past the shared prefix of most Kubernetes
/// keys (`/registry/<resource>/<namespace>/`) into the object's name.
const HEAD: usize = 40;
const WORDS: usize = HEAD / 8;

#[derive(Clone)]
pub(super) struct OrderedKey {
    /// The key's first [`HEAD`] bytes, zero-padded, as big-endian words: comparing the words in
    /// order compares the bytes in order.
    head: [u64; WORDS],
    key: Arc<[u8]>,
}

impl OrderedKey {
    pub fn new(key: Arc<[u8]>) -> Self {
        let mut bytes = [0u8; HEAD];
        let n = key.len().min(HEAD);
        bytes[..n].copy_from_slice(&key[..n]);
        let mut head = [0u64; WORDS];
        for (word, chunk) in head.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *word = u64::from_be_bytes(b);
        }
        Self { head, key }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.key
    }
}

impl PartialEq for OrderedKey {
    fn eq(&self, other: &Self) -> bool {
        self.head == other.head && self.key == other.key
    }
}

impl Eq for OrderedKey {}

impl PartialOrd for OrderedKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.head
            .cmp(&other.head)
            .then_with(|| self.key.cmp(&other.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered(key: &[u8]) -> OrderedKey {
        OrderedKey::new(Arc::from(key))
    }

    /// The order must be the bytes' own, or lookups by `[u8]` would miss keys.
    #[test]
    fn orders_exactly_as_the_bytes() {
        let long = |tail: &[u8]| {
            let mut k = vec![b'/'; HEAD];
            k.extend_from_slice(tail);
            k
        };
        let keys: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![0, 1],
            vec![1],
            b"a".to_vec(),
            b"a\0".to_vec(),
            b"a\0\0".to_vec(),
            b"ab".to_vec(),
            vec![0xff; 3],
            vec![0xff; HEAD],
            vec![0xff; HEAD + 1],
            long(b""),
            long(b"\0"),
            long(b"a"),
            long(b"b"),
            long(b"ba"),
            b"/registry/configmaps/ns-1/cm-0000001".to_vec(),
            b"/registry/configmaps/ns-1/cm-0000011".to_vec(),
            b"/registry/configmaps/ns-10/cm-0000010".to_vec(),
        ];
        for a in &keys {
            for b in &keys {
                let (x, y) = (ordered(a), ordered(b));
                assert_eq!(
                    x.cmp(&y),
                    a.as_slice().cmp(b.as_slice()),
                    "{a:?} against {b:?}"
                );
                assert_eq!(x == y, a == b, "{a:?} against {b:?}");
            }
        }
    }
}
