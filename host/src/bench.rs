//! `gearsim bench kernels`: how close the lowered kernels come to the simulated chip's limits on
//! the reference workloads (a large fp16 MatMul and a ResNet 3×3 convolution against the cube
//! peak, a large element-wise Add against the HBM bandwidth). Each runs in timing-only mode on
//! a fresh device; the time is from the first block's start to the last block's end over all
//! of the op's kernels.

use gearsim_sim::{ChipConfig, ExecMode};

use crate::compiler::ir::{Attr, DataType, Tensor};
use crate::oprun::{In, run_op};

/// One figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Workload.
    pub name: String,
    /// Kernels launched.
    pub kernels: usize,
    /// Core cycles from the first block's start to the last block's end.
    pub cycles: f64,
    /// What was achieved, in `unit`.
    pub achieved: f64,
    /// The chip's limit, in `unit`.
    pub peak: f64,
    /// The unit (`MAC/cycle`, `B/cycle`).
    pub unit: &'static str,
    /// The target the issue sets, as a fraction of the peak.
    pub target: f64,
}

impl Figure {
    /// Achieved over peak.
    pub fn efficiency(&self) -> f64 {
        self.achieved / self.peak
    }
}

fn zeros(dtype: DataType, dims: &[i64]) -> Tensor {
    let n: i64 = dims.iter().product();
    Tensor {
        dtype,
        dims: dims.to_vec(),
        data: std::sync::Arc::new(vec![0u8; n as usize * dtype.size()]),
    }
}

/// Runs one op in timing-only mode: its kernels and cycles.
fn time_op(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: Vec<In>,
) -> Result<(usize, f64), String> {
    let r = run_op(cfg, op, attrs, inputs, 1, ExecMode::TimingOnly)?;
    let first = r
        .launches
        .iter()
        .map(|l| l.first_start.0)
        .min()
        .unwrap_or(0);
    let last = r.launches.iter().map(|l| l.end.0).max().unwrap_or(0);
    let ps_per_cycle = 1e6 / cfg.core.clock_mhz as f64;
    Ok((r.launches.len(), (last - first) as f64 / ps_per_cycle))
}

/// A reference workload.
pub struct Workload {
    /// Its name.
    pub name: &'static str,
    /// Runs it.
    pub run: fn(&ChipConfig) -> Result<Figure, String>,
}

/// The three reference workloads.
pub const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "matmul",
        run: matmul,
    },
    Workload {
        name: "conv",
        run: conv,
    },
    Workload {
        name: "add",
        run: add,
    },
];

/// Multiply-accumulates per cycle of the whole chip's cubes: one 16x16x16 fractal per
/// `cycles_per_fractal` cycles per core.
fn cube_peak(cfg: &ChipConfig) -> f64 {
    f64::from(cfg.core.count) * 4096.0 / cfg.cube.cycles_per_fractal as f64
}

/// A 2048x2048x2048 f16 MatMul against the cube peak.
pub fn matmul(cfg: &ChipConfig) -> Result<Figure, String> {
    let n = 2048i64;
    let (k, cycles) = time_op(
        cfg,
        "MatMul",
        &[],
        vec![
            crate::oprun::data(zeros(DataType::F16, &[n, n])),
            crate::oprun::data(zeros(DataType::F16, &[n, n])),
        ],
    )?;
    Ok(Figure {
        name: format!("MatMul f16 {n}x{n}x{n}"),
        kernels: k,
        cycles,
        achieved: (n * n * n) as f64 / cycles,
        peak: cube_peak(cfg),
        unit: "MAC/cycle",
        target: 0.85,
    })
}

/// A ResNet 3x3 convolution (8x64x56x56 -> 64, pad 1) against the cube peak.
pub fn conv(cfg: &ChipConfig) -> Result<Figure, String> {
    let (bn, c, hw) = (8i64, 64i64, 56i64);
    let (k, cycles) = time_op(
        cfg,
        "Conv",
        &[
            ("kernel_shape", Attr::Ints(vec![3, 3])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ],
        vec![
            crate::oprun::data(zeros(DataType::F16, &[bn, c, hw, hw])),
            crate::oprun::constant(zeros(DataType::F16, &[c, c, 3, 3])),
        ],
    )?;
    let macs = (bn * c * hw * hw * c * 9) as f64;
    Ok(Figure {
        name: format!("Conv f16 3x3 {bn}x{c}x{hw}x{hw} -> {c}"),
        kernels: k,
        cycles,
        achieved: macs / cycles,
        peak: cube_peak(cfg),
        unit: "MAC/cycle",
        target: 0.60,
    })
}

/// An element-wise f32 Add over 64 MiB operands against the HBM bandwidth.
pub fn add(cfg: &ChipConfig) -> Result<Figure, String> {
    let hbm = cfg.memory.hbm_bytes_per_second as f64 / (cfg.core.clock_mhz as f64 * 1e6);
    let elems = 16 * 1024 * 1024i64;
    let (k, cycles) = time_op(
        cfg,
        "Add",
        &[],
        vec![
            crate::oprun::data(zeros(DataType::F32, &[elems])),
            crate::oprun::data(zeros(DataType::F32, &[elems])),
        ],
    )?;
    Ok(Figure {
        name: "Add f32 64 MiB + 64 MiB".into(),
        kernels: k,
        cycles,
        achieved: (3 * elems * 4) as f64 / cycles,
        peak: hbm,
        unit: "B/cycle",
        target: 0.90,
    })
}

/// One CNN gear's runtime figures.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeFigure {
    /// The batch.
    pub batch: i64,
    /// Path and mode (`non-sink`, `non-sink, no merge`, `sink`, `dynamic (first)`, ...).
    pub what: String,
    /// Simulated device time, in microseconds.
    pub device_us: f64,
    /// Host-to-device transfers and bytes.
    pub h2d: (u64, u64),
    /// Device-to-host transfers and bytes.
    pub d2h: (u64, u64),
}

/// The built-in CNN (dynamic batch 1, 4, 8) at every gear: non-sink with and without the
/// merged H2D copy, sink, and the hybrid dynamic path (first run and cached) against the gear
/// path; plus batch 3, which is no gear, on the dynamic path.
pub fn runtime_figures(cfg: &ChipConfig) -> Result<Vec<RuntimeFigure>, String> {
    use crate::compiler::options::GearOptions;
    use crate::compiler::pipeline::{CompileOptions, compile};
    use crate::runtime::{RunReport, Runtime, RuntimeOptions};
    let compile_for = |sink: bool| -> Result<Vec<u8>, String> {
        let opts = CompileOptions {
            gear: GearOptions {
                input_shape: Some("input:-1,3,32,32".into()),
                dynamic_batch_size: Some("1,4,8".into()),
                ..GearOptions::default()
            },
            getnext_sink: sink,
            table_layout: Default::default(),
            mapindex_engine: Default::default(),
            target: crate::atc::target(cfg),
        };
        let c = compile(crate::demo::CNN, "cnn.onnx", &opts).map_err(|e| e.to_string())?;
        if sink {
            c.om_bytes()
        } else {
            c.hybrid_om_bytes()
        }
    };
    let (plain, sink) = (compile_for(false)?, compile_for(true)?);
    let runtime = |fusion: i64| {
        Runtime::new(
            cfg.clone(),
            gearsim_traces::NullSink,
            RuntimeOptions {
                input_fusion_size: fusion,
                ..RuntimeOptions::default()
            },
        )
        .map_err(|e| e.to_string())
    };
    let mut merged = runtime(crate::runtime::session::DEFAULT_INPUT_FUSION_SIZE)?;
    let mut unmerged = runtime(0)?;
    let err = |e: crate::runtime::RuntimeError| e.to_string();
    let m_plain = merged.load(&plain).map_err(err)?;
    let m_sink = merged.load(&sink).map_err(err)?;
    let u_plain = unmerged.load(&plain).map_err(err)?;
    let fig = |batch: i64, what: &str, r: &RunReport| RuntimeFigure {
        batch,
        what: what.into(),
        device_us: r.device_time_ps as f64 / 1e6,
        h2d: (r.h2d_transfers, r.h2d_bytes),
        d2h: (r.d2h_transfers, r.d2h_bytes),
    };
    let mut out = Vec::new();
    for batch in [1i64, 4, 8, 3] {
        let x = vec![zeros(DataType::F32, &[batch, 3, 32, 32])];
        if batch != 3 {
            out.push(fig(
                batch,
                "non-sink (gear)",
                &merged.run(m_plain, &x).map_err(err)?,
            ));
            out.push(fig(
                batch,
                "non-sink, merge off",
                &unmerged.run(u_plain, &x).map_err(err)?,
            ));
            out.push(fig(
                batch,
                "sink (gear)",
                &merged.run_sink(m_sink, &x).map_err(err)?,
            ));
        }
        out.push(fig(
            batch,
            "dynamic path",
            &merged.run_dynamic_path(m_plain, &x).map_err(err)?,
        ));
        out.push(fig(
            batch,
            "dynamic path, cached",
            &merged.run_dynamic_path(m_plain, &x).map_err(err)?,
        ));
    }
    Ok(out)
}
