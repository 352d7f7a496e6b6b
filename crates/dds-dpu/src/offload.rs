//! The offload engine's wiring in the DPU daemon (§6): the cache table and its single writer
//! on the service thread, the file-read port between director threads and the file service,
//! and the traffic director itself.
//!
//! [`OffloadConfig`] names the application's offload app (resolved by the caller, e.g. through
//! a `dds_offload_api::Registry`) and the director's options; `Dpu::start_with` builds the
//! rest and the returned `DpuHandle` owns the director.

use std::io;
use std::sync::{Arc, Mutex};

use dds_cache::CacheReader;
use dds_director::{
    Director, DirectorConfig, DirectorHandle, DirectorStats, InlineDirector, StatsSource,
};
use dds_fs::{FileId, FileService, FsError};
use dds_offload_api::{OffloadApp, ReadOp};
use dds_offload_engine::{
    CacheMaintainer, ExposedFiles, FileReadPort, PortConfig, PortResult, PortService, ReadTarget,
    Refused,
};
use dds_proto::Status;

use crate::cpu::CpuMeter;

/// Offload settings of a DPU.
#[derive(Clone)]
pub struct OffloadConfig {
    /// The application's offload functions.
    pub app: Arc<dyn OffloadApp>,
    /// The traffic director; `None` runs the cache hooks only (host writes and the host
    /// library's CACHE / INVALIDATE batches maintain the table, nothing serves from it).
    pub director: Option<DirectorConfig>,
    /// Director threads the port has lanes for (at least the director's `threads`; more
    /// let [`DpuHandle::start_director`](crate::DpuHandle::start_director) attach others).
    pub lanes: usize,
    /// Offloaded reads outstanding per lane (at least the director's `context_ring_len`).
    pub depth: usize,
    /// Items the cache table holds.
    pub cache_items: usize,
    /// Invalidations queued per director thread at most.
    pub invalidations: usize,
    /// Runs the director on the file-service thread ([`dds_director::InlineDirector`])
    /// instead of `threads` threads of its own: with one DPU core, no wake-up or context
    /// switch between the two per batch of offloaded reads.
    pub director_inline: bool,
}

impl std::fmt::Debug for OffloadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadConfig")
            .field("app", &self.app.name())
            .field("director", &self.director)
            .field("cache_items", &self.cache_items)
            .finish()
    }
}

impl OffloadConfig {
    /// `app` with the director's defaults for these addresses, or no director.
    pub fn new(app: Arc<dyn OffloadApp>, director: Option<DirectorConfig>) -> Self {
        OffloadConfig {
            app,
            director,
            lanes: 1,
            depth: 256,
            cache_items: 1 << 20,
            invalidations: 16384,
            director_inline: false,
        }
    }
}

/// The offload engine's hooks on the service thread: the single cache-table writer with the
/// application's cache-on-write / invalidate-on-read functions, and the service side of the
/// port through which the director's threads submit offloaded reads.
pub(crate) struct OffloadHooks {
    pub maintainer: CacheMaintainer,
    pub port: PortService,
    pub exposed: Arc<ExposedFiles>,
    /// Counters of the running directors (for `dds stats`).
    pub directors: Directors,
    /// Where the director started with the DPU connects host legs (`SetHostApp`).
    pub host_app: Option<Arc<dds_director::HostApp>>,
    /// DPU CPU per offloaded request, a window per `dds stats`.
    pub cpu: CpuMeter,
    /// The director the service thread drives, when it runs inline.
    pub inline: Option<InlineDirector>,
}

/// The counter sources of the directors attached to this DPU.
pub(crate) type Directors = Arc<Mutex<Vec<StatsSource>>>;

impl OffloadHooks {
    /// The offload engine's part of `dds stats`.
    pub fn stats(&mut self) -> serde_json::Value {
        let cache = self.maintainer.writer_mut().stats();
        let capacity = self.maintainer.writer_mut().capacity();
        let directors: Vec<DirectorStats> = self
            .directors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(StatsSource::stats)
            .collect();
        let cpu = self.cpu.window(
            directors.iter().map(|d| d.offloaded).sum(),
            self.inline.is_some(),
        );
        serde_json::json!({
            "app": self.maintainer.app_name(),
            "cache": cache,
            "cache_capacity": capacity,
            "cache_writer": self.maintainer.stats(),
            "directors": directors,
            "cpu": cpu,
        })
    }
}

/// What a running DPU keeps of its offload engine.
pub(crate) struct OffloadRuntime {
    pub app: Arc<dyn OffloadApp>,
    pub cache: CacheReader,
    pub exposed: Arc<ExposedFiles>,
    pub port: Arc<FileReadPort>,
    pub director: Option<DirectorHandle>,
    pub directors: Directors,
}

impl OffloadRuntime {
    /// Starts a director on free lanes of the port.
    pub fn start_director(&self, d: DirectorConfig) -> io::Result<DirectorHandle> {
        self.start(d, |d, app, cache, exposed, port| {
            Director::start(d, app, cache, exposed, port).map(|h| (h, None))
        })
        .map(|(h, _)| h)
    }

    /// Starts a director on a free lane of the port, for the service thread to drive.
    fn start_inline_director(
        &self,
        d: DirectorConfig,
    ) -> io::Result<(DirectorHandle, Option<InlineDirector>)> {
        self.start(d, |d, app, cache, exposed, port| {
            Director::start_inline(d, app, cache, exposed, port).map(|(h, i)| (h, Some(i)))
        })
    }

    fn start(
        &self,
        d: DirectorConfig,
        how: impl FnOnce(
            DirectorConfig,
            Arc<dyn OffloadApp>,
            CacheReader,
            Arc<ExposedFiles>,
            Arc<FileReadPort>,
        ) -> io::Result<(DirectorHandle, Option<InlineDirector>)>,
    ) -> io::Result<(DirectorHandle, Option<InlineDirector>)> {
        let listen = d.listen;
        let d = DirectorConfig {
            max_contexts_per_conn: d.max_contexts_per_conn.clamp(1, self.port.depth()),
            ..d
        };
        let (handle, inline) = how(
            d,
            self.app.clone(),
            self.cache.clone(),
            self.exposed.clone(),
            self.port.clone(),
        )
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("start the traffic director on {listen}: {e}"),
            )
        })?;
        let mut list = self.directors.lock().unwrap_or_else(|p| p.into_inner());
        // A stopped director's counters go with it.
        list.retain(StatsSource::running);
        list.push(handle.stats_source());
        drop(list);
        Ok((handle, inline))
    }
}

/// Builds the cache table, the port and the director of `cfg`.
pub(crate) fn build(cfg: OffloadConfig) -> io::Result<(OffloadHooks, OffloadRuntime)> {
    let lanes = cfg
        .lanes
        .max(cfg.director.as_ref().map_or(1, |d| d.threads.max(1)));
    let depth = cfg.depth.max(
        cfg.director
            .as_ref()
            .map_or(1, |d| d.context_ring_len.max(1)),
    );
    let port = FileReadPort::new(PortConfig {
        lanes,
        depth,
        invalidations: cfg.invalidations.max(1),
    });
    let writer = dds_cache::CacheWriter::new(dds_cache::Config::for_items(cfg.cache_items))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("cache table: {e}")))?;
    let exposed = Arc::new(ExposedFiles::new());
    let maintainer = CacheMaintainer::new(writer, cfg.app.clone(), port.clone(), exposed.clone());
    let port_service = port
        .service()
        .ok_or_else(|| io::Error::other("the port's service side is taken"))?;
    let cpu = CpuMeter::new(cfg.app.offloaded_request());
    let mut runtime = OffloadRuntime {
        app: cfg.app,
        cache: maintainer.reader(),
        exposed: exposed.clone(),
        port,
        director: None,
        directors: Directors::default(),
    };
    let host_app = cfg.director.as_ref().map(|d| d.host.clone());
    let mut inline = None;
    if let Some(d) = cfg.director {
        let (handle, i) = if cfg.director_inline {
            runtime.start_inline_director(d)?
        } else {
            (runtime.start_director(d)?, None)
        };
        runtime.director = Some(handle);
        inline = i;
    }
    Ok((
        OffloadHooks {
            maintainer,
            port: port_service,
            exposed,
            directors: runtime.directors.clone(),
            host_app,
            cpu,
            inline,
        },
        runtime,
    ))
}

/// The file service as the port's read target.
pub(crate) struct FsReads<'a>(pub &'a mut FileService);

impl ReadTarget for FsReads<'_> {
    unsafe fn submit_read(
        &mut self,
        op: ReadOp,
        dst: *mut u8,
        user_data: u64,
    ) -> Result<(), Refused> {
        // SAFETY: forwarded from the caller (`dst` valid for `op.size` bytes until the
        // completion).
        unsafe {
            self.0
                .submit_read(FileId(op.file_id), op.offset, dst, op.size, user_data)
        }
        .map_err(|e| Refused::status(Status::from(&e)))
    }
}

/// A file-service completion as the port reports it.
pub(crate) fn port_result(r: &Result<u32, FsError>) -> PortResult {
    match r {
        Ok(n) => Ok(*n),
        Err(e) => Err(Status::from(e).code()),
    }
}
