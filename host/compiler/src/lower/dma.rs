//! One GM <-> UB transfer as the MTE runs it: `n` rows of `len` bytes, the GM rows `gm_gap`
//! bytes apart and the UB rows `ub_gap` bytes apart after each row rounded up to 32 bytes.
//! Whole 32-byte blocks with block gaps (`copy_gm_to_ub` / `copy_ub_to_gm`) when every length
//! and gap allows, byte-granular (`copy_*_pad`) otherwise. Every lowering's DMA planner ends
//! here, so that choice is written once; splitting at the burst-count limit and addressing
//! stay with the planners, whose registers differ.

use gearsim_isa::units::{BLOCK_BYTES, BURST_GAP_MAX, BURST_LEN_MAX};

use super::writer::{Asm, Reg};

/// Which way a UB copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// GM to UB (`copy_gm_to_ub`, MTE2).
    GmToUb,
    /// UB to GM (`copy_ub_to_gm`, MTE3).
    UbToGm,
}

/// `n` rows of `len` bytes between `ub` and `gm` in direction `dir` (see the module doc);
/// `ub_gap` counts from each row's end rounded up to 32 bytes.
#[allow(clippy::too_many_arguments)]
pub fn rows(a: &mut Asm, dir: Dir, ub: Reg, gm: Reg, n: u64, len: u64, gm_gap: u64, ub_gap: u64) {
    let (dst, src, src_gap, dst_gap) = match dir {
        Dir::GmToUb => (ub, gm, gm_gap, ub_gap),
        Dir::UbToGm => (gm, ub, ub_gap, gm_gap),
    };
    let blocks = len.is_multiple_of(BLOCK_BYTES)
        && gm_gap.is_multiple_of(BLOCK_BYTES)
        && len / BLOCK_BYTES <= BURST_LEN_MAX
        && gm_gap / BLOCK_BYTES <= BURST_GAP_MAX
        && ub_gap / BLOCK_BYTES <= BURST_GAP_MAX;
    if blocks {
        let (len, src_gap, dst_gap) = (
            len / BLOCK_BYTES,
            src_gap / BLOCK_BYTES,
            dst_gap / BLOCK_BYTES,
        );
        match dir {
            Dir::GmToUb => a.copy_gm_to_ub(dst, src, n, len),
            Dir::UbToGm => a.copy_ub_to_gm(dst, src, n, len),
        }
        .src_gap(src_gap)
        .dst_gap(dst_gap);
    } else {
        match dir {
            Dir::GmToUb => a.copy_gm_to_ub_pad(dst, src, n, len),
            Dir::UbToGm => a.copy_ub_to_gm_pad(dst, src, n, len),
        }
        .src_gap(src_gap)
        .dst_gap(dst_gap);
    }
}
