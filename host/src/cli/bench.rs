//! `gearsim bench kernels | runtime | speed`: kernel efficiency on the reference workloads,
//! runtime figures of the built-in CNN, and the simulator's own speed.

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use gearsim_sim::{ChipConfig, ExecMode};

use super::Failure;
use super::flags::ChipArgs;

#[derive(Subcommand)]
pub enum BenchCommand {
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
pub struct BenchKernelsArgs {
    #[command(flatten)]
    chip: ChipArgs,
    /// Only these workloads (matmul, conv, add), comma-separated.
    #[arg(long = "only", value_delimiter = ',')]
    only: Vec<String>,
}

#[derive(Args)]
pub struct BenchRuntimeArgs {
    #[command(flatten)]
    chip: ChipArgs,
}

#[derive(Args)]
pub struct BenchSpeedArgs {
    #[command(flatten)]
    chip: ChipArgs,
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
    /// Whole networks instead of the toy models: resnet18, resnet50, mobilenetv2, bertbase
    /// (comma-separated; fp32 as exported with random weights, computed in fp16). Each figure is a user's whole `gearsim run`
    /// (process start and load included) and the execution alone, with simulated cycles,
    /// instructions and MACs per host second.
    #[arg(long = "nets", value_delimiter = ',')]
    nets: Vec<String>,
    /// Batches of the networks (with --nets), comma-separated.
    #[arg(long = "batches", value_delimiter = ',', default_value = "1,8,32")]
    batches: Vec<i64>,
    /// With --nets, also time this many alternating pairs of whole `gearsim run`s, full then
    /// timing-only, and report the median of the pairs' ratios with its 95% confidence
    /// interval (from 6 pairs: the order statistics a fair binomial gives) (0: none).
    #[arg(long = "pairs", default_value_t = 0)]
    pairs: usize,
}

/// Runs a `gearsim bench` subcommand.
pub fn run(c: BenchCommand) -> Result<(), Failure> {
    match c {
        BenchCommand::Kernels(a) => kernels(&a),
        BenchCommand::Runtime(a) => runtime(&a),
        BenchCommand::Speed(a) => speed(&a),
    }
}

fn kernels(a: &BenchKernelsArgs) -> Result<(), Failure> {
    let cfg = a.chip.config()?;
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

fn runtime(a: &BenchRuntimeArgs) -> Result<(), Failure> {
    let cfg = a.chip.config()?;
    say!(
        "runtime figures of the built-in CNN (dynamic batch 1,4,8) on {}:",
        cfg.name
    );
    say!(
        "  {:>5}  {:<22} {:>10} {:>10} {:>10} {:>10}  {:>14}  {:>14}",
        "batch",
        "path",
        "e2e us",
        "host us",
        "device us",
        "execute us",
        "H2D n / bytes",
        "D2H n / bytes"
    );
    let figures = gearsim_host::bench::runtime_figures(&cfg).map_err(|e| anyhow!(e))?;
    for f in &figures {
        say!(
            "  {:>5}  {:<22} {:>10.1} {:>10.1} {:>10.1} {:>10.1}  {:>14}  {:>14}",
            f.batch,
            f.what,
            f.end_to_end_us,
            f.host_us,
            f.device_us,
            f.execute_us,
            format!("{} / {}", f.h2d.0, f.h2d.1),
            format!("{} / {}", f.d2h.0, f.d2h.1)
        );
    }
    let r = gearsim_host::bench::host_ratios(&figures).map_err(|e| anyhow!(e))?;
    say!(
        "e2e: from the call to its return; host: the runtime's own work in it (the preset's [host] \
         costs); device: the runtime stream's busy time; execute: the model's execution alone"
    );
    say!(
        "G1  static vs dynamic-shape, batch 1: the dynamic path takes {:.2}x the gear path end to \
         end (measured, CRNN on 310P3: 696 / 163 fps = 4.27x; not like for like)",
        r.dynamic_over_static
    );
    say!(
        "G4  host-side vs device-side selection, batch 1: non-sink's host-side gear selection \
         costs {:+.1} us end to end against sink's; the device-side selection changes execution \
         time by {:+.1} us (measured: the host path adds 186-292 us end to end, the device scan \
         changes kernel time by <= 22 us)",
        r.host_selection_adds_us,
        r.device_selection_adds_us
    );
    Ok(())
}

fn speed(a: &BenchSpeedArgs) -> Result<(), Failure> {
    use gearsim_host::bench::speed::{Model, measure, mode_name};
    let cfg = a.chip.config()?;
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
    if !a.nets.is_empty() {
        return net_speed(a, &cfg, &modes);
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

/// `bench speed --nets`: whole networks at each batch and mode.
fn net_speed(a: &BenchSpeedArgs, cfg: &ChipConfig, modes: &[ExecMode]) -> Result<(), Failure> {
    use gearsim_host::bench::speed::{measure_net, pair_net};
    use gearsim_host::calibrate::nets::Net;
    let nets = a
        .nets
        .iter()
        .map(|n| {
            Net::network(n).ok_or_else(|| {
                anyhow!(
                    "--nets: expected some of {}, got `{n}`",
                    Net::network_names()
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(b) = a.batches.iter().find(|b| **b < 1) {
        return Err(anyhow!("--batches: expected positive batches, got {b}").into());
    }
    let both = [ExecMode::Full, ExecMode::TimingOnly];
    if a.pairs > 0 && !both.iter().all(|m| modes.contains(m)) {
        return Err(anyhow!(
            "--pairs: compares full mode with timing-only, so --modes must keep both, got {}",
            a.modes.join(",")
        )
        .into());
    }
    let gearsim = std::env::current_exe().context("cannot find the gearsim binary")?;
    let work = std::env::temp_dir().join(format!("gearsim-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("{}", work.display()))?;
    if !a.json {
        say!(
            "whole networks on {} (fp32 models computed in fp16, random weights): a user's \
             `gearsim run`, and the execution alone on one host thread:",
            cfg.name
        );
    }
    let result = (|| -> Result<(), Failure> {
        for &net in &nets {
            for &batch in &a.batches {
                for &mode in modes {
                    let f = measure_net(cfg, net, batch, mode, &gearsim, &work)
                        .map_err(|e| anyhow!(e))?;
                    if a.json {
                        say!("{}", f.json());
                    } else {
                        say!("{}", f.line());
                    }
                }
                if a.pairs > 0 {
                    let p =
                        pair_net(net, batch, a.pairs, &gearsim, &work).map_err(|e| anyhow!(e))?;
                    if a.json {
                        say!("{}", p.json());
                    } else {
                        say!("{}", p.line());
                    }
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}
