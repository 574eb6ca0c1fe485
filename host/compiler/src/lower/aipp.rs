//! The AIPP kernel (`aipp::OP`): an 8-bit NHWC image in, the network's NCHW input out, on the
//! vector unit. A task is `R` output rows of one image: their crop spans come in with one
//! DMA (a burst per row, each padded to 32 bytes in UB), widen to f16 in one `vconv`, each
//! output channel's bytes are picked out of the interleaved pixels with one `vgather` (the
//! pattern, a constant per channel, selects that channel's byte of every cropped pixel, so the
//! rows come out packed, as NCHW stores them), and the arithmetic runs in f32 in the
//! hardware's order (colour-space conversion, then mean, min and the variance reciprocal)
//! before each channel's rows go out with one DMA.
//!
//! ```text
//!   GM u8 rows ─MTE2 (R bursts)─▶ UB [R × pitch] ─V vconv.f16.u8─▶ ─vgather per channel─▶
//!   [R × Wc] f16 ─vconv─▶ f32 ─CSC, (y − mean − min) · var─▶ f16 / f32 ─MTE3 per channel─▶ GM
//! ```

use gearsim_isa::{DType, Round, units};

use super::movement::kit::{self, Job, Split, round32};
use super::writer::{Asm, Reg};
use super::{LowerCtx, LowerError, Lowered};
use crate::aipp::Params;
use crate::ir::{DataType, shape_values};

/// The geometry of a task.
#[derive(Debug, Clone, Copy)]
struct Geo {
    /// Source rows and row bytes.
    hs: u64,
    ws: u64,
    /// Bytes per source pixel, channels out.
    pixel: u64,
    c: u64,
    /// Crop height and width.
    hc: u64,
    wc: u64,
    /// Bytes of a row's crop span and its UB pitch.
    span: u64,
    pitch: u64,
    /// Output element bytes.
    es: u64,
    /// Whether the colour-space conversion runs (three more f32 planes).
    csc: bool,
}

impl Geo {
    /// Repeats of the byte widening and the gather over `r` rows (128 elements each).
    fn wide_repeats(&self, r: u64) -> u64 {
        (r * self.pitch).div_ceil(128)
    }

    /// Repeats of the f32 work over `r` rows' outputs (64 elements each).
    fn f32_repeats(&self, r: u64) -> u64 {
        (r * self.wc).div_ceil(64)
    }

    /// Bytes of the f16 room of `r` rows (widened bytes, one gathered plane).
    fn wide_bytes(&self, r: u64) -> u64 {
        self.wide_repeats(r) * units::REPEAT_BYTES
    }

    /// Bytes of one f32 plane of `r` rows.
    fn plane_bytes(&self, r: u64) -> u64 {
        self.f32_repeats(r) * units::REPEAT_BYTES
    }

    /// Layout of one buffer: (in8, wide, gathered[c], f32[c], y[c] and tmp, out16[c], end).
    fn buffer_bytes(&self, r: u64) -> u64 {
        let in8 = round32(self.wide_repeats(r) * 128);
        let planes = self.c + if self.csc { self.c + 1 } else { 0 };
        in8 + (1 + self.c) * self.wide_bytes(r)
            + planes * self.plane_bytes(r)
            + self.c * self.plane_bytes(r) / 2
    }

    /// Bytes of one channel's pattern over `r` rows.
    fn pattern_bytes(&self, r: u64) -> u64 {
        round32((self.wide_repeats(r) * 128).div_ceil(8))
    }

    /// Rows per task: the most that fit, dividing the crop height.
    fn task_rows(&self, ub: u64, nbuf: u64) -> Option<u64> {
        let fits = |r: u64| {
            self.c * self.pattern_bytes(r) + nbuf * self.buffer_bytes(r) <= ub
                && self.wide_repeats(r) <= units::REPEAT_MAX
                && self.f32_repeats(r) <= units::REPEAT_MAX
                && r <= kit::MAX_BURSTS
                && r * self.wc * self.es <= kit::MAX_PAD_LEN
        };
        (1..=self.hc)
            .rev()
            .find(|r| self.hc.is_multiple_of(*r) && fits(*r))
    }

    /// The pattern picking source byte `byte` of every cropped pixel of `r` rows.
    fn pattern(&self, r: u64, byte: u64) -> Vec<u8> {
        let mut bits = vec![0u8; self.pattern_bytes(r) as usize];
        for i in 0..r {
            for w in 0..self.wc {
                let b = (i * self.pitch + w * self.pixel + byte) as usize;
                bits[b / 8] |= 1 << (b % 8);
            }
        }
        bits
    }
}

/// Lowers an `Aipp` node (input 0 the image, output 0 the NCHW tensor).
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let p = Params::of(ctx.node).map_err(|e| ctx.error(format!("expected {e}")))?;
    let x = ctx.input(0)?;
    let out = ctx.outputs.first().ok_or_else(|| ctx.error("no output"))?;
    let xs = shape_values(&x.shape)
        .filter(|s| s.len() == 4)
        .ok_or_else(|| ctx.error("a static NHWC image"))?;
    let ys = shape_values(&out.shape)
        .filter(|s| s.len() == 4)
        .ok_or_else(|| ctx.error("a static NCHW output"))?;
    let es = match out.dtype {
        DataType::F16 => 2,
        DataType::F32 => 4,
        other => return Err(ctx.error(format!("an f16 or f32 output, got {}", other.name()))),
    };
    let [h0, w0, hc, wc] = p.crop;
    let g = Geo {
        hs: xs[1] as u64,
        ws: xs[2] as u64,
        pixel: p.format.pixel_bytes(),
        c: p.format.channels(),
        hc,
        wc,
        span: wc * p.format.pixel_bytes(),
        pitch: round32(wc * p.format.pixel_bytes()),
        es,
        csc: p.csc.is_some(),
    };
    let n = ys[0] as u64;
    let core = &ctx.target.core;
    let nbuf = kit::buffers(core);
    let gap = (g.ws * g.pixel)
        .checked_sub(g.span)
        .ok_or_else(|| ctx.error("a crop wider than the image"))?;
    if gap > units::PAD_GAP_MAX || g.span > kit::MAX_PAD_LEN {
        return Err(ctx.error(format!(
            "a source row of {} bytes is longer than a DMA burst or gap allows",
            g.ws * g.pixel
        )));
    }
    let r = g.task_rows(core.ub_bytes, nbuf as u64).ok_or_else(|| {
        ctx.error(format!(
            "no number of rows dividing the crop height {hc} fits the unified buffer"
        ))
    })?;
    // Output channel c reads source channel c, or 2 - c with the R/B swap.
    let src_channel = |c: u64| if p.swap && g.c == 3 { 2 - c } else { c };
    let mut patterns = Vec::new();
    for c in 0..g.c {
        patterns.extend(g.pattern(r, p.format.first_byte() + src_channel(c)));
    }
    let pat_bytes = g.pattern_bytes(r);
    let per_image = hc / r;
    let split = Split::new(n * per_image, core);
    let (mut a, f, chain) = kit::row_kernel(ctx, split, nbuf, r, g.pitch);
    let [xr, yr, src, dst, ub, t0, t1, t2] = a.regs();
    // UB: the patterns, then the buffers.
    let patterns_at = 0u64;
    let base = |k: usize| g.c * pat_bytes + k as u64 * g.buffer_bytes(r);
    let in8 = |k: usize| base(k);
    let wide = |k: usize| in8(k) + round32(g.wide_repeats(r) * 128);
    let gathered = |k: usize, c: u64| wide(k) + (1 + c) * g.wide_bytes(r);
    let plane = |k: usize, i: u64| gathered(k, g.c) + i * g.plane_bytes(r);
    let out16 = |k: usize, c: u64| {
        let planes = g.c + if g.csc { g.c + 1 } else { 0 };
        plane(k, planes) + c * g.plane_bytes(r) / 2
    };
    kit::gather_prologue(
        &mut a,
        &f,
        &chain,
        ub,
        t0,
        patterns_at,
        patterns.len() as u64,
    );
    let wr = g.wide_repeats(r);
    let fr = g.f32_repeats(r);
    let f32_bits = |v: f32| i64::from(v.to_bits());
    let job = Job {
        tasks: split.total,
        setup: Box::new(|a: &mut Asm| {
            f.arg(a, xr, 0);
            f.arg(a, yr, 1);
        }),
        load: Box::new(|a: &mut Asm, k: usize, t| {
            // Image t / per_image, row block t % per_image (its first row r0 = block · R).
            task_rows(a, t, per_image, t1, src, t0);
            // src = x + ((img · Hs + h0 + r0) · Ws + w0) · pixel
            a.movi(t0, (g.hs * g.ws * g.pixel) as i64);
            a.mul(t1, t1, t0);
            a.movi(t0, (r * g.ws * g.pixel) as i64);
            a.mul(src, src, t0);
            a.add(src, src, t1);
            a.add(src, src, xr);
            kit::add_imm(a, src, ((h0 * g.ws + w0) * g.pixel) as i64, t0);
            kit::load_padded_rows(a, &chain, k, ub, in8(k), src, r, (g.span, gap));
        }),
        rest: Box::new(|a: &mut Asm, k: usize, t| {
            chain.begin(a, 1, k);
            // Bytes to f16 (exact), then each channel's bytes packed.
            a.movi(t0, wide(k) as i64);
            a.movi(t1, in8(k) as i64);
            a.vconv(DType::F16, DType::U8, t0, t1).repeat(wr);
            for c in 0..g.c {
                a.movi(ub, gathered(k, c) as i64);
                a.movi(t1, (patterns_at + c * pat_bytes) as i64);
                a.vgather(DType::I16, ub, t0, t1).repeat(wr).pat_rep(1);
            }
            // To f32: plane c holds channel c.
            for c in 0..g.c {
                a.movi(t0, plane(k, c) as i64);
                a.movi(t1, gathered(k, c) as i64);
                a.vconv(DType::F32, DType::F16, t0, t1).repeat(fr);
            }
            // The colour-space conversion into planes c + C (plane 2C is scratch).
            let result = |c: u64| if g.csc { g.c + c } else { c };
            if let Some(m) = &p.csc {
                for kk in 0..3u64 {
                    if m.input_bias[kk as usize] != 0 {
                        a.movi(t0, plane(k, kk) as i64);
                        a.movi(t2, f32_bits(-(m.input_bias[kk as usize] as f32)));
                        a.vadds(DType::F32, t0, t0, t2).repeat(fr);
                    }
                }
                let tmp = plane(k, 2 * g.c);
                for c in 0..3u64 {
                    let y = plane(k, g.c + c);
                    let row = m.matrix[c as usize];
                    a.movi(t0, y as i64);
                    a.movi(t1, plane(k, 0) as i64);
                    a.movi(t2, f32_bits(row[0] as f32));
                    a.vmuls(DType::F32, t0, t1, t2).repeat(fr);
                    for kk in 1..3u64 {
                        a.movi(ub, tmp as i64);
                        a.movi(t1, plane(k, kk) as i64);
                        a.movi(t2, f32_bits(row[kk as usize] as f32));
                        a.vmuls(DType::F32, ub, t1, t2).repeat(fr);
                        a.vadd(DType::F32, t0, t0, ub).repeat(fr);
                    }
                    // >> 8: a division by 256 (exact) rounded down.
                    a.movi(t2, f32_bits(1.0 / 256.0));
                    a.vmuls(DType::F32, t0, t0, t2).repeat(fr);
                    a.movi(ub, tmp as i64);
                    a.vconv(DType::I32, DType::F32, ub, t0)
                        .repeat(fr)
                        .round(Round::Floor);
                    a.vconv(DType::F32, DType::I32, t0, ub).repeat(fr);
                    if m.output_bias[c as usize] != 0 {
                        a.movi(t2, f32_bits(m.output_bias[c as usize] as f32));
                        a.vadds(DType::F32, t0, t0, t2).repeat(fr);
                    }
                    a.movi(t2, f32_bits(0.0));
                    a.vmaxs(DType::F32, t0, t0, t2).repeat(fr);
                    a.movi(t2, f32_bits(255.0));
                    a.vmins(DType::F32, t0, t0, t2).repeat(fr);
                }
            }
            // Normalisation, then the output type.
            for c in 0..g.c {
                let v = plane(k, result(c));
                a.movi(t0, v as i64);
                let ci = c as usize;
                if p.mean[ci] != 0.0 {
                    a.movi(t2, f32_bits(-p.mean[ci]));
                    a.vadds(DType::F32, t0, t0, t2).repeat(fr);
                }
                if p.min[ci] != 0.0 {
                    a.movi(t2, f32_bits(-p.min[ci]));
                    a.vadds(DType::F32, t0, t0, t2).repeat(fr);
                }
                if p.var_reci[ci] != 1.0 {
                    a.movi(t2, f32_bits(p.var_reci[ci]));
                    a.vmuls(DType::F32, t0, t0, t2).repeat(fr);
                }
                if es == 2 {
                    a.movi(t1, out16(k, c) as i64);
                    a.vconv(DType::F16, DType::F32, t1, t0).repeat(fr);
                }
            }
            chain.end(a, 1, k);
            chain.begin(a, 2, k);
            // dst = y + ((img · C + c) · Hc + r0) · Wc · es, for c = 0 first.
            task_rows(a, t, per_image, t1, dst, t0);
            a.movi(t0, (g.c * hc * wc * es) as i64);
            a.mul(t1, t1, t0);
            a.movi(t0, (r * wc * es) as i64);
            a.mul(dst, dst, t0);
            a.add(dst, dst, t1);
            a.add(dst, dst, yr);
            for c in 0..g.c {
                let from = if es == 2 {
                    out16(k, c)
                } else {
                    plane(k, result(c))
                };
                a.movi(ub, from as i64);
                a.copy_ub_to_gm_pad(dst, ub, 1, r * wc * es);
                if c + 1 < g.c {
                    kit::add_imm(a, dst, (hc * wc * es) as i64, t0);
                }
            }
            chain.end(a, 2, k);
        }),
    };
    kit::gather_kernel(ctx, a, &f, &chain, job, split.blocks, patterns)
}

/// Task `t`'s image (`t / per_image`) into `img` and its row block (`t % per_image`) into
/// `block` (`tmp` clobbered).
fn task_rows(a: &mut Asm, t: Reg, per_image: u64, img: Reg, block: Reg, tmp: Reg) {
    a.movi(tmp, per_image as i64);
    a.divu(img, t, tmp);
    a.remu(block, t, tmp);
}
