//! `gearsim info`: a `.om`'s description as JSON (inputs, outputs, gears, memory per gear).

use std::path::PathBuf;

use clap::Args;
use gearsim_host::atc::{info_json, load_desc, to_json_text};

use super::Failure;

#[derive(Args)]
pub struct InfoArgs {
    /// The .om model.
    #[arg(long = "model", value_name = "NAME.om")]
    model: PathBuf,
}

/// Prints the description.
pub fn run(a: &InfoArgs) -> Result<(), Failure> {
    let (desc, bytes) = load_desc(&a.model)?;
    say!("{}", to_json_text(&info_json(&desc, bytes)));
    Ok(())
}
