//! Lowered MaxPool, AveragePool and GlobalAveragePool run on the simulated chip and match
//! references computed here in f64 (ONNX semantics: windows at `o·s − pad_begin + k·d`,
//! ceil_mode's extra windows clipped to the input, `count_include_pad` counting the explicit
//! pads but never the ceil_mode overhang, MaxPool's Indices the first maximal position in
//! row-major window order), on random inputs of odd sizes, every padding mode, f32 and f16,
//! tiles of whole planes and bands of big planes; plus the rates of the big pools.

use gearsim_compiler::ir::{Attr, DataType, Tensor};
use gearsim_host::oprun::{Ran, run_op as run_op_n};
use gearsim_sim::{ChipConfig, ExecMode};
use half::f16;

use super::device_run::{assert_close, data, f32s, preset, rand_f32, run_op};

// ---- references ------------------------------------------------------------------------------

/// The window attributes of a test case.
#[derive(Debug, Clone, Default)]
struct Win {
    kernel: Vec<i64>,
    strides: Option<Vec<i64>>,
    dilations: Option<Vec<i64>>,
    pads: Option<Vec<i64>>,
    auto_pad: Option<&'static str>,
    ceil_mode: bool,
    count_include_pad: bool,
    storage_order: bool,
}

impl Win {
    fn k(kernel: &[i64]) -> Win {
        Win {
            kernel: kernel.to_vec(),
            ..Win::default()
        }
    }

    fn s(mut self, s: &[i64]) -> Win {
        self.strides = Some(s.to_vec());
        self
    }

    fn p(mut self, p: &[i64]) -> Win {
        self.pads = Some(p.to_vec());
        self
    }

    fn d(mut self, d: &[i64]) -> Win {
        self.dilations = Some(d.to_vec());
        self
    }

    fn ceil(mut self) -> Win {
        self.ceil_mode = true;
        self
    }

    fn include_pad(mut self) -> Win {
        self.count_include_pad = true;
        self
    }

    fn auto(mut self, mode: &'static str) -> Win {
        self.auto_pad = Some(mode);
        self
    }

    fn attrs(&self, avg: bool, max_indices: bool) -> Vec<(&'static str, Attr)> {
        let mut a = vec![("kernel_shape", Attr::Ints(self.kernel.clone()))];
        if let Some(s) = &self.strides {
            a.push(("strides", Attr::Ints(s.clone())));
        }
        if let Some(d) = &self.dilations {
            a.push(("dilations", Attr::Ints(d.clone())));
        }
        if let Some(p) = &self.pads {
            a.push(("pads", Attr::Ints(p.clone())));
        }
        if let Some(m) = self.auto_pad {
            a.push(("auto_pad", Attr::Str(m.to_string())));
        }
        if self.ceil_mode {
            a.push(("ceil_mode", Attr::Int(1)));
        }
        if avg && self.count_include_pad {
            a.push(("count_include_pad", Attr::Int(1)));
        }
        if max_indices && self.storage_order {
            a.push(("storage_order", Attr::Int(1)));
        }
        a
    }

    /// Per spatial axis: (kernel, stride, dilation, pad begin, pad end, output size).
    fn geometry(&self, spatial: &[i64]) -> Vec<(i64, i64, i64, i64, i64, i64)> {
        let n = spatial.len();
        (0..n)
            .map(|a| {
                let x = spatial[a];
                let k = self.kernel[a];
                let s = self.strides.as_ref().map_or(1, |v| v[a]);
                let d = self.dilations.as_ref().map_or(1, |v| v[a]);
                let e = (k - 1) * d + 1;
                match self.auto_pad {
                    Some("SAME_UPPER") | Some("SAME_LOWER") => {
                        let o = (x + s - 1) / s;
                        let total = ((o - 1) * s + e - x).max(0);
                        let begin = if self.auto_pad == Some("SAME_UPPER") {
                            total / 2
                        } else {
                            total - total / 2
                        };
                        (k, s, d, begin, total - begin, o)
                    }
                    Some("VALID") => (k, s, d, 0, 0, (x - e) / s + 1),
                    _ => {
                        let p = self.pads.clone().unwrap_or_else(|| vec![0; 2 * n]);
                        let (pb, pe) = (p[a], p[a + n]);
                        let num = x + pb + pe - e;
                        let o = if self.ceil_mode {
                            let mut o = (num + s - 1) / s + 1;
                            if (o - 1) * s >= x + pb {
                                o -= 1;
                            }
                            o
                        } else {
                            num / s + 1
                        };
                        (k, s, d, pb, pe, o)
                    }
                }
            })
            .collect()
    }
}

/// The reference pool of `x` (dims [N, C, spatial...], 1 or 2 spatial axes): values and, for
/// MaxPool, the flat argmax indices.
fn reference(x: &Tensor, w: &Win, avg: bool) -> (Vec<i64>, Vec<f64>, Vec<i64>) {
    let dims = &x.dims;
    let sp: Vec<i64> = dims[2..].to_vec();
    let g = w.geometry(&sp);
    // Treat 1-D as 2-D with a unit H axis.
    let (gh, gw, h, wd) = if sp.len() == 1 {
        ((1, 1, 1, 0, 0, 1), g[0], 1, sp[0])
    } else {
        (g[0], g[1], sp[0], sp[1])
    };
    let (ho, wo) = (gh.5, gw.5);
    let planes = (dims[0] * dims[1]) as usize;
    let xv = x.to_f64s();
    let mut y = Vec::new();
    let mut idx = Vec::new();
    for p in 0..planes {
        let base = p * (h * wd) as usize;
        for oh in 0..ho {
            for ow in 0..wo {
                let (mut best, mut at): (Option<f64>, i64) = (None, -1);
                let (mut sum, mut valid, mut counted) = (0.0, 0, 0);
                for kh in 0..gh.0 {
                    let ih = oh * gh.1 - gh.3 + kh * gh.2;
                    for kw in 0..gw.0 {
                        let iw = ow * gw.1 - gw.3 + kw * gw.2;
                        let in_pads = ih >= -gh.3 && ih < h + gh.4 && iw >= -gw.3 && iw < wd + gw.4;
                        if in_pads {
                            counted += 1;
                        }
                        if ih < 0 || ih >= h || iw < 0 || iw >= wd {
                            continue;
                        }
                        let v = xv[base + (ih * wd + iw) as usize];
                        valid += 1;
                        sum += v;
                        if best.is_none_or(|b| v > b) {
                            best = Some(v);
                            let flat = if w.storage_order {
                                iw * h + ih
                            } else {
                                ih * wd + iw
                            };
                            at = base as i64 + flat;
                        }
                    }
                }
                if avg {
                    let div = if w.count_include_pad { counted } else { valid };
                    y.push(sum / f64::from(div));
                } else {
                    y.push(best.unwrap_or(0.0));
                    idx.push(at);
                }
            }
        }
    }
    let mut out_dims = dims[..2].to_vec();
    if sp.len() == 2 {
        out_dims.push(ho);
    }
    out_dims.push(wo);
    (out_dims, y, idx)
}

// ---- running ---------------------------------------------------------------------------------

/// A random input of `dims` in `dtype` (f16 values are the f32 ones rounded).
fn input(dims: &[i64], dtype: DataType, seed: u64) -> Tensor {
    let t = rand_f32(dims, -1.0, 1.0, seed);
    match dtype {
        DataType::F16 => {
            let bytes: Vec<u8> = f32s(&t)
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect();
            Tensor::new(DataType::F16, dims.to_vec(), bytes).unwrap()
        }
        _ => t,
    }
}

/// Runs a window pool on a random input and checks it against the reference.
fn check(op: &str, dims: &[i64], w: &Win, dtype: DataType, seed: u64) {
    let avg = op == "AveragePool";
    let x = input(dims, dtype, seed);
    let what = format!("{op} {dtype:?} {dims:?} {w:?}");
    let r = run_op(op, &w.attrs(avg, false), vec![data(x.clone())])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (out_dims, want, _) = reference(&x, w, avg);
    assert_eq!(r.outputs[0].dims, out_dims, "{what}: output dims");
    assert_eq!(r.outputs[0].dtype, dtype, "{what}: output type");
    let (rtol, atol) = match (avg, dtype) {
        (false, _) => (0.0, 0.0),
        (true, DataType::F16) => (1e-3, 1e-5),
        (true, _) => (1e-4, 1e-6),
    };
    assert_close(&f32s(&r.outputs[0]), &want, rtol, atol, &what);
}

fn both(dims: &[i64], w: &Win, seed: u64) {
    for dtype in [DataType::F32, DataType::F16] {
        check("MaxPool", dims, w, dtype, seed);
        check("AveragePool", dims, w, dtype, seed + 1);
    }
}

// ---- MaxPool and AveragePool ------------------------------------------------------------------

#[test]
fn cnn_maxpool_2x2_stride_2() {
    // tests/models/cnn.onnx: MaxPool 2x2 stride 2 on [N, 32, 16, 16].
    check(
        "MaxPool",
        &[2, 32, 16, 16],
        &Win::k(&[2, 2]).s(&[2, 2]),
        DataType::F32,
        1,
    );
    check(
        "MaxPool",
        &[3, 32, 16, 16],
        &Win::k(&[2, 2]).s(&[2, 2]).p(&[0, 0, 0, 0]),
        DataType::F32,
        2,
    );
}

#[test]
fn kernel_2x2_stride_2_odd_sizes() {
    for (dims, seed) in [
        (vec![1, 3, 7, 7], 10),
        (vec![2, 17, 13, 13], 11),
        (vec![1, 3, 33, 33], 12),
        (vec![1, 5, 2, 2], 13),
    ] {
        both(&dims, &Win::k(&[2, 2]).s(&[2, 2]), seed);
    }
}

#[test]
fn kernel_3x3_stride_2_pad_1() {
    for (dims, seed) in [
        (vec![1, 3, 7, 7], 20),
        (vec![2, 17, 13, 13], 21),
        (vec![1, 3, 33, 33], 22),
        (vec![1, 4, 112, 112], 23),
    ] {
        both(&dims, &Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]), seed);
    }
}

#[test]
fn kernel_3x3_stride_1_pad_1() {
    for (dims, seed) in [
        (vec![1, 3, 7, 7], 30),
        (vec![1, 17, 13, 13], 31),
        (vec![2, 3, 33, 33], 32),
    ] {
        both(&dims, &Win::k(&[3, 3]).p(&[1, 1, 1, 1]), seed);
    }
}

#[test]
fn ceil_mode_and_count_include_pad() {
    for (dims, seed) in [
        (vec![1, 3, 13, 13], 40),
        (vec![2, 3, 7, 8], 41),
        (vec![1, 17, 33, 33], 42),
    ] {
        let w = Win::k(&[3, 3]).s(&[2, 2]).ceil();
        both(&dims, &w, seed);
        both(&dims, &w.clone().p(&[1, 1, 1, 1]), seed + 10);
        both(&dims, &w.clone().p(&[1, 1, 1, 1]).include_pad(), seed + 20);
        both(
            &dims,
            &Win::k(&[3, 3]).p(&[1, 1, 1, 1]).include_pad(),
            seed + 30,
        );
        both(
            &dims,
            &Win::k(&[2, 2]).s(&[2, 2]).ceil().include_pad(),
            seed + 40,
        );
    }
}

#[test]
fn dilation_2() {
    for (dims, seed) in [(vec![1, 3, 13, 13], 50), (vec![1, 17, 33, 33], 51)] {
        both(&dims, &Win::k(&[3, 3]).d(&[2, 2]), seed);
        both(
            &dims,
            &Win::k(&[3, 3]).d(&[2, 2]).p(&[2, 2, 2, 2]).s(&[2, 2]),
            seed + 1,
        );
        both(
            &dims,
            &Win::k(&[2, 3]).d(&[2, 3]).p(&[1, 0, 0, 2]).include_pad(),
            seed + 2,
        );
    }
}

#[test]
fn asymmetric_pads_kernels_and_strides() {
    let dims = [1, 3, 13, 17];
    both(&dims, &Win::k(&[3, 3]).p(&[0, 1, 2, 0]), 60);
    both(&dims, &Win::k(&[3, 3]).p(&[0, 1, 2, 0]).include_pad(), 61);
    both(&dims, &Win::k(&[2, 3]).s(&[1, 2]), 62);
    both(&dims, &Win::k(&[3, 2]).s(&[3, 1]).p(&[2, 0, 1, 1]), 63);
    both(&dims, &Win::k(&[5, 5]).s(&[3, 3]).p(&[2, 2, 2, 2]), 64);
    both(&dims, &Win::k(&[1, 1]).s(&[2, 2]), 65);
    both(&dims, &Win::k(&[7, 1]).s(&[1, 1]).p(&[3, 0, 3, 0]), 66);
    both(
        &dims,
        &Win::k(&[1, 9]).s(&[1, 4]).p(&[0, 4, 0, 4]).ceil(),
        67,
    );
}

#[test]
fn auto_pad_modes() {
    for (mode, seed) in [("SAME_UPPER", 70), ("SAME_LOWER", 71), ("VALID", 72)] {
        both(
            &[1, 3, 13, 13],
            &Win::k(&[3, 3]).s(&[2, 2]).auto(mode),
            seed,
        );
        both(
            &[1, 3, 8, 7],
            &Win::k(&[2, 2]).s(&[2, 2]).auto(mode),
            seed + 10,
        );
        both(
            &[1, 3, 8, 7],
            &Win::k(&[4, 4]).auto(mode).include_pad(),
            seed + 20,
        );
    }
}

#[test]
fn one_dimensional_pools() {
    both(&[2, 3, 33], &Win::k(&[3]).s(&[2]).p(&[1, 1]), 80);
    both(&[1, 17, 100], &Win::k(&[4]).s(&[3]).ceil(), 81);
    both(&[1, 1, 5000], &Win::k(&[2]).s(&[2]), 82);
}

#[test]
fn many_planes_per_tile() {
    // Small planes: many per tile, the last tile of a block overlapping the one before.
    both(
        &[8, 61, 7, 7],
        &Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]),
        90,
    );
    both(&[4, 300, 4, 4], &Win::k(&[2, 2]).s(&[2, 2]), 91);
}

#[test]
fn stride_1_copies_of_the_rows() {
    // Stride 1 loads a copy of the rows per tap, shifted; copies whose shift is not a whole
    // block get their first columns from the rows' head blocks.
    both(&[4, 300, 4, 4], &Win::k(&[3, 3]).p(&[1, 1, 1, 1]), 200);
    both(&[2, 7, 9, 9], &Win::k(&[1, 3]).p(&[0, 1, 0, 1]), 201);
    both(&[1, 3, 11, 40], &Win::k(&[5, 5]).p(&[2, 4, 2, 4]), 202);
    both(
        &[1, 3, 11, 40],
        &Win::k(&[3, 5]).d(&[1, 3]).p(&[1, 9, 1, 3]).include_pad(),
        203,
    );
    both(
        &[1, 2, 6, 20],
        &Win::k(&[2, 2]).ceil().p(&[1, 1, 0, 0]),
        204,
    );
}

#[test]
fn long_rows_fall_back_to_row_loops() {
    // Rows past 255 blocks cannot be repeats of one instruction.
    both(
        &[1, 1, 9, 3000],
        &Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]),
        210,
    );
    both(&[1, 1, 5, 3000], &Win::k(&[3, 3]).p(&[1, 1, 1, 1]), 211);
    both(&[1, 2, 3, 2100], &Win::k(&[2, 2]).s(&[1, 3]).ceil(), 212);
}

#[test]
fn windows_without_inputs() {
    // A dilated window can step over the whole input: MaxPool gives 0 (index -1) there,
    // AveragePool 0/0 (NaN), or 0 / (taps inside the pads) with count_include_pad.
    let w = Win::k(&[1, 2]).d(&[1, 5]).p(&[0, 3, 0, 3]);
    for dims in [vec![1i64, 2, 1, 1], vec![2, 3, 4, 1]] {
        both(&dims, &w, 220);
        both(&dims, &w.clone().include_pad(), 221);
    }
    let x = input(&[1, 2, 3, 1], DataType::F32, 222);
    let r = run_op_n(
        &preset(),
        "MaxPool",
        &w.attrs(false, true),
        vec![data(x.clone())],
        2,
        ExecMode::Full,
    )
    .unwrap();
    let (_, want, idx) = reference(&x, &w, false);
    assert_close(
        &f32s(&r.outputs[0]),
        &want,
        0.0,
        0.0,
        "empty MaxPool windows",
    );
    assert_eq!(
        r.outputs[1].to_i64s(),
        idx,
        "empty MaxPool windows: indices"
    );
}

#[test]
fn big_planes_go_in_bands() {
    // 300x300 f32 planes do not fit in UB twice: bands of output rows, the first and last
    // with pad rows of their own.
    let dims = [1, 2, 300, 300];
    check(
        "MaxPool",
        &dims,
        &Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]),
        DataType::F32,
        100,
    );
    check(
        "AveragePool",
        &dims,
        &Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]).include_pad(),
        DataType::F32,
        101,
    );
    check(
        "AveragePool",
        &dims,
        &Win::k(&[5, 5]).p(&[2, 2, 3, 3]).ceil(),
        DataType::F16,
        102,
    );
    check(
        "MaxPool",
        &[1, 1, 517, 300],
        &Win::k(&[3, 3]).d(&[2, 2]).p(&[3, 1, 2, 2]),
        DataType::F16,
        103,
    );
    // f16 MaxPool with an even W stride computes in f16, bands too.
    check(
        "MaxPool",
        &[1, 2, 600, 430],
        &Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]),
        DataType::F16,
        104,
    );
    check(
        "MaxPool",
        &[1, 1, 700, 300],
        &Win::k(&[4, 4]).s(&[4, 4]).p(&[3, 0, 3, 2]).ceil(),
        DataType::F16,
        105,
    );
}

#[test]
fn maxpool_indices_first_maximum_in_row_major_order() {
    for (dims, w, storage) in [
        (
            vec![1, 3, 13, 13],
            Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]),
            false,
        ),
        (vec![2, 5, 8, 8], Win::k(&[2, 2]).s(&[2, 2]), false),
        (
            vec![1, 3, 13, 11],
            Win::k(&[3, 2]).d(&[2, 1]).p(&[1, 0, 2, 1]).ceil(),
            true,
        ),
        (vec![2, 3, 33], Win::k(&[3]).s(&[2]).p(&[1, 1]), false),
        (
            vec![1, 2, 300, 300],
            Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]),
            false,
        ),
    ] {
        let w = Win {
            storage_order: storage,
            ..w
        };
        for (dtype, seed) in [(DataType::F32, 110), (DataType::F16, 111)] {
            // Values on a coarse grid, so windows hold ties and the order matters.
            let t = input(&dims, DataType::F32, seed);
            let grid: Vec<f32> = f32s(&t).iter().map(|v| (v * 4.0).round() / 4.0).collect();
            let x = Tensor::from_f32s(dims.clone(), &grid);
            let x = if dtype == DataType::F16 {
                input_from(&x, dtype)
            } else {
                x
            };
            let what = format!("MaxPool+Indices {dtype:?} {dims:?} {w:?}");
            let r: Ran = run_op_n(
                &preset(),
                "MaxPool",
                &w.attrs(false, true),
                vec![data(x.clone())],
                2,
                ExecMode::Full,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let (_, want, idx) = reference(&x, &w, false);
            assert_close(&f32s(&r.outputs[0]), &want, 0.0, 0.0, &what);
            assert_eq!(r.outputs[1].dtype, DataType::I64, "{what}");
            assert_eq!(r.outputs[1].to_i64s(), idx, "{what}: indices");
        }
    }
}

/// `t` (f32) in `dtype`.
fn input_from(t: &Tensor, dtype: DataType) -> Tensor {
    let bytes: Vec<u8> = f32s(t)
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    Tensor::new(dtype, t.dims.clone(), bytes).unwrap()
}

#[test]
fn maxpool_padding_never_wins() {
    // All inputs negative: a pad counted as 0 (or anything but -inf) would win the edges.
    let t = rand_f32(&[1, 3, 13, 13], -9.0, -1.0, 120);
    let w = Win::k(&[3, 3]).s(&[2, 2]).p(&[1, 1, 1, 1]).ceil();
    let r = run_op("MaxPool", &w.attrs(false, false), vec![data(t.clone())]).unwrap();
    let (_, want, _) = reference(&t, &w, false);
    assert!(want.iter().all(|v| *v < 0.0));
    assert_close(&f32s(&r.outputs[0]), &want, 0.0, 0.0, "negative MaxPool");
}

#[test]
fn unsupported_configurations_are_lower_errors() {
    let big = rand_f32(&[1, 1, 300_000], -1.0, 1.0, 130);
    let e = run_op(
        "MaxPool",
        &Win::k(&[3]).attrs(false, false),
        vec![data(big)],
    )
    .err()
    .unwrap();
    assert!(
        e.contains("node `node` (MaxPool)") && e.contains("unified buffer"),
        "{e}"
    );
    // 8-bit integers pool through f16 (exact for every one of them): a 2x2 window over a
    // 4x4 plane of signed bytes, extremes included.
    let bytes: Vec<i8> = (0..16).map(|i| ((i * 37) % 256 - 128) as i8).collect();
    let i8s = Tensor::new(
        DataType::I8,
        vec![1, 1, 4, 4],
        bytes.iter().map(|b| *b as u8).collect(),
    )
    .unwrap();
    let r = run_op(
        "MaxPool",
        &Win::k(&[2, 2]).attrs(false, false),
        vec![data(i8s)],
    )
    .unwrap();
    let want: Vec<i64> = (0..9)
        .map(|o| {
            let (y, x) = (o / 3, o % 3);
            [0, 1, 4, 5]
                .iter()
                .map(|d| i64::from(bytes[y * 4 + x + d]))
                .max()
                .unwrap_or(0)
        })
        .collect();
    assert_eq!(r.outputs[0].dtype, DataType::I8);
    assert_eq!(r.outputs[0].to_i64s(), want);
    let vol = rand_f32(&[1, 1, 4, 4, 4], -1.0, 1.0, 131);
    // A 3-D window runs (see `three_d_pools_match_the_direct_definition`).
    assert!(
        run_op(
            "MaxPool",
            &Win::k(&[2, 2, 2]).attrs(false, false),
            vec![data(vol)]
        )
        .is_ok()
    );
}

/// A 3-D pool runs as two 2-D passes (H·W per depth slice, then D); both the maximum and the
/// padded average are separable over a box window, so they match the direct 3-D definition.
#[test]
fn three_d_pools_match_the_direct_definition() {
    let (d, h, w) = (5usize, 6usize, 7usize);
    let vol = rand_f32(&[2, 3, d as i64, h as i64, w as i64], -1.0, 1.0, 132);
    let xs = vol.to_f64s();
    for max in [true, false] {
        let op = if max { "MaxPool" } else { "AveragePool" };
        let attrs = vec![
            ("kernel_shape", Attr::Ints(vec![3, 2, 3])),
            ("strides", Attr::Ints(vec![2, 1, 2])),
            ("pads", Attr::Ints(vec![1, 0, 1, 1, 1, 0])),
        ];
        let r = run_op(op, &attrs, vec![data(vol.clone())]).unwrap();
        let got = r.outputs[0].to_f64s();
        let (od, oh, ow) = ((d + 2 - 3) / 2 + 1, (h + 1 - 2) + 1, (w + 1 - 3) / 2 + 1);
        assert_eq!(
            r.outputs[0].dims,
            vec![2, 3, od as i64, oh as i64, ow as i64]
        );
        let mut k = 0;
        for plane in 0..6 {
            for (z, y, x) in
                (0..od).flat_map(|z| (0..oh).flat_map(move |y| (0..ow).map(move |x| (z, y, x))))
            {
                let mut taps = Vec::new();
                for (dz, dy, dx) in
                    (0..3).flat_map(|a| (0..2).flat_map(move |b| (0..3).map(move |c| (a, b, c))))
                {
                    let (iz, iy, ix) = (
                        (z * 2 + dz) as i64 - 1,
                        (y + dy) as i64,
                        (x * 2 + dx) as i64 - 1,
                    );
                    if iz < 0 || iy >= h as i64 || ix < 0 || iz >= d as i64 || ix >= w as i64 {
                        continue;
                    }
                    taps.push(xs[((plane * d + iz as usize) * h + iy as usize) * w + ix as usize]);
                }
                let want = if max {
                    taps.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                } else {
                    taps.iter().sum::<f64>() / taps.len() as f64
                };
                assert!(
                    (got[k] - want).abs() <= 1e-5 + 1e-5 * want.abs(),
                    "{op} at {k}: {} vs {want}",
                    got[k]
                );
                k += 1;
            }
        }
    }
}

#[test]
fn identity_window_is_an_alias() {
    let t = rand_f32(&[1, 3, 5, 5], -1.0, 1.0, 140);
    let r = run_op(
        "MaxPool",
        &Win::k(&[1, 1]).attrs(false, false),
        vec![data(t.clone())],
    )
    .unwrap();
    assert!(r.kernels.is_empty());
    assert_eq!(f32s(&r.outputs[0]), f32s(&t));
}

// ---- GlobalAveragePool ------------------------------------------------------------------------

fn check_gap(dims: &[i64], dtype: DataType, seed: u64) {
    let x = input(dims, dtype, seed);
    let what = format!("GlobalAveragePool {dtype:?} {dims:?}");
    let r = run_op("GlobalAveragePool", &[], vec![data(x.clone())])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let plane: i64 = dims[2..].iter().product();
    let xv = x.to_f64s();
    let want: Vec<f64> = xv
        .chunks(plane as usize)
        .map(|c| c.iter().sum::<f64>() / plane as f64)
        .collect();
    let mut out_dims = dims[..2].to_vec();
    out_dims.resize(dims.len(), 1);
    assert_eq!(r.outputs[0].dims, out_dims, "{what}");
    let (rtol, atol) = if dtype == DataType::F16 {
        (1e-3, 1e-5)
    } else {
        (1e-4, 1e-6)
    };
    assert_close(&f32s(&r.outputs[0]), &want, rtol, atol, &what);
}

#[test]
fn global_average_pool_model_shapes() {
    // cnn.onnx: [N, 32, 8, 8]; gear_image.onnx: [1, 4, H/2, W/2] for images 16x16 and 32x24.
    check_gap(&[2, 32, 8, 8], DataType::F32, 150);
    check_gap(&[1, 4, 8, 8], DataType::F32, 151);
    check_gap(&[1, 4, 16, 12], DataType::F32, 152);
}

#[test]
fn global_average_pool_odd_and_big_planes() {
    for (dims, seed) in [
        (vec![2, 17, 7, 7], 160),
        (vec![1, 3, 13, 13], 161),
        (vec![1, 3, 33, 33], 162),
        (vec![2, 64, 56, 56], 163),
        (vec![8, 512, 7, 7], 164),
        (vec![1, 5, 999], 165),
        (vec![1, 2, 3, 5, 7], 166),
    ] {
        check_gap(&dims, DataType::F32, seed);
        check_gap(&dims, DataType::F16, seed + 100);
    }
}

#[test]
fn global_average_pool_split_planes() {
    // Planes too big for UB, and too few planes for the cores: segments, then their mean.
    check_gap(&[1, 2, 300, 300], DataType::F32, 170);
    check_gap(&[1, 1, 257, 263], DataType::F16, 171);
    check_gap(&[1, 3, 100, 101], DataType::F32, 172);
}

// ---- throughput -------------------------------------------------------------------------------

/// Bytes in and out per cycle of a timing-only run (ascend910: 1 GHz, 1000 ps per cycle),
/// and the cycles.
fn rate(op: &str, dims: &[i64], attrs: &[(&str, Attr)], dtype: DataType) -> (f64, u64) {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let n: i64 = dims.iter().product();
    let esz = if dtype == DataType::F16 { 2 } else { 4 };
    let x = Tensor::new(dtype, dims.to_vec(), vec![0; (n * esz) as usize]).unwrap();
    let r = run_op_n(&cfg, op, attrs, vec![data(x)], 1, ExecMode::TimingOnly).unwrap();
    let moved = (n * esz) as u64 + r.outputs[0].data.len() as u64;
    let ps: u64 = r.launches.iter().map(|l| l.end.0 - l.first_start.0).sum();
    let cycles = ps / 1000;
    (moved as f64 / cycles as f64, cycles)
}

/// The rates of the big pools, against floors as fractions of the 1200 B/cycle of HBM.
/// Blocks are dispatched 100 ns apart, so a kernel of a few MB (the N = 8 shapes) spends
/// about 3k of its cycles waiting for its last block; the N = 32 shapes show the steady
/// state.
#[test]
fn big_pools_stream_near_the_hbm_rate() {
    let k2 = Win::k(&[2, 2]).s(&[2, 2]).attrs(false, false);
    let k3 = Win::k(&[3, 3])
        .s(&[2, 2])
        .p(&[1, 1, 1, 1])
        .attrs(false, false);
    let a3 = Win::k(&[3, 3]).p(&[1, 1, 1, 1]).attrs(true, false);
    let m3 = Win::k(&[3, 3]).p(&[1, 1, 1, 1]).attrs(false, false);
    let (f32_, f16_) = (DataType::F32, DataType::F16);
    let gap = "GlobalAveragePool";
    // (op, input dims, attributes, type, floor as a fraction of 1200 B/cycle)
    type Case<'a> = (&'a str, Vec<i64>, &'a [(&'a str, Attr)], DataType, f64);
    let cases: Vec<Case> = vec![
        ("MaxPool", vec![32, 64, 112, 112], &k2, f32_, 0.85),
        ("MaxPool", vec![32, 64, 112, 112], &k3, f32_, 0.6),
        ("MaxPool", vec![32, 64, 112, 112], &k3, f16_, 0.5),
        ("AveragePool", vec![32, 64, 56, 56], &a3, f32_, 0.65),
        ("AveragePool", vec![32, 64, 56, 56], &a3, f16_, 0.25),
        ("MaxPool", vec![32, 64, 56, 56], &m3, f32_, 0.65),
        (gap, vec![32, 64, 56, 56], &[], f32_, 0.75),
        (gap, vec![32, 64, 56, 56], &[], f16_, 0.6),
        (gap, vec![64, 512, 7, 7], &[], f32_, 0.45),
        ("MaxPool", vec![8, 64, 112, 112], &k2, f32_, 0.7),
        ("MaxPool", vec![8, 64, 112, 112], &k3, f32_, 0.5),
        (gap, vec![8, 64, 56, 56], &[], f32_, 0.5),
        (gap, vec![8, 512, 7, 7], &[], f32_, 0.1),
    ];
    let mut slow = Vec::new();
    for (op, dims, attrs, dtype, floor) in cases {
        let (r, cycles) = rate(op, &dims, attrs, dtype);
        let line = format!("{op} {dtype:?} {dims:?}: {r:.0} B/cycle ({cycles} cycles)");
        println!("{line}");
        if r < floor * 1200.0 {
            slow.push(line);
        }
    }
    assert!(slow.is_empty(), "below their floors: {slow:#?}");
}

/// A stride past the padded input (ONNX allows it) gives the single window a stride equal to
/// it gives, in every padding mode.
#[test]
fn stride_past_the_padded_input_is_one_window() {
    both(
        &[1, 3, 3, 3],
        &Win::k(&[2, 2]).s(&[9, 9]).p(&[1, 0, 0, 1]),
        90,
    );
    both(&[2, 5, 4, 6], &Win::k(&[3, 2]).s(&[5, 1 << 20]), 91);
    both(
        &[1, 3, 3, 3],
        &Win::k(&[2, 2]).s(&[100, 100]).auto("SAME_UPPER"),
        92,
    );
}
