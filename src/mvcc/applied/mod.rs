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
//! - **A window of history.** The index keeps the state each of its recent changes replaced, so
//!   a read at a revision R it has passed undoes the changes after R: R must be at or above the
//!   floor, the newest revision of a change it has forgotten; below it, [`View::at`] answers
//!   nothing. It forgets a change only when the window holds more than its number of changes
//!   or when this process compacts past it ([`Applied::forget_through`]), not for the bytes of
//!   the values the changes replaced: past their share of the budget the oldest of those
//!   values are dropped, and a read that needs one reads it by primary key, as it does a
//!   current value the budget left out. A process that starts takes the window from the log
//!   ([`Applied::remember_since`]), so a restart does not send the reads of the last revisions
//!   to SQL.
//! - **Each key's changes chained.** Every change in the window names the same key's previous
//!   change, and a key's newest change is named by its live entry or, once deleted, by `gone`
//!   (which holds exactly the keys whose newest change in the window deleted them). A get at a
//!   past revision walks back through its key's own changes, as etcd's index walks a key's
//!   revisions, not through every change since.
//! - **Each lease's keys.** The keys under each lease are kept beside the keys, changed with
//!   them ([`LeasedKeys`]), so TimeToLive lists a lease's keys, now or at a revision in the
//!   window, without SQL. A change in the window shares its key's bytes with the live keys.
//! - **Only durable revisions.** Its publishers hand over a batch only once it is durable, and
//!   after the store published its revisions; so the index's revision is never above the store's
//!   published current revision, and a read served at it never shows what a later read could
//!   miss.
//! - **One revision per read.** A reader holds the read lock for all it takes from the index, so
//!   its keys, values and counts are those of one revision, which it reports in its header.
//! - **Reset past a fence.** After a failover lost revisions ([`crate::mvcc`]'s fence) the
//!   hub replaces the whole index with the log's state at a revision above everything it held
//!   ([`Applied::reset`]); its history window starts again there.
//! - **Fed or unused.** Until a publisher is installed ([`Applied::feed`]) nothing moves it: the
//!   store then never serves from it. If it ever sees a gap, it stops serving reads for good
//!   (logged): an index that might be wrong is never read.

use std::cmp::Ordering as KeyOrder;
use std::collections::{HashMap, VecDeque};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::watch;

use crate::backend::{LogRow, RangeEnd};

use super::index::KeyMeta;
use super::leased::LeasedKeys;
use super::types::{KeyRange, KeyValue};
use keys::{Keys, Walk};

/// Bytes counted for a held value beyond its own length (the shared allocation's header).
const VALUE_OVERHEAD: usize = 16;
/// The share of the value budget the history's values may hold (they are old versions, kept
/// beside the budget's current ones).
const HISTORY_SHARE: usize = 4;
/// Changes a compaction forgets per hold of the write lock (see [`Applied::forget_through`]).
const FORGET_CHUNK: usize = 4096;

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
    /// The position of the key's newest change in the window (see [`Position`]).
    last_change: Position,
}

impl Entry {
    fn new(meta: KeyMeta, value: Option<Arc<[u8]>>) -> Self {
        Self {
            meta,
            value,
            referenced: AtomicBool::new(false),
            last_change: NO_CHANGE,
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

/// The live keys among `heads` (each key's newest row), with no values held, and the keys
/// under each lease.
fn live_keys<'a>(heads: impl IntoIterator<Item = &'a LogRow>) -> (Keys, LeasedKeys) {
    let mut keys = Keys::new();
    let mut leased = LeasedKeys::default();
    for row in heads.into_iter().filter(|row| !row.deleted) {
        let meta = KeyMeta::of(row);
        let (key, _) = keys.insert(&row.key, Entry::new(meta, None));
        leased.attach(&key, &meta);
    }
    (keys, leased)
}

/// One version of a key as the index knew it.
struct Version {
    meta: KeyMeta,
    value: Option<Arc<[u8]>>,
}

/// Where a change is in the window: how many changes the index took in before it, counting
/// from 1. A position below the oldest change's names a change the window has forgotten, so
/// positions never need renumbering as the window moves; [`NO_CHANGE`] is below them all.
type Position = u64;

/// "No change of this key in the window."
const NO_CHANGE: Position = 0;

/// A change, with the version it replaced (`None`: the key did not exist).
struct Change {
    revision: i64,
    /// The key's bytes, shared with the live keys while the key lives (an update in the window
    /// costs no copy of its key).
    key: Arc<[u8]>,
    before: Option<Version>,
    /// The same key's previous change, so a read of one key at a past revision walks back
    /// through that key's changes only.
    prev: Position,
    /// The change deleted the key.
    deleted: bool,
}

/// A key as a read sees it: its metadata, and its value if the index holds it.
pub(crate) struct Item<'a> {
    pub key: &'a [u8],
    pub meta: KeyMeta,
    pub value: Option<&'a Arc<[u8]>>,
}

impl<'a> Item<'a> {
    fn now(key: &'a [u8], entry: &'a Entry) -> Self {
        Item {
            key,
            meta: entry.meta,
            value: entry.value(),
        }
    }
}

struct State {
    keys: Keys,
    /// The keys each lease holds, among `keys`.
    leased: LeasedKeys,
    /// What the held values cost, by [`cost`].
    value_bytes: usize,
    budget: usize,
    /// The key the clock hand stopped at; the next sweep starts after it (`None`: at the start).
    hand: Option<Vec<u8>>,
    /// The most recent changes, in revision order.
    history: VecDeque<Change>,
    /// What the values `history` keeps cost.
    history_bytes: usize,
    /// The changes of `history` before this position hold no value any more: the oldest values
    /// are the first dropped.
    valued_from: usize,
    history_limit: usize,
    /// The oldest revision reads can be taken back to: every change after it is in `history`.
    floor: i64,
    /// The position of `history`'s first change.
    first_position: Position,
    /// The keys that are not live and whose newest change is in the window (a deletion), with
    /// its position: where a read of such a key at a past revision starts its walk back.
    gone: HashMap<Arc<[u8]>, Position>,
}

impl State {
    /// The position the next change takes.
    fn next_position(&self) -> Position {
        self.first_position + self.history.len() as Position
    }

    /// The change at `position`, if the window holds it.
    fn change_at(&self, position: Position) -> Option<&Change> {
        let index = position.checked_sub(self.first_position)?;
        self.history.get(usize::try_from(index).ok()?)
    }

    /// Takes in a put of `key` at `revision`, remembering the version it replaces.
    fn put(&mut self, revision: i64, key: &[u8], mut entry: Entry) {
        if let Some(value) = &entry.value {
            self.value_bytes += cost(value);
        }
        let meta = entry.meta;
        entry.last_change = self.next_position();
        let (key, old) = self.keys.insert(key, entry);
        let prev = match &old {
            Some(old) => {
                self.leased.detach(&key, &old.meta);
                old.last_change
            }
            // Created: deleted earlier in the window, or not changed in it at all.
            None if self.gone.is_empty() => NO_CHANGE,
            None => self.gone.remove(&key).unwrap_or(NO_CHANGE),
        };
        self.leased.attach(&key, &meta);
        self.replaced(revision, key, old, prev, false);
    }

    /// Takes in the deletion of `key` at `revision`, remembering the version it ends.
    fn delete(&mut self, revision: i64, key: &[u8]) {
        let position = self.next_position();
        match self.keys.remove(key) {
            Some((key, old)) => {
                self.leased.detach(&key, &old.meta);
                let prev = old.last_change;
                self.gone.insert(key.clone(), position);
                self.replaced(revision, key, Some(old), prev, true);
            }
            None => {
                let key = Arc::<[u8]>::from(key);
                let prev = self.gone.insert(key.clone(), position);
                self.replaced(revision, key, None, prev.unwrap_or(NO_CHANGE), true);
            }
        }
    }

    /// Records that the change at `revision` replaced `old` as `key`'s version (`None`: the
    /// key did not exist), following the key's change at `prev`. A value `old` held moves from
    /// the current values to the history's.
    fn replaced(
        &mut self,
        revision: i64,
        key: Arc<[u8]>,
        old: Option<Entry>,
        prev: Position,
        deleted: bool,
    ) {
        let before = old.map(|old| {
            if let Some(value) = &old.value {
                self.value_bytes -= cost(value);
                self.history_bytes += cost(value);
            }
            Version {
                meta: old.meta,
                value: old.value,
            }
        });
        self.history.push_back(Change {
            revision,
            key,
            before,
            prev,
            deleted,
        });
    }

    /// Forgets the oldest changes beyond the history's number, and drops the oldest of the
    /// values the rest replaced until those fit their share of the budget.
    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            self.forget_oldest();
        }
        let byte_limit = self.budget / HISTORY_SHARE;
        while self.history_bytes > byte_limit && self.valued_from < self.history.len() {
            let change = &mut self.history[self.valued_from];
            if let Some(value) = change.before.as_mut().and_then(|v| v.value.take()) {
                self.history_bytes -= cost(&value);
            }
            self.valued_from += 1;
        }
    }

    /// Forgets the oldest change, raising the floor to it; returns it, for the caller to drop
    /// when it likes.
    fn forget_oldest(&mut self) -> Option<Change> {
        let change = self.history.pop_front()?;
        let position = self.first_position;
        self.first_position += 1;
        if let Some(value) = change.before.as_ref().and_then(|v| v.value.as_ref()) {
            self.history_bytes -= cost(value);
        }
        if change.deleted && self.gone.get(&change.key) == Some(&position) {
            self.gone.remove(&change.key);
        }
        self.valued_from = self.valued_from.saturating_sub(1);
        self.floor = self.floor.max(change.revision);
        Some(change)
    }

    /// `key` as it was at `revision` (in the window): `None` if it did not exist. It walks
    /// back from the key's newest change through its own changes only.
    fn key_at<'a>(&'a self, key: &[u8], revision: i64) -> Option<Item<'a>> {
        let live = self.keys.get_key_value(key);
        let mut position = match live {
            Some((_, entry)) => entry.last_change,
            None => *self.gone.get(key)?,
        };
        // The version the first change after `revision` replaced; unchanged since: the live one.
        let mut then = None;
        while let Some(change) = self.change_at(position)
            && change.revision > revision
        {
            debug_assert_eq!(&*change.key, key, "a key's chain holds its own changes");
            then = Some((&*change.key, change.before.as_ref()));
            position = change.prev;
        }
        match then {
            None => live.map(|(key, entry)| Item::now(key, entry)),
            Some((key, version)) => version.map(|version| Item {
                key,
                meta: version.meta,
                value: version.value.as_ref(),
            }),
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
            keys.walk_mut(from, |key, entry| {
                if entry.value.is_none() || entry.referenced.swap(false, Ordering::Relaxed) {
                    return true;
                }
                if let Some(value) = entry.value.take() {
                    *value_bytes -= cost(&value);
                    dropped = true;
                }
                if *value_bytes <= *budget {
                    stopped = Some(key.to_vec());
                    return false;
                }
                true
            });
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
        let (keys, leased) = live_keys(heads);
        let (revision_tx, _) = watch::channel(revision);
        Self {
            inner: Arc::new(Inner {
                state: RwLock::new(State {
                    keys,
                    leased,
                    value_bytes: 0,
                    budget: value_budget,
                    hand: None,
                    history: VecDeque::new(),
                    history_bytes: 0,
                    valued_from: 0,
                    history_limit: history,
                    floor: revision,
                    first_position: NO_CHANGE + 1,
                    gone: HashMap::new(),
                }),
                revision: revision_tx,
                fed: AtomicBool::new(false),
                broken: AtomicBool::new(false),
            }),
        }
    }

    /// Takes in, as its window of history, the changes of `(after, revision]` that made the
    /// index's keys what they are (`rows`, in log order, values not needed), so that reads back
    /// to `after` are answered from memory from the start, not only once this process has seen
    /// changes go by. For a freshly loaded index only: it replaces the window.
    ///
    /// A row says what it replaced without the row before it ([`KeyMeta::replaced_by`]). The
    /// values replaced are not held: a read that needs one reads it by primary key.
    pub(crate) fn remember_since(&self, after: i64, rows: &[LogRow]) {
        let mut state = self.write();
        let state = &mut *state;
        // Positions after any the index gave out before, so no entry names one of these.
        state.first_position += state.history.len() as Position;
        // A live key's entry keeps its newest change so far; other keys are kept here.
        let mut not_live: HashMap<Arc<[u8]>, (Position, bool)> = HashMap::new();
        let mut history = VecDeque::with_capacity(rows.len());
        for (position, row) in (state.first_position..).zip(rows) {
            let (key, prev) = match state.keys.shared_mut(&row.key) {
                Some((key, entry)) => (key, std::mem::replace(&mut entry.last_change, position)),
                None => {
                    let key = match not_live.get_key_value(&*row.key) {
                        Some((key, _)) => key.clone(),
                        None => Arc::from(&*row.key),
                    };
                    let prev = not_live.insert(key.clone(), (position, row.deleted));
                    (key, prev.map_or(NO_CHANGE, |(position, _)| position))
                }
            };
            history.push_back(Change {
                revision: row.revision,
                key,
                before: KeyMeta::replaced_by(row)
                    .filter(|meta| meta.mod_revision > 0)
                    .map(|meta| Version { meta, value: None }),
                prev,
                deleted: row.deleted,
            });
        }
        state.gone = not_live
            .into_iter()
            .filter(|(_, (_, deleted))| *deleted)
            .map(|(key, (position, _))| (key, position))
            .collect();
        state.history = history;
        state.history_bytes = 0;
        state.valued_from = state.history.len();
        state.floor = after;
        state.trim_history();
    }

    /// Replaces everything the index holds with the live keys among `heads` at `revision`, a
    /// revision past every one it has taken in: the history it followed is not the database's
    /// any more (a failover lost its last revisions; see [`crate::mvcc`]'s fence). Its window
    /// of history starts afresh at `revision`.
    pub(crate) fn reset<'a>(&self, heads: impl IntoIterator<Item = &'a LogRow>, revision: i64) {
        let mut state = self.write();
        (state.keys, state.leased) = live_keys(heads);
        state.value_bytes = 0;
        state.hand = None;
        state.first_position += state.history.len() as Position;
        state.history.clear();
        state.gone.clear();
        state.history_bytes = 0;
        state.valued_from = 0;
        state.floor = revision;
        self.inner.revision.send_replace(revision);
    }

    /// The revision the index is at.
    pub fn revision(&self) -> i64 {
        *self.inner.revision.borrow()
    }

    /// Tells each revision the index moves to.
    pub(crate) fn subscribe(&self) -> watch::Receiver<i64> {
        self.inner.revision.subscribe()
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
            if deleted {
                state.delete(kv.mod_revision, &kv.key);
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
            state.put(kv.mod_revision, &kv.key, Entry::new(meta, value));
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

    /// Forgets the changes at or below `compact`, the revision this process compacted the log
    /// to: no read below it is answered any more, and the reads at or above it need only the
    /// changes after it. (Other processes' compactions are not told here; their changes leave
    /// the window by its number.)
    ///
    /// A compaction can forget a million changes. Dropping them (a key's reference count and
    /// an old value each, scattered over the heap) took 100 ms, and under the write lock every
    /// publish, and so every write's answer, waited for it: they are taken out a chunk at a
    /// time and dropped after the lock is released. Blocking: run it off the async workers.
    pub(crate) fn forget_through(&self, compact: i64) {
        loop {
            let mut forgotten = Vec::with_capacity(FORGET_CHUNK);
            let mut state = self.write();
            while forgotten.len() < FORGET_CHUNK
                && state.history.front().is_some_and(|c| c.revision <= compact)
            {
                forgotten.extend(state.forget_oldest());
            }
            drop(state);
            // A chunk that is not full found nothing more to forget.
            if forgotten.len() < FORGET_CHUNK {
                return;
            }
        }
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

    /// The value of the row `(key, revision)`, if that row is the key's live one here and its
    /// value is held.
    pub(crate) fn value_at(&self, key: &[u8], revision: i64) -> Option<Vec<u8>> {
        let view = self.view();
        let entry = view.state.keys.get(key)?;
        if entry.meta.mod_revision != revision {
            return None;
        }
        entry.value().map(|value| value.to_vec())
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
    pub fn range<'a>(&'a self, range: &'a KeyRange) -> Walk<'a> {
        match range.bounds() {
            Some(bounds) => self.state.keys.range(bounds),
            None => Box::new(std::iter::empty()),
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
            if range.end == RangeEnd::Single {
                // One lookup for both: a get is the commonest read.
                let found = self.state.keys.get_key_value(&range.key);
                let count = i64::from(found.is_some());
                let items = found.into_iter().map(|(key, entry)| Item::now(key, entry));
                return Some((count, Box::new(items)));
            }
            let items = self.range(range).map(|(key, entry)| Item::now(key, entry));
            return Some((self.count(range), Box::new(items)));
        }
        if revision < self.state.floor || revision > self.revision {
            return None;
        }
        if range.end == RangeEnd::Single {
            let found = self.state.key_at(&range.key, revision);
            return Some((i64::from(found.is_some()), Box::new(found.into_iter())));
        }
        let (then, grown) = self.changed_since(revision, |key| range.contains(key));
        let count = self.count(range) - grown;
        let items = Undone {
            now: self.range(range).peekable(),
            then: then.into_iter().peekable(),
        };
        Some((count, Box::new(items)))
    }

    /// Each key `keep` takes that changed after `revision`, with its version then (what its
    /// first later change replaced; `None`: it did not exist), in key order; and by how many
    /// those changes grew the number of live keys since.
    ///
    /// One pass, no lookups: a change is its key's first since `revision` when the key's
    /// previous change is not later, and each change takes its key from its version before to
    /// its version after, so their sum over a key's changes is the key now less the key then.
    fn changed_since(&self, revision: i64, keep: impl Fn(&[u8]) -> bool) -> (Changed<'_>, i64) {
        let state = &self.state;
        let later = state.history.partition_point(|c| c.revision <= revision);
        let first_later = state.first_position + later as Position;
        let mut then = Vec::new();
        let mut grown = 0;
        for change in state.history.range(later..).filter(|c| keep(&c.key)) {
            grown += i64::from(!change.deleted) - i64::from(change.before.is_some());
            if change.prev < first_later {
                then.push((&*change.key, change.before.as_ref()));
            }
        }
        then.sort_unstable_by(|a, b| a.0.cmp(b.0));
        (then, grown)
    }

    /// The keys attached to `lease` at `revision` (at or below the view's), in key order;
    /// `None` if `revision` is below the floor or above the view.
    pub fn leased_at(&self, lease: i64, revision: i64) -> Option<Vec<Vec<u8>>> {
        if revision < self.state.floor || revision > self.revision {
            return None;
        }
        if lease == 0 {
            return Some(Vec::new());
        }
        let (then, _) = self.changed_since(revision, |_| true);
        let changed = |key: &[u8]| then.binary_search_by(|(k, _)| (*k).cmp(key)).is_ok();
        let mut keys: Vec<Vec<u8>> = self
            .state
            .leased
            .keys(lease)
            .filter(|key| !changed(key))
            .map(|key| key.to_vec())
            .collect();
        keys.extend(
            then.into_iter()
                .filter(|(_, version)| version.is_some_and(|v| v.meta.lease == lease))
                .map(|(key, _)| key.to_vec()),
        );
        keys.sort_unstable();
        Some(keys)
    }

    /// How many live keys `range` holds, without visiting them.
    pub fn count(&self, range: &KeyRange) -> i64 {
        let keys = &self.state.keys;
        let n = match &range.end {
            RangeEnd::Single => usize::from(keys.contains_key(&range.key)),
            _ if range.is_empty() => 0,
            RangeEnd::Unbounded => keys.len() - keys.rank(&range.key),
            RangeEnd::Before(end) => keys.rank(end) - keys.rank(&range.key),
        };
        n as i64
    }
}

/// The keys of a range now, with the keys changed since some revision put back as they were.
struct Undone<'a> {
    now: Peekable<Walk<'a>>,
    then: Peekable<std::vec::IntoIter<(&'a [u8], Option<&'a Version>)>>,
}

/// The keys changed since a revision, each with its version then, in key order.
type Changed<'a> = Vec<(&'a [u8], Option<&'a Version>)>;

impl<'a> Iterator for Undone<'a> {
    type Item = Item<'a>;

    fn next(&mut self) -> Option<Item<'a>> {
        loop {
            let order = match (self.now.peek(), self.then.peek()) {
                (None, None) => return None,
                (Some(_), None) => KeyOrder::Less,
                (None, Some(_)) => KeyOrder::Greater,
                (Some((now, _)), Some((then, _))) => now.cmp(then),
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

mod keys;
mod ordered_key;
#[cfg(test)]
mod tests;
