//! The layout pass: which values live in the fractal feature-map format NC1HWC0 (GE's 5HD)
//! instead of NCHW. Between convolutions 5HD saves the kernels the NCHW relayout: the cube
//! kernel reads 5HD windows with `img2col` and writes 5HD tiles with one DMA
//! (`lower::cube::conv5hd`).
//!
//! A value may be 5HD when it is f16, rank 4 with `C % 16 == 0` (so both formats have the same
//! size and the memory plan is unchanged), made by a convolution the 5HD kernel runs, by a
//! layout-agnostic op (element-wise over same-shape operands) or by a 2-D MaxPool (which pools
//! 5HD, or NCHW and converts its smaller output), and read only by such convolutions (as their
//! input or fused residual), agnostic ops whose output is 5HD too, a 2-D MaxPool (which
//! converts its output if that is NCHW) or GlobalAveragePool (whose `[N, C, 1, 1]` output is
//! the same bytes in both formats). Pointwise convolutions run 5HD too, as GE runs them: over
//! NCHW the GEMM kernel reads channel planes in 32-byte columns, and each miss fetches a whole
//! L2 line. A connected region of such values is kept only when some convolution then runs
//! 5HD on both sides, or reads the image through AIPP (its input side is then the AIPP
//! unit's): a region whose every convolution still converts one side would only move the
//! conversion. Graph inputs and outputs stay NCHW; a convolution with one NCHW
//! side converts it with a TransData kernel. So ResNet-18 behind AIPP is one region from its
//! first convolution to the GlobalAveragePool. Without AIPP, a first convolution of fewer than
//! 16 input channels runs the 5HD kernel too: its TransData pads the image's channels to one
//! block (GE's first layer: Cast, TransData, the 5HD convolution).

use std::collections::{BTreeMap, BTreeSet};

use super::Target;
use super::ir::{DataType, Format, Graph, NodeId, TensorDesc, Value, shape_values};
use super::lower::LowerCtx;
use super::lower::cube::conv;
use super::lower::cube::conv5hd;
use super::lower::pool_5hd;

/// Ops that compute element by element over operands of one shape, so any layout works as
/// long as every full-size operand and the output share it (scalar operands may be anything).
const AGNOSTIC: &[&str] = &[
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Abs",
    "Neg",
    "Elu",
    "HardSigmoid",
    "HardSwish",
    "Clip",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
];

/// Marks the values the pass puts in NC1HWC0 (their descriptors' `format`); returns how many.
/// `is_const` says whether a value is a compile-time constant (a Conv's weights must be).
pub fn assign_fractal_formats(
    g: &mut Graph,
    target: &Target,
    is_const: &dyn Fn(Value) -> bool,
) -> usize {
    let consumers = g.consumers();
    let candidate = fractal_candidate;
    let fractal_conv = |id: NodeId| fractal_conv(g, id, target, is_const);
    // A 2-D MaxPool (without Indices) may write its output 5HD: it pools NCHW and converts
    // its (smaller) output, so a region can start after the pool instead of before it. It
    // may read 5HD too (the window is over whole pixel units), and then converts its output
    // if that is NCHW, so a region can also end at a pool.
    let fractal_pool = |id: NodeId| -> bool {
        let node = g.node(id);
        node.op == "MaxPool"
            && node.outputs.len() == 1
            && node.inputs.first().copied().flatten().is_some_and(|v| {
                candidate(g.desc(v)) && pool_5hd::supported(&ctx_of(g, id, target))
            })
    };
    let converting_pool = |id: NodeId| -> bool {
        let node = g.node(id);
        node.op == "MaxPool"
            && node.outputs.len() == 1
            && node
                .inputs
                .first()
                .copied()
                .flatten()
                .is_some_and(|v| shape_values(&g.desc(v).shape).is_some_and(|s| s.len() == 4))
    };
    // Full-size operands of an agnostic op (its other operands are scalars); None when an
    // operand broadcasts, so the op is not agnostic here.
    let full_inputs = |id: NodeId| -> Option<Vec<Value>> {
        let node = g.node(id);
        if !AGNOSTIC.contains(&node.op.as_str()) || node.outputs.len() != 1 {
            return None;
        }
        let out = &node.outputs[0].shape;
        let mut full = Vec::new();
        for v in node.inputs.iter().flatten() {
            let d = g.desc(*v);
            if d.shape == *out {
                full.push(*v);
            } else if shape_values(&d.shape).is_none_or(|s| s.iter().product::<i64>() != 1) {
                return None;
            }
        }
        Some(full)
    };
    let convs: BTreeSet<NodeId> = (0..g.nodes.len() as u32)
        .map(NodeId)
        .filter(|id| fractal_conv(*id))
        .collect();
    let pools: BTreeSet<NodeId> = (0..g.nodes.len() as u32)
        .map(NodeId)
        .filter(|id| converting_pool(*id))
        .collect();
    // Pools that may read 5HD, with the value they read.
    let native_pools: BTreeMap<NodeId, Value> = pools
        .iter()
        .filter(|id| fractal_pool(**id))
        .filter_map(|id| g.node(*id).inputs[0].map(|v| (*id, v)))
        .collect();
    let agnostic: BTreeMap<NodeId, Vec<Value>> = (0..g.nodes.len() as u32)
        .map(NodeId)
        .filter_map(|id| full_inputs(id).map(|f| (id, f)))
        .collect();
    let out0 = |id: NodeId| Value {
        node: id,
        output: 0,
    };
    let mut set: BTreeSet<Value> = convs
        .iter()
        .chain(&pools)
        .chain(agnostic.keys())
        .map(|id| out0(*id))
        .filter(|v| candidate(g.desc(*v)))
        .collect();
    // Drop values until every member's producer and readers agree.
    loop {
        let drop: Vec<Value> = set
            .iter()
            .copied()
            .filter(|v| {
                let inputs_ok = agnostic
                    .get(&v.node)
                    .is_none_or(|full| full.iter().all(|i| set.contains(i)));
                let readers_ok = consumers.get(v).is_none_or(|cs| {
                    cs.iter().all(|(c, slot)| {
                        (convs.contains(c)
                            && (*slot == 0 || *slot == crate::fusion::RESIDUAL_INPUT))
                            || (agnostic.contains_key(c) && set.contains(&out0(*c)))
                            || (native_pools.contains_key(c) && *slot == 0)
                            || (g.node(*c).op == "GlobalAveragePool" && *slot == 0)
                    })
                });
                !(inputs_ok && readers_ok)
            })
            .collect();
        if drop.is_empty() {
            break;
        }
        for v in drop {
            set.remove(&v);
        }
    }
    // Keep only regions some convolution reads or writes with its other side 5HD too.
    // A native pool joins its input's region to its output's, as an agnostic op does.
    let mut links = agnostic.clone();
    for (id, v) in &native_pools {
        links.insert(*id, vec![*v]);
    }
    loop {
        let regions = regions(&set, &links, &consumers);
        let useful = |region: &BTreeSet<Value>| {
            convs.iter().any(|c| {
                let input = g.node(*c).inputs[0].expect("a fractal conv has an input");
                let output = out0(*c);
                (region.contains(&input) && set.contains(&output))
                    || (region.contains(&output) && (set.contains(&input) || aipp_conv(g, *c)))
            })
        };
        let useless: Vec<Value> = regions
            .iter()
            .filter(|r| !useful(r))
            .flatten()
            .copied()
            .collect();
        if useless.is_empty() {
            break;
        }
        for v in &useless {
            set.remove(v);
        }
    }
    for v in &set {
        g.node_mut(v.node).outputs[v.output as usize].format = Format::Nc1hwc0;
    }
    set.len()
}

/// Whether a value may be 5HD: f16, rank 4 with whole channel blocks, every dim known.
fn fractal_candidate(d: &TensorDesc) -> bool {
    f16_image(d, |c| c % 16 == 0)
}

/// Whether a convolution input is f16, rank 4 with fewer than 16 channels, every dim known.
fn few_channels(d: &TensorDesc) -> bool {
    f16_image(d, |c| c < 16)
}

/// Whether `d` is f16, rank 4 with every dim known and channels that `channels` accepts.
fn f16_image(d: &TensorDesc, channels: impl Fn(i64) -> bool) -> bool {
    d.dtype == DataType::F16
        && shape_values(&d.shape)
            .is_some_and(|s| s.len() == 4 && channels(s[1]) && s.iter().all(|v| *v > 0))
}

/// Whether convolution `id` runs the 5HD kernel: constant weights, and f16 sides of whole
/// channel blocks in a shape the kernel supports (or an image read through AIPP, or an input
/// of fewer than 16 channels, which its TransData pads to one block).
fn fractal_conv(g: &Graph, id: NodeId, target: &Target, is_const: &dyn Fn(Value) -> bool) -> bool {
    let node = g.node(id);
    if node.op != "Conv" || !node.inputs.get(1).copied().flatten().is_some_and(is_const) {
        return false;
    }
    // A convolution that reads the image through AIPP runs the fractal kernel anyway.
    if aipp_conv(g, id) {
        return node.outputs.first().is_some_and(fractal_candidate);
    }
    let ctx = ctx_of(g, id, target);
    // An input of fewer than 16 channels (an image's 3) stays NCHW and is converted into one
    // zero-padded channel block by the convolution's TransData, as GE's first layer is without
    // AIPP; the network behind it is 5HD.
    if !ctx
        .inputs
        .first()
        .copied()
        .flatten()
        .is_some_and(|d| fractal_candidate(d) || few_channels(d))
        || !node.outputs.first().is_some_and(fractal_candidate)
    {
        return false;
    }
    // Pointwise convolutions too, as GE keeps them: over NCHW the GEMM kernel reads each
    // channel plane in 32-byte columns, and a read that misses fetches whole L2 lines, so at
    // ResNet-50's sizes it moves more bytes than the window kernel over 5HD.
    conv::conv_shape(&ctx).is_ok_and(|s| conv5hd::supports(&s, &target.core).is_ok())
}

/// Whether convolution `conv`'s kernel can add a residual in its drain (the fusion pass
/// asks, before this pass runs): the GEMM kernel of a pointwise convolution and the 5HD
/// kernel can; the NCHW window and depthwise kernels cannot.
pub fn conv_adds_residual(g: &Graph, conv: NodeId, target: &Target) -> bool {
    let node = g.node(conv);
    if node.op != "Conv" || node.int("group").is_some_and(|groups| groups != 1) {
        return false;
    }
    let ctx = ctx_of(g, conv, target);
    let pointwise = conv::conv_shape(&ctx).is_ok_and(|s| conv::is_pointwise(&s));
    pointwise || fractal_conv(g, conv, target, &|w| g.node(w.node).op == "Const")
}

/// What a lowering of node `id` would see (no constant values), for asking it what it runs.
fn ctx_of<'a>(g: &'a Graph, id: NodeId, target: &'a Target) -> LowerCtx<'a> {
    let node = g.node(id);
    LowerCtx {
        node,
        inputs: node.inputs.iter().map(|v| v.map(|v| g.desc(v))).collect(),
        values: vec![None; node.inputs.len()],
        outputs: &node.outputs,
        target,
    }
}

/// Whether `id` is a convolution that reads its input through the AIPP unit.
fn aipp_conv(g: &Graph, id: NodeId) -> bool {
    g.node(id).int(crate::fusion::FUSED_AIPP).is_some()
}

/// The connected parts of `set`, joined through agnostic ops (an op's full-size operands and
/// its output are one region).
fn regions(
    set: &BTreeSet<Value>,
    agnostic: &BTreeMap<NodeId, Vec<Value>>,
    consumers: &BTreeMap<Value, Vec<(NodeId, usize)>>,
) -> Vec<BTreeSet<Value>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for start in set {
        if seen.contains(start) {
            continue;
        }
        let mut region = BTreeSet::new();
        let mut stack = vec![*start];
        while let Some(v) = stack.pop() {
            if !set.contains(&v) || !seen.insert(v) {
                continue;
            }
            region.insert(v);
            if let Some(full) = agnostic.get(&v.node) {
                stack.extend(full.iter().copied());
            }
            for (c, _) in consumers.get(&v).into_iter().flatten() {
                if agnostic.contains_key(c) {
                    stack.push(Value {
                        node: *c,
                        output: 0,
                    });
                }
            }
        }
        out.push(region);
    }
    out
}

/// Whether the target's fractal convolution kernel can run Conv `conv` reading its input
/// through the AIPP unit as Aipp node `aipp` configures it (`fusion`'s AIPP pass asks): an f16
/// convolution of constant weights whose input is the Aipp's output and which the kernel
/// runs from an image source. The answer is the channels a pixel the unit loads: 4 (C04)
/// when `small_channel` (atc's `--enable_small_channel=1`) and the kernel runs that, else 16.
pub fn conv_reads_image(
    g: &Graph,
    aipp: NodeId,
    conv: NodeId,
    target: &Target,
    small_channel: bool,
) -> Option<i64> {
    let node = g.node(conv);
    let a = g.node(aipp);
    let Some(Some(image)) = a.inputs.first().copied() else {
        return None;
    };
    let (Some(p), Some(dims)) = (
        crate::aipp::Params::of(a).ok(),
        shape_values(&g.desc(image).shape),
    ) else {
        return None;
    };
    let weights_const = node
        .inputs
        .get(1)
        .copied()
        .flatten()
        .is_some_and(|w| g.node(w.node).op == "Const");
    if node.op != "Conv"
        || !weights_const
        || dims.len() != 4
        || node
            .outputs
            .first()
            .is_none_or(|d| d.dtype != DataType::F16)
    {
        return None;
    }
    let ctx = ctx_of(g, conv, target);
    let shape = conv::conv_shape(&ctx).ok()?;
    let source = |c04: bool| conv5hd::Source::Image {
        pixel: dims[3] as u64,
        height: dims[1] as u64,
        width: dims[2] as u64,
        origin: (p.crop[0], p.crop[1]),
        c04,
    };
    let runs = |c04: bool| conv5hd::supports_from(&shape, &target.core, source(c04)).is_ok();
    if small_channel && runs(true) {
        Some(conv5hd::AIPP_C04)
    } else if runs(false) {
        Some(16)
    } else {
        None
    }
}
