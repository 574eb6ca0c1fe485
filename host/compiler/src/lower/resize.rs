//! Resize as one pass per resized axis ([`crate::ops::AxisPass`]), each built from the
//! movement and element-wise kernels: output row `y` along the axis is `sum_k w_k[y] *
//! input[idx_k[y]]`, so tap `k` is a Gather of whole rows by a constant index table followed
//! by a multiply with a constant weight column, and the taps are summed. A nearest pass is
//! the Gather alone (exact for every type).
//!
//! ```text
//!   [P, D, Q] ─Gather idx_0─▶ g ─Mul w_0─▶ acc            (rows of Q elements move by DMA)
//!             ─Gather idx_1─▶ g ─Mul w_1─▶ t ─Add acc─▶ acc ...   ─▶ [P, D', Q]
//!   rows under 32 bytes (the last axis): Transpose [P, D, Q] → [D, P, Q], the pass on rows
//!   of P·Q elements, Transpose back
//! ```
//!
//! Where `tf_crop_and_resize` samples outside the input, the row reads an appended zero row
//! with weight zero and a constant column adds the extrapolation value.

use super::cube::Build;
use super::{LowerCtx, LowerError, Lowered, Operand};
use crate::ir::{Attr, DataType, TensorDesc, fixed_shape};
use crate::ops::{AxisPass, ResizeSpec};

/// Rows shorter than this many bytes are transposed into long rows first (one DMA per row
/// would move a few bytes each).
const SHORT_ROW: u64 = 32;

/// The Resize lowering.
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let dims: Vec<i64> = super::cube::dims_of(ctx, x)?
        .iter()
        .map(|d| *d as i64)
        .collect();
    let op = ctx.op_ctx();
    let spec = ResizeSpec::parse(&op).map_err(|e| ctx.op_error(e))?;
    let passes = spec.passes(&dims).map_err(|e| ctx.op_error(e))?;
    if passes.is_empty() {
        return Ok(Lowered::Alias { input: 0 });
    }
    // The passes commute: shrinking ones first and growing ones last keeps the tensors each
    // pass moves small, and between equal ratios the last axis (which needs transposes) goes
    // first, on the smaller tensor.
    let mut passes = passes;
    let last = dims.len() - 1;
    passes.sort_by(|a, b| {
        let ratio = |p: &AxisPass| p.output as f64 / p.input as f64;
        ratio(a)
            .total_cmp(&ratio(b))
            .then((b.axis == last).cmp(&(a.axis == last)))
    });
    let interpolates = passes.iter().any(|p| p.copy_rows().is_none());
    if interpolates && !matches!(x.dtype, DataType::F32 | DataType::F16) {
        return Err(ctx.error(format!(
            "an interpolating resize of {} (the vector unit interpolates f32 and f16)",
            x.dtype.name()
        )));
    }
    let mut b = Build::default();
    let mut src = Operand::Input(0);
    let mut cur = dims;
    for (i, p) in passes.iter().enumerate() {
        let mut next = cur.clone();
        next[p.axis] = p.output as i64;
        let dst = if i + 1 == passes.len() {
            Operand::Output(0)
        } else {
            b.scratch(bytes(x.dtype, &next))
        };
        let pass = Pass {
            ctx,
            dtype: x.dtype,
            tag: format!("axis{}", p.axis),
            extrapolation: spec.extrapolation,
        };
        pass.axis(&mut b, p, src, dst, &cur)?;
        src = dst;
        cur = next;
    }
    Ok(b.finish())
}

/// ConvTranspose's input spread along `axis` of `dims` by `stride`: output row `y` is input
/// row `y / stride` where `stride` divides `y`, a row of zeros elsewhere.
#[allow(clippy::too_many_arguments)]
pub(super) fn spread(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    dtype: DataType,
    src: Operand,
    dst: Operand,
    dims: &[i64],
    axis: usize,
    stride: usize,
) -> Result<(), LowerError> {
    let input = dims[axis] as usize;
    let output = (input - 1) * stride + 1;
    let hit = |y: usize| y.is_multiple_of(stride);
    let p = AxisPass {
        axis,
        input,
        output,
        taps: 1,
        index: (0..output)
            .map(|y| if hit(y) { y / stride } else { 0 })
            .collect(),
        weight: (0..output)
            .map(|y| if hit(y) { 1.0 } else { 0.0 })
            .collect(),
        extrapolated: vec![false; output],
    };
    let pass = Pass {
        ctx,
        dtype,
        tag: format!("spread{axis}"),
        extrapolation: 0.0,
    };
    pass.axis(b, &p, src, dst, dims)
}

fn bytes(dtype: DataType, dims: &[i64]) -> u64 {
    dims.iter().product::<i64>().max(0) as u64 * dtype.size() as u64
}

/// One axis's kernels.
struct Pass<'a, 'b> {
    ctx: &'a LowerCtx<'b>,
    dtype: DataType,
    /// Kernel-name tag of this pass.
    tag: String,
    extrapolation: f64,
}

impl Pass<'_, '_> {
    fn desc(&self, dtype: DataType, dims: &[i64]) -> TensorDesc {
        TensorDesc::new(dtype, fixed_shape(dims))
    }

    /// Appends the kernels of `op` (see [`super::compose`]), named after this pass.
    #[allow(clippy::too_many_arguments)]
    fn sub(
        &self,
        b: &mut Build,
        op: &str,
        attrs: &[(&str, Attr)],
        ins: &[TensorDesc],
        out: TensorDesc,
        from: &[Operand],
        to: Operand,
    ) -> Result<(), LowerError> {
        let step = super::Step {
            op,
            attrs,
            ins,
            values: &[],
            out,
            from,
            to,
        };
        super::compose(self.ctx, b, &step, &format!("Resize_{}", self.tag))
    }

    /// The pass along `p.axis` of the tensor `dims` at `src` into `dst`.
    fn axis(
        &self,
        b: &mut Build,
        p: &AxisPass,
        src: Operand,
        dst: Operand,
        dims: &[i64],
    ) -> Result<(), LowerError> {
        let outer: i64 = dims[..p.axis].iter().product();
        let inner: i64 = dims[p.axis + 1..].iter().product();
        let (d, o) = (p.input as i64, p.output as i64);
        let row = inner as u64 * self.dtype.size() as u64;
        if row >= SHORT_ROW || outer == 1 {
            return self.rows(b, p, src, dst, [outer, d, inner]);
        }
        // Swapping an axis of length 1 moves no byte: no kernel for it.
        let perm = || ("perm", Attr::Ints(vec![1, 0, 2]));
        let there = if d == 1 {
            src
        } else {
            let there = b.scratch(bytes(self.dtype, &[d, outer, inner]));
            self.sub(
                b,
                "Transpose",
                &[perm()],
                &[self.desc(self.dtype, &[outer, d, inner])],
                self.desc(self.dtype, &[d, outer, inner]),
                &[src],
                there,
            )?;
            there
        };
        if o == 1 {
            return self.rows(b, p, there, dst, [1, d, outer * inner]);
        }
        let done = b.scratch(bytes(self.dtype, &[o, outer, inner]));
        self.rows(b, p, there, done, [1, d, outer * inner])?;
        self.sub(
            b,
            "Transpose",
            &[perm()],
            &[self.desc(self.dtype, &[o, outer, inner])],
            self.desc(self.dtype, &[outer, o, inner]),
            &[done],
            dst,
        )
    }

    /// The pass over `[outer, D, inner]` with rows of `inner` contiguous elements.
    fn rows(
        &self,
        b: &mut Build,
        p: &AxisPass,
        src: Operand,
        dst: Operand,
        [outer, d, inner]: [i64; 3],
    ) -> Result<(), LowerError> {
        let o = p.output as i64;
        let data = self.desc(self.dtype, &[outer, d, inner]);
        let out = self.desc(self.dtype, &[outer, o, inner]);
        // Rows `rows` of `[outer, len, inner]` at `from`, by a constant index table.
        let gather = |b: &mut Build, len: i64, from: Operand, rows: &[usize], to: Operand| {
            let idx: Vec<u8> = rows
                .iter()
                .flat_map(|r| (*r as i32).to_le_bytes())
                .collect();
            let table = b.derive(DataType::I32, idx);
            self.sub(
                b,
                "Gather",
                &[("axis", Attr::Int(1))],
                &[
                    self.desc(self.dtype, &[outer, len, inner]),
                    self.desc(DataType::I32, &[o]),
                ],
                out.clone(),
                &[from, table],
                to,
            )
        };
        // The input with a zero row appended (index D), for output rows that read nothing:
        // exact, where a multiply by zero would turn an infinity into NaN.
        let with_zero_row = |b: &mut Build| -> Result<Operand, LowerError> {
            let zeros = b.derive(
                self.dtype,
                vec![0; (outer * inner) as usize * self.dtype.size()],
            );
            let grown = b.scratch(bytes(self.dtype, &[outer, d + 1, inner]));
            self.sub(
                b,
                "Concat",
                &[("axis", Attr::Int(1))],
                &[data.clone(), self.desc(self.dtype, &[outer, 1, inner])],
                self.desc(self.dtype, &[outer, d + 1, inner]),
                &[src, zeros],
                grown,
            )?;
            Ok(grown)
        };
        if let Some(rows) = p.copy_rows() {
            if !rows.contains(&p.input) {
                return gather(b, d, src, &rows, dst);
            }
            let grown = with_zero_row(b)?;
            return gather(b, d + 1, grown, &rows, dst);
        }
        // A weight per output row, in the tensor's type (rounded once).
        let column = |b: &mut Build, v: &[f64]| -> Operand {
            let t = crate::eval::encode_f64(self.dtype, vec![o], v);
            b.derive(self.dtype, t.data.to_vec())
        };
        let col = self.desc(self.dtype, &[o, 1]);
        let extrapolate = p.extrapolated.iter().any(|e| *e);
        // An extrapolated row reads the zero row with weight 0 (then takes the bias).
        let (from, len) = if extrapolate {
            (with_zero_row(b)?, d + 1)
        } else {
            (src, d)
        };
        // The taps that carry weight somewhere.
        let taps: Vec<(Vec<usize>, Vec<f64>)> = (0..p.taps)
            .map(|k| {
                let at = |y: usize| y * p.taps + k;
                let w: Vec<f64> = (0..p.output)
                    .map(|y| {
                        if p.extrapolated[y] {
                            0.0
                        } else {
                            p.weight[at(y)]
                        }
                    })
                    .collect();
                let rows = (0..p.output)
                    .map(|y| {
                        if p.extrapolated[y] {
                            p.input
                        } else {
                            p.index[at(y)]
                        }
                    })
                    .collect();
                (rows, w)
            })
            .filter(|(_, w)| w.iter().any(|w| *w != 0.0))
            .collect();
        // Every row extrapolated: one zero-weight tap keeps the shape for the bias.
        let taps = if taps.is_empty() {
            vec![(vec![p.input; p.output], vec![0.0; p.output])]
        } else {
            taps
        };
        let size = bytes(self.dtype, &[outer, o, inner]);
        let g = b.scratch(size);
        let t = b.scratch(size);
        let mut acc = [b.scratch(size), b.scratch(size)];
        let bias = extrapolate && self.extrapolation != 0.0;
        let n = taps.len();
        for (k, (rows, w)) in taps.iter().enumerate() {
            let final_step = k + 1 == n && !bias;
            gather(b, len, from, rows, g)?;
            let weights = column(b, w);
            let to = match k {
                0 if final_step => dst,
                0 => acc[0],
                _ => t,
            };
            self.sub(
                b,
                "Mul",
                &[],
                &[out.clone(), col.clone()],
                out.clone(),
                &[g, weights],
                to,
            )?;
            if k > 0 {
                let to = if final_step { dst } else { acc[1] };
                self.sub(
                    b,
                    "Add",
                    &[],
                    &[out.clone(), out.clone()],
                    out.clone(),
                    &[acc[0], t],
                    to,
                )?;
                acc.swap(0, 1);
            }
        }
        if bias {
            let e: Vec<f64> = p
                .extrapolated
                .iter()
                .map(|x| if *x { self.extrapolation } else { 0.0 })
                .collect();
            let column = column(b, &e);
            self.sub(
                b,
                "Add",
                &[],
                &[out.clone(), col],
                out,
                &[acc[0], column],
                dst,
            )?;
        }
        Ok(())
    }
}
