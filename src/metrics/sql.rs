//! The backend decorator: times every database operation into [`Metrics`]
//! (`etcdsql_sql_duration_seconds{query=…}`, and etcd's commit histogram for commits).
//!
//! Its one invariant is on [`instrument`]: every method of the backend traits is forwarded.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::Metrics;
use crate::backend::{
    self, Backend, DbSize, LeaseRow, LogRow, RangeEnd, ReadTxn, Revisions, Scan, WriteTxn,
};

/// Wraps `backend` so every operation is timed into `metrics`.
///
/// Every method of the backend traits is forwarded here, including those with default bodies
/// (a forgotten default would silently replace the real backend's behaviour): when the traits
/// gain a method, add it below.
pub fn instrument(backend: Arc<dyn Backend>, metrics: &Metrics) -> Arc<dyn Backend> {
    Arc::new(InstrumentedBackend {
        inner: backend,
        metrics: metrics.clone(),
    })
}

/// Runs one database operation and records how long it took and whether it failed.
async fn timed<T>(
    metrics: &Metrics,
    query: &'static str,
    operation: impl Future<Output = backend::Result<T>>,
) -> backend::Result<T> {
    let started = Instant::now();
    let result = operation.await;
    metrics.observe_sql(query, started.elapsed(), result.is_err());
    result
}

struct InstrumentedBackend {
    inner: Arc<dyn Backend>,
    metrics: Metrics,
}

struct InstrumentedRead {
    inner: Box<dyn ReadTxn>,
    metrics: Metrics,
}

struct InstrumentedWrite {
    inner: Box<dyn WriteTxn>,
    metrics: Metrics,
}

#[async_trait]
impl Backend for InstrumentedBackend {
    async fn read(&self) -> backend::Result<Box<dyn ReadTxn>> {
        let inner = timed(&self.metrics, "begin_read", self.inner.read()).await?;
        Ok(Box::new(InstrumentedRead {
            inner,
            metrics: self.metrics.clone(),
        }))
    }

    async fn read_unpinned(&self) -> backend::Result<Box<dyn ReadTxn>> {
        let inner = timed(&self.metrics, "begin_read", self.inner.read_unpinned()).await?;
        Ok(Box::new(InstrumentedRead {
            inner,
            metrics: self.metrics.clone(),
        }))
    }

    async fn revisions(&self) -> backend::Result<Revisions> {
        timed(&self.metrics, "revisions", self.inner.revisions()).await
    }

    async fn values(&self, rows: &[(&[u8], i64)]) -> backend::Result<Vec<Option<Vec<u8>>>> {
        timed(&self.metrics, "values_at", self.inner.values(rows)).await
    }

    fn sole_writer(&self) -> bool {
        self.inner.sole_writer()
    }

    fn max_key_bytes(&self) -> Option<usize> {
        self.inner.max_key_bytes()
    }

    fn checked_key_bytes(&self) -> Option<usize> {
        self.inner.checked_key_bytes()
    }

    /// Includes waiting for the previous write transaction to finish.
    async fn write(&self) -> backend::Result<Box<dyn WriteTxn>> {
        let inner = timed(&self.metrics, "begin_write", self.inner.write()).await?;
        Ok(Box::new(InstrumentedWrite {
            inner,
            metrics: self.metrics.clone(),
        }))
    }

    /// Includes waiting for the previous write transaction to finish.
    async fn write_from(
        &self,
        after: i64,
    ) -> backend::Result<(Box<dyn WriteTxn>, Option<backend::Opening>)> {
        let (inner, opening) =
            timed(&self.metrics, "begin_write", self.inner.write_from(after)).await?;
        let write = InstrumentedWrite {
            inner,
            metrics: self.metrics.clone(),
        };
        Ok((Box::new(write), opening))
    }

    /// Only takes a connection: the statements that follow run under their own labels.
    async fn write_presuming(&self, current: i64) -> backend::Result<Option<Box<dyn WriteTxn>>> {
        let inner = timed(
            &self.metrics,
            "begin_presumed",
            self.inner.write_presuming(current),
        )
        .await?;
        Ok(inner.map(|inner| {
            Box::new(InstrumentedWrite {
                inner,
                metrics: self.metrics.clone(),
            }) as Box<dyn WriteTxn>
        }))
    }

    async fn read_changes(
        &self,
        after: i64,
        through: i64,
    ) -> backend::Result<(Revisions, Vec<LogRow>)> {
        // The same label as the statement it stands for where the backend reads it alone.
        timed(
            &self.metrics,
            "changes",
            self.inner.read_changes(after, through),
        )
        .await
    }

    async fn cluster_id(&self) -> backend::Result<u64> {
        timed(&self.metrics, "cluster_id", self.inner.cluster_id()).await
    }

    async fn size(&self) -> backend::Result<DbSize> {
        timed(&self.metrics, "size", self.inner.size()).await
    }

    async fn compact_window(&self, compact: i64, after: i64, through: i64) -> backend::Result<u64> {
        let removed = timed(
            &self.metrics,
            "compact_window",
            self.inner.compact_window(compact, after, through),
        )
        .await?;
        self.metrics.inner.compaction_runs.inc();
        self.metrics.inner.compaction_rows.inc_by(removed);
        Ok(removed)
    }

    async fn sync(&self) -> backend::Result<()> {
        timed(&self.metrics, "sync", self.inner.sync()).await
    }

    async fn check(&self) -> backend::Result<backend::CheckReport> {
        self.inner.check().await
    }

    async fn compacted_through(&self) -> backend::Result<i64> {
        timed(
            &self.metrics,
            "compacted_through",
            self.inner.compacted_through(),
        )
        .await
    }

    async fn defragment(&self) -> backend::Result<()> {
        timed(&self.metrics, "defragment", self.inner.defragment()).await
    }

    async fn alarms(&self) -> backend::Result<Vec<i32>> {
        timed(&self.metrics, "alarms", self.inner.alarms()).await
    }

    async fn set_alarm(&self, alarm: i32, raise: bool) -> backend::Result<bool> {
        timed(
            &self.metrics,
            "set_alarm",
            self.inner.set_alarm(alarm, raise),
        )
        .await
    }

    async fn backup(&self, dest: &std::path::Path) -> backend::Result<()> {
        timed(&self.metrics, "backup", self.inner.backup(dest)).await
    }

    async fn restore(
        &self,
        source: &std::path::Path,
        copied: backend::Copied<'_>,
    ) -> backend::Result<()> {
        timed(&self.metrics, "restore", self.inner.restore(source, copied)).await
    }

    async fn auth(&self) -> backend::Result<backend::AuthRecords> {
        timed(&self.metrics, "auth", self.inner.auth()).await
    }

    async fn auth_version(&self) -> backend::Result<backend::AuthVersion> {
        timed(&self.metrics, "auth_version", self.inner.auth_version()).await
    }

    async fn replace_auth(
        &self,
        expected: backend::AuthVersion,
        next: &backend::AuthRecords,
    ) -> backend::Result<bool> {
        timed(
            &self.metrics,
            "replace_auth",
            self.inner.replace_auth(expected, next),
        )
        .await
    }

    fn commit_notifications(
        &self,
    ) -> Option<tokio::sync::watch::Receiver<crate::backend::CommitNotice>> {
        self.inner.commit_notifications()
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}

/// The read queries, timed, for both transaction wrappers.
macro_rules! instrumented_read_txn {
    ($wrapper:ty) => {
        #[async_trait]
        impl ReadTxn for $wrapper {
            async fn revisions(&mut self) -> backend::Result<Revisions> {
                timed(&self.metrics, "revisions", self.inner.revisions()).await
            }

            async fn scan(&mut self, scan: &Scan<'_>) -> backend::Result<Vec<LogRow>> {
                timed(&self.metrics, "scan", self.inner.scan(scan)).await
            }

            async fn count(
                &mut self,
                key: &[u8],
                end: &RangeEnd,
                revision: i64,
            ) -> backend::Result<i64> {
                timed(&self.metrics, "count", self.inner.count(key, end, revision)).await
            }

            async fn latest(&mut self, key: &[u8]) -> backend::Result<Option<LogRow>> {
                timed(&self.metrics, "latest", self.inner.latest(key)).await
            }

            async fn heads(&mut self) -> backend::Result<Vec<LogRow>> {
                timed(&self.metrics, "heads", self.inner.heads()).await
            }

            async fn heads_and_changes(
                &mut self,
                after: i64,
                through: i64,
            ) -> backend::Result<(Vec<LogRow>, Vec<LogRow>)> {
                timed(
                    &self.metrics,
                    "heads_and_changes",
                    self.inner.heads_and_changes(after, through),
                )
                .await
            }

            async fn values_at(
                &mut self,
                rows: &[(&[u8], i64)],
            ) -> backend::Result<Vec<Option<Vec<u8>>>> {
                timed(&self.metrics, "values_at", self.inner.values_at(rows)).await
            }

            async fn changes(&mut self, after: i64, through: i64) -> backend::Result<Vec<LogRow>> {
                timed(&self.metrics, "changes", self.inner.changes(after, through)).await
            }

            async fn change_keys(
                &mut self,
                after: i64,
                through: i64,
            ) -> backend::Result<Vec<LogRow>> {
                timed(
                    &self.metrics,
                    "change_keys",
                    self.inner.change_keys(after, through),
                )
                .await
            }

            async fn lease(&mut self, id: i64) -> backend::Result<Option<LeaseRow>> {
                timed(&self.metrics, "lease", self.inner.lease(id)).await
            }

            async fn leases(&mut self) -> backend::Result<Vec<LeaseRow>> {
                timed(&self.metrics, "leases", self.inner.leases()).await
            }

            async fn lease_keys(&mut self, id: i64, revision: i64) -> backend::Result<Vec<LogRow>> {
                timed(
                    &self.metrics,
                    "lease_keys",
                    self.inner.lease_keys(id, revision),
                )
                .await
            }

            async fn expired_leases(
                &mut self,
                now: i64,
                limit: i64,
            ) -> backend::Result<Vec<LeaseRow>> {
                timed(
                    &self.metrics,
                    "expired_leases",
                    self.inner.expired_leases(now, limit),
                )
                .await
            }

            async fn next_expiry(&mut self) -> backend::Result<Option<i64>> {
                timed(&self.metrics, "next_expiry", self.inner.next_expiry()).await
            }
        }
    };
}

instrumented_read_txn!(InstrumentedRead);
instrumented_read_txn!(InstrumentedWrite);

#[async_trait]
impl WriteTxn for InstrumentedWrite {
    async fn insert_rows(&mut self, rows: &[LogRow]) -> backend::Result<()> {
        timed(&self.metrics, "insert_rows", self.inner.insert_rows(rows)).await
    }

    async fn set_current_revision(&mut self, revision: i64) -> backend::Result<()> {
        timed(
            &self.metrics,
            "set_current_revision",
            self.inner.set_current_revision(revision),
        )
        .await
    }

    async fn values_ahead(
        &mut self,
        rows: &[(&[u8], i64)],
    ) -> backend::Result<Vec<Option<Vec<u8>>>> {
        timed(&self.metrics, "values_ahead", self.inner.values_ahead(rows)).await
    }

    async fn leases_ahead(&mut self, ids: &[i64]) -> backend::Result<Vec<i64>> {
        timed(&self.metrics, "leases_ahead", self.inner.leases_ahead(ids)).await
    }

    async fn append(
        &mut self,
        rows: &[LogRow],
        before: i64,
        current: i64,
        leases: &[i64],
    ) -> backend::Result<()> {
        let append = self.inner.append(rows, before, current, leases);
        timed(&self.metrics, "append", append).await
    }

    async fn set_compact_revision(&mut self, revision: i64) -> backend::Result<()> {
        timed(
            &self.metrics,
            "set_compact_revision",
            self.inner.set_compact_revision(revision),
        )
        .await
    }

    async fn set_fence_revision(&mut self, revision: i64) -> backend::Result<()> {
        timed(
            &self.metrics,
            "set_fence_revision",
            self.inner.set_fence_revision(revision),
        )
        .await
    }

    async fn insert_lease(&mut self, lease: &LeaseRow) -> backend::Result<bool> {
        timed(
            &self.metrics,
            "insert_lease",
            self.inner.insert_lease(lease),
        )
        .await
    }

    async fn set_lease_expiry(&mut self, id: i64, expires_at: i64) -> backend::Result<bool> {
        timed(
            &self.metrics,
            "set_lease_expiry",
            self.inner.set_lease_expiry(id, expires_at),
        )
        .await
    }

    async fn delete_lease(&mut self, id: i64) -> backend::Result<bool> {
        timed(&self.metrics, "delete_lease", self.inner.delete_lease(id)).await
    }

    async fn savepoint(&mut self) -> backend::Result<()> {
        timed(&self.metrics, "savepoint", self.inner.savepoint()).await
    }

    async fn release_savepoint(&mut self) -> backend::Result<()> {
        timed(
            &self.metrics,
            "release_savepoint",
            self.inner.release_savepoint(),
        )
        .await
    }

    async fn rollback_to_savepoint(&mut self) -> backend::Result<()> {
        timed(
            &self.metrics,
            "rollback_to_savepoint",
            self.inner.rollback_to_savepoint(),
        )
        .await
    }

    async fn commit(self: Box<Self>) -> backend::Result<()> {
        let InstrumentedWrite { inner, metrics } = *self;
        let started = Instant::now();
        let result = inner.commit().await;
        let elapsed = started.elapsed();
        metrics.observe_sql("commit", elapsed, result.is_err());
        if result.is_ok() {
            metrics.inner.commit_seconds.observe(elapsed.as_secs_f64());
        }
        result
    }
}
