//! Reductions and normalisations on the vector unit, accumulating in f32: ReduceMean,
//! ReduceSum, Softmax, LayerNormalization and BatchNormalization (inference); and the tiling
//! machinery `pool.rs` shares (the kernel builder [`K`], the double-buffered tile [`Flow`]).
//!
//! ```text
//!   a tensor seen as [O, L, I]: L is the reduced (normalised) axis group
//!   I == 1  rows of L contiguous elements, R rows per UB tile (row stride: L rounded to 8)
//!     chunk walk (L <= 2040)  one instruction per 64-element column chunk covers every row
//!                             of the tile: rows are repeats, the row stride the repeat stride
//!     row walk (longer rows)  a loop over the tile's rows, one counter-mode instruction each
//!     row statistics          fold into a 64-lane (chunk walk) or C-lane (row walk, halved to
//!                             64) accumulator per row, vbreduce that to one 8-lane block F[r],
//!                             then vbreduce F[r] with block stride 0: eight copies of the total,
//!                             a broadcast block B[r] row ops read with stride 0
//!   I > 1   [Lc, Ic] slabs (rows of Ic columns); column statistics by halving over rows, one
//!           contiguous instruction per level
//!   L too long for UB (reductions only): chunks of L accumulate into a wide accumulator; few
//!   long rows are first split into segments on separate blocks (a second pass adds them)
//! ```
//!
//! Sums are pairwise within a chunk and sequential over at most a few hundred chunks, so a
//! million-element sum stays far inside rtol 1e-4. Tiles that do not divide the work overlap
//! the previous tile (they recompute rows and write identical bytes), so every tile of a
//! kernel has the same static shape.

use gearsim_isa::{DType, Pipe, ProgramBuilder, ReduceOp, SReg, units};

use super::dma::{self, Dir};
use super::queue::{self, Chain, VECOUT};
use super::vec::{BinOp, ScalarOp, UnOp};
use super::writer::{Asm, Reg};
use super::{Kernel, LowerCtx, LowerError, LowerFn, Lowered, Operand, kernel_name};
use crate::CoreSpec;
use crate::ir::{DataType, Tensor, TensorDesc};

/// The lowering of an op type of this module.
pub fn lowering(op: &str) -> Option<LowerFn> {
    let f: LowerFn = match op {
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" => reduce,
        "Softmax" => softmax,
        "LayerNormalization" => layer_norm,
        "BatchNormalization" => batch_norm,
        _ => return None,
    };
    Some(f)
}

// ---- the kernel builder -----------------------------------------------------------------------

/// Bytes of one f32.
pub(super) const F32: u64 = 4;
/// f32 elements per vector repeat.
pub(super) const REP: u64 = units::REPEAT_BYTES / F32;
/// f32 elements per 32-byte block.
pub(super) const BLK: u64 = units::BLOCK_BYTES / F32;
/// Largest repeat count, block stride or repeat stride an instruction field holds.
pub(super) const FIELD: u64 = units::REPEAT_MAX;
/// Largest burst count of one DMA instruction.
const MAX_BURSTS: u64 = units::BURST_COUNT_MAX;
/// UB bytes a kernel leaves unused (results of partial vbreduce groups spill this far).
const UB_SLACK: u64 = 1024;
/// Flag id of the result buffer an item's reduction hands to MTE3 (0 and 1 are the tile flow's
/// two buffers), so the next item's result waits only for the previous store.
const OUT_FLAG: usize = 2;

/// The bits of f32 negative infinity (the identity of max).
pub(super) const NEG_INF: u32 = 0xff80_0000;
/// +inf in f32 bits (ReduceMin's identity).
pub(super) const POS_INF: u32 = 0x7f80_0000;

/// An f32 vector operation of the reductions, by its operand shape, as the builder method the
/// ISA table generates (`ProgramBuilder::vadd`, `vexp`, `vmuls`, ...): two-source for
/// [`K::vbin`], one-source for [`K::vun`], vector-scalar for [`K::vsc`].
#[derive(Clone, Copy)]
pub(super) enum VOp {
    Bin(BinOp),
    Un(UnOp),
    Scalar(ScalarOp),
}

/// A vector mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mask {
    /// Counter mode: exactly this many elements.
    Count(u64),
    /// Normal mode: these lanes of every repeat (the repeat field counts).
    Bits(u128),
}

impl Mask {
    /// Lanes `0..n` of a 64-lane repeat.
    pub(super) fn low(n: u64) -> Mask {
        Mask::Bits((1u128 << n.min(REP)) - 1)
    }

    /// Lane `lane` of every 8-lane block.
    pub(super) fn lane_of_blocks(lanes: &[u64]) -> Mask {
        let mut bits = 0u128;
        for g in 0..8 {
            for l in lanes {
                bits |= 1u128 << (g * 8 + l);
            }
        }
        Mask::Bits(bits)
    }
}

/// Where block `b` of a row array lives, given the row's base register if any.
type BlockAddr = fn(u64, Option<Reg>) -> Addr;

/// A UB address: static, or a register plus an offset.
#[derive(Debug, Clone, Copy)]
pub(super) enum Addr {
    /// A fixed UB byte offset.
    Ub(u64),
    /// A register's value plus a byte offset.
    Rel(Reg, u64),
}

impl Addr {
    /// This address `d` bytes further.
    pub(super) fn off(self, d: u64) -> Addr {
        match self {
            Addr::Ub(a) => Addr::Ub(a + d),
            Addr::Rel(r, a) => Addr::Rel(r, a + d),
        }
    }
}

/// A vector operand: address, block stride and repeat stride (in 32-byte blocks).
#[derive(Debug, Clone, Copy)]
pub(super) struct Opd {
    /// First block.
    pub at: Addr,
    /// Block stride.
    pub blk: u64,
    /// Repeat stride.
    pub rep: u64,
}

impl Opd {
    /// A contiguous operand.
    pub(super) fn flat(at: Addr) -> Opd {
        Opd { at, blk: 1, rep: 8 }
    }

    /// A contiguous operand at a static UB offset.
    pub(super) fn ub(at: u64) -> Opd {
        Opd::flat(Addr::Ub(at))
    }
}

/// A kernel being written: the assembly, scratch registers for operand addresses and masks,
/// the mask last set (so straight-line code does not set it again) and the UB layout.
pub(super) struct K {
    /// The assembly.
    pub a: Asm,
    t: [Reg; 3],
    mhi: Reg,
    mlo: Reg,
    mask: Option<Mask>,
    walk: Option<(Reg, Reg, Reg)>,
    /// Counter of the flows' tile-pair loops.
    pub pairs: Reg,
    big: Reg,
    consts: Vec<(u32, Reg)>,
    ub_used: u64,
    ub_cap: u64,
}

impl K {
    /// A new kernel for `core`.
    pub(super) fn new(name: &str, core: &CoreSpec) -> K {
        let mut a = Asm::new(name);
        let t = [a.reg(), a.reg(), a.reg()];
        let (mhi, mlo) = (a.reg(), a.reg());
        let pairs = a.reg();
        let big = a.reg();
        K {
            a,
            t,
            mhi,
            mlo,
            mask: None,
            walk: None,
            pairs,
            big,
            consts: Vec::new(),
            ub_used: 0,
            ub_cap: core.ub_bytes.saturating_sub(UB_SLACK),
        }
    }

    /// Reserves `bytes` of UB (32-byte aligned); `None` when UB is full.
    pub(super) fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let at = self.ub_used;
        let end = at.checked_add(bytes.div_ceil(units::BLOCK_BYTES) * units::BLOCK_BYTES)?;
        if end > self.ub_cap {
            return None;
        }
        self.ub_used = end;
        Some(at)
    }

    /// UB bytes allocated so far.
    pub(super) fn ub_used(&self) -> u64 {
        self.ub_used
    }

    /// Scratch register `i` (0..3) for a caller's own address arithmetic between vector
    /// instructions (the vector emitters overwrite them).
    pub(super) fn tmp(&self, i: usize) -> Reg {
        self.t[i]
    }

    /// Places a label (the mask is unknown after a jump target).
    pub(super) fn place(&mut self, label: &str) {
        self.a.place(label);
        self.mask = None;
    }

    /// Forgets the mask (after code that may have set another one on some path).
    pub(super) fn forget_mask(&mut self) {
        self.mask = None;
    }

    fn reg_of(&mut self, i: usize, at: Addr) -> Reg {
        let t = self.t[i];
        match at {
            Addr::Ub(off) => {
                self.a.movi(t, off as i64);
                t
            }
            Addr::Rel(r, 0) => r,
            Addr::Rel(r, off) => {
                self.a.addi(t, r, off);
                t
            }
        }
    }

    /// Sets the vector mask unless it is already `m`.
    pub(super) fn set_mask(&mut self, m: Mask) {
        if self.mask == Some(m) {
            return;
        }
        match m {
            Mask::Count(n) => {
                self.a.movi(self.mlo, n as i64);
                self.a.set_mask_count(self.mlo);
            }
            Mask::Bits(b) => {
                self.a.movi(self.mhi, (b >> 64) as u64 as i64);
                self.a.movi(self.mlo, b as u64 as i64);
                self.a.set_mask(self.mhi, self.mlo);
            }
        }
        self.mask = Some(m);
    }

    /// The repeat count an instruction is given: `rep` in normal mode; in counter mode the
    /// mask counts and the field keeps its default.
    fn repeat(m: Mask, rep: u64) -> Option<u64> {
        match m {
            Mask::Count(_) => None,
            Mask::Bits(_) => Some(rep),
        }
    }

    /// A two-operand vector instruction (`vadd`, `vmax`, `vmla`, ...).
    pub(super) fn vbin(&mut self, op: BinOp, d: Opd, s0: Opd, s1: Opd, m: Mask, rep: u64) {
        self.set_mask(m);
        let (rd, r0, r1) = (
            self.reg_of(0, d.at),
            self.reg_of(1, s0.at),
            self.reg_of(2, s1.at),
        );
        let r = K::repeat(m, rep);
        let f = DType::F32;
        let b = &mut *self.a;
        let e = op(b, f, rd, r0, r1);
        let e = match r {
            Some(rep) => e.repeat(rep),
            None => e,
        };
        e.dst_blk(d.blk)
            .src0_blk(s0.blk)
            .src1_blk(s1.blk)
            .dst_rep(d.rep)
            .src0_rep(s0.rep)
            .src1_rep(s1.rep);
    }

    /// A one-operand vector instruction (`vexp`, `vmov`, `vrec`, ...).
    pub(super) fn vun(&mut self, op: UnOp, d: Opd, s: Opd, m: Mask, rep: u64) {
        self.set_mask(m);
        let (rd, rs) = (self.reg_of(0, d.at), self.reg_of(1, s.at));
        let r = K::repeat(m, rep);
        let f = DType::F32;
        let b = &mut *self.a;
        let e = op(b, f, rd, rs);
        let e = match r {
            Some(rep) => e.repeat(rep),
            None => e,
        };
        e.dst_blk(d.blk)
            .src_blk(s.blk)
            .dst_rep(d.rep)
            .src_rep(s.rep);
    }

    /// A vector-scalar instruction (`vadds`, `vmuls`).
    pub(super) fn vsc(&mut self, op: ScalarOp, d: Opd, s: Opd, scalar: Reg, m: Mask, rep: u64) {
        self.set_mask(m);
        let (rd, rs) = (self.reg_of(0, d.at), self.reg_of(1, s.at));
        let r = K::repeat(m, rep);
        let f = DType::F32;
        let b = &mut *self.a;
        let e = op(b, f, rd, rs, scalar);
        let e = match r {
            Some(rep) => e.repeat(rep),
            None => e,
        };
        e.dst_blk(d.blk)
            .src_blk(s.blk)
            .dst_rep(d.rep)
            .src_rep(s.rep);
    }

    /// Fills with a scalar register's f32 bits.
    pub(super) fn vdup(&mut self, d: Opd, scalar: Reg, m: Mask, rep: u64) {
        self.set_mask(m);
        let rd = self.reg_of(0, d.at);
        let r = K::repeat(m, rep);
        let e = self.a.vdup(DType::F32, rd, scalar);
        let e = match r {
            Some(rep) => e.repeat(rep),
            None => e,
        };
        e.dst_blk(d.blk).dst_rep(d.rep);
    }

    /// `vreduce` (`per_block` false) or `vbreduce`, with `op` sum or max.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn vred(
        &mut self,
        per_block: bool,
        op: ReduceOp,
        d: Addr,
        s: Opd,
        dst_rep: u64,
        m: Mask,
        rep: u64,
    ) {
        self.set_mask(m);
        let (rd, rs) = (self.reg_of(0, d), self.reg_of(1, s.at));
        let r = K::repeat(m, rep);
        let e = if per_block {
            self.a.vbreduce(op, DType::F32, rd, rs)
        } else {
            self.a.vreduce(op, DType::F32, rd, rs)
        };
        let e = match r {
            Some(rep) => e.repeat(rep),
            None => e,
        };
        e.src_blk(s.blk).src_rep(s.rep).dst_rep(dst_rep);
    }

    /// A register holding f32 `v`'s bits, one per distinct value and kernel. The first use
    /// writes it; kernels have no forward branches, so every later use runs after that.
    pub(super) fn f32_reg(&mut self, v: f32) -> Reg {
        let bits = v.to_bits();
        if let Some((_, r)) = self.consts.iter().find(|(b, _)| *b == bits) {
            return *r;
        }
        let r = self.a.constant(i64::from(bits));
        self.consts.push((bits, r));
        r
    }

    /// `dst += imm` (an immediate of any size).
    pub(super) fn addi(&mut self, dst: Reg, imm: u64) {
        if imm == 0 {
            return;
        }
        if i32::try_from(imm).is_ok() {
            self.a.addi(dst, dst, imm);
        } else {
            self.a.movi(self.big, imm as i64);
            self.a.add(dst, dst, self.big);
        }
    }

    /// `dst = src + off` for a GM pointer (any offset size).
    pub(super) fn gm_off(&mut self, dst: Reg, src: Reg, off: u64) {
        if dst != src {
            self.a.mov(dst, src);
        }
        self.addi(dst, off);
    }

    /// `dst = a * imm` (an immediate of any size).
    pub(super) fn mul_imm(&mut self, dst: Reg, a: Reg, imm: u64) {
        if i32::try_from(imm).is_ok() {
            self.a.muli(dst, a, imm);
        } else {
            self.a.movi(self.big, imm as i64);
            self.a.mul(dst, a, self.big);
        }
    }

    /// `dst = min(dst, imm)`.
    pub(super) fn min_imm(&mut self, dst: Reg, imm: u64) {
        self.a.movi(self.big, imm as i64);
        self.a.min(dst, dst, self.big);
    }
}

// ---- DMA ----------------------------------------------------------------------------------------

/// Moves `rows` rows of `len` f32 between GM (rows `gm_stride` elements apart) and UB (rows
/// `len` rounded up to 8 elements apart). `load` is GM to UB. `gm` is advanced past the rows
/// only by the caller.
pub(super) fn dma_rows(
    k: &mut K,
    load: bool,
    ub: Addr,
    gm: Reg,
    rows: u64,
    len: u64,
    gm_stride: u64,
) {
    let lb = round8(len) * F32;
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(MAX_BURSTS);
        let u = k.reg_of(0, ub.off(done * lb));
        let g = if done == 0 {
            gm
        } else {
            let t = k.t[1];
            k.gm_off(t, gm, done * gm_stride * F32);
            t
        };
        let dir = if load { Dir::GmToUb } else { Dir::UbToGm };
        dma::rows(
            &mut k.a,
            dir,
            u,
            g,
            n,
            len * F32,
            (gm_stride - len) * F32,
            0,
        );
        done += n;
    }
}

/// `n` rounded up to a multiple of 8.
pub(super) fn round8(n: u64) -> u64 {
    n.div_ceil(BLK) * BLK
}

// ---- the double-buffered tile flow ------------------------------------------------------------

/// The pipes a tile buffer passes through: MTE2 loads it, V computes on it, and MTE3 stores
/// it when the flow stores tiles; the last of them frees it for the next load.
fn chain(stores: bool) -> Chain {
    Chain {
        stages: if stores {
            &[Pipe::Mte2, Pipe::V, Pipe::Mte3]
        } else {
            &[Pipe::Mte2, Pipe::V]
        },
        nbuf: 2,
    }
}

/// Marks both tile buffers free (before the first flow of a kernel).
pub(super) fn flow_init(k: &mut K, stores: bool) {
    chain(stores).prologue(&mut k.a);
}

/// Consumes the buffer-free flags the last flow left set.
pub(super) fn flow_fini(k: &mut K, stores: bool) {
    chain(stores).epilogue(&mut k.a);
}

/// A step of a flow: gets the buffer (0 or 1) and whether it is the flow's last tile.
pub(super) type Step<'a> = &'a dyn Fn(&mut K, usize, bool);

/// `tiles` tiles through two buffers: MTE2 loads tile t+1 while V computes tile t and MTE3
/// stores tile t-1. The loads are written before the compute of the previous tile, so the
/// scalar unit dispatches them early however long the compute is.
pub(super) struct Flow<'a> {
    /// Tiles (at least one).
    pub tiles: u64,
    /// Loads a tile into a buffer.
    pub load: Step<'a>,
    /// Computes a tile.
    pub compute: Step<'a>,
    /// Stores a tile (`None`: the buffer is free once V has read it).
    pub store: Option<Step<'a>>,
}

impl Flow<'_> {
    fn chain(&self) -> Chain {
        chain(self.store.is_some())
    }

    fn load_tile(&self, k: &mut K, b: usize, last: bool) {
        self.chain().begin(&mut k.a, 0, b);
        (self.load)(k, b, last);
        self.chain().end(&mut k.a, 0, b);
    }

    fn iteration(&self, k: &mut K, b: usize, next: Option<bool>, last: bool) {
        if let Some(next_last) = next {
            self.load_tile(k, 1 - b, next_last);
        }
        self.chain().begin(&mut k.a, 1, b);
        (self.compute)(k, b, last);
        self.chain().end(&mut k.a, 1, b);
        if let Some(store) = self.store {
            self.chain().begin(&mut k.a, 2, b);
            store(k, b, last);
            self.chain().end(&mut k.a, 2, b);
        }
    }

    /// Writes the flow.
    pub(super) fn emit(&self, k: &mut K) {
        let t = self.tiles.max(1);
        self.load_tile(k, 0, t == 1);
        if t == 1 {
            self.iteration(k, 0, None, true);
            return;
        }
        // Iterations 0..t-2 load a full next tile; t-2 loads the last tile, t-1 loads nothing.
        let uniform = t - 2;
        if uniform >= 2 {
            let top = k.a.new_label("tile_pair");
            k.a.movi(k.pairs, (uniform / 2) as i64);
            k.place(&top);
            self.iteration(k, 0, Some(false), false);
            self.iteration(k, 1, Some(false), false);
            let l = k.a.label(&top);
            k.a.r#loop(k.pairs, l);
            k.forget_mask();
        }
        if uniform % 2 == 1 {
            self.iteration(k, 0, Some(false), false);
        }
        let b = (uniform % 2) as usize;
        self.iteration(k, b, Some(true), false);
        self.iteration(k, 1 - b, None, true);
    }
}

/// Emits `body` `count` times: straight when once, else in a loop on `counter`.
pub(super) fn repeat_loop(k: &mut K, counter: Reg, count: u64, body: &dyn Fn(&mut K)) {
    if count == 0 {
        return;
    }
    if count == 1 {
        body(k);
        return;
    }
    let top = k.a.new_label("item");
    k.a.movi(counter, count as i64);
    k.place(&top);
    body(k);
    let l = k.a.label(&top);
    k.a.r#loop(counter, l);
    k.forget_mask();
}

// ---- tiles of rows ------------------------------------------------------------------------------

/// How instructions walk the rows of a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Walk {
    /// One repeat is 64 elements of one row; an instruction covers a column chunk of up to
    /// 255 rows (row stride = repeat stride, so at most 255 blocks).
    Chunk,
    /// A loop over the rows, one counter-mode instruction per row.
    Row,
}

/// A UB tile of rows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tile {
    /// Rows.
    pub rows: u64,
    /// Valid elements per row.
    pub len: u64,
    /// Row stride in blocks.
    pub stride: u64,
    /// How instructions walk it.
    pub walk: Walk,
    /// Accumulator lanes per row of the row walk's folds (a power of two times 64).
    pub acc_lanes: u64,
}

impl Tile {
    /// A tile of `rows` rows of `len` elements, walked the cheapest way.
    pub(super) fn new(rows: u64, len: u64) -> Tile {
        let stride = round8(len) / BLK;
        let walk = if stride <= FIELD {
            Walk::Chunk
        } else {
            Walk::Row
        };
        let acc_lanes = len.max(REP).next_power_of_two().min(4096);
        Tile {
            rows,
            len,
            stride,
            walk,
            acc_lanes,
        }
    }

    /// Accumulator bytes a fold needs.
    pub(super) fn acc_bytes(&self) -> u64 {
        match self.walk {
            Walk::Chunk => self.rows * REP * F32,
            Walk::Row => self.acc_lanes * F32,
        }
    }

    /// Runs `body` over the tile: once for all rows (chunk walk) or once per row in a loop.
    pub(super) fn each(&self, k: &mut K, body: &dyn Fn(&mut K, &View)) {
        match self.walk {
            Walk::Chunk => body(
                k,
                &View {
                    tile: *self,
                    row: None,
                },
            ),
            Walk::Row => {
                let (row, blk, cnt) = match k.walk {
                    Some(w) => w,
                    None => {
                        let w = (k.a.reg(), k.a.reg(), k.a.reg());
                        k.walk = Some(w);
                        w
                    }
                };
                k.a.movi(row, 0);
                k.a.movi(blk, 0);
                k.a.movi(cnt, self.rows as i64);
                let top = k.a.new_label("row");
                k.place(&top);
                body(
                    k,
                    &View {
                        tile: *self,
                        row: Some((row, blk)),
                    },
                );
                k.a.add_imm(row, (self.stride * units::BLOCK_BYTES) as i64);
                k.a.add_imm(blk, units::BLOCK_BYTES as i64);
                let l = k.a.label(&top);
                k.a.r#loop(cnt, l);
                k.forget_mask();
            }
        }
    }

    /// Per-row scalars from per-row blocks: `vbreduce.op` of each block at `blocks` into
    /// `rows` contiguous f32 at `dst`.
    pub(super) fn scalars(&self, k: &mut K, op: ReduceOp, dst: u64, blocks: u64) {
        k.vred(
            true,
            op,
            Addr::Ub(dst),
            Opd {
                at: Addr::Ub(blocks),
                blk: 1,
                rep: 8,
            },
            1,
            Mask::Count(self.rows * BLK),
            1,
        );
    }
}

/// An operand of a row-wise operation.
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    /// The tile's rows at this UB offset.
    Mat(u64),
    /// One broadcast block per row, contiguous, at this offset.
    RowB(u64),
    /// One vector of the row length every row uses.
    ColV(u64),
    /// A scalar register (f32 bits).
    Scalar(Reg),
}

/// Row groups of at most 255 rows (the repeat field's limit).
fn groups(rows: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..rows.div_ceil(FIELD)).map(move |g| (g * FIELD, (rows - g * FIELD).min(FIELD)))
}

/// What one pass of [`Tile::each`] sees: every row (chunk walk) or the current row.
pub(super) struct View {
    tile: Tile,
    row: Option<(Reg, Reg)>,
}

impl View {
    /// The operand for `arg` at chunk `c` of row group starting at `g0` (chunk walk), or at
    /// the current row (row walk).
    fn opd(&self, arg: Arg, c: u64, g0: u64) -> Opd {
        let t = &self.tile;
        match (self.row, arg) {
            (None, Arg::Mat(b)) => Opd {
                at: Addr::Ub(b + g0 * t.stride * units::BLOCK_BYTES + c * REP * F32),
                blk: 1,
                rep: t.stride,
            },
            (None, Arg::RowB(b)) => Opd {
                at: Addr::Ub(b + g0 * units::BLOCK_BYTES),
                blk: 0,
                rep: 1,
            },
            (None, Arg::ColV(b)) => Opd {
                at: Addr::Ub(b + c * REP * F32),
                blk: 1,
                rep: 0,
            },
            (Some((row, _)), Arg::Mat(b)) => Opd::flat(Addr::Rel(row, b)),
            (Some((_, blk)), Arg::RowB(b)) => Opd {
                at: Addr::Rel(blk, b),
                blk: 0,
                rep: 0,
            },
            (Some(_), Arg::ColV(b)) => Opd::ub(b),
            (_, Arg::Scalar(_)) => Opd::ub(0),
        }
    }

    /// `dst = op(a)` / `op(a, b)` / `op(a, scalar)` over the rows' valid elements: a one-source
    /// `mn` when `b` is `None`, a vector-scalar one when it is a scalar, a two-source one else.
    pub(super) fn ew(&self, k: &mut K, mn: VOp, dst: u64, a: Arg, b: Option<Arg>) {
        let t = self.tile;
        let emit = |k: &mut K, c: u64, g0: u64, m: Mask, rep: u64| {
            let (d, s0) = (self.opd(Arg::Mat(dst), c, g0), self.opd(a, c, g0));
            match (mn, b) {
                (VOp::Un(op), None) => k.vun(op, d, s0, m, rep),
                (VOp::Scalar(op), Some(Arg::Scalar(r))) => k.vsc(op, d, s0, r, m, rep),
                (VOp::Bin(op), Some(b)) if !matches!(b, Arg::Scalar(_)) => {
                    k.vbin(op, d, s0, self.opd(b, c, g0), m, rep)
                }
                _ => {
                    k.a.generator_error("an element-wise operation with the wrong operands")
                }
            }
        };
        match self.row {
            None => {
                for (g0, n) in groups(t.rows) {
                    for c in 0..t.len.div_ceil(REP) {
                        emit(k, c, g0, Mask::low(t.len - c * REP), n);
                    }
                }
            }
            Some(_) => emit(k, 0, 0, Mask::Count(t.len), 1),
        }
    }

    /// Folds every row of the tile (`src`, or its squares when `square`) with `op` (`sum` or
    /// `max`) into one 8-lane block per row at `f`, through the accumulator at `acc`.
    pub(super) fn fold(&self, k: &mut K, op: ReduceOp, src: u64, square: bool, acc: u64, f: u64) {
        let t = self.tile;
        let (vop, ident) = fold_op(op);
        let id = k.t[2];
        k.a.movi(id, i64::from(ident));
        match self.row {
            None => {
                k.vdup(Opd::ub(acc), id, Mask::Count(t.rows * REP), 1);
                for (g0, n) in groups(t.rows) {
                    let a = Opd::ub(acc + g0 * REP * F32);
                    for c in 0..t.len.div_ceil(REP) {
                        let x = self.opd(Arg::Mat(src), c, g0);
                        let m = Mask::low(t.len - c * REP);
                        if square {
                            k.vbin(ProgramBuilder::vmla, a, x, x, m, n);
                        } else {
                            k.vbin(vop, a, a, x, m, n);
                        }
                    }
                    k.vred(
                        true,
                        op,
                        Addr::Ub(f + g0 * units::BLOCK_BYTES),
                        a,
                        1,
                        Mask::low(REP),
                        n,
                    );
                }
            }
            Some((row, blk)) => {
                let w = t.acc_lanes;
                k.vdup(Opd::ub(acc), id, Mask::Count(w), 1);
                let mut p = 0;
                while p < t.len {
                    let n = (t.len - p).min(w);
                    let x = Opd::flat(Addr::Rel(row, src + p * F32));
                    if square {
                        k.vbin(ProgramBuilder::vmla, Opd::ub(acc), x, x, Mask::Count(n), 1);
                    } else {
                        k.vbin(vop, Opd::ub(acc), Opd::ub(acc), x, Mask::Count(n), 1);
                    }
                    p += n;
                }
                halve(k, vop, acc, w, REP);
                k.vred(
                    true,
                    op,
                    Addr::Rel(blk, f),
                    Opd::ub(acc),
                    1,
                    Mask::Count(REP),
                    1,
                );
            }
        }
    }

    /// Turns each row's block at `f` into a broadcast block (8 copies of its `op` total) at
    /// `dst`.
    pub(super) fn bcast(&self, k: &mut K, op: ReduceOp, dst: u64, f: u64) {
        match self.row {
            None => {
                for (g0, n) in groups(self.tile.rows) {
                    let s = Opd {
                        at: Addr::Ub(f + g0 * units::BLOCK_BYTES),
                        blk: 0,
                        rep: 1,
                    };
                    k.vred(
                        true,
                        op,
                        Addr::Ub(dst + g0 * units::BLOCK_BYTES),
                        s,
                        1,
                        Mask::low(REP),
                        n,
                    );
                }
            }
            Some((_, blk)) => {
                let s = Opd {
                    at: Addr::Rel(blk, f),
                    blk: 0,
                    rep: 0,
                };
                k.vred(true, op, Addr::Rel(blk, dst), s, 1, Mask::Count(REP), 1);
            }
        }
    }

    /// `dst = op(a[, b])` on the rows' broadcast blocks (`b` a scalar or another block array).
    pub(super) fn rowb(&self, k: &mut K, mn: VOp, dst: u64, a: u64, b: Option<Arg>) {
        let (n, at): (u64, BlockAddr) = match self.row {
            None => (self.tile.rows * BLK, |b, _| Addr::Ub(b)),
            Some(_) => (BLK, |b, r| match r {
                Some(r) => Addr::Rel(r, b),
                None => Addr::Ub(b),
            }),
        };
        let blk = self.row.map(|(_, b)| b);
        let (d, s) = (Opd::flat(at(dst, blk)), Opd::flat(at(a, blk)));
        let m = Mask::Count(n);
        match (mn, b) {
            (VOp::Un(op), None) => k.vun(op, d, s, m, 1),
            (VOp::Scalar(op), Some(Arg::Scalar(r))) => k.vsc(op, d, s, r, m, 1),
            (VOp::Bin(op), Some(Arg::RowB(o))) => k.vbin(op, d, s, Opd::flat(at(o, blk)), m, 1),
            _ => {
                k.a.generator_error("a row-broadcast operation with the wrong operands")
            }
        }
    }
}

/// Halves a contiguous accumulator of `w` lanes (a power of two) down to `to` lanes with `vop`.
/// The pairwise instruction of a reduction and its identity element (f32 bits).
pub(super) fn fold_op(op: ReduceOp) -> (BinOp, u32) {
    match op {
        ReduceOp::Max => (ProgramBuilder::vmax as BinOp, NEG_INF),
        ReduceOp::Min => (ProgramBuilder::vmin as BinOp, POS_INF),
        ReduceOp::Sum => (ProgramBuilder::vadd as BinOp, 0),
    }
}

pub(super) fn halve(k: &mut K, vop: BinOp, acc: u64, mut w: u64, to: u64) {
    while w > to {
        w /= 2;
        k.vbin(
            vop,
            Opd::ub(acc),
            Opd::ub(acc),
            Opd::ub(acc + w * F32),
            Mask::Count(w),
            1,
        );
    }
}

/// Folds `rows` contiguous rows of `width` elements (a multiple of 8) at `src` into one row at
/// `dst` with `vop`, pairwise: the upper half onto the lower half until one row is left. The
/// first level writes `dst`, so `src` is kept when `dst != src` (`dst` then needs
/// ceil(rows / 2) rows).
pub(super) fn col_fold(k: &mut K, vop: BinOp, dst: u64, src: u64, rows: u64, width: u64) {
    let rb = width * F32;
    if rows <= 1 {
        if dst != src {
            k.vun(
                ProgramBuilder::vmov,
                Opd::ub(dst),
                Opd::ub(src),
                Mask::Count(width),
                1,
            );
        }
        return;
    }
    let mut n = rows;
    let mut from = src;
    while n > 1 {
        let h = n.div_ceil(2);
        let m = n - h;
        k.vbin(
            vop,
            Opd::ub(dst),
            Opd::ub(from),
            Opd::ub(from + h * rb),
            Mask::Count(m * width),
            1,
        );
        if h > m && from != dst {
            k.vun(
                ProgramBuilder::vmov,
                Opd::ub(dst + m * rb),
                Opd::ub(from + m * rb),
                Mask::Count(width),
                1,
            );
        }
        from = dst;
        n = h;
    }
}

// ---- block and tile plans -----------------------------------------------------------------------

/// Work items spread over blocks: every block runs `per_block` items starting at
/// `min(block * per_block, items - per_block)` (the last block may redo items of the one
/// before it, writing identical bytes).
#[derive(Debug, Clone, Copy)]
pub(super) struct Spread {
    /// Blocks.
    pub blocks: u32,
    /// Items per block.
    pub per_block: u64,
    /// Items.
    pub items: u64,
}

impl Spread {
    /// `items` over at most the core count of blocks.
    pub(super) fn new(items: u64, core: &CoreSpec) -> Spread {
        let cores = core.vector_blocks();
        let items = items.max(1);
        let per_block = items.div_ceil(items.min(cores));
        let blocks = items.div_ceil(per_block);
        Spread {
            blocks: blocks as u32,
            per_block,
            items,
        }
    }

    /// `dst` = this block's first item.
    pub(super) fn first(&self, k: &mut K, dst: Reg) {
        k.a.sreg(dst, SReg::BlockIdx);
        k.mul_imm(dst, dst, self.per_block);
        k.min_imm(dst, self.items - self.per_block);
    }
}

/// The kernel's argument pointers: `sreg args` then one load per argument.
pub(super) fn args(k: &mut K, n: usize) -> Vec<Reg> {
    let a = k.a.reg();
    k.a.sreg(a, SReg::Args);
    (0..n).map(|i| k.a.arg(a, i)).collect()
}

fn no_kernels() -> Lowered {
    Lowered::Kernels {
        kernels: Vec::new(),
        derived: Vec::new(),
        workspace_bytes: 0,
    }
}

fn finish(ctx: &LowerCtx<'_>, k: K, blocks: u32, args: Vec<Operand>) -> Result<Kernel, LowerError> {
    ctx.kernel(k.a, blocks, args)
}

/// The dims of a static shape.
pub(super) fn dims(ctx: &LowerCtx<'_>, d: &TensorDesc) -> Result<Vec<u64>, LowerError> {
    d.shape
        .iter()
        .map(|x| x.fixed().map(|v| v.max(0) as u64))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| ctx.error(format!("shape {d} is not static")))
}

/// Checks that a tensor is f32 (the vector kernels of this module compute in f32 only).
pub(super) fn need_f32(ctx: &LowerCtx<'_>, d: &TensorDesc, what: &str) -> Result<(), LowerError> {
    if d.dtype == DataType::F32 {
        Ok(())
    } else {
        Err(ctx.error(format!(
            "{what} is {}; the vector kernel computes in f32 only",
            d.dtype.name()
        )))
    }
}

fn int_attr(ctx: &LowerCtx<'_>, name: &str, default: i64) -> i64 {
    ctx.node.int(name).unwrap_or(default)
}

fn float_attr(ctx: &LowerCtx<'_>, name: &str, default: f32) -> f32 {
    ctx.node.float(name).unwrap_or(default)
}

/// Normalises an axis against `rank`.
fn axis_of(ctx: &LowerCtx<'_>, axis: i64, rank: usize) -> Result<usize, LowerError> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(ctx.error(format!("axis {axis} is outside rank {rank}")));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

// ---- the resident row kernel --------------------------------------------------------------------

/// How tiles map onto rows.
#[derive(Debug, Clone, Copy)]
enum TileMap {
    /// Tile j covers rows [min(j R, rows - R), +R).
    Plain,
    /// Rows come in groups of this many (BatchNormalization's channels); tiles stay inside a
    /// group and per-row tables are indexed by the row within its group.
    Grouped(u64),
}

/// The UB buffers the compute of one tile sees.
struct RowBufs {
    /// The tile (rows of the input, computed in place).
    x: u64,
    /// The geometry.
    tile: Tile,
    /// Vectors of the row length loaded once per block.
    colv: Vec<u64>,
    /// This tile's per-row broadcast blocks loaded with it.
    tables: Vec<u64>,
    /// This tile's per-row scalar outputs.
    stats: Vec<u64>,
    /// Fold accumulator.
    acc: u64,
    /// Per-row fold blocks.
    f: u64,
    /// Per-row broadcast blocks.
    b: Vec<u64>,
}

/// A kernel over rows that fit in UB: tiles of R rows, computed in place.
struct RowKernel<'a> {
    name: String,
    rows: u64,
    len: u64,
    map: TileMap,
    /// Argument of the input rows.
    x: usize,
    /// Argument of the row output (same shape as the input).
    y: Option<usize>,
    /// Arguments of per-row scalar outputs.
    stats: Vec<usize>,
    /// Arguments of [len] vectors every row uses.
    colv: Vec<usize>,
    /// Arguments of per-row broadcast-block tables ([group] blocks, Grouped map only).
    tables: Vec<usize>,
    /// Broadcast block arrays the compute needs.
    bcasts: usize,
    /// Total arguments.
    nargs: usize,
    compute: &'a dyn Fn(&mut K, &RowBufs),
}

impl RowKernel<'_> {
    /// Rows per tile: as many as UB holds (255 at most), about a quarter of a block's rows so
    /// the pipeline fills, and enough bytes per tile to amortise the DMA latency.
    fn rows_per_tile(&self, core: &CoreSpec, tile: &Tile) -> u64 {
        let row = tile.stride * units::BLOCK_BYTES;
        let per_row = 2 * row
            + 2 * units::BLOCK_BYTES * self.tables.len() as u64
            + 2 * F32 * self.stats.len() as u64
            + units::BLOCK_BYTES * (1 + self.bcasts as u64)
            + if tile.walk == Walk::Chunk {
                REP * F32
            } else {
                0
            };
        let fixed = self.colv.len() as u64 * row
            + if tile.walk == Walk::Row {
                tile.acc_lanes * F32
            } else {
                0
            }
            + 64 * units::BLOCK_BYTES
            + UB_SLACK;
        let by_ub = core.ub_bytes.saturating_sub(fixed) / per_row.max(1);
        let limit = match self.map {
            TileMap::Plain => self.rows,
            TileMap::Grouped(g) => g,
        };
        let cores = core.vector_blocks();
        let want = self
            .rows
            .div_ceil(cores)
            .div_ceil(4)
            .max((16 * 1024u64).div_ceil(row));
        want.min(by_ub)
            .min(FIELD)
            .min(limit)
            .max(if by_ub == 0 { 0 } else { 1 })
    }

    fn build(&self, ctx: &LowerCtx<'_>) -> Result<Kernel, LowerError> {
        let core = &ctx.target.core;
        let probe = Tile::new(1, self.len);
        let r = self.rows_per_tile(core, &probe);
        let too_big = || {
            ctx.error(format!(
                "a row of {} elements does not fit in the {}-byte unified buffer (two tiles of \
                 at least one row plus scratch)",
                self.len, core.ub_bytes
            ))
        };
        if r == 0 {
            return Err(too_big());
        }
        let tile = Tile::new(r, self.len);
        let (tiles_total, tiles_per_group) = match self.map {
            TileMap::Plain => (self.rows.div_ceil(r), 0),
            TileMap::Grouped(g) => {
                let tpg = g.div_ceil(r);
                ((self.rows / g.max(1)) * tpg, tpg)
            }
        };
        let spread = Spread::new(tiles_total, core);
        let mut k = K::new(&self.name, core);
        k.a.tiling("rows", self.rows as i64);
        k.a.tiling("row_len", self.len as i64);
        k.a.tiling("rows_per_tile", r as i64);
        k.a.tiling("block_dim", i64::from(spread.blocks));
        k.a.tiling("tiles_per_block", spread.per_block as i64);
        k.a.tiling("row_walk", i64::from(tile.walk == Walk::Row));
        let ptr = args(&mut k, self.nargs);
        let row_bytes = round8(self.len) * F32;
        let alloc = |k: &mut K, bytes: u64| k.alloc(bytes).ok_or_else(too_big);
        let xb = [alloc(&mut k, r * row_bytes)?, alloc(&mut k, r * row_bytes)?];
        let mut tables = [Vec::new(), Vec::new()];
        let mut stats = [Vec::new(), Vec::new()];
        for b in 0..2 {
            for _ in &self.tables {
                tables[b].push(alloc(&mut k, r * units::BLOCK_BYTES)?);
            }
            for _ in &self.stats {
                stats[b].push(alloc(&mut k, round8(r) * F32)?);
            }
        }
        let colv: Vec<u64> = self
            .colv
            .iter()
            .map(|_| alloc(&mut k, row_bytes))
            .collect::<Result<_, _>>()?;
        let acc = alloc(&mut k, tile.acc_bytes())?;
        let f = alloc(&mut k, r * units::BLOCK_BYTES)?;
        let bc: Vec<u64> = (0..self.bcasts)
            .map(|_| alloc(&mut k, r * units::BLOCK_BYTES))
            .collect::<Result<_, _>>()?;
        k.a.tiling("ub_bytes", k.ub_used() as i64);
        // Vectors every row uses, once per block.
        if !colv.is_empty() {
            for (i, &a) in self.colv.iter().enumerate() {
                dma_rows(
                    &mut k,
                    true,
                    Addr::Ub(colv[i]),
                    ptr[a],
                    1,
                    self.len,
                    self.len,
                );
            }
            queue::barrier(&mut k.a, Pipe::Mte2, Pipe::V, 3);
        }
        let (jl, js) = (k.a.reg(), k.a.reg());
        spread.first(&mut k, jl);
        k.a.mov(js, jl);
        let (gx, gt) = (k.a.reg(), k.a.reg());
        let map = self.map;
        let rows = self.rows;
        let len = self.len;
        // gx = the tile's first row; gt = its first row within the group (tables).
        let locate = move |k: &mut K, j: Reg| match map {
            TileMap::Plain => {
                let t = k.tmp(1);
                k.mul_imm(t, j, r);
                k.min_imm(t, rows - r);
                k.a.mov(gx, t);
            }
            TileMap::Grouped(g) => {
                let (t0, t1) = (k.tmp(0), k.tmp(1));
                k.a.movi(t1, tiles_per_group as i64);
                k.a.divu(t0, j, t1);
                k.a.remu(gt, j, t1);
                k.mul_imm(gt, gt, r);
                k.min_imm(gt, g - r);
                k.mul_imm(t0, t0, g);
                k.a.add(gx, t0, gt);
            }
        };
        let load = |k: &mut K, b: usize, _: bool| {
            locate(k, jl);
            let g = k.tmp(2);
            k.mul_imm(gx, gx, len * F32);
            k.a.add(g, ptr[self.x], gx);
            dma_rows(k, true, Addr::Ub(xb[b]), g, r, len, len);
            for (i, &a) in self.tables.iter().enumerate() {
                let g = k.tmp(2);
                k.mul_imm(g, gt, units::BLOCK_BYTES);
                k.a.add(g, ptr[a], g);
                dma_rows(k, true, Addr::Ub(tables[b][i]), g, 1, r * BLK, r * BLK);
            }
            k.a.add_imm(jl, 1);
        };
        let compute = |k: &mut K, b: usize, _: bool| {
            let bufs = RowBufs {
                x: xb[b],
                tile,
                colv: colv.clone(),
                tables: tables[b].clone(),
                stats: stats[b].clone(),
                acc,
                f,
                b: bc.clone(),
            };
            (self.compute)(k, &bufs);
        };
        let store = |k: &mut K, b: usize, _: bool| {
            locate(k, js);
            if let Some(y) = self.y {
                let g = k.tmp(2);
                k.mul_imm(g, gx, len * F32);
                k.a.add(g, ptr[y], g);
                dma_rows(k, false, Addr::Ub(xb[b]), g, r, len, len);
            }
            for (i, &a) in self.stats.iter().enumerate() {
                let g = k.tmp(2);
                k.mul_imm(g, gx, F32);
                k.a.add(g, ptr[a], g);
                dma_rows(k, false, Addr::Ub(stats[b][i]), g, 1, r, r);
            }
            k.a.add_imm(js, 1);
        };
        let flow = Flow {
            tiles: spread.per_block,
            load: &load,
            compute: &compute,
            store: Some(&store),
        };
        flow_init(&mut k, true);
        flow.emit(&mut k);
        flow_fini(&mut k, true);
        finish(ctx, k, spread.blocks, Vec::new())
    }
}

// ---- Softmax ------------------------------------------------------------------------------------

/// Softmax over one axis (opset-13 semantics): max, subtract, exp, sum, multiply by the
/// reciprocal.
fn softmax(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    need_f32(ctx, x, "the input")?;
    let d = dims(ctx, x)?;
    if d.is_empty() {
        return Err(ctx.error("Softmax needs an axis; the input is a scalar"));
    }
    let axis = axis_of(ctx, int_attr(ctx, "axis", -1), d.len())?;
    let o: u64 = d[..axis].iter().product();
    let l = d[axis];
    let i: u64 = d[axis + 1..].iter().product();
    if o * l * i == 0 {
        return Ok(no_kernels());
    }
    let args = vec![Operand::Input(0), Operand::Output(0)];
    let kernel = if i == 1 {
        let compute = |k: &mut K, s: &RowBufs| {
            s.tile.each(k, &|k, v| {
                v.fold(k, ReduceOp::Max, s.x, false, s.acc, s.f);
                v.bcast(k, ReduceOp::Max, s.b[0], s.f);
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vsub),
                    s.x,
                    Arg::Mat(s.x),
                    Some(Arg::RowB(s.b[0])),
                );
                v.ew(k, VOp::Un(ProgramBuilder::vexp), s.x, Arg::Mat(s.x), None);
                v.fold(k, ReduceOp::Sum, s.x, false, s.acc, s.f);
                v.bcast(k, ReduceOp::Sum, s.b[0], s.f);
                v.rowb(k, VOp::Un(ProgramBuilder::vrec), s.b[0], s.b[0], None);
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vmul),
                    s.x,
                    Arg::Mat(s.x),
                    Some(Arg::RowB(s.b[0])),
                );
            });
        };
        RowKernel {
            name: kernel_name(ctx, ""),
            rows: o,
            len: l,
            map: TileMap::Plain,
            x: 0,
            y: Some(1),
            stats: Vec::new(),
            colv: Vec::new(),
            tables: Vec::new(),
            bcasts: 1,
            nargs: 2,
            compute: &compute,
        }
        .build(ctx)?
    } else {
        col_softmax(ctx, o, l, i)?
    };
    let mut kernel = kernel;
    kernel.args = args;
    Ok(Lowered::Kernels {
        kernels: vec![kernel],
        derived: Vec::new(),
        workspace_bytes: 0,
    })
}

/// Softmax over a middle axis of [O, L, I]: items are [L, Ic] slabs (columns Ic of one o),
/// resident in UB; column statistics by halving over rows.
fn col_softmax(ctx: &LowerCtx<'_>, o: u64, l: u64, i: u64) -> Result<Kernel, LowerError> {
    let core = &ctx.target.core;
    // Two slabs plus a half-slab of scratch per column: choose the widest Ic that fits, then
    // narrow it so every block has a slab.
    let per_col = (2 * l + l.div_ceil(2) + 2) * F32;
    let budget = core.ub_bytes.saturating_sub(UB_SLACK + 4096);
    let max_ic = (budget / per_col.max(1)) / BLK * BLK;
    if max_ic < BLK {
        return Err(ctx.error(format!(
            "a softmax axis of {l} elements over an inner size of {i} does not fit in the \
             {}-byte unified buffer (two [{l}, 8] slabs plus scratch)",
            core.ub_bytes
        )));
    }
    let cores = core.vector_blocks();
    let want = if o >= cores {
        i
    } else {
        round8(i.div_ceil(cores.div_ceil(o))).max(REP.min(round8(i)))
    };
    let ic = want.min(max_ic).min(i);
    let icp = round8(ic);
    let nit = i.div_ceil(ic);
    let spread = Spread::new(o * nit, core);
    let mut k = K::new(&kernel_name(ctx, "columns"), core);
    k.a.tiling("outer", o as i64);
    k.a.tiling("axis_len", l as i64);
    k.a.tiling("inner", i as i64);
    k.a.tiling("columns_per_item", ic as i64);
    k.a.tiling("block_dim", i64::from(spread.blocks));
    k.a.tiling("items_per_block", spread.per_block as i64);
    let ptr = args(&mut k, 2);
    let slab = l * icp * F32;
    let err = || ctx.error("the softmax slabs do not fit in the unified buffer");
    let xb = [
        k.alloc(slab).ok_or_else(err)?,
        k.alloc(slab).ok_or_else(err)?,
    ];
    let s = k.alloc(l.div_ceil(2) * icp * F32).ok_or_else(err)?;
    let (jl, js, g) = (k.a.reg(), k.a.reg(), k.a.reg());
    spread.first(&mut k, jl);
    k.a.mov(js, jl);
    // g = the slab's first element: (item / nit) * L * I + min((item % nit) * Ic, I - Ic).
    let locate = move |k: &mut K, j: Reg| {
        let (t0, t1) = (k.tmp(0), k.tmp(1));
        k.a.movi(t1, nit as i64);
        k.a.divu(t0, j, t1);
        k.a.remu(g, j, t1);
        k.mul_imm(g, g, ic);
        k.min_imm(g, i - ic);
        k.mul_imm(t0, t0, l * i);
        k.a.add(g, g, t0);
        k.mul_imm(g, g, F32);
    };
    let tile = Tile::new(l, ic);
    let walk_cost_chunk = ic.div_ceil(REP) * l.div_ceil(FIELD);
    let tile = Tile {
        walk: if tile.walk == Walk::Chunk && walk_cost_chunk <= l {
            Walk::Chunk
        } else {
            Walk::Row
        },
        ..tile
    };
    let load = |k: &mut K, b: usize, _: bool| {
        locate(k, jl);
        let t = k.tmp(2);
        k.a.add(t, ptr[0], g);
        dma_rows(k, true, Addr::Ub(xb[b]), t, l, ic, i);
        k.a.add_imm(jl, 1);
    };
    let compute = |k: &mut K, b: usize, _: bool| {
        let x = xb[b];
        col_fold(k, ProgramBuilder::vmax, s, x, l, icp);
        tile.each(k, &|k, v| {
            v.ew(
                k,
                VOp::Bin(ProgramBuilder::vsub),
                x,
                Arg::Mat(x),
                Some(Arg::ColV(s)),
            );
            v.ew(k, VOp::Un(ProgramBuilder::vexp), x, Arg::Mat(x), None);
        });
        col_fold(k, ProgramBuilder::vadd, s, x, l, icp);
        k.vun(
            ProgramBuilder::vrec,
            Opd::ub(s),
            Opd::ub(s),
            Mask::Count(icp),
            1,
        );
        tile.each(k, &|k, v| {
            v.ew(
                k,
                VOp::Bin(ProgramBuilder::vmul),
                x,
                Arg::Mat(x),
                Some(Arg::ColV(s)),
            );
        });
    };
    let store = |k: &mut K, b: usize, _: bool| {
        locate(k, js);
        let t = k.tmp(2);
        k.a.add(t, ptr[1], g);
        dma_rows(k, false, Addr::Ub(xb[b]), t, l, ic, i);
        k.a.add_imm(js, 1);
    };
    let flow = Flow {
        tiles: spread.per_block,
        load: &load,
        compute: &compute,
        store: Some(&store),
    };
    flow_init(&mut k, true);
    flow.emit(&mut k);
    flow_fini(&mut k, true);
    finish(ctx, k, spread.blocks, Vec::new())
}

// ---- LayerNormalization -------------------------------------------------------------------------

/// A parameter vector of the normalised length: the input itself when it has every element,
/// else (a constant that broadcasts) expanded at compile time into a derived tensor.
fn param_vector(
    ctx: &LowerCtx<'_>,
    idx: usize,
    norm: &[u64],
    derived: &mut Vec<Tensor>,
) -> Result<Option<Operand>, LowerError> {
    let Some(desc) = ctx.inputs.get(idx).copied().flatten() else {
        return Ok(None);
    };
    need_f32(ctx, desc, &format!("input {idx}"))?;
    let n: u64 = norm.iter().product();
    let pd = dims(ctx, desc)?;
    if pd.iter().product::<u64>() == n {
        return Ok(Some(Operand::Input(idx)));
    }
    let Some(value) = ctx.values.get(idx).copied().flatten() else {
        return Err(ctx.error(format!(
            "input {idx} of shape {pd:?} broadcasts to the normalised shape {norm:?}; only a \
             constant can be broadcast (at compile time)"
        )));
    };
    let v = value.to_f64s();
    // Broadcast pd (right-aligned) over norm.
    let off = norm.len() - pd.len();
    let mut out = Vec::with_capacity(n as usize);
    for e in 0..n {
        let mut rem = e;
        let mut src = 0u64;
        let mut stride = 1u64;
        for a in (0..norm.len()).rev() {
            let c = rem % norm[a];
            rem /= norm[a];
            if a >= off {
                let pdim = pd[a - off];
                if pdim != 1 {
                    src += c * stride;
                }
                stride *= pdim;
            }
        }
        out.push(v[src as usize] as f32);
    }
    derived.push(Tensor::from_f32s(vec![n as i64], &out));
    Ok(Some(Operand::Derived(derived.len() - 1)))
}

/// LayerNormalization over the trailing axes from `axis`: mean, centred values, variance as
/// the mean of squares of the centred values, reciprocal square root, Scale and B.
fn layer_norm(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    need_f32(ctx, x, "the input")?;
    let d = dims(ctx, x)?;
    if d.is_empty() {
        return Err(ctx.error("LayerNormalization needs a tensor, got a scalar"));
    }
    let axis = axis_of(ctx, int_attr(ctx, "axis", -1), d.len())?;
    let eps = float_attr(ctx, "epsilon", 1e-5);
    let rows: u64 = d[..axis].iter().product();
    let l: u64 = d[axis..].iter().product();
    if rows * l == 0 {
        return Ok(no_kernels());
    }
    let mut derived = Vec::new();
    let scale = param_vector(ctx, 1, &d[axis..], &mut derived)?;
    let bias = param_vector(ctx, 2, &d[axis..], &mut derived)?;
    let nout = ctx.outputs.len();
    for o in ctx.outputs.iter().skip(1) {
        need_f32(ctx, o, "a statistics output")?;
    }
    // Arguments: x, y, [mean], [inv_std], [scale], [bias].
    let mut args = vec![Operand::Input(0), Operand::Output(0)];
    let stats: Vec<usize> = (1..nout)
        .map(|o| {
            args.push(Operand::Output(o));
            args.len() - 1
        })
        .collect();
    let mut colv = Vec::new();
    for p in [scale, bias].into_iter().flatten() {
        args.push(p);
        colv.push(args.len() - 1);
    }
    let (has_scale, has_bias) = (scale.is_some(), bias.is_some());
    let inv_l = 1.0 / l as f32;
    let compute = move |k: &mut K, s: &RowBufs| {
        let (il, ep) = (k.f32_reg(inv_l), k.f32_reg(eps));
        let (mean, rstd) = (s.b[0], s.b[1]);
        s.tile.each(k, &|k, v| {
            v.fold(k, ReduceOp::Sum, s.x, false, s.acc, s.f);
            v.bcast(k, ReduceOp::Sum, mean, s.f);
            v.rowb(
                k,
                VOp::Scalar(ProgramBuilder::vmuls),
                mean,
                mean,
                Some(Arg::Scalar(il)),
            );
            v.ew(
                k,
                VOp::Bin(ProgramBuilder::vsub),
                s.x,
                Arg::Mat(s.x),
                Some(Arg::RowB(mean)),
            );
            v.fold(k, ReduceOp::Sum, s.x, true, s.acc, s.f);
            v.bcast(k, ReduceOp::Sum, rstd, s.f);
            v.rowb(
                k,
                VOp::Scalar(ProgramBuilder::vmuls),
                rstd,
                rstd,
                Some(Arg::Scalar(il)),
            );
            v.rowb(
                k,
                VOp::Scalar(ProgramBuilder::vadds),
                rstd,
                rstd,
                Some(Arg::Scalar(ep)),
            );
            v.rowb(k, VOp::Un(ProgramBuilder::vsqrt), rstd, rstd, None);
            v.rowb(k, VOp::Un(ProgramBuilder::vrec), rstd, rstd, None);
            v.ew(
                k,
                VOp::Bin(ProgramBuilder::vmul),
                s.x,
                Arg::Mat(s.x),
                Some(Arg::RowB(rstd)),
            );
            if has_scale {
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vmul),
                    s.x,
                    Arg::Mat(s.x),
                    Some(Arg::ColV(s.colv[0])),
                );
            }
            if has_bias {
                let c = s.colv[usize::from(has_scale)];
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vadd),
                    s.x,
                    Arg::Mat(s.x),
                    Some(Arg::ColV(c)),
                );
            }
        });
        for (i, &out) in s.stats.iter().enumerate() {
            s.tile
                .scalars(k, ReduceOp::Max, out, if i == 0 { mean } else { rstd });
        }
    };
    let nargs = args.len();
    let mut kernel = RowKernel {
        name: kernel_name(ctx, ""),
        rows,
        len: l,
        map: TileMap::Plain,
        x: 0,
        y: Some(1),
        stats,
        colv,
        tables: Vec::new(),
        bcasts: 2,
        nargs,
        compute: &compute,
    }
    .build(ctx)?;
    kernel.args = args;
    Ok(Lowered::Kernels {
        kernels: vec![kernel],
        derived,
        workspace_bytes: 0,
    })
}

// ---- BatchNormalization -------------------------------------------------------------------------

/// BatchNormalization in inference mode: y = x * a_c + b_c with a = scale / sqrt(var + eps),
/// b = B - mean * a. Constant parameters are folded at compile time into per-channel tables of
/// broadcast blocks (eight copies per channel); runtime ones go through a one-block kernel that
/// builds the same tables in the workspace.
fn batch_norm(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    need_f32(ctx, x, "the input")?;
    if ctx.outputs.len() > 1 {
        return Err(ctx.error(
            "the optional running-statistics outputs of BatchNormalization have no kernel \
             (inference mode produces only Y)",
        ));
    }
    let d = dims(ctx, x)?;
    if d.len() < 2 {
        return Err(ctx.error("BatchNormalization needs a tensor of rank 2 or more"));
    }
    let (n, c) = (d[0], d[1]);
    let s: u64 = d[2..].iter().product();
    if n * c * s == 0 {
        return Ok(no_kernels());
    }
    for i in 1..5 {
        need_f32(ctx, ctx.input(i)?, &format!("input {i}"))?;
    }
    let eps = float_attr(ctx, "epsilon", 1e-5);
    let consts: Option<Vec<Vec<f64>>> = (1..5)
        .map(|i| ctx.values.get(i).copied().flatten().map(Tensor::to_f64s))
        .collect();
    // S == 1: rows are samples, columns channels, a and b are plain [C] vectors.
    let vectors = s == 1;
    let mut kernels = Vec::new();
    let mut derived = Vec::new();
    let mut workspace = 0;
    let (ta, tb) = match consts {
        Some(p) => {
            let (mut av, mut bv) = (Vec::new(), Vec::new());
            let per_channel = p[0].iter().zip(&p[1]).zip(&p[2]).zip(&p[3]);
            for (((scale, bias), mean), var) in per_channel.take(c as usize) {
                let a = scale / (var + f64::from(eps)).sqrt();
                let b = bias - mean * a;
                let copies = if vectors { 1 } else { BLK as usize };
                av.extend(std::iter::repeat_n(a as f32, copies));
                bv.extend(std::iter::repeat_n(b as f32, copies));
            }
            derived.push(Tensor::from_f32s(vec![av.len() as i64], &av));
            derived.push(Tensor::from_f32s(vec![bv.len() as i64], &bv));
            (Operand::Derived(0), Operand::Derived(1))
        }
        None => {
            let per = if vectors {
                c * F32
            } else {
                c * units::BLOCK_BYTES
            };
            let per = per.div_ceil(units::BLOCK_BYTES) * units::BLOCK_BYTES;
            kernels.push(bn_params(ctx, c, eps, vectors)?);
            workspace = 2 * per;
            (Operand::Workspace(0), Operand::Workspace(per))
        }
    };
    let main = if vectors {
        let compute = |k: &mut K, b: &RowBufs| {
            b.tile.each(k, &|k, v| {
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vmul),
                    b.x,
                    Arg::Mat(b.x),
                    Some(Arg::ColV(b.colv[0])),
                );
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vadd),
                    b.x,
                    Arg::Mat(b.x),
                    Some(Arg::ColV(b.colv[1])),
                );
            });
        };
        let mut kern = RowKernel {
            name: kernel_name(ctx, ""),
            rows: n,
            len: c,
            map: TileMap::Plain,
            x: 0,
            y: Some(1),
            stats: Vec::new(),
            colv: vec![2, 3],
            tables: Vec::new(),
            bcasts: 0,
            nargs: 4,
            compute: &compute,
        }
        .build(ctx)?;
        kern.args = vec![Operand::Input(0), Operand::Output(0), ta, tb];
        kern
    } else {
        let compute = |k: &mut K, b: &RowBufs| {
            b.tile.each(k, &|k, v| {
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vmul),
                    b.x,
                    Arg::Mat(b.x),
                    Some(Arg::RowB(b.tables[0])),
                );
                v.ew(
                    k,
                    VOp::Bin(ProgramBuilder::vadd),
                    b.x,
                    Arg::Mat(b.x),
                    Some(Arg::RowB(b.tables[1])),
                );
            });
        };
        let mut kern = RowKernel {
            name: kernel_name(ctx, ""),
            rows: n * c,
            len: s,
            map: TileMap::Grouped(c),
            x: 0,
            y: Some(1),
            stats: Vec::new(),
            colv: Vec::new(),
            tables: vec![2, 3],
            bcasts: 0,
            nargs: 4,
            compute: &compute,
        }
        .build(ctx)?;
        kern.args = vec![Operand::Input(0), Operand::Output(0), ta, tb];
        kern
    };
    kernels.push(main);
    Ok(Lowered::Kernels {
        kernels,
        derived,
        workspace_bytes: workspace,
    })
}

/// The one-block kernel that turns runtime BatchNormalization parameters into a and b: plain
/// [C] vectors, or tables of broadcast blocks. A table is built lane by lane: a vbreduce whose
/// mask enables lane t of every block, reading one block per repeat with block stride 0,
/// writes eight copies of element 8r+t as block r; a DMA with a 7-block gap then puts block r
/// at channel 8r+t of the table in GM.
fn bn_params(ctx: &LowerCtx<'_>, c: u64, eps: f32, vectors: bool) -> Result<Kernel, LowerError> {
    let core = &ctx.target.core;
    let mut k = K::new(&kernel_name(ctx, "params"), core);
    k.a.tiling("channels", c as i64);
    let cp = round8(c);
    let vb = cp * F32;
    let blocks = cp / BLK;
    let need = 6 * vb
        + if vectors {
            0
        } else {
            2 * BLK * blocks * units::BLOCK_BYTES
        };
    let err = || {
        ctx.error(format!(
            "runtime BatchNormalization parameters for {c} channels do not fit in the \
             {}-byte unified buffer ({need} bytes); give them as constants",
            core.ub_bytes
        ))
    };
    // Arguments: scale, B, mean, var, a out, b out.
    let ptr = args(&mut k, 6);
    let v: Vec<u64> = (0..6)
        .map(|_| k.alloc(vb).ok_or_else(err))
        .collect::<Result<_, _>>()?;
    for i in 0..4 {
        dma_rows(&mut k, true, Addr::Ub(v[i]), ptr[i], 1, c, c);
    }
    queue::barrier(&mut k.a, Pipe::Mte2, Pipe::V, 0);
    let m = Mask::Count(cp);
    let e = k.f32_reg(eps);
    // a = scale / sqrt(var + eps); b = B - mean * a.
    k.vsc(ProgramBuilder::vadds, Opd::ub(v[4]), Opd::ub(v[3]), e, m, 1);
    k.vun(ProgramBuilder::vsqrt, Opd::ub(v[4]), Opd::ub(v[4]), m, 1);
    k.vbin(
        ProgramBuilder::vdiv,
        Opd::ub(v[4]),
        Opd::ub(v[0]),
        Opd::ub(v[4]),
        m,
        1,
    );
    k.vbin(
        ProgramBuilder::vmul,
        Opd::ub(v[5]),
        Opd::ub(v[2]),
        Opd::ub(v[4]),
        m,
        1,
    );
    k.vbin(
        ProgramBuilder::vsub,
        Opd::ub(v[5]),
        Opd::ub(v[1]),
        Opd::ub(v[5]),
        m,
        1,
    );
    if vectors {
        queue::barrier(&mut k.a, Pipe::V, Pipe::Mte3, 0);
        for (i, out) in [(4, 4), (5, 5)] {
            dma_rows(&mut k, false, Addr::Ub(v[i]), ptr[out], 1, c, c);
        }
    } else {
        let tables: Vec<u64> = (0..2 * BLK)
            .map(|_| k.alloc(blocks * units::BLOCK_BYTES).ok_or_else(err))
            .collect::<Result<_, _>>()?;
        for (p, src) in [v[4], v[5]].into_iter().enumerate() {
            for lane in 0..BLK {
                let t = tables[p * BLK as usize + lane as usize];
                let mut done = 0;
                while done < blocks {
                    let nrep = (blocks - done).min(FIELD);
                    let s = Opd {
                        at: Addr::Ub(src + done * units::BLOCK_BYTES),
                        blk: 0,
                        rep: 1,
                    };
                    k.vred(
                        true,
                        ReduceOp::Sum,
                        Addr::Ub(t + done * units::BLOCK_BYTES),
                        s,
                        1,
                        Mask::lane_of_blocks(&[lane]),
                        nrep,
                    );
                    done += nrep;
                }
            }
        }
        queue::barrier(&mut k.a, Pipe::V, Pipe::Mte3, 0);
        for p in 0..2usize {
            for lane in 0..BLK {
                let t = tables[p * BLK as usize + lane as usize];
                let nb = c.saturating_sub(lane).div_ceil(BLK);
                if nb == 0 {
                    continue;
                }
                let g = k.tmp(1);
                k.gm_off(g, ptr[4 + p], lane * units::BLOCK_BYTES);
                let u = k.tmp(0);
                k.a.movi(u, t as i64);
                let mut done = 0;
                while done < nb {
                    let n = (nb - done).min(MAX_BURSTS);
                    k.a.copy_ub_to_gm(g, u, n, 1).dst_gap(BLK - 1);
                    k.a.add_imm(g, (n * BLK * units::BLOCK_BYTES) as i64);
                    k.a.add_imm(u, (n * units::BLOCK_BYTES) as i64);
                    done += n;
                }
            }
        }
    }
    let mut kern = finish(ctx, k, 1, Vec::new())?;
    let per = if vectors {
        c * F32
    } else {
        c * units::BLOCK_BYTES
    }
    .div_ceil(units::BLOCK_BYTES)
        * units::BLOCK_BYTES;
    kern.args = vec![
        Operand::Input(1),
        Operand::Input(2),
        Operand::Input(3),
        Operand::Input(4),
        Operand::Workspace(0),
        Operand::Workspace(per),
    ];
    Ok(kern)
}

// ---- ReduceMean / ReduceSum ---------------------------------------------------------------------

/// One reduction pass: [o, l, i] summed over l (then times `scale`), from `src` to `dst`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pass {
    /// Outer size.
    pub o: u64,
    /// Reduced length.
    pub l: u64,
    /// Inner size.
    pub i: u64,
    /// The reduction (Sum for ReduceSum and ReduceMean).
    pub op: ReduceOp,
    /// Factor applied to the sums (ReduceMean's 1 / count on the last pass).
    pub scale: Option<f32>,
    /// Where the input is.
    pub src: Operand,
    /// Where the output goes.
    pub dst: Operand,
}

/// Rows of at most this many elements are reduced resident in UB (chunk walk).
const RESIDENT_ROW: u64 = FIELD * BLK;

/// ReduceMean, ReduceSum, ReduceMax and ReduceMin over any set of axes.
fn reduce(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    // The maximum and minimum of booleans (any / all) through f32, which holds 0 and 1.
    if x.dtype == DataType::Bool && matches!(ctx.node.op.as_str(), "ReduceMax" | "ReduceMin") {
        return super::through_type(ctx, DataType::F32);
    }
    need_f32(ctx, x, "the input")?;
    let d = dims(ctx, x)?;
    let r = d.len();
    let noop = int_attr(ctx, "noop_with_empty_axes", 0) != 0;
    let axes: Vec<i64> = if let Some(a) = ctx.node.ints("axes") {
        a.to_vec()
    } else if ctx.inputs.get(1).copied().flatten().is_some() {
        ctx.values
            .get(1)
            .copied()
            .flatten()
            .ok_or_else(|| ctx.error("the axes input must be a constant"))?
            .to_i64s()
    } else {
        Vec::new()
    };
    if axes.is_empty() && noop {
        return Ok(Lowered::Alias { input: 0 });
    }
    let mut red = vec![axes.is_empty(); r];
    for a in &axes {
        red[axis_of(ctx, *a, r)?] = true;
    }
    let mean = ctx.node.op == "ReduceMean";
    let op = match ctx.node.op.as_str() {
        "ReduceMax" => ReduceOp::Max,
        "ReduceMin" => ReduceOp::Min,
        _ => ReduceOp::Sum,
    };
    reduce_lowered(ctx, &d, &red, mean, op)
}

/// Kernels reducing dims `d` over the axes flagged in `red` with `op` (the mean when `mean`),
/// from input 0 to output 0.
pub(super) fn reduce_lowered(
    ctx: &LowerCtx<'_>,
    d: &[u64],
    red: &[bool],
    mean: bool,
    op: ReduceOp,
) -> Result<Lowered, LowerError> {
    let total: u64 = d.iter().product();
    let out: u64 = d
        .iter()
        .zip(red)
        .filter(|(_, r)| !**r)
        .map(|(v, _)| *v)
        .product();
    let count: u64 = d
        .iter()
        .zip(red)
        .filter(|(_, r)| **r)
        .map(|(v, _)| *v)
        .product();
    if out == 0 {
        return Ok(no_kernels());
    }
    if total == 0 {
        // A reduction over an empty axis: the sum is 0, the mean 0/0, the maximum -inf and
        // the minimum +inf (the identities, as ONNX defines them from opset 18 on).
        let v = match op {
            _ if mean => f32::NAN,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
            ReduceOp::Sum => 0.0,
        };
        return Ok(Lowered::Kernels {
            kernels: vec![fill(ctx, out, v)?],
            derived: Vec::new(),
            workspace_bytes: 0,
        });
    }
    // Merge adjacent dims of the same kind, dropping dims of size 1.
    let mut groups: Vec<(u64, bool)> = Vec::new();
    for (&v, &r) in d.iter().zip(red) {
        if v == 1 {
            continue;
        }
        match groups.last_mut() {
            Some((s, k)) if *k == r => *s *= v,
            _ => groups.push((v, r)),
        }
    }
    if !groups.iter().any(|g| g.1) {
        return Ok(Lowered::Alias { input: 0 });
    }
    let core = &ctx.target.core;
    let cores = core.vector_blocks();
    // Passes, innermost reduced group first; each may first split a long axis over blocks.
    let mut shapes: Vec<(u64, u64, u64)> = Vec::new();
    while let Some(j) = groups.iter().rposition(|g| g.1) {
        let o: u64 = groups[..j].iter().map(|g| g.0).product();
        let l = groups[j].0;
        let i: u64 = groups[j + 1..].iter().map(|g| g.0).product();
        let items = if i == 1 { o } else { o * i.div_ceil(2048) };
        let min_seg = if i == 1 { 4 * RESIDENT_ROW } else { 64 };
        if items < cores {
            let want = cores / items.max(1);
            if let Some(sg) = (2..=want.min(l))
                .rev()
                .find(|s| l.is_multiple_of(*s) && l / s >= min_seg)
            {
                shapes.push((o * sg, l / sg, i));
                shapes.push((o, sg, i));
                groups.remove(j);
                merge(&mut groups);
                continue;
            }
        }
        shapes.push((o, l, i));
        groups.remove(j);
        merge(&mut groups);
    }
    // Workspace: two ping-pong regions for the intermediate results.
    let inter: Vec<u64> = shapes.iter().map(|(o, _, i)| o * i * F32).collect();
    let region = inter[..inter.len() - 1]
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .div_ceil(units::BLOCK_BYTES)
        * units::BLOCK_BYTES;
    let mut kernels = Vec::new();
    let mut src = Operand::Input(0);
    for (p, &(o, l, i)) in shapes.iter().enumerate() {
        let last = p + 1 == shapes.len();
        let dst = if last {
            Operand::Output(0)
        } else {
            Operand::Workspace((p as u64 % 2) * region)
        };
        let pass = Pass {
            o,
            l,
            i,
            op,
            scale: (last && mean).then(|| 1.0 / count as f32),
            src,
            dst,
        };
        kernels.push(reduce_pass(ctx, &pass, p)?);
        src = dst;
    }
    let workspace = if shapes.len() > 1 {
        region * 2.min(shapes.len() as u64 - 1)
    } else {
        0
    };
    Ok(Lowered::Kernels {
        kernels,
        derived: Vec::new(),
        workspace_bytes: workspace,
    })
}

fn merge(groups: &mut Vec<(u64, bool)>) {
    let mut out: Vec<(u64, bool)> = Vec::new();
    for &(v, r) in groups.iter() {
        match out.last_mut() {
            Some((s, k)) if *k == r => *s *= v,
            _ => out.push((v, r)),
        }
    }
    *groups = out;
}

/// The kernel of one reduction pass.
pub(super) fn reduce_pass(
    ctx: &LowerCtx<'_>,
    p: &Pass,
    index: usize,
) -> Result<Kernel, LowerError> {
    let suffix = format!("pass{index}");
    let mut kern = if p.i > 1 {
        col_reduce(ctx, p, &suffix)?
    } else if p.l <= RESIDENT_ROW {
        let (scale, op) = (p.scale, p.op);
        let compute = move |k: &mut K, s: &RowBufs| {
            s.tile
                .each(k, &|k, v| v.fold(k, op, s.x, false, s.acc, s.f));
            s.tile.scalars(k, op, s.stats[0], s.f);
            if let Some(sc) = scale {
                let r = k.f32_reg(sc);
                k.vsc(
                    ProgramBuilder::vmuls,
                    Opd::ub(s.stats[0]),
                    Opd::ub(s.stats[0]),
                    r,
                    Mask::Count(s.tile.rows),
                    1,
                );
            }
        };
        RowKernel {
            name: kernel_name(ctx, &suffix),
            rows: p.o,
            len: p.l,
            map: TileMap::Plain,
            x: 0,
            y: None,
            stats: vec![1],
            colv: Vec::new(),
            tables: Vec::new(),
            bcasts: 0,
            nargs: 2,
            compute: &compute,
        }
        .build(ctx)?
    } else {
        long_rows(ctx, p, &suffix)?
    };
    kern.args = vec![p.src, p.dst];
    Ok(kern)
}

/// Rows too long for UB: each row (one item) streams through in chunks that add into a wide
/// accumulator; the accumulator is halved and reduced to the row's sum at the end.
fn long_rows(ctx: &LowerCtx<'_>, p: &Pass, suffix: &str) -> Result<Kernel, LowerError> {
    let core = &ctx.target.core;
    let budget = core.ub_bytes.saturating_sub(UB_SLACK + 64);
    let mut chunk = 16384u64;
    while chunk > REP && 3 * chunk * F32 > budget {
        chunk /= 2;
    }
    let chunk = chunk.min(p.l.next_power_of_two().max(REP));
    let spread = Spread::new(p.o, core);
    let mut k = K::new(&kernel_name(ctx, suffix), core);
    k.a.tiling("rows", p.o as i64);
    k.a.tiling("row_len", p.l as i64);
    k.a.tiling("chunk", chunk as i64);
    k.a.tiling("block_dim", i64::from(spread.blocks));
    k.a.tiling("rows_per_block", spread.per_block as i64);
    let err = || ctx.error("the reduction chunks do not fit in the unified buffer");
    let ptr = args(&mut k, 2);
    let xb = [
        k.alloc(chunk * F32).ok_or_else(err)?,
        k.alloc(chunk * F32).ok_or_else(err)?,
    ];
    let acc = k.alloc(chunk * F32).ok_or_else(err)?;
    let slot = k.alloc(units::BLOCK_BYTES).ok_or_else(err)?;
    let tiles = p.l.div_ceil(chunk);
    let last_len = p.l - (tiles - 1) * chunk;
    let (item, g, items) = (k.a.reg(), k.a.reg(), k.a.reg());
    spread.first(&mut k, item);
    let (vop, ident) = fold_op(p.op);
    let zero = k.a.constant(i64::from(ident));
    let scale = p.scale.map(|s| k.f32_reg(s));
    let l = p.l;
    let op = p.op;
    flow_init(&mut k, false);
    VECOUT.free(&mut k.a, OUT_FLAG);
    repeat_loop(&mut k, items, spread.per_block, &|k| {
        k.mul_imm(g, item, l * F32);
        k.a.add(g, ptr[0], g);
        k.vdup(Opd::ub(acc), zero, Mask::Count(chunk), 1);
        let load = |k: &mut K, b: usize, last: bool| {
            let n = if last { last_len } else { chunk };
            dma_rows(k, true, Addr::Ub(xb[b]), g, 1, n, n);
            k.a.add_imm(g, (chunk * F32) as i64);
        };
        let compute = |k: &mut K, b: usize, last: bool| {
            let n = if last { last_len } else { chunk };
            k.vbin(
                vop,
                Opd::ub(acc),
                Opd::ub(acc),
                Opd::ub(xb[b]),
                Mask::Count(n),
                1,
            );
        };
        Flow {
            tiles,
            load: &load,
            compute: &compute,
            store: None,
        }
        .emit(k);
        halve(k, vop, acc, chunk, REP);
        VECOUT.alloc(&mut k.a, OUT_FLAG);
        k.vred(
            false,
            op,
            Addr::Ub(slot),
            Opd::ub(acc),
            1,
            Mask::Count(REP),
            1,
        );
        if let Some(s) = scale {
            k.vsc(
                ProgramBuilder::vmuls,
                Opd::ub(slot),
                Opd::ub(slot),
                s,
                Mask::Count(BLK),
                1,
            );
        }
        VECOUT.enque(&mut k.a, OUT_FLAG);
        VECOUT.deque(&mut k.a, OUT_FLAG);
        let t = k.tmp(1);
        k.mul_imm(t, item, F32);
        k.a.add(t, ptr[1], t);
        dma_rows(k, false, Addr::Ub(slot), t, 1, 1, 1);
        VECOUT.free(&mut k.a, OUT_FLAG);
        k.a.add_imm(item, 1);
    });
    VECOUT.alloc(&mut k.a, OUT_FLAG);
    flow_fini(&mut k, false);
    finish(ctx, k, spread.blocks, Vec::new())
}

/// A reduction over a middle axis of [O, L, I]: items are (o, column tile of Ic); each streams
/// [Lc, Ic] slabs, halves them over rows and adds the row into an accumulator.
fn col_reduce(ctx: &LowerCtx<'_>, p: &Pass, suffix: &str) -> Result<Kernel, LowerError> {
    let core = &ctx.target.core;
    let cores = core.vector_blocks();
    let (o, l, i) = (p.o, p.l, p.i);
    let budget = core.ub_bytes.saturating_sub(UB_SLACK + 64);
    // Column tile: as wide as 4096 columns, narrowed (to at least 64) so blocks get items.
    let mut ic = i.min(4096);
    if o * i.div_ceil(ic) < cores {
        let split = cores.div_ceil(o);
        ic = ic.min(round8(i.div_ceil(split)).max(REP)).min(i);
    }
    let icp = round8(ic);
    let row = icp * F32;
    // Rows per slab: two slabs plus the accumulator and output row fit.
    let lc = ((budget.saturating_sub(2 * row)) / (2 * row))
        .min(l)
        .min(MAX_BURSTS);
    if lc == 0 {
        return Err(ctx.error("the reduction slabs do not fit in the unified buffer"));
    }
    let nit = i.div_ceil(ic);
    let spread = Spread::new(o * nit, core);
    let mut k = K::new(&kernel_name(ctx, suffix), core);
    k.a.tiling("outer", o as i64);
    k.a.tiling("axis_len", l as i64);
    k.a.tiling("inner", i as i64);
    k.a.tiling("columns_per_item", ic as i64);
    k.a.tiling("rows_per_slab", lc as i64);
    k.a.tiling("block_dim", i64::from(spread.blocks));
    k.a.tiling("items_per_block", spread.per_block as i64);
    let err = || ctx.error("the reduction slabs do not fit in the unified buffer");
    let ptr = args(&mut k, 2);
    let xb = [
        k.alloc(lc * row).ok_or_else(err)?,
        k.alloc(lc * row).ok_or_else(err)?,
    ];
    let acc = k.alloc(row).ok_or_else(err)?;
    let outb = k.alloc(row).ok_or_else(err)?;
    let tiles = l.div_ceil(lc);
    let last_rows = l - (tiles - 1) * lc;
    let (item, g, gy, items) = (k.a.reg(), k.a.reg(), k.a.reg(), k.a.reg());
    spread.first(&mut k, item);
    let (vop, ident) = fold_op(p.op);
    let zero = k.a.constant(i64::from(ident));
    let scale = p.scale.map(|s| k.f32_reg(s));
    flow_init(&mut k, false);
    VECOUT.free(&mut k.a, OUT_FLAG);
    repeat_loop(&mut k, items, spread.per_block, &|k| {
        // g = x + (o * L * I + i0) * 4, gy = y + (o * I + i0) * 4.
        let (t0, t1) = (k.tmp(0), k.tmp(1));
        k.a.movi(t1, nit as i64);
        k.a.divu(t0, item, t1);
        k.a.remu(g, item, t1);
        k.mul_imm(g, g, ic);
        k.min_imm(g, i - ic);
        k.mul_imm(t1, t0, i);
        k.a.add(gy, g, t1);
        k.mul_imm(gy, gy, F32);
        k.a.add(gy, gy, ptr[1]);
        k.mul_imm(t0, t0, l * i);
        k.a.add(g, g, t0);
        k.mul_imm(g, g, F32);
        k.a.add(g, g, ptr[0]);
        k.vdup(Opd::ub(acc), zero, Mask::Count(icp), 1);
        let load = |k: &mut K, b: usize, last: bool| {
            let n = if last { last_rows } else { lc };
            dma_rows(k, true, Addr::Ub(xb[b]), g, n, ic, i);
            k.gm_off(g, g, lc * i * F32);
        };
        let compute = |k: &mut K, b: usize, last: bool| {
            let n = if last { last_rows } else { lc };
            col_fold(k, vop, xb[b], xb[b], n, icp);
            k.vbin(
                vop,
                Opd::ub(acc),
                Opd::ub(acc),
                Opd::ub(xb[b]),
                Mask::Count(icp),
                1,
            );
        };
        Flow {
            tiles,
            load: &load,
            compute: &compute,
            store: None,
        }
        .emit(k);
        VECOUT.alloc(&mut k.a, OUT_FLAG);
        match scale {
            Some(s) => k.vsc(
                ProgramBuilder::vmuls,
                Opd::ub(outb),
                Opd::ub(acc),
                s,
                Mask::Count(icp),
                1,
            ),
            None => k.vun(
                ProgramBuilder::vmov,
                Opd::ub(outb),
                Opd::ub(acc),
                Mask::Count(icp),
                1,
            ),
        }
        VECOUT.enque(&mut k.a, OUT_FLAG);
        VECOUT.deque(&mut k.a, OUT_FLAG);
        dma_rows(k, false, Addr::Ub(outb), gy, 1, ic, ic);
        VECOUT.free(&mut k.a, OUT_FLAG);
        k.a.add_imm(item, 1);
    });
    VECOUT.alloc(&mut k.a, OUT_FLAG);
    flow_fini(&mut k, false);
    finish(ctx, k, spread.blocks, Vec::new())
}

/// A kernel writing `n` copies of `v` to output 0 (reductions over an empty axis).
fn fill(ctx: &LowerCtx<'_>, n: u64, v: f32) -> Result<Kernel, LowerError> {
    let core = &ctx.target.core;
    let mut k = K::new(&kernel_name(ctx, "fill"), core);
    let chunk = 8192u64.min(round8(n));
    let buf = k
        .alloc(chunk * F32)
        .ok_or_else(|| ctx.error("no UB for the fill buffer"))?;
    let ptr = args(&mut k, 1);
    let r = k.f32_reg(v);
    k.vdup(Opd::ub(buf), r, Mask::Count(chunk), 1);
    queue::barrier(&mut k.a, Pipe::V, Pipe::Mte3, 0);
    let g = k.a.reg();
    k.a.mov(g, ptr[0]);
    let mut done = 0;
    while done < n {
        let m = (n - done).min(chunk);
        dma_rows(&mut k, false, Addr::Ub(buf), g, 1, m, m);
        k.a.add_imm(g, (m * F32) as i64);
        done += m;
    }
    let mut kern = finish(ctx, k, 1, Vec::new())?;
    kern.args = vec![Operand::Output(0)];
    Ok(kern)
}
