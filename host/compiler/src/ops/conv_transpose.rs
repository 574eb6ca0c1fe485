//! ConvTranspose (opsets 11 on): its geometry, written once for shape inference, the
//! evaluator and the lowering (which runs it as a stride-1 convolution over the input spread
//! by the strides, with the kernel flipped and its channel axes swapped).
//!
//! Per spatial axis, with `e = d·(k-1) + 1` the kernel's extent: the full output is
//! `s·(in-1) + e + output_padding`, of which `pads` are cut (explicit, or derived from
//! `output_shape` or `auto_pad` as the ONNX definition says).

use super::super::infer::{OpCtx, OpDef, OpError};
use super::super::ir::TensorDesc;
use super::super::symbolic::Dim;
use super::{FLOATS, attr_int, attr_ints, attr_str, input_of, shape_str};

/// The ConvTranspose definition.
pub(super) fn defs() -> Vec<OpDef> {
    vec![OpDef {
        op: "ConvTranspose",
        min_inputs: 2,
        max_inputs: 3,
        verify: |ctx| ConvTransposeGeometry::parse(ctx).map(|_| ()),
        infer: infer_conv_transpose,
        fold: None,
        // The weights are flipped and packed for the cube when compiling.
        static_inputs: &[1],
    }]
}

/// Everything about one ConvTranspose but its batch size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvTransposeGeometry {
    /// Input channels (the weights' dim 0).
    pub in_channels: i64,
    /// Output channels (`group` × the weights' dim 1).
    pub out_channels: i64,
    /// Channel groups.
    pub group: i64,
    /// Per spatial axis: the input length.
    pub input: Vec<i64>,
    /// The kernel size.
    pub kernel: Vec<i64>,
    /// The stride (the spread of the input).
    pub strides: Vec<i64>,
    /// The dilation of the kernel.
    pub dilations: Vec<i64>,
    /// Output elements cut at the start.
    pub pads_begin: Vec<i64>,
    /// Output elements cut at the end.
    pub pads_end: Vec<i64>,
    /// Extra output elements at the end.
    pub output_padding: Vec<i64>,
    /// The output length.
    pub output: Vec<i64>,
}

fn attr_err(name: &str, expected: String, got: String, fix: &str) -> OpError {
    OpError::attr(name, expected, got, fix)
}

impl ConvTransposeGeometry {
    /// Parses and checks the node (spatial dims must be static).
    pub fn parse(ctx: &OpCtx<'_>) -> Result<ConvTransposeGeometry, OpError> {
        let x = input_of(ctx, 0, FLOATS, "a float tensor")?;
        let w = input_of(ctx, 1, FLOATS, "float weights")?;
        let r = x.shape.len();
        if r < 3 || w.shape.len() != r {
            return Err(OpError::input(
                1,
                format!("weights of rank {r} ([C, M/group, k...]) for an input of rank >= 3"),
                format!("{} and {}", shape_str(&x.shape), shape_str(&w.shape)),
                "give the input as [N, C, spatial...] and the weights with one kernel dim per \
                 spatial dim",
            ));
        }
        let n = r - 2;
        let fixed = |d: &Dim, what: &str| {
            d.fixed().ok_or_else(|| {
                OpError::input(
                    0,
                    format!("a static {what}"),
                    shape_str(&x.shape),
                    "only the batch dim of a transposed convolution may vary",
                )
            })
        };
        let input: Vec<i64> = x.shape[2..]
            .iter()
            .map(|d| fixed(d, "spatial size"))
            .collect::<Result<_, _>>()?;
        let c = fixed(&x.shape[1], "channel count")?;
        let wd: Vec<i64> = w.shape.iter().map(|d| d.fixed().unwrap_or(-1)).collect();
        let group = attr_int(ctx, "group", 1)?;
        if group < 1 || wd[0] != c || c % group != 0 {
            return Err(OpError::input(
                1,
                format!("weights [{c}, M/group, k...] with a group dividing {c}"),
                format!("{} with group {group}", shape_str(&w.shape)),
                "the weights' dim 0 is the input's channel count",
            ));
        }
        let per_axis = |name: &str, default: i64| -> Result<Vec<i64>, OpError> {
            let v = attr_ints(ctx, name)?.unwrap_or_else(|| vec![default; n]);
            if v.len() != n {
                return Err(attr_err(
                    name,
                    format!("{n} values, one per spatial axis"),
                    format!("{v:?}"),
                    "give one value per spatial axis",
                ));
            }
            Ok(v)
        };
        let kernel = match attr_ints(ctx, "kernel_shape")? {
            Some(k) if k[..] != wd[2..] => {
                return Err(attr_err(
                    "kernel_shape",
                    format!("the weights' kernel dims {:?}", &wd[2..]),
                    format!("{k:?}"),
                    "drop kernel_shape or make it match the weights",
                ));
            }
            _ => wd[2..].to_vec(),
        };
        let strides = per_axis("strides", 1)?;
        let dilations = per_axis("dilations", 1)?;
        let output_padding = per_axis("output_padding", 0)?;
        for (name, v, min) in [("strides", &strides, 1), ("dilations", &dilations, 1)] {
            if v.iter().any(|s| *s < min) {
                return Err(attr_err(
                    name,
                    "values >= 1".into(),
                    format!("{v:?}"),
                    "use positive values",
                ));
            }
        }
        if (0..n)
            .any(|a| output_padding[a] < 0 || output_padding[a] >= strides[a].max(dilations[a]))
        {
            return Err(attr_err(
                "output_padding",
                "values in [0, max(stride, dilation))".into(),
                format!("{output_padding:?}"),
                "reduce output_padding below the stride",
            ));
        }
        // The full output per axis, before any pad is cut.
        let full: Vec<i64> = (0..n)
            .map(|a| {
                strides[a] * (input[a] - 1) + dilations[a] * (kernel[a] - 1) + 1 + output_padding[a]
            })
            .collect();
        let auto = attr_str(ctx, "auto_pad", "NOTSET")?;
        let output_shape = match attr_ints(ctx, "output_shape")? {
            None => None,
            Some(o) => {
                let o = if o.len() == r { o[2..].to_vec() } else { o };
                if o.len() != n || o.iter().any(|v| *v <= 0) {
                    return Err(attr_err(
                        "output_shape",
                        format!("{n} positive spatial sizes"),
                        format!("{o:?}"),
                        "give the output's spatial sizes",
                    ));
                }
                Some(o)
            }
        };
        // The cuts may be negative: the output then extends past the full result (zeros, plus
        // the bias), as the ONNX reference computes it.
        let (pads_begin, pads_end) = match auto.as_str() {
            "SAME_UPPER" | "SAME_LOWER" => {
                let target =
                    output_shape.unwrap_or_else(|| (0..n).map(|a| input[a] * strides[a]).collect());
                let mut b = Vec::with_capacity(n);
                let mut e = Vec::with_capacity(n);
                for a in 0..n {
                    let total = full[a] - target[a];
                    let half = total.div_euclid(2);
                    if auto == "SAME_UPPER" {
                        b.push(half);
                        e.push(total - half);
                    } else {
                        b.push(total - half);
                        e.push(half);
                    }
                }
                (b, e)
            }
            "NOTSET" | "VALID" => {
                let p = attr_ints(ctx, "pads")?
                    .filter(|_| auto == "NOTSET")
                    .unwrap_or_else(|| vec![0; 2 * n]);
                if p.len() != 2 * n || p.iter().any(|v| *v < 0) {
                    return Err(attr_err(
                        "pads",
                        format!("{} non-negative values", 2 * n),
                        format!("{p:?}"),
                        "give a start and an end pad per spatial axis",
                    ));
                }
                let begin = p[..n].to_vec();
                let end = match &output_shape {
                    // Explicit output sizes: cut (or extend) at the end.
                    Some(o) => (0..n).map(|a| full[a] - begin[a] - o[a]).collect(),
                    None => p[n..].to_vec(),
                };
                (begin, end)
            }
            other => {
                return Err(attr_err(
                    "auto_pad",
                    "NOTSET, SAME_UPPER, SAME_LOWER or VALID".into(),
                    format!("{other:?}"),
                    "use an auto_pad value the ONNX definition lists",
                ));
            }
        };
        let output: Vec<i64> = (0..n)
            .map(|a| full[a] - pads_begin[a] - pads_end[a])
            .collect();
        if output.iter().any(|o| *o <= 0) {
            return Err(attr_err(
                "pads",
                "pads that leave a positive output size".into(),
                format!("{pads_begin:?} and {pads_end:?} for full sizes {full:?}"),
                "reduce the pads",
            ));
        }
        Ok(ConvTransposeGeometry {
            in_channels: c,
            out_channels: wd[1] * group,
            group,
            input,
            kernel,
            strides,
            dilations,
            pads_begin,
            pads_end,
            output_padding,
            output,
        })
    }
}

fn infer_conv_transpose(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let g = ConvTransposeGeometry::parse(ctx)?;
    let x = ctx.input(0)?;
    if let Some(b) = ctx.inputs.get(2).copied().flatten()
        && (b.shape != [Dim::Fixed(g.out_channels)] || b.dtype != x.dtype)
    {
        return Err(OpError::input(
            2,
            format!("a bias {}[{}]", x.dtype.name(), g.out_channels),
            format!("{}{}", b.dtype.name(), shape_str(&b.shape)),
            "give one bias per output channel",
        ));
    }
    let mut shape = vec![x.shape[0].clone(), Dim::Fixed(g.out_channels)];
    shape.extend(g.output.iter().map(|o| Dim::Fixed(*o)));
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}
