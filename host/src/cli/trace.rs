//! `gearsim trace export | summary | diff`: `.gtrace` files converted for a viewer, summarised
//! and compared.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use gearsim_traces::TraceFile;

use super::Failure;

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Convert a trace for a viewer (Perfetto / chrome://tracing JSON).
    Export(ExportArgs),
    /// Busy time per lane, top span names, the trace window and the time of each model-run
    /// phase (H2D, GetNext, GetDynamicDims, MapIndex, branch, D2H).
    Summary(SummaryArgs),
    /// Compare the lanes and model-run phases of two traces.
    Diff(DiffArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// Chrome trace-event JSON, opened by ui.perfetto.dev and chrome://tracing.
    Perfetto,
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
}

#[derive(Args)]
pub struct SummaryArgs {
    /// The .gtrace file.
    file: PathBuf,
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
            let trace = TraceFile::open(&a.file)?;
            match a.format {
                ExportFormat::Perfetto => gearsim_traces::export_perfetto_file(&trace, &a.output)?,
            }
            say!(
                "{}: {} records exported",
                a.output.display(),
                trace.record_count()
            );
        }
        TraceCommand::Summary(a) => {
            let trace = TraceFile::open(&a.file)?;
            say!("{}", gearsim_traces::summary(&trace));
        }
        TraceCommand::Diff(a) => {
            let base = gearsim_traces::summary(&TraceFile::open(&a.base)?);
            let other = gearsim_traces::summary(&TraceFile::open(&a.other)?);
            say!("{}", gearsim_traces::diff(&base, &other));
        }
    }
    Ok(())
}
