//! Validated requests and their results, in etcd's vocabulary but free of protobuf.
//!
//! The API layer builds these only after checking a request, so the MVCC layer can trust them:
//! keys are non-empty, ops are within limits, a txn branch writes no key twice.

use crate::backend::{LeaseRow, LogRow, RangeEnd};
use std::ops::Bound;

/// A key and its version data, as a client sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: Vec<u8>,
    pub lease: i64,
}

impl KeyValue {
    /// The key as a live row of the log describes it.
    pub fn from_row(row: LogRow) -> Self {
        Self {
            key: row.key,
            create_revision: row.create_revision,
            mod_revision: row.revision,
            version: row.version,
            value: row.value,
            lease: row.lease,
        }
    }
}

/// A key range's start and end, as ordered maps take them.
pub type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// `[key, end)` as etcd's `key` / `range_end` pair describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub key: Vec<u8>,
    pub end: RangeEnd,
}

impl KeyRange {
    /// Reads etcd's encoding: empty end = one key; `"\0"` = every key from `key` on.
    pub fn from_etcd(key: Vec<u8>, range_end: Vec<u8>) -> Self {
        let end = match range_end.as_slice() {
            [] => RangeEnd::Single,
            [0] => RangeEnd::Unbounded,
            _ => RangeEnd::Before(range_end),
        };
        Self { key, end }
    }

    pub fn single(key: Vec<u8>) -> Self {
        Self {
            key,
            end: RangeEnd::Single,
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        match &self.end {
            RangeEnd::Single => key == self.key.as_slice(),
            RangeEnd::Unbounded => key >= self.key.as_slice(),
            RangeEnd::Before(end) => key >= self.key.as_slice() && key < end.as_slice(),
        }
    }

    /// Whether the range holds no key at all (`end <= key`), which etcd answers with nothing.
    /// The range as bounds of an ordered map of keys; `None` for a reversed range, which holds
    /// nothing (and which `BTreeMap::range` would panic on).
    pub fn bounds(&self) -> Option<KeyBounds<'_>> {
        let start = Bound::Included(self.key.as_slice());
        match &self.end {
            RangeEnd::Single => Some((start, start)),
            _ if self.is_empty() => None,
            RangeEnd::Unbounded => Some((start, Bound::Unbounded)),
            RangeEnd::Before(end) => Some((start, Bound::Excluded(end.as_slice()))),
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(&self.end, RangeEnd::Before(end) if end.as_slice() <= self.key.as_slice())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortTarget {
    Key,
    Version,
    Create,
    Mod,
    Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortOrder {
    Ascend,
    Descend,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRequest {
    pub range: KeyRange,
    /// 0 (or less) reads the current revision.
    pub revision: i64,
    /// 0 = no limit.
    pub limit: i64,
    /// `None` keeps key order.
    pub sort: Option<(SortTarget, SortOrder)>,
    pub keys_only: bool,
    pub count_only: bool,
    /// Filters; 0 = off.
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

impl RangeRequest {
    /// A plain read of the current value of one range.
    pub fn of(range: KeyRange) -> Self {
        Self {
            range,
            revision: 0,
            limit: 0,
            sort: None,
            keys_only: false,
            count_only: false,
            min_mod_revision: 0,
            max_mod_revision: 0,
            min_create_revision: 0,
            max_create_revision: 0,
        }
    }

    pub(crate) fn has_filters(&self) -> bool {
        self.min_mod_revision != 0
            || self.max_mod_revision != 0
            || self.min_create_revision != 0
            || self.max_create_revision != 0
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutRequest {
    pub key: Vec<u8>,
    /// `None` keeps the current value (`ignore_value`).
    pub value: Option<Vec<u8>>,
    /// `None` keeps the current lease (`ignore_lease`); `Some(0)` detaches the key.
    pub lease: Option<i64>,
    pub prev_kv: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutResponse {
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteResponse {
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

/// What a compare looks at, with the operand it is compared against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Vec<u8>),
    Lease(i64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub range: KeyRange,
    pub target: CompareTarget,
    pub result: CompareResult,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Range(RangeRequest),
    Put(PutRequest),
    Delete(DeleteRequest),
    Txn(TxnRequest),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRequest {
    pub compares: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl TxnRequest {
    /// The longest key any Put in either branch, at any depth, writes.
    pub fn longest_put_key(&self) -> usize {
        self.success
            .iter()
            .chain(&self.failure)
            .map(|op| match op {
                Op::Put(put) => put.key.len(),
                Op::Txn(txn) => txn.longest_put_key(),
                Op::Range(_) | Op::Delete(_) => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether any op in either branch, at any depth, may write.
    pub fn may_write(&self) -> bool {
        self.success.iter().chain(&self.failure).any(|op| match op {
            Op::Range(_) => false,
            Op::Put(_) | Op::Delete(_) => true,
            Op::Txn(txn) => txn.may_write(),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResponse {
    Range(RangeResponse),
    Put(PutResponse),
    Delete(DeleteResponse),
    Txn(TxnResponse),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnResponse {
    pub succeeded: bool,
    pub responses: Vec<OpResponse>,
}

/// A change to the lease table, applied by the writer like any other write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseOp {
    Grant(LeaseRow),
    /// Deletes the lease and every key attached to it, in one revision.
    Revoke(i64),
    /// Moves the deadline to `now` + the granted TTL, unless the lease has already run out.
    KeepAlive {
        id: i64,
        now: i64,
    },
    /// Revokes up to `limit` leases whose deadline is at or before `now`, each in its own
    /// revision, as etcd does.
    Expire {
        now: i64,
        limit: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    Granted,
    Revoked,
    /// The granted TTL, or `None` if the lease does not exist (or had run out).
    KeptAlive(Option<i64>),
    /// How many leases were revoked.
    Expired(usize),
}

/// A result together with the revision its response header reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revisioned<T> {
    pub revision: i64,
    pub value: T,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_range_end_encoding() {
        assert_eq!(
            KeyRange::from_etcd(b"a".to_vec(), vec![]).end,
            RangeEnd::Single
        );
        assert_eq!(
            KeyRange::from_etcd(b"a".to_vec(), vec![0]).end,
            RangeEnd::Unbounded
        );
        assert_eq!(
            KeyRange::from_etcd(b"a".to_vec(), b"b".to_vec()).end,
            RangeEnd::Before(b"b".to_vec())
        );
    }

    #[test]
    fn contains_follows_byte_order() {
        let r = KeyRange::from_etcd(b"a/".to_vec(), b"a0".to_vec());
        assert!(r.contains(b"a/"));
        assert!(r.contains(b"a/\x00"));
        assert!(r.contains(b"a/\xff"));
        assert!(!r.contains(b"a0"));
        assert!(!r.contains(b"a"));
        let all = KeyRange::from_etcd(vec![0], vec![0]);
        assert!(all.contains(b"\x00"));
        assert!(all.contains(b"zzz"));
        let one = KeyRange::single(b"k".to_vec());
        assert!(one.contains(b"k"));
        assert!(!one.contains(b"k\x00"));
    }

    #[test]
    fn inverted_range_is_empty() {
        assert!(KeyRange::from_etcd(b"b".to_vec(), b"a".to_vec()).is_empty());
        assert!(KeyRange::from_etcd(b"b".to_vec(), b"b".to_vec()).is_empty());
        assert!(!KeyRange::from_etcd(b"a".to_vec(), b"b".to_vec()).is_empty());
        assert!(!KeyRange::from_etcd(b"a".to_vec(), vec![0]).is_empty());
    }
}
