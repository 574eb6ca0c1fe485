//! The instruction table: every operand layout and every instruction, declared exactly once.
//!
//! Field syntax inside a format: `name: Type`, optionally `[bits]` for a width narrower than the
//! type's, optionally `= default` to make the operand keyed and optional in assembly text
//! (`repeat=8`), and `#[suffix]` to spell it after the mnemonic (`vadd.f16`).
//!
//! Instruction syntax: `Variant = opcode, mnemonic, pipe, timing class, Format, [types];`
//! where the optional type list restricts the format's `ty` field. The mnemonic is written as
//! an identifier because it is also the name of the instruction's typed builder method
//! (`ProgramBuilder::vadd`); the keyword `loop` is written `r#loop` and spelled `loop` in text.
//!
//! Conventions shared by all vector formats: one *repeat* processes 256 bytes of the widest
//! operand type in 8 *blocks*; `*_blk` is the distance between the blocks of one repeat and
//! `*_rep` the distance between repeats, both counted in blocks of that operand (a block is
//! 32 bytes for the widest type, narrower for the narrow side of a conversion). `blk=1, rep=8`
//! is contiguous. The mask register selects elements within each repeat (see `set_mask`).

use crate::operand::{
    Cmp, CrossFlagId, CrossMode, DType, Pipe, Quant, ReduceOp, Reg, Round, SReg, SType, Space,
    Target,
};
use crate::spec::{formats, instructions};

formats! {
    /// `dst = a op b`.
    Rrr { dst: Reg, a: Reg, b: Reg }
    /// `dst = a op imm` (imm sign-extended to 64 bits).
    Rri { dst: Reg, a: Reg, imm: i32 }
    /// `dst = imm`.
    Ri { dst: Reg, imm: i64 }
    /// `dst = op src`.
    Rr { dst: Reg, src: Reg }
    /// `dst = special register`.
    ReadSReg { dst: Reg, which: SReg }
    /// Conditional branch comparing two registers.
    Branch { a: Reg, b: Reg, target: Target }
    /// Unconditional jump.
    Jump { target: Target }
    /// Decrement `counter`; branch to `target` while it is not zero.
    Loop { counter: Reg, target: Target }
    /// Scalar load or store at `base + off` in the given memory space.
    Mem { #[suffix] space: Space, #[suffix] width: SType, reg: Reg, base: Reg, off: i32 = 0 }
    /// Normal-mode vector mask from two registers (bit i of `lo` enables element i).
    MaskNorm { hi: Reg, lo: Reg }
    /// Counter-mode vector mask: the next vector instructions process `count` elements.
    MaskCount { count: Reg }
    /// Feature-map geometry used by `img2col_l0a` (one image, C0 = 16 channels per C1 slice).
    FMatrix { h: u16, w: u16, pad_top: u8 = 0, pad_bottom: u8 = 0, pad_left: u8 = 0, pad_right: u8 = 0 }
    /// Two-source vector op.
    VBin {
        #[suffix] ty: DType, dst: Reg, src0: Reg, src1: Reg,
        repeat: u8 = 1, dst_blk: u8 = 1, src0_blk: u8 = 1, src1_blk: u8 = 1,
        dst_rep: u8 = 8, src0_rep: u8 = 8, src1_rep: u8 = 8,
    }
    /// One-source vector op.
    VUn {
        #[suffix] ty: DType, dst: Reg, src: Reg,
        repeat: u8 = 1, dst_blk: u8 = 1, src_blk: u8 = 1, dst_rep: u8 = 8, src_rep: u8 = 8,
    }
    /// Vector op with a scalar second operand taken from a register (low bits, as `ty`).
    VScalar {
        #[suffix] ty: DType, dst: Reg, src: Reg, scalar: Reg,
        repeat: u8 = 1, dst_blk: u8 = 1, src_blk: u8 = 1, dst_rep: u8 = 8, src_rep: u8 = 8,
    }
    /// Fill with a scalar taken from a register (low bits, as `ty`).
    VDup { #[suffix] ty: DType, dst: Reg, scalar: Reg, repeat: u8 = 1, dst_blk: u8 = 1, dst_rep: u8 = 8 }
    /// Type conversion; a repeat covers 256 bytes of the wider type.
    VConv {
        #[suffix] dst_ty: DType, #[suffix] src_ty: DType, dst: Reg, src: Reg,
        repeat: u8 = 1, dst_blk: u8 = 1, src_blk: u8 = 1, dst_rep: u8 = 8, src_rep: u8 = 8,
        round: Round = Round::Rint,
    }
    /// Compare two vectors; writes one bit per element, packed, repeat after repeat.
    VCmp {
        #[suffix] cmp: Cmp, #[suffix] ty: DType, dst: Reg, src0: Reg, src1: Reg,
        repeat: u8 = 1, src0_blk: u8 = 1, src1_blk: u8 = 1, src0_rep: u8 = 8, src1_rep: u8 = 8,
    }
    /// Compare a vector with a scalar register; writes one bit per element, packed.
    VCmpS {
        #[suffix] cmp: Cmp, #[suffix] ty: DType, dst: Reg, src: Reg, scalar: Reg,
        repeat: u8 = 1, src_blk: u8 = 1, src_rep: u8 = 8,
    }
    /// Select `src0` where the bit at `sel` is 1, else `src1`; bits are packed per repeat.
    VSel {
        #[suffix] ty: DType, dst: Reg, src0: Reg, src1: Reg, sel: Reg,
        repeat: u8 = 1, dst_blk: u8 = 1, src0_blk: u8 = 1, src1_blk: u8 = 1,
        dst_rep: u8 = 8, src0_rep: u8 = 8, src1_rep: u8 = 8,
    }
    /// Gather by a bit pattern (Ascend's GatherMask): the elements whose pattern bit is 1 (and
    /// that the mask enables), packed contiguously at `dst` repeat after repeat; repeat `r`
    /// reads the pattern's bits from word `r · pat_rep` on (a word is one bit per element of
    /// a repeat; `pat_rep = 0` reuses one word).
    VGather {
        #[suffix] ty: DType, dst: Reg, src: Reg, pattern: Reg,
        repeat: u8 = 1, src_rep: u8 = 8, pat_rep: u8 = 1,
    }
    /// 16 × 16 transpose of 2-byte elements (Ascend's VNCHWCONV, `TransDataTo5HD`): repeat
    /// `r` reads 16 rows of one 32-byte block each, `src_row` blocks apart from block
    /// `r · src_rep` of `src`, and writes row `j` of the result (element `j` of every source
    /// row) `j · dst_row` blocks from block `r · dst_rep` of `dst`. It ignores the mask.
    VTrans {
        #[suffix] ty: DType, dst: Reg, src: Reg,
        repeat: u8 = 1, dst_row: u16 = 1, src_row: u16 = 1, dst_rep: u16 = 16, src_rep: u16 = 16,
    }
    /// Reduction; `dst_rep` is the distance between results in elements.
    VReduce {
        #[suffix] op: ReduceOp, #[suffix] ty: DType, dst: Reg, src: Reg,
        repeat: u8 = 1, src_blk: u8 = 1, src_rep: u8 = 8, dst_rep: u16 = 1,
    }
    /// Burst DMA: `nburst` bursts of `len` 32-byte blocks, gaps in 32-byte blocks.
    Dma { dst: Reg, src: Reg, nburst: u16 [12], len: u16, src_gap: u16 = 0, dst_gap: u16 = 0 }
    /// Byte-granular burst DMA: `len` and gaps in bytes; each burst is 32-byte aligned and
    /// padded in the local buffer, exact in GM.
    DmaPad { dst: Reg, src: Reg, nburst: u16 [12], len: u32 [21], src_gap: u32 = 0, dst_gap: u32 = 0 }
    /// GM row-major f16 matrix to L1 fractal-NZ layout, zero-padded to 16x16 fractals.
    Nd2Nz { dst: Reg, src: Reg, rows: u16, cols: u16, src_stride: u32, dst_rows: u16 }
    /// `nfrac` 512-byte fractals from L1, strides in fractals.
    Load2d { dst: Reg, src: Reg, nfrac: u16, src_stride: u16 = 1, dst_stride: u16 = 1, transpose: bool = false }
    /// img2col of an NC1HWC0 feature map in L1 into L0A fractals (geometry from `set_fmatrix`).
    /// With `c04` a channel slice is 4 channels (8 bytes a pixel, the C04 layout `load_image_l1`
    /// writes) and K runs over (slice, tap, channel), four taps to a K fractal.
    Img2col {
        dst: Reg, src: Reg, c1: u16 [12], kh: u8, kw: u8,
        stride_h: u8 [6] = 1, stride_w: u8 [6] = 1, dil_h: u8 [6] = 1, dil_w: u8 [6] = 1,
        m_start: u16, k_start: u16, mfrac: u8, kfrac: u8, c04: bool = false,
    }
    /// `rows` × `cols` pixels of an 8-bit image (`pixel` bytes each, rows `src_stride` bytes
    /// apart) through the AIPP unit into L1 (`aipp` module; parameters at `cfg` in GM): 16 f16
    /// channels a pixel (32 bytes, the 5HD layout), or 4 with `c04` (8 bytes).
    LoadImage { dst: Reg, src: Reg, cfg: Reg, rows: u16, cols: u16, pixel: u8 [3], src_stride: u32 [24], c04: bool = false }
    /// `dst(L0C) (+)= a(L0A) x b(L0B)` over an m x k x n problem whose operands are `ty`
    /// (f16 and bf16: 16 x 16 fractals, f32 accumulators; i8: 16 x 32 fractals, the L0B
    /// fractal stored n-major, i32 accumulators).
    Mmad { dst: Reg, a: Reg, b: Reg, m: u16, k: u16, n: u16, init: bool = false, ty: DType = DType::F16 }
    /// L0C fractals to UB, converting to `ty`.
    L0cToUb {
        #[suffix] ty: DType, dst: Reg, src: Reg, nfrac: u16,
        src_gap: u16 = 0, dst_gap: u16 = 0, relu: bool = false,
    }
    /// Per channel block, 16 f32 values in UB (64 bytes, blocks `src` + 64·j) written to
    /// every row of `nfrac` L0C fractals (block j's at `dst` + 1024·`nfrac`·j): a bias the
    /// following `mmad`s accumulate onto.
    L0cFill { dst: Reg, src: Reg, nblk: u16, nfrac: u16 }
    /// L0C (NZ, m x n) to a row-major GM matrix, dequantised as `quant` says (with the
    /// scale or FB address in `scale`), then ReLU, then converted to `ty`.
    L0cToGm {
        #[suffix] ty: DType, dst: Reg, src: Reg, m: u16, n: u16, dst_stride: u32, relu: bool = false,
        quant: Quant = Quant::None, scale: Reg = Reg::X0,
    }
    /// A flag between two pipes.
    Flag { src: Pipe, dst: Pipe, id: u8 [4] }
    /// A pipe.
    Barrier { pipe: Pipe }
    /// A cross-core flag set from `pipe` (once its earlier instructions completed) to the cores
    /// `mode` names.
    CrossSet { #[suffix] mode: CrossMode, pipe: Pipe, id: CrossFlagId }
    /// A wait in `pipe` for one arrival of a cross-core flag.
    CrossWait { pipe: Pipe, id: CrossFlagId }
    /// No operands.
    NoOperands {}
}

impl FMatrix {
    /// The img2col geometry register before any `set_fmatrix`: every field 0 (an `img2col`
    /// then faults, as it names no feature map).
    pub const RESET: FMatrix = FMatrix {
        h: 0,
        w: 0,
        pad_top: 0,
        pad_bottom: 0,
        pad_left: 0,
        pad_right: 0,
    };
}

instructions! {
    // ---- scalar ALU -------------------------------------------------------------------------
    /// `dst = a + b` (wrapping).
    Add = 0x01, add, S, Alu, Rrr;
    /// `dst = a - b` (wrapping).
    Sub = 0x02, sub, S, Alu, Rrr;
    /// `dst = a * b` (wrapping, low 64 bits).
    Mul = 0x03, mul, S, Mul, Rrr;
    /// Signed division; x/0 = -1 and MIN/-1 = MIN, as RISC-V.
    Div = 0x04, div, S, Div, Rrr;
    /// Unsigned division; x/0 = all ones.
    Divu = 0x05, divu, S, Div, Rrr;
    /// Signed remainder; x%0 = x.
    Rem = 0x06, rem, S, Div, Rrr;
    /// Unsigned remainder; x%0 = x.
    Remu = 0x07, remu, S, Div, Rrr;
    /// Bitwise and.
    And = 0x08, and, S, Alu, Rrr;
    /// Bitwise or.
    Or = 0x09, or, S, Alu, Rrr;
    /// Bitwise exclusive or.
    Xor = 0x0a, xor, S, Alu, Rrr;
    /// Shift left by `b & 63`.
    Shl = 0x0b, shl, S, Alu, Rrr;
    /// Logical shift right by `b & 63`.
    Shr = 0x0c, shr, S, Alu, Rrr;
    /// Arithmetic shift right by `b & 63`.
    Sra = 0x0d, sra, S, Alu, Rrr;
    /// Signed minimum.
    Min = 0x0e, min, S, Alu, Rrr;
    /// Signed maximum.
    Max = 0x0f, max, S, Alu, Rrr;
    /// Unsigned minimum.
    Minu = 0x10, minu, S, Alu, Rrr;
    /// Unsigned maximum.
    Maxu = 0x11, maxu, S, Alu, Rrr;
    /// `dst = (a < b) as signed ? 1 : 0`.
    Slt = 0x12, slt, S, Alu, Rrr;
    /// `dst = (a < b) as unsigned ? 1 : 0`.
    Sltu = 0x13, sltu, S, Alu, Rrr;
    /// `dst = (a == b) ? 1 : 0`.
    Seq = 0x14, seq, S, Alu, Rrr;
    /// `dst = a + imm`.
    Addi = 0x18, addi, S, Alu, Rri;
    /// `dst = a * imm`.
    Muli = 0x19, muli, S, Mul, Rri;
    /// `dst = a & imm`.
    Andi = 0x1a, andi, S, Alu, Rri;
    /// `dst = a | imm`.
    Ori = 0x1b, ori, S, Alu, Rri;
    /// `dst = a ^ imm`.
    Xori = 0x1c, xori, S, Alu, Rri;
    /// `dst = a << (imm & 63)`.
    Shli = 0x1d, shli, S, Alu, Rri;
    /// `dst = a >> (imm & 63)` (logical).
    Shri = 0x1e, shri, S, Alu, Rri;
    /// `dst = a >> (imm & 63)` (arithmetic).
    Srai = 0x1f, srai, S, Alu, Rri;
    /// `dst = (a < imm) as signed ? 1 : 0`.
    Slti = 0x20, slti, S, Alu, Rri;
    /// `dst = imm`.
    Movi = 0x24, movi, S, Alu, Ri;
    /// `dst = src`.
    Mov = 0x25, mov, S, Alu, Rr;
    /// Count trailing zero bits (64 for zero).
    Ctz = 0x26, ctz, S, Alu, Rr;
    /// Count leading zero bits (64 for zero).
    Clz = 0x27, clz, S, Alu, Rr;
    /// Count one bits.
    Popc = 0x28, popc, S, Alu, Rr;
    /// Read a special register.
    Sreg = 0x29, sreg, S, Spr, ReadSReg;
    // ---- scalar control flow ---------------------------------------------------------------
    /// Branch if equal.
    Beq = 0x30, beq, S, Branch, Branch;
    /// Branch if not equal.
    Bne = 0x31, bne, S, Branch, Branch;
    /// Branch if less than (signed).
    Blt = 0x32, blt, S, Branch, Branch;
    /// Branch if greater or equal (signed).
    Bge = 0x33, bge, S, Branch, Branch;
    /// Branch if less than (unsigned).
    Bltu = 0x34, bltu, S, Branch, Branch;
    /// Branch if greater or equal (unsigned).
    Bgeu = 0x35, bgeu, S, Branch, Branch;
    /// Jump.
    Jmp = 0x36, jmp, S, Branch, Jump;
    /// Decrement the counter register and branch while it is not zero.
    LoopNz = 0x37, r#loop, S, Branch, Loop;
    // ---- scalar memory and special registers -----------------------------------------------
    /// Load `reg` from `base + off`; narrow loads zero- or sign-extend.
    Ld = 0x38, ld, S, ScalarMem, Mem;
    /// Store the low bytes of `reg` to `base + off`.
    St = 0x39, st, S, ScalarMem, Mem;
    /// Set the vector mask (normal mode).
    SetMask = 0x3a, set_mask, S, Spr, MaskNorm;
    /// Set the vector mask (counter mode).
    SetMaskCount = 0x3b, set_mask_count, S, Spr, MaskCount;
    /// Set the img2col feature-map geometry.
    SetFmatrix = 0x3c, set_fmatrix, S, Spr, FMatrix;
    // ---- vector -------------------------------------------------------------------------------
    /// Element-wise add.
    Vadd = 0x40, vadd, V, VecSimple, VBin, [F16, F32, I32];
    /// Element-wise subtract.
    Vsub = 0x41, vsub, V, VecSimple, VBin, [F16, F32, I32];
    /// Element-wise multiply.
    Vmul = 0x42, vmul, V, VecMul, VBin, [F16, F32, I32];
    /// Element-wise divide.
    Vdiv = 0x43, vdiv, V, VecDiv, VBin, [F16, F32];
    /// Element-wise maximum.
    Vmax = 0x44, vmax, V, VecSimple, VBin, [F16, F32, I32];
    /// Element-wise minimum.
    Vmin = 0x45, vmin, V, VecSimple, VBin, [F16, F32, I32];
    /// Bitwise and.
    Vand = 0x46, vand, V, VecSimple, VBin, [I16, I32];
    /// Bitwise or.
    Vor = 0x47, vor, V, VecSimple, VBin, [I16, I32];
    /// Multiply-accumulate: `dst = src0 * src1 + dst`.
    Vmla = 0x48, vmla, V, VecMul, VBin, [F16, F32];
    /// Absolute value.
    Vabs = 0x50, vabs, V, VecSimple, VUn, [F16, F32, I32];
    /// `max(x, 0)`.
    Vrelu = 0x51, vrelu, V, VecSimple, VUn, [F16, F32, I32];
    /// Natural exponential.
    Vexp = 0x52, vexp, V, VecTranscend, VUn, [F16, F32];
    /// Natural logarithm.
    Vln = 0x53, vln, V, VecTranscend, VUn, [F16, F32];
    /// Square root.
    Vsqrt = 0x54, vsqrt, V, VecTranscend, VUn, [F16, F32];
    /// Reciprocal square root.
    Vrsqrt = 0x55, vrsqrt, V, VecTranscend, VUn, [F16, F32];
    /// Reciprocal.
    Vrec = 0x56, vrec, V, VecDiv, VUn, [F16, F32];
    /// Bitwise not.
    Vnot = 0x57, vnot, V, VecSimple, VUn, [I16, I32];
    /// Copy.
    Vmov = 0x58, vmov, V, VecSimple, VUn, [F16, F32, I32, I16];
    /// Add a scalar.
    Vadds = 0x60, vadds, V, VecSimple, VScalar, [F16, F32, I32];
    /// Multiply by a scalar.
    Vmuls = 0x61, vmuls, V, VecMul, VScalar, [F16, F32, I32];
    /// Maximum with a scalar.
    Vmaxs = 0x62, vmaxs, V, VecSimple, VScalar, [F16, F32, I32];
    /// Minimum with a scalar.
    Vmins = 0x63, vmins, V, VecSimple, VScalar, [F16, F32, I32];
    /// Fill with a scalar.
    Vdup = 0x64, vdup, V, VecSimple, VDup, [F16, F32, I32, I16];
    /// Convert between f16, f32 and i32, or u8 to f16 (spelled `vconv.<dst>.<src>`).
    Vconv = 0x68, vconv, V, VecConv, VConv;
    /// Compare two vectors into a bit mask.
    Vcmp = 0x6a, vcmp, V, VecSimple, VCmp, [F16, F32, I32];
    /// Compare a vector with a scalar into a bit mask.
    Vcmps = 0x6b, vcmps, V, VecSimple, VCmpS, [F16, F32, I32];
    /// Select element-wise by a bit mask.
    Vsel = 0x6c, vsel, V, VecSimple, VSel, [F16, F32, I32, I16];
    /// Reduce each repeat (all its elements) to one value.
    Vreduce = 0x70, vreduce, V, VecReduce, VReduce, [F16, F32, I32];
    /// Reduce each 32-byte block to one value (8 results per repeat).
    Vbreduce = 0x71, vbreduce, V, VecReduce, VReduce, [F16, F32, I32];
    /// Gather the elements a bit pattern selects, packed (GatherMask).
    Vgather = 0x72, vgather, V, VecSimple, VGather, [F16, F32, I32, I16];
    /// Transpose 16 × 16 blocks of 2-byte elements (VNCHWCONV: NCHW <-> NC1HWC0).
    Vtranspose = 0x73, vtranspose, V, VecSimple, VTrans, [F16, I16];
    /// Move L0C fractals to UB (the coupled architecture's path out of the cube).
    CopyL0cToUb = 0x74, copy_l0c_to_ub, V, L0cMove, L0cToUb, [F16, F32];
    /// Broadcast UB rows into L0C fractals: a bias before the first `mmad` (`broadcast_ub_to_cc`).
    BroadcastUbToL0c = 0x75, broadcast_ub_to_l0c, V, L0cMove, L0cFill;
    // ---- DMA ----------------------------------------------------------------------------------
    /// GM -> UB burst copy.
    CopyGmToUb = 0x80, copy_gm_to_ub, Mte2, DmaRead, Dma;
    /// UB -> GM burst copy.
    CopyUbToGm = 0x81, copy_ub_to_gm, Mte3, DmaWrite, Dma;
    /// GM -> UB byte-granular copy (DataCopyPad).
    CopyGmToUbPad = 0x82, copy_gm_to_ub_pad, Mte2, DmaRead, DmaPad;
    /// UB -> GM byte-granular copy (DataCopyPad).
    CopyUbToGmPad = 0x83, copy_ub_to_gm_pad, Mte3, DmaWrite, DmaPad;
    /// GM -> L1 burst copy.
    CopyGmToL1 = 0x84, copy_gm_to_l1, Mte2, DmaRead, Dma;
    /// GM row-major f16 matrix -> L1 NZ fractals.
    CopyGmToL1Nd2nz = 0x85, copy_gm_to_l1_nd2nz, Mte2, DmaRead, Nd2Nz;
    /// GM 8-bit image rows -> AIPP (colour conversion, normalisation) -> L1 feature map.
    LoadImageL1 = 0x86, load_image_l1, Mte2, DmaRead, LoadImage;
    /// L1 -> L0A fractals (load2d).
    LoadL0a = 0x88, load_l0a, Mte1, Load2d, Load2d;
    /// L1 -> L0B fractals (load2d).
    LoadL0b = 0x89, load_l0b, Mte1, Load2d, Load2d;
    /// L1 feature map -> L0A im2col fractals (load3d).
    Img2colL0a = 0x8a, img2col_l0a, Mte1, Img2col, Img2col;
    /// L1 bias rows -> L0C through the bias table (a separated chip's cube core: L1 -> BT, and
    /// the BT initialises the accumulator): `broadcast_ub_to_l0c`'s effect from L1.
    BroadcastL1ToL0c = 0x8b, broadcast_l1_to_l0c, Mte1, Load2d, L0cFill;
    /// L0C -> GM with NZ to row-major conversion (FIXPIPE): f32 accumulators to f16 / bf16 /
    /// f32, i32 ones dequantised (`quant`) to those or copied as they are to i32.
    CopyL0cToGm = 0x8c, copy_l0c_to_gm, Fix, DmaWrite, L0cToGm, [F16, F32, Bf16, I32];
    /// L0C fractals -> GM in fractal order, converting to `ty` (FIXPIPE without NZ2ND): the
    /// bytes `copy_l0c_to_ub` would put in UB, gaps included, for a vector core to load.
    CopyL0cToGmNz = 0x8d, copy_l0c_to_gm_nz, Fix, DmaWrite, L0cToUb, [F16, F32];
    /// L0C fractals -> L1 fractals through the FIXPIPE, converting to `ty` (ReLU first with
    /// `relu`): a product's result in L1's NZ layout, ready to be loaded into L0A or L0B for
    /// the next product without a trip through GM (separated chips only).
    CopyL0cToL1 = 0x8f, copy_l0c_to_l1, Fix, L0cMove, L0cToUb, [F16, F32];
    /// L1 -> FB (the FIXPIPE's buffer of per-channel parameters, separated chips only) burst
    /// copy: the scales a `copy_l0c_to_gm` with `quant=vdeq` reads.
    CopyL1ToFb = 0x8e, copy_l1_to_fb, Fix, Load2d, Dma;
    // ---- cube ---------------------------------------------------------------------------------
    /// Matrix multiply-accumulate: f16 or bf16 inputs with f32 accumulation, i8 inputs with
    /// i32 accumulation; one fractal product (16 x 16 x 16, or 16 x 32 x 16 for i8) a cycle.
    Mmad = 0xa0, mmad, M, Cube, Mmad, [F16, Bf16, I8];
    // ---- synchronisation ----------------------------------------------------------------------
    /// Set the flag (src, dst, id) once every earlier instruction of `src` has completed.
    SetFlag = 0xc0, set_flag, Routed, Sync, Flag;
    /// Block pipe `dst` until the flag (src, dst, id) is set, then clear it.
    WaitFlag = 0xc1, wait_flag, Routed, Sync, Flag;
    /// Later instructions of `pipe` wait for every earlier one to complete; `ALL` drains every pipe.
    PipeBarrier = 0xc2, pipe_barrier, Routed, Sync, Barrier;
    /// Do nothing for one cycle.
    Nop = 0xc3, nop, S, Alu, NoOperands;
    /// Set a cross-core flag (`CrossCoreSetFlag<mode, pipe>`), separated chips only: issues in
    /// `pipe` once its earlier instructions completed; `mode` says which cores it reaches.
    /// A core holds at most 15 arrivals of one id that no wait consumed.
    CrossCoreSetFlag = 0xc4, cross_set, Routed, Sync, CrossSet;
    /// Block `pipe` until an arrival of the cross-core flag `id` is there, and consume it
    /// (`CrossCoreWaitFlag`).
    CrossCoreWaitFlag = 0xc5, cross_wait, Routed, Sync, CrossWait;
    /// Wait for every pipe to drain, then end the block.
    End = 0xff, end, S, End, NoOperands;
}

impl Instruction {
    /// The pipe that executes this instruction.
    pub fn pipe(&self) -> Pipe {
        match (self.spec().pipe, self) {
            (crate::spec::PipeClass::Fixed(p), _) => p,
            (crate::spec::PipeClass::Routed, Instruction::SetFlag(f)) => f.src,
            (crate::spec::PipeClass::Routed, Instruction::WaitFlag(f)) => f.dst,
            (crate::spec::PipeClass::Routed, Instruction::PipeBarrier(b)) => match b.pipe {
                Pipe::All => Pipe::S,
                p => p,
            },
            (crate::spec::PipeClass::Routed, Instruction::CrossCoreSetFlag(f)) => match f.pipe {
                Pipe::All => Pipe::S,
                p => p,
            },
            (crate::spec::PipeClass::Routed, Instruction::CrossCoreWaitFlag(f)) => match f.pipe {
                Pipe::All => Pipe::S,
                p => p,
            },
            (crate::spec::PipeClass::Routed, _) => Pipe::S,
        }
    }
}
