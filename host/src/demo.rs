//! `gearsim demo`: the project's main job on built-in models. It compiles a small CNN for
//! dynamic batch 1, 4 and 8 and the seed's three-input model for dynamic dims, each for
//! non-sink (hybrid) and GetNext sink mode, runs every gear in both modes and checks that the
//! outputs are bit-identical and `cur_dynamic_dims` is the gear, runs one shape that matches no
//! gear through the hybrid dynamic path and checks it against the reference evaluator, and
//! prints one table row per run.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow, bail};
use gearsim_sim::ChipConfig;
use gearsim_traces::TraceSink;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::runtime::{ModelId, RunReport, Runtime, RuntimeOptions};
use crate::target;
use gearsim_compiler::eval::eval_model;
use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::onnx;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, compile};

/// The CNN of the demo (conv, batch norm, residual, depthwise, pooling, Gemm).
pub const CNN: &[u8] = include_bytes!("../../tests/models/cnn.onnx");
/// The seed's `--dynamic_dims` example: data [1,1,40,T], label [1,L], mask [M,K].
pub const SEED: &[u8] = include_bytes!("../../tests/models/gear_dims.onnx");

/// One demo model.
struct Case {
    name: &'static str,
    onnx: &'static [u8],
    gear: GearOptions,
    /// Input shapes for a gear vector.
    shapes: fn(&[i64]) -> Vec<Vec<i64>>,
    /// A gear vector that is no gear.
    unmatched: Vec<i64>,
    /// Relative tolerance of the dynamic path against the reference (as a fraction of the
    /// output's largest magnitude): the models are compiled with atc's default precision
    /// mode, `force_fp16`, so both paths compute the fp32 models in fp16.
    tolerance: f64,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "cnn",
            onnx: CNN,
            gear: GearOptions {
                input_shape: Some("input:-1,3,32,32".into()),
                dynamic_batch_size: Some("1,4,8".into()),
                ..GearOptions::default()
            },
            shapes: |g| vec![vec![g[0], 3, 32, 32]],
            unmatched: vec![3],
            tolerance: 2e-2,
        },
        Case {
            name: "seed_dims",
            onnx: SEED,
            gear: GearOptions {
                input_shape: Some("data:1,1,40,-1;label:1,-1;mask:-1,-1".into()),
                dynamic_dims: Some("20,20,1,1;40,40,2,2;80,60,4,4".into()),
                ..GearOptions::default()
            },
            shapes: |g| vec![vec![1, 1, 40, g[0]], vec![1, g[1]], vec![g[2], g[3]]],
            unmatched: vec![33, 7, 3, 5],
            // Element-wise ops in fp16: a few roundings of 2^-11.
            tolerance: 2e-3,
        },
    ]
}

/// One row of the demo's table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Model.
    pub model: String,
    /// `nonsink`, `sink` or `hybrid`.
    pub mode: &'static str,
    /// The gear vector.
    pub dims: Vec<i64>,
    /// What ran.
    pub report: RunReport,
    /// What was checked.
    pub check: String,
}

fn random_inputs(
    desc: &gearsim_isa::om::ModelDesc,
    shapes: &[Vec<i64>],
    seed: u64,
) -> Result<Vec<Tensor>> {
    let mut rng = StdRng::seed_from_u64(seed);
    shapes
        .iter()
        .zip(&desc.inputs)
        .map(|(dims, io)| {
            let dtype = crate::runtime::session::io_type(io)?;
            let n: i64 = dims.iter().product();
            let data: Vec<u8> = match dtype {
                DataType::F32 => (0..n)
                    .flat_map(|_| rng.random_range(-1.0f32..1.0).to_le_bytes())
                    .collect(),
                DataType::I32 => (0..n)
                    .flat_map(|_| rng.random_range(-100i32..100).to_le_bytes())
                    .collect(),
                t => bail!("the demo feeds f32 and i32 inputs, not {}", t.name()),
            };
            Tensor::new(dtype, dims.clone(), data).map_err(|e| anyhow!(e))
        })
        .collect()
}

fn compile_case(c: &Case, cfg: &ChipConfig, sink: bool) -> Result<Vec<u8>> {
    let opts = CompileOptions {
        gear: c.gear.clone(),
        getnext_sink: sink,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: Default::default(),
        target: target::for_chip(cfg),
    };
    let compiled = compile(c.onnx, &format!("{}.onnx", c.name), &opts)?;
    let bytes = if sink {
        compiled.om_bytes()
    } else {
        compiled.hybrid_om_bytes()
    };
    bytes.map_err(|e| anyhow!(e))
}

/// Runs the demo on `cfg`, tracing into `sink`; `row` is called as each run finishes.
pub fn run<S: TraceSink>(
    cfg: &ChipConfig,
    sink: S,
    row: &mut dyn FnMut(&Row),
) -> Result<(Vec<Row>, S)> {
    let mut rt = Runtime::new(cfg.clone(), sink, RuntimeOptions::default())?;
    let mut rows = Vec::new();
    let mut push = |r: Row, rows: &mut Vec<Row>| {
        row(&r);
        rows.push(r);
    };
    for (k, c) in cases().iter().enumerate() {
        let plain: ModelId = rt.load(&compile_case(c, cfg, false)?)?;
        let sink: ModelId = rt.load(&compile_case(c, cfg, true)?)?;
        let desc = rt.desc(plain)?.clone();
        let gears = desc
            .dynamic
            .as_ref()
            .map(|d| d.gears.clone())
            .unwrap_or_default();
        for (g, dims) in gears.iter().enumerate() {
            let x = random_inputs(&desc, &(c.shapes)(dims), 100 * k as u64 + g as u64)?;
            let a = rt.run(plain, &x)?;
            let b = rt.run_sink(sink, &x)?;
            for (mode, r) in [("non-sink", &a), ("sink", &b)] {
                if r.gear != Some(g) || &r.cur_dynamic_dims != dims {
                    bail!(
                        "{} {mode}: gear {g} {dims:?} ran as gear {:?} with cur_dynamic_dims {:?}",
                        c.name,
                        r.gear,
                        r.cur_dynamic_dims
                    );
                }
            }
            for (o, (p, q)) in a.outputs.iter().zip(&b.outputs).enumerate() {
                if p.dims != q.dims || p.data != q.data {
                    bail!(
                        "{} gear {dims:?}: output {o} differs between non-sink and sink",
                        c.name
                    );
                }
            }
            let check = format!("{} outputs bit-identical", a.outputs.len());
            push(
                Row {
                    model: c.name.into(),
                    mode: "nonsink",
                    dims: dims.clone(),
                    report: a,
                    check: check.clone(),
                },
                &mut rows,
            );
            push(
                Row {
                    model: c.name.into(),
                    mode: "sink",
                    dims: dims.clone(),
                    report: b,
                    check,
                },
                &mut rows,
            );
        }
        // One shape that matches no gear: the hybrid dynamic path, against the evaluator.
        let x = random_inputs(&desc, &(c.shapes)(&c.unmatched), 999)?;
        let r = rt.run(plain, &x)?;
        let source = onnx::import(c.onnx, c.name)?.model;
        let feeds: BTreeMap<String, Tensor> = desc
            .inputs
            .iter()
            .map(|i| i.name.clone())
            .zip(x.iter().cloned())
            .collect();
        let want = eval_model(&source, &feeds)?;
        let mut worst = 0f64;
        for (o, (got, w)) in r.outputs.iter().zip(&want).enumerate() {
            if got.dims != w.dims {
                bail!(
                    "{} hybrid: output {o} has shape {:?}, expected {:?}",
                    c.name,
                    got.dims,
                    w.dims
                );
            }
            let (g, w) = (got.to_f64s(), w.to_f64s());
            let scale = w.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
            for (a, b) in g.iter().zip(&w) {
                worst = worst.max((a - b).abs() / scale);
            }
        }
        if worst > c.tolerance {
            bail!(
                "{} hybrid: outputs differ from the reference by {worst:.2e} of their magnitude \
                 (tolerance {:.0e})",
                c.name,
                c.tolerance
            );
        }
        push(
            Row {
                model: c.name.into(),
                mode: "hybrid",
                dims: c.unmatched.clone(),
                report: r,
                check: format!("matches the reference ({worst:.1e})"),
            },
            &mut rows,
        );
    }
    Ok((rows, rt.into_sink()))
}

/// The table header.
pub fn header() -> String {
    format!(
        "{:<10} {:<8} {:<14} {:<8} {:>10} {:>10} {:>10} {:>14} {:>14}  {}",
        "model",
        "mode",
        "dims",
        "path",
        "device us",
        "host us",
        "e2e us",
        "H2D B (n)",
        "D2H B (n)",
        "check"
    )
}

impl Row {
    /// The table row.
    pub fn line(&self) -> String {
        let r = &self.report;
        let dims = self
            .dims
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "{:<10} {:<8} {:<14} {:<8} {:>10.1} {:>10.1} {:>10.1} {:>14} {:>14}  {}",
            self.model,
            self.mode,
            dims,
            r.path.name(),
            r.device_time_ps as f64 / 1e6,
            r.host_ps as f64 / 1e6,
            r.end_to_end_ps as f64 / 1e6,
            format!("{} ({})", r.h2d_bytes, r.h2d_transfers),
            format!("{} ({})", r.d2h_bytes, r.d2h_transfers),
            self.check
        )
    }
}
