//! Crash-test worker: opens a dds-fs device with io_uring and runs a random stream of
//! metadata operations and flushed writes, printing `BEGIN <op>` before and `ACK` after each
//! durable operation. A test kills it with SIGKILL at random moments and checks that every
//! acknowledged operation survived.
//!
//! Usage: `dds-fs-crash-worker <device> <seed> [max_ops]`; odd seeds commit metadata on the
//! file service's metadata thread, even seeds inline.
//!
//! Op lines: `create_dir NAME`, `remove_dir NAME`, `create_file PATH`, `delete PATH`,
//! `rename FROM TO`, `resize PATH SIZE`, `write PATH OFFSET LEN SEED` (data = pattern(SEED),
//! followed by a flush).
//!
//! `dds-fs-crash-worker <device> <seed> appends`: an append flood instead, on the metadata
//! thread. Appends to `/appends0` .. `/appends3` (created if missing) from their current
//! sizes, with [`APPEND_DEPTH`] in flight spread over the files (so extends of several files
//! wait together and share `SET_SIZES` commits), printing `ACK FILE OFFSET LEN SEED` as each
//! completes (no flush), and `DONE` once [`APPEND_BYTES`] were appended.

use dds_fs::{EntryKind, FileService, FsError, OpenConfig, UringDevice};
use std::io::Write;

/// Deterministic test data (xorshift64 bytes), shared with the crash test.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
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

struct Rng(u64);

impl Rng {
    fn below(&mut self, m: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if m == 0 {
            0
        } else {
            self.0 % m
        }
    }
}

const MAX_SIZE: u64 = 300 << 10;
const MAX_FILES: usize = 12;

fn state(fs: &FileService) -> (Vec<String>, Vec<String>) {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    for e in fs.list_dir("/").expect("list root") {
        match e.kind {
            EntryKind::Dir => {
                for f in fs.list_dir(&e.name).expect("list dir") {
                    files.push(format!("/{}/{}", e.name, f.name));
                }
                dirs.push(e.name);
            }
            EntryKind::File => files.push(format!("/{}", e.name)),
        }
    }
    (dirs, files)
}

fn free_path(fs: &FileService, dirs: &[String], r: &mut Rng) -> Option<String> {
    let name = format!("f{}", r.below(20));
    let p = if dirs.is_empty() || r.below(3) == 0 {
        if dirs.contains(&name) {
            return None;
        }
        format!("/{name}")
    } else {
        format!("/{}/{name}", dirs[r.below(dirs.len() as u64) as usize])
    };
    fs.lookup(&p).is_err().then_some(p)
}

fn next_op(fs: &FileService, r: &mut Rng) -> String {
    let (dirs, files) = state(fs);
    loop {
        let pick_file = |r: &mut Rng| files[r.below(files.len() as u64) as usize].clone();
        match r.below(10) {
            0 if dirs.len() < 3 => {
                let n = format!("d{}", r.below(5));
                if !dirs.contains(&n) && fs.lookup(&n).is_err() {
                    return format!("create_dir {n}");
                }
            }
            1 if !dirs.is_empty() => {
                let d = &dirs[r.below(dirs.len() as u64) as usize];
                if fs.list_dir(d).map(|l| l.is_empty()).unwrap_or(false) {
                    return format!("remove_dir {d}");
                }
            }
            2 | 3 if files.len() < MAX_FILES => {
                if let Some(p) = free_path(fs, &dirs, r) {
                    return format!("create_file {p}");
                }
            }
            4 if !files.is_empty() => return format!("delete {}", pick_file(r)),
            5 if !files.is_empty() => {
                let a = pick_file(r);
                if let Some(b) = free_path(fs, &dirs, r) {
                    return format!("rename {a} {b}");
                }
            }
            6 if !files.is_empty() => {
                return format!("resize {} {}", pick_file(r), r.below(MAX_SIZE))
            }
            7..=9 if !files.is_empty() => {
                let off = r.below(MAX_SIZE);
                let len = 1 + r.below((MAX_SIZE - off).min(40_000));
                return format!("write {} {off} {len} {}", pick_file(r), r.below(1 << 30));
            }
            _ => {}
        }
    }
}

fn apply(fs: &mut FileService, op: &str) -> Result<(), FsError> {
    let w: Vec<&str> = op.split_whitespace().collect();
    let num = |s: &str| s.parse::<u64>().expect("number");
    match w.as_slice() {
        ["create_dir", n] => fs.create_dir(n),
        ["remove_dir", n] => fs.remove_dir(n),
        ["create_file", p] => fs.create_file(p).map(|_| ()),
        ["delete", p] => fs.delete_file(p),
        ["rename", a, b] => fs.rename_file(a, b),
        ["resize", p, n] => {
            let id = fs.lookup(p)?.id;
            fs.resize(id, num(n))
        }
        ["write", p, off, len, seed] => {
            let id = fs.lookup(p)?.id;
            let data = pattern(num(seed), num(len) as usize);
            // SAFETY: `data` lives until both completions were polled below.
            unsafe { fs.submit_write(id, num(off), data.as_ptr(), data.len() as u32, 1)? };
            let mut pending = 1;
            let mut result = Ok(());
            let mut flushed = false;
            while pending > 0 {
                fs.wait()?;
                fs.poll(|_, r| {
                    pending -= 1;
                    if let Err(e) = r {
                        result = Err(e);
                    }
                });
                if pending == 0 && !flushed && result.is_ok() {
                    fs.submit_flush(2)?;
                    pending = 1;
                    flushed = true;
                }
            }
            result
        }
        _ => panic!("bad op {op}"),
    }
}

/// Appends in flight in the append flood.
const APPEND_DEPTH: usize = 8;
/// Files the append flood spreads over.
const APPEND_FILES: usize = 4;
/// Bytes one append flood writes at most.
const APPEND_BYTES: u64 = 12 << 20;

/// An append of the flood in flight.
#[derive(Clone)]
struct Append {
    file: usize,
    off: u64,
    seed: u64,
    data: Vec<u8>,
}

/// The append flood (see the module documentation).
fn appends(fs: &mut FileService, seed: u64) -> Result<(), FsError> {
    let mut ids = Vec::with_capacity(APPEND_FILES);
    let mut ends = Vec::with_capacity(APPEND_FILES);
    for f in 0..APPEND_FILES {
        let name = format!("/appends{f}");
        let id = match fs.lookup(&name) {
            Ok(i) => i.id,
            Err(FsError::NotFound) => fs.create_file(&name)?,
            Err(e) => return Err(e),
        };
        ends.push(fs.file_size(id)?);
        ids.push(id);
    }
    let mut r = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let mut appended = 0u64;
    // Per slot: the append in flight, kept until its completion.
    let mut slots: Vec<Option<Append>> = vec![None; APPEND_DEPTH];
    let out = std::io::stdout();
    let mut finished = false;
    loop {
        for (k, slot) in slots.iter_mut().enumerate() {
            if slot.is_some() || appended >= APPEND_BYTES {
                continue;
            }
            let f = k % APPEND_FILES;
            let s = r.below(1 << 30);
            let data = pattern(s, 1 + r.below(20_000) as usize);
            let at = ends[f];
            // SAFETY: `data` stays in `slots` until this append's completion was polled.
            unsafe { fs.submit_write(ids[f], at, data.as_ptr(), data.len() as u32, k as u64)? };
            ends[f] += data.len() as u64;
            appended += data.len() as u64;
            *slot = Some(Append {
                file: f,
                off: at,
                seed: s,
                data,
            });
        }
        if slots.iter().all(Option::is_none) {
            if !finished {
                writeln!(out.lock(), "DONE").expect("stdout");
                finished = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        fs.wait()?;
        let mut failed = None;
        fs.poll(|k, res| {
            let Append {
                file: f,
                off,
                seed: s,
                data,
            } = slots[k as usize].take().expect("an append in flight");
            match res {
                Ok(n) if n as usize == data.len() => {
                    writeln!(out.lock(), "ACK {f} {off} {} {s}", data.len()).expect("stdout")
                }
                Ok(n) => failed = Some(FsError::Io(format!("short append: {n}"))),
                Err(e) => failed = Some(e),
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: dds-fs-crash-worker <device> <seed> [max_ops | appends]");
        std::process::exit(2);
    }
    let seed: u64 = args[2].parse().expect("seed");
    let flood = args.get(3).map(String::as_str) == Some("appends");
    let max_ops: u64 = match args.get(3) {
        Some(s) if !flood => s.parse().expect("max_ops"),
        _ => u64::MAX,
    };
    let dev = UringDevice::open(&args[1], 16).expect("open device");
    let cfg = OpenConfig {
        max_inflight: 16,
        max_io_bytes: 64 << 10,
        bounce_bytes: 1 << 20,
    };
    let mut fs = FileService::open(Box::new(dev), cfg).expect("open file service");
    if flood || seed % 2 == 1 {
        // Odd seeds commit metadata on the metadata thread (as the DPU does), even ones inline;
        // the append flood always does.
        fs.start_meta_thread(|| {})
            .expect("start the metadata thread");
    }
    if flood {
        if let Err(e) = appends(&mut fs, seed) {
            writeln!(std::io::stdout().lock(), "ERR {e}").expect("stdout");
            std::process::exit(1);
        }
        return;
    }
    let mut r = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let out = std::io::stdout();
    for _ in 0..max_ops {
        let op = next_op(&fs, &mut r);
        writeln!(out.lock(), "BEGIN {op}").expect("stdout");
        match apply(&mut fs, &op) {
            Ok(()) => writeln!(out.lock(), "ACK").expect("stdout"),
            Err(e) => {
                writeln!(out.lock(), "ERR {e}").expect("stdout");
                std::process::exit(1);
            }
        }
    }
}
