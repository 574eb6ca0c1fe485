//! What every command shares on its way out: lines on standard output (quiet once the reader
//! has gone) and the `.gtrace` file a `--trace` flag asks for.

use std::path::Path;

use anyhow::Result;
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::{Level, TraceFileWriter, TraceSink};

static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes `text` to standard output as it is (the `say!` macro adds the newline).
pub fn say_raw(text: &str) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
        } else {
            eprintln!("error: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

/// Starts the trace file at `path` (if any) with the command, the mode and the chip as
/// metadata.
pub fn open_trace(
    path: Option<&Path>,
    cfg: &ChipConfig,
    what: &str,
    mode: ExecMode,
    level: Level,
) -> Result<Option<TraceFileWriter>> {
    let Some(path) = path else { return Ok(None) };
    let mut w = TraceFileWriter::create(path)?;
    w.set_level(level);
    w.meta("command", what);
    w.meta(
        "exec_mode",
        if mode == ExecMode::Full {
            "full"
        } else {
            "timing-only"
        },
    );
    w.meta("soc_version", &cfg.name);
    Ok(Some(w))
}

/// Finishes the trace (renaming it into place) and says where it went.
pub fn finish_trace(sink: Option<TraceFileWriter>) -> Result<()> {
    finish_trace_quiet(sink, false)
}

/// Finishes the trace; says where it went unless `quiet` (a JSON report owns standard output).
pub fn finish_trace_quiet(sink: Option<TraceFileWriter>, quiet: bool) -> Result<()> {
    if let Some(w) = sink {
        let n = w.record_count();
        let dest = w.dest().to_path_buf();
        w.finish()?;
        if !quiet {
            say!("trace: {} ({n} records)", dest.display());
        }
    }
    Ok(())
}

/// The execution mode a `--timing_only` flag asks for.
pub fn exec_mode(timing_only: bool) -> ExecMode {
    if timing_only {
        ExecMode::TimingOnly
    } else {
        ExecMode::Full
    }
}
