//! A connection's byte streams: requests parsed out of the input (in order, conflicting ones
//! held back), responses moved to the output in request order, socket reads and writes.

use super::*;

impl Worker {
    /// Moves the completed head of the queue into the output buffer.
    pub(super) fn drain_done(&mut self, ci: usize) -> bool {
        let mut moved = false;
        loop {
            let Some(Some(c)) = self.conns.get_mut(ci) else {
                return moved;
            };
            let Some(&oi) = c.pending.front() else {
                return moved;
            };
            let Some(Some(op)) = self.ops.get(oi) else {
                c.pending.pop_front();
                continue;
            };
            if !op.done {
                return moved;
            }
            c.pending.pop_front();
            c.pending_bytes -= op.reserve();
            let ok = op.status == Status::Ok.code();
            let data_len = if op.op == OP_READ && ok { op.bytes } else { 0 };
            let len = if ok { op.bytes } else { 0 };
            let mut h = [0u8; RESP_HEADER_BYTES];
            encode_response_header(&mut h, op.status, op.op, op.req_id, len);
            if c.out_sent == c.out.len() {
                c.out.clear();
                c.out_sent = 0;
            }
            c.out.extend_from_slice(&h);
            if data_len > 0 {
                if let Some(b) = &op.buf {
                    c.out.extend_from_slice(&b.as_slice()[..data_len as usize]);
                }
                let padded = response_bytes(data_len) - RESP_HEADER_BYTES;
                c.out.resize(c.out.len() + padded - data_len as usize, 0);
            }
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            if !ok {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            self.free_op(oi);
            moved = true;
        }
    }

    pub(super) fn write_out(&mut self, ci: usize) -> Result<bool, Close> {
        let Some(Some(c)) = self.conns.get_mut(ci) else {
            return Ok(false);
        };
        let mut moved = false;
        while c.writable && c.unsent() > 0 {
            match c.stream.write(&c.out[c.out_sent..]) {
                Ok(0) => return Err(Close::Normal("peer closed".into())),
                Ok(n) => {
                    c.out_sent += n;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => c.writable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Close::Normal(format!("send: {e}"))),
            }
        }
        if c.unsent() == 0 && c.out.capacity() > (1 << 20) {
            c.out = Vec::with_capacity(64 << 10);
            c.out_sent = 0;
        }
        Ok(moved)
    }

    pub(super) fn read_in(&mut self, ci: usize) -> Result<bool, Close> {
        let Some(Some(c)) = self.conns.get_mut(ci) else {
            return Ok(false);
        };
        if !c.readable || c.eof {
            return Ok(false);
        }
        // Compact, then bound the buffer to one message plus slack.
        if c.in_start > 0
            && (c.in_start == c.in_end
                || c.in_end == c.inbuf.len()
                || c.in_start > c.inbuf.len() / 2)
        {
            c.inbuf.copy_within(c.in_start..c.in_end, 0);
            c.in_end -= c.in_start;
            c.in_start = 0;
        }
        if c.in_end == 0 && c.inbuf.len() > (1 << 20) {
            // Give back the room a large message needed.
            self.stats.give_input(c.inbuf.len() - IN_SLACK);
            c.inbuf = vec![0u8; IN_SLACK];
        }
        let need = match message_len(&c.inbuf[c.in_start..c.in_end]) {
            Ok(Some(len)) => len,
            _ => 0,
        };
        let limit = need + IN_SLACK;
        if c.in_end - c.in_start >= limit {
            return Ok(false);
        }
        // Grow with the bytes that actually arrive (doubling), never past the bound.
        if c.in_end == c.inbuf.len() && c.inbuf.len() < c.in_start + limit {
            let grown = (c.inbuf.len() * 2).clamp(IN_SLACK, c.in_start + limit);
            if !self
                .stats
                .take_input(grown - c.inbuf.len(), self.cfg.input_memory_bytes)
            {
                self.stats.closed_memory.fetch_add(1, Ordering::Relaxed);
                return Err(Close::Normal(
                    "input memory budget exhausted (--input-memory)".into(),
                ));
            }
            c.inbuf.resize(grown, 0);
        }
        let end = (c.in_start + limit).min(c.inbuf.len());
        match c.stream.read(&mut c.inbuf[c.in_end..end]) {
            Ok(0) => {
                c.eof = true;
                Ok(true)
            }
            Ok(n) => {
                c.in_end += n;
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                c.readable = false;
                Ok(false)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(Close::Normal(format!("receive: {e}"))),
        }
    }

    /// Parses buffered messages and issues their requests while the connection's bounds allow.
    pub(super) fn issue(&mut self, ci: usize) -> Result<bool, Close> {
        let mut moved = false;
        loop {
            if self.waiting.len() >= WAITING_MAX {
                if !self.stalled.contains(&ci) {
                    self.stalled.push(ci);
                }
                return Ok(moved);
            }
            let Some(Some(c)) = self.conns.get_mut(ci) else {
                return Ok(moved);
            };
            let avail = &c.inbuf[c.in_start..c.in_end];
            let cur = match c.cur {
                Some(cur) => cur,
                None => {
                    let len = match message_len(avail) {
                        Err(e) => return Err(Close::Malformed(format!("bad message header: {e}"))),
                        Ok(None) => return Ok(moved),
                        Ok(Some(len)) => len,
                    };
                    if avail.len() < len {
                        return Ok(moved);
                    }
                    let m = Message::parse(&avail[..len])
                        .map_err(|e| Close::Malformed(format!("malformed message: {e}")))?;
                    let cur = Cursor {
                        len,
                        at: crate::pagestore::MSG_HEADER_BYTES,
                        left: m.count(),
                    };
                    c.cur = Some(cur);
                    cur
                }
            };
            if cur.left == 0 {
                c.in_start += cur.len;
                c.cur = None;
                moved = true;
                continue;
            }
            let msg = &c.inbuf[c.in_start..c.in_start + cur.len];
            let req = request_at(msg, cur.at)
                .map_err(|e| Close::Malformed(format!("malformed request: {e}")))?;
            let reserve = if req.op == OP_READ {
                response_bytes(req.len)
            } else {
                RESP_HEADER_BYTES
            };
            let used = c.pending_bytes + c.unsent();
            if c.pending.len() >= self.cfg.conn_max_ops
                || (used > 0 && used + reserve > self.cfg.conn_max_bytes)
            {
                return Ok(moved);
            }
            // Per-connection order for conflicting requests: a request that overlaps an
            // earlier unfinished one of this connection (same file, overlapping bytes, at least
            // one a write) waits until that one completes (its completion marks the
            // connection, which resumes here). Others run concurrently.
            let ops = &self.ops;
            let conflicts = c.pending.iter().any(|&oi| {
                ops.get(oi).and_then(Option::as_ref).is_some_and(|o| {
                    !o.done
                        && o.file == req.file_id
                        && (o.op == OP_WRITE || req.op == OP_WRITE)
                        && o.offset < req.offset.saturating_add(u64::from(req.len))
                        && req.offset < o.offset.saturating_add(u64::from(o.len))
                })
            });
            if conflicts {
                return Ok(moved);
            }
            // Validate against the served files; a bad request gets an error response.
            let end = req.offset.checked_add(req.len as u64);
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
            let immediate = status != Status::Ok || req.len == 0;
            let buf = if immediate {
                None
            } else {
                let mut b = self.pool.get(req.len as usize);
                if req.op == OP_WRITE {
                    b.as_mut_slice()[..req.len as usize].copy_from_slice(req.data());
                }
                Some(b)
            };
            let op = Op {
                conn: Some(ci),
                op: req.op,
                req_id: req.req_id,
                file: req.file_id,
                offset: req.offset,
                len: req.len,
                buf,
                done: immediate,
                status: status.code(),
                bytes: 0,
            };
            let next_at = req.range().end;
            c.cur = Some(Cursor {
                at: next_at,
                left: cur.left - 1,
                ..cur
            });
            c.pending_bytes += reserve;
            let oi = match self.free_ops.pop() {
                Some(i) => i,
                None => {
                    self.ops.push(None);
                    self.ops.len() - 1
                }
            };
            self.ops[oi] = Some(op);
            c.pending.push_back(oi);
            moved = true;
            if !immediate {
                if !self.waiting.is_empty() {
                    self.waiting.push_back(oi);
                } else if let Err(SubmitError::Busy) = self.submit(oi) {
                    self.waiting.push_back(oi);
                }
            }
        }
    }
}
