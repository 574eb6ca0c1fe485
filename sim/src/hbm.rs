//! The shared memory system: a fluid (processor-sharing) bandwidth model of HBM.
//!
//! Every DMA between a core and GM is a transfer with a per-core rate cap (its MTE's rate).
//! Active transfers share the chip-level cap max-min fairly (water-filling): a transfer never
//! exceeds its own cap, and bandwidth it cannot use goes to the others. Rates change only when
//! a transfer starts or ends, so each transfer costs two events however large it is, and
//! contention between cores shows up exactly in their completion times.
//!
//! Transfers with the same cap always get the same rate, so they are kept in one group with a
//! shared "work served per member" counter (virtual time, as in fair queueing): a member
//! finishes when the counter passes its finish mark. Starting, finishing and re-dividing cost
//! O(number of distinct caps), not O(number of transfers). All arithmetic is integer: work is
//! counted in bytes x 10^12, so a rate in bytes per second times a duration in picoseconds
//! subtracts exactly.

use crate::time::Tick;

const WORK_PER_BYTE: u128 = 1_000_000_000_000;

/// Who owns a transfer: a core's pipe queue, or an engine outside the cores (the firmware's
/// AI CPUs, SDMA and PCIe DMA) identified by the token it gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Core { core: u32, queue: u8 },
    External { token: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Member {
    /// Value of the group's `served` counter at which this transfer is complete.
    finish: u128,
    id: u64,
    owner: Owner,
    write: bool,
}

#[derive(Debug)]
struct Group {
    cap: u64,
    rate: u64,
    served: u128,
    /// Sorted by (finish, id).
    members: Vec<Member>,
    writes: u64,
}

#[derive(Debug)]
pub(crate) struct Hbm {
    cap: u64,
    /// Sorted by cap.
    groups: Vec<Group>,
    next_id: u64,
    last: Tick,
    generation: u64,
    /// When the pending completion check fires (if one is pending).
    scheduled: Option<Tick>,
    /// Total bytes read and written since the chip was built.
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
}

impl Hbm {
    pub(crate) fn new(cap_bytes_per_second: u64) -> Hbm {
        Hbm {
            cap: cap_bytes_per_second,
            groups: Vec::new(),
            next_id: 0,
            last: Tick::ZERO,
            generation: 0,
            scheduled: None,
            bytes_read: 0,
            bytes_written: 0,
        }
    }

    /// Moves every active transfer forward to `now` at its current rate and appends the owners
    /// of the ones that are done to `done`, in start order.
    pub(crate) fn advance(&mut self, now: Tick, done: &mut Vec<(u64, Owner)>) {
        let dt = u128::from(now.0.saturating_sub(self.last.0));
        self.last = self.last.max(now);
        let first = done.len();
        for g in &mut self.groups {
            g.served += u128::from(g.rate) * dt;
            let finished = g.members.partition_point(|m| m.finish <= g.served);
            for m in g.members.drain(..finished) {
                g.writes -= u64::from(m.write);
                done.push((m.id, m.owner));
            }
        }
        done[first..].sort_unstable_by_key(|(id, _)| *id);
    }

    /// Adds a transfer of `bytes` (call after advancing to now).
    pub(crate) fn start(&mut self, owner: Owner, bytes: u64, cap: u64, write: bool) {
        self.next_id += 1;
        if write {
            self.bytes_written += bytes;
        } else {
            self.bytes_read += bytes;
        }
        let cap = cap.max(1);
        let gi = match self.groups.binary_search_by_key(&cap, |g| g.cap) {
            Ok(i) => i,
            Err(i) => {
                self.groups.insert(
                    i,
                    Group {
                        cap,
                        rate: 0,
                        served: 0,
                        members: Vec::new(),
                        writes: 0,
                    },
                );
                i
            }
        };
        let g = &mut self.groups[gi];
        let m = Member {
            finish: g.served + u128::from(bytes.max(1)) * WORK_PER_BYTE,
            id: self.next_id,
            owner,
            write,
        };
        let at = g
            .members
            .partition_point(|x| (x.finish, x.id) < (m.finish, m.id));
        g.members.insert(at, m);
        g.writes += u64::from(write);
    }

    /// Whether a completion check with this generation is the pending one (it is then
    /// consumed); stale checks are ignored.
    pub(crate) fn take_check(&mut self, generation: u64) -> bool {
        if generation == self.generation && self.scheduled.is_some() {
            self.scheduled = None;
            true
        } else {
            false
        }
    }

    /// Re-divides the bandwidth (water-filling over groups in ascending cap order) and returns
    /// a completion check to schedule, if the pending one does not already come first: a check
    /// that fires early finds nothing finished and simply reschedules, so only an earlier
    /// next completion needs a new event (and a new generation that retires the old one).
    pub(crate) fn reschedule(&mut self, now: Tick) -> Option<(Tick, u64)> {
        let mut n: u64 = self.groups.iter().map(|g| g.members.len() as u64).sum();
        if n == 0 {
            return None;
        }
        let mut left = self.cap;
        let mut next = u128::MAX;
        for g in &mut self.groups {
            let len = g.members.len() as u64;
            if len == 0 {
                g.rate = 0;
                continue;
            }
            let share = (left / n).max(1);
            g.rate = g.cap.min(share);
            left = left.saturating_sub(g.rate * len);
            n -= len;
            let remaining = g.members[0].finish - g.served;
            let finish = match u64::try_from(remaining) {
                Ok(r) => u128::from(r.div_ceil(g.rate)),
                Err(_) => remaining.div_ceil(u128::from(g.rate)),
            };
            next = next.min(finish);
        }
        let at = Tick(
            now.0
                .saturating_add(u64::try_from(next).unwrap_or(u64::MAX)),
        );
        if self.scheduled.is_some_and(|s| s <= at) {
            return None;
        }
        self.generation += 1;
        self.scheduled = Some(at);
        Some((at, self.generation))
    }

    /// Current total read and write rates in bytes per second.
    pub(crate) fn rates(&self) -> (u64, u64) {
        let mut r = (0, 0);
        for g in &self.groups {
            r.0 += g.rate * (g.members.len() as u64 - g.writes);
            r.1 += g.rate * g.writes;
        }
        r
    }

    pub(crate) fn active(&self) -> usize {
        self.groups.iter().map(|g| g.members.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(core: u32) -> Owner {
        Owner::Core { core, queue: 3 }
    }

    #[test]
    fn one_transfer_runs_at_its_cap() {
        let mut h = Hbm::new(1_000_000_000_000);
        h.start(owner(0), 1000, 1_000_000_000, false);
        let (at, _) = h.reschedule(Tick(0)).unwrap();
        assert_eq!(at, Tick(1_000_000)); // 1000 bytes at 1 GB/s = 1 us
        let mut done = Vec::new();
        h.advance(at, &mut done);
        assert_eq!(done.len(), 1);
    }

    #[test]
    fn the_chip_cap_is_shared_and_unused_bandwidth_goes_to_the_others() {
        // Chip 100 B/s; one transfer capped at 10, two capped at 1000: they get 10, 45, 45.
        let mut h = Hbm::new(100);
        h.start(owner(0), 100, 10, false);
        h.start(owner(1), 450, 1000, true);
        h.start(owner(2), 900, 1000, false);
        let (at, _) = h.reschedule(Tick(0)).unwrap();
        assert_eq!(h.rates(), (55, 45));
        assert_eq!(at, Tick(10_000_000_000_000)); // 450 bytes at 45 B/s and 100 at 10 B/s: 10 s
        let mut done = Vec::new();
        h.advance(at, &mut done);
        assert_eq!(
            done.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
            vec![owner(0), owner(1)]
        );
        // The pending check fired; the survivor now gets its cap-limited fair share of
        // everything: 100 B/s.
        let generation = h.generation;
        assert!(h.take_check(generation));
        let (at2, _) = h.reschedule(at).unwrap();
        assert_eq!(h.rates(), (100, 0));
        assert_eq!(at2, Tick(at.0 + 4_500_000_000_000)); // 450 bytes left at 100 B/s
    }
}
