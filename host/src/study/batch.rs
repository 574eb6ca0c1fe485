//! The batch study (`gearsim study batch`): a network's simulated device time at every batch
//! size on one chip, where no public measurement exists to calibrate against — the table is
//! the prediction others can check on hardware.
//!
//! ```text
//!  nets × batches ──parallel_map──▶ calibrate::run_workload (timing-only, second execution)
//!      ──▶ Row (time, per item, throughput, cube / MTE2 share, HBM bytes)
//!      ──▶ batch.csv + batch.svg (time per item against batch, a panel per network) + table
//! ```
//!
//! Each point builds the network the calibration table uses (`calibrate::nets`, seeded random
//! weights, fp32 as exported), compiles it with atc's default precision mode (`force_fp16`)
//! and runs it twice timing-only; the second execution is reported, as ais_bench reports the
//! runs after its warm-up.

use std::fmt::Write as _;

use gearsim_compiler::memory::BufferOptimize;
use gearsim_compiler::precision::PrecisionMode;
use gearsim_isa::Pipe;
use gearsim_sim::ChipConfig;

use super::svg::{Figure, Panel, Series, render};
use super::{StudyError, parallel_map};
use crate::calibrate::nets::Net;
use crate::calibrate::{Workload, busy_share, run_workload};

/// The CSV header of `batch.csv`.
pub const CSV_HEADER: &str = "net,chip,batch,precision,device_us,us_per_item,items_per_second,\
kernels,cube_busy,mte2_busy,hbm_mb,macs_per_item";

/// The batches swept when none are given.
pub const DEFAULT_BATCHES: [i64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// One (network, batch) point.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The network.
    pub net: Net,
    /// The chip preset (its `name`).
    pub chip: String,
    /// Images or sequences per execution.
    pub batch: i64,
    /// atc precision mode.
    pub precision: PrecisionMode,
    /// Device time of one execution, microseconds.
    pub device_us: f64,
    /// Kernels launched.
    pub kernels: usize,
    /// Cube busy cycles over the cube cores' cycles of the execution.
    pub cube_busy: f64,
    /// MTE2 busy cycles over the cycles of the cores that have an MTE2 (every core).
    pub mte2_busy: f64,
    /// Bytes read from and written to HBM, MB.
    pub hbm_mb: f64,
}

impl Row {
    /// Device time per image (sequence), microseconds.
    pub fn us_per_item(&self) -> f64 {
        self.device_us / self.batch as f64
    }

    /// Images (sequences) per second: ais_bench's throughput, 1e6 · batch / device time.
    pub fn items_per_second(&self) -> f64 {
        1e6 * self.batch as f64 / self.device_us
    }
}

/// Runs every (net, batch) point on `cfg` with `threads` host threads; rows in (net, batch)
/// order whatever the thread count. `done` sees each finished point (for progress).
pub fn run(
    cfg: &ChipConfig,
    nets: &[Net],
    batches: &[i64],
    precision: PrecisionMode,
    threads: usize,
    done: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<Row>, StudyError> {
    if nets.is_empty() || batches.is_empty() {
        return Err(StudyError::Options(
            "the batch study needs at least one network and one batch".into(),
        ));
    }
    if let Some(b) = batches.iter().find(|b| **b < 1) {
        return Err(StudyError::Options(format!(
            "--batches: expected positive batch sizes, got {b}"
        )));
    }
    let points: Vec<(Net, i64)> = nets
        .iter()
        .flat_map(|n| batches.iter().map(move |b| (*n, *b)))
        .collect();
    let total = points.len();
    let results = parallel_map(
        &points,
        threads,
        |&(net, batch)| {
            let w = Workload {
                net,
                batch,
                precision,
                aipp: false,
                small_channel: false,
            };
            run_workload(&w, cfg, BufferOptimize::default()).map(|r| (net, batch, r))
        },
        |i, _| done(i, total),
    );
    let mut rows = Vec::with_capacity(total);
    for (point, r) in results.into_iter().enumerate() {
        let (net, batch, run) = r.map_err(|message| StudyError::Run {
            point,
            what: format!("{} batch {}", points[point].0.name(), points[point].1),
            message,
        })?;
        let share = |pipe: Pipe| {
            let busy = run
                .kernels
                .iter()
                .map(|k| k.work.pipe(pipe).busy_cycles)
                .sum();
            busy_share(busy, pipe, run.execute_us * 1e6, cfg)
        };
        rows.push(Row {
            net,
            chip: cfg.name.clone(),
            batch,
            precision,
            device_us: run.execute_us,
            kernels: run.kernels.len(),
            cube_busy: share(Pipe::M),
            mte2_busy: share(Pipe::Mte2),
            hbm_mb: run
                .kernels
                .iter()
                .map(|k| k.traffic.hbm_bytes() as f64)
                .sum::<f64>()
                / 1e6,
        });
    }
    Ok(rows)
}

/// The rows as `batch.csv`.
pub fn csv(rows: &[Row]) -> String {
    let mut o = format!("{CSV_HEADER}\n");
    for r in rows {
        let _ = writeln!(
            o,
            "{},{},{},{},{:.1},{:.2},{:.1},{},{:.4},{:.4},{:.2},{}",
            r.net.name(),
            r.chip,
            r.batch,
            r.precision.name(),
            r.device_us,
            r.us_per_item(),
            r.items_per_second(),
            r.kernels,
            r.cube_busy,
            r.mte2_busy,
            r.hbm_mb,
            r.net.macs_per_image()
        );
    }
    o
}

/// The rows as the table `gearsim study batch` prints.
pub fn table(rows: &[Row]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<10} {:<12} {:>5} {:>11} {:>10} {:>10} {:>7} {:>6} {:>6} {:>9}",
        "net",
        "chip",
        "batch",
        "device_us",
        "us/item",
        "items/s",
        "kernels",
        "cube%",
        "mte2%",
        "hbm_MB"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "{:<10} {:<12} {:>5} {:>11.1} {:>10.2} {:>10.1} {:>7} {:>5.1}% {:>5.1}% {:>9.1}",
            r.net.name(),
            r.chip,
            r.batch,
            r.device_us,
            r.us_per_item(),
            r.items_per_second(),
            r.kernels,
            100.0 * r.cube_busy,
            100.0 * r.mte2_busy,
            r.hbm_mb
        );
    }
    o
}

/// The figure: device time per item against batch on log axes, one panel per network, with
/// the whole execution's time dashed beside it.
pub fn svg(rows: &[Row]) -> String {
    let mut nets: Vec<Net> = rows.iter().map(|r| r.net).collect();
    nets.dedup();
    let chip = rows.first().map_or(String::new(), |r| r.chip.clone());
    let panels = nets
        .iter()
        .map(|net| {
            let of = |f: &dyn Fn(&Row) -> f64| -> Vec<(f64, f64)> {
                rows.iter()
                    .filter(|r| r.net == *net)
                    .map(|r| (r.batch as f64, f(r)))
                    .collect()
            };
            Panel {
                title: net.name(),
                y_label: None,
                series: vec![
                    Series {
                        label: "device us per item".into(),
                        color: "#1f77b4".into(),
                        dashed: false,
                        points: of(&Row::us_per_item),
                    },
                    Series {
                        label: "device us per execution".into(),
                        color: "#d62728".into(),
                        dashed: true,
                        points: of(&|r| r.device_us),
                    },
                ],
            }
        })
        .collect();
    render(&Figure {
        title: format!("gearsim study batch: device time against batch on {chip}"),
        subtitle: "timing-only, the execution after a warm-up run; fp32 models compiled with \
                   the precision mode shown in batch.csv"
            .into(),
        x_label: "batch".into(),
        y_label: "device time (us)".into(),
        columns: nets.len().clamp(1, 3),
        panels,
        shared_y: false,
        x_log_ticks: false,
        mark: None,
    })
}
