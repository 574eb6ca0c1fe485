//! `gearsim isa reference`: the instruction reference generated from the instruction table.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use gearsim_traces::atomic::write_atomic;

use super::Failure;
use super::output::say_raw;

#[derive(Subcommand)]
pub enum IsaCommand {
    /// Print (or write) the instruction reference generated from the instruction table.
    Reference(ReferenceArgs),
}

#[derive(Args)]
pub struct ReferenceArgs {
    /// Write to this file instead of standard output.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
}

/// Runs a `gearsim isa` subcommand.
pub fn run(c: IsaCommand) -> Result<(), Failure> {
    match c {
        IsaCommand::Reference(a) => {
            let text = gearsim_isa::reference::markdown();
            match a.output {
                Some(path) => write_atomic(&path, text.as_bytes())?,
                None => say_raw(&text),
            }
            Ok(())
        }
    }
}
