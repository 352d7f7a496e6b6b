//! Metadata operations through the queue (`submit_meta` / `poll_meta`) on the metadata
//! thread, with data operations in flight: a delete or shrink waits for the file's I/O and
//! fences it, a grow never disturbs reads of other files, and every reported change is
//! durable (it survives a reopen).

mod common;

use common::*;
use dds_fs::{FileId, FileService, FsError, MemDevice, MetaDone, MetaOp};

fn service() -> FileService {
    // Reordering: operations execute at poll time, so reads stay in flight until polled.
    let dev = MemDevice::new(8 << 20, 512).with_reordering(99);
    let mut fs = fresh(Box::new(dev), small_format(), small_open());
    fs.start_meta_thread(|| {}).unwrap();
    fs
}

/// Polls metadata results until `ud` is reported (data completions are kept in `data`).
fn meta_result(
    fs: &mut FileService,
    ud: u64,
    data: &mut Vec<(u64, Result<u32, FsError>)>,
) -> Result<MetaDone, FsError> {
    let mut got = None;
    for _ in 0..1_000_000 {
        fs.poll(|u, r| data.push((u, r)));
        fs.poll_meta(|u, r| {
            assert_eq!(u, ud, "unexpected metadata completion");
            got = Some(r);
        });
        if let Some(r) = got {
            return r;
        }
        std::thread::yield_now();
    }
    panic!("metadata operation {ud} never finished");
}

#[test]
fn delete_waits_for_inflight_reads_and_fences_the_file() {
    let mut fs = service();
    let a = fs.create_file("/a").unwrap();
    let b = fs.create_file("/b").unwrap();
    let pattern: Vec<u8> = (0..SEG as usize).map(|i| (i % 251) as u8).collect();
    write(&mut fs, a, 0, &pattern).unwrap();
    write(&mut fs, b, 0, &pattern).unwrap();

    let mut buf_a = vec![0u8; 4096];
    let mut buf_b = vec![0u8; 4096];
    unsafe { fs.submit_read(a, 100, buf_a.as_mut_ptr(), 4096, 1).unwrap() };
    fs.submit_meta(MetaOp::DeleteFile { id: a }, 10);
    // The read of `a` is still in flight: the delete waits, and `a` takes no new I/O.
    assert!(fs.is_fenced(a));
    assert!(!fs.is_fenced(b));
    let mut other = vec![0u8; 16];
    assert_eq!(
        unsafe { fs.submit_read(a, 0, other.as_mut_ptr(), 16, 2) },
        Err(FsError::Busy)
    );
    // Another file is served meanwhile.
    unsafe { fs.submit_read(b, 200, buf_b.as_mut_ptr(), 4096, 3).unwrap() };
    let mut data = Vec::new();
    assert_eq!(meta_result(&mut fs, 10, &mut data), Ok(MetaDone::Done));
    data.extend(drain(&mut fs));
    data.sort_by_key(|d| d.0);
    assert_eq!(data, vec![(1, Ok(4096)), (3, Ok(4096))]);
    assert_eq!(&buf_a[..], &pattern[100..100 + 4096]);
    assert_eq!(&buf_b[..], &pattern[200..200 + 4096]);
    assert!(!fs.is_fenced(a));
    assert_eq!(fs.stat(a).unwrap_err(), FsError::UnknownFile);
    assert_eq!(fs.meta_pending(), 0);

    // Durable: a reopen sees exactly what was reported.
    let fs = reopen(fs, small_open());
    assert_eq!(fs.lookup("/a").unwrap_err(), FsError::NotFound);
    assert_eq!(fs.lookup("/b").unwrap().size, SEG);
    fs.check_consistency().unwrap();
}

#[test]
fn queued_operations_finish_in_order_and_survive_a_reopen() {
    let mut fs = service();
    let mut data = Vec::new();
    fs.submit_meta(MetaOp::CreateDir { path: "/d".into() }, 1);
    fs.submit_meta(
        MetaOp::CreateFile {
            path: "/d/x".into(),
        },
        2,
    );
    fs.submit_meta(
        MetaOp::CreateFile {
            path: "/d/x".into(),
        },
        3,
    );
    let mut results = Vec::new();
    while results.len() < 3 {
        fs.poll(|u, r| data.push((u, r)));
        fs.poll_meta(|u, r| results.push((u, r)));
        std::thread::yield_now();
    }
    assert_eq!(results[0], (1, Ok(MetaDone::Done)));
    let id = match results[1] {
        (2, Ok(MetaDone::Created(id))) => id,
        ref r => panic!("create reported {r:?}"),
    };
    assert_eq!(results[2], (3, Err(FsError::Exists)));

    // Grow (allocates and zeroes segments), then shrink with a tail, then delete.
    fs.submit_meta(
        MetaOp::Resize {
            id,
            size: 3 * SEG + 10,
        },
        4,
    );
    assert_eq!(meta_result(&mut fs, 4, &mut data), Ok(MetaDone::Done));
    let fill = vec![0xabu8; (3 * SEG) as usize];
    write(&mut fs, id, 0, &fill).unwrap();
    fs.submit_meta(MetaOp::Resize { id, size: SEG + 7 }, 5);
    assert_eq!(meta_result(&mut fs, 5, &mut data), Ok(MetaDone::Done));
    assert_eq!(fs.file_size(id).unwrap(), SEG + 7);
    // Growing again exposes zeros past the cut.
    fs.resize(id, 2 * SEG).unwrap();
    let back = read(&mut fs, id, SEG, SEG as u32).unwrap();
    assert!(back[..7].iter().all(|&x| x == 0xab));
    assert!(
        back[7..].iter().all(|&x| x == 0),
        "tail past the cut not zeroed"
    );
    assert!(data.is_empty());

    let fs = reopen(fs, small_open());
    let info = fs.lookup("/d/x").unwrap();
    assert_eq!((info.id, info.size), (id, 2 * SEG));
    fs.check_consistency().unwrap();
}

#[test]
fn extending_write_waits_for_the_job_in_flight() {
    let mut fs = service();
    let id = fs.create_file("/f").unwrap();
    let other: FileId = fs.create_file("/g").unwrap();
    // A grow of `g` goes to the metadata thread; an extending write of `f` right behind it
    // must not pick the same free segments.
    fs.submit_meta(
        MetaOp::Resize {
            id: other,
            size: 4 * SEG,
        },
        1,
    );
    let data = vec![5u8; (2 * SEG) as usize];
    write(&mut fs, id, 0, &data).unwrap();
    let mut done = Vec::new();
    assert_eq!(meta_result(&mut fs, 1, &mut done), Ok(MetaDone::Done));
    fs.check_consistency().unwrap();
    assert_eq!(read(&mut fs, id, 0, (2 * SEG) as u32).unwrap(), data);
    assert!(read(&mut fs, other, 0, (4 * SEG) as u32)
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    let fs = reopen(fs, small_open());
    fs.check_consistency().unwrap();
    assert_eq!(fs.lookup("/g").unwrap().size, 4 * SEG);
    assert_eq!(fs.lookup("/f").unwrap().size, 2 * SEG);
}
