//! Names: paths parsed and resolved to directory and file slots, and the metadata operations
//! by path or id (directories, files, renames, sizes, descriptions, listings). The changing
//! ones are synchronous wrappers over the metadata queue (`metaq.rs`).

use super::metaq::{MetaDone, MetaOp};
use super::FileService;
use crate::error::FsError;
use crate::meta::{make_file_id, name_ok, NameError};
use crate::types::{DirEntry, EntryKind, FileId, FileInfo};

impl FileService {
    // ----------------------------------------------------------------------------------
    // Paths

    pub(super) fn dir_slot(&self, name: Option<&str>) -> Result<u32, FsError> {
        match name {
            None => Ok(0),
            Some(n) => self
                .meta
                .dir_by_name
                .get(n)
                .copied()
                .ok_or(FsError::UnknownDir),
        }
    }

    pub(super) fn check_name(&self, name: &str) -> Result<(), FsError> {
        // Control characters (C0 and DEL) make names that terminals and logs mangle.
        if name.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err(FsError::InvalidPath);
        }
        match name_ok(name, self.geom.max_name_len) {
            Ok(()) => Ok(()),
            Err(NameError::Invalid) => Err(FsError::InvalidPath),
            Err(NameError::TooLong) => Err(FsError::NameTooLong),
        }
    }

    /// Splits a file path into (directory slot, name).
    pub(super) fn parse_file_path<'p>(&self, path: &'p str) -> Result<(u32, &'p str), FsError> {
        let p = path.strip_prefix('/').unwrap_or(path);
        let (dir, name) = match p.split_once('/') {
            None => (None, p),
            Some((d, f)) => (Some(d), f),
        };
        if let Some(d) = dir {
            self.check_name(d)?;
        }
        self.check_name(name)?;
        Ok((self.dir_slot(dir)?, name))
    }

    /// Parses a directory path: `None` for the root.
    pub(super) fn parse_dir_path<'p>(&self, path: &'p str) -> Result<Option<&'p str>, FsError> {
        if path == "/" {
            return Ok(None);
        }
        let p = path.strip_prefix('/').unwrap_or(path);
        let p = p.strip_suffix('/').unwrap_or(p);
        self.check_name(p)?;
        Ok(Some(p))
    }

    pub(super) fn file_by_path(&self, path: &str) -> Result<u32, FsError> {
        let (dir, name) = self.parse_file_path(path)?;
        let d = self.meta.dirs[dir as usize].as_ref().expect("live dir");
        d.files
            .get(name)
            .map(|&s| u32::from(s))
            .ok_or(FsError::NotFound)
    }

    pub(crate) fn file_slot(&self, id: FileId) -> Result<u32, FsError> {
        self.meta.resolve_id(id.0).ok_or(FsError::UnknownFile)
    }

    pub(super) fn info(&self, slot: u32) -> FileInfo {
        let f = self.meta.files[slot as usize].as_ref().expect("live file");
        let dir = if f.dir == 0 {
            "/".to_string()
        } else {
            let d = self.meta.dirs[f.dir as usize].as_ref().expect("live dir");
            format!("/{}", d.name)
        };
        let path = if f.dir == 0 {
            format!("/{}", f.name)
        } else {
            format!("{dir}/{}", f.name)
        };
        FileInfo {
            id: FileId(make_file_id(slot, f.gen)),
            path,
            dir,
            name: f.name.clone(),
            size: f.size,
            allocated_bytes: f.segs.len() as u64 * self.geom.segment_size,
        }
    }

    // ----------------------------------------------------------------------------------
    // Directory operations

    /// Creates a named directory (`/name` or `name`).
    pub fn create_dir(&mut self, path: &str) -> Result<(), FsError> {
        self.meta_blocking(MetaOp::CreateDir { path: path.into() })
            .map(|_| ())
    }

    /// Removes an empty named directory.
    pub fn remove_dir(&mut self, path: &str) -> Result<(), FsError> {
        self.meta_blocking(MetaOp::RemoveDir { path: path.into() })
            .map(|_| ())
    }

    /// Lists a directory (`/` lists root files and all directories), sorted by name.
    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, FsError> {
        let dir = self.parse_dir_path(path)?;
        let slot = self.dir_slot(dir)?;
        let d = self.meta.dirs[slot as usize].as_ref().expect("live");
        let mut out: Vec<DirEntry> = d
            .files
            .iter()
            .map(|(name, &fs)| {
                let f = self.meta.files[fs as usize].as_ref().expect("live");
                DirEntry {
                    name: name.clone(),
                    kind: EntryKind::File,
                    id: Some(FileId(make_file_id(u32::from(fs), f.gen))),
                    size: f.size,
                }
            })
            .collect();
        if slot == 0 {
            out.extend(self.meta.dir_by_name.keys().map(|n| DirEntry {
                name: n.clone(),
                kind: EntryKind::Dir,
                id: None,
                size: 0,
            }));
            out.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Ok(out)
    }

    /// Names of all named directories, sorted.
    pub fn list_dirs(&self) -> Vec<String> {
        self.meta.dir_by_name.keys().cloned().collect()
    }

    // ----------------------------------------------------------------------------------
    // File operations

    /// Creates an empty file at `path` (`/dir/name`, `/name` or `name`).
    pub fn create_file(&mut self, path: &str) -> Result<FileId, FsError> {
        match self.meta_blocking(MetaOp::CreateFile { path: path.into() })? {
            MetaDone::Created(id) => Ok(id),
            MetaDone::Done => unreachable!("a create reports its id"),
        }
    }

    /// Deletes the file at `path`, after its in-flight I/O completed.
    pub fn delete_file(&mut self, path: &str) -> Result<(), FsError> {
        self.meta_blocking(MetaOp::DeletePath { path: path.into() })
            .map(|_| ())
    }

    /// Deletes a file by id, after its in-flight I/O completed.
    pub fn delete_file_by_id(&mut self, id: FileId) -> Result<(), FsError> {
        self.meta_blocking(MetaOp::DeleteFile { id }).map(|_| ())
    }

    /// Renames / moves a file (also between directories). Fails with `Exists` if the target
    /// name is taken; renaming onto itself succeeds without change.
    pub fn rename_file(&mut self, old_path: &str, new_path: &str) -> Result<(), FsError> {
        self.meta_blocking(MetaOp::Rename {
            from: old_path.into(),
            to: new_path.into(),
        })
        .map(|_| ())
    }

    /// Description of a file by id.
    pub fn stat(&self, id: FileId) -> Result<FileInfo, FsError> {
        Ok(self.info(self.file_slot(id)?))
    }

    /// Description of a file by path.
    pub fn lookup(&self, path: &str) -> Result<FileInfo, FsError> {
        Ok(self.info(self.file_by_path(path)?))
    }

    /// Current size of a file.
    pub fn file_size(&self, id: FileId) -> Result<u64, FsError> {
        let slot = self.file_slot(id)?;
        Ok(self.meta.files[slot as usize].as_ref().expect("live").size)
    }

    /// Sets a file's size, allocating or freeing segments. Growth reads as zeros. Shrinking
    /// first waits for the file's in-flight I/O.
    pub fn resize(&mut self, id: FileId, new_size: u64) -> Result<(), FsError> {
        self.meta_blocking(MetaOp::Resize { id, size: new_size })
            .map(|_| ())
    }
}
