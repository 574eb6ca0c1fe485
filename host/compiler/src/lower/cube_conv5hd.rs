//! Conv on the cube over the fractal feature-map format NC1HWC0 (`[N][C/16][H][W][16]`, one
//! 32-byte unit per pixel and 16 channels), the format the layout pass
//! (`compiler::layout`) keeps between convolutions, as GE does with its 5HD format.
//!
//! In this format a pixel is a unit of its own, so the cube's `img2col_l0a` reads the windows
//! straight from an L1 band of input rows (padding included, from `set_fmatrix`), and an L0C
//! fractal (16 pixels × 16 output channels) is 16 output units: a tile leaves with one DMA.
//! A pointwise convolution (1×1, stride 1, no padding) has nothing to rearrange: 16
//! consecutive pixels of a channel block in the band are an L0A fractal already, so the band
//! goes to L0A by `load_l0a` (Load2D, at L1 → L0A's rate) instead, as GE's convolution does
//! (TBE's `l0a_load2d` path for exactly these shapes).
//!
//! ```text
//!   X (5HD) ─MTE2 (one DMA per band)─▶ L1 band ─img2col_l0a (pointwise: load_l0a)─▶ L0A ┐
//!   packed W ─MTE2 (once)─▶ L1 (resident) ─load_l0b──────────▶ L0B ┴─mmad─▶ L0C
//!   bias rows (UB) ─V broadcast_ub_to_l0c─▶ L0C (before the tile's first mmad)
//!   L0C ─V copy_l0c_to_ub (f16, + ReLU)─▶ UB ─MTE3 (one DMA per tile)─▶ Y (5HD)
//! ```
//!
//! **Schedule.** The output channels are split into `G` groups, each block keeping only its
//! group's packed weights in L1 (so layers whose weights exceed L1 run, and small maps still
//! fill the cores); the group count is the one with the fewest predicted cycles (slowest
//! block, or the chip's memory moving the weights once and the input once per group). When
//! no `G` up to the core count fits a group's weights in L1, either `G` exceeds it with one
//! block a group, which the cores run in waves, or nothing stays resident: each tile runs as
//! chunks of a few channel blocks (that slice of its band and its co block's weights, one DMA
//! each) that alternate between two L1 buffers, the next loading while the cube multiplies
//! this one; the one MTE1, the cube and the memory finish first (only streaming works where
//! two bands of every input channel leave no room for weights at all). Within a
//! group, blocks get contiguous runs of 16-pixel fractals (more to the blocks the scheduler
//! starts first). A block's run becomes runs of one image, and runs shorter than a tile share
//! one: a tile is one product `[pixels] × [C1 · kh · kw · 16] × [co]` over its segments'
//! fractals stacked in M (one `img2col` per segment), in L0 steps of `kf` K fractals, with L0A,
//! L0B and L0C double-buffered, the next tile's band loading while this one multiplies and the
//! previous tile draining. On small maps a block's images are then one tile, so its first
//! products start as its weights stream in instead of after them. Tiles run largest first and
//! a short one last. Every block's code is unrolled (its tiles are static), so every geometry
//! is an immediate. The first tile's bands and the weights come in behind up to seven
//! notices, in K-fractal groups chosen by a small dynamic programme so each arrives before the
//! cube needs it.
//!
//! **Bias and drain.** As GE's convolutions on these cores do, the bias enters L0C before the
//! products: V broadcasts each channel block's 16 f32 values (one row of its bias fractal,
//! loaded into UB once per block) into every row of the tile's L0C fractals, and the tile's
//! first `mmad` accumulates onto them. V fills both L0C halves at the start and refills a half
//! as soon as it has copied it out, so the fill never waits behind another tile's drain. The
//! drain is then one conversion to f16 (with the ReLU when nothing is added after the
//! products); a fused residual (`fusion`'s `_fused_residual`, read by MTE2 as a tile laid out
//! as the output's) is added in f16 and the ReLU applied after it. MTE3 writes each segment's
//! co fractals with one DMA.
//!
//! **Groups.** A grouped convolution runs as GE's does: `enlarge` consecutive groups (the
//! fewest that make a group's input and output channels whole blocks) form a packed group
//! whose weight fractals are block-diagonal, zero between groups, so the cube does `enlarge`
//! times the groups' MACs in whole fractals. Co groups split the packed groups evenly, and a
//! co group's bands bring in only its packed group's input channel blocks (`Plan::x_block`).
//! Depthwise convolutions (a group per channel) run on the vector unit instead.
//!
//! **Image source.** A convolution that absorbed an Aipp (`fusion`'s `_fused_aipp`) reads the
//! 8-bit image itself: each band comes through MTE2's AIPP unit (`load_image_l1`, the
//! parameter block a derived constant) into L1 as one channel block: 16 channels a pixel, or
//! with atc's `--enable_small_channel=1` C04, 4 channels and 8 bytes a pixel, where
//! `img2col ... c04` packs four taps into each K fractal (`kh · kw · 4 / 16` of them: 13 for a
//! 7×7 kernel, where 16 channels a pixel take 49).
//!
//! An NCHW side is converted by a Transpose kernel (`[N][C1][16][HW]` ↔ `[N][C1][HW][16]`)
//! into or out of the node's workspace.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use gearsim_isa::units;
use gearsim_isa::{DType, Pipe, SReg, SType, Space};

use super::super::writer::{Asm, Reg};
use super::super::{Epilogue, LowerCtx, LowerError, Lowered, Operand, kernel_name};
use super::conv::{ConvShape, DISPATCH_STAGGER_CYCLES, distribute_by};
use super::{Build, Expand, const_values, cube_type, dims_of, expand_kernel, lcm};
use crate::CoreSpec;
use crate::ir::{Attr, DataType, Format, Node, TensorDesc, fixed_shape};

/// Bytes of a 16 × 16 f16 fractal.
const FRACTAL: u64 = units::FRACTAL_BYTES;
/// Bytes of a 16 × 16 f32 fractal.
const FRACTAL_C: u64 = units::FRACTAL_BYTES_F32;
/// UB bytes of one channel block's bias: 16 f32 values, the row `broadcast_ub_to_l0c` copies
/// into every row of the block's L0C fractals.
const BIAS_ROW: u64 = units::FRACTAL_ROW_BYTES_F32;
/// Bytes of one pixel unit (16 channels of f16): one DMA block.
const UNIT: u64 = units::BLOCK_BYTES;
/// Planning only: cycles before a block's first product (argument loads, the first group's
/// DMA latency and transfer, the first img2col), the cube's stall per L0 step (its notice
/// waits out the `mmad` latency), and the last drain (V and MTE3 per fractal, plus the
/// write latency).
const START_CYCLES: f64 = 1300.0;
const CUBE_NOTICE_CYCLES: u64 = 32;
/// Pixel fractals of a block's last tile, at least (its drain is the block's tail).
const LAST_TILE_FRACTALS: u64 = 7;
const DRAIN_CYCLES_PER_FRACTAL: u64 = 12;
const DRAIN_CYCLES: u64 = 250;
/// Planning only: what a tile costs beyond its steps, in steps (see `split_run`).
const TILE_STEPS: u64 = 1;

/// Event ids, by pipe pair; each is set and waited in strict alternation.
mod ev {
    use gearsim_isa::Pipe;

    /// MTE2 → MTE1: the band of the tile with this parity is in L1 (for a block's first
    /// tile: its first group of channel blocks, with their weights).
    pub const BAND: [u8; 2] = [0, 1];
    /// MTE2 → MTE1: a block's first tile's later groups of channel blocks (band
    /// and weights) are in L1.
    pub const GROUPS: [u8; 6] = [2, 3, 4, 5, 6, 7];
    /// MTE1 → MTE2: the band buffer of this parity is free.
    pub const BAND_FREE: [u8; 2] = [0, 1];
    /// MTE1 ⇄ M: the two L0A/L0B step buffers.
    pub const L0: [u8; 2] = [0, 1];
    /// M → V: the L0C half holds a finished tile; V → M: the half was copied out (with a
    /// bias: and then filled with the bias of the next tile it holds).
    pub const L0C: [u8; 2] = [0, 1];
    /// V ⇄ MTE3: the UB output buffer (filled / written out).
    pub const DRAIN: u8 = 0;
    /// V → MTE3: the pieces of a block's last drain (the first is `DRAIN`'s id).
    pub const PIECES: [u8; 4] = [0, 1, 2, 3];
    /// MTE2 → V: the bias rows are in UB.
    pub const BIAS: u8 = 0;
    /// MTE2 → V: a tile's residual is in UB; V → MTE2: the residual buffer is free.
    pub const RESIDUAL: u8 = 1;
    pub const RESIDUAL_FREE: u8 = 0;
    /// The consumers' "buffer free" notices: set once before the blocks' code (every buffer
    /// starts free) and waited once after it (so every flag ends clear).
    pub const FREE: [(Pipe, Pipe, u8); 7] = [
        (Pipe::Mte1, Pipe::Mte2, BAND_FREE[0]),
        (Pipe::Mte1, Pipe::Mte2, BAND_FREE[1]),
        (Pipe::M, Pipe::Mte1, L0[0]),
        (Pipe::M, Pipe::Mte1, L0[1]),
        (Pipe::V, Pipe::M, L0C[0]),
        (Pipe::V, Pipe::M, L0C[1]),
        (Pipe::Mte3, Pipe::V, DRAIN),
    ];
}

/// One segment of a tile: output pixels `p0..p0 + pixels` of image `n` (`p0` a multiple of
/// 16), and the input band of the output rows they touch. `img2col` numbers the band's output
/// pixels from its first output row, so the segment starts at fractal `m_start` of them (the
/// band may start a row early to make that offset a whole fractal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seg {
    n: u64,
    p0: u64,
    pixels: u64,
    m_start: u64,
    /// First input row of the band and its rows (padding rows excluded).
    in_row: u64,
    band_h: u64,
    pad_top: u64,
    pad_bottom: u64,
}

impl Seg {
    /// Pixel fractals.
    fn mf(&self) -> u64 {
        self.pixels.div_ceil(16)
    }

    /// L1 bytes of the band per input-channel block, for pixels of `unit` bytes.
    fn band_bytes(&self, w: u64, unit: u64) -> u64 {
        (self.band_h * w * unit).next_multiple_of(UNIT)
    }
}

/// Where the kernel's input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A 5HD feature map in GM: bands come in with plain DMAs, 16 channels to a 32-byte unit.
    Fractal,
    /// An 8-bit NHWC image that MTE2 reads through the AIPP unit (`load_image_l1`, GE's AIPP
    /// fused into the first convolution): bands arrive in L1 as one channel block, 16
    /// channels a pixel, or with `c04` (atc's `--enable_small_channel`) 4 channels to an
    /// 8-byte pixel, and then `img2col` packs four taps into each K fractal.
    Image {
        /// Bytes per source pixel, the source image's height and width, and the crop's first
        /// row and column.
        pixel: u64,
        height: u64,
        width: u64,
        origin: (u64, u64),
        c04: bool,
    },
}

impl Source {
    fn c04(self) -> bool {
        matches!(self, Source::Image { c04: true, .. })
    }

    fn image(self) -> bool {
        matches!(self, Source::Image { .. })
    }

    /// L1 bytes of one pixel of one input-channel block.
    fn unit(self) -> u64 {
        gearsim_isa::aipp::pixel_bytes(self.c04())
    }

    /// GM bytes one pixel of the input occupies (all its channel blocks).
    fn gm_pixel_bytes(self, c1: u64) -> u64 {
        match self {
            Source::Fractal => c1 * UNIT,
            Source::Image { pixel, .. } => pixel,
        }
    }
}

/// One tile: one product over its segments' pixel fractals stacked in M (several images' when
/// images are small, so a block's first tile covers more of its work while the weights
/// stream in), each segment's band next to the previous one's in L1.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tile {
    segs: Vec<Seg>,
}

impl Tile {
    /// The rows (M) of its products: one segment's pixels exactly; several, whole fractals
    /// each.
    fn product_rows(&self) -> u64 {
        match self.segs.as_slice() {
            [g] => g.pixels,
            _ => self.mf() * 16,
        }
    }

    /// Pixel fractals.
    fn mf(&self) -> u64 {
        self.segs.iter().map(Seg::mf).sum()
    }

    /// Each segment's first pixel fractal in the tile (segments follow each other in M).
    fn seg_offsets(&self) -> Vec<u64> {
        self.segs
            .iter()
            .scan(0, |at, g| {
                let here = *at;
                *at += g.mf();
                Some(here)
            })
            .collect()
    }

    /// Band bytes per input-channel block (every segment's rows, each segment's from a
    /// 32-byte boundary) for pixels of `unit` bytes.
    fn slice_bytes(&self, w: u64, unit: u64) -> u64 {
        self.segs.iter().map(|g| g.band_bytes(w, unit)).sum()
    }
}

/// One block's work: output-channel fractals `co.0..co.1` (its co group, whose weights it
/// keeps in L1) for its tiles.
#[derive(Debug, Clone)]
struct Block {
    co: (u64, u64),
    tiles: Vec<Tile>,
}

impl Block {
    /// Output-channel fractals of the block's group.
    fn co_len(&self) -> u64 {
        self.co.1 - self.co.0
    }
}

/// One L1 chunk of a block whose weights stream: tile `tile`'s co block of `nb` co fractals
/// from `f0` (of the group), over channel blocks `q0..q1` of its band.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    tile: usize,
    f0: u64,
    nb: u64,
    q0: u64,
    q1: u64,
}

/// What the drain reads besides L0C, which sets its UB buffers.
#[derive(Debug, Clone, Copy)]
struct Drain {
    bias: bool,
    residual: bool,
}

impl Drain {
    /// UB bytes per output fractal of a tile: the f16 output and the residual tile (a bias
    /// enters L0C before the products, so the drain only converts).
    fn ub_bytes_per_fractal(self) -> u64 {
        FRACTAL + if self.residual { FRACTAL } else { 0 }
    }
}

/// Which way a GM transfer of the kernel goes (`Gen::transfer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// GM to L1 (MTE2): bands, weights.
    GmToL1,
    /// GM to UB (MTE2): a fused residual's tile.
    GmToUb,
    /// UB to GM (MTE3): the output tile.
    UbToGm,
}

/// How a grouped convolution's groups pack into channel blocks, as GE's 5HD convolution packs
/// them: `enlarge` consecutive groups share one packed group whose weights are block-diagonal
/// (zero between groups), so the cube multiplies `enlarge` times the MACs of the groups alone
/// and every fractal is whole. GE's enlargement is the least that makes a group's input and
/// output channels whole blocks, at most the group count; gearsim takes the shapes where that
/// needs no padding channels (ResNeXt's, RegNet's), and runs the others in NCHW.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grouping {
    /// Groups of the model per packed group.
    enlarge: u64,
    /// Packed groups.
    packed: u64,
    /// Input channel blocks and output-channel fractals of a packed group.
    c1: u64,
    m1: u64,
}

impl Grouping {
    fn of(s: &ConvShape, source: Source) -> Result<Grouping, String> {
        let whole = |c: u64| Grouping {
            enlarge: 1,
            packed: 1,
            c1: c,
            m1: s.m / 16,
        };
        if source.image() && s.group <= 1 {
            return Ok(whole(1));
        }
        if source.image() {
            return Err(format!("group {} (an image source is ungrouped)", s.group));
        }
        if s.group <= 1 {
            return Ok(whole(s.c.div_ceil(16)));
        }
        if s.group == s.c {
            return Err(format!(
                "group {} over {} channels is depthwise (the vector unit runs it)",
                s.group, s.c
            ));
        }
        let (cin, cout) = (s.c / s.group, s.m / s.group);
        let fill = |c: u64| lcm(c, 16) / c;
        let enlarge = lcm(fill(cin), fill(cout)).min(s.group);
        let packs = s.group.is_multiple_of(enlarge)
            && (enlarge * cin).is_multiple_of(16)
            && (enlarge * cout).is_multiple_of(16);
        if !packs {
            return Err(format!(
                "group {} of {cin} input and {cout} output channels does not pack into whole \
                 channel blocks without padding ({enlarge} groups a block)",
                s.group
            ));
        }
        Ok(Grouping {
            enlarge,
            packed: s.group / enlarge,
            c1: enlarge * cin / 16,
            m1: enlarge * cout / 16,
        })
    }
}

/// The static tiling.
#[derive(Debug, Clone)]
struct Plan {
    source: Source,
    /// The bands go to L0A by Load2D (a pointwise convolution, [`l0a_load2d`]), not img2col.
    load2d: bool,
    /// Input channel blocks a product's K covers (a packed group's for a grouped
    /// convolution), the input's channel blocks in GM, and the output's.
    c1: u64,
    c1_in: u64,
    m1: u64,
    /// How a grouped convolution's groups pack into channel blocks (one packed group when
    /// ungrouped).
    grouping: Grouping,
    /// K fractals (`c1 · kh · kw`; C04: `kh · kw · 4 / 16` rounded up).
    k: u64,
    /// Output-channel fractals per co block (one L0 product's columns).
    nbk: u64,
    /// Groups the output channels are split into across blocks.
    co_groups: u64,
    /// Pixel fractals per tile, at most.
    mf_max: u64,
    /// Each block's co group and tiles.
    blocks: Vec<Block>,
    /// Channel blocks per L1 chunk when the weights stream through L1 with the bands (0: a
    /// group's weights stay resident): each step's band slice and co block's weights come as
    /// one chunk into one of two chunk buffers (`band_at`, `band_bytes` each), the band part
    /// (`chunk_band` bytes) first.
    stream: u64,
    chunk_band: u64,
    /// L1: the group's weights at 0, two band buffers from `band_at`.
    w_bytes: u64,
    band_at: u64,
    band_bytes: u64,
    /// Bytes of one half of L0A, L0B and L0C (each double-buffered).
    l0a_half: u64,
    l0b_half: u64,
    l0c_half: u64,
    /// Planning only: one core's read rate in bytes per cycle, which a block's first loads are
    /// sized for even where the chip's memory binds (ARCHITECTURE.md says why).
    core_rate: u64,
    /// Notices a block's first tile may load behind (the band's and `ev::GROUPS`' within the
    /// chip's event ids).
    max_groups: usize,
}

impl Plan {
    /// The splits of the work over the cores, cheapest first: the output channels in `G`
    /// groups (each block keeps only its group's weights in L1, so layers with large weights
    /// fit and small maps still fill the cores), the pixel fractals of each group over the
    /// blocks left to it. Later ones are for a kernel whose code the first would make too long.
    fn candidates(
        s: &ConvShape,
        core: &CoreSpec,
        drain: Drain,
        source: Source,
    ) -> Result<Vec<Plan>, String> {
        let mut why = String::new();
        let resident: Vec<Plan> = Plan::splits(s, core, drain, source, false)
            .filter_map(|plan| {
                plan.map_err(|e| {
                    if why.is_empty() {
                        why = e;
                    }
                })
                .ok()
            })
            .collect();
        // In cost order; equal costs keep their order (the fewer groups first).
        let by_cost = |plans: Vec<Plan>, mte1: bool| {
            let mut costed: Vec<((f64, f64), Plan)> = plans
                .into_iter()
                .map(|plan| {
                    let (chip, slowest) = plan.predicted_cycles(s, core);
                    let fed = if mte1 { plan.mte1_cycles(core) } else { 0.0 };
                    ((chip.max(fed), slowest.max(fed)), plan)
                })
                .collect();
            costed.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
            costed.into_iter().map(|(_, plan)| plan).collect::<Vec<_>>()
        };
        if !resident.is_empty() {
            return Ok(by_cost(resident, false));
        }
        // No split over the cores keeps a group's weights in L1. Either more groups than
        // cores, one block each, which the scheduler runs in waves as the cores free up
        // (narrow groups: each img2col'd fractal serves few output channels, so MTE1 binds),
        // or the weights stream through L1 with the bands in chunks of K (re-read per tile,
        // the only way where a band of every input channel leaves no room for weights):
        // whichever MTE1 and the cube finish first.
        let fallback: Vec<Plan> = Plan::wave_splits(s, core, drain, source)
            .chain(Plan::splits(s, core, drain, source, true))
            .flatten()
            .collect();
        if fallback.is_empty() {
            return Err(why);
        }
        Ok(by_cost(fallback, true))
    }

    /// Splits of more groups than cores, one block each, for weights that no split over the
    /// cores fits in L1 beside two input bands: the fewest groups whose weights fit three
    /// quarters of L1, and twice, four and eight times as many (fewer co fractals a block
    /// leave its bands more room), each rounded up to whole waves of blocks.
    fn wave_splits(
        s: &ConvShape,
        core: &CoreSpec,
        drain: Drain,
        source: Source,
    ) -> impl Iterator<Item = Result<Plan, String>> {
        let cores = core.cube_blocks().max(1);
        let m1 = s.m / 16;
        // A grouped convolution's co groups split its packed groups evenly.
        let (k, packed) = match Grouping::of(s, source) {
            Ok(g) => (g.c1 * s.kh * s.kw, g.packed),
            Err(_) => (s.c.div_ceil(16) * s.kh * s.kw, 1),
        };
        let fit = (core.l1_bytes * 3 / 4 / (k * FRACTAL).max(1)).max(1);
        let fewest = m1.div_ceil(fit).max(cores + 1);
        let candidates: BTreeSet<u64> = [1, 2, 4, 8]
            .into_iter()
            .map(|f| (fewest * f).next_multiple_of(lcm(cores, packed)).min(m1))
            .filter(|g| *g > cores)
            .collect();
        candidates
            .into_iter()
            .map(move |groups| Plan::with_groups(s, core, drain, source, groups, 1, false))
    }

    /// The tiling for each number of output-channel groups, in increasing order (each group
    /// gets the blocks the cores leave it), laid out as it is asked for; `stream`: with the
    /// weights streaming through L1 in chunks of K with the bands (each co block's re-read
    /// per tile), for shapes no resident split fits.
    fn splits(
        s: &ConvShape,
        core: &CoreSpec,
        drain: Drain,
        source: Source,
        stream: bool,
    ) -> impl Iterator<Item = Result<Plan, String>> {
        let cores = core.cube_blocks();
        (1..=(s.m / 16).min(cores)).map(move |groups| {
            Plan::with_groups(s, core, drain, source, groups, cores / groups, stream)
        })
    }

    /// The tiling with the output channels in `groups` groups and `per_group` blocks each.
    fn with_groups(
        s: &ConvShape,
        core: &CoreSpec,
        drain: Drain,
        source: Source,
        groups: u64,
        per_group: u64,
        stream: bool,
    ) -> Result<Plan, String> {
        if stream && (source.image() || l0a_load2d(s, source) || row_step(s) > 1) {
            return Err("only a window convolution over 5HD streams its weights".into());
        }
        if source.image() && row_step(s) > 1 {
            return Err("a strided pointwise convolution cannot read the image".into());
        }
        // Fewer than 16 input channels fill one zero-padded channel block (the padded
        // TransData of `lower`), as GE's 5HD pads C to C1 · C0.
        let grouping = Grouping::of(s, source)?;
        let (c1, c1_in, m1) = (grouping.c1, grouping.c1 * grouping.packed, s.m / 16);
        if stream && grouping.packed > 1 {
            return Err("a grouped convolution keeps its (small) weights resident".into());
        }
        if !groups.is_multiple_of(grouping.packed) {
            return Err(format!(
                "{groups} co groups do not split {} packed groups evenly",
                grouping.packed
            ));
        }
        let k = if source.c04() {
            (s.kh * s.kw * gearsim_isa::aipp::C04).div_ceil(16)
        } else {
            c1 * s.kh * s.kw
        };
        // Each packed group's output fractals in `groups / packed` co groups: a co group's
        // products then read only its packed group's input channel blocks.
        let per_packed = groups / grouping.packed;
        if per_packed > grouping.m1 {
            return Err(format!(
                "{groups} co groups are more than the output fractals ({m1})"
            ));
        }
        let ranges: Vec<(u64, u64)> = (0..groups)
            .map(|g| {
                let (base, j) = (g / per_packed * grouping.m1, g % per_packed);
                (
                    base + j * grouping.m1 / per_packed,
                    base + (j + 1) * grouping.m1 / per_packed,
                )
            })
            .collect();
        let g_max = ranges.iter().map(|r| r.1 - r.0).max().unwrap_or(1);
        let (l0a_half, l0b_half, l0c_half) =
            (core.l0a_bytes / 2, core.l0b_bytes / 2, core.l0c_bytes / 2);
        // Up to eight co fractals a product. A tile may be part of a row where rows are
        // whole fractals; otherwise its band starts on a row a whole number of fractals before
        // it (`seg`), so its rows must fit the L0C half whole: fewer co fractals where they
        // would not (pointwise convolutions read by Load2D tile wide rows on rows of 16
        // pixels instead).
        let whole_rows = !s.wo.is_multiple_of(16);
        let nbk = if whole_rows && !l0a_load2d(s, source) {
            let row_fractals = s.wo.div_ceil(16);
            g_max
                .min(8)
                .min((l0c_half / FRACTAL_C / row_fractals).max(1))
        } else {
            g_max.min(8)
        };
        // UB holds the bias rows and, per tile fractal, the drain's buffers.
        let ub_tile = core
            .ub_bytes
            .saturating_sub(if drain.bias { m1 * BIAS_ROW } else { 0 });
        let mf_max = (l0c_half / FRACTAL_C / nbk)
            .min(l0a_half / FRACTAL)
            .min(ub_tile / (nbk * drain.ub_bytes_per_fractal()))
            .min(255);
        if mf_max == 0 || l0b_half / FRACTAL < nbk {
            return Err("L0 or the unified buffer is too small for one step".into());
        }
        if whole_rows && s.wo > mf_max * 16 {
            return Err(format!(
                "an output row of {} pixels does not fit the L0C tile of {} pixels",
                s.wo,
                mf_max * 16
            ));
        }
        let w_bytes = if stream { 0 } else { k * g_max * FRACTAL };
        if w_bytes > core.l1_bytes * 3 / 4 {
            return Err(format!(
                "a group's packed weights ({w_bytes} bytes) exceed three quarters of L1 ({} bytes)",
                core.l1_bytes
            ));
        }
        let band_at = w_bytes.next_multiple_of(FRACTAL);
        let limits = [
            (s.kh.max(s.kw), "kernel size", 255),
            (
                s.sh.max(s.sw).max(s.dh).max(s.dw),
                "stride/dilation",
                units::IMG2COL_STRIDE_MAX,
            ),
            (s.pt.max(s.pb).max(s.pl).max(s.pr), "padding", 255),
            (c1.max(m1), "channel blocks", units::BURST_COUNT_MAX),
            (k, "K fractals", u64::from(u16::MAX)),
        ];
        if let Some((v, what, most)) = limits.iter().find(|(v, _, most)| v > most) {
            return Err(format!("{what} {v} is above the limit {most}"));
        }
        let load2d = l0a_load2d(s, source);
        let mut plan = Plan {
            source,
            load2d,
            c1,
            c1_in,
            m1,
            grouping,
            k,
            nbk,
            co_groups: groups,
            mf_max,
            blocks: Vec::new(),
            stream: 0,
            chunk_band: 0,
            w_bytes,
            band_at,
            band_bytes: 0,
            l0a_half,
            l0b_half,
            l0c_half,
            core_rate: core.gm_read_bytes_per_cycle.max(1),
            max_groups: 1 + ev::GROUPS
                .len()
                .min(usize::from(core.event_ids).saturating_sub(2)),
        };
        // Each group's blocks get runs of pixel fractals (each image's last one may be
        // partial); tiles shrink until two of their bands and the weights fit L1.
        let per_image = (s.ho * s.wo).div_ceil(16);
        // Streamed: a chunk's bytes per channel block, its slice of the largest band (`band`
        // covers all `c1`) and the co block's weights over its K fractals.
        let chunk_per_block = |band: u64| band / c1.max(1) + nbk * s.kh * s.kw * FRACTAL;
        // The tiling at a given tile size, and whether its bands (double-buffered unless every
        // block runs one tile) fit L1 beside the weights.
        let layout = |mf_max: u64| -> (Vec<Block>, u64, bool) {
            let mut sized = plan.clone();
            sized.mf_max = mf_max;
            let mut blocks = Vec::new();
            for &co in &ranges {
                let g = co.1 - co.0;
                let splits = best_splits(per_image, mf_max, &|mf| sized.steps(mf, g));
                // The search asks for the same runs many times over (each trial finish
                // re-searches every block's run), and a run's tiling is linear in its length.
                let known = RefCell::new(HashMap::new());
                let runs = distribute_by(s.n * per_image, per_group, &|_, at, r| {
                    if let Some(&c) = known.borrow().get(&(at, r)) {
                        return c;
                    }
                    let c = sized.block_cycles(&tiles(s, at, at + r, &splits, mf_max), g);
                    known.borrow_mut().insert((at, r), c);
                    c
                });
                blocks.extend(runs.iter().map(|&(a, b)| Block {
                    co,
                    tiles: tiles(s, a, b, &splits, mf_max),
                }));
            }
            let band = blocks
                .iter()
                .flat_map(|b| &b.tiles)
                .map(|t| c1 * t.slice_bytes(s.w, source.unit()))
                .max()
                .unwrap_or(0);
            let buffers = if blocks.iter().any(|b| b.tiles.len() > 1) {
                2
            } else {
                1
            };
            // Load2D moves whole fractals: a segment's last one may read up to 15 units past
            // its band, which the last band buffer leaves room for.
            let overread = if load2d { FRACTAL } else { 0 };
            let fits = if stream {
                // Two chunk buffers of one channel block's slice and its weights at least.
                2 * chunk_per_block(band) <= core.l1_bytes
            } else {
                band_at + buffers * band + overread <= core.l1_bytes
            };
            (blocks, band, fits)
        };
        // The largest tile size that fits (tiles shrink until their bands fit): a binary
        // search, since each trial lays out every block.
        let (mut lo, mut hi) = (1, plan.mf_max);
        let (blocks, band) = match layout(hi) {
            (b, band, true) => (b, band),
            _ => {
                let (b1, band1, fits1) = layout(1);
                if !fits1 {
                    return Err(format!(
                        "two input bands ({band1} bytes each) and the weights do not fit L1"
                    ));
                }
                let mut best = (b1, band1);
                while hi - lo > 1 {
                    let mid = (lo + hi) / 2;
                    match layout(mid) {
                        (b, band, true) => {
                            lo = mid;
                            best = (b, band);
                        }
                        _ => hi = mid,
                    }
                }
                plan.mf_max = lo;
                best
            }
        };
        plan.band_bytes = band;
        if stream {
            // As many channel blocks a chunk as two chunk buffers hold.
            let qc = (core.l1_bytes / 2 / chunk_per_block(band)).clamp(1, c1);
            plan.stream = qc;
            plan.chunk_band = qc * (band / c1.max(1));
            plan.band_bytes = qc * chunk_per_block(band);
        }
        if blocks
            .iter()
            .flat_map(|b| &b.tiles)
            .flat_map(|t| &t.segs)
            .any(|g| g.band_h == 0)
        {
            return Err("a tile's windows read only padding".into());
        }
        plan.blocks = blocks;
        Ok(plan)
    }

    /// Planning only: the kernel's predicted cycles — its slowest block (products, or its
    /// loads at one core's read rate), or the chip's memory moving the weights once and the
    /// input once per group (once in all when the L2 holds it) — then its slowest block's:
    /// when the memory binds every split alike, the one whose blocks have the most slack to
    /// absorb DMA latencies and drains wins.
    fn predicted_cycles(&self, s: &ConvShape, core: &CoreSpec) -> (f64, f64) {
        // Streamed weights are read once per tile by every block; after the first read the
        // L2 serves them where all the weights fit the share it keeps, else memory does.
        let weights_in_l2 = self.k * self.m1 * FRACTAL <= core.l2_keep_bytes();
        let slowest = self
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bands: u64 = b
                    .tiles
                    .iter()
                    .flat_map(|t| &t.segs)
                    .map(|g| g.band_h * s.w * self.source.gm_pixel_bytes(self.c1))
                    .sum();
                let weights = self.k * b.co_len() * FRACTAL;
                let gm_rate = core.gm_read_bytes_per_cycle.max(1) as f64;
                let weight_cycles = if self.stream == 0 {
                    weights as f64 / gm_rate
                } else if weights_in_l2 {
                    (weights * b.tiles.len() as u64) as f64
                        / core.l2_read_bytes_per_cycle.max(1) as f64
                } else {
                    (weights * b.tiles.len() as u64) as f64 / gm_rate
                };
                let loads = weight_cycles + bands as f64 / gm_rate;
                DISPATCH_STAGGER_CYCLES * i as f64
                    + self
                        .block_cycles(&b.tiles, b.co_len())
                        .max(START_CYCLES + loads)
            })
            .fold(0.0, f64::max);
        // More blocks than cores run in waves.
        let slowest = slowest
            * self
                .blocks
                .len()
                .div_ceil(core.cube_blocks().max(1) as usize) as f64;
        // Every group reads the whole input (a grouped convolution's: its packed group's);
        // after the first read it comes from the L2 when it fits the share kept feature maps
        // may fill (its producer has just written it).
        let packed = self.grouping.packed;
        let input = s.n * s.h * s.w * self.source.gm_pixel_bytes(self.c1_in) / packed;
        let input_reads = if input * packed <= core.l2_keep_bytes() {
            packed
        } else {
            self.co_groups
        };
        let weight_bytes = if self.stream == 0 || weights_in_l2 {
            self.k * self.m1 * FRACTAL
        } else {
            self.blocks
                .iter()
                .map(|b| self.k * b.co_len() * FRACTAL * b.tiles.len() as u64)
                .sum()
        };
        let moved = weight_bytes + input * input_reads;
        let memory = moved as f64 / core.memory_bytes_per_cycle.max(1) as f64;
        (slowest.max(memory), slowest)
    }

    /// Cycles MTE1 spends feeding L0 in the slowest block, times the waves (planning only):
    /// every tile loads its K fractals into L0A once per co block (img2col, or Load2D for a
    /// pointwise convolution) and every co block's weights into L0B once per tile.
    fn mte1_cycles(&self, core: &CoreSpec) -> f64 {
        let l0a_rate = if self.load2d {
            core.l1_to_l0a_bytes_per_cycle
        } else {
            core.img2col_bytes_per_cycle
        };
        let slowest = self
            .blocks
            .iter()
            .map(|b| {
                let g = b.co_len();
                let co_blocks = self.co_blocks(g).count() as u64;
                let (a, w): (u64, u64) = b
                    .tiles
                    .iter()
                    .map(|t| (t.mf() * self.k * FRACTAL * co_blocks, self.k * g * FRACTAL))
                    .fold((0, 0), |(a, w), (ta, tw)| (a + ta, w + tw));
                a as f64 / l0a_rate.max(1) as f64
                    + w as f64 / core.l1_to_l0b_bytes_per_cycle.max(1) as f64
            })
            .fold(0.0, f64::max);
        slowest
            * self
                .blocks
                .len()
                .div_ceil(core.cube_blocks().max(1) as usize) as f64
    }

    /// The GM channel block of image `n` that channel block `q` of the band of co fractal
    /// `co_f`'s products is (a grouped convolution's co group reads its packed group's).
    fn x_block(&self, n: u64, co_f: u64, q: u64) -> u64 {
        n * self.c1_in + co_f / self.grouping.m1.max(1) * self.c1 + q
    }

    /// K fractals one input-channel block of the band serves (C04: its only block, all).
    fn k_per_slice(&self, s: &ConvShape) -> u64 {
        if self.source.c04() {
            self.k
        } else {
            s.kh * s.kw
        }
    }

    /// Co blocks (L0 products) of a group of `g` co fractals, in order: each one's first co
    /// fractal (from the group's first) and its co fractals.
    fn co_blocks(&self, g: u64) -> impl Iterator<Item = (u64, u64)> + use<> {
        let nbk = self.nbk;
        (0..g.div_ceil(nbk)).map(move |cb| (cb * nbk, nbk.min(g - cb * nbk)))
    }

    /// A block's predicted cycles for `tiles` of a group of `g` co fractals (planning only):
    /// the start (argument loads and the first group), each L0 step's products plus the
    /// cube's notice, the last drain.
    fn block_cycles(&self, tiles: &[Tile], g: u64) -> f64 {
        let products = |t: &Tile| -> u64 {
            self.co_blocks(g)
                .map(|(_, nb)| {
                    let steps = self.k.div_ceil(self.kf(t.mf(), nb));
                    t.mf() * nb * self.k + steps * CUBE_NOTICE_CYCLES
                })
                .sum()
        };
        let drain = |t: &Tile| t.mf() * g * DRAIN_CYCLES_PER_FRACTAL + DRAIN_CYCLES;
        let Some(last) = tiles.last() else {
            return 0.0;
        };
        // The tail: the last drain; and each drain the next tile's products do not hide.
        let exposed: u64 = tiles
            .windows(2)
            .map(|w| drain(&w[0]).saturating_sub(products(&w[1])))
            .sum();
        START_CYCLES + (tiles.iter().map(products).sum::<u64>() + drain(last) + exposed) as f64
    }

    /// Pixel fractals of the largest tile any block runs.
    fn largest_tile(&self) -> u64 {
        self.blocks
            .iter()
            .flat_map(|b| &b.tiles)
            .map(Tile::mf)
            .max()
            .unwrap_or(1)
    }

    /// [`first_groups`] for a block of a group of `g` co fractals whose first tile is `first`.
    fn first_groups(&self, s: &ConvShape, first: &Tile, g: u64) -> Vec<(u64, u64)> {
        let nb0 = self.nbk.min(g);
        // Cube cycles per K fractal: the products, and a notice per step of about 64 / mf
        // K fractals.
        let per_k = first.mf() * nb0 + CUBE_NOTICE_CYCLES * first.mf() / 64;
        first_groups(&FirstLoads {
            k: self.k,
            taps: self.k_per_slice(s),
            cube_per_k: per_k,
            slice_bytes: first.slice_bytes(s.w, self.source.unit()),
            weight_bytes_per_k: nb0 * FRACTAL,
            rest_bytes: (g - nb0) * self.k * FRACTAL,
            core_rate: self.core_rate,
            max_groups: self.max_groups,
        })
    }

    /// L0 steps of a tile of `mf` pixel fractals over every co block of a group of `g`.
    fn steps(&self, mf: u64, g: u64) -> u64 {
        self.co_blocks(g)
            .map(|(_, nb)| self.k.div_ceil(self.kf(mf, nb)))
            .sum()
    }

    /// K fractals per L0 step for a tile of `mf` pixel fractals and `nb` co fractals.
    fn kf(&self, mf: u64, nb: u64) -> u64 {
        (self.l0a_half / FRACTAL / mf)
            .min(self.l0b_half / FRACTAL / nb)
            .clamp(1, self.k)
    }
}

/// Splits pixel fractals `a..b` (images of `ceil(Ho·Wo / 16)` fractals back to back) into
/// runs of one image, each image's as `splits` (from [`best_splits`]) says, and packs runs
/// into tiles of at most `mf_max` fractals. Tiles are independent, so they run largest first:
/// the first tile's products hide the weights still streaming into L1, and each drain hides
/// under the next tile. The smallest is cut to leave a short last tile, since the block's final
/// drain is the one nothing hides.
fn tiles(s: &ConvShape, a: u64, b: u64, splits: &[u64], mf_max: u64) -> Vec<Tile> {
    let per_image = (s.ho * s.wo).div_ceil(16);
    let mut runs = Vec::new();
    let mut at = a;
    while at < b {
        let n = at / per_image;
        let len = b.min((n + 1) * per_image) - at;
        let mut left = len;
        while left > 0 {
            let fr = splits[left as usize];
            runs.push((n, at % per_image, fr));
            at += fr;
            left -= fr;
        }
    }
    runs.sort_by_key(|r| std::cmp::Reverse(r.2));
    // Whole images smaller than a tile share one, first fit in order (a part of an image,
    // at a block's ends, keeps a tile of its own: each segment costs an img2col per step).
    let whole = |r: &(u64, u64, u64)| r.1 == 0 && r.2 == per_image;
    let mut packed: Vec<Vec<(u64, u64, u64)>> = Vec::new();
    for run in runs {
        match packed.last_mut() {
            Some(t)
                if whole(&run)
                    && t.iter().all(whole)
                    && t.iter().map(|r| r.2).sum::<u64>() + run.2 <= mf_max =>
            {
                t.push(run)
            }
            _ => packed.push(vec![run]),
        }
    }
    // A single-run last tile ends the block in two, the last about a third of it (at least
    // `LAST_TILE_FRACTALS`): its products hide the drain of the one before, and its own drain
    // is short.
    if let Some([(n, f0, fr)]) = packed.last().map(Vec::as_slice) {
        let (n, f0, fr) = (*n, *f0, *fr);
        let last = LAST_TILE_FRACTALS.max(fr.div_ceil(3));
        if fr >= last + LAST_TILE_FRACTALS {
            let at = packed.len() - 1;
            packed[at] = vec![(n, f0, fr - last)];
            packed.push(vec![(n, f0 + fr - last, last)]);
        }
    }
    packed
        .into_iter()
        .map(|runs| Tile {
            segs: runs
                .into_iter()
                .map(|(n, f0, fr)| seg(s, n, f0 * 16, (fr * 16).min(s.ho * s.wo - f0 * 16)))
                .collect(),
        })
        .collect()
}

/// For every run length up to `len` fractals, the first tile of its best split into tiles of
/// at most `mf_max`: the fewest L0 steps (`steps(mf)` each; every step costs the cube a notice,
/// and a tile whose `mf` divides L0A badly takes more of them), a tile costing `TILE_STEPS`
/// more (its band, its drain), none shorter than `LAST_TILE_FRACTALS` unless the run is.
fn best_splits(len: u64, mf_max: u64, steps: &dyn Fn(u64) -> u64) -> Vec<u64> {
    let cost = |p: u64| steps(p) + TILE_STEPS + if p < LAST_TILE_FRACTALS { 1000 } else { 0 };
    let mut best: Vec<(u64, u64)> = vec![(0, 0); len as usize + 1];
    for i in 1..=len {
        best[i as usize] = (1..=i.min(mf_max))
            .map(|p| (best[(i - p) as usize].0 + cost(p), p))
            .min()
            .unwrap_or((u64::MAX, i));
    }
    best.into_iter().map(|b| b.1).collect()
}

/// Output pixels `p0..p0 + pixels` of image `n` and the input band they read.
fn seg(s: &ConvShape, n: u64, p0: u64, pixels: u64) -> Seg {
    // The band's first output row: the tile's, or an earlier one that puts the tile's start a
    // whole number of fractals after the band's.
    let mut oh_b = p0 / s.wo;
    while !(p0 - oh_b * s.wo).is_multiple_of(16) {
        oh_b -= 1;
    }
    let oh_last = (p0 + pixels - 1) / s.wo;
    if row_step(s) > 1 {
        // Only the rows the outputs read come in: one per output row, `sh` rows apart.
        return Seg {
            n,
            p0,
            pixels,
            m_start: (p0 - oh_b * s.wo) / 16,
            in_row: oh_b * s.sh,
            band_h: oh_last - oh_b + 1,
            pad_top: 0,
            pad_bottom: 0,
        };
    }
    let top = (oh_b * s.sh) as i64 - s.pt as i64;
    let bottom = (oh_last * s.sh + s.dh * (s.kh - 1) + 1) as i64 - s.pt as i64;
    let in_row = top.max(0) as u64;
    let in_end = (bottom.max(0) as u64).min(s.h);
    Seg {
        n,
        p0,
        pixels,
        m_start: (p0 - oh_b * s.wo) / 16,
        in_row,
        band_h: in_end.saturating_sub(in_row),
        pad_top: (-top).max(0) as u64,
        pad_bottom: (bottom - s.h as i64).max(0) as u64,
    }
}

/// Input rows apart that a band's consecutive rows in L1 are: a strided pointwise convolution
/// without padding reads one input row in `sh`, so its bands bring in only those (`img2col`
/// then steps one row) and hold `sh` times the output rows that the rows in between would
/// leave room for; 1 for every other convolution.
fn row_step(s: &ConvShape) -> u64 {
    if s.kh == 1 && s.sh > 1 && s.pt == 0 && s.pb == 0 {
        s.sh
    } else {
        1
    }
}

/// Whether a convolution's bands go to L0A by Load2D: a pointwise one (1×1, stride 1, no
/// padding) reading a 5HD map, whose band slices are L0A fractals as they lie (16 consecutive
/// pixels of a channel block; the pixels past a segment's end make rows no drain writes).
fn l0a_load2d(s: &ConvShape, source: Source) -> bool {
    !source.image() && pointwise(s)
}

/// Whether a convolution is pointwise: 1×1, stride 1, no padding (each output pixel is its
/// input pixel's channels times the weights).
fn pointwise(s: &ConvShape) -> bool {
    (s.kh, s.kw, s.sh, s.sw) == (1, 1, 1, 1) && s.pt + s.pb + s.pl + s.pr == 0
}

/// Planning only: the DDR read latency (the presets' value), which sizes a block's first
/// loads.
const READ_LATENCY_CYCLES: u64 = 350;

/// What a block's first loads are made of, for [`first_groups`].
struct FirstLoads {
    /// K fractals, and taps per input-channel block (a band slice serves `taps` of them).
    k: u64,
    taps: u64,
    /// The cube's cycles per K fractal of the first tile.
    cube_per_k: u64,
    /// Bytes of one band slice, of the first co block's weights per K fractal, and of the
    /// group's other weights (loaded with the last group).
    slice_bytes: u64,
    weight_bytes_per_k: u64,
    rest_bytes: u64,
    /// Bytes per cycle they arrive at (one core's read rate).
    core_rate: u64,
    /// Notices available (groups at most).
    max_groups: usize,
}

impl FirstLoads {
    /// When K fractals `0..b`, loaded behind `g` notices, are in L1: each notice waits out a
    /// DMA latency, and the bytes come at the read rate (the last group brings the rest).
    fn arrival(&self, b: u64, g: u64) -> u64 {
        let bytes = b.div_ceil(self.taps) * self.slice_bytes
            + b * self.weight_bytes_per_k
            + if b == self.k { self.rest_bytes } else { 0 };
        g * READ_LATENCY_CYCLES + bytes / self.core_rate.max(1)
    }
}

/// The K-fractal ranges a block's first tile loads behind one notice each (up to
/// `max_groups`: the band slices and weights they first need). Chosen so the cube finishes the
/// first tile's products as early as possible: a group arrives a DMA latency after the one
/// before (each notice waits one out) plus its bytes at the read rate, and the cube multiplies
/// a group once it has arrived and the group before is done. Arrival depends only on the
/// number of groups and the fractals loaded so far, so the best cuts are a dynamic programme.
fn first_groups(f: &FirstLoads) -> Vec<(u64, u64)> {
    let k = f.k as usize;
    let arrive = |b: usize, g: usize| f.arrival(b as u64, g as u64);
    let groups = f.max_groups.max(1);
    // done[g][b]: the cube's finish over K fractals 0..b loaded in g + 1 groups; from[g][b]
    // the start of the last of them.
    let mut done = vec![vec![u64::MAX; k + 1]; groups];
    let mut from = vec![vec![0usize; k + 1]; groups];
    for (b, d) in done[0].iter_mut().enumerate().skip(1) {
        *d = arrive(b, 1) + b as u64 * f.cube_per_k;
    }
    for g in 1..groups {
        for b in g + 1..=k {
            for a in g..b {
                if done[g - 1][a] == u64::MAX {
                    continue;
                }
                let t = done[g - 1][a].max(arrive(b, g + 1)) + (b - a) as u64 * f.cube_per_k;
                if t < done[g][b] {
                    done[g][b] = t;
                    from[g][b] = a;
                }
            }
        }
    }
    let Some(mut g) = (0..groups)
        .filter(|g| done[*g][k] != u64::MAX)
        .min_by_key(|g| done[*g][k])
    else {
        return vec![(0, f.k)];
    };
    let mut out = Vec::new();
    let mut b = k;
    loop {
        let a = if g == 0 { 0 } else { from[g][b] };
        out.push((a as u64, b as u64));
        if g == 0 {
            break;
        }
        b = a;
        g -= 1;
    }
    out.reverse();
    out
}

/// Whether the fractal-format kernel runs this convolution (`Err` says why not).
pub(crate) fn supports(s: &ConvShape, core: &CoreSpec) -> Result<(), String> {
    supports_from(s, core, Source::Fractal)
}

/// The grids the kernel may tile a convolution on, the preferred first. A pointwise one (1×1,
/// stride 1, no padding) reads exactly the pixels it writes, so any grid of its plane is the
/// same bytes in NC1HWC0: rows of 16 pixels (one fractal each) when the plane divides into
/// them and its rows do not, so that no tile's band reads input rows it has no output in (a
/// tile starts on a fractal, a band on a row); where its rows are whole fractals, their own
/// grid (fewer, longer segments), then rows of 16 for maps whose one row of every channel
/// block, double-buffered, leaves L1 no room (a band is whole rows).
fn tiling_grids(s: &ConvShape, source: Source) -> Vec<ConvShape> {
    let plane = s.h * s.w;
    if !pointwise(s) || source.image() || !plane.is_multiple_of(16) || s.w == 16 {
        return vec![*s];
    }
    let fractal_rows = ConvShape {
        h: plane / 16,
        w: 16,
        ho: plane / 16,
        wo: 16,
        ..*s
    };
    if s.w.is_multiple_of(16) {
        vec![*s, fractal_rows]
    } else {
        vec![fractal_rows]
    }
}

/// The first of the grids `s` may be tiled on ([`tiling_grids`]) whose plans `plans` finds,
/// with them; the first grid's error where none has any.
fn first_grid<T>(
    s: &ConvShape,
    source: Source,
    plans: impl Fn(&ConvShape) -> Result<T, String>,
) -> Result<(ConvShape, T), String> {
    let mut why = None;
    for grid in tiling_grids(s, source) {
        match plans(&grid) {
            Ok(found) => return Ok((grid, found)),
            Err(e) => {
                why.get_or_insert(e);
            }
        }
    }
    Err(why.unwrap_or_else(|| "no grid of the output".into()))
}

/// Whether the fractal-format kernel runs this convolution reading `source`.
pub(crate) fn supports_from(s: &ConvShape, core: &CoreSpec, source: Source) -> Result<(), String> {
    Grouping::of(s, source)?;
    if source.image() {
        let most = if source.c04() {
            gearsim_isa::aipp::C04
        } else {
            16
        };
        if s.c > most || !s.m.is_multiple_of(16) {
            return Err(format!(
                "{} input channels (at most {most} through AIPP) / {} output channels (a \
                 multiple of 16)",
                s.c, s.m
            ));
        }
    } else if !(s.c.is_multiple_of(16) || s.c < 16) || !s.m.is_multiple_of(16) {
        return Err(format!(
            "{} input channels (a multiple of 16, or fewer: one zero-padded block) / {} output \
             channels (a multiple of 16)",
            s.c, s.m
        ));
    }
    if s.n == 0 || s.ho == 0 || s.wo == 0 {
        return Err("the output is empty".into());
    }
    // A tiling that fits whatever the drain adds (a bias and a residual); the first split of
    // the output channels that works is enough to say so.
    let most = Drain {
        bias: true,
        residual: true,
    };
    first_grid(s, source, |grid| {
        let mut why = None;
        for plan in Plan::splits(grid, core, most, source, false)
            .chain(Plan::wave_splits(grid, core, most, source))
            .chain(Plan::splits(grid, core, most, source, true))
        {
            match plan {
                Ok(_) => return Ok(()),
                Err(e) => {
                    why.get_or_insert(e);
                }
            }
        }
        Err(why.unwrap_or_else(|| "no split of the output channels".into()))
    })
    .map(|_| ())
}

/// Packs the weights for L0B: per co block, per co fractal, the K fractals in `img2col` order
/// (`c1 · kh · kw + i · kw + j`), each 16 input channels (rows) × 16 output channels.
/// C04: each K fractal's rows are four taps' four channels (`tap · 4 + channel`).
fn pack_weights(values: &[f32], s: &ConvShape, plan: &Plan) -> Vec<u8> {
    let mut out = Vec::with_capacity(plan.w_bytes as usize);
    let taps = s.kh * s.kw;
    let c04 = plan.source.c04();
    // A packed group's K rows are its groups' input channels one after another, its columns
    // their output channels: a weight is real only where both are the same group's.
    let group = s.group.max(1);
    let (cin, cout) = (s.c / group, s.m / group);
    for co_f in 0..plan.m1 {
        for kb in 0..plan.k {
            for r in 0..16 {
                let (ci, tap) = if c04 {
                    (r % 4, kb * 4 + r / 4)
                } else {
                    (kb / taps * 16 + r, kb % taps)
                };
                let (i, j) = (tap / s.kw, tap % s.kw);
                let packed_ci = co_f / plan.grouping.m1.max(1) * plan.c1 * 16 + ci;
                for col in 0..16 {
                    let co = co_f * 16 + col;
                    let real = ci < s.c
                        && tap < taps
                        && (group == 1 || packed_ci / cin.max(1) == co / cout.max(1));
                    let at = ((co * cin + packed_ci % cin.max(1)) * s.kh + i) * s.kw + j;
                    let v = if real {
                        values.get(at as usize).copied().unwrap_or(0.0)
                    } else {
                        0.0
                    };
                    out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
                }
            }
        }
    }
    out
}

/// `[m/16][16][16]` f32 fractals whose every row holds the bias of 16 output channels.
fn bias_fractals(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in 0..values.len().div_ceil(16) {
        for _ in 0..16 {
            for c in 0..16 {
                let v = values.get(b * 16 + c).copied().unwrap_or(0.0);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// `_fused_aipp`'s value for an image loaded as C04 (atc's `--enable_small_channel=1`); 16
/// loads 16 channels a pixel.
pub(crate) const AIPP_C04: i64 = 4;

/// Argument indices of the kernel.
mod arg {
    pub const X: usize = 0;
    pub const WEIGHTS: usize = 1;
    pub const OUT: usize = 2;
    pub const BIAS: usize = 3;
    pub const RESIDUAL: usize = 4;
    /// The AIPP parameter block (an image source; `RESIDUAL` is then a placeholder if the
    /// kernel has no residual).
    pub const AIPP: usize = 5;
}

/// Conv with a fractal-format input or output (`ctx`'s descriptors say which); the other side
/// NCHW is converted in the node's workspace.
pub(crate) fn lower(ctx: &LowerCtx<'_>, s: &ConvShape) -> Result<Lowered, LowerError> {
    let x_desc = ctx.input(0)?;
    let aipp = match ctx.node.int(crate::fusion::FUSED_AIPP) {
        None => None,
        Some(_) => Some(
            crate::aipp::Params::of(ctx.node)
                .map_err(|e| ctx.error(format!("the fused AIPP needs {e}")))?,
        ),
    };
    let source = match &aipp {
        None => Source::Fractal,
        Some(p) => {
            let image = dims_of(ctx, x_desc)?;
            if x_desc.dtype != DataType::U8 || image.len() != 4 {
                return Err(ctx.error(format!(
                    "a fused AIPP reads an 8-bit NHWC image; got {x_desc}"
                )));
            }
            Source::Image {
                pixel: image[3],
                height: image[1],
                width: image[2],
                origin: (p.crop[0], p.crop[1]),
                c04: ctx.node.int(crate::fusion::FUSED_AIPP) == Some(AIPP_C04),
            }
        }
    };
    supports_from(s, &ctx.target.core, source).map_err(|e| ctx.error(e))?;
    let y_desc = &ctx.outputs[0];
    let sides: &[&TensorDesc] = if aipp.is_some() {
        &[y_desc]
    } else {
        &[x_desc, y_desc]
    };
    for d in sides {
        if d.dtype != DataType::F16 {
            return Err(ctx.error(format!(
                "the fractal-format conv runs f16 tensors; got {}",
                d.dtype.name()
            )));
        }
    }
    let weights = const_values(ctx, 1).ok_or_else(|| {
        ctx.error("Conv weights must be a constant (the cube kernel packs them when compiling)")
    })?;
    let drain = Drain {
        bias: ctx.inputs.get(2).copied().flatten().is_some(),
        residual: ctx.node.int(crate::fusion::FUSED_RESIDUAL).is_some(),
    };
    // A plan whose unrolled code passes the instruction limit gives way to the next. When
    // none of the whole batch's fits, the batch runs in equal parts, one launch of the same
    // kernel each (its code is unrolled per block, so a large batch is long code): the
    // cheapest plan of each part count in turn, every plan of one image a launch, whose last
    // one is reported as too large.
    let counts = part_counts(s.n);
    for (pi, &parts) in counts.iter().enumerate() {
        let part = ConvShape {
            n: s.n / parts,
            ..*s
        };
        let (grid, plans) = first_grid(&part, source, |grid| {
            Plan::candidates(grid, &ctx.target.core, drain, source)
        })
        .map_err(|e| ctx.error(e))?;
        let last_count = pi + 1 == counts.len();
        let tried = if pi == 0 || last_count {
            plans.len()
        } else {
            1
        };
        for (i, plan) in plans.iter().take(tried).enumerate() {
            let last = last_count && i + 1 == plans.len();
            let lowered = lower_with(ctx, &grid, plan, &weights, aipp.as_ref(), parts, last)?;
            if let Some(lowered) = lowered {
                return Ok(lowered);
            }
        }
    }
    Err(ctx.error("no tiling of this convolution fits the kernel instruction limit"))
}

/// How many equal parts a batch of `n` may run in, fewest first: 1 and the divisors of `n`.
fn part_counts(n: u64) -> Vec<u64> {
    (1..=n.max(1)).filter(|p| n.is_multiple_of(*p)).collect()
}

/// The kernels of convolution `part` (a batch of `parts` such) on `plan`; `None` when its
/// kernel's code would pass the instruction limit and a later plan remains (`last` false).
fn lower_with(
    ctx: &LowerCtx<'_>,
    part: &ConvShape,
    plan: &Plan,
    weights: &[f32],
    aipp: Option<&crate::aipp::Params>,
    parts: u64,
    last: bool,
) -> Result<Option<Lowered>, LowerError> {
    let x_desc = ctx.input(0)?;
    let y_desc = &ctx.outputs[0];
    let mut b = Build::default();
    // The conversions and buffers around the kernel hold the whole batch.
    let whole = ConvShape {
        n: part.n * parts,
        ..*part
    };
    let s = &whole;
    let hw_in = s.h * s.w;
    // With one pixel per plane both formats are the same bytes.
    let x = if aipp.is_some() || x_desc.format == Format::Nc1hwc0 || (hw_in == 1 && s.c >= 16) {
        Operand::Input(0)
    } else if s.c < 16 {
        let ws = b.scratch(s.n * hw_in * UNIT);
        transdata_padded(ctx, &mut b, [s.n, s.c, hw_in], Operand::Input(0), ws)?;
        ws
    } else {
        let ws = b.scratch(s.n * s.c * hw_in * 2);
        transdata(
            ctx,
            &mut b,
            [s.n, s.c / 16, 16, hw_in],
            Operand::Input(0),
            ws,
        )?;
        ws
    };
    let y_native = y_desc.format == Format::Nc1hwc0 || s.ho * s.wo == 1;
    let y = if y_native {
        Operand::Output(0)
    } else {
        b.scratch(s.n * s.m * s.ho * s.wo * 2)
    };
    let w = b.derive(DataType::F16, pack_weights(weights, s, plan));
    let bias = match (const_values(ctx, 2), ctx.inputs.get(2).copied().flatten()) {
        (Some(v), _) => Some(b.derive(DataType::F32, bias_fractals(&v))),
        (None, Some(d)) => {
            let ws = b.scratch(plan.m1 * FRACTAL_C);
            let ty = cube_type(ctx, d)?;
            let name = kernel_name(ctx, "expand_bias");
            b.kernels.push(expand_kernel(
                ctx,
                &name,
                Expand::Cols,
                s.m,
                ty,
                1.0,
                [Operand::Input(2), ws],
            )?);
            Some(ws)
        }
        (None, None) => None,
    };
    // A fused residual Add (`fusion`): read in the drain as a tile laid out as the output's,
    // so an NCHW residual is converted first.
    let residual = match ctx.node.int(crate::fusion::FUSED_RESIDUAL) {
        None => None,
        Some(_) => {
            let r = ctx.input(crate::fusion::RESIDUAL_INPUT)?;
            if r.dtype != DataType::F16 || r.shape != y_desc.shape {
                return Err(ctx.error(format!(
                    "a fused residual must be f16 shaped as the output; got {} {:?}",
                    r.dtype.name(),
                    r.shape
                )));
            }
            let input = Operand::Input(crate::fusion::RESIDUAL_INPUT);
            if r.format == Format::Nc1hwc0 || s.ho * s.wo == 1 {
                Some(input)
            } else {
                let ws = b.scratch(s.n * s.m * s.ho * s.wo * 2);
                transdata(ctx, &mut b, [s.n, s.m / 16, 16, s.ho * s.wo], input, ws)?;
                Some(ws)
            }
        }
    };
    let epilogue = Epilogue::of(ctx)?;
    let name = match epilogue {
        Epilogue::None => kernel_name(ctx, "5hd"),
        e => kernel_name(ctx, &format!("5hd_{}", e.suffix())),
    };
    let mut a = Asm::new(&name);
    if parts > 1 {
        a.tiling("batch_parts", parts as i64);
    }
    let mut gen_ = Gen::new(&mut a, part, plan, bias.is_some());
    gen_.epilogue = epilogue;
    gen_.residual = residual.is_some();
    if gen_.ub_end() > ctx.target.core.ub_bytes {
        return Err(ctx.error(format!(
            "the output tile needs {} bytes of unified buffer; it has {}",
            gen_.ub_end(),
            ctx.target.core.ub_bytes
        )));
    }
    gen_.emit();
    if a.too_long() && !last {
        return Ok(None);
    }
    let mut args = vec![x, w, y, bias.unwrap_or(w)];
    args.extend(residual);
    if let Some(p) = aipp {
        if residual.is_none() {
            args.push(w);
        }
        args.push(b.derive(DataType::U8, p.config().to_bytes()));
    }
    let kernel = ctx.kernel(a, plan.blocks.len() as u32, args)?;
    // Launch p reads and writes images p·n' on: the input, output and residual arguments
    // start that many images further on.
    let out_image = plan.m1 * s.ho * s.wo * UNIT;
    let image_bytes = |arg: usize| match arg {
        arg::X => match plan.source {
            Source::Image {
                pixel,
                height,
                width,
                ..
            } => height * width * pixel,
            _ => plan.c1_in * hw_in * UNIT,
        },
        arg::OUT => out_image,
        arg::RESIDUAL if residual.is_some() => out_image,
        _ => 0,
    };
    for p in 0..parts {
        let mut k = kernel.clone();
        for (i, op) in k.args.iter_mut().enumerate() {
            let by = p * part.n * image_bytes(i);
            if by > 0 {
                *op = op.plus(by).ok_or_else(|| {
                    ctx.error(format!("internal error: argument {i} is a constant"))
                })?;
            }
        }
        b.kernels.push(k);
    }
    if !y_native {
        transdata(
            ctx,
            &mut b,
            [s.n, s.m / 16, s.ho * s.wo, 16],
            y,
            Operand::Output(0),
        )?;
    }
    Ok(Some(b.finish()))
}

/// The kernels of a TransData between NCHW and NC1HWC0 (`C % 16 == 0`): the Transpose of
/// `dims` (`[N, C1, 16, HW]` to 5HD, `[N, C1, HW, 16]` back) by its perm `[0, 1, 3, 2]`, from
/// `src` to `dst`.
pub(crate) fn transdata(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    dims: [u64; 4],
    src: Operand,
    dst: Operand,
) -> Result<(), LowerError> {
    let out_dims = [dims[0], dims[1], dims[3], dims[2]];
    let mut node = Node::new(
        format!("{}/transdata", ctx.node.name),
        "Transpose",
        vec![],
        vec![f16_desc(&out_dims)],
    );
    node.attrs
        .insert("perm".into(), Attr::Ints(vec![0, 1, 3, 2]));
    let lower = super::super::lowering("Transpose")
        .ok_or_else(|| ctx.error("internal error: no Transpose lowering"))?;
    // Named for what it does in this node (GE's TransData), not the Transpose it is.
    inline_sub(ctx, b, &node, &f16_desc(&dims), (src, dst), lower, |name| {
        name.replacen("Transpose", "TransData", 1)
    })
}

/// The kernel of GE's TransData from NCHW with fewer than 16 channels into NC1HWC0 (one
/// channel block, zero-padded to 16): each image's `[C][HW]` (`dims` = `[N, C, HW]`)
/// transposed into `[HW][16]`, from `src` to `dst`.
fn transdata_padded(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    dims: [u64; 3],
    src: Operand,
    dst: Operand,
) -> Result<(), LowerError> {
    let [n, c, hw] = dims;
    let node = Node::new(
        format!("{}/transdata", ctx.node.name),
        "TransData",
        vec![],
        vec![f16_desc(&[n, 1, hw, units::C0])],
    );
    let lower = |sub: &LowerCtx<'_>| {
        super::super::movement::transpose_padded(
            sub,
            dims,
            units::C0,
            &[Operand::Input(0), Operand::Output(0)],
        )?
        .ok_or_else(|| {
            sub.error(format!(
                "no TransData kernel for {c} channels of {hw} pixels into 16-channel units"
            ))
        })
    };
    inline_sub(ctx, b, &node, &f16_desc(&dims), (src, dst), lower, |name| {
        name
    })
}

fn f16_desc(dims: &[u64]) -> TensorDesc {
    TensorDesc::new(
        DataType::F16,
        fixed_shape(&dims.iter().map(|v| *v as i64).collect::<Vec<_>>()),
    )
}

/// Lowers `node` (one input described by `input`) with `lower` as part of `ctx`'s node and
/// inlines its kernels into `b`, reading `src` and writing `dst`, renamed by `rename`.
fn inline_sub(
    ctx: &LowerCtx<'_>,
    b: &mut Build,
    node: &Node,
    input: &TensorDesc,
    (src, dst): (Operand, Operand),
    lower: impl FnOnce(&LowerCtx<'_>) -> Result<Lowered, LowerError>,
    rename: impl Fn(String) -> String,
) -> Result<(), LowerError> {
    let sub = LowerCtx {
        node,
        inputs: vec![Some(input)],
        values: vec![None],
        outputs: &node.outputs,
        target: ctx.target,
    };
    let lowered = lower(&sub).map_err(|e| ctx.error(e.message))?;
    b.inline(lowered, &|_| src, dst, rename)
        .map_err(|e| ctx.error(e))
}

/// UB addresses: the bias rows, the f16 output tile.
#[derive(Debug, Clone, Copy)]
struct Ub {
    bias: u64,
    out: u64,
    /// A fused residual's tile (laid out as the output tile).
    residual: u64,
}

/// Registers: the argument bases and temporaries.
struct Regs {
    args: Reg,
    x: Reg,
    /// The AIPP parameter block (an image source).
    cfg: Reg,
    w: Reg,
    out: Reg,
    bias: Reg,
    residual: Reg,
    t: [Reg; 4],
    /// A loop over co blocks (streamed weights): its counter, and how far the bias rows'
    /// UB address has moved.
    count: Reg,
    ub_shift: Reg,
}

/// Writes the kernel: a shared prologue, each block's unrolled tiles, a shared epilogue.
struct Gen<'a> {
    a: &'a mut Asm,
    s: &'a ConvShape,
    plan: &'a Plan,
    bias: bool,
    /// Whether a fused residual (argument `RESIDUAL`, 5HD) is added before the epilogue.
    residual: bool,
    ub: Ub,
    r: Regs,
    /// L0 step buffers used so far (the next one's parity), L0C tiles so far.
    steps: u64,
    l0c_tiles: u64,
    /// Groups of the block's first tile waited for so far (the first with its band notice).
    groups_waited: usize,
    /// With a bias: the block's L0C tiles in order, as (pixel fractals, first co fractal of
    /// the group, co fractals), which `fill` fills.
    fills: Vec<(u64, u64, u64)>,
    /// What the drain computes on the output tile before it leaves.
    epilogue: Epilogue,
    /// The K-fractal groups of this block's first tile.
    groups: Vec<(u64, u64)>,
    /// The block's co group (output-channel fractals).
    co: (u64, u64),
    /// Whether the code being written is a co-block loop's body (the bias fills then add
    /// `ub_shift`).
    in_loop: bool,
}

impl<'a> Gen<'a> {
    fn new(a: &'a mut Asm, s: &'a ConvShape, plan: &'a Plan, bias: bool) -> Self {
        let tile_fracs = plan.largest_tile() * plan.nbk;
        let out = if bias { plan.m1 * BIAS_ROW } else { 0 };
        let ub = Ub {
            bias: 0,
            out,
            residual: out + tile_fracs * FRACTAL,
        };
        let r = Regs {
            args: a.reg(),
            x: a.reg(),
            cfg: a.reg(),
            w: a.reg(),
            out: a.reg(),
            bias: a.reg(),
            residual: a.reg(),
            t: [a.reg(), a.reg(), a.reg(), a.reg()],
            count: a.reg(),
            ub_shift: a.reg(),
        };
        Gen {
            a,
            s,
            plan,
            bias,
            residual: false,
            ub,
            r,
            steps: 0,
            l0c_tiles: 0,
            groups_waited: 0,
            fills: Vec::new(),
            groups: Vec::new(),
            epilogue: Epilogue::None,
            co: (0, 0),
            in_loop: false,
        }
    }

    /// UB bytes the kernel uses.
    fn ub_end(&self) -> u64 {
        let tile = self.plan.largest_tile() * self.plan.nbk * FRACTAL;
        self.ub.residual + if self.residual { tile } else { 0 }
    }

    /// The consumers' "buffer free" notices of this kernel.
    fn free_notices(&self) -> Vec<(Pipe, Pipe, u8)> {
        let mut free = ev::FREE.to_vec();
        if self.bias {
            // The bias fills announce the L0C halves instead (see `fill`).
            free.retain(|&(src, dst, _)| (src, dst) != (Pipe::V, Pipe::M));
        }
        if self.residual {
            free.push((Pipe::V, Pipe::Mte2, ev::RESIDUAL_FREE));
        }
        free
    }

    fn set(&mut self, src: Pipe, dst: Pipe, id: u8) {
        self.a.set_flag(src, dst, id);
    }

    fn wait(&mut self, src: Pipe, dst: Pipe, id: u8) {
        self.a.wait_flag(src, dst, id);
    }

    /// `jmp` to the label called `label`.
    fn jump(&mut self, label: &str) {
        let l = self.a.label(label);
        self.a.jmp(l);
    }

    /// `dst = base + off` for a GM address.
    fn gm(&mut self, dst: Reg, base: Reg, off: u64) {
        self.a.movi(dst, off as i64);
        self.a.add(dst, base, dst);
    }

    /// `n` bursts of `len` units between GM `base + off` (`gm_gap` units apart) and the local
    /// buffer at `local` (`local_gap` units apart), the way `mv` says. One DMA where its fields
    /// allow; otherwise the transfer is split: groups of at most the burst count, one DMA a
    /// burst where a gap is too long for its field (deep 7×7 windows; maps of more than 65535
    /// pixels, whose channel blocks lie further apart in GM), and each burst in pieces where
    /// it is too long for its own.
    #[allow(clippy::too_many_arguments)]
    fn transfer(
        &mut self,
        mv: Move,
        local: u64,
        base: Reg,
        off: u64,
        n: u64,
        len: u64,
        gm_gap: u64,
        local_gap: u64,
    ) {
        let [t0, t1, _, _] = self.r.t;
        let issue = |a: &mut Asm, count: u64, len: u64, gm_gap: u64, local_gap: u64| match mv {
            Move::GmToL1 => {
                a.copy_gm_to_l1(t0, t1, count, len)
                    .src_gap(gm_gap)
                    .dst_gap(local_gap);
            }
            Move::GmToUb => {
                a.copy_gm_to_ub(t0, t1, count, len)
                    .src_gap(gm_gap)
                    .dst_gap(local_gap);
            }
            Move::UbToGm => {
                a.copy_ub_to_gm(t1, t0, count, len)
                    .src_gap(local_gap)
                    .dst_gap(gm_gap);
            }
        };
        let (gm_row, local_row) = ((len + gm_gap) * UNIT, (len + local_gap) * UNIT);
        if len <= units::BURST_LEN_MAX
            && gm_gap <= units::BURST_GAP_MAX
            && local_gap <= units::BURST_GAP_MAX
        {
            let mut i = 0;
            while i < n {
                let count = (n - i).min(units::BURST_COUNT_MAX);
                self.a.movi(t0, (local + i * local_row) as i64);
                self.gm(t1, base, off + i * gm_row);
                issue(self.a, count, len, gm_gap, local_gap);
                i += count;
            }
            return;
        }
        for i in 0..n {
            let mut done = 0;
            while done < len {
                let piece = (len - done).min(units::BURST_LEN_MAX);
                self.a
                    .movi(t0, (local + i * local_row + done * UNIT) as i64);
                self.gm(t1, base, off + i * gm_row + done * UNIT);
                issue(self.a, 1, piece, 0, 0);
                done += piece;
            }
        }
    }

    fn emit(mut self) {
        let plan = self.plan;
        for (name, v) in [
            ("channel_blocks_in", plan.c1_in),
            ("channel_blocks_out", plan.m1),
            ("k_fractals", plan.k),
            ("co_fractals_per_block", plan.nbk),
            ("co_groups", plan.co_groups),
            ("pixel_fractals_per_tile", plan.mf_max),
            ("band_bytes", plan.band_bytes),
            ("l0a_load2d", u64::from(plan.load2d)),
            ("weight_bytes", plan.w_bytes),
            ("block_dim", plan.blocks.len() as u64),
        ] {
            self.a.tiling(name, v as i64);
        }
        if self.s.group > 1 {
            for (name, v) in [
                ("group", self.s.group),
                ("group_enlarge", plan.grouping.enlarge),
                ("packed_groups", plan.grouping.packed),
                ("k_channel_blocks", plan.c1),
            ] {
                self.a.tiling(name, v as i64);
            }
        }
        let [t0, t1, _, _] = self.r.t;
        let (x, args) = (self.r.x, self.r.args);
        // Each argument load stalls the scalar unit for a GM latency: the input's address
        // first, the others where first needed (behind the first DMAs).
        self.a.sreg(args, SReg::Args);
        self.a.ld(Space::Gm, SType::U64, x, args).off(arg::X * 8);
        if plan.source.image() {
            let cfg = self.r.cfg;
            self.a
                .ld(Space::Gm, SType::U64, cfg, args)
                .off(arg::AIPP * 8);
        }
        self.a.comment("every buffer starts free");
        for (src, dst, id) in self.free_notices() {
            self.set(src, dst, id);
        }
        let blocks = plan.blocks.len();
        let labels: Vec<String> = (0..blocks).map(|_| self.a.new_label("block")).collect();
        let done = self.a.new_label("blocks_done");
        self.a.sreg(t1, SReg::BlockIdx);
        self.tree(&labels, 0, blocks, t0, t1);
        for (b, label) in labels.iter().enumerate() {
            self.a.place(label);
            self.a.comment(format_args!("block {b}"));
            self.block(&plan.blocks[b]);
            self.jump(&done);
        }
        self.a.place(&done);
        self.a.comment("every buffer is free again");
        for (src, dst, id) in self.free_notices() {
            self.wait(src, dst, id);
        }
        self.a.end();
    }

    /// A branch tree over `block_idx` (in `bi`) to the blocks' labels.
    fn tree(&mut self, labels: &[String], lo: usize, hi: usize, t: Reg, bi: Reg) {
        if hi - lo == 1 {
            self.jump(&labels[lo]);
            return;
        }
        let mid = (lo + hi) / 2;
        let left = self.a.new_label("tree");
        self.a.movi(t, mid as i64);
        let l = self.a.label(&left);
        self.a.blt(bi, t, l);
        self.tree(labels, mid, hi, t, bi);
        self.a.place(&left);
        self.tree(labels, lo, mid, t, bi);
    }

    /// The L1 address of band buffer `parity`.
    fn band_l1(&self, parity: u64) -> u64 {
        self.plan.band_at + parity * self.plan.band_bytes
    }

    /// MTE2: tile `t`'s input band into band buffer `parity` (one burst per channel block).
    fn load_band(&mut self, t: &Tile, parity: u64) {
        self.load_band_slices(t, parity, 0, self.plan.c1);
    }

    /// MTE2: channel blocks `q0..q1` of tile `t`'s band.
    fn load_band_slices(&mut self, t: &Tile, parity: u64, q0: u64, q1: u64) {
        let s = self.s;
        let [t0, t1, _, _] = self.r.t;
        let x = self.r.x;
        let bands = self.seg_bands(t, parity);
        if let Source::Image {
            pixel,
            height,
            width,
            origin,
            c04,
        } = self.plan.source
        {
            // One pass of each segment's rows through the AIPP unit.
            for (g, at) in t.segs.iter().zip(bands) {
                if g.band_h == 0 || q1 <= q0 {
                    continue;
                }
                self.a.movi(t0, at as i64);
                let row = (g.n * height + origin.0 + g.in_row) * width + origin.1;
                self.gm(t1, x, row * pixel);
                self.a
                    .load_image_l1(t0, t1, self.r.cfg, g.band_h, s.w, pixel, width * pixel)
                    .c04(c04);
            }
            return;
        }
        // Whole images one after another: one burst each, all in one DMA (a DMA instruction
        // per segment would fill MTE2's queue ahead of the first products).
        let first = t.segs[0];
        let whole = (q1 - q0) * s.h * s.w;
        // Between images: the channel blocks not loaded, of the input in GM and of the band
        // in L1 (a grouped convolution's band holds only its packed group's).
        let skip = (self.plan.c1_in - (q1 - q0)) * s.h * s.w;
        let band_skip = (self.plan.c1 - (q1 - q0)) * s.h * s.w;
        let co = self.co.0;
        let step = row_step(s);
        let whole_images = step == 1
            && t.segs.len() > 1
            && t.segs
                .iter()
                .enumerate()
                .all(|(i, g)| g.n == first.n + i as u64 && g.in_row == 0 && g.band_h == s.h)
            && whole <= units::BURST_LEN_MAX
            && skip <= units::BURST_GAP_MAX
            && t.segs.len() as u64 <= units::BURST_COUNT_MAX;
        if whole_images && q1 > q0 {
            self.a.movi(t0, (bands[0] + q0 * s.h * s.w * UNIT) as i64);
            self.gm(t1, x, self.plan.x_block(first.n, co, q0) * s.h * s.w * UNIT);
            self.a
                .copy_gm_to_l1(t0, t1, t.segs.len() as u64, whole)
                .src_gap(skip)
                .dst_gap(band_skip);
            return;
        }
        for (g, at) in t.segs.iter().zip(bands) {
            if g.band_h == 0 || q1 <= q0 {
                continue;
            }
            let slice = g.band_h * s.w * UNIT;
            if step > 1 {
                // One DMA per band row: that input row of each channel block.
                for i in 0..g.band_h {
                    self.transfer(
                        Move::GmToL1,
                        at + q0 * slice + i * s.w * UNIT,
                        x,
                        (self.plan.x_block(g.n, co, q0) * s.h + g.in_row + i * step) * s.w * UNIT,
                        q1 - q0,
                        s.w,
                        (s.h - 1) * s.w,
                        (g.band_h - 1) * s.w,
                    );
                }
                continue;
            }
            self.transfer(
                Move::GmToL1,
                at + q0 * slice,
                x,
                (self.plan.x_block(g.n, co, q0) * s.h + g.in_row) * s.w * UNIT,
                q1 - q0,
                g.band_h * s.w,
                (s.h - g.band_h) * s.w,
                0,
            );
        }
    }

    /// L1 addresses of tile `t`'s segments' bands in band buffer `parity`.
    fn seg_bands(&self, t: &Tile, parity: u64) -> Vec<u64> {
        let mut at = self.band_l1(parity);
        t.segs
            .iter()
            .map(|g| {
                let here = at;
                at += self.plan.c1 * g.band_bytes(self.s.w, self.plan.source.unit());
                here
            })
            .collect()
    }

    /// MTE2: the weights of the block's co fractals `f0..f1` (from its group's first), K
    /// fractals `k0..k1` (L1 mirrors the group's part of the packed layout).
    fn load_weights(&mut self, f0: u64, f1: u64, k0: u64, k1: u64) {
        if f1 <= f0 || k1 <= k0 {
            return;
        }
        let w = self.r.w;
        let k = self.plan.k;
        let at = (f0 * k + k0) * FRACTAL;
        let units = FRACTAL / UNIT;
        let gm = self.co.0 * k * FRACTAL + at;
        if k0 == 0 && k1 == k {
            self.transfer(Move::GmToL1, at, w, gm, 1, (f1 - f0) * k * units, 0, 0);
        } else {
            let gap = (k - (k1 - k0)) * units;
            self.transfer(
                Move::GmToL1,
                at,
                w,
                gm,
                f1 - f0,
                (k1 - k0) * units,
                gap,
                gap,
            );
        }
    }

    fn block(&mut self, block: &Block) {
        if self.plan.stream > 0 {
            self.block_streamed(block);
            return;
        }
        let plan = self.plan;
        self.co = block.co;
        let (g, tiles) = (block.co_len(), &block.tiles);
        let Some(first) = tiles.first() else {
            return;
        };
        self.a.comment(
            "the first tile's band and weights, in groups of channel blocks (one notice each)",
        );
        self.wait(Pipe::Mte1, Pipe::Mte2, ev::BAND_FREE[0]);
        let taps = plan.k_per_slice(self.s);
        let groups = plan.first_groups(self.s, first, g);
        self.a
            .comment(format_args!("first-tile groups (K fractals): {groups:?}"));
        self.groups = groups.clone();
        let (args, w) = (self.r.args, self.r.w);
        for (gi, &(k0, k1)) in groups.iter().enumerate() {
            self.load_band_slices(first, 0, k0.div_ceil(taps), k1.div_ceil(taps));
            if gi == 0 {
                self.a
                    .ld(Space::Gm, SType::U64, w, args)
                    .off(arg::WEIGHTS * 8);
            }
            self.load_weights(0, plan.nbk.min(g), k0, k1);
            let last = gi + 1 == groups.len();
            if last {
                self.load_weights(plan.nbk.min(g), g, 0, plan.k);
            }
            match gi {
                0 => self.set(Pipe::Mte2, Pipe::Mte1, ev::BAND[0]),
                _ => self.set(Pipe::Mte2, Pipe::Mte1, ev::GROUPS[gi - 1]),
            }
            if gi == 0 && self.bias {
                // The bias rows right behind the first group: V fills both L0C halves with
                // them while the rest of the weights arrive.
                self.load_bias(tiles, g);
            }
        }
        self.load_out_args();
        self.groups_waited = 1;
        for (i, t) in tiles.iter().enumerate() {
            let parity = (i % 2) as u64;
            if i > 0 {
                self.groups_waited = self.groups.len();
            }
            if let Some(next) = tiles.get(i + 1) {
                let np = 1 - parity;
                self.wait(Pipe::Mte1, Pipe::Mte2, ev::BAND_FREE[np as usize]);
                self.load_band(next, np);
                self.set(Pipe::Mte2, Pipe::Mte1, ev::BAND[np as usize]);
            }
            self.tile(t, parity, i + 1 == tiles.len());
        }
        // The block's steps leave the step-buffer parity where they leave it; the next block
        // (another core) starts from the same flags, so every block's code starts at parity
        // 0.
        self.steps = 0;
        self.l0c_tiles = 0;
    }

    fn tile(&mut self, t: &Tile, parity: u64, last: bool) {
        let (s, plan) = (self.s, self.plan);
        let [t0, t1, _, _] = self.r.t;
        let mf = t.mf();
        let pixels = t.product_rows();
        for g in &t.segs {
            self.a.comment(format_args!(
                "tile segment: image {}, pixels {}..{}, band rows {}..{}",
                g.n,
                g.p0,
                g.p0 + g.pixels,
                g.in_row,
                g.in_row + g.band_h
            ));
        }
        let bands = self.seg_bands(t, parity);
        let offs = t.seg_offsets();
        // The feature-map geometry is a state img2col reads: set once for a single segment,
        // before each segment's img2col otherwise.
        let single = t.segs.len() == 1;
        if single && !plan.load2d {
            self.fmatrix(&t.segs[0]);
        }
        // Co fractals from the group's first (L1 holds the group's weights only).
        let g = self.co.1 - self.co.0;
        let cob = plan.co_blocks(g).count() as u64;
        for (cb, (f0, nb)) in (0u64..).zip(plan.co_blocks(g)) {
            let kf = plan.kf(mf, nb);
            let nsteps = plan.k.div_ceil(kf);
            let half = self.l0c_tiles % 2;
            let l0c = half * plan.l0c_half;
            for st in 0..nsteps {
                let b = (self.steps % 2) as usize;
                let k0 = st * kf;
                let kfs = kf.min(plan.k - k0);
                self.wait(Pipe::M, Pipe::Mte1, ev::L0[b]);
                if st == 0 && cb == 0 {
                    self.wait(Pipe::Mte2, Pipe::Mte1, ev::BAND[parity as usize]);
                }
                // A first tile's later groups: each before the first step that reads it (the
                // other co blocks' weights come with the last group).
                while self.groups_waited < self.groups.len()
                    && (cb > 0 || self.groups[self.groups_waited].0 < k0 + kfs)
                {
                    self.wait(Pipe::Mte2, Pipe::Mte1, ev::GROUPS[self.groups_waited - 1]);
                    self.groups_waited += 1;
                }
                // Each segment's fractals follow the previous one's in M (L0A is m-major).
                for ((g, &band), m_off) in t.segs.iter().zip(&bands).zip(&offs) {
                    let dst = b as u64 * plan.l0a_half + m_off * kfs * FRACTAL;
                    if plan.load2d {
                        // Per K fractal (a channel block's slice of the band), the segment's
                        // pixel fractals, into every kfs-th L0A fractal (L0A is m-major).
                        let slice = g.band_bytes(s.w, plan.source.unit());
                        for kk in 0..kfs {
                            self.a.movi(t0, (dst + kk * FRACTAL) as i64);
                            let src = band + (k0 + kk) * slice + g.m_start * FRACTAL;
                            self.a.movi(t1, src as i64);
                            self.a.load_l0a(t0, t1, g.mf()).dst_stride(kfs);
                        }
                        continue;
                    }
                    if !single {
                        self.fmatrix(g);
                    }
                    self.img2col(dst, band, plan.c1, g, k0, kfs);
                }
                for j in 0..nb {
                    self.a
                        .movi(t0, (b as u64 * plan.l0b_half + j * kfs * FRACTAL) as i64);
                    self.a.movi(t1, (((f0 + j) * plan.k + k0) * FRACTAL) as i64);
                    self.a.load_l0b(t0, t1, kfs);
                }
                if st + 1 == nsteps && cb + 1 == cob {
                    self.set(Pipe::Mte1, Pipe::Mte2, ev::BAND_FREE[parity as usize]);
                }
                self.product(b, half, l0c, (pixels, kfs, nb), st == 0, st + 1 == nsteps);
            }
            self.drain(t, f0, nb, half, l0c, last && cb + 1 == cob);
            self.l0c_tiles += 1;
        }
    }

    /// MTE1: `kfs` K fractals from `k0` of segment `g`'s windows, read from its band at
    /// `band` (`c1` channel blocks), into L0A at `dst`.
    fn img2col(&mut self, dst: u64, band: u64, c1: u64, g: &Seg, k0: u64, kfs: u64) {
        let s = self.s;
        let [t0, t1, _, _] = self.r.t;
        self.a.movi(t0, dst as i64);
        self.a.movi(t1, band as i64);
        self.a
            .img2col_l0a(t0, t1, c1, s.kh, s.kw, g.m_start, k0, g.mf(), kfs)
            .c04(self.plan.source.c04())
            .stride_h(s.sh / row_step(s))
            .stride_w(s.sw)
            .dil_h(s.dh)
            .dil_w(s.dw);
    }

    /// One L0 step's product from step buffer `b` into the L0C half `half` (at `l0c`) of
    /// `pixels` × `16 kfs` × `16 nb`: the step that `opens` the half waits for V to free it
    /// and starts it (unless a bias is in it already), the one that `closes` it hands it
    /// to V.
    fn product(
        &mut self,
        b: usize,
        half: u64,
        l0c: u64,
        (pixels, kfs, nb): (u64, u64, u64),
        opens: bool,
        closes: bool,
    ) {
        let plan = self.plan;
        let [t0, t1, t2, _] = self.r.t;
        self.set(Pipe::Mte1, Pipe::M, ev::L0[b]);
        self.wait(Pipe::Mte1, Pipe::M, ev::L0[b]);
        if opens {
            self.wait(Pipe::V, Pipe::M, ev::L0C[half as usize]);
        }
        self.a.movi(t0, (b as u64 * plan.l0a_half) as i64);
        self.a.movi(t1, (b as u64 * plan.l0b_half) as i64);
        self.a.movi(t2, l0c as i64);
        self.a
            .mmad(t2, t0, t1, pixels, 16 * kfs, 16 * nb)
            .init(opens && !self.bias);
        self.set(Pipe::M, Pipe::Mte1, ev::L0[b]);
        if closes {
            self.set(Pipe::M, Pipe::V, ev::L0C[half as usize]);
        }
        self.steps += 1;
    }

    /// The output's address (and a fused residual's), which the drains need.
    fn load_out_args(&mut self) {
        let (args, out) = (self.r.args, self.r.out);
        self.a
            .ld(Space::Gm, SType::U64, out, args)
            .off(arg::OUT * 8);
        if self.residual {
            let res = self.r.residual;
            self.a
                .ld(Space::Gm, SType::U64, res, args)
                .off(arg::RESIDUAL * 8);
        }
    }

    /// The bias rows of the block's group into UB, and V's fill of both L0C halves with the
    /// first two tiles' (the later ones follow each drain).
    fn load_bias(&mut self, tiles: &[Tile], g: u64) {
        let [t0, t1, _, _] = self.r.t;
        let (args, bias) = (self.r.args, self.r.bias);
        self.a
            .ld(Space::Gm, SType::U64, bias, args)
            .off(arg::BIAS * 8);
        self.a.movi(t0, self.ub.bias as i64);
        self.gm(t1, bias, self.co.0 * FRACTAL_C);
        // One 64-byte row of each of the group's bias fractals.
        self.a
            .copy_gm_to_ub(t0, t1, g, BIAS_ROW / UNIT)
            .src_gap((FRACTAL_C - BIAS_ROW) / UNIT);
        self.set(Pipe::Mte2, Pipe::V, ev::BIAS);
        self.fills = tiles
            .iter()
            .flat_map(|t| self.plan.co_blocks(g).map(|(f0, nb)| (t.mf(), f0, nb)))
            .collect();
        self.wait(Pipe::Mte2, Pipe::V, ev::BIAS);
        for u in 0..self.fills.len().min(2) {
            self.fill(u);
        }
    }

    /// A block whose weights stream through L1: its chunks (per tile, per co block, per run
    /// of `stream` channel blocks: that slice of the tile's band and of the co block's
    /// weights) alternate between the two chunk buffers, the next loading while the cube
    /// works on this one.
    fn block_streamed(&mut self, block: &Block) {
        let plan = self.plan;
        self.co = block.co;
        let (g, tiles) = (block.co_len(), &block.tiles);
        if tiles.is_empty() {
            return;
        }
        let mut chunks = Vec::new();
        for ti in 0..tiles.len() {
            for (f0, nb) in plan.co_blocks(g) {
                for q0 in (0..plan.c1).step_by(plan.stream as usize) {
                    chunks.push(Chunk {
                        tile: ti,
                        f0,
                        nb,
                        q0,
                        q1: (q0 + plan.stream).min(plan.c1),
                    });
                }
            }
        }
        self.a.comment(format_args!(
            "{} chunks of at most {} channel blocks, weights streamed with the bands",
            chunks.len(),
            plan.stream
        ));
        let (args, w) = (self.r.args, self.r.w);
        self.wait(Pipe::Mte1, Pipe::Mte2, ev::BAND_FREE[0]);
        self.a
            .ld(Space::Gm, SType::U64, w, args)
            .off(arg::WEIGHTS * 8);
        self.load_chunk(&tiles[chunks[0].tile], &chunks[0], 0);
        self.set(Pipe::Mte2, Pipe::Mte1, ev::BAND[0]);
        if self.bias {
            self.load_bias(tiles, g);
        }
        self.load_out_args();
        // Each tile's co blocks but its last two or three run as a loop of pairs (two L0C halves):
        // a pair's code differs from the next pair's only in the weights' and the output's
        // GM addresses and the bias rows' UB address, which move by two co blocks each time.
        let per_run = plan.c1.div_ceil(plan.stream) as usize;
        let co_blocks = plan.co_blocks(g).count();
        let full = (g / plan.nbk) as usize;
        let pairs = if full >= 4 { (full - 2) / 2 } else { 0 };
        let mut ci = 0;
        while ci < chunks.len() {
            if pairs >= 2 && ci % (per_run * co_blocks) == 0 {
                self.co_loop(tiles, &chunks, ci, 2 * per_run, pairs as u64);
                ci += 2 * per_run * pairs;
                continue;
            }
            self.streamed_chunk(tiles, &chunks, ci);
            ci += 1;
        }
        self.steps = 0;
        self.l0c_tiles = 0;
    }

    /// Chunk `ci` of a streamed block: the next chunk's loads, then this one's steps.
    fn streamed_chunk(&mut self, tiles: &[Tile], chunks: &[Chunk], ci: usize) {
        let ch = &chunks[ci];
        let parity = (ci % 2) as u64;
        if let Some(next) = chunks.get(ci + 1) {
            let np = 1 - parity;
            self.wait(Pipe::Mte1, Pipe::Mte2, ev::BAND_FREE[np as usize]);
            self.load_chunk(&tiles[next.tile], next, np);
            self.set(Pipe::Mte2, Pipe::Mte1, ev::BAND[np as usize]);
        }
        let t = &tiles[ch.tile];
        let first = ci == 0 || chunks[ci - 1].tile != ch.tile || chunks[ci - 1].f0 != ch.f0;
        let last = chunks
            .get(ci + 1)
            .is_none_or(|n| n.tile != ch.tile || n.f0 != ch.f0);
        let block_last = ci + 1 == chunks.len();
        self.chunk(t, ch, parity, first, last, block_last);
    }

    /// Chunks `ci..ci + body` (two co blocks of one tile) as a loop run `count` times, each
    /// time two co blocks further on: the weights' and output's (and residual's) GM bases and
    /// the bias rows' UB shift move by two co blocks after each pass and are put back after
    /// the loop. The caller leaves at least two co blocks of the tile after the loop's last
    /// pass, so every pass's prefetch and bias fill land in the same tile.
    fn co_loop(&mut self, tiles: &[Tile], chunks: &[Chunk], ci: usize, body: usize, count: u64) {
        let (s, plan) = (self.s, self.plan);
        let step = 2 * plan.nbk;
        let mut moves = vec![
            (self.r.w, step * plan.k * FRACTAL),
            (self.r.out, step * s.ho * s.wo * UNIT),
        ];
        if self.residual {
            moves.push((self.r.residual, step * s.ho * s.wo * UNIT));
        }
        if self.bias {
            moves.push((self.r.ub_shift, step * BIAS_ROW));
            self.a.movi(self.r.ub_shift, 0);
        }
        self.a.comment(format_args!(
            "co blocks {}.. of this tile: {count} passes of two",
            chunks[ci].f0 / plan.nbk
        ));
        let top = self.a.new_label("co_pair");
        let counter = self.r.count;
        self.a.movi(counter, count as i64);
        self.a.place(&top);
        self.in_loop = true;
        for c in ci..ci + body {
            self.streamed_chunk(tiles, chunks, c);
        }
        self.in_loop = false;
        let t0 = self.r.t[0];
        for &(reg, by) in &moves {
            self.a.movi(t0, by as i64);
            self.a.add(reg, reg, t0);
        }
        let l = self.a.label(&top);
        self.a.r#loop(counter, l);
        for &(reg, by) in &moves {
            self.a.movi(t0, (by * count) as i64);
            self.a.sub(reg, reg, t0);
        }
        // The body was written for the first pass's two co blocks.
        self.l0c_tiles += 2 * (count - 1);
    }

    /// L1 addresses of tile `t`'s segments' bands in chunk buffer `parity`, each of `qn`
    /// channel blocks.
    fn chunk_bands(&self, t: &Tile, qn: u64, parity: u64) -> Vec<u64> {
        let mut at = self.band_l1(parity);
        t.segs
            .iter()
            .map(|g| {
                let here = at;
                at += qn * g.band_h * self.s.w * UNIT;
                here
            })
            .collect()
    }

    /// MTE2: chunk `ch` of tile `t` into chunk buffer `parity`: each segment's band rows of
    /// channel blocks `q0..q1` (one burst per channel block), then the weights of co
    /// fractals `f0..f0 + nb` over those channel blocks' K fractals.
    fn load_chunk(&mut self, t: &Tile, ch: &Chunk, parity: u64) {
        let s = self.s;
        let plan = self.plan;
        let (x, w) = (self.r.x, self.r.w);
        let qn = ch.q1 - ch.q0;
        let base = self.band_l1(parity);
        for (g, at) in t.segs.iter().zip(self.chunk_bands(t, qn, parity)) {
            if g.band_h > 0 {
                self.transfer(
                    Move::GmToL1,
                    at,
                    x,
                    (plan.x_block(g.n, self.co.0, ch.q0) * s.h + g.in_row) * s.w * UNIT,
                    qn,
                    g.band_h * s.w,
                    (s.h - g.band_h) * s.w,
                    0,
                );
            }
        }
        let taps = plan.k_per_slice(s);
        let (k0, kn) = (ch.q0 * taps, qn * taps);
        let units = FRACTAL / UNIT;
        self.transfer(
            Move::GmToL1,
            base + plan.chunk_band,
            w,
            ((self.co.0 + ch.f0) * plan.k + k0) * FRACTAL,
            ch.nb,
            kn * units,
            (plan.k - kn) * units,
            0,
        );
    }

    /// The L0 steps over chunk `ch` of tile `t` (in chunk buffer `parity`): its co block's
    /// products over the chunk's K fractals, accumulating in the co block's L0C half; the
    /// co block's `first` chunk starts the half, its `last` drains it.
    fn chunk(
        &mut self,
        t: &Tile,
        ch: &Chunk,
        parity: u64,
        first: bool,
        last: bool,
        block_last: bool,
    ) {
        let (s, plan) = (self.s, self.plan);
        let [t0, t1, _, _] = self.r.t;
        let mf = t.mf();
        let pixels = t.product_rows();
        let single = t.segs.len() == 1;
        if first && single {
            self.fmatrix(&t.segs[0]);
        }
        let offs = t.seg_offsets();
        let qn = ch.q1 - ch.q0;
        let kn = qn * plan.k_per_slice(s);
        let base = self.band_l1(parity);
        let bands = self.chunk_bands(t, qn, parity);
        let nb = ch.nb;
        let kf = plan.kf(mf, nb).min(kn);
        let nsteps = kn.div_ceil(kf);
        let half = self.l0c_tiles % 2;
        let l0c = half * plan.l0c_half;
        for st in 0..nsteps {
            let b = (self.steps % 2) as usize;
            let k0 = st * kf;
            let kfs = kf.min(kn - k0);
            self.wait(Pipe::M, Pipe::Mte1, ev::L0[b]);
            if st == 0 {
                self.wait(Pipe::Mte2, Pipe::Mte1, ev::BAND[parity as usize]);
            }
            for ((g, &band), m_off) in t.segs.iter().zip(&bands).zip(&offs) {
                if !single {
                    self.fmatrix(g);
                }
                let dst = b as u64 * plan.l0a_half + m_off * kfs * FRACTAL;
                self.img2col(dst, band, qn, g, k0, kfs);
            }
            for j in 0..nb {
                self.a
                    .movi(t0, (b as u64 * plan.l0b_half + j * kfs * FRACTAL) as i64);
                self.a.movi(
                    t1,
                    (base + plan.chunk_band + (j * kn + k0) * FRACTAL) as i64,
                );
                self.a.load_l0b(t0, t1, kfs);
            }
            if st + 1 == nsteps {
                self.set(Pipe::Mte1, Pipe::Mte2, ev::BAND_FREE[parity as usize]);
            }
            let (opens, closes) = (first && st == 0, last && st + 1 == nsteps);
            self.product(b, half, l0c, (pixels, kfs, nb), opens, closes);
        }
        if last {
            self.drain(t, ch.f0, nb, half, l0c, block_last);
            self.l0c_tiles += 1;
        }
    }

    /// V fills the L0C half of the block's `u`-th tile (tiles and co blocks in order) with the
    /// bias of its output channels, and hands the half to M, whose first product then adds
    /// to it (CCE's `broadcast_ub_to_cc`; the drain only converts).
    fn fill(&mut self, u: usize) {
        let (mf, f0, nb) = self.fills[u];
        let half = u % 2;
        let [t0, t1, _, _] = self.r.t;
        self.a.movi(t0, (half as u64 * self.plan.l0c_half) as i64);
        self.a.movi(t1, (self.ub.bias + f0 * BIAS_ROW) as i64);
        if self.in_loop {
            self.a.add(t1, t1, self.r.ub_shift);
        }
        self.a.broadcast_ub_to_l0c(t0, t1, nb, mf);
        self.set(Pipe::V, Pipe::M, ev::L0C[half]);
    }

    /// `set_fmatrix` for segment `g`'s band.
    fn fmatrix(&mut self, g: &Seg) {
        self.a
            .set_fmatrix(g.band_h.max(1), self.s.w)
            .pad_top(g.pad_top)
            .pad_bottom(g.pad_bottom)
            .pad_left(self.s.pl)
            .pad_right(self.s.pr);
    }

    /// V copies the tile out of L0C (adding the bias, converting to f16); MTE3 writes its
    /// `nb` co fractals, one burst each per segment.
    fn drain(&mut self, t: &Tile, f0: u64, nb: u64, half: u64, l0c: u64, last: bool) {
        let (s, plan) = (self.s, self.plan);
        let [t0, t1, t2, _] = self.r.t;
        let out = self.r.out;
        let mf = t.mf();
        // The block's last drain is its tail, so V and MTE3 overlap there: up to four pieces
        // of co fractals, each written while V copies the next.
        let count = if last {
            nb.min(ev::PIECES.len() as u64)
        } else {
            1
        };
        let pieces: Vec<(u64, u64)> = (0..count)
            .map(|p| (p * nb / count, (p + 1) * nb / count))
            .collect();
        let plane = s.ho * s.wo;
        let gm_at = |g: &Seg, f: u64| ((g.n * plan.m1 + f) * plane + g.p0) * UNIT;
        // UB rows follow L0C's m order.
        let offs = t.seg_offsets();
        if self.residual {
            // MTE2 brings the residual tile, laid out as the output tile, once V is done with
            // the previous one.
            let res = self.r.residual;
            self.wait(Pipe::V, Pipe::Mte2, ev::RESIDUAL_FREE);
            for (g, off) in t.segs.iter().zip(&offs) {
                self.transfer(
                    Move::GmToUb,
                    self.ub.residual + off * FRACTAL,
                    res,
                    gm_at(g, self.co.0 + f0),
                    nb,
                    g.pixels,
                    plane - g.pixels,
                    mf * 16 - g.pixels,
                );
            }
            self.set(Pipe::Mte2, Pipe::V, ev::RESIDUAL);
        }
        self.wait(Pipe::M, Pipe::V, ev::L0C[half as usize]);
        self.wait(Pipe::Mte3, Pipe::V, ev::DRAIN);
        // A ReLU with nothing added after the products rides on the copy out of L0C.
        let relu_in_copy = self.epilogue == Epilogue::Relu && !self.residual;
        for (p, &(j0, j1)) in pieces.iter().enumerate() {
            let n = j1 - j0;
            let out_at = self.ub.out + j0 * mf * FRACTAL;
            self.a.movi(t1, (l0c + j0 * mf * FRACTAL_C) as i64);
            self.a.movi(t0, out_at as i64);
            self.a
                .copy_l0c_to_ub(DType::F16, t0, t1, mf * n)
                .relu(relu_in_copy);
            if p + 1 == pieces.len() {
                if self.bias {
                    // The half's next tile (two L0C tiles on) gets its bias now.
                    let next = self.l0c_tiles as usize + 2;
                    if next < self.fills.len() {
                        self.fill(next);
                    }
                } else {
                    self.set(Pipe::V, Pipe::M, ev::L0C[half as usize]);
                }
            }
            if self.residual {
                if p == 0 {
                    self.wait(Pipe::Mte2, Pipe::V, ev::RESIDUAL);
                }
                self.a.mask_count(t2, mf * n * 256);
                self.a.movi(t0, out_at as i64);
                self.a
                    .movi(t1, (self.ub.residual + j0 * mf * FRACTAL) as i64);
                self.a.vadd(DType::F16, t0, t0, t1);
                if p + 1 == pieces.len() {
                    self.set(Pipe::V, Pipe::Mte2, ev::RESIDUAL_FREE);
                }
            }
            if self.epilogue == Epilogue::Relu && !relu_in_copy {
                self.a.mask_count(t2, mf * n * 256);
                self.a.movi(t0, out_at as i64);
                self.a.vrelu(DType::F16, t0, t0);
            }
            self.set(Pipe::V, Pipe::Mte3, ev::PIECES[p]);
            self.wait(Pipe::V, Pipe::Mte3, ev::PIECES[p]);
            for (g, off) in t.segs.iter().zip(&offs) {
                self.transfer(
                    Move::UbToGm,
                    out_at + off * FRACTAL,
                    out,
                    gm_at(g, self.co.0 + f0 + j0),
                    n,
                    g.pixels,
                    plane - g.pixels,
                    mf * 16 - g.pixels,
                );
            }
        }
        self.set(Pipe::Mte3, Pipe::V, ev::DRAIN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cube's finish over the first tile loaded in `groups`.
    fn finish(f: &FirstLoads, groups: &[(u64, u64)]) -> u64 {
        (1..).zip(groups).fold(0, |done, (g, &(a, b))| {
            done.max(f.arrival(b, g)) + (b - a) * f.cube_per_k
        })
    }

    /// ResNet-50's layer4 3×3 convolution at batch 1 on the 310P: 288 K fractals of weights
    /// streaming into 7 blocks that share the chip's DDR. Sized for the core's own read rate,
    /// the first group is small enough that the cube's work on it hides under the later
    /// groups when the loads come faster than the even share; sized for the share, most of the
    /// weights came behind the first notice and the cube ran after them (2.3 µs later at the
    /// core's rate, by this model of it).
    #[test]
    fn first_loads_are_sized_for_the_cores_own_rate() {
        let f = FirstLoads {
            k: 288,
            taps: 9,
            cube_per_k: 22,
            slice_bytes: 196 * UNIT,
            weight_bytes_per_k: 5 * FRACTAL,
            rest_bytes: 0,
            core_rate: 67,
            max_groups: 7,
        };
        let groups = first_groups(&f);
        assert_eq!(groups.first().map(|g| g.0), Some(0));
        assert_eq!(groups.last().map(|g| g.1), Some(f.k));
        assert!(groups.windows(2).all(|w| w[0].1 == w[1].0), "{groups:?}");
        assert!(groups[0].1 <= 200, "first group too large: {groups:?}");
        // The split the even share would choose: most of K behind the first notice.
        let shared = [(0, 242), (242, 282), (282, 288)];
        assert!(
            finish(&f, &groups) + 500 < finish(&f, &shared),
            "{groups:?}"
        );
    }
}
