//! Pooling on the vector unit: MaxPool (with its optional argmax Indices), AveragePool and
//! GlobalAveragePool over NCHW and NCW tensors of f32 or f16. Sums accumulate in f32; an
//! f16 MaxPool whose W stride is even stays in f16 (max is exact), other f16 pools are
//! widened in UB and narrowed on the way out.
//!
//! A window pool is separable: the window of output (oh, ow) is a box, so its max (or sum)
//! is the max over its rows of the max over its columns, and AveragePool's count is a
//! product of per-axis counts. A tile — `Pt` whole planes, or a band of output rows of one
//! plane when a plane does not fit — flows through two buffers with `reduce.rs`'s [`Flow`]
//! (load of tile t+1 ‖ compute of tile t ‖ store of tile t−1):
//!
//! ```text
//!   GM rows ─MTE2─▶ X[b]   rows of `row` lanes [pad | W columns | pad], pad rows above and
//!                     │    below (the identity: -inf for max, 0 for sums; never loaded)
//!                     ├─ (f16 computed in f32: vconv)
//!   reduce mode       ▼                               shift mode (W stride 1)
//!   H pass  T[u] = op over kh of X[u·sh + kh·dh]      a copy X_t of the rows per W tap t,
//!   W pass  vbreduce per block class, classes         loaded shifted so lane j holds tap t
//!           merged under lane masks                   of output j; W pass = op over copies,
//!                     │                               then the H pass
//!                     ▼
//!   AveragePool: results *= 1 / count (a table built once per block)
//!   O[b] ─MTE3─▶ GM rows (Wo of every 8·R lanes, Bo of the rows)
//! ```
//!
//! The vector unit cannot shift lanes, and a stride-`sw` window walks the lanes of a block,
//! so the reduce-mode W pass uses the lane-moving instruction there is, `vbreduce`: with
//! block stride 0 the eight groups of a repeat read the same 32-byte block, each with its
//! own lanes (the mask), and the eight results land in order. Output `ow = 8r + g` reads its
//! window from block `r·(8·sw / lanes) + v(g)` at lanes `λ(g)`, neither depending on `r`, so
//! a repeat makes eight outputs and rows of `R` repeats follow each other (`row = 8·R·sw`):
//! one instruction covers 255 repeats across rows. Each distinct block offset `v` (a class)
//! costs one pass; a group without lanes in a class gets 0 there and is masked out when the
//! classes merge. A class only group 0 reads (a window straddling blocks) is done
//! "compressed": the eight groups of a repeat are eight consecutive repeats (block stride a
//! repeat's) and the results land 8 apart, an eighth of the cost.
//!
//! For stride 1, `vbreduce` would spend a repeat per eight outputs per class; instead the
//! DMA does the shifting (GM addresses are byte-granular): copy `t` holds input column `c`
//! at lane `c + pw − t·dw`, so the W pass is `k − 1` whole-tile `vmax`/`vadd`s. A copy whose
//! first lane is not the start of a block misses its first columns; they are gathered from a
//! head block loaded per row by a one-lane `vbreduce` and moved in under a lane mask.
//!
//! MaxPool's Indices are the first maximal position in row-major window order, which the
//! passes give when the W pass runs first (the first maximal column in each row, then the
//! first row holding the maximum): each window column is gathered by one-lane `vbreduce`s,
//! compared (`vcmp.gt`: a NaN or a tie never replaces) and selected (`vsel`) together with
//! its column index; the H pass then selects rows with their row offsets. Indices are i32
//! in UB (inputs of 2^31 elements or more are refused) and widened to int64 by a `vbreduce`
//! writing every other i32 of a zeroed tile.
//!
//! GlobalAveragePool is a row mean of the [N·C, H·W] matrix: tiles of whole planes, each
//! row summed by pairwise halving in place (`x[0..n−h] += x[h..n]`, then one `vreduce` of
//! the last ≤ 64 lanes), which keeps f32 sums of large planes accurate; planes too big for
//! UB, or too few to fill the cores, are split into segments whose partial sums a second
//! kernel averages. Over 5HD a plane is `[H·W][16]` and the halving goes by whole pixel
//! units down to one, whose 16 lanes are the plane's 16 channel means.
//!
//! Blocks are dispatched one after another, so small kernels use fewer blocks (at least
//! 64 KiB of input each). A configuration that does not fit (rows too long for even a band
//! of one output row, 3-D windows, integer or f64 tensors) is a [`LowerError`] saying so.

use gearsim_isa::{Cmp, DType, Pipe, ReduceOp, units};

use super::cube::{Build, conv5hd};
use super::dma::{self, Dir};
use super::queue;
use super::reduce::{
    Addr, BLK, F32, FIELD, Flow, K, Mask, NEG_INF, Opd, REP, Spread, args, flow_fini, flow_init,
    round8,
};
use super::writer::Reg;
use super::{Kernel, LowerCtx, LowerError, LowerFn, Lowered, Operand, kernel_name};
use crate::CoreSpec;
use crate::ir::{DataType, Format, Tensor, TensorDesc, fixed_shape};

/// The lowering of an op type of this module.
pub fn lowering(op: &str) -> Option<LowerFn> {
    let f: LowerFn = match op {
        "MaxPool" => max_pool,
        "AveragePool" => average_pool,
        "GlobalAveragePool" => global_average_pool,
        _ => return None,
    };
    Some(f)
}

/// Largest burst count of one DMA instruction (a 12-bit field).
const MAX_BURSTS: u64 = units::BURST_COUNT_MAX;
/// Tiles aim for at least this many input bytes, so a DMA latency per tile is amortised.
const MIN_TILE_BYTES: u64 = 16 * 1024;
/// Tiles per block the planner aims for, so the double buffer has something to overlap.
const TILES_PER_BLOCK: u64 = 4;
/// Most window taps along W the shift mode loads a copy of the rows for (each costs a load
/// of the tile).
const MAX_SHIFT_COPIES: u64 = 5;
/// Blocks move at least this many bytes (see [`max_blocks`]).
const MIN_BLOCK_BYTES: u64 = 64 * 1024;
/// f16 negative infinity.
use super::window::{Axis, F16_NEG_INF, axes, dims};

// ---- element types ------------------------------------------------------------------------------

/// The element types the kernels read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    F16,
    F32,
}

impl Ty {
    fn of(ctx: &LowerCtx<'_>, d: &TensorDesc, what: &str) -> Result<Ty, LowerError> {
        match d.dtype {
            DataType::F16 => Ok(Ty::F16),
            DataType::F32 => Ok(Ty::F32),
            other => Err(ctx.error(format!(
                "{what} is {}; the pooling kernels compute in f32 and read f16 or f32 only",
                other.name()
            ))),
        }
    }

    fn bytes(self) -> u64 {
        match self {
            Ty::F16 => 2,
            Ty::F32 => 4,
        }
    }

    /// Elements per 32-byte block.
    fn lanes(self) -> u64 {
        32 / self.bytes()
    }

    fn dtype(self) -> DType {
        match self {
            Ty::F16 => DType::F16,
            Ty::F32 => DType::F32,
        }
    }

    /// The bits of negative infinity.
    fn neg_inf(self) -> i64 {
        match self {
            Ty::F16 => F16_NEG_INF,
            Ty::F32 => i64::from(NEG_INF),
        }
    }
}

// ---- typed vector instructions --------------------------------------------------------------------

/// A register holding UB address `at`, using scratch register `i` of the kernel when needed.
fn ub_reg(k: &mut K, i: usize, at: Addr) -> Reg {
    let t = k.tmp(i);
    match at {
        Addr::Ub(off) => {
            k.a.movi(t, off as i64);
            t
        }
        Addr::Rel(r, 0) => r,
        Addr::Rel(r, off) => {
            k.a.addi(t, r, off);
            t
        }
    }
}

/// The vector instructions [`vins`] writes, with their element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VOp {
    /// `vdup.ty dst, scalar`.
    Dup(DType),
    /// `vconv.to.from dst, src`.
    Conv(DType, DType),
    /// `vmov.ty dst, src`.
    Mov(DType),
    /// `vadd.ty dst, src0, src1`.
    Add(DType),
    /// `vmax.ty dst, src0, src1`.
    Max(DType),
    /// `vsel.ty dst, src0, src1, sel`.
    Sel(DType),
    /// `vmul.ty dst, src0, src1`.
    Mul(DType),
    /// `vadds.ty dst, src, scalar`.
    Adds(DType),
    /// `vmuls.ty dst, src, scalar`.
    Muls(DType),
}

/// One vector instruction `op` over at most three UB operands named as the ISA format names
/// them (in its order), then `extra` registers (a scalar, a select mask address). The repeat
/// count is written in normal-mask mode only; every operand's strides are written.
fn vins(k: &mut K, op: VOp, opds: &[(&str, Opd)], extra: &[Reg], m: Mask, rep: u64) {
    k.set_mask(m);
    let regs: Vec<Reg> = opds
        .iter()
        .enumerate()
        .map(|(i, (_, o))| ub_reg(k, i, o.at))
        .collect();
    let o: Vec<Opd> = opds.iter().map(|(_, o)| *o).collect();
    let rep = match m {
        Mask::Bits(_) => Some(rep),
        Mask::Count(_) => None,
    };
    let a = &mut k.a;
    match op {
        VOp::Dup(ty) => {
            let e = a
                .vdup(ty, regs[0], extra[0])
                .dst_blk(o[0].blk)
                .dst_rep(o[0].rep);
            if let Some(n) = rep {
                e.repeat(n);
            }
        }
        VOp::Conv(to, from) => {
            let e = a
                .vconv(to, from, regs[0], regs[1])
                .dst_blk(o[0].blk)
                .dst_rep(o[0].rep)
                .src_blk(o[1].blk)
                .src_rep(o[1].rep);
            if let Some(n) = rep {
                e.repeat(n);
            }
        }
        VOp::Mov(ty) => {
            let e = a
                .vmov(ty, regs[0], regs[1])
                .dst_blk(o[0].blk)
                .dst_rep(o[0].rep)
                .src_blk(o[1].blk)
                .src_rep(o[1].rep);
            if let Some(n) = rep {
                e.repeat(n);
            }
        }
        VOp::Adds(ty) | VOp::Muls(ty) => {
            let (d, s) = (regs[0], regs[1]);
            let e = if let VOp::Adds(_) = op {
                a.vadds(ty, d, s, extra[0])
            } else {
                a.vmuls(ty, d, s, extra[0])
            };
            let e = e
                .dst_blk(o[0].blk)
                .dst_rep(o[0].rep)
                .src_blk(o[1].blk)
                .src_rep(o[1].rep);
            if let Some(n) = rep {
                e.repeat(n);
            }
        }
        VOp::Add(ty) | VOp::Max(ty) | VOp::Mul(ty) => {
            let (d, s0, s1) = (regs[0], regs[1], regs[2]);
            let e = match op {
                VOp::Add(_) => a.vadd(ty, d, s0, s1),
                VOp::Max(_) => a.vmax(ty, d, s0, s1),
                _ => a.vmul(ty, d, s0, s1),
            };
            let e = e
                .dst_blk(o[0].blk)
                .dst_rep(o[0].rep)
                .src0_blk(o[1].blk)
                .src0_rep(o[1].rep)
                .src1_blk(o[2].blk)
                .src1_rep(o[2].rep);
            if let Some(n) = rep {
                e.repeat(n);
            }
        }
        VOp::Sel(ty) => {
            let e = a
                .vsel(ty, regs[0], regs[1], regs[2], extra[0])
                .dst_blk(o[0].blk)
                .dst_rep(o[0].rep)
                .src0_blk(o[1].blk)
                .src0_rep(o[1].rep)
                .src1_blk(o[2].blk)
                .src1_rep(o[2].rep);
            if let Some(n) = rep {
                e.repeat(n);
            }
        }
    }
}

/// `vcmp.gt.f32 bits, a, b`: one bit per element, repeat after repeat.
fn vcmp_gt(k: &mut K, bits: u64, a: Opd, b: Opd, m: Mask, rep: u64) {
    k.set_mask(m);
    let rd = ub_reg(k, 0, Addr::Ub(bits));
    let ra = ub_reg(k, 1, a.at);
    let rb = ub_reg(k, 2, b.at);
    let e =
        k.a.vcmp(Cmp::Gt, DType::F32, rd, ra, rb)
            .src0_blk(a.blk)
            .src1_blk(b.blk)
            .src0_rep(a.rep)
            .src1_rep(b.rep);
    if let Mask::Bits(_) = m {
        e.repeat(rep);
    }
}

/// `vbreduce.op.ty dst, src` (8 results per repeat, one per block) with results `dst_rep`
/// elements apart.
#[allow(clippy::too_many_arguments)]
fn vbreduce(
    k: &mut K,
    op: ReduceOp,
    ty: DType,
    dst: Addr,
    src: Opd,
    dst_rep: u64,
    m: Mask,
    rep: u64,
) {
    vreduce_any(k, true, op, ty, dst, src, dst_rep, m, rep);
}

/// `vbreduce.op.ty dst, src` (`per_block`) or `vreduce.op.ty dst, src` (one result per
/// repeat).
#[allow(clippy::too_many_arguments)]
fn vreduce_any(
    k: &mut K,
    per_block: bool,
    op: ReduceOp,
    ty: DType,
    dst: Addr,
    src: Opd,
    dst_rep: u64,
    m: Mask,
    rep: u64,
) {
    k.set_mask(m);
    let rd = ub_reg(k, 0, dst);
    let rs = ub_reg(k, 1, src.at);
    let e = if per_block {
        k.a.vbreduce(op, ty, rd, rs)
    } else {
        k.a.vreduce(op, ty, rd, rs)
    };
    let e = e.src_blk(src.blk).src_rep(src.rep).dst_rep(dst_rep);
    if let Mask::Bits(_) = m {
        e.repeat(rep);
    }
}

/// Fills `n` contiguous elements of type `ty` at `at` with raw bits `bits`.
fn fill(k: &mut K, imm: Reg, ty: Ty, at: u64, n: u64, bits: i64) {
    if n == 0 {
        return;
    }
    k.a.movi(imm, bits);
    vins(
        k,
        VOp::Dup(ty.dtype()),
        &[("dst", Opd::ub(at))],
        &[imm],
        Mask::Count(n),
        1,
    );
}

/// Converts `n` contiguous elements from `from` to `to`.
fn convert(k: &mut K, to: Ty, from: Ty, dst: u64, src: u64, n: u64) {
    if n == 0 {
        return;
    }
    vins(
        k,
        VOp::Conv(to.dtype(), from.dtype()),
        &[("dst", Opd::ub(dst)), ("src", Opd::ub(src))],
        &[],
        Mask::Count(n),
        1,
    );
}

/// The lanes of a 256-byte repeat of results (`ty` elements, result `p` belongs to group
/// `p % 8`) that belong to the groups set in `groups`.
fn group_mask(groups: u8, ty: Ty) -> Mask {
    let lanes = 256 / ty.bytes();
    Mask::Bits(
        (0..lanes)
            .filter(|l| groups >> (l % 8) & 1 == 1)
            .map(|l| 1u128 << l)
            .sum(),
    )
}

/// Lanes `0..n` of a repeat (n up to 128).
fn low_mask(n: u64) -> Mask {
    Mask::Bits(if n >= 128 {
        u128::MAX
    } else {
        (1u128 << n) - 1
    })
}

/// `emit(k, byte offset, repeats)` over `results` contiguous results of type `ty`, in runs of
/// at most 255 repeats of 256 bytes (the normal-mode masked merges of class results).
fn per_repeat(k: &mut K, results: u64, ty: Ty, emit: &dyn Fn(&mut K, u64, u64)) {
    let reps = (results * ty.bytes()).div_ceil(256);
    let mut done = 0;
    while done < reps {
        let n = (reps - done).min(FIELD);
        emit(k, done * 256, n);
        done += n;
    }
}

// ---- DMA ----------------------------------------------------------------------------------------

/// A GM <-> UB copy of `rows` rows of `len` bytes: GM rows `gm_stride` bytes apart, UB rows
/// `ub_stride` bytes apart (a multiple of 32 at least `len` rounded up to 32). Burst copies
/// when every size is whole blocks, byte-granular ones otherwise; split at the burst-count
/// limit.
#[allow(clippy::too_many_arguments)]
fn dma(
    k: &mut K,
    load: bool,
    ub: Addr,
    gm: Reg,
    rows: u64,
    len: u64,
    gm_stride: u64,
    ub_stride: u64,
) {
    if rows == 0 || len == 0 {
        return;
    }
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(MAX_BURSTS);
        let u = ub_reg(k, 0, ub.off(done * ub_stride));
        let g = if done == 0 {
            gm
        } else {
            let t = k.tmp(1);
            k.gm_off(t, gm, done * gm_stride);
            t
        };
        let (gm_gap, ub_gap) = (gm_stride - len, ub_stride - len.div_ceil(32) * 32);
        let dir = if load { Dir::GmToUb } else { Dir::UbToGm };
        dma::rows(&mut k.a, dir, u, g, n, len, gm_gap, ub_gap);
        done += n;
    }
}

// ---- attributes and geometry --------------------------------------------------------------------

// ---- MaxPool and AveragePool ----------------------------------------------------------------------

fn max_pool(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    // 8-bit integers through f16, which holds every one of them exactly.
    if matches!(ctx.input(0)?.dtype, DataType::U8 | DataType::I8) && ctx.outputs.len() == 1 {
        return super::through_type(ctx, DataType::F16);
    }
    if ctx.input(0)?.format == Format::Nc1hwc0 {
        return super::pool_5hd::lower(ctx);
    }
    if ctx
        .outputs
        .first()
        .is_some_and(|d| d.format == Format::Nc1hwc0)
    {
        return pool_to_fractal(ctx);
    }
    window_pool(ctx, true)
}

/// A MaxPool whose output the layout pass keeps 5HD: the NCHW pool into the workspace, then
/// a TransData of its output (a quarter of the input for the usual 3×3 stride-2 pool).
fn pool_to_fractal(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let mut outputs = ctx.outputs.to_vec();
    outputs[0].format = Format::Nd;
    let d = dims(ctx, &outputs[0])?;
    let sub = LowerCtx {
        node: ctx.node,
        inputs: ctx.inputs.clone(),
        values: ctx.values.clone(),
        outputs: &outputs,
        target: ctx.target,
    };
    let lowered = window_pool(&sub, true)?;
    let mut b = Build::default();
    let ws = b.scratch(d.iter().product::<u64>() * 2);
    b.inline(lowered, &Operand::Input, ws, |name| name)
        .map_err(|e| ctx.error(e))?;
    conv5hd::transdata(
        ctx,
        &mut b,
        [d[0], d[1] / 16, 16, d[2] * d[3]],
        ws,
        Operand::Output(0),
    )?;
    Ok(b.finish())
}

fn average_pool(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    window_pool(ctx, false)
}

/// What a window pool computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    /// MaxPool's values.
    Max,
    /// MaxPool's values and flat argmax indices (`colmajor`: storage_order 1).
    MaxIndices { colmajor: bool },
    /// AveragePool's sums divided by the counts.
    Average { include_pad: bool },
}

impl What {
    fn is_max(self) -> bool {
        !matches!(self, What::Average { .. })
    }

    /// The bits of the identity the padding holds, in type `ty`.
    fn identity(self, ty: Ty) -> i64 {
        if self.is_max() { ty.neg_inf() } else { 0 }
    }
}

fn window_pool(ctx: &LowerCtx<'_>, max: bool) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let xt = Ty::of(ctx, x, "the input")?;
    let xd = dims(ctx, x)?;
    let y = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    let yd = dims(ctx, y)?;
    let rank = xd.len();
    if rank == 5 {
        return pool_3d(ctx, max);
    }
    if !(3..=4).contains(&rank) {
        return Err(ctx.error(format!(
            "a {}-D window has no pooling kernel; only 1-D, 2-D and 3-D pools (rank 3 to 5 \
             inputs) are lowered",
            rank.saturating_sub(2)
        )));
    }
    let what = if !max {
        What::Average {
            include_pad: ctx.node.int("count_include_pad").unwrap_or(0) != 0,
        }
    } else if ctx.outputs.len() > 1 {
        What::MaxIndices {
            colmajor: ctx.node.int("storage_order").unwrap_or(0) == 1,
        }
    } else {
        What::Max
    };
    let ax = axes(ctx, &xd, &yd)?;
    let (h, w) = if rank == 3 {
        (Axis::UNIT, ax[0])
    } else {
        (ax[0], ax[1])
    };
    let planes = xd[0] * xd[1];
    if planes * h.out * w.out == 0 {
        return Ok(no_kernels());
    }
    let identity = |a: &Axis| a.k == 1 && a.s == 1 && a.pb == 0 && a.pe == 0;
    if identity(&h) && identity(&w) && !matches!(what, What::MaxIndices { .. }) {
        return Ok(Lowered::Alias { input: 0 });
    }
    if let What::MaxIndices { .. } = what
        && planes * h.size * w.size >= 1 << 31
    {
        return Err(ctx.error(format!(
            "MaxPool's Indices are computed in i32: an input of {} elements is past 2^31",
            planes * h.size * w.size
        )));
    }
    let pool = Pool::plan(ctx, what, xt, planes, h, w)?;
    let kernel = pool.kernel(ctx)?;
    Ok(Lowered::Kernels {
        kernels: vec![kernel],
        derived: pool.derived(),
        workspace_bytes: 0,
    })
}

/// A 3-D pool as two 2-D pools: over (H, W) for every depth slice (`[N·C·D, 1, H, W]`), then
/// over D (`[N·C, 1, D, Ho·Wo]`, a window of one column). Both the maximum and the average
/// are separable over a box window: the taps of a 3-D window are the product of its per-axis
/// taps, and so is the count an average divides by, with or without the padding.
fn pool_3d(ctx: &LowerCtx<'_>, max: bool) -> Result<Lowered, LowerError> {
    if ctx.outputs.len() > 1 {
        return Err(ctx.error("MaxPool's Indices are not computed for a 3-D window"));
    }
    let x = ctx.input(0)?;
    let y = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    let (xd, yd) = (dims(ctx, x)?, dims(ctx, y)?);
    let ax = axes(ctx, &xd, &yd)?;
    let (d, h, w) = (ax[0], ax[1], ax[2]);
    let nc = xd[0] * xd[1];
    let desc = |dims: [u64; 4]| TensorDesc::new(x.dtype, fixed_shape(&dims.map(|v| v as i64)));
    let window = |a: Axis, b: Axis| {
        let mut n = ctx.node.clone();
        let ints = |v: [u64; 2]| crate::ir::Attr::Ints(v.iter().map(|x| *x as i64).collect());
        n.attrs.insert("kernel_shape".into(), ints([a.k, b.k]));
        n.attrs.insert("strides".into(), ints([a.s, b.s]));
        n.attrs.insert("dilations".into(), ints([a.d, b.d]));
        n.attrs.insert(
            "pads".into(),
            crate::ir::Attr::Ints(vec![a.pb as i64, b.pb as i64, a.pe as i64, b.pe as i64]),
        );
        n.attrs.remove("auto_pad");
        n
    };
    let one = |size: u64| Axis {
        size,
        out: size,
        k: 1,
        s: 1,
        d: 1,
        pb: 0,
        pe: 0,
    };
    let pass = |node: &crate::ir::Node, i: [u64; 4], o: [u64; 4]| -> Result<Lowered, LowerError> {
        let inputs = [desc(i)];
        let outputs = [desc(o)];
        let sub = LowerCtx {
            node,
            inputs: vec![Some(&inputs[0])],
            values: vec![None],
            outputs: &outputs,
            target: ctx.target,
        };
        window_pool(&sub, max)
    };
    let n1 = window(h, w);
    let first = pass(
        &n1,
        [nc * d.size, 1, h.size, w.size],
        [nc * d.size, 1, h.out, w.out],
    )?;
    let n2 = window(d, one(h.out * w.out));
    let plane = h.out * w.out;
    let second = pass(&n2, [nc, 1, d.size, plane], [nc, 1, d.out, plane])?;
    let mut b = Build::default();
    let rename = |pass: &'static str| move |name: String| format!("{name}_{pass}");
    match (first, second) {
        (Lowered::Alias { .. }, Lowered::Alias { .. }) => Ok(Lowered::Alias { input: 0 }),
        (Lowered::Alias { .. }, second) => {
            b.inline(second, &Operand::Input, Operand::Output(0), rename("d"))
                .map_err(|e| ctx.error(e))?;
            Ok(b.finish())
        }
        (first, Lowered::Alias { .. }) => {
            b.inline(first, &Operand::Input, Operand::Output(0), rename("hw"))
                .map_err(|e| ctx.error(e))?;
            Ok(b.finish())
        }
        (first, second) => {
            let ws = b.scratch(nc * d.size * plane * x.dtype.size() as u64);
            b.inline(first, &Operand::Input, ws, rename("hw"))
                .map_err(|e| ctx.error(e))?;
            b.inline(second, &|_| ws, Operand::Output(0), rename("d"))
                .map_err(|e| ctx.error(e))?;
            Ok(b.finish())
        }
    }
}

fn no_kernels() -> Lowered {
    Lowered::Kernels {
        kernels: Vec::new(),
        derived: Vec::new(),
        workspace_bytes: 0,
    }
}

/// A W-pass block class: the groups (outputs `8r + g`) whose window has lanes in block
/// `r·src_rep + block` of the row (blocks of the compute type), and those lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Class {
    /// Block offset from the repeat's first block.
    block: u64,
    /// Lane mask over a repeat (group g owns the lanes of block g).
    bits: u128,
    /// Groups with lanes here (bit g).
    groups: u8,
}

/// The classes of a W pass over blocks of `lpb` lanes: taps `taps` of each group's window,
/// relative to lane `off + g·sw` of the row.
fn classes(off: u64, sw: u64, taps: &[u64], lpb: u64) -> Vec<Class> {
    let mut out: Vec<Class> = Vec::new();
    for g in 0..8 {
        for &t in taps {
            let e = off + g * sw + t;
            let (block, lane) = (e / lpb, e % lpb);
            let i = match out.iter().position(|c| c.block == block) {
                Some(i) => i,
                None => {
                    out.push(Class {
                        block,
                        bits: 0,
                        groups: 0,
                    });
                    out.len() - 1
                }
            };
            out[i].bits |= 1u128 << (g * lpb + lane);
            out[i].groups |= 1 << g;
        }
    }
    out.sort_by_key(|c| c.block);
    out
}

/// How the W pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WMode {
    /// One copy of each row; `vbreduce` over block classes picks the windows' lanes.
    Reduce,
    /// Stride 1: a copy of the rows per window tap, shifted by the load so that lane `j` of
    /// copy `t` holds tap `t` of output `j`; the W pass is `k − 1` whole-row operations.
    Shift,
}

/// One copy of the input rows in a tile: column `c` at lane `c + lane0` of its row; the load
/// moves columns `first..end` (lane `first + lane0` is the start of a block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Copy {
    lane0: i64,
    first: u64,
    end: u64,
}

impl Copy {
    /// Lane of the first column loaded.
    fn first_lane(&self) -> u64 {
        (self.first as i64 + self.lane0) as u64
    }

    /// Lane after the last column loaded.
    fn end_lane(&self) -> u64 {
        (self.end as i64 + self.lane0) as u64
    }
}

/// Columns `0..n` of copy `copy`, which its load cannot place (they start inside a block):
/// gathered from the head block of each row (columns `0..lanes`) by a one-lane `vbreduce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeadFix {
    copy: usize,
    n: u64,
}

/// One kind of tile: how its virtual rows split into pad and data and what its output rows
/// divide by. Whole-plane tiles have one kind; bands of a plane have one per distinct edge.
#[derive(Debug, Clone, PartialEq)]
struct Kind {
    /// Virtual rows above the data (padding).
    top: u64,
    /// Input rows loaded after them.
    data: u64,
    /// AveragePool: 1 / (row count) of each output row of the tile.
    row_scale: Vec<f32>,
    /// MaxPool: output rows whose window holds no input row (written 0, as the reference).
    empty_rows: Vec<u64>,
}

/// A planned MaxPool or AveragePool kernel.
#[derive(Debug, Clone)]
struct Pool {
    what: What,
    name: String,
    /// Input (and output) element type.
    ty: Ty,
    /// The type the passes compute in: f16 for an f16 MaxPool whose W stride is even (a
    /// repeat's 8 windows then start a whole number of f16 blocks apart), else f32.
    ct: Ty,
    planes: u64,
    h: Axis,
    w: Axis,
    /// Lane of input column 0 in a row (a multiple of the input's lanes per block; the
    /// reduce mode's one copy).
    d0: u64,
    mode: WMode,
    /// The copies of the input rows a tile holds, and the columns their loads cannot place.
    copies: Vec<Copy>,
    heads: Vec<HeadFix>,
    /// Repeats (8 outputs each) per row.
    reps: u64,
    /// Lanes per row of X and T (`8 · reps · sw`).
    row: u64,
    /// Output rows per plane of a tile, and rows laid out per plane (`>= bo`).
    bo: u64,
    bo_pad: u64,
    /// Virtual input rows per plane (`bo_pad · sh`).
    pi: u64,
    /// Input rows a band's outputs read.
    bi: u64,
    /// Bands per plane (1: whole planes).
    bands: u64,
    /// Planes per tile.
    pt: u64,
    kinds: Vec<Kind>,
    /// The kind of each band.
    band_kind: Vec<usize>,
    /// The W-pass classes read by a whole repeat, and those only group 0 reads (done by a
    /// "compressed" `vbreduce` whose eight groups are eight repeats: an eighth of the cost).
    full: Vec<Class>,
    group0: Vec<Class>,
    /// Extra T blocks the garbage outputs of the last row read.
    t_slack_blocks: u64,
}

/// UB addresses of one pool kernel.
#[derive(Debug, Clone, Default)]
struct Bufs {
    /// Input tiles (one per copy of the rows), in the input type.
    x: Vec<[u64; 2]>,
    /// f32 versions of them (f16 inputs computed in f32).
    x32: Vec<u64>,
    /// Shift mode: the head block of each row (double-buffered, input type), its f32
    /// version, one block per row of gathered columns, and the merged copies.
    head: Option<[u64; 2]>,
    head32: Option<u64>,
    gathered: u64,
    merged: Option<u64>,
    /// H-pass result (absent when the H pass is the identity).
    t: Option<u64>,
    /// Class results waiting to be merged.
    s: u64,
    /// Output tiles, in the output type.
    o: [u64; 2],
    /// f32 results of f16 outputs computed in f32 (else the results are the output tiles).
    r32: Option<u64>,
    /// AveragePool's 1 / count table.
    scale: Option<u64>,
    /// MaxPool's Indices: the column gathers and their winners, ...
    gather: u64,
    best_w: u64,
    col_w: u64,
    /// ... the compare bits, the column index table and row offset blocks, ...
    bits: u64,
    cols: u64,
    row_offsets: u64,
    /// ... the H-pass winners' indices and the int64 output tiles.
    best_i: u64,
    i64s: [u64; 2],
}

impl Bufs {
    /// Where the results of buffer `b` are computed.
    fn results(&self, b: usize) -> u64 {
        self.r32.unwrap_or(self.o[b])
    }
}

/// Registers of one pool kernel besides the builder's own.
struct Regs {
    /// Argument pointers: X, Y, [Indices], [column table, row offsets].
    ptr: Vec<Reg>,
    /// Tile counters of the loads, computes and stores.
    jl: Reg,
    jc: Reg,
    js: Reg,
    /// The band (or plane group) of the tile being handled, and GM addresses.
    band: Reg,
    gm: Reg,
    /// Immediates for scalar operands.
    imm: Reg,
    /// Loop registers (plane loops of the DMAs, row loops of wide rows).
    lp: [Reg; 3],
}

impl Pool {
    /// Chooses the compute type, the row layout, tiles and bands.
    fn plan(
        ctx: &LowerCtx<'_>,
        what: What,
        ty: Ty,
        planes: u64,
        h: Axis,
        w: Axis,
    ) -> Result<Pool, LowerError> {
        if w.s == 0 || h.s == 0 || w.s > FIELD {
            return Err(ctx.error(format!(
                "a stride of {} along W is past the {FIELD}-block repeat stride the W pass uses",
                w.s
            )));
        }
        let lanes_in = ty.lanes();
        let shift = w.s == 1 && w.k <= MAX_SHIFT_COPIES && !matches!(what, What::MaxIndices { .. });
        if shift && let Ok(pool) = Pool::plan_shift(ctx, what, ty, planes, h, w) {
            // (Rows too long for a copy per tap fall back to one copy and vbreduce.)
            return Ok(pool);
        }
        let ct = if ty == Ty::F16 && what == What::Max && w.s.is_multiple_of(2) {
            Ty::F16
        } else {
            Ty::F32
        };
        let d0 = w.pb.div_ceil(lanes_in) * lanes_in;
        let off = d0 - w.pb;
        let need = (d0 + w.size).max(off + (w.out - 1) * w.s + w.ext());
        let mut reps = w.out.div_ceil(8).max(need.div_ceil(8 * w.s));
        // f16 rows (input and output tiles) stay 32-byte aligned.
        if ty == Ty::F16 && reps % 2 == 1 {
            reps += 1;
        }
        let row = 8 * reps * w.s;
        let taps: Vec<u64> = (0..w.k).map(|t| t * w.d).collect();
        let all = classes(off, w.s, &taps, ct.lanes());
        let src_rep = 8 * w.s / ct.lanes();
        // Group 0 alone in a block: a compressed vbreduce (its block stride is a repeat's).
        let (group0, full): (Vec<Class>, Vec<Class>) = all
            .into_iter()
            .partition(|c| c.groups == 1 && 8 * src_rep <= FIELD);
        let vmax = full
            .iter()
            .chain(&group0)
            .map(|c| c.block)
            .max()
            .unwrap_or(0);
        let pool = Pool {
            what,
            name: kernel_name(ctx, ""),
            ty,
            ct,
            planes,
            h,
            w,
            d0,
            mode: WMode::Reduce,
            copies: vec![Copy {
                lane0: d0 as i64,
                first: 0,
                end: w.size,
            }],
            heads: Vec::new(),
            reps,
            row,
            bo: h.out,
            bo_pad: h.out,
            pi: h.out,
            bi: h.out,
            bands: 1,
            pt: 1,
            kinds: Vec::new(),
            band_kind: Vec::new(),
            full,
            group0,
            t_slack_blocks: vmax + 8 * src_rep + 2,
        };
        pool.tile(ctx)
    }

    /// The shift-mode plan: rows of `8R >= Wo` lanes, one copy per tap.
    fn plan_shift(
        ctx: &LowerCtx<'_>,
        what: What,
        ty: Ty,
        planes: u64,
        h: Axis,
        w: Axis,
    ) -> Result<Pool, LowerError> {
        let lanes_in = ty.lanes() as i64;
        let mut reps = w.out.div_ceil(8);
        if ty == Ty::F16 && reps % 2 == 1 {
            reps += 1;
        }
        let row = 8 * reps;
        let mut copies = Vec::new();
        let mut heads = Vec::new();
        for t in 0..w.k {
            let lane0 = w.pb as i64 - (t * w.d) as i64;
            // The first column whose lane starts a block (none before column 0).
            let first = if lane0 >= 0 {
                (lanes_in - lane0 % lanes_in) % lanes_in
            } else {
                -lane0
            };
            let end = (row as i64 - lane0).min(w.size as i64).max(first);
            copies.push(Copy {
                lane0,
                first: first as u64,
                end: end as u64,
            });
            let n = first.min(w.size as i64).min(row as i64 - lane0);
            if lane0 > 0 && n > 0 {
                heads.push(HeadFix {
                    copy: copies.len() - 1,
                    n: n as u64,
                });
            }
        }
        let pool = Pool {
            what,
            name: kernel_name(ctx, ""),
            ty,
            ct: Ty::F32,
            planes,
            h,
            w,
            d0: 0,
            mode: WMode::Shift,
            copies,
            heads,
            reps,
            row,
            bo: h.out,
            bo_pad: h.out,
            pi: h.out,
            bi: h.out,
            bands: 1,
            pt: 1,
            kinds: Vec::new(),
            band_kind: Vec::new(),
            full: Vec::new(),
            group0: Vec::new(),
            t_slack_blocks: 2,
        };
        pool.tile(ctx)
    }

    /// This plan with tiles of whole planes, or bands of one plane when a plane does not fit.
    fn tile(self, ctx: &LowerCtx<'_>) -> Result<Pool, LowerError> {
        let (h, w, ty, planes, row) = (self.h, self.w, self.ty, self.planes, self.row);
        let core = &ctx.target.core;
        let mut pool = self;
        let budget = core.ub_bytes.saturating_sub(2048);
        let fits = |p: &Pool| p.ub_bytes() <= budget;
        if fits(&pool.with_tile(1, h.out)) {
            // Whole planes, as many per tile as the work per block and UB allow.
            let (mut lo, mut hi) = (1, planes.min(4096));
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if fits(&pool.with_tile(mid, h.out)) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            let blocks = max_blocks(planes * h.size * w.size * ty.bytes(), core);
            let plane_bytes = h.size * w.size * ty.bytes();
            let want = planes
                .div_ceil(blocks)
                .div_ceil(TILES_PER_BLOCK)
                .max(MIN_TILE_BYTES.div_ceil(plane_bytes.max(1)));
            pool = pool.with_tile(want.clamp(1, lo), h.out);
        } else if h.out > 1 && fits(&pool.with_tile(1, 1)) {
            // Bands of output rows of one plane.
            let (mut lo, mut hi) = (1, h.out - 1);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if fits(&pool.with_tile(1, mid)) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            pool = pool.with_tile(1, lo);
        } else {
            return Err(ctx.error(format!(
                "a band of one output row ({} input rows of {} elements, padded to {} lanes) \
                 does not fit in the {}-byte unified buffer with its buffers; the input rows \
                 are too long for this window",
                h.ext(),
                w.size,
                row,
                core.ub_bytes
            )));
        }
        Ok(pool)
    }

    /// This plan with `pt` planes of `bo` output rows per tile.
    fn with_tile(&self, pt: u64, bo: u64) -> Pool {
        let h = self.h;
        let bi = (bo - 1) * h.s + h.ext();
        // Several planes per tile keep their rows `bo_pad · sh` apart so the H pass walks
        // all of them as one run of rows (the extra rows are garbage, never stored).
        let bo_pad = if pt == 1 {
            bo
        } else {
            bo.max(bi.div_ceil(h.s))
        };
        let bands = h.out.div_ceil(bo);
        let include_pad = matches!(self.what, What::Average { include_pad: true });
        let mut kinds: Vec<Kind> = Vec::new();
        let mut band_kind = Vec::new();
        for b in 0..bands {
            let oh0 = (b * bo).min(h.out - bo);
            let v0 = (oh0 * h.s) as i64 - h.pb as i64;
            let start = v0.max(0);
            let end = (v0 + bi as i64).min(h.size as i64);
            let kind = Kind {
                top: (start - v0) as u64,
                data: (end - start).max(0) as u64,
                row_scale: if self.what.is_max() {
                    Vec::new()
                } else {
                    (0..bo)
                        .map(|t| 1.0 / h.counted(oh0 + t, include_pad) as f32)
                        .collect()
                },
                empty_rows: if self.what.is_max() {
                    (0..bo).filter(|t| h.valid(oh0 + t) == 0).collect()
                } else {
                    Vec::new()
                },
            };
            let i = match kinds.iter().position(|k| *k == kind) {
                Some(i) => i,
                None => {
                    kinds.push(kind);
                    kinds.len() - 1
                }
            };
            band_kind.push(i);
        }
        Pool {
            bo,
            bo_pad,
            pi: if pt == 1 { bi } else { bo_pad * h.s },
            bi,
            bands,
            pt,
            kinds,
            band_kind,
            ..self.clone()
        }
    }

    /// Output rows laid out per tile (garbage rows included).
    fn u(&self) -> u64 {
        self.pt * self.bo_pad
    }

    /// Input rows laid out per tile.
    fn ux(&self) -> u64 {
        self.pt * self.pi
    }

    /// Rows past the tile's input rows that the H pass reads for the garbage output rows of
    /// the last plane.
    fn x_slack_rows(&self) -> u64 {
        ((self.u() - 1) * self.h.s + self.h.ext()).saturating_sub(self.ux())
    }

    /// Whether the H pass does anything (else the W pass reads the input tile).
    fn has_h_pass(&self) -> bool {
        self.h.k > 1 || self.h.s > 1
    }

    /// Compute-type blocks a repeat of the W pass advances (8 windows of stride `sw`).
    fn src_rep(&self) -> u64 {
        8 * self.w.s / self.ct.lanes()
    }

    /// Compute-type blocks per X / T row.
    fn row_blocks(&self) -> u64 {
        self.row / self.ct.lanes()
    }

    /// Bytes of one array of results (rounded to whole 256-byte repeats, which the masked
    /// merges process).
    fn result_bytes(&self, ty: Ty) -> u64 {
        (self.u() * 8 * self.reps * ty.bytes()).div_ceil(256) * 256
    }

    /// UB the plan needs, laid out as [`Pool::layout`] does.
    fn ub_bytes(&self) -> u64 {
        let mut k = Sizer(0);
        self.layout(&mut |n| Some(k.take(n)));
        k.0
    }

    /// Lays the buffers out with `alloc`.
    fn layout(&self, alloc: &mut dyn FnMut(u64) -> Option<u64>) -> Option<Bufs> {
        let x_rows = self.ux() + self.x_slack_rows();
        let slack = self.t_slack_blocks * 32;
        let x_bytes = x_rows * self.row * self.ty.bytes() + slack;
        let res = self.result_bytes(self.ct);
        let indices = matches!(self.what, What::MaxIndices { .. });
        let mut b = Bufs::default();
        for _ in &self.copies {
            b.x.push([alloc(x_bytes)?, alloc(x_bytes)?]);
        }
        if self.ct != self.ty {
            for _ in &self.copies {
                b.x32.push(alloc(x_rows * self.row * F32 + slack)?);
            }
        }
        if !self.heads.is_empty() {
            let rows = self.ux() + self.x_slack_rows();
            b.head = Some([alloc(rows * 32)?, alloc(rows * 32)?]);
            if self.ct != self.ty {
                b.head32 = Some(alloc(rows * 32 * (F32 / self.ty.bytes()))?);
            }
            b.gathered = alloc(rows * 32)?;
        }
        if self.mode == WMode::Shift && self.has_h_pass() {
            b.merged = Some(alloc(x_rows * self.row * F32 + slack)?);
        }
        if self.mode == WMode::Reduce && self.has_h_pass() && !indices {
            b.t = Some(alloc(self.u() * self.row * self.ct.bytes() + slack)?);
        }
        let out = self.result_bytes(self.ty);
        b.o = [alloc(out)?, alloc(out)?];
        if self.ct != self.ty {
            b.r32 = Some(alloc(res)?);
        }
        if let What::Average { .. } = self.what {
            b.scale = Some(alloc(res)?);
        }
        if indices {
            let wres = self.ux() * self.reps * 32 + 256;
            b.s = alloc(wres)?;
            b.gather = alloc(wres)?;
            b.best_w = alloc(wres)?;
            b.col_w = alloc(wres)?;
            // One 64-bit mask per repeat: up to 255 rows of a chunk, or one long row.
            b.bits = alloc((FIELD.min(self.ux().max(self.u())) * 8).max(self.reps * 8))?;
            b.cols = alloc(self.w.k * self.reps * 32)?;
            b.row_offsets = alloc(self.ux() * 32)?;
            b.best_i = alloc(res)?;
            b.i64s = [alloc(2 * res)?, alloc(2 * res)?];
        } else if self.mode == WMode::Reduce && self.full.len() + self.group0.len() > 1 {
            b.s = alloc(res)?;
        }
        Some(b)
    }

    /// Derived constants: the Indices' column table ([kw][8R] i32, the column index of tap kw
    /// of output column j, times H when column-major) and row offsets (per input row of a
    /// tile, a block of eight copies of its row within the plane, times W when row-major).
    fn derived(&self) -> Vec<Tensor> {
        let What::MaxIndices { colmajor } = self.what else {
            return Vec::new();
        };
        let (h, w) = (self.h, self.w);
        let (col_unit, row_unit) = if colmajor { (h.size, 1) } else { (1, w.size) };
        let mut cols = Vec::new();
        for t in 0..w.k {
            for j in 0..8 * self.reps {
                let c = (j * w.s + t * w.d) as i64 - w.pb as i64;
                cols.push((c * col_unit as i64) as i32);
            }
        }
        let mut rows = Vec::new();
        for r in 0..self.ux() {
            let v = ((r % self.pi) * row_unit) as i32;
            rows.extend(std::iter::repeat_n(v, BLK as usize));
        }
        vec![
            Tensor::from_i32s(vec![cols.len() as i64], &cols),
            Tensor::from_i32s(vec![rows.len() as i64], &rows),
        ]
    }
}

/// A bump allocator that only counts (32-byte aligned), to size a layout.
struct Sizer(u64);

impl Sizer {
    fn take(&mut self, n: u64) -> u64 {
        let at = self.0;
        self.0 += n.div_ceil(32) * 32;
        at
    }
}

/// Blocks worth launching for a kernel moving `bytes`: blocks are dispatched one after
/// another, so a block moving less than [`MIN_BLOCK_BYTES`] costs more in dispatch than it
/// gains in bandwidth.
fn max_blocks(bytes: u64, core: &CoreSpec) -> u64 {
    let cores = core.vector_blocks();
    bytes.div_ceil(MIN_BLOCK_BYTES).clamp(1, cores)
}

/// `items` spread over at most [`max_blocks`] blocks.
fn spread(items: u64, bytes: u64, core: &CoreSpec) -> Spread {
    let items = items.max(1);
    let per_block = items.div_ceil(items.min(max_blocks(bytes, core)));
    Spread {
        blocks: items.div_ceil(per_block) as u32,
        per_block,
        items,
    }
}

// ---- walking rows -------------------------------------------------------------------------------

/// Where a row-wise instruction is: a column chunk of a group of rows (rows are repeats), or
/// the current row of a loop (counter mode over the whole row).
enum RowView {
    /// Rows `g0..g0 + n` as repeats, lanes `lanes` of the `c`-th 256 bytes of each.
    Chunk { g0: u64, n: u64, c: u64, lanes: u64 },
    /// The row whose offset (row index times the stride) each register holds, per stride.
    Loop { lanes: u64, regs: Vec<(u64, Reg)> },
}

impl RowView {
    /// The operand of rows at `base`, `stride` 32-byte blocks apart (0: one row for all).
    fn opd(&self, base: u64, stride: u64) -> Opd {
        match self {
            RowView::Chunk { g0, c, .. } => Opd {
                at: Addr::Ub(base + g0 * stride * 32 + c * 256),
                blk: 1,
                rep: stride,
            },
            RowView::Loop { regs, .. } => match regs.iter().find(|(s, _)| *s == stride) {
                Some((_, r)) if stride > 0 => Opd::flat(Addr::Rel(*r, base)),
                _ => Opd::ub(base),
            },
        }
    }

    /// One block per row at `base` (block `row` of it), read for every block of the row.
    fn row_block(&self, base: u64) -> Opd {
        match self {
            RowView::Chunk { g0, .. } => Opd {
                at: Addr::Ub(base + g0 * 32),
                blk: 0,
                rep: 1,
            },
            RowView::Loop { regs, .. } => {
                let r = regs.iter().find(|(s, _)| *s == 1).map(|(_, r)| *r);
                Opd {
                    at: r.map_or(Addr::Ub(base), |r| Addr::Rel(r, base)),
                    blk: 0,
                    rep: 0,
                }
            }
        }
    }

    /// The mask and repeat count of an instruction over this view.
    fn mask(&self) -> (Mask, u64) {
        match self {
            RowView::Chunk { n, lanes, .. } => (low_mask(*lanes), *n),
            RowView::Loop { lanes, .. } => (Mask::Count(*lanes), 1),
        }
    }

    /// Rows this view covers at once.
    fn rows(&self) -> u64 {
        match self {
            RowView::Chunk { n, .. } => *n,
            RowView::Loop { .. } => 1,
        }
    }
}

/// Runs `body` over `rows` rows of `lanes` lanes of type `ty` whose operands have the row
/// strides `strides` (in blocks, 0 for a shared row, 1 also for per-row blocks): rows as
/// repeats when every stride fits the repeat-stride field, else a loop over the rows (`lp`:
/// counter and up to two stride registers).
fn walk_rows(
    k: &mut K,
    lp: &[Reg; 3],
    rows: u64,
    lanes: u64,
    ty: Ty,
    strides: &[u64],
    body: &dyn Fn(&mut K, &RowView),
) {
    if rows == 0 || lanes == 0 {
        return;
    }
    let mut distinct: Vec<u64> = strides.iter().copied().filter(|s| *s > 0).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.iter().all(|s| *s <= FIELD) {
        let mut g0 = 0;
        while g0 < rows {
            let n = (rows - g0).min(FIELD);
            let per_rep = 256 / ty.bytes();
            for c in 0..lanes.div_ceil(per_rep) {
                let view = RowView::Chunk {
                    g0,
                    n,
                    c,
                    lanes: (lanes - c * per_rep).min(per_rep),
                };
                body(k, &view);
            }
            g0 += n;
        }
        return;
    }
    // Rows too long for the repeat stride: one counter-mode instruction per row.
    let regs: Vec<(u64, Reg)> = distinct
        .iter()
        .zip(&lp[1..])
        .map(|(s, r)| (*s, *r))
        .collect();
    for (_, r) in &regs {
        k.a.movi(*r, 0);
    }
    k.a.movi(lp[0], rows as i64);
    let top = k.a.new_label("row");
    k.place(&top);
    body(
        k,
        &RowView::Loop {
            lanes,
            regs: regs.clone(),
        },
    );
    for (s, r) in &regs {
        k.addi(*r, s * 32);
    }
    let top_l = k.a.label(&top);
    k.a.r#loop(lp[0], top_l);
    k.forget_mask();
}

// ---- the window pool kernel -----------------------------------------------------------------------

impl Pool {
    /// Tiles a kernel runs: plane groups, or (plane, band) pairs.
    fn items(&self) -> u64 {
        if self.bands == 1 {
            self.planes.div_ceil(self.pt)
        } else {
            self.planes * self.bands
        }
    }

    fn kernel(&self, ctx: &LowerCtx<'_>) -> Result<Kernel, LowerError> {
        let core = &ctx.target.core;
        let mut k = K::new(&self.name, core);
        let bytes = self.planes * self.h.size * self.w.size * self.ty.bytes();
        let spread = spread(self.items(), bytes, core);
        for (name, v) in [
            ("planes", self.planes),
            ("compute_f16", u64::from(self.ct == Ty::F16)),
            ("row_lanes", self.row),
            ("repeats_per_row", self.reps),
            ("planes_per_tile", self.pt),
            ("out_rows_per_tile", self.bo),
            ("bands", self.bands),
            ("w_classes", self.full.len() as u64),
            ("w_group0_classes", self.group0.len() as u64),
            (
                "shift_copies",
                if self.mode == WMode::Shift {
                    self.copies.len() as u64
                } else {
                    0
                },
            ),
            ("block_dim", u64::from(spread.blocks)),
            ("tiles_per_block", spread.per_block),
        ] {
            k.a.tiling(name, v as i64);
        }
        let mut operands = vec![Operand::Input(0), Operand::Output(0)];
        if let What::MaxIndices { .. } = self.what {
            operands.extend([Operand::Output(1), Operand::Derived(0), Operand::Derived(1)]);
        }
        let ptr = args(&mut k, operands.len());
        let regs = Regs {
            ptr,
            jl: k.a.reg(),
            jc: k.a.reg(),
            js: k.a.reg(),
            band: k.a.reg(),
            gm: k.a.reg(),
            imm: k.a.reg(),
            lp: [k.a.reg(), k.a.reg(), k.a.reg()],
        };
        let bufs = self.layout(&mut |n| k.alloc(n)).ok_or_else(|| {
            ctx.error("internal error: the planned pool buffers do not fit in UB")
        })?;
        k.a.tiling("ub_bytes", k.ub_used() as i64);
        spread.first(&mut k, regs.jl);
        k.a.mov(regs.jc, regs.jl);
        k.a.mov(regs.js, regs.jl);
        self.init(&mut k, &regs, &bufs);
        let load = |k: &mut K, b: usize, _: bool| self.load(k, &regs, &bufs, b);
        let compute = |k: &mut K, b: usize, _: bool| self.compute(k, &regs, &bufs, b);
        let store = |k: &mut K, b: usize, _: bool| self.store(k, &regs, &bufs, b);
        flow_init(&mut k, true);
        Flow {
            tiles: spread.per_block,
            load: &load,
            compute: &compute,
            store: Some(&store),
        }
        .emit(&mut k);
        flow_fini(&mut k, true);
        ctx.kernel(k.a, spread.blocks, operands)
    }

    /// Once per block: both input tiles filled with the identity (pad rows and columns stay
    /// so, the loads only write data rows), AveragePool's scale table, the Indices' tables.
    fn init(&self, k: &mut K, regs: &Regs, bufs: &Bufs) {
        let rows = self.ux() + self.x_slack_rows();
        let lanes = rows * self.row + self.t_slack_blocks * self.ty.lanes();
        let id = self.what.identity(self.ty);
        for x in bufs.x.iter().flatten() {
            fill(k, regs.imm, self.ty, *x, lanes, id);
        }
        for h in bufs.head.iter().flatten() {
            fill(k, regs.imm, self.ty, *h, rows * self.ty.lanes(), id);
        }
        if let Some(fs) = bufs.scale {
            self.build_scale(k, regs, fs);
        }
        // The loads overwrite what V has just filled.
        queue::barrier(&mut k.a, Pipe::V, Pipe::Mte2, 2);
        if let What::MaxIndices { .. } = self.what {
            let cols = self.w.k * self.reps * 32;
            dma(
                k,
                true,
                Addr::Ub(bufs.cols),
                regs.ptr[3],
                1,
                cols,
                cols,
                cols,
            );
            let rows = self.ux() * 32;
            dma(
                k,
                true,
                Addr::Ub(bufs.row_offsets),
                regs.ptr[4],
                1,
                rows,
                rows,
                rows,
            );
            queue::barrier(&mut k.a, Pipe::Mte2, Pipe::V, 2);
        }
    }

    /// AveragePool's table of 1 / count for every output of a tile: the column factors in
    /// every row, times the row factors when tiles are whole planes (bands apply their row
    /// factors per tile, as they differ by band).
    fn build_scale(&self, k: &mut K, regs: &Regs, fs: u64) {
        let What::Average { include_pad } = self.what else {
            return;
        };
        let w = self.w;
        let lanes = 8 * self.reps;
        let col: Vec<f32> = (0..lanes)
            .map(|j| {
                if j < w.out {
                    1.0 / w.counted(j, include_pad) as f32
                } else {
                    0.0
                }
            })
            .collect();
        // The most common factor everywhere, then the others lane by lane.
        let mode = col[w.out as usize / 2];
        fill(k, regs.imm, Ty::F32, fs, lanes, i64::from(mode.to_bits()));
        for (j, v) in col.iter().enumerate() {
            if v.to_bits() != mode.to_bits() {
                k.a.movi(regs.imm, i64::from(v.to_bits()));
                let j = j as u64;
                k.vdup(
                    Opd::ub(fs + j / BLK * 32),
                    regs.imm,
                    Mask::Bits(1 << (j % BLK)),
                    1,
                );
            }
        }
        let row_bytes = lanes * F32;
        if self.bands == 1 {
            // Rows 1.. from row 0 first, row 0 last.
            let rs = &self.kinds[0].row_scale;
            for t in (0..self.bo).rev() {
                k.a.movi(regs.imm, i64::from(rs[t as usize].to_bits()));
                vins(
                    k,
                    VOp::Muls(DType::F32),
                    &[("dst", Opd::ub(fs + t * row_bytes)), ("src", Opd::ub(fs))],
                    &[regs.imm],
                    Mask::Count(lanes),
                    1,
                );
            }
        }
        // Copy the first rows over the others, doubling.
        let rows = if self.bands == 1 { self.bo_pad } else { 1 };
        let total = self.u();
        let mut have = rows;
        while have < total {
            let n = have.min(total - have);
            vins(
                k,
                VOp::Mov(DType::F32),
                &[
                    ("dst", Opd::ub(fs + have * row_bytes)),
                    ("src", Opd::ub(fs)),
                ],
                &[],
                Mask::Count(n * lanes),
                1,
            );
            have += n;
        }
    }

    /// Runs `emit` for the kind of the band in `regs.band`, branching on it when the bands
    /// have more than one kind; the kind of most bands is the fall-through.
    fn dispatch(&self, k: &mut K, regs: &Regs, emit: &dyn Fn(&mut K, &Kind)) {
        if self.kinds.len() == 1 {
            emit(k, &self.kinds[0]);
            return;
        }
        let mut counts = vec![0usize; self.kinds.len()];
        for &i in &self.band_kind {
            counts[i] += 1;
        }
        let default = (0..counts.len()).max_by_key(|&i| counts[i]).unwrap_or(0);
        let labels: Vec<String> = (0..self.kinds.len())
            .map(|_| k.a.new_label("kind"))
            .collect();
        let end = k.a.new_label("kind_end");
        for (b, &i) in self.band_kind.iter().enumerate() {
            if i != default {
                k.a.movi(regs.imm, b as i64);
                let l = k.a.label(&labels[i]);
                k.a.beq(regs.band, regs.imm, l);
            }
        }
        // The default kind falls through from the branches: its label is placed (the builder
        // requires every label it made to be) without forgetting the mask, as no jump lands
        // there.
        k.a.place(&labels[default]);
        emit(k, &self.kinds[default]);
        let end_l = k.a.label(&end);
        k.a.jmp(end_l);
        for (i, kind) in self.kinds.iter().enumerate() {
            if i != default {
                k.place(&labels[i]);
                emit(k, kind);
                k.a.jmp(end_l);
            }
        }
        k.place(&end);
    }

    /// For tile `j`: `regs.gm` = the element index of its first plane (times `plane_elems`)
    /// and, for bands, `regs.band` = its band and `oh0` = its first output row.
    fn locate(&self, k: &mut K, regs: &Regs, j: Reg, plane_elems: u64, oh0: Reg) {
        let (t0, t1) = (k.tmp(0), k.tmp(1));
        if self.bands == 1 {
            k.mul_imm(t1, j, self.pt);
            k.min_imm(t1, self.planes - self.pt);
            k.mul_imm(regs.gm, t1, plane_elems);
            return;
        }
        k.a.movi(t1, self.bands as i64);
        k.a.divu(t0, j, t1);
        k.a.remu(regs.band, j, t1);
        k.mul_imm(regs.gm, t0, plane_elems);
        // oh0 = min(band · bo, Ho − bo).
        k.mul_imm(oh0, regs.band, self.bo);
        k.min_imm(oh0, self.h.out - self.bo);
    }

    /// Loads tile `jl` into X[b]: the data rows of each plane (or of the band) below its pad
    /// rows, at lane `d0` of each row.
    fn load(&self, k: &mut K, regs: &Regs, bufs: &Bufs, b: usize) {
        let (h, w) = (self.h, self.w);
        let esz = self.ty.bytes();
        let (len, ub_row) = (w.size * esz, self.row * esz);
        let row0 = regs.lp[2];
        self.locate(k, regs, regs.jl, h.size * w.size, row0);
        if self.bands > 1 {
            // First input row: max(0, oh0 · sh − ph).
            k.mul_imm(row0, row0, h.s);
            k.addi(row0, (h.pb as i64).wrapping_neg() as u64);
            let z = k.tmp(2);
            k.a.movi(z, 0);
            k.a.max(row0, row0, z);
            k.mul_imm(row0, row0, w.size);
            k.a.add(regs.gm, regs.gm, row0);
        }
        k.mul_imm(regs.gm, regs.gm, esz);
        k.a.add(regs.gm, regs.gm, regs.ptr[0]);
        // (UB tile, first GM byte of a row, bytes per row, UB bytes per row) of each copy
        // and of the head blocks.
        let mut moves: Vec<(u64, u64, u64, u64)> = self
            .copies
            .iter()
            .zip(&bufs.x)
            .map(|(c, x)| {
                (
                    x[b] + c.first_lane() * esz,
                    c.first * esz,
                    (c.end - c.first) * esz,
                    ub_row,
                )
            })
            .collect();
        if let Some(head) = bufs.head {
            moves.push((head[b], 0, self.ty.lanes().min(w.size) * esz, 32));
        }
        self.dispatch(k, regs, &|k, kind| {
            for &(ub, gm_off, bytes, ub_row) in &moves {
                if bytes == 0 {
                    continue;
                }
                let at = ub + kind.top * ub_row;
                let g = k.tmp(2);
                if kind.top == 0 && kind.data == self.pi && kind.data == h.size {
                    // Planes follow each other in GM and in UB: one copy.
                    k.gm_off(g, regs.gm, gm_off);
                    dma(
                        k,
                        true,
                        Addr::Ub(at),
                        g,
                        self.pt * kind.data,
                        bytes,
                        len,
                        ub_row,
                    );
                } else {
                    let plane_ub = self.pi * ub_row;
                    self.per_plane(k, regs, self.pt, h.size * len, plane_ub, &|k, ub, gm| {
                        k.gm_off(g, gm, gm_off);
                        dma(k, true, ub.off(at), g, kind.data, bytes, len, ub_row);
                    });
                }
            }
        });
        k.a.add_imm(regs.jl, 1);
    }

    /// Runs `copy(k, ub, gm)` for `n` planes: `ub` is an offset to add to a plane's UB
    /// address (`ub_step` apart), `gm` the plane's GM address (from `regs.gm`, `gm_step`
    /// apart); a loop when there are many planes.
    fn per_plane(
        &self,
        k: &mut K,
        regs: &Regs,
        n: u64,
        gm_step: u64,
        ub_step: u64,
        copy: &dyn Fn(&mut K, Addr, Reg),
    ) {
        if n <= 4 {
            for q in 0..n {
                let g = regs.lp[1];
                k.gm_off(g, regs.gm, q * gm_step);
                copy(k, Addr::Ub(q * ub_step), g);
            }
            return;
        }
        let [cnt, g, u] = regs.lp;
        k.a.mov(g, regs.gm);
        k.a.movi(u, 0);
        k.a.movi(cnt, n as i64);
        let top = k.a.new_label("plane");
        k.place(&top);
        copy(k, Addr::Rel(u, 0), g);
        k.addi(g, gm_step);
        k.addi(u, ub_step);
        let top_l = k.a.label(&top);
        k.a.r#loop(cnt, top_l);
        k.forget_mask();
    }

    /// Stores tile `js` from the output tiles of buffer `b` (and the Indices').
    fn store(&self, k: &mut K, regs: &Regs, bufs: &Bufs, b: usize) {
        let (h, w) = (self.h, self.w);
        let oh0 = regs.lp[2];
        self.locate(k, regs, regs.js, h.out * w.out, oh0);
        if self.bands > 1 {
            k.mul_imm(oh0, oh0, w.out);
            k.a.add(regs.gm, regs.gm, oh0);
        }
        // The first output element, kept while each output's address is formed.
        let first = regs.band;
        k.a.mov(first, regs.gm);
        let mut outs = vec![(bufs.o[b], self.ty.bytes(), regs.ptr[1])];
        if let What::MaxIndices { .. } = self.what {
            outs.push((bufs.i64s[b], 8, regs.ptr[2]));
        }
        for (ub, esz, base) in outs {
            k.mul_imm(regs.gm, first, esz);
            k.a.add(regs.gm, regs.gm, base);
            let (len, ub_row) = (w.out * esz, 8 * self.reps * esz);
            if self.bo_pad == self.bo {
                dma(
                    k,
                    false,
                    Addr::Ub(ub),
                    regs.gm,
                    self.pt * self.bo,
                    len,
                    len,
                    ub_row,
                );
            } else {
                let plane_gm = h.out * len;
                self.per_plane(
                    k,
                    regs,
                    self.pt,
                    plane_gm,
                    self.bo_pad * ub_row,
                    &|k, u, g| {
                        dma(k, false, u.off(ub), g, self.bo, len, len, ub_row);
                    },
                );
            }
        }
        k.a.add_imm(regs.js, 1);
    }

    /// Computes the tile in the input tiles of buffer `b` into its output tiles.
    fn compute(&self, k: &mut K, regs: &Regs, bufs: &Bufs, b: usize) {
        let esz = self.ty.bytes();
        let lanes_in = self.ty.lanes();
        if self.bands > 1 {
            let t = k.tmp(1);
            k.a.movi(t, self.bands as i64);
            k.a.remu(regs.band, regs.jc, t);
        }
        // Pad rows of this band (the other kinds' loads wrote data there).
        if self.kinds.len() > 1 {
            let id = self.what.identity(self.ty);
            let mut tiles: Vec<(u64, u64)> = bufs.x.iter().map(|x| (x[b], self.row)).collect();
            tiles.extend(bufs.head.map(|h| (h[b], lanes_in)));
            self.dispatch(k, regs, &|k, kind| {
                for &(x, row) in &tiles {
                    fill(k, regs.imm, self.ty, x, kind.top * row, id);
                    let (end, rows_end) = ((kind.top + kind.data) * row, self.bi * row);
                    fill(
                        k,
                        regs.imm,
                        self.ty,
                        x + end * esz,
                        rows_end - end.min(rows_end),
                        id,
                    );
                }
            });
        }
        // A load zero-fills the partial block after its data; max needs -inf there.
        if self.what.is_max() {
            for (c, x) in self.copies.iter().zip(&bufs.x) {
                let tail = c.end_lane() % lanes_in;
                if c.end == c.first || tail == 0 {
                    continue;
                }
                let bits: u128 = ((1u128 << lanes_in) - 1) & !((1u128 << tail) - 1);
                let at = x[b] + c.end_lane() / lanes_in * 32;
                k.a.movi(regs.imm, self.ty.neg_inf());
                let mn = VOp::Dup(self.ty.dtype());
                let rb = self.row / lanes_in;
                walk_rows(k, &regs.lp, self.ux(), 1, self.ty, &[rb], &|k, v| {
                    let d = v.opd(at, rb);
                    vins(
                        k,
                        mn,
                        &[("dst", d)],
                        &[regs.imm],
                        Mask::Bits(bits),
                        v.rows(),
                    );
                });
            }
        }
        let srcs: Vec<u64> = if bufs.x32.is_empty() {
            bufs.x.iter().map(|x| x[b]).collect()
        } else {
            for (x, x32) in bufs.x.iter().zip(&bufs.x32) {
                convert(k, Ty::F32, self.ty, *x32, x[b], self.ux() * self.row);
            }
            if let (Some(h), Some(h32)) = (bufs.head, bufs.head32) {
                convert(k, Ty::F32, self.ty, h32, h[b], self.ux() * lanes_in);
            }
            bufs.x32.clone()
        };
        let res = bufs.results(b);
        match (self.what, self.mode) {
            (What::MaxIndices { colmajor }, _) => {
                self.argmax(k, regs, bufs, srcs[0], res, b, colmajor);
            }
            (_, WMode::Reduce) => {
                let t = match bufs.t {
                    Some(t) => {
                        self.h_pass(k, regs, srcs[0], t);
                        t
                    }
                    None => srcs[0],
                };
                self.w_pass(k, t, res, bufs.s);
            }
            (_, WMode::Shift) => self.shift_pass(k, regs, bufs, &srcs, res, b),
        }
        if self.what == What::Max {
            self.fix_empty(k, regs, res, 0, self.ct.bytes());
        }
        if let Some(fs) = bufs.scale {
            self.scale(k, regs, res, fs);
        }
        if let Some(r32) = bufs.r32 {
            convert(
                k,
                self.ty,
                Ty::F32,
                bufs.o[b],
                r32,
                self.u() * 8 * self.reps,
            );
        }
        k.a.add_imm(regs.jc, 1);
    }

    /// The shift mode's passes: each copy's head columns gathered from the head blocks,
    /// the copies merged lane by lane (the W pass), then the H pass into the results.
    fn shift_pass(&self, k: &mut K, regs: &Regs, bufs: &Bufs, srcs: &[u64], res: u64, b: usize) {
        let rows = self.ux();
        let rb = self.row / BLK;
        if let Some(head) = bufs.head {
            let hsrc = bufs.head32.unwrap_or(head[b]);
            let hb = self.ty.lanes() / BLK;
            for fix in &self.heads {
                let lane0 = self.copies[fix.copy].lane0 as u64;
                // Per (destination block, head block): the groups (lanes) it fills.
                let mut parts: Vec<(u64, u64, u128, u8)> = Vec::new();
                for j in lane0..lane0 + fix.n {
                    let (db, g, src) = (j / BLK, j % BLK, j - lane0);
                    let (sb, lane) = (src / BLK, src % BLK);
                    let i = match parts.iter().position(|p| p.0 == db && p.1 == sb) {
                        Some(i) => i,
                        None => {
                            parts.push((db, sb, 0, 0));
                            parts.len() - 1
                        }
                    };
                    parts[i].2 |= 1u128 << (g * BLK + lane);
                    parts[i].3 |= 1 << g;
                }
                for (db, sb, bits, groups) in parts {
                    let mut done = 0;
                    while done < rows {
                        let n = (rows - done).min(FIELD);
                        let from = Opd {
                            at: Addr::Ub(hsrc + (done * hb + sb) * 32),
                            blk: 0,
                            rep: hb,
                        };
                        let to = Addr::Ub(bufs.gathered + done * 32);
                        vbreduce(
                            k,
                            ReduceOp::Sum,
                            DType::F32,
                            to,
                            from,
                            1,
                            Mask::Bits(bits),
                            n,
                        );
                        done += n;
                    }
                    let lanes = Mask::Bits(u128::from(groups));
                    let at = srcs[fix.copy] + db * 32;
                    walk_rows(k, &regs.lp, rows, 1, Ty::F32, &[rb, 1], &|k, v| {
                        let (d, from) = (v.opd(at, rb), v.row_block(bufs.gathered));
                        vins(
                            k,
                            VOp::Mov(DType::F32),
                            &[("dst", d), ("src", from)],
                            &[],
                            lanes,
                            v.rows(),
                        );
                    });
                }
            }
        }
        let op = if self.what.is_max() {
            VOp::Max(DType::F32)
        } else {
            VOp::Add(DType::F32)
        };
        let (merged, n) = match bufs.merged {
            Some(m) => (m, rows * self.row),
            None => (res, self.u() * self.row),
        };
        if srcs.len() == 1 {
            if bufs.merged.is_none() {
                let (d, x) = (Opd::ub(res), Opd::ub(srcs[0]));
                let mov = VOp::Mov(DType::F32);
                vins(k, mov, &[("dst", d), ("src", x)], &[], Mask::Count(n), 1);
            }
        } else {
            let m = Mask::Count(n);
            let (d, x0, x1) = (Opd::ub(merged), Opd::ub(srcs[0]), Opd::ub(srcs[1]));
            vins(k, op, &[("dst", d), ("src0", x0), ("src1", x1)], &[], m, 1);
            for &x in &srcs[2..] {
                let x = Opd::ub(x);
                vins(k, op, &[("dst", d), ("src0", d), ("src1", x)], &[], m, 1);
            }
        }
        if bufs.merged.is_some() {
            let from = if srcs.len() == 1 { srcs[0] } else { merged };
            self.h_pass(k, regs, from, res);
        }
    }

    /// AveragePool: the sums times the 1 / count table, and for bands the row factors of
    /// the band's kind.
    fn scale(&self, k: &mut K, regs: &Regs, res: u64, fs: u64) {
        let lanes = 8 * self.reps;
        let all = Opd::ub(res);
        vins(
            k,
            VOp::Mul(DType::F32),
            &[("dst", all), ("src0", all), ("src1", Opd::ub(fs))],
            &[],
            Mask::Count(self.u() * lanes),
            1,
        );
        if self.bands == 1 {
            return;
        }
        self.dispatch(k, regs, &|k, kind| {
            // Runs of rows with the same factor, one instruction each.
            let mut t = 0;
            while t < self.bo {
                let f = kind.row_scale[t as usize];
                let mut e = t + 1;
                while e < self.bo && kind.row_scale[e as usize].to_bits() == f.to_bits() {
                    e += 1;
                }
                k.a.movi(regs.imm, i64::from(f.to_bits()));
                let at = Opd::ub(res + t * lanes * F32);
                let m = Mask::Count((e - t) * lanes);
                vins(
                    k,
                    VOp::Muls(DType::F32),
                    &[("dst", at), ("src", at)],
                    &[regs.imm],
                    m,
                    1,
                );
                t = e;
            }
        });
    }

    /// `T[u] = op over the kh taps of X[u·sh + kh·dh]`, every output row of the tile.
    fn h_pass(&self, k: &mut K, regs: &Regs, src: u64, dst: u64) {
        let h = self.h;
        let (ct, rb) = (self.ct, self.row_blocks());
        let op = if self.what.is_max() {
            VOp::Max(ct.dtype())
        } else {
            VOp::Add(ct.dtype())
        };
        let mov = VOp::Mov(ct.dtype());
        let tap = |t: u64| src + t * h.d * rb * 32;
        walk_rows(
            k,
            &regs.lp,
            self.u(),
            self.row,
            ct,
            &[rb, h.s * rb],
            &|k, v| {
                let (m, n) = v.mask();
                let d = v.opd(dst, rb);
                let x = |t| v.opd(tap(t), h.s * rb);
                if h.k == 1 {
                    vins(k, mov, &[("dst", d), ("src", x(0))], &[], m, n);
                    return;
                }
                vins(
                    k,
                    op,
                    &[("dst", d), ("src0", x(0)), ("src1", x(1))],
                    &[],
                    m,
                    n,
                );
                for t in 2..h.k {
                    vins(k, op, &[("dst", d), ("src0", d), ("src1", x(t))], &[], m, n);
                }
            },
        );
    }

    /// The W pass over every row of the tile: one `vbreduce` per block class (and per 255
    /// repeats), the classes merged into `res` (sums add, a group with no lanes in a class
    /// getting 0 there; maxima merge under lane masks, moving a group's first value).
    fn w_pass(&self, k: &mut K, src: u64, res: u64, s: u64) {
        let ct = self.ct;
        let max = self.what.is_max();
        let op = if max { ReduceOp::Max } else { ReduceOp::Sum };
        let total = self.u() * self.reps;
        let mut have = 0u8;
        let classes = self
            .full
            .iter()
            .map(|c| (c, false))
            .chain(self.group0.iter().map(|c| (c, true)));
        for (i, (c, group0)) in classes.enumerate() {
            let dst = if i == 0 { res } else { s };
            if group0 {
                self.group0_reduce(k, op, src, dst, c, total);
            } else {
                self.class_reduce(k, op, src, dst, c, total);
            }
            if i == 0 {
                have = c.groups;
                continue;
            }
            if !max && !group0 {
                let (d, x) = (Opd::ub(res), Opd::ub(s));
                let m = Mask::Count(total * 8);
                vins(
                    k,
                    VOp::Add(DType::F32),
                    &[("dst", d), ("src0", d), ("src1", x)],
                    &[],
                    m,
                    1,
                );
                continue;
            }
            let (old, new) = (c.groups & have, c.groups & !have);
            let merge = if max {
                VOp::Max(ct.dtype())
            } else {
                VOp::Add(ct.dtype())
            };
            let mov = VOp::Mov(ct.dtype());
            for (groups, mn) in [(old, merge), (new, mov)] {
                if groups == 0 {
                    continue;
                }
                let m = group_mask(groups, ct);
                per_repeat(k, total * 8, ct, &|k, off, n| {
                    let (d, from) = (Opd::ub(res + off), Opd::ub(s + off));
                    if mn == mov {
                        vins(k, mn, &[("dst", d), ("src", from)], &[], m, n);
                    } else {
                        vins(k, mn, &[("dst", d), ("src0", d), ("src1", from)], &[], m, n);
                    }
                });
            }
            have |= c.groups;
        }
    }

    /// `dst[8r + g]` = op over class `c`'s lanes of block `r·src_rep + c.block` of `src`, for
    /// repeats `r < total` (`vbreduce` with block stride 0: the 8 groups share the block).
    fn class_reduce(&self, k: &mut K, op: ReduceOp, src: u64, dst: u64, c: &Class, total: u64) {
        let sr = self.src_rep();
        let esz = self.ct.bytes();
        // Runs of repeats whose results fill whole 32-byte blocks (f16: an even count).
        let run = FIELD - FIELD % (32 / (8 * esz)).max(1);
        let mut done = 0;
        while done < total {
            let n = (total - done).min(run);
            let from = Opd {
                at: Addr::Ub(src + (done * sr + c.block) * 32),
                blk: 0,
                rep: sr,
            };
            let to = Addr::Ub(dst + done * 8 * esz);
            vbreduce(k, op, self.ct.dtype(), to, from, 1, Mask::Bits(c.bits), n);
            done += n;
        }
    }

    /// `dst[8r]` = op over group 0's lanes of class `c` in block `r·src_rep + c.block`: the
    /// eight groups of a repeat handle eight consecutive `r` (block stride `src_rep`) and
    /// their results land 8 apart, so a repeat does the work of eight.
    fn group0_reduce(&self, k: &mut K, op: ReduceOp, src: u64, dst: u64, c: &Class, total: u64) {
        let (sr, lpb, esz) = (self.src_rep(), self.ct.lanes(), self.ct.bytes());
        let lanes0 = c.bits & ((1u128 << lpb) - 1);
        let bits: u128 = (0..8).map(|g| lanes0 << (g * lpb)).sum();
        let reps = total.div_ceil(8);
        let mut done = 0;
        while done < reps {
            let n = (reps - done).min(FIELD);
            let from = Opd {
                at: Addr::Ub(src + (done * 8 * sr + c.block) * 32),
                blk: sr,
                rep: 8 * sr,
            };
            let to = Addr::Ub(dst + done * 64 * esz);
            vbreduce(k, op, self.ct.dtype(), to, from, 8, Mask::Bits(bits), n);
            done += n;
        }
    }

    /// MaxPool: outputs whose window holds no input position get `value` (0 for values as
    /// the reference leaves them; -1 for both words of an int64 index), in results of
    /// `esz`-byte elements at `res` (rows of `8R` elements).
    fn fix_empty(&self, k: &mut K, regs: &Regs, res: u64, value: i64, esz: u64) {
        let w = self.w;
        let lanes = 8 * self.reps;
        let row_bytes = lanes * esz;
        let (ty, per) = match esz {
            2 => (DType::I16, 1),
            8 => (DType::I32, 2),
            _ => (DType::I32, 1),
        };
        let lpb = if esz == 2 { 16 } else { 8 };
        let empty_cols: Vec<u64> = (0..w.out).filter(|&c| w.valid(c) == 0).collect();
        if !empty_cols.is_empty() {
            k.a.movi(regs.imm, value);
            let mn = VOp::Dup(ty);
            let rb = row_bytes / 32;
            for c in empty_cols {
                let lane = c * per;
                let bits: u128 = (0..per).map(|i| 1u128 << (lane % lpb + i)).sum();
                let at = res + lane / lpb * 32;
                let ety = if esz == 2 { Ty::F16 } else { Ty::F32 };
                walk_rows(k, &regs.lp, self.u(), 1, ety, &[rb], &|k, v| {
                    vins(
                        k,
                        mn,
                        &[("dst", v.opd(at, rb))],
                        &[regs.imm],
                        Mask::Bits(bits),
                        v.rows(),
                    );
                });
            }
        }
        if self.kinds.iter().any(|kd| !kd.empty_rows.is_empty()) {
            let ety = if esz == 2 { Ty::F16 } else { Ty::F32 };
            self.dispatch(k, regs, &|k, kind| {
                for &t in &kind.empty_rows {
                    for q in 0..self.pt {
                        let at = res + (q * self.bo_pad + t) * row_bytes;
                        fill(k, regs.imm, ety, at, row_bytes / ety.bytes(), value);
                    }
                }
            });
        }
    }

    /// MaxPool with Indices: the W pass first (per window column a single-lane gather, a
    /// compare and two selects, values and column indices), then the H pass over rows the
    /// same way, indices completed with row and plane offsets and widened to int64.
    #[allow(clippy::too_many_arguments)]
    fn argmax(
        &self,
        k: &mut K,
        regs: &Regs,
        bufs: &Bufs,
        src: u64,
        res: u64,
        b: usize,
        colmajor: bool,
    ) {
        let (h, w) = (self.h, self.w);
        let r = self.reps;
        let lanes = 8 * r;
        let ux = self.ux();
        let off = self.d0 - w.pb;
        let f32v = Ty::F32;
        // W pass.
        for t in 0..w.k {
            let dst = if t == 0 { bufs.best_w } else { bufs.gather };
            let cls = classes(off, w.s, &[t * w.d], BLK);
            for (ci, c) in cls.iter().enumerate() {
                let into = if ci == 0 { dst } else { bufs.s };
                // A one-lane sum is the lane, exactly.
                self.class_reduce(k, ReduceOp::Sum, src, into, c, ux * r);
                if ci > 0 {
                    let m = group_mask(c.groups, f32v);
                    per_repeat(k, ux * lanes, f32v, &|k, at, n| {
                        let (d, x) = (Opd::ub(dst + at), Opd::ub(bufs.s + at));
                        vins(
                            k,
                            VOp::Mov(DType::F32),
                            &[("dst", d), ("src", x)],
                            &[],
                            m,
                            n,
                        );
                    });
                }
            }
            let cols = bufs.cols + t * r * 32;
            if t == 0 {
                walk_rows(k, &regs.lp, ux, lanes, f32v, &[r, 0], &|k, v| {
                    let (m, n) = v.mask();
                    let (d, x) = (v.opd(bufs.col_w, r), v.opd(cols, 0));
                    vins(
                        k,
                        VOp::Mov(DType::F32),
                        &[("dst", d), ("src", x)],
                        &[],
                        m,
                        n,
                    );
                });
                continue;
            }
            walk_rows(k, &regs.lp, ux, lanes, f32v, &[r, 0], &|k, v| {
                let (m, n) = v.mask();
                let (g, best, col) = (
                    v.opd(bufs.gather, r),
                    v.opd(bufs.best_w, r),
                    v.opd(bufs.col_w, r),
                );
                vcmp_gt(k, bufs.bits, g, best, m, n);
                k.a.movi(regs.imm, bufs.bits as i64);
                vins(
                    k,
                    VOp::Sel(DType::F32),
                    &[("dst", best), ("src0", g), ("src1", best)],
                    &[regs.imm],
                    m,
                    n,
                );
                let from = v.opd(cols, 0);
                vins(
                    k,
                    VOp::Sel(DType::I32),
                    &[("dst", col), ("src0", from), ("src1", col)],
                    &[regs.imm],
                    m,
                    n,
                );
            });
        }
        // Column index plus the row's offset within the plane.
        walk_rows(k, &regs.lp, ux, lanes, f32v, &[r, 1], &|k, v| {
            let (m, n) = v.mask();
            let col = v.opd(bufs.col_w, r);
            let rows = v.row_block(bufs.row_offsets);
            vins(
                k,
                VOp::Add(DType::I32),
                &[("dst", col), ("src0", col), ("src1", rows)],
                &[],
                m,
                n,
            );
        });
        // H pass.
        let tap = |base: u64, t: u64| base + t * h.d * r * 32;
        walk_rows(
            k,
            &regs.lp,
            self.u(),
            lanes,
            f32v,
            &[r, h.s * r],
            &|k, v| {
                let (m, n) = v.mask();
                let (best, idx) = (v.opd(res, r), v.opd(bufs.best_i, r));
                let st = h.s * r;
                let mov = VOp::Mov(DType::F32);
                let x = v.opd(tap(bufs.best_w, 0), st);
                vins(k, mov, &[("dst", best), ("src", x)], &[], m, n);
                let x = v.opd(tap(bufs.col_w, 0), st);
                vins(k, mov, &[("dst", idx), ("src", x)], &[], m, n);
                for t in 1..h.k {
                    let (val, ix) = (
                        v.opd(tap(bufs.best_w, t), st),
                        v.opd(tap(bufs.col_w, t), st),
                    );
                    vcmp_gt(k, bufs.bits, val, best, m, n);
                    k.a.movi(regs.imm, bufs.bits as i64);
                    vins(
                        k,
                        VOp::Sel(DType::F32),
                        &[("dst", best), ("src0", val), ("src1", best)],
                        &[regs.imm],
                        m,
                        n,
                    );
                    vins(
                        k,
                        VOp::Sel(DType::I32),
                        &[("dst", idx), ("src0", ix), ("src1", idx)],
                        &[regs.imm],
                        m,
                        n,
                    );
                }
            },
        );
        self.fix_empty(k, regs, res, 0, 4);
        // Plane and band offsets: index += plane · H·W + (first virtual row) · row unit.
        let row_unit = if colmajor { 1 } else { w.size };
        let base = regs.gm;
        let plane = h.size * w.size;
        let (t0, t1) = (k.tmp(0), k.tmp(1));
        if self.bands == 1 {
            k.mul_imm(t1, regs.jc, self.pt);
            k.min_imm(t1, self.planes - self.pt);
            k.mul_imm(base, t1, plane);
        } else {
            k.a.movi(t1, self.bands as i64);
            k.a.divu(t0, regs.jc, t1);
            k.mul_imm(base, t0, plane);
            // The band's first virtual row: min(band · bo, Ho − bo) · sh (− ph below).
            k.mul_imm(t1, regs.band, self.bo);
            k.min_imm(t1, h.out - self.bo);
            k.mul_imm(t1, t1, h.s * row_unit);
            k.a.add(base, base, t1);
        }
        k.addi(base, (h.pb as i64 * row_unit as i64).wrapping_neg() as u64);
        for q in 0..self.pt {
            let at = Opd::ub(bufs.best_i + q * self.bo_pad * lanes * 4);
            vins(
                k,
                VOp::Adds(DType::I32),
                &[("dst", at), ("src", at)],
                &[base],
                Mask::Count(self.bo * lanes),
                1,
            );
            if q + 1 < self.pt {
                k.addi(base, plane);
            }
        }
        // Widen to int64: lane g of block r to i32 pair 8r + g (the high words stay 0).
        let i64s = bufs.i64s[b];
        fill(k, regs.imm, Ty::F32, i64s, self.u() * lanes * 2, 0);
        let total = self.u() * r;
        let bits: u128 = (0..8).map(|g| 1u128 << (9 * g)).sum();
        let mut done = 0;
        while done < total {
            let n = (total - done).min(FIELD);
            let from = Opd {
                at: Addr::Ub(bufs.best_i + done * 32),
                blk: 0,
                rep: 1,
            };
            vbreduce(
                k,
                ReduceOp::Sum,
                DType::I32,
                Addr::Ub(i64s + done * 64),
                from,
                2,
                Mask::Bits(bits),
                n,
            );
            done += n;
        }
        self.fix_empty(k, regs, i64s, -1, 8);
    }
}

// ---- GlobalAveragePool ----------------------------------------------------------------------------

/// Planes shorter than this are never split into segments to fill the cores.
const MIN_SPLIT_PLANE: u64 = 16 * 1024;
/// Segments are at least this long.
const MIN_SEGMENT: u64 = 4096;

fn global_average_pool(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    if x.format == Format::Nc1hwc0 {
        return global_average_pool_of_fractal(ctx, x);
    }
    let ty = Ty::of(ctx, x, "the input")?;
    let d = dims(ctx, x)?;
    let planes = d[0] * d[1];
    let plane: u64 = d[2..].iter().product();
    if planes == 0 {
        return Ok(no_kernels());
    }
    if plane == 0 {
        return Err(
            ctx.error("the spatial dims are empty: the mean of no elements (NaN) has no kernel")
        );
    }
    if plane == 1 {
        return Ok(Lowered::Alias { input: 0 });
    }
    let core = &ctx.target.core;
    let cores = core.vector_blocks();
    let scale = 1.0 / plane as f32;
    let whole = RowMean {
        name: kernel_name(ctx, ""),
        rows: planes,
        len: plane,
        group: 1,
        segs: 1,
        plane,
        in_ty: ty,
        out_ty: ty,
        scale,
        src: Operand::Input(0),
        dst: Operand::Output(0),
    };
    // Segments when a plane does not fit, or when few long planes would leave cores idle.
    let mut segs = 1;
    while whole.with_len(plane.div_ceil(segs)).rows_per_tile(core) == 0 {
        segs *= 2;
        if plane.div_ceil(segs) < REP {
            return Err(ctx.error(format!(
                "a segment of {} elements does not fit in the {}-byte unified buffer",
                plane.div_ceil(segs),
                core.ub_bytes
            )));
        }
    }
    if planes < cores && plane >= MIN_SPLIT_PLANE {
        segs = segs.max((cores / planes).min(plane / MIN_SEGMENT)).max(1);
    }
    if segs == 1 {
        return Ok(Lowered::Kernels {
            kernels: vec![whole.kernel(ctx)?],
            derived: Vec::new(),
            workspace_bytes: 0,
        });
    }
    // Pass 1: f32 partial sums of `segs` segments per plane (the last one overlapping its
    // neighbour, the overlap zeroed); pass 2: their mean.
    let seg = round8(plane.div_ceil(segs)).min(plane);
    let segs = plane.div_ceil(seg);
    let partial = RowMean {
        name: kernel_name(ctx, "segments"),
        rows: planes * segs,
        len: seg,
        group: 1,
        segs,
        plane,
        in_ty: ty,
        out_ty: Ty::F32,
        scale: 1.0,
        src: Operand::Input(0),
        dst: Operand::Workspace(0),
    };
    let mean = RowMean {
        name: kernel_name(ctx, "mean"),
        rows: planes,
        len: segs,
        group: 1,
        segs: 1,
        plane: segs,
        in_ty: Ty::F32,
        out_ty: ty,
        scale,
        src: Operand::Workspace(0),
        dst: Operand::Output(0),
    };
    Ok(Lowered::Kernels {
        kernels: vec![partial.kernel(ctx)?, mean.kernel(ctx)?],
        derived: Vec::new(),
        workspace_bytes: (planes * segs * F32).div_ceil(32) * 32,
    })
}

/// Row means: `rows` rows of `len` elements, times `scale`. With `segs > 1` a row is segment
/// `j % segs` of plane `j / segs` (planes `plane` elements apart in GM), starting at
/// `min(j·len, plane − len)`; the last segment's overlap with the one before is zeroed.
#[derive(Debug, Clone)]
struct RowMean {
    name: String,
    rows: u64,
    len: u64,
    /// Consecutive elements of a row that are separate means: 1 for a plane of one channel,
    /// 16 for a 5HD plane (`[H·W][16]`: each pixel unit holds the plane's 16 channels).
    group: u64,
    segs: u64,
    plane: u64,
    in_ty: Ty,
    out_ty: Ty,
    scale: f32,
    src: Operand,
    dst: Operand,
}

/// UB addresses of a row-mean kernel.
struct MeanBufs {
    x: [u64; 2],
    x32: Option<u64>,
    /// One block per row: each row's sum in lane 0.
    firsts: u64,
    sums: [u64; 2],
    out16: Option<[u64; 2]>,
}

impl RowMean {
    fn with_len(&self, len: u64) -> RowMean {
        RowMean {
            len,
            ..self.clone()
        }
    }

    /// Lanes per UB row (whole 32-byte blocks of the input type).
    fn stride(&self) -> u64 {
        self.len.div_ceil(self.in_ty.lanes()) * self.in_ty.lanes()
    }

    fn layout(&self, rows: u64, alloc: &mut dyn FnMut(u64) -> Option<u64>) -> Option<MeanBufs> {
        let lanes = rows * self.stride();
        let x = [
            alloc(lanes * self.in_ty.bytes())?,
            alloc(lanes * self.in_ty.bytes())?,
        ];
        let x32 = match self.in_ty {
            Ty::F16 => Some(alloc(lanes * F32)?),
            Ty::F32 => None,
        };
        let firsts = alloc(round8(rows) * 32)?;
        let sums_bytes = round8(rows * self.group) * F32;
        let (sums, out16) = match self.out_ty {
            Ty::F32 => ([alloc(sums_bytes)?, alloc(sums_bytes)?], None),
            Ty::F16 => {
                let s = alloc(sums_bytes)?;
                ([s, s], Some([alloc(sums_bytes)?, alloc(sums_bytes)?]))
            }
        };
        Some(MeanBufs {
            x,
            x32,
            firsts,
            sums,
            out16,
        })
    }

    /// Rows per tile (0: not even one fits): about a quarter of a block's rows, at least
    /// [`MIN_TILE_BYTES`], at most what UB holds.
    fn rows_per_tile(&self, core: &CoreSpec) -> u64 {
        let budget = core.ub_bytes.saturating_sub(2048);
        let fits = |r: u64| {
            let mut s = Sizer(0);
            self.layout(r, &mut |n| Some(s.take(n)));
            s.0 <= budget
        };
        if self.segs > 1 || !fits(1) {
            return u64::from(fits(1));
        }
        let (mut lo, mut hi) = (1, self.rows.min(1 << 16));
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) { lo = mid } else { hi = mid - 1 }
        }
        let cores = core.vector_blocks();
        let want = self
            .rows
            .div_ceil(cores)
            .div_ceil(TILES_PER_BLOCK)
            .max(MIN_TILE_BYTES.div_ceil(self.len * self.in_ty.bytes()));
        want.clamp(1, lo)
    }

    /// The sums of `rows` f32 rows at `x` (lanes past `len` zero) into `sums`: pairwise
    /// halving in place (`x[.., 0..n-h] += x[.., h..n]`, `h` a whole number of blocks) down
    /// to one repeat, a `vreduce` per row into lane 0 of a block per row at `firsts`, and a
    /// `vbreduce` of those lanes into consecutive sums.
    fn row_sums(&self, k: &mut K, lp: &[Reg; 3], x: u64, rows: u64, firsts: u64, sums: u64) {
        let sb = self.stride() / BLK;
        let n = self.halve(k, lp, x, rows, REP, BLK);
        walk_rows(k, lp, rows, n, Ty::F32, &[sb, 1], &|k, v| {
            let (m, reps) = v.mask();
            let to = v.row_block(firsts).at;
            vreduce_any(
                k,
                false,
                ReduceOp::Sum,
                DType::F32,
                to,
                v.opd(x, sb),
                BLK,
                m,
                reps,
            );
        });
        let reps = rows.div_ceil(BLK);
        let mut done = 0;
        while done < reps {
            let n = (reps - done).min(FIELD);
            let from = Opd::ub(firsts + done * 256);
            let to = Addr::Ub(sums + done * 32);
            vbreduce(
                k,
                ReduceOp::Sum,
                DType::F32,
                to,
                from,
                1,
                Mask::lane_of_blocks(&[0]),
                n,
            );
            done += n;
        }
    }

    /// Pairwise halving of `rows` f32 rows at `x` in place (`x[.., 0..n-h] += x[.., h..n]`,
    /// `h` half of `n` rounded up to a multiple of `step` lanes) until at most `stop` lanes
    /// are left; returns how many.
    fn halve(&self, k: &mut K, lp: &[Reg; 3], x: u64, rows: u64, stop: u64, step: u64) -> u64 {
        let sb = self.stride() / BLK;
        let mut n = self.len;
        while n > stop {
            let h = n.div_ceil(2).next_multiple_of(step);
            walk_rows(k, lp, rows, n - h, Ty::F32, &[sb], &|k, v| {
                let (m, reps) = v.mask();
                let d = v.opd(x, sb);
                let y = v.opd(x + h * F32, sb);
                vins(
                    k,
                    VOp::Add(DType::F32),
                    &[("dst", d), ("src0", d), ("src1", y)],
                    &[],
                    m,
                    reps,
                );
            });
            n = h;
        }
        n
    }

    fn kernel(&self, ctx: &LowerCtx<'_>) -> Result<Kernel, LowerError> {
        let core = &ctx.target.core;
        let rt = self.rows_per_tile(core);
        if rt == 0 {
            return Err(ctx.error(format!(
                "a row of {} elements does not fit in the {}-byte unified buffer",
                self.len, core.ub_bytes
            )));
        }
        let tiles = self.rows.div_ceil(rt);
        let spread = spread(tiles, self.rows * self.len * self.in_ty.bytes(), core);
        let mut k = K::new(&self.name, core);
        for (name, v) in [
            ("rows", self.rows),
            ("row_len", self.len),
            ("segments", self.segs),
            ("rows_per_tile", rt),
            ("block_dim", u64::from(spread.blocks)),
            ("tiles_per_block", spread.per_block),
        ] {
            k.a.tiling(name, v as i64);
        }
        let ptr = args(&mut k, 2);
        let bufs = self.layout(rt, &mut |n| k.alloc(n)).ok_or_else(|| {
            ctx.error("internal error: the planned mean buffers do not fit in UB")
        })?;
        k.a.tiling("ub_bytes", k.ub_used() as i64);
        let (jl, jc, js, gm, imm) = (k.a.reg(), k.a.reg(), k.a.reg(), k.a.reg(), k.a.reg());
        let lp = [k.a.reg(), k.a.reg(), k.a.reg()];
        spread.first(&mut k, jl);
        k.a.mov(jc, jl);
        k.a.mov(js, jl);
        let esz = self.in_ty.bytes();
        let scale = (self.scale != 1.0).then(|| {
            k.a.movi(imm, i64::from(self.scale.to_bits()));
            imm
        });
        let load = |k: &mut K, b: usize, _: bool| {
            if self.segs == 1 {
                let t = k.tmp(1);
                k.mul_imm(t, jl, rt);
                k.min_imm(t, self.rows - rt);
                k.mul_imm(gm, t, self.len * esz);
            } else {
                // plane · plane_len + min(seg · len, plane_len − len).
                let (t0, t1) = (k.tmp(0), k.tmp(1));
                k.a.movi(t1, self.segs as i64);
                k.a.divu(t0, jl, t1);
                k.a.remu(t1, jl, t1);
                k.mul_imm(t1, t1, self.len);
                k.min_imm(t1, self.plane - self.len);
                k.mul_imm(gm, t0, self.plane);
                k.a.add(gm, gm, t1);
                k.mul_imm(gm, gm, esz);
            }
            k.a.add(gm, gm, ptr[0]);
            let len = self.len * esz;
            dma(
                k,
                true,
                Addr::Ub(bufs.x[b]),
                gm,
                rt,
                len,
                len,
                self.stride() * esz,
            );
            k.a.add_imm(jl, 1);
        };
        let compute = |k: &mut K, b: usize, _: bool| {
            let x = match bufs.x32 {
                Some(x32) => {
                    convert(k, Ty::F32, self.in_ty, x32, bufs.x[b], rt * self.stride());
                    x32
                }
                None => bufs.x[b],
            };
            let overlap = self.segs * self.len - self.plane;
            if self.segs > 1 && overlap > 0 {
                // The last segment of a plane starts `overlap` elements early: zero them
                // (a mask of `overlap` elements there, of none elsewhere).
                let (t0, t1) = (k.tmp(0), k.tmp(1));
                k.a.movi(t1, self.segs as i64);
                k.a.remu(t0, jc, t1);
                k.a.movi(t1, self.segs as i64 - 1);
                k.a.seq(t0, t0, t1);
                k.mul_imm(t0, t0, overlap);
                k.a.set_mask_count(t0);
                let zero = k.tmp(2);
                k.a.movi(zero, 0);
                k.a.movi(t1, x as i64);
                k.a.vdup(DType::F32, t1, zero);
                k.forget_mask();
            }
            if self.group > 1 {
                // Halved down to one group, each row's `group` sums are at its start: times
                // the scale, they are packed row after row.
                self.halve(k, &lp, x, rt, self.group, self.group.next_multiple_of(BLK));
                let sb = self.stride() / BLK;
                let gb = self.group * F32 / 32;
                let sums = bufs.sums[b];
                walk_rows(k, &lp, rt, self.group, Ty::F32, &[sb, gb], &|k, v| {
                    let (m, reps) = v.mask();
                    let (d, y) = (v.opd(sums, gb), v.opd(x, sb));
                    match scale {
                        Some(s) => vins(
                            k,
                            VOp::Muls(DType::F32),
                            &[("dst", d), ("src", y)],
                            &[s],
                            m,
                            reps,
                        ),
                        None => vins(
                            k,
                            VOp::Mov(DType::F32),
                            &[("dst", d), ("src", y)],
                            &[],
                            m,
                            reps,
                        ),
                    }
                });
                if let Some(o) = bufs.out16 {
                    convert(k, Ty::F16, Ty::F32, o[b], sums, rt * self.group);
                }
                k.a.add_imm(jc, 1);
                return;
            }
            self.row_sums(k, &lp, x, rt, bufs.firsts, bufs.sums[b]);
            if let Some(s) = scale {
                let at = Opd::ub(bufs.sums[b]);
                let m = Mask::Count(rt);
                vins(
                    k,
                    VOp::Muls(DType::F32),
                    &[("dst", at), ("src", at)],
                    &[s],
                    m,
                    1,
                );
            }
            if let Some(o) = bufs.out16 {
                convert(k, Ty::F16, Ty::F32, o[b], bufs.sums[b], rt);
            }
            k.a.add_imm(jc, 1);
        };
        let store = |k: &mut K, b: usize, _: bool| {
            let osz = self.out_ty.bytes() * self.group;
            let t = k.tmp(1);
            k.mul_imm(t, js, rt);
            k.min_imm(t, self.rows - rt);
            k.mul_imm(gm, t, osz);
            k.a.add(gm, gm, ptr[1]);
            let from = bufs.out16.map_or(bufs.sums[b], |o| o[b]);
            dma(
                k,
                false,
                Addr::Ub(from),
                gm,
                1,
                rt * osz,
                rt * osz,
                (rt * osz).div_ceil(32) * 32,
            );
            k.a.add_imm(js, 1);
        };
        flow_init(&mut k, true);
        Flow {
            tiles: spread.per_block,
            load: &load,
            compute: &compute,
            store: Some(&store),
        }
        .emit(&mut k);
        flow_fini(&mut k, true);
        ctx.kernel(k.a, spread.blocks, vec![self.src, self.dst])
    }
}

/// GlobalAveragePool over a 5HD input (the end of a layout region): its output `[N, C, 1,
/// 1]` is the same bytes in both formats. A single-pixel plane is already the output; a larger
/// one is a grouped row mean over the 5HD planes, or, when a plane does not fit the unified
/// buffer, goes through a TransData back to NCHW in the workspace first.
fn global_average_pool_of_fractal(
    ctx: &LowerCtx<'_>,
    x: &TensorDesc,
) -> Result<Lowered, LowerError> {
    let d = dims(ctx, x)?;
    if d.len() != 4 {
        return Err(ctx.error(format!(
            "an NC1HWC0 input must be rank 4 (N, C, H, W); got rank {}",
            d.len()
        )));
    }
    let plane = d[2] * d[3];
    if plane <= 1 {
        return Ok(Lowered::Alias { input: 0 });
    }
    // Natively, as GE does: a plane of one channel block is `[H·W][16]`, its 16 means are the
    // output's 16 channels, and `[N][C1][16]` is the NCHW output's order.
    let ty = Ty::of(ctx, x, "the input")?;
    let native = RowMean {
        name: kernel_name(ctx, "5hd"),
        rows: d[0] * d[1] / 16,
        len: plane * 16,
        group: 16,
        segs: 1,
        plane: plane * 16,
        in_ty: ty,
        out_ty: ty,
        scale: 1.0 / plane as f32,
        src: Operand::Input(0),
        dst: Operand::Output(0),
    };
    if native.rows_per_tile(&ctx.target.core) > 0 {
        return Ok(Lowered::Kernels {
            kernels: vec![native.kernel(ctx)?],
            derived: Vec::new(),
            workspace_bytes: 0,
        });
    }
    // A plane too large for the unified buffer goes back to NCHW first.
    let mut nchw = x.clone();
    nchw.format = Format::Nd;
    let sub = LowerCtx {
        node: ctx.node,
        inputs: vec![Some(&nchw)],
        values: vec![None],
        outputs: ctx.outputs,
        target: ctx.target,
    };
    let lowered = global_average_pool(&sub)?;
    let mut b = Build::default();
    let ws = b.scratch(d.iter().product::<u64>() * 2);
    conv5hd::transdata(
        ctx,
        &mut b,
        [d[0], d[1] / 16, plane, 16],
        Operand::Input(0),
        ws,
    )?;
    b.inline(lowered, &|_| ws, Operand::Output(0), |name| name)
        .map_err(|e| ctx.error(e))?;
    Ok(b.finish())
}
