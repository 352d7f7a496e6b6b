//! Shared test helpers and the core suite run against every device type.
#![allow(dead_code)]

use dds_fs::align::AlignedBuf;
use dds_fs::{format, Device, EntryKind, FileId, FileService, FormatConfig, FsError, OpenConfig};

pub const SEG: u64 = 64 << 10;

pub fn small_format() -> FormatConfig {
    FormatConfig {
        segment_size: SEG,
        max_files: 64,
        max_dirs: 8,
        max_name_len: 32,
        log_bytes: 64 << 10,
        fs_uuid: None,
    }
}

pub fn small_open() -> OpenConfig {
    OpenConfig {
        max_inflight: 64,
        max_io_bytes: 256 << 10,
        bounce_bytes: 2 << 20,
    }
}

/// Formats and opens.
pub fn fresh(mut dev: Box<dyn Device>, fcfg: FormatConfig, ocfg: OpenConfig) -> FileService {
    format(&mut *dev, fcfg).expect("format");
    FileService::open(dev, ocfg).expect("open")
}

/// Closes and reopens.
pub fn reopen(fs: FileService, ocfg: OpenConfig) -> FileService {
    let dev = fs.into_device();
    FileService::open(dev, ocfg).expect("reopen")
}

/// Polls until the op `ud` completes; other completions are returned in `others`.
pub fn wait_for(fs: &mut FileService, ud: u64) -> Result<u32, FsError> {
    let mut res = None;
    while res.is_none() {
        fs.wait().expect("wait");
        fs.poll(|u, r| {
            assert_eq!(u, ud, "unexpected completion");
            res = Some(r);
        });
    }
    res.unwrap()
}

/// Polls until every in-flight op completed; returns (user_data, result) in completion order.
pub fn drain(fs: &mut FileService) -> Vec<(u64, Result<u32, FsError>)> {
    let mut out = Vec::new();
    while fs.inflight() > 0 {
        fs.wait().expect("wait");
        fs.poll(|u, r| out.push((u, r)));
    }
    out
}

/// Synchronous write through the async API from an unaligned Vec (offset 1 inside it when
/// `misalign`).
pub fn write(fs: &mut FileService, id: FileId, off: u64, data: &[u8]) -> Result<u32, FsError> {
    unsafe { fs.submit_write(id, off, data.as_ptr(), data.len() as u32, 77)? };
    wait_for(fs, 77)
}

pub fn read(fs: &mut FileService, id: FileId, off: u64, len: u32) -> Result<Vec<u8>, FsError> {
    let mut buf = vec![0xeeu8; len as usize + 1];
    // use an odd address to force the bounce path
    let p = unsafe { buf.as_mut_ptr().add(1) };
    unsafe { fs.submit_read(id, off, p, len, 78)? };
    let n = wait_for(fs, 78)? as usize;
    Ok(buf[1..1 + n].to_vec())
}

/// Aligned (zero-copy) write.
pub fn write_aligned(
    fs: &mut FileService,
    id: FileId,
    off: u64,
    data: &[u8],
) -> Result<u32, FsError> {
    let mut b = AlignedBuf::new(data.len(), 4096);
    b.as_mut_slice().copy_from_slice(data);
    unsafe { fs.submit_write(id, off, b.as_ptr(), data.len() as u32, 79)? };
    wait_for(fs, 79)
}

/// Aligned (zero-copy) read.
pub fn read_aligned(
    fs: &mut FileService,
    id: FileId,
    off: u64,
    len: u32,
) -> Result<Vec<u8>, FsError> {
    let b = AlignedBuf::new(len as usize, 4096);
    unsafe { fs.submit_read(id, off, b.as_mut_ptr(), len, 80)? };
    let n = wait_for(fs, 80)? as usize;
    Ok(b.as_slice()[..n].to_vec())
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Metadata operations and their errors.
pub fn suite_metadata(dev: Box<dyn Device>) {
    let mut fs = fresh(dev, small_format(), small_open());
    assert_eq!(fs.list_dir("/").unwrap(), vec![]);
    fs.create_dir("/a").unwrap();
    fs.create_dir("b").unwrap();
    assert_eq!(fs.create_dir("/a"), Err(FsError::Exists));
    assert_eq!(fs.create_dir("/"), Err(FsError::Exists));
    assert_eq!(fs.create_dir("/x/y"), Err(FsError::InvalidPath));
    assert_eq!(fs.create_dir(""), Err(FsError::InvalidPath));
    assert_eq!(fs.create_dir(".."), Err(FsError::InvalidPath));
    assert_eq!(fs.create_dir(&"n".repeat(33)), Err(FsError::NameTooLong));
    let f1 = fs.create_file("/a/f1").unwrap();
    let r1 = fs.create_file("r1").unwrap();
    assert_eq!(fs.create_file("/a/f1"), Err(FsError::Exists));
    assert_eq!(
        fs.create_file("/a"),
        Err(FsError::Exists),
        "root namespace shared with dirs"
    );
    assert_eq!(fs.create_dir("r1"), Err(FsError::Exists));
    assert_eq!(fs.create_file("/zz/f"), Err(FsError::UnknownDir));
    assert_eq!(fs.create_file("/a/b/c"), Err(FsError::InvalidPath));
    assert_eq!(fs.create_file("/a/"), Err(FsError::InvalidPath));
    assert_eq!(fs.create_file("/a/x\0"), Err(FsError::InvalidPath));
    for bad in [
        "/a/x\ny",
        "/a/\x1b[31m",
        "/a/del\x7f",
        "/a/tab\t",
        "/e\u{1}/f",
    ] {
        assert_eq!(fs.create_file(bad), Err(FsError::InvalidPath), "{bad:?}");
    }
    assert_eq!(fs.create_dir("/d\r"), Err(FsError::InvalidPath));
    assert_eq!(
        fs.rename_file("/a/f1", "/a/f\x07"),
        Err(FsError::InvalidPath)
    );
    assert_eq!(fs.lookup("/a/f1").unwrap().id, f1);
    assert_eq!(fs.lookup("/r1").unwrap().id, r1);
    assert_eq!(fs.lookup("r1").unwrap().path, "/r1");
    assert_eq!(fs.lookup("/a/nope"), Err(FsError::NotFound));
    let st = fs.stat(f1).unwrap();
    assert_eq!(
        (st.path.as_str(), st.dir.as_str(), st.name.as_str(), st.size),
        ("/a/f1", "/a", "f1", 0)
    );
    let root = fs.list_dir("/").unwrap();
    let names: Vec<_> = root.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        names,
        vec![
            ("a", EntryKind::Dir),
            ("b", EntryKind::Dir),
            ("r1", EntryKind::File)
        ]
    );
    assert_eq!(fs.list_dir("/a").unwrap().len(), 1);
    assert_eq!(fs.list_dir("/q"), Err(FsError::UnknownDir));
    assert_eq!(fs.remove_dir("/a"), Err(FsError::NotEmpty));
    assert_eq!(fs.remove_dir("/q"), Err(FsError::UnknownDir));
    assert_eq!(fs.remove_dir("/"), Err(FsError::InvalidPath));
    // rename within and across directories
    fs.rename_file("/a/f1", "/b/g1").unwrap();
    assert_eq!(fs.stat(f1).unwrap().path, "/b/g1");
    assert_eq!(fs.rename_file("/b/g1", "/r1"), Err(FsError::Exists));
    assert_eq!(fs.rename_file("/b/nope", "/x"), Err(FsError::NotFound));
    assert_eq!(
        fs.rename_file("/b/g1", "/nodir/x"),
        Err(FsError::UnknownDir)
    );
    fs.rename_file("/b/g1", "/b/g1").unwrap();
    fs.remove_dir("/a").unwrap();
    assert_eq!(fs.list_dir("/a"), Err(FsError::UnknownDir));
    // stale ids
    fs.delete_file("/r1").unwrap();
    assert_eq!(fs.stat(r1), Err(FsError::UnknownFile));
    let r1b = fs.create_file("/r1").unwrap();
    assert_ne!(r1b, r1);
    assert_eq!(fs.stat(r1), Err(FsError::UnknownFile));
    assert_eq!(fs.stat(FileId(0xdead_beef)), Err(FsError::UnknownFile));
    assert_eq!(fs.resize(r1, 10), Err(FsError::UnknownFile));
    // limits
    for i in 0..8 {
        let r = fs.create_dir(&format!("d{i}"));
        if i < 7 {
            r.unwrap();
        } else {
            assert_eq!(r, Err(FsError::TooManyDirs));
        }
    }
    let mut n = fs.free_space().files;
    while n < 64 {
        fs.create_file(&format!("/d0/f{n}")).unwrap();
        n += 1;
    }
    assert_eq!(fs.create_file("/d0/over"), Err(FsError::TooManyFiles));
    let sp = fs.free_space();
    assert_eq!(
        (sp.files, sp.dirs, sp.max_files, sp.max_dirs),
        (64, 8, 64, 8)
    );
    fs.check_consistency().unwrap();
    // persistence
    let fs = reopen(fs, small_open());
    assert_eq!(fs.stat(f1).unwrap().path, "/b/g1");
    assert_eq!(fs.stat(r1b).unwrap().path, "/r1");
    assert_eq!(fs.free_space().files, 64);
    assert_eq!(fs.list_dirs().len(), 8);
    fs.check_consistency().unwrap();
}

/// Data path semantics.
pub fn suite_data(dev: Box<dyn Device>) {
    let mut fs = fresh(dev, small_format(), small_open());
    let bs = fs.block_size() as u64;
    let id = fs.create_file("/f").unwrap();
    // empty file: read at 0 completes with 0 bytes; beyond is OutOfRange
    assert_eq!(read(&mut fs, id, 0, 100).unwrap(), Vec::<u8>::new());
    let mut b = [0u8; 8];
    assert_eq!(
        unsafe { fs.submit_read(id, 1, b.as_mut_ptr(), 8, 1) },
        Err(FsError::OutOfRange)
    );
    // unaligned write extends the file
    let d1 = pattern(1, 3000);
    assert_eq!(write(&mut fs, id, 100, &d1).unwrap(), 3000);
    assert_eq!(fs.stat(id).unwrap().size, 3100);
    let got = read(&mut fs, id, 0, 3100).unwrap();
    assert!(got[..100].iter().all(|&x| x == 0));
    assert_eq!(&got[100..], &d1[..]);
    // read at EOF → 0; crossing EOF → short
    assert_eq!(read(&mut fs, id, 3100, 10).unwrap().len(), 0);
    assert_eq!(read(&mut fs, id, 3000, 500).unwrap(), d1[2900..].to_vec());
    let aoff = 3100 / bs * bs;
    let got = read_aligned(&mut fs, id, aoff, 4 * bs as u32).unwrap();
    assert_eq!(got.len() as u64, 3100 - aoff);
    let mut full = vec![0u8; 100];
    full.extend_from_slice(&d1);
    assert_eq!(&got[..], &full[aoff as usize..]);
    // aligned zero-copy write spanning a segment boundary
    let d2 = pattern(2, 3 * bs as usize);
    let off2 = SEG - bs;
    assert_eq!(
        write_aligned(&mut fs, id, off2, &d2).unwrap() as u64,
        3 * bs
    );
    assert_eq!(fs.stat(id).unwrap().size, off2 + 3 * bs);
    assert_eq!(read_aligned(&mut fs, id, off2, 3 * bs as u32).unwrap(), d2);
    assert_eq!(
        read(&mut fs, id, off2 + 1, 3 * bs as u32 - 2).unwrap(),
        d2[1..d2.len() - 1].to_vec()
    );
    // hole between is zero
    assert!(read(&mut fs, id, 3100, (off2 - 3100) as u32)
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    // unaligned write spanning two segment boundaries
    let d3 = pattern(3, (2 * SEG + 777) as usize);
    let off3 = SEG - 333;
    assert_eq!(write(&mut fs, id, off3, &d3).unwrap() as usize, d3.len());
    assert_eq!(read(&mut fs, id, off3, d3.len() as u32).unwrap(), d3);
    // partially overwrite inside one block, neighbours intact
    write(&mut fs, id, off3 + 10, &[1, 2, 3]).unwrap();
    let got = read(&mut fs, id, off3, 20).unwrap();
    assert_eq!(&got[..10], &d3[..10]);
    assert_eq!(&got[10..13], &[1, 2, 3]);
    assert_eq!(&got[13..], &d3[13..20]);
    // shrink then grow: the cut bytes read back as zeros
    let size = fs.stat(id).unwrap().size;
    fs.resize(id, 150).unwrap();
    assert_eq!(fs.stat(id).unwrap().allocated_bytes, SEG);
    fs.resize(id, size).unwrap();
    let got = read(&mut fs, id, 0, 4096).unwrap();
    assert_eq!(&got[100..150], &d1[..50]);
    assert!(got[150..].iter().all(|&x| x == 0));
    // append-style unaligned write after a shrink inside a block
    fs.resize(id, 1001).unwrap();
    write(&mut fs, id, 1001, &[9; 10]).unwrap();
    let got = read(&mut fs, id, 990, 100).unwrap();
    assert_eq!(got.len(), 21);
    assert_eq!(&got[11..], &[9; 10]);
    // errors at submit
    let max_io = fs.max_io_bytes();
    let big = vec![0u8; max_io as usize + 1];
    assert_eq!(
        unsafe { fs.submit_write(id, 0, big.as_ptr(), max_io + 1, 5) },
        Err(FsError::TooLarge)
    );
    let maxf = fs.max_file_size();
    assert_eq!(
        unsafe { fs.submit_write(id, maxf - 1, big.as_ptr(), 2, 5) },
        Err(FsError::OutOfRange)
    );
    assert_eq!(
        unsafe { fs.submit_write(id, u64::MAX, big.as_ptr(), 2, 5) },
        Err(FsError::OutOfRange)
    );
    assert_eq!(
        unsafe { fs.submit_write(FileId(7), 0, big.as_ptr(), 2, 5) },
        Err(FsError::UnknownFile)
    );
    assert_eq!(
        unsafe { fs.submit_write(id, 0, std::ptr::null(), 2, 5) },
        Err(FsError::InvalidArgument("null write buffer"))
    );
    assert_eq!(fs.resize(id, maxf + 1), Err(FsError::OutOfRange));
    // zero-length ops complete
    assert_eq!(write(&mut fs, id, 5, &[]).unwrap(), 0);
    // flush
    fs.submit_flush(9).unwrap();
    assert_eq!(wait_for(&mut fs, 9).unwrap(), 0);
    // NoSpace: fill the device
    let free = fs.free_space().free_bytes;
    let g = fs.create_file("/big").unwrap();
    assert_eq!(fs.resize(g, free + SEG), Err(FsError::NoSpace));
    fs.resize(g, free).unwrap();
    assert_eq!(fs.free_space().free_bytes, 0);
    let last = fs.stat(id).unwrap().allocated_bytes;
    assert_eq!(
        unsafe { fs.submit_write(id, last, big.as_ptr(), 10, 5) },
        Err(FsError::NoSpace)
    );
    assert_eq!(fs.stat(id).unwrap().allocated_bytes, last);
    fs.delete_file("/big").unwrap();
    assert_eq!(fs.free_space().free_bytes, free);
    fs.check_consistency().unwrap();
    // persistence of data and sizes
    let size = fs.stat(id).unwrap().size;
    let before = read(&mut fs, id, 0, size.min(200_000) as u32).unwrap();
    let mut fs = reopen(fs, small_open());
    assert_eq!(fs.stat(id).unwrap().size, size);
    assert_eq!(
        read(&mut fs, id, 0, size.min(200_000) as u32).unwrap(),
        before
    );
}

/// Many concurrent unaligned and aligned writes touching shared blocks apply in submission
/// order; completions may come in any order.
pub fn suite_concurrency(dev: Box<dyn Device>) {
    let mut fs = fresh(dev, small_format(), small_open());
    let id = fs.create_file("/c").unwrap();
    let bs = fs.block_size() as usize;
    let len = 8 * bs;
    let mut model = vec![0u8; len];
    fs.resize(id, len as u64).unwrap();
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut aligned: Vec<AlignedBuf> = Vec::new();
    let mut x = 12345u64;
    let mut rnd = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for round in 0..4 {
        for k in 0..24u64 {
            let ud = round * 100 + k;
            if rnd(4) == 0 {
                let blk = rnd(7) as usize;
                let mut b = AlignedBuf::new(bs, 4096);
                b.as_mut_slice().fill(ud as u8);
                model[blk * bs..(blk + 1) * bs].fill(ud as u8);
                unsafe {
                    fs.submit_write(id, (blk * bs) as u64, b.as_ptr(), bs as u32, ud)
                        .unwrap()
                };
                aligned.push(b);
            } else {
                let off = rnd(len as u64 - 1) as usize;
                let l = 1 + rnd((len - off).min(3 * bs) as u64) as usize;
                let b = vec![ud as u8; l];
                model[off..off + l].fill(ud as u8);
                unsafe {
                    fs.submit_write(id, off as u64, b.as_ptr(), l as u32, ud)
                        .unwrap()
                };
                bufs.push(b);
            }
        }
        let done = drain(&mut fs);
        assert_eq!(done.len(), 24);
        assert!(done.iter().all(|(_, r)| r.is_ok()), "{done:?}");
        assert_eq!(
            read(&mut fs, id, 0, len as u32).unwrap(),
            model,
            "round {round}"
        );
        bufs.clear();
        aligned.clear();
    }
    // Busy when the op table is full, then recovers.
    let max = fs.max_inflight();
    let b = [1u8; 10];
    let mut accepted = 0;
    let mut busy = false;
    for k in 0..max + 1 {
        match unsafe { fs.submit_write(id, 0, b.as_ptr(), 10, 1000 + u64::from(k)) } {
            Ok(()) => accepted += 1,
            Err(FsError::Busy) => {
                busy = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(busy && accepted <= max);
    assert_eq!(drain(&mut fs).len(), accepted as usize);
    // a shrink waits for in-flight writes of the file
    let b = vec![5u8; 3000];
    unsafe { fs.submit_write(id, 100, b.as_ptr(), 3000, 1).unwrap() };
    fs.resize(id, 50).unwrap();
    assert_eq!(drain(&mut fs), vec![(1, Ok(3000))]);
    assert_eq!(fs.stat(id).unwrap().size, 50);
    fs.check_consistency().unwrap();
}

/// All suites.
pub fn core_suite(make: &dyn Fn() -> Box<dyn Device>) {
    suite_metadata(make());
    suite_data(make());
    suite_concurrency(make());
}

pub mod model;
