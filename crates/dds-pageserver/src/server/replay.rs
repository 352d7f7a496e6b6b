//! The replay: durable records appended to their pages' chains in LSN order, applied to the
//! pages in the buffer pool (written back as new images), and the other pages they changed
//! materialized in the background.

use super::reads::Plan;
use super::{LogRec, PageService, Purpose, Rec, Replay, REPLAY_BATCH};

impl PageService {
    /// Takes up to a batch of durable records in LSN order; never waits for storage.
    pub(super) fn replay_some(&mut self) {
        if self.fatal.is_some() {
            return;
        }
        let mut changed = std::mem::take(&mut self.changed);
        for _ in 0..REPLAY_BATCH {
            match self.replay.pop_front() {
                None => break,
                Some(Replay::Applied(lsn)) => {
                    self.applied = self.applied.max(lsn);
                }
                Some(Replay::Record {
                    lsn,
                    page: id,
                    offset,
                    data,
                    end,
                }) => {
                    let rec = Rec {
                        lsn,
                        offset,
                        data: data.into_boxed_slice(),
                    };
                    if let Some(&f) = self.index.get(&id) {
                        let fr = &mut self.frames[f];
                        fr.used = true;
                        if lsn > crate::page::lsn(&fr.data) {
                            crate::page::patch(&mut fr.data, offset as usize, &rec.data);
                            crate::page::seal(&mut fr.data, id, lsn);
                            if !fr.dirty {
                                fr.dirty = true;
                                changed.push(f);
                            }
                        }
                    } else {
                        let m = &mut self.meta[id as usize];
                        if !m.materialize {
                            m.materialize = true;
                            self.materialize_queue.push_back(id);
                        }
                    }
                    self.meta[id as usize].chain.push_back(rec);
                    self.log_order.push_back(LogRec { lsn, page: id, end });
                    self.applied = self.applied.max(lsn);
                    self.stats.applied += 1;
                }
            }
        }
        for &f in &changed {
            self.write_back(f);
        }
        changed.clear();
        self.changed = changed;
        self.pump_materialize();
    }

    /// Reads the pages waiting for materialization (up to an eighth of the pool at once, so
    /// that the pages read are not evicted before they are written back).
    pub(super) fn pump_materialize(&mut self) {
        let room = (self.frames.len() / 8).clamp(1, super::READS_MAX / 2);
        while self.replay_reads < room {
            let Some(id) = self.materialize_queue.pop_front() else {
                break;
            };
            if self.index.contains_key(&id) {
                self.meta[id as usize].materialize = false;
                continue;
            }
            match self.plan(id, u64::MAX) {
                Plan::Read(s) => self.want(id, s, None, Purpose::Latest),
                Plan::Empty => {
                    if !self.materialize_empty(id) {
                        // Every frame is busy: later.
                        self.materialize_queue.push_front(id);
                        break;
                    }
                }
                Plan::Frame(_) | Plan::Lost => self.meta[id as usize].materialize = false,
            }
        }
    }
}
