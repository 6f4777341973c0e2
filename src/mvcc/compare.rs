//! Txn compare evaluation and Range post-processing: pure rules, no I/O.

use std::cmp::Ordering;

use super::types::{
    Compare, CompareResult, CompareTarget, KeyValue, RangeRequest, RangeResponse, SortOrder,
    SortTarget,
};

/// Evaluates one compare against the keys its range currently holds.
///
/// Like etcd, a compare over a range holds only if it holds for every key in it, and a range
/// with no key compares as one absent key: version, create and mod revision and lease 0 — except
/// that a `VALUE` compare against nothing is always false.
pub fn evaluate(compare: &Compare, kvs: &[KeyValue]) -> bool {
    if kvs.is_empty() {
        if matches!(compare.target, CompareTarget::Value(_)) {
            return false;
        }
        return evaluate_one(compare, &KeyValue::default());
    }
    kvs.iter().all(|kv| evaluate_one(compare, kv))
}

fn evaluate_one(compare: &Compare, kv: &KeyValue) -> bool {
    let ordering = match &compare.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
        CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
    };
    match compare.result {
        CompareResult::Equal => ordering == Ordering::Equal,
        CompareResult::NotEqual => ordering != Ordering::Equal,
        CompareResult::Greater => ordering == Ordering::Greater,
        CompareResult::Less => ordering == Ordering::Less,
    }
}

/// How many rows a Range must fetch in key order before [`finish_range`] can apply its options:
/// `None` when it needs every key (sorting and filters look at all of them), else one past the
/// limit so `more` can be told.
pub fn fetch_limit(req: &RangeRequest) -> Option<i64> {
    if req.limit <= 0 || req.sort.is_some() || req.has_filters() {
        None
    } else {
        Some(req.limit + 1)
    }
}

/// Applies a Range's filters, sort order and limit to keys fetched in key order. `count` is the
/// number of keys in the range, which etcd reports before filters and limit.
pub fn finish_range(req: &RangeRequest, mut kvs: Vec<KeyValue>, count: i64) -> RangeResponse {
    let keep = |kv: &KeyValue| {
        (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
    };
    if req.has_filters() {
        kvs.retain(keep);
    }
    if let Some((target, order)) = req.sort {
        // Stable, so keys that tie on the target stay in key order.
        kvs.sort_by(|a, b| {
            let ordering = match target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            };
            match order {
                SortOrder::Ascend => ordering,
                SortOrder::Descend => ordering.reverse(),
            }
        });
    }
    let mut more = false;
    if req.limit > 0 && kvs.len() as i64 > req.limit {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    RangeResponse { kvs, more, count }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::types::KeyRange;

    fn kv(key: &str, create: i64, modr: i64, version: i64, value: &str) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: modr,
            version,
            value: value.as_bytes().to_vec(),
            lease: 0,
        }
    }

    fn cmp(target: CompareTarget, result: CompareResult) -> Compare {
        Compare {
            range: KeyRange::single(b"k".to_vec()),
            target,
            result,
        }
    }

    #[test]
    fn missing_key_compares_as_zero() {
        assert!(evaluate(
            &cmp(CompareTarget::Mod(0), CompareResult::Equal),
            &[]
        ));
        assert!(evaluate(
            &cmp(CompareTarget::Version(0), CompareResult::Equal),
            &[]
        ));
        assert!(evaluate(
            &cmp(CompareTarget::Create(1), CompareResult::Less),
            &[]
        ));
        assert!(evaluate(
            &cmp(CompareTarget::Lease(0), CompareResult::Equal),
            &[]
        ));
        // A value compare needs a key, whatever the operator.
        for result in [
            CompareResult::Equal,
            CompareResult::NotEqual,
            CompareResult::Greater,
            CompareResult::Less,
        ] {
            assert!(!evaluate(&cmp(CompareTarget::Value(vec![]), result), &[]));
        }
    }

    #[test]
    fn every_operator_on_every_target() {
        let k = kv("k", 2, 5, 3, "m");
        let cases = [
            (CompareTarget::Version(3), CompareResult::Equal, true),
            (CompareTarget::Version(2), CompareResult::Greater, true),
            (CompareTarget::Version(3), CompareResult::Greater, false),
            (CompareTarget::Create(3), CompareResult::Less, true),
            (CompareTarget::Create(2), CompareResult::NotEqual, false),
            (CompareTarget::Mod(5), CompareResult::Equal, true),
            (CompareTarget::Mod(4), CompareResult::Equal, false),
            (CompareTarget::Mod(4), CompareResult::NotEqual, true),
            (
                CompareTarget::Value(b"m".to_vec()),
                CompareResult::Equal,
                true,
            ),
            (
                CompareTarget::Value(b"l".to_vec()),
                CompareResult::Greater,
                true,
            ),
            (
                CompareTarget::Value(b"ma".to_vec()),
                CompareResult::Less,
                true,
            ),
            (
                CompareTarget::Value(b"n".to_vec()),
                CompareResult::Greater,
                false,
            ),
            (CompareTarget::Lease(0), CompareResult::Equal, true),
            (CompareTarget::Lease(7), CompareResult::Less, true),
        ];
        for (target, result, expected) in cases {
            let c = cmp(target.clone(), result);
            assert_eq!(
                evaluate(&c, std::slice::from_ref(&k)),
                expected,
                "{target:?} {result:?}"
            );
        }
    }

    #[test]
    fn range_compare_needs_every_key() {
        let keys = [kv("a", 2, 2, 1, "x"), kv("b", 3, 4, 2, "y")];
        assert!(evaluate(
            &cmp(CompareTarget::Mod(5), CompareResult::Less),
            &keys
        ));
        assert!(!evaluate(
            &cmp(CompareTarget::Version(1), CompareResult::Equal),
            &keys
        ));
    }

    fn request(limit: i64) -> RangeRequest {
        let mut r = RangeRequest::of(KeyRange::from_etcd(b"a".to_vec(), vec![0]));
        r.limit = limit;
        r
    }

    #[test]
    fn limit_sets_more_only_when_keys_were_cut() {
        let kvs = vec![kv("a", 2, 2, 1, "1"), kv("b", 3, 3, 1, "2")];
        let r = finish_range(&request(2), kvs.clone(), 2);
        assert_eq!((r.kvs.len(), r.more, r.count), (2, false, 2));
        let r = finish_range(&request(1), kvs.clone(), 2);
        assert_eq!((r.kvs.len(), r.more, r.count), (1, true, 2));
        let r = finish_range(&request(0), kvs, 2);
        assert_eq!((r.kvs.len(), r.more), (2, false));
    }

    #[test]
    fn fetch_limit_reads_one_extra_unless_it_must_see_all() {
        assert_eq!(fetch_limit(&request(0)), None);
        assert_eq!(fetch_limit(&request(10)), Some(11));
        let mut sorted = request(10);
        sorted.sort = Some((SortTarget::Mod, SortOrder::Descend));
        assert_eq!(fetch_limit(&sorted), None);
        let mut filtered = request(10);
        filtered.min_mod_revision = 3;
        assert_eq!(fetch_limit(&filtered), None);
    }

    #[test]
    fn sort_then_limit_and_filters_keep_count() {
        let kvs = vec![
            kv("a", 2, 9, 4, "z"),
            kv("b", 3, 3, 1, "y"),
            kv("c", 4, 7, 2, "x"),
        ];
        let mut r = request(2);
        r.sort = Some((SortTarget::Mod, SortOrder::Descend));
        let out = finish_range(&r, kvs.clone(), 3);
        let keys: Vec<_> = out.kvs.iter().map(|k| k.key.clone()).collect();
        assert_eq!(keys, vec![b"a".to_vec(), b"c".to_vec()]);
        assert!(out.more);

        let mut r = request(0);
        r.sort = Some((SortTarget::Value, SortOrder::Ascend));
        r.min_mod_revision = 4;
        let out = finish_range(&r, kvs.clone(), 3);
        let keys: Vec<_> = out.kvs.iter().map(|k| k.key.clone()).collect();
        assert_eq!(keys, vec![b"c".to_vec(), b"a".to_vec()]);
        assert_eq!(out.count, 3);

        let mut r = request(0);
        r.max_create_revision = 3;
        r.keys_only = true;
        let out = finish_range(&r, kvs, 3);
        assert_eq!(out.kvs.len(), 2);
        assert!(out.kvs.iter().all(|k| k.value.is_empty()));
    }
}
