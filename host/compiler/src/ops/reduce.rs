//! Reductions: ReduceMean, ReduceSum, ReduceMax and ReduceMin with `keepdims` and
//! `noop_with_empty_axes`. The axes are input 1 from opset 13 (ReduceSum) or 18 (the others) on and must then be known at
//! compile time; before that they are the `axes` attribute. Dims that are not reduced pass
//! through, symbolic or not.

use super::super::infer::{OpCtx, OpDef, OpError};
use super::super::ir::{DataType, TensorDesc};
use super::super::symbolic::Dim;
use super::{NUMERIC, attr_flag, axes_param, forbid_attr, input_of, norm_axes};

/// The reduction operator definitions.
pub(super) fn defs() -> Vec<OpDef> {
    let reduction = |op, verify, infer| OpDef {
        op,
        min_inputs: 1,
        max_inputs: 2,
        verify,
        infer,
        fold: None,
        static_inputs: &[1],
    };
    vec![
        reduction("ReduceMean", verify_mean, infer_mean),
        // ReduceMax and ReduceMin take their axes as ReduceMean does (input 1 from opset 18).
        reduction("ReduceMax", verify_mean, infer_mean),
        reduction("ReduceMin", verify_mean, infer_mean),
        reduction("ReduceSum", verify_sum, infer_sum),
    ]
}

/// The output shape of a reduction whose axes became an input at opset `since`.
fn reduce_shape(ctx: &OpCtx<'_>, since: i64) -> Result<Vec<Dim>, OpError> {
    // ReduceMax and ReduceMin also take bool (opset 20 on).
    let x = if matches!(ctx.node.op.as_str(), "ReduceMax" | "ReduceMin") {
        let types = [NUMERIC, &[DataType::Bool][..]].concat();
        input_of(ctx, 0, &types, "a numeric or bool tensor")?
    } else {
        input_of(ctx, 0, NUMERIC, "a numeric tensor")?
    };
    let r = x.shape.len();
    let keep = attr_flag(ctx, "keepdims", true)?;
    let noop = if ctx.opset >= since {
        attr_flag(ctx, "noop_with_empty_axes", false)?
    } else {
        forbid_attr(
            ctx,
            "noop_with_empty_axes",
            &format!("it exists from opset {since} on"),
        )?;
        false
    };
    let axes = match axes_param(ctx, 1, since)? {
        Some((v, src)) if !v.is_empty() => norm_axes(src, &v, r)?,
        _ if noop => return Ok(x.shape.clone()),
        _ => (0..r).collect(),
    };
    let mut out = Vec::with_capacity(r);
    for (k, d) in x.shape.iter().enumerate() {
        if !axes.contains(&k) {
            out.push(d.clone());
        } else if keep {
            out.push(Dim::Fixed(1));
        }
    }
    Ok(out)
}

fn verify_mean(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    reduce_shape(ctx, 18).map(|_| ())
}

fn infer_mean(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(x.dtype, reduce_shape(ctx, 18)?)])
}

fn verify_sum(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    reduce_shape(ctx, 13).map(|_| ())
}

fn infer_sum(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(x.dtype, reduce_shape(ctx, 13)?)])
}
