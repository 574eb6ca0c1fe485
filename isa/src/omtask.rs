//! The task streams and kernels of a compiled model (`.om` sections `Tasks` and `Kernels`).
//!
//! Device addresses are not known when compiling, so every address in a task is an [`Addr`]:
//! a region of the loaded model plus an offset. The runtime allocates the regions when it loads
//! the model (weights from the `Weights` section, one feature-map region every gear branch
//! overlays, and the model's input and output buffers), then turns each [`OmTask`] into a task
//! descriptor. Kernels are stored once each (encoded instruction words) and named by index;
//! labels, events and side streams are numbered per model and mapped to device ids at load.

use std::fmt;

use crate::aicpu_op::AiCpuOp;
use crate::gear::{MapIndexEngine, TableLayout};
use crate::om::{Decoder, Encoder, OmError};
use crate::task::{L2Action, LeField, MAX_L2_SECTIONS};

/// A memory region of a loaded model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Region {
    /// The weights (read-only constants).
    Weights,
    /// The feature-map region: the root's tensors, then every branch's, overlaid.
    FeatureMap,
    /// Model input `i`'s buffer.
    Input(u32),
    /// Model output `i`'s buffer.
    Output(u32),
}

/// A relocatable device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// The region.
    pub region: Region,
    /// Byte offset in it.
    pub offset: u64,
}

impl Addr {
    /// An address in `region`.
    pub fn new(region: Region, offset: u64) -> Addr {
        Addr { region, offset }
    }

    /// The same region, `bytes` further.
    pub fn plus(self, bytes: u64) -> Addr {
        Addr {
            region: self.region,
            offset: self.offset + bytes,
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.region {
            Region::Weights => write!(f, "weights+{:#x}", self.offset),
            Region::FeatureMap => write!(f, "fm+{:#x}", self.offset),
            Region::Input(i) => write!(f, "input{i}+{:#x}", self.offset),
            Region::Output(i) => write!(f, "output{i}+{:#x}", self.offset),
        }
    }
}

/// An entry of a kernel's argument array: the address and how many bytes from it the kernel
/// may touch (the tensor or workspace it points at), which the verifier checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelArg {
    /// The address.
    pub addr: Addr,
    /// Bytes of the buffer it points at.
    pub bytes: u64,
}

/// An L2 control section of a kernel launch (GE's `rtL2Ctrl_t` data section), before load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct L2Control {
    /// The range's start.
    pub addr: Addr,
    /// Its length.
    pub bytes: u64,
    /// Keep it in L2 from the kernel's start, or forget it at the kernel's end.
    pub action: L2Action,
}

/// One output of a GetNext task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetNextSlot {
    /// Where the tensor's data goes.
    pub data: Addr,
    /// Its capacity in bytes (the largest gear's size).
    pub capacity: u64,
    /// Where its shape tensor goes (see [`crate::gear::SHAPE_TENSOR_BYTES`]).
    pub shape: Addr,
}

/// A task of a model stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OmTask {
    /// Launch compiled kernel `kernel` (an index into the kernels) with an argument array.
    AiCore {
        /// Kernel index.
        kernel: u32,
        /// Blocks.
        block_dim: u32,
        /// The argument array: one device address per entry.
        args: Vec<KernelArg>,
        /// The launch's L2 control sections (at most [`MAX_L2_SECTIONS`]).
        l2: Vec<L2Control>,
    },
    /// MapIndex on the chosen engine: the lowest gear equal to the query at `x`, written as one
    /// i32 at `y` (-1 when none).
    MapIndex {
        /// Engine.
        engine: MapIndexEngine,
        /// Layout of the table at `table`.
        layout: TableLayout,
        /// Query length (values per gear).
        n: u32,
        /// Gears.
        gears: u32,
        /// The query (i32[n]).
        x: Addr,
        /// The gear table.
        table: Addr,
        /// The result (i32).
        y: Addr,
    },
    /// GetNext (sink mode): pop the next item of the model's data queue into these buffers.
    GetNext {
        /// One slot per tensor of an item.
        outputs: Vec<GetNextSlot>,
    },
    /// GetDynamicDims (sink mode): collect the gear dims from GetNext's shape tensors.
    GetDynamicDims {
        /// The `shape_info` attribute.
        shape_info: Vec<i64>,
        /// The shape tensors, one per input.
        shapes: Vec<Addr>,
        /// The gear vector (i32[n]).
        out: Addr,
    },
    /// LabelSwitchByIndex: jump to `labels[index]` (the last one when out of range).
    LabelSwitch {
        /// The u32 index.
        index: Addr,
        /// Model label numbers.
        labels: Vec<u32>,
    },
    /// Bind a model label here.
    LabelSet {
        /// Model label number.
        label: u32,
    },
    /// Continue at a model label.
    LabelGoto {
        /// Model label number.
        label: u32,
    },
    /// Activate a side stream (`None`: the branch uses no other stream; the task still costs
    /// its control time, as GE's StreamActive with an empty active list).
    StreamActive {
        /// Model stream number (0 is the head stream).
        stream: Option<u32>,
    },
    /// Record a model event.
    EventRecord {
        /// Model event number.
        event: u32,
    },
    /// Wait for a model event.
    StreamWaitEvent {
        /// Model event number.
        event: u32,
    },
    /// Device-to-device copy.
    Memcpy {
        /// Destination.
        dst: Addr,
        /// Source.
        src: Addr,
        /// Bytes.
        size: u64,
    },
    /// End of the model's work (the head stream's last task).
    EndGraph,
    /// An operator run on the AI CPU, reading `inputs` and writing `outputs`.
    AiCpu {
        /// The operator.
        op: AiCpuOp,
        /// Its input tensors.
        inputs: Vec<KernelArg>,
        /// Its output tensors.
        outputs: Vec<KernelArg>,
    },
}

/// A task and the name it shows under in traces (the node it came from, or GE's name for a
/// control task such as `ascend_mbatch_shape_case/LabelSwitch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedTask {
    /// The task.
    pub task: OmTask,
    /// Its name.
    pub name: String,
}

/// The `Tasks` section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelTasks {
    /// Model streams, the head stream first (the one a model execution starts).
    pub streams: Vec<Vec<NamedTask>>,
    /// Labels used (model label numbers are `0..labels`).
    pub labels: u32,
    /// Events used.
    pub events: u32,
    /// Bytes of the feature-map region.
    pub feature_map_bytes: u64,
    /// Sink mode: where GetDynamicDims leaves the gear vector the runtime reads back as
    /// `cur_dynamic_dims` (the extra last NetOutput input).
    pub dims_out: Option<Addr>,
}

/// A compiled kernel in the `Kernels` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelImage {
    /// Name (op, types and shapes).
    pub name: String,
    /// Tiling parameters, for dumps and studies.
    pub tiling: Vec<(String, i64)>,
    /// Encoded instruction words.
    pub code: Vec<u8>,
}

fn put_addr(e: &mut Encoder, a: Addr) {
    let (kind, index) = match a.region {
        Region::Weights => (0, 0),
        Region::FeatureMap => (1, 0),
        Region::Input(i) => (2, i),
        Region::Output(i) => (3, i),
    };
    e.u32(kind);
    e.u32(index);
    e.u64(a.offset);
}

fn get_addr(d: &mut Decoder<'_>, field: &str) -> Result<Addr, OmError> {
    let kind = d.u32(field)?;
    let index = d.u32(field)?;
    let offset = d.u64(field)?;
    let region = match kind {
        0 | 1 if index != 0 => {
            return Err(OmError::Corrupt(format!(
                "tasks: `{field}` has index {index} for region kind {kind} ({}), which has no \
                 index (expected 0)",
                if kind == 0 { "weights" } else { "feature map" }
            )));
        }
        0 => Region::Weights,
        1 => Region::FeatureMap,
        2 => Region::Input(index),
        3 => Region::Output(index),
        k => {
            return Err(OmError::Corrupt(format!(
                "tasks: `{field}` has region kind {k} (expected 0..=3)"
            )));
        }
    };
    Ok(Addr { region, offset })
}

fn put_addrs(e: &mut Encoder, v: &[Addr]) {
    e.len(v.len());
    for a in v {
        put_addr(e, *a);
    }
}

fn get_addrs(d: &mut Decoder<'_>, field: &str) -> Result<Vec<Addr>, OmError> {
    let n = d.len(field, 16)?;
    (0..n).map(|_| get_addr(d, field)).collect()
}

fn put_u32s(e: &mut Encoder, v: &[u32]) {
    e.len(v.len());
    for x in v {
        e.u32(*x);
    }
}

fn get_u32s(d: &mut Decoder<'_>, field: &str) -> Result<Vec<u32>, OmError> {
    let n = d.len(field, 4)?;
    (0..n).map(|_| d.u32(field)).collect()
}

/// The L2 control sections of a launch: 1..=[`MAX_L2_SECTIONS`] of them.
fn get_l2(d: &mut Decoder<'_>) -> Result<Vec<L2Control>, OmError> {
    let n = d.len("l2 sections", 28)?;
    if n == 0 || n > MAX_L2_SECTIONS as usize {
        return Err(OmError::Corrupt(format!(
            "tasks: a launch has {n} L2 control sections (expected 1..={MAX_L2_SECTIONS})"
        )));
    }
    (0..n)
        .map(|_| {
            let addr = get_addr(d, "l2 section")?;
            let bytes = d.u64("l2 section bytes")?;
            let action = d.u32("l2 section action")?;
            let action = L2Action::from_le(action.into()).ok_or_else(|| {
                OmError::Corrupt(format!(
                    "tasks: L2 control action {action} is unknown (expected 1 keep or 2 drop)"
                ))
            })?;
            Ok(L2Control {
                addr,
                bytes,
                action,
            })
        })
        .collect()
}

impl OmTask {
    fn code(&self) -> u32 {
        match self {
            // A launch with L2 control sections has its own code (12, since version 1.1), so
            // files without them read as before.
            OmTask::AiCore { l2, .. } if l2.is_empty() => 0,
            OmTask::AiCore { .. } => 12,
            OmTask::MapIndex { .. } => 1,
            OmTask::GetNext { .. } => 2,
            OmTask::GetDynamicDims { .. } => 3,
            OmTask::LabelSwitch { .. } => 4,
            OmTask::LabelSet { .. } => 5,
            OmTask::LabelGoto { .. } => 6,
            OmTask::StreamActive { .. } => 7,
            OmTask::EventRecord { .. } => 8,
            OmTask::StreamWaitEvent { .. } => 9,
            OmTask::Memcpy { .. } => 10,
            OmTask::EndGraph => 11,
            OmTask::AiCpu { .. } => 13,
        }
    }

    fn encode(&self, e: &mut Encoder) {
        e.u32(self.code());
        match self {
            OmTask::AiCore {
                kernel,
                block_dim,
                args,
                l2,
            } => {
                e.u32(*kernel);
                e.u32(*block_dim);
                e.len(args.len());
                for a in args {
                    put_addr(e, a.addr);
                    e.u64(a.bytes);
                }
                if !l2.is_empty() {
                    e.len(l2.len());
                    for c in l2 {
                        put_addr(e, c.addr);
                        e.u64(c.bytes);
                        e.u32(c.action as u32);
                    }
                }
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
                e.u32(engine.code());
                e.u32(layout.code());
                e.u32(*n);
                e.u32(*gears);
                for a in [x, table, y] {
                    put_addr(e, *a);
                }
            }
            OmTask::GetNext { outputs } => {
                e.len(outputs.len());
                for o in outputs {
                    put_addr(e, o.data);
                    e.u64(o.capacity);
                    put_addr(e, o.shape);
                }
            }
            OmTask::GetDynamicDims {
                shape_info,
                shapes,
                out,
            } => {
                e.i64s(shape_info);
                put_addrs(e, shapes);
                put_addr(e, *out);
            }
            OmTask::LabelSwitch { index, labels } => {
                put_addr(e, *index);
                put_u32s(e, labels);
            }
            OmTask::LabelSet { label } | OmTask::LabelGoto { label } => e.u32(*label),
            OmTask::StreamActive { stream } => e.u32(stream.unwrap_or(u32::MAX)),
            OmTask::EventRecord { event } | OmTask::StreamWaitEvent { event } => e.u32(*event),
            OmTask::Memcpy { dst, src, size } => {
                put_addr(e, *dst);
                put_addr(e, *src);
                e.u64(*size);
            }
            OmTask::EndGraph => {}
            OmTask::AiCpu {
                op,
                inputs,
                outputs,
            } => {
                op.encode(e);
                for list in [inputs, outputs] {
                    e.len(list.len());
                    for a in list {
                        put_addr(e, a.addr);
                        e.u64(a.bytes);
                    }
                }
            }
        }
    }

    fn decode(d: &mut Decoder<'_>) -> Result<OmTask, OmError> {
        let code = d.u32("task kind")?;
        Ok(match code {
            0 | 12 => {
                let kernel = d.u32("kernel")?;
                let block_dim = d.u32("block_dim")?;
                let n = d.len("args", 24)?;
                let args = (0..n)
                    .map(|_| {
                        Ok(KernelArg {
                            addr: get_addr(d, "arg")?,
                            bytes: d.u64("arg bytes")?,
                        })
                    })
                    .collect::<Result<_, OmError>>()?;
                let l2 = if code == 12 { get_l2(d)? } else { Vec::new() };
                OmTask::AiCore {
                    kernel,
                    block_dim,
                    args,
                    l2,
                }
            }
            1 => {
                let engine = d.u32("engine")?;
                let engine = MapIndexEngine::from_code(engine).ok_or_else(|| {
                    OmError::Corrupt(format!("tasks: MapIndex engine {engine} is unknown"))
                })?;
                let layout = d.u32("layout")?;
                let layout = TableLayout::from_code(layout).ok_or_else(|| {
                    OmError::Corrupt(format!("tasks: MapIndex layout {layout} is unknown"))
                })?;
                OmTask::MapIndex {
                    engine,
                    layout,
                    n: d.u32("n")?,
                    gears: d.u32("gears")?,
                    x: get_addr(d, "x")?,
                    table: get_addr(d, "table")?,
                    y: get_addr(d, "y")?,
                }
            }
            2 => {
                let n = d.len("outputs", 40)?;
                let outputs = (0..n)
                    .map(|_| {
                        Ok(GetNextSlot {
                            data: get_addr(d, "data")?,
                            capacity: d.u64("capacity")?,
                            shape: get_addr(d, "shape")?,
                        })
                    })
                    .collect::<Result<_, OmError>>()?;
                OmTask::GetNext { outputs }
            }
            3 => OmTask::GetDynamicDims {
                shape_info: d.i64s("shape_info")?,
                shapes: get_addrs(d, "shapes")?,
                out: get_addr(d, "out")?,
            },
            4 => OmTask::LabelSwitch {
                index: get_addr(d, "index")?,
                labels: get_u32s(d, "labels")?,
            },
            5 => OmTask::LabelSet {
                label: d.u32("label")?,
            },
            6 => OmTask::LabelGoto {
                label: d.u32("label")?,
            },
            7 => {
                let s = d.u32("stream")?;
                OmTask::StreamActive {
                    stream: (s != u32::MAX).then_some(s),
                }
            }
            8 => OmTask::EventRecord {
                event: d.u32("event")?,
            },
            9 => OmTask::StreamWaitEvent {
                event: d.u32("event")?,
            },
            10 => OmTask::Memcpy {
                dst: get_addr(d, "dst")?,
                src: get_addr(d, "src")?,
                size: d.u64("size")?,
            },
            11 => OmTask::EndGraph,
            13 => {
                let op = AiCpuOp::decode(d)?;
                let mut lists = [Vec::new(), Vec::new()];
                for (list, field) in lists.iter_mut().zip(["inputs", "outputs"]) {
                    let n = d.len(field, 24)?;
                    for _ in 0..n {
                        list.push(KernelArg {
                            addr: get_addr(d, field)?,
                            bytes: d.u64(field)?,
                        });
                    }
                }
                let [inputs, outputs] = lists;
                OmTask::AiCpu {
                    op,
                    inputs,
                    outputs,
                }
            }
            k => {
                return Err(OmError::Corrupt(format!(
                    "tasks: task kind {k} is unknown (expected 0..=13)"
                )));
            }
        })
    }
}

impl ModelTasks {
    /// The section bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u32(self.labels);
        e.u32(self.events);
        e.u64(self.feature_map_bytes);
        match self.dims_out {
            Some(a) => {
                e.u32(1);
                put_addr(&mut e, a);
            }
            None => e.u32(0),
        }
        e.len(self.streams.len());
        for s in &self.streams {
            e.len(s.len());
            for t in s {
                e.str(&t.name);
                t.task.encode(&mut e);
            }
        }
        e.bytes
    }

    /// Parses the section, checking that every label, event, stream and kernel number is in
    /// range (`kernels` is the number of kernels in the model).
    pub fn decode(bytes: &[u8], kernels: u32) -> Result<ModelTasks, OmError> {
        let mut d = Decoder::new(bytes, "tasks");
        let labels = d.u32("labels")?;
        let events = d.u32("events")?;
        let feature_map_bytes = d.u64("feature_map_bytes")?;
        let dims_out = match d.u32("dims_out present")? {
            0 => None,
            1 => Some(get_addr(&mut d, "dims_out")?),
            v => {
                return Err(OmError::Corrupt(format!(
                    "tasks: `dims_out present` is {v} (expected 0 or 1)"
                )));
            }
        };
        let n = d.len("streams", 4)?;
        let mut streams = Vec::with_capacity(n);
        for _ in 0..n {
            let m = d.len("tasks", 8)?;
            let mut tasks = Vec::with_capacity(m);
            for _ in 0..m {
                let name = d.str("task name")?;
                let task = OmTask::decode(&mut d)?;
                tasks.push(NamedTask { task, name });
            }
            streams.push(tasks);
        }
        d.finish()?;
        let t = ModelTasks {
            streams,
            labels,
            events,
            feature_map_bytes,
            dims_out,
        };
        t.check_numbers(kernels)?;
        Ok(t)
    }

    fn check_numbers(&self, kernels: u32) -> Result<(), OmError> {
        let streams = self.streams.len() as u32;
        for (s, tasks) in self.streams.iter().enumerate() {
            for (i, t) in tasks.iter().enumerate() {
                let bad = |what: &str, v: u32, max: u32| {
                    OmError::Corrupt(format!(
                        "tasks: stream {s} task {i} ({}) names {what} {v}, the model has {max}",
                        t.name
                    ))
                };
                match &t.task {
                    OmTask::AiCore { kernel, .. } if *kernel >= kernels => {
                        return Err(bad("kernel", *kernel, kernels));
                    }
                    OmTask::LabelSet { label } | OmTask::LabelGoto { label }
                        if *label >= self.labels =>
                    {
                        return Err(bad("label", *label, self.labels));
                    }
                    OmTask::LabelSwitch { labels, .. } => {
                        if let Some(l) = labels.iter().find(|l| **l >= self.labels) {
                            return Err(bad("label", *l, self.labels));
                        }
                    }
                    OmTask::EventRecord { event } | OmTask::StreamWaitEvent { event }
                        if *event >= self.events =>
                    {
                        return Err(bad("event", *event, self.events));
                    }
                    OmTask::StreamActive { stream: Some(st) } if *st >= streams => {
                        return Err(bad("stream", *st, streams));
                    }
                    OmTask::AiCore { .. }
                    | OmTask::MapIndex { .. }
                    | OmTask::GetNext { .. }
                    | OmTask::GetDynamicDims { .. }
                    | OmTask::LabelSet { .. }
                    | OmTask::LabelGoto { .. }
                    | OmTask::StreamActive { .. }
                    | OmTask::EventRecord { .. }
                    | OmTask::StreamWaitEvent { .. }
                    | OmTask::Memcpy { .. }
                    | OmTask::AiCpu { .. }
                    | OmTask::EndGraph => {}
                }
            }
        }
        Ok(())
    }
}

/// Encodes the `Kernels` section.
pub fn encode_kernels(kernels: &[KernelImage]) -> Vec<u8> {
    let mut e = Encoder::default();
    e.len(kernels.len());
    for k in kernels {
        e.str(&k.name);
        e.len(k.tiling.len());
        for (name, v) in &k.tiling {
            e.str(name);
            e.i64(*v);
        }
        e.len(k.code.len());
        e.bytes.extend_from_slice(&k.code);
    }
    e.bytes
}

/// Parses the `Kernels` section (the code is decoded when the kernel is loaded).
pub fn decode_kernels(bytes: &[u8]) -> Result<Vec<KernelImage>, OmError> {
    let mut d = Decoder::new(bytes, "kernels");
    let n = d.len("kernels", 12)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let name = d.str("kernel name")?;
        let t = d.len("tiling", 12)?;
        let tiling = (0..t)
            .map(|_| Ok((d.str("tiling name")?, d.i64("tiling value")?)))
            .collect::<Result<_, OmError>>()?;
        let len = d.len("code", 1)?;
        let code = d.bytes(len, "code")?.to_vec();
        out.push(KernelImage { name, tiling, code });
    }
    d.finish()?;
    Ok(out)
}

/// Encodes the `KernelFlags` section: one u32 of image flags per kernel, in `Kernels` order.
pub fn encode_kernel_flags(flags: &[u32]) -> Vec<u8> {
    let mut e = Encoder::default();
    e.len(flags.len());
    for f in flags {
        e.u32(*f);
    }
    e.bytes
}

/// Parses the `KernelFlags` section of a model with `kernels` kernels: one entry per kernel,
/// no bit this build does not know.
pub fn decode_kernel_flags(bytes: &[u8], kernels: usize) -> Result<Vec<u32>, OmError> {
    let mut d = Decoder::new(bytes, "kernel flags");
    let n = d.len("kernel flags", 4)?;
    if n != kernels {
        return Err(OmError::Corrupt(format!(
            "kernel flags: {n} entries for {kernels} kernels"
        )));
    }
    let flags = (0..n)
        .map(|i| {
            let f = d.u32("kernel flags")?;
            if f & !crate::task::KERNEL_FLAGS_KNOWN != 0 {
                return Err(OmError::Corrupt(format!(
                    "kernel flags: kernel {i} has flags {f:#x}, this build knows {:#x}",
                    crate::task::KERNEL_FLAGS_KNOWN
                )));
            }
            Ok(f)
        })
        .collect::<Result<Vec<u32>, OmError>>()?;
    d.finish()?;
    Ok(flags)
}

/// One tensor of an operator as profiles show it (msprof's `Input Shapes` / `Input Formats` /
/// `Input Data Types` columns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Element type, as GE names it (`DT_FLOAT16`).
    pub dtype: String,
    /// Layout, as GE names it (`NCHW`, `NC1HWC0`, `ND`).
    pub format: String,
    /// Dimensions.
    pub dims: Vec<i64>,
}

/// The operator behind one task of a model stream: what a profile row shows beside its times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpInfo {
    /// The model stream.
    pub stream: u32,
    /// The task's index in that stream.
    pub task: u32,
    /// The operator type (`Conv2D`, `MatMulV2`, `TransData`).
    pub op_type: String,
    /// Its inputs.
    pub inputs: Vec<TensorInfo>,
    /// Its outputs.
    pub outputs: Vec<TensorInfo>,
}

fn put_tensor_infos(e: &mut Encoder, ts: &[TensorInfo]) {
    e.len(ts.len());
    for t in ts {
        e.str(&t.dtype);
        e.str(&t.format);
        e.i64s(&t.dims);
    }
}

fn tensor_infos(d: &mut Decoder<'_>) -> Result<Vec<TensorInfo>, OmError> {
    let n = d.len("tensors", 12)?;
    (0..n)
        .map(|_| {
            Ok(TensorInfo {
                dtype: d.str("dtype")?,
                format: d.str("format")?,
                dims: d.i64s("dims")?,
            })
        })
        .collect()
}

/// Encodes the `OpInfo` section.
pub fn encode_op_info(ops: &[OpInfo]) -> Vec<u8> {
    let mut e = Encoder::default();
    e.len(ops.len());
    for o in ops {
        e.u32(o.stream);
        e.u32(o.task);
        e.str(&o.op_type);
        put_tensor_infos(&mut e, &o.inputs);
        put_tensor_infos(&mut e, &o.outputs);
    }
    e.bytes
}

/// Parses the `OpInfo` section of a model whose streams are `tasks`: every entry names a task
/// that exists, once.
pub fn decode_op_info(bytes: &[u8], tasks: &ModelTasks) -> Result<Vec<OpInfo>, OmError> {
    let mut d = Decoder::new(bytes, "op info");
    let n = d.len("op info", 20)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let stream = d.u32("stream")?;
        let task = d.u32("task")?;
        let exists = tasks
            .streams
            .get(stream as usize)
            .is_some_and(|s| (task as usize) < s.len());
        if !exists {
            return Err(OmError::Corrupt(format!(
                "op info: stream {stream} task {task} does not exist"
            )));
        }
        if !seen.insert((stream, task)) {
            return Err(OmError::Corrupt(format!(
                "op info: stream {stream} task {task} is described twice"
            )));
        }
        out.push(OpInfo {
            stream,
            task,
            op_type: d.str("op type")?,
            inputs: tensor_infos(&mut d)?,
            outputs: tensor_infos(&mut d)?,
        });
    }
    d.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ModelTasks {
        let fm = |o| Addr::new(Region::FeatureMap, o);
        ModelTasks {
            streams: vec![vec![
                NamedTask {
                    task: OmTask::MapIndex {
                        engine: MapIndexEngine::AiCpu,
                        layout: TableLayout::DimMajor8,
                        n: 2,
                        gears: 3,
                        x: Addr::new(Region::Input(1), 0),
                        table: Addr::new(Region::Weights, 64),
                        y: fm(0),
                    },
                    name: "ascend_mbatch_shape_mapindex".into(),
                },
                NamedTask {
                    task: OmTask::LabelSwitch {
                        index: fm(0),
                        labels: vec![1, 2, 0],
                    },
                    name: "case/LabelSwitch".into(),
                },
                NamedTask {
                    task: OmTask::AiCore {
                        kernel: 0,
                        block_dim: 4,
                        args: vec![
                            KernelArg {
                                addr: Addr::new(Region::Input(0), 0),
                                bytes: 40,
                            },
                            KernelArg {
                                addr: Addr::new(Region::Output(0), 8),
                                bytes: 32,
                            },
                        ],
                        l2: vec![],
                    },
                    name: "relu".into(),
                },
                NamedTask {
                    task: OmTask::AiCpu {
                        op: AiCpuOp::Cast {
                            from: crate::tensor::DataType::F32,
                            to: crate::tensor::DataType::F8E4M3FN,
                            mode: crate::numeric::CastMode {
                                saturate: false,
                                round: crate::numeric::RoundMode::Nearest,
                            },
                        },
                        inputs: vec![KernelArg {
                            addr: fm(64),
                            bytes: 64,
                        }],
                        outputs: vec![KernelArg {
                            addr: fm(128),
                            bytes: 16,
                        }],
                    },
                    name: "cast".into(),
                },
                NamedTask {
                    task: OmTask::AiCore {
                        kernel: 0,
                        block_dim: 2,
                        args: vec![KernelArg {
                            addr: fm(64),
                            bytes: 64,
                        }],
                        l2: vec![
                            L2Control {
                                addr: fm(64),
                                bytes: 64,
                                action: L2Action::Keep,
                            },
                            L2Control {
                                addr: fm(0),
                                bytes: 64,
                                action: L2Action::Drop,
                            },
                        ],
                    },
                    name: "relu_l2".into(),
                },
                NamedTask {
                    task: OmTask::StreamActive { stream: None },
                    name: "case/StreamActive_0".into(),
                },
                NamedTask {
                    task: OmTask::GetNext {
                        outputs: vec![GetNextSlot {
                            data: fm(512),
                            capacity: 100,
                            shape: fm(1024),
                        }],
                    },
                    name: "getnext".into(),
                },
                NamedTask {
                    task: OmTask::GetDynamicDims {
                        shape_info: vec![2, 1, -1],
                        shapes: vec![fm(1024)],
                        out: fm(2048),
                    },
                    name: "gdd".into(),
                },
                NamedTask {
                    task: OmTask::LabelSet { label: 0 },
                    name: "exit".into(),
                },
                NamedTask {
                    task: OmTask::EndGraph,
                    name: "end".into(),
                },
            ]],
            labels: 3,
            events: 0,
            feature_map_bytes: 4096,
            dims_out: Some(fm(2048)),
        }
    }

    #[test]
    fn tasks_round_trip_and_truncations_fail() {
        let t = sample();
        let b = t.encode();
        assert_eq!(ModelTasks::decode(&b, 1).unwrap(), t);
        for len in 0..b.len() {
            assert!(
                ModelTasks::decode(&b[..len], 1).is_err(),
                "truncated at {len}"
            );
        }
    }

    /// Regression (fuzzing): the index of a weights or feature-map address was read and
    /// dropped, so a non-zero index decoded and encoded back to different bytes.
    #[test]
    fn an_index_on_a_region_without_one_is_an_error() {
        let mut e = Encoder::default();
        for (kind, index) in [(1, 7), (0, 1)] {
            e.u32(kind);
            e.u32(index);
            e.u64(0);
        }
        let mut d = Decoder::new(&e.bytes, "tasks");
        let err = get_addr(&mut d, "data").unwrap_err().to_string();
        assert!(
            err.contains("`data` has index 7 for region kind 1 (feature map)"),
            "{err}"
        );
        let err = get_addr(&mut d, "x").unwrap_err().to_string();
        assert!(err.contains("index 1 for region kind 0 (weights)"), "{err}");
    }

    #[test]
    fn out_of_range_numbers_are_errors() {
        let t = sample();
        let e = ModelTasks::decode(&t.encode(), 0).unwrap_err();
        assert!(e.to_string().contains("kernel 0"), "{e}");
        let mut t2 = sample();
        t2.labels = 2;
        let e = ModelTasks::decode(&t2.encode(), 1).unwrap_err();
        assert!(e.to_string().contains("label 2"), "{e}");
    }

    #[test]
    fn kernels_round_trip() {
        let k = vec![KernelImage {
            name: "Add_f32_8".into(),
            tiling: vec![("tile".into(), 64)],
            code: vec![1, 2, 3, 4],
        }];
        let b = encode_kernels(&k);
        assert_eq!(decode_kernels(&b).unwrap(), k);
        for len in 0..b.len() {
            assert!(decode_kernels(&b[..len]).is_err());
        }
    }

    #[test]
    fn kernel_flags_round_trip_and_are_checked() {
        let f = vec![0, crate::task::KERNEL_NEEDS_VALUES, 0];
        let b = encode_kernel_flags(&f);
        assert_eq!(decode_kernel_flags(&b, 3).unwrap(), f);
        for len in 0..b.len() {
            assert!(decode_kernel_flags(&b[..len], 3).is_err());
        }
        let e = decode_kernel_flags(&b, 2).unwrap_err();
        assert!(e.to_string().contains("3 entries for 2 kernels"), "{e}");
        let e = decode_kernel_flags(&encode_kernel_flags(&[0x10]), 1).unwrap_err();
        assert!(e.to_string().contains("flags 0x10"), "{e}");
    }

    #[test]
    fn op_info_round_trips_and_names_only_existing_tasks_once() {
        let t = sample();
        let info = |task| OpInfo {
            stream: 0,
            task,
            op_type: "Conv2D".into(),
            inputs: vec![TensorInfo {
                dtype: "DT_FLOAT16".into(),
                format: "NC1HWC0".into(),
                dims: vec![1, 4, 56, 56, 16],
            }],
            outputs: vec![],
        };
        let ops = vec![info(0), info(1)];
        let b = encode_op_info(&ops);
        assert_eq!(decode_op_info(&b, &t).unwrap(), ops);
        for n in 0..b.len() {
            assert!(decode_op_info(&b[..n], &t).is_err(), "truncated at {n}");
        }
        let e = decode_op_info(&encode_op_info(&[info(0), info(0)]), &t).unwrap_err();
        assert!(e.to_string().contains("described twice"), "{e}");
        let e = decode_op_info(&encode_op_info(&[info(99)]), &t).unwrap_err();
        assert!(e.to_string().contains("task 99 does not exist"), "{e}");
    }
}
