//! The cube GEMM engine every matrix product lowers to: `C[g] = epilogue(A[g] · B[g])` for a
//! batch of static-shape f16 products with f32 accumulation, tiled for the target's buffers.
//!
//! ```text
//!   GM ─MTE2 (nd2nz / packed burst)─▶ L1 stage (ring of S) ─MTE1 load2d─▶ L0A/L0B buffer (of 2)
//!      ─M mmad─▶ L0C tile (Mt × Nt, f32) ─V copy_l0c_to_ub, epilogue─▶ UB set ─MTE3─▶ GM
//! ```
//!
//! **Tiles, steps, stages.** A *tile* is one L0C accumulator of `Mt × Nt` (single buffered:
//! 256 × 256 f32 fills ascend910's L0C, and the largest tile needs the fewest GM bytes per MAC).
//! Its K dimension runs in *steps* of `kc` (one L0A/L0B buffer, one `mmad`), and steps are
//! grouped into L1 *stages*: one DMA per operand and one MTE2→MTE1 flag per stage. Stage size
//! matters because `set_flag` waits for the pipe's completions, L2 or DDR latency included:
//! MTE2 idles for that latency at every flag. A 256 × 256 tile needs 978 cycles of MTE2 per
//! 64-deep step at ascend910's 67 B/cycle per core against 1024 + 32 cycles of cube, so with
//! one flag per step (about 240-350 cycles each) MTE2 would be the bottleneck; three steps per
//! stage make the two rates equal. A tile's stages are `first` steps, then `ksub` each, then
//! the rest.
//!
//! **Two cursors.** Each block walks its tiles (`block_idx`, `+ block_dim`, ..., numbered
//! `[g][mt][nt]`, so the blocks running at the same time share A and B panels in L2) as one
//! sequence of stages. The *producer* (MTE2 loads into the stage ring) runs `S - 1` stages
//! ahead of the *consumer* (MTE1 loads and `mmad`s), across tile boundaries too. The scalar
//! program is a loop unrolled `S` times (flag ids are immediates): produce stage g + S - 1,
//! then consume stage g, each a jump into code specialised for the tile's class (full, M edge,
//! N edge, corner: shapes are immediates) and the stage's kind, returning through a binary
//! search over call sites. Issuing the producer first matters because the scalar unit
//! dispatches in order into queues of 16: MTE2 work written after the cube's would wait for
//! the cube's queue to drain.
//!
//! **L0.** L0A/L0B buffers alternate step by step across stages and tiles; a register keeps the
//! parity and the consumer dispatches on it when stages have odd step counts. A step waits for
//! its loads where it first uses them.
//!
//! **Drain.** The tile's columns drain in up to four *groups*: the last step multiplies group
//! by group and hands each over (M→V); the next tile's first step re-initialises group by group
//! once V has copied that group out (V→M), so the cube waits only for one group's copy. The
//! drain of a tile is issued during the next tile's first stage (its V part after the first
//! step's loads, its MTE3 part spread over the stage's steps, each group with its own UB set
//! when they fit and the sets freed together): issued right after the last products, its 20-odd
//! V and MTE3 instructions would fill their queues and stall the scalar unit before it issues
//! the next tile's loads. In the block's last tile the last two steps run group by group with
//! both L0 buffers held, so the write-back nothing else overlaps starts a step earlier.
//!
//! **Residual.** A fused residual Add (a pointwise convolution's, see `fusion`) reads its
//! group's block of the residual into UB beside the drain set (MTE2, one padded burst per row
//! and fractal column, laid out as the f16 result) and adds it in f16 after the conversion,
//! before the ReLU: the same two roundings as the unfused convolution and Add kernels.
//!
//! **Planning.** The planner ranks tile shapes with a stage-level model of a block's pipeline
//! (MTE2 with its flag latency and stage ring, MTE1, the cube with its flag latency, the
//! hand-over between tiles, the last write-back), then tries every staging for the best few.
//!
//! Tails: nd2nz pads partial fractals with zeros (rows and the K tail), packed operands are
//! zero-padded when packed, and the write-back DMA moves only the valid rows and columns.

use gearsim_isa::units;
use gearsim_isa::{DType, Pipe, SReg, SType, Space};

use super::super::writer::{Asm, Reg};
use crate::CoreSpec;

/// Bytes of one 16 × 16 f16 fractal (L1, L0A, L0B).
pub const FRACTAL: u64 = units::FRACTAL_BYTES;
/// Bytes of one 16 × 16 f32 fractal in L0C.
pub const FRACTAL_C: u64 = units::FRACTAL_BYTES_F32;

/// One batch dimension: its size and the byte stride it moves each operand by (0 where the
/// operand is broadcast).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchDim {
    /// Extent.
    pub size: u64,
    /// Stride of A in bytes.
    pub a: u64,
    /// Stride of B in bytes.
    pub b: u64,
    /// Stride of C in bytes.
    pub c: u64,
}

/// Where an operand comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    /// An f16 row-major matrix in GM (argument `arg`), loaded with nd2nz. `trans`: stored
    /// transposed (A as K × M, B as N × K). `ld`: elements per stored row.
    Rows {
        /// Argument index.
        arg: usize,
        /// Stored transposed.
        trans: bool,
        /// Row pitch in elements.
        ld: u64,
    },
    /// Laid out by [`pack_a`] / [`pack_b`] for this plan (argument `arg`).
    Packed {
        /// Argument index.
        arg: usize,
    },
}

impl Src {
    fn arg(self) -> usize {
        match self {
            Src::Rows { arg, .. } | Src::Packed { arg } => arg,
        }
    }
}

/// Output element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// f16.
    F16,
    /// f32.
    F32,
    /// i32: an i8 product's accumulators as they are (no factor, addend or residual).
    I32,
    /// bf16: a bf16 product's result, written by the FIXPIPE (chips with one only).
    Bf16,
}

impl OutType {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            OutType::F16 | OutType::Bf16 => 2,
            OutType::F32 | OutType::I32 => 4,
        }
    }

    /// The vector element type.
    pub fn dtype(self) -> DType {
        match self {
            OutType::F16 => DType::F16,
            OutType::F32 => DType::F32,
            OutType::I32 => DType::I32,
            OutType::Bf16 => DType::Bf16,
        }
    }
}

/// Operand element type of the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InType {
    /// f16 operands, f32 accumulators.
    F16,
    /// bf16 operands, f32 accumulators (the f16 path with the other 2-byte type).
    Bf16,
    /// i8 operands, i32 accumulators. The generator sees each pair of i8 values as one 2-byte
    /// unit, so `k` and `ld` count pairs and a 16-unit fractal column is the i8 fractal's 32
    /// values; B comes as N × K rows (its i8 fractals are n-major in L0B, so no transposing
    /// load) or packed by [`pack_b_i8`]. The drain converts the accumulators to f32 before the
    /// epilogue, unless the output is i32.
    I8,
}

/// The first V ⇄ MTE2 event id of the residual buffers (id 0 is the bias area's; the full-C
/// addend, which never comes with a residual, uses ids from 0).
const RESIDUAL_FLAG: u64 = 1;

/// A term added to `alpha · A·B` in f32 before the output is written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Addend {
    /// One value, known when compiling.
    Scalar {
        /// The value.
        value: f32,
    },
    /// One value per column, as `[ceil(N/16)][16][16]` f32 fractals whose 16 rows are equal
    /// (see [`col_fractals`]).
    Cols {
        /// Argument index.
        arg: usize,
    },
    /// One value per row, as `[ceil(M/16)][16][16]` f32 fractals whose 16 columns are equal
    /// (see [`row_fractals`]).
    Rows {
        /// Argument index.
        arg: usize,
    },
    /// A full f32 `[M][N]` row-major matrix, multiplied by `beta` on the device.
    Full {
        /// Argument index.
        arg: usize,
        /// Factor.
        beta: f32,
    },
}

/// A per-column factor the f32 result is multiplied by before the addend is added (a
/// per-channel dequantisation scale): `[ceil(N/16)][16][16]` f32 fractals whose 16 rows are
/// equal (see [`col_fractals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColFactor {
    /// Argument index.
    pub arg: usize,
}

/// A batched matrix product to generate.
#[derive(Debug, Clone)]
pub struct Gemm {
    /// Kernel name.
    pub name: String,
    /// Batch dims, outermost first (empty for one product).
    pub batch: Vec<BatchDim>,
    /// Rows of C.
    pub m: u64,
    /// Columns of C.
    pub n: u64,
    /// Inner dimension (in pairs for an i8 product).
    pub k: u64,
    /// Operand element type.
    pub in_type: InType,
    /// Left operand.
    pub a: Src,
    /// Right operand.
    pub b: Src,
    /// Output argument.
    pub out: usize,
    /// Output type.
    pub out_type: OutType,
    /// Row pitch of C in elements.
    pub ldc: u64,
    /// Factor on the product (1 = none).
    pub alpha: f32,
    /// Per-column factor (not with a per-row, per-column or full addend, whose UB area and
    /// flags it shares).
    pub factor: Option<ColFactor>,
    /// Added term.
    pub addend: Option<Addend>,
    /// An f16 argument laid out as C (same pitch and batch strides) added to the f16 result
    /// before the ReLU (a fused residual Add); needs an f16 output.
    pub residual: Option<usize>,
    /// `max(c, 0)` on the way out (a fused ReLU).
    pub relu: bool,
}

/// The static tiling of a [`Gemm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Tile rows in fractals.
    pub mb: u64,
    /// Tile columns in fractals.
    pub nb: u64,
    /// K step (one L0A/L0B buffer, one `mmad`) in fractals; packed operands are laid out in
    /// these steps.
    pub kb: u64,
    /// K steps per L1 stage (one MTE2 load per operand and one flag).
    pub ksub: u64,
    /// K steps of a tile's first stage (at most `ksub`): a short first stage starts the cube
    /// early, a short last stage (the rest) ends it early.
    pub first: u64,
    /// L1 stages; the loads run `stages - 1` stages ahead of the cube.
    pub stages: u64,
    /// Drain groups per tile (at most).
    pub groups: u64,
    /// Blocks.
    pub block_dim: u32,
    /// Rows of tiles per strip of the tile order (1: row-major; see [`Gemm::strip_rows`]).
    pub strip: u64,
}

impl Plan {
    /// Fractals per group of a full tile.
    fn per_group(&self) -> u64 {
        self.nb.div_ceil(self.groups.max(1)).max(1)
    }

    /// How a tile's `steps` K steps fall into stages.
    fn schedule(&self, steps: u64) -> Schedule {
        let first = self.first.clamp(1, self.ksub.max(1)).min(steps);
        let ksub = self.ksub.clamp(1, steps);
        let stages = 1 + (steps - first).div_ceil(ksub);
        let last = if stages == 1 {
            steps
        } else {
            steps - first - (stages - 2) * ksub
        };
        Schedule {
            first,
            ksub,
            last,
            stages,
        }
    }
}

/// The stages of a tile: `first` steps, then `ksub` steps each, then `last` steps (a single
/// stage has all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schedule {
    first: u64,
    ksub: u64,
    last: u64,
    stages: u64,
}

/// Which stage of a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kind {
    first: bool,
    last: bool,
}

impl Schedule {
    /// Steps of a stage of this kind.
    fn steps(&self, kind: Kind) -> u64 {
        match (kind.first, kind.last) {
            (true, false) => self.first,
            (_, true) => self.last,
            (false, false) => self.ksub,
        }
    }

    /// K steps before the tile's last stage.
    fn before_last(&self) -> u64 {
        if self.stages == 1 {
            0
        } else {
            self.first + (self.stages - 2) * self.ksub
        }
    }

    /// The kinds of stage a tile has.
    fn kinds(&self) -> Vec<Kind> {
        let k = |first, last| Kind { first, last };
        match self.stages {
            1 => vec![k(true, true)],
            2 => vec![k(true, false), k(false, true)],
            _ => vec![k(true, false), k(false, false), k(false, true)],
        }
    }
}

/// Tile `t`'s batch item, row and column of tiles in an `mt × nt` grid per batch item, walked
/// in strips of `strip` rows (a divisor of `mt`), column by column within a strip; a strip of
/// 1 is row-major order. The kernel's scalar code computes the same.
pub fn tile_coords(t: u64, strip: u64, mt: u64, nt: u64) -> (u64, u64, u64) {
    let strip = strip.max(1);
    let (within, rest) = (t % (strip * nt), t / (strip * nt));
    let strips = (mt / strip).max(1);
    (
        rest / strips,
        (rest % strips) * strip + within % strip,
        within / strip,
    )
}

/// Event ids the engine uses for a pipe pair whose buffers rotate (L1 stages, drain groups).
fn rotation(core: &CoreSpec) -> u64 {
    u64::from(core.event_ids).clamp(1, 4)
}

/// MTE2 bytes a core moves per cycle when it streams (ascend910 caps a core at 67 B/cycle);
/// only used to rank tilings.
pub(super) const PLAN_BYTES_PER_CYCLE: u64 = 67;
/// MTE3 bytes per cycle, likewise.
pub(super) const PLAN_WRITE_BYTES_PER_CYCLE: u64 = 64;
/// Cycles MTE2 idles at each flag while its last DMA completes (between the L2's and the DDR's
/// read latency); ranks tilings.
pub(super) const PLAN_FLAG_LATENCY: u64 = 250;
/// Cycles the cube idles at each of its flags while its last product completes; ranks tilings.
const PLAN_CUBE_FLAG: u64 = 32;
/// Latency of a local move (MTE1, V) before its flag is set; ranks tilings.
const PLAN_LOCAL_LATENCY: u64 = 16;
/// Cycles from a block's start to its first load (argument loads from GM); ranks tilings.
pub(super) const PLAN_SETUP: u64 = 500;
/// Write latency the last write-back waits for; ranks tilings.
pub(super) const PLAN_WRITE_LATENCY: u64 = 203;
/// Tile shapes tried with every L1 staging.
const PLAN_SHAPES: usize = 6;

impl Gemm {
    fn tiles_of(&self, mb: u64, nb: u64) -> u64 {
        let g: u64 = self.batch.iter().map(|d| d.size).product();
        g * self.m.div_ceil(16 * mb) * self.n.div_ceil(16 * nb)
    }

    /// Whether the epilogue works in f32 in UB (anything but a plain f16 result).
    fn f32_work(&self) -> bool {
        self.alpha != 1.0
            || self.addend.is_some()
            || self.out_type == OutType::F32
            || self.in_type == InType::I8
            || self.factor.is_some()
    }

    /// UB bytes of one drain buffer set (groups of at most `per_group` n-fractals).
    fn ub_set_bytes(&self, mb: u64, per_group: u64) -> u64 {
        let frac = mb * per_group;
        let mut bytes = 0;
        if self.f32_work() {
            bytes += frac * FRACTAL_C;
        }
        if self.out_type == OutType::F16 {
            bytes += frac * FRACTAL;
        }
        if let Some(Addend::Full { .. }) = self.addend {
            bytes += frac * FRACTAL_C;
        }
        if self.residual.is_some() {
            bytes += frac * FRACTAL;
        }
        bytes
    }

    /// Whether a chip with a FIXPIPE writes the result from L0C straight to GM, as GE's matmul
    /// kernels for the separated architecture do: the FIXPIPE converts (f32 to f16, or an i8
    /// product's i32 dequantised by `alpha`), applies the ReLU and writes row-major, so only an
    /// addend, a per-column factor, a residual or a factor on an f16 product need the vector
    /// core.
    pub fn fixpipe_drains(&self) -> bool {
        self.addend.is_none()
            && self.factor.is_none()
            && self.residual.is_none()
            && (self.alpha == 1.0 || self.in_type == InType::I8)
            && !(self.relu && self.out_type == OutType::I32)
    }

    /// The vector of fractals a tile's drain reads from the per-tile bias area: a per-column
    /// (`true`) or per-row addend, or the per-column factor, with its argument.
    fn tile_vector(&self) -> Option<(bool, usize)> {
        match (self.factor, self.addend) {
            (Some(f), _) => Some((true, f.arg)),
            (None, Some(Addend::Cols { arg })) => Some((true, arg)),
            (None, Some(Addend::Rows { arg })) => Some((false, arg)),
            (None, Some(Addend::Full { .. } | Addend::Scalar { .. }) | None) => None,
        }
    }

    /// UB bytes of the per-tile bias area.
    fn ub_bias_bytes(&self, mb: u64, nb: u64) -> u64 {
        match self.tile_vector() {
            Some((true, _)) => nb * FRACTAL_C,
            Some((false, _)) => mb * FRACTAL_C,
            None => 0,
        }
    }

    /// Drain buffer sets in UB: one per group when they fit (V never waits for MTE3 inside a
    /// tile), else as many as fit; `None` when not even one does.
    fn ub_sets(&self, plan: &Plan, ub_bytes: u64) -> Option<u64> {
        let per = plan.per_group();
        let groups = plan.nb.div_ceil(per);
        let bias = self.ub_bias_bytes(plan.mb, plan.nb);
        (1..=groups)
            .rev()
            .find(|n| n * self.ub_set_bytes(plan.mb, per) + bias <= ub_bytes)
    }

    /// Estimated cycles of the busiest block under `plan`: a stage-level model of its
    /// pipeline. MTE2 loads stage after stage, each waiting for its L1 stage to be released
    /// (`stages` back) and idling for the flag latency after it; the cube multiplies a stage
    /// once it is loaded, the L0 buffers of its steps loaded by MTE1, and a tile's first stage
    /// once the previous tile's first group is copied out; the last tile's write-back
    /// follows the last products. Up to three tiles are modelled, the rest extrapolated.
    fn estimate(&self, plan: &Plan, cores: u64) -> u64 {
        let (mb, nb, kb) = (plan.mb, plan.nb, plan.kb);
        let kp = self.k.div_ceil(16).max(1);
        let tiles = self.tiles_of(mb, nb);
        let per_block = tiles.div_ceil(tiles.min(cores).max(1));
        let sch = plan.schedule(kp.div_ceil(kb));
        let es = self.out_type.bytes();
        let per = plan.per_group();
        let groups = nb.div_ceil(per);
        let flag = PLAN_CUBE_FLAG;
        let step_cube = mb * nb * kb + flag;
        let mte1 = mb * kb + 2 * nb * kb + PLAN_LOCAL_LATENCY;
        let v_group = 4 * mb * per + PLAN_LOCAL_LATENCY;
        let mte3_tile = 256 * mb * nb * es / PLAN_WRITE_BYTES_PER_CYCLE;
        let mut release = vec![0u64; plan.stages as usize];
        let (mut mte2_free, mut m_free, mut v_free) = (PLAN_SETUP, 0, 0);
        let mut ends = Vec::new();
        let mut g = 0usize;
        for t in 0..per_block.min(3) {
            for i in 0..sch.stages {
                let kind = Kind {
                    first: i == 0,
                    last: i + 1 == sch.stages,
                };
                let n = sch.steps(kind);
                let k = if kind.last {
                    kp - sch.before_last() * kb
                } else {
                    n * kb
                };
                let slot = g % release.len();
                let start = mte2_free.max(release[slot]);
                let ready =
                    start + (mb + nb) * k * FRACTAL / PLAN_BYTES_PER_CYCLE + PLAN_FLAG_LATENCY;
                mte2_free = ready;
                let mut cs = m_free.max(ready + mte1);
                if kind.first && t > 0 {
                    cs = cs.max(v_free);
                }
                let hand = groups * flag * (u64::from(kind.first) + u64::from(kind.last));
                let ce = cs + mb * nb * k + n * flag + hand;
                release[slot] = if n >= 2 {
                    cs + (n - 2) * step_cube + mte1
                } else {
                    ready + mte1
                };
                m_free = ce;
                if kind.last {
                    let last_group = mb * per * k.min(kb) + flag;
                    v_free = ce.saturating_sub((groups - 1) * last_group) + v_group;
                    ends.push(ce);
                }
                g += 1;
            }
        }
        let mut end = ends[ends.len() - 1];
        if per_block > ends.len() as u64 {
            let step = match ends.len() {
                1 => ends[0],
                n => ends[n - 1] - ends[n - 2],
            };
            end += (per_block - ends.len() as u64) * step;
        }
        // The last tile's write-back: its last two steps run group by group.
        let group_time = mb * per * kb * sch.last.min(2) + flag;
        let tail = (v_group + mte3_tile)
            .saturating_sub((groups - 1) * group_time)
            .max(v_group + mte3_tile / groups);
        end + tail + PLAN_WRITE_LATENCY
    }

    /// Rows of tiles per strip of the tile order. Row-major order (1) keeps every B panel in
    /// the L2 while the blocks sweep a row of tiles, so B comes from HBM once, as long as B and
    /// an A panel fit in half the L2 (the rest is left to the output's write-backs and the
    /// replacement's slack). When they do not, the tiles are ordered in strips of S rows,
    /// column by column within a strip (a block swizzle, as Ascend's matmul libraries do);
    /// S is the divisor of the row count whose first wave of tiles (one per block) touches
    /// the fewest bytes of A and B panels. B then comes from HBM about once per strip instead
    /// of once per row of tiles.
    fn strip_rows(&self, plan: &Plan, core: &CoreSpec) -> u64 {
        let kp = self.k.div_ceil(16).max(1);
        let (mt, nt) = (self.m.div_ceil(16 * plan.mb), self.n.div_ceil(16 * plan.nb));
        let (a_panel, b_panel) = (plan.mb * kp * FRACTAL, plan.nb * kp * FRACTAL);
        if a_panel + nt * b_panel <= core.l2_bytes / 2 {
            return 1;
        }
        let wave = u64::from(plan.block_dim).min(mt * nt);
        let touched = |strip: u64| {
            let (mut rows, mut cols) = (vec![false; mt as usize], vec![false; nt as usize]);
            for t in 0..wave {
                let (_, r, c) = tile_coords(t, strip, mt, nt);
                rows[r as usize] = true;
                cols[c as usize] = true;
            }
            let count = |v: &[bool]| v.iter().filter(|x| **x).count() as u64;
            count(&rows) * a_panel + count(&cols) * b_panel
        };
        (1..=mt)
            .filter(|s| mt % s == 0)
            .min_by_key(|&s| (touched(s), s))
            .unwrap_or(1)
    }

    /// Chooses the tiling: the tile shape, K step and L1 staging that minimise the estimated
    /// time of the busiest block, among those whose L0A/L0B double buffers, L0C tile, L1
    /// stages and UB drain buffers fit the core. Tile shapes are ranked with the deepest
    /// staging that fits; the best few are then tried with every staging.
    pub fn plan(&self, core: &CoreSpec) -> Result<Plan, String> {
        self.plan_costed(core).map(|(plan, _)| plan)
    }

    /// [`Gemm::plan`] with the estimated cycles of its busiest block.
    pub fn plan_costed(&self, core: &CoreSpec) -> Result<(Plan, u64), String> {
        if self.residual.is_some()
            && (self.out_type != OutType::F16 || matches!(self.addend, Some(Addend::Full { .. })))
        {
            // The residual is added in f16, and its buffers' event ids follow the bias area's
            // (a full C addend would use the same ids).
            return Err("a residual needs an f16 output and no full C addend".into());
        }
        if (self.in_type == InType::Bf16 || self.out_type == OutType::Bf16)
            && !(core.fixpipe
                && self.fixpipe_drains()
                && self.in_type == InType::Bf16
                && self.out_type == OutType::Bf16)
        {
            return Err(
                "a bf16 product needs a chip with a FIXPIPE and a result with no vector work \
                 (bf16 in, bf16 out, no addend, factor or residual)"
                    .into(),
            );
        }
        if self.factor.is_some()
            && matches!(
                self.addend,
                Some(Addend::Cols { .. } | Addend::Rows { .. } | Addend::Full { .. })
            )
        {
            return Err(
                "a per-column factor shares the drain's vector area with the addend".into(),
            );
        }
        if self.in_type == InType::I8 {
            if matches!(self.a, Src::Rows { trans: true, .. })
                || matches!(self.b, Src::Rows { trans: false, .. })
            {
                return Err("an i8 product takes A as M × K rows and B as N × K rows".into());
            }
            if self.out_type == OutType::I32
                && (self.alpha != 1.0
                    || self.addend.is_some()
                    || self.factor.is_some()
                    || self.residual.is_some())
            {
                return Err("an i32 output has no factor, addend or residual".into());
            }
        }
        let l0a = core.l0a_bytes / FRACTAL / 2;
        let l0b = core.l0b_bytes / FRACTAL / 2;
        let l0c = core.l0c_bytes / FRACTAL_C;
        let rot = rotation(core);
        let (mtot, ntot, kp) = (
            self.m.div_ceil(16).max(1),
            self.n.div_ceil(16).max(1),
            self.k.div_ceil(16).max(1),
        );
        let cores = core.cube_blocks();
        let plan_of = |mb: u64, nb: u64, stages: u64, ksub: u64, first: u64| {
            let kb = (l0a / mb).min(l0b / nb).min(kp);
            Plan {
                mb,
                nb,
                kb,
                ksub,
                first,
                stages,
                groups: rot.min(nb),
                block_dim: self.tiles_of(mb, nb).min(cores) as u32,
                strip: 1,
            }
        };
        // Most K steps per stage with `stages` stages.
        let most = |mb: u64, nb: u64, stages: u64| {
            let kb = (l0a / mb).min(l0b / nb).min(kp);
            (core.l1_bytes / (stages * (mb + nb) * kb * FRACTAL)).min(kp.div_ceil(kb))
        };
        let fits = |p: &Plan| p.ksub >= 1 && self.ub_sets(p, core.ub_bytes).is_some();
        let mut shapes = Vec::new();
        for mb in 1..=mtot.min(l0a).min(l0c) {
            for nb in 1..=ntot.min(l0b).min(l0c / mb) {
                let stages = (1..=rot).rev().find(|s| most(mb, nb, *s) >= 2).unwrap_or(1);
                let q = most(mb, nb, stages);
                let p = plan_of(mb, nb, stages, q, q);
                if fits(&p) {
                    shapes.push((self.estimate(&p, cores), u64::MAX - mb * nb, mb, nb));
                }
            }
        }
        shapes.sort_unstable();
        let mut best: Option<(u64, u64, Plan)> = None;
        for &(_, _, mb, nb) in shapes.iter().take(PLAN_SHAPES) {
            // Deeper staging first: on a tie it leaves MTE2 more room.
            for stages in (1..=rot).rev() {
                let q = most(mb, nb, stages);
                for (ksub, first) in (1..=q).flat_map(|q| (1..=q).map(move |f| (q, f))) {
                    let plan = plan_of(mb, nb, stages, ksub, first);
                    if !fits(&plan) {
                        continue;
                    }
                    let cost = self.estimate(&plan, cores);
                    let better = match &best {
                        None => true,
                        Some((c, area, _)) => cost < *c || (cost == *c && mb * nb > *area),
                    };
                    if better {
                        best = Some((cost, mb * nb, plan));
                    }
                }
            }
        }
        best.map(|(cost, _, p)| {
            let plan = Plan {
                strip: self.strip_rows(&p, core),
                ..p
            };
            (plan, cost)
        })
        .ok_or_else(|| {
            format!(
                "no tiling of a {}x{}x{} product fits the core (L0A {} B, L0B {} B, L0C {} B, L1 {} B, UB {} B)",
                self.m,
                self.n,
                self.k,
                core.l0a_bytes,
                core.l0b_bytes,
                core.l0c_bytes,
                core.l1_bytes,
                core.ub_bytes
            )
        })
    }
}

/// Packs a constant `A` (`[batch][M][K]` values, row-major) in L0A order for `plan`: per batch
/// item, per m-tile, per K step, fractals `(mb, kb)` row block by row block, each 16 × 16
/// row-major, zero-padded. The result is f16 bytes.
pub fn pack_a(values: &[f32], batch: u64, m: u64, k: u64, plan: &Plan) -> Vec<u8> {
    pack(values, batch, m, k, plan.mb, plan.kb, false, f16_bits)
}

/// [`pack_a`] for a bf16 product: the same order, bf16 bytes.
pub fn pack_a_bf16(values: &[f32], batch: u64, m: u64, k: u64, plan: &Plan) -> Vec<u8> {
    pack(values, batch, m, k, plan.mb, plan.kb, false, bf16_bits)
}

/// [`pack_b`] for a bf16 product: the same order, bf16 bytes.
pub fn pack_b_bf16(values: &[f32], batch: u64, k: u64, n: u64, plan: &Plan) -> Vec<u8> {
    pack(values, batch, n, k, plan.nb, plan.kb, true, bf16_bits)
}

fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

fn bf16_bits(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// Packs a constant `B` (`[batch][K][N]` values, row-major) in L0B order for `plan`: per batch
/// item, per n-tile, per K step, fractals `(kb, nb)` at `nb * KB + kb`, each 16 (k) × 16 (n)
/// row-major, zero-padded.
pub fn pack_b(values: &[f32], batch: u64, k: u64, n: u64, plan: &Plan) -> Vec<u8> {
    pack(values, batch, n, k, plan.nb, plan.kb, true, f16_bits)
}

/// Bytes one batch item of a packed operand takes (`rows` is M for A, N for B).
pub fn packed_bytes(rows: u64, k: u64) -> u64 {
    rows.div_ceil(16) * k.div_ceil(16) * FRACTAL
}

/// The packing both operands share: `outer` is the tiled dimension (M of A, N of B) in tiles
/// of `tile` fractals, K goes in steps of `step` fractals; `b_side` reads `[K][outer]` values
/// and writes each fractal with rows along k; `bits` gives a value's 2-byte encoding.
#[allow(clippy::too_many_arguments)]
fn pack(
    values: &[f32],
    batch: u64,
    outer: u64,
    k: u64,
    tile: u64,
    step: u64,
    b_side: bool,
    bits: fn(f32) -> u16,
) -> Vec<u8> {
    let item = (outer * k) as usize;
    let value = |g: u64, o: u64, kk: u64| -> f32 {
        if o >= outer || kk >= k {
            return 0.0;
        }
        let i = if b_side { kk * outer + o } else { o * k + kk };
        values[g as usize * item + i as usize]
    };
    let (ob, kp) = (outer.div_ceil(16), k.div_ceil(16));
    pack_fractals(batch, ob, kp, tile, step, |g, ob, kb, frac| {
        for r in 0..16 {
            for c in 0..16 {
                let (o, kk) = if b_side {
                    (ob * 16 + c, kb * 16 + r)
                } else {
                    (ob * 16 + r, kb * 16 + c)
                };
                let at = ((r * 16 + c) * 2) as usize;
                frac[at..at + 2].copy_from_slice(&bits(value(g, o, kk)).to_le_bytes());
            }
        }
    })
}

/// Packs a constant i8 `B` (`[K][N]` values, row-major; `k` counts values) for an i8 product
/// under `plan`: [`pack_b`]'s order of fractals, each n-major (16 rows of n, 32 values of k
/// each, zero-padded), as the i8 `mmad` reads L0B.
pub fn pack_b_i8(values: &[i8], k: u64, n: u64, plan: &Plan) -> Vec<u8> {
    let (nb, kp) = (n.div_ceil(16), k.div_ceil(32));
    pack_fractals(1, nb, kp, plan.nb, plan.kb, |_, ob, kb, frac| {
        for r in 0..16 {
            for c in 0..32 {
                let (j, kk) = (ob * 16 + r, kb * 32 + c);
                if j < n && kk < k {
                    frac[(r * 32 + c) as usize] = values[(kk * n + j) as usize] as u8;
                }
            }
        }
    })
}

/// The fractal order of a packed operand: per batch item, per tile of `tile` fractals of the
/// outer dimension (`ob` in all), per K step of `step` fractals (`kp` in all), the tile's
/// fractals outer block by outer block; `write(item, outer block, k block, fractal)` fills
/// each zeroed 512-byte fractal.
fn pack_fractals(
    batch: u64,
    ob: u64,
    kp: u64,
    tile: u64,
    step: u64,
    mut write: impl FnMut(u64, u64, u64, &mut [u8]),
) -> Vec<u8> {
    let mut out = vec![0u8; (batch * ob * kp * FRACTAL) as usize];
    let mut fracs = out.chunks_exact_mut(FRACTAL as usize);
    for g in 0..batch {
        for t0 in (0..ob).step_by(tile as usize) {
            let tb = tile.min(ob - t0);
            for s0 in (0..kp).step_by(step as usize) {
                let sb = step.min(kp - s0);
                for t in 0..tb {
                    for s in 0..sb {
                        if let Some(frac) = fracs.next() {
                            write(g, t0 + t, s0 + s, frac);
                        }
                    }
                }
            }
        }
    }
    out
}

/// `[ceil(n/16)][16][16]` f32 fractals whose rows all equal `values[nb*16 .. nb*16+16]`
/// (zero past `n`), scaled by `scale`: a per-column addend.
pub fn col_fractals(values: &[f32], scale: f32) -> Vec<u8> {
    let nb = values.len().div_ceil(16);
    let mut out = Vec::with_capacity(nb * 1024);
    for b in 0..nb {
        for _ in 0..16 {
            for c in 0..16 {
                let v = values.get(b * 16 + c).map_or(0.0, |v| v * scale);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// `[ceil(m/16)][16][16]` f32 fractals whose row r holds `values[mb*16 + r]` in every column
/// (zero past `m`), scaled by `scale`: a per-row addend.
pub fn row_fractals(values: &[f32], scale: f32) -> Vec<u8> {
    let mb = values.len().div_ceil(16);
    let mut out = Vec::with_capacity(mb * 1024);
    for b in 0..mb {
        for r in 0..16 {
            let v = values.get(b * 16 + r).map_or(0.0, |v| v * scale);
            for _ in 0..16 {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// Scalar registers of the kernel, each with one role.
struct Regs {
    a_base: Reg,
    b_base: Reg,
    c_base: Reg,
    e_base: Option<Reg>,
    /// The residual's address minus C's (the residual is laid out as C).
    r_delta: Option<Reg>,
    /// Always 0.
    zero: Reg,
    /// Which call site the producer or consumer code returns to.
    ret: Reg,
    /// Producer cursor: tile, stage within it, A and B addresses of the stage, tile class,
    /// L1 address of the stage.
    p_tile: Reg,
    p_k: Reg,
    pa: Reg,
    pb: Reg,
    p_cls: Reg,
    p_l1: Reg,
    /// Consumer cursor: tile, stage, C and addend addresses of the tile, tile class, L1
    /// address of the stage, parity of the next L0 buffer.
    c_tile: Reg,
    c_k: Reg,
    c_out: Reg,
    c_e: Reg,
    c_cls: Reg,
    c_l1: Reg,
    c_par: Reg,
    /// The previous tile of the consumer, drained during the current tile's first stage: C
    /// and addend addresses, class (`classes` when there is none).
    d_out: Reg,
    d_e: Reg,
    d_cls: Reg,
    t0: Reg,
    t1: Reg,
    t2: Reg,
    t3: Reg,
    t4: Reg,
    alpha: Option<Reg>,
    scalar: Option<Reg>,
}

/// The shape of one tile class: valid rows and columns and their fractal counts.
#[derive(Debug, Clone, Copy)]
struct TileShape {
    rows: u64,
    cols: u64,
    mb: u64,
    nb: u64,
}

/// Static buffer addresses.
#[derive(Debug, Clone)]
struct Layout {
    stage_bytes: u64,
    stage_a_bytes: u64,
    l0a_half: u64,
    l0b_half: u64,
    /// UB, per drain buffer set: f32 work buffer, f16 out buffer, C buffer, residual buffer;
    /// then the bias area.
    work: Vec<u64>,
    out16: Vec<u64>,
    cbuf: Vec<u64>,
    res: Vec<u64>,
    bias: u64,
}

/// Where an operand's fractal `(o, k)` of a stage sits in L1 (`o` the M or N fractal), in
/// fractals from the operand's part of the stage: `o * so + k * sk`, or, for packed operands,
/// step by step contiguous in L0 order.
#[derive(Debug, Clone, Copy)]
struct L1Order {
    so: u64,
    sk: u64,
    transpose: bool,
    packed: bool,
}

/// One K step as the products see it: its L0 buffer, the buffer's addresses, valid K and its
/// fractals.
#[derive(Debug, Clone, Copy)]
struct Step {
    buf: u64,
    l0a: u64,
    l0b: u64,
    k: u64,
    kb: u64,
}

/// Everything the kernel's parts share.
struct Kern<'a> {
    g: &'a Gemm,
    plan: &'a Plan,
    r: Regs,
    lay: Layout,
    /// The stages of a tile.
    sch: Schedule,
    /// K fractals of a full stage (the L1 layout's).
    ks: u64,
    mt_count: u64,
    nt_count: u64,
    tiles: u64,
    m_shapes: Vec<u64>,
    n_shapes: Vec<u64>,
    /// Stages the producer runs ahead.
    lead: u64,
    /// L0 buffer parities a stage can start with.
    parities: u64,
    /// Drain buffer sets in UB.
    nbuf: u64,
    a_m_stride: u64,
    b_n_stride: u64,
    /// The FIXPIPE writes each drain group from L0C to GM itself (see
    /// [`Gemm::fixpipe_drains`]): no UB, no vector work, and the kernel is the cube core's
    /// alone on a separated chip.
    fix: bool,
}

/// Writes the kernel for `g` with `plan`.
pub fn emit(g: &Gemm, plan: &Plan, core: &CoreSpec, a: &mut Asm) {
    let kp = g.k.div_ceil(16).max(1);
    let steps = kp.div_ceil(plan.kb);
    let sch = plan.schedule(steps);
    let plan = &Plan {
        ksub: sch.ksub,
        first: sch.first,
        stages: plan.stages.max(1),
        ..*plan
    };
    let ks = sch.ksub * plan.kb;
    let (mt_count, nt_count) = (g.m.div_ceil(16 * plan.mb), g.n.div_ceil(16 * plan.nb));
    let batch: u64 = g.batch.iter().map(|d| d.size).product();
    let tiles = batch * mt_count * nt_count;
    a.tiling("m", g.m as i64);
    a.tiling("n", g.n as i64);
    a.tiling("k", g.k as i64);
    a.tiling("batch", batch as i64);
    a.tiling("tile_m", (plan.mb * 16) as i64);
    a.tiling("tile_n", (plan.nb * 16) as i64);
    a.tiling("step_k", (plan.kb * 16) as i64);
    a.tiling("k_steps", steps as i64);
    a.tiling("stage_steps", sch.ksub as i64);
    a.tiling("first_stage_steps", sch.first as i64);
    a.tiling("k_stages", sch.stages as i64);
    a.tiling("tiles", tiles as i64);
    a.tiling("block_dim", i64::from(plan.block_dim));
    a.tiling("l1_stages", plan.stages as i64);
    a.tiling("strip_rows", plan.strip as i64);
    let mut nbuf = g.ub_sets(plan, core.ub_bytes).unwrap_or(1);
    if g.residual.is_some() {
        // Each set's residual buffer takes an event id of its own after the bias area's.
        nbuf = nbuf.min(
            u64::from(core.event_ids)
                .saturating_sub(RESIDUAL_FLAG)
                .max(1),
        );
    }
    let per_group = plan.per_group();
    let frac = plan.mb * per_group;
    let mut ub = 0;
    let mut take = |bytes: u64| {
        let at = ub;
        ub += bytes;
        at
    };
    let (mut work, mut out16, mut cbuf, mut res) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..nbuf {
        let w = if g.f32_work() {
            take(frac * FRACTAL_C)
        } else {
            0
        };
        work.push(w);
        out16.push(if g.out_type == OutType::F16 {
            take(frac * FRACTAL)
        } else {
            w
        });
        cbuf.push(if matches!(g.addend, Some(Addend::Full { .. })) {
            take(frac * FRACTAL_C)
        } else {
            0
        });
        res.push(if g.residual.is_some() {
            take(frac * FRACTAL)
        } else {
            0
        });
    }
    let bias = take(g.ub_bias_bytes(plan.mb, plan.nb));
    a.tiling("drain_groups", plan.nb.div_ceil(per_group) as i64);
    a.tiling("ub_sets", nbuf as i64);
    a.tiling("ub_bytes", ub as i64);
    let lay = Layout {
        stage_bytes: (plan.mb + plan.nb) * ks * FRACTAL,
        stage_a_bytes: plan.mb * ks * FRACTAL,
        l0a_half: core.l0a_bytes / 2 / FRACTAL * FRACTAL,
        l0b_half: core.l0b_bytes / 2 / FRACTAL * FRACTAL,
        work,
        out16,
        cbuf,
        res,
        bias,
    };
    let has_e = matches!(g.addend, Some(Addend::Full { .. })) || g.tile_vector().is_some();
    let scalar = matches!(g.addend, Some(Addend::Scalar { .. }));
    let r = Regs {
        a_base: a.reg(),
        b_base: a.reg(),
        c_base: a.reg(),
        e_base: has_e.then(|| a.reg()),
        r_delta: g.residual.map(|_| a.reg()),
        zero: a.reg(),
        ret: a.reg(),
        p_tile: a.reg(),
        p_k: a.reg(),
        pa: a.reg(),
        pb: a.reg(),
        p_cls: a.reg(),
        p_l1: a.reg(),
        c_tile: a.reg(),
        c_k: a.reg(),
        c_out: a.reg(),
        c_e: a.reg(),
        c_cls: a.reg(),
        c_l1: a.reg(),
        c_par: a.reg(),
        d_out: a.reg(),
        d_e: a.reg(),
        d_cls: a.reg(),
        t0: a.reg(),
        t1: a.reg(),
        t2: a.reg(),
        t3: a.reg(),
        t4: a.reg(),
        alpha: (g.alpha != 1.0).then(|| a.reg()),
        scalar: scalar.then(|| a.reg()),
    };
    let a_m_stride = match g.a {
        Src::Rows {
            trans: false, ld, ..
        } => 16 * plan.mb * ld * 2,
        Src::Rows { trans: true, .. } => 16 * plan.mb * 2,
        Src::Packed { .. } => plan.mb * kp * FRACTAL,
    };
    let b_n_stride = match g.b {
        Src::Rows { trans: false, .. } => 16 * plan.nb * 2,
        Src::Rows {
            trans: true, ld, ..
        } => 16 * plan.nb * ld * 2,
        Src::Packed { .. } => plan.nb * kp * FRACTAL,
    };
    // Tile classes: the last row of tiles and the last column may be partial; the full shape
    // exists when there is more than one tile or the only one is full.
    let shapes = |count: u64, total: u64, full: u64| -> Vec<u64> {
        let tail = total - (count - 1) * full;
        if tail == full || count == 1 {
            vec![tail]
        } else {
            vec![full, tail]
        }
    };
    let k = Kern {
        g,
        plan,
        r,
        lay,
        sch,
        ks,
        mt_count,
        nt_count,
        tiles,
        m_shapes: shapes(mt_count, g.m, plan.mb * 16),
        n_shapes: shapes(nt_count, g.n, plan.nb * 16),
        lead: plan.stages - 1,
        parities: if sch.kinds().iter().all(|k| sch.steps(*k).is_multiple_of(2)) {
            1
        } else {
            2
        },
        nbuf,
        a_m_stride,
        b_n_stride,
        fix: core.fixpipe && g.fixpipe_drains(),
    };
    k.emit(a);
}

impl Kern<'_> {
    /// The pipe that takes L0C groups from the cube: the FIXPIPE, or the vector pipe.
    fn drainer(&self) -> Pipe {
        if self.fix { Pipe::Fix } else { Pipe::V }
    }

    fn bias_load(&self) -> bool {
        self.g.tile_vector().is_some()
    }

    fn full_c(&self) -> bool {
        matches!(self.g.addend, Some(Addend::Full { .. }))
    }

    /// Drain groups of a full tile.
    fn group_count(&self) -> u64 {
        self.plan.nb.div_ceil(self.plan.per_group())
    }

    /// The flags every buffer starts with ("free") and ends with (consumed at the end).
    fn buffer_flags(&self, a: &mut Asm, wait: bool) {
        let op = |a: &mut Asm, src: Pipe, dst: Pipe, id: u64| {
            if wait {
                a.wait_flag(src, dst, id);
            } else {
                a.set_flag(src, dst, id);
            }
        };
        for j in 0..self.plan.stages {
            op(a, Pipe::Mte1, Pipe::Mte2, j);
        }
        for b in 0..2 {
            op(a, Pipe::M, Pipe::Mte1, b);
        }
        if !self.fix {
            for u in 0..self.nbuf {
                op(a, Pipe::Mte3, Pipe::V, u);
            }
        }
        for gi in 0..self.group_count() {
            op(a, self.drainer(), Pipe::M, gi);
        }
        if self.bias_load() {
            op(a, Pipe::V, Pipe::Mte2, 0);
        }
        if self.full_c() {
            for u in 0..self.nbuf {
                op(a, Pipe::V, Pipe::Mte2, u);
            }
        }
        if self.g.residual.is_some() {
            for u in 0..self.nbuf {
                op(a, Pipe::V, Pipe::Mte2, RESIDUAL_FLAG + u);
            }
        }
    }

    fn emit(&self, a: &mut Asm) {
        let (g, r, s) = (self.g, &self.r, self.plan.stages);
        let load_arg = |a: &mut Asm, reg: Reg, arg: usize| {
            a.ld(Space::Gm, SType::U64, reg, r.t0).off(arg * 8);
        };
        a.comment("the operands first: MTE2 starts before the rest is set up");
        a.sreg(r.t0, SReg::Args);
        load_arg(a, r.a_base, g.a.arg());
        load_arg(a, r.b_base, g.b.arg());
        a.movi(r.zero, 0);
        a.comment("every L1 stage, L0 buffer, L0C group and UB buffer starts free");
        self.buffer_flags(a, false);
        a.comment("both cursors start at this block's first tile");
        a.sreg(r.p_tile, SReg::BlockIdx);
        a.mov(r.c_tile, r.p_tile);
        a.movi(r.p_k, 0);
        a.movi(r.c_k, 0);
        a.movi(r.c_par, 0);
        a.movi(r.c_cls, self.classes() as i64);
        let produce = a.new_label("produce");
        let consume = a.new_label("consume");
        let done = a.new_label("done");
        let (mut p_sites, mut c_sites) = (Vec::new(), Vec::new());
        a.comment(format_args!("the producer runs {} stages ahead", self.lead));
        for j in 0..self.lead {
            self.produce_call(a, j, &produce, &mut p_sites);
        }
        a.sreg(r.t0, SReg::Args);
        load_arg(a, r.c_base, g.out);
        let e_arg = match g.addend {
            Some(Addend::Full { arg, .. }) => Some(arg),
            _ => g.tile_vector().map(|(_, arg)| arg),
        };
        if let (Some(e), Some(arg)) = (r.e_base, e_arg) {
            load_arg(a, e, arg);
        }
        if let (Some(d), Some(arg)) = (r.r_delta, g.residual) {
            load_arg(a, d, arg);
            a.sub(d, d, r.c_base);
        }
        if let (Some(reg), Some(Addend::Scalar { value })) = (r.scalar, g.addend) {
            a.movi(reg, i64::from(value.to_bits()));
        }
        if let Some(reg) = r.alpha {
            a.movi(reg, i64::from(g.alpha.to_bits()));
        }
        let top = a.new_label("stage_loop");
        a.place(&top);
        for u in 0..s {
            self.produce_call(a, (u + self.lead) % s, &produce, &mut p_sites);
            self.consume_call(a, u, &consume, &done, &mut c_sites);
        }
        jump(a, &top);
        self.producer(a, &produce, &p_sites);
        self.consumer(a, &consume, &c_sites);
        a.place(&done);
        a.comment("drain the last tile (a block with no tile has nothing to drain)");
        let end = a.new_label("end");
        let mut targets = Vec::new();
        let mut bodies = Vec::new();
        for cls in 0..self.classes() {
            let l = a.new_label("drain");
            targets.push((cls as u64, l.clone()));
            bodies.push((cls, l));
        }
        targets.push((self.classes() as u64, end.clone()));
        self.dispatch(a, r.c_cls, &targets);
        for (cls, l) in bodies {
            a.place(&l);
            let sh = self.shape(cls);
            self.drain(a, sh, r.c_out, r.c_e);
            jump(a, &end);
        }
        a.place(&end);
        a.comment("consume the flags the last stages and tiles set");
        self.buffer_flags(a, true);
    }

    /// Loads the producer's next stage into L1 stage `slot` (nothing once it is past the
    /// block's last tile).
    fn produce_call(&self, a: &mut Asm, slot: u64, produce: &str, sites: &mut Vec<String>) {
        let r = &self.r;
        let skip = a.new_label("no_load");
        let back = a.new_label("loaded");
        a.movi(r.t0, self.tiles as i64);
        let l = a.label(&skip);
        a.bge(r.p_tile, r.t0, l);
        a.wait_flag(Pipe::Mte1, Pipe::Mte2, slot);
        a.movi(r.p_l1, (slot * self.lay.stage_bytes) as i64);
        a.movi(r.ret, sites.len() as i64);
        jump(a, produce);
        a.place(&back);
        a.set_flag(Pipe::Mte2, Pipe::Mte1, slot);
        a.place(&skip);
        sites.push(back);
    }

    /// Multiplies the consumer's next stage from L1 stage `slot`, or ends the block.
    fn consume_call(
        &self,
        a: &mut Asm,
        slot: u64,
        consume: &str,
        done: &str,
        sites: &mut Vec<String>,
    ) {
        let r = &self.r;
        let back = a.new_label("multiplied");
        a.movi(r.t0, self.tiles as i64);
        let l = a.label(done);
        a.bge(r.c_tile, r.t0, l);
        a.wait_flag(Pipe::Mte2, Pipe::Mte1, slot);
        a.movi(r.c_l1, (slot * self.lay.stage_bytes) as i64);
        a.movi(r.ret, sites.len() as i64);
        jump(a, consume);
        a.place(&back);
        a.set_flag(Pipe::Mte1, Pipe::Mte2, slot);
        sites.push(back);
    }

    /// Jumps to the label whose value equals register `index` (`targets` sorted by value;
    /// a binary search, the last comparison falling through to the largest value not above).
    fn dispatch(&self, a: &mut Asm, index: Reg, targets: &[(u64, String)]) {
        let r = &self.r;
        if targets.len() == 1 {
            jump(a, &targets[0].1);
            return;
        }
        let mid = targets.len() / 2;
        let right = a.new_label("upper");
        a.movi(r.t1, targets[mid].0 as i64);
        let l = a.label(&right);
        a.bge(index, r.t1, l);
        self.dispatch(a, index, &targets[..mid]);
        a.place(&right);
        self.dispatch(a, index, &targets[mid..]);
    }

    /// Advances a cursor past one stage and returns to its call site.
    fn advance(&self, a: &mut Asm, tile: Reg, k: Reg, sites: &[String]) {
        let r = &self.r;
        let same = a.new_label("same_tile");
        a.add_imm(k, 1);
        a.movi(r.t0, self.sch.stages as i64);
        let l = a.label(&same);
        a.bne(k, r.t0, l);
        a.movi(k, 0);
        a.add_imm(tile, i64::from(self.plan.block_dim));
        a.place(&same);
        let targets: Vec<(u64, String)> = sites
            .iter()
            .enumerate()
            .map(|(i, l)| (i as u64, l.clone()))
            .collect();
        self.dispatch(a, r.ret, &targets);
    }

    /// The tile shape of class `cls`.
    fn shape(&self, cls: usize) -> TileShape {
        let nl = self.n_shapes.len();
        let (rows, cols) = (self.m_shapes[cls / nl], self.n_shapes[cls % nl]);
        TileShape {
            rows,
            cols,
            mb: rows.div_ceil(16),
            nb: cols.div_ceil(16),
        }
    }

    fn classes(&self) -> usize {
        self.m_shapes.len() * self.n_shapes.len()
    }

    /// Tile coordinates of `tile` = `(g * MT + mt) * NT + nt`: the producer's A and B
    /// addresses or the consumer's C and addend addresses, and the tile's class.
    fn coords(&self, a: &mut Asm, producer: bool) {
        let (g, plan, r) = (self.g, self.plan, &self.r);
        let (mt, nt, gg) = (r.t2, r.t3, r.t4);
        let tile = if producer { r.p_tile } else { r.c_tile };
        let strip = plan.strip;
        if strip <= 1 {
            a.movi(r.t0, self.nt_count as i64);
            a.remu(nt, tile, r.t0);
            a.divu(gg, tile, r.t0);
            a.movi(r.t0, self.mt_count as i64);
            a.remu(mt, gg, r.t0);
            a.divu(gg, gg, r.t0);
        } else {
            // Strips of `strip` rows of tiles, column by column within a strip: the tile's
            // place in its strip (t1), then its column and row within the strip.
            a.movi(r.t0, (strip * self.nt_count) as i64);
            a.remu(r.t1, tile, r.t0);
            a.divu(gg, tile, r.t0);
            a.movi(r.t0, strip as i64);
            a.divu(nt, r.t1, r.t0);
            a.remu(mt, r.t1, r.t0);
            a.movi(r.t0, (self.mt_count / strip) as i64);
            a.remu(r.t1, gg, r.t0);
            a.divu(gg, gg, r.t0);
            a.muli(r.t1, r.t1, strip);
            a.add(mt, mt, r.t1);
        }
        let es = g.out_type.bytes();
        if producer {
            scaled_add(a, r.pa, r.a_base, mt, self.a_m_stride, r.t0);
            scaled_add(a, r.pb, r.b_base, nt, self.b_n_stride, r.t0);
        } else {
            scaled_add(a, r.c_out, r.c_base, mt, 16 * plan.mb * g.ldc * es, r.t0);
            scaled_add(a, r.c_out, r.c_out, nt, 16 * plan.nb * es, r.t0);
            if let Some(e_base) = r.e_base {
                match (g.addend, g.tile_vector()) {
                    (Some(Addend::Full { .. }), _) => {
                        scaled_add(a, r.c_e, e_base, mt, 16 * plan.mb * g.n * 4, r.t0);
                        scaled_add(a, r.c_e, r.c_e, nt, 16 * plan.nb * 4, r.t0);
                    }
                    (_, Some((true, _))) => {
                        scaled_add(a, r.c_e, e_base, nt, plan.nb * FRACTAL_C, r.t0);
                    }
                    (_, Some((false, _))) => {
                        scaled_add(a, r.c_e, e_base, mt, plan.mb * FRACTAL_C, r.t0);
                    }
                    (_, None) => {}
                }
            }
        }
        for d in g.batch.iter().rev() {
            a.movi(r.t0, d.size as i64);
            a.remu(r.t1, gg, r.t0);
            a.divu(gg, gg, r.t0);
            if producer {
                scaled_add(a, r.pa, r.pa, r.t1, d.a, r.t0);
                scaled_add(a, r.pb, r.pb, r.t1, d.b, r.t0);
            } else {
                scaled_add(a, r.c_out, r.c_out, r.t1, d.c, r.t0);
            }
        }
        let cls = if producer { r.p_cls } else { r.c_cls };
        a.movi(cls, 0);
        let nl = self.n_shapes.len() as u64;
        if self.m_shapes.len() == 2 {
            a.movi(r.t0, self.mt_count as i64 - 1);
            a.seq(r.t1, mt, r.t0);
            a.muli(r.t1, r.t1, nl);
            a.add(cls, cls, r.t1);
        }
        if nl == 2 {
            a.movi(r.t0, self.nt_count as i64 - 1);
            a.seq(r.t1, nt, r.t0);
            a.add(cls, cls, r.t1);
        }
    }

    /// `t1` = 1 at a tile's first stage (stage register `k` is 0), `t2` = 1 at its last.
    fn stage_bits(&self, a: &mut Asm, k: Reg) {
        let r = &self.r;
        a.seq(r.t1, k, r.zero);
        if self.sch.stages == 1 {
            a.movi(r.t2, 1);
        } else {
            a.movi(r.t3, self.sch.stages as i64 - 1);
            a.seq(r.t2, k, r.t3);
        }
    }

    /// The producer: tile coordinates at a tile's first stage, then the stage's loads for the
    /// tile's class and the stage's kind.
    fn producer(&self, a: &mut Asm, label: &str, sites: &[String]) {
        let r = &self.r;
        let have = a.new_label("p_have");
        let tail = a.new_label("p_tail");
        a.place(label);
        let l = a.label(&have);
        a.bne(r.p_k, r.zero, l);
        self.coords(a, true);
        a.place(&have);
        // index = (class * 2 + last) * 2 + first
        self.stage_bits(a, r.p_k);
        a.shli(r.t0, r.p_cls, 1);
        a.add(r.t0, r.t0, r.t2);
        a.shli(r.t0, r.t0, 1);
        a.add(r.t0, r.t0, r.t1);
        let mut targets = Vec::new();
        let mut bodies = Vec::new();
        for cls in 0..self.classes() {
            for kind in self.sch.kinds() {
                let l = a.new_label("load");
                let index = (cls as u64 * 2 + u64::from(kind.last)) * 2 + u64::from(kind.first);
                targets.push((index, l.clone()));
                bodies.push((cls, kind, l));
            }
        }
        targets.sort();
        self.dispatch(a, r.t0, &targets);
        for (cls, kind, l) in bodies {
            a.place(&l);
            let sh = self.shape(cls);
            a.comment(format_args!(
                "load {} of a {} x {} tile",
                kind_name(kind),
                sh.rows,
                sh.cols
            ));
            self.load_stage(a, sh, kind);
            jump(a, &tail);
        }
        a.place(&tail);
        self.advance(a, r.p_tile, r.p_k, sites);
    }

    /// The MTE2 loads of one stage: A, then B after A's part of the L1 stage.
    fn load_stage(&self, a: &mut Asm, sh: TileShape, kind: Kind) {
        let (g, r, ks) = (self.g, &self.r, self.ks);
        let kv = self.stage_k(kind);
        let kf = kv.div_ceil(16);
        match g.a {
            Src::Rows {
                trans: false, ld, ..
            } => {
                a.copy_gm_to_l1_nd2nz(r.p_l1, r.pa, sh.rows, kv, ld, sh.mb * 16);
            }
            Src::Rows {
                trans: true, ld, ..
            } => {
                a.copy_gm_to_l1_nd2nz(r.p_l1, r.pa, kv, sh.rows, ld, ks * 16);
            }
            Src::Packed { .. } => {
                a.copy_gm_to_l1(r.p_l1, r.pa, 1, sh.mb * kf * FRACTAL / units::BLOCK_BYTES);
            }
        }
        a.addi(r.t0, r.p_l1, self.lay.stage_a_bytes);
        match g.b {
            Src::Rows {
                trans: false, ld, ..
            } => {
                a.copy_gm_to_l1_nd2nz(r.t0, r.pb, kv, sh.cols, ld, ks * 16);
            }
            Src::Rows {
                trans: true, ld, ..
            } => {
                a.copy_gm_to_l1_nd2nz(r.t0, r.pb, sh.cols, kv, ld, sh.nb * 16);
            }
            Src::Packed { .. } => {
                a.copy_gm_to_l1(r.t0, r.pb, 1, sh.nb * kf * FRACTAL / units::BLOCK_BYTES);
            }
        }
        if !kind.last {
            // A stage that is not the last is whole steps: kv is a multiple of 16.
            let adv_a = match g.a {
                Src::Rows { trans: false, .. } => kv * 2,
                Src::Rows {
                    trans: true, ld, ..
                } => kv * ld * 2,
                Src::Packed { .. } => sh.mb * kf * FRACTAL,
            };
            let adv_b = match g.b {
                Src::Rows {
                    trans: false, ld, ..
                } => kv * ld * 2,
                Src::Rows { trans: true, .. } => kv * 2,
                Src::Packed { .. } => sh.nb * kf * FRACTAL,
            };
            add_const(a, r.pa, adv_a, r.t1);
            add_const(a, r.pb, adv_b, r.t1);
        }
    }

    /// The consumer: at a tile's first stage the previous tile becomes the one to drain and
    /// the tile's coordinates are computed; then the stage's steps for the tile's class, the
    /// stage's kind, the previous tile's class (first stages drain it) and the parity of the
    /// first L0 buffer.
    fn consumer(&self, a: &mut Asm, label: &str, sites: &[String]) {
        let r = &self.r;
        let have = a.new_label("c_have");
        let tail = a.new_label("c_tail");
        let prevs = self.classes() as u64 + 1;
        a.place(label);
        let l = a.label(&have);
        a.bne(r.c_k, r.zero, l);
        a.mov(r.d_out, r.c_out);
        a.mov(r.d_e, r.c_e);
        a.mov(r.d_cls, r.c_cls);
        self.coords(a, false);
        a.place(&have);
        // index = ((((class * prevs + previous if first) * 2 + last) * 2 + first) * 2
        //          + final if last) * 2 + parity
        self.stage_bits(a, r.c_k);
        a.muli(r.t0, r.c_cls, prevs);
        a.mul(r.t3, r.d_cls, r.t1);
        a.add(r.t0, r.t0, r.t3);
        a.shli(r.t0, r.t0, 1);
        a.add(r.t0, r.t0, r.t2);
        a.shli(r.t0, r.t0, 1);
        a.add(r.t0, r.t0, r.t1);
        a.shli(r.t0, r.t0, 1);
        // final: the block's last tile (no tile after it) at its last stage
        a.addi(r.t3, r.c_tile, self.plan.block_dim);
        a.movi(r.t4, self.tiles as i64);
        a.slt(r.t3, r.t3, r.t4);
        a.xori(r.t3, r.t3, 1);
        a.mul(r.t3, r.t3, r.t2);
        a.add(r.t0, r.t0, r.t3);
        a.shli(r.t0, r.t0, 1);
        a.add(r.t0, r.t0, r.c_par);
        let mut targets = Vec::new();
        let mut bodies = Vec::new();
        for cls in 0..self.classes() {
            for kind in self.sch.kinds() {
                let prev_range = if kind.first { 0..prevs } else { 0..1 };
                for prev in prev_range {
                    let fins: &[bool] = if kind.last { &[false, true] } else { &[false] };
                    for &fin in fins {
                        for par in 0..self.parities {
                            let l = a.new_label("stage");
                            let index =
                                ((((cls as u64 * prevs + prev) * 2 + u64::from(kind.last)) * 2
                                    + u64::from(kind.first))
                                    * 2
                                    + u64::from(fin))
                                    * 2
                                    + par;
                            targets.push((index, l.clone()));
                            let prev = (kind.first && prev < prevs - 1).then_some(prev as usize);
                            bodies.push((cls, kind, prev, fin, par, l));
                        }
                    }
                }
            }
        }
        targets.sort();
        self.dispatch(a, r.t0, &targets);
        for (cls, kind, prev, fin, par, l) in bodies {
            a.place(&l);
            let sh = self.shape(cls);
            a.comment(format_args!(
                "multiply {} of a {} x {} {}tile, first L0 buffer {par}{}",
                kind_name(kind),
                sh.rows,
                sh.cols,
                if fin { "final " } else { "" },
                match prev {
                    Some(p) => {
                        let ps = self.shape(p);
                        format!(", draining a {} x {} tile", ps.rows, ps.cols)
                    }
                    None => String::new(),
                }
            ));
            self.multiply_stage(a, sh, kind, prev.map(|p| self.shape(p)), fin, par);
            jump(a, &tail);
        }
        a.place(&tail);
        self.advance(a, r.c_tile, r.c_k, sites);
    }

    /// Valid K (elements) of a stage of this kind.
    fn stage_k(&self, kind: Kind) -> u64 {
        if kind.last {
            self.g.k - self.sch.before_last() * self.plan.kb * 16
        } else {
            self.sch.steps(kind) * self.plan.kb * 16
        }
    }

    /// How the operands' stages sit in L1 (see [`L1Order`]).
    fn l1_orders(&self, sh: TileShape) -> (L1Order, L1Order) {
        let ks = self.ks;
        let plain = |so, sk, transpose| L1Order {
            so,
            sk,
            transpose,
            packed: false,
        };
        let packed = L1Order {
            so: 0,
            sk: 0,
            transpose: false,
            packed: true,
        };
        let a = match self.g.a {
            // NZ of the M x K panel: fractal (m, k) at k * MB + m.
            Src::Rows { trans: false, .. } => plain(1, sh.mb, false),
            // NZ of the K x M panel: fractal (k, m) at m * KS + k, transposed on the way.
            Src::Rows { trans: true, .. } => plain(ks, 1, true),
            Src::Packed { .. } => packed,
        };
        let b = match self.g.b {
            // NZ of the K x N panel: fractal (k, n) at n * KS + k.
            Src::Rows { trans: false, .. } => plain(ks, 1, false),
            // NZ of the N x K panel: fractal (n, k) at k * NB + n, transposed on the way (an
            // i8 fractal is n-major in L0B as it is in L1).
            Src::Rows { trans: true, .. } => plain(1, sh.nb, self.g.in_type != InType::I8),
            Src::Packed { .. } => packed,
        };
        (a, b)
    }

    /// `mmad` of L0A at `t1` and L0B at `t2` into L0C at `t0`, `k` in the generator's units.
    fn mmad<'a>(
        &self,
        a: &'a mut Asm,
        m: u64,
        k: u64,
        n: u64,
    ) -> gearsim_isa::Emitted<'a, gearsim_isa::Mmad> {
        let r = &self.r;
        match self.g.in_type {
            InType::F16 => a.mmad(r.t0, r.t1, r.t2, m, k, n),
            InType::Bf16 => a.mmad(r.t0, r.t1, r.t2, m, k, n).ty(DType::Bf16),
            InType::I8 => a.mmad(r.t0, r.t1, r.t2, m, 2 * k, n).ty(DType::I8),
        }
    }

    /// MTE1 loads of one step: fractals `(o, k0 + k)` for `o < ob`, `k < kb` from the stage
    /// (operand part at `part` bytes) into `l0` in L0 order (`o * kb + k`).
    #[allow(clippy::too_many_arguments)]
    fn load_step(
        &self,
        a: &mut Asm,
        l0b: bool,
        l0: u64,
        part: u64,
        order: L1Order,
        ob: u64,
        k0: u64,
        kb: u64,
        step: u64,
    ) {
        let r = &self.r;
        let load = |a: &mut Asm, nfrac: u64, src_stride: u64, dst_stride: u64| {
            let e = if l0b {
                a.load_l0b(r.t0, r.t1, nfrac)
            } else {
                a.load_l0a(r.t0, r.t1, nfrac)
            };
            e.src_stride(src_stride)
                .dst_stride(dst_stride)
                .transpose(order.transpose);
        };
        if order.packed {
            a.movi(r.t0, l0 as i64);
            let at = part + step * ob * self.plan.kb * FRACTAL;
            a.addi(r.t1, r.c_l1, at);
            load(a, ob * kb, 1, 1);
        } else if kb <= ob {
            for x in 0..kb {
                a.movi(r.t0, (l0 + x * FRACTAL) as i64);
                let at = part + (k0 + x) * order.sk * FRACTAL;
                a.addi(r.t1, r.c_l1, at);
                load(a, ob, order.so, kb);
            }
        } else {
            for y in 0..ob {
                a.movi(r.t0, (l0 + y * kb * FRACTAL) as i64);
                let at = part + (y * order.so + k0 * order.sk) * FRACTAL;
                a.addi(r.t1, r.c_l1, at);
                load(a, kb, order.sk, 1);
            }
        }
    }

    /// One stage on the consumer side: per step, MTE1 loads into L0 buffer `b` and the
    /// products. The tile's first step initialises L0C group by group, each group once the
    /// previous tile's drain has copied it out: that drain (`prev`) is issued here, its V part
    /// after the first step's loads and its MTE3 part spread over the stage's steps, so the
    /// scalar unit never waits for a whole write-back before it can issue the next loads. The
    /// tile's last step hands each group over to the drain; in the block's `last_tile`, whose
    /// drain nothing overlaps, the last two steps run group by group (both L0 buffers held),
    /// so the first groups are written back while the cube still works on the others.
    fn multiply_stage(
        &self,
        a: &mut Asm,
        sh: TileShape,
        kind: Kind,
        prev: Option<TileShape>,
        last_tile: bool,
        par: u64,
    ) {
        let r = &self.r;
        let nsub = self.sch.steps(kind);
        let prev_groups = prev.map_or(0, |p| self.groups(p).len());
        // With a UB set per group the MTE3 part can follow later; else V and MTE3 alternate.
        let spread = prev_groups as u64 <= self.nbuf;
        let paired = last_tile && kind.last && nsub >= 2;
        let mut s = 0;
        while s < nsub {
            let count = if paired && s + 2 == nsub { 2 } else { 1 };
            let mut steps = Vec::new();
            for j in s..s + count {
                steps.push(self.load_l0(a, sh, kind, par, j));
                if kind.first && j == 0 {
                    if let Some(p) = prev {
                        a.comment("drain the previous tile");
                        for gi in 0..prev_groups {
                            self.drain_v(a, p, gi, r.d_out, r.d_e);
                            if !spread {
                                self.drain_mte3(a, p, gi, r.d_out, true);
                            }
                        }
                        if self.bias_load() {
                            a.set_flag(Pipe::V, Pipe::Mte2, 0);
                        }
                    }
                    if self.bias_load() {
                        self.load_bias(a, sh);
                    }
                }
            }
            let init = kind.first && s == 0;
            let hand_over = kind.last && s + count == nsub;
            self.mmads(a, sh, &steps, init, hand_over);
            if let (true, Some(p)) = (kind.first && spread, prev) {
                // These steps' share of the previous tile's write-back.
                let (from, to) = (
                    (s as usize * prev_groups).div_ceil(nsub as usize),
                    ((s + count) as usize * prev_groups).div_ceil(nsub as usize),
                );
                for gi in from..to {
                    self.drain_mte3(a, p, gi, r.d_out, false);
                }
                if to == prev_groups && from < to && !self.fix {
                    for u in 0..prev_groups {
                        a.set_flag(Pipe::Mte3, Pipe::V, u);
                    }
                }
            }
            s += count;
        }
        if nsub % 2 == 1 {
            a.xori(r.c_par, r.c_par, 1);
        }
    }

    /// MTE1: step `s` of the stage into its L0 buffer, in the orders mmad reads. Returns the
    /// step as the products see it.
    fn load_l0(&self, a: &mut Asm, sh: TileShape, kind: Kind, par: u64, s: u64) -> Step {
        let (plan, lay) = (self.plan, &self.lay);
        let buf = (par + s) % 2;
        let k0 = s * plan.kb;
        let k = (plan.kb * 16).min(self.stage_k(kind) - k0 * 16);
        let kb = k.div_ceil(16);
        let (order_a, order_b) = self.l1_orders(sh);
        let (l0a, l0b) = (buf * lay.l0a_half, buf * lay.l0b_half);
        a.wait_flag(Pipe::M, Pipe::Mte1, buf);
        self.load_step(a, false, l0a, 0, order_a, sh.mb, k0, kb, s);
        self.load_step(a, true, l0b, lay.stage_a_bytes, order_b, sh.nb, k0, kb, s);
        a.set_flag(Pipe::Mte1, Pipe::M, buf);
        Step {
            buf,
            l0a,
            l0b,
            k,
            kb,
        }
    }

    /// M: the products of one or two loaded steps. Where the L0C tile changes hands (`init`:
    /// the first step waits for each group's drain; `hand_over`: the last hands each group to
    /// it) they run group by group, every step of a group before the next group.
    fn mmads(&self, a: &mut Asm, sh: TileShape, steps: &[Step], init: bool, hand_over: bool) {
        let r = &self.r;
        if init || hand_over {
            for (gi, (n0, n)) in self.groups(sh).into_iter().enumerate() {
                if init {
                    a.wait_flag(self.drainer(), Pipe::M, gi);
                }
                for (j, st) in steps.iter().enumerate() {
                    if gi == 0 {
                        // Each step's loads are waited for where they are first used.
                        a.wait_flag(Pipe::Mte1, Pipe::M, st.buf);
                    }
                    a.movi(r.t0, (n0 * sh.mb * FRACTAL_C) as i64);
                    a.movi(r.t1, st.l0a as i64);
                    a.movi(r.t2, (st.l0b + n0 * st.kb * FRACTAL) as i64);
                    self.mmad(a, sh.mb * 16, st.k, n * 16).init(init && j == 0);
                }
                if hand_over {
                    a.set_flag(Pipe::M, self.drainer(), gi);
                }
            }
        } else {
            for st in steps {
                a.wait_flag(Pipe::Mte1, Pipe::M, st.buf);
                a.movi(r.t0, 0);
                a.movi(r.t1, st.l0a as i64);
                a.movi(r.t2, st.l0b as i64);
                self.mmad(a, sh.mb * 16, st.k, sh.nb * 16);
            }
        }
        for st in steps {
            a.set_flag(Pipe::M, Pipe::Mte1, st.buf);
        }
    }

    /// MTE2: a tile's bias fractals, needed by its drain.
    fn load_bias(&self, a: &mut Asm, sh: TileShape) {
        let (r, g) = (&self.r, self.g);
        a.wait_flag(Pipe::V, Pipe::Mte2, 0);
        a.movi(r.t0, self.lay.bias as i64);
        let frac = match g.tile_vector() {
            Some((true, _)) => sh.nb,
            _ => sh.mb,
        };
        a.copy_gm_to_ub(r.t0, r.c_e, 1, frac * FRACTAL_C / units::BLOCK_BYTES);
        a.set_flag(Pipe::Mte2, Pipe::V, 0);
    }

    /// Splits a tile's n-fractals into drain groups: (first n-fractal, count).
    fn groups(&self, sh: TileShape) -> Vec<(u64, u64)> {
        let per = self.plan.per_group();
        let mut out = Vec::new();
        let mut at = 0;
        while at < sh.nb {
            let n = per.min(sh.nb - at);
            out.push((at, n));
            at += n;
        }
        out
    }

    /// The whole drain of a tile, V and MTE3 part of each group in turn (the bias area is
    /// free again after it). With a UB set per group the sets are freed after the last
    /// group, so MTE3 waits for the write latency once.
    fn drain(&self, a: &mut Asm, sh: TileShape, out: Reg, e: Reg) {
        let groups = self.groups(sh).len();
        let each = groups as u64 > self.nbuf;
        for gi in 0..groups {
            self.drain_v(a, sh, gi, out, e);
            self.drain_mte3(a, sh, gi, out, each);
        }
        if !each && !self.fix {
            for u in 0..groups {
                a.set_flag(Pipe::Mte3, Pipe::V, u);
            }
        }
        if self.bias_load() {
            a.set_flag(Pipe::V, Pipe::Mte2, 0);
        }
    }

    /// Draining group `gi` through the FIXPIPE: its valid rows and columns from L0C to the tile
    /// at `out`, converted (an i8 product's accumulators dequantised by `alpha`), with the ReLU.
    fn drain_fix(&self, a: &mut Asm, sh: TileShape, gi: usize, out: Reg) {
        let (g, r) = (self.g, &self.r);
        let (n0, n) = self.groups(sh)[gi];
        let cols = (sh.cols - n0 * 16).min(n * 16);
        let es = g.out_type.bytes();
        a.wait_flag(Pipe::M, Pipe::Fix, gi);
        a.movi(r.t0, (n0 * sh.mb * FRACTAL_C) as i64);
        a.addi(r.t1, out, n0 * 16 * es);
        let quant = if g.in_type == InType::I8 && g.out_type != OutType::I32 {
            a.movi(r.t2, i64::from(g.alpha.to_bits()));
            gearsim_isa::Quant::Deq
        } else {
            gearsim_isa::Quant::None
        };
        a.copy_l0c_to_gm(g.out_type.dtype(), r.t1, r.t0, sh.rows, cols, g.ldc)
            .relu(g.relu)
            .quant(quant)
            .scale(r.t2);
        a.set_flag(Pipe::Fix, Pipe::M, gi);
    }

    /// The V part of draining group `gi`: L0C → UB, the epilogue in f32 (with the addend
    /// block the MTE2 loads first for a full C).
    fn drain_v(&self, a: &mut Asm, sh: TileShape, gi: usize, out: Reg, e: Reg) {
        if self.fix {
            self.drain_fix(a, sh, gi, out);
            return;
        }
        let (g, lay, r) = (self.g, &self.lay, &self.r);
        let (n0, n) = self.groups(sh)[gi];
        let u = gi as u64 % self.nbuf;
        let ui = u as usize;
        let frac = sh.mb * n;
        let count = frac * 256;
        let f32_work = g.f32_work();
        if let Some(Addend::Full { .. }) = g.addend {
            // MTE2: this group's block of the f32 addend, in the same fractal-column layout.
            a.wait_flag(Pipe::V, Pipe::Mte2, u);
            for x in 0..n {
                let nb = n0 + x;
                let valid = (sh.cols - nb * 16).min(16);
                a.movi(r.t0, (lay.cbuf[ui] + x * sh.mb * FRACTAL_C) as i64);
                a.addi(r.t1, e, nb * 16 * 4);
                let len = valid * 4;
                a.copy_gm_to_ub_pad(r.t0, r.t1, sh.rows, len)
                    .src_gap(g.n * 4 - len)
                    .dst_gap(64 - len.div_ceil(units::BLOCK_BYTES) * units::BLOCK_BYTES);
            }
            a.set_flag(Pipe::Mte2, Pipe::V, u);
        }
        if let Some(d) = r.r_delta {
            // MTE2: this group's block of the residual, in the f16 out buffer's layout.
            a.wait_flag(Pipe::V, Pipe::Mte2, RESIDUAL_FLAG + u);
            for x in 0..n {
                let nb = n0 + x;
                let valid = (sh.cols - nb * 16).min(16);
                a.movi(r.t0, (lay.res[ui] + x * sh.mb * FRACTAL) as i64);
                a.add(r.t1, out, d);
                a.addi(r.t1, r.t1, nb * 16 * 2);
                let len = valid * 2;
                a.copy_gm_to_ub_pad(r.t0, r.t1, sh.rows, len)
                    .src_gap(g.ldc * 2 - len)
                    .dst_gap(0);
            }
            a.set_flag(Pipe::Mte2, Pipe::V, RESIDUAL_FLAG + u);
        }
        a.wait_flag(Pipe::M, Pipe::V, gi);
        a.wait_flag(Pipe::Mte3, Pipe::V, u);
        a.movi(r.t0, (n0 * sh.mb * FRACTAL_C) as i64);
        let out_buf = lay.out16[ui];
        let work = lay.work[ui];
        if f32_work {
            a.movi(r.t1, work as i64);
            a.copy_l0c_to_ub(DType::F32, r.t1, r.t0, frac);
        } else {
            a.movi(r.t1, out_buf as i64);
            a.copy_l0c_to_ub(DType::F16, r.t1, r.t0, frac);
        }
        a.set_flag(Pipe::V, Pipe::M, gi);
        if f32_work {
            a.mask_count(r.t2, count);
            if g.in_type == InType::I8 && g.out_type != OutType::I32 {
                a.vconv(DType::F32, DType::I32, r.t1, r.t1);
            }
            if g.factor.is_some() {
                // Each fractal column times its factors (the per-tile area, loaded once).
                if gi == 0 {
                    a.wait_flag(Pipe::Mte2, Pipe::V, 0);
                }
                a.mask_count(r.t2, sh.mb * 256);
                for x in 0..n {
                    a.movi(r.t1, (work + x * sh.mb * FRACTAL_C) as i64);
                    a.movi(r.t0, (lay.bias + (n0 + x) * FRACTAL_C) as i64);
                    a.vmul(DType::F32, r.t1, r.t1, r.t0).src1_rep(0);
                }
                a.movi(r.t1, work as i64);
                a.mask_count(r.t2, count);
            }
            if let Some(alpha) = r.alpha {
                a.vmuls(DType::F32, r.t1, r.t1, alpha);
            }
            match g.addend {
                Some(Addend::Scalar { .. }) => {
                    if let Some(s) = r.scalar {
                        a.vadds(DType::F32, r.t1, r.t1, s);
                    }
                }
                Some(Addend::Full { beta, .. }) => {
                    a.wait_flag(Pipe::Mte2, Pipe::V, u);
                    a.movi(r.t0, lay.cbuf[ui] as i64);
                    if beta != 1.0 {
                        a.movi(r.t2, i64::from(beta.to_bits()));
                        a.vmuls(DType::F32, r.t0, r.t0, r.t2);
                    }
                    a.vadd(DType::F32, r.t1, r.t1, r.t0);
                    a.set_flag(Pipe::V, Pipe::Mte2, u);
                }
                Some(Addend::Cols { .. } | Addend::Rows { .. }) => {
                    if gi == 0 {
                        a.wait_flag(Pipe::Mte2, Pipe::V, 0);
                    }
                    a.mask_count(r.t2, sh.mb * 256);
                    let cols = matches!(g.addend, Some(Addend::Cols { .. }));
                    for x in 0..n {
                        a.movi(r.t1, (work + x * sh.mb * FRACTAL_C) as i64);
                        if cols {
                            a.movi(r.t0, (lay.bias + (n0 + x) * FRACTAL_C) as i64);
                            a.vadd(DType::F32, r.t1, r.t1, r.t0).src1_rep(0);
                        } else {
                            a.movi(r.t0, lay.bias as i64);
                            a.vadd(DType::F32, r.t1, r.t1, r.t0);
                        }
                    }
                    a.movi(r.t1, work as i64);
                    a.mask_count(r.t2, count);
                }
                None => {}
            }
            if g.out_type == OutType::F16 {
                a.movi(r.t0, out_buf as i64);
                a.vconv(DType::F16, DType::F32, r.t0, r.t1);
            }
        }
        if r.r_delta.is_some() {
            a.wait_flag(Pipe::Mte2, Pipe::V, RESIDUAL_FLAG + u);
            a.mask_count(r.t2, count);
            a.movi(r.t0, out_buf as i64);
            a.movi(r.t1, lay.res[ui] as i64);
            a.vadd(DType::F16, r.t0, r.t0, r.t1);
            a.set_flag(Pipe::V, Pipe::Mte2, RESIDUAL_FLAG + u);
        }
        if g.relu {
            a.mask_count(r.t2, count);
            a.movi(r.t0, out_buf as i64);
            a.vrelu(g.out_type.dtype(), r.t0, r.t0);
        }
        a.set_flag(Pipe::V, Pipe::Mte3, u);
    }

    /// The MTE3 part of draining group `gi` to the tile at `out`: fractal column by fractal
    /// column, only the valid rows and columns; `free` sets the UB set's flag at once (else the
    /// caller sets it after the last group).
    fn drain_mte3(&self, a: &mut Asm, sh: TileShape, gi: usize, out: Reg, free: bool) {
        if self.fix {
            // The FIXPIPE wrote the group already.
            return;
        }
        let (g, lay, r) = (self.g, &self.lay, &self.r);
        let (n0, n) = self.groups(sh)[gi];
        let u = gi as u64 % self.nbuf;
        let es = g.out_type.bytes();
        let out_buf = lay.out16[u as usize];
        a.wait_flag(Pipe::V, Pipe::Mte3, u);
        for x in 0..n {
            let nb = n0 + x;
            let valid = (sh.cols - nb * 16).min(16);
            let len = valid * es;
            a.movi(r.t0, (out_buf + x * sh.mb * 256 * es) as i64);
            a.addi(r.t1, out, nb * 16 * es);
            a.copy_ub_to_gm_pad(r.t1, r.t0, sh.rows, len)
                .src_gap(16 * es - len.div_ceil(units::BLOCK_BYTES) * units::BLOCK_BYTES)
                .dst_gap(g.ldc * es - len);
        }
        if free {
            a.set_flag(Pipe::Mte3, Pipe::V, u);
        }
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match (kind.first, kind.last) {
        (true, true) => "the only stage",
        (true, false) => "the first stage",
        (false, true) => "the last stage",
        (false, false) => "a middle stage",
    }
}

/// `dst += value` through `tmp` when it does not fit an immediate.
fn add_const(a: &mut Asm, dst: Reg, value: u64, tmp: Reg) {
    if value == 0 {
        return;
    }
    if let Ok(v) = i32::try_from(value) {
        a.addi(dst, dst, v);
    } else {
        a.movi(tmp, value as i64);
        a.add(dst, dst, tmp);
    }
}

/// `jmp` to the label called `label`.
fn jump(a: &mut Asm, label: &str) {
    let l = a.label(label);
    a.jmp(l);
}

/// `dst = base + index * stride` (stride in bytes, possibly 0).
fn scaled_add(a: &mut Asm, dst: Reg, base: Reg, index: Reg, stride: u64, tmp: Reg) {
    if stride == 0 {
        if dst != base {
            a.mov(dst, base);
        }
        return;
    }
    if let Ok(s) = i32::try_from(stride) {
        a.muli(tmp, index, s);
    } else {
        a.movi(tmp, stride as i64);
        a.mul(tmp, index, tmp);
    }
    a.add(dst, base, tmp);
}
