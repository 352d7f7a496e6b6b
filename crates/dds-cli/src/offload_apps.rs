//! The offload apps `dds dpu --offload NAME` runs, by name: assembled here, where the
//! applications are assembled, from the crates that define them (`dds-apps`: `pagestore`,
//! `kv`; `dds-kv`: `redis`; `dds-pageserver`: `pageserver`; `dds-nbd`: `nbd`).

use std::sync::Arc;

use dds_apps::offload::{KvApp, PagestoreApp, PagestoreConfig};
use dds_offload_api::{AppOptions, Registry};

/// The built-in offload apps, by name.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(
        "pagestore",
        "pagestore protocol (dds app pagestore): READs served on the DPU",
        |o: &AppOptions| {
            Arc::new(PagestoreApp::new(PagestoreConfig {
                require_cached: !o.uncached,
                ..PagestoreConfig::default()
            }))
        },
    );
    r.register(
        "redis",
        "Redis protocol of `dds kv`: GETs of records on storage served on the DPU",
        |o: &AppOptions| {
            let max = o
                .max_message
                .unwrap_or(dds_kv::offload::DEFAULT_MAX_MESSAGE);
            let app = dds_kv::offload::RedisApp::new(max);
            Arc::new(match o.max_response {
                Some(r) => app.with_max_response(r),
                None => app,
            })
        },
    );
    r.register(
        "pageserver",
        "GetPage@LSN of `dds pageserver`: page versions on storage served on the DPU",
        |_| Arc::new(dds_pageserver::offload::PageServerApp),
    );
    r.register(
        "nbd",
        "NBD protocol of `dds nbd`: READs of ranges no write is changing served on the DPU",
        |_| Arc::new(dds_nbd::NbdApp::new()),
    );
    r.register(
        "kv",
        "log-structured key-value protocol: GETs of cached keys served on the DPU",
        |_| Arc::new(KvApp),
    );
    r
}
