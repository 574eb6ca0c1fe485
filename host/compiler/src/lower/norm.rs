//! InstanceNormalization and GroupNormalization, composed: the input viewed as `[N·G, C/G·S]`
//! (`S` the spatial size; InstanceNormalization is `G = C`) is normalised row by row with the
//! LayerNormalization kernel (no scale or bias), then Scale and B multiply and add per channel
//! as broadcast columns over the `[N, C, S]` view (GroupNormalization's opset-21 form; its
//! deprecated opset-18 form with per-group parameters is refused at import).
//!
//! ```text
//!   x [N, C, S] ─LayerNorm rows of C/G·S─▶ t ─Mul scale[C, 1]─▶ u ─Add bias[C, 1]─▶ y
//! ```

use super::cube::{Build, dims_of};
use super::{LowerCtx, LowerError, Lowered, Operand, Step, compose};
use crate::ir::{Attr, DataType, TensorDesc, fixed_shape};

/// The InstanceNormalization and GroupNormalization lowering.
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    if x.dtype != DataType::F32 {
        return Err(ctx.error(format!(
            "the input is {}; the normalisation kernel computes f32 only",
            x.dtype.name()
        )));
    }
    let d: Vec<i64> = dims_of(ctx, x)?.iter().map(|v| *v as i64).collect();
    let op = ctx.op_ctx();
    let groups = crate::ops::group_norm_parse(&op).map_err(|e| ctx.op_error(e))?;
    let (n, c) = (d[0], d[1]);
    let s: i64 = d[2..].iter().product();
    if n * c * s == 0 {
        return Ok(Build::default().finish());
    }
    let eps = ctx.node.float("epsilon").unwrap_or(1e-5);
    let desc = |dims: &[i64]| TensorDesc::new(x.dtype, fixed_shape(dims));
    let bytes = (n * c * s) as u64 * 4;
    let mut b = Build::default();
    let prefix = ctx.node.op.clone();
    let rows = [n * groups, c / groups * s];
    let normed = b.scratch(bytes);
    compose(
        ctx,
        &mut b,
        &Step {
            op: "LayerNormalization",
            attrs: &[("axis", Attr::Int(1)), ("epsilon", Attr::Float(eps))],
            ins: &[desc(&rows)],
            values: &[],
            out: desc(&rows),
            from: &[Operand::Input(0)],
            to: normed,
        },
        &prefix,
    )?;
    let (view, col) = ([n, c, s], [c, 1]);
    let scaled = b.scratch(bytes);
    for (op, from, to) in [
        ("Mul", [normed, Operand::Input(1)], scaled),
        ("Add", [scaled, Operand::Input(2)], Operand::Output(0)),
    ] {
        compose(
            ctx,
            &mut b,
            &Step {
                op,
                attrs: &[],
                ins: &[desc(&view), desc(&col)],
                values: &[],
                out: desc(&view),
                from: &from,
                to,
            },
            &prefix,
        )?;
    }
    Ok(b.finish())
}
