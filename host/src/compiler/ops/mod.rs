//! The operator library: every supported ONNX operator registers its verify, infer-shape and
//! (for shape computations) fold functions here, once.

use super::infer::{OpCtx, OpDef, OpError, Registry, broadcast};
use super::ir::TensorDesc;

/// The registry of every supported operator.
pub fn standard() -> Registry {
    let mut r = Registry::default();
    for def in elementwise() {
        r.register(def);
    }
    r
}

fn no_verify(_: &OpCtx<'_>) -> Result<(), OpError> {
    Ok(())
}

/// Output = input 0's descriptor.
fn same_as_input(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    Ok(vec![ctx.input(0)?.clone()])
}

fn float_input(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    let d = ctx.input(0)?;
    if !d.dtype.is_float() {
        return Err(OpError::input(
            0,
            "a float tensor",
            d.dtype.name(),
            "cast the input to float",
        ));
    }
    Ok(())
}

/// Two inputs of one type broadcast together.
fn binary_broadcast(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    if a.dtype != b.dtype {
        return Err(OpError::input(
            1,
            format!("type {} like input 0", a.dtype.name()),
            b.dtype.name(),
            "insert a Cast",
        ));
    }
    let shape = broadcast(&a.shape, &b.shape).map_err(|(k, x, y)| {
        OpError::input(
            1,
            format!("a shape that broadcasts with {a} (axis {k}: {x})"),
            format!("{b} (axis {k}: {y})"),
            "make the two shapes broadcastable",
        )
    })?;
    Ok(vec![TensorDesc {
        dtype: a.dtype,
        shape,
        format: a.format,
    }])
}

fn elementwise() -> Vec<OpDef> {
    let unary = |op| OpDef {
        op,
        min_inputs: 1,
        max_inputs: 1,
        verify: float_input,
        infer: same_as_input,
        fold: None,
    };
    let binary = |op| OpDef {
        op,
        min_inputs: 2,
        max_inputs: 2,
        verify: no_verify,
        infer: binary_broadcast,
        fold: None,
    };
    vec![unary("Relu"), binary("Add")]
}
