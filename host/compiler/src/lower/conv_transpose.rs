//! ConvTranspose as a stride-1 convolution on the cube over the input spread by the strides
//! (zero rows between the input's rows, axis by axis, as GE's transposed convolution dilates
//! its input for strides above 1), with the kernel flipped and its channel axes swapped per
//! group, and pads `d·(k-1) - pad` (the output padding added at the end).
//!
//! ```text
//!   x [N, C, H, W] ─spread H─▶ ─spread W─▶ x' [N, C, s(H-1)+1, s(W-1)+1]
//!                  ─Conv (flipped weights, stride 1, dilation d)─▶ y
//! ```

use super::cube::{Build, dims_of};
use super::{LowerCtx, LowerError, Lowered, Operand, Step, compose};
use crate::ir::{Attr, Tensor, TensorDesc, fixed_shape};
use crate::ops::ConvTransposeGeometry;

/// The ConvTranspose lowering.
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let op = ctx.op_ctx();
    let g = ConvTransposeGeometry::parse(&op).map_err(|e| ctx.op_error(e))?;
    let rank = g.input.len();
    if rank > 2 {
        return Err(ctx.error(format!(
            "a {rank}-D transposed convolution (the convolution kernels are 1-D and 2-D)"
        )));
    }
    let w = ctx.values.get(1).copied().flatten().ok_or_else(|| {
        ctx.error("the weights are not a constant (they are packed at compile time)")
    })?;
    let mut dims: Vec<i64> = dims_of(ctx, x)?.iter().map(|v| *v as i64).collect();
    let n = dims[0];
    // Conv pads on the spread input: the kernel's extent less the pads cut, the output
    // padding added at the end.
    let mut pads = vec![0i64; 2 * rank];
    for a in 0..rank {
        let reach = g.dilations[a] * (g.kernel[a] - 1);
        pads[a] = reach - g.pads_begin[a];
        pads[rank + a] = reach - g.pads_end[a] + g.output_padding[a];
    }
    if pads.iter().any(|p| *p < 0) {
        return Err(ctx.error(format!(
            "pads {:?} / {:?} larger than the kernel's reach (the equivalent convolution would \
             need negative pads {pads:?})",
            g.pads_begin, g.pads_end
        )));
    }
    if n == 0 {
        return Ok(Build::default().finish());
    }
    let mut b = Build::default();
    let mut src = Operand::Input(0);
    for a in 0..rank {
        let s = g.strides[a] as usize;
        if s == 1 {
            continue;
        }
        let axis = 2 + a;
        let mut next = dims.clone();
        next[axis] = (dims[axis] - 1) * s as i64 + 1;
        let bytes = next.iter().product::<i64>() as u64 * x.dtype.size() as u64;
        let dst = b.scratch(bytes);
        super::resize::spread(ctx, &mut b, x.dtype, src, dst, &dims, axis, s)?;
        src = dst;
        dims = next;
    }
    let weights = flipped(w, &g);
    let raw = b.derive(weights.dtype, weights.data.to_vec());
    let mut ins = vec![
        TensorDesc::new(x.dtype, fixed_shape(&dims)),
        TensorDesc::new(weights.dtype, fixed_shape(&weights.dims)),
    ];
    let mut from = vec![src, raw];
    let mut values = vec![None, Some(&weights)];
    if let Some(bias) = ctx.inputs.get(2).copied().flatten() {
        ins.push(bias.clone());
        from.push(Operand::Input(2));
        values.push(ctx.values.get(2).copied().flatten());
    }
    let ones = vec![1i64; rank];
    let attrs = [
        ("kernel_shape", Attr::Ints(g.kernel.clone())),
        ("strides", Attr::Ints(ones)),
        ("dilations", Attr::Ints(g.dilations.clone())),
        ("pads", Attr::Ints(pads)),
        ("group", Attr::Int(g.group)),
    ];
    compose(
        ctx,
        &mut b,
        &Step {
            op: "Conv",
            attrs: &attrs,
            ins: &ins,
            values: &values,
            out: ctx
                .outputs
                .first()
                .cloned()
                .ok_or_else(|| ctx.error("the node has no output"))?,
            from: &from,
            to: Operand::Output(0),
        },
        &ctx.node.op,
    )?;
    Ok(b.finish())
}

/// The convolution's weights `[M, C/group, k...]` from ConvTranspose's `[C, M/group, k...]`:
/// per group the two channel axes swapped and every kernel axis reversed.
fn flipped(w: &Tensor, g: &ConvTransposeGeometry) -> Tensor {
    let e = w.dtype.size();
    let (c, m, groups) = (
        g.in_channels as usize,
        g.out_channels as usize,
        g.group as usize,
    );
    let (cg, mg) = (c / groups, m / groups);
    let k: usize = g.kernel.iter().product::<i64>() as usize;
    let mut out = vec![0u8; m * cg * k * e];
    for gi in 0..groups {
        for ic in 0..cg {
            for oc in 0..mg {
                for t in 0..k {
                    let src = (((gi * cg + ic) * mg + oc) * k + t) * e;
                    // Reversing every kernel axis reverses the flattened kernel index.
                    let dst = (((gi * mg + oc) * cg + ic) * k + (k - 1 - t)) * e;
                    out[dst..dst + e].copy_from_slice(&w.data[src..src + e]);
                }
            }
        }
    }
    let mut dims = vec![m as i64, cg as i64];
    dims.extend(&g.kernel);
    Tensor {
        dtype: w.dtype,
        dims,
        data: std::sync::Arc::new(out),
    }
}
