//! How each metadata operation starts: validated against the current state, it finishes at
//! once (no change, or refused), waits for a file's data operations to drain, or becomes a
//! [`Job`] for the committer (its segments picked, its record encoded). The queue that runs
//! them is `metaq.rs`.

use super::metaq::{MetaDone, MetaOp, Origin, Pending, Start};
use super::FileService;
use crate::commit::Job;
use crate::error::FsError;
use crate::meta::{make_file_id, OwnedRecord};
use crate::types::FileId;

impl FileService {
    /// Validates `op` against the current state and says how it starts.
    pub(super) fn meta_prepare(&mut self, origin: Origin, op: &MetaOp) -> Result<Start, FsError> {
        self.check_writable()?;
        let commit = |rec: OwnedRecord, outcome: MetaDone| {
            Start::Commit(
                Pending {
                    origin,
                    rec: rec.clone(),
                    tail: false,
                    fence: None,
                    outcome,
                    also: Vec::new(),
                },
                Job {
                    zero_segs: Vec::new(),
                    rec,
                    tail: None,
                },
            )
        };
        match op {
            MetaOp::CreateDir { path } => {
                let name = self.parse_dir_path(path)?.ok_or(FsError::Exists)?;
                if self.meta.name_taken(0, name) {
                    return Err(FsError::Exists);
                }
                let slot = (1..=self.geom.max_dirs)
                    .find(|&s| self.meta.dirs[s as usize].is_none())
                    .ok_or(FsError::TooManyDirs)?;
                let rec = OwnedRecord::CreateDir {
                    slot,
                    name: name.to_string(),
                };
                Ok(commit(rec, MetaDone::Done))
            }
            MetaOp::RemoveDir { path } => {
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
                Ok(commit(OwnedRecord::RemoveDir { slot }, MetaDone::Done))
            }
            MetaOp::CreateFile { path } => {
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
                let rec = OwnedRecord::CreateFile {
                    slot,
                    gen,
                    dir,
                    name: name.to_string(),
                };
                Ok(commit(
                    rec,
                    MetaDone::Created(FileId(make_file_id(slot, gen))),
                ))
            }
            MetaOp::DeleteFile { id } => {
                let slot = self.file_slot(*id)?;
                Ok(self.delete_start(origin, slot))
            }
            MetaOp::DeletePath { path } => {
                let slot = self.file_by_path(path)?;
                Ok(self.delete_start(origin, slot))
            }
            MetaOp::Rename { from, to } => {
                let slot = self.file_by_path(from)?;
                let (dir, name) = self.parse_file_path(to)?;
                let f = self.meta.files[slot as usize].as_ref().expect("live");
                if f.dir == dir && f.name == name {
                    return Ok(Start::Now(Ok(MetaDone::Done)));
                }
                if self.meta.name_taken(dir, name) {
                    return Err(FsError::Exists);
                }
                let rec = OwnedRecord::RenameFile {
                    slot,
                    gen: f.gen,
                    dir,
                    name: name.to_string(),
                };
                Ok(commit(rec, MetaDone::Done))
            }
            MetaOp::Resize { id, size } => {
                let slot = self.file_slot(*id)?;
                if *size > self.geom.max_file_size() {
                    return Err(FsError::OutOfRange);
                }
                let cur = self.meta.files[slot as usize].as_ref().expect("live").size;
                if *size < cur && self.files_io[slot as usize].inflight > 0 {
                    return Ok(Start::Drain(slot));
                }
                Ok(match self.size_job(origin, slot, *size)? {
                    None => Start::Now(Ok(MetaDone::Done)),
                    Some((p, job)) => Start::Commit(p, job),
                })
            }
        }
    }

    pub(super) fn delete_start(&mut self, origin: Origin, slot: u32) -> Start {
        if self.files_io[slot as usize].inflight > 0 {
            return Start::Drain(slot);
        }
        let gen = self.meta.files[slot as usize].as_ref().expect("live").gen;
        let rec = OwnedRecord::DeleteFile { slot, gen };
        Start::Commit(
            Pending {
                origin,
                rec: rec.clone(),
                tail: false,
                fence: Some(slot),
                outcome: MetaDone::Done,
                also: Vec::new(),
            },
            Job {
                zero_segs: Vec::new(),
                rec,
                tail: None,
            },
        )
    }

    /// The job that changes file `slot`'s size to `new_size` (`None`: already that size).
    /// Growth picks free segments (zeroed by the job before they are attached); a shrink
    /// (the file has no I/O in flight) is fenced and zeroes the cut tail after its record.
    pub(crate) fn size_job(
        &mut self,
        origin: Origin,
        slot: u32,
        new_size: u64,
    ) -> Result<Option<(Pending, Job)>, FsError> {
        self.check_writable()?;
        let seg = self.geom.segment_size;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        let (gen, size, nseg) = (f.gen, f.size, f.segs.len() as u32);
        let hint = f.segs.last().map_or(0, |&s| s + 1);
        debug_assert!(new_size <= self.geom.max_file_size());
        let new_nseg = new_size.div_ceil(seg) as u32;
        if new_size == size {
            return Ok(None);
        }
        let mut zero_segs = Vec::new();
        let mut tail = None;
        let mut fence = None;
        let rec = if new_nseg > nseg {
            if !self
                .meta
                .segmap
                .pick_free(new_nseg - nseg, hint, &mut zero_segs)
            {
                return Err(FsError::NoSpace);
            }
            OwnedRecord::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: false,
                keep: nseg,
                append: zero_segs.clone(),
            }
        } else if new_size < size {
            debug_assert_eq!(self.files_io[slot as usize].inflight, 0);
            fence = Some(slot);
            let end = size.min(u64::from(new_nseg) * seg);
            if new_size < end {
                tail = Some((slot, new_size, end));
            }
            OwnedRecord::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: true,
                keep: new_nseg,
                append: Vec::new(),
            }
        } else {
            OwnedRecord::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: false,
                keep: nseg,
                append: Vec::new(),
            }
        };
        Ok(Some((
            Pending {
                origin,
                rec: rec.clone(),
                tail: true,
                fence,
                outcome: MetaDone::Done,
                also: Vec::new(),
            },
            Job {
                zero_segs,
                rec,
                tail,
            },
        )))
    }
}
