//! Lowered Conv runs on the simulated chip and matches an f64 reference computed here.

use gearsim_compiler::ir::{Attr, DataType, Format, Tensor};
use gearsim_host::oprun::Ran;
use half::f16;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::device_run::{constant, data, f32s, run_op};

/// Random f16-representable values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0)).to_f32())
        .collect()
}

pub(super) fn tensor(dtype: DataType, dims: &[i64], v: &[f32]) -> Tensor {
    match dtype {
        DataType::F16 => {
            let b = v
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes())
                .collect();
            Tensor::new(DataType::F16, dims.to_vec(), b).unwrap()
        }
        _ => Tensor::from_f32s(dims.to_vec(), v),
    }
}

/// A convolution case: NCHW input, weights [M, C/group, kh, kw].
#[derive(Debug, Clone)]
struct Case {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    m: i64,
    k: (i64, i64),
    stride: (i64, i64),
    dil: (i64, i64),
    pads: [i64; 4],
    group: i64,
    bias: bool,
    dtype: DataType,
    /// Layouts of the input and the output (NC1HWC0 runs the fractal-format kernel).
    formats: (Format, Format),
    /// The chip preset it runs on (`ascend910` unless a case says otherwise).
    chip: &'static str,
    /// AI cores of the chip, where a case sets fewer than the preset's (0: the preset's).
    cores: u32,
}

impl Case {
    fn new(n: i64, c: i64, hw: (i64, i64), m: i64, k: i64) -> Case {
        Case {
            n,
            c,
            h: hw.0,
            w: hw.1,
            m,
            k: (k, k),
            stride: (1, 1),
            dil: (1, 1),
            pads: [0; 4],
            group: 1,
            bias: false,
            dtype: DataType::F16,
            formats: (Format::Nd, Format::Nd),
            chip: "ascend910",
            cores: 0,
        }
    }

    fn on(mut self, chip: &'static str) -> Case {
        self.chip = chip;
        self
    }
    fn cores(mut self, cores: u32) -> Case {
        self.cores = cores;
        self
    }
    fn formats(mut self, x: Format, y: Format) -> Case {
        self.formats = (x, y);
        self
    }
    fn pad(mut self, p: i64) -> Case {
        self.pads = [p; 4];
        self
    }
    fn stride(mut self, s: i64) -> Case {
        self.stride = (s, s);
        self
    }
    fn dil(mut self, d: i64) -> Case {
        self.dil = (d, d);
        self
    }
    fn bias(mut self) -> Case {
        self.bias = true;
        self
    }
    fn f32(mut self) -> Case {
        self.dtype = DataType::F32;
        self
    }
    fn group(mut self, g: i64) -> Case {
        self.group = g;
        self
    }
    fn out_dims(&self) -> (i64, i64) {
        let o =
            |x: i64, k: i64, s: i64, d: i64, a: i64, b: i64| (x + a + b - (k - 1) * d - 1) / s + 1;
        (
            o(
                self.h,
                self.k.0,
                self.stride.0,
                self.dil.0,
                self.pads[0],
                self.pads[2],
            ),
            o(
                self.w,
                self.k.1,
                self.stride.1,
                self.dil.1,
                self.pads[1],
                self.pads[3],
            ),
        )
    }
}

/// Reference conv in f64: values and sum |x w| per output (for the tolerance).
fn reference(c: &Case, x: &[f32], w: &[f32], b: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let (ho, wo) = c.out_dims();
    let cg = c.c / c.group;
    let mg = c.m / c.group;
    let mut out = Vec::new();
    let mut scale = Vec::new();
    for n in 0..c.n {
        for m in 0..c.m {
            let g = m / mg;
            for oh in 0..ho {
                for ow in 0..wo {
                    let mut acc = b.map_or(0.0, |b| f64::from(b[m as usize]));
                    let mut s = acc.abs();
                    for ci in 0..cg {
                        let cin = g * cg + ci;
                        for i in 0..c.k.0 {
                            let y = oh * c.stride.0 + i * c.dil.0 - c.pads[0];
                            if y < 0 || y >= c.h {
                                continue;
                            }
                            for j in 0..c.k.1 {
                                let xx = ow * c.stride.1 + j * c.dil.1 - c.pads[1];
                                if xx < 0 || xx >= c.w {
                                    continue;
                                }
                                let xv =
                                    f64::from(x[(((n * c.c + cin) * c.h + y) * c.w + xx) as usize]);
                                let wv = f64::from(
                                    w[(((m * cg + ci) * c.k.0 + i) * c.k.1 + j) as usize],
                                );
                                acc += xv * wv;
                                s += (xv * wv).abs();
                            }
                        }
                    }
                    out.push(acc);
                    scale.push(s);
                }
            }
        }
    }
    (out, scale)
}

fn attrs(c: &Case) -> Vec<(&'static str, Attr)> {
    vec![
        ("kernel_shape", Attr::Ints(vec![c.k.0, c.k.1])),
        ("strides", Attr::Ints(vec![c.stride.0, c.stride.1])),
        ("dilations", Attr::Ints(vec![c.dil.0, c.dil.1])),
        ("pads", Attr::Ints(c.pads.to_vec())),
        ("group", Attr::Int(c.group)),
    ]
}

/// Runs a case and checks every element: |got - want| <= rtol |want| + atol sum|x w|.
fn check(c: &Case, seed: u64, rtol: f64, atol: f64) -> Ran {
    let xd = [c.n, c.c, c.h, c.w];
    let wd = [c.m, c.c / c.group, c.k.0, c.k.1];
    let xv = values((c.n * c.c * c.h * c.w) as usize, seed);
    let wv = values((wd.iter().product::<i64>()) as usize, seed + 1);
    let bv = values(c.m as usize, seed + 2);
    let x_stored = if c.formats.0 == Format::Nc1hwc0 {
        to_5hd(&xv, c.n, c.c, c.h * c.w)
    } else {
        xv.clone()
    };
    let mut inputs = vec![
        Some(data(tensor(c.dtype, &xd, &x_stored))),
        Some(constant(tensor(c.dtype, &wd, &wv))),
    ];
    if c.bias {
        inputs.push(Some(constant(tensor(c.dtype, &[c.m], &bv))));
    }
    // Formats of the inputs, then of the output.
    let mut formats = vec![c.formats.0, Format::Nd];
    if c.bias {
        formats.push(Format::Nd);
    }
    formats.push(c.formats.1);
    let mut cfg = gearsim_sim::ChipConfig::preset(c.chip).unwrap();
    if c.cores > 0 {
        cfg.core.count = c.cores;
    }
    let r = gearsim_host::oprun::run_op_formats(
        &cfg,
        "Conv",
        &attrs(c),
        inputs,
        &formats,
        1,
        gearsim_sim::ExecMode::Full,
    )
    .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let (want, scale) = reference(c, &xv, &wv, c.bias.then_some(&bv[..]));
    let (ho, wo) = c.out_dims();
    let got = if c.formats.1 == Format::Nc1hwc0 {
        from_5hd(&f32s(&r.outputs[0]), c.n, c.m, ho * wo)
    } else {
        f32s(&r.outputs[0])
    };
    assert_eq!(got.len(), want.len(), "{c:?}: element count");
    for (i, ((g, w), s)) in got.iter().zip(&want).zip(&scale).enumerate() {
        let err = (f64::from(*g) - w).abs();
        let bound = rtol * w.abs() + atol * s + 1e-6;
        assert!(
            err <= bound,
            "{c:?}: element {i} of {} is {g}, expected {w} (error {err:.3e} > bound {bound:.3e})\n{:?}",
            got.len(),
            r.kernels.last().map(|k| &k.tiling)
        );
    }
    r
}

/// NCHW values (`c % 16 == 0`) in NC1HWC0 order.
fn to_5hd(v: &[f32], n: i64, c: i64, hw: i64) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for i in 0..n * c * hw {
        let (ni, ci, p) = (i / (c * hw), i / hw % c, i % hw);
        out[(((ni * (c / 16) + ci / 16) * hw + p) * 16 + ci % 16) as usize] = v[i as usize];
    }
    out
}

/// NC1HWC0 values back in NCHW order.
fn from_5hd(v: &[f32], n: i64, c: i64, hw: i64) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for i in 0..n * c * hw {
        let (ni, ci, p) = (i / (c * hw), i / hw % c, i % hw);
        out[i as usize] = v[(((ni * (c / 16) + ci / 16) * hw + p) * 16 + ci % 16) as usize];
    }
    out
}

fn cube(c: &Case, seed: u64) -> Ran {
    check(c, seed, 1e-2, 1e-3)
}

#[test]
fn conv_1x1_small() {
    cube(&Case::new(1, 16, (4, 8), 16, 1), 1);
}

#[test]
fn conv_3x3_pad1() {
    cube(&Case::new(1, 16, (8, 20), 16, 3).pad(1), 2);
}

#[test]
fn conv_3x3_odd_channels_bias() {
    cube(&Case::new(1, 3, (13, 13), 17, 3).pad(1).bias(), 3);
}

#[test]
fn conv_3x3_stride2_pad1_batch3() {
    cube(&Case::new(3, 17, (13, 13), 20, 3).pad(1).stride(2), 4);
}

#[test]
fn conv_3x3_stride2_bias_f32() {
    cube(
        &Case::new(2, 8, (7, 7), 16, 3).pad(1).stride(2).bias().f32(),
        5,
    );
}

#[test]
fn conv_5x5_pad2() {
    cube(&Case::new(1, 17, (13, 13), 33, 5).pad(2), 6);
}

#[test]
fn conv_5x5_no_pad_dilation2() {
    cube(&Case::new(1, 5, (13, 13), 8, 5).dil(2).pad(1), 7);
}

#[test]
fn conv_3x3_dilation2_pad2() {
    cube(&Case::new(2, 16, (7, 13), 16, 3).dil(2).pad(2).bias(), 8);
}

#[test]
fn conv_1x1_pointwise_bias() {
    cube(&Case::new(3, 32, (7, 7), 48, 1).bias(), 9);
}

#[test]
fn conv_1x1_stride2() {
    cube(&Case::new(1, 16, (13, 13), 16, 1).stride(2), 10);
}

#[test]
fn conv_3x3_pad0_f32() {
    cube(&Case::new(3, 3, (7, 7), 4, 3).f32(), 11);
}

/// A wide map with few weights keeps them resident (its blocks have several tiles to reuse
/// them over).
#[test]
fn conv_3x3_wide_56() {
    let r = cube(&Case::new(1, 16, (56, 56), 16, 3).pad(1), 12);
    assert_eq!(tiling(&r, "streamed_weights"), Some(0));
}

/// The tiling value `name` of the run's conv kernel.
fn tiling(r: &Ran, name: &str) -> Option<i64> {
    r.kernels
        .iter()
        .flat_map(|k| &k.tiling)
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
}

/// Deep channels on a small map (ResNet's last stage): the weights stream through L1 with the
/// bands, one tile per block, the channels split over the blocks.
#[test]
fn conv_3x3_deep_small_map_streams_its_weights() {
    let r = cube(&Case::new(1, 128, (7, 7), 96, 3).pad(1).bias(), 15);
    assert_eq!(tiling(&r, "streamed_weights"), Some(1));
    let r = cube(&Case::new(2, 96, (5, 6), 80, 3).pad(1).f32(), 16);
    assert_eq!(tiling(&r, "streamed_weights"), Some(1));
}

/// Narrow f16 rows (`Wo < 16`) keep the pitch the windows need: the drain packs each
/// channel's rows with a block transpose and `vgather` (f32 outputs keep a pitch of 16).
#[test]
fn narrow_rows_are_packed_in_the_drain() {
    for (c, seed) in [
        (Case::new(4, 32, (7, 7), 48, 3).pad(1).bias(), 17),
        (Case::new(3, 16, (9, 5), 20, 3), 18),
        (Case::new(2, 17, (10, 10), 33, 3).pad(1), 19),
        (Case::new(16, 64, (7, 7), 64, 3).pad(1), 20),
    ] {
        let r = cube(&c, seed);
        assert_eq!(tiling(&r, "packed_rows"), Some(1), "{c:?}");
        assert!(
            tiling(&r, "row_pitch").is_some_and(|p| p % 16 != 0),
            "{c:?}"
        );
    }
    let r = cube(&Case::new(3, 3, (7, 7), 4, 3).f32(), 11);
    assert_eq!(tiling(&r, "packed_rows"), Some(0));
}

#[test]
fn conv_3x3_many_channels() {
    cube(&Case::new(1, 64, (14, 14), 96, 3).pad(1).bias(), 13);
}

#[test]
fn conv_asymmetric_pads_stride() {
    let mut c = Case::new(1, 16, (9, 11), 16, 3).stride(2);
    c.pads = [0, 1, 2, 0];
    c.stride = (1, 2);
    c.k = (3, 2);
    cube(&c, 14);
}

#[test]
fn conv_grouped_cube() {
    cube(&Case::new(1, 32, (7, 7), 32, 3).pad(1).group(2).bias(), 15);
}

/// The vector (f32) depthwise path.
fn vector(c: &Case, seed: u64) -> Ran {
    let tol = if c.dtype == DataType::F16 { 1e-3 } else { 1e-4 };
    check(c, seed, tol, 1e-6)
}

#[test]
fn depthwise_3x3_stride2_cnn() {
    vector(
        &Case::new(2, 16, (16, 16), 16, 3)
            .pad(1)
            .stride(2)
            .group(16)
            .f32(),
        21,
    );
}

#[test]
fn depthwise_3x3_pad1_f32_bias() {
    vector(
        &Case::new(3, 17, (13, 13), 17, 3)
            .pad(1)
            .group(17)
            .bias()
            .f32(),
        22,
    );
}

#[test]
fn depthwise_5x5_dilation2_f16() {
    vector(&Case::new(1, 8, (13, 11), 8, 5).pad(2).dil(2).group(8), 23);
}

#[test]
fn depthwise_wide_rows_stride3() {
    let mut c = Case::new(1, 4, (9, 130), 4, 3).pad(1).group(4).f32();
    c.stride = (2, 3);
    vector(&c, 24);
}

#[test]
fn depthwise_channel_multiplier() {
    vector(
        &Case::new(2, 4, (7, 7), 12, 3).pad(1).group(4).bias().f32(),
        25,
    );
}

#[test]
fn depthwise_stride2_f16_no_pad() {
    vector(&Case::new(1, 32, (56, 56), 32, 3).stride(2).group(32), 26);
}

#[test]
fn depthwise_1x1_asymmetric_pads() {
    let mut c = Case::new(1, 3, (5, 6), 3, 1).group(3).f32();
    c.pads = [1, 0, 0, 2];
    vector(&c, 27);
}

#[test]
fn depthwise_wide_f16_stride3() {
    let mut c = Case::new(1, 3, (6, 100), 3, 3).pad(1).group(3);
    c.stride = (1, 3);
    vector(&c, 28);
}

/// The pad kernel moves a plane's data rows in chunks of at most 64 (a 113-row plane as 57
/// and 56 rows), one row at a time where a chunk would cross a block's end (planes of 11
/// rows over blocks of 12 padded rows); small planes (MobileNet's 14×14 of 576 channels) go
/// in one chunk each.
#[test]
fn depthwise_pad_chunks_cover_tall_planes_and_block_ends() {
    for (i, c) in [
        Case::new(1, 4, (113, 20), 4, 3)
            .pad(1)
            .group(4)
            .on("ascend310p"),
        Case::new(1, 576, (14, 14), 576, 3)
            .pad(1)
            .group(576)
            .bias()
            .on("ascend310p"),
        Case::new(3, 5, (11, 9), 5, 3).pad(2).dil(2).group(5).f32(),
    ]
    .iter()
    .enumerate()
    {
        let r = vector(c, 29 + i as u64);
        assert!(tiling(&r, "rows_per_chunk").is_some_and(|k| k > 1), "{c:?}");
    }
}

// The convolutions of the test models (tests/models/make_models.py), in f32 like the models.

#[test]
fn cnn_conv1_3x3() {
    cube(&Case::new(2, 3, (32, 32), 16, 3).pad(1).f32(), 31);
}

#[test]
fn cnn_layer1_3x3() {
    cube(&Case::new(4, 16, (32, 32), 16, 3).pad(1).f32(), 32);
}

#[test]
fn cnn_depthwise_3x3_stride2() {
    vector(
        &Case::new(4, 16, (32, 32), 16, 3)
            .pad(1)
            .stride(2)
            .group(16)
            .f32(),
        33,
    );
}

#[test]
fn cnn_pointwise_1x1_bias() {
    cube(&Case::new(4, 16, (16, 16), 32, 1).bias().f32(), 34);
}

#[test]
fn gear_batch_conv() {
    cube(&Case::new(8, 4, (8, 8), 8, 3).pad(1).bias().f32(), 35);
}

#[test]
fn gear_image_conv_stride2() {
    cube(
        &Case::new(1, 3, (21, 30), 4, 3)
            .pad(1)
            .stride(2)
            .bias()
            .f32(),
        36,
    );
}

/// A case whose bias is a runtime input.
fn runtime_bias(c: &Case, seed: u64, rtol: f64) {
    let xd = [c.n, c.c, c.h, c.w];
    let wd = [c.m, c.c / c.group, c.k.0, c.k.1];
    let xv = values((c.n * c.c * c.h * c.w) as usize, seed);
    let wv = values(wd.iter().product::<i64>() as usize, seed + 1);
    let bv = values(c.m as usize, seed + 2);
    let inputs = vec![
        data(tensor(c.dtype, &xd, &xv)),
        constant(tensor(c.dtype, &wd, &wv)),
        data(tensor(c.dtype, &[c.m], &bv)),
    ];
    let r = run_op("Conv", &attrs(c), inputs).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let (want, scale) = reference(c, &xv, &wv, Some(&bv));
    let got = f32s(&r.outputs[0]);
    assert_eq!(got.len(), want.len());
    for (i, ((g, w), s)) in got.iter().zip(&want).zip(&scale).enumerate() {
        let bound = rtol * w.abs() + 1e-3 * s + 1e-6;
        assert!(
            (f64::from(*g) - w).abs() <= bound,
            "{c:?}: element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn conv_runtime_bias() {
    runtime_bias(&Case::new(2, 16, (9, 9), 24, 3).pad(1).f32(), 41, 1e-2);
}

#[test]
fn depthwise_runtime_bias() {
    runtime_bias(
        &Case::new(2, 20, (9, 9), 20, 3).pad(1).group(20).f32(),
        42,
        1e-4,
    );
}

/// A case's input and weights (NCHW), seeded values.
fn input_and_weights(c: &Case) -> (Tensor, Tensor) {
    let xd = [c.n, c.c, c.h, c.w];
    let wd = [c.m, c.c / c.group, c.k.0, c.k.1];
    let x = tensor(c.dtype, &xd, &values((c.n * c.c * c.h * c.w) as usize, 1));
    let w = tensor(
        c.dtype,
        &wd,
        &values(wd.iter().product::<i64>() as usize, 2),
    );
    (x, w)
}

/// The error a case's lowering reports (weights given as `weights_in`).
fn lowering_error(c: &Case, constant_weights: bool) -> String {
    let (x, w) = input_and_weights(c);
    let w = if constant_weights {
        constant(w)
    } else {
        data(w)
    };
    match run_op("Conv", &attrs(c), vec![data(x), w]) {
        Ok(_) => panic!("{c:?} was lowered"),
        Err(e) => e,
    }
}

#[test]
fn conv_runtime_weights_are_an_error() {
    let e = lowering_error(&Case::new(1, 16, (8, 8), 16, 3), false);
    assert!(e.contains("Conv") && e.contains("constant"), "{e}");
}

/// A 700-pixel row is too wide for the NCHW kernel's tiles; the 5HD kernel takes it between
/// TransData conversions (its rows, not whole fractals, fit the L0C tile whole with one co
/// fractal a product).
#[test]
fn conv_too_wide_row_for_the_nchw_kernel_runs_the_5hd_kernel() {
    let r = cube(&Case::new(1, 16, (3, 700), 16, 3).pad(1), 73);
    assert!(
        r.kernels.iter().any(|k| k.name.ends_with("_5hd")),
        "{:?}",
        r.kernels.iter().map(|k| &k.name).collect::<Vec<_>>()
    );
}

/// An f32 row too wide for the NCHW kernel (which casts to f16 and writes f32) stays an error
/// naming the limit: the 5HD kernel writes f16 only.
#[test]
fn conv_f32_too_wide_row_is_an_error() {
    let e = lowering_error(&Case::new(1, 16, (3, 700), 16, 3).f32(), true);
    assert!(
        e.contains("Conv") && e.contains("700") && e.contains("does not fit"),
        "{e}"
    );
}

/// Rows of whole fractals wider than any tile (1040 pixels, 65 fractals, against L0A's 64 a
/// step): tiles are parts of rows.
#[test]
fn conv5hd_rows_wider_than_a_tile_split_into_parts() {
    let r = cube(
        &Case::new(1, 16, (2, 1040), 32, 3)
            .pad(1)
            .bias()
            .formats(F5, F5)
            .on("ascend910b2"),
        74,
    );
    let tile = tiling(&r, "pixel_fractals_per_tile").expect("the 5HD kernel reports its tiles");
    assert!(tile < 65, "{tile} fractals a tile");
}

#[test]
fn pointwise_convs_run_as_products_at_any_row_width_and_stride() {
    // A 1x1 conv has no window, so the product per image takes any row width; strides
    // subsample first. Both against the reference, with bias.
    let names = |r: &Ran| -> Vec<String> { r.kernels.iter().map(|k| k.name.clone()).collect() };
    let r = cube(&Case::new(2, 16, (2, 700), 32, 1).bias(), 40);
    assert!(
        names(&r).iter().any(|k| k.contains("1x1")),
        "{:?}",
        names(&r)
    );
    let r = cube(&Case::new(3, 48, (9, 13), 24, 1).stride(2), 41);
    assert!(
        names(&r).iter().any(|k| k.contains("Slice")),
        "{:?}",
        names(&r)
    );
}

#[test]
fn depthwise_too_wide_row_is_an_error() {
    let e = lowering_error(&Case::new(1, 2, (1, 40000), 2, 1).group(2).f32(), true);
    assert!(e.contains("Conv") && e.contains("does not fit"), "{e}");
}

// ---- the fractal-format (NC1HWC0) kernel -------------------------------------------------

const F5: Format = Format::Nc1hwc0;
const ND: Format = Format::Nd;

#[test]
fn conv5hd_3x3_pad1_both_sides() {
    let r = cube(&Case::new(2, 32, (9, 20), 48, 3).pad(1).formats(F5, F5), 40);
    assert_eq!(r.kernels.len(), 1, "no conversion when both sides are 5HD");
}

#[test]
fn conv5hd_bias_stride2_nchw_in() {
    let r = cube(
        &Case::new(3, 16, (15, 13), 32, 3)
            .pad(1)
            .stride(2)
            .bias()
            .formats(ND, F5),
        41,
    );
    assert_eq!(r.kernels.len(), 2, "a TransData in, then the conv");
}

/// A first layer without AIPP, as GE runs it: an NCHW input of fewer than 16 channels is
/// converted by a TransData into one channel block zero-padded to 16 (GE's NC1HWC0 pads C to
/// C1 · C0), then the 5HD kernel runs; the zero lanes meet zero weights.
#[test]
fn conv5hd_few_channels_nchw_in_is_padded_to_one_block() {
    // ResNet's stem at a small size: 3 channels, 7x7, stride 2, bias; two images.
    let r = cube(
        &Case::new(2, 3, (32, 32), 64, 7)
            .pad(3)
            .stride(2)
            .bias()
            .formats(ND, F5),
        48,
    );
    let names: Vec<&str> = r.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names.len(), 2, "a TransData in, then the conv: {names:?}");
    assert!(names[0].starts_with("TransData"), "{names:?}");
    // Its tiles' padding rows are zeroed before its first load, and the store writes whole
    // 32-byte units: lanes 3..15 of every pixel are zeros, whatever UB held before.
    let t = &r.kernels[0].program;
    let first = |op: &str| (0..t.instrs.len()).find(|&pc| t.disasm_at(pc).starts_with(op));
    let (zero, load) = (first("vdup"), first("copy_gm_to_ub"));
    assert!(
        zero.is_some() && load.is_some() && zero < load,
        "{}",
        t.disassemble()
    );
    // One channel and one image, a plane that is not a multiple of 16 pixels, and 4 channels.
    cube(&Case::new(1, 1, (9, 11), 16, 3).pad(1).formats(ND, F5), 49);
    cube(
        &Case::new(3, 4, (5, 7), 32, 3).pad(1).bias().formats(ND, F5),
        50,
    );
}

#[test]
fn conv5hd_1x1_nchw_out_many_channels() {
    // 160 output channels: two co blocks (8 + 2 fractals).
    cube(&Case::new(1, 64, (7, 7), 160, 1).formats(F5, ND), 42);
}

#[test]
fn conv5hd_dilated_asymmetric_pads() {
    let mut c = Case::new(1, 16, (12, 30), 16, 3).dil(2).formats(F5, F5);
    c.pads = [0, 2, 3, 1];
    cube(&c, 43);
}

#[test]
fn conv5hd_wide_rows_and_many_blocks() {
    // 100-pixel rows (not a multiple of 16) over more rows than cores.
    cube(
        &Case::new(2, 16, (40, 100), 16, 3)
            .pad(1)
            .bias()
            .formats(F5, F5),
        44,
    );
}

#[test]
fn conv5hd_one_pixel_images() {
    cube(&Case::new(4, 32, (1, 1), 16, 1).formats(F5, ND), 45);
}

#[test]
fn conv5hd_weights_larger_than_l1_split_output_channels_over_blocks() {
    // 4.7 MB of packed weights: each block keeps one group of output channels in L1.
    let r = cube(
        &Case::new(2, 512, (3, 3), 512, 3).pad(1).formats(F5, F5),
        46,
    );
    assert_eq!(r.kernels.len(), 1);
}

/// Weights that no split over the cores fits: 4096 output channels of 256-channel 3×3
/// windows are 18.9 MB packed, and 8 groups would leave each block 2.4 MB of them against
/// the 310P's 1 MB L1; streamed, every tile would re-read its weights from DDR (they are
/// more than the L2 keeps). The kernel runs more groups than cores, one block each, in waves.
#[test]
fn conv5hd_weights_no_core_split_fits_run_more_groups_than_cores_in_waves() {
    let r = cube(
        &Case::new(1, 256, (16, 16), 4096, 3)
            .pad(1)
            .bias()
            .formats(F5, F5)
            .on("ascend310p"),
        66,
    );
    let blocks = tiling(&r, "block_dim").expect("the 5HD kernel reports its blocks");
    let groups = tiling(&r, "co_groups").expect("the 5HD kernel reports its groups");
    assert!(
        blocks > 8 && groups == blocks,
        "{blocks} blocks, {groups} groups"
    );
    assert!(tiling(&r, "weight_bytes") > Some(0), "resident weights");
}

/// Where the weights fit the L2, streaming them beats waves: 2048 output channels of
/// 256-channel 3×3 windows (9.4 MB packed, more than any split over the 910B's 24 cores fits
/// in L1) in narrow resident groups would img2col every fractal for 4 output fractals (MTE1
/// bound), streamed for 8, the L2 serving each tile's re-read weights.
#[test]
fn conv5hd_weights_the_l2_holds_stream_rather_than_run_in_waves() {
    let r = cube(
        &Case::new(1, 256, (4, 6), 2048, 3)
            .pad(1)
            .bias()
            .formats(F5, F5)
            .on("ascend910b2"),
        69,
    );
    assert_eq!(tiling(&r, "weight_bytes"), Some(0), "streamed");
    let blocks = tiling(&r, "block_dim").expect("the 5HD kernel reports its blocks");
    assert!(blocks <= 24, "{blocks} blocks: one wave");
}

/// Bands too wide for L1 beside any weights: a 512-channel map of 96-pixel rows needs 295 KB
/// of band for one row of output, twice over to double-buffer, against the 910B's 508 KB L1.
/// The weights stream through L1 with the bands, in chunks of channel blocks.
#[test]
fn conv5hd_bands_wider_than_l1_stream_the_weights_in_chunks_of_k() {
    for (c, seed) in [
        (
            Case::new(1, 512, (4, 96), 64, 3)
                .pad(1)
                .bias()
                .formats(F5, F5)
                .on("ascend910b2"),
            67,
        ),
        (
            Case::new(2, 400, (3, 100), 48, 3)
                .pad(1)
                .formats(F5, ND)
                .on("ascend910b2"),
            68,
        ),
    ] {
        let r = cube(&c, seed);
        assert_eq!(
            tiling(&r, "weight_bytes"),
            Some(0),
            "{c:?}: streamed, none resident"
        );
    }
}

/// A streamed block with many co blocks runs all but each tile's last ones as a loop of
/// pairs whose weights', output's and bias rows' addresses move each pass (the code of a
/// 640 -> 7680-channel convolution would not fit a kernel unrolled): the loop's passes give the
/// reference's values (a 1024-channel map of 128-pixel rows on the 310P, 6144 output channels
/// in 8 groups of 48 co fractals, blocks of 8, with a bias).
#[test]
fn conv5hd_streamed_co_blocks_run_as_a_loop_of_pairs() {
    let c = Case::new(1, 1024, (3, 128), 6144, 3)
        .pad(1)
        .bias()
        .formats(F5, F5)
        .on("ascend310p");
    let r = cube(&c, 70);
    assert_eq!(tiling(&r, "weight_bytes"), Some(0), "{c:?}: streamed");
    let loops = r
        .kernels
        .iter()
        .flat_map(|k| &k.program.instrs)
        .filter(|i| matches!(i, gearsim_isa::Instruction::LoopNz(_)))
        .count();
    assert!(loops > 0, "{c:?}: the co blocks loop");
}

#[test]
fn conv5hd_uneven_output_channel_groups_with_bias() {
    // 20 co fractals do not divide evenly among the groups.
    cube(
        &Case::new(1, 256, (5, 6), 320, 3)
            .pad(1)
            .bias()
            .formats(F5, ND),
        47,
    );
}

#[test]
fn conv5hd_pointwise_tiles_its_plane_in_rows_of_one_fractal() {
    // 12×20 = 240 pixels = 15 fractals: the kernel tiles the plane as 15 rows of 16 pixels
    // (a tile's band reads no row outside it), NCHW and 5HD sides, with bias; and a plane that
    // does not divide into fractals (7×9) keeps its grid.
    cube(
        &Case::new(3, 32, (12, 20), 48, 1).bias().formats(F5, F5),
        48,
    );
    cube(&Case::new(2, 16, (12, 20), 32, 1).formats(ND, F5), 49);
    cube(&Case::new(2, 16, (7, 9), 32, 1).formats(F5, ND), 50);
}

/// A pointwise convolution (1×1, stride 1, no padding) feeds L0A by Load2D, as GE's does, and
/// any other by img2col: on a plane tiled in rows of one fractal, on one that does not divide
/// into fractals (each segment's last fractal reads past its band), and with several small
/// images stacked in one tile; a strided pointwise convolution and a 3×3 one keep img2col.
#[test]
fn conv5hd_pointwise_feeds_l0a_by_load2d() {
    for (c, seed, load2d) in [
        (
            Case::new(3, 32, (12, 20), 48, 1).bias().formats(F5, F5),
            60,
            1,
        ),
        (Case::new(2, 48, (7, 9), 32, 1).formats(F5, F5), 61, 1),
        (
            Case::new(6, 64, (3, 3), 32, 1).bias().formats(F5, ND),
            62,
            1,
        ),
        (Case::new(2, 256, (14, 14), 64, 1).formats(F5, F5), 63, 1),
        (
            Case::new(1, 16, (13, 13), 16, 1).stride(2).formats(F5, F5),
            64,
            0,
        ),
        (
            Case::new(2, 32, (9, 20), 48, 3).pad(1).formats(F5, F5),
            65,
            0,
        ),
    ] {
        let r = cube(&c, seed);
        assert_eq!(tiling(&r, "l0a_load2d"), Some(load2d), "{c:?}");
    }
}

/// When the chip's memory bounds every split of the output channels alike (weights far above
/// the input, the input re-read from the L2 by each group), the split that uses every core
/// wins: ResNet-50's last downsampling convolution at batch 1 on the 310P (4 MB of weights,
/// a 14×14 input of 400 KB) runs on all 8 AI cores, one group each, where counting every
/// group's input read at DDR cost left two cores idle.
#[test]
fn conv5hd_memory_bound_split_uses_every_core() {
    let r = cube(
        &Case::new(1, 1024, (14, 14), 2048, 1)
            .stride(2)
            .formats(F5, F5)
            .on("ascend310p"),
        66,
    );
    assert_eq!(tiling(&r, "block_dim"), Some(8));
    assert_eq!(tiling(&r, "co_groups"), Some(8));
}

/// A pointwise convolution whose rows are whole fractals but so wide that one row of every
/// channel block, double-buffered, leaves the 910B's L1 no room (a band is whole rows: 512
/// channels of 256-pixel rows are 256 KB a row): it is tiled on rows of 16 pixels instead,
/// the same bytes in NC1HWC0.
#[test]
fn conv5hd_pointwise_rows_too_wide_for_l1_tile_on_rows_of_16() {
    let r = cube(
        &Case::new(1, 512, (8, 256), 128, 1)
            .formats(F5, F5)
            .on("ascend910b2"),
        71,
    );
    assert_eq!(r.kernels.len(), 1, "one 5HD kernel");
}

/// A window convolution whose bands of every input channel over its wide rows leave the NCHW
/// kernel no tile that fits L1 (512 channels of 288-pixel rows) runs the 5HD kernel between
/// TransData conversions, its weights streamed in chunks of K.
#[test]
fn conv_nchw_too_wide_for_the_nchw_kernel_runs_the_5hd_kernel() {
    let r = cube(
        &Case::new(1, 512, (2, 288), 32, 3)
            .pad(1)
            .bias()
            .on("ascend910b2"),
        72,
    );
    let names: Vec<&str> = r.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(
        names.len() == 3 && names[1].ends_with("_5hd"),
        "TransData, the 5HD conv, TransData: {names:?}"
    );
}

/// Deep 7×7 windows: 2048 input channels are 6272 K fractals, so a co fractal's packed
/// weights (100 352 units) pass a burst's length field and a chunk's skip over the rest of K
/// passes the gap field; the transfers are split rather than the shape refused.
#[test]
fn conv5hd_transfers_past_the_dma_fields_are_split() {
    let r = cube(
        &Case::new(1, 2048, (7, 7), 16, 7)
            .pad(3)
            .stride(2)
            .formats(F5, F5)
            .on("ascend310p"),
        75,
    );
    assert_eq!(tiling(&r, "weight_bytes"), Some(0), "streamed");
}

/// ResNet-50's 1×1 1024 -> 256 convolution at batch 64 on the 910B2: one launch's code
/// (unrolled per block) would pass the instruction limit, so the batch runs in two launches
/// of the same kernel, each on its half of the images, checked element-wise.
#[test]
fn conv5hd_batch_past_the_instruction_limit_runs_in_parts() {
    let r = cube(
        &Case::new(64, 1024, (14, 14), 256, 1)
            .formats(F5, F5)
            .on("ascend910b2"),
        76,
    );
    assert_eq!(tiling(&r, "batch_parts"), Some(2));
    assert_eq!(r.kernels.len(), 2, "one launch per part");
}

/// A stride past the padded input (ONNX allows it) gives the single window a stride equal to
/// it gives: both kernels run it, checked element-wise (the reference steps by the stride).
#[test]
fn conv_stride_past_the_padded_input_is_one_window() {
    cube(&Case::new(1, 16, (3, 5), 16, 1).stride(8), 77);
    cube(&Case::new(2, 32, (3, 3), 16, 3).pad(1).stride(6), 78);
    cube(
        &Case::new(2, 32, (3, 3), 16, 3)
            .pad(1)
            .stride(1 << 20)
            .formats(F5, F5),
        79,
    );
}

/// Maps of more than 65535 pixels (YOLO's 640×640 input and its 320×320 maps, 256×256
/// segmentation inputs) put a feature map's channel blocks further apart than a DMA gap
/// field reaches: the 5HD kernel writes such outputs one channel block a burst, and the NCHW
/// kernel moves its workspace rows burst by burst where even one-row tiles leave a piece's
/// channel blocks too far apart (one core takes a 256-row image).
#[test]
fn maps_past_a_dma_gap_move_burst_by_burst() {
    let c5hd = Case::new(1, 16, (272, 272), 32, 3)
        .pad(1)
        .bias()
        .on("ascend310p");
    let cases = [
        // 73984 pixels each side.
        c5hd.clone().formats(Format::Nc1hwc0, Format::Nc1hwc0),
        // Rows too wide for the NCHW kernel's relayout: TransData pads the 3 channels to a
        // block of 81920 pixels, and the 5HD kernel's output is converted back.
        Case::new(1, 3, (128, 640), 16, 3).pad(1).on("ascend310p"),
        Case::new(1, 16, (256, 256), 16, 3)
            .pad(1)
            .on("ascend310p")
            .cores(1),
        Case::new(1, 16, (256, 256), 16, 3)
            .pad(1)
            .f32()
            .on("ascend310p")
            .cores(1),
    ];
    for (i, c) in cases.iter().enumerate() {
        cube(c, 900 + i as u64);
    }
}

/// A grouped convolution on the fractal kernel, as GE packs it: `enlarge` consecutive groups
/// share a packed group of whole channel blocks whose weights are block-diagonal, and each co
/// group reads only its packed group's input blocks. ResNeXt's 32 groups of 4 channels pack
/// four to a block (8 packed groups of one block each); 32 groups of 8 pack two to a block;
/// 32 channels a group need no packing (2 blocks a group); RegNet-style 24 channels a group
/// pack two to 3 blocks; unequal input and output widths pack by the wider need.
#[test]
fn conv5hd_grouped_packs_groups_into_channel_blocks() {
    let cases = [
        (Case::new(1, 128, (9, 10), 128, 3).pad(1).group(32), 4, 8),
        (Case::new(2, 128, (9, 10), 128, 3).pad(1).group(32), 4, 8),
        (
            Case::new(1, 256, (7, 7), 256, 3)
                .pad(1)
                .stride(2)
                .group(32)
                .bias(),
            2,
            16,
        ),
        (Case::new(1, 64, (6, 6), 64, 3).pad(1).group(2), 1, 2),
        (Case::new(1, 48, (6, 7), 48, 3).pad(1).group(16), 16, 1),
        (Case::new(1, 96, (5, 8), 96, 3).pad(1).group(4), 2, 2),
        (Case::new(2, 64, (6, 6), 128, 1).group(16), 4, 4),
    ];
    for (i, (c, enlarge, packed)) in cases.into_iter().enumerate() {
        for chip in ["ascend310p", "ascend910b2"] {
            let c = c.clone().formats(F5, F5).on(chip);
            let r = cube(&c, 90 + i as u64);
            assert_eq!(r.kernels.len(), 1, "{c:?}: one kernel, no conversion");
            assert_eq!(tiling(&r, "group_enlarge"), Some(enlarge), "{c:?}");
            assert_eq!(tiling(&r, "packed_groups"), Some(packed), "{c:?}");
        }
    }
    // NCHW sides are converted around it, and a ReLU rides in the drain as for any other.
    let c = Case::new(1, 64, (8, 8), 64, 3)
        .pad(1)
        .group(8)
        .formats(ND, ND);
    let r = cube(&c.clone().formats(ND, F5), 97);
    assert_eq!(r.kernels.len(), 2, "a TransData in, then the conv");
    cube(&c.formats(F5, ND), 98);
}

/// Groups that do not pack into whole blocks without padding channels (3 groups of 8, 5 of
/// 8: two groups fill a block, and an odd count leaves half a block) are not the fractal
/// kernel's (the layout pass leaves them NCHW): asked to, it says why. With whole blocks of
/// input and output channels every grouping packs (a group count times a group's channels
/// is a multiple of 16 only if the count is a multiple of what fills a block).
#[test]
fn conv5hd_refuses_groups_that_need_padding() {
    for (c, why) in [
        (
            Case::new(1, 24, (6, 6), 24, 3).pad(1).group(3),
            "pack into whole",
        ),
        (
            Case::new(1, 40, (6, 6), 80, 3).pad(1).group(5),
            "pack into whole",
        ),
    ] {
        let (x, w) = input_and_weights(&c);
        let r = gearsim_host::oprun::run_op_formats(
            &gearsim_sim::ChipConfig::preset("ascend310p").unwrap(),
            "Conv",
            &attrs(&c),
            vec![Some(data(x)), Some(constant(w))],
            &[F5, ND, F5],
            1,
            gearsim_sim::ExecMode::Full,
        );
        match r {
            Ok(_) => panic!("{c:?} ran on the fractal kernel"),
            Err(e) => assert!(e.contains(why), "{c:?}: {e}"),
        }
    }
}
