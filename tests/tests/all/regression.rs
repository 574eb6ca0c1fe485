//! The sink vs non-sink regression suite: for dynamic batch, image size and dims (the seed's
//! three-input example included), every gear runs in both modes; outputs must be bit-identical,
//! `cur_dynamic_dims` must be the gear and the output shapes those of the gear's table. Golden
//! task sequences (`tests/golden/regression/*.txt`, `GEARSIM_BLESS=1` rewrites them) pin what
//! each mode does: non-sink writes the dims from the host and merges the small inputs into one
//! H2D copy; sink runs GetNext and GetDynamicDims on the device and reads the dims back.

use std::io::Cursor;

use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_host::atc;
use gearsim_host::runtime::{RunReport, Runtime, RuntimeOptions};
use gearsim_sim::ChipConfig;
use gearsim_tests::workspace_root;
use gearsim_traces::{LaneKind, Record, TraceFile, TraceWriter};

struct Suite {
    name: &'static str,
    model: &'static str,
    gear: GearOptions,
    /// Input shapes for a gear vector.
    shapes: fn(&[i64]) -> Vec<Vec<i64>>,
}

fn suites() -> Vec<Suite> {
    vec![
        Suite {
            name: "dynamic_batch",
            model: "gear_batch.onnx",
            gear: GearOptions {
                input_shape: Some("x:-1,4,8,8".into()),
                dynamic_batch_size: Some("1,2,4".into()),
                ..GearOptions::default()
            },
            shapes: |g| vec![vec![g[0], 4, 8, 8]],
        },
        Suite {
            name: "dynamic_image_size",
            model: "gear_image.onnx",
            gear: GearOptions {
                input_shape: Some("img:1,3,-1,-1".into()),
                dynamic_image_size: Some("16,16;32,24".into()),
                ..GearOptions::default()
            },
            shapes: |g| vec![vec![1, 3, g[0], g[1]]],
        },
        Suite {
            name: "dynamic_dims",
            model: "gear_dims.onnx",
            gear: GearOptions {
                input_shape: Some("data:1,1,40,-1;label:1,-1;mask:-1,-1".into()),
                dynamic_dims: Some("20,20,1,1;40,40,2,2;80,60,4,4".into()),
                ..GearOptions::default()
            },
            shapes: |g| vec![vec![1, 1, 40, g[0]], vec![1, g[1]], vec![g[2], g[3]]],
        },
    ]
}

/// The chips the suite runs on: the coupled default and a separated Atlas A2 part, where the
/// cube kernels become MIX kernels.
const CHIPS: [&str; 2] = ["ascend910", "ascend910b2"];

fn cfg() -> ChipConfig {
    chip(CHIPS[0])
}

fn chip(name: &str) -> ChipConfig {
    ChipConfig::preset(name).unwrap()
}

fn om_for(s: &Suite, sink: bool, cfg: &ChipConfig) -> Vec<u8> {
    let bytes = std::fs::read(workspace_root().join("tests/models").join(s.model)).unwrap();
    let opts = CompileOptions {
        gear: s.gear.clone(),
        getnext_sink: sink,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: Default::default(),
        target: atc::target(cfg),
    };
    compile(&bytes, s.model, &opts)
        .unwrap_or_else(|e| panic!("{}: {e}", s.model))
        .om_bytes()
        .unwrap()
}

/// Deterministic inputs of the model's types (a simple LCG: the suite pins bits, not values).
fn inputs(types: &[DataType], shapes: &[Vec<i64>], seed: u64) -> Vec<Tensor> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut next = move || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((x >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    };
    types
        .iter()
        .zip(shapes)
        .map(|(t, dims)| {
            let n: i64 = dims.iter().product();
            let data: Vec<u8> = (0..n)
                .flat_map(|_| match t {
                    DataType::I32 => ((next() * 100.0) as i32).to_le_bytes(),
                    _ => (next() as f32).to_le_bytes(),
                })
                .collect();
            Tensor::new(*t, dims.clone(), data).unwrap()
        })
        .collect()
}

/// Runs every gear of a suite in one mode on a fresh traced device: the reports and the
/// task sequence of the trace.
fn run_mode(s: &Suite, sink: bool) -> (Vec<RunReport>, String) {
    run_mode_on(s, sink, &cfg())
}

fn run_mode_on(s: &Suite, sink: bool, cfg: &ChipConfig) -> (Vec<RunReport>, String) {
    let writer = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let mut rt = Runtime::new(cfg.clone(), writer, RuntimeOptions::default()).unwrap();
    let m = rt.load(&om_for(s, sink, cfg)).unwrap();
    let desc = rt.desc(m).unwrap().clone();
    let d = desc.dynamic.clone().unwrap();
    let types: Vec<DataType> = desc
        .inputs
        .iter()
        .map(|i| DataType::from_onnx(i.dtype as i32).unwrap())
        .collect();
    let mut reports = Vec::new();
    for (g, dims) in d.gears.iter().enumerate() {
        let x = inputs(&types, &(s.shapes)(dims), g as u64);
        let r = if sink {
            rt.run_sink(m, &x).unwrap()
        } else {
            rt.run(m, &x).unwrap()
        };
        reports.push(r);
    }
    let bytes = rt.into_sink().finish().unwrap().into_inner();
    let trace = TraceFile::from_bytes(bytes).unwrap();
    (reports, task_sequence(&trace))
}

/// The spans of the host, PCIe, stream and AI CPU lanes in time order, one `lane: name` line
/// each — what ran where, without the times (kernel tuning must not churn the goldens).
fn task_sequence(t: &TraceFile) -> String {
    let lanes = t.lanes();
    let mut spans: Vec<(u64, usize, String)> = Vec::new();
    for r in t.records() {
        if let Record::Span {
            lane,
            name,
            start,
            detail,
            ..
        } = r
        {
            let l = &lanes[lane.0 as usize];
            // A stream span is named by its task kind; its detail, `stream S task I: KIND
            // NAME`, also carries the task's own name.
            let what = match l.kind {
                LaneKind::Stream => {
                    let d = t.string(detail);
                    d.split_once(": ").map_or(d, |(_, rest)| rest).to_string()
                }
                LaneKind::Host | LaneKind::Pcie | LaneKind::AiCpu => t.string(name).to_string(),
                _ => continue,
            };
            spans.push((
                start,
                lane.0 as usize,
                format!("{}/{}: {what}", l.process, l.thread),
            ));
        }
    }
    spans.sort();
    let mut out = String::new();
    for (_, _, line) in spans {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn check_golden(name: &str, text: &str) {
    let path = workspace_root()
        .join("tests/golden/regression")
        .join(format!("{name}.txt"));
    if std::env::var_os("GEARSIM_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `GEARSIM_BLESS=1 cargo test -p gearsim-tests`",
            path.display()
        )
    });
    if want != text {
        let (n, (w, g)) = want
            .lines()
            .zip(text.lines())
            .enumerate()
            .find(|(_, (w, g))| w != g)
            .unwrap_or((
                want.lines().count().min(text.lines().count()),
                ("<end>", "<end>"),
            ));
        panic!(
            "{} differs at line {}: expected `{w}`, got `{g}`; if the change is intended, run \
             `GEARSIM_BLESS=1 cargo test -p gearsim-tests` and review the diff",
            path.display(),
            n + 1
        );
    }
}

fn check_suite(s: &Suite) {
    check_suite_on(s, &cfg());
}

/// The suite on one chip: every chip runs the same task sequences, so one golden serves all.
fn check_suite_on(s: &Suite, cfg: &ChipConfig) -> Vec<RunReport> {
    let (plain, plain_seq) = run_mode_on(s, false, cfg);
    let (sink, sink_seq) = run_mode_on(s, true, cfg);
    let c = om_for(s, false, cfg);
    let desc = gearsim_isa::om::OmFile::parse(&c).unwrap().desc().unwrap();
    let d = desc.dynamic.unwrap();
    for (g, (a, b)) in plain.iter().zip(&sink).enumerate() {
        for (mode, r) in [("non-sink", a), ("sink", b)] {
            assert_eq!(r.gear, Some(g), "{} {mode}", s.name);
            assert_eq!(
                r.cur_dynamic_dims, d.gears[g],
                "{} {mode} cur_dynamic_dims",
                s.name
            );
        }
        for (o, (p, q)) in a.outputs.iter().zip(&b.outputs).enumerate() {
            assert_eq!(p.dims, q.dims, "{} gear {g} output {o} shape", s.name);
            assert!(
                p.data == q.data,
                "{} gear {g} output {o}: sink and non-sink differ",
                s.name
            );
            // The table's shape, except a direct output (an input returned as is), which
            // comes back at its input's shape.
            let direct = desc.inputs.iter().any(|i| i.name == desc.outputs[o].name);
            if !direct {
                assert_eq!(
                    p.dims, d.output_dims[g][o],
                    "{} gear {g} output {o}",
                    s.name
                );
            }
        }
    }
    // What the sequences must show.
    assert!(plain_seq.contains("memcpy_h2d gear dims"), "{plain_seq}");
    assert!(!plain_seq.contains("GetNext"), "{plain_seq}");
    assert!(
        sink_seq.contains("memcpy_d2h cur_dynamic_dims"),
        "{sink_seq}"
    );
    for task in ["getnext", "get_dynamic_dims", "mapindex"] {
        assert!(
            sink_seq.to_ascii_lowercase().contains(task),
            "{}: no {task} in the sink sequence:\n{sink_seq}",
            s.name
        );
    }
    check_golden(&format!("{}_nonsink", s.name), &plain_seq);
    check_golden(&format!("{}_sink", s.name), &sink_seq);
    plain
}

/// On a separated chip (cube and vector cores, the cube kernels split into MIX kernels) every
/// suite agrees between modes as on the coupled one, and its outputs are bit-identical to the
/// coupled chip's.
#[test]
fn every_suite_agrees_on_a_separated_chip_and_matches_the_coupled_one() {
    for s in suites() {
        let separated = check_suite_on(&s, &chip(CHIPS[1]));
        let (coupled, _) = run_mode(&s, false);
        for (g, (a, b)) in coupled.iter().zip(&separated).enumerate() {
            for (o, (p, q)) in a.outputs.iter().zip(&b.outputs).enumerate() {
                assert_eq!(p.dims, q.dims, "{} gear {g} output {o}", s.name);
                assert!(
                    p.data == q.data,
                    "{} gear {g} output {o}: {} and {} differ",
                    s.name,
                    CHIPS[0],
                    CHIPS[1]
                );
            }
        }
    }
}

#[test]
fn dynamic_dims_seed_example_agrees_between_modes() {
    check_suite(&suites()[2]);
}

#[test]
fn dynamic_batch_agrees_between_modes() {
    check_suite(&suites()[0]);
}

#[test]
fn dynamic_image_size_agrees_between_modes() {
    check_suite(&suites()[1]);
}

#[test]
fn non_sink_merges_the_small_inputs() {
    // The seed model's three inputs are all under 128 KiB: one merged copy plus the dims.
    let (reports, seq) = run_mode(&suites()[2], false);
    assert!(reports.iter().all(|r| r.h2d_transfers == 2), "{seq}");
    assert!(seq.contains("memcpy_h2d merged inputs [0, 1, 2]"), "{seq}");
}
