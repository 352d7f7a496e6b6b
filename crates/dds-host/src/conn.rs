//! The control connection and the file/directory API.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use dds_proto::cache_records::{
    encode_cache_items, encode_invalidate_items, CacheRecordItem, CACHE_ITEM_BYTES,
    INVALIDATE_ITEM_BYTES,
};
use dds_proto::control::{
    self, DirEntry, FileInfo, FrameError, HelloInfo, Reply, Request, SpaceInfo, PROTOCOL_VERSION,
};
use dds_proto::record::Op;
use dds_proto::Status;
use serde::de::DeserializeOwned;

use crate::buffer::RegisteredBuffer;
use crate::error::{DdsError, Result};
use crate::group::{Group, GroupConfig, GroupInner, IoVec};

/// Library settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Settings of the default notification group, created at connect.
    pub default_group: GroupConfig,
    /// How long a control call may wait for the DPU's reply.
    pub rpc_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_group: GroupConfig::default(),
            rpc_timeout: Duration::from_secs(30),
        }
    }
}

/// State shared by the connection and its groups.
pub(crate) struct Shared {
    ctrl: Mutex<UnixStream>,
    /// A second handle on the control socket, polled for `POLLHUP` only (never read), to
    /// learn that the DPU is gone without taking the control lock.
    lifeline: UnixStream,
    dead: AtomicBool,
    pub(crate) hello: HelloInfo,
}

impl Shared {
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Checks the lifeline without blocking; marks the connection dead on hang-up.
    pub(crate) fn check_alive(&self) -> bool {
        if self.is_dead() {
            return false;
        }
        if lifeline_hung_up(self.lifeline.as_fd(), 0) {
            self.dead.store(true, Ordering::Release);
            return false;
        }
        true
    }

    pub(crate) fn lifeline_fd(&self) -> BorrowedFd<'_> {
        self.lifeline.as_fd()
    }

    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    pub(crate) fn rpc<T: DeserializeOwned>(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<T> {
        if self.is_dead() {
            return Err(DdsError::dead("earlier failure"));
        }
        let sock = self.ctrl.lock().unwrap_or_else(|p| p.into_inner());
        let result = control::send_frame(&sock, req, fds)
            .and_then(|()| control::recv_frame(&sock, &mut Vec::new()));
        let payload = match result {
            Ok(p) => p,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // A timed-out reply leaves the stream out of step: the connection is unusable.
                self.mark_dead();
                return Err(DdsError::new(Status::Timeout, "DPU did not answer in time"));
            }
            Err(e) => {
                self.mark_dead();
                return Err(DdsError::dead(e));
            }
        };
        match control::decode::<Reply>(&payload) {
            Ok(Reply::Ok(v)) => serde_json::from_value(v)
                .map_err(|e| DdsError::new(Status::Protocol, format!("unexpected reply: {e}"))),
            Ok(Reply::Err(e)) => Err(DdsError::new(Status::from_code(e.code), e.message)),
            Err(e) => {
                self.mark_dead();
                Err(DdsError::new(Status::Protocol, format!("bad reply: {e}")))
            }
        }
    }
}

/// `poll(2)` on the lifeline for hang-up only.
pub(crate) fn lifeline_hung_up(fd: BorrowedFd<'_>, timeout_ms: i32) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::empty(),
    )];
    let timeout = rustix::event::Timespec {
        tv_sec: (timeout_ms / 1000) as i64,
        tv_nsec: ((timeout_ms % 1000) * 1_000_000) as i64,
    };
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(n) if n > 0 => fds[0]
            .revents()
            .intersects(rustix::event::PollFlags::HUP | rustix::event::PollFlags::ERR),
        _ => false,
    }
}

/// A connection to the DPU file service.
pub struct Dds {
    shared: Arc<Shared>,
    default_group: Group,
    /// File id → (group, file context) bindings made with [`Dds::poll_add`].
    bindings: RwLock<HashMap<u32, (Group, u64)>>,
    socket: PathBuf,
}

impl Dds {
    /// Connects to the DPU listening on `socket` with default settings.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Dds> {
        Dds::connect_with(socket, Config::default())
    }

    /// Connects, retrying until `timeout` while the DPU is not up yet (e.g. being restarted).
    pub fn connect_retry(socket: impl AsRef<Path>, timeout: Duration) -> Result<Dds> {
        let deadline = Instant::now() + timeout;
        loop {
            match Dds::connect(socket.as_ref()) {
                Ok(d) => return Ok(d),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    pub fn connect_with(socket: impl AsRef<Path>, config: Config) -> Result<Dds> {
        let path = socket.as_ref();
        let sock = UnixStream::connect(path).map_err(|e| DdsError::unreachable(path, e))?;
        sock.set_read_timeout(Some(config.rpc_timeout))
            .map_err(DdsError::dead)?;
        let lifeline = sock.try_clone().map_err(DdsError::dead)?;
        let mut shared = Shared {
            ctrl: Mutex::new(sock),
            lifeline,
            dead: AtomicBool::new(false),
            hello: HelloInfo {
                version: 0,
                payload_align: 8,
                max_io_bytes: 0,
                block_size: 0,
            },
        };
        let hello: HelloInfo = shared.rpc(
            &Request::Hello {
                version: PROTOCOL_VERSION,
            },
            &[],
        )?;
        if hello.version != PROTOCOL_VERSION {
            return Err(DdsError::new(
                Status::Protocol,
                format!(
                    "DPU speaks version {}, library {PROTOCOL_VERSION}",
                    hello.version
                ),
            ));
        }
        shared.hello = hello;
        let shared = Arc::new(shared);
        let default_group = Group::create(&shared, &config.default_group)?;
        Ok(Dds {
            shared,
            default_group,
            bindings: RwLock::new(HashMap::new()),
            socket: path.to_path_buf(),
        })
    }

    /// Opens a new connection to the same socket (after a DPU restart). Requests pending on
    /// this connection have already failed with `DpuDead`.
    pub fn reconnect(&self) -> Result<Dds> {
        Dds::connect(&self.socket)
    }

    pub fn hello(&self) -> &HelloInfo {
        &self.shared.hello
    }

    /// True until the DPU is known to be gone.
    pub fn is_connected(&self) -> bool {
        self.shared.check_alive()
    }

    // ---- directories and files (control plane) ----

    pub fn create_dir(&self, path: &str) -> Result<()> {
        self.unit(&Request::CreateDir { path: path.into() })
    }

    pub fn remove_dir(&self, path: &str) -> Result<()> {
        self.unit(&Request::RemoveDir { path: path.into() })
    }

    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.shared
            .rpc(&Request::ListDir { path: path.into() }, &[])
    }

    pub fn create_file(&self, path: &str) -> Result<FileInfo> {
        self.shared
            .rpc(&Request::CreateFile { path: path.into() }, &[])
    }

    pub fn lookup(&self, path: &str) -> Result<FileInfo> {
        self.shared.rpc(&Request::Lookup { path: path.into() }, &[])
    }

    /// Opens `path`, creating it when it does not exist.
    pub fn open_or_create(&self, path: &str) -> Result<FileInfo> {
        match self.lookup(path) {
            Err(e) if e.status == Status::NotFound => self.create_file(path),
            other => other,
        }
    }

    pub fn stat(&self, file: u32) -> Result<FileInfo> {
        self.shared.rpc(&Request::Stat { id: file }, &[])
    }

    pub fn file_size(&self, file: u32) -> Result<u64> {
        Ok(self.stat(file)?.size)
    }

    pub fn set_file_size(&self, file: u32, size: u64) -> Result<()> {
        self.unit(&Request::Resize { id: file, size })
    }

    pub fn delete_file(&self, file: u32) -> Result<()> {
        self.unit(&Request::DeleteFile { id: file })?;
        self.bindings
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&file);
        Ok(())
    }

    /// Exposes file `file` to the DPU's offload engine (`exposed` true) or withdraws it. Only
    /// exposed files are read on the DPU for network clients or cached by cache-on-write; an
    /// application exposes the files its offload app serves. Returns whether the DPU runs an
    /// offload engine (without one this has no effect). Deleting a file withdraws it.
    pub fn expose_file(&self, file: u32, exposed: bool) -> Result<bool> {
        let info: dds_proto::control::ExposeInfo = self
            .shared
            .rpc(&Request::ExposeFile { id: file, exposed }, &[])?;
        Ok(info.engine)
    }

    /// Announces the address this host application serves its clients on to the DPU's traffic
    /// director, which connects the host legs of the client connections it splits there
    /// (unless `dds dpu --host-app` fixed the address). Returns whether a director runs and
    /// whether it took the address.
    pub fn set_host_app(
        &self,
        addr: std::net::SocketAddr,
    ) -> Result<dds_proto::control::HostAppInfo> {
        self.shared.rpc(
            &Request::SetHostApp {
                addr: addr.to_string(),
            },
            &[],
        )
    }

    /// Runtime statistics of the DPU: per-group counters, memory, DMA, space, offload engine.
    pub fn stats(&self) -> Result<dds_proto::control::DpuStats> {
        self.shared.rpc(&Request::Stats, &[])
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.unit(&Request::Rename {
            from: from.into(),
            to: to.into(),
        })
    }

    pub fn free_space(&self) -> Result<SpaceInfo> {
        self.shared.rpc(&Request::FreeSpace, &[])
    }

    fn unit(&self, req: &Request) -> Result<()> {
        self.shared.rpc::<Option<()>>(req, &[]).map(|_| ())
    }

    // ---- notification groups ----

    /// The group every file belongs to until [`Dds::poll_add`] moves it.
    pub fn default_group(&self) -> &Group {
        &self.default_group
    }

    /// Creates a notification group with its own pair of rings.
    pub fn create_group(&self, config: &GroupConfig) -> Result<Group> {
        Group::create(&self.shared, config)
    }

    /// Deletes a group; its rings are unregistered from the DPU. Requests still pending in
    /// it complete with `DpuDead` from the group's point of view.
    pub fn delete_group(&self, group: Group) -> Result<()> {
        if group.same(&self.default_group) {
            return Err(DdsError::new(
                Status::InvalidArgument,
                "the default group cannot be deleted",
            ));
        }
        self.bindings
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, (g, _)| !g.same(&group));
        let id = group.id();
        let r = self.unit(&Request::DeleteGroup { group: id });
        group.fail_pending(Status::DpuDead);
        r
    }

    /// Sends `file`'s completions to `group`, tagged with `file_ctx`.
    pub fn poll_add(&self, file: u32, group: &Group, file_ctx: u64) -> Result<()> {
        self.stat(file)?;
        self.bindings
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(file, (group.clone(), file_ctx));
        Ok(())
    }

    /// The group and file context of `file`, cloned out of the map so that a caller may block
    /// without holding the map's lock.
    fn group_of(&self, file: u32) -> (Group, u64) {
        let map = self.bindings.read().unwrap_or_else(|p| p.into_inner());
        match map.get(&file) {
            Some((g, ctx)) => (g.clone(), *ctx),
            None => (self.default_group.clone(), 0),
        }
    }

    fn route<T>(&self, file: u32, f: impl FnOnce(&GroupInner, u64) -> T) -> T {
        let map = self.bindings.read().unwrap_or_else(|p| p.into_inner());
        match map.get(&file) {
            Some((g, ctx)) => f(g.inner(), *ctx),
            None => f(self.default_group.inner(), 0),
        }
    }

    // ---- data plane ----

    /// Issues a read of `len` bytes at `offset` into `buf`; completes through the file's group.
    ///
    /// # Safety
    /// `buf .. buf+len` must stay valid and untouched until the completion is returned.
    pub unsafe fn read(
        &self,
        file: u32,
        offset: u64,
        buf: *mut u8,
        len: u32,
        io_ctx: u64,
    ) -> Result<()> {
        let iov = [IoVec { ptr: buf, len }];
        self.route(file, |g, fctx| {
            g.issue_read(file, offset, &iov, fctx, io_ctx, None)
        })
    }

    /// Issues a read of the contiguous file range into several buffers.
    ///
    /// # Safety
    /// Every buffer must stay valid and untouched until the completion is returned.
    pub unsafe fn read_scatter(
        &self,
        file: u32,
        offset: u64,
        bufs: &[IoVec],
        io_ctx: u64,
    ) -> Result<()> {
        self.route(file, |g, fctx| {
            g.issue_read(file, offset, bufs, fctx, io_ctx, None)
        })
    }

    /// Issues a write. The data is copied into the request ring before this returns.
    pub fn write(&self, file: u32, offset: u64, data: &[u8], io_ctx: u64) -> Result<()> {
        self.route(file, |g, fctx| {
            g.issue_write(file, offset, &[data], fctx, io_ctx, None)
        })
    }

    /// Issues a write of several buffers to a contiguous file range.
    pub fn write_gather(&self, file: u32, offset: u64, bufs: &[&[u8]], io_ctx: u64) -> Result<()> {
        self.route(file, |g, fctx| {
            g.issue_write(file, offset, bufs, fctx, io_ctx, None)
        })
    }

    /// Issues a flush: completes once every write of `file`'s group acknowledged before it is
    /// durable on the device.
    pub fn flush(&self, file: u32, io_ctx: u64) -> Result<()> {
        self.route(file, |g, fctx| g.issue_flush(fctx, io_ctx, None))
    }

    /// Reads and waits for the result; returns the bytes read (short at end of file).
    pub fn read_sync(&self, file: u32, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let len = u32::try_from(buf.len())
            .map_err(|_| DdsError::new(Status::TooLarge, "buffer larger than 4 GiB"))?;
        let iov = [IoVec {
            ptr: buf.as_mut_ptr(),
            len,
        }];
        let (g, fctx) = self.group_of(file);
        let waiter = crate::group::WaiterInner::new();
        // SAFETY: `buf` is borrowed mutably for the whole call, and `wait` returns only once
        // the slot has completed (or failed), after which nothing writes to it.
        unsafe {
            g.inner()
                .issue_read(file, offset, &iov, fctx, 0, Some(waiter.clone()))?
        };
        g.inner().wait(&waiter).map(|n| n as usize)
    }

    /// Writes and waits for the result.
    pub fn write_sync(&self, file: u32, offset: u64, data: &[u8]) -> Result<usize> {
        let (g, fctx) = self.group_of(file);
        let waiter = crate::group::WaiterInner::new();
        g.inner()
            .issue_write(file, offset, &[data], fctx, 0, Some(waiter.clone()))?;
        g.inner().wait(&waiter).map(|n| n as usize)
    }

    /// Flushes `file`'s group and waits.
    pub fn flush_sync(&self, file: u32) -> Result<()> {
        let (g, fctx) = self.group_of(file);
        let waiter = crate::group::WaiterInner::new();
        g.inner().issue_flush(fctx, 0, Some(waiter.clone()))?;
        g.inner().wait(&waiter).map(|_| ())
    }

    // ---- registered buffers (zero copy on the host) ----

    /// Allocates an application buffer of `len` bytes in shared memory and registers it with
    /// the DPU (a sealed memfd passed over the control socket). Reads and writes that name a
    /// range of it ([`Dds::read_registered`], [`Dds::write_registered`] and their `_sync`
    /// forms) move their data by DMA straight between the DPU and the buffer: the library
    /// copies nothing. Fails with `BufferLimit` past the DPU's cap on registered bytes per
    /// connection. Dropping the buffer unregisters it (after the operations in flight on it).
    pub fn register_buffer(&self, len: usize) -> Result<RegisteredBuffer> {
        RegisteredBuffer::register(&self.shared, len)
    }

    fn check_buffer(&self, buf: &RegisteredBuffer, offset: usize, len: u32) -> Result<()> {
        if !Arc::ptr_eq(&buf.inner.shared, &self.shared) {
            return Err(DdsError::new(
                Status::InvalidArgument,
                "the buffer is registered on another connection",
            ));
        }
        buf.check_range(offset, len)
    }

    /// Issues a read of `len` bytes at `offset` of `file` that the DPU puts by DMA into
    /// `buf[buf_offset .. buf_offset + len]`; completes through the file's group (bytes read,
    /// short at end of file). The buffer stays registered until the completion.
    ///
    /// # Safety
    /// That range of `buf` is not accessed until the completion is returned.
    pub unsafe fn read_registered(
        &self,
        file: u32,
        offset: u64,
        buf: &RegisteredBuffer,
        buf_offset: usize,
        len: u32,
        io_ctx: u64,
    ) -> Result<()> {
        self.check_buffer(buf, buf_offset, len)?;
        self.route(file, |g, fctx| unsafe {
            g.issue_registered(
                Op::Read,
                file,
                offset,
                &buf.inner,
                buf_offset as u64,
                len,
                fctx,
                io_ctx,
                None,
            )
        })
    }

    /// Issues a write of `buf[buf_offset .. buf_offset + len]` to `file` at `offset`; the
    /// DPU fetches the data by DMA from the buffer, so that range must not change until the
    /// completion is returned (bytes written).
    pub fn write_registered(
        &self,
        file: u32,
        offset: u64,
        buf: &RegisteredBuffer,
        buf_offset: usize,
        len: u32,
        io_ctx: u64,
    ) -> Result<()> {
        self.check_buffer(buf, buf_offset, len)?;
        // SAFETY: a WRITE never stores into the buffer.
        self.route(file, |g, fctx| unsafe {
            g.issue_registered(
                Op::Write,
                file,
                offset,
                &buf.inner,
                buf_offset as u64,
                len,
                fctx,
                io_ctx,
                None,
            )
        })
    }

    /// Reads into `buf[buf_offset .. buf_offset + len]` and waits; returns the bytes read.
    pub fn read_registered_sync(
        &self,
        file: u32,
        offset: u64,
        buf: &mut RegisteredBuffer,
        buf_offset: usize,
        len: u32,
    ) -> Result<usize> {
        // SAFETY: `buf` is borrowed mutably for the whole call.
        unsafe { self.read_registered_sync_shared(file, offset, buf, buf_offset, len) }
    }

    /// As [`Dds::read_registered_sync`] on a shared buffer handle (for the C ABI).
    ///
    /// # Safety
    /// That range of `buf` is not accessed by anyone else during the call.
    pub unsafe fn read_registered_sync_shared(
        &self,
        file: u32,
        offset: u64,
        buf: &RegisteredBuffer,
        buf_offset: usize,
        len: u32,
    ) -> Result<usize> {
        self.check_buffer(buf, buf_offset, len)?;
        let (g, fctx) = self.group_of(file);
        let waiter = crate::group::WaiterInner::new();
        // SAFETY: the caller keeps the range to us, and `wait` returns only once the
        // operation completed (or failed).
        unsafe {
            g.inner().issue_registered(
                Op::Read,
                file,
                offset,
                &buf.inner,
                buf_offset as u64,
                len,
                fctx,
                0,
                Some(waiter.clone()),
            )?
        };
        g.inner().wait(&waiter).map(|n| n as usize)
    }

    /// Writes `buf[buf_offset .. buf_offset + len]` and waits; returns the bytes written.
    pub fn write_registered_sync(
        &self,
        file: u32,
        offset: u64,
        buf: &RegisteredBuffer,
        buf_offset: usize,
        len: u32,
    ) -> Result<usize> {
        self.check_buffer(buf, buf_offset, len)?;
        let (g, fctx) = self.group_of(file);
        let waiter = crate::group::WaiterInner::new();
        // SAFETY: a WRITE never stores into the buffer.
        unsafe {
            g.inner().issue_registered(
                Op::Write,
                file,
                offset,
                &buf.inner,
                buf_offset as u64,
                len,
                fctx,
                0,
                Some(waiter.clone()),
            )?
        };
        g.inner().wait(&waiter).map(|n| n as usize)
    }

    /// Sends cache-table items to the DPU's offload engine, for state that lives in host
    /// memory (`docs/consistency.md`). Goes through the default group's ring, so it is ordered
    /// with the writes issued there before it; returns once the DPU applied it.
    pub fn cache_items(&self, items: &[CacheRecordItem]) -> Result<()> {
        let per = (self.shared.hello.max_io_bytes as usize / CACHE_ITEM_BYTES).max(1);
        for chunk in items.chunks(per) {
            let mut data = vec![0u8; chunk.len() * CACHE_ITEM_BYTES];
            encode_cache_items(chunk, &mut data).expect("sized to the items");
            self.data_record_sync(Op::Cache, &data)?;
        }
        Ok(())
    }

    /// Drops keys from the DPU's cache table (the host is about to change those objects).
    /// Later offloaded reads of them go to the host until cache-on-write re-inserts them.
    pub fn invalidate_keys(&self, keys: &[u64]) -> Result<()> {
        let per = (self.shared.hello.max_io_bytes as usize / INVALIDATE_ITEM_BYTES).max(1);
        for chunk in keys.chunks(per) {
            let mut data = vec![0u8; chunk.len() * INVALIDATE_ITEM_BYTES];
            encode_invalidate_items(chunk, &mut data).expect("sized to the keys");
            self.data_record_sync(Op::Invalidate, &data)?;
        }
        Ok(())
    }

    /// Issues a CACHE record (`invalidate` false: `data` holds items encoded by
    /// `dds_proto::cache_records::encode_cache_items`) or an INVALIDATE record (true: keys
    /// encoded by `encode_invalidate_items`) without waiting: it is ordered with the requests
    /// issued before it on the default group, and its completion carries `io_ctx` (the DPU
    /// applied it). The data is copied into the request ring before this returns.
    pub fn cache_record(&self, invalidate: bool, data: &[u8], io_ctx: u64) -> Result<()> {
        let op = if invalidate {
            Op::Invalidate
        } else {
            Op::Cache
        };
        self.default_group
            .inner()
            .issue_data(op, 0, 0, &[data], 0, io_ctx, None)
    }

    fn data_record_sync(&self, op: Op, data: &[u8]) -> Result<()> {
        let g = self.default_group.inner();
        let waiter = crate::group::WaiterInner::new();
        g.issue_data(op, 0, 0, &[data], 0, 0, Some(waiter.clone()))?;
        g.wait(&waiter).map(|_| ())
    }
}
