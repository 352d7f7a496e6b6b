//! The storage adapter of the DDS services: where a service's files live. Either DDS files
//! through the host library (the DPU's file service), or regular files (the host doing the
//! same work, for comparison and for tests of a service alone).
//!
//! Two interfaces over the same two places:
//!
//! - [`Storage`] / [`StoreFile`] ([`OsStorage`], [`DdsStorage`]): named files read and written
//!   synchronously at byte offsets, plus the DPU cache hooks (expose, cache, invalidate). The
//!   key-value service (`dds kv`: its log and checkpoint) and the page server
//!   (`dds pageserver`: its log and pages) keep their data so.
//! - [`aio`]: a fixed set of files `f0 .. fN-1` served to worker threads with asynchronous
//!   I/O (submit, a completion eventfd, reap): [`aio::AsyncStorage`] with
//!   [`aio::OsAsyncStorage`] (io_uring, O_DIRECT where aligned) and [`aio::DdsAsyncStorage`]
//!   (one notification group, a completion thread, reconnection when the DPU comes back). The
//!   pagestore server (`dds app pagestore`) serves its files so.
//! - [`fileio`]: asynchronous reads, writes and flushes of a set of files for an event-loop
//!   thread ([`fileio::DdsIo`] through the host library's asynchronous API, [`fileio::SyncIo`]
//!   for any [`StoreFile`]; [`Storage::file_io`] opens one on a storage's files); the
//!   key-value service reads its records, writes its log and commits so, and the page server
//!   (`dds pageserver`) reads and writes its pages and commits its log so.
//!
//! [`pattern`] is the deterministic data those files are filled with and checked against.

pub mod aio;
pub mod fileio;
pub mod inflight;
pub mod pattern;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use dds_host::{Dds, Status};

/// A file the store reads and writes at byte offsets.
pub trait StoreFile: Send {
    /// Reads `buf.len()` bytes at `offset` (short only at end of file); returns bytes read.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize>;
    /// Writes `data` at `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> Result<()>;
    /// Current size.
    fn size(&self) -> Result<u64>;
    /// Grows or shrinks the file.
    fn set_size(&self, size: u64) -> Result<()>;
    /// The DDS file id, for files the DPU may serve.
    fn dds_id(&self) -> Option<u32> {
        None
    }
}

/// Opens the store's files.
pub trait Storage: Send {
    /// Opens (creating it if missing) the file `name`.
    fn open(&self, name: &str) -> Result<Box<dyn StoreFile>>;
    /// Lets the DPU's offload engine read the file and learn its records (cache-on-write);
    /// returns whether an offload engine runs (without one there is no cache to keep
    /// coherent).
    fn expose(&self, _file: &dyn StoreFile) -> Result<bool> {
        Ok(false)
    }
    /// Drops keys from the DPU's cache table; returns once the DPU applied it.
    fn invalidate(&self, _keys: &[u64]) -> Result<()> {
        Ok(())
    }
    /// Tells the DPU's cache table where objects of `file` are: (key, offset, size, tag).
    fn cache(&self, _file: &dyn StoreFile, _items: &[(u64, u64, u32, u64)]) -> Result<()> {
        Ok(())
    }
    /// Asynchronous I/O on the files `names` (file `k` of the set is `names[k]`, opened as
    /// [`Storage::open`] opens it): the host library's asynchronous API on DDS files, else
    /// operations done when issued ([`fileio::SyncIo`]).
    fn file_io(&self, names: &[&str]) -> Result<Box<dyn fileio::FileIo>> {
        let files = names
            .iter()
            .map(|n| self.open(n))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(fileio::SyncIo::new(files)))
    }
    /// What it is, for logs.
    fn describe(&self) -> String;
}

/// Regular files in a directory.
pub struct OsStorage {
    dir: PathBuf,
}

impl OsStorage {
    /// Files in `dir` (created if missing, mode 0700).
    pub fn new(dir: &Path) -> Result<OsStorage> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(OsStorage {
            dir: dir.to_path_buf(),
        })
    }
}

struct OsFile(File);

impl StoreFile for OsFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.0.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        Ok(self.0.write_all_at(data, offset)?)
    }
    fn sync(&self) -> Result<()> {
        Ok(self.0.sync_data()?)
    }
    fn size(&self) -> Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_size(&self, size: u64) -> Result<()> {
        Ok(self.0.set_len(size)?)
    }
}

impl Storage for OsStorage {
    fn open(&self, name: &str) -> Result<Box<dyn StoreFile>> {
        use std::os::unix::fs::OpenOptionsExt;
        let p = self.dir.join(name);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&p)
            .with_context(|| format!("open {}", p.display()))?;
        Ok(Box::new(OsFile(f)))
    }
    fn describe(&self) -> String {
        format!("files in {}", self.dir.display())
    }
}

/// DDS files in a directory of the DPU's file service.
pub struct DdsStorage {
    dds: Arc<Dds>,
    dir: String,
}

impl DdsStorage {
    /// Files under the DDS directory `dir` (created if missing).
    pub fn new(dds: Arc<Dds>, dir: &str) -> Result<DdsStorage> {
        match dds.create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.status == Status::Exists => {}
            Err(e) => return Err(e).with_context(|| format!("create DDS directory {dir}")),
        }
        Ok(DdsStorage {
            dds,
            dir: dir.trim_end_matches('/').to_string(),
        })
    }
}

struct DdsFile {
    dds: Arc<Dds>,
    id: u32,
    max_io: usize,
}

impl StoreFile for DdsFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_io);
            let got =
                self.dds
                    .read_sync(self.id, offset + done as u64, &mut buf[done..done + n])?;
            done += got;
            if got < n {
                break;
            }
        }
        Ok(done)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut done = 0;
        while done < data.len() {
            let n = (data.len() - done).min(self.max_io);
            self.dds
                .write_sync(self.id, offset + done as u64, &data[done..done + n])?;
            done += n;
        }
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(self.dds.flush_sync(self.id)?)
    }
    fn size(&self) -> Result<u64> {
        Ok(self.dds.file_size(self.id)?)
    }
    fn set_size(&self, size: u64) -> Result<()> {
        Ok(self.dds.set_file_size(self.id, size)?)
    }
    fn dds_id(&self) -> Option<u32> {
        Some(self.id)
    }
}

impl Storage for DdsStorage {
    fn open(&self, name: &str) -> Result<Box<dyn StoreFile>> {
        let path = format!("{}/{name}", self.dir);
        let info = self
            .dds
            .open_or_create(&path)
            .with_context(|| format!("open DDS file {path}"))?;
        let max_io = (self.dds.hello().max_io_bytes as usize).clamp(4096, 1 << 20);
        Ok(Box::new(DdsFile {
            dds: self.dds.clone(),
            id: info.id,
            max_io,
        }))
    }
    fn expose(&self, file: &dyn StoreFile) -> Result<bool> {
        match file.dds_id() {
            Some(id) => self
                .dds
                .expose_file(id, true)
                .context("expose the log file to the offload engine"),
            None => Ok(false),
        }
    }
    fn invalidate(&self, keys: &[u64]) -> Result<()> {
        Ok(self.dds.invalidate_keys(keys)?)
    }
    fn cache(&self, file: &dyn StoreFile, items: &[(u64, u64, u32, u64)]) -> Result<()> {
        let Some(file_id) = file.dds_id() else {
            return Ok(());
        };
        let items: Vec<dds_host::CacheRecordItem> = items
            .iter()
            .map(|&(key, offset, size, tag)| dds_host::CacheRecordItem {
                key,
                offset,
                file_id,
                size,
                tag,
            })
            .collect();
        Ok(self.dds.cache_items(&items)?)
    }
    fn file_io(&self, names: &[&str]) -> Result<Box<dyn fileio::FileIo>> {
        let ids = names
            .iter()
            .map(|n| {
                let f = self.open(n)?;
                f.dds_id().context("a DDS file without an id")
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(fileio::DdsIo::new(self.dds.clone(), &ids)))
    }
    fn describe(&self) -> String {
        format!("DDS files in {}", self.dir)
    }
}
