//! Executes one validated txn inside the writer's database transaction.
//!
//! Rules kept here, as etcd keeps them:
//! - Compares are evaluated before any op runs; ops then run in order, and a later op (or a
//!   nested txn's compare) sees what earlier ops of the same txn wrote.
//! - Every change of the txn gets the same revision, `base + 1`, with increasing sub-revisions.
//!   A txn that changes nothing (only reads, or deletes that matched nothing) takes no revision.
//! - An error (a Put's `ignore_*` on a missing key) fails the whole txn; the caller rolls back
//!   what it wrote.

use std::future::Future;
use std::pin::Pin;

use crate::backend::{LogRow, Scan, WriteTxn};

use super::compare::{evaluate, fetch_limit, finish_range};
use super::types::{
    DeleteRequest, DeleteResponse, KeyRange, KeyValue, Op, OpResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use super::{Error, Result};

pub(crate) struct TxnExec<'a> {
    tx: &'a mut dyn WriteTxn,
    /// The revision before this txn.
    base: i64,
    compact: i64,
    /// Sub-revision of the next change; 0 while nothing has been written.
    next_sub: i64,
}

impl<'a> TxnExec<'a> {
    pub(crate) fn new(tx: &'a mut dyn WriteTxn, base: i64, compact: i64) -> Self {
        Self {
            tx,
            base,
            compact,
            next_sub: 0,
        }
    }

    /// Whether this txn changed anything (and so takes revision `base + 1`).
    pub(crate) fn wrote(&self) -> bool {
        self.next_sub > 0
    }

    /// The revision this txn's reads see: its own writes included.
    fn view(&self) -> i64 {
        if self.wrote() {
            self.base + 1
        } else {
            self.base
        }
    }

    pub(crate) fn run<'b>(
        &'b mut self,
        req: &'b TxnRequest,
    ) -> Pin<Box<dyn Future<Output = Result<TxnResponse>> + Send + 'b>>
    where
        'a: 'b,
    {
        Box::pin(async move {
            let mut succeeded = true;
            for compare in &req.compares {
                let kvs = self.live(&compare.range, None, false).await?;
                if !evaluate(compare, &kvs) {
                    succeeded = false;
                    break;
                }
            }
            let ops = if succeeded {
                &req.success
            } else {
                &req.failure
            };
            let mut responses = Vec::with_capacity(ops.len());
            for op in ops {
                responses.push(match op {
                    Op::Range(r) => OpResponse::Range(self.range(r).await?),
                    Op::Put(p) => OpResponse::Put(self.put(p).await?),
                    Op::Delete(d) => OpResponse::Delete(self.delete(d).await?),
                    Op::Txn(t) => OpResponse::Txn(self.run(t).await?),
                });
            }
            Ok(TxnResponse {
                succeeded,
                responses,
            })
        })
    }

    async fn live(
        &mut self,
        range: &KeyRange,
        limit: Option<i64>,
        keys_only: bool,
    ) -> Result<Vec<KeyValue>> {
        let revision = self.view();
        let rows = self
            .tx
            .scan(&Scan {
                key: &range.key,
                end: &range.end,
                revision,
                limit,
                keys_only,
            })
            .await?;
        Ok(rows.into_iter().map(KeyValue::from_row).collect())
    }

    async fn range(&mut self, req: &RangeRequest) -> Result<RangeResponse> {
        let view = self.view();
        let revision = super::resolve_read_revision(req.revision, view, self.compact)?;
        let count = self
            .tx
            .count(&req.range.key, &req.range.end, revision)
            .await?;
        if req.count_only {
            return Ok(RangeResponse {
                count,
                ..RangeResponse::default()
            });
        }
        let rows = self
            .tx
            .scan(&Scan {
                key: &req.range.key,
                end: &req.range.end,
                revision,
                limit: fetch_limit(req),
                keys_only: req.keys_only,
            })
            .await?;
        let kvs = rows.into_iter().map(KeyValue::from_row).collect();
        Ok(finish_range(req, kvs, count))
    }

    fn next_change(&mut self) -> (i64, i64) {
        let sub = self.next_sub;
        self.next_sub += 1;
        (self.base + 1, sub)
    }

    async fn put(&mut self, req: &PutRequest) -> Result<PutResponse> {
        let latest = self.tx.latest(&req.key).await?;
        let prev_revision = latest.as_ref().map_or(0, |row| row.revision);
        let existing = latest.filter(|row| !row.deleted).map(KeyValue::from_row);
        let value = match (&req.value, &existing) {
            (Some(v), _) => v.clone(),
            (None, Some(kv)) => kv.value.clone(),
            (None, None) => return Err(Error::KeyNotFound),
        };
        let lease = match (req.lease, &existing) {
            (Some(l), _) => l,
            (None, Some(kv)) => kv.lease,
            (None, None) => return Err(Error::KeyNotFound),
        };
        if req.lease.is_some() && lease != 0 && self.tx.lease(lease).await?.is_none() {
            return Err(Error::LeaseNotFound);
        }
        let (revision, sub) = self.next_change();
        let row = LogRow {
            revision,
            sub,
            key: req.key.clone(),
            created: existing.is_none(),
            deleted: false,
            create_revision: existing.as_ref().map_or(revision, |kv| kv.create_revision),
            prev_revision,
            version: existing.as_ref().map_or(1, |kv| kv.version + 1),
            lease,
            value,
            old_value: existing.as_ref().map(|kv| kv.value.clone()),
            old_lease: existing.as_ref().map_or(0, |kv| kv.lease),
        };
        self.tx.insert(&row).await?;
        Ok(PutResponse {
            prev_kv: existing.filter(|_| req.prev_kv),
        })
    }

    async fn delete(&mut self, req: &DeleteRequest) -> Result<DeleteResponse> {
        let doomed = self.live(&req.range, None, false).await?;
        for kv in &doomed {
            self.tombstone(kv).await?;
        }
        Ok(DeleteResponse {
            deleted: doomed.len() as i64,
            prev_kvs: if req.prev_kv { doomed } else { Vec::new() },
        })
    }

    /// Writes the deletion of a live key.
    async fn tombstone(&mut self, kv: &KeyValue) -> Result<()> {
        let (revision, sub) = self.next_change();
        let row = LogRow {
            revision,
            sub,
            key: kv.key.clone(),
            created: false,
            deleted: true,
            create_revision: kv.create_revision,
            prev_revision: kv.mod_revision,
            version: kv.version,
            lease: 0,
            value: Vec::new(),
            old_value: Some(kv.value.clone()),
            old_lease: kv.lease,
        };
        self.tx.insert(&row).await?;
        Ok(())
    }

    /// Deletes lease `id` and every key attached to it.
    ///
    /// # Errors
    /// `LeaseNotFound` if the lease does not exist.
    pub(crate) async fn revoke(&mut self, id: i64) -> Result<()> {
        if !self.tx.delete_lease(id).await? {
            return Err(Error::LeaseNotFound);
        }
        let attached = self.tx.lease_keys(id, self.view()).await?;
        for row in attached {
            self.tombstone(&KeyValue::from_row(row)).await?;
        }
        Ok(())
    }
}
