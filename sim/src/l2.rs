//! The on-die L2 cache in front of HBM: which GM lines are resident. It knows nothing of time;
//! `chip.rs` asks it, when a DMA joins the memory system, how many of the DMA's bytes hit, and
//! `hbm.rs` serves those bytes at the L2 rate and the rest at the HBM rate.
//!
//! Lines (`memory.l2_line_bytes`) are what hit or miss, but tags are kept per aligned block of
//! [`LINES_PER_BLOCK`] lines with a valid bit per line, as in a sectored cache: a 64 KiB DMA
//! costs 8 tag lookups instead of 128, which keeps a DMA-bound simulation about as fast as
//! without the L2. The price is that a block is allocated and evicted whole, so a pattern that
//! uses one line per block (rows of a tile a block or more apart) gets less capacity than the
//! configured size until the neighbouring lines are used too.
//!
//! Blocks are placed in `memory.l2_ways`-way sets. The set index XOR-folds every group of index
//! bits of the block number, so the blocks of an aligned run of `sets` blocks still map one to
//! one onto the sets (a contiguous buffer spreads evenly, as with plain modulo indexing) while
//! power-of-two strides, such as the rows of a matrix tile, spread over all sets instead of
//! piling into a few. Replacement is CLOCK (second chance): a reference bit per way and a hand
//! per set, which approximates LRU with O(1) bit operations besides the tag compare.
//!
//! Reads and writes both allocate; a read brings in whole lines, and [`L2::touch`] says how
//! many bytes of lines it fetched, which is what HBM moves for it. The cache is write-back
//! (`memory.l2_write_back`, as Ascend's is): a written line is dirty until its block is
//! evicted, and the bytes of the dirty lines an allocation evicts are what it writes back to
//! HBM ([`L2::take_written_back`]); written
//! through, every written byte goes to HBM at once and no line is dirty. Contents change when a
//! DMA starts, in global time order, so a read overlapping an earlier DMA that is still in
//! flight to the same line counts as a hit, as a miss-status register would merge it.

use crate::exec::Access;

/// Lines per tag (the valid bits of a block are a `u16`).
pub(crate) const LINES_PER_BLOCK: u64 = 16;

/// Most ways a set can have (the reference bits of a set are a `u32`).
pub(crate) const MAX_WAYS: usize = 32;

/// What a lookup reads of a set besides the full tags.
#[derive(Debug, Clone, Copy, Default)]
struct Set {
    /// One byte of each way's tag, eight ways to a word: a word is compared with a handful of
    /// integer operations, and only the ways whose byte matches need their full tag compared.
    partial: [u64; MAX_WAYS / 8],
    /// The reference bit of each way.
    refs: u32,
    /// The way the CLOCK hand points at.
    hand: u8,
    /// The ways holding a block of a kept range, which replacement passes over while the set
    /// has other ways.
    keep: u32,
}

const LOW_BITS: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The top bit of each byte of `word` that equals the matching byte of `pattern`.
fn equal_bytes(word: u64, pattern: u64) -> u64 {
    let x = word ^ pattern;
    // A byte's top bit ends up set exactly when all of its bits are zero: adding 0x7f to its
    // low seven bits carries into the top bit unless they are zero, and `| x` covers the top.
    !(((x & LOW_BITS) + LOW_BITS) | x | LOW_BITS)
}

/// The resident lines.
#[derive(Debug)]
pub(crate) struct L2 {
    line_shift: u32,
    block_shift: u32,
    set_bits: u32,
    ways: usize,
    /// Per word of [`Set::partial`], the top bit of each byte that is a way.
    way_bytes: [u64; MAX_WAYS / 8],
    sets: Vec<Set>,
    /// Per set, `ways` entries: block number + 1, or 0 for an empty way.
    tags: Vec<u64>,
    /// Per way, which lines of its block are resident.
    valid: Vec<u16>,
    /// Per way, which lines of its block are dirty (written and not yet in HBM).
    dirty: Vec<u16>,
    /// Whether writes stay in the cache until eviction.
    write_back: bool,
    /// Bytes of dirty lines evicted since [`L2::take_written_back`] last ran.
    written_back: u64,
    /// The kept bytes as disjoint ranges `(start, end)` of GM bytes in ascending order, so
    /// that a miss asks one predecessor by binary search (a few sections are kept at a time;
    /// a miss asks far more often than a launch changes them).
    kept: Vec<(u64, u64)>,
}

impl L2 {
    /// An empty cache of `bytes` (0: no cache, every lookup misses and nothing is kept). The
    /// configuration has checked that `bytes` is `line_bytes` x [`LINES_PER_BLOCK`] x `ways` x
    /// a power of two, `line_bytes` a power of two and `ways` 1..=32.
    pub(crate) fn new(bytes: u64, line_bytes: u64, ways: u64) -> L2 {
        let sets = bytes / (line_bytes * LINES_PER_BLOCK * ways);
        let line_shift = line_bytes.trailing_zeros();
        let mut way_bytes = [0; MAX_WAYS / 8];
        for way in 0..ways as usize {
            way_bytes[way / 8] |= 0x80 << (8 * (way % 8));
        }
        L2 {
            way_bytes,
            line_shift,
            block_shift: line_shift + LINES_PER_BLOCK.trailing_zeros(),
            set_bits: sets.max(1).trailing_zeros(),
            ways: ways as usize,
            sets: vec![Set::default(); sets as usize],
            tags: vec![0; (sets * ways) as usize],
            valid: vec![0; (sets * ways) as usize],
            dirty: vec![0; (sets * ways) as usize],
            write_back: false,
            written_back: 0,
            kept: Vec::new(),
        }
    }

    /// The cache with writes kept until eviction (`true`) or written through.
    pub(crate) fn with_write_back(mut self, on: bool) -> L2 {
        self.write_back = on;
        self
    }

    /// Whether a write stays in the cache (an enabled write-back cache).
    pub(crate) fn writes_back(&self) -> bool {
        self.write_back && self.enabled()
    }

    /// Bytes of dirty lines the lookups since the last call evicted (what they write back to
    /// HBM); resets the count.
    pub(crate) fn take_written_back(&mut self) -> u64 {
        std::mem::take(&mut self.written_back)
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.sets.is_empty()
    }

    /// Looks up every line the GM side of a DMA touches, in address order, allocating the ones
    /// that miss. Returns (bytes touched, bytes that hit, bytes of the lines a read brought in:
    /// a line is fetched whole, however few of its bytes the read wants; 0 without a cache).
    ///
    /// While the DMA stays in one block, the block keeps the answer of the DMA's first touch:
    /// a line the DMA itself brought in (bursts shorter than a line, back to back) was fetched
    /// from HBM once, so its later bytes do not hit.
    pub(crate) fn touch(&mut self, gm: &Access) -> (u64, u64, u64) {
        let touched = gm.count.saturating_mul(gm.burst);
        if !self.enabled() || touched == 0 {
            return (touched, 0, 0);
        }
        let mut hit = 0;
        let mut filled_lines = 0u64;
        // (block, its way, its valid bits before this DMA touched it)
        let mut current = (u64::MAX, 0, 0u16);
        for i in 0..gm.count {
            let start = gm.start.saturating_add(i.saturating_mul(gm.stride));
            let end = start.saturating_add(gm.burst);
            let mut block = start >> self.block_shift;
            let last_block = (end - 1) >> self.block_shift;
            loop {
                let base = block << self.block_shift;
                let lo = start.max(base);
                let hi = end.min((block + 1) << self.block_shift);
                let first = (lo - base) >> self.line_shift;
                let last = (hi - 1 - base) >> self.line_shift;
                let lines = bits(first as usize, last as usize + 1) as u16;
                if block != current.0 {
                    let (slot, before) = self.lookup(block);
                    current = (block, slot, before);
                }
                let hits = current.2 & lines;
                if hits == lines {
                    hit += hi - lo;
                } else if hits != 0 {
                    // Whole lines, less the parts of the first and last line outside the burst.
                    let line = 1 << self.line_shift;
                    let mut h = u64::from(hits.count_ones()) * line;
                    if hits & (1 << first) != 0 {
                        h -= lo - (base + first * line);
                    }
                    if hits & (1 << last) != 0 {
                        h -= base + (last + 1) * line - hi;
                    }
                    hit += h;
                }
                if !gm.write {
                    filled_lines += u64::from((lines & !self.valid[current.1]).count_ones());
                }
                self.valid[current.1] |= lines;
                if gm.write && self.write_back {
                    self.dirty[current.1] |= lines;
                }
                if block == last_block {
                    break;
                }
                block += 1;
            }
        }
        (touched, hit, filled_lines << self.line_shift)
    }

    fn set_of(&self, block: u64) -> usize {
        if self.set_bits == 0 {
            return 0;
        }
        let mut folded = 0;
        let mut rest = block;
        while rest != 0 {
            folded ^= rest;
            rest >>= self.set_bits;
        }
        (folded & ((1 << self.set_bits) - 1)) as usize
    }

    /// The byte of a block's tag kept in [`Set::partial`]: the seven bits just above the set
    /// index, which differ between the blocks of a contiguous buffer that share a set, and the
    /// top bit set, so that it never matches the zero byte of an empty way.
    fn partial_of(&self, block: u64) -> u8 {
        (block >> self.set_bits) as u8 | 0x80
    }

    /// The way holding `block` and its valid bits. A block not resident replaces the first way
    /// at or after the hand whose reference bit is clear, clearing the bits the hand passes
    /// (their second chance), and starts with no valid lines.
    fn lookup(&mut self, block: u64) -> (usize, u16) {
        let si = self.set_of(block);
        let ways = self.ways;
        let base = si * ways;
        if let Some(way) = self.find(si, block) {
            self.sets[si].refs |= 1 << way;
            return (base + way, self.valid[base + way]);
        }
        let partial = self.partial_of(block);
        let kept = self.is_kept(block);
        let set = &mut self.sets[si];
        let hand = usize::from(set.hand);
        // Ways of kept blocks are passed over while the set has others (GE's L2 page
        // reservation); a set whose every way is kept evicts among them all.
        let all = bits(0, ways);
        let mut open = all & !set.keep;
        if open == 0 {
            open = all;
        }
        let mut refs = set.refs;
        let free = !refs & open;
        let victim = if free == 0 {
            // Every open way was referenced: a full turn clears them and stops at the first
            // open way from the hand.
            refs &= !open;
            let ahead = open & !bits(0, hand);
            if ahead != 0 {
                ahead.trailing_zeros() as usize
            } else {
                open.trailing_zeros() as usize
            }
        } else {
            let ahead = free & !bits(0, hand);
            if ahead != 0 {
                ahead.trailing_zeros() as usize
            } else {
                free.trailing_zeros() as usize
            }
        };
        let passed = if victim >= hand {
            bits(hand, victim)
        } else {
            bits(hand, ways) | bits(0, victim)
        };
        set.refs = (refs & !passed) | (1 << victim);
        // Not `% ways`: a division by a run-time value would cost more than the rest.
        set.hand = if victim + 1 == ways {
            0
        } else {
            victim as u8 + 1
        };
        let shift = 8 * (victim % 8);
        let word = &mut set.partial[victim / 8];
        *word = (*word & !(0xff << shift)) | (u64::from(partial) << shift);
        if kept {
            set.keep |= 1 << victim;
        } else {
            set.keep &= !(1 << victim);
        }
        let slot = base + victim;
        self.written_back += u64::from(self.dirty[slot].count_ones()) << self.line_shift;
        self.tags[slot] = block + 1;
        self.valid[slot] = 0;
        self.dirty[slot] = 0;
        (slot, 0)
    }

    /// The way of set `si` holding `block`, if it is resident.
    fn find(&self, si: usize, block: u64) -> Option<usize> {
        let base = si * self.ways;
        let key = block + 1;
        let pattern = u64::from(self.partial_of(block)) * 0x0101_0101_0101_0101;
        let set = &self.sets[si];
        for (word, (&w, &present)) in set.partial.iter().zip(&self.way_bytes).enumerate() {
            let mut candidates = equal_bytes(w, pattern) & present;
            while candidates != 0 {
                let way = word * 8 + candidates.trailing_zeros() as usize / 8;
                if self.tags[base + way] == key {
                    return Some(way);
                }
                candidates &= candidates - 1;
            }
        }
        None
    }

    /// Whether any byte of `block` is kept.
    fn is_kept(&self, block: u64) -> bool {
        let start = block << self.block_shift;
        let end = start + (1 << self.block_shift);
        // The ranges are disjoint: only the last one starting before the block's end can
        // reach into it.
        let below = self.kept.partition_point(|&(s, _)| s < end);
        below > 0 && self.kept[below - 1].1 > start
    }

    /// Removes `[start, end)` from the kept ranges, keeping what lies outside it.
    fn release(&mut self, start: u64, end: u64) {
        self.kept = self
            .kept
            .iter()
            .flat_map(|&(s, e)| {
                if e <= start || s >= end {
                    return [Some((s, e)), None];
                }
                [
                    (s < start).then_some((s, start)),
                    (e > end).then_some((end, e)),
                ]
            })
            .flatten()
            .collect();
    }

    /// Keeps `[start, start + len)` in the cache until [`L2::drop_range`] releases it: the
    /// blocks of the range, resident now or allocated later, are evicted only from a set
    /// whose every way is kept (GE's `--buffer_optimize=l2_optimize` maps such a section to
    /// reserved L2 pages for the kernels between its producer and its last reader).
    pub(crate) fn keep_range(&mut self, start: u64, len: u64) {
        if !self.enabled() || len == 0 {
            return;
        }
        let end = start.saturating_add(len);
        // Merged with the kept ranges it overlaps or touches.
        let (mut lo, mut hi) = (start, end);
        self.kept.retain(|&(s, e)| {
            let joins = s <= end && e >= start;
            if joins {
                lo = lo.min(s);
                hi = hi.max(e);
            }
            !joins
        });
        let at = self.kept.partition_point(|&(s, _)| s < lo);
        self.kept.insert(at, (lo, hi));
        for block in (start >> self.block_shift)..=((end - 1) >> self.block_shift) {
            let si = self.set_of(block);
            if let Some(way) = self.find(si, block) {
                self.sets[si].keep |= 1 << way;
            }
        }
    }

    /// Forgets the data of `[start, start + len)` without writing it to HBM (the section is
    /// dead: GE's `L2_load_to_ddr = 0` for a value after its last reader). The lines wholly
    /// inside the range become invalid and clean, a block left with no line frees its way,
    /// and the keep on the range ends.
    pub(crate) fn drop_range(&mut self, start: u64, len: u64) {
        if !self.enabled() || len == 0 {
            return;
        }
        let end = start.saturating_add(len);
        self.release(start, end);
        let line = 1u64 << self.line_shift;
        for block in (start >> self.block_shift)..=((end - 1) >> self.block_shift) {
            let si = self.set_of(block);
            let Some(way) = self.find(si, block) else {
                continue;
            };
            let base = block << self.block_shift;
            // Lines wholly inside [start, end).
            let first = start.max(base).div_ceil(line) * line;
            let last = end.min(base + (1 << self.block_shift)) / line * line;
            if last <= first {
                continue;
            }
            let lines = bits(
                ((first - base) >> self.line_shift) as usize,
                ((last - base) >> self.line_shift) as usize,
            ) as u16;
            let slot = si * self.ways + way;
            self.valid[slot] &= !lines;
            self.dirty[slot] &= !lines;
            let kept = self.is_kept(block);
            let set = &mut self.sets[si];
            if self.valid[slot] == 0 {
                self.tags[slot] = 0;
                let shift = 8 * (way % 8);
                set.partial[way / 8] &= !(0xff << shift);
                set.refs &= !(1 << way);
                set.keep &= !(1 << way);
            } else if !kept {
                set.keep &= !(1 << way);
            }
        }
    }
}

/// Bits `lo..hi` set (`hi` <= 32).
fn bits(lo: usize, hi: usize) -> u32 {
    ((1u64 << hi) - (1u64 << lo)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stop::Buffer;

    impl L2 {
        /// [`L2::touch`] without the line fills.
        fn touch_hits(&mut self, gm: &Access) -> (u64, u64) {
            let (touched, hit, _) = self.touch(gm);
            (touched, hit)
        }
    }

    #[test]
    fn a_read_of_a_few_bytes_of_a_line_fetches_the_whole_line_once() {
        let mut l2 = L2::new(1 << 20, 512, 16);
        // 32 bytes of each of four lines 6272 bytes apart: four lines fetched.
        let column = Access {
            buffer: Buffer::Gm,
            start: 0,
            burst: 32,
            stride: 6272,
            count: 4,
            write: false,
        };
        assert_eq!(l2.touch(&column), (128, 0, 4 * 512));
        // The next 32 bytes of the same lines hit and fetch nothing.
        let next = Access {
            start: 32,
            ..column
        };
        assert_eq!(l2.touch(&next), (128, 128, 0));
        // Writes fetch nothing.
        let write = Access {
            start: 1 << 16,
            write: true,
            ..column
        };
        assert_eq!(l2.touch(&write).2, 0);
    }

    const BLOCK: u64 = 512 * LINES_PER_BLOCK;

    fn range(start: u64, len: u64) -> Access {
        Access {
            buffer: Buffer::Gm,
            start,
            burst: len,
            stride: len,
            count: 1,
            write: false,
        }
    }

    fn rows(start: u64, burst: u64, stride: u64, count: u64) -> Access {
        Access {
            buffer: Buffer::Gm,
            start,
            burst,
            stride,
            count,
            write: false,
        }
    }

    fn write(start: u64, len: u64) -> Access {
        Access {
            write: true,
            ..range(start, len)
        }
    }

    #[test]
    fn written_back_lines_are_counted_when_evicted_and_only_then() {
        // Two blocks of one way: the second evicts the first.
        let mut l2 = L2::new(BLOCK, 512, 1).with_write_back(true);
        l2.touch_hits(&write(0, 3 * 512));
        l2.touch_hits(&range(0, 512));
        assert_eq!(
            l2.take_written_back(),
            0,
            "a dirty line stays while resident"
        );
        l2.touch_hits(&range(BLOCK, 512));
        assert_eq!(l2.take_written_back(), 3 * 512, "three dirty lines go out");
        l2.touch_hits(&range(0, 512));
        assert_eq!(l2.take_written_back(), 0, "a clean block costs nothing");
        // Written through, nothing is ever dirty.
        let mut wt = L2::new(BLOCK, 512, 1);
        wt.touch_hits(&write(0, 3 * 512));
        wt.touch_hits(&range(BLOCK, 512));
        assert_eq!(wt.take_written_back(), 0);
    }

    #[test]
    fn a_second_read_of_a_small_buffer_hits_every_byte() {
        let mut l2 = L2::new(1 << 20, 512, 16);
        assert_eq!(l2.touch_hits(&range(1000, 300_000)), (300_000, 0));
        assert_eq!(l2.touch_hits(&range(1000, 300_000)), (300_000, 300_000));
        // Lines are the unit: the first range left lines 585..=587 (299_520..301_056)
        // resident, so the 1056 bytes of the new range in them hit and the rest is new.
        assert_eq!(l2.touch_hits(&range(300_000, 2048)), (2048, 1056));
    }

    #[test]
    fn partial_lines_at_both_ends_count_only_the_bytes_inside_the_burst() {
        let mut l2 = L2::new(1 << 20, 512, 16);
        // Lines 1, 2 and 3 of block 0.
        assert_eq!(l2.touch_hits(&range(512, 3 * 512)), (1536, 0));
        // 100 bytes before line 1 (miss), lines 1..=3 (hit), 200 bytes of line 4 (miss).
        assert_eq!(l2.touch_hits(&range(412, 100 + 1536 + 200)), (1836, 1536));
        // Within line 2 and into line 4 (now resident): all hits.
        assert_eq!(l2.touch_hits(&range(1100, 1000)), (1000, 1000));
    }

    #[test]
    fn short_bursts_in_one_line_share_the_first_answer() {
        let mut l2 = L2::new(1 << 20, 512, 16);
        // 64 bursts of 100 bytes back to back: 6400 bytes over 13 lines, none resident before.
        let short = rows(0, 100, 100, 64);
        assert_eq!(l2.touch_hits(&short), (6400, 0));
        assert_eq!(l2.touch_hits(&short), (6400, 6400));
    }

    #[test]
    fn a_cyclic_working_set_larger_than_the_cache_never_hits() {
        // 128 KiB cache, 256 KiB buffer read twice: each set sees its blocks in the same order,
        // more of them than it has ways, so every block is gone before it is read again.
        let mut l2 = L2::new(128 << 10, 512, 2);
        assert_eq!(l2.touch_hits(&range(0, 256 << 10)).1, 0);
        assert_eq!(l2.touch_hits(&range(0, 256 << 10)).1, 0);
    }

    #[test]
    fn a_power_of_two_stride_uses_every_set() {
        // 64 rows 1 MiB apart, one block each, in a cache of 32 sets of 2 ways: plain modulo
        // indexing would put them all in one set; folded indexing spreads them two per set,
        // so all 64 stay resident.
        let mut l2 = L2::new(64 * BLOCK, 512, 2);
        let column = rows(0, 512, 1 << 20, 64);
        assert_eq!(l2.touch_hits(&column), (32 << 10, 0));
        assert_eq!(l2.touch_hits(&column), (32 << 10, 32 << 10));
    }

    #[test]
    fn a_referenced_block_survives_one_sweep_of_the_hand() {
        // One set of 4 ways: blocks 0..4 fill it, block 1 is read again, then blocks 4 and 5
        // evict the unreferenced ones (the hand gives block 1 its second chance).
        let mut l2 = L2::new(4 * BLOCK, 512, 4);
        let read = |l2: &mut L2, b: u64| l2.touch_hits(&range(b * BLOCK, 512)).1 > 0;
        for b in 0..4 {
            assert!(!read(&mut l2, b));
        }
        // The fill left every reference bit set; a miss clears them all and evicts way 0.
        assert!(!read(&mut l2, 4));
        assert!(read(&mut l2, 1));
        assert!(!read(&mut l2, 5));
        assert!(
            read(&mut l2, 1),
            "block 1 was referenced, so the hand passed it"
        );
        assert!(!read(&mut l2, 2), "block 2 was not, so it was evicted");
    }

    #[test]
    fn an_evicted_block_loses_all_its_lines() {
        // One set of 1 way: reading block 1 evicts block 0 with both of its lines.
        let mut l2 = L2::new(BLOCK, 512, 1);
        l2.touch_hits(&range(0, 1024));
        l2.touch_hits(&range(BLOCK, 512));
        assert_eq!(l2.touch_hits(&range(0, 1024)), (1024, 0));
    }

    #[test]
    fn a_kept_block_outlives_streaming_data_until_it_is_dropped() {
        // One set of 2 ways: block 0 is kept, blocks 1.. stream through the other way.
        let mut l2 = L2::new(2 * BLOCK, 512, 2).with_write_back(true);
        l2.keep_range(0, BLOCK);
        l2.touch_hits(&write(0, BLOCK));
        for b in 1..6 {
            l2.touch_hits(&range(b * BLOCK, 512));
        }
        assert_eq!(
            l2.touch_hits(&range(0, BLOCK)),
            (BLOCK, BLOCK),
            "still resident"
        );
        assert_eq!(l2.take_written_back(), 0, "and never written back");
        // Without the keep, the same stream evicts it (and writes its dirty lines back).
        let mut plain = L2::new(2 * BLOCK, 512, 2).with_write_back(true);
        plain.touch_hits(&write(0, BLOCK));
        for b in 1..6 {
            plain.touch_hits(&range(b * BLOCK, 512));
        }
        assert_eq!(plain.touch_hits(&range(0, BLOCK)).1, 0);
        assert_eq!(plain.take_written_back(), BLOCK);
        // Dropped, its lines are gone without a write-back and its way is free again.
        l2.drop_range(0, BLOCK);
        assert_eq!(l2.take_written_back(), 0);
        assert_eq!(l2.touch_hits(&range(0, 512)).1, 0);
        assert!(l2.kept.is_empty());
    }

    #[test]
    fn kept_ranges_are_the_bytes_kept_and_not_dropped() {
        let mut next = crate::testing::draws_below(5);
        for _ in 0..100 {
            let mut l2 = L2::new(1 << 20, 512, 16);
            let mut model = vec![false; 3000];
            for _ in 0..20 {
                let (start, len) = (u64::from(next(2500)), u64::from(next(400)));
                let keep = next(2) == 0;
                if keep {
                    l2.keep_range(start, len);
                } else {
                    l2.drop_range(start, len);
                }
                model[start as usize..(start + len) as usize].fill(keep);
                // Disjoint, ascending, not touching, and exactly the kept bytes.
                let mut bytes = vec![false; 3000];
                for pair in l2.kept.windows(2) {
                    assert!(pair[0].1 < pair[1].0, "{:?}", l2.kept);
                }
                for &(s, e) in &l2.kept {
                    assert!(s < e);
                    bytes[s as usize..e as usize].fill(true);
                }
                assert_eq!(bytes, model);
            }
        }
    }

    #[test]
    fn kept_ranges_merge_and_a_drop_releases_only_its_bytes() {
        let mut l2 = L2::new(1 << 20, 512, 16);
        l2.keep_range(0, 1000);
        l2.keep_range(1000, 1000);
        l2.keep_range(5000, 100);
        assert_eq!(
            l2.kept.iter().map(|(s, e)| (*s, *e)).collect::<Vec<_>>(),
            [(0, 2000), (5000, 5100)]
        );
        l2.drop_range(500, 4550);
        assert_eq!(
            l2.kept.iter().map(|(s, e)| (*s, *e)).collect::<Vec<_>>(),
            [(0, 500), (5050, 5100)]
        );
        assert!(l2.is_kept(0) && !l2.is_kept(1));
    }

    #[test]
    fn a_set_of_kept_ways_still_takes_new_blocks() {
        // One way, kept: a new block must evict it (the fallback), with its write-back.
        let mut l2 = L2::new(BLOCK, 512, 1).with_write_back(true);
        l2.keep_range(0, BLOCK);
        l2.touch_hits(&write(0, 512));
        l2.touch_hits(&range(BLOCK, 512));
        assert_eq!(l2.take_written_back(), 512);
        assert_eq!(l2.touch_hits(&range(BLOCK, 512)).1, 512);
    }

    #[test]
    fn a_drop_clears_only_the_lines_wholly_inside_its_range() {
        let mut l2 = L2::new(1 << 20, 512, 16).with_write_back(true);
        l2.touch_hits(&write(0, 4 * 512));
        // Bytes 100..1124: line 1 (512..1024) is wholly inside, lines 0 and 2 are not.
        l2.drop_range(100, 1024);
        assert_eq!(l2.touch_hits(&range(0, 512)).1, 512);
        assert_eq!(l2.touch_hits(&range(512, 512)).1, 0);
        assert_eq!(l2.touch_hits(&range(1024, 1024)).1, 1024);
        // A range already kept by a block resident before the keep is marked too.
        let mut l2 = L2::new(2 * BLOCK, 512, 2);
        l2.touch_hits(&range(0, 512));
        l2.keep_range(0, 512);
        for b in 1..6 {
            l2.touch_hits(&range(b * BLOCK, 512));
        }
        assert_eq!(l2.touch_hits(&range(0, 512)).1, 512);
    }

    #[test]
    fn equal_bytes_marks_exactly_the_equal_bytes() {
        let word = 0x00ff_7f80_0001_4141;
        assert_eq!(
            equal_bytes(word, 0x4141_4141_4141_4141),
            0x0000_0000_0000_8080
        );
        assert_eq!(equal_bytes(word, 0), 0x8000_0000_8000_0000);
        assert_eq!(
            equal_bytes(word, 0x8080_8080_8080_8080),
            0x0000_0080_0000_0000
        );
        assert_eq!(
            equal_bytes(word, 0x7f7f_7f7f_7f7f_7f7f),
            0x0000_8000_0000_0000
        );
        assert_eq!(equal_bytes(word, u64::MAX), 0x0080_0000_0000_0000);
    }

    #[test]
    fn size_zero_is_no_cache() {
        let mut l2 = L2::new(0, 512, 16);
        assert!(!l2.enabled());
        assert_eq!(l2.touch_hits(&range(0, 4096)), (4096, 0));
        assert_eq!(l2.touch_hits(&range(0, 4096)), (4096, 0));
    }
}
