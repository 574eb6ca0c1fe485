//! Slices that step through the innermost axis, `X[..., h0::sh, w0::sw]` with `sw > 1` (the
//! subsampling in front of a strided 1×1 convolution). A DMA cannot skip single elements, so
//! the element-wise copy would move one element per burst; instead each task loads whole
//! rows of the span it reads (rows `sh` apart, one DMA, each row padded to a 32-byte pitch in
//! UB), packs the selected elements with one `vgather` (Ascend's GatherMask) whose bit pattern
//! picks every `sw`-th element of each row, and writes the packed rows, which are the output's
//! rows in order, with one DMA.
//!
//! ```text
//!   GM rows h0, h0+sh, ... ─MTE2 (R bursts of the span)─▶ UB [R × pitch]
//!     ─V vgather (pattern: R × pitch bits, a constant loaded once)─▶ UB [R × Wo] ─MTE3─▶ GM
//! ```
//!
//! Tasks are `R` output rows; every task has the same shape (R divides the row count), so the
//! pattern and every immediate are static. Rows of consecutive planes are `sh` input rows
//! apart too when `H = sh · Ho`, so a task may cross planes; otherwise R divides `Ho`.

use gearsim_isa::{DType, units};

use super::super::writer::Asm;
use super::super::{LowerCtx, LowerError, Lowered};
use super::kit::{self, Job, Split, round32};

/// The slice, per axis: input dims, start, step and output length.
pub struct Strided<'a> {
    /// Input dims.
    pub dims: &'a [u64],
    /// First index per axis.
    pub start: &'a [i64],
    /// Step per axis.
    pub step: &'a [i64],
    /// Output length per axis.
    pub len: &'a [u64],
    /// Element bytes.
    pub elem: u64,
}

/// The geometry of the row view `[outer, H, W]`.
#[derive(Debug, Clone, Copy)]
struct Rows {
    /// Input rows per plane, row length (elements).
    h: u64,
    w: u64,
    /// Output rows per plane, row length.
    ho: u64,
    wo: u64,
    /// First row and column, steps.
    h0: u64,
    w0: u64,
    sh: u64,
    sw: u64,
    /// Output rows in all.
    rows: u64,
    /// Elements a row's span covers, and its UB pitch (elements).
    span: u64,
    pitch: u64,
    /// Whether row `q` of the output is input row `q · sh + h0` across planes.
    uniform: bool,
    e: u64,
}

impl Rows {
    /// The row view, when the slice steps through the last axis and only the last two axes
    /// are sliced.
    fn of(s: &Strided<'_>) -> Option<Rows> {
        let rank = s.dims.len();
        let e = s.elem;
        if rank == 0 || !matches!(e, 2 | 4) || s.step.iter().any(|st| *st <= 0) {
            return None;
        }
        let (sw, w0) = (s.step[rank - 1] as u64, s.start[rank - 1] as u64);
        if sw < 2 {
            return None;
        }
        let outer_full = (0..rank.saturating_sub(2))
            .all(|a| s.start[a] == 0 && s.step[a] == 1 && s.len[a] == s.dims[a]);
        if !outer_full {
            return None;
        }
        let (h, ho, h0, sh) = if rank >= 2 {
            (
                s.dims[rank - 2],
                s.len[rank - 2],
                s.start[rank - 2] as u64,
                s.step[rank - 2] as u64,
            )
        } else {
            (1, 1, 0, 1)
        };
        let (w, wo) = (s.dims[rank - 1], s.len[rank - 1]);
        let outer: u64 = s.dims[..rank.saturating_sub(2)].iter().product();
        let span = (wo - 1) * sw + 1;
        Some(Rows {
            h,
            w,
            ho,
            wo,
            h0,
            w0,
            sh,
            sw,
            rows: outer * ho,
            span,
            pitch: round32(span * e) / e,
            uniform: outer == 1 || h == sh * ho,
            e,
        })
    }

    /// UB bytes of one buffer for `r` rows: the loaded rows, then room for the packed ones
    /// (as much as the gather's repeats could select: the simulator, like the hardware's
    /// bounds, cannot know the pattern before it runs).
    fn buffer_bytes(&self, r: u64) -> u64 {
        r * self.pitch * self.e + (r * self.pitch).div_ceil(self.per_repeat()) * units::REPEAT_BYTES
    }

    /// Bytes of the pattern for `r` rows (a whole number of blocks).
    fn pattern_bytes(&self, r: u64) -> u64 {
        round32((r * self.pitch).div_ceil(8))
    }

    /// Elements per gather repeat.
    fn per_repeat(&self) -> u64 {
        units::REPEAT_BYTES / self.e
    }

    /// The rows per task: the most that fit UB (both buffers and the pattern), one gather and
    /// one load, among those that split the rows evenly.
    fn task_rows(&self, ub_bytes: u64, nbuf: u64) -> Option<u64> {
        let fits = |r: u64| {
            self.pattern_bytes(r) + nbuf * self.buffer_bytes(r) <= ub_bytes
                && (r * self.pitch).div_ceil(self.per_repeat()) <= units::REPEAT_MAX
                && r <= kit::MAX_BURSTS
                && r * self.wo * self.e <= kit::MAX_PAD_LEN
        };
        let whole = if self.uniform { self.rows } else { self.ho };
        (1..=whole).rev().find(|r| whole % r == 0 && fits(*r))
    }

    /// The pattern of `r` rows: bit `i · pitch + j · sw` for every row `i` and output column `j`.
    fn pattern(&self, r: u64) -> Vec<u8> {
        let mut bits = vec![0u8; self.pattern_bytes(r) as usize];
        for i in 0..r {
            for j in 0..self.wo {
                let b = (i * self.pitch + j * self.sw) as usize;
                bits[b / 8] |= 1 << (b % 8);
            }
        }
        bits
    }
}

/// The kernel of a Slice that steps through its last axis (input argument 0, output 1), or
/// `None` when the slice is not of that kind (the copy engine takes it).
pub fn lower(ctx: &LowerCtx<'_>, s: &Strided<'_>) -> Result<Option<Lowered>, LowerError> {
    let Some(g) = Rows::of(s) else {
        return Ok(None);
    };
    let core = &ctx.target.core;
    let nbuf = kit::buffers(core);
    let gap = (g.sh * g.w - g.span) * g.e;
    let Some(r) = g.task_rows(core.ub_bytes, nbuf as u64) else {
        return Ok(None);
    };
    if gap > units::PAD_GAP_MAX {
        return Ok(None);
    }
    let pattern = g.pattern(r);
    let split = Split::new(g.rows / r, core);
    let (mut a, f, chain) = kit::row_kernel(ctx, split, nbuf, r, g.pitch);
    let [x, y, src, dst, ub, t0, t1] = a.regs();
    let pattern_ub = 0u64;
    let pattern_len = pattern.len() as u64;
    let buf = |k: usize| pattern_len + k as u64 * g.buffer_bytes(r);
    let packed = |k: usize| buf(k) + r * g.pitch * g.e;
    kit::gather_prologue(&mut a, &f, &chain, ub, t0, pattern_ub, pattern.len() as u64);
    let first = (g.h0 * g.w + g.w0) * g.e;
    let job = Job {
        tasks: split.total,
        setup: Box::new(|a: &mut Asm| {
            f.arg(a, x, 0);
            f.arg(a, y, 1);
        }),
        load: Box::new(|a: &mut Asm, k: usize, t| {
            // The task's first input row.
            if g.uniform {
                a.movi(t0, (r * g.sh * g.w * g.e) as i64);
                a.mul(src, t, t0);
            } else {
                // Tasks stay in one plane: plane t / (Ho / R), first row (t % (Ho / R)) · R.
                a.movi(t0, (g.ho / r) as i64);
                a.divu(t1, t, t0);
                a.remu(src, t, t0);
                a.movi(t0, (g.h * g.w * g.e) as i64);
                a.mul(t1, t1, t0);
                a.movi(t0, (r * g.sh * g.w * g.e) as i64);
                a.mul(src, src, t0);
                a.add(src, src, t1);
            }
            a.add(src, src, x);
            kit::add_imm(a, src, first as i64, t0);
            kit::load_padded_rows(a, &chain, k, ub, buf(k), src, r, (g.span * g.e, gap));
        }),
        rest: Box::new(|a: &mut Asm, k: usize, t| {
            chain.begin(a, 1, k);
            a.movi(ub, packed(k) as i64);
            a.movi(t0, buf(k) as i64);
            a.movi(t1, pattern_ub as i64);
            let repeat = (r * g.pitch).div_ceil(g.per_repeat());
            let ty = if g.e == 2 { DType::I16 } else { DType::I32 };
            a.vgather(ty, ub, t0, t1).repeat(repeat).pat_rep(1);
            chain.end(a, 1, k);
            chain.begin(a, 2, k);
            a.movi(t0, (r * g.wo * g.e) as i64);
            a.mul(dst, t, t0);
            a.add(dst, dst, y);
            a.copy_ub_to_gm_pad(dst, ub, 1, r * g.wo * g.e);
            chain.end(a, 2, k);
        }),
    };
    kit::gather_kernel(ctx, a, &f, &chain, job, split.blocks, pattern).map(Some)
}
