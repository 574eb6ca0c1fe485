//! The device: a chip plus everything the firmware keeps about it — device and host memory,
//! streams, events, labels, models, data queues and the kernel images in device memory — and
//! the host-facing API. The scheduler that runs the streams is in `scheduler.rs`.

use std::collections::{BTreeMap, VecDeque};

use gearsim_isa::Program;
use gearsim_isa::task::{Task, TaskDescriptor, TaskKind};
use gearsim_sim::{Chip, ChipConfig, CoreStats, ExecMode, Kernel, LANES, Tick};
use gearsim_traces::{LaneId, TraceSink};
use zerocopy::IntoBytes;

use crate::error::{DeviceError, TaskRef};
use crate::kernels::SHAPE_TENSOR_BYTES;
use crate::memory::{Allocator, HostMemory, RESERVED_LOW};
use crate::scheduler::{Fw, Lanes, Scheduler};

/// A device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

/// A host address (in the simulated host's memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPtr(pub u64);

macro_rules! ids {
    ($($(#[$m:meta])* $name:ident),*) => {$(
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);
    )*};
}
ids! {
    /// A stream.
    StreamId,
    /// An event.
    EventId,
    /// A label.
    LabelId,
    /// A data queue feeding GetNext.
    QueueId,
    /// A loaded model.
    ModelId
}

/// A kernel image in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelHandle {
    /// Device address of the image.
    pub addr: DevicePtr,
}

/// Magic bytes at the start of a kernel image.
pub const KERNEL_MAGIC: [u8; 8] = *b"GEARKRN\0";
/// Size of a kernel image's header: magic, instruction count (u32), flags (u32).
pub const KERNEL_HEADER_BYTES: u64 = 16;
/// Kernel image flag: the kernel's control flow depends on computed values, so it always runs
/// in full mode (MapIndex scans the bits its vector compare produced).
pub const KERNEL_NEEDS_VALUES: u32 = 1;
/// Longest kernel image the scheduler decodes.
pub const MAX_KERNEL_INSTRUCTIONS: u32 = 1 << 20;

/// A tensor a host hands to a data queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTensor {
    /// Its bytes.
    pub data: Vec<u8>,
    /// Its runtime shape.
    pub dims: Vec<i64>,
}

/// What a kernel launch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchReport {
    /// Blocks run.
    pub blocks: u32,
    /// Distinct cores used.
    pub cores_used: u32,
    /// When the launch was submitted.
    pub submitted: Tick,
    /// When the first block started.
    pub first_start: Tick,
    /// When the last block finished.
    pub end: Tick,
    /// Per-core statistics accumulated during this launch (cores the launch did not use are zero).
    pub core_stats: Vec<CoreStats>,
}

impl LaunchReport {
    /// Busy cycles of each pipe (in [`gearsim_isa::Pipe::EXECUTING`] order) summed over cores.
    pub fn busy_cycles(&self) -> [u64; LANES] {
        let mut out = [0; LANES];
        for s in &self.core_stats {
            for (o, p) in out.iter_mut().zip(&s.pipes) {
                *o += p.busy_cycles;
            }
        }
        out
    }

    /// Instructions executed, summed over pipes and cores.
    pub fn instructions(&self) -> u64 {
        self.core_stats
            .iter()
            .flat_map(|s| s.pipes.iter())
            .map(|p| p.instructions)
            .sum()
    }

    /// Cube multiply-accumulates, summed over cores.
    pub fn cube_macs(&self) -> u64 {
        self.core_stats.iter().map(|s| s.cube_macs).sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamKind {
    User,
    Model(u32),
}

/// Where a stream stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamState {
    /// Nothing to run.
    Idle,
    /// A step (fetch of the next task) is scheduled.
    Stepping,
    /// A task is executing.
    Running {
        index: u32,
        kind: TaskKind,
        start: Tick,
    },
    /// Waiting for an event to be recorded.
    WaitEvent { index: u32, event: u32, since: Tick },
    /// GetNext waiting for its queue.
    WaitQueue {
        index: u32,
        queue: u32,
        since: Tick,
        deadline: Option<Tick>,
        args: u64,
        args_size: u32,
    },
    /// ModelExecute waiting for its model to end.
    WaitModel { index: u32, model: u32, start: Tick },
}

pub(crate) struct Stream {
    pub kind: StreamKind,
    /// Device address of the descriptor array.
    pub sq: u64,
    pub capacity: u32,
    /// User streams: tasks submitted so far (the ring holds `pos..submitted`).
    pub submitted: u32,
    /// Next task index to run.
    pub pos: u32,
    /// Model streams: the number of tasks.
    pub len: u32,
    pub names: BTreeMap<u32, String>,
    pub state: StreamState,
    pub lane: Option<LaneId>,
    /// Earliest time the next task may start (the end of the previous one).
    pub ready_at: Tick,
}

impl Stream {
    pub(crate) fn has_work(&self) -> bool {
        match self.kind {
            StreamKind::User => self.pos < self.submitted,
            StreamKind::Model(_) => self.pos < self.len,
        }
    }

    pub(crate) fn slot_addr(&self, index: u32) -> u64 {
        let slot = match self.kind {
            StreamKind::User => index % self.capacity,
            StreamKind::Model(_) => index,
        };
        self.sq + u64::from(slot) * gearsim_isa::task::TASK_BYTES as u64
    }
}

pub(crate) struct Model {
    pub streams: Vec<u32>,
    pub running: bool,
    pub end_requested: bool,
    pub waiter: Option<TaskRef>,
}

pub(crate) struct DataQueue {
    pub capacity: u32,
    /// Items whose copies to the device are still in flight.
    pub pending: u32,
    /// Items on the device, oldest first: per tensor (staging buffer, bytes, dims).
    pub ready: VecDeque<Vec<(u64, u64, Vec<i64>)>>,
    pub lane: Option<LaneId>,
}

pub(crate) struct KernelEntry {
    pub chip_id: usize,
    pub needs_values: bool,
}

/// A simulated device.
pub struct Device<S: TraceSink> {
    pub(crate) chip: Chip<S>,
    pub(crate) cfg: ChipConfig,
    pub(crate) heap: Allocator,
    pub(crate) host: HostMemory,
    pub(crate) streams: Vec<Stream>,
    pub(crate) events: Vec<bool>,
    pub(crate) labels: Vec<Option<(u32, u32)>>,
    pub(crate) queues: Vec<DataQueue>,
    pub(crate) models: Vec<Model>,
    pub(crate) kernels: BTreeMap<u64, KernelEntry>,
    pub(crate) kernel_names: BTreeMap<u64, String>,
    pub(crate) mode: ExecMode,
    pub(crate) sched: Scheduler,
    pub(crate) lanes: Lanes,
    pub(crate) stopped: Option<String>,
    default_stream: Option<StreamId>,
}

impl<S: TraceSink> Device<S> {
    /// A device over a fresh chip.
    pub fn new(cfg: ChipConfig, sink: S) -> Device<S> {
        let capacity = cfg.memory.hbm_bytes;
        let sched = Scheduler::new(&cfg);
        Device {
            chip: Chip::new(cfg.clone(), sink),
            heap: Allocator::new(RESERVED_LOW, capacity),
            host: HostMemory::default(),
            streams: Vec::new(),
            events: Vec::new(),
            labels: Vec::new(),
            queues: Vec::new(),
            models: Vec::new(),
            kernels: BTreeMap::new(),
            kernel_names: BTreeMap::new(),
            mode: ExecMode::Full,
            sched,
            lanes: Lanes::default(),
            stopped: None,
            default_stream: None,
            cfg,
        }
    }

    /// The chip.
    pub fn chip(&self) -> &Chip<S> {
        &self.chip
    }

    /// The chip, mutably.
    pub fn chip_mut(&mut self) -> &mut Chip<S> {
        &mut self.chip
    }

    /// Gives back the trace sink.
    pub fn into_sink(self) -> S {
        self.chip.into_sink()
    }

    /// Current device time.
    pub fn now(&self) -> Tick {
        self.chip.now()
    }

    /// Whether AI core kernels compute values or only times (kernels whose control flow needs
    /// values, such as MapIndex, always run in full mode).
    pub fn set_exec_mode(&mut self, mode: ExecMode) {
        self.mode = mode;
    }

    // ---- memory -------------------------------------------------------------------------------

    /// Allocates `bytes` of device memory (512-byte aligned).
    pub fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.heap.alloc(bytes).map(DevicePtr)
    }

    /// Frees a device allocation.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.heap.free(ptr.0)
    }

    /// Bytes of device memory allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.heap.used_bytes()
    }

    /// Writes device memory directly (zero time; timed copies are `Memcpy` tasks).
    pub fn write(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<(), DeviceError> {
        Ok(self.chip.write_mem(ptr.0, data)?)
    }

    /// Reads device memory directly (zero time).
    pub fn read(&self, ptr: DevicePtr, buf: &mut [u8]) -> Result<(), DeviceError> {
        Ok(self.chip.read_mem(ptr.0, buf)?)
    }

    /// Fills device memory with a byte value (zero time).
    pub fn fill(&mut self, ptr: DevicePtr, len: u64, byte: u8) -> Result<(), DeviceError> {
        Ok(self.chip.fill_mem(ptr.0, len, byte)?)
    }

    /// Allocates a host buffer (the source or destination of host<->device copies).
    pub fn host_alloc(&mut self, bytes: u64) -> Result<HostPtr, DeviceError> {
        self.host.alloc(bytes).map(HostPtr)
    }

    /// Frees a host buffer.
    pub fn host_free(&mut self, ptr: HostPtr) -> Result<(), DeviceError> {
        self.host.free(ptr.0)
    }

    /// Writes host memory.
    pub fn host_write(&mut self, ptr: HostPtr, data: &[u8]) -> Result<(), DeviceError> {
        self.host
            .write(ptr.0, data)
            .map_err(DeviceError::HostMemory)
    }

    /// Reads host memory.
    pub fn host_read(&self, ptr: HostPtr, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.host.read(ptr.0, buf).map_err(DeviceError::HostMemory)
    }

    fn limit(&self, what: &'static str, limit: u64, field: &'static str) -> DeviceError {
        DeviceError::Limit {
            what,
            limit,
            preset: self.cfg.name.clone(),
            field,
        }
    }

    // ---- kernels ------------------------------------------------------------------------------

    /// Writes a kernel image into device memory and registers it; returns its handle.
    pub fn load_kernel(&mut self, program: Program) -> Result<KernelHandle, DeviceError> {
        self.load_kernel_flags(program, 0)
    }

    /// Like [`Device::load_kernel`] with image flags ([`KERNEL_NEEDS_VALUES`]).
    pub fn load_kernel_flags(
        &mut self,
        program: Program,
        flags: u32,
    ) -> Result<KernelHandle, DeviceError> {
        let words = program.encode().map_err(|(pc, e)| {
            DeviceError::InvalidLaunch(format!("kernel instruction {pc}: {e}"))
        })?;
        let count = u32::try_from(program.instrs.len()).unwrap_or(u32::MAX);
        let mut image = Vec::with_capacity(KERNEL_HEADER_BYTES as usize + words.len());
        image.extend_from_slice(&KERNEL_MAGIC);
        image.extend_from_slice(&count.to_le_bytes());
        image.extend_from_slice(&flags.to_le_bytes());
        image.extend_from_slice(&words);
        let ptr = self.alloc(image.len() as u64)?;
        self.write(ptr, &image)?;
        let name = program.display_name().to_string();
        let chip_id = self.chip.load_kernel(Kernel::new(program))?;
        self.kernels.insert(
            ptr.0,
            KernelEntry {
                chip_id,
                needs_values: flags & KERNEL_NEEDS_VALUES != 0,
            },
        );
        self.kernel_names.insert(ptr.0, name);
        Ok(KernelHandle { addr: ptr })
    }

    /// The name of a loaded kernel.
    pub fn kernel_name(&self, k: KernelHandle) -> Option<&str> {
        self.kernel_names.get(&k.addr.0).map(String::as_str)
    }

    // ---- streams, events, labels, queues ------------------------------------------------------

    fn new_stream(&mut self, kind: StreamKind, tasks: u32) -> Result<u32, DeviceError> {
        let max = self.cfg.scheduler.max_streams;
        if self.streams.len() as u32 >= max {
            return Err(self.limit("streams", u64::from(max), "scheduler.max_streams"));
        }
        let capacity = match kind {
            StreamKind::User => self.cfg.scheduler.sq_depth,
            StreamKind::Model(_) => tasks.max(1),
        };
        let sq = self.alloc(u64::from(capacity) * gearsim_isa::task::TASK_BYTES as u64)?;
        self.streams.push(Stream {
            kind,
            sq: sq.0,
            capacity,
            submitted: 0,
            pos: 0,
            len: 0,
            names: BTreeMap::new(),
            state: StreamState::Idle,
            lane: None,
            ready_at: Tick::ZERO,
        });
        Ok(self.streams.len() as u32 - 1)
    }

    /// Creates a stream whose submission queue (`scheduler.sq_depth` descriptors) lives in
    /// device memory.
    pub fn create_stream(&mut self) -> Result<StreamId, DeviceError> {
        self.new_stream(StreamKind::User, 0).map(StreamId)
    }

    /// Creates an event.
    pub fn create_event(&mut self) -> Result<EventId, DeviceError> {
        let max = self.cfg.scheduler.max_events;
        if self.events.len() as u32 >= max {
            return Err(self.limit("events", u64::from(max), "scheduler.max_events"));
        }
        self.events.push(false);
        Ok(EventId(self.events.len() as u32 - 1))
    }

    /// Creates a label (bound to a position when a model containing its `LabelSet` is loaded).
    pub fn create_label(&mut self) -> Result<LabelId, DeviceError> {
        let max = self.cfg.scheduler.max_labels;
        if self.labels.len() as u32 >= max {
            return Err(self.limit("labels", u64::from(max), "scheduler.max_labels"));
        }
        self.labels.push(None);
        Ok(LabelId(self.labels.len() as u32 - 1))
    }

    /// Creates a data queue holding up to `capacity` items for GetNext.
    pub fn create_queue(&mut self, capacity: u32) -> Result<QueueId, DeviceError> {
        if capacity == 0 {
            return Err(DeviceError::InvalidLaunch(
                "a data queue needs a capacity of at least 1".into(),
            ));
        }
        self.queues.push(DataQueue {
            capacity,
            pending: 0,
            ready: VecDeque::new(),
            lane: None,
        });
        Ok(QueueId(self.queues.len() as u32 - 1))
    }

    /// Items a queue holds (on the device or still being copied there).
    pub fn queue_len(&self, q: QueueId) -> Option<u32> {
        self.queues
            .get(q.0 as usize)
            .map(|d| d.pending + d.ready.len() as u32)
    }

    /// Hands an item to a data queue: its tensors are copied to device staging buffers over
    /// PCIe (timed) and the item becomes visible to GetNext when the copies finish.
    pub fn enqueue(&mut self, q: QueueId, item: Vec<HostTensor>) -> Result<(), DeviceError> {
        self.check_running()?;
        let queue = self.queues.get(q.0 as usize).ok_or(DeviceError::NoSuch {
            what: "queue",
            id: u64::from(q.0),
        })?;
        if queue.pending + queue.ready.len() as u32 >= queue.capacity {
            return Err(DeviceError::QueueFull {
                queue: q.0,
                capacity: queue.capacity,
            });
        }
        let mut staged = Vec::with_capacity(item.len());
        for t in &item {
            if t.dims.len() > crate::kernels::MAX_RANK {
                return Err(DeviceError::InvalidLaunch(format!(
                    "queue {}: a tensor of rank {} exceeds the largest supported rank {}",
                    q.0,
                    t.dims.len(),
                    crate::kernels::MAX_RANK
                )));
            }
            let dev = self.alloc(t.data.len() as u64)?;
            staged.push((dev.0, t.data.len() as u64, t.dims.clone()));
        }
        self.queues[q.0 as usize].pending += 1;
        Scheduler::enqueue_item(self, q.0, item, staged);
        Ok(())
    }

    // ---- task submission ----------------------------------------------------------------------

    fn user_stream(&self, s: StreamId) -> Result<&Stream, DeviceError> {
        let st = self.streams.get(s.0 as usize).ok_or(DeviceError::NoSuch {
            what: "stream",
            id: u64::from(s.0),
        })?;
        if st.kind != StreamKind::User {
            return Err(DeviceError::InvalidLaunch(format!(
                "stream {} belongs to a model; submit to a user stream",
                s.0
            )));
        }
        Ok(st)
    }

    /// Submits a task to a user stream; returns its index in the stream. When the submission
    /// queue is full the device runs until a slot frees, as the runtime blocks the host.
    pub fn submit(
        &mut self,
        s: StreamId,
        task: Task,
        name: Option<&str>,
    ) -> Result<u32, DeviceError> {
        self.submit_descriptor(s, task.encode(0), name)
    }

    /// Submits a raw descriptor (for tests of bad input: it is decoded when the scheduler
    /// fetches it, and errors name the stream and task index).
    pub fn submit_descriptor(
        &mut self,
        s: StreamId,
        mut desc: TaskDescriptor,
        name: Option<&str>,
    ) -> Result<u32, DeviceError> {
        self.check_running()?;
        let cap = self.user_stream(s)?.capacity;
        let sid = s.0 as usize;
        if self.streams[sid].submitted - self.streams[sid].pos >= cap {
            self.run_until(|d| d.streams[sid].submitted - d.streams[sid].pos < cap)?;
        }
        let index = self.streams[sid].submitted;
        desc.task_id.set(index);
        let addr = self.streams[sid].slot_addr(index);
        self.chip.write_mem(addr, desc.as_bytes())?;
        let stream = &mut self.streams[sid];
        stream.submitted += 1;
        match name {
            Some(n) => {
                stream.names.insert(index, n.to_string());
            }
            None => {
                stream.names.remove(&index);
            }
        }
        if stream.state == StreamState::Idle {
            Scheduler::step_later(self, s.0, self.chip.now());
        }
        Ok(index)
    }

    /// Loads a model: each inner list becomes a model stream holding those tasks in device
    /// memory; the first is the head stream a `ModelExecute` task starts. `LabelSet` tasks bind
    /// their labels to their position.
    pub fn load_model(
        &mut self,
        streams: Vec<Vec<(Task, Option<String>)>>,
    ) -> Result<ModelId, DeviceError> {
        self.check_running()?;
        if streams.is_empty() {
            return Err(DeviceError::InvalidLaunch(
                "a model needs at least one stream".into(),
            ));
        }
        let model = self.models.len() as u32;
        let mut ids = Vec::with_capacity(streams.len());
        for tasks in &streams {
            let len = u32::try_from(tasks.len()).unwrap_or(u32::MAX);
            let max = self.cfg.scheduler.sq_depth;
            if len > max {
                return Err(self.limit(
                    "tasks in one stream",
                    u64::from(max),
                    "scheduler.sq_depth",
                ));
            }
            ids.push(self.new_stream(StreamKind::Model(model), len)?);
        }
        for (tasks, &sid) in streams.iter().zip(&ids) {
            for (i, (task, name)) in tasks.iter().enumerate() {
                let index = i as u32;
                let at = TaskRef { stream: sid, index };
                if let Task::LabelSet(l) = task {
                    let count = self.labels.len();
                    let slot =
                        self.labels
                            .get_mut(l.label as usize)
                            .ok_or(DeviceError::BadTask {
                                task: at,
                                kind: "LabelSet",
                                field: "label",
                                message: format!(
                                    "label {} was never created ({count} labels exist)",
                                    l.label
                                ),
                            })?;
                    if let Some((s0, i0)) = *slot {
                        return Err(DeviceError::BadTask {
                            task: at,
                            kind: "LabelSet",
                            field: "label",
                            message: format!(
                                "label {} is already set at stream {s0} task {i0}",
                                l.label
                            ),
                        });
                    }
                    *slot = Some((sid, index));
                }
                let stream = &mut self.streams[sid as usize];
                let addr = stream.slot_addr(index);
                stream.len = index + 1;
                if let Some(n) = name {
                    stream.names.insert(index, n.clone());
                }
                self.chip.write_mem(addr, task.encode(index).as_bytes())?;
            }
        }
        self.models.push(Model {
            streams: ids,
            running: false,
            end_requested: false,
            waiter: None,
        });
        Ok(ModelId(model))
    }

    /// Number of streams created so far (the next stream gets this id).
    pub fn stream_count(&self) -> u32 {
        self.streams.len() as u32
    }

    /// Number of models loaded so far (the next model gets this id).
    pub fn model_count(&self) -> u32 {
        self.models.len() as u32
    }

    /// The streams of a model, head first.
    pub fn model_streams(&self, m: ModelId) -> Option<Vec<StreamId>> {
        self.models
            .get(m.0 as usize)
            .map(|m| m.streams.iter().map(|&s| StreamId(s)).collect())
    }

    // ---- running ------------------------------------------------------------------------------

    pub(crate) fn check_running(&self) -> Result<(), DeviceError> {
        match &self.stopped {
            Some(why) => Err(DeviceError::InvalidLaunch(format!(
                "the device stopped earlier: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Runs until every task of stream `s` has finished.
    pub fn synchronize(&mut self, s: StreamId) -> Result<(), DeviceError> {
        self.user_stream(s)?;
        let sid = s.0 as usize;
        self.run_until(|d| d.streams[sid].state == StreamState::Idle && !d.streams[sid].has_work())
    }

    /// Runs until nothing is left to do.
    pub fn run_until_idle(&mut self) -> Result<(), DeviceError> {
        self.run_until(|_| false)
    }

    /// Runs the event loop until `done` holds (or, for a condition that never holds, until the
    /// device is idle).
    pub(crate) fn run_until(&mut self, done: impl Fn(&Self) -> bool) -> Result<(), DeviceError> {
        self.check_running()?;
        let result = Scheduler::run(self, &done);
        if let Err(e) = &result {
            self.stopped = Some(e.to_string());
        }
        result
    }

    /// The default stream (created on first use).
    pub fn default_stream(&mut self) -> Result<StreamId, DeviceError> {
        if let Some(s) = self.default_stream {
            return Ok(s);
        }
        let s = self.create_stream()?;
        self.default_stream = Some(s);
        Ok(s)
    }

    /// Launches an AI core kernel of `block_dim` blocks with the given argument values on the
    /// default stream and runs until it finishes.
    pub fn launch(
        &mut self,
        kernel: KernelHandle,
        block_dim: u32,
        args: &[u64],
        mode: ExecMode,
    ) -> Result<LaunchReport, DeviceError> {
        let max = self.cfg.scheduler.max_block_dim;
        if block_dim == 0 || block_dim > max {
            return Err(DeviceError::InvalidLaunch(format!(
                "block_dim {block_dim} is outside [1, {max}]"
            )));
        }
        let args_ptr = if args.is_empty() {
            0
        } else {
            let bytes: Vec<u8> = args.iter().flat_map(|a| a.to_le_bytes()).collect();
            let p = self.alloc(bytes.len() as u64)?;
            self.write(p, &bytes)?;
            p.0
        };
        let s = self.default_stream()?;
        let cores = self.chip.core_count();
        let before: Vec<CoreStats> = (0..cores)
            .map(|c| self.chip.core_stats(c).unwrap_or_default())
            .collect();
        let submitted = self.chip.now();
        let saved = self.mode;
        self.mode = mode;
        self.sched.last_run = None;
        let name = self.kernel_name(kernel).map(str::to_string);
        let task = Task::AiCoreKernel(gearsim_isa::task::AiCoreKernel {
            kernel: kernel.addr.0,
            args: args_ptr,
            block_dim,
        });
        let result = self
            .submit(s, task, name.as_deref())
            .and_then(|_| self.synchronize(s));
        self.mode = saved;
        result?;
        if args_ptr != 0 {
            self.free(DevicePtr(args_ptr))?;
        }
        let run = self.sched.last_run.clone().unwrap_or_default();
        let core_stats = (0..cores)
            .map(|c| {
                let now = self.chip.core_stats(c).unwrap_or_default();
                let was = before[c as usize];
                let mut d = CoreStats::default();
                for i in 0..LANES {
                    d.pipes[i].busy_cycles = now.pipes[i].busy_cycles - was.pipes[i].busy_cycles;
                    d.pipes[i].instructions = now.pipes[i].instructions - was.pipes[i].instructions;
                }
                d.cube_macs = now.cube_macs - was.cube_macs;
                d
            })
            .collect();
        Ok(LaunchReport {
            blocks: block_dim,
            cores_used: run.cores_used,
            submitted,
            first_start: run.first_start.unwrap_or(submitted),
            end: run.end,
            core_stats,
        })
    }

    /// Shape tensor size, for hosts wiring GetNext and GetDynamicDims.
    pub fn shape_tensor_bytes(&self) -> u64 {
        SHAPE_TENSOR_BYTES
    }

    pub(crate) fn timer(&mut self, at: Tick, fw: Fw) {
        let at = at.max(self.chip.now());
        let token = self.sched.push_timer(fw);
        // `at` is never in the past, so the chip accepts it.
        let _ = self.chip.set_timer(at, token);
    }
}
