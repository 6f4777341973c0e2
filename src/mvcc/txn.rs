//! Executes validated txns inside the writer's database transaction.
//!
//! Rules kept here, as etcd keeps them:
//! - Compares are evaluated before any op runs; ops then run in order, and a later op (or a
//!   nested txn's compare) sees what earlier ops of the same txn wrote.
//! - Every change of the txn gets the same revision, `base + 1`, with increasing sub-revisions.
//!   A txn that changes nothing (only reads, or deletes that matched nothing) takes no revision.
//! - An error (a Put's `ignore_*` on a missing key, a lease that does not exist, a Range at a
//!   compacted revision) fails the whole txn, and nothing it did stays ([`Batch::end_request`]).
//!
//! # Where the answers come from
//! Key metadata (exists? create revision, version, lease, newest row's revision) comes from the
//! writer's [`KeyIndex`], which the rows of this batch update as they are written. Values come
//! from the rows this batch wrote, kept in memory; or from the applied index, which holds the
//! value of each key's newest durable row within its budget; or else from the database by
//! `(key, revision)` — for a batch's Puts and single-key Deletes in one query up front
//! ([`Batch::prefetch`]). A Range op of the current revision is answered the same way, from the
//! index and those values. New rows are buffered and inserted together ([`Batch::flush`])
//! before anything reads the log with SQL (a Range op at an older revision) and before the batch
//! commits. A revoked lease's keys come from the index too.
//!
//! The writer used to keep a cache of its own of the values it wrote, so that a key written
//! again soon after needed no query. The applied index holds the same values once their batch
//! is durable, a millisecond or two later, within a larger budget; copying every value into the
//! cache cost more than it saved (without it: 5% less server CPU per update, and 70 MiB less
//! peak memory over 100,000 writes; BENCHMARKS.md). What only the cache covered, a key written
//! again while its last write is still being synced, now costs its batch one query.
//!
//! Every error a request can fail with is found before it writes anything to the database,
//! except when a txn reads with a Range at an older revision after writing (its rows are
//! inserted with the batch's for SQL to see them): only then is the request wrapped in a
//! savepoint, so a later error rolls it back.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use crate::backend::{LogRow, Opening, RangeEnd, Revisions, Scan, WriteTxn};

use super::compare::{evaluate, fetch_limit, finish_range};
use super::index::{KeyIndex, KeyMeta, Mark};
use super::types::{
    CompareTarget, DeleteRequest, DeleteResponse, KeyRange, KeyValue, Op, OpResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use super::{Applied, Error, Result};

/// The writer's state while it runs one batch.
pub(crate) struct Batch<'a> {
    pub(crate) tx: Box<dyn WriteTxn>,
    pub(crate) index: &'a mut KeyIndex,
    /// Every row this batch wrote, in revision and sub-revision order; after the commit, what
    /// the watch hub is handed.
    rows: Vec<LogRow>,
    /// How many of `rows` have been inserted into the database.
    flushed: usize,
    /// Where the running request's rows start in `rows`.
    request_start: usize,
    /// Where the running request began in the index, for rolling it back.
    request_mark: Option<Mark>,
    /// Whether the running request had to insert its own rows, under a savepoint.
    savepoint: bool,
    /// Values by `(key, revision)`: every row this batch wrote, and old values fetched ahead.
    values: HashMap<(Vec<u8>, i64), Vec<u8>>,
    /// Holds the values of rows committed before the batch, within its budget, from the
    /// moment they are durable.
    applied: &'a Applied,
    /// Whether each lease a Put named exists, as read ahead ([`WriteTxn::leases_ahead`]) or
    /// as the batch's own grants and revocations left it.
    leases: HashMap<i64, bool>,
    /// The leases the batch's rows were attached to, each once: its append checks them again.
    attached: Vec<i64>,
}

impl<'a> Batch<'a> {
    pub(crate) fn new(
        tx: Box<dyn WriteTxn>,
        index: &'a mut KeyIndex,
        applied: &'a Applied,
    ) -> Self {
        Self {
            tx,
            index,
            rows: Vec::new(),
            flushed: 0,
            request_start: 0,
            request_mark: None,
            savepoint: false,
            values: HashMap::new(),
            applied,
            leases: HashMap::new(),
            attached: Vec::new(),
        }
    }

    /// The transaction back, for committing it, and the rows the batch wrote.
    pub(crate) fn into_parts(self) -> (Box<dyn WriteTxn>, Vec<LogRow>) {
        (self.tx, self.rows)
    }

    /// Brings the index up to the database's state `now` (read inside this write transaction,
    /// so nothing moves it meanwhile): applies what other processes committed since the index's
    /// revision, or reloads the index when that is not possible. Then forgets tombstones that
    /// physical compaction removed (`compacted`, this process's compactor's progress).
    /// `opening`, if the transaction began with one, holds changes already read; the ones it
    /// took in are returned, for the watch hub.
    pub(crate) async fn sync_index(
        &mut self,
        now: Revisions,
        compacted: i64,
        opening: Option<Opening>,
    ) -> Result<Option<Opening>> {
        let known = self.index.revision();
        let mut taken = None;
        if self.index.needs_reload() || now.current < known || now.compact > known {
            // Behind a compaction, rows of the missing revisions may be gone (a deleted key's
            // tombstone); going backwards means the database is not the one the index was
            // built from. Either way only a fresh load is right.
            tracing::info!(
                index = known,
                current = now.current,
                compact = now.compact,
                "reloading the key index"
            );
            let heads = self.tx.heads().await?;
            self.index.reload(heads, now.current);
        } else if now.current > known {
            let mut through = known;
            if let Some(opening) = opening.filter(|o| o.after == known && o.through > known) {
                // The opening's rows carry their values: those the batch's ops are likeliest
                // to ask for, other processes' latest writes.
                for row in opening.changes.iter().filter(|row| !row.deleted) {
                    self.values
                        .insert((row.key.clone(), row.revision), row.value.clone());
                }
                self.index.catch_up(&opening.changes, opening.through);
                through = opening.through;
                taken = Some(opening);
            }
            if through < now.current {
                let rows = self.tx.change_keys(through, now.current).await?;
                self.index.catch_up(&rows, now.current);
            }
        }
        self.index.prune_tombstones(compacted);
        Ok(taken)
    }

    /// Fetches, in one query, the current values of the existing keys that the batch's txns
    /// put, delete or read by name, so that those ops need no query of their own; and whether
    /// the leases their Puts name exist.
    pub(crate) async fn prefetch<'r>(
        &mut self,
        txns: impl Iterator<Item = &'r TxnRequest>,
    ) -> Result<()> {
        fn keys<'r>(txn: &'r TxnRequest, out: &mut Vec<&'r [u8]>, leases: &mut Vec<i64>) {
            for op in txn.success.iter().chain(&txn.failure) {
                match op {
                    Op::Put(put) => {
                        out.push(&put.key);
                        leases.extend(put.lease.filter(|&lease| lease != 0));
                    }
                    Op::Delete(delete) if delete.range.end == RangeEnd::Single => {
                        out.push(&delete.range.key);
                    }
                    Op::Range(range) if range.range.end == RangeEnd::Single => {
                        out.push(&range.range.key);
                    }
                    Op::Txn(nested) => keys(nested, out, leases),
                    Op::Delete(_) | Op::Range(_) => {}
                }
            }
        }
        let (mut wanted, mut leases) = (Vec::new(), Vec::new());
        for txn in txns {
            keys(txn, &mut wanted, &mut leases);
        }
        leases.sort_unstable();
        leases.dedup();
        if !leases.is_empty() {
            let found = self.tx.leases_ahead(&leases).await?;
            for lease in leases {
                self.leases.insert(lease, found.contains(&lease));
            }
        }
        let wanted: Vec<(Vec<u8>, i64)> = wanted
            .into_iter()
            .filter_map(|key| {
                let meta = self.index.live(key)?;
                Some((key.to_vec(), meta.mod_revision))
            })
            .collect();
        self.values_of(&wanted).await?;
        Ok(())
    }

    /// The values of rows `(key, revision)` the index names as current: from memory, or else
    /// from the database in one query.
    async fn values_of(&mut self, rows: &[(Vec<u8>, i64)]) -> Result<Vec<Vec<u8>>> {
        let mut missing: Vec<(&[u8], i64)> = Vec::new();
        for row in rows {
            if self.values.contains_key(row) {
                continue;
            }
            match self.applied.value_at(&row.0, row.1) {
                Some(value) => {
                    self.values.insert(row.clone(), value);
                }
                None => missing.push((row.0.as_slice(), row.1)),
            }
        }
        if !missing.is_empty() {
            // Rows this batch wrote are all in `values`: what is missing was committed before
            // the batch, so SQL has it whether or not `rows` were inserted yet.
            let found = self.tx.values_ahead(&missing).await?;
            for ((key, revision), value) in missing.iter().zip(found) {
                let Some(value) = value else {
                    self.index.invalidate();
                    return Err(Error::IndexOutOfSync {
                        key: String::from_utf8_lossy(key).into_owned(),
                        revision: *revision,
                    });
                };
                self.values.insert((key.to_vec(), *revision), value);
            }
        }
        Ok(rows
            .iter()
            .map(|row| self.values.get(row).cloned().unwrap_or_default())
            .collect())
    }

    /// The existing keys of a range with their values (or empty values if `with_values` is
    /// false), in key order.
    async fn live(&mut self, range: &KeyRange, with_values: bool) -> Result<Vec<KeyValue>> {
        Ok(self.live_first(range, with_values, None).await?.1)
    }

    /// The live keys attached to lease `id`, with their values, in key order.
    async fn leased(&mut self, id: i64) -> Result<Vec<KeyValue>> {
        let metas: Vec<(Vec<u8>, KeyMeta)> = self
            .index
            .leased(id)
            .map(|(key, meta)| (key.to_vec(), *meta))
            .collect();
        self.kvs_of(metas, true).await
    }

    /// How many keys of a range exist, and the first `take` of them (all if `None`) as
    /// [`Self::live`] gives them: values are read for those alone.
    async fn live_first(
        &mut self,
        range: &KeyRange,
        with_values: bool,
        take: Option<usize>,
    ) -> Result<(i64, Vec<KeyValue>)> {
        let mut count = 0_i64;
        let mut metas: Vec<(Vec<u8>, KeyMeta)> = Vec::new();
        for (key, meta) in self.index.live_range(range) {
            if take.is_none_or(|take| metas.len() < take) {
                metas.push((key.to_vec(), *meta));
            }
            count += 1;
        }
        let kvs = self.kvs_of(metas, with_values).await?;
        Ok((count, kvs))
    }

    /// Keys with their metadata as key-values, with their values if `with_values`.
    async fn kvs_of(
        &mut self,
        metas: Vec<(Vec<u8>, KeyMeta)>,
        with_values: bool,
    ) -> Result<Vec<KeyValue>> {
        if !with_values {
            return Ok(metas
                .into_iter()
                .map(|(key, meta)| meta.to_kv(&key, Vec::new()))
                .collect());
        }
        let wanted: Vec<(Vec<u8>, i64)> = metas
            .iter()
            .map(|(key, meta)| (key.clone(), meta.mod_revision))
            .collect();
        let values = self.values_of(&wanted).await?;
        Ok(metas
            .into_iter()
            .zip(values)
            .map(|((key, meta), value)| meta.to_kv(&key, value))
            .collect())
    }

    /// Whether lease `id` exists, for a Put that attaches a row to it: the append then checks
    /// that it still does.
    async fn attach_lease(&mut self, id: i64) -> Result<bool> {
        let exists = match self.leases.get(&id) {
            Some(&exists) => exists,
            None => {
                let exists = !self.tx.leases_ahead(&[id]).await?.is_empty();
                self.leases.insert(id, exists);
                exists
            }
        };
        if exists && !self.attached.contains(&id) {
            self.attached.push(id);
        }
        Ok(exists)
    }

    /// Records that the batch itself granted (`exists`) or revoked lease `id`, under the
    /// writers' lock: later Puts see it, and the append need not check a lease the batch
    /// revoked.
    pub(crate) fn lease_changed(&mut self, id: i64, exists: bool) {
        self.leases.insert(id, exists);
        if !exists {
            self.attached.retain(|&attached| attached != id);
        }
    }

    /// Records a row: the index and later reads of this batch see it at once; the database
    /// gets it at the next flush.
    fn write(&mut self, row: LogRow) {
        self.index.apply(&row);
        if !row.deleted {
            self.values
                .insert((row.key.clone(), row.revision), row.value.clone());
        }
        self.rows.push(row);
    }

    /// Inserts the buffered rows, so that SQL reads in this transaction see them. If the running
    /// request wrote some of them, they go in under a savepoint, since the request may still
    /// fail.
    pub(crate) async fn flush(&mut self) -> Result<()> {
        if self.flushed == self.rows.len() {
            return Ok(());
        }
        let own = self.request_mark.is_some() && self.request_start < self.rows.len();
        if own && !self.savepoint {
            // Nothing of the running request was inserted yet (that would have opened the
            // savepoint), so `flushed <= request_start`.
            self.tx
                .insert_rows(&self.rows[self.flushed..self.request_start])
                .await?;
            self.tx.savepoint().await?;
            self.savepoint = true;
            self.tx
                .insert_rows(&self.rows[self.request_start..])
                .await?;
        } else {
            self.tx.insert_rows(&self.rows[self.flushed..]).await?;
        }
        self.flushed = self.rows.len();
        Ok(())
    }

    /// Writes the rows still buffered once every request has ended and, if `moved` is given,
    /// moves the current revision from its first revision (the batch's start) to its second,
    /// together where the backend can.
    pub(crate) async fn finish(&mut self, moved: Option<(i64, i64)>) -> Result<()> {
        let Some((before, current)) = moved else {
            return self.flush().await;
        };
        self.tx
            .append(&self.rows[self.flushed..], before, current, &self.attached)
            .await?;
        self.flushed = self.rows.len();
        Ok(())
    }

    /// Starts a request: what it writes from now on can be undone by [`Batch::end_request`].
    pub(crate) fn begin_request(&mut self) {
        self.request_start = self.rows.len();
        self.request_mark = Some(self.index.mark());
        self.savepoint = false;
    }

    /// Ends a request; if it `failed`, undoes everything it wrote.
    pub(crate) async fn end_request(&mut self, failed: bool) -> Result<()> {
        let mark = self.request_mark.take();
        if failed {
            if let Some(mark) = mark {
                self.index.rollback(mark);
            }
            self.rows.truncate(self.request_start);
            self.flushed = self.flushed.min(self.request_start);
            if self.savepoint {
                self.tx.rollback_to_savepoint().await?;
            }
        } else if self.savepoint {
            self.tx.release_savepoint().await?;
        }
        self.savepoint = false;
        self.request_start = self.rows.len();
        Ok(())
    }
}

/// One txn (or lease revocation) of a batch, at revision `base + 1` if it writes.
pub(crate) struct TxnExec<'e, 'a> {
    batch: &'e mut Batch<'a>,
    /// The revision before this txn.
    base: i64,
    compact: i64,
    /// Sub-revision of the next change; 0 while nothing has been written.
    next_sub: i64,
}

impl<'e, 'a> TxnExec<'e, 'a> {
    pub(crate) fn new(batch: &'e mut Batch<'a>, base: i64, compact: i64) -> Self {
        Self {
            batch,
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

    pub(crate) fn run<'f>(
        &'f mut self,
        req: &'f TxnRequest,
    ) -> Pin<Box<dyn Future<Output = Result<TxnResponse>> + Send + 'f>> {
        Box::pin(async move {
            let mut succeeded = true;
            for compare in &req.compares {
                let with_values = matches!(compare.target, CompareTarget::Value(_));
                let kvs = self.batch.live(&compare.range, with_values).await?;
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

    async fn range(&mut self, req: &RangeRequest) -> Result<RangeResponse> {
        let view = self.view();
        let revision = super::resolve_read_revision(req.revision, view, self.compact)?;
        if revision == view {
            // The range as it is now (one key, for kube-apiserver's "else read it back"
            // branch): the index and the values this batch holds answer it without SQL, values
            // read only for the keys the answer can hold.
            let take = fetch_limit(req).map(|limit| limit as usize);
            let (count, kvs) = self
                .batch
                .live_first(&req.range, super::read::needs_values(req), take)
                .await?;
            if req.count_only {
                return Ok(RangeResponse {
                    count,
                    ..RangeResponse::default()
                });
            }
            return Ok(finish_range(req, kvs, count));
        }
        // SQL answers Ranges at older revisions: it must see every row.
        self.batch.flush().await?;
        let tx = &mut self.batch.tx;
        let count = tx.count(&req.range.key, &req.range.end, revision).await?;
        if req.count_only {
            return Ok(RangeResponse {
                count,
                ..RangeResponse::default()
            });
        }
        let rows = tx
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
        let head = self.batch.index.get(&req.key).copied();
        let prev_revision = head.map_or(0, |meta| meta.mod_revision);
        let existing = head.filter(|meta| !meta.deleted);
        if existing.is_none() && (req.value.is_none() || req.lease.is_none()) {
            return Err(Error::KeyNotFound);
        }
        let lease = match (req.lease, existing) {
            (Some(lease), _) => lease,
            (None, Some(meta)) => meta.lease,
            (None, None) => return Err(Error::KeyNotFound),
        };
        if req.lease.is_some() && lease != 0 && !self.batch.attach_lease(lease).await? {
            return Err(Error::LeaseNotFound);
        }
        // The old value goes into the row (a watch's prev_kv) even if this reply needs none.
        let old_value = match existing {
            Some(meta) => {
                let wanted = [(req.key.clone(), meta.mod_revision)];
                self.batch.values_of(&wanted).await?.pop()
            }
            None => None,
        };
        let value = match (&req.value, &old_value) {
            (Some(v), _) => v.clone(),
            (None, Some(old)) => old.clone(),
            (None, None) => return Err(Error::KeyNotFound),
        };
        let (revision, sub) = self.next_change();
        let prev_kv = match (existing, &old_value) {
            (Some(meta), Some(old)) if req.prev_kv => Some(meta.to_kv(&req.key, old.clone())),
            _ => None,
        };
        self.batch.write(LogRow {
            revision,
            sub,
            key: req.key.clone(),
            created: existing.is_none(),
            deleted: false,
            create_revision: existing.map_or(revision, |meta| meta.create_revision),
            prev_revision,
            version: existing.map_or(1, |meta| meta.version + 1),
            lease,
            value,
            old_value,
            old_lease: existing.map_or(0, |meta| meta.lease),
        });
        Ok(PutResponse { prev_kv })
    }

    async fn delete(&mut self, req: &DeleteRequest) -> Result<DeleteResponse> {
        let doomed = self.batch.live(&req.range, true).await?;
        for kv in &doomed {
            self.tombstone(kv);
        }
        Ok(DeleteResponse {
            deleted: doomed.len() as i64,
            prev_kvs: if req.prev_kv { doomed } else { Vec::new() },
        })
    }

    /// Writes the deletion of a live key.
    fn tombstone(&mut self, kv: &KeyValue) {
        let (revision, sub) = self.next_change();
        self.batch.write(LogRow {
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
        });
    }

    /// Deletes lease `id` and every key attached to it.
    ///
    /// # Errors
    /// `LeaseNotFound` if the lease does not exist.
    pub(crate) async fn revoke(&mut self, id: i64) -> Result<()> {
        if !self.batch.tx.delete_lease(id).await? {
            return Err(Error::LeaseNotFound);
        }
        self.batch.lease_changed(id, false);
        // With their values: each deletion's event carries the value it ended.
        for kv in self.batch.leased(id).await? {
            self.tombstone(&kv);
        }
        Ok(())
    }
}
