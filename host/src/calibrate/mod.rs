//! `gearsim calibrate`: simulated times against published measurements of real chips.
//!
//! The targets (`targets.csv`, from `spec/calibration.md`) name a workload, a chip preset, a
//! batch, a precision and the measured figure. Each workload is built here ([`nets`]: the
//! network's structure with seeded random weights — timing does not depend on values),
//! compiled for its batch on its preset, loaded, run once to warm up and once measured, in
//! timing-only mode, with a kernel profile. The figure compared is what the row's measurement
//! timed ([`Timer`]): for ais_bench's NPU compute time, the `aclmdlExecute` call as a host
//! timer around it sees it (submission, execution, wake-up); for a kernel or transfer
//! measured on the device, the device time alone.
//!
//! ```text
//!   targets.csv ─▶ Row ─▶ nets::Net::onnx ─▶ compile ─▶ Runtime (timing-only, profile) ─▶ Outcome
//!                                                                      │
//!                          table, summary, CSV, SVG  ◀── per-kernel ───┘
//! ```

pub mod nets;

use std::fmt::Write as _;

use gearsim_firmware::KernelProfile;
use gearsim_isa::Pipe;
use gearsim_isa::task::KernelKind;
use gearsim_sim::{ChipConfig, ExecMode, Setting, Traffic};

use crate::runtime::{Runtime, RuntimeOptions};
use crate::study::svg::{Figure, Panel, Series, render};
use gearsim_compiler::ir::Tensor;
use gearsim_compiler::memory::BufferOptimize;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_compiler::precision::PrecisionMode;
use nets::{CopyDirection, DType, Net};

/// The committed targets.
pub const TARGETS: &str = include_str!("targets.csv");

/// A row is within the band when simulated / measured is within ±20%.
pub const BAND: f64 = 0.20;

/// What a measured figure timed, so that the simulated figure compared with it times the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// ais_bench's NPU compute time: its `ModelInferenceProcessor::Execute` takes
    /// `gettimeofday` before and after the synchronous `aclmdlExecute`, so the host's
    /// submission and the wake-up after the execution are in the figure.
    AisBench,
    /// Device time only: a profiler's task or kernel time, a bandwidth test's copy, or a
    /// throughput over back-to-back launches (which hides each launch's host cost).
    Device,
}

impl Timer {
    /// The targets table's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Timer::AisBench => "ais_bench",
            Timer::Device => "device",
        }
    }

    fn parse(s: &str) -> Option<Timer> {
        match s {
            "ais_bench" => Some(Timer::AisBench),
            "device" => Some(Timer::Device),
            _ => None,
        }
    }
}

/// One calibration target.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Target id in calibration.md (`M1`).
    pub id: String,
    /// The workload.
    pub net: Net,
    /// Chip preset.
    pub chip: String,
    /// Images per execution.
    pub batch: i64,
    /// atc precision mode of the measurement.
    pub precision: PrecisionMode,
    /// Whether the measurement had AIPP on the first layer.
    pub aipp: bool,
    /// Whether its atc command had `--enable_small_channel=1` (the first layer loads C04).
    pub small_channel: bool,
    /// What the measurement timed.
    pub timer: Timer,
    /// Published throughput, images per second.
    pub fps: f64,
    /// Where the figure is published.
    pub source: String,
}

impl Row {
    /// The workload as an ONNX model (what the row compiles): fp32, as exported; the row's
    /// precision mode decides what the chip computes in.
    pub fn model(&self) -> Vec<u8> {
        self.net.onnx(self.batch, DType::F32, 1)
    }

    /// The measured time of one execution, in microseconds.
    pub fn measured_us(&self) -> f64 {
        1e6 * self.batch as f64 / self.fps
    }
}

/// Parses a targets table; errors name the line and field.
pub fn parse_targets(text: &str, file: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.splitn(10, ',').map(str::trim).collect();
        let at = |field: &str, msg: String| format!("{file}:{line_no}: field `{field}`: {msg}");
        if f.len() != 10 {
            return Err(format!(
                "{file}:{line_no}: expected 10 comma-separated fields (id,net,chip,batch,precision,aipp,small_channel,timer,fps,source), got {}",
                f.len()
            ));
        }
        let net = Net::parse(f[1]).ok_or_else(|| {
            at(
                "net",
                format!("expected resnet18, resnet50 or gemmMxNxK, got `{}`", f[1]),
            )
        })?;
        // Its preset's own name (atc's spellings resolve to it), which `ChipOverride` compares.
        let chip = ChipConfig::preset(f[2])
            .map_err(|e| at("chip", e.to_string()))?
            .name;
        let batch: i64 = f[3].parse().ok().filter(|b| *b >= 1).ok_or_else(|| {
            at(
                "batch",
                format!("expected a positive integer, got `{}`", f[3]),
            )
        })?;
        let switch = |k: usize, field: &str| match f[k] {
            "on" => Ok(true),
            "off" => Ok(false),
            other => Err(at(field, format!("expected on or off, got `{other}`"))),
        };
        let aipp = switch(5, "aipp")?;
        let small_channel = switch(6, "small_channel")?;
        let timer = Timer::parse(f[7]).ok_or_else(|| {
            at(
                "timer",
                format!("expected ais_bench or device, got `{}`", f[7]),
            )
        })?;
        let fps: f64 = f[8]
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v > 0.0)
            .ok_or_else(|| at("fps", format!("expected a positive number, got `{}`", f[8])))?;
        let precision = PrecisionMode::parse(f[4]).map_err(|e| at("precision", e.to_string()))?;
        rows.push(Row {
            id: f[0].to_string(),
            net,
            chip,
            batch,
            precision,
            aipp,
            small_channel,
            timer,
            fps,
            source: f[9].to_string(),
        });
    }
    Ok(rows)
}

/// One kernel of a run as the per-kernel table shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelLine {
    /// Kernel (op) name.
    pub name: String,
    /// From its task's start to its last block's end, in microseconds.
    pub us: f64,
    /// Blocks it launched.
    pub block_dim: u32,
    /// Share of the chip's cube capacity busy over its duration (all cores).
    pub cube: f64,
    /// Share of the chip's MTE1 capacity (L1 to L0A / L0B: Load2D and img2col) busy over its
    /// duration (the cube cores).
    pub mte1: f64,
    /// Share of the chip's MTE2 capacity busy over its duration (all cores).
    pub mte2: f64,
    /// Share of the chip's vector capacity busy over its duration (all cores).
    pub vector: f64,
    /// Device-memory traffic over its duration.
    pub traffic: Traffic,
}

/// The simulated figure of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The row.
    pub row: Row,
    /// The simulated figure compared with the measured one, in microseconds: what the row's
    /// [`Timer`] times (the `aclmdlExecute` call, or the device time), or a part of it.
    pub simulated_us: f64,
    /// The model's whole execution on the device, in microseconds (what the kernels' shares
    /// are of).
    pub execute_us: f64,
    /// Its kernels in launch order.
    pub kernels: Vec<KernelLine>,
    /// What the reproduction leaves out of the measured setup.
    pub notes: Vec<String>,
    /// Why the row could not be simulated (then the time is 0 and the row is out of band).
    pub error: Option<String>,
    /// The simulated chip's HBM bandwidth (bytes a second; 0 when the row did not run).
    pub hbm_bytes_per_second: u64,
}

impl Outcome {
    /// Simulated over measured.
    pub fn ratio(&self) -> f64 {
        self.simulated_us / self.row.measured_us()
    }

    /// Whether the ratio is within the ±20% band.
    pub fn in_band(&self) -> bool {
        self.error.is_none() && (self.ratio() - 1.0).abs() <= BAND
    }
}

/// `busy_cycles` of `pipe` over `ps` picoseconds as a share of what the cores that have the
/// pipe could do in that time (the cube's over the cube cores of a separated chip, the vector
/// unit's over its vector cores).
pub fn busy_share(busy_cycles: u64, pipe: Pipe, ps: f64, cfg: &ChipConfig) -> f64 {
    let cycles = ps.max(1.0) * cfg.core.clock_mhz as f64 / 1e6;
    busy_cycles as f64 / (cycles * f64::from(cfg.cores_with(pipe).max(1)))
}

fn kernel_line(k: &KernelProfile, cfg: &ChipConfig) -> KernelLine {
    let ps = k.end.0.saturating_sub(k.launched.0).max(1) as f64;
    let share = |pipe: Pipe| busy_share(k.work.pipe(pipe).busy_cycles, pipe, ps, cfg);
    KernelLine {
        name: k.name.clone(),
        us: ps / 1e6,
        block_dim: k.block_dim,
        cube: share(Pipe::M),
        mte1: share(Pipe::Mte1),
        mte2: share(Pipe::Mte2),
        vector: share(Pipe::V),
        traffic: k.traffic,
    }
}

/// Builds, compiles and runs one row; a row that cannot be built, compiled or run is an
/// outcome with its error (the table reports every row).
pub fn run_row(row: &Row) -> Outcome {
    run_row_on(row, None, BufferOptimize::default())
}

/// How the rows' chips differ from their presets (a sensitivity study), as their notes say.
#[derive(Debug, Clone, Default)]
pub struct ChipOverride {
    /// A changed chip (a file's configuration, any settings already applied) and where it came
    /// from: the rows of the preset its `name` gives run on it instead.
    pub file: Option<(ChipConfig, String)>,
    /// `section.key=value` changes to every other row's preset.
    pub settings: Vec<Setting>,
}

impl ChipOverride {
    /// Whether the row runs on the changed chip file.
    pub fn applies_to(&self, row: &Row) -> bool {
        self.file
            .as_ref()
            .is_some_and(|(cfg, _)| cfg.name.eq_ignore_ascii_case(&row.chip))
    }

    /// The chip the row runs on, and a note saying how it is not the preset.
    pub fn config_for(&self, row: &Row) -> Result<(ChipConfig, Option<String>), String> {
        if let Some((cfg, origin)) = self.file.as_ref().filter(|_| self.applies_to(row)) {
            return Ok((
                cfg.clone(),
                Some(format!("chip: {origin} (not the preset)")),
            ));
        }
        let cfg = ChipConfig::preset_with(&row.chip, &self.settings).map_err(|e| e.to_string())?;
        let note =
            (!self.settings.is_empty()).then(|| format!("set: {}", Setting::list(&self.settings)));
        Ok((cfg, note))
    }
}

/// [`run_row`], on `chip` when the row's preset is the one it changes, compiled with atc's
/// `--buffer_optimize` set to `buffer_optimize`.
pub fn run_row_on(
    row: &Row,
    chip: Option<&ChipOverride>,
    buffer_optimize: BufferOptimize,
) -> Outcome {
    simulate(row, chip, buffer_optimize).unwrap_or_else(|e| Outcome {
        row: row.clone(),
        simulated_us: 0.0,
        execute_us: 0.0,
        kernels: Vec::new(),
        notes: Vec::new(),
        error: Some(e),
        hbm_bytes_per_second: 0,
    })
}

/// The AIPP configuration of the rows measured with AIPP on.
const AIPP_IMAGENET: &str = include_str!("aipp_imagenet.cfg");

fn simulate(
    row: &Row,
    chip: Option<&ChipOverride>,
    buffer_optimize: BufferOptimize,
) -> Result<Outcome, String> {
    let mut notes = Vec::new();
    if buffer_optimize != BufferOptimize::default() {
        notes.push(format!("buffer_optimize: {}", buffer_optimize.name()));
    }
    let (cfg, note) = chip.map_or_else(
        || ChipOverride::default().config_for(row),
        |c| c.config_for(row),
    )?;
    notes.extend(note);
    if let Net::Copy { direction, bytes } = row.net {
        notes.push("the copy size is assumed (the measurement does not give it)".into());
        if direction == CopyDirection::DeviceToDevice {
            notes.push(
                "bandwidth counts the bytes read and written (2 x size / time), as device-copy \
                 bandwidth tests report it; the measured figure is at 96% of HBM, a copy-size \
                 rate would be above it"
                    .into(),
            );
        }
        let us = copy_us(&cfg, direction, bytes)?;
        return Ok(Outcome {
            row: row.clone(),
            simulated_us: us,
            execute_us: us,
            kernels: Vec::new(),
            notes,
            error: None,
            hbm_bytes_per_second: cfg.memory.hbm_bytes_per_second,
        });
    }
    let run = run_workload(
        &Workload {
            net: row.net,
            batch: row.batch,
            precision: row.precision,
            aipp: row.aipp,
            small_channel: row.small_channel,
        },
        &cfg,
        buffer_optimize,
    )?;
    notes.extend(run.notes);
    if let Net::QuantGemm { .. } = row.net {
        notes.push(
            "int8 product dequantised per channel to fp16; the measured kernel also scales per \
             token and writes bf16 (one more multiply on the AIVs, same bytes)"
                .into(),
        );
    }
    let name = format!("{}_b{}.onnx", row.net.name(), row.batch);
    let execute_us = run.execute_us;
    let simulated_us = if row.net == Net::MixStartup {
        notes.push(
            "the MIX kernel's start-up delay (task start to first block) minus the vector \
             kernel's; the preset's mix_launch_ns is this row's midpoint (fitted: K20), so the \
             row checks that the firmware charges it once per MIX launch"
                .into(),
        );
        mix_extra_startup_us(&run.kernels).map_err(|e| format!("{name}: {e}"))?
    } else if let Net::Conv { .. } = row.net {
        let (us, rest_us) = conv_kernel_us(&run.kernels).map_err(|e| format!("{name}: {e}"))?;
        notes.push(format!(
            "the 3x3 convolution's kernel alone, its sides kept in NC1HWC0 by a pointwise \
             convolution before it and a GlobalAveragePool after it, whose kernels and layout \
             conversion ({rest_us:.1} us) are left out; the measured kernel writes fp32, this \
             one fp16"
        ));
        us
    } else if row.timer == Timer::AisBench {
        notes.push(format!(
            "ais_bench times the aclmdlExecute call on the host: {:.1} us of submission and \
             wake-up around {execute_us:.1} us on the device",
            run.execute_call_us - execute_us
        ));
        run.execute_call_us
    } else {
        execute_us
    };
    Ok(Outcome {
        row: row.clone(),
        simulated_us,
        execute_us,
        kernels: run.kernels.iter().map(|k| kernel_line(k, &cfg)).collect(),
        notes,
        error: None,
        hbm_bytes_per_second: cfg.memory.hbm_bytes_per_second,
    })
}

/// A workload as a calibration row or a prediction runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// The network.
    pub net: Net,
    /// Images (sequences) per execution.
    pub batch: i64,
    /// atc precision mode.
    pub precision: PrecisionMode,
    /// AIPP on the first layer (the built-in ImageNet configuration).
    pub aipp: bool,
    /// `--enable_small_channel=1`.
    pub small_channel: bool,
}

/// What one timing-only execution of a workload took.
#[derive(Debug, Clone)]
pub struct WorkloadRun {
    /// The model's execution on the device, in microseconds.
    pub execute_us: f64,
    /// The `aclmdlExecute` call as a host timer sees it, in microseconds.
    pub execute_call_us: f64,
    /// Its kernels in launch order.
    pub kernels: Vec<KernelProfile>,
    /// What the reproduction assumes.
    pub notes: Vec<String>,
}

/// Builds `w`'s network (fp32, as exported, seeded weights), compiles it for `cfg` and runs it
/// twice timing-only on zero inputs; the second execution is reported (the first warms the
/// L2, as a benchmark's warm-up does).
pub fn run_workload(
    w: &Workload,
    cfg: &ChipConfig,
    buffer_optimize: BufferOptimize,
) -> Result<WorkloadRun, String> {
    let mut notes = Vec::new();
    let gear = if w.aipp {
        notes.push(
            "AIPP: a 256x256 RGB888 image cropped to 224x224 and normalised (the configuration \
             is assumed)"
                .to_string(),
        );
        GearOptions {
            insert_op_conf: Some("aipp_imagenet.cfg (built in)".into()),
            insert_op_conf_text: Some(AIPP_IMAGENET.into()),
            ..GearOptions::default()
        }
    } else {
        GearOptions::default()
    };
    let gear = GearOptions {
        enable_small_channel: w.small_channel,
        ..gear
    };
    let onnx = w.net.onnx(w.batch, DType::F32, 1);
    let opts = CompileOptions {
        gear,
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: w.precision,
        target: gearsim_compiler::Target {
            buffer_optimize,
            ..crate::target::for_chip(cfg)
        },
    };
    let name = format!("{}_b{}.onnx", w.net.name(), w.batch);
    let om = compile(&onnx, &name, &opts)
        .map_err(|e| e.to_string())?
        .om_bytes()
        .map_err(|e| format!("{name}: {e}"))?;
    drop(onnx);
    let mut rt = Runtime::new(
        cfg.clone(),
        gearsim_traces::NullSink,
        RuntimeOptions {
            exec_mode: ExecMode::TimingOnly,
            profile: true,
            ..RuntimeOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let m = rt.load(&om).map_err(|e| format!("{name}: {e}"))?;
    // What the model takes: the image AIPP reads, the fp32 NCHW tensor, or a GEMM's operands.
    let inputs = rt
        .desc(m)
        .map_err(|e| e.to_string())?
        .inputs
        .iter()
        .map(|desc| {
            let dtype = crate::runtime::session::io_type(desc).map_err(|e| e.to_string())?;
            let n: i64 = desc.dims.iter().product();
            Tensor::new(
                dtype,
                desc.dims.clone(),
                vec![0u8; n as usize * dtype.size()],
            )
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    rt.run(m, &inputs).map_err(|e| format!("{name}: {e}"))?;
    let report = rt.run(m, &inputs).map_err(|e| format!("{name}: {e}"))?;
    Ok(WorkloadRun {
        execute_us: report.execute_ps as f64 / 1e6,
        execute_call_us: report.execute_call_ps as f64 / 1e6,
        kernels: report.kernels,
        notes,
    })
}

/// How much longer a MIX kernel takes from its task's start to its first block than a
/// single-kind kernel does, in microseconds.
fn mix_extra_startup_us(kernels: &[KernelProfile]) -> Result<f64, String> {
    let startup = |mix: bool| {
        kernels
            .iter()
            .find(|k| (k.kind == KernelKind::Mix) == mix)
            .map(|k| k.first_start.0.saturating_sub(k.launched.0) as f64 / 1e6)
            .ok_or_else(|| {
                format!(
                    "expected a {} kernel, got {:?}",
                    if mix { "MIX" } else { "single-kind" },
                    kernels.iter().map(|k| k.kind).collect::<Vec<_>>()
                )
            })
    };
    Ok(startup(true)? - startup(false)?)
}

/// The measured convolution's kernel time (the kernel with the most cube products, from its
/// task's start to its last block's end) and the other kernels', in microseconds.
fn conv_kernel_us(kernels: &[KernelProfile]) -> Result<(f64, f64), String> {
    let us = |k: &KernelProfile| k.end.0.saturating_sub(k.launched.0) as f64 / 1e6;
    let main = kernels
        .iter()
        .enumerate()
        .filter(|(_, k)| k.work.cube_macs > 0)
        .max_by_key(|(_, k)| k.work.cube_macs)
        .map(|(i, _)| i)
        .ok_or_else(|| {
            let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
            format!("expected a convolution kernel, got {names:?}")
        })?;
    let rest = kernels.iter().enumerate().filter(|(i, _)| *i != main);
    Ok((us(&kernels[main]), rest.map(|(_, k)| us(k)).sum()))
}

/// Device time of one copy of `bytes` (host to device from pinned memory, or device to device):
/// the memcpy task from its submission to its end (what a bandwidth test times), in
/// microseconds.
fn copy_us(cfg: &ChipConfig, direction: CopyDirection, bytes: u64) -> Result<f64, String> {
    use gearsim_isa::task::{Memcpy, MemcpyKind, Task};
    let mut dev = gearsim_firmware::Device::new(cfg.clone(), gearsim_traces::NullSink);
    let e = |e: gearsim_firmware::DeviceError| e.to_string();
    let (kind, src) = match direction {
        CopyDirection::HostToDevice => (
            MemcpyKind::HostToDevice,
            dev.host_alloc(bytes).map_err(e)?.0,
        ),
        CopyDirection::DeviceToDevice => {
            (MemcpyKind::DeviceToDevice, dev.alloc(bytes).map_err(e)?.0)
        }
    };
    let dst = dev.alloc(bytes).map_err(e)?;
    let stream = dev.create_stream().map_err(e)?;
    let start = dev.now();
    let copy = Task::Memcpy(Memcpy {
        kind,
        dst: dst.0,
        src,
        size: bytes,
    });
    dev.submit(stream, copy, Some(direction.prefix()))
        .map_err(e)?;
    dev.synchronize(stream).map_err(e)?;
    Ok((dev.now().0 - start.0) as f64 / 1e6)
}

/// Geometric mean of simulated / measured, and the geometric-mean error (the factor
/// `exp(mean |ln ratio|) - 1`), over the rows that ran.
pub fn summary(outcomes: &[Outcome]) -> (f64, f64) {
    let ran: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
    if ran.is_empty() {
        return (1.0, 0.0);
    }
    let n = ran.len() as f64;
    let logs: Vec<f64> = ran.iter().map(|o| o.ratio().ln()).collect();
    let mean = logs.iter().sum::<f64>() / n;
    let abs = logs.iter().map(|l| l.abs()).sum::<f64>() / n;
    (mean.exp(), abs.exp() - 1.0)
}

/// The table of every row, then the summary line.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<4} {:<9} {:<11} {:>5} {:>12} {:>12} {:>10} {:>7} {:>9} {:>9}  notes",
        "id",
        "net",
        "chip",
        "batch",
        "measured_us",
        "simulated_us",
        "device_us",
        "ratio",
        "meas_fps",
        "sim_fps"
    );
    for x in outcomes {
        let r = &x.row;
        // A failed row has no simulated figures; its notes are the failure.
        let (simulated, device, ratio, sim_fps, notes) = match &x.error {
            Some(e) => (
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("FAILED: {e}"),
            ),
            None => (
                format!("{:.1}", x.simulated_us),
                format!("{:.1}", x.execute_us),
                format!("{:.3}", x.ratio()),
                format!("{:.0}", 1e6 * r.batch as f64 / x.simulated_us),
                format!(
                    "{}{}",
                    if x.in_band() { "" } else { "OUT OF BAND; " },
                    x.notes.join("; ")
                ),
            ),
        };
        let _ = writeln!(
            o,
            "{:<4} {:<9} {:<11} {:>5} {:>12.1} {simulated:>12} {device:>10} {ratio:>7} {:>9.0} {sim_fps:>9}  {notes}",
            r.id,
            r.net.name(),
            r.chip,
            r.batch,
            r.measured_us(),
            r.fps,
        );
    }
    let (gm, err) = summary(outcomes);
    let failed = outcomes.iter().filter(|x| x.error.is_some()).count();
    if let Some(worst) = outcomes
        .iter()
        .filter(|x| x.error.is_none())
        .max_by(|a, b| a.ratio().ln().abs().total_cmp(&b.ratio().ln().abs()))
    {
        let inside = outcomes.iter().filter(|x| x.in_band()).count();
        let _ = writeln!(
            o,
            "summary: {} rows, {inside} within ±{:.0}%, {failed} failed; geometric mean of simulated/measured {gm:.3}, geometric-mean error {:.1}%; worst {} {} batch {} (ratio {:.3})",
            outcomes.len(),
            BAND * 100.0,
            err * 100.0,
            worst.row.id,
            worst.row.net.name(),
            worst.row.batch,
            worst.ratio()
        );
    }
    // The same rows compared on device time alone, as if the measurement had no host part.
    let timed: Vec<&Outcome> = outcomes
        .iter()
        .filter(|x| x.error.is_none() && x.row.timer == Timer::AisBench)
        .collect();
    if !timed.is_empty() {
        let inside = timed
            .iter()
            .filter(|x| (x.execute_us / x.row.measured_us() - 1.0).abs() <= BAND)
            .count();
        let _ = writeln!(
            o,
            "device time alone: {inside} of the {} ais_bench rows within ±{:.0}% without the aclmdlExecute call's host part",
            timed.len(),
            BAND * 100.0
        );
    }
    for (id, net, measured, simulated) in saturation(outcomes) {
        let _ = writeln!(
            o,
            "saturation: {id} {} reaches 95% of its best throughput at batch {measured} measured, {simulated} simulated",
            net.name()
        );
    }
    o
}

/// Where a batch sweep saturates: the first batch whose throughput reaches 95% of the sweep's
/// best, measured and simulated, per target id and network with at least three batches.
pub fn saturation(outcomes: &[Outcome]) -> Vec<(String, Net, i64, i64)> {
    let mut keys: Vec<(String, Net)> = outcomes
        .iter()
        .map(|x| (x.row.id.clone(), x.row.net))
        .collect();
    keys.dedup();
    let first_at = |points: &[(i64, f64)]| {
        let best = points.iter().fold(0f64, |m, p| m.max(p.1));
        points
            .iter()
            .find(|p| p.1 >= 0.95 * best)
            .map_or(0, |p| p.0)
    };
    let mut out = Vec::new();
    for (id, net) in keys {
        let mut sweep: Vec<&Outcome> = outcomes
            .iter()
            .filter(|x| x.row.id == id && x.row.net == net && x.error.is_none())
            .collect();
        if sweep.len() < 3 {
            continue;
        }
        sweep.sort_by_key(|x| x.row.batch);
        let measured: Vec<(i64, f64)> = sweep.iter().map(|x| (x.row.batch, x.row.fps)).collect();
        let simulated: Vec<(i64, f64)> = sweep
            .iter()
            .map(|x| (x.row.batch, 1e6 * x.row.batch as f64 / x.simulated_us))
            .collect();
        out.push((id, net, first_at(&measured), first_at(&simulated)));
    }
    out
}

/// The per-kernel table of one outcome: kernels grouped by name in launch order, with their
/// count, time, share of the execution and utilisation.
pub fn kernel_table(x: &Outcome) -> String {
    let mut o = String::new();
    // What crossed HBM, and how long that alone takes at the chip's bandwidth: how close the
    // row is to being memory-bound.
    let hbm: u64 = x.kernels.iter().map(|k| k.traffic.hbm_bytes()).sum();
    let at_peak_us = hbm as f64 / x.hbm_bytes_per_second.max(1) as f64 * 1e6;
    let _ = writeln!(
        o,
        "{} {} batch {}: {:.1} us simulated, {} kernels; {:.1} MB through HBM, {:.1} us of it at \
         {:.1} GB/s",
        x.row.id,
        x.row.net.name(),
        x.row.batch,
        x.simulated_us,
        x.kernels.len(),
        hbm as f64 / 1e6,
        at_peak_us,
        x.hbm_bytes_per_second as f64 / 1e9
    );
    let _ = writeln!(
        o,
        "  {:<48} {:>9} {:>6} {:>6} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7} {:>8}",
        "kernel",
        "us",
        "share",
        "blocks",
        "cube%",
        "mte1%",
        "vec%",
        "mte2%",
        "read_MB",
        "write_MB",
        "l2_hit%",
        "hbm_GB/s"
    );
    for k in &x.kernels {
        let _ = writeln!(
            o,
            "  {:<48} {:>9.1} {:>5.1}% {:>6} {:>6.1}% {:>6.1}% {:>6.1}% {:>6.1}% {:>8.2} {:>8.2} {:>6.1}% {:>8.1}",
            k.name,
            k.us,
            100.0 * k.us / x.execute_us,
            k.block_dim,
            100.0 * k.cube,
            100.0 * k.mte1,
            100.0 * k.vector,
            100.0 * k.mte2,
            k.traffic.read as f64 / 1e6,
            k.traffic.written as f64 / 1e6,
            100.0 * k.traffic.read_l2_hits as f64 / k.traffic.read.max(1) as f64,
            k.traffic.hbm_bytes() as f64 / (k.us * 1e3),
        );
    }
    o
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The rows as CSV (one line per row, header first), each with its `row` (`places`, in the
/// same order): its place among the selected targets, so that the CSVs of the shards of a
/// sharded run concatenate, sorted by it, into the whole run's.
pub fn csv(places: &[usize], outcomes: &[Outcome]) -> String {
    let mut o = String::from(
        "row,id,net,chip,batch,precision,aipp,small_channel,timer,measured_us,simulated_us,device_us,ratio,in_band,kernels,notes,source\n",
    );
    for (row, x) in places.iter().zip(outcomes) {
        let r = &x.row;
        let _ = writeln!(
            o,
            "{row},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.4},{},{},{},{}",
            r.id,
            r.net.name(),
            r.chip,
            r.batch,
            r.precision.name(),
            if r.aipp { "on" } else { "off" },
            if r.small_channel { "on" } else { "off" },
            r.timer.name(),
            r.measured_us(),
            x.simulated_us,
            x.execute_us,
            if x.error.is_some() { 0.0 } else { x.ratio() },
            x.in_band(),
            x.kernels.len(),
            csv_field(&match &x.error {
                Some(e) => format!("failed: {e}"),
                None => x.notes.join("; "),
            }),
            csv_field(&r.source)
        );
    }
    o
}

/// Simulated against measured time, log-log, with the ±20% band: one line per target id and
/// network through its batch sweep.
pub fn svg(outcomes: &[Outcome]) -> String {
    let (lo, hi) = outcomes
        .iter()
        .flat_map(|x| [x.simulated_us, x.row.measured_us()])
        .fold((f64::INFINITY, 0f64), |(l, h), v| (l.min(v), h.max(v)));
    let (lo, hi) = if lo.is_finite() {
        (lo / 1.5, hi * 1.5)
    } else {
        (1.0, 10.0)
    };
    let line = |label: &str, f: f64, dashed: bool| Series {
        label: label.into(),
        color: "#888888".into(),
        dashed,
        points: vec![(lo, lo * f), (hi, hi * f)],
    };
    let mut series = vec![
        line("simulated = measured", 1.0, false),
        line("±20%", 1.0 + BAND, true),
        line("±20%", 1.0 - BAND, true),
    ];
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
    let mut keys: Vec<(String, Net)> = outcomes
        .iter()
        .map(|x| (x.row.id.clone(), x.row.net))
        .collect();
    keys.dedup();
    for (i, (id, net)) in keys.iter().enumerate() {
        let mut points: Vec<(f64, f64)> = outcomes
            .iter()
            .filter(|x| &x.row.id == id && x.row.net == *net && x.error.is_none())
            .map(|x| (x.row.measured_us(), x.simulated_us))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push(Series {
            label: format!("{id} {} (batch sweep)", net.name()),
            color: colors[i % colors.len()].into(),
            dashed: false,
            points,
        });
    }
    render(&Figure {
        title: "gearsim calibrate: simulated vs measured execution time".into(),
        subtitle:
            "one point per batch; dashed: ±20% band; timing-only; what each measurement timed"
                .into(),
        x_label: "measured (µs)".into(),
        y_label: "simulated (µs)".into(),
        columns: 1,
        panels: vec![Panel {
            title: "one point per batch".into(),
            y_label: None,
            series,
        }],
        shared_y: false,
        x_log_ticks: true,
        mark: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_targets_parse() {
        let rows = parse_targets(TARGETS, "targets.csv").unwrap();
        assert_eq!(rows.len(), 38);
        let x2: Vec<&Row> = rows.iter().filter(|r| r.id == "X2").collect();
        assert_eq!(x2.len(), 6);
        assert_eq!(
            x2[3].net,
            Net::Conv {
                n: 4,
                c: 512,
                h: 16,
                w: 96,
                o: 6144
            }
        );
        assert!((x2[3].measured_us() - 1097.9).abs() < 0.01);
        // K11 is FlagPerf's 4096^3 product; K13 a device copy whose rate counts both
        // directions; K20 a start-up difference.
        let k = |id: &str| rows.iter().find(|r| r.id == id).unwrap();
        assert!((k("K11").measured_us() - 438.85).abs() < 0.01);
        assert!((2.0 * 67108864.0 / k("K13").measured_us() / 1e3 - 1538.0).abs() < 0.1);
        assert_eq!(k("K20").net, Net::MixStartup);
        assert!((k("K20").measured_us() - 3.0).abs() < 1e-3);
        // K9 and K10: int8 products on 910B1 / 910B3.
        assert_eq!(
            k("K9").net,
            Net::QuantGemm {
                m: 1024,
                n: 4096,
                k: 1024
            }
        );
        assert_eq!(k("K9").chip, "ascend910b1");
        assert!((k("K9").measured_us() - 41.96).abs() < 0.01);
        assert_eq!(rows.iter().filter(|r| r.id == "K10").count(), 5);
        // The A2 kernel rows: one GEMM each, measured in us.
        let k1 = rows.iter().find(|r| r.id == "K1").unwrap();
        assert_eq!(
            k1.net,
            Net::Gemm {
                m: 2048,
                n: 4096,
                k: 4000
            }
        );
        assert_eq!(k1.chip, "ascend910b2");
        assert!((k1.measured_us() - 261.0).abs() < 0.01);
        assert!(rows.iter().any(|r| r.id == "M4" && r.batch == 64));
        // The sources' atc commands: AIPP with --enable_small_channel=1, or neither.
        assert!(rows.iter().all(|r| r.aipp == r.small_channel));
        // The whole-model rows are ais_bench's NPU compute time; the kernel rows device time.
        assert!(
            rows.iter()
                .all(|r| (r.timer == Timer::AisBench) == r.id.starts_with('M'))
        );
        let m1 = &rows[0];
        assert!(
            (m1.measured_us() - 349.0).abs() < 1.0,
            "{}",
            m1.measured_us()
        );
    }

    #[test]
    fn bad_rows_name_line_and_field() {
        let e = parse_targets(
            "M1,resnet18,ascend310p,0,force_fp16,on,on,ais_bench,1,x",
            "t.csv",
        )
        .unwrap_err();
        assert!(e.contains("t.csv:1") && e.contains("batch"), "{e}");
        let e = parse_targets(
            "\nM1,vgg,ascend310p,1,force_fp16,on,on,ais_bench,1,x",
            "t.csv",
        )
        .unwrap_err();
        assert!(e.contains("t.csv:2") && e.contains("net"), "{e}");
        let e = parse_targets(
            "M1,resnet18,nochip,1,force_fp16,on,on,ais_bench,1,x",
            "t.csv",
        )
        .unwrap_err();
        assert!(e.contains("chip"), "{e}");
        let e = parse_targets(
            "M1,resnet18,ascend310p,1,force_fp16,on,yes,ais_bench,1,x",
            "t.csv",
        )
        .unwrap_err();
        assert!(e.contains("small_channel"), "{e}");
        let e = parse_targets("M1,resnet18", "t.csv").unwrap_err();
        assert!(e.contains("expected 10"), "{e}");
        let e = parse_targets(
            "M1,resnet18,ascend310p,1,force_fp16,on,on,msprof,1,x",
            "t.csv",
        )
        .unwrap_err();
        assert!(e.contains("timer") && e.contains("msprof"), "{e}");
    }
}
