//! msprof-style profiles: one op_summary row per operator task, whose durations account for
//! the branch's time and whose pipe ratios give back the simulator's own counters; the files
//! `gearsim run --profile` writes; runs without input files at a chosen gear.

use std::path::{Path, PathBuf};

use super::cli::gearsim;

use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_compiler::precision::PrecisionMode;
use gearsim_host::calibrate::nets::{DType, Net};
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_isa::Pipe;
use gearsim_isa::tensor::{DataType, Tensor};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::NullSink;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("profile");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The demo CNN compiled with batch gears `gears` for `soc` into the scratch folder: its path.
pub(crate) fn compile_cnn(name: &str, gears: &str, soc: &str) -> String {
    let om = scratch(name);
    let onnx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models/cnn.onnx");
    let o = gearsim(&[
        "compile",
        "--model",
        &onnx.display().to_string(),
        "--output",
        &om.display().to_string(),
        "--input_shape",
        "input:-1,3,32,32",
        "--dynamic_batch_size",
        gears,
        "--soc_version",
        soc,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    format!("{}.om", om.display())
}

/// ResNet-18 (fp16, random weights) with batch gears 1 and 2 on `cfg`, run timing-only at
/// batch 1 with profiles on.
fn resnet18_gear_run(cfg: &ChipConfig) -> gearsim_host::runtime::RunReport {
    let onnx = Net::ResNet18.onnx(1, DType::F16, 7);
    let opts = CompileOptions {
        gear: GearOptions {
            input_shape: Some("input:-1,3,224,224".into()),
            dynamic_batch_size: Some("1,2".into()),
            ..Default::default()
        },
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: PrecisionMode::ForceFp16,
        target: gearsim_host::atc::target(cfg),
    };
    let om = compile(&onnx, "resnet18.onnx", &opts)
        .unwrap()
        .om_bytes()
        .unwrap();
    let mut rt = Runtime::new(
        cfg.clone(),
        NullSink,
        RuntimeOptions {
            exec_mode: ExecMode::TimingOnly,
            profile: true,
            ..Default::default()
        },
    )
    .unwrap();
    let m = rt.load(&om).unwrap();
    let x = Tensor::new(
        DataType::F16,
        vec![1, 3, 224, 224],
        vec![0; 3 * 224 * 224 * 2],
    )
    .unwrap();
    rt.run(m, &[x]).unwrap()
}

#[test]
fn op_rows_account_for_the_branch_and_their_ratios_are_the_counters() {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let r = resnet18_gear_run(&cfg);
    let p = r.profile.as_ref().expect("profiling was on");
    let names: Vec<&str> = p.phases.iter().map(|ph| ph.name).collect();
    assert_eq!(names, ["h2d", "map_index", "branch", "d2h"]);
    let branch = p.phase("branch").unwrap();
    let in_branch: Vec<_> = p
        .ops
        .iter()
        .filter(|o| o.task.start_ps >= branch.start_ps && o.task.end_ps <= branch.end_ps)
        .collect();
    // Every kernel of the branch is a row, named after its node, typed, with its tensors.
    assert_eq!(
        in_branch.len() + 1,
        p.ops.len(),
        "all but MapIndex are in the branch"
    );
    assert_eq!(p.ops[0].op_type, "MapIndex");
    for o in &in_branch {
        assert!(o.name.contains("_ascend_mbatch_batch_0"), "{}", o.name);
        assert!(!o.op_type.is_empty() && !o.outputs.is_empty(), "{o:?}");
    }
    assert!(in_branch.iter().any(|o| o.op_type == "Conv"));
    // The branch is its tasks back to back, each its descriptor fetch (its wait) and its run:
    // the op rows' durations, the label tasks' and the fetches add up to it exactly, and what
    // is not an op is no more than a fetch and a control task per task.
    let tasks: Vec<_> = p
        .tasks
        .iter()
        .filter(|t| t.start_ps >= branch.start_ps && t.end_ps <= branch.end_ps)
        .collect();
    let covered: u64 = tasks
        .iter()
        .map(|t| t.wait_ps + t.end_ps - t.start_ps)
        .sum();
    assert_eq!(covered, branch.ps(), "the branch's tasks and fetches");
    let sum: u64 = in_branch.iter().map(|o| o.duration_ps()).sum();
    assert!(
        sum <= branch.ps(),
        "op durations {sum} ps past the branch's"
    );
    let per_task_ps = (cfg.scheduler.task_fetch_ns + cfg.scheduler.control_task_ns) * 1000;
    assert!(
        branch.ps() - sum <= tasks.len() as u64 * per_task_ps,
        "op durations {sum} ps of a {} ps branch of {} tasks",
        branch.ps(),
        tasks.len()
    );
    let share = sum as f64 / branch.ps() as f64;
    assert!(
        share >= 0.98,
        "op durations {sum} ps of a {} ps branch ({share:.4})",
        branch.ps()
    );
    // A ratio times the time its blocks ran on cores with the pipe is the pipe's busy count.
    let clock = cfg.core.clock_mhz as f64 / 1e6;
    let mut checked = 0;
    for o in &p.ops {
        let Some(ratios) = o.ratios else { continue };
        let k = r
            .kernels
            .iter()
            .find(|k| k.task.index == o.task.index)
            .expect("its kernel profile");
        assert_eq!(k.block_dim, o.block_dim);
        for (pipe, ratio) in [
            (Pipe::M, ratios.mac),
            (Pipe::V, ratios.vec),
            (Pipe::S, ratios.scalar),
            (Pipe::Mte1, ratios.mte1),
            (Pipe::Mte2, ratios.mte2),
            (Pipe::Mte3, ratios.mte3),
            (Pipe::Fix, ratios.fixpipe),
        ] {
            let lane = Pipe::EXECUTING.iter().position(|p| *p == pipe).unwrap();
            let busy = k.work.pipes[lane].busy_cycles as f64;
            let back = ratio * k.pipe_ps[lane] as f64 * clock;
            assert!(
                (back - busy).abs() <= 1e-6 * busy.max(1.0),
                "{} {pipe:?}: {ratio} gives {back}, counter {busy}",
                o.name
            );
            assert!(
                (0.0..=1.0 + 1e-9).contains(&ratio),
                "{} {pipe:?} {ratio}",
                o.name
            );
            checked += 1;
        }
    }
    assert!(checked >= 7 * 20, "{checked} ratios checked");
    let conv = p.ops.iter().find(|o| o.op_type == "Conv").unwrap();
    assert!(
        conv.ratios.unwrap().mac > 0.0,
        "a convolution keeps the cube busy"
    );
}

#[test]
fn run_profile_writes_msprof_files_and_json_has_phases_and_ops() {
    let model = compile_cnn("cnn", "1,2,4", "ascend310p");
    let dir = scratch("cnn_profile");
    let _ = std::fs::remove_dir_all(&dir);
    let o = gearsim(&[
        "run",
        "--model",
        &model,
        "--dymBatch",
        "2",
        "--input_gen",
        "random",
        "--loop",
        "3",
        "--profile",
        &dir.display().to_string(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("dims [2] are gear 1"), "{out}");
    assert!(out.contains("NPU_compute_time (ms): min = "), "{out}");
    assert!(out.contains("throughput 1000*batchsize.mean(2)"), "{out}");
    let csv = std::fs::read_to_string(dir.join("op_summary.csv")).unwrap();
    let mut lines = csv.lines();
    let header = lines.next().unwrap();
    assert_eq!(
        header,
        gearsim_host::msprof::OP_SUMMARY_COLUMNS.join(","),
        "msprof's column names"
    );
    let rows: Vec<&str> = lines.collect();
    let per_run = rows.iter().filter(|l| l.starts_with("cnn,0,")).count();
    assert!(per_run > 5, "{csv}");
    assert_eq!(rows.len(), 3 * per_run, "one block of rows per loop");
    assert!(csv.contains("\"2,3,32,32\""), "shapes are quoted: {csv}");
    let tasks = std::fs::read_to_string(dir.join("task_time.csv")).unwrap();
    assert!(tasks.contains("LabelSwitch"), "{tasks}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["npu_compute_time"]["loops"], 3);
    let phases: Vec<&str> = summary["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["h2d", "map_index", "branch", "d2h"]);
    assert!(
        std::fs::read_to_string(dir.join("summary.txt"))
            .unwrap()
            .contains("phases: h2d ")
    );
    // --json carries the same phases and the op list.
    let o = gearsim(&["run", "--model", &model, "--dymBatch", "4", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["gear"], 2);
    assert!(j["phases"].as_array().unwrap().len() == 4);
    let ops = j["ops"].as_array().unwrap();
    assert_eq!(ops.len(), per_run);
    assert!(
        ops[1]["Op Name"]
            .as_str()
            .unwrap()
            .contains("_ascend_mbatch_batch_2"),
        "{}",
        ops[1]
    );
}

#[test]
fn made_up_inputs_need_a_gear_of_the_model_and_not_both_sources() {
    let model = compile_cnn("cnn_gen", "1,2", "ascend910");
    let fails = |args: &[&str], says: &str| {
        let o = gearsim(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    };
    fails(
        &["run", "--model", &model],
        "has gears [1] [2]: choose the shapes",
    );
    fails(&["run", "--model", &model, "--dymBatch", "3"], "E13025");
    fails(
        &["run", "--model", &model, "--dymHW", "4,4"],
        "no dynamic image size",
    );
    fails(
        &["run", "--model", &model, "--dymDims", "image:1,3,32,32"],
        "the model has no input `image`",
    );
    fails(
        &["run", "--model", &model, "--dymDims", "input:1,3,30,32"],
        "input `input` is [-1,3,32,32] in the model, got [1,3,30,32]",
    );
    fails(
        &[
            "run",
            "--model",
            &model,
            "--dymBatch",
            "1",
            "--dymHW",
            "1,1",
        ],
        "give at most one",
    );
    fails(
        &[
            "run",
            "--model",
            &model,
            "--dymBatch",
            "1",
            "--input_gen",
            "ones",
        ],
        "expected zeros or random",
    );
    let x = scratch("x.npy");
    std::fs::write(
        &x,
        gearsim_host::npy::encode(
            &gearsim_host::inputs::generate(
                &gearsim_isa::om::OmFile::parse(&std::fs::read(&model).unwrap())
                    .unwrap()
                    .desc()
                    .unwrap(),
                &gearsim_host::inputs::GearChoice::Batch(1),
                gearsim_host::inputs::Fill::Zeros,
            )
            .unwrap()[0],
        ),
    )
    .unwrap();
    fails(
        &[
            "run",
            "--model",
            &model,
            "--input",
            &x.display().to_string(),
            "--dymBatch",
            "1",
        ],
        "give one or the other",
    );
    // The same seed makes the same inputs, hence the same outputs.
    let out = |seed: &str| {
        let dir = scratch(&format!("gen_{seed}"));
        let o = gearsim(&[
            "run",
            "--model",
            &model,
            "--dymBatch",
            "2",
            "--input_gen",
            "random",
            "--seed",
            seed,
            "--output_dir",
            &dir.display().to_string(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(dir.join("output_0.npy")).unwrap()
    };
    assert_eq!(out("5"), out("5"));
    assert_ne!(out("5"), out("6"));
}

#[test]
fn trace_summary_lists_kernels_by_op_and_hides_idle_lanes() {
    let model = compile_cnn("cnn_trace", "1,2", "ascend910");
    let trace = scratch("cnn_run.gtrace");
    let o = gearsim(&[
        "run",
        "--model",
        &model,
        "--dymBatch",
        "2",
        "--trace",
        &trace.display().to_string(),
        "--trace_level",
        "instruction",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("output 0 `logits`: f32 [2,10]"), "{out}");
    let t = trace.display().to_string();
    let o = gearsim(&["trace", "summary", &t]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    let kernels = s
        .split("top kernels (ops) by total duration:")
        .nth(1)
        .expect("a top-kernels table");
    assert!(
        kernels.contains("/conv1/Conv_ascend_mbatch_batch_1"),
        "{kernels}"
    );
    assert!(!s.contains("top span names"), "{s}");
    let hidden: usize = s
        .lines()
        .find_map(|l| l.strip_prefix('('))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a line counting the hidden lanes");
    assert!(hidden > 0, "{s}");
    let all = gearsim(&["trace", "summary", &t, "--all_lanes"]);
    let all = String::from_utf8_lossy(&all.stdout);
    assert!(!all.contains("idle lane"), "{all}");
    assert_eq!(all.lines().count(), s.lines().count() - 1 + hidden);
}

#[test]
fn the_protobuf_trace_of_resnet18_is_a_fifth_of_the_json_and_filters_apply() {
    let onnx = scratch("r18.onnx");
    std::fs::write(&onnx, Net::ResNet18.onnx(1, DType::F16, 3)).unwrap();
    let om = scratch("r18");
    let o = gearsim(&[
        "compile",
        "--model",
        &onnx.display().to_string(),
        "--output",
        &om.display().to_string(),
        "--soc_version",
        "ascend310p",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model = format!("{}.om", om.display());
    // A timing-only run traced into `name` at `level`: the trace's path.
    let traced = |name: &str, level: &str| -> String {
        let trace = scratch(name).display().to_string();
        let o = gearsim(&[
            "run",
            "--model",
            &model,
            "--timing_only",
            "--trace",
            &trace,
            "--trace_level",
            level,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        trace
    };
    let trace = traced("r18.gtrace", "instruction");
    let export_of = |trace: &str, format: &str, out: &str, extra: &[&str]| -> u64 {
        let path = scratch(out);
        let mut args = vec!["trace", "export", trace, "--format", format];
        let p = path.display().to_string();
        args.extend_from_slice(&["-o", &p]);
        args.extend_from_slice(extra);
        let o = gearsim(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::metadata(&path).unwrap().len()
    };
    let export = |format: &str, out: &str, extra: &[&str]| export_of(&trace, format, out, extra);
    for level in ["instruction", "kernel"] {
        let json = export(
            "perfetto",
            &format!("r18_{level}.json"),
            &["--level", level],
        );
        let proto = export(
            "perfetto_proto",
            &format!("r18_{level}.pftrace"),
            &["--level", level],
        );
        assert!(
            proto * 5 <= json,
            "{level}: protobuf {proto} bytes, JSON {json} bytes"
        );
    }
    // Recorded at kernel level (the default) too: there the busy counters ride on their
    // kernel's packets.
    let kernel_trace = traced("r18_default.gtrace", "kernel");
    let (json, proto) = (
        export_of(&kernel_trace, "perfetto", "r18_default.json", &[]),
        export_of(&kernel_trace, "perfetto_proto", "r18_default.pftrace", &[]),
    );
    assert!(
        proto * 5 <= json,
        "kernel-level recording: protobuf {proto} bytes, JSON {json} bytes"
    );
    // Each filter shows less than the whole.
    let all = export("perfetto", "r18_all.json", &[]);
    for extra in [
        &["--level", "task"][..],
        &["--cores", "0-1"][..],
        &["--window", "0:50"][..],
    ] {
        let part = export("perfetto", "r18_part.json", extra);
        assert!(part < all, "{extra:?}: {part} of {all} bytes");
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(scratch("r18_kernel.json")).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["cat"] == "AiCoreKernel" && e["name"] == "/conv1/Conv"),
        "task spans are named by their op"
    );
    assert!(events.iter().any(|e| e["cat"] == "kernel"));
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "C" && e["name"] == "CUBE busy %")
    );
    for (flag, value, says) in [
        ("--level", "pipe", "expected task, kernel or instruction"),
        ("--window", "5", "expected START_US:END_US"),
        ("--window", "9:2", "before the start"),
        ("--cores", "3-1", "--cores: expected numbers and ranges"),
    ] {
        let o = gearsim(&[
            "trace",
            "export",
            &trace,
            "-o",
            &scratch("bad.json").display().to_string(),
            flag,
            value,
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{err}");
    }
}
