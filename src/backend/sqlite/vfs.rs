//! A thin layer over SQLite's own file layer (a VFS shim) for the writer's connection: it
//! gathers the frames a commit appends to the WAL into one `pwrite`.
//!
//! SQLite writes each WAL frame with two calls, its 24-byte header and then its page, so a
//! create cost about ten system calls (it changes about five pages); on loopback benchmarks those
//! `pwrite`s were 15% of the server's CPU (`perf`, 100,000 creates). The bytes and their order
//! in the file are SQLite's own; only when they reach the kernel changes.
//!
//! Invariants:
//! - Only a WAL file's writes are held, and only while each one continues the one before (a
//!   commit's frames are contiguous). A write elsewhere in the file, and every other call on
//!   the file (read, sync, size, truncate, lock, control, close), sends what is held first.
//! - A commit's frames are in the file before the write of its last page returns. SQLite marks
//!   a commit's last frame (its header's second word, the database's size after the commit, is
//!   non-zero); the write of the page after that header sends everything held and returns the
//!   send's error to SQLite as that write's own, so a failed send fails the commit. SQLite tells
//!   readers of a commit (the WAL index header in shared memory) only after that, and
//!   [`super::Sqlite`]'s fsync of the WAL, through a descriptor of its own, covers whatever
//!   reached the kernel.
//! - As a safety net, the thread remembers the file that holds bytes: any call on shared memory
//!   from that thread (where SQLite publishes commits) sends them first. A send that fails
//!   there cannot be reported, so the process stops, as it does when an fsync fails.

use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::mem::{align_of, size_of};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use libsqlite3_sys as ffi;

/// The name connections give to use this layer (`SqliteConnectOptions::vfs`).
pub const NAME: &str = "etcdsql-gather";
const C_NAME: &CStr = c"etcdsql-gather";

/// Bytes held at most; a transaction larger than this (a big compaction chunk) is sent in
/// pieces of about this size.
const HOLD_LIMIT: usize = 4 << 20;

/// Bytes per write to the real layer: SQLite's unix layer takes at most 128 KiB - 1 per write
/// (it masks the length to 17 bits, and reports the rest as a full disk), as SQLite itself
/// never writes more than a page of at most 64 KiB at once.
const MAX_WRITE: usize = 64 << 10;

/// The size of a WAL frame's header: the only writes of exactly this size.
const FRAME_HEADER: usize = 24;

/// The platform's own file layer, which this one wraps.
static REAL: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// How many writes reached this layer for WAL files, and how many went on to the file.
static HELD: AtomicU64 = AtomicU64::new(0);
static SENT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The file whose WAL bytes are held on this thread, if any.
    static HOLDING: Cell<*mut File> = const { Cell::new(ptr::null_mut()) };
}

/// Writes to WAL files that reached this layer, and `pwrite`s that went on to the files.
#[must_use]
pub fn wal_writes() -> (u64, u64) {
    (HELD.load(Ordering::Relaxed), SENT.load(Ordering::Relaxed))
}

/// Registers the layer with SQLite (once per process) so that connections can name it.
///
/// # Errors
/// SQLite's result code if it could not be initialised or has no default file layer.
pub fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    let rc = *REGISTERED.get_or_init(|| {
        // SAFETY: SQLite's documented registration sequence; the struct is leaked so that it
        // outlives every connection, as SQLite requires.
        unsafe {
            let rc = ffi::sqlite3_initialize();
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let real = ffi::sqlite3_vfs_find(ptr::null());
            if real.is_null() {
                return ffi::SQLITE_ERROR;
            }
            REAL.store(real, Ordering::Release);
            let Ok(size) = c_int::try_from(real_offset() + (*real).szOsFile as usize) else {
                return ffi::SQLITE_ERROR;
            };
            // Everything but opening a file is the real layer's: those functions do not look
            // at which layer they were called through.
            let mut vfs = ptr::read(real);
            vfs.szOsFile = size;
            vfs.zName = C_NAME.as_ptr();
            vfs.pNext = ptr::null_mut();
            vfs.xOpen = Some(x_open);
            ffi::sqlite3_vfs_register(Box::leak(Box::new(vfs)), 0)
        }
    });
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rc)
    }
}

/// SQLite's file object for this layer: its header, then (at [`real_offset`]) the real layer's.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// For a WAL file, the bytes held; `None` for every other file.
    held: Option<Held>,
}

struct Held {
    /// Where in the file `bytes` go.
    start: i64,
    bytes: Vec<u8>,
    /// The last write was the header of a commit's last frame: its page ends the commit.
    commit_next: bool,
}

fn real_offset() -> usize {
    size_of::<File>().next_multiple_of(align_of::<u64>())
}

unsafe fn real_methods(file: *mut File) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: `base.pMethods` is set only once the real file opened (`x_open`), and SQLite
    // calls no method of a file that did not.
    unsafe { &*(*(*file).real).pMethods }
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real_vfs = REAL.load(Ordering::Acquire);
    let this = file.cast::<File>();
    // SAFETY: SQLite hands over `szOsFile` bytes, uninitialised: this header, then room for
    // the real layer's file object.
    unsafe {
        let real = file
            .cast::<u8>()
            .add(real_offset())
            .cast::<ffi::sqlite3_file>();
        (*real).pMethods = ptr::null();
        let held = (flags & ffi::SQLITE_OPEN_WAL != 0).then(|| Held {
            start: 0,
            bytes: Vec::new(),
            commit_next: false,
        });
        ptr::write(
            this,
            File {
                base: ffi::sqlite3_file {
                    pMethods: ptr::null(),
                },
                real,
                held,
            },
        );
        let Some(open) = (*real_vfs).xOpen else {
            ptr::drop_in_place(this);
            return ffi::SQLITE_ERROR;
        };
        let rc = open(real_vfs, name, real, flags, out_flags);
        // SQLite closes a file whose methods are set, even when opening it failed.
        if (*real).pMethods.is_null() {
            ptr::drop_in_place(this);
        } else {
            let version = (*(*real).pMethods).iVersion.clamp(1, 3);
            (*this).base.pMethods = &METHODS[(version - 1) as usize];
        }
        rc
    }
}

/// Sends what `file` holds, if anything.
unsafe fn send(file: *mut File) -> c_int {
    // SAFETY: `file` is an open file of this layer.
    unsafe {
        let Some(held) = (*file).held.as_mut() else {
            return ffi::SQLITE_OK;
        };
        if held.bytes.is_empty() {
            return ffi::SQLITE_OK;
        }
        forget(file);
        held.commit_next = false;
        let Some(write) = real_methods(file).xWrite else {
            held.bytes.clear();
            return ffi::SQLITE_IOERR_WRITE;
        };
        let mut rc = ffi::SQLITE_OK;
        let mut at = held.start;
        for piece in held.bytes.chunks(MAX_WRITE) {
            SENT.fetch_add(1, Ordering::Relaxed);
            // At most MAX_WRITE: fits.
            let len = piece.len() as c_int;
            rc = write((*file).real, piece.as_ptr().cast(), len, at);
            if rc != ffi::SQLITE_OK {
                break;
            }
            at += i64::from(len);
        }
        held.bytes.clear();
        rc
    }
}

/// Takes `file` out of this thread's [`HOLDING`], if it is there.
fn forget(file: *mut File) {
    HOLDING.with(|h| {
        if h.get() == file {
            h.set(ptr::null_mut());
        }
    });
}

/// Sends what this thread holds, wherever it is held.
fn send_thread_held() -> c_int {
    let file = HOLDING.with(Cell::get);
    if file.is_null() {
        return ffi::SQLITE_OK;
    }
    // SAFETY: a file leaves `HOLDING` when it sends or closes, so this one is open.
    unsafe { send(file) }
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let this = file.cast::<File>();
    // SAFETY: SQLite passes an open file of this layer and `amount` readable bytes at `buf`.
    unsafe {
        let Some(held) = (*this).held.as_mut() else {
            return match real_methods(this).xWrite {
                Some(write) => write((*this).real, buf, amount, offset),
                None => ffi::SQLITE_IOERR_WRITE,
            };
        };
        let Ok(len) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let follows = offset == held.start + held.bytes.len() as i64;
        if !held.bytes.is_empty() && !follows {
            let rc = send(this);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let other = HOLDING.with(|h| h.replace(this));
        if !other.is_null() && other != this {
            // Another file of this thread held bytes (not seen: one WAL per connection).
            let rc = send(other);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let Some(held) = (*this).held.as_mut() else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        if held.bytes.is_empty() {
            held.start = offset;
        }
        let data = std::slice::from_raw_parts(buf.cast::<u8>(), len);
        held.bytes.extend_from_slice(data);
        HELD.fetch_add(1, Ordering::Relaxed);
        let ends_commit = held.commit_next;
        held.commit_next = len == FRAME_HEADER && data[4..8] != [0, 0, 0, 0];
        if ends_commit || held.bytes.len() >= HOLD_LIMIT {
            return send(this);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let this = file.cast::<File>();
    // SAFETY: SQLite closes an open file once; its memory is not touched after this.
    unsafe {
        let sent = send(this);
        // Even with nothing held: a failed write may have left it named.
        forget(this);
        let rc = match real_methods(this).xClose {
            Some(close) => close((*this).real),
            None => ffi::SQLITE_OK,
        };
        ptr::drop_in_place(this);
        if sent == ffi::SQLITE_OK { rc } else { sent }
    }
}

/// Forwards a method to the real file after sending what the file holds; a failed send is
/// the method's answer.
macro_rules! settled {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            let this = file.cast::<File>();
            // SAFETY: SQLite passes an open file of this layer.
            unsafe {
                let rc = send(this);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                match real_methods(this).$method {
                    Some(method) => method((*this).real, $($arg),*),
                    None => $missing,
                }
            }
        }
    };
}

settled!(x_read, xRead, (buf: *mut c_void, amount: c_int, offset: i64), ffi::SQLITE_IOERR_READ);
settled!(x_truncate, xTruncate, (size: i64), ffi::SQLITE_IOERR_TRUNCATE);
settled!(x_sync, xSync, (flags: c_int), ffi::SQLITE_IOERR_FSYNC);
settled!(x_file_size, xFileSize, (size: *mut i64), ffi::SQLITE_IOERR_FSTAT);
settled!(x_lock, xLock, (level: c_int), ffi::SQLITE_IOERR_LOCK);
settled!(x_unlock, xUnlock, (level: c_int), ffi::SQLITE_IOERR_UNLOCK);
settled!(x_check_reserved_lock, xCheckReservedLock, (out: *mut c_int), ffi::SQLITE_IOERR_CHECKRESERVEDLOCK);
settled!(x_file_control, xFileControl, (op: c_int, arg: *mut c_void), ffi::SQLITE_NOTFOUND);
settled!(x_fetch, xFetch, (offset: i64, amount: c_int, out: *mut *mut c_void), {
    *out = ptr::null_mut();
    ffi::SQLITE_OK
});
settled!(x_unfetch, xUnfetch, (offset: i64, page: *mut c_void), ffi::SQLITE_OK);

/// Forwards a shared-memory method after sending what this thread holds (see the module's
/// safety net).
macro_rules! published {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            let rc = send_thread_held();
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let this = file.cast::<File>();
            // SAFETY: SQLite passes an open file of this layer.
            unsafe {
                match real_methods(this).$method {
                    Some(method) => method((*this).real, $($arg),*),
                    None => $missing,
                }
            }
        }
    };
}

published!(x_shm_map, xShmMap, (page: c_int, size: c_int, extend: c_int, out: *mut *mut c_void), ffi::SQLITE_IOERR_SHMMAP);
published!(x_shm_lock, xShmLock, (offset: c_int, n: c_int, flags: c_int), ffi::SQLITE_IOERR_SHMLOCK);
published!(x_shm_unmap, xShmUnmap, (delete: c_int), ffi::SQLITE_OK);

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    if send_thread_held() != ffi::SQLITE_OK {
        // SQLite is about to tell readers of frames that did not reach the file, and this
        // call cannot refuse: as after a failed fsync, a restart recovers what is there.
        tracing::error!("writing held WAL frames failed before SQLite published them; stopping");
        std::process::abort();
    }
    let this = file.cast::<File>();
    // SAFETY: SQLite passes an open file of this layer.
    unsafe {
        if let Some(barrier) = real_methods(this).xShmBarrier {
            barrier((*this).real);
        }
    }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let this = file.cast::<File>();
    // SAFETY: SQLite passes an open file of this layer.
    unsafe {
        real_methods(this)
            .xSectorSize
            .map_or(4096, |f| f((*this).real))
    }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let this = file.cast::<File>();
    // SAFETY: SQLite passes an open file of this layer.
    unsafe {
        real_methods(this)
            .xDeviceCharacteristics
            .map_or(0, |f| f((*this).real))
    }
}

/// The method tables, one per version of SQLite's interface: a file gets the version its real
/// file has, so SQLite asks it for nothing the real one cannot do.
static METHODS: [ffi::sqlite3_io_methods; 3] = [methods(1), methods(2), methods(3)];

const fn methods(version: c_int) -> ffi::sqlite3_io_methods {
    ffi::sqlite3_io_methods {
        iVersion: version,
        xClose: Some(x_close),
        xRead: Some(x_read),
        xWrite: Some(x_write),
        xTruncate: Some(x_truncate),
        xSync: Some(x_sync),
        xFileSize: Some(x_file_size),
        xLock: Some(x_lock),
        xUnlock: Some(x_unlock),
        xCheckReservedLock: Some(x_check_reserved_lock),
        xFileControl: Some(x_file_control),
        xSectorSize: Some(x_sector_size),
        xDeviceCharacteristics: Some(x_device_characteristics),
        xShmMap: if version >= 2 { Some(x_shm_map) } else { None },
        xShmLock: if version >= 2 { Some(x_shm_lock) } else { None },
        xShmBarrier: if version >= 2 {
            Some(x_shm_barrier)
        } else {
            None
        },
        xShmUnmap: if version >= 2 {
            Some(x_shm_unmap)
        } else {
            None
        },
        xFetch: if version >= 3 { Some(x_fetch) } else { None },
        xUnfetch: if version >= 3 { Some(x_unfetch) } else { None },
    }
}
