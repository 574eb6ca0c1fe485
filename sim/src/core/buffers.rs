//! An AI core's local buffers (UB, L1, L0A, L0B, L0C, BT, FB): their values ([`Buffers`], kept
//! with the chip's deferred functional work) and, for timing-only runs, which of their 32-byte
//! blocks hold values that were not computed ([`Unknown`], kept by the core's timeline).

use crate::config::ChipConfig;
use crate::kind::CoreKind;
use crate::stop::Buffer;

/// Unknown values are tracked per block.
const GRAIN: u64 = gearsim_isa::units::BLOCK_BYTES;

/// Bytes of local memory of all the AI cores of a chip (every core's UB, L1, L0A/B/C, BT and
/// FB that its kind has).
pub fn local_buffer_bytes(cfg: &ChipConfig) -> u64 {
    cfg.core_slots()
        .iter()
        .map(|slot| sizes(cfg, slot.kind).iter().sum::<u64>())
        .sum()
}

/// The values in the local memories of one core.
#[derive(Debug, Clone)]
pub(crate) struct Buffers {
    mem: [Vec<u8>; 7],
}

/// Which blocks of one core's local memories hold uncomputed values, and the memories' sizes.
#[derive(Debug)]
pub(crate) struct Unknown {
    sizes: [u64; 7],
    bits: [Vec<u64>; 7],
}

/// The sizes of the local memories of a core of `kind` (a missing memory has size 0): a
/// separated chip's cube core has no UB and its vector cores have only a UB.
fn sizes(cfg: &ChipConfig, kind: CoreKind) -> [u64; 7] {
    let c = &cfg.core;
    let size = |b: Buffer, bytes: u64| if kind.has_buffer(b) { bytes } else { 0 };
    [
        size(Buffer::Ub, c.ub_bytes),
        size(Buffer::L1, c.l1_bytes),
        size(Buffer::L0a, c.l0a_bytes),
        size(Buffer::L0b, c.l0b_bytes),
        size(Buffer::L0c, c.l0c_bytes),
        size(Buffer::Bt, c.bt_bytes),
        size(Buffer::Fb, c.fb_bytes),
    ]
}

fn slot(b: Buffer) -> usize {
    match b {
        Buffer::Ub => 0,
        Buffer::L1 => 1,
        Buffer::L0a => 2,
        Buffer::L0b => 3,
        Buffer::L0c => 4,
        Buffer::Bt => 5,
        Buffer::Fb => 6,
        // GM is not a local buffer; callers route GM to device memory first.
        Buffer::Gm => usize::MAX,
    }
}

impl Buffers {
    /// The zeroed buffers of a core of `kind`.
    pub(crate) fn new(cfg: &ChipConfig, kind: CoreKind) -> Buffers {
        Buffers {
            mem: sizes(cfg, kind).map(|s| vec![0u8; s as usize]),
        }
    }

    pub(crate) fn get(&self, b: Buffer) -> &[u8] {
        &self.mem[slot(b)]
    }

    pub(crate) fn get_mut(&mut self, b: Buffer) -> &mut [u8] {
        &mut self.mem[slot(b)]
    }

    pub(crate) fn ub_mut(&mut self) -> &mut [u8] {
        &mut self.mem[0]
    }

    /// Two different buffers, the first shared and the second mutable.
    pub(crate) fn pair_mut(&mut self, a: Buffer, b: Buffer) -> (&[u8], &mut [u8]) {
        let (ia, ib) = (slot(a), slot(b));
        debug_assert_ne!(ia, ib);
        if ia < ib {
            let (lo, hi) = self.mem.split_at_mut(ib);
            (&lo[ia], &mut hi[0])
        } else {
            let (lo, hi) = self.mem.split_at_mut(ia);
            (&hi[0], &mut lo[ib])
        }
    }

    /// Three different buffers, the first two shared and the third mutable.
    pub(crate) fn two_and_mut(
        &mut self,
        a: Buffer,
        b: Buffer,
        c: Buffer,
    ) -> (&[u8], &[u8], &mut [u8]) {
        let [a, b, c] = self
            .mem
            .get_disjoint_mut([slot(a), slot(b), slot(c)])
            .expect("three different buffers");
        let (a, b): (&Vec<u8>, &Vec<u8>) = (a, b);
        (a, b, c)
    }
}

impl Unknown {
    /// A core of `kind` whose buffers hold only computed values.
    pub(crate) fn new(cfg: &ChipConfig, kind: CoreKind) -> Unknown {
        let sizes = sizes(cfg, kind);
        Unknown {
            sizes,
            bits: sizes.map(|s| vec![0u64; (s / GRAIN).div_ceil(64) as usize]),
        }
    }

    /// The size of buffer `b` in bytes.
    pub(crate) fn size(&self, b: Buffer) -> u64 {
        self.sizes[slot(b)]
    }

    /// Marks `[start, end)` of `b` as holding uncomputed (`true`) or real (`false`) values.
    /// Marking unknown is conservative (whole 32-byte grains); marking known only clears grains
    /// that the range covers completely.
    pub(crate) fn mark(&mut self, b: Buffer, start: u64, end: u64, unknown: bool) {
        let bits = &mut self.bits[slot(b)];
        let (first, last) = if unknown {
            (start / GRAIN, end.div_ceil(GRAIN))
        } else {
            (start.div_ceil(GRAIN), end / GRAIN)
        };
        // A word at a time: the grains [first, last) that fall in word w.
        let mut g = first;
        while g < last {
            let (w, bit) = ((g / 64) as usize, g % 64);
            let n = (64 - bit).min(last - g);
            let word = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            if unknown {
                bits[w] |= word;
            } else {
                bits[w] &= !word;
            }
            g += n;
        }
    }

    /// Whether any byte of `[start, end)` of `b` holds an uncomputed value.
    pub(crate) fn is_unknown(&self, b: Buffer, start: u64, end: u64) -> bool {
        let bits = &self.bits[slot(b)];
        (start / GRAIN..end.div_ceil(GRAIN)).any(|g| bits[(g / 64) as usize] >> (g % 64) & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::{GRAIN, Unknown};
    use crate::config::ChipConfig;
    use crate::stop::Buffer;

    /// `mark` a word at a time sets exactly the grains a grain-by-grain reference sets.
    #[test]
    fn marking_sets_and_clears_exactly_the_covered_grains() {
        let cfg = ChipConfig::preset("ascend910").unwrap();
        let mut b = Unknown::new(&cfg, crate::CoreKind::Coupled);
        let grains = b.size(Buffer::Ub) / GRAIN;
        let mut want = vec![false; grains as usize];
        let mut x = 12345u64;
        for step in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let start = (x >> 20) % b.size(Buffer::Ub);
            let len = (x >> 44) % 9000;
            let end = (start + len).min(b.size(Buffer::Ub));
            let unknown = step % 3 != 0;
            b.mark(Buffer::Ub, start, end, unknown);
            let (first, last) = if unknown {
                (start / GRAIN, end.div_ceil(GRAIN))
            } else {
                (start.div_ceil(GRAIN), end / GRAIN)
            };
            for g in first..last {
                want[g as usize] = unknown;
            }
            for (g, w) in want.iter().enumerate() {
                let at = g as u64 * GRAIN;
                assert_eq!(
                    b.is_unknown(Buffer::Ub, at, at + 1),
                    *w,
                    "step {step} grain {g}"
                );
            }
        }
    }
}
