//! A record of the stack words one walk read, for the `-mp` stack memo.
//!
//! A walk is a pure function of the registers it starts from, the stack
//! words it reads and the unwind tables. The memo keys a walk's result on
//! the program's registers at the hooked call and on the words the walk
//! read in the program's frames: return-address slots, CFA-relative slots,
//! signal frames, and a saved frame pointer only when a later frame used
//! the frame pointer (a frame whose CFA is FP-based, a frame framehop
//! unwinds): code built without frame pointers keeps data in that
//! register, and its saved value otherwise changes from call to call
//! without changing the walk. The same holds for the frame pointer at the
//! call ([`ReadLog::entry_fp_used`]). A later call with the same registers
//! and the same values at those addresses walks the same way, whatever
//! else on the stack changed.
//!
//! The record starts at the walk's first frame in the program
//! ([`ReadLog::start`]), which must be the caller of the hooked function
//! at the expected PC and stack pointer; reads in the profiler's own frames
//! before it are not recorded (given the same registers at the call they
//! lead to that same first frame). A record that cannot be replayed safely
//! is marked spoilt: a first frame other than the expected one, a read
//! outside `[floor, top)` (the memo only re-reads the thread's own stack
//! above the call), a refused read (whether it is refused depends on the
//! alternate stack of the moment), or more words than it holds.
//!
//! Owns only the record; filled through `StackReader` during a walk, read
//! by the memo after it. Must never allocate (it is a fixed array made with
//! the thread's other extras) or be shared between threads.

use core::cell::{Cell, UnsafeCell};

/// Words one record holds (two or three per frame: 170 frames or more).
pub const CAPACITY: usize = 512;

/// Where the walk's current frame pointer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FpSource {
    /// The program's frame pointer at the call.
    Entry,
    /// A saved frame pointer read at this address, not recorded yet.
    Pending { addr: usize, value: usize },
    /// A value already recorded (or one that needs no record).
    Recorded,
}

/// The stack words one walk read in the program's frames.
pub struct ReadLog {
    floor: Cell<usize>,
    top: Cell<usize>,
    /// (pc, sp) the walk's first program frame must have.
    first: Cell<(usize, usize)>,
    len: Cell<usize>,
    started: Cell<bool>,
    spoilt: Cell<bool>,
    fp: Cell<FpSource>,
    entry_fp_used: Cell<bool>,
    /// Module table generation the walk used.
    generation: Cell<u32>,
    words: UnsafeCell<[(usize, usize); CAPACITY]>,
}

impl ReadLog {
    pub fn new() -> Self {
        ReadLog {
            floor: Cell::new(0),
            top: Cell::new(0),
            first: Cell::new((0, 0)),
            len: Cell::new(0),
            started: Cell::new(false),
            spoilt: Cell::new(true),
            fp: Cell::new(FpSource::Recorded),
            entry_fp_used: Cell::new(false),
            generation: Cell::new(0),
            words: UnsafeCell::new([(0, 0); CAPACITY]),
        }
    }

    /// Starts a record for a walk whose first program frame must be at
    /// `first = (pc, sp)`, with every program frame in `[floor, top)`.
    pub fn begin(&self, floor: usize, top: usize, first: (usize, usize)) {
        self.floor.set(floor);
        self.top.set(top);
        self.first.set(first);
        self.len.set(0);
        self.started.set(false);
        self.spoilt.set(false);
        self.fp.set(FpSource::Entry);
        self.entry_fp_used.set(false);
    }

    /// The walk reached its first frame outside the profiler.
    #[inline(always)]
    pub(crate) fn start(&self, pc: usize, sp: usize) {
        if self.started.get() {
            return;
        }
        self.started.set(true);
        if (pc, sp) != self.first.get() {
            self.spoilt.set(true);
        }
    }

    #[inline(always)]
    fn push(&self, addr: usize, value: usize) {
        let n = self.len.get();
        if addr < self.floor.get() || addr.wrapping_add(8) > self.top.get() || n == CAPACITY {
            self.spoilt.set(true);
            return;
        }
        // SAFETY: n < CAPACITY; the record is only used by its own thread
        // and no reference into `words` is live during a walk.
        unsafe { (*self.words.get())[n] = (addr, value) };
        self.len.set(n + 1);
    }

    /// A successful read of `value` at `addr`.
    #[inline(always)]
    pub(crate) fn note(&self, addr: usize, value: usize) {
        if self.started.get() {
            self.push(addr, value);
        }
    }

    /// A read of a saved frame pointer: recorded if a later frame uses it.
    #[inline(always)]
    pub(crate) fn note_fp(&self, addr: usize, value: usize) {
        if self.started.get() {
            self.fp.set(FpSource::Pending { addr, value });
        }
    }

    /// The walk is about to use the current frame pointer.
    #[inline(always)]
    pub(crate) fn fp_used(&self) {
        if !self.started.get() {
            return;
        }
        match self.fp.get() {
            FpSource::Entry => self.entry_fp_used.set(true),
            FpSource::Pending { addr, value } => self.push(addr, value),
            FpSource::Recorded => {}
        }
        self.fp.set(FpSource::Recorded);
    }

    /// A read at `addr` refused by the stack bounds.
    #[inline(always)]
    pub(crate) fn refused(&self, _addr: usize) {
        self.spoilt.set(true);
    }

    pub(crate) fn set_generation(&self, generation: u32) {
        self.generation.set(generation);
    }

    /// The module table generation of the walk.
    pub fn generation(&self) -> u32 {
        self.generation.get()
    }

    /// Whether the walk used the frame pointer the program had at the call.
    pub fn entry_fp_used(&self) -> bool {
        self.entry_fp_used.get()
    }

    /// The (address, value) pairs the walk depended on; None when the
    /// record cannot be replayed (see the module doc).
    pub fn words(&self) -> Option<&[(usize, usize)]> {
        if self.spoilt.get() || !self.started.get() {
            return None;
        }
        // SAFETY: no walk is running (the caller holds the only reference
        // it had to pass to one); len <= CAPACITY entries were written.
        let words: &[(usize, usize); CAPACITY] = unsafe { &*self.words.get() };
        Some(&words[..self.len.get()])
    }
}

impl Default for ReadLog {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_program_reads_and_spoils_what_cannot_be_replayed() {
        let log = ReadLog::new();
        assert!(log.words().is_none(), "nothing recorded yet");
        log.begin(0x1000, 0x2000, (0x4000, 0x1008));
        log.note(0x0f00, 1); // the profiler's own frame: not recorded
        assert!(log.words().is_none(), "not started");
        log.start(0x4000, 0x1008);
        log.note(0x1000, 2);
        log.note(0x1010, 3);
        assert_eq!(log.words(), Some(&[(0x1000, 2), (0x1010, 3)][..]));
        log.note(0x0f00, 4);
        assert!(log.words().is_none(), "below the call");

        log.begin(0x1000, 0x2000, (0x4000, 0x1008));
        log.start(0x4001, 0x1008);
        assert!(log.words().is_none(), "another first frame");

        log.begin(0x1000, 0x2000, (0x4000, 0x1008));
        log.start(0x4000, 0x1008);
        log.note(0x1ff8, 5);
        assert_eq!(log.words(), Some(&[(0x1ff8, 5)][..]));
        log.note(0x1ffc, 6);
        assert!(log.words().is_none(), "past the top of the stack");

        log.begin(0x1000, 0x2000, (0x4000, 0x1008));
        log.start(0x4000, 0x1008);
        log.refused(0x3000);
        assert!(log.words().is_none(), "a refused read");

        log.begin(0x1000, 0x100000, (0x4000, 0x1008));
        log.start(0x4000, 0x1008);
        for i in 0..CAPACITY {
            log.note(0x1000 + i * 8, i);
        }
        assert_eq!(log.words().map(|w| w.len()), Some(CAPACITY));
        log.note(0x1000, 0);
        assert!(log.words().is_none(), "more reads than it holds");
    }

    #[test]
    fn a_saved_frame_pointer_counts_only_once_used() {
        let log = ReadLog::new();
        log.begin(0x1000, 0x2000, (0x4000, 0x1008));
        log.start(0x4000, 0x1008);
        log.note(0x1008, 1);
        log.note_fp(0x1010, 0xdead);
        log.note(0x1018, 2);
        log.note_fp(0x1020, 0xbeef); // replaces the first, never used
        log.fp_used();
        log.fp_used(); // already recorded
        assert_eq!(
            log.words(),
            Some(&[(0x1008, 1), (0x1018, 2), (0x1020, 0xbeef)][..])
        );
        assert!(!log.entry_fp_used());

        log.begin(0x1000, 0x2000, (0x4000, 0x1008));
        log.start(0x4000, 0x1008);
        log.fp_used();
        assert!(log.entry_fp_used(), "the frame pointer at the call");
        log.begin(0x1000, 0x2000, (0x4000, 0x1008));
        log.fp_used(); // in the profiler's frames: not the program's
        log.start(0x4000, 0x1008);
        assert!(!log.entry_fp_used());
    }
}
