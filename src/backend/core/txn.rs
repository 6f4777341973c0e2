//! [`ReadTxn`] and [`WriteTxn`] once, over any dialect's [`Session`].

use std::collections::HashMap;

use async_trait::async_trait;

use super::{Bookkeeping, Columns, Session, SqlTxn, Stmt, decode_revisions, lease_rows};
use crate::backend::{LeaseRow, LogRow, RangeEnd, ReadTxn, Result, Revisions, Scan, WriteTxn};

/// Rows per page of the log where each key's newest row is found by reading all of it.
const HEADS_PAGE: i64 = 65_536;

impl<S: Session> SqlTxn<S> {
    /// [`ReadTxn::values_at`], read `ahead` of the writers' lock where the session can.
    async fn values_of(
        &mut self,
        rows: &[(&[u8], i64)],
        ahead: bool,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let mut values = vec![None; rows.len()];
        for stmt in (self.0.sql().values_at)(rows) {
            let found = match ahead {
                true => self.0.fetch_ahead(stmt).await?,
                false => self.0.fetch(stmt).await?,
            };
            for row in found {
                let value = row.bytes(1)?;
                if let Some(slot) = usize::try_from(row.int(0)?)
                    .ok()
                    .and_then(|i| values.get_mut(i))
                {
                    *slot = Some(value);
                }
            }
        }
        Ok(values)
    }

    async fn rows(&mut self, stmt: Stmt<'_>) -> Result<Vec<LogRow>> {
        self.0.fetch_log_rows(stmt).await
    }

    /// Where the log alone says which row is each key's newest
    /// ([`Bookkeeping::LogOnly`]): the whole log in pages, each key's newest row kept, and the
    /// rows of the revisions `window` (`(after, through]`) kept as well.
    async fn read_whole_log(
        &mut self,
        window: Option<(i64, i64)>,
    ) -> Result<(Vec<LogRow>, Vec<LogRow>)> {
        let sql = self.0.sql();
        let (after, through) = window.unwrap_or((i64::MAX, i64::MAX));
        let mut newest: HashMap<Vec<u8>, LogRow> = HashMap::new();
        let mut since = Vec::new();
        let mut from = (i64::MIN, i64::MIN);
        loop {
            let page = self
                .rows(
                    Stmt::new(&*sql.heads)
                        .int(after)
                        .int(from.0)
                        .int(from.1)
                        .int(HEADS_PAGE),
                )
                .await?;
            let Some(last) = page.last() else { break };
            from = (last.revision, last.sub);
            let full = page.len() as i64 >= HEADS_PAGE;
            for row in page {
                if row.revision > after && row.revision <= through {
                    since.push(row.clone());
                }
                match newest.get_mut(&row.key) {
                    Some(held) => *held = row,
                    None => {
                        newest.insert(row.key.clone(), row);
                    }
                }
            }
            if !full {
                break;
            }
        }
        // In key order, as a table in key order would give them: the indexes built from them
        // then hold their entries in key order too, so a walk of a range reads memory in order.
        let mut heads: Vec<LogRow> = newest.into_values().collect();
        heads.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Ok((heads, since))
    }

    async fn leases_of(&mut self, stmt: Stmt<'_>) -> Result<Vec<LeaseRow>> {
        lease_rows(self.0.fetch(stmt).await?)
    }

    /// Whether a statement that returns no rows changed exactly one.
    async fn changed_one(&mut self, stmt: Stmt<'_>) -> Result<bool> {
        Ok(self.0.execute(stmt).await? == 1)
    }

    fn queue_meta(&mut self, name: &'static str, value: i64) -> Stmt<'static> {
        Stmt::new(&*self.0.sql().set_meta).int(value).text(name)
    }
}

#[async_trait]
impl<S: Session> ReadTxn for SqlTxn<S> {
    async fn revisions(&mut self) -> Result<Revisions> {
        let rows = self.0.fetch(Stmt::new(&*self.0.sql().revisions)).await?;
        decode_revisions(&rows)
    }

    async fn scan(&mut self, scan: &Scan<'_>) -> Result<Vec<LogRow>> {
        let stmt = (self.0.sql().scan)(scan);
        self.rows(stmt).await
    }

    async fn count(&mut self, key: &[u8], end: &RangeEnd, revision: i64) -> Result<i64> {
        let stmt = (self.0.sql().count)(key, end, revision);
        match self.0.fetch(stmt).await?.first() {
            Some(row) => row.int(0),
            None => Ok(0),
        }
    }

    async fn latest(&mut self, key: &[u8]) -> Result<Option<LogRow>> {
        let stmt = Stmt::new(&*self.0.sql().latest).bytes(key);
        Ok(self.rows(stmt).await?.pop())
    }

    async fn heads(&mut self) -> Result<Vec<LogRow>> {
        let sql = self.0.sql();
        if sql.bookkeeping != Bookkeeping::LogOnly {
            return self.rows(Stmt::new(&*sql.heads)).await;
        }
        Ok(self.read_whole_log(None).await?.0)
    }

    async fn heads_and_changes(
        &mut self,
        after: i64,
        through: i64,
    ) -> Result<(Vec<LogRow>, Vec<LogRow>)> {
        if self.0.sql().bookkeeping != Bookkeeping::LogOnly {
            return crate::backend::heads_then_changes(self, after, through).await;
        }
        self.read_whole_log(Some((after, through))).await
    }

    async fn values_at(&mut self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>> {
        self.values_of(rows, false).await
    }

    async fn changes(&mut self, after: i64, through: i64) -> Result<Vec<LogRow>> {
        let stmt = Stmt::new(&*self.0.sql().changes).int(after).int(through);
        self.rows(stmt).await
    }

    async fn change_keys(&mut self, after: i64, through: i64) -> Result<Vec<LogRow>> {
        let stmt = Stmt::new(&*self.0.sql().change_keys)
            .int(after)
            .int(through);
        self.rows(stmt).await
    }

    async fn lease(&mut self, id: i64) -> Result<Option<LeaseRow>> {
        let stmt = Stmt::new(&*self.0.sql().lease).int(id);
        Ok(self.leases_of(stmt).await?.pop())
    }

    async fn leases(&mut self) -> Result<Vec<LeaseRow>> {
        let stmt = Stmt::new(&*self.0.sql().leases);
        self.leases_of(stmt).await
    }

    async fn lease_keys(&mut self, id: i64, revision: i64) -> Result<Vec<LogRow>> {
        let stmt = Stmt::new(&*self.0.sql().lease_keys)
            .int(id)
            .int(revision)
            .int(revision);
        self.rows(stmt).await
    }

    async fn expired_leases(&mut self, now: i64, limit: i64) -> Result<Vec<LeaseRow>> {
        let stmt = Stmt::new(&*self.0.sql().expired_leases).int(now).int(limit);
        self.leases_of(stmt).await
    }

    async fn next_expiry(&mut self) -> Result<Option<i64>> {
        let rows = self.0.fetch(Stmt::new(&*self.0.sql().next_expiry)).await?;
        match rows.first() {
            Some(row) => row.opt_int(0),
            None => Ok(None),
        }
    }
}

#[async_trait]
impl<S: Session> WriteTxn for SqlTxn<S> {
    async fn insert_rows(&mut self, rows: &[LogRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        for stmt in (self.0.sql().insert_rows)(rows) {
            self.0.queue(stmt).await?;
        }
        Ok(())
    }

    async fn set_current_revision(&mut self, revision: i64) -> Result<()> {
        let sql = self.0.sql();
        let mut stmt = Stmt::new(&*sql.set_current_revision).int(revision);
        if sql.notifies {
            stmt = stmt.int(revision);
        }
        self.0.queue(stmt).await
    }

    async fn values_ahead(&mut self, rows: &[(&[u8], i64)]) -> Result<Vec<Option<Vec<u8>>>> {
        let presumed = self.0.presumed_ahead();
        let values = self.values_of(rows, true).await?;
        match presumed {
            // Read outside the lock: another process may have replaced the row, and compacted
            // it away. The batch then runs again, reading under the lock.
            Some(presumed) if values.iter().any(Option::is_none) => {
                Err(crate::backend::Error::Moved { presumed })
            }
            _ => Ok(values),
        }
    }

    async fn leases_ahead(&mut self, ids: &[i64]) -> Result<Vec<i64>> {
        let mut found = Vec::with_capacity(ids.len());
        for &id in ids {
            let stmt = Stmt::new(&*self.0.sql().lease).int(id);
            if !lease_rows(self.0.fetch_ahead(stmt).await?)?.is_empty() {
                found.push(id);
            }
        }
        Ok(found)
    }

    async fn append(
        &mut self,
        rows: &[LogRow],
        before: i64,
        current: i64,
        leases: &[i64],
    ) -> Result<()> {
        match self.0.sql().append {
            Some(append) if !rows.is_empty() => {
                for stmt in append(rows, before, current, leases) {
                    self.0.append(stmt, before).await?;
                }
                Ok(())
            }
            _ => {
                self.insert_rows(rows).await?;
                self.set_current_revision(current).await
            }
        }
    }

    async fn set_compact_revision(&mut self, revision: i64) -> Result<()> {
        let stmt = self.queue_meta("compact_revision", revision);
        self.0.queue(stmt).await
    }

    async fn set_fence_revision(&mut self, revision: i64) -> Result<()> {
        let stmt = self.queue_meta("fence_revision", revision);
        self.0.queue(stmt).await
    }

    async fn insert_lease(&mut self, lease: &LeaseRow) -> Result<bool> {
        let stmt = Stmt::new(&*self.0.sql().insert_lease)
            .int(lease.id)
            .int(lease.ttl)
            .int(lease.expires_at);
        self.changed_one(stmt).await
    }

    async fn set_lease_expiry(&mut self, id: i64, expires_at: i64) -> Result<bool> {
        let stmt = Stmt::new(&*self.0.sql().set_lease_expiry)
            .int(expires_at)
            .int(id);
        self.changed_one(stmt).await
    }

    async fn delete_lease(&mut self, id: i64) -> Result<bool> {
        let stmt = Stmt::new(&*self.0.sql().delete_lease).int(id);
        self.changed_one(stmt).await
    }

    async fn savepoint(&mut self) -> Result<()> {
        let stmt = Stmt::new(&*self.0.sql().savepoint);
        self.0.queue(stmt).await
    }

    async fn release_savepoint(&mut self) -> Result<()> {
        let stmt = Stmt::new(&*self.0.sql().release_savepoint);
        self.0.queue(stmt).await
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        // ROLLBACK TO keeps the savepoint open; release it so the next request starts clean.
        let sql = self.0.sql();
        self.0.queue(Stmt::new(&*sql.rollback_to_savepoint)).await?;
        self.0.queue(Stmt::new(&*sql.release_savepoint)).await
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.0.commit().await
    }
}
