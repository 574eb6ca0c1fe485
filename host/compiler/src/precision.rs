//! atc's `--precision_mode`: which ops of an fp32 model the chip computes in fp16.
//!
//! GE chooses each op's kernel by its precision mode and inserts `Cast` nodes where a value
//! passes between ops of different types; the model's inputs and outputs keep their types.
//! This pass does the same on the folded graph: it picks the ops to compute in fp16, gives
//! their fp32 inputs and outputs fp16 descriptors, converts fp32 constants they read, and puts
//! a `Cast` on every other edge that crosses between the two types.
//!
//! | mode | fp32 ops computed in fp16 |
//! |---|---|
//! | `force_fp16` (atc's default for these chips) | every op with an fp16 kernel |
//! | `allow_fp32_to_fp16` | ops without an fp32 kernel: the cube ops (Conv, MatMul, Gemm) |
//! | `allow_mix_precision` | every op with an fp16 kernel except the precision-sensitive ones (Div, Sqrt, Erf) |
//! | `must_keep_origin_dtype` | none |
//!
//! The lists are gearsim's, after GE's documented intent (assumption: GE's per-op lists are
//! larger and chip-specific).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ir::{Attr, DataType, Graph, Node, NodeId, Tensor, TensorDesc, Value};
use super::options::OptionError;

/// atc's `--precision_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrecisionMode {
    /// Every op that has an fp16 kernel computes in fp16 (atc's default on Ascend 310 / 310P /
    /// 910 for inference).
    #[default]
    ForceFp16,
    /// Ops keep fp32 where the chip has an fp32 kernel; the others (the cube's) go to fp16.
    AllowFp32ToFp16,
    /// Every op keeps the model's types.
    MustKeepOriginDtype,
    /// fp16 except for the precision-sensitive ops.
    AllowMixPrecision,
}

impl PrecisionMode {
    /// Every mode, in atc's documentation order.
    pub const ALL: [PrecisionMode; 4] = [
        PrecisionMode::ForceFp16,
        PrecisionMode::AllowFp32ToFp16,
        PrecisionMode::MustKeepOriginDtype,
        PrecisionMode::AllowMixPrecision,
    ];

    /// atc's spelling.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionMode::ForceFp16 => "force_fp16",
            PrecisionMode::AllowFp32ToFp16 => "allow_fp32_to_fp16",
            PrecisionMode::MustKeepOriginDtype => "must_keep_origin_dtype",
            PrecisionMode::AllowMixPrecision => "allow_mix_precision",
        }
    }

    /// Parses `--precision_mode`; an unknown value is GE's E10001.
    pub fn parse(s: &str) -> Result<PrecisionMode, OptionError> {
        PrecisionMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                OptionError::new(
                    "E10001",
                    format!(
                        "Value {s} for parameter --precision_mode is invalid. Reason: The \
                         current value is not within the valid range ({}).",
                        PrecisionMode::ALL.map(PrecisionMode::name).join(", ")
                    ),
                )
            })
    }

    /// Whether an op computes in fp16 under this mode (when its model type is fp32).
    fn to_fp16(self, op: &str) -> bool {
        match self {
            PrecisionMode::MustKeepOriginDtype => false,
            PrecisionMode::AllowFp32ToFp16 => CUBE.contains(&op) || op == crate::aipp::OP,
            PrecisionMode::ForceFp16 => FP16_KERNELS.contains(&op),
            PrecisionMode::AllowMixPrecision => {
                FP16_KERNELS.contains(&op) && !SENSITIVE.contains(&op)
            }
        }
    }
}

/// Ops on the cube, which has no fp32 path on these chips.
const CUBE: &[&str] = &["Conv", "ConvTranspose", "MatMul", "Gemm"];

/// Ops whose every floating input and output share one type and that gearsim lowers in fp16
/// (the reductions and normalisations have f32 kernels only, so they keep fp32 between casts,
/// as GE keeps an op whose kernel lacks fp16).
const FP16_KERNELS: &[&str] = &[
    // AIPP's output is fp16 on the hardware (kept in fp32 only by must_keep_origin_dtype).
    "Aipp",
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Erf",
    "Gelu",
    "Sqrt",
    "Clip",
    "Exp",
    "Log",
    "Abs",
    "Neg",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Softplus",
    "Softsign",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "HardSwish",
    "ThresholdedRelu",
    "Round",
    "Sign",
    "PRelu",
    "Sum",
    "Mean",
    "Max",
    "Min",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Transpose",
    "Resize",
    "Concat",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
];

/// Ops `allow_mix_precision` keeps in fp32 (with the reductions and normalisations, which
/// have no fp16 kernel).
const SENSITIVE: &[&str] = &["Div", "Sqrt", "Erf", "Exp", "Log", "Reciprocal"];

/// The value of a graph value known at compile time (a `Const`, or a branch input that
/// stands for a root constant), if any.
pub type ConstantOf<'a> = &'a dyn Fn(&Graph, Value) -> Option<Tensor>;

/// The value of a `Const` node's output.
pub fn const_node(g: &Graph, v: Value) -> Option<Tensor> {
    let n = g.node(v.node);
    (n.op == "Const")
        .then(|| n.tensor("value").cloned())
        .flatten()
}

/// Whether `node` is an fp32 op that `mode` computes in fp16: every floating input and output
/// is fp32 (integer inputs such as shapes and axes are left alone).
fn converts(node: &Node, g: &Graph, mode: PrecisionMode) -> bool {
    if !mode.to_fp16(&node.op) || node.outputs.is_empty() {
        return false;
    }
    let floats_f32 = |d: &TensorDesc| !d.dtype.is_float() || d.dtype == DataType::F32;
    node.outputs.iter().all(|d| d.dtype == DataType::F32)
        && node.inputs.iter().flatten().all(|v| floats_f32(g.desc(*v)))
}

/// Applies `mode` to one folded graph; `constant` gives the values known at compile time,
/// which are converted into new constants instead of cast on the device. Returns how many
/// ops now compute in fp16 and where each old node went (casts are inserted before their
/// readers, so node ids move).
pub fn apply(g: &mut Graph, mode: PrecisionMode, constant: ConstantOf<'_>) -> (usize, Vec<NodeId>) {
    let fp16: Vec<bool> = g.nodes.iter().map(|n| converts(n, g, mode)).collect();
    let count = fp16.iter().filter(|c| **c).count();
    if count == 0 {
        return (0, (0..g.nodes.len() as u32).map(NodeId).collect());
    }
    let old = std::mem::take(&mut g.nodes);
    let mut map: Vec<NodeId> = Vec::with_capacity(old.len());
    // Casts made so far, by the (new) value cast and its target type.
    let mut casts: BTreeMap<(Value, DataType), Value> = BTreeMap::new();
    // The new value of an old one and its type.
    let mut types: BTreeMap<Value, DataType> = BTreeMap::new();
    for (i, mut node) in old.into_iter().enumerate() {
        let here = fp16[i];
        let op = node.op.clone();
        for (slot, v) in node.inputs.iter_mut().enumerate() {
            let Some(v) = v else { continue };
            let nv = Value {
                node: map[v.node.0 as usize],
                output: v.output,
            };
            let have = types.get(&nv).copied().unwrap_or(g.desc(nv).dtype);
            let want = if here && have == DataType::F32 && !parameter(&op, slot) {
                DataType::F16
            } else if !here && have == DataType::F16 && produced_fp16(&fp16, v.node) {
                DataType::F32
            } else {
                have
            };
            *v = if want == have {
                nv
            } else {
                cast(g, &mut casts, nv, want, constant)
            };
        }
        if here {
            for d in &mut node.outputs {
                d.dtype = DataType::F16;
            }
        }
        let id = g.add(node);
        for (k, d) in g.node(id).outputs.iter().enumerate() {
            types.insert(
                Value {
                    node: id,
                    output: k as u32,
                },
                d.dtype,
            );
        }
        map.push(id);
    }
    (count, map)
}

/// Whether input `slot` of `op` is a parameter the kernel is compiled for rather than data it
/// computes on (Resize's roi and scales keep their fp32 values when the resize runs in fp16).
fn parameter(op: &str, slot: usize) -> bool {
    op == "Resize" && slot > 0
}

/// Whether old node `id` was converted (its fp16 outputs are fp32 in the model).
fn produced_fp16(fp16: &[bool], id: NodeId) -> bool {
    fp16.get(id.0 as usize).copied().unwrap_or(false)
}

/// `v` in type `to`: a constant converted in place of a new `Const`, otherwise a `Cast` node
/// (one per value and type).
fn cast(
    g: &mut Graph,
    casts: &mut BTreeMap<(Value, DataType), Value>,
    v: Value,
    to: DataType,
    constant_of: ConstantOf<'_>,
) -> Value {
    if let Some(c) = casts.get(&(v, to)) {
        return *c;
    }
    let constant = constant_of(g, v).and_then(|t| convert(&t, to));
    let src = g.node(v.node);
    // Node names are unique: a second output's cast names its output.
    let of = if v.output == 0 {
        src.name.clone()
    } else {
        format!("{}_{}", src.name, v.output)
    };
    let mut desc = g.desc(v).clone();
    desc.dtype = to;
    let node = match constant {
        Some(t) => {
            let mut n = Node::new(format!("{of}_{}", to.name()), "Const", vec![], vec![desc]);
            n.attrs.insert("value".into(), Attr::Tensor(t));
            n
        }
        None => {
            let mut n = Node::new(
                format!("{of}_cast_{}", to.name()),
                "Cast",
                vec![Some(v)],
                vec![desc],
            );
            n.attrs
                .insert("to".into(), Attr::Int(i64::from(to.onnx_code())));
            n
        }
    };
    let id = g.add(node);
    let out = Value {
        node: id,
        output: 0,
    };
    casts.insert((v, to), out);
    out
}

/// A float constant's values in type `to` (rounded to nearest even).
fn convert(t: &Tensor, to: DataType) -> Option<Tensor> {
    if !t.dtype.is_float() {
        return None;
    }
    let values = t.to_f64s();
    let bytes: Vec<u8> = match to {
        DataType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f64(*v).to_le_bytes())
            .collect(),
        DataType::F32 => values
            .iter()
            .flat_map(|v| (*v as f32).to_le_bytes())
            .collect(),
        _ => return None,
    };
    Some(Tensor {
        dtype: to,
        dims: t.dims.clone(),
        data: Arc::new(bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::fixed_shape;

    fn f32_desc(dims: &[i64]) -> TensorDesc {
        TensorDesc::new(DataType::F32, fixed_shape(dims))
    }

    /// x ─ Conv(w) ─ Relu ─ Sqrt ─ out
    fn graph() -> Graph {
        let mut g = Graph::new("g");
        let v = |node| Some(Value { node, output: 0 });
        let x = g.add(Node::new(
            "x",
            "Data",
            vec![],
            vec![f32_desc(&[1, 16, 4, 4])],
        ));
        let mut w = Node::new("w", "Const", vec![], vec![f32_desc(&[16, 16, 1, 1])]);
        w.attrs.insert(
            "value".into(),
            Attr::Tensor(Tensor::from_f32s(vec![16, 16, 1, 1], &[0.5; 256])),
        );
        let w = g.add(w);
        let conv = g.add(Node::new(
            "conv",
            "Conv",
            vec![v(x), v(w)],
            vec![f32_desc(&[1, 16, 4, 4])],
        ));
        let relu = g.add(Node::new(
            "relu",
            "Relu",
            vec![v(conv)],
            vec![f32_desc(&[1, 16, 4, 4])],
        ));
        let sm = g.add(Node::new(
            "sm",
            "Sqrt",
            vec![v(relu)],
            vec![f32_desc(&[1, 16, 4, 4])],
        ));
        g.add(Node::new("out", "NetOutput", vec![v(sm)], vec![]));
        g
    }

    fn apply_c(g: &mut Graph, mode: PrecisionMode) -> usize {
        apply(g, mode, &const_node).0
    }

    fn ops(g: &Graph) -> Vec<(String, DataType)> {
        g.nodes
            .iter()
            .map(|n| {
                (
                    n.op.clone(),
                    n.outputs.first().map_or(DataType::F32, |d| d.dtype),
                )
            })
            .collect()
    }

    #[test]
    fn force_fp16_casts_at_the_edges_only() {
        let mut g = graph();
        assert_eq!(apply_c(&mut g, PrecisionMode::ForceFp16), 3);
        g.check().unwrap();
        use DataType::{F16, F32};
        let want: Vec<(String, DataType)> = [
            ("Data", F32),
            ("Const", F32),
            ("Cast", F16),
            ("Const", F16),
            ("Conv", F16),
            ("Relu", F16),
            ("Sqrt", F16),
            ("Cast", F32),
            ("NetOutput", F32),
        ]
        .iter()
        .map(|(o, t)| (o.to_string(), *t))
        .collect();
        assert_eq!(ops(&g), want);
    }

    #[test]
    fn the_other_modes_convert_less() {
        let mut g = graph();
        assert_eq!(apply_c(&mut g, PrecisionMode::MustKeepOriginDtype), 0);
        assert_eq!(apply_c(&mut g, PrecisionMode::AllowFp32ToFp16), 1);
        g.check().unwrap();
        // Conv in fp16 between two casts; Relu and Sqrt stay fp32.
        let relu = g.node(g.find("relu").unwrap());
        assert_eq!(relu.outputs[0].dtype, DataType::F32);
        assert_eq!(g.desc(relu.inputs[0].unwrap()).dtype, DataType::F32);
        let mut g = graph();
        assert_eq!(apply_c(&mut g, PrecisionMode::AllowMixPrecision), 2);
        let sm = g.node(g.find("sm").unwrap());
        assert_eq!(sm.outputs[0].dtype, DataType::F32);
    }

    #[test]
    fn unknown_modes_are_e10001() {
        let e = PrecisionMode::parse("fp8_please").unwrap_err();
        assert_eq!(e.code, "E10001");
        assert!(e.message.contains("--precision_mode"), "{e}");
        assert_eq!(
            PrecisionMode::parse("force_fp16").unwrap(),
            PrecisionMode::default()
        );
    }
}
