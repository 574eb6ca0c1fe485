//! The `gearsim` command line: every subcommand and flag is defined once here, with its help.
//! Exit codes: 0 success, 1 a problem with the user's input (or a fault of the simulated
//! hardware caused by it), 2 an internal error of gearsim.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use clap::{Args, Parser, Subcommand, ValueEnum};
use gearsim_compiler::options::{DynamicMode, GearOptions};
use gearsim_compiler::pipeline::{CompileOptions, MapIndexEngine, TableLayout};
use gearsim_firmware::{Device, DeviceError};
use gearsim_host::atc::{self, info_json, load_desc};
use gearsim_host::examples;
use gearsim_host::files::write_atomic;
use gearsim_host::kernel::{KernelRunReport, parse_args, run_kernel};
use gearsim_isa::Program;
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::{TraceFile, TraceFileWriter, TraceSink};

#[derive(Parser)]
#[command(
    name = "gearsim",
    version,
    about = "Cycle-approximate simulator of an Ascend-like NPU",
    long_about = "Cycle-approximate simulator of an Ascend-like NPU: AI cores with scalar, vector, \
                  cube and MTE pipes, device memory, traces viewable in Perfetto."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Assemble, disassemble and run hand-written AI core kernels.
    #[command(subcommand)]
    Kernel(KernelCommand),
    /// Export, summarise and compare .gtrace files.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// The instruction set.
    #[command(subcommand)]
    Isa(IsaCommand),
    /// Compile an ONNX model into a .om, as atc does (gear options included).
    Compile(Box<CompileArgs>),
    /// Print a .om model's description as JSON (inputs, outputs, gears, memory per gear).
    Info(InfoArgs),
    /// Check a .om's task streams and kernels statically and list every violation.
    Verify(VerifyArgs),
    /// List the ONNX operators the compiler supports.
    Ops,
    /// Run a compiled .om on .npy inputs (non-sink, GetNext sink, or hybrid's fallback) and
    /// write its outputs at their real shapes.
    Run(RunArgs),
    /// Performance figures of the simulator and its kernels.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run the built-in demo: gear models compiled and run in every mode, results checked.
    Demo(DemoArgs),
    /// Run the ONNX backend node tests (onnx 1.22.0) on the simulator and print the
    /// conformance scoreboard (tests/conformance/SCOREBOARD.md).
    Conformance(ConformanceArgs),
    /// Parameter studies: sweeps of simulations run in parallel (and shardable), written as
    /// CSV and an SVG figure.
    #[command(subcommand)]
    Study(StudyCommand),
}

#[derive(Subcommand)]
enum StudyCommand {
    /// What gear selection costs: sweeps gear count, gear vector length, table layout,
    /// MapIndex engine and where the table lives on a synthetic table-only model (or --model);
    /// writes gears.csv and gears.svg into --output_dir and prints which layout wins where.
    Gears(Box<StudyGearsArgs>),
    /// Which gears to compile: from a file of observed input shapes (with counts), proposes
    /// the gear set that minimises the expected simulated time per request under a gear and a
    /// memory budget (padding batches up where the model allows it, the hybrid dynamic path
    /// otherwise); writes advise.csv, advise_candidates.csv and advise.svg (the trade-off
    /// curve) into --output_dir.
    Advise(Box<StudyAdviseArgs>),
}

#[derive(Args)]
struct StudyAdviseArgs {
    /// The ONNX model.
    #[arg(long = "model", value_name = "FILE.onnx")]
    model: PathBuf,
    /// Input shapes, "name:d0,d1,...;..." with -1 on the axes the gears set (as atc).
    #[arg(long = "input_shape", allow_hyphen_values = true)]
    input_shape: String,
    /// Observed shapes: one request per line in --input_shape form with the real values,
    /// then an optional count, e.g. "input:3,3,32,32 120"; `#` starts a comment.
    #[arg(long = "shapes", value_name = "FILE")]
    shapes: PathBuf,
    /// The gear option to propose: dynamic_batch_size, dynamic_image_size or dynamic_dims
    /// (default: batch when every -1 is an axis 0, image size when they are H and W of one
    /// NCHW input, dims otherwise).
    #[arg(long = "gear_option")]
    gear_option: Option<String>,
    /// With --model: layout of the inputs (NCHW, NHWC or ND).
    #[arg(long = "input_format")]
    input_format: Option<String>,
    /// Most gears in a set (the curve runs from 2 to this).
    #[arg(long = "gear_budget", default_value_t = 8)]
    gear_budget: u32,
    /// Most device bytes the compiled model may hold (weights, gear table, feature maps,
    /// inputs and outputs): a number with an optional K, M or G (KiB, MiB, GiB) suffix.
    #[arg(long = "memory_budget")]
    memory_budget: Option<String>,
    /// Padding a batch up to a larger gear: auto (dynamic batch models whose rows the padding
    /// check shows independent) or never.
    #[arg(long = "pad", default_value = "auto")]
    pad: String,
    /// Host time charged per op a dynamic-path run executes (shape inference, tiling, launch;
    /// not simulated), in microseconds.
    #[arg(long = "host_us_per_op", default_value_t = 5.0)]
    host_us_per_op: f64,
    /// Write advise.csv, advise_candidates.csv and advise.svg here (created if missing).
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: PathBuf,
    /// Simulate on this many threads (default: one per host core).
    #[arg(long = "threads")]
    threads: Option<usize>,
    #[command(flatten)]
    chip: ChipArgs,
}

#[derive(Args)]
struct StudyGearsArgs {
    /// Write gears.csv and gears.svg here (created if missing).
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: PathBuf,
    /// Sweep this ONNX model instead of the synthetic one (needs --input_shape and a gear
    /// option; gear counts take prefixes of its gear list, extended by generated gears).
    #[arg(long = "model", value_name = "FILE.onnx")]
    model: Option<PathBuf>,
    /// With --model: input shapes, "name:d0,d1,...;..." with -1 for gear axes.
    #[arg(long = "input_shape", allow_hyphen_values = true)]
    input_shape: Option<String>,
    /// With --model: batch gears, "1,2,4,8".
    #[arg(long = "dynamic_batch_size", allow_hyphen_values = true)]
    dynamic_batch_size: Option<String>,
    /// With --model: image size gears, "h1,w1;h2,w2".
    #[arg(long = "dynamic_image_size", allow_hyphen_values = true)]
    dynamic_image_size: Option<String>,
    /// With --model: dims gears, "d0,d1,...;d0,d1,...".
    #[arg(long = "dynamic_dims", allow_hyphen_values = true)]
    dynamic_dims: Option<String>,
    /// With --model: layout of the inputs (NCHW, NHWC or ND).
    #[arg(long = "input_format")]
    input_format: Option<String>,
    /// Gear counts, comma-separated (default: 2, 3, 4, 6, 8, 12, ... and the chip's MapIndex
    /// limit).
    #[arg(long = "gear_counts", value_delimiter = ',')]
    gear_counts: Vec<u32>,
    /// Gear vector lengths of the synthetic model, comma-separated (default: 1, 4, 16, 64
    /// and the chip's MapIndex limit).
    #[arg(long = "dims", value_delimiter = ',')]
    dims: Vec<u32>,
    /// Table layouts, comma-separated: gear_major, dim_major8, sorted_binary.
    #[arg(
        long = "layouts",
        value_delimiter = ',',
        default_value = "gear_major,dim_major8,sorted_binary"
    )]
    layouts: Vec<String>,
    /// MapIndex engines, comma-separated: aicore, aicpu.
    #[arg(
        long = "engines",
        value_delimiter = ',',
        default_value = "aicore,aicpu"
    )]
    engines: Vec<String>,
    /// Where the table is when MapIndex reads it, comma-separated: hbm (cold L2, the first run
    /// after load), l2 (resident after the first run touched it).
    #[arg(long = "table_homes", value_delimiter = ',', default_value = "hbm,l2")]
    table_homes: Vec<String>,
    /// The gear the inputs select: first, middle or last (a scan's worst case).
    #[arg(long = "query_gear", default_value = "last")]
    query_gear: String,
    /// Seed of the generated gears.
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// Run the points on this many threads (default: one per host core).
    #[arg(long = "threads")]
    threads: Option<usize>,
    /// Run only shard I of N (the points p with p % N == I), e.g. $SLURM_ARRAY_TASK_ID/16;
    /// the shards' CSVs concatenate (one header) into the whole sweep's.
    #[arg(long = "shard", value_name = "I/N", default_value = "0/1")]
    shard: String,
    #[command(flatten)]
    chip: ChipArgs,
}

#[derive(Args)]
struct ConformanceArgs {
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
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Kernel efficiency on the reference workloads (MatMul and Conv vs cube peak, Add vs
    /// HBM bandwidth), timing-only.
    Kernels(BenchKernelsArgs),
    /// Runtime figures of the built-in CNN at each gear: non-sink vs sink time, H2D transfers
    /// with and without the merged copy, and the hybrid dynamic path vs the gear path.
    Runtime(BenchRuntimeArgs),
    /// Simulator speed on one host thread: simulated chip cycles and instructions per host
    /// second, full and timing-only, on the CNN (batch 1, 4, 8) and the transformer (sequence
    /// 16, 64, 128); only the model's execution on the device is timed.
    Speed(BenchSpeedArgs),
}

#[derive(Args)]
struct BenchSpeedArgs {
    /// Chip preset.
    #[arg(long = "soc_version", default_value = "ascend910")]
    soc_version: String,
    /// Only these models (cnn, transformer), comma-separated.
    #[arg(long = "only", value_delimiter = ',')]
    only: Vec<String>,
    /// Only these modes (full, timing-only), comma-separated.
    #[arg(long = "modes", value_delimiter = ',')]
    modes: Vec<String>,
    /// Only these gears (b1, b4, b8 of the CNN; s16, s64, s128 of the transformer),
    /// comma-separated.
    #[arg(long = "gears", value_delimiter = ',')]
    gears: Vec<String>,
    /// Repeat each figure's runs until at least this much host time has passed (the thread's
    /// CPU time where the host has it, so other processes on the cores do not skew figures).
    #[arg(long = "min_seconds", default_value_t = 1.0)]
    min_seconds: f64,
    /// Add each figure's simulated cycles and instructions per run (identical on every run
    /// and every host), runs and host time.
    #[arg(long = "verbose")]
    verbose: bool,
    /// Print one JSON object per figure instead of text.
    #[arg(long = "json")]
    json: bool,
}

#[derive(Args)]
struct BenchRuntimeArgs {
    /// Chip preset.
    #[arg(long = "soc_version", default_value = "ascend910")]
    soc_version: String,
}

#[derive(Args)]
struct BenchKernelsArgs {
    /// Chip preset.
    #[arg(long = "soc_version", default_value = "ascend910")]
    soc_version: String,
    /// Only these workloads (matmul, conv, add), comma-separated.
    #[arg(long = "only", value_delimiter = ',')]
    only: Vec<String>,
}

#[derive(Args)]
struct CompileArgs {
    /// The ONNX model.
    #[arg(long = "model", value_name = "FILE.onnx")]
    model: PathBuf,
    /// Output name: writes NAME.om.
    #[arg(long = "output", value_name = "NAME")]
    output: PathBuf,
    /// Source framework: 5 (ONNX) is the only one gearsim reads.
    #[arg(long = "framework", default_value_t = 5)]
    framework: u32,
    /// Chip preset, as atc's --soc_version (ascend910, ascend310p; case-insensitive).
    #[arg(long = "soc_version", default_value = "ascend910")]
    soc_version: String,
    /// Input shapes: "name:d0,d1,...;name2:..." with -1 for gear axes.
    #[arg(long = "input_shape", allow_hyphen_values = true)]
    input_shape: Option<String>,
    /// Batch gears: "1,2,4,8".
    #[arg(long = "dynamic_batch_size", allow_hyphen_values = true)]
    dynamic_batch_size: Option<String>,
    /// Image size gears: "h1,w1;h2,w2".
    #[arg(long = "dynamic_image_size", allow_hyphen_values = true)]
    dynamic_image_size: Option<String>,
    /// Dims gears: "d0,d1,...;d0,d1,..." (one value per -1 of --input_shape, in order).
    #[arg(long = "dynamic_dims", allow_hyphen_values = true)]
    dynamic_dims: Option<String>,
    /// Layout of the inputs: NCHW (default), NHWC or ND.
    #[arg(long = "input_format")]
    input_format: Option<String>,
    /// GetNext sink mode: inputs come from a data queue and the gear vector from
    /// GetDynamicDims on the device (instead of the ascend_mbatch_shape_data input).
    #[arg(long = "getnext_sink")]
    getnext_sink: bool,
    /// Gear table layout in device memory: gear_major (GE's), dim_major8 (the TIK kernel's)
    /// or sorted_binary (gearsim's: rows sorted for a binary search).
    #[arg(long = "gear_table_layout", default_value = "gear_major")]
    gear_table_layout: String,
    /// Engine that runs MapIndex: aicore or aicpu.
    #[arg(long = "mapindex_engine", default_value = "aicore")]
    mapindex_engine: String,
    /// Write the graph before and after the gear passes as text into DIR.
    #[arg(long = "dump_graph", value_name = "DIR")]
    dump_graph: Option<PathBuf>,
    /// Write every kernel's tiling and disassembly into DIR (one .s file per kernel).
    #[arg(long = "dump_kernels", value_name = "DIR")]
    dump_kernels: Option<PathBuf>,
    /// Hybrid mode: also store the source graph, so input shapes that match no gear run a
    /// dynamic-shape path (op by op, kernels cached by shape) instead of failing with E13025.
    #[arg(long = "hybrid")]
    hybrid: bool,
}

#[derive(Args)]
struct RunArgs {
    /// The compiled model.
    #[arg(long = "model", value_name = "NAME.om")]
    model: PathBuf,
    /// One .npy per data input, in model-input order, comma-separated.
    #[arg(long = "input", value_name = "a.npy[,b.npy...]", value_delimiter = ',')]
    input: Vec<PathBuf>,
    /// Write output_<i>.npy here (created if missing).
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// nonsink or sink (default: the mode the model was compiled for).
    #[arg(long = "mode")]
    mode: Option<String>,
    /// Chip preset (default: the one the model was compiled for; another is refused).
    #[arg(long = "soc_version")]
    soc_version: Option<String>,
    /// Write a trace of the run(s) to this .gtrace file.
    #[arg(long = "trace", value_name = "FILE.gtrace")]
    trace: Option<PathBuf>,
    /// Simulate time only: no values are computed and no outputs written.
    #[arg(long = "timing_only")]
    timing_only: bool,
    /// Run this many times (the report is the last run's, with mean and min times).
    #[arg(long = "repeat", default_value_t = 1)]
    repeat: u32,
    /// ge.exec.input_fusion_size: inputs up to this many bytes are copied in one merged
    /// transfer (0 turns merging off).
    #[arg(
        long = "input_fusion_size",
        default_value_t = 131072,
        allow_hyphen_values = true
    )]
    input_fusion_size: i64,
    /// Print the report as one JSON object.
    #[arg(long = "json")]
    json: bool,
}

#[derive(Args)]
struct VerifyArgs {
    /// The .om model.
    #[arg(long = "model", value_name = "NAME.om")]
    model: PathBuf,
    /// Chip preset the model was compiled for (its buffer sizes are checked).
    #[arg(long = "soc_version")]
    soc_version: Option<String>,
}

#[derive(Args)]
struct InfoArgs {
    /// The .om model.
    #[arg(long = "model", value_name = "NAME.om")]
    model: PathBuf,
}

#[derive(Subcommand)]
enum KernelCommand {
    /// Run a kernel (.s assembly or .bin binary) on the simulated chip and report its timing.
    Run(KernelRunArgs),
    /// Assemble a .s file into a binary kernel (16 bytes per instruction).
    Asm(AsmArgs),
    /// Print the disassembly of a .bin or .s kernel.
    Disasm(DisasmArgs),
    /// The built-in example kernels on the default chip (vector add checked, cube and DMA
    /// timing).
    Demo(DemoArgs),
}

#[derive(Args)]
struct ChipArgs {
    /// Chip preset, as atc's --soc_version (ascend910, ascend310p; case-insensitive).
    #[arg(long = "soc_version", default_value = "ascend910")]
    soc_version: String,
    /// A chip configuration TOML file to use instead of the preset (same schema as sim/presets).
    #[arg(long = "chip_config", value_name = "FILE")]
    chip_config: Option<PathBuf>,
    /// Override the AI core clock in MHz (the clock is a per-run parameter on real chips).
    #[arg(long = "clock_mhz")]
    clock_mhz: Option<u64>,
}

impl ChipArgs {
    fn config(&self) -> Result<ChipConfig> {
        let mut cfg = match &self.chip_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                ChipConfig::from_toml(&text, &path.display().to_string())?
            }
            None => ChipConfig::preset(&self.soc_version)?,
        };
        if let Some(mhz) = self.clock_mhz {
            cfg.core.clock_mhz = mhz;
            cfg.validate("--clock_mhz")?;
        }
        Ok(cfg)
    }
}

#[derive(Args)]
struct KernelRunArgs {
    /// Kernel file: assembly (.s) or binary (.bin).
    file: PathBuf,
    #[command(flatten)]
    chip: ChipArgs,
    /// Number of blocks (Ascend's numBlocks); blocks beyond the core count run in waves.
    #[arg(long = "block_dim", default_value_t = 1)]
    block_dim: u32,
    /// Kernel arguments, comma-separated, written to an argument array the kernel reads with
    /// `sreg xN, args`: numbers, or buffers `[NAME=]zeros:BYTES`, `rand:TYPE:COUNT[:SEED]`,
    /// `seq:TYPE:COUNT`, `fill:TYPE:COUNT:VALUE`, `file:PATH` (their device address is passed).
    #[arg(long = "args", default_value = "", allow_hyphen_values = true)]
    args: String,
    /// Write a trace of the run (every core, pipe and DMA) to this .gtrace file.
    #[arg(long = "trace", value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Compute timing only, not values (same timeline, much faster on large data).
    #[arg(long = "timing_only")]
    timing_only: bool,
    /// Save every named argument buffer to DIR/NAME.bin after the run.
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
}

#[derive(Args)]
struct AsmArgs {
    /// Assembly file.
    file: PathBuf,
    /// Output binary.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

#[derive(Args)]
struct DisasmArgs {
    /// Kernel file: binary (.bin) or assembly (.s).
    file: PathBuf,
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Convert a trace for a viewer (Perfetto / chrome://tracing JSON).
    Export(ExportArgs),
    /// Busy time per lane, top span names, the trace window and the time of each model-run
    /// phase (H2D, GetNext, GetDynamicDims, MapIndex, branch, D2H).
    Summary(SummaryArgs),
    /// Compare the lanes and model-run phases of two traces.
    Diff(DiffArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum ExportFormat {
    /// Chrome trace-event JSON, opened by ui.perfetto.dev and chrome://tracing.
    Perfetto,
}

#[derive(Args)]
struct ExportArgs {
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
struct SummaryArgs {
    /// The .gtrace file.
    file: PathBuf,
}

#[derive(Args)]
struct DiffArgs {
    /// The base trace.
    base: PathBuf,
    /// The trace compared with it.
    other: PathBuf,
}

#[derive(Subcommand)]
enum IsaCommand {
    /// Print (or write) the instruction reference generated from the instruction table.
    Reference(ReferenceArgs),
}

#[derive(Args)]
struct ReferenceArgs {
    /// Write to this file instead of standard output.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct DemoArgs {
    #[command(flatten)]
    chip: ChipArgs,
    /// Write a trace of the whole run to this .gtrace file.
    #[arg(long = "trace", value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// Prints a line on standard output. Once the reader has gone (`gearsim ... | head`), output
/// is dropped quietly and the command still finishes its work (and its files), as other
/// command-line tools do.
macro_rules! say {
    ($($t:tt)*) => { say_raw(&format!("{}\n", format_args!($($t)*))) };
}

static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn say_raw(text: &str) {
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

/// A failure and the exit code it maps to.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure {
            code: 1,
            error: e.into(),
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(f)) => {
            eprintln!("error: {:#}", f.error);
            ExitCode::from(f.code)
        }
        Err(_) => {
            eprintln!(
                "internal error: gearsim panicked (this is a bug; please report it with the command line)"
            );
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Kernel(KernelCommand::Run(a)) => kernel_run(a),
        Command::Kernel(KernelCommand::Demo(a)) => kernel_demo(a),
        Command::Kernel(KernelCommand::Asm(a)) => {
            let program = load_program(&a.file)?;
            let bytes = program
                .encode()
                .map_err(|(pc, e)| anyhow!("{}: instruction {pc}: {e}", a.file.display()))?;
            write_atomic(&a.output, &bytes)?;
            say!(
                "{}: {} instructions, {} bytes",
                a.output.display(),
                program.instrs.len(),
                bytes.len()
            );
            Ok(())
        }
        Command::Kernel(KernelCommand::Disasm(a)) => {
            say_raw(&load_program(&a.file)?.disassemble());
            Ok(())
        }
        Command::Trace(TraceCommand::Export(a)) => {
            let trace = TraceFile::open(&a.file)?;
            match a.format {
                ExportFormat::Perfetto => gearsim_traces::export_perfetto_file(&trace, &a.output)?,
            }
            say!(
                "{}: {} records exported",
                a.output.display(),
                trace.record_count()
            );
            Ok(())
        }
        Command::Trace(TraceCommand::Summary(a)) => {
            let trace = TraceFile::open(&a.file)?;
            say!("{}", gearsim_traces::summary(&trace));
            Ok(())
        }
        Command::Trace(TraceCommand::Diff(a)) => {
            let base = gearsim_traces::summary(&TraceFile::open(&a.base)?);
            let other = gearsim_traces::summary(&TraceFile::open(&a.other)?);
            say!("{}", gearsim_traces::diff(&base, &other));
            Ok(())
        }
        Command::Isa(IsaCommand::Reference(a)) => {
            let text = gearsim_isa::reference::markdown();
            match a.output {
                Some(path) => write_atomic(&path, text.as_bytes())?,
                None => say_raw(&text),
            }
            Ok(())
        }
        Command::Compile(a) => compile(&a),
        Command::Info(a) => {
            let (desc, bytes) = load_desc(&a.model)?;
            say!("{}", atc::to_json_text(&info_json(&desc, bytes)));
            Ok(())
        }
        Command::Verify(a) => {
            let report = atc::verify_file(&a.model, a.soc_version.as_deref())?;
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
        Command::Ops => {
            for op in gearsim_compiler::ops::standard().ops() {
                say!("{op}");
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Kernels(a)) => {
            let cfg = ChipConfig::preset(&a.soc_version)?;
            say!("kernel efficiency on {} (timing-only):", cfg.name);
            let workloads = &gearsim_host::bench::WORKLOADS;
            for name in &a.only {
                if !workloads.iter().any(|w| w.name == name) {
                    return Err(anyhow!(
                        "--only: unknown workload `{name}` (expected matmul, conv, conv-nchw or add)"
                    )
                    .into());
                }
            }
            let mut failed = 0;
            for w in workloads {
                if !a.only.is_empty() && !a.only.iter().any(|o| o == w.name) {
                    continue;
                }
                match (w.run)(&cfg) {
                    Ok(f) => say!(
                        "  {:<44} {:>3} kernel(s) {:>12.0} cycles  {:>9.1} of {:>7.1} {:<9} = {:>5.1}% ({})",
                        f.name,
                        f.kernels,
                        f.cycles,
                        f.achieved,
                        f.peak,
                        f.unit,
                        f.efficiency() * 100.0,
                        if f.target > 0.0 {
                            format!("target {:.0}%", f.target * 100.0)
                        } else {
                            "no target".to_string()
                        }
                    ),
                    Err(e) => {
                        failed += 1;
                        eprintln!("  {}: {e}", w.name);
                    }
                }
            }
            if failed > 0 {
                return Err(anyhow!("{failed} workload(s) failed").into());
            }
            Ok(())
        }
        Command::Run(a) => run_command(a),
        Command::Bench(BenchCommand::Runtime(a)) => {
            let cfg = ChipConfig::preset(&a.soc_version)?;
            say!(
                "runtime figures of the built-in CNN (dynamic batch 1,4,8) on {}:",
                cfg.name
            );
            say!(
                "  {:>5}  {:<22} {:>12}  {:>18}  {:>18}",
                "batch",
                "path",
                "device us",
                "H2D n / bytes",
                "D2H n / bytes"
            );
            for f in gearsim_host::bench::runtime_figures(&cfg).map_err(|e| anyhow!(e))? {
                say!(
                    "  {:>5}  {:<22} {:>12.3}  {:>18}  {:>18}",
                    f.batch,
                    f.what,
                    f.device_us,
                    format!("{} / {}", f.h2d.0, f.h2d.1),
                    format!("{} / {}", f.d2h.0, f.d2h.1)
                );
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Speed(a)) => bench_speed(&a),
        Command::Demo(a) => demo(a),
        Command::Study(StudyCommand::Gears(a)) => study_gears(&a),
        Command::Study(StudyCommand::Advise(a)) => study_advise(&a),
        Command::Conformance(a) => {
            use gearsim_host::conformance::{
                REQUIRED_PASS_RATE, SCOREBOARD_PATH, node_dir, run_suite,
            };
            let jobs = a
                .jobs
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
            let board = run_suite(&node_dir(a.dir.as_deref()), jobs)?;
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
    }
}

fn bench_speed(a: &BenchSpeedArgs) -> Result<(), Failure> {
    use gearsim_host::bench::speed::{Model, measure, mode_name};
    let cfg = ChipConfig::preset(&a.soc_version)?;
    let models = if a.only.is_empty() {
        Model::ALL.to_vec()
    } else {
        a.only
            .iter()
            .map(|n| {
                Model::parse(n).ok_or_else(|| {
                    anyhow!("--only: unknown model `{n}` (expected cnn or transformer)")
                })
            })
            .collect::<Result<Vec<_>>>()?
    };
    let all = [ExecMode::Full, ExecMode::TimingOnly];
    let modes = if a.modes.is_empty() {
        all.to_vec()
    } else {
        a.modes
            .iter()
            .map(|n| {
                all.into_iter().find(|&m| mode_name(m) == n).ok_or_else(|| {
                    anyhow!("--modes: unknown mode `{n}` (expected full or timing-only)")
                })
            })
            .collect::<Result<Vec<_>>>()?
    };
    for g in &a.gears {
        if !models
            .iter()
            .any(|m| m.gears().iter().any(|&v| &m.gear_label(v) == g))
        {
            return Err(anyhow!(
                "--gears: unknown gear `{g}` (expected b1, b4, b8, s16, s64 or s128)"
            )
            .into());
        }
    }
    if !(a.min_seconds.is_finite() && a.min_seconds >= 0.0) {
        return Err(anyhow!(
            "--min_seconds: expected a non-negative number, got {}",
            a.min_seconds
        )
        .into());
    }
    if !a.json {
        say!(
            "simulator speed on {}, one host thread, each figure run for at least {} s of host time:",
            cfg.name,
            a.min_seconds
        );
    }
    for model in models {
        let wanted = |&g: &i64| a.gears.is_empty() || a.gears.contains(&model.gear_label(g));
        if !model.gears().iter().any(wanted) {
            continue;
        }
        let om = model.compile(&cfg).map_err(|e| anyhow!(e))?;
        for &gear in model.gears() {
            if !wanted(&gear) {
                continue;
            }
            for &mode in &modes {
                let f =
                    measure(&cfg, model, &om, gear, mode, a.min_seconds).map_err(|e| anyhow!(e))?;
                if a.json {
                    say!("{}", f.json());
                } else if a.verbose {
                    say!(
                        "{}  [{} cycles, {} instr per run; {} runs in {:.2} s {}]",
                        f.line(),
                        f.count.cycles,
                        f.count.instructions,
                        f.runs,
                        f.host.as_secs_f64(),
                        f.clock.name()
                    );
                } else {
                    say!("{}", f.line());
                }
            }
        }
    }
    Ok(())
}

fn compile(a: &CompileArgs) -> Result<(), Failure> {
    if a.framework != 5 {
        return Err(anyhow!(
            "E10001: Value {} for parameter --framework is invalid. Reason: gearsim reads ONNX \
             models only (--framework=5)",
            a.framework
        )
        .into());
    }
    let table_layout = TableLayout::parse(&a.gear_table_layout).ok_or_else(|| {
        anyhow!(
            "--gear_table_layout: expected one of {}, got `{}`",
            TableLayout::names(),
            a.gear_table_layout
        )
    })?;
    let mapindex_engine = MapIndexEngine::parse(&a.mapindex_engine).ok_or_else(|| {
        anyhow!(
            "--mapindex_engine: expected aicore or aicpu, got `{}`",
            a.mapindex_engine
        )
    })?;
    let chip = ChipConfig::preset(&a.soc_version)?;
    let opts = CompileOptions {
        gear: GearOptions {
            input_shape: a.input_shape.clone(),
            dynamic_batch_size: a.dynamic_batch_size.clone(),
            dynamic_image_size: a.dynamic_image_size.clone(),
            dynamic_dims: a.dynamic_dims.clone(),
            input_format: a.input_format.clone(),
            ..GearOptions::default()
        },
        getnext_sink: a.getnext_sink,
        table_layout,
        mapindex_engine,
        target: atc::target(&chip),
    };
    let om = atc::om_path(&a.output);
    let dumps = atc::Dumps {
        graph: a.dump_graph.as_deref(),
        kernels: a.dump_kernels.as_deref(),
    };
    if a.hybrid && a.getnext_sink {
        return Err(anyhow!(
            "--hybrid and --getnext_sink exclude each other: in sink mode the device picks the \
             branch, so there is no host-side fallback to take"
        )
        .into());
    }
    let r = atc::compile_file(&a.model, &om, &opts, &chip, dumps, a.hybrid)?;
    for note in &r.compiled.notes {
        eprintln!("note: {note}");
    }
    let m = &r.compiled.desc.memory;
    let gears = r
        .compiled
        .desc
        .dynamic
        .as_ref()
        .map_or(0, |d| d.gears.len());
    say!(
        "{}: {} bytes, {} gear(s), {} kernel(s), weights {} B, feature maps {} B (largest gear), \
         inputs {} B, outputs {} B; compiled in {:.1} ms, verified in {:.1} ms ({} launches)",
        r.om.display(),
        r.om_bytes,
        gears,
        r.compiled.emitted.kernels.len(),
        m.weight_bytes,
        m.feature_map_bytes,
        m.input_bytes,
        m.output_bytes,
        r.elapsed.as_secs_f64() * 1e3,
        r.verify_elapsed.as_secs_f64() * 1e3,
        r.verified.launches
    );
    for n in &r.verified.notes {
        eprintln!("note: verifier: {n}");
    }
    for d in &r.dumps {
        say!("dump: {}", d.display());
    }
    Ok(())
}

fn study_gears(a: &StudyGearsArgs) -> Result<(), Failure> {
    use gearsim_host::study::gears::{
        self, GearStudy, ModelWorkload, QueryGear, TableHome, Workload,
    };
    use gearsim_host::study::{Shard, host_threads};
    let chip = a.chip.config()?;
    let mut study = GearStudy::default_sweep(chip);
    if let Some(path) = &a.model {
        let onnx =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        study.workload = Workload::Model(Box::new(ModelWorkload {
            onnx,
            file: path.display().to_string(),
            gear: GearOptions {
                input_shape: a.input_shape.clone(),
                dynamic_batch_size: a.dynamic_batch_size.clone(),
                dynamic_image_size: a.dynamic_image_size.clone(),
                dynamic_dims: a.dynamic_dims.clone(),
                input_format: a.input_format.clone(),
                ..GearOptions::default()
            },
        }));
    } else if a.input_shape.is_some()
        || a.dynamic_batch_size.is_some()
        || a.dynamic_image_size.is_some()
        || a.dynamic_dims.is_some()
    {
        return Err(anyhow!(
            "--input_shape and the gear options describe --model; the synthetic study makes its own"
        )
        .into());
    }
    if !a.gear_counts.is_empty() {
        study.gear_counts = a.gear_counts.clone();
    }
    if !a.dims.is_empty() {
        if a.model.is_some() {
            return Err(anyhow!(
                "--dims sets the synthetic model's gear vector length; --model's is fixed by its \
                 --input_shape"
            )
            .into());
        }
        study.vector_lengths = a.dims.clone();
    }
    study.layouts = a
        .layouts
        .iter()
        .map(|l| {
            TableLayout::parse(l).ok_or_else(|| {
                anyhow!(
                    "--layouts: expected some of {}, got `{l}`",
                    TableLayout::names()
                )
            })
        })
        .collect::<Result<_>>()?;
    study.engines = a
        .engines
        .iter()
        .map(|e| {
            MapIndexEngine::parse(e)
                .ok_or_else(|| anyhow!("--engines: expected aicore or aicpu, got `{e}`"))
        })
        .collect::<Result<_>>()?;
    study.homes = a
        .table_homes
        .iter()
        .map(|h| {
            TableHome::parse(h)
                .ok_or_else(|| anyhow!("--table_homes: expected hbm or l2, got `{h}`"))
        })
        .collect::<Result<_>>()?;
    study.query = QueryGear::parse(&a.query_gear).ok_or_else(|| {
        anyhow!(
            "--query_gear: expected first, middle or last, got `{}`",
            a.query_gear
        )
    })?;
    study.seed = a.seed;
    let shard = Shard::parse(&a.shard)?;
    let threads = a.threads.unwrap_or_else(host_threads).max(1);
    let started = std::time::Instant::now();
    // Points finish out of order on several threads; the counter numbers them as they end.
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let progress = |_: usize, total: usize, p: &gears::Point, r: &Result<Vec<gears::Row>, _>| {
        let n = finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if r.is_ok() {
            eprintln!("[{n}/{total}] point {} {p}", p.index);
        }
    };
    let rows = gears::run(&study, shard, threads, &progress)?;
    let (csv, svg) = gears::write_outputs(&a.output_dir, &rows, &study.chip.name)?;
    say!(
        "{} row(s) of shard {shard} on {threads} thread(s) in {:.1} s: {} and {}",
        rows.len(),
        started.elapsed().as_secs_f64(),
        csv.display(),
        svg.display()
    );
    say_raw(&gears::summary(&rows));
    Ok(())
}

fn study_advise(a: &StudyAdviseArgs) -> Result<(), Failure> {
    use gearsim_compiler::options::parse_input_shape;
    use gearsim_host::study::advise::{
        self, AdviseOptions, PadPolicy, default_mode, parse_bytes, parse_shapes,
    };
    let chip = a.chip.config()?;
    let onnx =
        std::fs::read(&a.model).with_context(|| format!("cannot read {}", a.model.display()))?;
    let inputs =
        parse_input_shape(&a.input_shape, true).map_err(|e| anyhow!("--input_shape: {e}"))?;
    let mode = match a.gear_option.as_deref() {
        None => default_mode(&inputs),
        Some("dynamic_batch_size") => DynamicMode::Batch,
        Some("dynamic_image_size") => DynamicMode::ImageSize,
        Some("dynamic_dims") => DynamicMode::Dims,
        Some(other) => {
            return Err(anyhow!(
                "--gear_option: expected dynamic_batch_size, dynamic_image_size or dynamic_dims, \
                 got `{other}`"
            )
            .into());
        }
    };
    let text = std::fs::read_to_string(&a.shapes)
        .with_context(|| format!("cannot read {}", a.shapes.display()))?;
    let shapes = parse_shapes(&text, &a.shapes.display().to_string(), &inputs, mode)?;
    let memory_budget = match &a.memory_budget {
        None => None,
        Some(s) => Some(parse_bytes(s).ok_or_else(|| {
            anyhow!("--memory_budget: expected bytes with an optional K, M or G suffix, got `{s}`")
        })?),
    };
    let pad = PadPolicy::parse(&a.pad)
        .ok_or_else(|| anyhow!("--pad: expected auto or never, got `{}`", a.pad))?;
    let threads = a
        .threads
        .unwrap_or_else(gearsim_host::study::host_threads)
        .max(1);
    let started = std::time::Instant::now();
    let adv = advise::advise(&AdviseOptions {
        onnx,
        file: a.model.display().to_string(),
        input_shape: a.input_shape.clone(),
        input_format: a.input_format.clone(),
        mode: Some(mode),
        shapes,
        gear_budget: a.gear_budget,
        memory_budget,
        pad,
        host_us_per_op: a.host_us_per_op,
        chip,
        threads,
    })?;
    let files = advise::write_outputs(&a.output_dir, &adv)?;
    say_raw(&advise::summary(&adv));
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    say!(
        "{} in {:.1} s on {threads} thread(s)",
        names.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn load_program(path: &Path) -> Result<Program> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().to_string());
    if path.extension().is_some_and(|e| e == "bin") {
        let p = Program::decode(stem, &bytes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        return Ok(p);
    }
    let text =
        String::from_utf8(bytes).map_err(|e| anyhow!("{}: not UTF-8 text: {e}", path.display()))?;
    let mut p = gearsim_isa::assemble(&text, &path.display().to_string())?;
    if p.name.is_none() {
        p.name = stem;
    }
    Ok(p)
}

fn run_command(a: RunArgs) -> Result<(), Failure> {
    use gearsim_host::runner;
    let req = runner::RunRequest {
        model: a.model.clone(),
        inputs: a.input.clone(),
        output_dir: a.output_dir.clone(),
        mode: a.mode.as_deref().map(runner::Mode::parse).transpose()?,
        soc_version: a.soc_version.clone(),
        timing_only: a.timing_only,
        repeat: a.repeat,
        input_fusion_size: a.input_fusion_size,
    };
    // The trace is opened for the chip the model names; the runner checks the rest.
    let mode = if a.timing_only {
        ExecMode::TimingOnly
    } else {
        ExecMode::Full
    };
    let om = std::fs::read(&a.model)
        .with_context(|| format!("cannot read the model {}", a.model.display()))?;
    let soc = gearsim_isa::om::OmFile::parse(&om)
        .and_then(|f| f.desc())
        .map(|d| d.soc_version)
        .map_err(|e| anyhow!("{}: {e}", a.model.display()))?;
    let cfg = ChipConfig::preset(a.soc_version.as_deref().unwrap_or(&soc))
        .with_context(|| format!("{}: no chip to run it on", a.model.display()))?;
    let sink = open_trace(&a.trace, &cfg, "run", mode)?;
    let show = a.repeat > 1 && !a.json;
    let mut progress = |done: u32, total: u32| {
        if show {
            eprint!("\rrun {done}/{total}");
            if done == total {
                eprintln!();
            }
        }
    };
    let (outcome, sink) = runner::run(&req, sink, &mut progress)?;
    if a.json {
        say!("{}", outcome.json());
    } else {
        for line in outcome.text() {
            say!("{line}");
        }
        if a.timing_only {
            say!("timing-only: no values were computed, so no outputs were written");
        }
    }
    for w in &outcome.last.warnings {
        log::warn!("{w}");
    }
    finish_trace_quiet(sink, a.json)?;
    Ok(())
}

fn finish_trace_quiet(sink: Option<TraceFileWriter>, quiet: bool) -> Result<()> {
    if quiet {
        if let Some(w) = sink {
            w.finish()?;
        }
        Ok(())
    } else {
        finish_trace(sink)
    }
}

fn open_trace(
    path: &Option<PathBuf>,
    cfg: &ChipConfig,
    what: &str,
    mode: ExecMode,
) -> Result<Option<TraceFileWriter>> {
    let Some(path) = path else { return Ok(None) };
    let mut w = TraceFileWriter::create(path)?;
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

fn finish_trace(sink: Option<TraceFileWriter>) -> Result<()> {
    if let Some(w) = sink {
        let n = w.record_count();
        let dest = w.dest().to_path_buf();
        w.finish()?;
        say!("trace: {} ({n} records)", dest.display());
    }
    Ok(())
}

fn kernel_run(a: KernelRunArgs) -> Result<(), Failure> {
    let cfg = a.chip.config()?;
    let program = load_program(&a.file)?;
    let args = parse_args(&a.args)?;
    let mode = if a.timing_only {
        ExecMode::TimingOnly
    } else {
        ExecMode::Full
    };
    let sink = open_trace(
        &a.trace,
        &cfg,
        &format!("kernel run {}", a.file.display()),
        mode,
    )?;
    let mut dev = Device::new(cfg, sink);
    let result = run_kernel(&mut dev, program, a.block_dim, &args, mode);
    match result {
        Ok(report) => {
            say!("{report}");
            save_buffers(&dev, &report, a.output_dir.as_deref())?;
            finish_trace(dev.into_sink())?;
            Ok(())
        }
        Err(e) => {
            // A hardware fault still leaves a useful trace of everything up to the fault.
            if matches!(
                e,
                gearsim_host::kernel::RunError::Device(DeviceError::Fault(_))
            ) {
                finish_trace(dev.into_sink())?;
            }
            Err(e.into())
        }
    }
}

fn save_buffers<S: TraceSink>(
    dev: &Device<S>,
    report: &KernelRunReport,
    dir: Option<&Path>,
) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for b in &report.buffers {
        let Some(name) = &b.name else { continue };
        let mut bytes = vec![0u8; b.len as usize];
        dev.read(b.ptr, &mut bytes)?;
        let path = dir.join(format!("{name}.bin"));
        write_atomic(&path, &bytes)?;
        say!("saved {name}: {} ({} bytes)", path.display(), b.len);
    }
    Ok(())
}

fn demo(a: DemoArgs) -> Result<(), Failure> {
    let cfg = a.chip.config()?;
    say!("== gearsim demo on {} ==", cfg.name);
    say!(
        "Compiles the built-in CNN (dynamic batch 1,4,8) and the seed's three-input model \
         (dynamic dims), each for non-sink (hybrid) and GetNext sink mode; runs every gear in \
         both modes and one unmatched shape through the hybrid dynamic path.\n"
    );
    let sink = open_trace(&a.trace, &cfg, "demo", ExecMode::Full)?;
    say!("{}", gearsim_host::demo::header());
    let mut show = |r: &gearsim_host::demo::Row| say!("{}", r.line());
    let (rows, sink) = gearsim_host::demo::run(&cfg, sink, &mut show)
        .map_err(|error| Failure { code: 2, error })?;
    say!(
        "\nall {} runs checked: sink and non-sink bit-identical at every gear, \
         cur_dynamic_dims equal to the gear, the dynamic path equal to the reference",
        rows.len()
    );
    finish_trace(sink)?;
    Ok(())
}

fn kernel_demo(a: DemoArgs) -> Result<(), Failure> {
    let cfg = a.chip.config()?;
    let source = |name: &str| -> Result<Program> {
        let text =
            examples::source(name).ok_or_else(|| anyhow!("missing built-in kernel {name}"))?;
        Ok(gearsim_isa::assemble(text, name)?)
    };
    let cores = cfg.core.count;
    let n: u64 = u64::from(cores) * 32768;
    say!("== gearsim demo on {} ==\n", cfg.name);
    say!(
        "-- double-buffered fp16 vector add, {n} elements over {cores} cores (full mode, checked)"
    );
    let sink = open_trace(&a.trace, &cfg, "demo", ExecMode::Full)?;
    let mut dev = Device::new(cfg.clone(), sink);
    let args = parse_args(&format!(
        "x=rand:f16:{n}:1,y=rand:f16:{n}:2,z=zeros:{},{n}",
        2 * n
    ))?;
    let report = run_kernel(
        &mut dev,
        source("vadd_f16_db.s")?,
        cores,
        &args,
        ExecMode::Full,
    )?;
    say!("{report}");
    let read = |b: &gearsim_host::kernel::ArgBuffer| -> Result<Vec<half::f16>> {
        let mut bytes = vec![0u8; b.len as usize];
        dev.read(b.ptr, &mut bytes)?;
        Ok(bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect())
    };
    let (x, y, z) = (
        read(&report.buffers[0])?,
        read(&report.buffers[1])?,
        read(&report.buffers[2])?,
    );
    let wrong = (0..x.len())
        .filter(|&i| half::f16::from_f32(x[i].to_f32() + y[i].to_f32()) != z[i])
        .count();
    if wrong > 0 {
        return Err(Failure {
            code: 2,
            error: anyhow!("vector add result differs from the reference in {wrong} elements"),
        });
    }
    say!("result: all {n} sums equal the fp16 reference\n");
    finish_trace(dev.into_sink())?;

    say!("-- cube: 256 mmad 128x256x128 on one core (timing-only)");
    let mut dev = Device::new(cfg.clone(), None::<TraceFileWriter>);
    let args = parse_args("zeros:65536,zeros:65536,zeros:32768,256")?;
    say!(
        "{}\n",
        run_kernel(
            &mut dev,
            source("mmad_loop.s")?,
            1,
            &args,
            ExecMode::TimingOnly
        )?
    );

    say!("-- DMA: every core streams 8 MiB from HBM into UB (timing-only)");
    let total = u64::from(cores) * (8 << 20);
    let mut dev = Device::new(cfg.clone(), None::<TraceFileWriter>);
    let args = parse_args(&format!("zeros:{total},{total}"))?;
    let report = run_kernel(
        &mut dev,
        source("dma_stream.s")?,
        cores,
        &args,
        ExecMode::TimingOnly,
    )?;
    say!("{report}");
    let gbps =
        total as f64 / ((report.launch.end.0 - report.launch.first_start.0) as f64 / 1e12) / 1e9;
    say!(
        "achieved {gbps:.1} GB/s of the {:.1} GB/s HBM cap",
        cfg.memory.hbm_bytes_per_second as f64 / 1e9
    );
    if report.cycles() == 0 {
        return Err(Failure {
            code: 2,
            error: anyhow!("demo produced an empty run"),
        });
    }
    Ok(())
}
