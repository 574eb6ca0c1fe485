//! `gearsim run`: a compiled `.om` run on `.npy` inputs (non-sink, GetNext sink, or hybrid's
//! fallback), its outputs written at their real shapes. The `.om` is read and validated here,
//! once; its description picks the chip, and the runner loads that same parse.

use gearsim_traces::Level;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use gearsim_host::inputs::{Fill, GearChoice};
use gearsim_host::runner::{self, OmModel};

use super::Failure;
use super::flags::{ChipArgs, TraceArgs};
use super::output::{exec_mode, finish_trace_quiet};

#[derive(Args)]
pub struct RunArgs {
    /// The compiled model.
    #[arg(long = "model", value_name = "NAME.om")]
    model: PathBuf,
    /// One .npy per data input, in model-input order, comma-separated. Without it, the inputs
    /// are made up (zeros, or --input_gen random) at the model's static shapes or at the gear
    /// --dymBatch / --dymHW / --dymDims chooses, as ais_bench's pure-inference mode.
    #[arg(long = "input", value_name = "a.npy[,b.npy...]", value_delimiter = ',')]
    input: Vec<PathBuf>,
    /// Without --input: the batch to make the inputs at (ais_bench's --dymBatch).
    #[arg(long = "dymBatch", visible_alias = "dym_batch", value_name = "N")]
    dym_batch: Option<i64>,
    /// Without --input: the image size to make the inputs at, "H,W" (ais_bench's --dymHW).
    #[arg(long = "dymHW", visible_alias = "dym_hw", value_name = "H,W")]
    dym_hw: Option<String>,
    /// Without --input: each input's shape, "name:d0,d1,...;name2:..." (ais_bench's --dymDims).
    #[arg(long = "dymDims", visible_alias = "dym_dims", value_name = "SHAPES")]
    dym_dims: Option<String>,
    /// Without --input: what the made-up inputs hold, zeros (ais_bench's) or random.
    #[arg(
        long = "input_gen",
        default_value = "zeros",
        value_name = "zeros|random"
    )]
    input_gen: String,
    /// The seed of --input_gen random.
    #[arg(long = "seed", default_value_t = 0)]
    seed: u64,
    /// Dynamic batch: a batch between two gears is padded with zero rows up to the next larger
    /// gear, run there, and its outputs cut back (after a padding check on the device that
    /// the model's rows are independent; a model that fails it is refused).
    #[arg(long = "pad_to_gear")]
    pad_to_gear: bool,
    /// Write output_<i>.npy here (created if missing).
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// nonsink or sink (default: the mode the model was compiled for).
    #[arg(long = "mode")]
    mode: Option<String>,
    // The chip (default: the one the model was compiled for; another is refused).
    #[command(flatten)]
    chip: ChipArgs,
    #[command(flatten)]
    trace: TraceArgs,
    /// Simulate time only: no values are computed and no outputs written.
    #[arg(long = "timing_only")]
    timing_only: bool,
    /// Run this many times (ais_bench's --loop; the report is the last run's, with the NPU
    /// compute time's min / max / mean / median over the runs and the throughput).
    #[arg(long = "repeat", visible_alias = "loop", default_value_t = 1)]
    repeat: u32,
    /// Write msprof-style profiles here: op_summary.csv (one row per operator task of every
    /// run), task_time.csv (every task), summary.json and summary.txt (phases, NPU compute
    /// time, throughput).
    #[arg(long = "profile", value_name = "DIR")]
    profile: Option<PathBuf>,
    /// ge.exec.input_fusion_size: inputs up to this many bytes are copied in one merged
    /// transfer (0 turns merging off).
    #[arg(
        long = "input_fusion_size",
        default_value_t = 131072,
        allow_hyphen_values = true
    )]
    input_fusion_size: i64,
    /// Print the report as one JSON object.
    #[arg(long = "json")]
    json: bool,
    /// Compute values on this many host threads (default: one per host core). Outputs,
    /// traces and simulated times are the same for every count.
    #[arg(long = "threads", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// Refuse to start a run whose host memory estimate exceeds this size (e.g. 8G, 512M;
    /// default: the memory the host has available).
    #[arg(long = "host_memory_limit", value_name = "SIZE", value_parser = gearsim_host::host_memory::parse_size)]
    host_memory_limit: Option<u64>,
}

/// The gear the made-up inputs are at (at most one of the three flags).
fn gear_choice(a: &RunArgs) -> anyhow::Result<GearChoice> {
    match (a.dym_batch, &a.dym_hw, &a.dym_dims) {
        (None, None, None) => Ok(GearChoice::Static),
        (Some(b), None, None) => Ok(GearChoice::Batch(b)),
        (None, Some(hw), None) => GearChoice::parse_hw(hw),
        (None, None, Some(d)) => GearChoice::parse_dims(d),
        _ => anyhow::bail!("--dymBatch, --dymHW and --dymDims: give at most one"),
    }
}

/// Reads the model once, picks its chip, runs it and reports.
pub fn run(a: &RunArgs) -> Result<(), Failure> {
    let req = runner::RunRequest {
        inputs: a.input.clone(),
        output_dir: a.output_dir.clone(),
        mode: a.mode.as_deref().map(runner::Mode::parse).transpose()?,
        timing_only: a.timing_only,
        repeat: a.repeat,
        input_fusion_size: a.input_fusion_size,
        profile: a.profile.is_some() || a.json,
        gear: gear_choice(a)?,
        fill: Fill::parse(&a.input_gen, a.seed)?,
        pad_to_gear: a.pad_to_gear,
        host_threads: a
            .threads
            .map_or_else(gearsim_host::study::host_threads, |t| t as usize),
        host_memory_limit: a.host_memory_limit,
    };
    let mode = exec_mode(a.timing_only);
    let map = OmModel::read(&a.model)?;
    let model = OmModel::parse(&a.model, map.bytes())?;
    let cfg = a
        .chip
        .config_or(&model.desc.soc_version)
        .with_context(|| format!("{}: no chip to run it on", a.model.display()))?;
    // The trace is opened for the chip the model names; the runner checks the rest.
    let sink = a.trace.open(&cfg, "run", mode, Level::Kernel)?;
    let show = a.repeat > 1 && !a.json;
    let mut progress = |done: u32, total: u32| {
        if show {
            eprint!("\rrun {done}/{total}");
            if done == total {
                eprintln!();
            }
        }
    };
    let (outcome, sink) = runner::run(&req, &model, cfg, sink, &mut progress)?;
    if a.json {
        say!("{}", outcome.json());
    } else {
        for line in outcome.text() {
            say!("{line}");
        }
        if a.timing_only {
            say!("timing-only: no values were computed, so no outputs were written");
        }
    }
    if let Some(dir) = &a.profile {
        let files = outcome.profile_files();
        let written = gearsim_host::msprof::write_dir(dir, &files)?;
        if !a.json {
            say!(
                "profile: {} operator task(s) per run in {}",
                outcome.profiles.last().map_or(0, |p| p.ops.len()),
                written
                    .first()
                    .and_then(|p| p.parent())
                    .unwrap_or(dir)
                    .display()
            );
        }
    }
    for w in &outcome.last.warnings {
        log::warn!("{w}");
    }
    finish_trace_quiet(sink, a.json)?;
    Ok(())
}
