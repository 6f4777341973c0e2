//! Rebasing a presumed batch past other instances' commits (a shared database).
//!
//! A presumed batch runs on the writer's key index as of revision P, outside the writers' lock,
//! and writes in one statement that takes the lock. If other instances committed meanwhile
//! (the database is at C > P), the batch's answers and rows are still exactly right at C when
//! nothing it looked at changed after P: then running it after those commits would have
//! answered the same and written the same rows, only numbered `C - P` higher. So the statement
//! writes the rows renumbered instead of refusing them, and the writer renumbers its answers.
//!
//! Invariants:
//! - A batch is rebasable only if every request is a txn that looks at single keys alone
//!   (compares, Puts, Deletes and current-revision Ranges of one key, at any depth): what it
//!   looked at is then the set of those keys, and the statement finds any change to one of them
//!   after P in `kv_head`. A range, a lease change or a compaction reads more than its keys.
//! - Renumbering moves every revision above P by `C - P` and leaves those at or below P alone:
//!   revisions above P are the batch's own (its rows, and what its requests read of rows it
//!   wrote), and the rest were committed before it. A header's revision is at least P and
//!   always moves: the answer holds at C.

use super::types::{KeyValue, Op, OpResponse, Revisioned, TxnRequest, TxnResponse};
use crate::backend::{LogRow, RangeEnd};

/// The keys a batch's jobs look at, each once, if that is all they look at; `None` if the batch
/// is not rebasable. A job that is not a txn comes as `None`.
pub(crate) fn keys_looked_at<'r>(
    jobs: impl IntoIterator<Item = Option<&'r TxnRequest>>,
) -> Option<Vec<Vec<u8>>> {
    fn visit(txn: &TxnRequest, keys: &mut Vec<Vec<u8>>) -> bool {
        for compare in &txn.compares {
            if compare.range.end != RangeEnd::Single {
                return false;
            }
            keys.push(compare.range.key.clone());
        }
        txn.success.iter().chain(&txn.failure).all(|op| match op {
            Op::Put(put) => {
                keys.push(put.key.clone());
                true
            }
            Op::Delete(delete) if delete.range.end == RangeEnd::Single => {
                keys.push(delete.range.key.clone());
                true
            }
            Op::Range(range) if range.range.end == RangeEnd::Single && range.revision <= 0 => {
                keys.push(range.range.key.clone());
                true
            }
            Op::Txn(nested) => visit(nested, keys),
            Op::Delete(_) | Op::Range(_) => false,
        })
    }
    let mut keys = Vec::new();
    for job in jobs {
        if !visit(job?, &mut keys) {
            return None;
        }
    }
    keys.sort_unstable();
    keys.dedup();
    Some(keys)
}

/// Moves a revision above `after` by `by`.
fn shifted(revision: i64, after: i64, by: i64) -> i64 {
    if revision > after {
        revision + by
    } else {
        revision
    }
}

/// Renumbers rows the batch wrote after revision `after` by `by`.
pub(crate) fn shift_rows(rows: &mut [LogRow], after: i64, by: i64) {
    for row in rows {
        row.revision = shifted(row.revision, after, by);
        row.create_revision = shifted(row.create_revision, after, by);
        row.prev_revision = shifted(row.prev_revision, after, by);
    }
}

fn shift_kv(kv: &mut KeyValue, after: i64, by: i64) {
    kv.create_revision = shifted(kv.create_revision, after, by);
    kv.mod_revision = shifted(kv.mod_revision, after, by);
}

fn shift_response(response: &mut TxnResponse, after: i64, by: i64) {
    for op in &mut response.responses {
        match op {
            OpResponse::Range(range) => {
                range.kvs.iter_mut().for_each(|kv| shift_kv(kv, after, by));
            }
            OpResponse::Put(put) => {
                if let Some(kv) = &mut put.prev_kv {
                    shift_kv(kv, after, by);
                }
            }
            OpResponse::Delete(delete) => {
                delete
                    .prev_kvs
                    .iter_mut()
                    .for_each(|kv| shift_kv(kv, after, by));
            }
            OpResponse::Txn(nested) => shift_response(nested, after, by),
        }
    }
}

/// Renumbers a txn's answer made at or after revision `after` by `by`.
pub(crate) fn shift_answer(answer: &mut Revisioned<TxnResponse>, after: i64, by: i64) {
    answer.revision += by;
    shift_response(&mut answer.value, after, by);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::types::{
        Compare, CompareResult, CompareTarget, DeleteRequest, KeyRange, PutRequest, PutResponse,
        RangeRequest, RangeResponse,
    };

    fn put(key: &str) -> Op {
        Op::Put(PutRequest {
            key: key.into(),
            value: Some(b"v".to_vec()),
            lease: Some(0),
            prev_kv: false,
        })
    }

    fn get(range: KeyRange, revision: i64) -> Op {
        Op::Range(RangeRequest {
            revision,
            ..RangeRequest::of(range)
        })
    }

    /// kube-apiserver's GuaranteedUpdate: compare, put, or read the key back.
    fn update(key: &str) -> TxnRequest {
        TxnRequest {
            compares: vec![Compare {
                range: KeyRange::single(key.into()),
                target: CompareTarget::Mod(7),
                result: CompareResult::Equal,
            }],
            success: vec![put(key)],
            failure: vec![get(KeyRange::single(key.into()), 0)],
        }
    }

    #[test]
    fn single_key_txns_look_at_their_keys_alone() {
        let nested = TxnRequest {
            success: vec![Op::Txn(update("c")), put("a")],
            ..TxnRequest::default()
        };
        let keys = keys_looked_at([Some(&update("b")), Some(&nested), Some(&update("a"))]);
        assert_eq!(
            keys,
            Some(vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()])
        );
    }

    #[test]
    fn ranges_and_reads_at_a_revision_are_not_rebasable() {
        let prefix = KeyRange::from_etcd(b"a/".to_vec(), b"a0".to_vec());
        let list = TxnRequest {
            success: vec![get(prefix.clone(), 0)],
            ..TxnRequest::default()
        };
        let delete = TxnRequest {
            success: vec![Op::Delete(DeleteRequest {
                range: prefix.clone(),
                prev_kv: false,
            })],
            ..TxnRequest::default()
        };
        let compare = TxnRequest {
            compares: vec![Compare {
                range: prefix,
                target: CompareTarget::Version(0),
                result: CompareResult::Equal,
            }],
            ..TxnRequest::default()
        };
        let old = TxnRequest {
            failure: vec![get(KeyRange::single(b"k".to_vec()), 3)],
            ..TxnRequest::default()
        };
        let deep = TxnRequest {
            failure: vec![Op::Txn(list.clone())],
            ..TxnRequest::default()
        };
        for txn in [list, delete, compare, old, deep] {
            assert_eq!(
                keys_looked_at([Some(&update("k")), Some(&txn)]),
                None,
                "{txn:?}"
            );
        }
        // A lease change or a compaction.
        assert_eq!(keys_looked_at([Some(&update("k")), None]), None);
    }

    #[test]
    fn renumbering_moves_the_batchs_own_revisions_only() {
        let row = |revision, create_revision, prev_revision| LogRow {
            revision,
            create_revision,
            prev_revision,
            sub: 0,
            key: b"k".to_vec(),
            created: false,
            deleted: false,
            version: 2,
            lease: 0,
            value: Vec::new(),
            old_value: None,
            old_lease: 0,
        };
        // Written at 11 over a row of 4, then at 12 over its own row of 11.
        let mut rows = vec![row(11, 3, 4), row(12, 3, 11)];
        shift_rows(&mut rows, 10, 5);
        let numbers: Vec<_> = rows
            .iter()
            .map(|r| (r.revision, r.create_revision, r.prev_revision))
            .collect();
        assert_eq!(numbers, vec![(16, 3, 4), (17, 3, 16)]);

        let kv = |create_revision, mod_revision| KeyValue {
            key: b"k".to_vec(),
            create_revision,
            mod_revision,
            ..KeyValue::default()
        };
        let mut answer = Revisioned {
            revision: 12,
            value: TxnResponse {
                succeeded: false,
                responses: vec![
                    OpResponse::Range(RangeResponse {
                        kvs: vec![kv(11, 12), kv(2, 9)],
                        more: false,
                        count: 2,
                    }),
                    OpResponse::Put(PutResponse {
                        prev_kv: Some(kv(10, 10)),
                    }),
                ],
            },
        };
        shift_answer(&mut answer, 10, 5);
        assert_eq!(answer.revision, 17);
        let OpResponse::Range(range) = &answer.value.responses[0] else {
            panic!("a range answer");
        };
        assert_eq!(range.kvs, vec![kv(16, 17), kv(2, 9)]);
        assert_eq!(
            answer.value.responses[1],
            OpResponse::Put(PutResponse {
                prev_kv: Some(kv(10, 10))
            })
        );
    }
}
