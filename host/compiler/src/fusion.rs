//! Fusion, as GE does it before lowering: an activation computed inside the kernel that
//! produces its input instead of as a kernel of its own (one read and one write of the tensor
//! and one launch saved).
//!
//! ```text
//!   Conv ─▶ Relu          ⇒  Conv {_fused_activation = Relu}       (the cube kernel's drain)
//!   MatMul(x, W) ─▶ Add(·, b) ⇒ MatMul(x, W, b) {_fused_bias}       (b added in the accumulator)
//!   MatMul / Gemm ─▶ Relu ⇒  MatMul {_fused_activation = Relu}     (the GEMM kernel's drain)
//!   0.5 · x · (1 + Erf(x / √2)), f16 ⇒ Gelu(x) {approximate = tanh} (GE's Gelu kernel)
//!   Add / Sub / Mul ─▶ Relu  ⇒  Add {_fused_activation = Relu}     (one vector pass)
//!   Conv ─▶ Add(·, r) [─▶ Relu] ⇒ Conv(x, w, b, r) {_fused_residual}  (the 5HD or GEMM drain)
//!   Aipp(image) ─▶ Conv   ⇒  Conv(image, w, b) {_fused_aipp}        (MTE2's AIPP unit)
//!   MatMulInteger ─▶ Cast ─▶ Mul(·, s) ⇒ MatMulInteger(.., s) {_fused_dequant} (the drain)
//! ```
//!
//! AIPP goes into the convolution that reads its output, as GE does: the first layer loads
//! its input rows through the AIPP unit (`load_image_l1`), so the converted image is never
//! written. The target says which convolutions its fractal kernel can run that way, and
//! which convolutions' kernels can add a residual in their drain (the 5HD kernel and the GEMM
//! kernel of a pointwise convolution; not the NCHW window or depthwise kernels).
//!
//! The residual pass runs first, so a ReLU after the Add then folds into the convolution: the
//! kernel computes `relu(conv(x) + r)` with the residual `r` read in its drain (ResNet's
//! bottleneck ends), instead of writing `conv(x)` and reading it back in an Add kernel.
//! A producer takes its consumer's activation when it is that value's only reader and the
//! lowering of the producer computes the activation in its epilogue. The fused node keeps the
//! producer's name and lists the names of the nodes it absorbed in `_fused_nodes`, so
//! `--dump_graph` shows what became of each ONNX node. Which passes run is chosen by
//! [`FusionSwitches`] (atc's `--fusion_switch_file`).

use std::collections::BTreeMap;

use super::ir::{Attr, Graph, Model, NodeId, Value};

/// The attribute naming the activation a node computes on its output.
pub const FUSED_ACTIVATION: &str = "_fused_activation";
/// The attribute listing the names of the nodes a node absorbed.
pub const FUSED_NODES: &str = "_fused_nodes";
/// The attribute marking a convolution whose input 3 is a residual added to its output
/// (before its activation).
pub const FUSED_RESIDUAL: &str = "_fused_residual";
/// The input index of a fused residual.
pub const RESIDUAL_INPUT: usize = 3;
/// The attribute marking a MatMul whose input 2 is a constant bias over the output's last
/// axis, added in the accumulator (f32) before the output is rounded and activated.
pub const FUSED_BIAS: &str = "_fused_bias";
/// The input index of a fused bias.
pub const BIAS_INPUT: usize = 2;
/// The attribute marking a MatMulInteger whose i32 product is converted to its output's
/// float type and multiplied by the constant scale at input 4 (one value, or one per output
/// column) in its drain: a dequantisation.
pub const FUSED_DEQUANT: &str = "_fused_dequant";
/// The input index of a fused dequantisation scale.
pub const DEQUANT_INPUT: usize = 4;
/// The attribute marking a convolution that reads its input through the AI core's AIPP unit:
/// input 0 is the 8-bit image and the absorbed `Aipp` node's attributes are the node's. Its
/// value is the channels a pixel the unit writes into L1 (16, or 4 for C04).
pub const FUSED_AIPP: &str = "_fused_aipp";

/// A fusion pass gearsim runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pass {
    /// A convolution's activation in the cube kernel's drain.
    ConvActivation,
    /// A MatMul's or Gemm's activation in the GEMM kernel's drain.
    MatMulActivation,
    /// An element-wise arithmetic op's activation in the same vector pass.
    ElemwiseActivation,
    /// A residual Add into the drain of the pointwise convolution that makes one operand.
    ConvResidualAdd,
    /// An Aipp into the input load of the convolution that reads its output.
    AippConv,
    /// A constant bias Add into the accumulator of the MatMul that makes its other operand.
    MatMulBiasAdd,
    /// The five element-wise ops of an exported erf GELU into one Gelu (fp16 only).
    Gelu,
    /// A Cast to float and a multiplication by a constant scale into the drain of the
    /// MatMulInteger that makes the Cast's input.
    MatMulDequant,
}

impl Pass {
    /// Every pass.
    pub const ALL: [Pass; 8] = [
        Pass::ConvActivation,
        Pass::MatMulActivation,
        Pass::ElemwiseActivation,
        Pass::ConvResidualAdd,
        Pass::AippConv,
        Pass::MatMulBiasAdd,
        Pass::Gelu,
        Pass::MatMulDequant,
    ];

    /// The name a fusion switch file uses.
    pub fn name(self) -> &'static str {
        match self {
            Pass::ConvActivation => "ConvActivationFusionPass",
            Pass::MatMulActivation => "MatMulActivationFusionPass",
            Pass::ElemwiseActivation => "ElemwiseActivationFusionPass",
            Pass::ConvResidualAdd => "ConvResidualAddFusionPass",
            Pass::AippConv => "AippConvFusionPass",
            Pass::MatMulBiasAdd => "MatMulBiasAddFusionPass",
            Pass::Gelu => "GeluFusionPass",
            Pass::MatMulDequant => "MatMulDequantFusionPass",
        }
    }

    /// The pass with this name.
    pub fn parse(s: &str) -> Option<Pass> {
        Pass::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether this pass fuses an activation into a producer of type `op`.
    fn producer(self, op: &str) -> bool {
        match self {
            Pass::ConvActivation => op == "Conv",
            Pass::MatMulActivation => matches!(op, "MatMul" | "Gemm"),
            Pass::ElemwiseActivation => matches!(op, "Add" | "Sub" | "Mul"),
            Pass::ConvResidualAdd
            | Pass::AippConv
            | Pass::MatMulBiasAdd
            | Pass::Gelu
            | Pass::MatMulDequant => false,
        }
    }
}

/// Which fusion passes run (all by default, as in atc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusionSwitches {
    off: Vec<Pass>,
}

impl Default for FusionSwitches {
    fn default() -> FusionSwitches {
        FusionSwitches::all_on()
    }
}

impl FusionSwitches {
    /// Every pass on.
    pub fn all_on() -> FusionSwitches {
        FusionSwitches { off: Vec::new() }
    }

    /// Every pass off (the graph is lowered node by node).
    pub fn all_off() -> FusionSwitches {
        FusionSwitches {
            off: Pass::ALL.to_vec(),
        }
    }

    /// Turns one pass on or off.
    pub fn set(&mut self, pass: Pass, on: bool) {
        self.off.retain(|p| *p != pass);
        if !on {
            self.off.push(pass);
            self.off.sort();
        }
    }

    /// The passes switched off, as `off: A, B`, or `all on`.
    pub fn describe(&self) -> String {
        if self.off.is_empty() {
            "all on".into()
        } else {
            let off: Vec<&str> = self.off.iter().map(|p| p.name()).collect();
            format!("off: {}", off.join(", "))
        }
    }

    /// Whether `pass` runs.
    pub fn on(&self, pass: Pass) -> bool {
        !self.off.contains(&pass)
    }
}

/// Activations a producer can take.
const ACTIVATIONS: &[&str] = &["Relu"];

/// Runs the switched-on passes over the root graph and every branch; returns how many nodes
/// were absorbed.
/// `target` answers what the target's kernels can do.
pub fn fuse_model(m: &mut Model, switches: &FusionSwitches, target: &KernelAbilities<'_>) -> usize {
    let mut n = fuse(&mut m.graph, switches, target);
    for g in &mut m.subgraphs {
        n += fuse(g, switches, target);
    }
    n
}

/// What the target's kernels can do, as the passes ask it.
pub struct KernelAbilities<'a> {
    /// Whether the convolution kernel can read a convolution's input through the AIPP unit.
    pub reads_image: &'a ImageReader<'a>,
    /// Whether a convolution's kernel can add a residual in its drain.
    pub adds_residual: &'a dyn Fn(&Graph, NodeId) -> bool,
}

/// Whether a convolution (the second node) can read its input through the AIPP unit as an
/// Aipp node (the first) configures it: the channels a pixel it would load (16, or 4 for
/// C04), or `None`.
pub type ImageReader<'a> = dyn Fn(&Graph, NodeId, NodeId) -> Option<i64> + 'a;

/// Runs the switched-on passes over one graph; returns how many nodes were absorbed.
pub fn fuse(g: &mut Graph, switches: &FusionSwitches, target: &KernelAbilities<'_>) -> usize {
    let aipp = if switches.on(Pass::AippConv) {
        fuse_aipp(g, target.reads_image)
    } else {
        0
    };
    let residuals = if switches.on(Pass::ConvResidualAdd) {
        fuse_residuals(g, target.adds_residual)
    } else {
        0
    };
    let biases = if switches.on(Pass::MatMulBiasAdd) {
        fuse_matmul_biases(g)
    } else {
        0
    };
    let gelus = if switches.on(Pass::Gelu) {
        fuse_gelus(g)
    } else {
        0
    };
    let dequants = if switches.on(Pass::MatMulDequant) {
        fuse_dequants(g)
    } else {
        0
    };
    aipp + residuals + biases + gelus + dequants + fuse_activations(g, switches)
}

/// Folds `Mul(Cast(MatMulInteger(a, b)), s)` (Mul's operands in either order) into the
/// MatMulInteger when the Cast is to f16 or f32, the scale `s` is a constant of that type
/// holding one value or one per output column, and each intermediate is read only by the next
/// op: the fused node takes the Mul's output and `s` as input 4, and its kernel converts and
/// scales the accumulators in its drain, as a quantised matmul's dequantisation does.
fn fuse_dequants(g: &mut Graph) -> usize {
    use super::ir::DataType;
    let consumers = g.consumers();
    let only_reader = |v: Value, reader: NodeId| read_only_by(&consumers, v, reader);
    let mut fused: Vec<(NodeId, Value, Value, Value)> = Vec::new();
    for i in 0..g.nodes.len() {
        let mul = NodeId(i as u32);
        let n = g.node(mul);
        if n.op != "Mul" || n.outputs.len() != 1 || n.attr(FUSED_ACTIVATION).is_some() {
            continue;
        }
        let out = &n.outputs[0];
        if !matches!(out.dtype, DataType::F16 | DataType::F32) {
            continue;
        }
        let [Some(p), Some(q)] = n.inputs[..] else {
            continue;
        };
        let cols = out.shape.last().and_then(|d| d.fixed());
        let pick = [(p, q), (q, p)].into_iter().find(|&(c, s)| {
            let cast = g.node(c.node);
            let Some(Some(mm)) = cast.inputs.first().copied() else {
                return false;
            };
            let m = g.node(mm.node);
            let scale = g.desc(s);
            let per_column = !scale.shape.is_empty()
                && scale.shape.len() <= out.shape.len()
                && scale.shape.last().and_then(|d| d.fixed()) == cols
                && scale.shape[..scale.shape.len() - 1]
                    .iter()
                    .all(|d| d.fixed() == Some(1));
            // The cube's 8-bit path: int8 A, a constant int8 B, no zero points.
            let cube_path = match m.inputs[..] {
                [Some(a), Some(b), ..] => {
                    g.desc(a).dtype == DataType::I8
                        && g.desc(b).dtype == DataType::I8
                        && g.node(b.node).op == "Const"
                        && m.inputs[2..].iter().all(Option::is_none)
                }
                _ => false,
            };
            cast.op == "Cast"
                && cube_path
                && c.output == 0
                && only_reader(c, mul)
                && cast.outputs.first().is_some_and(|d| d == out)
                && m.op == "MatMulInteger"
                && mm.output == 0
                && only_reader(mm, c.node)
                && m.attr(FUSED_DEQUANT).is_none()
                && g.node(s.node).op == "Const"
                && scale.dtype == out.dtype
                && (scalar_of(g, s).is_some() || per_column)
        });
        if let Some((c, s)) = pick {
            let Some(Some(mm)) = g.node(c.node).inputs.first().copied() else {
                continue;
            };
            fused.push((mul, mm, c, s));
        }
    }
    let mut rewire: BTreeMap<Value, Value> = BTreeMap::new();
    for &(mul, mm, cast, scale) in &fused {
        let (mul_name, cast_name) = (g.node(mul).name.clone(), g.node(cast.node).name.clone());
        let mut f = g.node(mm.node).clone();
        f.inputs.resize(DEQUANT_INPUT, None);
        f.inputs.push(Some(scale));
        f.outputs = g.node(mul).outputs.clone();
        f.attrs.insert(FUSED_DEQUANT.into(), Attr::Int(1));
        *g.node_mut(mul) = f;
        absorb(g, mul, cast_name);
        absorb(g, mul, mul_name);
        let out = Value {
            node: mul,
            output: 0,
        };
        rewire.insert(mm, out);
        rewire.insert(cast, out);
    }
    remove_absorbed(g, &rewire)
}

/// Whether node `reader` is the one reader of value `v` (`consumers` from `Graph::consumers`).
fn read_only_by(
    consumers: &BTreeMap<Value, Vec<(NodeId, usize)>>,
    v: Value,
    reader: NodeId,
) -> bool {
    consumers
        .get(&v)
        .is_some_and(|rs| rs.len() == 1 && rs[0].0 == reader)
}

/// The constant scalar (any shape of one element) a value holds, if it is a `Const`'s.
fn scalar_of(g: &Graph, v: Value) -> Option<f64> {
    let n = g.node(v.node);
    let t = n.tensor("value").filter(|_| n.op == "Const")?;
    (t.len() == 1).then(|| t.to_f64s()[0])
}

/// Folds the exported erf GELU, `Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5)` or
/// `Mul(Mul(x, 0.5), Add(Erf(Div(x, √2)), 1))` (operands of Add and Mul in either order),
/// into one `Gelu(x)` when its values are fp16 and every intermediate is read only by the
/// next op. GE's GeluFusionPass does the same, and its Gelu kernel computes
/// `x / (1 + exp(-2√(2/π)(x + 0.044715 x³)))`, ONNX's `approximate = "tanh"`; fp32 chains
/// keep their ops (the approximation is within fp16's precision, not fp32's).
fn fuse_gelus(g: &mut Graph) -> usize {
    let consumers = g.consumers();
    let only_reader = |v: Value, reader: NodeId| read_only_by(&consumers, v, reader);
    let near = |v: Option<f64>, want: f64| v.is_some_and(|x| (x - want).abs() <= 2e-3 * want);
    let out0 = |node: NodeId| Value { node, output: 0 };
    // When node `id` is a binary `op` with the constant `c` as one operand (the divisor for
    // a Div), its other operand.
    let with_const = |id: NodeId, op: &str, c: f64| -> Option<Value> {
        let n = g.node(id);
        if n.op != op || n.outputs.len() != 1 || n.attr(FUSED_ACTIVATION).is_some() {
            return None;
        }
        let [Some(a), Some(b)] = n.inputs[..] else {
            return None;
        };
        if near(scalar_of(g, b), c) {
            Some(a)
        } else if op != "Div" && near(scalar_of(g, a), c) {
            Some(b)
        } else {
            None
        }
    };
    // `Add(Erf(Div(x, √2)), 1)`: x, and the chain's three nodes.
    let erf_term = |v: Value| -> Option<(Value, [NodeId; 3])> {
        let add = v.node;
        let e = with_const(add, "Add", 1.0)?;
        let erf = g.node(e.node);
        if erf.op != "Erf" || !only_reader(e, add) {
            return None;
        }
        let Some(Some(d)) = erf.inputs.first().copied() else {
            return None;
        };
        if !only_reader(d, e.node) {
            return None;
        }
        let x = with_const(d.node, "Div", std::f64::consts::SQRT_2)?;
        Some((x, [d.node, e.node, add]))
    };
    let mut fused: Vec<(NodeId, Value, Vec<NodeId>)> = Vec::new();
    for i in 0..g.nodes.len() {
        let last = NodeId(i as u32);
        let n = g.node(last);
        if n.op != "Mul" || n.outputs.len() != 1 || n.outputs[0].dtype != super::ir::DataType::F16 {
            continue;
        }
        let [Some(p), Some(q)] = n.inputs[..] else {
            continue;
        };
        let mut found = None;
        for (inner, other) in [(p, q), (q, p)] {
            if !only_reader(inner, last) || g.node(inner.node).op != "Mul" {
                continue;
            }
            let [Some(a), Some(b)] = g.node(inner.node).inputs[..] else {
                continue;
            };
            // A) Mul(Mul(x, term), 0.5)
            if near(scalar_of(g, other), 0.5) {
                for (x, t) in [(a, b), (b, a)] {
                    if let Some((tx, nodes)) = erf_term(t)
                        && tx == x
                        && only_reader(t, inner.node)
                    {
                        found = Some((x, [&nodes[..], &[inner.node]].concat()));
                    }
                }
            }
            // B) Mul(Mul(x, 0.5), term)
            if found.is_none()
                && let (Some(x), Some((tx, nodes))) =
                    (with_const(inner.node, "Mul", 0.5), erf_term(other))
                && tx == x
                && only_reader(other, last)
            {
                found = Some((x, [&nodes[..], &[inner.node]].concat()));
            }
            if found.is_some() {
                break;
            }
        }
        if let Some((x, nodes)) = found
            && g.desc(x).dtype == super::ir::DataType::F16
            && g.desc(x).shape == n.outputs[0].shape
        {
            fused.push((last, x, nodes));
        }
    }
    let mut rewire: BTreeMap<Value, Value> = BTreeMap::new();
    for (last, x, nodes) in &fused {
        let names: Vec<String> = nodes.iter().map(|id| g.node(*id).name.clone()).collect();
        let n = g.node_mut(*last);
        let mul_name = std::mem::take(&mut n.name);
        // Named in the chain's scope (`/layer/act_fn/Mul_1` gives `/layer/act_fn/Gelu`).
        n.name = match mul_name.rsplit_once('/') {
            Some((scope, _)) => format!("{scope}/Gelu"),
            None => format!("{mul_name}_Gelu"),
        };
        n.op = "Gelu".into();
        n.inputs = vec![Some(*x)];
        n.attrs.clear();
        n.attrs
            .insert("approximate".into(), Attr::Str("tanh".into()));
        for name in names.into_iter().chain([mul_name]) {
            absorb(g, *last, name);
        }
        for id in nodes {
            rewire.insert(out0(*id), out0(*last));
        }
    }
    remove_absorbed(g, &rewire)
}

/// Folds `Add(MatMul(x, W), b)` into the MatMul as its bias input when `b` is a constant over
/// the output's last axis (`[N]`, or `[1, .., 1, N]` of at most the output's rank), the
/// MatMul's float output is read by the Add only and has the Add's type and shape. The fused
/// MatMul takes the Add's place in the node order (the constant may have been made after the
/// MatMul, by the precision pass's conversion), which keeps the order topological. The GEMM
/// kernel adds the bias to the f32 accumulator before rounding, as GE's MatMul with bias
/// does, so the result is rounded once instead of twice.
fn fuse_matmul_biases(g: &mut Graph) -> usize {
    let consumers = g.consumers();
    let mut rewire: BTreeMap<Value, Value> = BTreeMap::new();
    for i in 0..g.nodes.len() {
        let add = NodeId(i as u32);
        let Some((out, operands)) = plain_add(g, add).filter(|(out, _)| out.dtype.is_float())
        else {
            continue;
        };
        let node = g.node(add);
        let pick = (0..2).find(|&k| {
            let (mm, b) = (operands[k], operands[1 - k]);
            let p = g.node(mm.node);
            let only_reader = read_only_by(&consumers, mm, add);
            let n = out.shape.last().and_then(|d| d.fixed());
            let bias = g.desc(b);
            let over_last_axis = !bias.shape.is_empty()
                && bias.shape.len() <= out.shape.len()
                && bias.shape.last().and_then(|d| d.fixed()) == n
                && bias.shape[..bias.shape.len() - 1]
                    .iter()
                    .all(|d| d.fixed() == Some(1));
            mm.output == 0
                && p.op == "MatMul"
                && p.inputs.len() == BIAS_INPUT // A and B only: no bias yet
                && p.outputs.len() == 1
                && only_reader
                && p.attr(FUSED_ACTIVATION).is_none()
                && p.attr(FUSED_BIAS).is_none()
                && p.outputs[0].dtype == out.dtype
                && p.outputs[0].shape == out.shape
                && g.node(b.node).op == "Const"
                && bias.dtype == out.dtype
                && over_last_axis
        });
        let Some(k) = pick else {
            continue;
        };
        let (mm, b) = (operands[k], operands[1 - k]);
        let add_name = node.name.clone();
        let mut fused = g.node(mm.node).clone();
        fused.inputs.push(Some(b));
        fused.attrs.insert(FUSED_BIAS.into(), Attr::Int(1));
        *g.node_mut(add) = fused;
        absorb(g, add, add_name);
        // The MatMul's only reader was the Add, which is now the MatMul itself.
        rewire.insert(
            mm,
            Value {
                node: add,
                output: 0,
            },
        );
    }
    remove_absorbed(g, &rewire)
}

/// Folds `Conv(Aipp(image))` into the convolution when the Aipp's f16 output is read by the
/// convolution alone (as its input 0) and `reads_image` says the kernel can: the convolution
/// takes the image as input 0 and the Aipp's attributes.
fn fuse_aipp(g: &mut Graph, reads_image: &ImageReader<'_>) -> usize {
    let consumers = g.consumers();
    let mut rewire: BTreeMap<Value, Value> = BTreeMap::new();
    let mut fused: Vec<(NodeId, NodeId, i64)> = Vec::new();
    for i in 0..g.nodes.len() {
        let id = NodeId(i as u32);
        let node = g.node(id);
        if node.op != super::aipp::OP
            || node.outputs.len() != 1
            || node.outputs[0].dtype != super::ir::DataType::F16
        {
            continue;
        }
        let (Some(Some(image)), out) = (
            node.inputs.first().copied(),
            Value {
                node: id,
                output: 0,
            },
        ) else {
            continue;
        };
        let Some([(conv, 0)]) = consumers.get(&out).map(Vec::as_slice) else {
            continue;
        };
        let c = g.node(*conv);
        if c.op != "Conv" || c.attr(FUSED_AIPP).is_some() {
            continue;
        }
        let Some(channels) = reads_image(g, id, *conv) else {
            continue;
        };
        rewire.insert(out, image);
        fused.push((id, *conv, channels));
    }
    for &(aipp, conv, channels) in &fused {
        let (name, attrs) = {
            let a = g.node(aipp);
            (a.name.clone(), a.attrs.clone())
        };
        let c = g.node_mut(conv);
        for (k, v) in attrs {
            c.attrs.insert(k, v);
        }
        c.attrs.insert(FUSED_AIPP.into(), Attr::Int(channels));
        absorb(g, conv, name);
    }
    remove_absorbed(g, &rewire)
}

/// Records that node `into` absorbed the node named `name`.
fn absorb(g: &mut Graph, into: NodeId, name: String) {
    let p = g.node_mut(into);
    let mut absorbed = match p.attrs.remove(FUSED_NODES) {
        Some(Attr::Strs(v)) => v,
        _ => Vec::new(),
    };
    absorbed.push(name);
    p.attrs.insert(FUSED_NODES.into(), Attr::Strs(absorbed));
}

/// Node `id` when it is an `Add` of two present operands with one output and no fused
/// activation (what the passes folding an Add into a producer start from): its output and its
/// operands.
fn plain_add(g: &Graph, id: NodeId) -> Option<(super::ir::TensorDesc, [Value; 2])> {
    let node = g.node(id);
    if node.op != "Add" || node.outputs.len() != 1 || node.attr(FUSED_ACTIVATION).is_some() {
        return None;
    }
    match node.inputs[..] {
        [Some(a), Some(b)] => Some((node.outputs[0].clone(), [a, b])),
        _ => None,
    }
}

/// Folds `Add(conv(x), r)` into the convolution as its residual input when the convolution's
/// kernel can add it (`adds_residual`), its f16 output is read by the Add only, `r` has the
/// output's shape and type and is made before the convolution runs (nodes run in order).
fn fuse_residuals(g: &mut Graph, adds_residual: &dyn Fn(&Graph, NodeId) -> bool) -> usize {
    let consumers = g.consumers();
    let mut rewire: BTreeMap<Value, Value> = BTreeMap::new();
    for i in 0..g.nodes.len() {
        let add = NodeId(i as u32);
        let Some((out, operands)) =
            plain_add(g, add).filter(|(out, _)| out.dtype == super::ir::DataType::F16)
        else {
            continue;
        };
        let node = g.node(add);
        let pick = (0..2).find(|&k| {
            let (conv, r) = (operands[k], operands[1 - k]);
            let only_reader = read_only_by(&consumers, conv, add);
            let c = g.node(conv.node);
            conv.output == 0
                && c.outputs.len() == 1
                && only_reader
                && c.op == "Conv"
                && c.inputs.len() <= RESIDUAL_INPUT
                && adds_residual(g, conv.node)
                && c.attr(FUSED_ACTIVATION).is_none()
                && c.outputs[0].dtype == out.dtype
                && c.outputs[0].shape == out.shape
                && g.desc(r).dtype == out.dtype
                && g.desc(r).shape == out.shape
                && r.node.0 < conv.node.0
        });
        let Some(k) = pick else {
            continue;
        };
        let (conv, r) = (operands[k], operands[1 - k]);
        let add_name = node.name.clone();
        let c = g.node_mut(conv.node);
        c.inputs.resize(RESIDUAL_INPUT, None);
        c.inputs.push(Some(r));
        c.attrs.insert(FUSED_RESIDUAL.into(), Attr::Int(1));
        absorb(g, conv.node, add_name);
        rewire.insert(
            Value {
                node: add,
                output: 0,
            },
            conv,
        );
    }
    remove_absorbed(g, &rewire)
}

/// Removes the absorbed nodes (the keys of `rewire`, each a node's only output) and points
/// their readers at what replaces them; returns how many were removed.
fn remove_absorbed(g: &mut Graph, rewire: &BTreeMap<Value, Value>) -> usize {
    if rewire.is_empty() {
        return 0;
    }
    let mut keep = vec![true; g.nodes.len()];
    for v in rewire.keys() {
        keep[v.node.0 as usize] = false;
    }
    for n in &mut g.nodes {
        for v in n.inputs.iter_mut().flatten() {
            if let Some(to) = rewire.get(v) {
                *v = *to;
            }
        }
    }
    g.retain(&keep)
}

/// Folds activations into their producers; returns how many were absorbed.
fn fuse_activations(g: &mut Graph, switches: &FusionSwitches) -> usize {
    let consumers = g.consumers();
    // Readers of an absorbed activation read its producer's output instead.
    let mut rewire: BTreeMap<Value, Value> = BTreeMap::new();
    for i in 0..g.nodes.len() {
        let act = NodeId(i as u32);
        let node = g.node(act);
        if !ACTIVATIONS.contains(&node.op.as_str()) || node.outputs.len() != 1 {
            continue;
        }
        let Some(Some(input)) = node.inputs.first().copied() else {
            continue;
        };
        let producer = g.node(input.node);
        let pass = Pass::ALL
            .into_iter()
            .find(|p| switches.on(*p) && p.producer(&producer.op));
        let only_reader = read_only_by(&consumers, input, act);
        let fusable = pass.is_some()
            && only_reader
            && input.output == 0
            && producer.outputs.len() == 1
            && producer.attr(FUSED_ACTIVATION).is_none()
            && producer.outputs[0].dtype == node.outputs[0].dtype
            && producer.outputs[0].shape == node.outputs[0].shape;
        if !fusable {
            continue;
        }
        let (act_name, act_op) = (node.name.clone(), node.op.clone());
        g.node_mut(input.node)
            .attrs
            .insert(FUSED_ACTIVATION.into(), Attr::Str(act_op));
        absorb(g, input.node, act_name);
        rewire.insert(
            Value {
                node: act,
                output: 0,
            },
            input,
        );
    }
    remove_absorbed(g, &rewire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DataType, Node, TensorDesc, fixed_shape};

    fn desc() -> TensorDesc {
        TensorDesc::new(DataType::F16, fixed_shape(&[1, 16, 4, 4]))
    }

    /// x ─ Conv ─ Relu ─ Add(·, x) ─ Relu ─ out, and a second reader of the first Conv's
    /// output when `shared`.
    fn graph(shared: bool) -> Graph {
        let mut g = Graph::new("g");
        let x = g.add(Node::new("x", "Data", vec![], vec![desc()]));
        let v = |node| Some(Value { node, output: 0 });
        let conv = g.add(Node::new("conv", "Conv", vec![v(x)], vec![desc()]));
        let r1 = g.add(Node::new("relu1", "Relu", vec![v(conv)], vec![desc()]));
        let add = g.add(Node::new("add", "Add", vec![v(r1), v(x)], vec![desc()]));
        let r2 = g.add(Node::new("relu2", "Relu", vec![v(add)], vec![desc()]));
        let mut outs = vec![v(r2)];
        if shared {
            outs.push(v(conv));
        }
        g.add(Node::new("out", "NetOutput", outs, vec![]));
        g
    }

    /// x ─ MatMul(·, W) ─ Add(·, b) ─ out with b a constant of `bias_dims` made after the
    /// MatMul (as the precision pass's conversions are), and a second reader of the product
    /// when `shared`.
    fn bias_graph(bias_dims: &[i64], shared: bool) -> Graph {
        let d = |dims: &[i64]| TensorDesc::new(DataType::F16, fixed_shape(dims));
        let mut g = Graph::new("g");
        let v = |node| Some(Value { node, output: 0 });
        let x = g.add(Node::new("x", "Data", vec![], vec![d(&[2, 8, 32])]));
        let w = g.add(Node::new("w", "Const", vec![], vec![d(&[32, 48])]));
        let mm = g.add(Node::new(
            "mm",
            "MatMul",
            vec![v(x), v(w)],
            vec![d(&[2, 8, 48])],
        ));
        let b = g.add(Node::new("b", "Const", vec![], vec![d(bias_dims)]));
        let add = g.add(Node::new(
            "add",
            "Add",
            vec![v(mm), v(b)],
            vec![d(&[2, 8, 48])],
        ));
        let mut outs = vec![v(add)];
        if shared {
            outs.push(v(mm));
        }
        g.add(Node::new("out", "NetOutput", outs, vec![]));
        g
    }

    /// The exported erf GELU over an `[2, 8]` value of `dtype`: order A is
    /// `Mul(Mul(x, t), 0.5)`, B `Mul(Mul(x, 0.5), t)` with `t = Add(Erf(Div(x, div)), 1)`; the
    /// Erf's output also goes to the graph output when `leak`.
    fn gelu_graph(dtype: DataType, order_a: bool, div: f32, leak: bool) -> Graph {
        let d = TensorDesc::new(dtype, fixed_shape(&[2, 8]));
        let mut g = Graph::new("g");
        let v = |node| Some(Value { node, output: 0 });
        let konst = |g: &mut Graph, name: &str, x: f32| {
            let t = crate::ir::Tensor::from_f32s(vec![], &[x]);
            let mut n = Node::new(name, "Const", vec![], vec![TensorDesc::of(&t)]);
            n.attrs.insert("value".into(), Attr::Tensor(t));
            g.add(n)
        };
        let x = g.add(Node::new("x", "Data", vec![], vec![d.clone()]));
        let c_div = konst(&mut g, "sqrt2", div);
        let c_one = konst(&mut g, "one", 1.0);
        let c_half = konst(&mut g, "half", 0.5);
        let dv = g.add(Node::new(
            "act/Div",
            "Div",
            vec![v(x), v(c_div)],
            vec![d.clone()],
        ));
        let erf = g.add(Node::new("act/Erf", "Erf", vec![v(dv)], vec![d.clone()]));
        let add = g.add(Node::new(
            "act/Add",
            "Add",
            vec![v(c_one), v(erf)],
            vec![d.clone()],
        ));
        let y = if order_a {
            let m = g.add(Node::new(
                "act/Mul",
                "Mul",
                vec![v(add), v(x)],
                vec![d.clone()],
            ));
            g.add(Node::new(
                "act/Mul_1",
                "Mul",
                vec![v(m), v(c_half)],
                vec![d.clone()],
            ))
        } else {
            let m = g.add(Node::new(
                "act/Mul",
                "Mul",
                vec![v(x), v(c_half)],
                vec![d.clone()],
            ));
            g.add(Node::new(
                "act/Mul_1",
                "Mul",
                vec![v(add), v(m)],
                vec![d.clone()],
            ))
        };
        let mut outs = vec![v(y)];
        if leak {
            outs.push(v(erf));
        }
        g.add(Node::new("out", "NetOutput", outs, vec![]));
        g
    }

    #[test]
    fn an_exported_erf_gelu_becomes_one_gelu_in_fp16_only() {
        for order_a in [true, false] {
            let mut g = gelu_graph(DataType::F16, order_a, std::f32::consts::SQRT_2, false);
            assert_eq!(fuse_gelus(&mut g), 4, "order A: {order_a}");
            let gelu = g.nodes.iter().find(|n| n.op == "Gelu").unwrap();
            assert_eq!(gelu.name, "act/Gelu");
            assert_eq!(gelu.string("approximate"), Some("tanh"));
            assert_eq!(gelu.inputs.len(), 1);
            match gelu.attr(FUSED_NODES) {
                Some(Attr::Strs(v)) => assert_eq!(v.len(), 5, "{v:?}"),
                other => panic!("{other:?}"),
            }
            assert!(
                !g.nodes
                    .iter()
                    .any(|n| matches!(n.op.as_str(), "Erf" | "Mul" | "Div"))
            );
        }
        // fp32, another divisor, or an intermediate read elsewhere: left alone.
        for (dtype, div, leak) in [
            (DataType::F32, std::f32::consts::SQRT_2, false),
            (DataType::F16, 2.0, false),
            (DataType::F16, std::f32::consts::SQRT_2, true),
        ] {
            let mut g = gelu_graph(dtype, true, div, leak);
            assert_eq!(fuse_gelus(&mut g), 0, "{dtype:?} {div} {leak}");
        }
    }

    #[test]
    fn a_constant_bias_over_the_last_axis_folds_into_the_matmul() {
        for dims in [&[48][..], &[1, 48], &[1, 1, 48]] {
            let mut g = bias_graph(dims, false);
            assert_eq!(fuse_matmul_biases(&mut g), 1, "{dims:?}");
            let mm = g.nodes.iter().find(|n| n.op == "MatMul").unwrap();
            assert_eq!(mm.name, "mm");
            assert_eq!(mm.int(FUSED_BIAS), Some(1));
            assert_eq!(mm.inputs.len(), 3);
            assert!(!g.nodes.iter().any(|n| n.op == "Add"));
            // Every input still refers to an earlier node.
            for (i, n) in g.nodes.iter().enumerate() {
                for v in n.inputs.iter().flatten() {
                    assert!((v.node.0 as usize) < i, "{} reads a later node", n.name);
                }
            }
        }
        // Not over the last axis, a bias of another length, or a product read twice: no.
        for (dims, shared) in [
            (&[8, 48][..], false),
            (&[2, 8, 48], false),
            (&[24], false),
            (&[48], true),
        ] {
            let mut g = bias_graph(dims, shared);
            assert_eq!(fuse_matmul_biases(&mut g), 0, "{dims:?} shared {shared}");
        }
    }

    #[test]
    fn activations_fold_into_their_producers() {
        let mut g = graph(false);
        assert_eq!(fuse(&mut g, &FusionSwitches::default(), &POINTWISE), 2);
        g.check().unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(ops, ["Data", "Conv", "Add", "NetOutput"]);
        let conv = g.node(g.find("conv").unwrap());
        assert_eq!(conv.string(FUSED_ACTIVATION), Some("Relu"));
        assert_eq!(
            conv.attr(FUSED_NODES),
            Some(&Attr::Strs(vec!["relu1".into()]))
        );
        let add = g.find("add").unwrap();
        assert_eq!(g.node(add).inputs[0].unwrap().node, g.find("conv").unwrap());
        let out = g.node(g.find("out").unwrap());
        assert_eq!(out.inputs[0].unwrap().node, add);
    }

    #[test]
    fn a_value_read_twice_keeps_its_activation_apart() {
        let mut g = graph(true);
        assert_eq!(fuse(&mut g, &FusionSwitches::default(), &POINTWISE), 1);
        assert!(g.find("relu1").is_some());
        assert!(g.find("relu2").is_none());
    }

    /// A target whose kernels read any image and add a residual to pointwise convolutions
    /// only (as one without the 5HD kernel).
    const POINTWISE: KernelAbilities<'static> = KernelAbilities {
        reads_image: &|_, _, _| Some(16),
        adds_residual: &|g: &Graph, conv: NodeId| {
            g.node(conv).inputs[1].is_some_and(|w| g.desc(w).shape == fixed_shape(&[16, 16, 1, 1]))
        },
    };

    /// x ─ Conv(k×k) ─ Add(·, r) ─ Relu ─ out, the residual `r` made before the Conv or after.
    fn residual_graph(k: i64, r_first: bool) -> Graph {
        let mut g = Graph::new("g");
        let v = |node| Some(Value { node, output: 0 });
        let x = g.add(Node::new("x", "Data", vec![], vec![desc()]));
        let w = TensorDesc::new(DataType::F16, fixed_shape(&[16, 16, k, k]));
        let w = g.add(Node::new("w", "Const", vec![], vec![w]));
        let r = r_first.then(|| g.add(Node::new("r", "Relu", vec![v(x)], vec![desc()])));
        let conv = g.add(Node::new("conv", "Conv", vec![v(x), v(w)], vec![desc()]));
        let r = r.unwrap_or_else(|| g.add(Node::new("r", "Relu", vec![v(x)], vec![desc()])));
        let add = g.add(Node::new("add", "Add", vec![v(conv), v(r)], vec![desc()]));
        let relu = g.add(Node::new("relu", "Relu", vec![v(add)], vec![desc()]));
        g.add(Node::new("out", "NetOutput", vec![v(relu)], vec![]));
        g
    }

    #[test]
    fn a_residual_add_folds_into_a_pointwise_conv_made_after_its_shortcut() {
        let mut g = residual_graph(1, true);
        assert_eq!(fuse(&mut g, &FusionSwitches::default(), &POINTWISE), 2);
        g.check().unwrap();
        let conv = g.node(g.find("conv").unwrap());
        assert_eq!(conv.int(FUSED_RESIDUAL), Some(1));
        assert_eq!(conv.inputs.len(), RESIDUAL_INPUT + 1);
        assert_eq!(conv.inputs[RESIDUAL_INPUT].map(|v| v.node), g.find("r"));
        assert_eq!(conv.string(FUSED_ACTIVATION), Some("Relu"));
        assert_eq!(
            conv.attr(FUSED_NODES),
            Some(&Attr::Strs(vec!["add".into(), "relu".into()]))
        );
        // A 3×3 conv keeps its Add where its kernel cannot add one, and so does a conv whose
        // shortcut is made after it (nodes run in order); the Add takes the ReLU.
        for (k, r_first) in [(3, true), (1, false)] {
            let mut g = residual_graph(k, r_first);
            assert_eq!(fuse(&mut g, &FusionSwitches::default(), &POINTWISE), 1);
            assert!(g.find("add").is_some());
            assert!(
                g.node(g.find("conv").unwrap())
                    .int(FUSED_RESIDUAL)
                    .is_none()
            );
        }
        // With a kernel that adds one (the 5HD kernel), the 3×3 conv takes it.
        let window = KernelAbilities {
            reads_image: &|_, _, _| Some(16),
            adds_residual: &|_, _| true,
        };
        let mut g = residual_graph(3, true);
        assert_eq!(fuse(&mut g, &FusionSwitches::default(), &window), 2);
        assert!(g.find("add").is_none());
        assert_eq!(g.node(g.find("conv").unwrap()).int(FUSED_RESIDUAL), Some(1));
        let mut off = FusionSwitches::default();
        off.set(Pass::ConvResidualAdd, false);
        let mut g = residual_graph(1, true);
        assert_eq!(fuse(&mut g, &off, &POINTWISE), 1);
        assert!(g.find("add").is_some());
    }

    #[test]
    fn switches_turn_passes_off() {
        let mut g = graph(false);
        assert_eq!(fuse(&mut g, &FusionSwitches::all_off(), &POINTWISE), 0);
        let mut s = FusionSwitches::default();
        s.set(Pass::ConvActivation, false);
        assert_eq!(fuse(&mut g, &s, &POINTWISE), 1);
        assert!(g.find("relu1").is_some());
        assert_eq!(
            Pass::parse("ConvActivationFusionPass"),
            Some(Pass::ConvActivation)
        );
    }
}
