//! A VFS over SQLite's default one whose WAL files write each transaction's frames with one `pwrite`.
//!
//! SQLite writes a WAL frame as two `pwrite`s (its 24-byte header, then the page), so a run's ~45 frames
//! were ~95 system calls — a tenth of the server's CPU a run at concurrency 1, each call paying the
//! syscall, the inode lock and the page-cache bookkeeping of the one or two pages it touched (issue 29).
//! Here a WAL file gathers consecutive writes in memory and hands them to the real file as one write:
//! - after the page of a *commit frame* (a frame header whose "database size after commit" field is not
//!   zero), that is before SQLite syncs the WAL or publishes the frames in the WAL index — so whatever
//!   another connection can know to read is on the file, whatever `synchronous` is;
//! - before every other operation on the file (`xSync`, `xRead`, `xFileSize`, `xTruncate`,
//!   `xFileControl`, `xClose`), and before a write that does not continue the gathered range or would
//!   take it past [`WRITE_MAX`].
//!
//! A failed write answers its error to the call that caused it and drops what was gathered: SQLite then
//! fails the transaction, which never reached the WAL index. A crash loses only frames of a transaction
//! that had not committed. Every other file (the database, the shared-memory index, journals) is the
//! default VFS's own, untouched: its methods are called directly, not through this module.
//!
//! The unsafe code is SQLite's VFS interface (C function pointers over memory SQLite allocates); no crate
//! offers a shim over the default VFS.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{align_of, size_of};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name connections open with ([`name`]).
const NAME: &CStr = c"switchboard-wal";

/// Most bytes one write of the default VFS takes (its `seekAndWriteFd` masks a length to 17 bits; SQLite
/// itself never writes more than a page at once).
const WRITE_MAX: usize = 0x1ffff;

/// A WAL frame header's size (SQLite file format §4.1).
const FRAME_HEADER: usize = 24;

/// The VFS's name, registered on first use; `None` when SQLite has no default VFS to wrap (then
/// connections open on the default, unchanged).
pub(super) fn name() -> Option<&'static CStr> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    REGISTERED
        .get_or_init(|| unsafe { register() })
        .then_some(NAME)
}

/// The wrapped VFS (SQLite's default), and ours, which lives for the process.
struct Vfs {
    inner: *mut ffi::sqlite3_vfs,
    ours: ffi::sqlite3_vfs,
}

// SAFETY: SQLite's VFS objects are immutable once registered and made for use from any thread.
unsafe impl Send for Vfs {}
unsafe impl Sync for Vfs {}

static VFS: OnceLock<Box<Vfs>> = OnceLock::new();

/// Where the real file starts in the memory SQLite allocates for one of ours: after our header, aligned.
const REAL_AT: usize = size_of::<WalFile>().next_multiple_of(align_of::<u64>() * 2);

unsafe fn register() -> bool {
    let inner = ffi::sqlite3_vfs_find(ptr::null());
    if inner.is_null() {
        return false;
    }
    // Every method but `xOpen` is the default VFS's, called with our `sqlite3_vfs` and the same
    // `pAppData`: none of them reads more of it than that.
    let mut ours: ffi::sqlite3_vfs = ptr::read(inner);
    ours.szOsFile = (*inner).szOsFile + REAL_AT as c_int;
    ours.zName = NAME.as_ptr();
    ours.pNext = ptr::null_mut();
    ours.xOpen = Some(x_open);
    let vfs = VFS.get_or_init(|| Box::new(Vfs { inner, ours }));
    let rc = ffi::sqlite3_vfs_register(ptr::addr_of!(vfs.ours).cast_mut(), 0);
    rc == ffi::SQLITE_OK
}

fn inner() -> *mut ffi::sqlite3_vfs {
    VFS.get().map_or(ptr::null_mut(), |v| v.inner)
}

/// One of our WAL files: SQLite's `sqlite3_file` header (pointing at [`WAL_METHODS`]), then the real
/// file at [`REAL_AT`].
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    gathered: *mut Gathered,
}

/// Writes not yet handed to the real file: `bytes` from offset `at`.
#[derive(Default)]
struct Gathered {
    at: i64,
    bytes: Vec<u8>,
    /// The last write was a commit frame's header: the page that follows ends the transaction's frames.
    commit_next: bool,
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let inner = inner();
    let Some(open) = (*inner).xOpen else {
        return ffi::SQLITE_CANTOPEN;
    };
    if flags & ffi::SQLITE_OPEN_WAL == 0 {
        // Not a WAL: the real file in place, its methods called directly.
        return open(inner, name, file, flags, out_flags);
    }
    let wal = file.cast::<WalFile>();
    let real = file.cast::<u8>().add(REAL_AT).cast::<ffi::sqlite3_file>();
    (*wal).base.pMethods = ptr::null();
    let rc = open(inner, name, real, flags, out_flags);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (*wal).real = real;
    (*wal).gathered = Box::into_raw(Box::<Gathered>::default());
    (*wal).base.pMethods = &WAL_METHODS;
    rc
}

/// The real file's methods.
unsafe fn methods(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    let real = (*file.cast::<WalFile>()).real;
    (real, &*(*real).pMethods)
}

/// Hand what is gathered to the real file; on failure it is dropped and the error answered.
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    let gathered = &mut *(*file.cast::<WalFile>()).gathered;
    gathered.commit_next = false;
    if gathered.bytes.is_empty() {
        return ffi::SQLITE_OK;
    }
    let (real, m) = methods(file);
    let rc = match m.xWrite {
        Some(write) => write(
            real,
            gathered.bytes.as_ptr().cast(),
            gathered.bytes.len() as c_int,
            gathered.at,
        ),
        None => ffi::SQLITE_IOERR_WRITE,
    };
    gathered.bytes.clear();
    #[cfg(test)]
    tests::WRITES.with(|w| w.set(w.get() + 1));
    rc
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let gathered = &mut *(*file.cast::<WalFile>()).gathered;
    if !gathered.bytes.is_empty()
        && (offset != gathered.at + gathered.bytes.len() as i64
            || gathered.bytes.len() + len > WRITE_MAX)
    {
        let rc = flush(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    let gathered = &mut *(*file.cast::<WalFile>()).gathered;
    if gathered.bytes.is_empty() {
        gathered.at = offset;
    }
    let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len);
    gathered.bytes.extend_from_slice(bytes);
    let ends_frames = std::mem::take(&mut gathered.commit_next);
    gathered.commit_next = !ends_frames
        && len == FRAME_HEADER
        && u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) != 0;
    if ends_frames {
        return flush(file);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let flushed = flush(file);
    let (real, m) = methods(file);
    let closed = m.xClose.map_or(ffi::SQLITE_OK, |close| close(real));
    drop(Box::from_raw((*file.cast::<WalFile>()).gathered));
    (*file.cast::<WalFile>()).gathered = ptr::null_mut();
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        closed
    }
}

/// Forward a method to the real file after handing it what is gathered.
macro_rules! flushed_then {
    ($name:ident, $field:ident ( $($arg:ident : $ty:ty),* )) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            let rc = flush(file);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let (real, m) = methods(file);
            match m.$field {
                Some(f) => f(real $(, $arg)*),
                None => ffi::SQLITE_IOERR,
            }
        }
    };
}

/// Forward a method that neither reads nor writes the file's bytes.
macro_rules! forward {
    ($name:ident, $field:ident ( $($arg:ident : $ty:ty),* ) or $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            let (real, m) = methods(file);
            match m.$field {
                Some(f) => f(real $(, $arg)*),
                None => $missing,
            }
        }
    };
}

flushed_then!(x_read, xRead(buf: *mut c_void, amount: c_int, offset: i64));
flushed_then!(x_truncate, xTruncate(size: i64));
flushed_then!(x_sync, xSync(flags: c_int));
flushed_then!(x_file_size, xFileSize(size: *mut i64));
flushed_then!(x_file_control, xFileControl(op: c_int, arg: *mut c_void));
forward!(x_lock, xLock(level: c_int) or ffi::SQLITE_OK);
forward!(x_unlock, xUnlock(level: c_int) or ffi::SQLITE_OK);
forward!(x_check_reserved_lock, xCheckReservedLock(out: *mut c_int) or ffi::SQLITE_OK);
forward!(x_sector_size, xSectorSize() or 4096);
forward!(x_device_characteristics, xDeviceCharacteristics() or 0);
forward!(x_shm_map, xShmMap(page: c_int, size: c_int, extend: c_int, out: *mut *mut c_void) or ffi::SQLITE_IOERR);
forward!(x_shm_lock, xShmLock(offset: c_int, n: c_int, flags: c_int) or ffi::SQLITE_IOERR);
forward!(x_shm_unmap, xShmUnmap(delete: c_int) or ffi::SQLITE_OK);
forward!(x_fetch, xFetch(offset: i64, amount: c_int, out: *mut *mut c_void) or ffi::SQLITE_IOERR);
forward!(x_unfetch, xUnfetch(offset: i64, page: *mut c_void) or ffi::SQLITE_OK);

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    let (real, m) = methods(file);
    if let Some(f) = m.xShmBarrier {
        f(real);
    }
}

/// Version 3 (memory-mapped reads) as the default VFS's: SQLite never maps a WAL file, and a method the
/// real file lacks answers as the version-1 default would.
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
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
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use rusqlite::{Connection, OpenFlags};

    thread_local! {
        /// Writes handed to real WAL files on this thread.
        pub(super) static WRITES: Cell<usize> = const { Cell::new(0) };
    }

    fn writes() -> usize {
        WRITES.with(Cell::get)
    }

    fn writer(path: &std::path::Path, synchronous: &str) -> Connection {
        let vfs = super::name().expect("the VFS registers");
        let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", synchronous)
            .unwrap();
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
            .unwrap();
        conn
    }

    /// Rows `k` of `from..to`, each a page's worth of `k`'s byte.
    fn insert(conn: &Connection, from: i64, to: i64) {
        let mut st = conn
            .prepare("INSERT INTO t (k, v) VALUES (?1, ?2)")
            .unwrap();
        for k in from..to {
            st.execute(rusqlite::params![k, vec![k as u8; 3000]])
                .unwrap();
        }
    }

    /// What a connection of the default VFS reads: the rows' count and whether each holds its key's byte.
    fn read(path: &std::path::Path) -> (i64, bool) {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let mut st = conn.prepare("SELECT k, v FROM t ORDER BY k").unwrap();
        let rows: Vec<(i64, Vec<u8>)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let intact = rows
            .iter()
            .all(|(k, v)| v.len() == 3000 && v.iter().all(|b| *b == *k as u8));
        (rows.len() as i64, intact)
    }

    /// With `synchronous = NORMAL` a commit syncs nothing: only the write at its commit frame puts the
    /// frames on the file before the WAL index tells other connections to read them.
    #[test]
    fn a_transactions_frames_reach_the_wal_in_one_write_that_other_connections_read() {
        for synchronous in ["FULL", "NORMAL"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.db");
            let conn = writer(&path, synchronous);
            for round in 0..5 {
                let before = writes();
                conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                insert(&conn, round * 10, round * 10 + 10);
                conn.execute_batch("COMMIT").unwrap();
                // Ten pages and their index pages: one write, at the commit frame.
                assert_eq!(writes() - before, 1, "{synchronous}, round {round}");
                assert_eq!(
                    read(&path),
                    (round * 10 + 10, true),
                    "{synchronous}, round {round}"
                );
            }
        }
    }

    /// A transaction larger than the page cache writes frames before it commits (and may write a page's
    /// frame again); one rolled back leaves frames that never commit. A process that dies without
    /// closing (no checkpoint, nothing flushed at close) leaves every committed row readable.
    #[test]
    fn spilled_rolled_back_and_abandoned_writers_leave_exactly_the_committed_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = writer(&path, "FULL");
        conn.pragma_update(None, "cache_size", 8).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        insert(&conn, 0, 200);
        conn.execute("UPDATE t SET v = v WHERE k % 7 = 0", [])
            .unwrap();
        conn.execute_batch("COMMIT").unwrap();
        assert_eq!(read(&path), (200, true));
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        insert(&conn, 200, 300);
        conn.execute_batch("ROLLBACK").unwrap();
        assert_eq!(read(&path), (200, true));
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        insert(&conn, 300, 310);
        conn.execute_batch("COMMIT").unwrap();
        std::mem::forget(conn);
        assert_eq!(read(&path), (210, true));
        let check: String = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }
}
