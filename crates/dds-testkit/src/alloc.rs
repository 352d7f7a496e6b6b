//! A counting global allocator for the no-allocation tests: it counts the heap allocations
//! (`alloc`, `alloc_zeroed`, `realloc`) of the threads a test selects and forwards everything to
//! the system allocator.
//!
//! A test binary installs it once:
//!
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: dds_testkit::alloc::CountingAlloc = dds_testkit::alloc::CountingAlloc;
//! # fn main() {}
//! ```
//!
//! then selects the threads whose allocations count, and measures:
//!
//! - [`count_this_thread`]: the calling thread (a test thread, or a server thread the test
//!   spawns or hooks);
//! - [`count_thread_id`]: a thread the code under test spawned, by its kernel thread id
//!   ([`thread_named`] finds it by name);
//! - [`count_all_threads`]: every thread but those that called [`exempt_this_thread`] (the
//!   client on the test thread, say).
//!
//! With `DDS_ALLOC_BACKTRACE` set in the environment, each counted allocation prints its size
//! and backtrace to stderr.
//!
//! [`allocations`] is the number counted so far, process-wide; [`allocations_in`] the number
//! counted while a closure ran; [`allocated_bytes`] the bytes they asked for. The counters are global: a binary whose tests measure
//! different threads runs its measurements one at a time, each holding [`measure_alone`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// The counting allocator (see the module documentation).
pub struct CountingAlloc;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Bytes asked for by the counted allocations (a realloc counts its new size).
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// Kernel thread id whose allocations count (0: none).
static WATCHED: AtomicI32 = AtomicI32::new(0);
/// Every thread not exempt counts.
static ALL: AtomicBool = AtomicBool::new(false);

/// How the calling thread is counted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// As the process-wide selection says.
    Default,
    /// Always.
    Counted,
    /// Never.
    Exempt,
}

thread_local! {
    static MARK: Cell<Mark> = const { Cell::new(Mark::Default) };
    /// The thread is printing a counted allocation's backtrace.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
    /// This thread's kernel id, once asked (0: not yet).
    static TID: Cell<i32> = const { Cell::new(0) };
}

/// Whether an allocation on the calling thread counts now. Never allocates (the thread
/// locals are const-initialized and have no destructor); a thread being torn down is not
/// counted.
fn counted() -> bool {
    let mark = MARK.try_with(Cell::get).unwrap_or(Mark::Exempt);
    match mark {
        Mark::Counted => return true,
        Mark::Exempt => return false,
        Mark::Default => {}
    }
    if ALL.load(Ordering::Relaxed) {
        return true;
    }
    let watched = WATCHED.load(Ordering::Relaxed);
    watched != 0 && own_tid() == watched
}

fn own_tid() -> i32 {
    TID.try_with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid takes no arguments and cannot fail.
            t.set(unsafe { libc::gettid() });
        }
        t.get()
    })
    .unwrap_or(0)
}

fn count(size: usize) {
    if counted() {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size, Ordering::Relaxed);
        trace(size);
    }
}

/// With `DDS_ALLOC_BACKTRACE` set, prints where a counted allocation came from (the
/// printing's own allocations are not counted or traced).
fn trace(size: usize) {
    if IN_TRACE.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    IN_TRACE.with(|t| t.set(true));
    let saved = MARK.with(|m| m.replace(Mark::Exempt));
    if std::env::var_os("DDS_ALLOC_BACKTRACE").is_some() {
        eprintln!(
            "counted allocation of {size} bytes:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
    }
    MARK.with(|m| m.set(saved));
    IN_TRACE.with(|t| t.set(false));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only
// atomics and const thread locals, and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count(n);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, n) }
    }
}

/// Counts (`true`) or stops counting (`false`) the calling thread's allocations, whatever the
/// process-wide selection.
pub fn count_this_thread(on: bool) {
    MARK.with(|m| m.set(if on { Mark::Counted } else { Mark::Default }));
}

/// Never counts the calling thread's allocations (under [`count_all_threads`]).
pub fn exempt_this_thread() {
    MARK.with(|m| m.set(Mark::Exempt));
}

/// Counts the allocations of the thread with kernel id `tid` (0: of none).
pub fn count_thread_id(tid: i32) {
    WATCHED.store(tid, Ordering::SeqCst);
}

/// Counts (`true`) or stops counting (`false`) the allocations of every thread that did not
/// call [`exempt_this_thread`].
pub fn count_all_threads(on: bool) {
    ALL.store(on, Ordering::SeqCst);
}

/// Serializes the measurements of one test binary: the counters and the selections are
/// process-wide, and the test harness runs a binary's tests on parallel threads, so a test
/// that counts holds this guard from its first selection to its last measurement. Another
/// test's threads (set up while this one measures) would otherwise count here.
pub fn measure_alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocations counted so far in this process.
pub fn allocations() -> usize {
    ALLOCS.load(Ordering::SeqCst)
}

/// Bytes asked for by the allocations counted so far in this process (a realloc counts its
/// new size).
pub fn allocated_bytes() -> usize {
    BYTES.load(Ordering::SeqCst)
}

/// Allocations counted while `f` ran.
pub fn allocations_in(f: impl FnOnce()) -> usize {
    let before = allocations();
    f();
    allocations() - before
}

/// The kernel thread id of this process's thread named `name` (its `comm`). Panics when
/// there is none.
pub fn thread_named(name: &str) -> i32 {
    for e in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let Ok(e) = e else { continue };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            if let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) {
                return tid;
            }
        }
    }
    panic!("no thread named {name}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static GLOBAL: CountingAlloc = CountingAlloc;

    /// One test: the selections are process-wide.
    #[test]
    fn counts_the_selected_threads_only() {
        fn boxed(n: usize) {
            drop(std::hint::black_box(vec![0u8; n]));
        }
        // Nothing selected.
        assert_eq!(allocations_in(|| boxed(10)), 0);
        // The calling thread.
        count_this_thread(true);
        let bytes = allocated_bytes();
        assert_eq!(allocations_in(|| boxed(10)), 1);
        assert_eq!(allocated_bytes() - bytes, 10);
        let mut v: Vec<u8> = Vec::with_capacity(1);
        assert_eq!(allocations_in(|| v.reserve(100)), 1, "a realloc counts");
        count_this_thread(false);
        assert_eq!(allocations_in(|| boxed(10)), 0);
        // Another thread, by kernel id and name.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (ready, started) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("testkit-probe".into())
            .spawn(move || {
                ready.send(()).unwrap();
                wait.recv().unwrap();
                boxed(10);
                boxed(20);
            })
            .unwrap();
        started.recv().unwrap();
        count_thread_id(thread_named("testkit-probe"));
        let n = allocations_in(|| {
            go.send(()).unwrap();
            t.join().unwrap();
        });
        count_thread_id(0);
        assert!(n >= 2, "the watched thread's allocations: {n}");
        // Every thread but an exempt one.
        exempt_this_thread();
        count_all_threads(true);
        let n = allocations_in(|| {
            std::thread::spawn(|| boxed(10)).join().unwrap();
            boxed(10);
        });
        count_all_threads(false);
        assert!(n >= 1, "the other thread's allocation counts: {n}");
        assert_eq!(allocations_in(|| boxed(10)), 0);
    }
}
