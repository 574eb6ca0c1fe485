//! The test models of the front issue, compiled for their gears and run branch by branch on the
//! simulated device: each gear's outputs must match the reference evaluator run on the imported
//! graph (before any gear pass), so a wrong lowering, memory plan, label layout or gear table
//! shows as a numeric difference.
//!
//! Tolerances: convolutions and matrix products multiply f32 tensors as f16 on the cube (f32
//! accumulation), so an element may be off by about 1e-2 of the output's magnitude after a few
//! layers; the bound is `rtol * |want| + atol_scale * max |want|` per output.

use std::collections::BTreeMap;
use std::path::Path;

use gearsim_compiler::eval::eval_model;
use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, Compiled, compile};
use gearsim_firmware::{Device, DevicePtr};
use gearsim_host::atc;
use gearsim_host::runtime::LoadedModel;
use gearsim_isa::om::OmFile;
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

use super::device_run::{assert_close, f32s, rand_f32};

fn cfg() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

fn compiled(model: &str, gear: GearOptions) -> Compiled {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/models")
        .join(model);
    let bytes = std::fs::read(path).unwrap();
    let opts = CompileOptions {
        gear,
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: gearsim_compiler::precision::PrecisionMode::MustKeepOriginDtype,
        target: atc::target(&cfg()),
    };
    compile(&bytes, model, &opts).unwrap_or_else(|e| panic!("{model}: {e}"))
}

fn read(dev: &mut Device<NullSink>, p: DevicePtr, bytes: usize) -> Vec<u8> {
    let mut b = vec![0u8; bytes];
    dev.read(p, &mut b).unwrap();
    b
}

/// Runs every gear of `c` (one f32 input named `input`, shaped by `dims_of(gear)`) in non-sink
/// mode and compares each output with the evaluator's.
fn every_gear_matches(
    c: &Compiled,
    input: &str,
    dims_of: &dyn Fn(&[i64]) -> Vec<i64>,
    tol: (f64, f64),
) {
    every_gear_matches_typed(c, input, dims_of, tol, DataType::F32);
}

/// [`every_gear_matches`] for a model whose input and outputs are `dtype` (f32 or f16).
fn every_gear_matches_typed(
    c: &Compiled,
    input: &str,
    dims_of: &dyn Fn(&[i64]) -> Vec<i64>,
    tol: (f64, f64),
    dtype: DataType,
) {
    let om = c.om_bytes().unwrap();
    let file = OmFile::parse(&om).unwrap();
    let mut dev = Device::new(cfg(), NullSink);
    let m = LoadedModel::load(&mut dev, &file).unwrap();
    let stream = dev.create_stream().unwrap();
    let d = c.desc.dynamic.as_ref().expect("a gear model");
    let data_index = c.desc.inputs.iter().position(|i| i.name == input).unwrap();
    let shape_index = c.desc.inputs.len() - 1;
    for (gear, vector) in d.gears.iter().enumerate() {
        let dims = dims_of(vector);
        let mut x = rand_f32(&dims, -1.0, 1.0, 7 + gear as u64);
        if dtype == DataType::F16 {
            let bytes = f32s(&x)
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
                .collect();
            x = Tensor::new(DataType::F16, dims.clone(), bytes).unwrap();
        }
        dev.write(m.inputs[data_index], &x.data).unwrap();
        let v: Vec<u8> = vector
            .iter()
            .flat_map(|g| (*g as i32).to_le_bytes())
            .collect();
        dev.write(m.inputs[shape_index], &v).unwrap();
        m.execute(&mut dev, stream).unwrap();
        assert_eq!(
            m.selected_branch(&mut dev).unwrap(),
            Some(gear as i32),
            "gear {vector:?}"
        );
        let feeds = BTreeMap::from([(input.to_string(), x)]);
        let want = eval_model(&c.before, &feeds).unwrap();
        assert_eq!(want.len(), c.desc.outputs.len());
        for (o, w) in want.iter().enumerate() {
            assert_eq!(w.dtype, dtype);
            assert_eq!(
                w.dims, d.output_dims[gear][o],
                "output {o} dims at gear {vector:?}"
            );
            let bytes = read(&mut dev, m.outputs[o], w.data.len());
            let got = Tensor::new(dtype, w.dims.clone(), bytes).unwrap();
            let want = w.to_f64s();
            let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
            assert!(
                scale > 1e-3,
                "output {o} at gear {vector:?} is all but zero"
            );
            assert_close(
                &f32s(&got),
                &want,
                tol.0,
                tol.1 * scale,
                &format!("output {o} at gear {vector:?}"),
            );
        }
    }
}

#[test]
fn cnn_matches_the_reference_at_every_batch_gear() {
    let c = compiled(
        "cnn.onnx",
        GearOptions {
            input_shape: Some("input:-1,3,32,32".into()),
            dynamic_batch_size: Some("1,2,4".into()),
            ..GearOptions::default()
        },
    );
    every_gear_matches(&c, "input", &|g| vec![g[0], 3, 32, 32], (2e-2, 2e-2));
}

#[test]
fn transformer_matches_the_reference_at_every_sequence_gear() {
    let c = compiled(
        "transformer.onnx",
        GearOptions {
            input_shape: Some("x:1,-1,64".into()),
            dynamic_dims: Some("16;32;64;128".into()),
            ..GearOptions::default()
        },
    );
    every_gear_matches(&c, "x", &|g| vec![1, g[0], 64], (2e-2, 2e-2));
}

/// An f16 initializer of uniform values in `[-scale, scale]` (seeded).
fn f16_init(
    name: &str,
    dims: &[i64],
    scale: f32,
    seed: u64,
) -> gearsim_compiler::onnx::proto::TensorProto {
    let n: i64 = dims.iter().product();
    let t = rand_f32(&[n], -scale, scale, seed);
    gearsim_compiler::onnx::proto::TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 10,
        raw_data: Some(
            f32s(&t)
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
                .collect(),
        ),
        ..Default::default()
    }
}

/// An integer-list attribute.
fn ints(name: &str, v: &[i64]) -> gearsim_compiler::onnx::proto::AttributeProto {
    gearsim_compiler::onnx::proto::AttributeProto {
        name: name.into(),
        ints: v.to_vec(),
        r#type: gearsim_compiler::onnx::proto::AttributeType::Ints as i32,
        ..Default::default()
    }
}

/// An f16 chain of convolutions at a dynamic batch of 1 or 3: conv → relu → conv → (+ the
/// residual) → relu → conv, or without the middle conv (`middle` false).
fn f16_conv_chain(middle: bool) -> Compiled {
    use super::onnx_build::node;
    let mut net = NetBuilder::new(0.3);
    let mut nodes = vec![
        net.conv("conv1", "x", "c1", 16, 32, 3, 1),
        node("Relu", "relu1", &["c1"], &["r1"]),
    ];
    if middle {
        nodes.extend([
            net.conv("conv2", "r1", "c2", 32, 32, 3, 1),
            node("Add", "residual", &["c2", "r1"], &["a2"]),
            node("Relu", "relu2", &["a2"], &["r2"]),
            net.conv_unbiased("conv3", "r2", "y", 32, 16, 3),
        ]);
    } else {
        nodes.push(net.conv_unbiased("conv3", "r1", "y", 32, 16, 3));
    }
    let dims = [None, Some(16), Some(12), Some(20)];
    let m = net.model(nodes, &dims, &dims);
    compile(&m, "chain.onnx", &fractal_options("x:-1,16,12,20", "1,3"))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Kernel names of a compiled model that run the fractal conv, and TransData kernels.
fn fractal_kernels(c: &Compiled) -> (usize, usize, Vec<String>) {
    let names: Vec<String> = c.emitted.kernels.iter().map(|k| k.name.clone()).collect();
    let fractal = names.iter().filter(|n| n.contains("5hd")).count();
    let transdata = names.iter().filter(|n| n.starts_with("TransData")).count();
    (fractal, transdata, names)
}

/// The layout pass keeps the middle values of a three-conv chain in NC1HWC0: the middle conv
/// runs the fractal kernel on both sides, and every gear still matches the evaluator.
#[test]
fn f16_conv_chain_runs_in_the_fractal_format_at_every_gear() {
    let c = f16_conv_chain(true);
    // Per branch: conv1 converts its input, conv2 runs 5HD on both sides, conv3 converts its
    // output (identical kernels are stored once).
    let (fractal, transdata, names) = fractal_kernels(&c);
    assert!(fractal >= 3, "fractal conv kernels: {names:?}");
    assert!(transdata >= 2, "TransData kernels: {names:?}");
    every_gear_matches_typed(
        &c,
        "x",
        &|g| vec![g[0], 16, 12, 20],
        (2e-2, 2e-2),
        DataType::F16,
    );
}

/// With two convs every region would only move a conversion, so the pass keeps NCHW.
#[test]
fn f16_two_conv_chain_stays_nchw() {
    let c = f16_conv_chain(false);
    let (fractal, transdata, names) = fractal_kernels(&c);
    assert_eq!((fractal, transdata), (0, 0), "{names:?}");
    every_gear_matches_typed(
        &c,
        "x",
        &|g| vec![g[0], 16, 12, 20],
        (2e-2, 2e-2),
        DataType::F16,
    );
}

/// Builds f16 networks for the fractal-format tests: Conv nodes with seeded f16 weights (and
/// biases) uniform in ±`scale`, the model around a node list.
struct NetBuilder {
    initializer: Vec<gearsim_compiler::onnx::proto::TensorProto>,
    seed: u64,
    scale: f32,
}

impl NetBuilder {
    fn new(scale: f32) -> NetBuilder {
        NetBuilder {
            initializer: Vec::new(),
            seed: 10,
            scale,
        }
    }

    /// A `k`×`k` convolution from `c` to `m` channels with a bias, padded to keep the size at
    /// stride 1.
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        name: &str,
        x: &str,
        out: &str,
        c: i64,
        m: i64,
        k: i64,
        stride: i64,
    ) -> gearsim_compiler::onnx::proto::NodeProto {
        let b = format!("{name}.b");
        self.initializer
            .push(f16_init(&b, &[m], self.scale, self.seed + 1));
        self.conv_with(name, &[x, &b], out, c, m, k, stride)
    }

    /// [`NetBuilder::conv`] at stride 1 without a bias.
    fn conv_unbiased(
        &mut self,
        name: &str,
        x: &str,
        out: &str,
        c: i64,
        m: i64,
        k: i64,
    ) -> gearsim_compiler::onnx::proto::NodeProto {
        self.conv_with(name, &[x], out, c, m, k, 1)
    }

    /// The Conv node reading `ins[0]`, its weights and `ins[1..]` (a bias).
    #[allow(clippy::too_many_arguments)]
    fn conv_with(
        &mut self,
        name: &str,
        ins: &[&str],
        out: &str,
        c: i64,
        m: i64,
        k: i64,
        stride: i64,
    ) -> gearsim_compiler::onnx::proto::NodeProto {
        let w = format!("{name}.w");
        self.initializer
            .push(f16_init(&w, &[m, c, k, k], self.scale, self.seed));
        self.seed += 2;
        let mut inputs = vec![ins[0], w.as_str()];
        inputs.extend(&ins[1..]);
        let mut n = super::onnx_build::node("Conv", name, &inputs, &[out]);
        let p = k / 2;
        n.attribute = vec![
            ints("kernel_shape", &[k, k]),
            ints("pads", &[p, p, p, p]),
            ints("strides", &[stride, stride]),
        ];
        n
    }

    /// A `k`×`k` convolution from `c` to `m` channels in `group` groups with a bias, padded
    /// to keep the size.
    fn grouped_conv(
        &mut self,
        name: &str,
        x: &str,
        out: &str,
        (c, m, group): (i64, i64, i64),
        k: i64,
    ) -> gearsim_compiler::onnx::proto::NodeProto {
        let (w, b) = (format!("{name}.w"), format!("{name}.b"));
        self.initializer
            .push(f16_init(&w, &[m, c / group, k, k], self.scale, self.seed));
        self.initializer
            .push(f16_init(&b, &[m], self.scale, self.seed + 1));
        self.seed += 2;
        let mut n = super::onnx_build::node("Conv", name, &[x, w.as_str(), b.as_str()], &[out]);
        let p = k / 2;
        n.attribute = vec![
            ints("kernel_shape", &[k, k]),
            ints("pads", &[p, p, p, p]),
            gearsim_compiler::onnx::proto::AttributeProto {
                name: "group".into(),
                i: group,
                r#type: gearsim_compiler::onnx::proto::AttributeType::Int as i32,
                ..Default::default()
            },
        ];
        n
    }

    /// A 3×3 stride-2 MaxPool padded by one.
    fn pool(name: &str, x: &str, out: &str) -> gearsim_compiler::onnx::proto::NodeProto {
        let mut pool = super::onnx_build::node("MaxPool", name, &[x], &[out]);
        pool.attribute = vec![
            ints("kernel_shape", &[3, 3]),
            ints("pads", &[1, 1, 1, 1]),
            ints("strides", &[2, 2]),
        ];
        pool
    }

    /// The model: f16 input `x` and output `y` of these dims (`None`: dynamic).
    fn model(
        self,
        nodes: Vec<gearsim_compiler::onnx::proto::NodeProto>,
        x: &[Option<i64>],
        y: &[Option<i64>],
    ) -> Vec<u8> {
        use gearsim_compiler::onnx::proto::{
            GraphProto, ModelProto, OperatorSetIdProto, ValueInfoProto,
        };
        use prost::Message;
        let io = |name: &str, dims: &[Option<i64>]| ValueInfoProto {
            name: name.into(),
            r#type: Some(super::onnx_build::tensor_type(10, dims)),
            doc_string: String::new(),
        };
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 13,
            }],
            graph: Some(GraphProto {
                name: "fractal_net".into(),
                node: nodes,
                initializer: self.initializer,
                input: vec![io("x", x)],
                output: vec![io("y", y)],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }
}

/// Compile options for the fractal-format tests: `x` at a dynamic batch of `batches`, kept in
/// f16.
fn fractal_options(shape: &str, batches: &str) -> CompileOptions {
    CompileOptions {
        gear: GearOptions {
            input_shape: Some(shape.into()),
            dynamic_batch_size: Some(batches.into()),
            ..GearOptions::default()
        },
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: gearsim_compiler::precision::PrecisionMode::MustKeepOriginDtype,
        target: atc::target(&cfg()),
    }
}

/// A MaxPool after a fractal convolution reads NC1HWC0 (`pool_5hd`): at batch 1 the four
/// planes (64 channels) are split into bands to fill the cores, at batch 5 the planes
/// outnumber the cores and blocks loop over whole planes; odd sizes put the window over the
/// padding on every side. Followed by another fractal convolution the pool writes NC1HWC0;
/// followed by one the fractal kernel does not run (8 output channels, not a whole channel
/// block) it converts its output. Every gear matches the evaluator.
#[test]
fn max_pool_after_a_fractal_convolution_reads_the_fractal_format() {
    use super::onnx_build::node;
    for (next, k, width, converts) in [("3x3", 3, 16, false), ("8-channel 1x1", 1, 8, true)] {
        let mut net = NetBuilder::new(0.2);
        let nodes = vec![
            net.conv("c0", "x", "a0", 16, 16, 3, 1),
            net.conv("c1", "a0", "a", 16, 64, 3, 1),
            NetBuilder::pool("pool", "a", "p"),
            net.conv("c2", "p", "b", 64, width, k, 1),
            net.conv("c3", "b", "d", width, 16, 3, 1),
            node("Relu", "r", &["d"], &["y"]),
        ];
        let m = net.model(
            nodes,
            &[None, Some(16), Some(13), Some(17)],
            &[None, Some(16), Some(7), Some(9)],
        );
        let c = compile(
            &m,
            "pool_net.onnx",
            &fractal_options("x:-1,16,13,17", "1,5"),
        )
        .unwrap_or_else(|e| panic!("{next}: {e}"));
        let (_, _, names) = fractal_kernels(&c);
        let pools: Vec<&String> = names.iter().filter(|n| n.starts_with("MaxPool")).collect();
        assert!(
            pools.len() == 2 && pools.iter().all(|n| n.contains("5hd")),
            "{next}: the pools read the fractal format: {names:?}"
        );
        // The pool's output (4 channel blocks of 7x9 pixels) leaves NC1HWC0 for the NCHW conv.
        let pool_out = names
            .iter()
            .any(|n| n.starts_with("TransData") && n.contains("x4x16x63"));
        assert_eq!(pool_out, converts, "{next}: {names:?}");
        every_gear_matches_typed(
            &c,
            "x",
            &|g| vec![g[0], 16, 13, 17],
            (2e-2, 2e-2),
            DataType::F16,
        );
    }
}

/// A ResNet-shaped f16 network at a dynamic batch of 1 or 2: a stem conv, a MaxPool, a basic
/// block, a downsampling block whose 1×1 stride-2 shortcut absorbs the block's Add, and a
/// GlobalAveragePool. The layout pass keeps everything from the stem's output to the
/// GlobalAveragePool in NC1HWC0 (the pool reading and writing it), and every gear matches the
/// evaluator.
#[test]
fn resnet_shaped_body_runs_in_the_fractal_format_from_the_stem_to_the_global_pool() {
    use super::onnx_build::node;
    let mut net = NetBuilder::new(0.2);
    let nodes = vec![
        net.conv("stem", "x", "s0", 16, 16, 3, 1),
        node("Relu", "stem_relu", &["s0"], &["s"]),
        NetBuilder::pool("pool", "s", "p"),
        net.conv("b1c1", "p", "b1a", 16, 16, 3, 1),
        node("Relu", "b1r1", &["b1a"], &["b1b"]),
        net.conv("b1c2", "b1b", "b1c", 16, 16, 3, 1),
        node("Add", "b1add", &["b1c", "p"], &["b1d"]),
        node("Relu", "b1r2", &["b1d"], &["b1"]),
        net.conv("b2c1", "b1", "b2a", 16, 32, 3, 2),
        node("Relu", "b2r1", &["b2a"], &["b2b"]),
        net.conv("b2c2", "b2b", "b2c", 32, 32, 3, 1),
        net.conv("b2down", "b1", "b2s", 16, 32, 1, 2),
        node("Add", "b2add", &["b2c", "b2s"], &["b2d"]),
        node("Relu", "b2r2", &["b2d"], &["b2"]),
        node("GlobalAveragePool", "gap", &["b2"], &["y"]),
    ];
    let m = net.model(
        nodes,
        &[None, Some(16), Some(20), Some(24)],
        &[None, Some(32), Some(1), Some(1)],
    );
    let c = compile(
        &m,
        "resnet_shaped.onnx",
        &fractal_options("x:-1,16,20,24", "1,2"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (fractal, _, names) = fractal_kernels(&c);
    // Per branch: every conv after the stem runs 5HD (the shortcut with the block's Add), and
    // the global pool reads 5HD itself: the only conversion is the graph input's, into 5HD
    // (`[N][1][20·24][16]`).
    let nchw_convs = names
        .iter()
        .filter(|n| n.starts_with("Conv") && !n.contains("5hd"))
        .count();
    assert!(fractal >= 5, "fractal conv kernels: {names:?}");
    assert!(nchw_convs == 0, "every conv runs 5HD: {names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("MaxPool") && n.contains("5hd")),
        "the pool reads and writes 5HD: {names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("GlobalAveragePool") && n.contains("5hd"))
            && names
                .iter()
                .filter(|n| n.starts_with("TransData"))
                .all(|n| n.contains("x1x480x16")),
        "the global pool reads 5HD; only the input is converted: {names:?}"
    );
    every_gear_matches_typed(
        &c,
        "x",
        &|g| vec![g[0], 16, 20, 24],
        (2e-2, 2e-2),
        DataType::F16,
    );
}

/// A ResNeXt-shaped block at a dynamic batch of 1 or 2: a 1×1 convolution, a 3×3 one in 16
/// groups of 4 channels (GE packs four groups to a channel block), a 1×1 one whose drain adds
/// the block's input, and a GlobalAveragePool. The grouped convolution runs the fractal
/// kernel like the others, so the only conversion is the graph input's, and every gear matches
/// the evaluator.
#[test]
fn resnext_shaped_block_keeps_its_grouped_convolution_in_the_fractal_format() {
    use super::onnx_build::node;
    let mut net = NetBuilder::new(0.2);
    let nodes = vec![
        net.conv("stem", "x", "s0", 16, 32, 3, 1),
        node("Relu", "stem_relu", &["s0"], &["s"]),
        net.conv("reduce", "s", "a0", 32, 64, 1, 1),
        node("Relu", "reduce_relu", &["a0"], &["a"]),
        net.grouped_conv("grouped", "a", "b0", (64, 64, 16), 3),
        node("Relu", "grouped_relu", &["b0"], &["b"]),
        net.conv("expand", "b", "c", 64, 32, 1, 1),
        node("Add", "add", &["c", "s"], &["d"]),
        node("Relu", "add_relu", &["d"], &["e"]),
        node("GlobalAveragePool", "gap", &["e"], &["y"]),
    ];
    let m = net.model(
        nodes,
        &[None, Some(16), Some(12), Some(14)],
        &[None, Some(32), Some(1), Some(1)],
    );
    let c = compile(
        &m,
        "resnext_shaped.onnx",
        &fractal_options("x:-1,16,12,14", "1,2"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (_, _, names) = fractal_kernels(&c);
    // Per branch four convolutions, the grouped one among them (kernels are named by op and
    // shape).
    assert_eq!(
        names.iter().filter(|n| n.starts_with("Conv")).count(),
        8,
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .filter(|n| n.starts_with("Conv"))
            .all(|n| n.contains("5hd"))
            && names
                .iter()
                .filter(|n| n.starts_with("TransData"))
                .all(|n| n.contains("x1x168x16")),
        "every conv runs 5HD; only the input is converted: {names:?}"
    );
    every_gear_matches_typed(
        &c,
        "x",
        &|g| vec![g[0], 16, 12, 14],
        (2e-2, 2e-2),
        DataType::F16,
    );
}
