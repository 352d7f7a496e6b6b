//! The host/DPU → client direction: completions of offloaded reads and responses sent in
//! request order.

use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;

use dds_offload_api::OffloadApp;
use dds_offload_engine::{CtxState, Pool, PortResult};
use dds_proto::Status;

use crate::conn::{response_len, Close, Conn, Entry};
use crate::stats::add;
use crate::uring::Leg;
use crate::worker::{would_block, Worker, IOV_MAX};

impl Worker {
    pub(crate) fn reap_completions(&mut self) {
        let Worker {
            lane,
            pool,
            app,
            conns,
            dirty,
            stats,
            round_bytes,
            ..
        } = self;
        let mut failed: [usize; 16] = [usize::MAX; 16];
        let mut nfailed = 0;
        // Merges one completed read; returns its response's bytes.
        let mut merge = |token: u64, res: PortResult| -> u64 {
            let mut bytes = 0;
            let i = token as u32;
            let Some(ctx) = pool.ctxs.get(i as usize).copied() else {
                tracing::error!(token, "completion for an unknown context");
                return 0;
            };
            match ctx.state {
                CtxState::Orphan => {
                    pool.ctxs[i as usize].state = CtxState::Ready;
                    pool.release(i);
                    return 0;
                }
                CtxState::InFlight => {}
                _ => {
                    tracing::error!(token, "completion for a context not in flight");
                    return 0;
                }
            }
            let res = match res {
                Ok(n) if n <= ctx.op.size => {
                    add(&stats.offload_bytes, u64::from(n));
                    Ok(n)
                }
                Ok(_) => Err(Status::Io.code()),
                Err(code) => Err(code),
            };
            pool.ctxs[i as usize].state = CtxState::Ready;
            let (room, data) = pool.room_and_data(i);
            let room_len = room.len();
            let cap = data.len();
            let built =
                app.build_response(&ctx.head[..ctx.head_len as usize], &ctx.op, res, room, data);
            let slot = ctx.conn as usize;
            match built {
                Ok(l)
                    if (l.header_len as usize) <= room_len
                        && l.total_len >= l.header_len
                        && (l.total_len - l.header_len) as usize <= cap =>
                {
                    pool.ctxs[i as usize].layout = l;
                    bytes = u64::from(l.total_len);
                }
                other => {
                    if let Err(e) = other {
                        tracing::warn!(reason = e.0, "response builder failed");
                    } else {
                        tracing::warn!("response builder returned an out-of-range layout");
                    }
                    if nfailed < failed.len() {
                        failed[nfailed] = slot;
                        nfailed += 1;
                    }
                    pool.ctxs[i as usize].layout = Default::default();
                }
            }
            if let Some(c) = conns.get_mut(slot).and_then(|c| c.as_mut()) {
                if c.gen == ctx.gen {
                    c.dpu_inflight -= 1;
                    if c.dpu_inflight == 0 {
                        c.hold = None;
                    }
                    if !c.dirty {
                        c.dirty = true;
                        dirty.push(slot);
                    }
                }
            }
            bytes
        };
        // A round sends at most about `round_bytes` of offloaded responses: the rest wait
        // for the next round, and the reads that requests arriving meanwhile need reach the
        // device first.
        let mut round = 0u64;
        lane.poll_completions_while(|token, res| {
            round += merge(token, res);
            round < *round_bytes
        });
        for &slot in &failed[..nfailed] {
            if self.conns[slot].is_some() {
                self.close(
                    slot,
                    Close::Malformed("offload app built an invalid response"),
                );
            }
        }
    }

    /// Sends ready responses in request order, straight from where they are (host input
    /// buffer, read buffers, or the copy-mode packet buffer).
    pub(crate) fn flush_client(&mut self, slot: usize) -> Result<bool, Close> {
        let mut progress = false;
        let applied = self.lane.invalidations_applied();
        loop {
            let Worker {
                app,
                pool,
                conns,
                stats,
                copy_mode,
                gated,
                uring,
                ..
            } = self;
            let c = conns[slot].as_mut().expect("live");
            if c.sending {
                return Ok(progress);
            }
            if *copy_mode {
                // Copy ready DPU responses into the packet buffer (the Fig. 20 baseline).
                for e in c.order.iter_mut() {
                    match *e {
                        Entry::Dpu { ctx } if pool.ctxs[ctx as usize].state == CtxState::Ready => {
                            let resp = pool.response(ctx);
                            match c.cout.room(resp.len()) {
                                Ok(true) => {}
                                Ok(false) => break,
                                Err(_) => return Err(Close::OutOfMemory),
                            }
                            let len = resp.len();
                            c.cout.tail()[..len].copy_from_slice(resp);
                            c.cout.commit(len);
                            pool.release(ctx);
                            c.dpu_ctxs -= 1;
                            *e = Entry::Copied { len: len as u32 };
                        }
                        Entry::Dpu { .. } => break,
                        _ => {}
                    }
                }
            }
            if matches!(c.order.front(), Some(Entry::Error)) && c.err_len == 0 {
                // A refused message without an error reply: the earlier replies are out.
                return Err(Close::Done);
            }
            if !c.c_writable || c.order.is_empty() {
                return Ok(progress);
            }
            let empty: &[u8] = &[];
            let mut iov = [IoSlice::new(empty); IOV_MAX];
            let mut niov = 0;
            let mut hoff = 0usize;
            let mut coff = 0usize;
            let hin = c.hin.data();
            let cout = c.cout.data();
            for (k, e) in c.order.iter().enumerate() {
                if niov == IOV_MAX {
                    break;
                }
                let bytes: &[u8] = match *e {
                    Entry::Host { gate } => {
                        if gate > applied {
                            if !c.gated {
                                c.gated = true;
                                gated.push(slot);
                            }
                            break;
                        }
                        match response_len(app.as_ref(), c.session.as_deref(), &hin[hoff..]) {
                            Ok(Some(n)) if hin.len() - hoff >= n => {
                                let b = &hin[hoff..hoff + n];
                                hoff += n;
                                b
                            }
                            _ => break,
                        }
                    }
                    Entry::Dpu { ctx } => {
                        if pool.ctxs[ctx as usize].state != CtxState::Ready {
                            break;
                        }
                        pool.response(ctx)
                    }
                    Entry::Copied { len } => {
                        let b = &cout[coff..coff + len as usize];
                        coff += len as usize;
                        b
                    }
                    Entry::Relay { len } => {
                        let b = &hin[hoff..hoff + len as usize];
                        hoff += len as usize;
                        b
                    }
                    Entry::Error => &c.err[..c.err_len],
                };
                let b = if k == 0 { &bytes[c.head_sent..] } else { bytes };
                iov[niov] = IoSlice::new(b);
                niov += 1;
            }
            if niov == 0 {
                return Ok(progress);
            }
            if let Some(u) = uring.as_mut() {
                // Handed to the kernel with the round's other sends; retired when it
                // completed (`Worker::sent`).
                u.queue_send(Leg::client(slot), c.client.as_raw_fd(), &iov[..niov]);
                add(&stats.ring_sends, 1);
                c.sending = true;
                return Ok(true);
            }
            let w = match (&c.client).write_vectored(&iov[..niov]) {
                Ok(w) => w,
                Err(e) if would_block(&e) => {
                    c.c_writable = false;
                    return Ok(progress);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Err(Close::Abort("client connection reset")),
            };
            add(&stats.client_bytes_out, w as u64);
            progress = true;
            retire(app.as_ref(), pool, c, w);
        }
    }
}

/// Retires the `w` bytes of responses sent from the head of the connection's queue: whole
/// responses leave the queue and free what held them (host input, read buffers, the packet
/// buffer); a partly sent one stays, with its sent prefix counted in `head_sent`.
pub(crate) fn retire(app: &dyn OffloadApp, pool: &mut Pool, c: &mut Conn, mut w: usize) {
    while w > 0 {
        let e = *c.order.front().expect("sent bytes belong to entries");
        let full = match e {
            Entry::Host { .. } => c
                .response_len(app, c.hin.data())
                .ok()
                .flatten()
                .expect("framed above"),
            Entry::Relay { len } => len as usize,
            Entry::Dpu { ctx } => pool.response(ctx).len(),
            Entry::Copied { len } => len as usize,
            Entry::Error => c.err_len,
        };
        let left = full - c.head_sent;
        if w < left {
            c.head_sent += w;
            break;
        }
        w -= left;
        c.head_sent = 0;
        c.order.pop_front();
        c.popped += 1;
        match e {
            Entry::Host { .. } => {
                if let Some(s) = c.session.as_mut() {
                    s.delivered(&c.hin.data()[..full]);
                }
                c.hin.consume(full);
                c.host_pending -= 1;
                c.host_retired += 1;
                while c.pend_head < c.pend_ord.len() && c.pend_ord[c.pend_head] <= c.host_retired {
                    c.pend_head += 1;
                }
            }
            Entry::Dpu { ctx } => {
                pool.release(ctx);
                c.dpu_ctxs -= 1;
            }
            Entry::Copied { len } => c.cout.consume(len as usize),
            Entry::Relay { len } => {
                c.hin.consume(len as usize);
                c.relayed -= len as usize;
            }
            Entry::Error => {
                // The error reply is the last thing the client gets.
                let _ = c.client.shutdown(Shutdown::Write);
                c.err_sent = true;
            }
        }
    }
}
