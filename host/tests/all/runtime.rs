//! The ACL-shaped runtime: non-sink runs with merged H2D copies, GetNext sink runs with the
//! dims read back, the ACL flow (`set_*`, execute, current output dims) with GE's error
//! codes, and the hybrid dynamic-shape path.

use std::path::Path;

use gearsim_compiler::eval::eval_model;
use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, Compiled, compile};
use gearsim_host::atc;
use gearsim_host::runtime::{ErrorCode, RunPath, Runtime, RuntimeError, RuntimeOptions};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

use super::device_run::{assert_close, f32s, rand_f32};

const SEED_SHAPE: &str = "data:1,1,40,-1;label:1,-1;mask:-1,-1";
const SEED_DIMS: &str = "20,20,1,1;40,40,2,2;80,60,4,4";

fn cfg() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

fn compiled(model: &str, gear: GearOptions, sink: bool) -> Compiled {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/models")
        .join(model);
    let bytes = std::fs::read(path).unwrap();
    compile(&bytes, model, &options(gear, sink)).unwrap_or_else(|e| panic!("{model}: {e}"))
}

/// The tests' compile options: `gear`, sink or not, origin dtypes, on [`cfg`].
fn options(gear: GearOptions, sink: bool) -> CompileOptions {
    CompileOptions {
        gear,
        getnext_sink: sink,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: gearsim_compiler::precision::PrecisionMode::MustKeepOriginDtype,
        target: atc::target(&cfg()),
    }
}

fn seed(sink: bool) -> Compiled {
    compiled(
        "gear_dims.onnx",
        GearOptions {
            input_shape: Some(SEED_SHAPE.into()),
            dynamic_dims: Some(SEED_DIMS.into()),
            ..GearOptions::default()
        },
        sink,
    )
}

fn runtime(opts: RuntimeOptions) -> Runtime<NullSink> {
    Runtime::new(cfg(), NullSink, opts).unwrap()
}

fn rand_i32(dims: &[i64], seed: u64) -> Tensor {
    let t = rand_f32(dims, -1000.0, 1000.0, seed);
    let data = f32s(&t)
        .iter()
        .flat_map(|v| (*v as i32).to_le_bytes())
        .collect();
    Tensor::new(DataType::I32, dims.to_vec(), data).unwrap()
}

/// The seed model's inputs for gear values [t, l, m, k].
fn seed_inputs(g: &[i64], seed: u64) -> Vec<Tensor> {
    vec![
        rand_f32(&[1, 1, 40, g[0]], -1.0, 1.0, seed),
        rand_i32(&[1, g[1]], seed + 1),
        rand_f32(&[g[2], g[3]], -1.0, 1.0, seed + 2),
    ]
}

fn code(e: &RuntimeError) -> String {
    e.code().to_string()
}

#[test]
fn sink_and_non_sink_agree_bit_for_bit_on_every_gear() {
    let gears = [[20, 20, 1, 1], [40, 40, 2, 2], [80, 60, 4, 4]];
    let mut rt = runtime(RuntimeOptions::default());
    let plain = rt.load(&seed(false).om_bytes().unwrap()).unwrap();
    let sink = rt.load(&seed(true).om_bytes().unwrap()).unwrap();
    assert!(!rt.is_sink(plain).unwrap() && rt.is_sink(sink).unwrap());
    let desc = rt.desc(plain).unwrap().clone();
    let d = desc.dynamic.as_ref().unwrap();
    for (i, g) in gears.iter().enumerate() {
        let x = seed_inputs(g, 10 * i as u64);
        let a = rt.run(plain, &x).unwrap();
        let b = rt.run_sink(sink, &x).unwrap();
        for r in [&a, &b] {
            assert_eq!(r.gear, Some(i));
            assert_eq!(r.cur_dynamic_dims, g.to_vec());
            assert_eq!(r.path, RunPath::Gear);
            assert!(r.warnings.is_empty());
            // Outputs 0 and 1 come from the Case: the table's shapes. Output 2 is the input
            // `label` returned as is: its real shape (GE's table has the largest gear's).
            for (o, t) in r.outputs.iter().enumerate().take(2) {
                assert_eq!(t.dims, d.output_dims[i][o], "output {o} shape at gear {i}");
            }
            assert_eq!(r.outputs[2].dims, x[1].dims);
            assert_eq!(d.output_dims[i][2], vec![1, 60]);
        }
        for (o, (p, q)) in a.outputs.iter().zip(&b.outputs).enumerate() {
            assert_eq!(
                p.data, q.data,
                "output {o} differs between the modes at gear {i}"
            );
        }
        // And both are right.
        let feeds = ["data", "label", "mask"]
            .iter()
            .map(|n| n.to_string())
            .zip(x.iter().cloned())
            .collect();
        let want = eval_model(&seed(false).before, &feeds).unwrap();
        for (o, w) in want.iter().enumerate() {
            assert_eq!(a.outputs[o].dims, w.dims);
            assert_close(
                &f32s(&a.outputs[o]),
                &w.to_f64s(),
                1e-6,
                0.0,
                &format!("output {o}"),
            );
        }
        // Sink mode reads the dims back; non-sink writes them.
        assert_eq!(b.d2h_transfers, a.d2h_transfers + 1);
    }
}

#[test]
fn non_sink_merges_small_inputs_into_one_transfer() {
    let g = [80, 60, 4, 4];
    let x = seed_inputs(&g, 3);
    let mut merged = runtime(RuntimeOptions::default());
    let m = merged.load(&seed(false).om_bytes().unwrap()).unwrap();
    let a = merged.run(m, &x).unwrap();
    let mut single = runtime(RuntimeOptions {
        input_fusion_size: 0,
        ..RuntimeOptions::default()
    });
    let s = single.load(&seed(false).om_bytes().unwrap()).unwrap();
    let b = single.run(s, &x).unwrap();
    // Three data inputs (12 800, 240 and 64 bytes, all under 128 KiB) plus the dims blob:
    // one merged copy and the blob, against four copies.
    assert_eq!((a.h2d_transfers, b.h2d_transfers), (2, 4));
    let data: u64 = x.iter().map(|t| t.data.len() as u64).sum();
    assert_eq!(b.h2d_bytes, data + 16);
    assert!(a.h2d_bytes >= data + 16, "the span covers every member");
    for (p, q) in a.outputs.iter().zip(&b.outputs) {
        assert_eq!(p.data, q.data);
    }
}

#[test]
fn a_shape_matching_no_gear_is_e13025_in_non_sink_and_the_last_branch_in_sink() {
    let x = seed_inputs(&[40, 20, 1, 1], 5);
    let mut rt = runtime(RuntimeOptions::default());
    let plain = rt.load(&seed(false).om_bytes().unwrap()).unwrap();
    let e = rt.run(plain, &x).unwrap_err();
    assert_eq!(code(&e), "E13025");
    let msg = e.to_string();
    assert!(
        msg.contains("[40,20,1,1]") && msg.contains("[80,60,4,4]"),
        "{msg}"
    );
    let sink = rt.load(&seed(true).om_bytes().unwrap()).unwrap();
    let r = rt.run_sink(sink, &x).unwrap();
    assert_eq!(r.gear, None);
    assert_eq!(r.cur_dynamic_dims, vec![40, 20, 1, 1]);
    assert!(r.warnings[0].contains("last branch"), "{:?}", r.warnings);
}

#[test]
fn several_batches_queue_and_run_back_to_back_in_sink_mode() {
    let gears = [[40, 40, 2, 2], [20, 20, 1, 1], [80, 60, 4, 4]];
    let mut rt = runtime(RuntimeOptions::default());
    let sink = rt.load(&seed(true).om_bytes().unwrap()).unwrap();
    for (i, g) in gears.iter().enumerate() {
        rt.enqueue(sink, &seed_inputs(g, i as u64)).unwrap();
    }
    for g in &gears {
        let r = rt.run_queued(sink).unwrap();
        assert_eq!(r.cur_dynamic_dims, g.to_vec());
    }
    let e = rt.run_queued(sink).unwrap_err();
    assert_eq!(code(&e), "100000", "{e}");
}

#[test]
fn inputs_are_checked_before_anything_runs() {
    let mut rt = runtime(RuntimeOptions::default());
    let m = rt.load(&seed(false).om_bytes().unwrap()).unwrap();
    let x = seed_inputs(&[20, 20, 1, 1], 1);
    let e = rt.run(m, &x[..2]).unwrap_err();
    assert!(
        e.to_string()
            .contains("takes 3 input(s) (data, label, mask), got 2"),
        "{e}"
    );
    let mut wrong_type = x.clone();
    wrong_type[1] = rand_f32(&[1, 20], 0.0, 1.0, 1);
    let e = rt.run(m, &wrong_type).unwrap_err();
    assert!(
        e.to_string().contains("expected element type i32, got f32"),
        "{e}"
    );
    let mut wrong_static = x.clone();
    wrong_static[0] = rand_f32(&[1, 1, 41, 20], 0.0, 1.0, 1);
    let e = rt.run(m, &wrong_static).unwrap_err();
    assert!(e.to_string().contains("axis 2: expected 40"), "{e}");
    assert_eq!(code(&e), "100000");
}

#[test]
fn the_acl_flow_sets_dims_and_reports_the_current_output_dims() {
    let mut rt = runtime(RuntimeOptions::default());
    let m = rt.load(&seed(false).om_bytes().unwrap()).unwrap();
    let gear_input = rt
        .input_index_by_name(m, "ascend_mbatch_shape_data")
        .unwrap();
    assert_eq!(gear_input, 3);
    assert_eq!(rt.gear_count(m, -1).unwrap(), 3);
    assert_eq!(code(&rt.gear_count(m, 0).unwrap_err()), "100000");
    let all = rt.input_dynamic_dims(m, -1).unwrap();
    assert_eq!(all[1], vec![1, 1, 40, 40, 1, 40, 2, 2]);
    assert!(rt.dynamic_batch(m).unwrap().is_empty());
    // Errors: GE's codes.
    let err = |r: Result<(), RuntimeError>| code(&r.unwrap_err());
    assert_eq!(err(rt.set_input_dynamic_dims(m, gear_input, &[])), "100000");
    assert_eq!(err(rt.set_input_dynamic_dims(m, 0, &[1; 8])), "145011");
    assert_eq!(
        err(rt.set_input_dynamic_dims(m, gear_input, &[1, 1, 40, 40])),
        "145012"
    );
    assert_eq!(
        err(rt.set_input_dynamic_dims(m, gear_input, &[1, 1, 41, 40, 1, 40, 2, 2])),
        "145012"
    );
    assert_eq!(
        err(rt.set_input_dynamic_dims(m, gear_input, &[1, 1, 40, 40, 1, 40, 2, 3])),
        "145013"
    );
    assert_eq!(err(rt.set_dynamic_batch_size(m, gear_input, 4)), "145013");
    assert_eq!(err(rt.set_dynamic_batch_size(m, gear_input, 0)), "100000");
    assert!(matches!(
        rt.input_index_by_name(m, "nope"),
        Err(RuntimeError::InvalidParam(_))
    ));
    // The flow: set the dims, copy the inputs, execute, read at the current dims.
    rt.set_input_dynamic_dims(m, gear_input, &all[1]).unwrap();
    let x = seed_inputs(&[40, 40, 2, 2], 9);
    for (i, t) in x.iter().enumerate() {
        rt.write_input(m, i, &t.data).unwrap();
    }
    rt.execute(m).unwrap();
    assert_eq!(rt.cur_output_dims(m, 0).unwrap(), vec![1, 1, 40, 40]);
    assert_eq!(rt.cur_output_dims(m, 1).unwrap(), vec![2]);
    // The direct output, read the ACL way, has GE's table shape (the largest gear's): the
    // input's bytes, then the buffer's unused tail.
    let label = rt.read_output(m, 2).unwrap();
    assert_eq!(label.dims, vec![1, 60]);
    assert_eq!(
        label.data[..x[1].data.len()],
        x[1].data[..],
        "the direct output is the input"
    );
    // The same through run().
    let r = rt.run(m, &x).unwrap();
    assert_eq!(rt.read_output(m, 0).unwrap().data, r.outputs[0].data);
    assert!(matches!(e_code(&rt), ErrorCode::Acl(_)));
}

fn e_code(rt: &Runtime<NullSink>) -> ErrorCode {
    rt.gear_count(gearsim_host::runtime::ModelId(99), -1)
        .unwrap_err()
        .code()
}

#[test]
fn hybrid_runs_unmatched_shapes_on_the_dynamic_path_and_caches_kernels() {
    let c = seed(false);
    // The reference runs the source graph itself: the compiled "before" graph only admits the
    // gears' ranges.
    let source = gearsim_compiler::onnx::import(&c.source, "gear_dims.onnx")
        .unwrap()
        .model;
    let mut rt = runtime(RuntimeOptions::default());
    let m = rt.load(&c.hybrid_om_bytes().unwrap()).unwrap();
    assert!(rt.is_hybrid(m).unwrap());
    let feeds = |x: &[Tensor]| {
        ["data", "label", "mask"]
            .iter()
            .map(|n| n.to_string())
            .zip(x.iter().cloned())
            .collect()
    };
    // A gear runs the gear model.
    let x = seed_inputs(&[20, 20, 1, 1], 1);
    assert_eq!(rt.run(m, &x).unwrap().path, RunPath::Gear);
    // Anything else runs op by op, and matches the reference.
    let mut stats = Vec::new();
    for (k, g) in [[33, 7, 3, 5], [33, 7, 3, 5], [90, 70, 5, 6]]
        .iter()
        .enumerate()
    {
        let x = seed_inputs(g, 20 + k as u64);
        let r = rt.run(m, &x).unwrap();
        assert_eq!(r.path, RunPath::Dynamic, "{}", r.reason);
        assert!(r.reason.contains("match no gear"), "{}", r.reason);
        let want = eval_model(&source, &feeds(&x)).unwrap();
        for (o, w) in want.iter().enumerate() {
            assert_eq!(r.outputs[o].dims, w.dims, "output {o}");
            assert_eq!(r.outputs[o].dtype, w.dtype);
            assert_close(
                &f32s(&r.outputs[o]),
                &w.to_f64s(),
                1e-6,
                0.0,
                &format!("output {o}"),
            );
        }
        stats.push(rt.dynamic_stats(m).unwrap().unwrap());
    }
    // The same shapes again: every kernel from the cache, every buffer reused.
    assert_eq!(stats[1].lowered, stats[0].lowered);
    assert!(stats[1].cache_hits > stats[0].cache_hits);
    assert_eq!(stats[1].reallocs, stats[0].reallocs);
    // Larger shapes: new kernels, grown buffers.
    assert!(stats[2].lowered > stats[1].lowered);
    assert!(stats[2].reallocs > stats[1].reallocs);
}

/// A chip whose host costs are `scale` times the preset's (0: a host that costs nothing).
fn cfg_host_scaled(scale: u64) -> ChipConfig {
    let mut c = cfg();
    let h = &mut c.host;
    for v in [
        &mut h.api_call_ns,
        &mut h.submit_ns,
        &mut h.sync_ns,
        &mut h.queue_send_ns,
        &mut h.infer_shape_ns,
        &mut h.tiling_ns,
        &mut h.kernel_select_ns,
        &mut h.alloc_ns,
    ] {
        *v *= scale;
    }
    if scale == 0 {
        h.staging_bytes_per_second = u64::MAX;
    }
    c
}

/// A non-sink run's host work is what its ACL calls cost, item by item: a synchronous copy
/// per H2D transfer (staging, submission, wake-up), the execution's submission and wake-up,
/// and a synchronous copy per output; end to end is host work plus device time plus the
/// dispatch gaps, and the device figures do not depend on the host's costs at all.
#[test]
fn host_time_is_the_calls_costs_and_leaves_device_time_alone() {
    let g = [80, 60, 4, 4];
    let x = seed_inputs(&g, 3);
    let om = seed(false).om_bytes().unwrap();
    let run = |c: ChipConfig| {
        let mut rt = Runtime::new(c, NullSink, RuntimeOptions::default()).unwrap();
        let m = rt.load(&om).unwrap();
        rt.run(m, &x).unwrap()
    };
    let (free, costed) = (run(cfg_host_scaled(0)), run(cfg()));
    assert_eq!(free.host_ps, 0);
    // Tasks start at other phases of the cores' and the memory system's clocks: a few hundred
    // ps apart, never more than a cycle per task.
    let tasks = costed.h2d_transfers + costed.d2h_transfers + 1;
    assert!(
        free.execute_ps.abs_diff(costed.execute_ps) <= 1000,
        "execution {} ps with a free host, {} ps with the preset's",
        free.execute_ps,
        costed.execute_ps
    );
    assert!(
        free.device_time_ps.abs_diff(costed.device_time_ps) <= 1000 * tasks,
        "device time {} ps with a free host, {} ps with the preset's",
        free.device_time_ps,
        costed.device_time_ps
    );
    assert_eq!(free.outputs.len(), costed.outputs.len());
    for (a, b) in free.outputs.iter().zip(&costed.outputs) {
        assert_eq!(a.data, b.data);
    }
    let h = cfg().host;
    let round_trips = costed.h2d_transfers + 1 + costed.d2h_transfers;
    let staged = costed.h2d_bytes + costed.d2h_bytes;
    let staging_ps = |bytes: u64| bytes * 1_000_000_000_000 / h.staging_bytes_per_second;
    let want = round_trips * (h.submit_ns + h.sync_ns) * 1000;
    // Each staging copy rounds down to a picosecond on its own.
    let staging = costed.host_ps - want;
    assert!(
        staging.abs_diff(staging_ps(staged)) <= round_trips,
        "host {} ps: {want} ps of submissions and wake-ups, then {staging} ps of staging for \
         {staged} bytes",
        costed.host_ps
    );
    assert!(costed.end_to_end_ps >= costed.host_ps + costed.device_time_ps);
    // Every call waits for the device, so nothing overlaps: the host's work adds up, give or
    // take the clock phases above.
    assert!(
        (costed.end_to_end_ps - free.end_to_end_ps).abs_diff(costed.host_ps) <= 1000 * tasks,
        "the host's work adds to end to end: {} vs {}",
        costed.end_to_end_ps,
        free.end_to_end_ps
    );
}

/// The dynamic-shape path pays shape inference and tiling on the host for every op and
/// launches asynchronously: with the preset's costs it is host-bound (end to end well above
/// device time), slower end to end than the gear path though its device time is about the
/// same, and a host ten times slower makes it slower still while the device time stays.
#[test]
fn the_dynamic_path_is_host_bound_and_slower_than_a_gear_end_to_end() {
    let c = seed(false);
    let x = seed_inputs(&[40, 40, 2, 2], 8);
    let runs = |chip: ChipConfig| {
        let mut rt = Runtime::new(chip, NullSink, RuntimeOptions::default()).unwrap();
        let m = rt.load(&c.hybrid_om_bytes().unwrap()).unwrap();
        let gear = rt.run(m, &x).unwrap();
        rt.run_dynamic_path(m, &x).unwrap();
        let cached = rt.run_dynamic_path(m, &x).unwrap();
        (gear, cached)
    };
    let (gear, dynamic) = runs(cfg());
    assert_eq!(gear.path, RunPath::Gear);
    assert_eq!(dynamic.path, RunPath::Dynamic);
    assert!(
        dynamic.end_to_end_ps > 2 * dynamic.device_time_ps,
        "host-bound: end to end {} ps, device {} ps",
        dynamic.end_to_end_ps,
        dynamic.device_time_ps
    );
    assert!(dynamic.end_to_end_ps > gear.end_to_end_ps);
    let h = cfg().host;
    let launches = dynamic.kernels.len().max(1) as u64;
    assert!(dynamic.host_ps >= launches * (h.tiling_ns + h.submit_ns) * 1000);
    let (_, slow) = runs(cfg_host_scaled(10));
    assert!(slow.end_to_end_ps > dynamic.end_to_end_ps);
    assert_eq!(slow.device_time_ps, dynamic.device_time_ps);
}

/// The dynamic path launches asynchronously, so a buffer it replaces during a run (a larger
/// workspace for a later node) must outlive the kernels queued before: with a host that costs
/// nothing the device lags furthest behind, and the run must still be right.
#[test]
fn buffers_replaced_during_an_asynchronous_dynamic_run_outlive_the_kernels_using_them() {
    use super::onnx_build::{model, node};
    use prost::Message as _;
    let mut m = model(
        17,
        vec![
            node("GlobalAveragePool", "gap_a", &["x"], &["a"]),
            node("Concat", "cat", &["x", "x", "x", "x"], &["c"]),
            node("GlobalAveragePool", "gap_b", &["c"], &["b"]),
        ],
        &[("x", &[Some(1), Some(1), None, None])],
        &[
            ("a", &[Some(1), Some(1), Some(1), Some(1)]),
            ("b", &[Some(1), Some(1), Some(1), Some(1)]),
        ],
        vec![],
    );
    m.graph.as_mut().unwrap().node[1].attribute.push(
        gearsim_compiler::onnx::proto::AttributeProto {
            name: "axis".into(),
            i: 2,
            r#type: 2,
            ..Default::default()
        },
    );
    let c = compile(
        &m.encode_to_vec(),
        "gaps.onnx",
        &options(
            GearOptions {
                input_shape: Some("x:1,1,-1,-1".into()),
                dynamic_image_size: Some("8,8;16,16".into()),
                ..GearOptions::default()
            },
            false,
        ),
    )
    .unwrap();
    let source = gearsim_compiler::onnx::import(&c.source, "gaps.onnx")
        .unwrap()
        .model;
    let mut rt = Runtime::new(cfg_host_scaled(0), NullSink, RuntimeOptions::default()).unwrap();
    let id = rt.load(&c.hybrid_om_bytes().unwrap()).unwrap();
    let (h, w) = (1024i64, 2048i64);
    let v: Vec<f32> = (0..h * w)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
        .collect();
    let x = Tensor::from_f32s(vec![1, 1, h, w], &v);
    let r = rt.run(id, std::slice::from_ref(&x)).unwrap();
    assert_eq!(r.path, RunPath::Dynamic);
    let want = eval_model(&source, &[("x".to_string(), x)].into()).unwrap();
    for (o, w) in want.iter().enumerate() {
        assert_close(
            &f32s(&r.outputs[o]),
            &w.to_f64s(),
            1e-5,
            1e-6,
            &format!("output {o}"),
        );
    }
}

/// A model of two inputs `x[N, 3]`, `y[M, 3]`, each through a Relu.
fn two_relus() -> Vec<u8> {
    use super::onnx_build::{model, node};
    use prost::Message as _;
    model(
        13,
        vec![
            node("Relu", "rx", &["x"], &["ox"]),
            node("Relu", "ry", &["y"], &["oy"]),
        ],
        &[("x", &[None, Some(3)]), ("y", &[None, Some(3)])],
        &[("ox", &[None, Some(3)]), ("oy", &[None, Some(3)])],
        vec![],
    )
    .encode_to_vec()
}

/// `[n, 3]` ones.
fn ones(n: i64) -> Tensor {
    Tensor::from_f32s(vec![n, 3], &vec![1.0; 3 * n as usize])
}

/// Dynamic batch over several inputs, the common case of NLP models: each input with a -1
/// batch takes the whole one-value gear (spec 3.1), in both modes. It compiled, then every
/// load failed ("shape_order covers 2 gear axes, the gears have 1 values").
#[test]
fn a_batch_gear_applies_to_every_listed_input_with_a_minus_one_batch() {
    for sink in [false, true] {
        let gear = GearOptions {
            input_shape: Some("x:-1,3;y:-1,3".into()),
            dynamic_batch_size: Some("1,2,4".into()),
            ..GearOptions::default()
        };
        let c = compile(&two_relus(), "two.onnx", &options(gear, sink)).unwrap();
        let mut rt = runtime(RuntimeOptions::default());
        let id = rt.load(&c.om_bytes().unwrap()).unwrap();
        for b in [1, 4, 2] {
            let inputs = [ones(b), ones(b)];
            let r = if sink {
                rt.enqueue(id, &inputs).unwrap();
                rt.run_queued(id).unwrap()
            } else {
                rt.run(id, &inputs).unwrap()
            };
            assert_eq!(r.cur_dynamic_dims, [b], "sink {sink}");
            assert_eq!(r.outputs[0].dims, [b, 3]);
            assert_eq!(r.outputs[1].dims, [b, 3]);
        }
    }
}

/// An input `--input_shape` leaves out joins a batch gear (spec 2.3): its batch must be the
/// gear's too. A run whose other inputs pick gear [2] while `y` has batch 4 (which would be cut
/// to 2) or 5 (which overflowed the merged copy) is E13025, naming `y`, in both modes.
#[test]
fn every_input_must_have_the_shape_of_the_gear_the_others_pick() {
    for sink in [false, true] {
        let c = compile(
            &two_relus(),
            "two.onnx",
            &options(
                GearOptions {
                    input_shape: Some("x:-1,3".into()),
                    dynamic_batch_size: Some("1,2,4".into()),
                    ..GearOptions::default()
                },
                sink,
            ),
        )
        .unwrap();
        let mut rt = runtime(RuntimeOptions::default());
        let id = rt.load(&c.om_bytes().unwrap()).unwrap();
        let run = |rt: &mut Runtime<NullSink>, y: i64| {
            let inputs = [ones(2), ones(y)];
            if sink {
                rt.enqueue(id, &inputs)?;
                rt.run_queued(id)
            } else {
                rt.run(id, &inputs)
            }
        };
        let ok = run(&mut rt, 2).unwrap();
        assert_eq!(ok.outputs[1].dims, [2, 3]);
        if !sink {
            // A batch that is no gear names the batch option and the way out (--hybrid).
            let e = rt.run(id, &[ones(3), ones(3)]).unwrap_err().to_string();
            assert!(
                e.contains("E13025") && e.contains("dynamic_batch_size") && e.contains("--hybrid"),
                "{e}"
            );
        }
        for y in [4, 5] {
            let e = run(&mut rt, y).unwrap_err();
            assert_eq!(code(&e), "E13025", "sink {sink}, y batch {y}: {e}");
            assert!(
                e.to_string()
                    .contains(&format!("input `y` has shape [{y},3]")),
                "{e}"
            );
        }
    }
}

/// GetCurOutputDims follows the kind of the last Set* call (spec 9): on a batch model a shape
/// set by set_input_dynamic_dims names no gear, one set by set_dynamic_batch_size does.
#[test]
fn the_current_output_dims_follow_the_kind_of_the_last_set_call() {
    let c = compiled(
        "cnn.onnx",
        GearOptions {
            input_shape: Some("input:-1,3,32,32".into()),
            dynamic_batch_size: Some("1,2".into()),
            ..GearOptions::default()
        },
        false,
    );
    let mut rt = runtime(RuntimeOptions::default());
    let m = rt.load(&c.om_bytes().unwrap()).unwrap();
    let gear_input = rt
        .input_index_by_name(m, "ascend_mbatch_shape_data")
        .unwrap();
    rt.set_input_dynamic_dims(m, gear_input, &[2, 3, 32, 32])
        .unwrap();
    let e = rt.cur_output_dims(m, 0).unwrap_err().to_string();
    assert!(
        e.contains("set by set_input_dynamic_dims") && e.contains("batch gears"),
        "{e}"
    );
    rt.set_dynamic_batch_size(m, gear_input, 2).unwrap();
    assert_eq!(rt.cur_output_dims(m, 0).unwrap()[0], 2);
}

/// GE sizes a gear input's buffer by the gear with the most elements (spec 4), so a gear that
/// is larger on one axis (24×40 beside 32×32) must still load and run, in both modes.
#[test]
fn a_gear_larger_on_one_axis_than_the_largest_gear_runs() {
    for sink in [false, true] {
        let c = compiled(
            "gear_image.onnx",
            GearOptions {
                input_shape: Some("img:1,3,-1,-1".into()),
                dynamic_image_size: Some("16,16;32,32;24,40".into()),
                ..GearOptions::default()
            },
            sink,
        );
        let mut rt = runtime(RuntimeOptions::default());
        let m = rt.load(&c.om_bytes().unwrap()).unwrap();
        for (h, w) in [(16, 16), (24, 40), (32, 32)] {
            let x = rand_f32(&[1, 3, h, w], -1.0, 1.0, 7);
            let got = if sink {
                rt.enqueue(m, std::slice::from_ref(&x)).unwrap();
                rt.run_queued(m).unwrap()
            } else {
                rt.run(m, std::slice::from_ref(&x)).unwrap()
            };
            let want = eval_model(&c.before, &[("img".to_string(), x)].into()).unwrap();
            for (o, reference) in want.iter().enumerate() {
                let at = format!("sink {sink}, {h}x{w}, output {o}");
                assert_eq!(got.outputs[o].dims, reference.dims, "{at}");
                // The convolution's products are f16 on the cube.
                assert_close(
                    &f32s(&got.outputs[o]),
                    &reference.to_f64s(),
                    2e-3,
                    1e-3,
                    &at,
                );
            }
        }
    }
}
