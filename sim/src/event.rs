//! The one deterministic event queue, keyed by `(tick, priority, sequence)`.
//!
//! Only things that must happen in global time order are events: a DMA joining the shared
//! memory system, the memory system finishing a transfer, a block starting on a core, and
//! firmware timers. Everything a core does between those points is computed in place from
//! per-pipe timestamps (see `core/mod.rs`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Tick;

/// Transfers that end at a tick release their bandwidth before transfers that start at the same
/// tick claim theirs, so back-to-back DMAs see the share a finished one freed.
pub(crate) const PRIO_MEMORY: u8 = 0;
/// Blocks start and DMAs join the memory system after every completion at the same tick, so a
/// core resuming at `t` sees every transfer that finished at `t`.
pub(crate) const PRIO_CORE: u8 = 1;
/// Firmware timers fire after all hardware activity at the same tick, so the firmware observes a
/// settled chip.
pub(crate) const PRIO_TIMER: u8 = 2;

/// What happens at an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Event {
    /// The DMA at the head of a core's pipe joins the memory system.
    DmaStart { core: u32, queue: u8 },
    /// The memory system's next transfer completion (stale if the generation moved on).
    MemoryCheck { generation: u64 },
    /// A block launched on a core begins fetching.
    BlockStart { core: u32 },
    /// A firmware timer.
    Timer { token: u64 },
}

/// Bits of the packed key that hold the sequence number.
const SEQ_BITS: u32 = 56;

/// The queue. Each entry's `(tick, priority, sequence)` is packed into one `u128` (tick in the
/// top 64 bits, then the priority byte, then 56 bits of sequence), which orders exactly as
/// the tuple does and compares in two instructions; keys are unique, so the pop order is the
/// key order whatever the heap's layout.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    heap: BinaryHeap<Reverse<(u128, Event)>>,
    seq: u64,
}

impl EventQueue {
    pub(crate) fn push(&mut self, at: Tick, priority: u8, event: Event) {
        self.seq += 1;
        // 2^56 events would take years of host time; past that, order would be wrong.
        debug_assert!(self.seq < 1 << SEQ_BITS);
        let key = (u128::from(at.0) << 64)
            | (u128::from(priority) << SEQ_BITS)
            | u128::from(self.seq & ((1 << SEQ_BITS) - 1));
        self.heap.push(Reverse((key, event)));
    }

    pub(crate) fn pop(&mut self) -> Option<(Tick, Event)> {
        self.heap
            .pop()
            .map(|Reverse((key, e))| (Tick((key >> 64) as u64), e))
    }
}
