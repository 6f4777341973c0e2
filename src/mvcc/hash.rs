//! HashKV as etcd computes it, so that `etcdctl endpoint hashkv` gives the same number for
//! the same history on etcd and on etcdsql (and on every etcdsql instance of one database).
//!
//! # What etcd hashes
//! etcd keeps one row per revision of a key in its backend, keyed by the revision: eight
//! big-endian bytes of the main revision, `_`, eight of the sub-revision, and a `t` after a
//! deletion. The row's value is the key's `mvccpb.KeyValue` in protobuf (key, create and mod
//! revision, version, value, lease; a deletion stores the key alone). HashKV at revision R
//! with compact revision C is a CRC-32C, seeded with the bucket name `key`, over the key and
//! value of, in revision order:
//! - every row above C and at or below R;
//! - of the rows at or below C (compaction left each key's newest one, deletions excepted),
//!   those still live at R; or, when no key at all is live at R, all of them.
//!
//! # Invariants
//! - The answer depends only on the log's history: rows compaction may still delete are never
//!   hashed (they are superseded at or before C, so neither live at C nor at R), so it is the
//!   same before, during and after physical compaction, on every instance, after a restart.
//! - Rows are fed in (revision, sub) order, each at most once per pass.

use std::collections::{HashMap, HashSet};

use prost::Message;

use super::{Error, Result, Store};
use crate::backend::{LogRow, ReadTxn};
use crate::pb::mvccpb;

/// Revisions read per statement while hashing: bounded memory however long the log is.
const HASH_WINDOW: i64 = 1024;

/// What HashKV answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    /// The compact revision, -1 if the store was never compacted (as etcd reports it).
    pub compact_revision: i64,
    /// The revision hashed.
    pub revision: i64,
    /// The current revision when the hash was taken.
    pub current: i64,
}

impl Store {
    /// HashKV at `revision` (0: the current one), computed as etcd computes it.
    ///
    /// # Errors
    /// The revision is compacted or in the future, or the backend fails.
    pub async fn hash_kv(&self, revision: i64) -> Result<KvHash> {
        // One snapshot for both passes, so they see the same log.
        let mut tx = self.inner.backend.read().await?;
        let revisions = tx.revisions().await?;
        // etcd's order of checks: a compacted revision first, then a future one.
        if revision > 0 && revision < revisions.compact {
            return Err(Error::Compacted);
        }
        if revision > revisions.current {
            return Err(Error::FutureRevision);
        }
        let at = if revision > 0 {
            revision
        } else {
            revisions.current
        };
        let compact = revisions.compact;
        let mut selection = Selection::new(compact);
        for_each_row(tx.as_mut(), at, |row| selection.see(row)).await?;
        let mut hasher = KvHasher::new(compact, selection.finish());
        for_each_row(tx.as_mut(), at, |row| hasher.feed(row)).await?;
        Ok(KvHash {
            hash: hasher.finish(),
            compact_revision: if compact > 0 { compact } else { -1 },
            revision: at,
            current: revisions.current,
        })
    }

    /// A hash of everything the log holds (every row, compacted or not), for etcd's Hash: the
    /// same on every instance of one database and across restarts, but unlike HashKV it moves
    /// when compaction removes rows.
    ///
    /// # Errors
    /// The backend fails.
    pub async fn hash_log(&self) -> Result<(u32, i64)> {
        let mut tx = self.inner.backend.read().await?;
        let current = tx.revisions().await?.current;
        let mut hasher = KvHasher::new(i64::MIN, HashSet::new());
        for_each_row(tx.as_mut(), current, |row| hasher.feed(row)).await?;
        Ok((hasher.finish(), current))
    }

    /// etcd's defragment: the backend gives the space of deleted rows back.
    ///
    /// # Errors
    /// The backend fails.
    pub async fn defragment(&self) -> Result<()> {
        Ok(self.inner.backend.defragment().await?)
    }
}

/// Calls `visit` on every row the log holds at or below `through`, in (revision, sub) order.
async fn for_each_row(
    tx: &mut dyn ReadTxn,
    through: i64,
    mut visit: impl FnMut(&LogRow),
) -> Result<()> {
    let mut after = 0;
    while after < through {
        let until = (after + HASH_WINDOW).min(through);
        for row in tx.changes(after, until).await? {
            visit(&row);
        }
        after = until;
    }
    Ok(())
}

/// Castagnoli's polynomial, as etcd's `crc32.MakeTable(crc32.Castagnoli)`.
const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// The first pass: which rows at or below the compact revision the hash takes.
pub(crate) struct Selection {
    compact: i64,
    /// Per key, the newest row seen at or below the compact revision: (revision, sub, deleted).
    newest_compacted: HashMap<Vec<u8>, (i64, i64, bool)>,
    /// Keys changed above the compact revision, with whether their last change was a put.
    changed: HashMap<Vec<u8>, bool>,
}

impl Selection {
    pub fn new(compact: i64) -> Self {
        Self {
            compact,
            newest_compacted: HashMap::new(),
            changed: HashMap::new(),
        }
    }

    /// Takes in a row at or below the hash's revision.
    pub fn see(&mut self, row: &LogRow) {
        if row.revision <= self.compact {
            self.newest_compacted
                .insert(row.key.clone(), (row.revision, row.sub, row.deleted));
        } else {
            self.changed.insert(row.key.clone(), !row.deleted);
        }
    }

    /// The rows at or below the compact revision to hash, by (revision, sub).
    pub fn finish(self) -> HashSet<(i64, i64)> {
        let live_at_compact = self
            .newest_compacted
            .iter()
            .filter(|(_, (_, _, deleted))| !deleted);
        let still_live: HashSet<(i64, i64)> = live_at_compact
            .clone()
            .filter(|(key, _)| !self.changed.contains_key(*key))
            .map(|(_, &(revision, sub, _))| (revision, sub))
            .collect();
        let any_live = !still_live.is_empty() || self.changed.values().any(|&put| put);
        if any_live {
            still_live
        } else {
            live_at_compact
                .map(|(_, &(revision, sub, _))| (revision, sub))
                .collect()
        }
    }
}

/// The second pass: the CRC over the chosen rows.
pub(crate) struct KvHasher {
    digest: crc::Digest<'static, u32>,
    compact: i64,
    chosen: HashSet<(i64, i64)>,
    buf: Vec<u8>,
}

impl KvHasher {
    pub fn new(compact: i64, chosen: HashSet<(i64, i64)>) -> Self {
        let mut digest = CASTAGNOLI.digest();
        digest.update(b"key");
        Self {
            digest,
            compact,
            chosen,
            buf: Vec::new(),
        }
    }

    /// Takes in a row at or below the hash's revision, in (revision, sub) order.
    pub fn feed(&mut self, row: &LogRow) {
        if row.revision <= self.compact && !self.chosen.contains(&(row.revision, row.sub)) {
            return;
        }
        let mut key = [0u8; 18];
        key[..8].copy_from_slice(&row.revision.to_be_bytes());
        key[8] = b'_';
        key[9..17].copy_from_slice(&row.sub.to_be_bytes());
        let key = if row.deleted {
            key[17] = b't';
            &key[..]
        } else {
            &key[..17]
        };
        self.digest.update(key);
        let kv = if row.deleted {
            mvccpb::KeyValue {
                key: row.key.clone(),
                ..Default::default()
            }
        } else {
            mvccpb::KeyValue {
                key: row.key.clone(),
                create_revision: row.create_revision,
                mod_revision: row.revision,
                version: row.version,
                value: row.value.clone(),
                lease: row.lease,
            }
        };
        self.buf.clear();
        // Encoding into a Vec cannot run out of room.
        let _ = kv.encode(&mut self.buf);
        self.digest.update(&self.buf);
    }

    pub fn finish(self) -> u32 {
        self.digest.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(revision: i64, sub: i64, key: &str, value: &str, create: i64, version: i64) -> LogRow {
        LogRow {
            revision,
            sub,
            key: key.into(),
            created: version == 1,
            deleted: false,
            create_revision: create,
            prev_revision: 0,
            version,
            lease: 0,
            value: value.into(),
            old_value: None,
            old_lease: 0,
        }
    }

    fn delete(revision: i64, sub: i64, key: &str) -> LogRow {
        LogRow {
            deleted: true,
            ..put(revision, sub, key, "", 0, 0)
        }
    }

    fn hash(rows: &[LogRow], compact: i64, revision: i64) -> u32 {
        let rows: Vec<&LogRow> = rows.iter().filter(|r| r.revision <= revision).collect();
        let mut selection = Selection::new(compact);
        rows.iter().for_each(|r| selection.see(r));
        let mut hasher = KvHasher::new(compact, selection.finish());
        rows.iter().for_each(|r| hasher.feed(r));
        hasher.finish()
    }

    #[test]
    fn one_put_hashes_as_etcd_3_5_does() {
        // etcd 3.5.30, fresh member, `etcdctl put a 1`: `endpoint hashkv` said 2587454935.
        assert_eq!(hash(&[put(2, 0, "a", "1", 2, 1)], -1, 2), 2_587_454_935);
    }

    #[test]
    fn rows_below_the_compact_revision_count_only_while_live() {
        let rows = [
            put(2, 0, "a", "1", 2, 1),
            put(3, 0, "b", "1", 3, 1),
            put(4, 0, "a", "2", 2, 2),
            delete(5, 0, "b"),
        ];
        // Compacted at 4: "a"@4 is live at 5, "b"@3 is not (deleted at 5, above C).
        let compacted = hash(&rows[1..], 4, 5);
        assert_eq!(compacted, hash(&rows[2..], 4, 5));
        // The row superseded before C ("a"@2) never counts, whether or not it is still there.
        assert_eq!(compacted, hash(&rows, 4, 5));
        // Nothing live at R: every row compaction keeps at or below C counts.
        let all_gone = [
            put(2, 0, "a", "1", 2, 1),
            delete(3, 0, "a"),
            put(4, 0, "b", "1", 4, 1),
            delete(5, 0, "b"),
        ];
        let none_live = hash(&all_gone, 4, 5);
        assert_ne!(none_live, hash(&all_gone[3..], 4, 5));
        assert_eq!(none_live, hash(&all_gone[2..], 4, 5));
    }
}
