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
