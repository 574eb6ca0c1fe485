//! The task scheduler (in the style of HWTS): runs each fetched task on the component that owns
//! its kind and, when a component reports a task done or a queue item ready, moves the streams
//! on. It owns the components — streams, events / labels / models, data queues, the AI CPU, the
//! copy engines and AI core dispatch — and is the only place that connects them; it does not
//! own the chip, the timers or the trace lanes, which each call lends it in a [`Ctx`].
//!
//! Costs come from the preset: a serial descriptor fetch per task (`task_fetch_ns`), a kernel
//! start (`kernel_launch_ns`) and a serial block dispatch (`block_dispatch_ns`), control tasks
//! (`control_task_ns`), AI CPU launch and loop costs, PCIe latency and bandwidth.

use gearsim_isa::task::Task;
use gearsim_sim::{ChipConfig, ExecMode, Tick};
use gearsim_traces::TraceSink;

use crate::aicpu::{AiCpu, Started};
use crate::context::Ctx;
use crate::control::Control;
use crate::copy::{Copied, Copies};
use crate::dispatch::Dispatch;
use crate::error::{BlockedTask, DeviceError, TaskRef};
use crate::kernels::AiCpuKernelId;
use crate::queues::{Queues, Staged};
use crate::streams::{StreamState, Streams};
use crate::timers::{Fw, Xfer};

/// The firmware's components.
pub(crate) struct Scheduler {
    pub(crate) streams: Streams,
    pub(crate) control: Control,
    pub(crate) queues: Queues,
    pub(crate) dispatch: Dispatch,
    aicpu: AiCpu,
    copies: Copies,
}

impl Scheduler {
    pub(crate) fn new(cfg: &ChipConfig) -> Scheduler {
        Scheduler {
            streams: Streams::new(&cfg.scheduler),
            control: Control::new(&cfg.scheduler),
            queues: Queues::default(),
            dispatch: Dispatch::new(cfg),
            aicpu: AiCpu::new(&cfg.aicpu, &cfg.kernels),
            copies: Copies::new(&cfg.pcie, &cfg.scheduler),
        }
    }

    // ---- chip events -------------------------------------------------------------------------

    /// A block finished on an AI core.
    pub(crate) fn block_finished<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        core: u32,
        at: Tick,
    ) -> Result<(), DeviceError> {
        self.dispatch.block_finished(cx, core, at)
    }

    /// A firmware timer fired.
    pub(crate) fn timer_fired<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        fw: Fw,
    ) -> Result<(), DeviceError> {
        match fw {
            Fw::Step { stream } => {
                if !self.streams.fetch(cx, stream)?
                    && let Some(m) = self.streams.stream(stream).model()
                {
                    self.control.stream_finished(cx, &self.streams, m);
                }
                Ok(())
            }
            Fw::Start { stream, index } => self.start(cx, TaskRef { stream, index }),
            Fw::Done { stream, index } => self.streams.done(cx, stream, index),
            Fw::AiCpuLaunched { job } => self.aicpu.memory_phase(cx, job),
            Fw::AiCpuComputed { job } => match self.aicpu.finish(cx, job)? {
                Some(t) => self.streams.done(cx, t.stream, t.index),
                None => Ok(()),
            },
            Fw::PcieData { job } => {
                self.copies.pcie_data(cx, job);
                Ok(())
            }
            Fw::QueueTimeout { stream, index } => {
                self.streams.queue_timeout(cx.now(), stream, index)
            }
            // A wake the host no longer waits for (its wait ended in an error).
            Fw::HostWake => Ok(()),
        }
    }

    /// A transfer the firmware started finished.
    pub(crate) fn transfer_done<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        x: Xfer,
    ) -> Result<(), DeviceError> {
        let copied = match x {
            Xfer::AiCpu(job) => return self.aicpu.compute_phase(cx, job),
            Xfer::Sdma(job) => self.copies.sdma_done(cx, job)?.map(Copied::Task),
            Xfer::Pcie(job) => self.copies.pcie_done(cx, job)?,
        };
        match copied {
            Some(Copied::Task(t)) => self.streams.done(cx, t.stream, t.index),
            Some(Copied::QueueItem(item)) => self.item_copied(cx, item),
            None => Ok(()),
        }
    }

    // ---- tasks -------------------------------------------------------------------------------

    /// Executes the task `at`'s stream fetched.
    fn start<S: TraceSink>(&mut self, cx: &mut Ctx<'_, S>, at: TaskRef) -> Result<(), DeviceError> {
        let Some(task) = self.streams.take_fetched(at.stream) else {
            return Ok(());
        };
        let streams = &mut self.streams;
        let control = &mut self.control;
        match task {
            Task::AiCoreKernel(k) => self.dispatch.start(cx, at, &k),
            Task::AiCpuKernel(k) => self.aicpu_start(cx, at, k.kernel, k.args, k.args_size),
            Task::Memcpy(m) => self.copies.memcpy(cx, at, m.kind, m.dst, m.src, m.size),
            Task::Memset(m) => self.copies.memset(cx, at, m.dst, m.size, m.value as u8),
            Task::EventRecord(e) => control.event_record(cx, streams, at, e.event),
            Task::StreamWaitEvent(e) => control.event_wait(cx, streams, at, e.event),
            Task::NotifyRecord(n) => {
                control.notify_record(cx, streams, at, n.notify);
                Ok(())
            }
            Task::NotifyWait(n) => {
                control.notify_wait(cx, at, n.notify);
                Ok(())
            }
            Task::LabelSet(_) => {
                control.nothing(cx, at);
                Ok(())
            }
            Task::LabelGoto(g) => control.label_goto(cx, streams, at, g.label),
            Task::LabelSwitchByIndex(sw) => control.label_switch(cx, streams, at, &sw),
            Task::StreamActive(a) => control.stream_active(cx, streams, at, a.stream),
            Task::StreamSwitch(sw) => control.stream_switch(cx, streams, at, &sw),
            Task::ModelExecute(m) => control.model_execute(cx, streams, at, m.model),
            Task::ModelEndGraph(m) => control.model_end(cx, at, m.model),
        }
    }

    /// Starts an AI CPU kernel; a GetNext on an empty queue waits for an item (or its timeout).
    fn aicpu_start<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        kernel: u32,
        args: u64,
        size: u32,
    ) -> Result<(), DeviceError> {
        // In a timing-only run the values an AI CPU operator reads may not have been
        // computed (only what control flow needs is).
        let values_computed = self.dispatch.mode == ExecMode::Full;
        let started = self.aicpu.start(
            cx,
            &mut self.queues,
            at,
            (kernel, args, size),
            values_computed,
        )?;
        match started {
            Started::Queued => {}
            Started::WaitQueue { queue, deadline } => {
                let now = cx.now();
                self.streams
                    .wait_queue(at, queue, now, deadline, args, size);
                if let Some(d) = deadline {
                    let (stream, index) = (at.stream, at.index);
                    cx.timer(d, Fw::QueueTimeout { stream, index });
                }
            }
        }
        Ok(())
    }

    // ---- data queues -------------------------------------------------------------------------

    /// Stages an item of queue `queue`: each tensor's bytes are copied to its staging buffer
    /// over PCIe; the item is ready when the last copy lands.
    pub(crate) fn enqueue<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        queue: u32,
        data: Vec<Vec<u8>>,
        staged: Vec<Staged>,
    ) {
        let dsts: Vec<u64> = staged.iter().map(|(dst, _, _)| *dst).collect();
        let item = self.queues.stage(queue, staged);
        if dsts.is_empty() {
            // Nothing to copy: the item is ready now (an error here cannot occur, the item exists).
            let _ = self.item_copied(cx, item);
            return;
        }
        for (bytes, dst) in data.into_iter().zip(dsts) {
            self.copies.stage(cx, item, dst, bytes);
        }
    }

    /// A tensor of a queue item is on the device; when the item is ready, the first GetNext
    /// waiting on its queue takes it.
    fn item_copied<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        item: u32,
    ) -> Result<(), DeviceError> {
        let Some(queue) = self.queues.copied(cx, item) else {
            return Ok(());
        };
        match self.streams.wake_queue_waiter(queue) {
            Some((at, args, size)) => {
                self.aicpu_start(cx, at, AiCpuKernelId::GetNext as u32, args, size)
            }
            None => Ok(()),
        }
    }

    // ---- deadlock ----------------------------------------------------------------------------

    /// Every task that waits for something nothing left will do (when the chip is idle).
    pub(crate) fn blocked(&self) -> Vec<BlockedTask> {
        let mut out = Vec::new();
        for (sid, s) in self.streams.iter() {
            let task = |index| TaskRef { stream: sid, index };
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
                StreamState::Running { index, .. } => {
                    if let Some(id) = self.control.notify_waited(sid) {
                        out.push(BlockedTask {
                            task: task(*index),
                            kind: "NotifyWait",
                            waits_for: format!("notify {id}"),
                        })
                    }
                }
                StreamState::Idle | StreamState::Stepping => {}
            }
        }
        out
    }
}
