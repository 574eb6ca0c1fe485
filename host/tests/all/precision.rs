//! atc's `--precision_mode` end to end: an fp32 model compiled with `force_fp16` (the
//! default) computes its convolutions and element-wise ops in fp16 between casts at the
//! model's edges, keeps its fp32 interface, and agrees with the same model kept in fp32 within
//! fp16's precision; the mode is recorded in the `.om` for `gearsim info`.

use gearsim_compiler::fusion::FusionSwitches;
use gearsim_compiler::ir::DataType;
use gearsim_compiler::pipeline::compile;
use gearsim_compiler::precision::PrecisionMode;
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

use super::device_run::{cnn_input, cnn_options, f32s};

fn run(mode: PrecisionMode) -> (Vec<f32>, Vec<(String, String)>, usize) {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let opts = cnn_options(&cfg, FusionSwitches::default(), mode);
    let c = compile(gearsim_host::demo::CNN, "cnn.onnx", &opts).unwrap();
    let f16_convs = c.after.subgraphs[1]
        .nodes
        .iter()
        .filter(|n| n.op == "Conv" && n.outputs[0].dtype == DataType::F16)
        .count();
    let om = c.om_bytes().unwrap();
    let mut rt = Runtime::new(cfg, NullSink, RuntimeOptions::default()).unwrap();
    let m = rt.load(&om).unwrap();
    let desc = rt.desc(m).unwrap().clone();
    let r = rt.run(m, &[cnn_input()]).unwrap();
    assert_eq!(
        r.outputs[0].dtype,
        DataType::F32,
        "the interface stays fp32"
    );
    let y = f32s(&r.outputs[0]);
    (y, desc.build_options, f16_convs)
}

#[test]
fn force_fp16_agrees_with_fp32_within_fp16_precision() {
    let (half, opts, f16_convs) = run(PrecisionMode::ForceFp16);
    let (full, _, f32_convs) = run(PrecisionMode::MustKeepOriginDtype);
    assert!(f16_convs >= 3, "{f16_convs} convolutions in fp16");
    assert_eq!(f32_convs, 0);
    assert!(opts.contains(&("precision_mode".into(), "force_fp16".into())));
    let scale = full.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (a, b)) in half.iter().zip(&full).enumerate() {
        // A few fp16 roundings per layer over eight layers.
        assert!(
            (a - b).abs() <= 2e-2 * scale,
            "output {i}: fp16 {a}, fp32 {b} (scale {scale})"
        );
    }
    assert!(
        half != full,
        "fp16 computation rounds differently somewhere"
    );
}

/// The hybrid dynamic-shape path computes in the types the gear branches do: a `force_fp16`
/// model's dynamic path runs its fp32 ops in fp16 (casts at the edges, so it lowers more op
/// configurations than the same model kept in fp32) and agrees with the gear path.
#[test]
fn the_dynamic_path_follows_the_models_precision_mode() {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let run = |mode: PrecisionMode| {
        let opts = cnn_options(&cfg, FusionSwitches::default(), mode);
        let c = compile(gearsim_host::demo::CNN, "cnn.onnx", &opts).unwrap();
        let mut rt = Runtime::new(cfg.clone(), NullSink, RuntimeOptions::default()).unwrap();
        let m = rt.load(&c.hybrid_om_bytes().unwrap()).unwrap();
        let x = cnn_input();
        let gear = rt.run(m, std::slice::from_ref(&x)).unwrap().outputs;
        let dynamic = rt.run_dynamic_path(m, &[x]).unwrap().outputs;
        let lowered = rt.dynamic_stats(m).unwrap().unwrap().lowered;
        (gear, dynamic, lowered)
    };
    let (gear, dynamic, half_ops) = run(PrecisionMode::ForceFp16);
    let (_, _, full_ops) = run(PrecisionMode::MustKeepOriginDtype);
    assert!(
        half_ops > full_ops,
        "{half_ops} vs {full_ops} op configurations"
    );
    let (g, d) = (f32s(&gear[0]), f32s(&dynamic[0]));
    let scale = g.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (a, b) in g.iter().zip(&d) {
        assert!((a - b).abs() <= 1e-2 * scale, "gear {a}, dynamic {b}");
    }
}
