//! Every convolution layer shape of the common CNN families compiles, at every batch, on every
//! chip and in every layout: a sweep that lowers each shape (without running it) and reports
//! all the ones that fail together.

use gearsim_compiler::ir::{Attr, DataType, Format, Tensor};
use gearsim_host::oprun::{constant, data, lower_op_formats};
use gearsim_sim::ChipConfig;

/// One layer: input channels, output channels, input height and width, kernel, stride,
/// padding, group.
#[derive(Debug, Clone, Copy)]
struct Layer {
    c: i64,
    m: i64,
    hw: (i64, i64),
    k: i64,
    s: i64,
    p: i64,
    g: i64,
}

const fn l(c: i64, m: i64, h: i64, k: i64, s: i64, p: i64) -> Layer {
    Layer {
        c,
        m,
        hw: (h, h),
        k,
        s,
        p,
        g: 1,
    }
}

const fn dw(c: i64, h: i64, s: i64) -> Layer {
    Layer {
        c,
        m: c,
        hw: (h, h),
        k: 3,
        s,
        p: 1,
        g: c,
    }
}

/// Layers of ResNet-18/50, VGG, MobileNet v1/v2, ResNeXt, YOLO and SSD heads, and a few odd
/// maps (wide strips, primes).
const LAYERS: &[Layer] = &[
    // ResNet stem and stages.
    l(3, 64, 224, 7, 2, 3),
    l(64, 64, 56, 3, 1, 1),
    l(64, 64, 56, 1, 1, 0),
    l(64, 256, 56, 1, 1, 0),
    l(256, 64, 56, 1, 1, 0),
    l(256, 128, 56, 1, 1, 0),
    l(128, 128, 56, 3, 2, 1),
    l(256, 512, 56, 1, 2, 0),
    l(128, 128, 28, 3, 1, 1),
    l(512, 128, 28, 1, 1, 0),
    l(256, 256, 14, 3, 1, 1),
    l(1024, 256, 14, 1, 1, 0),
    l(512, 1024, 28, 1, 2, 0),
    l(512, 512, 7, 3, 1, 1),
    l(256, 512, 14, 3, 2, 1),
    l(2048, 512, 7, 1, 1, 0),
    l(512, 2048, 7, 1, 1, 0),
    // ResNet-50's stride-2 downsampling on the 1x1 map of a 16x16 input (a stride past the
    // padded input: one window).
    l(1024, 2048, 1, 1, 2, 0),
    // VGG.
    l(3, 64, 224, 3, 1, 1),
    l(64, 128, 112, 3, 1, 1),
    l(512, 512, 14, 3, 1, 1),
    // MobileNet: stem, depthwise, pointwise.
    l(3, 32, 224, 3, 2, 1),
    dw(32, 112, 1),
    dw(96, 112, 2),
    dw(144, 56, 1),
    dw(384, 14, 1),
    dw(960, 7, 1),
    l(32, 16, 112, 1, 1, 0),
    l(960, 320, 7, 1, 1, 0),
    // ResNeXt grouped 3x3.
    Layer {
        g: 32,
        ..l(128, 128, 56, 3, 1, 1)
    },
    Layer {
        g: 32,
        ..l(256, 256, 28, 3, 1, 1)
    },
    Layer {
        g: 32,
        ..l(512, 512, 14, 3, 1, 1)
    },
    Layer {
        g: 32,
        ..l(1024, 1024, 14, 3, 2, 1)
    },
    // YOLO / SSD heads and odd maps.
    l(1024, 255, 13, 1, 1, 0),
    l(256, 255, 52, 1, 1, 0),
    l(512, 1024, 19, 3, 1, 1),
    l(256, 24, 38, 3, 1, 1),
    Layer {
        hw: (13, 300),
        ..l(64, 64, 13, 3, 1, 1)
    },
    Layer {
        hw: (4, 640),
        ..l(256, 256, 4, 3, 1, 1)
    },
    // Maps of more than 65535 pixels: YOLO at a 640×640 input (v8's and v5's stems, the
    // 320×320 maps behind them) and 256×256 / 416×416 inputs.
    l(3, 32, 640, 3, 2, 1),
    l(3, 16, 640, 3, 2, 1),
    l(3, 64, 640, 6, 2, 2),
    l(32, 64, 320, 3, 2, 1),
    l(16, 32, 320, 3, 2, 1),
    l(64, 64, 320, 3, 1, 1),
    l(32, 32, 256, 3, 1, 1),
    l(32, 32, 416, 1, 1, 0),
    Layer {
        hw: (17, 23),
        ..l(48, 80, 17, 5, 1, 2)
    },
];

/// Input elements at most (larger cases are left to the networks that have them).
const MAX_INPUT: i64 = 30 << 20;

fn zeros(dtype: DataType, dims: &[i64]) -> Tensor {
    let n: i64 = dims.iter().product();
    let bytes = vec![0u8; n as usize * dtype.size()];
    Tensor::new(dtype, dims.to_vec(), bytes).unwrap()
}

/// A small deterministic weight pattern (the values do not matter to the lowering, only
/// that they are not all zero).
fn weights(dtype: DataType, dims: &[i64]) -> Tensor {
    let n: i64 = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect();
    super::lower_conv::tensor(dtype, dims, &v)
}

/// Lowers one case; `Err` names it and says why it failed.
fn lower_case(
    cfg: &ChipConfig,
    chip: &str,
    layer: Layer,
    n: i64,
    dtype: DataType,
    format: Format,
) -> Result<(), String> {
    let Layer {
        c,
        m,
        hw,
        k,
        s,
        p,
        g,
    } = layer;
    let x = zeros(dtype, &[n, c, hw.0, hw.1]);
    let w = weights(dtype, &[m, c / g, k, k]);
    let attrs = [
        ("kernel_shape", Attr::Ints(vec![k, k])),
        ("strides", Attr::Ints(vec![s, s])),
        ("dilations", Attr::Ints(vec![1, 1])),
        ("pads", Attr::Ints(vec![p; 4])),
        ("group", Attr::Int(g)),
    ];
    let formats = [format, Format::Nd, format];
    let r = lower_op_formats(
        cfg,
        "Conv",
        &attrs,
        &[Some(data(x)), Some(constant(w))],
        &formats,
        1,
    );
    let name = case_name(chip, layer, n, dtype, format);
    r.map(|_| ()).map_err(|e| format!("{name}: {e}"))
}

/// How a case is named in the sweep's report.
fn case_name(chip: &str, layer: Layer, n: i64, dtype: DataType, format: Format) -> String {
    let Layer {
        c,
        m,
        hw,
        k,
        s,
        p,
        g,
    } = layer;
    format!(
        "{chip} n{n} c{c} {}x{} m{m} k{k} s{s} p{p} g{g} {dtype:?} {format:?}",
        hw.0, hw.1
    )
}

/// Whether the fractal-format kernel takes the layer (the layout pass keeps the others in
/// NCHW, so they run on the NCHW kernels between conversions).
fn fractal_domain(layer: &Layer) -> bool {
    let whole = |c: i64| c % 16 == 0;
    match layer.g {
        1 => (whole(layer.c) || layer.c < 16) && whole(layer.m),
        // Grouped: packed into whole blocks; depthwise runs on the vector unit.
        g => g != layer.c && whole(layer.c) && whole(layer.m),
    }
}

/// Lowers every case of `chips` × `batches` × the layers × `kinds`. Returns the case count,
/// the failures in case order, and the cases `known_failure` expects to fail (by name prefix,
/// with the reason their error must give).
fn sweep(
    chips: &[&str],
    batches: &[i64],
    kinds: &[(DataType, Format)],
) -> (usize, Vec<String>, Vec<(String, &'static str)>) {
    let mut cases = Vec::new();
    for chip in chips {
        for &n in batches {
            for layer in LAYERS {
                for &(dtype, format) in kinds {
                    if n * layer.c * layer.hw.0 * layer.hw.1 > MAX_INPUT {
                        continue;
                    }
                    if format == Format::Nc1hwc0 && !fractal_domain(layer) {
                        continue;
                    }
                    cases.push((*chip, *layer, n, dtype, format));
                }
            }
        }
    }
    let threads = std::thread::available_parallelism().map_or(2, |t| t.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(chip, layer, n, dtype, format)) = cases.get(i) else {
                        break;
                    };
                    let cfg = ChipConfig::preset(chip).unwrap();
                    if let Err(e) = lower_case(&cfg, chip, layer, n, dtype, format) {
                        failures.lock().unwrap().push((i, e));
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    let expected = cases
        .iter()
        .filter_map(|&(chip, layer, n, dtype, format)| {
            known_failure(&layer, dtype, format)
                .map(|why| (case_name(chip, layer, n, dtype, format), why))
        })
        .collect();
    (
        cases.len(),
        failures.into_iter().map(|(_, e)| e).collect(),
        expected,
    )
}

/// The cases known not to compile, as a rule over the case, and what their error must say:
/// a failure the rule does not name, or a case it names that compiles, fails the sweep (so a
/// fix updates the rule).
///
/// The f32 NCHW kernel stages one input row of every channel block in L0A and L0C; a row of
/// more than 512 pixels (32 fractals, a quarter of L0A) does not fit them, and there is no
/// f32 fractal kernel to fall back to (the f16 NCHW kernel falls back to the fractal one).
fn known_failure(layer: &Layer, dtype: DataType, format: Format) -> Option<&'static str> {
    (dtype == DataType::F32 && format == Format::Nd && layer.hw.1 > 512 && layer.g != layer.c)
        .then_some("relayout buffers")
}

/// The sweep: ResNet, VGG, MobileNet, ResNeXt, YOLO and SSD layers at batch 1, 8 and 64 on
/// the 310P and the 910B2, f16 and f32 in NCHW and f16 in NC1HWC0 where the fractal kernel
/// takes the layer. Lowering only: the lowering tests run and check the kernels' values.
#[test]
fn every_conv_layer_shape_compiles_everywhere() {
    let (cases, failures, expected) = sweep(
        &["ascend310p", "ascend910b2"],
        &[1, 8, 64],
        &[
            (DataType::F16, Format::Nc1hwc0),
            (DataType::F16, Format::Nd),
            (DataType::F32, Format::Nd),
        ],
    );
    // Names end in the format, so no name is a prefix of another's `name: error`.
    let known = |f: &str| {
        expected
            .iter()
            .any(|(case, why)| f.starts_with(&format!("{case}:")) && f.contains(why))
    };
    let new: Vec<&String> = failures.iter().filter(|f| !known(f)).collect();
    let fixed: Vec<&str> = expected
        .iter()
        .map(|(case, _)| case.as_str())
        .filter(|case| !failures.iter().any(|f| f.starts_with(&format!("{case}:"))))
        .collect();
    assert!(
        new.is_empty() && fixed.is_empty(),
        "{cases} cases, {} failed ({} known); new failures:\n{}\nknown failures that now \
         compile (take them off the list): {fixed:?}",
        failures.len(),
        expected.len(),
        new.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("{cases} cases, {} known failures", failures.len());
}
