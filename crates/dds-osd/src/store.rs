//! The OSD's object store, built from a [`StoreSpec`]: the front end sees only
//! `Arc<dyn ObjectStore>`, whether the store is in this process (placement host) or behind a
//! proxy on the host while the front end runs on the DPU (placement dpu).

use std::path::PathBuf;
use std::sync::Arc;

use dds_objproxy::{ProxyObjectStore, ProxyOptions};
use dds_objstore::{ObjStore, ObjectStore, StoreError};

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
            Ok(Arc::new(store))
        }
    }
}
