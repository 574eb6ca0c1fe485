//! The `gearsim` command line: the top-level [`Cli`] and its [`Command`]s, and [`run`], which
//! hands each to the file that defines it. One file per subcommand holds its clap arguments and
//! the function that runs it; `flags.rs` holds the flag groups several share (the chip, the
//! trace, the gear options), defined once; `output.rs` the printing and trace-file helpers.
//! Every command returns `Result<(), Failure>`; `main.rs` alone turns that into an exit code.

use clap::{Parser, Subcommand};

/// Prints a line on standard output. Once the reader has gone (`gearsim ... | head`), output
/// is dropped quietly and the command still finishes its work (and its files), as other
/// command-line tools do.
macro_rules! say {
    ($($t:tt)*) => { $crate::cli::output::say_raw(&format!("{}\n", format_args!($($t)*))) };
}

mod bench;
mod calibrate;
mod compile;
mod conformance;
mod demo;
mod flags;
mod info;
mod isa;
mod kernel;
mod model;
mod ops;
mod output;
mod run;
mod study;
mod trace;
mod verify;

#[derive(Parser)]
#[command(
    name = "gearsim",
    version,
    about = "Cycle-approximate simulator of an Ascend-like NPU",
    long_about = "Cycle-approximate simulator of an Ascend-like NPU: AI cores with scalar, vector, \
                  cube and MTE pipes, device memory, traces viewable in Perfetto."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Assemble, disassemble and run hand-written AI core kernels.
    #[command(subcommand)]
    Kernel(kernel::KernelCommand),
    /// Export, summarise and compare .gtrace files.
    #[command(subcommand)]
    Trace(trace::TraceCommand),
    /// The instruction set.
    #[command(subcommand)]
    Isa(isa::IsaCommand),
    /// Compile an ONNX model into a .om, as atc does (gear options included).
    Compile(Box<compile::CompileArgs>),
    /// Print a .om model's description as JSON (inputs, outputs, gears, memory per gear).
    Info(info::InfoArgs),
    /// Check a .om's task streams and kernels statically and list every violation.
    Verify(verify::VerifyArgs),
    /// List the ONNX operators the compiler supports.
    Ops,
    /// Run a compiled .om on .npy inputs (non-sink, GetNext sink, or hybrid's fallback) and
    /// write its outputs at their real shapes.
    Run(Box<run::RunArgs>),
    /// Write a built-in network (resnet18, resnet50, mobilenetv2, bertbase) as ONNX with
    /// seeded random weights.
    Model(model::ModelArgs),
    /// Performance figures of the simulator and its kernels.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Simulated times against published measurements of real chips: every calibration
    /// target's workload built, compiled and run timing-only on its preset.
    Calibrate(calibrate::CalibrateArgs),
    /// Run the built-in demo: gear models compiled and run in every mode, results checked.
    Demo(demo::DemoArgs),
    /// Run the ONNX backend node tests (onnx 1.22.0) on the simulator and print the
    /// conformance scoreboard (tests/conformance/SCOREBOARD.md).
    Conformance(conformance::ConformanceArgs),
    /// Parameter studies: sweeps of simulations run in parallel (and shardable), written as
    /// CSV and an SVG figure.
    #[command(subcommand)]
    Study(study::StudyCommand),
}

/// Why a command failed, and whose fault it is: `main` maps these to exit codes.
pub enum Failure {
    /// A problem with the user's input, or a fault of the simulated hardware it caused.
    User(anyhow::Error),
    /// A bug in gearsim (a built-in check that should never fail did).
    Internal(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::User(e.into())
    }
}

/// Runs the command `cli` names.
pub fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Kernel(c) => kernel::run(c),
        Command::Trace(c) => trace::run(c),
        Command::Isa(c) => isa::run(c),
        Command::Compile(a) => compile::run(&a),
        Command::Info(a) => info::run(&a),
        Command::Verify(a) => verify::run(&a),
        Command::Ops => ops::run(),
        Command::Run(a) => run::run(&a),
        Command::Model(a) => model::run(&a),
        Command::Bench(c) => bench::run(c),
        Command::Calibrate(a) => calibrate::run(&a),
        Command::Demo(a) => demo::run(&a),
        Command::Conformance(a) => conformance::run(&a),
        Command::Study(c) => study::run(c),
    }
}
