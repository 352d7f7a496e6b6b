//! The service thread's control-plane work: the commands the control thread hands it
//! (sessions, groups, registered buffers, exposure, stats) and the metadata operations it
//! queues with the file service and answers once they are durable. The data plane (rounds,
//! parking, waiting for the device) is in the parent module.

use super::*;

/// A control request waiting for its metadata operation (`FileService::submit_meta`).
pub(super) struct MetaWaiter {
    pub(super) reply: Sender<Reply>,
    /// What the reply carries.
    pub(super) kind: MetaKind,
}

#[derive(Clone, Copy)]
pub(super) enum MetaKind {
    /// `()`.
    Unit,
    /// The new file's `FileInfo`.
    Created,
    /// `()`; the file (this id) is withdrawn from the offload engine.
    Deleted(u32),
}

impl Service {
    /// Advances the file service's metadata operations and replies to those that finished.
    pub(super) fn meta_round(&mut self) -> bool {
        if self.fs.meta_pending() == 0 {
            return false;
        }
        let waiting = &mut self.meta_waiting;
        let mut finished = Vec::new();
        self.fs.poll_meta(|user, r| match waiting.remove(&user) {
            Some(w) => finished.push((w, r)),
            None => tracing::error!(user, "metadata result nobody waits for"),
        });
        let n = finished.len();
        for (w, r) in finished {
            let reply = match r {
                Err(e) => Reply::err(Status::from(&e), e.to_string()),
                Ok(done) => match (w.kind, done) {
                    (MetaKind::Created, MetaDone::Created(id)) => match self.fs.stat(id) {
                        Ok(i) => Reply::ok(&file_info(i)),
                        Err(e) => Reply::err(Status::from(&e), e.to_string()),
                    },
                    (MetaKind::Deleted(id), _) => {
                        if let Some(o) = &self.offload {
                            o.exposed.withdraw(id);
                        }
                        Reply::ok(&())
                    }
                    _ => Reply::ok(&()),
                },
            };
            let _ = w.reply.send(reply);
        }
        n > 0
    }

    /// Hands a metadata operation to the file service; the reply is sent when it is durable.
    fn submit_meta(&mut self, op: MetaOp, kind: MetaKind, reply: Sender<Reply>) {
        let user = self.next_meta;
        self.next_meta += 1;
        self.meta_waiting.insert(user, MetaWaiter { reply, kind });
        self.fs.submit_meta(op, user);
    }

    /// Frees groups that are closing and have no I/O left in the file service.
    pub(super) fn reap_closed(&mut self) {
        for slot in self.groups.iter_mut() {
            let done = matches!(slot, Some(g) if g.closing && g.quiescent());
            if done {
                let g = slot.take().expect("checked");
                for &base in &g.registered {
                    self.fs.unregister_memory(base);
                }
                let _ = self.dma.unregister_region(g.region);
                self.memory_used -= g.memory_bytes;
                tracing::debug!(group = g.id, "group freed");
            }
        }
    }

    pub(super) fn handle_commands(&mut self) -> bool {
        let mut n = 0;
        while n < COMMANDS_PER_ROUND {
            let Ok(cmd) = self.commands.try_recv() else {
                break;
            };
            n += 1;
            match cmd {
                Command::Op {
                    conn,
                    req,
                    fds,
                    reply,
                } => {
                    let meta = match req {
                        Request::CreateDir { path } => {
                            Ok((MetaOp::CreateDir { path }, MetaKind::Unit))
                        }
                        Request::RemoveDir { path } => {
                            Ok((MetaOp::RemoveDir { path }, MetaKind::Unit))
                        }
                        Request::CreateFile { path } => {
                            Ok((MetaOp::CreateFile { path }, MetaKind::Created))
                        }
                        Request::DeleteFile { id } => {
                            Ok((MetaOp::DeleteFile { id: FileId(id) }, MetaKind::Deleted(id)))
                        }
                        Request::Rename { from, to } => {
                            Ok((MetaOp::Rename { from, to }, MetaKind::Unit))
                        }
                        Request::Resize { id, size } => Ok((
                            MetaOp::Resize {
                                id: FileId(id),
                                size,
                            },
                            MetaKind::Unit,
                        )),
                        other => Err(other),
                    };
                    match meta {
                        // Changes: replied to by `meta_round` once durable.
                        Ok((op, kind)) => self.submit_meta(op, kind, reply),
                        Err(req) => {
                            let r = self.execute(conn, req, fds);
                            let _ = reply.send(r);
                        }
                    }
                }
                Command::Disconnect { conn } => {
                    for g in self.groups.iter_mut().flatten() {
                        if g.conn == conn {
                            g.closing = true;
                        }
                    }
                    // The host's buffers go with its connection; a request still in flight
                    // on one fails its DMA (`UnknownBuffer`) instead of touching it.
                    if let Some(b) = self.buffers.remove(&conn) {
                        for rb in b.map.values() {
                            let _ = self.dma.unregister_region(rb.region);
                        }
                        tracing::debug!(conn, buffers = b.map.len(), "buffers released");
                    }
                }
            }
        }
        n > 0
    }

    pub(super) fn execute(&mut self, conn: u64, req: Request, fds: Vec<OwnedFd>) -> Reply {
        let fs = &mut self.fs;
        let r: Result<Reply, dds_fs::FsError> = match req {
            Request::Hello { .. } => Ok(Reply::ok(&self.hello())),
            Request::ListDir { path } => fs.list_dir(&path).map(|entries| {
                let list: Vec<DirEntry> = entries
                    .into_iter()
                    .map(|e| DirEntry {
                        name: e.name,
                        kind: match e.kind {
                            dds_fs::EntryKind::Dir => EntryKind::Dir,
                            dds_fs::EntryKind::File => EntryKind::File,
                        },
                        id: e.id.map_or(0, |i| i.raw()),
                        size: e.size,
                    })
                    .collect();
                Reply::ok(&list)
            }),
            Request::Lookup { path } => fs.lookup(&path).map(|i| Reply::ok(&file_info(i))),
            Request::Stat { id } => fs.stat(FileId(id)).map(|i| Reply::ok(&file_info(i))),
            Request::ExposeFile { id, exposed } => fs.stat(FileId(id)).map(|_| {
                let engine = match &self.offload {
                    Some(o) if exposed => {
                        o.exposed.expose(id);
                        true
                    }
                    Some(o) => {
                        o.exposed.withdraw(id);
                        true
                    }
                    None => false,
                };
                tracing::debug!(id, exposed, engine, "file exposure");
                Reply::ok(&ExposeInfo { engine })
            }),
            Request::SetHostApp { addr } => {
                let Ok(addr) = addr.parse::<std::net::SocketAddr>() else {
                    return Reply::err(
                        Status::InvalidArgument,
                        format!("set_host_app: {addr:?} is not an ip:port address"),
                    );
                };
                let host = self.offload.as_ref().and_then(|o| o.host_app.as_ref());
                let used = host.is_some_and(|h| h.announce(addr));
                tracing::info!(%addr, used, "host application announced");
                return Reply::ok(&HostAppInfo {
                    director: host.is_some(),
                    used,
                });
            }
            Request::Stats => return Reply::ok(&self.stats()),
            Request::RegisterBuffer { len } => return self.register_buffer(conn, fds, len),
            Request::UnregisterBuffer { buffer } => {
                return match self
                    .buffers
                    .get_mut(&conn)
                    .and_then(|b| b.map.remove(&buffer).map(|rb| (b, rb)))
                {
                    Some((b, rb)) => {
                        b.bytes -= rb.len;
                        let _ = self.dma.unregister_region(rb.region);
                        Reply::ok(&())
                    }
                    None => Reply::err(
                        Status::UnknownBuffer,
                        format!("no buffer {buffer} on this connection"),
                    ),
                };
            }
            Request::CreateDir { .. }
            | Request::RemoveDir { .. }
            | Request::CreateFile { .. }
            | Request::DeleteFile { .. }
            | Request::Rename { .. }
            | Request::Resize { .. } => unreachable!("metadata changes go through submit_meta"),
            Request::FreeSpace => {
                let s = fs.free_space();
                Ok(Reply::ok(&SpaceInfo {
                    total_bytes: s.total_bytes,
                    free_bytes: s.free_bytes,
                    segment_size: s.segment_size,
                    files: s.files,
                    dirs: s.dirs,
                }))
            }
            Request::CreateGroup {
                region_len,
                req_offset,
                req_capacity,
                resp_offset,
                resp_capacity,
            } => {
                return self.create_group(
                    conn,
                    fds,
                    region_len,
                    req_offset,
                    req_capacity,
                    resp_offset,
                    resp_capacity,
                )
            }
            Request::DeleteGroup { group } => {
                return match self
                    .groups
                    .iter_mut()
                    .flatten()
                    .find(|g| g.id == group && g.conn == conn && !g.closing)
                {
                    Some(g) => {
                        g.closing = true;
                        Reply::ok(&())
                    }
                    None => Reply::err(
                        Status::InvalidArgument,
                        format!("no group {group} on this connection"),
                    ),
                };
            }
        };
        match r {
            Ok(reply) => reply,
            Err(e) => Reply::err(Status::from(&e), e.to_string()),
        }
    }

    /// Runtime statistics (`dds stats`): per-group counters, memory, DMA, space, offload.
    fn stats(&mut self) -> DpuStats {
        let groups = self
            .groups
            .iter()
            .flatten()
            .map(|g| GroupStats {
                group: g.id,
                conn: g.conn,
                requests: g.counters.requests,
                errors: g.counters.errors,
                bytes_read: g.counters.bytes_read,
                bytes_written: g.counters.bytes_written,
                outstanding: g.outstanding(),
                broken: g.broken,
                closing: g.closing,
            })
            .collect();
        let d = self.dma.stats();
        let s = self.fs.free_space();
        DpuStats {
            groups,
            memory_used_bytes: self.memory_used,
            memory_budget_bytes: self.config.memory_budget_bytes,
            dma: DmaCounters {
                reads: d.reads,
                writes: d.writes,
                bytes_read: d.bytes_read,
                bytes_written: d.bytes_written,
                doorbells: d.doorbells,
                execute_ns: d.execute_ns,
            },
            space: SpaceInfo {
                total_bytes: s.total_bytes,
                free_bytes: s.free_bytes,
                segment_size: s.segment_size,
                files: s.files,
                dirs: s.dirs,
            },
            offload: self.offload.as_mut().map(|o| o.stats()),
            registered_buffers: self.buffers.values().map(|b| b.map.len() as u64).sum(),
            registered_bytes: self.buffers.values().map(|b| b.bytes).sum(),
        }
    }

    /// `register_buffer`: maps a host application buffer for registered READ and WRITE
    /// records of this connection's groups.
    fn register_buffer(&mut self, conn: u64, fds: Vec<OwnedFd>, len: u64) -> Reply {
        let bad = |m: String| Reply::err(Status::InvalidArgument, m);
        let [shm]: [OwnedFd; 1] = match fds.try_into() {
            Ok(a) => a,
            Err(v) => {
                return bad(format!(
                    "register_buffer needs 1 descriptor (shared memory), got {}",
                    v.len()
                ))
            }
        };
        let Ok(_) = usize::try_from(len) else {
            return bad(format!("buffer length {len} too large"));
        };
        if len == 0 {
            return bad("buffer length 0".into());
        }
        let cap = self.config.max_registered_bytes_per_conn;
        let (count, bytes) = self
            .buffers
            .get(&conn)
            .map_or((0, 0), |b| (b.map.len(), b.bytes));
        if count >= crate::MAX_BUFFERS_PER_CONN {
            return Reply::err(
                Status::BufferLimit,
                format!(
                    "this connection holds {count} registered buffers already (at most {})",
                    crate::MAX_BUFFERS_PER_CONN
                ),
            );
        }
        if bytes.saturating_add(len) > cap {
            return Reply::err(
                Status::BufferLimit,
                format!(
                    "registering {len} bytes would make {} bytes of registered buffers on this \
                     connection; the cap is {cap} (dds dpu --max-registered-bytes)",
                    bytes.saturating_add(len)
                ),
            );
        }
        // Staging for registered I/O in every group of the connection that lacks it.
        let need: u64 = self
            .groups
            .iter()
            .flatten()
            .filter(|g| g.conn == conn && !g.closing && !g.has_staging())
            .map(|g| g.staging_bytes())
            .sum();
        if self.memory_used + need > self.config.memory_budget_bytes {
            return Reply::err(
                Status::NoSpace,
                format!(
                    "staging registered I/O needs {need} bytes of DPU memory, {} of {} left",
                    self.config.memory_budget_bytes - self.memory_used,
                    self.config.memory_budget_bytes
                ),
            );
        }
        let region = match self.dma.register_region(RegionExport::memfd(shm, len)) {
            Ok(r) => r.id,
            Err(e) => return bad(format!("cannot register buffer: {e}")),
        };
        for g in self.groups.iter_mut().flatten() {
            if g.conn == conn && !g.closing && !g.has_staging() {
                let before = g.memory_bytes;
                g.add_staging();
                register_io_memory(&mut self.fs, g);
                self.memory_used += g.memory_bytes - before;
            }
        }
        let id = self.next_buffer_id;
        self.next_buffer_id = self.next_buffer_id.wrapping_add(1).max(1);
        let b = self.buffers.entry(conn).or_default();
        b.map.insert(id, RegBuf { region, len });
        b.bytes += len;
        tracing::debug!(conn, buffer = id, len, "buffer registered");
        Reply::ok(&BufferInfo { buffer: id })
    }

    #[allow(clippy::too_many_arguments)]
    fn create_group(
        &mut self,
        conn: u64,
        fds: Vec<OwnedFd>,
        region_len: u64,
        req_offset: u64,
        req_capacity: u64,
        resp_offset: u64,
        resp_capacity: u64,
    ) -> Reply {
        let bad = |m: String| Reply::err(Status::InvalidArgument, m);
        let [shm, eventfd, doorbell]: [OwnedFd; 3] = match fds.try_into() {
            Ok(a) => a,
            Err(v) => {
                return bad(format!(
                    "create_group needs 3 descriptors (shared memory, eventfd, doorbell), got {}",
                    v.len()
                ))
            }
        };
        if !bell::is_eventfd(doorbell.as_fd()) {
            return bad("the doorbell descriptor is not an eventfd".into());
        }
        if !bell::is_eventfd(eventfd.as_fd()) {
            return bad("the notification descriptor is not an eventfd".into());
        }
        if let Err(e) = bell::set_nonblocking(eventfd.as_fd()) {
            return bad(format!(
                "cannot make the notification eventfd non-blocking: {e}"
            ));
        }
        let ring_ok = |off: u64, cap: u64| {
            dds_ring::valid_capacity(cap)
                && (64 << 10..=1 << 30).contains(&cap)
                && off.is_multiple_of(64)
                && off
                    .checked_add(dds_ring::POINTER_AREA_BYTES as u64 + cap)
                    .is_some_and(|end| end <= region_len)
        };
        if !ring_ok(req_offset, req_capacity) || !ring_ok(resp_offset, resp_capacity) {
            return bad(
                "ring layout outside the region or sizes not powers of two in 64 KiB..1 GiB".into(),
            );
        }
        let overlap = req_offset
            < resp_offset + dds_ring::POINTER_AREA_BYTES as u64 + resp_capacity
            && resp_offset < req_offset + dds_ring::POINTER_AREA_BYTES as u64 + req_capacity;
        if overlap {
            return bad("request and response rings overlap".into());
        }
        let live = self.groups.iter().flatten().count();
        if live >= self.config.max_groups {
            return Reply::err(
                Status::TooManyOutstanding,
                format!("DPU serves {live} groups already"),
            );
        }
        let staged = self.buffers.get(&conn).is_some_and(|b| !b.map.is_empty());
        let need = group_memory(req_capacity, resp_capacity, self.config.exec_mode)
            + if staged {
                req_capacity.max(resp_capacity)
            } else {
                0
            };
        if self.memory_used + need > self.config.memory_budget_bytes {
            return Reply::err(
                Status::NoSpace,
                format!(
                    "group needs {need} bytes of DPU memory, {} of {} left",
                    self.config.memory_budget_bytes - self.memory_used,
                    self.config.memory_budget_bytes
                ),
            );
        }
        let region = match self
            .dma
            .register_region(RegionExport::memfd(shm, region_len))
        {
            Ok(r) => r,
            Err(e) => return bad(format!("cannot register region: {e}")),
        };
        let id = self.next_group_id;
        self.next_group_id += 1;
        let params = GroupParams {
            id,
            conn,
            region,
            eventfd,
            doorbell,
            req_offset,
            req_capacity,
            resp_offset,
            resp_capacity,
            max_pending: self
                .config
                .max_pending_per_group
                .clamp(1, crate::group::MAX_PENDING),
            payload_align: (self.fs.mem_align() as u32).max(8),
            max_io_bytes: self.config.max_io_bytes.min(self.fs.max_io_bytes()),
            mode: self.config.exec_mode,
        };
        let mut g = match GroupState::new(params) {
            Ok(g) => g,
            Err(e) => {
                let _ = self.dma.unregister_region(region.id);
                return bad(format!("cannot serve the rings: {e}"));
            }
        };
        if staged {
            g.add_staging();
        }
        register_io_memory(&mut self.fs, &mut g);
        self.memory_used += g.memory_bytes;
        match self.groups.iter().position(|s| s.is_none()) {
            Some(i) => self.groups[i] = Some(g),
            None => self.groups.push(Some(g)),
        }
        tracing::debug!(group = id, conn, "group created");
        Reply::ok(&GroupInfo { group: id })
    }
}

/// Registers with the device the group's I/O memory not registered yet, so that its reads
/// and writes skip pinning pages (io_uring fixed buffers; refused registrations cost nothing
/// but that saving).
fn register_io_memory(fs: &mut FileService, g: &mut GroupState) {
    for (base, len) in g.io_memory() {
        if !g.registered.contains(&base) {
            // SAFETY: the memory belongs to the group, which unregisters it before it is
            // freed (`reap_closed`); the service, and so the device, outlives every group.
            if unsafe { fs.register_memory(base, len) } {
                g.registered.push(base);
            }
        }
    }
}

fn file_info(i: dds_fs::FileInfo) -> FileInfo {
    FileInfo {
        id: i.id.raw(),
        path: i.path,
        size: i.size,
    }
}
