//! In-memory metadata, its log records and checkpoint image (docs/on-disk-format.md §3–4).

use crate::codec::{le32, le64, Reader, Writer};
use crate::layout::{Geometry, CKPT_HEADER_LEN, CKPT_MAGIC, LOG_HEADER_LEN, LOG_MAGIC};
use std::collections::BTreeMap;

mod record;

pub(crate) use record::*;

/// File flag: bytes past the size in the last segment may be non-zero.
pub(crate) const FLAG_TAIL_DIRTY: u32 = 1;

/// A directory. Slot 0 is the root (empty name).
#[derive(Debug, Clone, Default)]
pub(crate) struct DirRec {
    pub name: String,
    /// File name → file slot.
    pub files: BTreeMap<String, u16>,
}

/// A file and its own segment vector.
#[derive(Debug, Clone)]
pub(crate) struct FileRec {
    pub gen: u32,
    pub dir: u32,
    pub name: String,
    pub size: u64,
    pub segs: Vec<u32>,
    pub tail_dirty: bool,
}

/// Segment allocation bitmap (metadata segments are marked used).
#[derive(Debug, Clone)]
pub(crate) struct SegMap {
    bits: Vec<u64>,
    total: u32,
    meta: u32,
    data_used: u32,
}

impl SegMap {
    pub(crate) fn new(total: u32, meta: u32) -> SegMap {
        let mut m = SegMap {
            bits: vec![0; (total as usize).div_ceil(64)],
            total,
            meta,
            data_used: 0,
        };
        for s in 0..meta {
            m.bits[(s / 64) as usize] |= 1 << (s % 64);
        }
        m
    }
    pub(crate) fn is_used(&self, s: u32) -> bool {
        self.bits[(s / 64) as usize] & (1 << (s % 64)) != 0
    }
    fn set(&mut self, s: u32) {
        debug_assert!(s >= self.meta && s < self.total && !self.is_used(s));
        self.bits[(s / 64) as usize] |= 1 << (s % 64);
        self.data_used += 1;
    }
    fn clear(&mut self, s: u32) {
        debug_assert!(s >= self.meta && s < self.total && self.is_used(s));
        self.bits[(s / 64) as usize] &= !(1 << (s % 64));
        self.data_used -= 1;
    }
    /// Marks picked segments used while other changes of the same commit pick theirs
    /// ([`unreserve`](Self::unreserve) them before any record is applied).
    pub(crate) fn reserve(&mut self, segs: &[u32]) {
        for &s in segs {
            self.set(s);
        }
    }
    pub(crate) fn unreserve(&mut self, segs: &[u32]) {
        for &s in segs {
            self.clear(s);
        }
    }
    pub(crate) fn free_count(&self) -> u32 {
        self.total - self.meta - self.data_used
    }
    #[cfg(test)]
    pub(crate) fn used_count(&self) -> u32 {
        self.data_used
    }
    fn is_data(&self, s: u32) -> bool {
        s >= self.meta && s < self.total
    }
    /// Picks `n` free segments (not marking them), preferring the ones right after `hint`,
    /// appending them to `out`. Returns false (and leaves `out` as it was) if too few are free.
    pub(crate) fn pick_free(&self, n: u32, hint: u32, out: &mut Vec<u32>) -> bool {
        if n > self.free_count() {
            return false;
        }
        let start = if self.is_data(hint) { hint } else { self.meta };
        let mut s = start;
        let mut got = 0;
        while got < n {
            let word = self.bits[(s / 64) as usize];
            if word == u64::MAX && s % 64 == 0 && s + 64 <= self.total {
                s += 64;
            } else {
                if !self.is_used(s) {
                    out.push(s);
                    got += 1;
                }
                s += 1;
            }
            if s >= self.total {
                s = self.meta;
            }
            debug_assert!(got == n || s != start, "free count inconsistent");
        }
        true
    }
}

/// Checks a file or directory name.
pub(crate) fn name_ok(name: &str, max: u32) -> Result<(), NameError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(NameError::Invalid);
    }
    if name.len() > max as usize {
        return Err(NameError::TooLong);
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameError {
    Invalid,
    TooLong,
}

/// The whole metadata state.
#[derive(Debug, Clone)]
pub(crate) struct MetaState {
    pub dirs: Vec<Option<DirRec>>,
    pub dir_by_name: BTreeMap<String, u32>,
    pub files: Vec<Option<FileRec>>,
    pub next_gen: u32,
    pub nfiles: u32,
    pub segmap: SegMap,
    pub segment_size: u64,
    pub max_name_len: u32,
    pub max_file_size: u64,
}

/// Id generation visible in a [`FileId`](crate::FileId) for a generation counter value.
pub(crate) fn id_gen(gen: u32) -> u32 {
    (gen % 65535) + 1
}

/// File id of a slot created with counter value `gen`.
pub(crate) fn make_file_id(slot: u32, gen: u32) -> u32 {
    (id_gen(gen) << 16) | slot
}

impl MetaState {
    pub(crate) fn empty(g: &Geometry) -> MetaState {
        let mut dirs = vec![None; g.max_dirs as usize + 1];
        dirs[0] = Some(DirRec::default());
        MetaState {
            dirs,
            dir_by_name: BTreeMap::new(),
            files: vec![None; g.max_files as usize],
            next_gen: 0,
            nfiles: 0,
            segmap: SegMap::new(g.total_segments, g.meta_segments),
            segment_size: g.segment_size,
            max_name_len: g.max_name_len,
            max_file_size: g.max_file_size(),
        }
    }

    pub(crate) fn ndirs(&self) -> u32 {
        self.dir_by_name.len() as u32
    }

    /// Slot of a live file id.
    pub(crate) fn resolve_id(&self, id: u32) -> Option<u32> {
        let slot = id & 0xffff;
        let f = self.files.get(slot as usize)?.as_ref()?;
        (id_gen(f.gen) == id >> 16).then_some(slot)
    }

    /// True if `name` is taken in directory `dir` (in the root, directories share the
    /// namespace with files).
    pub(crate) fn name_taken(&self, dir: u32, name: &str) -> bool {
        let d = self.dirs[dir as usize].as_ref().expect("live dir");
        d.files.contains_key(name) || (dir == 0 && self.dir_by_name.contains_key(name))
    }

    fn file_mut(&mut self, slot: u32, gen: u32) -> Result<&mut FileRec, String> {
        match self.files.get_mut(slot as usize) {
            Some(Some(f)) if f.gen == gen => Ok(f),
            _ => Err(format!("file slot {slot} gen {gen} not live")),
        }
    }

    fn live_dir(&self, dir: u32) -> Result<(), String> {
        match self.dirs.get(dir as usize) {
            Some(Some(_)) => Ok(()),
            _ => Err(format!("directory slot {dir} not live")),
        }
    }

    fn check_name(&self, name: &str) -> Result<(), String> {
        name_ok(name, self.max_name_len).map_err(|_| format!("bad name {name:?}"))
    }

    /// Validates `rec` against the state and applies it; on error the state is unchanged.
    pub(crate) fn apply(&mut self, rec: &Record<'_>) -> Result<(), String> {
        match *rec {
            Record::CreateDir { slot, name } => {
                if slot == 0 || self.dirs.get(slot as usize).is_none_or(|d| d.is_some()) {
                    return Err(format!("directory slot {slot} not free"));
                }
                self.check_name(name)?;
                if self.name_taken(0, name) {
                    return Err(format!("directory name {name:?} taken"));
                }
                self.dirs[slot as usize] = Some(DirRec {
                    name: name.to_string(),
                    files: BTreeMap::new(),
                });
                self.dir_by_name.insert(name.to_string(), slot);
            }
            Record::RemoveDir { slot } => {
                if slot == 0 {
                    return Err("cannot remove root".into());
                }
                self.live_dir(slot)?;
                let d = self.dirs[slot as usize].as_ref().expect("live");
                if !d.files.is_empty() {
                    return Err(format!("directory slot {slot} not empty"));
                }
                let d = self.dirs[slot as usize].take().expect("live");
                self.dir_by_name.remove(&d.name);
            }
            Record::CreateFile {
                slot,
                gen,
                dir,
                name,
            } => {
                if self.files.get(slot as usize).is_none_or(|f| f.is_some()) {
                    return Err(format!("file slot {slot} not free"));
                }
                self.live_dir(dir)?;
                self.check_name(name)?;
                if self.name_taken(dir, name) {
                    return Err(format!("file name {name:?} taken"));
                }
                self.files[slot as usize] = Some(FileRec {
                    gen,
                    dir,
                    name: name.to_string(),
                    size: 0,
                    segs: Vec::new(),
                    tail_dirty: false,
                });
                self.dirs[dir as usize]
                    .as_mut()
                    .expect("live")
                    .files
                    .insert(name.to_string(), slot as u16);
                self.next_gen = gen.wrapping_add(1);
                self.nfiles += 1;
            }
            Record::DeleteFile { slot, gen } => {
                self.file_mut(slot, gen)?;
                let f = self.files[slot as usize].take().expect("live");
                for &s in &f.segs {
                    self.segmap.clear(s);
                }
                self.dirs[f.dir as usize]
                    .as_mut()
                    .expect("file's directory is live")
                    .files
                    .remove(&f.name);
                self.nfiles -= 1;
            }
            Record::RenameFile {
                slot,
                gen,
                dir,
                name,
            } => {
                self.file_mut(slot, gen)?;
                self.live_dir(dir)?;
                self.check_name(name)?;
                if self.name_taken(dir, name) {
                    return Err(format!("file name {name:?} taken"));
                }
                let f = self.files[slot as usize].as_mut().expect("live");
                let (old_dir, old_name) = (f.dir, std::mem::replace(&mut f.name, name.into()));
                f.dir = dir;
                self.dirs[old_dir as usize]
                    .as_mut()
                    .expect("live")
                    .files
                    .remove(&old_name);
                self.dirs[dir as usize]
                    .as_mut()
                    .expect("live")
                    .files
                    .insert(name.to_string(), slot as u16);
            }
            Record::SetSize {
                slot,
                gen,
                size,
                tail_dirty,
                keep,
                append,
            } => {
                let seg = self.segment_size;
                let max = self.max_file_size;
                let f = self.file_mut(slot, gen)?;
                if keep as usize > f.segs.len() {
                    return Err(format!("file slot {slot}: keep {keep} > {}", f.segs.len()));
                }
                if size > max || (keep as u64 + append.len() as u64) != size.div_ceil(seg) {
                    return Err(format!("file slot {slot}: size {size} vs segments"));
                }
                // All appended segments must be free data segments, without duplicates.
                let mut marked = 0;
                let mut err = None;
                for i in 0..append.len() {
                    let s = append.get(i);
                    if !self.segmap.is_data(s) || self.segmap.is_used(s) {
                        err = Some(format!("segment {s} not free"));
                        break;
                    }
                    self.segmap.set(s);
                    marked += 1;
                }
                if let Some(e) = err {
                    for i in 0..marked {
                        self.segmap.clear(append.get(i));
                    }
                    return Err(e);
                }
                let f = self.files[slot as usize].as_mut().expect("live");
                for &s in &f.segs[keep as usize..] {
                    self.segmap.clear(s);
                }
                f.segs.truncate(keep as usize);
                for i in 0..append.len() {
                    f.segs.push(append.get(i));
                }
                f.size = size;
                f.tail_dirty = tail_dirty;
            }
            Record::SetSizes(changes) => {
                // Each file at most once, so that the entries are independent; checked before
                // any is applied. An entry that fails to apply leaves the earlier ones applied:
                // only replay can meet one (damage), and it then refuses the device.
                let mut seen = std::collections::HashSet::with_capacity(changes.len());
                for r in changes.records() {
                    if let Record::SetSize { slot, .. } = r {
                        if !seen.insert(slot) {
                            return Err(format!("file slot {slot} twice in one SET_SIZES"));
                        }
                    }
                }
                for r in changes.records() {
                    self.apply(&r)?;
                }
            }
        }
        Ok(())
    }

    /// Length of the checkpoint body of the current state.
    fn body_len(&self) -> usize {
        let dirs: usize = self
            .dir_by_name
            .keys()
            .map(|n| crate::layout::DIR_REC_FIXED as usize + n.len())
            .sum();
        let files: usize = self
            .files
            .iter()
            .flatten()
            .map(|f| crate::layout::FILE_REC_FIXED as usize + f.name.len() + 4 * f.segs.len())
            .sum();
        dirs + files
    }

    /// Encodes a checkpoint into `out`; returns the encoded length (unpadded).
    pub(crate) fn encode_checkpoint(
        &self,
        fs_uuid: u64,
        generation: u64,
        last_seq: u64,
        out: &mut [u8],
    ) -> usize {
        let body_len = self.body_len();
        let total = CKPT_HEADER_LEN + body_len;
        assert!(total <= out.len(), "checkpoint exceeds its slot");
        {
            let mut w = Writer::at(out, CKPT_HEADER_LEN);
            for (slot, d) in self.dirs.iter().enumerate().skip(1) {
                if let Some(d) = d {
                    w.u32(slot as u32);
                    w.u16(d.name.len() as u16);
                    w.u16(0);
                    w.bytes(d.name.as_bytes());
                }
            }
            for (slot, f) in self.files.iter().enumerate() {
                if let Some(f) = f {
                    w.u32(slot as u32);
                    w.u32(f.gen);
                    w.u32(f.dir);
                    w.u32(if f.tail_dirty { FLAG_TAIL_DIRTY } else { 0 });
                    w.u64(f.size);
                    w.u32(f.segs.len() as u32);
                    w.u16(f.name.len() as u16);
                    w.u16(0);
                    w.bytes(f.name.as_bytes());
                    for &s in &f.segs {
                        w.u32(s);
                    }
                }
            }
            assert_eq!(w.pos(), total);
        }
        let body_crc = crc32c::crc32c(&out[CKPT_HEADER_LEN..total]);
        let mut w = Writer::new(out);
        w.bytes(CKPT_MAGIC);
        w.u64(fs_uuid);
        w.u64(generation);
        w.u64(last_seq);
        w.u32(body_len as u32);
        w.u32(body_crc);
        w.u32(self.ndirs());
        w.u32(self.nfiles);
        w.u32(self.next_gen);
        w.u64(0);
        let hcrc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&hcrc.to_le_bytes());
        total
    }

    /// Validates a checkpoint header; returns (generation, last_seq, body_len).
    pub(crate) fn checkpoint_header(b: &[u8], g: &Geometry) -> Option<(u64, u64, usize)> {
        if b.len() < CKPT_HEADER_LEN || &b[..8] != CKPT_MAGIC {
            return None;
        }
        if crc32c::crc32c(&b[..60]) != le32(b, 60) || le64(b, 8) != g.fs_uuid {
            return None;
        }
        let body_len = le32(b, 32) as usize;
        if body_len as u64 > g.ckpt_len - CKPT_HEADER_LEN as u64
            || CKPT_HEADER_LEN + body_len > b.len()
        {
            return None;
        }
        if crc32c::crc32c(&b[CKPT_HEADER_LEN..CKPT_HEADER_LEN + body_len]) != le32(b, 36) {
            return None;
        }
        Some((le64(b, 16), le64(b, 24), body_len))
    }

    /// Decodes a checkpoint whose header was validated by [`checkpoint_header`].
    pub(crate) fn decode_checkpoint(b: &[u8], g: &Geometry) -> Result<MetaState, String> {
        let (_, _, body_len) =
            Self::checkpoint_header(b, g).ok_or_else(|| "invalid checkpoint".to_string())?;
        let ndirs = le32(b, 40);
        let nfiles = le32(b, 44);
        let next_gen = le32(b, 48);
        if ndirs > g.max_dirs || nfiles > g.max_files {
            return Err("checkpoint counts exceed the limits".into());
        }
        let mut st = MetaState::empty(g);
        let mut r = Reader::new(&b[CKPT_HEADER_LEN..CKPT_HEADER_LEN + body_len]);
        let short = || "truncated checkpoint body".to_string();
        for _ in 0..ndirs {
            let slot = r.u32().ok_or_else(short)?;
            let n = r.u16().ok_or_else(short)? as usize;
            if r.u16().ok_or_else(short)? != 0 {
                return Err("checkpoint reserved field set".into());
            }
            let name = std::str::from_utf8(r.bytes(n).ok_or_else(short)?)
                .map_err(|_| "directory name not UTF-8".to_string())?;
            st.apply(&Record::CreateDir { slot, name })?;
        }
        for _ in 0..nfiles {
            let slot = r.u32().ok_or_else(short)?;
            let gen = r.u32().ok_or_else(short)?;
            let dir = r.u32().ok_or_else(short)?;
            let flags = r.u32().ok_or_else(short)?;
            let size = r.u64().ok_or_else(short)?;
            let nseg = r.u32().ok_or_else(short)? as usize;
            let n = r.u16().ok_or_else(short)? as usize;
            if r.u16().ok_or_else(short)? != 0 || flags & !FLAG_TAIL_DIRTY != 0 {
                return Err("checkpoint reserved field set".into());
            }
            let name = std::str::from_utf8(r.bytes(n).ok_or_else(short)?)
                .map_err(|_| "file name not UTF-8".to_string())?;
            let segs = r
                .bytes(nseg.checked_mul(4).ok_or_else(short)?)
                .ok_or_else(short)?;
            st.apply(&Record::CreateFile {
                slot,
                gen,
                dir,
                name,
            })?;
            st.apply(&Record::SetSize {
                slot,
                gen,
                size,
                tail_dirty: flags & FLAG_TAIL_DIRTY != 0,
                keep: 0,
                append: Segs::Bytes(segs),
            })?;
        }
        if r.remaining() != 0 {
            return Err("trailing bytes in checkpoint body".into());
        }
        st.next_gen = next_gen;
        Ok(st)
    }

    /// Re-derives the allocation map from the file segment vectors and checks it against the
    /// incremental one, plus the directory indexes.
    pub(crate) fn verify(&self) -> Result<(), String> {
        let mut map = SegMap::new(self.segmap.total, self.segmap.meta);
        let mut nfiles = 0;
        for (slot, f) in self.files.iter().enumerate() {
            let Some(f) = f else { continue };
            nfiles += 1;
            if f.segs.len() as u64 != f.size.div_ceil(self.segment_size) {
                return Err(format!(
                    "file slot {slot}: {} segments for size {}",
                    f.segs.len(),
                    f.size
                ));
            }
            for &s in &f.segs {
                if !map.is_data(s) {
                    return Err(format!(
                        "file slot {slot}: segment {s} outside the data area"
                    ));
                }
                if map.is_used(s) {
                    return Err(format!("segment {s} owned twice"));
                }
                map.set(s);
            }
            let d = self.dirs.get(f.dir as usize).and_then(|d| d.as_ref());
            if d.and_then(|d| d.files.get(&f.name)) != Some(&(slot as u16)) {
                return Err(format!("file slot {slot} missing from its directory"));
            }
        }
        if nfiles != self.nfiles {
            return Err("file count mismatch".into());
        }
        if map.bits != self.segmap.bits || map.data_used != self.segmap.data_used {
            return Err("allocation map differs from the segment vectors".into());
        }
        let listed: usize = self.dirs.iter().flatten().map(|d| d.files.len()).sum();
        if listed != nfiles as usize {
            return Err("directory entries do not match files".into());
        }
        for (name, &slot) in &self.dir_by_name {
            if self.dirs[slot as usize].as_ref().map(|d| &d.name) != Some(name) {
                return Err(format!("directory index broken for {name:?}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::FormatConfig;

    fn geom() -> Geometry {
        let cfg = FormatConfig {
            segment_size: 64 << 10,
            max_files: 16,
            max_dirs: 4,
            max_name_len: 32,
            log_bytes: 64 << 10,
            fs_uuid: Some(7),
        };
        Geometry::compute(&cfg, 512, 8 << 20, 7, 0).unwrap()
    }

    #[test]
    fn apply_and_checkpoint_roundtrip() {
        let g = geom();
        let mut st = MetaState::empty(&g);
        st.apply(&Record::CreateDir { slot: 1, name: "d" }).unwrap();
        st.apply(&Record::CreateFile {
            slot: 3,
            gen: 0,
            dir: 1,
            name: "f",
        })
        .unwrap();
        let segs = [g.meta_segments, g.meta_segments + 5];
        st.apply(&Record::SetSize {
            slot: 3,
            gen: 0,
            size: (64 << 10) + 1,
            tail_dirty: false,
            keep: 0,
            append: Segs::Slice(&segs),
        })
        .unwrap();
        // double allocation is refused and leaves the state unchanged
        st.apply(&Record::CreateFile {
            slot: 4,
            gen: 1,
            dir: 0,
            name: "g",
        })
        .unwrap();
        let before = st.segmap.used_count();
        assert!(st
            .apply(&Record::SetSize {
                slot: 4,
                gen: 1,
                size: 1,
                tail_dirty: false,
                keep: 0,
                append: Segs::Slice(&segs[1..]),
            })
            .is_err());
        assert_eq!(st.segmap.used_count(), before);
        // name clash between root file and directory
        assert!(st
            .apply(&Record::CreateFile {
                slot: 5,
                gen: 2,
                dir: 0,
                name: "d",
            })
            .is_err());
        st.verify().unwrap();
        let mut buf = vec![0u8; g.ckpt_len as usize];
        st.encode_checkpoint(g.fs_uuid, 3, 9, &mut buf);
        let st2 = MetaState::decode_checkpoint(&buf, &g).unwrap();
        st2.verify().unwrap();
        assert_eq!(st2.files[3].as_ref().unwrap().segs, segs);
        assert_eq!(st2.next_gen, 2);
        let (gen, seq, body) = MetaState::checkpoint_header(&buf, &g).unwrap();
        assert_eq!((gen, seq, body), (3, 9, st.body_len()));
        buf[70] ^= 0xff;
        assert!(MetaState::decode_checkpoint(&buf, &g).is_err());
    }

    #[test]
    fn record_roundtrip() {
        let segs = [9u32, 10, 11];
        let changes = [
            SizeChange {
                slot: 1,
                gen: 5,
                size: 70_000,
                keep: 1,
                append: vec![12],
            },
            SizeChange {
                slot: 3,
                gen: 2,
                size: 10,
                keep: 0,
                append: vec![13],
            },
        ];
        let recs = [
            Record::SetSizes(Changes::Slice(&changes)),
            Record::CreateDir {
                slot: 2,
                name: "abc",
            },
            Record::RemoveDir { slot: 2 },
            Record::CreateFile {
                slot: 1,
                gen: 5,
                dir: 0,
                name: "x",
            },
            Record::DeleteFile { slot: 1, gen: 5 },
            Record::RenameFile {
                slot: 1,
                gen: 5,
                dir: 2,
                name: "yy",
            },
            Record::SetSize {
                slot: 1,
                gen: 5,
                size: 77,
                tail_dirty: true,
                keep: 1,
                append: Segs::Slice(&segs),
            },
        ];
        let mut buf = vec![0u8; 4096];
        for (i, r) in recs.iter().enumerate() {
            buf.fill(0);
            let n = r.encode(42, i as u64 + 1, &mut buf);
            match parse_log_entry(&buf, 42, i as u64 + 1, 512) {
                LogEntry::Valid(d, padded) => {
                    assert_eq!(padded, n.div_ceil(512) * 512);
                    assert_eq!(format!("{:?}", d.kind()), format!("{:?}", r.kind()));
                    let mut b2 = vec![0u8; 4096];
                    assert_eq!(d.encode(42, i as u64 + 1, &mut b2), n);
                    assert_eq!(&b2[..n], &buf[..n]);
                }
                _ => panic!("record {i} did not parse"),
            }
            assert!(matches!(
                parse_log_entry(&buf, 42, i as u64 + 2, 512),
                LogEntry::End
            ));
            assert!(matches!(
                parse_log_entry(&buf, 43, i as u64 + 1, 512),
                LogEntry::End
            ));
            buf[n - 1] ^= 1;
            assert!(matches!(
                parse_log_entry(&buf, 42, i as u64 + 1, 512),
                LogEntry::End
            ));
        }
    }

    #[test]
    fn set_sizes_apply_every_entry_in_order_and_refuse_a_file_twice() {
        let g = geom();
        let mut st = MetaState::empty(&g);
        for (slot, name) in [(1, "a"), (2, "b")] {
            st.apply(&Record::CreateFile {
                slot,
                gen: slot,
                dir: 0,
                name,
            })
            .unwrap();
        }
        let m = g.meta_segments;
        let change = |slot: u32, size: u64, append: Vec<u32>| SizeChange {
            slot,
            gen: slot,
            size,
            keep: 0,
            append,
        };
        let both = [
            change(1, 100, vec![m]),
            change(2, 70_000, vec![m + 1, m + 2]),
        ];
        // Through the log encoding, as replay sees it.
        let mut buf = vec![0u8; 4096];
        Record::SetSizes(Changes::Slice(&both)).encode(7, 1, &mut buf);
        let LogEntry::Valid(rec, _) = parse_log_entry(&buf, 7, 1, 512) else {
            panic!("SET_SIZES did not parse");
        };
        st.apply(&rec).unwrap();
        assert_eq!(st.files[1].as_ref().unwrap().size, 100);
        assert_eq!(st.files[1].as_ref().unwrap().segs, vec![m]);
        assert_eq!(st.files[2].as_ref().unwrap().size, 70_000);
        assert_eq!(st.files[2].as_ref().unwrap().segs, vec![m + 1, m + 2]);
        assert_eq!(st.segmap.used_count(), 3);
        st.verify().unwrap();
        // A file twice in one record is refused.
        let twice = [change(1, 200, vec![]), change(1, 300, vec![])];
        assert!(st.apply(&Record::SetSizes(Changes::Slice(&twice))).is_err());
        assert_eq!(st.files[1].as_ref().unwrap().size, 100, "nothing applied");
        // A single entry is a SET_SIZE, never a SET_SIZES: such a record does not decode.
        let one = [change(2, 5, vec![])];
        buf.fill(0);
        Record::SetSizes(Changes::Slice(&one)).encode(7, 2, &mut buf);
        assert!(matches!(
            parse_log_entry(&buf, 7, 2, 512),
            LogEntry::Undecodable(_)
        ));
    }

    #[test]
    fn pick_free_wraps_and_prefers_hint() {
        let g = geom();
        let st = MetaState::empty(&g);
        let mut out = Vec::new();
        let last = g.total_segments - 1;
        assert!(st.segmap.pick_free(3, last, &mut out));
        assert_eq!(out, vec![last, g.meta_segments, g.meta_segments + 1]);
        out.clear();
        assert!(!st.segmap.pick_free(g.data_segments() + 1, 0, &mut out));
        assert!(out.is_empty());
    }
}
