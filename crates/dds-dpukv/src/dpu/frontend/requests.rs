//! Data commands as KV requests: checked, routed, encoded and batched onto the KV queue pairs
//! (or run on an in-process store), batches posted and response reads polled, and each KV
//! response delivered to its command, whose reply is rendered once all of its responses are in.

use super::connections::{drain, ready};
use super::{
    Backend, Conn, Entry, FrontStats, Frontend, Kind, Queues, Wait, Waiter, INT_TEXT_MAX, MAX_KEY,
};
use crate::cluster::Route;
use crate::queue::{queue_of, DpuQueue, QueueFault};
use anyhow::Result;
use dds_dma::DmaEngine;
use dds_kvmem::qp::{request_len, Op, Request, Response, Status, BATCH_HEADER};
use dds_kvmem::{key_hash, partition_of, qp};
use dds_resp::session::int_arg;
use dds_resp::Reply;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Frontend {
    /// A data command: checks, routes, and makes its KV requests.
    pub(super) fn data(&mut self, i: usize, name: &str, argv: &[&[u8]], used: usize) {
        let (kind, keys_step) = match name {
            "get" => (Kind::Get, 1),
            "set" => (Kind::Set, 2),
            "del" | "unlink" => (Kind::Del, 1),
            "exists" => (Kind::Exists, 1),
            "incr" | "decr" | "incrby" | "decrby" => (Kind::Incr, 1),
            "mget" => (Kind::MGet, 1),
            "mset" => (Kind::MSet, 2),
            _ => unreachable!("data commands only"),
        };
        let keys: Vec<&[u8]> = match kind {
            Kind::Get | Kind::Set | Kind::Incr => vec![argv[1]],
            _ => argv[1..].iter().step_by(keys_step).copied().collect(),
        };
        let err = |this: &mut Self, text: &str| {
            let c = this.conns[i].as_mut().expect("live");
            let mut out = Vec::new();
            Reply::new(&mut out).error(text);
            ready(c, out);
        };
        match self.cfg.cluster.route(keys.iter().copied()) {
            Route::Here => {}
            Route::Moved(slot, addr) => return err(self, &format!("MOVED {slot} {addr}")),
            Route::CrossSlot => {
                return err(
                    self,
                    "CROSSSLOT Keys in request don't hash to the same slot",
                )
            }
        }
        if keys.iter().any(|k| k.is_empty() || k.len() > MAX_KEY) {
            return err(
                self,
                &format!("ERR keys of 1 to {MAX_KEY} bytes only in the in-memory store"),
            );
        }
        let incr = match name {
            "incr" => Some(1),
            "decr" => Some(-1),
            "incrby" | "decrby" => match int_arg(argv[2]) {
                None => return err(self, "ERR value is not an integer or out of range"),
                Some(v) if name == "decrby" => match v.checked_neg() {
                    Some(v) => Some(v),
                    None => return err(self, "ERR decrement would overflow"),
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
                self,
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
            let too_big = keys.iter().enumerate().any(|(sub, key)| {
                BATCH_HEADER
                    + request_len(&Request {
                        key,
                        op: op_of(sub),
                    })
                    > batch_max
            });
            if too_big {
                return err(
                    self,
                    &format!(
                        "ERR key and value too large for a KV queue slot ({batch_max} bytes, --slot-bytes)"
                    ),
                );
            }
        }
        let c = self.conns[i].as_mut().expect("live");
        let no = c.head + c.pending.len() as u64;
        c.pending.push_back(Entry::Wait(Wait {
            kind,
            left: keys.len() as u32,
            sum: 0,
            items: if kind == Kind::MGet {
                vec![None; keys.len()]
            } else {
                Vec::new()
            },
            err: None,
        }));
        let gen = c.gen;
        self.stats
            .kv_requests
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.stats
            .raw_bytes
            .fetch_add(used as u64, Ordering::Relaxed);
        for (sub, key) in keys.iter().enumerate() {
            let req = Request {
                key,
                op: op_of(sub),
            };
            let w = Waiter {
                conn: i as u32,
                gen,
                no,
                sub: sub as u32,
            };
            self.request(&req, w);
        }
    }

    /// Hands one KV request to the backend.
    fn request(&mut self, req: &Request<'_>, w: Waiter) {
        match &mut self.backend {
            Backend::Local(store) => {
                let store = store.clone();
                let mut p = store.lock(req.key);
                qp::execute(&mut p, req, |resp| {
                    deliver(&mut self.conns, &self.stats, &mut self.touched, w, resp)
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
                    Op::Get => 2 + q.value_mean as usize,
                    _ => worst,
                };
                self.record.clear();
                encode_request(&mut self.record, req);
                let queue = &mut q.queues[worker];
                if !queue.fits(self.record.len(), worst) {
                    if let Err(e) = send_batches(q, &self.stats) {
                        tracing::error!(error = %e, "sending a KV batch failed");
                    }
                }
                let queue = &mut q.queues[worker];
                if !queue.fits(self.record.len(), worst) {
                    // Every slot is in flight: wait for a response (bounded by the host).
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !q.queues[worker].fits(self.record.len(), worst)
                        && Instant::now() < deadline
                    {
                        if pump_queues(q, &mut self.conns, &self.stats, &mut self.touched).is_err()
                        {
                            break;
                        }
                        let _ = send_batches(q, &self.stats);
                    }
                }
                let queue = &mut q.queues[worker];
                if queue.fits(self.record.len(), worst) {
                    queue.push(&self.record, expect, worst, w);
                } else {
                    let text = "ERR the host's KV workers do not answer".to_string();
                    fail(&mut self.conns, &mut self.touched, w, text);
                }
            }
        }
    }

    /// Sends what is batched and takes the responses that arrived.
    pub(super) fn pump(&mut self) -> Result<()> {
        let Backend::Queues(q) = &mut self.backend else {
            return Ok(());
        };
        send_batches(q, &self.stats)?;
        pump_queues(q, &mut self.conns, &self.stats, &mut self.touched)?;
        Ok(())
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
fn send_batches(q: &mut Queues, stats: &FrontStats) -> std::result::Result<(), QueueFault> {
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

/// Takes DMA completions; delivers the responses of complete batches.
fn pump_queues(
    q: &mut Queues,
    conns: &mut [Option<Conn>],
    stats: &FrontStats,
    touched: &mut Vec<usize>,
) -> std::result::Result<(), QueueFault> {
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
        let mut values = 0usize;
        let mut gets = 0usize;
        for (resp, w) in qp::responses(batch).zip(o.waiters) {
            let resp = resp.map_err(QueueFault::Malformed)?;
            if let Response::Value(v) = resp {
                values += v.len();
                gets += 1;
            }
            deliver(conns, stats, touched, w, resp);
        }
        if let Some(mean) = values.checked_div(gets) {
            q.value_mean = 0.9 * q.value_mean + 0.1 * mean as f64;
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
    Ok(())
}

fn fail(conns: &mut [Option<Conn>], touched: &mut Vec<usize>, w: Waiter, text: String) {
    let Some(c) = conns.get_mut(w.conn as usize).and_then(Option::as_mut) else {
        return;
    };
    if c.gen != w.gen || w.no < c.head {
        return;
    }
    if let Some(Entry::Wait(wait)) = c.pending.get_mut((w.no - c.head) as usize) {
        wait.err.get_or_insert(text);
        wait.left = wait.left.saturating_sub(1);
    }
    touched.push(w.conn as usize);
    drain(c);
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
    conns: &mut [Option<Conn>],
    stats: &FrontStats,
    touched: &mut Vec<usize>,
    w: Waiter,
    resp: Response<'_>,
) {
    let Some(c) = conns.get_mut(w.conn as usize).and_then(Option::as_mut) else {
        return;
    };
    if c.gen != w.gen || w.no < c.head {
        return;
    }
    touched.push(w.conn as usize);
    let idx = (w.no - c.head) as usize;
    let Some(Entry::Wait(wait)) = c.pending.get_mut(idx) else {
        return;
    };
    let resp3 = c.session.resp3;
    if idx == 0
        && wait.left == 1
        && wait.err.is_none()
        && !matches!(
            wait.kind,
            Kind::MGet | Kind::MSet | Kind::Del | Kind::Exists
        )
    {
        // The common case: the oldest command, answered by one response.
        let before = c.out.len();
        render_single(
            wait.kind,
            &resp,
            &mut Reply::with_protocol(&mut c.out, resp3),
        );
        stats
            .raw_bytes
            .fetch_add((c.out.len() - before) as u64, Ordering::Relaxed);
        c.pending.pop_front();
        c.head += 1;
        drain(c);
        return;
    }
    match resp {
        Response::Status(st @ (Status::NotInteger | Status::Overflow | Status::OutOfMemory)) => {
            wait.err.get_or_insert_with(|| error_text(st).to_string());
        }
        Response::Status(Status::Ok) if matches!(wait.kind, Kind::Del | Kind::Exists) => {
            wait.sum += 1
        }
        Response::Value(v) => {
            if wait.kind == Kind::MGet {
                if let Some(slot) = wait.items.get_mut(w.sub as usize) {
                    *slot = Some(v.to_vec());
                }
            } else {
                wait.items = vec![Some(v.to_vec())];
            }
        }
        Response::Int(n) => wait.sum = n,
        Response::Status(_) => {}
    }
    wait.left = wait.left.saturating_sub(1);
    if wait.left == 0 {
        let mut out = Vec::new();
        let mut r = Reply::with_protocol(&mut out, resp3);
        match &wait.err {
            Some(e) => r.error(e),
            None => match wait.kind {
                Kind::Get => match wait.items.first() {
                    Some(Some(v)) => r.bulk(v),
                    _ => r.null(),
                },
                Kind::Set | Kind::MSet => r.ok(),
                Kind::Del | Kind::Exists => r.int(wait.sum),
                Kind::Incr => r.int(wait.sum),
                Kind::MGet => {
                    r.array(wait.items.len());
                    for it in &wait.items {
                        match it {
                            Some(v) => r.bulk(v),
                            None => r.null(),
                        }
                    }
                }
            },
        }
        stats
            .raw_bytes
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        c.pending[idx] = Entry::Ready(out);
    }
    drain(c);
}
