//! `gearsim verify`: a `.om`'s task streams and kernels checked statically for a chip (by
//! default the one it was compiled for), every violation listed.

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use gearsim_host::atc;

use super::Failure;
use super::flags::ChipArgs;

#[derive(Args)]
pub struct VerifyArgs {
    /// The .om model.
    #[arg(long = "model", value_name = "NAME.om")]
    model: PathBuf,
    // The chip whose buffer sizes are checked (default: the one the model was compiled for).
    #[command(flatten)]
    chip: ChipArgs,
}

/// Verifies the model; any violation is a failure (exit 1).
pub fn run(a: &VerifyArgs) -> Result<(), Failure> {
    let report = atc::verify_file(&a.model, |compiled_for| a.chip.config_or(compiled_for))?;
    say!("{report}");
    if report.is_ok() {
        Ok(())
    } else {
        Err(anyhow!(
            "{}: {} violation(s)",
            a.model.display(),
            report.violations.len()
        )
        .into())
    }
}
