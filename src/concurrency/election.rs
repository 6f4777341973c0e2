//! Campaign, Proclaim, Leader, Observe and Resign: the leader of `<name>` is the key under
//! `<name>/` with the lowest create revision, and its value is what the leader proclaims.

use tokio::sync::mpsc;

use super::{
    Error, LeaveOnDrop, Recipes, Result, by_create, create_revision_is, get, holder_key, kvs_of,
    prefix_of, prefix_range, put,
};
use crate::mvcc::types::{KeyRange, KeyValue, SortOrder, TxnRequest};
use crate::watch::EventKind;

/// A leadership as clients hold it (etcd's `LeaderKey`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub name: Vec<u8>,
    pub key: Vec<u8>,
    /// The key's create revision: the leadership holds while the key still has it.
    pub rev: i64,
    pub lease: i64,
}

impl Recipes {
    /// Waits until the caller leads election `name` through `lease` (0: a new lease), with
    /// `value` proclaimed. Returns the leadership and the revision of the campaign's own txn
    /// (etcd reports that one, not the revision at which leadership came).
    ///
    /// # Errors
    /// The lease does not exist, the caller's key was replaced while it campaigned
    /// (`NotLeader`), or the store fails.
    pub async fn campaign(
        &self,
        name: &[u8],
        lease: i64,
        value: &[u8],
    ) -> Result<(Leadership, i64)> {
        let lease = self.session(lease).await?;
        let prefix = prefix_of(name);
        let key = holder_key(&prefix, lease);
        let entered = self
            .txn(TxnRequest {
                compares: vec![create_revision_is(&key, 0)],
                success: vec![put(&key, value, lease)],
                failure: vec![get(&key)],
            })
            .await?;
        let mut rev = entered.revision;
        if !entered.value.succeeded {
            // This lease campaigned before: keep its place in line, with the new value.
            if let Some(kv) = kvs_of(&entered.value, 0).and_then(<[_]>::first) {
                rev = kv.create_revision;
                if kv.value != value {
                    let leadership = Leadership {
                        name: name.to_vec(),
                        key: key.clone(),
                        rev,
                        lease,
                    };
                    if let Err(e) = self.proclaim_as(&leadership, value).await {
                        if !matches!(e, Error::NotLeader) {
                            let _ = self.delete_if_created(&key, rev).await;
                        }
                        return Err(e);
                    }
                }
            }
        }
        let mut cleanup = LeaveOnDrop::new(self.clone(), key.clone(), Some(rev));
        let waited = self.wait_deletes(&prefix, rev - 1).await;
        // Only a caller that went away resigns; one whose wait failed keeps its key, as etcd.
        cleanup.disarm();
        waited?;
        Ok((
            Leadership {
                name: name.to_vec(),
                key,
                rev,
                lease,
            },
            entered.revision,
        ))
    }

    /// Replaces the leader's value; returns the revision it was written at.
    ///
    /// # Errors
    /// `NotLeader` when the leadership's key is gone or was created again; the store fails.
    pub async fn proclaim(&self, leader: &Leadership, value: &[u8]) -> Result<i64> {
        let lease = self.session(leader.lease).await?;
        self.proclaim_as(
            &Leadership {
                lease,
                ..leader.clone()
            },
            value,
        )
        .await
    }

    async fn proclaim_as(&self, leader: &Leadership, value: &[u8]) -> Result<i64> {
        let proclaimed = self
            .txn(TxnRequest {
                compares: vec![create_revision_is(&leader.key, leader.rev)],
                success: vec![put(&leader.key, value, leader.lease)],
                failure: Vec::new(),
            })
            .await?;
        if !proclaimed.value.succeeded {
            return Err(Error::NotLeader);
        }
        Ok(proclaimed.revision)
    }

    /// Ends a leadership (if it still holds); returns the revision after.
    ///
    /// # Errors
    /// The store fails.
    pub async fn resign(&self, leader: &Leadership) -> Result<i64> {
        // etcd's server opens a session for the leadership's lease here too, granting a new
        // lease when it is 0; the resignation does not use it.
        self.session(leader.lease).await?;
        self.delete_if_created(&leader.key, leader.rev).await
    }

    /// The current leader's key, with the revision read at.
    ///
    /// # Errors
    /// `NoLeader` when nobody campaigns; the store fails.
    pub async fn leader(&self, name: &[u8]) -> Result<(i64, KeyValue)> {
        let found = self
            .range(by_create(&prefix_of(name), SortOrder::Ascend))
            .await?;
        let kv = found.value.kvs.into_iter().next().ok_or(Error::NoLeader)?;
        Ok((found.revision, kv))
    }

    /// Sends each leader's key of election `name` to `out` as it is elected and each time it
    /// proclaims, with the revision of the answer, until `out` closes or a read fails.
    pub async fn observe(&self, name: &[u8], out: mpsc::Sender<(i64, KeyValue)>) {
        if let Err(e) = self.observe_into(name, &out).await {
            tracing::debug!(error = %e, "election observer stopped");
        }
    }

    async fn observe_into(&self, name: &[u8], out: &mpsc::Sender<(i64, KeyValue)>) -> Result<()> {
        let prefix = prefix_of(name);
        loop {
            let first = self.range(by_create(&prefix, SortOrder::Ascend)).await?;
            let (revision, leader) = match first.value.kvs.into_iter().next() {
                Some(kv) => (first.revision, kv),
                None => {
                    // Nobody leads: the first put under the prefix is the next leader.
                    let mut puts = self.hub.follow(prefix_range(&prefix), first.revision);
                    loop {
                        let (event, _) = puts.next().await?;
                        if event.kind == EventKind::Put {
                            break (event.kv.mod_revision, event.kv);
                        }
                    }
                }
            };
            let key = leader.key.clone();
            if out.send((revision, leader)).await.is_err() {
                return Ok(());
            }
            let mut changes = self.hub.follow(KeyRange::single(key), revision + 1);
            loop {
                let (event, through) = changes.next().await?;
                if event.kind == EventKind::Delete {
                    break;
                }
                if out.send((through, event.kv)).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}
