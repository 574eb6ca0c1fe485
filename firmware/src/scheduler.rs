//! The task scheduler (in the style of HWTS): fetches each stream's next descriptor from device
//! memory, runs it, and moves the stream on.
//!
//! Everything the firmware does is driven by the chip's event queue: firmware timers
//! ([`Fw`]) for its own steps, block completions for AI core kernels, and completions of
//! transfers it started through the shared memory system (AI CPU reads, SDMA, PCIe DMA). Costs
//! come from the preset: a serial descriptor fetch per task (`task_fetch_ns`), a kernel start
//! (`kernel_launch_ns`) and a serial block dispatch (`block_dispatch_ns`), control tasks
//! (`control_task_ns`), AI CPU launch and loop costs, PCIe latency and bandwidth.

use std::collections::{BTreeMap, VecDeque};

use gearsim_isa::Program;
use gearsim_isa::task::{
    LabelSwitchByIndex, MemcpyKind, SwitchCond, Task, TaskDescriptor, TaskKind,
};
use gearsim_sim::{BlockLaunch, ChipConfig, ExecMode, Kernel, RunEvent, Tick};
use gearsim_traces::{Lane, LaneId, LaneKind, Record, StrId, TraceSink};
use zerocopy::FromBytes;

use crate::device::{
    Device, KERNEL_HEADER_BYTES, KERNEL_MAGIC, KERNEL_NEEDS_VALUES, KernelEntry,
    MAX_KERNEL_INSTRUCTIONS, StreamKind, StreamState,
};
use crate::error::{BlockedTask, DeviceError, TaskRef};
use crate::kernels::{
    self, AiCpuKernelId, GetDynamicDimsArgs, GetNextArgs, MapIndexArgs, map_index,
};

/// A firmware timer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fw {
    /// The stream may fetch its next task.
    Step { stream: u32 },
    /// A fetched task begins executing.
    Start { stream: u32, index: u32 },
    /// A task ends now.
    Done { stream: u32, index: u32 },
    /// An AI CPU job finished starting: its memory phase begins.
    AiCpuLaunched { job: u32 },
    /// An AI CPU job finished computing.
    AiCpuComputed { job: u32 },
    /// A PCIe job's latency elapsed: its data starts to move.
    PcieData { job: u32 },
    /// A GetNext waited as long as it may.
    QueueTimeout { stream: u32, index: u32 },
}

/// What a transfer through the shared memory system is for.
#[derive(Debug)]
enum Xfer {
    AiCpu(u32),
    Pcie(u32),
    Sdma { task: TaskRef, effect: Effect },
}

/// A functional effect applied when a timed operation completes.
#[derive(Debug, Default)]
enum Effect {
    #[default]
    None,
    /// Device writes.
    Write(Vec<(u64, Vec<u8>)>),
    /// A device-to-device copy.
    Copy { dst: u64, src: u64, size: u64 },
    /// A memset.
    Fill { dst: u64, size: u64, value: u8 },
    /// GetNext: copy staged tensors to their outputs, write shapes, free the staging buffers.
    GetNext {
        copies: Vec<(u64, u64, u64)>,
        shapes: Vec<(u64, Vec<u8>)>,
        free: Vec<u64>,
    },
}

#[derive(Debug)]
struct AiCpuJob {
    task: TaskRef,
    kernel: AiCpuKernelId,
    bytes: u64,
    cycles: u64,
    effect: Effect,
    cpu: usize,
    start: Tick,
}

#[derive(Debug)]
enum PcieFor {
    Task {
        task: TaskRef,
        host_to_device: bool,
        dst: u64,
        src: u64,
    },
    QueueItem {
        item: u32,
        dst: u64,
        data: Vec<u8>,
    },
}

#[derive(Debug)]
struct PcieJob {
    dir: usize,
    bytes: u64,
    purpose: PcieFor,
    start: Tick,
}

#[derive(Debug, Default)]
struct PcieLink {
    busy: bool,
    fifo: VecDeque<u32>,
}

struct StagedItem {
    queue: u32,
    remaining: u32,
    tensors: Vec<(u64, u64, Vec<i64>)>,
}

struct KernelRun {
    task: TaskRef,
    chip_kernel: usize,
    block_dim: u32,
    args: u64,
    mode: ExecMode,
    next_block: u32,
    done: u32,
    ready_at: Tick,
    first_start: Option<Tick>,
    end: Tick,
    cores: Vec<bool>,
}

/// Timing of the most recent AI core kernel run (for `Device::launch`'s report).
#[derive(Debug, Clone, Default)]
pub(crate) struct RunSummary {
    pub first_start: Option<Tick>,
    pub end: Tick,
    pub cores_used: u32,
}

pub(crate) struct Scheduler {
    timers: BTreeMap<u64, Fw>,
    next_token: u64,
    transfers: BTreeMap<u64, Xfer>,
    next_transfer: u64,
    fetch_free: Tick,
    block_slot: Tick,
    runs: BTreeMap<u32, KernelRun>,
    next_run: u32,
    core_run: Vec<Option<u32>>,
    fetched: BTreeMap<u32, Task>,
    jumps: BTreeMap<u32, u32>,
    aicpu_busy: Vec<bool>,
    aicpu_wait: VecDeque<u32>,
    aicpu_jobs: BTreeMap<u32, AiCpuJob>,
    next_job: u32,
    pcie: [PcieLink; 2],
    pcie_jobs: BTreeMap<u32, PcieJob>,
    items: BTreeMap<u32, StagedItem>,
    next_item: u32,
    notifies: BTreeMap<u32, bool>,
    notify_waiters: BTreeMap<u32, u32>,
    pub last_run: Option<RunSummary>,
}

/// Trace lanes of the firmware, registered on first use.
#[derive(Default)]
pub(crate) struct Lanes {
    scheduler: Option<LaneId>,
    aicpu: BTreeMap<usize, LaneId>,
    pcie: [Option<LaneId>; 2],
    names: BTreeMap<String, StrId>,
}

const H2D: usize = 0;
const D2H: usize = 1;

fn ns(n: u64) -> Tick {
    Tick(n.saturating_mul(1000))
}

impl Scheduler {
    pub(crate) fn new(cfg: &ChipConfig) -> Scheduler {
        Scheduler {
            timers: BTreeMap::new(),
            next_token: 0,
            transfers: BTreeMap::new(),
            next_transfer: 0,
            fetch_free: Tick::ZERO,
            block_slot: Tick::ZERO,
            runs: BTreeMap::new(),
            next_run: 0,
            core_run: vec![None; cfg.core.count as usize],
            fetched: BTreeMap::new(),
            jumps: BTreeMap::new(),
            aicpu_busy: vec![false; cfg.aicpu.count as usize],
            aicpu_wait: VecDeque::new(),
            aicpu_jobs: BTreeMap::new(),
            next_job: 0,
            pcie: [PcieLink::default(), PcieLink::default()],
            pcie_jobs: BTreeMap::new(),
            items: BTreeMap::new(),
            next_item: 0,
            notifies: BTreeMap::new(),
            notify_waiters: BTreeMap::new(),
            last_run: None,
        }
    }

    pub(crate) fn push_timer(&mut self, fw: Fw) -> u64 {
        self.next_token += 1;
        self.timers.insert(self.next_token, fw);
        self.next_token
    }

    fn transfer_token(&mut self, x: Xfer) -> u64 {
        self.next_transfer += 1;
        self.transfers.insert(self.next_transfer, x);
        self.next_transfer
    }

    // ---- the event loop ------------------------------------------------------------------------

    pub(crate) fn run<S: TraceSink>(
        dev: &mut Device<S>,
        done: &dyn Fn(&Device<S>) -> bool,
    ) -> Result<(), DeviceError> {
        loop {
            if done(dev) {
                return Ok(());
            }
            match dev.chip.run_until_event().map_err(DeviceError::Fault)? {
                RunEvent::BlockFinished { core, at } => Self::block_finished(dev, core, at)?,
                RunEvent::Timer { token, .. } => {
                    if let Some(fw) = dev.sched.timers.remove(&token) {
                        Self::timer_fired(dev, fw)?;
                    }
                }
                RunEvent::TransferDone { token, .. } => {
                    if let Some(x) = dev.sched.transfers.remove(&token) {
                        Self::transfer_done(dev, x)?;
                    }
                }
                RunEvent::Idle { .. } => {
                    if done(dev) {
                        return Ok(());
                    }
                    let blocked = Self::blocked(dev);
                    if blocked.is_empty() {
                        return Ok(());
                    }
                    return Err(DeviceError::Deadlock { blocked });
                }
            }
        }
    }

    fn blocked<S: TraceSink>(dev: &Device<S>) -> Vec<BlockedTask> {
        let mut out = Vec::new();
        for (sid, s) in dev.streams.iter().enumerate() {
            let task = |index| TaskRef {
                stream: sid as u32,
                index,
            };
            match &s.state {
                StreamState::WaitEvent { index, event, .. } => out.push(BlockedTask {
                    task: task(*index),
                    kind: "StreamWaitEvent",
                    waits_for: format!("event {event}, which nothing left will record"),
                }),
                StreamState::WaitQueue { index, queue, .. } => out.push(BlockedTask {
                    task: task(*index),
                    kind: "GetNext",
                    waits_for: format!("data queue {queue}, which is empty and has no timeout"),
                }),
                StreamState::WaitModel { index, model, .. } => out.push(BlockedTask {
                    task: task(*index),
                    kind: "ModelExecute",
                    waits_for: format!(
                        "model {model} to end (ModelEndGraph with every model stream finished)"
                    ),
                }),
                StreamState::Running { index, .. }
                    if dev.sched.notify_waiters.contains_key(&(sid as u32)) =>
                {
                    let id = dev.sched.notify_waiters[&(sid as u32)];
                    out.push(BlockedTask {
                        task: task(*index),
                        kind: "NotifyWait",
                        waits_for: format!("notify {id}"),
                    })
                }
                StreamState::Idle | StreamState::Stepping | StreamState::Running { .. } => {}
            }
        }
        out
    }

    fn timer_fired<S: TraceSink>(dev: &mut Device<S>, fw: Fw) -> Result<(), DeviceError> {
        match fw {
            Fw::Step { stream } => Self::step(dev, stream),
            Fw::Start { stream, index } => Self::start(dev, stream, index),
            Fw::Done { stream, index } => Self::done(dev, stream, index),
            Fw::AiCpuLaunched { job } => Self::aicpu_memory_phase(dev, job),
            Fw::AiCpuComputed { job } => Self::aicpu_finish(dev, job),
            Fw::PcieData { job } => {
                let (bytes, write) = match dev.sched.pcie_jobs.get(&job) {
                    Some(j) => (j.bytes, j.dir == H2D),
                    None => return Ok(()),
                };
                let token = dev.sched.transfer_token(Xfer::Pcie(job));
                let cap = dev.cfg.pcie.bytes_per_second;
                dev.chip.start_transfer(token, bytes, cap, write);
                Ok(())
            }
            Fw::QueueTimeout { stream, index } => match &dev.streams[stream as usize].state {
                StreamState::WaitQueue {
                    index: i,
                    queue,
                    since,
                    ..
                } if *i == index => {
                    let waited = dev.chip.now().0.saturating_sub(since.0) / 1_000_000;
                    Err(DeviceError::GetNextTimeout {
                        task: TaskRef { stream, index },
                        queue: *queue,
                        waited_us: waited,
                    })
                }
                _ => Ok(()),
            },
        }
    }

    /// Schedules a step of `stream` at `at` (it must be idle).
    pub(crate) fn step_later<S: TraceSink>(dev: &mut Device<S>, stream: u32, at: Tick) {
        let s = &mut dev.streams[stream as usize];
        s.state = StreamState::Stepping;
        let at = at.max(s.ready_at);
        dev.timer(at, Fw::Step { stream });
    }

    /// Fetches the stream's next task.
    fn step<S: TraceSink>(dev: &mut Device<S>, stream: u32) -> Result<(), DeviceError> {
        let now = dev.chip.now();
        let s = &dev.streams[stream as usize];
        if !s.has_work() {
            dev.streams[stream as usize].state = StreamState::Idle;
            return Self::stream_finished(dev, stream);
        }
        let index = s.pos;
        let addr = s.slot_addr(index);
        let start = now.max(s.ready_at).max(dev.sched.fetch_free);
        let fetched = start + ns(dev.cfg.scheduler.task_fetch_ns);
        dev.sched.fetch_free = fetched;
        let mut raw = [0u8; gearsim_isa::task::TASK_BYTES];
        dev.chip.read_mem(addr, &mut raw)?;
        let at = TaskRef { stream, index };
        let desc = TaskDescriptor::read_from_bytes(&raw).map_err(|_| DeviceError::BadTask {
            task: at,
            kind: "descriptor",
            field: "bytes",
            message: "a descriptor is 64 bytes".into(),
        })?;
        let task = desc.decode().map_err(|e| {
            let (kind, field) = match &e {
                gearsim_isa::task::TaskDecodeError::UnknownKind { .. } => ("descriptor", "kind"),
                gearsim_isa::task::TaskDecodeError::BadField { kind, field, .. } => (*kind, *field),
                gearsim_isa::task::TaskDecodeError::Reserved { kind, .. } => (*kind, "reserved"),
            };
            DeviceError::BadTask {
                task: at,
                kind,
                field,
                message: e.to_string(),
            }
        })?;
        Self::trace_fetch(dev, at, task.kind(), start, fetched);
        dev.streams[stream as usize].state = StreamState::Running {
            index,
            kind: task.kind(),
            start: fetched,
        };
        dev.sched.fetched.insert(stream, task);
        dev.timer(fetched, Fw::Start { stream, index });
        Ok(())
    }

    /// Ends the current task of `stream` now and moves on.
    fn done<S: TraceSink>(dev: &mut Device<S>, stream: u32, index: u32) -> Result<(), DeviceError> {
        let now = dev.chip.now();
        let (kind, start) = match dev.streams[stream as usize].state {
            StreamState::Running { kind, start, .. } => (kind, start),
            StreamState::WaitModel { start, .. } => (TaskKind::ModelExecute, start),
            _ => (TaskKind::LabelSet, now),
        };
        Self::trace_task(dev, TaskRef { stream, index }, kind, start, now);
        let next = dev.sched.jumps.remove(&stream).unwrap_or(index + 1);
        let s = &mut dev.streams[stream as usize];
        s.pos = next;
        s.ready_at = now;
        Self::step_later(dev, stream, now);
        Ok(())
    }

    /// A stream ran out of tasks: a model may have ended.
    fn stream_finished<S: TraceSink>(dev: &mut Device<S>, stream: u32) -> Result<(), DeviceError> {
        if let StreamKind::Model(m) = dev.streams[stream as usize].kind {
            Self::check_model_end(dev, m);
        }
        Ok(())
    }

    fn check_model_end<S: TraceSink>(dev: &mut Device<S>, m: u32) {
        let model = &dev.models[m as usize];
        if !model.running || !model.end_requested {
            return;
        }
        if !model
            .streams
            .iter()
            .all(|&s| dev.streams[s as usize].state == StreamState::Idle)
        {
            return;
        }
        let waiter = model.waiter;
        let model = &mut dev.models[m as usize];
        model.running = false;
        model.waiter = None;
        if let Some(w) = waiter {
            let now = dev.chip.now();
            dev.timer(
                now,
                Fw::Done {
                    stream: w.stream,
                    index: w.index,
                },
            );
        }
    }

    fn control_done<S: TraceSink>(dev: &mut Device<S>, at: TaskRef) {
        let t = dev.chip.now() + ns(dev.cfg.scheduler.control_task_ns);
        dev.timer(
            t,
            Fw::Done {
                stream: at.stream,
                index: at.index,
            },
        );
    }

    fn bad(at: TaskRef, kind: &'static str, field: &'static str, message: String) -> DeviceError {
        DeviceError::BadTask {
            task: at,
            kind,
            field,
            message,
        }
    }

    fn check_device_range<S: TraceSink>(
        dev: &Device<S>,
        at: TaskRef,
        kind: &'static str,
        field: &'static str,
        addr: u64,
        len: u64,
    ) -> Result<(), DeviceError> {
        dev.chip.memory().check(addr, len).map_err(|e| {
            Self::bad(
                at,
                kind,
                field,
                format!(
                    "device range [{addr:#x}, +{len}) is outside device memory ({} bytes)",
                    e.capacity
                ),
            )
        })
    }

    fn read_u32<S: TraceSink>(
        dev: &Device<S>,
        at: TaskRef,
        kind: &'static str,
        field: &'static str,
        addr: u64,
    ) -> Result<u32, DeviceError> {
        Self::check_device_range(dev, at, kind, field, addr, 4)?;
        let mut b = [0u8; 4];
        dev.chip.read_mem(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Executes a fetched task.
    fn start<S: TraceSink>(
        dev: &mut Device<S>,
        stream: u32,
        index: u32,
    ) -> Result<(), DeviceError> {
        let Some(task) = dev.sched.fetched.remove(&stream) else {
            return Ok(());
        };
        let at = TaskRef { stream, index };
        let now = dev.chip.now();
        match task {
            Task::AiCoreKernel(k) => {
                let entry = Self::resolve_kernel(dev, at, k.kernel)?;
                let max = dev.cfg.scheduler.max_block_dim;
                if k.block_dim == 0 || k.block_dim > max {
                    return Err(Self::bad(
                        at,
                        "AiCoreKernel",
                        "block_dim",
                        format!("{} is outside [1, {max}]", k.block_dim),
                    ));
                }
                if k.args != 0 {
                    Self::check_device_range(dev, at, "AiCoreKernel", "args", k.args, 8)?;
                }
                let mode = if entry.1 { ExecMode::Full } else { dev.mode };
                let cores = dev.chip.core_count() as usize;
                let id = dev.sched.next_run;
                dev.sched.next_run += 1;
                dev.sched.runs.insert(
                    id,
                    KernelRun {
                        task: at,
                        chip_kernel: entry.0,
                        block_dim: k.block_dim,
                        args: k.args,
                        mode,
                        next_block: 0,
                        done: 0,
                        ready_at: now + ns(dev.cfg.scheduler.kernel_launch_ns),
                        first_start: None,
                        end: now,
                        cores: vec![false; cores],
                    },
                );
                Self::dispatch_blocks(dev)?;
            }
            Task::AiCpuKernel(k) => Self::aicpu_start(dev, at, k.kernel, k.args, k.args_size)?,
            Task::Memcpy(m) => Self::memcpy(dev, at, m.kind, m.dst, m.src, m.size)?,
            Task::Memset(m) => {
                Self::check_device_range(dev, at, "Memset", "dst", m.dst, m.size)?;
                let token = dev.sched.transfer_token(Xfer::Sdma {
                    task: at,
                    effect: Effect::Fill {
                        dst: m.dst,
                        size: m.size,
                        value: m.value as u8,
                    },
                });
                let cap = dev.cfg.scheduler.sdma_bytes_per_second;
                dev.chip.start_transfer(token, m.size, cap, true);
            }
            Task::EventRecord(e) => {
                let slot = dev.events.get_mut(e.event as usize).ok_or_else(|| {
                    Self::bad(
                        at,
                        "EventRecord",
                        "event",
                        format!("event {} was never created", e.event),
                    )
                })?;
                *slot = true;
                Self::wake_event_waiters(dev, e.event);
                Self::control_done(dev, at);
            }
            Task::StreamWaitEvent(e) => {
                let recorded = *dev.events.get(e.event as usize).ok_or_else(|| {
                    Self::bad(
                        at,
                        "StreamWaitEvent",
                        "event",
                        format!("event {} was never created", e.event),
                    )
                })?;
                if recorded {
                    dev.events[e.event as usize] = false;
                    Self::control_done(dev, at);
                } else {
                    dev.streams[stream as usize].state = StreamState::WaitEvent {
                        index,
                        event: e.event,
                        since: now,
                    };
                }
            }
            Task::NotifyRecord(n) => {
                // Wake the oldest waiter on this notify, else leave it recorded for the next wait.
                let waiter = dev
                    .sched
                    .notify_waiters
                    .iter()
                    .find(|(_, id)| **id == n.notify)
                    .map(|(s, _)| *s);
                match waiter {
                    Some(s) => {
                        dev.sched.notify_waiters.remove(&s);
                        if let StreamState::Running { index: wi, .. } =
                            dev.streams[s as usize].state
                        {
                            Self::control_done(
                                dev,
                                TaskRef {
                                    stream: s,
                                    index: wi,
                                },
                            );
                        }
                    }
                    None => {
                        dev.sched.notifies.insert(n.notify, true);
                    }
                }
                Self::control_done(dev, at);
            }
            Task::NotifyWait(n) => {
                if dev.sched.notifies.get(&n.notify) == Some(&true) {
                    dev.sched.notifies.insert(n.notify, false);
                    Self::control_done(dev, at);
                } else {
                    dev.sched.notify_waiters.insert(stream, n.notify);
                }
            }
            Task::LabelSet(_) => Self::control_done(dev, at),
            Task::LabelGoto(g) => {
                let target = Self::label_target(dev, at, "LabelGoto", "label", g.label)?;
                dev.sched.jumps.insert(stream, target);
                Self::trace_instant(
                    dev,
                    at,
                    "label_goto",
                    g.label,
                    format!("goto label {}", g.label),
                );
                Self::control_done(dev, at);
            }
            Task::LabelSwitchByIndex(sw) => Self::label_switch(dev, at, &sw)?,
            Task::StreamActive(a) => {
                if a.stream != gearsim_isa::task::NO_STREAM {
                    Self::activate(dev, at, "StreamActive", a.stream)?;
                }
                Self::control_done(dev, at);
            }
            Task::StreamSwitch(sw) => {
                Self::check_device_range(dev, at, "StreamSwitch", "cond_ptr", sw.cond_ptr, 8)?;
                let mut b = [0u8; 8];
                dev.chip.read_mem(sw.cond_ptr, &mut b)?;
                let v = i64::from_le_bytes(b);
                let take = match sw.cond {
                    SwitchCond::Eq => v == sw.value,
                    SwitchCond::Ne => v != sw.value,
                    SwitchCond::Lt => v < sw.value,
                    SwitchCond::Le => v <= sw.value,
                    SwitchCond::Gt => v > sw.value,
                    SwitchCond::Ge => v >= sw.value,
                };
                if take {
                    Self::activate(dev, at, "StreamSwitch", sw.true_stream)?;
                }
                Self::control_done(dev, at);
            }
            Task::ModelExecute(m) => {
                let model = dev.models.get(m.model as usize).ok_or_else(|| {
                    Self::bad(
                        at,
                        "ModelExecute",
                        "model",
                        format!("model {} was never loaded", m.model),
                    )
                })?;
                if model.running {
                    return Err(Self::bad(
                        at,
                        "ModelExecute",
                        "model",
                        format!("model {} is already running", m.model),
                    ));
                }
                let streams = model.streams.clone();
                let model = &mut dev.models[m.model as usize];
                model.running = true;
                model.end_requested = false;
                model.waiter = Some(at);
                for &s in &streams {
                    let st = &mut dev.streams[s as usize];
                    st.pos = 0;
                    st.ready_at = now;
                }
                let start = match dev.streams[stream as usize].state {
                    StreamState::Running { start, .. } => start,
                    _ => now,
                };
                dev.streams[stream as usize].state = StreamState::WaitModel {
                    index,
                    model: m.model,
                    start,
                };
                Self::step_later(dev, streams[0], now);
            }
            Task::ModelEndGraph(m) => {
                let model = dev.models.get_mut(m.model as usize).ok_or_else(|| {
                    Self::bad(
                        at,
                        "ModelEndGraph",
                        "model",
                        format!("model {} was never loaded", m.model),
                    )
                })?;
                model.end_requested = true;
                Self::control_done(dev, at);
            }
        }
        Ok(())
    }

    fn wake_event_waiters<S: TraceSink>(dev: &mut Device<S>, event: u32) {
        for sid in 0..dev.streams.len() {
            if let StreamState::WaitEvent {
                index,
                event: e,
                since,
            } = dev.streams[sid].state
            {
                if e == event && dev.events[event as usize] {
                    dev.events[event as usize] = false;
                    dev.streams[sid].state = StreamState::Running {
                        index,
                        kind: TaskKind::StreamWaitEvent,
                        start: since,
                    };
                    Self::control_done(
                        dev,
                        TaskRef {
                            stream: sid as u32,
                            index,
                        },
                    );
                }
            }
        }
    }

    /// The task index a label marks, which must be in the same model stream.
    fn label_target<S: TraceSink>(
        dev: &Device<S>,
        at: TaskRef,
        kind: &'static str,
        field: &'static str,
        label: u32,
    ) -> Result<u32, DeviceError> {
        let binding = dev.labels.get(label as usize).ok_or_else(|| {
            Self::bad(
                at,
                kind,
                field,
                format!(
                    "label {label} is out of range ({} labels exist)",
                    dev.labels.len()
                ),
            )
        })?;
        let (s, i) = binding.ok_or_else(|| {
            Self::bad(
                at,
                kind,
                field,
                format!("label {label} is not set in any loaded model"),
            )
        })?;
        if s != at.stream {
            return Err(Self::bad(
                at,
                kind,
                field,
                format!(
                    "label {label} is set on stream {s}; a jump stays within its stream {}",
                    at.stream
                ),
            ));
        }
        Ok(i)
    }

    /// `LabelSwitchByIndex`: an index at or past `max` (MapIndex's -1 reads as 0xffffffff) goes
    /// to the last label, as `aclrtSwitchLabelByIndex` does.
    fn label_switch<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        sw: &LabelSwitchByIndex,
    ) -> Result<(), DeviceError> {
        const K: &str = "LabelSwitchByIndex";
        if sw.max == 0 {
            return Err(Self::bad(
                at,
                K,
                "max",
                "the label list must hold at least one label".into(),
            ));
        }
        let index = Self::read_u32(dev, at, K, "index_ptr", sw.index_ptr)?;
        Self::check_device_range(
            dev,
            at,
            K,
            "label_list",
            sw.label_list,
            u64::from(sw.max) * 4,
        )?;
        let chosen = if index >= sw.max { sw.max - 1 } else { index };
        let label = Self::read_u32(
            dev,
            at,
            K,
            "label_list",
            sw.label_list + u64::from(chosen) * 4,
        )?;
        let target = Self::label_target(dev, at, K, "label_list", label)?;
        dev.sched.jumps.insert(at.stream, target);
        let note = if index >= sw.max {
            format!(
                "index {} ({}) is out of range [0, {}): last label {label}",
                index as i32, index, sw.max
            )
        } else {
            format!("index {index}: label {label}")
        };
        Self::trace_instant(dev, at, "label_switch", chosen, note);
        Self::control_done(dev, at);
        Ok(())
    }

    /// Starts a model stream from its first task (no effect on a stream already running).
    fn activate<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        kind: &'static str,
        target: u32,
    ) -> Result<(), DeviceError> {
        let s = dev.streams.get(target as usize).ok_or_else(|| {
            Self::bad(
                at,
                kind,
                "stream",
                format!("stream {target} does not exist"),
            )
        })?;
        if s.kind == StreamKind::User {
            return Err(Self::bad(
                at,
                kind,
                "stream",
                format!("stream {target} is a user stream; only model streams are activated"),
            ));
        }
        if s.state == StreamState::Idle {
            let now = dev.chip.now();
            let st = &mut dev.streams[target as usize];
            st.pos = 0;
            st.ready_at = now;
            Self::step_later(dev, target, now);
        }
        Ok(())
    }

    // ---- AI core kernels -----------------------------------------------------------------------

    /// The chip kernel id and "needs values" flag of the image at `addr`, decoding it from device
    /// memory the first time.
    fn resolve_kernel<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        addr: u64,
    ) -> Result<(usize, bool), DeviceError> {
        if let Some(e) = dev.kernels.get(&addr) {
            return Ok((e.chip_id, e.needs_values));
        }
        const K: &str = "AiCoreKernel";
        let cap = dev.chip.memory().capacity();
        if addr
            .checked_add(KERNEL_HEADER_BYTES)
            .is_none_or(|e| e > cap)
        {
            return Err(Self::bad(
                at,
                K,
                "kernel",
                format!("kernel pointer {addr:#x} is outside device memory ({cap} bytes)"),
            ));
        }
        let mut header = [0u8; KERNEL_HEADER_BYTES as usize];
        dev.chip.read_mem(addr, &mut header)?;
        if header[..8] != KERNEL_MAGIC {
            return Err(Self::bad(
                at,
                K,
                "kernel",
                format!("no kernel image at {addr:#x} (bad magic)"),
            ));
        }
        let count = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        let flags = u32::from_le_bytes([header[12], header[13], header[14], header[15]]);
        if count == 0 || count > MAX_KERNEL_INSTRUCTIONS {
            return Err(Self::bad(
                at,
                K,
                "kernel",
                format!(
                    "kernel image at {addr:#x} claims {count} instructions (expected 1..={MAX_KERNEL_INSTRUCTIONS})"
                ),
            ));
        }
        let len = u64::from(count) * gearsim_isa::WORD_BYTES as u64;
        Self::check_device_range(dev, at, K, "kernel", addr + KERNEL_HEADER_BYTES, len)?;
        let mut words = vec![0u8; len as usize];
        dev.chip.read_mem(addr + KERNEL_HEADER_BYTES, &mut words)?;
        let name = dev
            .kernel_names
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| format!("kernel@{addr:#x}"));
        let program = Program::decode(Some(name.clone()), &words)
            .map_err(|e| Self::bad(at, K, "kernel", format!("kernel image at {addr:#x}: {e}")))?;
        let chip_id = dev
            .chip
            .load_kernel(Kernel::new(program))
            .map_err(|e| Self::bad(at, K, "kernel", e.to_string()))?;
        let needs_values = flags & KERNEL_NEEDS_VALUES != 0;
        dev.kernels.insert(
            addr,
            KernelEntry {
                chip_id,
                needs_values,
            },
        );
        dev.kernel_names.insert(addr, name);
        Ok((chip_id, needs_values))
    }

    /// Hands pending blocks to free cores, one per dispatch slot, oldest kernel first.
    fn dispatch_blocks<S: TraceSink>(dev: &mut Device<S>) -> Result<(), DeviceError> {
        let now = dev.chip.now();
        let dispatch = ns(dev.cfg.scheduler.block_dispatch_ns);
        let ids: Vec<u32> = dev.sched.runs.keys().copied().collect();
        for id in ids {
            while let Some(run) = dev.sched.runs.get(&id) {
                if run.next_block >= run.block_dim {
                    break;
                }
                let free = (0..dev.sched.core_run.len() as u32).find(|&c| {
                    dev.sched.core_run[c as usize].is_none() && dev.chip.core_free_at(c).is_some()
                });
                let Some(core) = free else { return Ok(()) };
                let free_at = dev.chip.core_free_at(core).unwrap_or(now);
                let start = now.max(run.ready_at).max(free_at).max(dev.sched.block_slot);
                let launch = BlockLaunch {
                    kernel: run.chip_kernel,
                    block_idx: run.next_block,
                    block_dim: run.block_dim,
                    args: run.args,
                    mode: run.mode,
                };
                dev.chip.start_block(core, launch, start)?;
                dev.sched.block_slot = start + dispatch;
                dev.sched.core_run[core as usize] = Some(id);
                if let Some(run) = dev.sched.runs.get_mut(&id) {
                    run.next_block += 1;
                    run.first_start.get_or_insert(start);
                    run.cores[core as usize] = true;
                }
            }
        }
        Ok(())
    }

    fn block_finished<S: TraceSink>(
        dev: &mut Device<S>,
        core: u32,
        at: Tick,
    ) -> Result<(), DeviceError> {
        let Some(id) = dev
            .sched
            .core_run
            .get_mut(core as usize)
            .and_then(Option::take)
        else {
            return Ok(());
        };
        let finished = match dev.sched.runs.get_mut(&id) {
            Some(run) => {
                run.done += 1;
                run.end = run.end.max(at);
                run.done == run.block_dim
            }
            None => false,
        };
        if finished {
            if let Some(run) = dev.sched.runs.remove(&id) {
                dev.sched.last_run = Some(RunSummary {
                    first_start: run.first_start,
                    end: run.end,
                    cores_used: run.cores.iter().filter(|c| **c).count() as u32,
                });
                dev.timer(
                    run.end,
                    Fw::Done {
                        stream: run.task.stream,
                        index: run.task.index,
                    },
                );
            }
        }
        Self::dispatch_blocks(dev)
    }

    // ---- AI CPU kernels ------------------------------------------------------------------------

    fn aicpu_start<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        kernel: u32,
        args: u64,
        size: u32,
    ) -> Result<(), DeviceError> {
        const K: &str = "AiCpuKernel";
        let id = AiCpuKernelId::from_u32(kernel).ok_or_else(|| {
            Self::bad(at, K, "kernel", format!("unknown AI CPU kernel {kernel} (expected 1 MapIndex, 2 GetDynamicDims, 3 GetNext)"))
        })?;
        Self::check_device_range(dev, at, K, "args", args, u64::from(size))?;
        let mut block = vec![0u8; size as usize];
        dev.chip.read_mem(args, &mut block)?;
        let param = |message: String| DeviceError::KernelParam {
            task: at,
            kernel: id.name(),
            message,
        };
        let (bytes, cycles, effect) = match id {
            AiCpuKernelId::MapIndex => {
                let a = MapIndexArgs::decode(&block).map_err(param)?;
                let lim = &dev.cfg.kernels;
                a.shape
                    .check(lim.map_index_max_gears, lim.map_index_max_dims)
                    .map_err(param)?;
                let read = |dev: &Device<S>,
                            field: &str,
                            addr: u64,
                            count: u64|
                 -> Result<Vec<i32>, DeviceError> {
                    let mut b = vec![0u8; (count * 4) as usize];
                    dev.chip.read_mem(addr, &mut b).map_err(|e| {
                        param(format!(
                            "`{field}` range [{addr:#x}, +{}) is outside device memory ({} bytes)",
                            count * 4,
                            e.capacity
                        ))
                    })?;
                    Ok(b.chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect())
                };
                let x = read(dev, "x", a.x, u64::from(a.shape.n))?;
                let table = read(
                    dev,
                    "table",
                    a.table,
                    a.shape.layout.table_len(a.shape.gears, a.shape.n),
                )?;
                let level = if a.level_index != 0 {
                    Some(read(
                        dev,
                        "level_index",
                        a.level_index,
                        u64::from(a.shape.gears),
                    )?)
                } else {
                    None
                };
                let work = map_index::run_aicpu(
                    &x,
                    &table,
                    a.shape.gears,
                    a.shape.layout,
                    level.as_deref(),
                )
                .map_err(param)?;
                if dev.chip.memory().check(a.y, 4).is_err() {
                    return Err(param(format!(
                        "`y` address {:#x} is outside device memory",
                        a.y
                    )));
                }
                (
                    work.bytes_read,
                    work.compares * dev.cfg.aicpu.cycles_per_element,
                    Effect::Write(vec![(a.y, work.result.to_le_bytes().to_vec())]),
                )
            }
            AiCpuKernelId::GetDynamicDims => {
                let a = GetDynamicDimsArgs::decode(&block).map_err(param)?;
                let mut shapes = Vec::with_capacity(a.shapes.len());
                for (i, &p) in a.shapes.iter().enumerate() {
                    let mut b = vec![0u8; kernels::SHAPE_TENSOR_BYTES as usize];
                    dev.chip.read_mem(p, &mut b).map_err(|_| {
                        param(format!(
                            "shape tensor {i} at {p:#x} is outside device memory"
                        ))
                    })?;
                    shapes.push(
                        kernels::decode_shape(&b)
                            .map_err(|e| param(format!("shape tensor {i}: {e}")))?,
                    );
                }
                let dims = kernels::get_dynamic_dims(a.n, &a.shape_info, &shapes).map_err(param)?;
                let out: Vec<u8> = if a.out_i64 {
                    dims.iter().flat_map(|d| d.to_le_bytes()).collect()
                } else {
                    dims.iter()
                        .flat_map(|d| (*d as i32).to_le_bytes())
                        .collect()
                };
                if dev.chip.memory().check(a.out, out.len() as u64).is_err() {
                    return Err(param(format!(
                        "output range [{:#x}, +{}) is outside device memory",
                        a.out,
                        out.len()
                    )));
                }
                let bytes = shapes.len() as u64 * kernels::SHAPE_TENSOR_BYTES;
                let cycles = a.shape_info.len() as u64 * dev.cfg.aicpu.cycles_per_element;
                (bytes, cycles, Effect::Write(vec![(a.out, out)]))
            }
            AiCpuKernelId::GetNext => {
                let a = GetNextArgs::decode(&block).map_err(param)?;
                let queue = dev
                    .queues
                    .get(a.queue as usize)
                    .ok_or_else(|| param(format!("data queue {} does not exist", a.queue)))?;
                let Some(item) = queue.ready.front() else {
                    let now = dev.chip.now();
                    let deadline = (a.timeout_us > 0).then(|| now + ns(a.timeout_us * 1000));
                    dev.streams[at.stream as usize].state = StreamState::WaitQueue {
                        index: at.index,
                        queue: a.queue,
                        since: now,
                        deadline,
                        args,
                        args_size: size,
                    };
                    if let Some(d) = deadline {
                        dev.timer(
                            d,
                            Fw::QueueTimeout {
                                stream: at.stream,
                                index: at.index,
                            },
                        );
                    }
                    return Ok(());
                };
                if item.len() != a.outputs.len() {
                    return Err(param(format!(
                        "the queue item has {} tensors, the task has {} outputs",
                        item.len(),
                        a.outputs.len()
                    )));
                }
                let mut copies = Vec::new();
                let mut shapes = Vec::new();
                let mut free = Vec::new();
                let mut bytes = 0;
                for (i, ((staged, len, dims), out)) in item.iter().zip(&a.outputs).enumerate() {
                    if *len > out.capacity {
                        return Err(param(format!(
                            "output {i}: the tensor is {len} bytes, the output holds {}",
                            out.capacity
                        )));
                    }
                    for (field, addr, n) in [
                        ("data", out.data, *len),
                        ("shape", out.shape, kernels::SHAPE_TENSOR_BYTES),
                    ] {
                        if dev.chip.memory().check(addr, n).is_err() {
                            return Err(param(format!(
                                "output {i} {field} range [{addr:#x}, +{n}) is outside device memory"
                            )));
                        }
                    }
                    copies.push((out.data, *staged, *len));
                    shapes.push((out.shape, kernels::encode_shape(dims)));
                    free.push(*staged);
                    bytes += 2 * len;
                }
                let q = &mut dev.queues[a.queue as usize];
                q.ready.pop_front();
                let depth = q.ready.len() + q.pending as usize;
                Self::trace_queue(dev, a.queue, depth, "pop");
                (
                    bytes,
                    a.outputs.len() as u64 * dev.cfg.aicpu.cycles_per_element,
                    Effect::GetNext {
                        copies,
                        shapes,
                        free,
                    },
                )
            }
        };
        let job = dev.sched.next_job;
        dev.sched.next_job += 1;
        dev.sched.aicpu_jobs.insert(
            job,
            AiCpuJob {
                task: at,
                kernel: id,
                bytes,
                cycles,
                effect,
                cpu: 0,
                start: Tick::ZERO,
            },
        );
        dev.sched.aicpu_wait.push_back(job);
        Self::aicpu_dispatch(dev);
        Ok(())
    }

    fn aicpu_dispatch<S: TraceSink>(dev: &mut Device<S>) {
        while let Some(&job) = dev.sched.aicpu_wait.front() {
            let Some(cpu) = dev.sched.aicpu_busy.iter().position(|b| !b) else {
                return;
            };
            dev.sched.aicpu_wait.pop_front();
            dev.sched.aicpu_busy[cpu] = true;
            let now = dev.chip.now();
            if let Some(j) = dev.sched.aicpu_jobs.get_mut(&job) {
                j.cpu = cpu;
                j.start = now;
            }
            dev.timer(now + ns(dev.cfg.aicpu.launch_ns), Fw::AiCpuLaunched { job });
        }
    }

    fn aicpu_memory_phase<S: TraceSink>(dev: &mut Device<S>, job: u32) -> Result<(), DeviceError> {
        let bytes = dev.sched.aicpu_jobs.get(&job).map_or(0, |j| j.bytes);
        if bytes == 0 {
            return Self::aicpu_compute_phase(dev, job);
        }
        let cap = dev.cfg.aicpu.mem_bytes_per_cycle * dev.cfg.aicpu.clock_mhz * 1_000_000;
        let token = dev.sched.transfer_token(Xfer::AiCpu(job));
        dev.chip.start_transfer(token, bytes, cap, false);
        Ok(())
    }

    fn aicpu_compute_phase<S: TraceSink>(dev: &mut Device<S>, job: u32) -> Result<(), DeviceError> {
        let cycles = dev.sched.aicpu_jobs.get(&job).map_or(0, |j| j.cycles);
        let ps = (u128::from(cycles) * 1_000_000).div_ceil(u128::from(dev.cfg.aicpu.clock_mhz));
        let t = dev.chip.now() + Tick(u64::try_from(ps).unwrap_or(u64::MAX));
        dev.timer(t, Fw::AiCpuComputed { job });
        Ok(())
    }

    fn aicpu_finish<S: TraceSink>(dev: &mut Device<S>, job: u32) -> Result<(), DeviceError> {
        let Some(j) = dev.sched.aicpu_jobs.remove(&job) else {
            return Ok(());
        };
        Self::apply(dev, j.effect)?;
        dev.sched.aicpu_busy[j.cpu] = false;
        let now = dev.chip.now();
        Self::trace_aicpu(dev, j.cpu, j.kernel.name(), j.task, j.start, now);
        Self::aicpu_dispatch(dev);
        Self::done(dev, j.task.stream, j.task.index)
    }

    fn apply<S: TraceSink>(dev: &mut Device<S>, effect: Effect) -> Result<(), DeviceError> {
        match effect {
            Effect::None => {}
            Effect::Write(writes) => {
                for (addr, data) in writes {
                    dev.chip.write_mem(addr, &data)?;
                }
            }
            Effect::Copy { dst, src, size } => {
                let mut buf = vec![0u8; size as usize];
                dev.chip.read_mem(src, &mut buf)?;
                dev.chip.write_mem(dst, &buf)?;
            }
            Effect::Fill { dst, size, value } => dev.chip.fill_mem(dst, size, value)?,
            Effect::GetNext {
                copies,
                shapes,
                free,
            } => {
                for (dst, src, len) in copies {
                    let mut buf = vec![0u8; len as usize];
                    dev.chip.read_mem(src, &mut buf)?;
                    dev.chip.write_mem(dst, &buf)?;
                }
                for (addr, bytes) in shapes {
                    dev.chip.write_mem(addr, &bytes)?;
                }
                for p in free {
                    dev.heap.free(p)?;
                }
            }
        }
        Ok(())
    }

    // ---- copies ----------------------------------------------------------------------------------

    fn memcpy<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        kind: MemcpyKind,
        dst: u64,
        src: u64,
        size: u64,
    ) -> Result<(), DeviceError> {
        const K: &str = "Memcpy";
        let host = |dev: &Device<S>, field: &'static str, addr: u64| {
            dev.host
                .check(addr, size)
                .map_err(|m| Self::bad(at, K, field, m))
        };
        match kind {
            MemcpyKind::HostToDevice => {
                host(dev, "src", src)?;
                Self::check_device_range(dev, at, K, "dst", dst, size)?;
                Self::pcie_submit(
                    dev,
                    H2D,
                    size,
                    PcieFor::Task {
                        task: at,
                        host_to_device: true,
                        dst,
                        src,
                    },
                );
            }
            MemcpyKind::DeviceToHost => {
                Self::check_device_range(dev, at, K, "src", src, size)?;
                host(dev, "dst", dst)?;
                Self::pcie_submit(
                    dev,
                    D2H,
                    size,
                    PcieFor::Task {
                        task: at,
                        host_to_device: false,
                        dst,
                        src,
                    },
                );
            }
            MemcpyKind::DeviceToDevice => {
                Self::check_device_range(dev, at, K, "src", src, size)?;
                Self::check_device_range(dev, at, K, "dst", dst, size)?;
                let token = dev.sched.transfer_token(Xfer::Sdma {
                    task: at,
                    effect: Effect::Copy { dst, src, size },
                });
                let cap = dev.cfg.scheduler.sdma_bytes_per_second;
                // A copy reads and writes every byte.
                dev.chip.start_transfer(token, 2 * size, cap, false);
            }
        }
        Ok(())
    }

    fn pcie_submit<S: TraceSink>(dev: &mut Device<S>, dir: usize, bytes: u64, purpose: PcieFor) {
        let job = dev.sched.next_job;
        dev.sched.next_job += 1;
        dev.sched.pcie_jobs.insert(
            job,
            PcieJob {
                dir,
                bytes,
                purpose,
                start: Tick::ZERO,
            },
        );
        dev.sched.pcie[dir].fifo.push_back(job);
        Self::pcie_next(dev, dir);
    }

    fn pcie_next<S: TraceSink>(dev: &mut Device<S>, dir: usize) {
        if dev.sched.pcie[dir].busy {
            return;
        }
        let Some(job) = dev.sched.pcie[dir].fifo.pop_front() else {
            return;
        };
        dev.sched.pcie[dir].busy = true;
        let now = dev.chip.now();
        if let Some(j) = dev.sched.pcie_jobs.get_mut(&job) {
            j.start = now;
        }
        dev.timer(now + ns(dev.cfg.pcie.latency_ns), Fw::PcieData { job });
    }

    fn transfer_done<S: TraceSink>(dev: &mut Device<S>, x: Xfer) -> Result<(), DeviceError> {
        match x {
            Xfer::AiCpu(job) => Self::aicpu_compute_phase(dev, job),
            Xfer::Sdma { task, effect } => {
                Self::apply(dev, effect)?;
                Self::done(dev, task.stream, task.index)
            }
            Xfer::Pcie(job) => {
                let Some(j) = dev.sched.pcie_jobs.remove(&job) else {
                    return Ok(());
                };
                let now = dev.chip.now();
                Self::trace_pcie(dev, j.dir, j.bytes, j.start, now);
                dev.sched.pcie[j.dir].busy = false;
                Self::pcie_next(dev, j.dir);
                match j.purpose {
                    PcieFor::Task {
                        task,
                        host_to_device,
                        dst,
                        src,
                    } => {
                        let mut buf = vec![0u8; j.bytes as usize];
                        if host_to_device {
                            dev.host
                                .read(src, &mut buf)
                                .map_err(DeviceError::HostMemory)?;
                            dev.chip.write_mem(dst, &buf)?;
                        } else {
                            dev.chip.read_mem(src, &mut buf)?;
                            dev.host.write(dst, &buf).map_err(DeviceError::HostMemory)?;
                        }
                        Self::done(dev, task.stream, task.index)
                    }
                    PcieFor::QueueItem { item, dst, data } => {
                        dev.chip.write_mem(dst, &data)?;
                        Self::item_progress(dev, item)
                    }
                }
            }
        }
    }

    // ---- data queues -----------------------------------------------------------------------------

    pub(crate) fn enqueue_item<S: TraceSink>(
        dev: &mut Device<S>,
        queue: u32,
        tensors: Vec<crate::device::HostTensor>,
        staged: Vec<(u64, u64, Vec<i64>)>,
    ) {
        let item = dev.sched.next_item;
        dev.sched.next_item += 1;
        dev.sched.items.insert(
            item,
            StagedItem {
                queue,
                remaining: staged.len() as u32,
                tensors: staged.clone(),
            },
        );
        if staged.is_empty() {
            // Nothing to copy: the item is ready now (an error here cannot occur, the item exists).
            let _ = Self::item_progress(dev, item);
            return;
        }
        for (t, (dst, len, _)) in tensors.into_iter().zip(&staged) {
            Self::pcie_submit(
                dev,
                H2D,
                *len,
                PcieFor::QueueItem {
                    item,
                    dst: *dst,
                    data: t.data,
                },
            );
        }
    }

    fn item_progress<S: TraceSink>(dev: &mut Device<S>, item: u32) -> Result<(), DeviceError> {
        let Some(it) = dev.sched.items.get_mut(&item) else {
            return Ok(());
        };
        it.remaining = it.remaining.saturating_sub(1);
        if it.remaining > 0 && !it.tensors.is_empty() {
            return Ok(());
        }
        let Some(it) = dev.sched.items.remove(&item) else {
            return Ok(());
        };
        let q = &mut dev.queues[it.queue as usize];
        q.pending -= 1;
        q.ready.push_back(it.tensors);
        let depth = q.ready.len() + q.pending as usize;
        Self::trace_queue(dev, it.queue, depth, "ready");
        // Wake the first GetNext waiting on this queue.
        for sid in 0..dev.streams.len() {
            if let StreamState::WaitQueue {
                index,
                queue,
                args,
                args_size,
                since,
                ..
            } = dev.streams[sid].state
            {
                if queue == it.queue {
                    dev.streams[sid].state = StreamState::Running {
                        index,
                        kind: TaskKind::AiCpuKernel,
                        start: since,
                    };
                    return Self::aicpu_start(
                        dev,
                        TaskRef {
                            stream: sid as u32,
                            index,
                        },
                        AiCpuKernelId::GetNext as u32,
                        args,
                        args_size,
                    );
                }
            }
        }
        Ok(())
    }

    // ---- trace ------------------------------------------------------------------------------------

    fn name<S: TraceSink>(dev: &mut Device<S>, s: &str) -> StrId {
        if let Some(id) = dev.lanes.names.get(s) {
            return *id;
        }
        let id = dev.chip.sink_mut().intern(s);
        dev.lanes.names.insert(s.to_string(), id);
        id
    }

    fn lane<S: TraceSink>(
        dev: &mut Device<S>,
        process: &str,
        thread: String,
        kind: LaneKind,
    ) -> LaneId {
        dev.chip.sink_mut().lane(Lane {
            process: process.to_string(),
            thread,
            kind,
        })
    }

    fn stream_lane<S: TraceSink>(dev: &mut Device<S>, stream: u32) -> LaneId {
        if let Some(l) = dev.streams[stream as usize].lane {
            return l;
        }
        let thread = match dev.streams[stream as usize].kind {
            StreamKind::User => format!("stream {stream}"),
            StreamKind::Model(m) => format!("stream {stream} (model {m})"),
        };
        let l = Self::lane(dev, "streams", thread, LaneKind::Stream);
        dev.streams[stream as usize].lane = Some(l);
        l
    }

    fn detail<S: TraceSink>(dev: &mut Device<S>, at: TaskRef, kind: TaskKind) -> StrId {
        let name = dev.streams[at.stream as usize]
            .names
            .get(&at.index)
            .cloned();
        let text = match name {
            Some(n) => format!("{at}: {} {n}", kind.name()),
            None => format!("{at}: {}", kind.name()),
        };
        dev.chip.sink_mut().intern(&text)
    }

    fn trace_fetch<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        kind: TaskKind,
        start: Tick,
        end: Tick,
    ) {
        if !dev.chip.sink_mut().enabled() {
            return;
        }
        let lane = match dev.lanes.scheduler {
            Some(l) => l,
            None => {
                let l = Self::lane(dev, "scheduler", "HWTS".into(), LaneKind::Scheduler);
                dev.lanes.scheduler = Some(l);
                l
            }
        };
        let name = Self::name(dev, "fetch");
        let detail = Self::detail(dev, at, kind);
        dev.chip.sink_mut().record(Record::Span {
            lane,
            name,
            start: start.0,
            end: end.0,
            pc: at.index,
            detail,
        });
    }

    fn trace_task<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        kind: TaskKind,
        start: Tick,
        end: Tick,
    ) {
        if !dev.chip.sink_mut().enabled() {
            return;
        }
        let lane = Self::stream_lane(dev, at.stream);
        let name = Self::name(dev, kind.name());
        let detail = Self::detail(dev, at, kind);
        dev.chip.sink_mut().record(Record::Span {
            lane,
            name,
            start: start.0,
            end: end.0.max(start.0),
            pc: at.index,
            detail,
        });
    }

    fn trace_instant<S: TraceSink>(
        dev: &mut Device<S>,
        at: TaskRef,
        name: &str,
        arg: u32,
        note: String,
    ) {
        if !dev.chip.sink_mut().enabled() {
            return;
        }
        let lane = Self::stream_lane(dev, at.stream);
        let name = Self::name(dev, name);
        let detail = dev.chip.sink_mut().intern(&format!("{at}: {note}"));
        let t = dev.chip.now().0;
        dev.chip.sink_mut().record(Record::Instant {
            lane,
            name,
            at: t,
            arg,
            detail,
        });
    }

    fn trace_aicpu<S: TraceSink>(
        dev: &mut Device<S>,
        cpu: usize,
        kernel: &str,
        at: TaskRef,
        start: Tick,
        end: Tick,
    ) {
        if !dev.chip.sink_mut().enabled() {
            return;
        }
        let lane = match dev.lanes.aicpu.get(&cpu) {
            Some(l) => *l,
            None => {
                let l = Self::lane(dev, "aicpu", format!("aicpu {cpu}"), LaneKind::AiCpu);
                dev.lanes.aicpu.insert(cpu, l);
                l
            }
        };
        let name = Self::name(dev, kernel);
        let detail = dev.chip.sink_mut().intern(&format!("{at}: {kernel}"));
        dev.chip.sink_mut().record(Record::Span {
            lane,
            name,
            start: start.0,
            end: end.0,
            pc: at.index,
            detail,
        });
    }

    fn trace_pcie<S: TraceSink>(
        dev: &mut Device<S>,
        dir: usize,
        bytes: u64,
        start: Tick,
        end: Tick,
    ) {
        if !dev.chip.sink_mut().enabled() {
            return;
        }
        let lane = match dev.lanes.pcie[dir] {
            Some(l) => l,
            None => {
                let l = Self::lane(
                    dev,
                    "pcie",
                    if dir == H2D { "H2D" } else { "D2H" }.into(),
                    LaneKind::Pcie,
                );
                dev.lanes.pcie[dir] = Some(l);
                l
            }
        };
        let name = Self::name(dev, if dir == H2D { "h2d" } else { "d2h" });
        let detail = dev.chip.sink_mut().intern(&format!("{bytes} bytes"));
        dev.chip.sink_mut().record(Record::Span {
            lane,
            name,
            start: start.0,
            end: end.0,
            pc: 0,
            detail,
        });
    }

    fn trace_queue<S: TraceSink>(dev: &mut Device<S>, queue: u32, depth: usize, what: &str) {
        if !dev.chip.sink_mut().enabled() {
            return;
        }
        let lane = match dev.queues[queue as usize].lane {
            Some(l) => l,
            None => {
                let l = Self::lane(dev, "queues", format!("queue {queue}"), LaneKind::Queue);
                dev.queues[queue as usize].lane = Some(l);
                l
            }
        };
        let depth_name = Self::name(dev, "depth");
        let name = Self::name(dev, what);
        let t = dev.chip.now().0;
        let sink = dev.chip.sink_mut();
        sink.record(Record::Counter {
            lane,
            name: depth_name,
            at: t,
            value: depth as i64,
        });
        sink.record(Record::Instant {
            lane,
            name,
            at: t,
            arg: depth as u32,
            detail: StrId::EMPTY,
        });
    }
}
