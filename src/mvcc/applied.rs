//! The applied index: every live key as of the newest revision this process has applied, with
//! its metadata and, within a memory budget, its value, so that reads of the current revision
//! are answered from memory instead of SQL.
//!
//! It is fed by the watch hub's publish step, the one place where this process takes in the
//! log's revisions in order (the writer's hand-over for its own commits, the tailer for the rest;
//! [`crate::watch`]). Reads and watches therefore share one source and one order.
//!
//! # Invariants
//! - **In order, whole revisions.** [`Applied::apply`] takes `(after, through]` only if the index
//!   is at `after`, with every row of those revisions; otherwise it changes nothing. So at
//!   revision R the index holds exactly the keys the log has live at R, each with the metadata
//!   of its newest row at or below R.
//! - **A value is its row's.** A key's value, when held, is the value of the row its metadata
//!   names (`mod_revision`): it is set with that row, or filled in later only while the entry
//!   still names the row it was read for ([`Applied::fill`]), and dropped when the key is
//!   written again. A missing value is only ever a miss, to be read by primary key.
//! - **Bounded values.** Values held stay within the budget, apart from the ones just taken in:
//!   each apply or fill evicts (a clock sweep over the keys, sparing once each value read since
//!   the hand last passed) until the total is back within it. Metadata is never evicted.
//! - **A window of history.** The index keeps the state each of its most recent changes
//!   replaced (bounded in number and in the bytes of values they keep), so a read at a revision
//!   R it has passed undoes the changes after R: R must be at or above the floor, the newest
//!   revision of a change it has forgotten; below it, [`View::at`] answers nothing.
//! - **Only durable revisions.** Its publishers hand over a batch only once it is durable, and
//!   after the store published its revisions; so the index's revision is never above the store's
//!   published current revision, and a read served at it never shows what a later read could
//!   miss.
//! - **One revision per read.** A reader holds the read lock for all it takes from the index, so
//!   its keys, values and counts are those of one revision, which it reports in its header.
//! - **Fed or unused.** Until a publisher is installed ([`Applied::feed`]) nothing moves it: the
//!   store then never serves from it. If it ever sees a gap, it stops serving reads for good
//!   (logged): an index that might be wrong is never read.

use std::cmp::Ordering as KeyOrder;
use std::collections::{BTreeMap, VecDeque};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::watch;
use wabi_tree::OSBTreeMap;

use crate::backend::{LogRow, RangeEnd};

use super::index::KeyMeta;
use super::types::{KeyRange, KeyValue};

/// Bytes counted for a held value beyond its own length (the shared allocation's header).
const VALUE_OVERHEAD: usize = 16;
/// The share of the value budget the history's values may hold (they are old versions, kept
/// beside the budget's current ones).
const HISTORY_SHARE: usize = 4;

/// A handle to the applied index; cheap to clone.
#[derive(Clone)]
pub struct Applied {
    inner: Arc<Inner>,
}

struct Inner {
    state: RwLock<State>,
    /// The index's revision, changed only under the state's write lock; readers waiting until
    /// it reaches theirs subscribe to it.
    revision: watch::Sender<i64>,
    /// Set once a publisher feeds the index.
    fed: AtomicBool,
    /// Set if the index ever saw revisions out of order; it is then never read again.
    broken: AtomicBool,
}

/// One live key.
pub(crate) struct Entry {
    pub meta: KeyMeta,
    value: Option<Arc<[u8]>>,
    /// Set when a read takes the value; the clock hand clears it and spares the value once.
    referenced: AtomicBool,
}

impl Entry {
    fn new(meta: KeyMeta, value: Option<Arc<[u8]>>) -> Self {
        Self {
            meta,
            value,
            referenced: AtomicBool::new(false),
        }
    }

    /// The key's value at `meta.mod_revision`, if held.
    pub fn value(&self) -> Option<&Arc<[u8]>> {
        let value = self.value.as_ref()?;
        self.referenced.store(true, Ordering::Relaxed);
        Some(value)
    }
}

fn cost(value: &[u8]) -> usize {
    value.len() + VALUE_OVERHEAD
}

/// An order-statistic B-tree: besides the key order it knows each key's rank, so a range's
/// count is two descents, O(log n), however many keys it holds.
type Keys = OSBTreeMap<Vec<u8>, Entry>;

/// How many keys sort before `bound`.
fn rank(keys: &Keys, bound: &[u8]) -> usize {
    match keys
        .range::<[u8], _>((Bound::Included(bound), Bound::Unbounded))
        .next()
    {
        Some((first, _)) => keys.rank_of(first.as_slice()).unwrap_or(keys.len()),
        None => keys.len(),
    }
}

/// One version of a key as the index knew it.
struct Version {
    meta: KeyMeta,
    value: Option<Arc<[u8]>>,
}

/// A change, with the version it replaced (`None`: the key did not exist).
struct Change {
    revision: i64,
    key: Vec<u8>,
    before: Option<Version>,
}

/// A key as a read sees it: its metadata, and its value if the index holds it.
pub(crate) struct Item<'a> {
    pub key: &'a [u8],
    pub meta: KeyMeta,
    pub value: Option<&'a Arc<[u8]>>,
}

impl<'a> Item<'a> {
    fn now(key: &'a Vec<u8>, entry: &'a Entry) -> Self {
        Item {
            key,
            meta: entry.meta,
            value: entry.value(),
        }
    }
}

struct State {
    keys: Keys,
    /// What the held values cost, by [`cost`].
    value_bytes: usize,
    budget: usize,
    /// The key the clock hand stopped at; the next sweep starts after it (`None`: at the start).
    hand: Option<Vec<u8>>,
    /// The most recent changes, in revision order.
    history: VecDeque<Change>,
    /// What the values `history` keeps cost.
    history_bytes: usize,
    history_limit: usize,
    /// The oldest revision reads can be taken back to: every change after it is in `history`.
    floor: i64,
}

impl State {
    /// Records that `key` changes at `revision`, with the version it has until then.
    fn remember(&mut self, revision: i64, key: &[u8]) {
        let before = self.keys.get(key).map(|entry| Version {
            meta: entry.meta,
            value: entry.value.clone(),
        });
        if let Some(value) = before.as_ref().and_then(|v| v.value.as_ref()) {
            self.history_bytes += cost(value);
        }
        self.history.push_back(Change {
            revision,
            key: key.to_vec(),
            before,
        });
    }

    /// Forgets the oldest changes beyond the history's bounds, raising the floor past them.
    fn trim_history(&mut self) {
        let byte_limit = self.budget / HISTORY_SHARE;
        while self.history.len() > self.history_limit || self.history_bytes > byte_limit {
            let Some(change) = self.history.pop_front() else {
                break;
            };
            if let Some(value) = change.before.as_ref().and_then(|v| v.value.as_ref()) {
                self.history_bytes -= cost(value);
            }
            self.floor = self.floor.max(change.revision);
        }
    }

    fn set(&mut self, key: Vec<u8>, entry: Entry) {
        if let Some(value) = &entry.value {
            self.value_bytes += cost(value);
        }
        if let Some(old) = self.keys.insert(key, entry) {
            self.release(&old);
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(old) = self.keys.remove(key) {
            self.release(&old);
        }
    }

    fn release(&mut self, old: &Entry) {
        if let Some(value) = &old.value {
            self.value_bytes -= cost(value);
        }
    }

    /// Whether a value of this size may be held at all: one larger than the whole budget
    /// would only push out everything else.
    fn admits(&self, value: &[u8]) -> bool {
        cost(value) <= self.budget
    }

    /// Drops values, clock-wise, until they fit the budget again.
    fn evict(&mut self) {
        let State {
            keys,
            value_bytes,
            budget,
            hand,
            ..
        } = self;
        // A turn that drops nothing clears the references it passes; after a partial turn and
        // a whole one, a third finds a value to drop unless none is held.
        let mut empty_turns = 0;
        while *value_bytes > *budget && empty_turns < 3 {
            let from = hand.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let mut stopped = None;
            let mut dropped = false;
            for (key, entry) in keys.range_mut::<[u8], _>((from, Bound::Unbounded)) {
                if entry.value.is_none() || entry.referenced.swap(false, Ordering::Relaxed) {
                    continue;
                }
                if let Some(value) = entry.value.take() {
                    *value_bytes -= cost(&value);
                    dropped = true;
                }
                if *value_bytes <= *budget {
                    stopped = Some(key.clone());
                    break;
                }
            }
            if stopped.is_none() && !dropped {
                empty_turns += 1;
            } else {
                empty_turns = 0;
            }
            *hand = stopped;
        }
    }
}

/// The index as of one revision, held for the length of one read.
pub(crate) struct View<'a> {
    state: RwLockReadGuard<'a, State>,
    revision: i64,
}

impl Applied {
    /// An index of the live keys among `heads` (the newest row of every key) at `revision`,
    /// holding values of up to `value_budget` bytes in all, and the prior state of up to
    /// `history` recent changes. The heads' values are not held: reads fill them in as they
    /// need them.
    pub(crate) fn load<'a>(
        heads: impl IntoIterator<Item = &'a LogRow>,
        revision: i64,
        value_budget: usize,
        history: usize,
    ) -> Self {
        let keys = heads
            .into_iter()
            .filter(|row| !row.deleted)
            .map(|row| (row.key.clone(), Entry::new(KeyMeta::of(row), None)))
            .collect();
        let (revision_tx, _) = watch::channel(revision);
        Self {
            inner: Arc::new(Inner {
                state: RwLock::new(State {
                    keys,
                    value_bytes: 0,
                    budget: value_budget,
                    hand: None,
                    history: VecDeque::new(),
                    history_bytes: 0,
                    history_limit: history,
                    floor: revision,
                }),
                revision: revision_tx,
                fed: AtomicBool::new(false),
                broken: AtomicBool::new(false),
            }),
        }
    }

    /// The revision the index is at.
    pub fn revision(&self) -> i64 {
        *self.inner.revision.borrow()
    }

    /// Marks the index as fed by a publisher of every revision from now on.
    pub fn feed(&self) {
        self.inner.fed.store(true, Ordering::Release);
    }

    /// Whether reads may be served from the index.
    pub(crate) fn serving(&self) -> bool {
        self.inner.fed.load(Ordering::Acquire) && !self.inner.broken.load(Ordering::Acquire)
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.inner
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies the changes of the revisions `(after, through]`, in log order, if the index is
    /// at `after`; returns whether it did. A change is a key as a put left it, or a deleted key
    /// (`true`; only its key is read).
    pub fn apply<'a>(
        &self,
        after: i64,
        through: i64,
        changes: impl IntoIterator<Item = (&'a KeyValue, bool)>,
    ) -> bool {
        let mut state = self.write();
        let at = self.revision();
        if at != after {
            if at < after && !self.inner.broken.swap(true, Ordering::AcqRel) {
                tracing::error!(
                    index = at,
                    after,
                    "the applied index missed revisions; reads no longer use it"
                );
            }
            return false;
        }
        for (kv, deleted) in changes {
            state.remember(kv.mod_revision, &kv.key);
            if deleted {
                state.remove(&kv.key);
                continue;
            }
            let meta = KeyMeta {
                mod_revision: kv.mod_revision,
                create_revision: kv.create_revision,
                version: kv.version,
                lease: kv.lease,
                deleted: false,
            };
            let value = state
                .admits(&kv.value)
                .then(|| Arc::from(kv.value.as_slice()));
            state.set(kv.key.clone(), Entry::new(meta, value));
        }
        state.trim_history();
        state.evict();
        // Under the write lock, so a view's revision is always its state's, and announcements
        // never run backward.
        self.inner.revision.send_replace(through);
        true
    }

    /// Holds values read from the log for keys whose values the index lacked: each is
    /// `(key, mod_revision, value)`, and is taken only if the key's entry still names that row.
    pub(crate) fn fill<'a>(&self, values: impl IntoIterator<Item = (&'a [u8], i64, Arc<[u8]>)>) {
        let mut state = self.write();
        let mut added = 0;
        for (key, mod_revision, value) in values {
            if !state.admits(&value) {
                continue;
            }
            if let Some(entry) = state.keys.get_mut(key)
                && entry.meta.mod_revision == mod_revision
                && entry.value.is_none()
            {
                added += cost(&value);
                entry.value = Some(value);
            }
        }
        state.value_bytes += added;
        state.evict();
    }

    /// Waits until the index has reached `revision`; `false` if `timeout` passed first.
    pub(crate) async fn reached(&self, revision: i64, timeout: std::time::Duration) -> bool {
        if self.revision() >= revision {
            return true;
        }
        let mut rx = self.inner.revision.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|at| *at >= revision)).await,
            Ok(Ok(_))
        )
    }

    /// The index as it is now, until the view is dropped (which must be soon: it holds off
    /// every publish).
    pub(crate) fn view(&self) -> View<'_> {
        let state = self
            .inner
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        View {
            state,
            revision: self.revision(),
        }
    }

    /// The oldest revision reads can be answered at (see [`View::at`]).
    pub(crate) fn floor(&self) -> i64 {
        self.view().state.floor
    }

    /// How many keys the index holds, and what their held values cost in bytes.
    pub fn size(&self) -> (usize, usize) {
        let view = self.view();
        (view.state.keys.len(), view.state.value_bytes)
    }
}

impl View<'_> {
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The live keys of `range`, in key order.
    pub fn range<'a>(&'a self, range: &'a KeyRange) -> Live<'a> {
        let keys = &self.state.keys;
        let start = Bound::Included(range.key.as_slice());
        match &range.end {
            RangeEnd::Single => Box::new(keys.get_key_value(range.key.as_slice()).into_iter()),
            // A reversed range holds nothing (and is no range to the tree).
            _ if range.is_empty() => Box::new(std::iter::empty()),
            RangeEnd::Unbounded => Box::new(keys.range::<[u8], _>((start, Bound::Unbounded))),
            RangeEnd::Before(end) => {
                Box::new(keys.range::<[u8], _>((start, Bound::Excluded(end.as_slice()))))
            }
        }
    }

    /// The keys `range` held at `revision` (at or below the view's): how many, and each key's
    /// version then, in key order. `None` if `revision` is below the floor or above the view.
    pub fn at<'a>(
        &'a self,
        range: &'a KeyRange,
        revision: i64,
    ) -> Option<(i64, Box<dyn Iterator<Item = Item<'a>> + 'a>)> {
        if revision == self.revision {
            let items = self.range(range).map(|(key, entry)| Item::now(key, entry));
            return Some((self.count(range), Box::new(items)));
        }
        if revision < self.state.floor || revision > self.revision {
            return None;
        }
        let history = &self.state.history;
        let later = history.partition_point(|change| change.revision <= revision);
        // Each key changed since: its version then is what its first later change replaced.
        let mut then: BTreeMap<&[u8], Option<&Version>> = BTreeMap::new();
        for change in history.range(later..) {
            if range.contains(&change.key) {
                then.entry(change.key.as_slice())
                    .or_insert(change.before.as_ref());
            }
        }
        let mut count = self.count(range);
        for (key, version) in &then {
            count += i64::from(version.is_some()) - i64::from(self.state.keys.contains_key(*key));
        }
        let items = Undone {
            now: self.range(range).peekable(),
            then: then.into_iter().peekable(),
        };
        Some((count, Box::new(items)))
    }

    /// How many live keys `range` holds, without visiting them.
    pub fn count(&self, range: &KeyRange) -> i64 {
        let keys = &self.state.keys;
        let n = match &range.end {
            RangeEnd::Single => usize::from(keys.contains_key(range.key.as_slice())),
            _ if range.is_empty() => 0,
            RangeEnd::Unbounded => keys.len() - rank(keys, &range.key),
            RangeEnd::Before(end) => rank(keys, end) - rank(keys, &range.key),
        };
        n as i64
    }
}

/// The live keys of a range, in key order.
type Live<'a> = Box<dyn Iterator<Item = (&'a Vec<u8>, &'a Entry)> + 'a>;

/// The keys of a range now, with the keys changed since some revision put back as they were.
struct Undone<'a> {
    now: Peekable<Live<'a>>,
    then: Peekable<std::collections::btree_map::IntoIter<&'a [u8], Option<&'a Version>>>,
}

impl<'a> Iterator for Undone<'a> {
    type Item = Item<'a>;

    fn next(&mut self) -> Option<Item<'a>> {
        loop {
            let order = match (self.now.peek(), self.then.peek()) {
                (None, None) => return None,
                (Some(_), None) => KeyOrder::Less,
                (None, Some(_)) => KeyOrder::Greater,
                (Some((now, _)), Some((then, _))) => now.as_slice().cmp(*then),
            };
            match order {
                KeyOrder::Less => {
                    let (key, entry) = self.now.next()?;
                    return Some(Item::now(key, entry));
                }
                // Changed since: its version then replaces the one now.
                KeyOrder::Equal => {
                    self.now.next();
                }
                KeyOrder::Greater => {}
            }
            let (key, version) = self.then.next()?;
            if let Some(version) = version {
                return Some(Item {
                    key,
                    meta: version.meta,
                    value: version.value.as_ref(),
                });
            }
            // Absent then (created since): nothing to yield.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, revision: i64, deleted: bool) -> LogRow {
        put(key, revision, deleted, "")
    }

    fn put(key: &str, revision: i64, deleted: bool, value: &str) -> LogRow {
        LogRow {
            revision,
            sub: 0,
            key: key.as_bytes().to_vec(),
            created: !deleted,
            deleted,
            create_revision: revision,
            prev_revision: 0,
            version: 1,
            lease: 0,
            value: value.as_bytes().to_vec(),
            old_value: None,
            old_lease: 0,
        }
    }

    fn apply(applied: &Applied, after: i64, through: i64, rows: &[LogRow]) -> bool {
        let kvs: Vec<_> = rows
            .iter()
            .map(|row| (KeyValue::from_row(row.clone()), row.deleted))
            .collect();
        applied.apply(
            after,
            through,
            kvs.iter().map(|(kv, deleted)| (kv, *deleted)),
        )
    }

    fn keys(applied: &Applied, range: &KeyRange) -> Vec<String> {
        let view = applied.view();
        view.range(range)
            .map(|(key, _)| String::from_utf8_lossy(key).into_owned())
            .collect()
    }

    #[test]
    fn applies_whole_revisions_in_order_only() {
        let applied = Applied::load(&[row("a", 2, false), row("b", 3, true)], 3, 0, 100);
        let all = KeyRange::from_etcd(b"a".to_vec(), vec![0]);
        assert_eq!(keys(&applied, &all), ["a"]);
        applied.feed();
        assert!(applied.serving());

        assert!(apply(
            &applied,
            3,
            5,
            &[row("b", 4, false), row("a", 5, true)]
        ));
        assert_eq!(keys(&applied, &all), ["b"]);
        assert_eq!(applied.revision(), 5);
        // A range already applied is refused and changes nothing.
        assert!(!apply(&applied, 3, 5, &[row("c", 4, false)]));
        assert_eq!(keys(&applied, &all), ["b"]);
        assert!(applied.serving());
        // A gap is refused, and the index stops serving.
        assert!(!apply(&applied, 6, 7, &[row("c", 7, false)]));
        assert_eq!(applied.revision(), 5);
        assert!(!applied.serving());
    }

    #[test]
    fn counts_ranges() {
        let applied = Applied::load(
            &[
                row("a/1", 2, false),
                row("a/2", 3, false),
                row("b", 4, false),
            ],
            4,
            0,
            100,
        );
        let view = applied.view();
        assert_eq!(
            view.count(&KeyRange::from_etcd(b"a/".to_vec(), b"a0".to_vec())),
            2
        );
        assert_eq!(view.count(&KeyRange::single(b"b".to_vec())), 1);
        assert_eq!(view.count(&KeyRange::single(b"c".to_vec())), 0);
        // Bounds that are not keys themselves, on both sides.
        assert_eq!(
            view.count(&KeyRange::from_etcd(b"a".to_vec(), b"a/2".to_vec())),
            1
        );
        assert_eq!(
            view.count(&KeyRange::from_etcd(b"a/1\0".to_vec(), vec![0])),
            2
        );
        assert_eq!(view.count(&KeyRange::from_etcd(b"c".to_vec(), vec![0])), 0);
        assert_eq!(
            view.count(&KeyRange::from_etcd(b"\0".to_vec(), b"zz".to_vec())),
            3
        );
        assert_eq!(
            view.count(&KeyRange::from_etcd(b"b".to_vec(), b"a".to_vec())),
            0
        );
        assert_eq!(view.revision(), 4);
    }

    #[tokio::test]
    async fn readers_wait_for_their_revision() {
        let applied = Applied::load(&[], 1, 0, 100);
        let short = std::time::Duration::from_millis(20);
        assert!(applied.reached(1, short).await);
        assert!(!applied.reached(2, short).await);
        let later = applied.clone();
        let waiter =
            tokio::spawn(async move { later.reached(3, std::time::Duration::from_secs(30)).await });
        assert!(apply(
            &applied,
            1,
            3,
            &[row("k", 2, false), row("k", 3, false)]
        ));
        assert!(waiter.await.expect("the waiter runs"));
    }

    /// The held value of every key, `None` where it is missing.
    fn values(applied: &Applied) -> Vec<(String, Option<String>)> {
        let view = applied.view();
        let all = KeyRange::from_etcd(b"\0".to_vec(), vec![0]);
        view.range(&all)
            .map(|(key, entry)| {
                (
                    String::from_utf8_lossy(key).into_owned(),
                    entry
                        .value
                        .as_ref()
                        .map(|v| String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect()
    }

    fn held(pairs: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    #[test]
    fn values_follow_their_rows_within_the_budget() {
        // Room for two 4-byte values.
        let applied = Applied::load(&[], 1, 2 * cost(b"aaaa"), 100);
        assert!(apply(
            &applied,
            1,
            3,
            &[put("a", 2, false, "a-v1"), put("b", 3, false, "b-v1")]
        ));
        assert_eq!(
            values(&applied),
            held(&[("a", Some("a-v1")), ("b", Some("b-v1"))])
        );
        // A rewrite replaces the value; a delete drops it with the key.
        assert!(apply(
            &applied,
            3,
            5,
            &[put("a", 4, false, "a-v2"), row("b", 5, true)]
        ));
        assert_eq!(values(&applied), held(&[("a", Some("a-v2"))]));
        assert_eq!(applied.size(), (1, cost(b"a-v2")));
        // A third value overflows: the hand drops one, and the total fits again.
        assert!(apply(
            &applied,
            5,
            7,
            &[put("c", 6, false, "c-v1"), put("d", 7, false, "d-v1")]
        ));
        assert_eq!(applied.size(), (3, 2 * cost(b"aaaa")));
        assert_eq!(
            values(&applied).iter().filter(|(_, v)| v.is_none()).count(),
            1
        );
        // A value larger than the whole budget is never held.
        assert!(apply(
            &applied,
            7,
            8,
            &[put("e", 8, false, "longer than the whole budget allows")]
        ));
        assert_eq!(values(&applied).last(), Some(&("e".to_string(), None)));
        assert_eq!(applied.size().1, 2 * cost(b"aaaa"));
    }

    #[test]
    fn a_value_read_since_the_hand_passed_is_spared_once() {
        let applied = Applied::load(&[], 1, 2 * cost(b"aaaa"), 100);
        assert!(apply(
            &applied,
            1,
            3,
            &[put("a", 2, false, "a-v1"), put("b", 3, false, "b-v1")]
        ));
        {
            let view = applied.view();
            let a = KeyRange::single(b"a".to_vec());
            let (_, entry) = view.range(&a).next().expect("a is live");
            assert!(entry.value().is_some());
        }
        assert!(apply(&applied, 3, 4, &[put("c", 4, false, "c-v1")]));
        assert_eq!(
            values(&applied),
            held(&[("a", Some("a-v1")), ("b", None), ("c", Some("c-v1"))])
        );
    }

    #[test]
    fn a_fill_takes_only_the_value_of_the_row_the_key_still_has() {
        let applied = Applied::load(
            &[row("a", 2, false), row("b", 3, false), row("c", 4, false)],
            4,
            1 << 20,
            100,
        );
        assert_eq!(
            values(&applied),
            held(&[("a", None), ("b", None), ("c", None)])
        );
        applied.fill([
            (&b"a"[..], 2, Arc::from(&b"a-v1"[..])),
            // Not b's row: b was read at another revision.
            (&b"b"[..], 9, Arc::from(&b"b-old"[..])),
            (&b"x"[..], 2, Arc::from(&b"absent"[..])),
        ]);
        assert_eq!(
            values(&applied),
            held(&[("a", Some("a-v1")), ("b", None), ("c", None)])
        );
        assert_eq!(applied.size(), (3, cost(b"a-v1")));
    }

    #[test]
    fn counts_and_past_revisions_match_a_model() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let name = |rng: &mut rand::rngs::StdRng| {
            let len = rng.random_range(1..4);
            (0..len)
                .map(|_| rng.random_range(b'a'..=b'e'))
                .collect::<Vec<u8>>()
        };
        let applied = Applied::load(&[], 1, 1 << 20, 300);
        // The live keys with their mod revisions: `model[r - 1]` is revision r.
        let mut model: Vec<BTreeMap<Vec<u8>, i64>> = vec![BTreeMap::new()];
        let mut answered_in_the_past = 0;
        for revision in 1..2000 {
            let key = name(&mut rng);
            let deleted = rng.random_range(0..3) == 0;
            let text = String::from_utf8(key.clone()).expect("ascii");
            assert!(apply(
                &applied,
                revision,
                revision + 1,
                &[put(&text, revision + 1, deleted, "v")]
            ));
            let mut next = model.last().expect("a first revision").clone();
            if deleted {
                next.remove(&key);
            } else {
                next.insert(key, revision + 1);
            }
            model.push(next);

            let view = applied.view();
            let (from, to) = (name(&mut rng), name(&mut rng));
            let past = rng.random_range(1..=revision + 1);
            for range in [
                KeyRange::from_etcd(from.clone(), to.clone()),
                KeyRange::from_etcd(from.clone(), vec![0]),
                KeyRange::single(from.clone()),
            ] {
                assert_eq!(
                    view.count(&range),
                    view.range(&range).count() as i64,
                    "{range:?}"
                );
                let expected: Vec<(Vec<u8>, i64)> = model[(past - 1) as usize]
                    .iter()
                    .filter(|(k, _)| range.contains(k))
                    .map(|(k, r)| (k.clone(), *r))
                    .collect();
                match view.at(&range, past) {
                    Some((count, items)) => {
                        let got: Vec<(Vec<u8>, i64)> = items
                            .map(|item| (item.key.to_vec(), item.meta.mod_revision))
                            .collect();
                        assert_eq!(got, expected, "{range:?} at {past} of {}", revision + 1);
                        assert_eq!(count, expected.len() as i64, "{range:?} at {past}");
                        answered_in_the_past += usize::from(past <= revision);
                    }
                    None => assert!(past < view.state.floor, "{past} is above the floor"),
                }
            }
        }
        // The window moved on: the floor rose, and reads above it were answered.
        assert!(applied.floor() > 1500, "floor {}", applied.floor());
        assert!(answered_in_the_past > 100, "{answered_in_the_past}");
    }
}
