//! Streams: the submission queues of user streams and the task lists of model streams (64-byte
//! descriptors in device memory), and each stream's state machine — fetch the next descriptor
//! (serially, `task_fetch_ns` each, like HWTS), run it, move on or jump. It does not execute
//! tasks: it hands each fetched task to the scheduler and is told when the task is done.

use std::collections::BTreeMap;

use gearsim_isa::task::{Task, TaskDescriptor, TaskKind};
use gearsim_sim::{SchedulerConfig, Tick};
use gearsim_traces::TraceSink;
use zerocopy::FromBytes;

use crate::context::Ctx;
use crate::error::{DeviceError, TaskRef};
use crate::timers::{Fw, ns};

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
    kind: StreamKind,
    /// Device address of the descriptor array.
    sq: u64,
    capacity: u32,
    /// User streams: tasks submitted so far (the ring holds `pos..submitted`).
    submitted: u32,
    /// Next task index to run.
    pos: u32,
    /// Model streams: the number of tasks.
    len: u32,
    /// The names tasks were submitted or loaded with, for the trace.
    names: BTreeMap<u32, String>,
    pub state: StreamState,
    /// Earliest time the next task may start (the end of the previous one).
    ready_at: Tick,
    /// Time spent executing tasks so far (from each task's start to its end).
    busy: Tick,
}

impl Stream {
    fn has_work(&self) -> bool {
        match self.kind {
            StreamKind::User => self.pos < self.submitted,
            StreamKind::Model(_) => self.pos < self.len,
        }
    }

    pub(crate) fn kind(&self) -> StreamKind {
        self.kind
    }

    /// Time spent executing tasks so far.
    pub(crate) fn busy(&self) -> Tick {
        self.busy
    }

    /// Whether a user stream's submission queue is full.
    pub(crate) fn is_full(&self) -> bool {
        self.submitted - self.pos >= self.capacity
    }

    /// The index and descriptor address the next task submitted to a user stream gets.
    pub(crate) fn next_slot(&self) -> (u32, u64) {
        (self.submitted, self.slot_addr(self.submitted))
    }

    /// A task was written to the next slot (`name`: its name in the trace).
    pub(crate) fn push_submitted(&mut self, name: Option<&str>) {
        let index = self.submitted;
        self.submitted += 1;
        match name {
            Some(n) => {
                self.names.insert(index, n.to_string());
            }
            None => {
                self.names.remove(&index);
            }
        }
    }

    /// Task `index` of a model stream being loaded was written to its slot.
    pub(crate) fn push_loaded(&mut self, index: u32, name: Option<&str>) {
        self.len = index + 1;
        if let Some(n) = name {
            self.names.insert(index, n.to_string());
        }
    }

    /// Device address of task `index`'s descriptor.
    pub(crate) fn slot_addr(&self, index: u32) -> u64 {
        let slot = match self.kind {
            StreamKind::User => index % self.capacity,
            StreamKind::Model(_) => index,
        };
        self.sq + u64::from(slot) * gearsim_isa::task::TASK_BYTES as u64
    }

    /// The model the stream belongs to.
    pub(crate) fn model(&self) -> Option<u32> {
        match self.kind {
            StreamKind::User => None,
            StreamKind::Model(m) => Some(m),
        }
    }

    /// Whether every task submitted has finished.
    pub(crate) fn finished(&self) -> bool {
        self.state == StreamState::Idle && !self.has_work()
    }

    /// Runs the stream again from its first task, no earlier than `now`.
    pub(crate) fn rewind(&mut self, now: Tick) {
        self.pos = 0;
        self.ready_at = now;
    }
}

/// Every stream, the task each has fetched and not yet started, and the jumps taken.
pub(crate) struct Streams {
    list: Vec<Stream>,
    fetched: BTreeMap<u32, Task>,
    jumps: BTreeMap<u32, u32>,
    /// When the (serial) descriptor fetch is next free.
    fetch_free: Tick,
    fetch_ns: u64,
    /// Every task that ended, oldest first, while profiling is on (`None`: off).
    pub(crate) log: Option<Vec<TaskSpan>>,
}

/// One task as it ran on its stream (profiling only): the fetch of its descriptor started at
/// `fetch`, the task ran from `start` to `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpan {
    /// The task.
    pub task: TaskRef,
    /// The model whose stream it is on (`None`: a user stream).
    pub model: Option<u32>,
    /// Its kind.
    pub kind: TaskKind,
    /// When the fetch of its descriptor started.
    pub fetch: Tick,
    /// When it started.
    pub start: Tick,
    /// When it ended.
    pub end: Tick,
}

impl Streams {
    pub(crate) fn new(cfg: &SchedulerConfig) -> Streams {
        Streams {
            list: Vec::new(),
            fetched: BTreeMap::new(),
            jumps: BTreeMap::new(),
            fetch_free: Tick::ZERO,
            fetch_ns: cfg.task_fetch_ns,
            log: None,
        }
    }

    /// Number of streams.
    pub(crate) fn count(&self) -> u32 {
        self.list.len() as u32
    }

    /// A stream.
    pub(crate) fn get(&self, stream: u32) -> Option<&Stream> {
        self.list.get(stream as usize)
    }

    /// A stream that exists.
    pub(crate) fn stream(&self, stream: u32) -> &Stream {
        &self.list[stream as usize]
    }

    /// A stream that exists, mutably.
    pub(crate) fn stream_mut(&mut self, stream: u32) -> &mut Stream {
        &mut self.list[stream as usize]
    }

    /// Every stream, by id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Stream)> {
        self.list.iter().enumerate().map(|(i, s)| (i as u32, s))
    }

    /// Adds an idle stream whose `capacity` descriptors start at `sq`; returns its id.
    pub(crate) fn add(&mut self, kind: StreamKind, sq: u64, capacity: u32) -> u32 {
        self.list.push(Stream {
            kind,
            sq,
            capacity,
            submitted: 0,
            pos: 0,
            len: 0,
            names: BTreeMap::new(),
            state: StreamState::Idle,
            ready_at: Tick::ZERO,
            busy: Tick::ZERO,
        });
        self.list.len() as u32 - 1
    }

    /// Schedules a step of `stream` at `at` (it must be idle).
    pub(crate) fn step_later<S: TraceSink>(&mut self, cx: &mut Ctx<'_, S>, stream: u32, at: Tick) {
        let s = &mut self.list[stream as usize];
        s.state = StreamState::Stepping;
        let at = at.max(s.ready_at);
        cx.timer(at, Fw::Step { stream });
    }

    /// Fetches the stream's next task and schedules its start; `false` when the stream has run
    /// out of tasks (it is idle now).
    pub(crate) fn fetch<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        stream: u32,
    ) -> Result<bool, DeviceError> {
        let now = cx.now();
        let s = &self.list[stream as usize];
        if !s.has_work() {
            self.list[stream as usize].state = StreamState::Idle;
            return Ok(false);
        }
        let index = s.pos;
        let addr = s.slot_addr(index);
        let start = now.max(s.ready_at).max(self.fetch_free);
        let fetched = start + ns(self.fetch_ns);
        self.fetch_free = fetched;
        let mut raw = [0u8; gearsim_isa::task::TASK_BYTES];
        cx.chip.read_mem(addr, &mut raw)?;
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
        let name = s.names.get(&index).map(String::as_str);
        cx.lanes
            .fetch(cx.chip.sink_mut(), at, task.kind(), name, start, fetched);
        self.list[stream as usize].state = StreamState::Running {
            index,
            kind: task.kind(),
            start: fetched,
        };
        self.fetched.insert(stream, task);
        cx.timer(fetched, Fw::Start { stream, index });
        Ok(true)
    }

    /// The task `stream` fetched, to start now.
    pub(crate) fn take_fetched(&mut self, stream: u32) -> Option<Task> {
        self.fetched.remove(&stream)
    }

    /// Makes `stream` continue at task `target` when its current task is done.
    pub(crate) fn jump(&mut self, stream: u32, target: u32) {
        self.jumps.insert(stream, target);
    }

    /// Ends the current task of `stream` now and moves on.
    pub(crate) fn done<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        stream: u32,
        index: u32,
    ) -> Result<(), DeviceError> {
        let now = cx.now();
        let s = &self.list[stream as usize];
        let (kind, start) = match s.state {
            StreamState::Running { kind, start, .. } => (kind, start),
            StreamState::WaitModel { start, .. } => (TaskKind::ModelExecute, start),
            StreamState::Idle
            | StreamState::Stepping
            | StreamState::WaitEvent { .. }
            | StreamState::WaitQueue { .. } => (TaskKind::LabelSet, now),
        };
        let at = TaskRef { stream, index };
        let name = s.names.get(&index).map(String::as_str);
        cx.lanes
            .task(cx.chip.sink_mut(), at, s.model(), kind, name, start, now);
        if let Some(log) = self.log.as_mut() {
            log.push(TaskSpan {
                task: at,
                model: s.model(),
                kind,
                fetch: Tick(start.0.saturating_sub(ns(self.fetch_ns).0)),
                start,
                end: now,
            });
        }
        let next = self.jumps.remove(&stream).unwrap_or(index + 1);
        let s = &mut self.list[stream as usize];
        s.pos = next;
        s.ready_at = now;
        s.busy = Tick(s.busy.0 + now.0.saturating_sub(start.0));
        self.step_later(cx, stream, now);
        Ok(())
    }

    /// Puts a GetNext whose queue is empty to wait (until `deadline`, when it has one).
    pub(crate) fn wait_queue(
        &mut self,
        at: TaskRef,
        queue: u32,
        since: Tick,
        deadline: Option<Tick>,
        args: u64,
        args_size: u32,
    ) {
        self.list[at.stream as usize].state = StreamState::WaitQueue {
            index: at.index,
            queue,
            since,
            deadline,
            args,
            args_size,
        };
    }

    /// Wakes the first GetNext waiting on `queue`: it runs again; returns it with its argument
    /// block (address, size).
    pub(crate) fn wake_queue_waiter(&mut self, queue: u32) -> Option<(TaskRef, u64, u32)> {
        for (sid, s) in self.list.iter_mut().enumerate() {
            if let StreamState::WaitQueue {
                index,
                queue: q,
                args,
                args_size,
                since,
                ..
            } = s.state
                && q == queue
            {
                s.state = StreamState::Running {
                    index,
                    kind: TaskKind::AiCpuKernel,
                    start: since,
                };
                let at = TaskRef {
                    stream: sid as u32,
                    index,
                };
                return Some((at, args, args_size));
            }
        }
        None
    }

    /// A GetNext's timeout passed: an error if it still waits.
    pub(crate) fn queue_timeout(
        &self,
        now: Tick,
        stream: u32,
        index: u32,
    ) -> Result<(), DeviceError> {
        match &self.list[stream as usize].state {
            StreamState::WaitQueue {
                index: i,
                queue,
                since,
                ..
            } if *i == index => {
                let waited = now.0.saturating_sub(since.0) / 1_000_000;
                Err(DeviceError::GetNextTimeout {
                    task: TaskRef { stream, index },
                    queue: *queue,
                    waited_us: waited,
                })
            }
            _ => Ok(()),
        }
    }
}
