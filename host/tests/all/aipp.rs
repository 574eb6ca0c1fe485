//! Static AIPP (`--insert_op_conf`): the kernel against the reference bit for bit, a network
//! behind it against the evaluator, and the configurations GE and gearsim refuse.

use std::collections::BTreeMap;

use gearsim_compiler::aipp;
use gearsim_compiler::eval::eval_model;
use gearsim_compiler::ir::{Attr, DataType, Node, Tensor};
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileError, CompileOptions, compile};
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::device_run::{assert_close, data, f32s, run_op};

fn image(dims: &[i64], seed: u64) -> Tensor {
    let n: i64 = dims.iter().product();
    let mut rng = StdRng::seed_from_u64(seed);
    let bytes: Vec<u8> = (0..n).map(|_| rng.random_range(0..=255u8)).collect();
    Tensor::new(DataType::U8, dims.to_vec(), bytes).unwrap()
}

/// An `Aipp` node's attributes.
fn attrs(
    format: &str,
    crop: [i64; 4],
    swap: bool,
    csc: Option<[i64; 15]>,
    norm: (&[f32], &[f32], &[f32]),
) -> Vec<(&'static str, Attr)> {
    let mut a = vec![
        ("input_format", Attr::Str(format.into())),
        ("crop", Attr::Ints(crop.to_vec())),
        ("swap", Attr::Int(i64::from(swap))),
        ("mean", Attr::Floats(norm.0.to_vec())),
        ("min", Attr::Floats(norm.1.to_vec())),
        ("var_reci", Attr::Floats(norm.2.to_vec())),
    ];
    if let Some(c) = csc {
        a.push(("csc", Attr::Ints(c.to_vec())));
    }
    a
}

/// BT.601 wide-range YUV to RGB with GE's bias convention.
const YUV2RGB: [i64; 15] = [
    256, 0, 359, 256, -88, -183, 256, 454, 0, 0, 128, 128, 0, 0, 0,
];
/// RGB to BT.601 YUV (output biases on U and V).
const RGB2YUV: [i64; 15] = [
    77, 150, 29, -43, -85, 128, 128, -107, -21, 0, 0, 0, 0, 128, 128,
];

/// A kernel case: what it checks, the image's dims, the node's attributes.
type Case = (&'static str, Vec<i64>, Vec<(&'static str, Attr)>);

#[test]
fn the_kernel_matches_the_reference_bit_for_bit() {
    let imagenet = (
        &[0.0, 0.0, 0.0][..],
        &[123.675, 116.28, 103.53][..],
        &[0.017_124_754, 0.017_507_003, 0.017_429_194][..],
    );
    let cases: Vec<Case> = vec![
        // Crop, swap and ImageNet normalisation from an odd-sized image, two images.
        (
            "rgb",
            vec![2, 21, 19, 3],
            attrs("RGB888_U8", [2, 3, 17, 13], true, None, imagenet),
        ),
        // XRGB with a YUV -> RGB conversion (the X byte skipped) and a mean.
        (
            "xrgb csc",
            vec![1, 9, 40, 4],
            attrs(
                "XRGB8888_U8",
                [1, 4, 8, 33],
                false,
                Some(YUV2RGB),
                (&[12.0, 0.0, 250.0], &[0.5, 0.0, 0.0], &[1.0, 0.25, 1.0]),
            ),
        ),
        // RGB -> YUV with output biases, swapped first, the whole image.
        (
            "rgb csc",
            vec![1, 16, 16, 3],
            attrs(
                "RGB888_U8",
                [0, 0, 16, 16],
                true,
                Some(RGB2YUV),
                (&[0.0, 0.0, 0.0], &[0.0, 0.0, 0.0], &[1.0, 1.0, 1.0]),
            ),
        ),
        // Grey.
        (
            "yuv400",
            vec![3, 12, 30, 1],
            attrs(
                "YUV400_U8",
                [2, 1, 7, 29],
                false,
                None,
                (&[128.0], &[0.0], &[0.0078125]),
            ),
        ),
    ];
    for (what, dims, a) in cases {
        let x = image(&dims, dims.iter().sum::<i64>() as u64);
        let ran =
            run_op(aipp::OP, &a, vec![data(x.clone())]).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut node = Node::new(aipp::OP, aipp::OP, vec![], vec![]);
        node.attrs = a
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<BTreeMap<_, _>>();
        let want = aipp::evaluate(&node, &x, DataType::F32).unwrap();
        assert_eq!(ran.outputs[0].dims, want.dims, "{what}");
        assert!(
            ran.outputs[0].data == want.data,
            "{what}: the kernel's values differ from the reference"
        );
    }
}

/// The README's example configuration for the demo CNN: a 40x36 image, R and B swapped, a
/// 32x32 crop from (3, 5), ImageNet normalisation.
const CONF: &str = include_str!("../../../tests/models/aipp_cnn.cfg");

fn options(gear: GearOptions, cfg: &ChipConfig) -> CompileOptions {
    CompileOptions {
        gear: GearOptions {
            insert_op_conf: Some("aipp.cfg".into()),
            insert_op_conf_text: Some(CONF.into()),
            ..gear
        },
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: Default::default(),
        target: gearsim_host::atc::target(cfg),
    }
}

/// The demo CNN behind AIPP (fp16, as atc compiles it): the runtime takes the 8-bit image and
/// gives what the evaluator computes on the compiled graph, and the model's input is the image.
#[test]
fn a_network_behind_aipp_runs_on_the_image() {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let gear = GearOptions {
        input_shape: Some("input:2,3,32,32".into()),
        ..GearOptions::default()
    };
    let c = compile(gearsim_host::demo::CNN, "cnn.onnx", &options(gear, &cfg)).unwrap();
    let input = &c.desc.inputs[0];
    // ONNX's code for uint8 is 2.
    assert_eq!(
        (input.dtype, input.dims.as_slice()),
        (2, &[2, 36, 40, 3][..])
    );
    assert_eq!(input.format, "NHWC");
    let x = image(&[2, 36, 40, 3], 7);
    runs_as_evaluated(&cfg, &c, vec![("input", x)], "cnn behind aipp");
}

/// GE's AIPP fusion: the first convolution reads the image through the AIPP unit (its node
/// absorbs the Aipp, whose kernel is gone), 16 channels a pixel, or 4 (C04) with
/// `--enable_small_channel=1`, and gives what the unfused compile gives, on a batch that
/// spreads over every core.
#[test]
fn aipp_fused_into_the_first_convolution_gives_the_unfused_outputs() {
    use gearsim_compiler::fusion::{FUSED_AIPP, FusionSwitches, Pass};
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let gear = |small_channel: bool| GearOptions {
        input_shape: Some("input:3,3,32,32".into()),
        enable_small_channel: small_channel,
        ..GearOptions::default()
    };
    let mut off = options(gear(false), &cfg);
    off.fusion = FusionSwitches::all_on();
    off.fusion.set(Pass::AippConv, false);
    let plain = compile(gearsim_host::demo::CNN, "cnn.onnx", &off).unwrap();
    assert!(plain.after.graph.nodes.iter().any(|n| n.op == aipp::OP));
    let x = image(&[3, 36, 40, 3], 11);
    let run = |c: &gearsim_compiler::pipeline::Compiled| {
        let mut rt = Runtime::new(cfg.clone(), NullSink, RuntimeOptions::default()).unwrap();
        let id = rt.load(&c.om_bytes().unwrap()).unwrap();
        f32s(&rt.run(id, std::slice::from_ref(&x)).unwrap().outputs[0])
    };
    let want: Vec<f64> = run(&plain).iter().map(|v| f64::from(*v)).collect();
    for (small_channel, channels) in [(false, 16), (true, 4)] {
        let fused = compile(
            gearsim_host::demo::CNN,
            "cnn.onnx",
            &options(gear(small_channel), &cfg),
        )
        .unwrap();
        let conv = fused
            .after
            .graph
            .nodes
            .iter()
            .find(|n| n.int(FUSED_AIPP).is_some())
            .expect("a convolution absorbed the Aipp");
        assert_eq!(conv.op, "Conv");
        assert_eq!(conv.int(FUSED_AIPP), Some(channels));
        assert!(fused.after.graph.nodes.iter().all(|n| n.op != aipp::OP));
        let what = format!("fused aipp, {channels} channels a pixel");
        runs_as_evaluated(&cfg, &fused, vec![("input", x.clone())], &what);
        assert_close(&run(&fused), &want, 1e-3, 1e-3, &what);
    }
}

/// Runs compiled model `c` on `feeds` (in input order) and checks its first output against
/// the evaluator on the compiled graph.
fn runs_as_evaluated(
    cfg: &ChipConfig,
    c: &gearsim_compiler::pipeline::Compiled,
    feeds: Vec<(&str, Tensor)>,
    what: &str,
) {
    let mut rt = Runtime::new(cfg.clone(), NullSink, RuntimeOptions::default()).unwrap();
    let id = rt.load(&c.om_bytes().unwrap()).unwrap();
    let inputs: Vec<Tensor> = feeds.iter().map(|(_, t)| t.clone()).collect();
    let got = rt.run(id, &inputs).unwrap();
    let feeds: BTreeMap<String, Tensor> =
        feeds.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
    let want = eval_model(&c.after, &feeds).unwrap();
    assert_close(&f32s(&got.outputs[0]), &want[0].to_f64s(), 1e-3, 1e-3, what);
}

#[test]
fn configurations_gear_modes_and_models_aipp_cannot_take_are_refused() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let err = |gear: GearOptions, conf: &str| {
        let mut o = options(gear, &cfg);
        o.gear.insert_op_conf_text = Some(conf.into());
        match compile(gearsim_host::demo::CNN, "cnn.onnx", &o) {
            Ok(_) => panic!("compiled"),
            Err(e) => e,
        }
    };
    let shape = |s: &str| GearOptions {
        input_shape: Some(s.into()),
        ..GearOptions::default()
    };
    // GE's rule: no AIPP with dynamic dims.
    let e = err(
        GearOptions {
            dynamic_dims: Some("1;2".into()),
            ..shape("input:-1,3,32,32")
        },
        CONF,
    );
    assert!(
        matches!(&e, CompileError::Option(o) if o.code == "E10001"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("The dynamic dims function does not support AIPP."),
        "{e}"
    );
    // gearsim's: not with batch gears either (yet).
    let e = err(
        GearOptions {
            dynamic_batch_size: Some("1,2".into()),
            ..shape("input:-1,3,32,32")
        },
        CONF,
    );
    assert!(matches!(e, CompileError::Unsupported { .. }), "{e}");
    // The crop must be the network's input size.
    let e = err(
        shape("input:1,3,32,32"),
        &CONF.replace("crop: true", "crop: false"),
    );
    assert!(e.to_string().contains("does not resize or pad"), "{e}");
    // One channel for a three-channel input.
    let e = err(
        shape("input:1,3,32,32"),
        &CONF.replace("RGB888_U8", "YUV400_U8"),
    );
    assert!(e.to_string().contains("has 3 channel(s)"), "{e}");
    // A crop that leaves the image.
    let e = err(
        shape("input:1,3,32,32"),
        &CONF.replace("load_start_pos_w: 5", "load_start_pos_w: 9"),
    );
    assert!(
        e.to_string().contains("leaves the 36x40 source image"),
        "{e}"
    );
    // An input the model does not have.
    let e = err(
        shape("input:1,3,32,32"),
        &CONF.replace("aipp_mode: static", "related_input_rank: 1"),
    );
    assert!(
        e.to_string()
            .contains("related_input_rank 1 but the model has 1 input"),
        "{e}"
    );
    // A malformed file names its line.
    let e = err(
        shape("input:1,3,32,32"),
        "aipp_op {\n input_format: RGB888_U8\n crop: maybe\n}",
    );
    assert!(
        e.to_string().contains("aipp.cfg") && e.to_string().contains("line 3"),
        "{e}"
    );
}

/// Two inputs, each behind its own `aipp_op` (written in either order), run on their images.
#[test]
fn each_input_an_aipp_op_names_gets_its_own() {
    use super::onnx_build::{model, node};
    use prost::Message as _;
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let dims = [Some(1), Some(3), Some(4), Some(4)];
    let m = model(
        17,
        vec![node("Add", "add", &["a", "b"], &["y"])],
        &[("a", &dims[..]), ("b", &dims[..])],
        &[("y", &dims[..])],
        vec![],
    )
    .encode_to_vec();
    let first = "aipp_op { related_input_rank: 0 input_format: RGB888_U8 mean_chn_0: 5 }";
    let second = "aipp_op { related_input_rank: 1 input_format: XRGB8888_U8 \
                  src_image_size_w: 6 crop: true load_start_pos_w: 2 }";
    for conf in [format!("{first}\n{second}"), format!("{second}\n{first}")] {
        let mut o = options(GearOptions::default(), &cfg);
        o.gear.insert_op_conf_text = Some(conf.clone());
        let c = compile(&m, "add.onnx", &o).unwrap_or_else(|e| panic!("{conf}: {e}"));
        let ins: Vec<_> = c
            .desc
            .inputs
            .iter()
            .map(|i| (i.dtype, i.dims.clone()))
            .collect();
        assert_eq!(
            ins,
            vec![(2, vec![1, 4, 4, 3]), (2, vec![1, 4, 6, 4])],
            "{conf}"
        );
        let (a, b) = (image(&[1, 4, 4, 3], 1), image(&[1, 4, 6, 4], 2));
        runs_as_evaluated(&cfg, &c, vec![("a", a), ("b", b)], &conf);
    }
    // An NHWC input is refused, not misread.
    let mut o = options(
        GearOptions {
            input_format: Some("NHWC".into()),
            ..GearOptions::default()
        },
        &cfg,
    );
    o.gear.insert_op_conf_text = Some(first.into());
    let Err(e) = compile(&m, "add.onnx", &o) else {
        panic!("NHWC with AIPP compiled");
    };
    assert!(e.to_string().contains("NCHW inputs only"), "{e}");
}
