//! The table of a service's reads in flight on a [`FileIo`]: a slab of places, each holding
//! the service's state `T` of one read and the buffer `B` it fills, the reads in flight
//! counted. `dds kv` (records read ahead of their commands) and `dds pageserver` (page reads)
//! keep their reads in one.
//!
//! A place is taken for a read, its read issued with a tag of the service's choosing (and
//! issued again if the service wants), finished when its completion comes back (the service
//! maps the tag to the place), and given back once the service has used the result. A free
//! place keeps its state and buffer for the next read, so that a service in steady state
//! allocates nothing. The table owns the buffers: none is handed out, moved or freed while
//! its read is in flight; if the table is dropped with reads in flight, their buffers are
//! left to them (leaked).

use crate::aio::SubmitError;
use crate::fileio::FileIo;

/// A buffer a read may fill while an [`InFlightReads`] holds it.
///
/// # Safety
/// The memory [`ReadBuf::read_ptr`] returns must stay where it is and valid while the value
/// lives, even when the value moves (heap memory, not the value's own bytes).
pub unsafe trait ReadBuf {
    /// Where the read goes.
    fn read_ptr(&mut self) -> *mut u8;
    /// How many bytes the read asks for.
    fn read_len(&self) -> usize;
}

// SAFETY: a vector's elements live on the heap; moving the vector does not move them.
unsafe impl ReadBuf for Vec<u8> {
    fn read_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn read_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: a boxed slice lives on the heap; moving the box does not move it.
unsafe impl ReadBuf for Box<[u8]> {
    fn read_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn read_len(&self) -> usize {
        self.len()
    }
}

/// The reads in flight of an event-loop service (see the module documentation).
pub struct InFlightReads<T, B: ReadBuf> {
    places: Vec<Place<T, B>>,
    free: Vec<u32>,
    /// Places whose read is in flight.
    issued: usize,
}

struct Place<T, B> {
    state: T,
    buf: B,
    issued: bool,
}

impl<T, B: ReadBuf> Default for InFlightReads<T, B> {
    fn default() -> Self {
        InFlightReads {
            places: Vec::new(),
            free: Vec::new(),
            issued: 0,
        }
    }
}

impl<T, B: ReadBuf> InFlightReads<T, B> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a place for a read: a free one, with the state and buffer the last read left
    /// there, or a new one holding what `make` returns.
    pub fn take_place(&mut self, make: impl FnOnce() -> (T, B)) -> u32 {
        if let Some(p) = self.free.pop() {
            return p;
        }
        let (state, buf) = make();
        self.places.push(Place {
            state,
            buf,
            issued: false,
        });
        (self.places.len() - 1) as u32
    }

    /// Gives place `p` back (its read is not in flight).
    pub fn release(&mut self, p: u32) {
        assert!(
            !self.places[p as usize].issued,
            "a place released in flight"
        );
        self.free.push(p);
    }

    /// The state of place `p`.
    pub fn state(&self, p: u32) -> &T {
        &self.places[p as usize].state
    }

    /// The state of place `p`, to change (also while its read is in flight).
    pub fn state_mut(&mut self, p: u32) -> &mut T {
        &mut self.places[p as usize].state
    }

    /// The buffer of place `p`. Panics while its read is in flight.
    pub fn buf(&self, p: u32) -> &B {
        let place = &self.places[p as usize];
        assert!(!place.issued, "the buffer of a read in flight");
        &place.buf
    }

    /// The buffer of place `p`, to change. Panics while its read is in flight.
    pub fn buf_mut(&mut self, p: u32) -> &mut B {
        let place = &mut self.places[p as usize];
        assert!(!place.issued, "the buffer of a read in flight");
        &mut place.buf
    }

    /// Whether place `p` exists and its read is in flight.
    pub fn is_issued(&self, p: u32) -> bool {
        self.places
            .get(p as usize)
            .is_some_and(|place| place.issued)
    }

    /// Issues the read of place `p` through `io`: its buffer's length, from offset `off` of
    /// file `file`, its completion carrying `tag`. On an error the read is not in flight
    /// ([`SubmitError::Busy`]: issue it again after some completions).
    pub fn issue(
        &mut self,
        io: &mut dyn FileIo,
        file: usize,
        p: u32,
        off: u64,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let place = &mut self.places[p as usize];
        assert!(!place.issued, "a read issued twice");
        let len = u32::try_from(place.buf.read_len()).map_err(|_| SubmitError::Failed(0))?;
        // SAFETY: the buffer is the place's own and stays where it is (`ReadBuf`); the table
        // neither hands it out nor frees it until the read is finished, and leaks it if
        // dropped before.
        unsafe { io.read(file, off, place.buf.read_ptr(), len, tag) }?;
        place.issued = true;
        self.issued += 1;
        Ok(())
    }

    /// Counts the read of place `p` in flight although it was not issued: a read that failed
    /// at once, whose failure the service delivers as a completion later.
    pub fn mark_issued(&mut self, p: u32) {
        let place = &mut self.places[p as usize];
        assert!(!place.issued, "a read counted twice");
        place.issued = true;
        self.issued += 1;
    }

    /// The read of place `p` completed: false (nothing changes) when no read of that place
    /// was in flight.
    pub fn finish(&mut self, p: u32) -> bool {
        match self.places.get_mut(p as usize) {
            Some(place) if place.issued => {
                place.issued = false;
                self.issued -= 1;
                true
            }
            _ => false,
        }
    }

    /// Reads in flight.
    pub fn issued(&self) -> usize {
        self.issued
    }

    /// Places taken (reads in flight, or waiting to be issued or given back).
    pub fn in_use(&self) -> usize {
        self.places.len() - self.free.len()
    }
}

impl<T, B: ReadBuf> Drop for InFlightReads<T, B> {
    fn drop(&mut self) {
        if self.issued > 0 {
            // The storage library may still write into these buffers.
            std::mem::forget(std::mem::take(&mut self.places));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fileio::SyncIo;
    use crate::{OsStorage, Storage};

    #[test]
    fn places_hold_reads_until_they_finish_and_are_reused() {
        let dir = std::env::temp_dir().join(format!("dds-inflight-{}", std::process::id()));
        let st = OsStorage::new(&dir).unwrap();
        let f = st.open("f").unwrap();
        f.write_at(0, b"0123456789abcdef").unwrap();
        let mut io = SyncIo::new(vec![st.open("f").unwrap()]);
        let mut t: InFlightReads<u64, Vec<u8>> = InFlightReads::new();
        let a = t.take_place(|| (0, Vec::new()));
        let b = t.take_place(|| (0, Vec::new()));
        assert_ne!(a, b);
        *t.state_mut(a) = 10;
        t.buf_mut(a).resize(4, 0);
        t.buf_mut(b).resize(8, 0);
        t.issue(&mut io, 0, a, 10, 100 + u64::from(a)).unwrap();
        t.issue(&mut io, 0, b, 12, 100 + u64::from(b)).unwrap();
        assert!(t.is_issued(a) && t.is_issued(b));
        assert_eq!((t.issued(), t.in_use()), (2, 2));
        let mut done = Vec::new();
        io.poll(&mut done);
        for &(tag, res) in &done {
            assert!(t.finish((tag - 100) as u32));
            assert_eq!(res, Some(4));
        }
        assert_eq!(t.issued(), 0);
        assert!(!t.finish(a), "finished twice");
        assert_eq!(&t.buf(a)[..], b"abcd");
        assert_eq!(&t.buf(b)[..4], b"cdef");
        assert_eq!(*t.state(a), 10);
        // A free place is reused with what its last read left there.
        t.release(a);
        let c = t.take_place(|| unreachable!("the released place is reused"));
        assert_eq!((c, *t.state(c)), (a, 10));
        t.mark_issued(c);
        assert_eq!(t.issued(), 1);
        assert!(t.finish(c));
        assert_eq!(t.in_use(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
