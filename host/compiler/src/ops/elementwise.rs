//! Elementwise operators: unary math (Sqrt, Erf, Relu, Sigmoid, Tanh, Gelu, Clip, Exp, Log, Abs,
//! Neg, Reciprocal, Floor, Ceil, Round, Sign, IsNaN, IsInf, the variadic Sum, Mean, Max, Min and the activations PRelu, Softplus, Softsign, LeakyRelu, Elu, Selu,
//! Celu, HardSigmoid, HardSwish, ThresholdedRelu), the numpy
//! broadcasting binaries (Add, Sub, Mul, Div, Pow, Equal, Less, Greater, LessOrEqual,
//! GreaterOrEqual, And, Or, Xor), Not, Where, Cast and Identity. Symbolic
//! dims broadcast with 1 or with an identical expression; Add/Sub/Mul/Div/Equal/Where/Cast/
//! Identity fold.

use std::sync::Arc;

use gearsim_isa::aicpu_op::{ElementwiseOp, Operand as AiOperand, elementwise};
use gearsim_isa::numeric::{self, CastMode, RoundMode};

use super::super::infer::{FoldFn, OpCtx, OpDef, OpError, broadcast};
use super::super::ir::{DataType, Node, Tensor, TensorDesc};
use super::super::symbolic::Dim;
use super::values::{
    Elems, broadcast_dims, broadcast_index, elems, foldable, from_floats, from_ints,
};
use super::{
    FLOATS, NUMERIC, attr_int, attr_str, forbid_attr, input_of, known, opt_input, same_dtype,
    shape_str,
};

/// The elementwise operator definitions.
pub(super) fn defs() -> Vec<OpDef> {
    let unary = |op, verify: fn(&OpCtx<'_>) -> Result<(), OpError>| OpDef {
        op,
        min_inputs: 1,
        max_inputs: 1,
        verify,
        infer: same_as_input,
        fold: None,
        static_inputs: &[],
    };
    let arith = |op, fold: fn(&OpCtx<'_>) -> Result<Vec<Tensor>, OpError>| OpDef {
        op,
        min_inputs: 2,
        max_inputs: 2,
        verify: verify_arith,
        infer: infer_arith,
        fold: Some(fold),
        static_inputs: &[],
    };
    // Sum and Mean: any number of inputs that broadcast together.
    let variadic = |op| OpDef {
        op,
        min_inputs: 1,
        max_inputs: usize::MAX,
        verify: verify_variadic,
        infer: infer_variadic,
        fold: None,
        static_inputs: &[],
    };
    // Broadcasting binaries with a bool output (comparisons, logic).
    let to_bool = |op, verify: fn(&OpCtx<'_>) -> Result<(), OpError>, fold: Option<FoldFn>| OpDef {
        op,
        min_inputs: 2,
        max_inputs: 2,
        verify,
        infer: infer_equal,
        fold,
        static_inputs: &[],
    };
    vec![
        unary("Sqrt", verify_float),
        unary("Erf", verify_float),
        unary("Sigmoid", verify_float),
        unary("Tanh", verify_float),
        unary("Relu", verify_relu),
        unary("Gelu", verify_gelu),
        unary("Exp", verify_float),
        unary("Log", verify_float),
        unary("Reciprocal", verify_float),
        unary("Floor", verify_float),
        unary("Ceil", verify_float),
        unary("Softplus", verify_float),
        unary("Softsign", verify_float),
        unary("HardSwish", verify_float),
        unary("Round", verify_float),
        unary("Sign", verify_numeric),
        OpDef {
            infer: infer_is,
            ..unary("IsNaN", verify_float)
        },
        OpDef {
            infer: infer_is,
            ..unary("IsInf", verify_float)
        },
        OpDef {
            op: "PRelu",
            min_inputs: 2,
            max_inputs: 2,
            verify: verify_arith,
            infer: same_as_input,
            fold: None,
            static_inputs: &[],
        },
        variadic("Sum"),
        variadic("Mean"),
        variadic("Max"),
        variadic("Min"),
        OpDef {
            fold: Some(fold_abs),
            ..unary("Abs", verify_numeric)
        },
        OpDef {
            fold: Some(fold_neg),
            ..unary("Neg", verify_relu)
        },
        unary("LeakyRelu", verify_float),
        unary("Elu", verify_float),
        unary("Selu", verify_float),
        unary("Celu", verify_float),
        unary("HardSigmoid", verify_float),
        unary("ThresholdedRelu", verify_float),
        OpDef {
            op: "Clip",
            min_inputs: 1,
            max_inputs: 3,
            verify: verify_clip,
            infer: same_as_input,
            fold: None,
            static_inputs: &[],
        },
        arith("Add", fold_add),
        arith("Sub", fold_sub),
        arith("Mul", fold_mul),
        arith("Div", fold_div),
        OpDef {
            verify: verify_mod,
            ..arith("Mod", fold_mod)
        },
        OpDef {
            op: "Pow",
            min_inputs: 2,
            max_inputs: 2,
            verify: verify_pow,
            // The output has the base's type even when the exponent's differs (opset 12 on).
            infer: infer_arith,
            fold: None,
            static_inputs: &[],
        },
        to_bool("Equal", verify_equal, Some(fold_equal)),
        to_bool("Less", verify_equal, None),
        to_bool("Greater", verify_equal, None),
        to_bool("LessOrEqual", verify_equal, None),
        to_bool("GreaterOrEqual", verify_equal, None),
        OpDef {
            op: "Where",
            min_inputs: 3,
            max_inputs: 3,
            verify: verify_where,
            infer: infer_where,
            fold: Some(fold_where),
            static_inputs: &[],
        },
        to_bool("And", verify_logic, Some(fold_logic)),
        to_bool("Or", verify_logic, Some(fold_logic)),
        to_bool("Xor", verify_logic, Some(fold_logic)),
        OpDef {
            fold: Some(fold_logic),
            ..unary("Not", verify_logic)
        },
        OpDef {
            op: "Cast",
            min_inputs: 1,
            max_inputs: 1,
            verify: verify_cast,
            infer: infer_cast,
            fold: Some(fold_cast),
            static_inputs: &[],
        },
        OpDef {
            op: "CastLike",
            min_inputs: 2,
            max_inputs: 2,
            verify: verify_cast,
            infer: infer_cast,
            fold: Some(fold_cast),
            static_inputs: &[],
        },
        OpDef {
            op: "Identity",
            min_inputs: 1,
            max_inputs: 1,
            verify: verify_any,
            infer: same_as_input,
            fold: Some(fold_identity),
            static_inputs: &[],
        },
    ]
}

/// Output = input 0's descriptor.
/// The attributes of the parameterised activations, with ONNX's defaults: `alpha`, and
/// `gamma` (Selu) or `beta` (HardSigmoid), else 0; `None` for an op without them. The one
/// place the defaults are written, for the kernels and the reference evaluator alike.
pub fn activation_attrs(node: &Node) -> Option<(f32, f32)> {
    let (alpha, second, name) = match node.op.as_str() {
        "LeakyRelu" => (0.01, 0.0, ""),
        "Elu" | "Celu" | "ThresholdedRelu" => (1.0, 0.0, ""),
        "Selu" => (1.673_263_2, 1.050_701, "gamma"),
        "HardSigmoid" => (0.2, 0.5, "beta"),
        _ => return None,
    };
    Some((
        node.float("alpha").unwrap_or(alpha),
        node.float(name).unwrap_or(second),
    ))
}

fn same_as_input(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    Ok(vec![ctx.input(0)?.clone()])
}

fn verify_any(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    ctx.input(0).map(|_| ())
}

fn verify_float(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, FLOATS, "a float tensor").map(|_| ())
}

fn verify_numeric(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, NUMERIC, "a numeric tensor").map(|_| ())
}

fn verify_relu(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    let types = [
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
    ];
    input_of(ctx, 0, &types, "a float or signed integer tensor").map(|_| ())
}

fn verify_gelu(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, FLOATS, "a float tensor")?;
    let mode = attr_str(ctx, "approximate", "none")?;
    if mode != "none" && mode != "tanh" {
        return Err(OpError::attr(
            "approximate",
            "\"none\" or \"tanh\"",
            format!("{mode:?}"),
            "use approximate=\"none\" (erf form) or \"tanh\"",
        ));
    }
    Ok(())
}

fn verify_clip(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, NUMERIC, "a numeric tensor")?;
    for name in ["min", "max"] {
        forbid_attr(
            ctx,
            name,
            "since opset 11 Clip takes min and max as optional inputs 1 and 2",
        )?;
    }
    for i in [1, 2] {
        let Some(d) = opt_input(ctx, i) else { continue };
        same_dtype(ctx, 0, i)?;
        let scalar = d.shape.is_empty() || d.shape == [Dim::Fixed(1)];
        if !scalar {
            return Err(OpError::input(
                i,
                format!("a scalar {} bound", if i == 1 { "min" } else { "max" }),
                format!("shape {}", shape_str(&d.shape)),
                "give Clip a single value (shape [] or [1]) for each bound",
            ));
        }
    }
    Ok(())
}

/// The numpy broadcast of the shapes of inputs `idx`, blaming the first input that conflicts.
fn broadcast_inputs(ctx: &OpCtx<'_>, idx: &[usize]) -> Result<Vec<Dim>, OpError> {
    let mut shape: Vec<Dim> = Vec::new();
    for (n, &j) in idx.iter().enumerate() {
        let d = ctx.input(j)?;
        if n == 0 {
            shape = d.shape.clone();
            continue;
        }
        shape = broadcast(&shape, &d.shape).map_err(|(k, x, y)| {
            OpError::input(
                j,
                format!(
                    "a shape that broadcasts with {} (axis {k} of the result: {x})",
                    shape_str(&shape)
                ),
                format!("{} (axis {k}: {y})", shape_str(&d.shape)),
                "make the dims on each axis equal or 1; a symbolic dim broadcasts only with 1 or \
                 with the same expression",
            )
        })?;
    }
    Ok(shape)
}

/// IsNaN and IsInf: a bool of the input's shape.
fn infer_is(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(DataType::Bool, x.shape.clone())])
}

/// Sum and Mean: numeric inputs of one type that broadcast together.
fn verify_variadic(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, NUMERIC, "a numeric tensor")?;
    let all: Vec<usize> = (0..ctx.inputs.len()).collect();
    for &i in all.iter().skip(1) {
        same_dtype(ctx, 0, i)?;
    }
    broadcast_inputs(ctx, &all).map(|_| ())
}

fn infer_variadic(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let a = ctx.input(0)?;
    let all: Vec<usize> = (0..ctx.inputs.len()).collect();
    Ok(vec![TensorDesc::new(a.dtype, broadcast_inputs(ctx, &all)?)])
}

fn verify_arith(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, NUMERIC, "a numeric tensor")?;
    same_dtype(ctx, 0, 1)?;
    broadcast_inputs(ctx, &[0, 1]).map(|_| ())
}

/// Mod: Add's rules, and `fmod=1` for floats (a floored remainder of floats is not defined).
fn verify_mod(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    verify_arith(ctx)?;
    let fmod = attr_int(ctx, "fmod", 0)?;
    if !matches!(fmod, 0 | 1) {
        return Err(OpError::attr(
            "fmod",
            "0 (the remainder takes the divisor's sign) or 1 (the dividend's, C's fmod)",
            fmod.to_string(),
            "set fmod to 0 or 1",
        ));
    }
    if fmod == 0 && ctx.input(0)?.dtype.is_float() {
        return Err(OpError::attr(
            "fmod",
            "1 for a floating-point input (the ONNX specification requires it)",
            "0",
            "set fmod=1",
        ));
    }
    Ok(())
}

fn infer_arith(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let a = ctx.input(0)?;
    Ok(vec![TensorDesc {
        dtype: a.dtype,
        shape: broadcast_inputs(ctx, &[0, 1])?,
        format: a.format,
    }])
}

fn verify_pow(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, NUMERIC, "a numeric base")?;
    input_of(ctx, 1, NUMERIC, "a numeric exponent")?;
    broadcast_inputs(ctx, &[0, 1]).map(|_| ())
}

fn verify_equal(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    same_dtype(ctx, 0, 1)?;
    broadcast_inputs(ctx, &[0, 1]).map(|_| ())
}

fn infer_equal(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    Ok(vec![TensorDesc::new(
        DataType::Bool,
        broadcast_inputs(ctx, &[0, 1])?,
    )])
}

/// And, Or, Xor (broadcasting) and Not: bool tensors.
fn verify_logic(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    for i in 0..ctx.inputs.len() {
        input_of(ctx, i, &[DataType::Bool], "a bool tensor")?;
    }
    if ctx.inputs.len() == 2 {
        broadcast_inputs(ctx, &[0, 1])?;
    }
    Ok(())
}

fn verify_where(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    input_of(ctx, 0, &[DataType::Bool], "a bool condition")?;
    same_dtype(ctx, 1, 2)?;
    broadcast_inputs(ctx, &[0, 1, 2]).map(|_| ())
}

fn infer_where(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(1)?;
    Ok(vec![TensorDesc {
        dtype: x.dtype,
        shape: broadcast_inputs(ctx, &[0, 1, 2])?,
        format: x.format,
    }])
}

/// The type Cast converts to.
fn cast_target(ctx: &OpCtx<'_>) -> Result<DataType, OpError> {
    // CastLike (opset 15) casts to its second input's type.
    if ctx.node.op == "CastLike" {
        return Ok(ctx.input(1)?.dtype);
    }
    if ctx.node.attr("to").is_none() {
        return Err(OpError::attr(
            "to",
            "the target type code",
            "nothing",
            "set `to` to an ONNX TensorProto data type",
        ));
    }
    let to = attr_int(ctx, "to", 0)?;
    i32::try_from(to)
        .ok()
        .and_then(DataType::from_onnx)
        .ok_or_else(|| {
            let names: Vec<String> = DataType::ALL
                .iter()
                .map(|t| format!("{} ({})", t.onnx_code(), t.name()))
                .collect();
            OpError::attr(
                "to",
                format!("a supported type code: {}", names.join(", ")),
                to.to_string(),
                "cast to one of the supported types (strings and complex numbers are not \
                 supported)",
            )
        })
}

fn verify_cast(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    ctx.input(0)?;
    cast_mode_attr(ctx)?;
    cast_target(ctx).map(|_| ())
}

fn infer_cast(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc {
        dtype: cast_target(ctx)?,
        shape: x.shape.clone(),
        format: x.format,
    }])
}

fn fold_cast(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some(t) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    if !foldable(&t.dims) {
        return Ok(vec![]);
    }
    let to = cast_target(ctx)?;
    let data = numeric::cast(t.dtype, to, &t.data, cast_mode_attr(ctx)?);
    Ok(vec![Tensor {
        dtype: to,
        dims: t.dims.clone(),
        data: Arc::new(data),
    }])
}

fn cast_mode_attr(ctx: &OpCtx<'_>) -> Result<CastMode, OpError> {
    cast_mode(ctx.node).map_err(|e| {
        OpError::attr(
            "round_mode",
            "up, down or nearest",
            e,
            "use one of ONNX's round modes",
        )
    })
}

/// Cast's `saturate` (default 1) and `round_mode` (default `up`) attributes; the error names
/// an unknown round mode.
pub fn cast_mode(node: &Node) -> Result<CastMode, String> {
    let saturate = node.int("saturate").unwrap_or(1) != 0;
    let round = match node.string("round_mode") {
        None => RoundMode::Up,
        Some(s) => RoundMode::from_name(s).ok_or_else(|| format!("round_mode `{s}`"))?,
    };
    Ok(CastMode { saturate, round })
}

/// Neg folds (shape computations negate axes: LayerNormalization's expansion).
fn fold_neg(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_signed(ctx, |x| -x, i64::wrapping_neg)
}

fn fold_abs(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_signed(ctx, f64::abs, i64::wrapping_abs)
}

/// A unary op on a known, small input: floats in f64 (exact for these), integers wrapping.
fn fold_signed(
    ctx: &OpCtx<'_>,
    f: impl Fn(f64) -> f64,
    i: impl Fn(i64) -> i64,
) -> Result<Vec<Tensor>, OpError> {
    let Some(t) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    if !foldable(&t.dims) {
        return Ok(vec![]);
    }
    let out = match elems(t) {
        Elems::Int(v) => from_ints(
            t.dtype,
            t.dims.clone(),
            &v.into_iter().map(i).collect::<Vec<_>>(),
        )?,
        Elems::Float(v) => from_floats(
            t.dtype,
            t.dims.clone(),
            &v.into_iter().map(f).collect::<Vec<_>>(),
        )?,
    };
    Ok(vec![out])
}

fn fold_identity(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    Ok(known(ctx, 0).map(|t| vec![t.clone()]).unwrap_or_default())
}

/// A binary operation folded on integers and floats.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Equal,
}

fn fold_add(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_arith(ctx, Arith::Add)
}

fn fold_sub(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_arith(ctx, Arith::Sub)
}

fn fold_mul(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_arith(ctx, Arith::Mul)
}

fn fold_div(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_arith(ctx, Arith::Div)
}

/// Both inputs of a binary op when they are known, of one type, and broadcast to dims small
/// enough to fold, with those dims.
fn known_pair<'a>(ctx: &OpCtx<'a>) -> Option<(&'a Tensor, &'a Tensor, Vec<i64>)> {
    let (a, b) = (known(ctx, 0)?, known(ctx, 1)?);
    let dims = broadcast_dims(&[&a.dims, &b.dims])?;
    (foldable(&dims) && a.dtype == b.dtype).then_some((a, b, dims))
}

/// Mod folds (shape computations take remainders: attention's expansions), through the AI
/// CPU's code for it, which the device and the evaluator use too.
fn fold_mod(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some((a, b, dims)) = known_pair(ctx) else {
        return Ok(vec![]);
    };
    let op = ElementwiseOp::of_node("Mod", attr_int(ctx, "fmod", 0)? == 1);
    Ok(op
        .map(|op| vec![aicpu_elementwise(op, &[a, b], a.dtype, dims)])
        .unwrap_or_default())
}

/// An element-wise operator on host tensors through the AI CPU's code for it (the inputs
/// broadcast to `dims`, as shape inference found them).
pub fn aicpu_elementwise(
    op: ElementwiseOp,
    ins: &[&Tensor],
    dtype: DataType,
    dims: Vec<i64>,
) -> Tensor {
    let operand = |dtype: DataType, dims: &[i64]| AiOperand {
        dtype,
        dims: dims.to_vec(),
    };
    let inputs: Vec<AiOperand> = ins.iter().map(|t| operand(t.dtype, &t.dims)).collect();
    let data: Vec<&[u8]> = ins.iter().map(|t| t.data.as_slice()).collect();
    let bytes = elementwise(op, &inputs, &data, &operand(dtype, &dims));
    Tensor {
        dtype,
        dims,
        data: Arc::new(bytes),
    }
}

/// And, Or, Xor and Not fold (shape computations choose between dims with them: attention's
/// grouped-query test).
fn fold_logic(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let ins: Vec<&Tensor> = match (0..ctx.inputs.len()).map(|i| known(ctx, i)).collect() {
        Some(v) => v,
        None => return Ok(vec![]),
    };
    let shapes: Vec<&[i64]> = ins.iter().map(|t| t.dims.as_slice()).collect();
    let Some(dims) = broadcast_dims(&shapes) else {
        return Ok(vec![]);
    };
    if !foldable(&dims) {
        return Ok(vec![]);
    }
    let maps = ins
        .iter()
        .map(|t| broadcast_index(&dims, &t.dims))
        .collect::<Result<Vec<_>, _>>()?;
    let n = maps.first().map_or(0, Vec::len);
    let v: Vec<i64> = (0..n)
        .map(|k| {
            let bit = |i: usize| ins[i].data[maps[i][k]] != 0;
            let r = match ctx.node.op.as_str() {
                "And" => bit(0) && bit(1),
                "Or" => bit(0) || bit(1),
                "Xor" => bit(0) != bit(1),
                _ => !bit(0),
            };
            i64::from(r)
        })
        .collect();
    Ok(vec![from_ints(DataType::Bool, dims, &v)?])
}

fn fold_equal(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_arith(ctx, Arith::Equal)
}

/// Integers compute in i64 with wrapping and are then narrowed to their type, which is the
/// same as wrapping in the narrow type; floats compute in f64 and round once, which gives the
/// correctly rounded f32/f16 result for + - * /.
fn fold_arith(ctx: &OpCtx<'_>, op: Arith) -> Result<Vec<Tensor>, OpError> {
    let Some((a, b, dims)) = known_pair(ctx) else {
        return Ok(vec![]);
    };
    let ia = broadcast_index(&dims, &a.dims)?;
    let ib = broadcast_index(&dims, &b.dims)?;
    let dtype = if op == Arith::Equal {
        DataType::Bool
    } else {
        a.dtype
    };
    match (elems(a), elems(b)) {
        (Elems::Int(x), Elems::Int(y)) => {
            let mut v = Vec::with_capacity(ia.len());
            for (k, (i, j)) in ia.iter().zip(&ib).enumerate() {
                let (p, q) = (
                    x.get(*i).copied().unwrap_or(0),
                    y.get(*j).copied().unwrap_or(0),
                );
                v.push(match op {
                    Arith::Add => p.wrapping_add(q),
                    Arith::Sub => p.wrapping_sub(q),
                    Arith::Mul => p.wrapping_mul(q),
                    Arith::Div if q == 0 => {
                        return Err(OpError::input(
                            1,
                            "a non-zero integer divisor",
                            format!("0 at element {k} of the broadcast result"),
                            "fix the shape computation that divides by zero",
                        ));
                    }
                    Arith::Div => p.wrapping_div(q),
                    Arith::Equal => i64::from(p == q),
                });
            }
            Ok(vec![from_ints(dtype, dims, &v)?])
        }
        (Elems::Float(x), Elems::Float(y)) => {
            let v: Vec<f64> = ia
                .iter()
                .zip(&ib)
                .map(|(i, j)| {
                    let (p, q) = (
                        x.get(*i).copied().unwrap_or(0.0),
                        y.get(*j).copied().unwrap_or(0.0),
                    );
                    match op {
                        Arith::Add => p + q,
                        Arith::Sub => p - q,
                        Arith::Mul => p * q,
                        Arith::Div => p / q,
                        Arith::Equal => f64::from(u8::from(p == q)),
                    }
                })
                .collect();
            Ok(vec![from_floats(dtype, dims, &v)?])
        }
        _ => Ok(vec![]),
    }
}

fn fold_where(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let (Some(c), Some(x), Some(y)) = (known(ctx, 0), known(ctx, 1), known(ctx, 2)) else {
        return Ok(vec![]);
    };
    let Some(dims) = broadcast_dims(&[&c.dims, &x.dims, &y.dims]) else {
        return Ok(vec![]);
    };
    if !foldable(&dims) || x.dtype != y.dtype {
        return Ok(vec![]);
    }
    let (ic, ix, iy) = (
        broadcast_index(&dims, &c.dims)?,
        broadcast_index(&dims, &x.dims)?,
        broadcast_index(&dims, &y.dims)?,
    );
    let cond = c.to_i64s();
    let size = x.dtype.size();
    let mut bytes = Vec::with_capacity(ic.len() * size);
    for k in 0..ic.len() {
        let (src, i) = if cond.get(ic[k]).copied().unwrap_or(0) != 0 {
            (x, ix[k])
        } else {
            (y, iy[k])
        };
        let Some(chunk) = src.data.get(i * size..(i + 1) * size) else {
            return Ok(vec![]);
        };
        bytes.extend_from_slice(chunk);
    }
    let t = Tensor::new(x.dtype, dims, bytes).map_err(|e| {
        OpError::input(
            1,
            "a consistent value",
            e,
            "report this as a gearsim bug with the model",
        )
    })?;
    Ok(vec![t])
}
