//! Shape inference: an op registry where each operator type registers its `verify`,
//! `infer_shape` and (for shape-computation ops) `fold` functions once, as metadef does, and the
//! engine that walks a graph in order, checks every node and derives its output descriptors.
//!
//! A failure names where (node, input or output index or attribute), why (expected vs got,
//! with the chain of nodes that produced each involved value and their shapes) and how to fix.
//! Values that can be computed at compile time (the Shape -> Gather -> Concat -> Reshape chains
//! PyTorch exports) are folded; [`fold_constants`] then replaces them by `Const` nodes.

use std::collections::BTreeMap;
use std::fmt;

use super::ir::{Attr, DataType, Graph, Node, NodeId, Tensor, TensorDesc, Value};
use super::symbolic::Dim;

/// What an operator's functions see of the node being checked.
pub struct OpCtx<'a> {
    /// The node (attributes, name).
    pub node: &'a Node,
    /// Descriptors of its inputs (`None` for an absent optional input).
    pub inputs: Vec<Option<&'a TensorDesc>>,
    /// Values of inputs known at compile time.
    pub values: Vec<Option<&'a Tensor>>,
    /// The model's opset.
    pub opset: i64,
}

impl<'a> OpCtx<'a> {
    /// Descriptor of a required input.
    pub fn input(&self, i: usize) -> Result<&'a TensorDesc, OpError> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| OpError::input(i, "a tensor", "nothing", "connect the input"))
    }

    /// Constant value of an input that must be known at compile time.
    pub fn value(&self, i: usize) -> Result<&'a Tensor, OpError> {
        self.values.get(i).copied().flatten().ok_or_else(|| {
            OpError::input(
                i,
                "a value known at compile time",
                "a value computed at run time",
                "feed this input from an initializer or a shape computation of static shapes",
            )
        })
    }

    /// Integer attribute with a default.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.node.int(name).unwrap_or(default)
    }

    /// Float attribute with a default.
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.node.float(name).unwrap_or(default)
    }

    /// Integer-list attribute (empty when absent).
    pub fn ints(&self, name: &str) -> Vec<i64> {
        self.node
            .ints(name)
            .map(<[i64]>::to_vec)
            .unwrap_or_default()
    }
}

/// What went wrong with one node, before the engine adds the node and the value chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    /// The input index at fault, if any.
    pub input: Option<usize>,
    /// The output index at fault, if any.
    pub output: Option<usize>,
    /// The attribute at fault, if any.
    pub attr: Option<String>,
    /// What was expected.
    pub expected: String,
    /// What was found.
    pub got: String,
    /// How to fix it.
    pub fix: String,
}

impl OpError {
    /// A problem with input `i`.
    pub fn input(
        i: usize,
        expected: impl Into<String>,
        got: impl Into<String>,
        fix: impl Into<String>,
    ) -> OpError {
        OpError {
            input: Some(i),
            output: None,
            attr: None,
            expected: expected.into(),
            got: got.into(),
            fix: fix.into(),
        }
    }

    /// A problem with an attribute.
    pub fn attr(
        name: &str,
        expected: impl Into<String>,
        got: impl Into<String>,
        fix: impl Into<String>,
    ) -> OpError {
        OpError {
            input: None,
            output: None,
            attr: Some(name.to_string()),
            expected: expected.into(),
            got: got.into(),
            fix: fix.into(),
        }
    }
}

/// An operator's compile-time evaluation.
pub type FoldFn = fn(&OpCtx<'_>) -> Result<Vec<Tensor>, OpError>;

/// The functions an operator type registers.
#[derive(Clone, Copy)]
pub struct OpDef {
    /// Operator type.
    pub op: &'static str,
    /// Fewest inputs.
    pub min_inputs: usize,
    /// Most inputs (`usize::MAX` for variadic).
    pub max_inputs: usize,
    /// Checks attributes and input types and ranks.
    pub verify: fn(&OpCtx<'_>) -> Result<(), OpError>,
    /// Derives the output descriptors.
    pub infer: fn(&OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError>,
    /// Computes the output values at compile time (shape computations). Called for every node
    /// of the type with whichever input values are known; returns no tensors when the outputs
    /// cannot be computed (a needed input value is unknown). `Shape` needs no input value.
    pub fold: Option<FoldFn>,
    /// Inputs whose values must be known at compile time and that a kernel takes as parameters
    /// (Reshape's shape, Slice's starts/ends/axes/steps, a reduction's axes): their constants
    /// are never stored in the weights.
    pub static_inputs: &'static [usize],
}

/// All registered operator types.
#[derive(Default)]
pub struct Registry {
    ops: BTreeMap<&'static str, OpDef>,
    /// Per operator, the first opset whose form is the one implemented (absent: 1).
    first_opset: BTreeMap<&'static str, i64>,
}

impl Registry {
    /// Registers an operator type (a later registration of the same type replaces it).
    pub fn register(&mut self, def: OpDef) {
        self.ops.insert(def.op, def);
    }

    /// Registers an operator type whose form before opset `since` differs from the one
    /// implemented: a model of an older opset using it is refused as unsupported.
    pub fn register_since(&mut self, def: OpDef, since: i64) {
        self.first_opset.insert(def.op, since);
        self.register(def);
    }

    /// The first opset whose form of `op` is the one implemented.
    pub fn first_opset(&self, op: &str) -> i64 {
        self.first_opset.get(op).copied().unwrap_or(1)
    }

    /// The definition of an operator type.
    pub fn get(&self, op: &str) -> Option<&OpDef> {
        self.ops.get(op)
    }

    /// Registered operator types, sorted.
    pub fn ops(&self) -> Vec<&'static str> {
        self.ops.keys().copied().collect()
    }
}

/// A shape-inference failure with its context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InferError {
    /// No operator of this type is registered.
    Unsupported {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// Opset of the model.
        opset: i64,
    },
    /// A node failed its checks.
    Node {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// The problem.
        error: OpError,
        /// For the input at fault (or each input when none is singled out): how its value was
        /// produced, newest first, as `name (Op) : desc`.
        chains: Vec<(usize, Vec<String>)>,
    },
}

impl fmt::Display for InferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InferError::Unsupported { node, op, opset } => {
                write!(
                    f,
                    "unsupported operator `{op}` at node `{node}` (opset {opset}); supported operators are listed by `gearsim ops`"
                )
            }
            InferError::Node {
                node,
                op,
                error,
                chains,
            } => {
                write!(f, "shape inference failed at node `{node}` ({op})")?;
                if let Some(i) = error.input {
                    write!(f, ", input {i}")?;
                }
                if let Some(o) = error.output {
                    write!(f, ", output {o}")?;
                }
                if let Some(a) = &error.attr {
                    write!(f, ", attribute `{a}`")?;
                }
                write!(f, ": expected {}, got {}", error.expected, error.got)?;
                for (i, chain) in chains {
                    write!(f, "\n  input {i} comes from: {}", chain.join(" <- "))?;
                }
                if !error.fix.is_empty() {
                    write!(f, "\n  how to fix: {}", error.fix)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for InferError {}

/// Values known at compile time, by producing output.
pub type Known = BTreeMap<Value, Tensor>;

/// How a value came to be: its producer and its producer's first inputs, up to `depth` steps.
fn chain(graph: &Graph, mut v: Value, depth: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..depth {
        let n = graph.node(v.node);
        let desc = n
            .outputs
            .get(v.output as usize)
            .map_or_else(|| "?".to_string(), |d| d.to_string());
        out.push(format!("{} ({}) : {desc}", n.name, n.op));
        match n.inputs.iter().flatten().next() {
            Some(next) => v = *next,
            None => break,
        }
    }
    out
}

/// Infers every node's outputs in order, folding compile-time values. `Data` and `Const`
/// outputs are taken as given; `NetOutput` has none.
pub fn infer_graph(
    graph: &mut Graph,
    registry: &Registry,
    opset: i64,
) -> Result<Known, InferError> {
    infer_graph_seeded(graph, registry, opset, Known::new())
}

/// Like [`infer_graph`], with values already known for some outputs (a gear branch's `Data`
/// nodes that stand for the root's constants).
pub fn infer_graph_seeded(
    graph: &mut Graph,
    registry: &Registry,
    opset: i64,
    seeds: Known,
) -> Result<Known, InferError> {
    let mut known = seeds;
    for i in 0..graph.nodes.len() {
        infer_node(graph, NodeId(i as u32), registry, opset, &mut known)?;
    }
    Ok(known)
}

/// Infers as much of the graph as it can: a node that fails is recorded with its error, and the
/// nodes that depend on it are skipped (recorded with `None`); their outputs keep whatever
/// descriptors they had. Used for the symbolic pass over all gears, which may legitimately stop
/// where a shape depends on a value only a gear makes static.
pub fn infer_graph_lenient(
    graph: &mut Graph,
    registry: &Registry,
    opset: i64,
) -> (Known, BTreeMap<NodeId, Option<InferError>>) {
    let mut known = Known::new();
    let mut failed: BTreeMap<NodeId, Option<InferError>> = BTreeMap::new();
    for i in 0..graph.nodes.len() {
        let id = NodeId(i as u32);
        let blocked = graph.nodes[i]
            .inputs
            .iter()
            .flatten()
            .any(|v| failed.contains_key(&v.node));
        if blocked {
            failed.insert(id, None);
        } else if let Err(e) = infer_node(graph, id, registry, opset, &mut known) {
            failed.insert(id, Some(e));
        }
    }
    (known, failed)
}

/// Checks one node and sets its output descriptors, adding any values it folds to `known`.
fn infer_node(
    graph: &mut Graph,
    id: NodeId,
    registry: &Registry,
    opset: i64,
    known: &mut Known,
) -> Result<(), InferError> {
    let i = id.0 as usize;
    let node = &graph.nodes[i];
    match node.op.as_str() {
        "Data" => return check_sizes(node, &node.outputs),
        "NetOutput" => return Ok(()),
        "Const" => {
            if let Some(Attr::Tensor(t)) = node.attrs.get("value") {
                let t = t.clone();
                graph.nodes[i].outputs = vec![TensorDesc::of(&t)];
                known.insert(
                    Value {
                        node: id,
                        output: 0,
                    },
                    t,
                );
            }
            return Ok(());
        }
        _ => {}
    }
    let def = registry
        .get(&node.op)
        .ok_or_else(|| InferError::Unsupported {
            node: node.name.clone(),
            op: node.op.clone(),
            opset,
        })?;
    let ctx = OpCtx {
        node,
        inputs: node
            .inputs
            .iter()
            .map(|v| v.map(|v| graph.desc(v)))
            .collect(),
        values: node
            .inputs
            .iter()
            .map(|v| v.and_then(|v| known.get(&v)))
            .collect(),
        opset,
    };
    let wrap = |error: OpError| {
        let picks: Vec<usize> = match error.input {
            Some(i) => vec![i],
            None => (0..node.inputs.len()).collect(),
        };
        let chains = picks
            .into_iter()
            .filter_map(|k| {
                node.inputs
                    .get(k)
                    .copied()
                    .flatten()
                    .map(|v| (k, chain(graph, v, 4)))
            })
            .collect();
        InferError::Node {
            node: node.name.clone(),
            op: node.op.clone(),
            error,
            chains,
        }
    };
    let since = registry.first_opset(&node.op);
    if opset < since {
        return Err(wrap(OpError {
            input: None,
            output: None,
            attr: None,
            expected: format!("the form {} has from opset {since} on", node.op),
            got: format!("opset {opset}"),
            fix: format!(
                "its opset-{opset} form is not supported: re-export the model with opset \
                 {since} or later"
            ),
        }));
    }
    let n_in = node.inputs.len();
    if n_in < def.min_inputs || n_in > def.max_inputs {
        let want = if def.max_inputs == usize::MAX {
            format!("at least {}", def.min_inputs)
        } else if def.min_inputs == def.max_inputs {
            def.min_inputs.to_string()
        } else {
            format!("{} to {}", def.min_inputs, def.max_inputs)
        };
        return Err(wrap(OpError {
            input: None,
            output: None,
            attr: None,
            expected: format!("{want} inputs"),
            got: format!("{n_in}"),
            fix: format!(
                "check the model's {} node against the ONNX operator definition",
                node.op
            ),
        }));
    }
    (def.verify)(&ctx).map_err(wrap)?;
    let outputs = (def.infer)(&ctx).map_err(wrap)?;
    // A node may declare more outputs than its operator has (a damaged file); that is only
    // harmless while nothing reads the extra ones.
    if let Some(k) = graph
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter().flatten())
        .filter(|v| v.node == id && v.output as usize >= outputs.len())
        .map(|v| v.output)
        .min()
    {
        return Err(wrap(OpError {
            input: None,
            output: Some(k as usize),
            attr: None,
            expected: format!("at most {} outputs", outputs.len()),
            got: format!("output {k} read by another node"),
            fix: format!(
                "check the model's {} node against the ONNX operator definition",
                node.op
            ),
        }));
    }
    check_sizes(node, &outputs)?;
    let folded = match def.fold {
        Some(fold) => fold(&ctx).map_err(wrap)?,
        None => Vec::new(),
    };
    graph.nodes[i].outputs = outputs;
    for (k, t) in folded.into_iter().enumerate() {
        known.insert(
            Value {
                node: id,
                output: k as u32,
            },
            t,
        );
    }
    Ok(())
}

/// The largest tensor the compiler plans, in bytes (1 TiB): far beyond any device's memory,
/// and small enough that the sizes, offsets and sums computed from tensor sizes downstream
/// (memory plan, kernel arguments, the `.om` description) cannot overflow.
pub const MAX_TENSOR_BYTES: u64 = 1 << 40;

/// The bytes a shape of `dtype` would have with its zero dims taken as 1, `None` on an
/// overflow or a negative dim. Bounding this rather than the true size (zero with a zero dim)
/// also bounds the loops a lowering runs over the other dims, as NumPy bounds an empty array's
/// shape.
pub fn extent_bytes(dtype: DataType, dims: &[i64]) -> Option<u64> {
    dims.iter().try_fold(dtype.size() as u64, |acc, &d| {
        u64::try_from(d)
            .ok()
            .and_then(|d| acc.checked_mul(d.max(1)))
    })
}

/// Fails when an output of `node` with a fully known shape is larger than
/// [`MAX_TENSOR_BYTES`] (a dim in a damaged model, a huge gear or `--input_shape` value), its
/// zero dims taken as 1 ([`extent_bytes`]).
fn check_sizes(node: &Node, outputs: &[TensorDesc]) -> Result<(), InferError> {
    for (k, d) in outputs.iter().enumerate() {
        let Some(dims) = d.shape.iter().map(Dim::fixed).collect::<Option<Vec<i64>>>() else {
            continue;
        };
        // `-1` marks a dim the options have not given yet (the graph before the gear pass).
        if dims.contains(&-1) {
            continue;
        }
        let bytes = extent_bytes(d.dtype, &dims);
        if bytes.is_some_and(|b| b <= MAX_TENSOR_BYTES) {
            continue;
        }
        return Err(InferError::Node {
            node: node.name.clone(),
            op: node.op.clone(),
            error: OpError {
                input: None,
                output: Some(k),
                attr: None,
                expected: format!(
                    "a tensor of at most {MAX_TENSOR_BYTES} bytes (1 TiB), zero dims counted as 1"
                ),
                got: match bytes {
                    Some(b) => format!("{d}, {b} bytes"),
                    None => format!("{d}, whose size overflows 64 bits or has a negative dim"),
                },
                fix: "check the model's dims and the --input_shape and gear values; no device \
                      holds a tensor this large"
                    .to_string(),
            },
            chains: Vec::new(),
        });
    }
    Ok(())
}

/// What [`fold_constants`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    /// Nodes replaced by constants.
    pub nodes: usize,
    /// Each old node's new id (`None`: removed): the removal renumbers the nodes, so ids held
    /// across the fold must go through it.
    pub remap: Vec<Option<NodeId>>,
}

/// Replaces every non-input node whose outputs are all known by `Const` nodes carrying the
/// values, then removes what no output needs.
pub fn fold_constants(graph: &mut Graph, known: &Known) -> Folded {
    let mut nodes = 0;
    for i in 0..graph.nodes.len() {
        let id = NodeId(i as u32);
        let n = &graph.nodes[i];
        if matches!(n.op.as_str(), "Data" | "Const" | "NetOutput") || n.outputs.len() != 1 {
            continue;
        }
        let Some(t) = known.get(&Value {
            node: id,
            output: 0,
        }) else {
            continue;
        };
        let mut c = Node::new(n.name.clone(), "Const", Vec::new(), vec![TensorDesc::of(t)]);
        c.attrs.insert("value".into(), Attr::Tensor(t.clone()));
        graph.nodes[i] = c;
        nodes += 1;
    }
    Folded {
        nodes,
        remap: graph.remove_dead_remapped(),
    }
}

/// Broadcasts two shapes with the numpy rules; `None` names the first conflicting axis.
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, (usize, Dim, Dim)> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let da = if k + a.len() >= n {
            a[k + a.len() - n].clone()
        } else {
            Dim::Fixed(1)
        };
        let db = if k + b.len() >= n {
            b[k + b.len() - n].clone()
        } else {
            Dim::Fixed(1)
        };
        let d = match (&da, &db) {
            (Dim::Fixed(1), _) => db.clone(),
            (_, Dim::Fixed(1)) => da.clone(),
            _ if da == db => da.clone(),
            _ => return Err((k, da, db)),
        };
        out.push(d);
    }
    Ok(out)
}
