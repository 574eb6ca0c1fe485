//! The operator library: every supported ONNX operator registers its verify, infer-shape and
//! (for shape computations) fold functions here, once; [`first_opset`] says from which opset on
//! each operator's form is the one implemented (the importer reads opsets 1 to 27).
//!
//! ```text
//!   mod.rs          ─ standard(): the registry; shared attribute, axis, dtype and dim helpers
//!   elementwise.rs  ─ unary math, Clip, Gelu, Add/Sub/Mul/Div/Pow, Equal, Where, Cast, CastLike,
//!                     Identity
//!   nn.rs           ─ Conv, MatMul, Gemm, pooling, normalizations, Softmax
//!   conv_transpose.rs ─ ConvTranspose's geometry (inference, evaluator, lowering)
//!   gather_nd.rs    ─ GatherElements, GatherND by constant indices
//!   reduce.rs       ─ ReduceMean, ReduceSum
//!   resize.rs       ─ Resize: output sizes and per-axis taps, shared by inference, evaluator, lowering
//!   shape.rs        ─ Shape, Reshape, Flatten, Transpose, Concat, Slice, Gather, Squeeze,
//!                     Unsqueeze, Expand, Constant
//!   values.rs       ─ compile-time tensor values for folding (exact dtypes, broadcasting)
//! ```
//!
//! Conventions every operator follows:
//! - `verify` parses and checks everything (attributes, input types, ranks, compatible dims);
//!   `infer` reuses the same parsing, so it never relies on `verify` having run.
//! - A symbolic dim passes through wherever the result is a sum, product or exact quotient of
//!   dims; where it is not (a floor division by a stride, a clamp that depends on the value),
//!   `infer` fails with an error that says so instead of guessing.
//! - `fold` returns an empty list when the values cannot be computed (an input value is not
//!   known, or the result would be too large to hold at compile time), so it may be called
//!   whether or not every input value is known; `Shape` needs only its input's descriptor.

mod conv_transpose;
mod elementwise;
mod gather_nd;
mod nn;
mod reduce;
mod resize;
mod shape;
mod values;

pub use conv_transpose::ConvTransposeGeometry;
pub use elementwise::{activation_attrs, aicpu_elementwise, cast_mode};
pub use gather_nd::{GatherMap, gather_map, take_rows};
pub use nn::group_norm_parse;
pub use resize::{AxisPass, ResizeMode, ResizeSpec, resize_values};
pub use shape::{constant_of_shape_value, range_tensor, trilu_keeps, trilu_tensor};

use super::infer::{OpCtx, OpError, Registry};
use super::ir::{Attr, DataType, Tensor, TensorDesc, shape_values};
use super::symbolic::Dim;

/// ONNX's `SAME_UPPER` / `SAME_LOWER` padding of a sliding window's axis: the total that makes
/// `out` windows of `extent` at `stride` cover `input`, split in two with the odd one at the
/// end (UPPER) or at the start (LOWER); returns (begin, end).
pub fn same_pads(upper: bool, input: i64, out: i64, stride: i64, extent: i64) -> (i64, i64) {
    let total = ((out.max(1) - 1) * stride + extent - input).max(0);
    let small = total / 2;
    if upper {
        (small, total - small)
    } else {
        (total - small, small)
    }
}

/// The registry of every supported operator.
pub fn standard() -> Registry {
    let mut r = Registry::default();
    for def in elementwise::defs()
        .into_iter()
        .chain(nn::defs())
        .chain(conv_transpose::defs())
        .chain(gather_nd::defs())
        .chain(reduce::defs())
        .chain(resize::defs())
        .chain(shape::defs())
    {
        let since = first_opset(def.op);
        r.register_since(def, since);
    }
    r
}

/// The first opset whose form of `op` the compiler implements: the operator's semantics have
/// not changed since (later versions only add types, or attributes whose defaults keep the old
/// behaviour). A model of an older opset using `op` is refused as unsupported.
fn first_opset(op: &str) -> i64 {
    match op {
        "Not" | "Conv" | "Constant" | "Flatten" | "Gather" | "GlobalAveragePool" | "Identity"
        | "MatMul" | "ReduceMax" | "ReduceMean" | "ReduceMin" | "Shape" | "Size" | "Softplus"
        | "Softsign" | "Squeeze" | "Transpose" | "Unsqueeze" => 1,
        "Concat" => 4,
        "Reshape" => 5,
        "Abs"
        | "Cast"
        | "Ceil"
        | "Elu"
        | "Exp"
        | "Floor"
        | "HardSigmoid"
        | "InstanceNormalization"
        | "LeakyRelu"
        | "Log"
        | "Neg"
        | "Reciprocal"
        | "Relu"
        | "Selu"
        | "Sigmoid"
        | "Sqrt"
        | "Tanh" => 6,
        // Its opset-18 form (Scale and B per group) is deprecated; 21 has them per channel.
        "GroupNormalization" => 21,
        "Add" | "And" | "Div" | "Equal" | "Gemm" | "Greater" | "Less" | "Mul" | "Or" | "Pow"
        | "Sub" | "Xor" => 7,
        "Expand" | "Max" | "MaxPool" | "Mean" | "Min" | "Sum" => 8,
        "BatchNormalization" | "ConstantOfShape" | "Erf" | "IsNaN" | "PRelu" | "Sign" | "Where" => {
            9
        }
        "IsInf" | "MatMulInteger" | "Mod" | "Slice" | "ThresholdedRelu" => 10,
        "AveragePool" | "Clip" | "ConvTranspose" => 11,
        "Range" | "Resize" | "Round" => 11,
        "CastLike" => 15,
        "Celu" | "GreaterOrEqual" | "GatherND" | "LessOrEqual" => 12,
        "GatherElements" => 11,
        "Trilu" => 14,
        // Ops that do not exist before opset 13 or that changed at 13 (Softmax's axis, the
        // axes and split inputs of ReduceSum and Split) keep the importer's old floor; so do
        // HardSwish (14), LayerNormalization (17) and Gelu (20), which exporters emit at lower
        // opsets with the semantics of their first version.
        _ => 13,
    }
}

/// Operators GE inserts itself (no ONNX model names them): registered for inference, left out
/// of the ONNX operator lists.
pub const GE_INSERTED: &[&str] = &[crate::aipp::OP];

/// The registry's ONNX operators, sorted.
pub fn onnx_ops(r: &Registry) -> Vec<&'static str> {
    r.ops()
        .into_iter()
        .filter(|op| !GE_INSERTED.contains(op))
        .collect()
}

/// Where a bad value came from, so one helper can blame an attribute or an input.
#[derive(Clone, Copy, Debug)]
enum Src<'a> {
    /// A named attribute.
    Attr(&'a str),
    /// An input by index.
    Input(usize),
}

impl Src<'_> {
    /// An error about this source.
    fn err(self, expected: impl Into<String>, got: impl Into<String>, fix: &str) -> OpError {
        match self {
            Src::Attr(name) => OpError::attr(name, expected, got, fix),
            Src::Input(i) => OpError::input(i, expected, got, fix),
        }
    }
}

/// An error about an output of the node.
fn output_err(o: usize, expected: impl Into<String>, got: impl Into<String>, fix: &str) -> OpError {
    OpError {
        input: None,
        output: Some(o),
        attr: None,
        expected: expected.into(),
        got: got.into(),
        fix: fix.to_string(),
    }
}

/// An error that concerns the node as a whole.
fn node_err(expected: impl Into<String>, got: impl Into<String>, fix: &str) -> OpError {
    OpError {
        input: None,
        output: None,
        attr: None,
        expected: expected.into(),
        got: got.into(),
        fix: fix.to_string(),
    }
}

/// A shape as text, `[N[1..8],3,224]`.
fn shape_str(shape: &[Dim]) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", dims.join(","))
}

/// What kind of attribute value this is, for messages.
fn attr_kind(a: &Attr) -> String {
    match a {
        Attr::Int(v) => format!("the integer {v}"),
        Attr::Float(v) => format!("the float {v}"),
        Attr::Str(s) => format!("the string {s:?}"),
        Attr::Ints(v) => format!("the integer list {v:?}"),
        Attr::Floats(v) => format!("the float list {v:?}"),
        Attr::Strs(v) => format!("the string list {v:?}"),
        Attr::Tensor(t) => format!("the tensor {}", t.summary()),
        Attr::Bool(b) => format!("the flag {b}"),
    }
}

/// The fix for an attribute of the wrong kind.
const FIX_ATTR_KIND: &str =
    "re-export the model; the ONNX operator definition gives this attribute another type";

/// Integer attribute with a default (a flag counts as 0 or 1).
fn attr_int(ctx: &OpCtx<'_>, name: &str, default: i64) -> Result<i64, OpError> {
    match ctx.node.attr(name) {
        None => Ok(default),
        Some(Attr::Int(v)) => Ok(*v),
        Some(Attr::Bool(b)) => Ok(i64::from(*b)),
        Some(other) => Err(OpError::attr(
            name,
            "an integer",
            attr_kind(other),
            FIX_ATTR_KIND,
        )),
    }
}

/// A 0/1 integer attribute.
fn attr_flag(ctx: &OpCtx<'_>, name: &str, default: bool) -> Result<bool, OpError> {
    match attr_int(ctx, name, i64::from(default))? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(OpError::attr(
            name,
            "0 or 1",
            v.to_string(),
            "set the attribute to 0 or 1",
        )),
    }
}

/// Integer-list attribute, `None` when absent.
fn attr_ints(ctx: &OpCtx<'_>, name: &str) -> Result<Option<Vec<i64>>, OpError> {
    match ctx.node.attr(name) {
        None => Ok(None),
        Some(Attr::Ints(v)) => Ok(Some(v.clone())),
        Some(other) => Err(OpError::attr(
            name,
            "a list of integers",
            attr_kind(other),
            FIX_ATTR_KIND,
        )),
    }
}

/// Finite float attribute with a default.
fn attr_float(ctx: &OpCtx<'_>, name: &str, default: f32) -> Result<f32, OpError> {
    let v = match ctx.node.attr(name) {
        None => default,
        Some(Attr::Float(v)) => *v,
        Some(other) => {
            return Err(OpError::attr(
                name,
                "a float",
                attr_kind(other),
                FIX_ATTR_KIND,
            ));
        }
    };
    if !v.is_finite() {
        return Err(OpError::attr(
            name,
            "a finite float",
            v.to_string(),
            "set the attribute to a finite value",
        ));
    }
    Ok(v)
}

/// String attribute with a default.
fn attr_str(ctx: &OpCtx<'_>, name: &str, default: &str) -> Result<String, OpError> {
    match ctx.node.attr(name) {
        None => Ok(default.to_string()),
        Some(Attr::Str(s)) => Ok(s.clone()),
        Some(other) => Err(OpError::attr(
            name,
            "a string",
            attr_kind(other),
            FIX_ATTR_KIND,
        )),
    }
}

/// Rejects an attribute that this opset does not define.
fn forbid_attr(ctx: &OpCtx<'_>, name: &str, why: &str) -> Result<(), OpError> {
    match ctx.node.attr(name) {
        None => Ok(()),
        Some(a) => Err(OpError::attr(
            name,
            format!("no `{name}` attribute ({why})"),
            attr_kind(a),
            "re-export the model with the exporter's opset, or remove the attribute",
        )),
    }
}

/// An axis in `[-rank, rank - 1]`, made non-negative.
fn norm_axis(src: Src<'_>, axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        let expected = if rank == 0 {
            "no axis at all: the input is a scalar".to_string()
        } else {
            format!("an axis in [-{r}, {}] for rank {r}", r - 1)
        };
        return Err(src.err(
            expected,
            axis.to_string(),
            "count axes from 0 (or from -1 for the last) within the input's rank",
        ));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// A list of distinct axes in `[-rank, rank - 1]`, made non-negative (order kept).
fn norm_axes(src: Src<'_>, axes: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut out: Vec<usize> = Vec::with_capacity(axes.len());
    for a in axes {
        let k = norm_axis(src, *a, rank)?;
        if out.contains(&k) {
            return Err(src.err(
                "distinct axes",
                format!("{axes:?} (axis {k} appears twice)"),
                "list every axis once",
            ));
        }
        out.push(k);
    }
    Ok(out)
}

/// Descriptor of an input that may be absent.
fn opt_input<'a>(ctx: &OpCtx<'a>, i: usize) -> Option<&'a TensorDesc> {
    ctx.inputs.get(i).copied().flatten()
}

/// Value of an input known at compile time, if any, and only if it agrees with the input's
/// descriptor (type, fixed shape, byte count), so folds can index it without further checks.
fn known<'a>(ctx: &OpCtx<'a>, i: usize) -> Option<&'a Tensor> {
    let t = ctx.values.get(i).copied().flatten()?;
    let d = opt_input(ctx, i)?;
    let n = values::count(&t.dims)?;
    let consistent = d.dtype == t.dtype
        && shape_values(&d.shape).is_some_and(|s| s == t.dims)
        && t.data.len() == n * t.dtype.size();
    consistent.then_some(t)
}

/// Input `i`, which must be of one of the `allowed` types.
fn input_of<'a>(
    ctx: &OpCtx<'a>,
    i: usize,
    allowed: &[DataType],
    what: &str,
) -> Result<&'a TensorDesc, OpError> {
    let d = ctx.input(i)?;
    if !allowed.contains(&d.dtype) {
        let names: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
        return Err(OpError::input(
            i,
            format!("{what} ({})", names.join(", ")),
            d.dtype.name(),
            format!(
                "{} is not supported for this input: insert a Cast to a listed type before this \
                 node",
                d.dtype.name()
            ),
        ));
    }
    Ok(d)
}

/// Checks that input `j` has the same type as input `i`.
fn same_dtype(ctx: &OpCtx<'_>, i: usize, j: usize) -> Result<(), OpError> {
    let (a, b) = (ctx.input(i)?, ctx.input(j)?);
    if a.dtype != b.dtype {
        return Err(OpError::input(
            j,
            format!("type {} like input {i}", a.dtype.name()),
            b.dtype.name(),
            "insert a Cast so both inputs have the same type",
        ));
    }
    Ok(())
}

/// Checks the rank of input `i` against `ok`, described as `want`.
fn rank_where<'a>(
    ctx: &OpCtx<'a>,
    i: usize,
    ok: impl Fn(usize) -> bool,
    want: &str,
) -> Result<&'a TensorDesc, OpError> {
    let d = ctx.input(i)?;
    if !ok(d.shape.len()) {
        return Err(OpError::input(
            i,
            want,
            format!("rank {} ({d})", d.shape.len()),
            "check the exported model: this input has the wrong number of dims",
        ));
    }
    Ok(d)
}

/// Float types.
const FLOATS: &[DataType] = &[DataType::F16, DataType::F32, DataType::F64];
/// Index types (Gather indices, Slice starts).
const INDEX: &[DataType] = &[DataType::I32, DataType::I64];
/// The numeric types arithmetic accepts (bfloat16, float8 and the sub-byte types only
/// convert).
const NUMERIC: &[DataType] = &[
    DataType::F16,
    DataType::F32,
    DataType::F64,
    DataType::I8,
    DataType::I16,
    DataType::I32,
    DataType::I64,
    DataType::U8,
    DataType::U16,
    DataType::U32,
    DataType::U64,
];

/// The integers of a 0-D or 1-D integer input whose value must be known at compile time, or
/// `None` when the input is absent.
fn const_ints(
    ctx: &OpCtx<'_>,
    i: usize,
    what: &str,
    allowed: &[DataType],
) -> Result<Option<Vec<i64>>, OpError> {
    let Some(d) = opt_input(ctx, i) else {
        return Ok(None);
    };
    input_of(ctx, i, allowed, &format!("{what} as integers"))?;
    if d.shape.len() > 1 {
        return Err(OpError::input(
            i,
            format!("{what} as a 1-D tensor"),
            format!("rank {} ({d})", d.shape.len()),
            "give this input a single dimension",
        ));
    }
    let Some(t) = known(ctx, i) else {
        return Err(OpError::input(
            i,
            format!("{what} known at compile time"),
            "a value computed at run time",
            "feed it from an initializer or from a shape computation on static shapes (inside a \
             gear branch every shape is static)",
        ));
    };
    Ok(Some(t.to_i64s()))
}

/// `a * b`, or `None` if it could overflow.
fn dim_mul(a: &Dim, b: &Dim) -> Option<Dim> {
    if let (Dim::Fixed(x), Dim::Fixed(y)) = (a, b) {
        return x.checked_mul(*y).map(Dim::Fixed);
    }
    let (alo, ahi) = a.interval();
    let (blo, bhi) = b.interval();
    for x in [alo, ahi] {
        for y in [blo, bhi] {
            x.checked_mul(y)?;
        }
    }
    Some(a.mul(b))
}

/// `a + b`, or `None` if it could overflow.
fn dim_add(a: &Dim, b: &Dim) -> Option<Dim> {
    if let (Dim::Fixed(x), Dim::Fixed(y)) = (a, b) {
        return x.checked_add(*y).map(Dim::Fixed);
    }
    let (alo, ahi) = a.interval();
    let (blo, bhi) = b.interval();
    alo.checked_add(blo)?;
    ahi.checked_add(bhi)?;
    Some(a.add(b))
}

/// Product of dims, or `None` if it could overflow.
fn dim_prod(dims: &[Dim]) -> Option<Dim> {
    dims.iter()
        .try_fold(Dim::Fixed(1), |acc, d| dim_mul(&acc, d))
}

/// The error for a dim computation that overflows.
fn overflow_err(what: &str) -> OpError {
    node_err(
        format!("{what} to fit in 64 bits"),
        "an overflow",
        "check the model's sizes: they are far beyond any real tensor",
    )
}

/// How many outputs the node declares (at least one), capped at `max`.
fn declared_outputs(ctx: &OpCtx<'_>, max: usize) -> Result<usize, OpError> {
    let n = ctx.node.outputs.len().max(1);
    if n > max {
        return Err(output_err(
            max,
            format!("at most {max} outputs"),
            n.to_string(),
            "check the model's node against the ONNX operator definition",
        ));
    }
    Ok(n)
}

/// Axes that are input `i` from opset `since` on and the `axes` attribute before (Squeeze,
/// Unsqueeze and ReduceSum moved them in 13, ReduceMean in 18), with where they came from.
fn axes_param(
    ctx: &OpCtx<'_>,
    i: usize,
    since: i64,
) -> Result<Option<(Vec<i64>, Src<'static>)>, OpError> {
    if ctx.opset >= since {
        forbid_attr(
            ctx,
            "axes",
            &format!("since opset {since} the axes are input {i}"),
        )?;
        Ok(const_ints(ctx, i, "the axes", &[DataType::I64])?.map(|v| (v, Src::Input(i))))
    } else {
        if opt_input(ctx, i).is_some() {
            return Err(OpError::input(
                i,
                format!(
                    "no axes input at opset {} (before opset {since} the axes are an attribute)",
                    ctx.opset
                ),
                "an axes input",
                "move the axes into the `axes` attribute, or declare the model's opset correctly",
            ));
        }
        Ok(attr_ints(ctx, "axes")?.map(|v| (v, Src::Attr("axes"))))
    }
}
