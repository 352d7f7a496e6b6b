use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use dds_shm::SharedRegion;
use dds_sys::{recv_with_fds, send_with_fds};
use proptest::prelude::*;

use super::*;

/// The region as the host exports it to the engine.
fn export(region: &SharedRegion) -> RegionExport {
    RegionExport::memfd(region.export_fd().unwrap(), region.len() as u64)
}

fn host_write(region: &SharedRegion, offset: usize, bytes: &[u8]) {
    assert!(offset + bytes.len() <= region.len());
    // SAFETY: in bounds; no DMA is in flight in these tests while the host writes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), region.as_ptr().add(offset), bytes.len())
    }
}

fn host_read(region: &SharedRegion, offset: usize, len: usize) -> Vec<u8> {
    assert!(offset + len <= region.len());
    let mut v = vec![0u8; len];
    // SAFETY: in bounds; no DMA is in flight while the host reads.
    unsafe { std::ptr::copy_nonoverlapping(region.as_ptr().add(offset), v.as_mut_ptr(), len) }
    v
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn setup(
    len: usize,
    depth: usize,
    cost: Option<CostModel>,
) -> (SharedRegion, EmulatedDma, RegionId) {
    let region = SharedRegion::create("dds-dma-test", len).unwrap();
    let mut dma = EmulatedDma::new(depth, cost);
    let id = dma.register_region(export(&region)).unwrap().id;
    (region, dma, id)
}

#[test]
fn local_buf_is_aligned_and_zeroed() {
    for align in [8usize, 64, 512, 4096] {
        let mut b = LocalBuf::new(10_000, align);
        assert_eq!(b.as_ptr() as usize % align, 0);
        assert_eq!(b.len(), 10_000);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[9_999] = 7;
        assert_eq!(b.as_slice()[9_999], 7);
    }
    let empty = LocalBuf::new(0, 64);
    assert!(empty.is_empty());
    assert!(empty.as_slice().is_empty());
}

#[test]
fn shared_region_is_zeroed_and_aligned() {
    let r = SharedRegion::create("t", 12_345).unwrap();
    assert_eq!(r.len(), 12_345);
    assert_eq!(r.as_ptr() as usize % 64, 0);
    assert!(host_read(&r, 0, r.len()).iter().all(|&x| x == 0));
    assert!(SharedRegion::create("t", 0).is_err());
}

#[test]
fn read_and_write_round_trip() {
    let (region, mut dma, id) = setup(8192, 8, None);
    let data = pattern(1000, 3);
    host_write(&region, 100, &data);
    let mut local = LocalBuf::new(1000, 8);
    // SAFETY: `local` outlives the op and is not touched until completion.
    unsafe {
        run_sync(
            &mut dma,
            &[DmaOp::read(id, 100, local.as_mut_ptr(), 1000, 1)],
        )
        .unwrap()
    };
    assert_eq!(local.as_slice(), &data[..]);

    local.as_mut_slice().reverse();
    // SAFETY: as above.
    unsafe { run_sync(&mut dma, &[DmaOp::write(id, 5000, local.as_ptr(), 1000, 2)]).unwrap() };
    let mut expect = data.clone();
    expect.reverse();
    assert_eq!(host_read(&region, 5000, 1000), expect);
    let s = dma.stats();
    assert_eq!(
        (s.reads, s.writes, s.bytes_read, s.bytes_written),
        (1, 1, 1000, 1000)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn copies_with_ragged_edges(offset in 0usize..64, len in 0usize..300, local_off in 0usize..16) {
        let (region, mut dma, id) = setup(4096, 4, None);
        let data = pattern(len, offset as u8);
        host_write(&region, offset, &data);
        let local = LocalBuf::new(len + 16, 8);
        // SAFETY: the target range lies within `local`.
        unsafe {
            let p = local.as_mut_ptr().add(local_off);
            run_sync(&mut dma, &[DmaOp::read(id, offset as u64, p, len as u32, 0)]).unwrap();
        }
        prop_assert_eq!(&local.as_slice()[local_off..local_off + len], &data[..]);
        // And back, shifted by 1000 bytes.
        // SAFETY: as above.
        unsafe {
            let p = local.as_mut_ptr().add(local_off);
            run_sync(&mut dma, &[DmaOp::write(id, 1000 + offset as u64, p, len as u32, 0)]).unwrap();
        }
        prop_assert_eq!(host_read(&region, 1000 + offset, len), data);
        // Bytes around the written range are untouched.
        if offset > 0 {
            prop_assert_eq!(host_read(&region, 999 + offset, 1), vec![0]);
        }
        prop_assert_eq!(host_read(&region, 1000 + offset + len, 1), vec![0]);
    }
}

/// The engine counts the time its copies take (`execute_ns`), with or without the cost model:
/// nothing before an operation completes, more for 64 MiB moved than for 8 bytes.
#[test]
fn execution_time_is_counted() {
    for cost in [None, Some(CostModel::bluefield2())] {
        let (_region, mut dma, id) = setup(1 << 20, 8, cost);
        let local = LocalBuf::new(1 << 20, 64);
        // SAFETY: `local` outlives the operation, which completes only in `run_sync` below.
        unsafe {
            dma.post(DmaOp::read(id, 0, local.as_mut_ptr(), 8, 0))
                .unwrap()
        };
        dma.submit();
        if cost.is_some() {
            // While it is not due (a loaded machine may let it fall due already): nothing
            // executed, nothing counted.
            let mut out = vec![DmaCompletion::default(); 4];
            if dma.poll(&mut out) == 0 {
                assert_eq!(dma.stats().execute_ns, 0);
            }
        }
        while dma.outstanding() > 0 {
            let mut out = vec![DmaCompletion::default(); 4];
            dma.poll(&mut out);
        }
        let small = dma.stats().execute_ns;
        let t = Instant::now();
        for k in 0..64u64 {
            let op = if k % 2 == 0 {
                DmaOp::read(id, 0, local.as_mut_ptr(), 1 << 20, k)
            } else {
                DmaOp::write(id, 0, local.as_ptr(), 1 << 20, k)
            };
            // SAFETY: as above.
            unsafe { run_sync(&mut dma, &[op]).unwrap() };
        }
        let elapsed = t.elapsed().as_nanos() as u64;
        let big = dma.stats().execute_ns - small;
        assert!(big > small, "64 MiB took {big} ns, 8 bytes {small} ns");
        // Counted on this thread while it executed: never more than the time that passed.
        assert!(big <= elapsed, "{big} ns counted in {elapsed} ns");
    }
}

#[test]
fn post_checks_queue_region_and_bounds() {
    let (_region, mut dma, id) = setup(4096, 2, None);
    let local = LocalBuf::new(4096, 8);
    let p = local.as_mut_ptr();
    // SAFETY: `local` outlives every op; completions are drained below.
    unsafe {
        assert_eq!(
            dma.post(DmaOp::read(RegionId(9), 0, p, 8, 0)),
            Err(DmaError::UnknownRegion(9))
        );
        assert_eq!(
            dma.post(DmaOp::read(id, 4090, p, 8, 0)),
            Err(DmaError::OutOfBounds {
                region: id.0,
                offset: 4090,
                len: 8
            })
        );
        assert_eq!(
            dma.post(DmaOp::read(id, u64::MAX, p, 8, 0)),
            Err(DmaError::OutOfBounds {
                region: id.0,
                offset: u64::MAX,
                len: 8
            })
        );
        dma.post(DmaOp::read(id, 0, p, 8, 0)).unwrap();
        dma.post(DmaOp::read(id, 8, p, 8, 0)).unwrap();
        assert_eq!(
            dma.post(DmaOp::read(id, 16, p, 8, 0)),
            Err(DmaError::QueueFull)
        );
    }
    dma.submit();
    let mut out: [DmaCompletion; 4] = Default::default();
    assert_eq!(dma.poll(&mut out), 2);
    assert_eq!(dma.outstanding(), 0);
}

#[test]
fn copy_happens_at_completion_in_submission_order() {
    let (region, mut dma, id) = setup(4096, 8, None);
    host_write(&region, 0, &[1; 8]);
    let local = LocalBuf::new(64, 8);
    let p = local.as_mut_ptr();
    // SAFETY: `local` outlives the ops; read only after their completions.
    unsafe {
        dma.post(DmaOp::read(id, 0, p, 8, 10)).unwrap();
    }
    let mut out: [DmaCompletion; 4] = Default::default();
    // Not submitted: nothing completes.
    assert_eq!(dma.poll(&mut out), 0);
    dma.submit();
    // Changed after submit but before completion: the copy sees the new bytes.
    host_write(&region, 0, &[2; 8]);
    // SAFETY: as above.
    unsafe {
        dma.post(DmaOp::write(id, 64, p, 8, 11)).unwrap();
        dma.post(DmaOp::read(id, 64, p.add(8), 8, 12)).unwrap();
    }
    dma.submit();
    // One slot at a time: order is preserved across polls.
    let mut ids = Vec::new();
    for _ in 0..3 {
        assert_eq!(dma.poll(&mut out[..1]), 1);
        assert_eq!(out[0].result, Ok(()));
        ids.push(out[0].user_data);
    }
    assert_eq!(ids, [10, 11, 12]);
    assert_eq!(&local.as_slice()[..16], &[2; 16]);
    assert_eq!(host_read(&region, 64, 8), vec![2; 8]);
}

#[test]
fn unregister_fails_inflight_ops() {
    let (_region, mut dma, id) = setup(4096, 4, None);
    let local = LocalBuf::new(8, 8);
    // SAFETY: `local` outlives the op.
    unsafe {
        dma.post(DmaOp::read(id, 0, local.as_mut_ptr(), 8, 5))
            .unwrap()
    };
    dma.submit();
    dma.unregister_region(id).unwrap();
    assert_eq!(
        dma.unregister_region(id),
        Err(DmaError::UnknownRegion(id.0))
    );
    let mut out: [DmaCompletion; 1] = Default::default();
    assert_eq!(dma.poll(&mut out), 1);
    assert_eq!(out[0].result, Err(DmaError::UnknownRegion(id.0)));
    assert_eq!(dma.region_len(id), None);
}

#[test]
fn cost_model_charges_latency_and_bandwidth() {
    // 50 µs per op and 1 GB/s: a 100 KB op costs 150 µs; three serialize to 450 µs.
    let cost = CostModel {
        per_op_ns: 50_000,
        bytes_per_sec: 1_000_000_000,
    };
    assert_eq!(cost.op_ns(100_000), 150_000);
    let (_region, mut dma, id) = setup(1 << 20, 8, Some(cost));
    let local = LocalBuf::new(300_000, 64);
    let ops: Vec<DmaOp> = (0..3)
        .map(|i| {
            DmaOp::read(
                id,
                0,
                local.as_mut_ptr().wrapping_add(i * 100_000),
                100_000,
                i as u64,
            )
        })
        .collect();
    let t = Instant::now();
    // SAFETY: each op targets its own part of `local`.
    unsafe {
        for op in &ops {
            dma.post(*op).unwrap();
        }
    }
    dma.submit();
    let mut out: [DmaCompletion; 4] = Default::default();
    // Immediately after the doorbell nothing is done.
    assert_eq!(dma.poll(&mut out), 0);
    let mut done = 0;
    let mut first_done_at = None;
    while done < 3 {
        let n = dma.poll(&mut out);
        if n > 0 && first_done_at.is_none() {
            first_done_at = Some(t.elapsed());
        }
        done += n;
    }
    let total = t.elapsed();
    assert!(
        first_done_at.unwrap() >= Duration::from_micros(150),
        "{first_done_at:?}"
    );
    assert!(total >= Duration::from_micros(450), "{total:?}");
    assert_eq!(CostModel::bluefield2().op_ns(12_000), 2_000);
}

#[test]
fn run_sync_handles_more_ops_than_queue_depth_and_reports_first_error() {
    let (region, mut dma, id) = setup(4096, 2, None);
    host_write(&region, 0, &pattern(80, 1));
    let local = LocalBuf::new(80, 8);
    let ops: Vec<DmaOp> = (0..10)
        .map(|i| {
            DmaOp::read(
                id,
                i * 8,
                local.as_mut_ptr().wrapping_add(i as usize * 8),
                8,
                i,
            )
        })
        .collect();
    // SAFETY: disjoint targets inside `local`.
    unsafe { run_sync(&mut dma, &ops).unwrap() };
    assert_eq!(local.as_slice(), &pattern(80, 1)[..]);

    let bad = [
        DmaOp::read(id, 0, local.as_mut_ptr(), 8, 0),
        DmaOp::read(id, 4095, local.as_mut_ptr(), 8, 1),
        DmaOp::read(RegionId(77), 0, local.as_mut_ptr(), 8, 2),
    ];
    // SAFETY: as above.
    let r = unsafe { run_sync(&mut dma, &bad) };
    assert_eq!(
        r,
        Err(DmaError::OutOfBounds {
            region: id.0,
            offset: 4095,
            len: 8
        })
    );
    assert_eq!(dma.outstanding(), 0);
}

#[test]
#[should_panic(expected = "did not post")]
fn run_sync_detects_foreign_operations() {
    let (_region, mut dma, id) = setup(4096, 4, None);
    let local = LocalBuf::new(16, 8);
    // SAFETY: `local` outlives the ops (the panic leaks nothing that is used afterwards).
    unsafe {
        dma.post(DmaOp::read(id, 0, local.as_mut_ptr(), 8, 99))
            .unwrap();
        let _ = run_sync(
            &mut dma,
            &[DmaOp::read(id, 0, local.as_mut_ptr().add(8), 8, 1)],
        );
    }
}

#[test]
fn fd_passing_maps_the_same_memory() {
    let region = SharedRegion::create("passed", 8192).unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    send_with_fds(&a, b"region", &[region.fd()]).unwrap();
    let mut buf = [0u8; 16];
    let mut fds = Vec::new();
    let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
    assert_eq!(&buf[..n], b"region");
    assert_eq!(fds.len(), 1);
    let other = SharedRegion::from_fd(fds.pop().unwrap(), 8192).unwrap();
    host_write(&region, 4000, b"shared bytes");
    assert_eq!(host_read(&other, 4000, 12), b"shared bytes");

    // The DPU side registers a received fd directly.
    send_with_fds(&a, b"x", &[region.fd(), region.fd()]).unwrap();
    let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
    assert_eq!((n, fds.len()), (1, 2));
    let mut dma = EmulatedDma::new(4, None);
    let id = dma
        .register_region(RegionExport::memfd(fds.pop().unwrap(), 8192))
        .unwrap()
        .id;
    assert_eq!(dma.region_len(id), Some(8192));
    // A length beyond the object is refused.
    assert!(matches!(
        dma.register_region(RegionExport::memfd(fds.pop().unwrap(), 1 << 20)),
        Err(DmaError::Map(_))
    ));

    // Plain bytes without fds, and end of stream.
    send_with_fds(&a, b"plain", &[]).unwrap();
    let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
    assert_eq!((&buf[..n], fds.len()), (&b"plain"[..], 0));
    assert!(send_with_fds(&a, b"", &[region.fd()]).is_err());
    drop(a);
    assert_eq!(recv_with_fds(&b, &mut buf, &mut fds).unwrap(), 0);
}

#[test]
fn regions_cannot_be_resized() {
    let region = SharedRegion::create("sealed", 4096).unwrap();
    assert!(rustix::fs::ftruncate(region.fd().as_fd(), 100).is_err());
}

#[test]
fn unsealed_shared_memory_is_refused_and_sealed_memory_cannot_shrink() {
    use rustix::fs::{MemfdFlags, SealFlags};
    let mut dma = EmulatedDma::new(8, None);
    // A memfd without seals: the host could truncate it under the DPU's mapping.
    let fd = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .unwrap();
    rustix::fs::ftruncate(&fd, 8192).unwrap();
    let e = dma
        .register_region(RegionExport::memfd(fd, 8192))
        .unwrap_err();
    assert!(
        matches!(&e, DmaError::Map(m) if m.contains("sealed")),
        "{e}"
    );
    // Sealed against shrinking only: still refused (growing and re-sealing stay possible).
    let fd =
        rustix::fs::memfd_create("half", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, 8192).unwrap();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).unwrap();
    assert!(dma.register_region(RegionExport::memfd(fd, 8192)).is_err());
    // A host's region is sealed: shrinking it fails, registering it works.
    let region = SharedRegion::create("sealed", 8192).unwrap();
    assert!(rustix::fs::ftruncate(region.fd(), 4096).is_err());
    dma.register_region(export(&region)).unwrap();
}
