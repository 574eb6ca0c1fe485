//! The compile pipeline, front and middle: options → ONNX import → shapes → gear passes →
//! per-branch inference and folding → memory plan → model description and `.om` bytes.
//!
//! Shape inference runs twice for a gear model. First on the imported graph with a symbol per
//! gear axis (`batch`, `height`/`width`, or `<input>.<axis>` for `--dynamic_dims`), with the
//! interval the gears span: its result is the "before" dump and its failures are only notes,
//! because a symbolic conflict (two axes that are different symbols but equal in every gear)
//! need not be a real one. Then each branch `Batch_i` is inferred with gear i's static shapes,
//! and that is authoritative: a failure there is a compile error naming the branch and gear.

use std::collections::{BTreeMap, BTreeSet};

use gearsim_isa::gear::MAX_RANK;
use gearsim_isa::om::{DynamicDesc, IoDesc, MemoryDesc, ModelDesc, OmWriter, SectionKind};
use gearsim_isa::omtask::{encode_kernel_flags, encode_kernels, encode_op_info};

use super::aipp;
use super::emit::{self, EmitError, Emitted};
use super::fusion::{self, FusionSwitches};
use super::gear::{self, GearError, GearInput, GearSpec};
use super::infer::{self, InferError, Known, Registry};
use super::ir::{
    Attr, DataType, Format, Graph, Model, NodeId, SHAPE_UNKNOWN, Value, fixed_shape, shape_values,
};
use super::memory;
use super::onnx::{self, OnnxError};
use super::options::{self, Binding, DynamicMode, GearOptions, OptionError, ParsedOptions};
use super::precision::{self, PrecisionMode};
use super::symbolic::{Dim, Symbol};
use super::{Target, ops};

pub use gearsim_isa::gear::{MapIndexEngine, TableLayout};

/// Everything `gearsim compile` is told.
#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// The atc gear options (`--input_shape`, `--dynamic_*`, `--input_format`).
    pub gear: GearOptions,
    /// GetNext sink mode: inputs come from a data queue, the gear vector from GetDynamicDims.
    pub getnext_sink: bool,
    /// Gear table layout.
    pub table_layout: TableLayout,
    /// MapIndex engine.
    pub mapindex_engine: MapIndexEngine,
    /// The chip.
    pub target: Target,
    /// Which fusion passes run (atc's `--fusion_switch_file`; all by default).
    pub fusion: FusionSwitches,
    /// Which fp32 ops compute in fp16 (atc's `--precision_mode`; `force_fp16` by default).
    pub precision: PrecisionMode,
}

/// Why a model did not compile.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// An option is invalid (GE's E-code and message).
    #[error(transparent)]
    Option(#[from] OptionError),
    /// The ONNX file cannot be imported.
    #[error(transparent)]
    Onnx(#[from] OnnxError),
    /// The options do not fit the model (an `--input_shape` name the model lacks, a rank or dim
    /// that disagrees): GE's E-code and message, after the model file's name.
    #[error("{file}: {error}")]
    Binding {
        /// The model file.
        file: String,
        /// The option error.
        error: OptionError,
    },
    /// A model input has no usable shape.
    #[error("{file}: input `{input}`: {message}")]
    Input {
        /// The model file.
        file: String,
        /// The input.
        input: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Shape inference failed (in a branch: under that branch's gear).
    #[error("{file}: {}{error}", where_.as_deref().map(|w| format!("{w}: ")).unwrap_or_default())]
    Infer {
        /// The model file.
        file: String,
        /// `in branch Batch_i (gear ...)` for a branch.
        where_: Option<String>,
        /// The failure.
        error: InferError,
    },
    /// The gear pass cannot transform the graph.
    #[error("{file}: {0}", .error.0)]
    Gear {
        /// The model file.
        file: String,
        /// The failure.
        error: GearError,
    },
    /// The back end cannot run the graph (a node it cannot lower, say).
    #[error("{file}: {error}")]
    Emit {
        /// The model file.
        file: String,
        /// The failure.
        error: EmitError,
    },
    /// The compiled graph fails verification.
    #[error("{file}: the compiled graph fails verification: {message}")]
    Verify {
        /// The model file.
        file: String,
        /// The problem.
        message: String,
    },
    /// A combination GE accepts that gearsim does not model yet.
    #[error("{file}: {what} is not supported by gearsim")]
    Unsupported {
        /// The model file.
        file: String,
        /// What.
        what: String,
    },
}

/// A compiled model (front and middle).
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The imported graph with the inputs' shapes applied and shapes inferred (symbolically
    /// for a gear model) — the "before" dump.
    pub before: Model,
    /// The graph after the gear passes, with every branch inferred and folded.
    pub after: Model,
    /// Description written to the `.om`.
    pub desc: ModelDesc,
    /// Kernels, task streams, weights and the memory plan.
    pub emitted: Emitted,
    /// Things the user may want to know that are not errors.
    pub notes: Vec<String>,
    /// The source ONNX bytes (a hybrid `.om` carries them for its dynamic-shape path).
    pub source: Vec<u8>,
}

impl Compiled {
    /// The `.om` bytes: description, weights, kernels and task streams.
    pub fn om_bytes(&self) -> Result<Vec<u8>, String> {
        self.om(false)
    }

    /// The `.om` bytes of a hybrid model: [`Compiled::om_bytes`] plus the source graph, which
    /// the runtime runs op by op for shapes that match no gear.
    pub fn hybrid_om_bytes(&self) -> Result<Vec<u8>, String> {
        if self.desc.dynamic.is_none() {
            return Err(
                "--hybrid needs gears (--dynamic_batch_size, --dynamic_image_size or \
                        --dynamic_dims): a static model has no fallback to choose"
                    .into(),
            );
        }
        self.om(true)
    }

    fn om(&self, hybrid: bool) -> Result<Vec<u8>, String> {
        let mut w = OmWriter::new();
        w.section(SectionKind::Desc, self.desc.encode());
        w.section(SectionKind::Weights, self.emitted.weights.data.clone());
        w.section(
            SectionKind::Kernels,
            encode_kernels(&self.emitted.kernel_images()?),
        );
        if let Some(flags) = self.emitted.kernel_flags() {
            w.section(SectionKind::KernelFlags, encode_kernel_flags(&flags));
        }
        if !self.emitted.ops.is_empty() {
            w.section(SectionKind::OpInfo, encode_op_info(&self.emitted.ops));
        }
        w.section(SectionKind::Tasks, self.emitted.tasks.encode());
        if hybrid {
            w.section(SectionKind::Graph, self.source.clone());
        }
        Ok(w.finish())
    }
}

/// Compiles ONNX bytes (`file` names them in messages; its stem names the model).
pub fn compile(bytes: &[u8], file: &str, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    // 1. Options, in GE's order, before the model is read (atc checks them first too).
    let parsed = options::check_options(&opts.gear)?;
    if let Some(p) = &parsed {
        options::check_gears(p)?;
        let gear_len = p.gears.first().map_or(0, Vec::len);
        options::check_map_index_limit(
            p.gears.len(),
            gear_len,
            opts.target.map_index_max_gears,
            opts.target.map_index_max_dims,
        )?;
    }
    // AIPP: the configuration read, and refused with the gear modes gearsim cannot combine it
    // with (GE's own rule against `--dynamic_dims` came with the option checks).
    let aipp = match opts
        .gear
        .insert_op_conf
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        None => None,
        Some(path) => {
            let text = opts.gear.insert_op_conf_text.as_deref().unwrap_or_default();
            let ops = aipp::parse(text, path)?;
            if let Some(p) = &parsed {
                return Err(CompileError::Unsupported {
                    file: file.into(),
                    what: format!("AIPP (--insert_op_conf) with {}", p.mode.option_name()),
                });
            }
            Some((path, ops))
        }
    };
    let aipp_conf = aipp.as_ref().map(|(path, _)| path.to_string());
    // 2. Import.
    let model = onnx::import(bytes, file)?.model;
    let registry = ops::standard();
    let mut notes = Vec::new();
    // 3-4. Shapes, and the gear passes for a gear model.
    let (before, after, spec, branch_dims) = match parsed {
        None => {
            let (before, after) = static_graph(model, opts, file, &registry, aipp)?;
            (before, after, None, Vec::new())
        }
        Some(p) => {
            let (before, mut after, spec) =
                gear_graph(model, &p, opts, file, &registry, &mut notes)?;
            let branch_dims = case_outputs(&mut after, file)?;
            let table = gear::output_shape_table(&after.graph, &branch_dims, opts.getnext_sink);
            if let Some(net) = after.graph.nodes.iter_mut().find(|n| n.op == "NetOutput") {
                net.attrs
                    .insert("_dynamic_output_dims".into(), Attr::Strs(table));
            }
            (before, after, Some(spec), branch_dims)
        }
    };
    // 5. Fusion, then lowering, memory plan and task streams.
    let mut after = after;
    let reads_image = |g: &Graph, aipp: NodeId, conv: NodeId| {
        super::layout::conv_reads_image(g, aipp, conv, &opts.target, opts.gear.enable_small_channel)
    };
    let adds_residual =
        |g: &Graph, conv: NodeId| super::layout::conv_adds_residual(g, conv, &opts.target);
    let abilities = fusion::KernelAbilities {
        reads_image: &reads_image,
        adds_residual: &adds_residual,
    };
    fusion::fuse_model(&mut after, &opts.fusion, &abilities);
    verify(&after, file)?;
    let emitted =
        emit::emit(&after, spec.as_ref(), &opts.target).map_err(|error| CompileError::Emit {
            file: file.into(),
            error,
        })?;
    let name = model_name(file);
    let mut desc = match &spec {
        None => static_desc(&name, &opts.target, &after.graph, &emitted),
        Some(spec) => dynamic_desc(&name, opts, spec, &after, &branch_dims, &emitted),
    };
    // The runtime's descriptions and the device's shape tensors hold at most MAX_RANK dims.
    for (kind, list) in [("input", &desc.inputs), ("output", &desc.outputs)] {
        if let Some(io) = list.iter().find(|io| io.dims.len() > MAX_RANK) {
            return Err(CompileError::Unsupported {
                file: file.into(),
                what: format!(
                    "{kind} `{}` of rank {} (a model's inputs and outputs have at most \
                     {MAX_RANK} dims, the most a device shape tensor holds)",
                    io.name,
                    io.dims.len()
                ),
            });
        }
    }
    desc.build_options = vec![
        ("precision_mode".into(), opts.precision.name().into()),
        ("fusion_switch".into(), opts.fusion.describe()),
        (
            "buffer_optimize".into(),
            opts.target.buffer_optimize.name().into(),
        ),
    ];
    if let Some(path) = aipp_conf {
        desc.build_options.push(("insert_op_conf".into(), path));
    }
    if opts.gear.enable_small_channel {
        desc.build_options
            .push(("enable_small_channel".into(), "1".into()));
    }
    Ok(Compiled {
        before,
        after,
        desc,
        emitted,
        notes,
        source: bytes.to_vec(),
    })
}

/// Without gear options: the inputs' static shapes, inference, folding.
fn static_graph(
    mut model: Model,
    opts: &CompileOptions,
    file: &str,
    registry: &Registry,
    aipp: Option<(&str, Vec<aipp::AippOp>)>,
) -> Result<(Model, Model), CompileError> {
    apply_static_shapes(&mut model.graph, &opts.gear, file)?;
    apply_format(&mut model.graph, static_format(&opts.gear)?);
    if let Some((path, ops)) = aipp {
        aipp::insert(&mut model.graph, &ops, path)?;
    }
    let known = infer::infer_graph(&mut model.graph, registry, model.opset).map_err(|error| {
        CompileError::Infer {
            file: file.into(),
            where_: None,
            error,
        }
    })?;
    let mut after = model.clone();
    infer::fold_constants(&mut after.graph, &known);
    precision::apply(&mut after.graph, opts.precision, &precision::const_node);
    Ok((model, after))
}

/// With gear options: bind the gears, infer symbolically (the "before" graph), run the gear
/// pass, then infer and fold every branch with its gear's static shapes.
fn gear_graph(
    mut model: Model,
    p: &ParsedOptions,
    opts: &CompileOptions,
    file: &str,
    registry: &Registry,
    notes: &mut Vec<String>,
) -> Result<(Model, Model, GearSpec), CompileError> {
    let binding = bind(p, &model.graph, file)?;
    apply_gear_shapes(&mut model.graph, p, &binding);
    apply_format(&mut model.graph, p.format);
    let mut before = model;
    let (_, unknown) = infer::infer_graph_lenient(&mut before.graph, registry, before.opset);
    let spec = gear_spec(p, &binding, opts);
    let cloned = gear::multi_batch_clone(&before, &spec).map_err(|error| CompileError::Gear {
        file: file.into(),
        error,
    })?;
    if let Some((id, Some(e))) = unknown.iter().find(|(_, e)| e.is_some()) {
        notes.push(format!(
            "symbolic shape inference over all gears cannot go past node `{}` ({}), so {} \
             node(s) are inferred per gear only (each branch with its gear's static shapes)",
            before.graph.node(*id).name,
            first_line(&e.to_string()),
            unknown.len()
        ));
    }
    for (id, e) in &unknown {
        if before.graph.node(*id).op == "NetOutput" {
            continue;
        }
        let why = e.as_ref().map_or_else(
            || "an input's shape is known per gear only".to_string(),
            |e| first_line(&e.to_string()).to_string(),
        );
        before
            .graph
            .node_mut(*id)
            .attrs
            .insert(SHAPE_UNKNOWN.into(), Attr::Str(why));
    }
    let mut after = cloned.model;
    for (i, b) in after.subgraphs.iter_mut().enumerate() {
        let seeds: Known = cloned.const_inputs[i]
            .iter()
            .map(|(id, t)| {
                (
                    Value {
                        node: *id,
                        output: 0,
                    },
                    t.clone(),
                )
            })
            .collect();
        let known =
            infer::infer_graph_seeded(b, registry, before.opset, seeds).map_err(|error| {
                CompileError::Infer {
                    file: file.into(),
                    where_: Some(format!(
                        "in branch Batch_{i} (gear {})",
                        gear_text(&spec.gears[i])
                    )),
                    error,
                }
            })?;
        // Folding renumbers the nodes: the root constants' `Data` ids go through its remap
        // (using the old ids gave a branch constant another constant's value).
        let remap = infer::fold_constants(b, &known).remap;
        let const_inputs: Vec<(NodeId, &super::ir::Tensor)> = cloned.const_inputs[i]
            .iter()
            .filter_map(|(id, t)| {
                remap
                    .get(id.0 as usize)
                    .copied()
                    .flatten()
                    .map(|id| (id, t))
            })
            .collect();
        // Root constants reach the branch as inputs; converting one makes a branch constant
        // (stored once: identical constants of all branches share their bytes). They are
        // found by their `Data` node's name: the precision pass asks about values of the graph
        // it is rebuilding, whose node ids are not the ids here (a lookup by id gave an
        // activation a constant's value once a cast shifted the ids).
        let root_constants: BTreeMap<String, &super::ir::Tensor> = const_inputs
            .iter()
            .map(|(id, t)| (b.node(*id).name.clone(), *t))
            .collect();
        let constant = |g: &Graph, v: Value| {
            precision::const_node(g, v).or_else(|| {
                let n = g.node(v.node);
                (n.op == "Data")
                    .then(|| root_constants.get(&n.name))
                    .flatten()
                    .map(|t| (*t).clone())
            })
        };
        let (_, moved) = precision::apply(b, opts.precision, &constant);
        let seeds: Vec<(NodeId, super::ir::Tensor)> = const_inputs
            .iter()
            .filter_map(|(id, t)| moved.get(id.0 as usize).map(|m| (*m, (*t).clone())))
            .collect();
        localize_static_constants(b, &seeds, registry);
        // Folding made new Const nodes; they belong to the branch too.
        for n in &mut b.nodes {
            n.attrs
                .insert("_batch_label".into(), Attr::Str(format!("Batch_{i}")));
        }
    }
    let pruned = gear::prune_unused_constants(&mut after);
    if pruned > 0 {
        notes.push(format!(
            "{pruned} constant(s) only fed shape computations that folded away in every branch; \
             they are not stored"
        ));
    }
    Ok((before, after, spec))
}

/// A branch `Data` standing for a root constant that the branch reads only as compile-time
/// parameters (a Reshape's shape, a reduction's axes) becomes a branch-local `Const` again, so
/// the root constant can be pruned and nothing is stored for it.
fn localize_static_constants(
    b: &mut Graph,
    seeds: &[(NodeId, super::ir::Tensor)],
    registry: &Registry,
) {
    for (id, t) in seeds {
        let Some(n) = b.nodes.get(id.0 as usize) else {
            continue;
        };
        let used = b
            .nodes
            .iter()
            .any(|m| m.inputs.iter().flatten().any(|v| v.node == *id));
        if n.op != "Data" || !used || !memory::only_static_uses(b, *id, registry) {
            continue;
        }
        let n = b.node_mut(*id);
        n.op = "Const".into();
        for a in ["_parent_node_index", "index"] {
            n.attrs.remove(a);
        }
        n.attrs.insert("value".into(), Attr::Tensor(t.clone()));
    }
}

/// The model's name: the file stem.
fn model_name(file: &str) -> String {
    std::path::Path::new(file)
        .file_stem()
        .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

fn gear_text(g: &[i64]) -> String {
    g.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn dims_of(shape: &[Dim]) -> Vec<i64> {
    shape.iter().map(|d| d.fixed().unwrap_or(-1)).collect()
}

/// The model's `Data` nodes in input order.
fn data_nodes(g: &Graph) -> Vec<NodeId> {
    g.of_type("Data")
}

/// Without gear options: `--input_shape` (static) replaces the model's shapes; every input
/// must end fully known.
fn apply_static_shapes(g: &mut Graph, o: &GearOptions, file: &str) -> Result<(), CompileError> {
    let listed = match o.input_shape.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => options::parse_input_shape(s, false)?,
        None => Vec::new(),
    };
    let inputs = data_nodes(g);
    for l in &listed {
        let Some(&id) = inputs.iter().find(|id| g.node(**id).name == l.name) else {
            return Err(CompileError::Binding {
                file: file.into(),
                error: OptionError {
                    code: "E10016",
                    message: format!(
                        "Opname {} specified in --input_shape is not found in the model. \
                         Confirm whether this node name exists, or the node is not split with \
                         the specified delimiter ';'.",
                        l.name
                    ),
                },
            });
        };
        let model_dims = dims_of(&g.node(id).outputs[0].shape);
        let compatible = model_dims.len() == l.dims.len()
            && model_dims
                .iter()
                .zip(&l.dims)
                .all(|(m, u)| *m < 0 || m == u);
        if !compatible {
            return Err(CompileError::Input {
                file: file.into(),
                input: l.name.clone(),
                message: format!(
                    "--input_shape gives {} but the model declares {}; the rank and every \
                     known dim must agree",
                    dims_text(&l.dims),
                    dims_text(&model_dims)
                ),
            });
        }
        g.node_mut(id).outputs[0].shape = fixed_shape(&l.dims);
    }
    for id in inputs {
        let n = g.node(id);
        let dims = dims_of(&n.outputs[0].shape);
        if dims.iter().any(|d| *d < 0) {
            return Err(CompileError::Input {
                file: file.into(),
                input: n.name.clone(),
                message: format!(
                    "the model declares {} with unknown dims; give its shape with \
                     --input_shape, or compile it for gears with --dynamic_batch_size, \
                     --dynamic_image_size or --dynamic_dims",
                    dims_text(&dims)
                ),
            });
        }
    }
    Ok(())
}

/// `--input_format` without gear options (the gear checks validate it otherwise): atc's
/// default for ONNX is NCHW.
fn static_format(o: &GearOptions) -> Result<Format, CompileError> {
    let s = o
        .input_format
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("NCHW");
    Format::parse(s).ok_or_else(|| {
        OptionError {
            code: "E10001",
            message: format!(
                "Value {s} for parameter --input_format is invalid. Reason: The current value \
                 is not within the valid range (ND, NCHW, NHWC)."
            ),
        }
        .into()
    })
}

/// Stamps the input format on every 4-D input (atc applies `--input_format` to the model's
/// image inputs; other ranks stay ND).
fn apply_format(g: &mut Graph, format: Format) {
    for id in data_nodes(g) {
        let d = &mut g.node_mut(id).outputs[0];
        if d.shape.len() == 4 {
            d.format = format;
        }
    }
}

fn dims_text(d: &[i64]) -> String {
    format!("[{}]", gear_text(d))
}

/// Binds the gears to the model's inputs (spec §2.3, §3).
fn bind(p: &ParsedOptions, g: &Graph, file: &str) -> Result<Binding, CompileError> {
    let inputs: Vec<options::GraphInput> = data_nodes(g)
        .into_iter()
        .map(|id| {
            let n = g.node(id);
            let dims = dims_of(&n.outputs[0].shape);
            let format = if dims.len() == 4 {
                p.format
            } else {
                Format::Nd
            };
            options::GraphInput {
                name: n.name.clone(),
                dims,
                format,
            }
        })
        .collect();
    let binding = options::bind_inputs(p, &inputs).map_err(|error| CompileError::Binding {
        file: file.into(),
        error,
    })?;
    // Inputs the gears do not reach must be static.
    for (k, input) in inputs.iter().enumerate() {
        let bound = binding.inputs.iter().any(|b| b.graph_index == k);
        if !bound && input.dims.iter().any(|d| *d < 0) {
            return Err(CompileError::Input {
                file: file.into(),
                input: input.name.clone(),
                message: format!(
                    "the model declares {} with unknown dims but no gear option covers it; \
                     list it in --input_shape",
                    dims_text(&input.dims)
                ),
            });
        }
    }
    // Every input must fit the compiler's largest tensor under every gear, before the gear
    // pass computes sizes from the dims.
    for b in &binding.inputs {
        let dtype = g.node(data_nodes(g)[b.graph_index]).outputs[0].dtype;
        for (k, dims) in b.per_gear_dims.iter().enumerate() {
            if infer::extent_bytes(dtype, dims).is_none_or(|b| b > infer::MAX_TENSOR_BYTES) {
                return Err(CompileError::Input {
                    file: file.into(),
                    input: b.name.clone(),
                    message: format!(
                        "under gear {k} ({}) the input is {} {}, larger than the {} bytes \
                         (1 TiB) the compiler plans for one tensor; use smaller gear values",
                        binding
                            .gears
                            .get(k)
                            .map_or_else(String::new, |g| gear_text(g)),
                        dtype.name(),
                        dims_text(dims),
                        infer::MAX_TENSOR_BYTES
                    ),
                });
            }
        }
    }
    Ok(binding)
}

/// The symbol of a gear axis: one shared `batch` (or `height`, `width`) symbol, or one per
/// `-1` of `--dynamic_dims`.
fn axis_symbol(mode: DynamicMode, input: &str, axis: usize, nth_unknown: usize) -> String {
    match mode {
        DynamicMode::Batch => "batch".into(),
        DynamicMode::ImageSize => {
            if nth_unknown == 0 {
                "height".into()
            } else {
                "width".into()
            }
        }
        DynamicMode::Dims => format!("{input}.{axis}"),
    }
}

/// Gives the bound inputs their user shapes, each gear axis a symbol over its gears' range.
fn apply_gear_shapes(g: &mut Graph, p: &ParsedOptions, b: &Binding) {
    let ids = data_nodes(g);
    for input in &b.inputs {
        let id = ids[input.graph_index];
        let mut nth = 0;
        let shape: Vec<Dim> = input
            .user_dims
            .iter()
            .enumerate()
            .map(|(axis, d)| {
                if *d >= 0 {
                    return Dim::Fixed(*d);
                }
                let values = input.per_gear_dims.iter().map(|g| g[axis]);
                let (lo, hi) = (values.clone().min().unwrap_or(0), values.max().unwrap_or(0));
                let name = axis_symbol(p.mode, &input.name, axis, nth);
                nth += 1;
                if lo == hi {
                    Dim::Fixed(lo)
                } else {
                    Dim::symbol(&Symbol { name, lo, hi })
                }
            })
            .collect();
        g.node_mut(id).outputs[0].shape = shape;
    }
}

fn gear_spec(p: &ParsedOptions, b: &Binding, opts: &CompileOptions) -> GearSpec {
    GearSpec {
        mode: p.mode.mbatch_dynamic_type(),
        gears: b.gears.clone(),
        inputs: b
            .inputs
            .iter()
            .filter(|i| i.is_dynamic())
            .map(|i| GearInput {
                name: i.name.clone(),
                user_dims: i.user_dims.clone(),
                per_gear_dims: i.per_gear_dims.clone(),
                max_gear: i.max_gear,
            })
            .collect(),
        shape_order: b.shape_order().into_iter().map(str::to_string).collect(),
        getnext_sink: opts.getnext_sink,
        table_layout: opts.table_layout.code(),
        mapindex_engine: opts.mapindex_engine.code(),
    }
}

/// Gives the Case its output descriptors (each output's largest shape over the branches, by
/// element count) and returns every branch's output dims. Branches must agree on type and rank.
fn case_outputs(m: &mut Model, file: &str) -> Result<Vec<Vec<Vec<i64>>>, CompileError> {
    let mut per_branch = Vec::new();
    let mut descs: Vec<Vec<(DataType, Vec<i64>)>> = Vec::new();
    for b in &m.subgraphs {
        let Some(net) = b.nodes.iter().find(|n| n.op == "NetOutput") else {
            return Err(CompileError::Verify {
                file: file.into(),
                message: format!("branch {} has no NetOutput", b.name),
            });
        };
        let mut outs = Vec::new();
        for (k, v) in net.inputs.iter().enumerate() {
            let Some(v) = v else {
                return Err(CompileError::Verify {
                    file: file.into(),
                    message: format!("branch {} output {k} is not connected", b.name),
                });
            };
            let d = b.desc(*v);
            let Some(dims) = shape_values(&d.shape) else {
                return Err(CompileError::Verify {
                    file: file.into(),
                    message: format!(
                        "branch {} output {k} has no static shape ({d}) after inference",
                        b.name
                    ),
                });
            };
            outs.push((d.dtype, dims));
        }
        descs.push(outs);
    }
    let Some(case_id) = m.graph.find(gear::CASE) else {
        return Ok(per_branch);
    };
    let n_out = m.graph.node(case_id).outputs.len();
    let mut case_descs = Vec::with_capacity(n_out);
    for k in 0..n_out {
        let mut best: Option<(DataType, &Vec<i64>, i64)> = None;
        for (i, outs) in descs.iter().enumerate() {
            let Some((dtype, dims)) = outs.get(k) else {
                return Err(CompileError::Verify {
                    file: file.into(),
                    message: format!("branch Batch_{i} has fewer outputs than the Case ({n_out})"),
                });
            };
            let count: i64 = dims.iter().product();
            match &best {
                // Like GE (`UpdateOutputFromSubgraphsForMultiDims`): the type must agree, the
                // shape may differ even in rank; the Case takes the largest by element count.
                Some((t, d0, _)) if *t != *dtype => {
                    return Err(CompileError::Verify {
                        file: file.into(),
                        message: format!(
                            "output {k} is {} {} in branch Batch_0 but {} {} in branch Batch_{i}; \
                             every gear must give an output of the same type",
                            t.name(),
                            dims_text(d0),
                            dtype.name(),
                            dims_text(dims)
                        ),
                    });
                }
                Some((_, _, c)) if *c >= count => {}
                _ => best = Some((*dtype, dims, count)),
            }
        }
        let (dtype, dims, _) = best.ok_or_else(|| CompileError::Verify {
            file: file.into(),
            message: "the Case has no branches".into(),
        })?;
        case_descs.push(super::ir::TensorDesc::new(dtype, fixed_shape(dims)));
    }
    m.graph.node_mut(case_id).outputs = case_descs;
    per_branch = descs
        .into_iter()
        .map(|outs| outs.into_iter().map(|(_, d)| d).collect())
        .collect();
    Ok(per_branch)
}

/// Structural checks of the compiled model: edges, names, the Case's inputs and branches, and
/// every tensor a kernel will touch has a static shape.
fn verify(m: &Model, file: &str) -> Result<(), CompileError> {
    let fail = |message: String| CompileError::Verify {
        file: file.into(),
        message,
    };
    m.graph.check().map_err(fail)?;
    for b in &m.subgraphs {
        b.check().map_err(fail)?;
    }
    for b in std::iter::once(&m.graph).chain(&m.subgraphs) {
        for n in &b.nodes {
            for (k, d) in n.outputs.iter().enumerate() {
                if shape_values(&d.shape).is_none() {
                    return Err(fail(format!(
                        "graph {}: node `{}` output {k} has no static shape ({d})",
                        b.name, n.name
                    )));
                }
            }
        }
    }
    if let Some(case_id) = m.graph.find(gear::CASE) {
        let case = m.graph.node(case_id);
        let batch_num = case.int("_batch_num").unwrap_or(0);
        if case.subgraphs.len() as i64 != batch_num {
            return Err(fail(format!(
                "the Case has {} branches but _batch_num = {batch_num}",
                case.subgraphs.len()
            )));
        }
        for name in &case.subgraphs {
            let Some(b) = m.subgraph(name) else {
                return Err(fail(format!(
                    "the Case names branch {name}, which does not exist"
                )));
            };
            for n in b.nodes.iter().filter(|n| n.op == "Data") {
                let p = n.int("_parent_node_index").unwrap_or(-1);
                let Some(Some(v)) = usize::try_from(p).ok().and_then(|p| case.inputs.get(p)) else {
                    return Err(fail(format!(
                        "branch {name}: Data `{}` has _parent_node_index {p}, not a Case input",
                        n.name
                    )));
                };
                let (outer, inner) = (m.graph.desc(*v), &n.outputs[0]);
                if outer.dtype != inner.dtype {
                    return Err(fail(format!(
                        "branch {name}: Data `{}` is {} but Case input {p} is {}",
                        n.name,
                        inner.dtype.name(),
                        outer.dtype.name()
                    )));
                }
            }
        }
    }
    Ok(())
}

fn io_desc(
    name: &str,
    dtype: DataType,
    format: Format,
    dims: Vec<i64>,
    max_dims: Vec<i64>,
) -> IoDesc {
    let bytes = max_dims.iter().product::<i64>().max(0) as u64 * dtype.size() as u64;
    IoDesc {
        name: name.to_string(),
        dtype: dtype.onnx_code() as u32,
        format: format.name().to_string(),
        dims,
        max_dims,
        bytes,
    }
}

/// Names of the model outputs, from the NetOutput's `output_names`.
fn output_names(net: &super::ir::Node) -> Vec<String> {
    match net.attr("output_names") {
        Some(Attr::Strs(v)) => v.clone(),
        _ => Vec::new(),
    }
}

fn static_desc(name: &str, target: &Target, g: &Graph, e: &Emitted) -> ModelDesc {
    let inputs: Vec<IoDesc> = data_nodes(g)
        .into_iter()
        .map(|id| {
            let n = g.node(id);
            let d = &n.outputs[0];
            let dims = dims_of(&d.shape);
            io_desc(&n.name, d.dtype, d.format, dims.clone(), dims)
        })
        .collect();
    let outputs = g
        .nodes
        .iter()
        .find(|n| n.op == "NetOutput")
        .map(|net| {
            let names = output_names(net);
            net.inputs
                .iter()
                .enumerate()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .map(|(k, v)| {
                    let d = g.desc(v);
                    let dims = dims_of(&d.shape);
                    let name = names
                        .get(k)
                        .cloned()
                        .unwrap_or_else(|| format!("output_{k}"));
                    io_desc(&name, d.dtype, d.format, dims.clone(), dims)
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let memory = MemoryDesc {
        weight_bytes: e.weights.bytes(),
        feature_map_bytes: e.tasks.feature_map_bytes,
        root_feature_map_bytes: e.root_feature_map,
        per_gear_feature_map: Vec::new(),
        input_bytes: inputs.iter().map(|i| i.bytes).sum(),
        output_bytes: outputs.iter().map(|o| o.bytes).sum(),
    };
    ModelDesc {
        name: name.to_string(),
        soc_version: target.soc_version.clone(),
        inputs,
        outputs,
        dynamic: None,
        memory,
        build_options: Vec::new(),
    }
}

/// Dims that differ across gears become `-1`.
fn declared(per_gear: &[Vec<i64>]) -> Vec<i64> {
    let Some(first) = per_gear.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(a, d)| {
            if per_gear.iter().all(|g| g.get(a) == Some(d)) {
                *d
            } else {
                -1
            }
        })
        .collect()
}

fn dynamic_desc(
    name: &str,
    opts: &CompileOptions,
    spec: &GearSpec,
    m: &Model,
    branch_dims: &[Vec<Vec<i64>>],
    e: &Emitted,
) -> ModelDesc {
    let g = &m.graph;
    let gears = spec.gears.len();
    let by_name: BTreeMap<&str, &GearInput> =
        spec.inputs.iter().map(|i| (i.name.as_str(), i)).collect();
    // Inputs: the user inputs (Data nodes, or GetNext's data outputs in sink mode), then the
    // gear vector in non-sink mode. Per gear dims alongside.
    let mut inputs = Vec::new();
    let mut input_dims: Vec<Vec<Vec<i64>>> = vec![Vec::new(); gears];
    let user_inputs: Vec<(String, super::ir::TensorDesc)> = match g.find(gear::GETNEXT) {
        Some(gn) => {
            let n = g.node(gn);
            let names = match n.attr("output_names") {
                Some(Attr::Strs(v)) => v.clone(),
                _ => Vec::new(),
            };
            names
                .iter()
                .cloned()
                .zip(n.outputs.iter().cloned())
                .collect()
        }
        None => data_nodes(g)
            .into_iter()
            .filter(|id| g.node(*id).name != gear::SHAPE_DATA)
            .map(|id| (g.node(id).name.clone(), g.node(id).outputs[0].clone()))
            .collect(),
    };
    for (input_name, d) in &user_inputs {
        let max_dims = dims_of(&d.shape);
        match by_name.get(input_name.as_str()) {
            Some(gi) => {
                inputs.push(io_desc(
                    input_name,
                    d.dtype,
                    d.format,
                    gi.user_dims.clone(),
                    max_dims,
                ));
                for (i, dims) in gi.per_gear_dims.iter().enumerate() {
                    input_dims[i].push(dims.clone());
                }
            }
            None => {
                inputs.push(io_desc(
                    input_name,
                    d.dtype,
                    d.format,
                    max_dims.clone(),
                    max_dims.clone(),
                ));
                for per in &mut input_dims {
                    per.push(max_dims.clone());
                }
            }
        }
    }
    let gear_len = spec.gears.first().map_or(0, Vec::len) as i64;
    if !spec.getnext_sink {
        inputs.push(io_desc(
            gear::SHAPE_DATA,
            DataType::I32,
            Format::Nd,
            vec![gear_len],
            vec![gear_len],
        ));
        for per in &mut input_dims {
            per.push(vec![gear_len]);
        }
    }
    // Outputs: NetOutput inputs in order; per gear from the branch (Case outputs), the input's
    // gear dims (direct outputs) or the gear vector (sink mode's extra output).
    let mut outputs = Vec::new();
    let mut output_dims: Vec<Vec<Vec<i64>>> = vec![Vec::new(); gears];
    let case = g.find(gear::CASE);
    if let Some(net) = g.nodes.iter().find(|n| n.op == "NetOutput") {
        let names = output_names(net);
        for (k, v) in net.inputs.iter().enumerate() {
            let Some(v) = v else { continue };
            let d = g.desc(*v);
            // The gear vector NetOutput reads in sink mode is for the runtime (§8.4), not a
            // model output.
            if g.node(v.node).name == gear::GET_DYNAMIC_DIMS {
                continue;
            }
            // A Case output has each branch's shape; a direct output (offline only) keeps the
            // root Data's max-gear shape in every gear, as GE reports it.
            let per_gear: Vec<Vec<i64>> = if Some(v.node) == case {
                branch_dims
                    .iter()
                    .map(|b| b[v.output as usize].clone())
                    .collect()
            } else {
                vec![dims_of(&d.shape); gears]
            };
            let name = names
                .get(k)
                .cloned()
                .unwrap_or_else(|| format!("output_{k}"));
            outputs.push(io_desc(
                &name,
                d.dtype,
                d.format,
                declared(&per_gear),
                dims_of(&d.shape),
            ));
            for (i, dims) in per_gear.into_iter().enumerate() {
                output_dims[i].push(dims);
            }
        }
    }
    let output_bytes: Vec<Vec<u64>> = output_dims
        .iter()
        .map(|outs| {
            outs.iter()
                .zip(&outputs)
                .map(|(dims, o)| {
                    let dtype = DataType::from_onnx(o.dtype as i32).map_or(1, DataType::size);
                    dims.iter().product::<i64>().max(0) as u64 * dtype as u64
                })
                .collect()
        })
        .collect();
    let per_gear_feature_map: Vec<u64> = e
        .branch_feature_map
        .iter()
        .map(|b| e.root_feature_map + b)
        .collect();
    let memory = MemoryDesc {
        weight_bytes: e.weights.bytes(),
        feature_map_bytes: e.tasks.feature_map_bytes,
        root_feature_map_bytes: e.root_feature_map,
        per_gear_feature_map,
        input_bytes: inputs.iter().map(|i| i.bytes).sum(),
        output_bytes: outputs.iter().map(|o| o.bytes).sum(),
    };
    ModelDesc {
        name: name.to_string(),
        soc_version: opts.target.soc_version.clone(),
        inputs,
        outputs,
        dynamic: Some(DynamicDesc {
            mode: spec.mode,
            gears: spec.gears.clone(),
            shape_order: spec.shape_order.clone(),
            getnext_sink: spec.getnext_sink,
            table_layout: spec.table_layout,
            mapindex_engine: spec.mapindex_engine,
            input_dims,
            output_dims,
            output_bytes,
        }),
        memory,
        build_options: Vec::new(),
    }
}

/// Names of the values that feed a graph's `NetOutput` (they live in the output buffers).
pub fn output_values(g: &Graph) -> BTreeSet<Value> {
    g.nodes
        .iter()
        .filter(|n| n.op == "NetOutput")
        .flat_map(|n| n.inputs.iter().flatten().copied())
        .collect()
}
