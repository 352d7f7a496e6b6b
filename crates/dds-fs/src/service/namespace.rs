//! Metadata operations of the file service: directories, files, renames, sizes.

use super::*;

impl FileService {
    // ----------------------------------------------------------------------------------
    // Directory operations

    /// Creates a named directory (`/name` or `name`).
    pub fn create_dir(&mut self, path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let name = self.parse_dir_path(path)?.ok_or(FsError::Exists)?;
        if self.meta.name_taken(0, name) {
            return Err(FsError::Exists);
        }
        let slot = (1..=self.geom.max_dirs)
            .find(|&s| self.meta.dirs[s as usize].is_none())
            .ok_or(FsError::TooManyDirs)?;
        self.commit(&Record::CreateDir { slot, name })
    }

    /// Removes an empty named directory.
    pub fn remove_dir(&mut self, path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let name = self.parse_dir_path(path)?.ok_or(FsError::InvalidPath)?;
        let slot = self.dir_slot(Some(name))?;
        if !self.meta.dirs[slot as usize]
            .as_ref()
            .expect("live")
            .files
            .is_empty()
        {
            return Err(FsError::NotEmpty);
        }
        self.commit(&Record::RemoveDir { slot })
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
        self.check_writable()?;
        let (dir, name) = self.parse_file_path(path)?;
        if self.meta.name_taken(dir, name) {
            return Err(FsError::Exists);
        }
        let max = self.geom.max_files;
        if self.meta.nfiles >= max {
            return Err(FsError::TooManyFiles);
        }
        let start = self.next_file_slot % max;
        let slot = (0..max)
            .map(|i| (start + i) % max)
            .find(|&s| self.meta.files[s as usize].is_none())
            .ok_or(FsError::TooManyFiles)?;
        let gen = self.meta.next_gen;
        self.commit(&Record::CreateFile {
            slot,
            gen,
            dir,
            name,
        })?;
        self.next_file_slot = (slot + 1) % max;
        Ok(FileId(make_file_id(slot, gen)))
    }

    /// Deletes the file at `path`, after its in-flight I/O completed.
    pub fn delete_file(&mut self, path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let slot = self.file_by_path(path)?;
        self.delete_slot(slot)
    }

    /// Deletes a file by id, after its in-flight I/O completed.
    pub fn delete_file_by_id(&mut self, id: FileId) -> Result<(), FsError> {
        self.check_writable()?;
        let slot = self.file_slot(id)?;
        self.delete_slot(slot)
    }

    pub(super) fn delete_slot(&mut self, slot: u32) -> Result<(), FsError> {
        self.drain_file(slot)?;
        let gen = self.meta.files[slot as usize].as_ref().expect("live").gen;
        self.commit(&Record::DeleteFile { slot, gen })
    }

    /// Renames / moves a file (also between directories). Fails with `Exists` if the target
    /// name is taken; renaming onto itself succeeds without change.
    pub fn rename_file(&mut self, old_path: &str, new_path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let slot = self.file_by_path(old_path)?;
        let (dir, name) = self.parse_file_path(new_path)?;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        if f.dir == dir && f.name == name {
            return Ok(());
        }
        if self.meta.name_taken(dir, name) {
            return Err(FsError::Exists);
        }
        let gen = f.gen;
        self.commit(&Record::RenameFile {
            slot,
            gen,
            dir,
            name,
        })
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
        self.check_writable()?;
        let slot = self.file_slot(id)?;
        if new_size > self.geom.max_file_size() {
            return Err(FsError::OutOfRange);
        }
        let size = self.meta.files[slot as usize].as_ref().expect("live").size;
        if new_size < size {
            self.drain_file(slot)?;
        }
        self.set_size(slot, new_size)
    }

    /// Durably changes the size of file `slot` (growth allocates zeroed segments; shrink
    /// zeroes the cut tail). Callers have drained the file before a shrink.
    pub(crate) fn set_size(&mut self, slot: u32, new_size: u64) -> Result<(), FsError> {
        self.check_writable()?;
        let seg = self.geom.segment_size;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        let (gen, size, nseg) = (f.gen, f.size, f.segs.len() as u32);
        let hint = f.segs.last().map_or(0, |&s| s + 1);
        debug_assert!(new_size <= self.geom.max_file_size());
        let new_nseg = new_size.div_ceil(seg) as u32;
        if new_size == size {
            return Ok(());
        }
        if new_nseg > nseg {
            let mut picked = std::mem::take(&mut self.seg_scratch);
            picked.clear();
            if !self
                .meta
                .segmap
                .pick_free(new_nseg - nseg, hint, &mut picked)
            {
                self.seg_scratch = picked;
                return Err(FsError::NoSpace);
            }
            let r = self.zero_segments(&picked).and_then(|()| {
                self.commit(&Record::SetSize {
                    slot,
                    gen,
                    size: new_size,
                    tail_dirty: false,
                    keep: nseg,
                    append: Segs::Slice(&picked),
                })
            });
            self.seg_scratch = picked;
            r
        } else if new_size < size {
            debug_assert_eq!(self.files_io[slot as usize].inflight, 0);
            self.commit(&Record::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: true,
                keep: new_nseg,
                append: Segs::Slice(&[]),
            })?;
            let end = size.min(u64::from(new_nseg) * seg);
            if new_size < end {
                if let Err(e) = self.zero_file_range(slot, new_size, end) {
                    return Err(self.fail(e));
                }
                if let Err(e) = self.dev.sync() {
                    return Err(self.fail(FsError::io("sync after tail zeroing", e)));
                }
            }
            self.meta.files[slot as usize]
                .as_mut()
                .expect("live")
                .tail_dirty = false;
            Ok(())
        } else {
            self.commit(&Record::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: false,
                keep: nseg,
                append: Segs::Slice(&[]),
            })
        }
    }

    /// Zeroes freshly picked segments and makes that durable (before they are attached).
    pub(super) fn zero_segments(&mut self, segs: &[u32]) -> Result<(), FsError> {
        let seg = self.geom.segment_size;
        let mut i = 0;
        while i < segs.len() {
            // Merge runs of consecutive segments into one zeroing call.
            let mut j = i + 1;
            while j < segs.len() && segs[j] == segs[j - 1] + 1 {
                j += 1;
            }
            let r = self
                .dev
                .zero_sync(u64::from(segs[i]) * seg, (j - i) as u64 * seg);
            if let Err(e) = r {
                return Err(self.fail(FsError::io("zero new segments", e)));
            }
            i = j;
        }
        if let Err(e) = self.dev.sync() {
            return Err(self.fail(FsError::io("sync zeroed segments", e)));
        }
        Ok(())
    }

    /// Zeroes file bytes `[from, to)` (inside allocated segments) synchronously. The file has
    /// no I/O in flight.
    pub(super) fn zero_file_range(&mut self, slot: u32, from: u64, to: u64) -> Result<(), FsError> {
        let bs = self.bs;
        let seg = self.geom.segment_size;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        let alloc_end = f.segs.len() as u64 * seg;
        assert!(
            from <= to && to <= alloc_end,
            "zero range outside the allocation"
        );
        let dev_off = |f: &crate::meta::FileRec, off: u64| {
            u64::from(f.segs[(off / seg) as usize]) * seg + off % seg
        };
        let mut from = from;
        if !from.is_multiple_of(bs) {
            let blk = align_down(from, bs);
            let d = dev_off(f, blk);
            let scratch = self.block_scratch.as_mut_slice();
            self.dev
                .read_sync(d, scratch)
                .map_err(|e| FsError::io("tail zeroing read", e))?;
            let stop = to.min(blk + bs);
            scratch[(from - blk) as usize..(stop - blk) as usize].fill(0);
            self.dev
                .write_sync(d, scratch)
                .map_err(|e| FsError::io("tail zeroing write", e))?;
            from = blk + bs;
        }
        let to = align_up(to, bs).min(alloc_end);
        while from < to {
            let chunk = (to - from).min(seg - from % seg);
            self.dev
                .zero_sync(dev_off(f, from), chunk)
                .map_err(|e| FsError::io("tail zeroing", e))?;
            from += chunk;
        }
        Ok(())
    }

    /// Waits until file `slot` has no data operation in flight (their completions stay queued
    /// for the next `poll`).
    pub(crate) fn drain_file(&mut self, slot: u32) -> Result<(), FsError> {
        while self.files_io[slot as usize].inflight > 0 {
            self.progress(true)?;
        }
        Ok(())
    }
}
