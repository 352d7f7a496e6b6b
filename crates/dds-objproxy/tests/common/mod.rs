#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dds_objproxy::{HostOptions, HostProxy, HostProxyHandle, ProxyObjectStore, ProxyOptions};
use dds_objstore::{ObjStore, ObjectId, ObjectStore};

pub const DEVICE: u64 = 384 << 20;

pub fn store(dir: &Path, name: &str) -> Arc<ObjStore> {
    let p = dir.join(name);
    ObjStore::format(&p, DEVICE, false).unwrap();
    Arc::new(ObjStore::open(&p).unwrap())
}

pub struct Pair {
    pub host: HostProxyHandle,
    pub store: Arc<ObjStore>,
    pub sock: PathBuf,
}

pub fn serve(dir: &Path, name: &str) -> Pair {
    let store = store(dir, name);
    let sock = dir.join(format!("{name}.sock"));
    let host = HostProxy::serve(store.clone(), &sock, HostOptions::default()).unwrap();
    Pair { host, store, sock }
}

pub fn connect(p: &Pair, opts: ProxyOptions) -> ProxyObjectStore {
    ProxyObjectStore::connect(&p.sock, opts).unwrap()
}

/// Everything observable about pool `pool` of a store.
pub fn dump(s: &dyn ObjectStore, pool: u64) -> Vec<String> {
    let mut out = Vec::new();
    let names = s.list(pool, None, 100_000).unwrap();
    for n in names {
        let oid = ObjectId::new(pool, n.clone());
        let st = s.stat(&oid).unwrap();
        let data = s.read(&oid, 0, st.size).unwrap();
        assert_eq!(data.len() as u64, st.size);
        out.push(format!(
            "{:?} size={} crc={:08x} xattrs={:?} omap={:?}",
            String::from_utf8_lossy(&n),
            st.size,
            crc(&data),
            s.getxattrs(&oid).unwrap(),
            s.omap_list(&oid, None, 100_000).unwrap()
        ));
    }
    out
}

pub fn crc(b: &[u8]) -> u32 {
    // FNV-1a, enough to compare contents.
    let mut h: u32 = 0x811c9dc5;
    for &x in b {
        h ^= x as u32;
        h = h.wrapping_mul(0x01000193);
    }
    h
}

/// A DPU played by hand: the documented ATTACH handshake, then raw DMA writes and reads of
/// the session's region (its doorbells are kept, never rung).
pub struct RawDpu {
    pub sock: std::os::unix::net::UnixStream,
    pub layout: dds_objproxy::wire::Layout,
    pub eng: dds_dma::EmulatedDma,
    pub region: dds_dma::RegionId,
    pub bells: Vec<std::os::fd::OwnedFd>,
}

impl RawDpu {
    pub fn attach(p: &Pair, layout: dds_objproxy::wire::Layout) -> RawDpu {
        use dds_dma::DmaEngine;
        use dds_objproxy::wire;
        let mut s = std::os::unix::net::UnixStream::connect(&p.sock).unwrap();
        let mut args = Vec::new();
        wire::put_u32(&mut args, wire::VERSION);
        wire::put_u32(&mut args, layout.channels);
        wire::put_u32(&mut args, layout.max_dma);
        wire::send_frame(&s, wire::F_ATTACH, 9, &args, &[]).unwrap();
        let (status, id, _, mut fds) = wire::recv_frame(&mut s, wire::MAX_RESPONSE)
            .unwrap()
            .unwrap();
        assert_eq!((status, id), (0, 9));
        // The region and one doorbell per channel.
        assert_eq!(fds.len(), 1 + layout.channels as usize);
        let mut eng = dds_dma::EmulatedDma::new(16, None);
        let region = eng
            .register_region(dds_dma::RegionExport::memfd(
                fds.remove(0),
                layout.region_len(),
            ))
            .unwrap()
            .id;
        RawDpu {
            sock: s,
            layout,
            eng,
            region,
            bells: fds,
        }
    }

    /// Writes `bytes` at `off` of channel `chan`.
    pub fn write(&mut self, chan: u32, off: u64, bytes: &[u8]) {
        let buf = dds_dma::LocalBuf::new(bytes.len().max(8), 64);
        // SAFETY: `buf` is ours and not read or written by anyone else until the write ran.
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), bytes.len()) }
            .copy_from_slice(bytes);
        let op = dds_dma::DmaOp::write(
            self.region,
            self.layout.channel(chan) + off,
            buf.as_ptr(),
            bytes.len() as u32,
            1,
        );
        unsafe { dds_dma::run_sync(&mut self.eng, &[op]).unwrap() };
    }

    /// Reads `len` bytes at `off` of channel `chan`.
    pub fn read(&mut self, chan: u32, off: u64, len: usize) -> Vec<u8> {
        let r = dds_dma::LocalBuf::new(len, 64);
        let op = dds_dma::DmaOp::read(
            self.region,
            self.layout.channel(chan) + off,
            r.as_mut_ptr(),
            len as u32,
            2,
        );
        unsafe { dds_dma::run_sync(&mut self.eng, &[op]).unwrap() };
        r.as_slice()[..len].to_vec()
    }

    /// Writes a transfer (header, payload, trailer) into its request slot.
    pub fn send(&mut self, chan: u32, h: dds_objproxy::wire::TransferHeader, payload: &[u8]) {
        use dds_objproxy::wire;
        let end = 64 + wire::align8(payload.len() as u64) as usize;
        let mut b = vec![0u8; end + 8];
        h.encode(&mut b);
        b[64..64 + payload.len()].copy_from_slice(payload);
        b[end..end + 8].copy_from_slice(&h.seq.to_le_bytes());
        let slot = self.layout.req_slot(h.seq);
        self.write(chan, slot, &b);
    }

    /// The control line's (state, reason).
    pub fn state(&mut self, chan: u32) -> (u64, u64) {
        use dds_objproxy::wire;
        let l = self.read(chan, 0, 64);
        (wire::le64(&l[8..]), wire::le64(&l[16..]))
    }
}
