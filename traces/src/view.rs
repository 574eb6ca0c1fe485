//! What an export shows of a trace: the level of detail (`task`: streams, host, PCIe, the
//! scheduler and AI CPU, no core lanes; `kernel`: those plus one span per kernel on each core
//! and per-pipe busy counters; `instruction`: every record), a time window and a set of cores.
//! Both exporters read a trace through [`View`], so they show the same events.
//!
//! A trace recorded at kernel level already holds each core's kernel and busy lanes, which
//! pass through; from a trace recorded at instruction level the view makes them, one kernel
//! span per run of the same kernel on a core, from the pipe spans.
//!
//! Task spans on stream lanes are named after their op (`/layer1/conv1/Conv`, read from the
//! detail `stream S task I: KIND NAME`) with the task kind as their category.

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::analysis::{kind_name, task_name};
use crate::{Lane, LaneKind, Level, Record, TraceFile};

/// What to export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Level of detail.
    pub level: Level,
    /// Only records inside `[start, end]` picoseconds (spans overlapping it are kept whole).
    pub window: Option<(u64, u64)>,
    /// Only these cores' lanes (by the number in the core lane's process name, `core3` is 3);
    /// other lanes are kept.
    pub cores: Option<BTreeSet<u32>>,
}

impl Filter {
    /// Everything, as recorded.
    pub fn all() -> Filter {
        Filter {
            level: Level::Instruction,
            window: None,
            cores: None,
        }
    }
}

/// One event of a view; strings borrow the trace or are made by the view.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<'a> {
    /// A span on a view lane.
    Span {
        /// View lane.
        lane: usize,
        /// Name.
        name: Cow<'a, str>,
        /// Category.
        cat: Cow<'a, str>,
        /// Start, ps.
        start: u64,
        /// End, ps.
        end: u64,
        /// The recorded pc (None for a span the view made).
        pc: Option<u32>,
        /// Detail text (empty when none).
        detail: &'a str,
    },
    /// A point event.
    Instant {
        /// View lane.
        lane: usize,
        /// Name.
        name: &'a str,
        /// Category.
        cat: &'a str,
        /// When, ps.
        at: u64,
        /// Its argument.
        arg: u32,
        /// Detail text.
        detail: &'a str,
    },
    /// A counter sample.
    Counter {
        /// View lane.
        lane: usize,
        /// Counter name.
        name: Cow<'a, str>,
        /// When, ps.
        at: u64,
        /// Value.
        value: i64,
    },
    /// A flow arrow.
    Flow {
        /// Name.
        name: &'a str,
        /// Id.
        id: u32,
        /// Source view lane and time.
        from: (usize, u64),
        /// Destination view lane and time.
        to: (usize, u64),
    },
}

/// A trace seen through a filter: its lanes (the trace's kept lanes, then at kernel level one
/// `kernels` and one `busy` lane per core) and its events.
pub struct View<'a> {
    trace: &'a TraceFile,
    filter: Filter,
    /// Per trace lane, its view lane (None: dropped).
    map: Vec<Option<usize>>,
    /// The view's lanes.
    pub lanes: Vec<Lane>,
    /// Per trace lane that is a core's pipe lane (kernel level): its core (an index into
    /// `cores`) and the pipe's index among that core's pipes.
    core_of: Vec<Option<(usize, usize)>>,
    /// Kernel level: each core shown.
    cores: Vec<CoreLanes>,
}

/// A core's lanes at kernel level.
struct CoreLanes {
    /// Its process name (`core3`).
    process: String,
    /// Its view lane of kernel spans.
    kernels: usize,
    /// Its view lane of busy counters.
    busy: usize,
    /// Its pipe lanes' names, in first-use order (the busy counters' names).
    pipes: Vec<String>,
}

/// The number in a core lane's process name (`core3` -> 3, `aiv5.1` -> 5).
fn core_number(process: &str) -> Option<u32> {
    let digits: String = process
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Whether a lane belongs to a core: its pipes, its recorded kernels, its busy counters (a
/// counter lane of a core's process, `core3` / `busy`).
fn is_core_lane(lane: &Lane) -> bool {
    match lane.kind {
        LaneKind::Pipe | LaneKind::Kernel => true,
        LaneKind::Counter => lane.thread == BUSY_THREAD,
        _ => false,
    }
}

/// The thread name of a core's kernel lane and of its busy counters.
pub const KERNELS_THREAD: &str = "kernels";
/// See [`KERNELS_THREAD`].
pub const BUSY_THREAD: &str = "busy";

/// The name of a pipe's busy-share counter (`VECTOR busy %`).
pub fn busy_counter_name(pipe: &str) -> String {
    format!("{pipe} busy %")
}

/// The kernel a pipe span's detail names (`name: instruction`).
fn kernel_of(detail: &str) -> &str {
    detail.split_once(": ").map_or(detail, |(k, _)| k)
}

impl<'a> View<'a> {
    /// `trace` through `filter`.
    pub fn new(trace: &'a TraceFile, filter: Filter) -> View<'a> {
        let mut lanes = Vec::new();
        let mut map = Vec::new();
        let mut core_of = Vec::new();
        let mut cores: Vec<CoreLanes> = Vec::new();
        for lane in trace.lanes() {
            let core = is_core_lane(lane).then(|| core_number(&lane.process));
            let wanted = match (&filter.cores, core) {
                (Some(set), Some(Some(n))) => set.contains(&n),
                (Some(_), Some(None)) => false,
                _ => true,
            };
            // Whether the lane is shown as recorded; at kernel level a wanted core lane feeds
            // its core's kernel spans and busy counters instead.
            let kept = match filter.level {
                Level::Instruction => wanted,
                Level::Kernel => core.is_none() || (lane.kind != LaneKind::Pipe && wanted),
                Level::Task => core.is_none(),
            };
            map.push(kept.then(|| {
                lanes.push(lane.clone());
                lanes.len() - 1
            }));
            if filter.level != Level::Kernel || lane.kind != LaneKind::Pipe || !wanted {
                core_of.push(None);
                continue;
            }
            let k = match cores.iter().position(|c| c.process == lane.process) {
                Some(k) => k,
                None => {
                    for (thread, kind) in [
                        (KERNELS_THREAD, LaneKind::Kernel),
                        (BUSY_THREAD, LaneKind::Counter),
                    ] {
                        lanes.push(Lane {
                            process: lane.process.clone(),
                            thread: thread.into(),
                            kind,
                        });
                    }
                    cores.push(CoreLanes {
                        process: lane.process.clone(),
                        kernels: lanes.len() - 2,
                        busy: lanes.len() - 1,
                        pipes: Vec::new(),
                    });
                    cores.len() - 1
                }
            };
            let pipes = &mut cores[k].pipes;
            let pipe = pipes
                .iter()
                .position(|p| *p == lane.thread)
                .unwrap_or_else(|| {
                    pipes.push(lane.thread.clone());
                    pipes.len() - 1
                });
            core_of.push(Some((k, pipe)));
        }
        View {
            trace,
            filter,
            map,
            lanes,
            core_of,
            cores,
        }
    }

    fn in_window(&self, start: u64, end: u64) -> bool {
        self.filter
            .window
            .is_none_or(|(lo, hi)| end >= lo && start <= hi)
    }

    /// Calls `f` with every event of the view, in the trace's record order (a kernel span and
    /// its busy counters when the core moves on to another kernel, or at the end).
    pub fn for_each<E>(&self, mut f: impl FnMut(Event<'a>) -> Result<(), E>) -> Result<(), E> {
        let trace = self.trace;
        // Kernel level: per core, the kernel running and its extent and busy time per pipe.
        struct Run<'s> {
            kernel: &'s str,
            start: u64,
            end: u64,
            busy: Vec<u64>,
        }
        let mut runs: Vec<Option<Run<'a>>> = (0..self.cores.len()).map(|_| None).collect();
        let flush = |k: usize,
                     r: Run<'a>,
                     f: &mut dyn FnMut(Event<'a>) -> Result<(), E>|
         -> Result<(), E> {
            let core = &self.cores[k];
            if !self.in_window(r.start, r.end) {
                return Ok(());
            }
            f(Event::Span {
                lane: core.kernels,
                name: Cow::Borrowed(r.kernel),
                cat: Cow::Borrowed("kernel"),
                start: r.start,
                end: r.end,
                pc: None,
                detail: "",
            })?;
            let len = r.end.saturating_sub(r.start).max(1);
            for (pipe, busy) in core.pipes.iter().zip(&r.busy) {
                f(Event::Counter {
                    lane: core.busy,
                    name: Cow::Owned(busy_counter_name(pipe)),
                    at: r.start,
                    value: (busy * 100 / len) as i64,
                })?;
                f(Event::Counter {
                    lane: core.busy,
                    name: Cow::Owned(busy_counter_name(pipe)),
                    at: r.end,
                    value: 0,
                })?;
            }
            Ok(())
        };
        for record in trace.records() {
            match record {
                Record::Span {
                    lane,
                    name,
                    start,
                    end,
                    pc,
                    detail,
                } => {
                    let i = usize::from(lane.0);
                    if let Some(Some((k, pipe))) = self.core_of.get(i).copied() {
                        let kernel = kernel_of(trace.string(detail));
                        let same = runs[k].as_ref().is_some_and(|r| r.kernel == kernel);
                        if !same {
                            if let Some(r) = runs[k].take() {
                                flush(k, r, &mut f)?;
                            }
                            runs[k] = Some(Run {
                                kernel,
                                start,
                                end,
                                busy: vec![0; self.cores[k].pipes.len()],
                            });
                        }
                        if let Some(r) = runs[k].as_mut() {
                            r.start = r.start.min(start);
                            r.end = r.end.max(end);
                            r.busy[pipe] += end.saturating_sub(start);
                        }
                        continue;
                    }
                    let Some(Some(v)) = self.map.get(i).copied() else {
                        continue;
                    };
                    if !self.in_window(start, end) {
                        continue;
                    }
                    let l = &trace.lanes()[i];
                    let kind = trace.string(name);
                    let detail = trace.string(detail);
                    let (name, cat) = match (l.kind, task_name(kind, detail)) {
                        (LaneKind::Stream, Some(op)) => (Cow::Borrowed(op), Cow::Borrowed(kind)),
                        _ => (Cow::Borrowed(kind), Cow::Borrowed(kind_name(l.kind))),
                    };
                    f(Event::Span {
                        lane: v,
                        name,
                        cat,
                        start,
                        end,
                        pc: Some(pc),
                        detail,
                    })?;
                }
                Record::Instant {
                    lane,
                    name,
                    at,
                    arg,
                    detail,
                } => {
                    let i = usize::from(lane.0);
                    let Some(Some(v)) = self.map.get(i).copied() else {
                        continue;
                    };
                    if !self.in_window(at, at) {
                        continue;
                    }
                    f(Event::Instant {
                        lane: v,
                        name: trace.string(name),
                        cat: kind_name(trace.lanes()[i].kind),
                        at,
                        arg,
                        detail: trace.string(detail),
                    })?;
                }
                Record::Counter {
                    lane,
                    name,
                    at,
                    value,
                } => {
                    let Some(Some(v)) = self.map.get(usize::from(lane.0)).copied() else {
                        continue;
                    };
                    if !self.in_window(at, at) {
                        continue;
                    }
                    f(Event::Counter {
                        lane: v,
                        name: Cow::Borrowed(trace.string(name)),
                        at,
                        value,
                    })?;
                }
                Record::Flow {
                    name,
                    id,
                    from_lane,
                    from_at,
                    to_lane,
                    to_at,
                } => {
                    let lane = |l: u16| self.map.get(usize::from(l)).copied().flatten();
                    let (Some(a), Some(b)) = (lane(from_lane.0), lane(to_lane.0)) else {
                        continue;
                    };
                    if !self.in_window(from_at.min(to_at), from_at.max(to_at)) {
                        continue;
                    }
                    f(Event::Flow {
                        name: trace.string(name),
                        id,
                        from: (a, from_at),
                        to: (b, to_at),
                    })?;
                }
            }
        }
        for (k, r) in runs.into_iter().enumerate() {
            if let Some(r) = r {
                flush(k, r, &mut f)?;
            }
        }
        Ok(())
    }
}
