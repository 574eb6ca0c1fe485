//! Reductions: ReduceMean and ReduceSum with `keepdims` and `noop_with_empty_axes`. The axes
//! are input 1 from opset 13 (ReduceSum) or 18 (ReduceMean) on and must then be known at
//! compile time; before that they are the `axes` attribute. Dims that are not reduced pass
//! through, symbolic or not.

use super::super::infer::{OpCtx, OpDef, OpError};
use super::super::ir::TensorDesc;
use super::super::symbolic::Dim;
use super::{NUMERIC, attr_flag, axes_param, forbid_attr, input_of, norm_axes};

/// The reduction operator definitions.
pub(super) fn defs() -> Vec<OpDef> {
    vec![
        OpDef {
            op: "ReduceMean",
            min_inputs: 1,
            max_inputs: 2,
            verify: verify_mean,
            infer: infer_mean,
            fold: None,
            static_inputs: &[1],
        },
        OpDef {
            op: "ReduceSum",
            min_inputs: 1,
            max_inputs: 2,
            verify: verify_sum,
            infer: infer_sum,
            fold: None,
            static_inputs: &[1],
        },
    ]
}

/// The output shape of a reduction whose axes became an input at opset `since`.
fn reduce_shape(ctx: &OpCtx<'_>, since: i64) -> Result<Vec<Dim>, OpError> {
    let x = input_of(ctx, 0, NUMERIC, "a numeric tensor")?;
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
