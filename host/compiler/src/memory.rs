//! Memory primitives the back end plans with (the plan itself is made in `emit.rs`):
//!
//! - **Weights**: constants stored once, deduplicated by content, so every branch shares them.
//! - **Placement by live interval**: a tensor's block is free again after its last reader and
//!   reused first-fit by later tensors. Blocks are only reused within one graph (GE's
//!   `_batch_label` rule) and every branch is placed from the same base, so the feature-map
//!   region is the largest branch's size — the max over gears, not the sum.
//! - **Compile-time inputs**: a constant read only as an operator's compile-time parameter
//!   (Reshape's shape, a reduction's axes) is never stored.
//! - **L2 control** (atc's `--buffer_optimize=l2_optimize`, its default): every launch tells
//!   the L2 which feature-map sections to keep resident from their producer to their last
//!   reader (within a budget of L2 bytes, chosen greedily in producer order) and which to forget
//!   without a write-back after their last reader.

use std::collections::BTreeMap;

use super::infer::Registry;
use super::ir::{Graph, NodeId, Tensor};
use super::options::OptionError;

/// Alignment of every block.
pub const ALIGN: u64 = 512;

fn aligned(b: u64) -> u64 {
    b.max(1).div_ceil(ALIGN) * ALIGN
}

/// A constant's place in the weight region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightRef {
    /// Offset in the weight region.
    pub offset: u64,
    /// Size in bytes.
    pub bytes: u64,
}

/// The weight region: constants stored once, deduplicated by content.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    /// The region's bytes (the `.om` WEIGHTS section).
    pub data: Vec<u8>,
    index: BTreeMap<u64, Vec<(u64, u64)>>,
}

impl Weights {
    /// Adds a constant (or finds an identical one) and returns where it is.
    pub fn add(&mut self, t: &Tensor) -> WeightRef {
        let bytes = t.data.len() as u64;
        let key = gearsim_isa::checksum::checksum(&t.data);
        if let Some(hits) = self.index.get(&key) {
            for &(off, len) in hits {
                if len == bytes && self.data[off as usize..(off + len) as usize] == t.data[..] {
                    return WeightRef { offset: off, bytes };
                }
            }
        }
        let offset = self.data.len() as u64;
        self.data.extend_from_slice(&t.data);
        self.data
            .resize(aligned(self.data.len() as u64) as usize, 0);
        self.index.entry(key).or_default().push((offset, bytes));
        WeightRef { offset, bytes }
    }

    /// Size of the region.
    pub fn bytes(&self) -> u64 {
        self.data.len() as u64
    }
}

/// Whether every consumer of `id`'s output reads it through a compile-time input (an
/// operator's [`OpDef::static_inputs`](super::infer::OpDef::static_inputs)): such a constant
/// becomes a kernel parameter and is never stored. A constant nobody reads is not stored either.
pub fn only_static_uses(graph: &Graph, id: NodeId, registry: &Registry) -> bool {
    graph.nodes.iter().all(|n| {
        n.inputs.iter().enumerate().all(|(k, v)| {
            v.is_none_or(|v| v.node != id)
                || registry
                    .get(&n.op)
                    .is_some_and(|d| d.static_inputs.contains(&k))
        })
    })
}

/// A block to place: live from node index `first` to node index `last` (inclusive), `bytes`
/// long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// First node that needs it (its producer).
    pub first: usize,
    /// Last node that reads it.
    pub last: usize,
    /// Size in bytes (rounded up to [`ALIGN`] when placed).
    pub bytes: u64,
}

/// First-fit placement of blocks by live interval: blocks are placed in order of `first` (ties
/// in the given order); a block is free again for blocks whose `first` is after its `last`.
/// Returns each block's offset and the region's size. Two blocks live at the same node never
/// overlap.
pub fn place(blocks: &[Interval]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| blocks[i].first);
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    let mut top = 0u64;
    let mut live: Vec<(usize, u64, u64)> = Vec::new(); // (last, offset, size)
    let mut offsets = vec![0u64; blocks.len()];
    for i in order {
        let b = blocks[i];
        live.retain(|&(last, off, size)| {
            if last < b.first {
                release(&mut free, off, size);
                false
            } else {
                true
            }
        });
        let size = aligned(b.bytes);
        let off = take(&mut free, &mut top, size);
        live.push((b.last.max(b.first), off, size));
        offsets[i] = off;
    }
    (offsets, top)
}

fn take(free: &mut BTreeMap<u64, u64>, top: &mut u64, size: u64) -> u64 {
    let hit = free
        .iter()
        .find(|(_, s)| **s >= size)
        .map(|(o, s)| (*o, *s));
    match hit {
        Some((off, s)) => {
            free.remove(&off);
            if s > size {
                free.insert(off + size, s - size);
            }
            off
        }
        None => {
            // Grow into the top, starting inside a free block that ends at the top.
            let start = match free.iter().next_back() {
                Some((&o, &s)) if o + s == *top => {
                    free.remove(&o);
                    o
                }
                _ => *top,
            };
            *top = start + size;
            start
        }
    }
}

/// atc's `--buffer_optimize`: whether launches carry L2 control sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferOptimize {
    /// `l2_optimize` (atc's default): feature maps kept in L2 between their producer and last
    /// reader within a budget, and forgotten without a write-back once dead.
    #[default]
    L2Optimize,
    /// `off_optimize`: no L2 control; the L2 is a plain cache.
    OffOptimize,
}

impl BufferOptimize {
    /// atc's spelling.
    pub fn name(self) -> &'static str {
        match self {
            BufferOptimize::L2Optimize => "l2_optimize",
            BufferOptimize::OffOptimize => "off_optimize",
        }
    }

    /// Parses atc's spelling (`l1_optimize`, L1 fusion, is not modelled and says so).
    pub fn parse(s: &str) -> Result<BufferOptimize, OptionError> {
        match s {
            "l2_optimize" => Ok(BufferOptimize::L2Optimize),
            "off_optimize" => Ok(BufferOptimize::OffOptimize),
            "l1_optimize" => Err(OptionError::new(
                "E10001",
                "Value l1_optimize for parameter --buffer_optimize is invalid. Reason: gearsim \
                 does not model L1 fusion; use l2_optimize (the default) or off_optimize.",
            )),
            _ => Err(OptionError::new(
                "E10001",
                format!(
                    "Value {s} for parameter --buffer_optimize is invalid. Reason: The current \
                     value is not within the valid range (l2_optimize, l1_optimize, \
                     off_optimize)."
                ),
            )),
        }
    }
}

/// Share of the L2 that kept sections may fill at once; the rest stays a cache for weights and
/// the sections not kept. An assumption: GE's page budget is not public.
pub const L2_KEEP_SHARE: (u64, u64) = (1, 2);

/// Which blocks to keep in L2 from producer to last reader: greedily in order of `first`
/// (ties in the given order), a block is kept when the kept blocks live at each of its nodes
/// leave room for it in `budget` bytes.
pub fn l2_keeps(blocks: &[Interval], budget: u64) -> Vec<bool> {
    let nodes = blocks.iter().map(|b| b.last + 1).max().unwrap_or(0);
    let mut used = vec![0u64; nodes];
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| blocks[i].first);
    let mut keep = vec![false; blocks.len()];
    for i in order {
        let b = blocks[i];
        if b.bytes == 0 || b.last < b.first {
            continue;
        }
        let span = &mut used[b.first..=b.last];
        if span.iter().all(|&u| u + b.bytes <= budget) {
            span.iter_mut().for_each(|u| *u += b.bytes);
            keep[i] = true;
        }
    }
    keep
}

fn release(free: &mut BTreeMap<u64, u64>, off: u64, size: u64) {
    let (mut start, mut len) = (off, size);
    if let Some((&p, &ps)) = free.range(..off).next_back()
        && p + ps == off
    {
        free.remove(&p);
        start = p;
        len += ps;
    }
    if let Some(ns) = free.remove(&(off + size)) {
        len += ns;
    }
    free.insert(start, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_blocks_never_exceed_the_budget_at_any_node() {
        let iv = |first, last, bytes| Interval { first, last, bytes };
        // 0..=2 (600) fits; 1..=1 (500) would make 1100 at node 1; 2..=3 (400) makes 1000 at
        // node 2; 3..=4 (700) would make 1100 at node 3; 4..=4 (700) fits after 2..=3 ends.
        let blocks = [
            iv(0, 2, 600),
            iv(1, 1, 500),
            iv(2, 3, 400),
            iv(3, 4, 700),
            iv(4, 4, 600),
        ];
        assert_eq!(l2_keeps(&blocks, 1000), [true, false, true, false, true]);
        assert_eq!(l2_keeps(&blocks, 0), [false; 5]);
    }

    #[test]
    fn buffer_optimize_takes_atcs_spellings() {
        assert_eq!(
            BufferOptimize::parse("l2_optimize").unwrap(),
            BufferOptimize::L2Optimize
        );
        assert_eq!(
            BufferOptimize::parse("off_optimize").unwrap(),
            BufferOptimize::OffOptimize
        );
        for bad in ["l1_optimize", "L2_optimize", ""] {
            assert_eq!(
                BufferOptimize::parse(bad).unwrap_err().code,
                "E10001",
                "{bad}"
            );
        }
    }

    #[test]
    fn placed_blocks_never_overlap_while_both_are_live() {
        let blocks = [
            Interval {
                first: 0,
                last: 3,
                bytes: 1000,
            },
            Interval {
                first: 1,
                last: 1,
                bytes: 600,
            },
            Interval {
                first: 2,
                last: 4,
                bytes: 512,
            },
            Interval {
                first: 2,
                last: 2,
                bytes: 100,
            },
            Interval {
                first: 4,
                last: 5,
                bytes: 2000,
            },
        ];
        let (off, total) = place(&blocks);
        for i in 0..blocks.len() {
            for j in 0..i {
                let (a, b) = (blocks[i], blocks[j]);
                let live_together = a.first <= b.last && b.first <= a.last;
                let overlap =
                    off[i] < off[j] + aligned(b.bytes) && off[j] < off[i] + aligned(a.bytes);
                assert!(!(live_together && overlap), "blocks {i} and {j} overlap");
                assert!(off[i] + aligned(a.bytes) <= total);
            }
        }
        // Block 1 (dead after node 1) is reused by block 2 or 3 at node 2.
        assert!(total < blocks.iter().map(|b| aligned(b.bytes)).sum::<u64>());
    }

    #[test]
    fn weights_are_stored_once() {
        let mut w = Weights::default();
        let t = Tensor::from_f32s(vec![3], &[1.0, 2.0, 3.0]);
        let a = w.add(&t);
        let b = w.add(&t.clone());
        let c = w.add(&Tensor::from_f32s(vec![3], &[1.0, 2.0, 4.0]));
        assert_eq!(a, b);
        assert_ne!(a.offset, c.offset);
        assert_eq!(w.bytes(), 2 * ALIGN);
    }
}
