//! C ABI offload plugins (`include/dds_offload.h`): a shared library exporting
//! `dds_offload_plugin_v1`, loaded with `dlopen` and wrapped into an `Arc<dyn OffloadApp>`.
//!
//! The loader checks the ABI version, the name, the limits and that every required function
//! pointer is set. At run time every value the plugin returns is checked (list lengths against
//! capacities, lengths against buffers); a violation is reported as [`Malformed`], which makes
//! the director close the client connection concerned.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::path::Path;
use std::sync::Arc;

use dds_cache::CacheItem;

use crate::api::{
    CacheView, ItemList, KeyList, Malformed, Offload, OffloadApp, ReadOp, ReadResult, ReqDesc,
    ReqList, ResponseLayout, MAX_HEADER_ROOM,
};

/// ABI version this loader implements.
pub const ABI_VERSION: u32 = 1;
/// Name of the exported symbol.
pub const SYMBOL: &[u8] = b"dds_offload_plugin_v1\0";

/// `dds_cache_item` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CCacheItem {
    /// Key.
    pub key: u64,
    /// Version.
    pub version: u64,
    /// Offset.
    pub offset: u64,
    /// Tag.
    pub tag: u64,
    /// File id.
    pub file_id: u32,
    /// Size.
    pub size: u32,
}

/// `dds_req_list`, `dds_key_list`, `dds_item_list`.
#[repr(C)]
#[derive(Debug)]
pub struct CList<T> {
    /// Items.
    pub items: *mut T,
    /// Capacity.
    pub capacity: u32,
    /// Items written.
    pub len: u32,
}

/// `dds_cache_view` (24 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct CCacheView {
    /// Context for `get`.
    pub ctx: *const c_void,
    /// Lookup: 1 and `*out` filled on a hit, 0 on a miss.
    pub get: extern "C" fn(*const c_void, u64, *mut CCacheItem) -> i32,
    /// 1 if the key is masked for this connection (an earlier host-bound request that may
    /// modify it is unanswered), else 0.
    pub masked: extern "C" fn(*const c_void, u64) -> i32,
}

type FrameFn = unsafe extern "C" fn(*mut c_void, *const u8, usize, *mut usize) -> i32;

/// `dds_offload_plugin_v1_t` (120 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PluginV1 {
    /// Must be [`ABI_VERSION`].
    pub abi_version: u32,
    /// Header room.
    pub header_room: u32,
    /// App name.
    pub name: *const c_char,
    /// Limits.
    pub max_message_len: u32,
    /// Limits.
    pub max_response_len: u32,
    /// Limits.
    pub max_requests: u32,
    /// Limits.
    pub max_forward_keys: u32,
    /// Limits.
    pub max_write_items: u32,
    /// Limits.
    pub max_read_keys: u32,
    /// First argument of every function.
    pub user: *mut c_void,
    /// Framing of the client stream.
    pub message_len: Option<FrameFn>,
    /// Framing of the host stream.
    pub response_len: Option<FrameFn>,
    /// Offload predicate.
    pub offload_predicate: Option<PredicateFn>,
    /// Offload function.
    pub offload_function: Option<OffloadFn>,
    /// Response builder.
    pub build_response: Option<BuildResponseFn>,
    /// Host-message builder.
    pub build_host_message: Option<HostMessageFn>,
    /// Keys of a host-bound request (nullable).
    pub invalidate_on_forward: Option<ForwardKeysFn>,
    /// Cache-on-write (nullable).
    pub cache_on_write: Option<CacheOnWriteFn>,
    /// Invalidate-on-read (nullable).
    pub invalidate_on_read: Option<InvalidateOnReadFn>,
}

/// `offload_predicate`.
pub type PredicateFn = unsafe extern "C" fn(
    *mut c_void,
    *const u8,
    usize,
    *const CCacheView,
    *mut CList<ReqDesc>,
    *mut CList<ReqDesc>,
) -> i32;
/// `offload_function`.
pub type OffloadFn = unsafe extern "C" fn(
    *mut c_void,
    *const u8,
    usize,
    ReqDesc,
    *const CCacheView,
    *mut ReadOp,
) -> i32;
/// `build_response`.
pub type BuildResponseFn = unsafe extern "C" fn(
    *mut c_void,
    *const u8,
    usize,
    *const ReadOp,
    i64,
    *mut u8,
    usize,
    *mut u8,
    usize,
    *mut u32,
    *mut u32,
) -> i32;
/// `build_host_message`.
pub type HostMessageFn = unsafe extern "C" fn(
    *mut c_void,
    *const u8,
    usize,
    *const ReqDesc,
    usize,
    *mut u8,
    usize,
) -> i64;
/// `invalidate_on_forward`.
pub type ForwardKeysFn =
    unsafe extern "C" fn(*mut c_void, *const u8, usize, ReqDesc, *mut CList<u64>);
/// `cache_on_write`.
pub type CacheOnWriteFn =
    unsafe extern "C" fn(*mut c_void, u32, u64, *const u8, usize, *mut CList<CCacheItem>);
/// `invalidate_on_read`.
pub type InvalidateOnReadFn = unsafe extern "C" fn(*mut c_void, u32, u64, u32, *mut CList<u64>);

const _: () = assert!(std::mem::size_of::<PluginV1>() == 120);
const _: () = assert!(std::mem::size_of::<CCacheItem>() == 40);
const _: () = assert!(std::mem::size_of::<ReqDesc>() == 12);
const _: () = assert!(std::mem::size_of::<ReadOp>() == 16);

/// Why a plugin cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// dlopen or dlsym failed.
    #[error("cannot load offload plugin: {0}")]
    Load(#[from] libloading::Error),
    /// The table is unusable.
    #[error("invalid offload plugin: {0}")]
    Invalid(String),
}

/// A loaded plugin, usable as an [`OffloadApp`].
pub struct PluginApp {
    t: PluginV1,
    name: String,
    _lib: libloading::Library,
}

// SAFETY: the ABI requires every plugin function to be thread-safe; `user` is only passed
// back to them.
unsafe impl Send for PluginApp {}
// SAFETY: as above.
unsafe impl Sync for PluginApp {}

impl std::fmt::Debug for PluginApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginApp")
            .field("name", &self.name)
            .finish()
    }
}

fn bad(s: impl Into<String>) -> PluginError {
    PluginError::Invalid(s.into())
}

impl PluginApp {
    /// Loads and validates a plugin.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<dyn OffloadApp>, PluginError> {
        Ok(Arc::new(Self::load_app(path)?))
    }

    /// Loads and validates a plugin (concrete type).
    pub fn load_app(path: impl AsRef<Path>) -> Result<PluginApp, PluginError> {
        // SAFETY: loading a library runs its initializers; the operator chose this file.
        let lib = unsafe { libloading::Library::new(path.as_ref().as_os_str())? };
        // SAFETY: the symbol is a data symbol of type `dds_offload_plugin_v1_t`.
        let t: PluginV1 = unsafe {
            let sym: libloading::Symbol<*const PluginV1> = lib.get(SYMBOL)?;
            let p: *const PluginV1 = *sym;
            if p.is_null() {
                return Err(bad("symbol dds_offload_plugin_v1 is null"));
            }
            // The ABI version is the first field: check it before reading the rest.
            let v = std::ptr::read(p as *const u32);
            if v != ABI_VERSION {
                return Err(bad(format!(
                    "ABI version {v}, this DPU implements {ABI_VERSION}"
                )));
            }
            std::ptr::read(p)
        };
        if t.name.is_null() {
            return Err(bad("name is null"));
        }
        // SAFETY: non-null, NUL-terminated per the ABI; bounded below.
        let name = unsafe { CStr::from_ptr(t.name) };
        let name = name
            .to_str()
            .ok()
            .filter(|n| !n.is_empty() && n.len() < 64)
            .ok_or_else(|| bad("name must be 1..=63 bytes of UTF-8"))?
            .to_string();
        if t.header_room as usize > MAX_HEADER_ROOM {
            return Err(bad(format!(
                "header_room {} above {MAX_HEADER_ROOM}",
                t.header_room
            )));
        }
        if t.max_message_len < 4 || t.max_message_len > 1 << 30 {
            return Err(bad("max_message_len outside 4 ..= 1 GiB"));
        }
        if t.max_response_len < 4 || t.max_response_len > 1 << 30 {
            return Err(bad("max_response_len outside 4 ..= 1 GiB"));
        }
        if t.max_requests == 0 || t.max_requests > 65536 {
            return Err(bad("max_requests outside 1 ..= 65536"));
        }
        if t.max_forward_keys > 1 << 22 || t.max_write_items > 1 << 22 || t.max_read_keys > 1 << 22
        {
            return Err(bad("key or item limits above 4 Mi"));
        }
        let required = [
            ("message_len", t.message_len.is_some()),
            ("response_len", t.response_len.is_some()),
            ("offload_predicate", t.offload_predicate.is_some()),
            ("offload_function", t.offload_function.is_some()),
            ("build_response", t.build_response.is_some()),
            ("build_host_message", t.build_host_message.is_some()),
        ];
        if let Some((f, _)) = required.iter().find(|(_, set)| !set) {
            return Err(bad(format!("required function {f} is null")));
        }
        tracing::info!(name, "offload plugin loaded");
        Ok(PluginApp { t, name, _lib: lib })
    }

    fn frame(&self, f: FrameFn, buf: &[u8], max: u32) -> Result<Option<usize>, Malformed> {
        let mut out = 0usize;
        // SAFETY: valid buffer for its length; `out` is a valid pointer.
        let rc = unsafe { f(self.t.user, buf.as_ptr(), buf.len(), &mut out) };
        match rc {
            0 if out > 0 && out <= max as usize => Ok(Some(out)),
            0 => Err(Malformed("plugin framing returned an out-of-range length")),
            1 => Ok(None),
            _ => Err(Malformed("plugin framing: malformed")),
        }
    }
}

extern "C" fn view_get(ctx: *const c_void, key: u64, out: *mut CCacheItem) -> i32 {
    if ctx.is_null() || out.is_null() {
        return 0;
    }
    // SAFETY: `ctx` is the `CacheView` the bridge passed for the duration of the call.
    let view = unsafe { &*(ctx as *const CacheView<'_>) };
    match view.get(key) {
        Some(it) => {
            // SAFETY: the plugin passes a valid item pointer.
            unsafe {
                *out = CCacheItem {
                    key: it.key,
                    version: it.version,
                    offset: it.offset,
                    tag: it.tag,
                    file_id: it.file_id,
                    size: it.size,
                }
            };
            1
        }
        None => 0,
    }
}

extern "C" fn view_masked(ctx: *const c_void, key: u64) -> i32 {
    if ctx.is_null() {
        return 1;
    }
    // SAFETY: `ctx` is the `CacheView` the bridge passed for the duration of the call.
    let view = unsafe { &*(ctx as *const CacheView<'_>) };
    i32::from(view.is_masked(key))
}

fn c_view(view: &CacheView<'_>) -> CCacheView {
    CCacheView {
        ctx: view as *const CacheView<'_> as *const c_void,
        get: view_get,
        masked: view_masked,
    }
}

fn with_list<T: Copy + Default, R>(
    list: &mut crate::api::FixedList<T>,
    f: impl FnOnce(*mut CList<T>) -> R,
) -> Result<R, Malformed> {
    let (items, len) = list.raw_parts();
    let mut c = CList {
        items: items.as_mut_ptr(),
        capacity: items.len().min(u32::MAX as usize) as u32,
        len: *len as u32,
    };
    let r = f(&mut c);
    if c.len > c.capacity {
        return Err(Malformed("plugin overfilled a list"));
    }
    *len = c.len as usize;
    Ok(r)
}

thread_local! {
    static ITEMS: RefCell<Vec<CCacheItem>> = const { RefCell::new(Vec::new()) };
}

impl OffloadApp for PluginApp {
    fn name(&self) -> &str {
        &self.name
    }
    fn max_message_len(&self) -> usize {
        self.t.max_message_len as usize
    }
    fn max_response_len(&self) -> usize {
        self.t.max_response_len as usize
    }
    fn max_requests(&self) -> usize {
        self.t.max_requests as usize
    }
    fn max_forward_keys(&self) -> usize {
        self.t.max_forward_keys as usize
    }
    fn max_write_items(&self) -> usize {
        self.t.max_write_items as usize
    }
    fn max_read_keys(&self) -> usize {
        self.t.max_read_keys as usize
    }
    fn header_room(&self) -> usize {
        self.t.header_room as usize
    }

    fn message_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        let f = self.t.message_len.expect("validated at load");
        self.frame(f, buf, self.t.max_message_len)
    }

    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        let f = self.t.response_len.expect("validated at load");
        self.frame(f, buf, self.t.max_response_len)
    }

    fn offload_predicate(
        &self,
        msg: &[u8],
        cache: &CacheView<'_>,
        host: &mut ReqList,
        dpu: &mut ReqList,
    ) -> Result<(), Malformed> {
        let f = self.t.offload_predicate.expect("validated at load");
        let view = c_view(cache);
        let mut rc = 0;
        with_list(host, |h| {
            with_list(dpu, |d| {
                // SAFETY: all pointers valid for the call; lists bounded by their capacity.
                rc = unsafe { f(self.t.user, msg.as_ptr(), msg.len(), &view, h, d) };
            })
        })??;
        if rc != 0 {
            return Err(Malformed("plugin predicate: malformed message"));
        }
        Ok(())
    }

    fn offload_function(&self, msg: &[u8], req: ReqDesc, cache: &CacheView<'_>) -> Offload {
        let f = self.t.offload_function.expect("validated at load");
        let view = c_view(cache);
        let mut op = ReadOp::default();
        // SAFETY: valid pointers for the call.
        let rc = unsafe { f(self.t.user, msg.as_ptr(), msg.len(), req, &view, &mut op) };
        if rc == 1 {
            Offload::Read(op)
        } else {
            Offload::Host
        }
    }

    fn build_response(
        &self,
        req_head: &[u8],
        op: &ReadOp,
        result: ReadResult,
        room: &mut [u8],
        data: &mut [u8],
    ) -> Result<ResponseLayout, Malformed> {
        let f = self.t.build_response.expect("validated at load");
        let res = match result {
            Ok(n) => i64::from(n),
            Err(code) => -i64::from(code),
        };
        let (mut hl, mut tl) = (0u32, 0u32);
        // SAFETY: valid buffers for their lengths.
        let rc = unsafe {
            f(
                self.t.user,
                req_head.as_ptr(),
                req_head.len(),
                op,
                res,
                room.as_mut_ptr(),
                room.len(),
                data.as_mut_ptr(),
                data.len(),
                &mut hl,
                &mut tl,
            )
        };
        if rc != 0 {
            return Err(Malformed("plugin response builder failed"));
        }
        if hl as usize > room.len() || tl < hl || (tl - hl) as usize > data.len() {
            return Err(Malformed(
                "plugin response builder returned an out-of-range layout",
            ));
        }
        Ok(ResponseLayout {
            header_len: hl,
            total_len: tl,
        })
    }

    fn build_host_message(
        &self,
        msg: &[u8],
        host: &[ReqDesc],
        out: &mut [u8],
    ) -> Result<usize, Malformed> {
        let f = self.t.build_host_message.expect("validated at load");
        // SAFETY: valid buffers for their lengths.
        let n = unsafe {
            f(
                self.t.user,
                msg.as_ptr(),
                msg.len(),
                host.as_ptr(),
                host.len(),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        if n <= 0 || n as usize > out.len() {
            return Err(Malformed("plugin host-message builder failed"));
        }
        Ok(n as usize)
    }

    fn invalidate_on_forward(&self, msg: &[u8], req: ReqDesc, keys: &mut KeyList) {
        let Some(f) = self.t.invalidate_on_forward else {
            return;
        };
        // SAFETY: valid pointers for the call.
        let r = with_list(keys, |k| unsafe {
            f(self.t.user, msg.as_ptr(), msg.len(), req, k)
        });
        if r.is_err() {
            // Overfilled: leave the list full, which the director treats as an error.
            while keys.push(0).is_ok() {}
        }
    }

    fn cache_on_write(&self, file_id: u32, offset: u64, data: &[u8], items: &mut ItemList) {
        let Some(f) = self.t.cache_on_write else {
            return;
        };
        let cap = items.capacity() - items.len();
        ITEMS.with(|scratch| {
            let mut s = scratch.borrow_mut();
            if s.len() < cap {
                // Once per thread: the scratch matches the app's limit.
                s.resize(cap, CCacheItem::default());
            }
            let mut c = CList {
                items: s.as_mut_ptr(),
                capacity: cap.min(u32::MAX as usize) as u32,
                len: 0,
            };
            // SAFETY: valid buffers for the call.
            unsafe {
                f(
                    self.t.user,
                    file_id,
                    offset,
                    data.as_ptr(),
                    data.len(),
                    &mut c,
                )
            };
            let n = (c.len.min(c.capacity)) as usize;
            for it in &s[..n] {
                let _ = items.push(CacheItem {
                    key: it.key,
                    version: 0,
                    file_id: it.file_id,
                    offset: it.offset,
                    size: it.size,
                    tag: it.tag,
                });
            }
        });
    }

    fn invalidate_on_read(&self, file_id: u32, offset: u64, len: u32, keys: &mut KeyList) {
        let Some(f) = self.t.invalidate_on_read else {
            return;
        };
        // SAFETY: valid pointers for the call.
        let _ = with_list(keys, |k| unsafe { f(self.t.user, file_id, offset, len, k) });
    }
}
