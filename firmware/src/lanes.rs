//! The firmware's trace lanes and names: the HWTS fetch lane, a lane per stream, per AI CPU,
//! per PCIe direction and per data queue, each registered with the trace sink on first use, and
//! the names it interns once. It writes records it is handed and knows nothing of the state
//! behind them; when the sink is disabled it registers and interns nothing.

use std::collections::BTreeMap;

use gearsim_isa::task::TaskKind;
use gearsim_sim::Tick;
use gearsim_traces::{Lane, LaneId, LaneKind, Record, StrId, TraceSink};

use crate::error::TaskRef;

/// Trace lanes of the firmware, registered on first use.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    scheduler: Option<LaneId>,
    streams: BTreeMap<u32, LaneId>,
    aicpu: BTreeMap<usize, LaneId>,
    /// Host to device, device to host.
    pcie: [Option<LaneId>; 2],
    queues: BTreeMap<u32, LaneId>,
    /// The L2 control sections launches apply.
    l2: Option<LaneId>,
    names: BTreeMap<String, StrId>,
}

fn lane<S: TraceSink>(sink: &mut S, process: &str, thread: String, kind: LaneKind) -> LaneId {
    sink.lane(Lane {
        process: process.to_string(),
        thread,
        kind,
    })
}

/// The lane kept for `key` in `map`, registered with the sink on first use (so the thread
/// name is formatted once per lane, not per record).
fn cached<K: Ord, S: TraceSink>(
    map: &mut BTreeMap<K, LaneId>,
    key: K,
    sink: &mut S,
    process: &str,
    thread: impl FnOnce() -> String,
    kind: LaneKind,
) -> LaneId {
    *map.entry(key)
        .or_insert_with(|| lane(sink, process, thread(), kind))
}

/// What a span of a task says: where it is, its kind and the name it was submitted with.
fn detail<S: TraceSink>(sink: &mut S, at: TaskRef, kind: TaskKind, name: Option<&str>) -> StrId {
    let text = match name {
        Some(n) => format!("{at}: {} {n}", kind.name()),
        None => format!("{at}: {}", kind.name()),
    };
    sink.intern(&text)
}

impl Lanes {
    fn name<S: TraceSink>(&mut self, sink: &mut S, s: &str) -> StrId {
        if let Some(id) = self.names.get(s) {
            return *id;
        }
        let id = sink.intern(s);
        self.names.insert(s.to_string(), id);
        id
    }

    /// The lane of `stream` (`model`: the model it belongs to).
    fn stream<S: TraceSink>(&mut self, sink: &mut S, stream: u32, model: Option<u32>) -> LaneId {
        let thread = || match model {
            None => format!("stream {stream}"),
            Some(m) => format!("stream {stream} (model {m})"),
        };
        cached(
            &mut self.streams,
            stream,
            sink,
            "streams",
            thread,
            LaneKind::Stream,
        )
    }

    /// The scheduler fetched a descriptor (`name`: the task's submitted name).
    pub(crate) fn fetch<S: TraceSink>(
        &mut self,
        sink: &mut S,
        at: TaskRef,
        kind: TaskKind,
        name: Option<&str>,
        start: Tick,
        end: Tick,
    ) {
        if !sink.enabled() {
            return;
        }
        let lane = match self.scheduler {
            Some(l) => l,
            None => {
                let l = lane(sink, "scheduler", "HWTS".into(), LaneKind::Scheduler);
                self.scheduler = Some(l);
                l
            }
        };
        let span = self.name(sink, "fetch");
        let detail = detail(sink, at, kind, name);
        sink.record(Record::Span {
            lane,
            name: span,
            start: start.0,
            end: end.0,
            pc: at.index,
            detail,
        });
    }

    /// A task ran on its stream.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn task<S: TraceSink>(
        &mut self,
        sink: &mut S,
        at: TaskRef,
        model: Option<u32>,
        kind: TaskKind,
        name: Option<&str>,
        start: Tick,
        end: Tick,
    ) {
        if !sink.enabled() {
            return;
        }
        let lane = self.stream(sink, at.stream, model);
        let span = self.name(sink, kind.name());
        let detail = detail(sink, at, kind, name);
        sink.record(Record::Span {
            lane,
            name: span,
            start: start.0,
            end: end.0.max(start.0),
            pc: at.index,
            detail,
        });
    }

    /// An L2 control section of the launch `at` took effect at `now`: `action` is `l2_keep`
    /// (at the kernel's start) or `l2_drop` (at its end).
    pub(crate) fn l2_control<S: TraceSink>(
        &mut self,
        sink: &mut S,
        at: TaskRef,
        action: &str,
        addr: u64,
        bytes: u64,
        now: Tick,
    ) {
        if !sink.enabled() {
            return;
        }
        let lane = *self
            .l2
            .get_or_insert_with(|| lane(sink, "chip", "L2 control".into(), LaneKind::Memory));
        let name = self.name(sink, action);
        let detail = sink.intern(&format!("{at}: [{addr:#x}, +{bytes})"));
        sink.record(Record::Instant {
            lane,
            name,
            at: now.0,
            arg: u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX),
            detail,
        });
    }

    /// Something happened to a task at `now` (a jump it took).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn instant<S: TraceSink>(
        &mut self,
        sink: &mut S,
        at: TaskRef,
        model: Option<u32>,
        name: &str,
        arg: u32,
        note: String,
        now: Tick,
    ) {
        if !sink.enabled() {
            return;
        }
        let lane = self.stream(sink, at.stream, model);
        let name = self.name(sink, name);
        let detail = sink.intern(&format!("{at}: {note}"));
        sink.record(Record::Instant {
            lane,
            name,
            at: now.0,
            arg,
            detail,
        });
    }

    /// An AI CPU ran a kernel.
    pub(crate) fn aicpu<S: TraceSink>(
        &mut self,
        sink: &mut S,
        cpu: usize,
        kernel: &str,
        at: TaskRef,
        start: Tick,
        end: Tick,
    ) {
        if !sink.enabled() {
            return;
        }
        let lane = cached(
            &mut self.aicpu,
            cpu,
            sink,
            "aicpu",
            || format!("aicpu {cpu}"),
            LaneKind::AiCpu,
        );
        let name = self.name(sink, kernel);
        let detail = sink.intern(&format!("{at}: {kernel}"));
        sink.record(Record::Span {
            lane,
            name,
            start: start.0,
            end: end.0,
            pc: at.index,
            detail,
        });
    }

    /// A PCIe link moved `bytes`.
    pub(crate) fn pcie<S: TraceSink>(
        &mut self,
        sink: &mut S,
        host_to_device: bool,
        bytes: u64,
        start: Tick,
        end: Tick,
    ) {
        if !sink.enabled() {
            return;
        }
        let dir = usize::from(!host_to_device);
        let lane = match self.pcie[dir] {
            Some(l) => l,
            None => {
                let thread = if host_to_device { "H2D" } else { "D2H" };
                let l = lane(sink, "pcie", thread.into(), LaneKind::Pcie);
                self.pcie[dir] = Some(l);
                l
            }
        };
        let name = self.name(sink, if host_to_device { "h2d" } else { "d2h" });
        let detail = sink.intern(&format!("{bytes} bytes"));
        sink.record(Record::Span {
            lane,
            name,
            start: start.0,
            end: end.0,
            pc: 0,
            detail,
        });
    }

    /// A data queue's depth changed at `now` (`what`: why).
    pub(crate) fn queue<S: TraceSink>(
        &mut self,
        sink: &mut S,
        queue: u32,
        depth: usize,
        what: &str,
        now: Tick,
    ) {
        if !sink.enabled() {
            return;
        }
        let lane = cached(
            &mut self.queues,
            queue,
            sink,
            "queues",
            || format!("queue {queue}"),
            LaneKind::Queue,
        );
        let depth_name = self.name(sink, "depth");
        let name = self.name(sink, what);
        sink.record(Record::Counter {
            lane,
            name: depth_name,
            at: now.0,
            value: depth as i64,
        });
        sink.record(Record::Instant {
            lane,
            name,
            at: now.0,
            arg: depth as u32,
            detail: StrId::EMPTY,
        });
    }
}
