//! Events, notifies, labels and models, and the control tasks that use them: event record and
//! wait, notify record and wait, label goto and switch, stream active and switch, model execute
//! and end. Each control task takes `control_task_ns`. It moves streams (wakes, jumps,
//! activations) through [`Streams`] and knows nothing of kernels or copies.

use std::collections::BTreeMap;

use gearsim_isa::task::{LabelSwitchByIndex, StreamSwitch, SwitchCond, TaskKind};
use gearsim_sim::SchedulerConfig;
use gearsim_traces::TraceSink;

use crate::context::{Ctx, bad};
use crate::error::{DeviceError, TaskRef};
use crate::streams::{StreamKind, StreamState, Streams};
use crate::timers::{Fw, ns};

struct Model {
    streams: Vec<u32>,
    running: bool,
    end_requested: bool,
    waiter: Option<TaskRef>,
}

/// Events, notifies, labels and models.
pub(crate) struct Control {
    /// Whether each event is recorded.
    events: Vec<bool>,
    notifies: BTreeMap<u32, bool>,
    /// Stream -> the notify its `NotifyWait` waits for.
    notify_waiters: BTreeMap<u32, u32>,
    /// Each label's (stream, task index), once a model sets it.
    labels: Vec<Option<(u32, u32)>>,
    models: Vec<Model>,
    control_ns: u64,
}

impl Control {
    pub(crate) fn new(cfg: &SchedulerConfig) -> Control {
        Control {
            events: Vec::new(),
            notifies: BTreeMap::new(),
            notify_waiters: BTreeMap::new(),
            labels: Vec::new(),
            models: Vec::new(),
            control_ns: cfg.control_task_ns,
        }
    }

    // ---- the host's side -------------------------------------------------------------------

    /// Number of events.
    pub(crate) fn event_count(&self) -> u32 {
        self.events.len() as u32
    }

    /// Adds an unrecorded event; returns its id.
    pub(crate) fn add_event(&mut self) -> u32 {
        self.events.push(false);
        self.events.len() as u32 - 1
    }

    /// Number of labels.
    pub(crate) fn label_count(&self) -> u32 {
        self.labels.len() as u32
    }

    /// Adds an unbound label; returns its id.
    pub(crate) fn add_label(&mut self) -> u32 {
        self.labels.push(None);
        self.labels.len() as u32 - 1
    }

    /// Binds `label` to the `LabelSet` task `at` of a model being loaded.
    pub(crate) fn bind_label(&mut self, at: TaskRef, label: u32) -> Result<(), DeviceError> {
        let count = self.labels.len();
        let slot = self.labels.get_mut(label as usize).ok_or_else(|| {
            bad(
                at,
                "LabelSet",
                "label",
                format!("label {label} was never created ({count} labels exist)"),
            )
        })?;
        if let Some((s0, i0)) = *slot {
            return Err(bad(
                at,
                "LabelSet",
                "label",
                format!("label {label} is already set at stream {s0} task {i0}"),
            ));
        }
        *slot = Some((at.stream, at.index));
        Ok(())
    }

    /// Number of models.
    pub(crate) fn model_count(&self) -> u32 {
        self.models.len() as u32
    }

    /// Adds a model over its streams (head first); returns its id.
    pub(crate) fn add_model(&mut self, streams: Vec<u32>) -> u32 {
        self.models.push(Model {
            streams,
            running: false,
            end_requested: false,
            waiter: None,
        });
        self.models.len() as u32 - 1
    }

    /// The streams of a model, head first.
    pub(crate) fn model_streams(&self, m: u32) -> Option<&[u32]> {
        self.models.get(m as usize).map(|m| m.streams.as_slice())
    }

    /// The notify `stream`'s `NotifyWait` waits for.
    pub(crate) fn notify_waited(&self, stream: u32) -> Option<u32> {
        self.notify_waiters.get(&stream).copied()
    }

    // ---- control tasks ---------------------------------------------------------------------

    fn done_later<S: TraceSink>(&self, cx: &mut Ctx<'_, S>, at: TaskRef) {
        let t = cx.now() + ns(self.control_ns);
        cx.timer(
            t,
            Fw::Done {
                stream: at.stream,
                index: at.index,
            },
        );
    }

    /// A task that only takes the control cost (`LabelSet`, `ModelEndGraph`'s tail).
    pub(crate) fn nothing<S: TraceSink>(&self, cx: &mut Ctx<'_, S>, at: TaskRef) {
        self.done_later(cx, at);
    }

    /// `EventRecord`: records the event and wakes the streams waiting for it.
    pub(crate) fn event_record<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        event: u32,
    ) -> Result<(), DeviceError> {
        let slot = self.events.get_mut(event as usize).ok_or_else(|| {
            bad(
                at,
                "EventRecord",
                "event",
                format!("event {event} was never created"),
            )
        })?;
        *slot = true;
        for sid in 0..streams.count() {
            if let StreamState::WaitEvent {
                index,
                event: e,
                since,
            } = streams.stream(sid).state
                && e == event
                && self.events[event as usize]
            {
                self.events[event as usize] = false;
                streams.stream_mut(sid).state = StreamState::Running {
                    index,
                    kind: TaskKind::StreamWaitEvent,
                    start: since,
                };
                self.done_later(cx, TaskRef { stream: sid, index });
            }
        }
        self.done_later(cx, at);
        Ok(())
    }

    /// `StreamWaitEvent`: consumes the event if it is recorded, else waits for it.
    pub(crate) fn event_wait<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        event: u32,
    ) -> Result<(), DeviceError> {
        let recorded = *self.events.get(event as usize).ok_or_else(|| {
            bad(
                at,
                "StreamWaitEvent",
                "event",
                format!("event {event} was never created"),
            )
        })?;
        if recorded {
            self.events[event as usize] = false;
            self.done_later(cx, at);
        } else {
            streams.stream_mut(at.stream).state = StreamState::WaitEvent {
                index: at.index,
                event,
                since: cx.now(),
            };
        }
        Ok(())
    }

    /// `NotifyRecord`: wakes the oldest waiter on this notify, else leaves it recorded for the
    /// next wait.
    pub(crate) fn notify_record<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &Streams,
        at: TaskRef,
        notify: u32,
    ) {
        let waiter = self
            .notify_waiters
            .iter()
            .find(|(_, id)| **id == notify)
            .map(|(s, _)| *s);
        match waiter {
            Some(s) => {
                self.notify_waiters.remove(&s);
                if let StreamState::Running { index, .. } = streams.stream(s).state {
                    self.done_later(cx, TaskRef { stream: s, index });
                }
            }
            None => {
                self.notifies.insert(notify, true);
            }
        }
        self.done_later(cx, at);
    }

    /// `NotifyWait`: consumes the notify if it is recorded, else waits for it.
    pub(crate) fn notify_wait<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        notify: u32,
    ) {
        if self.notifies.get(&notify) == Some(&true) {
            self.notifies.insert(notify, false);
            self.done_later(cx, at);
        } else {
            self.notify_waiters.insert(at.stream, notify);
        }
    }

    /// The task index a label marks, which must be in the same model stream.
    fn label_target(
        &self,
        at: TaskRef,
        kind: &'static str,
        field: &'static str,
        label: u32,
    ) -> Result<u32, DeviceError> {
        let binding = self.labels.get(label as usize).ok_or_else(|| {
            bad(
                at,
                kind,
                field,
                format!(
                    "label {label} is out of range ({} labels exist)",
                    self.labels.len()
                ),
            )
        })?;
        let (s, i) = binding.ok_or_else(|| {
            bad(
                at,
                kind,
                field,
                format!("label {label} is not set in any loaded model"),
            )
        })?;
        if s != at.stream {
            return Err(bad(
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

    /// `LabelGoto`: the stream continues at the label.
    pub(crate) fn label_goto<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        label: u32,
    ) -> Result<(), DeviceError> {
        let target = self.label_target(at, "LabelGoto", "label", label)?;
        streams.jump(at.stream, target);
        let model = streams.stream(at.stream).model();
        let now = cx.now();
        cx.lanes.instant(
            cx.chip.sink_mut(),
            at,
            model,
            "label_goto",
            label,
            format!("goto label {label}"),
            now,
        );
        self.done_later(cx, at);
        Ok(())
    }

    /// `LabelSwitchByIndex`: an index at or past `max` (MapIndex's -1 reads as 0xffffffff) goes
    /// to the last label, as `aclrtSwitchLabelByIndex` does.
    pub(crate) fn label_switch<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        sw: &LabelSwitchByIndex,
    ) -> Result<(), DeviceError> {
        const K: &str = "LabelSwitchByIndex";
        if sw.max == 0 {
            return Err(bad(
                at,
                K,
                "max",
                "the label list must hold at least one label".into(),
            ));
        }
        let index = cx.read_u32(at, K, "index_ptr", sw.index_ptr)?;
        cx.check_range(at, K, "label_list", sw.label_list, u64::from(sw.max) * 4)?;
        let chosen = if index >= sw.max { sw.max - 1 } else { index };
        let label = cx.read_u32(at, K, "label_list", sw.label_list + u64::from(chosen) * 4)?;
        let target = self.label_target(at, K, "label_list", label)?;
        streams.jump(at.stream, target);
        let note = if index >= sw.max {
            format!(
                "index {} ({}) is out of range [0, {}): last label {label}",
                index as i32, index, sw.max
            )
        } else {
            format!("index {index}: label {label}")
        };
        let model = streams.stream(at.stream).model();
        let now = cx.now();
        cx.lanes.instant(
            cx.chip.sink_mut(),
            at,
            model,
            "label_switch",
            chosen,
            note,
            now,
        );
        self.done_later(cx, at);
        Ok(())
    }

    /// Starts a model stream from its first task (no effect on a stream already running).
    fn activate<S: TraceSink>(
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        kind: &'static str,
        target: u32,
    ) -> Result<(), DeviceError> {
        let s = streams.get(target).ok_or_else(|| {
            bad(
                at,
                kind,
                "stream",
                format!("stream {target} does not exist"),
            )
        })?;
        if s.kind() == StreamKind::User {
            return Err(bad(
                at,
                kind,
                "stream",
                format!("stream {target} is a user stream; only model streams are activated"),
            ));
        }
        if s.state == StreamState::Idle {
            let now = cx.now();
            streams.stream_mut(target).rewind(now);
            streams.step_later(cx, target, now);
        }
        Ok(())
    }

    /// `StreamActive`: starts the target model stream (none: `NO_STREAM`).
    pub(crate) fn stream_active<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        target: u32,
    ) -> Result<(), DeviceError> {
        if target != gearsim_isa::task::NO_STREAM {
            Self::activate(cx, streams, at, "StreamActive", target)?;
        }
        self.done_later(cx, at);
        Ok(())
    }

    /// `StreamSwitch`: starts the true stream when the condition on the value in device memory
    /// holds.
    pub(crate) fn stream_switch<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        sw: &StreamSwitch,
    ) -> Result<(), DeviceError> {
        cx.check_range(at, "StreamSwitch", "cond_ptr", sw.cond_ptr, 8)?;
        let mut b = [0u8; 8];
        cx.chip.read_mem(sw.cond_ptr, &mut b)?;
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
            Self::activate(cx, streams, at, "StreamSwitch", sw.true_stream)?;
        }
        self.done_later(cx, at);
        Ok(())
    }

    /// `ModelExecute`: runs the model from its head stream; the task waits for the model to end.
    pub(crate) fn model_execute<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &mut Streams,
        at: TaskRef,
        m: u32,
    ) -> Result<(), DeviceError> {
        let model = self.models.get_mut(m as usize).ok_or_else(|| {
            bad(
                at,
                "ModelExecute",
                "model",
                format!("model {m} was never loaded"),
            )
        })?;
        if model.running {
            return Err(bad(
                at,
                "ModelExecute",
                "model",
                format!("model {m} is already running"),
            ));
        }
        model.running = true;
        model.end_requested = false;
        model.waiter = Some(at);
        let now = cx.now();
        for &s in &model.streams {
            streams.stream_mut(s).rewind(now);
        }
        let head = model.streams[0];
        let caller = streams.stream_mut(at.stream);
        let start = match caller.state {
            StreamState::Running { start, .. } => start,
            _ => now,
        };
        caller.state = StreamState::WaitModel {
            index: at.index,
            model: m,
            start,
        };
        streams.step_later(cx, head, now);
        Ok(())
    }

    /// `ModelEndGraph`: the model ends once all its streams have finished.
    pub(crate) fn model_end<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        m: u32,
    ) -> Result<(), DeviceError> {
        let model = self.models.get_mut(m as usize).ok_or_else(|| {
            bad(
                at,
                "ModelEndGraph",
                "model",
                format!("model {m} was never loaded"),
            )
        })?;
        model.end_requested = true;
        self.done_later(cx, at);
        Ok(())
    }

    /// A stream of model `m` ran out of tasks: when the model has asked to end and all its
    /// streams are idle, it ends and its `ModelExecute` is done.
    pub(crate) fn stream_finished<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        streams: &Streams,
        m: u32,
    ) {
        let model = &mut self.models[m as usize];
        if !model.running || !model.end_requested {
            return;
        }
        if !model
            .streams
            .iter()
            .all(|&s| streams.stream(s).state == StreamState::Idle)
        {
            return;
        }
        let waiter = model.waiter.take();
        model.running = false;
        if let Some(w) = waiter {
            let now = cx.now();
            cx.timer(
                now,
                Fw::Done {
                    stream: w.stream,
                    index: w.index,
                },
            );
        }
    }
}
