//! `gearsim run --trace_level`: what a trace records. Task level keeps no core lanes, kernel
//! level (the default) one span per block on each core's kernel lane with its pipes' busy
//! shares and the memory counters averaged per microsecond, instruction level everything; the
//! simulated timeline is the same at every level.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::cli::gearsim;
use super::profile::compile_cnn;

use gearsim_traces::{Filter, LaneKind, Level, Record, TraceFile, View};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("trace_level");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `model` at batch 4 with a trace and outputs named after `tag` and the `extra` flags;
/// the trace file, the output directory and the run's standard output.
fn run_cnn(model: &str, tag: &str, extra: &[&str]) -> (PathBuf, PathBuf, String) {
    let trace = scratch(&format!("{tag}.gtrace"));
    let out = scratch(&format!("out_{tag}"));
    let (trace_arg, out_arg) = (trace.display().to_string(), out.display().to_string());
    let mut args = vec![
        "run",
        "--model",
        model,
        "--dymBatch",
        "4",
        "--trace",
        &trace_arg,
        "--output_dir",
        &out_arg,
    ];
    args.extend(extra);
    let o = gearsim(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (trace, out, String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The demo CNN with batch gears 1 and 4 for `soc`, run at batch 4 with a trace at `level`
/// (none: the default); the trace and the run's standard output.
fn traced_run(soc: &str, level: Option<&str>) -> (TraceFile, String) {
    let model = compile_cnn(&format!("cnn_trace_level_{soc}"), "1,4", soc);
    let tag = format!("{soc}_{}", level.unwrap_or("default"));
    let extra = level.map_or(vec![], |l| vec!["--trace_level", l]);
    let (trace, _, stdout) = run_cnn(&model, &tag, &extra);
    (TraceFile::open(&trace).unwrap(), stdout)
}

/// The NPU compute time line of a run's output.
fn compute_time(stdout: &str) -> &str {
    stdout
        .lines()
        .find(|l| l.starts_with("NPU_compute_time"))
        .expect("a compute time line")
}

/// Every span of lanes of `kind`: (process, thread, name, start, end).
fn spans(t: &TraceFile, kind: LaneKind) -> Vec<(String, String, String, u64, u64)> {
    let lanes = t.lanes();
    t.records()
        .filter_map(|r| match r {
            Record::Span {
                lane,
                name,
                start,
                end,
                ..
            } if lanes[usize::from(lane.0)].kind == kind => {
                let l = &lanes[usize::from(lane.0)];
                Some((
                    l.process.clone(),
                    l.thread.clone(),
                    t.string(name).to_string(),
                    start,
                    end,
                ))
            }
            _ => None,
        })
        .collect()
}

/// Per core, its kernel spans (name, start) as the kernel-level view of `t` shows them, runs
/// of one kernel merged.
fn kernel_view(t: &TraceFile) -> BTreeMap<String, Vec<(String, u64)>> {
    let view = View::new(
        t,
        Filter {
            level: Level::Kernel,
            ..Filter::all()
        },
    );
    let mut out: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    view.for_each(|e| {
        if let gearsim_traces::Event::Span {
            lane, name, start, ..
        } = e
        {
            let l = &view.lanes[lane];
            if l.kind == LaneKind::Kernel {
                let core = out.entry(l.process.clone()).or_default();
                if core.last().is_none_or(|(n, _)| *n != name) {
                    core.push((name.into_owned(), start));
                }
            }
        }
        Ok::<(), ()>(())
    })
    .unwrap();
    out
}

#[test]
fn each_level_records_its_detail_and_the_same_timeline() {
    for soc in ["ascend910", "ascend910b1"] {
        let (task, task_out) = traced_run(soc, Some("task"));
        let (kernel, kernel_out) = traced_run(soc, None);
        let (instr, instr_out) = traced_run(soc, Some("instruction"));
        // The same simulation whatever is recorded.
        assert_eq!(compute_time(&task_out), compute_time(&kernel_out), "{soc}");
        assert_eq!(compute_time(&instr_out), compute_time(&kernel_out), "{soc}");
        assert_eq!(
            spans(&task, LaneKind::Stream),
            spans(&instr, LaneKind::Stream),
            "{soc}"
        );
        assert_eq!(
            spans(&kernel, LaneKind::Stream),
            spans(&instr, LaneKind::Stream),
            "{soc}"
        );
        assert_eq!(kernel.meta_value("trace_level"), Some("kernel"));
        assert_eq!(task.meta_value("trace_level"), Some("task"));
        // What each level holds, and the format version it needs.
        let kinds = |t: &TraceFile| t.lanes().iter().map(|l| l.kind).collect::<Vec<_>>();
        assert!(
            !kinds(&task).contains(&LaneKind::Pipe) && !kinds(&task).contains(&LaneKind::Kernel)
        );
        assert!(
            !kinds(&kernel).contains(&LaneKind::Pipe) && kinds(&kernel).contains(&LaneKind::Kernel)
        );
        assert!(
            kinds(&instr).contains(&LaneKind::Pipe) && !kinds(&instr).contains(&LaneKind::Kernel)
        );
        assert_eq!(task.header().version_minor, 0);
        assert_eq!(kernel.header().version_minor, 1);
        assert_eq!(instr.header().version_minor, 0);
        assert!(
            kernel.record_count() * 20 < instr.record_count(),
            "{soc}: kernel level {} records, instruction level {}",
            kernel.record_count(),
            instr.record_count()
        );
        // The recorded kernel spans are the ones the kernel-level view makes of the
        // instruction trace: the same kernels on the same cores, starting at the same times.
        let recorded = kernel_view(&kernel);
        assert!(!recorded.is_empty(), "{soc}");
        assert_eq!(recorded, kernel_view(&instr), "{soc}");
        // Each block span has its pipes' busy shares, set at its start and cleared at its end.
        let blocks = spans(&kernel, LaneKind::Kernel);
        let lanes = kernel.lanes();
        let mut busy: BTreeMap<(String, u64), Vec<i64>> = BTreeMap::new();
        let mut memory_times = Vec::new();
        for r in kernel.records() {
            if let Record::Counter {
                lane, at, value, ..
            } = r
            {
                let l = &lanes[usize::from(lane.0)];
                if l.thread == "busy" {
                    busy.entry((l.process.clone(), at)).or_default().push(value);
                } else if l.thread == "HBM" {
                    memory_times.push(at);
                }
            }
        }
        for (core, _, name, start, end) in &blocks {
            let set = &busy[&(core.clone(), *start)];
            assert!(
                set.iter().all(|v| (0..=100).contains(v)),
                "{core} {name}: {set:?}"
            );
            assert!(set.iter().any(|v| *v > 0), "{core} {name}: {set:?}");
            assert!(busy.contains_key(&(core.clone(), *end)), "{core} {name}");
        }
        // Memory counters come per microsecond window (the last one closes the trace).
        assert!(!memory_times.is_empty());
        let last = memory_times.len() - 1;
        for (i, at) in memory_times.iter().enumerate() {
            assert!(
                i >= last - 1 || at % 1_000_000 == 0,
                "{soc}: HBM counter at {at} ps"
            );
        }
    }
}

#[test]
fn a_bad_trace_level_is_named() {
    let o = gearsim(&[
        "run",
        "--model",
        "m.om",
        "--trace",
        "t.gtrace",
        "--trace_level",
        "pipe",
    ]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("--trace_level")
            && e.contains("expected task, kernel or instruction, got `pipe`"),
        "{e}"
    );
    let o = gearsim(&["run", "--model", "m.om", "--trace_level", "task"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--trace"));
}

/// `gearsim run --threads N` only changes how fast the values are computed: the outputs, the
/// instruction-level trace and the report are the same bytes for one thread and for three.
#[test]
fn the_host_thread_count_changes_no_output_trace_or_time() {
    let model = compile_cnn("cnn_threads_ascend910", "1,4", "ascend910");
    let run = |threads: &str| {
        let tag = format!("threads_{threads}");
        let extra = ["--trace_level", "instruction", "--threads", threads];
        let (trace, out, stdout) = run_cnn(&model, &tag, &extra);
        let output = std::fs::read(out.join("output_0.npy")).unwrap();
        // The report names the files, which differ by the thread count in their names.
        let report = stdout.replace(&tag, "threads_N");
        (report, std::fs::read(&trace).unwrap(), output)
    };
    let one = run("1");
    let three = run("3");
    assert!(one.1.len() > 100_000, "a trace of every instruction");
    assert_eq!(one.0, three.0, "reports differ");
    assert!(one.1 == three.1, "traces differ");
    assert!(one.2 == three.2, "outputs differ");
}

/// A run whose host memory estimate exceeds the limit is refused before it starts: the message
/// names the estimate and the limit, the exit status is non-zero, and nothing is written.
#[test]
fn a_run_over_the_host_memory_limit_is_refused_before_it_starts() {
    let model = compile_cnn("cnn_memory_ascend910", "1,4", "ascend910");
    let out = scratch("out_memory_limit");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "kept").unwrap();
    let out_arg = out.display().to_string();
    let o = gearsim(&[
        "run",
        "--model",
        &model,
        "--dymBatch",
        "4",
        "--output_dir",
        &out_arg,
        "--host_memory_limit",
        "1M",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    for part in [
        "needs about",
        "GiB of host memory",
        "0.00 GiB it may use (--host_memory_limit)",
        "timing-only",
    ] {
        assert!(err.contains(part), "`{part}` missing from: {err}");
    }
    let files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files, ["keep.txt"], "a refused run wrote files");
    // Within the limit it runs.
    let o = gearsim(&[
        "run",
        "--model",
        &model,
        "--dymBatch",
        "4",
        "--host_memory_limit",
        "8G",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
