//! Shared pieces of the lowering tests: the one-node runner on the default chip, random inputs
//! and tolerance checks.

use gearsim_compiler::ir::{Attr, Tensor};
#[allow(unused_imports)]
pub use gearsim_host::oprun::{In, Ran, constant, data};
use gearsim_sim::{ChipConfig, ExecMode};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// The preset the lowering tests use.
pub fn preset() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

/// Lowers `op` over `inputs` and runs it (one output, full mode) on `ascend910`.
pub fn run_op(op: &str, attrs: &[(&str, Attr)], inputs: Vec<In>) -> Result<Ran, String> {
    gearsim_host::oprun::run_op(&preset(), op, attrs, inputs, 1, ExecMode::Full)
}

/// Random f32 values in [lo, hi) from a seed.
pub fn rand_f32(dims: &[i64], lo: f32, hi: f32, seed: u64) -> Tensor {
    let n: i64 = dims.iter().product();
    let mut rng = StdRng::seed_from_u64(seed);
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
    Tensor::from_f32s(dims.to_vec(), &v)
}

/// The f32 values of a tensor.
pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_f64s().iter().map(|v| *v as f32).collect()
}

/// Checks `got` against `want` element by element: |got - want| <= atol + rtol * |want|, with
/// NaN only where NaN is expected.
pub fn assert_close(got: &[f32], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: element count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(*g);
        if w.is_nan() && g.is_nan() {
            continue;
        }
        let err = (g - w).abs();
        let bound = atol + rtol * w.abs();
        let ok = err.partial_cmp(&bound).is_some_and(|o| o.is_le());
        assert!(
            ok,
            "{what}: element {i} of {} is {g}, expected {w} (error {err:.3e} > bound {bound:.3e})",
            got.len()
        );
    }
}

/// The demo CNN's compile options for dynamic batch 1 and 2 on `cfg` with the given fusion
/// switches and precision mode (the fusion and precision tests compare these).
pub fn cnn_options(
    cfg: &ChipConfig,
    fusion: gearsim_compiler::fusion::FusionSwitches,
    precision: gearsim_compiler::precision::PrecisionMode,
) -> gearsim_compiler::pipeline::CompileOptions {
    gearsim_compiler::pipeline::CompileOptions {
        gear: gearsim_compiler::options::GearOptions {
            input_shape: Some("input:-1,3,32,32".into()),
            dynamic_batch_size: Some("1,2".into()),
            ..Default::default()
        },
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion,
        precision,
        target: gearsim_host::atc::target(cfg),
    }
}

/// A deterministic fp32 input of the demo CNN at batch 2, values in [-2, 2.2].
pub fn cnn_input() -> Tensor {
    let data: Vec<u8> = (0..2 * 3 * 32 * 32)
        .flat_map(|i| (((i * 7919) % 211) as f32 / 50.0 - 2.0).to_le_bytes())
        .collect();
    Tensor::new(
        gearsim_compiler::ir::DataType::F32,
        vec![2, 3, 32, 32],
        data,
    )
    .unwrap()
}

/// Compiles `onnx` (an image network taking f16 `[batch, 3, 224, 224]`) with `opts` and runs it
/// once timing-only with profiles on `cfg`, on an all-zero image.
pub fn run_image_net_timing_only(
    cfg: &ChipConfig,
    onnx: &[u8],
    opts: &gearsim_compiler::pipeline::CompileOptions,
    batch: i64,
) -> gearsim_host::runtime::RunReport {
    let om = gearsim_compiler::pipeline::compile(onnx, "net.onnx", opts)
        .unwrap()
        .om_bytes()
        .unwrap();
    let mut rt = gearsim_host::runtime::Runtime::new(
        cfg.clone(),
        gearsim_traces::NullSink,
        gearsim_host::runtime::RuntimeOptions {
            exec_mode: ExecMode::TimingOnly,
            profile: true,
            ..Default::default()
        },
    )
    .unwrap();
    let m = rt.load(&om).unwrap();
    let pixels = (batch * 3 * 224 * 224) as usize;
    let x = Tensor::new(
        gearsim_compiler::ir::DataType::F16,
        vec![batch, 3, 224, 224],
        vec![0; pixels * 2],
    )
    .unwrap();
    rt.run(m, &[x]).unwrap()
}
