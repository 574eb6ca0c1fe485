//! `gearsim demo`: the built-in gear models compiled and run in every mode, results checked
//! (`gearsim kernel demo` shares its arguments).

use clap::Args;
use gearsim_host::demo::{self, Row};
use gearsim_sim::ExecMode;
use gearsim_traces::Level;

use super::Failure;
use super::flags::{ChipArgs, TraceArgs};
use super::output::finish_trace;

#[derive(Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub chip: ChipArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// Runs the demo; a result that differs from its reference is an internal error (exit 2).
pub fn run(a: &DemoArgs) -> Result<(), Failure> {
    let cfg = a.chip.config()?;
    say!("== gearsim demo on {} ==", cfg.name);
    say!(
        "Compiles the built-in CNN (dynamic batch 1,4,8) and the seed's three-input model \
         (dynamic dims), each for non-sink (hybrid) and GetNext sink mode; runs every gear in \
         both modes and one unmatched shape through the hybrid dynamic path.\n"
    );
    let sink = a.trace.open(&cfg, "demo", ExecMode::Full, Level::Kernel)?;
    say!("{}", demo::header());
    let mut show = |r: &Row| say!("{}", r.line());
    let (rows, sink) = demo::run(&cfg, sink, &mut show).map_err(Failure::Internal)?;
    say!(
        "\nall {} runs checked: sink and non-sink bit-identical at every gear, \
         cur_dynamic_dims equal to the gear, the dynamic path equal to the reference",
        rows.len()
    );
    finish_trace(sink)?;
    Ok(())
}
