//! DPU sessions on the control socket: the accept loop, one session per DPU (the ATTACH
//! handshake, the shared region created and its memfd and doorbells passed, one worker thread per
//! channel, the control RPCs answered until the DPU hangs up), and the doorbell helpers.

use super::rpc::rpc;
use super::worker::Worker;
use super::{inc, Counters, HostOptions};
use crate::wire::*;
use dds_objstore::{ObjStore, StoreError};
use dds_shm::SharedRegion;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub(super) fn accept_loop(
    listener: UnixListener,
    store: Arc<ObjStore>,
    opts: HostOptions,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
) {
    let mut sessions: Vec<(UnixStream, JoinHandle<()>)> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        sessions.retain(|(_, h)| !h.is_finished());
        match listener.accept() {
            Ok((s, _)) => {
                if sessions.len() >= opts.max_sessions {
                    tracing::warn!("object proxy: session refused (limit reached)");
                    continue;
                }
                let Ok(s2) = s.try_clone() else { continue };
                let (st, c, o) = (store.clone(), counters.clone(), opts.clone());
                match std::thread::Builder::new()
                    .name("objproxy-session".into())
                    .spawn(move || session(s, st, c, o))
                {
                    Ok(h) => sessions.push((s2, h)),
                    Err(e) => tracing::warn!(error = %e, "object proxy: no session thread"),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Blocks until a DPU connects; wakes every 100 ms to look at `stop`.
                wait(listener.as_fd(), Duration::from_millis(100));
            }
            Err(e) => {
                tracing::warn!(error = %e, "object proxy: accept");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    for (s, h) in sessions {
        let _ = s.shutdown(std::net::Shutdown::Both);
        let _ = h.join();
    }
}

fn session(mut s: UnixStream, store: Arc<ObjStore>, counters: Arc<Counters>, opts: HostOptions) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let attach = match recv_frame(&mut s, MAX_REQUEST) {
        Ok(Some(f)) => f,
        _ => return,
    };
    let (func, id, body, _) = attach;
    let layout = match parse_attach(func, &body) {
        Ok(l) => l,
        Err(msg) => {
            let mut b = Vec::new();
            put_error(&mut b, &StoreError::InvalidArgument(msg));
            let _ = send_frame(&s, 1, id, &b, &[]);
            return;
        }
    };
    let region = match SharedRegion::create("dds-objproxy", layout.region_len() as usize) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            let mut b = Vec::new();
            put_error(&mut b, &proxy_error(format!("shared region: {e}")));
            let _ = send_frame(&s, 1, id, &b, &[]);
            return;
        }
    };
    let mut bells = Vec::new();
    for _ in 0..layout.channels {
        match rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        ) {
            Ok(fd) => bells.push(Arc::new(fd)),
            Err(e) => {
                let mut b = Vec::new();
                put_error(&mut b, &proxy_error(format!("doorbell: {e}")));
                let _ = send_frame(&s, 1, id, &b, &[]);
                return;
            }
        }
    }
    inc(&counters.sessions);
    counters.live_sessions.fetch_add(1, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for c in 0..layout.channels {
        let mut w = Worker::new(
            region.clone(),
            layout,
            c,
            store.clone(),
            counters.clone(),
            bells[c as usize].clone(),
        );
        let (st, o) = (stop.clone(), opts.clone());
        match std::thread::Builder::new()
            .name(format!("objproxy-ch{c}"))
            .spawn(move || w.run(&st, &o))
        {
            Ok(h) => workers.push(h),
            Err(e) => tracing::warn!(error = %e, "object proxy: no channel thread"),
        }
    }
    let mut reply = Vec::new();
    put_u32(&mut reply, VERSION);
    put_u32(&mut reply, layout.channels);
    put_u32(&mut reply, layout.max_dma);
    put_u32(&mut reply, SLOTS as u32);
    put_u64(&mut reply, layout.channel_bytes());
    put_u64(&mut reply, layout.region_len());
    let region_fd = region.fd();
    let mut fds = vec![region_fd.as_fd()];
    fds.extend(bells.iter().map(|b| b.as_fd()));
    if send_frame(&s, 0, id, &reply, &fds).is_ok() {
        let _ = s.set_read_timeout(None);
        while let Ok(Some((func, id, body, _))) = recv_frame(&mut s, MAX_REQUEST) {
            inc(&counters.rpcs);
            let (status, out) = match rpc(&*store, func, &body) {
                Ok(out) => (0, out),
                Err(e) => {
                    let mut b = Vec::new();
                    put_error(&mut b, &e);
                    (1, b)
                }
            };
            if send_frame(&s, status, id, &out, &[]).is_err() {
                break;
            }
        }
    }
    stop.store(true, Ordering::Release);
    for b in &bells {
        ring(b.as_fd());
    }
    for h in workers {
        if let Ok(dropped) = h.join() {
            counters
                .partial_dropped
                .fetch_add(dropped, Ordering::Relaxed);
        }
    }
    counters.live_sessions.fetch_sub(1, Ordering::Relaxed);
}

/// Rings a doorbell (an eventfd; a full counter means it is rung already).
fn ring(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Blocks until `fd` is readable or `timeout` passes; says whether it is readable.
fn wait(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut p = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    matches!(rustix::event::poll(&mut p, Some(&ts)), Ok(1))
}

/// Blocks until a doorbell (a non-blocking eventfd) is rung or `timeout` passes, and resets
/// it; says whether it was rung.
pub(super) fn wait_bell(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    wait(fd, timeout);
    let mut v = [0u8; 8];
    rustix::io::read(fd, &mut v).is_ok()
}

fn parse_attach(func: u8, body: &[u8]) -> Result<Layout, String> {
    if func != F_ATTACH {
        return Err("the first request of a session must be ATTACH".into());
    }
    let mut c = Cursor::new(body);
    let (Some(v), Some(channels), Some(max_dma)) = (c.u32(), c.u32(), c.u32()) else {
        return Err("short ATTACH".into());
    };
    if v != VERSION {
        return Err(format!("protocol version {v} (this host speaks {VERSION})"));
    }
    let l = Layout { channels, max_dma };
    l.validate()?;
    Ok(l)
}
