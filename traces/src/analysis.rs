//! Analyses over a [`TraceFile`]: a per-lane busy-time summary, the time of each phase of the
//! model runs in it, and the diff of two summaries.
//!
//! Everything is computed with integer picoseconds; percentages appear only when printing.
//!
//! The phases ([`Phase`]) are recognised by the lanes and names the firmware's scheduler gives
//! its records (`firmware/src/scheduler.rs`, the `trace_*` functions):
//!
//! - PCIe copies are spans on `Pcie` lanes whose thread is `H2D` or `D2H`;
//! - a task is a span on a `Stream` lane named after its kind, with the detail
//!   `stream S task I: KIND NAME`, `NAME` being the task's name in its model (for a compiled
//!   model the graph node's, e.g. `ascend_mbatch_shape_mapindex`,
//!   `ascend_mbatch_shape_case/LabelSwitch`);
//! - an AI CPU kernel is a span on an `AiCpu` lane named after the kernel (`MapIndex`,
//!   `GetNext`, `GetDynamicDims`).
//!
//! AI core kernels show on the pipe lanes only as instructions, without the kernel's name, so
//! MapIndex on the AI cores is timed by its task on the stream lane (which lasts until its last
//! block finishes).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::{Lane, LaneKind, Record, StrId, TraceFile};

/// A short lower-case name for a lane kind (`pipe`, `counter`, `aicpu`, ...).
pub fn kind_name(kind: LaneKind) -> &'static str {
    match kind {
        LaneKind::Pipe => "pipe",
        LaneKind::Counter => "counter",
        LaneKind::Scheduler => "scheduler",
        LaneKind::Stream => "stream",
        LaneKind::AiCpu => "aicpu",
        LaneKind::Pcie => "pcie",
        LaneKind::Host => "host",
        LaneKind::Queue => "queue",
        LaneKind::Memory => "memory",
        LaneKind::Kernel => "kernel",
    }
}

/// Formats picoseconds exactly in the largest unit (ps, ns, us, ms, s) not exceeding them,
/// without trailing zeros: `1500` is `1.5 ns`, `2_000_000` is `2 us`.
pub fn format_ps(ps: u64) -> String {
    const UNITS: [(u64, usize, &str); 4] = [
        (1_000_000_000_000, 12, "s"),
        (1_000_000_000, 9, "ms"),
        (1_000_000, 6, "us"),
        (1_000, 3, "ns"),
    ];
    for (scale, digits, unit) in UNITS {
        if ps >= scale {
            let (int, frac) = (ps / scale, ps % scale);
            if frac == 0 {
                return format!("{int} {unit}");
            }
            let frac = format!("{frac:0digits$}");
            return format!("{int}.{} {unit}", frac.trim_end_matches('0'));
        }
    }
    format!("{ps} ps")
}

/// One lane's share of a [`Summary`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSummary {
    /// Process (group) name.
    pub process: String,
    /// Thread (track) name.
    pub thread: String,
    /// Lane kind.
    pub kind: LaneKind,
    /// Spans on the lane.
    pub spans: u64,
    /// Instants, counter samples and flows starting on the lane.
    pub samples: u64,
    /// Length of the union of the lane's span intervals (overlapping time counted once).
    pub busy_ps: u64,
    /// Earliest span start, if the lane has spans.
    pub first_start: Option<u64>,
    /// Latest span end, if the lane has spans.
    pub last_end: Option<u64>,
}

/// Total time spent in spans of one name, over all lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameTotal {
    /// Span name.
    pub name: String,
    /// Number of spans with this name.
    pub count: u64,
    /// Sum of their durations (saturating; overlapping spans count fully).
    pub total_ps: u64,
}

/// A phase of a model run, as [`summary`] times it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Host-to-device copies: spans on the PCIe `H2D` lane.
    H2d,
    /// GetNext (sink mode: the inputs taken from the data queue): tasks and AI CPU kernels
    /// whose name contains `getnext`.
    GetNext,
    /// GetDynamicDims (sink mode: the gear vector built from the input shapes): tasks and AI
    /// CPU kernels whose name contains `getdynamicdims`.
    GetDynamicDims,
    /// MapIndex (the gear lookup): tasks and AI CPU kernels whose name contains `mapindex`.
    MapIndex,
    /// The selected gear branch: from the end of a stream's `…/LabelSwitch` task to the start
    /// of the same Case's `…/LabelSet_Last` task on that stream, once per run.
    Branch,
    /// Device-to-host copies: spans on the PCIe `D2H` lane.
    D2h,
}

impl Phase {
    /// Every phase, in the order a model run goes through them.
    pub const ALL: [Phase; 6] = [
        Phase::H2d,
        Phase::GetNext,
        Phase::GetDynamicDims,
        Phase::MapIndex,
        Phase::Branch,
        Phase::D2h,
    ];

    /// The name printed for the phase.
    pub fn name(self) -> &'static str {
        match self {
            Phase::H2d => "H2D",
            Phase::GetNext => "GetNext",
            Phase::GetDynamicDims => "GetDynamicDims",
            Phase::MapIndex => "MapIndex",
            Phase::Branch => "branch",
            Phase::D2h => "D2H",
        }
    }

    /// The lower-case letters and digits a task or kernel name contains when it belongs to
    /// this phase (names are compared after dropping everything else, so
    /// `ascend_mbatch_get_dynamic_dims_node` and `GetDynamicDims` both match); `None` for
    /// phases found by lane or by a pair of tasks.
    fn name_key(self) -> Option<&'static str> {
        match self {
            Phase::GetNext => Some("getnext"),
            Phase::GetDynamicDims => Some("getdynamicdims"),
            Phase::MapIndex => Some("mapindex"),
            Phase::H2d | Phase::Branch | Phase::D2h => None,
        }
    }
}

/// The time of one [`Phase`] over a trace.
///
/// Work that runs concurrently counts once: `total_ps` is the length of the union of the
/// phase's intervals (a MapIndex task on its stream and the AI CPU kernel running it are one
/// stretch of time), and `count` the number of separate stretches in that union. Intervals
/// that merely touch stay separate, so back-to-back copies on the PCIe lane count one each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseTotal {
    /// The phase.
    pub phase: Phase,
    /// Separate stretches of time in the phase (normally one per run, or per copy).
    pub count: u64,
    /// Picoseconds in the phase.
    pub total_ps: u64,
}

/// Per-lane busy time and span counts, per-name totals, model-run phases and the trace's time
/// window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Records of all kinds.
    pub records: u64,
    /// Span records.
    pub spans: u64,
    /// Instant records.
    pub instants: u64,
    /// Counter records.
    pub counters: u64,
    /// Flow records.
    pub flows: u64,
    /// The earliest time in any record (span start, instant, counter sample, flow end point).
    pub start: Option<u64>,
    /// The latest time in any record.
    pub end: Option<u64>,
    /// One entry per lane, in lane table order.
    pub lanes: Vec<LaneSummary>,
    /// Span names by total duration, largest first (ties by name).
    pub names: Vec<NameTotal>,
    /// Kernel tasks (AI core and AI CPU kernels on stream lanes) by their op's name, by total
    /// duration, largest first (ties by name).
    pub kernels: Vec<NameTotal>,
    /// Whether printing shows idle lanes (no spans, samples or flows) too.
    pub all_lanes: bool,
    /// One entry per [`Phase`], in [`Phase::ALL`] order (count 0 for a phase the trace lacks).
    pub phases: Vec<PhaseTotal>,
}

impl Summary {
    /// Length of the window `[start, end]` (0 for a trace without records).
    pub fn window_ps(&self) -> u64 {
        match (self.start, self.end) {
            (Some(s), Some(e)) => e.saturating_sub(s),
            _ => 0,
        }
    }
}

/// Busy-time bookkeeping for one lane while streaming over the records.
///
/// While a lane's spans arrive ordered by start time, their union is merged on the fly in
/// constant memory. A lane whose spans arrive out of order is marked and its union is
/// recomputed exactly in a second pass that collects and sorts just that lane's intervals.
#[derive(Debug, Clone, Default)]
struct LaneAcc {
    spans: u64,
    samples: u64,
    first_start: Option<u64>,
    last_end: Option<u64>,
    busy: u64,
    current: Option<(u64, u64)>,
    unordered: bool,
}

impl LaneAcc {
    fn add(&mut self, start: u64, end: u64) {
        self.spans += 1;
        self.first_start = Some(self.first_start.map_or(start, |f| f.min(start)));
        self.last_end = Some(self.last_end.map_or(end, |l| l.max(end)));
        if self.unordered {
            return;
        }
        self.current = match self.current {
            None => Some((start, end)),
            Some((cs, _)) if start < cs => {
                self.unordered = true;
                None
            }
            Some((cs, ce)) if start <= ce => Some((cs, ce.max(end))),
            Some((cs, ce)) => {
                self.busy += ce - cs;
                Some((start, end))
            }
        };
    }

    fn finish(&mut self) {
        if let Some((cs, ce)) = self.current.take() {
            self.busy += ce - cs;
        }
    }
}

/// The total length of the union of `intervals` (each `(start, end)` with `end >= start`).
fn union_length(intervals: &mut [(u64, u64)]) -> u64 {
    intervals.sort_unstable();
    let mut total = 0u64;
    let mut current: Option<(u64, u64)> = None;
    for &(s, e) in intervals.iter() {
        current = match current {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = current {
        total += ce - cs;
    }
    total
}

/// The PCIe lane threads the firmware gives the two copy directions (`trace_pcie`).
const H2D_THREAD: &str = "H2D";
const D2H_THREAD: &str = "D2H";

/// Stream tasks of this kind cover a whole model run and are named after the model, so their
/// name says nothing about a phase.
const MODEL_EXECUTE: &str = "ModelExecute";

/// The task-name suffixes GE's Case lowering gives the switch into a gear branch and the
/// label every branch leaves through (`host/src/compiler/emit.rs`).
const LABEL_SWITCH_SUFFIX: &str = "/LabelSwitch";
const LABEL_SET_LAST_SUFFIX: &str = "/LabelSet_Last";

/// What a lane's spans can tell about the model-run phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum LaneRole {
    /// Every span is a phase of its own (the PCIe lanes).
    Whole(Phase),
    /// Spans are tasks, recognised by their name.
    Stream,
    /// Spans are AI CPU kernels, recognised by their name.
    AiCpu,
    /// Nothing to do with phases.
    Other,
}

fn lane_role(lane: &Lane) -> LaneRole {
    match lane.kind {
        LaneKind::Pcie if lane.thread == H2D_THREAD => LaneRole::Whole(Phase::H2d),
        LaneKind::Pcie if lane.thread == D2H_THREAD => LaneRole::Whole(Phase::D2h),
        LaneKind::Stream => LaneRole::Stream,
        LaneKind::AiCpu => LaneRole::AiCpu,
        LaneKind::Pipe
        | LaneKind::Counter
        | LaneKind::Scheduler
        | LaneKind::Pcie
        | LaneKind::Host
        | LaneKind::Queue
        | LaneKind::Memory
        | LaneKind::Kernel => LaneRole::Other,
    }
}

/// What one span on a stream or AI CPU lane is for the phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SpanClass {
    /// A span of this phase.
    In(Phase),
    /// The `…/LabelSwitch` task of the Case with this index: its end starts the branch.
    BranchStart(usize),
    /// The `…/LabelSet_Last` task of the Case with this index: its start ends the branch.
    BranchEnd(usize),
    /// None of the above.
    Unrelated,
}

/// One kernel task of a trace: an AI core or AI CPU kernel's span on its stream lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTask {
    /// The task's name (its op: `/layer1/conv1/Conv`), or the kind when the task has none.
    pub name: String,
    /// `AiCoreKernel` or `AiCpuKernel`.
    pub kind: String,
    /// The stream lane's thread name (`stream 3 (model 0)`).
    pub stream: String,
    /// Start, picoseconds.
    pub start: u64,
    /// End, picoseconds.
    pub end: u64,
}

/// The span names of kernel tasks on stream lanes.
const KERNEL_TASK_KINDS: [&str; 2] = ["AiCoreKernel", "AiCpuKernel"];

/// Every kernel task in the trace, in record order (the order they ended).
pub fn kernel_tasks(trace: &TraceFile) -> Vec<KernelTask> {
    let lanes = trace.lanes();
    let mut out = Vec::new();
    for record in trace.records() {
        let Record::Span {
            lane,
            name,
            start,
            end,
            detail,
            ..
        } = record
        else {
            continue;
        };
        let Some(l) = lanes.get(usize::from(lane.0)) else {
            continue;
        };
        if l.kind != LaneKind::Stream {
            continue;
        }
        let kind = trace.string(name);
        if !KERNEL_TASK_KINDS.contains(&kind) {
            continue;
        }
        let detail = trace.string(detail);
        out.push(KernelTask {
            name: task_name(kind, detail).unwrap_or(kind).to_string(),
            kind: kind.to_string(),
            stream: l.thread.clone(),
            start,
            end,
        });
    }
    out
}

/// The task's own name in a stream span's detail `stream S task I: KIND NAME`.
pub(crate) fn task_name<'a>(kind: &str, detail: &'a str) -> Option<&'a str> {
    detail
        .split_once(": ")?
        .1
        .strip_prefix(kind)?
        .strip_prefix(' ')
}

/// The phase a task or kernel name belongs to, by [`Phase::name_key`].
fn phase_by_name(name: &str) -> Option<Phase> {
    let key: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    Phase::ALL
        .into_iter()
        .find(|p| p.name_key().is_some_and(|k| key.contains(k)))
}

/// Collects each phase's intervals during the summary's pass over the records.
#[derive(Debug, Default)]
struct PhaseAcc {
    /// Per phase (indexed like [`Phase::ALL`]), its `(start, end)` intervals.
    intervals: [Vec<(u64, u64)>; Phase::ALL.len()],
    /// Per (lane role, span name, detail): the span's class, worked out once per distinct
    /// string pair rather than once per record.
    classes: HashMap<(LaneRole, StrId, StrId), SpanClass>,
    /// Case names (the part before `/LabelSwitch`), indexed by `SpanClass` branch indices.
    cases: Vec<String>,
    /// Per (stream lane, Case index): the times branches start (`false`) and end (`true`).
    branch_marks: BTreeMap<(u16, usize), Vec<(u64, bool)>>,
}

impl PhaseAcc {
    fn case_index(&mut self, case: &str) -> usize {
        match self.cases.iter().position(|c| c == case) {
            Some(i) => i,
            None => {
                self.cases.push(case.to_owned());
                self.cases.len() - 1
            }
        }
    }

    fn classify(&mut self, role: LaneRole, name: &str, detail: &str) -> SpanClass {
        match role {
            LaneRole::Stream => {
                if name == MODEL_EXECUTE {
                    return SpanClass::Unrelated;
                }
                let task = task_name(name, detail).unwrap_or(name);
                if let Some(case) = task.strip_suffix(LABEL_SWITCH_SUFFIX) {
                    return SpanClass::BranchStart(self.case_index(case));
                }
                if let Some(case) = task.strip_suffix(LABEL_SET_LAST_SUFFIX) {
                    return SpanClass::BranchEnd(self.case_index(case));
                }
                phase_by_name(task).map_or(SpanClass::Unrelated, SpanClass::In)
            }
            LaneRole::AiCpu => phase_by_name(name).map_or(SpanClass::Unrelated, SpanClass::In),
            LaneRole::Whole(phase) => SpanClass::In(phase),
            LaneRole::Other => SpanClass::Unrelated,
        }
    }

    /// Files one record of a lane with this role (only spans count).
    fn add(&mut self, trace: &TraceFile, role: LaneRole, record: Record) {
        let Record::Span {
            lane,
            name,
            start,
            end,
            detail,
            ..
        } = record
        else {
            return;
        };
        let class = match role {
            LaneRole::Other => return,
            LaneRole::Whole(phase) => SpanClass::In(phase),
            LaneRole::Stream | LaneRole::AiCpu => match self.classes.get(&(role, name, detail)) {
                Some(c) => *c,
                None => {
                    let c = self.classify(role, trace.string(name), trace.string(detail));
                    self.classes.insert((role, name, detail), c);
                    c
                }
            },
        };
        match class {
            SpanClass::In(phase) => self.intervals[phase as usize].push((start, end)),
            SpanClass::BranchStart(case) => {
                self.branch_marks
                    .entry((lane.0, case))
                    .or_default()
                    .push((end, false));
            }
            SpanClass::BranchEnd(case) => {
                self.branch_marks
                    .entry((lane.0, case))
                    .or_default()
                    .push((start, true));
            }
            SpanClass::Unrelated => {}
        }
    }

    fn finish(mut self) -> Vec<PhaseTotal> {
        // Each branch runs from a switch's end to the next exit label's start on its stream;
        // a switch whose run never reached the exit (a trace cut short) starts no branch.
        for marks in self.branch_marks.values_mut() {
            marks.sort_unstable();
            let mut open: Option<u64> = None;
            for &(t, is_end) in marks.iter() {
                match (is_end, open) {
                    (false, _) => open = Some(t),
                    (true, Some(s)) => {
                        self.intervals[Phase::Branch as usize].push((s, t));
                        open = None;
                    }
                    (true, None) => {}
                }
            }
        }
        Phase::ALL
            .into_iter()
            .zip(self.intervals)
            .map(|(phase, mut intervals)| {
                let (count, total_ps) = stretches(&mut intervals);
                PhaseTotal {
                    phase,
                    count,
                    total_ps,
                }
            })
            .collect()
    }
}

/// The number of separate stretches in the union of `intervals` and the union's length. An
/// interval joins the stretch before it when it overlaps it by a positive length or lies
/// inside it; one that only touches its end starts a new stretch.
fn stretches(intervals: &mut [(u64, u64)]) -> (u64, u64) {
    intervals.sort_unstable();
    let (mut count, mut total) = (0u64, 0u64);
    let mut current: Option<(u64, u64)> = None;
    for &(s, e) in intervals.iter() {
        current = match current {
            Some((cs, ce)) if s < ce || e <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                count += 1;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = current {
        total += ce - cs;
        count += 1;
    }
    (count, total)
}

/// Summarises a trace: per-lane span counts and busy time, per-name totals, model-run phases,
/// time window.
///
/// One streaming pass over the records; lanes whose spans are not ordered by start time get
/// a second pass over just their spans.
pub fn summary(trace: &TraceFile) -> Summary {
    let lanes = trace.lanes();
    let mut acc = vec![LaneAcc::default(); lanes.len()];
    let roles: Vec<LaneRole> = lanes.iter().map(lane_role).collect();
    let mut phases = PhaseAcc::default();
    let mut by_name: HashMap<StrId, (u64, u64)> = HashMap::new();
    // Kernel task spans by (kind, detail): the detail names the task, so it is parsed once.
    let mut by_task: HashMap<(StrId, StrId), (u64, u64)> = HashMap::new();
    let stream_lane: Vec<bool> = lanes.iter().map(|l| l.kind == LaneKind::Stream).collect();
    let (mut spans, mut instants, mut counters, mut flows) = (0u64, 0u64, 0u64, 0u64);
    let mut window: Option<(u64, u64)> = None;
    let mut see = |t: u64| {
        window = Some(window.map_or((t, t), |(s, e)| (s.min(t), e.max(t))));
    };
    for record in trace.records() {
        match record {
            Record::Span {
                lane,
                name,
                start,
                end,
                detail,
                ..
            } => {
                spans += 1;
                see(start);
                see(end);
                if stream_lane.get(usize::from(lane.0)) == Some(&true)
                    && KERNEL_TASK_KINDS.contains(&trace.string(name))
                {
                    let t = by_task.entry((name, detail)).or_default();
                    t.0 += 1;
                    t.1 = t.1.saturating_add(end.saturating_sub(start));
                }
                if let Some(a) = acc.get_mut(usize::from(lane.0)) {
                    a.add(start, end);
                }
                if let Some(&role) = roles.get(usize::from(lane.0)) {
                    phases.add(trace, role, record);
                }
                let total = by_name.entry(name).or_default();
                total.0 += 1;
                total.1 = total.1.saturating_add(end.saturating_sub(start));
            }
            Record::Instant { lane, at, .. } => {
                instants += 1;
                see(at);
                if let Some(a) = acc.get_mut(usize::from(lane.0)) {
                    a.samples += 1;
                }
            }
            Record::Counter { lane, at, .. } => {
                counters += 1;
                see(at);
                if let Some(a) = acc.get_mut(usize::from(lane.0)) {
                    a.samples += 1;
                }
            }
            Record::Flow {
                from_lane,
                from_at,
                to_at,
                ..
            } => {
                if let Some(a) = acc.get_mut(usize::from(from_lane.0)) {
                    a.samples += 1;
                }
                flows += 1;
                see(from_at);
                see(to_at);
            }
        }
    }

    // Exact unions for lanes whose spans came out of order.
    if acc.iter().any(|a| a.unordered) {
        let mut intervals: Vec<Option<Vec<(u64, u64)>>> =
            acc.iter().map(|a| a.unordered.then(Vec::new)).collect();
        for record in trace.records() {
            if let Record::Span {
                lane, start, end, ..
            } = record
                && let Some(Some(list)) = intervals.get_mut(usize::from(lane.0))
            {
                list.push((start, end));
            }
        }
        for (a, list) in acc.iter_mut().zip(intervals) {
            if let Some(mut list) = list {
                a.busy = union_length(&mut list);
            }
        }
    }

    let lanes = lanes
        .iter()
        .zip(acc)
        .map(|(lane, mut a)| {
            a.finish();
            LaneSummary {
                process: lane.process.clone(),
                thread: lane.thread.clone(),
                kind: lane.kind,
                spans: a.spans,
                samples: a.samples,
                busy_ps: a.busy,
                first_start: a.first_start,
                last_end: a.last_end,
            }
        })
        .collect();

    // Merge by text (distinct ids normally have distinct text), then order.
    let names = ordered_totals(
        by_name
            .into_iter()
            .map(|(id, total)| (trace.string(id), total)),
    );
    let kernels = ordered_totals(by_task.into_iter().map(|((kind, detail), total)| {
        let kind = trace.string(kind);
        (task_name(kind, trace.string(detail)).unwrap_or(kind), total)
    }));

    Summary {
        records: trace.record_count(),
        spans,
        instants,
        counters,
        flows,
        start: window.map(|w| w.0),
        end: window.map(|w| w.1),
        lanes,
        names,
        kernels,
        all_lanes: false,
        phases: phases.finish(),
    }
}

/// How many span names [`Summary`]'s `Display` lists.
const TOP_NAMES: usize = 10;

/// `num / den` as a percentage with one decimal, rounded half up; `-` when `den` is 0.
fn percent(num: u64, den: u64) -> String {
    if den == 0 {
        return "-".into();
    }
    let tenths = (u128::from(num) * 1000 + u128::from(den) / 2) / u128::from(den);
    format!("{}.{}%", tenths / 10, tenths % 10)
}

/// A signed percentage change relative to `base`, one decimal; `-` when `base` is 0.
fn signed_percent(delta: i128, base: u64) -> String {
    if base == 0 {
        return "-".into();
    }
    let sign = if delta < 0 { "-" } else { "+" };
    let magnitude = delta.unsigned_abs();
    let tenths = (magnitude * 1000 + u128::from(base) / 2) / u128::from(base);
    format!("{sign}{}.{}%", tenths / 10, tenths % 10)
}

/// A signed duration: `+1.5 us`, `-20 ps`, `0 ps`.
fn signed_ps(delta: i128) -> String {
    let magnitude = u64::try_from(delta.unsigned_abs()).unwrap_or(u64::MAX);
    match delta.signum() {
        1 => format!("+{}", format_ps(magnitude)),
        -1 => format!("-{}", format_ps(magnitude)),
        _ => format_ps(0),
    }
}

/// A signed count: `+3`, `-1`, `0`.
fn signed(delta: i128) -> String {
    if delta > 0 {
        format!("+{delta}")
    } else {
        delta.to_string()
    }
}

/// A text table with columns padded to their widest cell.
struct Table {
    header: Vec<&'static str>,
    /// Whether each column is right-aligned (numbers) rather than left-aligned (names).
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                let width = widths.get(i).copied().unwrap_or(0);
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right.get(i).copied().unwrap_or(false) {
                    line.push_str(&format!("{cell:>width$}"));
                } else {
                    line.push_str(&format!("{cell:<width$}"));
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

fn opt_ps(t: Option<u64>) -> String {
    t.map_or_else(|| "-".into(), format_ps)
}

/// `(name, (count, total ps))` pairs merged by name and ordered by total, largest first (ties
/// by name).
fn ordered_totals<'a>(items: impl Iterator<Item = (&'a str, (u64, u64))>) -> Vec<NameTotal> {
    let mut merged: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (name, (count, total)) in items {
        let m = merged.entry(name).or_default();
        m.0 += count;
        m.1 = m.1.saturating_add(total);
    }
    let mut out: Vec<NameTotal> = merged
        .into_iter()
        .map(|(name, (count, total_ps))| NameTotal {
            name: name.to_owned(),
            count,
            total_ps,
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ps
            .cmp(&a.total_ps)
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

/// The first [`TOP_NAMES`] of `totals` under `title`, each with its share of all of them.
fn top_table(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    first: &'static str,
    totals: &[NameTotal],
) -> fmt::Result {
    let all: u64 = totals.iter().fold(0, |s, n| s.saturating_add(n.total_ps));
    writeln!(f)?;
    writeln!(f, "{title}")?;
    let table = Table {
        header: vec![first, "count", "total", "share"],
        right: vec![false, true, true, true],
        rows: totals
            .iter()
            .take(TOP_NAMES)
            .map(|n| {
                vec![
                    n.name.clone(),
                    n.count.to_string(),
                    format_ps(n.total_ps),
                    percent(n.total_ps, all),
                ]
            })
            .collect(),
    };
    write!(f, "{table}")
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "records: {} ({} spans, {} instants, {} counters, {} flows); lanes: {}",
            self.records,
            self.spans,
            self.instants,
            self.counters,
            self.flows,
            self.lanes.len()
        )?;
        let window = self.window_ps();
        writeln!(
            f,
            "window: {} to {} ({})",
            opt_ps(self.start),
            opt_ps(self.end),
            format_ps(window)
        )?;
        writeln!(f)?;
        let idle = |l: &&LaneSummary| l.spans == 0 && l.samples == 0;
        let hidden = if self.all_lanes {
            0
        } else {
            self.lanes.iter().filter(idle).count()
        };
        let table = Table {
            header: vec![
                "process", "thread", "kind", "spans", "busy", "busy%", "first", "last",
            ],
            right: vec![false, false, false, true, true, true, true, true],
            rows: self
                .lanes
                .iter()
                .filter(|l| self.all_lanes || !idle(l))
                .map(|l| {
                    vec![
                        l.process.clone(),
                        l.thread.clone(),
                        kind_name(l.kind).to_owned(),
                        l.spans.to_string(),
                        format_ps(l.busy_ps),
                        percent(l.busy_ps, window),
                        opt_ps(l.first_start),
                        opt_ps(l.last_end),
                    ]
                })
                .collect(),
        };
        write!(f, "{table}")?;
        if hidden > 0 {
            writeln!(
                f,
                "({hidden} idle lane{} hidden; --all_lanes shows them)",
                if hidden == 1 { "" } else { "s" }
            )?;
        }
        // Kernels (ops) when the trace has tasks, else span names (a kernel run's).
        if !self.kernels.is_empty() {
            top_table(
                f,
                "top kernels (ops) by total duration:",
                "kernel",
                &self.kernels,
            )?;
        } else if !self.names.is_empty() {
            top_table(f, "top span names by total duration:", "name", &self.names)?;
        }
        if self.phases.iter().any(|p| p.count > 0) {
            writeln!(f)?;
            writeln!(
                f,
                "model-run phases (time in which each was in progress; mean per stretch):"
            )?;
            let table = Table {
                header: vec!["phase", "count", "total", "mean", "window%"],
                right: vec![false, true, true, true, true],
                rows: self
                    .phases
                    .iter()
                    .map(|p| {
                        vec![
                            p.phase.name().to_owned(),
                            p.count.to_string(),
                            format_ps(p.total_ps),
                            opt_ps(p.total_ps.checked_div(p.count)),
                            percent(p.total_ps, window),
                        ]
                    })
                    .collect(),
            };
            write!(f, "{table}")?;
        }
        Ok(())
    }
}

/// The span count and busy time of one lane (or of all lanes sharing a process/thread pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaneStats {
    /// Spans.
    pub spans: u64,
    /// Busy picoseconds.
    pub busy_ps: u64,
}

/// One lane compared across two summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneDiff {
    /// Process name.
    pub process: String,
    /// Thread name.
    pub thread: String,
    /// The lane in the base summary, if present there.
    pub base: Option<LaneStats>,
    /// The lane in the other summary, if present there.
    pub other: Option<LaneStats>,
}

impl LaneDiff {
    /// Other busy time minus base busy time (a missing side counts as 0).
    pub fn busy_delta(&self) -> i128 {
        let get = |s: Option<LaneStats>| i128::from(s.unwrap_or_default().busy_ps);
        get(self.other) - get(self.base)
    }

    /// Other span count minus base span count (a missing side counts as 0).
    pub fn span_delta(&self) -> i128 {
        let get = |s: Option<LaneStats>| i128::from(s.unwrap_or_default().spans);
        get(self.other) - get(self.base)
    }
}

/// One model-run phase compared across two summaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseDiff {
    /// The phase.
    pub phase: Phase,
    /// Its stretches in the base summary.
    pub base_count: u64,
    /// Its stretches in the other summary.
    pub other_count: u64,
    /// Its time in the base summary.
    pub base_ps: u64,
    /// Its time in the other summary.
    pub other_ps: u64,
}

impl PhaseDiff {
    /// Other time minus base time.
    pub fn total_delta(&self) -> i128 {
        i128::from(self.other_ps) - i128::from(self.base_ps)
    }

    /// Other count minus base count.
    pub fn count_delta(&self) -> i128 {
        i128::from(self.other_count) - i128::from(self.base_count)
    }
}

/// Two summaries compared lane by lane and phase by phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    /// The base trace's window length.
    pub base_window_ps: u64,
    /// The other trace's window length.
    pub other_window_ps: u64,
    /// Lanes in base order, then lanes only in the other summary in its order.
    pub lanes: Vec<LaneDiff>,
    /// One entry per [`Phase`], in [`Phase::ALL`] order.
    pub phases: Vec<PhaseDiff>,
}

impl Diff {
    /// Lanes present in both summaries.
    pub fn matched(&self) -> impl Iterator<Item = &LaneDiff> {
        self.lanes
            .iter()
            .filter(|l| l.base.is_some() && l.other.is_some())
    }

    /// Lanes present only in the base summary.
    pub fn only_in_base(&self) -> impl Iterator<Item = &LaneDiff> {
        self.lanes.iter().filter(|l| l.other.is_none())
    }

    /// Lanes present only in the other summary.
    pub fn only_in_other(&self) -> impl Iterator<Item = &LaneDiff> {
        self.lanes.iter().filter(|l| l.base.is_none())
    }
}

/// A lane's (process, thread) names, the key lanes are matched by.
type LaneKey<'a> = (&'a str, &'a str);

/// Lane stats keyed by (process, thread), in order of first appearance; lanes sharing a pair
/// (they differ only in kind) are added together.
fn by_process_thread(s: &Summary) -> (Vec<(LaneKey<'_>, LaneStats)>, HashMap<LaneKey<'_>, usize>) {
    let mut list: Vec<(LaneKey<'_>, LaneStats)> = Vec::new();
    let mut index = HashMap::new();
    for l in &s.lanes {
        let key = (l.process.as_str(), l.thread.as_str());
        let i = *index.entry(key).or_insert_with(|| {
            list.push((key, LaneStats::default()));
            list.len() - 1
        });
        if let Some(entry) = list.get_mut(i) {
            entry.1.spans = entry.1.spans.saturating_add(l.spans);
            entry.1.busy_ps = entry.1.busy_ps.saturating_add(l.busy_ps);
        }
    }
    (list, index)
}

/// A summary's count and time of `phase` (zero when it has no entry for it).
fn phase_of(s: &Summary, phase: Phase) -> (u64, u64) {
    s.phases
        .iter()
        .find(|p| p.phase == phase)
        .map_or((0, 0), |p| (p.count, p.total_ps))
}

/// Compares two summaries, matching lanes by (process, thread) and phases by phase.
pub fn diff(base: &Summary, other: &Summary) -> Diff {
    let (base_list, base_index) = by_process_thread(base);
    let (other_list, other_index) = by_process_thread(other);
    let mut lanes = Vec::with_capacity(base_list.len() + other_list.len());
    for &((process, thread), stats) in &base_list {
        let theirs = other_index
            .get(&(process, thread))
            .and_then(|&i| other_list.get(i))
            .map(|o| o.1);
        lanes.push(LaneDiff {
            process: process.to_owned(),
            thread: thread.to_owned(),
            base: Some(stats),
            other: theirs,
        });
    }
    for &((process, thread), stats) in &other_list {
        if !base_index.contains_key(&(process, thread)) {
            lanes.push(LaneDiff {
                process: process.to_owned(),
                thread: thread.to_owned(),
                base: None,
                other: Some(stats),
            });
        }
    }
    let phases = Phase::ALL
        .into_iter()
        .map(|phase| {
            let (base_count, base_ps) = phase_of(base, phase);
            let (other_count, other_ps) = phase_of(other, phase);
            PhaseDiff {
                phase,
                base_count,
                other_count,
                base_ps,
                other_ps,
            }
        })
        .collect();
    Diff {
        base_window_ps: base.window_ps(),
        other_window_ps: other.window_ps(),
        lanes,
        phases,
    }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let window_delta = i128::from(self.other_window_ps) - i128::from(self.base_window_ps);
        writeln!(
            f,
            "window: base {}, other {} ({}, {})",
            format_ps(self.base_window_ps),
            format_ps(self.other_window_ps),
            signed_ps(window_delta),
            signed_percent(window_delta, self.base_window_ps)
        )?;
        writeln!(f)?;
        let table = Table {
            header: vec![
                "process",
                "thread",
                "base busy",
                "other busy",
                "busy delta",
                "busy delta%",
                "base spans",
                "other spans",
                "span delta",
            ],
            right: vec![false, false, true, true, true, true, true, true, true],
            rows: self
                .matched()
                .map(|l| {
                    let (b, o) = (l.base.unwrap_or_default(), l.other.unwrap_or_default());
                    vec![
                        l.process.clone(),
                        l.thread.clone(),
                        format_ps(b.busy_ps),
                        format_ps(o.busy_ps),
                        signed_ps(l.busy_delta()),
                        signed_percent(l.busy_delta(), b.busy_ps),
                        b.spans.to_string(),
                        o.spans.to_string(),
                        signed(l.span_delta()),
                    ]
                })
                .collect(),
        };
        write!(f, "{table}")?;
        for (title, side, lanes) in [
            (
                "only in base",
                "base",
                self.only_in_base().collect::<Vec<_>>(),
            ),
            (
                "only in other",
                "other",
                self.only_in_other().collect::<Vec<_>>(),
            ),
        ] {
            if lanes.is_empty() {
                continue;
            }
            writeln!(f)?;
            writeln!(f, "{title}:")?;
            let table = Table {
                header: vec!["process", "thread", "busy", "spans"],
                right: vec![false, false, true, true],
                rows: lanes
                    .iter()
                    .map(|l| {
                        let s = if side == "base" { l.base } else { l.other }.unwrap_or_default();
                        vec![
                            l.process.clone(),
                            l.thread.clone(),
                            format_ps(s.busy_ps),
                            s.spans.to_string(),
                        ]
                    })
                    .collect(),
            };
            write!(f, "{table}")?;
        }
        if self
            .phases
            .iter()
            .any(|p| p.base_count > 0 || p.other_count > 0)
        {
            writeln!(f)?;
            writeln!(f, "model-run phases:")?;
            let table = Table {
                header: vec![
                    "phase",
                    "base",
                    "other",
                    "delta",
                    "delta%",
                    "base count",
                    "other count",
                    "count delta",
                ],
                right: vec![false, true, true, true, true, true, true, true],
                rows: self
                    .phases
                    .iter()
                    .map(|p| {
                        vec![
                            p.phase.name().to_owned(),
                            format_ps(p.base_ps),
                            format_ps(p.other_ps),
                            signed_ps(p.total_delta()),
                            signed_percent(p.total_delta(), p.base_ps),
                            p.base_count.to_string(),
                            p.other_count.to_string(),
                            signed(p.count_delta()),
                        ]
                    })
                    .collect(),
            };
            write!(f, "{table}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_ps_is_exact() {
        assert_eq!(format_ps(0), "0 ps");
        assert_eq!(format_ps(999), "999 ps");
        assert_eq!(format_ps(1_500), "1.5 ns");
        assert_eq!(format_ps(2_000_000), "2 us");
        assert_eq!(format_ps(1_234_567), "1.234567 us");
        assert_eq!(format_ps(3_000_000_000_001), "3.000000000001 s");
    }

    #[test]
    fn percentages_round_half_up() {
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(2, 3), "66.7%");
        assert_eq!(percent(5, 0), "-");
        assert_eq!(signed_percent(-1, 8), "-12.5%");
        assert_eq!(signed_percent(1, 3), "+33.3%");
    }

    #[test]
    fn stretches_merge_overlaps_and_keep_touching_intervals_apart() {
        // Nested (a kernel inside its task), overlapping, touching and empty-at-the-end.
        let mut v = vec![(0, 10), (2, 10), (8, 12), (12, 15), (15, 15), (20, 20)];
        assert_eq!(stretches(&mut v), (3, 15));
        assert_eq!(stretches(&mut []), (0, 0));
    }

    #[test]
    fn phases_index_their_intervals_in_all_order() {
        // `PhaseAcc` indexes its interval lists by discriminant and zips them with `ALL`.
        for (i, p) in Phase::ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i, "{p:?}");
        }
    }

    #[test]
    fn task_names_come_from_the_detail() {
        let detail = "stream 3 task 1: LabelSwitchByIndex ascend_mbatch_shape_case/LabelSwitch";
        assert_eq!(
            task_name("LabelSwitchByIndex", detail),
            Some("ascend_mbatch_shape_case/LabelSwitch")
        );
        assert_eq!(
            task_name("AiCoreKernel", "stream 3 task 1: AiCoreKernel"),
            None
        );
        assert_eq!(
            phase_by_name("ascend_mbatch_get_dynamic_dims_node"),
            Some(Phase::GetDynamicDims)
        );
        assert_eq!(phase_by_name("ascend_mbatch_getnext"), Some(Phase::GetNext));
        assert_eq!(phase_by_name("MapIndex"), Some(Phase::MapIndex));
        assert_eq!(phase_by_name("conv1/Relu"), None);
    }

    #[test]
    fn union_of_intervals() {
        let mut v = vec![(5, 10), (0, 3), (2, 4), (10, 12), (20, 20)];
        assert_eq!(union_length(&mut v), 4 + 7);
    }
}
