//! Data movement as DMA kernels: Transpose, Concat, Slice, Gather, Expand. They move bytes, so
//! every element type works and results are bit-exact.
//!
//! ```text
//!   Transpose ─ collapse axes that stay adjacent; none left to move ─▶ alias of the input
//!             ├ innermost axis kept, runs ≥ 16 B ─▶ copy.rs   (strided bursts both sides)
//!             └ innermost axis moves ────────────▶ shuffle.rs (tiles through UB, vector
//!                                                   lane gathers; runs ≤ 8 B count as elements)
//!   Concat, Slice, Expand ─▶ copy.rs (one box per input / the sliced box / broadcast box)
//!   Gather ────────────────▶ gather.rs (indices read on the device, one DMA per row)
//! ```
//!
//! Shapes are static: every kernel is specialised for its shapes, spreads tiles over the
//! cores and rotates buffers so loads, vector work and stores overlap.

mod copy;
mod gather;
pub(super) mod kit;
mod shuffle;
mod stride;

use super::{LowerCtx, LowerError, LowerFn, Lowered, Operand, kernel_name};
use crate::ir::TensorDesc;
use copy::{Dim, Spec, Unit};

/// The lowering of an op type of this module.
pub fn lowering(op: &str) -> Option<LowerFn> {
    let f: LowerFn = match op {
        "Transpose" => transpose,
        "Concat" => concat,
        "Slice" => slice,
        "Split" => split,
        "Gather" => gather::lower,
        "Expand" => expand,
        _ => return None,
    };
    Some(f)
}

/// The sizes of a static shape.
fn dims_of(ctx: &LowerCtx<'_>, d: &TensorDesc) -> Result<Vec<u64>, LowerError> {
    d.shape
        .iter()
        .map(|x| x.fixed().and_then(|v| u64::try_from(v).ok()))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| ctx.error(format!("shape {d} is not static")))
}

/// Row-major strides in elements.
fn strides(dims: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

fn output<'a>(ctx: &'a LowerCtx<'_>) -> Result<&'a TensorDesc, LowerError> {
    ctx.outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))
}

fn no_kernels() -> Lowered {
    Lowered::Kernels {
        kernels: Vec::new(),
        derived: Vec::new(),
        workspace_bytes: 0,
    }
}

/// One copy kernel over `specs` (empty when they copy nothing).
fn copy_kernels(
    ctx: &LowerCtx<'_>,
    suffix: &str,
    specs: &[Spec],
    args: Vec<Operand>,
) -> Result<Lowered, LowerError> {
    let kernels = copy::kernel(ctx, &kernel_name(ctx, suffix), specs, args)?
        .into_iter()
        .collect();
    Ok(Lowered::Kernels {
        kernels,
        derived: Vec::new(),
        workspace_bytes: 0,
    })
}

/// Transpose's permutation (reversed axes by default), checked.
fn perm_of(ctx: &LowerCtx<'_>, rank: usize) -> Result<Vec<usize>, LowerError> {
    let perm: Vec<usize> = match ctx.node.ints("perm") {
        None => (0..rank).rev().collect(),
        Some(p) => p
            .iter()
            .map(|v| usize::try_from(*v).ok().filter(|k| *k < rank))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| ctx.error(format!("perm {p:?} is not a permutation of 0..{rank}")))?,
    };
    let mut seen = vec![false; rank];
    for &p in &perm {
        if seen[p] {
            return Err(ctx.error(format!("perm {perm:?} repeats axis {p}")));
        }
        seen[p] = true;
    }
    if perm.len() != rank {
        return Err(ctx.error(format!(
            "perm {perm:?} does not list the {rank} axes of the input"
        )));
    }
    Ok(perm)
}

/// Drops unit axes and merges input axes that stay adjacent and in order in the output.
/// Returns the collapsed input dims and the permutation over them.
fn collapse(dims: &[u64], perm: &[usize]) -> (Vec<u64>, Vec<usize>) {
    // Output-order runs of consecutive input axes (unit axes dropped).
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &p in perm {
        if dims[p] == 1 {
            continue;
        }
        match runs.last_mut() {
            Some(r) if next_kept(dims, r.1) == Some(p) => r.1 = p,
            _ => runs.push((p, p)),
        }
    }
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| runs[i].0);
    let mut rank_of = vec![0usize; runs.len()];
    for (rank, &i) in order.iter().enumerate() {
        rank_of[i] = rank;
    }
    let cdims = order
        .iter()
        .map(|&i| (runs[i].0..=runs[i].1).map(|a| dims[a]).product())
        .collect();
    (cdims, rank_of)
}

/// The next input axis after `a` that is not a unit axis.
fn next_kept(dims: &[u64], a: usize) -> Option<usize> {
    (a + 1..dims.len()).find(|&b| dims[b] != 1)
}

fn transpose(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let dims = dims_of(ctx, x)?;
    let perm = perm_of(ctx, dims.len())?;
    let e = x.dtype.size() as u64;
    if dims.contains(&0) {
        return Ok(no_kernels());
    }
    let (d, p) = collapse(&dims, &perm);
    let k = d.len();
    if p.iter().enumerate().all(|(i, v)| i == *v) {
        // Only unit axes move: the bytes are already in output order.
        return Ok(Lowered::Alias { input: 0 });
    }
    let args = vec![Operand::Input(0), Operand::Output(0)];
    let sin = strides(&d);
    let out_dims: Vec<u64> = p.iter().map(|&a| d[a]).collect();
    let sout = strides(&out_dims);
    if p[k - 1] == k - 1 {
        // The innermost axis stays: runs of d[k-1] elements move whole.
        let run = d[k - 1] * e;
        if run <= 8 && run.is_power_of_two() {
            // Short runs transpose as elements of `run` bytes.
            if let Some(l) = shuffle::lower(ctx, run, &d[..k - 1], &p[..k - 1], &args)? {
                return Ok(l);
            }
        }
        let dims = (0..k - 1)
            .map(|j| Dim {
                n: out_dims[j],
                si: (sin[p[j]] * e) as i64,
                so: (sout[j] * e) as i64,
            })
            .collect();
        let spec = Spec {
            src: 0,
            dst: 1,
            src_off: 0,
            dst_off: 0,
            dims,
            unit: run,
            kind: Unit::Dma,
        };
        return copy_kernels(ctx, "runs", &[spec], args);
    }
    if let Some(l) = shuffle::lower(ctx, e, &d, &p, &args)? {
        return Ok(l);
    }
    // Element by element: one burst per element on each side.
    let dims = (0..k)
        .map(|j| Dim {
            n: out_dims[j],
            si: (sin[p[j]] * e) as i64,
            so: (sout[j] * e) as i64,
        })
        .collect();
    let spec = Spec {
        src: 0,
        dst: 1,
        src_off: 0,
        dst_off: 0,
        dims,
        unit: e,
        kind: Unit::Dma,
    };
    copy_kernels(ctx, "elements", &[spec], args)
}

/// The transpose of f16 `[N][C][HW]` into `[N][HW][pad]`, each output row's `C` elements
/// padded with zeros to `pad` (GE's TransData into NC1HWC0 when `C` < 16); `None` when the
/// shuffle kernel's tiles cannot express it.
pub(crate) fn transpose_padded(
    ctx: &LowerCtx<'_>,
    [n, c, hw]: [u64; 3],
    pad: u64,
    args: &[Operand],
) -> Result<Option<Lowered>, LowerError> {
    let (d, p): (Vec<u64>, Vec<usize>) = if n == 1 {
        (vec![c, hw], vec![1, 0])
    } else {
        (vec![n, c, hw], vec![0, 2, 1])
    };
    shuffle::lower_padded(ctx, 2, &d, &p, pad, args)
}

fn concat(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let out = output(ctx)?;
    let odims = dims_of(ctx, out)?;
    let rank = odims.len();
    let axis = ctx.node.int("axis").unwrap_or(0);
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    let axis = usize::try_from(axis)
        .ok()
        .filter(|a| *a < rank)
        .ok_or_else(|| ctx.error(format!("axis {axis} is outside the rank {rank}")))?;
    let n = ctx.inputs.len();
    if n == 1 {
        return Ok(Lowered::Alias { input: 0 });
    }
    let e = out.dtype.size() as u64;
    let outer: u64 = odims[..axis].iter().product();
    let out_run: u64 = odims[axis..].iter().product::<u64>() * e;
    let mut specs = Vec::new();
    let mut offset = 0u64;
    for i in 0..n {
        let d = dims_of(ctx, ctx.input(i)?)?;
        if d.len() != rank {
            return Err(ctx.error(format!("input {i} has rank {}, not {rank}", d.len())));
        }
        let run = d[axis..].iter().product::<u64>() * e;
        specs.push(Spec {
            src: i,
            dst: n,
            src_off: 0,
            dst_off: offset as i64,
            dims: vec![Dim {
                n: outer,
                si: run as i64,
                so: out_run as i64,
            }],
            unit: run,
            kind: Unit::Dma,
        });
        offset += run;
    }
    if offset != out_run {
        return Err(ctx.error(format!(
            "the inputs' runs along axis {axis} sum to {offset} bytes, the output's is {out_run}"
        )));
    }
    let mut args: Vec<Operand> = (0..n).map(Operand::Input).collect();
    args.push(Operand::Output(0));
    copy_kernels(ctx, "", &specs, args)
}

/// Split: one strided copy per output, the inverse of Concat.
fn split(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let dims = dims_of(ctx, x)?;
    let rank = dims.len();
    let axis = ctx.node.int("axis").unwrap_or(0);
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    let axis = usize::try_from(axis)
        .ok()
        .filter(|a| *a < rank)
        .ok_or_else(|| ctx.error(format!("axis {axis} is outside the rank {rank}")))?;
    let n = ctx.outputs.len();
    let e = x.dtype.size() as u64;
    let outer: u64 = dims[..axis].iter().product();
    let in_run: u64 = dims[axis..].iter().product::<u64>() * e;
    let mut specs = Vec::new();
    let mut offset = 0u64;
    for k in 0..n {
        let d = dims_of(ctx, &ctx.outputs[k])?;
        if d.len() != rank {
            return Err(ctx.error(format!("output {k} has rank {}, not {rank}", d.len())));
        }
        let run = d[axis..].iter().product::<u64>() * e;
        if run > 0 && outer > 0 {
            specs.push(Spec {
                src: 0,
                dst: k + 1,
                src_off: offset as i64,
                dst_off: 0,
                dims: vec![Dim {
                    n: outer,
                    si: in_run as i64,
                    so: run as i64,
                }],
                unit: run,
                kind: Unit::Dma,
            });
        }
        offset += run;
    }
    if offset != in_run {
        return Err(ctx.error(format!(
            "the outputs' runs along axis {axis} sum to {offset} bytes, the input's is {in_run}"
        )));
    }
    if specs.is_empty() {
        return Ok(no_kernels());
    }
    let mut args = vec![Operand::Input(0)];
    args.extend((0..n).map(Operand::Output));
    copy_kernels(ctx, "", &specs, args)
}

/// A constant integer input, if present.
fn const_ints(ctx: &LowerCtx<'_>, i: usize, what: &str) -> Result<Option<Vec<i64>>, LowerError> {
    if ctx.inputs.get(i).copied().flatten().is_none() {
        return Ok(None);
    }
    match ctx.values.get(i).copied().flatten() {
        Some(t) => Ok(Some(t.to_i64s())),
        None => Err(ctx.error(format!(
            "{what} (input {i}) must be a constant: the kernel is specialised for its values"
        ))),
    }
}

/// ONNX's clamping of a slice bound `v` (negative counts from the end) into `[lo, d + hi]`.
fn clamp_bound(v: i64, d: i64, lo: i64, hi: i64) -> i64 {
    let raw = if v < 0 { v.saturating_add(d) } else { v };
    raw.max(lo).min(d + hi)
}

fn slice(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let dims = dims_of(ctx, x)?;
    let out = output(ctx)?;
    let odims = dims_of(ctx, out)?;
    let rank = dims.len();
    let e = x.dtype.size() as u64;
    let starts = const_ints(ctx, 1, "starts")?.unwrap_or_default();
    let ends = const_ints(ctx, 2, "ends")?.unwrap_or_default();
    let axes = const_ints(ctx, 3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = const_ints(ctx, 4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(ctx.error("starts, ends, axes and steps differ in length"));
    }
    let mut start = vec![0i64; rank];
    let mut step = vec![1i64; rank];
    let mut len: Vec<u64> = dims.clone();
    for k in 0..starts.len() {
        let a = if axes[k] < 0 {
            axes[k] + rank as i64
        } else {
            axes[k]
        };
        let a = usize::try_from(a)
            .ok()
            .filter(|a| *a < rank)
            .ok_or_else(|| ctx.error(format!("axis {} is outside the rank {rank}", axes[k])))?;
        let (d, st) = (dims[a] as i64, steps[k]);
        if st == 0 {
            return Err(ctx.error("a slice step is 0"));
        }
        let (s, n) = if d == 0 {
            (0, 0)
        } else if st > 0 {
            let s = clamp_bound(starts[k], d, 0, 0);
            let t = clamp_bound(ends[k], d, 0, 0);
            (s, ceil_div((t - s).max(0), st))
        } else {
            let s = clamp_bound(starts[k], d, 0, -1);
            let t = clamp_bound(ends[k], d, -1, -1);
            (s, ceil_div((s - t).max(0), -st))
        };
        start[a] = s;
        step[a] = st;
        len[a] = n as u64;
    }
    if len != odims {
        return Err(ctx.error(format!(
            "the slice bounds give dims {len:?}, inference gave {odims:?}"
        )));
    }
    if len.contains(&0) {
        return Ok(no_kernels());
    }
    if len == dims && step.iter().all(|s| *s == 1) {
        return Ok(Lowered::Alias { input: 0 });
    }
    let strided = stride::Strided {
        dims: &dims,
        start: &start,
        step: &step,
        len: &len,
        elem: e,
    };
    if let Some(lowered) = stride::lower(ctx, &strided)? {
        return Ok(lowered);
    }
    let (sin, sout) = (strides(&dims), strides(&len));
    let src_off: i64 = (0..rank).map(|a| start[a] * (sin[a] * e) as i64).sum();
    let spec = Spec {
        src: 0,
        dst: 1,
        src_off,
        dst_off: 0,
        dims: (0..rank)
            .map(|a| Dim {
                n: len[a],
                si: step[a] * (sin[a] * e) as i64,
                so: (sout[a] * e) as i64,
            })
            .collect(),
        unit: e,
        kind: Unit::Dma,
    };
    copy_kernels(
        ctx,
        "",
        &[spec],
        vec![Operand::Input(0), Operand::Output(0)],
    )
}

/// Ceiling division of a non-negative by a positive `i64`.
fn ceil_div(a: i64, b: i64) -> i64 {
    a / b + i64::from(a % b != 0)
}

fn expand(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let xd = dims_of(ctx, x)?;
    let out = output(ctx)?;
    let od = dims_of(ctx, out)?;
    let k = od.len();
    if xd.len() > k {
        return Err(ctx.error(format!("the input has rank {}, the output {k}", xd.len())));
    }
    let e = x.dtype.size() as u64;
    let mut ind = vec![1u64; k - xd.len()];
    ind.extend(&xd);
    if od.contains(&0) {
        return Ok(no_kernels());
    }
    let sin = strides(&ind);
    let sout = strides(&od);
    let mut dims = Vec::with_capacity(k);
    for j in 0..k {
        let bcast = ind[j] == 1 && od[j] != 1;
        if !bcast && ind[j] != od[j] {
            return Err(ctx.error(format!(
                "input dim {} does not broadcast to {} on axis {j}",
                ind[j], od[j]
            )));
        }
        dims.push(Dim {
            n: od[j],
            si: if bcast { 0 } else { (sin[j] * e) as i64 },
            so: (sout[j] * e) as i64,
        });
    }
    if dims.iter().all(|d| d.n == 1 || d.si != 0) {
        return Ok(Lowered::Alias { input: 0 });
    }
    // A broadcast innermost axis repeats single elements: build those runs in UB.
    let innermost_bcast = dims
        .iter()
        .rev()
        .find(|d| d.n != 1)
        .is_some_and(|d| d.si == 0);
    let spec = Spec {
        src: 0,
        dst: 1,
        src_off: 0,
        dst_off: 0,
        dims,
        unit: e,
        kind: if innermost_bcast {
            Unit::Splat { elem: e }
        } else {
            Unit::Dma
        },
    };
    copy_kernels(
        ctx,
        "",
        &[spec],
        vec![Operand::Input(0), Operand::Output(0)],
    )
}
