//! Timing-only runs of every test model: each model is compiled with its gears and run at every
//! gear in full and in timing-only mode, and the two traces must hold the same records (the
//! same timeline, event for event). Kernels whose addresses depend on data (a Gather's indices,
//! a runtime bias broadcast, an AI CPU gather's indices) and everything upstream of those
//! values run in full mode inside a timing-only run; before that, the fused-QKV encoder's
//! embedding Gather stopped with "timing-only run needs a value" (issue 16).

use std::io::Cursor;

use gearsim_compiler::ir::Tensor;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_host::atc;
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_tests::{Rng, workspace_root};
use gearsim_traces::{TraceFile, TraceWriter};

/// One input of a gear: name-less, in model-input order.
enum Input {
    F32(Vec<i64>),
    I32(Vec<i64>),
    /// Token ids below the bound.
    Ids(Vec<i64>, i64),
}

struct Case {
    file: &'static str,
    gear: GearOptions,
    /// Per gear, its inputs.
    gears: Vec<Vec<Input>>,
}

fn options(
    shape: &str,
    batch: Option<&str>,
    image: Option<&str>,
    dims: Option<&str>,
) -> GearOptions {
    GearOptions {
        input_shape: Some(shape.into()),
        dynamic_batch_size: batch.map(Into::into),
        dynamic_image_size: image.map(Into::into),
        dynamic_dims: dims.map(Into::into),
        ..GearOptions::default()
    }
}

/// Every model under `tests/models` that the compiler tests run, with gears of each mode.
fn cases() -> Vec<Case> {
    use Input::*;
    vec![
        Case {
            file: "cnn.onnx",
            gear: options("input:-1,3,32,32", Some("1,4"), None, None),
            gears: vec![vec![F32(vec![1, 3, 32, 32])], vec![F32(vec![4, 3, 32, 32])]],
        },
        Case {
            file: "gear_batch.onnx",
            gear: options("x:-1,4,8,8", Some("1,2"), None, None),
            gears: vec![vec![F32(vec![1, 4, 8, 8])], vec![F32(vec![2, 4, 8, 8])]],
        },
        Case {
            file: "gear_image.onnx",
            gear: options("img:1,3,-1,-1", None, Some("16,16;24,40"), None),
            gears: vec![vec![F32(vec![1, 3, 16, 16])], vec![F32(vec![1, 3, 24, 40])]],
        },
        Case {
            // AI CPU operators: a GatherElements reading indices computed on the AI core.
            file: "aicpu_ops.onnx",
            gear: options("x:-1,6;k:-1,4", Some("1,3"), None, None),
            gears: vec![
                vec![F32(vec![1, 6]), Ids(vec![1, 4], 6)],
                vec![F32(vec![3, 6]), Ids(vec![3, 4], 6)],
            ],
        },
        Case {
            file: "gear_dims.onnx",
            gear: options(
                "data:1,1,40,-1;label:1,-1;mask:-1,-1",
                None,
                None,
                Some("20,20,1,1;40,40,2,2"),
            ),
            gears: [(20, 20, 1, 1), (40, 40, 2, 2)]
                .into_iter()
                .map(|(t, l, m, k)| vec![F32(vec![1, 1, 40, t]), I32(vec![1, l]), F32(vec![m, k])])
                .collect(),
        },
        Case {
            file: "transformer.onnx",
            gear: options("x:1,-1,64", None, None, Some("5;16")),
            gears: vec![vec![F32(vec![1, 5, 64])], vec![F32(vec![1, 16, 64])]],
        },
        Case {
            file: "torch/cnn_torch.onnx",
            gear: options("input:-1,3,32,32", Some("1,2"), None, None),
            gears: vec![vec![F32(vec![1, 3, 32, 32])], vec![F32(vec![2, 3, 32, 32])]],
        },
        Case {
            file: "torch/transformer_torch.onnx",
            gear: options("x:1,-1,64", None, None, Some("16;32")),
            gears: vec![vec![F32(vec![1, 16, 64])], vec![F32(vec![1, 32, 64])]],
        },
        Case {
            file: "torch/gpt_torch.onnx",
            gear: options("ids:-1,-1", None, None, Some("1,8;2,16")),
            gears: vec![vec![Ids(vec![1, 8], 100)], vec![Ids(vec![2, 16], 100)]],
        },
        Case {
            file: "torch/qkv_encoder_torch.onnx",
            gear: options("ids:-1,-1", None, None, Some("1,8;2,16")),
            gears: vec![vec![Ids(vec![1, 8], 100)], vec![Ids(vec![2, 16], 100)]],
        },
        // Its Resize gathers rows by constant index tables: those kernels run with values.
        Case {
            file: "torch/yolo_torch.onnx",
            gear: options("images:1,3,-1,-1", None, Some("64,64;96,128"), None),
            gears: vec![
                vec![F32(vec![1, 3, 64, 64])],
                vec![F32(vec![1, 3, 96, 128])],
            ],
        },
        Case {
            file: "torch/unet_torch.onnx",
            gear: options("image:1,3,-1,-1", None, Some("32,32;48,64"), None),
            gears: vec![vec![F32(vec![1, 3, 32, 32])], vec![F32(vec![1, 3, 48, 64])]],
        },
        Case {
            file: "torch/bert_torch.onnx",
            gear: options(
                "input_ids:-1,64;attention_mask:-1,64",
                Some("1,2"),
                None,
                None,
            ),
            gears: [1, 2]
                .into_iter()
                .map(|b| vec![Ids(vec![b, 64], 100), Ids(vec![b, 64], 2)])
                .collect(),
        },
    ]
}

fn tensor(input: &Input, rng: &mut Rng) -> Tensor {
    let count = |dims: &[i64]| dims.iter().product::<i64>() as usize;
    match input {
        Input::F32(dims) => {
            let v: Vec<f32> = (0..count(dims)).map(|_| rng.uniform(-1.0, 1.0)).collect();
            Tensor::from_f32s(dims.clone(), &v)
        }
        Input::I32(dims) => {
            let v: Vec<i32> = (0..count(dims))
                .map(|_| (rng.next_u64() % 7) as i32)
                .collect();
            Tensor::from_i32s(dims.clone(), &v)
        }
        Input::Ids(dims, bound) => {
            let v: Vec<i64> = (0..count(dims))
                .map(|_| (rng.next_u64() % *bound as u64) as i64)
                .collect();
            Tensor::from_i64s(dims.clone(), &v)
        }
    }
}

/// The trace of running every gear of `case` once in `mode`, and each run's device time.
fn traced(case: &Case, om: &[u8], mode: ExecMode) -> (TraceFile, Vec<u64>) {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let opts = RuntimeOptions {
        exec_mode: mode,
        ..RuntimeOptions::default()
    };
    let mut rt = Runtime::new(cfg, sink, opts).unwrap();
    let m = rt.load(om).unwrap();
    let mut rng = Rng::new(7);
    let mut times = Vec::new();
    for (i, inputs) in case.gears.iter().enumerate() {
        let inputs: Vec<Tensor> = inputs.iter().map(|x| tensor(x, &mut rng)).collect();
        let r = rt
            .run(m, &inputs)
            .unwrap_or_else(|e| panic!("{} gear {i} in {mode:?}: {e}", case.file));
        assert_eq!(r.gear, Some(i), "{} gear {i}", case.file);
        times.push(r.device_time_ps);
    }
    let bytes = rt.into_sink().finish().unwrap().into_inner();
    (TraceFile::from_bytes(bytes).unwrap(), times)
}

/// Non-sink compile options with the defaults for the chip.
fn compile_options(gear: GearOptions, cfg: &ChipConfig) -> CompileOptions {
    CompileOptions {
        gear,
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: Default::default(),
        target: atc::target(cfg),
    }
}

#[test]
fn timing_only_has_the_full_mode_timeline_on_every_test_model() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    for case in cases() {
        let onnx = std::fs::read(workspace_root().join("tests/models").join(case.file)).unwrap();
        let opts = compile_options(case.gear.clone(), &cfg);
        let om = compile(&onnx, case.file, &opts)
            .unwrap_or_else(|e| panic!("{}: {e}", case.file))
            .om_bytes()
            .unwrap();
        let (full, full_times) = traced(&case, &om, ExecMode::Full);
        let (timing, timing_times) = traced(&case, &om, ExecMode::TimingOnly);
        assert_eq!(full_times, timing_times, "{}: device times", case.file);
        assert_eq!(
            full.record_count(),
            timing.record_count(),
            "{}: record counts",
            case.file
        );
        for (i, (a, b)) in full.records().zip(timing.records()).enumerate() {
            assert_eq!(a, b, "{}: record {i} differs", case.file);
        }
        assert_eq!(full.lanes(), timing.lanes(), "{}: lanes", case.file);
    }
}

/// An AI CPU gather reads its indices, so a timing-only run computes their producer: the AI
/// core Cast that makes them carries the needs-values flag, and nothing else does.
#[test]
fn the_producer_of_an_ai_cpu_gathers_indices_computes_values() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let onnx = std::fs::read(workspace_root().join("tests/models/aicpu_ops.onnx")).unwrap();
    let opts = compile_options(options("x:-1,6;k:-1,4", Some("1,3"), None, None), &cfg);
    let c = compile(&onnx, "aicpu_ops.onnx", &opts).unwrap();
    let flagged: Vec<&str> = c
        .emitted
        .kernels
        .iter()
        .filter(|k| k.needs_values)
        .map(|k| k.name.as_str())
        .collect();
    assert!(
        !flagged.is_empty() && flagged.iter().all(|n| n.contains("Cast")),
        "kernels in full mode: {flagged:?}"
    );
    let aicpu_tasks = c
        .emitted
        .tasks
        .streams
        .iter()
        .flatten()
        .filter(|t| matches!(t.task, gearsim_isa::omtask::OmTask::AiCpu { .. }))
        .count();
    // Per gear: the gather, three casts and the Mod.
    assert_eq!(aicpu_tasks, 2 * 5);
}

/// One run of `om` on seeded `inputs` in `mode` (no gears): its device time, or the load's or
/// run's error.
fn run_once(cfg: &ChipConfig, om: &[u8], inputs: &[Input], mode: ExecMode) -> Result<u64, String> {
    let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let opts = RuntimeOptions {
        exec_mode: mode,
        ..RuntimeOptions::default()
    };
    let mut rt = Runtime::new(cfg.clone(), sink, opts).unwrap();
    let m = rt.load(om).map_err(|e| e.to_string())?;
    let inputs: Vec<Tensor> = inputs.iter().map(|x| tensor(x, &mut Rng::new(7))).collect();
    let r = rt.run(m, &inputs).map_err(|e| e.to_string())?;
    assert_eq!(r.gear, None);
    Ok(r.device_time_ps)
}

/// A timing-only run of a model where nothing computes a value from the weights neither
/// checks nor copies them: with a weight byte damaged it still runs, on the same timeline as
/// the intact model in full mode, while a full run refuses to load it, naming the section.
#[test]
fn a_timing_only_run_leaves_the_weights_unread() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let onnx = std::fs::read(workspace_root().join("tests/models/cnn.onnx")).unwrap();
    let opts = compile_options(options("input:2,3,32,32", None, None, None), &cfg);
    let om = compile(&onnx, "cnn.onnx", &opts)
        .unwrap()
        .om_bytes()
        .unwrap();
    let inputs = [Input::F32(vec![2, 3, 32, 32])];
    let run = |om: &[u8], mode: ExecMode| run_once(&cfg, om, &inputs, mode);
    let intact = run(&om, ExecMode::Full).unwrap();
    let file = gearsim_isa::om::OmFile::parse(&om).unwrap();
    let weights = file.weights().unwrap();
    assert!(weights.len() > 1000, "the model has weights");
    let at = weights.as_ptr() as usize - om.as_ptr() as usize + weights.len() / 2;
    let mut damaged = om.clone();
    damaged[at] ^= 0x10;
    assert_eq!(run(&damaged, ExecMode::TimingOnly), Ok(intact));
    let err = run(&damaged, ExecMode::Full).unwrap_err();
    assert!(err.contains("Weights section checksum mismatch"), "{err}");
}

/// A timing-only run of a model with an AI CPU operator reading a weight copies just that
/// weight (the operator computes in every mode): a damaged byte elsewhere in the weights goes
/// unread, while one in the operator's constant fails the load, as any damage fails a full
/// run. The model: `y = x + Cast(Mod(k, c))`, the Mod on the AI CPU with `c` a 4-element
/// weight, beside `z = v + w` with `w` a 1.4 MB weight (in f16), so the two lie in different 1 MiB
/// checksum chunks.
#[test]
fn a_timing_only_run_copies_only_the_weights_an_ai_cpu_operator_reads() {
    use gearsim_compiler::onnx::proto::TensorProto;
    use gearsim_host::calibrate::nets::{int, model_bytes, op_node, value_info};
    use gearsim_isa::omtask::{OmTask, Region};
    const FLOAT: i32 = 1;
    const INT32: i32 = 6;
    const WIDE: i64 = 700_000;
    let node = |op: &str, inputs: &[&str], output: &str, attrs| {
        op_node(
            op,
            output,
            inputs.iter().map(|s| s.to_string()).collect(),
            output,
            attrs,
        )
    };
    let init = |name: &str, elem: i32, dims: &[i64], raw: Vec<u8>| TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: elem,
        raw_data: Some(raw),
        ..Default::default()
    };
    let onnx = model_bytes(
        "aicpu_weight",
        vec![
            node("Mod", &["k", "c"], "m", vec![]),
            node("Cast", &["m"], "mf", vec![int("to", FLOAT.into())]),
            node("Add", &["x", "mf"], "y", vec![]),
            node("Add", &["v", "w"], "z", vec![]),
        ],
        vec![
            init(
                "c",
                INT32,
                &[4],
                [3i32, 5, 7, 9]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            init(
                "w",
                FLOAT,
                &[1, WIDE],
                (0..WIDE)
                    .flat_map(|i| (i as f32 * 1e-3).to_le_bytes())
                    .collect(),
            ),
        ],
        vec![
            value_info("x", FLOAT, &[2, 4]),
            value_info("k", INT32, &[2, 4]),
            value_info("v", FLOAT, &[1, WIDE]),
        ],
        vec![
            value_info("y", FLOAT, &[2, 4]),
            value_info("z", FLOAT, &[1, WIDE]),
        ],
    );
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let opts = compile_options(GearOptions::default(), &cfg);
    let compiled = compile(&onnx, "aicpu_weight.onnx", &opts).unwrap();
    assert!(
        compiled.emitted.kernels.iter().all(|k| !k.needs_values),
        "no kernel computes values, so the weights can be left unread"
    );
    // The span of `c` the AI CPU Mod reads.
    let spans: Vec<(u64, u64)> = compiled
        .emitted
        .tasks
        .streams
        .iter()
        .flatten()
        .filter_map(|t| match &t.task {
            OmTask::AiCpu { inputs, .. } => Some(inputs),
            _ => None,
        })
        .flatten()
        .filter(|a| a.addr.region == Region::Weights)
        .map(|a| (a.addr.offset, a.bytes))
        .collect();
    let [(c_at, c_len)] = spans[..] else {
        panic!("one AI CPU input in the weights, got {spans:?}")
    };
    let om = compiled.om_bytes().unwrap();
    let inputs = [
        Input::F32(vec![2, 4]),
        Input::I32(vec![2, 4]),
        Input::F32(vec![1, WIDE]),
    ];
    let run = |om: &[u8], mode: ExecMode| run_once(&cfg, om, &inputs, mode);
    let intact = run(&om, ExecMode::Full).unwrap();
    assert_eq!(run(&om, ExecMode::TimingOnly), Ok(intact));
    let file = gearsim_isa::om::OmFile::parse(&om).unwrap();
    let weights = file.weights().unwrap();
    let base = weights.as_ptr() as usize - om.as_ptr() as usize;
    const CHUNK: u64 = 1 << 20;
    assert!(
        weights.len() as u64 > CHUNK,
        "the weights span two checksum chunks"
    );
    // A byte in the chunk `c` is not in, and a byte of `c` itself.
    let elsewhere = if c_at / CHUNK == 0 {
        weights.len() as u64 - 1
    } else {
        0
    };
    let damaged = |at: u64| {
        let mut om = om.clone();
        om[base + at as usize] ^= 0x10;
        om
    };
    let unread = damaged(elsewhere);
    assert_eq!(run(&unread, ExecMode::TimingOnly), Ok(intact));
    for om in [&unread, &damaged(c_at + c_len / 2)] {
        let err = run(om, ExecMode::Full).unwrap_err();
        assert!(err.contains("Weights section checksum mismatch"), "{err}");
    }
    let err = run(&damaged(c_at + c_len / 2), ExecMode::TimingOnly).unwrap_err();
    assert!(err.contains("checksum"), "{err}");
}
