//! Writing the store's current keyspace into an empty etcd (`etcdsql export --to-etcd`), for
//! moving back to etcd.
//!
//! etcd cannot take given revisions: each key is written anew, so its create and mod revisions
//! and its version are etcd's own afterwards, and clients must relist (a watch or a resourceVersion
//! from before means nothing to the new etcd). What is kept: every live key with its value, the
//! order in which the keys were last written (they are put in order of their mod revision, those
//! of one revision in one txn), and leases with their ids and remaining TTLs, with their keys
//! attached.
//!
//! Invariants: the store is only read, at one revision; the target must hold no key; every call
//! to etcd has a deadline ([`crate::import::WAIT`]).

use std::collections::HashSet;

use crate::import::{Error, Result, Source, call, store_error};
use crate::mvcc::Store;
use crate::mvcc::types::{KeyRange, KeyValue, RangeRequest};
use crate::pb::etcdserverpb::{
    LeaseGrantRequest, PutRequest, RangeRequest as EtcdRange, RequestOp, TxnRequest,
    kv_client::KvClient, lease_client::LeaseClient, request_op::Request,
};

/// Keys read from the store per page.
const PAGE: i64 = 10_000;
/// Puts per txn (etcd allows 128 operations).
const PER_TXN: usize = 128;

/// What the export wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exported {
    pub keys: u64,
    pub leases: u64,
    /// The store's revision that was exported.
    pub from_revision: i64,
    /// etcd's revision afterwards.
    pub to_revision: i64,
}

/// Copies the keys live in `store` now, and its leases, into the empty etcd at `target`.
///
/// # Errors
/// etcd cannot be reached, holds keys already, or refuses a write; or the store cannot be
/// read.
pub async fn to_etcd(
    store: &Store,
    target: &Source,
    now_ms: i64,
    mut progress: impl FnMut(u64, u64),
) -> Result<Exported> {
    let channel = target.connect().await?;
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel);
    let held = call(kv.range(EtcdRange {
        key: vec![0],
        range_end: vec![0],
        count_only: true,
        ..EtcdRange::default()
    }))
    .await?
    .count;
    if held > 0 {
        return Err(Error::TargetNotEmpty(held));
    }

    let (revision, mut kvs) = live_keys(store).await?;
    // The order in which the keys were last written; one txn per revision, in key order.
    kvs.sort_by(|a, b| (a.mod_revision, &a.key).cmp(&(b.mod_revision, &b.key)));
    let mut exported = Exported {
        from_revision: revision,
        ..Exported::default()
    };
    let leases = store.leases().await.map_err(store_error)?.value;
    let mut granted = HashSet::new();
    for row in &leases {
        let remaining = (row.expires_at - now_ms + 999) / 1000;
        if remaining <= 0 {
            continue;
        }
        call(lease.lease_grant(LeaseGrantRequest {
            ttl: remaining,
            id: row.id,
        }))
        .await?;
        granted.insert(row.id);
        exported.leases += 1;
    }
    // The keys of a lease that ran out before the export go with it, as at its expiry.
    kvs.retain(|kv| kv.lease == 0 || granted.contains(&kv.lease));
    let total = kvs.len() as u64;
    for group in kvs.chunk_by(|a, b| a.mod_revision == b.mod_revision) {
        for chunk in group.chunks(PER_TXN) {
            let success = chunk
                .iter()
                .map(|kv| RequestOp {
                    request: Some(Request::RequestPut(PutRequest {
                        key: kv.key.clone(),
                        value: kv.value.clone(),
                        lease: kv.lease,
                        ..PutRequest::default()
                    })),
                })
                .collect();
            let response = call(kv.txn(TxnRequest {
                success,
                ..TxnRequest::default()
            }))
            .await?;
            exported.to_revision = response.header.map_or(0, |h| h.revision);
            exported.keys += chunk.len() as u64;
        }
        progress(exported.keys, total);
    }
    Ok(exported)
}

/// Every live key with its value at one revision, and that revision.
async fn live_keys(store: &Store) -> Result<(i64, Vec<KeyValue>)> {
    let mut kvs = Vec::new();
    let mut from = vec![0];
    let mut revision = 0;
    loop {
        let mut request = RangeRequest::of(KeyRange::from_etcd(from, vec![0]));
        request.revision = revision;
        request.limit = PAGE;
        let page = store.range(&request).await.map_err(store_error)?;
        revision = page.revision;
        let more = page.value.more;
        let Some(last) = page.value.kvs.last() else {
            break;
        };
        from = last.key.clone();
        from.push(0);
        kvs.extend(page.value.kvs);
        if !more {
            break;
        }
    }
    Ok((revision, kvs))
}
