//! The reference evaluator: what the device should have computed. It runs a graph on the host
//! with ONNX semantics, so tests can compare each gear branch's device outputs against it.
//!
//! ```text
//!   eval_model ─ root graph: Data (feeds by name), Const, MapIndex, Case ─┐
//!        │                                            Case ─▶ Batch_i ─▶ run_graph (Data from
//!        ▼                                                               _parent_node_index)
//!   eval_graph ─ run_graph: Data from feeds, Const from `value`, live nodes in order
//!        │
//!        ▼
//!   eval_node ─ registry verify + infer on the actual inputs (output shapes), then the kernel
//! ```
//!
//! Numerics, chosen so the oracle is independent of any device choice:
//! - Floats are computed in f64 from exactly widened inputs and rounded once to the output type
//!   (f64 -> f32 with Rust's `as`, f64 -> f16 by [`f64_to_f16_bits`], both round to nearest
//!   even), so + - * / and sqrt are correctly rounded and composite ops (Conv, LayerNorm, Gelu,
//!   Softmax) carry one rounding instead of one per step. Accumulation order is fixed (input
//!   order), so results are deterministic. `exp`/`tanh`/`powf` are the host's f64 functions and
//!   `erf` is fdlibm's (std has none), all far more precise than an f32 result needs.
//! - Integers are exact in i64 and wrap to their type, as numpy's fixed-width arithmetic does;
//!   integer division truncates toward zero and a zero divisor is an error, not a value.
//! - Cast: float -> integer truncates toward zero (saturating to i64, then wrapping to the type;
//!   NaN gives 0), anything -> bool is `!= 0`, integer -> float rounds once.
//! - Pooling follows the ONNX specification (= PyTorch): a window covers `o*s - pad_begin +
//!   k*d`; ceil_mode's extra windows are clipped to the input, and `count_include_pad` counts
//!   positions inside the explicit pads but never the ceil_mode overhang.
//! - Output shapes come from the operator registry's own shape inference run on the actual
//!   values, so the evaluator has no second copy of any shape rule; a node whose inputs fail the
//!   registry's checks is an error naming the node.
//!
//! Not evaluated (each a clear [`EvalError::Unsupported`]): `GetNext` / `GetDynamicDims` (sink
//! mode: evaluate the original graph instead), BatchNormalization's training-only outputs 3 and
//! 4, and `Case` outside [`eval_model`] (it needs the model's subgraphs).

use std::collections::BTreeMap;
use std::sync::Arc;

use gearsim_isa::aicpu_op::ElementwiseOp;
use gearsim_isa::numeric::{self, CastMode, RoundMode, Scalar};

use super::fusion::{
    BIAS_INPUT, FUSED_ACTIVATION, FUSED_AIPP, FUSED_BIAS, FUSED_RESIDUAL, RESIDUAL_INPUT,
};
use super::infer::{InferError, OpCtx, OpError, Registry};
use super::ir::{Attr, DataType, Graph, Model, Node, Tensor, TensorDesc, shape_values};
use super::ops;
use super::symbolic::Dim;

/// Why a graph or node could not be evaluated. Each variant says who is at fault: the
/// evaluator (`Unsupported`), the node's inputs (`Infer`, `Value`), the caller (`OutputDesc`,
/// `Feed`) or the graph (`Graph`); `Branch` wraps a failure inside a Case branch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// The evaluator does not implement this operator, attribute value or node kind.
    #[error("node `{node}` ({op}): {what} is not supported by the reference evaluator")]
    Unsupported {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// What is not supported.
        what: String,
    },
    /// The evaluated inputs fail the operator's checks (its shape inference on the values).
    #[error("evaluating node `{node}` ({op}): {error}")]
    Infer {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// The registry's diagnosis.
        error: InferError,
    },
    /// An input value makes the operation undefined, or an input tensor is malformed.
    #[error("node `{node}` ({op}): {problem}")]
    Value {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// Expected vs got.
        problem: String,
    },
    /// The output descriptors given to [`eval_node`] disagree with what the inputs give.
    #[error(
        "node `{node}` ({op}): output {index} is declared {declared}, but the inputs give {computed}"
    )]
    OutputDesc {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// The output.
        index: usize,
        /// What the caller declared.
        declared: String,
        /// What the evaluation produced.
        computed: String,
    },
    /// A feed is missing, names no input, or has the wrong type or shape.
    #[error("graph `{graph}`: input `{input}`: {problem}")]
    Feed {
        /// The graph.
        graph: String,
        /// The input's `Data` node name.
        input: String,
        /// Expected vs got.
        problem: String,
    },
    /// The graph itself is malformed (a dangling edge, no NetOutput, a missing subgraph).
    #[error("graph `{graph}`: {problem}")]
    Graph {
        /// The graph.
        graph: String,
        /// What is wrong.
        problem: String,
    },
    /// A failure inside the branch a Case ran.
    #[error("in branch `{branch}` (index {index}) of Case `{case}`: {error}")]
    Branch {
        /// The Case node.
        case: String,
        /// The branch subgraph.
        branch: String,
        /// The branch index the Case ran.
        index: usize,
        /// The failure.
        error: Box<EvalError>,
    },
}

/// Evaluates one node on input values (`None` for an absent optional input). The outputs'
/// shapes come from the registry's shape inference on the inputs; `output_descs` (usually the
/// node's recorded outputs) must agree with them in count, type and shape (a symbolic dim
/// agrees with any value in its interval, an unknown `-1` with anything).
pub fn eval_node(
    node: &Node,
    inputs: &[Option<&Tensor>],
    output_descs: &[TensorDesc],
    opset: i64,
) -> Result<Vec<Tensor>, EvalError> {
    let ev = Evaluator {
        registry: ops::standard(),
        opset,
        model: None,
    };
    let outs = ev.node(node, inputs)?;
    let err = |index: usize, declared: String, computed: String| EvalError::OutputDesc {
        node: node.name.clone(),
        op: node.op.clone(),
        index,
        declared,
        computed,
    };
    if outs.len() != output_descs.len() {
        return Err(err(
            output_descs.len(),
            format!("{} outputs", output_descs.len()),
            format!("{} outputs", outs.len()),
        ));
    }
    for (k, (t, d)) in outs.iter().zip(output_descs).enumerate() {
        if t.dtype != d.dtype || !shape_admits(&d.shape, &t.dims) {
            return Err(err(k, d.to_string(), TensorDesc::of(t).to_string()));
        }
    }
    Ok(outs)
}

/// Evaluates a graph without subgraphs: every `Data` node takes the feed of its name (all must
/// be fed, with the node's type and a shape its dims admit), `Const` nodes their `value`, the
/// nodes the `NetOutput` needs run in order, and the `NetOutput`'s inputs are returned in order.
pub fn eval_graph(
    graph: &Graph,
    feeds: &BTreeMap<String, Tensor>,
    opset: i64,
) -> Result<Vec<Tensor>, EvalError> {
    let ev = Evaluator {
        registry: ops::standard(),
        opset,
        model: None,
    };
    ev.run_graph(graph, Bind::Feeds(feeds))
}

/// Evaluates a model: its root graph as [`eval_graph`] does, plus the gear nodes of a compiled
/// model. `MapIndex` gives the lowest gear whose whole vector equals the query (-1 for none);
/// `Case` runs the subgraph its input 0 selects (out of range, -1 included, runs the last, as
/// the device's label switch does) with each branch `Data` taking the Case input at its
/// `_parent_node_index`. A root input with `_mbatch_origin_input_dims` accepts the shape of any
/// gear (its `-1` dims are free); the branch then checks the shapes are its gear's.
pub fn eval_model(
    model: &Model,
    feeds: &BTreeMap<String, Tensor>,
) -> Result<Vec<Tensor>, EvalError> {
    let ev = Evaluator {
        registry: ops::standard(),
        opset: model.opset,
        model: Some(model),
    };
    ev.run_graph(&model.graph, Bind::Feeds(feeds))
}

/// Where a graph's `Data` nodes get their values.
#[derive(Clone, Copy)]
enum Bind<'a> {
    /// By node name (a root graph).
    Feeds(&'a BTreeMap<String, Tensor>),
    /// By `_parent_node_index` from the inputs of the Case running the graph.
    Parent(&'a [Option<Tensor>]),
}

/// The evaluator's state: the registry (built once per call) and what it evaluates.
struct Evaluator<'m> {
    registry: Registry,
    opset: i64,
    model: Option<&'m Model>,
}

impl Evaluator<'_> {
    /// Runs a graph and returns its NetOutput's inputs.
    fn run_graph(&self, graph: &Graph, bind: Bind<'_>) -> Result<Vec<Tensor>, EvalError> {
        let gerr = |problem: String| EvalError::Graph {
            graph: graph.name.clone(),
            problem,
        };
        let outputs: Vec<usize> = (0..graph.nodes.len())
            .filter(|i| graph.nodes[*i].op == "NetOutput")
            .collect();
        let [net] = outputs.as_slice() else {
            return Err(gerr(format!(
                "expected exactly one NetOutput, found {}",
                outputs.len()
            )));
        };
        // Only what the NetOutput needs runs; every Data node is still bound, so a missing
        // feed is reported even for an unused input.
        let mut live = vec![false; graph.nodes.len()];
        live[*net] = true;
        for i in (0..graph.nodes.len()).rev() {
            if !live[i] {
                continue;
            }
            for (k, v) in graph.nodes[i].inputs.iter().enumerate() {
                let Some(v) = v else { continue };
                let p = v.node.0 as usize;
                if p >= i {
                    return Err(gerr(format!(
                        "node `{}` input {k} comes from node {p}, which is not earlier",
                        graph.nodes[i].name
                    )));
                }
                live[p] = true;
            }
        }
        // Remaining reads of each node's outputs, so values are dropped after their last use.
        let mut uses = vec![0usize; graph.nodes.len()];
        for (i, n) in graph.nodes.iter().enumerate() {
            if live[i] {
                for v in n.inputs.iter().flatten() {
                    uses[v.node.0 as usize] += 1;
                }
            }
        }
        let mut values: Vec<Vec<Tensor>> = vec![Vec::new(); graph.nodes.len()];
        let mut result = Vec::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            if node.op == "Data" {
                values[i] = vec![bind_data(graph, node, bind)?];
                continue;
            }
            if !live[i] {
                continue;
            }
            let mut inputs: Vec<Option<Tensor>> = Vec::with_capacity(node.inputs.len());
            for (k, v) in node.inputs.iter().enumerate() {
                let Some(v) = v else {
                    inputs.push(None);
                    continue;
                };
                let t = values[v.node.0 as usize]
                    .get(v.output as usize)
                    .ok_or_else(|| {
                        gerr(format!(
                            "node `{}` input {k} reads output {} of `{}`, which has {}",
                            node.name,
                            v.output,
                            graph.nodes[v.node.0 as usize].name,
                            values[v.node.0 as usize].len()
                        ))
                    })?;
                inputs.push(Some(t.clone()));
            }
            let outs = match node.op.as_str() {
                "NetOutput" => {
                    result = inputs
                        .iter()
                        .enumerate()
                        .map(|(k, t)| {
                            t.clone().ok_or_else(|| {
                                gerr(format!(
                                    "NetOutput `{}` input {k} is not connected",
                                    node.name
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    Vec::new()
                }
                "Case" if self.model.is_some() => self.case(node, &inputs)?,
                _ => {
                    let refs: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
                    self.node(node, &refs)?
                }
            };
            values[i] = outs;
            for v in node.inputs.iter().flatten() {
                let p = v.node.0 as usize;
                uses[p] -= 1;
                if uses[p] == 0 {
                    values[p] = Vec::new();
                }
            }
        }
        // A feed no input takes is a caller's mistake (a misspelt name, usually); it is reported
        // after the run so a graph that cannot run at all (sink mode) says why first.
        if let Bind::Feeds(feeds) = bind {
            for name in feeds.keys() {
                if !graph
                    .nodes
                    .iter()
                    .any(|n| n.op == "Data" && &n.name == name)
                {
                    return Err(EvalError::Feed {
                        graph: graph.name.clone(),
                        input: name.clone(),
                        problem: "is fed but the graph has no Data node of that name".into(),
                    });
                }
            }
        }
        Ok(result)
    }

    /// Runs the branch a Case selects and returns the Case's outputs.
    fn case(&self, node: &Node, inputs: &[Option<Tensor>]) -> Result<Vec<Tensor>, EvalError> {
        let model = self
            .model
            .ok_or_else(|| unsupported(node, "Case without a model"))?;
        let count = node.subgraphs.len();
        if count == 0 {
            return Err(value_err(node, "the Case names no branch subgraphs".into()));
        }
        let pred = inputs
            .first()
            .and_then(Option::as_ref)
            .ok_or_else(|| value_err(node, "input 0 (the branch index) is absent".into()))?;
        let raw = pred.to_i64s();
        let [index] = raw.as_slice() else {
            return Err(value_err(
                node,
                format!(
                    "input 0 (the branch index) to hold one value, got {}",
                    pred.summary()
                ),
            ));
        };
        // The device's label switch reads the index as unsigned and clamps anything at or past
        // the branch count (MapIndex's -1 included) to the last branch.
        let branch = usize::try_from(*index)
            .ok()
            .filter(|b| *b < count)
            .unwrap_or(count - 1);
        let name = &node.subgraphs[branch];
        let sub = model.subgraph(name).ok_or_else(|| EvalError::Graph {
            graph: model.graph.name.clone(),
            problem: format!(
                "Case `{}` runs subgraph `{name}`, which the model lacks",
                node.name
            ),
        })?;
        let wrap = |error: EvalError| EvalError::Branch {
            case: node.name.clone(),
            branch: name.clone(),
            index: branch,
            error: Box::new(error),
        };
        let outs = self.run_graph(sub, Bind::Parent(inputs)).map_err(wrap)?;
        // The branch NetOutput says which Case output each of its inputs is.
        let net = sub.nodes.iter().find(|n| n.op == "NetOutput");
        let order: Vec<i64> = match net.and_then(|n| n.ints("_parent_node_index")) {
            Some(p) => p.to_vec(),
            None => (0..outs.len() as i64).collect(),
        };
        let n_out = node.outputs.len();
        if order.len() != outs.len() || outs.len() != n_out {
            return Err(wrap(EvalError::Graph {
                graph: sub.name.clone(),
                problem: format!(
                    "the branch returns {} values (parent indexes {order:?}) for a Case with {n_out} outputs",
                    outs.len()
                ),
            }));
        }
        let mut placed: Vec<Option<Tensor>> = vec![None; n_out];
        for (t, p) in outs.into_iter().zip(&order) {
            match usize::try_from(*p).ok().and_then(|p| placed.get_mut(p)) {
                Some(slot @ None) => *slot = Some(t),
                _ => {
                    return Err(wrap(EvalError::Graph {
                        graph: sub.name.clone(),
                        problem: format!(
                            "NetOutput `_parent_node_index` {order:?} is not a permutation of the Case's {n_out} outputs"
                        ),
                    }));
                }
            }
        }
        Ok(placed.into_iter().flatten().collect())
    }

    /// Evaluates one operator node on its input values.
    /// A node's outputs, with the activation the fusion pass folded into it applied to its
    /// first output.
    fn node(&self, node: &Node, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, EvalError> {
        // A fused AIPP converts the image (input 0) before the convolution reads it, to the
        // f16 the Aipp node gave.
        let image;
        let mut with_image: Vec<Option<&Tensor>>;
        let inputs = if node.int(FUSED_AIPP).is_some() {
            let Some(Some(x)) = inputs.first() else {
                return Err(value_err(node, "the fused AIPP's image is missing".into()));
            };
            image = crate::aipp::evaluate(node, x, DataType::F16)
                .map_err(|e| value_err(node, format!("the fused AIPP: {e}")))?;
            with_image = inputs.to_vec();
            with_image[0] = Some(&image);
            &with_image[..]
        } else {
            inputs
        };
        let residual = node.int(FUSED_RESIDUAL).is_some();
        let bias = node.int(FUSED_BIAS).is_some();
        let own = if residual {
            &inputs[..RESIDUAL_INPUT.min(inputs.len())]
        } else if bias {
            &inputs[..BIAS_INPUT.min(inputs.len())]
        } else {
            inputs
        };
        let mut outs = if bias {
            self.matmul_with_bias(node, own, inputs.get(BIAS_INPUT).copied().flatten())?
        } else {
            self.unfused(node, own)?
        };
        if residual {
            // The kernel adds the residual to its output as an f16 Add would, before the
            // activation.
            let r = inputs.get(RESIDUAL_INPUT).copied().flatten();
            let (Some(r), Some(first)) = (r, outs.first()) else {
                return Err(value_err(
                    node,
                    "the fused residual input is missing".into(),
                ));
            };
            let add = Node::new(
                format!("{}/Add", node.name),
                "Add",
                vec![None, None],
                Vec::new(),
            );
            let y = self.unfused(&add, &[Some(first), Some(r)])?;
            outs[0] = y
                .into_iter()
                .next()
                .ok_or_else(|| value_err(node, "the fused Add gave no output".into()))?;
        }
        if let (Some(act), Some(first)) = (node.string(FUSED_ACTIVATION), outs.first()) {
            let absorbed = Node::new(format!("{}/{act}", node.name), act, vec![None], Vec::new());
            let y = self.unfused(&absorbed, &[Some(first)])?;
            outs[0] = y
                .into_iter()
                .next()
                .ok_or_else(|| value_err(node, format!("the fused {act} gave no output")))?;
        }
        Ok(outs)
    }

    /// A MatMul with a fused bias: the product in f32, the bias added and the sum rounded
    /// once to the output's type, as the GEMM kernel adds the bias in its f32 accumulator.
    fn matmul_with_bias(
        &self,
        node: &Node,
        own: &[Option<&Tensor>],
        bias: Option<&Tensor>,
    ) -> Result<Vec<Tensor>, EvalError> {
        let (Some(bias), [Some(a), Some(b)]) = (bias, own) else {
            return Err(value_err(
                node,
                "a MatMul with a fused bias needs A, B and the bias".into(),
            ));
        };
        let out_type = a.dtype;
        let wide = |t: &Tensor| encode_f64(DataType::F32, t.dims.clone(), &t.to_f64s());
        let (a32, b32) = (wide(a), wide(b));
        let mut plain = node.clone();
        plain.attrs.remove(FUSED_BIAS);
        let product = self.unfused(&plain, &[Some(&a32), Some(&b32)])?;
        let Some(first) = product.first() else {
            return Err(value_err(node, "the MatMul gave no output".into()));
        };
        let bv = bias.to_f64s();
        if bv.is_empty() || first.dims.last().copied() != Some(bv.len() as i64) {
            return Err(value_err(
                node,
                format!(
                    "the fused bias has {} values, but the product's last axis is {:?}",
                    bv.len(),
                    first.dims.last()
                ),
            ));
        }
        let sum: Vec<f64> = first
            .to_f64s()
            .iter()
            .enumerate()
            .map(|(i, v)| v + bv[i % bv.len()])
            .collect();
        Ok(vec![encode_f64(out_type, first.dims.clone(), &sum)])
    }

    fn unfused(&self, node: &Node, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, EvalError> {
        for (i, t) in inputs.iter().enumerate() {
            if let Some(t) = t {
                check_tensor(t).map_err(|p| value_err(node, format!("input {i}: {p}")))?;
            }
        }
        match node.op.as_str() {
            "Const" => match node.tensor("value") {
                Some(t) => {
                    check_tensor(t).map_err(|p| value_err(node, format!("value: {p}")))?;
                    Ok(vec![t.clone()])
                }
                None => Err(value_err(node, "a Const without a `value` tensor".into())),
            },
            "Data" | "NetOutput" => Err(unsupported(
                node,
                "evaluating a graph input or output as an operator (run the graph with eval_graph)",
            )),
            "MapIndex" => map_index(node, inputs).map(|t| vec![t]),
            "Case" => Err(unsupported(
                node,
                "a Case outside eval_model (it runs the model's `Batch_i` subgraphs)",
            )),
            "GetNext" | "GetDynamicDims" => Err(unsupported(
                node,
                "GetNext sink mode (its inputs come from a data queue); evaluate the original \
                 graph with eval_graph instead",
            )),
            op => {
                let Some(def) = self.registry.get(op) else {
                    return Err(unsupported(node, format!("operator `{op}`")));
                };
                let descs: Vec<Option<TensorDesc>> =
                    inputs.iter().map(|t| t.map(TensorDesc::of)).collect();
                let ctx = OpCtx {
                    node,
                    inputs: descs.iter().map(Option::as_ref).collect(),
                    values: inputs.to_vec(),
                    opset: self.opset,
                };
                let infer_err = |error: OpError| EvalError::Infer {
                    node: node.name.clone(),
                    op: node.op.clone(),
                    error: InferError::Node {
                        node: node.name.clone(),
                        op: node.op.clone(),
                        error,
                        chains: Vec::new(),
                    },
                };
                let n = inputs.len();
                if n < def.min_inputs || n > def.max_inputs {
                    return Err(value_err(
                        node,
                        format!(
                            "{n} inputs, but {op} takes {} to {}",
                            def.min_inputs,
                            if def.max_inputs == usize::MAX {
                                "any number".to_string()
                            } else {
                                def.max_inputs.to_string()
                            }
                        ),
                    ));
                }
                (def.verify)(&ctx).map_err(infer_err)?;
                let out_descs = (def.infer)(&ctx).map_err(infer_err)?;
                let mut outs = Vec::with_capacity(out_descs.len());
                for (k, d) in out_descs.iter().enumerate() {
                    let dims = shape_values(&d.shape)
                        .filter(|v| v.iter().all(|x| *x >= 0))
                        .ok_or_else(|| {
                            value_err(node, format!("output {k} to have a known shape, got {d}"))
                        })?;
                    outs.push(Out {
                        dtype: d.dtype,
                        dims,
                    });
                }
                if op == "Constant" {
                    let folded = match def.fold {
                        Some(fold) => fold(&ctx).map_err(infer_err)?,
                        None => Vec::new(),
                    };
                    return match folded.into_iter().next() {
                        Some(t) => Ok(vec![t]),
                        None => Err(unsupported(node, "this Constant's value".to_string())),
                    };
                }
                let k = Kernel {
                    node,
                    inputs,
                    outs: &outs,
                    opset: self.opset,
                };
                k.run(op)
            }
        }
    }
}

/// Binds one `Data` node and checks its type and shape.
fn bind_data(graph: &Graph, node: &Node, bind: Bind<'_>) -> Result<Tensor, EvalError> {
    let ferr = |problem: String| EvalError::Feed {
        graph: graph.name.clone(),
        input: node.name.clone(),
        problem,
    };
    let Some(desc) = node.outputs.first() else {
        return Err(ferr("the Data node declares no output".into()));
    };
    let t = match bind {
        Bind::Feeds(feeds) => feeds
            .get(&node.name)
            .cloned()
            .ok_or_else(|| ferr(format!("no feed for this input ({desc})")))?,
        Bind::Parent(inputs) => {
            let p = node.int("_parent_node_index").ok_or_else(|| {
                ferr(
                    "a branch Data node without `_parent_node_index` (which Case input it is)"
                        .into(),
                )
            })?;
            usize::try_from(p)
                .ok()
                .and_then(|p| inputs.get(p))
                .cloned()
                .flatten()
                .ok_or_else(|| {
                    ferr(format!(
                        "reads Case input {p}, but the Case has {} inputs (or that one is absent)",
                        inputs.len()
                    ))
                })?
        }
    };
    check_tensor(&t).map_err(|p| ferr(format!("the feed is malformed: {p}")))?;
    // A root input of a gear model declares its largest gear; any gear's shape is admitted
    // through the dims the user left free. Branch inputs (with a parent index) are strict.
    let origin = node
        .ints("_mbatch_origin_input_dims")
        .filter(|_| node.int("_parent_node_index").is_none());
    let declared: Vec<Dim> = match origin {
        Some(d) => d.iter().map(|v| Dim::Fixed(*v)).collect(),
        None => desc.shape.clone(),
    };
    if t.dtype != desc.dtype || !shape_admits(&declared, &t.dims) {
        let shape: Vec<String> = declared.iter().map(ToString::to_string).collect();
        return Err(ferr(format!(
            "expected {}[{}] (a -1 or symbolic dim admits any size in its range), got {}",
            desc.dtype.name(),
            shape.join(","),
            TensorDesc::of(&t)
        )));
    }
    Ok(t)
}

/// Whether declared dims admit actual sizes: same rank, fixed dims equal, a negative (unknown)
/// dim anything, a symbolic dim any value in its interval.
fn shape_admits(declared: &[Dim], dims: &[i64]) -> bool {
    declared.len() == dims.len()
        && declared.iter().zip(dims).all(|(d, v)| match d {
            Dim::Fixed(x) => *x < 0 || x == v,
            Dim::Sym(_) => {
                let (lo, hi) = d.interval();
                lo <= *v && *v <= hi
            }
        })
}

/// Checks a tensor's bytes against its dims.
fn check_tensor(t: &Tensor) -> Result<(), String> {
    let n = count(&t.dims).ok_or_else(|| format!("invalid dims {:?}", t.dims))?;
    if t.data.len() != n * t.dtype.size() {
        return Err(format!(
            "a {} tensor of dims {:?} holds {} bytes instead of {}",
            t.dtype.name(),
            t.dims,
            t.data.len(),
            n * t.dtype.size()
        ));
    }
    Ok(())
}

fn unsupported(node: &Node, what: impl Into<String>) -> EvalError {
    EvalError::Unsupported {
        node: node.name.clone(),
        op: node.op.clone(),
        what: what.into(),
    }
}

fn value_err(node: &Node, problem: String) -> EvalError {
    EvalError::Value {
        node: node.name.clone(),
        op: node.op.clone(),
        problem,
    }
}

/// MapIndex: the lowest gear (row of the gear-major table) equal to the query, else -1.
fn map_index(node: &Node, inputs: &[Option<&Tensor>]) -> Result<Tensor, EvalError> {
    let (Some(Some(query)), Some(Some(table))) = (inputs.first(), inputs.get(1)) else {
        return Err(value_err(
            node,
            "inputs 0 (the gear vector) and 1 (the gear table) to be connected".into(),
        ));
    };
    if query.dtype.is_float() || table.dtype.is_float() {
        return Err(value_err(
            node,
            format!(
                "integer gear vector and table, got {} and {}",
                query.dtype.name(),
                table.dtype.name()
            ),
        ));
    }
    let q = query.to_i64s();
    let tab = table.to_i64s();
    if q.is_empty() || tab.len() % q.len() != 0 {
        return Err(value_err(
            node,
            format!(
                "a table of whole gears: {} values for a gear vector of {}",
                tab.len(),
                q.len()
            ),
        ));
    }
    // The graph's table is gear-major whatever `_gear_table_layout` says: the layout is how
    // the device copy is arranged, which the lowering produces from this constant.
    let hit = tab
        .chunks_exact(q.len())
        .position(|gear| gear == q.as_slice())
        .map_or(-1, |g| g as i32);
    Ok(Tensor::from_i32s(Vec::new(), &[hit]))
}

/// Type and dims of an output, as the registry inferred them from the inputs.
struct Out {
    dtype: DataType,
    dims: Vec<i64>,
}

/// Element count of dims, `None` on a negative dim or overflow.
fn count(dims: &[i64]) -> Option<usize> {
    let n = dims.iter().try_fold(
        1i64,
        |acc, d| if *d < 0 { None } else { acc.checked_mul(*d) },
    )?;
    usize::try_from(n).ok()
}

/// Element count of dims already known to be valid (registry-inferred or checked tensors).
fn numel(dims: &[i64]) -> usize {
    dims.iter().map(|d| *d as usize).product()
}

/// Row-major strides.
fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * dims[k + 1];
    }
    s
}

/// For every element of an output of `dims` (row-major), the source index `base + Σ i_k *
/// step_k`. Steps may be zero (broadcast) or negative (reversed slices).
fn affine_index(dims: &[i64], base: i64, steps: &[i64]) -> Vec<usize> {
    let n = numel(dims);
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut idx = vec![0i64; dims.len()];
    let mut cur = base;
    for _ in 0..n {
        out.push(cur as usize);
        for k in (0..dims.len()).rev() {
            idx[k] += 1;
            cur += steps[k];
            if idx[k] < dims[k] {
                break;
            }
            cur -= steps[k] * dims[k];
            idx[k] = 0;
        }
    }
    out
}

/// For every element of the broadcast result `out`, the index into a source of `dims` (right-
/// aligned numpy broadcasting; the registry has checked the shapes broadcast).
fn broadcast_index(out: &[i64], dims: &[i64]) -> Vec<usize> {
    let src = strides(dims);
    let lead = out.len() - dims.len();
    let steps: Vec<i64> = (0..out.len())
        .map(|k| {
            if k < lead || dims[k - lead] == 1 {
                0
            } else {
                src[k - lead]
            }
        })
        .collect();
    affine_index(out, 0, &steps)
}

/// A tensor of `dims` whose element `k` is element `index[k]` of `src` (any type).
fn take(src: &Tensor, dims: Vec<i64>, index: &[usize]) -> Tensor {
    let size = src.dtype.size();
    let mut b = Vec::with_capacity(index.len() * size);
    for i in index {
        b.extend_from_slice(&src.data[i * size..(i + 1) * size]);
    }
    Tensor {
        dtype: src.dtype,
        dims,
        data: Arc::new(b),
    }
}

/// Encodes f64 values as `dtype`: one rounding to a float type; truncation toward zero
/// (saturating to i64, NaN to 0) then wrapping to an integer type; `!= 0` to bool (the
/// conversions of [`numeric`], not saturating float8).
pub(crate) fn encode_f64(dtype: DataType, dims: Vec<i64>, v: &[f64]) -> Tensor {
    encode_scalars(dtype, dims, v.iter().map(|x| Scalar::Float(*x)))
}

/// Encodes i64 values as `dtype`: wrapping to an integer type, `!= 0` to bool, one rounding
/// to a float type.
fn encode_i64(dtype: DataType, dims: Vec<i64>, v: &[i64]) -> Tensor {
    encode_scalars(dtype, dims, v.iter().map(|x| Scalar::Int(i128::from(*x))))
}

fn encode_scalars(
    dtype: DataType,
    dims: Vec<i64>,
    v: impl ExactSizeIterator<Item = Scalar>,
) -> Tensor {
    let mode = CastMode {
        saturate: false,
        round: RoundMode::Up,
    };
    let mut b = Vec::with_capacity(v.len() * dtype.size());
    v.for_each(|x| numeric::encode(dtype, x, mode, &mut b));
    Tensor {
        dtype,
        dims,
        data: Arc::new(b),
    }
}

pub use gearsim_isa::numeric::f64_to_f16_bits;

/// Elements as f64 (floats exactly, integers as values).
fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_f64s()
}

/// One operator evaluation: the node, its inputs, and its inferred outputs.
struct Kernel<'a> {
    node: &'a Node,
    inputs: &'a [Option<&'a Tensor>],
    outs: &'a [Out],
    opset: i64,
}

impl Kernel<'_> {
    /// Dispatches on the operator type.
    fn run(&self, op: &str) -> Result<Vec<Tensor>, EvalError> {
        let one = |t: Tensor| Ok(vec![t]);
        // u64 values beyond i64's range: the AI CPU's element-wise code computes in i128.
        let wide = self
            .inputs
            .iter()
            .flatten()
            .any(|t| t.dtype == DataType::U64);
        let fmod = self.int("fmod", 0) == 1;
        if let Some(e) = ElementwiseOp::of_node(op, fmod).filter(|_| wide || op == "Mod") {
            return one(self.on_aicpu_code(e)?);
        }
        match op {
            "Sqrt" => one(self.unary_f(f64::sqrt)?),
            "Erf" => one(self.unary_f(erf)?),
            "Sigmoid" => one(self.unary_f(|x| 1.0 / (1.0 + (-x).exp()))?),
            "Tanh" => one(self.unary_f(f64::tanh)?),
            "Relu" => one(self.relu()?),
            "Gelu" => one(self.gelu()?),
            "Exp" => one(self.unary_f(f64::exp)?),
            "Round" => one(self.unary_f(f64::round_ties_even)?),
            "Sign" => one(self.signed_unary(
                |x| {
                    if x > 0.0 {
                        1.0
                    } else if x < 0.0 {
                        -1.0
                    } else {
                        x
                    }
                },
                i64::signum,
            )?),
            "IsNaN" => {
                let v: Vec<i64> = f64s(self.input(0)?)
                    .iter()
                    .map(|x| i64::from(x.is_nan()))
                    .collect();
                one(self.out_i64(0, &v)?)
            }
            "IsInf" => {
                let (pos, neg) = (
                    self.int("detect_positive", 1) != 0,
                    self.int("detect_negative", 1) != 0,
                );
                let v: Vec<i64> = f64s(self.input(0)?)
                    .iter()
                    .map(|x| {
                        i64::from((pos && *x == f64::INFINITY) || (neg && *x == f64::NEG_INFINITY))
                    })
                    .collect();
                one(self.out_i64(0, &v)?)
            }
            "PRelu" => {
                let (x, slope) = (f64s(self.input(0)?), f64s(self.input(1)?));
                let maps = self.broadcast_maps(&[0, 1])?;
                let v: Vec<f64> = maps[0]
                    .iter()
                    .zip(&maps[1])
                    .map(|(i, j)| {
                        if x[*i] < 0.0 {
                            x[*i] * slope[*j]
                        } else {
                            x[*i]
                        }
                    })
                    .collect();
                one(self.out_f64(0, &v)?)
            }
            "Sum" | "Mean" | "Max" | "Min" => one(self.variadic(op)?),
            "Log" => one(self.unary_f(f64::ln)?),
            "Reciprocal" => one(self.unary_f(|x| 1.0 / x)?),
            "Floor" => one(self.unary_f(f64::floor)?),
            "Ceil" => one(self.unary_f(f64::ceil)?),
            "Abs" => one(self.signed_unary(f64::abs, i64::wrapping_abs)?),
            "Neg" => one(self.signed_unary(|x| -x, i64::wrapping_neg)?),
            "Softplus" => one(self.unary_f(|x| x.max(0.0) + (-x.abs()).exp().ln_1p())?),
            "Softsign" => one(self.unary_f(|x| x / (1.0 + x.abs()))?),
            "HardSwish" => one(self.unary_f(|x| x * (x / 6.0 + 0.5).clamp(0.0, 1.0))?),
            "LeakyRelu" | "Elu" | "Selu" | "Celu" | "HardSigmoid" | "ThresholdedRelu" => {
                let (a, b) = crate::ops::activation_attrs(self.node).unwrap_or_default();
                let (a, b) = (f64::from(a), f64::from(b));
                let f = |x: f64| match op {
                    "LeakyRelu" => {
                        if x < 0.0 {
                            a * x
                        } else {
                            x
                        }
                    }
                    "Elu" => {
                        if x < 0.0 {
                            a * x.exp_m1()
                        } else {
                            x
                        }
                    }
                    "Selu" => b * if x <= 0.0 { a * x.exp_m1() } else { x },
                    "Celu" => x.max(0.0) + (a * (x / a).exp_m1()).min(0.0),
                    "HardSigmoid" => (a * x + b).clamp(0.0, 1.0),
                    _ => {
                        if x > a {
                            x
                        } else {
                            0.0
                        }
                    }
                };
                one(self.unary_f(f)?)
            }
            "Clip" => one(self.clip()?),
            "Add" | "Sub" | "Mul" | "Div" => one(self.arith(op)?),
            "Pow" => one(self.pow()?),
            "And" | "Or" | "Xor" => one(self.logic(op)?),
            "Range" => {
                let v: Vec<f64> = (0..3)
                    .map(|i| Ok(f64s(self.input(i)?)[0]))
                    .collect::<Result<_, EvalError>>()?;
                let t = crate::ops::range_tensor(self.input(0)?.dtype, [v[0], v[1], v[2]])
                    .map_err(|e| self.err(format!("Range: {}", e.got)))?;
                one(t)
            }
            "Resize" => one(self.resize()?),
            "ConvTranspose" => one(self.conv_transpose()?),
            "GatherElements" | "GatherND" => {
                let m = self
                    .parsed(crate::ops::gather_map)?
                    .ok_or_else(|| self.err(format!("{op}: the indices are not known")))?;
                one(crate::ops::take_rows(self.input(0)?, &m))
            }
            "InstanceNormalization" | "GroupNormalization" => one(self.group_norm()?),
            "Trilu" => {
                let k = self.opt(1).map_or(0, |t| t.to_i64s()[0]);
                one(crate::ops::trilu_tensor(
                    self.input(0)?,
                    self.int("upper", 1) != 0,
                    k,
                ))
            }
            "Size" => {
                let n = self.input(0)?.dims.iter().product::<i64>();
                one(self.out_i64(0, &[n])?)
            }
            "ConstantOfShape" => {
                let v = crate::ops::constant_of_shape_value(self.node)
                    .map_err(|e| self.err(format!("ConstantOfShape: {}", e.got)))?;
                let out = self.out(0)?;
                let n = out.dims.iter().product::<i64>().max(0) as usize;
                one(Tensor {
                    dtype: v.dtype,
                    dims: out.dims.clone(),
                    data: v.data.repeat(n).into(),
                })
            }
            "Not" => {
                let v: Vec<i64> = self
                    .input(0)?
                    .to_i64s()
                    .iter()
                    .map(|v| i64::from(*v == 0))
                    .collect();
                one(self.out_i64(0, &v)?)
            }
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
                one(self.compare(op)?)
            }
            "Where" => one(self.where_()?),
            "Cast" | "CastLike" => one(self.cast()?),
            "Identity" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => one(self.relabel()?),
            "Transpose" => one(self.transpose()?),
            "Concat" => one(self.concat()?),
            "Slice" => one(self.slice()?),
            "Split" => self.split(),
            "Gather" => one(self.gather()?),
            "Expand" => one(self.expand()?),
            "Shape" => one(self.shape()?),
            "Conv" => one(self.conv()?),
            "MaxPool" => self.pool(true),
            "AveragePool" => self.pool(false),
            "GlobalAveragePool" => one(self.global_average_pool()?),
            "MatMul" => one(self.matmul()?),
            "MatMulInteger" => one(self.matmul_integer()?),
            "Gemm" => one(self.gemm()?),
            "BatchNormalization" => self.batch_norm(),
            "LayerNormalization" => self.layer_norm(),
            "Softmax" => one(self.softmax()?),
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" => one(self.reduce(op)?),
            crate::aipp::OP => {
                let x = self.inputs.first().copied().flatten().ok_or_else(|| {
                    value_err(self.node, "an AIPP node without its image input".into())
                })?;
                let dtype = self.outs.first().map_or(DataType::F32, |o| o.dtype);
                one(crate::aipp::evaluate(self.node, x, dtype)
                    .map_err(|e| value_err(self.node, format!("AIPP: expected {e}")))?)
            }
            other => Err(unsupported(
                self.node,
                format!(
                    "operator `{other}` (the registry infers its shapes, but there is no kernel)"
                ),
            )),
        }
    }

    fn err(&self, problem: String) -> EvalError {
        value_err(self.node, problem)
    }

    /// Required input `i`.
    fn input(&self, i: usize) -> Result<&Tensor, EvalError> {
        self.opt(i)
            .ok_or_else(|| self.err(format!("input {i} is required but absent")))
    }

    /// Optional input `i`.
    fn opt(&self, i: usize) -> Option<&Tensor> {
        self.inputs.get(i).copied().flatten()
    }

    /// Output `k` as inferred (the registry returns at least one).
    fn out(&self, k: usize) -> Result<&Out, EvalError> {
        self.outs
            .get(k)
            .ok_or_else(|| self.err(format!("output {k} is not declared")))
    }

    fn out_f64(&self, k: usize, v: &[f64]) -> Result<Tensor, EvalError> {
        let o = self.out(k)?;
        Ok(encode_f64(o.dtype, o.dims.clone(), v))
    }

    fn out_i64(&self, k: usize, v: &[i64]) -> Result<Tensor, EvalError> {
        let o = self.out(k)?;
        Ok(encode_i64(o.dtype, o.dims.clone(), v))
    }

    /// Integer attribute (a flag counts as 0/1); the registry has checked its kind.
    fn int(&self, name: &str, default: i64) -> i64 {
        match self.node.attr(name) {
            Some(Attr::Int(v)) => *v,
            Some(Attr::Bool(b)) => i64::from(*b),
            _ => default,
        }
    }

    fn float(&self, name: &str, default: f32) -> f64 {
        f64::from(self.node.float(name).unwrap_or(default))
    }

    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.node.ints(name).map(<[i64]>::to_vec)
    }

    /// A possibly negative axis made non-negative for `rank` (the registry has range-checked it).
    fn axis(&self, axis: i64, rank: usize) -> usize {
        if axis < 0 {
            (axis + rank as i64) as usize
        } else {
            axis as usize
        }
    }

    /// Runs an operator library parser (the one shape inference uses) on this node's input
    /// values; its error names the operator and what was expected.
    fn parsed<T>(
        &self,
        parse: impl FnOnce(&crate::infer::OpCtx<'_>) -> Result<T, OpError>,
    ) -> Result<T, EvalError> {
        let descs: Vec<Option<TensorDesc>> =
            self.inputs.iter().map(|t| t.map(TensorDesc::of)).collect();
        let ctx = crate::infer::OpCtx {
            node: self.node,
            inputs: descs.iter().map(Option::as_ref).collect(),
            values: self.inputs.to_vec(),
            opset: self.opset,
        };
        parse(&ctx).map_err(|e| self.err(format!("{}: {}: {}", self.node.op, e.expected, e.got)))
    }

    /// ConvTranspose in f64 as its definition reads: every input element scatters its kernel
    /// window into the full output, of which the pads are cut.
    fn conv_transpose(&self) -> Result<Tensor, EvalError> {
        let g = self.parsed(crate::ops::ConvTransposeGeometry::parse)?;
        let x = self.input(0)?;
        let (xs, ws) = (f64s(x), f64s(self.input(1)?));
        let bias = self.opt(2).map(f64s);
        let n = x.dims[0] as usize;
        let (c, m, groups) = (
            g.in_channels as usize,
            g.out_channels as usize,
            g.group as usize,
        );
        let (cg, mg) = (c / groups, m / groups);
        let in_len = numel(&g.input);
        let out_len = numel(&g.output);
        let k_len = numel(&g.kernel);
        let rank = g.input.len();
        let mut y = vec![0.0; n * m * out_len];
        for b in 0..n {
            for ic in 0..c {
                let gi = ic / cg;
                for i in 0..in_len {
                    let v = xs[(b * c + ic) * in_len + i];
                    // The input element's coordinates.
                    let mut ix = vec![0i64; rank];
                    let mut r = i;
                    for a in (0..rank).rev() {
                        ix[a] = (r % g.input[a] as usize) as i64;
                        r /= g.input[a] as usize;
                    }
                    for k in 0..k_len {
                        let mut kx = vec![0i64; rank];
                        let mut r = k;
                        for a in (0..rank).rev() {
                            kx[a] = (r % g.kernel[a] as usize) as i64;
                            r /= g.kernel[a] as usize;
                        }
                        let mut at = 0usize;
                        let mut inside = true;
                        for a in 0..rank {
                            let o = ix[a] * g.strides[a] + kx[a] * g.dilations[a] - g.pads_begin[a];
                            inside &= (0..g.output[a]).contains(&o);
                            at = at * g.output[a] as usize + o.max(0) as usize;
                        }
                        if !inside {
                            continue;
                        }
                        for ol in 0..mg {
                            let w = ws[(ic * mg + ol) * k_len + k];
                            y[(b * m + gi * mg + ol) * out_len + at] += v * w;
                        }
                    }
                }
            }
        }
        if let Some(bias) = bias {
            for (i, v) in y.iter_mut().enumerate() {
                *v += bias[(i / out_len) % m];
            }
        }
        self.out_f64(0, &y)
    }

    /// InstanceNormalization and GroupNormalization in f64: per sample and group, the mean and
    /// the (population) variance over the group's channels and spatial elements.
    fn group_norm(&self) -> Result<Tensor, EvalError> {
        let groups = self.parsed(crate::ops::group_norm_parse)?;
        let x = self.input(0)?;
        let (xs, scale, bias) = (f64s(x), f64s(self.input(1)?), f64s(self.input(2)?));
        let eps = self.float("epsilon", 1e-5);
        let (n, c) = (x.dims[0] as usize, x.dims[1] as usize);
        let g = groups as usize;
        let spatial = numel(&x.dims[2..]);
        let len = c / g * spatial;
        let mut y = vec![0.0; xs.len()];
        for s in 0..n * g {
            let v = &xs[s * len..(s + 1) * len];
            let mean = v.iter().sum::<f64>() / len as f64;
            let var = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / len as f64;
            let rstd = 1.0 / (var + eps).sqrt();
            for (k, a) in v.iter().enumerate() {
                let ch = (s % g) * (c / g) + k / spatial;
                y[s * len + k] = (a - mean) * rstd * scale[ch] + bias[ch];
            }
        }
        self.out_f64(0, &y)
    }

    /// Resize through the shared per-axis taps: row copies move the elements exactly (any
    /// type); interpolation is computed in f64 and rounded once to the output type.
    fn resize(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let (spec, passes) = self.parsed(|ctx| {
            let spec = crate::ops::ResizeSpec::parse(ctx)?;
            let passes = spec.passes(&x.dims)?;
            Ok((spec, passes))
        })?;
        // Row copies move elements exactly; a row of zeros (all taps weigh 0) is computed.
        let copies = |p: &crate::ops::AxisPass| p.copy_rows().filter(|r| !r.contains(&p.input));
        if passes.iter().all(|p| copies(p).is_some()) {
            let mut index: Vec<usize> = (0..numel(&x.dims)).collect();
            let mut dims = x.dims.clone();
            for p in &passes {
                let rows = copies(p).unwrap_or_default();
                let outer = dims[..p.axis].iter().product::<i64>() as usize;
                let inner = dims[p.axis + 1..].iter().product::<i64>() as usize;
                let mut next = Vec::with_capacity(outer * p.output * inner);
                for o in 0..outer {
                    for r in &rows {
                        let at = (o * p.input + r) * inner;
                        next.extend_from_slice(&index[at..at + inner]);
                    }
                }
                index = next;
                dims[p.axis] = p.output as i64;
            }
            return Ok(take(x, dims, &index));
        }
        let (v, _) = crate::ops::resize_values(&f64s(x), &x.dims, &passes, spec.extrapolation);
        self.out_f64(0, &v)
    }

    fn unary_f(&self, f: impl Fn(f64) -> f64) -> Result<Tensor, EvalError> {
        let v: Vec<f64> = f64s(self.input(0)?).into_iter().map(f).collect();
        self.out_f64(0, &v)
    }

    /// Sum, Mean, Max and Min of broadcast inputs: floats in f64 (Max and Min propagate NaN,
    /// as numpy's maximum does), integers in i64 with wrapping sums.
    fn variadic(&self, op: &str) -> Result<Tensor, EvalError> {
        let n = self.node.inputs.len();
        let maps = self.broadcast_maps(&(0..n).collect::<Vec<_>>())?;
        let len = maps[0].len();
        let mean = op == "Mean";
        if self.input(0)?.dtype.is_float() {
            let xs: Vec<Vec<f64>> = (0..n)
                .map(|i| Ok(f64s(self.input(i)?)))
                .collect::<Result<_, EvalError>>()?;
            let v: Vec<f64> = (0..len)
                .map(|k| {
                    let r = (1..n).fold(xs[0][maps[0][k]], |a, i| {
                        let b = xs[i][maps[i][k]];
                        match op {
                            "Max" | "Min" if a.is_nan() || b.is_nan() => f64::NAN,
                            "Max" => a.max(b),
                            "Min" => a.min(b),
                            _ => a + b,
                        }
                    });
                    if mean { r / n as f64 } else { r }
                })
                .collect();
            return self.out_f64(0, &v);
        }
        let xs: Vec<Vec<i64>> = (0..n)
            .map(|i| Ok(self.input(i)?.to_i64s()))
            .collect::<Result<_, EvalError>>()?;
        let v: Vec<i64> = (0..len)
            .map(|k| {
                let r = (1..n).fold(xs[0][maps[0][k]], |a, i| {
                    let b = xs[i][maps[i][k]];
                    match op {
                        "Max" => a.max(b),
                        "Min" => a.min(b),
                        _ => a.wrapping_add(b),
                    }
                });
                if mean { r / n as i64 } else { r }
            })
            .collect();
        self.out_i64(0, &v)
    }

    /// A unary op on floats (in f64) or signed integers (wrapping, as the integer types do).
    fn signed_unary(
        &self,
        f: impl Fn(f64) -> f64,
        i: impl Fn(i64) -> i64,
    ) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        if x.dtype.is_float() {
            self.unary_f(f)
        } else {
            let v: Vec<i64> = x.to_i64s().into_iter().map(i).collect();
            self.out_i64(0, &v)
        }
    }

    /// `max(x, 0)`, keeping NaN as numpy's `maximum` does.
    fn relu(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        if x.dtype.is_float() {
            self.unary_f(|v| if v < 0.0 { 0.0 } else { v })
        } else {
            let v: Vec<i64> = x.to_i64s().into_iter().map(|v| v.max(0)).collect();
            self.out_i64(0, &v)
        }
    }

    fn gelu(&self) -> Result<Tensor, EvalError> {
        let tanh = self.node.string("approximate") == Some("tanh");
        if tanh {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            self.unary_f(|x| 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh()))
        } else {
            self.unary_f(|x| 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)))
        }
    }

    /// `min(max(x, lo), hi)` with either bound optional (numpy's `clip`: NaN stays NaN, and
    /// `lo > hi` gives `hi`).
    fn clip(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        if x.dtype.is_float() {
            let lo = self.opt(1).and_then(|t| f64s(t).first().copied());
            let hi = self.opt(2).and_then(|t| f64s(t).first().copied());
            self.unary_f(|v| {
                let v = match lo {
                    Some(l) if v < l => l,
                    _ => v,
                };
                match hi {
                    Some(h) if v > h => h,
                    _ => v,
                }
            })
        } else {
            let lo = self.opt(1).and_then(|t| t.to_i64s().first().copied());
            let hi = self.opt(2).and_then(|t| t.to_i64s().first().copied());
            let v: Vec<i64> = x
                .to_i64s()
                .into_iter()
                .map(|v| {
                    let v = lo.map_or(v, |l| v.max(l));
                    hi.map_or(v, |h| v.min(h))
                })
                .collect();
            self.out_i64(0, &v)
        }
    }

    /// The broadcast index maps of inputs `idx` into output 0.
    fn broadcast_maps(&self, idx: &[usize]) -> Result<Vec<Vec<usize>>, EvalError> {
        let out = &self.out(0)?.dims;
        idx.iter()
            .map(|i| Ok(broadcast_index(out, &self.input(*i)?.dims)))
            .collect()
    }

    fn arith(&self, op: &str) -> Result<Tensor, EvalError> {
        let (a, b) = (self.input(0)?, self.input(1)?);
        let maps = self.broadcast_maps(&[0, 1])?;
        let (ia, ib) = (&maps[0], &maps[1]);
        if a.dtype.is_float() {
            let (x, y) = (f64s(a), f64s(b));
            let f: fn(f64, f64) -> f64 = match op {
                "Add" => |p, q| p + q,
                "Sub" => |p, q| p - q,
                "Mul" => |p, q| p * q,
                _ => |p, q| p / q,
            };
            let v: Vec<f64> = ia.iter().zip(ib).map(|(i, j)| f(x[*i], y[*j])).collect();
            return self.out_f64(0, &v);
        }
        let (x, y) = (a.to_i64s(), b.to_i64s());
        let mut v = Vec::with_capacity(ia.len());
        for (k, (i, j)) in ia.iter().zip(ib).enumerate() {
            let (p, q) = (x[*i], y[*j]);
            v.push(match op {
                "Add" => p.wrapping_add(q),
                "Sub" => p.wrapping_sub(q),
                "Mul" => p.wrapping_mul(q),
                _ if q == 0 => {
                    return Err(self.err(format!(
                        "a non-zero integer divisor, got 0 at element {k} of the result"
                    )));
                }
                _ => p.wrapping_div(q),
            });
        }
        self.out_i64(0, &v)
    }

    /// `base ^ exponent` in the base's type (numpy's `power(...).astype(base)`).
    fn pow(&self) -> Result<Tensor, EvalError> {
        let (a, b) = (self.input(0)?, self.input(1)?);
        let maps = self.broadcast_maps(&[0, 1])?;
        let (ia, ib) = (&maps[0], &maps[1]);
        if a.dtype.is_float() || b.dtype.is_float() {
            let (x, y) = (f64s(a), f64s(b));
            let v: Vec<f64> = ia.iter().zip(ib).map(|(i, j)| x[*i].powf(y[*j])).collect();
            return self.out_f64(0, &v);
        }
        let (x, y) = (a.to_i64s(), b.to_i64s());
        let mut v = Vec::with_capacity(ia.len());
        for (i, j) in ia.iter().zip(ib) {
            let (base, e) = (x[*i], y[*j]);
            v.push(if e >= 0 {
                let mut acc = 1i64;
                let mut sq = base;
                let mut e = e as u64;
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(sq);
                    }
                    sq = sq.wrapping_mul(sq);
                    e >>= 1;
                }
                acc
            } else {
                // 1 / base^|e| truncated toward zero, as an integer result must be.
                match base {
                    0 => {
                        return Err(self
                            .err("a non-zero integer base for a negative exponent, got 0".into()));
                    }
                    1 => 1,
                    -1 => {
                        if e % 2 == 0 {
                            1
                        } else {
                            -1
                        }
                    }
                    _ => 0,
                }
            });
        }
        self.out_i64(0, &v)
    }

    /// And, Or, Xor of bool tensors with broadcasting.
    fn logic(&self, op: &str) -> Result<Tensor, EvalError> {
        let (a, b) = (self.input(0)?.to_i64s(), self.input(1)?.to_i64s());
        let maps = self.broadcast_maps(&[0, 1])?;
        let v: Vec<i64> = maps[0]
            .iter()
            .zip(&maps[1])
            .map(|(i, j)| {
                let (x, y) = (a[*i] != 0, b[*j] != 0);
                i64::from(match op {
                    "And" => x && y,
                    "Or" => x || y,
                    _ => x != y,
                })
            })
            .collect();
        self.out_i64(0, &v)
    }

    /// Equal, Less, Greater, LessOrEqual, GreaterOrEqual with broadcasting; NaN compares
    /// false, as IEEE comparisons do.
    fn compare(&self, op: &str) -> Result<Tensor, EvalError> {
        fn holds<T: PartialOrd>(op: &str, x: T, y: T) -> bool {
            match op {
                "Less" => x < y,
                "Greater" => x > y,
                "LessOrEqual" => x <= y,
                "GreaterOrEqual" => x >= y,
                _ => x == y,
            }
        }
        let (a, b) = (self.input(0)?, self.input(1)?);
        let maps = self.broadcast_maps(&[0, 1])?;
        let v: Vec<i64> = if a.dtype.is_float() {
            let (x, y) = (f64s(a), f64s(b));
            maps[0]
                .iter()
                .zip(&maps[1])
                .map(|(i, j)| i64::from(holds(op, x[*i], y[*j])))
                .collect()
        } else {
            let (x, y) = (a.to_i64s(), b.to_i64s());
            maps[0]
                .iter()
                .zip(&maps[1])
                .map(|(i, j)| i64::from(holds(op, x[*i], y[*j])))
                .collect()
        };
        self.out_i64(0, &v)
    }

    /// `cond ? x : y`, element bytes copied (any type).
    fn where_(&self) -> Result<Tensor, EvalError> {
        let (c, x, y) = (self.input(0)?, self.input(1)?, self.input(2)?);
        let maps = self.broadcast_maps(&[0, 1, 2])?;
        let cond = c.to_i64s();
        let size = x.dtype.size();
        let mut b = Vec::with_capacity(maps[0].len() * size);
        for ((ic, ix), iy) in maps[0].iter().zip(&maps[1]).zip(&maps[2]) {
            let (src, i) = if cond[*ic] != 0 { (x, *ix) } else { (y, *iy) };
            b.extend_from_slice(&src.data[i * size..(i + 1) * size]);
        }
        let o = self.out(0)?;
        Ok(Tensor {
            dtype: x.dtype,
            dims: o.dims.clone(),
            data: Arc::new(b),
        })
    }

    /// An element-wise operator through the AI CPU's implementation of it (u64 inputs, Mod).
    fn on_aicpu_code(&self, op: ElementwiseOp) -> Result<Tensor, EvalError> {
        let ins: Vec<&Tensor> = (0..self.inputs.len())
            .map(|i| self.input(i))
            .collect::<Result<_, _>>()?;
        let o = self.out(0)?;
        Ok(ops::aicpu_elementwise(op, &ins, o.dtype, o.dims.clone()))
    }

    fn cast(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let o = self.out(0)?;
        let mode = crate::ops::cast_mode(self.node).map_err(|e| value_err(self.node, e))?;
        Ok(Tensor {
            dtype: o.dtype,
            dims: o.dims.clone(),
            data: Arc::new(numeric::cast(x.dtype, o.dtype, &x.data, mode)),
        })
    }

    /// Ops that only relabel dims share the input's bytes.
    fn relabel(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        Ok(Tensor {
            dtype: x.dtype,
            dims: self.out(0)?.dims.clone(),
            data: x.data.clone(),
        })
    }

    fn transpose(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let r = x.dims.len();
        let perm: Vec<usize> = match self.ints("perm") {
            Some(p) => p.iter().map(|k| *k as usize).collect(),
            None => (0..r).rev().collect(),
        };
        let src = strides(&x.dims);
        let steps: Vec<i64> = perm.iter().map(|k| src[*k]).collect();
        let dims = self.out(0)?.dims.clone();
        let index = affine_index(&dims, 0, &steps);
        Ok(take(x, dims, &index))
    }

    fn concat(&self) -> Result<Tensor, EvalError> {
        let first = self.input(0)?;
        let o = self.out(0)?;
        let axis = self.axis(self.int("axis", 0), o.dims.len());
        let outer = numel(&o.dims[..axis]);
        let size = first.dtype.size();
        let ts: Vec<&Tensor> = (0..self.inputs.len())
            .map(|i| self.input(i))
            .collect::<Result<_, _>>()?;
        let mut b = Vec::with_capacity(numel(&o.dims) * size);
        for p in 0..outer {
            for t in &ts {
                let block = numel(&t.dims[axis..]) * size;
                b.extend_from_slice(&t.data[p * block..(p + 1) * block]);
            }
        }
        Ok(Tensor {
            dtype: first.dtype,
            dims: o.dims.clone(),
            data: Arc::new(b),
        })
    }

    /// Split: the inverse of Concat; each output's length along the axis is the registry's.
    fn split(&self) -> Result<Vec<Tensor>, EvalError> {
        let x = self.input(0)?;
        let axis = self.axis(self.int("axis", 0), x.dims.len());
        let outer = numel(&x.dims[..axis]);
        let size = x.dtype.size();
        let in_block = numel(&x.dims[axis..]) * size;
        let mut out = Vec::with_capacity(self.outs.len());
        let mut offset = 0;
        for k in 0..self.outs.len() {
            let o = self.out(k)?;
            let block = numel(&o.dims[axis..]) * size;
            let mut b = Vec::with_capacity(outer * block);
            for p in 0..outer {
                let at = p * in_block + offset;
                b.extend_from_slice(&x.data[at..at + block]);
            }
            offset += block;
            out.push(Tensor {
                dtype: x.dtype,
                dims: o.dims.clone(),
                data: Arc::new(b),
            });
        }
        Ok(out)
    }

    fn slice(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let r = x.dims.len();
        // The ends only bound each axis's length, which the registry has inferred.
        let starts = self.input(1)?.to_i64s();
        let axes: Vec<usize> = match self.opt(3) {
            Some(t) => t.to_i64s().iter().map(|a| self.axis(*a, r)).collect(),
            None => (0..starts.len()).collect(),
        };
        let steps = match self.opt(4) {
            Some(t) => t.to_i64s(),
            None => vec![1; starts.len()],
        };
        let dims = self.out(0)?.dims.clone();
        let src = strides(&x.dims);
        let mut walk = src.clone();
        let mut base = 0i64;
        for (k, &axis) in axes.iter().enumerate() {
            let (d, step) = (x.dims[axis], steps[k]);
            // ONNX: a negative start counts from the end; it then clamps to [0, d] for a
            // positive step and to [0, d - 1] for a negative one.
            let s = if starts[k] < 0 {
                starts[k].saturating_add(d)
            } else {
                starts[k]
            };
            let s = if step > 0 {
                s.clamp(0, d)
            } else {
                s.clamp(0, (d - 1).max(0))
            };
            if dims[axis] > 0 {
                base += s * src[axis];
            }
            walk[axis] = step * src[axis];
        }
        let index = affine_index(&dims, base, &walk);
        Ok(take(x, dims, &index))
    }

    fn gather(&self) -> Result<Tensor, EvalError> {
        let (x, idx) = (self.input(0)?, self.input(1)?);
        let axis = self.axis(self.int("axis", 0), x.dims.len());
        let d = x.dims[axis];
        let outer = numel(&x.dims[..axis]);
        let inner = numel(&x.dims[axis + 1..]);
        let ids = idx.to_i64s();
        let mut index = Vec::with_capacity(outer * ids.len() * inner);
        for p in 0..outer {
            for (k, id) in ids.iter().enumerate() {
                let j = if *id < 0 { id + d } else { *id };
                if j < 0 || j >= d {
                    return Err(self.err(format!(
                        "index {k} = {id} within [-{d}, {}] (axis {axis} of the data)",
                        d - 1
                    )));
                }
                let start = (p * d as usize + j as usize) * inner;
                index.extend(start..start + inner);
            }
        }
        Ok(take(x, self.out(0)?.dims.clone(), &index))
    }

    fn expand(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let dims = self.out(0)?.dims.clone();
        let index = broadcast_index(&dims, &x.dims);
        Ok(take(x, dims, &index))
    }

    /// The input's dims from `start` to `end`, clamped as ONNX says (opset 15 on).
    fn shape(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let r = x.dims.len() as i64;
        let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
        let start = clamp(self.int("start", 0));
        let end = clamp(self.int("end", r)).max(start);
        let v = &x.dims[start..end];
        Ok(Tensor::from_i64s(vec![v.len() as i64], v))
    }

    /// The begin pads of a sliding window: explicit, none (VALID) or SAME's split of the pads
    /// that make the output `out` (extra pad at the end for SAME_UPPER, the start for LOWER).
    fn window_pads(
        &self,
        input: &[i64],
        out: &[i64],
        extent: &[i64],
        strides: &[i64],
    ) -> Vec<(i64, i64)> {
        let n = input.len();
        let explicit = self.ints("pads").unwrap_or_else(|| vec![0; 2 * n]);
        let mode = self.node.string("auto_pad").unwrap_or("NOTSET");
        (0..n)
            .map(|a| match mode {
                "SAME_UPPER" | "SAME_LOWER" => crate::ops::same_pads(
                    mode == "SAME_UPPER",
                    input[a],
                    out[a],
                    strides[a],
                    extent[a],
                ),
                "VALID" => (0, 0),
                _ => (explicit[a], explicit[a + n]),
            })
            .collect()
    }

    /// The geometry of a sliding window over the spatial dims `input` -> `out` (Conv and the
    /// pools): for every (kernel position `kp`, output position `op`) pair, flattened as
    /// `kp * osp + op`, the input position as row- and column-major spatial offsets (`None`
    /// outside the input) and whether it lies inside the explicit padding.
    fn window(&self, input: &[i64], out: &[i64], kernel: &[i64]) -> Window {
        let n = input.len();
        let s = self.ints("strides").unwrap_or_else(|| vec![1; n]);
        let d = self.ints("dilations").unwrap_or_else(|| vec![1; n]);
        let extent: Vec<i64> = (0..n).map(|a| (kernel[a] - 1) * d[a] + 1).collect();
        let pads = self.window_pads(input, out, &extent, &s);
        let row = strides(input);
        // Column-major: the first spatial axis varies fastest.
        let mut col = vec![1i64; n];
        for a in 1..n {
            col[a] = col[a - 1] * input[a - 1];
        }
        let (osp, ksp) = (numel(out), numel(kernel));
        let mut w = Window {
            src: Vec::with_capacity(ksp * osp),
            in_pad: Vec::with_capacity(ksp * osp),
        };
        let mut k = vec![0i64; n];
        for _ in 0..ksp {
            let mut o = vec![0i64; n];
            for _ in 0..osp {
                let (mut inside, mut padded, mut r, mut c) = (true, true, 0i64, 0i64);
                for a in 0..n {
                    let p = o[a] * s[a] - pads[a].0 + k[a] * d[a];
                    inside &= 0 <= p && p < input[a];
                    padded &= -pads[a].0 <= p && p < input[a] + pads[a].1;
                    r += p * row[a];
                    c += p * col[a];
                }
                w.src.push(inside.then_some((r as usize, c as usize)));
                w.in_pad.push(padded);
                bump(&mut o, out);
            }
            bump(&mut k, kernel);
        }
        w
    }

    /// Conv as im2col per (image, group) and a product with the group's weights, in f64.
    fn conv(&self) -> Result<Tensor, EvalError> {
        let (x, w) = (self.input(0)?, self.input(1)?);
        let o = self.out(0)?;
        let (n, c) = (x.dims[0] as usize, x.dims[1] as usize);
        let m = w.dims[0] as usize;
        let group = self.int("group", 1) as usize;
        let (cg, mg) = (c / group, m / group);
        let ispace = &x.dims[2..];
        let ospace = &o.dims[2..];
        let kernel = &w.dims[2..];
        let (isp, osp, ksp) = (numel(ispace), numel(ospace), numel(kernel));
        let src: Vec<Option<usize>> = self
            .window(ispace, ospace, kernel)
            .src
            .iter()
            .map(|p| p.map(|(row, _)| row))
            .collect();
        let xv = f64s(x);
        let wv = f64s(w);
        let bias = self.opt(2).map(f64s);
        let r = cg * ksp;
        let mut cols = vec![0.0f64; r * osp];
        let mut y = vec![0.0f64; n * m * osp];
        let mut acc = vec![0.0f64; osp];
        for img in 0..n {
            for g in 0..group {
                for ci in 0..cg {
                    let xb = (img * c + g * cg + ci) * isp;
                    for kp in 0..ksp {
                        let row = &mut cols[(ci * ksp + kp) * osp..(ci * ksp + kp + 1) * osp];
                        for (dst, s) in row.iter_mut().zip(&src[kp * osp..(kp + 1) * osp]) {
                            *dst = s.map_or(0.0, |s| xv[xb + s]);
                        }
                    }
                }
                for mi in 0..mg {
                    let oc = g * mg + mi;
                    acc.fill(0.0);
                    let wrow = &wv[oc * r..(oc + 1) * r];
                    for (ri, wk) in wrow.iter().enumerate() {
                        for (a, col) in acc.iter_mut().zip(&cols[ri * osp..(ri + 1) * osp]) {
                            *a += wk * col;
                        }
                    }
                    let b = bias.as_ref().map_or(0.0, |b| b[oc]);
                    let dst = &mut y[(img * m + oc) * osp..(img * m + oc + 1) * osp];
                    for (d, a) in dst.iter_mut().zip(&acc) {
                        *d = a + b;
                    }
                }
            }
        }
        self.out_f64(0, &y)
    }

    /// MaxPool (with its optional flat argmax indices, row- or column-major over the spatial
    /// dims per `storage_order`) and AveragePool.
    fn pool(&self, max: bool) -> Result<Vec<Tensor>, EvalError> {
        let x = self.input(0)?;
        let o = self.out(0)?;
        let nc = (x.dims[0] * x.dims[1]) as usize;
        let ispace = &x.dims[2..];
        let ospace = &o.dims[2..];
        let kernel = self.ints("kernel_shape").unwrap_or_default();
        let (isp, osp, ksp) = (numel(ispace), numel(ospace), numel(&kernel));
        let Window { src, in_pad } = self.window(ispace, ospace, &kernel);
        let colmajor = self.int("storage_order", 0) == 1;
        let include_pad = self.int("count_include_pad", 0) == 1;
        let xv = f64s(x);
        let mut y = vec![0.0f64; nc * osp];
        let mut arg = vec![-1i64; nc * osp];
        for ch in 0..nc {
            let xb = ch * isp;
            for op in 0..osp {
                let mut best: Option<(f64, usize)> = None;
                let (mut sum, mut valid, mut padded) = (0.0f64, 0usize, 0usize);
                for kp in 0..ksp {
                    let t = kp * osp + op;
                    if in_pad[t] {
                        padded += 1;
                    }
                    let Some((r, c)) = src[t] else { continue };
                    let v = xv[xb + r];
                    valid += 1;
                    sum += v;
                    // The first position wins ties; NaN never replaces a value.
                    if best.is_none_or(|(b, _)| v > b) {
                        best = Some((v, if colmajor { c } else { r }));
                    }
                }
                let k = ch * osp + op;
                if max {
                    if let Some((v, at)) = best {
                        y[k] = v;
                        arg[k] = (xb + at) as i64;
                    }
                } else {
                    let div = if include_pad { padded } else { valid };
                    y[k] = sum / div as f64;
                }
            }
        }
        let mut outs = vec![self.out_f64(0, &y)?];
        if max && self.outs.len() > 1 {
            outs.push(self.out_i64(1, &arg)?);
        }
        Ok(outs)
    }

    fn global_average_pool(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let nc = (x.dims[0] * x.dims[1]) as usize;
        let sp = numel(&x.dims[2..]);
        let xv = f64s(x);
        let v: Vec<f64> = (0..nc)
            .map(|ch| xv[ch * sp..(ch + 1) * sp].iter().sum::<f64>() / sp as f64)
            .collect();
        self.out_f64(0, &v)
    }

    /// numpy matmul: a 1-D A gets a leading 1, a 1-D B a trailing 1 (both removed from the
    /// result, which leaves the flat order unchanged); batch dims broadcast.
    fn matmul(&self) -> Result<Tensor, EvalError> {
        self.matmul_offset(None, None)
    }

    /// MatMulInteger: `(A - a_zero_point) · (B - b_zero_point)` in integers, the zero points
    /// scalars or one per row of A / column of B.
    fn matmul_integer(&self) -> Result<Tensor, EvalError> {
        let zero = |i: usize| self.opt(i).map_or_else(|| vec![0], Tensor::to_i64s);
        // A fused dequantisation scales the product in the output's float type.
        let scale = self.opt(crate::fusion::DEQUANT_INPUT).map(Tensor::to_f64s);
        self.matmul_offset(Some((zero(2), zero(3))), scale.as_deref())
    }

    /// MatMul, or with `zero` MatMulInteger's product of offset integers; with `scale` that
    /// product (exact in f64) times the scale (one value, or one per column) as a float.
    fn matmul_offset(
        &self,
        zero: Option<(Vec<i64>, Vec<i64>)>,
        scale: Option<&[f64]>,
    ) -> Result<Tensor, EvalError> {
        let (a, b) = (self.input(0)?, self.input(1)?);
        let mut ad = a.dims.clone();
        if ad.len() == 1 {
            ad.insert(0, 1);
        }
        let mut bd = b.dims.clone();
        if bd.len() == 1 {
            bd.push(1);
        }
        let (ra, rb) = (ad.len(), bd.len());
        let (m, k, n) = (
            ad[ra - 2] as usize,
            ad[ra - 1] as usize,
            bd[rb - 1] as usize,
        );
        let (ba, bb) = (&ad[..ra - 2], &bd[..rb - 2]);
        let rank = ba.len().max(bb.len());
        let pad = |d: &[i64]| -> Vec<i64> {
            let mut v = vec![1; rank - d.len()];
            v.extend_from_slice(d);
            v
        };
        let (pa, pb) = (pad(ba), pad(bb));
        let batch: Vec<i64> = pa.iter().zip(&pb).map(|(x, y)| *x.max(y)).collect();
        let (ia, ib) = (broadcast_index(&batch, &pa), broadcast_index(&batch, &pb));
        if a.dtype.is_float() && zero.is_none() {
            let (x, y) = (f64s(a), f64s(b));
            let mut out = vec![0.0f64; ia.len() * m * n];
            for (bi, (pa, pb)) in ia.iter().zip(&ib).enumerate() {
                let (xa, yb) = (
                    &x[pa * m * k..(pa + 1) * m * k],
                    &y[pb * k * n..(pb + 1) * k * n],
                );
                let dst = &mut out[bi * m * n..(bi + 1) * m * n];
                for i in 0..m {
                    let drow = &mut dst[i * n..(i + 1) * n];
                    for (kk, av) in xa[i * k..(i + 1) * k].iter().enumerate() {
                        for (d, bv) in drow.iter_mut().zip(&yb[kk * n..(kk + 1) * n]) {
                            *d += av * bv;
                        }
                    }
                }
            }
            return self.out_f64(0, &out);
        }
        let (x, y) = (a.to_i64s(), b.to_i64s());
        let (za, zb) = zero.unwrap_or_else(|| (vec![0], vec![0]));
        let at = |z: &[i64], i: usize| if z.len() == 1 { z[0] } else { z[i] };
        let at_f = |z: &[f64], i: usize| if z.len() == 1 { z[0] } else { z[i] };
        let mut out = vec![0i64; ia.len() * m * n];
        for (bi, (pa, pb)) in ia.iter().zip(&ib).enumerate() {
            for i in 0..m {
                for kk in 0..k {
                    let av = x[pa * m * k + i * k + kk] - at(&za, i);
                    for j in 0..n {
                        let d = &mut out[bi * m * n + i * n + j];
                        let bv = y[pb * k * n + kk * n + j] - at(&zb, j);
                        *d = d.wrapping_add(av.wrapping_mul(bv));
                    }
                }
            }
        }
        if let Some(s) = scale {
            let v: Vec<f64> = out
                .iter()
                .enumerate()
                .map(|(e, x)| *x as f64 * at_f(s, e % n.max(1)))
                .collect();
            return self.out_f64(0, &v);
        }
        self.out_i64(0, &out)
    }

    /// `alpha * A' B' + beta * C` (C skipped when beta is 0, as the reference does). Integer
    /// Gemm is exact when alpha and beta are 1 and otherwise goes through f64 and truncates.
    fn gemm(&self) -> Result<Tensor, EvalError> {
        let (a, b) = (self.input(0)?, self.input(1)?);
        let ta = self.int("transA", 0) == 1;
        let tb = self.int("transB", 0) == 1;
        let alpha = self.float("alpha", 1.0);
        let beta = self.float("beta", 1.0);
        let (m, k) = if ta {
            (a.dims[1] as usize, a.dims[0] as usize)
        } else {
            (a.dims[0] as usize, a.dims[1] as usize)
        };
        let n = if tb {
            b.dims[0] as usize
        } else {
            b.dims[1] as usize
        };
        let ai = |i: usize, kk: usize| if ta { kk * m + i } else { i * k + kk };
        let bi = |kk: usize, j: usize| if tb { j * k + kk } else { kk * n + j };
        let c = self.opt(2).filter(|_| beta != 0.0);
        let ci = c.map(|c| broadcast_index(&[m as i64, n as i64], &c.dims));
        let exact = !a.dtype.is_float() && alpha == 1.0 && (c.is_none() || beta == 1.0);
        if exact {
            let (x, y) = (a.to_i64s(), b.to_i64s());
            let cv = c.map(Tensor::to_i64s);
            let mut out = vec![0i64; m * n];
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0i64;
                    for kk in 0..k {
                        s = s.wrapping_add(x[ai(i, kk)].wrapping_mul(y[bi(kk, j)]));
                    }
                    if let (Some(cv), Some(ci)) = (&cv, &ci) {
                        s = s.wrapping_add(cv[ci[i * n + j]]);
                    }
                    out[i * n + j] = s;
                }
            }
            return self.out_i64(0, &out);
        }
        let (x, y) = (f64s(a), f64s(b));
        let cv = c.map(f64s);
        let mut out = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for kk in 0..k {
                    s += x[ai(i, kk)] * y[bi(kk, j)];
                }
                let mut v = alpha * s;
                if let (Some(cv), Some(ci)) = (&cv, &ci) {
                    v += beta * cv[ci[i * n + j]];
                }
                out[i * n + j] = v;
            }
        }
        self.out_f64(0, &out)
    }

    /// Inference-mode BatchNormalization; outputs 1 and 2 (when declared) are the stored
    /// statistics, which is what they are when nothing is trained.
    fn batch_norm(&self) -> Result<Vec<Tensor>, EvalError> {
        let x = self.input(0)?;
        let [scale, bias, mean, var] = [1, 2, 3, 4].map(|i| self.input(i).map(f64s));
        let (scale, bias, mean, var) = (scale?, bias?, mean?, var?);
        let eps = self.float("epsilon", 1e-5);
        let c = x.dims[1] as usize;
        let sp = numel(&x.dims[2..]);
        let xv = f64s(x);
        let mut y = vec![0.0f64; xv.len()];
        for (blk, (dst, srcb)) in y
            .chunks_mut(sp.max(1))
            .zip(xv.chunks(sp.max(1)))
            .enumerate()
        {
            let ch = blk % c;
            let inv = 1.0 / (var[ch] + eps).sqrt();
            for (d, v) in dst.iter_mut().zip(srcb) {
                *d = (v - mean[ch]) * inv * scale[ch] + bias[ch];
            }
        }
        let mut outs = vec![self.out_f64(0, &y)?];
        for k in 1..self.outs.len() {
            match k {
                1 => outs.push(self.out_f64(1, &mean)?),
                2 => outs.push(self.out_f64(2, &var)?),
                _ => {
                    return Err(unsupported(
                        self.node,
                        format!("output {k} (a training-mode statistic)"),
                    ));
                }
            }
        }
        Ok(outs)
    }

    /// LayerNormalization over the dims from `axis` on, with Scale and B broadcast to them;
    /// the optional outputs are the mean and 1 / sqrt(var + epsilon) per normalized row.
    fn layer_norm(&self) -> Result<Vec<Tensor>, EvalError> {
        let x = self.input(0)?;
        let axis = self.axis(self.int("axis", -1), x.dims.len());
        let eps = self.float("epsilon", 1e-5);
        let norm = &x.dims[axis..];
        let cols = numel(norm);
        let rows = numel(&x.dims[..axis]);
        let param = |i: usize| {
            self.opt(i)
                .map(|t| (f64s(t), broadcast_index(norm, &t.dims)))
        };
        let (scale, bias) = (param(1), param(2));
        let xv = f64s(x);
        let mut y = vec![0.0f64; xv.len()];
        let mut means = Vec::with_capacity(rows);
        let mut invs = Vec::with_capacity(rows);
        for r in 0..rows {
            let row = &xv[r * cols..(r + 1) * cols];
            let mean = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            let inv = 1.0 / (var + eps).sqrt();
            for (j, v) in row.iter().enumerate() {
                let mut o = (v - mean) * inv;
                if let Some((s, si)) = &scale {
                    o *= s[si[j]];
                }
                if let Some((b, bi)) = &bias {
                    o += b[bi[j]];
                }
                y[r * cols + j] = o;
            }
            means.push(mean);
            invs.push(inv);
        }
        let mut outs = vec![self.out_f64(0, &y)?];
        if self.outs.len() > 1 {
            outs.push(self.out_f64(1, &means)?);
        }
        if self.outs.len() > 2 {
            outs.push(self.out_f64(2, &invs)?);
        }
        Ok(outs)
    }

    /// Softmax along `axis` (opset 13 on), or over the dims from `axis` on flattened (before).
    fn softmax(&self) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let r = x.dims.len();
        let (axis, modern) = if self.opset >= 13 {
            (self.axis(self.int("axis", -1), r), true)
        } else {
            (self.axis(self.int("axis", 1), r), false)
        };
        let outer = numel(&x.dims[..axis]);
        let (len, inner) = if modern {
            (x.dims[axis] as usize, numel(&x.dims[axis + 1..]))
        } else {
            (numel(&x.dims[axis..]), 1)
        };
        let xv = f64s(x);
        let mut y = vec![0.0f64; xv.len()];
        for p in 0..outer {
            for q in 0..inner {
                let at = |j: usize| (p * len + j) * inner + q;
                let mx = (0..len)
                    .map(|j| xv[at(j)])
                    .fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for j in 0..len {
                    let e = (xv[at(j)] - mx).exp();
                    y[at(j)] = e;
                    sum += e;
                }
                for j in 0..len {
                    y[at(j)] /= sum;
                }
            }
        }
        self.out_f64(0, &y)
    }

    /// ReduceMean / ReduceSum over the axes (input 1 from opset 18 / 13 on, the `axes`
    /// attribute before). No axes reduce everything, or nothing with `noop_with_empty_axes`.
    /// An integer mean is the exact sum divided with truncation.
    /// ReduceSum, ReduceMean, ReduceMax, ReduceMin (an empty set gives the identity: 0,
    /// NaN, -inf, +inf; for integers the type's extremes).
    fn reduce(&self, op: &str) -> Result<Tensor, EvalError> {
        let x = self.input(0)?;
        let r = x.dims.len();
        let mean = op == "ReduceMean";
        let extreme = match op {
            "ReduceMax" => Some(true),
            "ReduceMin" => Some(false),
            _ => None,
        };
        let since = if op == "ReduceSum" { 13 } else { 18 };
        let given = if self.opset >= since {
            self.opt(1).map(Tensor::to_i64s)
        } else {
            self.ints("axes")
        };
        let axes = given.unwrap_or_default();
        let axes: Vec<usize> = if axes.is_empty() {
            if self.opset >= since && self.int("noop_with_empty_axes", 0) == 1 {
                Vec::new()
            } else {
                (0..r).collect()
            }
        } else {
            axes.iter().map(|a| self.axis(*a, r)).collect()
        };
        let kept: Vec<i64> = (0..r)
            .filter(|a| !axes.contains(a))
            .map(|a| x.dims[a])
            .collect();
        let kstr = strides(&kept);
        let mut steps = vec![0i64; r];
        let mut j = 0;
        for (a, s) in steps.iter_mut().enumerate() {
            if !axes.contains(&a) {
                *s = kstr[j];
                j += 1;
            }
        }
        let to = affine_index(&x.dims, 0, &steps);
        let n_out = numel(&kept);
        let reduced: usize = axes.iter().map(|a| x.dims[*a] as usize).product();
        if let Some(max) = extreme {
            if x.dtype.is_float() {
                let init = if max {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                };
                let mut acc = vec![init; n_out];
                for (v, t) in f64s(x).into_iter().zip(&to) {
                    let a = &mut acc[*t];
                    // NaN propagates, as numpy's maximum / minimum do.
                    if v.is_nan() || (max && v > *a) || (!max && v < *a) {
                        *a = v;
                    }
                }
                return self.out_f64(0, &acc);
            }
            let init = if max { i64::MIN } else { i64::MAX };
            let mut acc = vec![init; n_out];
            for (v, t) in x.to_i64s().into_iter().zip(&to) {
                let a = &mut acc[*t];
                *a = if max { (*a).max(v) } else { (*a).min(v) };
            }
            return self.out_i64(0, &acc);
        }
        if x.dtype.is_float() {
            let mut acc = vec![0.0f64; n_out];
            for (v, t) in f64s(x).into_iter().zip(&to) {
                acc[*t] += v;
            }
            if mean {
                acc.iter_mut().for_each(|v| *v /= reduced as f64);
            }
            return self.out_f64(0, &acc);
        }
        let mut acc = vec![0i64; n_out];
        for (v, t) in x.to_i64s().into_iter().zip(&to) {
            acc[*t] = acc[*t].wrapping_add(v);
        }
        if mean && n_out > 0 {
            if reduced == 0 {
                return Err(self.err("an integer mean over at least one element, got none".into()));
            }
            acc.iter_mut().for_each(|v| *v /= reduced as i64);
        }
        self.out_i64(0, &acc)
    }
}

/// Where a sliding window reads, per (kernel position, output position); see `Kernel::window`.
struct Window {
    /// Row- and column-major spatial offsets of the input position, `None` outside the input.
    src: Vec<Option<(usize, usize)>>,
    /// Whether the position is inside the input or its explicit padding.
    in_pad: Vec<bool>,
}

/// Advances a row-major multi-index within `dims` (wrapping to all zeros at the end).
fn bump(idx: &mut [i64], dims: &[i64]) {
    for k in (0..dims.len()).rev() {
        idx[k] += 1;
        if idx[k] < dims[k] {
            return;
        }
        idx[k] = 0;
    }
}

/// The error function, ported from fdlibm's `s_erf.c` (via the `libm` crate), whose notice
/// follows; std has no stable `erf`, and the compiler may not depend on the simulator's libm.
///
/// Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
/// Developed at SunPro, a Sun Microsystems, Inc. business.
/// Permission to use, copy, modify, and distribute this software is freely granted, provided
/// that this notice is preserved.
///
/// |x| < 0.84375: x + x*P/Q (odd rational fit); [0.84375, 1.25): erx + P1/Q1 of |x| - 1;
/// [1.25, 6): 1 - exp(-x^2 - 0.5625 + R/S of 1/x^2) / |x|; beyond: 1 to double precision.
// fdlibm's coefficients are kept digit for digit as published, so they can be checked against
// the source; the extra digits round to the same f64.
#[allow(clippy::excessive_precision)]
fn erf(x: f64) -> f64 {
    const ERX: f64 = 8.45062911510467529297e-01;
    const EFX8: f64 = 1.02703333676410069053e+00;
    const PP: [f64; 5] = [
        1.28379167095512558561e-01,
        -3.25042107247001499370e-01,
        -2.84817495755985104766e-02,
        -5.77027029648944159157e-03,
        -2.37630166566501626084e-05,
    ];
    const QQ: [f64; 5] = [
        3.97917223959155352819e-01,
        6.50222499887672944485e-02,
        5.08130628187576562776e-03,
        1.32494738004321644526e-04,
        -3.96022827877536812320e-06,
    ];
    const PA: [f64; 7] = [
        -2.36211856075265944077e-03,
        4.14856118683748331666e-01,
        -3.72207876035701323847e-01,
        3.18346619901161753674e-01,
        -1.10894694282396677476e-01,
        3.54783043256182359371e-02,
        -2.16637559486879084300e-03,
    ];
    const QA: [f64; 6] = [
        1.06420880400844228286e-01,
        5.40397917702171048937e-01,
        7.18286544141962662868e-02,
        1.26171219808761642112e-01,
        1.36370839120290507362e-02,
        1.19844998467991074170e-02,
    ];
    const RA: [f64; 8] = [
        -9.86494403484714822705e-03,
        -6.93858572707181764372e-01,
        -1.05586262253232909814e+01,
        -6.23753324503260060396e+01,
        -1.62396669462573470355e+02,
        -1.84605092906711035994e+02,
        -8.12874355063065934246e+01,
        -9.81432934416914548592e+00,
    ];
    const SA: [f64; 8] = [
        1.96512716674392571292e+01,
        1.37657754143519042600e+02,
        4.34565877475229228821e+02,
        6.45387271733267880336e+02,
        4.29008140027567833386e+02,
        1.08635005541779435134e+02,
        6.57024977031928170135e+00,
        -6.04244152148580987438e-02,
    ];
    const RB: [f64; 7] = [
        -9.86494292470009928597e-03,
        -7.99283237680523006574e-01,
        -1.77579549177547519889e+01,
        -1.60636384855821916062e+02,
        -6.37566443368389627722e+02,
        -1.02509513161107724954e+03,
        -4.83519191608651397019e+02,
    ];
    const SB: [f64; 7] = [
        3.03380607434824582924e+01,
        3.25792512996573918826e+02,
        1.53672958608443695994e+03,
        3.19985821950859553908e+03,
        2.55305040643316442583e+03,
        4.74528541206955367215e+02,
        -2.24409524465858183362e+01,
    ];
    // Horner's rule, highest coefficient last: c[0] + z*(c[1] + z*(...)).
    fn poly(c: &[f64], z: f64) -> f64 {
        c.iter().rev().fold(0.0, |acc, k| acc * z + k)
    }
    let hi = (x.to_bits() >> 32) as u32;
    let negative = hi >> 31 == 1;
    let ix = hi & 0x7fff_ffff;
    if ix >= 0x7ff0_0000 {
        // NaN stays NaN; erf(+-inf) = +-1.
        return if x.is_nan() { x } else { x.signum() };
    }
    if ix < 0x3feb_0000 {
        if ix < 0x3e30_0000 {
            // |x| < 2^-28: erf(x) = 2/sqrt(pi) * x to double precision.
            return 0.125 * (8.0 * x + EFX8 * x);
        }
        let z = x * x;
        let r = poly(&PP, z);
        let s = 1.0 + z * poly(&QQ, z);
        return x + x * (r / s);
    }
    let y = if ix < 0x4018_0000 {
        let a = x.abs();
        let erfc = if ix < 0x3ff4_0000 {
            let s = a - 1.0;
            let p = poly(&PA, s);
            let q = 1.0 + s * poly(&QA, s);
            1.0 - ERX - p / q
        } else {
            let s = 1.0 / (a * a);
            let (r, big_s) = if ix < 0x4006_db6d {
                (poly(&RA, s), 1.0 + s * poly(&SA, s))
            } else {
                (poly(&RB, s), 1.0 + s * poly(&SB, s))
            };
            // z is |x| with the low 32 bits cleared, so z*z is exact and the split keeps
            // exp's argument accurate.
            let z = f64::from_bits(a.to_bits() & 0xffff_ffff_0000_0000);
            (-z * z - 0.5625).exp() * ((z - a) * (z + a) + r / big_s).exp() / a
        };
        1.0 - erfc
    } else {
        1.0 - f64::from_bits(0x0010_0000_0000_0000)
    };
    if negative { -y } else { y }
}
