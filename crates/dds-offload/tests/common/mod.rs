//! Test harness: a DPU service thread that owns a real `dds_fs::FileService` on a `MemDevice`
//! and serves (a) the director's offloaded reads through the `FileReadPort` and (b) the host
//! application's file I/O through a channel (standing in for the host library's rings), with
//! the cache hooks called where the DPU daemon calls them. Plus two small host applications:
//! a pagestore server and a log-structured KV server, both real TCP servers doing their file
//! I/O through DDS.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use crossbeam_utils::sync::{Parker, Unparker};
use dds_cache::{CacheReader, CacheWriter, Config};
use dds_fs::{format, FileId, FileService, FormatConfig, MemDevice, OpenConfig};
use dds_offload::api::status;
use dds_offload::kv::*;
use dds_offload::pagestore::{self as ps, OP_READ, OP_WRITE};
use dds_offload::{
    CacheMaintainer, Director, DirectorConfig, DirectorHandle, FileReadPort, OffloadApp, PortConfig,
};

const HOST_TAG: u64 = 1 << 62;

pub fn init_tracing() {
    // Logs are not needed; tracing without a subscriber is a no-op.
}

enum HostOp {
    Create(String, Sender<Result<u32, u16>>),
    Write(u32, u64, Vec<u8>, Sender<Result<u32, u16>>),
    Read(u32, u64, u32, Sender<Result<Vec<u8>, u16>>),
}

type WriteReply = Sender<Result<u32, u16>>;
type ReadReply = Sender<Result<Vec<u8>, u16>>;
/// KV host state: log tail and index key -> (value offset, length).
pub type KvIndex = (u64, HashMap<u64, (u64, u32)>);

struct Pending {
    write: Option<(u32, u64, Vec<u8>, u64, WriteReply)>,
    read: Option<(Vec<u8>, ReadReply)>,
}

/// The emulated DPU: file service thread, cache, port.
pub struct Dpu {
    pub port: Arc<FileReadPort>,
    pub reader: CacheReader,
    tx: Sender<HostOp>,
    unparker: Unparker,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Dpu {
    pub fn start(app: Arc<dyn OffloadApp>, lanes: usize) -> Dpu {
        let mut dev = MemDevice::new(128 << 20, 512);
        format(
            &mut dev,
            FormatConfig {
                segment_size: 1 << 20,
                ..FormatConfig::default()
            },
        )
        .unwrap();
        let fs = FileService::open(Box::new(dev), OpenConfig::default()).unwrap();
        let port = FileReadPort::new(PortConfig {
            lanes,
            depth: 256,
            invalidations: 16384,
        });
        let writer = CacheWriter::new(Config::for_items(1 << 16)).unwrap();
        let maint = CacheMaintainer::new(writer, app, port.clone());
        let reader = maint.reader();
        let (tx, rx) = bounded(1024);
        let parker = Parker::new();
        let unparker = parker.unparker().clone();
        let u2 = unparker.clone();
        port.set_service_waker(move || u2.unpark());
        let stop = Arc::new(AtomicBool::new(false));
        let svc = port.service().unwrap();
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || service_loop(fs, maint, svc, rx, parker, s2));
        Dpu {
            port,
            reader,
            tx,
            unparker,
            stop,
            thread: Some(thread),
        }
    }

    pub fn files(&self) -> HostFiles {
        HostFiles {
            tx: self.tx.clone(),
            unparker: self.unparker.clone(),
        }
    }
}

impl Drop for Dpu {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.unparker.unpark();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn service_loop(
    mut fs: FileService,
    mut maint: CacheMaintainer,
    mut svc: dds_offload::PortService,
    rx: Receiver<HostOp>,
    parker: Parker,
    stop: Arc<AtomicBool>,
) {
    let mut slab: Vec<Option<Pending>> = (0..256).map(|_| None).collect();
    let mut free: Vec<usize> = (0..256).rev().collect();
    loop {
        if stop.load(Ordering::SeqCst) && fs.inflight() == 0 {
            return;
        }
        let mut worked = false;
        while !free.is_empty() {
            let Ok(op) = rx.try_recv() else { break };
            worked = true;
            match op {
                HostOp::Create(path, reply) => {
                    let r = fs
                        .create_file(&path)
                        .map(|id| id.raw())
                        .map_err(|e| status::of_fs_error(&e));
                    let _ = reply.send(r);
                }
                HostOp::Write(file, off, data, reply) => {
                    let version = maint.next_version();
                    let i = free.pop().unwrap();
                    let ptr = data.as_ptr();
                    let len = data.len() as u32;
                    slab[i] = Some(Pending {
                        write: Some((file, off, data, version, reply)),
                        read: None,
                    });
                    // SAFETY: the data lives in the slab until the completion.
                    if let Err(e) =
                        unsafe { fs.submit_write(FileId(file), off, ptr, len, HOST_TAG | i as u64) }
                    {
                        let p = slab[i].take().unwrap();
                        let _ = p.write.unwrap().4.send(Err(status::of_fs_error(&e)));
                        free.push(i);
                    }
                }
                HostOp::Read(file, off, len, reply) => {
                    maint.host_read(file, off, len);
                    let i = free.pop().unwrap();
                    let mut buf = vec![0u8; len as usize];
                    let ptr = buf.as_mut_ptr();
                    slab[i] = Some(Pending {
                        write: None,
                        read: Some((buf, reply)),
                    });
                    // SAFETY: the buffer lives in the slab until the completion.
                    if let Err(e) =
                        unsafe { fs.submit_read(FileId(file), off, ptr, len, HOST_TAG | i as u64) }
                    {
                        let p = slab[i].take().unwrap();
                        let _ = p.read.unwrap().1.send(Err(status::of_fs_error(&e)));
                        free.push(i);
                    }
                }
            }
        }
        worked |= svc.submit_to_fs(&mut fs, 64) > 0;
        worked |= fs.poll(|ud, res| {
            if svc.on_fs_completion(ud, &res) {
                return;
            }
            let i = (ud & !HOST_TAG) as usize;
            let p = slab[i].take().expect("pending host op");
            free.push(i);
            if let Some((file, off, data, version, reply)) = p.write {
                match res {
                    Ok(n) => {
                        // Cache-on-write at completion, before the host sees the result.
                        maint.write_completed(file, off, &data, version);
                        let _ = reply.send(Ok(n));
                    }
                    Err(e) => {
                        maint.write_failed(file, off, &data, version);
                        let _ = reply.send(Err(status::of_fs_error(&e)));
                    }
                }
            } else if let Some((mut buf, reply)) = p.read {
                let _ = reply.send(res.map_err(|e| status::of_fs_error(&e)).map(|n| {
                    buf.truncate(n as usize);
                    buf
                }));
            }
        }) > 0;
        worked |= maint.apply_port_invalidations(&mut svc) > 0;
        if !worked {
            if fs.inflight() > 0 {
                std::thread::yield_now();
            } else if svc.prepare_sleep() {
                if rx.is_empty() {
                    parker.park_timeout(Duration::from_millis(2));
                }
                svc.end_sleep();
            }
        }
    }
}

/// The host application's file access (through the emulated DPU).
#[derive(Clone)]
pub struct HostFiles {
    tx: Sender<HostOp>,
    unparker: Unparker,
}

impl HostFiles {
    pub fn create(&self, path: &str) -> u32 {
        let (t, r) = bounded(1);
        self.tx.send(HostOp::Create(path.into(), t)).unwrap();
        self.unparker.unpark();
        r.recv().unwrap().expect("create file")
    }
    pub fn write(&self, file: u32, off: u64, data: Vec<u8>) -> Result<u32, u16> {
        let (t, r) = bounded(1);
        self.tx.send(HostOp::Write(file, off, data, t)).unwrap();
        self.unparker.unpark();
        r.recv().unwrap()
    }
    pub fn read(&self, file: u32, off: u64, len: u32) -> Result<Vec<u8>, u16> {
        let (t, r) = bounded(1);
        self.tx.send(HostOp::Read(file, off, len, t)).unwrap();
        self.unparker.unpark();
        r.recv().unwrap()
    }
}

/// A small TCP server: one thread per connection; `kill` closes everything.
pub struct HostServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl HostServer {
    fn start(
        addr: SocketAddr,
        handler: Arc<dyn Fn(TcpStream) -> io::Result<()> + Send + Sync>,
    ) -> HostServer {
        let listener = TcpListener::bind(addr).unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (s2, c2) = (stop.clone(), conns.clone());
        let accept = std::thread::spawn(move || {
            while !s2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_nodelay(true).unwrap();
                        c2.lock().unwrap().push(s.try_clone().unwrap());
                        let h = handler.clone();
                        std::thread::spawn(move || {
                            let s2 = s.try_clone().unwrap();
                            let _ = h(s);
                            let _ = s2.shutdown(Shutdown::Both);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        HostServer {
            addr,
            stop,
            conns,
            accept: Some(accept),
        }
    }

    /// The host application dies: listener and every connection closed.
    pub fn kill(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    let n = u32::from_le_bytes(len) as usize;
    if !(8..=(16 << 20)).contains(&n) {
        return Err(io::Error::other("bad message length"));
    }
    buf.clear();
    buf.extend_from_slice(&len);
    buf.resize(n, 0);
    s.read_exact(&mut buf[4..])?;
    Ok(true)
}

/// The pagestore server of the host: executes each request in order through DDS.
pub fn pagestore_server(addr: SocketAddr, files: HostFiles) -> HostServer {
    let handler = Arc::new(move |mut s: TcpStream| -> io::Result<()> {
        let mut msg = Vec::new();
        let mut out = Vec::new();
        while read_message(&mut s, &mut msg)? {
            out.clear();
            let mut reqs = Vec::new();
            ps::for_each_request(&msg, |_, at, r| {
                reqs.push((at, *r));
                Ok(())
            })
            .map_err(|e| io::Error::other(e.to_string()))?;
            for (at, r) in reqs {
                let mut hdr = [0u8; 24];
                match r.op {
                    OP_READ => match files.read(r.file_id, r.offset, r.len) {
                        Ok(data) => {
                            ps::encode_response_header(
                                &mut hdr,
                                0,
                                OP_READ,
                                r.req_id,
                                data.len() as u32,
                            );
                            out.extend_from_slice(&hdr);
                            out.extend_from_slice(&data);
                            out.resize(out.len().next_multiple_of(8), 0);
                        }
                        Err(st) => {
                            ps::encode_response_header(&mut hdr, st, OP_READ, r.req_id, 0);
                            out.extend_from_slice(&hdr);
                        }
                    },
                    _ => {
                        let data = msg[at + 32..at + 32 + r.len as usize].to_vec();
                        let (st, n) = match files.write(r.file_id, r.offset, data) {
                            Ok(n) => (0, n),
                            Err(st) => (st, 0),
                        };
                        ps::encode_response_header(&mut hdr, st, OP_WRITE, r.req_id, n);
                        out.extend_from_slice(&hdr);
                    }
                }
            }
            s.write_all(&out)?;
        }
        Ok(())
    });
    HostServer::start(addr, handler)
}

/// The KV server of the host: an in-memory index over a log file written through DDS.
pub struct KvState {
    pub files: HostFiles,
    pub log: u32,
    pub inner: Mutex<KvIndex>,
}

pub fn kv_server(addr: SocketAddr, state: Arc<KvState>) -> HostServer {
    let handler = Arc::new(move |mut s: TcpStream| -> io::Result<()> {
        let mut msg = Vec::new();
        let mut out = Vec::new();
        while read_message(&mut s, &mut msg)? {
            out.clear();
            let mut reqs = Vec::new();
            kv_for_each(&msg, |_, at, r| {
                reqs.push((at, *r));
                Ok(())
            })
            .map_err(|e| io::Error::other(e.to_string()))?;
            for (at, r) in reqs {
                let mut hdr = [0u8; 24];
                if r.op == KV_PUT {
                    let value = &msg[at + KV_REQ_HEADER..at + KV_REQ_HEADER + r.vlen as usize];
                    let mut rec = Vec::new();
                    kv_encode_record(&mut rec, r.key, value);
                    // Appends are serialized (one log tail); the index is updated after the
                    // write completed, before the PUT is acknowledged.
                    let mut g = state.inner.lock().unwrap();
                    let off = g.0;
                    g.0 += rec.len() as u64;
                    let st = match state.files.write(state.log, off, rec) {
                        Ok(_) => {
                            g.1.insert(r.key, (off + KV_RECORD_HEADER as u64, r.vlen));
                            0
                        }
                        Err(st) => st,
                    };
                    drop(g);
                    kv_encode_response(&mut hdr, st, KV_PUT, r.req_id, 0);
                    out.extend_from_slice(&hdr);
                } else {
                    let loc = state.inner.lock().unwrap().1.get(&r.key).copied();
                    match loc {
                        None => {
                            kv_encode_response(&mut hdr, status::NOT_FOUND, KV_GET, r.req_id, 0);
                            out.extend_from_slice(&hdr);
                        }
                        Some((off, len)) => match state.files.read(state.log, off, len) {
                            Ok(v) => {
                                kv_encode_response(&mut hdr, 0, KV_GET, r.req_id, v.len() as u32);
                                out.extend_from_slice(&hdr);
                                out.extend_from_slice(&v);
                                out.resize(out.len().next_multiple_of(8), 0);
                            }
                            Err(st) => {
                                kv_encode_response(&mut hdr, st, KV_GET, r.req_id, 0);
                                out.extend_from_slice(&hdr);
                            }
                        },
                    }
                }
            }
            s.write_all(&out)?;
        }
        Ok(())
    });
    HostServer::start(addr, handler)
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub fn director(
    dpu: &Dpu,
    app: Arc<dyn OffloadApp>,
    host: SocketAddr,
    tweak: impl FnOnce(&mut DirectorConfig),
) -> DirectorHandle {
    let mut cfg = DirectorConfig::new(loopback(), host);
    tweak(&mut cfg);
    Director::start(cfg, app, dpu.reader.clone(), dpu.port.clone()).expect("director starts")
}

/// Reads one response (header + data) from a stream.
pub fn read_response(s: &mut TcpStream) -> io::Result<(ps::ResponseHeader, Vec<u8>)> {
    let mut h = [0u8; 24];
    s.read_exact(&mut h)?;
    let hdr = ps::parse_response_header(&h).map_err(|e| io::Error::other(e.to_string()))?;
    let mut body = vec![0u8; hdr.resp_len as usize - 24];
    s.read_exact(&mut body)?;
    Ok((hdr, body))
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Deterministic page contents.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// True when the peer closed or reset the connection (reads EOF or an error).
pub fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}
