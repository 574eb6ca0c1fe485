//! The AI CPU: its cores, the queue of jobs waiting for one, and the three AI CPU kernels
//! (MapIndex, GetDynamicDims, GetNext) run against device memory. A job starts
//! (`aicpu.launch_ns`), reads its bytes through the chip's memory system, computes
//! (`cycles_per_element` per element) and then applies its effect. It knows which task a job is
//! for, but not the stream that task belongs to.

use std::collections::{BTreeMap, VecDeque};

use gearsim_sim::{AiCpuConfig, KernelLimits, Tick};
use gearsim_traces::TraceSink;

use crate::context::{Ctx, bad};
use crate::effect::Effect;
use crate::error::{DeviceError, TaskRef};
use crate::kernels::{
    self, AiCpuKernelId, AiCpuOpArgs, GetDynamicDimsArgs, GetNextArgs, MapIndexArgs, map_index,
};
use crate::queues::Queues;
use crate::timers::{Fw, Xfer, ns};

#[derive(Debug)]
struct AiCpuJob {
    task: TaskRef,
    /// What the trace calls it (the kernel, or the operator an `Op` kernel runs).
    name: &'static str,
    bytes: u64,
    cycles: u64,
    effect: Effect,
    cpu: usize,
    start: Tick,
}

/// What starting an AI CPU kernel did.
pub(crate) enum Started {
    /// The job waits for a free AI CPU or runs.
    Queued,
    /// GetNext found its queue empty: the task waits for an item (until `deadline`, if any).
    WaitQueue { queue: u32, deadline: Option<Tick> },
}

/// The AI CPU cores and their jobs.
pub(crate) struct AiCpu {
    busy: Vec<bool>,
    wait: VecDeque<u32>,
    jobs: BTreeMap<u32, AiCpuJob>,
    next_job: u32,
    cfg: AiCpuConfig,
    limits: KernelLimits,
}

impl AiCpu {
    pub(crate) fn new(cfg: &AiCpuConfig, limits: &KernelLimits) -> AiCpu {
        AiCpu {
            busy: vec![false; cfg.count as usize],
            wait: VecDeque::new(),
            jobs: BTreeMap::new(),
            next_job: 0,
            cfg: cfg.clone(),
            limits: limits.clone(),
        }
    }

    /// Runs AI CPU kernel `kernel` for task `at` with the argument block at `args` (`size`
    /// bytes): decodes and checks its arguments now and queues the job. `values_computed`:
    /// whether the run computes every value (not a timing-only run).
    pub(crate) fn start<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        queues: &mut Queues,
        at: TaskRef,
        (kernel, args, size): (u32, u64, u32),
        values_computed: bool,
    ) -> Result<Started, DeviceError> {
        const K: &str = "AiCpuKernel";
        let id = AiCpuKernelId::from_u32(kernel).ok_or_else(|| {
            bad(at, K, "kernel", format!("unknown AI CPU kernel {kernel} (expected 1 MapIndex, 2 GetDynamicDims, 3 GetNext, 4 Op)"))
        })?;
        cx.check_range(at, K, "args", args, u64::from(size))?;
        let mut block = vec![0u8; size as usize];
        cx.chip.read_mem(args, &mut block)?;
        let param = |message: String| DeviceError::KernelParam {
            task: at,
            kernel: id.name(),
            message,
        };
        let per_element = self.cfg.cycles_per_element;
        let mut name = id.name();
        let (bytes, cycles, effect) = match id {
            AiCpuKernelId::Op => {
                let a = AiCpuOpArgs::decode(&block).map_err(param)?;
                name = a.op.name();
                // Errors name the operator the kernel runs.
                let param = |message: String| DeviceError::KernelParam {
                    task: at,
                    kernel: name,
                    message,
                };
                let sizes = |list: &[(u64, u64)]| list.iter().map(|b| b.1).collect::<Vec<_>>();
                let (in_sizes, out_sizes) = (sizes(&a.inputs), sizes(&a.outputs));
                a.op.check(&in_sizes, &out_sizes).map_err(param)?;
                let mut inputs = Vec::with_capacity(a.inputs.len());
                for (i, &(addr, n)) in a.inputs.iter().enumerate() {
                    // The range is checked before anything is allocated for it.
                    let outside = || {
                        param(format!(
                            "input {i} range [{addr:#x}, +{n}) is outside device memory"
                        ))
                    };
                    cx.chip.memory().check(addr, n).map_err(|_| outside())?;
                    let mut b = vec![0u8; n as usize];
                    cx.chip.read_mem(addr, &mut b).map_err(|_| outside())?;
                    inputs.push(b);
                }
                for (i, &(addr, n)) in a.outputs.iter().enumerate() {
                    if cx.chip.memory().check(addr, n).is_err() {
                        return Err(param(format!(
                            "output {i} range [{addr:#x}, +{n}) is outside device memory"
                        )));
                    }
                }
                let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let results = match a.op.run(&views) {
                    Ok(r) => r,
                    // A value error (a gather index out of range) read from values a
                    // timing-only run never computed is not the model's: zeros, same time.
                    Err(_) if !values_computed => {
                        out_sizes.iter().map(|n| vec![0u8; *n as usize]).collect()
                    }
                    Err(e) => return Err(param(e)),
                };
                let writes: Vec<(u64, Vec<u8>)> =
                    a.outputs.iter().map(|o| o.0).zip(results).collect();
                // It reads its inputs and writes its outputs through the memory system.
                let bytes = in_sizes.iter().chain(&out_sizes).sum();
                (
                    bytes,
                    a.op.elements(&in_sizes).saturating_mul(per_element),
                    Effect::Write(writes),
                )
            }
            AiCpuKernelId::MapIndex => {
                let a = MapIndexArgs::decode(&block).map_err(param)?;
                a.shape
                    .check(
                        self.limits.map_index_max_gears,
                        self.limits.map_index_max_dims,
                    )
                    .map_err(param)?;
                let mut read =
                    |field: &str, addr: u64, count: u64| -> Result<Vec<i32>, DeviceError> {
                        let mut b = vec![0u8; (count * 4) as usize];
                        cx.chip.read_mem(addr, &mut b).map_err(|e| {
                        param(format!(
                            "`{field}` range [{addr:#x}, +{}) is outside device memory ({} bytes)",
                            count * 4,
                            e.capacity
                        ))
                    })?;
                        Ok(b.chunks_exact(4)
                            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect())
                    };
                let x = read("x", a.x, u64::from(a.shape.n))?;
                let table = read(
                    "table",
                    a.table,
                    a.shape.layout.table_len(a.shape.gears, a.shape.n),
                )?;
                let level = if a.level_index != 0 {
                    Some(read(
                        "level_index",
                        a.level_index,
                        u64::from(a.shape.gears),
                    )?)
                } else {
                    None
                };
                let work = map_index::run_aicpu(
                    &x,
                    &table,
                    a.shape.gears,
                    a.shape.layout,
                    level.as_deref(),
                )
                .map_err(param)?;
                if cx.chip.memory().check(a.y, 4).is_err() {
                    return Err(param(format!(
                        "`y` address {:#x} is outside device memory",
                        a.y
                    )));
                }
                (
                    work.bytes_read,
                    work.compares * per_element,
                    Effect::Write(vec![(a.y, work.result.to_le_bytes().to_vec())]),
                )
            }
            AiCpuKernelId::GetDynamicDims => {
                let a = GetDynamicDimsArgs::decode(&block).map_err(param)?;
                let mut shapes = Vec::with_capacity(a.shapes.len());
                for (i, &p) in a.shapes.iter().enumerate() {
                    let mut b = vec![0u8; kernels::SHAPE_TENSOR_BYTES as usize];
                    cx.chip.read_mem(p, &mut b).map_err(|_| {
                        param(format!(
                            "shape tensor {i} at {p:#x} is outside device memory"
                        ))
                    })?;
                    shapes.push(
                        kernels::decode_shape(&b)
                            .map_err(|e| param(format!("shape tensor {i}: {e}")))?,
                    );
                }
                let dims = kernels::get_dynamic_dims(a.n, &a.shape_info, &shapes).map_err(param)?;
                let out: Vec<u8> = if a.out_i64 {
                    dims.iter().flat_map(|d| d.to_le_bytes()).collect()
                } else {
                    dims.iter()
                        .flat_map(|d| (*d as i32).to_le_bytes())
                        .collect()
                };
                if cx.chip.memory().check(a.out, out.len() as u64).is_err() {
                    return Err(param(format!(
                        "output range [{:#x}, +{}) is outside device memory",
                        a.out,
                        out.len()
                    )));
                }
                let bytes = shapes.len() as u64 * kernels::SHAPE_TENSOR_BYTES;
                let cycles = a.shape_info.len() as u64 * per_element;
                (bytes, cycles, Effect::Write(vec![(a.out, out)]))
            }
            AiCpuKernelId::GetNext => {
                let a = GetNextArgs::decode(&block).map_err(param)?;
                let front = queues
                    .front(a.queue)
                    .map_err(|()| param(format!("data queue {} does not exist", a.queue)))?;
                let Some(item) = front else {
                    let now = cx.now();
                    let deadline = (a.timeout_us > 0).then(|| now + ns(a.timeout_us * 1000));
                    return Ok(Started::WaitQueue {
                        queue: a.queue,
                        deadline,
                    });
                };
                if item.len() != a.outputs.len() {
                    return Err(param(format!(
                        "the queue item has {} tensors, the task has {} outputs",
                        item.len(),
                        a.outputs.len()
                    )));
                }
                let mut copies = Vec::new();
                let mut shapes = Vec::new();
                let mut free = Vec::new();
                let mut bytes = 0;
                for (i, ((staged, len, dims), out)) in item.iter().zip(&a.outputs).enumerate() {
                    if *len > out.capacity {
                        return Err(param(format!(
                            "output {i}: the tensor is {len} bytes, the output holds {}",
                            out.capacity
                        )));
                    }
                    for (field, addr, n) in [
                        ("data", out.data, *len),
                        ("shape", out.shape, kernels::SHAPE_TENSOR_BYTES),
                    ] {
                        if cx.chip.memory().check(addr, n).is_err() {
                            return Err(param(format!(
                                "output {i} {field} range [{addr:#x}, +{n}) is outside device memory"
                            )));
                        }
                    }
                    copies.push((out.data, *staged, *len));
                    shapes.push((out.shape, kernels::encode_shape(dims)));
                    free.push(*staged);
                    bytes += 2 * len;
                }
                queues.pop(cx, a.queue);
                (
                    bytes,
                    a.outputs.len() as u64 * per_element,
                    Effect::GetNext {
                        copies,
                        shapes,
                        free,
                    },
                )
            }
        };
        let job = self.next_job;
        self.next_job += 1;
        self.jobs.insert(
            job,
            AiCpuJob {
                task: at,
                name,
                bytes,
                cycles,
                effect,
                cpu: 0,
                start: Tick::ZERO,
            },
        );
        self.wait.push_back(job);
        self.dispatch(cx);
        Ok(Started::Queued)
    }

    /// Starts waiting jobs on free AI CPUs, oldest first.
    fn dispatch<S: TraceSink>(&mut self, cx: &mut Ctx<'_, S>) {
        while let Some(&job) = self.wait.front() {
            let Some(cpu) = self.busy.iter().position(|b| !b) else {
                return;
            };
            self.wait.pop_front();
            self.busy[cpu] = true;
            let now = cx.now();
            if let Some(j) = self.jobs.get_mut(&job) {
                j.cpu = cpu;
                j.start = now;
            }
            cx.timer(now + ns(self.cfg.launch_ns), Fw::AiCpuLaunched { job });
        }
    }

    /// A job has started: it reads its bytes through the memory system.
    pub(crate) fn memory_phase<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        job: u32,
    ) -> Result<(), DeviceError> {
        let bytes = self.jobs.get(&job).map_or(0, |j| j.bytes);
        if bytes == 0 {
            return self.compute_phase(cx, job);
        }
        let cap = self.cfg.mem_bytes_per_cycle * self.cfg.clock_mhz * 1_000_000;
        cx.transfer(Xfer::AiCpu(job), bytes, cap, false);
        Ok(())
    }

    /// A job has read its bytes: it computes.
    pub(crate) fn compute_phase<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        job: u32,
    ) -> Result<(), DeviceError> {
        let cycles = self.jobs.get(&job).map_or(0, |j| j.cycles);
        let ps = (u128::from(cycles) * 1_000_000).div_ceil(u128::from(self.cfg.clock_mhz));
        let t = cx.now() + Tick(u64::try_from(ps).unwrap_or(u64::MAX));
        cx.timer(t, Fw::AiCpuComputed { job });
        Ok(())
    }

    /// A job has computed: its effect is applied, its AI CPU takes the next job; returns the
    /// task that is done.
    pub(crate) fn finish<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        job: u32,
    ) -> Result<Option<TaskRef>, DeviceError> {
        let Some(j) = self.jobs.remove(&job) else {
            return Ok(None);
        };
        j.effect.apply(cx.chip, cx.heap)?;
        self.busy[j.cpu] = false;
        let now = cx.now();
        cx.lanes
            .aicpu(cx.chip.sink_mut(), j.cpu, j.name, j.task, j.start, now);
        self.dispatch(cx);
        Ok(Some(j.task))
    }
}
