//! A run's profile as msprof and ais_bench show it: every task of the model's streams with its
//! times (msprof's `task_time`), one row per operator task (its `op_summary`: duration, wait,
//! block dim, per-pipe ratios, tensor shapes), and the run's phases (H2D, GetNext,
//! GetDynamicDims, MapIndex, branch, D2H).
//!
//! Everything here is read off the simulator's own records — the firmware's task log and its
//! per-kernel counters — so a ratio times its denominator gives back the counter it came from.

use gearsim_firmware::{KernelProfile, TaskSpan};
use gearsim_isa::Pipe;
use gearsim_isa::omtask::TensorInfo;
use gearsim_isa::task::{KernelKind, TaskKind};
use gearsim_sim::{ChipConfig, LANES};

use super::load::{LoadedModel, TaskMeta};

/// One task of a model stream as it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow {
    /// The task's name.
    pub name: String,
    /// The `.om` task kind (`AiCore`, `LabelSwitch` ...).
    pub kind: &'static str,
    /// Model stream.
    pub stream: u32,
    /// Index in that stream.
    pub index: u32,
    /// When it started (after its descriptor fetch), picoseconds since the device started.
    pub start_ps: u64,
    /// When it ended.
    pub end_ps: u64,
    /// From the end of the previous task of its stream in this run (or its own fetch, for the
    /// first) to its start: the fetch and any idle time.
    pub wait_ps: u64,
}

/// Busy shares of a kernel's pipes, each over the time its blocks ran on cores that have the
/// pipe (msprof's `*_ratio` columns).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PipeRatios {
    /// Cube.
    pub mac: f64,
    /// Vector.
    pub vec: f64,
    /// Scalar.
    pub scalar: f64,
    /// L1 -> L0.
    pub mte1: f64,
    /// Device memory -> core.
    pub mte2: f64,
    /// Core -> device memory.
    pub mte3: f64,
    /// FIXPIPE (L0C out).
    pub fixpipe: f64,
}

/// One operator task: a row of msprof's `op_summary`.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    /// Op Name.
    pub name: String,
    /// OP Type (empty when the `.om` does not say).
    pub op_type: String,
    /// Task Type: `AI_CORE`, `AI_VECTOR_CORE`, `MIX_AIC` or `AI_CPU`.
    pub task_type: &'static str,
    /// The task it is.
    pub task: TaskRow,
    /// Block Dim (0 for an AI CPU task).
    pub block_dim: u32,
    /// From its first block's start to its last block's end (AI core kernels only).
    pub aicore_ps: Option<u64>,
    /// Per-pipe busy shares (AI core kernels only).
    pub ratios: Option<PipeRatios>,
    /// Its inputs.
    pub inputs: Vec<TensorInfo>,
    /// Its outputs.
    pub outputs: Vec<TensorInfo>,
}

impl OpRow {
    /// Task Duration.
    pub fn duration_ps(&self) -> u64 {
        self.task.end_ps.saturating_sub(self.task.start_ps)
    }
}

/// A part of a run, on the device's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// `h2d`, `getnext`, `get_dynamic_dims`, `map_index`, `branch` (`graph` for a model
    /// without gears), `d2h`.
    pub name: &'static str,
    /// Start, picoseconds since the device started.
    pub start_ps: u64,
    /// End.
    pub end_ps: u64,
}

impl Phase {
    /// Its length.
    pub fn ps(&self) -> u64 {
        self.end_ps.saturating_sub(self.start_ps)
    }
}

/// What one run did, task by task.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunProfile {
    /// Every task of the model's streams that ran, in the order they ended.
    pub tasks: Vec<TaskRow>,
    /// The operator tasks among them, in the order they started.
    pub ops: Vec<OpRow>,
    /// The run's phases, in time order.
    pub phases: Vec<Phase>,
}

impl RunProfile {
    /// The phase called `name`.
    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// The ratio of `pipe` for kernel `k` on chip `cfg`.
fn ratio(k: &KernelProfile, pipe: Pipe, cfg: &ChipConfig) -> f64 {
    let Some(lane) = Pipe::EXECUTING.iter().position(|p| *p == pipe) else {
        return 0.0;
    };
    let cycles = k.pipe_ps[lane] as f64 * cfg.core.clock_mhz as f64 / 1e6;
    if cycles <= 0.0 {
        0.0
    } else {
        k.work.pipes[lane].busy_cycles as f64 / cycles
    }
}

/// The pipe ratios of kernel `k`.
pub fn pipe_ratios(k: &KernelProfile, cfg: &ChipConfig) -> PipeRatios {
    const _: () = assert!(LANES == Pipe::EXECUTING.len());
    PipeRatios {
        mac: ratio(k, Pipe::M, cfg),
        vec: ratio(k, Pipe::V, cfg),
        scalar: ratio(k, Pipe::S, cfg),
        mte1: ratio(k, Pipe::Mte1, cfg),
        mte2: ratio(k, Pipe::Mte2, cfg),
        mte3: ratio(k, Pipe::Mte3, cfg),
        fixpipe: ratio(k, Pipe::Fix, cfg),
    }
}

/// msprof's task type of an AI core kernel.
pub fn task_type(kind: KernelKind) -> &'static str {
    match kind {
        KernelKind::AiCore | KernelKind::Cube => "AI_CORE",
        KernelKind::Vector => "AI_VECTOR_CORE",
        KernelKind::Mix => "MIX_AIC",
    }
}

/// The profile of one execution of `model`: `log` is the firmware's task log over the run,
/// `kernels` its kernel profiles, `host` the phases the runtime timed itself (H2D, D2H).
pub fn build(
    model: &LoadedModel,
    log: &[TaskSpan],
    kernels: &[KernelProfile],
    cfg: &ChipConfig,
    host: &[Phase],
) -> RunProfile {
    let streams = model.tasks.len() as u32;
    let mine = |s: &TaskSpan| {
        s.model == Some(model.model.0)
            && s.task.stream >= model.first_stream
            && s.task.stream < model.first_stream + streams
    };
    let mut tasks = Vec::new();
    let mut ops = Vec::new();
    let mut last_end: Vec<Option<u64>> = vec![None; streams as usize];
    for span in log.iter().filter(|s| mine(s)) {
        let stream = span.task.stream - model.first_stream;
        let meta = model.tasks[stream as usize].get(span.task.index as usize);
        let previous = last_end[stream as usize].unwrap_or(span.fetch.0);
        last_end[stream as usize] = Some(span.end.0);
        let row = TaskRow {
            name: meta.map_or_else(String::new, |m| m.name.clone()),
            kind: meta.map_or(span.kind.name(), |m| m.kind),
            stream,
            index: span.task.index,
            start_ps: span.start.0,
            end_ps: span.end.0,
            wait_ps: span.start.0.saturating_sub(previous),
        };
        if let Some(op) = op_row(meta, span, &row, kernels, cfg) {
            ops.push(op);
        }
        tasks.push(row);
    }
    ops.sort_by_key(|o| (o.task.start_ps, o.task.stream, o.task.index));
    let mut phases: Vec<Phase> = host.iter().filter(|p| p.name == "h2d").cloned().collect();
    phases.extend(device_phases(&tasks));
    phases.extend(host.iter().filter(|p| p.name != "h2d").cloned());
    RunProfile { tasks, ops, phases }
}

/// The operator row of a task, when it runs an operator.
fn op_row(
    meta: Option<&TaskMeta>,
    span: &TaskSpan,
    row: &TaskRow,
    kernels: &[KernelProfile],
    cfg: &ChipConfig,
) -> Option<OpRow> {
    let meta = meta?;
    let op = meta.op.as_ref()?;
    let kernel = kernels.iter().find(|k| k.task == span.task);
    let (task_type, block_dim, aicore_ps, ratios) = match span.kind {
        TaskKind::AiCoreKernel => {
            let k = kernel?;
            (
                task_type(k.kind),
                k.block_dim,
                Some(k.end.0.saturating_sub(k.first_start.0)),
                Some(pipe_ratios(k, cfg)),
            )
        }
        TaskKind::AiCpuKernel => ("AI_CPU", 0, None, None),
        TaskKind::EventRecord
        | TaskKind::StreamWaitEvent
        | TaskKind::Memcpy
        | TaskKind::ModelExecute
        | TaskKind::NotifyWait
        | TaskKind::NotifyRecord
        | TaskKind::StreamSwitch
        | TaskKind::StreamActive
        | TaskKind::LabelSet
        | TaskKind::LabelGoto
        | TaskKind::Memset
        | TaskKind::ModelEndGraph
        | TaskKind::LabelSwitchByIndex => return None,
    };
    Some(OpRow {
        name: meta.name.clone(),
        op_type: op.op_type.clone(),
        task_type,
        task: row.clone(),
        block_dim,
        aicore_ps,
        ratios,
        inputs: op.inputs.clone(),
        outputs: op.outputs.clone(),
    })
}

/// The device-side phases: the selection tasks each, then the branch (from the LabelSwitch's
/// end to the end of the last task before EndGraph), or for a model without gears the graph
/// (from its first task's start to the same end).
fn device_phases(tasks: &[TaskRow]) -> Vec<Phase> {
    let mut out = Vec::new();
    for (kind, name) in [
        ("GetNext", "getnext"),
        ("GetDynamicDims", "get_dynamic_dims"),
        ("MapIndex", "map_index"),
    ] {
        let of: Vec<&TaskRow> = tasks.iter().filter(|t| t.kind == kind).collect();
        if let (Some(s), Some(e)) = (
            of.iter().map(|t| t.start_ps).min(),
            of.iter().map(|t| t.end_ps).max(),
        ) {
            out.push(Phase {
                name,
                start_ps: s,
                end_ps: e,
            });
        }
    }
    let end = tasks
        .iter()
        .filter(|t| t.kind != "EndGraph")
        .map(|t| t.end_ps)
        .max();
    let switch = tasks
        .iter()
        .filter(|t| t.kind == "LabelSwitch")
        .map(|t| t.end_ps)
        .max();
    let selection = out.iter().map(|p| p.end_ps).max();
    let (name, start) = match (switch, selection) {
        (Some(s), _) => ("branch", Some(s)),
        // A single-gear model has no LabelSwitch: its branch follows the selection.
        (None, Some(s)) => ("branch", Some(s)),
        (None, None) => ("graph", tasks.iter().map(|t| t.start_ps).min()),
    };
    if let (Some(start), Some(end)) = (start, end) {
        out.push(Phase {
            name,
            start_ps: start,
            end_ps: end.max(start),
        });
    }
    out
}
