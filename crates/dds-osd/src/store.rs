//! The OSD's object store, built from a [`StoreSpec`]: the front end sees only
//! `Arc<dyn ObjectStore>`, whether the store is in this process (placement host) or behind a
//! proxy on the host while the front end runs on the DPU (placement dpu). A placement-dpu front
//! end reattaches by itself to its host process when that restarts ([`Reattaching`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use dds_objproxy::{ProxyObjectStore, ProxyOptions};
use dds_objstore::{
    KvPairs, ObjStat, ObjStore, ObjectId, ObjectStore, StoreError, StoreStats, Transaction,
};

/// Where the object store is.
#[derive(Clone)]
pub enum StoreSpec {
    /// An `ObjStore` on a device file in this process; `format` = (size, force) formats it
    /// first.
    Local {
        device: PathBuf,
        format: Option<(u64, bool)>,
    },
    /// A host store reached through the DPU-side proxy (`dds-objproxy`) at `socket`.
    Proxy {
        socket: PathBuf,
        options: ProxyOptions,
    },
}

impl std::fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Local { device, format } => f
                .debug_struct("Local")
                .field("device", device)
                .field("format", format)
                .finish(),
            StoreSpec::Proxy { socket, options } => f
                .debug_struct("Proxy")
                .field("socket", socket)
                .field("max_dma", &options.max_dma)
                .field("batching", &options.batching)
                .field("chunking", &options.chunking)
                .finish(),
        }
    }
}

/// Why no store could be built.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("object store {device}: {source}")]
    Store {
        device: String,
        #[source]
        source: StoreError,
    },
    #[error("placement dpu: the host's object store proxy at {socket}: {source}")]
    Proxy {
        socket: String,
        #[source]
        source: StoreError,
    },
}

/// Opens (and formats, if asked) the store of `spec`.
pub fn open_store(spec: &StoreSpec) -> Result<Arc<dyn ObjectStore>, OpenError> {
    match spec {
        StoreSpec::Local { device, format } => {
            let err = |source| OpenError::Store {
                device: device.display().to_string(),
                source,
            };
            if let Some((size, force)) = format {
                ObjStore::format(device, *size, *force).map_err(err)?;
            }
            Ok(Arc::new(ObjStore::open(device).map_err(err)?))
        }
        StoreSpec::Proxy { socket, options } => {
            let store = ProxyObjectStore::connect(socket, options.clone()).map_err(|source| {
                OpenError::Proxy {
                    socket: socket.display().to_string(),
                    source,
                }
            })?;
            Ok(Arc::new(Reattaching {
                socket: socket.clone(),
                options: options.clone(),
                current: RwLock::new(Some(Arc::new(store))),
                last_attempt: Mutex::new(None),
            }))
        }
    }
}

/// Attempts to reattach at most this often while the host process is away.
const REATTACH_EVERY: Duration = Duration::from_millis(100);

/// The store of a placement-dpu front end: the proxy session of the moment. When the host
/// process goes away (its control connection closes), the session is dropped and the next
/// operation attaches again (a new session with the restarted `dds osd-store`); until then
/// operations fail with the proxy's error. A failed transaction may or may not have been
/// applied (as with any store that fails mid-commit): the OSD re-peers the PG before it takes
/// writes again. Reads that failed because the host went away are tried once more on the new
/// session.
struct Reattaching {
    socket: PathBuf,
    options: ProxyOptions,
    current: RwLock<Option<Arc<ProxyObjectStore>>>,
    last_attempt: Mutex<Option<Instant>>,
}

impl Reattaching {
    /// The current session, or a new one if the host process went away.
    fn session(&self) -> Result<Arc<ProxyObjectStore>, StoreError> {
        if let Some(s) = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            return Ok(s.clone());
        }
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = cur.as_ref() {
            return Ok(s.clone());
        }
        let mut last = self.last_attempt.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < REATTACH_EVERY) {
            return Err(dds_objproxy::wire::proxy_error(format!(
                "the host's object store at {} is away; reattaching",
                self.socket.display()
            )));
        }
        *last = Some(Instant::now());
        let s = Arc::new(ProxyObjectStore::connect(
            &self.socket,
            self.options.clone(),
        )?);
        tracing::info!(socket = %self.socket.display(), "reattached to the host's object store");
        *cur = Some(s.clone());
        Ok(s)
    }

    /// Runs `f` on the session; after a failure that found the host gone, the session is
    /// dropped and, when `again`, `f` runs once more on a new one.
    fn with<T>(
        &self,
        again: bool,
        f: impl Fn(&ProxyObjectStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let s = self.session()?;
        let r = f(&s);
        if r.is_err() && s.is_gone() {
            tracing::warn!(socket = %self.socket.display(), "the host's object store went away");
            let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
            if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, &s)) {
                *cur = None;
            }
            drop(cur);
            if again {
                return f(&*self.session()?);
            }
        }
        r
    }
}

impl ObjectStore for Reattaching {
    fn submit(&self, tx: &Transaction) -> Result<(), StoreError> {
        self.with(false, |s| s.submit(tx))
    }
    fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.with(true, |s| s.read(oid, offset, len))
    }
    fn stat(&self, oid: &ObjectId) -> Result<ObjStat, StoreError> {
        self.with(true, |s| s.stat(oid))
    }
    fn getxattr(&self, oid: &ObjectId, name: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.with(true, |s| s.getxattr(oid, name))
    }
    fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, StoreError> {
        self.with(true, |s| s.getxattrs(oid))
    }
    fn omap_get(
        &self,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.with(true, |s| s.omap_get(oid, keys))
    }
    fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError> {
        self.with(true, |s| s.omap_list(oid, start_after, max))
    }
    fn list(
        &self,
        pool: u64,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.with(true, |s| s.list(pool, start_after, max))
    }
    fn statfs(&self) -> Result<StoreStats, StoreError> {
        self.with(true, |s| s.statfs())
    }
}
