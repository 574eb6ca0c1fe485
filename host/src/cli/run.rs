//! `gearsim run`: a compiled `.om` run on `.npy` inputs (non-sink, GetNext sink, or hybrid's
//! fallback), its outputs written at their real shapes. The `.om` is read and validated here,
//! once; its description picks the chip, and the runner loads that same parse.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use gearsim_host::runner::{self, OmModel};

use super::Failure;
use super::flags::{ChipArgs, TraceArgs};
use super::output::{exec_mode, finish_trace_quiet};

#[derive(Args)]
pub struct RunArgs {
    /// The compiled model.
    #[arg(long = "model", value_name = "NAME.om")]
    model: PathBuf,
    /// One .npy per data input, in model-input order, comma-separated.
    #[arg(long = "input", value_name = "a.npy[,b.npy...]", value_delimiter = ',')]
    input: Vec<PathBuf>,
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
    /// Run this many times (the report is the last run's, with mean and min times).
    #[arg(long = "repeat", default_value_t = 1)]
    repeat: u32,
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
    };
    let mode = exec_mode(a.timing_only);
    let bytes = OmModel::read(&a.model)?;
    let model = OmModel::parse(&a.model, &bytes)?;
    let cfg = a
        .chip
        .config_or(&model.desc.soc_version)
        .with_context(|| format!("{}: no chip to run it on", a.model.display()))?;
    // The trace is opened for the chip the model names; the runner checks the rest.
    let sink = a.trace.open(&cfg, "run", mode)?;
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
    for w in &outcome.last.warnings {
        log::warn!("{w}");
    }
    finish_trace_quiet(sink, a.json)?;
    Ok(())
}
