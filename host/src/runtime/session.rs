//! The ACL-shaped runtime: load a `.om`, query its gears, set the gear the ACL way or let the
//! runtime derive it from the input shapes, execute in non-sink or GetNext sink mode, and read
//! outputs at the gear's real size.
//!
//! ```text
//!  non-sink  run(inputs) ─ check count/type/static dims ─ gear vector from the -1 axes ─ E13025?
//!            ─ H2D: small inputs packed into one staging span (merged copy), the rest one by
//!              one, the int32 dims blob last ─ ModelExecute ─ D2H of each output's real bytes
//!  sink      enqueue(inputs) ─ data queue (timed copies) ...  run_queued() ─ ModelExecute
//!            (GetNext → GetDynamicDims → MapIndex → LabelSwitch → branch) ─ D2H cur_dynamic_dims
//!            ─ gear → output sizes and shapes ─ D2H of each output
//!  ACL flow  set_dynamic_batch_size / set_dynamic_hw_size / set_input_dynamic_dims ─
//!            write_input ─ execute ─ cur_output_dims / read_output
//! ```
//!
//! Every copy is a synchronous `Memcpy` task on the runtime's stream through a pinned host
//! staging buffer, so PCIe time shows in the device time and the trace; the report counts
//! transfers and bytes. Every call also costs the host its own work (`host_work.rs`), so a run
//! reports device time, host time and end to end apart. The output tables are keyed by the
//! gear vector, as GE's are (spec §8.1, §8.5).

use std::collections::VecDeque;

use gearsim_compiler::options::DynamicMode;
use gearsim_firmware::{Device, DevicePtr, HostPtr, HostTensor, StreamId};
use gearsim_isa::om::{DynamicDesc, IoDesc, ModelDesc, OmFile, SectionKind};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::{Lane, LaneId, LaneKind, TraceSink};

use super::copy::{self, Link, Transfers};
use super::dynamic::DynamicModel;
use super::error::RuntimeError;
use super::host_work::Host;
use super::load::LoadedModel;
use super::profile::{Phase, RunProfile};
use gearsim_isa::gear::SHAPE_DATA;
use gearsim_isa::tensor::{DataType, Tensor};

/// `ge.exec.input_fusion_size`'s default: inputs up to 128 KiB join the merged H2D copy.
pub const DEFAULT_INPUT_FUSION_SIZE: i64 = 128 * 1024;
/// The largest merge threshold GE accepts (larger values are clamped).
pub const MAX_INPUT_FUSION_SIZE: i64 = 32 * 1024 * 1024;
/// `ACL_MAX_BATCH_NUM` / `ACL_MAX_HW_NUM`: entries an `aclmdlBatch` / `aclmdlHW` holds.
pub const ACL_MAX_GEARS: usize = 128;
/// `ACL_MAX_DIM_CNT`: dims an `aclmdlIODims` holds.
pub const ACL_MAX_DIM_CNT: usize = 128;

/// Runtime settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// `ge.exec.input_fusion_size`: inputs whose buffers are at most this many bytes are copied
    /// in one merged transfer (0 or negative: no merging; clamped to 32 MiB).
    pub input_fusion_size: i64,
    /// Simulate values and time, or time only.
    pub exec_mode: ExecMode,
    /// Keep a profile of every AI core kernel a run launches ([`RunReport::kernels`]).
    pub profile: bool,
    /// Host threads that compute a full run's values (1 by default, for callers that run
    /// several simulations side by side); outputs, traces and times are the same for any count.
    pub host_threads: usize,
}

impl Default for RuntimeOptions {
    fn default() -> RuntimeOptions {
        RuntimeOptions {
            input_fusion_size: DEFAULT_INPUT_FUSION_SIZE,
            exec_mode: ExecMode::Full,
            profile: false,
            host_threads: 1,
        }
    }
}

/// A loaded model's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

/// Which executable ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPath {
    /// The compiled gear model (one of its branches).
    Gear,
    /// The hybrid dynamic-shape path (shapes that match no gear).
    Dynamic,
}

impl RunPath {
    /// `gear` or `dynamic`.
    pub fn name(self) -> &'static str {
        match self {
            RunPath::Gear => "gear",
            RunPath::Dynamic => "dynamic",
        }
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Which executable ran.
    pub path: RunPath,
    /// Why that one.
    pub reason: String,
    /// The gear whose branch ran (None: static model, dynamic path, or no gear matched).
    pub gear: Option<usize>,
    /// The gear vector: derived from the inputs (non-sink) or read back from the device (sink).
    pub cur_dynamic_dims: Vec<i64>,
    /// The outputs at their real shapes.
    pub outputs: Vec<Tensor>,
    /// Device time: how long the runtime's stream was executing the run's tasks (its copies
    /// and the model's execution; waits for the host excluded). A sink item's queue copies
    /// run beside the stream and count only as far as a GetNext inside the execution waits
    /// for them.
    pub device_time_ps: u64,
    /// Host time: the calling thread's own work in the call (task submissions, wake-ups from
    /// synchronisation, staging copies, the dynamic path's shape inference and tiling), at the
    /// chip preset's `[host]` costs.
    pub host_ps: u64,
    /// End to end: from the call to its return, what a timer around it on the host measures
    /// (host work, device time and the waits between them; `run_sink` from its enqueue,
    /// `run_queued` from its own call).
    pub end_to_end_ps: u64,
    /// Simulated time of the model's execution alone on the device, from the moment it sees
    /// `aclmdlExecute`'s task to the end of its last (copies and the dims read-back
    /// excluded): what msprof's task times add up to. On the dynamic-shape path, the whole run.
    pub execute_ps: u64,
    /// The `aclmdlExecute` call as a host timer around it measures it: the submission, the
    /// execution and the wake-up when it completes. This is ais_bench's NPU compute time: its
    /// `ModelInferenceProcessor::Execute` takes `gettimeofday` before and after the
    /// synchronous `aclmdlExecute` (copies excluded). On the dynamic-shape path, the whole run.
    pub execute_call_ps: u64,
    /// Every AI core kernel the run launched, oldest first, when [`RuntimeOptions::profile`]
    /// is on (empty otherwise).
    pub kernels: Vec<gearsim_firmware::KernelProfile>,
    /// The run task by task — msprof's op summary and task times, and the run's phases — when
    /// [`RuntimeOptions::profile`] is on and the run executed the model (not on the
    /// dynamic-shape path, whose kernels are in [`RunReport::kernels`]).
    pub profile: Option<RunProfile>,
    /// Host-to-device bytes moved (staging spans count whole).
    pub h2d_bytes: u64,
    /// Host-to-device transfers.
    pub h2d_transfers: u64,
    /// Device-to-host bytes moved.
    pub d2h_bytes: u64,
    /// Device-to-host transfers.
    pub d2h_transfers: u64,
    /// Things the user should know (a sink run whose dims matched no gear).
    pub warnings: Vec<String>,
}

/// Where a run's clocks stood at a moment (picoseconds): simulated time, the host's work so
/// far, the runtime stream's busy time so far.
#[derive(Debug, Clone, Copy)]
struct Clocks {
    at: u64,
    host: u64,
    device: u64,
}

/// How long one `aclmdlExecute` took (picoseconds): on the device, and for the calling thread.
#[derive(Debug, Clone, Copy)]
struct ExecuteTimes {
    /// From the device seeing the execution's task to the end of its last.
    device_ps: u64,
    /// From the call to its return: submission, execution, wake-up.
    call_ps: u64,
}

/// The merged-copy span of a non-sink model (spec §8.3).
#[derive(Debug, Clone)]
struct Merge {
    /// Member inputs, by device address.
    members: Vec<usize>,
    /// Device address of the first member.
    first: u64,
    /// Bytes from the first member's start to the last one's end (gaps included).
    bytes: u64,
    /// The pinned host buffer of the span.
    host: HostPtr,
}

/// The gear last recorded by a `set_*` call or a non-sink run (GE's `SetDynamicSize`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct CurShape {
    /// 1 batch, 2 height and width, 3 dims.
    kind: u32,
    dims: Vec<i64>,
}

/// An item queued for a sink model: what its copies moved.
#[derive(Debug, Clone, Copy)]
struct Queued {
    transfers: Transfers,
}

struct Model {
    loaded: LoadedModel,
    merge: Option<Merge>,
    /// Pinned staging buffer per model input (non-sink).
    input_host: Vec<HostPtr>,
    /// Pinned buffer per output.
    output_host: Vec<HostPtr>,
    /// Sink mode: where `cur_dynamic_dims` is read back to.
    dims_host: Option<HostPtr>,
    current: Option<CurShape>,
    queued: VecDeque<Queued>,
    /// Hybrid models: the dynamic-shape path.
    dynamic: Option<DynamicModel>,
}

/// A simulated device with an ACL-shaped API on top.
pub struct Runtime<S: TraceSink> {
    pub(crate) dev: Device<S>,
    pub(crate) stream: StreamId,
    pub(crate) host: Host,
    models: Vec<Model>,
    fusion: u64,
    host_lane: Option<LaneId>,
    profiling: bool,
}

fn bad(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::InvalidParam(msg.into())
}

/// The element type of an I/O descriptor.
pub fn io_type(io: &IoDesc) -> Result<DataType, RuntimeError> {
    DataType::from_onnx(io.dtype as i32).ok_or_else(|| {
        RuntimeError::Failure(format!(
            "`{}` has ONNX element type {}, which gearsim does not know",
            io.name, io.dtype
        ))
    })
}

fn join(v: &[i64]) -> String {
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn gear_list(d: &DynamicDesc) -> String {
    d.gears
        .iter()
        .map(|g| format!("[{}]", join(g)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The gear whose vector is exactly `dims`.
pub fn find_gear(d: &DynamicDesc, dims: &[i64]) -> Option<usize> {
    d.gears.iter().position(|g| g == dims)
}

impl<S: TraceSink> Runtime<S> {
    /// A runtime over a fresh device of chip `cfg`, tracing into `sink`.
    pub fn new(cfg: ChipConfig, sink: S, opts: RuntimeOptions) -> Result<Runtime<S>, RuntimeError> {
        let mut dev = Device::new(cfg, sink);
        dev.set_exec_mode(opts.exec_mode);
        dev.set_profiling(opts.profile);
        dev.set_host_threads(opts.host_threads);
        let stream = dev.create_stream()?;
        let fusion = opts.input_fusion_size.clamp(0, MAX_INPUT_FUSION_SIZE) as u64;
        let host_lane = if dev.chip_mut().sink_mut().enabled() {
            Some(dev.chip_mut().sink_mut().lane(Lane {
                process: "host".into(),
                thread: "runtime".into(),
                kind: LaneKind::Host,
            }))
        } else {
            None
        };
        let host = Host::new(&mut dev);
        Ok(Runtime {
            dev,
            stream,
            host,
            models: Vec::new(),
            fusion,
            host_lane,
            profiling: opts.profile,
        })
    }

    /// A flag another thread may set to stop the simulation: the running call then fails
    /// with the device's `Interrupted` error and the runtime's device stays stopped.
    pub fn set_interrupt(&mut self, flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>) {
        self.dev.set_interrupt(flag);
    }

    /// The device.
    pub fn device(&self) -> &Device<S> {
        &self.dev
    }

    /// The device, mutably (for tests that inspect or disturb it).
    pub fn device_mut(&mut self) -> &mut Device<S> {
        &mut self.dev
    }

    /// Ends the runtime and returns the trace sink.
    pub fn into_sink(self) -> S {
        self.dev.into_sink()
    }

    /// The device, the runtime's stream and the host, for a copy.
    fn link(&mut self) -> Link<'_, S> {
        Link {
            dev: &mut self.dev,
            host: &mut self.host,
            stream: self.stream,
        }
    }

    /// Where a run's three clocks stand now: simulated time, host work, device time.
    fn clocks(&self) -> Result<Clocks, RuntimeError> {
        Ok(Clocks {
            at: self.dev.now().0,
            host: self.host.busy(),
            device: self.dev.stream_busy(self.stream)?.0,
        })
    }

    /// Submits model `m`'s execution (`aclmdlExecute`) and waits for it: the simulated time of
    /// the execution alone, from the moment the device sees the task to the end of its last,
    /// and of the whole call (submission and wake-up included).
    fn execute_model(&mut self, m: ModelId) -> Result<ExecuteTimes, RuntimeError> {
        let model = &self.models[m.0 as usize].loaded;
        let (task, name) = (model.execute_task(), model.desc.name.clone());
        let call = self.dev.now().0;
        self.host.submit(&mut self.dev, self.stream, task, &name)?;
        let start = self.dev.now().0;
        self.dev.synchronize(self.stream)?;
        let device_ps = self.dev.now().0 - start;
        self.host.wake(&mut self.dev)?;
        Ok(ExecuteTimes {
            device_ps,
            call_ps: self.dev.now().0 - call,
        })
    }

    /// The kernel profiles and the task-by-task profile of model `m`'s run that just ended
    /// (`host`: the phases the runtime timed itself); empty when profiling is off.
    fn take_profile(
        &mut self,
        m: ModelId,
        host: &[Phase],
    ) -> (Vec<gearsim_firmware::KernelProfile>, Option<RunProfile>) {
        let kernels = self.dev.take_profile();
        let log = self.dev.take_task_log();
        if !self.profiling {
            return (kernels, None);
        }
        let profile = super::profile::build(
            &self.models[m.0 as usize].loaded,
            &log,
            &kernels,
            self.dev.chip().config(),
            host,
        );
        (kernels, Some(profile))
    }

    /// Records a host API call on the host lane.
    pub(crate) fn host_span(&mut self, name: &str, start: u64, detail: &str) {
        if let Some(lane) = self.host_lane {
            super::host_work::span(&mut self.dev, lane, name, start, detail);
        }
    }

    fn model(&self, m: ModelId) -> Result<&Model, RuntimeError> {
        self.models
            .get(m.0 as usize)
            .ok_or_else(|| bad(format!("model id {} was not loaded", m.0)))
    }

    // ---- load and describe ---------------------------------------------------------------------

    /// Loads a `.om` from memory (`aclmdlLoadFromMem`).
    pub fn load(&mut self, om: &[u8]) -> Result<ModelId, RuntimeError> {
        let file = OmFile::parse(om)?;
        let desc = file.desc()?;
        self.load_parsed(&file, desc)
    }

    /// Loads a `.om` the caller has already parsed and validated, with its description
    /// (`desc` is `file.desc()`): what [`Runtime::load`] does after parsing, for a caller that
    /// looked at the description first (`gearsim run` picks the chip and mode from it).
    pub fn load_parsed(
        &mut self,
        file: &OmFile<'_>,
        desc: ModelDesc,
    ) -> Result<ModelId, RuntimeError> {
        let start = self.dev.now().0;
        let loaded = LoadedModel::load_described(&mut self.dev, file, desc)?;
        let dynamic = match file.section(SectionKind::Graph) {
            Some(graph) => Some(DynamicModel::new(graph, &loaded.desc)?),
            None => None,
        };
        let input_host = loaded
            .desc
            .inputs
            .iter()
            .take(loaded.inputs.len())
            .map(|i| self.dev.host_alloc(i.bytes.max(1)))
            .collect::<Result<Vec<_>, _>>()?;
        let output_host = loaded
            .desc
            .outputs
            .iter()
            .map(|o| self.dev.host_alloc(o.bytes.max(1)))
            .collect::<Result<Vec<_>, _>>()?;
        let dims_host = match loaded.dims_out {
            Some(_) => Some(self.dev.host_alloc(self.dev.shape_tensor_bytes())?),
            None => None,
        };
        let merge = self.merge_plan(&loaded)?;
        let name = loaded.desc.name.clone();
        self.models.push(Model {
            loaded,
            merge,
            input_host,
            output_host,
            dims_host,
            current: None,
            queued: VecDeque::new(),
            dynamic,
        });
        self.host_span("aclmdlLoadFromMem", start, &name);
        Ok(ModelId(self.models.len() as u32 - 1))
    }

    /// The merged-copy span: data inputs whose buffers are at most the fusion size, by device
    /// address; at least two, else no merging. The gear input is never a member (GE does not
    /// zero-copy it either).
    fn merge_plan(&mut self, m: &LoadedModel) -> Result<Option<Merge>, RuntimeError> {
        if self.fusion == 0 || m.inputs.is_empty() {
            return Ok(None);
        }
        let data = data_inputs(&m.desc);
        let mut members: Vec<usize> = (0..data)
            .filter(|&i| m.desc.inputs[i].bytes <= self.fusion)
            .collect();
        if members.len() < 2 {
            return Ok(None);
        }
        members.sort_by_key(|&i| m.inputs[i].0);
        let first = m.inputs[members[0]].0;
        let last = *members.last().unwrap_or(&members[0]);
        let bytes = m.inputs[last].0 + m.desc.inputs[last].bytes - first;
        let host = self.dev.host_alloc(bytes)?;
        Ok(Some(Merge {
            members,
            first,
            bytes,
            host,
        }))
    }

    /// The model's description (inputs, outputs, gears, memory).
    pub fn desc(&self, m: ModelId) -> Result<&ModelDesc, RuntimeError> {
        Ok(&self.model(m)?.loaded.desc)
    }

    /// The loaded model (device buffers), for tools and tests.
    pub fn loaded(&self, m: ModelId) -> Result<&LoadedModel, RuntimeError> {
        Ok(&self.model(m)?.loaded)
    }

    /// Whether the model runs in GetNext sink mode.
    pub fn is_sink(&self, m: ModelId) -> Result<bool, RuntimeError> {
        Ok(self.model(m)?.loaded.queue.is_some())
    }

    /// Whether the model has a dynamic-shape fallback (compiled with `--hybrid`).
    pub fn is_hybrid(&self, m: ModelId) -> Result<bool, RuntimeError> {
        Ok(self.model(m)?.dynamic.is_some())
    }

    /// What a hybrid model's dynamic-shape path did so far (None for other models).
    pub fn dynamic_stats(&self, m: ModelId) -> Result<Option<super::DynamicStats>, RuntimeError> {
        Ok(self.model(m)?.dynamic.as_ref().map(DynamicModel::stats))
    }

    /// `aclmdlGetInputIndexByName`: the input's index; `ascend_mbatch_shape_data` is the gear
    /// input (the last one).
    pub fn input_index_by_name(&self, m: ModelId, name: &str) -> Result<usize, RuntimeError> {
        let desc = self.desc(m)?;
        desc.inputs
            .iter()
            .position(|i| i.name == name)
            .ok_or_else(|| {
                bad(format!(
                    "model `{}` has no input named `{name}` (inputs: {})",
                    desc.name,
                    desc.inputs
                        .iter()
                        .map(|i| i.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    fn gears_of(&self, m: ModelId) -> Result<Option<&DynamicDesc>, RuntimeError> {
        Ok(self.desc(m)?.dynamic.as_ref())
    }

    /// `aclmdlGetDynamicBatch`: the batch gears (empty unless the model has one-value gears).
    pub fn dynamic_batch(&self, m: ModelId) -> Result<Vec<u64>, RuntimeError> {
        let Some(d) = self.gears_of(m)?.filter(|d| d.mode == 1) else {
            return Ok(Vec::new());
        };
        if d.gears.len() > ACL_MAX_GEARS {
            return Err(RuntimeError::StorageOverLimit(format!(
                "{} batch gears, an aclmdlBatch holds {ACL_MAX_GEARS}",
                d.gears.len()
            )));
        }
        Ok(d.gears.iter().map(|g| g[0] as u64).collect())
    }

    /// `aclmdlGetDynamicHW`: the image-size gears (empty unless the model has two-value gears).
    pub fn dynamic_hw(&self, m: ModelId) -> Result<Vec<(u64, u64)>, RuntimeError> {
        let Some(d) = self.gears_of(m)?.filter(|d| d.mode == 2) else {
            return Ok(Vec::new());
        };
        if d.gears.len() > ACL_MAX_GEARS {
            return Err(RuntimeError::StorageOverLimit(format!(
                "{} image-size gears, an aclmdlHW holds {ACL_MAX_GEARS}",
                d.gears.len()
            )));
        }
        Ok(d.gears.iter().map(|g| (g[0] as u64, g[1] as u64)).collect())
    }

    /// `aclmdlGetInputDynamicGearCount` (`index` must be -1, as in ACL).
    pub fn gear_count(&self, m: ModelId, index: i64) -> Result<usize, RuntimeError> {
        if index != -1 {
            return Err(bad(format!("gear count: index must be -1, got {index}")));
        }
        let n = self.gears_of(m)?.map_or(0, |d| d.gears.len());
        if n > ACL_MAX_GEARS {
            return Err(RuntimeError::StorageOverLimit(format!(
                "{n} gears, ACL holds {ACL_MAX_GEARS}"
            )));
        }
        Ok(n)
    }

    /// `aclmdlGetInputDynamicDims` (`index` -1): per gear, every dim of the inputs in
    /// `shape_order`, each -1 replaced by that gear's value.
    pub fn input_dynamic_dims(
        &self,
        m: ModelId,
        index: i64,
    ) -> Result<Vec<Vec<i64>>, RuntimeError> {
        let count = self.gear_count(m, index)?;
        let desc = self.desc(m)?;
        let Some(d) = desc.dynamic.as_ref() else {
            return Ok(Vec::new());
        };
        let raw = raw_dims(desc, d)?;
        if raw.len() > ACL_MAX_DIM_CNT {
            return Err(RuntimeError::Failure(format!(
                "the inputs have {} dims, an aclmdlIODims holds {ACL_MAX_DIM_CNT}",
                raw.len()
            )));
        }
        Ok((0..count)
            .map(|g| {
                let mut values = d.gears[g].iter();
                raw.iter()
                    .map(|&x| {
                        if x < 0 {
                            *values.next().unwrap_or(&x)
                        } else {
                            x
                        }
                    })
                    .collect()
            })
            .collect())
    }

    // ---- the ACL flow: set the gear, copy inputs, execute, read outputs -------------------------

    fn gear_input(
        &self,
        m: ModelId,
        index: usize,
        what: &str,
    ) -> Result<(DevicePtr, u64), RuntimeError> {
        let model = self.model(m)?;
        let desc = &model.loaded.desc;
        if model.loaded.queue.is_some() {
            return Err(bad(format!(
                "{what}: model `{}` runs in GetNext sink mode; the device computes its dims",
                desc.name
            )));
        }
        if desc.dynamic.is_none() {
            return Err(bad(format!("{what}: model `{}` has no gears", desc.name)));
        }
        let Some(io) = desc.inputs.get(index) else {
            return Err(bad(format!(
                "{what}: input index {index} out of range (the model has {} inputs)",
                desc.inputs.len()
            )));
        };
        if io.name != SHAPE_DATA {
            return Err(RuntimeError::DynamicInputAddr(format!(
                "{what}: input {index} is `{}`, not the gear input `{SHAPE_DATA}` (index {})",
                io.name,
                desc.inputs.len() - 1
            )));
        }
        Ok((model.loaded.inputs[index], io.bytes))
    }

    /// Writes gear values to the gear input as GE does: 4-byte words, or 8-byte words when the
    /// buffer holds 8 bytes per value.
    fn write_gear_values(
        &mut self,
        m: ModelId,
        ptr: DevicePtr,
        bytes: u64,
        values: &[i64],
    ) -> Result<(), RuntimeError> {
        let wide = bytes >= 8 * values.len() as u64;
        let data: Vec<u8> = values
            .iter()
            .flat_map(|&v| {
                if wide {
                    (v as u64).to_le_bytes().to_vec()
                } else {
                    (v as u32).to_le_bytes().to_vec()
                }
            })
            .collect();
        let pinned = self.model(m)?.input_host[self.model(m)?.loaded.inputs.len() - 1];
        self.host.api_call(&mut self.dev, "check gear")?;
        let mut t = Transfers::default();
        copy::h2d(
            self.link(),
            "memcpy_h2d gear dims",
            pinned,
            ptr.0,
            &data,
            &mut t,
        )?;
        Ok(())
    }

    /// `aclmdlSetDynamicBatchSize`: selects the batch gear `batch` through input `index`.
    pub fn set_dynamic_batch_size(
        &mut self,
        m: ModelId,
        index: usize,
        batch: u64,
    ) -> Result<(), RuntimeError> {
        let start = self.dev.now().0;
        if batch == 0 {
            return Err(bad("set_dynamic_batch_size: batch size 0"));
        }
        let (ptr, bytes) = self.gear_input(m, index, "set_dynamic_batch_size")?;
        if bytes < 4 {
            return Err(RuntimeError::DynamicInputLength(format!(
                "the gear input has {bytes} bytes, a batch size needs 4"
            )));
        }
        let d = self.gears_of(m)?.cloned().ok_or_else(|| bad("no gears"))?;
        if d.gears.iter().any(|g| g.len() != 1) || find_gear(&d, &[batch as i64]).is_none() {
            return Err(RuntimeError::DynamicBatchSize(format!(
                "batch size {batch} is not one of the model's batch gears ({})",
                gear_list(&d)
            )));
        }
        self.models[m.0 as usize].current = Some(CurShape {
            kind: 1,
            dims: vec![batch as i64],
        });
        self.write_gear_values(m, ptr, bytes, &[batch as i64])?;
        self.host_span("aclmdlSetDynamicBatchSize", start, &batch.to_string());
        Ok(())
    }

    /// `aclmdlSetDynamicHWSize`: selects the image-size gear `h`×`w` through input `index`.
    pub fn set_dynamic_hw_size(
        &mut self,
        m: ModelId,
        index: usize,
        h: u64,
        w: u64,
    ) -> Result<(), RuntimeError> {
        let start = self.dev.now().0;
        if h == 0 || w == 0 {
            return Err(bad(format!("set_dynamic_hw_size: height {h}, width {w}")));
        }
        let (ptr, bytes) = self.gear_input(m, index, "set_dynamic_hw_size")?;
        if bytes < 8 {
            return Err(RuntimeError::DynamicInputLength(format!(
                "the gear input has {bytes} bytes, an image size needs 8"
            )));
        }
        let d = self.gears_of(m)?.cloned().ok_or_else(|| bad("no gears"))?;
        let v = [h as i64, w as i64];
        if d.gears.iter().any(|g| g.len() != 2) || find_gear(&d, &v).is_none() {
            return Err(RuntimeError::DynamicBatchSize(format!(
                "image size {h}x{w} is not one of the model's image-size gears ({})",
                gear_list(&d)
            )));
        }
        self.models[m.0 as usize].current = Some(CurShape {
            kind: 2,
            dims: v.to_vec(),
        });
        self.write_gear_values(m, ptr, bytes / 2 * 2, &v)?;
        self.host_span("aclmdlSetDynamicHWSize", start, &format!("{h}x{w}"));
        Ok(())
    }

    /// `aclmdlSetInputDynamicDims`: `dims` holds every dim of every input in `shape_order`
    /// (static ones included); the -1 positions select the gear.
    pub fn set_input_dynamic_dims(
        &mut self,
        m: ModelId,
        index: usize,
        dims: &[i64],
    ) -> Result<(), RuntimeError> {
        let start = self.dev.now().0;
        if dims.is_empty() {
            return Err(bad("set_input_dynamic_dims: no dims"));
        }
        let (ptr, bytes) = self.gear_input(m, index, "set_input_dynamic_dims")?;
        let desc = self.desc(m)?.clone();
        let d = desc.dynamic.as_ref().ok_or_else(|| bad("no gears"))?;
        let raw = raw_dims(&desc, d)?;
        if dims.len() != raw.len() {
            return Err(RuntimeError::DynamicInputLength(format!(
                "Dynamic input size [{}] is not equal with all data dims size [{}]",
                dims.len(),
                raw.len()
            )));
        }
        let mut values = Vec::new();
        for (k, (&want, &got)) in raw.iter().zip(dims).enumerate() {
            if want < 0 {
                values.push(got);
            } else if want != got {
                return Err(RuntimeError::DynamicInputLength(format!(
                    "Static dims should be same: dim {k} is {want} in the model, got {got}"
                )));
            }
        }
        if find_gear(d, &values).is_none() {
            return Err(RuntimeError::DynamicBatchSize(format!(
                "dims [{}] are not one of the model's gears ({})",
                join(&values),
                gear_list(d)
            )));
        }
        self.models[m.0 as usize].current = Some(CurShape {
            kind: 3,
            dims: values.clone(),
        });
        if bytes < 4 * values.len() as u64 {
            return Err(RuntimeError::DynamicInputLength(format!(
                "the gear input has {bytes} bytes, {} dims need {}",
                values.len(),
                4 * values.len()
            )));
        }
        self.write_gear_values(m, ptr, bytes, &values)?;
        self.host_span("aclmdlSetInputDynamicDims", start, &join(&values));
        Ok(())
    }

    /// Copies `data` into input `index`'s device buffer (`aclrtMemcpy` host to device).
    pub fn write_input(
        &mut self,
        m: ModelId,
        index: usize,
        data: &[u8],
    ) -> Result<(), RuntimeError> {
        let start = self.dev.now().0;
        let model = self.model(m)?;
        let (Some(&ptr), Some(io)) = (
            model.loaded.inputs.get(index),
            model.loaded.desc.inputs.get(index),
        ) else {
            return Err(bad(format!(
                "write_input: input index {index} out of range (the model has {} device inputs)",
                model.loaded.inputs.len()
            )));
        };
        if data.len() as u64 > io.bytes {
            return Err(bad(format!(
                "write_input: {} bytes for input `{}`, whose buffer has {}",
                data.len(),
                io.name,
                io.bytes
            )));
        }
        let pinned = model.input_host[index];
        let mut t = Transfers::default();
        copy::h2d(
            self.link(),
            &format!("memcpy_h2d input {index}"),
            pinned,
            ptr.0,
            data,
            &mut t,
        )?;
        self.host_span("aclrtMemcpy", start, "host to device");
        Ok(())
    }

    /// `aclmdlExecute`: runs the model on what its input buffers hold (no gear checks: the
    /// device uses whatever is in the gear input, as on the hardware).
    pub fn execute(&mut self, m: ModelId) -> Result<(), RuntimeError> {
        let start = self.dev.now().0;
        self.model(m)?;
        self.execute_model(m)?;
        self.host_span("aclmdlExecute", start, "");
        Ok(())
    }

    /// `aclmdlGetCurOutputDims`: output `index`'s dims for the gear last set (static dims when
    /// none was).
    pub fn cur_output_dims(&self, m: ModelId, index: usize) -> Result<Vec<i64>, RuntimeError> {
        let model = self.model(m)?;
        let desc = &model.loaded.desc;
        let io = desc.outputs.get(index).ok_or_else(|| {
            bad(format!(
                "output index {index} out of range (the model has {} outputs)",
                desc.outputs.len()
            ))
        })?;
        let (Some(d), Some(cur)) = (desc.dynamic.as_ref(), model.current.as_ref()) else {
            return Ok(io.dims.clone());
        };
        // As GE's GetCurShape: a shape set by set_input_dynamic_dims (type 3) is looked up
        // among a dims model's gears, one set by set_dynamic_batch_size / set_dynamic_hw_size
        // (type 1 / 2) among a batch / image-size model's; the other pairings name no gear.
        let setter = |kind: u32| match kind {
            1 => "set_dynamic_batch_size",
            2 => "set_dynamic_hw_size",
            _ => "set_input_dynamic_dims",
        };
        if cur.kind != d.mode {
            return Err(RuntimeError::Failure(format!(
                "the current shape [{}] was set by {}, but model `{}` has {} gears (set them \
                 with {})",
                join(&cur.dims),
                setter(cur.kind),
                desc.name,
                match d.mode {
                    1 => "batch",
                    2 => "image-size",
                    _ => "dims",
                },
                setter(d.mode)
            )));
        }
        let gear = find_gear(d, &cur.dims).ok_or_else(|| {
            RuntimeError::Failure(format!(
                "the current shape [{}] (type {}) is no gear of the model",
                join(&cur.dims),
                cur.kind
            ))
        })?;
        Ok(d.output_dims[gear][index].clone())
    }

    /// Reads output `index` at the current gear's shape (`aclrtMemcpy` device to host).
    pub fn read_output(&mut self, m: ModelId, index: usize) -> Result<Tensor, RuntimeError> {
        let start = self.dev.now().0;
        let dims = self.cur_output_dims(m, index)?;
        let model = self.model(m)?;
        let io = &model.loaded.desc.outputs[index];
        let dtype = io_type(io)?;
        let (ptr, pinned) = (model.loaded.outputs[index], model.output_host[index]);
        let mut t = Transfers::default();
        let data = copy::d2h(
            self.link(),
            &format!("memcpy_d2h output {index}"),
            ptr.0,
            pinned,
            tensor_bytes(dtype, &dims),
            &mut t,
        )?;
        self.host_span("aclrtMemcpy", start, "device to host");
        Tensor::new(dtype, dims, data).map_err(RuntimeError::Failure)
    }

    // ---- non-sink and sink runs -----------------------------------------------------------------

    /// Runs a non-sink model on `inputs` (the data inputs in model order): derives the gear from
    /// their shapes, copies them (merged where small), executes and returns the outputs at the
    /// gear's real shapes. A hybrid model takes its dynamic-shape path for shapes that match no
    /// gear; any other model rejects them with E13025.
    pub fn run(&mut self, m: ModelId, inputs: &[Tensor]) -> Result<RunReport, RuntimeError> {
        let start = self.clocks()?;
        let model = self.model(m)?;
        if model.loaded.queue.is_some() {
            return Err(bad(format!(
                "model `{}` was compiled for GetNext sink mode: enqueue its inputs and use run_queued",
                model.loaded.desc.name
            )));
        }
        let desc = model.loaded.desc.clone();
        check_inputs(&desc, inputs)?;
        let (gear, dims) = match desc.dynamic.as_ref() {
            None => (None, Vec::new()),
            Some(d) => {
                let dims = gear_vector(&desc, d, inputs)?;
                // Every input must have its shape in the gear, the ones whose axes the gear
                // vector does not carry too (an input `--input_shape` leaves out joins a batch
                // or image-size gear with the same value, spec 2.3).
                let gear = find_gear(d, &dims);
                let off_gear = gear.and_then(|g| off_gear_input(&desc, d, g, inputs));
                match (gear, off_gear) {
                    (Some(g), None) => (Some(g), dims),
                    (_, why) if model.dynamic.is_some() => {
                        let reason = match why {
                            Some(why) => format!("{why}: dynamic-shape path"),
                            None => format!(
                                "dims [{}] match no gear ({}): dynamic-shape path",
                                join(&dims),
                                gear_list(d)
                            ),
                        };
                        return self.run_dynamic(m, inputs, dims, reason, start);
                    }
                    (Some(_), Some(why)) => {
                        return Err(RuntimeError::NotAGear(why));
                    }
                    (None, _) => {
                        let option = DynamicMode::from_mbatch_dynamic_type(d.mode)
                            .map_or("the gear options", DynamicMode::option_name);
                        return Err(RuntimeError::NotAGear(format!(
                            "The input tensor dimension [{}] is not in the dynamic dimension list \
                             configured by {option} (gears: {}); a model compiled with --hybrid \
                             runs such shapes on a dynamic-shape path",
                            join(&dims),
                            gear_list(d)
                        )));
                    }
                }
            }
        };
        let mut t = Transfers::default();
        let h2d_start = self.dev.now().0;
        self.copy_inputs(m, inputs, &dims, &mut t)?;
        let h2d = Phase {
            name: "h2d",
            start_ps: h2d_start,
            end_ps: self.dev.now().0,
        };
        self.models[m.0 as usize].current = desc.dynamic.as_ref().map(|d| CurShape {
            kind: d.mode,
            dims: dims.clone(),
        });
        let execute = self.execute_model(m)?;
        let d2h_start = self.dev.now().0;
        let mut outputs = self.read_outputs(m, gear, &mut t)?;
        let d2h = Phase {
            name: "d2h",
            start_ps: d2h_start,
            end_ps: self.dev.now().0,
        };
        trim_direct_outputs(&desc, inputs, &mut outputs);
        let (kernels, profile) = self.take_profile(m, &[h2d, d2h]);
        let reason = match gear {
            Some(g) => format!("dims [{}] are gear {g}", join(&dims)),
            None => "static model".to_string(),
        };
        let end = self.clocks()?;
        let report = RunReport {
            path: RunPath::Gear,
            reason,
            gear,
            cur_dynamic_dims: dims,
            outputs,
            device_time_ps: end.device - start.device,
            host_ps: end.host - start.host,
            end_to_end_ps: end.at - start.at,
            execute_ps: execute.device_ps,
            execute_call_ps: execute.call_ps,
            kernels,
            profile,
            h2d_bytes: t.h2d_bytes,
            h2d_transfers: t.h2d,
            d2h_bytes: t.d2h_bytes,
            d2h_transfers: t.d2h,
            warnings: Vec::new(),
        };
        self.host_span("run (non-sink)", start.at, &report.reason);
        Ok(report)
    }

    /// The non-sink copies: the merged span, the other inputs one by one, the dims blob last.
    fn copy_inputs(
        &mut self,
        m: ModelId,
        inputs: &[Tensor],
        dims: &[i64],
        t: &mut Transfers,
    ) -> Result<(), RuntimeError> {
        let model = &self.models[m.0 as usize];
        let merge = model.merge.clone();
        let ptrs = model.loaded.inputs.clone();
        let hosts = model.input_host.clone();
        let mut merged = vec![false; inputs.len()];
        if let Some(mg) = &merge {
            let mut span = vec![0u8; mg.bytes as usize];
            for &i in &mg.members {
                let at = (ptrs[i].0 - mg.first) as usize;
                span[at..at + inputs[i].data.len()].copy_from_slice(&inputs[i].data);
                merged[i] = true;
            }
            copy::h2d(
                self.link(),
                &format!("memcpy_h2d merged inputs {:?}", mg.members),
                mg.host,
                mg.first,
                &span,
                t,
            )?;
        }
        for (i, x) in inputs.iter().enumerate() {
            if !merged[i] {
                copy::h2d(
                    self.link(),
                    &format!("memcpy_h2d input {i}"),
                    hosts[i],
                    ptrs[i].0,
                    &x.data,
                    t,
                )?;
            }
        }
        if !dims.is_empty() {
            let blob: Vec<u8> = dims
                .iter()
                .flat_map(|&v| (v as i32).to_le_bytes())
                .collect();
            let last = ptrs.len() - 1;
            copy::h2d(
                self.link(),
                "memcpy_h2d gear dims",
                hosts[last],
                ptrs[last].0,
                &blob,
                t,
            )?;
        }
        Ok(())
    }

    /// Reads every output at gear `gear`'s real size (the static size without gears).
    fn read_outputs(
        &mut self,
        m: ModelId,
        gear: Option<usize>,
        t: &mut Transfers,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let model = &self.models[m.0 as usize];
        let desc = model.loaded.desc.clone();
        let ptrs = model.loaded.outputs.clone();
        let hosts = model.output_host.clone();
        let mut out = Vec::with_capacity(desc.outputs.len());
        for (o, io) in desc.outputs.iter().enumerate() {
            let dtype = io_type(io)?;
            let dims = match (gear, desc.dynamic.as_ref()) {
                (Some(g), Some(d)) => d.output_dims[g][o].clone(),
                _ => io.max_dims.clone(),
            };
            let data = copy::d2h(
                self.link(),
                &format!("memcpy_d2h output {o}"),
                ptrs[o].0,
                hosts[o],
                tensor_bytes(dtype, &dims),
                t,
            )?;
            out.push(Tensor::new(dtype, dims, data).map_err(RuntimeError::Failure)?);
        }
        Ok(out)
    }

    /// Hands one item (the data inputs in model order) to a sink model's data queue; the copies
    /// are timed and overlap whatever the device is doing.
    pub fn enqueue(&mut self, m: ModelId, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        let start = self.dev.now().0;
        let model = self.model(m)?;
        let Some(q) = model.loaded.queue else {
            return Err(bad(format!(
                "model `{}` was compiled for non-sink mode: use run",
                model.loaded.desc.name
            )));
        };
        let desc = model.loaded.desc.clone();
        check_inputs(&desc, inputs)?;
        // The device picks the branch from the gear axes alone (a vector matching no gear runs
        // the last branch, as GE's does); inputs that disagree with the gear those axes pick
        // would be cut to it silently, so they are refused here.
        if let Some(d) = desc.dynamic.as_ref() {
            let dims = gear_vector(&desc, d, inputs)?;
            if let Some(why) = find_gear(d, &dims).and_then(|g| off_gear_input(&desc, d, g, inputs))
            {
                return Err(RuntimeError::NotAGear(why));
            }
        }
        for (x, io) in inputs.iter().zip(&desc.inputs) {
            if x.data.len() as u64 > io.bytes {
                return Err(bad(format!(
                    "input `{}` of shape [{}] has {} bytes, more than the largest gear's {}",
                    io.name,
                    join(&x.dims),
                    x.data.len(),
                    io.bytes
                )));
            }
        }
        let item = inputs
            .iter()
            .map(|x| HostTensor {
                data: x.data.to_vec(),
                dims: x.dims.clone(),
            })
            .collect();
        let bytes = inputs.iter().map(|x| x.data.len() as u64).sum();
        self.host.stage(&mut self.dev, bytes)?;
        let send = super::host_work::costs(&self.dev).queue_send_ns;
        self.host.work(&mut self.dev, "acltdtSendTensor", send)?;
        self.dev.enqueue(q, item)?;
        let transfers = Transfers {
            h2d_bytes: inputs.iter().map(|x| x.data.len() as u64).sum(),
            h2d: inputs.len() as u64,
            ..Transfers::default()
        };
        self.models[m.0 as usize]
            .queued
            .push_back(Queued { transfers });
        self.host_span("enqueue", start, "");
        Ok(())
    }

    /// Runs a sink model once on the oldest queued item: the device takes the item, derives the
    /// dims and selects the branch; the host then reads `cur_dynamic_dims` back and the outputs
    /// at that gear's size. Dims that match no gear run the last branch, as the hardware does;
    /// the report warns and the outputs are read at the last gear's size.
    pub fn run_queued(&mut self, m: ModelId) -> Result<RunReport, RuntimeError> {
        let start = self.clocks()?;
        let model = self.model(m)?;
        if model.loaded.queue.is_none() {
            return Err(bad(format!(
                "model `{}` was compiled for non-sink mode: use run",
                model.loaded.desc.name
            )));
        }
        let queued = self.models[m.0 as usize]
            .queued
            .pop_front()
            .ok_or_else(|| {
                bad("run_queued: nothing is queued for this model (enqueue its inputs first)")
            })?;
        let mut t = queued.transfers;
        let model = &self.models[m.0 as usize];
        let desc = model.loaded.desc.clone();
        let d = desc
            .dynamic
            .clone()
            .ok_or_else(|| RuntimeError::Failure("a sink model without gears".into()))?;
        let (dims_ptr, dims_host) = match (model.loaded.dims_out, model.dims_host) {
            (Some(p), Some(h)) => (p, h),
            _ => {
                return Err(RuntimeError::Failure(
                    "a sink model without GetDynamicDims".into(),
                ));
            }
        };
        let execute = self.execute_model(m)?;
        let d2h_start = self.dev.now().0;
        let n = d.gears.first().map_or(0, Vec::len);
        let raw = copy::d2h(
            self.link(),
            "memcpy_d2h cur_dynamic_dims",
            dims_ptr.0,
            dims_host,
            4 * n as u64,
            &mut t,
        )?;
        let dims: Vec<i64> = raw
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        let mut warnings = Vec::new();
        let gear = find_gear(&d, &dims);
        let read_at = match gear {
            Some(g) => g,
            None => {
                let last = d.gears.len() - 1;
                warnings.push(format!(
                    "cur_dynamic_dims [{}] match no gear ({}): the device ran the last branch \
                     (Batch_{last}), as the hardware does; outputs are read at gear {last}'s size \
                     (GE would report them empty)",
                    join(&dims),
                    gear_list(&d)
                ));
                last
            }
        };
        self.models[m.0 as usize].current = Some(CurShape {
            kind: d.mode,
            dims: dims.clone(),
        });
        let outputs = self.read_outputs(m, Some(read_at), &mut t)?;
        let d2h = Phase {
            name: "d2h",
            start_ps: d2h_start,
            end_ps: self.dev.now().0,
        };
        let (kernels, profile) = self.take_profile(m, &[d2h]);
        let reason = match gear {
            Some(g) => format!("cur_dynamic_dims [{}] are gear {g}", join(&dims)),
            None => format!("cur_dynamic_dims [{}] are no gear", join(&dims)),
        };
        let end = self.clocks()?;
        let report = RunReport {
            path: RunPath::Gear,
            reason,
            gear,
            cur_dynamic_dims: dims,
            outputs,
            device_time_ps: end.device - start.device,
            host_ps: end.host - start.host,
            end_to_end_ps: end.at - start.at,
            execute_ps: execute.device_ps,
            execute_call_ps: execute.call_ps,
            kernels,
            profile,
            h2d_bytes: t.h2d_bytes,
            h2d_transfers: t.h2d,
            d2h_bytes: t.d2h_bytes,
            d2h_transfers: t.d2h,
            warnings,
        };
        self.host_span("run (sink)", start.at, &report.reason);
        Ok(report)
    }

    /// A sink run of one item: enqueue, then run it (end to end and host time include the
    /// enqueue).
    pub fn run_sink(&mut self, m: ModelId, inputs: &[Tensor]) -> Result<RunReport, RuntimeError> {
        let start = self.clocks()?;
        self.enqueue(m, inputs)?;
        let mut report = self.run_queued(m)?;
        let end = self.clocks()?;
        report.host_ps = end.host - start.host;
        report.end_to_end_ps = end.at - start.at;
        Ok(report)
    }

    /// Runs a hybrid model's dynamic-shape path even for shapes that are a gear (to compare the
    /// two paths on the same inputs).
    pub fn run_dynamic_path(
        &mut self,
        m: ModelId,
        inputs: &[Tensor],
    ) -> Result<RunReport, RuntimeError> {
        let start = self.clocks()?;
        let desc = self.model(m)?.loaded.desc.clone();
        check_inputs(&desc, inputs)?;
        let dims = match desc.dynamic.as_ref() {
            Some(d) => gear_vector(&desc, d, inputs)?,
            None => Vec::new(),
        };
        let reason = format!("dims [{}]: dynamic-shape path forced", join(&dims));
        self.run_dynamic(m, inputs, dims, reason, start)
    }

    fn run_dynamic(
        &mut self,
        m: ModelId,
        inputs: &[Tensor],
        dims: Vec<i64>,
        reason: String,
        start: Clocks,
    ) -> Result<RunReport, RuntimeError> {
        let mut dynamic = self.models[m.0 as usize]
            .dynamic
            .take()
            .ok_or_else(|| RuntimeError::Failure("not a hybrid model".into()))?;
        let names: Vec<String> = {
            let desc = &self.models[m.0 as usize].loaded.desc;
            desc.inputs[..data_inputs(desc)]
                .iter()
                .map(|i| i.name.clone())
                .collect()
        };
        let result = dynamic.run(self.link(), inputs, &names);
        self.models[m.0 as usize].dynamic = Some(dynamic);
        let (outputs, t) = result?;
        let end = self.clocks()?;
        let report = RunReport {
            execute_ps: end.at - start.at,
            execute_call_ps: end.at - start.at,
            kernels: self.dev.take_profile(),
            profile: {
                self.dev.take_task_log();
                None
            },
            path: RunPath::Dynamic,
            reason,
            gear: None,
            cur_dynamic_dims: dims,
            outputs,
            device_time_ps: end.device - start.device,
            host_ps: end.host - start.host,
            end_to_end_ps: end.at - start.at,
            h2d_bytes: t.h2d_bytes,
            h2d_transfers: t.h2d,
            d2h_bytes: t.d2h_bytes,
            d2h_transfers: t.d2h,
            warnings: Vec::new(),
        };
        self.host_span("run (dynamic shape)", start.at, &report.reason);
        Ok(report)
    }
}

/// A direct output (a model input returned as is, so an output named like a data input) comes
/// back at its input's shape. GE's output table gives such an output the largest gear's dims in
/// non-sink mode (the device copies the whole input buffer), while in sink mode it passes
/// through the branch and has its real shape; trimming it makes the two modes agree, and the
/// bytes past the input's are only the buffer's unused tail.
fn trim_direct_outputs(desc: &ModelDesc, inputs: &[Tensor], outputs: &mut [Tensor]) {
    for (io, out) in desc.outputs.iter().zip(outputs.iter_mut()) {
        let Some(i) = desc.inputs[..inputs.len()]
            .iter()
            .position(|x| x.name == io.name)
        else {
            continue;
        };
        let x = &inputs[i];
        if x.dtype == out.dtype
            && x.data.len() <= out.data.len()
            && x.dims != out.dims
            && let Ok(t) = Tensor::new(out.dtype, x.dims.clone(), out.data[..x.data.len()].to_vec())
        {
            *out = t;
        }
    }
}

/// Bytes of a tensor of `dims`.
fn tensor_bytes(dtype: DataType, dims: &[i64]) -> u64 {
    dims.iter().map(|&d| d.max(0) as u64).product::<u64>() * dtype.size() as u64
}

/// The model's data inputs (all but the gear input of a non-sink gear model).
pub fn data_inputs(desc: &ModelDesc) -> usize {
    match desc.inputs.last() {
        Some(last) if last.name == SHAPE_DATA => desc.inputs.len() - 1,
        _ => desc.inputs.len(),
    }
}

/// Every dim of the inputs in `shape_order`, concatenated (-1 where a gear sets it).
fn raw_dims(desc: &ModelDesc, d: &DynamicDesc) -> Result<Vec<i64>, RuntimeError> {
    let mut raw = Vec::new();
    for name in &d.shape_order {
        let io = desc
            .inputs
            .iter()
            .find(|i| &i.name == name)
            .ok_or_else(|| {
                RuntimeError::Failure(format!("shape order names `{name}`, which is no input"))
            })?;
        raw.extend_from_slice(&io.dims);
    }
    Ok(raw)
}

/// Checks the data inputs' count, types, ranks and static dims: the one check of a run's
/// inputs (`gearsim run` names the file from the error's index).
fn check_inputs(desc: &ModelDesc, inputs: &[Tensor]) -> Result<(), RuntimeError> {
    let n = data_inputs(desc);
    let names = || {
        desc.inputs[..n]
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if inputs.len() != n {
        return Err(bad_input(
            None,
            format!(
                "model `{}` takes {n} input(s) ({}), got {}",
                desc.name,
                names(),
                inputs.len()
            ),
        ));
    }
    for (i, (x, io)) in inputs.iter().zip(&desc.inputs).enumerate() {
        let want = io_type(io)?;
        if x.dtype != want {
            return Err(bad_input(
                Some(i),
                format!(
                    "input {i} (`{}`): expected element type {}, got {}",
                    io.name,
                    want.name(),
                    x.dtype.name()
                ),
            ));
        }
        if x.dims.len() != io.dims.len() {
            return Err(bad_input(
                Some(i),
                format!(
                    "input {i} (`{}`): expected rank {} (dims [{}]), got shape [{}]",
                    io.name,
                    io.dims.len(),
                    join(&io.dims),
                    join(&x.dims)
                ),
            ));
        }
        for (k, (&want, &got)) in io.dims.iter().zip(&x.dims).enumerate() {
            if want >= 0 && want != got {
                return Err(bad_input(
                    Some(i),
                    format!(
                        "input {i} (`{}`) axis {k}: expected {want} (dims [{}]), got shape [{}]",
                        io.name,
                        join(&io.dims),
                        join(&x.dims)
                    ),
                ));
            }
            if got < 0 {
                return Err(bad_input(
                    Some(i),
                    format!("input {i} (`{}`) axis {k}: negative size {got}", io.name),
                ));
            }
        }
    }
    Ok(())
}

fn bad_input(index: Option<usize>, message: String) -> RuntimeError {
    RuntimeError::BadInput { index, message }
}

/// The first input whose shape is not the one gear `g` gives it, said as E13025's reason.
fn off_gear_input(
    desc: &ModelDesc,
    d: &DynamicDesc,
    g: usize,
    inputs: &[Tensor],
) -> Option<String> {
    let want = d.input_dims.get(g)?;
    inputs
        .iter()
        .zip(&desc.inputs)
        .zip(want)
        .find(|((x, _), w)| x.dims != **w)
        .map(|((x, io), w)| {
            format!(
                "input `{}` has shape [{}], but gear {g} ({}) gives it [{}]; every input whose \
                 dims are -1 must match the same gear",
                io.name,
                join(&x.dims),
                join(&d.gears[g]),
                join(w)
            )
        })
}

/// The gear vector of `inputs`: the runtime values of the -1 axes, inputs in `shape_order`.
fn gear_vector(
    desc: &ModelDesc,
    d: &DynamicDesc,
    inputs: &[Tensor],
) -> Result<Vec<i64>, RuntimeError> {
    // As GE splits a gear among the inputs (spec 3.1): an input with as many -1 axes as the
    // gear has values takes the whole gear (batch mode's every input with a -1 batch), the
    // others take consecutive slices.
    let len = d.gears.first().map_or(0, Vec::len);
    let (mut slices, mut whole) = (Vec::new(), None);
    for name in &d.shape_order {
        let i = desc
            .inputs
            .iter()
            .position(|x| &x.name == name)
            .ok_or_else(|| {
                RuntimeError::Failure(format!("shape order names `{name}`, which is no input"))
            })?;
        let values: Vec<i64> = desc.inputs[i]
            .dims
            .iter()
            .zip(&inputs[i].dims)
            .filter(|(want, _)| **want < 0)
            .map(|(_, got)| *got)
            .collect();
        if values.len() == len {
            whole.get_or_insert(values);
        } else {
            slices.extend(values);
        }
    }
    Ok(match whole {
        Some(w) if slices.len() < len => w,
        _ => slices,
    })
}
