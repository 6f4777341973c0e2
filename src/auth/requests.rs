//! What each kind of request needs, as etcd checks it: reads need read permission on their
//! range, writes write permission on theirs, a `prev_kv` read permission too, and a txn all of
//! its compares and of the ops in both branches (nested txns included, which etcd 3.5 skips).

use super::{Access, AuthError, AuthInfo, AuthStore};
use crate::backend::RangeEnd;
use crate::mvcc::types::{DeleteRequest, KeyRange, Op, PutRequest, RangeRequest, TxnRequest};

type Checked = Result<(), AuthError>;

/// A range in etcd's encoding: an empty end for one key, `"\0"` for every key from `key` on.
fn etcd_end(range: &KeyRange) -> &[u8] {
    match &range.end {
        RangeEnd::Single => &[],
        RangeEnd::Unbounded => &[0],
        RangeEnd::Before(end) => end,
    }
}

impl AuthStore {
    /// Whether `who` may do `access` on `range`.
    ///
    /// # Errors
    /// As [`AuthStore::check`].
    pub fn check_keys(&self, who: Option<&AuthInfo>, range: &KeyRange, access: Access) -> Checked {
        self.check(who, &range.key, etcd_end(range), access)
    }

    pub fn check_range(&self, who: Option<&AuthInfo>, req: &RangeRequest) -> Checked {
        self.check_keys(who, &req.range, Access::Read)
    }

    pub fn check_put(&self, who: Option<&AuthInfo>, req: &PutRequest) -> Checked {
        if !self.state().enabled {
            return Ok(());
        }
        self.check(who, &req.key, &[], Access::Write)?;
        if req.prev_kv {
            self.check(who, &req.key, &[], Access::Read)?;
        }
        Ok(())
    }

    pub fn check_delete(&self, who: Option<&AuthInfo>, req: &DeleteRequest) -> Checked {
        if !self.state().enabled {
            return Ok(());
        }
        self.check_keys(who, &req.range, Access::Write)?;
        if req.prev_kv {
            self.check_keys(who, &req.range, Access::Read)?;
        }
        Ok(())
    }

    pub fn check_txn(&self, who: Option<&AuthInfo>, req: &TxnRequest) -> Checked {
        if !self.state().enabled {
            return Ok(());
        }
        for compare in &req.compares {
            self.check_keys(who, &compare.range, Access::Read)?;
        }
        for op in req.success.iter().chain(&req.failure) {
            match op {
                Op::Range(range) => self.check_range(who, range)?,
                Op::Put(put) => self.check_put(who, put)?,
                Op::Delete(delete) => self.check_delete(who, delete)?,
                Op::Txn(txn) => self.check_txn(who, txn)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_go_back_to_etcds_encoding() {
        assert_eq!(etcd_end(&KeyRange::single(b"a".to_vec())), b"");
        assert_eq!(
            etcd_end(&KeyRange::from_etcd(b"a".to_vec(), vec![0])),
            b"\0"
        );
        assert_eq!(
            etcd_end(&KeyRange::from_etcd(b"a".to_vec(), b"b".to_vec())),
            b"b"
        );
    }
}
