//! The application halves of the offload apps (the DPU runs them through the offload API,
//! `dds-offload-api`): how each application's requests are framed, which of them the DPU may
//! serve, and how cache-on-write learns where objects are. The `dds` binary names them, with
//! the other services' offload apps, for `dds dpu --offload NAME`.

pub mod kv;
pub mod pagestore;

pub use kv::KvApp;
pub use pagestore::{PagestoreApp, PagestoreConfig};
