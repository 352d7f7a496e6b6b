//! The data-path side of extending writes: a write that ends past its file's size is parked
//! until a size covering it is durable, then issued (or refused). The metadata side, the
//! size changes themselves, is `service/extend.rs`.

use super::slots::{Kind, Refusal, State};
use crate::service::{FileService, NO_SLOT};

impl FileService {
    /// Marks write slot `i` parked (its bookkeeping as an unfinished write is done).
    pub(crate) fn park(&mut self, i: usize) {
        debug_assert_eq!(self.dp.slots[i].kind, Kind::Write);
        self.dp.slots[i].state = State::Parked;
        self.dp.parked += 1;
    }

    /// Issues the parked writes of file `fslot` that its durable size now covers, in
    /// submission order (each after earlier overlapping writes, as at submit).
    pub(crate) fn release_parked(&mut self, fslot: u32) {
        let Some(size) = self.meta.files[fslot as usize].as_ref().map(|f| f.size) else {
            self.refuse_parked(fslot, 0, Refusal::Deleted);
            return;
        };
        let mut j = self.files_io[fslot as usize].first_write;
        while j != NO_SLOT {
            let s = self.dp.slots[j as usize];
            if s.state == State::Parked && s.offset + u64::from(s.len) <= size {
                self.unpark(j as usize, fslot);
                self.start_or_block(j as usize, fslot);
            }
            j = s.next_write;
        }
        self.update_want(fslot);
        self.pump();
    }

    /// Completes the parked writes of file `fslot` that end past `keep` with `why`.
    pub(crate) fn refuse_parked(&mut self, fslot: u32, keep: u64, why: Refusal) {
        let mut j = self.files_io[fslot as usize].first_write;
        while j != NO_SLOT {
            let s = self.dp.slots[j as usize];
            if s.state == State::Parked && s.offset + u64::from(s.len) > keep {
                self.unpark(j as usize, fslot);
                self.dp.slots[j as usize].refused = Some(why);
                self.finish(j as usize);
            }
            j = s.next_write;
        }
        self.update_want(fslot);
        self.pump();
    }

    fn unpark(&mut self, i: usize, fslot: u32) {
        let fio = &mut self.files_io[fslot as usize];
        assert!(fio.parked > 0 && self.dp.parked > 0, "parked count");
        fio.parked -= 1;
        self.dp.parked -= 1;
        // Leaves `Parked`: `start_or_block` or `finish` sets the next state.
        self.dp.slots[i].state = State::Active;
    }

    /// Recomputes file `fslot`'s wanted size: the largest end of its parked writes.
    fn update_want(&mut self, fslot: u32) {
        let mut want = 0;
        let mut j = self.files_io[fslot as usize].first_write;
        if self.files_io[fslot as usize].parked > 0 {
            while j != NO_SLOT {
                let s = &self.dp.slots[j as usize];
                if s.state == State::Parked {
                    want = want.max(s.offset + u64::from(s.len));
                }
                j = s.next_write;
            }
        }
        self.files_io[fslot as usize].want = want;
    }
}
