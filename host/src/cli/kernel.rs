//! `gearsim kernel run | asm | disasm | demo`: hand-written AI core kernels assembled,
//! disassembled and run on the simulated chip.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use gearsim_firmware::{Device, DeviceError};
use gearsim_host::examples;
use gearsim_host::kernel::{ArgBuffer, KernelRunReport, RunError, parse_args, run_kernel};
use gearsim_isa::Program;
use gearsim_sim::ExecMode;
use gearsim_traces::atomic::write_atomic;
use gearsim_traces::{Level, TraceFileWriter, TraceSink};

use super::Failure;
use super::demo::DemoArgs;
use super::flags::{ChipArgs, TraceArgs};
use super::output::{exec_mode, finish_trace, say_raw};

#[derive(Subcommand)]
pub enum KernelCommand {
    /// Run a kernel (.s assembly or .bin binary) on the simulated chip and report its timing.
    Run(Box<KernelRunArgs>),
    /// Assemble a .s file into a binary kernel (16 bytes per instruction).
    Asm(AsmArgs),
    /// Print the disassembly of a .bin or .s kernel.
    Disasm(DisasmArgs),
    /// The built-in example kernels on the default chip (vector add checked, cube and DMA
    /// timing).
    Demo(DemoArgs),
}

#[derive(Args)]
pub struct KernelRunArgs {
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
    #[command(flatten)]
    trace: TraceArgs,
    /// Compute timing only, not values (same timeline, much faster on large data).
    #[arg(long = "timing_only")]
    timing_only: bool,
    /// Save every named argument buffer to DIR/NAME.bin after the run.
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Stop a block that runs longer than this many core cycles (a runaway kernel then ends
    /// in seconds, not after the chip's own 10^9-cycle timeout) [default: 5000000, 5 ms of
    /// device time at 1 GHz, or the chip file's `core.kernel_timeout_cycles` if smaller].
    #[arg(long = "max_cycles", value_name = "CYCLES")]
    max_cycles: Option<u64>,
}

/// `kernel run`'s default block limit: far above the example kernels, and a runaway kernel
/// streaming data on all 32 cores of `ascend910` in full mode stops in about 20 s of host time.
const DEFAULT_MAX_CYCLES: u64 = 5_000_000;

#[derive(Args)]
pub struct AsmArgs {
    /// Assembly file.
    file: PathBuf,
    /// Output binary.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

#[derive(Args)]
pub struct DisasmArgs {
    /// Kernel file: binary (.bin) or assembly (.s).
    file: PathBuf,
}

/// Runs a `gearsim kernel` subcommand.
pub fn run(c: KernelCommand) -> Result<(), Failure> {
    match c {
        KernelCommand::Run(a) => kernel_run(&a),
        KernelCommand::Demo(a) => kernel_demo(&a),
        KernelCommand::Asm(a) => {
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
        KernelCommand::Disasm(a) => {
            say_raw(&load_program(&a.file)?.disassemble());
            Ok(())
        }
    }
}

/// Reads a kernel: a `.bin` is decoded, anything else assembled.
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

fn kernel_run(a: &KernelRunArgs) -> Result<(), Failure> {
    let mut cfg = a.chip.config()?;
    cfg.core.kernel_timeout_cycles = match a.max_cycles {
        Some(0) => return Err(anyhow!("--max_cycles must be at least 1").into()),
        Some(n) => n,
        None => cfg.core.kernel_timeout_cycles.min(DEFAULT_MAX_CYCLES),
    };
    let program = load_program(&a.file)?;
    let args = parse_args(&a.args)?;
    let mode = exec_mode(a.timing_only);
    let sink = a.trace.open(
        &cfg,
        &format!("kernel run {}", a.file.display()),
        mode,
        Level::Instruction,
    )?;
    let mut dev = Device::new(cfg, sink);
    let result = run_kernel(&mut dev, program, a.block_dim, &args, mode);
    match result {
        Ok(report) => {
            say!("{report}");
            save_buffers(&mut dev, &report, a.output_dir.as_deref())?;
            finish_trace(dev.into_sink())?;
            Ok(())
        }
        Err(e) => {
            // A hardware fault still leaves a useful trace of everything up to the fault.
            if matches!(e, RunError::Device(DeviceError::Fault(_))) {
                finish_trace(dev.into_sink())?;
            }
            if e.is_timeout() {
                let given = if a.max_cycles.is_some() {
                    "the limit --max_cycles gives"
                } else {
                    "`kernel run`'s default limit"
                };
                return Err(anyhow!(
                    "{e}: {given}; a kernel that needs longer runs with a larger --max_cycles"
                )
                .into());
            }
            Err(e.into())
        }
    }
}

fn save_buffers<S: TraceSink>(
    dev: &mut Device<S>,
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

fn kernel_demo(a: &DemoArgs) -> Result<(), Failure> {
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
    let sink = a
        .trace
        .open(&cfg, "demo", ExecMode::Full, Level::Instruction)?;
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
    let mut read = |b: &ArgBuffer| -> Result<Vec<half::f16>> {
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
        return Err(Failure::Internal(anyhow!(
            "vector add result differs from the reference in {wrong} elements"
        )));
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
        return Err(Failure::Internal(anyhow!("demo produced an empty run")));
    }
    Ok(())
}
