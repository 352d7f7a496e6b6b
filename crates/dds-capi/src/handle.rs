//! The opaque handles and the argument checks shared by the entry points.

use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::sync::Mutex;

use dds_host::{Dds, Group};

use crate::status::{Error, Result, DDS_INVALID_PATH};

const CONN_MAGIC: u64 = u64::from_le_bytes(*b"dds:conn");
const GROUP_MAGIC: u64 = u64::from_le_bytes(*b"dds:grup");
/// Written into a handle as it is freed, so that a second free is usually caught.
pub(crate) const DEAD_MAGIC: u64 = 0;

/// A connection to the DPU (opaque). Create with `dds_connect`, free with `dds_disconnect`.
/// Every function taking a `dds_t *` may be called from many threads at once, except
/// `dds_disconnect`, which must be the last call on the handle.
pub struct dds_t {
    magic: u64,
    pub(crate) dds: Dds,
    /// Handle of the connection's default group (owned; freed with the connection).
    pub(crate) default_group: *mut dds_group_t,
    /// Addresses of the group handles made by `dds_create_group` and not deleted yet.
    pub(crate) groups: Mutex<HashSet<usize>>,
    /// Addresses of the buffer handles made by `dds_register_buffer` and not unregistered.
    pub(crate) buffers: Mutex<HashSet<usize>>,
}

/// A notification group (opaque): a request ring, a response ring and the completions of the
/// files bound to it. Create with `dds_create_group` (or get the connection's default group
/// with `dds_default_group`); free with `dds_delete_group` or `dds_disconnect`.
/// `dds_poll_wait` may be called on one group from many threads at once.
pub struct dds_group_t {
    magic: u64,
    pub(crate) group: Group,
}

// SAFETY: the raw pointer in `dds_t` names a handle owned by the connection, freed only by
// `dds_disconnect`; everything else in both handles is `Send + Sync`.
unsafe impl Send for dds_t {}
unsafe impl Sync for dds_t {}

const _: () = {
    const fn thread_safe<T: Send + Sync>() {}
    thread_safe::<Dds>();
    thread_safe::<Group>();
    thread_safe::<dds_group_t>();
};

impl dds_t {
    pub(crate) fn new(dds: Dds) -> dds_t {
        let default_group = new_group(dds.default_group().clone());
        dds_t {
            magic: CONN_MAGIC,
            dds,
            default_group,
            groups: Mutex::new(HashSet::new()),
            buffers: Mutex::new(HashSet::new()),
        }
    }

    pub(crate) fn lock_buffers(&self) -> std::sync::MutexGuard<'_, HashSet<usize>> {
        self.buffers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when `g` is the default group or a group created on this connection and not
    /// deleted yet. Does not dereference `g`.
    pub(crate) fn owns_group(&self, g: *mut dds_group_t) -> bool {
        g == self.default_group || self.lock_groups().contains(&(g as usize))
    }

    pub(crate) fn lock_groups(&self) -> std::sync::MutexGuard<'_, HashSet<usize>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for dds_t {
    fn drop(&mut self) {
        let buffers = self.buffers.get_mut().unwrap_or_else(|p| p.into_inner());
        for addr in buffers.drain() {
            // SAFETY: the set holds only live handles made by `new_buffer` for this connection.
            unsafe { crate::buffer::free_buffer(addr as *mut crate::buffer::dds_buffer_t) };
        }
        let groups = self.groups.get_mut().unwrap_or_else(|p| p.into_inner());
        for addr in groups.drain() {
            // SAFETY: the set holds only live handles made by `new_group` for this connection.
            unsafe { free_group(addr as *mut dds_group_t) };
        }
        // SAFETY: made by `new_group` in `dds_t::new`, never handed out for freeing.
        unsafe { free_group(self.default_group) };
    }
}

pub(crate) fn new_group(group: Group) -> *mut dds_group_t {
    Box::into_raw(Box::new(dds_group_t {
        magic: GROUP_MAGIC,
        group,
    }))
}

/// Frees a group handle and returns its group.
///
/// # Safety
/// `g` is a live handle made by `new_group`, used by no other thread.
pub(crate) unsafe fn free_group(g: *mut dds_group_t) -> Group {
    std::ptr::addr_of_mut!((*g).magic).write(DEAD_MAGIC);
    Box::from_raw(g).group
}

pub(crate) fn new_conn(dds: Dds) -> *mut dds_t {
    Box::into_raw(Box::new(dds_t::new(dds)))
}

/// Frees a connection handle with its group handles.
///
/// # Safety
/// `h` is a live handle made by `new_conn`, used by no other thread.
pub(crate) unsafe fn free_conn(h: *mut dds_t) {
    std::ptr::addr_of_mut!((*h).magic).write(DEAD_MAGIC);
    drop(Box::from_raw(h));
}

/// A handle type: its magic word tells a live handle from garbage or a freed one (best
/// effort: using a freed handle is undefined behaviour all the same).
pub(crate) trait Handle {
    const MAGIC: u64;
    const NAME: &'static str;
    /// # Safety
    /// `p` is non-NULL and aligned.
    unsafe fn magic(p: *const Self) -> u64;
}

impl Handle for dds_t {
    const MAGIC: u64 = CONN_MAGIC;
    const NAME: &'static str = "dds_t";
    unsafe fn magic(p: *const Self) -> u64 {
        std::ptr::addr_of!((*p).magic).read()
    }
}

impl Handle for dds_group_t {
    const MAGIC: u64 = GROUP_MAGIC;
    const NAME: &'static str = "dds_group_t";
    unsafe fn magic(p: *const Self) -> u64 {
        std::ptr::addr_of!((*p).magic).read()
    }
}

/// The object behind a handle argument, after checks for NULL, alignment and the magic word.
///
/// # Safety
/// `p` is NULL or a handle of type `T` that was not freed.
pub(crate) unsafe fn handle<'a, T: Handle>(p: *const T) -> Result<&'a T> {
    if p.is_null() {
        return Err(Error::invalid(format!("{} handle is NULL", T::NAME)));
    }
    if !p.is_aligned() {
        return Err(Error::invalid(format!("{} handle is misaligned", T::NAME)));
    }
    if T::magic(p) != T::MAGIC {
        return Err(Error::invalid(format!("{} is not a live handle", T::NAME)));
    }
    Ok(&*p)
}

/// The connection behind a `dds_t *` argument.
///
/// # Safety
/// `p` is NULL or a handle from `dds_connect` that was not disconnected.
pub(crate) unsafe fn conn<'a>(p: *const dds_t) -> Result<&'a dds_t> {
    handle(p)
}

/// The group behind a `dds_group_t *` argument.
///
/// # Safety
/// `p` is NULL or a group handle that was not freed.
pub(crate) unsafe fn group<'a>(p: *const dds_group_t) -> Result<&'a dds_group_t> {
    handle(p)
}

/// Checks an out-pointer: non-NULL and aligned. Write through it with `ptr::write`.
pub(crate) fn out_ptr<T>(p: *mut T, what: &'static str) -> Result<*mut T> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    if !p.is_aligned() {
        return Err(Error::invalid(format!("{what} is misaligned")));
    }
    Ok(p)
}

/// Checks an input struct pointer and reads the struct.
///
/// # Safety
/// `p` is NULL or points to a readable `T`.
pub(crate) unsafe fn input<T: Copy>(p: *const T, what: &'static str) -> Result<T> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    if !p.is_aligned() {
        return Err(Error::invalid(format!("{what} is misaligned")));
    }
    Ok(p.read())
}

/// A NUL-terminated UTF-8 path argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &'static str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| Error::new(DDS_INVALID_PATH, format!("{what} is not valid UTF-8")))
}
