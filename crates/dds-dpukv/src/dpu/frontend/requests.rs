//! Data commands as KV requests: checked, routed, encoded and batched onto the KV queue pairs
//! (or run on an in-process store), batches posted and response reads polled, and each KV
//! response delivered to its command, whose reply is rendered once all of its responses are in
//! (into the place reserved for it in the connection's output).

use super::connections::filled;
use super::{
    Backend, FrontSession, FrontState, FrontStats, Kind, Queues, Staged, Wait, Waiter,
    INT_TEXT_MAX, MAX_KEY, SINGLE,
};
use crate::cluster::Route;
use crate::queue::{queue_of, DpuQueue, QueueFault};
use dds_dma::DmaEngine;
use dds_kvmem::qp::{request_len, Op, Request, Response, Status, BATCH_HEADER};
use dds_kvmem::{key_hash, partition_of, qp};
use dds_resp::session::int_arg;
use dds_resp::Reply;
use dds_server::{Completions, ConnId, Out, Ticket};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl FrontState {
    /// A data command: checks, routes, and makes its KV requests.
    pub(super) fn data(
        &mut self,
        id: ConnId,
        s: &mut FrontSession,
        name: &str,
        argv: &[&[u8]],
        used: usize,
        out: &mut Out<'_>,
    ) {
        let (kind, step) = match name {
            "get" => (Kind::Get, 1),
            "set" => (Kind::Set, 2),
            "del" | "unlink" => (Kind::Del, 1),
            "exists" => (Kind::Exists, 1),
            "incr" | "decr" | "incrby" | "decrby" => (Kind::Incr, 1),
            "mget" => (Kind::MGet, 1),
            "mset" => (Kind::MSet, 2),
            _ => unreachable!("data commands only"),
        };
        let nkeys = match kind {
            Kind::Get | Kind::Set | Kind::Incr => 1,
            _ => (argv.len() - 1).div_ceil(step),
        };
        let keys = || argv[1..].iter().step_by(step).take(nkeys).copied();
        let err = |out: &mut Out<'_>, text: &str| Reply::new(out).error(text);
        match self.cfg.cluster.route(keys()) {
            Route::Here => {}
            Route::Moved(slot, addr) => return err(out, &format!("MOVED {slot} {addr}")),
            Route::CrossSlot => {
                return err(out, "CROSSSLOT Keys in request don't hash to the same slot")
            }
        }
        if keys().any(|k| k.is_empty() || k.len() > MAX_KEY) {
            return err(
                out,
                &format!("ERR keys of 1 to {MAX_KEY} bytes only in the in-memory store"),
            );
        }
        let incr = match name {
            "incr" => Some(1),
            "decr" => Some(-1),
            "incrby" | "decrby" => match int_arg(argv[2]) {
                None => return err(out, "ERR value is not an integer or out of range"),
                Some(v) if name == "decrby" => match v.checked_neg() {
                    Some(v) => Some(v),
                    None => return err(out, "ERR decrement would overflow"),
                },
                Some(v) => Some(v),
            },
            _ => None,
        };
        if matches!(kind, Kind::Set | Kind::MSet)
            && argv[2..]
                .iter()
                .step_by(2)
                .any(|v| v.len() > self.cfg.max_value)
        {
            return err(
                out,
                &format!(
                    "ERR value too large (limit {} bytes, --max-value)",
                    self.cfg.max_value
                ),
            );
        }
        let op_of = |sub: usize| match kind {
            Kind::Get | Kind::MGet => Op::Get,
            Kind::Set => Op::Set(argv[2]),
            Kind::MSet => Op::Set(argv[2 + 2 * sub]),
            Kind::Del => Op::Del,
            Kind::Exists => Op::Exists,
            Kind::Incr => Op::Incr(incr.expect("increment")),
        };
        if let Backend::Queues(q) = &self.backend {
            // A request travels in one batch: one that no slot can carry is refused here
            // (it would otherwise wait for room that never comes).
            let batch_max = q.queues.first().map_or(0, DpuQueue::batch_max);
            let too_big = keys().enumerate().any(|(sub, key)| {
                BATCH_HEADER
                    + request_len(&Request {
                        key,
                        op: op_of(sub),
                    })
                    > batch_max
            });
            if too_big {
                return err(
                    out,
                    &format!(
                        "ERR key and value too large for a KV queue slot ({batch_max} bytes, --slot-bytes)"
                    ),
                );
            }
        }
        self.stats
            .kv_requests
            .fetch_add(nkeys as u64, Ordering::Relaxed);
        self.stats
            .raw_bytes
            .fetch_add(used as u64, Ordering::Relaxed);
        let wait = match kind {
            Kind::Get | Kind::Set | Kind::Incr => SINGLE,
            _ => {
                let i = match self.free_waits.pop() {
                    Some(i) => i as usize,
                    None => {
                        self.waits.push(Wait::default());
                        self.waits.len() - 1
                    }
                };
                let w = &mut self.waits[i];
                w.left = nkeys as u32;
                w.sum = 0;
                w.err = None;
                w.items.clear();
                if kind == Kind::MGet {
                    w.items.resize(nkeys, None);
                }
                i as u32
            }
        };
        let ticket = match self.backend {
            Backend::Queues(_) => {
                s.waiting += 1;
                out.defer().to_u32()
            }
            Backend::Local(_) => 0,
        };
        for (sub, key) in keys().enumerate() {
            let req = Request {
                key,
                op: op_of(sub),
            };
            let w = Waiter {
                conn: id,
                ticket,
                kind,
                resp3: s.session.resp3,
                wait,
                sub: sub as u32,
            };
            self.request(&req, w, out);
        }
    }

    /// Hands one KV request to the backend.
    fn request(&mut self, req: &Request<'_>, w: Waiter, out: &mut Out<'_>) {
        let FrontState {
            backend,
            stats,
            waits,
            free_waits,
            staged,
            bufs,
            record,
            fault,
            ..
        } = self;
        match backend {
            Backend::Local(store) => {
                let mut p = store.lock(req.key);
                let mut sink = Sink::Direct { out };
                qp::execute(&mut p, req, |resp| {
                    deliver(waits, free_waits, stats, &mut sink, w, resp)
                });
            }
            Backend::Queues(q) => {
                let worker = partition_of(key_hash(req.key), q.partitions) % q.queues.len();
                let worst = match req.op {
                    // INCR stores its result as text: values up to 20 bytes whatever the
                    // largest SET.
                    Op::Get => qp::max_value_response(q.max_value.max(INT_TEXT_MAX)),
                    Op::Incr(_) => 9,
                    _ => 1,
                };
                let expect = match req.op {
                    Op::Get => (q.get_mean16 as usize + 8) / 16,
                    _ => worst,
                };
                record.clear();
                encode_request(record, req);
                let queue = &mut q.queues[worker];
                if !queue.fits(record.len(), worst) {
                    if let Err(e) = send_batches(q, stats) {
                        tracing::error!(error = %e, "sending a KV batch failed");
                    }
                }
                let mut sink = Sink::Stage { staged, bufs };
                if !q.queues[worker].fits(record.len(), worst) {
                    // Every slot is in flight: wait for a response (bounded by the host).
                    // Replies finished meanwhile are staged for the next completion pass.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !q.queues[worker].fits(record.len(), worst) && Instant::now() < deadline {
                        if let Err(e) = pump(q, stats, waits, free_waits, &mut sink) {
                            if fault.is_none() {
                                *fault = Some(e.into());
                            }
                            break;
                        }
                        let _ = send_batches(q, stats);
                    }
                }
                let queue = &mut q.queues[worker];
                if queue.fits(record.len(), worst) {
                    queue.push(record, expect, worst, w);
                } else {
                    let text = "ERR the host's KV workers do not answer";
                    fail(waits, free_waits, stats, &mut sink, w, text);
                }
            }
        }
    }
}

/// Where the reply of a KV request's command goes.
pub(super) enum Sink<'a, 'b> {
    /// The connection's output (the store is in-process: the reply is ready at once).
    Direct { out: &'a mut Out<'b> },
    /// The place reserved for it (its response arrived).
    Done {
        done: &'a mut Completions<'b, FrontSession>,
        max_pending: usize,
    },
    /// A buffer, filled into the reserved place at the next completion pass (the response
    /// arrived while a request of another command waited for room).
    Stage {
        staged: &'a mut Vec<Staged>,
        bufs: &'a mut Vec<Vec<u8>>,
    },
}

impl Sink<'_, '_> {
    /// Renders `w`'s command's reply with `render`.
    fn reply(&mut self, stats: &FrontStats, w: &Waiter, render: impl FnOnce(&mut Reply<'_>)) {
        let put = |buf: &mut Vec<u8>| {
            let before = buf.len();
            render(&mut Reply::with_protocol(buf, w.resp3));
            stats
                .raw_bytes
                .fetch_add((buf.len() - before) as u64, Ordering::Relaxed);
        };
        match self {
            Sink::Direct { out } => put(out),
            Sink::Done {
                done, max_pending, ..
            } => {
                let resume = match done.fill(w.conn, Ticket::from_u32(w.ticket)) {
                    Some((s, buf)) => {
                        put(buf);
                        filled(s, *max_pending)
                    }
                    None => false,
                };
                if resume {
                    done.resume(w.conn);
                }
            }
            Sink::Stage { staged, bufs } => {
                let mut bytes = bufs.pop().unwrap_or_default();
                put(&mut bytes);
                staged.push(Staged {
                    conn: w.conn,
                    ticket: w.ticket,
                    bytes,
                });
            }
        }
    }
}

fn encode_request(out: &mut Vec<u8>, r: &Request<'_>) {
    debug_assert!(out.is_empty());
    // The codec's own writer, on a scratch batch: the record is what follows the header.
    let mut w = qp::BatchWriter::new(out, 0, qp::BATCH_MAX);
    let ok = w.request(r);
    debug_assert!(ok);
    w.finish();
    out.drain(..BATCH_HEADER);
    debug_assert_eq!(out.len(), request_len(r));
}

/// Posts the batches that are ready and the response reads that are due, in one doorbell.
pub(super) fn send_batches(
    q: &mut Queues,
    stats: &FrontStats,
) -> std::result::Result<(), QueueFault> {
    let mut posted = 0;
    for (i, queue) in q.queues.iter_mut().enumerate() {
        // SAFETY: the engine completes every operation before the queues are dropped
        // (`Frontend::run` drains it on the way out).
        unsafe {
            if queue
                .post_batch(&mut q.engine, i as u32)
                .map_err(QueueFault::Dma)?
            {
                posted += 1;
                stats.batches.fetch_add(1, Ordering::Relaxed);
            }
            if queue
                .post_poll(&mut q.engine, i as u32)
                .map_err(QueueFault::Dma)?
            {
                posted += 1;
            }
        }
    }
    if posted > 0 {
        q.engine.submit();
    }
    Ok(())
}

/// Takes DMA completions; delivers the responses of complete batches. True when something
/// completed.
pub(super) fn pump(
    q: &mut Queues,
    stats: &FrontStats,
    waits: &mut [Wait],
    free_waits: &mut Vec<u32>,
    sink: &mut Sink<'_, '_>,
) -> std::result::Result<bool, QueueFault> {
    let n = q.engine.poll(&mut q.completions);
    let mut more = false;
    for k in 0..n {
        let done = q.completions[k].clone();
        done.result.map_err(QueueFault::Dma)?;
        let idx = queue_of(done.user_data) as usize;
        let queue = q
            .queues
            .get_mut(idx)
            .ok_or(QueueFault::Protocol("completion of an unknown queue"))?;
        // SAFETY: as in `send_batches`.
        let got = unsafe { queue.complete(&mut q.engine, idx as u32, done.user_data)? };
        let Some((batch, o)) = got else {
            more = true;
            continue;
        };
        // The response bytes of GET answers, hits and misses (a miss may also answer a DEL
        // or EXISTS: close enough for a prediction).
        let mut bytes = 0usize;
        let mut gets = 0usize;
        for (resp, &w) in qp::responses(batch).zip(&o.waiters) {
            let resp = resp.map_err(QueueFault::Malformed)?;
            if matches!(
                resp,
                Response::Value(_) | Response::Status(qp::Status::NotFound)
            ) {
                bytes += qp::response_len(&resp);
                gets += 1;
            }
            deliver(waits, free_waits, stats, sink, w, resp);
        }
        q.queues[idx].recycle(o.waiters);
        // Fixed point, so that a run of equal responses is predicted exactly (a float mean
        // drifts above it, and a rounded-up prediction reads a byte too many a GET).
        if let Some(mean16) = (bytes * 16 + gets / 2).checked_div(gets) {
            q.get_mean16 = (q.get_mean16 * 7 + mean16.min(1 << 24) as u32 + 4) / 8;
        }
        more = true;
    }
    if n > 0 {
        // Second reads of long batches were posted while completing: start them.
        q.engine.submit();
    }
    if more {
        // Reads that found nothing are re-posted by the next `send_batches`.
        let s = q.engine.stats();
        let bytes = s.bytes_read + s.bytes_written;
        let ops = s.reads + s.writes;
        stats
            .dma_bytes
            .fetch_add(bytes - q.last_stats.0, Ordering::Relaxed);
        stats
            .dma_ops
            .fetch_add(ops - q.last_stats.1, Ordering::Relaxed);
        q.last_stats = (bytes, ops);
        let empty: u64 = q
            .queues
            .iter_mut()
            .map(|x| std::mem::take(&mut x.empty_polls))
            .sum();
        stats.empty_polls.fetch_add(empty, Ordering::Relaxed);
    }
    Ok(more)
}

fn error_text(st: Status) -> &'static str {
    match st {
        Status::NotInteger => "ERR value is not an integer or out of range",
        Status::Overflow => "ERR increment or decrement would overflow",
        Status::OutOfMemory => "ERR out of memory: the store's memory budget is full",
        Status::Ok | Status::NotFound => "ERR internal: not an error",
    }
}

/// Renders the reply of a single-key command straight from its response.
fn render_single(kind: Kind, resp: &Response<'_>, r: &mut Reply<'_>) {
    match (kind, resp) {
        (
            _,
            Response::Status(st @ (Status::NotInteger | Status::Overflow | Status::OutOfMemory)),
        ) => r.error(error_text(*st)),
        (Kind::Get, Response::Value(v)) => r.bulk(v),
        (Kind::Get, _) => r.null(),
        (Kind::Set, _) => r.ok(),
        (Kind::Del | Kind::Exists, Response::Status(Status::Ok)) => r.int(1),
        (Kind::Del | Kind::Exists, _) => r.int(0),
        (Kind::Incr, Response::Int(n)) => r.int(*n),
        _ => r.error("ERR internal: unexpected response"),
    }
}

/// Gives one KV response to its command.
fn deliver(
    waits: &mut [Wait],
    free_waits: &mut Vec<u32>,
    stats: &FrontStats,
    sink: &mut Sink<'_, '_>,
    w: Waiter,
    resp: Response<'_>,
) {
    if w.wait == SINGLE {
        // The common case: a command answered by one response, rendered from it.
        sink.reply(stats, &w, |r| render_single(w.kind, &resp, r));
        return;
    }
    let Some(wait) = waits.get_mut(w.wait as usize) else {
        return;
    };
    match resp {
        Response::Status(st @ (Status::NotInteger | Status::Overflow | Status::OutOfMemory)) => {
            wait.err.get_or_insert(error_text(st));
        }
        Response::Status(Status::Ok) if matches!(w.kind, Kind::Del | Kind::Exists) => wait.sum += 1,
        Response::Value(v) => {
            if let Some(slot) = wait.items.get_mut(w.sub as usize) {
                *slot = Some(v.to_vec());
            }
        }
        Response::Int(n) => wait.sum = n,
        Response::Status(_) => {}
    }
    gathered(waits, free_waits, stats, sink, w);
}

/// One response of a command of several keys is in: renders its reply after the last one.
fn gathered(
    waits: &mut [Wait],
    free_waits: &mut Vec<u32>,
    stats: &FrontStats,
    sink: &mut Sink<'_, '_>,
    w: Waiter,
) {
    let Some(wait) = waits.get_mut(w.wait as usize) else {
        return;
    };
    wait.left = wait.left.saturating_sub(1);
    if wait.left > 0 {
        return;
    }
    sink.reply(stats, &w, |r| match wait.err {
        Some(e) => r.error(e),
        None => match w.kind {
            Kind::Del | Kind::Exists => r.int(wait.sum),
            Kind::MSet => r.ok(),
            Kind::MGet => {
                r.array(wait.items.len());
                for it in &wait.items {
                    match it {
                        Some(v) => r.bulk(v),
                        None => r.null(),
                    }
                }
            }
            Kind::Get | Kind::Set | Kind::Incr => r.error("ERR internal: unexpected response"),
        },
    });
    wait.items.clear();
    free_waits.push(w.wait);
}

/// A KV request that got no response: its command answers `text`.
fn fail(
    waits: &mut [Wait],
    free_waits: &mut Vec<u32>,
    stats: &FrontStats,
    sink: &mut Sink<'_, '_>,
    w: Waiter,
    text: &'static str,
) {
    if w.wait == SINGLE {
        sink.reply(stats, &w, |r| r.error(text));
        return;
    }
    if let Some(wait) = waits.get_mut(w.wait as usize) {
        wait.err.get_or_insert(text);
    }
    gathered(waits, free_waits, stats, sink, w);
}
