//! Conv on the cube: NCHW in, NCHW out, f16 products with f32 accumulation.
//!
//! The product is computed channel-major, `C[co][q] = Σ_k W[co][k] · X[k][q]` with the weights
//! in L0A and the input windows in L0B, so every L0C fractal row holds 16 consecutive output
//! pixels of one channel and leaves for NCHW as one burst. A window is the input shifted by the
//! tap's offset, and a pixel shift is only cheap when a pixel is a unit of its own: each block
//! first *relayouts* the rows it needs into a pixel-major image in its GM workspace (NCHW rows
//! through `nd2nz` into L1, transposed by `load_l0a`, multiplied by the identity into L0C, out
//! through UB), from which every tap's window is a contiguous run of 32-byte pixel units that
//! `load_l0b` transposes into an L0B fractal.
//!
//! ```text
//!   X (NCHW) ─nd2nz─▶ L1 ─load_l0a^T─▶ L0A ─mmad·I─▶ L0C ─V─▶ UB ─MTE3─▶ workspace (pixel-major)
//!   workspace ─MTE2─▶ L1 band (stage) ─load_l0b^T (one window per tap)─▶ L0B ┐
//!   packed W  ─MTE2─▶ L1 (resident per co block) ─load_l0a──────────────▶ L0A ┴─mmad─▶ L0C
//!   L0C ─V copy_l0c_to_ub (+ bias, convert)─▶ UB ─MTE3 (one burst per fractal row)─▶ Y (NCHW)
//! ```
//!
//! **Output space.** A tile is `R` whole output rows of one image. Its output positions are
//! numbered `q = r · Wq + ow` with a row pitch `Wq` just wider than `Wo`: the `Wq - Wo` junk
//! columns of a row are where the zero padding of one row and the next overlap, so every tap
//! reads the workspace at `q` plus a constant and padding costs no special case. Strides are
//! polyphase: padded input row `Y` and column `X` go to plane `(Y mod sh, X mod sw)` at
//! `(Y / sh, X / sw)`, so a strided window is again a contiguous run in one plane.
//!
//! **Drain.** A fractal of 16 positions may end one row and start the next. Its second segment
//! cannot start a UB burst (UB bursts are 32-byte aligned), so it is written from the fractal's
//! start with the GM address moved back by the offset ("spill"): the bytes before the row start
//! land in the previous row, which is written later — rows go out in descending order — and so
//! ends up right. Tiles never spill into each other (a tile starts at a row start). Narrow
//! outputs (`Wo < 16`), whose spill could reach before the tile, use a pitch that is a
//! multiple of 16, or, for f16 outputs where that would waste a fifth of the positions or
//! more, keep the window's pitch and *pack* instead: V transposes the tile's blocks to
//! channel-major order and `vgather`s each channel's real pixels with the row pattern (a
//! constant), and MTE3 writes each channel's rows of the tile with one burst.
//!
//! **Schedule.** Blocks get contiguous runs of output rows, more to the blocks the scheduler starts
//! first (it dispatches one block per slot, so the last block starts about `cores × slot` cycles
//! after the first). A block walks its rows in tiles of at most `RT` rows; each tile's K loop is
//! one stage per 16 input channels, one L0 step per `kb` taps. The stages' bands come into L1 in
//! groups of `sg` stages behind one notice (with the weights on the block's first tile), two groups
//! in flight. While tile `k` multiplies, the rows tile `k + 1` adds go through the relayout (their
//! `nd2nz` were issued at the start of tile `k - 1`), from its first L0 step on, and tile `k + 2`'s
//! rows are staged. UB holds a tile's whole batch of relayouted rows when it fits: V announces the
//! batch with one notice, MTE3 writes its rows out behind it and hands UB back with one notice, as
//! every MTE3 notice waits out the GM write latency, which per row would make MTE3 the bottleneck
//! (and per-row V notices could overrun a lagging MTE3). For the same reason MTE2 announces staged
//! rows (and takes the workspace notice) behind the band load that follows them, so no notice holds
//! a band back. The L0C tile is double-buffered and drains (V, MTE3) while the next tile
//! multiplies. Shapes are static, but row counts are not: the K loop and the drain exist once per
//! tile height `1..=RT` and are entered by a jump.
//!
//! **Weights.** A co block's weights stay resident in L1 over the block's tiles, loaded with its
//! first tile (a pass per co block, a barrier between passes). Where every block's rows are one
//! tile and the weights are what the kernel mostly reads (deep channels on small maps), they
//! stream instead: each stage group's weights come into its stage buffer with its bands,
//! double-buffered against the products, and one pass covers the block's channels.
//!
//! Grouped convolutions run one kernel per group; depthwise ones go to the vector unit
//! (`cube_depthwise`).

use gearsim_isa::{DType, Pipe, SReg, SType, Space, units};

use super::super::writer::{Asm, Reg};
use super::super::{Epilogue, LowerCtx, LowerError, Lowered, Operand, kernel_name};
use super::gemm::OutType;
use super::{Build, const_values, cube_type, dims_of, runtime_f16};
use crate::CoreSpec;
use crate::ir::{DataType, Format, TensorDesc};

/// Bytes of a 16 × 16 f16 fractal (L1, L0A, L0B).
const FRACTAL: u64 = units::FRACTAL_BYTES;
/// Bytes of a 16 × 16 f32 fractal (L0C).
const FRACTAL_C: u64 = units::FRACTAL_BYTES_F32;
/// Bytes of one pixel unit: 16 channels of f16.
const UNIT: u64 = units::BLOCK_BYTES;
/// Cycles between the starts of consecutive blocks (the scheduler's dispatch slot on the
/// presets: 100 ns at about 1 GHz); earlier blocks get more rows so all finish together.
pub(super) const DISPATCH_STAGGER_CYCLES: f64 = 100.0;
/// Cycles a block spends outside its tiles' products (the first relayout, the last drain);
/// only used to balance rows.
const BLOCK_OVERHEAD_CYCLES: f64 = 1500.0;
/// Cycles a block loses where its rows cross into another image; only used to balance rows.
const PIECE_CYCLES: f64 = 500.0;
/// Output fractals copied out of L0C at once (at most 8: the bias add covers 8 fractals per
/// vector repeat).
const DRAIN_GROUP: u64 = 8;

/// Event ids, by pipe pair. Each is set and waited in strict alternation in program order.
mod ev {
    /// MTE2 ⇄ MTE1: the two L1 stage-group buffers (bands, and on a block's first tile the
    /// weights, of `sg` input-channel blocks).
    pub const STAGE: [u8; 2] = [0, 1];
    /// MTE2 ⇄ MTE1: the two relayout staging slots (the `nd2nz` rows of a tile, by tile
    /// parity).
    pub const STAGING: [u8; 2] = [2, 3];
    /// MTE1 ⇄ M: the two conv operand buffers in L0A/L0B.
    pub const L0: [u8; 2] = [0, 1];
    /// MTE1 ⇄ M and M ⇄ V: the two relayout buffers in L0A/L0C.
    pub const RELAYOUT: [u8; 2] = [2, 3];
    /// M → V: a tile's products are complete; V → M: the previous tile's L0C half was copied.
    pub const TILE: u8 = 0;
    /// V ⇄ MTE3: the output drain buffer (filled / written out), once per tile.
    pub const DRAIN: u8 = 0;
    /// V ⇄ MTE3: the two relayout UB rows (filled / written out).
    pub const RELAYOUT_UB: [u8; 2] = [2, 3];
    /// V → MTE3: the zero area is filled (once).
    pub const ZEROED: u8 = 1;
    /// V → MTE3, after `ZEROED`: a batch's relayouted rows are all in UB (MTE3 writes them
    /// out behind this one notice).
    pub const BATCH: u8 = 1;
    /// MTE3 → MTE2: the workspace rows of the next tile are written; MTE2 → MTE3: that
    /// notice was taken (so the next one cannot find the flag still set).
    pub const WORKSPACE: u8 = 0;
    /// MTE2 ⇄ V: the bias fractals of a co block.
    pub const BIAS: u8 = 0;
    /// MTE2 → V: the narrow drain's row pattern is in UB (once).
    pub const PATTERN: u8 = 1;
}

/// A Conv node's geometry, every attribute resolved (1-D convs have `h = kh = 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConvShape {
    /// Batch.
    pub n: u64,
    /// Input channels.
    pub c: u64,
    /// Input height.
    pub h: u64,
    /// Input width.
    pub w: u64,
    /// Output channels.
    pub m: u64,
    /// Groups.
    pub group: u64,
    /// Kernel height.
    pub kh: u64,
    /// Kernel width.
    pub kw: u64,
    /// Stride along H.
    pub sh: u64,
    /// Stride along W.
    pub sw: u64,
    /// Dilation along H.
    pub dh: u64,
    /// Dilation along W.
    pub dw: u64,
    /// Top padding.
    pub pt: u64,
    /// Left padding.
    pub pl: u64,
    /// Bottom padding.
    pub pb: u64,
    /// Right padding.
    pub pr: u64,
    /// Output height.
    pub ho: u64,
    /// Output width.
    pub wo: u64,
}

/// Resolves Conv's attributes (`pads`, `auto_pad`, `strides`, `dilations`, `group`) against
/// the static shapes of the node.
pub(crate) fn conv_shape(ctx: &LowerCtx<'_>) -> Result<ConvShape, LowerError> {
    let mut x = dims_of(ctx, ctx.input(0)?)?;
    // A fused AIPP's input is the image; the convolution sees the crop in NCHW.
    if ctx.node.int(crate::fusion::FUSED_AIPP).is_some() {
        let p = crate::aipp::Params::of(ctx.node)
            .map_err(|e| ctx.error(format!("the fused AIPP needs {e}")))?;
        let n = x.first().copied().unwrap_or(0);
        x = vec![n, p.format.channels(), p.crop[2], p.crop[3]];
    }
    let wt = dims_of(ctx, ctx.input(1)?)?;
    let out = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    let o = dims_of(ctx, out)?;
    let rank = x.len();
    if !(rank == 3 || rank == 4) || wt.len() != rank || o.len() != rank {
        return Err(ctx.error(format!(
            "only 1-D and 2-D convolutions (rank 3 or 4) have a kernel; got rank {rank}"
        )));
    }
    let sp = rank - 2;
    let list = |name: &str, default: i64, len: usize| -> Result<Vec<u64>, LowerError> {
        let v = ctx
            .node
            .ints(name)
            .map_or_else(|| vec![default; len], <[i64]>::to_vec);
        if v.len() != len || v.iter().any(|x| *x < 0) {
            return Err(ctx.error(format!("attribute {name} = {v:?} is not {len} values >= 0")));
        }
        Ok(v.iter().map(|x| *x as u64).collect())
    };
    let mut strides = list("strides", 1, sp)?;
    let dilations = list("dilations", 1, sp)?;
    let mut pads = list("pads", 0, 2 * sp)?;
    let kernel = &wt[2..];
    if strides.contains(&0) || dilations.contains(&0) || kernel.contains(&0) {
        return Err(ctx.error("strides, dilations and kernel dims must be at least 1"));
    }
    match ctx.node.string("auto_pad").unwrap_or("NOTSET") {
        "NOTSET" => {}
        "VALID" => pads.iter_mut().for_each(|p| *p = 0),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            for a in 0..sp {
                let (input, s) = (x[a + 2], strides[a]);
                let extent = (kernel[a] - 1) * dilations[a] + 1;
                let (begin, end) = crate::ops::same_pads(
                    mode == "SAME_UPPER",
                    input as i64,
                    input.div_ceil(s) as i64,
                    s as i64,
                    extent as i64,
                );
                pads[a] = begin as u64;
                pads[a + sp] = end as u64;
            }
        }
        other => return Err(ctx.error(format!("auto_pad {other:?} is not an ONNX mode"))),
    }
    for a in 0..sp {
        strides[a] =
            crate::lower::window::effective_stride(strides[a], x[a + 2], pads[a], pads[a + sp]);
    }
    let group = ctx.node.int("group").unwrap_or(1).max(1) as u64;
    let (n, c, m) = (x[0], x[1], o[1]);
    let s = if sp == 1 {
        ConvShape {
            n,
            c,
            h: 1,
            w: x[2],
            m,
            group,
            kh: 1,
            kw: kernel[0],
            sh: 1,
            sw: strides[0],
            dh: 1,
            dw: dilations[0],
            pt: 0,
            pl: pads[0],
            pb: 0,
            pr: pads[1],
            ho: 1,
            wo: o[2],
        }
    } else {
        ConvShape {
            n,
            c,
            h: x[2],
            w: x[3],
            m,
            group,
            kh: kernel[0],
            kw: kernel[1],
            sh: strides[0],
            dh: dilations[0],
            sw: strides[1],
            dw: dilations[1],
            pt: pads[0],
            pl: pads[1],
            pb: pads[2],
            pr: pads[3],
            ho: o[2],
            wo: o[3],
        }
    };
    let extent = |k: u64, d: u64| (k - 1) * d + 1;
    let expect = |input: u64, pb: u64, pe: u64, k: u64, d: u64, st: u64| {
        (input + pb + pe)
            .checked_sub(extent(k, d))
            .map(|v| v / st + 1)
    };
    if expect(s.h, s.pt, s.pb, s.kh, s.dh, s.sh) != Some(s.ho)
        || expect(s.w, s.pl, s.pr, s.kw, s.dw, s.sw) != Some(s.wo)
    {
        return Err(ctx.error(format!(
            "the inferred output {}x{} does not match the window arithmetic",
            s.ho, s.wo
        )));
    }
    Ok(s)
}

/// Conv.
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let s = conv_shape(ctx)?;
    let out = ctx
        .outputs
        .first()
        .ok_or_else(|| ctx.error("the node has no output"))?;
    cube_type(ctx, out)?;
    if s.n == 0 || s.m == 0 || s.ho == 0 || s.wo == 0 {
        return Ok(Build::default().finish());
    }
    if s.c % s.group != 0 || s.m % s.group != 0 || s.c == 0 {
        return Err(ctx.error(format!(
            "group {} must divide both channel counts ({} in, {} out)",
            s.group, s.c, s.m
        )));
    }
    if s.group > 1 && s.group == s.c {
        let lowered = super::depthwise::lower(ctx, &s)?;
        return super::super::elementwise::with_epilogue_kernel(ctx, lowered, Epilogue::of(ctx)?);
    }
    let fractal = |d: Option<&TensorDesc>| d.is_some_and(|d| d.format == Format::Nc1hwc0);
    let residual = ctx.node.int(crate::fusion::FUSED_RESIDUAL).is_some();
    // Any 5HD side (a fused residual's included) runs the fractal kernel, which converts
    // the others.
    let residual_desc = ctx
        .inputs
        .get(crate::fusion::RESIDUAL_INPUT)
        .copied()
        .flatten();
    if ctx.node.int(crate::fusion::FUSED_AIPP).is_some()
        || fractal(ctx.inputs.first().copied().flatten())
        || fractal(ctx.outputs.first())
        || (residual && fractal(residual_desc))
    {
        return super::conv5hd::lower(ctx, &s);
    }
    if is_pointwise(&s) {
        return super::conv_1x1(ctx, &s);
    }
    // A window convolution takes a residual only where the 5HD kernel runs it (the fusion
    // pass asked `layout::conv_adds_residual`); that kernel converts NCHW sides.
    if residual {
        return super::conv5hd::lower(ctx, &s);
    }
    // Bands of many input channels over wide rows may leave the NCHW kernel no tile that fits
    // L1; an f16 convolution then runs the 5HD kernel (as GE runs every convolution), which
    // converts its NCHW sides and streams its weights in chunks of K.
    cube(ctx, &s).or_else(|nchw| {
        if out.dtype != DataType::F16 || ctx.input(0)?.dtype != DataType::F16 {
            return Err(nchw);
        }
        super::conv5hd::lower(ctx, &s).map_err(|fractal| {
            ctx.error(format!(
                "{}; nor does the 5HD kernel run it: {}",
                nchw.message, fractal.message
            ))
        })
    })
}

/// Whether a convolution is a product per image: 1×1, no padding, one group (it runs on the
/// GEMM kernel, `cube::conv_1x1`).
pub(crate) fn is_pointwise(s: &ConvShape) -> bool {
    s.kh == 1 && s.kw == 1 && s.pt + s.pb + s.pl + s.pr == 0 && s.group == 1
}

/// One group's product: its channel slices of X, W and Y.
#[derive(Debug, Clone, Copy)]
struct Problem {
    s: ConvShape,
    /// Input channels of the group and the first of them.
    cg: u64,
    c_off: u64,
    /// Output channels of the group and the first of them.
    mg: u64,
    m_off: u64,
    out: OutType,
    bias: BiasKind,
    /// What the drain computes on the output before it leaves (a fused activation).
    epilogue: Epilogue,
}

impl Problem {
    /// Whether the weights are more than twice the input's bytes (weight-bound layers: deep,
    /// narrow maps).
    fn weights_heavy(&self) -> bool {
        let s = &self.s;
        let weights = self.mg * self.cg * s.kh * s.kw;
        let input = s.n * self.cg * s.h * s.w;
        weights > 2 * input
    }
}

/// Which way a workspace transfer split burst by burst goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// UB to the GM workspace (MTE3).
    UbToGm,
    /// The GM workspace to L1 (MTE2).
    GmToL1,
}

/// Where the bias fractals (`[ceil(M/16)][16][16]` f32, each row one channel's value) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BiasKind {
    None,
    /// In the kernel's constants, after the weights.
    Constant,
    /// Expanded on the device into the node's workspace (argument `arg::BIAS`), the group's
    /// fractals from `offset` bytes.
    Runtime {
        offset: u64,
    },
}

/// Argument indices of the conv kernel.
mod arg {
    /// The f16 input.
    pub const X: usize = 0;
    /// The constants: identity fractal, packed weights, constant bias fractals.
    pub const CONSTS: usize = 1;
    pub const OUT: usize = 2;
    pub const WS: usize = 3;
    /// The runtime bias fractals (the constants again when there are none).
    pub const BIAS: usize = 4;
}

fn cube(ctx: &LowerCtx<'_>, s: &ConvShape) -> Result<Lowered, LowerError> {
    let out = cube_type(ctx, &ctx.outputs[0])?;
    let weights = const_values(ctx, 1).ok_or_else(|| {
        ctx.error("Conv weights must be a constant (the cube kernel packs them when compiling)")
    })?;
    let mut b = Build::default();
    let x = runtime_f16(ctx, &mut b, 0, s.n * s.c * s.h * s.w, "x")?;
    let (cg, mg) = (s.c / s.group, s.m / s.group);
    let epilogue = Epilogue::of(ctx)?;
    let bias_values = const_values(ctx, 2);
    let mut runtime_bias = None;
    if let (Some(bd), None) = (ctx.inputs.get(2).copied().flatten(), &bias_values) {
        if s.group > 1 && mg % 16 != 0 {
            return Err(ctx.error(format!(
                "a runtime bias of a grouped Conv needs 16 | channels per group (got {mg}); \
                 make the bias a constant"
            )));
        }
        runtime_bias = Some(super::runtime_bias(ctx, &mut b, bd, s.m)?);
    }
    // A kernel's code grows with its output channels (every co block is unrolled); a node
    // whose kernel would pass the instruction limit runs as several kernels, each over a
    // slice of its output channels, one after the other.
    let mut parts = 1u64;
    let written = loop {
        let part = mg.div_ceil(parts).next_multiple_of(16).min(mg);
        let mut written = Vec::new();
        let mut too_long = false;
        'groups: for g in 0..s.group {
            for q in 0..mg.div_ceil(part) {
                let m_lo = q * part;
                let bias = match (&bias_values, runtime_bias) {
                    (Some(_), _) => BiasKind::Constant,
                    (None, Some(_)) => BiasKind::Runtime {
                        offset: (g * mg + m_lo) / 16 * FRACTAL_C,
                    },
                    (None, None) => BiasKind::None,
                };
                let p = Problem {
                    s: *s,
                    cg,
                    c_off: g * cg,
                    mg: part.min(mg - m_lo),
                    m_off: g * mg + m_lo,
                    out,
                    bias,
                    epilogue,
                };
                let plan = Plan::new(&p, &ctx.target.core).map_err(|e| ctx.error(e))?;
                let mut parts = Vec::new();
                if s.group > 1 {
                    parts.push(format!("g{g}"));
                }
                if part < mg {
                    parts.push(format!("m{}", p.m_off));
                }
                if epilogue != Epilogue::None {
                    parts.push(epilogue.suffix().to_string());
                }
                let suffix = parts.join("_");
                let mut a = Asm::new(&kernel_name(ctx, &suffix));
                Gen::new(&mut a, &p, &plan, &ctx.target.core).emit();
                if a.too_long() {
                    too_long = true;
                    break 'groups;
                }
                written.push((a, p, plan));
            }
        }
        if too_long && part > 16 {
            parts *= 2;
            continue;
        }
        break written;
    };
    let mut kernels = Vec::new();
    for (a, p, plan) in written {
        let mut consts = identity_fractal();
        consts.extend(pack_weights(&weights, &p, &plan));
        if let Some(v) = &bias_values {
            consts.extend(row_fractals(
                &v[p.m_off as usize..(p.m_off + p.mg) as usize],
            ));
        }
        if plan.narrow {
            if consts.len() as u64 != pattern_offset(&plan, &p) {
                return Err(ctx.error("internal error: the row pattern's offset is off"));
            }
            consts.extend(plan.row_pattern(&p.s));
        }
        kernels.push((a, plan, b.derive(DataType::F16, consts)));
    }
    // The kernels run one after the other, so they share one workspace.
    let ws_bytes = kernels
        .iter()
        .map(|(_, plan, _)| plan.ws_total)
        .max()
        .unwrap_or(0);
    let ws = b.scratch(ws_bytes);
    for (a, plan, consts) in kernels {
        let bias = runtime_bias.unwrap_or(consts);
        let args = vec![x, consts, Operand::Output(0), ws, bias];
        b.kernels
            .push(ctx.kernel(a, plan.block_dim() as u32, args)?);
    }
    Ok(b.finish())
}

/// The 16 × 16 f16 identity (the relayout multiplies by it to move a transposed block to L0C).
fn identity_fractal() -> Vec<u8> {
    let mut v = vec![0u8; FRACTAL as usize];
    for i in 0..16 {
        let at = (i * 16 + i) * 2;
        v[at..at + 2].copy_from_slice(&half::f16::ONE.to_bits().to_le_bytes());
    }
    v
}

/// `[ceil(n/16)][16][16]` f32 fractals whose row r holds `values[16 b + r]` in every column.
fn row_fractals(values: &[f32]) -> Vec<u8> {
    let blocks = values.len().div_ceil(16);
    let mut out = Vec::with_capacity(blocks * FRACTAL_C as usize);
    for b in 0..blocks {
        for r in 0..16 {
            let v = values.get(b * 16 + r).copied().unwrap_or(0.0);
            for _ in 0..16 {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// One tap of the kernel: the plane its window comes from and where the window starts in the
/// L1 band of that plane.
#[derive(Debug, Clone, Copy)]
struct Tap {
    /// Kernel row and column.
    i: u64,
    j: u64,
    /// Plane index `ρ · sw + φ`.
    plane: u64,
    /// Band row offset (`i · dh / sh`).
    row: u64,
    /// Unit offset inside the row, margin included.
    col: u64,
}

/// The static tiling of one group's kernel.
#[derive(Debug, Clone)]
struct Plan {
    /// Input-channel blocks of 16 (one K stage each).
    c1: u64,
    taps: Vec<Tap>,
    /// Data units of each column phase in a workspace row, and the first one's index in an
    /// input row.
    nphi: Vec<u64>,
    x0: Vec<u64>,
    /// Units kept before a row for windows that start left of it.
    margin: u64,
    /// Row pitch of the workspace, the L1 band and the output space.
    wq: u64,
    /// Band rows below a tile's rows (`(kh - 1) · dh / sh`).
    ihi: u64,
    /// Padded input height.
    hp: u64,
    /// Output rows per tile, at most, and of a block's first tile.
    rt: u64,
    r_first: u64,
    /// Output rows of a block's last tile, at most (its drain is the block's tail).
    r_last: u64,
    /// Whether the weights stream through L1 with the bands (each stage group's weights in its
    /// stage buffer, loaded with every tile) instead of staying resident per co block. A block
    /// whose rows are one tile reuses no weights across tiles, so streaming costs no extra
    /// traffic and lets one pass cover the block's whole channel range, its weight loads
    /// double-buffered against the products (resident weights load before the pass's products).
    stream: bool,
    /// Narrow f16 output rows (`Wo < 16`) at the pitch the windows need, not a multiple of 16:
    /// the drain packs each channel's rows in UB (a block transpose, then `vgather` with the
    /// row pattern) and writes each channel's rows of a tile with one burst, so no burst has
    /// to start inside a fractal (the spill, which narrow rows cannot take).
    narrow: bool,
    /// Output-channel fractals per co block, co blocks.
    mb: u64,
    co_blocks: u64,
    /// Taps per L0 step.
    kb: u64,
    /// Stages (channel blocks) per L1 stage group: a group's bands are loaded behind one
    /// notice, and each notice waits out its DMAs' latency.
    sg: u64,
    /// Channel blocks per relayout item group.
    cr: u64,
    /// Relayout rows UB holds: a tile's whole batch when it fits (MTE3 then hands the rows
    /// back with one notice per batch, as each notice waits out the write latency), else 2.
    ub_rows: u64,
    /// L0 steps `item_first..item_steps` of a tile carry one relayout row of the next tile
    /// each (from `item_first` its `nd2nz` rows are expected in); after them the rest of its
    /// rows go through, and its workspace band is announced.
    item_first: u64,
    item_steps: u64,
    /// Each row block's output rows (global `n · Ho + oh`), start and end.
    blocks: Vec<(u64, u64)>,
    /// The co blocks of each output-channel group, start and end. Block `b` of the kernel
    /// computes row block `b / groups` for channel group `b % groups`: when the output has
    /// few rows, splitting the channels too keeps every core busy and lets each stream only
    /// its share of the weights.
    co_groups: Vec<(u64, u64)>,
    /// Images a block's rows touch, at most; padded rows a piece keeps per column phase.
    pieces: u64,
    piece_rows: u64,
    /// Workspace bytes of all blocks.
    ws_total: u64,
}

impl Plan {
    fn new(p: &Problem, core: &CoreSpec) -> Result<Plan, String> {
        let s = &p.s;
        let (sh, sw) = (s.sh, s.sw);
        // Column phases: padded column X = sw·u + φ holds data for pl <= X < pl + w.
        let mut u0 = Vec::new();
        let mut nphi = Vec::new();
        let mut x0 = Vec::new();
        for phi in 0..sw {
            let first = if phi >= s.pl {
                0
            } else {
                (s.pl - phi).div_ceil(sw)
            };
            let end = (s.pl + s.w).saturating_sub(phi).div_ceil(sw);
            u0.push(first);
            nphi.push(end.saturating_sub(first));
            x0.push((sw * first + phi).saturating_sub(s.pl));
        }
        // The row pitch: wide enough that a window never reads another row's data where the
        // padded input has zeros, and that a row's last window stays in its row.
        let mut margin = 0i64;
        let mut wq = 1i64;
        let mut taps = Vec::new();
        for i in 0..s.kh {
            for j in 0..s.kw {
                let (rho, row) = ((i * s.dh) % sh, (i * s.dh) / sh);
                let (phi, jj) = ((j * s.dw) % sw, (j * s.dw) / sw);
                let (u, n) = (u0[phi as usize] as i64, nphi[phi as usize] as i64);
                margin = margin.max(u - jj as i64);
                wq = wq
                    .max(n)
                    .max(n + u - jj as i64)
                    .max(s.wo as i64 + jj as i64 - u);
                taps.push(Tap {
                    i,
                    j,
                    plane: rho * sw + phi,
                    row,
                    col: 0,
                });
            }
        }
        let margin = margin.max(0) as u64;
        // A row's first burst may start up to a 32-byte block before the row (the drain's
        // spill, into rows written later), but never before the tile's first row: in GM rows
        // are `Wo` apart, closer than their `Wq` in L0C, so narrow outputs need a pitch whose
        // row starts sit near a block start (a multiple of 16 always does).
        let es = p.out.bytes();
        let spill_safe =
            |wq: u64| (1..=s.ho).all(|r| (r * wq % 16) % (units::BLOCK_BYTES / es) <= r * s.wo);
        // Packing costs vector work per tile; it pays where the pitch of 16 would waste a fifth
        // of the cube's positions or more.
        let padded = (wq as u64).next_multiple_of(16);
        let narrow = !spill_safe(wq as u64) && p.out == OutType::F16 && 4 * padded >= 5 * wq as u64;
        let wq = (wq as u64..)
            .find(|&wq| narrow || spill_safe(wq) || wq % 16 == 0)
            .unwrap_or(wq as u64);
        for tap in &mut taps {
            let phi = tap.plane % sw;
            let jj = (tap.j * s.dw) / sw;
            tap.col = margin + jj - u0[phi as usize];
        }
        let mut plan = Plan {
            c1: p.cg.div_ceil(16),
            taps,
            nphi,
            x0,
            margin,
            wq,
            ihi: ((s.kh - 1) * s.dh) / sh,
            hp: s.h + s.pt + s.pb,
            rt: 1,
            r_first: 1,
            r_last: 1,
            stream: false,
            narrow,
            mb: 1,
            co_blocks: 1,
            kb: 1,
            sg: 1,
            cr: 1,
            ub_rows: 2,
            item_first: 0,
            item_steps: 1,
            blocks: Vec::new(),
            co_groups: vec![(0, 1)],
            pieces: 1,
            piece_rows: 1,
            ws_total: 0,
        };
        let mut streamed = plan.clone();
        let resident = plan.choose(p, core).map(|()| plan.estimate(p, core));
        match (resident, streamed.choose_streamed(p, core)) {
            // Streaming also gives up overlapping a block's relayout with its products, which
            // the estimate undercounts: it is taken where the resident weights need several
            // passes per block (each reloading the bands behind a full barrier) or where the
            // weights, not the input rows, are most of what the kernel reads.
            (Ok(r), Some(st)) if st < r && (plan.passes() > 1 || p.weights_heavy()) => Ok(streamed),
            (Err(_), Some(_)) => Ok(streamed),
            (resident, _) => resident.map(|_| plan),
        }
    }

    fn planes(&self, s: &ConvShape) -> u64 {
        s.sh * s.sw
    }

    fn taps(&self) -> u64 {
        self.taps.len() as u64
    }

    /// Output fractals of a tile of `r` rows.
    fn nb(&self, s: &ConvShape, r: u64) -> u64 {
        ((r - 1) * self.wq + s.wo).div_ceil(16)
    }

    /// Fractals an input row occupies per channel block after `nd2nz`.
    fn blk(&self, s: &ConvShape) -> u64 {
        s.w.div_ceil(16)
    }

    /// Stage groups per tile.
    fn groups(&self) -> u64 {
        self.c1.div_ceil(self.sg)
    }

    /// L0 steps of a tile that are done once stage group `gi` is done.
    fn group_end_step(&self, gi: u64) -> u64 {
        ((gi + 1) * self.sg).min(self.c1) * self.steps()
    }

    /// Bytes of one stage's band in L1 (every plane).
    fn stage_bytes(&self, s: &ConvShape) -> u64 {
        self.planes(s) * self.band_units() * UNIT
    }

    /// L0 steps per stage.
    fn steps(&self) -> u64 {
        self.taps().div_ceil(self.kb)
    }

    /// Units per (column phase, channel block) of a piece in the workspace.
    fn pws(&self) -> u64 {
        self.margin + self.piece_rows * self.wq
    }

    fn piece_bytes(&self, s: &ConvShape) -> u64 {
        s.sw * self.c1 * self.pws() * UNIT
    }

    fn ws_block(&self, s: &ConvShape) -> u64 {
        self.pieces * self.piece_bytes(s)
    }

    /// Units per plane of an L1 band (one channel block): a tile's rows and the rows below.
    fn band_units(&self) -> u64 {
        self.margin + (self.rt + self.ihi) * self.wq
    }

    /// Input rows a relayout batch holds at most (a piece's first tile and its halo).
    fn batch_rows(&self, s: &ConvShape) -> u64 {
        s.sh * (self.rt + self.ihi)
    }

    /// Bytes of the L1 staging area: every input row of a batch, all channel blocks.
    fn staging_bytes(&self, s: &ConvShape) -> u64 {
        self.batch_rows(s) * self.c1 * self.blk(s) * FRACTAL
    }

    /// Bytes of the weights of one co block.
    fn weight_bytes(&self) -> u64 {
        self.mb * self.c1 * self.taps() * FRACTAL
    }

    /// Bytes of the resident weights in L1 (none when they stream).
    fn resident_bytes(&self) -> u64 {
        if self.stream { 0 } else { self.weight_bytes() }
    }

    /// Bytes of one L1 stage-group buffer: its bands, and when the weights stream their
    /// weights after them.
    fn group_bytes(&self, s: &ConvShape) -> u64 {
        let weights = if self.stream {
            self.mb * self.taps() * FRACTAL
        } else {
            0
        };
        self.sg * (self.stage_bytes(s) + weights)
    }

    /// Output-channel fractals of co block `cb` (the last may be narrower).
    fn mb_of(&self, p: &Problem, cb: u64) -> u64 {
        (p.mg - cb * 16 * self.mb).div_ceil(16).min(self.mb)
    }

    fn ub_layout(&self, p: &Problem) -> UbLayout {
        let s = &p.s;
        // Whole groups of 8 fractals: the bias add's repeats span 8 fractals.
        let nb = self.nb(s, self.rt).next_multiple_of(DRAIN_GROUP);
        let mut at = 0u64;
        let mut take = |bytes: u64| {
            let a = at;
            at += bytes.next_multiple_of(UNIT);
            a
        };
        let f32_work = p.bias != BiasKind::None || p.out == OutType::F32;
        let out = take(self.mb * nb * units::FRACTAL_ELEMS * p.out.bytes());
        let work = if f32_work && p.out == OutType::F16 {
            take(self.mb * nb * FRACTAL_C)
        } else {
            out
        };
        let bias = if p.bias == BiasKind::None {
            0
        } else {
            take(self.mb * FRACTAL_C)
        };
        let row = self.c1 * self.blk(s) * FRACTAL;
        let relayout = take(self.ub_rows * row);
        let zero = take(self.zero_units(s) * UNIT);
        let packed_slot = (self.rt * s.wo * 2).next_multiple_of(UNIT);
        let (transposed, packed, pattern) = if self.narrow {
            (
                take(self.mb * nb * FRACTAL),
                take(16 * self.mb * packed_slot),
                take(self.pattern_bytes(s)),
            )
        } else {
            (0, 0, 0)
        };
        UbLayout {
            out,
            work,
            bias,
            transposed,
            packed,
            packed_slot,
            pattern,
            relayout,
            zero,
            end: at,
        }
    }

    /// The narrow drain's row pattern: one bit per output position of the tallest tile, set
    /// where the position is a real output pixel (not a junk column of the pitch).
    fn row_pattern(&self, s: &ConvShape) -> Vec<u8> {
        let mut bits = vec![0u8; self.pattern_bytes(s) as usize];
        let end = (self.rt - 1) * self.wq + s.wo;
        for q in 0..end {
            if q % self.wq < s.wo {
                bits[(q / 8) as usize] |= 1 << (q % 8);
            }
        }
        bits
    }

    /// Bytes of the row pattern (whole blocks).
    fn pattern_bytes(&self, s: &ConvShape) -> u64 {
        (self.nb(s, self.rt) * 16)
            .div_ceil(8)
            .next_multiple_of(UNIT)
    }

    /// Zero units the zero area provides: the longest run any zero write reads.
    fn zero_units(&self, s: &ConvShape) -> u64 {
        let gaps = (0..s.sw as usize)
            .map(|phi| self.wq - self.nphi[phi])
            .max()
            .unwrap_or(0);
        (self.c1 * self.wq)
            .max(self.c1 * gaps)
            .max(s.sw * self.c1 * self.margin)
            .max(16)
    }

    /// Cube cycles of a tile of `r` rows with its L0 flag waits (the cube drains before each
    /// buffer is handed back, about `CUBE_DRAIN` cycles).
    fn tile_cycles(&self, s: &ConvShape, mb: u64, r: u64, kb: u64) -> u64 {
        let nb = self.nb(s, r);
        let t = self.taps();
        let full = t / kb;
        let rest = t % kb;
        let per_stage = full * (mb * kb * nb + CUBE_DRAIN)
            + if rest > 0 {
                mb * rest * nb + CUBE_DRAIN
            } else {
                0
            };
        per_stage * self.c1
    }

    /// Picks co blocks, tile height, L0 step, relayout grouping and the rows of each block.
    fn choose(&mut self, p: &Problem, core: &CoreSpec) -> Result<(), String> {
        let t = self.taps();
        self.relayout_items(&p.s, core)?;
        // The widest co block whose resident weights leave L1 room for the bands: fewer
        // passes, each reloading the bands and loading its weights before its products.
        let w_bytes = |mb: u64| mb * self.c1 * t * FRACTAL;
        let mut last = None;
        for mb in (1..=p.mg.div_ceil(16).min(MB_RESIDENT_MAX)).rev() {
            if w_bytes(mb) > core.l1_bytes * 3 / 4 {
                continue;
            }
            let mut plan = self.clone();
            match plan.choose_for(p, core, mb) {
                Ok(()) => {
                    *self = plan;
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            format!(
                "the weights of 16 output channels ({} B) do not fit three quarters of L1 ({} B)",
                w_bytes(1),
                core.l1_bytes
            )
        }))
    }

    /// `choose` for co blocks of `mb` fractals.
    fn choose_for(&mut self, p: &Problem, core: &CoreSpec, mb: u64) -> Result<(), String> {
        let s = &p.s;
        let t = self.taps();
        self.mb = mb;
        self.co_blocks = p.mg.div_ceil(16 * mb);
        // Rows per block, balanced for the dispatch stagger.
        let total = s.n * s.ho;
        let cores = core.cube_blocks();
        let row_cost =
            (self.co_blocks * mb * self.c1 * t) as f64 * self.wq as f64 / 16.0 / CUBE_EFFICIENCY;
        let groups = self.channel_groups(p, core, row_cost, total, cores);
        self.co_groups = (0..groups)
            .map(|g| {
                (
                    g * self.co_blocks / groups,
                    (g + 1) * self.co_blocks / groups,
                )
            })
            .collect();
        let widest = self.co_groups.iter().map(|(a, b)| b - a).max().unwrap_or(1);
        self.blocks = distribute(
            total,
            s.ho,
            (cores / groups).max(1).min(total),
            if groups == 1 {
                row_cost
            } else {
                row_cost * widest as f64 / self.co_blocks as f64
            },
            BLOCK_OVERHEAD_CYCLES,
            PIECE_CYCLES,
        );
        let most = self.blocks.iter().map(|(a, b)| b - a).max().unwrap_or(1);
        self.pieces = self.most_pieces(s);
        // Fixed-height band loads read up to a tile past the piece's rows. A piece's run of
        // workspace rows is a DMA gap, so where tall blocks (large batches, large maps) would
        // make it longer than the field allows, tiles are kept lower; where even one-row
        // tiles leave it too long, the workspace transfers go burst by burst.
        let mut limit = limit_rows(most, s.ho);
        loop {
            self.piece_rows = s.sh * (most.min(s.ho) + 2 * limit + self.ihi + 1);
            if self.pws() <= units::BURST_GAP_MAX || limit == 1 {
                break;
            }
            limit -= 1;
        }
        // Tile height and L0 step: the best cube rate per tile that fits, tiles no taller than
        // a third of a block's rows (so a block has tiles to overlap).
        let mut best: Option<(f64, u64, u64)> = None;
        // A tile fits when its bands do one stage at a time (stage groups are sized after).
        self.sg = 1;
        for rt in 1..=limit {
            let Some(kb) = self.l0_step(s, core, mb, rt) else {
                continue;
            };
            self.rt = rt;
            self.kb = kb;
            if self.l1_bytes(s) > core.l1_bytes || self.ub_layout(p).end > core.ub_bytes {
                continue;
            }
            let useful = (rt * s.wo * mb * 16 * self.c1 * t * 16) as f64 / 4096.0;
            let rate = useful / self.tile_cycles(s, mb, rt, kb) as f64;
            if best.is_none_or(|(r, _, _)| rate > r * 1.01) {
                best = Some((rate, rt, kb));
            }
        }
        let Some((_, rt, kb)) = best else {
            return Err(format!(
                "no tile of output rows fits the core for a {}x{} output with {} input channels \
                 (L0A {} B, L0B {} B, L0C {} B, L1 {} B, UB {} B)",
                s.ho,
                s.wo,
                p.cg,
                core.l0a_bytes,
                core.l0b_bytes,
                core.l0c_bytes,
                core.l1_bytes,
                core.ub_bytes
            ));
        };
        self.rt = rt;
        self.kb = kb;
        self.r_first = rt.div_ceil(2).max(1);
        self.r_last = (rt / 2).max(1);
        self.ub_rows = self.batch_rows(s);
        if self.ub_layout(p).end > core.ub_bytes {
            self.ub_rows = 2;
        }
        // Stage groups: as many stages as L1 holds, at most half of them, so the next tile's
        // first group loads while the current tile's second half multiplies (a whole band
        // behind one notice would hold the first tile back).
        self.sg = (1..=self.c1.div_ceil(2))
            .rev()
            .find(|&sg| {
                self.sg = sg;
                self.l1_bytes(s) <= core.l1_bytes
            })
            .unwrap_or(1);
        self.finish(s);
        Ok(())
    }

    /// Taps per L0 step for a tile of `rt` rows over `mb` co fractals (double-buffered L0A /
    /// L0B, two L0C halves next to the relayout buffers), if such a tile fits at all.
    fn l0_step(&self, s: &ConvShape, core: &CoreSpec, mb: u64, rt: u64) -> Option<u64> {
        let (l0a, l0b, l0c) = (
            core.l0a_bytes / FRACTAL,
            core.l0b_bytes / FRACTAL,
            core.l0c_bytes / FRACTAL_C,
        );
        let rl = self.cr * self.blk(s);
        let nb = self.nb(s, rt);
        let most = ((l0b - 1) / 2 / nb)
            .min(l0a.saturating_sub(2 * rl) / (2 * mb))
            .min(self.taps());
        // Steps of equal size: the two L0 buffers alternate, and a step's loads wait for the
        // product two steps back, so a large step followed by a small one (9 taps as 8 + 1)
        // leaves the big step's loads and product in series; 5 + 4 lets them overlap.
        let kb = match most {
            0 => 0,
            m => self.taps().div_ceil(self.taps().div_ceil(m)),
        };
        // The narrow drain's block transpose steps `nb` blocks per channel in one repeat.
        let narrow_ok = !self.narrow || 8 * nb <= units::REPEAT_STRIDE_MAX;
        let fits =
            kb > 0 && 2 * mb * nb + 2 * rl <= l0c && 16 * nb <= u64::from(u16::MAX) && narrow_ok;
        fits.then_some(kb)
    }

    /// Images the rows of the busiest row block touch.
    fn most_pieces(&self, s: &ConvShape) -> u64 {
        self.blocks
            .iter()
            .map(|(a, b)| (b - 1) / s.ho - a / s.ho + 1)
            .max()
            .unwrap_or(1)
    }

    /// Relayout items: as many channel blocks of a row (`cr`) as the relayout's share of L0A
    /// holds. The two relayout buffers share L0A with the two L0 steps' weights, so their
    /// share is what is left once two steps of the widest co block can each take the whole
    /// window (one step per stage, the fewest cube hand-backs), within an eighth and a quarter
    /// of L0A each.
    fn relayout_items(&mut self, s: &ConvShape, core: &CoreSpec) -> Result<(), String> {
        let blk = self.blk(s);
        let (l0a, l0c) = (core.l0a_bytes / FRACTAL, core.l0c_bytes / FRACTAL_C);
        if blk > l0a / 4 || blk > l0c / 4 {
            return Err(format!(
                "an input row of {} pixels does not fit the relayout buffers (L0A {} B, L0C {} B)",
                s.w, core.l0a_bytes, core.l0c_bytes
            ));
        }
        let window_steps = 2 * MB_RESIDENT_MAX * self.taps();
        let share = (l0a.saturating_sub(window_steps) / 2).clamp(l0a / 8, l0a / 4);
        self.cr = (share / blk).clamp(1, self.c1);
        Ok(())
    }

    /// L1 bytes the plan uses: resident weights, two stage groups, two staging areas and
    /// the identity fractal.
    fn l1_bytes(&self, s: &ConvShape) -> u64 {
        self.resident_bytes() + 2 * self.group_bytes(s) + 2 * self.staging_bytes(s) + FRACTAL
    }

    /// The plan with streamed weights (`stream`), when one fits: every block's rows are one
    /// tile of one image, the channel groups chosen by the planning estimate. Returns that
    /// estimate (cycles of the busiest block).
    fn choose_streamed(&mut self, p: &Problem, core: &CoreSpec) -> Option<f64> {
        let s = &p.s;
        let t = self.taps();
        self.relayout_items(s, core).ok()?;
        self.stream = true;
        let total = s.n * s.ho;
        let cores = core.cube_blocks();
        let fractals = p.mg.div_ceil(16);
        let mut best: Option<(f64, Plan)> = None;
        for groups in 1..=fractals.min(cores) {
            let mb = fractals.div_ceil(groups);
            // The drain's bias add steps over a fractal row's `mb` fractals in 32-byte blocks.
            if fractals.div_ceil(mb) != groups
                || (p.bias != BiasKind::None && 32 * mb > units::BLOCK_STRIDE_MAX)
            {
                continue;
            }
            let mut plan = self.clone();
            plan.mb = mb;
            plan.co_blocks = groups;
            plan.co_groups = (0..groups).map(|g| (g, g + 1)).collect();
            let row_cost = (mb * self.c1 * t) as f64 * self.wq as f64 / 16.0 / CUBE_EFFICIENCY;
            plan.blocks = distribute(
                total,
                s.ho,
                (cores / groups).max(1).min(total),
                row_cost,
                BLOCK_OVERHEAD_CYCLES,
                PIECE_CYCLES,
            );
            plan.pieces = plan.most_pieces(s);
            if plan.pieces > 1 {
                continue;
            }
            let rt = plan.blocks.iter().map(|(a, b)| b - a).max().unwrap_or(1);
            plan.piece_rows = s.sh * (rt.min(s.ho) + 2 * rt + self.ihi + 1);
            let Some(kb) = plan.l0_step(s, core, mb, rt) else {
                continue;
            };
            if plan.pws() > units::BURST_GAP_MAX {
                continue;
            }
            (plan.rt, plan.r_first, plan.r_last, plan.kb) = (rt, rt, rt, kb);
            plan.ub_rows = plan.batch_rows(s);
            if plan.ub_layout(p).end > core.ub_bytes {
                plan.ub_rows = 2;
                if plan.ub_layout(p).end > core.ub_bytes {
                    continue;
                }
            }
            // Stage groups small enough that the first is in soon and the weights stream
            // double-buffered, large enough that a group's load outlasts its notice's wait for
            // the load latency.
            let enough = GROUP_LOAD_CYCLES * core.gm_read_bytes_per_cycle.max(1);
            plan.sg = 1;
            while plan.sg < self.c1.div_ceil(2) && plan.group_bytes(s) < enough {
                plan.sg += 1;
            }
            while plan.sg > 1 && plan.l1_bytes(s) > core.l1_bytes {
                plan.sg -= 1;
            }
            if plan.l1_bytes(s) > core.l1_bytes {
                continue;
            }
            plan.finish(s);
            let e = plan.estimate(p, core);
            // A clear gain, or as fast by the estimate (which the memory floor may decide) with
            // a clearly less busy block.
            let better = best.as_ref().is_none_or(|(b, bp)| {
                e < *b * 0.95
                    || (e <= *b * 1.05
                        && plan.block_cycles(p, core) < 0.9 * bp.block_cycles(p, core))
            });
            if better {
                best = Some((e, plan));
            }
        }
        let (e, plan) = best?;
        *self = plan;
        Some(e)
    }

    /// The relayout steps and the workspace size, once the tiling is chosen.
    fn finish(&mut self, s: &ConvShape) {
        // The next tile's first group is loaded once the current tile's group G - 2 is done
        // (its buffer is free then), so its rows must be in the workspace by that step.
        let steps = self.c1 * self.steps();
        self.item_steps = if self.groups() >= 2 {
            self.group_end_step(self.groups() - 2)
        } else {
            steps.div_ceil(2)
        }
        .clamp(1, steps);
        // The next tile's rows were staged at the start of the tile before, so they are in
        // from the first step on.
        self.item_first = 0;
        self.ws_total = self.block_dim() * self.ws_block(s);
    }

    /// Passes (co blocks) of the busiest block.
    fn passes(&self) -> u64 {
        self.co_groups.iter().map(|(a, b)| b - a).max().unwrap_or(1)
    }

    /// Blocks of the kernel: every row block for every channel group.
    fn block_dim(&self) -> u64 {
        self.blocks.len() as u64 * self.co_groups.len() as u64
    }

    /// How many output-channel groups to split the co blocks into: the count whose busiest
    /// block finishes first by a planning estimate (its share of the products against its
    /// share of the weights read at one core's load rate, every block's weights sharing the
    /// chip's memory bandwidth). One group unless the rows alone leave cores idle or make
    /// every core stream all the weights.
    fn channel_groups(
        &self,
        p: &Problem,
        core: &CoreSpec,
        row_cost: f64,
        total: u64,
        cores: u64,
    ) -> u64 {
        let weights = (p.mg.div_ceil(16) * self.c1 * self.taps() * FRACTAL) as f64;
        let per_core = core.gm_read_bytes_per_cycle.max(1) as f64;
        let chip = core.memory_bytes_per_cycle.max(1) as f64;
        // Every block relayouts the input rows of its output rows, whatever its channels:
        // each input row read, written to the workspace and read back in bands.
        let s = &p.s;
        let relayout_row = (3 * s.sh * self.c1 * UNIT * s.w) as f64 / per_core;
        let estimate = |groups: u64| -> f64 {
            let row_blocks = (cores / groups).max(1).min(total);
            let rows = total.div_ceil(row_blocks) as f64;
            let share = self.co_blocks.div_ceil(groups) as f64 / self.co_blocks as f64;
            let compute = rows * row_cost * share;
            // A pass's resident weights come in before its products (behind the barrier that
            // ends the pass before), so they add to the block's time.
            let load = weights * share / per_core;
            // Weights are read from memory once; the other row blocks' reads hit the L2.
            let memory = weights / chip;
            (compute + load).max(memory)
                + rows * relayout_row
                + BLOCK_OVERHEAD_CYCLES * share * self.co_blocks as f64
        };
        let most = self.co_blocks.min(cores).max(1);
        let mut best = (estimate(1), 1);
        for groups in 2..=most {
            let e = estimate(groups);
            // A clear gain only: more groups repeat the relayout of the rows per group.
            if e < best.0 * 0.9 {
                best = (e, groups);
            }
        }
        best.1
    }
}

impl Plan {
    /// Planning estimate of the busiest block's cycles: per pass its weight load (resident
    /// weights come in before the pass's products, streamed ones overlap them) and per tile
    /// the larger of its products and its loads; the first tile's relayout; at least the
    /// time the chip's memory takes to deliver every weight once.
    fn estimate(&self, p: &Problem, core: &CoreSpec) -> f64 {
        let chip = core.memory_bytes_per_cycle.max(1) as f64;
        let all_weights = (p.mg.div_ceil(16) * self.c1 * self.taps() * FRACTAL) as f64;
        self.block_cycles(p, core).max(all_weights / chip)
    }

    /// `estimate` without the memory floor: the busiest block's own cycles.
    fn block_cycles(&self, p: &Problem, core: &CoreSpec) -> f64 {
        let s = &p.s;
        let per_core = core.gm_read_bytes_per_cycle.max(1) as f64;
        let most = self.blocks.iter().map(|(a, b)| b - a).max().unwrap_or(1);
        let tiles = if most <= self.rt {
            1.0
        } else {
            (most.div_ceil(self.rt) + 1) as f64
        };
        let passes = self.passes() as f64;
        let compute = self.tile_cycles(s, self.mb, self.rt, self.kb) as f64 / CUBE_EFFICIENCY;
        let bands = (self.c1 * self.stage_bytes(s)) as f64 / per_core;
        let weights = self.weight_bytes() as f64 / per_core;
        let relayout_row = (3 * s.sh * self.c1 * UNIT * s.w) as f64 / per_core;
        let pass = if self.stream {
            tiles * compute.max(bands + weights)
        } else {
            weights + tiles * compute.max(bands)
        };
        passes * pass + relayout_row * self.rt.min(most) as f64 + BLOCK_OVERHEAD_CYCLES * passes
    }
}

/// The tallest tile `choose` may pick for blocks of at most `most` rows.
fn limit_rows(most: u64, ho: u64) -> u64 {
    most.div_ceil(3).clamp(1, ho)
}

/// Cycles the cube pipe stalls each time it hands an L0 buffer back (the `mmad` latency that
/// `set_flag` waits for); used for planning only.
const CUBE_DRAIN: u64 = 32;
/// Output-channel fractals of a co block with resident weights, at most: wider blocks take
/// L1 from the bands and L0A from the taps of a step (the streamed plan, whose one tile reuses
/// nothing, may go wider).
const MB_RESIDENT_MAX: u64 = 4;
/// Cycles a streamed stage group's load should take at least: several times the memory
/// latency its notice waits out (planning only).
const GROUP_LOAD_CYCLES: u64 = 1500;
/// Fraction of the cube rate a tile reaches; used to balance rows per block only.
const CUBE_EFFICIENCY: f64 = 0.85;

/// UB addresses.
#[derive(Debug, Clone, Copy)]
struct UbLayout {
    out: u64,
    work: u64,
    bias: u64,
    /// Narrow drain: the output transposed to channel-major blocks, each channel's packed rows
    /// (`packed_slot` bytes apart) and the row pattern.
    transposed: u64,
    packed: u64,
    packed_slot: u64,
    pattern: u64,
    /// The first relayout row (`Plan::ub_rows` rows of `c1 · blk` fractals).
    relayout: u64,
    zero: u64,
    end: u64,
}

/// Splits `total` output rows (images of `ho` rows one after the other) over at most `blocks`
/// blocks at `row_cost` cycles a row, `overhead` per block and `piece` more where a block's
/// rows cross into another image (a second band and a tile split at the boundary).
pub(super) fn distribute(
    total: u64,
    ho: u64,
    blocks: u64,
    row_cost: f64,
    overhead: f64,
    piece: f64,
) -> Vec<(u64, u64)> {
    let pieces = |at: u64, r: u64| {
        if r == 0 {
            0
        } else {
            (at + r - 1) / ho - at / ho
        }
    };
    distribute_by(total, blocks, &|_, at, r| {
        overhead + r as f64 * row_cost + pieces(at, r) as f64 * piece
    })
}

/// Splits `total` rows over at most `blocks` blocks when rows `at..at + r` cost block `b`
/// `cost(b, at, r)` cycles: block `b` starts `b × DISPATCH_STAGGER_CYCLES` after block 0, so it
/// gets the rows that fill the time left until a common finish. Returns each block's
/// `(first, end)` row; blocks without rows are dropped.
pub(super) fn distribute_by(
    total: u64,
    blocks: u64,
    cost: &dyn Fn(u64, u64, u64) -> f64,
) -> Vec<(u64, u64)> {
    let blocks = blocks.clamp(1, total.max(1));
    // Rows of each block in order for a common finish at `t`: the most that finish by then.
    let rows_at = |t: f64| -> Vec<u64> {
        let mut at = 0;
        (0..blocks)
            .map(|b| {
                let left = t - DISPATCH_STAGGER_CYCLES * b as f64;
                let (mut lo, mut hi) = (0u64, total - at);
                // A cost need not grow with the rows (whole small images share one tile, so
                // two images can cost less than one and a part), and the search below assumes
                // it does: all the rows left, when they finish in time, are taken first.
                if cost(b, at, hi) <= left {
                    lo = hi;
                }
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    if cost(b, at, mid) <= left {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                at += lo;
                lo
            })
            .collect()
    };
    // The earliest common finish at which the blocks hold every row.
    let (mut lo, mut hi) = (
        0.0,
        DISPATCH_STAGGER_CYCLES * blocks as f64 + cost(0, 0, total) + 1.0,
    );
    for _ in 0..64 {
        let mid = (lo + hi) / 2.0;
        if rows_at(mid).iter().sum::<u64>() >= total {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let rows = rows_at(hi);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut at = 0;
    for r in rows {
        let r = r.min(total - at);
        if r > 0 {
            out.push((at, at + r));
            at += r;
        }
    }
    // Where no finish holds every row (a cost that falls as rows are added can hide the one
    // that does), the last block takes the rest: no row is left unassigned.
    match out.last_mut() {
        Some(last) => last.1 = total,
        None if total > 0 => out.push((0, total)),
        None => {}
    }
    out
}

/// Packs one group's weights in the order the kernel reads them: per co block, per input
/// channel block (stage), per L0 step, the step's `mb × kb` A fractals (`[mb][tap]`), each
/// 16 output channels × 16 input channels, zero-padded. f16 bytes.
fn pack_weights(values: &[f32], p: &Problem, plan: &Plan) -> Vec<u8> {
    let s = &p.s;
    let t = plan.taps();
    let mut out = Vec::new();
    let value = |co: u64, ci: u64, tap: &Tap| -> f32 {
        if co >= p.mg || ci >= p.cg {
            return 0.0;
        }
        let idx = (((p.m_off + co) * p.cg + ci) * s.kh + tap.i) * s.kw + tap.j;
        values[idx as usize]
    };
    for cb in 0..plan.co_blocks {
        let mbp = plan.mb_of(p, cb);
        for c1 in 0..plan.c1 {
            for step in 0..plan.steps() {
                let lo = (step * plan.kb) as usize;
                let hi = ((step + 1) * plan.kb).min(t) as usize;
                for mb in 0..mbp {
                    for tap in &plan.taps[lo..hi] {
                        for r in 0..16 {
                            let co = (cb * plan.mb + mb) * 16 + r;
                            for col in 0..16 {
                                let v = value(co, c1 * 16 + col, tap);
                                out.extend_from_slice(
                                    &half::f16::from_f32(v).to_bits().to_le_bytes(),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// L1 addresses.
#[derive(Debug, Clone, Copy)]
struct L1Layout {
    weights: u64,
    stage: [u64; 2],
    staging: [u64; 2],
    ident: u64,
}

/// L0A, L0B and L0C addresses.
#[derive(Debug, Clone, Copy)]
struct L0Layout {
    a: [u64; 2],
    b: [u64; 2],
    c: [u64; 2],
    rl_a: [u64; 2],
    rl_c: [u64; 2],
    ident: u64,
}

/// Byte offsets in the kernel's constants.
const IDENT_OFF: u64 = 0;
const WEIGHTS_OFF: u64 = FRACTAL;

/// Scalar registers, each with one role for the whole kernel.
struct Regs {
    x: Reg,
    out: Reg,
    consts: Reg,
    zero: Reg,
    /// 1 until the pass's first tile is done (its stages bring in the resident weights).
    first: Reg,
    /// The block's end row.
    rend: Reg,
    /// Current tile: first global row (`n · Ho + oh`), rows, output address, band address.
    row: Reg,
    rcur: Reg,
    cout: Reg,
    bsrc: Reg,
    /// Previous tile, whose rows the current tile's K loop writes out: output address, rows.
    pcout: Reg,
    prev_r: Reg,
    /// Next tile: first global row, rows (0: none), band address.
    nrow: Reg,
    nr: Reg,
    nband: Reg,
    /// The tile after it: rows (0: none), band address.
    nnr: Reg,
    nnband: Reg,
    /// Relayout rows of the next tile (their `nd2nz` are in): rows left, workspace row,
    /// staging row.
    rn: Reg,
    rws: Reg,
    sx: Reg,
    /// Relayout rows of the tile after it (being staged): rows, workspace row, GM row.
    rn2: Reg,
    rws2: Reg,
    rx2: Reg,
    /// The latest piece (run of rows in one image): workspace base, first and end global
    /// rows, and the padded input row the relayout has reached.
    pws: Reg,
    pstart: Reg,
    pend: Reg,
    ydone: Reg,
    t: [Reg; 4],
}

/// Writes one group's conv kernel.
struct Gen<'a> {
    a: &'a mut Asm,
    p: &'a Problem,
    plan: &'a Plan,
    s: ConvShape,
    r: Regs,
    l1: L1Layout,
    l0: L0Layout,
    ub: UbLayout,
    /// The co block being written and whether its pass relayouts the input.
    cb: u64,
    relayout: bool,
    /// Whether the current pass is the block's first (it loads what later passes reuse).
    first_pass: bool,
}

/// Whether a stage load also brings the stage's resident weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Weights {
    /// Never (preloaded: the pass's first group).
    Preloaded,
    /// Resident weights never (they came with the pass's first tile); streamed ones always.
    No,
    /// Resident weights when the tile is the pass's first (`first`); streamed ones always.
    IfFirst,
}

impl<'a> Gen<'a> {
    fn new(a: &'a mut Asm, p: &'a Problem, plan: &'a Plan, core: &CoreSpec) -> Gen<'a> {
        let s = p.s;
        let mut reg = || a.reg();
        let r = Regs {
            x: reg(),
            out: reg(),
            consts: reg(),
            zero: reg(),
            first: reg(),
            rend: reg(),
            row: reg(),
            rcur: reg(),
            cout: reg(),
            bsrc: reg(),
            pcout: reg(),
            prev_r: reg(),
            nrow: reg(),
            nr: reg(),
            nband: reg(),
            nnr: reg(),
            nnband: reg(),
            rn: reg(),
            rws: reg(),
            sx: reg(),
            rn2: reg(),
            rws2: reg(),
            rx2: reg(),
            pws: reg(),
            pstart: reg(),
            pend: reg(),
            ydone: reg(),
            t: [reg(), reg(), reg(), reg()],
        };
        let band = plan.group_bytes(&s);
        let weights = plan.resident_bytes();
        let staging = plan.staging_bytes(&s);
        let l1 = L1Layout {
            weights: 0,
            stage: [weights, weights + band],
            staging: [weights + 2 * band, weights + 2 * band + staging],
            ident: weights + 2 * band + 2 * staging,
        };
        let nb = plan.nb(&s, plan.rt);
        let blk = plan.blk(&s);
        let conv_a = plan.mb * plan.kb * FRACTAL;
        let rl_a = plan.cr * blk * FRACTAL;
        let conv_b = plan.kb * nb * FRACTAL;
        let conv_c = plan.mb * nb * FRACTAL_C;
        let rl_c = plan.cr * blk * FRACTAL_C;
        let l0 = L0Layout {
            a: [0, conv_a],
            rl_a: [2 * conv_a, 2 * conv_a + rl_a],
            b: [0, conv_b],
            ident: core.l0b_bytes - FRACTAL,
            c: [0, conv_c],
            rl_c: [2 * conv_c, 2 * conv_c + rl_c],
        };
        let ub = plan.ub_layout(p);
        Gen {
            a,
            p,
            plan,
            s,
            r,
            l1,
            l0,
            ub,
            cb: 0,
            relayout: true,
            first_pass: true,
        }
    }

    fn set(&mut self, src: Pipe, dst: Pipe, id: u8) {
        self.a.set_flag(src, dst, id);
    }

    fn wait(&mut self, src: Pipe, dst: Pipe, id: u8) {
        self.a.wait_flag(src, dst, id);
    }

    fn movi(&mut self, dst: Reg, v: u64) {
        self.a.movi(dst, v as i64);
    }

    /// `dst = src + v` (v may exceed an immediate; `tmp` may be `dst`).
    fn addi(&mut self, dst: Reg, src: Reg, v: i64, tmp: Reg) {
        if let Ok(i) = i32::try_from(v) {
            self.a.addi(dst, src, i);
        } else {
            self.a.movi(tmp, v);
            self.a.add(dst, src, tmp);
        }
    }

    /// `n` bursts of `len` units between the local buffer at `local` (`local_gap` units
    /// apart; UB, or L1 for `Dir::GmToL1`) and GM `gm_base + gm_off` (`gm_gap` units apart)
    /// as one DMA a burst, through `local_reg` and `gm_reg`: for gaps a DMA's fields cannot
    /// hold (tall pieces of large maps put the workspace's channel blocks further apart than
    /// a gap field reaches). The callers issue one DMA where the gaps fit.
    #[allow(clippy::too_many_arguments)]
    fn burst_by_burst(
        &mut self,
        dir: Dir,
        (local, local_reg): (u64, Reg),
        (gm_base, gm_off, gm_reg): (Reg, i64, Reg),
        n: u64,
        len: u64,
        local_gap: u64,
        gm_gap: u64,
    ) {
        for i in 0..n {
            self.movi(local_reg, local + i * (len + local_gap) * UNIT);
            let off = gm_off + (i * (len + gm_gap) * UNIT) as i64;
            self.addi(gm_reg, gm_base, off, gm_reg);
            match dir {
                Dir::UbToGm => self.a.copy_ub_to_gm(gm_reg, local_reg, 1, len),
                Dir::GmToL1 => self.a.copy_gm_to_l1(local_reg, gm_reg, 1, len),
            };
        }
    }

    /// `dst = src * v`.
    fn muli(&mut self, dst: Reg, src: Reg, v: u64, tmp: Reg) {
        if let Ok(i) = i32::try_from(v) {
            self.a.muli(dst, src, i);
        } else {
            self.a.movi(tmp, v as i64);
            self.a.mul(dst, src, tmp);
        }
    }

    /// Jumps to `labels[R - 1]` for the row count in `reg` (1-based).
    fn dispatch(&mut self, reg: Reg, labels: &[String]) {
        let t = self.r.t[0];
        for (i, l) in labels.iter().enumerate().take(labels.len() - 1) {
            self.movi(t, i as u64 + 1);
            let l = self.a.label(l);
            self.a.beq(reg, t, l);
        }
        let last = labels.last().cloned().unwrap_or_default();
        let l = self.a.label(&last);
        self.a.jmp(l);
    }

    /// Output-channel fractals of the current pass.
    fn mbp(&self) -> u64 {
        self.plan.mb_of(self.p, self.cb)
    }

    /// Bytes of one stage's resident weights in the current pass.
    fn stage_weights(&self) -> u64 {
        self.mbp() * self.plan.taps() * FRACTAL
    }

    /// The L1 buffer of stage group `gi` of a tile of parity `parity` (groups alternate over
    /// the block's tiles, so with an odd number of groups the parity matters).
    fn stage_buffer(&self, parity: u64, gi: u64) -> usize {
        ((parity * self.plan.groups() + gi) % 2) as usize
    }

    /// Whether a relayout row goes through the cube in one round (all its channel blocks
    /// fit the relayout buffers), so its cube work can share a K step's flags.
    fn single_round(&self) -> bool {
        self.plan.cr == self.plan.c1
    }

    fn emit(mut self) {
        let (s, plan) = (self.s, self.plan);
        let a = &mut *self.a;
        a.tiling("rows_per_tile", plan.rt as i64);
        a.tiling("first_tile_rows", plan.r_first as i64);
        a.tiling("last_tile_rows", plan.r_last as i64);
        a.tiling("row_pitch", plan.wq as i64);
        a.tiling("wo", s.wo as i64);
        a.tiling("margin", plan.margin as i64);
        a.tiling("channel_blocks", plan.c1 as i64);
        a.tiling("streamed_weights", i64::from(plan.stream));
        a.tiling("packed_rows", i64::from(plan.narrow));
        a.tiling("co_fractals", plan.mb as i64);
        a.tiling("co_blocks", plan.co_blocks as i64);
        a.tiling("taps_per_step", plan.kb as i64);
        a.tiling("stage_group", plan.sg as i64);
        a.tiling("relayout_blocks", plan.cr as i64);
        a.tiling("relayout_steps", plan.item_steps as i64);
        a.tiling("relayout_ub_rows", plan.ub_rows as i64);
        a.tiling("channel_groups", plan.co_groups.len() as i64);
        a.tiling("block_dim", plan.block_dim() as i64);
        a.tiling("ub_bytes", self.ub.end as i64);
        self.prologue();
        let groups = plan.co_groups.len() as u64;
        let end = self.a.new_label("groups_done");
        for (g, &(lo, hi)) in plan.co_groups.iter().enumerate() {
            let other = self.a.new_label("other_group");
            if groups > 1 {
                self.a.comment(format_args!(
                    "channel group {g}: co blocks {lo}..{hi} (blocks with block_idx % {groups} == {g})"
                ));
                let [t0, t1, _, _] = self.r.t;
                self.a.sreg(t0, SReg::BlockIdx);
                self.movi(t1, groups);
                self.a.remu(t0, t0, t1);
                self.movi(t1, g as u64);
                let l = self.a.label(&other);
                self.a.bne(t0, t1, l);
            }
            for cb in lo..hi {
                self.cb = cb;
                self.first_pass = cb == lo;
                self.relayout = cb == lo;
                self.pass();
            }
            if groups > 1 {
                let l = self.a.label(&end);
                self.a.jmp(l);
                self.a.place(&other);
            }
        }
        self.a.place(&end);
        self.epilogue();
    }

    fn prologue(&mut self) {
        let r = &self.r;
        let (zero, x) = (r.zero, r.x);
        let [t0, t1, t2, _] = r.t;
        // The input's address first (a scalar GM load takes hundreds of cycles, and the
        // first `nd2nz` needs only this one); the others are loaded where first needed.
        self.a.sreg(t0, SReg::Args);
        self.a.ld(Space::Gm, SType::U64, x, t0).off(arg::X * 8);
        self.movi(zero, 0);
        self.a.comment("every buffer starts free");
        for id in [ev::STAGE[0], ev::STAGE[1], ev::STAGING[0], ev::STAGING[1]] {
            self.set(Pipe::Mte1, Pipe::Mte2, id);
        }
        for id in [ev::L0[0], ev::L0[1], ev::RELAYOUT[0], ev::RELAYOUT[1]] {
            self.set(Pipe::M, Pipe::Mte1, id);
        }
        for id in [ev::TILE, ev::RELAYOUT[0], ev::RELAYOUT[1]] {
            self.set(Pipe::V, Pipe::M, id);
        }
        for id in self.mte3_to_v() {
            self.set(Pipe::Mte3, Pipe::V, id);
        }
        self.set(Pipe::Mte2, Pipe::Mte3, ev::WORKSPACE);
        if self.p.bias != BiasKind::None {
            self.set(Pipe::V, Pipe::Mte2, ev::BIAS);
        }
        self.a
            .comment("the zero area that pads, gaps and margins are written from");
        let units = self.plan.zero_units(&self.s);
        self.a.mask_count(t2, units * 16);
        self.movi(t1, self.ub.zero);
        self.a.vdup(DType::F16, t1, zero);
        self.set(Pipe::V, Pipe::Mte3, ev::ZEROED);
        self.wait(Pipe::V, Pipe::Mte3, ev::ZEROED);
        if self.plan.narrow {
            self.a.comment("the narrow drain's row pattern, once");
            let off = pattern_offset(self.plan, self.p);
            self.a.sreg(t0, SReg::Args);
            self.a
                .ld(Space::Gm, SType::U64, t1, t0)
                .off(arg::CONSTS * 8);
            self.addi(t1, t1, off as i64, t0);
            self.movi(t0, self.ub.pattern);
            let blocks = self.plan.pattern_bytes(&self.s) / units::BLOCK_BYTES;
            self.a.copy_gm_to_ub(t0, t1, 1, blocks);
            self.set(Pipe::Mte2, Pipe::V, ev::PATTERN);
            self.wait(Pipe::Mte2, Pipe::V, ev::PATTERN);
        }
    }

    fn epilogue(&mut self) {
        self.a.comment("consume the flags the last tiles set");
        for id in [ev::STAGE[0], ev::STAGE[1], ev::STAGING[0], ev::STAGING[1]] {
            self.wait(Pipe::Mte1, Pipe::Mte2, id);
        }
        for id in [ev::L0[0], ev::L0[1], ev::RELAYOUT[0], ev::RELAYOUT[1]] {
            self.wait(Pipe::M, Pipe::Mte1, id);
        }
        for id in [ev::TILE, ev::RELAYOUT[0], ev::RELAYOUT[1]] {
            self.wait(Pipe::V, Pipe::M, id);
        }
        for id in self.mte3_to_v() {
            self.wait(Pipe::Mte3, Pipe::V, id);
        }
        self.wait(Pipe::Mte2, Pipe::Mte3, ev::WORKSPACE);
        if self.p.bias != BiasKind::None {
            self.wait(Pipe::V, Pipe::Mte2, ev::BIAS);
        }
    }

    /// The MTE3 → V events: the drain buffer and the relayout rows (one notice per batch
    /// when UB holds a whole batch).
    fn mte3_to_v(&self) -> Vec<u8> {
        if self.batched() {
            vec![ev::DRAIN, ev::RELAYOUT_UB[0]]
        } else {
            vec![ev::DRAIN, ev::RELAYOUT_UB[0], ev::RELAYOUT_UB[1]]
        }
    }

    /// Whether UB holds a whole batch of relayout rows.
    fn batched(&self) -> bool {
        self.plan.ub_rows > 2
    }

    /// V: a batch of relayout rows starts (its UB rows were written out).
    fn batch_begin(&mut self) {
        if self.batched() {
            self.wait(Pipe::Mte3, Pipe::V, ev::RELAYOUT_UB[0]);
        }
    }

    /// Emits relayout row `q`'s work `f` when the batch has that row: `rn > q` in a batched
    /// batch (whose registers stay at its first row), `rn > 0` otherwise (they move on).
    fn guard_item(&mut self, q: u64, f: impl FnOnce(&mut Self)) {
        if !self.batched() {
            self.guarded(self.r.rn, f);
            return;
        }
        let (rn, t0) = (self.r.rn, self.r.t[0]);
        let skip = self.a.new_label("no_item");
        self.movi(t0, q);
        let l = self.a.label(&skip);
        self.a.bgeu(t0, rn, l);
        f(self);
        self.a.place(&skip);
    }

    /// L1 offset of relayout row `q` from `sx`.
    fn staged_row(&self, q: u64) -> u64 {
        if self.batched() {
            q * self.plan.c1 * self.plan.blk(&self.s) * FRACTAL
        } else {
            0
        }
    }

    /// The UB row of relayout row `q` of a batch in slot `slot`.
    fn ub_row(&self, slot: usize, q: u64) -> u64 {
        let row = self.plan.c1 * self.plan.blk(&self.s) * FRACTAL;
        let at = if self.batched() { q } else { slot as u64 };
        self.ub.relayout + at * row
    }

    /// MTE3 announces the next tile's workspace rows (after MTE2 took the previous notice).
    fn workspace_written(&mut self) {
        if self.batched() {
            // V's copies are all done: MTE3 writes the batch out, then hands UB back.
            self.set(Pipe::V, Pipe::Mte3, ev::BATCH);
            self.wait(Pipe::V, Pipe::Mte3, ev::BATCH);
            let (rws, t1) = (self.r.rws, self.r.t[1]);
            for q in 0..self.plan.ub_rows {
                self.guard_item(q, |k| {
                    k.addi(t1, rws, (q * k.plan.wq * UNIT) as i64, t1);
                    k.write_row(k.ub_row(0, q), t1);
                });
            }
            self.set(Pipe::Mte3, Pipe::V, ev::RELAYOUT_UB[0]);
        }
        self.wait(Pipe::Mte2, Pipe::Mte3, ev::WORKSPACE);
        self.set(Pipe::Mte3, Pipe::Mte2, ev::WORKSPACE);
    }

    /// MTE2 takes the notice that a tile's workspace rows are written.
    fn workspace_ready(&mut self) {
        self.wait(Pipe::Mte3, Pipe::Mte2, ev::WORKSPACE);
    }

    /// MTE2 tells MTE3 the notice was taken; placed behind the band load the notice was
    /// for, whose own notice has already waited out the transfers this one would stall on.
    fn workspace_taken(&mut self) {
        self.set(Pipe::Mte2, Pipe::Mte3, ev::WORKSPACE);
    }

    /// Sets `row` and `rend` to this block's rows (a branch tree over `block_idx`).
    fn block_range(&mut self) {
        let blocks = self.plan.blocks.clone();
        let [t0, t1, _, _] = self.r.t;
        let done = self.a.new_label("range_done");
        self.a.sreg(t1, SReg::BlockIdx);
        let groups = self.plan.co_groups.len() as u64;
        if groups > 1 {
            self.movi(t0, groups);
            self.a.divu(t1, t1, t0);
        }
        self.range_tree(&blocks, 0, blocks.len(), t0, t1, &done);
        self.a.place(&done);
    }

    fn range_tree(
        &mut self,
        blocks: &[(u64, u64)],
        lo: usize,
        hi: usize,
        t: Reg,
        bi: Reg,
        done: &str,
    ) {
        if hi - lo == 1 {
            self.movi(self.r.row, blocks[lo].0);
            self.movi(self.r.rend, blocks[lo].1);
            let l = self.a.label(done);
            self.a.jmp(l);
            return;
        }
        let mid = (lo + hi) / 2;
        let left = self.a.new_label("range_lo");
        self.movi(t, mid as u64);
        let l = self.a.label(&left);
        self.a.blt(bi, t, l);
        self.range_tree(blocks, mid, hi, t, bi, done);
        self.a.place(&left);
        self.range_tree(blocks, lo, mid, t, bi, done);
    }

    /// One pass over the block's rows for the current co block. The tiles form a software
    /// pipeline: while tile `t` multiplies, the rows tile `t + 1` adds go through the relayout
    /// (their `nd2nz` were issued during tile `t - 1`), tile `t + 2`'s rows are staged, tile
    /// `t - 1` drains, and the stage loads run two stages ahead, into the next tile. The loop
    /// body exists twice (tile parity), so staging slots, stage buffers, L0C halves and their
    /// events stay static.
    fn pass(&mut self) {
        let (plan, p) = (self.plan, self.p);
        let cb = self.cb;
        let r = &self.r;
        let (first, zero, consts, out) = (r.first, r.zero, r.consts, r.out);
        let (row, rend, rcur, nrow, nr) = (r.row, r.rend, r.rcur, r.nrow, r.nr);
        let (bsrc, nband, rn, rws, rn2, rws2) = (r.bsrc, r.nband, r.rn, r.rws, r.rn2, r.rws2);
        let (pws, pend, prev_r, cout, sx) = (r.pws, r.pend, r.prev_r, r.cout, r.sx);
        let [t0, t1, t2, t3] = r.t;
        self.a.comment(format_args!(
            "pass {cb}: output channels from {}",
            cb * 16 * plan.mb
        ));
        if !self.first_pass {
            // The resident weights, bias and UB buffers change: let every pipe finish first.
            self.a.pipe_barrier(Pipe::All);
        }
        self.block_range();
        // The first piece starts at the first row; its workspace address is added once the
        // first rows are on their way (the `nd2nz` needs only the input's address).
        self.movi(pws, 0);
        self.addi(pws, pws, -(plan.piece_bytes(&self.s) as i64), t0);
        self.a.mov(pend, row);
        self.movi(first, 1);
        self.movi(prev_r, 0);
        self.descriptor_with(row, rcur, true, false);
        if self.relayout {
            self.relayout_prep(row, rcur);
            self.relayout_nd2nz(0, t3, self.first_pass);
            self.a.mov(rn, rn2);
            self.a.mov(rws, rws2);
        }
        self.preload_weights();
        self.a.sreg(t2, SReg::Args);
        self.a.ld(Space::Gm, SType::U64, t3, t2).off(arg::WS * 8);
        self.a.sreg(t2, SReg::BlockIdx);
        self.muli(t2, t2, plan.ws_block(&self.s), t0);
        self.a.add(t3, t3, t2);
        self.a.add(pws, pws, t3);
        if self.relayout {
            self.a.add(rws, rws, t3);
            self.zero_piece();
        }
        self.band_address(row, bsrc);
        self.a
            .comment("the second tile: its descriptor, band and staged rows");
        let no_second = self.a.new_label("no_second");
        self.movi(nr, 0);
        self.movi(rn2, 0);
        self.a.add(nrow, row, rcur);
        let l = self.a.label(&no_second);
        self.a.bge(nrow, rend, l);
        self.descriptor(nrow, nr, false);
        if self.relayout {
            self.relayout_prep(nrow, nr);
            self.relayout_nd2nz_quiet(1, t3, false);
        }
        self.band_address(nrow, nband);
        self.a.place(&no_second);
        if self.relayout {
            self.a
                .comment("the first tile's rows through the cube to the workspace");
            self.wait(Pipe::Mte2, Pipe::Mte1, ev::STAGING[0]);
            if self.first_pass {
                // The identity, loaded behind the first `nd2nz`, reaches L0B before any row.
                self.movi(t0, self.l1.ident);
                self.movi(t1, self.l0.ident);
                self.a.load_l0b(t1, t0, 1);
            }
            self.movi(sx, self.l1.staging[0]);
            self.batch_begin();
            self.relayout_rest(0);
            self.set(Pipe::Mte1, Pipe::Mte2, ev::STAGING[0]);
            self.workspace_written();
            self.a.mov(rn, rn2);
            self.a.mov(rws, rws2);
        }
        // Needed from the first drain on only.
        if self.first_pass {
            self.a.sreg(t2, SReg::Args);
            self.a.ld(Space::Gm, SType::U64, out, t2).off(arg::OUT * 8);
        }
        if p.bias != BiasKind::None {
            self.wait(Pipe::V, Pipe::Mte2, ev::BIAS);
            let src = match p.bias {
                BiasKind::Runtime { offset } => {
                    self.a.sreg(t2, SReg::Args);
                    self.a.ld(Space::Gm, SType::U64, t0, t2).off(arg::BIAS * 8);
                    offset
                }
                _ => {
                    self.a.mov(t0, consts);
                    WEIGHTS_OFF + plan_weights_total(plan, p)
                }
            };
            self.addi(t0, t0, (src + cb * plan.mb * FRACTAL_C) as i64, t1);
            self.movi(t1, self.ub.bias);
            let len = self.mbp() * FRACTAL_C / units::BLOCK_BYTES;
            self.a.copy_gm_to_ub(t1, t0, 1, len);
            self.set(Pipe::Mte2, Pipe::V, ev::BIAS);
            self.wait(Pipe::Mte2, Pipe::V, ev::BIAS);
        }
        // A pass starts as if a tile with no rows had been drained.
        self.wait(Pipe::Mte3, Pipe::V, ev::DRAIN);
        self.set(Pipe::V, Pipe::Mte3, ev::DRAIN);
        self.tile_output(row, cout);
        if self.relayout {
            self.workspace_ready();
        }
        self.load_group(0, self.stage_buffer(0, 0), bsrc, Weights::Preloaded);
        if self.relayout {
            self.workspace_taken();
            // The second tile's staged rows (above), announced behind the first band.
            self.guarded(nr, |k| k.set(Pipe::Mte2, Pipe::Mte1, ev::STAGING[1]));
        }
        if plan.groups() > 1 {
            self.load_group(1, self.stage_buffer(0, 1), bsrc, Weights::IfFirst);
        }

        let tops = [self.a.new_label("tile_even"), self.a.new_label("tile_odd")];
        let afters = [
            self.a.new_label("after_even"),
            self.a.new_label("after_odd"),
        ];
        let pass_end = self.a.new_label("pass_end");
        let pass_done = self.a.new_label("pass_done");
        let bodies: Vec<Vec<String>> = (0..2)
            .map(|_| (0..plan.rt).map(|_| self.a.new_label("body")).collect())
            .collect();
        for parity in 0..2usize {
            self.iteration(parity, &tops, &afters[parity], &bodies[parity], &pass_end);
        }

        self.a.place(&pass_end);
        self.a.comment("the last tile's rows");
        self.wait(Pipe::V, Pipe::Mte3, ev::DRAIN);
        for r in (0..plan.rt).rev() {
            self.guarded_drain_row(r);
        }
        self.set(Pipe::Mte3, Pipe::V, ev::DRAIN);
        if p.bias != BiasKind::None {
            self.set(Pipe::V, Pipe::Mte2, ev::BIAS);
        }
        let l = self.a.label(&pass_done);
        self.a.jmp(l);

        for parity in 0..2usize {
            for rows in 1..=plan.rt {
                self.a.place(&bodies[parity][(rows - 1) as usize]);
                self.body(parity, rows);
                let l = self.a.label(&afters[parity]);
                self.a.jmp(l);
            }
        }
        self.a.place(&pass_done);
        let _ = zero;
    }

    /// One loop iteration (tile parity `parity`): stage the tile after next, run the tile's
    /// body for its height, drain it, move every register one tile on.
    fn iteration(
        &mut self,
        parity: usize,
        tops: &[String; 2],
        after: &str,
        bodies: &[String],
        pass_end: &str,
    ) {
        let r = &self.r;
        let (zero, first, row, rend, rcur, nrow, nr, nnr) =
            (r.zero, r.first, r.row, r.rend, r.rcur, r.nrow, r.nr, r.nnr);
        let (bsrc, nband, nnband, rn, rws, rn2, rws2, sx) =
            (r.bsrc, r.nband, r.nnband, r.rn, r.rws, r.rn2, r.rws2, r.sx);
        let (cout, pcout, prev_r) = (r.cout, r.pcout, r.prev_r);
        self.a.place(&tops[parity]);
        self.a
            .comment("the tile after next: its descriptor, band and staged rows");
        let staged = self.a.new_label("staged");
        self.movi(nnr, 0);
        self.movi(rn2, 0);
        let l = self.a.label(&staged);
        self.a.beq(nr, zero, l);
        self.a.add(sx, nrow, nr);
        let l = self.a.label(&staged);
        self.a.bge(sx, rend, l);
        self.descriptor(sx, nnr, false);
        if self.relayout {
            // Its rows are staged from the body, behind the loads the current and next
            // tiles need sooner.
            self.relayout_prep(sx, nnr);
            let (rx2, t3) = (self.r.rx2, self.r.t[3]);
            self.a.mov(rx2, t3);
        }
        self.band_address(sx, nnband);
        self.a.place(&staged);
        self.dispatch(rcur, bodies);
        self.a.place(after);
        self.drain_copy(parity);
        self.a.mov(pcout, cout);
        self.a.mov(prev_r, rcur);
        let l = self.a.label(pass_end);
        self.a.beq(nr, zero, l);
        self.movi(first, 0);
        self.a.mov(row, nrow);
        self.a.mov(rcur, nr);
        self.a.mov(bsrc, nband);
        self.a.add(nrow, row, rcur);
        self.a.mov(nr, nnr);
        self.a.mov(nband, nnband);
        if self.relayout {
            self.a.mov(rn, rn2);
            self.a.mov(rws, rws2);
        }
        self.tile_output(row, cout);
        let l = self.a.label(&tops[1 - parity]);
        self.a.jmp(l);
    }

    /// From the global row in `rin`: starts a new piece when `rin` is the previous piece's end
    /// (zeroing its margins and pad rows in the relayout pass), then sets `rout` to the tile's
    /// rows: the piece's remaining rows split into even tiles of at most RT (at most RF for a
    /// pass's first tile, so the pipeline fills quickly).
    fn descriptor(&mut self, rin: Reg, rout: Reg, first: bool) {
        self.descriptor_with(rin, rout, first, true);
    }

    /// `descriptor`, zeroing a new piece only with `zero_new` (the pass's first piece is
    /// zeroed once the workspace address is known).
    fn descriptor_with(&mut self, rin: Reg, rout: Reg, first: bool, zero_new: bool) {
        let s = self.s;
        let r = &self.r;
        let (pws, pstart, pend, rend, ydone) = (r.pws, r.pstart, r.pend, r.rend, r.ydone);
        let [t0, t1, t2, t3] = r.t;
        let same = self.a.new_label("same_piece");
        let l = self.a.label(&same);
        self.a.bne(rin, pend, l);
        self.movi(t0, s.ho);
        self.a.divu(t1, rin, t0);
        self.a.mul(t2, t1, t0);
        self.a.sub(t2, rin, t2);
        let piece = self.plan.piece_bytes(&s);
        self.addi(pws, pws, piece as i64, t3);
        self.a.mov(pstart, rin);
        self.a.addi(t3, t1, 1);
        self.a.mul(t3, t3, t0);
        self.a.minu(pend, t3, rend);
        self.muli(ydone, t2, s.sh, t3);
        if self.relayout && zero_new {
            self.zero_piece();
        }
        self.a.place(&same);
        // The block's last tile is kept short (its drain is the block's tail): the rows before
        // it are split evenly, rows = ceil(left' / ceil(left' / RT)).
        let even = self.a.new_label("even_split");
        self.a.sub(t3, pend, rin);
        self.a.mov(t2, t3);
        let l = self.a.label(&even);
        self.a.bne(pend, rend, l);
        self.movi(t0, self.plan.r_last);
        let l = self.a.label(&even);
        self.a.bgeu(t0, t3, l);
        self.a.sub(t2, t3, t0);
        self.a.place(&even);
        self.movi(t0, self.plan.rt);
        self.a.add(t1, t2, t0);
        self.a.addi(t1, t1, -1);
        self.a.divu(t1, t1, t0);
        self.a.add(rout, t2, t1);
        self.a.addi(rout, rout, -1);
        self.a.divu(rout, rout, t1);
        if first {
            // A short first tile fills the pipeline sooner, unless it would leave a shorter
            // remainder of a piece that fits one tile.
            let keep = self.a.new_label("keep_first");
            self.movi(t0, self.plan.r_first);
            self.a.minu(rout, rout, t0);
            self.a.sub(t1, t3, rout);
            let l = self.a.label(&keep);
            self.a.bgeu(t1, t0, l);
            self.movi(t0, self.plan.rt);
            let l = self.a.label(&keep);
            self.a.bltu(t0, t3, l);
            self.a.mov(rout, t3);
            self.a.place(&keep);
        }
    }

    /// Zeroes a new piece's margins and its pad rows (above and below the image) in the
    /// workspace. Uses the registers of the batch being prepared (`nnr`, `rn2`, `rws2`) as
    /// scratch: `descriptor` runs before they are set.
    fn zero_piece(&mut self) {
        let (s, plan) = (self.s, self.plan);
        let r = &self.r;
        let (pws, pstart, pend, zero) = (r.pws, r.pstart, r.pend, r.zero);
        let (top_rows, bottom_rows, bottom_at) = (r.nnr, r.rn2, r.rws2);
        let [t0, t1, t2, t3] = r.t;
        let pws_units = plan.pws();
        if plan.margin > 0 && pws_units - plan.margin <= units::BURST_GAP_MAX {
            self.movi(t0, self.ub.zero);
            self.a
                .copy_ub_to_gm(pws, t0, s.sw * plan.c1, plan.margin)
                .src_gap(0)
                .dst_gap(pws_units - plan.margin);
        } else if plan.margin > 0 {
            self.burst_by_burst(
                Dir::UbToGm,
                (self.ub.zero, t0),
                (pws, 0, t1),
                s.sw * plan.c1,
                plan.margin,
                0,
                pws_units - plan.margin,
            );
        }
        // t2 = sh·a (the piece's first padded row), t3 = its end padded row.
        self.movi(t0, s.ho);
        self.a.divu(t1, pstart, t0);
        self.a.mul(t1, t1, t0);
        self.a.sub(t2, pstart, t1);
        self.a.sub(t3, pend, t1);
        self.addi(t3, t3, plan.ihi as i64, t0);
        self.muli(t3, t3, s.sh, t0);
        self.movi(t0, plan.hp);
        self.a.minu(t3, t3, t0);
        self.muli(t2, t2, s.sh, t0);
        // Top pads: rows sh·a .. min(pt, end), from the piece's first row.
        self.movi(t0, s.pt);
        self.a.minu(t0, t0, t3);
        self.a.sub(top_rows, t0, t2);
        // Bottom pads: rows max(pt + h, sh·a) .. end, from that row.
        self.movi(t0, s.pt + s.h);
        self.a.max(t0, t0, t2);
        self.a.sub(bottom_rows, t3, t0);
        self.a.sub(t0, t0, t2);
        self.muli(t0, t0, plan.wq * UNIT, t1);
        self.a.add(bottom_at, pws, t0);
        self.addi(bottom_at, bottom_at, (plan.margin * UNIT) as i64, t0);
        for (rows, at) in [(top_rows, None), (bottom_rows, Some(bottom_at))] {
            let skip = self.a.new_label("no_pad");
            let top = self.a.new_label("pad_row");
            let l = self.a.label(&skip);
            self.a.bge(zero, rows, l);
            match at {
                None => self.addi(t1, pws, (plan.margin * UNIT) as i64, t0),
                Some(reg) => {
                    self.a.mov(t1, reg);
                }
            }
            self.a.place(&top);
            self.zero_row(t1, t2, t3);
            let l = self.a.label(&top);
            self.a.r#loop(rows, l);
            self.a.place(&skip);
        }
    }

    /// Writes zeros over the workspace row at `addr` (every column phase and channel block)
    /// and moves `addr` to the next row.
    fn zero_row(&mut self, addr: Reg, dst: Reg, zeros: Reg) {
        let (s, plan) = (self.s, self.plan);
        let pws_units = plan.pws();
        self.movi(zeros, self.ub.zero);
        for phi in 0..s.sw {
            let phase = (phi * plan.c1 * pws_units * UNIT) as i64;
            if pws_units - plan.wq > units::BURST_GAP_MAX {
                let (n, len, gap) = (plan.c1, plan.wq, pws_units - plan.wq);
                let (local, gm) = ((self.ub.zero, zeros), (addr, phase, dst));
                self.burst_by_burst(Dir::UbToGm, local, gm, n, len, 0, gap);
                continue;
            }
            self.addi(dst, addr, phase, dst);
            self.a
                .copy_ub_to_gm(dst, zeros, plan.c1, plan.wq)
                .src_gap(0)
                .dst_gap(pws_units - plan.wq);
        }
        self.addi(addr, addr, (plan.wq * UNIT) as i64, dst);
    }

    /// For the tile at global row `rin` of `rr` rows: the data rows its relayout adds (`rn2`),
    /// the workspace row of the first (`rws2`) and, in `t3`, its GM address; advances `ydone`.
    fn relayout_prep(&mut self, rin: Reg, rr: Reg) {
        let (s, plan, p) = (self.s, self.plan, self.p);
        let r = &self.r;
        let (x, pws, pstart, ydone, rn, rws, zero) =
            (r.x, r.pws, r.pstart, r.ydone, r.rn2, r.rws2, r.zero);
        let [t0, t1, t2, t3] = r.t;
        self.movi(t0, s.ho);
        self.a.divu(t1, rin, t0);
        self.a.mul(t2, t1, t0);
        self.a.sub(t3, rin, t2);
        // t3 = the padded row after the tile's last band row.
        self.a.add(t3, t3, rr);
        self.addi(t3, t3, plan.ihi as i64, t0);
        self.muli(t3, t3, s.sh, t0);
        self.movi(t0, plan.hp);
        self.a.minu(t3, t3, t0);
        // First and end data rows (padded): max(ydone, pt), min(end, pt + h).
        self.movi(t0, s.pt);
        self.a.max(t0, ydone, t0);
        self.movi(t2, s.pt + s.h);
        self.a.minu(t2, t2, t3);
        self.a.sub(rn, t2, t0);
        self.a.max(rn, rn, zero);
        self.a.max(ydone, ydone, t3);
        // rws = pws + (margin + (first - sh·a)·wq)·32
        self.movi(t3, s.ho);
        self.a.mul(t2, t1, t3);
        self.a.sub(t2, pstart, t2);
        self.muli(t2, t2, s.sh, t3);
        self.a.sub(t2, t0, t2);
        self.muli(t2, t2, plan.wq * UNIT, t3);
        self.a.add(rws, pws, t2);
        self.addi(rws, rws, (plan.margin * UNIT) as i64, t3);
        // t3 = x + ((n·C + c_off)·h + first - pt)·w·2
        self.muli(t1, t1, s.c, t3);
        self.addi(t1, t1, p.c_off as i64, t3);
        self.muli(t1, t1, s.h, t3);
        self.a.add(t1, t1, t0);
        self.addi(t1, t1, -(s.pt as i64), t3);
        self.muli(t1, t1, s.w * 2, t3);
        self.a.add(t3, x, t1);
    }

    /// MTE2: the batch `relayout_prep` described (`rn2` rows from the GM address in `src`)
    /// into staging slot `slot`, one `nd2nz` per row (every channel). The first batch also
    /// brings the identity fractal (the constants' address is loaded while the rows are in
    /// flight).
    fn relayout_nd2nz(&mut self, slot: usize, src: Reg, with_ident: bool) {
        self.relayout_nd2nz_quiet(slot, src, with_ident);
        self.set(Pipe::Mte2, Pipe::Mte1, ev::STAGING[slot]);
    }

    /// `relayout_nd2nz` without its notice, which the caller sets later: a notice stalls
    /// MTE2 until its transfers are complete, so it is placed behind loads that are needed
    /// sooner.
    fn relayout_nd2nz_quiet(&mut self, slot: usize, src: Reg, with_ident: bool) {
        let (s, plan, p) = (self.s, self.plan, self.p);
        let r = &self.r;
        let (rn2, zero, consts) = (r.rn2, r.zero, r.consts);
        let [t0, t1, t2, t3] = r.t;
        self.a.comment("relayout: a batch of input rows into L1");
        if src != t3 {
            self.a.mov(t3, src);
        }
        self.wait(Pipe::Mte1, Pipe::Mte2, ev::STAGING[slot]);
        self.movi(t1, self.l1.staging[slot]);
        self.a.mov(t2, rn2);
        let skip = self.a.new_label("no_rows");
        let top = self.a.new_label("nd2nz");
        let l = self.a.label(&skip);
        self.a.beq(t2, zero, l);
        self.a.place(&top);
        self.a
            .copy_gm_to_l1_nd2nz(t1, t3, p.cg, s.w, s.h * s.w, 16 * plan.c1);
        self.addi(t3, t3, (s.w * 2) as i64, t0);
        self.addi(t1, t1, (plan.c1 * plan.blk(&s) * FRACTAL) as i64, t0);
        let l = self.a.label(&top);
        self.a.r#loop(t2, l);
        self.a.place(&skip);
        if with_ident {
            self.a.sreg(t2, SReg::Args);
            self.a
                .ld(Space::Gm, SType::U64, consts, t2)
                .off(arg::CONSTS * 8);
            self.movi(t1, self.l1.ident);
            self.addi(t0, consts, IDENT_OFF as i64, t0);
            self.a
                .copy_gm_to_l1(t1, t0, 1, FRACTAL / units::BLOCK_BYTES);
        }
    }

    /// Every relayout row left (`rn`) from row `q0` of the batch: unrolled to the batch's
    /// largest size when UB holds it (each row has its own UB row), else two at a time
    /// (alternating slots).
    fn relayout_rest(&mut self, q0: u64) {
        let (rn, zero) = (self.r.rn, self.r.zero);
        if self.batched() {
            for q in q0..self.plan.ub_rows {
                self.guard_item(q, |k| k.relayout_item((q % 2) as usize, q));
            }
            return;
        }
        let top = self.a.new_label("relayout_rest");
        let done = self.a.new_label("relayout_done");
        self.a.place(&top);
        let l = self.a.label(&done);
        self.a.beq(rn, zero, l);
        self.relayout_item(0, 0);
        let l = self.a.label(&done);
        self.a.beq(rn, zero, l);
        self.relayout_item(1, 1);
        let l = self.a.label(&top);
        self.a.jmp(l);
        self.a.place(&done);
    }

    /// One staged input row (at `sx`) through the cube and out to its workspace row: one
    /// round when all its channel blocks fit the relayout buffers, else a round per group.
    fn relayout_item(&mut self, slot: usize, q: u64) {
        if self.single_round() {
            self.item_mte1(slot, q);
            self.item_m(slot);
            self.item_m_sets(slot);
            self.item_tail(slot, q);
            return;
        }
        let (s, plan) = (self.s, self.plan);
        let [_, t1, t2, t3] = self.r.t;
        let blk = plan.blk(&s);
        let ub_row = self.ub_row(slot, q);
        let mut g0 = 0;
        let mut item = 0;
        while g0 < plan.c1 {
            let g1 = (g0 + plan.cr).min(plan.c1);
            let id = ev::RELAYOUT[item % 2];
            let (la, lc) = (self.l0.rl_a[item % 2], self.l0.rl_c[item % 2]);
            self.wait(Pipe::M, Pipe::Mte1, id);
            self.transpose_blocks(la, q, g0..g1);
            self.set(Pipe::Mte1, Pipe::M, id);
            self.wait(Pipe::Mte1, Pipe::M, id);
            self.wait(Pipe::V, Pipe::M, id);
            self.movi(t1, self.l0.ident);
            for c in g0..g1 {
                self.movi(t2, lc + (c - g0) * blk * FRACTAL_C);
                self.movi(t3, la + (c - g0) * blk * FRACTAL);
                self.a.mmad(t2, t3, t1, 16 * blk, 16, 16).init(true);
            }
            self.set(Pipe::M, Pipe::Mte1, id);
            self.set(Pipe::M, Pipe::V, id);
            self.wait(Pipe::M, Pipe::V, id);
            if g0 == 0 && !self.batched() {
                self.wait(Pipe::Mte3, Pipe::V, ev::RELAYOUT_UB[slot]);
            }
            self.movi(t2, ub_row + g0 * blk * FRACTAL);
            self.movi(t3, lc);
            self.a.copy_l0c_to_ub(DType::F16, t2, t3, (g1 - g0) * blk);
            self.set(Pipe::V, Pipe::M, id);
            g0 = g1;
            item += 1;
        }
        if !self.batched() {
            self.set(Pipe::V, Pipe::Mte3, ev::RELAYOUT_UB[slot]);
            self.item_write(slot);
        }
    }

    /// MTE1 of a one-round relayout row: every channel block of the staged row transposed
    /// into the relayout L0A buffer of `slot`.
    fn item_mte1(&mut self, slot: usize, q: u64) {
        let plan = self.plan;
        let id = ev::RELAYOUT[slot];
        let la = self.l0.rl_a[slot];
        self.wait(Pipe::M, Pipe::Mte1, id);
        self.transpose_blocks(la, q, 0..plan.c1);
        self.set(Pipe::Mte1, Pipe::M, id);
    }

    /// MTE1: channel blocks `cs` of staged relayout row `q` (at `sx`), each transposed into
    /// the relayout L0A buffer at `la`, the first of them at its start.
    fn transpose_blocks(&mut self, la: u64, q: u64, cs: std::ops::Range<u64>) {
        let (s, plan) = (self.s, self.plan);
        let sx = self.r.sx;
        let [_, _, t2, t3] = self.r.t;
        let blk = plan.blk(&s);
        let first = cs.start;
        for c in cs {
            self.movi(t2, la + (c - first) * blk * FRACTAL);
            self.addi(t3, sx, (self.staged_row(q) + c * FRACTAL) as i64, t3);
            self.a
                .load_l0a(t2, t3, blk)
                .src_stride(plan.c1)
                .dst_stride(1)
                .transpose(true);
        }
    }

    /// M of a one-round relayout row: the transposed blocks times the identity into L0C.
    fn item_m(&mut self, slot: usize) {
        let (s, plan) = (self.s, self.plan);
        let [_, t1, t2, t3] = self.r.t;
        let blk = plan.blk(&s);
        let id = ev::RELAYOUT[slot];
        let (la, lc) = (self.l0.rl_a[slot], self.l0.rl_c[slot]);
        self.wait(Pipe::Mte1, Pipe::M, id);
        self.wait(Pipe::V, Pipe::M, id);
        self.movi(t1, self.l0.ident);
        for c in 0..plan.c1 {
            self.movi(t2, lc + c * blk * FRACTAL_C);
            self.movi(t3, la + c * blk * FRACTAL);
            self.a.mmad(t2, t3, t1, 16 * blk, 16, 16).init(true);
        }
    }

    /// M's notices of a one-round relayout row (right after a K step's, so the cube drains
    /// once for both).
    fn item_m_sets(&mut self, slot: usize) {
        let id = ev::RELAYOUT[slot];
        self.set(Pipe::M, Pipe::Mte1, id);
        self.set(Pipe::M, Pipe::V, id);
    }

    /// V and MTE3 of a one-round relayout row: L0C to UB as f16, then to the workspace.
    fn item_tail(&mut self, slot: usize, q: u64) {
        let (s, plan) = (self.s, self.plan);
        let [_, _, t2, t3] = self.r.t;
        let blk = plan.blk(&s);
        let id = ev::RELAYOUT[slot];
        self.wait(Pipe::M, Pipe::V, id);
        if !self.batched() {
            self.wait(Pipe::Mte3, Pipe::V, ev::RELAYOUT_UB[slot]);
        }
        self.movi(t2, self.ub_row(slot, q));
        self.movi(t3, self.l0.rl_c[slot]);
        self.a.copy_l0c_to_ub(DType::F16, t2, t3, plan.c1 * blk);
        self.set(Pipe::V, Pipe::M, id);
        if !self.batched() {
            self.set(Pipe::V, Pipe::Mte3, ev::RELAYOUT_UB[slot]);
            self.item_write(slot);
        }
    }

    /// MTE3: the relayouted row in UB slot `slot` to its workspace row; then the batch
    /// registers move to the next row.
    fn item_write(&mut self, slot: usize) {
        let (s, plan) = (self.s, self.plan);
        let (sx, rn, rws) = (self.r.sx, self.r.rn, self.r.rws);
        let t3 = self.r.t[3];
        let blk = plan.blk(&s);
        self.wait(Pipe::V, Pipe::Mte3, ev::RELAYOUT_UB[slot]);
        self.write_row(self.ub_row(slot, 0), rws);
        self.set(Pipe::Mte3, Pipe::V, ev::RELAYOUT_UB[slot]);
        self.addi(sx, sx, (plan.c1 * blk * FRACTAL) as i64, t3);
        self.addi(rws, rws, (plan.wq * UNIT) as i64, t3);
        self.a.addi(rn, rn, -1);
    }

    /// MTE3: the relayouted row at UB address `ub_row` to the workspace row at `rws` (every
    /// column phase, with the zeros after the data).
    fn write_row(&mut self, ub_row: u64, rws: Reg) {
        let (s, plan) = (self.s, self.plan);
        let [_, _, t2, t3] = self.r.t;
        let blk = plan.blk(&s);
        let pws_units = plan.pws();
        let (w, pad) = (s.w, plan.wq - s.w);
        let gaps_fit = pws_units - w <= units::BURST_GAP_MAX
            && (pad == 0 || pws_units - pad <= units::BURST_GAP_MAX);
        if s.sw == 1 && !gaps_fit {
            let c1 = plan.c1;
            let data = (ub_row, t2);
            self.burst_by_burst(
                Dir::UbToGm,
                data,
                (rws, 0, t3),
                c1,
                w,
                blk * 16 - w,
                pws_units - w,
            );
            if pad > 0 {
                let (zeros, gm) = ((self.ub.zero, t2), (rws, (w * UNIT) as i64, t3));
                self.burst_by_burst(Dir::UbToGm, zeros, gm, c1, pad, 0, pws_units - pad);
            }
        } else if s.sw == 1 {
            self.movi(t2, ub_row);
            self.a
                .copy_ub_to_gm(rws, t2, plan.c1, s.w)
                .src_gap(blk * 16 - s.w)
                .dst_gap(pws_units - s.w);
            if plan.wq > s.w {
                self.addi(t3, rws, (s.w * UNIT) as i64, t3);
                self.movi(t2, self.ub.zero);
                self.a
                    .copy_ub_to_gm(t3, t2, plan.c1, plan.wq - s.w)
                    .src_gap(0)
                    .dst_gap(pws_units - (plan.wq - s.w));
            }
        } else {
            for phi in 0..s.sw {
                let n = plan.nphi[phi as usize];
                for c in 0..plan.c1 {
                    let dst = ((phi * plan.c1 + c) * pws_units * UNIT) as i64;
                    if n > 0 {
                        let src = ub_row + c * blk * FRACTAL + plan.x0[phi as usize] * UNIT;
                        self.movi(t2, src);
                        self.addi(t3, rws, dst, t3);
                        self.a
                            .copy_ub_to_gm(t3, t2, n, 1)
                            .src_gap(s.sw - 1)
                            .dst_gap(0);
                    }
                    if plan.wq > n {
                        self.addi(t3, rws, dst + (n * UNIT) as i64, t3);
                        self.movi(t2, self.ub.zero);
                        self.a.copy_ub_to_gm(t3, t2, 1, plan.wq - n);
                    }
                }
            }
        }
    }

    /// `dst` = the output address of the tile at global row `rin` (the pass's channels).
    fn tile_output(&mut self, rin: Reg, dst: Reg) {
        let (s, plan, p) = (self.s, self.plan, self.p);
        let out = self.r.out;
        let [t0, t1, t2, t3] = self.r.t;
        let es = p.out.bytes();
        let plane = s.ho * s.wo * es;
        self.movi(t0, s.ho);
        self.a.divu(t1, rin, t0);
        self.a.mul(t2, t1, t0);
        self.a.sub(t2, rin, t2);
        self.muli(t1, t1, s.m * plane, t3);
        self.a.add(dst, out, t1);
        let channel = p.m_off + self.cb * 16 * plan.mb;
        self.addi(dst, dst, (channel * plane) as i64, t3);
        self.muli(t2, t2, s.wo * es, t3);
        self.a.add(dst, dst, t2);
    }

    /// `dst` = the workspace address of the band of the tile at global row `rin` (the first
    /// row of plane 0, channel block 0, in the latest piece).
    fn band_address(&mut self, rin: Reg, dst: Reg) {
        let (s, plan) = (self.s, self.plan);
        let (pws, pstart) = (self.r.pws, self.r.pstart);
        let [t0, _, _, t3] = self.r.t;
        self.a.sub(t0, rin, pstart);
        self.muli(t0, t0, s.sh * plan.wq * UNIT, t3);
        self.a.add(dst, pws, t0);
        self.addi(dst, dst, (plan.margin * UNIT) as i64, t3);
    }

    /// MTE2: stage group `gi` of the tile whose band is at `band` into L1 buffer `sb`, behind
    /// one notice; with `Weights::IfFirst` on the pass's first tile also the group's resident
    /// weights.
    fn load_group(&mut self, gi: u64, sb: usize, band: Reg, weights: Weights) {
        let plan = self.plan;
        let (first, zero) = (self.r.first, self.r.zero);
        self.wait(Pipe::Mte1, Pipe::Mte2, ev::STAGE[sb]);
        let stages = gi * plan.sg..((gi + 1) * plan.sg).min(plan.c1);
        if self.s.sh == 1 && self.s.sw == 1 && plan.pws() >= plan.band_units() {
            self.load_stages(stages.clone(), self.l1.stage[sb], band);
        } else {
            for stage in stages.clone() {
                let at = self.l1.stage[sb] + (stage - stages.start) * plan.stage_bytes(&self.s);
                self.load_stage(stage, at, band);
            }
        }
        if plan.stream && weights != Weights::Preloaded {
            self.weights_load(stages, sb);
        } else if weights == Weights::IfFirst {
            let skip = self.a.new_label("weights_resident");
            let l = self.a.label(&skip);
            self.a.beq(first, zero, l);
            self.weights_load(stages, sb);
            self.a.place(&skip);
        }
        self.set(Pipe::Mte2, Pipe::Mte1, ev::STAGE[sb]);
    }

    /// MTE2: stage `stage` (channel block) of the tile whose band is at `band` to L1 address
    /// `at`, every plane, tall enough for the tallest tile.
    fn load_stage(&mut self, stage: u64, at: u64, band: Reg) {
        let (s, plan) = (self.s, self.plan);
        let [t0, t1, t2, _] = self.r.t;
        let pws_units = plan.pws();
        let band_units = plan.band_units();
        let rows = plan.rt + plan.ihi;
        for rho in 0..s.sh {
            for phi in 0..s.sw {
                let plane = rho * s.sw + phi;
                let dst = at + plane * band_units * UNIT;
                let src = (((phi * plan.c1 + stage) * pws_units + rho * plan.wq) * UNIT) as i64
                    - (plan.margin * UNIT) as i64;
                self.movi(t0, dst);
                self.addi(t1, band, src, t1);
                if s.sh == 1 {
                    self.a
                        .copy_gm_to_l1(t0, t1, 1, plan.margin + rows * plan.wq);
                } else {
                    if plan.margin > 0 {
                        self.a.copy_gm_to_l1(t0, t1, 1, plan.margin);
                    }
                    self.addi(t0, t0, (plan.margin * UNIT) as i64, t2);
                    self.addi(t1, t1, (plan.margin * UNIT) as i64, t2);
                    self.a
                        .copy_gm_to_l1(t0, t1, rows, plan.wq)
                        .src_gap((s.sh - 1) * plan.wq)
                        .dst_gap(0);
                }
            }
        }
    }

    /// MTE2: stages `stages` of a stride-1 tile (one plane) whose band is at `band` to L1
    /// address `at`, as one burst per stage: the stages' runs sit a piece's channel-block
    /// pitch apart in the workspace and back to back in L1, so one instruction moves the group
    /// (fewer, larger transfers keep MTE2's queue from holding the scalar unit up).
    fn load_stages(&mut self, stages: std::ops::Range<u64>, at: u64, band: Reg) {
        let plan = self.plan;
        let [t0, t1, _, _] = self.r.t;
        let len = plan.band_units();
        let src = (stages.start * plan.pws() * UNIT) as i64 - (plan.margin * UNIT) as i64;
        if plan.pws() - len > units::BURST_GAP_MAX {
            let n = stages.end - stages.start;
            let gap = plan.pws() - len;
            self.burst_by_burst(Dir::GmToL1, (at, t0), (band, src, t1), n, len, 0, gap);
            return;
        }
        self.movi(t0, at);
        self.addi(t1, band, src, t1);
        self.a
            .copy_gm_to_l1(t0, t1, stages.end - stages.start, len)
            .src_gap(plan.pws() - len)
            .dst_gap(0);
    }

    /// The L1 address of stage `stage`'s weights of the current pass: resident, or after the
    /// bands in stage-group buffer `sb` when they stream.
    fn l1_weights(&self, stage: u64, sb: usize) -> u64 {
        let plan = self.plan;
        if plan.stream {
            let gi = stage / plan.sg;
            self.l1.stage[sb]
                + plan.sg * plan.stage_bytes(&self.s)
                + (stage - gi * plan.sg) * self.stage_weights()
        } else {
            self.l1.weights + stage * self.stage_weights()
        }
    }

    /// MTE2: stages `stages`' weights of the current pass into L1 (stage-group buffer `sb`
    /// when they stream). They are consecutive in GM and in L1, so they move in as few bursts
    /// as the burst length allows.
    fn weights_load(&mut self, stages: std::ops::Range<u64>, sb: usize) {
        let plan = self.plan;
        let consts = self.r.consts;
        let [t0, t1, _, _] = self.r.t;
        let sw_units = self.stage_weights() / units::BLOCK_BYTES;
        let per_burst = (units::BURST_LEN_MAX / sw_units).max(1);
        let mut stage = stages.start;
        while stage < stages.end {
            let n = per_burst.min(stages.end - stage);
            let gm = WEIGHTS_OFF + self.cb * plan.weight_bytes() + stage * self.stage_weights();
            let dst = self.l1_weights(stage, sb);
            self.movi(t0, dst);
            self.addi(t1, consts, gm as i64, t1);
            self.a.copy_gm_to_l1(t0, t1, 1, n * sw_units);
            stage += n;
        }
    }

    /// MTE2: the first stage group's weights ahead of the first band load (they need no
    /// relayout, so they are off the first tile's critical path); the group's flag covers them.
    fn preload_weights(&mut self) {
        self.a.comment("the first stage group's resident weights");
        let sb = self.stage_buffer(0, 0);
        self.weights_load(0..self.plan.sg.min(self.plan.c1), sb);
    }

    /// The K loop of a tile of `rows` rows (parity `parity`), with the pipelines' other work
    /// at static points between its L0 steps: one relayout row of the next tile per step
    /// (sharing the step's cube notices), the rest of them and the next tile's workspace
    /// notice after `item_steps` steps, stage loads two stages ahead (into the next tile),
    /// and the previous tile's output rows.
    fn body(&mut self, parity: usize, rows: u64) {
        let plan = self.plan;
        let (nr, nband, bsrc, sx) = (self.r.nr, self.r.nband, self.r.bsrc, self.r.sx);
        let steps = plan.steps();
        let total = plan.c1 * steps;
        let next = 1 - parity;
        self.a.comment(format_args!("tile of {rows} rows"));
        let staged = |k: &mut Self| {
            // MTE1 takes the next tile's staged rows just before its first relayout row.
            k.wait(Pipe::Mte2, Pipe::Mte1, ev::STAGING[next]);
            k.movi(sx, k.l1.staging[next]);
            k.batch_begin();
        };
        let mut next_row = plan.rt;
        if self.relayout {
            // The tile after next's rows are staged first: MTE2 would otherwise hold them
            // behind the wait for the next tile's workspace rows.
            let (nnr, rx2) = (self.r.nnr, self.r.rx2);
            self.guarded(nnr, |k| k.relayout_nd2nz_quiet(parity, rx2, false));
        }
        for g in 0..total {
            let (stage, j) = (g / steps, g % steps);
            let last = g + 1 == total;
            let item = self.relayout
                && g >= plan.item_first
                && g < plan.item_steps
                && (!self.batched() || g - plan.item_first < plan.ub_rows);
            if item && g == plan.item_first {
                self.guarded(nr, staged);
            }
            let slot = (g % 2) as usize;
            if item && self.single_round() {
                let q = g - plan.item_first;
                self.step_loads(parity, rows, g, stage, j);
                self.guard_item(q, |k| k.item_mte1(slot, q));
                self.step_mmad(parity, rows, g, stage, j);
                self.guard_item(q, |k| k.item_m(slot));
                self.step_sets(g, last);
                self.guard_item(q, |k| {
                    k.item_m_sets(slot);
                    k.item_tail(slot, q);
                });
            } else {
                self.step_loads(parity, rows, g, stage, j);
                self.step_mmad(parity, rows, g, stage, j);
                self.step_sets(g, last);
                if item {
                    let q = g - plan.item_first;
                    self.guard_item(q, |k| k.relayout_item(slot, q));
                }
            }
            let gi = stage / plan.sg;
            if g + 1 == plan.group_end_step(gi) && gi + 2 < plan.groups() {
                let sb = self.stage_buffer(parity as u64, gi + 2);
                self.load_group(gi + 2, sb, bsrc, Weights::IfFirst);
            }
            if g + 1 == plan.item_steps && self.relayout {
                let take = plan.item_first == plan.item_steps;
                self.guarded(nr, |k| {
                    if take {
                        staged(k);
                    }
                    k.relayout_rest(plan.item_steps - plan.item_first);
                    k.set(Pipe::Mte1, Pipe::Mte2, ev::STAGING[next]);
                    k.workspace_written();
                });
            }
            let groups = plan.groups();
            for jn in 0..groups.min(2) {
                // The buffer is free once the current tile's group G + jn - 2 is done.
                let free = match (groups + jn).checked_sub(2) {
                    Some(gi) => plan.group_end_step(gi),
                    None => 0,
                };
                let point = plan.item_steps.max(free).min(total);
                if g + 1 == point {
                    let sb = self.stage_buffer(next as u64, jn);
                    let ready = jn == 0 && self.relayout;
                    self.guarded(nr, |k| {
                        if ready {
                            k.workspace_ready();
                        }
                        k.load_group(jn, sb, nband, Weights::No);
                        if ready {
                            k.workspace_taken();
                        }
                    });
                    if jn == 0 && self.relayout {
                        // The tile after next's staged rows, announced behind the band.
                        let nnr = self.r.nnr;
                        self.guarded(nnr, |k| k.set(Pipe::Mte2, Pipe::Mte1, ev::STAGING[parity]));
                    }
                }
            }
            if g == 0 {
                self.wait(Pipe::V, Pipe::Mte3, ev::DRAIN);
            }
            if next_row > 0 {
                next_row -= 1;
                self.guarded_drain_row(next_row);
            }
        }
        while next_row > 0 {
            next_row -= 1;
            self.guarded_drain_row(next_row);
        }
        self.set(Pipe::Mte3, Pipe::V, ev::DRAIN);
    }

    /// Emits `f` behind a branch that skips it when `reg` is zero.
    fn guarded(&mut self, reg: Reg, f: impl FnOnce(&mut Self)) {
        let zero = self.r.zero;
        let skip = self.a.new_label("skip");
        let l = self.a.label(&skip);
        self.a.beq(reg, zero, l);
        f(self);
        self.a.place(&skip);
    }

    /// The taps of L0 step `j` of a stage.
    fn step_taps(&self, j: u64) -> &'a [Tap] {
        let plan = self.plan;
        let t = plan.taps();
        &plan.taps[(j * plan.kb) as usize..((j + 1) * plan.kb).min(t) as usize]
    }

    /// MTE1 of L0 step `j` of stage `stage` (global step `g`): the step's weights and one
    /// window per tap into the L0 buffers of `g`'s parity.
    fn step_loads(&mut self, parity: usize, rows: u64, g: u64, stage: u64, j: u64) {
        let (s, plan) = (self.s, self.plan);
        let [t0, t1, _, _] = self.r.t;
        let nb = plan.nb(&s, rows);
        let mbp = self.mbp();
        let gi = stage / plan.sg;
        let sb = self.stage_buffer(parity as u64, gi);
        let base = self.l1.stage[sb] + (stage - gi * plan.sg) * plan.stage_bytes(&s);
        let b = (g % 2) as usize;
        let taps = self.step_taps(j);
        let kbj = taps.len() as u64;
        let band_units = plan.band_units();
        if j == 0 && stage.is_multiple_of(plan.sg) {
            self.wait(Pipe::Mte2, Pipe::Mte1, ev::STAGE[sb]);
        }
        self.wait(Pipe::M, Pipe::Mte1, ev::L0[b]);
        let weights = self.l1_weights(stage, sb) + j * mbp * plan.kb * FRACTAL;
        self.movi(t0, self.l0.a[b]);
        self.movi(t1, weights);
        self.a.load_l0a(t0, t1, mbp * kbj);
        let windows: Vec<u64> = taps
            .iter()
            .map(|tap| base + (tap.plane * band_units + tap.row * plan.wq + tap.col) * UNIT)
            .collect();
        for (q, window) in windows.into_iter().enumerate() {
            self.movi(t0, self.l0.b[b] + q as u64 * FRACTAL);
            self.movi(t1, window);
            self.a
                .load_l0b(t0, t1, nb)
                .src_stride(1)
                .dst_stride(kbj)
                .transpose(true);
        }
        self.set(Pipe::Mte1, Pipe::M, ev::L0[b]);
        if g + 1 == plan.group_end_step(gi) {
            self.set(Pipe::Mte1, Pipe::Mte2, ev::STAGE[sb]);
        }
    }

    /// M of a K step: its product into the tile's L0C half.
    fn step_mmad(&mut self, parity: usize, rows: u64, g: u64, _stage: u64, j: u64) {
        let s = self.s;
        let [t0, t1, t2, _] = self.r.t;
        let nb = self.plan.nb(&s, rows);
        let mbp = self.mbp();
        let b = (g % 2) as usize;
        let kbj = self.step_taps(j).len() as u64;
        self.wait(Pipe::Mte1, Pipe::M, ev::L0[b]);
        self.movi(t0, self.l0.a[b]);
        self.movi(t1, self.l0.b[b]);
        self.movi(t2, self.l0.c[parity]);
        self.a
            .mmad(t2, t0, t1, 16 * mbp, 16 * kbj, 16 * nb)
            .init(g == 0);
    }

    /// M's notices after a K step: the L0 buffers are free again; after the last, the tile's
    /// products are complete.
    fn step_sets(&mut self, g: u64, last: bool) {
        let b = (g % 2) as usize;
        if last {
            // The previous tile was copied out of its L0C half (which the next tile reuses)
            // before this tile is announced, so the announcements never overtake V.
            self.wait(Pipe::V, Pipe::M, ev::TILE);
            self.set(Pipe::M, Pipe::V, ev::TILE);
        }
        self.set(Pipe::M, Pipe::Mte1, ev::L0[b]);
    }

    /// V, narrow drain: the tile's `nb` fractals of `[position block][channel][16]` blocks
    /// transposed to `[channel][position block]` (one `vmov` per position block, 8 channels a
    /// repeat), then each channel's real pixels packed by `vgather` into its slot.
    fn pack_rows(&mut self, nb: u64) {
        let [t0, t1, t2, _] = self.r.t;
        let channels = 16 * self.mbp();
        let ub = self.ub;
        self.a
            .comment("narrow rows: channel-major blocks, then each channel's rows packed");
        self.movi(t0, u64::MAX);
        self.a.set_mask(t0, t0);
        for f in 0..nb {
            self.movi(t0, ub.transposed + f * UNIT);
            self.movi(t1, ub.out + f * channels * UNIT);
            self.a
                .vmov(DType::F16, t0, t1)
                .repeat(channels / 8)
                .dst_blk(nb)
                .src_blk(1)
                .dst_rep(8 * nb)
                .src_rep(8);
        }
        let repeats = (nb * 16).div_ceil(units::REPEAT_BYTES / 2);
        self.movi(t2, ub.pattern);
        for c in 0..channels {
            self.movi(t0, ub.packed + c * ub.packed_slot);
            self.movi(t1, ub.transposed + c * nb * UNIT);
            self.a
                .vgather(DType::I16, t0, t1, t2)
                .repeat(repeats)
                .src_rep(8)
                .pat_rep(1);
        }
    }

    /// MTE3, narrow drain: the previous tile's rows of every channel, one burst per channel
    /// (a branch per possible row count, as burst lengths are immediates).
    fn drain_packed(&mut self) {
        let (s, p, plan) = (self.s, self.p, self.plan);
        let (pcout, prev_r) = (self.r.pcout, self.r.prev_r);
        let [t0, t1, _, _] = self.r.t;
        let channels = (p.mg - self.cb * 16 * plan.mb).min(16 * self.mbp());
        let plane = s.ho * s.wo * 2;
        let slot = self.ub.packed_slot;
        for rows in 1..=plan.rt {
            let skip = self.a.new_label("other_rows");
            self.movi(t0, rows);
            let l = self.a.label(&skip);
            self.a.bne(prev_r, t0, l);
            let len = rows * s.wo * 2;
            self.movi(t1, self.ub.packed);
            self.a
                .copy_ub_to_gm_pad(pcout, t1, channels, len)
                .src_gap(slot - len.next_multiple_of(UNIT))
                .dst_gap(plane - len);
            self.a.place(&skip);
        }
    }

    /// `drain_row(row)` when the previous tile had more than `row` rows (narrow rows: the whole
    /// tile at its last row, which is drained first).
    fn guarded_drain_row(&mut self, row: u64) {
        if self.plan.narrow {
            if row + 1 == self.plan.rt {
                self.drain_packed();
            }
            return;
        }
        let (prev_r, t0) = (self.r.prev_r, self.r.t[0]);
        let skip = self.a.new_label("no_row");
        self.movi(t0, row);
        let l = self.a.label(&skip);
        self.a.bge(t0, prev_r, l);
        self.drain_row(row);
        self.a.place(&skip);
    }

    /// V: the finished tile (L0C half `parity`) out of L0C into the drain buffer (its largest
    /// size: the rows are written from it later), the bias added and converted; then MTE3 may
    /// write its rows.
    fn drain_copy(&mut self, parity: usize) {
        let (s, plan, p) = (self.s, self.plan, self.p);
        let [t0, t1, t2, t3] = self.r.t;
        let mbp = self.mbp();
        let nb = plan.nb(&s, plan.rt);
        let f32_work = p.bias != BiasKind::None || p.out == OutType::F32;
        let (buf, ty) = if f32_work {
            (self.ub.work, DType::F32)
        } else {
            (self.ub.out, DType::F16)
        };
        self.a.comment("drain: the tile out of L0C");
        self.wait(Pipe::Mte3, Pipe::V, ev::DRAIN);
        self.wait(Pipe::M, Pipe::V, ev::TILE);
        self.movi(t0, buf);
        self.movi(t3, self.l0.c[parity]);
        self.a.copy_l0c_to_ub(ty, t0, t3, mbp * nb);
        self.set(Pipe::V, Pipe::M, ev::TILE);
        if p.bias != BiasKind::None {
            // Per output-channel block and 8 fractals: one repeat adds the same 8 values to
            // the same block of each fractal.
            for f0 in (0..nb).step_by(DRAIN_GROUP as usize) {
                let cnt = DRAIN_GROUP.min(nb - f0);
                let lo = if cnt >= 8 {
                    u64::MAX
                } else {
                    (1u64 << (8 * cnt)) - 1
                };
                self.movi(t0, 0);
                self.movi(t1, lo);
                self.a.set_mask(t0, t1);
                for mb in 0..mbp {
                    self.movi(t0, buf + (f0 * mbp + mb) * FRACTAL_C);
                    self.movi(t1, self.ub.bias + mb * FRACTAL_C);
                    self.a
                        .vadd(DType::F32, t0, t0, t1)
                        .repeat(32)
                        .dst_blk(mbp * 32)
                        .src0_blk(mbp * 32)
                        .src1_blk(0)
                        .dst_rep(1)
                        .src0_rep(1)
                        .src1_rep(1);
                }
            }
        }
        if p.bias != BiasKind::None && p.out == OutType::F16 {
            self.a.mask_count(t2, mbp * nb * units::FRACTAL_ELEMS);
            self.movi(t0, self.ub.out);
            self.movi(t1, self.ub.work);
            self.a.vconv(DType::F16, DType::F32, t0, t1);
        }
        if p.epilogue == Epilogue::Relu {
            self.a.comment("the fused activation, in place");
            self.a.mask_count(t2, mbp * nb * units::FRACTAL_ELEMS);
            self.movi(t0, self.ub.out);
            self.a.vrelu(p.out.dtype(), t0, t0);
        }
        if plan.narrow {
            self.pack_rows(nb);
        }
        self.set(Pipe::V, Pipe::Mte3, ev::DRAIN);
    }

    /// MTE3: output row `row` of the previous tile (at `pcout`), one burst per channel and
    /// fractal. A segment that starts inside a fractal starts its burst at the 32-byte block
    /// and writes the elements before it over the previous row (rows go out in descending
    /// order, so that row is written after).
    fn drain_row(&mut self, row: u64) {
        let (s, plan, p) = (self.s, self.plan, self.p);
        let pcout = self.r.pcout;
        let [t0, t1, _, _] = self.r.t;
        let es = p.out.bytes();
        let mbp = self.mbp();
        let channels = (p.mg - self.cb * 16 * plan.mb).min(16 * mbp);
        let plane = s.ho * s.wo * es;
        let q_row = row * plan.wq;
        for f in q_row / 16..=(q_row + s.wo - 1) / 16 {
            let q0 = (16 * f).max(q_row);
            let q1 = (16 * f + 16).min(q_row + s.wo);
            let k = q0 - 16 * f;
            let ow = q0 - q_row;
            let spill = k % (units::BLOCK_BYTES / es);
            let len = (q1 - q0 + spill) * es;
            let local = (16 * es).saturating_sub(len.next_multiple_of(units::BLOCK_BYTES));
            let src = self.ub.out + (f * mbp * units::FRACTAL_ELEMS + k - spill) * es;
            let dst = ((row * s.wo + ow - spill) * es) as i64;
            self.movi(t0, src);
            self.addi(t1, pcout, dst, t1);
            self.a
                .copy_ub_to_gm_pad(t1, t0, channels, len)
                .src_gap(local)
                .dst_gap(plane - len);
        }
    }
}

/// Where the narrow drain's row pattern starts in the constants: after the weights and the
/// constant bias.
fn pattern_offset(plan: &Plan, p: &Problem) -> u64 {
    let bias = if p.bias == BiasKind::Constant {
        p.mg.div_ceil(16) * FRACTAL_C
    } else {
        0
    };
    WEIGHTS_OFF + plan_weights_total(plan, p) + bias
}

/// Bytes of every co block's packed weights.
fn plan_weights_total(plan: &Plan, p: &Problem) -> u64 {
    (0..plan.co_blocks)
        .map(|cb| plan.mb_of(p, cb) * plan.c1 * plan.taps() * FRACTAL)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row goes to some block, in order, even when a cost falls as rows are added (two
    /// whole small images in one tile cost less than one image and a part of the next).
    #[test]
    fn distribute_by_assigns_every_row_whatever_the_cost() {
        let falling = |_: u64, _: u64, r: u64| {
            if r == 12 {
                100.0
            } else {
                100.0 + r as f64 * 50.0
            }
        };
        for blocks in [1, 2, 3] {
            let runs = distribute_by(12, blocks, &falling);
            assert_eq!(runs.first().map(|r| r.0), Some(0), "{runs:?}");
            assert_eq!(runs.last().map(|r| r.1), Some(12), "{runs:?}");
            assert!(runs.windows(2).all(|w| w[0].1 == w[1].0), "{runs:?}");
        }
        let linear = |_: u64, _: u64, r: u64| r as f64 * 1e4;
        let runs = distribute_by(100, 4, &linear);
        assert_eq!(runs.len(), 4, "{runs:?}");
        assert_eq!(runs.last().map(|r| r.1), Some(100));
        assert!(distribute_by(0, 4, &linear).is_empty());
    }
}
