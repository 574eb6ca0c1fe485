//! The device as the host sees it: a chip and its firmware behind the host-facing API — device
//! and host memory, kernel images, streams, events, labels, data queues and models, task
//! submission, and running until a stream is done. It checks what the host asks and hands the
//! work to the firmware; it runs no task itself.

use gearsim_isa::Program;
use gearsim_isa::task::{Task, TaskDescriptor};
use gearsim_sim::{Chip, ChipConfig, CoreStats, ExecMode, Guard, Kernel, LANES, Tick};
use gearsim_traces::TraceSink;
use zerocopy::IntoBytes;

use crate::dispatch::{encode_image, encode_mix_image};
use crate::error::{DeviceError, TaskRef};
use crate::firmware::Firmware;
use crate::kernels::SHAPE_TENSOR_BYTES;
use crate::streams::{Stream, StreamKind, Streams};

/// Bytes of red zone after a directly launched kernel's argument block (32 more arguments).
const ARGS_RED_ZONE: u64 = 256;

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

/// A simulated device.
pub struct Device<S: TraceSink> {
    chip: Chip<S>,
    cfg: ChipConfig,
    fw: Firmware,
    /// The error that stopped the device, once one did.
    stopped: Option<DeviceError>,
    default_stream: Option<StreamId>,
}

impl<S: TraceSink> Device<S> {
    /// A device over a fresh chip.
    pub fn new(cfg: ChipConfig, sink: S) -> Device<S> {
        Device {
            chip: Chip::new(cfg.clone(), sink),
            fw: Firmware::new(&cfg),
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
        self.fw.sched.dispatch.mode = mode;
    }

    /// Whether AI core kernels compute values or only times.
    pub fn exec_mode(&self) -> ExecMode {
        self.fw.sched.dispatch.mode
    }

    /// Host threads that compute values in full mode (see [`Chip::set_host_threads`]); the
    /// results are the same for every count.
    pub fn set_host_threads(&mut self, threads: usize) {
        self.chip.set_host_threads(threads);
    }

    /// A flag another thread may set to stop the simulation: the running call then returns
    /// [`DeviceError::Interrupted`] within one chip event and the device stays stopped.
    pub fn set_interrupt(&mut self, flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>) {
        self.fw.interrupt = flag;
    }

    /// Starts (or stops) keeping a [`KernelProfile`] of every AI core kernel run and a
    /// [`crate::TaskSpan`] of every task; starting clears what was kept.
    pub fn set_profiling(&mut self, on: bool) {
        self.fw.sched.dispatch.profile = on.then(Vec::new);
        self.fw.sched.streams.log = on.then(Vec::new);
    }

    /// Every task that ended since profiling started or this was last taken, oldest first.
    pub fn take_task_log(&mut self) -> Vec<crate::TaskSpan> {
        self.fw
            .sched
            .streams
            .log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The kernel runs profiled since profiling started or was last taken, oldest first.
    pub fn take_profile(&mut self) -> Vec<crate::KernelProfile> {
        self.fw
            .sched
            .dispatch
            .profile
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    // ---- memory -------------------------------------------------------------------------------

    /// Allocates `bytes` of device memory (512-byte aligned).
    pub fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.fw.heap.alloc(bytes).map(DevicePtr)
    }

    /// Frees a device allocation.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.fw.heap.free(ptr.0)
    }

    /// Bytes of device memory allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.fw.heap.used_bytes()
    }

    /// Writes device memory directly (zero time; timed copies are `Memcpy` tasks).
    pub fn write(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<(), DeviceError> {
        Ok(self.chip.write_mem(ptr.0, data)?)
    }

    /// Reads device memory directly (zero time).
    pub fn read(&mut self, ptr: DevicePtr, buf: &mut [u8]) -> Result<(), DeviceError> {
        Ok(self.chip.read_mem(ptr.0, buf)?)
    }

    /// Fills device memory with a byte value (zero time).
    pub fn fill(&mut self, ptr: DevicePtr, len: u64, byte: u8) -> Result<(), DeviceError> {
        Ok(self.chip.fill_mem(ptr.0, len, byte)?)
    }

    /// Marks device memory as holding values that were not computed (see
    /// [`Chip::mark_mem_not_computed`]): what a timing-only load leaves of the weights.
    pub fn mark_not_computed(&mut self, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        Ok(self.chip.mark_mem_not_computed(ptr.0, len)?)
    }

    /// Allocates a host buffer (the source or destination of host<->device copies).
    pub fn host_alloc(&mut self, bytes: u64) -> Result<HostPtr, DeviceError> {
        self.fw.host.alloc(bytes).map(HostPtr)
    }

    /// Frees a host buffer.
    pub fn host_free(&mut self, ptr: HostPtr) -> Result<(), DeviceError> {
        self.fw.host.free(ptr.0)
    }

    /// Writes host memory.
    pub fn host_write(&mut self, ptr: HostPtr, data: &[u8]) -> Result<(), DeviceError> {
        self.fw
            .host
            .write(ptr.0, data)
            .map_err(DeviceError::HostMemory)
    }

    /// Reads host memory.
    pub fn host_read(&self, ptr: HostPtr, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.fw
            .host
            .read(ptr.0, buf)
            .map_err(DeviceError::HostMemory)
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
    ///
    /// [`KERNEL_NEEDS_VALUES`]: crate::KERNEL_NEEDS_VALUES
    pub fn load_kernel_flags(
        &mut self,
        program: Program,
        flags: u32,
    ) -> Result<KernelHandle, DeviceError> {
        let image = encode_image(&program, flags)?;
        let ptr = self.alloc(image.len() as u64)?;
        self.write(ptr, &image)?;
        let name = program.display_name().to_string();
        let needs = crate::dispatch::core_kind_of(&program);
        let chip_id = self.chip.load_kernel(Kernel::new(program))?;
        self.fw
            .sched
            .dispatch
            .register(ptr.0, (chip_id, None), flags, name.clone(), needs)
            .map_err(|e| DeviceError::InvalidLaunch(format!("kernel `{name}`: {e}")))?;
        Ok(KernelHandle { addr: ptr })
    }

    /// Writes a MIX kernel's image (a cube program and a vector program that run together on
    /// whole AI cores of a separated chip) into device memory and registers it; `flags` as in
    /// [`Device::load_kernel_flags`], the kind bits set here.
    pub fn load_mix_kernel(
        &mut self,
        cube: Program,
        vector: Program,
        flags: u32,
    ) -> Result<KernelHandle, DeviceError> {
        let image = encode_mix_image(&cube, &vector, flags)?;
        let ptr = self.alloc(image.len() as u64)?;
        self.write(ptr, &image)?;
        let name = cube.display_name().to_string();
        let kind_flags = (flags & !gearsim_isa::task::KERNEL_KIND_MASK)
            | gearsim_isa::task::KernelKind::Mix.flags();
        let needs = crate::dispatch::core_kind_of(&cube);
        let first = self.chip.load_kernel(Kernel::new(cube))?;
        let second = self.chip.load_kernel(Kernel::new(vector))?;
        self.fw
            .sched
            .dispatch
            .register(
                ptr.0,
                (first, Some(second)),
                kind_flags,
                name.clone(),
                needs,
            )
            .map_err(|e| DeviceError::InvalidLaunch(format!("kernel `{name}`: {e}")))?;
        Ok(KernelHandle { addr: ptr })
    }

    /// The name of a loaded kernel.
    pub fn kernel_name(&self, k: KernelHandle) -> Option<&str> {
        self.fw.sched.dispatch.name(k.addr.0)
    }

    // ---- streams, events, labels, queues ------------------------------------------------------

    fn new_stream(&mut self, kind: StreamKind, tasks: u32) -> Result<u32, DeviceError> {
        let max = self.cfg.scheduler.max_streams;
        if self.fw.sched.streams.count() >= max {
            return Err(self.limit("streams", u64::from(max), "scheduler.max_streams"));
        }
        let capacity = match kind {
            StreamKind::User => self.cfg.scheduler.sq_depth,
            StreamKind::Model(_) => tasks.max(1),
        };
        let sq = self.alloc(u64::from(capacity) * gearsim_isa::task::TASK_BYTES as u64)?;
        Ok(self.fw.sched.streams.add(kind, sq.0, capacity))
    }

    /// Creates a stream whose submission queue (`scheduler.sq_depth` descriptors) lives in
    /// device memory.
    pub fn create_stream(&mut self) -> Result<StreamId, DeviceError> {
        self.new_stream(StreamKind::User, 0).map(StreamId)
    }

    /// Creates an event.
    pub fn create_event(&mut self) -> Result<EventId, DeviceError> {
        let max = self.cfg.scheduler.max_events;
        if self.fw.sched.control.event_count() >= max {
            return Err(self.limit("events", u64::from(max), "scheduler.max_events"));
        }
        Ok(EventId(self.fw.sched.control.add_event()))
    }

    /// Creates a label (bound to a position when a model containing its `LabelSet` is loaded).
    pub fn create_label(&mut self) -> Result<LabelId, DeviceError> {
        let max = self.cfg.scheduler.max_labels;
        if self.fw.sched.control.label_count() >= max {
            return Err(self.limit("labels", u64::from(max), "scheduler.max_labels"));
        }
        Ok(LabelId(self.fw.sched.control.add_label()))
    }

    /// Creates a data queue holding up to `capacity` items for GetNext.
    pub fn create_queue(&mut self, capacity: u32) -> Result<QueueId, DeviceError> {
        if capacity == 0 {
            return Err(DeviceError::InvalidLaunch(
                "a data queue needs a capacity of at least 1".into(),
            ));
        }
        Ok(QueueId(self.fw.sched.queues.add(capacity)))
    }

    /// Items a queue holds (on the device or still being copied there).
    pub fn queue_len(&self, q: QueueId) -> Option<u32> {
        self.fw.sched.queues.len(q.0)
    }

    /// Hands an item to a data queue: its tensors are copied to device staging buffers over
    /// PCIe (timed) and the item becomes visible to GetNext when the copies finish.
    pub fn enqueue(&mut self, q: QueueId, item: Vec<HostTensor>) -> Result<(), DeviceError> {
        self.check_running()?;
        self.fw.sched.queues.check_room(q.0)?;
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
        let data = item.into_iter().map(|t| t.data).collect();
        self.fw.enqueue(&mut self.chip, q.0, data, staged);
        Ok(())
    }

    // ---- task submission ----------------------------------------------------------------------

    fn user_stream(&self, s: StreamId) -> Result<&Stream, DeviceError> {
        let st = self.fw.sched.streams.get(s.0).ok_or(DeviceError::NoSuch {
            what: "stream",
            id: u64::from(s.0),
        })?;
        if st.kind() != StreamKind::User {
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
        if self.user_stream(s)?.is_full() {
            self.run_until(|d| !d.stream(s.0).is_full())?;
        }
        let (index, addr) = self.fw.sched.streams.stream(s.0).next_slot();
        desc.task_id.set(index);
        self.chip.write_mem(addr, desc.as_bytes())?;
        self.fw.sched.streams.stream_mut(s.0).push_submitted(name);
        self.fw.submitted(&mut self.chip, s.0);
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
        let model = self.fw.sched.control.model_count();
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
                if let Task::LabelSet(l) = task {
                    let at = TaskRef { stream: sid, index };
                    self.fw.sched.control.bind_label(at, l.label)?;
                }
                let stream = self.fw.sched.streams.stream_mut(sid);
                let addr = stream.slot_addr(index);
                stream.push_loaded(index, name.as_deref());
                self.chip.write_mem(addr, task.encode(index).as_bytes())?;
            }
        }
        Ok(ModelId(self.fw.sched.control.add_model(ids)))
    }

    /// Number of streams created so far (the next stream gets this id).
    pub fn stream_count(&self) -> u32 {
        self.fw.sched.streams.count()
    }

    /// Number of models loaded so far (the next model gets this id).
    pub fn model_count(&self) -> u32 {
        self.fw.sched.control.model_count()
    }

    /// The streams of a model, head first.
    pub fn model_streams(&self, m: ModelId) -> Option<Vec<StreamId>> {
        self.fw
            .sched
            .control
            .model_streams(m.0)
            .map(|s| s.iter().map(|&s| StreamId(s)).collect())
    }

    // ---- running ------------------------------------------------------------------------------

    fn check_running(&self) -> Result<(), DeviceError> {
        match &self.stopped {
            Some(why) => Err(DeviceError::Stopped(Box::new(why.clone()))),
            None => Ok(()),
        }
    }

    /// The time user stream `s` has spent executing tasks since it was created (each task from
    /// its start to its end; waits for the host or for a free slot excluded).
    pub fn stream_busy(&self, s: StreamId) -> Result<Tick, DeviceError> {
        Ok(self.user_stream(s)?.busy())
    }

    /// Runs until every task of stream `s` has finished.
    pub fn synchronize(&mut self, s: StreamId) -> Result<(), DeviceError> {
        self.user_stream(s)?;
        self.run_until(|d| d.stream(s.0).finished())
    }

    /// The host works for `span` (an API call's own cost): the device runs whatever it was
    /// given meanwhile, and [`Device::now`] is `span` later on return.
    pub fn host_work(&mut self, span: Tick) -> Result<(), DeviceError> {
        self.check_running()?;
        let until = Tick(self.now().0.saturating_add(span.0));
        let result = self.fw.run_to(&mut self.chip, until);
        if let Err(e) = &result {
            self.stopped = Some(e.clone());
        }
        result
    }

    /// Runs until nothing is left to do.
    pub fn run_until_idle(&mut self) -> Result<(), DeviceError> {
        self.run_until(|_| false)
    }

    /// Runs the event loop until `done` holds (or, for a condition that never holds, until the
    /// device is idle); an error stops the device.
    fn run_until(&mut self, done: impl Fn(&Streams) -> bool) -> Result<(), DeviceError> {
        self.check_running()?;
        let result = self.fw.run(&mut self.chip, &done);
        if let Err(e) = &result {
            self.stopped = Some(e.clone());
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
        // The argument block is followed by a red zone, so a kernel that reads more
        // arguments than it was given stops with a fault saying so instead of reading
        // whatever lies beyond (and, say, looping on a zero count until the timeout).
        let bytes: Vec<u8> = args.iter().flat_map(|a| a.to_le_bytes()).collect();
        let block = self.alloc(bytes.len() as u64 + ARGS_RED_ZONE)?;
        self.write(block, &bytes)?;
        let guard = block.0 + bytes.len() as u64;
        self.chip.add_guard(Guard {
            start: guard,
            len: ARGS_RED_ZONE,
            what: format!(
                "past the end of the kernel's argument block at {:#x}, which holds {} argument{} \
                 ({} bytes): the kernel reads more arguments than it was given",
                block.0,
                args.len(),
                if args.len() == 1 { "" } else { "s" },
                bytes.len()
            ),
        });
        let args_ptr = block.0;
        let s = self.default_stream()?;
        let cores = self.chip.core_count();
        let before: Vec<CoreStats> = (0..cores)
            .map(|c| self.chip.core_stats(c).unwrap_or_default())
            .collect();
        let submitted = self.chip.now();
        let dispatch = &mut self.fw.sched.dispatch;
        let saved = dispatch.mode;
        dispatch.mode = mode;
        dispatch.last_run = None;
        let name = self.kernel_name(kernel).map(str::to_string);
        let task = Task::AiCoreKernel(gearsim_isa::task::AiCoreKernel {
            kernel: kernel.addr.0,
            args: args_ptr,
            block_dim,
            l2ctrl: 0,
            l2_sections: 0,
        });
        let result = self
            .submit(s, task, name.as_deref())
            .and_then(|_| self.synchronize(s));
        self.fw.sched.dispatch.mode = saved;
        self.chip.remove_guard(guard);
        result?;
        self.free(block)?;
        let run = self.fw.sched.dispatch.last_run.clone().unwrap_or_default();
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
}
