//! `gearsim run`: load a `.om`, bind `.npy` inputs in model-input order, run in the model's mode
//! (non-sink, GetNext sink, or hybrid's fallback), and write the outputs at their real shapes.
//!
//! Nothing is written unless every run succeeded: outputs go to temporary files renamed into
//! place at the end, so a failed run leaves an existing output directory as it was.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use gearsim_isa::om::{ModelDesc, OmFile};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::TraceSink;
use serde_json::json;

use crate::npy;
use crate::runtime::session::{data_inputs, io_type};
use crate::runtime::{RunReport, Runtime, RuntimeOptions};
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

/// What `gearsim run` was asked.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The `.om`.
    pub model: PathBuf,
    /// One `.npy` per data input, in model-input order.
    pub inputs: Vec<PathBuf>,
    /// Where `output_<i>.npy` go (created if missing); None writes nothing.
    pub output_dir: Option<PathBuf>,
    /// The mode asked for (None: the one the model was compiled for).
    pub mode: Option<Mode>,
    /// The chip (None: the preset the model was compiled for).
    pub soc_version: Option<String>,
    /// Time only: no values are computed and no outputs written.
    pub timing_only: bool,
    /// Runs.
    pub repeat: u32,
    /// `ge.exec.input_fusion_size`.
    pub input_fusion_size: i64,
}

/// What `gearsim run` did.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The model's name.
    pub model: String,
    /// The mode it ran in.
    pub mode: Mode,
    /// The chip.
    pub soc_version: String,
    /// The last run's report.
    pub last: RunReport,
    /// Device time of every run, in picoseconds.
    pub times_ps: Vec<u64>,
    /// Output files written.
    pub written: Vec<PathBuf>,
}

/// Loads, runs and writes; `progress` is called after each run with (done, total).
pub fn run<S: TraceSink>(
    req: &RunRequest,
    sink: S,
    progress: &mut dyn FnMut(u32, u32),
) -> Result<(RunOutcome, S)> {
    if req.repeat == 0 {
        bail!("--repeat: expected at least 1, got 0");
    }
    let om = std::fs::read(&req.model)
        .with_context(|| format!("cannot read the model {}", req.model.display()))?;
    let desc = OmFile::parse(&om)
        .and_then(|f| f.desc())
        .map_err(|e| anyhow!("{}: {e}", req.model.display()))?;
    let soc = match &req.soc_version {
        Some(s) if !s.eq_ignore_ascii_case(&desc.soc_version) => bail!(
            "{}: compiled for {}, not {s}: its kernels are tiled for that chip's buffers \
             (recompile with --soc_version={s})",
            req.model.display(),
            desc.soc_version
        ),
        _ => desc.soc_version.clone(),
    };
    let cfg = ChipConfig::preset(&soc).with_context(|| {
        format!(
            "{}: the chip `{soc}` the model was compiled for is not available",
            req.model.display()
        )
    })?;
    let compiled_sink = desc.dynamic.as_ref().is_some_and(|d| d.getnext_sink);
    let mode = req.mode.unwrap_or(if compiled_sink {
        Mode::Sink
    } else {
        Mode::NonSink
    });
    if (mode == Mode::Sink) != compiled_sink {
        bail!(
            "{}: --mode={} but the model was compiled for {} mode (compile {} --getnext_sink)",
            req.model.display(),
            mode.name(),
            if compiled_sink { "sink" } else { "non-sink" },
            if compiled_sink { "without" } else { "with" }
        );
    }
    let inputs: Vec<Tensor> = req
        .inputs
        .iter()
        .map(|p| npy::read(p).map_err(|e| anyhow!("{e}")))
        .collect::<Result<_>>()?;
    check_input_files(req, &desc, &inputs)?;
    let exec_mode = if req.timing_only {
        ExecMode::TimingOnly
    } else {
        ExecMode::Full
    };
    let mut rt = Runtime::new(
        cfg,
        sink,
        RuntimeOptions {
            input_fusion_size: req.input_fusion_size,
            exec_mode,
        },
    )?;
    let m = rt
        .load(&om)
        .map_err(|e| anyhow!("{}: {e}", req.model.display()))?;
    let mut times = Vec::new();
    let mut last = None;
    for i in 0..req.repeat {
        let r = match mode {
            Mode::NonSink => rt.run(m, &inputs),
            Mode::Sink => rt.run_sink(m, &inputs),
        }
        .map_err(|e| anyhow!("{}: {e}", req.model.display()))?;
        times.push(r.device_time_ps);
        last = Some(r);
        progress(i + 1, req.repeat);
    }
    let last = last.ok_or_else(|| anyhow!("no run"))?;
    let mut written = Vec::new();
    if let (Some(dir), false) = (&req.output_dir, req.timing_only) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
        // Every file first goes to a temporary name; only when all are written are they
        // renamed into place.
        let mut staged = Vec::new();
        for (i, t) in last.outputs.iter().enumerate() {
            let path = dir.join(format!("output_{i}.npy"));
            let tmp = dir.join(format!(".output_{i}.npy.tmp"));
            let result = std::fs::write(&tmp, npy::encode(t))
                .with_context(|| format!("cannot write {}", tmp.display()));
            if let Err(e) = result {
                for (t, _) in &staged {
                    let _ = std::fs::remove_file(t);
                }
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            staged.push((tmp, path));
        }
        for (tmp, path) in staged {
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path);
        }
    }
    let name = desc.name.clone();
    let sink = rt.into_sink();
    Ok((
        RunOutcome {
            model: name,
            mode,
            soc_version: soc,
            last,
            times_ps: times,
            written,
        },
        sink,
    ))
}

/// Checks each `.npy` against the model input it is bound to (count, element type, rank and
/// fixed dims), so a mismatch names the file; the runtime checks the rest (the gears).
fn check_input_files(req: &RunRequest, desc: &ModelDesc, inputs: &[Tensor]) -> Result<()> {
    let wanted = &desc.inputs[..data_inputs(desc)];
    if inputs.len() != wanted.len() {
        let names: Vec<&str> = wanted.iter().map(|io| io.name.as_str()).collect();
        bail!(
            "{}: the model takes {} input(s) ({}), got {} --input file(s)",
            req.model.display(),
            wanted.len(),
            names.join(", "),
            inputs.len()
        );
    }
    for (i, ((path, t), io)) in req.inputs.iter().zip(inputs).zip(wanted).enumerate() {
        let fits = io_type(io).is_ok_and(|d| d == t.dtype)
            && t.dims.len() == io.dims.len()
            && io
                .dims
                .iter()
                .zip(&t.dims)
                .all(|(&want, &got)| want < 0 || want == got);
        if !fits {
            bail!(
                "{}: input {i} (`{}`) of {}: expected {} {}, got {} {}",
                path.display(),
                io.name,
                req.model.display(),
                io_type(io).map_or_else(|_| format!("onnx:{}", io.dtype), |d| d.name().to_string()),
                dims_text(&io.dims),
                t.dtype.name(),
                dims_text(&t.dims)
            );
        }
    }
    Ok(())
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
            "output_shapes": r.outputs.iter().map(|t| t.dims.clone()).collect::<Vec<_>>(),
            "output_dtypes": r.outputs.iter().map(|t| t.dtype.name()).collect::<Vec<_>>(),
            "outputs": self.written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "device_time_us": r.device_time_ps as f64 / 1e6,
            "device_time_us_per_run": self.times_ps.iter().map(|t| *t as f64 / 1e6).collect::<Vec<_>>(),
            "h2d_bytes": r.h2d_bytes,
            "h2d_transfers": r.h2d_transfers,
            "d2h_bytes": r.d2h_bytes,
            "d2h_transfers": r.d2h_transfers,
            "warnings": r.warnings,
        })
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
            out.push(format!(
                "output {i}: {} {}{to}",
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
            "host->device: {} B in {} transfer(s); device->host: {} B in {} transfer(s)",
            r.h2d_bytes, r.h2d_transfers, r.d2h_bytes, r.d2h_transfers
        ));
        out
    }
}
