//! Fusion end to end: the same model compiled with every fusion pass on and with all of them
//! off runs fewer kernels fused and gives bit-identical outputs (the fused activation is the
//! same vector instruction on the same converted values), except a MatMul's fused bias, which
//! is added in the accumulator and rounded once (as GE's MatMul with bias); a fusion switch
//! file that is not
//! atc's format, or names a pass gearsim does not have, is rejected before anything is
//! written.

use gearsim_compiler::fusion::{
    FUSED_ACTIVATION, FUSED_BIAS, FUSED_DEQUANT, FUSED_RESIDUAL, FusionSwitches, Pass,
};
use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_compiler::precision::PrecisionMode;
use gearsim_host::atc;
use gearsim_host::calibrate::nets::{DType, Net};
use gearsim_host::runtime::{Runtime, RuntimeOptions};

use super::device_run::{cnn_input, cnn_options, run_image_net_timing_only};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

/// Runs the demo CNN (conv, batch norm, ReLU, residual Add, depthwise, pooling, Gemm) at batch
/// 2 with fusion on or off: its outputs and the kernels it launched.
fn run_cnn(fusion: FusionSwitches) -> (Vec<Tensor>, usize, usize) {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let opts = cnn_options(&cfg, fusion, PrecisionMode::default());
    let c = compile(gearsim_host::demo::CNN, "cnn.onnx", &opts).unwrap();
    // The branch of gear [2], the one the run takes.
    let fused_nodes = c.after.subgraphs[1]
        .nodes
        .iter()
        .filter(|n| n.attr(FUSED_ACTIVATION).is_some())
        .count();
    let (outputs, kernels) = run_profiled(cfg, &c.om_bytes().unwrap(), &[cnn_input()]);
    (outputs, kernels, fused_nodes)
}

/// atc's defaults (`force_fp16`, non-sink) for `cfg` with `gear` and `fusion`.
fn fp16_options(cfg: &ChipConfig, gear: GearOptions, fusion: FusionSwitches) -> CompileOptions {
    CompileOptions {
        gear,
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion,
        precision: PrecisionMode::ForceFp16,
        target: atc::target(cfg),
    }
}

/// Loads `om` on `cfg` and runs it once on `inputs`: its outputs and the kernels it launched.
fn run_profiled(cfg: ChipConfig, om: &[u8], inputs: &[Tensor]) -> (Vec<Tensor>, usize) {
    let mut rt = Runtime::new(
        cfg,
        NullSink,
        RuntimeOptions {
            profile: true,
            ..RuntimeOptions::default()
        },
    )
    .unwrap();
    let m = rt.load(om).unwrap();
    let r = rt.run(m, inputs).unwrap();
    (r.outputs, r.kernels.len())
}

#[test]
fn fused_and_unfused_compiles_agree_bit_for_bit() {
    let (fused, fused_kernels, fused_nodes) = run_cnn(FusionSwitches::all_on());
    let (plain, plain_kernels, plain_nodes) = run_cnn(FusionSwitches::all_off());
    assert_eq!(plain_nodes, 0);
    assert!(fused_nodes > 0, "the CNN has activations to fuse");
    assert!(
        fused_kernels + fused_nodes <= plain_kernels,
        "fused {fused_kernels} kernels, unfused {plain_kernels}, {fused_nodes} fused nodes"
    );
    assert_eq!(fused.len(), plain.len());
    for (a, b) in fused.iter().zip(&plain) {
        assert_eq!(a.dims, b.dims);
        assert!(a.data == b.data, "fused and unfused outputs differ");
    }
}

#[test]
fn resnet_blocks_fuse_their_activations_into_conv_and_add() {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let onnx = Net::ResNet18.onnx(1, DType::F16, 3);
    let mut opts = cnn_options(&cfg, FusionSwitches::all_on(), PrecisionMode::default());
    opts.gear = GearOptions::default();
    let c = compile(&onnx, "resnet18.onnx", &opts).unwrap();
    let g = &c.after.graph;
    let count = |op: &str| g.nodes.iter().filter(|n| n.op == op).count();
    // 17 ReLUs: 9 after a convolution, 8 after a residual Add; none is left, and no Add: each
    // folds into a convolution with its ReLU. The 3 that take a downsampling 1×1
    // convolution's output fold into that one (made after the block's last 3×3 one, its
    // drain adds that one's output); the other 5 into the block's last 3×3 convolution, whose
    // 5HD kernel adds the block's input in its drain.
    assert_eq!(count("Relu"), 0);
    assert_eq!(count("Add"), 0);
    let fused = |op: &str| {
        g.nodes
            .iter()
            .filter(|n| n.op == op && n.string(FUSED_ACTIVATION) == Some("Relu"))
            .count()
    };
    assert_eq!(fused("Conv"), 17);
    let residuals = g
        .nodes
        .iter()
        .filter(|n| n.op == "Conv" && n.attr(FUSED_RESIDUAL).is_some())
        .count();
    assert_eq!(residuals, 8);
    let names: Vec<&str> = c.emitted.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(names.iter().any(|n| n.ends_with("_relu")), "{names:?}");
    // Timing: the fused network is faster (fewer launches, one pass less over each tensor).
    let time = |opts: &CompileOptions| run_image_net_timing_only(&cfg, &onnx, opts, 1).execute_ps;
    let mut off = opts.clone();
    off.fusion = FusionSwitches::all_off();
    assert!(time(&opts) < time(&off));
}

#[test]
fn fusion_switch_files_are_checked() {
    let ok = atc::fusion_switches(
        r#"{"Switch": {"GraphFusion": {"ALL": "off"}, "UBFusion": {"ElemwiseActivationFusionPass": "on"}}}"#,
        "f.json",
    )
    .unwrap();
    let mut want = FusionSwitches::all_off();
    want.set(gearsim_compiler::fusion::Pass::ElemwiseActivation, true);
    assert_eq!(ok, want);
    let e = atc::fusion_switches(
        r#"{"Switch": {"UBFusion": {"NoSuchPass": "off"}}}"#,
        "f.json",
    )
    .unwrap_err();
    assert!(
        e.contains("f.json") && e.contains("unknown fusion pass `NoSuchPass`"),
        "{e}"
    );
    let e = atc::fusion_switches("{\"Switch\": ", "f.json").unwrap_err();
    assert!(
        e.contains("f.json:1:") && e.contains("not valid JSON"),
        "{e}"
    );
    let e = atc::fusion_switches(r#"{"Switch": {"UBFusion": {"ALL": "maybe"}}}"#, "f.json")
        .unwrap_err();
    assert!(e.contains("expected \"on\" or \"off\""), "{e}");
}

/// ResNet-50's residual Adds fold into the pointwise convolutions that end its bottlenecks
/// (the drain reads the shortcut), the ReLU after them too; the outputs are bit-identical to
/// the compile without the residual pass (the drain adds in f16 as the Add kernel does).
#[test]
fn resnet50_residual_adds_fold_into_their_pointwise_convolutions() {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let onnx = Net::ResNet50.onnx(1, DType::F16, 5);
    let mut on = cnn_options(&cfg, FusionSwitches::all_on(), PrecisionMode::default());
    on.gear = GearOptions::default();
    let mut off = on.clone();
    off.fusion.set(Pass::ConvResidualAdd, false);
    let run = |opts: &CompileOptions| {
        let c = compile(&onnx, "resnet50.onnx", opts).unwrap();
        let residuals = c
            .after
            .graph
            .nodes
            .iter()
            .filter(|n| n.attr(FUSED_RESIDUAL).is_some())
            .count();
        let adds = c.after.graph.nodes.iter().filter(|n| n.op == "Add").count();
        let mut rt = Runtime::new(cfg.clone(), NullSink, RuntimeOptions::default()).unwrap();
        let m = rt.load(&c.om_bytes().unwrap()).unwrap();
        let bytes = (0..3 * 224 * 224)
            .flat_map(|i| half::f16::from_f32((i % 251) as f32 / 125.0 - 1.0).to_le_bytes())
            .collect();
        let x = Tensor::new(DataType::F16, vec![1, 3, 224, 224], bytes).unwrap();
        let r = rt.run(m, &[x]).unwrap();
        (r.outputs, r.execute_ps, residuals, adds)
    };
    let (fused, fused_ps, residuals, adds) = run(&on);
    let (plain, plain_ps, none, plain_adds) = run(&off);
    assert_eq!((residuals, adds), (16, 0));
    assert_eq!((none, plain_adds), (0, 16));
    assert!(
        fused_ps < plain_ps,
        "fused {fused_ps} ps, unfused {plain_ps} ps"
    );
    for (a, b) in fused.iter().zip(&plain) {
        assert_eq!(a.dims, b.dims);
        assert!(a.data == b.data, "fused and unfused outputs differ");
    }
}

/// The transformer test model (linear layers are MatMul + a constant bias Add) at sequence 16,
/// compiled for `chip` with `fusion`: outputs, kernels launched and the branch's fused biases.
fn run_transformer(chip: &str, fusion: FusionSwitches) -> (Vec<Tensor>, usize, usize) {
    let cfg = ChipConfig::preset(chip).unwrap();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models/transformer.onnx");
    let bytes = std::fs::read(path).unwrap();
    let gear = GearOptions {
        input_shape: Some("x:1,-1,64".into()),
        dynamic_dims: Some("16;32".into()),
        ..GearOptions::default()
    };
    let opts = fp16_options(&cfg, gear, fusion);
    let c = compile(&bytes, "transformer.onnx", &opts).unwrap();
    let biases: Vec<_> = c.after.subgraphs[0]
        .nodes
        .iter()
        .filter(|n| n.attr(FUSED_BIAS).is_some())
        .collect();
    for n in &biases {
        // The fused node keeps the MatMul's name and lists the Add it absorbed.
        assert_eq!(n.op, "MatMul");
        let Some(gearsim_compiler::ir::Attr::Strs(absorbed)) =
            n.attr(gearsim_compiler::fusion::FUSED_NODES)
        else {
            panic!("{}: no {}", n.name, gearsim_compiler::fusion::FUSED_NODES);
        };
        assert!(absorbed.iter().any(|a| a.contains("/Add")), "{absorbed:?}");
        assert_eq!(n.inputs.len(), 3);
    }
    let x: Vec<u8> = (0..16 * 64)
        .flat_map(|i| (((i * 7919) % 203) as f32 / 100.0 - 1.0).to_le_bytes())
        .collect();
    let x = Tensor::new(DataType::F32, vec![1, 16, 64], x).unwrap();
    let (outputs, kernels) = run_profiled(cfg, &c.om_bytes().unwrap(), &[x]);
    (outputs, kernels, biases.len())
}

#[test]
fn matmul_biases_add_in_the_accumulator_with_one_rounding() {
    for chip in ["ascend910", "ascend910b2"] {
        let (fused, fused_kernels, biases) = run_transformer(chip, FusionSwitches::all_on());
        let mut off = FusionSwitches::all_on();
        off.set(Pass::MatMulBiasAdd, false);
        let (plain, plain_kernels, none) = run_transformer(chip, off);
        assert_eq!(none, 0);
        assert!(biases >= 4, "{chip}: {biases} fused biases");
        // Each fused bias saves its Add kernel.
        assert_eq!(fused_kernels + biases, plain_kernels, "{chip}");
        // One rounding instead of two: the outputs differ by f16 rounding at most.
        for (a, b) in fused.iter().zip(&plain) {
            assert_eq!(a.dims, b.dims);
            let (x, y) = (a.to_f64s(), b.to_f64s());
            let scale = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                assert!(
                    (p - q).abs() <= 2e-2 * scale,
                    "{chip}: element {i}: fused {p}, unfused {q} (max |y| {scale})"
                );
            }
        }
    }
}

/// `0.5 · x · (1 + erf(x / √2))` over an f32 `[8, 256]` input, as an opset-17 export writes
/// GELU, compiled with `force_fp16` for ascend910 with `fusion`; run on `x`.
fn run_gelu(fusion: FusionSwitches, x: &[f32]) -> (Vec<f32>, usize) {
    use super::onnx_build::{f32_init, model, node};
    use prost::Message;
    let nodes = vec![
        node("Div", "/act/Div", &["x", "sqrt2"], &["d"]),
        node("Erf", "/act/Erf", &["d"], &["e"]),
        node("Add", "/act/Add", &["e", "one"], &["a"]),
        node("Mul", "/act/Mul", &["x", "a"], &["m"]),
        node("Mul", "/act/Mul_1", &["m", "half"], &["y"]),
    ];
    let inits = vec![
        f32_init("sqrt2", &[], &[std::f32::consts::SQRT_2]),
        f32_init("one", &[], &[1.0]),
        f32_init("half", &[], &[0.5]),
    ];
    let dims = [Some(8), Some(256)];
    let bytes = model(17, nodes, &[("x", &dims)], &[("y", &dims)], inits).encode_to_vec();
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let opts = fp16_options(&cfg, GearOptions::default(), fusion);
    let c = compile(&bytes, "gelu.onnx", &opts).unwrap();
    let x = Tensor::new(
        DataType::F32,
        vec![8, 256],
        x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
    .unwrap();
    let (outputs, kernels) = run_profiled(cfg, &c.om_bytes().unwrap(), &[x]);
    let y = outputs[0].to_f64s().iter().map(|v| *v as f32).collect();
    (y, kernels)
}

#[test]
fn an_exported_gelu_runs_as_one_kernel_within_fp16_of_the_erf_formula() {
    let x: Vec<f32> = (0..8 * 256).map(|i| (i as f32 - 1024.0) / 200.0).collect();
    let (fused, fused_kernels) = run_gelu(FusionSwitches::all_on(), &x);
    let mut off = FusionSwitches::all_on();
    off.set(Pass::Gelu, false);
    let (plain, plain_kernels) = run_gelu(off, &x);
    // Five element-wise kernels become one (the input and output casts stay).
    assert_eq!(fused_kernels + 4, plain_kernels);
    for (i, ((f, p), x)) in fused.iter().zip(&plain).zip(&x).enumerate() {
        let want = 0.5 * f64::from(*x) * (1.0 + erf(f64::from(*x) / std::f64::consts::SQRT_2));
        for (what, got) in [("fused", f), ("unfused", p)] {
            let err = (f64::from(*got) - want).abs();
            assert!(
                err <= 1e-3 + 1e-2 * want.abs(),
                "{what} element {i}: gelu({x}) = {got}, expected {want}"
            );
        }
    }
}

/// erf by its Taylor series near 0 and its continued fraction beyond (double precision is
/// far more than the test needs).
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let v = if a < 2.5 {
        let (mut term, mut sum, mut k) = (a, a, 0.0f64);
        while term.abs() > 1e-17 {
            k += 1.0;
            term *= -a * a / k;
            sum += term / (2.0 * k + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(a) = exp(-a²)/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + ...))))
        let mut f = 0.0f64;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (a + f);
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f)
    };
    v.copysign(x)
}

/// The initializer `name` of an ONNX model: its raw bytes.
fn initializer(onnx: &[u8], name: &str) -> Vec<u8> {
    use prost::Message as _;
    let m = gearsim_compiler::onnx::proto::ModelProto::decode(onnx).unwrap();
    let g = m.graph.unwrap();
    let t = g.initializer.into_iter().find(|t| t.name == name).unwrap();
    t.raw_data.unwrap()
}

/// A quantised linear layer as exported (MatMulInteger, Cast to fp16, Mul by per-channel
/// scales) becomes one MatMulInteger whose drain converts and scales the i32 accumulators:
/// one kernel instead of three, and each output the f32 product of the exact accumulator and
/// its scale rounded once to fp16, on the coupled 910 and on the 910B (a MIX kernel).
#[test]
fn a_quantised_linear_layer_dequantises_in_its_matmul_drain() {
    let (m, n, k) = (40usize, 48usize, 96usize);
    let net = Net::QuantGemm {
        m: m as u32,
        n: n as u32,
        k: k as u32,
    };
    let onnx = net.onnx(1, DType::F16, 7);
    let w: Vec<i64> = initializer(&onnx, "w")
        .iter()
        .map(|b| i64::from(*b as i8))
        .collect();
    let scale: Vec<f32> = initializer(&onnx, "scale")
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    let a: Vec<i8> = (0..m * k).map(|i| ((i * 37 + 11) % 255) as i8).collect();
    let input = Tensor::new(
        DataType::I8,
        vec![m as i64, k as i64],
        a.iter().map(|v| *v as u8).collect(),
    )
    .unwrap();
    let want: Vec<u16> = (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            let acc: i64 = (0..k)
                .map(|kk| i64::from(a[i * k + kk]) * w[kk * n + j])
                .sum();
            half::f16::from_f32(acc as f32 * scale[j]).to_bits()
        })
        .collect();
    for preset in ["ascend910", "ascend910b2"] {
        let cfg = ChipConfig::preset(preset).unwrap();
        let run = |fusion: FusionSwitches| {
            let opts = fp16_options(&cfg, GearOptions::default(), fusion);
            let c = compile(&onnx, "qgemm.onnx", &opts).unwrap();
            let fused = c
                .after
                .graph
                .nodes
                .iter()
                .filter(|n| n.attr(FUSED_DEQUANT).is_some())
                .count();
            let (out, kernels) = run_profiled(
                cfg.clone(),
                &c.om_bytes().unwrap(),
                std::slice::from_ref(&input),
            );
            (out, kernels, fused)
        };
        let (out, kernels, fused) = run(FusionSwitches::all_on());
        assert_eq!((kernels, fused), (1, 1), "{preset}");
        let got: Vec<u16> = out[0]
            .data
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(got, want, "{preset}: fused dequantisation");
        let mut off = FusionSwitches::all_on();
        off.set(Pass::MatMulDequant, false);
        let (plain, plain_kernels, plain_fused) = run(off);
        assert_eq!(plain_fused, 0);
        assert!(
            plain_kernels >= 3,
            "{preset}: {plain_kernels} kernels unfused"
        );
        // Unfused, the Cast rounds each accumulator to fp16 first (the largest overflow to
        // infinity, as ONNX's Cast says) and the Mul rounds again: what the exported graph
        // means, and why the fused drain computes in f32 instead.
        let unfused: Vec<u16> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                let acc: i64 = (0..k)
                    .map(|kk| i64::from(a[i * k + kk]) * w[kk * n + j])
                    .sum();
                let h = half::f16::from_f32(acc as f32).to_f32();
                half::f16::from_f32(h * scale[j]).to_bits()
            })
            .collect();
        let got: Vec<u16> = plain[0]
            .data
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(got, unfused, "{preset}: unfused");
        assert!(
            unfused
                .iter()
                .any(|b| half::f16::from_bits(*b).is_infinite()),
            "the unfused graph overflows fp16 somewhere"
        );
    }
}
