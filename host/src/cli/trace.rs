//! `gearsim trace export | summary | diff`: `.gtrace` files converted for a viewer, summarised
//! and compared.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use gearsim_traces::{Filter, Level, TraceFile};

use super::Failure;

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Convert a trace for a viewer (Perfetto / chrome://tracing JSON).
    Export(ExportArgs),
    /// Busy time per lane (idle lanes hidden), the top kernels (ops; span names for a trace
    /// without tasks), the trace window and the time of each model-run phase (H2D, GetNext,
    /// GetDynamicDims, MapIndex, branch, D2H).
    Summary(SummaryArgs),
    /// Compare the lanes and model-run phases of two traces.
    Diff(DiffArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// Chrome trace-event JSON, opened by ui.perfetto.dev and chrome://tracing.
    Perfetto,
    /// Perfetto's native protobuf trace (interned names, a track per lane): several times
    /// smaller than the JSON, opened by ui.perfetto.dev and trace_processor.
    #[value(name = "perfetto_proto")]
    PerfettoProto,
}

#[derive(Args)]
pub struct ExportArgs {
    /// The .gtrace file.
    file: PathBuf,
    /// Output format.
    #[arg(long = "format", value_enum, default_value = "perfetto")]
    format: ExportFormat,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Level of detail: task (streams, host, PCIe, scheduler, AI CPU; no core lanes), kernel
    /// (those plus one span per kernel on each core and per-pipe busy counters) or instruction
    /// (everything recorded).
    #[arg(long = "level", default_value = "instruction")]
    level: String,
    /// Only records inside this window, "START_US:END_US" (spans overlapping it whole).
    #[arg(long = "window", value_name = "START_US:END_US")]
    window: Option<String>,
    /// Only these cores' lanes, "0-3,7" (other lanes are kept).
    #[arg(long = "cores", value_name = "LIST")]
    cores: Option<String>,
}

/// The export filter the flags ask for.
fn filter(a: &ExportArgs) -> anyhow::Result<Filter> {
    let level = Level::parse(&a.level).ok_or_else(|| {
        anyhow::anyhow!(
            "--level: expected task, kernel or instruction, got `{}`",
            a.level
        )
    })?;
    let window = match &a.window {
        None => None,
        Some(w) => {
            let parse = |s: &str| -> Option<u64> {
                let v: f64 = s.trim().parse().ok()?;
                (v.is_finite() && v >= 0.0).then(|| (v * 1e6).round() as u64)
            };
            let (lo, hi) = w
                .split_once(':')
                .and_then(|(a, b)| Some((parse(a)?, parse(b)?)))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--window: expected START_US:END_US (two non-negative numbers), got `{w}`"
                    )
                })?;
            if hi < lo {
                anyhow::bail!("--window: the end ({hi} ps) is before the start ({lo} ps)");
            }
            Some((lo, hi))
        }
    };
    let cores = match &a.cores {
        None => None,
        Some(list) => {
            let mut set = std::collections::BTreeSet::new();
            for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let bad = || {
                    anyhow::anyhow!("--cores: expected numbers and ranges like 0-3,7, got `{part}`")
                };
                match part.split_once('-') {
                    Some((a, b)) => {
                        let (a, b): (u32, u32) =
                            (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                        if b < a {
                            return Err(bad());
                        }
                        set.extend(a..=b);
                    }
                    None => {
                        set.insert(part.parse().map_err(|_| bad())?);
                    }
                }
            }
            Some(set)
        }
    };
    Ok(Filter {
        level,
        window,
        cores,
    })
}

#[derive(Args)]
pub struct SummaryArgs {
    /// The .gtrace file.
    file: PathBuf,
    /// Show idle lanes too (lanes without spans, samples or flows are hidden by default).
    #[arg(long = "all_lanes")]
    all_lanes: bool,
}

#[derive(Args)]
pub struct DiffArgs {
    /// The base trace.
    base: PathBuf,
    /// The trace compared with it.
    other: PathBuf,
}

/// Runs a `gearsim trace` subcommand.
pub fn run(c: TraceCommand) -> Result<(), Failure> {
    match c {
        TraceCommand::Export(a) => {
            let filter = filter(&a)?;
            let trace = TraceFile::open(&a.file)?;
            let start = std::time::Instant::now();
            match a.format {
                ExportFormat::Perfetto => {
                    gearsim_traces::export_perfetto_file_filtered(&trace, filter, &a.output)?
                }
                ExportFormat::PerfettoProto => {
                    gearsim_traces::export_perfetto_proto_file(&trace, filter, &a.output)?;
                }
            }
            let bytes = std::fs::metadata(&a.output).map_or(0, |m| m.len());
            say!(
                "{}: {} records exported ({bytes} bytes in {:.2} s)",
                a.output.display(),
                trace.record_count(),
                start.elapsed().as_secs_f64()
            );
        }
        TraceCommand::Summary(a) => {
            let trace = TraceFile::open(&a.file)?;
            let mut s = gearsim_traces::summary(&trace);
            s.all_lanes = a.all_lanes;
            say!("{s}");
        }
        TraceCommand::Diff(a) => {
            let base = gearsim_traces::summary(&TraceFile::open(&a.base)?);
            let other = gearsim_traces::summary(&TraceFile::open(&a.other)?);
            say!("{}", gearsim_traces::diff(&base, &other));
        }
    }
    Ok(())
}
