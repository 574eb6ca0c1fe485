//! Element-wise ops on the vector unit through the streaming pipeline: unary activations and
//! binary arithmetic on equal shapes or with a one-element operand (kept in a scalar register).

use super::stream::{Io, Stream, Tile};
use super::writer::{Asm, Reg};
use super::{LowerCtx, LowerError, Lowered, Operand, kernel_name};
use crate::compiler::ir::{DataType, TensorDesc, element_count};

/// The vector type suffix of a tensor type, when the vector unit computes in it.
pub fn vector_type(t: DataType) -> Option<&'static str> {
    match t {
        DataType::F32 => Some("f32"),
        DataType::F16 => Some("f16"),
        DataType::I32 => Some("i32"),
        _ => None,
    }
}

fn elems(ctx: &LowerCtx<'_>, d: &TensorDesc) -> Result<u64, LowerError> {
    element_count(&d.shape)
        .map(|n| n.max(0) as u64)
        .ok_or_else(|| ctx.error(format!("shape {d} is not static")))
}

fn vty(
    ctx: &LowerCtx<'_>,
    d: &TensorDesc,
    allowed: &[DataType],
) -> Result<&'static str, LowerError> {
    if !allowed.contains(&d.dtype) {
        let names: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
        return Err(ctx.error(format!(
            "the vector kernel computes in {}; got {}",
            names.join(", "),
            d.dtype.name()
        )));
    }
    vector_type(d.dtype).ok_or_else(|| ctx.error(format!("no vector type for {}", d.dtype.name())))
}

/// Builds and plans a streaming kernel.
fn stream_kernel(
    ctx: &LowerCtx<'_>,
    name: String,
    s: &Stream<'_>,
    args: Vec<Operand>,
) -> Result<Lowered, LowerError> {
    if s.n == 0 {
        return Ok(Lowered::Kernels {
            kernels: Vec::new(),
            derived: Vec::new(),
            workspace_bytes: 0,
        });
    }
    let plan = s.plan(&ctx.target.core).ok_or_else(|| {
        ctx.error(format!(
            "one tile of the streamed tensors does not fit in the {}-byte unified buffer",
            ctx.target.core.ub_bytes
        ))
    })?;
    let mut a = Asm::new(&name);
    s.emit(&mut a, plan);
    Ok(Lowered::Kernels {
        kernels: vec![ctx.kernel(a, plan.block_dim, args)?],
        derived: Vec::new(),
        workspace_bytes: 0,
    })
}

fn no_setup(_: &mut Asm, _: Reg) -> Vec<Reg> {
    Vec::new()
}

/// Relu and Sqrt.
pub fn unary(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let (mnemonic, types): (&str, &[DataType]) = match ctx.node.op.as_str() {
        "Relu" => ("vrelu", &[DataType::F32, DataType::F16, DataType::I32]),
        "Sqrt" => ("vsqrt", &[DataType::F32, DataType::F16]),
        op => return Err(ctx.error(format!("{op} is not a unary vector op"))),
    };
    let ty = vty(ctx, x, types)?;
    let elem = x.dtype.size() as u64;
    let body = |a: &mut Asm, t: &Tile| {
        a.ins(format_args!("{mnemonic}.{ty} {}, {}", t.outs[0], t.ins[0]));
    };
    let s = Stream {
        n: elems(ctx, x)?,
        inputs: vec![Io { arg: 0, elem }],
        outputs: vec![Io { arg: 1, elem }],
        scratch: Vec::new(),
        setup: &no_setup,
        body: &body,
    };
    stream_kernel(
        ctx,
        kernel_name(ctx, ""),
        &s,
        vec![Operand::Input(0), Operand::Output(0)],
    )
}

/// Add, Sub, Mul, Div on equal shapes, or with one operand of a single element.
pub fn binary(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (a_desc, b_desc) = (ctx.input(0)?, ctx.input(1)?);
    let out = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    let op = ctx.node.op.as_str();
    let types: &[DataType] = match op {
        "Div" => &[DataType::F32, DataType::F16],
        _ => &[DataType::F32, DataType::F16, DataType::I32],
    };
    let ty = vty(ctx, out, types)?;
    let elem = out.dtype.size() as u64;
    let n = elems(ctx, out)?;
    let (na, nb) = (elems(ctx, a_desc)?, elems(ctx, b_desc)?);
    let mnemonic = match op {
        "Add" => "vadd",
        "Sub" => "vsub",
        "Mul" => "vmul",
        "Div" => "vdiv",
        _ => return Err(ctx.error(format!("{op} is not a binary vector op"))),
    };
    if na == n && nb == n && a_desc.shape == b_desc.shape {
        let body = |a: &mut Asm, t: &Tile| {
            a.ins(format_args!(
                "{mnemonic}.{ty} {}, {}, {}",
                t.outs[0], t.ins[0], t.ins[1]
            ));
        };
        let s = Stream {
            n,
            inputs: vec![Io { arg: 0, elem }, Io { arg: 1, elem }],
            outputs: vec![Io { arg: 2, elem }],
            scratch: Vec::new(),
            setup: &no_setup,
            body: &body,
        };
        let args = vec![Operand::Input(0), Operand::Input(1), Operand::Output(0)];
        return stream_kernel(ctx, kernel_name(ctx, ""), &s, args);
    }
    // One operand is a single element: it lives in a scalar register.
    let scalar_first = match (na, nb) {
        (_, 1) if na == n => false,
        (1, _) if nb == n => true,
        _ => {
            return Err(ctx.error(
                "broadcasting other than equal shapes or a one-element operand has no kernel yet",
            ));
        }
    };
    let load = match elem {
        2 => "ld.gm.u16",
        _ => "ld.gm.u32",
    };
    let negate = |a: &mut Asm, r: Reg| {
        if ty == "i32" {
            let z = a.constant(0);
            a.ins(format_args!("sub       {r}, {z}, {r}"));
        } else {
            let sign = a.constant(if elem == 2 { 0x8000 } else { 0x8000_0000 });
            a.ins(format_args!("xor       {r}, {r}, {sign}"));
        }
    };
    let minus_one = match ty {
        "f32" => "f32(-1.0)",
        "f16" => "f16(-1.0)",
        _ => "-1",
    };
    // The tensor operand is argument 0 and the scalar argument 1, whichever side it is on.
    let setup = |a: &mut Asm, args: Reg| -> Vec<Reg> {
        let p = a.arg(args, 1);
        let s = a.reg();
        a.ins(format_args!("{load} {s}, {p}"));
        if op == "Sub" && !scalar_first {
            negate(a, s);
        }
        let mut regs = vec![s];
        if op == "Sub" && scalar_first {
            regs.push(a.constant_expr(minus_one));
        }
        regs
    };
    let body = |a: &mut Asm, t: &Tile| {
        let (o, x, s) = (t.outs[0], t.ins[0], t.consts[0]);
        match (op, scalar_first) {
            ("Add", _) => a.ins(format_args!("vadds.{ty} {o}, {x}, {s}")),
            ("Mul", _) => a.ins(format_args!("vmuls.{ty} {o}, {x}, {s}")),
            ("Sub", false) => a.ins(format_args!("vadds.{ty} {o}, {x}, {s}")),
            ("Sub", true) => {
                a.ins(format_args!("vmuls.{ty} {o}, {x}, {}", t.consts[1]));
                a.ins(format_args!("vadds.{ty} {o}, {o}, {s}"));
            }
            (_, false) => {
                a.ins(format_args!("vdup.{ty} {}, {s}", t.scratch[0]));
                a.ins(format_args!("{mnemonic}.{ty} {o}, {x}, {}", t.scratch[0]));
            }
            (_, true) => {
                a.ins(format_args!("vdup.{ty} {}, {s}", t.scratch[0]));
                a.ins(format_args!("{mnemonic}.{ty} {o}, {}, {x}", t.scratch[0]));
            }
        }
    };
    let needs_scratch = op == "Div";
    let s = Stream {
        n,
        inputs: vec![Io { arg: 0, elem }],
        outputs: vec![Io { arg: 2, elem }],
        scratch: if needs_scratch {
            vec![elem]
        } else {
            Vec::new()
        },
        setup: &setup,
        body: &body,
    };
    let (tensor, scalar) = if scalar_first { (1, 0) } else { (0, 1) };
    let args = vec![
        Operand::Input(tensor),
        Operand::Input(scalar),
        Operand::Output(0),
    ];
    stream_kernel(ctx, kernel_name(ctx, "scalar"), &s, args)
}
