//! DPU CPU per offloaded request, for `dds stats`: the CPU time of this process's threads
//! (`/proc/self/task/*/schedstat`, nanoseconds on the CPU; `stat`'s clock ticks where
//! scheduler statistics are off), divided by the requests the directors served on the DPU in
//! the same window (`docs/offload.md`, DPU CPU per request).

use std::time::Instant;

use serde::Serialize;

/// CPU time of one thread.
struct ThreadCpu {
    name: String,
    ns: u64,
}

/// The CPU time of every thread of this process now.
fn threads() -> Vec<ThreadCpu> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    // SAFETY: sysconf has no preconditions.
    let tick_ns = 1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    dir.flatten()
        .filter_map(|e| {
            let path = e.path();
            let name = std::fs::read_to_string(path.join("comm")).ok()?;
            let ns = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .or_else(|| {
                    // utime and stime: fields 14 and 15, the 12th and 13th after the name.
                    let stat = std::fs::read_to_string(path.join("stat")).ok()?;
                    let mut f = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
                    let ticks = f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?;
                    Some(ticks * tick_ns)
                })?;
            Some(ThreadCpu {
                name: name.trim().to_string(),
                ns,
            })
        })
        .collect()
}

/// A thread's role: its name without the trailing number (`dds-director-3` →
/// `dds-director`).
fn role(name: &str) -> &str {
    name.trim_end_matches(|c: char| c.is_ascii_digit())
        .trim_end_matches('-')
}

/// Where the previous window ended.
struct Mark {
    at: Instant,
    process_ns: u64,
    director_ns: u64,
    offloaded: u64,
}

/// The DPU CPU per offloaded request over a window: from the previous `dds stats` (or the
/// engine's start) to now.
#[derive(Debug, Serialize)]
pub struct CpuPerRequest {
    /// What one offloaded request is (`KV GET`, `page read`, `pagestore read`).
    pub request: String,
    /// The window's length.
    pub window_seconds: f64,
    /// Requests served on the DPU in the window.
    pub offloaded: u64,
    /// CPU time of the whole DPU process in the window (every thread: directors, the file
    /// service, the cache writer, the control plane).
    pub process_cpu_seconds: f64,
    /// Of which the directors' threads (the client and host legs, parsing, merging).
    pub director_cpu_seconds: f64,
    /// DPU CPU per offloaded request: the process's CPU time over the requests (it includes
    /// the DPU's other work of the window, e.g. the host's own file I/O); `null` without
    /// requests.
    pub dpu_cpu_us_per_request: Option<f64>,
    /// The directors' threads' part of it.
    pub director_cpu_us_per_request: Option<f64>,
    /// The director runs on the file-service thread (`dds dpu --director-threads 0`): its
    /// part is in that thread's, and the two figures above count only director threads.
    pub director_inline: bool,
    /// CPU seconds of each thread role since the process started.
    pub threads: Vec<(String, f64)>,
}

/// Windows of DPU CPU per offloaded request.
pub(crate) struct CpuMeter {
    request: String,
    last: Mark,
}

/// CPU time of the whole process, threads that ended included.
fn process_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sums(threads: &[ThreadCpu]) -> (u64, u64) {
    let process = process_ns();
    let director = threads
        .iter()
        .filter(|t| role(&t.name) == "dds-director")
        .map(|t| t.ns)
        .sum();
    (process, director)
}

impl CpuMeter {
    /// A meter whose first window starts now.
    pub fn new(request: &str) -> CpuMeter {
        let (process_ns, director_ns) = sums(&threads());
        CpuMeter {
            request: request.to_string(),
            last: Mark {
                at: Instant::now(),
                process_ns,
                director_ns,
                offloaded: 0,
            },
        }
    }

    /// The window that ends now, with `offloaded` requests served on the DPU so far (all
    /// directors); the next one starts now.
    pub fn window(&mut self, offloaded: u64, director_inline: bool) -> CpuPerRequest {
        let now = threads();
        let (process_ns, director_ns) = sums(&now);
        let mut roles: Vec<(String, f64)> = Vec::new();
        for t in &now {
            let r = role(&t.name);
            match roles.iter_mut().find(|(n, _)| n == r) {
                Some((_, s)) => *s += t.ns as f64 / 1e9,
                None => roles.push((r.to_string(), t.ns as f64 / 1e9)),
            }
        }
        roles.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mark = Mark {
            at: Instant::now(),
            process_ns,
            director_ns,
            offloaded,
        };
        let last = std::mem::replace(&mut self.last, mark);
        let n = offloaded.saturating_sub(last.offloaded);
        let process = process_ns.saturating_sub(last.process_ns) as f64 / 1e9;
        let director = director_ns.saturating_sub(last.director_ns) as f64 / 1e9;
        let per = |s: f64| (n > 0).then(|| s * 1e6 / n as f64);
        CpuPerRequest {
            request: self.request.clone(),
            window_seconds: self.last.at.duration_since(last.at).as_secs_f64(),
            offloaded: n,
            process_cpu_seconds: process,
            director_cpu_seconds: director,
            dpu_cpu_us_per_request: per(process),
            director_cpu_us_per_request: per(director),
            director_inline,
            threads: roles,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_shows_in_the_window() {
        let mut m = CpuMeter::new("read");
        let t = std::thread::Builder::new()
            .name("dds-director-0".into())
            .spawn(|| {
                let end = Instant::now() + std::time::Duration::from_millis(200);
                let mut x = 0u64;
                while Instant::now() < end {
                    x = x.wrapping_add(std::hint::black_box(1));
                }
                // Still alive when the window closes.
                std::thread::sleep(std::time::Duration::from_millis(300));
                x
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(250));
        let w = m.window(1000, false);
        t.join().unwrap();
        assert_eq!((w.request.as_str(), w.offloaded), ("read", 1000));
        assert!(w.director_cpu_seconds > 0.05, "{w:?}");
        assert!(w.process_cpu_seconds >= w.director_cpu_seconds, "{w:?}");
        let us = w.director_cpu_us_per_request.unwrap();
        assert!((50.0..=1000.0).contains(&us), "{w:?}");
        assert!(w.threads.iter().any(|(n, _)| n == "dds-director"), "{w:?}");
        let next = m.window(1000, false);
        assert_eq!(next.offloaded, 0);
        assert_eq!(next.dpu_cpu_us_per_request, None);
    }
}
