//! The flag handshakes of the vector lowerings, named once (Ascend C's TQue pattern): a
//! [`Que`] hands buffers from one pipe to another, a [`Chain`] passes each buffer round a ring
//! of pipes, and [`barrier`] makes one pipe wait once for another's work so far. Lowerings
//! synchronise their pipes only through these, so the meaning of each flag is said here.
//!
//! ```text
//!   Que { from: MTE2, to: V }, buffer k:
//!     MTE2: alloc(k) ─ load ─ enque(k)    flag MTE2→V k: "data ready"
//!     V:    deque(k) ─ compute ─ free(k)  flag V→MTE2 k: "buffer free"
//!   prime: every buffer starts free (set each "free" flag once); drain: consume the "free"
//!   flags the last tiles set, so the kernel ends with no flag pending.
//! ```
//!
//! Each helper emits exactly the `set_flag` / `wait_flag` instructions it names, in that order,
//! so a lowering written with them is the kernel it was when it spelt the flags out.

use gearsim_isa::Pipe;

use super::writer::Asm;

/// A queue of buffers from pipe `from` (which fills them) to pipe `to` (which uses them up):
/// flag `from→to` id `k` says buffer `k` holds data, flag `to→from` id `k` that it is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Que {
    /// The producer.
    pub from: Pipe,
    /// The consumer.
    pub to: Pipe,
}

/// The vector unit's input queue: MTE2 loads from GM, V computes (Ascend C's VECIN).
pub const VECIN: Que = Que {
    from: Pipe::Mte2,
    to: Pipe::V,
};

/// The vector unit's output queue: V computes, MTE3 stores to GM (Ascend C's VECOUT).
pub const VECOUT: Que = Que {
    from: Pipe::V,
    to: Pipe::Mte3,
};

impl Que {
    /// The producer waits until buffer `k` is free.
    pub fn alloc(self, a: &mut Asm, k: usize) {
        a.wait_flag(self.to, self.from, k);
    }

    /// The producer has filled buffer `k`.
    pub fn enque(self, a: &mut Asm, k: usize) {
        a.set_flag(self.from, self.to, k);
    }

    /// The consumer waits until buffer `k` holds data.
    pub fn deque(self, a: &mut Asm, k: usize) {
        a.wait_flag(self.from, self.to, k);
    }

    /// The consumer is done with buffer `k`.
    pub fn free(self, a: &mut Asm, k: usize) {
        a.set_flag(self.to, self.from, k);
    }
}

/// Buffers `0..nbuf` of every queue start free (buffer by buffer, the queues in order).
pub fn prime(a: &mut Asm, queues: &[Que], nbuf: usize) {
    for k in 0..nbuf {
        for q in queues {
            q.free(a, k);
        }
    }
}

/// Consumes the "free" flags the last tiles left on buffers `0..nbuf` (in [`prime`]'s order).
pub fn drain(a: &mut Asm, queues: &[Que], nbuf: usize) {
    for k in 0..nbuf {
        for q in queues {
            q.alloc(a, k);
        }
    }
}

/// Pipe `to` waits once for all that pipe `from` was given so far (flag `id`), e.g. V for
/// loads its operands come from, or MTE3 for the vector results it stores.
pub fn barrier(a: &mut Asm, from: Pipe, to: Pipe, id: usize) {
    let q = Que { from, to };
    q.enque(a, id);
    q.deque(a, id);
}

/// The pipes a buffer passes through in order; the last one hands it back to the first. Each
/// consecutive pair is a [`Que`] with flag id `k` for buffer `k`, so a stage starts on buffer
/// `k` only when the previous stage finished with it (one queue per buffer and hand-off).
#[derive(Debug, Clone, Copy)]
pub struct Chain {
    /// Stages in order.
    pub stages: &'static [Pipe],
    /// Buffers rotated.
    pub nbuf: usize,
}

impl Chain {
    /// The hand-off from stage `i` to the next (the last stage's goes back to the first).
    fn link(&self, i: usize) -> Que {
        Que {
            from: self.stages[i],
            to: self.stages[(i + 1) % self.stages.len()],
        }
    }

    /// The hand-off back from the last stage to the first: its "data" means "buffer free".
    fn back(&self) -> Que {
        self.link(self.stages.len() - 1)
    }

    /// Every buffer starts free.
    pub fn prologue(&self, a: &mut Asm) {
        for k in 0..self.nbuf {
            self.back().enque(a, k);
        }
    }

    /// Consumes the "free" flags the last tasks set.
    pub fn epilogue(&self, a: &mut Asm) {
        for k in 0..self.nbuf {
            self.back().deque(a, k);
        }
    }

    /// Stage `i` waits for buffer `k`.
    pub fn begin(&self, a: &mut Asm, i: usize, k: usize) {
        let prev = (i + self.stages.len() - 1) % self.stages.len();
        self.link(prev).deque(a, k);
    }

    /// Stage `i` is done with buffer `k`.
    pub fn end(&self, a: &mut Asm, i: usize, k: usize) {
        self.link(i).enque(a, k);
    }
}
