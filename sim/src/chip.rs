//! The chip: AI cores, device memory and the shared memory system driven by one event queue.
//!
//! Build a [`Chip`] from a [`ChipConfig`] and a trace sink, load kernels, start blocks on cores,
//! then call [`Chip::run_until_event`] repeatedly: it returns when a block finishes, a firmware
//! timer fires or nothing is left to do, and a hardware fault stops the chip with a
//! [`StopReason`]. Device memory can be read and written at any time through the zero-time
//! functional path ([`Chip::write_mem`], [`Chip::read_mem`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use gearsim_isa::branch_target;
use gearsim_traces::{Level, StrId, TraceSink};
use thiserror::Error;

use crate::config::ChipConfig;
use crate::core::buffers::Buffers;
use crate::core::{AiCore, BlockLaunch, CoreStats, Ctx, Tracer};
use crate::cross::{CrossCore, Member};
use crate::event::{Event, EventQueue, PRIO_CORE, PRIO_MEMORY, PRIO_TIMER};
use crate::hbm::{Done, Hbm, Owner};
use crate::kernel::Kernel;
use crate::kind::{CoreKind, CoreSlot};
use crate::l2::L2;
use crate::memory::{DeviceMemory, OutOfRange};
use crate::memory_trace::MemoryLanes;
use crate::stop::StopReason;
use crate::time::{Clock, Cycles, Tick};
use crate::values::Values;

/// Misuse of the chip's API by its caller (the firmware or a test), as opposed to a fault of
/// the simulated hardware.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ChipError {
    /// The core does not exist.
    #[error("core {core} does not exist (the chip has {count} cores)")]
    NoSuchCore {
        /// Core asked for.
        core: u32,
        /// Cores on the chip.
        count: u32,
    },
    /// The core is running or about to run another block.
    #[error("core {core} is busy until {busy_until}; cannot start a block at {at}")]
    CoreBusy {
        /// Core asked for.
        core: u32,
        /// When it becomes free.
        busy_until: Tick,
        /// Requested start.
        at: Tick,
    },
    /// No kernel with this id.
    #[error("kernel id {0} is not loaded")]
    NoSuchKernel(usize),
    /// The kernel cannot run.
    #[error("kernel `{name}`: {reason}")]
    BadKernel {
        /// Kernel name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A start time in the past.
    #[error("cannot schedule at {at}: the chip is already at {now}")]
    InThePast {
        /// Requested time.
        at: Tick,
        /// Current time.
        now: Tick,
    },
}

/// Why [`Chip::run_until_event`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEvent {
    /// A block finished; its core is free from `at` on.
    BlockFinished {
        /// Core.
        core: u32,
        /// Finish time (may be later than [`Chip::now`]: cores compute ahead of global time).
        at: Tick,
    },
    /// A timer set with [`Chip::set_timer`] fired.
    Timer {
        /// The token given.
        token: u64,
        /// Its time.
        at: Tick,
    },
    /// A transfer started with [`Chip::start_transfer`] finished moving its data.
    TransferDone {
        /// The token given.
        token: u64,
        /// Its completion time.
        at: Tick,
    },
    /// Nothing is left to do.
    Idle {
        /// Current time.
        at: Tick,
    },
}

/// Bytes moved by DMAs since the chip was built (see [`Chip::traffic`]); the difference of two
/// snapshots is the traffic of the window between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes read from device memory, L2 hits included.
    pub read: u64,
    /// The part of `read` the L2 served.
    pub read_l2_hits: u64,
    /// Bytes HBM delivered for the reads: the misses, as the whole lines the L2 fetched.
    pub hbm_read: u64,
    /// Bytes written to device memory (into the L2 when it writes back).
    pub written: u64,
    /// Bytes of writes that reached HBM: every written byte with a write-through L2, the
    /// evicted dirty lines with a write-back one.
    pub hbm_written: u64,
}

impl Traffic {
    /// The traffic between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            read: self.read - earlier.read,
            read_l2_hits: self.read_l2_hits - earlier.read_l2_hits,
            hbm_read: self.hbm_read - earlier.hbm_read,
            written: self.written - earlier.written,
            hbm_written: self.hbm_written - earlier.hbm_written,
        }
    }

    /// Bytes that crossed the HBM interface: the reads' line fills and the writes that
    /// reached it.
    pub fn hbm_bytes(&self) -> u64 {
        self.hbm_read + self.hbm_written
    }
}

/// The simulated chip.
pub struct Chip<S: TraceSink> {
    cfg: Arc<ChipConfig>,
    clock: Clock,
    now: Tick,
    events: EventQueue,
    mem: DeviceMemory,
    /// The cores' buffer values and the effects on values not yet applied.
    values: Values,
    hbm: Hbm,
    l2: L2,
    /// Bytes of dirty lines written back to HBM so far.
    written_back: u64,
    cores: Vec<AiCore>,
    /// Cross-core flags, and which core runs each block that may receive one.
    cross: CrossCore,
    running: BTreeMap<(u32, Member), u32>,
    pending: Vec<Option<BlockLaunch>>,
    busy_until: Vec<Tick>,
    kernels: Vec<Arc<Kernel>>,
    tracer: Tracer<S>,
    memory_lanes: Option<MemoryLanes>,
    stopped: Option<StopReason>,
    finished: VecDeque<(u32, Tick)>,
    transfers_done: VecDeque<(u64, Tick)>,
    done_scratch: Vec<(u64, Done)>,
}

impl<S: TraceSink> Chip<S> {
    /// Builds a chip. Records go to `sink` when it is enabled.
    pub fn new(cfg: ChipConfig, mut sink: S) -> Chip<S> {
        let cfg = Arc::new(cfg);
        let clock = cfg.core_clock();
        let enabled = sink.enabled();
        let level = sink.level();
        let on = enabled && level == Level::Instruction;
        if enabled {
            sink.meta("chip", &cfg.name);
            sink.meta("core_clock_mhz", &cfg.core.clock_mhz.to_string());
            sink.meta("time_unit", "ps");
        }
        let set_name = if on {
            sink.intern("flag")
        } else {
            StrId::EMPTY
        };
        let slots = cfg.core_slots();
        let n = slots.len() as u32;
        Chip {
            clock,
            now: Tick::ZERO,
            events: EventQueue::default(),
            mem: DeviceMemory::new(cfg.memory.hbm_bytes),
            values: Values::new(
                slots
                    .iter()
                    .map(|slot| Buffers::new(&cfg, slot.kind))
                    .collect(),
            ),
            hbm: Hbm::new(
                cfg.memory.hbm_bytes_per_second,
                cfg.memory.l2_bytes_per_second,
            ),
            l2: L2::new(
                cfg.memory.l2_bytes,
                cfg.memory.l2_line_bytes,
                cfg.memory.l2_ways,
            )
            .with_write_back(cfg.memory.l2_write_back),
            written_back: 0,
            cores: slots
                .iter()
                .zip(0..)
                .map(|(&slot, i)| AiCore::new(i, slot, &cfg))
                .collect(),
            cross: CrossCore::new(cfg.core.cross_core_max_pending),
            running: BTreeMap::new(),
            pending: vec![None; n as usize],
            busy_until: vec![Tick::ZERO; n as usize],
            kernels: Vec::new(),
            tracer: Tracer {
                sink,
                on,
                clock,
                strings: Vec::new(),
                next_flow: 0,
                set_name,
                cross_name: None,
                kernels: enabled && level == Level::Kernel,
                memory: enabled,
                kernel_names: Vec::new(),
            },
            memory_lanes: None,
            stopped: None,
            finished: VecDeque::new(),
            transfers_done: VecDeque::new(),
            done_scratch: Vec::new(),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ChipConfig {
        &self.cfg
    }

    /// The AI core clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Current global time.
    pub fn now(&self) -> Tick {
        self.now
    }

    /// The trace sink.
    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.tracer.sink
    }

    /// Gives the trace sink back (to finish a trace file), after recording the memory
    /// counters' last window.
    pub fn into_sink(mut self) -> S {
        if let Some(m) = self.memory_lanes.as_mut() {
            m.finish(&mut self.tracer.sink, self.now.0);
        }
        self.tracer.sink
    }

    /// Number of cores of every kind (a separated chip's cube cores, then its vector cores).
    pub fn core_count(&self) -> u32 {
        self.cores.len() as u32
    }

    /// The kind and place of a core.
    pub fn core_slot(&self, core: u32) -> Option<CoreSlot> {
        self.cores.get(core as usize).map(|c| c.slot)
    }

    /// Forgets the cross-core flags of a finished launch (`BlockLaunch::group`'s id); a flag
    /// that overflowed a block's count without any wait to see it stops the chip.
    pub fn release_group(&mut self, group: u32) -> Result<(), StopReason> {
        match self.cross.release(group) {
            Ok(()) => Ok(()),
            Err(o) => Err(self.stop(o.stop_reason())),
        }
    }

    /// Loads a kernel; returns its id.
    pub fn load_kernel(&mut self, kernel: Kernel) -> Result<usize, ChipError> {
        let len = kernel.program.instrs.len();
        if len == 0 {
            return Err(ChipError::BadKernel {
                name: kernel.name,
                reason: "the program is empty".into(),
            });
        }
        for (pc, instr) in kernel.program.instrs.iter().enumerate() {
            if let Some(t) = branch_target(instr)
                && t as usize >= len
            {
                return Err(ChipError::BadKernel {
                    name: kernel.name,
                    reason: format!(
                        "pc {pc}: branch target {t} is past the end ({len} instructions)"
                    ),
                });
            }
            if let Err(reason) = instr.validate() {
                return Err(ChipError::BadKernel {
                    name: kernel.name,
                    reason: format!("pc {pc}: {reason}"),
                });
            }
        }
        let strings = if self.tracer.on {
            let sink = &mut self.tracer.sink;
            // One buffer for every instruction's "<kernel>: <text>" (the mnemonic with its
            // suffixes is the text's first word).
            let mut line = format!("{}: ", kernel.name);
            let prefix = line.len();
            Some(
                (0..len)
                    .map(|pc| {
                        line.truncate(prefix);
                        kernel.program.disasm_at_into(pc, &mut line);
                        let text = &line[prefix..];
                        let head = text.split(' ').next().unwrap_or("");
                        (sink.intern(head), sink.intern(&line))
                    })
                    .collect(),
            )
        } else {
            None
        };
        self.tracer.strings.push(strings);
        let name = if self.tracer.kernels {
            self.tracer.sink.intern(&kernel.name)
        } else {
            StrId::EMPTY
        };
        self.tracer.kernel_names.push(name);
        self.kernels.push(Arc::new(kernel));
        Ok(self.kernels.len() - 1)
    }

    /// The kernel with this id.
    pub fn kernel(&self, id: usize) -> Option<&Kernel> {
        self.kernels.get(id).map(|k| &**k)
    }

    /// Whether a core is free at time `at`.
    pub fn core_free_at(&self, core: u32) -> Option<Tick> {
        let i = core as usize;
        if i >= self.cores.len() || self.cores[i].is_busy() || self.pending[i].is_some() {
            return None;
        }
        Some(self.busy_until[i])
    }

    /// Starts a block on a core at `at` (not before now, not before the core is free).
    pub fn start_block(
        &mut self,
        core: u32,
        launch: BlockLaunch,
        at: Tick,
    ) -> Result<(), ChipError> {
        let count = self.core_count();
        let i = core as usize;
        if i >= self.cores.len() {
            return Err(ChipError::NoSuchCore { core, count });
        }
        if launch.kernel >= self.kernels.len() {
            return Err(ChipError::NoSuchKernel(launch.kernel));
        }
        if at < self.now {
            return Err(ChipError::InThePast { at, now: self.now });
        }
        if self.cores[i].is_busy() || self.pending[i].is_some() || at < self.busy_until[i] {
            return Err(ChipError::CoreBusy {
                core,
                busy_until: self.busy_until[i],
                at,
            });
        }
        self.pending[i] = Some(launch);
        self.events.push(at, PRIO_CORE, Event::BlockStart { core });
        Ok(())
    }

    /// Schedules a timer; [`Chip::run_until_event`] returns [`RunEvent::Timer`] when it fires.
    pub fn set_timer(&mut self, at: Tick, token: u64) -> Result<(), ChipError> {
        if at < self.now {
            return Err(ChipError::InThePast { at, now: self.now });
        }
        self.events.push(at, PRIO_TIMER, Event::Timer { token });
        Ok(())
    }

    /// Why the chip stopped, if it did.
    pub fn stopped(&self) -> Option<&StopReason> {
        self.stopped.as_ref()
    }

    /// Runs until a block finishes, a timer fires or nothing is left to do.
    pub fn run_until_event(&mut self) -> Result<RunEvent, StopReason> {
        if let Some(s) = &self.stopped {
            return Err(s.clone());
        }
        loop {
            if let Some((core, at)) = self.finished.pop_front() {
                return Ok(RunEvent::BlockFinished { core, at });
            }
            if let Some((token, at)) = self.transfers_done.pop_front() {
                return Ok(RunEvent::TransferDone { token, at });
            }
            let Some((t, event)) = self.events.pop() else {
                let blocked: Vec<_> = self
                    .cores
                    .iter()
                    .flat_map(|c| c.blocked_units(&|core| self.cross_peers(core)))
                    .collect();
                if !blocked.is_empty() || self.cores.iter().any(AiCore::is_busy) {
                    return Err(self.stop(StopReason::Deadlock {
                        at: self.now,
                        blocked,
                    }));
                }
                return Ok(RunEvent::Idle { at: self.now });
            };
            self.now = self.now.max(t);
            let result = match event {
                Event::Timer { token } => return Ok(RunEvent::Timer { token, at: t }),
                Event::BlockStart { core } => self.block_start(core),
                Event::DmaStart { core, queue } => self.dma_start(core, queue),
                Event::MemoryCheck { generation } => {
                    if self.hbm.take_check(generation) {
                        self.memory_check()
                    } else {
                        Ok(())
                    }
                }
            };
            if let Err(s) = result {
                return Err(self.stop(s));
            }
        }
    }

    /// Runs until nothing is left to do, returning every block finish in order.
    pub fn run_to_idle(&mut self) -> Result<Vec<(u32, Tick)>, StopReason> {
        let mut done = Vec::new();
        loop {
            match self.run_until_event()? {
                RunEvent::BlockFinished { core, at } => done.push((core, at)),
                RunEvent::Timer { .. } | RunEvent::TransferDone { .. } => {}
                RunEvent::Idle { .. } => return Ok(done),
            }
        }
    }

    fn stop(&mut self, reason: StopReason) -> StopReason {
        log::debug!("chip stopped: {reason}");
        self.stopped = Some(reason.clone());
        reason
    }

    fn ctx(&mut self) -> (Ctx<'_, S>, &mut Vec<AiCore>) {
        (
            Ctx {
                cfg: &self.cfg,
                clock: self.clock,
                now: self.now,
                mem: &mut self.mem,
                values: &mut self.values,
                events: &mut self.events,
                trace: &mut self.tracer,
                cross: &mut self.cross,
            },
            &mut self.cores,
        )
    }

    /// Advances a core, then every core a cross-core flag it set reached, and so on.
    fn advance_core(&mut self, core: u32) -> Result<(), StopReason> {
        self.advance_one(core)?;
        // Cross-core flags are rare: the worklist exists only when one arrived.
        let mut todo: Vec<u32> = Vec::new();
        loop {
            for key in std::mem::take(&mut self.cross.woken) {
                if let Some(&c) = self.running.get(&key) {
                    self.cores[c as usize].wake_all();
                    todo.push(c);
                }
            }
            let Some(core) = todo.pop() else {
                return Ok(());
            };
            self.advance_one(core)?;
        }
    }

    /// Advances one core; a finished block frees its core.
    fn advance_one(&mut self, core: u32) -> Result<(), StopReason> {
        {
            let running = self.cores[core as usize].running();
            let (mut ctx, cores) = self.ctx();
            let done = cores[core as usize].advance(&mut ctx)?;
            if let Some(end) = done {
                let at = self.clock.tick(Cycles(end)).max(self.now);
                self.busy_until[core as usize] = at;
                self.finished.push_back((core, at));
                if let Some((group, block)) = running {
                    let kind = self.cores[core as usize].slot.kind;
                    self.running
                        .remove(&(group.id, Member { kind, index: block }));
                }
            }
        }
        Ok(())
    }

    /// For a core waiting for a cross-core flag: where it runs and the cores that could set
    /// the flag (for deadlock reports).
    fn cross_peers(&self, core: u32) -> String {
        let Some((group, block)) = self.cores.get(core as usize).and_then(AiCore::running) else {
            return String::new();
        };
        let me = self.cores[core as usize].slot;
        let name = |kind: CoreKind, index: u32| match self
            .running
            .get(&(group.id, Member { kind, index }))
        {
            Some(&c) => format!("{} (core {c})", self.cores[c as usize].slot),
            None => format!("{kind} block {index} (not running)"),
        };
        let v = group.vectors_per_core;
        let peers: Vec<String> = match me.kind {
            CoreKind::Vector if group.mix => {
                let mut p = vec![format!(
                    "{} with cross_set.aic_aiv",
                    name(CoreKind::Cube, block / v)
                )];
                if v == 2 {
                    p.push(format!(
                        "{} with cross_set.aiv",
                        name(CoreKind::Vector, block ^ 1)
                    ));
                }
                p
            }
            CoreKind::Cube if group.mix => (0..v)
                .map(|s| {
                    format!(
                        "{} with cross_set.aic_aiv",
                        name(CoreKind::Vector, block * v + s)
                    )
                })
                .collect(),
            kind => vec![format!(
                "every {kind} block of the launch with cross_set.all"
            )],
        };
        format!(" (on {me}; set by {}: none did)", peers.join(" or "))
    }

    fn block_start(&mut self, core: u32) -> Result<(), StopReason> {
        let Some(launch) = self.pending[core as usize].take() else {
            return Ok(());
        };
        let kernel = Arc::clone(&self.kernels[launch.kernel]);
        let start = self.clock.cycle_at_or_after(self.now).0;
        let kind = self.cores[core as usize].slot.kind;
        self.running.insert(
            (
                launch.group.id,
                Member {
                    kind,
                    index: launch.block_idx,
                },
            ),
            core,
        );
        let (mut ctx, cores) = self.ctx();
        cores[core as usize].start(&launch, kernel, start, &mut ctx);
        self.advance_core(core)
    }

    fn dma_start(&mut self, core: u32, queue: u8) -> Result<(), StopReason> {
        self.complete_transfers()?;
        if let Some(dma) = self.cores[core as usize].dma_begin(usize::from(queue), &self.cfg) {
            let (touched, hit, filled) = self.l2.touch(&dma.gm);
            // A read's hit share of the bytes it moves (bursts rounded to 32 bytes) is that of
            // the bytes it touches. Written back, a write goes to L2; written through, to HBM.
            let hit_bytes = if dma.write {
                if self.l2.writes_back() { dma.bytes } else { 0 }
            } else if hit == 0 {
                0
            } else {
                (u128::from(dma.bytes) * u128::from(hit) / u128::from(touched)) as u64
            };
            // The dirty lines its allocations evicted go to HBM beside it, as a write of the
            // L2's own that shares HBM with every transfer and that nothing waits for.
            let evicted = self.l2.take_written_back();
            if evicted > 0 {
                self.written_back += evicted;
                self.hbm.start(
                    Owner::WriteBack,
                    evicted,
                    0,
                    self.cfg.memory.hbm_bytes_per_second,
                    true,
                );
            }
            // A read moves the bytes the L2 serves at the L2's per-core rate and the others at
            // device memory's, so its cap is the two mixed harmonically by its hit share.
            let cap = if dma.write || hit_bytes == 0 {
                dma.cap
            } else {
                let l2_cap = self
                    .cfg
                    .core_clock()
                    .bytes_per_second(self.cfg.mte.l2_read_bytes_per_cycle);
                mixed_cap(dma.bytes, hit_bytes, l2_cap, dma.cap)
            };
            // HBM moves what the L2 fetches for a read (whole lines), and a write's misses.
            let hbm_bytes = if dma.write {
                dma.bytes - hit_bytes
            } else if self.l2.enabled() {
                filled
            } else {
                dma.bytes
            };
            self.hbm.start_filling(
                Owner::Core { core, queue },
                dma.bytes,
                hit_bytes,
                hbm_bytes,
                cap,
                dma.write,
            );
        }
        self.reschedule_memory();
        Ok(())
    }

    fn memory_check(&mut self) -> Result<(), StopReason> {
        self.complete_transfers()?;
        self.reschedule_memory();
        Ok(())
    }

    /// Advances the memory system to now and hands every finished transfer to its core.
    fn complete_transfers(&mut self) -> Result<(), StopReason> {
        let mut done = std::mem::take(&mut self.done_scratch);
        done.clear();
        self.hbm.advance(self.now, &mut done);
        let result = self.finish_transfers(&done);
        self.done_scratch = done;
        result
    }

    fn finish_transfers(&mut self, done: &[(u64, Done)]) -> Result<(), StopReason> {
        for &(_, d) in done {
            match d.owner {
                Owner::Core { core, queue } => {
                    let now = self.now;
                    let latency = self.dma_latency(queue, &d);
                    let (mut ctx, cores) = self.ctx();
                    cores[core as usize].dma_end(usize::from(queue), now, latency, &mut ctx)?;
                    self.advance_core(core)?;
                }
                Owner::External { token } => self.transfers_done.push_back((token, self.now)),
                Owner::WriteBack => {}
            }
        }
        Ok(())
    }

    /// Core cycles from a DMA's last byte moving to its completion: the byte-weighted mix of
    /// the L2 and DDR latencies of its kind (read or write), rounded to the nearest cycle, so a
    /// DMA served by L2 sees the L2 latency and one with nothing in L2 exactly the DDR one (a
    /// write-back write always sees the L2's: its evictions go to HBM on their own).
    fn dma_latency(&self, queue: u8, d: &Done) -> u64 {
        let m = &self.cfg.memory;
        if crate::core::queue_writes(usize::from(queue)) {
            return d.mix(m.l2_write_latency_cycles, m.write_latency_cycles);
        }
        d.mix(m.l2_read_latency_cycles, m.read_latency_cycles)
    }

    /// Starts a transfer of `bytes` through the shared memory system now, for an engine outside
    /// the AI cores (AI CPU, SDMA, PCIe DMA): it competes for HBM bandwidth with the cores'
    /// DMAs, at most at `cap_bytes_per_second`, and [`Chip::run_until_event`] reports
    /// [`RunEvent::TransferDone`] with `token` when its data has moved. It names no address,
    /// so it bypasses the L2: all of its bytes are HBM traffic and it changes no L2 contents.
    pub fn start_transfer(
        &mut self,
        token: u64,
        bytes: u64,
        cap_bytes_per_second: u64,
        write: bool,
    ) {
        // Bring the memory system up to now (finishing anything that ends at this tick) so the
        // new transfer shares bandwidth only from now on.
        if let Err(s) = self.complete_transfers() {
            self.stop(s);
        }
        self.hbm.start(
            Owner::External { token },
            bytes,
            0,
            cap_bytes_per_second,
            write,
        );
        self.reschedule_memory();
    }

    fn reschedule_memory(&mut self) {
        if let Some((at, generation)) = self.hbm.reschedule(self.now) {
            self.events
                .push(at, PRIO_MEMORY, Event::MemoryCheck { generation });
        }
        if self.tracer.memory {
            let rates = self.hbm.rates();
            let (l2, windowed) = (self.l2.enabled(), !self.tracer.on);
            let sink = &mut self.tracer.sink;
            self.memory_lanes
                .get_or_insert_with(|| MemoryLanes::new(sink, l2, windowed))
                .update(sink, self.now.0, rates);
        }
    }

    /// Statistics of one core accumulated since the chip was built.
    pub fn core_stats(&self, core: u32) -> Option<CoreStats> {
        self.cores.get(core as usize).map(|c| c.stats)
    }

    /// Bytes read from and written to device memory by DMAs so far.
    pub fn memory_traffic(&self) -> (u64, u64) {
        (self.hbm.bytes_read, self.hbm.bytes_written)
    }

    /// Bytes of those reads that the L2 served and that HBM served, so far; they add up to
    /// the first figure of [`Chip::memory_traffic`]. Transfers of engines outside the cores
    /// bypass the L2 and count as HBM.
    pub fn l2_traffic(&self) -> (u64, u64) {
        (
            self.hbm.read_hit_bytes,
            self.hbm.bytes_read - self.hbm.read_hit_bytes,
        )
    }

    /// Keeps GM bytes `[start, start + len)` resident in the L2 until [`Chip::l2_drop`]
    /// releases them (an L2 control section of a kernel launch; nothing without an L2).
    pub fn l2_keep(&mut self, start: u64, len: u64) {
        self.l2.keep_range(start, len);
    }

    /// Forgets the L2's copy of GM bytes `[start, start + len)` without writing it to device
    /// memory (the data is dead), and ends any keep on them.
    pub fn l2_drop(&mut self, start: u64, len: u64) {
        self.l2.drop_range(start, len);
    }

    /// Everything DMAs have moved so far, for deltas over a window (a kernel's run).
    pub fn traffic(&self) -> Traffic {
        Traffic {
            read: self.hbm.bytes_read,
            read_l2_hits: self.hbm.read_hit_bytes,
            hbm_read: self.hbm.hbm_read_bytes,
            written: self.hbm.bytes_written,
            hbm_written: if self.l2.writes_back() {
                self.written_back
            } else {
                self.hbm.bytes_written
            },
        }
    }

    /// Bytes of dirty L2 lines written back to HBM so far (0 with a write-through L2, where
    /// every written byte goes to HBM as it is written).
    pub fn l2_written_back(&self) -> u64 {
        self.written_back
    }

    /// Number of DMA transfers in flight.
    pub fn transfers_in_flight(&self) -> usize {
        self.hbm.active()
    }

    /// Host threads that compute a full run's values (default 1). Outputs, traces and timing
    /// are the same for every count; more threads only finish sooner.
    pub fn set_host_threads(&mut self, threads: usize) {
        self.values.set_threads(threads);
    }

    /// Applies the deferred effects on values that touch `[addr, addr + len)` before the
    /// caller reads (or, `store`, writes) it. A fault found there stops the chip, and the next
    /// [`Chip::run_until_event`] reports it.
    fn settle_values(&mut self, addr: u64, len: u64, store: bool) {
        if let Err(reason) = self.values.settle_range(addr, len, store, &mut self.mem)
            && self.stopped.is_none()
        {
            self.stop(reason);
        }
    }

    /// Reads device memory (zero time).
    pub fn read_mem(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        self.settle_values(addr, buf.len() as u64, false);
        self.mem.read(addr, buf)
    }

    /// Writes device memory (zero time).
    pub fn write_mem(&mut self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        self.settle_values(addr, data.len() as u64, true);
        self.mem.write(addr, data)
    }

    /// Fills device memory (zero time).
    pub fn fill_mem(&mut self, addr: u64, len: u64, byte: u8) -> Result<(), OutOfRange> {
        self.settle_values(addr, len, true);
        self.mem.fill(addr, len, byte)
    }

    /// Marks a range whose contents were never written, because no value is computed from
    /// them (a timing-only run's weights), as not computed: a kernel that reads it for its
    /// control flow stops with `ValueNeeded` instead of reading zeros.
    pub fn mark_mem_not_computed(&mut self, addr: u64, len: u64) -> Result<(), OutOfRange> {
        self.mem.check(addr, len)?;
        self.mem.mark_unknown(addr, len);
        Ok(())
    }

    /// Whether any byte of the range was written by a timing-only computation.
    pub fn mem_is_unknown(&self, addr: u64, len: u64) -> bool {
        self.mem.is_unknown(addr, len)
    }

    /// Device memory itself, for its capacity, bounds and red zones (its values may lag work
    /// still to be applied: read them with [`Chip::read_mem`]).
    pub fn memory(&self) -> &DeviceMemory {
        &self.mem
    }

    /// Adds a red zone of device memory (see [`DeviceMemory::add_guard`]).
    pub fn add_guard(&mut self, guard: crate::memory::Guard) {
        self.mem.add_guard(guard);
    }

    /// Removes the red zone starting at `start`.
    pub fn remove_guard(&mut self, start: u64) {
        self.mem.remove_guard(start);
    }
}

/// The rate cap of a transfer of `bytes` whose `hit_bytes` move at `hit_cap` and the rest at
/// `miss_cap` (bytes per second): the rate at which the whole moves in the sum of the two
/// times.
fn mixed_cap(bytes: u64, hit_bytes: u64, hit_cap: u64, miss_cap: u64) -> u64 {
    let (hit, miss) = (u128::from(hit_bytes), u128::from(bytes - hit_bytes));
    let (hc, mc) = (u128::from(hit_cap.max(1)), u128::from(miss_cap.max(1)));
    let time = hit * mc + miss * hc; // x (hc * mc)
    if time == 0 {
        return miss_cap;
    }
    u64::try_from(u128::from(bytes) * hc * mc / time).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::mixed_cap;

    #[test]
    fn a_reads_cap_mixes_the_l2_and_memory_rates_by_its_hit_share() {
        assert_eq!(mixed_cap(1000, 1000, 128, 64), 128);
        assert_eq!(mixed_cap(1000, 0, 128, 64), 64);
        // Half the bytes at 128 and half at 64 take 1000/256 + 1000/128 = 11.72 units.
        assert_eq!(mixed_cap(2000, 1000, 128, 64), 85);
    }
}
