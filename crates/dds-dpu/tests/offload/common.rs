//! Test harness of the offload tests: the real DPU (`dds_dpu::Dpu`: control socket, service
//! thread, file service on a memory device, the offload engine's cache hooks and port) and the
//! real host library (`dds_host::Dds`) for the host applications' file I/O. Directors are
//! attached to the running DPU with `DpuHandle::start_director`. Plus two small host
//! applications: a pagestore server and a log-structured KV server, both real TCP servers
//! doing their file I/O through DDS.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use dds_apps::offload::kv::*;
use dds_apps::offload::pagestore::{self as ps, OP_READ, OP_WRITE};
use dds_cache::CacheReader;
use dds_director::{DirectorConfig, DirectorHandle};
use dds_dpu::{DpuConfig, DpuHandle, OffloadConfig};
use dds_host::Dds;
use dds_offload_api::OffloadApp;
use dds_proto::Status;

pub fn init_tracing() {
    // Logs are not needed; tracing without a subscriber is a no-op.
}

/// KV host state: log tail and index key -> (value offset, length).
pub type KvIndex = (u64, HashMap<u64, (u64, u32)>);

/// The DPU with its offload engine (no director yet) and the cache table's read side.
pub struct Dpu {
    pub handle: DpuHandle,
    pub reader: CacheReader,
    dds: Arc<Dds>,
}

impl Dpu {
    /// A DPU on a 128 MiB memory device whose port has `lanes` director lanes.
    pub fn start(app: Arc<dyn OffloadApp>, lanes: usize) -> Dpu {
        Dpu::start_with(app, lanes, None)
    }

    /// As [`start`](Self::start), on a memory device that reports each operation `latency`
    /// after the one before (`MemDevice::with_latency`): the reads of one message complete one
    /// by one, as from a disk.
    pub fn start_slow(app: Arc<dyn OffloadApp>, lanes: usize, latency: Duration) -> Dpu {
        Dpu::start_with(app, lanes, Some(latency))
    }

    /// A DPU whose director (listening on a loopback port, forwarding to the host
    /// application once it announces itself on the returned `HostApp`) runs on the file-service
    /// thread, as `dds dpu` runs it by default.
    pub fn start_inline(app: Arc<dyn OffloadApp>) -> (Dpu, Arc<dds_director::HostApp>) {
        let cfg = DirectorConfig::announced(loopback());
        let host = cfg.host.clone();
        let offload = OffloadConfig {
            director_inline: true,
            cache_items: 1 << 16,
            ..OffloadConfig::new(app, Some(cfg))
        };
        (Dpu::start_offload(offload, None), host)
    }

    fn start_with(app: Arc<dyn OffloadApp>, lanes: usize, latency: Option<Duration>) -> Dpu {
        let offload = OffloadConfig {
            lanes,
            cache_items: 1 << 16,
            ..OffloadConfig::new(app, None)
        };
        Dpu::start_offload(offload, latency)
    }

    fn start_offload(offload: OffloadConfig, latency: Option<Duration>) -> Dpu {
        let config = DpuConfig {
            socket: dds_dpu::temp_socket_path("offload"),
            ..DpuConfig::default()
        };
        let handle = dds_dpu::Dpu::start_with(
            config,
            move || match latency {
                None => dds_dpu::memory_file_service(128 << 20),
                Some(latency) => {
                    let mut dev = dds_fs::MemDevice::new(128 << 20, 512).with_latency(latency);
                    let cfg = dds_fs::FormatConfig {
                        segment_size: 1 << 20,
                        ..dds_fs::FormatConfig::default()
                    };
                    dds_fs::format(&mut dev, cfg)?;
                    dds_fs::FileService::open(Box::new(dev), dds_fs::OpenConfig::default())
                }
            },
            Some(offload),
        )
        .expect("DPU starts");
        let reader = handle.offload_cache().expect("offload configured").clone();
        let dds = Arc::new(Dds::connect(handle.socket()).expect("host library connects"));
        Dpu {
            handle,
            reader,
            dds,
        }
    }

    /// The host library's connection, for host applications that take one.
    pub fn dds(&self) -> Arc<Dds> {
        self.dds.clone()
    }

    /// The host application's file access (through the host library).
    pub fn files(&self) -> HostFiles {
        HostFiles {
            dds: self.dds.clone(),
        }
    }
}

/// The host application's file access: the real host library, blocking calls.
#[derive(Clone)]
pub struct HostFiles {
    dds: Arc<Dds>,
}

impl HostFiles {
    /// Creates a file and exposes it to the offload engine, as the host application does for
    /// the files it serves.
    pub fn create(&self, path: &str) -> u32 {
        let id = self.dds.create_file(path).expect("create file").id;
        assert!(
            self.dds.expose_file(id, true).expect("expose"),
            "offload engine"
        );
        id
    }

    /// Creates a file the application keeps private (not exposed).
    pub fn create_private(&self, path: &str) -> u32 {
        self.dds.create_file(path).expect("create file").id
    }
    pub fn write(&self, file: u32, off: u64, data: Vec<u8>) -> Result<u32, u16> {
        self.dds
            .write_sync(file, off, &data)
            .map(|n| n as u32)
            .map_err(|e| e.status.code())
    }
    pub fn read(&self, file: u32, off: u64, len: u32) -> Result<Vec<u8>, u16> {
        let mut buf = vec![0u8; len as usize];
        let n = self
            .dds
            .read_sync(file, off, &mut buf)
            .map_err(|e| e.status.code())?;
        buf.truncate(n);
        Ok(buf)
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
                            kv_encode_response(
                                &mut hdr,
                                Status::NotFound.code(),
                                KV_GET,
                                r.req_id,
                                0,
                            );
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

/// Attaches a director (listening on a loopback port) to `dpu`, forwarding to `host`. The
/// app is the DPU's own (`_app` names it for the reader of the test).
pub fn director(
    dpu: &Dpu,
    _app: Arc<dyn OffloadApp>,
    host: SocketAddr,
    tweak: impl FnOnce(&mut DirectorConfig),
) -> DirectorHandle {
    let mut cfg = DirectorConfig::new(loopback(), host);
    tweak(&mut cfg);
    dpu.handle.start_director(cfg).expect("director starts")
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
