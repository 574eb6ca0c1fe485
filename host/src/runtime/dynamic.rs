//! Hybrid mode's dynamic-shape path (spec §10, seed 002): input shapes that match no gear run
//! the original graph op by op, with shapes inferred for the actual inputs, kernels lowered
//! for those shapes and cached, and device buffers reused while they are large enough.
//!
//! ```text
//!   run(inputs) ─ update_shape: the graph's Data shapes := the inputs' shapes; infer + fold
//!     for each node in order:
//!       Alias (Reshape, Flatten, ...) ─ its output is its input's buffer
//!       update_impl: kernels for (op, attributes, input types and shapes, constant inputs)
//!                    ─ the cache, or lower_node + load the kernels (a miss)
//!       realloc_if_needed: each output's buffer, grown only when too small
//!       launch each kernel on the runtime's stream (its argument array rewritten)
//!   outputs ─ D2H at their inferred shapes
//! ```
//!
//! The `.om` of a hybrid model carries the source ONNX bytes in its `Graph` section; the
//! lowering is the compiler's own, so the dynamic path computes what a static compile for
//! those shapes would.

use std::collections::BTreeMap;
use std::sync::Arc;

use gearsim_firmware::kernels::{AiCpuKernelId, AiCpuOpArgs};
use gearsim_firmware::{Device, DevicePtr, HostPtr, KernelHandle};
use gearsim_isa::aicpu_op::AiCpuOp;
use gearsim_isa::om::ModelDesc;
use gearsim_isa::task::{AiCoreKernel, KERNEL_NEEDS_VALUES, Task};
use gearsim_traces::TraceSink;

use super::copy::{self, Link, Transfers};
use super::error::{DynamicError, RuntimeError};
use super::host_work::costs;
use crate::target;
use gearsim_compiler::infer::{fold_constants, infer_graph};
use gearsim_compiler::ir::{Format, Graph, Model, NodeId, Tensor, Value, fixed_shape};
use gearsim_compiler::lower::{LowerCtx, Lowered, Operand, lower_node};
use gearsim_compiler::onnx;
use gearsim_compiler::ops;
use gearsim_compiler::precision::{self, PrecisionMode};

/// Kernels lowered for one op configuration, loaded on the device.
struct CachedOp {
    /// Aliases have no kernels.
    alias: Option<usize>,
    /// An operator the AI CPU runs instead of kernels.
    aicpu: Option<AiCpuOp>,
    kernels: Vec<(KernelHandle, u32, Vec<Operand>)>,
    /// Derived constants, uploaded.
    derived: Vec<DevicePtr>,
    workspace_bytes: u64,
}

/// A device buffer that only grows.
#[derive(Debug, Clone, Copy)]
struct Buffer {
    ptr: DevicePtr,
    capacity: u64,
}

/// What the dynamic path did in its runs so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DynamicStats {
    /// Runs.
    pub runs: u64,
    /// Op configurations lowered (cache misses).
    pub lowered: u64,
    /// Kernel lookups served by the cache.
    pub cache_hits: u64,
    /// Buffers allocated or grown.
    pub reallocs: u64,
    /// Buffers reused as they were.
    pub reused: u64,
}

/// The dynamic-shape executable of a hybrid model.
pub struct DynamicModel {
    model: Model,
    /// Model input name → its layout name, from the description.
    formats: BTreeMap<String, String>,
    /// The precision mode the model was compiled with (what its gear branches compute in);
    /// files that do not record one computed in the model's types.
    precision: PrecisionMode,
    cache: BTreeMap<String, CachedOp>,
    /// Per value name, its buffer.
    buffers: BTreeMap<String, Buffer>,
    /// Uploaded constants: node name → (value, buffer).
    constants: BTreeMap<String, (Arc<Vec<u8>>, Buffer)>,
    workspace: Option<Buffer>,
    /// One argument array per launch of a run, in launch order, so that a launch never waits
    /// for the one before it to read its arguments.
    args: Vec<Buffer>,
    /// Pinned host staging buffers by size class.
    staging: BTreeMap<String, (HostPtr, u64)>,
    stats: DynamicStats,
    /// Allocations the host has been charged for.
    charged_allocs: u64,
    /// Buffers replaced during a run: kernels launched before may still use them (launches
    /// are asynchronous), so they are freed only once the run has synchronised.
    retired: Vec<DevicePtr>,
}

impl DynamicModel {
    /// Reads the source graph a hybrid `.om` carries.
    pub fn new(graph: &[u8], desc: &ModelDesc) -> Result<DynamicModel, RuntimeError> {
        let imported = onnx::import(graph, &format!("{} (hybrid source graph)", desc.name))
            .map_err(DynamicError::from)?;
        let precision = match desc
            .build_options
            .iter()
            .find(|(k, _)| k == "precision_mode")
        {
            Some((_, v)) => PrecisionMode::parse(v)
                .map_err(|e| DynamicError::Graph(format!("the model's build options: {e}")))?,
            None => PrecisionMode::MustKeepOriginDtype,
        };
        Ok(DynamicModel {
            precision,
            model: imported.model,
            formats: desc
                .inputs
                .iter()
                .map(|i| (i.name.clone(), i.format.clone()))
                .collect(),
            cache: BTreeMap::new(),
            buffers: BTreeMap::new(),
            constants: BTreeMap::new(),
            workspace: None,
            args: Vec::new(),
            staging: BTreeMap::new(),
            stats: DynamicStats::default(),
            charged_allocs: 0,
            retired: Vec::new(),
        })
    }

    /// What the path did so far.
    pub fn stats(&self) -> DynamicStats {
        self.stats
    }

    /// update_shape: the graph for these inputs, inferred and folded.
    fn shaped_graph(&self, inputs: &[Tensor], names: &[String]) -> Result<Graph, RuntimeError> {
        let mut g = self.model.graph.clone();
        for (x, name) in inputs.iter().zip(names) {
            let id = g.find(name).ok_or_else(|| {
                DynamicError::Graph(format!("the source graph has no input `{name}`"))
            })?;
            let d = &mut g.node_mut(id).outputs[0];
            d.shape = fixed_shape(&x.dims);
            if x.dims.len() == 4 {
                d.format = self
                    .formats
                    .get(name)
                    .and_then(|f| Format::parse(f))
                    .unwrap_or(Format::Nchw);
            }
        }
        let known =
            infer_graph(&mut g, &ops::standard(), self.model.opset).map_err(DynamicError::Infer)?;
        fold_constants(&mut g, &known);
        // The same types as the gear branches: fp32 ops the mode computes in fp16 do so here
        // too, with casts at the edges.
        precision::apply(&mut g, self.precision, &precision::const_node);
        Ok(g)
    }

    /// Runs the graph on `inputs` (the data inputs in model order).
    pub(crate) fn run<S: TraceSink>(
        &mut self,
        mut l: Link<'_, S>,
        inputs: &[Tensor],
        names: &[String],
    ) -> Result<(Vec<Tensor>, Transfers), RuntimeError> {
        self.stats.runs += 1;
        let g = self.shaped_graph(inputs, names)?;
        let ops = g
            .nodes
            .iter()
            .filter(|n| !matches!(n.op.as_str(), "Data" | "Const" | "NetOutput"))
            .count() as u64;
        let infer = costs(l.dev).infer_shape_ns.saturating_mul(ops);
        l.host.work(l.dev, "update_shape", infer)?;
        let target = target::for_chip(l.dev.chip().config());
        let mut launches = 0usize;
        let mut t = Transfers::default();
        // Where each value lives.
        let mut at: BTreeMap<Value, DevicePtr> = BTreeMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            let id = NodeId(i as u32);
            let v0 = Value {
                node: id,
                output: 0,
            };
            match n.op.as_str() {
                "Data" => {
                    let k = names.iter().position(|x| *x == n.name).ok_or_else(|| {
                        DynamicError::Graph(format!("graph input `{}` is no model input", n.name))
                    })?;
                    let b = self.buffer(l.dev, &n.name, inputs[k].data.len() as u64)?;
                    let pinned = self.stage(l.dev, &n.name, inputs[k].data.len() as u64)?;
                    self.charge_allocs(&mut l)?;
                    copy::h2d(
                        l.reborrow(),
                        &format!("memcpy_h2d input {k}"),
                        pinned,
                        b.ptr.0,
                        &inputs[k].data,
                        &mut t,
                    )?;
                    at.insert(v0, b.ptr);
                }
                "Const" => {
                    let value = n.tensor("value").ok_or_else(|| {
                        DynamicError::Graph(format!("constant `{}` has no value", n.name))
                    })?;
                    let p = self.constant(l.dev, &n.name, value)?;
                    at.insert(v0, p);
                }
                "NetOutput" => {}
                _ => self.node(&mut l, &g, id, &target, &mut at, &mut launches)?,
            }
        }
        // Outputs.
        l.host.sync(l.dev, l.stream)?;
        for p in self.retired.drain(..) {
            l.dev.free(p)?;
        }
        let net = g
            .nodes
            .iter()
            .find(|n| n.op == "NetOutput")
            .ok_or_else(|| DynamicError::Graph("the graph has no outputs".into()))?;
        let mut outputs = Vec::new();
        for (o, v) in net.inputs.iter().enumerate() {
            let v = v.ok_or_else(|| DynamicError::Graph(format!("output {o} is absent")))?;
            let d = g.desc(v);
            let dims: Vec<i64> = d.shape.iter().map(|x| x.fixed().unwrap_or(0)).collect();
            let bytes = d.bytes().unwrap_or(0);
            let src = at
                .get(&v)
                .copied()
                .ok_or_else(|| DynamicError::Graph(format!("output {o} was never computed")))?;
            let pinned = self.stage(l.dev, &format!("output {o}"), bytes)?;
            let data = copy::d2h(
                l.reborrow(),
                &format!("memcpy_d2h output {o}"),
                src.0,
                pinned,
                bytes,
                &mut t,
            )?;
            outputs.push(Tensor::new(d.dtype, dims, data).map_err(DynamicError::Graph)?);
        }
        Ok((outputs, t))
    }

    /// update_impl + realloc_if_needed + launch for one node.
    fn node<S: TraceSink>(
        &mut self,
        l: &mut Link<'_, S>,
        g: &Graph,
        id: NodeId,
        target: &gearsim_compiler::Target,
        at: &mut BTreeMap<Value, DevicePtr>,
        launches: &mut usize,
    ) -> Result<(), RuntimeError> {
        let n = g.node(id);
        let in_descs: Vec<Option<_>> = n.inputs.iter().map(|v| v.map(|v| g.desc(v))).collect();
        let values: Vec<Option<&Tensor>> = n
            .inputs
            .iter()
            .map(|v| {
                v.and_then(|v| {
                    let p = g.node(v.node);
                    (p.op == "Const").then(|| p.tensor("value")).flatten()
                })
            })
            .collect();
        let key = cache_key(g, id);
        if self.cache.contains_key(&key) {
            self.stats.cache_hits += 1;
        } else {
            let select = costs(l.dev).kernel_select_ns;
            l.host.work(l.dev, "update_impl (new shape)", select)?;
            let dev = &mut *l.dev;
            let ctx = LowerCtx {
                node: n,
                inputs: in_descs.clone(),
                values: values.clone(),
                outputs: &n.outputs,
                target,
            };
            let lowered = lower_node(&ctx).map_err(DynamicError::from)?;
            let op = match lowered {
                Lowered::Alias { input } => CachedOp {
                    alias: Some(input),
                    aicpu: None,
                    kernels: Vec::new(),
                    derived: Vec::new(),
                    workspace_bytes: 0,
                },
                Lowered::AiCpu { op } => CachedOp {
                    alias: None,
                    aicpu: Some(op),
                    kernels: Vec::new(),
                    derived: Vec::new(),
                    workspace_bytes: 0,
                },
                Lowered::Kernels {
                    kernels,
                    derived,
                    workspace_bytes,
                } => {
                    let mut loaded = Vec::new();
                    for k in kernels {
                        // A kernel reading input values runs in full mode (its producers
                        // ran before it, so in a timing-only run they must have been
                        // computed: ops run one by one here, see `needs_values`).
                        let flags = if k.value_inputs.is_empty() {
                            0
                        } else {
                            KERNEL_NEEDS_VALUES
                        };
                        let h = super::load::load_lowered(dev, &k, flags)?;
                        loaded.push((h, k.block_dim, k.args));
                    }
                    let derived = derived
                        .iter()
                        .map(|d| {
                            let p = dev.alloc(d.data.len().max(1) as u64)?;
                            dev.write(p, &d.data)?;
                            Ok(p)
                        })
                        .collect::<Result<_, RuntimeError>>()?;
                    CachedOp {
                        alias: None,
                        aicpu: None,
                        kernels: loaded,
                        derived,
                        workspace_bytes,
                    }
                }
            };
            self.stats.lowered += 1;
            self.cache.insert(key.clone(), op);
        }
        let op = &self.cache[&key];
        if let Some(input) = op.alias {
            let v = n.inputs[input].ok_or_else(|| {
                DynamicError::Graph(format!("`{}`: aliased input absent", n.name))
            })?;
            let p = at[&v];
            at.insert(
                Value {
                    node: id,
                    output: 0,
                },
                p,
            );
            return Ok(());
        }
        let kernels = op.kernels.clone();
        let derived = op.derived.clone();
        let ws_bytes = op.workspace_bytes;
        let mut outs = Vec::new();
        for (k, d) in n.outputs.iter().enumerate() {
            let b = self.buffer(l.dev, &format!("{}:{k}", n.name), d.bytes().unwrap_or(0))?;
            at.insert(
                Value {
                    node: id,
                    output: k as u32,
                },
                b.ptr,
            );
            outs.push(b.ptr);
        }
        let ws = if ws_bytes > 0 {
            Some(self.workspace(l.dev, ws_bytes)?)
        } else {
            None
        };
        self.charge_allocs(l)?;
        if let Some(op) = self.cache[&key].aicpu.clone() {
            let mut inputs = Vec::new();
            for (i, v) in n.inputs.iter().take(op.input_count()).enumerate() {
                let v = v.ok_or_else(|| {
                    DynamicError::Graph(format!("`{}`: input {i} is absent", n.name))
                })?;
                let p = at.get(&v).copied().ok_or_else(|| {
                    DynamicError::Graph(format!("`{}`: no buffer for input {i}", n.name))
                })?;
                inputs.push((p.0, g.desc(v).bytes().unwrap_or(0)));
            }
            let outputs = outs
                .iter()
                .zip(&n.outputs)
                .map(|(p, d)| (p.0, d.bytes().unwrap_or(0)))
                .collect();
            let block = AiCpuOpArgs {
                op,
                inputs,
                outputs,
            }
            .encode();
            let args = self.argument_block(l, launches, &block)?;
            let launch = AiCpuKernelId::Op.task(args.0, block.len() as u32);
            l.host.submit(l.dev, l.stream, launch, &n.name)?;
            return Ok(());
        }
        for (handle, block_dim, args) in &kernels {
            let addrs = args
                .iter()
                .map(|a| match *a {
                    Operand::Input(i) | Operand::InputFrom(i, _) => n.inputs[i]
                        .and_then(|v| at.get(&v).copied())
                        .map(|p| p.0 + a.offset())
                        .ok_or_else(|| format!("input {i}")),
                    Operand::Output(i) | Operand::OutputFrom(i, _) => Ok(outs[i].0 + a.offset()),
                    Operand::Derived(i) => Ok(derived[i].0),
                    Operand::Workspace(off) => {
                        ws.map(|w| w.0 + off).ok_or_else(|| "workspace".into())
                    }
                })
                .collect::<Result<Vec<u64>, String>>()
                .map_err(|what| {
                    DynamicError::Graph(format!("`{}`: no buffer for {what}", n.name))
                })?;
            let bytes: Vec<u8> = addrs.iter().flat_map(|a| a.to_le_bytes()).collect();
            let args_ptr = self.argument_block(l, launches, &bytes)?;
            let launch = Task::AiCoreKernel(AiCoreKernel {
                kernel: handle.addr.0,
                args: args_ptr.0,
                block_dim: *block_dim,
                l2ctrl: 0,
                l2_sections: 0,
            });
            l.host.submit(l.dev, l.stream, launch, &n.name)?;
        }
        Ok(())
    }

    /// Writes launch `launches`'s argument block (kernel arguments or an AI CPU operator's
    /// block) into its reused buffer, charging the host the tiling work; counts the launch.
    fn argument_block<S: TraceSink>(
        &mut self,
        l: &mut Link<'_, S>,
        launches: &mut usize,
        bytes: &[u8],
    ) -> Result<DevicePtr, RuntimeError> {
        let need = bytes.len().max(8) as u64;
        if self.args.get(*launches).is_none_or(|b| b.capacity < need) {
            let b = Buffer {
                ptr: l.dev.alloc(need)?,
                capacity: need,
            };
            if let Some(old) = self.args.get(*launches) {
                self.retired.push(old.ptr);
                self.args[*launches] = b;
            } else {
                self.args.push(b);
            }
            let alloc = costs(l.dev).alloc_ns;
            l.host.work(l.dev, "argument array", alloc)?;
        }
        let args_ptr = self.args[*launches].ptr;
        *launches += 1;
        let tiling = costs(l.dev).tiling_ns;
        l.host.work(l.dev, "tiling", tiling)?;
        l.dev.write(args_ptr, bytes)?;
        Ok(args_ptr)
    }

    /// Charges the host for the device allocations made since the last charge.
    fn charge_allocs<S: TraceSink>(&mut self, l: &mut Link<'_, S>) -> Result<(), RuntimeError> {
        let new = self.stats.reallocs - self.charged_allocs;
        self.charged_allocs = self.stats.reallocs;
        let ns = costs(l.dev).alloc_ns.saturating_mul(new);
        l.host.work(l.dev, "realloc_if_needed", ns)
    }

    /// realloc_if_needed: the buffer named `name`, at least `bytes` long.
    fn buffer<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        name: &str,
        bytes: u64,
    ) -> Result<Buffer, RuntimeError> {
        let bytes = bytes.max(1);
        if let Some(b) = self.buffers.get(name) {
            if b.capacity >= bytes {
                self.stats.reused += 1;
                return Ok(*b);
            }
            self.retired.push(b.ptr);
        }
        let b = Buffer {
            ptr: dev.alloc(bytes)?,
            capacity: bytes,
        };
        self.stats.reallocs += 1;
        self.buffers.insert(name.to_string(), b);
        Ok(b)
    }

    fn workspace<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        bytes: u64,
    ) -> Result<DevicePtr, RuntimeError> {
        match self.workspace {
            Some(w) if w.capacity >= bytes => Ok(w.ptr),
            old => {
                if let Some(w) = old {
                    self.retired.push(w.ptr);
                }
                let w = Buffer {
                    ptr: dev.alloc(bytes)?,
                    capacity: bytes,
                };
                self.stats.reallocs += 1;
                self.workspace = Some(w);
                Ok(w.ptr)
            }
        }
    }

    /// A constant on the device, uploaded again only when folding gave it a new value.
    fn constant<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        name: &str,
        value: &Tensor,
    ) -> Result<DevicePtr, RuntimeError> {
        if let Some((data, b)) = self.constants.get(name)
            && **data == *value.data
        {
            return Ok(b.ptr);
        }
        let bytes = value.data.len() as u64;
        let b = match self.constants.get(name) {
            Some((_, b)) if b.capacity >= bytes.max(1) => *b,
            old => {
                if let Some((_, b)) = old {
                    self.retired.push(b.ptr);
                }
                Buffer {
                    ptr: dev.alloc(bytes.max(1))?,
                    capacity: bytes.max(1),
                }
            }
        };
        dev.write(b.ptr, &value.data)?;
        self.constants
            .insert(name.to_string(), (value.data.clone(), b));
        Ok(b.ptr)
    }

    /// A pinned host buffer of at least `bytes` for transfer `name`.
    fn stage<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        name: &str,
        bytes: u64,
    ) -> Result<HostPtr, RuntimeError> {
        let bytes = bytes.max(1);
        if let Some((p, cap)) = self.staging.get(name) {
            if *cap >= bytes {
                return Ok(*p);
            }
            dev.host_free(*p)?;
        }
        let p = dev.host_alloc(bytes)?;
        self.staging.insert(name.to_string(), (p, bytes));
        Ok(p)
    }
}

/// The cache key of a node: its op, attributes, input types and shapes, and which inputs are
/// which constants (their values shape the kernels: packed weights, folded parameters).
fn cache_key(g: &Graph, id: NodeId) -> String {
    let n = g.node(id);
    let mut key = format!("{}|{:?}|", n.op, n.attrs);
    for v in &n.inputs {
        match v {
            None => key.push_str("_;"),
            Some(v) => {
                let p = g.node(v.node);
                key.push_str(&g.desc(*v).to_string());
                if p.op == "Const" {
                    let t = p.tensor("value");
                    key.push_str(&format!(
                        "={}#{:016x}",
                        p.name,
                        t.map_or(0, |t| fnv(&t.data))
                    ));
                }
                key.push(';');
            }
        }
    }
    key
}

/// FNV-1a, to tell folded constant values apart in cache keys.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
