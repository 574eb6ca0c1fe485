//! Element-wise ops on the vector unit: Add, Sub, Mul, Div, Pow, Equal and Where with full numpy
//! broadcasting; Relu, Sqrt, Sigmoid, Tanh, Erf, Gelu, Clip and Cast.
//!
//! ```text
//!   same shapes, plain types ─▶ stream.rs (one contiguous double-buffered pass)
//!   anything else            ─▶ bcast.rs: canonical broadcast form, chunk or row tiles
//!        one canonical axis  ─▶ one kernel; bool/uint8/int8/int64 tensors load and store
//!                               through the spread DMA of bcast.rs
//!        more axes           ─▶ such tensors first go to i32 GM workspace (one-axis kernels),
//!                               the broadcast kernel works on i32, and a last one-axis
//!                               kernel narrows its i32 result into the output
//! ```
//!
//! Types: arithmetic in f32, f16 and i32 (Div in floats only: the unit has no integer divide);
//! transcendental functions compute in f32 and widen / narrow f16 around it. Tensors of one
//! byte are seen as i32 (bool loads as 0 or 1), int64 as its two i32 words. float64 and int16
//! have no kernel and are refused with a [`LowerError`] naming the node.

use gearsim_isa::aicpu_op::{
    AiCpuOp, ElementwiseOp, MAX_RANK as AICPU_MAX_RANK, Operand as AiOperand,
};
use gearsim_isa::{Cmp, DType, ProgramBuilder, Round};

use super::activation::{self, Act, Exponent, POW_CONSTS, POW_SCRATCH};
use super::bcast::{self, Body, BodyFn, ByteKind, Const, Fmt, Job};
use super::stream::{Io, Stream, Tile};
use super::vec::{BinOp, ScalarOp, UnOp, View, Vx};
use super::writer::{Asm, Reg};
use super::{Epilogue, Kernel, LowerCtx, LowerError, LowerFn, Lowered, Operand, kernel_name};
use crate::ir::{Attr, DataType, Tensor, TensorDesc, shape_values};

/// The lowering of an element-wise op type.
pub fn lowering(op: &str) -> Option<LowerFn> {
    let f: LowerFn = match op {
        "Add" | "Sub" | "Mul" | "Div" => arith,
        "Pow" => pow,
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => compare,
        "And" | "Or" | "Xor" | "Not" => logic,
        "Where" => where_op,
        "Trilu" => trilu,
        "Relu" | "Sqrt" | "Sigmoid" | "Tanh" | "Erf" | "Gelu" | "Exp" | "Log" | "Abs" | "Neg"
        | "Reciprocal" | "Floor" | "Ceil" | "Softplus" | "Softsign" | "LeakyRelu" | "Elu"
        | "Selu" | "Celu" | "HardSigmoid" | "HardSwish" | "ThresholdedRelu" | "Round" | "Sign" => {
            unary
        }
        "IsNaN" | "IsInf" => is_special,
        "PRelu" => prelu,
        "Sum" | "Mean" | "Max" | "Min" => variadic,
        "Clip" => clip,
        "Cast" | "CastLike" => cast,
        // The vector unit has no integer division; GE runs Mod on the AI CPU here.
        "Mod" => on_aicpu,
        _ => return None,
    };
    Some(f)
}

/// The vector type of a tensor type, when the vector unit computes in it.
pub fn vector_type(t: DataType) -> Option<DType> {
    match t {
        DataType::F32 => Some(DType::F32),
        DataType::F16 => Some(DType::F16),
        DataType::I32 => Some(DType::I32),
        _ => None,
    }
}

/// How a tensor type is stored for the broadcast kernels, if it can be.
fn fmt_of(t: DataType) -> Option<Fmt> {
    match t {
        DataType::F32 | DataType::I32 => Some(Fmt::Plain(4)),
        DataType::F16 => Some(Fmt::Plain(2)),
        DataType::Bool => Some(Fmt::Byte(ByteKind::Bool)),
        DataType::U8 => Some(Fmt::Byte(ByteKind::U8)),
        DataType::I8 => Some(Fmt::Byte(ByteKind::I8)),
        DataType::I64 => Some(Fmt::I64),
        _ => None,
    }
}

/// The vector type the body sees a tensor type as (bytes and int64 words as i32).
fn body_type(t: DataType) -> DType {
    vector_type(t).unwrap_or(DType::I32)
}

fn dims(ctx: &LowerCtx<'_>, d: &TensorDesc) -> Result<Vec<u64>, LowerError> {
    shape_values(&d.shape)
        .map(|v| v.iter().map(|x| (*x).max(0) as u64).collect())
        .ok_or_else(|| ctx.error(format!("shape {d} is not static")))
}

fn output<'a>(ctx: &'a LowerCtx<'a>) -> Result<&'a TensorDesc, LowerError> {
    ctx.outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))
}

fn check_type(
    ctx: &LowerCtx<'_>,
    what: &str,
    t: DataType,
    allowed: &[DataType],
) -> Result<(), LowerError> {
    if allowed.contains(&t) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
    Err(ctx.error(format!(
        "{what} has type {}; the vector kernel supports {}",
        t.name(),
        names.join(", ")
    )))
}

fn fmt_or_error(ctx: &LowerCtx<'_>, what: &str, t: DataType) -> Result<Fmt, LowerError> {
    fmt_of(t).ok_or_else(|| {
        ctx.error(format!(
            "{what} has type {}, which has no vector kernel (float64 and int16 are not \
             supported; cast to float32 or int32 first)",
            t.name()
        ))
    })
}

/// The node as one AI CPU task: GE places an element-wise operator on its AI CPU engine when
/// the vector unit has no kernel for its types (int16, unsigned and 64-bit integers, float64)
/// or for the operator (Mod).
fn on_aicpu(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let op = ElementwiseOp::of_node(&ctx.node.op, ctx.node.int("fmod") == Some(1))
        .ok_or_else(|| ctx.error("internal error: not an AI CPU element-wise operator"))?;
    if Epilogue::of(ctx)? != Epilogue::None {
        return Err(ctx.error(
            "internal error: a fused activation on an operator the AI CPU runs (fusion only \
             folds into AI core kernels)",
        ));
    }
    let operand = |d: &TensorDesc| -> Result<AiOperand, LowerError> {
        Ok(AiOperand {
            dtype: d.dtype,
            dims: dims(ctx, d)?.iter().map(|x| *x as i64).collect(),
        })
    };
    let inputs = (0..ctx.inputs.len())
        .map(|i| operand(ctx.input(i)?))
        .collect::<Result<Vec<_>, _>>()?;
    let output = operand(output(ctx)?)?;
    if output.dims.len() > AICPU_MAX_RANK {
        return Err(ctx.error(format!(
            "the AI CPU kernel takes at most {AICPU_MAX_RANK} dims, the output has {}",
            output.dims.len()
        )));
    }
    Ok(Lowered::AiCpu {
        op: AiCpuOp::Elementwise { op, inputs, output },
    })
}

const FLOATS: [DataType; 2] = [DataType::F32, DataType::F16];
const NUMERIC: [DataType; 3] = [DataType::F32, DataType::F16, DataType::I32];

fn no_kernels() -> Lowered {
    Lowered::Kernels {
        kernels: Vec::new(),
        derived: Vec::new(),
        workspace_bytes: 0,
    }
}

/// A contiguous streaming kernel (`stream.rs`) over `n` elements of equally shaped tensors.
fn stream_lowering(
    ctx: &LowerCtx<'_>,
    name: String,
    n: u64,
    ins: &[(Operand, u64)],
    out: u64,
    scratch: Vec<u64>,
    body: BodyFn<'_>,
) -> Result<Lowered, LowerError> {
    if n == 0 {
        return Ok(no_kernels());
    }
    let setup = |a: &mut Asm, _: Reg| vec![a.reg()];
    let adapt = |a: &mut Asm, t: &Tile| {
        let b = Body {
            ins: t.ins.iter().map(|&r| View::flat(r)).collect(),
            outs: t.outs.iter().map(|&r| View::flat(r)).collect(),
            scratch: t.scratch.iter().map(|&r| View::flat(r)).collect(),
            consts: Vec::new(),
            tmp: t.consts[0],
            count: t.len,
        };
        body(a, &b);
    };
    let s = Stream {
        n,
        inputs: ins
            .iter()
            .enumerate()
            .map(|(i, (_, elem))| Io::new(i, *elem))
            .collect(),
        outputs: vec![Io::new(ins.len(), out)],
        scratch,
        row: 0,
        resident: Vec::new(),
        setup: &setup,
        body: &adapt,
    };
    let plan = s.plan(&ctx.target.core).ok_or_else(|| {
        ctx.error(format!(
            "one tile of the streamed tensors does not fit in the {}-byte unified buffer",
            ctx.target.core.ub_bytes
        ))
    })?;
    let mut a = Asm::new(&name);
    s.emit(&mut a, plan);
    let mut args: Vec<Operand> = ins.iter().map(|(o, _)| *o).collect();
    args.push(Operand::Output(0));
    Ok(Lowered::Kernels {
        kernels: vec![ctx.kernel(a, plan.block_dim, args)?],
        derived: Vec::new(),
        workspace_bytes: 0,
    })
}

/// A tensor a broadcast kernel reads.
struct Src {
    op: Operand,
    fmt: Fmt,
    shape: Vec<u64>,
}

/// A kernel from a broadcast job.
fn job_kernel(
    ctx: &LowerCtx<'_>,
    name: String,
    job: &Job<'_>,
    args: Vec<Operand>,
) -> Result<Kernel, LowerError> {
    let plan = job.plan(&ctx.target.core).map_err(|e| ctx.error(e))?;
    let mut a = Asm::new(&name);
    bcast::emit(job, &plan, &mut a);
    ctx.kernel(a, plan.block_dim, args)
}

/// Copies every word (one-axis conversion passes).
fn copy_words(a: &mut Asm, b: &Body) {
    let mut vx = Vx { a, tmp: b.tmp };
    for (o, i) in b.outs.iter().zip(&b.ins) {
        vx.vun(ProgramBuilder::vmov, DType::I32, *o, *i);
    }
}

fn round32(x: u64) -> u64 {
    x.div_ceil(32) * 32
}

/// Lowers an element-wise computation over broadcast inputs: one chunk-mode kernel when the
/// broadcast has one canonical axis, else the broadcast kernel on plain tensors with one-axis
/// passes converting bytes and int64 through GM workspace before and after.
#[allow(clippy::too_many_arguments)]
fn broadcast_lowering(
    ctx: &LowerCtx<'_>,
    suffix: &str,
    ins: &[Src],
    out_fmt: Fmt,
    out_shape: &[u64],
    scratch: Vec<u64>,
    consts: Vec<Const>,
    body: BodyFn<'_>,
) -> Result<Lowered, LowerError> {
    let n: u64 = out_shape.iter().product();
    if n == 0 {
        return Ok(no_kernels());
    }
    let shapes: Vec<&[u64]> = ins.iter().map(|s| s.shape.as_slice()).collect();
    let canon = bcast::canonical(out_shape, &shapes);
    let name = kernel_name(ctx, suffix);
    if canon.dims.len() == 1 {
        let mut args: Vec<Operand> = ins.iter().map(|s| s.op).collect();
        args.push(Operand::Output(0));
        let job = Job {
            dims: canon.dims.clone(),
            inputs: ins
                .iter()
                .zip(&canon.strides)
                .enumerate()
                .map(|(i, (s, st))| bcast::Input {
                    arg: i,
                    fmt: s.fmt,
                    strides: st.clone(),
                })
                .collect(),
            outputs: vec![bcast::Output {
                arg: ins.len(),
                fmt: out_fmt,
            }],
            scratch,
            consts,
            body,
        };
        return Ok(Lowered::Kernels {
            kernels: vec![job_kernel(ctx, name, &job, args)?],
            derived: Vec::new(),
            workspace_bytes: 0,
        });
    }
    let mut ws = 0u64;
    let mut ws_alloc = |bytes: u64| {
        let o = ws;
        ws += round32(bytes.max(1));
        o
    };
    let mut kernels = Vec::new();
    let mut args = Vec::new();
    let mut inputs = Vec::new();
    for (i, (s, st)) in ins.iter().zip(&canon.strides).enumerate() {
        if let Fmt::Plain(_) = s.fmt {
            inputs.push(bcast::Input {
                arg: args.len(),
                fmt: s.fmt,
                strides: st.clone(),
            });
            args.push(s.op);
            continue;
        }
        let ni: u64 = s.shape.iter().product();
        let words: Vec<u64> = (0..s.fmt.words()).map(|_| ws_alloc(4 * ni)).collect();
        let mut pre_args = vec![s.op];
        pre_args.extend(words.iter().map(|&o| Operand::Workspace(o)));
        let pre = Job {
            dims: vec![ni],
            inputs: vec![bcast::Input {
                arg: 0,
                fmt: s.fmt,
                strides: vec![1],
            }],
            outputs: (0..words.len())
                .map(|w| bcast::Output {
                    arg: 1 + w,
                    fmt: Fmt::Plain(4),
                })
                .collect(),
            scratch: Vec::new(),
            consts: Vec::new(),
            body: &copy_words,
        };
        kernels.push(job_kernel(ctx, format!("{name}_in{i}"), &pre, pre_args)?);
        for &o in &words {
            inputs.push(bcast::Input {
                arg: args.len(),
                fmt: Fmt::Plain(4),
                strides: st.clone(),
            });
            args.push(Operand::Workspace(o));
        }
    }
    let (outputs, post) = if let Fmt::Plain(_) = out_fmt {
        let o = bcast::Output {
            arg: args.len(),
            fmt: out_fmt,
        };
        args.push(Operand::Output(0));
        (vec![o], None)
    } else {
        let words: Vec<u64> = (0..out_fmt.words()).map(|_| ws_alloc(4 * n)).collect();
        let outs = words
            .iter()
            .map(|&o| {
                args.push(Operand::Workspace(o));
                bcast::Output {
                    arg: args.len() - 1,
                    fmt: Fmt::Plain(4),
                }
            })
            .collect();
        (outs, Some(words))
    };
    let main = Job {
        dims: canon.dims.clone(),
        inputs,
        outputs,
        scratch,
        consts,
        body,
    };
    kernels.push(job_kernel(ctx, name.clone(), &main, args)?);
    if let Some(words) = post {
        let mut post_args: Vec<Operand> = words.iter().map(|&o| Operand::Workspace(o)).collect();
        post_args.push(Operand::Output(0));
        let job = Job {
            dims: vec![n],
            inputs: (0..words.len())
                .map(|w| bcast::Input {
                    arg: w,
                    fmt: Fmt::Plain(4),
                    strides: vec![1],
                })
                .collect(),
            outputs: vec![bcast::Output {
                arg: words.len(),
                fmt: out_fmt,
            }],
            scratch: Vec::new(),
            consts: Vec::new(),
            body: &copy_words,
        };
        kernels.push(job_kernel(ctx, format!("{name}_out"), &job, post_args)?);
    }
    Ok(Lowered::Kernels {
        kernels,
        derived: Vec::new(),
        workspace_bytes: ws,
    })
}

fn src(ctx: &LowerCtx<'_>, i: usize, fmt: Fmt) -> Result<Src, LowerError> {
    Ok(Src {
        op: Operand::Input(i),
        fmt,
        shape: dims(ctx, ctx.input(i)?)?,
    })
}

/// Add, Sub, Mul, Div with numpy broadcasting.
pub fn arith(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    let out = output(ctx)?;
    let op = ctx.node.op.as_str();
    let (vop, types): (BinOp, &[DataType]) = match op {
        "Add" => (ProgramBuilder::vadd, &NUMERIC),
        "Sub" => (ProgramBuilder::vsub, &NUMERIC),
        "Mul" => (ProgramBuilder::vmul, &NUMERIC),
        "Div" => (ProgramBuilder::vdiv, &FLOATS),
        _ => return Err(ctx.error(format!("{op} is not a binary vector op"))),
    };
    if let Some(kind) = byte_kind(out.dtype) {
        return arith_bytes(ctx, vop, kind);
    }
    if !types.contains(&out.dtype) {
        return on_aicpu(ctx);
    }
    let ty = body_type(out.dtype);
    let e = out.dtype.size() as u64;
    let epilogue = Epilogue::of(ctx)?;
    let body = |a: &mut Asm, t: &Body| {
        let mut vx = Vx { a, tmp: t.tmp };
        vx.vbin(vop, ty, t.outs[0], t.ins[0], t.ins[1]);
        if epilogue == Epilogue::Relu {
            vx.vun(ProgramBuilder::vrelu, ty, t.outs[0], t.outs[0]);
        }
    };
    let (da, db) = (dims(ctx, a)?, dims(ctx, b)?);
    if da == db {
        let n = da.iter().product();
        let ins = [(Operand::Input(0), e), (Operand::Input(1), e)];
        let name = kernel_name(ctx, epilogue.suffix());
        return stream_lowering(ctx, name, n, &ins, e, Vec::new(), &body);
    }
    let ins = [src(ctx, 0, Fmt::Plain(e))?, src(ctx, 1, Fmt::Plain(e))?];
    broadcast_lowering(
        ctx,
        "bcast",
        &ins,
        Fmt::Plain(e),
        &dims(ctx, out)?,
        Vec::new(),
        Vec::new(),
        &body,
    )
}

/// The byte kind of an 8-bit integer type.
fn byte_kind(t: DataType) -> Option<ByteKind> {
    match t {
        DataType::I8 => Some(ByteKind::I8),
        DataType::U8 => Some(ByteKind::U8),
        _ => None,
    }
}

/// Add, Sub, Mul, Div of int8 / uint8: the kernels load bytes as i32 (sign- or zero-extended),
/// compute in i32 and store the low byte, which wraps as the 8-bit types do; Div divides in
/// f32 and truncates toward zero (exact: the operands have at most 8 bits).
fn arith_bytes(ctx: &LowerCtx<'_>, vop: BinOp, kind: ByteKind) -> Result<Lowered, LowerError> {
    let out = output(ctx)?;
    let div = ctx.node.op == "Div";
    let body = move |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let o = t.outs[0];
        if div {
            let (fa, fb) = (t.scratch[0], t.scratch[1]);
            vx.vconv(DType::F32, DType::I32, fa, t.ins[0], Round::Rint);
            vx.vconv(DType::F32, DType::I32, fb, t.ins[1], Round::Rint);
            vx.vbin(ProgramBuilder::vdiv, DType::F32, fa, fa, fb);
            vx.vconv(DType::I32, DType::F32, o, fa, Round::Trunc);
        } else {
            vx.vbin(vop, DType::I32, o, t.ins[0], t.ins[1]);
        }
    };
    let fmt = Fmt::Byte(kind);
    let ins = [src(ctx, 0, fmt)?, src(ctx, 1, fmt)?];
    let scratch = if div { vec![4, 4] } else { Vec::new() };
    broadcast_lowering(
        ctx,
        "bytes",
        &ins,
        fmt,
        &dims(ctx, out)?,
        scratch,
        Vec::new(),
        &body,
    )
}

/// What a unary op computes.
#[derive(Clone, Copy)]
enum Unary {
    /// One vector instruction in the tensor's type.
    Vector(UnOp),
    /// A function computed in f32.
    Act(Act),
}

/// The unary ops: one vector instruction (Relu, Sqrt, Exp, Log, Abs, Reciprocal) or an f32
/// body ([`Act`]: the transcendental and piecewise activations, Neg, Floor, Ceil).
pub fn unary(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let op = ctx.node.op.as_str();
    let (alpha, second) = crate::ops::activation_attrs(ctx.node).unwrap_or_default();
    let (unary, types): (Unary, &[DataType]) = match op {
        "Relu" => (Unary::Vector(ProgramBuilder::vrelu), &NUMERIC),
        "Sqrt" => (Unary::Vector(ProgramBuilder::vsqrt), &FLOATS),
        "Exp" => (Unary::Vector(ProgramBuilder::vexp), &FLOATS),
        "Log" => (Unary::Vector(ProgramBuilder::vln), &FLOATS),
        "Abs" => (Unary::Vector(ProgramBuilder::vabs), &NUMERIC),
        "Reciprocal" => (Unary::Vector(ProgramBuilder::vrec), &FLOATS),
        "Neg" => (Unary::Act(Act::Neg), &FLOATS),
        "Floor" => (Unary::Act(Act::Round(Round::Floor)), &FLOATS),
        "Ceil" => (Unary::Act(Act::Round(Round::Ceil)), &FLOATS),
        // Half to even, as ONNX's Round (the unit's rint).
        "Round" => (Unary::Act(Act::Round(Round::Rint)), &FLOATS),
        "Sign" => (Unary::Act(Act::Sign), &FLOATS),
        "Softplus" => (Unary::Act(Act::Softplus), &FLOATS),
        "Softsign" => (Unary::Act(Act::Softsign), &FLOATS),
        "LeakyRelu" => (Unary::Act(Act::LeakyRelu(alpha)), &FLOATS),
        "Elu" => (Unary::Act(Act::Elu(alpha)), &FLOATS),
        "Selu" => (Unary::Act(Act::Selu(alpha, second)), &FLOATS),
        "Celu" => (Unary::Act(Act::Celu(alpha)), &FLOATS),
        "HardSigmoid" => (Unary::Act(Act::HardSigmoid(alpha, second)), &FLOATS),
        "HardSwish" => (Unary::Act(Act::HardSwish), &FLOATS),
        "ThresholdedRelu" => (Unary::Act(Act::ThresholdedRelu(alpha)), &FLOATS),
        "Sigmoid" => (Unary::Act(Act::Sigmoid), &FLOATS),
        "Tanh" => (Unary::Act(Act::Tanh), &FLOATS),
        "Erf" => (Unary::Act(Act::Erf), &FLOATS),
        "Gelu" => match ctx.node.attr("approximate") {
            Some(Attr::Str(s)) if s == "tanh" => (Unary::Act(Act::GeluTanh), &FLOATS),
            None | Some(Attr::Str(_)) => (Unary::Act(Act::Gelu), &FLOATS),
            Some(other) => {
                return Err(ctx.error(format!("approximate = {other} is not a mode of Gelu")));
            }
        },
        _ => return Err(ctx.error(format!("{op} is not a unary vector op"))),
    };
    check_type(ctx, "the input", x.dtype, types)?;
    let ty = body_type(x.dtype);
    let e = x.dtype.size() as u64;
    let n = dims(ctx, x)?.iter().product();
    let ins = [(Operand::Input(0), e)];
    let name = kernel_name(ctx, "");
    let act = match unary {
        Unary::Vector(m) => {
            let body = |a: &mut Asm, t: &Body| {
                Vx { a, tmp: t.tmp }.vun(m, ty, t.outs[0], t.ins[0]);
            };
            return stream_lowering(ctx, name, n, &ins, e, Vec::new(), &body);
        }
        Unary::Act(act) => act,
    };
    let f16 = x.dtype == DataType::F16;
    let k = act.scratch();
    // Scratch: [x and result in f32 when f16], the function's tiles, the bit mask.
    let mut scratch = vec![4; k + if f16 { 2 } else { 0 }];
    scratch.push(1);
    let body = |a: &mut Asm, t: &Body| {
        let mut vx = Vx { a, tmp: t.tmp };
        let bits = t.scratch[t.scratch.len() - 1].reg;
        if f16 {
            let (x32, o32) = (t.scratch[0], t.scratch[1]);
            vx.vconv(DType::F32, DType::F16, x32, t.ins[0], Round::Rint);
            activation::emit(&mut vx, act, o32, x32, &t.scratch[2..2 + k], bits);
            vx.vconv(DType::F16, DType::F32, t.outs[0], o32, Round::Rint);
        } else {
            activation::emit(&mut vx, act, t.outs[0], t.ins[0], &t.scratch[..k], bits);
        }
    };
    stream_lowering(ctx, name, n, &ins, e, scratch, &body)
}

/// A Clip bound.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// Input absent: no bound.
    None,
    /// A constant: its raw bits.
    Imm(i64),
    /// A runtime one-element tensor: its index among the kernel's inputs.
    Input(usize),
}

/// Clip with optional min and max (constants become immediates, runtime tensors splats).
pub fn clip(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    // int8 / uint8 load as i32 and clip there (the bounds are in range, so the low byte
    // stored is the clipped value).
    let bytes = byte_kind(x.dtype);
    if bytes.is_none() {
        check_type(ctx, "the input", x.dtype, &NUMERIC)?;
    }
    let ty = body_type(x.dtype);
    let e = x.dtype.size() as u64;
    let fmt = bytes.map_or(Fmt::Plain(e), Fmt::Byte);
    let mut ins = vec![src(ctx, 0, fmt)?];
    let mut bounds = [Bound::None; 2];
    for (slot, i) in [1usize, 2].into_iter().enumerate() {
        let Some(d) = ctx.inputs.get(i).copied().flatten() else {
            continue;
        };
        if d.dtype != x.dtype {
            return Err(ctx.error(format!(
                "bound {i} has type {}, the input {}",
                d.dtype.name(),
                x.dtype.name()
            )));
        }
        let n: u64 = dims(ctx, d)?.iter().product();
        if n != 1 {
            return Err(ctx.error(format!("bound {i} has {n} elements; Clip takes one")));
        }
        bounds[slot] = match ctx.values.get(i).copied().flatten() {
            Some(t) if bytes.is_some() => Bound::Imm(t.to_i64s()[0]),
            Some(t) => Bound::Imm(raw_bits(t)),
            None => {
                ins.push(src(ctx, i, fmt)?);
                Bound::Input(ins.len() - 1)
            }
        };
    }
    let float = ty != DType::I32;
    let body = |a: &mut Asm, t: &Body| {
        let mut vx = Vx { a, tmp: t.tmp };
        let (o, xv) = (t.outs[0], t.ins[0]);
        let mut cur = xv;
        let ops: [(BinOp, ScalarOp); 2] = [
            (ProgramBuilder::vmax, ProgramBuilder::vmaxs),
            (ProgramBuilder::vmin, ProgramBuilder::vmins),
        ];
        for (b, (m, ms)) in bounds.iter().zip(ops) {
            match *b {
                Bound::None => {}
                Bound::Imm(bits) => vx.vscalar(ms, ty, o, cur, bits),
                Bound::Input(k) => vx.vbin(m, ty, o, cur, t.ins[k]),
            }
            if !matches!(b, Bound::None) {
                cur = o;
            }
        }
        if cur == xv {
            vx.vun(ProgramBuilder::vmov, ty, o, xv);
        } else if float {
            // vmax / vmin return the other operand for NaN; Clip keeps NaN.
            let bits = t.scratch[0].reg;
            vx.vcmp(Cmp::Eq, ty, bits, xv, xv);
            vx.vsel(ty, o, o, xv, bits);
        }
    };
    let scratch = if float { vec![1] } else { Vec::new() };
    if ins.len() == 1 && bytes.is_none() {
        let n = dims(ctx, x)?.iter().product();
        return stream_lowering(
            ctx,
            kernel_name(ctx, ""),
            n,
            &[(Operand::Input(0), e)],
            e,
            scratch,
            &body,
        );
    }
    broadcast_lowering(
        ctx,
        "bounds",
        &ins,
        fmt,
        &dims(ctx, x)?,
        scratch,
        Vec::new(),
        &body,
    )
}

/// The raw little-endian bits of a tensor's first element (up to 8 bytes).
fn raw_bits(t: &Tensor) -> i64 {
    let mut b = [0u8; 8];
    let n = t.dtype.size().min(8).min(t.data.len());
    b[..n].copy_from_slice(&t.data[..n]);
    let v = u64::from_le_bytes(b);
    // Sign-extend 4-byte values so i32 immediates read back as themselves.
    if n == 4 {
        i64::from(v as u32 as i32)
    } else {
        v as i64
    }
}

/// Pow: cheap exact forms for the common constant exponents, exp(b ln a) with C's special
/// cases otherwise (any broadcast, float or int32 exponent).
pub fn pow(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    let out = output(ctx)?;
    if !FLOATS.contains(&a.dtype) || !NUMERIC.contains(&b.dtype) {
        return on_aicpu(ctx);
    }
    let ty = body_type(a.dtype);
    let ea = a.dtype.size() as u64;
    let eb = b.dtype.size() as u64;
    let out_dims = dims(ctx, out)?;
    let n: u64 = out_dims.iter().product();
    let constant = ctx
        .values
        .get(1)
        .copied()
        .flatten()
        .filter(|t| t.len() == 1)
        .map(|t| t.to_f64s()[0]);
    if let Some(c) = constant.filter(|c| activation::pow_special(*c))
        && dims(ctx, a)? == out_dims
    {
        let body = |a: &mut Asm, t: &Body| {
            let mut vx = Vx { a, tmp: t.tmp };
            let (s, bits) = (t.scratch[0], t.scratch[1].reg);
            activation::pow_special_emit(&mut vx, ty, c, t.outs[0], t.ins[0], s, bits);
        };
        let ins = [(Operand::Input(0), ea)];
        return stream_lowering(ctx, kernel_name(ctx, ""), n, &ins, ea, vec![ea, 1], &body);
    }
    let f16 = a.dtype == DataType::F16;
    let b_f16 = b.dtype == DataType::F16;
    let b_int = b.dtype == DataType::I32;
    // Scratch: POW_SCRATCH tiles, the exponent in f32 (int or f16), a and the result in f32
    // (f16), the bit mask.
    let mut scratch = vec![4; POW_SCRATCH + 3];
    scratch.push(1);
    let consts = POW_CONSTS
        .iter()
        .map(|&(ty, bits)| Const {
            ty,
            bits: u64::from(bits),
        })
        .collect();
    let body = |a: &mut Asm, t: &Body| {
        let mut vx = Vx { a, tmp: t.tmp };
        let s = &t.scratch;
        let bits = s[s.len() - 1].reg;
        let (bf, a32, o32) = (s[POW_SCRATCH], s[POW_SCRATCH + 1], s[POW_SCRATCH + 2]);
        let av = if f16 {
            vx.vconv(DType::F32, DType::F16, a32, t.ins[0], Round::Rint);
            a32
        } else {
            t.ins[0]
        };
        let exp = if b_int {
            Exponent::Int {
                int: t.ins[1],
                float: bf,
            }
        } else if b_f16 {
            vx.vconv(DType::F32, DType::F16, bf, t.ins[1], Round::Rint);
            Exponent::Float(bf)
        } else {
            Exponent::Float(t.ins[1])
        };
        let o = if f16 { o32 } else { t.outs[0] };
        activation::pow_general(&mut vx, o, av, exp, &s[..POW_SCRATCH], &t.consts, bits);
        if f16 {
            vx.vconv(DType::F16, DType::F32, t.outs[0], o32, Round::Rint);
        }
    };
    let ins = [src(ctx, 0, Fmt::Plain(ea))?, src(ctx, 1, Fmt::Plain(eb))?];
    broadcast_lowering(
        ctx,
        "pow",
        &ins,
        Fmt::Plain(ea),
        &out_dims,
        scratch,
        consts,
        &body,
    )
}

/// The i32 splats 1 and 0 the comparisons select between.
fn bool_consts() -> Vec<Const> {
    vec![Const::i32(1), Const::i32(0)]
}

/// And, Or, Xor (broadcasting) and Not on bool tensors, which the kernels load as i32 0 / 1:
/// And is the minimum, Or the maximum, Xor `|a - b|`, Not `1 - a`.
pub fn logic(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let op = ctx.node.op.clone();
    let out = output(ctx)?;
    let n_in = ctx.inputs.len();
    for i in 0..n_in {
        check_type(ctx, "an input", ctx.input(i)?.dtype, &[DataType::Bool])?;
    }
    let body = move |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let o = t.outs[0];
        match op.as_str() {
            "And" => vx.vbin(ProgramBuilder::vmin, DType::I32, o, t.ins[0], t.ins[1]),
            "Or" => vx.vbin(ProgramBuilder::vmax, DType::I32, o, t.ins[0], t.ins[1]),
            "Xor" => {
                vx.vbin(ProgramBuilder::vsub, DType::I32, o, t.ins[0], t.ins[1]);
                vx.vun(ProgramBuilder::vabs, DType::I32, o, o);
            }
            _ => vx.vbin(ProgramBuilder::vsub, DType::I32, o, t.consts[0], t.ins[0]),
        }
    };
    let bool_fmt = Fmt::Byte(ByteKind::Bool);
    let ins = (0..n_in)
        .map(|i| src(ctx, i, bool_fmt))
        .collect::<Result<Vec<_>, _>>()?;
    broadcast_lowering(
        ctx,
        "",
        &ins,
        bool_fmt,
        &dims(ctx, out)?,
        Vec::new(),
        bool_consts(),
        &body,
    )
}

/// Equal, Less, Greater, LessOrEqual and GreaterOrEqual, with a bool output (any broadcast;
/// every type but float64 and int16; int64 for Equal only).
pub fn compare(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    let cmp = match ctx.node.op.as_str() {
        "Less" => Cmp::Lt,
        "Greater" => Cmp::Gt,
        "LessOrEqual" => Cmp::Le,
        "GreaterOrEqual" => Cmp::Ge,
        _ => Cmp::Eq,
    };
    let out = output(ctx)?;
    if a.dtype != b.dtype {
        return Err(ctx.error(format!(
            "the inputs have types {} and {}",
            a.dtype.name(),
            b.dtype.name()
        )));
    }
    // The unit compares f32, f16 and 32-bit words; int64 only for equality (both words).
    let fmt = match fmt_of(a.dtype) {
        Some(Fmt::I64) if cmp != Cmp::Eq => return on_aicpu(ctx),
        Some(f) => f,
        None => return on_aicpu(ctx),
    };
    let ty = body_type(a.dtype);
    let body = |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let bits = t.scratch[0].reg;
        vx.vcmp(cmp, ty, bits, t.ins[0], t.ins[1]);
        vx.vsel(DType::I32, t.outs[0], t.consts[0], t.consts[1], bits);
    };
    let f: BodyFn<'_> = if fmt == Fmt::I64 { &equal_i64 } else { &body };
    let ins = [src(ctx, 0, fmt)?, src(ctx, 1, fmt)?];
    let suffix = match cmp {
        Cmp::Lt => "lt",
        Cmp::Gt => "gt",
        Cmp::Le => "le",
        Cmp::Ge => "ge",
        _ => "eq",
    };
    broadcast_lowering(
        ctx,
        suffix,
        &ins,
        Fmt::Byte(ByteKind::Bool),
        &dims(ctx, out)?,
        vec![1],
        bool_consts(),
        f,
    )
}

/// Equal on int64 words: `o = lo_a == lo_b ? 1 : 0`, then `o = hi_a == hi_b ? o : 0`.
fn equal_i64(asm: &mut Asm, t: &Body) {
    let mut vx = Vx { a: asm, tmp: t.tmp };
    let (one, zero) = (t.consts[0], t.consts[1]);
    let bits = t.scratch[0].reg;
    let o = t.outs[0];
    vx.vcmp(Cmp::Eq, DType::I32, bits, t.ins[0], t.ins[2]);
    vx.vsel(DType::I32, o, one, zero, bits);
    vx.vcmp(Cmp::Eq, DType::I32, bits, t.ins[1], t.ins[3]);
    vx.vsel(DType::I32, o, o, zero, bits);
}

/// IsNaN (`x != x`) and IsInf (`x == +inf` and / or `x == -inf`, by `detect_positive` and
/// `detect_negative`) with a bool output.
pub fn is_special(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    check_type(ctx, "the input", x.dtype, &FLOATS)?;
    let ty = body_type(x.dtype);
    let e = x.dtype.size() as u64;
    let nan = ctx.node.op == "IsNaN";
    let pos = ctx.node.int("detect_positive").unwrap_or(1) != 0;
    let neg = ctx.node.int("detect_negative").unwrap_or(1) != 0;
    let inf = |negative: bool| -> i64 {
        match (x.dtype, negative) {
            (DataType::F16, false) => i64::from(half::f16::INFINITY.to_bits()),
            (DataType::F16, true) => i64::from(half::f16::NEG_INFINITY.to_bits()),
            (_, false) => i64::from(f32::INFINITY.to_bits()),
            (_, true) => i64::from(f32::NEG_INFINITY.to_bits()),
        }
    };
    let body = move |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let (one, zero) = (t.consts[0], t.consts[1]);
        let bits = t.scratch[0].reg;
        let (o, xv) = (t.outs[0], t.ins[0]);
        if nan {
            vx.vcmp(Cmp::Eq, ty, bits, xv, xv);
            vx.vsel(DType::I32, o, zero, one, bits);
            return;
        }
        vx.vun(ProgramBuilder::vmov, DType::I32, o, zero);
        for (on, negative) in [(pos, false), (neg, true)] {
            if on {
                vx.vcmps(Cmp::Eq, ty, bits, xv, inf(negative));
                vx.vsel(DType::I32, o, one, o, bits);
            }
        }
    };
    broadcast_lowering(
        ctx,
        "",
        &[src(ctx, 0, Fmt::Plain(e))?],
        Fmt::Byte(ByteKind::Bool),
        &dims(ctx, x)?,
        vec![1],
        bool_consts(),
        &body,
    )
}

/// PRelu: `x < 0 ? slope x : x`, the slope broadcast to x.
pub fn prelu(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    check_type(ctx, "the input", x.dtype, &FLOATS)?;
    let ty = body_type(x.dtype);
    let e = x.dtype.size() as u64;
    let zero = if ty == DType::F16 {
        0
    } else {
        i64::from(0f32.to_bits())
    };
    let body = move |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let bits = t.scratch[0].reg;
        let o = t.outs[0];
        vx.vcmps(Cmp::Lt, ty, bits, t.ins[0], zero);
        vx.vbin(ProgramBuilder::vmul, ty, o, t.ins[0], t.ins[1]);
        vx.vsel(ty, o, o, t.ins[0], bits);
    };
    let ins = [src(ctx, 0, Fmt::Plain(e))?, src(ctx, 1, Fmt::Plain(e))?];
    broadcast_lowering(
        ctx,
        "",
        &ins,
        Fmt::Plain(e),
        &dims(ctx, x)?,
        vec![1],
        Vec::new(),
        &body,
    )
}

/// Sum, Mean, Max and Min of any number of inputs with broadcasting, folded in order in the
/// tensor's type (Mean then scaled by 1 / n). int8 / uint8 load as i32 and store the low byte.
/// Max and Min propagate NaN, as ONNX (numpy's maximum) does: the unit's max returns the other
/// operand for NaN, so a NaN input is selected back.
pub fn variadic(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let out = output(ctx)?;
    let n = ctx.inputs.len();
    let op = ctx.node.op.clone();
    let mean = op == "Mean";
    let bytes = byte_kind(out.dtype).filter(|_| op != "Mean");
    if bytes.is_none() {
        let types: &[DataType] = if mean { &FLOATS } else { &NUMERIC };
        if mean {
            check_type(ctx, "the output", out.dtype, types)?;
        } else if !types.contains(&out.dtype) && n > 1 {
            return on_aicpu(ctx);
        }
    }
    if n == 1 {
        return Ok(Lowered::Alias { input: 0 });
    }
    let ty = body_type(out.dtype);
    let float = ty != DType::I32;
    let e = out.dtype.size() as u64;
    let fmt = bytes.map_or(Fmt::Plain(e), Fmt::Byte);
    let scale = 1.0 / n as f32;
    let scale_bits = if ty == DType::F16 {
        i64::from(half::f16::from_f32(scale).to_bits())
    } else {
        i64::from(scale.to_bits())
    };
    let vop: BinOp = match op.as_str() {
        "Max" => ProgramBuilder::vmax,
        "Min" => ProgramBuilder::vmin,
        _ => ProgramBuilder::vadd,
    };
    let extreme = matches!(op.as_str(), "Max" | "Min");
    let body = move |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let o = t.outs[0];
        vx.vbin(vop, ty, o, t.ins[0], t.ins[1]);
        for x in &t.ins[2..] {
            vx.vbin(vop, ty, o, o, *x);
        }
        if extreme && float {
            let bits = t.scratch[0].reg;
            for x in &t.ins {
                vx.vcmp(Cmp::Eq, ty, bits, *x, *x);
                vx.vsel(ty, o, o, *x, bits);
            }
        }
        if mean {
            vx.vscalar(ProgramBuilder::vmuls, ty, o, o, scale_bits);
        }
    };
    let ins = (0..n)
        .map(|i| src(ctx, i, fmt))
        .collect::<Result<Vec<_>, _>>()?;
    let scratch = if extreme && float {
        vec![1]
    } else {
        Vec::new()
    };
    broadcast_lowering(
        ctx,
        "",
        &ins,
        fmt,
        &dims(ctx, out)?,
        scratch,
        Vec::new(),
        &body,
    )
}

/// Trilu: the triangle is a constant i32 mask over the last two dims (computed here, stored
/// with the weights), broadcast over the leading dims; the kernel selects x where the mask is
/// set and zero elsewhere.
pub fn trilu(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let d = dims(ctx, x)?;
    let r = d.len();
    if r < 2 {
        return Err(ctx.error("Trilu needs a tensor of rank 2 or more"));
    }
    let upper = ctx.node.int("upper").unwrap_or(1) != 0;
    let k = match ctx.values.get(1).copied().flatten() {
        Some(t) => t.to_i64s().first().copied().unwrap_or(0),
        None if ctx.inputs.get(1).copied().flatten().is_some() => {
            return Err(ctx.error("k must be a constant"));
        }
        None => 0,
    };
    let (rows, cols) = (d[r - 2], d[r - 1]);
    let mask: Vec<i32> = (0..rows as i64)
        .flat_map(|i| {
            (0..cols as i64).map(move |j| i32::from(crate::ops::trilu_keeps(upper, k, i, j)))
        })
        .collect();
    let fmt = fmt_or_error(ctx, "the input", x.dtype)?;
    let ty = body_type(x.dtype);
    let words = fmt.words();
    let body = |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let (bits, zero) = (t.scratch[0].reg, t.scratch[1]);
        vx.vdup(DType::I32, zero, 0);
        vx.vcmps(Cmp::Ne, DType::I32, bits, t.ins[words], 0);
        for w in 0..words {
            vx.vsel(ty, t.outs[w], t.ins[w], zero, bits);
        }
    };
    let ins = [
        src(ctx, 0, fmt)?,
        Src {
            op: Operand::Derived(0),
            fmt: Fmt::Plain(4),
            shape: vec![rows, cols],
        },
    ];
    let lowered = broadcast_lowering(ctx, "", &ins, fmt, &d, vec![1, 4], Vec::new(), &body)?;
    Ok(match lowered {
        Lowered::Kernels {
            kernels,
            workspace_bytes,
            ..
        } => Lowered::Kernels {
            kernels,
            derived: vec![Tensor::from_i32s(vec![rows as i64, cols as i64], &mask)],
            workspace_bytes,
        },
        alias => alias,
    })
}

/// Where(cond, x, y) with three-way broadcasting.
pub fn where_op(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (c, x, y) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let out = output(ctx)?;
    check_type(ctx, "the condition", c.dtype, &[DataType::Bool])?;
    if x.dtype != y.dtype {
        return Err(ctx.error(format!(
            "the branches have types {} and {}",
            x.dtype.name(),
            y.dtype.name()
        )));
    }
    let fmt = fmt_or_error(ctx, "the branches", x.dtype)?;
    let ty = body_type(x.dtype);
    let words = fmt.words();
    let body = |asm: &mut Asm, t: &Body| {
        let mut vx = Vx { a: asm, tmp: t.tmp };
        let bits = t.scratch[0].reg;
        vx.vcmps(Cmp::Ne, DType::I32, bits, t.ins[0], 0);
        for w in 0..words {
            vx.vsel(ty, t.outs[w], t.ins[1 + w], t.ins[1 + words + w], bits);
        }
    };
    let ins = [
        src(ctx, 0, Fmt::Byte(ByteKind::Bool))?,
        src(ctx, 1, fmt)?,
        src(ctx, 2, fmt)?,
    ];
    broadcast_lowering(
        ctx,
        "where",
        &ins,
        fmt,
        &dims(ctx, out)?,
        vec![1],
        Vec::new(),
        &body,
    )
}

/// What a Cast converts between, as the body sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repr {
    F32,
    F16,
    I32,
    /// One byte, seen as i32.
    Byte(ByteKind),
    /// Two i32 words.
    I64,
}

fn repr(t: DataType) -> Option<Repr> {
    Some(match t {
        DataType::F32 => Repr::F32,
        DataType::F16 => Repr::F16,
        DataType::I32 => Repr::I32,
        DataType::Bool => Repr::Byte(ByteKind::Bool),
        DataType::U8 => Repr::Byte(ByteKind::U8),
        DataType::I8 => Repr::Byte(ByteKind::I8),
        DataType::I64 => Repr::I64,
        _ => return None,
    })
}

/// Cast constants: i32 1, 0, -1.
fn cast_consts() -> Vec<Const> {
    vec![Const::i32(1), Const::i32(0), Const::i32(-1)]
}

/// Cast between float32, float16, int32, int64, bool, uint8 and int8 with ONNX semantics
/// (the other types on the AI CPU):
/// float to integer truncates toward zero, narrowing floats round to nearest even, integers
/// wrap to narrower integers, anything non-zero is true. int64 from floats is exact for
/// |x| < 2^63; int64 to float32 is exact below 2^31 in magnitude and within one f32 ulp
/// above (the high and low words round separately before their sum does).
pub fn cast(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let out = output(ctx)?;
    if x.dtype == out.dtype {
        return Ok(Lowered::Alias { input: 0 });
    }
    let (from, to) = match (repr(x.dtype), repr(out.dtype)) {
        (Some(f), Some(t)) => (f, t),
        // The vector unit converts between f32, f16 and the integers only: GE runs the others
        // (float64, bfloat16, float8, 4- and 2-bit, u16..u64, int16) on the AI CPU.
        _ => {
            let mode = crate::ops::cast_mode(ctx.node).map_err(|e| {
                ctx.error(format!("expected round_mode up, down or nearest, got {e}"))
            })?;
            return Ok(Lowered::AiCpu {
                op: AiCpuOp::Cast {
                    from: x.dtype,
                    to: out.dtype,
                    mode,
                },
            });
        }
    };
    let (fin, fout) = (
        fmt_or_error(ctx, "the input", x.dtype)?,
        fmt_or_error(ctx, "the output", out.dtype)?,
    );
    let body = move |asm: &mut Asm, t: &Body| cast_body(asm, t, from, to);
    let shape = dims(ctx, x)?;
    let ins = [Src {
        op: Operand::Input(0),
        fmt: fin,
        shape: shape.clone(),
    }];
    if let (Fmt::Plain(ei), Fmt::Plain(eo)) = (fin, fout) {
        let n = shape.iter().product();
        let consts_free = !matches!(to, Repr::Byte(_) | Repr::I64);
        if consts_free {
            return stream_lowering(
                ctx,
                kernel_name(ctx, ""),
                n,
                &[(Operand::Input(0), ei)],
                eo,
                Vec::new(),
                &body,
            );
        }
    }
    let scratch = vec![4, 4, 4, 1];
    broadcast_lowering(ctx, "", &ins, fout, &shape, scratch, cast_consts(), &body)
}

/// Cast's conversions. Scratch: three 4-byte tiles and a bit mask; constants [`cast_consts`].
fn cast_body(asm: &mut Asm, t: &Body, from: Repr, to: Repr) {
    let mut vx = Vx { a: asm, tmp: t.tmp };
    // Conversions between f32, f16 and i32 need no scratch (the stream kernel gives none).
    let sc = |i: usize| t.scratch[i];
    let x = t.ins[0];
    let o = t.outs[0];
    // The input as f32 or i32 (f16 is widened first where the code below needs f32).
    let float = matches!(from, Repr::F32 | Repr::F16);
    let xf = match from {
        Repr::F16 if matches!(to, Repr::Byte(ByteKind::Bool) | Repr::I64) => {
            vx.vconv(DType::F32, DType::F16, sc(2), x, Round::Rint);
            sc(2)
        }
        _ => x,
    };
    match to {
        Repr::F32 => match from {
            Repr::F16 => vx.vconv(DType::F32, DType::F16, o, x, Round::Rint),
            Repr::I32 | Repr::Byte(_) => vx.vconv(DType::F32, DType::I32, o, x, Round::Rint),
            Repr::I64 => i64_to_f32(&mut vx, t, o, sc(3).reg),
            Repr::F32 => vx.vun(ProgramBuilder::vmov, DType::F32, o, x),
        },
        Repr::F16 => match from {
            Repr::F32 => vx.vconv(DType::F16, DType::F32, o, x, Round::Rint),
            Repr::I32 | Repr::Byte(_) => vx.vconv(DType::F16, DType::I32, o, x, Round::Rint),
            Repr::I64 => {
                // Through f32: exact below 2^24, and above that f16 overflows either way.
                i64_to_f32(&mut vx, t, sc(2), sc(3).reg);
                vx.vconv(DType::F16, DType::F32, o, sc(2), Round::Rint);
            }
            Repr::F16 => vx.vun(ProgramBuilder::vmov, DType::F16, o, x),
        },
        Repr::I32 | Repr::Byte(ByteKind::U8) | Repr::Byte(ByteKind::I8) => match from {
            Repr::F32 => vx.vconv(DType::I32, DType::F32, o, x, Round::Trunc),
            Repr::F16 => vx.vconv(DType::I32, DType::F16, o, x, Round::Trunc),
            Repr::I32 | Repr::Byte(_) | Repr::I64 => vx.vun(ProgramBuilder::vmov, DType::I32, o, x),
        },
        Repr::Byte(ByteKind::Bool) => {
            let (one, zero) = (t.consts[0], t.consts[1]);
            let (s1, bits) = (sc(0), sc(3).reg);
            match from {
                Repr::I64 => {
                    vx.vbin(ProgramBuilder::vor, DType::I32, s1, t.ins[0], t.ins[1]);
                    vx.vcmps(Cmp::Ne, DType::I32, bits, s1, 0);
                }
                _ if float => vx.vcmps_f32(Cmp::Ne, bits, xf, 0.0),
                _ => vx.vcmps(Cmp::Ne, DType::I32, bits, x, 0),
            }
            vx.vsel(DType::I32, o, one, zero, bits);
        }
        Repr::I64 => {
            let (zero, m1) = (t.consts[1], t.consts[2]);
            let (lo, hi) = (t.outs[0], t.outs[1]);
            let (s1, s2, s3, bits) = (sc(0), sc(1), sc(2), sc(3).reg);
            if float {
                // Below 2^31: truncate to i32 and sign-extend.
                vx.vconv(DType::I32, DType::F32, lo, xf, Round::Trunc);
                vx.vcmps(Cmp::Lt, DType::I32, bits, lo, 0);
                vx.vsel(DType::I32, hi, m1, zero, bits);
                // From 2^31 on x is a multiple of 2^8: hi = floor(x / 2^32) and
                // lo = x - hi 2^32 in [0, 2^32) are exact in f32; lo goes to i32 shifted
                // by -2^31 and back.
                vx.muls(s1, xf, 2.0f32.powi(-32));
                vx.vconv(DType::I32, DType::F32, s2, s1, Round::Floor);
                vx.vconv(DType::F32, DType::I32, s1, s2, Round::Rint);
                vx.muls(s1, s1, 2.0f32.powi(32));
                vx.vbin(ProgramBuilder::vsub, DType::F32, s1, xf, s1);
                vx.adds(s1, s1, -(2.0f32.powi(31)));
                vx.vconv(DType::I32, DType::F32, s1, s1, Round::Trunc);
                vx.vscalar(
                    ProgramBuilder::vadds,
                    DType::I32,
                    s1,
                    s1,
                    i64::from(i32::MIN),
                );
                vx.vun(ProgramBuilder::vabs, DType::F32, s3, xf);
                vx.vcmps_f32(Cmp::Lt, bits, s3, 2.0f32.powi(31));
                vx.vsel(DType::I32, lo, lo, s1, bits);
                vx.vsel(DType::I32, hi, hi, s2, bits);
            } else {
                vx.vun(ProgramBuilder::vmov, DType::I32, lo, x);
                vx.vcmps(Cmp::Lt, DType::I32, bits, x, 0);
                vx.vsel(DType::I32, hi, m1, zero, bits);
            }
        }
    }
}

/// int64 (words `t.ins[0]`, `t.ins[1]`) to f32: `v = (hi + (lo < 0)) 2^32 + lo` with `lo`
/// signed, so below 2^31 in magnitude the high part is 0 and the result one rounding of `lo`.
fn i64_to_f32(vx: &mut Vx<'_>, t: &Body, o: View, bits: Reg) {
    let (one, zero) = (t.consts[0], t.consts[1]);
    let (s1, s2) = (t.scratch[0], t.scratch[1]);
    let (lo, hi) = (t.ins[0], t.ins[1]);
    vx.vcmps(Cmp::Lt, DType::I32, bits, lo, 0);
    vx.vsel(DType::I32, s1, one, zero, bits);
    // hi + 1 in f32: in i32 it would overflow for i64::MAX.
    vx.vconv(DType::F32, DType::I32, s1, s1, Round::Rint);
    vx.vconv(DType::F32, DType::I32, s2, hi, Round::Rint);
    vx.vbin(ProgramBuilder::vadd, DType::F32, s2, s2, s1);
    vx.muls(s2, s2, 2.0f32.powi(32));
    vx.vconv(DType::F32, DType::I32, s1, lo, Round::Rint);
    vx.vbin(ProgramBuilder::vadd, DType::F32, o, s1, s2);
}

/// `lowered` followed by its node's epilogue as a kernel of its own, in place on output 0:
/// for the lowerings that cannot compute it in their own drain (the fused node still saves
/// its activation's output buffer).
pub fn with_epilogue_kernel(
    ctx: &LowerCtx<'_>,
    lowered: Lowered,
    epilogue: Epilogue,
) -> Result<Lowered, LowerError> {
    if epilogue == Epilogue::None {
        return Ok(lowered);
    }
    let Lowered::Kernels {
        mut kernels,
        derived,
        workspace_bytes,
    } = lowered
    else {
        return Err(ctx.error("an epilogue needs the node's kernels to write its output"));
    };
    let out = output(ctx)?;
    check_type(ctx, "the output", out.dtype, &NUMERIC)?;
    let ty = body_type(out.dtype);
    let e = out.dtype.size() as u64;
    let n = dims(ctx, out)?.iter().product();
    let body = |a: &mut Asm, t: &Body| {
        Vx { a, tmp: t.tmp }.vun(ProgramBuilder::vrelu, ty, t.outs[0], t.ins[0]);
    };
    let name = kernel_name(ctx, epilogue.suffix());
    let ins = [(Operand::Output(0), e)];
    if let Lowered::Kernels { kernels: more, .. } =
        stream_lowering(ctx, name, n, &ins, e, Vec::new(), &body)?
    {
        kernels.extend(more);
    }
    Ok(Lowered::Kernels {
        kernels,
        derived,
        workspace_bytes,
    })
}
