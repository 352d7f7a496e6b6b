//! A deployment in this process for the tests: the DPU process's and the host process's code
//! on threads, talking over their control socket and KV queue pairs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use dds_dpukv::node::{run_dpu, run_host, DpuConfig, HostConfig};
use dds_dpukv::Design;

pub struct Deployment {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A `design` deployment whose KV queue slots hold `slot_bytes` and whose largest value is
/// `max_value`; `addr` is its first endpoint.
pub fn deploy(design: Design, slot_bytes: u32, max_value: u32) -> Deployment {
    let dir = tempfile::tempdir().unwrap();
    let control: PathBuf = dir.path().join("kvqp.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    if design != Design::CpuOnly {
        let cfg = DpuConfig {
            control: control.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            cores: 1,
            memory: 16 << 20,
            index: None,
            partitions: 1,
            cost: None,
            max_value: max_value as usize,
            etcd: None,
        };
        let s = stop.clone();
        threads.push(std::thread::spawn(move || run_dpu(&cfg, &s).unwrap()));
        assert!(dds_dpukv::node::wait_for(&control, Duration::from_secs(10)));
    }
    let cfg = HostConfig {
        design,
        dpu: (design != Design::CpuOnly).then_some(control),
        listen: "127.0.0.1:0".parse().unwrap(),
        frontends: 1,
        workers: 1,
        partitions: 1,
        memory: 16 << 20,
        index: None,
        comm_cores: 1,
        slots: 8,
        slot_bytes,
        max_value,
        etcd: None,
    };
    let (tx, rx) = mpsc::channel();
    let s = stop.clone();
    threads.push(std::thread::spawn(move || {
        run_host(&cfg, &s, &mut |serving| {
            let _ = tx.send(serving.endpoints[0].addr);
        })
        .unwrap()
    }));
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    Deployment {
        stop,
        threads,
        addr,
        _dir: dir,
    }
}

/// A command in RESP.
pub use dds_testkit::resp::command as resp;
