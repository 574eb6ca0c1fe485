//! The command line as a user meets it: successful runs print what they promise, bad input
//! exits 1 with a message naming the problem, and errors never clobber existing files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub(crate) fn gearsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gearsim"))
        .args(args)
        .output()
        .expect("run gearsim")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/kernels")
        .join(name)
        .display()
        .to_string()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn kernel_run_reports_cycles_time_and_busy_percent_per_pipe() {
    let trace = scratch("vadd.gtrace");
    let out_dir = scratch("vadd_out");
    let o = gearsim(&[
        "kernel",
        "run",
        &example("vadd_f16_db.s"),
        "--soc_version",
        "Ascend910",
        "--block_dim",
        "8",
        "--args",
        "x=seq:f16:256k,y=fill:f16:256k:1,z=zeros:512k,256k",
        "--trace",
        trace.to_str().unwrap(),
        "--output_dir",
        out_dir.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stdout.contains(
            "kernel vadd_f16_db on ascend910 (32 cores @ 1000 MHz), block_dim 8, full mode"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("total cycles: "), "{stdout}");
    for lane in ["SCALAR", "VECTOR", "CUBE", "MTE1", "MTE2", "MTE3", "FIXP"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(lane) && l.ends_with('%')),
            "{lane} missing:\n{stdout}"
        );
    }
    // z = x + 1 for x = 0, 1, 2, ... (exact in fp16 up to 2048).
    let z = std::fs::read(out_dir.join("z.bin")).unwrap();
    let first: Vec<f32> = z
        .chunks_exact(2)
        .take(100)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    assert_eq!(first, (0..100).map(|i| i as f32 + 1.0).collect::<Vec<_>>());
    // The trace exports to JSON that parses.
    let json = scratch("vadd.json");
    let o = gearsim(&[
        "trace",
        "export",
        trace.to_str().unwrap(),
        "--format",
        "perfetto",
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "vadd.f16" && e["ph"] == "X")
    );
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "thread_name" && e["args"]["name"] == "MTE2")
    );
    let o = gearsim(&["trace", "summary", trace.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(text(&o).0.contains("core0"));
}

#[test]
fn timing_only_run_has_the_same_cycles() {
    let args = [
        "kernel",
        "run",
        &example("mmad_loop.s"),
        "--args",
        "zeros:64k,zeros:64k,zeros:32k,4",
    ];
    let full = text(&gearsim(&args)).0;
    let mut t = args.to_vec();
    t.push("--timing_only");
    let timing = text(&gearsim(&t)).0;
    let cycles = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("total cycles"))
            .map(str::to_string)
    };
    assert!(cycles(&full).is_some());
    assert_eq!(cycles(&full), cycles(&timing));
}

#[test]
fn malformed_assembly_names_file_line_and_column() {
    let src = scratch("bad.s");
    std::fs::write(&src, "movi x1, 1\n  vadd.f16 x1, x2\nend\n").unwrap();
    let o = gearsim(&["kernel", "run", src.to_str().unwrap()]);
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:2:18: `vadd` expects 3 operand(s) (dst, src0, src1), found 2",
            src.display()
        )),
        "{stderr}"
    );
}

#[test]
fn bad_inputs_exit_1_with_the_problem_named() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["kernel", "run", "/nonexistent/k.s"],
            "cannot read /nonexistent/k.s",
        ),
        (
            &[
                "kernel",
                "run",
                &example("dma_stream.s"),
                "--soc_version",
                "ascend999",
            ],
            "unknown soc_version `ascend999` (expected one of: ascend910, ascend310p, ascend910b1, ascend910b2, ascend910b3, ascend910b4, or atc's Ascend310P3, Ascend910A; case-insensitive)",
        ),
        (
            &[
                "kernel",
                "run",
                &example("dma_stream.s"),
                "--args",
                "x=rand:f64:4",
            ],
            "--args item 1 `x=rand:f64:4`: unknown element type `f64`",
        ),
        (
            &[
                "kernel",
                "run",
                &example("dma_stream.s"),
                "--block_dim",
                "0",
            ],
            "block_dim 0 is outside [1, 65535]",
        ),
        (
            &[
                "kernel",
                "run",
                &example("dma_stream.s"),
                "--args",
                "0x7ffffff000,1m",
            ],
            "memory fault: core 0 MTE2 pc",
        ),
        (
            &[
                "kernel",
                "run",
                &example("dma_stream.s"),
                "--clock_mhz",
                "0",
            ],
            "`core.clock_mhz` = 0",
        ),
        (
            &["trace", "summary", "/nonexistent/t.gtrace"],
            "/nonexistent/t.gtrace",
        ),
    ];
    for (args, want) in cases {
        let o = gearsim(args);
        let (_, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{args:?}: expected `{want}` in:\n{stderr}"
        );
    }
}

#[test]
fn a_corrupt_trace_is_refused_and_leaves_the_output_file_alone() {
    let bad = scratch("corrupt.gtrace");
    std::fs::write(&bad, b"GEARTRC\0 this is not a trace").unwrap();
    let out = scratch("keep.json");
    std::fs::write(&out, "precious").unwrap();
    let o = gearsim(&[
        "trace",
        "export",
        bad.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains(bad.to_str().unwrap()));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious");
}

#[test]
fn asm_and_disasm_round_trip() {
    let bin = scratch("mmad.bin");
    let o = gearsim(&[
        "kernel",
        "asm",
        &example("mmad_loop.s"),
        "-o",
        bin.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let dis = text(&gearsim(&["kernel", "disasm", bin.to_str().unwrap()])).0;
    let again = scratch("mmad_again.s");
    std::fs::write(&again, &dis).unwrap();
    let bin2 = scratch("mmad2.bin");
    assert!(
        gearsim(&[
            "kernel",
            "asm",
            again.to_str().unwrap(),
            "-o",
            bin2.to_str().unwrap()
        ])
        .status
        .success()
    );
    assert_eq!(std::fs::read(&bin).unwrap(), std::fs::read(&bin2).unwrap());
    // A truncated binary is a decode error naming the length.
    std::fs::write(&bin2, &std::fs::read(&bin).unwrap()[..40]).unwrap();
    let o = gearsim(&["kernel", "disasm", bin2.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o)
            .1
            .contains("program is 40 bytes, not a multiple of the 16-byte instruction word")
    );
}

#[test]
fn demo_runs_and_checks_its_results() {
    let trace = scratch("demo.gtrace");
    let o = gearsim(&["demo", "--trace", trace.to_str().unwrap()]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    // Every gear of both models in both modes, plus one hybrid run each.
    for row in [
        "cnn        nonsink  1 ",
        "cnn        sink     8 ",
        "cnn        hybrid   3 ",
        "seed_dims  sink     80,60,4,4",
        "seed_dims  hybrid   33,7,3,5",
    ] {
        assert!(stdout.contains(row), "no row `{row}` in\n{stdout}");
    }
    assert!(stdout.contains("all 14 runs checked"), "{stdout}");
    let t = gearsim_traces::TraceFile::open(&trace).unwrap();
    assert!(t.record_count() > 1000);
    // The L2 control of every launch shows on its own lane: a drop for each feature map.
    let l2 = t
        .lanes()
        .iter()
        .position(|l| l.thread == "L2 control")
        .expect("an L2 control lane");
    let (mut keeps, mut drops) = (0, 0);
    for r in t.records() {
        if let gearsim_traces::Record::Instant { lane, name, .. } = r
            && lane.0 as usize == l2
        {
            match t.string(name) {
                "l2_keep" => keeps += 1,
                "l2_drop" => drops += 1,
                other => panic!("unexpected {other} on the L2 control lane"),
            }
        }
    }
    assert!(keeps > 0 && drops >= keeps, "{keeps} keeps, {drops} drops");
}

#[test]
fn kernel_demo_runs_and_checks_its_results() {
    let o = gearsim(&["kernel", "demo"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("sums equal the fp16 reference"), "{stdout}");
}

#[test]
fn isa_reference_matches_the_committed_file() {
    let o = gearsim(&["isa", "reference"]);
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../isa/ISA.md"))
            .unwrap();
    assert_eq!(text(&o).0, committed);
}

#[test]
fn study_advise_rejects_bad_input_naming_it_and_keeps_old_results() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/models/cnn.onnx");
    let shapes = scratch("advise_shapes.txt");
    std::fs::write(&shapes, "input:1,3,32,32 5\ninput:2,3,31,32 1\n").unwrap();
    let out = scratch("advise_out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("advise.csv"), "old").unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "study",
            "advise",
            "--model",
            model,
            "--input_shape",
            "input:-1,3,32,32",
            "--output_dir",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        gearsim(&args)
    };
    let s = shapes.to_str().unwrap();
    let o = run(&["--shapes", s]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{s}:2: input `input` axis 2 is 31, --input_shape fixes it at 32"
        )),
        "{err}"
    );
    std::fs::write(&shapes, "input:1,3,32,32 5\ninput:2,3,32,32 1\n").unwrap();
    for (flag, value, want) in [
        ("--memory_budget", "lots", "--memory_budget: expected bytes"),
        (
            "--pad",
            "maybe",
            "--pad: expected auto or never, got `maybe`",
        ),
        (
            "--gear_option",
            "batch",
            "--gear_option: expected dynamic_batch_size",
        ),
        ("--gear_budget", "1", "--gear_budget 1: expected at least 2"),
    ] {
        let o = run(&["--shapes", s, flag, value]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{flag}: {err}");
        assert!(err.contains(want), "{flag}: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(out.join("advise.csv")).unwrap(),
        "old"
    );
    // A good run replaces the old file.
    let o = run(&["--shapes", s]);
    let (stdout, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        stdout
            .contains("proposal: --input_shape \"input:-1,3,32,32\" --dynamic_batch_size \"1,2\""),
        "{stdout}"
    );
    assert!(
        std::fs::read_to_string(out.join("advise.csv"))
            .unwrap()
            .starts_with("gears,")
    );
}

#[test]
fn bench_speed_prints_one_line_per_figure_with_counts_identical_on_every_run() {
    let args = [
        "bench",
        "speed",
        "--only",
        "cnn",
        "--modes",
        "timing-only",
        "--min_seconds",
        "0",
    ];
    let o = gearsim(&args);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (line, b) in lines.iter().zip([1, 4, 8]) {
        let rest = line
            .strip_prefix(&format!("cnn b{b} timing-only: "))
            .unwrap_or_else(|| panic!("{line}"));
        let (cycles, instr) = rest.split_once(" M cycles/s, ").expect(line);
        assert!(cycles.parse::<f64>().unwrap() > 0.0, "{line}");
        let instr = instr.strip_suffix(" M instr/s").expect(line);
        assert!(instr.parse::<f64>().unwrap() > 0.0, "{line}");
    }
    // The simulated counts are the same in every invocation (and every run within one).
    let json = |extra: &str| {
        let mut a = args.to_vec();
        a.push(extra);
        let o = gearsim(&a);
        assert!(o.status.success(), "{}", text(&o).1);
        text(&o)
            .0
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["gear"].as_str().unwrap().to_string(),
                    v["cycles_per_run"].as_u64().unwrap(),
                    v["instructions_per_run"].as_u64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let first = json("--json");
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|(_, c, i)| *c > 0 && *i > 0), "{first:?}");
    assert_eq!(first, json("--json"));
    let o = gearsim(&["bench", "speed", "--only", "resnet"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("unknown model `resnet`"),
        "{}",
        text(&o).1
    );
}

#[test]
fn bench_speed_on_whole_networks_times_a_users_run_and_the_execution() {
    let o = gearsim(&[
        "bench",
        "speed",
        "--nets",
        "resnet18",
        "--batches",
        "1",
        "--modes",
        "timing-only",
        "--json",
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["model"], "resnet18");
    assert_eq!(v["gear"], "b1");
    // torchvision's ResNet-18: 1.814 G MACs an image.
    assert_eq!(v["macs_per_run"].as_u64().unwrap() / 1_000_000, 1814);
    for field in [
        "run_wall_seconds",
        "execute_seconds",
        "cycles_per_second",
        "instructions_per_second",
        "macs_per_second",
    ] {
        assert!(v[field].as_f64().unwrap() > 0.0, "{field}: {v}");
    }
    // A user's run includes the execution and the load around it.
    assert!(
        v["run_wall_seconds"].as_f64() > v["execute_seconds"].as_f64(),
        "{v}"
    );
    let o = gearsim(&["bench", "speed", "--nets", "alexnet"]);
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("--nets: expected some of resnet18"),
        "{}",
        text(&o).1
    );
    let o = gearsim(&["bench", "speed", "--nets", "resnet18", "--batches", "0"]);
    assert!(
        text(&o)
            .1
            .contains("--batches: expected positive batches, got 0")
    );
}

#[test]
fn bench_speed_pairs_full_mode_with_timing_only() {
    let o = gearsim(&[
        "bench",
        "speed",
        "--nets",
        "resnet18",
        "--batches",
        "1",
        "--pairs",
        "3",
        "--json",
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    // One figure per mode, then the pairs.
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let p = &lines[2];
    assert_eq!(p["model"], "resnet18");
    assert_eq!(p["pairs"], 3);
    let ratio = |f: &str| p[f].as_f64().unwrap();
    // Full mode computes every value on top of the same timeline.
    assert!(ratio("min_ratio") > 1.0, "{p}");
    assert!(
        ratio("min_ratio") <= ratio("median_ratio_full_to_timing_only"),
        "{p}"
    );
    assert!(
        ratio("median_ratio_full_to_timing_only") <= ratio("max_ratio"),
        "{p}"
    );
    assert!(
        ratio("median_full_run_seconds") > ratio("median_timing_only_run_seconds"),
        "{p}"
    );
    // Three pairs are too few for a 95% interval of the median (six are the least).
    assert!(p["median_ratio_interval_95"].is_null(), "{p}");
    let o = gearsim(&[
        "bench",
        "speed",
        "--nets",
        "resnet18",
        "--batches",
        "1",
        "--pairs",
        "2",
        "--modes",
        "full",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains(
            "--pairs: compares full mode with timing-only, so --modes must keep both, got full"
        ),
        "{}",
        text(&o).1
    );
}

#[test]
fn compile_rejects_a_bad_precision_mode_or_fusion_switch_file_and_writes_nothing() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/models/cnn.onnx")
        .display()
        .to_string();
    let out = scratch("bad_options_model");
    let om = scratch("bad_options_model.om");
    std::fs::write(&om, b"previous").unwrap();
    let out_s = out.display().to_string();
    // `gearsim compile` of the CNN with `extra` flags: it must fail; its stderr.
    let fails = |extra: &[&str]| {
        let mut args = vec!["compile", "--model", &model, "--output", &out_s];
        args.extend_from_slice(extra);
        let o = gearsim(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        err
    };
    let err = fails(&["--precision_mode", "fp8"]);
    assert!(
        err.contains("E10001") && err.contains("--precision_mode"),
        "{err}"
    );
    for bad in ["l3_optimize", "l1_optimize"] {
        let err = fails(&["--buffer_optimize", bad]);
        assert!(
            err.contains("E10001") && err.contains("--buffer_optimize") && err.contains(bad),
            "{err}"
        );
    }
    let switch = scratch("switch.json");
    std::fs::write(
        &switch,
        r#"{"Switch": {"UBFusion": {"NoSuchPass": "off"}}}"#,
    )
    .unwrap();
    let err = fails(&["--fusion_switch_file", &switch.display().to_string()]);
    assert!(err.contains("unknown fusion pass `NoSuchPass`"), "{err}");
    // A malformed AIPP configuration, a missing one, and AIPP with dynamic dims (GE's E10001).
    let conf = scratch("bad_aipp.cfg");
    std::fs::write(
        &conf,
        "aipp_op {\n  input_format: RGB888_U8\n  crop: sometimes\n}\n",
    )
    .unwrap();
    let conf_s = conf.display().to_string();
    let err = fails(&["--insert_op_conf", &conf_s]);
    assert!(
        err.contains("E10001") && err.contains("bad_aipp.cfg") && err.contains("line 3"),
        "{err}"
    );
    let err = fails(&["--insert_op_conf", "/no/such.cfg"]);
    assert!(err.contains("/no/such.cfg: cannot read"), "{err}");
    std::fs::write(&conf, "aipp_op { input_format: RGB888_U8 }").unwrap();
    let err = fails(&[
        "--insert_op_conf",
        &conf_s,
        "--input_shape",
        "input:-1,3,32,32",
        "--dynamic_dims",
        "1;2",
    ]);
    assert!(
        err.contains("E10001") && err.contains("The dynamic dims function does not support AIPP."),
        "{err}"
    );
    assert_eq!(std::fs::read(&om).unwrap(), b"previous");
}

#[test]
fn a_bad_flag_is_bad_input_and_help_is_not_an_error() {
    let o = gearsim(&["run", "--no_such_flag"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--no_such_flag"), "{err}");
    assert_eq!(gearsim(&["--help"]).status.code(), Some(0));
    assert_eq!(gearsim(&["run", "--help"]).status.code(), Some(0));
}

/// Issue 16: every E-code error printed its message twice (the error and, after it, the same
/// error again as its own source); a missing file printed the operating system's reason twice.
#[test]
fn an_error_message_is_printed_once() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = root.join("tests/models/gear_image.onnx");
    let om = scratch("printed_once.om");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            [
                "compile",
                "--model",
                model.to_str().unwrap(),
                "--output",
                om.to_str().unwrap(),
                "--input_shape=data:-1,3,x,8",
                "--dynamic_batch_size=1,2",
            ]
            .map(String::from)
            .to_vec(),
            "E10002",
        ),
        (
            [
                "compile",
                "--model",
                "/nonexistent/m.onnx",
                "--output",
                om.to_str().unwrap(),
            ]
            .map(String::from)
            .to_vec(),
            "No such file",
        ),
        (
            ["run", "--model", "/nonexistent/m.om"]
                .map(String::from)
                .to_vec(),
            "No such file",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = gearsim(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(
            err.matches(want).count(),
            1,
            "{args:?}: `{want}` once in:\n{err}"
        );
    }
    assert!(!om.exists());
}

/// Issue 16: `kernel run vadd_f16_db.s --block_dim 32` without `--args` ran for many minutes
/// (the kernel read its count from beyond an empty argument block and looped on zero).
#[test]
fn a_kernel_reading_past_its_arguments_is_named_and_a_runaway_kernel_stops() {
    let vadd = example("vadd_f16_db.s");
    let o = gearsim(&["kernel", "run", &vadd, "--block_dim", "32"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("core 0 S pc 1 reads GM")
            && err.contains("argument block")
            && err.contains("holds 0 arguments")
            && err.contains("reads more arguments than it was given"),
        "{err}"
    );
    // A zero count loops (the loop counter wraps); the limit stops it and says how to raise it.
    let o = gearsim(&[
        "kernel",
        "run",
        &vadd,
        "--args",
        "x=zeros:1g,y=zeros:1g,z=zeros:1g,0",
        "--max_cycles",
        "200000",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("still running after 200000 cycles") && err.contains("--max_cycles"),
        "{err}"
    );
    let o = gearsim(&["kernel", "run", &vadd, "--max_cycles", "0"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn model_writes_a_built_in_network_and_names_bad_choices() {
    let out = scratch("mnv2_b2.onnx");
    let o = gearsim(&[
        "model",
        "--net",
        "mobilenetv2",
        "--batch",
        "2",
        "--output",
        out.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stdout.contains("mobilenetv2, batch 2, f32, 300.8 M MACs per item"),
        "{stdout}"
    );
    let m = <gearsim_compiler::onnx::proto::ModelProto as prost::Message>::decode(
        std::fs::read(&out).unwrap().as_slice(),
    )
    .unwrap();
    assert_eq!(m.graph.unwrap().node.len(), 52 + 35 + 10 + 3);
    for (args, expected) in [
        (
            vec!["--net", "vgg16"],
            "--net: expected one of resnet18, resnet50, mobilenetv2, bertbase, got `vgg16`",
        ),
        (
            vec!["--net", "resnet18", "--batch", "0"],
            "--batch: expected a positive batch or -1, got 0",
        ),
        (
            vec!["--net", "resnet18", "--dtype", "bf16"],
            "--dtype: expected f16 or f32, got `bf16`",
        ),
    ] {
        let mut all = vec!["model", "--output", "/tmp/never-written.onnx"];
        all.extend(args);
        let o = gearsim(&all);
        assert!(!o.status.success());
        assert!(text(&o).1.contains(expected), "{}", text(&o).1);
    }
}
