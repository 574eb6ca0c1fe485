//! The strided copy engine: every output of Concat, Slice, Expand and of a Transpose that keeps
//! the innermost axis is a box of equal contiguous *units* (runs of bytes contiguous on both
//! sides), each read from a strided place in the input.
//!
//! A task moves a tile of `q × r` units through UB: `q` units along one axis whose input
//! stride allows one DMA (the largest such axis), replicated `r` times along a broadcast axis
//! (input stride 0) by the vector unit, then written with one DMA per row of the smaller of
//! the two counts. Other axes are loop digits of the task index. An axis read backwards (a
//! negative Slice step) is loaded forwards in one DMA and written back one unit per DMA in
//! reverse order. A broadcast innermost axis (Expand of `[.., 1]`) makes a *splat* unit: one
//! input element repeated, built in UB by a masked per-block reduction with a zero block
//! stride (eight copies of lane 0), widened to 32 bits for 8- and 16-bit types by a multiply
//! (`x * 0x01010101`), interleaved for 64-bit types by a select, then copied over the unit.
//!
//! ```text
//!   GM ─MTE2─▶ [unit 0 .. unit q-1]            one strided DMA (or one element per slot)
//!              [replica 1 ...     ]  ◀─V─      vmov copies (only when r > 1) / splat fill
//!              [replica r-1 ...   ]
//!          ─MTE3─▶ GM                           min(q, r) DMAs of max(q, r) bursts
//! ```

use gearsim_isa::{DType, ReduceOp, units};

use super::super::writer::{Asm, Reg};
use super::super::{Kernel, LowerCtx, LowerError, Operand};
use super::kit::{
    self, BLOCK, Chain, Digit, Frame, Job, MAX_BURSTS, Pipe, Scratch, Split, Xfer, round32,
};

/// Most 64-bit splat units one task builds (their words are staged in shared scratch).
const SPLAT64_MAX: u64 = 64;
/// UB bytes before the buffers: the select pattern and the 64-bit splat scratch.
const RESERVED: u64 = BLOCK + 2 * SPLAT64_MAX * BLOCK;

/// One axis of a copy box: its size and the byte strides of one step in the input and the
/// output. An input stride of 0 broadcasts; a negative one walks the input backwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim {
    /// Size.
    pub n: u64,
    /// Input bytes per step.
    pub si: i64,
    /// Output bytes per step.
    pub so: i64,
}

/// Where a unit's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A contiguous run of the input.
    Dma,
    /// One input element of this many bytes, repeated over the unit.
    Splat {
        /// Element bytes (1, 2, 4 or 8).
        elem: u64,
    },
}

/// A box copy from argument `src` to argument `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Argument index of the input.
    pub src: usize,
    /// Argument index of the output.
    pub dst: usize,
    /// Input byte offset of the first unit.
    pub src_off: i64,
    /// Output byte offset of the first unit.
    pub dst_off: i64,
    /// Axes, outer first.
    pub dims: Vec<Dim>,
    /// Bytes per unit.
    pub unit: u64,
    /// What a unit is.
    pub kind: Unit,
}

impl Spec {
    /// Bytes of input one unit reads.
    fn src_unit(&self) -> u64 {
        match self.kind {
            Unit::Dma => self.unit,
            Unit::Splat { elem } => elem,
        }
    }

    /// Input bytes one step along the unit's own extent reads (0 for a splat).
    fn src_step(&self, bytes: u64) -> i64 {
        match self.kind {
            Unit::Dma => bytes as i64,
            Unit::Splat { .. } => 0,
        }
    }

    /// Output bytes.
    pub fn out_bytes(&self) -> u64 {
        self.dims.iter().map(|d| d.n).product::<u64>() * self.unit
    }

    /// Drops unit axes, folds axes contiguous on both sides into the unit and merges axes
    /// that nest exactly. `None` when there is nothing to copy.
    pub fn normalize(mut self) -> Option<Spec> {
        if self.unit == 0 || self.dims.iter().any(|d| d.n == 0) {
            return None;
        }
        self.dims.retain(|d| d.n != 1);
        while let Some(last) = self.dims.last().copied() {
            if last.so == self.unit as i64 && last.si == self.src_step(self.unit) {
                self.unit *= last.n;
                self.dims.pop();
            } else {
                break;
            }
        }
        let mut out: Vec<Dim> = Vec::with_capacity(self.dims.len());
        for d in self.dims {
            match out.last_mut() {
                Some(p) if p.si == d.si * d.n as i64 && p.so == d.so * d.n as i64 => {
                    p.n *= d.n;
                    p.si = d.si;
                    p.so = d.so;
                }
                _ => out.push(d),
            }
        }
        self.dims = out;
        Some(self)
    }
}

/// One static tile shape of a spec: loop digits, `q` units along one axis, `r` replicas.
#[derive(Debug, Clone)]
struct Sub {
    spec: usize,
    digits: Vec<Digit>,
    src_off: i64,
    dst_off: i64,
    unit: u64,
    kind: Unit,
    q: u64,
    q_si: i64,
    q_so: i64,
    rev: bool,
    r: u64,
    r_so: i64,
}

impl Sub {
    fn pitch(&self) -> u64 {
        round32(self.unit)
    }

    /// UB bytes of the unit slots.
    fn slot_bytes(&self) -> u64 {
        self.q * self.r * self.pitch()
    }

    /// UB bytes of the splat sources (one element per 32-byte slot, whole repeats).
    fn source_bytes(&self) -> u64 {
        match self.kind {
            Unit::Dma => 0,
            Unit::Splat { .. } => kit::ceil_to(self.q, 8) * BLOCK,
        }
    }

    fn needs_vector(&self) -> bool {
        self.r > 1 || matches!(self.kind, Unit::Splat { .. })
    }

    fn tasks(&self) -> u64 {
        self.digits.iter().map(|d| d.n).product()
    }
}

/// The axis with the most steps among those `pred` accepts (the innermost on ties).
fn largest(dims: &[Dim], pred: impl Fn(&Dim) -> bool) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, d) in dims.iter().enumerate() {
        if pred(d) && best.is_none_or(|b| d.n >= dims[b].n) {
            best = Some(i);
        }
    }
    best
}

/// Splits `spec` into static tile shapes of at most `tile` bytes.
fn plan(si: usize, spec: &Spec, tile: u64, out: &mut Vec<Sub>) {
    if round32(spec.unit) > tile {
        // A unit larger than a tile: whole pieces along a new axis, then the remainder.
        let piece = kit::floor_to(tile, BLOCK);
        let (np, rem) = (spec.unit / piece, spec.unit % piece);
        let mut a = spec.clone();
        a.unit = piece;
        a.dims.push(Dim {
            n: np,
            si: spec.src_step(piece),
            so: piece as i64,
        });
        plan(si, &a, tile, out);
        if rem > 0 {
            let mut b = spec.clone();
            b.unit = rem;
            b.src_off += np as i64 * spec.src_step(piece);
            b.dst_off += (np * piece) as i64;
            plan(si, &b, tile, out);
        }
        return;
    }
    let src_unit = spec.src_unit() as i64;
    let unit = spec.unit as i64;
    let mut qdim = largest(&spec.dims, |d| d.si >= src_unit && d.so >= unit);
    let mut rev = false;
    if qdim.is_none() {
        qdim = largest(&spec.dims, |d| d.si <= -src_unit && d.so >= unit);
        rev = qdim.is_some();
    }
    let rdim = if rev {
        None
    } else {
        largest(&spec.dims, |d| d.si == 0 && d.so >= unit)
    };
    let nq = qdim.map_or(1, |i| spec.dims[i].n);
    let nr = rdim.map_or(1, |i| spec.dims[i].n);
    // A splat unit also takes a 32-byte source slot; 64-bit splats stage their words in
    // shared scratch of SPLAT64_MAX blocks each.
    let slots = match spec.kind {
        Unit::Dma => tile / round32(spec.unit),
        Unit::Splat { elem } => {
            let s = tile / (round32(spec.unit) + BLOCK);
            if elem == 8 { s.min(SPLAT64_MAX) } else { s }
        }
    }
    .max(1);
    let (q, r) = if nr >= nq {
        let r = nr.min(slots).min(MAX_BURSTS);
        (nq.min((slots / r).max(1)).min(MAX_BURSTS), r)
    } else {
        let q = nq.min(slots).min(MAX_BURSTS);
        (q, nr.min((slots / q).max(1)).min(MAX_BURSTS))
    };
    let q_parts = [(q, nq / q), (nq % q, u64::from(nq % q > 0))];
    let r_parts = [(r, nr / r), (nr % r, u64::from(nr % r > 0))];
    for (qi, &(qc, qn)) in q_parts.iter().enumerate() {
        for (ri, &(rc, rn)) in r_parts.iter().enumerate() {
            if qn == 0 || rn == 0 || qc == 0 || rc == 0 {
                continue;
            }
            let mut digits = Vec::new();
            let (mut src_off, mut dst_off) = (spec.src_off, spec.dst_off);
            let (mut q_si, mut q_so, mut r_so) = (0, 0, 0);
            for (i, d) in spec.dims.iter().enumerate() {
                if Some(i) == qdim {
                    (q_si, q_so) = (d.si, d.so);
                    if qi == 0 {
                        digits.push(Digit {
                            n: qn,
                            strides: vec![d.si * q as i64, d.so * q as i64],
                        });
                    } else {
                        src_off += d.si * ((nq / q) * q) as i64;
                        dst_off += d.so * ((nq / q) * q) as i64;
                    }
                } else if Some(i) == rdim {
                    r_so = d.so;
                    if ri == 0 {
                        digits.push(Digit {
                            n: rn,
                            strides: vec![0, d.so * r as i64],
                        });
                    } else {
                        dst_off += d.so * ((nr / r) * r) as i64;
                    }
                } else {
                    digits.push(Digit {
                        n: d.n,
                        strides: vec![d.si, d.so],
                    });
                }
            }
            out.push(Sub {
                spec: si,
                digits,
                src_off,
                dst_off,
                unit: spec.unit,
                kind: spec.kind,
                q: qc,
                q_si,
                q_so,
                rev,
                r: rc,
                r_so,
            });
        }
    }
}

/// The load of a sub-job's units (or splat sources).
fn load_xfer(s: &Sub) -> Xfer {
    match s.kind {
        Unit::Dma => Xfer {
            n: s.q,
            len: s.unit,
            gm_stride: s.q_si.unsigned_abs(),
            ub_pitch: s.pitch(),
        },
        Unit::Splat { elem } => Xfer {
            n: s.q,
            len: elem,
            gm_stride: s.q_si.unsigned_abs(),
            ub_pitch: BLOCK,
        },
    }
}

/// One store of a sub-job (there are `store_count` of them).
fn store_xfer(s: &Sub) -> Xfer {
    if s.rev {
        Xfer::contiguous(s.unit)
    } else if s.r >= s.q {
        Xfer {
            n: s.r,
            len: s.unit,
            gm_stride: s.r_so.unsigned_abs(),
            ub_pitch: s.q * s.pitch(),
        }
    } else {
        Xfer {
            n: s.q,
            len: s.unit,
            gm_stride: s.q_so.unsigned_abs(),
            ub_pitch: s.pitch(),
        }
    }
}

/// Registers the bodies share.
#[derive(Clone, Copy)]
struct Regs {
    sbase: Reg,
    dbase: Reg,
    src: Reg,
    dst: Reg,
    ub: Reg,
    zero: Reg,
    mask: Reg,
    s: Scratch,
}

/// UB layout: constants, shared splat scratch, then `nbuf` buffers.
#[derive(Clone, Copy)]
struct Layout {
    /// The select pattern of 64-bit splats (first byte 0x55).
    sel: u64,
    /// Blocks of low and high words of 64-bit splats.
    lo: u64,
    hi: u64,
    /// Buffer `k` starts at `buf0 + k * buf`.
    buf0: u64,
    buf: u64,
    /// Splat sources start this far into a buffer.
    sources: u64,
}

/// Builds one kernel copying every spec (each a box between two entries of `args`), or
/// `None` when they copy nothing.
pub fn kernel(
    ctx: &LowerCtx<'_>,
    name: &str,
    specs: &[Spec],
    args: Vec<Operand>,
) -> Result<Option<Kernel>, LowerError> {
    let specs: Vec<Spec> = specs.iter().filter_map(|s| s.clone().normalize()).collect();
    if specs.is_empty() {
        return Ok(None);
    }
    let core = &ctx.target.core;
    let nbuf = kit::buffers(core);
    let total: u64 = specs.iter().map(Spec::out_bytes).sum();
    let buf_max = kit::floor_to(core.ub_bytes.saturating_sub(RESERVED) / nbuf as u64, BLOCK)
        .min(kit::MAX_TILE);
    if buf_max < 16 * BLOCK {
        return Err(ctx.error(format!(
            "the {}-byte unified buffer leaves no room for copy tiles",
            core.ub_bytes
        )));
    }
    // Splat sources round up to whole repeats: keep their slack out of the tile.
    let tile = kit::tile_bytes(total, core, buf_max - 8 * BLOCK);
    let mut subs = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        plan(i, s, tile, &mut subs);
    }
    for s in &subs {
        for x in [load_xfer(s), store_xfer(s)] {
            if !kit::fits(&x) {
                return Err(ctx.error(format!(
                    "a copy of {} bursts of {} bytes with a GM stride of {} bytes does not fit \
                     the DMA's fields (at most {MAX_BURSTS} bursts, gaps below 4 GiB)",
                    x.n, x.len, x.gm_stride
                )));
            }
        }
    }
    let sources = subs.iter().map(Sub::slot_bytes).max().unwrap_or(0);
    let buf = sources + subs.iter().map(Sub::source_bytes).max().unwrap_or(0);
    let lay = Layout {
        sel: 0,
        lo: BLOCK,
        hi: BLOCK + SPLAT64_MAX * BLOCK,
        buf0: RESERVED,
        buf,
        sources,
    };
    if buf > buf_max || lay.buf0 + nbuf as u64 * buf > core.ub_bytes {
        return Err(ctx.error(format!(
            "copy tiles of {buf} bytes do not fit {nbuf} times in the {}-byte unified buffer",
            core.ub_bytes
        )));
    }
    let split = Split::new(subs.iter().map(Sub::tasks).sum(), core);
    let chain = Chain {
        stages: if subs.iter().any(Sub::needs_vector) {
            &[Pipe::Mte2, Pipe::V, Pipe::Mte3]
        } else {
            &[Pipe::Mte2, Pipe::Mte3]
        },
        nbuf,
    };
    let mut a = Asm::new(name);
    a.tiling("tile_bytes", tile as i64);
    a.tiling("buffers", nbuf as i64);
    a.tiling("buffer_bytes", buf as i64);
    let f = Frame::new(&mut a, split);
    let regs = Regs {
        sbase: a.reg(),
        dbase: a.reg(),
        src: a.reg(),
        dst: a.reg(),
        ub: a.reg(),
        zero: a.reg(),
        mask: a.reg(),
        s: Scratch::new(&mut a),
    };
    a.movi(regs.zero, 0);
    if subs
        .iter()
        .any(|s| matches!(s.kind, Unit::Splat { elem: 8 }))
    {
        a.comment("select pattern 0x55: even lanes from the low words of 64-bit splats");
        kit::set_mask(&mut a, regs.zero, regs.mask, kit::first_mask(8));
        a.movi(regs.src, lay.sel as i64);
        a.movi(regs.dst, 0x5555_5555);
        a.vdup(DType::I32, regs.src, regs.dst);
    }
    chain.prologue(&mut a);
    let jobs: Vec<Job<'_>> = subs
        .iter()
        .map(|s| {
            let spec = &specs[s.spec];
            let (fr, rg) = (f, regs);
            let (src_arg, dst_arg) = (spec.src, spec.dst);
            Job {
                tasks: s.tasks(),
                setup: Box::new(move |a: &mut Asm| {
                    fr.arg(a, rg.sbase, src_arg);
                    fr.arg(a, rg.dbase, dst_arg);
                }),
                load: Box::new(move |a: &mut Asm, k: usize, t: Reg| {
                    load(a, s, &rg, &chain, &lay, k, t);
                }),
                rest: Box::new(move |a: &mut Asm, k: usize, t: Reg| {
                    rest(a, s, &rg, &chain, &lay, k, t);
                }),
            }
        })
        .collect();
    kit::run_jobs(&mut a, &f, nbuf, &jobs);
    chain.epilogue(&mut a);
    Ok(Some(ctx.kernel(a, split.blocks, args)?))
}

/// The loads of one task of sub-job `s` on buffer `k`.
fn load(a: &mut Asm, s: &Sub, g: &Regs, chain: &Chain, lay: &Layout, k: usize, t: Reg) {
    let [s0, ..] = g.s.r;
    let buf = lay.buf0 + k as u64 * lay.buf;
    kit::set_add(a, g.src, g.sbase, s.src_off, s0);
    kit::decompose(a, t, &s.digits, &[Some(g.src), None], &g.s);
    chain.begin(a, 0, k);
    match s.kind {
        Unit::Dma => {
            a.movi(g.ub, buf as i64);
            if s.rev {
                // Load the units in memory order: the last one first.
                kit::add_imm(a, g.src, (s.q as i64 - 1) * s.q_si, s0);
            }
        }
        Unit::Splat { .. } => a.movi(g.ub, (buf + lay.sources) as i64),
    }
    kit::dma(a, true, g.ub, g.src, &load_xfer(s));
    chain.end(a, 0, k);
}

/// The vector work and stores of one task of sub-job `s` on buffer `k`.
fn rest(a: &mut Asm, s: &Sub, g: &Regs, chain: &Chain, lay: &Layout, k: usize, t: Reg) {
    let [s0, s1, s2, s3] = g.s.r;
    let p = s.pitch();
    let buf = lay.buf0 + k as u64 * lay.buf;
    kit::set_add(a, g.dst, g.dbase, s.dst_off, s0);
    kit::decompose(a, t, &s.digits, &[None, Some(g.dst)], &g.s);
    let mut stage = 1;
    if chain.stages.len() == 3 {
        chain.begin(a, 1, k);
        if let Unit::Splat { elem } = s.kind {
            splat(a, s, g, lay, buf, elem);
        }
        if s.r > 1 {
            let q_bytes = s.q * p;
            a.comment(format_args!("replicate {} units {} times", s.q, s.r));
            a.movi(s0, (q_bytes / 4) as i64);
            a.set_mask_count(s0);
            a.movi(s1, buf as i64);
            a.movi(s2, (buf + q_bytes) as i64);
            counted(a, s3, s.r - 1, |a| {
                a.vmov(DType::I32, s2, s1);
                kit::add_imm(a, s2, q_bytes as i64, s0);
            });
        }
        chain.end(a, 1, k);
        stage = 2;
    }
    chain.begin(a, stage, k);
    a.movi(g.ub, buf as i64);
    let x = store_xfer(s);
    if s.rev {
        // Output unit j is the (q-1-j)-th loaded.
        kit::add_imm(a, g.ub, ((s.q - 1) * p) as i64, s0);
        counted(a, s3, s.q, |a| {
            kit::dma(a, false, g.ub, g.dst, &x);
            kit::add_imm(a, g.ub, -(p as i64), s0);
            kit::add_imm(a, g.dst, s.q_so, s0);
        });
    } else if s.r >= s.q {
        counted(a, s3, s.q, |a| {
            kit::dma(a, false, g.ub, g.dst, &x);
            kit::add_imm(a, g.ub, p as i64, s0);
            kit::add_imm(a, g.dst, s.q_so, s0);
        });
    } else {
        counted(a, s3, s.r, |a| {
            kit::dma(a, false, g.ub, g.dst, &x);
            kit::add_imm(a, g.ub, (s.q * p) as i64, s0);
            kit::add_imm(a, g.dst, s.r_so, s0);
        });
    }
    chain.end(a, stage, k);
}

/// Emits `step` `n` times: unrolled when short, else a counted loop on `counter`.
fn counted(a: &mut Asm, counter: Reg, n: u64, mut step: impl FnMut(&mut Asm)) {
    if n <= 4 {
        for _ in 0..n {
            step(a);
        }
        return;
    }
    let top = a.new_label("rep");
    a.movi(counter, n as i64);
    a.place(&top);
    step(a);
    let top_l = a.label(&top);
    a.r#loop(counter, top_l);
}

/// Builds `s.q` splat units at `buf` from the elements in the buffer's source slots.
fn splat(a: &mut Asm, s: &Sub, g: &Regs, lay: &Layout, buf: u64, elem: u64) {
    let [s0, s1, s2, s3] = g.s.r;
    let p = s.pitch();
    let src = buf + lay.sources;
    a.comment(format_args!("splat {} elements of {elem} bytes", s.q));
    // The DMA zero-pads each slot, so lane 0 holds the element zero-extended to 32 bits.
    kit::set_mask(a, g.zero, g.mask, kit::lane_mask(0));
    if elem <= 2 {
        // Repeat the element across the 32-bit lane.
        let m = if elem == 1 { 0x0101_0101 } else { 0x0001_0001 };
        a.movi(s0, src as i64);
        a.movi(s1, m);
        let reps = s.q.div_ceil(8);
        for c in 0..reps.div_ceil(units::REPEAT_MAX) {
            let n = (reps - c * units::REPEAT_MAX).min(units::REPEAT_MAX);
            a.vmuls(DType::I32, s0, s0, s1).repeat(n);
            kit::add_imm(a, s0, (n * units::REPEAT_BYTES) as i64, s2);
        }
    }
    // Eight copies of lane 0 into each unit's first block (64-bit: low words, then high).
    let (first, first_step) = if elem == 8 { (lay.lo, BLOCK) } else { (buf, p) };
    a.movi(s0, src as i64);
    a.movi(s1, first as i64);
    counted(a, s3, s.q, |a| {
        a.vbreduce(ReduceOp::Sum, DType::I32, s1, s0)
            .repeat(1)
            .src_blk(0)
            .src_rep(0);
        kit::add_imm(a, s0, BLOCK as i64, s2);
        kit::add_imm(a, s1, first_step as i64, s2);
    });
    if elem == 8 {
        kit::set_mask(a, g.zero, g.mask, kit::lane_mask(1));
        a.movi(s0, src as i64);
        a.movi(s1, lay.hi as i64);
        counted(a, s3, s.q, |a| {
            a.vbreduce(ReduceOp::Sum, DType::I32, s1, s0)
                .repeat(1)
                .src_blk(0)
                .src_rep(0);
            kit::add_imm(a, s0, BLOCK as i64, s2);
            kit::add_imm(a, s1, BLOCK as i64, s2);
        });
        kit::set_mask(a, g.zero, g.mask, kit::first_mask(8));
        a.movi(s0, lay.lo as i64);
        a.movi(s2, lay.hi as i64);
        a.movi(s1, buf as i64);
        a.movi(g.ub, lay.sel as i64);
        counted(a, s3, s.q, |a| {
            a.vsel(DType::I32, s1, s0, s2, g.ub);
            a.addi(s0, s0, BLOCK);
            a.addi(s2, s2, BLOCK);
            a.addi(s1, s1, p);
        });
    }
    if s.unit > BLOCK {
        // Fill each unit from its first block (zero source strides re-read it).
        a.movi(s0, s.unit.div_ceil(4) as i64);
        a.set_mask_count(s0);
        a.movi(s1, buf as i64);
        counted(a, s3, s.q, |a| {
            a.vmov(DType::I32, s1, s1).src_blk(0).src_rep(0);
            kit::add_imm(a, s1, p as i64, s2);
        });
    }
}
