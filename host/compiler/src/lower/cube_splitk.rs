//! Split-K: a product whose `M × N` tiles leave cube cores idle runs as `parts` partial
//! products over slices of K and a reduction, as Ascend's split-K matmul kernels do (catlass's
//! multi-core split-K examples: the partial sums go to a workspace, a vector pass adds them).
//!
//! ```text
//!   A[:, s·kc..], B[s·kc.., :] ─GEMM, batched over s─▶ workspace [parts][M][N] f32 (i8: i32)
//!   workspace ─V: Σ over s, i32 → f32, × factor, × alpha, + addend, → f16, ReLU─▶ C
//! ```
//!
//! The partial product is the GEMM engine's own batched product: slice `s` of K is a batch item
//! whose operands start `s · kc` further along K (a byte stride per operand, whatever its
//! layout) and whose result is an f32 — for an i8 product an exact i32 — `M × N` block, so
//! every tiling the engine has serves it, the blocks spreading over slices as over tiles. The
//! reduction is a streaming kernel (`stream.rs`) whose tiles start on rows, so a per-column
//! factor or bias is one more tile-long operand loaded once per block. The epilogue keeps the
//! whole product's order (factor, alpha, addend, conversion, ReLU); an i8 product's sum is
//! exact, an f16 product's adds its `parts` f32 partial sums in another order than one
//! accumulator would.
//!
//! [`choose`] splits only where the engine's own estimate of the busiest block (or the time the
//! chip's memory takes to move the operands, when that is longer) and its blocks' dispatch,
//! plus the reduction's, its dispatch's and its launch's cycles, beats the whole product's by a tenth: on a chip whose DDR a few cores
//! saturate (the 310P), only products of one or two tiles gain.

use gearsim_isa::DType;
use gearsim_isa::units::FRACTAL_BYTES_F32;

use super::super::stream::{Io, Resident, Stream, Tile};
use super::super::writer::{Asm, Reg};
use super::gemm::{
    self, Addend, BatchDim, Gemm, InType, OutType, PLAN_BYTES_PER_CYCLE, PLAN_FLAG_LATENCY,
    PLAN_SETUP, PLAN_WRITE_BYTES_PER_CYCLE, PLAN_WRITE_LATENCY, Plan, Src,
};
use crate::CoreSpec;

/// A split runs when its estimate is at most this share of the whole product's.
const GAIN: (u64, u64) = (9, 10);
/// K fractals (of 16 units) each slice has at least.
const MIN_SLICE_FRACTALS: u64 = 1;
/// Most slices: the reduction streams each slice's partial sums as a tensor of its own, with
/// a pointer and a buffer register each.
const MAX_PARTS: u64 = 8;

/// How a product runs.
#[derive(Debug, Clone)]
pub enum Choice {
    /// One GEMM kernel under this plan.
    Whole(Plan),
    /// Partial products and a reduction.
    Split(Split),
}

/// A product split over K.
#[derive(Debug, Clone)]
pub struct Split {
    /// Slices of K.
    pub parts: u64,
    /// The partial products: a batch of `parts` over K slices of `k / parts`, writing
    /// `[parts][M][N]` f32 (i32 for an i8 product) to argument 2, no epilogue.
    pub partial: Gemm,
    /// Its tiling.
    pub plan: Plan,
}

impl Split {
    /// Bytes of one slice's partial sums (`M × N` f32 or i32).
    pub fn slice_bytes(&self) -> u64 {
        self.partial.m * self.partial.n * 4
    }
}

/// Whether the reduction can finish `g`'s epilogue: one product (no batch), no residual, an
/// addend that is a scalar or one value per column, an f16 or i8 product to f16 or f32, a
/// dense result of rows of whole fractal columns (a tile then starts on a row at a 32-byte
/// boundary), and K of at least two fractals.
fn splittable(g: &Gemm) -> bool {
    g.batch.is_empty()
        && g.residual.is_none()
        && matches!(
            g.addend,
            None | Some(Addend::Scalar { .. } | Addend::Cols { .. })
        )
        && matches!(g.in_type, InType::F16 | InType::I8)
        && matches!(g.out_type, OutType::F16 | OutType::F32)
        && g.n.is_multiple_of(16)
        && g.ldc == g.n
        && g.k.is_multiple_of(16)
        && g.k >= 32 * MIN_SLICE_FRACTALS
}

/// The whole product's plan, or a split when one is estimated faster (see the module doc).
pub fn choose(g: &Gemm, core: &CoreSpec) -> Result<Choice, String> {
    let (whole, whole_cost) = g.plan_costed(core)?;
    if !splittable(g) || u64::from(whole.block_dim) >= core.cube_blocks() {
        return Ok(Choice::Whole(whole));
    }
    // Neither runs faster than the chip's memory moves A, B and the result (the partial sums
    // too, counted as if they left the L2): a product the cores already stream at the
    // memory's rate gains nothing from more of them.
    let memory = |bytes: u64| bytes / core.memory_bytes_per_cycle.max(1);
    let operands = (g.m * g.k + g.k * g.n) * 2 + g.m * g.n * g.out_type.bytes();
    // Blocks are dispatched one after the other.
    let dispatch = |blocks: u32| u64::from(blocks) * core.block_dispatch_cycles;
    let whole_cost = whole_cost.max(memory(operands)) + dispatch(whole.block_dim);
    let fractals = g.k / 16;
    let mut best: Option<(u64, Split)> = None;
    for parts in 2..=MAX_PARTS.min(fractals / MIN_SLICE_FRACTALS) {
        if !fractals.is_multiple_of(parts) || reduction(g, parts, |s| s.plan(core)).is_none() {
            continue;
        }
        let partial = partial_of(g, parts);
        let Ok((plan, cost)) = partial.plan_costed(core) else {
            continue;
        };
        let partials = parts * g.m * g.n * 4;
        let total = cost.max(memory(operands + partials))
            + dispatch(plan.block_dim)
            + reduce_cycles(g, parts, core);
        if best.as_ref().is_none_or(|(c, _)| total < *c) {
            best = Some((
                total,
                Split {
                    parts,
                    partial,
                    plan,
                },
            ));
        }
    }
    Ok(match best {
        Some((cost, split)) if cost * GAIN.1 <= whole_cost * GAIN.0 => Choice::Split(split),
        _ => Choice::Whole(whole),
    })
}

/// `g` split in `parts` slices of K whatever the estimates say (`parts` must divide K's
/// fractals and the reduction must fit; see [`choose`] for when a split pays).
pub fn split_in(g: &Gemm, parts: u64, core: &CoreSpec) -> Result<Split, String> {
    if !splittable(g) || parts < 2 || !(g.k / 16).is_multiple_of(parts) {
        return Err(format!(
            "a {}x{}x{} product does not split in {parts} slices of K",
            g.m, g.n, g.k
        ));
    }
    let partial = partial_of(g, parts);
    let plan = partial.plan(core)?;
    Ok(Split {
        parts,
        partial,
        plan,
    })
}

/// `g`'s partial products over `parts` slices of K.
fn partial_of(g: &Gemm, parts: u64) -> Gemm {
    let kc = g.k / parts;
    // Bytes from one K slice of an operand to the next; `rows` is M for A, N for B.
    let stride = |src: Src, rows: u64, a_side: bool| match src {
        Src::Rows { trans, ld, .. } => {
            // A is M × K (K × M transposed), B is K × N (N × K transposed): a slice moves along
            // the rows when K is the row index, along a row when it is the column.
            if trans == a_side { kc * ld * 2 } else { kc * 2 }
        }
        Src::Packed { .. } => gemm::packed_bytes(rows, kc),
    };
    Gemm {
        name: format!("{}_splitk{parts}", g.name),
        batch: vec![BatchDim {
            size: parts,
            a: stride(g.a, g.m, true),
            b: stride(g.b, g.n, false),
            c: g.m * g.n * 4,
        }],
        k: kc,
        out: 2,
        out_type: if g.in_type == InType::I8 {
            OutType::I32
        } else {
            OutType::F32
        },
        ldc: g.n,
        alpha: 1.0,
        factor: None,
        addend: None,
        residual: None,
        relu: false,
        ..g.clone()
    }
}

/// Estimated cycles of the reduction's busiest block, its blocks' dispatch and its launch
/// (ranks a split against the whole product; the GEMM engine's planning rates).
fn reduce_cycles(g: &Gemm, parts: u64, core: &CoreSpec) -> u64 {
    let elems = g.m * g.n;
    let plan = reduction(g, parts, |s| s.plan(core));
    let blocks = plan.map_or(1, |p| u64::from(p.block_dim));
    let per_block = elems.div_ceil(blocks.max(1));
    // The per-column vectors, loaded once per tile row before the first tile.
    let vectors =
        u64::from(g.factor.is_some()) + u64::from(matches!(g.addend, Some(Addend::Cols { .. })));
    let resident = vectors * plan.map_or(0, |p| p.tile) * 4;
    blocks * core.block_dispatch_cycles
        + PLAN_SETUP
        + resident / PLAN_BYTES_PER_CYCLE
        + per_block * parts * 4 / PLAN_BYTES_PER_CYCLE
        + PLAN_FLAG_LATENCY
        + per_block * g.out_type.bytes() / PLAN_WRITE_BYTES_PER_CYCLE
        + PLAN_WRITE_LATENCY
        + core.launch_cycles
}

/// The reduction of `g` split in `parts` as a [`Stream`] handed to `f`. Its arguments: the
/// partial sums (`parts` slices of `M × N`, one after the other), the output, then the
/// per-column factor and the per-column addend where `g` has them (each as the engine's
/// column fractals, whose first rows are the vector).
fn reduction<R>(g: &Gemm, parts: u64, f: impl FnOnce(&Stream<'_>) -> R) -> R {
    let acc = if g.in_type == InType::I8 {
        DType::I32
    } else {
        DType::F32
    };
    let columns = |arg| Resident {
        arg,
        bursts: g.n / 16,
        burst_bytes: 16 * 4,
        gap_bytes: FRACTAL_BYTES_F32 - 16 * 4,
        elem: 4,
    };
    let mut resident = Vec::new();
    if g.factor.is_some() {
        resident.push(columns(2 + resident.len()));
    }
    let bias = matches!(g.addend, Some(Addend::Cols { .. }));
    if bias {
        resident.push(columns(2 + resident.len()));
    }
    let scalar = match g.addend {
        Some(Addend::Scalar { value }) => Some(value),
        _ => None,
    };
    let setup = |a: &mut Asm, _: Reg| {
        let mut consts = Vec::new();
        for v in [Some(g.alpha).filter(|x| *x != 1.0), scalar]
            .into_iter()
            .flatten()
        {
            let r = a.reg();
            a.movi(r, i64::from(v.to_bits()));
            consts.push(r);
        }
        consts
    };
    let body = |a: &mut Asm, t: &Tile| {
        let x = t.ins[0];
        for s in &t.ins[1..] {
            a.vadd(acc, x, x, *s);
        }
        if acc == DType::I32 {
            a.vconv(DType::F32, DType::I32, x, x);
        }
        let (mut res, mut consts) = (t.resident.iter(), t.consts.iter());
        if g.factor.is_some()
            && let Some(f) = res.next()
        {
            a.vmul(DType::F32, x, x, *f);
        }
        if g.alpha != 1.0
            && let Some(c) = consts.next()
        {
            a.vmuls(DType::F32, x, x, *c);
        }
        if scalar.is_some()
            && let Some(c) = consts.next()
        {
            a.vadds(DType::F32, x, x, *c);
        }
        if bias && let Some(b) = res.next() {
            a.vadd(DType::F32, x, x, *b);
        }
        let out = t.outs[0];
        match (g.out_type, g.relu) {
            (OutType::F16, relu) => {
                a.vconv(DType::F16, DType::F32, out, x);
                if relu {
                    a.vrelu(DType::F16, out, out);
                }
            }
            (_, true) => {
                a.vrelu(DType::F32, out, x);
            }
            (_, false) => {
                a.vmov(DType::F32, out, x);
            }
        }
    };
    let s = Stream {
        n: g.m * g.n,
        inputs: (0..parts)
            .map(|s| Io {
                offset: s * g.m * g.n * 4,
                ..Io::new(0, 4)
            })
            .collect(),
        outputs: vec![Io::new(1, g.out_type.bytes())],
        scratch: Vec::new(),
        row: g.n,
        resident,
        setup: &setup,
        body: &body,
    };
    f(&s)
}

/// The reduction kernel of `split` (see [`reduction`] for its arguments), with its blocks.
pub fn reduce_kernel(g: &Gemm, split: &Split, core: &CoreSpec) -> Result<(Asm, u32), String> {
    reduction(g, split.parts, |s| {
        let plan = s.plan(core).ok_or_else(|| {
            format!(
                "a row of the {}-way split-K reduction does not fit in the {}-byte unified buffer",
                split.parts, core.ub_bytes
            )
        })?;
        let mut a = Asm::new(&format!("{}_reduce{}", g.name, split.parts));
        a.tiling("parts", split.parts as i64);
        s.emit(&mut a, plan);
        Ok((a, plan.block_dim))
    })
}

/// A constant i8 `B` (`[K][N]` values, row-major; `k` counts values) packed for `plan` as
/// `parts` slices of K, one after the other (`parts` = 1: [`gemm::pack_b_i8`] of the whole).
pub fn pack_b_i8_slices(values: &[i8], k: u64, n: u64, parts: u64, plan: &Plan) -> Vec<u8> {
    let kc = k / parts;
    values
        .chunks((kc * n) as usize)
        .flat_map(|slice| gemm::pack_b_i8(slice, kc, n, plan))
        .collect()
}

/// A row-major `[M][K]` matrix as `parts` row-major `[M][K / parts]` slices of K, one after
/// the other (a constant A packed per slice).
pub fn slices_of_a(values: &[f32], m: u64, k: u64, parts: u64) -> Vec<f32> {
    let kc = (k / parts) as usize;
    let (m, k) = (m as usize, k as usize);
    let mut out = Vec::with_capacity(m * k);
    for s in 0..parts as usize {
        for r in 0..m {
            out.extend_from_slice(&values[r * k + s * kc..r * k + (s + 1) * kc]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_of_a_cut_every_row_at_the_same_columns() {
        // 2 × 4, two slices: [[0 1] [4 5]] then [[2 3] [6 7]].
        let v: Vec<f32> = (0..8).map(|x| x as f32).collect();
        assert_eq!(
            slices_of_a(&v, 2, 4, 2),
            [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
        );
    }
}
