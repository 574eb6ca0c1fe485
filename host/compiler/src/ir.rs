//! The graph IR: nodes with typed tensor descriptions and attributes, graphs of nodes in
//! topological order, and a model (a root graph plus named subgraphs, such as the `Batch_i`
//! branches of the gear Case). Also the text dump used by `--dump_graph` and golden tests.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use super::symbolic::Dim;

pub use gearsim_isa::tensor::{DataType, Tensor};

/// Layout of a tensor as the user declared it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Format {
    /// No particular layout.
    #[default]
    Nd,
    /// Batch, channels, height, width.
    Nchw,
    /// Batch, height, width, channels.
    Nhwc,
    /// Batch, channel blocks of 16, height, width, 16 channels (GE's 5HD): the fractal
    /// feature-map format the layout pass keeps between convolutions. Never user-declared.
    Nc1hwc0,
}

impl Format {
    /// Name as atc spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Nd => "ND",
            Format::Nchw => "NCHW",
            Format::Nhwc => "NHWC",
            Format::Nc1hwc0 => "NC1HWC0",
        }
    }

    /// Parses an atc format name.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "ND" => Some(Format::Nd),
            "NCHW" => Some(Format::Nchw),
            "NHWC" => Some(Format::Nhwc),
            _ => None,
        }
    }
}

/// Attribute marking a node whose output shapes the symbolic pass could not infer (the
/// reason); the dump prints its outputs as `?`.
pub const SHAPE_UNKNOWN: &str = "_shape_unknown";

/// A tensor shape of known rank.
pub type Shape = Vec<Dim>;

/// Shape of known sizes.
pub fn fixed_shape(dims: &[i64]) -> Shape {
    dims.iter().map(|d| Dim::Fixed(*d)).collect()
}

/// The sizes of a fully known shape.
pub fn shape_values(shape: &[Dim]) -> Option<Vec<i64>> {
    shape.iter().map(Dim::fixed).collect()
}

/// Element count of a fully known shape.
pub fn element_count(shape: &[Dim]) -> Option<i64> {
    shape
        .iter()
        .try_fold(1i64, |acc, d| d.fixed().and_then(|v| acc.checked_mul(v)))
}

/// Type, shape and layout of a value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DataType,
    /// Shape.
    pub shape: Shape,
    /// Layout.
    pub format: Format,
}

impl TensorDesc {
    /// The descriptor of constant data: its element type and fixed shape.
    pub fn of(t: &Tensor) -> TensorDesc {
        TensorDesc::new(t.dtype, fixed_shape(&t.dims))
    }

    /// A descriptor in ND layout.
    pub fn new(dtype: DataType, shape: Shape) -> TensorDesc {
        TensorDesc {
            dtype,
            shape,
            format: Format::Nd,
        }
    }

    /// Bytes of a fully known shape (`None` also when the size overflows 64 bits).
    pub fn bytes(&self) -> Option<u64> {
        element_count(&self.shape)
            .and_then(|n| (n.max(0) as u64).checked_mul(self.dtype.size() as u64))
    }
}

impl fmt::Display for TensorDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype.name())?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")?;
        if self.format != Format::Nd {
            write!(f, " {}", self.format.name())?;
        }
        Ok(())
    }
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    /// Integer.
    Int(i64),
    /// Float.
    Float(f32),
    /// String.
    Str(String),
    /// Integers.
    Ints(Vec<i64>),
    /// Floats.
    Floats(Vec<f32>),
    /// Strings.
    Strs(Vec<String>),
    /// A tensor.
    Tensor(Tensor),
    /// A flag.
    Bool(bool),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => write!(f, "{v:?}"),
            Attr::Str(s) => write!(f, "{s:?}"),
            Attr::Ints(v) => write!(f, "{v:?}"),
            Attr::Floats(v) => write!(f, "{v:?}"),
            Attr::Strs(v) => write!(f, "{v:?}"),
            Attr::Tensor(t) => f.write_str(&t.summary()),
            Attr::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A node id within its graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// One output of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    /// Producing node.
    pub node: NodeId,
    /// Its output index.
    pub output: u32,
}

/// A node.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Unique name within its graph.
    pub name: String,
    /// Operator type (`Conv`, `Data`, `Const`, `NetOutput`, `MapIndex`, `Case`, ...).
    pub op: String,
    /// Data inputs; `None` for an absent optional input.
    pub inputs: Vec<Option<Value>>,
    /// Output descriptors (filled by shape inference).
    pub outputs: Vec<TensorDesc>,
    /// Attributes, sorted by name.
    pub attrs: BTreeMap<String, Attr>,
    /// Nodes that must run before this one without a data edge.
    pub control_inputs: Vec<NodeId>,
    /// Names of subgraphs this node runs (the Case's branches).
    pub subgraphs: Vec<String>,
}

impl Node {
    /// A node with no attributes.
    pub fn new(
        name: impl Into<String>,
        op: impl Into<String>,
        inputs: Vec<Option<Value>>,
        outputs: Vec<TensorDesc>,
    ) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            inputs,
            outputs,
            attrs: BTreeMap::new(),
            control_inputs: Vec::new(),
            subgraphs: Vec::new(),
        }
    }

    /// Attribute lookup.
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.get(name)
    }

    /// Integer attribute.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.attrs.get(name) {
            Some(Attr::Int(v)) => Some(*v),
            _ => None,
        }
    }

    /// Integer-list attribute.
    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        match self.attrs.get(name) {
            Some(Attr::Ints(v)) => Some(v),
            _ => None,
        }
    }

    /// Float attribute.
    pub fn float(&self, name: &str) -> Option<f32> {
        match self.attrs.get(name) {
            Some(Attr::Float(v)) => Some(*v),
            _ => None,
        }
    }

    /// String attribute.
    pub fn string(&self, name: &str) -> Option<&str> {
        match self.attrs.get(name) {
            Some(Attr::Str(v)) => Some(v),
            _ => None,
        }
    }

    /// Tensor attribute (the Const node's value).
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        match self.attrs.get(name) {
            Some(Attr::Tensor(t)) => Some(t),
            _ => None,
        }
    }
}

/// A graph: nodes in topological order (every input refers to an earlier node).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    /// Name.
    pub name: String,
    /// The nodes; `NodeId(i)` is `nodes[i]`.
    pub nodes: Vec<Node>,
    /// Graph-level attributes (a gear model's root has GE's `_enable_dynamic_batch`).
    pub attrs: BTreeMap<String, Attr>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            nodes: Vec::new(),
            attrs: BTreeMap::new(),
        }
    }

    /// Appends a node and returns its id.
    pub fn add(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        NodeId(self.nodes.len() as u32 - 1)
    }

    /// The node with this id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    /// The node with this id, mutably.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.0 as usize]
    }

    /// The id of the node with this name.
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| NodeId(i as u32))
    }

    /// Ids of nodes of an operator type, in order.
    pub fn of_type(&self, op: &str) -> Vec<NodeId> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.op == op)
            .map(|(i, _)| NodeId(i as u32))
            .collect()
    }

    /// Descriptor of a value.
    pub fn desc(&self, v: Value) -> &TensorDesc {
        &self.node(v.node).outputs[v.output as usize]
    }

    /// For every value, the (node, input index) pairs that consume it.
    pub fn consumers(&self) -> BTreeMap<Value, Vec<(NodeId, usize)>> {
        let mut out: BTreeMap<Value, Vec<(NodeId, usize)>> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for (k, v) in n.inputs.iter().enumerate() {
                if let Some(v) = v {
                    out.entry(*v).or_default().push((NodeId(i as u32), k));
                }
            }
        }
        out
    }

    /// Checks that every edge points at an earlier node and an existing output, and names are
    /// unique; returns the first problem found.
    pub fn check(&self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !names.insert(n.name.as_str()) {
                return Err(format!(
                    "graph {}: node name `{}` is used twice",
                    self.name, n.name
                ));
            }
            for (k, v) in n.inputs.iter().enumerate() {
                let Some(v) = v else { continue };
                if v.node.0 as usize >= i {
                    return Err(format!(
                        "graph {}: node `{}` input {k} comes from a later node",
                        self.name, n.name
                    ));
                }
                if v.output as usize >= self.node(v.node).outputs.len() {
                    return Err(format!(
                        "graph {}: node `{}` input {k} reads output {} of `{}`, which has {}",
                        self.name,
                        n.name,
                        v.output,
                        self.node(v.node).name,
                        self.node(v.node).outputs.len()
                    ));
                }
            }
            for c in &n.control_inputs {
                if c.0 as usize >= i {
                    return Err(format!(
                        "graph {}: node `{}` has a control edge from a later node",
                        self.name, n.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// Removes nodes not needed by any `NetOutput` (and not side-effecting `Data`), renumbering
    /// edges. Returns how many were removed.
    pub fn remove_dead(&mut self) -> usize {
        removed_count(&self.remove_dead_remapped())
    }

    /// [`Graph::remove_dead`], returning each old node's new id (`None`: removed), for callers
    /// that hold node ids across the removal.
    pub fn remove_dead_remapped(&mut self) -> Vec<Option<NodeId>> {
        let mut live = vec![false; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            if n.op == "NetOutput" || n.op == "Data" {
                live[i] = true;
            }
        }
        for i in (0..self.nodes.len()).rev() {
            if !live[i] {
                continue;
            }
            for v in self.nodes[i].inputs.iter().flatten() {
                live[v.node.0 as usize] = true;
            }
            for c in &self.nodes[i].control_inputs {
                live[c.0 as usize] = true;
            }
        }
        self.retain_remapped(&live)
    }

    /// Keeps the nodes with `keep[i]` set, renumbering edges; edges from removed nodes become
    /// absent inputs and removed control edges are dropped. Returns how many were removed.
    pub fn retain(&mut self, keep: &[bool]) -> usize {
        removed_count(&self.retain_remapped(keep))
    }

    /// [`Graph::retain`], returning each old node's new id (`None`: removed).
    pub fn retain_remapped(&mut self, keep: &[bool]) -> Vec<Option<NodeId>> {
        let mut remap = vec![None; self.nodes.len()];
        let mut kept = Vec::new();
        for (i, n) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if keep.get(i).copied().unwrap_or(true) {
                remap[i] = Some(NodeId(kept.len() as u32));
                kept.push(n);
            }
        }
        for n in &mut kept {
            for v in &mut n.inputs {
                *v = v.and_then(|x| {
                    remap[x.node.0 as usize].map(|node| Value {
                        node,
                        output: x.output,
                    })
                });
            }
            n.control_inputs = n
                .control_inputs
                .iter()
                .filter_map(|c| remap[c.0 as usize])
                .collect();
        }
        self.nodes = kept;
        remap
    }

    /// The graph as text, one node per line, for dumps and golden tests.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        if self.attrs.is_empty() {
            let _ = writeln!(out, "graph {} {{", self.name);
        } else {
            let a: Vec<String> = self.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(out, "graph {} [{}] {{", self.name, a.join(", "));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let ins: Vec<String> = n
                .inputs
                .iter()
                .map(|v| match v {
                    Some(v) => format!("%{}:{}", v.node.0, v.output),
                    None => "_".to_string(),
                })
                .collect();
            let outs: Vec<String> = if n.attrs.contains_key(SHAPE_UNKNOWN) {
                vec!["?".to_string(); n.outputs.len()]
            } else {
                n.outputs.iter().map(|d| d.to_string()).collect()
            };
            let _ = write!(
                out,
                "  %{i} {} = {}({}) -> ({})",
                n.name,
                n.op,
                ins.join(", "),
                outs.join(", ")
            );
            if !n.control_inputs.is_empty() {
                let c: Vec<String> = n
                    .control_inputs
                    .iter()
                    .map(|c| format!("%{}", c.0))
                    .collect();
                let _ = write!(out, " ctrl[{}]", c.join(", "));
            }
            if !n.subgraphs.is_empty() {
                let _ = write!(out, " subgraphs[{}]", n.subgraphs.join(", "));
            }
            if !n.attrs.is_empty() {
                let a: Vec<String> = n.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = write!(out, " {{{}}}", a.join(", "));
            }
            out.push('\n');
        }
        out.push_str("}\n");
        out
    }
}

/// A model: the root graph and the subgraphs its nodes run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Model {
    /// Root graph.
    pub graph: Graph,
    /// Subgraphs in creation order (a node names the ones it runs).
    pub subgraphs: Vec<Graph>,
    /// The default-domain opset the model was written for.
    pub opset: i64,
}

impl Model {
    /// The subgraph with this name.
    pub fn subgraph(&self, name: &str) -> Option<&Graph> {
        self.subgraphs.iter().find(|g| g.name == name)
    }

    /// The whole model as text: the root graph, then each subgraph.
    pub fn dump(&self) -> String {
        let mut out = self.graph.dump();
        for g in &self.subgraphs {
            out.push('\n');
            out.push_str(&g.dump());
        }
        out
    }
}

/// How many nodes a remap (old id → new id) removed.
fn removed_count(remap: &[Option<NodeId>]) -> usize {
    remap.iter().filter(|r| r.is_none()).count()
}
