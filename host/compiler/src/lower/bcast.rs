//! Broadcasting element-wise kernels: any numpy broadcast of any number of inputs, tiled over
//! the output and double-buffered like `stream.rs`.
//!
//! ```text
//!   shapes ─▶ canonical(): drop size-1 output axes, merge neighbours with the same
//!             "which inputs are broadcast here" pattern ─▶ dims [.., P, L] + element strides
//!   plan():   chunk mode — a tile is C elements of one output row of L (long or few rows)
//!             row mode   — a tile is S rows of L, each row padded to a 32-byte multiple in UB
//!   per input, per tile:
//!     stream  full along the tile:         DMA (rows padded by the byte-granular DMA)
//!     row     repeated over the tile rows: DMA one row, replicate it by doubling `vmov`s,
//!             or read the one copy from a per-row loop; resident when it never changes
//!     column  one value per row:           DMA the values one per 32-byte block, splat
//!     scalar  one value per tile:          the same with one block; resident when constant
//! ```
//!
//! A *splat* is a 32-byte block holding one value in every lane, built on the vector unit by a
//! `vbreduce` whose mask keeps lane 0 of each block and whose source block stride is 0: repeat
//! r reads block r eight times and writes its lane-0 value to the eight lanes of output block
//! r. The body then reads it with block and repeat stride 0 (see `vec.rs`), so broadcasting
//! never needs the scalar unit to read tensor data.
//!
//! One-byte tensors (bool, uint8, int8) and int64 tensors have no vector type: in chunk mode
//! the DMA spreads them one element per 32-byte block (`*_pad` copies with a 1-byte or 4-byte
//! burst; int64 as its low and high words) and a `vbreduce` gathers lane 0 of every block into
//! contiguous i32 values. Outputs go the other way: eight `vbreduce`s whose mask keeps lane k
//! of each block (k = 0..7) scatter value i into the first bytes of block i, and a padded DMA
//! writes one byte or word per block. Both cost 32 bytes of DMA traffic per element instead of
//! one or eight, which is fine for masks; row mode never sees them (the lowering converts such
//! tensors through a GM workspace with a one-dimensional chunk-mode pass first).

use gearsim_isa::{DType, Pipe, ReduceOp, SReg, units};

use super::dma;
use super::queue::{self, VECIN, VECOUT};
use super::stream::{Dir, copy};
use super::vec::View;
use super::writer::{Asm, Reg};
use crate::CoreSpec;

/// Smallest slice worth a block of its own.
const MIN_ELEMS_PER_BLOCK: u64 = 2048;
/// Chunks are multiples of this many elements (whole vector repeats, 32-byte aligned buffers).
const QUANTUM: u64 = 64;
/// Tiles at least this many elements when the shapes allow (shorter ones spend more time
/// synchronising than moving).
const MIN_TILE: u64 = 256;
/// Most elements of a chunk that spreads a tensor one element per block (DMA bursts are a
/// 12-bit count, and each element takes 32 bytes of UB).
const MAX_SPREAD_TILE: u64 = 2048;
/// Most rows of a tile (DMA bursts are a 12-bit count).
const MAX_ROWS: u64 = units::BURST_COUNT_MAX;
/// A repeated row at least this long is read in place by a per-row loop instead of being
/// replicated over the tile (the loop then costs little per element).
const REPLICATE_MAX_ROW_BYTES: u64 = 1024;
/// Every UB region starts on this boundary and is a multiple of it, so a vector instruction
/// reading whole repeats never leaves its region.
const REGION: u64 = units::REPEAT_BYTES;
/// UB left free past the last region (a per-row instruction reads whole repeats of its last
/// row).
const SLACK: u64 = 512;
/// Flag id of the one-time resident loads (0 and 1 are the double buffer's).
const RESIDENT_FLAG: usize = 2;
/// Bytes of a DMA block (the unit of burst lengths and gaps) and of a splat.
const BLOCK: u64 = units::BLOCK_BYTES;
/// Most repeats one vector instruction takes in normal-mask mode (8-bit field).
const MAX_REPEAT: u64 = units::REPEAT_MAX;

/// The canonical broadcast form: output dims with no size-1 axis and no two neighbours with
/// the same broadcast pattern, and each input's element strides along them (0 where the input
/// is broadcast).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canon {
    /// Output dims (at least one).
    pub dims: Vec<u64>,
    /// Per input, its stride in elements along each of `dims`.
    pub strides: Vec<Vec<u64>>,
}

/// The canonical form of broadcasting `ins` to `out` (numpy rules; `out` is their broadcast).
pub fn canonical(out: &[u64], ins: &[&[u64]]) -> Canon {
    let r = out.len();
    let padded: Vec<Vec<u64>> = ins
        .iter()
        .map(|s| {
            let mut v = vec![1u64; r.saturating_sub(s.len())];
            v.extend_from_slice(s);
            v
        })
        .collect();
    let mut dims: Vec<u64> = Vec::new();
    let mut pats: Vec<Vec<bool>> = Vec::new();
    for (j, &d) in out.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let p: Vec<bool> = padded
            .iter()
            .map(|s| s.get(j).is_some_and(|&x| x != 1))
            .collect();
        match (dims.last_mut(), pats.last()) {
            (Some(last), Some(lp)) if *lp == p => *last *= d,
            _ => {
                dims.push(d);
                pats.push(p);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        pats.push(vec![true; ins.len()]);
    }
    let strides = (0..ins.len())
        .map(|k| {
            let mut st = vec![0; dims.len()];
            let mut acc = 1;
            for ax in (0..dims.len()).rev() {
                if pats[ax][k] {
                    st[ax] = acc;
                    acc *= dims[ax];
                }
            }
            st
        })
        .collect();
    Canon { dims, strides }
}

/// What a one-byte element means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteKind {
    /// Any non-zero byte is true; loads as 0 or 1.
    Bool,
    /// Loads as 0..=255.
    U8,
    /// Loads sign-extended.
    I8,
}

/// How a tensor's elements are stored in GM and seen by the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fmt {
    /// Elements of this many bytes (2 or 4), moved as they are.
    Plain(u64),
    /// One byte per element, seen as i32 (outputs: the low byte of the i32 the body writes).
    Byte(ByteKind),
    /// Eight-byte integers, seen as two i32 views: the low word, then the high word.
    I64,
}

impl Fmt {
    /// Bytes per element in GM.
    pub fn gm_bytes(self) -> u64 {
        match self {
            Fmt::Plain(e) => e,
            Fmt::Byte(_) => 1,
            Fmt::I64 => 8,
        }
    }

    /// Views the body sees for one tensor.
    pub fn words(self) -> usize {
        match self {
            Fmt::I64 => 2,
            Fmt::Plain(_) | Fmt::Byte(_) => 1,
        }
    }

    /// Bytes per element of the values the body sees.
    pub fn ub_bytes(self) -> u64 {
        match self {
            Fmt::Plain(e) => e,
            Fmt::Byte(_) | Fmt::I64 => 4,
        }
    }

    /// Whether the DMA spreads the elements one per 32-byte block.
    fn spread(self) -> bool {
        !matches!(self, Fmt::Plain(_))
    }

    /// Bytes of one word of one element in GM.
    fn word_bytes(self) -> u64 {
        match self {
            Fmt::Plain(e) => e,
            Fmt::Byte(_) => 1,
            Fmt::I64 => 4,
        }
    }
}

/// An input of a job.
#[derive(Debug, Clone)]
pub struct Input {
    /// Its index in the argument array.
    pub arg: usize,
    /// Its storage.
    pub fmt: Fmt,
    /// Its element strides along the job's dims (0 where broadcast).
    pub strides: Vec<u64>,
}

/// An output of a job (shaped like the job's dims, contiguous).
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Its index in the argument array.
    pub arg: usize,
    /// Its storage.
    pub fmt: Fmt,
}

/// A constant the body reads as a splat view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Const {
    /// Vector type of the value.
    pub ty: DType,
    /// Its raw bits.
    pub bits: u64,
}

impl Const {
    /// An f32 constant.
    pub fn f32(v: f32) -> Const {
        Const {
            ty: DType::F32,
            bits: u64::from(v.to_bits()),
        }
    }

    /// An i32 constant.
    pub fn i32(v: i32) -> Const {
        Const {
            ty: DType::I32,
            bits: u64::from(v as u32),
        }
    }
}

/// What the body of a tile works with. The vector mask is in counter mode for `count`
/// elements; the body must leave it so.
#[derive(Debug, Clone)]
pub struct Body {
    /// Input views in order, an int64 input contributing two (low, high).
    pub ins: Vec<View>,
    /// Output views (flat), an int64 output contributing two.
    pub outs: Vec<View>,
    /// Scratch views (flat), as declared.
    pub scratch: Vec<View>,
    /// The job's constants as splat views.
    pub consts: Vec<View>,
    /// A register the body may clobber (immediates).
    pub tmp: Reg,
    /// Elements the mask enables.
    pub count: u64,
}

/// The body: vector instructions computing the outputs from the inputs.
pub type BodyFn<'a> = &'a dyn Fn(&mut Asm, &Body);

/// A broadcasting element-wise kernel to plan and write.
pub struct Job<'a> {
    /// Canonical output dims.
    pub dims: Vec<u64>,
    /// Inputs.
    pub inputs: Vec<Input>,
    /// Outputs.
    pub outputs: Vec<Output>,
    /// Bytes per element of each scratch buffer.
    pub scratch: Vec<u64>,
    /// Constants.
    pub consts: Vec<Const>,
    /// The body.
    pub body: BodyFn<'a>,
}

/// How an input is laid out over a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Full along the tile: loaded every tile.
    Stream,
    /// The same row for every row of the tile.
    Row { resident: bool },
    /// One value per row of the tile.
    Column,
    /// One value for the whole tile.
    Scalar { resident: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A tile is a chunk of one output row.
    Chunk,
    /// A tile is whole rows; `per_row` runs the body once per row.
    Rows { per_row: bool },
}

/// UB addresses of every region (see `layout`).
#[derive(Debug, Clone, Default)]
struct Layout {
    /// `[buffer][input][word]`: where MTE2 puts the input in that buffer (empty if resident).
    stage: [Vec<Vec<u64>>; 2],
    /// `[input][word]`: values the vector unit derives (gathered words, splats).
    vin: Vec<Vec<u64>>,
    /// `[input]`: temporary of the int8 sign extension.
    itmp: Vec<Option<u64>>,
    /// `[input][word]`: resident raw loads.
    res_raw: Vec<Vec<u64>>,
    /// `[input][word]`: resident values (replicated rows, splats).
    res: Vec<Vec<u64>>,
    /// `[buffer][output][word]`: where MTE3 reads the output in that buffer.
    obuf: [Vec<Vec<u64>>; 2],
    /// `[output][word]`: values the body writes for a spread output.
    vout: Vec<Vec<u64>>,
    /// Scratch buffers.
    scratch: Vec<u64>,
    /// Constant splats.
    consts: Vec<u64>,
    /// Bytes used.
    total: u64,
}

/// The static shape of a job's kernel.
#[derive(Debug, Clone)]
pub struct Plan {
    mode: Mode,
    kinds: Vec<Kind>,
    /// Elements (chunk mode) or rows (row mode) per full tile.
    size: u64,
    /// Row length padded for UB (row mode).
    lp: u64,
    /// Tiles along the tiled axis, and the size of the last one.
    nt: u64,
    tail: u64,
    /// Tiles in all.
    ttot: u64,
    /// Blocks.
    pub block_dim: u32,
    /// Tiles per block (the last block takes the rest).
    per_block: u64,
    layout: Layout,
    consts: Vec<Const>,
}

fn round_up(x: u64, q: u64) -> u64 {
    x.div_ceil(q) * q
}

/// The i32 constant the int8 sign extension masks with.
const SIGN_BIT_I8: i32 = 0x80;

impl Job<'_> {
    fn m(&self) -> usize {
        self.dims.len()
    }

    fn total(&self) -> u64 {
        self.dims.iter().product()
    }

    fn any_spread(&self) -> bool {
        self.inputs.iter().any(|i| i.fmt.spread()) || self.outputs.iter().any(|o| o.fmt.spread())
    }

    fn kinds(&self, mode: Mode) -> Vec<Kind> {
        let m = self.m();
        self.inputs
            .iter()
            .map(|i| {
                let st = &i.strides;
                match mode {
                    Mode::Chunk => {
                        if st[m - 1] != 0 {
                            Kind::Stream
                        } else {
                            Kind::Scalar {
                                resident: st.iter().all(|&s| s == 0),
                            }
                        }
                    }
                    Mode::Rows { .. } => {
                        let outer_zero = st[..m - 2].iter().all(|&s| s == 0);
                        match (st[m - 1] != 0, st[m - 2] != 0) {
                            (true, true) => Kind::Stream,
                            (true, false) => Kind::Row {
                                resident: outer_zero,
                            },
                            (false, true) => Kind::Column,
                            (false, false) => Kind::Scalar {
                                resident: outer_zero,
                            },
                        }
                    }
                }
            })
            .collect()
    }

    /// The UB regions for tiles of `size` (elements or rows).
    fn layout(&self, kinds: &[Kind], mode: Mode, size: u64, lp: u64, consts: &[Const]) -> Layout {
        let mut off = 0u64;
        let mut alloc = |bytes: u64| {
            let o = off;
            off += round_up(bytes.max(1), REGION);
            o
        };
        let (tile, rows) = match mode {
            Mode::Chunk => (size, 1),
            Mode::Rows { .. } => (size * lp, size),
        };
        let per_row = matches!(mode, Mode::Rows { per_row: true });
        let body_elems = if per_row { lp } else { tile };
        let mut l = Layout {
            consts: consts.iter().map(|_| alloc(32)).collect(),
            scratch: self
                .scratch
                .iter()
                .map(|b| alloc(b * round_up(body_elems, QUANTUM)))
                .collect(),
            ..Layout::default()
        };
        let n = self.inputs.len();
        l.vin = vec![Vec::new(); n];
        l.itmp = vec![None; n];
        l.res_raw = vec![Vec::new(); n];
        l.res = vec![Vec::new(); n];
        l.stage = [vec![Vec::new(); n], vec![Vec::new(); n]];
        for (i, (inp, kind)) in self.inputs.iter().zip(kinds).enumerate() {
            let words = inp.fmt.words();
            let e = inp.fmt.ub_bytes();
            if inp.fmt == Fmt::Byte(ByteKind::I8) {
                l.itmp[i] = Some(alloc(4 * round_up(size.max(8), QUANTUM)));
            }
            match *kind {
                Kind::Stream if inp.fmt.spread() => {
                    for k in 0..2 {
                        l.stage[k][i] = (0..words)
                            .map(|_| alloc(32 * round_up(size, QUANTUM)))
                            .collect();
                    }
                    l.vin[i] = (0..words)
                        .map(|_| alloc(4 * round_up(size, QUANTUM)))
                        .collect();
                }
                Kind::Stream => {
                    for k in 0..2 {
                        l.stage[k][i] = vec![alloc(e * round_up(tile, QUANTUM))];
                    }
                }
                Kind::Row { resident } => {
                    let bytes = if per_row { lp * e } else { rows * lp * e };
                    if resident {
                        l.res[i] = vec![alloc(bytes)];
                    } else {
                        for k in 0..2 {
                            l.stage[k][i] = vec![alloc(bytes)];
                        }
                    }
                }
                Kind::Column => {
                    for k in 0..2 {
                        l.stage[k][i] = vec![alloc(32 * rows)];
                    }
                    l.vin[i] = vec![alloc(32 * rows)];
                }
                Kind::Scalar { resident: true } => {
                    l.res_raw[i] = (0..words).map(|_| alloc(32)).collect();
                    l.res[i] = (0..words).map(|_| alloc(32)).collect();
                }
                Kind::Scalar { resident: false } => {
                    for k in 0..2 {
                        l.stage[k][i] = (0..words).map(|_| alloc(32)).collect();
                    }
                    l.vin[i] = (0..words).map(|_| alloc(32)).collect();
                }
            }
        }
        let no = self.outputs.len();
        l.vout = vec![Vec::new(); no];
        l.obuf = [vec![Vec::new(); no], vec![Vec::new(); no]];
        for (o, out) in self.outputs.iter().enumerate() {
            let words = out.fmt.words();
            if out.fmt.spread() {
                l.vout[o] = (0..words)
                    .map(|_| alloc(4 * round_up(size, QUANTUM)))
                    .collect();
                for k in 0..2 {
                    l.obuf[k][o] = (0..words)
                        .map(|_| alloc(32 * round_up(size, QUANTUM)))
                        .collect();
                }
            } else {
                for k in 0..2 {
                    l.obuf[k][o] = vec![alloc(out.fmt.ub_bytes() * round_up(tile, QUANTUM))];
                }
            }
        }
        l.total = off + SLACK;
        l
    }

    /// Constants: the job's, then the ones the loads need.
    fn all_consts(&self) -> Vec<Const> {
        let mut c = self.consts.clone();
        if self.inputs.iter().any(|i| i.fmt == Fmt::Byte(ByteKind::I8)) {
            c.push(Const::i32(SIGN_BIT_I8));
        }
        c
    }

    /// Blocks to aim for.
    fn blocks_target(&self, core: &CoreSpec) -> u64 {
        let cores = core.vector_blocks();
        self.total().div_ceil(MIN_ELEMS_PER_BLOCK).clamp(1, cores)
    }

    /// Chooses the tiling for `core`.
    pub fn plan(&self, core: &CoreSpec) -> Result<Plan, String> {
        let m = self.m();
        if self.inputs.iter().any(|i| i.strides.len() != m) {
            return Err("internal error: input strides do not match the dims".into());
        }
        let cores = core.vector_blocks();
        if m >= 2 && !self.any_spread() {
            let rows_total: u64 = self.dims[..m - 1].iter().product();
            let emax = self
                .inputs
                .iter()
                .map(|i| i.fmt.ub_bytes())
                .chain(self.outputs.iter().map(|o| o.fmt.ub_bytes()))
                .max()
                .unwrap_or(4);
            let rows_pay = rows_total >= 2 * cores || self.dims[m - 1] * emax <= 8192;
            if rows_pay && let Some(p) = self.plan_rows(core) {
                return Ok(p);
            }
        }
        self.plan_chunk(core)
    }

    fn finish(
        &self,
        core: &CoreSpec,
        mode: Mode,
        size: u64,
        lp: u64,
        extent: u64,
        lines: u64,
    ) -> Plan {
        let kinds = self.kinds(mode);
        let consts = self.all_consts();
        let nt = extent.div_ceil(size);
        let tail = extent - (nt - 1) * size;
        let ttot = lines * nt;
        let cores = core.vector_blocks();
        let blocks = ttot.min(cores).min(self.blocks_target(core)).max(1);
        let per_block = ttot.div_ceil(blocks);
        let block_dim = ttot.div_ceil(per_block) as u32;
        let layout = self.layout(&kinds, mode, size, lp, &consts);
        Plan {
            mode,
            kinds,
            size,
            lp,
            nt,
            tail,
            ttot,
            block_dim,
            per_block,
            layout,
            consts,
        }
    }

    fn plan_rows(&self, core: &CoreSpec) -> Option<Plan> {
        let m = self.m();
        let (p, l) = (self.dims[m - 2], self.dims[m - 1]);
        let q: u64 = self.dims[..m - 2].iter().product();
        let emin = self
            .inputs
            .iter()
            .map(|i| i.fmt.ub_bytes())
            .chain(self.outputs.iter().map(|o| o.fmt.ub_bytes()))
            .min()
            .unwrap_or(4);
        let lp = round_up(l, 32 / emin);
        let probe = self.kinds(Mode::Rows { per_row: false });
        let widest_row = self
            .inputs
            .iter()
            .zip(&probe)
            .filter(|(_, k)| matches!(k, Kind::Row { .. }))
            .map(|(i, _)| lp * i.fmt.ub_bytes())
            .max()
            .unwrap_or(0);
        let per_row = probe.contains(&Kind::Column) || widest_row >= REPLICATE_MAX_ROW_BYTES;
        let mode = Mode::Rows { per_row };
        let kinds = self.kinds(mode);
        let consts = self.all_consts();
        let fits = |s: u64| self.layout(&kinds, mode, s, lp, &consts).total <= core.ub_bytes;
        if !fits(1) {
            return None;
        }
        let (mut lo, mut hi) = (1u64, p.min(MAX_ROWS));
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let smax = lo;
        let want = (q * p)
            .div_ceil(self.blocks_target(core) * 4)
            .max(MIN_TILE.div_ceil(l))
            .max(1);
        let s = want.min(smax).min(p);
        let nt = p.div_ceil(s);
        let s = p.div_ceil(nt);
        Some(self.finish(core, mode, s, lp, p, q))
    }

    fn plan_chunk(&self, core: &CoreSpec) -> Result<Plan, String> {
        let m = self.m();
        let l = self.dims[m - 1];
        let q: u64 = self.dims[..m - 1].iter().product();
        let mode = Mode::Chunk;
        let kinds = self.kinds(mode);
        let consts = self.all_consts();
        let fits = |c: u64| self.layout(&kinds, mode, c, 1, &consts).total <= core.ub_bytes;
        if !fits(QUANTUM) {
            return Err(format!(
                "one {QUANTUM}-element tile of the streamed tensors does not fit in the {}-byte \
                 unified buffer",
                core.ub_bytes
            ));
        }
        let cap = if self.any_spread() {
            MAX_SPREAD_TILE
        } else {
            u64::MAX / 2
        };
        let (mut lo, mut hi) = (1u64, round_up(l, QUANTUM).min(cap) / QUANTUM);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid * QUANTUM) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let cmax = lo * QUANTUM;
        let want = round_up(
            (q * l).div_ceil(self.blocks_target(core) * 4).max(MIN_TILE),
            QUANTUM,
        );
        let c = want.min(cmax).min(round_up(l, QUANTUM));
        let nt = l.div_ceil(c);
        let c = round_up(l.div_ceil(nt), QUANTUM).min(cmax);
        Ok(self.finish(core, mode, c, 1, l, q))
    }
}

/// Registers of the kernel being written.
struct Regs {
    /// Per input, then per output: its GM address at the current line (outer position).
    ptr: Vec<Reg>,
    zero: Reg,
    /// Scratch; also the body's immediate register (the body runs with nothing of ours live).
    t1: Reg,
    t2: Reg,
    addr: Reg,
    /// Tiles left in this block.
    cnt: Reg,
    /// Tile index along the tiled axis.
    j: Option<Reg>,
    /// Index of the current line (position over the outer axes).
    line: Option<Reg>,
    /// Row counter of the per-row loop.
    rows: Option<Reg>,
    vin: Vec<Vec<Reg>>,
    vout: Vec<Vec<Reg>>,
    scratch: Vec<Reg>,
    consts: Vec<Reg>,
}

struct Emit<'a> {
    job: &'a Job<'a>,
    plan: &'a Plan,
    r: Regs,
    /// Outer axes (walked line by line) and the tiled axis.
    outer: Vec<usize>,
    tiled: usize,
    /// Per input, then per output: byte strides along each axis.
    bst: Vec<Vec<u64>>,
}

/// Writes the kernel of `job` into `a` following `plan`.
pub fn emit(job: &Job<'_>, plan: &Plan, a: &mut Asm) {
    let m = job.m();
    let (outer, tiled) = match plan.mode {
        Mode::Chunk => ((0..m - 1).collect::<Vec<_>>(), m - 1),
        Mode::Rows { .. } => ((0..m - 2).collect::<Vec<_>>(), m - 2),
    };
    a.tiling("elements", job.total() as i64);
    a.tiling("block_dim", i64::from(plan.block_dim));
    a.tiling(
        match plan.mode {
            Mode::Chunk => "chunk",
            Mode::Rows { .. } => "rows",
        },
        plan.size as i64,
    );
    if let Mode::Rows { per_row } = plan.mode {
        a.tiling("row_padded", plan.lp as i64);
        a.tiling("per_row_loop", i64::from(per_row));
    }
    a.tiling("tiles", plan.ttot as i64);
    a.tiling("tiles_per_block", plan.per_block as i64);
    a.tiling("ub_bytes", plan.layout.total as i64);
    for (ax, d) in job.dims.iter().enumerate() {
        a.comment(format_args!("axis {ax}: {d}"));
    }
    let args = a.reg();
    a.sreg(args, SReg::Args);
    let ptr = job
        .inputs
        .iter()
        .map(|i| i.arg)
        .chain(job.outputs.iter().map(|o| o.arg))
        .map(|arg| a.arg(args, arg))
        .collect();
    let zero = a.constant(0);
    let (t1, t2, addr, cnt) = (a.reg(), a.reg(), a.reg(), a.reg());
    let j = (plan.nt > 1).then(|| a.reg());
    let line = (!outer.is_empty()).then(|| a.reg());
    let rows = matches!(plan.mode, Mode::Rows { per_row: true }).then(|| a.reg());
    let out_strides = {
        let mut st = vec![0; m];
        let mut acc = 1;
        for ax in (0..m).rev() {
            st[ax] = acc;
            acc *= job.dims[ax];
        }
        st
    };
    let bst = job
        .inputs
        .iter()
        .map(|i| (&i.strides, i.fmt.gm_bytes()))
        .chain(job.outputs.iter().map(|o| (&out_strides, o.fmt.gm_bytes())))
        .map(|(st, es)| st.iter().map(|s| s * es).collect())
        .collect();
    let vin = job
        .inputs
        .iter()
        .map(|i| (0..i.fmt.words()).map(|_| a.reg()).collect())
        .collect();
    let vout = job
        .outputs
        .iter()
        .map(|o| (0..o.fmt.words()).map(|_| a.reg()).collect())
        .collect();
    let scratch = plan
        .layout
        .scratch
        .iter()
        .map(|&off| {
            let r = a.reg();
            a.movi(r, off as i64);
            r
        })
        .collect();
    let consts = plan
        .layout
        .consts
        .iter()
        .map(|&off| {
            let r = a.reg();
            a.movi(r, off as i64);
            r
        })
        .collect();
    let e = Emit {
        job,
        plan,
        r: Regs {
            ptr,
            zero,
            t1,
            t2,
            addr,
            cnt,
            j,
            line,
            rows,
            vin,
            vout,
            scratch,
            consts,
        },
        outer,
        tiled,
        bst,
    };
    e.prologue(a);
    e.residents(a);
    e.main_loop(a);
    a.comment("consume the flags the last tiles set");
    queue::drain(a, &[VECIN, VECOUT], 2);
}

impl Emit<'_> {
    /// This block's tile count and the counters of its first tile.
    fn prologue(&self, a: &mut Asm) {
        let r = &self.r;
        let p = self.plan;
        a.comment("tiles of this block: [block_idx * per_block, +count)");
        a.sreg(r.cnt, SReg::BlockIdx);
        a.movi(r.t1, p.per_block as i64);
        a.mul(r.addr, r.t1, r.cnt);
        a.movi(r.cnt, p.ttot as i64);
        a.sub(r.cnt, r.cnt, r.addr);
        a.minu(r.cnt, r.cnt, r.t1);
        if let Some(j) = r.j {
            a.movi(r.t1, p.nt as i64);
            a.remu(j, r.addr, r.t1);
            a.divu(r.addr, r.addr, r.t1);
        }
        if let Some(line) = r.line {
            a.comment("move every pointer to the first line: index by index over the outer axes");
            a.mov(line, r.addr);
            for &ax in self.outer.iter().rev() {
                a.movi(r.t1, self.job.dims[ax] as i64);
                a.remu(r.t2, r.addr, r.t1);
                a.divu(r.addr, r.addr, r.t1);
                for (ptr, st) in r.ptr.iter().zip(&self.bst) {
                    if st[ax] != 0 {
                        a.movi(r.t1, st[ax] as i64);
                        a.mul(r.t1, r.t1, r.t2);
                        a.add(*ptr, *ptr, r.t1);
                    }
                }
            }
        }
        a.comment("both input buffers and both output buffers start free");
        queue::prime(a, &[VECIN, VECOUT], 2);
    }

    /// Resident inputs and constants, loaded and prepared once per block.
    fn residents(&self, a: &mut Asm) {
        let r = &self.r;
        let l = &self.plan.layout;
        // Constants first: normalising a resident int8 value reads one.
        for (c, &off) in self.plan.consts.iter().zip(&l.consts) {
            let lanes = BLOCK / c.ty.size() as u64;
            a.mask_count(r.t1, lanes);
            a.movi(r.t2, off as i64);
            a.movi(r.t1, c.bits as i64);
            a.vdup(c.ty, r.t2, r.t1);
        }
        let mut loads = false;
        for (i, kind) in self.plan.kinds.iter().enumerate() {
            let inp = &self.job.inputs[i];
            match *kind {
                Kind::Row { resident: true } => {
                    let row_bytes = self.job.dims[self.job.m() - 1] * inp.fmt.ub_bytes();
                    a.comment(format_args!("input {i}: one resident row"));
                    a.movi(r.t2, l.res[i][0] as i64);
                    copy(a, Dir::GmToUb, r.t2, r.ptr[i], row_bytes);
                    loads = true;
                }
                Kind::Scalar { resident: true } => {
                    a.comment(format_args!("input {i}: one resident value"));
                    for w in 0..inp.fmt.words() {
                        a.movi(r.t2, l.res_raw[i][w] as i64);
                        a.addi(r.addr, r.ptr[i], 4 * w);
                        a.copy_gm_to_ub_pad(r.t2, r.addr, 1, inp.fmt.word_bytes());
                    }
                    loads = true;
                }
                _ => {}
            }
        }
        if loads {
            queue::barrier(a, Pipe::Mte2, Pipe::V, RESIDENT_FLAG);
        }
        for (i, kind) in self.plan.kinds.iter().enumerate() {
            let inp = &self.job.inputs[i];
            match *kind {
                Kind::Row { resident: true } if !self.per_row() => {
                    self.replicate(a, l.res[i][0], inp.fmt.ub_bytes(), self.plan.size);
                }
                Kind::Scalar { resident: true } => {
                    if let Fmt::Byte(b) = inp.fmt {
                        self.normalize(a, b, l.res_raw[i][0], 8, l.itmp[i]);
                    }
                    for w in 0..inp.fmt.words() {
                        self.splat(a, l.res[i][w], l.res_raw[i][w], 1, inp.fmt == Fmt::Plain(2));
                    }
                }
                _ => {}
            }
        }
    }

    fn per_row(&self) -> bool {
        matches!(self.plan.mode, Mode::Rows { per_row: true })
    }

    fn row_len(&self) -> u64 {
        self.job.dims[self.job.m() - 1]
    }

    /// The tile loop: pairs of tiles in buffers 0 and 1 while tiles remain.
    fn main_loop(&self, a: &mut Asm) {
        let r = &self.r;
        let top = a.new_label("tile_pair");
        let done = a.new_label("tiles_done");
        a.place(&top);
        self.tile(a, 0);
        self.advance(a);
        a.addi(r.cnt, r.cnt, -1);
        let done_l = a.label(&done);
        a.beq(r.cnt, r.zero, done_l);
        self.tile(a, 1);
        self.advance(a);
        let top_l = a.label(&top);
        a.r#loop(r.cnt, top_l);
        a.place(&done);
    }

    /// Steps the counters to the next tile.
    fn advance(&self, a: &mut Asm) {
        let r = &self.r;
        let end = a.new_label("next_tile");
        if let Some(j) = r.j {
            a.addi(j, j, 1);
            a.movi(r.t1, self.plan.nt as i64);
            let end_l = a.label(&end);
            a.bne(j, r.t1, end_l);
            a.movi(j, 0);
        }
        if let Some(line) = r.line {
            // Next line: step every pointer along the innermost outer axis; where that axis
            // wraps (the line index is a multiple of its period) step back and carry outward.
            a.addi(line, line, 1);
            let mut period = 1u64;
            for (n, &ax) in self.outer.iter().rev().enumerate() {
                for (ptr, st) in r.ptr.iter().zip(&self.bst) {
                    add_const(a, *ptr, st[ax] as i64, r.t1);
                }
                period *= self.job.dims[ax];
                if n + 1 == self.outer.len() {
                    break;
                }
                a.movi(r.t1, period as i64);
                a.remu(r.t1, line, r.t1);
                let end_l = a.label(&end);
                a.bne(r.t1, r.zero, end_l);
                for (ptr, st) in r.ptr.iter().zip(&self.bst) {
                    add_const(a, *ptr, -((st[ax] * self.job.dims[ax]) as i64), r.t1);
                }
            }
        }
        a.place(&end);
    }

    /// One tile in buffer `k`, the full or the last variant along the tiled axis.
    fn tile(&self, a: &mut Asm, k: usize) {
        let p = self.plan;
        match self.r.j {
            Some(j) if p.tail != p.size => {
                let last = a.new_label("last_tile");
                let end = a.new_label("tile_end");
                a.movi(self.r.t1, p.nt as i64 - 1);
                let last_l = a.label(&last);
                a.beq(j, self.r.t1, last_l);
                self.tile_body(a, k, p.size);
                let end_l = a.label(&end);
                a.jmp(end_l);
                a.place(&last);
                self.tile_body(a, k, p.tail);
                a.place(&end);
            }
            // One tile along the axis (no loop register): it is the tail, whose length may
            // not be a whole chunk.
            None => self.tile_body(a, k, p.tail),
            _ => self.tile_body(a, k, p.size),
        }
    }

    /// `dst` = the GM address of tensor `t` (inputs, then outputs) for this tile.
    fn gm_addr(&self, a: &mut Asm, dst: Reg, t: usize) {
        let r = &self.r;
        a.mov(dst, r.ptr[t]);
        if let Some(j) = r.j {
            let st = self.bst[t][self.tiled] * self.plan.size;
            if st != 0 {
                a.movi(r.t1, st as i64);
                a.mul(r.t1, r.t1, j);
                a.add(dst, dst, r.t1);
            }
        }
    }

    /// Rows DMA between GM (`gm`, rows contiguous) and UB (`ub`, rows `lp` elements apart).
    fn rows_dma(&self, a: &mut Asm, dir: Dir, ub: Reg, gm: Reg, rows: u64, e: u64) {
        let load = dir == Dir::GmToUb;
        let (l, lp) = (self.row_len(), self.plan.lp);
        let (bytes, ub_row) = (l * e, lp * e);
        let (dst, src) = if load { (ub, gm) } else { (gm, ub) };
        if bytes == ub_row {
            copy(a, dir, dst, src, rows * bytes);
        } else {
            dma::rows(
                a,
                dir,
                ub,
                gm,
                rows,
                bytes,
                0,
                ub_row - round_up(bytes, BLOCK),
            );
        }
    }

    /// One tile of `v` (elements or rows) in buffer `k`.
    fn tile_body(&self, a: &mut Asm, k: usize, v: u64) {
        let r = &self.r;
        let job = self.job;
        let l = &self.plan.layout;
        let rows_mode = !matches!(self.plan.mode, Mode::Chunk);
        a.comment(format_args!("---- tile of {v} in buffer {k}"));
        VECIN.alloc(a, k);
        for (i, kind) in self.plan.kinds.iter().enumerate() {
            let inp = &job.inputs[i];
            let (fmt, e) = (inp.fmt, inp.fmt.ub_bytes());
            match *kind {
                Kind::Row { resident: true } | Kind::Scalar { resident: true } => continue,
                _ => {}
            }
            self.gm_addr(a, r.addr, i);
            a.movi(r.t2, l.stage[k][i][0] as i64);
            match *kind {
                Kind::Stream if rows_mode => self.rows_dma(a, Dir::GmToUb, r.t2, r.addr, v, e),
                Kind::Stream => match fmt {
                    Fmt::Plain(_) => copy(a, Dir::GmToUb, r.t2, r.addr, v * e),
                    Fmt::Byte(_) => {
                        a.copy_gm_to_ub_pad(r.t2, r.addr, v, 1);
                    }
                    Fmt::I64 => {
                        for w in 0..2 {
                            if w == 1 {
                                a.movi(r.t2, l.stage[k][i][1] as i64);
                                a.add_imm(r.addr, 4);
                            }
                            a.copy_gm_to_ub_pad(r.t2, r.addr, v, 4).src_gap(4);
                        }
                    }
                },
                Kind::Row { .. } => copy(a, Dir::GmToUb, r.t2, r.addr, self.row_len() * e),
                Kind::Column => {
                    a.copy_gm_to_ub_pad(r.t2, r.addr, v, e);
                }
                Kind::Scalar { .. } => {
                    for w in 0..fmt.words() {
                        if w == 1 {
                            a.movi(r.t2, l.stage[k][i][1] as i64);
                            a.add_imm(r.addr, 4);
                        }
                        a.copy_gm_to_ub_pad(r.t2, r.addr, 1, fmt.word_bytes());
                    }
                }
            }
        }
        VECIN.enque(a, k);
        VECIN.deque(a, k);
        VECOUT.alloc(a, k);
        self.prepare(a, k, v);
        self.run_body(a, k, v);
        for (o, out) in job.outputs.iter().enumerate() {
            for w in 0..out.fmt.words() {
                if out.fmt.spread() {
                    self.scatter(a, l.obuf[k][o][w], l.vout[o][w], v);
                }
            }
        }
        VECIN.free(a, k);
        VECOUT.enque(a, k);
        VECOUT.deque(a, k);
        for (o, out) in job.outputs.iter().enumerate() {
            let fmt = out.fmt;
            self.gm_addr(a, r.addr, job.inputs.len() + o);
            a.movi(r.t2, l.obuf[k][o][0] as i64);
            match fmt {
                Fmt::Plain(e) if rows_mode => self.rows_dma(a, Dir::UbToGm, r.t2, r.addr, v, e),
                Fmt::Plain(e) => copy(a, Dir::UbToGm, r.addr, r.t2, v * e),
                Fmt::Byte(_) => {
                    a.copy_ub_to_gm_pad(r.addr, r.t2, v, 1);
                }
                Fmt::I64 => {
                    for w in 0..2 {
                        if w == 1 {
                            a.movi(r.t2, l.obuf[k][o][1] as i64);
                            a.add_imm(r.addr, 4);
                        }
                        a.copy_ub_to_gm_pad(r.addr, r.t2, v, 4).dst_gap(4);
                    }
                }
            }
        }
        VECOUT.free(a, k);
    }

    /// Vector work before the body: gather spread words, replicate rows, build splats.
    fn prepare(&self, a: &mut Asm, k: usize, v: u64) {
        let r = &self.r;
        let l = &self.plan.layout;
        for (i, kind) in self.plan.kinds.iter().enumerate() {
            let inp = &self.job.inputs[i];
            match *kind {
                Kind::Stream if inp.fmt.spread() => {
                    a.mask_count(r.t1, 8 * v);
                    for w in 0..inp.fmt.words() {
                        a.movi(r.t2, l.vin[i][w] as i64);
                        a.movi(r.addr, l.stage[k][i][w] as i64);
                        a.vbreduce(ReduceOp::Sum, DType::I32, r.t2, r.addr);
                    }
                    if let Fmt::Byte(b) = inp.fmt {
                        self.normalize(a, b, l.vin[i][0], v, l.itmp[i]);
                    }
                }
                Kind::Row { resident: false } if !self.per_row() => {
                    self.replicate(a, l.stage[k][i][0], inp.fmt.ub_bytes(), v);
                }
                Kind::Column => {
                    self.splat(
                        a,
                        l.vin[i][0],
                        l.stage[k][i][0],
                        v,
                        inp.fmt == Fmt::Plain(2),
                    );
                }
                Kind::Scalar { resident: false } => {
                    if let Fmt::Byte(b) = inp.fmt {
                        self.normalize(a, b, l.stage[k][i][0], 8, l.itmp[i]);
                    }
                    for w in 0..inp.fmt.words() {
                        self.splat(
                            a,
                            l.vin[i][w],
                            l.stage[k][i][w],
                            1,
                            inp.fmt == Fmt::Plain(2),
                        );
                    }
                }
                _ => {}
            }
        }
    }

    /// The body over the tile: once (chunk, replicated rows) or once per row.
    fn run_body(&self, a: &mut Asm, k: usize, v: u64) {
        let r = &self.r;
        let l = &self.plan.layout;
        let lp = self.plan.lp;
        let per_row = self.per_row();
        let count = match self.plan.mode {
            Mode::Chunk => v,
            Mode::Rows { per_row: false } => v * lp,
            Mode::Rows { per_row: true } => self.row_len(),
        };
        // Each view: its register, first address and per-row step.
        let mut steps: Vec<(Reg, u64, u64)> = Vec::new();
        let mut ins = Vec::new();
        for (i, kind) in self.plan.kinds.iter().enumerate() {
            let inp = &self.job.inputs[i];
            let e = inp.fmt.ub_bytes();
            for w in 0..inp.fmt.words() {
                let reg = r.vin[i][w];
                let (addr, step, splat) = match *kind {
                    Kind::Stream if inp.fmt.spread() => (l.vin[i][w], 0, false),
                    Kind::Stream => (l.stage[k][i][0], lp * e, false),
                    Kind::Row { resident: true } => (l.res[i][0], 0, false),
                    Kind::Row { resident: false } => (l.stage[k][i][0], 0, false),
                    Kind::Column => (l.vin[i][0], 32, true),
                    Kind::Scalar { resident: true } => (l.res[i][w], 0, true),
                    Kind::Scalar { resident: false } => (l.vin[i][w], 0, true),
                };
                steps.push((reg, addr, step));
                ins.push(if splat {
                    View::splat(reg)
                } else {
                    View::flat(reg)
                });
            }
        }
        let mut outs = Vec::new();
        for (o, out) in self.job.outputs.iter().enumerate() {
            for w in 0..out.fmt.words() {
                let reg = r.vout[o][w];
                if out.fmt.spread() {
                    steps.push((reg, l.vout[o][w], 0));
                } else {
                    steps.push((reg, l.obuf[k][o][0], lp * out.fmt.ub_bytes()));
                }
                outs.push(View::flat(reg));
            }
        }
        for &(reg, addr, _) in &steps {
            a.movi(reg, addr as i64);
        }
        a.mask_count(r.t1, count);
        let body = Body {
            ins,
            outs,
            scratch: r.scratch.iter().map(|&x| View::flat(x)).collect(),
            consts: r.consts.iter().map(|&x| View::splat(x)).collect(),
            tmp: r.t1,
            count,
        };
        if let (true, Some(rows)) = (per_row && v > 1, r.rows) {
            let top = a.new_label("row");
            a.movi(rows, v as i64);
            a.place(&top);
            (self.job.body)(a, &body);
            for &(reg, _, step) in &steps {
                add_const(a, reg, step as i64, r.t2);
            }
            let top_l = a.label(&top);
            a.r#loop(rows, top_l);
        } else {
            (self.job.body)(a, &body);
        }
    }

    /// Copies row 0 of the rows at `base` (`e`-byte elements, `lp` apart) to rows 1..rows by
    /// doubling.
    fn replicate(&self, a: &mut Asm, base: u64, e: u64, rows: u64) {
        let r = &self.r;
        let lp = self.plan.lp;
        let ty = if e == 2 { DType::I16 } else { DType::I32 };
        let mut have = 1;
        while have < rows {
            let n = have.min(rows - have);
            a.mask_count(r.t1, n * lp);
            a.movi(r.t2, (base + have * lp * e) as i64);
            a.movi(r.addr, base as i64);
            a.vmov(ty, r.t2, r.addr);
            have += n;
        }
    }

    /// Turns `n` blocks at `raw` whose lane 0 holds a value into blocks at `dst` holding it in
    /// every lane (f16 values are first doubled into both halves of their 32-bit lane).
    fn splat(&self, a: &mut Asm, dst: u64, raw: u64, n: u64, f16: bool) {
        let r = &self.r;
        if f16 {
            a.mask_count(r.t1, 8 * n);
            a.movi(r.t2, raw as i64);
            a.movi(r.t1, 0x1_0001);
            a.vmuls(DType::I32, r.t2, r.t2, r.t1);
        }
        a.movi(r.t1, 0x0101_0101_0101_0101);
        a.set_mask(r.zero, r.t1);
        let mut done = 0;
        while done < n {
            let reps = (n - done).min(MAX_REPEAT);
            a.movi(r.t2, (dst + BLOCK * done) as i64);
            a.movi(r.addr, (raw + BLOCK * done) as i64);
            a.vbreduce(ReduceOp::Sum, DType::I32, r.t2, r.addr)
                .repeat(reps)
                .src_blk(0)
                .src_rep(1);
            done += reps;
        }
    }

    /// Scatters `v` i32 values at `src` to the first bytes of 32-byte blocks at `dst`.
    fn scatter(&self, a: &mut Asm, dst: u64, src: u64, v: u64) {
        let r = &self.r;
        let reps = v.div_ceil(64);
        a.movi(r.addr, src as i64);
        for lane in 0..8u32 {
            a.movi(r.t1, (0x0101_0101_0101_0101u64 << lane) as i64);
            a.set_mask(r.zero, r.t1);
            a.movi(r.t2, (dst + BLOCK * u64::from(lane)) as i64);
            a.vbreduce(ReduceOp::Sum, DType::I32, r.t2, r.addr)
                .repeat(reps)
                .dst_rep(64);
        }
    }

    /// Byte values (0..=255 as i32, `n` of them at `at`) to what they mean.
    fn normalize(&self, a: &mut Asm, kind: ByteKind, at: u64, n: u64, tmp: Option<u64>) {
        let r = &self.r;
        a.mask_count(r.t1, n);
        a.movi(r.t2, at as i64);
        // x (flat) at r.t2; the immediates go through r.t1.
        let x = r.t2;
        match kind {
            ByteKind::Bool => {
                a.movi(r.t1, 1);
                a.vmins(DType::I32, x, x, r.t1);
            }
            ByteKind::U8 => {}
            ByteKind::I8 => {
                // x - 2 * (x & 0x80): 128..=255 become -128..=-1.
                let (Some(t), Some(&c)) = (tmp, r.consts.last()) else {
                    return;
                };
                a.movi(r.addr, t as i64);
                let tv = r.addr;
                // The constant 0x80 is read as a splat (block and repeat stride 0).
                a.vand(DType::I32, tv, x, c).src1_blk(0).src1_rep(0);
                a.movi(r.t1, -2);
                a.vmuls(DType::I32, tv, tv, r.t1);
                a.vadd(DType::I32, x, x, tv);
            }
        }
    }
}

/// `r += v`, through `tmp` when `v` does not fit an immediate (nothing for 0).
fn add_const(a: &mut Asm, r: Reg, v: i64, tmp: Reg) {
    if v == 0 {
        return;
    }
    if i32::try_from(v).is_ok() {
        a.addi(r, r, v);
    } else {
        a.movi(tmp, v);
        a.add(r, r, tmp);
    }
}
