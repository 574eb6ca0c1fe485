//! The shared memory system: a fluid (processor-sharing) bandwidth model of HBM.
//!
//! Every DMA between a core and GM is a transfer with a per-core rate cap (its MTE's rate).
//! Active transfers share the chip-level cap max-min fairly (water-filling): a transfer never
//! exceeds its own cap, and bandwidth it cannot use goes to the others. Rates change only when
//! a transfer starts or ends, so each transfer costs two events however large it is, and
//! contention between cores shows up exactly in their completion times. All arithmetic is
//! integer: work is counted in byte-picoseconds-per-second units (bytes x 10^12), so a rate in
//! bytes per second times a duration in picoseconds subtracts exactly.

use crate::time::Tick;

const WORK_PER_BYTE: u128 = 1_000_000_000_000;

/// Who owns a transfer: a core and the index of its pipe queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub core: u32,
    pub queue: u8,
}

#[derive(Debug)]
struct Transfer {
    id: u64,
    owner: Owner,
    cap: u64,
    rate: u64,
    remaining: u128,
    write: bool,
}

#[derive(Debug)]
pub(crate) struct Hbm {
    cap: u64,
    transfers: Vec<Transfer>,
    next_id: u64,
    last: Tick,
    pub(crate) generation: u64,
    /// Total bytes read and written since the chip was built.
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
}

impl Hbm {
    pub(crate) fn new(cap_bytes_per_second: u64) -> Hbm {
        Hbm {
            cap: cap_bytes_per_second,
            transfers: Vec::new(),
            next_id: 0,
            last: Tick::ZERO,
            generation: 0,
            bytes_read: 0,
            bytes_written: 0,
        }
    }

    /// Moves every active transfer forward to `now` at its current rate and removes the ones
    /// that are done, returning their owners in start order.
    pub(crate) fn advance(&mut self, now: Tick) -> Vec<Owner> {
        let dt = u128::from(now.0.saturating_sub(self.last.0));
        self.last = self.last.max(now);
        if dt > 0 {
            for t in &mut self.transfers {
                t.remaining = t.remaining.saturating_sub(u128::from(t.rate) * dt);
            }
        }
        let mut done = Vec::new();
        self.transfers.retain(|t| {
            if t.remaining == 0 {
                done.push(t.owner);
                false
            } else {
                true
            }
        });
        done
    }

    /// Adds a transfer of `bytes` (already advanced to `now`).
    pub(crate) fn start(&mut self, owner: Owner, bytes: u64, cap: u64, write: bool) {
        self.next_id += 1;
        if write {
            self.bytes_written += bytes;
        } else {
            self.bytes_read += bytes;
        }
        self.transfers.push(Transfer {
            id: self.next_id,
            owner,
            cap: cap.max(1),
            rate: 0,
            remaining: u128::from(bytes.max(1)) * WORK_PER_BYTE,
            write,
        });
    }

    /// Re-divides the bandwidth and returns when the next transfer will finish (with a new
    /// generation number that invalidates earlier checks).
    pub(crate) fn reschedule(&mut self, now: Tick) -> Option<(Tick, u64)> {
        self.generation += 1;
        if self.transfers.is_empty() {
            return None;
        }
        let mut order: Vec<usize> = (0..self.transfers.len()).collect();
        order.sort_by_key(|&i| (self.transfers[i].cap, self.transfers[i].id));
        let mut left = self.cap;
        let mut n = order.len() as u64;
        for i in order {
            let share = (left / n).max(1);
            let rate = self.transfers[i].cap.min(share);
            self.transfers[i].rate = rate;
            left = left.saturating_sub(rate);
            n -= 1;
        }
        let next = self
            .transfers
            .iter()
            .map(|t| t.remaining.div_ceil(u128::from(t.rate)))
            .min()
            .unwrap_or(0);
        let at = Tick(
            now.0
                .saturating_add(u64::try_from(next).unwrap_or(u64::MAX)),
        );
        Some((at, self.generation))
    }

    /// Current total read and write rates in bytes per second.
    pub(crate) fn rates(&self) -> (u64, u64) {
        let mut r = (0, 0);
        for t in &self.transfers {
            if t.write {
                r.1 += t.rate;
            } else {
                r.0 += t.rate;
            }
        }
        r
    }

    pub(crate) fn active(&self) -> usize {
        self.transfers.len()
    }
}
