//! A connection's input: messages parsed where they arrived, their requests issued to the
//! backend in order (conflicting ones held back), each with its response's place reserved in
//! the connection's output; requests answered at once (bad file, out of range, empty) write
//! their responses there directly.

use dds_host::Status;
use dds_server::Verdict;

use super::*;
use crate::pagestore::{message_len, request_at, Message, MSG_HEADER_BYTES, OP_WRITE};

impl PagestoreService {
    /// Closes a connection that broke the protocol: everything offered is taken.
    fn malformed(
        &self,
        why: std::fmt::Arguments<'_>,
        s: &mut PagestoreSession,
        input: &[u8],
    ) -> (usize, Verdict) {
        self.counters.add(&self.counters.closed_malformed, 1);
        tracing::warn!(reason = %why, "closing connection: protocol violation");
        s.cur = None;
        s.partial = 0;
        (input.len(), Verdict::Close)
    }

    /// Parses the messages at the start of `input` and issues their requests while the
    /// connection's bounds allow; returns the bytes of the messages fully issued.
    pub(super) fn issue(
        &mut self,
        id: ConnId,
        s: &mut PagestoreSession,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        s.partial = 0;
        if s.refused {
            return (input.len(), Verdict::Close);
        }
        let mut at = 0;
        loop {
            if self.waiting.len() >= WAITING_MAX {
                if !s.backend_stall {
                    s.backend_stall = true;
                    self.stalled.push(id);
                }
                return (at, Verdict::Pending);
            }
            let avail = &input[at..];
            let cur = match s.cur {
                Some(cur) => cur,
                None => {
                    let len = match message_len(avail) {
                        Err(e) => {
                            return self.malformed(
                                format_args!("bad message header: {e}"),
                                s,
                                input,
                            )
                        }
                        Ok(None) => {
                            s.partial = avail.len();
                            return (at, Verdict::Continue);
                        }
                        Ok(Some(len)) => len,
                    };
                    if avail.len() < len {
                        s.partial = avail.len();
                        return (at, Verdict::Continue);
                    }
                    let count = match Message::parse(&avail[..len]) {
                        Ok(m) => m.count(),
                        Err(e) => {
                            return self.malformed(format_args!("malformed message: {e}"), s, input)
                        }
                    };
                    Cursor {
                        len,
                        at: MSG_HEADER_BYTES,
                        left: count,
                    }
                }
            };
            if cur.left == 0 {
                at += cur.len;
                s.cur = None;
                continue;
            }
            let Some(msg) = avail.get(..cur.len) else {
                return self.malformed(format_args!("message cut short"), s, input);
            };
            let req = match request_at(msg, cur.at) {
                Ok(r) => r,
                Err(e) => return self.malformed(format_args!("malformed request: {e}"), s, input),
            };
            let need = reserve(req.op, req.len);
            if s.queue.len() >= self.cfg.conn_max_ops
                || (s.reserved > 0 && s.reserved + need > self.cfg.conn_max_bytes)
                || self.conflicts(s, req.op, req.file_id, req.offset, req.len)
            {
                // Resumed by the connection's next completion.
                s.cur = Some(cur);
                s.stalled = true;
                return (at, Verdict::Pending);
            }
            s.cur = Some(Cursor {
                at: req.range().end,
                left: cur.left - 1,
                ..cur
            });
            // Validate against the served files; a bad request gets an error response.
            let end = req.offset.checked_add(u64::from(req.len));
            let status = if !self.files.contains(req.file_id) {
                Status::UnknownFile
            } else if end.is_none()
                || (req.op == OP_WRITE && end.is_some_and(|e| e > self.files.file_size))
            {
                // Writes stay inside the served file size; reads past it are short.
                Status::OutOfRange
            } else {
                Status::Ok
            };
            if status != Status::Ok || req.len == 0 {
                write_response(out, status.code(), req.op, req.req_id, 0, &[]);
                self.count_response(status.code());
                continue;
            }
            let mut buf = self.pool.get(req.len as usize);
            if req.op == OP_WRITE {
                buf.as_mut_slice()[..req.len as usize].copy_from_slice(req.data());
            }
            let oi = self.new_op(Op {
                conn: Some(id),
                ticket: Ticket::from_u32(0),
                op: req.op,
                req_id: req.req_id,
                file: req.file_id,
                offset: req.offset,
                len: req.len,
                buf: Some(buf),
                done: false,
                status: 0,
                bytes: 0,
            });
            let issued = if self.waiting.is_empty() {
                self.submit(oi)
            } else {
                Err(SubmitError::Busy)
            };
            match issued {
                Err(SubmitError::Failed(status)) => {
                    write_response(out, status, req.op, req.req_id, 0, &[]);
                    self.count_response(status);
                    self.free_op(oi);
                    continue;
                }
                Err(SubmitError::Busy) => self.waiting.push_back(oi),
                Ok(()) => {}
            }
            // Completions are taken only in `complete`: the op is not answered before its
            // ticket is set.
            let ticket = out.defer();
            if let Some(op) = self.ops[oi as usize].as_mut() {
                op.ticket = ticket;
            }
            s.queue.push_back(oi);
            s.reserved += need;
            if req.op == OP_WRITE {
                s.writes += 1;
            }
        }
    }

    /// Whether a request overlaps an unfinished one of the connection, one of them a write
    /// (it then waits for that one: per-connection order for conflicting requests).
    fn conflicts(&self, s: &PagestoreSession, op: u8, file: u32, offset: u64, len: u32) -> bool {
        if op != OP_WRITE && s.writes == 0 {
            return false;
        }
        s.queue.iter().any(|&oi| {
            self.ops
                .get(oi as usize)
                .and_then(Option::as_ref)
                .is_some_and(|o| {
                    !o.done
                        && o.file == file
                        && (o.op == OP_WRITE || op == OP_WRITE)
                        && o.offset < offset.saturating_add(u64::from(len))
                        && offset < o.offset.saturating_add(u64::from(o.len))
                })
        })
    }
}
