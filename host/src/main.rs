//! The `gearsim` command line: every subcommand and flag is defined once here, with its help.
//! Exit codes: 0 success, 1 a problem with the user's input (or a fault of the simulated
//! hardware caused by it), 2 an internal error of gearsim.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use clap::{Args, Parser, Subcommand, ValueEnum};
use gearsim_firmware::{Device, DeviceError};
use gearsim_host::atc::{self, info_json, load_desc};
use gearsim_host::compiler::options::GearOptions;
use gearsim_host::compiler::pipeline::{CompileOptions, MapIndexEngine, TableLayout};
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
    /// List the ONNX operators the compiler supports.
    Ops,
    /// Run the built-in demo: the example kernels on the default chip, results checked.
    Demo(DemoArgs),
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
    /// Gear table layout in device memory: gear_major (GE's) or dim_major8.
    #[arg(long = "gear_table_layout", default_value = "gear_major")]
    gear_table_layout: String,
    /// Engine that runs MapIndex: aicore or aicpu.
    #[arg(long = "mapindex_engine", default_value = "aicore")]
    mapindex_engine: String,
    /// Write the graph before and after the gear passes as text into DIR.
    #[arg(long = "dump_graph", value_name = "DIR")]
    dump_graph: Option<PathBuf>,
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
    /// Busy time per lane, top span names and the trace window.
    Summary(SummaryArgs),
    /// Compare the lanes of two traces.
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
    /// Write a trace of the vector-add run to this .gtrace file.
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
        Command::Ops => {
            for op in gearsim_host::compiler::ops::standard().ops() {
                say!("{op}");
            }
            Ok(())
        }
        Command::Demo(a) => demo(a),
    }
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
            "--gear_table_layout: expected gear_major or dim_major8, got `{}`",
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
    let r = atc::compile_file(&a.model, &om, &opts, a.dump_graph.as_deref())?;
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
        "{}: {} bytes, {} gear(s), weights {} B, feature maps {} B (largest gear), inputs {} B, \
         outputs {} B; compiled in {:.1} ms",
        r.om.display(),
        r.om_bytes,
        gears,
        m.weight_bytes,
        m.feature_map_bytes,
        m.input_bytes,
        m.output_bytes,
        r.elapsed.as_secs_f64() * 1e3
    );
    for d in &r.dumps {
        say!("graph dump: {}", d.display());
    }
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
