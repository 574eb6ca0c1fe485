//! `gearsim._native`: the extension module behind the `gearsim` Python package
//! (`python/gearsim/__init__.py` holds the user-facing classes). It compiles as the command
//! line does (`gearsim_host::options::AtcRequest`), runs models on `gearsim_host::runtime`,
//! and reads traces; reports cross as JSON text, tensors as flat `uint8` numpy arrays the
//! Python side views at their dtype and shape (one copy in, none out).
//!
//! Every simulation runs with the GIL released on a worker thread while the calling thread
//! polls for signals, so Ctrl-C stops it within one chip event (the session is then unusable:
//! its device stopped mid-run).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use gearsim_host::msprof;
use gearsim_host::options::{AtcRequest, ChipChoice, GearFlags};
use gearsim_host::pad::{self, PadCheck, Padding};
use gearsim_host::runner::{Mode, RunOutcome};
use gearsim_host::runtime::{
    ModelId, RunProfile, RunReport, Runtime, RuntimeError, RuntimeOptions,
};
use gearsim_isa::om::OmFile;
use gearsim_isa::tensor::{DataType, Tensor};
use gearsim_sim::{ExecMode, Setting};
use gearsim_traces as analysis;
use gearsim_traces::{Level, TraceFile, TraceFileWriter, TraceSink};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::json;

pyo3::create_exception!(
    _native,
    GearsimError,
    PyException,
    "A gearsim error: `.code` is the GE / ACL code when there is one (`E13025`, `100000`), else None; `.message` the text."
);

/// The GE E-code (`E10001`) or bracketed ACL code (`[100000]`) a message carries, if any.
fn code_of(message: &str) -> Option<String> {
    let b = message.as_bytes();
    for i in 0..b.len() {
        if b[i] == b'E'
            && b.len() >= i + 6
            && b[i + 1..i + 6].iter().all(u8::is_ascii_digit)
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric())
            && b.get(i + 6).is_none_or(|c| !c.is_ascii_alphanumeric())
        {
            return Some(message[i..i + 6].to_string());
        }
    }
    let rest = message.strip_prefix('[')?;
    let (code, _) = rest.split_once(']')?;
    code.chars()
        .all(|c| c.is_ascii_digit())
        .then(|| code.to_string())
}

/// `set={"section.key": value, ...}`: the chip values to change, as `--set` takes them (a
/// bool as `true` / `false`, anything else as its text).
fn settings_of(d: &Bound<'_, PyDict>) -> PyResult<Vec<Setting>> {
    let mut out = Vec::new();
    for (k, v) in d.iter() {
        let key: String = k
            .extract()
            .map_err(|_| error(format!("`set`: a key must be a string, got {k}")))?;
        let value = match v.extract::<bool>() {
            Ok(b) => b.to_string(),
            Err(_) => v.str()?.to_string(),
        };
        out.push(Setting::new(&key, &value).map_err(error)?);
    }
    Ok(out)
}

/// A `GearsimError` with its code and message.
fn error(message: impl std::fmt::Display) -> PyErr {
    error_with(code_of(&message.to_string()), message)
}

fn error_with(code: Option<String>, message: impl std::fmt::Display) -> PyErr {
    let message = message.to_string();
    Python::attach(|py| {
        let e = GearsimError::new_err(message.clone());
        let v = e.value(py);
        let set = v
            .setattr("code", code)
            .and_then(|()| v.setattr("message", message));
        match set {
            Ok(()) => e,
            Err(other) => other,
        }
    })
}

fn runtime_error(e: &RuntimeError) -> PyErr {
    error_with(Some(e.code().to_string()), e)
}

/// Runs `work` with the GIL released on a worker thread; the calling thread checks for signals
/// every 50 ms and, on one (Ctrl-C), sets `stop` and waits for the worker to see it.
fn interruptible<T: Send>(
    py: Python<'_>,
    stop: &AtomicBool,
    work: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    stop.store(false, Ordering::Relaxed);
    py.detach(|| {
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let worker = s.spawn(move || {
                let _ = tx.send(work());
            });
            let mut signalled = None;
            let result = loop {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(v) => break Some(v),
                    Err(mpsc::RecvTimeoutError::Disconnected) => break None,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if signalled.is_none()
                            && let Err(e) = Python::attach(|py| py.check_signals())
                        {
                            stop.store(true, Ordering::Relaxed);
                            signalled = Some(e);
                        }
                    }
                }
            };
            let panicked = worker.join().is_err();
            if let Some(e) = signalled {
                return Err(e);
            }
            match result {
                Some(v) if !panicked => Ok(v),
                _ => Err(error("internal error: the simulation panicked")),
            }
        })
    })
}

/// A feed from Python: gearsim's dtype name, the shape, the bytes (a flat `uint8` array).
type Feed<'py> = (String, Vec<i64>, PyReadonlyArray1<'py, u8>);

/// Tensors of the feeds (one copy of each buffer); `names` name the inputs in errors.
fn tensors(feeds: Vec<Feed<'_>>, names: &[String]) -> PyResult<Vec<Tensor>> {
    feeds
        .into_iter()
        .enumerate()
        .map(|(i, (dtype, dims, data))| {
            let name = names.get(i).map_or("?", String::as_str);
            let t = DataType::ALL
                .iter()
                .copied()
                .find(|d| d.name() == dtype)
                .ok_or_else(|| {
                    error(format!(
                        "[100000] input {i} (`{name}`): gearsim has no element type `{dtype}`"
                    ))
                })?;
            let bytes = data
                .as_slice()
                .map_err(|e| error(format!("input {i} (`{name}`): {e}")))?;
            Tensor::new(t, dims, bytes.to_vec())
                .map_err(|e| error(format!("[100000] input {i} (`{name}`): {e}")))
        })
        .collect()
}

/// An output for Python: dtype name, shape, the bytes (moved into a numpy array, no copy).
type Output<'py> = (String, Vec<i64>, Bound<'py, PyArray1<u8>>);

fn outputs<'py>(py: Python<'py>, ts: Vec<Tensor>) -> Vec<Output<'py>> {
    ts.into_iter()
        .map(|t| {
            (
                t.dtype.name().to_string(),
                t.dims.clone(),
                // The runtime's outputs are not shared, so this moves the bytes.
                PyArray1::from_vec(py, Arc::unwrap_or_clone(t.data)),
            )
        })
        .collect()
}

/// Compiles `model` into `output` (`.om` added) as `gearsim compile` does; `options` are atc's
/// (`input_shape`, `dynamic_batch_size`, `soc_version`, `precision_mode`, `getnext_sink`, ...).
/// Returns the report as JSON text.
#[pyfunction]
fn compile(
    py: Python<'_>,
    model: PathBuf,
    output: PathBuf,
    options: &Bound<'_, PyDict>,
) -> PyResult<String> {
    let mut r = AtcRequest::new(model, output);
    let mut chip = ChipChoice::default();
    let mut gear = GearFlags::default();
    for (k, v) in options.iter() {
        let key: String = k.extract()?;
        if v.is_none() {
            continue;
        }
        let text = || -> PyResult<String> {
            if let Ok(b) = v.extract::<bool>() {
                return Ok(if b { "1" } else { "0" }.to_string());
            }
            if let Ok(i) = v.extract::<i64>() {
                return Ok(i.to_string());
            }
            v.extract::<String>().or_else(|_| Ok(v.str()?.to_string()))
        };
        let flag = || -> PyResult<bool> {
            v.extract::<bool>()
                .map_err(|_| error(format!("`{key}`: expected True or False")))
        };
        match key.as_str() {
            "soc_version" => chip.soc_version = Some(text()?),
            "chip_config" => chip.chip_config = Some(PathBuf::from(text()?)),
            "set" => {
                chip.settings = settings_of(v.cast::<PyDict>().map_err(|_| {
                    error(format!(
                        "`set`: expected a dict of section.key to value, got {v}"
                    ))
                })?)?
            }
            "clock_mhz" => {
                chip.clock_mhz = Some(
                    v.extract()
                        .map_err(|_| error(format!("`clock_mhz`: expected an integer, got {v}")))?,
                )
            }
            "input_shape" => gear.input_shape = Some(text()?),
            "dynamic_batch_size" => gear.dynamic_batch_size = Some(text()?),
            "dynamic_image_size" => gear.dynamic_image_size = Some(text()?),
            "dynamic_dims" => gear.dynamic_dims = Some(text()?),
            "input_format" => gear.input_format = Some(text()?),
            "insert_op_conf" => gear.insert_op_conf = Some(PathBuf::from(text()?)),
            "enable_small_channel" => gear.enable_small_channel = Some(text()?),
            "framework" => {
                r.framework = v
                    .extract()
                    .map_err(|_| error(format!("`framework`: expected 5, got {v}")))?
            }
            "getnext_sink" => r.getnext_sink = flag()?,
            "hybrid" => r.hybrid = flag()?,
            "gear_table_layout" => r.gear_table_layout = text()?,
            "mapindex_engine" => r.mapindex_engine = text()?,
            "dump_graph" => r.dump_graph = Some(PathBuf::from(text()?)),
            "dump_kernels" => r.dump_kernels = Some(PathBuf::from(text()?)),
            "fusion_switch_file" => r.fusion_switch_file = Some(PathBuf::from(text()?)),
            "precision_mode" => r.precision_mode = text()?,
            "buffer_optimize" => r.buffer_optimize = text()?,
            other => {
                return Err(error(format!(
                    "compile: unknown option `{other}` (atc's options: soc_version, chip_config, \
                     set, clock_mhz, input_shape, dynamic_batch_size, dynamic_image_size, \
                     dynamic_dims, input_format, insert_op_conf, enable_small_channel, \
                     framework, getnext_sink, hybrid, gear_table_layout, mapindex_engine, \
                     dump_graph, dump_kernels, fusion_switch_file, precision_mode, \
                     buffer_optimize)"
                )));
            }
        }
    }
    r.chip = chip;
    r.gear = gear;
    let stop = AtomicBool::new(false);
    let report =
        interruptible(py, &stop, || r.compile().map_err(|e| format!("{e:#}")))?.map_err(error)?;
    let m = &report.compiled.desc.memory;
    Ok(json!({
        "om": report.om.display().to_string(),
        "om_bytes": report.om_bytes,
        "gears": report.compiled.desc.dynamic.as_ref().map_or(0, |d| d.gears.len()),
        "kernels": report.compiled.emitted.kernels.len(),
        "weight_bytes": m.weight_bytes,
        "feature_map_bytes": m.feature_map_bytes,
        "notes": report.compiled.notes,
        "compile_ms": report.elapsed.as_secs_f64() * 1e3,
    })
    .to_string())
}

/// A loaded model on its own simulated device.
#[pyclass(module = "gearsim._native")]
struct Session {
    /// `None` once closed.
    rt: Option<Runtime<Option<TraceFileWriter>>>,
    model: ModelId,
    desc: gearsim_isa::om::ModelDesc,
    stop: Arc<AtomicBool>,
    /// Every run's `aclmdlExecute` call time (ais_bench's NPU compute time), profile and
    /// batch, oldest first.
    execute_ps: Vec<u64>,
    device_ps: Vec<u64>,
    profiles: Vec<RunProfile>,
    batch: u64,
    /// The model file (for the padding check's own device) and its chip.
    om: Vec<u8>,
    cfg: gearsim_sim::ChipConfig,
    /// The padding check's finding, once run.
    pad_check: Option<PadCheck>,
    /// Batches of the items enqueued and not yet run (sink mode).
    queued_batches: Vec<u64>,
    profile_dir: Option<PathBuf>,
}

/// The batch a throughput counts: the first input's leading dimension.
fn batch_of(inputs: &[Tensor]) -> u64 {
    inputs
        .first()
        .and_then(|t| t.dims.first())
        .map_or(1, |d| (*d).max(1) as u64)
}

fn describe_io(ios: &[gearsim_isa::om::IoDesc]) -> serde_json::Value {
    ios.iter()
        .map(|io| {
            json!({
                "name": io.name,
                "dtype": DataType::from_onnx(io.dtype as i32).map_or("?", DataType::name),
                "format": io.format,
                "dims": io.dims,
                "max_dims": io.max_dims,
                "bytes": io.bytes,
            })
        })
        .collect()
}

impl Session {
    fn rt(&mut self) -> PyResult<&mut Runtime<Option<TraceFileWriter>>> {
        self.rt
            .as_mut()
            .ok_or_else(|| error("[100000] the session is closed"))
    }

    fn data_input_names(&self) -> Vec<String> {
        let n = gearsim_host::runtime::session::data_inputs(&self.desc);
        self.desc.inputs[..n]
            .iter()
            .map(|i| i.name.clone())
            .collect()
    }

    /// Keeps the run's figures, writes the profile directory, and returns the report as JSON.
    /// Pads `inputs` up to the next gear when their batch is between gears, running the
    /// padding check the first time (a model that fails it is refused with the reason).
    fn padding(
        &mut self,
        py: Python<'_>,
        inputs: &mut Vec<Tensor>,
    ) -> PyResult<Option<(Padding, String)>> {
        let Some(p) =
            pad::plan(&self.desc, inputs).map_err(|e| error(format!("pad_to_gear: {e}")))?
        else {
            return Ok(None);
        };
        if self.pad_check.is_none() {
            let file = OmFile::parse(&self.om).map_err(error)?;
            let (cfg, desc, stop) = (&self.cfg, &self.desc, self.stop.clone());
            let c = interruptible(py, &stop, || pad::check(cfg, &file, desc))?.map_err(error)?;
            self.pad_check = Some(c);
        }
        let c = self.pad_check.clone().unwrap_or(PadCheck {
            allowed: false,
            reason: "no padding check".into(),
        });
        if !c.allowed {
            return Err(error(format!(
                "pad_to_gear refused: {} (padding would change the outputs of the real rows)",
                c.reason
            )));
        }
        *inputs = pad::pad(&self.desc, inputs, &p).map_err(error)?;
        Ok(Some((p, c.reason)))
    }

    fn finish(
        &mut self,
        mut r: RunReport,
        batch: u64,
        padding: Option<(Padding, String)>,
    ) -> PyResult<(Vec<Tensor>, String)> {
        self.execute_ps.push(r.execute_call_ps);
        self.device_ps.push(r.device_time_ps);
        if let Some(p) = r.profile.take() {
            self.profiles.push(p);
        }
        self.batch = batch;
        let outputs = std::mem::take(&mut r.outputs);
        let mut shaped = r.clone();
        shaped.outputs = outputs
            .iter()
            .map(|t| Tensor {
                dtype: t.dtype,
                dims: t.dims.clone(),
                data: Arc::new(Vec::new()),
            })
            .collect();
        let outcome = RunOutcome {
            model: self.desc.name.clone(),
            output_names: self.desc.outputs.iter().map(|o| o.name.clone()).collect(),
            mode: if self
                .rt
                .as_ref()
                .is_some_and(|rt| rt.is_sink(self.model).unwrap_or(false))
            {
                Mode::Sink
            } else {
                Mode::NonSink
            },
            soc_version: self.desc.soc_version.clone(),
            last: shaped,
            times_ps: self.device_ps.clone(),
            execute_call_ps: self.execute_ps.clone(),
            profiles: std::mem::take(&mut self.profiles),
            batch: self.batch,
            padding,
            written: Vec::new(),
        };
        let json = outcome.json();
        if let Some(dir) = &self.profile_dir {
            msprof::write_dir(dir, &outcome.profile_files())
                .map_err(|e| error(format!("{e:#}")))?;
        }
        self.profiles = outcome.profiles;
        Ok((outputs, json.to_string()))
    }
}

#[pymethods]
impl Session {
    /// Loads `path` on a device of the chip it was compiled for (or `soc_version`'s, which
    /// must be the same), computing values unless `timing_only`; `profile_dir` receives
    /// msprof-style files after every run.
    #[new]
    #[pyo3(signature = (path, soc_version=None, timing_only=false, profile_dir=None, trace=None, trace_level="kernel", set=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        soc_version: Option<String>,
        timing_only: bool,
        profile_dir: Option<PathBuf>,
        trace: Option<PathBuf>,
        trace_level: &str,
        set: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Session> {
        let level = Level::parse(trace_level).ok_or_else(|| {
            error(format!(
                "trace_level: expected task, kernel or instruction, got `{trace_level}`"
            ))
        })?;
        let bytes = std::fs::read(&path)
            .map_err(|e| error(format!("cannot read the model {}: {e}", path.display())))?;
        let file = OmFile::parse(&bytes).map_err(|e| error(format!("{}: {e}", path.display())))?;
        let desc = file
            .desc()
            .map_err(|e| error(format!("{}: {e}", path.display())))?;
        let settings = match &set {
            Some(d) => settings_of(d)?,
            None => Vec::new(),
        };
        let cfg = ChipChoice {
            soc_version: soc_version.clone(),
            settings,
            ..ChipChoice::default()
        }
        .config_or(&desc.soc_version)
        .map_err(|e| error(format!("{e:#}")))?;
        if !cfg.name.eq_ignore_ascii_case(&desc.soc_version) {
            return Err(error(format!(
                "{}: compiled for {}, not {}: its kernels are tiled for that chip's buffers",
                path.display(),
                desc.soc_version,
                cfg.name
            )));
        }
        let mode = if timing_only {
            ExecMode::TimingOnly
        } else {
            ExecMode::Full
        };
        if let Some(limit) = gearsim_host::host_memory::available() {
            let estimate = gearsim_host::host_memory::estimate(&desc, &cfg, mode);
            gearsim_host::host_memory::check(&estimate, mode, &limit, None)
                .map_err(|e| error(format!("{}: {e}", path.display())))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let sink = match &trace {
            None => None,
            Some(t) => {
                let mut w = TraceFileWriter::create(t)
                    .map_err(|e| error(format!("trace {}: {e}", t.display())))?;
                w.set_level(level);
                w.meta("command", "python InferSession");
                w.meta(
                    "exec_mode",
                    if timing_only { "timing-only" } else { "full" },
                );
                w.meta("soc_version", &cfg.name);
                Some(w)
            }
        };
        let cfg_copy = cfg.clone();
        let mut rt = Runtime::new(
            cfg,
            sink,
            RuntimeOptions {
                exec_mode: mode,
                profile: true,
                host_threads: gearsim_host::study::host_threads(),
                ..RuntimeOptions::default()
            },
        )
        .map_err(|e| runtime_error(&e))?;
        rt.set_interrupt(Some(stop.clone()));
        let model = interruptible(py, &stop, || rt.load_parsed(&file, desc.clone()))?
            .map_err(|e| error(format!("{}: {e}", path.display())))?;
        Ok(Session {
            rt: Some(rt),
            model,
            desc,
            stop,
            execute_ps: Vec::new(),
            device_ps: Vec::new(),
            profiles: Vec::new(),
            batch: 1,
            om: bytes.clone(),
            cfg: cfg_copy,
            pad_check: None,
            queued_batches: Vec::new(),
            profile_dir,
        })
    }

    /// The model's description as JSON: name, chip, inputs, outputs (name, dtype, format,
    /// dims with -1 for gear axes, largest dims), gears, sink and hybrid.
    fn describe(&self) -> PyResult<String> {
        let d = self.desc.dynamic.as_ref();
        Ok(json!({
            "name": self.desc.name,
            "soc_version": self.desc.soc_version,
            "inputs": describe_io(&self.desc.inputs),
            "data_inputs": self.data_input_names().len(),
            "outputs": describe_io(&self.desc.outputs),
            "gear_mode": d.map(|d| match d.mode { 1 => "batch", 2 => "image_size", _ => "dims" }),
            "gears": d.map(|d| d.gears.clone()),
            "shape_order": d.map(|d| d.shape_order.clone()),
            "sink": self.rt.as_ref().is_some_and(|rt| rt.is_sink(self.model).unwrap_or(false)),
            "hybrid": self.rt.as_ref().is_some_and(|rt| rt.is_hybrid(self.model).unwrap_or(false)),
        })
        .to_string())
    }

    /// One run (`dynamic_path`: a hybrid model's dynamic-shape path even at a gear; a sink
    /// model's item goes through its queue; `pad_to_gear`: a batch between gears padded up to
    /// the next one, after the padding check): the outputs and the report as JSON.
    #[pyo3(signature = (feeds, dynamic_path=false, pad_to_gear=false))]
    fn run<'py>(
        &mut self,
        py: Python<'py>,
        feeds: Vec<Feed<'py>>,
        dynamic_path: bool,
        pad_to_gear: bool,
    ) -> PyResult<(Vec<Output<'py>>, String)> {
        let mut inputs = tensors(feeds, &self.data_input_names())?;
        let batch = batch_of(&inputs);
        let padding = if pad_to_gear {
            self.padding(py, &mut inputs)?
        } else {
            None
        };
        let (m, stop) = (self.model, self.stop.clone());
        let rt = self.rt()?;
        let sink = rt.is_sink(m).map_err(|e| runtime_error(&e))?;
        let r = interruptible(py, &stop, || {
            if dynamic_path {
                rt.run_dynamic_path(m, &inputs)
            } else if sink {
                rt.run_sink(m, &inputs)
            } else {
                rt.run(m, &inputs)
            }
        })?
        .map_err(|e| runtime_error(&e))?;
        let mut r = r;
        if let Some((p, _)) = &padding {
            r.outputs = pad::trim(&r.outputs, p).map_err(error)?;
        }
        let (outs, json) = self.finish(r, batch, padding)?;
        Ok((outputs(py, outs), json))
    }

    /// Sink mode: hands one item to the model's data queue.
    fn enqueue(&mut self, py: Python<'_>, feeds: Vec<Feed<'_>>) -> PyResult<()> {
        let inputs = tensors(feeds, &self.data_input_names())?;
        self.queued_batches.push(batch_of(&inputs));
        let (m, stop) = (self.model, self.stop.clone());
        let rt = self.rt()?;
        interruptible(py, &stop, || rt.enqueue(m, &inputs))?.map_err(|e| runtime_error(&e))
    }

    /// Sink mode: runs the model on the oldest queued item.
    fn run_queued<'py>(&mut self, py: Python<'py>) -> PyResult<(Vec<Output<'py>>, String)> {
        let (m, stop) = (self.model, self.stop.clone());
        let rt = self.rt()?;
        let r = interruptible(py, &stop, || rt.run_queued(m))?.map_err(|e| runtime_error(&e))?;
        let batch = if self.queued_batches.is_empty() {
            1
        } else {
            self.queued_batches.remove(0)
        };
        let (outs, json) = self.finish(r, batch, None)?;
        Ok((outputs(py, outs), json))
    }

    /// Finishes the trace file (if any) and frees the device; later calls fail.
    fn close(&mut self) -> PyResult<()> {
        if let Some(rt) = self.rt.take()
            && let Some(w) = rt.into_sink()
        {
            w.finish().map_err(|e| error(format!("trace: {e}")))?;
        }
        Ok(())
    }

    /// NPU compute time over every run so far (ais_bench's summary) as JSON, or `null`.
    fn summary(&self) -> String {
        msprof::ComputeTime::of(&self.execute_ps, self.batch)
            .map_or(serde_json::Value::Null, |c| c.json())
            .to_string()
    }
}

/// A `.gtrace` file, validated and memory-mapped.
#[pyclass(module = "gearsim._native")]
struct Trace {
    file: TraceFile,
}

#[pymethods]
impl Trace {
    #[new]
    fn new(path: PathBuf) -> PyResult<Trace> {
        let file = TraceFile::open(&path).map_err(|e| error(format!("{}: {e}", path.display())))?;
        Ok(Trace { file })
    }

    /// Per-lane busy time, as JSON rows.
    fn lanes(&self) -> String {
        let s = analysis::summary(&self.file);
        let window = s.window_ps().max(1) as f64;
        s.lanes
            .iter()
            .map(|l| {
                json!({
                    "process": l.process,
                    "thread": l.thread,
                    "kind": analysis::kind_name(l.kind),
                    "spans": l.spans,
                    "busy_us": l.busy_ps as f64 / 1e6,
                    "busy_share": l.busy_ps as f64 / window,
                })
            })
            .collect::<serde_json::Value>()
            .to_string()
    }

    /// The phases of the model runs in the trace, as JSON rows.
    fn phases(&self) -> String {
        analysis::summary(&self.file)
            .phases
            .iter()
            .map(|p| {
                json!({
                    "phase": p.phase.name(),
                    "count": p.count,
                    "us": p.total_ps as f64 / 1e6,
                })
            })
            .collect::<serde_json::Value>()
            .to_string()
    }

    /// Every kernel task (op), as JSON rows in the order they ended.
    fn ops(&self) -> String {
        analysis::kernel_tasks(&self.file)
            .iter()
            .map(|k| {
                json!({
                    "name": k.name,
                    "kind": k.kind,
                    "stream": k.stream,
                    "start_us": k.start as f64 / 1e6,
                    "duration_us": k.end.saturating_sub(k.start) as f64 / 1e6,
                })
            })
            .collect::<serde_json::Value>()
            .to_string()
    }

    /// Writes the trace for a viewer: `format` `perfetto` (JSON) or `perfetto_proto`, at
    /// `level` `task` / `kernel` / `instruction`, inside `window` (start, end in us), for
    /// `cores` only. Returns the bytes written.
    #[pyo3(signature = (path, format="perfetto_proto", level="instruction", window=None, cores=None))]
    fn export(
        &self,
        path: PathBuf,
        format: &str,
        level: &str,
        window: Option<(f64, f64)>,
        cores: Option<Vec<u32>>,
    ) -> PyResult<u64> {
        let level = gearsim_traces::Level::parse(level).ok_or_else(|| {
            error(format!(
                "export: level must be task, kernel or instruction, got `{level}`"
            ))
        })?;
        let window = match window {
            None => None,
            Some((a, b)) if a >= 0.0 && b >= a => {
                Some(((a * 1e6).round() as u64, (b * 1e6).round() as u64))
            }
            Some((a, b)) => {
                return Err(error(format!(
                    "export: window ({a}, {b}) must be two non-negative times in us, start first"
                )));
            }
        };
        let filter = gearsim_traces::Filter {
            level,
            window,
            cores: cores.map(|c| c.into_iter().collect()),
        };
        match format {
            "perfetto" => gearsim_traces::export_perfetto_file_filtered(&self.file, filter, &path),
            "perfetto_proto" => {
                gearsim_traces::export_perfetto_proto_file(&self.file, filter, &path).map(|_| ())
            }
            other => {
                return Err(error(format!(
                    "export: format must be perfetto or perfetto_proto, got `{other}`"
                )));
            }
        }
        .map_err(|e| error(format!("{}: {e}", path.display())))?;
        Ok(std::fs::metadata(&path).map_or(0, |m| m.len()))
    }

    /// The whole summary: records, window, lanes, phases.
    fn summary(&self) -> String {
        let s = analysis::summary(&self.file);
        json!({
            "records": s.records,
            "spans": s.spans,
            "start_us": s.start.map(|t| t as f64 / 1e6),
            "end_us": s.end.map(|t| t as f64 / 1e6),
            "window_us": s.window_ps() as f64 / 1e6,
        })
        .to_string()
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("GearsimError", m.py().get_type::<GearsimError>())?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_class::<Session>()?;
    m.add_class::<Trace>()?;
    Ok(())
}
