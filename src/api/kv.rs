//! The KV service: Range, Put, DeleteRange, Txn, Compact.
//!
//! Validation follows etcd's own order of checks, so that a request etcd rejects is rejected
//! here with the same error: size first, then empty keys and op counts, then duplicate keys.

use std::collections::HashSet;

use tonic::{Request, Response, Status};

use super::ServerInfo;
use super::auth::{Callers, Credentials};
use super::status::RequestError;
use crate::auth::{Access, AuthInfo};
use crate::metrics::{Metrics, OpCounts};
use crate::mvcc::Store;
use crate::mvcc::types::{
    Compare, CompareResult, CompareTarget, DeleteRequest, DeleteResponse, KeyRange, KeyValue, Op,
    OpResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, SortOrder, SortTarget,
    TxnRequest, TxnResponse,
};
use crate::pb::etcdserverpb as pb;
use crate::pb::mvccpb;

pub struct KvService {
    store: Store,
    info: ServerInfo,
    metrics: Metrics,
    callers: Callers,
}

impl KvService {
    pub fn new(store: Store, info: ServerInfo, metrics: Metrics, callers: Callers) -> Self {
        Self {
            store,
            info,
            metrics,
            callers,
        }
    }
}

impl KvService {
    /// While auth is on, a key may join a lease only if the caller may write every key already
    /// on it: otherwise the caller could not revoke the lease it extends (etcd's rule).
    async fn check_lease_keys(
        &self,
        caller: Option<&AuthInfo>,
        lease: Option<i64>,
    ) -> Result<(), Status> {
        let auth = self.callers.auth();
        let Some(lease) = lease.filter(|&l| l != 0 && auth.state().enabled) else {
            return Ok(());
        };
        let attached = self.store.read_lease(lease, true).await?;
        for key in attached.value.map(|(_, keys)| keys).unwrap_or_default() {
            auth.check(caller, &key, &[], Access::Write)?;
        }
        Ok(())
    }
}

/// The leases a txn's puts attach keys to, at any depth.
fn txn_put_leases(txn: &TxnRequest) -> Vec<i64> {
    let mut leases = Vec::new();
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            Op::Put(PutRequest {
                lease: Some(lease), ..
            }) if *lease != 0 => leases.push(*lease),
            Op::Txn(inner) => leases.extend(txn_put_leases(inner)),
            _ => {}
        }
    }
    leases.sort_unstable();
    leases.dedup();
    leases
}

#[tonic::async_trait]
impl pb::kv_server::Kv for KvService {
    async fn range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let credentials = Credentials::of(&request);
        let req = request.into_inner();
        self.info.check_size(&req)?;
        let range = convert_range(req)?;
        let caller = self.callers.resolve(&credentials)?;
        self.callers.auth().check_range(caller.as_ref(), &range)?;
        let out = self.store.range(&range).await?;
        self.metrics.record_ops(OpCounts {
            ranges: 1,
            ..OpCounts::default()
        });
        Ok(Response::new(range_to_pb(
            out.value,
            self.info.header(out.revision),
        )))
    }

    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        let credentials = Credentials::of(&request);
        let req = request.into_inner();
        self.info.check_size(&req)?;
        let put = convert_put(req)?;
        let caller = self.callers.resolve(&credentials)?;
        self.callers.auth().check_put(caller.as_ref(), &put)?;
        self.check_lease_keys(caller.as_ref(), put.lease).await?;
        let out = self.store.put(put).await?;
        self.metrics.record_ops(OpCounts {
            puts: 1,
            ..OpCounts::default()
        });
        Ok(Response::new(put_to_pb(
            out.value,
            self.info.header(out.revision),
        )))
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let credentials = Credentials::of(&request);
        let req = request.into_inner();
        self.info.check_size(&req)?;
        let delete = convert_delete(req)?;
        let caller = self.callers.resolve(&credentials)?;
        self.callers.auth().check_delete(caller.as_ref(), &delete)?;
        let out = self.store.delete(delete).await?;
        self.metrics.record_ops(OpCounts {
            deletes: 1,
            ..OpCounts::default()
        });
        Ok(Response::new(delete_to_pb(
            out.value,
            self.info.header(out.revision),
        )))
    }

    async fn txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<Response<pb::TxnResponse>, Status> {
        let credentials = Credentials::of(&request);
        let req = request.into_inner();
        self.info.check_size(&req)?;
        let txn = convert_txn(req, self.info.max_txn_ops)?;
        let caller = self.callers.resolve(&credentials)?;
        self.callers.auth().check_txn(caller.as_ref(), &txn)?;
        for lease in txn_put_leases(&txn) {
            self.check_lease_keys(caller.as_ref(), Some(lease)).await?;
        }
        let out = self.store.txn(txn).await?;
        self.metrics.record_ops(OpCounts::of_txn(&out.value));
        Ok(Response::new(txn_to_pb(
            out.value,
            out.revision,
            self.info.header(out.revision),
        )))
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        self.callers.require_admin(&request)?;
        let req = request.into_inner();
        let current = self.store.compact(req.revision, req.physical).await?;
        Ok(Response::new(pb::CompactionResponse {
            header: self.info.header(current),
        }))
    }
}

fn non_empty(key: Vec<u8>) -> Result<Vec<u8>, RequestError> {
    if key.is_empty() {
        Err(RequestError::EmptyKey)
    } else {
        Ok(key)
    }
}

pub fn convert_range(req: pb::RangeRequest) -> Result<RangeRequest, RequestError> {
    use pb::range_request::{SortOrder as PbOrder, SortTarget as PbTarget};
    let key = non_empty(req.key)?;
    let order = PbOrder::try_from(req.sort_order)
        .map_err(|_| RequestError::UnknownEnum("sort order", req.sort_order))?;
    let target = match PbTarget::try_from(req.sort_target)
        .map_err(|_| RequestError::UnknownEnum("sort target", req.sort_target))?
    {
        PbTarget::Key => SortTarget::Key,
        PbTarget::Version => SortTarget::Version,
        PbTarget::Create => SortTarget::Create,
        PbTarget::Mod => SortTarget::Mod,
        PbTarget::Value => SortTarget::Value,
    };
    // Results come in key order already; etcd sorts ascending when only a target is named.
    let sort = match (order, target) {
        (PbOrder::None, SortTarget::Key) | (PbOrder::Ascend, SortTarget::Key) => None,
        (PbOrder::None | PbOrder::Ascend, target) => Some((target, SortOrder::Ascend)),
        (PbOrder::Descend, target) => Some((target, SortOrder::Descend)),
    };
    Ok(RangeRequest {
        range: KeyRange::from_etcd(key, req.range_end),
        revision: req.revision,
        limit: req.limit.max(0),
        sort,
        keys_only: req.keys_only,
        count_only: req.count_only,
        min_mod_revision: req.min_mod_revision,
        max_mod_revision: req.max_mod_revision,
        min_create_revision: req.min_create_revision,
        max_create_revision: req.max_create_revision,
    })
}

pub fn convert_put(req: pb::PutRequest) -> Result<PutRequest, RequestError> {
    let key = non_empty(req.key)?;
    if req.ignore_value && !req.value.is_empty() {
        return Err(RequestError::ValueProvided);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(RequestError::LeaseProvided);
    }
    Ok(PutRequest {
        key,
        value: (!req.ignore_value).then_some(req.value),
        lease: (!req.ignore_lease).then_some(req.lease),
        prev_kv: req.prev_kv,
    })
}

pub fn convert_delete(req: pb::DeleteRangeRequest) -> Result<DeleteRequest, RequestError> {
    let key = non_empty(req.key)?;
    Ok(DeleteRequest {
        range: KeyRange::from_etcd(key, req.range_end),
        prev_kv: req.prev_kv,
    })
}

fn convert_compare(c: pb::Compare) -> Result<Compare, RequestError> {
    use pb::compare::{CompareResult as PbResult, CompareTarget as PbTarget, TargetUnion};
    let key = non_empty(c.key)?;
    let result = match PbResult::try_from(c.result)
        .map_err(|_| RequestError::UnknownEnum("compare result", c.result))?
    {
        PbResult::Equal => CompareResult::Equal,
        PbResult::Greater => CompareResult::Greater,
        PbResult::Less => CompareResult::Less,
        PbResult::NotEqual => CompareResult::NotEqual,
    };
    // Like etcd, the operand is read from the union member the target names; any other member
    // (or none) counts as zero.
    let union = c.target_union;
    let target = match PbTarget::try_from(c.target)
        .map_err(|_| RequestError::UnknownEnum("compare target", c.target))?
    {
        PbTarget::Version => CompareTarget::Version(match union {
            Some(TargetUnion::Version(v)) => v,
            _ => 0,
        }),
        PbTarget::Create => CompareTarget::Create(match union {
            Some(TargetUnion::CreateRevision(v)) => v,
            _ => 0,
        }),
        PbTarget::Mod => CompareTarget::Mod(match union {
            Some(TargetUnion::ModRevision(v)) => v,
            _ => 0,
        }),
        PbTarget::Value => CompareTarget::Value(match union {
            Some(TargetUnion::Value(v)) => v,
            _ => Vec::new(),
        }),
        PbTarget::Lease => CompareTarget::Lease(match union {
            Some(TargetUnion::Lease(v)) => v,
            _ => 0,
        }),
    };
    Ok(Compare {
        range: KeyRange::from_etcd(key, c.range_end),
        target,
        result,
    })
}

/// Converts and validates a txn: op counts, empty keys, then no key written twice per branch.
pub fn convert_txn(req: pb::TxnRequest, max_ops: usize) -> Result<TxnRequest, RequestError> {
    let txn = convert_txn_ops(req, max_ops)?;
    check_branch(&txn.success)?;
    check_branch(&txn.failure)?;
    Ok(txn)
}

fn convert_txn_ops(req: pb::TxnRequest, max_ops: usize) -> Result<TxnRequest, RequestError> {
    let ops = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if ops > max_ops {
        return Err(RequestError::TooManyOps);
    }
    let compares = req
        .compare
        .into_iter()
        .map(convert_compare)
        .collect::<Result<_, _>>()?;
    let convert_ops = |ops: Vec<pb::RequestOp>| {
        ops.into_iter()
            .map(|op| convert_op(op, max_ops))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(TxnRequest {
        compares,
        success: convert_ops(req.success)?,
        failure: convert_ops(req.failure)?,
    })
}

fn convert_op(op: pb::RequestOp, max_ops: usize) -> Result<Op, RequestError> {
    use pb::request_op::Request as R;
    match op.request.ok_or(RequestError::EmptyOp)? {
        R::RequestRange(r) => convert_range(r).map(Op::Range),
        R::RequestPut(p) => convert_put(p).map(Op::Put),
        R::RequestDeleteRange(d) => convert_delete(d).map(Op::Delete),
        R::RequestTxn(t) => convert_txn_ops(t, max_ops).map(Op::Txn),
    }
}

/// The keys one branch may write: exact keys put, and ranges deleted.
#[derive(Default)]
struct Writes {
    puts: HashSet<Vec<u8>>,
    deletes: Vec<KeyRange>,
}

impl Writes {
    fn deleted(&self, key: &[u8]) -> bool {
        self.deletes.iter().any(|range| range.contains(key))
    }
}

/// etcd's rule: within one branch (nested txns included), no key is put twice and no key is
/// both put and deleted. Deleting overlapping ranges twice is allowed. Only one branch of a
/// nested txn runs, so its two branches are checked separately and may share keys.
fn check_branch(ops: &[Op]) -> Result<Writes, RequestError> {
    let mut writes = Writes::default();
    for op in ops {
        if let Op::Delete(d) = op {
            writes.deletes.push(d.range.clone());
        }
    }
    for op in ops {
        match op {
            Op::Put(p) => {
                if writes.deleted(&p.key) || !writes.puts.insert(p.key.clone()) {
                    return Err(RequestError::DuplicateKey);
                }
            }
            Op::Txn(t) => {
                let success = check_branch(&t.success)?;
                let failure = check_branch(&t.failure)?;
                let inner_puts: HashSet<&Vec<u8>> =
                    success.puts.iter().chain(&failure.puts).collect();
                for key in &inner_puts {
                    if writes.puts.contains(*key) || writes.deleted(key) {
                        return Err(RequestError::DuplicateKey);
                    }
                }
                let inner_deletes: Vec<&KeyRange> =
                    success.deletes.iter().chain(&failure.deletes).collect();
                if writes
                    .puts
                    .iter()
                    .any(|key| inner_deletes.iter().any(|range| range.contains(key)))
                {
                    return Err(RequestError::DuplicateKey);
                }
                writes.puts.extend(inner_puts.into_iter().cloned());
                writes.deletes.extend(inner_deletes.into_iter().cloned());
            }
            Op::Range(_) | Op::Delete(_) => {}
        }
    }
    Ok(writes)
}

pub fn kv_to_pb(kv: KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

fn range_to_pb(r: RangeResponse, header: Option<pb::ResponseHeader>) -> pb::RangeResponse {
    pb::RangeResponse {
        header,
        kvs: r.kvs.into_iter().map(kv_to_pb).collect(),
        more: r.more,
        count: r.count,
    }
}

fn put_to_pb(p: PutResponse, header: Option<pb::ResponseHeader>) -> pb::PutResponse {
    pb::PutResponse {
        header,
        prev_kv: p.prev_kv.map(kv_to_pb),
    }
}

fn delete_to_pb(d: DeleteResponse, header: Option<pb::ResponseHeader>) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header,
        deleted: d.deleted,
        prev_kvs: d.prev_kvs.into_iter().map(kv_to_pb).collect(),
    }
}

/// Inner responses carry a header with only the txn's revision, as etcd's do.
fn txn_to_pb(t: TxnResponse, revision: i64, header: Option<pb::ResponseHeader>) -> pb::TxnResponse {
    use pb::response_op::Response as R;
    let inner = || {
        Some(pb::ResponseHeader {
            revision,
            ..Default::default()
        })
    };
    let responses = t
        .responses
        .into_iter()
        .map(|r| pb::ResponseOp {
            response: Some(match r {
                OpResponse::Range(r) => R::ResponseRange(range_to_pb(r, inner())),
                OpResponse::Put(p) => R::ResponsePut(put_to_pb(p, inner())),
                OpResponse::Delete(d) => R::ResponseDeleteRange(delete_to_pb(d, inner())),
                OpResponse::Txn(t) => R::ResponseTxn(txn_to_pb(t, revision, inner())),
            }),
        })
        .collect();
    pb::TxnResponse {
        header,
        succeeded: t.succeeded,
        responses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::request_op::Request as R;

    fn put(key: &str) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(R::RequestPut(pb::PutRequest {
                key: key.into(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        }
    }

    fn delete(key: &str, end: &str) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(R::RequestDeleteRange(pb::DeleteRangeRequest {
                key: key.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        }
    }

    fn txn(success: Vec<pb::RequestOp>, failure: Vec<pb::RequestOp>) -> pb::TxnRequest {
        pb::TxnRequest {
            compare: vec![],
            success,
            failure,
        }
    }

    fn nested(t: pb::TxnRequest) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(R::RequestTxn(t)),
        }
    }

    fn check(t: pb::TxnRequest) -> Result<(), RequestError> {
        convert_txn(t, 128).map(|_| ())
    }

    #[test]
    fn duplicate_keys_in_a_branch_are_rejected() {
        assert_eq!(check(txn(vec![put("a"), put("b")], vec![])), Ok(()));
        assert_eq!(
            check(txn(vec![put("a"), put("a")], vec![])),
            Err(RequestError::DuplicateKey)
        );
        assert_eq!(
            check(txn(vec![put("b"), delete("a", "c")], vec![])),
            Err(RequestError::DuplicateKey)
        );
        // The two branches never both run.
        assert_eq!(check(txn(vec![put("a")], vec![put("a")])), Ok(()));
        // Overlapping deletes are fine.
        assert_eq!(
            check(txn(vec![delete("a", "c"), delete("b", "d")], vec![])),
            Ok(())
        );
    }

    #[test]
    fn nested_txns_join_the_outer_branch() {
        let inner = txn(vec![put("a")], vec![put("a")]);
        assert_eq!(check(txn(vec![nested(inner.clone())], vec![])), Ok(()));
        assert_eq!(
            check(txn(vec![put("a"), nested(inner)], vec![])),
            Err(RequestError::DuplicateKey)
        );
        let inner_delete = txn(vec![delete("a", "z")], vec![]);
        assert_eq!(
            check(txn(vec![put("m"), nested(inner_delete)], vec![])),
            Err(RequestError::DuplicateKey)
        );
    }

    #[test]
    fn op_limits_and_empty_keys() {
        let many: Vec<_> = (0..129).map(|i| put(&format!("k{i}"))).collect();
        assert_eq!(check(txn(many, vec![])), Err(RequestError::TooManyOps));
        assert_eq!(
            check(txn(vec![put("")], vec![])),
            Err(RequestError::EmptyKey)
        );
        assert_eq!(
            check(txn(vec![pb::RequestOp { request: None }], vec![])),
            Err(RequestError::EmptyOp)
        );
    }

    #[test]
    fn put_ignore_flags() {
        let base = pb::PutRequest {
            key: b"k".to_vec(),
            ..Default::default()
        };
        let p = convert_put(pb::PutRequest {
            ignore_value: true,
            ..base.clone()
        })
        .unwrap();
        assert_eq!((p.value, p.lease), (None, Some(0)));
        assert_eq!(
            convert_put(pb::PutRequest {
                ignore_value: true,
                value: b"x".to_vec(),
                ..base.clone()
            }),
            Err(RequestError::ValueProvided)
        );
        assert_eq!(
            convert_put(pb::PutRequest {
                ignore_lease: true,
                lease: 5,
                ..base
            }),
            Err(RequestError::LeaseProvided)
        );
    }

    #[test]
    fn sort_target_alone_sorts_ascending() {
        let r = convert_range(pb::RangeRequest {
            key: b"a".to_vec(),
            sort_target: pb::range_request::SortTarget::Mod as i32,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.sort, Some((SortTarget::Mod, SortOrder::Ascend)));
        let r = convert_range(pb::RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.sort, None);
    }
}
