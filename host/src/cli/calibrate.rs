//! `gearsim calibrate`: every calibration target simulated on its preset and compared with
//! its published measurement; prints the table and a summary, and writes the CSV and the
//! SVG figure when asked.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use gearsim_traces::atomic::write_atomic;

use super::Failure;
use super::flags::parse_setting;
use gearsim_compiler::memory::BufferOptimize;
use gearsim_host::calibrate::{
    ChipOverride, Row, TARGETS, csv, kernel_table, parse_targets, run_row_on, svg, table,
};
use gearsim_host::options::read_chip_config;
use gearsim_host::study::{Shard, parallel_map};
use gearsim_sim::Setting;

#[derive(Args)]
pub struct CalibrateArgs {
    /// A targets table instead of the committed one (same columns:
    /// id,net,chip,batch,precision,aipp,small_channel,fps,source).
    #[arg(long = "targets", value_name = "FILE.csv")]
    targets: Option<PathBuf>,
    /// Only these target ids (comma-separated, e.g. M1,M4).
    #[arg(long = "only", value_delimiter = ',')]
    only: Vec<String>,
    /// Only these batches (comma-separated).
    #[arg(long = "batch", value_delimiter = ',')]
    batch: Vec<i64>,
    /// Print the per-kernel table of every row (kernel, time, share, blocks, cube %, MTE2 %).
    #[arg(long = "kernels")]
    kernels: bool,
    /// Write the rows as CSV here.
    #[arg(long = "csv", value_name = "FILE.csv")]
    csv: Option<PathBuf>,
    /// Write the figure (simulated vs measured, log-log, ±20% band) here.
    #[arg(long = "svg", value_name = "FILE.svg")]
    svg: Option<PathBuf>,
    /// Also write each row's generated workload here as `<net>_b<batch>.onnx` (to compile or
    /// inspect it with the other commands).
    #[arg(long = "models_dir", value_name = "DIR")]
    models_dir: Option<PathBuf>,
    /// Simulate on this many threads (default: one per host core).
    #[arg(long = "threads")]
    threads: Option<usize>,
    /// Run only shard I of N of the selected rows (those whose place p in the table has
    /// p % N == I), e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT; the shards' CSVs,
    /// concatenated and sorted by their `row` column, are the whole run's.
    #[arg(long = "shard", value_name = "I/N", default_value = "0/1")]
    shard: String,
    /// A changed chip (a preset's TOML, e.g. sim/presets/ascend310p.toml with a different
    /// memory.l2_bytes): the rows of the preset its `name` gives run on it instead, to see how
    /// the table moves with one parameter.
    #[arg(long = "chip_config", value_name = "FILE")]
    chip_config: Option<PathBuf>,
    /// Change one value of every selected row's chip (its preset, or --chip_config's file),
    /// `section.key=value` as in the preset's TOML, e.g. scheduler.kernel_launch_ns=2000;
    /// repeatable. A sensitivity sweep is one run per value.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    set: Vec<Setting>,
    /// atc's --buffer_optimize for every row: l2_optimize (the default, as atc's) or
    /// off_optimize (no L2 control: the L2 is a plain cache), to see what the L2 control gives.
    #[arg(long = "buffer_optimize", default_value = "l2_optimize")]
    buffer_optimize: String,
}

/// `--chip_config`'s chip and `--set`'s changes; an error when no selected row runs on the
/// preset the file changes, or when a setting does not apply to a selected row's chip.
fn chip_override(a: &CalibrateArgs, rows: &[Row]) -> Result<Option<ChipOverride>> {
    if a.chip_config.is_none() && a.set.is_empty() {
        return Ok(None);
    }
    let file = match &a.chip_config {
        None => None,
        Some(path) => {
            let cfg = read_chip_config(path, &a.set)?;
            let origin = match a.set.as_slice() {
                [] => path.display().to_string(),
                set => format!("{} with {}", path.display(), Setting::list(set)),
            };
            Some((cfg, origin))
        }
    };
    let chip = ChipOverride {
        file,
        settings: a.set.clone(),
    };
    if let Some((cfg, origin)) = &chip.file
        && !rows.iter().any(|r| chip.applies_to(r))
    {
        let chips: std::collections::BTreeSet<&str> =
            rows.iter().map(|r| r.chip.as_str()).collect();
        return Err(anyhow!(
            "--chip_config: {origin} changes `{}`, which no selected row runs on (their chips: {})",
            cfg.name,
            chips.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    // Every setting must apply to every selected chip before anything runs.
    for r in rows {
        chip.config_for(r).map_err(|e| anyhow!("--set: {e}"))?;
    }
    Ok(Some(chip))
}

/// The rows the arguments select.
fn rows(a: &CalibrateArgs) -> Result<Vec<Row>> {
    let rows = match &a.targets {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
            parse_targets(&text, &p.display().to_string()).map_err(|e| anyhow!(e))?
        }
        None => parse_targets(TARGETS, "targets.csv").map_err(|e| anyhow!(e))?,
    };
    for id in &a.only {
        if !rows.iter().any(|r| &r.id == id) {
            return Err(anyhow!(
                "--only: no target has id `{id}` (ids: {})",
                rows.iter()
                    .map(|r| r.id.as_str())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let chosen: Vec<Row> = rows
        .into_iter()
        .filter(|r| a.only.is_empty() || a.only.contains(&r.id))
        .filter(|r| a.batch.is_empty() || a.batch.contains(&r.batch))
        .collect();
    if chosen.is_empty() {
        return Err(anyhow!("no target row matches --only / --batch"));
    }
    Ok(chosen)
}

pub fn run(a: &CalibrateArgs) -> Result<(), Failure> {
    let shard = Shard::parse(&a.shard)?;
    let rows: Vec<(usize, Row)> = rows(a)?
        .into_iter()
        .enumerate()
        .filter(|(p, _)| shard.takes(*p))
        .collect();
    if rows.is_empty() {
        return Err(anyhow!("--shard {shard}: no selected row falls in this shard").into());
    }
    let (places, rows): (Vec<usize>, Vec<Row>) = rows.into_iter().unzip();
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    // The chip's settings and the options are checked before anything is written.
    let chip = chip_override(a, &rows)?;
    let buffer = BufferOptimize::parse(&a.buffer_optimize)?;
    if let Some(dir) = &a.models_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        // A copy row runs no model.
        for r in rows.iter().filter(|r| r.net.is_model()) {
            let p = dir.join(format!("{}_b{}.onnx", r.net.name(), r.batch));
            write_atomic(&p, &r.model()).with_context(|| format!("{}", p.display()))?;
        }
    }
    let outcomes = parallel_map(
        &rows,
        threads,
        |r| run_row_on(r, chip.as_ref(), buffer),
        |_, _| {},
    );
    say!("{}", table(&outcomes).trim_end());
    if a.kernels {
        for x in &outcomes {
            say!("\n{}", kernel_table(x).trim_end());
        }
    }
    if let Some(p) = &a.csv {
        write_atomic(p, csv(&places, &outcomes).as_bytes())
            .with_context(|| format!("{}", p.display()))?;
    }
    if let Some(p) = &a.svg {
        write_atomic(p, svg(&outcomes).as_bytes()).with_context(|| format!("{}", p.display()))?;
    }
    Ok(())
}
