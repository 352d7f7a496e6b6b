//! The client → host direction of a split connection: framing, the plan of each message
//! (`dds_offload_engine::Planner`), invalidations, the host sub-message and the file reads.

use std::net::Shutdown;
use std::os::fd::AsRawFd;

use dds_offload_api::{
    CacheView, Malformed, OffloadApp, Phase, HOST_MESSAGE_SLACK, REQUEST_HEAD_BYTES, TOO_BIG,
};
use dds_offload_engine::{CtxState, Sources};
use dds_proto::Status;

use crate::conn::{Close, Conn, Entry};
use crate::stats::{add, Stats};
use crate::uring::Leg;
use crate::worker::Worker;

impl Worker {
    pub(crate) fn drive_split(&mut self, slot: usize) -> Result<(), Close> {
        {
            let c = self.conns[slot].as_mut().expect("live");
            let was = c.host_connected;
            Self::check_host_connected(c)?;
            if c.host_connected && !was {
                if let Some(u) = self.uring.as_mut() {
                    u.open(Leg::host(slot), c.gen, c.host.as_raw_fd());
                }
            }
        }
        loop {
            let mut p;
            {
                p = self.read_leg(Leg::client(slot))?;
                let c = self.conns[slot].as_mut().expect("live");
                if c.refused.is_some() && !c.cin.is_empty() {
                    // Nothing after a refused message is framed: drop it, within a bound.
                    c.discarded = c.discarded.saturating_add(c.cin.len());
                    c.cin.consume(c.cin.len());
                    if c.discarded > self.max_msg {
                        return Err(Close::Abort("client kept sending after a refused message"));
                    }
                }
            }
            p |= self.process_messages(slot)?;
            if self.conns[slot].as_ref().expect("live").host_connected {
                let allowed = self.conns[slot].as_ref().expect("live").hold;
                p |= self.write_host(slot, allowed.unwrap_or(usize::MAX))?;
                let before = self.conns[slot].as_ref().expect("live").hin.len();
                p |= self.read_leg(Leg::host(slot))?;
                p |= self.relay_opening(slot)?;
                let c = self.conns[slot].as_mut().expect("live");
                let opening = c.opening();
                if !opening
                    && c.hin.len() > before
                    && c.hin.len() > c.relayed
                    && c.host_pending == 0
                {
                    return Err(Close::Malformed("host sent a response nobody asked for"));
                }
                if c.hin.len() > c.relayed {
                    let base = c.relayed;
                    let rest = &c.hin.data()[base..];
                    let framed = match &c.session {
                        Some(s) if opening => s.opening_response_len(rest),
                        _ => c.response_len(self.app.as_ref(), rest),
                    };
                    match framed {
                        Err(m) => {
                            tracing::warn!(reason = m.0, "host response malformed");
                            return Err(Close::Malformed("host sent a malformed response"));
                        }
                        Ok(Some(n)) if n == 0 || n > self.max_resp => {
                            return Err(Close::Malformed("host response length out of range"));
                        }
                        Ok(Some(n)) => c
                            .hin
                            .grow_toward(base + n)
                            .map_err(|_| Close::OutOfMemory)?,
                        // Incomplete, length unknown yet (e.g. a RESP array): the buffer grows
                        // with the bytes that arrive, up to the app's limit.
                        Ok(None) if c.hin.len() - base >= self.max_resp => {
                            return Err(Close::Malformed("host response larger than the limit"));
                        }
                        Ok(None) => c
                            .hin
                            .grow_toward(base + self.max_resp)
                            .map_err(|_| Close::OutOfMemory)?,
                    }
                }
            }
            p |= self.flush_client(slot)?;
            let c = self.conns[slot].as_mut().expect("live");
            if c.sending || c.host_sending {
                // The rest once the round's sends completed (the connection is driven again).
                return Ok(());
            }
            if c.err_sent {
                // As Redis after a protocol error's reply: closed at once, not at the client's
                // end of stream (a client that keeps sending then sees its writes fail).
                return Err(Close::Done);
            }
            // Half-close: after the client's last message went out to the host.
            if c.client_eof
                && c.cin.is_empty()
                && c.hout.is_empty()
                && c.host_connected
                && !c.host_wr_shut
            {
                let _ = c.host.shutdown(Shutdown::Write);
                c.host_wr_shut = true;
            }
            let awaiting = c
                .session
                .as_ref()
                .is_some_and(|s| s.phase() == Phase::AwaitHost);
            if c.client_eof && !c.cin.is_empty() && !awaiting {
                // The stream ended inside a message: nothing more will complete it.
                let complete = matches!(c.message_len(self.app.as_ref(), c.cin.data()),
                    Ok(Some(n)) if n <= c.cin.len());
                if !complete {
                    // Answer what came before, then close as after a half-close.
                    tracing::warn!(peer = %c.peer, bytes = c.cin.len(), "stream truncated inside a message");
                    add(&self.stats.malformed, 1);
                    let n = c.cin.len();
                    c.cin.consume(n);
                    p = true;
                }
            }
            if c.host_eof {
                let stuck = match c.order.front() {
                    None => true,
                    Some(Entry::Host { .. }) => !matches!(
                        c.response_len(self.app.as_ref(), c.hin.data()),
                        Ok(Some(n)) if n <= c.hin.len()
                    ),
                    Some(_) => false,
                };
                if stuck && c.cout.is_empty() {
                    if c.order.is_empty() {
                        let _ = c.client.shutdown(Shutdown::Write);
                        return Err(Close::Done);
                    }
                    return Err(Close::Abort("host closed with requests outstanding"));
                }
            }
            if !p {
                return Ok(());
            }
        }
    }

    /// Frames and splits complete client messages.
    pub(crate) fn process_messages(&mut self, slot: usize) -> Result<bool, Close> {
        let mut progress = false;
        loop {
            let Worker {
                app,
                cache,
                exposed,
                lane,
                pool,
                planner,
                stats,
                conns,
                retry: retry_list,
                ..
            } = self;
            let c = conns[slot].as_mut().expect("live");
            if c.host_eof || c.hold.is_some() || c.refused.is_some() || c.host_sending {
                return Ok(progress);
            }
            let phase = c.session.as_ref().map(|s| (s.phase(), s.has_room()));
            if matches!(
                phase,
                Some((Phase::AwaitHost, _) | (Phase::Requests, false))
            ) {
                // The host's answer decides how the next bytes are framed, or the session's
                // tables are full: once responses went out.
                return Ok(progress);
            }
            let n = match c.message_len(app.as_ref(), c.cin.data()) {
                Err(m) => {
                    refuse(app.as_ref(), c, m, stats);
                    return Ok(true);
                }
                Ok(None) if c.cin.len() >= self.max_msg => {
                    refuse(app.as_ref(), c, TOO_BIG, stats);
                    return Ok(true);
                }
                Ok(None) => {
                    // Incomplete, length unknown yet (a RESP command's later arguments): the
                    // buffer grows with the bytes that arrive, up to the app's limit.
                    c.cin
                        .grow_toward(self.max_msg)
                        .map_err(|_| Close::OutOfMemory)?;
                    return Ok(progress);
                }
                Ok(Some(0)) => return Err(Close::Malformed("message length out of range")),
                Ok(Some(n)) if n > self.max_msg => {
                    refuse(app.as_ref(), c, TOO_BIG, stats);
                    return Ok(true);
                }
                Ok(Some(n)) => n,
            };
            if c.cin.len() < n {
                c.cin.grow_toward(n).map_err(|_| Close::OutOfMemory)?;
                return Ok(progress);
            }
            if let (Some(s), Some((Phase::Opening, _))) = (c.session.as_mut(), phase) {
                // An opening unit: seen by the session, forwarded whole.
                if !c.hout.room(n).map_err(|_| Close::OutOfMemory)? {
                    return Ok(progress);
                }
                let msg = &c.cin.data()[..n];
                if let Err(m) = s.opening_message(msg) {
                    tracing::warn!(peer = %c.peer, reason = m.0, "client's opening refused");
                    return Err(Close::Malformed(m.0));
                }
                c.hout.tail()[..n].copy_from_slice(msg);
                c.hout.commit(n);
                c.cin.consume(n);
                add(&stats.messages, 1);
                progress = true;
                continue;
            }
            if self.max_pending - c.order.len() < self.max_req {
                return Ok(progress);
            }
            if !c
                .hout
                .room(n + HOST_MESSAGE_SLACK)
                .map_err(|_| Close::OutOfMemory)?
            {
                return Ok(progress);
            }
            let msg = &c.cin.data()[..n];
            // Release pending keys of answered host requests; make room for this message.
            if c.pend_head > 0 {
                for &k in &c.pend_keys[..c.pend_head] {
                    match c.pend_set.get(k) {
                        Some(1) => {
                            c.pend_set.remove(k);
                        }
                        Some(n) => c.pend_set.update(k, |_| n - 1).expect("present"),
                        None => unreachable!("pending key missing from its map"),
                    }
                }
                c.pend_keys.drain(..c.pend_head);
                c.pend_ord.drain(..c.pend_head);
                c.pend_head = 0;
            }
            // Reads go to the DPU while contexts are free and the connection has its share.
            let budget = pool
                .free_count()
                .min(self.max_ctx_per_conn.saturating_sub(c.dpu_ctxs));
            let sources = Sources {
                app: app.as_ref(),
                cache,
                exposed,
                session: c.session.as_deref(),
            };
            let summary = match planner.plan(&sources, &c.pend_set, msg, budget, pool.capacity()) {
                Ok(s) => s,
                Err(m) => {
                    tracing::warn!(peer = %c.peer, reason = m.0, "offload plan rejected a message");
                    return Err(Close::Malformed(m.0));
                }
            };
            let masked = planner.masked();
            if masked.len() > lane.invalidation_room() {
                // The cache writer is behind: try again shortly.
                if !c.retry {
                    c.retry = true;
                    retry_list.push(slot);
                }
                return Ok(progress);
            }
            if !c.pend_keys.is_empty() && c.pend_keys.len() + masked.len() > c.pend_set.capacity() {
                // Too many keys awaiting host answers: continue when the host answers.
                return Ok(progress);
            }
            // Commit: invalidations first, then the host message, then the reads.
            let host = planner.host();
            for &(k, pos) in masked {
                let rank = host.binary_search_by_key(&pos, |d| d.pos).unwrap_or(0) as u64;
                c.pend_keys.push(k);
                c.pend_set
                    .update(k, |n| n.unwrap_or(0) + 1)
                    .expect("room checked with pend_keys");
                c.pend_ord.push(c.host_issued + rank + 1);
            }
            c.host_issued += host.len() as u64;
            let mut gate = 0;
            if !masked.is_empty() {
                let version = lane.current_version();
                for &(k, _) in masked {
                    match lane.invalidate(k, version) {
                        Ok(seq) => gate = seq,
                        Err(_) => unreachable!("room checked"),
                    }
                }
                c.inval_seq = gate;
                add(&stats.invalidations, masked.len() as u64);
            }
            let nhost = host.len();
            let hout_before = c.hout.len();
            if nhost > 0 {
                let out = c.hout.tail();
                let room = n + HOST_MESSAGE_SLACK;
                let len = if nhost == 1 && host[0].offset == 0 && host[0].len as usize == n {
                    // One request, the whole message: it goes as it came. (A message split
                    // into several requests is rebuilt even when none was read on the DPU:
                    // the host answers the requests of a host message one by one.)
                    out[..n].copy_from_slice(msg);
                    n
                } else {
                    match app.build_host_message(msg, host, &mut out[..room]) {
                        Ok(len) if len > 0 && len <= room => len,
                        Ok(_) => {
                            return Err(Close::Malformed(
                                "host-message builder returned a bad length",
                            ))
                        }
                        Err(m) => {
                            tracing::warn!(peer = %c.peer, reason = m.0, "host-message builder failed");
                            return Err(Close::Malformed("host-message builder failed"));
                        }
                    }
                };
                c.hout.commit(len);
            }
            let entries_before = c.order.len();
            for step in planner.steps() {
                let d = step.req;
                match step.read {
                    None => {
                        let answered = match c.session.as_mut() {
                            Some(s) => s.forward(msg, d).map_err(|m| {
                                tracing::warn!(peer = %c.peer, reason = m.0, "request refused by the session");
                                Close::Malformed(m.0)
                            })?,
                            None => true,
                        };
                        if answered {
                            c.order.push_back(Entry::Host { gate });
                            c.host_pending += 1;
                        }
                    }
                    Some(op) => {
                        let ctx = pool.alloc().expect("budgeted");
                        let mut head = [0u8; REQUEST_HEAD_BYTES];
                        let hl = match c.session.as_ref() {
                            Some(s) => s.request_head(msg, d, &mut head).min(REQUEST_HEAD_BYTES),
                            None => dds_offload_api::request_prefix(msg, d, &mut head),
                        };
                        let head = &head[..hl];
                        let cx = &mut pool.ctxs[ctx as usize];
                        cx.state = CtxState::InFlight;
                        cx.conn = slot as u32;
                        cx.gen = c.gen;
                        cx.op = op;
                        cx.head[..hl].copy_from_slice(head);
                        cx.head_len = hl as u8;
                        let dst = pool.data_ptr(ctx);
                        if op.size == 0 {
                            // A DPU response without a file read (an array header, a constant
                            // reply): built now.
                            pool.ctxs[ctx as usize].state = CtxState::Ready;
                            let (room, data) = pool.room_and_data(ctx);
                            let (room_len, cap) = (room.len(), data.len());
                            match app.build_response(head, &op, Ok(0), room, data) {
                                Ok(l)
                                    if (l.header_len as usize) <= room_len
                                        && l.total_len >= l.header_len
                                        && (l.total_len - l.header_len) as usize <= cap =>
                                {
                                    pool.ctxs[ctx as usize].layout = l;
                                }
                                _ => {
                                    c.order.push_back(Entry::Dpu { ctx });
                                    c.dpu_ctxs += 1;
                                    return Err(Close::Malformed("response builder failed"));
                                }
                            }
                        // SAFETY: the buffer holds `capacity() >= op.size` bytes and is not
                        // touched until the completion is polled (or leaked at shutdown).
                        } else if unsafe { lane.submit_deferred(op, dst, u64::from(ctx)) }.is_err()
                        {
                            // Cannot happen (contexts <= port depth); answer Busy.
                            pool.ctxs[ctx as usize].state = CtxState::Ready;
                            let (room, data) = pool.room_and_data(ctx);
                            let l = app
                                .build_response(head, &op, Err(Status::Busy.code()), room, data)
                                .unwrap_or_default();
                            pool.ctxs[ctx as usize].layout = l;
                        } else {
                            c.dpu_inflight += 1;
                        }
                        c.order.push_back(Entry::Dpu { ctx });
                        c.dpu_ctxs += 1;
                    }
                }
            }
            if c.order.len() > entries_before {
                c.msg_ends.push_back(c.popped + c.order.len() as u64 - 1);
            }
            if !masked.is_empty() && nhost > 0 && c.dpu_inflight > 0 {
                // Keep this message's host part until the connection's offloaded reads
                // (earlier ones and this message's) have read the device.
                c.hold = Some(hout_before);
            }
            c.cin.consume(n);
            add(&stats.messages, 1);
            add(&stats.offloaded, summary.offloaded as u64);
            add(&stats.forwarded, nhost as u64);
            add(&stats.fallback, summary.fallback as u64);
            add(&stats.unexposed, summary.unexposed as u64);
            progress = true;
        }
    }
}

impl Worker {
    /// Queues the complete units of the host's opening exchange in `hin` (after those queued
    /// already) for the client, each seen by the session first.
    fn relay_opening(&mut self, slot: usize) -> Result<bool, Close> {
        let Worker {
            conns,
            cache,
            max_pending,
            max_resp,
            ..
        } = self;
        let c = conns[slot].as_mut().expect("live");
        let mut progress = false;
        loop {
            let crate::conn::Conn {
                session,
                hin,
                relayed,
                order,
                ..
            } = &mut **c;
            let Some(s) = session.as_mut().filter(|s| s.phase() != Phase::Requests) else {
                return Ok(progress);
            };
            let rest = &hin.data()[*relayed..];
            if rest.is_empty() || order.len() >= *max_pending {
                return Ok(progress);
            }
            let n = match s.opening_response_len(rest) {
                Ok(Some(n)) if n == 0 || n > *max_resp => {
                    return Err(Close::Malformed("host's opening unit length out of range"))
                }
                Ok(Some(n)) if n <= rest.len() => n,
                Ok(_) => return Ok(progress),
                Err(m) => {
                    tracing::warn!(reason = m.0, "host's opening malformed");
                    return Err(Close::Malformed("host sent a malformed opening"));
                }
            };
            if let Err(m) = s.opening_response(&rest[..n], &CacheView::new(cache)) {
                tracing::warn!(reason = m.0, "host's opening refused");
                return Err(Close::Malformed(m.0));
            }
            order.push_back(Entry::Relay { len: n as u32 });
            *relayed += n;
            progress = true;
        }
    }
}

/// Refuses the client's next message (malformed, or over the app's limit): the app's error
/// reply is queued after the responses to the earlier requests, nothing more is framed, and
/// the connection closes once that reply went out.
fn refuse(app: &dyn OffloadApp, c: &mut Conn, why: Malformed, stats: &Stats) {
    tracing::warn!(peer = %c.peer, reason = why.0, "client message refused: closing after the earlier replies");
    add(&stats.malformed, 1);
    let n = app.error_reply(why, c.cin.data(), &mut c.err);
    c.err_len = if n <= c.err.len() { n } else { 0 };
    c.refused = Some(why.0);
    c.order.push_back(Entry::Error);
    c.discarded = 0;
    c.cin.consume(c.cin.len());
}
