//! Depthwise Conv (`group` = input channels; output channel `m` reads input channel
//! `m / (M / C)`, so channel multipliers work too) on the vector unit in f32. Every output is a
//! short sum over one channel's window, which the cube could only do with 15/16 of each
//! fractal zero; the vector unit does it as one multiply-accumulate per tap over whole rows.
//!
//! Two kernels:
//!
//! ```text
//!   pad:   X (NCHW, f16/f32) ─MTE2─▶ UB ─vconv/vmov f32─▶ UB row + zero tail ─MTE3─▶ Xp
//!   dw:    Xp ─MTE2 (one shifted copy per kernel column)─▶ UB ┐
//!          per-channel splat blocks (bias, taps) ─MTE2──────▶ UB ┴ vmla per tap ─▶ f32 rows
//!          rows (─vconv f16) (─vbreduce gather for strides) ─MTE3─▶ Y (NCHW)
//! ```
//!
//! **Why a padded copy.** A tap's window is the input row shifted by a few elements, but
//! vector operands start on 32-byte blocks, so each kernel column gets its own copy of the rows,
//! loaded by a DMA whose GM side is byte-exact. Zero padding would need zeros in GM just left
//! and right of each row (and before the tensor's first element, outside any buffer), so the
//! `pad` kernel first writes `Xp`: f32 planes of `(H + pt + pb) × (W + pl + pr)` with the
//! padding zeroed. Each padded row is written in one burst from a UB row whose tail is zero, so
//! the burst also zeroes the right padding of its row and the left padding of the next; pad rows
//! are written from a zero area. Every window read is then in bounds and needs no masking. A
//! plane's data rows move in chunks, one DMA in and one out for up to 64 rows (a row at a time,
//! every transfer and hand-over waited out a GM latency: MobileNet's pad kernels ran at under
//! 1% of their pipes).
//!
//! **dw kernel.** Blocks take contiguous runs of output rows (`(n · M + m) · Ho + oh`), in
//! tiles of up to `R` rows of one plane; the input band of a tile (its rows times the kernel
//! height) comes in with one DMA per kernel column, the channel's bias and tap values as 32-byte
//! blocks of eight copies (a splat operand, prepared at compile time), then per tap one `vmla`
//! over the tile's rows. Tiles are double-buffered (MTE2 ⇄ V ⇄ MTE3, ping-pong by tile parity).
//! A horizontal stride computes the dense row (every column) and gathers every `sw`-th value:
//! a `vbreduce` whose mask keeps one lane per block moves one value into each result block,
//! and a DMA with single-element bursts writes those blocks to strided GM positions (one pair
//! per residue of the output column, since the kept lane repeats with that period).

use gearsim_isa::{DType, Pipe, ReduceOp, SReg, SType, Space, units};

use super::super::writer::{Asm, Reg};
use super::super::{LowerCtx, LowerError, Lowered, Operand, kernel_name};
use super::conv::ConvShape;
use super::gemm::OutType;
use super::{Build, const_values, cube_type, gcd};
use crate::CoreSpec;
use crate::ir::DataType;

/// Bytes of a vector block (the DMA and alignment unit of UB).
const BLOCK: u64 = units::BLOCK_BYTES;
/// f32 lanes of a vector repeat (256 bytes).
const F32_REPEAT: u64 = units::REPEAT_BYTES / 4;
/// Largest vector repeat count and block stride (u8 fields).
const MAX_REPEAT: u64 = units::REPEAT_MAX;

/// Event ids (pipe pairs MTE2 ⇄ V ⇄ MTE3), by buffer parity.
mod ev {
    /// MTE2 → V: a tile's inputs are in UB.
    pub const READY: [u8; 2] = [0, 1];
    /// V → MTE2: the inputs were used, the buffer may be refilled.
    pub const FREE: [u8; 2] = [0, 1];
    /// V → MTE3: a tile's outputs are in UB.
    pub const OUT_READY: [u8; 2] = [0, 1];
    /// MTE3 → V: the outputs were written, the buffer may be refilled.
    pub const OUT_FREE: [u8; 2] = [0, 1];
    /// V → MTE3: the zero area is filled (once, before the first zero write).
    pub const ZEROED: u8 = 2;
}

/// Argument indices of the pad kernel.
mod pad_arg {
    pub const X: usize = 0;
    pub const XP: usize = 1;
}

/// Argument indices of the dw kernel.
mod dw_arg {
    pub const XP: usize = 0;
    /// Per output channel: the bias block, then one block per tap.
    pub const CONSTS: usize = 1;
    pub const OUT: usize = 2;
    /// Runtime bias fractals (`[ceil(M/16)][16][16]` f32); the constants when there are none.
    pub const BIAS: usize = 3;
}

/// Depthwise Conv (`group == C`, `M` a multiple of `C`).
pub(crate) fn lower(ctx: &LowerCtx<'_>, s: &ConvShape) -> Result<Lowered, LowerError> {
    let in_ty = cube_type(ctx, ctx.input(0)?)?;
    let out_ty = cube_type(ctx, &ctx.outputs[0])?;
    let weights = const_values(ctx, 1).ok_or_else(|| {
        ctx.error("depthwise Conv weights must be a constant (they are laid out when compiling)")
    })?;
    let taps = s.kh * s.kw;
    if weights.len() as u64 != s.m * taps {
        return Err(ctx.error(format!(
            "depthwise weights have {} values, expected {} x {taps}",
            weights.len(),
            s.m
        )));
    }
    let core = &ctx.target.core;
    if core.event_ids < 3 {
        return Err(ctx.error(format!(
            "the depthwise kernels need 3 event ids per pipe pair, the core has {}",
            core.event_ids
        )));
    }
    let g = Geometry::new(s, in_ty, out_ty, core).map_err(|e| ctx.error(e))?;
    let bias_values = const_values(ctx, 2);
    // Per output channel: a block of eight copies of its bias, then one per tap.
    let mut consts = Vec::with_capacity((s.m * (taps + 1) * BLOCK) as usize);
    for m in 0..s.m as usize {
        let bias = bias_values.as_ref().map_or(0.0, |b| b[m]);
        let row = &weights[m * taps as usize..(m + 1) * taps as usize];
        for v in std::iter::once(&bias).chain(row) {
            for _ in 0..BLOCK / 4 {
                consts.extend_from_slice(&v.to_le_bytes());
            }
        }
    }

    let mut b = Build::default();
    let xp = b.scratch(g.xp_bytes);
    let mut runtime_bias = None;
    if let (Some(bd), None) = (ctx.inputs.get(2).copied().flatten(), &bias_values) {
        runtime_bias = Some(super::runtime_bias(ctx, &mut b, bd, s.m)?);
    }
    let consts = b.derive(DataType::F32, consts);

    let mut a = Asm::new(&kernel_name(ctx, "pad"));
    let blocks = pad_kernel(&mut a, s, &g, core);
    b.kernels
        .push(ctx.kernel(a, blocks, vec![Operand::Input(0), xp])?);

    let mut a = Asm::new(&kernel_name(ctx, "dw"));
    let blocks = dw_kernel(&mut a, s, &g, runtime_bias.is_some());
    let bias = runtime_bias.unwrap_or(consts);
    b.kernels
        .push(ctx.kernel(a, blocks, vec![xp, consts, Operand::Output(0), bias])?);
    Ok(b.finish())
}

/// `x` rounded up to whole vector blocks.
fn round_block(x: u64) -> u64 {
    x.next_multiple_of(BLOCK)
}

/// One residue class of the strided gather: output columns `u, u + L, u + 2L, …`.
#[derive(Debug, Clone, Copy)]
struct Phase {
    /// First output column (the residue).
    u: u64,
    /// Columns in the class.
    count: u64,
    /// The lane every source block keeps.
    lane: u64,
    /// Block of the dense row holding column `u`.
    first_block: u64,
    /// `vbreduce` repeats (eight results each).
    repeats: u64,
    /// Offset of the class's results in a row's gather area.
    at: u64,
}

/// Sizes and UB layout of both kernels.
#[derive(Debug, Clone)]
struct Geometry {
    in_ty: OutType,
    out_ty: OutType,
    /// Padded plane.
    hp: u64,
    wp: u64,
    /// Dense output columns (every column a window starts at, for the stride's gather).
    wd: u64,
    /// UB pitch of an input band row (f32).
    up: u64,
    /// UB pitch of an accumulator row (f32) and of an f16 output row.
    ap: u64,
    op: u64,
    /// Output rows per tile and input band rows per tile.
    r: u64,
    rb: u64,
    /// Strided gather: the period `L` of the kept lane, the source block stride, the classes
    /// and a row's gather bytes.
    period: u64,
    gather_blk: u64,
    phases: Vec<Phase>,
    gather_row: u64,
    /// Whether one instruction per tap covers all rows (rows of at most 64 values).
    narrow: bool,
    /// Bytes of Xp with the slack the tiles read (and the pad kernel writes) past the end.
    xp_bytes: u64,
    /// dw kernel UB addresses, per parity: band (per kernel column), taps, accumulators, f16
    /// rows, gather areas.
    band: [u64; 2],
    taps: [u64; 2],
    acc: [u64; 2],
    half: [u64; 2],
    gather: [u64; 2],
    /// Rows the blocks of the dw kernel start at (with the end).
    dw_blocks: u64,
}

impl Geometry {
    fn new(
        s: &ConvShape,
        in_ty: OutType,
        out_ty: OutType,
        core: &CoreSpec,
    ) -> Result<Geometry, String> {
        let hp = s.h + s.pt + s.pb;
        let wp = s.w + s.pl + s.pr;
        let wd = (s.wo - 1) * s.sw + 1;
        let up = round_block(wd * 4);
        let es = out_ty.bytes();
        let lanes = BLOCK / es;
        // The gather: output column `ow` is dense column `ow · sw`, in block `ow · sw / lanes`
        // at lane `ow · sw mod lanes`; the lane repeats every `L` columns, `L · sw / lanes`
        // blocks apart.
        let (mut period, mut gather_blk, mut phases, mut gather_row) = (1, 0, Vec::new(), 0);
        let mut dense_need = 0;
        if s.sw > 1 {
            period = lanes / gcd(s.sw, lanes);
            gather_blk = period * s.sw / lanes;
            if 8 * gather_blk > MAX_REPEAT {
                return Err(format!(
                    "a horizontal stride of {} is too large for the vector gather (at most {})",
                    s.sw,
                    MAX_REPEAT / 8 * lanes / period
                ));
            }
            for u in 0..period.min(s.wo) {
                let count = (s.wo - u).div_ceil(period);
                let repeats = count.div_ceil(8);
                if repeats > MAX_REPEAT {
                    return Err(format!(
                        "an output row of {} columns is too long for the strided gather",
                        s.wo
                    ));
                }
                let first_block = u * s.sw / lanes;
                dense_need = dense_need.max(first_block + (repeats * 8 - 1) * gather_blk + 1);
                phases.push(Phase {
                    u,
                    count,
                    lane: u * s.sw % lanes,
                    first_block,
                    repeats,
                    at: gather_row,
                });
                gather_row += repeats * 8 * BLOCK;
            }
        }
        // The row the gather reads is the accumulator (f32 out) or the f16 row.
        let mut ap = up;
        let mut op = round_block(wd * 2);
        if out_ty == OutType::F32 {
            ap = ap.max(dense_need * BLOCK);
        } else {
            op = op.max(dense_need * BLOCK);
        }
        let half_rows = out_ty == OutType::F16;
        let rb_of = |r: u64| (r - 1) * s.sh + (s.kh - 1) * s.dh + 1;
        let taps_bytes = (s.kh * s.kw + 1) * BLOCK;
        let tile_bytes = |r: u64| {
            s.kw * rb_of(r) * up
                + taps_bytes
                + r * ap
                + if half_rows { r * op } else { 0 }
                + r * gather_row
        };
        // Rows per tile: as many as UB holds (double-buffered), no more than a block's share.
        let rows = s.n * s.m * s.ho;
        let cores = core.vector_blocks();
        let share = rows.div_ceil(cores).max(1);
        let limit = share.min(s.ho).min(MAX_REPEAT);
        let mut r = 0;
        for cand in 1..=limit {
            if 2 * tile_bytes(cand) <= core.ub_bytes {
                r = cand;
            }
        }
        if r == 0 {
            return Err(format!(
                "one output row of a depthwise Conv ({} columns, {}x{} kernel) does not fit \
                 the {}-byte unified buffer twice ({} bytes per row tile)",
                s.wo,
                s.kh,
                s.kw,
                core.ub_bytes,
                tile_bytes(1)
            ));
        }
        let rb = rb_of(r);
        let narrow = wd <= F32_REPEAT
            && ap / BLOCK <= MAX_REPEAT
            && op / (BLOCK / 2) <= MAX_REPEAT
            && s.sh * up / BLOCK <= MAX_REPEAT;
        let mut at = 0;
        let mut take = |bytes: u64| {
            let a = at;
            at += round_block(bytes);
            a
        };
        let mut band = [0; 2];
        let mut taps = [0; 2];
        let mut acc = [0; 2];
        let mut half = [0; 2];
        let mut gather = [0; 2];
        for p in 0..2 {
            band[p] = take(s.kw * rb * up);
            taps[p] = take(taps_bytes);
            acc[p] = take(r * ap);
            half[p] = take(if half_rows { r * op } else { 0 });
            gather[p] = take(r * gather_row);
        }
        debug_assert!(at <= core.ub_bytes);
        // Tiles read a full band from their first row; the pad kernel writes `pl` past a row.
        let xp_bytes = (s.n * s.c * hp + rb) * wp * 4 + s.pl * 4 + BLOCK;
        // The pad kernel's buffers must fit too.
        let pad_ub = 2 * round_block(s.w * in_ty.bytes())
            + 2 * round_block((s.w + s.pl + s.pr) * 4)
            + round_block((wp + s.pl) * 4);
        if pad_ub > core.ub_bytes {
            return Err(format!(
                "a padded input row of {} values does not fit the {}-byte unified buffer",
                wp, core.ub_bytes
            ));
        }
        Ok(Geometry {
            in_ty,
            out_ty,
            hp,
            wp,
            wd,
            up,
            ap,
            op,
            r,
            rb,
            period,
            gather_blk,
            phases,
            gather_row,
            narrow,
            xp_bytes,
            band,
            taps,
            acc,
            half,
            gather,
            dw_blocks: rows.min(cores),
        })
    }
}

/// Small helpers over an `Asm`.
struct W<'a> {
    a: &'a mut Asm,
}

impl W<'_> {
    fn set(&mut self, src: Pipe, dst: Pipe, id: u8) {
        self.a.set_flag(src, dst, id);
    }
    fn wait(&mut self, src: Pipe, dst: Pipe, id: u8) {
        self.a.wait_flag(src, dst, id);
    }
    fn movi(&mut self, dst: Reg, v: u64) {
        self.a.movi(dst, v as i64);
    }
    /// `dst = src + v` (`tmp` carries an offset too large for an immediate; it may be `dst`).
    fn addi(&mut self, dst: Reg, src: Reg, v: u64, tmp: Reg) {
        if let Ok(i) = i32::try_from(v) {
            self.a.addi(dst, src, i);
        } else {
            self.a.movi(tmp, v as i64);
            self.a.add(dst, src, tmp);
        }
    }
    /// `dst = src * v`.
    fn muli(&mut self, dst: Reg, src: Reg, v: u64, tmp: Reg) {
        if let Ok(i) = i32::try_from(v) {
            self.a.muli(dst, src, i);
        } else {
            self.a.movi(tmp, v as i64);
            self.a.mul(dst, src, tmp);
        }
    }
    /// `first` and `end` of this block's share of `total` items over `blocks` blocks (the
    /// first `total mod blocks` blocks take one more).
    fn block_share(&mut self, total: u64, blocks: u64, first: Reg, end: Reg, t: [Reg; 2]) {
        let (q, rem) = (total / blocks, total % blocks);
        let [bi, x] = t;
        self.a.sreg(bi, SReg::BlockIdx);
        self.muli(first, bi, q, x);
        self.movi(x, rem);
        self.a.minu(x, bi, x);
        self.a.add(first, first, x);
        self.addi(end, first, q, x);
        self.movi(x, rem);
        let no_extra = self.a.new_label("no_extra");
        let l = self.a.label(&no_extra);
        self.a.bgeu(bi, x, l);
        self.a.addi(end, end, 1);
        self.a.place(&no_extra);
    }
    /// The flags a double-buffered pipeline starts with: both input and output buffers free.
    fn start_free(&mut self) {
        for p in 0..2 {
            self.set(Pipe::V, Pipe::Mte2, ev::FREE[p]);
            self.set(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
        }
    }
    /// Consumes the flags the last tiles left set.
    fn end_free(&mut self) {
        for p in 0..2 {
            self.wait(Pipe::V, Pipe::Mte2, ev::FREE[p]);
            self.wait(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
        }
    }
}

/// Writes the pad kernel (`Xp` from `X`); returns its block count.
fn pad_kernel(a: &mut Asm, s: &ConvShape, g: &Geometry, core: &CoreSpec) -> u32 {
    let es = g.in_ty.bytes();
    let rows = s.n * s.c * g.hp;
    let blocks = rows.min(core.vector_blocks()).max(1);
    let in_pitch = round_block(s.w * es);
    let row_pitch = round_block((s.w + s.pl + s.pr) * 4);
    let zero_len = (g.wp + s.pl) * 4;
    let chunk = pad_chunk_rows(s, g, core);
    let inb = [0, chunk * in_pitch];
    let rowb = [
        2 * chunk * in_pitch,
        2 * chunk * in_pitch + chunk * row_pitch,
    ];
    let zero = 2 * chunk * (in_pitch + row_pitch);
    a.tiling("padded_h", g.hp as i64);
    a.tiling("padded_w", g.wp as i64);
    a.tiling("rows_per_chunk", chunk as i64);
    a.tiling("block_dim", blocks as i64);
    let args = a.reg();
    let x = a.reg();
    let xp = a.reg();
    let row = a.reg();
    let end = a.reg();
    let t = [a.reg(), a.reg(), a.reg(), a.reg()];
    let mut w = W { a };
    w.a.sreg(args, SReg::Args);
    w.a.ld(Space::Gm, SType::U64, x, args).off(pad_arg::X * 8);
    w.a.ld(Space::Gm, SType::U64, xp, args).off(pad_arg::XP * 8);
    w.a.comment("zero the row tails and the zero area (never written again)");
    w.a.mask_count(t[0], (2 * chunk * row_pitch + round_block(zero_len)) / 4);
    w.movi(t[1], rowb[0]);
    w.movi(t[2], 0);
    w.a.vdup(DType::F32, t[1], t[2]);
    w.start_free();
    w.block_share(rows, blocks, row, end, [t[0], t[1]]);
    if s.pl > 0 {
        // The left padding of the tensor's first row lies before any row's burst.
        let skip = w.a.new_label("not_first");
        let l = w.a.label(&skip);
        w.a.bne(row, t[2], l);
        w.set(Pipe::V, Pipe::Mte3, ev::ZEROED);
        w.wait(Pipe::V, Pipe::Mte3, ev::ZEROED);
        w.movi(t[0], zero);
        w.a.copy_ub_to_gm_pad(xp, t[0], 1, s.pl * 4);
        w.a.place(&skip);
    }
    let top = w.a.new_label("pad_row");
    let done = w.a.new_label("pad_done");
    w.a.place(&top);
    for p in 0..2 {
        let l = w.a.label(&done);
        w.a.bgeu(row, end, l);
        pad_rows(
            &mut w,
            s,
            g,
            p,
            [x, xp, row, end],
            t,
            (inb[p], rowb[p], zero),
            chunk,
        );
    }
    let l = w.a.label(&top);
    w.a.jmp(l);
    w.a.place(&done);
    w.end_free();
    blocks as u32
}

/// Data rows the pad kernel moves at once: a plane's rows in as few equal chunks as both
/// parities' buffers hold in UB (each DMA and flag hand-over waits out a GM latency, so a row
/// at a time leaves the pipes idle), at most 64 rows a chunk (their conversions are
/// unrolled); the plane's last chunk may be shorter.
fn pad_chunk_rows(s: &ConvShape, g: &Geometry, core: &CoreSpec) -> u64 {
    let in_pitch = round_block(s.w * g.in_ty.bytes());
    let row_pitch = round_block((s.w + s.pl + s.pr) * 4);
    let zero = round_block((g.wp + s.pl) * 4);
    let most = (1..=s.h.min(64))
        .rev()
        .find(|&r| 2 * r * (in_pitch + row_pitch) + zero <= core.ub_bytes)
        .unwrap_or(1);
    s.h.div_ceil(s.h.div_ceil(most))
}

/// Where a chunk of a plane's data rows may start (`y - pt` of its first row).
#[derive(Debug, Clone, Copy)]
enum ChunkStart {
    /// At this row or before.
    AtMost(u64),
    /// At this row only.
    At(u64),
}

/// The padded rows from `row` with buffers of parity `p`, advancing `row` past them: `chunk`
/// data rows of one plane where that many remain in the plane and the block, the plane's
/// shorter last chunk where it starts at `row`, else one row (a data row goes GM → UB → f32
/// row → `Xp` with the zeros after it; a pad row is written from the zero area).
#[allow(clippy::too_many_arguments)]
fn pad_rows(
    w: &mut W<'_>,
    s: &ConvShape,
    g: &Geometry,
    p: usize,
    [x, xp, row, end]: [Reg; 4],
    [t0, t1, t2, t3]: [Reg; 4],
    (inb, rowb, zero): (u64, u64, u64),
    chunk: u64,
) {
    let pad = w.a.new_label("pad_only");
    let single = w.a.new_label("one_row");
    let next = w.a.new_label("rows_done");
    // Plane and padded row: a data row when `y - pt < h` (unsigned).
    w.movi(t0, g.hp);
    w.a.divu(t1, row, t0);
    w.a.mul(t2, t1, t0);
    w.a.sub(t2, row, t2);
    w.a.addi(t2, t2, -(s.pt as i64));
    w.movi(t0, s.h);
    let l = w.a.label(&pad);
    w.a.bgeu(t2, t0, l);
    // A chunk when `y - pt + chunk <= h`; the plane's last `tail` rows when they start here
    // (`y - pt == h - tail`); either only where the block has them (`row + rows <= end`).
    let tail = s.h % chunk;
    let chunks = [
        (chunk, ChunkStart::AtMost(s.h - chunk)),
        (tail, ChunkStart::At(s.h - tail)),
    ];
    let mut single = Some(single);
    for (rows, start) in chunks.into_iter().filter(|(rows, _)| *rows > 1) {
        let skip = single.take().unwrap_or_else(|| w.a.new_label("one_row"));
        let l = w.a.label(&skip);
        match start {
            ChunkStart::AtMost(y) => {
                w.movi(t3, y + 1);
                w.a.bgeu(t2, t3, l);
            }
            ChunkStart::At(y) => {
                w.movi(t3, y);
                w.a.bne(t2, t3, l);
            }
        }
        w.addi(t3, row, rows - 1, t3);
        let l = w.a.label(&skip);
        w.a.bgeu(t3, end, l);
        pad_data_rows(
            w,
            s,
            g,
            p,
            [x, xp, row],
            [t0, t1, t2, t3],
            (inb, rowb),
            rows,
        );
        let l = w.a.label(&next);
        w.a.jmp(l);
        w.a.place(&skip);
    }
    if let Some(single) = single {
        w.a.place(&single);
    }
    pad_data_rows(w, s, g, p, [x, xp, row], [t0, t1, t2, t3], (inb, rowb), 1);
    let l = w.a.label(&next);
    w.a.jmp(l);

    w.a.place(&pad);
    // The same flag sequence with nothing to move but zeros (a whole row and the next row's
    // left padding).
    w.wait(Pipe::V, Pipe::Mte2, ev::FREE[p]);
    w.set(Pipe::Mte2, Pipe::V, ev::READY[p]);
    w.wait(Pipe::Mte2, Pipe::V, ev::READY[p]);
    w.wait(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
    w.set(Pipe::V, Pipe::Mte2, ev::FREE[p]);
    w.set(Pipe::V, Pipe::Mte3, ev::OUT_READY[p]);
    w.wait(Pipe::V, Pipe::Mte3, ev::OUT_READY[p]);
    w.muli(t1, row, g.wp * 4, t3);
    w.a.add(t1, t1, xp);
    w.movi(t0, zero);
    w.a.copy_ub_to_gm_pad(t1, t0, 1, (g.wp + s.pl) * 4);
    w.set(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
    w.a.addi(row, row, 1);
    w.a.place(&next);
}

/// `rows` data rows of one plane from `row` (`t1` = the plane, `t2` = the first one's row in
/// it, `t0` = H): in with one DMA (a plane's rows are contiguous in X), converted to f32 a
/// row at a time into UB rows whose tails stay zero, out with one DMA (and contiguous in Xp,
/// each burst padding its row's right and the next row's left); `row` moves past them.
#[allow(clippy::too_many_arguments)]
fn pad_data_rows(
    w: &mut W<'_>,
    s: &ConvShape,
    g: &Geometry,
    p: usize,
    [x, xp, row]: [Reg; 3],
    [t0, t1, t2, t3]: [Reg; 4],
    (inb, rowb): (u64, u64),
    rows: u64,
) {
    let es = g.in_ty.bytes();
    let in_pitch = round_block(s.w * es);
    let row_pitch = round_block((s.w + s.pl + s.pr) * 4);
    // Source: X + ((plane · H + y - pt) · W) · es.
    w.a.mul(t1, t1, t0);
    w.a.add(t1, t1, t2);
    w.muli(t1, t1, s.w * es, t3);
    w.a.add(t1, t1, x);
    w.wait(Pipe::V, Pipe::Mte2, ev::FREE[p]);
    w.movi(t0, inb);
    w.a.copy_gm_to_ub_pad(t0, t1, rows, s.w * es);
    w.set(Pipe::Mte2, Pipe::V, ev::READY[p]);
    w.wait(Pipe::Mte2, Pipe::V, ev::READY[p]);
    w.wait(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
    w.a.mask_count(t2, s.w);
    for k in 0..rows {
        w.movi(t0, rowb + k * row_pitch);
        w.movi(t1, inb + k * in_pitch);
        if g.in_ty == OutType::F16 {
            w.a.vconv(DType::F32, DType::F16, t0, t1);
        } else {
            w.a.vmov(DType::F32, t0, t1);
        }
    }
    w.set(Pipe::V, Pipe::Mte2, ev::FREE[p]);
    w.set(Pipe::V, Pipe::Mte3, ev::OUT_READY[p]);
    w.wait(Pipe::V, Pipe::Mte3, ev::OUT_READY[p]);
    // Destination: Xp + (row · Wp + pl) · 4; each burst's zero tail pads its row's right and
    // the next row's left.
    w.muli(t1, row, g.wp * 4, t3);
    w.a.add(t1, t1, xp);
    w.addi(t1, t1, s.pl * 4, t3);
    w.movi(t0, rowb);
    w.a.copy_ub_to_gm_pad(t1, t0, rows, (s.w + s.pl + s.pr) * 4);
    w.set(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
    w.a.addi(row, row, rows as i32);
}

/// Registers of the dw kernel.
struct DwRegs {
    xp: Reg,
    consts: Reg,
    out: Reg,
    bias: Reg,
    /// Current output row (`(n · M + m) · Ho + oh`) and the block's end.
    row: Reg,
    end: Reg,
    /// Rows of the current tile.
    rows: Reg,
    t: [Reg; 4],
}

/// Writes the dw kernel; returns its block count.
fn dw_kernel(a: &mut Asm, s: &ConvShape, g: &Geometry, runtime_bias: bool) -> u32 {
    let total = s.n * s.m * s.ho;
    let blocks = g.dw_blocks;
    a.tiling("rows_per_tile", g.r as i64);
    a.tiling("band_rows", g.rb as i64);
    a.tiling("dense_width", g.wd as i64);
    a.tiling("narrow", i64::from(g.narrow));
    a.tiling("gather_period", g.period as i64);
    a.tiling("block_dim", blocks as i64);
    let args = a.reg();
    let r = DwRegs {
        xp: a.reg(),
        consts: a.reg(),
        out: a.reg(),
        bias: a.reg(),
        row: a.reg(),
        end: a.reg(),
        rows: a.reg(),
        t: [a.reg(), a.reg(), a.reg(), a.reg()],
    };
    let mut w = W { a };
    w.a.sreg(args, SReg::Args);
    for (reg, i) in [
        (r.xp, dw_arg::XP),
        (r.consts, dw_arg::CONSTS),
        (r.out, dw_arg::OUT),
        (r.bias, dw_arg::BIAS),
    ] {
        w.a.ld(Space::Gm, SType::U64, reg, args).off(i * 8);
    }
    w.start_free();
    w.block_share(total, blocks, r.row, r.end, [r.t[0], r.t[1]]);
    let top = w.a.new_label("tile");
    let done = w.a.new_label("tiles_done");
    w.a.place(&top);
    for p in 0..2 {
        let l = w.a.label(&done);
        w.a.bgeu(r.row, r.end, l);
        dw_tile(&mut w, s, g, &r, p, runtime_bias);
        w.a.add(r.row, r.row, r.rows);
    }
    let l = w.a.label(&top);
    w.a.jmp(l);
    w.a.place(&done);
    w.end_free();
    blocks as u32
}

/// One tile of up to `R` output rows of one plane, buffers of parity `p`.
fn dw_tile(w: &mut W<'_>, s: &ConvShape, g: &Geometry, r: &DwRegs, p: usize, runtime_bias: bool) {
    let [t0, t1, t2, t3] = r.t;
    let taps = s.kh * s.kw;
    let mult = s.m / s.c;
    w.a.comment(format_args!("tile (buffers {p})"));
    // plane = row / Ho, oh0 = row mod Ho; rows = min(R, Ho - oh0, end - row).
    w.movi(t0, s.ho);
    w.a.divu(t1, r.row, t0);
    w.a.mul(t2, t1, t0);
    w.a.sub(t2, r.row, t2);
    w.a.sub(t3, t0, t2);
    w.movi(t0, g.r);
    w.a.minu(r.rows, t3, t0);
    w.a.sub(t3, r.end, r.row);
    w.a.minu(r.rows, r.rows, t3);
    // n = plane / M, m = plane mod M, input plane n · C + m / mult.
    w.movi(t0, s.m);
    w.a.divu(t3, t1, t0);
    w.a.mul(t0, t3, t0);
    w.a.sub(t1, t1, t0);
    w.muli(t3, t3, s.c, t0);
    if mult > 1 {
        w.movi(t0, mult);
        w.a.divu(t0, t1, t0);
        w.a.add(t3, t3, t0);
    } else {
        w.a.add(t3, t3, t1);
    }
    // Band source: Xp + ((in_plane · Hp + oh0 · sh) · Wp) · 4.
    w.muli(t3, t3, g.hp, t0);
    w.muli(t2, t2, s.sh, t0);
    w.a.add(t3, t3, t2);
    w.muli(t3, t3, g.wp * 4, t0);
    w.a.add(t3, t3, r.xp);
    w.wait(Pipe::V, Pipe::Mte2, ev::FREE[p]);
    for j in 0..s.kw {
        w.movi(t0, g.band[p] + j * g.rb * g.up);
        w.addi(t2, t3, j * s.dw * 4, t2);
        w.a.copy_gm_to_ub_pad(t0, t2, g.rb, g.wd * 4)
            .src_gap((g.wp - g.wd) * 4)
            .dst_gap(g.up - round_block(g.wd * 4));
    }
    // The channel's bias and tap blocks.
    w.muli(t2, t1, (taps + 1) * BLOCK, t0);
    w.a.add(t2, t2, r.consts);
    w.movi(t0, g.taps[p]);
    w.a.copy_gm_to_ub(t0, t2, 1, taps + 1);
    if runtime_bias {
        // Row m mod 16 of fractal m / 16: sixteen copies of the bias.
        w.a.shri(t2, t1, units::C0.trailing_zeros());
        w.a.muli(t2, t2, units::FRACTAL_BYTES_F32);
        w.a.andi(t3, t1, units::C0 - 1);
        w.a.muli(t3, t3, units::C0 * 4);
        w.a.add(t2, t2, t3);
        w.a.add(t2, t2, r.bias);
        w.a.copy_gm_to_ub(t0, t2, 1, 1);
    }
    w.set(Pipe::Mte2, Pipe::V, ev::READY[p]);

    w.wait(Pipe::Mte2, Pipe::V, ev::READY[p]);
    w.wait(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
    dw_compute(w, s, g, r, p);
    w.set(Pipe::V, Pipe::Mte2, ev::FREE[p]);
    w.set(Pipe::V, Pipe::Mte3, ev::OUT_READY[p]);

    w.wait(Pipe::V, Pipe::Mte3, ev::OUT_READY[p]);
    dw_write(w, s, g, r, p);
    w.set(Pipe::Mte3, Pipe::V, ev::OUT_FREE[p]);
}

/// V: the tile's rows (all `R`; rows past the tile's end compute values nobody writes).
fn dw_compute(w: &mut W<'_>, s: &ConvShape, g: &Geometry, r: &DwRegs, p: usize) {
    let [t0, t1, t2, t3] = r.t;
    let half = g.out_ty == OutType::F16;
    let bias_blk = g.taps[p];
    let tap_blk = |i: u64, j: u64| g.taps[p] + (1 + i * s.kw + j) * BLOCK;
    if g.narrow {
        // One instruction per tap covers every row: a repeat per row, the row's values masked.
        let lo = if g.wd >= 64 {
            u64::MAX
        } else {
            (1u64 << g.wd) - 1
        };
        w.movi(t0, 0);
        w.movi(t1, lo);
        w.a.set_mask(t0, t1);
        w.movi(t0, g.acc[p]);
        w.movi(t1, bias_blk);
        w.a.vmov(DType::F32, t0, t1)
            .repeat(g.r)
            .dst_rep(g.ap / BLOCK)
            .src_blk(0)
            .src_rep(0);
        for i in 0..s.kh {
            for j in 0..s.kw {
                w.movi(t1, g.band[p] + j * g.rb * g.up + i * s.dh * g.up);
                w.movi(t2, tap_blk(i, j));
                w.a.vmla(DType::F32, t0, t1, t2)
                    .repeat(g.r)
                    .dst_rep(g.ap / BLOCK)
                    .src0_rep(s.sh * g.up / BLOCK)
                    .src1_blk(0)
                    .src1_rep(0);
            }
        }
        if half {
            w.movi(t1, g.half[p]);
            // A conversion's blocks hold 8 values, so its f16 side strides in 16-byte units.
            w.a.vconv(DType::F16, DType::F32, t1, t0)
                .repeat(g.r)
                .dst_rep(g.op / (BLOCK / 2))
                .src_rep(g.ap / BLOCK);
        }
    } else {
        for row in 0..g.r {
            w.a.mask_count(t3, g.wd);
            w.movi(t0, g.acc[p] + row * g.ap);
            w.movi(t1, bias_blk);
            w.a.vmov(DType::F32, t0, t1).src_blk(0).src_rep(0);
            for i in 0..s.kh {
                for j in 0..s.kw {
                    let band_row = row * s.sh + i * s.dh;
                    w.movi(t1, g.band[p] + j * g.rb * g.up + band_row * g.up);
                    w.movi(t2, tap_blk(i, j));
                    w.a.vmla(DType::F32, t0, t1, t2).src1_blk(0).src1_rep(0);
                }
            }
            if half {
                w.movi(t1, g.half[p] + row * g.op);
                w.a.vconv(DType::F16, DType::F32, t1, t0);
            }
        }
    }
    if !g.phases.is_empty() {
        gather(w, g, r, p);
    }
}

/// V: the strided gather of every row: per residue class a `vbreduce` keeping one lane per
/// block, one result per block.
fn gather(w: &mut W<'_>, g: &Geometry, r: &DwRegs, p: usize) {
    let [t0, t1, t2, _] = r.t;
    let (ty, lanes, dense, pitch) = match g.out_ty {
        OutType::F16 => (DType::F16, 16, g.half[p], g.op),
        // (An i32 or bf16 output comes only from a product, never from a depthwise kernel.)
        OutType::F32 | OutType::I32 | OutType::Bf16 => (DType::F32, 8, g.acc[p], g.ap),
    };
    for ph in &g.phases {
        // Lane `lane` of each of the 8 blocks of a repeat.
        let (mut lo, mut hi) = (0u64, 0u64);
        for b in 0..8 {
            let bit = b * lanes + ph.lane;
            if bit < 64 {
                lo |= 1 << bit;
            } else {
                hi |= 1 << (bit - 64);
            }
        }
        w.movi(t0, hi);
        w.movi(t1, lo);
        w.a.set_mask(t0, t1);
        for row in 0..g.r {
            w.movi(t0, g.gather[p] + row * g.gather_row + ph.at);
            w.movi(t1, dense + row * pitch + ph.first_block * BLOCK);
            w.a.vbreduce(ReduceOp::Sum, ty, t0, t1)
                .repeat(ph.repeats)
                .src_blk(g.gather_blk)
                .src_rep(8 * g.gather_blk)
                .dst_rep(lanes);
        }
    }
    let _ = t2;
}

/// MTE3: the tile's rows (only as many as it has) to `Y`.
fn dw_write(w: &mut W<'_>, s: &ConvShape, g: &Geometry, r: &DwRegs, p: usize) {
    let [t0, t1, t2, t3] = r.t;
    let es = g.out_ty.bytes();
    let (dense, pitch) = match g.out_ty {
        OutType::F16 => (g.half[p], g.op),
        OutType::F32 | OutType::I32 | OutType::Bf16 => (g.acc[p], g.ap),
    };
    // Output row `row + k` starts at Y + (row + k) · Wo · es.
    w.muli(t1, r.row, s.wo * es, t3);
    w.a.add(t1, t1, r.out);
    let skip = w.a.new_label("rows_written");
    for k in 0..g.r {
        if k > 0 {
            w.movi(t2, k);
            let l = w.a.label(&skip);
            w.a.bgeu(t2, r.rows, l);
            w.addi(t1, t1, s.wo * es, t3);
        }
        if g.phases.is_empty() {
            w.movi(t0, dense + k * pitch);
            w.a.copy_ub_to_gm_pad(t1, t0, 1, s.wo * es);
        } else {
            for ph in &g.phases {
                w.movi(t0, g.gather[p] + k * g.gather_row + ph.at);
                w.addi(t2, t1, ph.u * es, t3);
                w.a.copy_ub_to_gm_pad(t2, t0, ph.count, es)
                    .src_gap(0)
                    .dst_gap((g.period - 1) * es);
            }
        }
    }
    w.a.place(&skip);
}
