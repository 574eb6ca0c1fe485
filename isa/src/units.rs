//! The AI core's data units and the limits of the instruction fields that count them, declared
//! once for the simulator, the firmware and the compiler.
//!
//! Sizes of the data layout (block, repeat, fractal) are facts of the architecture and written
//! here as numbers. Field limits (burst count, burst length, gaps, repeat, strides) are not
//! restated: each is computed from the width the table in `table.rs` declares for its field, so
//! widening a field in the table moves the limit everywhere.

use crate::spec::{Format, field_max};
use crate::table::{
    Dma, DmaPad, Flag, Img2col, VBin, VCmp, VConv, VDup, VGather, VReduce, VScalar, VSel, VUn,
};

/// Bytes in one block: the unit of DMA lengths and gaps and of vector block strides, and the
/// alignment of every local-buffer operand.
pub const BLOCK_BYTES: u64 = 32;
/// Bytes one vector repeat processes (of the widest operand type).
pub const REPEAT_BYTES: u64 = 256;
/// Blocks in one repeat: `blk = 1, rep = 8` is contiguous.
pub const BLOCKS_PER_REPEAT: u64 = REPEAT_BYTES / BLOCK_BYTES;
/// Rows of a cube fractal.
pub const FRACTAL_ROWS: u64 = 16;
/// Columns of a cube fractal, and C0: the channels of one C1 slice of the 5HD (NC1HWC0) layout.
pub const C0: u64 = 16;
/// Elements of one fractal.
pub const FRACTAL_ELEMS: u64 = FRACTAL_ROWS * C0;
/// Bytes of one f16 fractal (L1, L0A, L0B).
pub const FRACTAL_BYTES: u64 = FRACTAL_ELEMS * 2;
/// Bytes of one f32 fractal (L0C).
pub const FRACTAL_BYTES_F32: u64 = FRACTAL_ELEMS * 4;
/// Bytes of one row of an f32 fractal: what `broadcast_ub_to_l0c` copies into every row of a
/// channel block's fractals.
pub const FRACTAL_ROW_BYTES_F32: u64 = C0 * 4;
/// Bits of one mask register; `set_mask` takes two (`hi`, `lo`).
pub const MASK_WORD_BITS: u64 = 64;
/// Bits of the normal-mode vector mask: one per element of a repeat of the narrowest type.
pub const MASK_BITS: u64 = 2 * MASK_WORD_BITS;

/// Most bursts of one DMA (`nburst`).
pub const BURST_COUNT_MAX: u64 = field_max(Dma::FIELDS, "nburst");
/// Longest burst of a block DMA, in blocks (`len`).
pub const BURST_LEN_MAX: u64 = field_max(Dma::FIELDS, "len");
/// Largest gap between the bursts of a block DMA, in blocks (`src_gap`, `dst_gap`).
pub const BURST_GAP_MAX: u64 = field_max(Dma::FIELDS, "src_gap");
/// Longest burst of a byte-granular DMA, in bytes (`len` of the `_pad` copies).
pub const PAD_BURST_LEN_MAX: u64 = field_max(DmaPad::FIELDS, "len");
/// Largest gap of a byte-granular DMA, in bytes.
pub const PAD_GAP_MAX: u64 = field_max(DmaPad::FIELDS, "src_gap");
/// Most repeats of one vector instruction.
pub const REPEAT_MAX: u64 = field_max(VBin::FIELDS, "repeat");
/// Largest block stride of a vector operand, in blocks.
pub const BLOCK_STRIDE_MAX: u64 = field_max(VBin::FIELDS, "dst_blk");
/// Largest repeat stride of a vector operand, in blocks.
pub const REPEAT_STRIDE_MAX: u64 = field_max(VBin::FIELDS, "dst_rep");
/// Largest flag id of `set_flag` / `wait_flag`.
pub const FLAG_ID_MAX: u64 = field_max(Flag::FIELDS, "id");
/// Largest img2col window stride or dilation.
pub const IMG2COL_STRIDE_MAX: u64 = field_max(Img2col::FIELDS, "stride_h");

// Each limit holds for every format that has the field, or it would not be one limit.
const _: () = {
    assert!(field_max(DmaPad::FIELDS, "nburst") == BURST_COUNT_MAX);
    assert!(field_max(Dma::FIELDS, "dst_gap") == BURST_GAP_MAX);
    assert!(field_max(DmaPad::FIELDS, "dst_gap") == PAD_GAP_MAX);
    assert!(field_max(Img2col::FIELDS, "dil_w") == IMG2COL_STRIDE_MAX);
    let repeats = [
        field_max(VUn::FIELDS, "repeat"),
        field_max(VScalar::FIELDS, "repeat"),
        field_max(VDup::FIELDS, "repeat"),
        field_max(VConv::FIELDS, "repeat"),
        field_max(VCmp::FIELDS, "repeat"),
        field_max(VSel::FIELDS, "repeat"),
        field_max(VGather::FIELDS, "repeat"),
        field_max(VReduce::FIELDS, "repeat"),
    ];
    let mut i = 0;
    while i < repeats.len() {
        assert!(repeats[i] == REPEAT_MAX);
        i += 1;
    }
    assert!(field_max(VUn::FIELDS, "src_blk") == BLOCK_STRIDE_MAX);
    assert!(field_max(VUn::FIELDS, "src_rep") == REPEAT_STRIDE_MAX);
    assert!(FRACTAL_BYTES == 512 && BLOCKS_PER_REPEAT == 8);
};
