//! Locks and elections served by the server (etcd's Lock and Election services), built only on
//! the store's txns and ranges, the lessor and the watch hub — the recipes etcd's own server
//! runs through its client library, step for step, so a key, a revision or an error a client
//! sees is the one etcd would give.
//!
//! # Invariants
//! - **One key per holder.** A lock's or an election's holders are the keys under
//!   `<name>/`, one per lease (`<name>/<lease in hex>`), each attached to its lease; the holder
//!   is the key with the lowest create revision. Nothing here keeps state between requests:
//!   the keys are the state, so every instance on one database agrees, and a lease's end
//!   releases what it held.
//! - **Waiting is watching.** A waiter reads the newest key created before its own at some
//!   revision R, then follows that key's changes from R on; it checks again only after that key
//!   is deleted. No deletion can fall between the read and the watch.
//! - **Giving up cleans up.** A lock or a campaign whose caller goes away while waiting deletes
//!   the waiter's key (a campaign only if it still holds the same key), as etcd does, so it
//!   does not block those behind it until its lease runs out.

pub mod election;
pub mod lock;

use crate::lease::Lessor;
use crate::mvcc::types::{
    Compare, CompareResult, CompareTarget, DeleteRequest, KeyRange, KeyValue, Op, OpResponse,
    PutRequest, RangeRequest, RangeResponse, Revisioned, SortOrder, SortTarget, TxnRequest,
    TxnResponse,
};
use crate::mvcc::{self, Store};
use crate::watch::{EventKind, Hub};

/// The TTL of the lease granted for a request that names none (etcd's session default).
pub const SESSION_TTL: i64 = 60;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] mvcc::Error),
    /// The waiter's key was gone once the keys before it were: its lease ended meanwhile.
    #[error("mutex: session is expired")]
    SessionExpired,
    #[error("election: not leader")]
    NotLeader,
    #[error("election: no leader")]
    NoLeader,
}

pub type Result<T> = std::result::Result<T, Error>;

/// What locks and elections work with.
#[derive(Clone)]
pub struct Recipes {
    store: Store,
    hub: Hub,
    lessor: Lessor,
}

impl Recipes {
    pub fn new(store: Store, hub: Hub, lessor: Lessor) -> Self {
        Self { store, hub, lessor }
    }

    /// The lease a request's keys are attached to: its own, or for 0 a new one with
    /// [`SESSION_TTL`], which nobody keeps alive (etcd's server does the same).
    async fn session(&self, lease: i64) -> Result<i64> {
        if lease != 0 {
            return Ok(lease);
        }
        Ok(self.lessor.grant(0, SESSION_TTL).await?.value.id)
    }

    async fn txn(&self, txn: TxnRequest) -> Result<Revisioned<TxnResponse>> {
        Ok(self.store.txn(txn).await?)
    }

    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        Ok(self.store.range(&req).await?)
    }

    /// Deletes `key`; returns the revision after it.
    async fn delete(&self, key: &[u8]) -> Result<i64> {
        let deleted = self
            .store
            .delete(DeleteRequest {
                range: KeyRange::single(key.to_vec()),
                prev_kv: false,
            })
            .await?;
        Ok(deleted.revision)
    }

    /// Deletes `key` if its create revision is `revision`; returns the txn's revision.
    async fn delete_if_created(&self, key: &[u8], revision: i64) -> Result<i64> {
        let txn = self
            .txn(TxnRequest {
                compares: vec![create_revision_is(key, revision)],
                success: vec![Op::Delete(DeleteRequest {
                    range: KeyRange::single(key.to_vec()),
                    prev_kv: false,
                })],
                failure: Vec::new(),
            })
            .await?;
        Ok(txn.revision)
    }

    /// Waits until every key under `prefix` created at or before `max_create_revision` is
    /// gone.
    async fn wait_deletes(&self, prefix: &[u8], max_create_revision: i64) -> Result<()> {
        loop {
            let mut newest = by_create(prefix, SortOrder::Descend);
            newest.max_create_revision = max_create_revision;
            let found = self.range(newest).await?;
            let Some(kv) = found.value.kvs.into_iter().next() else {
                return Ok(());
            };
            self.wait_delete(kv.key, found.revision).await?;
        }
    }

    /// Waits for a deletion of `key` at revision `from` or later.
    async fn wait_delete(&self, key: Vec<u8>, from: i64) -> Result<()> {
        let mut follower = self.hub.follow(KeyRange::single(key), from);
        loop {
            let (event, _) = follower.next().await?;
            if event.kind == EventKind::Delete {
                return Ok(());
            }
        }
    }
}

/// Takes a waiter's key out of the line unless disarmed: a caller that stops waiting (its
/// request cancelled, or the wait failed) must not block those behind it.
struct LeaveOnDrop {
    recipes: Recipes,
    key: Option<Vec<u8>>,
    /// Delete only while the key still has this create revision (it is still the same
    /// holding); `None` deletes it regardless.
    created: Option<i64>,
}

impl LeaveOnDrop {
    fn new(recipes: Recipes, key: Vec<u8>, created: Option<i64>) -> Self {
        Self {
            recipes,
            key: Some(key),
            created,
        }
    }

    fn disarm(&mut self) {
        self.key = None;
    }
}

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let recipes = self.recipes.clone();
        let created = self.created;
        runtime.spawn(async move {
            let left = match created {
                None => recipes.delete(&key).await.map(drop),
                Some(revision) => recipes.delete_if_created(&key, revision).await.map(drop),
            };
            if let Err(e) = left {
                tracing::warn!(
                    key = %String::from_utf8_lossy(&key),
                    error = %e,
                    "a waiter that gave up could not remove its key; it stays until its lease ends"
                );
            }
        });
    }
}

/// A holder's key: `<prefix><lease in hex>`, with a sign for a negative lease as Go prints it.
fn holder_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    [prefix, hex.as_bytes()].concat()
}

/// Every key a lock or election named `name` may use: its holders' keys.
pub fn holders(name: &[u8]) -> KeyRange {
    prefix_range(&prefix_of(name))
}

/// `<name>/`: under it live the holders' keys.
fn prefix_of(name: &[u8]) -> Vec<u8> {
    [name, b"/"].concat()
}

/// The range of every key starting with `prefix`, as etcd's clients compute it.
fn prefix_range(prefix: &[u8]) -> KeyRange {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return KeyRange::from_etcd(prefix.to_vec(), end);
        }
    }
    // All 0xff (or empty): everything from the prefix on.
    KeyRange::from_etcd(prefix.to_vec(), vec![0])
}

/// The first (or last) key created under `prefix`.
fn by_create(prefix: &[u8], order: SortOrder) -> RangeRequest {
    let mut req = RangeRequest::of(prefix_range(prefix));
    req.sort = Some((SortTarget::Create, order));
    req.limit = 1;
    req
}

fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        range: KeyRange::single(key.to_vec()),
        target: CompareTarget::Create(revision),
        result: CompareResult::Equal,
    }
}

fn put(key: &[u8], value: &[u8], lease: i64) -> Op {
    Op::Put(PutRequest {
        key: key.to_vec(),
        value: Some(value.to_vec()),
        lease: Some(lease),
        prev_kv: false,
    })
}

fn get(key: &[u8]) -> Op {
    Op::Range(RangeRequest::of(KeyRange::single(key.to_vec())))
}

/// The keys a txn's `index`th op read.
fn kvs_of(txn: &TxnResponse, index: usize) -> Option<&[KeyValue]> {
    match txn.responses.get(index) {
        Some(OpResponse::Range(range)) => Some(&range.kvs),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_keys_print_the_lease_as_go_does() {
        assert_eq!(holder_key(b"l/", 0x694d_7a1b_2c3d), b"l/694d7a1b2c3d");
        assert_eq!(holder_key(b"l/", 255), b"l/ff");
        assert_eq!(holder_key(b"l/", -31), b"l/-1f");
    }

    #[test]
    fn prefix_ranges_end_after_the_last_byte_below_0xff() {
        assert_eq!(
            prefix_range(b"a/"),
            KeyRange::from_etcd(b"a/".to_vec(), b"a0".to_vec())
        );
        assert_eq!(
            prefix_range(b"a\xff"),
            KeyRange::from_etcd(b"a\xff".to_vec(), b"b".to_vec())
        );
        assert_eq!(
            prefix_range(b"\xff\xff"),
            KeyRange::from_etcd(b"\xff\xff".to_vec(), vec![0])
        );
    }
}
