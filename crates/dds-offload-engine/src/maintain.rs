//! The cache writer's hooks on the file service thread: cache-on-write, invalidate-on-read,
//! the director's invalidations and the host's explicit CACHE / INVALIDATE batches.

use std::sync::Arc;

use dds_cache::{CacheItem, CacheReader, CacheWriter, InsertError};

use crate::port::{FileReadPort, PortService};
use crate::records::{decode_cache_items, decode_invalidate_items, OP_CACHE, OP_INVALIDATE};
use crate::ExposedFiles;
use dds_offload_api::{ItemList, KeyList, Malformed, OffloadApp};

/// Counters of the cache maintainer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MaintainerStats {
    /// Items inserted (or replaced) by cache-on-write and CACHE records.
    pub cached: u64,
    /// Inserts that were no-ops (an invalidation floor or newer version).
    pub stale: u64,
    /// Inserts that found the table full (turned into invalidations).
    pub full: u64,
    /// Invalidations applied (all sources).
    pub invalidated: u64,
    /// cache-on-write outputs cut short because the item list was full.
    pub truncated: u64,
    /// Items not cached because their file is not exposed to the offload engine.
    pub unexposed: u64,
}

/// Owns the single [`CacheWriter`] and runs the application's cache hooks on the thread that
/// owns the file service.
pub struct CacheMaintainer {
    writer: CacheWriter,
    app: Arc<dyn OffloadApp>,
    port: Arc<FileReadPort>,
    exposed: Arc<ExposedFiles>,
    items: ItemList,
    keys: KeyList,
    stats: MaintainerStats,
}

impl std::fmt::Debug for CacheMaintainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheMaintainer")
            .field("stats", &self.stats)
            .finish()
    }
}

impl CacheMaintainer {
    /// Takes the cache writer; the app's hooks fill lists allocated here, once.
    pub fn new(
        writer: CacheWriter,
        app: Arc<dyn OffloadApp>,
        port: Arc<FileReadPort>,
        exposed: Arc<ExposedFiles>,
    ) -> Self {
        let items = ItemList::with_capacity(app.max_write_items().max(1));
        let keys = KeyList::with_capacity(app.max_read_keys().max(app.max_write_items()).max(1));
        CacheMaintainer {
            writer,
            app,
            port,
            exposed,
            items,
            keys,
            stats: MaintainerStats::default(),
        }
    }

    /// A reader of the table (for the director).
    pub fn reader(&self) -> CacheReader {
        self.writer.reader()
    }

    /// The application's name.
    pub fn app_name(&self) -> &str {
        self.app.name()
    }

    /// The writer, for anything else.
    pub fn writer_mut(&mut self) -> &mut CacheWriter {
        &mut self.writer
    }

    /// Counters.
    pub fn stats(&self) -> MaintainerStats {
        self.stats
    }

    /// The version of a host write: call when the write is **submitted** to the file service
    /// and keep it with the operation until it completes.
    pub fn next_version(&self) -> u64 {
        self.port.next_version()
    }

    fn insert(&mut self, item: CacheItem) {
        if !self.exposed.contains(item.file_id) {
            // Only exposed files are ever served on the DPU.
            self.stats.unexposed += 1;
            return;
        }
        match self.writer.insert(item) {
            Ok(dds_cache::InsertOutcome::Stale { .. }) => self.stats.stale += 1,
            Ok(_) => self.stats.cached += 1,
            Err(InsertError::Full(it)) => {
                // Leave a floor so an older write of the key cannot be inserted later.
                self.stats.full += 1;
                self.writer.invalidate(it.key, it.version);
            }
        }
    }

    /// Cache-on-write: a host write of `data` at `offset` of `file_id`, submitted with
    /// `version`, has **completed** (the data is on the device). Call it before the
    /// completion is published to the host.
    pub fn write_completed(&mut self, file_id: u32, offset: u64, data: &[u8], version: u64) {
        self.items.clear();
        self.app
            .cache_on_write(file_id, offset, data, &mut self.items);
        if self.items.len() == self.items.capacity() {
            self.stats.truncated += 1;
        }
        for i in 0..self.items.len() {
            let item = CacheItem {
                version,
                ..self.items.as_slice()[i]
            };
            self.insert(item);
        }
    }

    /// A host write failed: drop whatever the write may have (partially) replaced.
    pub fn write_failed(&mut self, file_id: u32, offset: u64, data: &[u8], version: u64) {
        self.items.clear();
        self.app
            .cache_on_write(file_id, offset, data, &mut self.items);
        for i in 0..self.items.len() {
            let key = self.items.as_slice()[i].key;
            self.writer.invalidate(key, version);
            self.stats.invalidated += 1;
        }
    }

    /// Invalidate-on-read: the host submitted a read of `len` bytes at `offset` of `file_id`.
    pub fn host_read(&mut self, file_id: u32, offset: u64, len: u32) {
        self.keys.clear();
        self.app
            .invalidate_on_read(file_id, offset, len, &mut self.keys);
        if self.keys.is_empty() {
            return;
        }
        let v = self.port.current_version();
        for i in 0..self.keys.len() {
            let key = self.keys.as_slice()[i];
            self.writer.invalidate(key, v);
            self.stats.invalidated += 1;
        }
    }

    /// Applies a director invalidation.
    pub fn invalidate(&mut self, key: u64, version: u64) {
        self.writer.invalidate(key, version);
        self.stats.invalidated += 1;
    }

    /// Applies every queued director invalidation of the port (call every service-loop
    /// round).
    pub fn apply_port_invalidations(&mut self, svc: &mut PortService) -> usize {
        let w = &mut self.writer;
        let n = svc.drain_invalidations(|key, version| {
            w.invalidate(key, version);
        });
        self.stats.invalidated += n as u64;
        n
    }

    /// Applies a host CACHE (opcode 4) or INVALIDATE (opcode 5) record; returns the items
    /// applied.
    pub fn apply_record(&mut self, opcode: u16, data: &[u8]) -> Result<usize, Malformed> {
        match opcode {
            OP_CACHE => {
                let mut n = 0;
                for it in decode_cache_items(data)? {
                    let version = self.port.next_version();
                    self.insert(CacheItem {
                        key: it.key,
                        version,
                        file_id: it.file_id,
                        offset: it.offset,
                        size: it.size,
                        tag: it.tag,
                    });
                    n += 1;
                }
                Ok(n)
            }
            OP_INVALIDATE => {
                let v = self.port.current_version();
                let mut n = 0;
                for key in decode_invalidate_items(data)? {
                    self.invalidate(key, v);
                    n += 1;
                }
                Ok(n)
            }
            _ => Err(Malformed("not a CACHE or INVALIDATE opcode")),
        }
    }
}
