//! Model-based property test: random sequences of metadata and data operations (unaligned
//! offsets, segment-spanning and concurrent overlapping writes, reopen) on a reordering
//! in-memory device, checked against a plain in-memory model.

mod common;

use common::*;
use dds_fs::align::AlignedBuf;
use dds_fs::{FileId, FileService, FormatConfig, FsError, MemDevice, OpenConfig};
use proptest::prelude::*;
use std::collections::BTreeMap;

const SEGMENT: u64 = 4096;
const MAX_SIZE: u64 = 5 * SEGMENT + 300;

#[derive(Debug, Clone)]
enum Step {
    Create(u8),
    Delete(u8),
    Rename(u8, u8),
    Resize(u8, u64),
    /// Concurrent writes: (file, offset, len, aligned buffer)
    Writes(Vec<(u8, u64, u32, bool)>),
    Read(u8, u64, u32, bool),
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0u8..6).prop_map(Step::Create),
        1 => (0u8..6).prop_map(Step::Delete),
        1 => (0u8..6, 0u8..6).prop_map(|(a, b)| Step::Rename(a, b)),
        2 => (0u8..6, 0..MAX_SIZE).prop_map(|(a, n)| Step::Resize(a, n)),
        5 => prop::collection::vec(
            (0u8..6, 0..MAX_SIZE, 1u32..9000, any::<bool>()).prop_map(|(f, o, l, a)| {
                if a {
                    // block-aligned offset and length for the zero-copy path
                    (f, o / 512 * 512, (l / 512).max(1) * 512, true)
                } else {
                    (f, o, l, false)
                }
            }),
            1..6
        )
        .prop_map(Step::Writes),
        3 => (0u8..6, 0..MAX_SIZE, 1u32..12000, any::<bool>()).prop_map(|(f, o, l, a)| Step::Read(f, o, l, a)),
        1 => Just(Step::Reopen),
    ]
}

fn name(i: u8) -> String {
    // files 0-2 in the root, 3-5 in /d
    if i < 3 {
        format!("/f{i}")
    } else {
        format!("/d/f{i}")
    }
}

fn ocfg() -> OpenConfig {
    OpenConfig {
        max_inflight: 16,
        max_io_bytes: 16 << 10,
        bounce_bytes: 64 << 10,
    }
}

fn run(steps: Vec<Step>, seed: u64, block: u32) -> Result<(), TestCaseError> {
    let size = if block == 512 { 192 << 10 } else { 320 << 10 };
    let dev = MemDevice::new(size, block)
        .with_reordering(seed)
        .with_queue_depth(8);
    let fcfg = FormatConfig {
        segment_size: SEGMENT,
        max_files: 8,
        max_dirs: 2,
        max_name_len: 8,
        log_bytes: 0,
        fs_uuid: Some(seed),
    };
    let mut fs = fresh(Box::new(dev), fcfg, ocfg());
    if seed & 2 != 0 {
        // Half the cases commit metadata on the metadata thread.
        fs.start_meta_thread(|| {}).unwrap();
    }
    fs.create_dir("/d").unwrap();
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in [0, 1, 3, 4] {
        fs.create_file(&name(i)).unwrap();
        model.insert(name(i), Vec::new());
    }
    let free_segs = |fs: &FileService| u64::from(fs.free_space().free_segments);
    let id = |fs: &FileService, p: &str| -> Option<FileId> { fs.lookup(p).ok().map(|i| i.id) };
    for (k, st) in steps.into_iter().enumerate() {
        match st {
            Step::Create(i) => {
                let r = fs.create_file(&name(i));
                if let std::collections::btree_map::Entry::Vacant(e) = model.entry(name(i)) {
                    r.unwrap();
                    e.insert(Vec::new());
                } else {
                    prop_assert_eq!(r, Err(FsError::Exists));
                }
            }
            Step::Delete(i) => {
                let r = fs.delete_file(&name(i));
                if model.remove(&name(i)).is_some() {
                    r.unwrap();
                } else {
                    prop_assert_eq!(r, Err(FsError::NotFound));
                }
            }
            Step::Rename(a, b) => {
                let r = fs.rename_file(&name(a), &name(b));
                if !model.contains_key(&name(a)) {
                    prop_assert_eq!(r, Err(FsError::NotFound));
                } else if a == b {
                    r.unwrap();
                } else if model.contains_key(&name(b)) {
                    prop_assert_eq!(r, Err(FsError::Exists));
                } else {
                    r.unwrap();
                    let d = model.remove(&name(a)).unwrap();
                    model.insert(name(b), d);
                }
            }
            Step::Resize(i, n) => {
                let Some(fid) = id(&fs, &name(i)) else {
                    continue;
                };
                let cur = model[&name(i)].len() as u64;
                let need = n.div_ceil(SEGMENT).saturating_sub(cur.div_ceil(SEGMENT));
                let free = free_segs(&fs);
                let r = fs.resize(fid, n);
                if need > free {
                    prop_assert_eq!(r, Err(FsError::NoSpace));
                } else {
                    r.unwrap();
                    model.get_mut(&name(i)).unwrap().resize(n as usize, 0);
                }
            }
            Step::Writes(ws) => {
                let mut plain: Vec<Vec<u8>> = Vec::new();
                let mut aligned: Vec<AlignedBuf> = Vec::new();
                let mut submitted = 0;
                for (j, (i, off, len, al)) in ws.into_iter().enumerate() {
                    let Some(fid) = id(&fs, &name(i)) else {
                        continue;
                    };
                    let data = pattern((k * 16 + j) as u64, len as usize);
                    let cur = model[&name(i)].len() as u64;
                    let end = off + u64::from(len);
                    let need = end.div_ceil(SEGMENT).saturating_sub(cur.div_ceil(SEGMENT));
                    let ptr = if al {
                        let mut b = AlignedBuf::new(len as usize, 512);
                        b.as_mut_slice().copy_from_slice(&data);
                        let p = b.as_ptr();
                        aligned.push(b);
                        p
                    } else {
                        plain.push(data.clone());
                        plain.last().unwrap().as_ptr()
                    };
                    let free = free_segs(&fs);
                    let r = unsafe { fs.submit_write(fid, off, ptr, len, j as u64) };
                    if end > cur && need > free {
                        prop_assert_eq!(r, Err(FsError::NoSpace));
                        continue;
                    }
                    r.unwrap();
                    submitted += 1;
                    let f = model.get_mut(&name(i)).unwrap();
                    if (f.len() as u64) < end {
                        f.resize(end as usize, 0);
                    }
                    f[off as usize..end as usize].copy_from_slice(&data);
                }
                let done = drain(&mut fs);
                prop_assert_eq!(done.len(), submitted);
                for (ud, r) in done {
                    prop_assert!(r.is_ok(), "write {} failed: {:?}", ud, r);
                }
            }
            Step::Read(i, off, len, al) => {
                let Some(fid) = id(&fs, &name(i)) else {
                    continue;
                };
                let m = &model[&name(i)];
                let r = if al {
                    read_aligned(&mut fs, fid, off / 512 * 512, (len / 512).max(1) * 512)
                } else {
                    read(&mut fs, fid, off, len)
                };
                let (off, len) = if al {
                    (off / 512 * 512, (len / 512).max(1) * 512)
                } else {
                    (off, len)
                };
                if off > m.len() as u64 {
                    prop_assert_eq!(r, Err(FsError::OutOfRange));
                } else {
                    let end = (off + u64::from(len)).min(m.len() as u64) as usize;
                    prop_assert_eq!(r.unwrap(), m[off as usize..end].to_vec());
                }
            }
            Step::Reopen => fs = reopen(fs, ocfg()),
        }
        fs.check_consistency()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(fs.inflight(), 0);
    }
    // Final full comparison, after a reopen.
    let mut fs = reopen(fs, ocfg());
    for (p, data) in &model {
        let info = fs.lookup(p).unwrap();
        prop_assert_eq!(info.size, data.len() as u64);
        let mut got = Vec::new();
        let mut off = 0u64;
        while off < info.size {
            let n = (info.size - off).min(16 << 10) as u32;
            got.extend(read(&mut fs, info.id, off, n).unwrap());
            off += u64::from(n);
        }
        prop_assert!(&got == data, "content of {} differs", p);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn matches_model(steps in prop::collection::vec(step(), 5..50), seed in 1u64..u64::MAX) {
        run(steps, seed, 512)?;
    }

    #[test]
    fn matches_model_4k_blocks(steps in prop::collection::vec(step(), 5..40), seed in 1u64..u64::MAX) {
        run(steps, seed, 4096)?;
    }
}
