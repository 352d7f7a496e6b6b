//! Directory listing (FindFirstFile / FindNextFile) through an iterator.

use std::ffi::{c_char, CString};

use dds_host::EntryKind;

use crate::handle::{conn, dds_t, handle, out_ptr, str_arg, Handle, DEAD_MAGIC};
use crate::status::{dds_status, guard};
use crate::types::{dds_dir_entry, DDS_ENTRY_DIR, DDS_ENTRY_FILE};

const DIR_MAGIC: u64 = u64::from_le_bytes(*b"dds:dirs");

/// A snapshot of a directory's entries (opaque), from `dds_list_directory`. Independent of
/// the connection (it may outlive it); free with `dds_dir_close`. Not safe for concurrent
/// use from several threads.
pub struct dds_dir_iter_t {
    magic: u64,
    entries: Vec<Item>,
    next: usize,
}

struct Item {
    name: CString,
    kind: u32,
    id: u32,
    size: u64,
}

impl Handle for dds_dir_iter_t {
    const MAGIC: u64 = DIR_MAGIC;
    const NAME: &'static str = "dds_dir_iter_t";
    unsafe fn magic(p: *const Self) -> u64 {
        std::ptr::addr_of!((*p).magic).read()
    }
}

/// Lists the directory `path` (`"/"` for the root): stores in `*out` an iterator over a
/// snapshot of its entries, to be read with `dds_dir_next` and freed with `dds_dir_close`.
///
/// # Safety
/// `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string; `out` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_list_directory(
    dds: *mut dds_t,
    path: *const c_char,
    out: *mut *mut dds_dir_iter_t,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let p = str_arg(path, "path")?;
        let out = out_ptr(out, "out")?;
        let entries = h
            .dds
            .list_dir(p)?
            .into_iter()
            .map(|e| Item {
                // Names never hold NUL; should one, it is cut there.
                name: CString::new(e.name.split('\0').next().unwrap_or_default())
                    .unwrap_or_default(),
                kind: match e.kind {
                    EntryKind::File => DDS_ENTRY_FILE,
                    EntryKind::Dir => DDS_ENTRY_DIR,
                },
                id: e.id,
                size: e.size,
            })
            .collect();
        out.write(Box::into_raw(Box::new(dds_dir_iter_t {
            magic: DIR_MAGIC,
            entries,
            next: 0,
        })));
        Ok(())
    })
}

/// Stores the number of entries of the listing in `*count`.
///
/// # Safety
/// `iter` is NULL or a live iterator; `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_dir_count(iter: *mut dds_dir_iter_t, count: *mut usize) -> dds_status {
    guard(|| {
        let it = handle(iter)?;
        let count = out_ptr(count, "count")?;
        count.write(it.entries.len());
        Ok(())
    })
}

/// FindNextFile: stores the next entry in `*entry` and true in `*has_entry`; at the end of
/// the listing stores false in `*has_entry` and leaves `*entry` alone. Entry names stay valid
/// until `dds_dir_close`.
///
/// # Safety
/// `iter` is NULL or a live iterator used by no other thread; `entry` and `has_entry` are
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_dir_next(
    iter: *mut dds_dir_iter_t,
    entry: *mut dds_dir_entry,
    has_entry: *mut bool,
) -> dds_status {
    guard(|| {
        handle(iter.cast_const())?;
        let entry = out_ptr(entry, "entry")?;
        let has_entry = out_ptr(has_entry, "has_entry")?;
        // SAFETY: checked above; the caller does not share the iterator between threads.
        let it = &mut *iter;
        match it.entries.get(it.next) {
            Some(e) => {
                entry.write(dds_dir_entry {
                    name: e.name.as_ptr(),
                    kind: e.kind,
                    id: e.id,
                    size: e.size,
                });
                it.next += 1;
                has_entry.write(true);
            }
            None => has_entry.write(false),
        }
        Ok(())
    })
}

/// Frees a directory iterator and the names it returned.
///
/// # Safety
/// `iter` is NULL or a live iterator used by no other thread during or after this call.
#[no_mangle]
pub unsafe extern "C" fn dds_dir_close(iter: *mut dds_dir_iter_t) -> dds_status {
    guard(|| {
        handle(iter.cast_const())?;
        std::ptr::addr_of_mut!((*iter).magic).write(DEAD_MAGIC);
        drop(Box::from_raw(iter));
        Ok(())
    })
}
