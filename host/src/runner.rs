//! `gearsim run`: load a `.om`, bind `.npy` inputs in model-input order, run in the model's mode
//! (non-sink, GetNext sink, or hybrid's fallback), and write the outputs at their real shapes.
//!
//! The `.om` is read and validated once ([`OmModel`]): its description picks the chip and the
//! mode, and the runtime loads that same parse. The inputs are checked once, by the runtime.
//! Nothing is written unless every run succeeded: outputs go to temporary files renamed into
//! place at the end, so a failed run leaves an existing output directory as it was.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use gearsim_isa::om::{ModelDesc, OmFile};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::{TraceSink, atomic};
use serde_json::json;

use crate::host_memory;
use crate::inputs::{self, Fill, GearChoice};
use crate::msprof::{self, ComputeTime};
use crate::npy;
use crate::pad::{self, Padding};
use crate::runtime::{RunProfile, RunReport, Runtime, RuntimeError, RuntimeOptions};
use gearsim_isa::tensor::Tensor;

/// How to feed the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Inputs and the dims blob copied by the host.
    NonSink,
    /// Inputs through the device data queue; the device derives the dims.
    Sink,
}

impl Mode {
    /// Parses `nonsink` / `sink`.
    pub fn parse(s: &str) -> Result<Mode> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "nonsink" => Ok(Mode::NonSink),
            "sink" => Ok(Mode::Sink),
            _ => bail!("--mode: expected nonsink or sink, got `{s}`"),
        }
    }

    /// `nonsink` / `sink`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::NonSink => "nonsink",
            Mode::Sink => "sink",
        }
    }
}

/// A `.om` read and validated once: its file (sections checked) and its description, which
/// `gearsim run` reads to pick the chip and the mode before the runtime loads the same parse.
#[derive(Debug, Clone)]
pub struct OmModel<'a> {
    /// Where it came from (for messages).
    pub path: &'a Path,
    /// The validated file.
    pub file: OmFile<'a>,
    /// Its description.
    pub desc: ModelDesc,
}

impl<'a> OmModel<'a> {
    /// Maps the `.om` at `path` (not read until [`OmModel::parse`] validates it).
    pub fn read(path: &Path) -> Result<crate::files::OmMap> {
        crate::files::OmMap::map(path)
    }

    /// Validates `bytes` (read from `path`) and decodes the description, once.
    pub fn parse(path: &'a Path, bytes: &'a [u8]) -> Result<OmModel<'a>> {
        let file = OmFile::parse(bytes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let desc = file
            .desc()
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        Ok(OmModel { path, file, desc })
    }
}

/// What `gearsim run` was asked.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// One `.npy` per data input, in model-input order.
    pub inputs: Vec<PathBuf>,
    /// Where `output_<i>.npy` go (created if missing); None writes nothing.
    pub output_dir: Option<PathBuf>,
    /// The mode asked for (None: the one the model was compiled for).
    pub mode: Option<Mode>,
    /// Time only: no values are computed and no outputs written.
    pub timing_only: bool,
    /// Runs.
    pub repeat: u32,
    /// `ge.exec.input_fusion_size`.
    pub input_fusion_size: i64,
    /// Keep every run's task-by-task profile ([`RunOutcome::profiles`]).
    pub profile: bool,
    /// Without input files: the shapes to make the inputs at.
    pub gear: GearChoice,
    /// Without input files: what they hold.
    pub fill: Fill,
    /// Pad a batch between two gears up to the next larger gear (see [`crate::pad`]).
    pub pad_to_gear: bool,
    /// Host threads that compute values (the outputs do not depend on it).
    pub host_threads: usize,
    /// The host memory the run may use (None: what the host has free).
    pub host_memory_limit: Option<u64>,
}

/// What `gearsim run` did.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The model's name.
    pub model: String,
    /// Its outputs' names, in order.
    pub output_names: Vec<String>,
    /// The mode it ran in.
    pub mode: Mode,
    /// The chip.
    pub soc_version: String,
    /// The last run's report.
    pub last: RunReport,
    /// Device time of every run, in picoseconds.
    pub times_ps: Vec<u64>,
    /// The `aclmdlExecute` call of every run as a host timer measures it (ais_bench's NPU
    /// compute time), in picoseconds.
    pub execute_call_ps: Vec<u64>,
    /// Every run's profile, when asked for (Infer ID = position).
    pub profiles: Vec<RunProfile>,
    /// The batch a throughput counts: the first data input's leading dimension.
    pub batch: u64,
    /// How the request was padded, and the padding check's finding.
    pub padding: Option<(Padding, String)>,
    /// Output files written.
    pub written: Vec<PathBuf>,
}

/// Runs `model` on chip `cfg` (which must be the chip it was compiled for: its kernels are
/// tiled for that chip's buffers) and writes the outputs; `progress` is called after each run
/// with (done, total).
pub fn run<S: TraceSink>(
    req: &RunRequest,
    model: &OmModel<'_>,
    cfg: ChipConfig,
    sink: S,
    progress: &mut dyn FnMut(u32, u32),
) -> Result<(RunOutcome, S)> {
    let path = model.path.display();
    if req.repeat == 0 {
        bail!("--repeat: expected at least 1, got 0");
    }
    let desc = &model.desc;
    if !cfg.name.eq_ignore_ascii_case(&desc.soc_version) {
        bail!(
            "{path}: compiled for {}, not {}: its kernels are tiled for that chip's buffers \
             (recompile with --soc_version={})",
            desc.soc_version,
            cfg.name,
            cfg.name
        );
    }
    let soc = desc.soc_version.clone();
    let compiled_sink = desc.dynamic.as_ref().is_some_and(|d| d.getnext_sink);
    let mode = req.mode.unwrap_or(if compiled_sink {
        Mode::Sink
    } else {
        Mode::NonSink
    });
    if (mode == Mode::Sink) != compiled_sink {
        bail!(
            "{path}: --mode={} but the model was compiled for {} mode (compile {} --getnext_sink)",
            mode.name(),
            if compiled_sink { "sink" } else { "non-sink" },
            if compiled_sink { "without" } else { "with" }
        );
    }
    let inputs: Vec<Tensor> = if req.inputs.is_empty() {
        inputs::generate(desc, &req.gear, req.fill).map_err(|e| anyhow!("{path}: {e}"))?
    } else {
        if req.gear != GearChoice::Static {
            bail!(
                "--dymBatch / --dymHW / --dymDims make up the inputs at a gear; with --input files \
                 the shapes come from the files: give one or the other"
            );
        }
        req.inputs
            .iter()
            .map(|p| npy::read(p).map_err(|e| anyhow!("{e}")))
            .collect::<Result<_>>()?
    };
    let (inputs, padding) = if req.pad_to_gear {
        match pad::plan(desc, &inputs).map_err(|e| anyhow!("{path}: --pad_to_gear: {e}"))? {
            None => (inputs, None),
            Some(p) => {
                let c = pad::check(&cfg, &model.file, desc)
                    .map_err(|e| anyhow!("{path}: --pad_to_gear: {e}"))?;
                if !c.allowed {
                    bail!(
                        "{path}: --pad_to_gear refused: {} (padding would change the outputs \
                         of the real rows)",
                        c.reason
                    );
                }
                let padded = pad::pad(desc, &inputs, &p).map_err(|e| anyhow!("{path}: {e}"))?;
                (padded, Some((p, c.reason)))
            }
        }
    } else {
        (inputs, None)
    };
    let exec_mode = if req.timing_only {
        ExecMode::TimingOnly
    } else {
        ExecMode::Full
    };
    let estimate = host_memory::estimate(desc, &cfg, exec_mode);
    let limit = match req.host_memory_limit {
        Some(b) => Some((b, "--host_memory_limit".to_string())),
        None => host_memory::available(),
    };
    if let Some(limit) = &limit {
        host_memory::check(&estimate, exec_mode, limit, Some("--host_memory_limit"))
            .map_err(|e| anyhow!("{path}: {e}"))?;
    }
    let mut rt = Runtime::new(
        cfg,
        sink,
        RuntimeOptions {
            input_fusion_size: req.input_fusion_size,
            exec_mode,
            profile: req.profile,
            host_threads: req.host_threads,
        },
    )?;
    let m = rt
        .load_parsed(&model.file, desc.clone())
        .map_err(|e| anyhow!("{path}: {e}"))?;
    let mut times = Vec::new();
    let mut execute = Vec::new();
    let mut profiles = Vec::new();
    let mut last = None;
    for i in 0..req.repeat {
        // The runtime checks the inputs (once per run, as for any caller); a mismatch is
        // reported against the file it came from.
        let r = match mode {
            Mode::NonSink => rt.run(m, &inputs),
            Mode::Sink => rt.run_sink(m, &inputs),
        }
        .map_err(|e| match &e {
            RuntimeError::BadInput { index: Some(k), .. } if *k < req.inputs.len() => {
                anyhow!("{}: does not fit {path}: {e}", req.inputs[*k].display())
            }
            RuntimeError::BadInput { index: None, .. } => {
                anyhow!("{path}: {e} --input file(s)")
            }
            _ => anyhow!("{path}: {e}"),
        })?;
        times.push(r.device_time_ps);
        execute.push(r.execute_call_ps);
        let mut r = r;
        if let Some(p) = r.profile.take() {
            profiles.push(p);
        }
        last = Some(r);
        progress(i + 1, req.repeat);
    }
    let mut last = last.ok_or_else(|| anyhow!("no run"))?;
    if let Some((p, _)) = &padding {
        last.outputs = pad::trim(&last.outputs, p).map_err(|e| anyhow!("{path}: {e}"))?;
    }
    let mut written = Vec::new();
    if let (Some(dir), false) = (&req.output_dir, req.timing_only) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
        // Every file is first written whole under a temporary name; only when all are are they
        // renamed into place (a failure drops the staged files, which removes them).
        let staged = last
            .outputs
            .iter()
            .enumerate()
            .map(|(i, t)| atomic::stage(&dir.join(format!("output_{i}.npy")), &npy::encode(t)))
            .collect::<Result<Vec<_>, _>>()?;
        for temp in staged {
            let path = temp.dest().to_path_buf();
            temp.persist()?;
            written.push(path);
        }
    }
    let name = desc.name.clone();
    let sink = rt.into_sink();
    Ok((
        RunOutcome {
            model: name,
            output_names: desc.outputs.iter().map(|o| o.name.clone()).collect(),
            mode,
            soc_version: soc,
            last,
            times_ps: times,
            execute_call_ps: execute,
            profiles,
            batch: padding.as_ref().map_or_else(
                || {
                    inputs
                        .first()
                        .and_then(|t| t.dims.first())
                        .map_or(1, |d| (*d).max(1) as u64)
                },
                |(p, _)| p.from as u64,
            ),
            padding,
            written,
        },
        sink,
    ))
}

fn dims_text(d: &[i64]) -> String {
    format!(
        "[{}]",
        d.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    )
}

impl RunOutcome {
    /// The report as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        let r = &self.last;
        json!({
            "model": self.model,
            "mode": self.mode.name(),
            "soc_version": self.soc_version,
            "path": r.path.name(),
            "reason": r.reason,
            "gear": r.gear,
            "cur_dynamic_dims": r.cur_dynamic_dims,
            "output_names": self.output_names,
            "output_shapes": r.outputs.iter().map(|t| t.dims.clone()).collect::<Vec<_>>(),
            "output_dtypes": r.outputs.iter().map(|t| t.dtype.name()).collect::<Vec<_>>(),
            "outputs": self.written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "device_time_us": r.device_time_ps as f64 / 1e6,
            "execute_us": r.execute_ps as f64 / 1e6,
            "execute_call_us": r.execute_call_ps as f64 / 1e6,
            "host_time_us": r.host_ps as f64 / 1e6,
            "end_to_end_us": r.end_to_end_ps as f64 / 1e6,
            "device_time_us_per_run": self.times_ps.iter().map(|t| *t as f64 / 1e6).collect::<Vec<_>>(),
            "h2d_bytes": r.h2d_bytes,
            "h2d_transfers": r.h2d_transfers,
            "d2h_bytes": r.d2h_bytes,
            "d2h_transfers": r.d2h_transfers,
            "warnings": r.warnings,
            "npu_compute_time": self.compute_time().map(|c| c.json()),
            "padded": self.padding.as_ref().map(|(p, why)| json!({
                "from": p.from,
                "to": p.to,
                "gear": p.gear,
                "wasted": p.wasted(),
                "check": why,
            })),
            "phases": self.profiles.last().map(|p| p.phases.iter().map(|ph| json!({
                "name": ph.name,
                "start_us": ph.start_ps as f64 / 1e6,
                "us": ph.ps() as f64 / 1e6,
            })).collect::<Vec<_>>()),
            "ops": self.profiles.last().map(|p| p.ops.iter().map(msprof::op_record).collect::<Vec<_>>()),
        })
    }

    /// ais_bench's NPU compute time over the runs.
    pub fn compute_time(&self) -> Option<ComputeTime> {
        ComputeTime::of(&self.execute_call_ps, self.batch)
    }

    /// The files of `--profile DIR`: op_summary.csv, task_time.csv, summary.json, summary.txt.
    pub fn profile_files(&self) -> Vec<(&'static str, String)> {
        let runs: Vec<&RunProfile> = self.profiles.iter().collect();
        let mut text = self.text();
        if let Some(p) = self.profiles.last() {
            text.push(format!("phases: {}", msprof::phases_text(p)));
        }
        let mut summary = self.json();
        if let Some(o) = summary.as_object_mut() {
            o.remove("ops");
        }
        vec![
            ("op_summary.csv", msprof::op_summary_csv(&self.model, &runs)),
            ("task_time.csv", msprof::task_time_csv(&runs)),
            (
                "summary.json",
                serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n",
            ),
            ("summary.txt", text.join("\n") + "\n"),
        ]
    }

    /// The report as text lines (warnings are the caller's to show).
    pub fn text(&self) -> Vec<String> {
        let r = &self.last;
        let mut out = vec![format!(
            "{} on {} ({} mode): path {} — {}",
            self.model,
            self.soc_version,
            self.mode.name(),
            r.path.name(),
            r.reason
        )];
        if let Some((p, why)) = &self.padding {
            out.push(format!("padded: {} ({why})", p.text()));
        }
        out.push(format!(
            "gear: {}   cur_dynamic_dims: {}",
            r.gear.map_or_else(|| "none".to_string(), |g| g.to_string()),
            dims_text(&r.cur_dynamic_dims)
        ));
        for (i, t) in r.outputs.iter().enumerate() {
            let to = self
                .written
                .get(i)
                .map_or_else(String::new, |p| format!(" -> {}", p.display()));
            let name = self
                .output_names
                .get(i)
                .map_or_else(String::new, |n| format!(" `{n}`"));
            out.push(format!(
                "output {i}{name}: {} {}{to}",
                t.dtype.name(),
                dims_text(&t.dims)
            ));
        }
        let n = self.times_ps.len() as f64;
        let mean = self.times_ps.iter().sum::<u64>() as f64 / n / 1e6;
        let min = self.times_ps.iter().min().copied().unwrap_or(0) as f64 / 1e6;
        out.push(format!(
            "device time: {:.3} us{}",
            r.device_time_ps as f64 / 1e6,
            if self.times_ps.len() > 1 {
                format!(
                    " (last of {}; mean {mean:.3} us, min {min:.3} us)",
                    self.times_ps.len()
                )
            } else {
                String::new()
            }
        ));
        out.push(format!(
            "end to end: {:.3} us (host work {:.3} us; model execution {:.3} us)",
            r.end_to_end_ps as f64 / 1e6,
            r.host_ps as f64 / 1e6,
            r.execute_ps as f64 / 1e6
        ));
        out.push(format!(
            "host->device: {} B in {} transfer(s); device->host: {} B in {} transfer(s)",
            r.h2d_bytes, r.h2d_transfers, r.d2h_bytes, r.d2h_transfers
        ));
        if let Some(c) = self.compute_time() {
            out.extend(c.text());
        }
        out
    }
}
