//! Model-run phases in summaries and diffs: PCIe copies by lane, GetNext / GetDynamicDims /
//! MapIndex by task or AI CPU kernel name (concurrent spans counted once), the gear branch
//! from a stream's LabelSwitch to its LabelSet_Last, and lanes that must not count.

use gearsim_traces::{
    LaneId, LaneKind, Phase, PhaseDiff, PhaseTotal, Record, StrId, Summary, TraceFile, TraceSink,
    diff, summary,
};

use crate::{MemWriter, lane, write_trace};

/// The lanes the firmware's scheduler writes, registered in one trace.
struct Lanes {
    user_stream: LaneId,
    model_stream: LaneId,
    hwts: LaneId,
    aicpu: LaneId,
    h2d: LaneId,
    d2h: LaneId,
    vector: LaneId,
}

impl Lanes {
    fn new(w: &mut MemWriter) -> Lanes {
        Lanes {
            user_stream: w.lane(lane("streams", "stream 0", LaneKind::Stream)),
            model_stream: w.lane(lane("streams", "stream 1 (model 0)", LaneKind::Stream)),
            hwts: w.lane(lane("scheduler", "HWTS", LaneKind::Scheduler)),
            aicpu: w.lane(lane("aicpu", "aicpu 0", LaneKind::AiCpu)),
            h2d: w.lane(lane("pcie", "H2D", LaneKind::Pcie)),
            d2h: w.lane(lane("pcie", "D2H", LaneKind::Pcie)),
            vector: w.lane(lane("core0", "VECTOR", LaneKind::Pipe)),
        }
    }
}

/// A span named `name` with the detail `detail`, as the firmware records them.
fn span(w: &mut MemWriter, lane: LaneId, name: &str, detail: &str, start: u64, end: u64) {
    let name = w.intern(name);
    let detail = if detail.is_empty() {
        StrId::EMPTY
    } else {
        w.intern(detail)
    };
    w.record(Record::Span {
        lane,
        name,
        start,
        end,
        pc: 0,
        detail,
    });
}

/// A task span on a stream lane: named after its kind, the task's name in the detail.
fn task(w: &mut MemWriter, lane: LaneId, index: u32, kind: &str, name: &str, at: (u64, u64)) {
    let detail = format!("stream {} task {index}: {kind} {name}", lane.0);
    span(w, lane, kind, &detail, at.0, at.1);
}

/// How one model run goes; times in ps relative to the run's start.
struct Run {
    start: u64,
    /// MapIndex on the AI CPU (its kernel span inside the task) rather than the AI cores.
    mapindex_on_aicpu: bool,
    /// When the branch's last task ends (the branch itself starts at 3_700).
    branch_end: u64,
}

/// Records one sink-mode run of a gear model: two input copies, GetNext and GetDynamicDims
/// on the AI CPU, MapIndex, the Case, one output copy; plus the records around it that must
/// not count (the ModelExecute task naming the model, HWTS fetches naming tasks, a core's
/// instructions).
fn record_run(w: &mut MemWriter, l: &Lanes, run: &Run) {
    let t = |ps: u64| run.start + ps;
    let s = l.model_stream;
    let case = "ascend_mbatch_shape_case";
    span(w, l.h2d, "h2d", "4096 bytes", t(0), t(1_000));
    span(w, l.h2d, "h2d", "2048 bytes", t(1_000), t(1_500));
    let model_run = (t(1_600), run.branch_end + run.start + 160);
    // The user stream's ModelExecute covers the run and carries the model's name.
    task(
        w,
        l.user_stream,
        0,
        "ModelExecute",
        "getnext_mapindex_model",
        model_run,
    );

    task(
        w,
        s,
        0,
        "AiCpuKernel",
        "ascend_mbatch_getnext",
        (t(2_000), t(2_600)),
    );
    span(
        w,
        l.aicpu,
        "GetNext",
        "stream 1 task 0: GetNext",
        t(2_100),
        t(2_600),
    );
    task(
        w,
        s,
        1,
        "AiCpuKernel",
        "ascend_mbatch_get_dynamic_dims_node",
        (t(2_700), t(3_000)),
    );
    span(w, l.aicpu, "GetDynamicDims", "", t(2_750), t(3_000));

    let fetch = "stream 1 task 2: AiCoreKernel ascend_mbatch_shape_mapindex";
    span(w, l.hwts, "fetch", fetch, t(3_000), t(3_100));
    if run.mapindex_on_aicpu {
        task(
            w,
            s,
            2,
            "AiCpuKernel",
            "ascend_mbatch_shape_mapindex",
            (t(3_100), t(3_600)),
        );
        span(w, l.aicpu, "MapIndex", "", t(3_200), t(3_600));
    } else {
        task(
            w,
            s,
            2,
            "AiCoreKernel",
            "ascend_mbatch_shape_mapindex",
            (t(3_100), t(3_500)),
        );
        span(w, l.vector, "vcmp.eq.s32", "vcmp ...", t(3_200), t(3_300));
    }

    let switch = format!("{case}/LabelSwitch");
    task(w, s, 3, "LabelSwitchByIndex", &switch, (t(3_620), t(3_700)));
    task(
        w,
        s,
        4,
        "LabelSet",
        &format!("{case}/LabelSet_1"),
        (t(3_800), t(3_850)),
    );
    let active = format!("{case}/StreamActive_1");
    task(w, s, 5, "StreamActive", &active, (t(3_850), t(3_900)));
    task(
        w,
        s,
        6,
        "AiCoreKernel",
        "conv1",
        (t(3_900), t(run.branch_end - 100)),
    );
    let goto = format!("{case}/LabelGoto_1");
    task(
        w,
        s,
        7,
        "LabelGoto",
        &goto,
        (t(run.branch_end - 100), t(run.branch_end)),
    );
    let last = format!("{case}/LabelSet_Last");
    task(
        w,
        s,
        9,
        "LabelSet",
        &last,
        (t(run.branch_end), t(run.branch_end + 50)),
    );
    let end_graph = (t(run.branch_end + 100), t(run.branch_end + 150));
    task(w, s, 10, "ModelEndGraph", "EndGraph", end_graph);

    span(w, l.d2h, "d2h", "4096 bytes", t(5_400), t(6_000));
}

/// A trace of two runs (the second with MapIndex on the AI CPU and a shorter branch).
fn two_runs(first_branch_end: u64) -> Summary {
    let bytes = write_trace(|w| {
        let l = Lanes::new(w);
        for run in [
            Run {
                start: 0,
                mapindex_on_aicpu: false,
                branch_end: first_branch_end,
            },
            Run {
                start: 10_000,
                mapindex_on_aicpu: true,
                branch_end: 4_000,
            },
        ] {
            record_run(w, &l, &run);
        }
    });
    summary(&TraceFile::from_bytes(bytes).unwrap())
}

fn totals(s: &Summary) -> Vec<(&'static str, u64, u64)> {
    s.phases
        .iter()
        .map(|p| (p.phase.name(), p.count, p.total_ps))
        .collect()
}

#[test]
fn phases_are_timed_from_lanes_and_task_names() {
    let s = two_runs(5_200);
    assert_eq!(
        totals(&s),
        vec![
            // Two touching copies per run stay two stretches each.
            ("H2D", 4, 4 * 750),
            // The AI CPU kernel inside its task counts once.
            ("GetNext", 2, 2 * 600),
            ("GetDynamicDims", 2, 2 * 300),
            // 400 ps on the AI cores, 500 ps as a task around its AI CPU kernel.
            ("MapIndex", 2, 400 + 500),
            // LabelSwitch end (3_700) to LabelSet_Last start: 1_500 and 300.
            ("branch", 2, 1_500 + 300),
            ("D2H", 2, 2 * 600),
        ]
    );
    assert_eq!(s.window_ps(), 16_000);

    let text = s.to_string();
    let phases = &text[text.find("model-run phases").unwrap()..];
    let expected = "\
model-run phases (time in which each was in progress; mean per stretch):
phase           count   total    mean  window%
H2D                 4    3 ns  750 ps    18.8%
GetNext             2  1.2 ns  600 ps     7.5%
GetDynamicDims      2  600 ps  300 ps     3.8%
MapIndex            2  900 ps  450 ps     5.6%
branch              2  1.8 ns  900 ps    11.3%
D2H                 2  1.2 ns  600 ps     7.5%
";
    assert_eq!(phases, expected, "\n{text}");
}

#[test]
fn branches_pair_per_stream_and_case() {
    let bytes = write_trace(|w| {
        let a = w.lane(lane("streams", "stream 1 (model 0)", LaneKind::Stream));
        let b = w.lane(lane("streams", "stream 2 (model 1)", LaneKind::Stream));
        // Two models' branches overlap in time on their own streams; the union counts the
        // overlap once (one stretch, 100 to 700).
        task(
            w,
            a,
            1,
            "LabelSwitchByIndex",
            "m0_case/LabelSwitch",
            (0, 100),
        );
        task(
            w,
            b,
            1,
            "LabelSwitchByIndex",
            "m1_case/LabelSwitch",
            (0, 300),
        );
        task(w, b, 9, "LabelSet", "m1_case/LabelSet_Last", (500, 510));
        task(w, a, 9, "LabelSet", "m0_case/LabelSet_Last", (700, 710));
        // A LabelSet_Last of another Case on the same stream does not end m0's branch, and
        // a switch whose run never reached its exit (the trace ends) starts none.
        task(
            w,
            a,
            20,
            "LabelSwitchByIndex",
            "m0_case/LabelSwitch",
            (1_000, 1_100),
        );
        task(
            w,
            a,
            29,
            "LabelSet",
            "other_case/LabelSet_Last",
            (1_200, 1_210),
        );
        // A name without the firmware's detail is matched by the span name itself.
        let name = w.intern("MapIndex");
        w.record(Record::Span {
            lane: a,
            name,
            start: 2_000,
            end: 2_250,
            pc: 0,
            detail: StrId::EMPTY,
        });
    });
    let s = summary(&TraceFile::from_bytes(bytes).unwrap());
    let find = |phase: Phase| *s.phases.iter().find(|p| p.phase == phase).unwrap();
    assert_eq!(
        find(Phase::Branch),
        PhaseTotal {
            phase: Phase::Branch,
            count: 1,
            total_ps: 600
        }
    );
    assert_eq!(
        (find(Phase::MapIndex).count, find(Phase::MapIndex).total_ps),
        (1, 250)
    );
    assert_eq!(find(Phase::H2d).count, 0);
}

#[test]
fn traces_without_model_runs_have_zero_phases_and_print_none() {
    let bytes = write_trace(|w| {
        let v = w.lane(lane("core0", "VECTOR", LaneKind::Pipe));
        // A pipe lane and a PCIe lane of an unknown direction are not phases.
        let other = w.lane(lane("pcie", "P2P", LaneKind::Pcie));
        span(w, v, "mapindex", "", 0, 10);
        span(w, other, "copy", "", 0, 10);
    });
    let s = summary(&TraceFile::from_bytes(bytes).unwrap());
    assert_eq!(s.phases.len(), Phase::ALL.len());
    assert!(s.phases.iter().all(|p| p.count == 0 && p.total_ps == 0));
    assert!(!s.to_string().contains("model-run phases"));
}

#[test]
fn diff_compares_phases() {
    let base = two_runs(5_200);
    let other = two_runs(4_700);
    let d = diff(&base, &other);
    let branch = d.phases.iter().find(|p| p.phase == Phase::Branch).unwrap();
    assert_eq!(
        *branch,
        PhaseDiff {
            phase: Phase::Branch,
            base_count: 2,
            other_count: 2,
            base_ps: 1_800,
            other_ps: 1_300,
        }
    );
    assert_eq!((branch.total_delta(), branch.count_delta()), (-500, 0));
    assert!(
        d.phases
            .iter()
            .filter(|p| p.phase != Phase::Branch)
            .all(|p| p.total_delta() == 0 && p.count_delta() == 0)
    );

    let text = d.to_string();
    let phases = &text[text.find("model-run phases").unwrap()..];
    let expected = "\
model-run phases:
phase             base   other    delta  delta%  base count  other count  count delta
H2D               3 ns    3 ns     0 ps   +0.0%           4            4            0
GetNext         1.2 ns  1.2 ns     0 ps   +0.0%           2            2            0
GetDynamicDims  600 ps  600 ps     0 ps   +0.0%           2            2            0
MapIndex        900 ps  900 ps     0 ps   +0.0%           2            2            0
branch          1.8 ns  1.3 ns  -500 ps  -27.8%           2            2            0
D2H             1.2 ns  1.2 ns     0 ps   +0.0%           2            2            0
";
    assert_eq!(phases, expected, "\n{text}");

    // Phases only one side has are compared against zero.
    let empty = summary(&TraceFile::from_bytes(write_trace(|_| {})).unwrap());
    let d = diff(&empty, &base);
    let h2d = d.phases.first().unwrap();
    assert_eq!(
        (h2d.base_count, h2d.other_count, h2d.total_delta()),
        (0, 4, 3_000)
    );
    let h2d_row =
        "H2D             0 ps    3 ns    +3 ns       -           0            4           +4";
    assert!(d.to_string().contains(h2d_row), "{d}");
}
