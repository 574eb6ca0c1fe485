//! Emission: the compiled graphs become the model's task streams, kernels, weights and memory
//! plan (`.om` sections Tasks, Kernels and Weights).
//!
//! ```text
//!   head stream:  [GetNext, GetDynamicDims]  MapIndex  case/LabelSwitch
//!                 LabelSet L_0  StreamActive_0  <Batch_0 kernels>  LabelGoto L_exit
//!                 ...
//!                 LabelSet L_G-1  StreamActive_G-1  <Batch_G-1 kernels>  LabelSet L_exit
//!                 <direct-output copies>  EndGraph
//! ```
//!
//! Case lowering follows GE's label maker (gear spec §7): label L_exit first, then
//! L_i = L_exit + 1 + i; every branch starts with `LabelSet L_i` and `StreamActive`; all but
//! the last end with `LabelGoto L_exit`, the last with `LabelSet L_exit`. Stream assignment keeps every
//! kernel on the head stream (each kernel spreads over all cores, so a second stream would only
//! queue behind it); each branch's StreamActive therefore has an empty active list.
//!
//! Memory: tensors a node only relabels (`Lowered::Alias`) share their source's bytes; tensors
//! that feed the NetOutput are written straight into the output buffers; the rest of a
//! graph's tensors and its kernels' workspaces are placed first-fit by live interval in the
//! feature-map region, the root's first and every branch overlaid after it. Constants are
//! stored only when a kernel reads them (a weight a kernel reads in a prepared layout is stored
//! in that layout only), deduplicated by content.

use std::collections::{BTreeMap, BTreeSet};

use gearsim_isa::gear::{SHAPE_TENSOR_BYTES, layout_table};
use gearsim_isa::omtask::{
    Addr, GetNextSlot, KernelArg, KernelImage, L2Control, ModelTasks, NamedTask, OmTask, OpInfo,
    Region, TensorInfo,
};
use gearsim_isa::task::{
    KERNEL_MIX_ONE_VECTOR, KERNEL_NEEDS_VALUES, KernelKind, L2Action, MAX_L2_SECTIONS,
};

use super::Target;
use super::gear::{self, GearSpec};
use super::ir::{Graph, Model, Node, NodeId, Tensor, TensorDesc, Value};
use super::lower::{Kernel, LowerCtx, LowerError, Lowered, Operand, lower_node};
use super::memory::{BufferOptimize, Interval, Weights, l2_keeps, place};

/// What emission produced.
#[derive(Debug, Clone, Default)]
pub struct Emitted {
    /// The kernels, each stored once, in `.om` order.
    pub kernels: Vec<Kernel>,
    /// The task streams.
    pub tasks: ModelTasks,
    /// The operator behind each kernel, AI CPU and selection task (the `OpInfo` section).
    pub ops: Vec<OpInfo>,
    /// The weights kernels read.
    pub weights: Weights,
    /// Feature-map bytes of the root graph (shared by every gear).
    pub root_feature_map: u64,
    /// Feature-map bytes of each branch, overlaid after the root's.
    pub branch_feature_map: Vec<u64>,
    /// Where each graph's tensors and workspaces went, for dumps and the verifier:
    /// `(graph name, node name, what, address, bytes)`.
    pub placements: Vec<Placement>,
}

/// Where one tensor or workspace lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Graph name.
    pub graph: String,
    /// Node name.
    pub node: String,
    /// `output <k>` or `workspace`.
    pub what: String,
    /// Its address.
    pub addr: Addr,
    /// Its size.
    pub bytes: u64,
}

/// Marks the kernels a timing-only run must still run in full mode: those whose scalar unit
/// reads input values ([`Kernel::value_inputs`]), and every kernel upstream of those inputs
/// or of an AI CPU operator's (`AiCpuOp::value_inputs`; the AI CPU always computes), back
/// to the graph's inputs and constants.
fn mark_needs_values(g: &Graph, lowered: &mut BTreeMap<NodeId, Lowered>) {
    let mut need: BTreeSet<NodeId> = BTreeSet::new();
    let mut upstream: Vec<NodeId> = Vec::new();
    for (id, l) in lowered.iter() {
        let inputs = &g.node(*id).inputs;
        let mut producers = |which: &[usize]| {
            upstream.extend(
                which
                    .iter()
                    .filter_map(|i| inputs.get(*i).copied().flatten())
                    .map(|v| v.node),
            );
        };
        match l {
            Lowered::Kernels { kernels, .. } => {
                for k in kernels {
                    if !k.value_inputs.is_empty() {
                        need.insert(*id);
                    }
                    producers(&k.value_inputs);
                }
            }
            Lowered::AiCpu { op } => producers(op.value_inputs()),
            Lowered::Alias { .. } => {}
        }
    }
    while let Some(id) = upstream.pop() {
        if need.insert(id) {
            upstream.extend(g.node(id).inputs.iter().flatten().map(|v| v.node));
        }
    }
    for id in need {
        if let Some(Lowered::Kernels { kernels, .. }) = lowered.get_mut(&id) {
            for k in kernels {
                k.needs_values = true;
            }
        }
    }
}

impl Emitted {
    /// The kernels as stored in the `.om`.
    pub fn kernel_images(&self) -> Result<Vec<KernelImage>, String> {
        self.kernels
            .iter()
            .map(|k| {
                Ok(KernelImage {
                    name: k.name.clone(),
                    tiling: k.tiling.clone(),
                    code: k
                        .program
                        .encode()
                        .map_err(|(pc, e)| format!("kernel {} pc {pc}: {e}", k.name))?,
                })
            })
            .collect()
    }

    /// The kernels' image flags, in `.om` order; `None` when no kernel has one (the `.om`
    /// then has no `KernelFlags` section).
    pub fn kernel_flags(&self) -> Option<Vec<u32>> {
        let flags: Vec<u32> = self
            .kernels
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let values = if k.needs_values {
                    KERNEL_NEEDS_VALUES
                } else {
                    0
                };
                let kind = if k.mix.is_some() {
                    KernelKind::Mix.flags() | KERNEL_MIX_ONE_VECTOR
                } else if i > 0 && self.kernels[i - 1].mix.is_some() {
                    KernelKind::Vector.flags()
                } else {
                    0
                };
                values | kind
            })
            .collect();
        flags.iter().any(|f| *f != 0).then_some(flags)
    }
}

/// A failure to emit, naming the graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// A node could not be lowered.
    #[error("in graph `{graph}`: {error}")]
    Lower {
        /// Graph name.
        graph: String,
        /// The lowering error.
        error: LowerError,
    },
    /// The graph has a shape emission cannot handle.
    #[error("in graph `{graph}`: {message}")]
    Graph {
        /// Graph name.
        graph: String,
        /// What is wrong.
        message: String,
    },
}

/// Where a value of a graph lives.
#[derive(Debug, Clone)]
enum Loc {
    /// A fixed address.
    At(Addr),
    /// A constant, stored in the weights when something reads it.
    Const(Tensor),
}

/// How a graph's boundary resolves.
struct Env {
    /// Each `Data` node's value.
    data: BTreeMap<NodeId, Loc>,
    /// Where NetOutput input j must end up (`None`: nowhere, the value stays internal).
    outputs: Vec<Option<Addr>>,
    /// Start of this graph's part of the feature-map region.
    fm_base: u64,
}

/// Emits a compiled model: `spec` is the gear configuration of a gear model (`None` for a
/// static one).
pub fn emit(model: &Model, spec: Option<&GearSpec>, target: &Target) -> Result<Emitted, EmitError> {
    let mut e = Emitter {
        target,
        out: Emitted::default(),
        code_index: BTreeMap::new(),
    };
    let root = &model.graph;
    let head = match spec {
        None => {
            let env = Env {
                data: root_inputs(root),
                outputs: (0..net_inputs(root).len())
                    .map(|k| Some(Addr::new(Region::Output(k as u32), 0)))
                    .collect(),
                fm_base: 0,
            };
            let (mut tasks, bytes) = e.graph(root, &env)?;
            e.out.root_feature_map = bytes;
            tasks.push(named(OmTask::EndGraph, "EndGraph"));
            tasks
        }
        Some(spec) => e.gear_root(model, spec)?,
    };
    let fm = e.out.root_feature_map + e.out.branch_feature_map.iter().copied().max().unwrap_or(0);
    let mut stream = Vec::with_capacity(head.len());
    for (index, t) in head.into_iter().enumerate() {
        if let Some(mut op) = t.op {
            op.stream = 0;
            op.task = index as u32;
            e.out.ops.push(op);
        }
        stream.push(t.task);
    }
    e.out.tasks.streams = vec![stream];
    e.out.tasks.feature_map_bytes = fm;
    Ok(e.out)
}

/// A task being emitted and, for a kernel, AI CPU or gear-selection task, the operator it runs
/// (its stream and index are filled in when the stream is complete).
struct Emission {
    task: NamedTask,
    op: Option<OpInfo>,
}

fn named(task: OmTask, name: impl Into<String>) -> Emission {
    Emission {
        task: NamedTask {
            task,
            name: name.into(),
        },
        op: None,
    }
}

/// `task`, named after `node`, running `op_type` on the node's tensors.
fn of_node(
    task: OmTask,
    name: impl Into<String>,
    op_type: &str,
    g: &Graph,
    node: &Node,
) -> Emission {
    let info = |d: &TensorDesc| TensorInfo {
        dtype: d.dtype.ge_name().to_string(),
        format: d.format.name().to_string(),
        dims: d.shape.iter().map(|x| x.fixed().unwrap_or(-1)).collect(),
    };
    Emission {
        op: Some(OpInfo {
            stream: 0,
            task: 0,
            op_type: op_type.to_string(),
            inputs: node
                .inputs
                .iter()
                .flatten()
                .map(|v| info(g.desc(*v)))
                .collect(),
            outputs: node.outputs.iter().map(info).collect(),
        }),
        ..named(task, name)
    }
}

fn net_inputs(g: &Graph) -> Vec<Option<Value>> {
    g.nodes
        .iter()
        .find(|n| n.op == "NetOutput")
        .map(|n| n.inputs.clone())
        .unwrap_or_default()
}

/// A static graph's Data nodes in order are model inputs 0, 1, ...
fn root_inputs(g: &Graph) -> BTreeMap<NodeId, Loc> {
    g.of_type("Data")
        .into_iter()
        .enumerate()
        .map(|(k, id)| (id, Loc::At(Addr::new(Region::Input(k as u32), 0))))
        .collect()
}

fn bytes_of(d: &TensorDesc) -> u64 {
    d.bytes().unwrap_or(0)
}

struct Emitter<'a> {
    target: &'a Target,
    out: Emitted,
    /// Encoded kernel code -> kernel index.
    code_index: BTreeMap<Vec<u8>, u32>,
}

impl Emitter<'_> {
    fn resolve(&mut self, loc: &Loc) -> Addr {
        match loc {
            Loc::At(a) => *a,
            Loc::Const(t) => Addr::new(Region::Weights, self.out.weights.add(t).offset),
        }
    }

    fn kernel_index(&mut self, k: &Kernel, graph: &str) -> Result<u32, EmitError> {
        let code = k.program.encode().map_err(|(pc, err)| EmitError::Graph {
            graph: graph.to_string(),
            message: format!("kernel {} does not encode at pc {pc}: {err}", k.name),
        })?;
        if let Some(i) = self.code_index.get(&code) {
            // One image serves every launch of this code: it runs in full mode if any does.
            let parts = if k.mix.is_some() { 2 } else { 1 };
            for part in &mut self.out.kernels[*i as usize..*i as usize + parts] {
                part.needs_values |= k.needs_values;
            }
            return Ok(*i);
        }
        let i = self.out.kernels.len() as u32;
        self.out.kernels.push(k.clone());
        // A MIX kernel's vector program is the image after its cube program's.
        if let Some(mix) = &k.mix {
            self.out.kernels.push(Kernel {
                name: format!("{}_aiv", k.name),
                program: mix.vector.clone(),
                comments: mix.comments.clone(),
                mix: None,
                ..k.clone()
            });
        }
        self.code_index.insert(code, i);
        Ok(i)
    }

    /// The tasks of one graph (no EndGraph) and the feature-map bytes it needs past its base.
    fn graph(&mut self, g: &Graph, env: &Env) -> Result<(Vec<Emission>, u64), EmitError> {
        // 0. Formats: which values stay in the fractal format between convolutions.
        let mut laid = g.clone();
        let is_const = |v: Value| self.constant_value(g, env, v).is_some();
        super::layout::assign_fractal_formats(&mut laid, self.target, &is_const);
        let g = &laid;
        let gname = g.name.clone();
        let n = g.nodes.len();
        // 1. Lower every compute node.
        let mut lowered: BTreeMap<NodeId, Lowered> = BTreeMap::new();
        for (i, node) in g.nodes.iter().enumerate() {
            if matches!(node.op.as_str(), "Data" | "Const" | "NetOutput") {
                continue;
            }
            let id = NodeId(i as u32);
            let inputs: Vec<Option<&TensorDesc>> =
                node.inputs.iter().map(|v| v.map(|v| g.desc(v))).collect();
            let values: Vec<Option<&Tensor>> = node
                .inputs
                .iter()
                .map(|v| v.and_then(|v| self.constant_value(g, env, v)))
                .collect();
            let ctx = LowerCtx {
                node,
                inputs,
                values,
                outputs: &node.outputs,
                target: self.target,
            };
            let l = lower_node(&ctx).map_err(|error| EmitError::Lower {
                graph: gname.clone(),
                error,
            })?;
            lowered.insert(id, l);
        }
        // 1b. Values a timing-only run must still compute.
        mark_needs_values(g, &mut lowered);
        // 2. Aliases: a relabelled value shares its source's bytes.
        let source = |mut v: Value| -> Value {
            while let Some(Lowered::Alias { input }) = lowered.get(&v.node) {
                match g.node(v.node).inputs.get(*input).copied().flatten() {
                    Some(next) => v = next,
                    None => break,
                }
            }
            v
        };
        let produced_by_kernel = |v: Value| {
            matches!(
                lowered.get(&v.node),
                Some(Lowered::Kernels { .. } | Lowered::AiCpu { .. })
            )
        };
        // 3. Output anchors: a kernel-made value feeding NetOutput slot j is written there.
        let net = net_inputs(g);
        let mut anchor: BTreeMap<Value, Addr> = BTreeMap::new();
        let mut copies: Vec<(usize, Value)> = Vec::new();
        for (j, v) in net.iter().enumerate() {
            let Some(v) = v else { continue };
            let s = source(*v);
            match env.outputs.get(j).copied().flatten() {
                Some(dst) if produced_by_kernel(s) && !anchor.contains_key(&s) => {
                    anchor.insert(s, dst);
                }
                Some(_) => copies.push((j, *v)),
                None => {}
            }
        }
        // 4. Feature-map placement of the other kernel-made values and of workspaces.
        let mut last_use: BTreeMap<Value, usize> = BTreeMap::new();
        for (i, node) in g.nodes.iter().enumerate() {
            let at = if node.op == "NetOutput" { n } else { i };
            for v in node.inputs.iter().flatten() {
                let s = source(*v);
                let e = last_use.entry(s).or_insert(at);
                *e = (*e).max(at);
            }
        }
        let mut items: Vec<(Value, Option<usize>, Interval)> = Vec::new(); // (value, workspace node)
        for (id, l) in &lowered {
            let i = id.0 as usize;
            let workspace_bytes = match l {
                Lowered::Kernels {
                    workspace_bytes, ..
                } => Some(workspace_bytes),
                Lowered::AiCpu { .. } => Some(&0),
                Lowered::Alias { .. } => None,
            };
            if let Some(workspace_bytes) = workspace_bytes {
                for (k, d) in g.node(*id).outputs.iter().enumerate() {
                    let v = Value {
                        node: *id,
                        output: k as u32,
                    };
                    if anchor.contains_key(&v) {
                        continue;
                    }
                    let last = last_use.get(&v).copied().unwrap_or(i);
                    items.push((
                        v,
                        None,
                        Interval {
                            first: i,
                            last,
                            bytes: bytes_of(d),
                        },
                    ));
                }
                if *workspace_bytes > 0 {
                    items.push((
                        Value {
                            node: *id,
                            output: u32::MAX,
                        },
                        Some(i),
                        Interval {
                            first: i,
                            last: i,
                            bytes: *workspace_bytes,
                        },
                    ));
                }
            }
        }
        let intervals: Vec<Interval> = items.iter().map(|(_, _, iv)| *iv).collect();
        let (offsets, fm_bytes) = place(&intervals);
        let mut fm: BTreeMap<Value, Addr> = BTreeMap::new();
        let mut workspace: BTreeMap<NodeId, Addr> = BTreeMap::new();
        for ((v, ws, iv), off) in items.iter().zip(&offsets) {
            let addr = Addr::new(Region::FeatureMap, env.fm_base + off);
            let what = match ws {
                Some(_) => {
                    workspace.insert(v.node, addr);
                    "workspace".to_string()
                }
                None => {
                    fm.insert(*v, addr);
                    format!("output {}", v.output)
                }
            };
            self.out.placements.push(Placement {
                graph: gname.clone(),
                node: g.node(v.node).name.clone(),
                what,
                addr,
                bytes: iv.bytes,
            });
        }
        for (v, a) in &anchor {
            self.out.placements.push(Placement {
                graph: gname.clone(),
                node: g.node(v.node).name.clone(),
                what: format!("output {}", v.output),
                addr: *a,
                bytes: bytes_of(g.desc(*v)),
            });
        }
        // Where a value lives.
        let locate = |this: &mut Self, v: Value| -> Result<Addr, EmitError> {
            let s = source(v);
            if let Some(a) = anchor.get(&s).or_else(|| fm.get(&s)) {
                return Ok(*a);
            }
            let node = g.node(s.node);
            match node.op.as_str() {
                "Data" => match env.data.get(&s.node) {
                    Some(l) => Ok(this.resolve(&l.clone())),
                    None => Err(EmitError::Graph {
                        graph: g.name.clone(),
                        message: format!("Data node `{}` is not bound to an input", node.name),
                    }),
                },
                "Const" => match node.tensor("value") {
                    Some(t) => Ok(this.resolve(&Loc::Const(t.clone()))),
                    None => Err(EmitError::Graph {
                        graph: g.name.clone(),
                        message: format!("Const node `{}` has no value", node.name),
                    }),
                },
                _ => Err(EmitError::Graph {
                    graph: g.name.clone(),
                    message: format!(
                        "output {} of node `{}` has no storage (nothing lowered it)",
                        s.output, node.name
                    ),
                }),
            }
        };
        // 4b. L2 control (`--buffer_optimize=l2_optimize`): each placed block is forgotten
        // after the last kernel of its last reader (or of the last kernel node before it, when
        // that reader is a relabelling), and kept from its producer's start when the budget
        // allows.
        let l2_on = self.target.buffer_optimize == BufferOptimize::L2Optimize
            && self.target.core.l2_bytes > 0;
        let mut l2_at_start: BTreeMap<usize, Vec<L2Control>> = BTreeMap::new();
        let mut l2_at_end: BTreeMap<usize, Vec<L2Control>> = BTreeMap::new();
        if l2_on {
            let keeps = l2_keeps(&intervals, self.target.core.l2_keep_bytes());
            let kernel_nodes: Vec<usize> = lowered
                .iter()
                .filter(|(_, l)| matches!(l, Lowered::Kernels { .. }))
                .map(|(id, _)| id.0 as usize)
                .collect();
            for (((v, ws, iv), off), keep) in items.iter().zip(&offsets).zip(&keeps) {
                let addr = Addr::new(Region::FeatureMap, env.fm_base + off);
                let section = |action| L2Control {
                    addr,
                    bytes: iv.bytes,
                    action,
                };
                let producer = ws.unwrap_or(v.node.0 as usize);
                if *keep {
                    l2_at_start
                        .entry(producer)
                        .or_default()
                        .push(section(L2Action::Keep));
                }
                let reader = kernel_nodes.iter().rev().find(|&&k| k <= iv.last);
                if let Some(&reader) = reader {
                    l2_at_end
                        .entry(reader)
                        .or_default()
                        .push(section(L2Action::Drop));
                }
            }
        }
        // 5. Tasks in node order.
        let mut tasks = Vec::new();
        for (id, l) in &lowered {
            let node = g.node(*id);
            let (kernels, derived) = match l {
                Lowered::Kernels {
                    kernels, derived, ..
                } => (kernels, derived),
                Lowered::Alias { .. } => continue,
                Lowered::AiCpu { op } => {
                    let mut arg = |v: Value| -> Result<KernelArg, EmitError> {
                        Ok(KernelArg {
                            addr: locate(self, v)?,
                            bytes: bytes_of(g.desc(v)),
                        })
                    };
                    let inputs = node
                        .inputs
                        .iter()
                        .take(op.input_count())
                        .map(|v| {
                            v.ok_or_else(|| EmitError::Graph {
                                graph: gname.clone(),
                                message: format!(
                                    "AI CPU operator `{}` has an absent input",
                                    node.name
                                ),
                            })
                            .and_then(&mut arg)
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    let outputs = (0..node.outputs.len())
                        .map(|k| {
                            arg(Value {
                                node: *id,
                                output: k as u32,
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    tasks.push(of_node(
                        OmTask::AiCpu {
                            op: op.clone(),
                            inputs,
                            outputs,
                        },
                        node.name.clone(),
                        &node.op,
                        g,
                        node,
                    ));
                    continue;
                }
            };
            // A launch carries at most MAX_L2_SECTIONS: the node's drops first (a dead section
            // written back costs traffic), then its keeps.
            let mut ends = l2_at_end.remove(&(id.0 as usize)).unwrap_or_default();
            let mut starts = l2_at_start.remove(&(id.0 as usize)).unwrap_or_default();
            let cap = MAX_L2_SECTIONS as usize;
            ends.truncate(cap);
            if kernels.len() == 1 {
                starts.truncate(cap - ends.len());
            } else {
                starts.truncate(cap);
            }
            for (ki, k) in kernels.iter().enumerate() {
                let mut args = Vec::with_capacity(k.args.len());
                for a in &k.args {
                    let (addr, bytes) = match *a {
                        Operand::Input(i) | Operand::InputFrom(i, _) => {
                            match node.inputs.get(i).copied().flatten() {
                                Some(v) => {
                                    let at = a.offset();
                                    let bytes = bytes_of(g.desc(v)).saturating_sub(at);
                                    (locate(self, v)?.plus(at), bytes)
                                }
                                None => {
                                    return Err(EmitError::Graph {
                                        graph: gname.clone(),
                                        message: format!(
                                            "kernel {} reads input {i} of `{}`, which is absent",
                                            k.name, node.name
                                        ),
                                    });
                                }
                            }
                        }
                        Operand::Output(i) | Operand::OutputFrom(i, _) => {
                            let v = Value {
                                node: *id,
                                output: i as u32,
                            };
                            let at = a.offset();
                            let bytes = bytes_of(g.desc(v)).saturating_sub(at);
                            (locate(self, v)?.plus(at), bytes)
                        }
                        Operand::Derived(i) => match derived.get(i) {
                            Some(t) => (self.resolve(&Loc::Const(t.clone())), t.data.len() as u64),
                            None => {
                                return Err(EmitError::Graph {
                                    graph: gname.clone(),
                                    message: format!(
                                        "kernel {} reads derived constant {i}; `{}` has {}",
                                        k.name,
                                        node.name,
                                        derived.len()
                                    ),
                                });
                            }
                        },
                        Operand::Workspace(off) => match (workspace.get(id), l) {
                            (
                                Some(w),
                                Lowered::Kernels {
                                    workspace_bytes, ..
                                },
                            ) => (w.plus(off), workspace_bytes.saturating_sub(off)),
                            _ => {
                                return Err(EmitError::Graph {
                                    graph: gname.clone(),
                                    message: format!(
                                        "kernel {} reads a workspace `{}` did not ask for",
                                        k.name, node.name
                                    ),
                                });
                            }
                        },
                    };
                    args.push(KernelArg { addr, bytes });
                }
                let kernel = self.kernel_index(k, &gname)?;
                // A layout conversion the lowering put beside the node's own kernel is its
                // own op in the profile, as GE's inserted TransData nodes are.
                let conversion = |k: &crate::lower::Kernel| k.name.starts_with("TransData");
                let own = kernels.iter().filter(|k| !conversion(k)).count();
                let (name, op_type) = if conversion(k) {
                    let i = kernels[..ki].iter().filter(|k| conversion(k)).count();
                    (format!("{}/trans_TransData_{i}", node.name), "TransData")
                } else if own == 1 {
                    (node.name.clone(), node.op.as_str())
                } else {
                    (format!("{}#{ki}", node.name), node.op.as_str())
                };
                let mut l2 = Vec::new();
                if ki == 0 {
                    l2.append(&mut starts);
                }
                if ki + 1 == kernels.len() {
                    l2.append(&mut ends);
                }
                tasks.push(of_node(
                    OmTask::AiCore {
                        kernel,
                        block_dim: k.block_dim,
                        args,
                        l2,
                    },
                    name,
                    op_type,
                    g,
                    node,
                ));
            }
        }
        // 6. Outputs that need a copy (an input or constant returned as is, a value returned
        // twice).
        for (j, v) in copies {
            let Some(dst) = env.outputs.get(j).copied().flatten() else {
                continue;
            };
            let src = locate(self, v)?;
            let size = bytes_of(g.desc(v));
            if size > 0 {
                tasks.push(named(
                    OmTask::Memcpy { dst, src, size },
                    format!("{}/copy_output_{j}", g.name),
                ));
            }
        }
        Ok((tasks, fm_bytes))
    }

    /// The constant value behind `v` when it is one (a Const, or a branch Data standing for a
    /// root Const).
    fn constant_value<'g>(&self, g: &'g Graph, env: &'g Env, v: Value) -> Option<&'g Tensor> {
        let node = g.node(v.node);
        match node.op.as_str() {
            "Const" => node.tensor("value"),
            "Data" => match env.data.get(&v.node) {
                Some(Loc::Const(t)) => Some(t),
                _ => None,
            },
            _ => None,
        }
    }

    /// The root of a gear model: its own tensors, the selection tasks and every branch.
    fn gear_root(&mut self, model: &Model, spec: &GearSpec) -> Result<Vec<Emission>, EmitError> {
        let g = &model.graph;
        let gname = g.name.clone();
        let err = |message: String| EmitError::Graph {
            graph: gname.clone(),
            message,
        };
        // Root tensors, placed one after another (they are few and all live the whole run).
        let mut top = 0u64;
        let mut alloc = |this: &mut Self, node: &Node, what: String, bytes: u64| -> Addr {
            let a = Addr::new(Region::FeatureMap, top);
            top += bytes.max(1).div_ceil(super::memory::ALIGN) * super::memory::ALIGN;
            this.out.placements.push(Placement {
                graph: g.name.clone(),
                node: node.name.clone(),
                what,
                addr: a,
                bytes,
            });
            a
        };
        let mut root_loc: BTreeMap<Value, Loc> = BTreeMap::new();
        let mut tasks = Vec::new();
        let mut input_k = 0u32;
        let mut case_id = None;
        let mut index_addr = None;
        let mut gear_vector = None;
        for (i, node) in g.nodes.iter().enumerate() {
            let id = NodeId(i as u32);
            let v0 = Value {
                node: id,
                output: 0,
            };
            match node.op.as_str() {
                "Data" => {
                    root_loc.insert(v0, Loc::At(Addr::new(Region::Input(input_k), 0)));
                    if node.name == gear::SHAPE_DATA {
                        gear_vector = Some(Addr::new(Region::Input(input_k), 0));
                    }
                    input_k += 1;
                }
                "Const" => {
                    let t = node
                        .tensor("value")
                        .ok_or_else(|| err(format!("Const `{}` has no value", node.name)))?;
                    let t = if node.name == gear::SHAPE_CONST {
                        // The gear table, laid out the way MapIndex scans it.
                        let n = spec.gears.first().map_or(0, Vec::len) as u32;
                        let gm: Vec<i32> = t.to_i64s().iter().map(|v| *v as i32).collect();
                        let table = layout_table(&gm, n, spec.gears.len() as u32, layout(spec));
                        Tensor::from_i32s(vec![table.len() as i64], &table)
                    } else {
                        t.clone()
                    };
                    root_loc.insert(v0, Loc::Const(t));
                }
                "GetNext" => {
                    let d = node.outputs.len() / 2;
                    let mut outputs = Vec::with_capacity(d);
                    for k in 0..d {
                        let bytes = bytes_of(&node.outputs[k]);
                        let data = alloc(self, node, format!("output {k}"), bytes);
                        let shape = alloc(self, node, format!("shape {k}"), SHAPE_TENSOR_BYTES);
                        root_loc.insert(
                            Value {
                                node: id,
                                output: k as u32,
                            },
                            Loc::At(data),
                        );
                        root_loc.insert(
                            Value {
                                node: id,
                                output: (d + k) as u32,
                            },
                            Loc::At(shape),
                        );
                        outputs.push(GetNextSlot {
                            data,
                            capacity: bytes,
                            shape,
                        });
                    }
                    tasks.push(of_node(
                        OmTask::GetNext { outputs },
                        node.name.clone(),
                        &node.op,
                        g,
                        node,
                    ));
                }
                "GetDynamicDims" => {
                    let out = alloc(self, node, "output 0".into(), bytes_of(&node.outputs[0]));
                    let shapes = node
                        .inputs
                        .iter()
                        .map(|v| match v.and_then(|v| root_loc.get(&v)) {
                            Some(Loc::At(a)) => Ok(*a),
                            _ => Err(err(format!(
                                "an input of `{}` is not a shape tensor",
                                node.name
                            ))),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    let shape_info = node.ints("shape_info").unwrap_or(&[]).to_vec();
                    root_loc.insert(v0, Loc::At(out));
                    gear_vector = Some(out);
                    self.out.tasks.dims_out = Some(out);
                    tasks.push(of_node(
                        OmTask::GetDynamicDims {
                            shape_info,
                            shapes,
                            out,
                        },
                        node.name.clone(),
                        &node.op,
                        g,
                        node,
                    ));
                }
                "MapIndex" => {
                    let y = alloc(self, node, "output 0".into(), 4);
                    let x = gear_vector.ok_or_else(|| err("MapIndex has no gear vector".into()))?;
                    let table = match node
                        .inputs
                        .get(1)
                        .copied()
                        .flatten()
                        .and_then(|v| root_loc.get(&v))
                    {
                        Some(l) => self.resolve(&l.clone()),
                        None => return Err(err("MapIndex has no gear table".into())),
                    };
                    root_loc.insert(v0, Loc::At(y));
                    index_addr = Some(y);
                    tasks.push(of_node(
                        OmTask::MapIndex {
                            engine: engine(spec),
                            layout: layout(spec),
                            n: spec.gears.first().map_or(0, Vec::len) as u32,
                            gears: spec.gears.len() as u32,
                            x,
                            table,
                            y,
                        },
                        node.name.clone(),
                        &node.op,
                        g,
                        node,
                    ));
                }
                "Case" => case_id = Some(id),
                "NetOutput" => {}
                op => {
                    return Err(err(format!(
                        "node `{}` ({op}) in the root of a gear model is not expected",
                        node.name
                    )));
                }
            }
        }
        let case_id = case_id.ok_or_else(|| err("the root has no Case".into()))?;
        self.out.root_feature_map = top;
        let case = g.node(case_id);
        let net = net_inputs(g);
        // Where Case output j goes: the output buffer of the NetOutput slot reading it.
        let case_out: Vec<Option<Addr>> = (0..case.outputs.len())
            .map(|j| {
                net.iter()
                    .position(|v| {
                        *v == Some(Value {
                            node: case_id,
                            output: j as u32,
                        })
                    })
                    .map(|k| Addr::new(Region::Output(k as u32), 0))
            })
            .collect();
        let index = index_addr.ok_or_else(|| err("the root has no MapIndex".into()))?;
        let branches = case.subgraphs.len();
        let case_name = case.name.clone();
        // Labels: L_exit = 0, L_i = 1 + i (none for a single branch).
        let labelled = branches > 1;
        if labelled {
            self.out.tasks.labels = branches as u32 + 1;
            tasks.push(named(
                OmTask::LabelSwitch {
                    index,
                    labels: (1..=branches as u32).collect(),
                },
                format!("{case_name}/LabelSwitch"),
            ));
        }
        for (i, bname) in case.subgraphs.iter().enumerate() {
            let b = model.subgraph(bname).ok_or_else(|| {
                err(format!(
                    "the Case names branch {bname}, which does not exist"
                ))
            })?;
            let mut data = BTreeMap::new();
            for (k, n) in b.nodes.iter().enumerate() {
                if n.op != "Data" {
                    continue;
                }
                let p = n.int("_parent_node_index").unwrap_or(-1);
                let parent = usize::try_from(p)
                    .ok()
                    .and_then(|p| case.inputs.get(p).copied().flatten())
                    .ok_or_else(|| {
                        err(format!("branch Data `{}` has no parent input {p}", n.name))
                    })?;
                let loc = root_loc
                    .get(&parent)
                    .cloned()
                    .ok_or_else(|| err(format!("Case input {p} has no storage")))?;
                data.insert(NodeId(k as u32), loc);
            }
            let env = Env {
                data,
                outputs: case_out.clone(),
                fm_base: self.out.root_feature_map,
            };
            if labelled {
                tasks.push(named(
                    OmTask::LabelSet {
                        label: 1 + i as u32,
                    },
                    format!("{case_name}/LabelSet_{i}"),
                ));
            }
            tasks.push(named(
                OmTask::StreamActive { stream: None },
                format!("{case_name}/StreamActive_{i}"),
            ));
            let (branch_tasks, bytes) = self.graph(b, &env)?;
            tasks.extend(branch_tasks);
            self.out.branch_feature_map.push(bytes);
            if labelled {
                if i + 1 < branches {
                    tasks.push(named(
                        OmTask::LabelGoto { label: 0 },
                        format!("{case_name}/LabelGoto_{i}"),
                    ));
                } else {
                    tasks.push(named(
                        OmTask::LabelSet { label: 0 },
                        format!("{case_name}/LabelSet_Last"),
                    ));
                }
            }
        }
        // Direct outputs: a root input returned as is is copied into its output buffer.
        for (k, v) in net.iter().enumerate() {
            let Some(v) = v else { continue };
            if v.node == case_id || g.node(v.node).op == "GetDynamicDims" {
                continue;
            }
            let Some(loc) = root_loc.get(v).cloned() else {
                continue;
            };
            let src = self.resolve(&loc);
            let size = bytes_of(g.desc(*v));
            if size > 0 {
                tasks.push(named(
                    OmTask::Memcpy {
                        dst: Addr::new(Region::Output(k as u32), 0),
                        src,
                        size,
                    },
                    format!("{}/copy_output_{k}", g.name),
                ));
            }
        }
        tasks.push(named(OmTask::EndGraph, "EndGraph"));
        Ok(tasks)
    }
}

fn layout(spec: &GearSpec) -> gearsim_isa::gear::TableLayout {
    gearsim_isa::gear::TableLayout::from_code(spec.table_layout).unwrap_or_default()
}

fn engine(spec: &GearSpec) -> gearsim_isa::gear::MapIndexEngine {
    gearsim_isa::gear::MapIndexEngine::from_code(spec.mapindex_engine).unwrap_or_default()
}
