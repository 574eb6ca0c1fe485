//! The shared memory system: a fluid (processor-sharing) bandwidth model of HBM and the L2
//! cache in front of it.
//!
//! Every DMA between a core and GM is a transfer with a per-core rate cap (its MTE's rate).
//! When it starts, `chip.rs` splits its bytes into L2 hits and misses (`l2.rs`); at rate `r`
//! a transfer with hit share `h` and HBM weight `m` uses `r * m` of the HBM cap and `r * h`
//! of the L2 cap. `m` is its miss share, or more for a read whose misses fetch whole L2 lines
//! for the bytes it wants (HBM then moves more than the transfer delivers). Active transfers
//! share both caps max-min fairly by progressive filling: every rate rises together; a
//! transfer stops rising at its own cap, and when HBM (or L2) is full, every
//! transfer that uses it stops there, while the others keep rising into what is left. Rates
//! change only when a transfer starts or ends, so each transfer costs two events however
//! large it is, and contention between cores shows up exactly in their completion times.
//!
//! A transfer's rate is therefore min(its cap, the HBM level if it misses, the L2 level if it
//! hits), so transfers with the same cap and the same kind (only misses, only hits, or both)
//! always get the same rate. They are kept in one group with a shared "work served per member"
//! counter (virtual time, as in fair queueing) and the sums of their weights: a member finishes
//! when the counter passes its finish mark. Starting, finishing and re-dividing cost O(number of
//! groups), at most three per distinct cap. All arithmetic is integer: work is counted in
//! bytes x 10^12, so a rate in bytes per second times a duration in picoseconds subtracts
//! exactly, and weights are fractions of [`ONE`]. With no hits every weight is exactly `ONE`
//! and the division is the plain max-min water-filling of an HBM without L2, to the byte.

use crate::time::Tick;

const WORK_PER_BYTE: u128 = 1_000_000_000_000;

/// Weight of a transfer whose every byte uses one memory. 2^20 resolves a hit fraction to one
/// part in a million and keeps a chip cap in weight units (cap x ONE) within a u64 up to
/// 17 TB/s, where the integer division of the water-fill is a single machine instruction.
const ONE: u64 = 1 << 20;

/// Who owns a transfer: a core's pipe queue, or an engine outside the cores (the firmware's
/// AI CPUs, SDMA and PCIe DMA) identified by the token it gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Core {
        core: u32,
        queue: u8,
    },
    External {
        token: u64,
    },
    /// The L2 writing evicted dirty lines back (no one waits for it).
    WriteBack,
}

/// A finished transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub owner: Owner,
    /// Share of its bytes that the L2 served, in units of [`ONE`].
    hit_weight: u32,
}

impl Done {
    /// The mix of a figure for bytes served by L2 and one for bytes served by HBM, weighted by
    /// the transfer's bytes and rounded to the nearest integer: exactly `miss` with no hits.
    pub(crate) fn mix(&self, hit: u64, miss: u64) -> u64 {
        if self.hit_weight == 0 {
            return miss;
        }
        let h = u128::from(self.hit_weight);
        let one = u128::from(ONE);
        let sum = h * u128::from(hit) + (one - h) * u128::from(miss);
        ((sum + one / 2) / one) as u64
    }
}

/// Which memories a group's transfers use; orders groups of equal cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Misses,
    Mixed,
    Hits,
}

/// Kept small: members shift when one is inserted or finishes.
#[derive(Debug, Clone, Copy)]
struct Member {
    /// Value of the group's `served` counter at which this transfer is complete.
    finish: u128,
    id: u64,
    owner: Owner,
    /// HBM bytes per byte the transfer moves, in units of [`ONE`]: its miss share, or more
    /// when the L2 fetches whole lines for the few bytes of each that it reads.
    miss_weight: u32,
    /// Share of the transfer's bytes that the L2 serves, in units of [`ONE`].
    hit_weight: u32,
    write: bool,
}

#[derive(Debug)]
struct Group {
    cap: u64,
    kind: Kind,
    /// Bytes per second of each member; 0 while `reschedule` has not given one yet.
    rate: u64,
    served: u128,
    /// Sorted by (finish, id).
    members: Vec<Member>,
    writes: u64,
    /// Sums over the members of the HBM weight, of the HBM weight of reads, and of the L2
    /// weight (`ONE` minus the HBM weight).
    miss_weight: u64,
    read_miss_weight: u64,
    hit_weight: u64,
}

impl Group {
    fn add(&mut self, m: &Member, sign: bool) {
        let w = u64::from(m.miss_weight);
        let reads = if m.write { 0 } else { w };
        let hits = u64::from(m.hit_weight);
        if sign {
            self.miss_weight += w;
            self.read_miss_weight += reads;
            self.hit_weight += hits;
            self.writes += u64::from(m.write);
        } else {
            self.miss_weight -= w;
            self.read_miss_weight -= reads;
            self.hit_weight -= hits;
            self.writes -= u64::from(m.write);
        }
    }
}

/// Current total rates in bytes per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rates {
    pub hbm_read: u64,
    pub hbm_write: u64,
    pub l2_read: u64,
}

#[derive(Debug)]
pub(crate) struct Hbm {
    cap: u64,
    l2_cap: u64,
    /// Sorted by (cap, kind).
    groups: Vec<Group>,
    next_id: u64,
    last: Tick,
    generation: u64,
    /// When the pending completion check fires (if one is pending).
    scheduled: Option<Tick>,
    /// Total bytes read and written since the chip was built.
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    /// Bytes of reads the L2 served since the chip was built.
    pub(crate) read_hit_bytes: u64,
    /// Bytes HBM delivered for reads since the chip was built (the L2's line fills).
    pub(crate) hbm_read_bytes: u64,
    /// Active transfers that are not plain misses; while there is none, `fill_misses` divides
    /// HBM alone.
    hitting: usize,
}

impl Hbm {
    /// HBM and L2 bandwidth caps in bytes per second (the L2 cap matters only to transfers
    /// that hit).
    pub(crate) fn new(cap_bytes_per_second: u64, l2_bytes_per_second: u64) -> Hbm {
        Hbm {
            cap: cap_bytes_per_second,
            l2_cap: l2_bytes_per_second,
            groups: Vec::new(),
            next_id: 0,
            last: Tick::ZERO,
            generation: 0,
            scheduled: None,
            bytes_read: 0,
            bytes_written: 0,
            read_hit_bytes: 0,
            hbm_read_bytes: 0,
            hitting: 0,
        }
    }

    /// Moves every active transfer forward to `now` at its current rate and appends the ones
    /// that are done to `done`, in start order.
    pub(crate) fn advance(&mut self, now: Tick, done: &mut Vec<(u64, Done)>) {
        let dt = u128::from(now.0.saturating_sub(self.last.0));
        self.last = self.last.max(now);
        let first = done.len();
        for g in &mut self.groups {
            g.served += u128::from(g.rate) * dt;
            let finished = g.members.partition_point(|m| m.finish <= g.served);
            for i in 0..finished {
                let m = g.members[i];
                g.add(&m, false);
                self.hitting -= usize::from(g.kind != Kind::Misses);
                done.push((
                    m.id,
                    Done {
                        owner: m.owner,
                        hit_weight: m.hit_weight,
                    },
                ));
            }
            g.members.drain(..finished);
        }
        done[first..].sort_unstable_by_key(|(id, _)| *id);
    }

    /// Adds a transfer of `bytes`, `hit_bytes` of which the L2 serves and the rest HBM (call
    /// after advancing to now).
    pub(crate) fn start(
        &mut self,
        owner: Owner,
        bytes: u64,
        hit_bytes: u64,
        cap: u64,
        write: bool,
    ) {
        let hit_bytes = hit_bytes.min(bytes);
        self.start_filling(owner, bytes, hit_bytes, bytes - hit_bytes, cap, write);
    }

    /// Adds a transfer of `bytes`, `hit_bytes` of which the L2 serves, for which HBM moves
    /// `hbm_bytes` (the misses, or the whole lines the L2 fetches for them), after advancing
    /// to now.
    pub(crate) fn start_filling(
        &mut self,
        owner: Owner,
        bytes: u64,
        hit_bytes: u64,
        hbm_bytes: u64,
        cap: u64,
        write: bool,
    ) {
        self.next_id += 1;
        let hit_bytes = hit_bytes.min(bytes);
        if owner == Owner::WriteBack {
            // Counted by the chip: the bytes were counted when they were written.
        } else if write {
            self.bytes_written += bytes;
        } else {
            self.bytes_read += bytes;
            self.read_hit_bytes += hit_bytes;
            self.hbm_read_bytes += hbm_bytes;
        }
        let bytes = bytes.max(1);
        // Rounded up, so a transfer with any miss keeps a share of HBM; the hit share is what
        // the miss share leaves.
        let share = |b: u64| (u128::from(b) * u128::from(ONE)).div_ceil(u128::from(bytes));
        let hit_weight = (u128::from(ONE) - share(bytes - hit_bytes).min(u128::from(ONE))) as u32;
        let miss_weight = u32::try_from(share(hbm_bytes)).unwrap_or(u32::MAX);
        // Only plain misses (one HBM byte per byte) may be divided by counting transfers.
        let kind = if miss_weight == 0 {
            Kind::Hits
        } else if hit_weight == 0 && u64::from(miss_weight) == ONE {
            Kind::Misses
        } else {
            Kind::Mixed
        };
        let cap = cap.max(1);
        let gi = match self
            .groups
            .binary_search_by_key(&(cap, kind), |g| (g.cap, g.kind))
        {
            Ok(i) => i,
            Err(i) => {
                self.groups.insert(
                    i,
                    Group {
                        cap,
                        kind,
                        rate: 0,
                        served: 0,
                        members: Vec::new(),
                        writes: 0,
                        miss_weight: 0,
                        read_miss_weight: 0,
                        hit_weight: 0,
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
            miss_weight,
            hit_weight,
            write,
        };
        let at = g
            .members
            .partition_point(|x| (x.finish, x.id) < (m.finish, m.id));
        g.members.insert(at, m);
        g.add(&m, true);
        self.hitting += usize::from(kind != Kind::Misses);
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

    /// Re-divides the bandwidth and returns a completion check to schedule, if the pending one
    /// does not already come first: a check that fires early finds nothing finished and simply
    /// reschedules, so only an earlier next completion needs a new event (and a new generation
    /// that retires the old one).
    pub(crate) fn reschedule(&mut self, now: Tick) -> Option<(Tick, u64)> {
        let any = if self.hitting == 0 {
            self.fill_misses()
        } else {
            self.fill()
        };
        if !any {
            return None;
        }
        let mut next = u128::MAX;
        for g in &self.groups {
            let Some(first) = g.members.first() else {
                continue;
            };
            let remaining = first.finish - g.served;
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

    /// [`Hbm::fill`] when no transfer hits, in counts instead of weights (the common case, and
    /// twice as fast): water-filling over the groups in ascending cap order, each taking
    /// min(cap, what is left / transfers left). False if there is no transfer.
    fn fill_misses(&mut self) -> bool {
        let mut n: u64 = self.groups.iter().map(|g| g.members.len() as u64).sum();
        if n == 0 {
            return false;
        }
        let mut left = self.cap;
        for g in &mut self.groups {
            let len = g.members.len() as u64;
            if len == 0 {
                g.rate = 0;
                continue;
            }
            g.rate = g.cap.min((left / n).max(1));
            left = left.saturating_sub(g.rate * len);
            n -= len;
        }
        true
    }

    /// Progressive filling: gives every non-empty group its rate; false if there is none.
    ///
    /// The level all unfrozen rates share rises until the lowest remaining cap, or the level at
    /// which HBM or L2 is full (what is left of it over the weights still rising on it), comes
    /// first. A cap freezes its group; a full memory freezes every group that uses it. Those
    /// groups take the level in cap order, each recomputing it from what is left, so the
    /// remainder of the integer division goes to the higher caps exactly as a single-memory
    /// water-fill hands it out.
    fn fill(&mut self) -> bool {
        let (mut hbm_weight, mut l2_weight, mut any) = (0u128, 0u128, false);
        for g in &mut self.groups {
            g.rate = 0;
            if !g.members.is_empty() {
                any = true;
                hbm_weight += u128::from(g.miss_weight);
                l2_weight += u128::from(g.hit_weight);
            }
        }
        if !any {
            return false;
        }
        let mut hbm_left = u128::from(self.cap) * u128::from(ONE);
        let mut l2_left = u128::from(self.l2_cap) * u128::from(ONE);
        let level = |left: u128, weight: u128| {
            if weight == 0 {
                u128::MAX
            } else if let (Ok(l), Ok(w)) = (u64::try_from(left), u64::try_from(weight)) {
                u128::from(l / w)
            } else {
                left / weight
            }
        };
        let mut lowest = 0;
        loop {
            while self
                .groups
                .get(lowest)
                .is_some_and(|g| g.members.is_empty() || g.rate != 0)
            {
                lowest += 1;
            }
            let Some(g) = self.groups.get(lowest) else {
                return true;
            };
            let cap = u128::from(g.cap);
            let hbm_level = level(hbm_left, hbm_weight);
            let l2_level = level(l2_left, l2_weight);
            let full_l2 = if cap <= hbm_level && cap <= l2_level {
                None
            } else {
                Some(l2_level < hbm_level)
            };
            for g in &mut self.groups[lowest..] {
                if g.members.is_empty() || g.rate != 0 {
                    continue;
                }
                let share = match full_l2 {
                    None => u128::from(g.cap),
                    Some(false) if g.miss_weight == 0 => continue,
                    Some(true) if g.hit_weight == 0 => continue,
                    Some(_) => {
                        let mut s = u128::from(g.cap);
                        if g.miss_weight > 0 {
                            s = s.min(level(hbm_left, hbm_weight));
                        }
                        if g.hit_weight > 0 {
                            s = s.min(level(l2_left, l2_weight));
                        }
                        s
                    }
                };
                // Never zero, so every transfer finishes; at most the cap, so it fits a u64.
                g.rate = u64::try_from(share.max(1)).unwrap_or(g.cap);
                let rate = u128::from(g.rate);
                let (miss, hit) = (u128::from(g.miss_weight), u128::from(g.hit_weight));
                hbm_left = hbm_left.saturating_sub(miss * rate);
                l2_left = l2_left.saturating_sub(hit * rate);
                hbm_weight -= miss;
                l2_weight -= hit;
                if full_l2.is_none() {
                    break;
                }
            }
        }
    }

    /// Current total rates: HBM reads and writes, and L2 read hits.
    pub(crate) fn rates(&self) -> Rates {
        let (mut hbm_read, mut l2_read, mut hbm_write) = (0u128, 0u128, 0u64);
        for g in &self.groups {
            let rate = u128::from(g.rate);
            hbm_read += rate * u128::from(g.read_miss_weight);
            l2_read += rate * u128::from(g.hit_weight);
            hbm_write += g.rate * g.writes;
        }
        let one = u128::from(ONE);
        Rates {
            hbm_read: u64::try_from(hbm_read / one).unwrap_or(u64::MAX),
            hbm_write,
            l2_read: u64::try_from(l2_read / one).unwrap_or(u64::MAX),
        }
    }

    pub(crate) fn active(&self) -> usize {
        self.groups.iter().map(|g| g.members.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn owner(core: u32) -> Owner {
        Owner::Core { core, queue: 3 }
    }

    fn rates(hbm_read: u64, hbm_write: u64, l2_read: u64) -> Rates {
        Rates {
            hbm_read,
            hbm_write,
            l2_read,
        }
    }

    /// Each active transfer's rate, in start order.
    fn member_rates(h: &Hbm) -> Vec<u64> {
        let mut v: Vec<(u64, u64)> = h
            .groups
            .iter()
            .flat_map(|g| g.members.iter().map(|m| (m.id, g.rate)))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, r)| r).collect()
    }

    #[test]
    fn one_transfer_runs_at_its_cap() {
        let mut h = Hbm::new(1_000_000_000_000, 5_000_000_000_000);
        h.start(owner(0), 1000, 0, 1_000_000_000, false);
        let (at, _) = h.reschedule(Tick(0)).unwrap();
        assert_eq!(at, Tick(1_000_000)); // 1000 bytes at 1 GB/s = 1 us
        let mut done = Vec::new();
        h.advance(at, &mut done);
        assert_eq!(done.len(), 1);
    }

    #[test]
    fn a_read_whose_lines_are_fetched_whole_moves_at_hbm_over_the_fetch_factor() {
        // 100 bytes for which HBM moves 400 (whole lines): HBM at 100 B/s gives it 25 B/s,
        // beside a plain read that takes the rest.
        let mut h = Hbm::new(100, 500);
        h.start_filling(owner(0), 100, 0, 400, 1000, false);
        h.reschedule(Tick(0));
        assert_eq!(member_rates(&h), vec![25]);
        assert_eq!(h.rates().hbm_read, 100);
        h.start(owner(1), 100, 0, 1000, false);
        h.reschedule(Tick(0));
        assert_eq!(member_rates(&h), vec![20, 20]);
        assert_eq!(h.hbm_read_bytes, 500);
    }

    #[test]
    fn the_chip_cap_is_shared_and_unused_bandwidth_goes_to_the_others() {
        // Chip 100 B/s; one transfer capped at 10, two capped at 1000: they get 10, 45, 45.
        let mut h = Hbm::new(100, 500);
        h.start(owner(0), 100, 0, 10, false);
        h.start(owner(1), 450, 0, 1000, true);
        h.start(owner(2), 900, 0, 1000, false);
        let (at, _) = h.reschedule(Tick(0)).unwrap();
        assert_eq!(h.rates(), rates(55, 45, 0));
        assert_eq!(at, Tick(10_000_000_000_000)); // 450 bytes at 45 B/s and 100 at 10 B/s: 10 s
        let mut done = Vec::new();
        h.advance(at, &mut done);
        assert_eq!(
            done.iter().map(|(_, d)| d.owner).collect::<Vec<_>>(),
            vec![owner(0), owner(1)]
        );
        // The pending check fired; the survivor now gets its cap-limited fair share of
        // everything: 100 B/s.
        let generation = h.generation;
        assert!(h.take_check(generation));
        let (at2, _) = h.reschedule(at).unwrap();
        assert_eq!(h.rates(), rates(100, 0, 0));
        assert_eq!(at2, Tick(at.0 + 4_500_000_000_000)); // 450 bytes left at 100 B/s
    }

    #[test]
    fn hits_are_served_at_the_l2_cap_beside_the_misses() {
        // HBM 100 B/s, L2 500 B/s. Four reads that all hit, capped at 200: the L2 cap binds
        // (125 each), and a read that misses still gets all of HBM.
        let mut h = Hbm::new(100, 500);
        for core in 0..4 {
            h.start(owner(core), 1000, 1000, 200, false);
        }
        h.start(owner(4), 1000, 0, 200, false);
        h.reschedule(Tick(0));
        assert_eq!(member_rates(&h), vec![125, 125, 125, 125, 100]);
        assert_eq!(h.rates(), rates(100, 0, 500));
        // Capped at 100 instead, the hits run at their caps (400 B/s of L2).
        let mut h = Hbm::new(100, 500);
        for core in 0..4 {
            h.start(owner(core), 1000, 1000, 100, false);
        }
        h.reschedule(Tick(0));
        assert_eq!(h.rates(), rates(0, 0, 400));
    }

    #[test]
    fn a_full_hbm_stops_only_the_transfers_that_use_it() {
        // HBM 100, L2 500; a miss-only, a half-hit and a hit-only read, all capped at 1000.
        // The level reaches 66 when HBM is full (1 + 1/2 of it per unit of level); the
        // half-hit read takes what the integer division left over (68, using 34 of HBM),
        // and the hit-only one rises on alone into the rest of L2: 500 - 34 = 466.
        let mut h = Hbm::new(100, 500);
        h.start(owner(0), 1000, 0, 1000, false);
        h.start(owner(1), 1000, 500, 1000, false);
        h.start(owner(2), 1000, 1000, 1000, false);
        h.reschedule(Tick(0));
        assert_eq!(member_rates(&h), vec![66, 68, 466]);
        assert_eq!(h.rates(), rates(100, 0, 500));
    }

    #[test]
    fn a_finished_transfer_reports_its_hits() {
        let mut h = Hbm::new(100, 500);
        h.start(owner(0), 1000, 250, 1000, false);
        let (at, _) = h.reschedule(Tick(0)).unwrap();
        let mut done = Vec::new();
        h.advance(at, &mut done);
        assert_eq!(done.len(), 1);
        // A quarter from L2: the latency mix of 200 (L2) and 400 (DDR) is 350.
        assert_eq!(done[0].1.mix(200, 400), 350);
        assert_eq!(done[0].1.owner, owner(0));
        // 750 bytes of misses at 100 B/s of HBM bound it: 133 B/s overall (rounded down), so
        // 1000 bytes take 7.52 s (rounded up to a picosecond).
        assert_eq!(at, Tick(1_000_000_000_000_000u64.div_ceil(133)));
        assert_eq!((h.bytes_read, h.read_hit_bytes), (1000, 250));
    }

    /// The division of an HBM without L2 as it was before the L2 existed: groups by ascending
    /// cap, each taking min(cap, what is left / transfers left).
    fn water_fill(cap: u64, transfers: &[(u64, bool)]) -> Vec<u64> {
        let mut caps: Vec<u64> = transfers.iter().map(|t| t.0.max(1)).collect();
        caps.sort_unstable();
        caps.dedup();
        let mut left = cap;
        let mut n = transfers.len() as u64;
        let mut rate_of = Vec::new();
        for c in caps {
            let len = transfers.iter().filter(|t| t.0.max(1) == c).count() as u64;
            let rate = c.min((left / n).max(1));
            left = left.saturating_sub(rate * len);
            n -= len;
            rate_of.push((c, rate));
        }
        transfers
            .iter()
            .map(|t| {
                rate_of
                    .iter()
                    .find(|r| r.0 == t.0.max(1))
                    .map_or(0, |r| r.1)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn without_hits_the_division_is_the_plain_water_fill(
            cap in 1u64..10_000,
            transfers in prop::collection::vec((0u64..3_000, any::<bool>()), 1..40),
        ) {
            let mut h = Hbm::new(cap, 5 * cap);
            for (i, &(c, write)) in transfers.iter().enumerate() {
                h.start(owner(i as u32), 1000, 0, c, write);
            }
            let want = water_fill(cap, &transfers);
            // The shortcut taken while nothing hits, and the general division.
            h.reschedule(Tick(0));
            prop_assert_eq!(member_rates(&h), want.clone());
            h.fill();
            prop_assert_eq!(member_rates(&h), want);
        }

        #[test]
        fn the_division_is_feasible_and_max_min_fair(
            hbm in 1_000u64..100_000,
            l2 in 1_000u64..500_000,
            transfers in prop::collection::vec((1u64..50_000, 0u64..=4), 1..30),
        ) {
            let mut h = Hbm::new(hbm, l2);
            // Hit quarters 0..=4 of 1000 bytes.
            for (i, &(c, q)) in transfers.iter().enumerate() {
                h.start(owner(i as u32), 1000, q * 250, c, false);
            }
            h.reschedule(Tick(0));
            let r = member_rates(&h);
            let use_of = |hits: bool| -> f64 {
                transfers.iter().zip(&r).map(|(&(_, q), &x)| {
                    let f = q as f64 / 4.0;
                    x as f64 * if hits { f } else { 1.0 - f }
                }).sum()
            };
            // Feasible: caps hold, each memory within rounding of its cap.
            for (&(c, _), &x) in transfers.iter().zip(&r) {
                prop_assert!(x <= c);
            }
            let n = transfers.len() as f64;
            prop_assert!(use_of(false) <= hbm as f64 + n, "HBM {} > {hbm}", use_of(false));
            prop_assert!(use_of(true) <= l2 as f64 + n, "L2 {} > {l2}", use_of(true));
            // Max-min fair: a transfer below its cap uses a memory that is full (within
            // rounding) and gets at least the largest rate on it (within rounding).
            let full_hbm = use_of(false) >= hbm as f64 - 4.0 * n;
            let full_l2 = use_of(true) >= l2 as f64 - 4.0 * n;
            for (i, (&(c, q), &x)) in transfers.iter().zip(&r).enumerate() {
                if x >= c {
                    continue;
                }
                let top = |hits: bool| {
                    transfers.iter().zip(&r)
                        .filter(|((_, q2), _)| if hits { *q2 > 0 } else { *q2 < 4 })
                        .map(|(_, &y)| y)
                        .max()
                        .unwrap_or(0)
                };
                let bottleneck = (q < 4 && full_hbm && x + 4 * 4 >= top(false))
                    || (q > 0 && full_l2 && x + 4 * 4 >= top(true));
                prop_assert!(bottleneck, "transfer {i} at {x} < cap {c} has no bottleneck: {r:?}");
            }
        }
    }
}
