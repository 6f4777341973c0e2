//! Range reads: from the applied index where it holds the revision asked for, else from SQL.
//!
//! The rules that make either answer correct are the module's ("Reads" in [`super`]): a read
//! never answers at a revision below one it may already have been shown, and values the index
//! does not hold are read by primary key at the revision the keys came from.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::compare::{fetch_limit, finish_range};
use super::types::{self, KeyValue, RangeRequest, RangeResponse, Revisioned};
use super::{Error, Result, Store, resolve_read_revision};
use crate::backend::{ReadTxn, Revisions, Scan};

/// How long a read of the current revision waits for the applied index to reach it before it
/// reads SQL instead. The index lags only while a publish is under way, or while the tailer
/// catches up with a batch the hub could not take directly.
const APPLIED_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Reads a Range at `view` (the revision "current" means to this reader).
async fn read_range(
    tx: &mut dyn ReadTxn,
    req: &RangeRequest,
    view: i64,
    compact: i64,
) -> Result<RangeResponse> {
    let revision = resolve_read_revision(req.revision, view, compact)?;
    if req.count_only {
        let count = tx.count(&req.range.key, &req.range.end, revision).await?;
        return Ok(RangeResponse {
            count,
            ..RangeResponse::default()
        });
    }
    let limit = fetch_limit(req);
    let rows = tx
        .scan(&Scan {
            key: &req.range.key,
            end: &req.range.end,
            revision,
            limit,
            keys_only: !needs_values(req),
        })
        .await?;
    // A scan that was not cut short saw every key: its length is the count.
    let count = match limit {
        Some(limit) if rows.len() as i64 >= limit => {
            tx.count(&req.range.key, &req.range.end, revision).await?
        }
        _ => rows.len() as i64,
    };
    let kvs = rows.into_iter().map(KeyValue::from_row).collect();
    Ok(finish_range(req, kvs, count))
}

/// Whether `req` reads values: to answer with them, or to sort by them.
pub(super) fn needs_values(req: &RangeRequest) -> bool {
    !req.count_only && (!req.keys_only || matches!(req.sort, Some((types::SortTarget::Value, _))))
}

/// Gives each key its value (an absent one, of a read that needs none, stays empty).
fn set_values(kvs: &mut [KeyValue], values: Vec<Option<Arc<[u8]>>>) {
    for (kv, value) in kvs.iter_mut().zip(values) {
        kv.value = value.map(|v| v.to_vec()).unwrap_or_default();
    }
}

/// What a read got from the applied index.
enum Memory {
    /// Nothing: the index no longer has the history back to the revision asked for.
    Elsewhere,
    /// The whole answer, at the index's revision.
    Answer(Revisioned<RangeResponse>),
    /// Keys at `revision`, some of whose values the index does not hold: they are to be read
    /// by primary key before the answer can be finished.
    Partial {
        revision: i64,
        count: i64,
        kvs: Vec<KeyValue>,
        /// The values held, by position in `kvs`; `None` is to be read.
        values: Vec<Option<Arc<[u8]>>>,
    },
}

impl Store {
    /// A linearizable read of a range.
    ///
    /// # Errors
    /// The revision is compacted or in the future, or the backend is unreachable.
    pub async fn range(&self, req: &RangeRequest) -> Result<Revisioned<RangeResponse>> {
        if self.inner.sole_writer {
            return self.range_unpinned(req).await;
        }
        let applied = &self.inner.applied;
        // A revision older than the index's history is SQL's to read: no round trip is spent
        // on it.
        if applied.serving() && (req.revision <= 0 || req.revision >= applied.floor()) {
            // Taken before the probe: the database holds everything served until then, unless a
            // failover lost it; the index may move past the probe's answer meanwhile.
            let served = applied.revision();
            // One shared round trip for the cluster's revisions; the rest comes from memory.
            let revisions = self.inner.probe.revisions(&self.inner.backend).await?;
            let current = revisions.current;
            if current < served {
                // Memory holds revisions the database lost; the tailer fences past them.
                return Err(Error::Rewound {
                    database: current,
                    served,
                });
            }
            self.inner.catch_up.send_if_modified(|wanted| {
                let further = current > *wanted;
                *wanted = (*wanted).max(current);
                further
            });
            if let Some(answer) = self.range_applied(req, revisions).await? {
                return Ok(answer);
            }
        }
        self.inner.reads_from_sql.fetch_add(1, Ordering::Relaxed);
        let mut tx = self.inner.backend.read().await?;
        let revisions = tx.revisions().await?;
        let value = read_range(tx.as_mut(), req, revisions.current, revisions.compact).await?;
        Ok(Revisioned {
            revision: revisions.current,
            value,
        })
    }

    /// [`Store::range`] without a snapshot, at the published revisions (see "Reads" above).
    async fn range_unpinned(&self, req: &RangeRequest) -> Result<Revisioned<RangeResponse>> {
        loop {
            let revisions = self.inner.published.revisions();
            if let Some(answer) = self.range_applied(req, revisions).await? {
                return Ok(answer);
            }
            let revision =
                resolve_read_revision(req.revision, revisions.current, revisions.compact)?;
            self.inner.reads_from_sql.fetch_add(1, Ordering::Relaxed);
            let mut tx = self.inner.backend.read_unpinned().await?;
            let value = read_range(tx.as_mut(), req, revisions.current, revisions.compact).await?;
            drop(tx);
            if self.inner.published.compact.load(Ordering::SeqCst) > revision {
                // Compacted while being read: some rows may have been missing. A read of the
                // current revision just tries again at the new one.
                if req.revision > 0 {
                    return Err(Error::Compacted);
                }
                continue;
            }
            return Ok(Revisioned {
                revision: revisions.current,
                value,
            });
        }
    }

    /// A read answered by the applied index, given the revisions as of some moment after the
    /// read arrived: a read of the current revision once the index has reached it, and a read
    /// at a given revision once the index has reached it, if it still has the history back to
    /// it. `None` where SQL must answer: the index is not serving, lags too long or has moved
    /// too far past the revision, or a value it lacked has been compacted away since.
    async fn range_applied(
        &self,
        req: &RangeRequest,
        revisions: Revisions,
    ) -> Result<Option<Revisioned<RangeResponse>>> {
        let revision = resolve_read_revision(req.revision, revisions.current, revisions.compact)?;
        let applied = &self.inner.applied;
        if !applied.serving() || !applied.reached(revision, APPLIED_WAIT).await {
            return Ok(None);
        }
        let pinned = (req.revision > 0).then_some(revision);
        let mut answer = match self.range_from_memory(req, pinned) {
            Memory::Elsewhere => return Ok(None),
            Memory::Answer(answer) => answer,
            Memory::Partial {
                revision,
                count,
                mut kvs,
                mut values,
            } => {
                let wanted: Vec<usize> =
                    (0..values.len()).filter(|&i| values[i].is_none()).collect();
                let rows: Vec<(&[u8], i64)> = wanted
                    .iter()
                    .map(|&i| (kvs[i].key.as_slice(), kvs[i].mod_revision))
                    .collect();
                let found = self.inner.backend.values(&rows).await?;
                if found.iter().any(Option::is_none) {
                    return Ok(None);
                }
                let found: Vec<Arc<[u8]>> = found.into_iter().flatten().map(Arc::from).collect();
                applied.fill(
                    rows.iter()
                        .zip(&found)
                        .map(|(&(key, mod_revision), value)| (key, mod_revision, value.clone())),
                );
                for (i, value) in wanted.into_iter().zip(found) {
                    values[i] = Some(value);
                }
                set_values(&mut kvs, values);
                Revisioned {
                    revision,
                    value: finish_range(req, kvs, count),
                }
            }
        };
        // The header tells the current revision, as etcd's does, even of a read at an older one.
        answer.revision = answer.revision.max(revisions.current);
        self.inner.reads_from_memory.fetch_add(1, Ordering::Relaxed);
        Ok(Some(answer))
    }

    /// The keys attached to `lease` at `revision`, from the applied index if it serves reads,
    /// reaches `revision` soon and still has the history back to it.
    pub(super) async fn leased_from_memory(
        &self,
        lease: i64,
        revision: i64,
    ) -> Option<Vec<Vec<u8>>> {
        let applied = &self.inner.applied;
        if !applied.serving() || !applied.reached(revision, APPLIED_WAIT).await {
            return None;
        }
        applied.view().leased_at(lease, revision)
    }

    /// What the applied index holds of a read of the current revision, or of revision `pinned`
    /// (within the index's window of history): the whole answer, or the keys with the values it
    /// has.
    fn range_from_memory(&self, req: &RangeRequest, pinned: Option<i64>) -> Memory {
        let view = self.inner.applied.view();
        let revision = view.revision();
        let Some((count, items)) = view.at(&req.range, pinned.unwrap_or(revision)) else {
            return Memory::Elsewhere;
        };
        if req.count_only {
            return Memory::Answer(Revisioned {
                revision,
                value: RangeResponse {
                    count,
                    ..RangeResponse::default()
                },
            });
        }
        let with_values = needs_values(req);
        let take = fetch_limit(req).map_or(usize::MAX, |limit| limit as usize);
        let mut kvs = Vec::new();
        let mut values = Vec::new();
        for item in items.take(take) {
            kvs.push(item.meta.to_kv(item.key, Vec::new()));
            if with_values {
                values.push(item.value.cloned());
            }
        }
        drop(view);
        if values.iter().any(Option::is_none) {
            return Memory::Partial {
                revision,
                count,
                kvs,
                values,
            };
        }
        set_values(&mut kvs, values);
        Memory::Answer(Revisioned {
            revision,
            value: finish_range(req, kvs, count),
        })
    }
}
