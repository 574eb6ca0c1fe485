//! One AI core: a scalar unit that fetches in order and dispatches to per-pipe in-order queues,
//! the pipes that execute them, the flags between pipes, and the local buffers.
//!
//! Time inside a core is kept per unit in core cycles. The scalar unit and each pipe run ahead
//! of global time as far as their own inputs allow, computing start and end cycles from
//! per-pipe timestamps: an instruction starts at `max(dispatch cycle, pipe free cycle)`,
//! `wait_flag` starts no earlier than the matching `set_flag`, `set_flag` and barriers wait for
//! the pipe's outstanding completions. Only a DMA through the shared memory system stops that
//! run-ahead: it becomes an event at its start tick so that the memory system sees transfers in
//! global time order, and its completion is an event too. A program that synchronises with
//! flags therefore sees the same values and the same timeline however far a unit ran ahead.

pub(crate) mod buffers;

use std::collections::VecDeque;
use std::sync::Arc;

use gearsim_isa::{DType, FMatrix, Flag, Instruction, Pipe, SReg, SType, Space};
use gearsim_traces::{
    BUSY_THREAD, KERNELS_THREAD, Lane, LaneId, LaneKind, Record, StrId, TraceSink,
    busy_counter_name,
};

use crate::config::ChipConfig;
use crate::cross::{Arrival, CrossCore, CrossError, CrossGroup, Member};
use crate::event::{Event, EventQueue, PRIO_CORE};
use crate::exec::scalar::{self, Step};
use crate::exec::{self, Access, Fault, Mask, Operands, PipeOp, Plan};
use crate::kernel::{ExecMode, Kernel};
use crate::kind::{CoreKind, CoreSlot};
use crate::memory::DeviceMemory;
use crate::stop::{Blocked, Buffer, FlagId, StopReason};
use crate::time::{Clock, Tick};
use crate::values::Values;
use buffers::Unknown;

/// Number of pipes with a trace lane (S plus the six queued pipes).
pub const LANES: usize = 7;
const QUEUES: usize = 6;

/// Lane index of a pipe (its position in [`Pipe::EXECUTING`]).
pub(crate) fn lane_index(p: Pipe) -> usize {
    match p {
        Pipe::S | Pipe::All => 0,
        Pipe::V => 1,
        Pipe::M => 2,
        Pipe::Mte1 => 3,
        Pipe::Mte2 => 4,
        Pipe::Mte3 => 5,
        Pipe::Fix => 6,
    }
}

fn queue_pipe(qi: usize) -> Pipe {
    Pipe::QUEUED[qi]
}

/// Whether the DMAs of pipe queue `qi` write GM (the rest read it).
pub(crate) fn queue_writes(qi: usize) -> bool {
    matches!(queue_pipe(qi), Pipe::Mte3 | Pipe::Fix)
}

/// A DMA joining the shared memory system.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DmaRequest {
    /// Bytes that cross the memory system.
    pub bytes: u64,
    /// The pipe's rate cap, bytes per second.
    pub cap: u64,
    pub write: bool,
    /// The GM side of the copy (its lines are what the L2 looks up).
    pub gm: Access,
}

fn flag_slot(f: FlagId) -> u16 {
    ((lane_index(f.src) * LANES + lane_index(f.dst)) * 16 + usize::from(f.id)) as u16
}

/// Flag slots: (src lane, dst lane, id) with ids below 16 (`core.event_ids` is at most 16).
const FLAG_SLOTS: usize = LANES * LANES * 16;

/// The flags a block has used: a kernel touches a handful, so their states are a short list in
/// first-use order, found through a small direct index by slot (one load instead of a search).
#[derive(Debug)]
struct FlagTable {
    /// Per slot, 1 + the position of its entry (0: not used yet).
    index: [u16; FLAG_SLOTS],
    /// (slot, cycle it was set if it is set, cycle it was last consumed).
    entries: Vec<(u16, Option<u64>, u64)>,
}

impl Default for FlagTable {
    fn default() -> FlagTable {
        FlagTable {
            index: [0; FLAG_SLOTS],
            entries: Vec::new(),
        }
    }
}

impl FlagTable {
    #[inline]
    fn entry(&mut self, f: FlagId) -> &mut (u16, Option<u64>, u64) {
        let slot = flag_slot(f);
        let at = &mut self.index[usize::from(slot)];
        if *at == 0 {
            self.entries.push((slot, None, 0));
            // At most FLAG_SLOTS entries, so the position fits.
            *at = self.entries.len() as u16;
        }
        &mut self.entries[usize::from(*at) - 1]
    }

    /// Forgets every flag (for the next block), keeping the allocation.
    fn clear(&mut self) {
        for &(slot, _, _) in &self.entries {
            self.index[usize::from(slot)] = 0;
        }
        self.entries.clear();
    }

    fn is_set(&mut self, f: FlagId) -> bool {
        self.entry(f).1.is_some()
    }

    fn set(&mut self, f: FlagId, at: u64) {
        self.entry(f).1 = Some(at);
    }

    fn take(&mut self, f: FlagId) -> Option<u64> {
        self.entry(f).1.take()
    }

    fn consumed(&mut self, f: FlagId) -> u64 {
        self.entry(f).2
    }

    fn set_consumed(&mut self, f: FlagId, at: u64) {
        self.entry(f).2 = at;
    }
}

fn flag_of(f: &Flag) -> FlagId {
    FlagId {
        src: f.src,
        dst: f.dst,
        id: f.id,
    }
}

/// Busy time and instruction count of one pipe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipeStats {
    /// Cycles the pipe was issuing instructions (a DMA counts while its data moves).
    pub busy_cycles: u64,
    /// Instructions executed.
    pub instructions: u64,
}

/// Accumulated statistics of one core, indexed like [`Pipe::EXECUTING`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Per pipe.
    pub pipes: [PipeStats; LANES],
    /// Cube multiply-accumulates performed (fractal products x 4096, x 8192 for i8 ones).
    pub cube_macs: u64,
}

impl CoreStats {
    /// The statistics of `pipe`.
    pub fn pipe(&self, pipe: Pipe) -> PipeStats {
        self.pipes[lane_index(pipe)]
    }
}

/// Trace state the chip shares with its cores.
pub(crate) struct Tracer<S: TraceSink> {
    pub sink: S,
    pub on: bool,
    pub clock: Clock,
    /// Per kernel id, per pc: (name, detail) strings, interned on the kernel's first traced run.
    pub strings: Vec<Option<Vec<(StrId, StrId)>>>,
    pub next_flow: u32,
    pub set_name: StrId,
    /// The name of cross-core flag flows, interned at the first one (so traces without any
    /// are unchanged).
    pub cross_name: Option<StrId>,
    /// Kernel level: one span per block on each core's kernel lane, and its pipes' busy shares.
    pub kernels: bool,
    /// Whether the memory counters are recorded (at every level of an enabled sink).
    pub memory: bool,
    /// Per kernel id, its name (interned at kernel level only).
    pub kernel_names: Vec<StrId>,
}

impl<S: TraceSink> Tracer<S> {
    fn span(&mut self, lane: LaneId, names: (StrId, StrId), start: u64, end: u64, pc: u32) {
        let (s, e) = (
            self.clock.tick(crate::time::Cycles(start)),
            self.clock.tick(crate::time::Cycles(end)),
        );
        self.sink.record(Record::Span {
            lane,
            name: names.0,
            start: s.0,
            end: e.0,
            pc,
            detail: names.1,
        });
    }
}

/// What a core's units need from the chip while they run.
pub(crate) struct Ctx<'a, S: TraceSink> {
    pub cfg: &'a ChipConfig,
    pub clock: Clock,
    pub now: Tick,
    pub mem: &'a mut DeviceMemory,
    pub values: &'a mut Values,
    pub events: &'a mut EventQueue,
    pub trace: &'a mut Tracer<S>,
    pub cross: &'a mut CrossCore,
}

#[derive(Debug, Clone, Copy)]
struct Queued {
    instr: Instruction,
    pc: u32,
    at: u64,
    ops: Operands,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PipeState {
    Ready,
    /// Blocked in `wait_flag` since the given cycle.
    WaitFlag(FlagId, u64),
    /// Blocked in `set_flag` (to happen at the given cycle) until the flag is consumed.
    WaitFlagFree(FlagId, u64),
    /// Blocked in `cross_wait` for the flag id since the given cycle.
    CrossWait(u8, u64),
    /// A DMA waits for its start event.
    DmaScheduled(u64),
    /// A DMA is moving data since the given cycle.
    DmaActive(u64),
}

#[derive(Debug)]
struct PipeUnit {
    queue: VecDeque<Queued>,
    issue_free: u64,
    last_complete: u64,
    state: PipeState,
    /// Cycle of the first pop since the scalar unit blocked on this queue being full.
    pop_mark: Option<u64>,
    /// The plan of the DMA at the head of the queue while it is scheduled or active.
    dma: Plan,
}

impl PipeUnit {
    fn new(depth: usize, start_cycle: u64) -> PipeUnit {
        PipeUnit {
            queue: VecDeque::with_capacity(depth),
            issue_free: start_cycle,
            last_complete: start_cycle,
            state: PipeState::Ready,
            pop_mark: None,
            dma: Plan::default(),
        }
    }

    /// The state of `PipeUnit::new`, keeping the queue's allocation.
    fn reset(&mut self, start_cycle: u64) {
        self.queue.clear();
        self.issue_free = start_cycle;
        self.last_complete = start_cycle;
        self.state = PipeState::Ready;
        self.pop_mark = None;
        self.dma = Plan::default();
    }

    fn drained(&self) -> bool {
        self.queue.is_empty() && self.state == PipeState::Ready
    }

    fn pop(&mut self, at: u64) {
        self.queue.pop_front();
        if self.pop_mark.is_none() {
            self.pop_mark = Some(at);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScalarState {
    Run,
    WaitFlag(FlagId, u64),
    WaitFlagFree(FlagId, u64),
    CrossWait(u8, u64),
    QueueFull(usize),
    BarrierAll,
    Ending,
    Done,
}

/// A block running on a core.
pub(crate) struct Block {
    kernel: Arc<Kernel>,
    kernel_id: usize,
    block_idx: u32,
    block_dim: u32,
    sub_block: u8,
    group: CrossGroup,
    args: u64,
    mode: ExecMode,
    regs: [u64; 32],
    pc: u32,
    s_time: u64,
    s_state: ScalarState,
    mask: Mask,
    fmatrix: FMatrix,
    pipes: [PipeUnit; QUEUES],
    flags: FlagTable,
    deadline: u64,
    /// Units (bit 0 the scalar unit, bit 1 + q pipe queue q) that may be able to proceed.
    wake: u8,
    /// The cycle it started and its core's statistics then (for its kernel-level span).
    started: u64,
    stats_before: CoreStats,
}

pub(crate) struct AiCore {
    pub id: u32,
    /// Its kind and place on the chip.
    pub slot: CoreSlot,
    /// Which bytes of its buffers hold uncomputed values (their values are in `Ctx::values`).
    pub unknown: Unknown,
    block: Option<Box<Block>>,
    /// The last finished block, kept so the next one reuses its allocations (its queues and
    /// flag table); every field is reset by `start`.
    spare: Option<Box<Block>>,
    lanes: Option<[LaneId; LANES]>,
    /// Kernel level: its kernel lane, busy-counter lane and the counters' names.
    kernel_lanes: Option<KernelLanes>,
    pub stats: CoreStats,
}

/// A core's lanes in a kernel-level trace.
struct KernelLanes {
    kernels: LaneId,
    busy: LaneId,
    /// The pipes the core has (lane indices) and their busy counters' names.
    pipes: Vec<(usize, StrId)>,
}

/// A block launch request.
#[derive(Debug, Clone)]
pub struct BlockLaunch {
    /// Kernel id returned by `Chip::load_kernel`.
    pub kernel: usize,
    /// This block's index.
    pub block_idx: u32,
    /// The kernel's block_dim as this block sees it (its kind's block count).
    pub block_dim: u32,
    /// Which of its AI core's vector cores runs this block of a MIX kernel (0 otherwise).
    pub sub_block: u8,
    /// The launch it belongs to, for cross-core flags.
    pub group: CrossGroup,
    /// GM address of the argument array.
    pub args: u64,
    /// Full or timing-only.
    pub mode: ExecMode,
}

impl BlockLaunch {
    /// The only block of a kernel launched alone (block 0 of 1, no cross-core partners).
    pub fn single(kernel: usize, args: u64, mode: ExecMode) -> BlockLaunch {
        BlockLaunch {
            kernel,
            block_idx: 0,
            block_dim: 1,
            sub_block: 0,
            group: CrossGroup::solo(0, CoreKind::Coupled, 1),
            args,
            mode,
        }
    }
}

type Res<T> = Result<T, StopReason>;

impl AiCore {
    pub(crate) fn new(id: u32, slot: CoreSlot, cfg: &ChipConfig) -> AiCore {
        AiCore {
            id,
            slot,
            unknown: Unknown::new(cfg, slot.kind),
            block: None,
            spare: None,
            lanes: None,
            kernel_lanes: None,
            stats: CoreStats::default(),
        }
    }

    pub(crate) fn is_busy(&self) -> bool {
        self.block.is_some()
    }

    pub(crate) fn start<S: TraceSink>(
        &mut self,
        launch: &BlockLaunch,
        kernel: Arc<Kernel>,
        start_cycle: u64,
        ctx: &mut Ctx<'_, S>,
    ) {
        if ctx.trace.on && self.lanes.is_none() {
            // A separated chip's cores get lanes for the pipes they have; the others share the
            // scalar lane, which nothing records on (an instruction of a missing pipe faults).
            let process = self.slot.to_string();
            let kind = self.slot.kind;
            let scalar = ctx.trace.sink.lane(Lane {
                process: process.clone(),
                thread: Pipe::S.lane_name().to_string(),
                kind: LaneKind::Pipe,
            });
            self.lanes = Some(Pipe::EXECUTING.map(|p| match p {
                Pipe::S => scalar,
                p if kind.has_pipe(p) => ctx.trace.sink.lane(Lane {
                    process: process.clone(),
                    thread: p.lane_name().to_string(),
                    kind: LaneKind::Pipe,
                }),
                _ => scalar,
            }));
        }
        if ctx.trace.kernels && self.kernel_lanes.is_none() {
            let process = self.slot.to_string();
            let kind = self.slot.kind;
            let sink = &mut ctx.trace.sink;
            let mut lane = |thread: &str, kind| {
                sink.lane(Lane {
                    process: process.clone(),
                    thread: thread.into(),
                    kind,
                })
            };
            let kernels = lane(KERNELS_THREAD, LaneKind::Kernel);
            let busy = lane(BUSY_THREAD, LaneKind::Counter);
            let pipes = Pipe::EXECUTING
                .iter()
                .filter(|&&p| p == Pipe::S || kind.has_pipe(p))
                .map(|&p| {
                    (
                        lane_index(p),
                        sink.intern(&busy_counter_name(p.lane_name())),
                    )
                })
                .collect();
            self.kernel_lanes = Some(KernelLanes {
                kernels,
                busy,
                pipes,
            });
        }
        let depth = ctx.cfg.core.pipe_queue_depth as usize;
        let fmatrix = FMatrix::RESET;
        let deadline = start_cycle.saturating_add(ctx.cfg.core.kernel_timeout_cycles);
        let Some(mut b) = self.spare.take() else {
            self.block = Some(Box::new(Block {
                kernel,
                kernel_id: launch.kernel,
                block_idx: launch.block_idx,
                block_dim: launch.block_dim,
                sub_block: launch.sub_block,
                group: launch.group,
                args: launch.args,
                mode: launch.mode,
                regs: [0; 32],
                pc: 0,
                s_time: start_cycle,
                s_state: ScalarState::Run,
                mask: Mask::FULL,
                fmatrix,
                pipes: std::array::from_fn(|_| PipeUnit::new(depth, start_cycle)),
                flags: FlagTable::default(),
                deadline,
                wake: u8::MAX >> 1,
                started: start_cycle,
                stats_before: self.stats,
            }));
            return;
        };
        // The same state as a new block, in the old one's allocations.
        b.kernel = kernel;
        b.kernel_id = launch.kernel;
        b.block_idx = launch.block_idx;
        b.block_dim = launch.block_dim;
        b.sub_block = launch.sub_block;
        b.group = launch.group;
        b.args = launch.args;
        b.mode = launch.mode;
        b.regs = [0; 32];
        b.pc = 0;
        b.s_time = start_cycle;
        b.s_state = ScalarState::Run;
        b.mask = Mask::FULL;
        b.fmatrix = fmatrix;
        for p in &mut b.pipes {
            p.reset(start_cycle);
        }
        b.flags.clear();
        b.deadline = deadline;
        b.wake = u8::MAX >> 1;
        b.started = start_cycle;
        b.stats_before = self.stats;
        self.block = Some(b);
    }

    /// Runs every unit as far as it can; returns the end cycle if the block finished.
    pub(crate) fn advance<S: TraceSink>(&mut self, ctx: &mut Ctx<'_, S>) -> Res<Option<u64>> {
        while let Some(b) = self.block.as_mut() {
            if b.wake == 0 {
                break;
            }
            let unit = b.wake.trailing_zeros() as usize;
            b.wake &= !(1 << unit);
            if unit == 0 {
                self.run_scalar(ctx)?;
            } else {
                let before = b.pipes[unit - 1].queue.len();
                self.run_pipe(unit - 1, ctx)?;
                if let Some(b) = self.block.as_mut()
                    && b.pipes[unit - 1].queue.len() != before
                {
                    b.wake |= 1;
                }
            }
        }
        let done = match &self.block {
            Some(b) if b.s_state == ScalarState::Done => Some(b.s_time),
            _ => None,
        };
        if let Some(end) = done {
            self.record_kernel(ctx, end);
            self.spare = self.block.take();
        }
        Ok(done)
    }

    /// Kernel level: the finished block's span on the core's kernel lane (named after its
    /// kernel, its block index as the pc) and each pipe's busy share of it, as counters set at
    /// its start and cleared at its end.
    fn record_kernel<S: TraceSink>(&self, ctx: &mut Ctx<'_, S>, end: u64) {
        let (Some(lanes), Some(b)) = (&self.kernel_lanes, &self.block) else {
            return;
        };
        let name = ctx.trace.kernel_names[b.kernel_id];
        ctx.trace.span(
            lanes.kernels,
            (name, StrId::EMPTY),
            b.started,
            end,
            b.block_idx,
        );
        let (start_ps, end_ps) = (
            ctx.clock.tick(crate::time::Cycles(b.started)).0,
            ctx.clock.tick(crate::time::Cycles(end)).0,
        );
        let len = end.saturating_sub(b.started).max(1);
        for (at, cleared) in [(start_ps, false), (end_ps, true)] {
            for &(pipe, name) in &lanes.pipes {
                let busy =
                    self.stats.pipes[pipe].busy_cycles - b.stats_before.pipes[pipe].busy_cycles;
                ctx.trace.sink.record(Record::Counter {
                    lane: lanes.busy,
                    name,
                    at,
                    value: if cleared {
                        0
                    } else {
                        (busy * 100 / len) as i64
                    },
                });
            }
        }
    }

    /// Every unit that waits and why (for deadlock reports); `cross_peers` says, for a core
    /// waiting for a cross-core flag, which cores could set it.
    pub(crate) fn blocked_units(&self, cross_peers: &dyn Fn(u32) -> String) -> Vec<Blocked> {
        let Some(b) = &self.block else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let what = |f: FlagId| format!("flag {f}");
        match b.s_state {
            ScalarState::WaitFlag(f, _) => out.push(Blocked {
                core: self.id,
                pipe: Pipe::S,
                pc: b.pc,
                waits_for: what(f),
            }),
            ScalarState::WaitFlagFree(f, _) => out.push(Blocked {
                core: self.id,
                pipe: Pipe::S,
                pc: b.pc,
                waits_for: format!("flag {f} to be consumed"),
            }),
            ScalarState::CrossWait(id, _) => out.push(Blocked {
                core: self.id,
                pipe: Pipe::S,
                pc: b.pc,
                waits_for: format!("cross-core flag {id}{}", cross_peers(self.id)),
            }),
            ScalarState::QueueFull(q) => out.push(Blocked {
                core: self.id,
                pipe: Pipe::S,
                pc: b.pc,
                waits_for: format!("room in the {} queue", queue_pipe(q)),
            }),
            ScalarState::BarrierAll | ScalarState::Ending => out.push(Blocked {
                core: self.id,
                pipe: Pipe::S,
                pc: b.pc,
                waits_for: "every pipe to drain".into(),
            }),
            ScalarState::Run | ScalarState::Done => {}
        }
        for (qi, p) in b.pipes.iter().enumerate() {
            let pc = p.queue.front().map_or(b.pc, |q| q.pc);
            let waits_for = match p.state {
                PipeState::WaitFlag(f, _) => what(f),
                PipeState::WaitFlagFree(f, _) => format!("flag {f} to be consumed"),
                PipeState::CrossWait(id, _) => {
                    format!("cross-core flag {id}{}", cross_peers(self.id))
                }
                PipeState::Ready | PipeState::DmaScheduled(_) | PipeState::DmaActive(_) => continue,
            };
            out.push(Blocked {
                core: self.id,
                pipe: queue_pipe(qi),
                pc,
                waits_for,
            });
        }
        out
    }

    /// Records a pipe span when tracing (the check inlines; the recording does not).
    #[inline(always)]
    fn span<S: TraceSink>(&self, ctx: &mut Ctx<'_, S>, pipe: Pipe, pc: u32, start: u64, end: u64) {
        if self.lanes.is_some() {
            self.record_span(ctx, pipe, pc, start, end);
        }
    }

    #[inline(never)]
    fn record_span<S: TraceSink>(
        &self,
        ctx: &mut Ctx<'_, S>,
        pipe: Pipe,
        pc: u32,
        start: u64,
        end: u64,
    ) {
        let (Some(lanes), Some(b)) = (&self.lanes, &self.block) else {
            return;
        };
        if let Some(Some(strings)) = ctx.trace.strings.get(b.kernel_id) {
            let names = strings[pc as usize];
            ctx.trace
                .span(lanes[lane_index(pipe)], names, start, end, pc);
        }
    }

    /// A synchronisation event: `arg` is how many cycles the unit waited before it.
    #[inline(always)]
    fn instant<S: TraceSink>(&self, ctx: &mut Ctx<'_, S>, pipe: Pipe, pc: u32, at: u64, arg: u64) {
        if self.lanes.is_some() {
            self.record_instant(ctx, pipe, pc, at, arg);
        }
    }

    #[inline(never)]
    fn record_instant<S: TraceSink>(
        &self,
        ctx: &mut Ctx<'_, S>,
        pipe: Pipe,
        pc: u32,
        at: u64,
        arg: u64,
    ) {
        let (Some(lanes), Some(b)) = (&self.lanes, &self.block) else {
            return;
        };
        if let Some(Some(strings)) = ctx.trace.strings.get(b.kernel_id) {
            let (name, detail) = strings[pc as usize];
            let at = ctx.trace.clock.tick(crate::time::Cycles(at)).0;
            let arg = u32::try_from(arg).unwrap_or(u32::MAX);
            ctx.trace.sink.record(Record::Instant {
                lane: lanes[lane_index(pipe)],
                name,
                at,
                arg,
                detail,
            });
        }
    }

    fn flow<S: TraceSink>(&self, ctx: &mut Ctx<'_, S>, f: FlagId, set_at: u64, wait_at: u64) {
        let Some(lanes) = &self.lanes else { return };
        let id = ctx.trace.next_flow;
        ctx.trace.next_flow += 1;
        let clock = ctx.trace.clock;
        let name = ctx.trace.set_name;
        ctx.trace.sink.record(Record::Flow {
            name,
            id,
            from_lane: lanes[lane_index(f.src)],
            from_at: clock.tick(crate::time::Cycles(set_at)).0,
            to_lane: lanes[lane_index(f.dst)],
            to_at: clock.tick(crate::time::Cycles(wait_at)).0,
        });
    }

    fn fault(&self, pipe: Pipe, pc: u32, f: Fault) -> StopReason {
        f.stop_reason(self.id, pipe, pc)
    }

    /// Checks a plan's accesses against buffer sizes and device memory.
    fn check_plan(
        &self,
        instr: &Instruction,
        plan: &Plan,
        mem: &DeviceMemory,
    ) -> Result<(), Fault> {
        for a in plan.accesses() {
            if !self.slot.kind.has_buffer(a.buffer) {
                return Err(Fault::Illegal(format!(
                    "{} uses {}, which {} does not have",
                    instr.spec().mnemonic,
                    a.buffer,
                    self.slot.kind.long_name()
                )));
            }
            if a.count == 0 || a.burst == 0 {
                continue;
            }
            let size = match a.buffer {
                Buffer::Gm => mem.capacity(),
                b => self.unknown.size(b),
            };
            if a.end() > size || a.end() < a.start {
                return Err(Fault::Range {
                    buffer: a.buffer,
                    addr: a.start,
                    len: a.extent(),
                    size,
                });
            }
        }
        Ok(())
    }

    /// Records which bytes a plan's writes leave computed or uncomputed.
    fn mark_writes(&mut self, plan: &Plan, mem: &mut DeviceMemory, unknown: bool) {
        for a in plan
            .accesses()
            .iter()
            .filter(|a| a.write && a.count > 0 && a.burst > 0)
        {
            match a.buffer {
                // Nothing changes when the whole extent is already in the state the bursts
                // would leave it in (a timing-only run rewriting its buffers, a full run
                // writing known bytes): one lookup instead of one update per burst.
                Buffer::Gm if unknown && mem.all_unknown(a.start, a.extent()) => {}
                Buffer::Gm if !unknown && !mem.is_unknown(a.start, a.extent()) => {}
                // Bursts that touch or overlap cover one range: one update instead of one per
                // burst (the same set either way).
                Buffer::Gm if a.stride <= a.burst => {
                    if unknown {
                        mem.mark_unknown(a.start, a.extent());
                    } else {
                        mem.mark_known(a.start, a.extent());
                    }
                }
                Buffer::Gm => {
                    for i in 0..a.count {
                        let s = a.start + i * a.stride;
                        if unknown {
                            mem.mark_unknown(s, a.burst);
                        } else {
                            mem.mark_known(s, a.burst);
                        }
                    }
                }
                b => self.unknown.mark(b, a.start, a.end(), unknown),
            }
        }
    }

    /// This core's block as cross-core flags name it.
    fn member(&self) -> Member {
        Member {
            kind: self.slot.kind,
            index: self.block.as_ref().map_or(0, |b| b.block_idx),
        }
    }

    /// Wakes every unit (a cross-core flag arrived for this core's block).
    pub(crate) fn wake_all(&mut self) {
        if let Some(b) = self.block.as_mut() {
            b.wake = u8::MAX >> 1;
        }
    }

    /// The launch and block this core runs, if any.
    pub(crate) fn running(&self) -> Option<(CrossGroup, u32)> {
        self.block.as_ref().map(|b| (b.group, b.block_idx))
    }

    /// `cross_set` from `pc`, taking effect at cycle `at`.
    fn cross_set<S: TraceSink>(
        &mut self,
        f: &gearsim_isa::CrossSet,
        pc: u32,
        at: u64,
        ctx: &mut Ctx<'_, S>,
    ) -> Res<()> {
        let pipe = match f.pipe {
            Pipe::All => Pipe::S,
            p => p,
        };
        check_cross(f.id.get(), self.slot.kind, ctx.cfg).map_err(|reason| {
            StopReason::IllegalInstruction {
                core: self.id,
                pipe,
                pc,
                reason,
            }
        })?;
        let Some(b) = self.block.as_ref() else {
            return Ok(());
        };
        let group = b.group;
        let lane = self.lanes.map(|l| l[lane_index(pipe)]);
        let arrival = Arrival {
            at,
            setter: self.id,
            pc,
            lane,
        };
        ctx.cross
            .set(&group, self.member(), f.mode, f.id.get(), arrival)
            .map_err(|e| self.cross_fault(e, pipe, pc))
    }

    fn cross_fault(&self, e: CrossError, pipe: Pipe, pc: u32) -> StopReason {
        match e {
            CrossError::Mode(reason) => StopReason::IllegalInstruction {
                core: self.id,
                pipe,
                pc,
                reason,
            },
            CrossError::Overflow(o) => o.stop_reason(),
        }
    }

    /// The flow from a cross-core set to the wait that consumed it, at cycle `at`.
    fn cross_flow<S: TraceSink>(
        &self,
        ctx: &mut Ctx<'_, S>,
        arrival: &Arrival,
        pipe: Pipe,
        at: u64,
    ) {
        let (Some(lanes), Some(from_lane)) = (&self.lanes, arrival.lane) else {
            return;
        };
        let id = ctx.trace.next_flow;
        ctx.trace.next_flow += 1;
        let clock = ctx.trace.clock;
        let name = match ctx.trace.cross_name {
            Some(n) => n,
            None => {
                let n = ctx.trace.sink.intern("cross-core flag");
                ctx.trace.cross_name = Some(n);
                n
            }
        };
        ctx.trace.sink.record(Record::Flow {
            name,
            id,
            from_lane,
            from_at: clock.tick(crate::time::Cycles(arrival.at)).0,
            to_lane: lanes[lane_index(pipe)],
            to_at: clock.tick(crate::time::Cycles(at)).0,
        });
    }

    // ---- scalar unit -------------------------------------------------------------------------

    /// The scalar unit's wait (begun at cycle `since`) ended at cycle `at`: it moves on.
    fn scalar_waited<S: TraceSink>(&mut self, at: u64, since: u64, ctx: &mut Ctx<'_, S>) {
        let Some(b) = self.block.as_mut() else {
            return;
        };
        b.s_time = at;
        let pc = b.pc;
        b.pc += 1;
        b.s_state = ScalarState::Run;
        self.stats.pipes[0].instructions += 1;
        self.instant(ctx, Pipe::S, pc, at, at - since);
    }

    /// Runs the scalar unit until it blocks (including on a state it could leave at once, such
    /// as a wait for a flag that is already set).
    fn run_scalar<S: TraceSink>(&mut self, ctx: &mut Ctx<'_, S>) -> Res<bool> {
        let mut any = false;
        while self.run_scalar_once(ctx)? {
            any = true;
        }
        Ok(any)
    }

    fn run_scalar_once<S: TraceSink>(&mut self, ctx: &mut Ctx<'_, S>) -> Res<bool> {
        let Some(b) = self.block.as_mut() else {
            return Ok(false);
        };
        let mut progressed = false;
        match b.s_state {
            ScalarState::Run => {}
            ScalarState::Done => return Ok(false),
            ScalarState::WaitFlag(f, since) => match b.flags.take(f) {
                Some(t) => {
                    let at = since.max(t);
                    b.flags.set_consumed(f, at);
                    b.wake |= 1 << lane_index(f.src);
                    self.scalar_waited(at, since, ctx);
                    self.flow(ctx, f, t, at);
                    progressed = true;
                }
                None => return Ok(false),
            },
            ScalarState::WaitFlagFree(f, at) => {
                if b.flags.is_set(f) {
                    return Ok(false);
                }
                let pc = b.pc;
                if b.flags.consumed(f) > at {
                    return Err(StopReason::FlagOverflow {
                        core: self.id,
                        pipe: Pipe::S,
                        pc,
                        flag: f,
                    });
                }
                b.flags.set(f, at);
                b.wake |= 1 << lane_index(f.dst);
                b.pc += 1;
                b.s_state = ScalarState::Run;
                self.stats.pipes[0].instructions += 1;
                self.instant(ctx, Pipe::S, pc, at, 0);
                progressed = true;
            }
            ScalarState::CrossWait(id, since) => {
                let me = Member {
                    kind: self.slot.kind,
                    index: b.block_idx,
                };
                let pc = b.pc;
                let taken = ctx.cross.take(b.group.id, me, id, since);
                let Some((at, arrival)) = taken.map_err(|e| self.cross_fault(e, Pipe::S, pc))?
                else {
                    return Ok(false);
                };
                self.scalar_waited(at, since, ctx);
                self.cross_flow(ctx, &arrival, Pipe::S, at);
                progressed = true;
            }
            ScalarState::QueueFull(qi) => {
                let p = &mut b.pipes[qi];
                if p.queue.len() >= ctx.cfg.core.pipe_queue_depth as usize {
                    return Ok(false);
                }
                b.s_time = b.s_time.max(p.pop_mark.unwrap_or(0));
                b.s_state = ScalarState::Run;
                progressed = true;
            }
            ScalarState::BarrierAll | ScalarState::Ending => {
                if !b.pipes.iter().all(PipeUnit::drained) {
                    return Ok(false);
                }
                let start = b.s_time;
                let end = b
                    .pipes
                    .iter()
                    .map(|p| p.last_complete)
                    .fold(b.s_time, u64::max);
                b.s_time = end;
                let pc = b.pc;
                let ending = b.s_state == ScalarState::Ending;
                b.s_state = if ending {
                    ScalarState::Done
                } else {
                    ScalarState::Run
                };
                if !ending {
                    b.pc += 1;
                }
                self.stats.pipes[0].instructions += 1;
                self.instant(ctx, Pipe::S, pc, end, end - start);
                return Ok(true);
            }
        }
        loop {
            let Some(b) = self.block.as_mut() else {
                return Ok(progressed);
            };
            if b.s_state != ScalarState::Run {
                return Ok(progressed);
            }
            let pc = b.pc;
            if b.s_time > b.deadline {
                return Err(StopReason::Timeout {
                    core: self.id,
                    pc,
                    limit_cycles: ctx.cfg.core.kernel_timeout_cycles,
                });
            }
            let Some(&instr) = b.kernel.program.instrs.get(pc as usize) else {
                return Err(StopReason::IllegalInstruction {
                    core: self.id,
                    pipe: Pipe::S,
                    pc,
                    reason: format!(
                        "pc {pc} is past the end of kernel `{}` ({} instructions); a block must end with `end`",
                        b.kernel.name,
                        b.kernel.program.instrs.len()
                    ),
                });
            };
            let pipe = b.kernel.pipes[pc as usize];
            if let Instruction::SetFlag(f) | Instruction::WaitFlag(f) = &instr {
                check_flag(f, ctx.cfg).map_err(|reason| StopReason::IllegalInstruction {
                    core: self.id,
                    pipe,
                    pc,
                    reason,
                })?;
            }
            if pipe != Pipe::S {
                if !self.dispatch(instr, pipe, ctx)? {
                    return Ok(progressed);
                }
                progressed = true;
                continue;
            }
            let start = b.s_time;
            let cost = self.execute_scalar(instr, ctx)?;
            progressed = true;
            let Some(b) = self.block.as_mut() else {
                return Ok(true);
            };
            if let Some(cost) = cost {
                b.s_time = start + cost;
                self.stats.pipes[0].instructions += 1;
                self.stats.pipes[0].busy_cycles += cost;
                self.span(ctx, Pipe::S, pc, start, start + cost);
            }
        }
    }

    /// Dispatches a pipe instruction into its queue; `false` if the scalar unit had to stop.
    fn dispatch<S: TraceSink>(
        &mut self,
        instr: Instruction,
        pipe: Pipe,
        ctx: &mut Ctx<'_, S>,
    ) -> Res<bool> {
        let core = self.id;
        let Some(b) = self.block.as_mut() else {
            return Ok(false);
        };
        let pc = b.pc;
        let illegal = |reason: String| StopReason::IllegalInstruction {
            core,
            pipe,
            pc,
            reason,
        };
        let kind = self.slot.kind;
        if !kind.has_pipe(pipe) {
            return Err(illegal(format!(
                "{} runs on the {pipe} pipe, which {} does not have",
                instr.spec().mnemonic,
                kind.long_name()
            )));
        }
        if pipe == Pipe::Fix && !ctx.cfg.core.fixpipe {
            return Err(illegal(format!(
                "{} needs a FIXPIPE, which {} does not have (coupled architecture: move L0C through UB with copy_l0c_to_ub)",
                instr.spec().mnemonic,
                ctx.cfg.name
            )));
        }
        let qi = pipe.queue_index().unwrap_or(0);
        if b.pipes[qi].queue.len() >= ctx.cfg.core.pipe_queue_depth as usize {
            b.s_state = ScalarState::QueueFull(qi);
            b.pipes[qi].pop_mark = None;
            return Ok(false);
        }
        let ops = Operands {
            regs: PipeOp::of(&instr).map_or([0; 4], |op| op.capture(&b.regs)),
            mask: b.mask,
            fmatrix: b.fmatrix,
        };
        b.wake |= 1 << (qi + 1);
        b.pipes[qi].queue.push_back(Queued {
            instr,
            pc,
            at: b.s_time,
            ops,
        });
        b.s_time += ctx.cfg.scalar.dispatch_cycles;
        b.pc += 1;
        Ok(true)
    }

    /// Executes one scalar-unit instruction; returns its cost, or `None` if the unit blocked
    /// (the instruction will complete later).
    fn execute_scalar<S: TraceSink>(
        &mut self,
        instr: Instruction,
        ctx: &mut Ctx<'_, S>,
    ) -> Res<Option<u64>> {
        let core = self.id;
        let cfg = ctx.cfg;
        let sc = &cfg.scalar;
        let Some(b) = self.block.as_mut() else {
            return Ok(None);
        };
        let pc = b.pc;
        // The semantics are `exec::scalar`'s; the cost is the table's timing class.
        let class_cycles = cfg.scalar_cycles(b.kernel.timing[pc as usize]);
        let r = &mut b.regs;
        let mut next = pc + 1;
        let cost = match scalar::step(&instr, r) {
            Step::Write { dst, value, .. } => {
                r[dst] = value;
                class_cycles
            }
            Step::Branch { taken, target, .. } => {
                if taken {
                    next = target;
                    class_cycles + sc.branch_taken_penalty
                } else {
                    class_cycles
                }
            }
            Step::Loop {
                counter,
                value,
                taken,
                target,
            } => {
                r[counter] = value;
                if taken {
                    next = target;
                    class_cycles + sc.branch_taken_penalty
                } else {
                    class_cycles
                }
            }
            Step::SetMask { mask, .. } => {
                b.mask = Mask::from(mask);
                class_cycles
            }
            Step::ReadSpecial(f) => {
                let v = match f.which {
                    SReg::BlockIdx => u64::from(b.block_idx),
                    SReg::BlockNum => u64::from(b.block_dim),
                    SReg::Args => b.args,
                    SReg::CoreId => u64::from(core),
                    SReg::Cycle => b.s_time,
                    SReg::SubBlockIdx => u64::from(b.sub_block),
                };
                b.regs[f.dst.index()] = v;
                class_cycles
            }
            Step::Memory(f, load) => self.scalar_mem(f, load, ctx)?,
            Step::SetFmatrix(f) => {
                b.fmatrix = *f;
                class_cycles
            }
            Step::SetFlag(f) => {
                let id = flag_of(f);
                if b.flags.is_set(id) {
                    b.s_state = ScalarState::WaitFlagFree(id, b.s_time);
                    return Ok(None);
                }
                b.flags.set(id, b.s_time);
                b.wake |= 1 << lane_index(id.dst);
                class_cycles
            }
            Step::WaitFlag(f) => {
                let id = flag_of(f);
                b.s_state = ScalarState::WaitFlag(id, b.s_time);
                return Ok(None);
            }
            Step::Barrier(f) => {
                if f.pipe == Pipe::All {
                    b.s_state = ScalarState::BarrierAll;
                    return Ok(None);
                }
                class_cycles
            }
            Step::CrossSet(f) => {
                let (f, at) = (*f, b.s_time);
                self.cross_set(&f, pc, at, ctx)?;
                class_cycles
            }
            Step::CrossWait(f) => {
                check_cross(f.id.get(), self.slot.kind, cfg).map_err(|reason| {
                    StopReason::IllegalInstruction {
                        core,
                        pipe: Pipe::S,
                        pc,
                        reason,
                    }
                })?;
                b.s_state = ScalarState::CrossWait(f.id.get(), b.s_time);
                return Ok(None);
            }
            Step::Nop => class_cycles,
            Step::End => {
                b.s_state = ScalarState::Ending;
                return Ok(None);
            }
            Step::Dispatched => {
                return Err(StopReason::IllegalInstruction {
                    core,
                    pipe: Pipe::S,
                    pc,
                    reason: format!("{} is not a scalar-unit instruction", instr.spec().mnemonic),
                });
            }
        };
        let Some(b) = self.block.as_mut() else {
            return Ok(None);
        };
        b.pc = next;
        Ok(Some(cost))
    }

    fn scalar_mem<S: TraceSink>(
        &mut self,
        f: &gearsim_isa::Mem,
        load: bool,
        ctx: &mut Ctx<'_, S>,
    ) -> Res<u64> {
        let core = self.id;
        let Some(b) = self.block.as_mut() else {
            return Ok(0);
        };
        let pc = b.pc;
        let addr = b.regs[f.base.index()].wrapping_add(i64::from(f.off) as u64);
        let size = f.width.size() as u64;
        let buffer = match f.space {
            Space::Gm => Buffer::Gm,
            Space::Ub => Buffer::Ub,
            Space::L1 => Buffer::L1,
        };
        if !self.slot.kind.has_buffer(buffer) {
            return Err(StopReason::IllegalInstruction {
                core,
                pipe: Pipe::S,
                pc,
                reason: format!(
                    "a scalar {} of {buffer}, which {} does not have",
                    if load { "load" } else { "store" },
                    self.slot.kind.long_name()
                ),
            });
        }
        if addr % size != 0 {
            return Err(StopReason::Misaligned {
                core,
                pipe: Pipe::S,
                pc,
                buffer,
                addr,
                align: size,
            });
        }
        let limit = match buffer {
            Buffer::Gm => ctx.mem.capacity(),
            other => self.unknown.size(other),
        };
        if addr.checked_add(size).is_none_or(|e| e > limit) {
            return Err(StopReason::MemoryFault {
                core,
                pipe: Pipe::S,
                pc,
                buffer,
                addr,
                len: size,
                size: limit,
            });
        }
        if buffer == Buffer::Gm
            && let Some(g) = ctx.mem.guard_at(addr, size)
        {
            return Err(StopReason::Guarded {
                core,
                pc,
                addr,
                load,
                what: g.what.clone(),
            });
        }
        let mut bytes = [0u8; 8];
        let n = size as usize;
        if load {
            let unknown = b.mode == ExecMode::TimingOnly
                && match buffer {
                    Buffer::Gm => ctx.mem.is_unknown(addr, size),
                    other => self.unknown.is_unknown(other, addr, addr + size),
                };
            if unknown {
                return Err(StopReason::ValueNeeded {
                    core,
                    pc,
                    buffer,
                    addr,
                });
            }
            match buffer {
                Buffer::Gm => {
                    ctx.values.settle_range(addr, size, false, ctx.mem)?;
                    ctx.mem
                        .read(addr, &mut bytes[..n])
                        .map_err(|_| StopReason::MemoryFault {
                            core,
                            pipe: Pipe::S,
                            pc,
                            buffer,
                            addr,
                            len: size,
                            size: limit,
                        })?
                }
                other => bytes[..n].copy_from_slice(
                    &ctx.values.buffers(core, ctx.mem)?.get(other)
                        [addr as usize..addr as usize + n],
                ),
            }
            let raw = u64::from_le_bytes(bytes);
            let v = match f.width {
                SType::I8 => raw as u8 as i8 as i64 as u64,
                SType::I16 => raw as u16 as i16 as i64 as u64,
                SType::I32 => raw as u32 as i32 as i64 as u64,
                SType::U8 | SType::U16 | SType::U32 | SType::U64 => raw,
            };
            b.regs[f.reg.index()] = v;
        } else {
            bytes = b.regs[f.reg.index()].to_le_bytes();
            match buffer {
                Buffer::Gm => {
                    ctx.values.settle_range(addr, size, true, ctx.mem)?;
                    ctx.mem
                        .write(addr, &bytes[..n])
                        .map_err(|_| StopReason::MemoryFault {
                            core,
                            pipe: Pipe::S,
                            pc,
                            buffer,
                            addr,
                            len: size,
                            size: limit,
                        })?
                }
                other => ctx.values.buffers(core, ctx.mem)?.get_mut(other)
                    [addr as usize..addr as usize + n]
                    .copy_from_slice(&bytes[..n]),
            }
        }
        let sc = &ctx.cfg.scalar;
        Ok(match (buffer, load) {
            (Buffer::Gm, true) => sc.gm_load_cycles,
            (Buffer::Gm, false) => sc.gm_store_cycles,
            _ => sc.local_access_cycles,
        })
    }

    // ---- pipes -------------------------------------------------------------------------------

    fn run_pipe<S: TraceSink>(&mut self, qi: usize, ctx: &mut Ctx<'_, S>) -> Res<bool> {
        let pipe = queue_pipe(qi);
        let mut progressed = false;
        loop {
            let core = self.id;
            let Some(b) = self.block.as_mut() else {
                return Ok(progressed);
            };
            let p = &mut b.pipes[qi];
            match p.state {
                PipeState::DmaScheduled(_) | PipeState::DmaActive(_) => return Ok(progressed),
                PipeState::WaitFlag(f, since) => {
                    let Some(t) = b.flags.take(f) else {
                        return Ok(progressed);
                    };
                    let at = since.max(t);
                    b.flags.set_consumed(f, at);
                    b.wake |= 1 << lane_index(f.src);
                    let p = &mut b.pipes[qi];
                    p.issue_free = at;
                    p.state = PipeState::Ready;
                    let pc = p.queue.front().map_or(0, |q| q.pc);
                    p.pop(at);
                    self.stats.pipes[qi + 1].instructions += 1;
                    self.instant(ctx, pipe, pc, at, at - since);
                    self.flow(ctx, f, t, at);
                    progressed = true;
                    continue;
                }
                PipeState::CrossWait(id, since) => {
                    let pc = p.queue.front().map_or(0, |q| q.pc);
                    let me = Member {
                        kind: self.slot.kind,
                        index: b.block_idx,
                    };
                    let taken = ctx.cross.take(b.group.id, me, id, since);
                    let Some((at, arrival)) = taken.map_err(|e| self.cross_fault(e, pipe, pc))?
                    else {
                        return Ok(progressed);
                    };
                    let Some(b) = self.block.as_mut() else {
                        return Ok(progressed);
                    };
                    let p = &mut b.pipes[qi];
                    p.issue_free = at;
                    p.state = PipeState::Ready;
                    p.pop(at);
                    self.stats.pipes[qi + 1].instructions += 1;
                    self.instant(ctx, pipe, pc, at, at - since);
                    self.cross_flow(ctx, &arrival, pipe, at);
                    progressed = true;
                    continue;
                }
                PipeState::WaitFlagFree(f, at) => {
                    if b.flags.is_set(f) {
                        return Ok(progressed);
                    }
                    let pc = p.queue.front().map_or(0, |q| q.pc);
                    if b.flags.consumed(f) > at {
                        return Err(StopReason::FlagOverflow {
                            core,
                            pipe,
                            pc,
                            flag: f,
                        });
                    }
                    b.flags.set(f, at);
                    b.wake |= 1 << lane_index(f.dst);
                    let p = &mut b.pipes[qi];
                    p.state = PipeState::Ready;
                    p.issue_free = at;
                    p.pop(at);
                    self.stats.pipes[qi + 1].instructions += 1;
                    self.instant(ctx, pipe, pc, at, 0);
                    progressed = true;
                    continue;
                }
                PipeState::Ready => {}
            }
            let Some(&head) = p.queue.front() else {
                return Ok(progressed);
            };
            let ready = head.at.max(p.issue_free);
            if ready > b.deadline {
                return Err(StopReason::Timeout {
                    core,
                    pc: head.pc,
                    limit_cycles: ctx.cfg.core.kernel_timeout_cycles,
                });
            }
            progressed = true;
            match head.instr {
                Instruction::SetFlag(f) => {
                    let id = flag_of(&f);
                    let at = ready.max(p.last_complete);
                    if b.flags.is_set(id) {
                        p.state = PipeState::WaitFlagFree(id, at);
                        continue;
                    }
                    b.flags.set(id, at);
                    b.wake |= 1 << lane_index(id.dst);
                    self.retire_sync(qi, head.pc, at, ctx);
                }
                Instruction::WaitFlag(f) => {
                    p.state = PipeState::WaitFlag(flag_of(&f), ready);
                }
                Instruction::CrossCoreSetFlag(f) => {
                    let at = ready.max(p.last_complete);
                    self.cross_set(&f, head.pc, at, ctx)?;
                    self.retire_sync(qi, head.pc, at, ctx);
                }
                Instruction::CrossCoreWaitFlag(f) => {
                    check_cross(f.id.get(), self.slot.kind, ctx.cfg).map_err(|reason| {
                        StopReason::IllegalInstruction {
                            core,
                            pipe,
                            pc: head.pc,
                            reason,
                        }
                    })?;
                    p.state = PipeState::CrossWait(f.id.get(), ready);
                }
                Instruction::PipeBarrier(_) => {
                    let at = ready.max(p.last_complete);
                    p.issue_free = at;
                    p.pop(at);
                    self.stats.pipes[qi + 1].instructions += 1;
                    self.instant(ctx, pipe, head.pc, at, at - ready);
                }
                instr => {
                    let op = PipeOp::of(&instr).unwrap_or(PipeOp::Sync);
                    let plan = op
                        .plan(&head.ops, ctx.cfg)
                        .map_err(|f| self.fault(pipe, head.pc, f))?;
                    self.check_plan(&instr, &plan, ctx.mem)
                        .map_err(|f| self.fault(pipe, head.pc, f))?;
                    let Some(b) = self.block.as_mut() else {
                        return Ok(progressed);
                    };
                    if exec::uses_gm(&instr) && plan.gm_bytes > 0 {
                        let p = &mut b.pipes[qi];
                        p.state = PipeState::DmaScheduled(ready);
                        p.dma = plan;
                        let at = ctx.clock.tick(crate::time::Cycles(ready)).max(ctx.now);
                        ctx.events.push(
                            at,
                            PRIO_CORE,
                            Event::DmaStart {
                                core,
                                queue: qi as u8,
                            },
                        );
                        return Ok(progressed);
                    }
                    let (issue, latency) = exec::local_cost(&instr, &plan, ctx.cfg);
                    let full = b.mode == ExecMode::Full;
                    if full {
                        ctx.values
                            .apply(self.id, instr, &head.ops, &plan, pipe, head.pc, ctx.mem)?;
                    }
                    self.mark_writes(&plan, ctx.mem, !full);
                    if let Instruction::Mmad(m) = instr {
                        // A fractal product is 16 x 16 x 16 MACs, 16 x 32 x 16 for i8.
                        let per_fractal = if m.ty == DType::I8 { 8192 } else { 4096 };
                        self.stats.cube_macs += plan.work * per_fractal;
                    }
                    let Some(b) = self.block.as_mut() else {
                        return Ok(progressed);
                    };
                    let p = &mut b.pipes[qi];
                    p.issue_free = ready + issue;
                    p.last_complete = p.last_complete.max(ready + issue + latency);
                    p.pop(ready);
                    let st = &mut self.stats.pipes[qi + 1];
                    st.instructions += 1;
                    st.busy_cycles += issue;
                    self.span(ctx, pipe, head.pc, ready, ready + issue);
                }
            }
        }
    }

    /// The set at the head of queue `qi` (pc `pc`) took effect at cycle `at`: the pipe moves on.
    fn retire_sync<S: TraceSink>(&mut self, qi: usize, pc: u32, at: u64, ctx: &mut Ctx<'_, S>) {
        let Some(b) = self.block.as_mut() else {
            return;
        };
        let p = &mut b.pipes[qi];
        p.issue_free = at;
        p.pop(at);
        self.stats.pipes[qi + 1].instructions += 1;
        self.instant(ctx, queue_pipe(qi), pc, at, 0);
    }

    /// The head DMA of queue `qi` joins the memory system now.
    pub(crate) fn dma_begin(&mut self, qi: usize, cfg: &ChipConfig) -> Option<DmaRequest> {
        let b = self.block.as_mut()?;
        let p = &mut b.pipes[qi];
        let PipeState::DmaScheduled(ready) = p.state else {
            return None;
        };
        let plan = p.dma;
        p.state = PipeState::DmaActive(ready);
        let gm = plan
            .accesses()
            .iter()
            .find(|a| a.buffer == Buffer::Gm)
            .copied()
            .unwrap_or_default();
        Some(DmaRequest {
            bytes: plan.gm_bytes,
            cap: exec::gm_rate_cap(queue_pipe(qi), cfg),
            write: queue_writes(qi),
            gm,
        })
    }

    /// The head DMA of queue `qi` finished moving data at `end`; its results are visible
    /// `latency` cycles later.
    pub(crate) fn dma_end<S: TraceSink>(
        &mut self,
        qi: usize,
        end: Tick,
        latency: u64,
        ctx: &mut Ctx<'_, S>,
    ) -> Res<()> {
        let pipe = queue_pipe(qi);
        let Some(b) = self.block.as_mut() else {
            return Ok(());
        };
        let p = &mut b.pipes[qi];
        let PipeState::DmaActive(start) = p.state else {
            return Ok(());
        };
        let Some(&head) = p.queue.front() else {
            return Ok(());
        };
        let end_c = ctx.clock.cycle_at_or_after(end).0.max(start + 1);
        let full = b.mode == ExecMode::Full;
        let plan = p.dma;
        if full {
            ctx.values.apply(
                self.id, head.instr, &head.ops, &plan, pipe, head.pc, ctx.mem,
            )?;
        }
        self.mark_writes(&plan, ctx.mem, !full);
        let Some(b) = self.block.as_mut() else {
            return Ok(());
        };
        let p = &mut b.pipes[qi];
        p.state = PipeState::Ready;
        p.issue_free = end_c;
        p.last_complete = p.last_complete.max(end_c + latency);
        p.pop(start);
        b.wake |= 1 | (1 << (qi + 1));
        let st = &mut self.stats.pipes[qi + 1];
        st.instructions += 1;
        st.busy_cycles += end_c - start;
        self.span(ctx, pipe, head.pc, start, end_c);
        Ok(())
    }
}

/// Whether a core of `kind` may use cross-core flag `id` on this chip.
fn check_cross(id: u8, kind: CoreKind, cfg: &ChipConfig) -> Result<(), String> {
    if kind == CoreKind::Coupled || cfg.core.cross_core_flag_ids == 0 {
        return Err(format!(
            "cross-core flags exist on separated chips only; {} has coupled AI cores",
            cfg.name
        ));
    }
    if id >= cfg.core.cross_core_flag_ids {
        return Err(format!(
            "cross-core flag id {id} is out of range: {} has ids 0..={}",
            cfg.name,
            cfg.core.cross_core_flag_ids - 1
        ));
    }
    Ok(())
}

fn check_flag(f: &Flag, cfg: &ChipConfig) -> Result<(), String> {
    if f.src == Pipe::All || f.dst == Pipe::All {
        return Err("a flag connects two pipes, not ALL".into());
    }
    if (f.src == Pipe::Fix || f.dst == Pipe::Fix) && !cfg.core.fixpipe {
        return Err(format!("{} has no FIXPIPE to synchronise with", cfg.name));
    }
    if f.id >= cfg.core.event_ids {
        return Err(format!(
            "event id {} is out of range: {} has {} event ids per pipe pair",
            f.id, cfg.name, cfg.core.event_ids
        ));
    }
    Ok(())
}
