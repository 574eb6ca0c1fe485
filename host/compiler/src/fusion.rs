//! Fusion, as GE does it before lowering: an activation computed inside the kernel that
//! produces its input instead of as a kernel of its own (one read and one write of the tensor
//! and one launch saved).
//!
//! ```text
//!   Conv ─▶ Relu          ⇒  Conv {_fused_activation = Relu}       (the cube kernel's drain)
//!   MatMul / Gemm ─▶ Relu ⇒  MatMul {_fused_activation = Relu}     (the GEMM kernel's drain)
//!   Add / Sub / Mul ─▶ Relu  ⇒  Add {_fused_activation = Relu}     (one vector pass)
//! ```
//!
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

/// A fusion pass gearsim runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pass {
    /// A convolution's activation in the cube kernel's drain.
    ConvActivation,
    /// A MatMul's or Gemm's activation in the GEMM kernel's drain.
    MatMulActivation,
    /// An element-wise arithmetic op's activation in the same vector pass.
    ElemwiseActivation,
}

impl Pass {
    /// Every pass.
    pub const ALL: [Pass; 3] = [
        Pass::ConvActivation,
        Pass::MatMulActivation,
        Pass::ElemwiseActivation,
    ];

    /// The name a fusion switch file uses.
    pub fn name(self) -> &'static str {
        match self {
            Pass::ConvActivation => "ConvActivationFusionPass",
            Pass::MatMulActivation => "MatMulActivationFusionPass",
            Pass::ElemwiseActivation => "ElemwiseActivationFusionPass",
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
pub fn fuse_model(m: &mut Model, switches: &FusionSwitches) -> usize {
    let mut n = fuse(&mut m.graph, switches);
    for g in &mut m.subgraphs {
        n += fuse(g, switches);
    }
    n
}

/// Runs the switched-on passes over one graph; returns how many nodes were absorbed.
pub fn fuse(g: &mut Graph, switches: &FusionSwitches) -> usize {
    let consumers = g.consumers();
    let mut absorbed_nodes = Vec::new();
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
        let only_reader = consumers
            .get(&input)
            .is_some_and(|r| r.len() == 1 && r[0].0 == act);
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
        let p = g.node_mut(input.node);
        p.attrs.insert(FUSED_ACTIVATION.into(), Attr::Str(act_op));
        let mut absorbed = match p.attrs.remove(FUSED_NODES) {
            Some(Attr::Strs(v)) => v,
            _ => Vec::new(),
        };
        absorbed.push(act_name);
        p.attrs.insert(FUSED_NODES.into(), Attr::Strs(absorbed));
        rewire.insert(
            Value {
                node: act,
                output: 0,
            },
            input,
        );
        absorbed_nodes.push(i);
    }
    if rewire.is_empty() {
        return 0;
    }
    let mut keep = vec![true; g.nodes.len()];
    for i in absorbed_nodes {
        keep[i] = false;
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

    #[test]
    fn activations_fold_into_their_producers() {
        let mut g = graph(false);
        assert_eq!(fuse(&mut g, &FusionSwitches::default()), 2);
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
        assert_eq!(fuse(&mut g, &FusionSwitches::default()), 1);
        assert!(g.find("relu1").is_some());
        assert!(g.find("relu2").is_none());
    }

    #[test]
    fn switches_turn_passes_off() {
        let mut g = graph(false);
        assert_eq!(fuse(&mut g, &FusionSwitches::all_off()), 0);
        let mut s = FusionSwitches::default();
        s.set(Pass::ConvActivation, false);
        assert_eq!(fuse(&mut g, &s), 1);
        assert!(g.find("relu1").is_some());
        assert_eq!(
            Pass::parse("ConvActivationFusionPass"),
            Some(Pass::ConvActivation)
        );
    }
}
