//! The machine a benchmark ran on, and how the DPU is emulated on it.

use serde::Serialize;

/// What every result states about the machine.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// Online CPUs (`nproc`).
    pub nproc: usize,
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Physical memory, bytes.
    pub memory_bytes: u64,
    /// 1-minute load average when the run started (other work on the machine).
    pub load_average_at_start: f64,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024);
        let load_average_at_start = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().and_then(|x| x.parse().ok()))
            .unwrap_or(0.0);
        Machine {
            load_average_at_start,
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            kernel,
            memory_bytes,
        }
    }

    /// One line for the printed output.
    pub fn line(&self) -> String {
        format!(
            "machine: {} CPUs (nproc), {}, Linux {}, {:.1} GiB RAM, load average {:.1} at start",
            self.nproc,
            self.cpu_model,
            self.kernel,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.load_average_at_start
        )
    }
}

/// The emulated PCIe DMA cost model as the results name it.
pub fn cost_model_text(on: bool) -> String {
    if on {
        let m = dds_dma::CostModel::bluefield2();
        format!(
            "on ({} ns per DMA operation + {:.0} GB/s)",
            m.per_op_ns,
            m.bytes_per_sec as f64 / 1e9
        )
    } else {
        "off (DMA operations cost only the memory copy)".into()
    }
}
