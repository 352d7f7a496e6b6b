//! Extending writes on a real O_DIRECT device file through io_uring, with metadata commits on
//! the metadata thread: a write past the end of file parks until its size is durable, without
//! holding up the thread that drives the data path. The metadata handle's syncs wait at a
//! gate ([`SyncGate`]), so the tests decide when an extend's commit may finish.

mod common;

use common::*;
use dds_fs::{FileId, FileService, FsError, MetaDone, MetaOp, SyncGate, UringDevice};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

type Done = Vec<(u64, Result<u32, FsError>)>;

/// A formatted 8 MiB device file with gated metadata syncs, opened with the metadata thread.
fn gated_service(dir: &Path) -> (FileService, Arc<SyncGate>) {
    let path = dir.join("dev");
    UringDevice::create_file(&path, 8 << 20).unwrap();
    let gate = SyncGate::new();
    let dev = UringDevice::open(&path, 32)
        .unwrap()
        .with_meta_gate(gate.clone());
    let mut fs = fresh(Box::new(dev), small_format(), small_open());
    fs.start_meta_thread(|| {}).unwrap();
    (fs, gate)
}

/// A gated service with files `/x` and `/y`, `/y` holding `y_bytes` bytes (returned).
fn two_files(dir: &Path, y_bytes: u64) -> (FileService, Arc<SyncGate>, FileId, FileId, Vec<u8>) {
    let (mut fs, gate) = gated_service(dir);
    let x = fs.create_file("/x").unwrap();
    let y = fs.create_file("/y").unwrap();
    let content = pattern(1, y_bytes as usize);
    if y_bytes > 0 {
        write(&mut fs, y, 0, &content).unwrap();
    }
    (fs, gate, x, y, content)
}

/// Opens the gate after `limit` unless told not to: a data path blocked behind the gated
/// sync would otherwise hang the test instead of failing it. Returns (cancel, fired).
fn watchdog(gate: &Arc<SyncGate>, limit: Duration) -> (mpsc::Sender<()>, Arc<AtomicBool>) {
    let (tx, rx) = mpsc::channel::<()>();
    let fired = Arc::new(AtomicBool::new(false));
    let (g, f) = (gate.clone(), fired.clone());
    std::thread::spawn(move || {
        if rx.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
            f.store(true, Ordering::SeqCst);
            g.open();
        }
    });
    (tx, fired)
}

/// Holds a commit: closes the gate and appends 100 bytes to `x` (user data 1), whose extend
/// then waits at the gate in its sync; what is submitted next queues behind it. Returns the
/// watchdog's cancel and the data (to keep until the append completed).
fn hold_a_commit(
    fs: &mut FileService,
    gate: &Arc<SyncGate>,
    x: FileId,
) -> (mpsc::Sender<()>, Vec<u8>) {
    gate.close();
    let (cancel, _fired) = watchdog(gate, Duration::from_secs(30));
    let data = pattern(0x4e1d, 100);
    submit(fs, x, 0, &data, 1);
    assert!(
        gate.wait_held(1, Duration::from_secs(10)),
        "the extend's commit never reached its sync"
    );
    (cancel, data)
}

/// Opens the gate for good.
fn let_go(gate: &SyncGate, cancel: mpsc::Sender<()>) {
    gate.open();
    let _ = cancel.send(());
}

/// Polls without blocking until `n` more completions are in `out` (false after `within`).
fn poll_for(fs: &mut FileService, out: &mut Done, n: usize, within: Duration) -> bool {
    let want = out.len() + n;
    let end = Instant::now() + within;
    while out.len() < want {
        if Instant::now() > end {
            return false;
        }
        if fs.poll(|u, r| out.push((u, r))) == 0 {
            std::thread::yield_now();
        }
    }
    true
}

/// Polls data and metadata until metadata operation `ud` is reported.
fn meta_result(fs: &mut FileService, ud: u64, data: &mut Done) -> Result<MetaDone, FsError> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut got = None;
    while got.is_none() {
        assert!(
            Instant::now() < end,
            "metadata operation {ud} never finished"
        );
        fs.poll(|u, r| data.push((u, r)));
        fs.poll_meta(|u, r| {
            assert_eq!(u, ud, "unexpected metadata completion");
            got = Some(r);
        });
        std::thread::yield_now();
    }
    got.unwrap()
}

fn result_of(done: &Done, ud: u64) -> Result<u32, FsError> {
    let hits: Vec<_> = done.iter().filter(|d| d.0 == ud).collect();
    assert_eq!(hits.len(), 1, "completions of {ud}: {done:?}");
    hits[0].1.clone()
}

/// The first `len` bytes of a file, read in pieces below the largest I/O.
fn read_all(fs: &mut FileService, id: FileId, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        let n = (len - out.len() as u64).min(128 << 10) as u32;
        out.extend(read(fs, id, out.len() as u64, n).unwrap());
    }
    out
}

/// Submits a write of `data` (kept alive by the caller until its completion).
fn submit(fs: &mut FileService, id: FileId, off: u64, data: &[u8], ud: u64) {
    // SAFETY: every caller keeps `data` until the completion for `ud` was polled.
    unsafe { fs.submit_write(id, off, data.as_ptr(), data.len() as u32, ud) }.unwrap();
}

#[test]
fn reads_and_writes_of_another_file_flow_while_an_extend_commit_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fs, gate, a, b, content) = two_files(dir.path(), 4 * SEG);

    gate.close();
    let (cancel, fired) = watchdog(&gate, Duration::from_secs(30));
    // Appends to `a`: the first one's extend goes to the metadata thread and waits at the gate
    // in its sync; the others park behind it.
    let appends: Vec<Vec<u8>> = (0..8)
        .map(|k| pattern(100 + k, 3000 + 700 * k as usize))
        .collect();
    let mut end = 0u64;
    for (k, d) in appends.iter().enumerate() {
        submit(&mut fs, a, end, d, 1000 + k as u64);
        end += d.len() as u64;
    }
    assert!(
        gate.wait_held(1, Duration::from_secs(10)),
        "the extend's commit never reached its sync"
    );

    // The data-path thread is free meanwhile: rounds of reads of `b` at depth 32, and a
    // write of `b` within its size, complete while the commit is held.
    let mut done = Done::new();
    let mut bufs = vec![vec![0u8; 4096]; 32];
    let mut x = 7u64;
    let mut slowest = Duration::ZERO;
    for _round in 0..20 {
        let t = Instant::now();
        let mut offs = Vec::new();
        for (k, buf) in bufs.iter_mut().enumerate() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) % (4 * SEG - 4096);
            offs.push(off);
            // SAFETY: `buf` is not touched until this round's completions were polled.
            unsafe { fs.submit_read(b, off, buf.as_mut_ptr(), 4096, k as u64) }.unwrap();
        }
        let mut round = Done::new();
        assert!(
            poll_for(&mut fs, &mut round, 32, Duration::from_secs(10)),
            "reads of another file stalled behind the extend's commit: {round:?}"
        );
        slowest = slowest.max(t.elapsed());
        for (u, r) in round {
            assert_eq!(r, Ok(4096), "read {u}");
            let off = offs[u as usize] as usize;
            assert_eq!(bufs[u as usize], content[off..off + 4096], "read {u}");
        }
    }
    let patch = pattern(9, 5000);
    submit(&mut fs, b, 12_345, &patch, 50);
    assert!(poll_for(&mut fs, &mut done, 1, Duration::from_secs(10)));
    assert_eq!(done, vec![(50, Ok(5000))]);
    // `a` still has its durable size: nothing of the appends is visible, and a read past it
    // is out of range (its range reads once the size is durable).
    assert_eq!(gate.held(), 1, "the commit is still held");
    assert!(
        !fired.load(Ordering::SeqCst),
        "the watchdog opened the gate"
    );
    assert_eq!(fs.file_size(a).unwrap(), 0);
    let mut small = [0u8; 16];
    assert_eq!(
        unsafe { fs.submit_read(a, 10, small.as_mut_ptr(), 16, 60) },
        Err(FsError::OutOfRange)
    );
    done.clear();
    fs.poll(|u, r| done.push((u, r)));
    assert!(
        done.is_empty(),
        "an append completed before its size was durable"
    );
    eprintln!("slowest round of 32 reads while an extend commit was held: {slowest:?}");

    let_go(&gate, cancel);
    done.extend(drain(&mut fs));
    for (k, d) in appends.iter().enumerate() {
        assert_eq!(result_of(&done, 1000 + k as u64), Ok(d.len() as u32));
    }
    let all: Vec<u8> = appends.concat();
    assert_eq!(fs.file_size(a).unwrap(), end);
    assert_eq!(read(&mut fs, a, 0, end as u32).unwrap(), all);

    let mut fs = reopen(fs, small_open());
    fs.check_consistency().unwrap();
    assert_eq!(fs.file_size(a).unwrap(), end);
    assert_eq!(read(&mut fs, a, 0, end as u32).unwrap(), all);
    let mut want = content.clone();
    want[12_345..12_345 + 5000].copy_from_slice(&patch);
    assert_eq!(read(&mut fs, b, 0, (4 * SEG) as u32).unwrap(), want);
}

#[test]
fn waiting_appends_share_one_commit_read_back_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fs, gate) = gated_service(dir.path());
    let f = fs.create_file("/log").unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut ud = 0u64;
    for burst in 0..6u64 {
        gate.close();
        let (cancel, _fired) = watchdog(&gate, Duration::from_secs(30));
        let before = gate.passed();
        // 16 appends, unaligned sizes (neighbours share blocks), one burst crossing segments.
        let datas: Vec<Vec<u8>> = (0..16u64)
            .map(|k| {
                pattern(
                    burst * 100 + k,
                    (1 + (k * 7919 + burst * 104_729) % 9000) as usize,
                )
            })
            .collect();
        let mut ends = Vec::new();
        for d in &datas {
            submit(&mut fs, f, model.len() as u64, d, ud);
            ud += 1;
            model.extend_from_slice(d);
            ends.push(model.len() as u64);
        }
        assert!(gate.wait_held(1, Duration::from_secs(10)));
        let_go(&gate, cancel);
        let done = drain(&mut fs);
        assert_eq!(done.len(), 16);
        for (u, r) in &done {
            let k = (u - (ud - 16)) as usize;
            assert_eq!(*r, Ok(datas[k].len() as u32), "append {u}");
        }
        // The first append's extend, then one for the fifteen that waited behind it: two
        // commits of at most two syncs each (new segments zeroed, then the record), and maybe
        // a checkpoint's.
        let syncs = gate.passed() - before;
        assert!(
            syncs <= 6,
            "burst {burst}: {syncs} metadata syncs for 16 appends"
        );
        assert_eq!(fs.file_size(f).unwrap(), model.len() as u64);
        fs.submit_flush(u64::MAX).unwrap();
        assert_eq!(wait_for(&mut fs, u64::MAX), Ok(0));
    }
    let back = read_all(&mut fs, f, model.len() as u64);
    assert!(back == model, "appended data reads back");
    let mut fs = reopen(fs, small_open());
    fs.check_consistency().unwrap();
    assert_eq!(fs.file_size(f).unwrap(), model.len() as u64);
    let back = read_all(&mut fs, f, model.len() as u64);
    assert!(back == model, "appended data survives a reopen");
}

#[test]
fn waiting_writes_that_do_not_fit_complete_with_no_space() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fs, gate, x, y, _) = two_files(dir.path(), 0);
    let fill = fs.create_file("/fill").unwrap();
    // Two free segments: one for `x`, one for `y`.
    let free = fs.free_space().free_bytes;
    fs.resize(fill, free - 2 * SEG).unwrap();

    let (cancel, _dx) = hold_a_commit(&mut fs, &gate, x);
    // Behind `x`'s commit: three appends of `y`; the first two fit in the last free segment.
    let d1 = pattern(2, 40_000);
    let d2 = pattern(3, 20_000);
    let d3 = pattern(4, 80_000);
    submit(&mut fs, y, 0, &d1, 2);
    submit(&mut fs, y, 40_000, &d2, 3);
    submit(&mut fs, y, 60_000, &d3, 4);
    let_go(&gate, cancel);
    let done = drain(&mut fs);
    assert_eq!(result_of(&done, 1), Ok(100));
    assert_eq!(result_of(&done, 2), Ok(40_000));
    assert_eq!(result_of(&done, 3), Ok(20_000));
    assert_eq!(result_of(&done, 4), Err(FsError::NoSpace));
    assert_eq!(fs.file_size(y).unwrap(), 60_000);
    assert_eq!(fs.free_space().free_bytes, 0);
    // With nothing queued the refusal is the submit's own error.
    let more = pattern(5, 10);
    assert_eq!(
        unsafe { fs.submit_write(y, SEG, more.as_ptr(), 10, 5) },
        Err(FsError::NoSpace)
    );
    let back = read(&mut fs, y, 0, 60_000).unwrap();
    assert!(back == [d1, d2].concat());
    let fs = reopen(fs, small_open());
    fs.check_consistency().unwrap();
    assert_eq!(fs.file_size(y).unwrap(), 60_000);
    assert_eq!(fs.file_size(x).unwrap(), 100);
}

#[test]
fn a_delete_queued_ahead_refuses_the_writes_parked_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fs, gate, x, y, _) = two_files(dir.path(), 8192);

    let (cancel, _dx) = hold_a_commit(&mut fs, &gate, x);
    fs.submit_meta(MetaOp::DeleteFile { id: y }, 100);
    // An append of `y` parks (its extend queues behind the delete); a write within `y`'s size
    // that shares a block with it waits behind it.
    let dw = pattern(3, 1000);
    let dn = pattern(4, 50);
    submit(&mut fs, y, 8192 - 10, &dw, 2);
    submit(&mut fs, y, 8192 - 300, &dn, 3);
    assert!(!fs.is_fenced(y), "the delete has not started");
    let_go(&gate, cancel);
    let mut done = Done::new();
    assert_eq!(meta_result(&mut fs, 100, &mut done), Ok(MetaDone::Done));
    done.extend(drain(&mut fs));
    assert_eq!(result_of(&done, 1), Ok(100));
    assert_eq!(result_of(&done, 2), Err(FsError::UnknownFile));
    assert_eq!(result_of(&done, 3), Ok(50));
    assert_eq!(fs.stat(y).unwrap_err(), FsError::UnknownFile);
    let fs = reopen(fs, small_open());
    fs.check_consistency().unwrap();
    assert_eq!(fs.lookup("/y").unwrap_err(), FsError::NotFound);
    assert_eq!(fs.lookup("/x").unwrap().size, 100);
}

#[test]
fn a_shrink_queued_ahead_lets_the_parked_writes_in_first() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fs, gate, x, y, content) = two_files(dir.path(), 2 * SEG);

    let (cancel, _dx) = hold_a_commit(&mut fs, &gate, x);
    fs.submit_meta(
        MetaOp::Resize {
            id: y,
            size: SEG / 2,
        },
        100,
    );
    // The shrink must drain `y`'s writes, among them one parked behind it and one waiting
    // for that: the parked write's extend commits first (with `y` fenced), then the shrink.
    let dw = pattern(3, 1000);
    let dn = pattern(4, 100);
    submit(&mut fs, y, 2 * SEG - 10, &dw, 2);
    submit(&mut fs, y, 2 * SEG - 300, &dn, 3);
    let_go(&gate, cancel);
    let mut done = Done::new();
    assert_eq!(meta_result(&mut fs, 100, &mut done), Ok(MetaDone::Done));
    done.extend(drain(&mut fs));
    assert_eq!(result_of(&done, 1), Ok(100));
    assert_eq!(result_of(&done, 2), Ok(1000));
    assert_eq!(result_of(&done, 3), Ok(100));
    assert!(!fs.is_fenced(y));
    assert_eq!(fs.file_size(y).unwrap(), SEG / 2);
    assert_eq!(
        read(&mut fs, y, 0, (SEG / 2) as u32).unwrap(),
        content[..(SEG / 2) as usize]
    );
    // Growing again shows zeros past the cut.
    fs.resize(y, 2 * SEG).unwrap();
    let tail = read(&mut fs, y, SEG / 2, (SEG + SEG / 2) as u32).unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    let fs = reopen(fs, small_open());
    fs.check_consistency().unwrap();
    assert_eq!(fs.file_size(y).unwrap(), 2 * SEG);
}

#[test]
fn appends_to_several_files_waiting_together_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fs, gate, x, _y, _) = two_files(dir.path(), 0);
    let files: Vec<FileId> = (0..6)
        .map(|k| fs.create_file(&format!("/f{k}")).unwrap())
        .collect();
    let (cancel, _dx) = hold_a_commit(&mut fs, &gate, x);
    let before = gate.passed();
    // While `x`'s extend is held, each file gets an append (one crossing into a second
    // segment): six extends queue, one per file.
    let datas: Vec<Vec<u8>> = (0..6)
        .map(|k| {
            pattern(
                70 + k,
                if k == 2 {
                    SEG as usize + 3000
                } else {
                    5000 + 300 * k as usize
                },
            )
        })
        .collect();
    for (k, (f, d)) in files.iter().zip(&datas).enumerate() {
        submit(&mut fs, *f, 0, d, 10 + k as u64);
    }
    let_go(&gate, cancel);
    let done = drain(&mut fs);
    assert_eq!(result_of(&done, 1), Ok(100));
    for (k, d) in datas.iter().enumerate() {
        assert_eq!(
            result_of(&done, 10 + k as u64),
            Ok(d.len() as u32),
            "append {k}"
        );
    }
    // `x`'s commit (its record's sync, already held when counting began, and maybe a
    // checkpoint's), then one commit for all six: new segments zeroed and synced, the
    // record synced. One commit per file would take at least twelve syncs.
    let syncs = gate.passed() - before;
    assert!(syncs <= 4, "{syncs} metadata syncs for six files' appends");
    for (f, d) in files.iter().zip(&datas) {
        assert_eq!(fs.file_size(*f).unwrap(), d.len() as u64);
        assert_eq!(read_all(&mut fs, *f, d.len() as u64), *d);
    }
    // The group commit is one log record; a reopen replays it.
    let mut fs = reopen(fs, small_open());
    fs.check_consistency().unwrap();
    for (f, d) in files.iter().zip(&datas) {
        assert_eq!(fs.file_size(*f).unwrap(), d.len() as u64);
        assert_eq!(read_all(&mut fs, *f, d.len() as u64), *d);
    }
    assert_eq!(fs.file_size(x).unwrap(), 100);
}
