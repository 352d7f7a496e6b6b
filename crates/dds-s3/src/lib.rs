//! `dds s3`: the S3 REST API on the object cluster, as Ceph's RGW serves it on RADOS
//! (`docs/s3.md`).
//!
//! Buckets, objects, the bucket index and multipart uploads are objects and omap entries of one
//! pool of a `dds osd` cluster ([`record`] holds their formats); [`gateway::Gateway`]
//! implements the `S3` trait of the `s3s` crate on them.
//!
//! Why tokio and hyper here, not the project's `dds-server` runtime: the gateway's protocol is
//! HTTP/1.1 with S3's REST routing, XML bodies, `aws-chunked` payloads and SigV4 signatures,
//! which `s3s` implements and tests against the S3 SDKs; `s3s` is built on tokio and hyper.
//! Writing that stack again by hand on the project runtime would only give a second, less
//! tested copy of it. The gateway is a client of the cluster (like RGW of RADOS), not part of
//! its data path; the cluster's own servers stay on `dds-server`. The cluster client is
//! synchronous, so each cluster call runs on tokio's blocking pool.

pub mod gateway;
pub mod record;
pub mod sweep;

use std::net::SocketAddr;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

pub use gateway::Gateway;

/// What a gateway serves and whom it lets in.
pub struct Config {
    /// Pool of the cluster holding everything.
    pub pool: u64,
    /// The one access key accepted, and its secret (SigV4).
    pub access_key: String,
    pub secret_key: String,
    /// Threads of the tokio runtime (0: one per core).
    pub threads: usize,
    /// Request bodies gathered into stripes at once (each holds one stripe buffer).
    pub stripe_buffers: usize,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Orphaned stripes younger than this are left alone (`docs/s3.md`, "Orphaned stripes").
    pub orphan_grace: std::time::Duration,
    /// Time between two sweeps of orphaned stripes, the first at start (zero: no sweeps).
    pub sweep_interval: std::time::Duration,
}

/// Largest read buffer of a connection: a request's headers must fit, and a body is read in
/// blocks of at most this size (the HTTP layer takes a new block for a read while the previous
/// one's chunk is still being copied into a stripe buffer; blocks this size stay out of the
/// allocator's mmap range).
const READ_BUFFER: usize = 64 << 10;

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves S3 on `listener` until the process ends; `ready` is called with the address once
/// requests are accepted.
pub fn serve(
    client: dds_osd::client::Client,
    listener: std::net::TcpListener,
    cfg: Config,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    let workers = match cfg.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    rt.worker_threads(workers);
    // The runtime starts its workers first: they serve the connections (`s3-worker`); the
    // threads started later run the cluster calls (`s3-blocking`).
    let started = std::sync::atomic::AtomicUsize::new(0);
    rt.thread_name_fn(move || {
        match started.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < workers {
            true => "s3-worker".into(),
            false => "s3-blocking".into(),
        }
    });
    let rt = rt.enable_all().build()?;
    let gateway = Gateway::new(client, cfg.pool, cfg.stripe_buffers, cfg.orphan_grace);
    gateway.sweep_every(cfg.sweep_interval)?;
    let service = {
        let mut b = S3ServiceBuilder::new(gateway);
        b.set_auth(SimpleAuth::from_single(cfg.access_key, cfg.secret_key));
        b.build()
    };
    rt.block_on(async move {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        ready(listener.local_addr()?);
        let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        http.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(READ_BUFFER);
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(cfg.max_connections.max(1)));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return Ok(());
            };
            let sock = match listener.accept().await {
                Ok((sock, _)) => sock,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: keep serving.
                    tracing::warn!("s3 accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (http, service) = (http.clone(), service.clone());
            tokio::spawn(async move {
                if let Err(e) = http.serve_connection(TokioIo::new(sock), service).await {
                    tracing::debug!("s3 connection: {e}");
                }
                drop(slot);
            });
        }
    })
}
