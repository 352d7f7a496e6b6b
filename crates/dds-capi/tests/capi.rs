//! The C functions driven from Rust: argument checking without a DPU, then the error paths,
//! notification groups, listing and concurrency against a DPU running in this process.

mod common;

use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use common::start_dpu;
use dds::*;

fn last_error() -> String {
    // SAFETY: a static or thread-local NUL-terminated string.
    unsafe { CStr::from_ptr(dds_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn name(code: dds_status) -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(dds_status_name(code)) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn assert_rc(rc: dds_status, want: dds_status) {
    assert_eq!(
        rc,
        want,
        "got {} want {} ({})",
        name(rc),
        name(want),
        last_error()
    );
}

#[track_caller]
fn ok(rc: dds_status) {
    assert_rc(rc, DDS_OK);
}

fn connect(socket: &std::path::Path) -> *mut dds_t {
    let path = CString::new(socket.to_str().unwrap()).unwrap();
    let mut dds = null_mut();
    // SAFETY: valid arguments.
    ok(unsafe { dds_connect(path.as_ptr(), &mut dds) });
    assert!(!dds.is_null());
    dds
}

fn create_file(dds: *mut dds_t, path: &str) -> dds_file_id {
    let p = CString::new(path).unwrap();
    let mut info = dds_file_info { id: 0, size: 99 };
    // SAFETY: valid arguments.
    ok(unsafe { dds_create_file(dds, p.as_ptr(), &mut info) });
    assert_eq!(info.size, 0);
    info.id
}

fn completion() -> dds_completion {
    dds_completion {
        file_ctx: 0,
        io_ctx: 0,
        status: -1,
        bytes: 0,
    }
}

#[test]
fn null_and_bogus_arguments_are_errors_without_a_dpu() {
    let inval = DDS_INVALID_ARGUMENT;
    let mut buf = [0u8; 16];
    let b = buf.as_mut_ptr().cast::<c_void>();
    let p = c"/x".as_ptr();
    let mut info = dds_file_info { id: 0, size: 0 };
    let mut c = completion();
    let mut count = 0usize;
    let mut flag = false;
    unsafe {
        // NULL connection handle everywhere.
        let d: *mut dds_t = null_mut();
        assert_rc(dds_disconnect(d), inval);
        assert!(
            last_error().contains("dds_t handle is NULL"),
            "{}",
            last_error()
        );
        assert_rc(dds_is_connected(d, &mut flag), inval);
        assert_rc(dds_create_directory(d, p), inval);
        assert_rc(dds_remove_directory(d, p), inval);
        assert_rc(dds_create_file(d, p, &mut info), inval);
        assert_rc(dds_open_or_create_file(d, p, &mut info), inval);
        assert_rc(dds_lookup(d, p, &mut info), inval);
        assert_rc(dds_stat(d, 1, &mut info), inval);
        assert_rc(dds_get_file_size(d, 1, &mut info.size), inval);
        assert_rc(dds_change_file_size(d, 1, 0), inval);
        assert_rc(dds_delete_file(d, 1), inval);
        assert_rc(dds_rename(d, p, p), inval);
        assert_rc(dds_read(d, 1, 0, b, 16, 0), inval);
        assert_rc(dds_write(d, 1, 0, b, 16, 0), inval);
        assert_rc(dds_flush(d, 1, 0), inval);
        assert_rc(dds_read_sync(d, 1, 0, b, 16, null_mut()), inval);
        assert_rc(dds_write_sync(d, 1, 0, b, 16, null_mut()), inval);
        assert_rc(dds_flush_sync(d, 1), inval);
        let mut g = null_mut();
        assert_rc(dds_default_group(d, &mut g), inval);
        assert_rc(dds_create_group(d, null(), &mut g), inval);
        assert_rc(dds_delete_group(d, null_mut()), inval);
        assert_rc(dds_poll_add(d, 1, null_mut(), 0), inval);
        let mut it = null_mut();
        assert_rc(dds_list_directory(d, p, &mut it), inval);

        // NULL group / iterator handles.
        assert_rc(dds_poll_wait(null_mut(), &mut c, 0), inval);
        assert_rc(
            dds_poll_wait_many(null_mut(), &mut c, 1, &mut count, 0),
            inval,
        );
        assert_rc(dds_group_outstanding(null_mut(), &mut count), inval);
        assert_rc(dds_dir_count(null_mut(), &mut count), inval);
        assert_rc(dds_dir_close(null_mut()), inval);

        // Handles that are not handles: zeroed memory, and a misaligned pointer.
        let fake = [0u64; 64];
        let fake_dds = fake.as_ptr() as *mut dds_t;
        assert_rc(dds_stat(fake_dds, 1, &mut info), inval);
        assert!(
            last_error().contains("not a live handle"),
            "{}",
            last_error()
        );
        assert_rc(dds_disconnect(fake_dds), inval);
        assert_rc(
            dds_poll_wait(fake.as_ptr() as *mut dds_group_t, &mut c, 0),
            inval,
        );
        assert_rc(dds_dir_close(fake.as_ptr() as *mut dds_dir_iter_t), inval);
        let odd = (fake.as_ptr() as *const u8).add(1) as *mut dds_t;
        assert_rc(dds_stat(odd, 1, &mut info), inval);
        assert!(last_error().contains("misaligned"), "{}", last_error());

        // Out-pointers.
        assert_rc(dds_config_default(null_mut()), inval);
        assert_rc(dds_group_config_default(null_mut()), inval);
        assert_rc(dds_connect(null(), null_mut()), inval);
        let mut cfg = std::mem::zeroed::<dds_config>();
        ok(dds_config_default(&mut cfg));
        let d = dds_host::Config::default();
        assert_eq!(cfg.rpc_timeout_us, d.rpc_timeout.as_micros() as u64);
        assert_eq!(
            cfg.default_group.max_outstanding,
            u32::from(d.default_group.max_outstanding)
        );
        assert_eq!(
            cfg.default_group.request_ring_bytes,
            d.default_group.request_ring_bytes
        );

        // No DPU at the socket.
        let mut dds = null_mut();
        assert_rc(
            dds_connect(c"/nonexistent/dds.sock".as_ptr(), &mut dds),
            DDS_DPU_DEAD,
        );
        assert!(dds.is_null());
        assert!(
            last_error().contains("/nonexistent/dds.sock"),
            "{}",
            last_error()
        );
        // A bad configuration is refused before connecting.
        cfg.rpc_timeout_us = 0;
        assert_rc(
            dds_connect_with(c"/nonexistent/dds.sock".as_ptr(), &cfg, &mut dds),
            inval,
        );
    }
}

#[test]
fn error_codes_from_the_dpu() {
    let dpu = start_dpu();
    let dds = connect(dpu.socket());
    let bad: dds_file_id = 0xFFFF_FFF0;
    let mut info = dds_file_info { id: 0, size: 0 };
    let mut size = 0u64;
    let mut buf = [0u8; 64];
    let b = buf.as_mut_ptr().cast::<c_void>();
    unsafe {
        // Unknown file ids.
        assert_rc(dds_stat(dds, bad, &mut info), DDS_UNKNOWN_FILE);
        assert_rc(dds_get_file_size(dds, bad, &mut size), DDS_UNKNOWN_FILE);
        assert_rc(dds_change_file_size(dds, bad, 10), DDS_UNKNOWN_FILE);
        assert_rc(dds_delete_file(dds, bad), DDS_UNKNOWN_FILE);
        assert_rc(
            dds_read_sync(dds, bad, 0, b, 8, null_mut()),
            DDS_UNKNOWN_FILE,
        );
        assert_rc(
            dds_write_sync(dds, bad, 0, b, 8, null_mut()),
            DDS_UNKNOWN_FILE,
        );
        let mut g = null_mut();
        ok(dds_default_group(dds, &mut g));
        assert_rc(dds_poll_add(dds, bad, g, 1), DDS_UNKNOWN_FILE);
        // A non-blocking read of an unknown file is accepted; its completion carries the error.
        ok(dds_read(dds, bad, 0, b, 8, 77));
        let mut c = completion();
        ok(dds_poll_wait(g, &mut c, 5_000_000));
        assert_eq!((c.io_ctx, c.status, c.bytes), (77, DDS_UNKNOWN_FILE, 0));

        // Paths.
        ok(dds_create_directory(dds, c"/d".as_ptr()));
        assert_rc(dds_create_directory(dds, c"/d".as_ptr()), DDS_EXISTS);
        let f = create_file(dds, "/d/f");
        assert_rc(
            dds_create_file(dds, c"/d/f".as_ptr(), &mut info),
            DDS_EXISTS,
        );
        assert_rc(
            dds_lookup(dds, c"/d/nope".as_ptr(), &mut info),
            DDS_NOT_FOUND,
        );
        assert_rc(
            dds_create_file(dds, c"/nodir/x".as_ptr(), &mut info),
            DDS_UNKNOWN_DIR,
        );
        assert_rc(dds_remove_directory(dds, c"/d".as_ptr()), DDS_NOT_EMPTY);
        let not_utf8 = [b'/', 0xff, 0xfe, 0];
        assert_rc(
            dds_create_file(dds, not_utf8.as_ptr().cast(), &mut info),
            DDS_INVALID_PATH,
        );
        assert_rc(
            dds_create_file(dds, null(), &mut info),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(
            dds_create_file(dds, c"/d/g".as_ptr(), null_mut()),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(dds_lookup(dds, c"/d/g".as_ptr(), &mut info), DDS_NOT_FOUND);

        // I/O arguments and limits.
        let mut dinfo = std::mem::zeroed::<dds_info>();
        ok(dds_get_info(dds, &mut dinfo));
        assert!(dinfo.max_io_bytes > 0);
        assert_rc(dds_read(dds, f, 0, null_mut(), 8, 0), DDS_INVALID_ARGUMENT);
        assert_rc(dds_write(dds, f, 0, null(), 8, 0), DDS_INVALID_ARGUMENT);
        let mut n = 1234u32;
        ok(dds_write_sync(dds, f, 0, null(), 0, &mut n));
        assert_eq!(n, 0);
        ok(dds_write_sync(
            dds,
            f,
            0,
            c"hello".as_ptr().cast(),
            5,
            &mut n,
        ));
        assert_eq!(n, 5);
        assert_rc(dds_read_sync(dds, f, 100, b, 8, &mut n), DDS_OUT_OF_RANGE);
        let big = vec![0u8; dinfo.max_io_bytes as usize + 1];
        assert_rc(
            dds_write_sync(dds, f, 0, big.as_ptr().cast(), big.len() as u32, null_mut()),
            DDS_TOO_LARGE,
        );
        let iov = [dds_iovec { base: b, len: 8 }; DDS_IOV_MAX + 1];
        assert_rc(
            dds_read_scatter(dds, f, 0, iov.as_ptr(), 0, 0),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(
            dds_read_scatter(dds, f, 0, iov.as_ptr(), DDS_IOV_MAX + 1, 0),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(
            dds_read_scatter(dds, f, 0, null(), 1, 0),
            DDS_INVALID_ARGUMENT,
        );
        let null_iov = [dds_iovec {
            base: null_mut(),
            len: 8,
        }];
        assert_rc(
            dds_read_scatter(dds, f, 0, null_iov.as_ptr(), 1, 0),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(
            dds_write_gather(dds, f, 0, null(), 1, 0),
            DDS_INVALID_ARGUMENT,
        );
        let giov = [dds_const_iovec {
            base: c"x".as_ptr().cast(),
            len: 1,
        }];
        assert_rc(
            dds_write_gather(dds, f, 0, giov.as_ptr(), 0, 0),
            DDS_INVALID_ARGUMENT,
        );
        // Nothing acknowledged was lost.
        ok(dds_read_sync(dds, f, 0, b, 64, &mut n));
        assert_eq!(&buf[..n as usize], b"hello");

        // Deleted files become unknown.
        ok(dds_delete_file(dds, f));
        assert_rc(dds_stat(dds, f, &mut info), DDS_UNKNOWN_FILE);
        ok(dds_remove_directory(dds, c"/d".as_ptr()));
        ok(dds_disconnect(dds));
    }
    dpu.shutdown();
}

#[test]
fn groups_poll_wait_and_listing() {
    let dpu = start_dpu();
    let dds = connect(dpu.socket());
    let other = connect(dpu.socket());
    unsafe {
        let f = create_file(dds, "/data");
        let mut cfg = std::mem::zeroed::<dds_group_config>();
        ok(dds_group_config_default(&mut cfg));
        // Bad group settings.
        let mut g = null_mut();
        let mut bad = cfg;
        bad.request_ring_bytes = 100_000;
        assert_rc(dds_create_group(dds, &bad, &mut g), DDS_INVALID_ARGUMENT);
        bad = cfg;
        bad.max_outstanding = 0;
        assert_rc(dds_create_group(dds, &bad, &mut g), DDS_INVALID_ARGUMENT);
        bad.max_outstanding = 65535;
        assert_rc(dds_create_group(dds, &bad, &mut g), DDS_INVALID_ARGUMENT);
        assert!(g.is_null());

        cfg.max_outstanding = 2;
        cfg.request_ring_bytes = 64 << 10;
        cfg.response_ring_bytes = 64 << 10;
        ok(dds_create_group(dds, &cfg, &mut g));
        ok(dds_poll_add(dds, f, g, 0xABC));
        // Groups belong to their connection.
        assert_rc(dds_poll_add(other, f, g, 1), DDS_INVALID_ARGUMENT);
        let mut def = null_mut();
        ok(dds_default_group(dds, &mut def));
        assert_rc(dds_delete_group(dds, def), DDS_INVALID_ARGUMENT);
        assert_rc(dds_delete_group(other, g), DDS_INVALID_ARGUMENT);

        // Nothing pending: non-blocking and timed poll-waits time out.
        let mut c = completion();
        assert_rc(dds_poll_wait(g, &mut c, 0), DDS_TIMEOUT);
        let t = Instant::now();
        assert_rc(dds_poll_wait(g, &mut c, 20_000), DDS_TIMEOUT);
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert_eq!(c.status, -1, "untouched on timeout");

        // Two slots: a third operation is refused until one completes.
        let data = [7u8; 4096];
        ok(dds_write(dds, f, 0, data.as_ptr().cast(), 4096, 1));
        ok(dds_write(dds, f, 4096, data.as_ptr().cast(), 4096, 2));
        assert_rc(
            dds_write(dds, f, 8192, data.as_ptr().cast(), 4096, 3),
            DDS_TOO_MANY_OUTSTANDING,
        );
        let mut outstanding = 0usize;
        ok(dds_group_outstanding(g, &mut outstanding));
        assert_eq!(outstanding, 2);
        let mut got = [completion(); 4];
        let mut n = 0usize;
        let mut seen = Vec::new();
        while seen.len() < 2 {
            ok(dds_poll_wait_many(
                g,
                got.as_mut_ptr(),
                4,
                &mut n,
                5_000_000,
            ));
            assert!(n >= 1);
            for c in &got[..n] {
                assert_eq!((c.file_ctx, c.status, c.bytes), (0xABC, DDS_OK, 4096));
                seen.push(c.io_ctx);
            }
        }
        seen.sort();
        assert_eq!(seen, [1, 2]);
        assert_rc(
            dds_poll_wait_many(g, got.as_mut_ptr(), 0, &mut n, 0),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(
            dds_poll_wait_many(g, got.as_mut_ptr(), 4, &mut n, 0),
            DDS_TIMEOUT,
        );
        assert_eq!(n, 0);

        // A sleeping wait (DDS_WAIT_FOREVER) wakes on the completion.
        let mut back = [0u8; 8192];
        ok(dds_read(dds, f, 0, back.as_mut_ptr().cast(), 8192, 9));
        ok(dds_poll_wait(g, &mut c, DDS_WAIT_FOREVER));
        assert_eq!((c.io_ctx, c.status, c.bytes), (9, DDS_OK, 8192));
        assert!(back.iter().all(|&x| x == 7));
        ok(dds_flush(dds, f, 10));
        ok(dds_poll_wait(g, &mut c, 5_000_000));
        assert_eq!((c.io_ctx, c.status, c.bytes), (10, DDS_OK, 0));

        // Size changes.
        let mut size = 0u64;
        ok(dds_get_file_size(dds, f, &mut size));
        assert_eq!(size, 8192);
        ok(dds_change_file_size(dds, f, 100));
        ok(dds_get_file_size(dds, f, &mut size));
        assert_eq!(size, 100);

        // Deleting the group: the handle is freed, a second delete is refused without
        // touching it, and the file's completions go back to the default group.
        ok(dds_delete_group(dds, g));
        assert_rc(dds_delete_group(dds, g), DDS_INVALID_ARGUMENT);
        ok(dds_write(dds, f, 0, data.as_ptr().cast(), 10, 11));
        ok(dds_poll_wait(def, &mut c, 5_000_000));
        assert_eq!(
            (c.file_ctx, c.io_ctx, c.status, c.bytes),
            (0, 11, DDS_OK, 10)
        );

        // Rename, listing, free space.
        ok(dds_create_directory(dds, c"/dir".as_ptr()));
        ok(dds_rename(dds, c"/data".as_ptr(), c"/dir/renamed".as_ptr()));
        let mut info = dds_file_info { id: 0, size: 0 };
        ok(dds_lookup(dds, c"/dir/renamed".as_ptr(), &mut info));
        assert_eq!(info, dds_file_info { id: f, size: 100 });
        create_file(dds, "/dir/second");
        assert_rc(
            dds_rename(dds, c"/dir/second".as_ptr(), c"/dir/renamed".as_ptr()),
            DDS_EXISTS,
        );
        let mut it = null_mut();
        ok(dds_list_directory(dds, c"/dir".as_ptr(), &mut it));
        let mut count = 0usize;
        ok(dds_dir_count(it, &mut count));
        assert_eq!(count, 2);
        let mut names = Vec::new();
        let mut e = std::mem::zeroed::<dds_dir_entry>();
        let mut has = false;
        loop {
            ok(dds_dir_next(it, &mut e, &mut has));
            if !has {
                break;
            }
            let n = CStr::from_ptr(e.name).to_str().unwrap().to_string();
            if n == "renamed" {
                assert_eq!((e.kind, e.id, e.size), (DDS_ENTRY_FILE, f, 100));
            }
            names.push(n);
        }
        names.sort();
        assert_eq!(names, ["renamed", "second"]);
        assert_rc(dds_dir_next(it, null_mut(), &mut has), DDS_INVALID_ARGUMENT);
        ok(dds_dir_close(it));
        // The root lists the directory.
        ok(dds_list_directory(dds, c"/".as_ptr(), &mut it));
        ok(dds_dir_next(it, &mut e, &mut has));
        assert!(has);
        assert_eq!(CStr::from_ptr(e.name).to_str().unwrap(), "dir");
        assert_eq!(e.kind, DDS_ENTRY_DIR);
        ok(dds_dir_next(it, &mut e, &mut has));
        assert!(!has);
        ok(dds_dir_close(it));
        assert_rc(
            dds_list_directory(dds, c"/missing".as_ptr(), &mut it),
            DDS_UNKNOWN_DIR,
        );
        let mut space = std::mem::zeroed::<dds_space_info>();
        ok(dds_free_space(dds, &mut space));
        assert!(space.free_bytes <= space.total_bytes && space.total_bytes > 0);
        assert_eq!(space.files, 2);

        // Groups still alive at disconnect are freed with the connection.
        let mut g2 = null_mut();
        ok(dds_create_group(dds, null(), &mut g2));
        let mut connected = false;
        ok(dds_is_connected(dds, &mut connected));
        assert!(connected);
        ok(dds_disconnect(other));
        ok(dds_disconnect(dds));
    }
    dpu.shutdown();
}

/// Raw pointers that the test hands to other threads.
#[derive(Clone, Copy)]
struct Shared(*mut dds_t);
// SAFETY: a dds_t may be used from many threads at once.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

#[test]
fn one_connection_many_threads() {
    let dpu = start_dpu();
    let dds = Shared(connect(dpu.socket()));
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                let dds = dds;
                let f = create_file(dds.0, &format!("/t{t}"));
                for i in 0..50u64 {
                    let data = vec![t.wrapping_mul(31).wrapping_add(i as u8); 1000];
                    let mut n = 0u32;
                    // SAFETY: valid arguments; the handle outlives the scope.
                    unsafe {
                        ok(dds_write_sync(
                            dds.0,
                            f,
                            i * 1000,
                            data.as_ptr().cast(),
                            1000,
                            &mut n,
                        ));
                        let mut back = vec![0u8; 1000];
                        ok(dds_read_sync(
                            dds.0,
                            f,
                            i * 1000,
                            back.as_mut_ptr().cast(),
                            1000,
                            &mut n,
                        ));
                        assert_eq!(n, 1000);
                        assert_eq!(back, data);
                    }
                }
            });
        }
    });
    // SAFETY: no other thread uses the handle any more.
    unsafe { ok(dds_disconnect(dds.0)) };
    dpu.shutdown();
}

#[test]
fn dpu_gone_is_dpu_dead() {
    let dpu = start_dpu();
    let dds = connect(dpu.socket());
    unsafe {
        let f = create_file(dds, "/f");
        let mut g = null_mut();
        ok(dds_default_group(dds, &mut g));
        dpu.shutdown();
        let mut info = dds_file_info { id: 0, size: 0 };
        assert_rc(dds_stat(dds, f, &mut info), DDS_DPU_DEAD);
        let mut connected = true;
        ok(dds_is_connected(dds, &mut connected));
        assert!(!connected);
        let mut c = completion();
        assert_rc(dds_poll_wait(g, &mut c, 1_000_000), DDS_DPU_DEAD);
        let data = [1u8; 8];
        assert_rc(
            dds_write(dds, f, 0, data.as_ptr().cast(), 8, 0),
            DDS_DPU_DEAD,
        );
        ok(dds_disconnect(dds));
    }
}

/// Registered buffers through the C functions: DMA round trips, handle checks (NULL, another
/// connection's buffer, a freed handle), range errors, and buffers left to `dds_disconnect`.
#[test]
fn registered_buffers() {
    let dpu = start_dpu();
    let dds = connect(dpu.socket());
    let other = connect(dpu.socket());
    let file = create_file(dds, "/registered");
    let mut buf = null_mut();
    // SAFETY (whole test): valid arguments unless a check is the point.
    unsafe {
        assert_rc(
            dds_register_buffer(null_mut(), 4096, &mut buf),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(dds_register_buffer(dds, 0, &mut buf), DDS_INVALID_ARGUMENT);
        ok(dds_register_buffer(dds, 64 << 10, &mut buf));
        let mut data: *mut c_void = null_mut();
        let mut len = 0usize;
        ok(dds_buffer_data(buf, &mut data, &mut len));
        assert_eq!(len, 64 << 10);
        assert_eq!(data as usize % 4096, 0);
        let bytes = std::slice::from_raw_parts_mut(data.cast::<u8>(), len);
        for (i, b) in bytes[..8192].iter_mut().enumerate() {
            *b = (i * 13 + 5) as u8;
        }
        let mut n = 0u32;
        ok(dds_write_registered_sync(
            dds, file, 0, buf, 0, 8192, &mut n,
        ));
        assert_eq!(n, 8192);
        let mut plain = vec![0u8; 8192];
        ok(dds_read_sync(
            dds,
            file,
            0,
            plain.as_mut_ptr().cast(),
            8192,
            &mut n,
        ));
        assert!(plain[..] == bytes[..8192]);
        ok(dds_read_registered_sync(
            dds,
            file,
            4096,
            buf,
            32 << 10,
            8192,
            &mut n,
        ));
        assert_eq!(n, 4096, "short read at the end of the file");
        assert!(bytes[32 << 10..(32 << 10) + 4096] == plain[4096..]);
        // Async, completing through the default group.
        ok(dds_read_registered(dds, file, 0, buf, 16 << 10, 4096, 7));
        let mut group = null_mut();
        ok(dds_default_group(dds, &mut group));
        let mut c = completion();
        ok(dds_poll_wait(group, &mut c, 5_000_000));
        assert_eq!((c.io_ctx, c.status, c.bytes), (7, DDS_OK, 4096));
        assert!(bytes[16 << 10..(16 << 10) + 4096] == plain[..4096]);

        assert_rc(
            dds_read_registered_sync(dds, file, 0, buf, (64 << 10) - 1, 2, null_mut()),
            DDS_BUFFER_RANGE,
        );
        assert_rc(
            dds_write_registered(dds, file, 0, null(), 0, 16, 0),
            DDS_INVALID_ARGUMENT,
        );
        // Another connection's buffer.
        assert_rc(
            dds_write_registered_sync(other, file, 0, buf, 0, 16, null_mut()),
            DDS_INVALID_ARGUMENT,
        );
        assert_rc(dds_unregister_buffer(other, buf), DDS_INVALID_ARGUMENT);
        ok(dds_unregister_buffer(dds, buf));
        // A buffer left registered is freed by dds_disconnect.
        let mut left = null_mut();
        ok(dds_register_buffer(dds, 4096, &mut left));
    }
    let st = dds_host::Dds::connect(dpu.socket())
        .unwrap()
        .stats()
        .unwrap();
    assert_eq!((st.registered_buffers, st.registered_bytes), (1, 4096));
    // SAFETY: live handles, used by no other thread.
    unsafe {
        ok(dds_disconnect(dds));
        ok(dds_disconnect(other));
    }
    let probe = dds_host::Dds::connect(dpu.socket()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while probe.stats().unwrap().registered_buffers != 0 {
        assert!(Instant::now() < deadline, "buffers not released");
        std::thread::sleep(Duration::from_millis(10));
    }
    dpu.shutdown();
}
