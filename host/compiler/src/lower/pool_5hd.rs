//! MaxPool over the fractal feature-map format NC1HWC0 (`[N][C/16][H][W][16]`), the format
//! the layout pass keeps between convolutions. A pixel's 16 channels are one 32-byte block, so
//! a window is a max over whole blocks: no lane ever moves, and each pass is a `vmax` over a
//! row of blocks with a block stride (the W stride) instead of `pool.rs`'s lane gathers.
//!
//! ```text
//!   X band (5HD rows) ─MTE2─▶ UB X[b] ─V H pass: T[r] = max over kh of X[r·sh + i·dh]─▶
//!   T (rows padded left and right with -inf blocks, filled once) ─V W pass: O[r][ow] =
//!   max over kw of T[r][ow·sw + j·dw] (src block stride sw)─▶ UB O[b] ─MTE3─▶ Y band (5HD)
//! ```
//!
//! A tile is a band of `R` output rows of one plane (`n`, channel block); the H pass skips the
//! taps above and below the input (max over fewer rows is max over -inf padding), the W pass
//! reads the -inf blocks of T's padding. X and O are double-buffered so a band loads while the
//! one before is pooled and the one before that is stored. Blocks take contiguous runs of
//! tiles; a run's whole planes are one hardware loop over the plane's band code (the planes
//! only differ by their GM bases), so the kernel stays small at any batch. An NCHW output (where
//! a fractal region ends at the pool) is converted from the workspace by a TransData, which
//! moves a quarter of what converting the input would for the usual 3×3 stride-2 pool.

use gearsim_isa::{DType, Pipe, SReg, SType, Space, units};

use super::cube::{Build, conv5hd};
use super::window::{Axis, F16_NEG_INF, axes, dims};
use super::writer::{Asm, Reg};
use super::{LowerCtx, LowerError, Lowered, Operand, kernel_name};
use crate::CoreSpec;
use crate::ir::{DataType, Format};

/// Bytes of one pixel unit (16 f16 channels).
const UNIT: u64 = units::BLOCK_BYTES;
/// f16 elements of one unit.
const LANES: u64 = 16;

/// Event ids (each set and waited in strict alternation).
mod ev {
    /// MTE2 → V: band buffer `b` holds its rows; V → MTE2: it is free again.
    pub const X: [u8; 2] = [0, 1];
    /// V → MTE3: output buffer `b` holds its rows; MTE3 → V: it was written out.
    pub const O: [u8; 2] = [0, 1];
}

/// The static tiling.
#[derive(Debug, Clone)]
struct Plan {
    h: Axis,
    w: Axis,
    /// Planes (`N · C1`) and output rows per tile.
    planes: u64,
    rows: u64,
    /// Input rows a tile reads at most, T's row pitch in blocks (padding included).
    rows_in: u64,
    pitch: u64,
    /// UB addresses.
    x: [u64; 2],
    t: u64,
    o: [u64; 2],
    /// Each block's run of tiles (tile `i` is band `i % bands` of plane `i / bands`).
    runs: Vec<(u64, u64)>,
}

impl Plan {
    fn new(xd: &[u64], h: Axis, w: Axis, core: &CoreSpec) -> Result<Plan, String> {
        if xd.len() != 4 || !xd[1].is_multiple_of(LANES) {
            return Err(format!(
                "a 4-D input whose channels are a multiple of 16; got {xd:?}"
            ));
        }
        if w.s * 8 > 255 || h.out == 0 || w.out == 0 {
            return Err(format!(
                "a W stride of at most 31 and a non-empty output (stride {})",
                w.s
            ));
        }
        // T's columns: the left padding, the row, and whatever the last window reads past it.
        let reach = (w.out - 1) * w.s + (w.k - 1) * w.d + 1;
        let pitch = (w.pb + w.size).max(reach);
        let planes = xd[0] * (xd[1] / LANES);
        let rows_in = |r: u64| ((r - 1) * h.s + (h.k - 1) * h.d + 1).min(h.size);
        let bytes = |r: u64| (2 * rows_in(r) * w.size + r * pitch + 2 * r * w.out) * UNIT;
        let mut rows = (1..=h.out)
            .rev()
            .find(|r| bytes(*r) <= core.ub_bytes)
            .ok_or_else(|| {
                format!(
                    "a band of one output row needs {} bytes of unified buffer; it has {}",
                    bytes(1),
                    core.ub_bytes
                )
            })?;
        // Enough tiles for every core.
        let cores = core.vector_blocks();
        if planes * h.out.div_ceil(rows) < cores {
            let bands = cores.div_ceil(planes).min(h.out);
            rows = rows.min(h.out.div_ceil(bands));
        }
        let bands = h.out.div_ceil(rows);
        let tiles = planes * bands;
        let blocks = cores.min(tiles);
        let runs = (0..blocks)
            .map(|b| (b * tiles / blocks, (b + 1) * tiles / blocks))
            .collect();
        let xb = rows_in(rows) * w.size * UNIT;
        let t = 2 * xb;
        let o0 = t + rows * pitch * UNIT;
        let ob = rows * w.out * UNIT;
        Ok(Plan {
            h,
            w,
            planes,
            rows,
            rows_in: rows_in(rows),
            pitch,
            x: [0, xb],
            t,
            o: [o0, o0 + ob],
            runs,
        })
    }

    fn bands(&self) -> u64 {
        self.h.out.div_ceil(self.rows)
    }

    /// Output rows of band `k`.
    fn out_rows(&self, k: u64) -> (u64, u64) {
        (k * self.rows, ((k + 1) * self.rows).min(self.h.out))
    }

    /// Input rows band `k` reads (clipped to the input).
    fn in_rows(&self, k: u64) -> (u64, u64) {
        let (o0, o1) = self.out_rows(k);
        let first = (o0 * self.h.s) as i64 - self.h.pb as i64;
        let last = ((o1 - 1) * self.h.s + (self.h.k - 1) * self.h.d) as i64 - self.h.pb as i64;
        (
            first.max(0) as u64,
            ((last + 1).max(0) as u64).min(self.h.size),
        )
    }

    fn plane_in_bytes(&self) -> u64 {
        self.h.size * self.w.size * UNIT
    }

    fn plane_out_bytes(&self) -> u64 {
        self.h.out * self.w.out * UNIT
    }
}

fn plan_of(ctx: &LowerCtx<'_>) -> Result<Plan, LowerError> {
    let x = ctx.input(0)?;
    let y = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    if x.dtype != DataType::F16 || y.dtype != DataType::F16 || ctx.outputs.len() != 1 {
        return Err(ctx.error(format!(
            "the 5HD MaxPool runs f16 without Indices; got {} in, {} out, {} output(s)",
            x.dtype.name(),
            y.dtype.name(),
            ctx.outputs.len()
        )));
    }
    let (xd, yd) = (dims(ctx, x)?, dims(ctx, y)?);
    if xd.len() != 4 || yd.len() != 4 {
        return Err(ctx.error("the 5HD MaxPool is 2-D (rank 4)"));
    }
    let ax = axes(ctx, &xd, &yd)?;
    if ax.iter().any(|a| a.k == 0 || a.s == 0 || a.d == 0) {
        return Err(ctx.error("kernel, strides and dilations must be at least 1"));
    }
    Plan::new(&xd, ax[0], ax[1], &ctx.target.core).map_err(|e| ctx.error(e))
}

/// Whether the 5HD kernel runs this MaxPool.
pub(crate) fn supported(ctx: &LowerCtx<'_>) -> bool {
    plan_of(ctx).is_ok()
}

/// MaxPool reading NC1HWC0; an NCHW output (a region's end) is pooled into the workspace and
/// converted by a TransData of the (smaller) output.
pub(crate) fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let plan = plan_of(ctx)?;
    let y = &ctx.outputs[0];
    let mut a = Asm::new(&kernel_name(ctx, "5hd"));
    for (name, v) in [
        ("planes", plan.planes),
        ("rows_per_tile", plan.rows),
        ("input_rows_per_tile", plan.rows_in),
        ("tiles_per_plane", plan.bands()),
        ("block_dim", plan.runs.len() as u64),
    ] {
        a.tiling(name, v as i64);
    }
    Gen::new(&mut a, &plan).emit();
    let mut b = Build::default();
    let native = y.format == Format::Nc1hwc0;
    let yd = dims(ctx, y)?;
    let out = if native {
        Operand::Output(0)
    } else {
        b.scratch(yd.iter().product::<u64>() * 2)
    };
    b.kernels
        .push(ctx.kernel(a, plan.runs.len() as u32, vec![Operand::Input(0), out])?);
    if !native {
        conv5hd::transdata(
            ctx,
            &mut b,
            [yd[0], yd[1] / LANES, yd[2] * yd[3], LANES],
            out,
            Operand::Output(0),
        )?;
    }
    Ok(b.finish())
}

struct Gen<'a> {
    a: &'a mut Asm,
    p: &'a Plan,
    /// The input and output bases, the current plane's, temporaries.
    x: Reg,
    y: Reg,
    px: Reg,
    py: Reg,
    /// The whole-plane loop's counter.
    counter: Reg,
    t: [Reg; 4],
}

impl<'a> Gen<'a> {
    fn new(a: &'a mut Asm, p: &'a Plan) -> Gen<'a> {
        let [x, y, px, py, counter] = a.regs();
        let t = a.regs();
        Gen {
            a,
            p,
            x,
            y,
            px,
            py,
            counter,
            t,
        }
    }

    fn emit(mut self) {
        let p = self.p;
        let [t0, t1, _, _] = self.t;
        let args = t0;
        self.a.sreg(args, SReg::Args);
        for (i, reg) in [self.x, self.y].into_iter().enumerate() {
            self.a
                .ld(Space::Gm, SType::U64, reg, args)
                .off(8 * i as i32);
        }
        self.a
            .comment("T's padding blocks hold -inf for the whole kernel");
        self.a.mask_count(t1, p.rows * p.pitch * LANES);
        self.a.movi(t0, F16_NEG_INF);
        self.a.movi(t1, p.t as i64);
        self.a.vdup(DType::F16, t1, t0);
        for b in 0..2 {
            self.a.set_flag(Pipe::V, Pipe::Mte2, ev::X[b]);
            self.a.set_flag(Pipe::Mte3, Pipe::V, ev::O[b]);
        }
        let blocks = p.runs.len();
        let labels: Vec<String> = (0..blocks).map(|_| self.a.new_label("block")).collect();
        let done = self.a.new_label("blocks_done");
        let bi = self.t[3];
        self.a.sreg(bi, SReg::BlockIdx);
        for (b, label) in labels.iter().enumerate() {
            self.a.movi(t0, b as i64);
            let l = self.a.label(label);
            self.a.beq(bi, t0, l);
        }
        let end = self.a.label(&done);
        self.a.jmp(end);
        for (b, label) in labels.iter().enumerate() {
            self.a.place(label);
            self.a
                .comment(format_args!("block {b}: tiles {:?}", p.runs[b]));
            self.run(p.runs[b]);
            let end = self.a.label(&done);
            self.a.jmp(end);
        }
        self.a.place(&done);
        for b in 0..2 {
            self.a.wait_flag(Pipe::V, Pipe::Mte2, ev::X[b]);
            self.a.wait_flag(Pipe::Mte3, Pipe::V, ev::O[b]);
        }
        self.a.end();
    }

    /// Tiles `a..b`: a leading part of a plane, whole planes in one loop, a trailing part.
    fn run(&mut self, (a, b): (u64, u64)) {
        let bands = self.p.bands();
        let mut at = a;
        // A part of a plane before the first whole one.
        if at % bands != 0 {
            let end = b.min((at / bands + 1) * bands);
            self.plane_at(at / bands);
            self.bands(at % bands, (end - 1) % bands + 1);
            at = end;
        }
        let whole = (b - at) / bands;
        if whole > 0 {
            let [t0, _, _, _] = self.t;
            self.plane_at(at / bands);
            let counter = self.counter;
            self.a.movi(counter, whole as i64);
            let top = self.a.new_label("plane");
            self.a.place(&top);
            self.bands(0, bands);
            self.a.movi(t0, self.p.plane_in_bytes() as i64);
            self.a.add(self.px, self.px, t0);
            self.a.movi(t0, self.p.plane_out_bytes() as i64);
            self.a.add(self.py, self.py, t0);
            let l = self.a.label(&top);
            self.a.r#loop(counter, l);
            at += whole * bands;
        }
        if at < b {
            self.plane_at(at / bands);
            self.bands(0, b - at);
        }
    }

    /// Points the plane registers at plane `plane`.
    fn plane_at(&mut self, plane: u64) {
        let t0 = self.t[0];
        self.a.movi(t0, (plane * self.p.plane_in_bytes()) as i64);
        self.a.add(self.px, self.x, t0);
        self.a.movi(t0, (plane * self.p.plane_out_bytes()) as i64);
        self.a.add(self.py, self.y, t0);
    }

    /// MTE2: band `k` of the current plane into X[`b`].
    fn load(&mut self, k: u64, b: usize) {
        let p = self.p;
        let [t0, t1, _, _] = self.t;
        let (i0, i1) = p.in_rows(k);
        self.a.wait_flag(Pipe::V, Pipe::Mte2, ev::X[b]);
        if i1 > i0 {
            self.a.movi(t0, p.x[b] as i64);
            self.a.movi(t1, (i0 * p.w.size * UNIT) as i64);
            self.a.add(t1, self.px, t1);
            self.a.copy_gm_to_ub(t0, t1, i1 - i0, p.w.size);
        }
        self.a.set_flag(Pipe::Mte2, Pipe::V, ev::X[b]);
    }

    /// Bands `k0..k1` of the current plane (buffers by band parity from `k0`).
    fn bands(&mut self, k0: u64, k1: u64) {
        if k1 <= k0 {
            return;
        }
        self.load(k0, 0);
        for k in k0..k1 {
            let b = ((k - k0) % 2) as usize;
            if k + 1 < k1 {
                self.load(k + 1, 1 - b);
            }
            self.pool(k, b);
        }
    }

    /// V pools band `k` from X[`b`] into O[`b`]; MTE3 writes it.
    fn pool(&mut self, k: u64, b: usize) {
        let p = self.p;
        let (h, w) = (p.h, p.w);
        let [t0, t1, t2, _] = self.t;
        let (o0, o1) = p.out_rows(k);
        let (i0, _) = p.in_rows(k);
        self.a.wait_flag(Pipe::Mte2, Pipe::V, ev::X[b]);
        self.a
            .comment(format_args!("band {k}: output rows {o0}..{o1}"));
        // H pass: each output row's valid input rows into T's row (past its left padding).
        self.a.mask_count(t2, w.size * LANES);
        for oh in o0..o1 {
            let taps: Vec<u64> = (0..h.k)
                .filter_map(|i| {
                    let ih = (oh * h.s + i * h.d) as i64 - h.pb as i64;
                    (ih >= 0 && (ih as u64) < h.size).then_some(ih as u64)
                })
                .collect();
            let dst = p.t + ((oh - o0) * p.pitch + w.pb) * UNIT;
            let row = |ih: u64| (p.x[b] + (ih - i0) * w.size * UNIT) as i64;
            self.a.movi(t0, dst as i64);
            match taps.as_slice() {
                [] => {}
                [only] => {
                    self.a.movi(t1, row(*only));
                    self.a.vmax(DType::F16, t0, t1, t1);
                }
                [first, second, rest @ ..] => {
                    self.a.movi(t1, row(*first));
                    self.a.movi(t2, row(*second));
                    self.a.vmax(DType::F16, t0, t1, t2);
                    for ih in rest {
                        self.a.movi(t1, row(*ih));
                        self.a.vmax(DType::F16, t0, t0, t1);
                    }
                }
            }
        }
        self.a.set_flag(Pipe::V, Pipe::Mte2, ev::X[b]);
        // W pass: each output row from T's row, the window's taps a block stride `sw` apart.
        self.a.wait_flag(Pipe::Mte3, Pipe::V, ev::O[b]);
        self.a.mask_count(t2, w.out * LANES);
        let (blk, rep) = (w.s as u8, (8 * w.s) as u8);
        for oh in o0..o1 {
            let dst = p.o[b] + (oh - o0) * w.out * UNIT;
            let tap = |j: u64| (p.t + ((oh - o0) * p.pitch + j * w.d) * UNIT) as i64;
            self.a.movi(t0, dst as i64);
            self.a.movi(t1, tap(0));
            if w.k == 1 {
                self.a
                    .vmax(DType::F16, t0, t1, t1)
                    .src0_blk(blk)
                    .src1_blk(blk)
                    .src0_rep(rep)
                    .src1_rep(rep);
                continue;
            }
            self.a.movi(t2, tap(1));
            self.a
                .vmax(DType::F16, t0, t1, t2)
                .src0_blk(blk)
                .src1_blk(blk)
                .src0_rep(rep)
                .src1_rep(rep);
            for j in 2..w.k {
                self.a.movi(t1, tap(j));
                self.a
                    .vmax(DType::F16, t0, t0, t1)
                    .src1_blk(blk)
                    .src1_rep(rep);
            }
        }
        self.a.set_flag(Pipe::V, Pipe::Mte3, ev::O[b]);
        self.a.wait_flag(Pipe::V, Pipe::Mte3, ev::O[b]);
        self.a.movi(t0, p.o[b] as i64);
        self.a.movi(t1, (o0 * w.out * UNIT) as i64);
        self.a.add(t1, self.py, t1);
        self.a.copy_ub_to_gm(t1, t0, o1 - o0, w.out);
        self.a.set_flag(Pipe::Mte3, Pipe::V, ev::O[b]);
    }
}
