//! Neural-network operators: Conv, MaxPool, AveragePool, GlobalAveragePool, MatMul, Gemm,
//! BatchNormalization (inference), LayerNormalization, InstanceNormalization,
//! GroupNormalization and Softmax.
//!
//! Batch and channel dims pass through symbolically. A symbolic spatial dim is accepted where
//! the output size stays a polynomial: stride 1, or a size the stride divides exactly; any
//! other floor or ceil division by a stride is refused with an error that says so.

use super::super::infer::{OpCtx, OpDef, OpError, broadcast};
use super::super::ir::{DataType, TensorDesc};
use super::super::symbolic::Dim;
use super::{
    FLOATS, Src, attr_flag, attr_float, attr_int, attr_ints, attr_str, declared_outputs, dim_add,
    dim_mul, input_of, norm_axis, opt_input, overflow_err, rank_where, same_dtype, shape_str,
};

/// The neural-network operator definitions.
pub(super) fn defs() -> Vec<OpDef> {
    vec![
        OpDef {
            op: crate::aipp::OP,
            min_inputs: 1,
            max_inputs: 1,
            verify: verify_aipp,
            infer: infer_aipp,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "Conv",
            min_inputs: 2,
            max_inputs: 3,
            verify: verify_conv,
            infer: infer_conv,
            fold: None,
            // The weights are packed for the cube (or laid out for the vector unit) when
            // compiling, so they must be constants and are never read at run time.
            static_inputs: &[1],
        },
        OpDef {
            op: "MaxPool",
            min_inputs: 1,
            max_inputs: 1,
            verify: verify_max_pool,
            infer: infer_max_pool,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "AveragePool",
            min_inputs: 1,
            max_inputs: 1,
            verify: verify_avg_pool,
            infer: infer_avg_pool,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "GlobalAveragePool",
            min_inputs: 1,
            max_inputs: 1,
            verify: verify_global_pool,
            infer: infer_global_pool,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "MatMul",
            min_inputs: 2,
            max_inputs: 2,
            verify: verify_matmul,
            infer: infer_matmul,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "MatMulInteger",
            min_inputs: 2,
            // Input 4 is a fused dequantisation's scale (`fusion::FUSED_DEQUANT`).
            max_inputs: 5,
            verify: verify_matmul_integer,
            infer: infer_matmul_integer,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "Gemm",
            min_inputs: 2,
            max_inputs: 3,
            verify: verify_gemm,
            infer: infer_gemm,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "BatchNormalization",
            min_inputs: 5,
            max_inputs: 5,
            verify: verify_batch_norm,
            infer: infer_batch_norm,
            fold: None,
            static_inputs: &[],
        },
        group_norm_def("InstanceNormalization"),
        group_norm_def("GroupNormalization"),
        OpDef {
            op: "LayerNormalization",
            min_inputs: 1,
            max_inputs: 3,
            verify: verify_layer_norm,
            infer: infer_layer_norm,
            fold: None,
            static_inputs: &[],
        },
        OpDef {
            op: "Softmax",
            min_inputs: 1,
            max_inputs: 1,
            verify: verify_softmax,
            infer: infer_softmax,
            fold: None,
            static_inputs: &[],
        },
    ]
}

/// How pads are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AutoPad {
    /// Explicit `pads`.
    NotSet,
    /// Output = ceil(input / stride), extra pad at the end.
    SameUpper,
    /// Output = ceil(input / stride), extra pad at the start.
    SameLower,
    /// No padding.
    Valid,
}

/// The sliding-window attributes shared by Conv and the pools.
struct Window {
    /// Kernel size per spatial axis.
    kernel: Vec<i64>,
    /// Stride per spatial axis.
    strides: Vec<i64>,
    /// Dilation per spatial axis.
    dilations: Vec<i64>,
    /// Begin pads then end pads.
    pads: Vec<i64>,
    /// Padding mode.
    auto_pad: AutoPad,
    /// Whether output sizes round up (pools only).
    ceil_mode: bool,
}

/// A per-spatial-axis list attribute with a default and a minimum.
fn spatial_list(
    ctx: &OpCtx<'_>,
    name: &str,
    n: usize,
    default: i64,
    min: i64,
) -> Result<Vec<i64>, OpError> {
    let Some(v) = attr_ints(ctx, name)? else {
        return Ok(vec![default; n]);
    };
    if v.len() != n {
        return Err(OpError::attr(
            name,
            format!("{n} values, one per spatial axis"),
            format!("{} values {v:?}", v.len()),
            "give one value per spatial dim of the input",
        ));
    }
    if v.iter().any(|x| *x < min) {
        return Err(OpError::attr(
            name,
            format!("values >= {min}"),
            format!("{v:?}"),
            "fix the attribute's values",
        ));
    }
    Ok(v)
}

/// Parses the window attributes for `n` spatial axes around a known kernel.
fn window(ctx: &OpCtx<'_>, n: usize, kernel: Vec<i64>, pool: bool) -> Result<Window, OpError> {
    let strides = spatial_list(ctx, "strides", n, 1, 1)?;
    let dilations = spatial_list(ctx, "dilations", n, 1, 1)?;
    let pads = match attr_ints(ctx, "pads")? {
        None => vec![0; 2 * n],
        Some(p) => {
            if p.len() != 2 * n {
                return Err(OpError::attr(
                    "pads",
                    format!(
                        "{} values (the {n} begin pads, then the {n} end pads)",
                        2 * n
                    ),
                    format!("{} values {p:?}", p.len()),
                    "give a begin and an end pad for every spatial axis",
                ));
            }
            if p.iter().any(|x| *x < 0) {
                return Err(OpError::attr(
                    "pads",
                    "pads >= 0",
                    format!("{p:?}"),
                    "negative pads are not supported; crop with Slice instead",
                ));
            }
            p
        }
    };
    let auto_pad = match attr_str(ctx, "auto_pad", "NOTSET")?.as_str() {
        "NOTSET" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => {
            return Err(OpError::attr(
                "auto_pad",
                "NOTSET, SAME_UPPER, SAME_LOWER or VALID",
                format!("{other:?}"),
                "use one of the ONNX auto_pad values",
            ));
        }
    };
    if auto_pad != AutoPad::NotSet && pads.iter().any(|p| *p != 0) {
        return Err(OpError::attr(
            "pads",
            format!("no explicit pads together with auto_pad={auto_pad:?}"),
            format!("{pads:?}"),
            "remove `pads` or set auto_pad to NOTSET",
        ));
    }
    let ceil_mode = if pool {
        attr_flag(ctx, "ceil_mode", false)?
    } else {
        false
    };
    Ok(Window {
        kernel,
        strides,
        dilations,
        pads,
        auto_pad,
        ceil_mode,
    })
}

impl Window {
    /// Dilated kernel extent on axis `a`.
    fn extent(&self, a: usize) -> i128 {
        (i128::from(self.kernel[a]) - 1) * i128::from(self.dilations[a]) + 1
    }

    /// Output size on spatial axis `a` (dim `a + 2` of input 0) for input size `x`.
    ///
    /// ONNX: NOTSET gives floor((x + pb + pe - e) / s) + 1 (ceil in ceil_mode, dropping a last
    /// window that would start in the end padding, as PyTorch does); VALID the same without
    /// pads; SAME_* give ceil(x / s) whatever ceil_mode says.
    fn out_dim(&self, a: usize, x: &Dim) -> Result<Dim, OpError> {
        let n = self.kernel.len();
        let s = self.strides[a];
        let e = self.extent(a);
        let (pb, pe) = match self.auto_pad {
            AutoPad::NotSet => (i128::from(self.pads[a]), i128::from(self.pads[a + n])),
            _ => (0, 0),
        };
        let same = matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower);
        let too_small = |x: &Dim| {
            OpError::input(
                0,
                format!(
                    "spatial dim {} of at least {} (the dilated kernel {e} minus pads {})",
                    a + 2,
                    e - pb - pe,
                    pb + pe
                ),
                x.to_string(),
                "use a bigger input, a smaller kernel or dilation, or more padding",
            )
        };
        match x {
            Dim::Fixed(v) => {
                let (v, s128) = (i128::from(*v), i128::from(s));
                // A stride past the padded input gives the single window a stride equal to
                // it gives (the lowerings take it as that, so none plans for a huge one).
                let out = if same {
                    (v + s128 - 1) / s128
                } else {
                    let num = v + pb + pe - e;
                    if num < 0 {
                        return Err(too_small(x));
                    }
                    if self.ceil_mode {
                        let mut o = (num + s128 - 1) / s128 + 1;
                        if (o - 1) * s128 >= v + pb {
                            o -= 1;
                        }
                        o
                    } else {
                        num / s128 + 1
                    }
                };
                i64::try_from(out)
                    .map(Dim::Fixed)
                    .map_err(|_| overflow_err("the output size"))
            }
            Dim::Sym(_) => {
                let cannot = || {
                    OpError::input(
                        0,
                        format!(
                            "spatial dim {} fixed, or divisible by the stride {s} so the output \
                             size is exact",
                            a + 2
                        ),
                        format!("the symbolic size {x}"),
                        "the output size is a floor division of a symbolic dim, which a dim \
                         expression cannot hold; give this input fixed spatial dims (each gear \
                         branch has them) or use stride 1",
                    )
                };
                if same {
                    return x.div_exact(&Dim::Fixed(s)).ok_or_else(cannot);
                }
                let c = i64::try_from(pb + pe - e).map_err(|_| overflow_err("the padding"))?;
                let num = dim_add(x, &Dim::Fixed(c)).ok_or_else(|| overflow_err("the size"))?;
                if num.interval().0 < 0 {
                    return Err(too_small(x));
                }
                let q = num.div_exact(&Dim::Fixed(s)).ok_or_else(cannot)?;
                // An exact quotient is both the floor and the ceil; in ceil_mode the last
                // window starts in the end padding exactly when pe >= e.
                let drop = self.ceil_mode && pe >= e;
                let one = Dim::Fixed(if drop { 0 } else { 1 });
                dim_add(&q, &one).ok_or_else(|| overflow_err("the output size"))
            }
        }
    }

    /// Output spatial dims for the input's spatial dims.
    fn out_dims(&self, spatial: &[Dim]) -> Result<Vec<Dim>, OpError> {
        spatial
            .iter()
            .enumerate()
            .map(|(a, x)| self.out_dim(a, x))
            .collect()
    }
}

/// Input 0 of a conv or pool: rank 3 or more.
fn nc_input<'a>(
    ctx: &OpCtx<'a>,
    allowed: &[DataType],
    what: &str,
) -> Result<&'a TensorDesc, OpError> {
    input_of(ctx, 0, allowed, what)?;
    rank_where(
        ctx,
        0,
        |r| r >= 3,
        "rank 3 or more (batch, channels, spatial dims)",
    )
}

/// Conv's window and output channel count, fully checked.
fn conv_parse(ctx: &OpCtx<'_>) -> Result<(Window, Dim), OpError> {
    let x = nc_input(ctx, FLOATS, "a float tensor")?;
    let r = x.shape.len();
    same_dtype(ctx, 0, 1)?;
    let w = rank_where(
        ctx,
        1,
        |k| k == r,
        &format!("rank {r} like X (M, C_in / group, kernel dims)"),
    )?;
    let group = attr_int(ctx, "group", 1)?;
    if group < 1 {
        return Err(OpError::attr(
            "group",
            "a group count >= 1",
            group.to_string(),
            "set group to 1 (dense), C_in (depthwise) or a divisor of both channel counts",
        ));
    }
    let kernel: Vec<i64> = w.shape[2..]
        .iter()
        .map(|d| d.fixed().filter(|k| *k >= 1))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            OpError::input(
                1,
                "fixed kernel dims >= 1 (W dims 2 and up)",
                w.to_string(),
                "give the weights a static shape",
            )
        })?;
    if let Some(ks) = attr_ints(ctx, "kernel_shape")?
        && ks != kernel
    {
        return Err(OpError::attr(
            "kernel_shape",
            format!("{kernel:?}, the spatial dims of W"),
            format!("{ks:?}"),
            "remove kernel_shape (it is inferred from W) or make it match W",
        ));
    }
    let c_in = &x.shape[1];
    let want = dim_mul(&w.shape[1], &Dim::Fixed(group)).ok_or_else(|| overflow_err("C_in"))?;
    if &want != c_in {
        if let Dim::Fixed(c) = c_in
            && c % group != 0
        {
            return Err(OpError::attr(
                "group",
                format!("a divisor of the input channel count {c}"),
                group.to_string(),
                "set group so it divides C_in (depthwise conv: group = C_in)",
            ));
        }
        return Err(OpError::input(
            1,
            format!("W dim 1 = C_in / group = {c_in} / {group}"),
            format!("{} (W is {w})", w.shape[1]),
            "W must be [M, C_in / group, kernel...]; for a depthwise conv set group = C_in and W \
             dim 1 = 1",
        ));
    }
    let m = w.shape[0].clone();
    match m.fixed() {
        _ if group == 1 => {}
        Some(mv) if mv % group == 0 => {}
        _ => {
            return Err(OpError::attr(
                "group",
                format!("a divisor of the output channel count (W dim 0 = {m})"),
                group.to_string(),
                "W dim 0 (M) must be a multiple of group",
            ));
        }
    }
    if let Some(b) = opt_input(ctx, 2) {
        same_dtype(ctx, 0, 2)?;
        if b.shape != [m.clone()] {
            return Err(OpError::input(
                2,
                format!("a bias of shape [{m}] (one per output channel)"),
                format!("shape {}", shape_str(&b.shape)),
                "give the bias one value per output channel",
            ));
        }
    }
    let win = window(ctx, r - 2, kernel, false)?;
    Ok((win, m))
}

fn verify_conv(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    let (win, _) = conv_parse(ctx)?;
    win.out_dims(&ctx.input(0)?.shape[2..]).map(|_| ())
}

fn infer_conv(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (win, m) = conv_parse(ctx)?;
    let x = ctx.input(0)?;
    let mut shape = vec![x.shape[0].clone(), m];
    shape.extend(win.out_dims(&x.shape[2..])?);
    Ok(vec![TensorDesc {
        dtype: x.dtype,
        shape,
        format: x.format,
    }])
}

/// A pool's window, fully checked.
fn pool_parse(ctx: &OpCtx<'_>, max: bool) -> Result<Window, OpError> {
    let x = if max {
        let types = [
            DataType::F16,
            DataType::F32,
            DataType::F64,
            DataType::I8,
            DataType::U8,
        ];
        nc_input(ctx, &types, "a float or 8-bit integer tensor")?
    } else {
        nc_input(ctx, FLOATS, "a float tensor")?
    };
    let n = x.shape.len() - 2;
    let Some(kernel) = attr_ints(ctx, "kernel_shape")? else {
        return Err(OpError::attr(
            "kernel_shape",
            format!("the window size ({n} values)"),
            "nothing",
            "set kernel_shape; pooling has no weights to infer it from",
        ));
    };
    if kernel.len() != n || kernel.iter().any(|k| *k < 1) {
        return Err(OpError::attr(
            "kernel_shape",
            format!("{n} values >= 1, one per spatial axis"),
            format!("{kernel:?}"),
            "give one window size per spatial dim of the input",
        ));
    }
    if max {
        attr_flag(ctx, "storage_order", false)?;
    } else {
        attr_flag(ctx, "count_include_pad", false)?;
    }
    let win = window(ctx, n, kernel, true)?;
    for a in 0..n {
        let e = win.extent(a);
        let (pb, pe) = (win.pads[a], win.pads[a + n]);
        if i128::from(pb) >= e || i128::from(pe) >= e {
            return Err(OpError::attr(
                "pads",
                format!("pads smaller than the window ({e}) on spatial axis {a}"),
                format!("{:?}", win.pads),
                "a window made only of padding has no input to pool; reduce the pads",
            ));
        }
    }
    Ok(win)
}

fn verify_pool(ctx: &OpCtx<'_>, max: bool) -> Result<(), OpError> {
    let win = pool_parse(ctx, max)?;
    win.out_dims(&ctx.input(0)?.shape[2..]).map(|_| ())
}

fn infer_pool(ctx: &OpCtx<'_>, max: bool) -> Result<Vec<TensorDesc>, OpError> {
    let win = pool_parse(ctx, max)?;
    let x = ctx.input(0)?;
    let mut shape = x.shape[..2].to_vec();
    shape.extend(win.out_dims(&x.shape[2..])?);
    let y = TensorDesc {
        dtype: x.dtype,
        shape: shape.clone(),
        format: x.format,
    };
    let mut out = vec![y];
    // MaxPool's optional second output holds the flat argmax indices.
    if max && declared_outputs(ctx, 2)? == 2 {
        out.push(TensorDesc::new(DataType::I64, shape));
    } else if !max {
        declared_outputs(ctx, 1)?;
    }
    Ok(out)
}

fn verify_max_pool(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    verify_pool(ctx, true)
}

fn infer_max_pool(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    infer_pool(ctx, true)
}

fn verify_avg_pool(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    verify_pool(ctx, false)
}

fn infer_avg_pool(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    infer_pool(ctx, false)
}

fn verify_global_pool(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    nc_input(ctx, FLOATS, "a float tensor").map(|_| ())
}

fn infer_global_pool(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = nc_input(ctx, FLOATS, "a float tensor")?;
    let mut shape = x.shape[..2].to_vec();
    shape.resize(x.shape.len(), Dim::Fixed(1));
    Ok(vec![TensorDesc {
        dtype: x.dtype,
        shape,
        format: x.format,
    }])
}

/// Types MatMul and Gemm accept.
const MATMUL_TYPES: &[DataType] = &[
    DataType::F16,
    DataType::BF16,
    DataType::F32,
    DataType::F64,
    DataType::I32,
    DataType::I64,
];

/// MatMul's output shape with numpy semantics: 1-D operands get a dim prepended (A) or
/// appended (B) that is removed again; batch dims broadcast.
fn matmul_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    input_of(ctx, 0, MATMUL_TYPES, "a float or int32/int64 tensor")?;
    same_dtype(ctx, 0, 1)?;
    product_shape(ctx)
}

/// MatMulInteger's checks: 8-bit operands, zero points of their operand's type that are
/// scalars or one per row of A (input 2) / per column of B (input 3).
fn verify_matmul_integer(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    matmul_integer_shape(ctx).map(|_| ())
}

fn infer_matmul_integer(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let shape = matmul_integer_shape(ctx)?;
    // A fused dequantisation gives the scale's float type.
    let dtype = if ctx.node.int(crate::fusion::FUSED_DEQUANT).is_some() {
        ctx.input(crate::fusion::DEQUANT_INPUT)?.dtype
    } else {
        DataType::I32
    };
    Ok(vec![TensorDesc::new(dtype, shape)])
}

fn matmul_integer_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    const EIGHT_BIT: &[DataType] = &[DataType::I8, DataType::U8];
    input_of(ctx, 0, EIGHT_BIT, "an int8 or uint8 tensor")?;
    input_of(ctx, 1, EIGHT_BIT, "an int8 or uint8 tensor")?;
    for (z, of) in [(2, 0), (3, 1)] {
        if ctx.inputs.get(z).copied().flatten().is_some() {
            same_dtype(ctx, of, z)?;
            rank_where(ctx, z, |r| r <= 1, "a scalar or a 1-D tensor")?;
        }
    }
    let fused = ctx.node.int(crate::fusion::FUSED_DEQUANT).is_some();
    let scale = ctx
        .inputs
        .get(crate::fusion::DEQUANT_INPUT)
        .copied()
        .flatten();
    if fused != scale.is_some() {
        return Err(OpError::input(
            crate::fusion::DEQUANT_INPUT,
            "a scale exactly when the node has a fused dequantisation",
            if fused { "no scale" } else { "a fifth input" },
            "MatMulInteger takes at most 4 inputs",
        ));
    }
    product_shape(ctx)
}

/// The output shape of a matrix product of inputs 0 and 1 (numpy semantics).
fn product_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    let a = rank_where(ctx, 0, |r| r >= 1, "rank 1 or more")?;
    let b = rank_where(ctx, 1, |r| r >= 1, "rank 1 or more")?;
    let mut sa = a.shape.clone();
    if sa.len() == 1 {
        sa.insert(0, Dim::Fixed(1));
    }
    let mut sb = b.shape.clone();
    if sb.len() == 1 {
        sb.push(Dim::Fixed(1));
    }
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k) = (&sa[ra - 2], &sa[ra - 1]);
    let (kb, n) = (&sb[rb - 2], &sb[rb - 1]);
    if k != kb {
        return Err(OpError::input(
            1,
            format!(
                "{} = {k}, A's last dim (A is {})",
                if b.shape.len() == 1 {
                    "B's only dim"
                } else {
                    "B's second-to-last dim"
                },
                shape_str(&a.shape)
            ),
            format!("{kb} (B is {})", shape_str(&b.shape)),
            "the inner dims of a matrix product must match; transpose or reshape an operand",
        ));
    }
    let mut out = broadcast(&sa[..ra - 2], &sb[..rb - 2]).map_err(|(ax, x, y)| {
        OpError::input(
            1,
            format!(
                "batch dims that broadcast with A's {} (batch axis {ax}: {x})",
                shape_str(&sa[..ra - 2])
            ),
            format!("{} (batch axis {ax}: {y})", shape_str(&sb[..rb - 2])),
            "make the batch dims equal or 1 on each axis",
        )
    })?;
    if a.shape.len() > 1 {
        out.push(m.clone());
    }
    if b.shape.len() > 1 {
        out.push(n.clone());
    }
    Ok(out)
}

fn verify_matmul(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    matmul_shape(ctx).map(|_| ())
}

fn infer_matmul(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let shape = matmul_shape(ctx)?;
    Ok(vec![TensorDesc::new(ctx.input(0)?.dtype, shape)])
}

/// Gemm's output shape `[M, N]`.
fn gemm_shape(ctx: &OpCtx<'_>) -> Result<Vec<Dim>, OpError> {
    input_of(ctx, 0, MATMUL_TYPES, "a float or int32/int64 tensor")?;
    same_dtype(ctx, 0, 1)?;
    let a = rank_where(ctx, 0, |r| r == 2, "a matrix (rank 2)")?;
    let b = rank_where(ctx, 1, |r| r == 2, "a matrix (rank 2)")?;
    let ta = attr_flag(ctx, "transA", false)?;
    let tb = attr_flag(ctx, "transB", false)?;
    attr_float(ctx, "alpha", 1.0)?;
    attr_float(ctx, "beta", 1.0)?;
    let (m, k) = if ta {
        (&a.shape[1], &a.shape[0])
    } else {
        (&a.shape[0], &a.shape[1])
    };
    let (kb, n) = if tb {
        (&b.shape[1], &b.shape[0])
    } else {
        (&b.shape[0], &b.shape[1])
    };
    if k != kb {
        return Err(OpError::input(
            1,
            format!(
                "K = {k} on B's dim {} (A is {}, transA={})",
                usize::from(tb),
                shape_str(&a.shape),
                u8::from(ta)
            ),
            format!(
                "{kb} (B is {}, transB={})",
                shape_str(&b.shape),
                u8::from(tb)
            ),
            "check transA/transB: the inner dims of A' and B' must match",
        ));
    }
    let out = vec![m.clone(), n.clone()];
    if let Some(c) = opt_input(ctx, 2) {
        same_dtype(ctx, 0, 2)?;
        let ok = c.shape.len() <= 2 && broadcast(&c.shape, &out).is_ok_and(|s| s == out);
        if !ok {
            return Err(OpError::input(
                2,
                format!("a C that broadcasts to [M, N] = {}", shape_str(&out)),
                format!("shape {}", shape_str(&c.shape)),
                "give C the shape [M, N], [N], [M, 1] or a single value",
            ));
        }
    }
    Ok(out)
}

fn verify_gemm(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    gemm_shape(ctx).map(|_| ())
}

fn infer_gemm(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let shape = gemm_shape(ctx)?;
    Ok(vec![TensorDesc::new(ctx.input(0)?.dtype, shape)])
}

/// BatchNormalization in inference mode: checks, and returns the channel dim.
fn batch_norm_parse(ctx: &OpCtx<'_>) -> Result<Dim, OpError> {
    input_of(ctx, 0, FLOATS, "a float tensor")?;
    let x = rank_where(ctx, 0, |r| r >= 2, "rank 2 or more (batch, channels, ...)")?;
    if attr_flag(ctx, "training_mode", false)? {
        return Err(OpError::attr(
            "training_mode",
            "0 (inference: normalize with the stored mean and variance)",
            "1 (training: batch statistics and running-average updates)",
            "export the model in eval mode (model.eval() before torch.onnx.export)",
        ));
    }
    let eps = attr_float(ctx, "epsilon", 1e-5)?;
    if eps < 0.0 {
        return Err(OpError::attr(
            "epsilon",
            "epsilon >= 0",
            eps.to_string(),
            "use a small positive epsilon such as 1e-5",
        ));
    }
    let c = x.shape[1].clone();
    for (i, name) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
        input_of(ctx, i, FLOATS, &format!("a float {name}"))?;
        let d = ctx.input(i)?;
        if d.shape != [c.clone()] {
            return Err(OpError::input(
                i,
                format!("{name} of shape [{c}] (one value per channel of X)"),
                format!("shape {}", shape_str(&d.shape)),
                "give every per-channel parameter the length of X's dim 1",
            ));
        }
    }
    Ok(c)
}

fn verify_batch_norm(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    batch_norm_parse(ctx).map(|_| ())
}

/// Y, then for any further declared outputs (opset 13's optional statistics) their `[C]`
/// descriptors, which in inference mode are the stored statistics.
fn infer_batch_norm(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let c = batch_norm_parse(ctx)?;
    let n = declared_outputs(ctx, 5)?;
    let mut out = vec![ctx.input(0)?.clone()];
    let stat = ctx.input(3)?.dtype;
    for _ in 1..n {
        out.push(TensorDesc::new(stat, vec![c.clone()]));
    }
    Ok(out)
}

/// InstanceNormalization and GroupNormalization (opset 21: Scale and B per channel): how many
/// groups the channels form. InstanceNormalization is the case of one channel per group.
pub fn group_norm_parse(ctx: &OpCtx<'_>) -> Result<i64, OpError> {
    let x = input_of(ctx, 0, FLOATS, "a float tensor")?;
    let instance = ctx.node.op == "InstanceNormalization";
    let min_rank = if instance { 3 } else { 2 };
    if x.shape.len() < min_rank {
        return Err(OpError::input(
            0,
            format!("rank {min_rank} or more ([N, C, ...])"),
            shape_str(&x.shape),
            "give the input as [N, C, spatial...]",
        ));
    }
    let c = x.shape[1].fixed().ok_or_else(|| {
        OpError::input(
            0,
            "a static channel count (dim 1)",
            shape_str(&x.shape),
            "fix the channel dim; only batch and spatial dims may vary",
        )
    })?;
    let eps = attr_float(ctx, "epsilon", 1e-5)?;
    if eps < 0.0 {
        return Err(OpError::attr(
            "epsilon",
            "epsilon >= 0",
            eps.to_string(),
            "use a small positive epsilon such as 1e-5",
        ));
    }
    let groups = if instance {
        c
    } else {
        let g = attr_int(ctx, "num_groups", 0)?;
        if g <= 0 || c % g != 0 {
            return Err(OpError::attr(
                "num_groups",
                format!("a positive divisor of the {c} channels"),
                g.to_string(),
                "set num_groups to a divisor of the channel count",
            ));
        }
        if attr_int(ctx, "stash_type", 1)? != 1 {
            return Err(OpError::attr(
                "stash_type",
                "1 (float32 statistics)",
                attr_int(ctx, "stash_type", 1)?.to_string(),
                "remove stash_type or set it to 1",
            ));
        }
        g
    };
    for i in [1, 2] {
        let d = ctx.input(i)?;
        if d.dtype != x.dtype || d.shape != [Dim::Fixed(c)] {
            return Err(OpError::input(
                i,
                format!("{}[{c}] (one value per channel)", x.dtype.name()),
                format!("{}{}", d.dtype.name(), shape_str(&d.shape)),
                "give one scale and one bias per channel, of the input's type",
            ));
        }
    }
    Ok(groups)
}

/// InstanceNormalization and GroupNormalization share one definition (X, Scale, B).
fn group_norm_def(op: &'static str) -> OpDef {
    OpDef {
        op,
        min_inputs: 3,
        max_inputs: 3,
        verify: verify_group_norm,
        infer: infer_group_norm,
        fold: None,
        static_inputs: &[],
    }
}

fn verify_group_norm(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    group_norm_parse(ctx).map(|_| ())
}

fn infer_group_norm(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    group_norm_parse(ctx)?;
    Ok(vec![ctx.input(0)?.clone()])
}

/// LayerNormalization's normalized axis, fully checked.
fn layer_norm_parse(ctx: &OpCtx<'_>) -> Result<usize, OpError> {
    let x = input_of(ctx, 0, FLOATS, "a float tensor")?;
    let r = x.shape.len();
    if r == 0 {
        return Err(OpError::input(
            0,
            "rank 1 or more",
            "a scalar",
            "LayerNormalization normalizes over trailing axes; give it a tensor",
        ));
    }
    let axis = norm_axis(Src::Attr("axis"), attr_int(ctx, "axis", -1)?, r)?;
    let eps = attr_float(ctx, "epsilon", 1e-5)?;
    if eps < 0.0 {
        return Err(OpError::attr(
            "epsilon",
            "epsilon >= 0",
            eps.to_string(),
            "use a small positive epsilon such as 1e-5",
        ));
    }
    let stash = attr_int(ctx, "stash_type", 1)?;
    if stash != 1 {
        return Err(OpError::attr(
            "stash_type",
            "1 (float32 statistics)",
            stash.to_string(),
            "remove stash_type or set it to 1; other precisions are not supported",
        ));
    }
    let norm = &x.shape[axis..];
    for (i, name) in [(1, "Scale"), (2, "B")] {
        let Some(d) = opt_input(ctx, i) else { continue };
        same_dtype(ctx, 0, i)?;
        if !broadcast(&d.shape, norm).is_ok_and(|s| s == norm) || d.shape.len() > norm.len() {
            return Err(OpError::input(
                i,
                format!(
                    "{name} broadcastable to the normalized shape {} (X's dims from axis {axis})",
                    shape_str(norm)
                ),
                format!("shape {}", shape_str(&d.shape)),
                "give the parameter the shape of the normalized dims, or fix `axis`",
            ));
        }
    }
    Ok(axis)
}

fn verify_layer_norm(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    layer_norm_parse(ctx).map(|_| ())
}

/// Y like X; Mean and InvStdDev (when declared) are float32 of X's shape with the normalized
/// dims set to 1.
fn infer_layer_norm(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let axis = layer_norm_parse(ctx)?;
    let x = ctx.input(0)?;
    let n = declared_outputs(ctx, 3)?;
    let mut stat = x.shape[..axis].to_vec();
    stat.resize(x.shape.len(), Dim::Fixed(1));
    let mut out = vec![x.clone()];
    for _ in 1..n {
        out.push(TensorDesc::new(DataType::F32, stat.clone()));
    }
    Ok(out)
}

fn verify_softmax(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    let x = input_of(ctx, 0, FLOATS, "a float tensor")?;
    let default = if ctx.opset >= 13 { -1 } else { 1 };
    if x.shape.is_empty() {
        return Err(OpError::input(
            0,
            "rank 1 or more",
            "a scalar",
            "Softmax needs an axis to normalize over",
        ));
    }
    norm_axis(
        Src::Attr("axis"),
        attr_int(ctx, "axis", default)?,
        x.shape.len(),
    )
    .map(|_| ())
}

fn infer_softmax(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    verify_softmax(ctx)?;
    Ok(vec![ctx.input(0)?.clone()])
}

/// The AIPP node's parameters and its image input (u8 NHWC with the format's pixel bytes).
fn aipp_input<'a>(ctx: &OpCtx<'a>) -> Result<(crate::aipp::Params, &'a TensorDesc), OpError> {
    let p = crate::aipp::Params::of(ctx.node).map_err(|what| {
        OpError::attr(
            "crop",
            what,
            "missing or malformed",
            "insert AIPP with --insert_op_conf",
        )
    })?;
    let x = input_of(ctx, 0, &[DataType::U8], "an 8-bit image")?;
    let pixel = Dim::Fixed(p.format.pixel_bytes() as i64);
    let fits = |axis: usize, end: u64| match x.shape.get(axis).and_then(Dim::fixed) {
        Some(n) => end <= n as u64,
        None => true,
    };
    if x.shape.len() == 4 && !(fits(1, p.crop[0] + p.crop[2]) && fits(2, p.crop[1] + p.crop[3])) {
        return Err(OpError::attr(
            "crop",
            format!("a crop inside the {} image", shape_str(&x.shape)),
            format!("{:?}", p.crop),
            "crop inside the image",
        ));
    }
    if x.shape.len() != 4 || x.shape[3] != pixel {
        return Err(OpError::input(
            0,
            format!(
                "an NHWC image with {} byte(s) per pixel ({})",
                p.format.pixel_bytes(),
                p.format.name()
            ),
            shape_str(&x.shape),
            "feed the image the AIPP configuration describes",
        ));
    }
    Ok((p, x))
}

fn verify_aipp(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    aipp_input(ctx).map(|_| ())
}

/// `[N, C, crop height, crop width]` in f32, or in f16 once the precision mode made it so
/// (the type cannot follow from the 8-bit input, so the node's declared one stands).
fn infer_aipp(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let (p, x) = aipp_input(ctx)?;
    let declared = ctx.node.outputs.first().map(|d| d.dtype);
    Ok(vec![TensorDesc {
        dtype: if declared == Some(DataType::F16) {
            DataType::F16
        } else {
            DataType::F32
        },
        shape: vec![
            x.shape[0].clone(),
            Dim::Fixed(p.format.channels() as i64),
            Dim::Fixed(p.crop[2] as i64),
            Dim::Fixed(p.crop[3] as i64),
        ],
        format: crate::ir::Format::Nchw,
    }])
}
