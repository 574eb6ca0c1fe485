//! `gearsim bench kernels`: how close the lowered kernels come to the simulated chip's limits on
//! the reference workloads (a large fp16 MatMul and a ResNet 3×3 convolution against the cube
//! peak, a large element-wise Add against the HBM bandwidth). Each runs in timing-only mode on
//! a fresh device; the time is from the first block's start to the last block's end over all
//! of the op's kernels.
//!
//! `gearsim bench runtime`: the CNN's runtime figures per gear ([`runtime_figures`]).
//!
//! `gearsim bench speed`: how fast the simulator itself runs ([`speed`]): simulated chip cycles
//! and instructions per host second, full and timing-only, on the CNN and the transformer.

use gearsim_sim::{ChipConfig, ExecMode};

use crate::oprun::{In, run_op_formats};
use gearsim_compiler::ir::{Attr, DataType, Format, Tensor};

/// One figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Workload.
    pub name: String,
    /// Kernels launched.
    pub kernels: usize,
    /// Core cycles from the first block's start to the last block's end.
    pub cycles: f64,
    /// What was achieved, in `unit`.
    pub achieved: f64,
    /// The chip's limit, in `unit`.
    pub peak: f64,
    /// The unit (`MAC/cycle`, `B/cycle`).
    pub unit: &'static str,
    /// The target the issue sets, as a fraction of the peak.
    pub target: f64,
}

impl Figure {
    /// Achieved over peak.
    pub fn efficiency(&self) -> f64 {
        self.achieved / self.peak
    }
}

fn zeros(dtype: DataType, dims: &[i64]) -> Tensor {
    let n: i64 = dims.iter().product();
    Tensor {
        dtype,
        dims: dims.to_vec(),
        data: std::sync::Arc::new(vec![0u8; n as usize * dtype.size()]),
    }
}

/// Runs one op in timing-only mode: its kernels and cycles.
fn time_op(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: Vec<In>,
) -> Result<(usize, f64), String> {
    time_op_formats(cfg, op, attrs, inputs, &[])
}

/// [`time_op`] with the inputs and the output stored in the layout pass's `formats`.
fn time_op_formats(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: Vec<In>,
    formats: &[Format],
) -> Result<(usize, f64), String> {
    let inputs = inputs.into_iter().map(Some).collect();
    let r = run_op_formats(cfg, op, attrs, inputs, formats, 1, ExecMode::TimingOnly)?;
    let first = r
        .launches
        .iter()
        .map(|l| l.first_start.0)
        .min()
        .unwrap_or(0);
    let last = r.launches.iter().map(|l| l.end.0).max().unwrap_or(0);
    let ps_per_cycle = 1e6 / cfg.core.clock_mhz as f64;
    Ok((r.launches.len(), (last - first) as f64 / ps_per_cycle))
}

/// A reference workload.
pub struct Workload {
    /// Its name.
    pub name: &'static str,
    /// Runs it.
    pub run: fn(&ChipConfig) -> Result<Figure, String>,
}

/// The reference workloads.
pub const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "matmul",
        run: matmul,
    },
    Workload {
        name: "conv",
        run: conv,
    },
    Workload {
        name: "conv-nchw",
        run: conv_nchw,
    },
    Workload {
        name: "add",
        run: add,
    },
];

/// Multiply-accumulates per cycle of the whole chip's cubes: one 16x16x16 fractal per
/// `cycles_per_fractal` cycles per core.
fn cube_peak(cfg: &ChipConfig) -> f64 {
    f64::from(cfg.core.count) * 4096.0 / cfg.cube.cycles_per_fractal as f64
}

/// A 2048x2048x2048 f16 MatMul against the cube peak.
pub fn matmul(cfg: &ChipConfig) -> Result<Figure, String> {
    let n = 2048i64;
    let (k, cycles) = time_op(
        cfg,
        "MatMul",
        &[],
        vec![
            crate::oprun::data(zeros(DataType::F16, &[n, n])),
            crate::oprun::data(zeros(DataType::F16, &[n, n])),
        ],
    )?;
    Ok(Figure {
        name: format!("MatMul f16 {n}x{n}x{n}"),
        kernels: k,
        cycles,
        achieved: (n * n * n) as f64 / cycles,
        peak: cube_peak(cfg),
        unit: "MAC/cycle",
        target: 0.85,
    })
}

/// A ResNet 3x3 convolution (8x64x56x56 -> 64, pad 1) against the cube peak, as it runs
/// inside a network: input and output in the fractal format NC1HWC0 that the layout pass
/// keeps between convolutions.
pub fn conv(cfg: &ChipConfig) -> Result<Figure, String> {
    resnet_conv(cfg, Format::Nc1hwc0)
}

/// The same convolution alone in a graph: NCHW in and out (its kernel converts the input
/// itself, so this is the figure of a network's first or only convolution). No target.
pub fn conv_nchw(cfg: &ChipConfig) -> Result<Figure, String> {
    resnet_conv(cfg, Format::Nd)
}

fn resnet_conv(cfg: &ChipConfig, format: Format) -> Result<Figure, String> {
    let (bn, c, hw) = (8i64, 64i64, 56i64);
    let (k, cycles) = time_op_formats(
        cfg,
        "Conv",
        &[
            ("kernel_shape", Attr::Ints(vec![3, 3])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ],
        vec![
            crate::oprun::data(zeros(DataType::F16, &[bn, c, hw, hw])),
            crate::oprun::constant(zeros(DataType::F16, &[c, c, 3, 3])),
        ],
        &[format, Format::Nd, format],
    )?;
    let macs = (bn * c * hw * hw * c * 9) as f64;
    let (layout, target) = if format == Format::Nc1hwc0 {
        ("NC1HWC0", 0.60)
    } else {
        ("NCHW", 0.0)
    };
    Ok(Figure {
        name: format!("Conv f16 3x3 {bn}x{c}x{hw}x{hw} -> {c}, {layout}"),
        kernels: k,
        cycles,
        achieved: macs / cycles,
        peak: cube_peak(cfg),
        unit: "MAC/cycle",
        target,
    })
}

/// An element-wise f32 Add over 64 MiB operands against the HBM bandwidth. Its writes go
/// through to HBM: a write-back L2 would keep the last of them (up to its size) and the
/// bytes moved per cycle would exceed what HBM served, which is what the figure measures.
pub fn add(cfg: &ChipConfig) -> Result<Figure, String> {
    let mut cfg = cfg.clone();
    cfg.memory.l2_write_back = false;
    let cfg = &cfg;
    let hbm = cfg.memory.hbm_bytes_per_second as f64 / (cfg.core.clock_mhz as f64 * 1e6);
    let elems = 16 * 1024 * 1024i64;
    let (k, cycles) = time_op(
        cfg,
        "Add",
        &[],
        vec![
            crate::oprun::data(zeros(DataType::F32, &[elems])),
            crate::oprun::data(zeros(DataType::F32, &[elems])),
        ],
    )?;
    Ok(Figure {
        name: "Add f32 64 MiB + 64 MiB, writes through".into(),
        kernels: k,
        cycles,
        achieved: (3 * elems * 4) as f64 / cycles,
        peak: hbm,
        unit: "B/cycle",
        target: 0.90,
    })
}

/// One CNN gear's runtime figures.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeFigure {
    /// The batch.
    pub batch: i64,
    /// Path and mode (`non-sink`, `non-sink, no merge`, `sink`, `dynamic (first)`, ...).
    pub what: String,
    /// Device time: the runtime stream's busy time, in microseconds.
    pub device_us: f64,
    /// The host thread's own work, in microseconds.
    pub host_us: f64,
    /// From the call to its return, in microseconds.
    pub end_to_end_us: f64,
    /// The model's execution alone (ais_bench's NPU compute time; the whole run on the
    /// dynamic path), in microseconds.
    pub execute_us: f64,
    /// Host-to-device transfers and bytes.
    pub h2d: (u64, u64),
    /// Device-to-host transfers and bytes.
    pub d2h: (u64, u64),
}

/// The built-in CNN (dynamic batch 1, 4, 8) at every gear: non-sink with and without the
/// merged H2D copy, sink, and the hybrid dynamic path (first run and cached) against the gear
/// path; plus batch 3, which is no gear, on the dynamic path.
pub fn runtime_figures(cfg: &ChipConfig) -> Result<Vec<RuntimeFigure>, String> {
    use crate::runtime::{RunReport, Runtime, RuntimeOptions};
    use gearsim_compiler::options::GearOptions;
    use gearsim_compiler::pipeline::{CompileOptions, compile};
    let compile_for = |sink: bool| -> Result<Vec<u8>, String> {
        let opts = CompileOptions {
            gear: GearOptions {
                input_shape: Some("input:-1,3,32,32".into()),
                dynamic_batch_size: Some("1,4,8".into()),
                ..GearOptions::default()
            },
            getnext_sink: sink,
            table_layout: Default::default(),
            mapindex_engine: Default::default(),
            fusion: Default::default(),
            precision: Default::default(),
            target: crate::target::for_chip(cfg),
        };
        let c = compile(crate::demo::CNN, "cnn.onnx", &opts).map_err(|e| e.to_string())?;
        if sink {
            c.om_bytes()
        } else {
            c.hybrid_om_bytes()
        }
    };
    let (plain, sink) = (compile_for(false)?, compile_for(true)?);
    let runtime = |fusion: i64| {
        Runtime::new(
            cfg.clone(),
            gearsim_traces::NullSink,
            RuntimeOptions {
                input_fusion_size: fusion,
                ..RuntimeOptions::default()
            },
        )
        .map_err(|e| e.to_string())
    };
    let mut merged = runtime(crate::runtime::session::DEFAULT_INPUT_FUSION_SIZE)?;
    let mut unmerged = runtime(0)?;
    let err = |e: crate::runtime::RuntimeError| e.to_string();
    let m_plain = merged.load(&plain).map_err(err)?;
    let m_sink = merged.load(&sink).map_err(err)?;
    let u_plain = unmerged.load(&plain).map_err(err)?;
    let fig = |batch: i64, what: &str, r: &RunReport| RuntimeFigure {
        batch,
        what: what.into(),
        device_us: r.device_time_ps as f64 / 1e6,
        host_us: r.host_ps as f64 / 1e6,
        end_to_end_us: r.end_to_end_ps as f64 / 1e6,
        execute_us: r.execute_ps as f64 / 1e6,
        h2d: (r.h2d_transfers, r.h2d_bytes),
        d2h: (r.d2h_transfers, r.d2h_bytes),
    };
    let mut out = Vec::new();
    for batch in [1i64, 4, 8, 3] {
        let x = vec![zeros(DataType::F32, &[batch, 3, 32, 32])];
        if batch != 3 {
            out.push(fig(
                batch,
                "non-sink (gear)",
                &merged.run(m_plain, &x).map_err(err)?,
            ));
            out.push(fig(
                batch,
                "non-sink, merge off",
                &unmerged.run(u_plain, &x).map_err(err)?,
            ));
            out.push(fig(
                batch,
                "sink (gear)",
                &merged.run_sink(m_sink, &x).map_err(err)?,
            ));
        }
        out.push(fig(
            batch,
            "dynamic path",
            &merged.run_dynamic_path(m_plain, &x).map_err(err)?,
        ));
        out.push(fig(
            batch,
            "dynamic path, cached",
            &merged.run_dynamic_path(m_plain, &x).map_err(err)?,
        ));
    }
    Ok(out)
}

/// calibration.md §3's G1 and G4 as gearsim reproduces them from runtime figures.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRatios {
    /// G1: end to end on the dynamic-shape path (kernels cached) over the gear path, batch 1
    /// (the static model's throughput over the dynamic one's).
    pub dynamic_over_static: f64,
    /// G4, host side: what the non-sink run's host-side gear selection (dims derived on the
    /// host and uploaded with a synchronous copy, inputs copied before the run) costs end to
    /// end over the sink run's device-side one, batch 1, in microseconds.
    pub host_selection_adds_us: f64,
    /// G4, device side: how much the sink run's device-side selection (GetNext +
    /// GetDynamicDims) changes the model's execution time, batch 1, in microseconds.
    pub device_selection_adds_us: f64,
}

/// G1 and G4 from [`runtime_figures`]' batch-1 rows.
pub fn host_ratios(figures: &[RuntimeFigure]) -> Result<HostRatios, String> {
    let row = |what: &str| {
        figures
            .iter()
            .find(|f| f.batch == 1 && f.what == what)
            .ok_or_else(|| format!("no batch-1 `{what}` figure"))
    };
    let (gear, sink, dynamic) = (
        row("non-sink (gear)")?,
        row("sink (gear)")?,
        row("dynamic path, cached")?,
    );
    Ok(HostRatios {
        dynamic_over_static: dynamic.end_to_end_us / gear.end_to_end_us,
        host_selection_adds_us: gear.end_to_end_us - sink.end_to_end_us,
        device_selection_adds_us: sink.execute_us - gear.execute_us,
    })
}

pub mod speed {
    //! Simulator speed on whole models: each figure loads a compiled model on a fresh device,
    //! writes its input and gear vector through the zero-time path, runs it once untimed (the
    //! scheduler decodes kernel images on first use), then times `ModelExecute` runs on one
    //! host thread until at least `min_seconds` of host time have passed. Every timed run must
    //! simulate exactly the cycles and instructions of the first, or the figure is an error.
    //!
    //! Host time is the CPU time of the measuring thread (`/proc/thread-self/schedstat`, in
    //! nanoseconds) where the host has it, so that other processes sharing the cores do not
    //! slow the figures down; elsewhere it is wall-clock time.

    use std::time::{Duration, Instant};

    use gearsim_firmware::{Device, StreamId};
    use gearsim_isa::om::OmFile;
    use gearsim_sim::{ChipConfig, ExecMode};
    use gearsim_traces::NullSink;

    use crate::calibrate::nets::{DType, Net};
    use crate::runtime::LoadedModel;
    use crate::stats;
    use gearsim_compiler::options::GearOptions;
    use gearsim_compiler::pipeline::{CompileOptions, compile};

    /// The transformer encoder of the test models (dynamic sequence length).
    pub const TRANSFORMER: &[u8] = include_bytes!("../../tests/models/transformer.onnx");

    /// A model the speed bench runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Model {
        /// The demo's CNN, compiled for dynamic batch 1, 4, 8.
        Cnn,
        /// The transformer encoder, compiled for sequence lengths 16, 32, 64, 128.
        Transformer,
    }

    impl Model {
        /// Both, in report order.
        pub const ALL: [Model; 2] = [Model::Cnn, Model::Transformer];

        /// `cnn` / `transformer`.
        pub fn name(self) -> &'static str {
            match self {
                Model::Cnn => "cnn",
                Model::Transformer => "transformer",
            }
        }

        /// Parses a name.
        pub fn parse(s: &str) -> Option<Model> {
            Model::ALL.into_iter().find(|m| m.name() == s)
        }

        fn onnx(self) -> &'static [u8] {
            match self {
                Model::Cnn => crate::demo::CNN,
                Model::Transformer => TRANSFORMER,
            }
        }

        fn gear_options(self) -> GearOptions {
            match self {
                Model::Cnn => GearOptions {
                    input_shape: Some("input:-1,3,32,32".into()),
                    dynamic_batch_size: Some("1,4,8".into()),
                    ..GearOptions::default()
                },
                Model::Transformer => GearOptions {
                    input_shape: Some("x:1,-1,64".into()),
                    dynamic_dims: Some("16;32;64;128".into()),
                    ..GearOptions::default()
                },
            }
        }

        /// The gears the bench reports (the gear axis' value).
        pub fn gears(self) -> &'static [i64] {
            match self {
                Model::Cnn => &[1, 4, 8],
                Model::Transformer => &[16, 64, 128],
            }
        }

        /// `b4` for a batch, `s64` for a sequence length.
        pub fn gear_label(self, gear: i64) -> String {
            match self {
                Model::Cnn => format!("b{gear}"),
                Model::Transformer => format!("s{gear}"),
            }
        }

        /// The data input's name and dims at a gear.
        fn input(self, gear: i64) -> (&'static str, Vec<i64>) {
            match self {
                Model::Cnn => ("input", vec![gear, 3, 32, 32]),
                Model::Transformer => ("x", vec![1, gear, 64]),
            }
        }

        /// Compiles the model for non-sink mode on chip `cfg`: the `.om` bytes.
        pub fn compile(self, cfg: &ChipConfig) -> Result<Vec<u8>, String> {
            compile_default(
                cfg,
                self.onnx(),
                &format!("{}.onnx", self.name()),
                self.gear_options(),
            )
        }
    }

    /// `full` / `timing-only`.
    pub fn mode_name(mode: ExecMode) -> &'static str {
        match mode {
            ExecMode::Full => "full",
            ExecMode::TimingOnly => "timing-only",
        }
    }

    /// What one run simulated.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Count {
        /// Chip clock cycles from the submission of `ModelExecute` to the end of the stream.
        pub cycles: u64,
        /// AI core instructions executed, summed over pipes and cores.
        pub instructions: u64,
    }

    /// A loaded model ready to run at one gear in one mode.
    pub struct Prepared {
        dev: Device<NullSink>,
        model: LoadedModel,
        stream: StreamId,
    }

    impl Prepared {
        /// Loads `om` (compiled by [`Model::compile`]) on a fresh device of chip `cfg` in
        /// `mode`, writes an input of gear `gear` and the gear vector, and runs once untimed.
        pub fn new(
            cfg: &ChipConfig,
            model: Model,
            om: &[u8],
            gear: i64,
            mode: ExecMode,
        ) -> Result<Prepared, String> {
            let file = OmFile::parse(om).map_err(|e| e.to_string())?;
            let mut dev = Device::new(cfg.clone(), NullSink);
            dev.set_exec_mode(mode);
            let loaded = LoadedModel::load(&mut dev, &file).map_err(|e| e.to_string())?;
            let stream = dev.create_stream().map_err(|e| e.to_string())?;
            let (name, dims) = model.input(gear);
            let inputs = &loaded.desc.inputs;
            let data = inputs
                .iter()
                .position(|i| i.name == name)
                .ok_or_else(|| format!("{}: no input `{name}`", model.name()))?;
            let elems: i64 = dims.iter().product();
            // A fixed pattern of f32 values in [-1, 1).
            let bytes: Vec<u8> = (0..elems)
                .flat_map(|i| (((i * 7919) % 2048) as f32 / 1024.0 - 1.0).to_le_bytes())
                .collect();
            let err = |e: gearsim_firmware::DeviceError| e.to_string();
            dev.write(loaded.inputs[data], &bytes).map_err(err)?;
            let shape = inputs.len() - 1;
            dev.write(loaded.inputs[shape], &(gear as i32).to_le_bytes())
                .map_err(err)?;
            let mut p = Prepared {
                dev,
                model: loaded,
                stream,
            };
            p.run()?;
            Ok(p)
        }

        /// Runs the model once: what it simulated.
        pub fn run(&mut self) -> Result<Count, String> {
            let chip = self.dev.chip();
            let cores = chip.core_count();
            let instructions = |chip: &gearsim_sim::Chip<NullSink>| -> u64 {
                (0..cores)
                    .filter_map(|c| chip.core_stats(c))
                    .flat_map(|s| s.pipes)
                    .map(|p| p.instructions)
                    .sum()
            };
            let (start, before) = (chip.now(), instructions(chip));
            self.model
                .execute(&mut self.dev, self.stream)
                .map_err(|e| e.to_string())?;
            let chip = self.dev.chip();
            let clock = chip.clock();
            Ok(Count {
                cycles: clock.cycle_at_or_after(chip.now()).0 - clock.cycle_at_or_after(start).0,
                instructions: instructions(chip) - before,
            })
        }
    }

    /// One figure of `gearsim bench speed`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Figure {
        /// The model.
        pub model: Model,
        /// The gear's value.
        pub gear: i64,
        /// Full or timing-only.
        pub mode: ExecMode,
        /// What each run simulated (the same for every run).
        pub count: Count,
        /// Timed runs.
        pub runs: u32,
        /// Host time of the timed runs.
        pub host: Duration,
        /// The clock that measured it.
        pub clock: HostClock,
    }

    impl Figure {
        /// Simulated chip cycles per host second.
        pub fn cycles_per_second(&self) -> f64 {
            self.count.cycles as f64 * f64::from(self.runs) / self.host.as_secs_f64()
        }

        /// Simulated instructions per host second.
        pub fn instructions_per_second(&self) -> f64 {
            self.count.instructions as f64 * f64::from(self.runs) / self.host.as_secs_f64()
        }

        /// `cnn b1 timing-only`.
        pub fn label(&self) -> String {
            format!(
                "{} {} {}",
                self.model.name(),
                self.model.gear_label(self.gear),
                mode_name(self.mode)
            )
        }

        /// `cnn b1 timing-only: 41.3 M cycles/s, 12.0 M instr/s`.
        pub fn line(&self) -> String {
            format!(
                "{}: {:.1} M cycles/s, {:.1} M instr/s",
                self.label(),
                self.cycles_per_second() / 1e6,
                self.instructions_per_second() / 1e6
            )
        }

        /// The figure as one JSON object.
        pub fn json(&self) -> serde_json::Value {
            serde_json::json!({
                "model": self.model.name(),
                "gear": self.model.gear_label(self.gear),
                "mode": mode_name(self.mode),
                "cycles_per_run": self.count.cycles,
                "instructions_per_run": self.count.instructions,
                "runs": self.runs,
                "host_seconds": self.host.as_secs_f64(),
                "host_clock": self.clock.name(),
                "cycles_per_second": self.cycles_per_second(),
                "instructions_per_second": self.instructions_per_second(),
            })
        }
    }

    /// Which clock measures host time.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum HostClock {
        /// The CPU time of the calling thread.
        ThreadCpu,
        /// Wall-clock time (where the thread's CPU time cannot be read).
        Wall,
    }

    impl HostClock {
        /// The thread's CPU clock where the host has one, else the wall clock.
        pub fn best() -> HostClock {
            if thread_cpu_time().is_some() {
                HostClock::ThreadCpu
            } else {
                HostClock::Wall
            }
        }

        /// `thread-cpu` / `wall`.
        pub fn name(self) -> &'static str {
            match self {
                HostClock::ThreadCpu => "thread-cpu",
                HostClock::Wall => "wall",
            }
        }

        /// A reading (only differences between readings of one thread mean anything).
        fn now(self, epoch: Instant) -> Duration {
            match self {
                HostClock::ThreadCpu => thread_cpu_time().unwrap_or_else(|| epoch.elapsed()),
                HostClock::Wall => epoch.elapsed(),
            }
        }
    }

    /// CPU time the calling thread has run, from the first field of Linux's
    /// `/proc/thread-self/schedstat` (nanoseconds on a CPU).
    fn thread_cpu_time() -> Option<Duration> {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_nanos(ns))
    }

    /// Measures one figure: runs until at least `min_seconds` of host time have passed.
    pub fn measure(
        cfg: &ChipConfig,
        model: Model,
        om: &[u8],
        gear: i64,
        mode: ExecMode,
        min_seconds: f64,
    ) -> Result<Figure, String> {
        let mut p = Prepared::new(cfg, model, om, gear, mode)?;
        let min = Duration::from_secs_f64(min_seconds.max(0.0));
        let clock = HostClock::best();
        let epoch = Instant::now();
        let mut host = Duration::ZERO;
        let mut runs = 0u32;
        let mut count = None;
        while runs == 0 || host < min {
            let t = clock.now(epoch);
            let c = p.run()?;
            host += clock.now(epoch).saturating_sub(t);
            runs += 1;
            match count {
                None => count = Some(c),
                Some(first) if first != c => {
                    return Err(format!(
                        "{} {} {}: run {runs} simulated {c:?}, the first {first:?}",
                        model.name(),
                        model.gear_label(gear),
                        mode_name(mode)
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(Figure {
            model,
            gear,
            mode,
            count: count.unwrap_or(Count {
                cycles: 0,
                instructions: 0,
            }),
            runs,
            host,
            clock,
        })
    }

    /// One figure of `gearsim bench speed --nets`: a whole network at one batch.
    #[derive(Debug, Clone, PartialEq)]
    pub struct NetFigure {
        /// The network.
        pub net: Net,
        /// Its batch.
        pub batch: i64,
        /// Full or timing-only.
        pub mode: ExecMode,
        /// Wall time of a user's whole `gearsim run` of the compiled model: process start, model
        /// load, input copy, execution, output copy, files written.
        pub run_wall: Duration,
        /// Host time of the device execution alone (one `ModelExecute`, after a warm-up run).
        pub execute: Duration,
        /// The clock that measured `execute`.
        pub clock: HostClock,
        /// What the execution simulated.
        pub count: Count,
        /// Multiply-accumulates of the batch.
        pub macs: u64,
    }

    impl NetFigure {
        /// `resnet18 b1 timing-only`.
        pub fn label(&self) -> String {
            format!(
                "{} b{} {}",
                self.net.name(),
                self.batch,
                mode_name(self.mode)
            )
        }

        fn per_second(&self, n: u64) -> f64 {
            n as f64 / self.execute.as_secs_f64().max(1e-9)
        }

        /// The figure as one line.
        pub fn line(&self) -> String {
            format!(
                "{}: gearsim run {:.2} s (load included), execution {:.2} s: {:.1} M cycles/s, \
                 {:.1} M instr/s, {:.2} G MACs/s",
                self.label(),
                self.run_wall.as_secs_f64(),
                self.execute.as_secs_f64(),
                self.per_second(self.count.cycles) / 1e6,
                self.per_second(self.count.instructions) / 1e6,
                self.per_second(self.macs) / 1e9
            )
        }

        /// The figure as one JSON object.
        pub fn json(&self) -> serde_json::Value {
            serde_json::json!({
                "model": self.net.name(),
                "gear": format!("b{}", self.batch),
                "mode": mode_name(self.mode),
                "run_wall_seconds": self.run_wall.as_secs_f64(),
                "execute_seconds": self.execute.as_secs_f64(),
                "host_clock": self.clock.name(),
                "cycles_per_run": self.count.cycles,
                "instructions_per_run": self.count.instructions,
                "macs_per_run": self.macs,
                "cycles_per_second": self.per_second(self.count.cycles),
                "instructions_per_second": self.per_second(self.count.instructions),
                "macs_per_second": self.per_second(self.macs),
            })
        }
    }

    /// Compiles `net` at `batch` (fp32 as exported, seeded random weights, atc's defaults:
    /// computed in fp16) for chip `cfg`: the `.om` bytes.
    pub fn compile_net(cfg: &ChipConfig, net: Net, batch: i64) -> Result<Vec<u8>, String> {
        let name = format!("{}_b{batch}.onnx", net.name());
        compile_default(
            cfg,
            &net.onnx(batch, DType::F32, 1),
            &name,
            GearOptions::default(),
        )
    }

    /// Compiles `onnx` (named `name` in messages) with `gear` and atc's other defaults for
    /// non-sink mode on chip `cfg`: the `.om` bytes.
    fn compile_default(
        cfg: &ChipConfig,
        onnx: &[u8],
        name: &str,
        gear: GearOptions,
    ) -> Result<Vec<u8>, String> {
        let opts = CompileOptions {
            gear,
            getnext_sink: false,
            table_layout: Default::default(),
            mapindex_engine: Default::default(),
            fusion: Default::default(),
            precision: Default::default(),
            target: crate::target::for_chip(cfg),
        };
        compile(onnx, name, &opts)
            .map_err(|e| format!("{name}: {e}"))?
            .om_bytes()
    }

    /// Where [`measure_net`] writes the model of `net` at `batch` under `work`.
    pub fn net_model_path(work: &std::path::Path, net: Net, batch: i64) -> std::path::PathBuf {
        work.join(format!("{}_b{batch}.om", net.name()))
    }

    /// The wall time of one whole `gearsim run` (the binary at `gearsim`) of the model at
    /// `model` in `mode`, its outputs written under `work`, timed as a process from outside.
    fn whole_run(
        gearsim: &std::path::Path,
        model: &std::path::Path,
        work: &std::path::Path,
        mode: ExecMode,
    ) -> Result<Duration, String> {
        let mut cmd = std::process::Command::new(gearsim);
        cmd.arg("run")
            .arg("--model")
            .arg(model)
            .arg("--output_dir")
            .arg(work.join("out"));
        if mode == ExecMode::TimingOnly {
            cmd.arg("--timing_only");
        }
        let started = Instant::now();
        let out = cmd
            .output()
            .map_err(|e| format!("cannot start {}: {e}", gearsim.display()))?;
        let wall = started.elapsed();
        if !out.status.success() {
            return Err(format!(
                "gearsim run {}: {}",
                model.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(wall)
    }

    /// Full mode against timing-only on one network and batch, as whole `gearsim run`s in
    /// alternating pairs: the machine's speed drifts on a shared host, and a ratio taken pair
    /// by pair sees both commands at nearly the same speed.
    #[derive(Debug, Clone, PartialEq)]
    pub struct PairFigure {
        /// The network.
        pub net: Net,
        /// Its batch.
        pub batch: i64,
        /// Each pair's wall times: full, then timing-only.
        pub pairs: Vec<(Duration, Duration)>,
    }

    impl PairFigure {
        /// Each pair's full wall time over its timing-only wall time, smallest first.
        pub fn ratios(&self) -> Vec<f64> {
            sorted(
                self.pairs
                    .iter()
                    .map(|(full, timing)| full.as_secs_f64() / timing.as_secs_f64().max(1e-9)),
            )
        }

        /// The median of the pairs' ratios.
        pub fn median_ratio(&self) -> f64 {
            stats::median(&self.ratios())
        }

        fn medians(&self) -> (f64, f64) {
            let full = sorted(self.pairs.iter().map(|p| p.0.as_secs_f64()));
            let timing = sorted(self.pairs.iter().map(|p| p.1.as_secs_f64()));
            (stats::median(&full), stats::median(&timing))
        }

        /// The 95% confidence interval of the median ratio ([`stats::median_interval`]).
        pub fn median_ratio_interval(&self) -> Option<(f64, f64)> {
            stats::median_interval(&self.ratios())
        }

        fn range(&self) -> (f64, f64) {
            let r = self.ratios();
            (
                r.first().copied().unwrap_or(0.0),
                r.last().copied().unwrap_or(0.0),
            )
        }

        /// The figure as one line.
        pub fn line(&self) -> String {
            let ((full, timing), (lo, hi)) = (self.medians(), self.range());
            let interval = match self.median_ratio_interval() {
                Some((low, high)) => format!(", 95% interval {low:.2}-{high:.2}"),
                None => String::new(),
            };
            format!(
                "{} b{} full against timing-only: median ratio {:.2}{interval} over {} \
                 alternating pairs of whole `gearsim run`s (range {lo:.2}-{hi:.2}); medians \
                 full {full:.2} s, timing-only {timing:.2} s",
                self.net.name(),
                self.batch,
                self.median_ratio(),
                self.pairs.len()
            )
        }

        /// The figure as one JSON object.
        pub fn json(&self) -> serde_json::Value {
            let ((full, timing), (lo, hi)) = (self.medians(), self.range());
            serde_json::json!({
                "model": self.net.name(),
                "gear": format!("b{}", self.batch),
                "pairs": self.pairs.len(),
                "median_ratio_full_to_timing_only": self.median_ratio(),
                "median_ratio_interval_95": self.median_ratio_interval().map(|(l, h)| [l, h]),
                "min_ratio": lo,
                "max_ratio": hi,
                "median_full_run_seconds": full,
                "median_timing_only_run_seconds": timing,
            })
        }
    }

    /// `values` in ascending order.
    fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
        let mut v: Vec<f64> = values.collect();
        v.sort_by(f64::total_cmp);
        v
    }

    /// Runs the model [`measure_net`] wrote for `net` at `batch` under `work` in `pairs`
    /// alternating pairs of whole `gearsim run`s, full then timing-only.
    pub fn pair_net(
        net: Net,
        batch: i64,
        pairs: usize,
        gearsim: &std::path::Path,
        work: &std::path::Path,
    ) -> Result<PairFigure, String> {
        let model = net_model_path(work, net, batch);
        let pairs = (0..pairs)
            .map(|_| {
                let full = whole_run(gearsim, &model, work, ExecMode::Full)?;
                let timing = whole_run(gearsim, &model, work, ExecMode::TimingOnly)?;
                Ok((full, timing))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(PairFigure { net, batch, pairs })
    }

    /// Measures `net` at `batch` in `mode`: `gearsim` (the binary at `gearsim`) runs the model
    /// written under `work` once as a user would, then the execution alone is timed in this
    /// process on a fresh device, after a warm-up run.
    pub fn measure_net(
        cfg: &ChipConfig,
        net: Net,
        batch: i64,
        mode: ExecMode,
        gearsim: &std::path::Path,
        work: &std::path::Path,
    ) -> Result<NetFigure, String> {
        let om = compile_net(cfg, net, batch)?;
        let path = net_model_path(work, net, batch);
        std::fs::write(&path, &om).map_err(|e| format!("{}: {e}", path.display()))?;
        let run_wall = whole_run(gearsim, &path, work, mode)?;
        let file = OmFile::parse(&om).map_err(|e| e.to_string())?;
        let mut dev = Device::new(cfg.clone(), NullSink);
        dev.set_exec_mode(mode);
        let loaded = LoadedModel::load(&mut dev, &file).map_err(|e| e.to_string())?;
        let stream = dev.create_stream().map_err(|e| e.to_string())?;
        for (input, ptr) in loaded.desc.inputs.iter().zip(&loaded.inputs) {
            dev.write(*ptr, &vec![0u8; input.bytes as usize])
                .map_err(|e| e.to_string())?;
        }
        let mut p = Prepared {
            dev,
            model: loaded,
            stream,
        };
        p.run()?;
        let clock = HostClock::best();
        let epoch = Instant::now();
        let t = clock.now(epoch);
        let count = p.run()?;
        let execute = clock.now(epoch).saturating_sub(t);
        Ok(NetFigure {
            net,
            batch,
            mode,
            run_wall,
            execute,
            clock,
            count,
            macs: net.macs_per_image() * batch as u64,
        })
    }
}
