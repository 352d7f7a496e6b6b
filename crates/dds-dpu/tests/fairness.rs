//! One host cannot starve another: a host that keeps far more reads queued than the file
//! service has slots (1,000 against 256) must not stop a second host's reads from being
//! served. The greedy host connects first, so its group comes first in the service thread's
//! list of groups; the light host's reads must still complete while the greedy one runs.

mod device;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dds_host::{Dds, GroupConfig, Status};
use device::{device, start};

const FILE_BYTES: u64 = 16 << 20;

#[test]
fn a_greedy_host_does_not_starve_a_light_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = device(dir.path());
    let dpu = start(&path, "fairness", 512 << 20, None);
    let setup = Dds::connect(dpu.socket()).unwrap();
    let file = setup.create_file("/shared").unwrap().id;
    let content: Vec<u8> = (0..FILE_BYTES as usize).map(|i| (i / 4096) as u8).collect();
    for (k, chunk) in content.chunks(1 << 20).enumerate() {
        let at = (k << 20) as u64;
        assert_eq!(setup.write_sync(file, at, chunk).unwrap(), chunk.len());
    }
    drop(setup);

    // The greedy host: one group, up to 1,000 reads outstanding, re-issued as they complete.
    let greedy = Dds::connect(dpu.socket()).unwrap();
    let group = greedy
        .create_group(&GroupConfig {
            max_outstanding: 1000,
            ..GroupConfig::default()
        })
        .unwrap();
    greedy.poll_add(file, &group, 1).unwrap();
    let stop = AtomicBool::new(false);
    let greedy_done = AtomicU64::new(0);
    let light_latencies = std::thread::scope(|s| {
        let greedy_thread = s.spawn(|| {
            let mut bufs = vec![vec![0u8; 4096]; 1000];
            let mut free: Vec<usize> = (0..1000).collect();
            let mut x = 1u64;
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut peak = 0usize;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                while let Some(k) = free.pop() {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let off = (x >> 33) % (FILE_BYTES / 4096) * 4096;
                    // SAFETY: `bufs[k]` is not touched until its completion returns slot k.
                    let r = unsafe { greedy.read(file, off, bufs[k].as_mut_ptr(), 4096, k as u64) };
                    match r {
                        Ok(()) => {}
                        Err(e)
                            if matches!(
                                e.status,
                                Status::RingFull | Status::TooManyOutstanding
                            ) =>
                        {
                            free.push(k);
                            break;
                        }
                        Err(e) => panic!("greedy read: {e}"),
                    }
                }
                peak = peak.max(1000 - free.len());
                while let Some(c) = group.poll_wait(Duration::from_millis(1)).unwrap() {
                    assert_eq!(c.status, Status::Ok);
                    free.push(c.io_ctx as usize);
                    greedy_done.fetch_add(1, Ordering::Relaxed);
                    if free.len() > 64 {
                        break;
                    }
                }
            }
            peak
        });
        // Let the greedy host fill the file service first.
        while greedy_done.load(Ordering::Relaxed) < 2000 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let light = Dds::connect(dpu.socket()).unwrap();
        let mut latencies = Vec::new();
        let mut buf = vec![0u8; 4096];
        for k in 0..40u64 {
            let off = (k * 97 % (FILE_BYTES / 4096)) * 4096;
            let t = Instant::now();
            assert_eq!(light.read_sync(file, off, &mut buf).unwrap(), 4096);
            latencies.push(t.elapsed());
            assert!(
                buf.iter().all(|&b| b == (off / 4096) as u8),
                "light read {k}"
            );
        }
        let greedy_running = !greedy_thread.is_finished();
        stop.store(true, Ordering::Relaxed);
        let peak = greedy_thread.join().unwrap();
        assert!(
            peak > 256,
            "the greedy host kept only {peak} reads outstanding: no contention to test"
        );
        assert!(
            greedy_running,
            "the light host's reads completed only after the greedy host stopped"
        );
        latencies
    });
    let worst = light_latencies.iter().max().unwrap();
    let total: Duration = light_latencies.iter().sum();
    eprintln!(
        "light host: 40 reads in {total:?} (worst {worst:?}) beside a greedy host ({} reads done)",
        greedy_done.load(Ordering::Relaxed)
    );
    assert!(
        *worst < Duration::from_secs(2),
        "a light read waited {worst:?} behind the greedy host"
    );
}
