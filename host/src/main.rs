//! The `gearsim` binary: parses the command line (`cli/`, one file per subcommand), installs
//! the logger, runs the command and maps its outcome to the exit code, here and nowhere else:
//! 0 success, 1 a problem with the user's input (or a fault of the simulated hardware caused by
//! it), 2 an internal error of gearsim (a failed built-in check, or a panic).

mod cli;

use std::process::ExitCode;

use clap::Parser;

use cli::Failure;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        // A bad flag is bad input (exit 1, as the README defines); help and version are not
        // errors.
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    exit_code(std::panic::catch_unwind(|| cli::run(args)))
}

/// The one mapping from a command's outcome (or its panic) to the exit code; failures are
/// reported on standard error.
fn exit_code(outcome: std::thread::Result<Result<(), Failure>>) -> ExitCode {
    match outcome {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(Failure::User(error))) => {
            eprintln!("error: {error:#}");
            ExitCode::from(1)
        }
        Ok(Err(Failure::Internal(error))) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
        Err(_) => {
            eprintln!(
                "internal error: gearsim panicked (this is a bug; please report it with the command line)"
            );
            ExitCode::from(2)
        }
    }
}
