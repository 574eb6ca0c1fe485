//! `gearsim conformance`: the ONNX backend node tests run on the simulator, and the
//! scoreboard printed or written to tests/conformance/SCOREBOARD.md.

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use clap::Args;
use gearsim_host::conformance::{REQUIRED_PASS_RATE, SCOREBOARD_PATH, node_dir, run_suite_on};
use gearsim_traces::atomic::write_atomic;

use super::Failure;
use super::flags::ChipArgs;
use super::output::say_raw;

#[derive(Args)]
pub struct ConformanceArgs {
    /// The extracted onnx/backend/test/data/node directory of the onnx wheel (default:
    /// $GEARSIM_ONNX_NODE_TESTS, else target/onnx-node-tests/onnx-1.22.0/node, which
    /// `cargo test --release -p gearsim-tests --test all -- conformance` provisions).
    #[arg(long = "dir", value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Write the scoreboard to tests/conformance/SCOREBOARD.md (run from the workspace root)
    /// and print its summary, instead of printing the whole scoreboard.
    #[arg(long = "update")]
    update: bool,
    /// Tests run in parallel on this many threads (default: one per core).
    #[arg(long = "jobs")]
    jobs: Option<usize>,
    #[command(flatten)]
    chip: ChipArgs,
}

/// Runs the suite; a pass rate under the target is a failure (exit 1).
pub fn run(a: &ConformanceArgs) -> Result<(), Failure> {
    let chip = a.chip.config()?;
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let board = run_suite_on(&node_dir(a.dir.as_deref()), jobs, &chip)?;
    if a.update {
        write_atomic(Path::new(SCOREBOARD_PATH), board.markdown().as_bytes())?;
        say_raw(&board.summary());
        say!("wrote {SCOREBOARD_PATH}");
    } else {
        say_raw(&board.markdown());
    }
    let t = board.op_list_totals();
    if !board.meets_target() {
        return Err(anyhow!(
            "{} of {} supported node tests of the compiler's operators pass ({:.1}%, \
             need {:.0}%)",
            t.passed,
            t.supported(),
            100.0 * t.pass_rate(),
            100.0 * REQUIRED_PASS_RATE
        )
        .into());
    }
    Ok(())
}
