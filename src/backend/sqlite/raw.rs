//! Reads many log rows at once straight through SQLite's C API, on the connection sqlx lends
//! out (`lock_handle`), instead of through sqlx's worker thread.
//!
//! sqlx hands each row from its worker thread to the calling task over a channel, copying
//! each column into a value of its own first: loading the applied index's window of a million
//! changes spent most of its time waking the task once per row and in `malloc`, and little
//! in SQLite (`perf`; BENCHMARKS.md). Here the calling thread steps the statement itself and
//! decodes each row once, into a [`LogRow`].
//!
//! # Invariants
//! - The statement is prepared, stepped and finalized while the handle is locked: sqlx's worker
//!   runs nothing on the connection meanwhile, and nothing of the statement outlives the lock.
//! - A column is read only after its type was checked, so a NULL where a value is wanted is an
//!   error, not an empty value.

use std::ffi::{CStr, c_int};
use std::ptr::{self, NonNull};

use libsqlite3_sys as ffi;
use sqlx::sqlite::SqliteConnection;

use crate::backend::core::{Arg, Columns, Stmt, decode_row};
use crate::backend::{Error, LogRow, Result};

/// A prepared statement, finalized when dropped.
struct Prepared(NonNull<ffi::sqlite3_stmt>);

impl Drop for Prepared {
    fn drop(&mut self) {
        // SAFETY: the statement came from sqlite3_prepare_v2 and is finalized once, here.
        unsafe { ffi::sqlite3_finalize(self.0.as_ptr()) };
    }
}

fn failure(db: *mut ffi::sqlite3, what: &str) -> Error {
    // SAFETY: `db` is the open connection; errmsg returns a string it owns until the next call.
    let message = unsafe { CStr::from_ptr(ffi::sqlite3_errmsg(db)) }.to_string_lossy();
    Error::Sql(sqlx::Error::Protocol(format!("{what}: {message}")))
}

/// Runs `stmt`, whose columns are the log's ([`decode_row`]'s order), and returns its rows.
pub(super) async fn log_rows(conn: &mut SqliteConnection, stmt: &Stmt<'_>) -> Result<Vec<LogRow>> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // The statement runs on this thread: on a runtime of several workers, the others take over
    // its tasks meanwhile (a long read would otherwise hold them up).
    let read = || {
        let prepared = prepare(db, &stmt.sql)?;
        bind(db, &prepared, &stmt.args)?;
        let mut rows = Vec::new();
        loop {
            // SAFETY: the statement is prepared on `db`, which this thread holds locked.
            match unsafe { ffi::sqlite3_step(prepared.0.as_ptr()) } {
                ffi::SQLITE_ROW => rows.push(decode_row(&Current(&prepared))?),
                ffi::SQLITE_DONE => return Ok(rows),
                _ => return Err(failure(db, "reading log rows")),
            }
        }
    };
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(read),
        _ => read(),
    }
}

fn prepare(db: *mut ffi::sqlite3, sql: &str) -> Result<Prepared> {
    let len = c_int::try_from(sql.len())
        .map_err(|_| Error::Sql(sqlx::Error::Protocol("statement too long".into())))?;
    let mut raw = ptr::null_mut();
    // SAFETY: `sql` is valid for `len` bytes; SQLite copies what it needs.
    let rc =
        unsafe { ffi::sqlite3_prepare_v2(db, sql.as_ptr().cast(), len, &mut raw, ptr::null_mut()) };
    match NonNull::new(raw) {
        Some(stmt) if rc == ffi::SQLITE_OK => Ok(Prepared(stmt)),
        _ => Err(failure(db, "preparing a log read")),
    }
}

fn bind(db: *mut ffi::sqlite3, prepared: &Prepared, args: &[Arg<'_>]) -> Result<()> {
    let stmt = prepared.0.as_ptr();
    for (i, arg) in args.iter().enumerate() {
        let at = c_int::try_from(i + 1).unwrap_or(c_int::MAX);
        // SAFETY: SQLITE_TRANSIENT makes SQLite copy the bytes before the call returns.
        let rc = unsafe {
            match arg {
                Arg::Int(v) => ffi::sqlite3_bind_int64(stmt, at, *v),
                Arg::OptInt(Some(v)) => ffi::sqlite3_bind_int64(stmt, at, *v),
                Arg::OptInt(None) => ffi::sqlite3_bind_null(stmt, at),
                Arg::Bool(v) => ffi::sqlite3_bind_int64(stmt, at, i64::from(*v)),
                Arg::Bytes(v) => ffi::sqlite3_bind_blob64(
                    stmt,
                    at,
                    v.as_ptr().cast(),
                    v.len() as u64,
                    ffi::SQLITE_TRANSIENT(),
                ),
                Arg::Text(v) => ffi::sqlite3_bind_text64(
                    stmt,
                    at,
                    v.as_ptr().cast(),
                    v.len() as u64,
                    ffi::SQLITE_TRANSIENT(),
                    ffi::SQLITE_UTF8 as u8,
                ),
                Arg::Ints(_) | Arg::Bools(_) | Arg::Blobs(_) => {
                    return Err(Error::Sql(sqlx::Error::Protocol(
                        "array arguments are PostgreSQL's".into(),
                    )));
                }
            }
        };
        if rc != ffi::SQLITE_OK {
            return Err(failure(db, "binding a log read's arguments"));
        }
    }
    Ok(())
}

/// The row a statement has just stepped to.
struct Current<'a>(&'a Prepared);

impl Current<'_> {
    fn kind(&self, i: usize) -> c_int {
        // SAFETY: the statement is on a row; a column past the last reads as NULL.
        unsafe { ffi::sqlite3_column_type(self.0.0.as_ptr(), i as c_int) }
    }

    fn null(i: usize) -> Error {
        Error::Sql(sqlx::Error::ColumnDecode {
            index: i.to_string(),
            source: "unexpected NULL".into(),
        })
    }
}

impl Columns for Current<'_> {
    fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?.ok_or_else(|| Self::null(i))
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        if self.kind(i) == ffi::SQLITE_NULL {
            return Ok(None);
        }
        // SAFETY: as in `kind`.
        Ok(Some(unsafe {
            ffi::sqlite3_column_int64(self.0.0.as_ptr(), i as c_int)
        }))
    }

    fn flag(&self, i: usize) -> Result<bool> {
        Ok(self.int(i)? != 0)
    }

    fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        self.opt_bytes(i)?.ok_or_else(|| Self::null(i))
    }

    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        if self.kind(i) == ffi::SQLITE_NULL {
            return Ok(None);
        }
        let stmt = self.0.0.as_ptr();
        // SAFETY: blob first, then its length, as SQLite documents; the pointer is valid until
        // the next step, and the bytes are copied out before then.
        unsafe {
            let data = ffi::sqlite3_column_blob(stmt, i as c_int);
            let len = usize::try_from(ffi::sqlite3_column_bytes(stmt, i as c_int)).unwrap_or(0);
            if data.is_null() || len == 0 {
                return Ok(Some(Vec::new()));
            }
            Ok(Some(
                std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec(),
            ))
        }
    }

    fn text(&self, i: usize) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.bytes(i)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Connection;

    use super::*;

    const COLUMNS: &str = "revision, sub, name, created, deleted, create_revision, \
                           prev_revision, version, lease, value, old_value, old_lease";

    /// A table of the log's columns holding the values that decode differently if read
    /// carelessly: empty and NULL blobs, bytes that are not UTF-8, zeros inside a key, a value
    /// larger than a page (it spills onto overflow pages), negative and large integers.
    async fn fixture() -> SqliteConnection {
        let mut conn = SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("connect");
        sqlx::query(
            "CREATE TABLE t (revision INTEGER, sub INTEGER, name BLOB, created INTEGER, \
             deleted INTEGER, create_revision INTEGER, prev_revision INTEGER, version INTEGER, \
             lease INTEGER, value BLOB, old_value BLOB, old_lease INTEGER)",
        )
        .execute(&mut conn)
        .await
        .expect("create");
        let big = vec![0xA5u8; 70_000];
        // (revision, name, value, old value, lease)
        type Fixture<'a> = (i64, &'a [u8], &'a [u8], Option<&'a [u8]>, i64);
        let rows: [Fixture<'_>; 4] = [
            (1, b"a", b"", None, 0),
            (2, b"b\0c\xff", b"\x00\x01", Some(b""), -1),
            (3, b"/registry/x", &big, Some(b"old"), i64::MAX),
            (4, "k\u{e9}".as_bytes(), b"v", None, i64::MIN),
        ];
        for (revision, name, value, old, lease) in rows {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO t ({COLUMNS}) VALUES (?, 0, ?, 1, ?, ?, 7, 2, ?, ?, ?, 9)"
            )))
            .bind(revision)
            .bind(name)
            .bind(revision % 2 == 0)
            .bind(revision)
            .bind(lease)
            .bind(value)
            .bind(old)
            .execute(&mut conn)
            .await
            .expect("insert");
        }
        conn
    }

    async fn both_ways(conn: &mut SqliteConnection) -> (Vec<LogRow>, Vec<LogRow>) {
        let sql =
            format!("SELECT {COLUMNS} FROM t WHERE revision > ? AND name <> ? ORDER BY revision");
        let stmt = Stmt::new(sql.clone()).int(0).bytes(b"none");
        let raw = log_rows(conn, &stmt).await.expect("raw read");
        let through_sqlx: Vec<LogRow> = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(0i64)
            .bind(&b"none"[..])
            .fetch_all(&mut *conn)
            .await
            .expect("sqlx read")
            .iter()
            .map(|row| decode_row(row).expect("decode"))
            .collect();
        (raw, through_sqlx)
    }

    #[tokio::test]
    async fn rows_read_raw_are_the_rows_sqlx_reads() {
        let mut conn = fixture().await;
        let (raw, through_sqlx) = both_ways(&mut conn).await;
        assert_eq!(raw.len(), 4);
        assert_eq!(raw, through_sqlx);
        assert_eq!(raw[0].old_value, None);
        assert_eq!(raw[1].old_value, Some(Vec::new()));
        assert_eq!(raw[2].value.len(), 70_000);
        // The connection is usable through sqlx afterwards: the statement was finalized.
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&mut conn)
            .await
            .expect("count");
        assert_eq!(n, 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_runtime_of_several_workers_too() {
        let mut conn = fixture().await;
        let (raw, through_sqlx) = both_ways(&mut conn).await;
        assert_eq!(raw, through_sqlx);
    }

    #[tokio::test]
    async fn errors_are_reported_not_panicked() {
        let mut conn = fixture().await;
        let missing = Stmt::new("SELECT * FROM no_such_table");
        let err = log_rows(&mut conn, &missing).await.expect_err("no table");
        assert!(err.to_string().contains("no such table"), "{err}");
        // A NULL where an integer is wanted.
        let rest = COLUMNS.split_once(", ").expect("columns").1;
        let stmt = Stmt::new(format!("SELECT NULL, {rest} FROM t"));
        let err = log_rows(&mut conn, &stmt)
            .await
            .expect_err("a NULL revision");
        assert!(err.to_string().contains("NULL"), "{err}");
    }
}
