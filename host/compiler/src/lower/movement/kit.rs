//! What every movement kernel is built from: the split of tasks over blocks, the task loop that
//! rotates buffers, flag chains between the pipes a buffer passes through (`queue.rs`'s
//! [`Chain`]), the decomposition of a task index into addresses, and DMA emission that picks
//! 32-byte bursts or byte-granular copies.
//!
//! A kernel is a list of jobs. A job is a static loop body over a range of task indices (one
//! tile each); different tile shapes (a full tile, the remainder along an axis) are different
//! jobs, so no body branches on its shape. Tasks are numbered across the jobs and each block
//! takes a contiguous range, so a block runs part of one job and then part of the next.
//!
//! ```text
//!   block b: tasks [b*per, min((b+1)*per, total))
//!     job 0 tasks ──┬── buffer 0: MTE2 ─▶ (V) ─▶ MTE3 ─▶ free
//!                   ├── buffer 1: ...
//!                   └── buffer 2: ...      (a chain of set/wait flags per buffer)
//!     job 1 tasks ── ...
//! ```

use gearsim_isa::{SReg, SType, Space, units};

use super::super::dma::{self, Dir};
use super::super::queue;
use super::super::writer::{Asm, Reg};
use super::super::{LowerCtx, LowerError, Lowered, Operand};
use crate::CoreSpec;
use crate::ir::{DataType, Tensor};

/// Bytes in a DMA block (the UB alignment and the unit of burst lengths and gaps).
pub const BLOCK: u64 = units::BLOCK_BYTES;
/// Largest burst count of one DMA instruction (12-bit field).
pub const MAX_BURSTS: u64 = units::BURST_COUNT_MAX;
/// Largest burst length of a burst copy, in 32-byte blocks (16-bit field).
const MAX_BURST_LEN: u64 = units::BURST_LEN_MAX;
/// Largest burst length of a byte-granular copy (21-bit field).
pub const MAX_PAD_LEN: u64 = units::PAD_BURST_LEN_MAX;
/// Largest gap of a byte-granular copy (32-bit fields).
const MAX_PAD_GAP: u64 = units::PAD_GAP_MAX;
/// Largest tile a buffer holds: big enough that a DMA's latency is small beside its transfer,
/// small enough that three buffers and the scratch fit in the unified buffer.
pub const MAX_TILE: u64 = 64 * 1024;
/// Smallest tile worth splitting work into (shorter ones spend more time synchronising).
pub const MIN_TILE: u64 = 4 * 1024;

/// `x` rounded up to whole 32-byte blocks.
pub fn round32(x: u64) -> u64 {
    x.div_ceil(BLOCK) * BLOCK
}

/// `x` rounded up to a multiple of `q`.
pub fn ceil_to(x: u64, q: u64) -> u64 {
    x.div_ceil(q) * q
}

/// `x` rounded down to a multiple of `q`.
pub fn floor_to(x: u64, q: u64) -> u64 {
    x / q * q
}

/// Buffers a kernel rotates through: three hide a DMA's latency behind the two other tiles'
/// transfers; the chip's event ids per pipe pair bound it.
pub fn buffers(core: &CoreSpec) -> usize {
    usize::from(core.event_ids).clamp(1, 3)
}

/// Blocks available to one launch.
pub fn cores(core: &CoreSpec) -> u64 {
    core.vector_blocks()
}

/// The tile size for `total` bytes of work: about four tiles per core when there is enough
/// work, never below [`MIN_TILE`] or above `max`.
pub fn tile_bytes(total: u64, core: &CoreSpec, max: u64) -> u64 {
    let want = total / (cores(core) * 4);
    floor_to(want.max(MIN_TILE).min(max), BLOCK).max(BLOCK)
}

/// A pipe of the flag instructions (the kernels here use S, V, MTE2 and MTE3).
pub use gearsim_isa::Pipe;

/// The flag chain a buffer passes round (it lives with the other handshakes).
pub use super::super::queue::Chain;

/// One digit of a task index: its radix and what one step of it adds to each address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digit {
    /// Radix.
    pub n: u64,
    /// Bytes added to each accumulator per step.
    pub strides: Vec<i64>,
}

/// Scratch registers a kernel reserves for address arithmetic and small loops.
#[derive(Debug, Clone, Copy)]
pub struct Scratch {
    /// Registers no value lives in across the helpers that use them.
    pub r: [Reg; 4],
}

impl Scratch {
    /// Reserves them.
    pub fn new(a: &mut Asm) -> Scratch {
        Scratch {
            r: [a.reg(), a.reg(), a.reg(), a.reg()],
        }
    }
}

/// `dst = src * imm` (`dst` must differ from `src` when `imm` does not fit 32 bits).
pub fn mul_imm(a: &mut Asm, dst: Reg, src: Reg, imm: i64) {
    if imm == 1 {
        if dst != src {
            a.mov(dst, src);
        }
    } else if i32::try_from(imm).is_ok() {
        a.muli(dst, src, imm);
    } else {
        a.movi(dst, imm);
        a.mul(dst, src, dst);
    }
}

/// `dst += imm`, through `tmp` when `imm` does not fit 32 bits.
pub fn add_imm(a: &mut Asm, dst: Reg, imm: i64, tmp: Reg) {
    if imm == 0 {
        return;
    }
    if i32::try_from(imm).is_ok() {
        a.addi(dst, dst, imm);
    } else {
        a.movi(tmp, imm);
        a.add(dst, dst, tmp);
    }
}

/// `dst = src + imm` (`dst` may equal `src`), through `tmp` for wide values.
pub fn set_add(a: &mut Asm, dst: Reg, src: Reg, imm: i64, tmp: Reg) {
    if dst != src {
        a.mov(dst, src);
    }
    add_imm(a, dst, imm, tmp);
}

/// Adds to each accumulator the offsets of task `t`'s digits, the last digit varying fastest
/// (accumulator `i` takes stride `i` of each digit; `None` skips it). Uses the first three
/// scratch registers; `t` is left unchanged.
pub fn decompose(a: &mut Asm, t: Reg, digits: &[Digit], accs: &[Option<Reg>], s: &Scratch) {
    let [q, nq, d, _] = s.r;
    let relevant = |g: &Digit| {
        g.n > 1
            && accs
                .iter()
                .zip(&g.strides)
                .any(|(r, st)| r.is_some() && *st != 0)
    };
    let Some(last) = digits.iter().rposition(relevant) else {
        return;
    };
    a.mov(q, t);
    // Digits inside the innermost one that matters only divide the index.
    let inner: u64 = digits[last + 1..].iter().map(|g| g.n).product();
    if inner > 1 {
        a.movi(d, inner as i64);
        a.divu(q, q, d);
    }
    let used: Vec<&Digit> = digits[..=last].iter().filter(|g| g.n > 1).collect();
    for (pos, g) in used.iter().enumerate().rev() {
        let digit = if pos == 0 {
            // The outermost digit is what is left (t is below the task count).
            q
        } else {
            a.movi(d, g.n as i64);
            a.divu(nq, q, d);
            a.mul(d, nq, d);
            a.sub(d, q, d);
            a.mov(q, nq);
            d
        };
        for (acc, stride) in accs.iter().zip(&g.strides) {
            if let Some(acc) = acc
                && *stride != 0
            {
                mul_imm(a, nq, digit, *stride);
                a.add(*acc, *acc, nq);
            }
        }
    }
}

/// The shape of one DMA: `n` bursts of `len` bytes, `gm_stride` bytes apart in GM and
/// `ub_pitch` bytes apart in UB (a multiple of 32 at least `len` rounded up to 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xfer {
    /// Bursts.
    pub n: u64,
    /// Bytes per burst.
    pub len: u64,
    /// GM distance between burst starts.
    pub gm_stride: u64,
    /// UB distance between burst starts.
    pub ub_pitch: u64,
}

impl Xfer {
    /// A single contiguous burst.
    pub fn contiguous(len: u64) -> Xfer {
        Xfer {
            n: 1,
            len,
            gm_stride: len,
            ub_pitch: round32(len),
        }
    }
}

/// Whether [`dma`] can emit `x` as one instruction.
pub fn fits(x: &Xfer) -> bool {
    x.n <= MAX_BURSTS
        && (x.len <= MAX_PAD_LEN
            || (x.len.is_multiple_of(BLOCK) && x.len / BLOCK <= MAX_BURST_LEN && x.n == 1))
        && (x.n <= 1
            || (x.gm_stride >= x.len
                && x.gm_stride - x.len <= MAX_PAD_GAP
                && x.ub_pitch >= round32(x.len)
                && x.ub_pitch - round32(x.len) <= MAX_PAD_GAP))
}

/// One DMA between GM and UB: `to_ub` copies GM → UB (MTE2), otherwise UB → GM (MTE3).
/// Burst copies (32-byte units) when every length and gap allows, byte-granular otherwise.
pub fn dma(a: &mut Asm, to_ub: bool, ub: Reg, gm: Reg, x: &Xfer) {
    if x.n == 0 || x.len == 0 {
        return;
    }
    let mut x = *x;
    // Bursts that abut on both sides are one burst.
    if x.n > 1 && x.gm_stride == x.len && x.ub_pitch == x.len && x.len.is_multiple_of(BLOCK) {
        let total = x.n * x.len;
        if total / BLOCK <= MAX_BURST_LEN {
            x = Xfer::contiguous(total);
        }
    }
    let (gm_gap, ub_gap) = if x.n > 1 {
        (x.gm_stride - x.len, x.ub_pitch - round32(x.len))
    } else {
        (0, 0)
    };
    let dir = if to_ub { Dir::GmToUb } else { Dir::UbToGm };
    dma::rows(a, dir, ub, gm, x.n, x.len, gm_gap, ub_gap);
}

/// How the tasks of a kernel are spread over blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Blocks launched.
    pub blocks: u32,
    /// Tasks per block (the last block may get fewer).
    pub per: u64,
    /// Tasks in all.
    pub total: u64,
}

impl Split {
    /// `total` tasks over at most every core.
    pub fn new(total: u64, core: &CoreSpec) -> Split {
        let blocks = total.clamp(1, cores(core));
        let per = total.div_ceil(blocks).max(1);
        Split {
            blocks: total.div_ceil(per).max(1) as u32,
            per,
            total,
        }
    }
}

/// The registers of the task loop.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    /// The argument array.
    pub args: Reg,
    /// This block's first task.
    lo: Reg,
    /// One past this block's last task.
    hi: Reg,
    /// The current task, local to its job.
    t: Reg,
    /// One past the job's last task this block runs, local to the job.
    end: Reg,
    /// Scratch for starting a job.
    tmp: Reg,
}

impl Frame {
    /// Reads the argument array and computes this block's task range.
    pub fn new(a: &mut Asm, split: Split) -> Frame {
        let args = a.reg();
        let lo = a.reg();
        let hi = a.reg();
        let t = a.reg();
        let end = a.reg();
        let tmp = a.reg();
        a.tiling("tasks", split.total as i64);
        a.tiling("block_dim", i64::from(split.blocks));
        a.tiling("tasks_per_block", split.per as i64);
        a.sreg(args, SReg::Args);
        a.sreg(lo, SReg::BlockIdx);
        a.movi(t, split.per as i64);
        a.mul(lo, lo, t);
        a.add(t, lo, t);
        a.movi(hi, split.total as i64);
        a.minu(hi, hi, t);
        Frame {
            args,
            lo,
            hi,
            t,
            end,
            tmp,
        }
    }

    /// Loads argument `index` into `dst`.
    pub fn arg(&self, a: &mut Asm, dst: Reg, index: usize) {
        a.ld(Space::Gm, SType::U64, dst, self.args).off(index * 8);
    }
}

/// A job: how many tasks, what runs once before its loop, and the two halves of one task on
/// buffer `k` (given the task register, local to the job): `load` issues its loads, `rest`
/// everything after them.
pub struct Job<'a> {
    /// Tasks.
    pub tasks: u64,
    /// Emitted once before the job's loop (e.g. loads its base addresses).
    pub setup: Box<dyn Fn(&mut Asm) + 'a>,
    /// A task's loads on buffer `k`.
    pub load: TaskEmit<'a>,
    /// The rest of a task on buffer `k`.
    pub rest: TaskEmit<'a>,
}

/// Emits part of one task on buffer `k`, given the task-index register.
pub type TaskEmit<'a> = Box<dyn Fn(&mut Asm, usize, Reg) + 'a>;

/// Emits every job's loop over this block's share of its tasks, rotating `nbuf` buffers.
///
/// Each task's loads are issued before the previous task's vector work and stores: the
/// scalar unit stalls once a pipe's queue is full, so issuing loads late would leave MTE2 idle
/// while the vector unit drains, and the next tile would wait for its DMA latency.
pub fn run_jobs(a: &mut Asm, f: &Frame, nbuf: usize, jobs: &[Job<'_>]) {
    let mut offset = 0u64;
    for (ji, job) in jobs.iter().enumerate() {
        if job.tasks == 0 {
            continue;
        }
        let skip = a.new_label(&format!("job{ji}_done"));
        let top = a.new_label(&format!("job{ji}_loop"));
        a.comment(format_args!(
            "job {ji}: tasks [{offset}, {}) of the kernel",
            offset + job.tasks
        ));
        // t = max(lo, offset) - offset; end = min(hi, offset + tasks) - offset.
        a.movi(f.t, offset as i64);
        a.maxu(f.t, f.lo, f.t);
        a.movi(f.end, (offset + job.tasks) as i64);
        a.minu(f.end, f.hi, f.end);
        let skip_l = a.label(&skip);
        a.bgeu(f.t, f.end, skip_l);
        if offset > 0 {
            a.movi(f.tmp, offset as i64);
            a.sub(f.t, f.t, f.tmp);
            a.sub(f.end, f.end, f.tmp);
        }
        (job.setup)(a);
        a.comment("the first task's loads");
        (job.load)(a, 0, f.t);
        a.place(&top);
        for k in 0..nbuf {
            let no_next = a.new_label("no_next");
            a.comment(format_args!(
                "task on buffer {k}: the next task's loads first"
            ));
            a.addi(f.tmp, f.t, 1);
            let no_next_l = a.label(&no_next);
            a.bgeu(f.tmp, f.end, no_next_l);
            (job.load)(a, (k + 1) % nbuf, f.tmp);
            a.place(&no_next);
            (job.rest)(a, k, f.t);
            a.addi(f.t, f.t, 1);
            a.bgeu(f.t, f.end, skip_l);
        }
        let top_l = a.label(&top);
        a.jmp(top_l);
        a.place(&skip);
        offset += job.tasks;
    }
}

/// The normal-mode vector mask with lane `lane` of each of the 8 blocks of a repeat of 32-bit
/// elements enabled (bits `lane + 8 j`).
pub fn lane_mask(lane: u64) -> i64 {
    (0x0101_0101_0101_0101u64 << lane) as i64
}

/// The normal-mode mask of the first `n` (≤ 64) 32-bit elements of a repeat.
pub fn first_mask(n: u64) -> i64 {
    if n >= 64 {
        -1
    } else {
        ((1u64 << n) - 1) as i64
    }
}

/// `set_mask zero, lo` with `lo` loaded into `reg`.
pub fn set_mask(a: &mut Asm, zero: Reg, reg: Reg, lo: i64) {
    a.movi(reg, lo);
    a.set_mask(zero, reg);
}

/// The start of a gather kernel: its constant bit patterns (`bytes` from argument 2) into UB
/// at `at` behind a barrier, every element of a repeat enabled, the chain's buffers free.
pub fn gather_prologue(
    a: &mut Asm,
    f: &Frame,
    chain: &Chain,
    ub: Reg,
    tmp: Reg,
    at: u64,
    bytes: u64,
) {
    a.comment("the bit patterns, once; every element of a repeat enabled");
    f.arg(a, tmp, 2);
    a.movi(ub, at as i64);
    a.copy_gm_to_ub(ub, tmp, 1, bytes / BLOCK);
    queue::barrier(a, Pipe::Mte2, Pipe::V, 0);
    a.movi(tmp, -1);
    a.set_mask(tmp, tmp);
    chain.prologue(a);
}

/// The end of a gather kernel: `job`'s loop, the chain drained, and the kernel over (input 0,
/// output 0, the patterns) with the patterns as its derived constant.
pub fn gather_kernel(
    ctx: &LowerCtx<'_>,
    mut a: Asm,
    f: &Frame,
    chain: &Chain,
    job: Job<'_>,
    blocks: u32,
    patterns: Vec<u8>,
) -> Result<Lowered, LowerError> {
    run_jobs(&mut a, f, chain.nbuf, &[job]);
    chain.epilogue(&mut a);
    let kernel = ctx.kernel(
        a,
        blocks,
        vec![Operand::Input(0), Operand::Output(0), Operand::Derived(0)],
    )?;
    Ok(Lowered::Kernels {
        kernels: vec![kernel],
        derived: vec![Tensor {
            dtype: DataType::U8,
            dims: vec![patterns.len() as i64],
            data: std::sync::Arc::new(patterns),
        }],
        workspace_bytes: 0,
    })
}

/// Stage 0 of `chain` on buffer `k`: `rows` runs of `bytes` from GM at `src`, `gap` bytes
/// apart, into UB at `at`, each padded to 32 bytes (`ub` clobbered).
#[allow(clippy::too_many_arguments)]
pub fn load_padded_rows(
    a: &mut Asm,
    chain: &Chain,
    k: usize,
    ub: Reg,
    at: u64,
    src: Reg,
    rows: u64,
    (bytes, gap): (u64, u64),
) {
    chain.begin(a, 0, k);
    a.movi(ub, at as i64);
    a.copy_gm_to_ub_pad(ub, src, rows, bytes)
        .src_gap(gap)
        .dst_gap(0);
    chain.end(a, 0, k);
}

/// The start of a kernel of row tasks, each passing MTE2 -> V -> MTE3 on one of `nbuf`
/// buffers: its writer (rows per task and row pitch recorded as tiling), the task frame of
/// `split`, the chain.
pub fn row_kernel(
    ctx: &LowerCtx<'_>,
    split: Split,
    nbuf: usize,
    rows: u64,
    pitch: u64,
) -> (Asm, Frame, Chain) {
    let chain = Chain {
        stages: &[
            gearsim_isa::Pipe::Mte2,
            gearsim_isa::Pipe::V,
            gearsim_isa::Pipe::Mte3,
        ],
        nbuf,
    };
    let mut a = Asm::new(&super::super::kernel_name(ctx, ""));
    a.tiling("rows_per_task", rows as i64);
    a.tiling("row_pitch", pitch as i64);
    let f = Frame::new(&mut a, split);
    (a, f, chain)
}
