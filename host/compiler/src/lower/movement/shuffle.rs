//! Transposes that move the innermost axis: per batch a matrix `in[r][c]` (rows `sr` bytes
//! apart) becomes `out[c][r]` (rows `tc` bytes apart). 2-byte elements go through the vector
//! unit's 16 × 16 transpose (`vtranspose`, VNCHWCONV: what GE's TransData between NCHW and
//! NC1HWC0 runs on), one instruction per 16 rows of a tile. The other sizes have no transpose
//! instruction, so their element shuffle is a masked per-block reduction:
//! `vbreduce.sum.i32` with only lane `p` of
//! each 32-byte block enabled reduces each block to its lane `p` (a one-element sum is the
//! element, exactly, on the integer path), and with a block stride of one tile row the eight
//! blocks of a repeat are eight rows: one instruction writes `Rt` consecutive elements of
//! output row `c = 8b + p`.
//!
//! ```text
//!   GM rows ─MTE2─▶ in tile [Rt][Ct] ─V (vbreduce, lane p, blocks down a column)─▶
//!                   out tile [Ct][Rt] ─MTE3─▶ GM rows
//! ```
//!
//! Element sizes other than 4 bytes:
//! * 8 bytes: the tile is loaded twice, the second copy shifted by 4 bytes, rows interleaved,
//!   so lane `2p` of consecutive blocks alternates the low and high words of one element.
//! * 1 byte (`g = 4` per 32-bit lane): `g` rows are first packed into one row of
//!   32-bit lanes, `A_j[s][q]` holding element `g q + j` of rows `g s .. g s + g` (masks, a
//!   multiply for left shifts, an exact trip through f32 for right shifts); each `A_j` is then
//!   transposed as 32-bit elements, giving output rows `g q + j`.

use gearsim_isa::{DType, ReduceOp, units};

use super::super::writer::{Asm, Reg};
use super::super::{Kernel, LowerCtx, LowerError, Lowered, Operand, kernel_name};
use super::kit::{self, BLOCK, Chain, Digit, Frame, Job, Pipe, Scratch, Split, Xfer};

/// Tile shape limits for one element size.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Element bytes.
    e: u64,
    /// Elements per 32-bit lane (1 for 4 and 8 bytes).
    g: u64,
    /// Column quantum (elements per 32-byte block).
    cq: u64,
    /// Row quantum (rows one reduction repeat covers).
    rq: u64,
    /// Most columns per tile.
    ct_cap: u64,
    /// Most rows per tile (8-bit repeat fields).
    rt_cap: u64,
    /// In-tile copies (2 for 8-byte elements: plain and shifted).
    copies: u64,
}

impl Shape {
    fn of(e: u64) -> Option<Shape> {
        // Column caps keep eight rows within the 8-bit repeat stride (e = 4, 8) or a row
        // within one 256-byte repeat (e = 1, 2, which pack rows with whole-repeat operations).
        Some(match e {
            4 => Shape {
                e,
                g: 1,
                cq: 8,
                rq: 8,
                ct_cap: 128,
                rt_cap: units::REPEAT_MAX * 8,
                copies: 1,
            },
            8 => Shape {
                e,
                g: 1,
                cq: 4,
                rq: 4,
                ct_cap: 64,
                rt_cap: units::REPEAT_MAX * 4,
                copies: 2,
            },
            // vtranspose: 16 rows a group, 16 columns a repeat (at most 64 repeats a tile).
            2 => Shape {
                e,
                g: 1,
                cq: 16,
                rq: 16,
                ct_cap: 1024,
                rt_cap: units::REPEAT_MAX * 2 / 16 * 16,
                copies: 1,
            },
            1 => Shape {
                e,
                g: 4,
                cq: 32,
                rq: 32,
                ct_cap: 256,
                rt_cap: units::REPEAT_MAX * 4 / 32 * 32,
                copies: 1,
            },
            _ => return None,
        })
    }
}

/// A planned transpose.
#[derive(Debug, Clone)]
struct Plan {
    sh: Shape,
    rows: u64,
    cols: u64,
    /// Tile rows and columns.
    rt: u64,
    ct: u64,
    /// Input row stride and output row stride, bytes.
    sr: u64,
    tc: u64,
    /// Batch axes (output order) with input and output byte strides.
    batch: Vec<Digit>,
    /// Matrices stacked in one tile along batch axis `fold_axis` (1: none), each `rpad` rows.
    fold: u64,
    fold_axis: usize,
    rpad: u64,
    nbuf: usize,
    /// Elements stored per output row when the rows are padded with zeros up to it (a
    /// TransData of fewer than 16 channels into NC1HWC0's 16-channel units); 0: none.
    pad: u64,
}

impl Plan {
    fn pin(&self) -> u64 {
        self.ct * self.sh.e
    }

    fn pout(&self) -> u64 {
        self.rt * self.sh.e
    }

    fn in_bytes(&self) -> u64 {
        self.rt * self.pin() * self.sh.copies
    }

    fn out_bytes(&self) -> u64 {
        self.ct * self.pout()
    }

    /// Bytes of each packing scratch array (row groups × row pitch).
    fn pack_bytes(&self) -> u64 {
        if self.sh.g == 1 {
            0
        } else {
            self.rt / self.sh.g * self.pin()
        }
    }

    /// Constants (slot masks) and packing scratch (W1, W2, A_0 .. A_{g-1}).
    fn shared_bytes(&self) -> u64 {
        if self.sh.g == 1 {
            0
        } else {
            self.sh.g * units::REPEAT_BYTES + (2 + self.sh.g) * self.pack_bytes()
        }
    }

    fn ub_bytes(&self) -> u64 {
        self.shared_bytes() + self.nbuf as u64 * (self.in_bytes() + self.out_bytes())
    }

    fn tasks(&self) -> u64 {
        let batch: u64 = self
            .batch
            .iter()
            .enumerate()
            .map(|(i, d)| {
                if self.fold > 1 && i == self.fold_axis {
                    d.n.div_ceil(self.fold)
                } else {
                    d.n
                }
            })
            .product();
        batch * self.rows.div_ceil(self.rt) * self.cols.div_ceil(self.ct)
    }

    /// Whether the tile shape fits the unified buffer (input tiles of at most 32 KiB).
    fn fits_ub(&self, ub: u64) -> bool {
        self.ub_bytes() <= ub && self.in_bytes() <= 32 * 1024
    }
}

/// Lowers the transpose of `e`-byte elements with collapsed input dims `d` and permutation `p`
/// (the innermost axis moves). `None` when the tile shapes cannot express it.
pub fn lower(
    ctx: &LowerCtx<'_>,
    e: u64,
    d: &[u64],
    p: &[usize],
    args: &[Operand],
) -> Result<Option<Lowered>, LowerError> {
    lower_padded(ctx, e, d, p, 0, args)
}

/// [`lower`], with each output row (the input's axis that becomes innermost) padded with
/// zeros to `pad` elements when `pad` is not 0: the rows a tile holds past the input's are
/// zeroed once, before the first load, and the stores write whole padded rows. `pad` must fit
/// one row quantum (at least the rows, at most the quantum): NCHW with fewer than 16 channels
/// into NC1HWC0 is the transpose of each image's `[C][HW]` into `[HW][16]`.
pub fn lower_padded(
    ctx: &LowerCtx<'_>,
    e: u64,
    d: &[u64],
    p: &[usize],
    pad: u64,
    args: &[Operand],
) -> Result<Option<Lowered>, LowerError> {
    let Some(sh) = Shape::of(e) else {
        return Ok(None);
    };
    let k = d.len();
    if k < 2 || p[k - 1] == k - 1 {
        return Ok(None);
    }
    let rows_axis = p[k - 1];
    if pad != 0 && (pad < d[rows_axis] || pad > sh.rq) {
        return Ok(None);
    }
    let core = &ctx.target.core;
    let sin = super::strides(d);
    let mut od: Vec<u64> = p.iter().map(|&a| d[a]).collect();
    if pad != 0 {
        od[k - 1] = pad;
    }
    let sout = super::strides(&od);
    let a_ax = p[k - 1];
    let Some(j_star) = p.iter().position(|&a| a == k - 1) else {
        return Ok(None);
    };
    let batch: Vec<Digit> = (0..k)
        .filter(|&j| j != j_star && j != k - 1)
        .map(|j| Digit {
            n: od[j],
            strides: vec![(sin[p[j]] * e) as i64, (sout[j] * e) as i64],
        })
        .collect();
    let fold_axis = batch.iter().rposition(|d| d.n > 1);
    let mut plan = Plan {
        sh,
        rows: d[a_ax],
        cols: d[k - 1],
        rt: sh.rq,
        ct: kit::ceil_to(d[k - 1], sh.cq).min(sh.ct_cap),
        sr: sin[a_ax] * e,
        tc: sout[j_star] * e,
        batch,
        fold: 1,
        fold_axis: fold_axis.unwrap_or(0),
        rpad: kit::ceil_to(d[a_ax], sh.rq),
        nbuf: kit::buffers(core),
        pad,
    };
    let ub = core.ub_bytes;
    let want = 2 * kit::cores(core);
    // Rows: as many as fit, then fewer until every core has work.
    let mut rt = kit::floor_to(sh.rt_cap, sh.rq).min(plan.rpad);
    loop {
        plan.rt = rt;
        if plan.fits_ub(ub) || rt <= sh.rq {
            break;
        }
        rt = kit::floor_to(rt - 1, sh.rq).max(sh.rq);
    }
    if let Some(fa) = fold_axis
        && plan.rt == plan.rpad
    {
        // Few rows: stack matrices of the innermost batch axis in one tile, so each vector
        // instruction covers several of them (the per-instruction cost is paid once).
        let n = plan.batch[fa].n;
        let mut m = (sh.rt_cap / plan.rpad).min(n).max(1);
        loop {
            plan.fold = m;
            plan.rt = m * plan.rpad;
            if (plan.fits_ub(ub) && plan.tasks() >= want) || m == 1 {
                break;
            }
            m -= 1;
        }
    }
    while plan.tasks() < want && plan.fold == 1 && plan.rt > sh.rq {
        plan.rt = kit::floor_to(plan.rt / 2, sh.rq).max(sh.rq);
    }
    while plan.tasks() < want && plan.ct > sh.cq {
        plan.ct = kit::floor_to(plan.ct / 2, sh.cq).max(sh.cq);
    }
    if plan.ub_bytes() > ub {
        return Ok(None);
    }
    let (rows, cols) = (plan.rt.min(plan.rows), plan.ct.min(plan.cols));
    for x in [load_xfer(&plan, rows, cols), store_xfer(&plan, rows, cols)] {
        if !kit::fits(&x) {
            return Ok(None);
        }
    }
    let kernel = emit(ctx, &plan, args)?;
    Ok(Some(Lowered::Kernels {
        kernels: vec![kernel],
        derived: Vec::new(),
        workspace_bytes: 0,
    }))
}

fn load_xfer(p: &Plan, rows: u64, cols: u64) -> Xfer {
    Xfer {
        n: rows,
        len: cols * p.sh.e,
        gm_stride: p.sr,
        ub_pitch: p.pin() * p.sh.copies,
    }
}

fn store_xfer(p: &Plan, rows: u64, cols: u64) -> Xfer {
    Xfer {
        n: cols,
        len: if p.pad != 0 { p.pad } else { rows } * p.sh.e,
        gm_stride: p.tc,
        ub_pitch: p.pout(),
    }
}

/// One tile shape: full or remainder rows and columns, `fold` stacked matrices.
#[derive(Debug, Clone)]
struct Sub {
    digits: Vec<Digit>,
    src_off: i64,
    dst_off: i64,
    rows: u64,
    cols: u64,
    fold: u64,
    /// Input and output byte distance between stacked matrices.
    fold_si: i64,
    fold_so: i64,
}

#[derive(Clone, Copy)]
struct Regs {
    sbase: Reg,
    dbase: Reg,
    src: Reg,
    dst: Reg,
    ub: Reg,
    zero: Reg,
    mask: Reg,
    o1: Reg,
    o2: Reg,
    s: Scratch,
}

fn emit(ctx: &LowerCtx<'_>, plan: &Plan, args: &[Operand]) -> Result<Kernel, LowerError> {
    let (rt, ct, e) = (plan.rt, plan.ct, plan.sh.e);
    // Row parts: (count, rows, fold) — full and remainder row tiles, or full and remainder
    // groups of stacked matrices.
    let (fsi, fso, fold_n) = if plan.fold > 1 {
        let f = &plan.batch[plan.fold_axis];
        (f.strides[0], f.strides[1], f.n)
    } else {
        (0, 0, 1)
    };
    let row_parts: Vec<(u64, u64, u64)> = if plan.fold > 1 {
        vec![
            (fold_n / plan.fold, plan.rows, plan.fold),
            (
                u64::from(fold_n % plan.fold > 0),
                plan.rows,
                fold_n % plan.fold,
            ),
        ]
    } else {
        vec![
            (plan.rows / rt, rt, 1),
            (u64::from(!plan.rows.is_multiple_of(rt)), plan.rows % rt, 1),
        ]
    };
    let (cfull, crem) = (plan.cols / ct, plan.cols % ct);
    let mut subs = Vec::new();
    for (cn, cols) in [(cfull, ct), (u64::from(crem > 0), crem)] {
        for (pi, &(rn, rows, fold)) in row_parts.iter().enumerate() {
            if cn == 0 || rn == 0 || cols == 0 || rows == 0 || fold == 0 {
                continue;
            }
            let (mut src_off, mut dst_off) = (0i64, 0i64);
            let mut digits = Vec::new();
            for (i, d) in plan.batch.iter().enumerate() {
                if plan.fold > 1 && i == plan.fold_axis {
                    if pi == 0 {
                        digits.push(Digit {
                            n: rn,
                            strides: vec![fsi * fold as i64, fso * fold as i64],
                        });
                    } else {
                        let done = (fold_n / plan.fold * plan.fold) as i64;
                        src_off += fsi * done;
                        dst_off += fso * done;
                    }
                } else {
                    digits.push(d.clone());
                }
            }
            if cols == ct {
                digits.push(Digit {
                    n: cn,
                    strides: vec![(ct * e) as i64, (ct * plan.tc) as i64],
                });
            } else {
                src_off += (cfull * ct * e) as i64;
                dst_off += (cfull * ct * plan.tc) as i64;
            }
            if plan.fold == 1 {
                if rows == rt {
                    digits.push(Digit {
                        n: rn,
                        strides: vec![(rt * plan.sr) as i64, (rt * e) as i64],
                    });
                } else {
                    src_off += (plan.rows / rt * rt * plan.sr) as i64;
                    dst_off += (plan.rows / rt * rt * e) as i64;
                }
            }
            subs.push(Sub {
                digits,
                src_off,
                dst_off,
                rows,
                cols,
                fold,
                fold_si: fsi,
                fold_so: fso,
            });
        }
    }
    let split = Split::new(plan.tasks(), &ctx.target.core);
    let chain = Chain {
        stages: &[Pipe::Mte2, Pipe::V, Pipe::Mte3],
        nbuf: plan.nbuf,
    };
    let mut a = Asm::new(&kernel_name(ctx, &format!("shuffle{}", e * 8)));
    a.tiling("rows", plan.rows as i64);
    a.tiling("cols", plan.cols as i64);
    a.tiling("tile_rows", rt as i64);
    a.tiling("tile_cols", ct as i64);
    a.tiling("stacked", plan.fold as i64);
    a.tiling("ub_bytes", plan.ub_bytes() as i64);
    let f = Frame::new(&mut a, split);
    let g = Regs {
        sbase: a.reg(),
        dbase: a.reg(),
        src: a.reg(),
        dst: a.reg(),
        ub: a.reg(),
        zero: a.reg(),
        mask: a.reg(),
        o1: a.reg(),
        o2: a.reg(),
        s: Scratch::new(&mut a),
    };
    a.movi(g.zero, 0);
    if plan.sh.g > 1 {
        // Slot masks: constant j keeps bits [8ej, 8e(j+1)) of each 32-bit lane.
        kit::set_mask(&mut a, g.zero, g.mask, -1);
        for j in 0..plan.sh.g {
            let m = ((1u64 << (8 * e)) - 1) << (8 * e * j);
            a.movi(g.o1, (j * units::REPEAT_BYTES) as i64);
            a.movi(g.o2, m as i64);
            a.vdup(DType::I32, g.o1, g.o2);
        }
    }
    if plan.pad != 0 {
        // The padding rows: every input tile zeroed once, before any load (V hands them to
        // MTE2), so the rows past the input's transpose into zero lanes. Loads only ever
        // write the input's rows.
        a.comment("the padding rows: every input tile zeroed once");
        kit::set_mask(&mut a, g.zero, g.mask, -1);
        for k in 0..plan.nbuf {
            let (inb, _) = tiles(plan, k);
            let mut at = inb;
            let mut left = plan.in_bytes() / units::REPEAT_BYTES;
            while left > 0 {
                let n = left.min(units::REPEAT_MAX);
                a.movi(g.ub, at as i64);
                a.vdup(DType::I32, g.ub, g.zero).repeat(n as u8);
                at += n * units::REPEAT_BYTES;
                left -= n;
            }
        }
        super::super::queue::barrier(&mut a, Pipe::V, Pipe::Mte2, 0);
    }
    chain.prologue(&mut a);
    let jobs: Vec<Job<'_>> = subs
        .iter()
        .map(|s| {
            let (fr, rg) = (f, g);
            Job {
                tasks: s.digits.iter().map(|d| d.n).product(),
                setup: Box::new(move |a: &mut Asm| {
                    fr.arg(a, rg.sbase, 0);
                    fr.arg(a, rg.dbase, 1);
                }),
                load: Box::new(move |a: &mut Asm, k: usize, t: Reg| {
                    load(a, plan, s, &rg, &chain, k, t);
                }),
                rest: Box::new(move |a: &mut Asm, k: usize, t: Reg| {
                    rest(a, plan, s, &rg, &chain, k, t);
                }),
            }
        })
        .collect();
    kit::run_jobs(&mut a, &f, plan.nbuf, &jobs);
    chain.epilogue(&mut a);
    ctx.kernel(a, split.blocks, args.to_vec())
}

/// UB addresses of buffer `k`'s input and output tiles.
fn tiles(p: &Plan, k: usize) -> (u64, u64) {
    let inb = p.shared_bytes() + k as u64 * (p.in_bytes() + p.out_bytes());
    (inb, inb + p.in_bytes())
}

/// The loads of one tile of shape `s` on buffer `k`.
fn load(a: &mut Asm, p: &Plan, s: &Sub, g: &Regs, chain: &Chain, k: usize, t: Reg) {
    let [s0, ..] = g.s.r;
    let e = p.sh.e;
    let (inb, _) = tiles(p, k);
    kit::set_add(a, g.src, g.sbase, s.src_off, s0);
    kit::decompose(a, t, &s.digits, &[Some(g.src), None], &g.s);
    chain.begin(a, 0, k);
    for i in 0..s.fold {
        // Stacked matrix i starts rpad rows into the tile.
        let at = inb + i * p.rpad * p.pin() * p.sh.copies;
        if i > 0 {
            kit::add_imm(a, g.src, s.fold_si, s0);
        }
        a.movi(g.ub, at as i64);
        kit::dma(a, true, g.ub, g.src, &load_xfer(p, s.rows, s.cols));
        if e == 8 {
            // The same rows shifted by one word, each after its plain copy: lane 2p of the
            // shifted copy holds the high word of element p.
            a.movi(g.ub, (at + p.pin()) as i64);
            a.addi(g.src, g.src, 4);
            let mut x = load_xfer(p, s.rows, s.cols);
            x.len -= 4;
            kit::dma(a, true, g.ub, g.src, &x);
            a.addi(g.src, g.src, -4);
        }
    }
    chain.end(a, 0, k);
}

/// The shuffle and store of one tile of shape `s` on buffer `k`.
fn rest(a: &mut Asm, p: &Plan, s: &Sub, g: &Regs, chain: &Chain, k: usize, t: Reg) {
    let [s0, ..] = g.s.r;
    let (inb, outb) = tiles(p, k);
    kit::set_add(a, g.dst, g.dbase, s.dst_off, s0);
    kit::decompose(a, t, &s.digits, &[None, Some(g.dst)], &g.s);
    chain.begin(a, 1, k);
    // Vector work covers whole quanta; rows and columns past the tile's are never stored.
    let rows_v = if s.fold > 1 {
        s.fold * p.rpad
    } else {
        kit::ceil_to(s.rows, p.sh.rq)
    };
    let cols_v = kit::ceil_to(s.cols, p.sh.cq);
    if p.sh.e == 2 {
        transpose16(a, p, g, inb, outb, rows_v, cols_v);
    } else if p.sh.g == 1 {
        transpose32(a, p, g, inb, outb, rows_v, cols_v);
    } else {
        pack(a, p, g, inb, rows_v, cols_v);
        transpose_packed(a, p, g, outb, rows_v, cols_v);
    }
    chain.end(a, 1, k);
    chain.begin(a, 2, k);
    for i in 0..s.fold {
        if i > 0 {
            kit::add_imm(a, g.dst, s.fold_so, s0);
        }
        a.movi(g.ub, (outb + i * p.rpad * p.sh.e) as i64);
        kit::dma(a, false, g.ub, g.dst, &store_xfer(p, s.rows, s.cols));
    }
    chain.end(a, 2, k);
}

/// A loop of `n` steps on `counter` (unrolled when short).
fn counted(a: &mut Asm, counter: Reg, n: u64, step: &dyn Fn(&mut Asm)) {
    if n <= 2 {
        for _ in 0..n {
            step(a);
        }
        return;
    }
    let top = a.new_label("col");
    a.movi(counter, n as i64);
    a.place(&top);
    step(a);
    let top_l = a.label(&top);
    a.r#loop(counter, top_l);
}

/// 2-byte elements: each group of 16 input rows is one `vtranspose` over the tile's columns,
/// 16 a repeat; its 16 × 16 blocks land side by side in the output rows.
fn transpose16(a: &mut Asm, p: &Plan, g: &Regs, inb: u64, outb: u64, rows_v: u64, cols_v: u64) {
    let [vs, vd, _, _] = g.s.r;
    // A block is `rq` rows of `cq` elements (16 × 16); a group's blocks lie `cq` output rows
    // apart.
    let (rq, cq) = (p.sh.rq, p.sh.cq);
    let (in_row, out_row) = (p.pin() / BLOCK, p.pout() / BLOCK);
    for q in 0..rows_v / rq {
        a.movi(vs, (inb + q * rq * p.pin()) as i64);
        a.movi(vd, (outb + q * BLOCK) as i64);
        a.vtranspose(DType::F16, vd, vs)
            .repeat((cols_v / cq) as u8)
            .src_row(in_row as u16)
            .src_rep(1)
            .dst_row(out_row as u16)
            .dst_rep((cq * out_row) as u16);
    }
}

/// 4- and 8-byte elements: output row `c` gathers lane `c mod per_block` of one block column.
fn transpose32(a: &mut Asm, p: &Plan, g: &Regs, inb: u64, outb: u64, rows_v: u64, cols_v: u64) {
    let [vs, vd, _, cnt] = g.s.r;
    let e = p.sh.e;
    // Elements per block, 32-bit lanes per element.
    let per_block = BLOCK / e;
    let lanes = e / 4;
    let slot = p.pin() / BLOCK;
    let src_rep = 8 * slot;
    let repeat = rows_v * lanes / 8;
    let pout = p.pout();
    for lane in 0..per_block {
        kit::set_mask(a, g.zero, g.mask, kit::lane_mask(lane * lanes));
        a.movi(vs, inb as i64);
        a.movi(vd, (outb + lane * pout) as i64);
        counted(a, cnt, cols_v / per_block, &|a: &mut Asm| {
            a.vbreduce(ReduceOp::Sum, DType::I32, vd, vs)
                .repeat(repeat)
                .src_blk(slot)
                .src_rep(src_rep);
            a.addi(vs, vs, BLOCK);
            a.addi(vd, vd, per_block * pout);
        });
    }
}

/// 1- and 2-byte elements: packs `g` tile rows into each row of `A_j` (see the module doc).
fn pack(a: &mut Asm, p: &Plan, g: &Regs, inb: u64, rows_v: u64, cols_v: u64) {
    let (e, gg) = (p.sh.e, p.sh.g);
    let w = p.pin() / BLOCK;
    let w_v = cols_v * e / BLOCK;
    let groups = rows_v / gg;
    let pb = p.pack_bytes();
    let w1 = gg * units::REPEAT_BYTES;
    let arr = |j: u64| w1 + 2 * pb + j * pb;
    let (o0, o1, o2, sc) = (g.ub, g.o1, g.o2, g.src);
    let [_, _, _, f2] = g.s.r;
    kit::set_mask(a, g.zero, g.mask, kit::first_mask(8 * w_v));
    let xi = |i: u64| inb + i * p.pin();
    let xrep = gg * w;
    // dst (repeat stride w) = src (repeat stride src_rep) & slot mask c (repeat stride 0).
    let vand = |a: &mut Asm, dst: u64, src: u64, src_rep: u64, c: u64| {
        a.movi(o0, dst as i64);
        a.movi(o1, src as i64);
        a.movi(o2, (c * units::REPEAT_BYTES) as i64);
        a.vand(DType::I32, o0, o1, o2)
            .repeat(groups)
            .dst_rep(w)
            .src0_rep(src_rep)
            .src1_rep(0);
    };
    for j in 0..gg {
        let aj = arr(j);
        for i in 0..gg {
            // Slot j of row g s + i, moved to slot i.
            let target = if i == 0 { aj } else { w1 };
            vand(a, target, xi(i), xrep, j);
            if i > j {
                a.movi(sc, 1i64 << (8 * e * (i - j)));
                a.movi(o0, target as i64);
                a.vmuls(DType::I32, o0, o0, sc)
                    .repeat(groups)
                    .dst_rep(w)
                    .src_rep(w);
            } else if i < j {
                // A right shift, exact through f32: the masked value has at most 16
                // significant bits and the scale is a power of two.
                let scale = 1.0f32 / (1u64 << (8 * e * (j - i))) as f32;
                a.movi(o0, target as i64);
                a.vconv(DType::F32, DType::I32, o0, o0)
                    .repeat(groups)
                    .dst_rep(w)
                    .src_rep(w);
                a.movi(f2, i64::from(scale.to_bits()));
                a.vmuls(DType::F32, o0, o0, f2)
                    .repeat(groups)
                    .dst_rep(w)
                    .src_rep(w);
                a.vconv(DType::I32, DType::F32, o0, o0)
                    .repeat(groups)
                    .dst_rep(w)
                    .src_rep(w);
                // The top slot converts signed: keep slot i only.
                vand(a, target, target, w, i);
            }
            if i > 0 {
                a.movi(o0, aj as i64);
                a.movi(o1, w1 as i64);
                a.vadd(DType::I32, o0, o0, o1)
                    .repeat(groups)
                    .dst_rep(w)
                    .src0_rep(w)
                    .src1_rep(w);
            }
        }
    }
}

/// Transposes each packed array `A_j` as 32-bit elements into output rows `g q + j`.
fn transpose_packed(a: &mut Asm, p: &Plan, g: &Regs, outb: u64, rows_v: u64, cols_v: u64) {
    let [vs, vd, _, cnt] = g.s.r;
    let (e, gg) = (p.sh.e, p.sh.g);
    let w = p.pin() / BLOCK;
    let w_v = cols_v * e / BLOCK;
    let pb = p.pack_bytes();
    let w1 = gg * units::REPEAT_BYTES;
    let arr = |j: u64| w1 + 2 * pb + j * pb;
    let repeat = rows_v / gg / 8;
    let pout = p.pout();
    for lane in 0..8 {
        kit::set_mask(a, g.zero, g.mask, kit::lane_mask(lane));
        for j in 0..gg {
            a.movi(vs, arr(j) as i64);
            a.movi(vd, (outb + (gg * lane + j) * pout) as i64);
            counted(a, cnt, w_v, &|a: &mut Asm| {
                a.vbreduce(ReduceOp::Sum, DType::I32, vd, vs)
                    .repeat(repeat)
                    .src_blk(w)
                    .src_rep(8 * w);
                a.addi(vs, vs, BLOCK);
                a.addi(vd, vd, 8 * gg * pout);
            });
        }
    }
}
