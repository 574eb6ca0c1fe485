//! Loading a compiled model onto a device, and running it once its inputs are in place.

use std::collections::BTreeMap;

use gearsim_firmware::kernels::map_index::{self, MapIndexShape};
use gearsim_firmware::kernels::{
    AiCpuKernelId, AiCpuOpArgs, GetDynamicDimsArgs, GetNextArgs, GetNextOutput, MapIndexArgs,
};
use gearsim_firmware::{
    Device, DeviceError, DevicePtr, KERNEL_NEEDS_VALUES, KernelHandle, LabelId, ModelId, QueueId,
    StreamId,
};
use gearsim_isa::Program;
use gearsim_isa::gear::MapIndexEngine;
use gearsim_isa::gear::{MAX_RANK, TableLayout};
use gearsim_isa::om::{ModelDesc, OmError, OmFile, SectionKind};
use gearsim_isa::omtask::{
    Addr, KernelArg, ModelTasks, OmTask, OpInfo, Region, decode_kernel_flags, decode_kernels,
    decode_op_info,
};
use gearsim_isa::task::{
    AiCoreKernel, KernelKind, L2_SECTION_BYTES, L2Section, LabelGoto, LabelSet, LabelSwitchByIndex,
    Memcpy, MemcpyKind, ModelEndGraph, NO_STREAM, StreamActive, Task,
};
use gearsim_sim::ExecMode;
use gearsim_traces::TraceSink;

use gearsim_isa::gear::SHAPE_DATA;
use gearsim_isa::tensor::DataType;

/// Depth of the data queue a sink-mode model reads from.
pub const QUEUE_DEPTH: u32 = 64;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The `.om` is unusable.
    #[error(transparent)]
    Om(#[from] OmError),
    /// The device refused something.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The model is inconsistent.
    #[error("the model is inconsistent: {0}")]
    Model(String),
}

/// A model loaded on a device.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// Its description.
    pub desc: ModelDesc,
    /// The firmware model.
    pub model: ModelId,
    /// Input buffers (each sized for the largest gear), in model-input order; empty in sink mode.
    pub inputs: Vec<DevicePtr>,
    /// Output buffers, in model-output order.
    pub outputs: Vec<DevicePtr>,
    /// The weight region.
    pub weights: DevicePtr,
    /// The feature-map region.
    pub feature_map: DevicePtr,
    /// Sink mode: where GetDynamicDims leaves the gear vector (`cur_dynamic_dims`).
    pub dims_out: Option<DevicePtr>,
    /// Sink mode: the data queue GetNext reads.
    pub queue: Option<QueueId>,
    /// Where the MapIndex result lands (the selected branch), for reports.
    pub branch_index: Option<DevicePtr>,
    /// Kernels loaded, in `.om` order.
    pub kernels: Vec<KernelHandle>,
    /// The device stream of model stream 0 (model stream `s` is device stream `first_stream + s`).
    pub first_stream: u32,
    /// Per model stream, per task: what profiles name it after.
    pub tasks: Vec<Vec<TaskMeta>>,
}

/// A task of a model stream as profiles show it: its name, what kind of `.om` task it is and,
/// for a kernel, AI CPU or gear-selection task, the operator behind it (`OpInfo` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMeta {
    /// The task's name (the node it came from, or GE's name for a control task).
    pub name: String,
    /// The `.om` task kind (`AiCore`, `MapIndex`, `LabelSwitch` ...).
    pub kind: &'static str,
    /// The operator behind it.
    pub op: Option<OpInfo>,
}

/// The name of an `.om` task's kind.
pub fn om_task_kind(t: &OmTask) -> &'static str {
    match t {
        OmTask::AiCore { .. } => "AiCore",
        OmTask::MapIndex { .. } => "MapIndex",
        OmTask::GetNext { .. } => "GetNext",
        OmTask::GetDynamicDims { .. } => "GetDynamicDims",
        OmTask::LabelSwitch { .. } => "LabelSwitch",
        OmTask::LabelSet { .. } => "LabelSet",
        OmTask::LabelGoto { .. } => "LabelGoto",
        OmTask::StreamActive { .. } => "StreamActive",
        OmTask::EventRecord { .. } => "EventRecord",
        OmTask::StreamWaitEvent { .. } => "StreamWaitEvent",
        OmTask::Memcpy { .. } => "Memcpy",
        OmTask::EndGraph => "EndGraph",
        OmTask::AiCpu { .. } => "AiCpu",
    }
}

struct Regions {
    weights: DevicePtr,
    feature_map: DevicePtr,
    inputs: Vec<DevicePtr>,
    outputs: Vec<DevicePtr>,
    /// Bytes of each region: weights, feature map, inputs, outputs.
    sizes: RegionSizes,
}

struct RegionSizes {
    weights: u64,
    feature_map: u64,
    inputs: Vec<u64>,
    outputs: Vec<u64>,
}

impl Regions {
    /// The device address of `a`, named by the task (`task`) it belongs to.
    fn resolve(&self, task: &str, a: Addr) -> Result<u64, LoadError> {
        let base = match a.region {
            Region::Weights => self.weights,
            Region::FeatureMap => self.feature_map,
            Region::Input(i) => *self.inputs.get(i as usize).ok_or_else(|| {
                LoadError::Model(format!(
                    "task {task} names input {i}; the model has {}",
                    self.inputs.len()
                ))
            })?,
            Region::Output(i) => *self.outputs.get(i as usize).ok_or_else(|| {
                LoadError::Model(format!(
                    "task {task} names output {i}; the model has {}",
                    self.outputs.len()
                ))
            })?,
        };
        base.0.checked_add(a.offset).ok_or_else(|| {
            LoadError::Model(format!(
                "task {task} names {a}, an offset past the end of the 64-bit address space"
            ))
        })
    }

    /// The device address of `size` bytes at `a`, which must lie inside `a`'s region: a copy
    /// task that reaches past its buffer would overwrite other models' memory on a real
    /// device (and a huge size from a damaged file would make the simulator move gigabytes).
    fn resolve_span(&self, task: &str, a: Addr, size: u64) -> Result<u64, LoadError> {
        let at = self.resolve(task, a)?;
        let s = &self.sizes;
        let (what, region) = match a.region {
            Region::Weights => ("the weights".to_string(), s.weights),
            Region::FeatureMap => ("the feature map".to_string(), s.feature_map),
            Region::Input(i) => (
                format!("input {i}"),
                s.inputs.get(i as usize).copied().unwrap_or(0),
            ),
            Region::Output(i) => (
                format!("output {i}"),
                s.outputs.get(i as usize).copied().unwrap_or(0),
            ),
        };
        if a.offset.checked_add(size).is_none_or(|end| end > region) {
            return Err(LoadError::Model(format!(
                "task {task}: {size} bytes at {a} reach past {what} ({region} bytes)"
            )));
        }
        Ok(at)
    }
}

fn put<S: TraceSink>(dev: &mut Device<S>, bytes: &[u8]) -> Result<DevicePtr, LoadError> {
    let p = dev.alloc(bytes.len().max(1) as u64)?;
    dev.write(p, bytes)?;
    Ok(p)
}

fn zeroed<S: TraceSink>(dev: &mut Device<S>, bytes: u64) -> Result<DevicePtr, LoadError> {
    let p = dev.alloc(bytes.max(1))?;
    dev.fill(p, bytes.max(1), 0)?;
    Ok(p)
}

/// Loads a kernel a lowering made: a MIX kernel (a separated chip's cube and vector programs,
/// one vector core per block) or a kernel of one program, with image `flags`.
pub fn load_lowered<S: TraceSink>(
    dev: &mut Device<S>,
    k: &gearsim_compiler::lower::Kernel,
    flags: u32,
) -> Result<KernelHandle, gearsim_firmware::DeviceError> {
    match &k.mix {
        Some(mix) => dev.load_mix_kernel(
            k.program.clone(),
            mix.vector.clone(),
            flags | gearsim_isa::task::KERNEL_MIX_ONE_VECTOR,
        ),
        None => dev.load_kernel_flags(k.program.clone(), flags),
    }
}

impl LoadedModel {
    /// Loads a validated `.om` onto `dev`.
    pub fn load<S: TraceSink>(
        dev: &mut Device<S>,
        om: &OmFile<'_>,
    ) -> Result<LoadedModel, LoadError> {
        Self::load_described(dev, om, om.desc()?)
    }

    /// Loads a validated `.om` whose description the caller has already decoded (`desc` is
    /// `om.desc()`), so a caller that read the description first does not decode it twice.
    pub fn load_described<S: TraceSink>(
        dev: &mut Device<S>,
        om: &OmFile<'_>,
        desc: ModelDesc,
    ) -> Result<LoadedModel, LoadError> {
        check_desc(&desc)?;
        let images = decode_kernels(om.section(SectionKind::Kernels).unwrap_or(&[]))?;
        let flags = match om.section(SectionKind::KernelFlags) {
            Some(bytes) => decode_kernel_flags(bytes, images.len())?,
            None => vec![0; images.len()],
        };
        let tasks = ModelTasks::decode(
            om.section(SectionKind::Tasks)
                .ok_or_else(|| LoadError::Model("the .om has no task streams".into()))?,
            images.len() as u32,
        )?;
        check_control_flow(&tasks)?;
        let mut ops: BTreeMap<(u32, u32), OpInfo> = match om.section(SectionKind::OpInfo) {
            Some(bytes) => decode_op_info(bytes, &tasks)?
                .into_iter()
                .map(|o| ((o.stream, o.task), o))
                .collect(),
            None => BTreeMap::new(),
        };
        let task_meta: Vec<Vec<TaskMeta>> = tasks
            .streams
            .iter()
            .enumerate()
            .map(|(s, stream)| {
                stream
                    .iter()
                    .enumerate()
                    .map(|(i, t)| TaskMeta {
                        name: t.name.clone(),
                        kind: om_task_kind(&t.task),
                        op: ops.remove(&(s as u32, i as u32)),
                    })
                    .collect()
            })
            .collect();
        let sink = desc.dynamic.as_ref().is_some_and(|d| d.getnext_sink);
        // Regions.
        // A timing-only run of a model where no kernel computes values leaves the weights
        // unread: the region is reserved and marked not computed, and only the spans the
        // tasks that compute in every mode read from it (MapIndex's gear tables, AI CPU
        // operators' inputs, device copies' sources) are checked and copied, below, task by
        // task.
        let weight_bytes = om.section_size(SectionKind::Weights).unwrap_or(0) as u64;
        let values_read = flags.iter().any(|f| f & KERNEL_NEEDS_VALUES != 0);
        let lazy_weights = dev.exec_mode() == ExecMode::TimingOnly && !values_read;
        let weights = if lazy_weights {
            let p = dev.alloc(weight_bytes.max(1))?;
            dev.mark_not_computed(p, weight_bytes.max(1))?;
            p
        } else {
            put(dev, om.weights()?)?
        };
        let feature_map = zeroed(dev, tasks.feature_map_bytes)?;
        let inputs = if sink {
            Vec::new()
        } else {
            desc.inputs
                .iter()
                .map(|i| zeroed(dev, i.bytes))
                .collect::<Result<_, _>>()?
        };
        let outputs = desc
            .outputs
            .iter()
            .map(|o| zeroed(dev, o.bytes))
            .collect::<Result<_, _>>()?;
        let r = Regions {
            weights,
            feature_map,
            inputs,
            outputs,
            sizes: RegionSizes {
                weights: weight_bytes,
                feature_map: tasks.feature_map_bytes,
                inputs: desc.inputs.iter().map(|i| i.bytes).collect(),
                outputs: desc.outputs.iter().map(|o| o.bytes).collect(),
            },
        };
        // Kernels.
        let decode = |k: &gearsim_isa::omtask::KernelImage| {
            Program::decode(Some(k.name.clone()), &k.code)
                .map_err(|e| LoadError::Model(format!("kernel {}: {e}", k.name)))
        };
        let mut kernels = Vec::with_capacity(images.len());
        let mut i = 0;
        while i < images.len() {
            let program = decode(&images[i])?;
            if KernelKind::of_flags(flags[i]) != KernelKind::Mix {
                kernels.push(dev.load_kernel_flags(program, flags[i])?);
                i += 1;
                continue;
            }
            // A MIX kernel: its vector program is the next image, flagged a vector kernel.
            let vector = match images.get(i + 1) {
                Some(v) if KernelKind::of_flags(flags[i + 1]) == KernelKind::Vector => decode(v)?,
                _ => {
                    return Err(LoadError::Model(format!(
                        "kernel {} is a MIX kernel but the next image is not its vector program",
                        images[i].name
                    )));
                }
            };
            let k = dev.load_mix_kernel(program, vector, flags[i])?;
            // Both indices name the kernel; tasks launch the first.
            kernels.extend([k, k]);
            i += 2;
        }
        // Labels, side streams and the queue.
        let labels: Vec<LabelId> = (0..tasks.labels)
            .map(|_| dev.create_label())
            .collect::<Result<_, _>>()?;
        let first_stream = dev.stream_count();
        let model_id = dev.model_count();
        let queue = if sink {
            Some(dev.create_queue(QUEUE_DEPTH)?)
        } else {
            None
        };
        let label = |l: u32| -> Result<u32, LoadError> {
            labels
                .get(l as usize)
                .map(|id| id.0)
                .ok_or_else(|| LoadError::Model(format!("label {l} of {}", labels.len())))
        };
        // Under lazily loaded weights, copies the span `[a, a + bytes)` when it lies in them
        // (clipped to the region; `weights_part` checks the chunks under it first).
        let weights_base = r.weights.0;
        let copy_weights = |dev: &mut Device<S>, a: Addr, bytes: u64| -> Result<(), LoadError> {
            if !lazy_weights || a.region != Region::Weights || bytes == 0 {
                return Ok(());
            }
            let end = a.offset.saturating_add(bytes).min(weight_bytes);
            let start = a.offset.min(end);
            let part = om.weights_part(start as usize..end as usize)?;
            dev.write(DevicePtr(weights_base + start), part)?;
            Ok(())
        };
        let mut branch_index = None;
        let mut streams = Vec::with_capacity(tasks.streams.len());
        for s in &tasks.streams {
            let mut out = Vec::with_capacity(s.len());
            for t in s {
                let task = match &t.task {
                    OmTask::AiCore {
                        kernel,
                        block_dim,
                        args,
                        l2,
                    } => {
                        let k = kernels.get(*kernel as usize).ok_or_else(|| {
                            LoadError::Model(format!("task {} names kernel {kernel}", t.name))
                        })?;
                        let bytes: Vec<u8> = args
                            .iter()
                            .map(|a| r.resolve(&t.name, a.addr))
                            .collect::<Result<Vec<u64>, _>>()?
                            .iter()
                            .flat_map(|a| a.to_le_bytes())
                            .collect();
                        let args = if bytes.is_empty() {
                            0
                        } else {
                            put(dev, &bytes)?.0
                        };
                        // The launch's L2 control sections, as rtSmDesc_t is, in device
                        // memory beside its arguments.
                        let mut sections = Vec::with_capacity(l2.len() * L2_SECTION_BYTES);
                        for c in l2 {
                            let section = L2Section {
                                addr: r.resolve(&t.name, c.addr)?,
                                bytes: c.bytes,
                                action: c.action,
                            };
                            sections.extend_from_slice(&section.encode());
                        }
                        let l2ctrl = if sections.is_empty() {
                            0
                        } else {
                            put(dev, &sections)?.0
                        };
                        Task::AiCoreKernel(AiCoreKernel {
                            kernel: k.addr.0,
                            args,
                            block_dim: *block_dim,
                            l2ctrl,
                            l2_sections: l2.len() as u32,
                        })
                    }
                    OmTask::MapIndex {
                        engine,
                        layout,
                        n,
                        gears,
                        x,
                        table,
                        y,
                    } => {
                        let shape = MapIndexShape {
                            n: *n,
                            gears: *gears,
                            layout: *layout,
                            level_index: false,
                        };
                        // The kernel is generated from the shape, so the shape is checked
                        // against the kernel's limits before anything is generated.
                        let limits = &dev.chip().config().kernels;
                        shape
                            .check(limits.map_index_max_gears, limits.map_index_max_dims)
                            .map_err(|e| {
                                LoadError::Model(format!("task {} (MapIndex): {e}", t.name))
                            })?;
                        // The kernel reads the table in 32-byte units.
                        let bytes = layout.table_len(*gears, *n) * 4;
                        copy_weights(dev, *table, bytes.div_ceil(32) * 32)?;
                        let (x, table, y) = (
                            r.resolve(&t.name, *x)?,
                            r.resolve(&t.name, *table)?,
                            r.resolve(&t.name, *y)?,
                        );
                        branch_index = Some(DevicePtr(y));
                        match engine {
                            MapIndexEngine::AiCore => {
                                let ub_bytes = dev.chip().config().core.ub_bytes;
                                let program =
                                    map_index::aicore_program(&shape, ub_bytes).map_err(|e| {
                                        LoadError::Model(format!("task {} (MapIndex): {e}", t.name))
                                    })?;
                                let k = dev.load_kernel_flags(program, KERNEL_NEEDS_VALUES)?;
                                let args: Vec<u8> = [x, table, 0, y]
                                    .iter()
                                    .flat_map(|a| a.to_le_bytes())
                                    .collect();
                                Task::AiCoreKernel(AiCoreKernel {
                                    kernel: k.addr.0,
                                    args: put(dev, &args)?.0,
                                    block_dim: 1,
                                    l2ctrl: 0,
                                    l2_sections: 0,
                                })
                            }
                            MapIndexEngine::AiCpu => {
                                let block = MapIndexArgs {
                                    x,
                                    table,
                                    level_index: 0,
                                    y,
                                    shape,
                                }
                                .encode();
                                aicpu(dev, AiCpuKernelId::MapIndex, &block)?
                            }
                        }
                    }
                    OmTask::GetNext { outputs } => {
                        let q = queue.ok_or_else(|| {
                            LoadError::Model("a GetNext task in a model without sink mode".into())
                        })?;
                        let outputs = outputs
                            .iter()
                            .map(|o| {
                                Ok(GetNextOutput {
                                    data: r.resolve(&t.name, o.data)?,
                                    capacity: o.capacity,
                                    shape: r.resolve(&t.name, o.shape)?,
                                })
                            })
                            .collect::<Result<_, LoadError>>()?;
                        let block = GetNextArgs {
                            queue: q.0,
                            timeout_us: 0,
                            outputs,
                        }
                        .encode();
                        aicpu(dev, AiCpuKernelId::GetNext, &block)?
                    }
                    OmTask::GetDynamicDims {
                        shape_info,
                        shapes,
                        out,
                    } => {
                        let block = GetDynamicDimsArgs {
                            out: r.resolve(&t.name, *out)?,
                            out_i64: false,
                            n: shapes.len() as u32,
                            shapes: shapes
                                .iter()
                                .map(|s| r.resolve(&t.name, *s))
                                .collect::<Result<_, _>>()?,
                            shape_info: shape_info.clone(),
                        }
                        .encode();
                        aicpu(dev, AiCpuKernelId::GetDynamicDims, &block)?
                    }
                    OmTask::LabelSwitch { index, labels: ls } => {
                        let ids: Vec<u8> = ls
                            .iter()
                            .map(|l| label(*l))
                            .collect::<Result<Vec<u32>, _>>()?
                            .iter()
                            .flat_map(|v| v.to_le_bytes())
                            .collect();
                        Task::LabelSwitchByIndex(LabelSwitchByIndex {
                            index_ptr: r.resolve(&t.name, *index)?,
                            max: ls.len() as u32,
                            label_list: put(dev, &ids)?.0,
                        })
                    }
                    OmTask::LabelSet { label: l } => Task::LabelSet(LabelSet { label: label(*l)? }),
                    OmTask::LabelGoto { label: l } => {
                        Task::LabelGoto(LabelGoto { label: label(*l)? })
                    }
                    OmTask::StreamActive { stream } => Task::StreamActive(StreamActive {
                        stream: stream.map_or(NO_STREAM, |s| first_stream + s),
                    }),
                    OmTask::EventRecord { .. } | OmTask::StreamWaitEvent { .. } => {
                        return Err(LoadError::Model(format!(
                            "task {}: model events are not used by this compiler version",
                            t.name
                        )));
                    }
                    OmTask::AiCpu {
                        op,
                        inputs,
                        outputs,
                    } => {
                        for a in inputs {
                            copy_weights(dev, a.addr, a.bytes)?;
                        }
                        let resolve = |list: &[KernelArg]| -> Result<Vec<(u64, u64)>, LoadError> {
                            list.iter()
                                .map(|a| Ok((r.resolve_span(&t.name, a.addr, a.bytes)?, a.bytes)))
                                .collect()
                        };
                        let block = AiCpuOpArgs {
                            op: op.clone(),
                            inputs: resolve(inputs)?,
                            outputs: resolve(outputs)?,
                        }
                        .encode();
                        aicpu(dev, AiCpuKernelId::Op, &block)?
                    }
                    OmTask::Memcpy { dst, src, size } => {
                        copy_weights(dev, *src, *size)?;
                        Task::Memcpy(Memcpy {
                            kind: MemcpyKind::DeviceToDevice,
                            dst: r.resolve_span(&t.name, *dst, *size)?,
                            src: r.resolve_span(&t.name, *src, *size)?,
                            size: *size,
                        })
                    }
                    OmTask::EndGraph => Task::ModelEndGraph(ModelEndGraph { model: model_id }),
                };
                out.push((task, Some(t.name.clone())));
            }
            streams.push(out);
        }
        let model = dev.load_model(streams)?;
        if model.0 != model_id {
            return Err(LoadError::Model(format!(
                "the device numbered the model {} instead of {model_id}",
                model.0
            )));
        }
        let dims_out = tasks
            .dims_out
            .map(|a| r.resolve("dims_out", a))
            .transpose()?
            .map(DevicePtr);
        Ok(LoadedModel {
            desc,
            model,
            inputs: r.inputs,
            outputs: r.outputs,
            weights: r.weights,
            feature_map: r.feature_map,
            dims_out,
            queue,
            branch_index,
            kernels,
            first_stream,
            tasks: task_meta,
        })
    }

    /// Runs the model once on `stream` (a user stream) and waits for it: the inputs must be in
    /// their buffers (or, in sink mode, an item in the queue).
    pub fn execute<S: TraceSink>(
        &self,
        dev: &mut Device<S>,
        stream: StreamId,
    ) -> Result<(), LoadError> {
        dev.submit(stream, self.execute_task(), Some(&self.desc.name))?;
        dev.synchronize(stream)?;
        Ok(())
    }

    /// The task that runs the model (`aclmdlExecute`'s submission).
    pub fn execute_task(&self) -> Task {
        Task::ModelExecute(gearsim_isa::task::ModelExecute {
            model: self.model.0,
        })
    }

    /// The branch MapIndex selected in the last run (-1 when no gear matched).
    pub fn selected_branch<S: TraceSink>(
        &self,
        dev: &mut Device<S>,
    ) -> Result<Option<i32>, LoadError> {
        let Some(p) = self.branch_index else {
            return Ok(None);
        };
        let mut b = [0u8; 4];
        dev.read(p, &mut b)?;
        Ok(Some(i32::from_le_bytes(b)))
    }
}

/// Bytes of a tensor of `dtype` and `dims`, `None` on a negative dim or an overflow.
fn dims_bytes(dtype: DataType, dims: &[i64]) -> Option<u64> {
    dims.iter().try_fold(dtype.size() as u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

fn dims_text(d: &[i64]) -> String {
    let parts: Vec<String> = d.iter().map(i64::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// Checks that a model description is consistent before the runtime sizes a buffer, indexes a
/// list or copies bytes by it: every input and output has a known element type, dims that fit
/// its largest gear's dims and a byte size equal to theirs; a gear model's tables have one
/// entry per gear and per input and output, each within the buffer it describes; the gear
/// vector input matches the gears. The compiler writes descriptions this way, so only a
/// damaged `.om` fails here, with the field at fault named.
fn check_desc(desc: &ModelDesc) -> Result<(), LoadError> {
    let bad = |what: String| Err(LoadError::Model(format!("model description: {what}")));
    let mut types = Vec::new();
    for (kind, list) in [("input", &desc.inputs), ("output", &desc.outputs)] {
        for (i, io) in list.iter().enumerate() {
            let at = format!("{kind} {i} `{}`", io.name);
            let Some(dtype) = i32::try_from(io.dtype).ok().and_then(DataType::from_onnx) else {
                return bad(format!(
                    "{at}: element type {} is not one gearsim knows",
                    io.dtype
                ));
            };
            types.push(dtype);
            if io.dims.len() != io.max_dims.len() || io.dims.len() > MAX_RANK {
                return bad(format!(
                    "{at}: dims {} and max_dims {}: expected the same rank, at most {MAX_RANK}",
                    dims_text(&io.dims),
                    dims_text(&io.max_dims)
                ));
            }
            let fits = io
                .dims
                .iter()
                .zip(&io.max_dims)
                .all(|(&d, &m)| m >= 0 && (d == -1 || d == m));
            if !fits {
                return bad(format!(
                    "{at}: dims {} do not fit max_dims {} (expected -1 or the max on each axis)",
                    dims_text(&io.dims),
                    dims_text(&io.max_dims)
                ));
            }
            if dims_bytes(dtype, &io.max_dims) != Some(io.bytes) {
                return bad(format!(
                    "{at}: bytes is {}, but max_dims {} of {} need {}",
                    io.bytes,
                    dims_text(&io.max_dims),
                    dtype.name(),
                    dims_bytes(dtype, &io.max_dims)
                        .map_or_else(|| "more than 2^64".to_string(), |b| b.to_string())
                ));
            }
        }
    }
    let Some(d) = &desc.dynamic else {
        return Ok(());
    };
    let (n_in, n_out) = (desc.inputs.len(), desc.outputs.len());
    let (in_types, out_types) = types.split_at(n_in);
    if !(1..=3).contains(&d.mode)
        || TableLayout::from_code(d.table_layout).is_none()
        || MapIndexEngine::from_code(d.mapindex_engine).is_none()
    {
        return bad(format!(
            "mode {}, table layout {}, MapIndex engine {}: expected 1..=3 and known codes",
            d.mode, d.table_layout, d.mapindex_engine
        ));
    }
    let gear_len = d.gears.first().map_or(0, Vec::len);
    if gear_len == 0
        || d.gears
            .iter()
            .any(|g| g.len() != gear_len || g.iter().any(|v| *v < 0))
    {
        return bad(format!(
            "gears {:?}: expected at least one gear, all of the same length >= 1, no value < 0",
            d.gears
        ));
    }
    let g = d.gears.len();
    if d.input_dims.len() != g || d.output_dims.len() != g || d.output_bytes.len() != g {
        return bad(format!(
            "{g} gears, but {} input_dims, {} output_dims and {} output_bytes entries",
            d.input_dims.len(),
            d.output_dims.len(),
            d.output_bytes.len()
        ));
    }
    for k in 0..g {
        let (ins, outs, bytes) = (&d.input_dims[k], &d.output_dims[k], &d.output_bytes[k]);
        if ins.len() != n_in || outs.len() != n_out || bytes.len() != n_out {
            return bad(format!(
                "gear {k}: {} input dims, {} output dims, {} output sizes for {n_in} inputs and \
                 {n_out} outputs",
                ins.len(),
                outs.len(),
                bytes.len()
            ));
        }
        for (i, (dims, io)) in ins.iter().zip(&desc.inputs).enumerate() {
            // `max_dims` is the gear with the most elements (GE sizes the buffer by element
            // count), so another gear may be larger on one axis: it must fit the bytes, not
            // max_dims axis by axis.
            let fits = dims.len() == io.dims.len()
                && dims
                    .iter()
                    .zip(&io.dims)
                    .all(|(&v, &want)| v >= 0 && (want == -1 || v == want));
            if !fits || dims_bytes(in_types[i], dims).is_none_or(|b| b > io.bytes) {
                return bad(format!(
                    "gear {k} input {i} `{}`: dims {} do not fit dims {} in a buffer of {} \
                     bytes",
                    io.name,
                    dims_text(dims),
                    dims_text(&io.dims),
                    io.bytes
                ));
            }
        }
        for (o, ((dims, &size), io)) in outs.iter().zip(bytes).zip(&desc.outputs).enumerate() {
            let need = dims_bytes(out_types[o], dims);
            if need != Some(size) || size > io.bytes {
                return bad(format!(
                    "gear {k} output {o} `{}`: dims {} and {size} bytes, expected the bytes of \
                     the dims, at most the buffer's {}",
                    io.name,
                    dims_text(dims),
                    io.bytes
                ));
            }
        }
    }
    let minus_ones = |i: usize| desc.inputs[i].dims.iter().filter(|v| **v == -1).count();
    let mut order = Vec::new();
    for name in &d.shape_order {
        match desc.inputs.iter().position(|io| &io.name == name) {
            Some(i) if i < n_in && !order.contains(&i) && name != SHAPE_DATA => order.push(i),
            _ => {
                return bad(format!(
                    "shape_order names `{name}`: expected each data input at most once"
                ));
            }
        }
    }
    // An input with as many -1 axes as a gear has values takes the whole gear, the others
    // consecutive slices (spec 3.1): the slices fill the gear, or some input takes it whole.
    let whole = order.iter().any(|&i| minus_ones(i) == gear_len);
    let sliced: usize = order
        .iter()
        .map(|&i| minus_ones(i))
        .filter(|&k| k != gear_len)
        .sum();
    if !(sliced == gear_len || (whole && sliced < gear_len)) {
        return bad(format!(
            "shape_order {:?} splits the gears' {gear_len} values into slices of {sliced} \
             and {} whole",
            d.shape_order,
            if whole { "some" } else { "none" }
        ));
    }
    if !d.getnext_sink {
        let gear_input = desc.inputs.last().filter(|io| {
            io.name == SHAPE_DATA
                && i32::try_from(io.dtype) == Ok(DataType::I32.onnx_code())
                && io.max_dims == [gear_len as i64]
        });
        if gear_input.is_none() {
            return bad(format!(
                "the last input must be the gear vector `{SHAPE_DATA}`, i32[{gear_len}]"
            ));
        }
    }
    Ok(())
}

/// Checks that a model's streams always end: every label is set once, and every jump
/// (LabelGoto, LabelSwitch) goes forward to a label set later in its own stream; a StreamActive
/// activates only a later stream. The compiler's streams are made that way (GE's label maker
/// jumps forward only); a damaged `.om` with a jump backwards would otherwise run forever.
fn check_control_flow(tasks: &ModelTasks) -> Result<(), LoadError> {
    // Keyed by label: the label count is a field of the file, the tasks are its bytes.
    let mut set_at: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for (s, stream) in tasks.streams.iter().enumerate() {
        for (i, t) in stream.iter().enumerate() {
            if let OmTask::LabelSet { label } = t.task
                && let Some((s0, i0)) = set_at.insert(label, (s, i))
            {
                return Err(LoadError::Model(format!(
                    "label {label} is set twice: by task {i0} of stream {s0} and by task {} \
                         (stream {s} task {i})",
                    t.name
                )));
            }
        }
    }
    for (s, stream) in tasks.streams.iter().enumerate() {
        for (i, t) in stream.iter().enumerate() {
            let targets: &[u32] = match &t.task {
                OmTask::LabelGoto { label } => std::slice::from_ref(label),
                OmTask::LabelSwitch { labels, .. } => labels,
                OmTask::StreamActive { stream: Some(to) } if *to as usize <= s => {
                    return Err(LoadError::Model(format!(
                        "task {} (stream {s} task {i}) activates stream {to}; a stream may only \
                         activate a later one",
                        t.name
                    )));
                }
                OmTask::AiCore { .. }
                | OmTask::MapIndex { .. }
                | OmTask::GetNext { .. }
                | OmTask::GetDynamicDims { .. }
                | OmTask::LabelSet { .. }
                | OmTask::StreamActive { .. }
                | OmTask::EventRecord { .. }
                | OmTask::StreamWaitEvent { .. }
                | OmTask::Memcpy { .. }
                | OmTask::AiCpu { .. }
                | OmTask::EndGraph => continue,
            };
            for &label in targets {
                match set_at.get(&label).copied() {
                    Some((ls, li)) if ls == s && li > i => {}
                    Some((ls, li)) => {
                        return Err(LoadError::Model(format!(
                            "task {} (stream {s} task {i}) jumps to label {label}, set by task \
                             {li} of stream {ls}; a jump must go forward in its own stream",
                            t.name
                        )));
                    }
                    None => {
                        return Err(LoadError::Model(format!(
                            "task {} (stream {s} task {i}) jumps to label {label}, which no task \
                             sets",
                            t.name
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

fn aicpu<S: TraceSink>(
    dev: &mut Device<S>,
    id: AiCpuKernelId,
    block: &[u8],
) -> Result<Task, LoadError> {
    let p = put(dev, block)?;
    Ok(id.task(p.0, block.len() as u32))
}
