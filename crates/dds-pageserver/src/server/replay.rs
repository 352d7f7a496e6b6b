//! The replay: durable records applied to their pages in LSN order, reading the pages it
//! needs ahead of it and writing back the pages it changed.

use super::{PageService, Replay, READS_MAX, REPLAY_BATCH, REPLAY_LOOKAHEAD};
use crate::page;

impl PageService {
    /// Applies up to a batch of durable records in LSN order, then writes the pages they
    /// changed back. A record whose page is not in the pool stops the batch: its page is read
    /// (with the pages of the records after it, read ahead), and the replay goes on when a
    /// read completes.
    pub(super) fn replay_some(&mut self) {
        if self.replay_blocked || self.fatal.is_some() {
            return;
        }
        let mut changed = std::mem::take(&mut self.changed);
        for _ in 0..REPLAY_BATCH {
            match self.replay.front() {
                None => break,
                Some(&Replay::Applied(lsn)) => {
                    self.applied = self.applied.max(lsn);
                    self.replay.pop_front();
                }
                Some(&Replay::Record { page: id, .. }) => {
                    let Some(&f) = self.index.get(&id) else {
                        self.read_ahead();
                        break;
                    };
                    let Some(Replay::Record {
                        lsn, offset, data, ..
                    }) = self.replay.pop_front()
                    else {
                        unreachable!("the front is a record");
                    };
                    let fr = &mut self.frames[f];
                    fr.used = true;
                    if lsn > page::lsn(&fr.data) {
                        page::patch(&mut fr.data, offset as usize, &data);
                        page::seal(&mut fr.data, id, lsn);
                        if !fr.dirty {
                            fr.dirty = true;
                            changed.push(f);
                        }
                    }
                    self.stats.applied += 1;
                }
            }
        }
        for &f in &changed {
            self.write_back(f);
        }
        changed.clear();
        self.changed = changed;
    }

    /// The replay's next record needs a page that is not in the pool: read it, and the pages
    /// of the records after it (up to an eighth of the pool, so that pages read ahead are not
    /// evicted before the replay gets to them), so that many reads are in flight.
    pub(super) fn read_ahead(&mut self) {
        self.replay_blocked = true;
        let room = (self.frames.len() / 8).clamp(1, READS_MAX / 2);
        let mut k = 0;
        while k < REPLAY_LOOKAHEAD.min(self.replay.len()) && self.replay_reads < room {
            if let Replay::Record { page, .. } = self.replay[k] {
                if !self.index.contains_key(&page) && !self.reading.contains_key(&page) {
                    self.want(page, None);
                }
            }
            k += 1;
        }
        // Any completion may free a frame or bring a page in; with none to come, try again on
        // the next turn.
        self.replay_blocked = self.io_in_flight();
    }
}
