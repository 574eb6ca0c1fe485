//! The cube: MatMul, Gemm and Conv as f16 products with f32 accumulation (L1 → L0A/L0B →
//! mmad → L0C → UB → GM), and depthwise convolution on the vector unit.
//!
//! ```text
//!   MatMul / Gemm ─▶ cube_gemm::Gemm (batched, broadcast, transposed operands, epilogue)
//!   Conv          ─▶ cube_conv (NCHW → fractal feature map, windows through L0B, NCHW out)
//!   Conv, 5HD side ─▶ cube_conv5hd (NC1HWC0 in/out, img2col windows through L0A)
//!   Conv, depthwise ─▶ cube_depthwise (vector multiply-accumulate over the window)
//! ```
//!
//! Types: f16 tensors run natively (f16 in, f32 accumulation, f16 out). f32 tensors (the ONNX
//! models) are multiplied as f16: constant operands are converted and laid out in fractal order
//! at compile time (`derived` tensors), runtime operands are converted on the device into the
//! node's workspace by a streaming cast kernel; the product and every addend stay f32.

#[path = "cube_conv.rs"]
pub mod conv;
#[path = "cube_conv5hd.rs"]
pub mod conv5hd;
#[path = "cube_depthwise.rs"]
pub mod depthwise;
#[path = "cube_gemm.rs"]
pub mod gemm;
#[path = "cube_splitk.rs"]
pub mod splitk;

use gearsim_isa::units::{BLOCK_BYTES, FRACTAL_BYTES_F32};
use gearsim_isa::{DType, Pipe, SReg, SType, Space};
use gemm::{Addend, BatchDim, Gemm, InType, OutType, Src};

use super::queue::{self, VECOUT};
use super::stream::{Io, Stream, Tile};
use super::writer::{Asm, Reg};
use super::{Kernel, LowerCtx, LowerError, LowerFn, Lowered, Operand, kernel_name};
use crate::fusion::{BIAS_INPUT, DEQUANT_INPUT, FUSED_DEQUANT, RESIDUAL_INPUT};
use crate::ir::{DataType, Tensor, TensorDesc, shape_values};

/// The lowering of an op type of this module.
pub fn lowering(op: &str) -> Option<LowerFn> {
    let f: LowerFn = match op {
        "MatMul" => matmul,
        "MatMulInteger" => matmul_integer,
        "Gemm" => gemm,
        "Conv" => conv::lower,
        _ => return None,
    };
    Some(f)
}

/// Kernels, derived constants and workspace being collected for one node.
#[derive(Default)]
pub(crate) struct Build {
    pub kernels: Vec<Kernel>,
    pub derived: Vec<Tensor>,
    pub workspace: u64,
    /// Whether an inlined kernel reads values of this node's own constants or scratch (its
    /// kernels then run with values in a timing-only run).
    pub reads_values: bool,
}

impl Build {
    /// A derived constant; returns its operand.
    pub fn derive(&mut self, dtype: DataType, bytes: Vec<u8>) -> Operand {
        let count = (bytes.len() / dtype.size()) as i64;
        self.derived.push(Tensor {
            dtype,
            dims: vec![count],
            data: std::sync::Arc::new(bytes),
        });
        Operand::Derived(self.derived.len() - 1)
    }

    /// `bytes` of workspace, 512-byte aligned; returns its operand.
    pub fn scratch(&mut self, bytes: u64) -> Operand {
        Operand::Workspace(self.scratch_at(bytes))
    }

    /// `bytes` of workspace, 512-byte aligned; returns its offset in the node's workspace.
    pub(crate) fn scratch_at(&mut self, bytes: u64) -> u64 {
        let at = self.workspace.div_ceil(512) * 512;
        self.workspace = at + bytes.max(1);
        at
    }

    /// Appends the kernels of a sub-op's lowering (a TransData, a strided Slice this node
    /// runs first): its inputs are re-pointed by `input`, its output to `output`, its
    /// constants and workspace appended to this node's. An alias has no kernel to append.
    pub fn inline(
        &mut self,
        lowered: Lowered,
        input: &dyn Fn(usize) -> Operand,
        output: Operand,
        rename: impl Fn(String) -> String,
    ) -> Result<(), String> {
        let Lowered::Kernels {
            kernels,
            derived,
            workspace_bytes,
        } = lowered
        else {
            return Err("internal error: the sub-op is an alias, not a kernel".into());
        };
        let d0 = self.derived.len();
        self.derived.extend(derived);
        let ws = match workspace_bytes {
            0 => 0,
            bytes => self.scratch_at(bytes),
        };
        for mut k in kernels {
            k.name = rename(k.name);
            // A value the scalar unit reads stays one of this node's inputs, or is this
            // node's constant or scratch: then the kernel itself must run with values.
            let mut value_inputs = Vec::new();
            for i in std::mem::take(&mut k.value_inputs) {
                match input(i) {
                    Operand::Input(j) => value_inputs.push(j),
                    _ => self.reads_values = true,
                }
            }
            k.value_inputs = value_inputs;
            for op in &mut k.args {
                *op = match *op {
                    Operand::Input(i) => input(i),
                    Operand::InputFrom(i, at) => input(i).plus(at).ok_or_else(|| {
                        format!("internal error: {} reads a part of a constant", k.name)
                    })?,
                    Operand::Output(_) => output,
                    Operand::OutputFrom(_, at) => output.plus(at).ok_or_else(|| {
                        format!("internal error: {} writes a part of a constant", k.name)
                    })?,
                    Operand::Derived(i) => Operand::Derived(d0 + i),
                    Operand::Workspace(at) => Operand::Workspace(ws + at),
                };
            }
            self.kernels.push(k);
        }
        Ok(())
    }

    pub fn finish(mut self) -> Lowered {
        if self.reads_values {
            for k in &mut self.kernels {
                k.needs_values = true;
            }
        }
        Lowered::Kernels {
            kernels: self.kernels,
            derived: self.derived,
            workspace_bytes: self.workspace,
        }
    }
}

/// The static dims of a descriptor.
pub(crate) fn dims_of(ctx: &LowerCtx<'_>, d: &TensorDesc) -> Result<Vec<u64>, LowerError> {
    shape_values(&d.shape)
        .map(|v| v.iter().map(|x| (*x).max(0) as u64).collect())
        .ok_or_else(|| ctx.error(format!("shape {d} is not static")))
}

/// The cube's element type for a tensor type (f16 and f32 only).
pub(crate) fn cube_type(ctx: &LowerCtx<'_>, d: &TensorDesc) -> Result<OutType, LowerError> {
    match d.dtype {
        DataType::F16 => Ok(OutType::F16),
        DataType::F32 => Ok(OutType::F32),
        t => Err(ctx.error(format!(
            "the cube multiplies f16 (f32 tensors are converted to f16); got {}",
            t.name()
        ))),
    }
}

/// The values of a constant input as f32.
pub(crate) fn const_values(ctx: &LowerCtx<'_>, i: usize) -> Option<Vec<f32>> {
    ctx.values
        .get(i)
        .copied()
        .flatten()
        .map(|t| t.to_f64s().iter().map(|v| *v as f32).collect())
}

/// A streaming conversion kernel `dst[i] = (to) src[i]` over `n` elements (argument 0 the
/// source, 1 the destination).
pub(crate) fn cast_kernel(
    ctx: &LowerCtx<'_>,
    name: &str,
    n: u64,
    from: OutType,
    to: OutType,
    src: Operand,
    dst: Operand,
) -> Result<Kernel, LowerError> {
    let body = |a: &mut Asm, t: &Tile| {
        a.vconv(to.dtype(), from.dtype(), t.outs[0], t.ins[0]);
    };
    let no_setup = |_: &mut Asm, _: Reg| Vec::new();
    let s = Stream {
        n,
        inputs: vec![Io::new(0, from.bytes())],
        outputs: vec![Io::new(1, to.bytes())],
        scratch: Vec::new(),
        row: 0,
        resident: Vec::new(),
        setup: &no_setup,
        body: &body,
    };
    let plan = s.plan(&ctx.target.core).ok_or_else(|| {
        ctx.error(format!(
            "one tile of the conversion does not fit in the {}-byte unified buffer",
            ctx.target.core.ub_bytes
        ))
    })?;
    let mut a = Asm::new(name);
    s.emit(&mut a, plan);
    ctx.kernel(a, plan.block_dim, vec![src, dst])
}

/// Greatest common divisor.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Least common multiple (of positive numbers).
fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b).max(1) * b
}

/// Input `i` as f16 in GM: itself when it is f16, else converted into the workspace.
pub(crate) fn runtime_f16(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    i: usize,
    elems: u64,
    what: &str,
) -> Result<Operand, LowerError> {
    let d = ctx.input(i)?;
    match cube_type(ctx, d)? {
        OutType::F16 => Ok(Operand::Input(i)),
        OutType::F32 => {
            let ws = b.scratch(elems * 2);
            let name = kernel_name(ctx, &format!("cast_{what}_f16"));
            b.kernels.push(cast_kernel(
                ctx,
                &name,
                elems,
                OutType::F32,
                OutType::F16,
                Operand::Input(i),
                ws,
            )?);
            Ok(ws)
        }
        OutType::I32 | OutType::Bf16 => Err(ctx.error(format!(
            "a {} tensor is not converted to an f16 cube operand",
            d.dtype.name()
        ))),
    }
}

/// How an addend vector is expanded into the fractals the epilogue adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expand {
    /// `len` values, one per column: fractals with 16 equal rows.
    Cols,
    /// `len` values, one per row: fractals with 16 equal columns.
    Rows,
    /// One value filling `len` columns.
    Fill,
}

/// A kernel (one block) that expands a runtime addend vector (argument 0, f16 or f32) into
/// f32 fractals (argument 1), scaled by `scale`: `[ceil(len/16)][16][16]`.
///
/// Rows and Fill read the values with scalar loads from the input itself (the only bytes a
/// timing-only run knows), replicate each with `vdup`; Cols loads the vector once and writes
/// each fractal row with a strided DMA.
pub(crate) fn expand_kernel(
    ctx: &LowerCtx<'_>,
    name: &str,
    mode: Expand,
    len: u64,
    ty: OutType,
    scale: f32,
    operands: [Operand; 2],
) -> Result<Kernel, LowerError> {
    let mut a = Asm::new(name);
    a.tiling("len", len as i64);
    let args = a.reg();
    a.sreg(args, SReg::Args);
    let src = a.arg(args, 0);
    let dst = a.arg(args, 1);
    let (t0, t1, t2, v, count) = (a.reg(), a.reg(), a.reg(), a.reg(), a.reg());
    let scale_reg = a.constant(i64::from(scale.to_bits()));
    let es = ty.bytes();
    // UB: f32 fractals at 0, an f16 staging copy after them.
    let chunk: u64 = 1024;
    let f32_buf = 0u64;
    let f16_buf = chunk * 64;
    if (f16_buf + chunk * 32) > ctx.target.core.ub_bytes {
        return Err(ctx.error("the addend expansion needs 96 KiB of unified buffer"));
    }
    // One staging buffer, handed from V to the stores and back each chunk.
    VECOUT.free(&mut a, 0);
    let fracs = len.div_ceil(16);
    let mut at = 0;
    while at < fracs {
        let nf = (fracs - at).min(chunk / 16);
        let first = at * 16;
        let elems = (len - first).min(nf * 16);
        VECOUT.alloc(&mut a, 0);
        match mode {
            Expand::Cols => {
                a.mask_count(t2, nf * 16);
                a.movi(t0, f32_buf as i64);
                a.movi(t1, 0);
                a.vdup(DType::F32, t0, t1);
                queue::barrier(&mut a, Pipe::V, Pipe::Mte2, 0);
                a.movi(
                    t0,
                    if ty == OutType::F16 { f16_buf } else { f32_buf } as i64,
                );
                a.addi(t1, src, first * es);
                a.copy_gm_to_ub_pad(t0, t1, 1, elems * es);
                queue::barrier(&mut a, Pipe::Mte2, Pipe::V, 0);
                if ty == OutType::F16 {
                    a.mask_count(t2, elems);
                    a.movi(t0, f32_buf as i64);
                    a.movi(t1, f16_buf as i64);
                    a.vconv(DType::F32, DType::F16, t0, t1);
                }
                a.mask_count(t2, nf * 16);
                a.movi(t0, f32_buf as i64);
                a.vmuls(DType::F32, t0, t0, scale_reg);
                VECOUT.enque(&mut a, 0);
                VECOUT.deque(&mut a, 0);
                for r in 0..16 {
                    a.addi(t1, dst, at * FRACTAL_BYTES_F32 + r * 64);
                    a.copy_ub_to_gm(t1, t0, nf, 2).src_gap(0).dst_gap(30);
                }
            }
            Expand::Rows | Expand::Fill => {
                let (dup_ty, buf, row) = if ty == OutType::F16 {
                    (DType::F16, f16_buf, 32)
                } else {
                    (DType::F32, f32_buf, 64)
                };
                a.mask_count(t2, nf * 256);
                a.movi(t0, buf as i64);
                a.movi(t1, 0);
                a.vdup(dup_ty, t0, t1);
                let load = if ty == OutType::F16 {
                    SType::U16
                } else {
                    SType::U32
                };
                if mode == Expand::Rows {
                    a.mask_count(t2, 16);
                    a.addi(t1, src, first * es);
                    a.movi(count, elems as i64);
                    let top = a.new_label("row");
                    a.place(&top);
                    a.ld(Space::Gm, load, v, t1);
                    a.vdup(dup_ty, t0, v);
                    a.add_imm(t1, es as i64);
                    a.add_imm(t0, row);
                    let top = a.label(&top);
                    a.r#loop(count, top);
                } else {
                    a.ld(Space::Gm, load, v, src);
                    a.mask_count(t2, elems.div_ceil(16) * 256);
                    a.vdup(dup_ty, t0, v);
                }
                if ty == OutType::F16 {
                    a.mask_count(t2, nf * 256);
                    a.movi(t0, f32_buf as i64);
                    a.movi(t1, f16_buf as i64);
                    a.vconv(DType::F32, DType::F16, t0, t1);
                }
                a.mask_count(t2, nf * 256);
                a.movi(t0, f32_buf as i64);
                a.vmuls(DType::F32, t0, t0, scale_reg);
                VECOUT.enque(&mut a, 0);
                VECOUT.deque(&mut a, 0);
                a.addi(t1, dst, at * FRACTAL_BYTES_F32);
                a.copy_ub_to_gm(t1, t0, 1, nf * FRACTAL_BYTES_F32 / BLOCK_BYTES);
            }
        }
        VECOUT.free(&mut a, 0);
        at += nf;
    }
    VECOUT.alloc(&mut a, 0);
    let value_inputs = match (mode, &operands[0]) {
        (Expand::Rows | Expand::Fill, Operand::Input(i)) => vec![*i],
        _ => Vec::new(),
    };
    Ok(Kernel {
        value_inputs,
        ..ctx.kernel(a, 1, operands.to_vec())?
    })
}

/// A matrix operand of a product: a constant (packed at compile time) or a runtime f16
/// matrix in GM.
enum Operand2 {
    Constant(Vec<f32>),
    Runtime(Operand),
}

/// MatMul with numpy semantics: 1-D operands, batch dims with broadcasting.
fn matmul(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (ad, bd) = (ctx.input(0)?, ctx.input(1)?);
    let out = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    // bf16 operands multiply as they are (a separated chip's cube and FIXPIPE take bf16).
    let bf16 = [ad.dtype, bd.dtype, out.dtype].contains(&DataType::BF16);
    let (in_type, out_type) = if bf16 {
        if [ad.dtype, bd.dtype, out.dtype] != [DataType::BF16; 3] {
            return Err(ctx.error("a bf16 product takes bf16 operands and gives bf16"));
        }
        (InType::Bf16, OutType::Bf16)
    } else {
        cube_type(ctx, ad)?;
        cube_type(ctx, bd)?;
        (InType::F16, cube_type(ctx, out)?)
    };
    let (mut a_dims, mut b_dims) = (dims_of(ctx, ad)?, dims_of(ctx, bd)?);
    if a_dims.len() == 1 {
        a_dims.insert(0, 1);
    }
    if b_dims.len() == 1 {
        b_dims.push(1);
    }
    let (ra, rb) = (a_dims.len(), b_dims.len());
    let (m, k, n) = (a_dims[ra - 2], a_dims[ra - 1], b_dims[rb - 1]);
    let rank = (ra - 2).max(rb - 2);
    let pad = |d: &[u64]| -> Vec<u64> {
        let mut v = vec![1; rank - (d.len() - 2)];
        v.extend_from_slice(&d[..d.len() - 2]);
        v
    };
    let (a_batch, b_batch) = (pad(&a_dims), pad(&b_dims));
    let out_batch: Vec<u64> = a_batch
        .iter()
        .zip(&b_batch)
        .map(|(x, y)| *x.max(y))
        .collect();
    let mut b = Build::default();
    if m == 0 || n == 0 || out_batch.contains(&0) {
        return Ok(b.finish());
    }
    if k == 0 {
        return Err(ctx.error("a product with an empty inner dimension (K = 0) has no kernel"));
    }
    // A batched A against a shared B is one taller product.
    let fold = b_batch.iter().all(|x| *x == 1) && a_batch == out_batch;
    let g_a: u64 = a_batch.iter().product();
    let g_b: u64 = b_batch.iter().product();
    let (m_eff, batch_dims) = if fold {
        (m * g_a, Vec::new())
    } else {
        (m, out_batch.clone())
    };
    let runtime = |b: &mut Build, i: usize, elems: u64, what: &str| {
        if bf16 {
            Ok(Operand::Input(i))
        } else {
            runtime_f16(ctx, b, i, elems, what)
        }
    };
    let a_src = match const_values(ctx, 0) {
        Some(v) => Operand2::Constant(v),
        None => Operand2::Runtime(runtime(&mut b, 0, g_a * m * k, "a")?),
    };
    let b_src = match const_values(ctx, 1) {
        Some(v) => Operand2::Constant(v),
        None => Operand2::Runtime(runtime(&mut b, 1, g_b * k * n, "b")?),
    };
    let a_item = match a_src {
        Operand2::Constant(_) => gemm::packed_bytes(m, k),
        Operand2::Runtime(_) => m * k * 2,
    };
    let b_item = match b_src {
        Operand2::Constant(_) => gemm::packed_bytes(n, k),
        Operand2::Runtime(_) => k * n * 2,
    };
    let es = out_type.bytes();
    let strides = |sizes: &[u64], item: u64| -> Vec<u64> {
        let mut s = vec![0; sizes.len()];
        let mut acc = item;
        for d in (0..sizes.len()).rev() {
            s[d] = if sizes[d] > 1 { acc } else { 0 };
            acc *= sizes[d];
        }
        s
    };
    let (sa, sb, sc) = (
        strides(&a_batch, a_item),
        strides(&b_batch, b_item),
        strides(&out_batch, m * n * es),
    );
    let batch: Vec<BatchDim> = batch_dims
        .iter()
        .enumerate()
        .filter(|(_, s)| **s > 1)
        .map(|(d, s)| BatchDim {
            size: *s,
            a: sa[d],
            b: sb[d],
            c: sc[d],
        })
        .collect();
    let mut args = vec![Operand::Input(0), Operand::Input(1), Operand::Output(0)];
    let a_kind = match &a_src {
        Operand2::Constant(_) => Src::Packed { arg: 0 },
        Operand2::Runtime(op) => {
            args[0] = *op;
            Src::Rows {
                arg: 0,
                trans: false,
                ld: k,
            }
        }
    };
    let b_kind = match &b_src {
        Operand2::Constant(_) => Src::Packed { arg: 1 },
        Operand2::Runtime(op) => {
            args[1] = *op;
            Src::Rows {
                arg: 1,
                trans: false,
                ld: n,
            }
        }
    };
    // A fused bias (a constant over the last axis) is added in the accumulator.
    let addend = match ctx.inputs.get(BIAS_INPUT).copied().flatten() {
        Some(cd) if ctx.node.int(crate::fusion::FUSED_BIAS).is_some() => {
            Some(gemm_addend(ctx, &mut b, &mut args, cd, m_eff, n, 1.0)?)
        }
        _ => None,
    };
    let g = Gemm {
        in_type,
        factor: None,
        name: kernel_name(ctx, super::Epilogue::of(ctx)?.suffix()),
        batch,
        m: m_eff,
        n,
        k,
        a: a_kind,
        b: b_kind,
        out: 2,
        out_type,
        ldc: n,
        alpha: 1.0,
        addend,
        residual: None,
        relu: super::Epilogue::of(ctx)? == super::Epilogue::Relu,
    };
    let pack = |b: &mut Build, plan: &gemm::Plan, parts: u64| {
        let a = match &a_src {
            Operand2::Constant(v) => Some(if bf16 {
                let (items, rows) = if fold { (1, m_eff) } else { (g_a, m) };
                b.derive(DataType::BF16, gemm::pack_a_bf16(v, items, rows, k, plan))
            } else if parts > 1 {
                // Split over K (one product: no batch, see `splitk`).
                let slices = splitk::slices_of_a(v, m_eff, k, parts);
                let packed = gemm::pack_a(&slices, parts, m_eff, k / parts, plan);
                b.derive(DataType::F16, packed)
            } else {
                let (items, rows) = if fold { (1, m_eff) } else { (g_a, m) };
                b.derive(DataType::F16, gemm::pack_a(v, items, rows, k, plan))
            }),
            Operand2::Runtime(_) => None,
        };
        // B's K slices are consecutive rows, so `parts` items of `k / parts` rows each.
        let bo = match &b_src {
            Operand2::Constant(v) => Some(if bf16 {
                b.derive(DataType::BF16, gemm::pack_b_bf16(v, g_b, k, n, plan))
            } else {
                let items = g_b * parts;
                b.derive(DataType::F16, gemm::pack_b(v, items, k / parts, n, plan))
            }),
            Operand2::Runtime(_) => None,
        };
        [a, bo]
    };
    product(ctx, &mut b, &g, args, &pack)?;
    Ok(b.finish())
}

/// Packs a product's constant operands for a plan whose K is cut in `parts` slices; gives
/// the new operands of A and B (`None` for an operand read at run time).
type Pack<'a> = dyn Fn(&mut Build, &gemm::Plan, u64) -> [Option<Operand>; 2] + 'a;

/// The kernels of product `g` over `args` (A, B, C, then the epilogue's vectors): one GEMM
/// kernel, or, when `splitk::choose` estimates a split over K faster, the partial products
/// into the node's workspace and the reduction that finishes the epilogue; `pack` lays out
/// the constant operands for the plan chosen.
fn product(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    g: &Gemm,
    mut args: Vec<Operand>,
    pack: &Pack<'_>,
) -> Result<(), LowerError> {
    let core = &ctx.target.core;
    match splitk::choose(g, core).map_err(|e| ctx.error(e))? {
        splitk::Choice::Whole(plan) => {
            let [a, bo] = pack(b, &plan, 1);
            args[0] = a.unwrap_or(args[0]);
            args[1] = bo.unwrap_or(args[1]);
            b.kernels.push(gemm_kernel(ctx, g, &plan, args)?);
        }
        splitk::Choice::Split(split) => {
            let [a, bo] = pack(b, &split.plan, split.parts);
            let slice = split.slice_bytes();
            let at = b.scratch_at(split.parts * slice);
            let partial_args = vec![
                a.unwrap_or(args[0]),
                bo.unwrap_or(args[1]),
                Operand::Workspace(at),
            ];
            b.kernels
                .push(gemm_kernel(ctx, &split.partial, &split.plan, partial_args)?);
            let mut reduce_args = vec![Operand::Workspace(at), args[g.out]];
            if let Some(f) = g.factor {
                reduce_args.push(args[f.arg]);
            }
            if let Some(Addend::Cols { arg }) = g.addend {
                reduce_args.push(args[arg]);
            }
            let (asm, block_dim) =
                splitk::reduce_kernel(g, &split, core).map_err(|e| ctx.error(e))?;
            b.kernels.push(ctx.kernel(asm, block_dim, reduce_args)?);
        }
    }
    Ok(())
}

/// MatMulInteger: on the cube's 8-bit path (i8 × i8 → i32 in L0C, 8192 MACs a cycle) when it
/// takes the node — int8 A at run time (batch dims folded into M), a constant int8 B packed
/// n-major at compile time, no zero points, as GE's quantised matmul takes them — with a
/// fused dequantisation's conversion and scale in the drain; otherwise on the AI CPU.
fn matmul_integer(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    match i8_cube_refusal(ctx)? {
        None => matmul_integer_cube(ctx),
        Some(why) if ctx.node.int(FUSED_DEQUANT).is_some() => Err(ctx.error(why)),
        Some(_) => matmul_integer_aicpu(ctx),
    }
}

/// Why the cube's 8-bit path cannot take this MatMulInteger, or `None` when it can: int8
/// operands, A of rank 2 or more at run time with an even K, B a constant matrix, zero points
/// absent or constant zeros.
fn i8_cube_refusal(ctx: &LowerCtx<'_>) -> Result<Option<String>, LowerError> {
    let (ad, bd) = (ctx.input(0)?, ctx.input(1)?);
    if ad.dtype != DataType::I8 || bd.dtype != DataType::I8 {
        return Ok(Some(format!(
            "the cube's 8-bit path multiplies int8 by int8; got {} × {}",
            ad.dtype.name(),
            bd.dtype.name()
        )));
    }
    for (z, what) in [(2, "a_zero_point"), (3, "b_zero_point")] {
        if ctx.inputs.get(z).copied().flatten().is_none() {
            continue;
        }
        match const_values(ctx, z) {
            Some(v) if v.iter().all(|x| *x == 0.0) => {}
            _ => {
                return Ok(Some(format!(
                    "{what} must be absent or a constant zero: the cube multiplies the int8 \
                     values as they are"
                )));
            }
        }
    }
    let (a_dims, b_dims) = (dims_of(ctx, ad)?, dims_of(ctx, bd)?);
    if a_dims.len() < 2 || b_dims.len() != 2 {
        return Ok(Some(format!(
            "the cube's 8-bit path takes A of rank 2 or more and a 2-D B; got {a_dims:?} × \
             {b_dims:?}"
        )));
    }
    let k = a_dims[a_dims.len() - 1];
    if k == 0 || k % 2 != 0 {
        return Ok(Some(format!(
            "K = {k}: the cube's 8-bit path loads A's rows as pairs of values, so K must be \
             even and not 0"
        )));
    }
    if const_values(ctx, 0).is_some() {
        return Ok(Some(
            "A is a constant: a constant A has no packed 8-bit form".into(),
        ));
    }
    if const_values(ctx, 1).is_none() {
        return Ok(Some(
            "B must be a constant (the weights): the cube's 8-bit path packs it at compile time"
                .into(),
        ));
    }
    Ok(None)
}

/// MatMulInteger on the AI CPU, for what the cube's 8-bit path does not take (uint8
/// operands, B at run time, zero points, odd K), as GE places an operator its AI core
/// kernels lack.
fn matmul_integer_aicpu(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    use gearsim_isa::aicpu_op::{AiCpuOp, MAX_RANK, Operand as CpuOperand};
    let operand = |d: &TensorDesc| -> Result<CpuOperand, LowerError> {
        let dims: Vec<i64> = dims_of(ctx, d)?.iter().map(|x| *x as i64).collect();
        if dims.len() > MAX_RANK {
            return Err(ctx.error(format!(
                "the AI CPU kernel takes at most {MAX_RANK} dims, got {}",
                dims.len()
            )));
        }
        Ok(CpuOperand {
            dtype: d.dtype,
            dims,
        })
    };
    let given = |i: usize| ctx.inputs.get(i).copied().flatten();
    let (a_zero, b_zero) = match (given(2), given(3)) {
        (None, Some(_)) => {
            return Err(ctx.error(
                "b_zero_point without a_zero_point is not supported (give a_zero_point = 0)",
            ));
        }
        (za, zb) => (za.map(&operand).transpose()?, zb.map(&operand).transpose()?),
    };
    let out = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    Ok(Lowered::AiCpu {
        op: AiCpuOp::MatMulInteger {
            a: operand(ctx.input(0)?)?,
            b: operand(ctx.input(1)?)?,
            a_zero,
            b_zero,
            output: operand(out)?,
        },
    })
}

/// The cube's 8-bit path (what [`i8_cube_refusal`] accepts).
fn matmul_integer_cube(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (ad, bd) = (ctx.input(0)?, ctx.input(1)?);
    let (a_dims, b_dims) = (dims_of(ctx, ad)?, dims_of(ctx, bd)?);
    let ra = a_dims.len();
    let (m, k, n) = (a_dims[ra - 2], a_dims[ra - 1], b_dims[1]);
    let m_eff = m * a_dims[..ra - 2].iter().product::<u64>();
    let mut b = Build::default();
    if m_eff == 0 || n == 0 {
        return Ok(b.finish());
    }
    let Some(weights) = const_values(ctx, 1) else {
        return Err(ctx.error(
            "B must be a constant (the weights): the cube's 8-bit path packs it at compile time",
        ));
    };
    let weights: Vec<i8> = weights.iter().map(|v| *v as i8).collect();
    let out = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    let mut args = vec![Operand::Input(0), Operand::Input(1), Operand::Output(0)];
    // A fused dequantisation: the accumulators as f32 times one scale (the product's
    // factor) or one per column (a factor the drain multiplies each column by).
    let (out_type, alpha, factor) = if ctx.node.int(FUSED_DEQUANT).is_some() {
        let scale = const_values(ctx, DEQUANT_INPUT)
            .ok_or_else(|| ctx.error("the fused dequantisation's scale is not a constant"))?;
        let out_type = cube_type(ctx, out)?;
        match scale.len() as u64 {
            1 => (out_type, scale[0], None),
            len if len == n => {
                let bytes = gemm::col_fractals(&scale, 1.0);
                args.push(b.derive(DataType::F32, bytes));
                (out_type, 1.0, Some(gemm::ColFactor { arg: 3 }))
            }
            len => {
                return Err(ctx.error(format!(
                    "the dequantisation scale has {len} values; expected 1 or N = {n}"
                )));
            }
        }
    } else if out.dtype == DataType::I32 {
        (OutType::I32, 1.0, None)
    } else {
        return Err(ctx.error(format!(
            "the output of MatMulInteger is int32, got {}",
            out.dtype.name()
        )));
    };
    let units = k / 2;
    let g = Gemm {
        in_type: InType::I8,
        factor,
        name: kernel_name(ctx, "i8"),
        batch: Vec::new(),
        m: m_eff,
        n,
        k: units,
        a: Src::Rows {
            arg: 0,
            trans: false,
            ld: units,
        },
        b: Src::Packed { arg: 1 },
        out: 2,
        out_type,
        ldc: n,
        alpha,
        addend: None,
        residual: None,
        relu: false,
    };
    let pack = |b: &mut Build, plan: &gemm::Plan, parts: u64| {
        let packed = splitk::pack_b_i8_slices(&weights, k, n, parts, plan);
        [None, Some(b.derive(DataType::I8, packed))]
    };
    product(ctx, &mut b, &g, args, &pack)?;
    Ok(b.finish())
}

/// Transposes a row-major `rows × cols` matrix.
pub(crate) fn transpose(v: &[f32], rows: u64, cols: u64) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows as usize {
        for c in 0..cols as usize {
            out[c * rows as usize + r] = v[r * cols as usize + c];
        }
    }
    out
}

/// Gemm: `alpha · A' · B' + beta · C` with optional transposes and C broadcast to [M, N].
fn gemm(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (ad, bd) = (ctx.input(0)?, ctx.input(1)?);
    let out = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    let out_type = cube_type(ctx, out)?;
    cube_type(ctx, ad)?;
    cube_type(ctx, bd)?;
    let (a_dims, b_dims) = (dims_of(ctx, ad)?, dims_of(ctx, bd)?);
    let ta = ctx.node.int("transA").unwrap_or(0) != 0;
    let tb = ctx.node.int("transB").unwrap_or(0) != 0;
    let alpha = ctx.node.float("alpha").unwrap_or(1.0);
    let beta = ctx.node.float("beta").unwrap_or(1.0);
    let (m, k) = if ta {
        (a_dims[1], a_dims[0])
    } else {
        (a_dims[0], a_dims[1])
    };
    let n = if tb { b_dims[0] } else { b_dims[1] };
    let mut b = Build::default();
    if m == 0 || n == 0 {
        return Ok(b.finish());
    }
    if k == 0 {
        return Err(ctx.error("a product with an empty inner dimension (K = 0) has no kernel"));
    }
    let mut args = vec![Operand::Input(0), Operand::Input(1), Operand::Output(0)];
    let a_const = const_values(ctx, 0).map(|v| if ta { transpose(&v, k, m) } else { v });
    let b_const = const_values(ctx, 1).map(|v| if tb { transpose(&v, n, k) } else { v });
    let a_kind = match a_const {
        Some(_) => Src::Packed { arg: 0 },
        None => {
            args[0] = runtime_f16(ctx, &mut b, 0, m * k, "a")?;
            Src::Rows {
                arg: 0,
                trans: ta,
                ld: if ta { m } else { k },
            }
        }
    };
    let b_kind = match b_const {
        Some(_) => Src::Packed { arg: 1 },
        None => {
            args[1] = runtime_f16(ctx, &mut b, 1, k * n, "b")?;
            Src::Rows {
                arg: 1,
                trans: tb,
                ld: if tb { k } else { n },
            }
        }
    };
    let addend = match ctx.inputs.get(2).copied().flatten() {
        Some(cd) if beta != 0.0 => Some(gemm_addend(ctx, &mut b, &mut args, cd, m, n, beta)?),
        _ => None,
    };
    let g = Gemm {
        in_type: InType::F16,
        factor: None,
        name: kernel_name(ctx, super::Epilogue::of(ctx)?.suffix()),
        batch: Vec::new(),
        m,
        n,
        k,
        a: a_kind,
        b: b_kind,
        out: 2,
        out_type,
        ldc: n,
        alpha,
        addend,
        residual: None,
        relu: super::Epilogue::of(ctx)? == super::Epilogue::Relu,
    };
    let pack = |b: &mut Build, plan: &gemm::Plan, parts: u64| {
        let a = a_const.as_ref().map(|v| {
            let slices = splitk::slices_of_a(v, m, k, parts);
            b.derive(
                DataType::F16,
                gemm::pack_a(&slices, parts, m, k / parts, plan),
            )
        });
        let bo = b_const
            .as_ref()
            .map(|v| b.derive(DataType::F16, gemm::pack_b(v, parts, k / parts, n, plan)));
        [a, bo]
    };
    product(ctx, &mut b, &g, args, &pack)?;
    Ok(b.finish())
}

/// The GEMM kernel of `g` under `plan`, over `args`.
fn gemm_kernel(
    ctx: &LowerCtx<'_>,
    g: &Gemm,
    plan: &gemm::Plan,
    args: Vec<Operand>,
) -> Result<Kernel, LowerError> {
    let mut asm = Asm::new(&g.name);
    gemm::emit(g, plan, &ctx.target.core, &mut asm);
    ctx.kernel(asm, plan.block_dim, args)
}

/// Gemm's `beta · C` as an epilogue addend (argument 3 when it needs one).
fn gemm_addend(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    args: &mut Vec<Operand>,
    cd: &TensorDesc,
    m: u64,
    n: u64,
    beta: f32,
) -> Result<Addend, LowerError> {
    let c_dims = dims_of(ctx, cd)?;
    let c_type = cube_type(ctx, cd)?;
    let rows = if c_dims.len() == 2 { c_dims[0] } else { 1 };
    let cols = c_dims.last().copied().unwrap_or(1);
    let elems = rows * cols;
    let constant = const_values(ctx, 2);
    if elems == 1
        && let Some(v) = &constant
    {
        return Ok(Addend::Scalar { value: v[0] * beta });
    }
    let (mode, len) = if elems == 1 {
        (Expand::Fill, n)
    } else if rows == 1 && cols == n {
        (Expand::Cols, n)
    } else if cols == 1 && rows == m {
        (Expand::Rows, m)
    } else {
        // The full matrix, row-major f32.
        args.push(match (&constant, c_type) {
            (Some(v), _) => {
                let bytes = v.iter().flat_map(|x| (x * beta).to_le_bytes()).collect();
                b.derive(DataType::F32, bytes)
            }
            (None, OutType::F32) => Operand::Input(2),
            (None, OutType::F16) => {
                let ws = b.scratch(m * n * 4);
                let name = kernel_name(ctx, "cast_c_f32");
                b.kernels.push(cast_kernel(
                    ctx,
                    &name,
                    m * n,
                    OutType::F16,
                    OutType::F32,
                    Operand::Input(2),
                    ws,
                )?);
                ws
            }
            (None, OutType::I32 | OutType::Bf16) => {
                return Err(ctx.error("only an f16 or f32 addend has an f32 form on the cube"));
            }
        });
        let beta = if constant.is_some() { 1.0 } else { beta };
        return Ok(Addend::Full { arg: 3, beta });
    };
    let operand = match &constant {
        Some(v) => {
            let bytes = match mode {
                Expand::Cols => gemm::col_fractals(v, beta),
                Expand::Rows => gemm::row_fractals(v, beta),
                Expand::Fill => gemm::col_fractals(&vec![v[0]; n as usize], beta),
            };
            b.derive(DataType::F32, bytes)
        }
        None => {
            let ws = b.scratch(len.div_ceil(16) * FRACTAL_BYTES_F32);
            let name = kernel_name(ctx, "expand_c");
            b.kernels.push(expand_kernel(
                ctx,
                &name,
                mode,
                len,
                c_type,
                beta,
                [Operand::Input(2), ws],
            )?);
            ws
        }
    };
    args.push(operand);
    Ok(match mode {
        Expand::Rows => Addend::Rows { arg: 3 },
        Expand::Cols | Expand::Fill => Addend::Cols { arg: 3 },
    })
}

/// A Conv's runtime bias (input 2, `m` values) expanded on the device into row fractals in
/// the node's workspace (one value per output channel, as the drains add it).
pub(crate) fn runtime_bias(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    bias: &TensorDesc,
    m: u64,
) -> Result<Operand, LowerError> {
    let ws = b.scratch(m.div_ceil(16) * FRACTAL_BYTES_F32);
    let name = kernel_name(ctx, "expand_bias");
    let ty = cube_type(ctx, bias)?;
    b.kernels.push(expand_kernel(
        ctx,
        &name,
        Expand::Rows,
        m,
        ty,
        1.0,
        [Operand::Input(2), ws],
    )?);
    Ok(ws)
}

/// A 1×1 convolution without padding, in one group, NCHW on both sides: per image a product
/// `Y[n] (M × Ho·Wo) = W (M × C) · X[n] (C × Ho·Wo)`, which the GEMM kernel runs with the
/// weights packed once and shared by every image, the bias added per output channel and a
/// fused activation in its drain (GE runs these as matmuls too: no window, no relayout), after
/// a fused residual (input 3) when the fusion pass folded an Add into it. A stride first
/// subsamples X with a strided Slice into the workspace.
pub(crate) fn conv_1x1(ctx: &LowerCtx<'_>, s: &conv::ConvShape) -> Result<Lowered, LowerError> {
    let out_type = cube_type(ctx, &ctx.outputs[0])?;
    let weights = const_values(ctx, 1).ok_or_else(|| {
        ctx.error("Conv weights must be a constant (the cube kernel packs them when compiling)")
    })?;
    let epilogue = super::Epilogue::of(ctx)?;
    let mut b = Build::default();
    let (hw_in, hw) = (s.h * s.w, s.ho * s.wo);
    let mut x = runtime_f16(ctx, &mut b, 0, s.n * s.c * hw_in, "x")?;
    if s.sh > 1 || s.sw > 1 {
        let xs = b.scratch(s.n * s.c * hw * 2);
        subsample(ctx, &mut b, s, x, xs)?;
        x = xs;
    }
    let mut args = vec![Operand::Input(1), x, Operand::Output(0)];
    let addend = match (const_values(ctx, 2), ctx.inputs.get(2).copied().flatten()) {
        (Some(v), _) => {
            args.push(b.derive(DataType::F32, gemm::row_fractals(&v, 1.0)));
            Some(Addend::Rows { arg: 3 })
        }
        (None, Some(bd)) => {
            args.push(runtime_bias(ctx, &mut b, bd, s.m)?);
            Some(Addend::Rows { arg: 3 })
        }
        (None, None) => None,
    };
    // A fused residual Add: the residual (shaped as the output) is read in the drain.
    let residual = match ctx.inputs.get(RESIDUAL_INPUT).copied().flatten() {
        None => None,
        Some(r) if r.dtype == DataType::F16 && out_type == OutType::F16 => {
            args.push(Operand::Input(RESIDUAL_INPUT));
            Some(args.len() - 1)
        }
        Some(r) => {
            return Err(ctx.error(format!(
                "a fused residual needs f16 on both sides (residual {}, output {})",
                r.dtype.name(),
                ctx.outputs[0].dtype.name()
            )));
        }
    };
    let es = out_type.bytes();
    let batch = if s.n > 1 {
        vec![BatchDim {
            size: s.n,
            a: 0,
            b: s.c * hw * 2,
            c: s.m * hw * es,
        }]
    } else {
        Vec::new()
    };
    let suffix = match epilogue {
        super::Epilogue::None => "1x1".to_string(),
        e => format!("1x1_{}", e.suffix()),
    };
    let g = Gemm {
        in_type: InType::F16,
        factor: None,
        name: kernel_name(ctx, &suffix),
        batch,
        m: s.m,
        n: hw,
        k: s.c,
        a: Src::Packed { arg: 0 },
        b: Src::Rows {
            arg: 1,
            trans: false,
            ld: hw,
        },
        out: 2,
        out_type,
        ldc: hw,
        alpha: 1.0,
        addend,
        residual,
        relu: epilogue == super::Epilogue::Relu,
    };
    let plan = g.plan(&ctx.target.core).map_err(|e| ctx.error(e))?;
    args[0] = b.derive(DataType::F16, gemm::pack_a(&weights, 1, s.m, s.c, &plan));
    b.kernels.push(gemm_kernel(ctx, &g, &plan, args)?);
    Ok(b.finish())
}

/// `X[:, :, ::sh, ::sw]` of f16 `src` into `dst` (the movement kernels' strided Slice).
fn subsample(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    s: &conv::ConvShape,
    src: Operand,
    dst: Operand,
) -> Result<(), LowerError> {
    use crate::ir::{Node, fixed_shape};
    let desc = |d: &[u64]| {
        TensorDesc::new(
            DataType::F16,
            fixed_shape(&d.iter().map(|v| *v as i64).collect::<Vec<_>>()),
        )
    };
    let (din, dout) = (desc(&[s.n, s.c, s.h, s.w]), desc(&[s.n, s.c, s.ho, s.wo]));
    let ints = |v: &[i64]| Tensor::from_i64s(vec![v.len() as i64], v);
    let params = [
        ints(&[0, 0]),
        ints(&[s.h as i64, s.w as i64]),
        ints(&[2, 3]),
        ints(&[s.sh as i64, s.sw as i64]),
    ];
    let pdesc: Vec<TensorDesc> = params.iter().map(TensorDesc::of).collect();
    let node = Node::new(
        format!("{}/subsample", ctx.node.name),
        "Slice",
        vec![],
        vec![dout],
    );
    let mut inputs = vec![Some(&din)];
    inputs.extend(pdesc.iter().map(Some));
    let mut values = vec![None];
    values.extend(params.iter().map(Some));
    let sub = LowerCtx {
        node: &node,
        inputs,
        values,
        outputs: &node.outputs,
        target: ctx.target,
    };
    let lower =
        super::lowering("Slice").ok_or_else(|| ctx.error("internal error: no Slice lowering"))?;
    let lowered = lower(&sub).map_err(|e| ctx.error(e.message))?;
    // The Slice's bounds are compile-time constants: its kernels read only the data.
    if let Lowered::Kernels { kernels, .. } = &lowered
        && kernels
            .iter()
            .flat_map(|k| &k.args)
            .any(|a| matches!(a, Operand::Input(i) if *i > 0))
    {
        return Err(
            ctx.error("internal error: the subsampling Slice reads its bounds on the device")
        );
    }
    b.inline(lowered, &|_| src, dst, |name| name)
        .map_err(|e| ctx.error(e))
}
