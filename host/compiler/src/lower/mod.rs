//! Lowering: each compute node becomes AI core kernels in the ISA, tiled for the target's
//! buffers, or an alias of its input when it only relabels the shape.
//!
//! ```text
//!   lower_node(ctx) ─▶ table of lowerings by op type ─▶ Lowered::Kernels { kernels, derived }
//!                                                     ├▶ Lowered::Alias (Reshape, Flatten, ...)
//!                                                     └▶ Lowered::AiCpu (types the AI core lacks)
//!   writer.rs  ─ the assembly writer every kernel is built with
//!   queue.rs   ─ the flag handshakes between pipes (queues, chains, one-shot barriers)
//!   stream.rs  ─ the double-buffered GM→UB→V→UB→GM pipeline element-wise kernels share
//!   bcast.rs   ─ the broadcasting variant: canonical broadcast form, chunk / row tiles, splats,
//!                one-byte and int64 tensors spread one element per 32-byte block
//!   vec.rs     ─ vector instructions over operand views (flat or splat)
//!   elementwise.rs ─ element-wise ops (arithmetic, activations, Cast, Where, ...) on the vector unit
//!   activation.rs ─ the f32 bodies of Sigmoid, Tanh, Erf, Gelu and Pow
//!   reduce.rs  ─ reductions and normalisations (ReduceMean/Sum, Softmax, LayerNorm, BatchNorm)
//!   pool.rs    ─ MaxPool, AveragePool, GlobalAveragePool
//!   pool_5hd.rs ─ MaxPool over NC1HWC0 (whole pixel units, vmax with a block stride)
//!   window.rs  ─ a pooling window's geometry per spatial axis (pads, auto_pad)
//!   aipp.rs    ─ AIPP as a vector kernel (where it is not fused into the first convolution)
//!   cube.rs    ─ MatMul, Gemm, Conv on the cube (img2col), depthwise conv
//!   movement.rs ─ Transpose, Concat, Slice, Gather, Expand as DMA kernels
//! ```
//!
//! Kernel ABI: a kernel reads its argument array with `sreg xN, args`; entry i is the device
//! address of `Kernel::args[i]` (a node input or output, a constant the lowering derived, or a
//! slice of the node's GM workspace). Shapes, strides and tile sizes are immediates: every gear
//! branch is static, so each kernel is specialised for its shapes (identical kernels are
//! stored once).

pub mod activation;
pub mod aipp;
pub mod bcast;
pub mod conv_transpose;
pub mod cube;
pub mod dma;
pub mod elementwise;
pub mod gather_nd;
pub mod movement;
pub mod norm;
pub mod pool;
pub mod pool_5hd;
pub mod queue;
pub mod reduce;
pub mod resize;
pub mod stream;
pub mod vec;
pub mod window;
pub mod writer;

use std::fmt;

use gearsim_isa::{Comments, Program};

use super::Target;
use super::ir::{Node, Tensor, TensorDesc};

/// What an entry of a kernel's argument array points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// The node's input `i`.
    Input(usize),
    /// The node's output `i`.
    Output(usize),
    /// Constant `i` of [`Lowered::Kernels::derived`] (weights the lowering prepared).
    Derived(usize),
    /// The node's GM workspace at this byte offset.
    Workspace(u64),
    /// The node's input `i` from this byte offset (one launch's part of a batch).
    InputFrom(usize, u64),
    /// The node's output `i` from this byte offset.
    OutputFrom(usize, u64),
}

impl Operand {
    /// The same tensor `bytes` further on, for a launch that runs on a part of it; a derived
    /// constant has no parts (`None`).
    pub fn plus(self, bytes: u64) -> Option<Operand> {
        match self {
            Operand::Input(i) => Some(Operand::InputFrom(i, bytes)),
            Operand::InputFrom(i, at) => Some(Operand::InputFrom(i, at + bytes)),
            Operand::Output(i) => Some(Operand::OutputFrom(i, bytes)),
            Operand::OutputFrom(i, at) => Some(Operand::OutputFrom(i, at + bytes)),
            Operand::Workspace(at) => Some(Operand::Workspace(at + bytes)),
            Operand::Derived(_) => None,
        }
    }

    /// Where in its tensor an input or output operand starts (0 for a whole one).
    pub fn offset(self) -> u64 {
        match self {
            Operand::InputFrom(_, at) | Operand::OutputFrom(_, at) => at,
            _ => 0,
        }
    }
}

/// One kernel launch.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// Name (the op, its types and shapes).
    pub name: String,
    /// The built program.
    pub program: Program,
    /// Its comments (the tiling among them), kept for the listing.
    pub comments: Comments,
    /// Blocks to launch.
    pub block_dim: u32,
    /// The argument array, in order.
    pub args: Vec<Operand>,
    /// Tiling parameters, for dumps and studies.
    pub tiling: Vec<(String, i64)>,
    /// The node inputs whose values the kernel's scalar unit reads (a Gather's indices steer
    /// its row addresses; a runtime bias is read to be broadcast): a timing-only run must
    /// still compute them, so the producers of these inputs run in full mode too.
    pub value_inputs: Vec<usize>,
    /// Whether the kernel runs in full mode in every run (`.om` kernel flag
    /// `KERNEL_NEEDS_VALUES`): it reads values itself, or a kernel that does reads what it
    /// computes. Set by emission from `value_inputs`.
    pub needs_values: bool,
    /// On a separated chip, the vector core's program of a MIX kernel whose `program` is the
    /// cube core's (`mix::split`).
    pub mix: Option<MixPart>,
}

/// The vector side of a MIX kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixPart {
    /// The vector core's program.
    pub vector: Program,
    /// Its comments.
    pub comments: Comments,
}

impl Kernel {
    /// The program as assembly text: the disassembly with its comments and tiling, as
    /// `--dump_kernels` writes it.
    pub fn listing(&self) -> String {
        self.program.listing(&self.comments)
    }
}

/// How a node runs on the device.
#[derive(Debug, Clone)]
pub enum Lowered {
    /// One AI CPU task reading the node's inputs and writing its outputs, in order: GE's
    /// AI CPU engine, where an operator goes when the AI core has no kernel for it.
    AiCpu {
        /// The operator.
        op: gearsim_isa::aicpu_op::AiCpuOp,
    },
    /// Its output is its input `input`'s bytes under another shape: no kernel.
    Alias {
        /// The input whose memory the output shares.
        input: usize,
    },
    /// Kernels run in order on the node's stream.
    Kernels {
        /// The launches.
        kernels: Vec<Kernel>,
        /// Constants the kernels read (e.g. weights converted and laid out for the cube).
        derived: Vec<Tensor>,
        /// GM scratch the kernels need, in bytes.
        workspace_bytes: u64,
    },
}

/// What a lowering sees of the node.
pub struct LowerCtx<'a> {
    /// The node.
    pub node: &'a Node,
    /// Its inputs' descriptors (`None` for an absent optional input).
    pub inputs: Vec<Option<&'a TensorDesc>>,
    /// Values of inputs that are constants.
    pub values: Vec<Option<&'a Tensor>>,
    /// Its outputs' descriptors.
    pub outputs: &'a [TensorDesc],
    /// The chip.
    pub target: &'a Target,
}

impl LowerCtx<'_> {
    /// Descriptor of a required input.
    pub fn input(&self, i: usize) -> Result<&TensorDesc, LowerError> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| self.error(format!("input {i} is missing")))
    }

    /// The node as the operator library's parsers see it (the lowering's shapes and known
    /// values), so a lowering reuses the parse shape inference ran. A lowering does not see
    /// the model's opset (0 here): it calls only parsers that do not depend on it.
    pub fn op_ctx(&self) -> crate::infer::OpCtx<'_> {
        crate::infer::OpCtx {
            node: self.node,
            inputs: self.inputs.clone(),
            values: self.values.clone(),
            opset: 0,
        }
    }

    /// A parser's error as this node's lowering error.
    pub fn op_error(&self, e: crate::infer::OpError) -> LowerError {
        self.error(format!("expected {}, got {}", e.expected, e.got))
    }

    /// An error about this node.
    pub fn error(&self, message: impl Into<String>) -> LowerError {
        let shapes: Vec<String> = self
            .inputs
            .iter()
            .map(|d| d.map_or_else(|| "_".to_string(), ToString::to_string))
            .collect();
        LowerError {
            node: self.node.name.clone(),
            op: self.node.op.clone(),
            shapes: shapes.join(", "),
            message: message.into(),
        }
    }

    /// A kernel from a finished writer.
    pub fn kernel(
        &self,
        asm: writer::Asm,
        block_dim: u32,
        args: Vec<Operand>,
    ) -> Result<Kernel, LowerError> {
        let name = asm.name().to_string();
        let f = asm.finish().map_err(|e| match e {
            writer::FinishError::TooLarge(what) => self.error(what),
            writer::FinishError::Generator(what) => {
                self.error(format!("internal error generating kernel: {what}"))
            }
        })?;
        Ok(Kernel {
            name,
            program: f.program,
            comments: f.comments,
            block_dim,
            args,
            tiling: f.tiling,
            value_inputs: Vec::new(),
            needs_values: false,
            mix: None,
        })
    }
}

/// A node the back end cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot lower node `{node}` ({op}) with inputs [{shapes}]: {message}")]
pub struct LowerError {
    /// Node name.
    pub node: String,
    /// Operator type.
    pub op: String,
    /// Its input descriptors.
    pub shapes: String,
    /// Why, with the limit that was hit.
    pub message: String,
}

/// A lowering function.
pub type LowerFn = fn(&LowerCtx<'_>) -> Result<Lowered, LowerError>;

/// The lowering of an op type: each module of this directory answers for its ops.
pub fn lowering(op: &str) -> Option<LowerFn> {
    let alias: Option<LowerFn> = match op {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" => Some(alias_input0),
        _ => None,
    };
    alias
        .or_else(|| elementwise::lowering(op))
        .or_else(|| reduce::lowering(op))
        .or_else(|| pool::lowering(op))
        .or_else(|| cube::lowering(op))
        .or_else(|| movement::lowering(op))
        .or_else(|| composed(op))
        .or_else(|| (op == crate::aipp::OP).then_some(aipp::lower as LowerFn))
}

/// The lowerings built from other ops' lowerings ([`compose`]).
fn composed(op: &str) -> Option<LowerFn> {
    let f: LowerFn = match op {
        "Resize" => resize::lower,
        "ConvTranspose" => conv_transpose::lower,
        "GatherElements" | "GatherND" => gather_nd::lower,
        "InstanceNormalization" | "GroupNormalization" => norm::lower,
        _ => return None,
    };
    Some(f)
}

/// One step of a lowering composed from other ops' lowerings: `op` with `attrs` over inputs
/// described by `ins`, producing `out`; its kernels read input `i` from `from[i]` and write
/// `to`.
pub(crate) struct Step<'a> {
    pub op: &'a str,
    pub attrs: &'a [(&'a str, crate::ir::Attr)],
    pub ins: &'a [TensorDesc],
    /// Values of inputs known at compile time (missing entries: none).
    pub values: &'a [Option<&'a Tensor>],
    pub out: TensorDesc,
    pub from: &'a [Operand],
    pub to: Operand,
}

/// Lowers `step` as a node of its own (named like `ctx`'s, so errors name the user's node) and
/// appends its kernels to `b`, named `<prefix>_<kernel>`. A step that would alias its input is
/// an internal error: a composition gives every step its own buffer.
pub(crate) fn compose(
    ctx: &LowerCtx<'_>,
    b: &mut cube::Build,
    step: &Step<'_>,
    prefix: &str,
) -> Result<(), LowerError> {
    let mut node = ctx.node.clone();
    node.op = step.op.into();
    node.attrs.clear();
    for (k, v) in step.attrs {
        node.attrs.insert((*k).into(), v.clone());
    }
    let outputs = [step.out.clone()];
    let sub = LowerCtx {
        node: &node,
        inputs: step.ins.iter().map(Some).collect(),
        values: (0..step.ins.len())
            .map(|i| step.values.get(i).copied().flatten())
            .collect(),
        outputs: &outputs,
        target: ctx.target,
    };
    let lowering = lowering(step.op)
        .ok_or_else(|| ctx.error(format!("internal error: no lowering of {}", step.op)))?;
    let lowered = lowering(&sub)?;
    match lowered {
        Lowered::Alias { input } => {
            return Err(ctx.error(format!(
                "internal error: the {} step aliases its input {input}",
                step.op
            )));
        }
        Lowered::AiCpu { op } => {
            return Err(ctx.error(format!(
                "the {} step runs on the AI CPU ({}), which a composed AI core kernel cannot \
                 call",
                step.op,
                op.describe()
            )));
        }
        Lowered::Kernels { .. } => {}
    }
    b.inline(lowered, &|i| step.from[i], step.to, |name| {
        format!("{prefix}_{name}")
    })
    .map_err(|e| ctx.error(e))
}

/// The node computed in the wider type `via`: input 0 cast to it, the op run on it (same
/// attributes and other inputs), the result cast back to the output's type. Used where the
/// kernels lack a narrow type and the round trip is exact (bool and 8-bit integers through a
/// float type that holds every value).
pub(crate) fn through_type(
    ctx: &LowerCtx<'_>,
    via: crate::ir::DataType,
) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let y = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    let mut ins = vec![TensorDesc::new(via, x.shape.clone())];
    let mut from = vec![Operand::Input(0)];
    let mut values = vec![None];
    for (i, d) in ctx.inputs.iter().enumerate().skip(1) {
        let d = d.ok_or_else(|| ctx.error(format!("internal error: input {i} is absent")))?;
        ins.push(d.clone());
        from.push(Operand::Input(i));
        values.push(ctx.values.get(i).copied().flatten());
    }
    let bytes = |d: &TensorDesc| d.bytes().unwrap_or(0);
    let out = TensorDesc::new(via, y.shape.clone());
    let attrs: Vec<(&str, crate::ir::Attr)> = ctx
        .node
        .attrs
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let mut b = cube::Build::default();
    let (wide_in, wide_out) = (b.scratch(bytes(&ins[0])), b.scratch(bytes(&out)));
    let to = |t: crate::ir::DataType| [("to", crate::ir::Attr::Int(i64::from(t.onnx_code())))];
    let prefix = ctx.node.op.clone();
    compose(
        ctx,
        &mut b,
        &Step {
            op: "Cast",
            attrs: &to(via),
            ins: std::slice::from_ref(x),
            values: &[],
            out: ins[0].clone(),
            from: &[Operand::Input(0)],
            to: wide_in,
        },
        &prefix,
    )?;
    from[0] = wide_in;
    compose(
        ctx,
        &mut b,
        &Step {
            op: &ctx.node.op,
            attrs: &attrs,
            ins: &ins,
            values: &values,
            out: out.clone(),
            from: &from,
            to: wide_out,
        },
        &prefix,
    )?;
    compose(
        ctx,
        &mut b,
        &Step {
            op: "Cast",
            attrs: &to(y.dtype),
            ins: &[out],
            values: &[],
            out: y.clone(),
            from: &[wide_out],
            to: Operand::Output(0),
        },
        &prefix,
    )?;
    Ok(b.finish())
}

/// Lowers one node.
pub fn lower_node(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let f = lowering(&ctx.node.op).ok_or_else(|| {
        ctx.error("no device kernel for this operator (it is supported by shape inference only)")
    })?;
    let lowered = f(ctx)?;
    if ctx.target.core.separated {
        return separate(ctx, lowered);
    }
    Ok(lowered)
}

/// On a separated chip, every kernel that uses the cube and the vector unit becomes a MIX
/// kernel, its drain slots appended to the node's workspace.
fn separate(ctx: &LowerCtx<'_>, lowered: Lowered) -> Result<Lowered, LowerError> {
    let Lowered::Kernels {
        mut kernels,
        derived,
        mut workspace_bytes,
    } = lowered
    else {
        return Ok(lowered);
    };
    for k in &mut kernels {
        let split = crate::mix::split(
            &k.program,
            &k.comments,
            k.args.len(),
            ctx.target.core.event_ids,
            ctx.target.core.l1_bytes,
        )
        .map_err(|e| ctx.error(format!("kernel {}: {e}", k.name)))?;
        let Some(split) = split else { continue };
        let at = workspace_bytes.div_ceil(512) * 512;
        workspace_bytes = at + split.slot_bytes * u64::from(k.block_dim);
        k.args.push(Operand::Workspace(at));
        k.program = split.cube;
        k.comments = split.cube_comments;
        k.mix = Some(MixPart {
            vector: split.vector,
            comments: split.vector_comments,
        });
    }
    Ok(Lowered::Kernels {
        kernels,
        derived,
        workspace_bytes,
    })
}

/// What a kernel computes on its output before writing it: the activation the fusion pass
/// folded into the node (`fusion::FUSED_ACTIVATION`), if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// The output as the op computes it.
    None,
    /// `max(y, 0)`.
    Relu,
}

impl Epilogue {
    /// The node's epilogue; an activation no kernel computes is an error (the fusion pass
    /// only folds ones that the producer's lowering does).
    pub fn of(ctx: &LowerCtx<'_>) -> Result<Epilogue, LowerError> {
        match ctx.node.string(crate::fusion::FUSED_ACTIVATION) {
            None => Ok(Epilogue::None),
            Some("Relu") => Ok(Epilogue::Relu),
            Some(other) => Err(ctx.error(format!("no kernel computes a fused {other}"))),
        }
    }

    /// The kernel-name suffix that shows it (`relu`), empty for none.
    pub fn suffix(self) -> &'static str {
        match self {
            Epilogue::None => "",
            Epilogue::Relu => "relu",
        }
    }
}

fn alias_input0(_: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    Ok(Lowered::Alias { input: 0 })
}

/// A kernel name: the op and its first output's type and dims, e.g. `Add_f32_8x64x56x56`.
pub fn kernel_name(ctx: &LowerCtx<'_>, suffix: &str) -> String {
    let mut s = ctx.node.op.clone();
    if let Some(o) = ctx.outputs.first() {
        s.push('_');
        s.push_str(o.dtype.name());
        s.push('_');
        let dims: Vec<String> = o
            .shape
            .iter()
            .map(|d| d.fixed().map_or_else(|| "?".into(), |v| v.to_string()))
            .collect();
        s.push_str(&dims.join("x"));
    }
    if !suffix.is_empty() {
        s.push('_');
        s.push_str(suffix);
    }
    s
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (block_dim {})", self.name, self.block_dim)
    }
}
