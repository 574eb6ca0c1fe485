//! Shape operators: Shape, Size, ConstantOfShape, Range, Trilu, Reshape, Flatten, Transpose, Concat, Slice,
//! Gather, Squeeze, Unsqueeze, Expand and Constant. They carry symbolic dims through (products for Flatten and
//! Reshape, exact quotients for Reshape's -1, sums for Concat, provable clamps for Slice) and
//! all but Transpose fold, so PyTorch's `Shape -> Gather -> Unsqueeze -> Concat -> Reshape`
//! chains become constants once shapes are static.

use super::super::infer::{OpCtx, OpDef, OpError, broadcast};
use super::super::ir::{Attr, DataType, Node, Tensor, TensorDesc, fixed_shape, shape_values};
use super::super::symbolic::Dim;
use super::values::{affine_index, broadcast_index, count, foldable, gather, strides};
use super::{
    INDEX, Src, attr_flag, attr_int, attr_ints, attr_kind, axes_param, const_ints, dim_add,
    dim_prod, forbid_attr, input_of, known, node_err, norm_axes, norm_axis, opt_input,
    overflow_err, rank_where, same_dtype, shape_str,
};

/// The shape operator definitions.
pub(super) fn defs() -> Vec<OpDef> {
    let def = |op, min_inputs, max_inputs, verify, infer, fold, static_inputs| OpDef {
        op,
        min_inputs,
        max_inputs,
        verify,
        infer,
        fold,
        static_inputs,
    };
    vec![
        def(
            "ConstantOfShape",
            1,
            1,
            verify_constant_of_shape,
            infer_constant_of_shape,
            Some(fold_constant_of_shape),
            &[0],
        ),
        def("Size", 1, 1, verify_size, infer_size, Some(fold_size), &[]),
        def(
            "Range",
            3,
            3,
            verify_range,
            infer_range,
            Some(fold_range),
            &[0, 1, 2],
        ),
        def(
            "Trilu",
            1,
            2,
            verify_trilu,
            infer_trilu,
            Some(fold_trilu),
            &[1],
        ),
        def(
            "Shape",
            1,
            1,
            verify_shape,
            infer_shape,
            Some(fold_shape),
            &[],
        ),
        def(
            "Reshape",
            2,
            2,
            verify_reshape,
            infer_reshape,
            Some(fold_reshape),
            &[1],
        ),
        def(
            "Flatten",
            1,
            1,
            verify_flatten,
            infer_flatten,
            Some(fold_flatten),
            &[],
        ),
        def(
            "Transpose",
            1,
            1,
            verify_transpose,
            infer_transpose,
            None,
            &[],
        ),
        def(
            "Concat",
            1,
            usize::MAX,
            verify_concat,
            infer_concat,
            Some(fold_concat),
            &[],
        ),
        def(
            "Split",
            1,
            2,
            verify_split,
            infer_split,
            Some(fold_split),
            &[1],
        ),
        def(
            "Slice",
            3,
            5,
            verify_slice,
            infer_slice,
            Some(fold_slice),
            &[1, 2, 3, 4],
        ),
        def(
            "Gather",
            2,
            2,
            verify_gather,
            infer_gather,
            Some(fold_gather),
            &[],
        ),
        def(
            "Squeeze",
            1,
            2,
            verify_squeeze,
            infer_squeeze,
            Some(fold_squeeze),
            &[1],
        ),
        def(
            "Unsqueeze",
            1,
            2,
            verify_unsqueeze,
            infer_unsqueeze,
            Some(fold_unsqueeze),
            &[1],
        ),
        def(
            "Expand",
            2,
            2,
            verify_expand,
            infer_expand,
            Some(fold_expand),
            &[1],
        ),
        def(
            "Constant",
            0,
            0,
            verify_constant,
            infer_constant,
            Some(fold_constant),
            &[],
        ),
    ]
}

/// Input 0 with its shape changed, sharing the data: the fold of every op that only relabels
/// dims. Nothing when input 0's value is unknown.
fn fold_relabel(
    ctx: &OpCtx<'_>,
    infer: fn(&OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError>,
) -> Result<Vec<Tensor>, OpError> {
    let Some(t) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    let out = infer(ctx)?;
    let Some(dims) = out.first().and_then(|d| shape_values(&d.shape)) else {
        return Ok(vec![]);
    };
    if count(&dims) != Some(t.len()) {
        return Ok(vec![]);
    }
    Ok(vec![Tensor {
        dtype: t.dtype,
        dims,
        data: t.data.clone(),
    }])
}

/// ConstantOfShape's fill value: the one-element `value` tensor, f32 0 when absent.
pub fn constant_of_shape_value(node: &Node) -> Result<Tensor, OpError> {
    match node.attr("value") {
        None => Ok(Tensor::from_f32s(vec![1], &[0.0])),
        Some(Attr::Tensor(t)) if t.dims.iter().product::<i64>() == 1 => Ok(t.clone()),
        Some(other) => Err(OpError::attr(
            "value",
            "a one-element tensor",
            format!("{other:?}"),
            "give ConstantOfShape a one-element `value` tensor, or none for float 0",
        )),
    }
}

/// The output dims of ConstantOfShape: its 1-D int64 input, known at compile time.
fn constant_of_shape_dims(ctx: &OpCtx<'_>) -> Result<Vec<i64>, OpError> {
    let dims = const_ints(ctx, 0, "the output shape", &[DataType::I64])?
        .ok_or_else(|| OpError::input(0, "the output shape", "nothing", "connect input 0"))?;
    if let Some(d) = dims.iter().find(|d| **d < 0) {
        return Err(OpError::input(
            0,
            "dims of at least 0",
            d.to_string(),
            "the output shape cannot have a negative dim",
        ));
    }
    Ok(dims)
}

fn verify_constant_of_shape(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    constant_of_shape_value(ctx.node)?;
    constant_of_shape_dims(ctx).map(|_| ())
}

fn infer_constant_of_shape(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let dims = constant_of_shape_dims(ctx)?;
    Ok(vec![TensorDesc::new(
        constant_of_shape_value(ctx.node)?.dtype,
        dims.into_iter().map(Dim::Fixed).collect(),
    )])
}

/// The filled tensor (up to the fold limit; a larger one is a kernel's work).
fn fold_constant_of_shape(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let dims = constant_of_shape_dims(ctx)?;
    if !foldable(&dims) {
        return Ok(vec![]);
    }
    let v = constant_of_shape_value(ctx.node)?;
    let n = count(&dims).unwrap_or(0);
    Ok(vec![Tensor {
        dtype: v.dtype,
        dims,
        data: v.data.repeat(n).into(),
    }])
}

/// Range's start, limit and delta: scalars of one numeric type, known at compile time (the
/// output's length depends on them), as f64 (exact for the integer types' usual ranges).
fn range_params(ctx: &OpCtx<'_>) -> Result<(DataType, [f64; 3]), OpError> {
    let allowed = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::I16,
        DataType::I32,
        DataType::I64,
    ];
    let mut v = [0f64; 3];
    let dtype = input_of(ctx, 0, &allowed, "a numeric scalar")?.dtype;
    for (i, slot) in v.iter_mut().enumerate() {
        same_dtype(ctx, 0, i)?;
        let t = known(ctx, i).ok_or_else(|| {
            OpError::input(
                i,
                "a value known at compile time (the output length depends on it)",
                "a value computed at run time",
                "feed Range from constants or from shapes (static inside a gear branch)",
            )
        })?;
        if t.dims.iter().product::<i64>() != 1 {
            return Err(OpError::input(
                i,
                "a scalar",
                format!("dims {:?}", t.dims),
                "give Range scalars",
            ));
        }
        *slot = t.to_f64s()[0];
    }
    if v[2] == 0.0 {
        return Err(OpError::input(
            2,
            "a non-zero delta",
            "0",
            "a zero step never reaches the limit",
        ));
    }
    Ok((dtype, v))
}

/// ONNX's `max(ceil((limit - start) / delta), 0)`.
fn range_len(v: [f64; 3]) -> i64 {
    ((v[1] - v[0]) / v[2]).ceil().max(0.0) as i64
}

fn verify_range(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    range_params(ctx).map(|_| ())
}

fn infer_range(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (dtype, v) = range_params(ctx)?;
    Ok(vec![TensorDesc::new(dtype, vec![Dim::Fixed(range_len(v))])])
}

/// Range's values, `start + i * delta` computed in the type as ONNX's loop does (by repeated
/// addition for floats, so the rounding matches the reference).
fn fold_range(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let (dtype, v) = range_params(ctx)?;
    if !foldable(&[range_len(v)]) {
        return Ok(vec![]);
    }
    Ok(vec![range_tensor(dtype, v)?])
}

/// The Range of `[start, limit, delta]` in `dtype`: for floats by repeated addition in the
/// type, as ONNX's reference loop does; for integers `start + i * delta`.
pub fn range_tensor(dtype: DataType, v: [f64; 3]) -> Result<Tensor, OpError> {
    let n = range_len(v);
    if dtype.is_float() {
        let mut out = Vec::with_capacity(n as usize);
        let mut x = v[0];
        for _ in 0..n {
            out.push(x);
            x = if dtype == DataType::F64 {
                x + v[2]
            } else {
                f64::from((x + v[2]) as f32)
            };
        }
        super::values::from_floats(dtype, vec![n], &out)
    } else {
        let (s, d) = (v[0] as i64, v[2] as i64);
        let out: Vec<i64> = (0..n).map(|i| s + i * d).collect();
        super::values::from_ints(dtype, vec![n], &out)
    }
}

/// Trilu's diagonal offset `k` (input 1, a scalar known at compile time; 0 when absent).
fn trilu_k(ctx: &OpCtx<'_>) -> Result<i64, OpError> {
    Ok(
        match const_ints(ctx, 1, "the diagonal offset k", &[DataType::I64])? {
            Some(v) if v.len() == 1 => v[0],
            Some(v) => {
                return Err(OpError::input(
                    1,
                    "one value",
                    format!("{} values", v.len()),
                    "give k as a scalar",
                ));
            }
            None => 0,
        },
    )
}

fn verify_trilu(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    rank_where(ctx, 0, |r| r >= 2, "a tensor of rank 2 or more")?;
    attr_flag(ctx, "upper", true)?;
    trilu_k(ctx).map(|_| ())
}

fn infer_trilu(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    Ok(vec![ctx.input(0)?.clone()])
}

/// Whether Trilu keeps element (row `i`, column `j`): `j - i >= k` for the upper triangle,
/// `j - i <= k` for the lower.
pub fn trilu_keeps(upper: bool, k: i64, i: i64, j: i64) -> bool {
    if upper { j - i >= k } else { j - i <= k }
}

/// Trilu on a known input (a causal mask built from ones).
fn fold_trilu(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some(x) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    if !foldable(&x.dims) {
        return Ok(vec![]);
    }
    Ok(vec![trilu_tensor(
        x,
        attr_flag(ctx, "upper", true)?,
        trilu_k(ctx)?,
    )])
}

/// Trilu of `x` (rank 2 or more): the kept elements' bytes, zeros elsewhere.
pub fn trilu_tensor(x: &Tensor, upper: bool, k: i64) -> Tensor {
    let r = x.dims.len();
    let (rows, cols) = (x.dims[r - 2].max(1), x.dims[r - 1].max(1));
    let e = x.dtype.size();
    let mut data = x.data.to_vec();
    for (n, chunk) in data.chunks_mut(e).enumerate() {
        let n = n as i64;
        if !trilu_keeps(upper, k, (n / cols) % rows, n % cols) {
            chunk.fill(0);
        }
    }
    Tensor {
        dtype: x.dtype,
        dims: x.dims.clone(),
        data: data.into(),
    }
}

fn verify_size(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    ctx.input(0).map(|_| ())
}

fn infer_size(_ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    Ok(vec![TensorDesc::new(DataType::I64, vec![])])
}

/// The element count, whenever the input's dims are fixed.
fn fold_size(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    Ok(match shape_values(&ctx.input(0)?.shape) {
        Some(v) => vec![Tensor::from_i64s(vec![], &[v.iter().product()])],
        None => vec![],
    })
}

/// The dims Shape reports: `[start, end)` after ONNX's clamping (opset 15 and later).
fn shape_range(ctx: &OpCtx<'_>) -> Result<(usize, usize), OpError> {
    let r = ctx.input(0)?.shape.len() as i64;
    if ctx.opset < 15 {
        for name in ["start", "end"] {
            forbid_attr(ctx, name, "Shape takes start and end from opset 15 on")?;
        }
    }
    let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
    let start = clamp(attr_int(ctx, "start", 0)?);
    let end = clamp(attr_int(ctx, "end", r)?);
    Ok((start, end.max(start)))
}

fn verify_shape(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    shape_range(ctx).map(|_| ())
}

fn infer_shape(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (s, e) = shape_range(ctx)?;
    Ok(vec![TensorDesc::new(
        DataType::I64,
        vec![Dim::Fixed((e - s) as i64)],
    )])
}

/// Needs only the input's descriptor: folds whenever the reported dims are fixed.
fn fold_shape(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let (s, e) = shape_range(ctx)?;
    let x = ctx.input(0)?;
    Ok(match shape_values(&x.shape[s..e]) {
        Some(v) => vec![Tensor::from_i64s(vec![v.len() as i64], &v)],
        None => vec![],
    })
}

/// Reshape's output shape: 0 copies the input dim (unless `allowzero`), -1 is the exact
/// quotient of the element counts, symbolic or not.
fn reshape_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    let x = ctx.input(0)?;
    rank_where(ctx, 1, |r| r == 1, "a 1-D shape tensor")?;
    let Some(target) = const_ints(ctx, 1, "the target shape", &[DataType::I64])? else {
        return Err(OpError::input(
            1,
            "the target shape",
            "nothing",
            "connect Reshape's shape input",
        ));
    };
    let allowzero = ctx.opset >= 14 && attr_flag(ctx, "allowzero", false)?;
    let mut out = Vec::with_capacity(target.len());
    let mut minus_one = None;
    for (k, v) in target.iter().enumerate() {
        let d = match *v {
            -1 => {
                if let Some(first) = minus_one {
                    return Err(OpError::input(
                        1,
                        "at most one -1 in the target shape",
                        format!("{target:?} (-1 at positions {first} and {k})"),
                        "give every dim but one explicitly",
                    ));
                }
                minus_one = Some(k);
                Dim::Fixed(1)
            }
            0 if !allowzero => x.shape.get(k).cloned().ok_or_else(|| {
                OpError::input(
                    1,
                    format!(
                        "0 (copy the input dim) only at positions below the input rank {}",
                        x.shape.len()
                    ),
                    format!("{target:?} (0 at position {k})"),
                    "write the size explicitly, or set allowzero=1 for a real zero-size dim",
                )
            })?,
            v if v < -1 => {
                return Err(OpError::input(
                    1,
                    "dims >= -1 in the target shape",
                    format!("{target:?}"),
                    "use -1 for the one inferred dim and sizes >= 0 elsewhere",
                ));
            }
            v => Dim::Fixed(v),
        };
        out.push(d);
    }
    if allowzero && minus_one.is_some() && target.contains(&0) {
        return Err(OpError::input(
            1,
            "no -1 together with a 0 when allowzero=1",
            format!("{target:?}"),
            "the -1 cannot be inferred from a zero-size shape; write it explicitly",
        ));
    }
    let total = dim_prod(&x.shape).ok_or_else(|| overflow_err("the input element count"))?;
    let rest = dim_prod(&out).ok_or_else(|| overflow_err("the target element count"))?;
    match minus_one {
        Some(k) => {
            if rest == Dim::Fixed(0) {
                return Err(OpError::input(
                    1,
                    "the dims other than -1 to have a non-zero product",
                    format!("{target:?}"),
                    "the -1 is ambiguous next to a zero-size dim; write it explicitly",
                ));
            }
            let q = total.div_exact(&rest).ok_or_else(|| {
                let got = if total.fixed().is_some() && rest.fixed().is_some() {
                    format!("{total} elements, which {rest} does not divide")
                } else {
                    format!(
                        "{total} elements divided by {rest}, which is not an exact dim expression"
                    )
                };
                OpError::input(
                    1,
                    format!(
                        "a target shape {target:?} whose -1 divides the input {} exactly",
                        shape_str(&x.shape)
                    ),
                    got,
                    "fix the target shape; with symbolic dims, keep the symbolic factors in \
                     the -1 (or compile with fixed shapes per gear)",
                )
            })?;
            out[k] = q;
        }
        None if rest != total => {
            return Err(OpError::input(
                1,
                format!(
                    "a target shape with as many elements as the input {} ({total})",
                    shape_str(&x.shape)
                ),
                format!("{target:?} ({rest} elements)"),
                "fix the target shape so the element counts match (use -1 for one dim)",
            ));
        }
        None => {}
    }
    Ok(out)
}

fn verify_reshape(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    reshape_shape(ctx).map(|_| ())
}

fn infer_reshape(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(x.dtype, reshape_shape(ctx)?)])
}

fn fold_reshape(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_relabel(ctx, infer_reshape)
}

/// Flatten's `[prod(dims before axis), prod(dims from axis)]`.
fn flatten_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    let x = ctx.input(0)?;
    let r = x.shape.len() as i64;
    let axis = attr_int(ctx, "axis", 1)?;
    if axis < -r || axis > r {
        return Err(OpError::attr(
            "axis",
            format!("an axis in [-{r}, {r}]"),
            axis.to_string(),
            "choose where to split the dims, counting from 0",
        ));
    }
    let a = if axis < 0 { axis + r } else { axis } as usize;
    let outer = dim_prod(&x.shape[..a]).ok_or_else(|| overflow_err("the outer size"))?;
    let inner = dim_prod(&x.shape[a..]).ok_or_else(|| overflow_err("the inner size"))?;
    Ok(vec![outer, inner])
}

fn verify_flatten(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    flatten_shape(ctx).map(|_| ())
}

fn infer_flatten(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(x.dtype, flatten_shape(ctx)?)])
}

fn fold_flatten(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_relabel(ctx, infer_flatten)
}

/// Transpose's permutation (reversed dims by default), checked.
fn transpose_perm(ctx: &OpCtx<'_>) -> Result<Vec<usize>, OpError> {
    let r = ctx.input(0)?.shape.len();
    let Some(perm) = attr_ints(ctx, "perm")? else {
        return Ok((0..r).rev().collect());
    };
    let mut seen = vec![false; r];
    let mut out = Vec::with_capacity(r);
    for p in &perm {
        match usize::try_from(*p).ok().filter(|k| *k < r) {
            Some(k) if !seen[k] && perm.len() == r => {
                seen[k] = true;
                out.push(k);
            }
            _ => {
                return Err(OpError::attr(
                    "perm",
                    format!("a permutation of 0..{r} (each input axis once)"),
                    format!("{perm:?}"),
                    "list every axis of the input exactly once",
                ));
            }
        }
    }
    if out.len() != r {
        return Err(OpError::attr(
            "perm",
            format!("a permutation of 0..{r} (each input axis once)"),
            format!("{perm:?}"),
            "list every axis of the input exactly once",
        ));
    }
    Ok(out)
}

fn verify_transpose(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    transpose_perm(ctx).map(|_| ())
}

fn infer_transpose(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    let perm = transpose_perm(ctx)?;
    Ok(vec![TensorDesc::new(
        x.dtype,
        perm.iter().map(|k| x.shape[*k].clone()).collect(),
    )])
}

/// Concat's axis and output shape (the axis dim is the sum of the inputs', symbolic or not).
fn concat_shape(ctx: &OpCtx<'_>) -> Result<(usize, Vec<Dim>), OpError> {
    let first = ctx.input(0)?;
    let r = first.shape.len();
    if ctx.node.attr("axis").is_none() {
        return Err(OpError::attr(
            "axis",
            "the axis to concatenate along",
            "nothing",
            "set Concat's axis (it has no default)",
        ));
    }
    if r == 0 {
        return Err(OpError::input(
            0,
            "rank 1 or more",
            "a scalar",
            "Unsqueeze scalars before concatenating them",
        ));
    }
    let axis = norm_axis(Src::Attr("axis"), attr_int(ctx, "axis", 0)?, r)?;
    let mut out = first.shape.clone();
    for i in 1..ctx.inputs.len() {
        same_dtype(ctx, 0, i)?;
        let d = ctx.input(i)?;
        if d.shape.len() != r {
            return Err(OpError::input(
                i,
                format!("rank {r} like input 0 ({})", shape_str(&first.shape)),
                format!("rank {} ({})", d.shape.len(), shape_str(&d.shape)),
                "give every Concat input the same rank",
            ));
        }
        for (k, (a, b)) in first.shape.iter().zip(&d.shape).enumerate() {
            if k != axis && a != b {
                return Err(OpError::input(
                    i,
                    format!(
                        "dim {k} = {a} like input 0 (all dims but the concat axis {axis} must \
                         match)"
                    ),
                    format!("{b} (input {i} is {})", shape_str(&d.shape)),
                    "make the non-axis dims equal, or concatenate along another axis",
                ));
            }
        }
        out[axis] = dim_add(&out[axis], &d.shape[axis])
            .ok_or_else(|| overflow_err("the concatenated size"))?;
    }
    Ok((axis, out))
}

fn verify_concat(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    concat_shape(ctx).map(|_| ())
}

fn infer_concat(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (_, shape) = concat_shape(ctx)?;
    Ok(vec![TensorDesc::new(ctx.input(0)?.dtype, shape)])
}

fn fold_concat(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some(ts) = (0..ctx.inputs.len())
        .map(|i| known(ctx, i))
        .collect::<Option<Vec<&Tensor>>>()
    else {
        return Ok(vec![]);
    };
    let (axis, shape) = concat_shape(ctx)?;
    let Some(dims) = shape_values(&shape) else {
        return Ok(vec![]);
    };
    let Some(first) = ts.first() else {
        return Ok(vec![]);
    };
    if !foldable(&dims) {
        return Ok(vec![]);
    }
    let outer = count(&dims[..axis]).unwrap_or(0);
    let size = first.dtype.size();
    let mut bytes = Vec::with_capacity(count(&dims).unwrap_or(0) * size);
    for o in 0..outer {
        for t in &ts {
            let block = count(t.dims.get(axis..).unwrap_or(&[])).unwrap_or(0) * size;
            match t.data.get(o * block..(o + 1) * block) {
                Some(chunk) => bytes.extend_from_slice(chunk),
                None => return Ok(vec![]),
            }
        }
    }
    let t = Tensor::new(first.dtype, dims, bytes).map_err(|e| {
        node_err(
            "a consistent folded value",
            e,
            "report this as a gearsim bug with the model",
        )
    })?;
    Ok(vec![t])
}

/// One sliced axis: its start (fixed when the dim is) and step.
struct SliceAxis {
    /// The axis.
    axis: usize,
    /// First index read, when the dim is fixed.
    start: Option<i64>,
    /// Step.
    step: i64,
}

/// `v` (negative counts from the end) clamped to `[lo, d + hi_off]` on a fixed dim.
fn clamp_fixed(v: i64, d: i64, lo: i64, hi_off: i64) -> i64 {
    let raw = if v < 0 { v.saturating_add(d) } else { v };
    raw.max(lo).min(d + hi_off)
}

/// The same on a symbolic dim, when the outcome does not depend on the symbol's value.
fn clamp_sym(v: i64, d: &Dim, lo: i64, hi_off: i64) -> Option<Dim> {
    let (_, dhi) = d.interval();
    let lim = dhi.checked_add(1)?;
    // Beyond the largest possible dim every value clamps the same way, so bounding it keeps
    // the arithmetic small without changing the result.
    let v = v.clamp(-lim, lim);
    let raw = if v < 0 {
        dim_add(d, &Dim::Fixed(v))?
    } else {
        Dim::Fixed(v)
    };
    let upper = dim_add(d, &Dim::Fixed(hi_off))?;
    let above_lo = raw.sub(&Dim::Fixed(lo)).interval();
    let below_hi = upper.sub(&raw).interval();
    if above_lo.0 >= 0 && below_hi.0 >= 0 {
        Some(raw)
    } else if above_lo.1 <= 0 {
        Some(Dim::Fixed(lo))
    } else if below_hi.1 <= 0 {
        Some(upper)
    } else {
        None
    }
}

/// Number of elements a slice of `dim` keeps, and its start when the dim is fixed.
fn slice_len(
    dim: &Dim,
    start: i64,
    end: i64,
    step: i64,
    axis: usize,
) -> Result<(Dim, Option<i64>), OpError> {
    // Per ONNX: for a positive step starts clamp to [0, d] and ends to [0, d]; for a negative
    // step starts clamp to [0, d - 1] and ends to [-1, d - 1].
    let (s_hi, e_lo, e_hi) = if step > 0 { (0, 0, 0) } else { (-1, -1, -1) };
    let mag = i128::from(step).abs();
    if let Dim::Fixed(d) = dim {
        if *d == 0 {
            return Ok((Dim::Fixed(0), Some(0)));
        }
        let s = clamp_fixed(start, *d, 0, s_hi);
        let e = clamp_fixed(end, *d, e_lo, e_hi);
        let diff = if step > 0 {
            i128::from(e) - i128::from(s)
        } else {
            i128::from(s) - i128::from(e)
        };
        let len = if diff > 0 { (diff + mag - 1) / mag } else { 0 };
        let len = i64::try_from(len).map_err(|_| overflow_err("the slice length"))?;
        return Ok((Dim::Fixed(len), Some(s)));
    }
    let cannot = || {
        OpError::input(
            1,
            format!(
                "starts/ends whose clamping on axis {axis} does not depend on the symbolic dim \
                 {dim}"
            ),
            format!("start {start}, end {end}, step {step}"),
            "the slice length would depend on the run-time size; slice with bounds inside the \
             smallest size the dim can take, or compile with fixed shapes per gear",
        )
    };
    let s = clamp_sym(start, dim, 0, s_hi).ok_or_else(cannot)?;
    let e = clamp_sym(end, dim, e_lo, e_hi).ok_or_else(cannot)?;
    let diff = if step > 0 { e.sub(&s) } else { s.sub(&e) };
    let (lo, hi) = diff.interval();
    let len = if hi <= 0 {
        Dim::Fixed(0)
    } else if lo < 0 {
        return Err(cannot());
    } else if mag == 1 {
        diff
    } else {
        diff.div_exact(&Dim::Fixed(step.saturating_abs()))
            .ok_or_else(cannot)?
    };
    Ok((len, None))
}

/// Slice's output shape and per-axis parameters.
fn slice_parse(ctx: &OpCtx<'_>) -> Result<(Vec<Dim>, Vec<SliceAxis>), OpError> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    for i in 2..5 {
        if opt_input(ctx, i).is_some() {
            same_dtype(ctx, 1, i)?;
        }
    }
    let starts = const_ints(ctx, 1, "starts", INDEX)?.unwrap_or_default();
    let ends = const_ints(ctx, 2, "ends", INDEX)?.unwrap_or_default();
    let n = starts.len();
    let axes = const_ints(ctx, 3, "axes", INDEX)?.unwrap_or_else(|| (0..n as i64).collect());
    let steps = const_ints(ctx, 4, "steps", INDEX)?.unwrap_or_else(|| vec![1; n]);
    for (i, len, name) in [
        (2, ends.len(), "ends"),
        (3, axes.len(), "axes"),
        (4, steps.len(), "steps"),
    ] {
        if len != n {
            return Err(OpError::input(
                i,
                format!("{n} {name}, one per start"),
                len.to_string(),
                "give starts, ends, axes and steps the same length",
            ));
        }
    }
    let axes = norm_axes(Src::Input(3), &axes, r)?;
    let mut shape = x.shape.clone();
    let mut params = Vec::with_capacity(n);
    for (k, &axis) in axes.iter().enumerate() {
        let step = steps[k];
        if step == 0 {
            return Err(OpError::input(
                4,
                "non-zero steps",
                format!("{steps:?}"),
                "use a positive step to go forward or a negative one to go backward",
            ));
        }
        let (len, start) = slice_len(&x.shape[axis], starts[k], ends[k], step, axis)?;
        shape[axis] = len;
        params.push(SliceAxis { axis, start, step });
    }
    Ok((shape, params))
}

/// Split's axis and the size of each output along it: input 1 (opset 13 on) or the `split`
/// attribute (before), else equal parts of the axis (opset 18's `num_outputs` makes the last
/// part the remainder).
fn split_sizes(ctx: &OpCtx<'_>) -> Result<(usize, Vec<Dim>), OpError> {
    let x = rank_where(ctx, 0, |r| r >= 1, "rank 1 or more")?;
    let axis = norm_axis(Src::Attr("axis"), attr_int(ctx, "axis", 0)?, x.shape.len())?;
    let n = ctx.node.outputs.len().max(1);
    let sizes = if ctx.opset >= 13 {
        forbid_attr(ctx, "split", "since opset 13 the sizes are input 1")?;
        const_ints(ctx, 1, "the split sizes", &[DataType::I64])?
    } else {
        attr_ints(ctx, "split")?
    };
    if ctx.opset >= 18 {
        if let Some(k) = ctx
            .node
            .attr("num_outputs")
            .map(|_| attr_int(ctx, "num_outputs", 0))
        {
            let k = k?;
            if sizes.is_some() {
                return Err(node_err(
                    "either the split sizes or num_outputs",
                    "both",
                    "give only one of them",
                ));
            }
            if k != n as i64 {
                return Err(node_err(
                    format!("num_outputs equal to the node's {n} outputs"),
                    k.to_string(),
                    "make num_outputs match the outputs",
                ));
            }
        } else if sizes.is_none() {
            return Err(node_err(
                "the split sizes (input 1) or the num_outputs attribute",
                "neither",
                "give the sizes of the parts or their number",
            ));
        }
    } else {
        forbid_attr(ctx, "num_outputs", "num_outputs exists from opset 18 on")?;
    }
    let dim = &x.shape[axis];
    match sizes {
        Some(s) => {
            if s.len() != n {
                return Err(node_err(
                    format!("{n} split sizes (one per output)"),
                    format!("{s:?}"),
                    "give one size per output",
                ));
            }
            if let Some(bad) = s.iter().find(|v| **v < 0) {
                return Err(node_err(
                    "non-negative split sizes",
                    bad.to_string(),
                    "fix the split sizes",
                ));
            }
            let total: i64 = s.iter().sum();
            if let Dim::Fixed(d) = dim
                && *d != total
            {
                return Err(node_err(
                    format!("split sizes summing to dim {axis} ({d})"),
                    format!("{s:?} (sum {total})"),
                    "make the sizes add up to the split axis",
                ));
            }
            Ok((axis, s.into_iter().map(Dim::Fixed).collect()))
        }
        None => {
            let Dim::Fixed(d) = dim else {
                return Err(node_err(
                    format!("a static dim {axis} to split into equal parts"),
                    dim.to_string(),
                    "give the split sizes explicitly",
                ));
            };
            let n = n as i64;
            let chunk = if ctx.opset >= 18 {
                (d + n - 1) / n
            } else if d % n == 0 {
                d / n
            } else {
                return Err(node_err(
                    format!("dim {axis} ({d}) divisible by the {n} outputs"),
                    format!("{d} % {n} = {}", d % n),
                    "give the split sizes explicitly",
                ));
            };
            let sizes = (0..n)
                .map(|k| Dim::Fixed((d - k * chunk).clamp(0, chunk)))
                .collect();
            Ok((axis, sizes))
        }
    }
}

fn verify_split(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    split_sizes(ctx).map(|_| ())
}

fn infer_split(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    let (axis, sizes) = split_sizes(ctx)?;
    Ok(sizes
        .into_iter()
        .map(|d| {
            let mut shape = x.shape.clone();
            shape[axis] = d;
            TensorDesc::new(x.dtype, shape)
        })
        .collect())
}

fn fold_split(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some(t) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    let (axis, sizes) = split_sizes(ctx)?;
    let src = strides(&t.dims);
    let mut out = Vec::with_capacity(sizes.len());
    let mut start = 0i64;
    for d in sizes {
        let Dim::Fixed(len) = d else {
            return Ok(vec![]);
        };
        let mut dims = t.dims.clone();
        dims[axis] = len;
        if !foldable(&dims) {
            return Ok(vec![]);
        }
        let index = affine_index(&dims, start * src[axis], &src)?;
        out.push(gather(t, dims, &index)?);
        start += len;
    }
    Ok(out)
}

fn verify_slice(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    slice_parse(ctx).map(|_| ())
}

fn infer_slice(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (shape, _) = slice_parse(ctx)?;
    Ok(vec![TensorDesc::new(ctx.input(0)?.dtype, shape)])
}

fn fold_slice(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some(t) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    let (shape, params) = slice_parse(ctx)?;
    let Some(dims) = shape_values(&shape) else {
        return Ok(vec![]);
    };
    if !foldable(&dims) {
        return Ok(vec![]);
    }
    let src = strides(&t.dims);
    let mut steps = src.clone();
    let mut base = 0i64;
    for p in &params {
        let Some(start) = p.start else {
            return Ok(vec![]);
        };
        if dims[p.axis] > 0 {
            base += start * src[p.axis];
        }
        steps[p.axis] = p.step.saturating_mul(src[p.axis]);
    }
    let index = affine_index(&dims, base, &steps)?;
    Ok(vec![gather(t, dims, &index)?])
}

/// Gather's axis and output shape: data dims before the axis, the indices' dims, data dims
/// after the axis (all symbolic ones pass through).
fn gather_shape(ctx: &OpCtx<'_>) -> Result<(usize, Vec<Dim>), OpError> {
    let x = rank_where(ctx, 0, |r| r >= 1, "rank 1 or more")?;
    let idx = input_of(ctx, 1, INDEX, "integer indices")?;
    let axis = norm_axis(Src::Attr("axis"), attr_int(ctx, "axis", 0)?, x.shape.len())?;
    if let (Some(t), Dim::Fixed(d)) = (known(ctx, 1), &x.shape[axis])
        && let Some(bad) = t.to_i64s().into_iter().find(|v| *v < -d || v >= d)
    {
        return Err(OpError::input(
            1,
            format!("indices in [-{d}, {}] (dim {axis} of the data)", d - 1),
            bad.to_string(),
            "fix the index: negative indices count from the end",
        ));
    }
    let mut out = x.shape[..axis].to_vec();
    out.extend(idx.shape.iter().cloned());
    out.extend(x.shape[axis + 1..].iter().cloned());
    Ok((axis, out))
}

fn verify_gather(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    gather_shape(ctx).map(|_| ())
}

fn infer_gather(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (_, shape) = gather_shape(ctx)?;
    Ok(vec![TensorDesc::new(ctx.input(0)?.dtype, shape)])
}

fn fold_gather(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let (Some(t), Some(i)) = (known(ctx, 0), known(ctx, 1)) else {
        return Ok(vec![]);
    };
    let (axis, shape) = gather_shape(ctx)?;
    let Some(dims) = shape_values(&shape) else {
        return Ok(vec![]);
    };
    if !foldable(&dims) {
        return Ok(vec![]);
    }
    let d = t.dims.get(axis).copied().unwrap_or(0);
    let outer = count(&t.dims[..axis]).unwrap_or(0);
    let inner = count(&t.dims[axis + 1..]).unwrap_or(0);
    let ids: Vec<usize> = i
        .to_i64s()
        .into_iter()
        .map(|v| (if v < 0 { v + d } else { v }) as usize)
        .collect();
    let du = d as usize;
    let mut index = Vec::with_capacity(outer * ids.len() * inner);
    for o in 0..outer {
        for id in &ids {
            let base = (o * du + id) * inner;
            index.extend(base..base + inner);
        }
    }
    Ok(vec![gather(t, dims, &index)?])
}

/// Squeeze's output: the listed axes removed (each must be a fixed 1), or every dim that is 1
/// when no axes are given (a symbolic dim that may be 1 is refused).
fn squeeze_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    match axes_param(ctx, 1, 13)? {
        Some((v, src)) if !v.is_empty() => {
            let axes = norm_axes(src, &v, r)?;
            for a in &axes {
                let d = &x.shape[*a];
                if *d != Dim::Fixed(1) {
                    let why = if d.fixed().is_some() {
                        "only dims of size 1 can be squeezed"
                    } else {
                        "a symbolic dim is 1 only for some inputs, so squeezing it would change \
                         the rank between gears"
                    };
                    return Err(src.err(
                        format!("axes of size 1 (input is {})", shape_str(&x.shape)),
                        format!("axis {a} of size {d}"),
                        why,
                    ));
                }
            }
            Ok(x.shape
                .iter()
                .enumerate()
                .filter(|(k, _)| !axes.contains(k))
                .map(|(_, d)| d.clone())
                .collect())
        }
        _ => {
            let mut out = Vec::with_capacity(r);
            for (k, d) in x.shape.iter().enumerate() {
                match d {
                    Dim::Fixed(1) => {}
                    Dim::Fixed(_) => out.push(d.clone()),
                    Dim::Sym(_) => {
                        let (lo, hi) = d.interval();
                        if lo <= 1 && 1 <= hi {
                            return Err(OpError::input(
                                0,
                                "dims that are known to be 1 or known not to be 1 (Squeeze \
                                 without axes removes every dim of size 1)",
                                format!("dim {k} = {d}, which may be 1"),
                                "give Squeeze explicit axes",
                            ));
                        }
                        out.push(d.clone());
                    }
                }
            }
            Ok(out)
        }
    }
}

fn verify_squeeze(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    squeeze_shape(ctx).map(|_| ())
}

fn infer_squeeze(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(x.dtype, squeeze_shape(ctx)?)])
}

fn fold_squeeze(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_relabel(ctx, infer_squeeze)
}

/// Unsqueeze's output: a 1 inserted at each axis (axes count in the output's rank).
fn unsqueeze_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    let x = ctx.input(0)?;
    let Some((v, src)) = axes_param(ctx, 1, 13)? else {
        let src = if ctx.opset >= 13 {
            Src::Input(1)
        } else {
            Src::Attr("axes")
        };
        return Err(src.err(
            "the axes to insert",
            "nothing",
            "give Unsqueeze its axes (an int64 input from opset 13 on, an attribute before)",
        ));
    };
    let rank = x.shape.len() + v.len();
    let axes = norm_axes(src, &v, rank)?;
    let mut rest = x.shape.iter();
    Ok((0..rank)
        .map(|k| {
            if axes.contains(&k) {
                Dim::Fixed(1)
            } else {
                rest.next().cloned().unwrap_or(Dim::Fixed(1))
            }
        })
        .collect())
}

fn verify_unsqueeze(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    unsqueeze_shape(ctx).map(|_| ())
}

fn infer_unsqueeze(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(x.dtype, unsqueeze_shape(ctx)?)])
}

fn fold_unsqueeze(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    fold_relabel(ctx, infer_unsqueeze)
}

/// Expand's output: the numpy broadcast of the input with the (compile-time) target shape.
fn expand_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    let x = ctx.input(0)?;
    rank_where(ctx, 1, |r| r == 1, "a 1-D shape tensor")?;
    let Some(target) = const_ints(ctx, 1, "the target shape", &[DataType::I64])? else {
        return Err(OpError::input(
            1,
            "the target shape",
            "nothing",
            "connect Expand's shape input",
        ));
    };
    if let Some(bad) = target.iter().find(|v| **v < 0) {
        return Err(OpError::input(
            1,
            "dims >= 0 in the target shape",
            format!("{target:?} (has {bad})"),
            "Expand takes sizes; use 1 to keep the input's dim",
        ));
    }
    broadcast(&x.shape, &fixed_shape(&target)).map_err(|(k, a, b)| {
        OpError::input(
            1,
            format!(
                "a target shape that broadcasts with the input {} (axis {k}: {a})",
                shape_str(&x.shape)
            ),
            format!("{target:?} (axis {k}: {b})"),
            "on each axis the input dim must be 1 or equal to the target's (1 in the target \
             keeps the input's dim)",
        )
    })
}

fn verify_expand(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    expand_shape(ctx).map(|_| ())
}

fn infer_expand(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    Ok(vec![TensorDesc::new(x.dtype, expand_shape(ctx)?)])
}

fn fold_expand(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some(t) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    let Some(dims) = shape_values(&expand_shape(ctx)?) else {
        return Ok(vec![]);
    };
    if !foldable(&dims) {
        return Ok(vec![]);
    }
    let index = broadcast_index(&dims, &t.dims)?;
    Ok(vec![gather(t, dims, &index)?])
}

/// Attributes of which Constant carries exactly one.
const CONSTANT_ATTRS: [&str; 8] = [
    "value",
    "value_float",
    "value_floats",
    "value_int",
    "value_ints",
    "value_string",
    "value_strings",
    "sparse_value",
];

/// Constant's value from whichever attribute carries it.
fn constant_value(ctx: &OpCtx<'_>) -> Result<Tensor, OpError> {
    let present: Vec<&str> = CONSTANT_ATTRS
        .iter()
        .copied()
        .filter(|a| ctx.node.attr(a).is_some())
        .collect();
    let [name] = present.as_slice() else {
        return Err(node_err(
            format!(
                "exactly one of the attributes {}",
                CONSTANT_ATTRS.join(", ")
            ),
            if present.is_empty() {
                "none".to_string()
            } else {
                present.join(", ")
            },
            "give the Constant node a single value attribute",
        ));
    };
    let attr = ctx.node.attr(name);
    let wrong = |want: &str| {
        OpError::attr(
            name,
            want,
            attr.map_or_else(|| "nothing".to_string(), attr_kind),
            "re-export the model; the attribute has the wrong type",
        )
    };
    match (*name, attr) {
        ("value", Some(Attr::Tensor(t))) => Ok(t.clone()),
        ("value_float", Some(Attr::Float(v))) => Ok(Tensor::from_f32s(vec![], &[*v])),
        ("value_floats", Some(Attr::Floats(v))) => Ok(Tensor::from_f32s(vec![v.len() as i64], v)),
        ("value_int", Some(Attr::Int(v))) => Ok(Tensor::from_i64s(vec![], &[*v])),
        ("value_ints", Some(Attr::Ints(v))) => Ok(Tensor::from_i64s(vec![v.len() as i64], v)),
        ("value", _) => Err(wrong("a tensor")),
        ("value_float", _) => Err(wrong("a float")),
        ("value_floats", _) => Err(wrong("a list of floats")),
        ("value_int", _) => Err(wrong("an integer")),
        ("value_ints", _) => Err(wrong("a list of integers")),
        _ => Err(OpError::attr(
            name,
            "a numeric value (value, value_float(s) or value_int(s))",
            format!("`{name}`"),
            "string and sparse constants are not supported; feed the value as a dense numeric \
             initializer",
        )),
    }
}

fn verify_constant(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    constant_value(ctx).map(|_| ())
}

fn infer_constant(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    Ok(vec![TensorDesc::of(&constant_value(ctx)?)])
}

fn fold_constant(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![constant_value(ctx)?])
}
