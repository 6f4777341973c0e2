//! The applied index: the metadata of every live key as of the newest revision this process has
//! applied, so that reads can take keys and counts from memory instead of SQL.
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
//! - **Only durable revisions.** Its publishers hand over a batch only once it is durable, and
//!   after the store published its revisions; so the index's revision is never above the store's
//!   published current revision, and a read served at it never shows what a later read could
//!   miss.
//! - **One revision per read.** A reader holds the read lock for all it takes from the index, so
//!   its keys and counts are those of one revision, which it reports in its header.
//! - **Fed or unused.** Until a publisher is installed ([`Applied::feed`]) nothing moves it: the
//!   store then never serves from it. If it ever sees a gap, it stops serving reads for good
//!   (logged): an index that might be wrong is never read.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use tokio::sync::watch;

use crate::backend::LogRow;

use super::index::{KeyMeta, range_of};
use super::types::{KeyRange, KeyValue};

/// A handle to the applied index; cheap to clone.
#[derive(Clone)]
pub struct Applied {
    inner: Arc<Inner>,
}

struct Inner {
    state: RwLock<State>,
    /// The index's revision, for readers waiting until it reaches theirs.
    revision: watch::Sender<i64>,
    /// Set once a publisher feeds the index.
    fed: AtomicBool,
    /// Set if the index ever saw revisions out of order; it is then never read again.
    broken: AtomicBool,
}

struct State {
    keys: BTreeMap<Vec<u8>, KeyMeta>,
    revision: i64,
}

/// The index as of one revision, held for the length of one read.
pub(crate) struct View<'a> {
    state: RwLockReadGuard<'a, State>,
}

impl Applied {
    /// An index of the live keys among `heads` (the newest row of every key) at `revision`.
    pub(crate) fn load<'a>(heads: impl IntoIterator<Item = &'a LogRow>, revision: i64) -> Self {
        let keys = heads
            .into_iter()
            .filter(|row| !row.deleted)
            .map(|row| (row.key.clone(), KeyMeta::of(row)))
            .collect();
        let (revision_tx, _) = watch::channel(revision);
        Self {
            inner: Arc::new(Inner {
                state: RwLock::new(State { keys, revision }),
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

    /// Applies the changes of the revisions `(after, through]`, in log order, if the index is
    /// at `after`; returns whether it did. A change is a key as a put left it, or a deleted key
    /// (`true`; only its key is read).
    pub fn apply<'a>(
        &self,
        after: i64,
        through: i64,
        changes: impl IntoIterator<Item = (&'a KeyValue, bool)>,
    ) -> bool {
        let mut state = self
            .inner
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.revision != after {
            if state.revision < after && !self.inner.broken.swap(true, Ordering::AcqRel) {
                tracing::error!(
                    index = state.revision,
                    after,
                    "the applied index missed revisions; reads no longer use it"
                );
            }
            return false;
        }
        for (kv, deleted) in changes {
            if deleted {
                state.keys.remove(&kv.key);
            } else {
                let meta = KeyMeta {
                    mod_revision: kv.mod_revision,
                    create_revision: kv.create_revision,
                    version: kv.version,
                    lease: kv.lease,
                    deleted: false,
                };
                state.keys.insert(kv.key.clone(), meta);
            }
        }
        state.revision = through;
        // Under the write lock, so announcements never run backward.
        self.inner.revision.send_replace(through);
        true
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
        View {
            state: self
                .inner
                .state
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        }
    }
}

impl View<'_> {
    pub fn revision(&self) -> i64 {
        self.state.revision
    }

    /// The live keys of `range`, in key order.
    pub fn range<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a KeyMeta)> + 'a {
        range_of(&self.state.keys, range)
    }

    /// How many live keys `range` holds.
    pub fn count(&self, range: &KeyRange) -> i64 {
        self.range(range).count() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, revision: i64, deleted: bool) -> LogRow {
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
            value: Vec::new(),
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
        let applied = Applied::load(&[row("a", 2, false), row("b", 3, true)], 3);
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
        );
        let view = applied.view();
        assert_eq!(
            view.count(&KeyRange::from_etcd(b"a/".to_vec(), b"a0".to_vec())),
            2
        );
        assert_eq!(view.count(&KeyRange::single(b"b".to_vec())), 1);
        assert_eq!(view.count(&KeyRange::single(b"c".to_vec())), 0);
        assert_eq!(
            view.count(&KeyRange::from_etcd(b"b".to_vec(), b"a".to_vec())),
            0
        );
        assert_eq!(view.revision(), 4);
    }

    #[tokio::test]
    async fn readers_wait_for_their_revision() {
        let applied = Applied::load(&[], 1);
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
}
